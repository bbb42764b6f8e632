/* The fuzz harnesses' tiny daemon: see fuzzd.h. */
#include "fuzzd.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "pool.h"

struct kv_daemon fz_d;
struct kv_session fz_s[FZ_NSESS + 1];
void (*fz_on_open)(int i);
static int woken[FZ_NSESS + 1];

static char tmpdir[128];

static void rm_tmpdir(void)
{
	const char *const files[] = { "g3", "g3.idx", "g3.idx.new" };
	char path[160];

	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", tmpdir, files[i]);
		unlink(path);
	}
	rmdir(tmpdir);
}

void fz_tmpdir(char *template)
{
	if (!mkdtemp(template) || strlen(template) >= sizeof(tmpdir)) {
		perror("mkdtemp");
		exit(1);
	}
	snprintf(tmpdir, sizeof(tmpdir), "%s", template);
	atexit(rm_tmpdir);
}

void fz_finding(const char *what)
{
	fprintf(stderr, "fuzz: %s\n", what);
	abort();
}

static void wake(struct kv_waiter *w)
{
	struct kv_session *ss = kv_container_of(w, struct kv_session, waiter);

	woken[ss - fz_s] = 1;
}

static void set(struct kv_config *c, const char *k, const char *v)
{
	char err[256];

	if (kv_config_set(c, kv_config_key(k), v, err, sizeof(err)) < 0) {
		fprintf(stderr, "fuzz: %s\n", err);
		exit(1);
	}
}

void fz_config(struct kv_config *c, const char *dir, int disk)
{
	char path[96];

	kv_config_defaults(c);
	set(c, "pool_size", "64KiB");
	set(c, "segment_size", "16KiB");
	set(c, "page_size", "4KiB");
	set(c, "host_tier_size", "64KiB");
	if (disk) {
		snprintf(path, sizeof(path), "%s/g3", dir);
		set(c, "disk_path", path);
		set(c, "disk_size", "256KiB");
	}
	set(c, "max_batch", "64");
	/* Low, so that a chain listing a block many times (ids repeat) meets it,
	 * a parked lookup's rerun with its pins included (ops_block.c). */
	set(c, "max_block_refs", "8");
	set(c, "log_level", getenv("FUZZ_LOG") ? "debug" : "err");
	kv_log_level = getenv("FUZZ_LOG") ? KV_LOG_DEBUG : KV_LOG_ERR;
}

void fz_start(char *template, int disk)
{
	static struct kv_config cfg;
	char err[256] = "";

	fz_tmpdir(template);
	fz_config(&cfg, template, disk);
	if (kv_config_finish(&cfg, err, sizeof(err)) < 0 || kv_daemon_init(&fz_d, &cfg) < 0) {
		fprintf(stderr, "fuzz: cannot start the daemon: %s\n", err);
		exit(1);
	}
}

void fz_open(int i, const char *ns)
{
	struct ucred cr = { .pid = getpid(), .uid = 0, .gid = 0 };
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Hello h = KVCACHED__HELLO__INIT;

	memset(&fz_s[i], 0, sizeof(fz_s[i]));
	kv_session_open(&fz_d, &fz_s[i], &cr, i == FZ_ADMIN);
	fz_s[i].waiter.wake = wake;
	if (fz_on_open)
		fz_on_open(i);
	h.min_version = h.max_version = 1;
	h.namespace_ = (char *)ns;
	h.client_name = "fuzz";
	rq.op_case = KVCACHED__REQUEST__OP_HELLO;
	rq.hello = &h;
	fz_run(i, &rq);
	kv_arena_reset(&fz_d.arena);
}

static int in_flight(void)
{
	struct kv_tier_stats st[KV_NTIERS];

	kv_tiers_stats(fz_d.tiers, st);
	return st[KV_TIER_G1].inflight || st[KV_TIER_G2].inflight || st[KV_TIER_G3].inflight;
}

