/* G4 read-ahead (issue 28 item 2): a Lookup that promotes the blocks one
 * fetch brought asks G4 for the next ones meanwhile (docs/g4.md). A real
 * Redis Cluster (3 masters) on loopback and kvcached daemons standing for
 * nodes; node A writes a chain of N blocks (more than two fetches of 64) to
 * G4 at demotion and drops it, every other node reads it (remote_write =
 * off: it writes nothing back).
 *
 *   long:     node B, holding nothing, finds the whole chain in one Lookup,
 *             every byte right, all N from G4 (the reply says so: tiers),
 *             and it asked ahead;
 *   killed:   node C holds the chain's first 64 blocks in G2; every master
 *             is stopped (SIGSTOP); a client's Lookup promotes those and
 *             its read-ahead of the next hangs in the read thread; the
 *             client is killed then (the daemon, which does not read a
 *             parked connection, learns it when the lookup ends); the
 *             masters go on: nothing is left over, Check passes, another
 *             client finds the whole chain right;
 *   gone:     the same, but the session is closed under the parked lookup
 *             (a reload that takes its namespace "rb" away from the uid,
 *             and the worker socket's admin rights, Check's, for a while):
 *             the read-ahead being read ends as any fetch;
 *   queued:   the same, but the read thread is busy with another client's
 *             fetch first, so the read-ahead waits in its queue: closing its
 *             session takes it out of the queue (fetching drops by one);
 *   small G2: node D, whose G2 holds fewer blocks than two fetches, still
 *             finds the whole chain right. */
#include <signal.h>
#include <stdint.h>
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

#define BB 16384u
#define FETCH 64               /* remote_int.h's FETCH_MAX */
#define N (2 * FETCH + 40)
#define BASE 7000

static struct kvt_rc rc;
static char tmp[64], conf_arg[200];

static int rb_allowed = 1;

static void write_conf(void);

static void node_start(struct kvt_daemon *d, const char *write, const char *g2)
{
	char w[64];

	snprintf(w, sizeof(w), "--remote-write=%s", write);
	kvt_start(d, conf_arg, w, "--pool-size", "8MiB", "--segment-size", "1MiB", "--page-size",
		  "64KiB", "--host-tier-size", g2, NULL);
	setenv("KVCACHED_SOCKET", d->sock, 1);
}

struct g4c {
	uint64_t fetches, read_aheads, fetching, hits;
};

static void reload(struct kvt_daemon *d, int allow_rb)
{
	rb_allowed = allow_rb;
	write_conf();
	CHECK(kill(d->pid, SIGHUP) == 0);
	if (allow_rb) {
		/* Applied once a session of rb opens again. */
		for (int tries = 0;; tries++) {
			struct kvc_options o = { .ns = "rb", .client_name = "test" };
			kvc_conn *c = NULL;

			if (kvc_connect(NULL, &o, &c) == 0) {
				kvc_close(c);
				break;
			}
			CHECK(tries < 60000);
			usleep(1000);
		}
	}
}

static struct g4c g4c(void)
{
	Kvcached__Response *rs = kvt_g4_stats("ra");
	struct g4c c = { rs->stats->remote->fetches, rs->stats->remote->read_aheads,
			 rs->stats->remote->fetching, rs->stats->remote->hits };

	kvcached__response__free_unpacked(rs, NULL);
	return c;
}


/* Looks up blocks [0, n) of the chain in one Lookup; every block found
 * must hold its bytes. Returns how many were found (released again). */
static int lookup(const char *ns, int n)
{
	return kvt_lookup_chain(ns, "p", BB, n, BASE);
}

/* lookup() that also checks that every block found came from tier want
 * (kvc_lookup_tiers(): what vLLM's connector reports as a hit's source). */
static int lookup_from(const char *ns, int n, uint8_t want)
{
	static kvc_block b[N];
	static kvc_hash h[N];
	static uint8_t t[N];
	kvc_conn *c = kvt_connect(ns);
	int pool = kvt_pool(c, "p", BB), k;

	CHECK(n <= N);
	for (int i = 0; i < n; i++)
		h[i] = kvt_hash(BASE + (uint64_t)i);
	k = kvc_lookup_tiers(c, pool, h, (size_t)n, b, t);
	CHECK(k >= 0);
	for (int i = 0; i < k; i++) {
		CHECK(kvt_mem_verify(c, kvc_block_ptr(c, b[i]), BB, BASE + (uint64_t)i));
		CHECK_EQ(t[i], want);
	}
	if (k)
		CHECK_EQ(kvc_release(c, b, (size_t)k), 0);
	kvc_close(c);
	return k;
}

