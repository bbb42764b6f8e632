/* A parked Lookup resumes where its last run stopped (issue 28, cache.c):
 * the rerun carries over the G1 blocks at the head of its chain that it
 * pinned, instead of walking the chain from block 0 again. Its reply must
 * be exactly what a fresh lookup of the same state replies. A real Redis
 * Cluster (3 masters) on loopback; node A writes a chain of N blocks (more
 * than two fetches of 64) to G4 and drops it; node R reads it.
 *
 *   mixed:   R holds blocks 0..31 in G1 and 32..63 in G2, the rest is in G4
 *            only: one Lookup finds all N, every byte right, and a fresh
 *            lookup in the same session gets the very same blocks;
 *   evicted: R holds 0..63 in G1; a client's Lookup pins them and parks on
 *            G4 (every master stopped); G1 and G2 are emptied under it
 *            (Evict); the masters go on: it finds all N, the same blocks as
 *            a fresh lookup, every byte right;
 *   killed:  the same, the client killed while it is parked: nothing is
 *            left over (Check), another client finds the chain;
 *   dup:     R holds block 0 in G1; a Lookup lists it DUP times (within
 *            max_block_refs, not twice), then blocks 1..N-1, and parks on
 *            G4: its rerun must be given them all, as a fresh lookup is
 *            (the DUP pins its last run left are its own, and go: they
 *            do not count against max_block_refs); Check with the fetch
 *            in flight too;
 *   ttl:     the same, but while it is parked a reload gives the namespace
 *            a TTL its carried blocks are past: the rerun must find them
 *            expired (no hits), as a fresh lookup would, not carry them. */
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
#define FETCH 64               /* remote.c's FETCH_MAX */
#define N (2 * FETCH + 40)
#define BASE 9000
#define MAX_REFS 8
#define DUP 6                  /* block 0 listed DUP times: within MAX_REFS, not twice */

static struct kvt_rc rc;
static char tmp[64], conf_arg[200];
static const char *ttl = "0";

static void write_conf(void)
{
	char path[160];
	FILE *f;

	snprintf(path, sizeof(path), "%s/kvcached.conf", tmp);
	CHECK((f = fopen(path, "w")) != NULL);
	/* A long timeout: a stopped cluster must hold a fetch in flight for as
	 * long as the test needs, not fail it. */
	fprintf(f, "remote_seeds = %s\nremote_timeout = 60s\nremote_auth = off\n"
		"remote_fetch_timeout = 120s\n", kvt_rc_seeds(&rc));
	fprintf(f, "worker_socket_admin = yes\nmax_block_refs = %u\n\n", MAX_REFS);
	fprintf(f, "[namespace ra]\nusers = %u\nremote = yes\nttl = %s\n", (unsigned)getuid(), ttl);
	fclose(f);
	snprintf(conf_arg, sizeof(conf_arg), "--config=%s", path);
}

static void node_start(struct kvt_daemon *d, const char *write)
{
	char w[64];

	snprintf(w, sizeof(w), "--remote-write=%s", write);
	kvt_start(d, conf_arg, w, "--pool-size", "8MiB", "--segment-size", "1MiB", "--page-size",
		  "64KiB", "--host-tier-size", "8MiB", NULL);
	setenv("KVCACHED_SOCKET", d->sock, 1);
}

static uint64_t g4_fetching(void)
{
	Kvcached__Response *rs = kvt_g4_stats("ra");
	uint64_t n = rs->stats->remote->fetching;

	kvcached__response__free_unpacked(rs, NULL);
	return n;
}

static void wait_fetching(int busy)
{
	for (int tries = 0; (g4_fetching() != 0) != busy; tries++) {
		CHECK(tries < 60000);
		usleep(1000);
	}
}

/* Namespace ra's TTL as the daemon has it now. */
static uint64_t ns_ttl(void)
{
	Kvcached__Response *rs = kvt_g4_stats("ra");
	uint64_t t = UINT64_MAX;

	for (size_t i = 0; i < rs->stats->n_namespaces; i++)
		if (!strcmp(rs->stats->namespaces[i]->name, "ra"))
			t = rs->stats->namespaces[i]->ttl_ms;
	kvcached__response__free_unpacked(rs, NULL);
	CHECK(t != UINT64_MAX);
	return t;
}

static void reload(struct kvt_daemon *d, const char *t, uint64_t want_ms)
{
	ttl = t;
	write_conf();
	CHECK(kill(d->pid, SIGHUP) == 0);
	for (int tries = 0; ns_ttl() != want_ms; tries++) {
		CHECK(tries < 60000);
		usleep(1000);
	}
}

