/* G4 end to end: a real Redis Cluster (3 masters, a replica each) on
 * loopback and kvcached daemons standing for nodes of a fleet, each with its
 * own G1-G3 (docs/g4.md).
 *
 *   shared:    node A seals a chain and writes it back; node B misses locally,
 *              finds it in G4, and its worker reads the same bytes;
 *   isolation: the same pool in another namespace of B sees none of it, and
 *              a namespace without remote = yes does not even ask;
 *   quota:     a namespace's quota_g4 lets three blocks of eight through;
 *   corrupt:   a value changed in Redis is a miss and a checksum failure: the
 *              chain stops before it, never a wrong byte;
 *   failover:  a master killed: lookups meanwhile find fewer blocks or none,
 *              never a wrong one; once a replica took over, all of them;
 *   down:      the whole cluster stopped: both nodes go on from G1-G3, and
 *              a lookup that asks G4 comes back (misses, counted);
 *   users:     on a cluster with AUTH, a namespace with an ACL user of its
 *              own works, one with a wrong password fails alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

#define BB 65536u
#define N 8

static struct kvt_rc rc;
static char tmp[64], conf_arg[200];
static int ndaemons;

/* A daemon with G2 and G3 of its own and G4 on the cluster; write: its
 * remote_write. */
static void node_start_write(struct kvt_daemon *d, const char *write)
{
	char disk[160], w[64];

	snprintf(disk, sizeof(disk), "%s/g3-%d", tmp, ndaemons++);
	snprintf(w, sizeof(w), "--remote-write=%s", write);
	kvt_start(d, conf_arg, w, "--pool-size", "4MiB", "--segment-size", "1MiB", "--page-size",
		  "64KiB", "--host-tier-size", "2MiB", "--disk-path", disk, "--disk-size", "8MiB",
		  NULL);
}

static void node_start(struct kvt_daemon *d)
{
	node_start_write(d, "writeback");
}

static void use(const struct kvt_daemon *d)
{
	setenv("KVCACHED_SOCKET", d->sock, 1);
}

/* Node A: seals the chain (block i holds seed 1000 + i), releases it,
 * demotes it and writes it back, so that it goes to G4; waits for that. */
static void seal_chain(const char *ns, int expect, int expect_errors)
{
	kvc_conn *c = kvt_connect(ns);
	int pool = kvt_pool(c, "p", BB);
	kvc_block b[N];
	kvc_hash h[N];
	uint64_t want, want_err;

	CHECK_EQ(kvc_alloc(c, pool, N, b), N);
	for (int i = 0; i < N; i++) {
		kvt_mem_fill(c, kvc_block_ptr(c, b[i]), BB, 1000 + (uint64_t)i);
		h[i] = kvt_hash(1000 + (uint64_t)i);
	}
	CHECK_EQ(kvc_seal(c, pool, b, h, N, b), N);
	if (kvc_release(c, b, N) != 0) {
		fprintf(stderr, "release: %s\n", kvc_last_error(c));
		exit(1);
	}
	{
		Kvcached__Response *rs = kvt_g4_stats(ns);

		want = rs->stats->remote->writes + (uint64_t)expect;
		want_err = rs->stats->remote->write_errors + (uint64_t)expect_errors;
		kvcached__response__free_unpacked(rs, NULL);
	}
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	kvt_flush(c);
	for (int tries = 0;; tries++) {
		Kvcached__Response *rs = kvt_g4_stats(ns);
		uint64_t w = rs->stats->remote->writes, e = rs->stats->remote->write_errors;
		uint64_t in = rs->stats->remote->inflight_bytes;

		kvcached__response__free_unpacked(rs, NULL);
		CHECK(e <= want_err);
		if (w >= want && e >= want_err && !in)
			break;
		CHECK(tries < 60000);
		usleep(1000);
	}
	kvc_close(c);
}

static void remote_counts(const char *ns, uint64_t *fetches, uint64_t *hits, uint64_t *bad,
			  uint64_t *errors)
{
	Kvcached__Response *rs = kvt_g4_stats(ns);

	*fetches = rs->stats->remote->fetches;
	*hits = rs->stats->remote->hits;
	*bad = rs->stats->remote->checksum_failures;
	*errors = rs->stats->remote->errors;
	kvcached__response__free_unpacked(rs, NULL);
}

/* Flips a payload byte of block i's value in Redis (found by SCAN on every
 * master; the key ends with the block's hash in hex). */
static void corrupt(int i)
{
	kvc_hash h = kvt_hash(1000 + (uint64_t)i);
	char hex[2 * sizeof(h.b) + 1];
	int done = 0;

	for (size_t j = 0; j < sizeof(h.b); j++)
		snprintf(hex + 2 * j, 3, "%02x", h.b[j]);
	for (int n = 0; n < rc.n && !done; n++) {
		redisContext *x;
		redisReply *r;

		if (!kvt_rc_is_master(&rc, n) || !(x = kvt_rc_connect(&rc, n)))
			continue;
		r = redisCommand(x, "SCAN 0 MATCH kvc:g4a:*%s COUNT 100000", hex);
		if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
		    r->element[1]->elements == 1) {
			redisReply *s = redisCommand(x, "SETRANGE %s 200 X", r->element[1]->element[0]->str);

			CHECK(s && s->type == REDIS_REPLY_INTEGER);
			freeReplyObject(s);
			done = 1;
		}
		freeReplyObject(r);
		redisFree(x);
	}
	CHECK(done);
}

