/* The daemon context; see daemon.h. */
#include "daemon.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "events.h"
#include "log.h"

uint64_t kv_daemon_fds_max(const struct kv_daemon *d)
{
	uint64_t max = d->cfg.max_fds_in_flight ? d->cfg.max_fds_in_flight : UINT64_MAX;
	uint64_t taken = d->fd_reserved + d->cfg.max_connections;

	if (d->fd_limit) {
		uint64_t left = d->fd_limit > taken ? d->fd_limit - taken : 0;

		if (left < max)
			max = left;
	}
	return max;
}

uint64_t kv_daemon_fds_per_uid_max(const struct kv_daemon *d)
{
	uint64_t max = kv_daemon_fds_max(d);

	if (!d->cfg.max_fds_per_uid)
		return max / 2;
	return d->cfg.max_fds_per_uid < max ? d->cfg.max_fds_per_uid : max;
}

uint64_t kv_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

uint64_t kv_daemon_wall_ms(uint64_t mono)
{
	uint64_t now = kv_mono_ms(), wall = kv_now_ms();

	return mono >= now ? wall + (mono - now) : wall - (now - mono);
}

static void pool_gone(void *ctx, struct kv_pool *p)
{
	struct kv_daemon *d = ctx;

	kv_debug("pool %u '%s' of namespace '%s' freed: no session registered it, no block of it "
		 "is in use or in a lower tier", p->id, p->name, kv_pools_ns_name(d->pools, p->ns));
	kv_tiers_pool_gone(d->tiers, p);
}

void kv_daemon_collect(struct kv_daemon *d)
{
	kv_pools_collect(d->pools, pool_gone, d);
}

static void on_copies(struct kv_loop_watch *w, int res, int more)
{
	struct kv_daemon *d = kv_container_of(w, struct kv_daemon, copyw);

	if (res >= 0) {
		kv_tiers_copies_done(d->tiers);
		kv_daemon_collect(d);
	}
	if (!more && !d->loop.stop)
		kv_loop_poll(&d->loop, &d->copyw, d->be->completion_fd, POLLIN, 1);
}

static void on_disk(struct kv_loop_watch *w, int res, int more)
{
	struct kv_daemon *d = kv_container_of(w, struct kv_daemon, diskw);

	if (res >= 0) {
		kv_tiers_disk_done(d->tiers);
		kv_daemon_collect(d);
	}
	if (d->flushing && kv_daemon_stop_flush(d))
		kv_loop_stop(&d->loop);
	if (!more && !d->loop.stop)
		kv_loop_poll(&d->loop, &d->diskw, kv_tiers_disk_fd(d->tiers), POLLIN, 1);
}

/* A failing tier's backoff has ended: the watermarks run again (and the
 * timer again while a path still backs off). */
static void on_tier_retry(struct kv_loop_watch *w, int res, int more)
{
	struct kv_daemon *d = kv_container_of(w, struct kv_daemon, retryw);
	uint64_t ms;

	(void)res;
	(void)more;
	if (d->loop.stop)
		return;
	kv_tiers_kick(d->tiers);
	if (!d->retryw.armed && (ms = kv_tiers_retry_ms(d->tiers)))
		kv_loop_timeout(&d->loop, &d->retryw, ms * 1000000ull);
}

static void tier_retry_arm(void *ctx, uint64_t ms)
{
	struct kv_daemon *d = ctx;

	if (!d->retryw.armed && !d->loop.stop)
		kv_loop_timeout(&d->loop, &d->retryw, ms * 1000000ull);
}

int kv_daemon_stop_flush(struct kv_daemon *d)
{
	struct kv_tier_stats st[KV_NTIERS];

	if (kv_tiers_clean(d->tiers))
		goto done;
	kv_tiers_stats(d->tiers, st);
	if (kv_tiers_disk_busy(d->tiers)) {
		d->flushing = 1;
		return 0;   /* on_disk() comes back here */
	}
	/* A disk that fails backs off: retrying its writes at once, from each
	 * completion, would spin until the drain deadline. */
	if (!kv_tiers_disk_failing(d->tiers) && kv_tiers_flush(d->tiers)) {
		d->flushing = 1;
		return 0;
	}
	kv_warn("stop: %llu dirty host-tier blocks cannot be written to disk (full, failing, or "
		"their namespaces at their quota_g3); "
		"they are lost with this process", (unsigned long long)st[KV_TIER_G2].dirty);
	d->flushing = 0;
	return 1;
done:
	if (d->flushing)
		kv_info("stop: the dirty host-tier blocks are on disk");
	d->flushing = 0;
	return 1;
}