/* A lookup of the whole chain in namespace arg, which may be cut off:
 * exits 0 when it found it all, else 1. */
static int child_lookup(void *arg)
{
	struct kvc_options o = { .ns = arg, .client_name = "test" };
	struct kvc_pool_desc pd = { .name = "p", .block_bytes = BB, .block_tokens = 16,
				    .dtype = "fp16", .layout = "test", .layout_len = 4 };
	static kvc_block b[N];
	static kvc_hash h[N];
	kvc_conn *c = NULL;
	int pool;

	if (kvc_connect(NULL, &o, &c) < 0 || (pool = kvc_register_pool(c, &pd)) < 0)
		return 1;
	for (int i = 0; i < N; i++)
		h[i] = kvt_hash(BASE + (uint64_t)i);
	return kvc_lookup(c, pool, h, N, b) == N ? 0 : 1;
}

/* A lookup of another chain that G4 does not have (it only asks). */
static int child_miss(void *arg)
{
	kvc_conn *c = kvt_connect("ra");
	int pool = kvt_pool(c, "p", BB);
	kvc_block b[4];
	kvc_hash h[4];

	(void)arg;
	for (int i = 0; i < 4; i++)
		h[i] = kvt_hash(90000 + (uint64_t)i);
	CHECK(kvc_lookup(c, pool, h, 4, b) == 0);
	kvc_close(c);
	return 0;
}

/* Node A: seals n blocks of bb bytes (seeds base...) in pool pname of ns,
 * demotes them (each block goes to G4 as it lands in G2), waits for the
 * writes, and drops G2. */
static void write_blocks(const char *ns, const char *pname, uint32_t bb, int n, uint64_t base)
{
	kvc_conn *c = kvt_connect(ns);
	int pool = kvt_pool(c, pname, bb);
	Kvcached__Response *rs0 = kvt_g4_stats(ns);
	uint64_t want = rs0->stats->remote->writes + (uint64_t)n;

	kvcached__response__free_unpacked(rs0, NULL);
	kvt_seal_chain(c, pool, bb, n, base);
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	CHECK_EQ(kvt_g4_settled(ns, want), want);
	kvt_evict(c, KVCACHED__TIER__TIER_G2);
	kvc_close(c);
}

/* The chain the cases look up: N blocks of BB in pool p. */
static void write_chain(const char *ns)
{
	write_blocks(ns, "p", BB, N, BASE);
}

/* Every master stopped (1) or going on (0, and healthy again: the long
 * cluster-node-timeout keeps the masters from failing each other for a
 * pause). */
static void cluster_pause(int stop)
{
	for (int i = 0; i < rc.n; i++)
		kvt_rc_pause(&rc, i, stop);
	if (!stop)
		CHECK(kvt_rc_wait_healthy(&rc, 60000) == 0);
}

/* Waits until G4's counters satisfy what cond says (polling; the deadline is
 * a guard against a hang). */
static struct g4c wait_g4(int (*cond)(const struct g4c *c, const struct g4c *base),
			  const struct g4c *base)
{
	for (int tries = 0;; tries++) {
		struct g4c c = g4c();

		if (cond(&c, base))
			return c;
		CHECK(tries < 60000);
		usleep(1000);
	}
}

static int ahead_in_flight(const struct g4c *c, const struct g4c *b)
{
	return c->read_aheads > b->read_aheads && c->fetching >= 1;
}

static int ahead_queued(const struct g4c *c, const struct g4c *b)
{
	return c->read_aheads > b->read_aheads && c->fetching >= 2;
}

static int one_fetching(const struct g4c *c, const struct g4c *b)
{
	(void)b;
	return c->fetching == 1;
}

static int none_fetching(const struct g4c *c, const struct g4c *b)
{
	(void)b;
	return c->fetching == 0;
}

static int fetch_started(const struct g4c *c, const struct g4c *b)
{
	return c->fetches > b->fetches && c->fetching == 1;
}

