/* G4 writes at demotion with two batches in flight (issue 38: a client's
 * next batch goes out on the second write thread while the first waits for
 * its last replies). A real Redis Cluster (3 masters, no replica) and one
 * kvcached, no disk tier, namespace "dm" writing at demotion; a chain of N
 * blocks is several batches (WRITE_BATCH 256) on both write threads:
 *
 *   refuse: one master refuses every SET (maxmemory 1 byte, noeviction:
 *           "-OOM"), so about a third of every batch fails, pipelined among
 *           the SETs the others store. Every write ends (stored or
 *           counted failed, nothing in flight); the two masters hold exactly
 *           the writes counted stored; every block, failed or not, is still
 *           in G2 and read back byte for byte; Evict G2 then empties G2 (a
 *           slot whose hold a failed batch did not release would stay).
 *   stall:  the next chain, and once its first writes are answered a
 *           master is stopped (SIGSTOP) under the batches in flight: every
 *           write still ends, within remote_timeout of the stall for the
 *           batches under way and at once for the later ones (the node is
 *           backed off, for both write threads), well within BOUND_MS; the
 *           daemon answers meanwhile; every block is in G2, byte for byte;
 *           the master continued, Evict G2 empties G2 and Check is clean.
 *           remote_min_rate is its floor (1 KiB/s), remote_write_timeout
 *           far (20 s): what ends the stalled calls is the node's silence.
 * Exits 77 without redis-server/redis-cli or without hiredis. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "kvconfig.h"

#if !KV_HAVE_HIREDIS
int main(void)
{
	SKIP("built without hiredis: no G4");
}
#else
#include "rcluster_harness.h"

#define BB 16384u
#define N 1200
#define TIMEOUT_MS 1000      /* remote_timeout: a silent node */
#define WRITE_MS 20000       /* remote_write_timeout: far, so the stall is the node's */
#define BOUND_MS 10000

static struct kvt_rc rc;
static char tmp[64], conf_arg[200];

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

struct wcount {
	uint64_t writes, errors, dropped, inflight;
};

static void g4_counts(struct wcount *w)
{
	Kvcached__Response *rs = kvt_g4_stats("dm");

	w->writes = rs->stats->remote->writes;
	w->errors = rs->stats->remote->write_errors;
	w->dropped = rs->stats->remote->dropped;
	w->inflight = rs->stats->remote->inflight_bytes;
	kvcached__response__free_unpacked(rs, NULL);
}

/* Waits until the chain's n writes since w0 all ended (stored or failed)
 * and nothing is in flight; fails the test after bound_ms. Returns the ms
 * it took. */
static uint64_t writes_end(const struct wcount *w0, struct wcount *w, uint64_t bound_ms)
{
	uint64_t t0 = mono_ms();

	for (;;) {
		g4_counts(w);
		if (w->writes + w->errors >= w0->writes + w0->errors + N && !w->inflight)
			break;
		if (mono_ms() - t0 > bound_ms) {
			fprintf(stderr, "  after %llu ms: %llu stored, %llu failed of %d, %llu bytes "
				"in flight\n", (unsigned long long)bound_ms,
				(unsigned long long)(w->writes - w0->writes),
				(unsigned long long)(w->errors - w0->errors), N,
				(unsigned long long)w->inflight);
			CHECK(!"the writes ended");
		}
		usleep(2000);
	}
	CHECK_EQ(w->dropped, w0->dropped);
	CHECK_EQ(w->writes + w->errors, w0->writes + w0->errors + N);
	return mono_ms() - t0;
}

/* Every block of chain base still in G2 (no G3, G1 evicted), read back
 * byte for byte by a lookup, then released and G1 evicted again. */
static void all_in_g2(kvc_conn *c, int pool, uint64_t base, const char *what)
{
	kvc_block *b = calloc(N, sizeof(*b));
	struct kvt_tier t2;
	int k;

	CHECK(b != NULL);
	kvt_tiers_settle();
	kvt_tier(1, &t2);
	fprintf(stderr, "%s: G2 holds %llu blocks\n", what, (unsigned long long)t2.blocks);
	CHECK(t2.blocks >= N);
	k = kvt_lookup_held(c, pool, BB, N, base, b);   /* every byte checked */
	fprintf(stderr, "%s: the lookup found %d of %d blocks, each right\n", what, k, N);
	CHECK_EQ(k, N);
	CHECK_EQ(kvc_release(c, b, N), 0);
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	free(b);
}

static void g2_empties(kvc_conn *c, const char *what)
{
	struct kvt_tier t2;
	struct wcount w;

	for (uint64_t t0 = mono_ms();; usleep(2000)) {   /* no write holds a slot */
		g4_counts(&w);
		if (!w.inflight)
			break;
		CHECK(mono_ms() - t0 < BOUND_MS);
	}
	kvt_evict(c, KVCACHED__TIER__TIER_G2);
	kvt_tier(1, &t2);
	fprintf(stderr, "%s: G2 after Evict G2: %llu blocks, %llu bytes used\n", what,
		(unsigned long long)t2.blocks, (unsigned long long)t2.used);
	CHECK_EQ(t2.blocks, 0);
	CHECK_EQ(t2.used, 0);
}