/* Looks up blocks [0, n) of the chain in one Lookup of session c; every
 * block found must hold its bytes. Returns how many were found (held, in
 * b). */
static int lookup_in(kvc_conn *c, int pool, int n, kvc_block *b)
{
	return kvt_lookup_held(c, pool, BB, n, BASE, b);
}

/* The whole chain looked up, then looked up again in the same session:
 * the second (fresh, nothing to wait for) must reply the very same blocks,
 * in the same order. Returns how many the first found (all released). */
static int lookup_twice(int n)
{
	kvc_conn *c = kvt_connect("ra");
	int pool = kvt_pool(c, "p", BB), k, k2;
	kvc_block *b = calloc((size_t)n, sizeof(*b)), *b2 = calloc((size_t)n, sizeof(*b2));

	CHECK(b && b2);
	k = lookup_in(c, pool, n, b);
	k2 = lookup_in(c, pool, n, b2);
	CHECK_EQ(k2, k);
	CHECK(!k || !memcmp(b, b2, (size_t)k * sizeof(*b)));
	if (k) {
		CHECK_EQ(kvc_release(c, b, (size_t)k), 0);
		CHECK_EQ(kvc_release(c, b2, (size_t)k), 0);
	}
	kvc_close(c);
	free(b);
	free(b2);
	return k;
}

/* A child's lookup_twice() of the whole chain: exits 0 when the first
 * lookup found *want blocks. */
static int child_twice(void *arg)
{
	int k = lookup_twice(N);

	if (k != *(int *)arg)
		fprintf(stderr, "child: found %d of %d, want %d\n", k, N, *(int *)arg);
	return k == *(int *)arg ? 0 : 1;
}

/* Node A: seals the chain, demotes it (each block goes to G4 as it lands
 * in G2), waits for the writes, and drops G1 and G2. */
static void write_chain(void)
{
	kvc_conn *c = kvt_connect("ra");
	int pool = kvt_pool(c, "p", BB);
	kvc_block b[N];
	kvc_hash h[N];

	CHECK_EQ(kvc_alloc(c, pool, N, b), N);
	for (int i = 0; i < N; i++) {
		kvt_mem_fill(c, kvc_block_ptr(c, b[i]), BB, BASE + (uint64_t)i);
		h[i] = kvt_hash(BASE + (uint64_t)i);
	}
	CHECK_EQ(kvc_seal(c, pool, b, h, N, b), N);
	CHECK_EQ(kvc_release(c, b, N), 0);
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	kvt_g4_settled("ra", N);
	kvt_evict(c, KVCACHED__TIER__TIER_G2);
	kvc_close(c);
}

/* Node R holding the chain's first head blocks in G1 and the next g2 in
 * G2 (cached, nobody holds them), nothing else. */
static void node_with_head(struct kvt_daemon *d, int head, int g2)
{
	kvc_conn *c;
	kvc_block b[FETCH];
	int pool;

	node_start(d, "off");
	c = kvt_connect("ra");
	pool = kvt_pool(c, "p", BB);
	if (g2) {
		CHECK_EQ(lookup_in(c, pool, head + g2, b), head + g2);
		CHECK_EQ(kvc_release(c, b, (size_t)(head + g2)), 0);
		kvt_evict(c, KVCACHED__TIER__TIER_G1);
	}
	CHECK_EQ(lookup_in(c, pool, head, b), head);
	CHECK_EQ(kvc_release(c, b, (size_t)head), 0);
	kvc_close(c);
}

static void cluster_pause(int stop)
{
	for (int i = 0; i < rc.n; i++)
		kvt_rc_pause(&rc, i, stop);
	if (!stop)
		CHECK(kvt_rc_wait_healthy(&rc, 60000) == 0);
}

/* A lookup of block 0 listed DUP times, then blocks 1..N-1: a fresh lookup
 * is given all of them (block 0's DUP references are within max_block_refs),
 * so must a rerun be, whatever it pinned of block 0 meanwhile. Exits 0 when
 * it found them all, each with its bytes. */