/* A node holding the chain's first FETCH blocks in G2 only. */
static void node_with_head(struct kvt_daemon *d, const char *ns)
{
	kvc_conn *c;

	node_start(d, "off", "8MiB");
	CHECK_EQ(lookup(ns, FETCH), FETCH);
	c = kvt_connect(ns);
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	kvc_close(c);
}

/* Blocks of 1 MiB: 64 would pass remote_int.h's FETCH_BYTES (4 MiB), so a
 * fetch asks for 4 and a chain of 20 is five fetches (read-aheads among
 * them), each block whole. */
#define BIG (1u << 20)
#define NBIG 20
#define BIGBASE 50000

static void big_blocks(void)
{
	struct kvt_daemon w, r;
	kvc_block b[NBIG];
	kvc_hash h[NBIG];
	struct g4c before, after;
	kvc_conn *c;
	int pool, k;

	kvt_start(&w, conf_arg, "--remote-write=demote", "--pool-size", "32MiB", "--segment-size",
		  "1MiB", "--page-size", "64KiB", "--host-tier-size", "32MiB", NULL);
	setenv("KVCACHED_SOCKET", w.sock, 1);
	write_blocks("ra", "big", BIG, NBIG, BIGBASE);
	kvt_stop(&w);

	for (int i = 0; i < NBIG; i++)
		h[i] = kvt_hash(BIGBASE + (uint64_t)i);
	kvt_start(&r, conf_arg, "--remote-write=off", "--pool-size", "32MiB", "--segment-size",
		  "1MiB", "--page-size", "64KiB", "--host-tier-size", "32MiB", NULL);
	setenv("KVCACHED_SOCKET", r.sock, 1);
	c = kvt_connect("ra");
	pool = kvt_pool(c, "big", BIG);
	before = g4c();
	k = kvc_lookup(c, pool, h, NBIG, b);
	after = g4c();
	fprintf(stderr, "big blocks: found %d of %d; G4 fetches %llu, read-ahead %llu\n", k, NBIG,
		(unsigned long long)(after.fetches - before.fetches),
		(unsigned long long)(after.read_aheads - before.read_aheads));
	CHECK_EQ(k, NBIG);
	for (int i = 0; i < NBIG; i++)
		CHECK(kvt_mem_verify(c, kvc_block_ptr(c, b[i]), BIG, BIGBASE + (uint64_t)i));
	CHECK_EQ(after.hits - before.hits, NBIG);
	CHECK_EQ(after.fetches - before.fetches, 5);   /* 4 at a time */
	CHECK_EQ(kvc_release(c, b, NBIG), 0);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_stop(&r);
}

static void write_conf(void)
{
	char path[160];
	FILE *f;

	snprintf(path, sizeof(path), "%s/kvcached.conf", tmp);
	CHECK((f = fopen(path, "w")) != NULL);
	/* A long timeout: a stopped cluster must hold a fetch in flight for as
	 * long as the test needs, not fail it. One reader: "queued" makes a
	 * read-ahead wait behind another client's fetch (with two, it would be
	 * read beside it). */
	fprintf(f, "remote_seeds = %s\nremote_timeout = 60s\nremote_auth = off\n"
		"remote_fetch_timeout = 120s\nremote_readers = 1\n", kvt_rc_seeds(&rc));
	/* The test's uid may be root or the daemon's, admins on the worker
	 * socket, whom a reload never turns away: not while rb is taken. */
	fprintf(f, "worker_socket_admin = %s\n\n", rb_allowed ? "yes" : "no");
	fprintf(f, "[namespace ra]\nusers = %u\nremote = yes\n\n", (unsigned)getuid());
	fprintf(f, "[namespace rb]\nusers = %u\nremote = yes\n",
		rb_allowed ? (unsigned)getuid() : (unsigned)getuid() + 4242);
	fclose(f);
	snprintf(conf_arg, sizeof(conf_arg), "--config=%s", path);
}