static void config_set(int node, const char *key, const char *val)
{
	redisContext *x = kvt_rc_connect(&rc, node);
	redisReply *r;

	CHECK(x != NULL);
	r = redisCommand(x, "CONFIG SET %s %s", key, val);
	CHECK(r && r->type == REDIS_REPLY_STATUS);
	freeReplyObject(r);
	redisFree(x);
}

static long long dbsize(int node)
{
	redisContext *x = kvt_rc_connect(&rc, node);
	redisReply *r;
	long long n;

	CHECK(x != NULL);
	r = redisCommand(x, "DBSIZE");
	CHECK(r && r->type == REDIS_REPLY_INTEGER);
	n = r->integer;
	freeReplyObject(r);
	redisFree(x);
	return n;
}

int main(void)
{
	struct kvt_daemon a;
	struct wcount w0, w;
	kvc_conn *c;
	FILE *f;
	char path[160];
	int pool, refuser = -1, victim = -1;
	uint64_t t_stop, ms, answered;

	snprintf(tmp, sizeof(tmp), "/tmp/kvt-g4pipe.XXXXXX");
	CHECK(mkdtemp(tmp) != NULL);
	kvt_rc_start(&rc, 3, 0, NULL);
	snprintf(path, sizeof(path), "%s/kvcached.conf", tmp);
	CHECK((f = fopen(path, "w")) != NULL);
	fprintf(f, "remote_seeds = %s\nremote_timeout = %ums\nremote_write_timeout = %ums\n"
		"remote_min_rate = 1KiB\nremote_auth = off\nremote_write = demote\n\n"
		"[namespace dm]\nusers = %u\nremote = yes\n", kvt_rc_seeds(&rc), TIMEOUT_MS,
		WRITE_MS, (unsigned)getuid());
	fclose(f);
	snprintf(conf_arg, sizeof(conf_arg), "--config=%s", path);
	/* G1 and G2 hold a chain (19 MiB) and then some; no G3. */
	kvt_start(&a, conf_arg, "--pool-size", "48MiB", "--host-tier-size", "64MiB", NULL);
	setenv("KVCACHED_SOCKET", a.sock, 1);
	for (int i = 0; i < rc.n; i++)
		if (kvt_rc_is_master(&rc, i))
			refuser < 0 ? (refuser = i) : victim < 0 ? (victim = i) : 0;
	CHECK(refuser >= 0 && victim >= 0);
	c = kvt_connect("dm");
	pool = kvt_pool(c, "p", BB);

	/* refuse */
	config_set(refuser, "maxmemory-policy", "noeviction");
	config_set(refuser, "maxmemory", "1");
	g4_counts(&w0);
	kvt_seal_chain(c, pool, BB, N, 100000);
	kvt_evict_nowait(c, KVCACHED__TIER__TIER_G1);
	ms = writes_end(&w0, &w, BOUND_MS);
	{
		long long held = 0;

		for (int i = 0; i < rc.n; i++)
			if (i != refuser && kvt_rc_is_master(&rc, i))
				held += dbsize(i);
		fprintf(stderr, "refuse: node %d refuses SETs: %llu of %d stored, %llu failed, in "
			"%llu ms; the other masters hold %lld keys\n", refuser,
			(unsigned long long)(w.writes - w0.writes), N,
			(unsigned long long)(w.errors - w0.errors), (unsigned long long)ms, held);
		CHECK(w.errors - w0.errors > 0);
		CHECK(w.writes - w0.writes > 0);
		CHECK_EQ(dbsize(refuser), 0);
		CHECK_EQ((uint64_t)held, w.writes - w0.writes);
	}
	all_in_g2(c, pool, 100000, "refuse");
	g2_empties(c, "refuse");
	config_set(refuser, "maxmemory", "0");

	/* stall */
	g4_counts(&w0);
	kvt_seal_chain(c, pool, BB, N, 200000);
	kvt_evict_nowait(c, KVCACHED__TIER__TIER_G1);
	for (uint64_t t0 = mono_ms();; usleep(200)) {
		g4_counts(&w);
		if (w.writes > w0.writes)
			break;
		CHECK(mono_ms() - t0 < BOUND_MS);
	}
	answered = w.writes - w0.writes;
	kvt_rc_pause(&rc, victim, 1);
	t_stop = mono_ms();
	writes_end(&w0, &w, BOUND_MS);
	ms = mono_ms() - t_stop;
	fprintf(stderr, "stall: node %d stopped once %llu writes were answered: %llu of %d "
		"stored, %llu failed; all ended %llu ms after the stop (remote_timeout %u ms)\n",
		victim, (unsigned long long)answered, (unsigned long long)(w.writes - w0.writes), N,
		(unsigned long long)(w.errors - w0.errors), (unsigned long long)ms, TIMEOUT_MS);
	CHECK(w.errors - w0.errors > 0);
	all_in_g2(c, pool, 200000, "stall");
	kvt_rc_pause(&rc, victim, 0);
	g2_empties(c, "stall");
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_stop(&a);
	kvt_rc_stop(&rc);
	rmdir(tmp);
	fprintf(stderr, "ok\n");
	return 0;
}
#endif