void fz_pump(void)
{
	for (int k = 0; k < 10000; k++) {
		struct pollfd p[2] = { { fz_d.be->completion_fd, POLLIN, 0 },
				       { kv_tiers_disk_fd(fz_d.tiers), POLLIN, 0 } };

		kv_tiers_copies_done(fz_d.tiers);
		kv_tiers_disk_done(fz_d.tiers);
		kv_daemon_collect(&fz_d);
		kv_tiers_kick(fz_d.tiers);
		if (!in_flight())
			return;
		poll(p, p[1].fd >= 0 ? 2 : 1, 100);
	}
	fz_finding("tier I/O still in flight after 10,000 pumps");
}

Kvcached__Response *fz_run(int i, Kvcached__Request *rq)
{
	static Kvcached__Response rs;
	enum kv_op_outcome out;

	for (int tries = 0;; tries++) {
		kvcached__response__init(&rs);
		woken[i] = 0;
		kv_daemon_collect(&fz_d);
		out = kv_ops_dispatch(&fz_d, &fz_s[i], rq, &rs);
		if (out == KV_OP_HOLD) {
			kv_session_fds_read(&fz_s[i]);  /* our peer reads everything at once */
		} else if (out == KV_OP_PARK) {
			fz_pump();
			if (!woken[i] && !in_flight())
				fz_finding("a parked request nobody will wake");
		} else {
			break;
		}
		kv_arena_reset(&fz_d.arena);
		if (tries > 1000)
			fz_finding("a request parked or held 1,000 times");
	}
	fz_s[i].requests++;   /* a frame finished, as conn.c counts it (session.h) */
	kv_session_fds_sent(&fz_s[i], fz_s[i].nfds);
	kv_session_fds_read(&fz_s[i]);
	kv_tiers_kick(fz_d.tiers);
	if (getenv("FUZZ_TRACE"))
		fprintf(stderr, "session %d op %d: %s%s (%zu blocks)\n", i, (int)rq->op_case,
			out == KV_OP_CLOSE ? "closed: " : out == KV_OP_NOMEM ? "no memory" : "",
			rs.error && rs.error->code ? rs.error->message : "ok",
			rs.result_case == KVCACHED__RESPONSE__RESULT_BLOCKS ? rs.blocks->n_blocks : 0);
	if (out == KV_OP_CLOSE || out == KV_OP_NOMEM) {
		kv_arena_reset(&fz_d.arena);
		kv_session_release(&fz_s[i]);
		kv_daemon_collect(&fz_d);
		fz_open(i, "");
		return NULL;
	}
	return &rs;
}

int fz_check(void)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Check c = KVCACHED__CHECK__INIT;
	Kvcached__Response *rs;
	int ok;

	rq.op_case = KVCACHED__REQUEST__OP_CHECK;
	rq.check = &c;
	rs = fz_run(FZ_ADMIN, &rq);
	ok = rs && rs->result_case == KVCACHED__RESPONSE__RESULT_CHECK && rs->check->ok;
	if (!ok && rs && rs->result_case == KVCACHED__RESPONSE__RESULT_CHECK)
		for (size_t k = 0; k < rs->check->n_problems; k++)
			fprintf(stderr, "  %s\n", rs->check->problems[k]);
	kv_arena_reset(&fz_d.arena);
	return ok;
}

void fz_evict(Kvcached__Tier tier)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Evict e = KVCACHED__EVICT__INIT;

	e.tier = tier;
	e.all_pools = 1;
	rq.op_case = KVCACHED__REQUEST__OP_EVICT;
	rq.evict = &e;
	fz_run(FZ_ADMIN, &rq);
	kv_arena_reset(&fz_d.arena);
	fz_pump();
}

uint64_t fz_held_blocks(void)
{
	uint64_t n = 0;

	for (uint32_t id = 0; id < kv_pools_end(fz_d.pools); id++) {
		const struct kv_pool *p = kv_pool_get(fz_d.pools, id);

		if (p)
			n += p->n.writable + p->n.sealed;
	}
	return n;
}