static int backend_create(struct kv_daemon *d, const struct kv_config *cfg)
{
	uint64_t nseg = cfg->pool_bytes / cfg->segment_bytes;
	char err[256] = "";
	int r;

	if (!strcmp(cfg->backend, "cuda")) {
		/* Every visible device, pool_bytes on each. */
		r = kv_backend_cuda_create(NULL, 0, cfg->pool_bytes, cfg->segment_bytes, err,
					   sizeof(err), &d->be);
		if (r < 0)
			kv_err("cuda backend: %s", err);
		return r;
	}
	if (strcmp(cfg->backend, "host")) {
		kv_err("backend '%s' is not built in (available: host, cuda)", cfg->backend);
		return -EINVAL;
	}
	r = kv_backend_host_create(cfg->segment_bytes, (uint32_t)nseg, &d->be);
	if (r < 0)
		kv_err("host backend: %llu segments of %llu bytes: %s", (unsigned long long)nseg,
		       (unsigned long long)cfg->segment_bytes, strerror(-r));
	return r;
}

static void events_idle(void *ctx)
{
	kv_events_flush(ctx);
}

int kv_daemon_init(struct kv_daemon *d, const struct kv_config *cfg)
{
	char err[256] = "";
	int r;

	memset(d, 0, sizeof(*d));
	d->cfg = *cfg;
	d->sigfd = -1;
	d->copyw.cb = on_copies;
	d->diskw.cb = on_disk;
	d->retryw.cb = on_tier_retry;
	kv_list_init(&d->sessions);
	kv_arena_init(&d->arena);
	d->start_mono_ms = kv_mono_ms();
	if ((r = backend_create(d, cfg)) < 0)
		return r;
	r = kv_pools_create(d->be, cfg->page_bytes, &d->pools);
	if (r < 0) {
		kv_err("page allocator: %s", strerror(-r));
		return r;
	}
	r = kv_tiers_create(d->pools, d->be, cfg->page_bytes, &cfg->tiers, &d->tiers, err,
			    sizeof(err));
	if (r < 0) {
		kv_err("tiers: %s", err[0] ? err : strerror(-r));
		return r;
	}
	d->scratch = calloc(cfg->max_batch, sizeof(void *));
	if (!d->scratch)
		return -ENOMEM;
	r = kv_loop_init(&d->loop, 1024);
	d->loop.lag_warn_ns = d->cfg.loop_lag_warn_ms * 1000000u;
	if (r < 0) {
		kv_err("io_uring: %s", strerror(-r));
		return r;
	}
	if ((kv_tiers_on(d->tiers) &&
	     (r = kv_loop_poll(&d->loop, &d->copyw, d->be->completion_fd, POLLIN, 1)) < 0) ||
	    (kv_tiers_disk_fd(d->tiers) >= 0 &&
	     (r = kv_loop_poll(&d->loop, &d->diskw, kv_tiers_disk_fd(d->tiers), POLLIN, 1)) < 0))
		return r;
	/* KV events: the pools and tiers report to it; what they reported is
	 * sent once per loop iteration. */
	r = kv_events_open(&d->events, cfg, &d->loop, err, sizeof(err));
	if (r < 0) {
		kv_err("%s", err[0] ? err : strerror(-r));
		return r;
	}
	kv_pools_set_events(d->pools, d->events);
	kv_tiers_on_retry(d->tiers, tier_retry_arm, d);
	d->loop.idle = events_idle;
	d->loop.idle_ctx = d->events;
	return 0;
}

void kv_daemon_fini(struct kv_daemon *d)
{
	if (d->pools)
		kv_pools_set_events(d->pools, NULL);
	kv_events_close(d->events);
	d->events = NULL;
	if (d->loop.ring.ring_fd > 0)
		kv_loop_fini(&d->loop);
	kv_tiers_destroy(d->tiers);
	kv_pools_destroy(d->pools);
	kv_backend_destroy(d->be);
	kv_arena_fini(&d->arena);
	free(d->scratch);
	d->tiers = NULL;
	d->pools = NULL;
	d->be = NULL;
	d->scratch = NULL;
}
