/* Signals, drain, reload, timers and the stop; see lifecycle.h. */
#include "lifecycle.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "log.h"
#include "tenant.h"
#include "service.h"
#include "session.h"

static void status_line(struct kv_daemon *d, char *buf, size_t len)
{
	uint64_t total, nfree, page_bytes;
	uint32_t clients = kv_sessions_clients(d);

	kv_pools_pages(d->pools, &total, &nfree, &page_bytes);
	if (d->draining) {
		uint64_t now = kv_mono_ms();
		uint64_t left = d->drain_deadline_ms > now ? d->drain_deadline_ms - now : 0;

		snprintf(buf, len, "draining: %" PRIu32 " client%s left, exiting in %" PRIu64 " s at "
			 "the latest", clients, clients == 1 ? "" : "s", (left + 999) / 1000);
		return;
	}
	snprintf(buf, len, "%" PRIu32 " client%s, %" PRIu64 " of %" PRIu64 " pages in use (%" PRIu64
		 "%%), %" PRIu64 " requests, %" PRIu64 " allocations refused", clients,
		 clients == 1 ? "" : "s", total - nfree, total,
		 total ? (total - nfree) * 100 / total : 0, d->requests, d->enospc);
}

static void on_status(struct kv_loop_watch *w, int res, int more)
{
	struct kv_daemon *d = kv_container_of(w, struct kv_daemon, statw);
	char st[256];

	(void)res;
	(void)more;
	if (d->loop.stop || !d->cfg.status_interval_ms)
		return;
	status_line(d, st, sizeof(st));
	kv_service_status(st);
	kv_loop_timeout(&d->loop, &d->statw, d->cfg.status_interval_ms * 1000000ull);
}

static void on_watchdog(struct kv_loop_watch *w, int res, int more)
{
	struct kv_daemon *d = kv_container_of(w, struct kv_daemon, wdogw);

	(void)res;
	(void)more;
	if (d->loop.stop)
		return;
	/* From the loop: a loop that hangs stops the pings and systemd
	 * restarts the daemon. */
	kv_service_watchdog();
	kv_loop_timeout(&d->loop, &d->wdogw, d->watchdog_usec * 1000 / 2);
}

/* DRAINING -> STOPPING: the dirty G2 copies go to G3 before the loop stops,
 * within the drain deadline (the drain timer is still armed). */
static void stopping(struct kv_daemon *d)
{
	if (kv_daemon_stop_flush(d))
		kv_loop_stop(&d->loop);
	else
		kv_info("stop: writing the dirty host-tier blocks back to disk first");
}

void kv_daemon_drain_check(struct kv_daemon *d)
{
	if (!d->draining || d->flushing || d->loop.stop || kv_sessions_clients(d))
		return;
	kv_info("drained: no client left; exiting");
	stopping(d);
}

static void on_drain_timeout(struct kv_loop_watch *w, int res, int more)
{
	struct kv_daemon *d = kv_container_of(w, struct kv_daemon, drainw);
	uint32_t clients = kv_sessions_clients(d);

	(void)res;
	(void)more;
	if (d->loop.stop)
		return;
	if (d->flushing) {
		struct kv_tier_stats st[KV_NTIERS];

		kv_tiers_stats(d->tiers, st);
		kv_warn("drain timeout (%" PRIu64 " ms): %" PRIu64 " dirty host-tier blocks not "
			"written back to disk yet; exiting", d->drain_timeout_ms,
			st[KV_TIER_G2].dirty);
	} else {
		kv_warn("drain timeout (%" PRIu64 " ms): %" PRIu32 " client%s still connected, "
			"holding %" PRIu64 " references; exiting", d->drain_timeout_ms, clients,
			clients == 1 ? "" : "s", kv_sessions_refs(d));
	}
	kv_loop_stop(&d->loop);
}

int kv_daemon_drain(struct kv_daemon *d, uint64_t timeout_ms, const char *why)
{
	char st[256], name[160] = "";
	uint32_t clients = kv_sessions_clients(d);

	if (d->draining)
		return -EALREADY;
	/* An admin's Drain may ask for any uint64: no longer than the
	 * configuration allows (a day), so that neither the deadline nor the
	 * timer's nanoseconds overflow. */
	if (timeout_ms > KV_DRAIN_TIMEOUT_MAX_MS)
		timeout_ms = KV_DRAIN_TIMEOUT_MAX_MS;
	d->draining = 1;
	d->drain_timeout_ms = timeout_ms;
	d->drain_deadline_ms = kv_mono_ms() + timeout_ms;
	if (d->worker_name)
		d->worker_name(d, name, sizeof(name));
	kv_info("%s: draining: the worker socket %s no longer accepts; %" PRIu32 " client%s may "
		"release what they hold for %" PRIu64 " ms", why, name, clients,
		clients == 1 ? "" : "s", timeout_ms);
	/* An activated socket stays with systemd: connections wait in its queue
	 * for the next instance. */
	if (d->stop_accepting)
		d->stop_accepting(d);
	status_line(d, st, sizeof(st));
	kv_service_stopping(st);
	if (!timeout_ms) {
		kv_loop_stop(&d->loop);
		return 0;
	}
	kv_loop_timeout(&d->loop, &d->drainw, timeout_ms * 1000000ull);
	kv_daemon_drain_check(d);
	return 0;
}