static int child_dup(void *arg)
{
	kvc_conn *c = kvt_connect("ra");
	int pool = kvt_pool(c, "p", BB), n = DUP + N - 1, k;
	kvc_hash *h = calloc((size_t)n, sizeof(*h));
	kvc_block *b = calloc((size_t)n, sizeof(*b));

	(void)arg;
	CHECK(h && b);
	for (int i = 0; i < n; i++)
		h[i] = kvt_hash(BASE + (uint64_t)(i < DUP ? 0 : i - DUP + 1));
	k = kvc_lookup(c, pool, h, (size_t)n, b);
	if (k != n) {
		fprintf(stderr, "dup: found %d of %d: %s\n", k, n, k < 0 ? kvc_last_error(c) : "");
		return 1;
	}
	for (int i = 0; i < k; i++)
		CHECK(kvt_mem_verify(c, kvc_block_ptr(c, b[i]), BB,
				     BASE + (uint64_t)(i < DUP ? 0 : i - DUP + 1)));
	CHECK_EQ(kvc_release(c, b, (size_t)k), 0);
	kvc_close(c);
	free(h);
	free(b);
	return 0;
}

/* R holds 0..63 in G1; a child's lookup of the whole chain parks on G4
 * (stopped). Returns the child, parked. */
static pid_t parked_child(struct kvt_daemon *r, int *want)
{
	pid_t pid;

	node_with_head(r, FETCH, 0);
	cluster_pause(1);
	pid = kvt_spawn(child_twice, want);
	wait_fetching(1);
	return pid;
}

int main(void)
{
	struct kvt_daemon a, r;
	kvc_conn *c;
	pid_t pid;
	int all = N, none = 0;

	snprintf(tmp, sizeof(tmp), "/tmp/kvt-resume.XXXXXX");
	CHECK(mkdtemp(tmp) != NULL);
	{
		struct kvt_rc_opts o = { .node_timeout_ms = 15000 };

		kvt_rc_start(&rc, 3, 0, &o);
	}
	write_conf();
	node_start(&a, "demote");
	write_chain();
	kvt_stop(&a);

	/* mixed */
	node_with_head(&r, 32, 32);
	CHECK_EQ(lookup_twice(N), N);
	CHECK_EQ(kvt_check(), 0);
	fprintf(stderr, "mixed: G1, G2 and G4 blocks of one chain, found whole\n");
	kvt_stop(&r);

	/* evicted */
	pid = parked_child(&r, &all);
	CHECK_EQ(kvt_check(), 0);   /* a fetch in flight, its slots reserved */
	c = kvt_connect("ra");
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	kvt_evict(c, KVCACHED__TIER__TIER_G2);
	kvc_close(c);
	cluster_pause(0);
	CHECK_EQ(kvt_wait(pid), 0);
	CHECK_EQ(kvt_check(), 0);
	fprintf(stderr, "evicted: G1 and G2 emptied under a parked lookup; found whole\n");
	kvt_stop(&r);

	/* killed */
	pid = parked_child(&r, &all);
	CHECK(kill(pid, SIGKILL) == 0);
	CHECK_EQ(kvt_wait(pid), 128 + SIGKILL);
	cluster_pause(0);
	kvt_wait_sessions(0);
	wait_fetching(0);
	CHECK_EQ(kvt_check(), 0);
	CHECK_EQ(lookup_twice(N), N);
	CHECK_EQ(kvt_check(), 0);
	fprintf(stderr, "killed: nothing left over of a parked lookup's pins\n");
	kvt_stop(&r);

	/* dup: block 0 listed DUP times, parked on G4: its pins must not count
	 * against the rerun's references */
	node_with_head(&r, 1, 0);
	cluster_pause(1);
	pid = kvt_spawn(child_dup, NULL);
	wait_fetching(1);
	CHECK_EQ(kvt_check(), 0);
	cluster_pause(0);
	CHECK_EQ(kvt_wait(pid), 0);
	CHECK_EQ(kvt_check(), 0);
	CHECK_EQ(child_dup(NULL), 0);   /* fresh, all in G1: the same */
	CHECK_EQ(kvt_check(), 0);
	fprintf(stderr, "dup: a block listed %d times in a parked chain: found whole on the rerun\n",
		DUP);
	kvt_stop(&r);

	/* ttl: the carried blocks are older than 1 ms once it is reloaded */
	pid = parked_child(&r, &none);
	reload(&r, "1ms", 1);
	usleep(2000);   /* not to wait for anything: makes every block older than 1 ms */
	cluster_pause(0);
	CHECK_EQ(kvt_wait(pid), 0);
	CHECK_EQ(kvt_check(), 0);
	reload(&r, "0", 0);
	fprintf(stderr, "ttl: a TTL reloaded under a parked lookup expires what it carried\n");
	kvt_stop(&r);

	kvt_rc_stop(&rc);
	{
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp);
		CHECK(system(cmd) == 0);
	}
	return 0;
}
#endif