static void write_conf(void)
{
	char path[160];
	FILE *f;
	unsigned uid = (unsigned)getuid();

	snprintf(path, sizeof(path), "%s/kvcached.conf", tmp);
	CHECK((f = fopen(path, "w")) != NULL);
	fprintf(f, "remote_seeds = %s\nremote_timeout = 2s\nremote_auth = off\n"
		"remote_fetch_timeout = 30s\n\n", kvt_rc_seeds(&rc));
	fprintf(f, "[namespace g4a]\nusers = %u\nremote = yes\n\n", uid);
	fprintf(f, "[namespace g4b]\nusers = %u\nremote = yes\n\n", uid);
	fprintf(f, "[namespace plain]\nusers = %u\n\n", uid);
	/* Three blocks' worth per remote_ttl (a value: header + payload). */
	fprintf(f, "[namespace g4q]\nusers = %u\nremote = yes\nquota_g4 = %u\n", uid,
		3 * (BB + 80));
	fclose(f);
	snprintf(conf_arg, sizeof(conf_arg), "--config=%s", path);
}

int main(void)
{
	struct kvt_daemon a, b, b2, b3;
	uint64_t fetches, hits, bad, errors, f2, h2, e2, bad2;
	int k;

	snprintf(tmp, sizeof(tmp), "/tmp/kvt-g4.XXXXXX");
	CHECK(mkdtemp(tmp) != NULL);
	kvt_rc_start(&rc, 3, 1, NULL);
	write_conf();
	node_start(&a);
	node_start(&b);

	/* shared */
	use(&a);
	seal_chain("g4a", N, 0);
	CHECK(kvt_rc_wait_replicated(&rc, 30000) == 0);
	use(&b);
	k = kvt_lookup_chain("g4a", "p", BB, N, 1000);
	remote_counts("g4a", &fetches, &hits, &bad, &errors);
	fprintf(stderr, "shared: node B found %d of %d blocks; G4 fetches %llu hits %llu\n", k, N,
		(unsigned long long)fetches, (unsigned long long)hits);
	CHECK_EQ(k, N);
	CHECK_EQ(hits, N);
	CHECK_EQ(kvt_check(), 0);
	/* The second time it is local. */
	CHECK_EQ(kvt_lookup_chain("g4a", "p", BB, N, 1000), N);
	remote_counts("g4a", &f2, &h2, &bad, &e2);
	CHECK_EQ(h2, hits);

	/* read only: a node with remote_write = off finds the chain too, and
	 * what it seals does not go to the cluster */
	{
		struct kvt_daemon r;
		Kvcached__Response *rs;

		node_start_write(&r, "off");
		use(&r);
		CHECK_EQ(kvt_lookup_chain("g4a", "p", BB, N, 1000), N);
		seal_chain("g4b", 0, 0);   /* a G4 namespace: still not written */
		rs = kvt_g4_stats("g4a");
		CHECK_EQ(rs->stats->remote->writes, 0);
		kvcached__response__free_unpacked(rs, NULL);
		kvt_stop(&r);
		use(&b);
	}

	/* isolation */
	CHECK_EQ(kvt_lookup_chain("g4b", "p", BB, N, 1000), 0);
	remote_counts("g4b", &f2, &h2, &bad, &e2);
	CHECK_EQ(h2, hits);
	CHECK(f2 > fetches);   /* it asked, under its own keys */
	fetches = f2;
	CHECK_EQ(kvt_lookup_chain("plain", "p", BB, N, 1000), 0);
	remote_counts("plain", &f2, &h2, &bad, &e2);
	CHECK_EQ(f2, fetches);   /* no G4 for it: nothing asked */

	/* quota: g4q may write three blocks; the other five are throttled */
	use(&a);
	{
		Kvcached__Response *rs = kvt_g4_stats("g4q");
		uint64_t w0 = rs->stats->remote->writes, t0 = rs->stats->remote->throttled;

		kvcached__response__free_unpacked(rs, NULL);
		seal_chain("g4q", 3, 0);
		rs = kvt_g4_stats("g4q");
		fprintf(stderr, "quota: %llu written, %llu throttled\n",
			(unsigned long long)(rs->stats->remote->writes - w0),
			(unsigned long long)(rs->stats->remote->throttled - t0));
		CHECK_EQ(rs->stats->remote->writes - w0, 3);
		CHECK_EQ(rs->stats->remote->throttled - t0, N - 3);
		kvcached__response__free_unpacked(rs, NULL);
	}
	/* Which three went depends on the order of the write-backs (the oldest
	 * first: the chain's tail); B finds at most those, every byte right. */
	use(&b);
	k = kvt_lookup_chain("g4q", "p", BB, N, 1000);
	fprintf(stderr, "quota: node B found %d\n", k);
	CHECK(k <= 3);

	/* corrupt: block 5's value; a node that has nothing (B2) finds 0..4 */
	corrupt(5);
	node_start(&b2);
	use(&b2);
	k = kvt_lookup_chain("g4a", "p", BB, N, 1000);
	remote_counts("g4a", &fetches, &hits, &bad, &errors);
	fprintf(stderr, "corrupt: found %d, checksum failures %llu\n", k, (unsigned long long)bad);
	CHECK_EQ(k, 5);
	CHECK_EQ(bad, 1);
	CHECK_EQ(kvt_check(), 0);

	/* failover: kill the master of block 0's key's slot (any master will
	 * do: the chain spreads over all three); a fresh node reads during and
	 * after */
	kvt_rc_kill(&rc, 0);
	node_start(&b3);
	use(&b3);
	k = kvt_lookup_chain("g4a", "p", BB, N, 1000);
	fprintf(stderr, "failover: during, found %d (no wrong byte)\n", k);
	CHECK(k <= 5);
	CHECK(kvt_rc_wait_healthy(&rc, 60000) == 0);
	kvt_stop(&b3);
	node_start(&b3);
	use(&b3);
	k = kvt_lookup_chain("g4a", "p", BB, N, 1000);
	fprintf(stderr, "failover: after, found %d\n", k);
	CHECK_EQ(k, 5);

	/* down: every node stopped */
	kvt_rc_stop(&rc);
	use(&a);
	CHECK_EQ(kvt_lookup_chain("g4a", "p", BB, N, 1000), N);   /* A's own G2/G3 */
	use(&b);
	CHECK_EQ(kvt_lookup_chain("g4a", "p", BB, N, 1000), N);   /* B's, promoted from G4 before */
	CHECK_EQ(kvt_lookup_chain("g4b", "p", BB, N, 1000), 0);   /* asks, gets errors: a miss */
	remote_counts("g4b", &f2, &h2, &bad, &e2);
	fprintf(stderr, "down: G4 errors %llu\n", (unsigned long long)e2);
	CHECK(e2 > 0);
	CHECK_EQ(kvt_check(), 0);
	use(&a);
	CHECK_EQ(kvt_check(), 0);

	kvt_stop(&b3);
	kvt_stop(&b2);
	kvt_stop(&b);
	kvt_stop(&a);

	/* users: a cluster with AUTH and an ACL user; the daemon logs in with
	 * the password, namespace g4u as user "tenant", namespace g4w as that
	 * user with a wrong password: g4u's blocks are written and found, g4w's
	 * writes fail (counted) and its lookups miss, nothing else notices */
	{
		struct kvt_rc_opts o = { .password = "s3cret", .user = "tenant" };
		struct kvt_daemon u;
		char good[160], badpw[160], path[160];
		FILE *f;
		unsigned uid = (unsigned)getuid();

		kvt_rc_start(&rc, 3, 0, &o);
		snprintf(good, sizeof(good), "%s/good.pw", tmp);
		snprintf(badpw, sizeof(badpw), "%s/bad.pw", tmp);
		snprintf(path, sizeof(path), "%s/users.conf", tmp);
		CHECK((f = fopen(good, "w")) && fputs("s3cret\n", f) >= 0 && !fclose(f));
		CHECK((f = fopen(badpw, "w")) && fputs("wrong\n", f) >= 0 && !fclose(f));
		CHECK((f = fopen(path, "w")) != NULL);
		fprintf(f, "remote_seeds = %s\nremote_timeout = 2s\nremote_auth = off\n"
			"remote_fetch_timeout = 30s\nremote_password_file = %s\n\n",
			kvt_rc_seeds(&rc), good);
		fprintf(f, "[namespace g4u]\nusers = %u\nremote = yes\nremote_user = tenant\n"
			"remote_password_file = %s\n\n", uid, good);
		fprintf(f, "[namespace g4w]\nusers = %u\nremote = yes\nremote_user = tenant\n"
			"remote_password_file = %s\n", uid, badpw);
		fclose(f);
		snprintf(conf_arg, sizeof(conf_arg), "--config=%s", path);
		node_start(&u);
		use(&u);
		seal_chain("g4u", N, 0);
		seal_chain("g4w", 0, N);
		kvt_stop(&u);
		node_start(&u);   /* nothing local: what it finds comes from G4 */
		use(&u);
		CHECK_EQ(kvt_lookup_chain("g4u", "p", BB, N, 1000), N);
		CHECK_EQ(kvt_lookup_chain("g4w", "p", BB, N, 1000), 0);
		remote_counts("g4w", &f2, &h2, &bad2, &e2);
		fprintf(stderr, "users: g4u found %d; g4w's lookups: %llu errors\n", N,
			(unsigned long long)e2);
		CHECK(e2 > 0);
		CHECK_EQ(kvt_check(), 0);
		kvt_stop(&u);
		kvt_rc_stop(&rc);
	}
	{
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp);
		CHECK(system(cmd) == 0);
	}
	return 0;
}
#endif