/* Applies what the live configuration says to the running daemon, after
 * start and after each reload. */
static void apply_config(struct kv_daemon *d)
{
	kv_log_level = d->cfg.log_level;
	kv_log_set_target(d->cfg.log_target);
	if (d->cfg.status_interval_ms && !d->statw.armed && kv_service_notifying() &&
	    d->loop.ring.ring_fd > 0)
		kv_loop_timeout(&d->loop, &d->statw, d->cfg.status_interval_ms * 1000000ull);
	/* Namespaces: limits, and who may stay. */
	kv_tenants_reload(d);
	/* tiers: the watermarks (demote_*, writeback_*) are applied here once
	 * kv_tiers takes new ones (it keeps its own copy of d->cfg.tiers): flag
	 * their rows KV_CFG_RELOAD in config.c and pass d->cfg.tiers on. */
}

struct reload_ctx {
	void (*report)(void *ctx, const char *line, int applied);
	void *ctx;
	char applied[512], kept[512];
};

static void reload_key(void *ctx, const struct kv_cfg_key *k, const char *old, const char *now,
		       int applied)
{
	struct reload_ctx *x = ctx;
	char line[600], *list = applied ? x->applied : x->kept;
	size_t n = strlen(list);

	/* k is NULL for a namespace section: old names it. */
	if (k)
		snprintf(line, sizeof(line), "%s: %s -> %s", k->name, old, now);
	else
		snprintf(line, sizeof(line), "%s -> %s", old, now);
	snprintf(list + n, sizeof(x->applied) - n, "%s%s", n ? "; " : "", line);
	if (x->report)
		x->report(x->ctx, line, applied);
}

int kv_daemon_reload(struct kv_daemon *d,
		     void (*report)(void *ctx, const char *line, int applied), void *ctx,
		     char *err, size_t errlen)
{
	struct reload_ctx x = { .report = report, .ctx = ctx };
	struct kv_config next;
	char st[256];
	int r;

	kv_service_reloading();
	d->reloads++;
	if (!d->src) {
		next = d->cfg;
		r = 0;
	} else {
		r = kv_config_build(&next, d->src, err, errlen);
	}
	if (r < 0) {
		d->reload_failures++;
		kv_err("reload failed, the running configuration stays: %s", err);
	} else {
		kv_config_reload(&d->cfg, &next, reload_key, &x);
		apply_config(d);
		kv_info("reloaded %s: %s%s%s%s", d->src && d->src->path[0] ? d->src->path
								  : "the command line",
			x.applied[0] ? "applied " : "nothing changed at run time", x.applied,
			x.kept[0] ? "; not applied (needs a restart): " : "", x.kept);
	}
	status_line(d, st, sizeof(st));
	kv_service_ready(st);
	return r < 0 ? -EINVAL : 0;
}

static void on_signal(struct kv_loop_watch *w, int res, int more)
{
	struct kv_daemon *d = kv_container_of(w, struct kv_daemon, sigw);
	struct signalfd_siginfo si;
	char why[64], err[512];

	(void)res;
	while (read(d->sigfd, &si, sizeof(si)) == sizeof(si)) {
		if (si.ssi_signo == SIGHUP) {
			kv_info("SIGHUP: reloading the configuration");
			kv_daemon_reload(d, NULL, NULL, err, sizeof(err));
		} else if (!d->draining) {
			snprintf(why, sizeof(why), "SIG%s", sigabbrev_np((int)si.ssi_signo));
			kv_daemon_drain(d, d->cfg.drain_timeout_ms, why);
		} else if (!d->loop.stop) {
			kv_warn("SIG%s while %s: exiting now", sigabbrev_np((int)si.ssi_signo),
				d->flushing ? "writing back to disk" : "draining");
			kv_loop_stop(&d->loop);
		}
	}
	if (!more && !d->loop.stop)
		kv_loop_poll(&d->loop, &d->sigw, d->sigfd, POLLIN, 1);
}

int kv_lifecycle_init(struct kv_daemon *d)
{
	sigset_t mask;

	d->drainw.cb = on_drain_timeout;
	d->wdogw.cb = on_watchdog;
	d->statw.cb = on_status;
	d->sigw.cb = on_signal;
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	d->sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	if (d->sigfd < 0)
		return -errno;
	return kv_loop_poll(&d->loop, &d->sigw, d->sigfd, POLLIN, 1);
}

void kv_lifecycle_start(struct kv_daemon *d)
{
	char st[256];

	apply_config(d);
	d->watchdog_usec = kv_service_watchdog_usec();
	if (d->watchdog_usec) {
		kv_info("systemd watchdog: every %" PRIu64 " ms", d->watchdog_usec / 2000);
		kv_service_watchdog();
		kv_loop_timeout(&d->loop, &d->wdogw, d->watchdog_usec * 1000 / 2);
	}
	/* The pool exists and both sockets listen: connections made from now
	 * on are served. */
	status_line(d, st, sizeof(st));
	kv_service_ready(st);
}

void kv_lifecycle_stopped(struct kv_daemon *d)
{
	if (!d->draining)
		kv_service_stopping("stopping");
}

void kv_lifecycle_fini(struct kv_daemon *d)
{
	if (d->sigfd >= 0)
		close(d->sigfd);
	d->sigfd = -1;
}