int main(void)
{
	struct kvt_daemon a, b, c, d;
	struct g4c before, after;
	pid_t pid, miss;
	int k;

	snprintf(tmp, sizeof(tmp), "/tmp/kvt-g4ra.XXXXXX");
	CHECK(mkdtemp(tmp) != NULL);
	{
		struct kvt_rc_opts o = { .node_timeout_ms = 15000 };

		kvt_rc_start(&rc, 3, 0, &o);
	}
	write_conf();
	node_start(&a, "demote", "8MiB");
	write_chain("ra");
	write_chain("rb");

	/* long */
	node_start(&b, "off", "8MiB");
	before = g4c();
	k = lookup_from("ra", N, KVC_TIER_G4);
	after = g4c();
	fprintf(stderr, "long: found %d of %d; G4 fetches %llu, read-ahead %llu, hits %llu\n", k,
		N, (unsigned long long)(after.fetches - before.fetches),
		(unsigned long long)(after.read_aheads - before.read_aheads),
		(unsigned long long)(after.hits - before.hits));
	CHECK_EQ(k, N);
	CHECK_EQ(after.hits - before.hits, N);
	CHECK(after.read_aheads > before.read_aheads);
	CHECK_EQ(after.fetching, 0);
	CHECK_EQ(kvt_check(), 0);
	CHECK_EQ(lookup_from("ra", N, KVC_TIER_G1), N);   /* local now */
	CHECK_EQ(g4c().hits, after.hits);
	kvt_stop(&b);

	/* killed: the client goes while its read-ahead is read */
	node_with_head(&c, "ra");
	before = g4c();
	cluster_pause(1);
	pid = kvt_spawn(child_lookup, "ra");
	wait_g4(ahead_in_flight, &before);
	CHECK(kill(pid, SIGKILL) == 0);
	CHECK_EQ(kvt_wait(pid), 128 + SIGKILL);
	cluster_pause(0);
	kvt_wait_sessions(0);
	wait_g4(none_fetching, NULL);
	CHECK_EQ(kvt_check(), 0);
	CHECK_EQ(lookup("ra", N), N);
	CHECK_EQ(kvt_check(), 0);
	fprintf(stderr, "killed: the chain is whole after its client went mid-read-ahead\n");
	kvt_stop(&c);

	/* gone: the session closed while its read-ahead is read */
	node_with_head(&c, "rb");
	before = g4c();
	cluster_pause(1);
	pid = kvt_spawn(child_lookup, "rb");
	wait_g4(ahead_in_flight, &before);
	reload(&c, 0);
	CHECK_EQ(kvt_wait(pid), 1);   /* cut off */
	kvt_wait_sessions(0);
	cluster_pause(0);
	wait_g4(none_fetching, NULL);
	reload(&c, 1);
	CHECK_EQ(kvt_check(), 0);
	CHECK_EQ(lookup("rb", N), N);
	CHECK_EQ(kvt_check(), 0);
	fprintf(stderr, "gone: a read-ahead in flight outlived its session; the chain is whole\n");
	kvt_stop(&c);

	/* queued: the read-ahead waits behind another client's fetch */
	node_with_head(&c, "rb");
	before = g4c();
	cluster_pause(1);
	miss = kvt_spawn(child_miss, NULL);
	wait_g4(fetch_started, &before);
	pid = kvt_spawn(child_lookup, "rb");
	wait_g4(ahead_queued, &before);
	reload(&c, 0);
	CHECK_EQ(kvt_wait(pid), 1);   /* cut off */
	kvt_wait_sessions(1);
	wait_g4(one_fetching, NULL);   /* out of the queue as its session went */
	cluster_pause(0);
	CHECK_EQ(kvt_wait(miss), 0);
	wait_g4(none_fetching, NULL);
	reload(&c, 1);
	CHECK_EQ(kvt_check(), 0);
	CHECK_EQ(lookup("rb", N), N);
	CHECK_EQ(kvt_check(), 0);
	fprintf(stderr, "queued: a queued read-ahead went with its session\n");
	kvt_stop(&c);

	/* small G2: 90 slots of 16 KiB and a 4 KiB header, fewer than two
	 * fetches */
	node_start(&d, "off", "1920KiB");
	before = g4c();
	k = lookup("ra", N);
	after = g4c();
	fprintf(stderr, "small G2: found %d of %d; G4 fetches %llu, read-ahead %llu, hits %llu\n",
		k, N, (unsigned long long)(after.fetches - before.fetches),
		(unsigned long long)(after.read_aheads - before.read_aheads),
		(unsigned long long)(after.hits - before.hits));
	CHECK_EQ(k, N);
	CHECK_EQ(kvt_check(), 0);
	kvt_stop(&d);

	kvt_stop(&a);
	big_blocks();
	kvt_rc_stop(&rc);
	{
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp);
		CHECK(system(cmd) == 0);
	}
	return 0;
}
#endif
