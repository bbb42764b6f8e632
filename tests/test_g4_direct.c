/* G4 values read straight into G2 slots (issue 28 item 2, docs/g4.md
 * "Read"): when a fetch goes to the read thread the loop reserves a free G2
 * slot per block, the read client writes each value's header and payload
 * there, and only the values that check out are indexed; every other
 * reserved slot goes back. A real Redis Cluster (3 masters) on loopback and
 * kvcached daemons standing for nodes: node A writes a chain of N blocks of
 * namespace "d" (and of "k", whose values carry an HMAC tag) to G4 at
 * demotion; every case reads it on a fresh node B (nothing cached, counters
 * at 0), checks every byte it serves, that G2 holds nothing afterwards
 * (promoted blocks leave G2; a refused value's slot and the slots of the
 * blocks after it were given back) and Check:
 *
 *   hits:     the whole chain, every block read into its slot (direct N);
 *   keyed:    "k"'s values too are read into their slots, the tag checked
 *             over header and payload where they lie (issue 36: values are
 *             authenticated by default): N found, direct N;
 *   miss:     block 5 deleted from the cluster: 5 found, direct 5;
 *   short:    block 3's value cut to half a block: a checksum failure;
 *   long:     block 3's value one byte longer than a block's: refused by the
 *             client without a byte written into the slot (oversize);
 *   header:   block 7's whole value (valid CRCs) under block 3's key: a
 *             checksum failure (the header names another hash);
 *   payload:  a payload byte of block 3 flipped: a checksum failure;
 *   twice:    a chain listing each block twice in a row: found whole;
 *   quota:    "d" may hold 3 G2 slots: a fetch of 12 stops at the 4th (it
 *             never drops a block it brought for room): 3 found, G2 within
 *             the quota (before: the chain fetched again and again, forever);
 *   gone:     every master stopped while a fetch holds reserved slots (G2
 *             counts them used, no block yet); its client is killed; the
 *             masters go on: the fetch ends as any fetch, its N blocks
 *             cached, no slot left over, Check passes;
 *   reload:   the same, but a reload changes "d" under the fetch (a G2
 *             quota below what it reserved, remote off, a key, a TTL), or
 *             takes it out of the configuration: the fetch ends as any
 *             fetch, no slot left reserved, Check passes (also with the
 *             fetch in flight);
 *   stop:     the same, but the daemon is stopped (SIGTERM) under the
 *             fetch, whose reserved slots go back as the tiers stop (exit
 *             status 0; ASan's leak check in the sanitizer build). */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
#define N 12
#define BASE 4000
#define HDR 80                   /* struct slot_hdr */
#define SLOT (4096u + BB)        /* a G2 slot of pool p: 4 KiB header block, payload */

static struct kvt_rc rc;
static char tmp[64], conf_arg[200];

struct g4c {
	uint64_t hits, direct, checksum_failures, fetching;
};

static struct g4c g4c(const char *ns)
{
	Kvcached__Response *rs = kvt_g4_stats(ns);
	struct g4c c = { rs->stats->remote->hits, rs->stats->remote->direct,
			 rs->stats->remote->checksum_failures, rs->stats->remote->fetching };

	kvcached__response__free_unpacked(rs, NULL);
	return c;
}

/* A node writing to G4 as write says, its fetches waiting timeout for a
 * silent cluster, its drain drain long. */
static void node_start(struct kvt_daemon *d, const char *write, const char *timeout,
		       const char *drain)
{
	char w[64], t[64], dr[64];

	snprintf(w, sizeof(w), "--remote-write=%s", write);
	snprintf(t, sizeof(t), "--remote-timeout=%s", timeout);
	snprintf(dr, sizeof(dr), "--drain-timeout=%s", drain);
	kvt_start(d, conf_arg, w, t, dr, "--pool-size", "8MiB", "--segment-size", "1MiB",
		  "--page-size", "64KiB", "--host-tier-size", "8MiB", NULL);
	setenv("KVCACHED_SOCKET", d->sock, 1);
}

/* Node A: seals the chain of ns, demotes it (each block goes to G4 as it
 * lands in G2), waits for the writes, drops G2. */
static void write_chain(const char *ns)
{
	kvc_conn *c = kvt_connect(ns);
	int pool = kvt_pool(c, "p", BB);
	kvc_block b[N];
	kvc_hash h[N];
	Kvcached__Response *rs0 = kvt_g4_stats(ns);
	uint64_t want = rs0->stats->remote->writes + N;

	kvcached__response__free_unpacked(rs0, NULL);
	CHECK_EQ(kvc_alloc(c, pool, N, b), N);
	for (int i = 0; i < N; i++) {
		kvt_mem_fill(c, kvc_block_ptr(c, b[i]), BB, BASE + (uint64_t)i);
		h[i] = kvt_hash(BASE + (uint64_t)i);
	}
	CHECK_EQ(kvc_seal(c, pool, b, h, N, b), N);
	CHECK_EQ(kvc_release(c, b, N), 0);
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	CHECK_EQ(kvt_g4_settled(ns, want), want);
	kvt_evict(c, KVCACHED__TIER__TIER_G2);
	kvc_close(c);
}

/* The cluster key of block seed of "d" and a connection to its master. */
static redisContext *find_key(uint64_t seed, char *key, size_t len)
{
	kvc_hash h = kvt_hash(seed);
	char hex[2 * sizeof(h.b) + 1], pat[256];
	redisContext *x;

	for (size_t j = 0; j < sizeof(h.b); j++)
		snprintf(hex + 2 * j, 3, "%02x", h.b[j]);
	snprintf(pat, sizeof(pat), "kvc:d:*%s", hex);
	if (!(x = kvt_rc_find_key(&rc, pat, key, len))) {
		fprintf(stderr, "no key for block %llu\n", (unsigned long long)seed);
		exit(1);
	}
	return x;
}

/* The value of block seed (malloc'd, *len bytes) and its key. */
static uint8_t *value_get(uint64_t seed, size_t *len, char *key, size_t keylen)
{
	redisContext *x = find_key(seed, key, keylen);
	redisReply *r = redisCommand(x, "GET %s", key);
	uint8_t *v;

	CHECK(r && r->type == REDIS_REPLY_STRING && r->len == HDR + BB);
	CHECK((v = malloc(r->len)) != NULL);
	memcpy(v, r->str, r->len);
	*len = r->len;
	freeReplyObject(r);
	redisFree(x);
	return v;
}

/* Puts len bytes at v under key (NULL: deletes it), on the master that
 * takes it (the others answer MOVED). */
static void value_set(const char *key, const uint8_t *v, size_t len)
{
	for (int n = 0; n < rc.n; n++) {
		redisContext *x;
		redisReply *r;
		int done;

		if (!kvt_rc_is_master(&rc, n) || !(x = kvt_rc_connect(&rc, n)))
			continue;
		r = v ? redisCommand(x, "SET %s %b", key, v, len) : redisCommand(x, "DEL %s", key);
		CHECK(r != NULL);
		done = r->type == (v ? REDIS_REPLY_STATUS : REDIS_REPLY_INTEGER);
		freeReplyObject(r);
		redisFree(x);
		if (done)
			return;
	}
	fprintf(stderr, "no master took %s\n", key);
	exit(1);
}

/* After a lookup: G2 holds nothing (every block served went up to G1, and
 * no reserved slot was left behind), and Check passes. */
static void g2_empty(void)
{
	struct kvt_tier g2;

	kvt_tiers_settle();
	kvt_tier(1, &g2);
	if (g2.used || g2.blocks)
		fprintf(stderr, "G2: %llu bytes used, %llu blocks\n", (unsigned long long)g2.used,
			(unsigned long long)g2.blocks);
	CHECK_EQ(g2.used, 0);
	CHECK_EQ(g2.blocks, 0);
	CHECK_EQ(kvt_check(), 0);
}

/* A fresh node B: looks up the chain of ns, expects found blocks (bytes
 * checked), direct reads and checksum failures; G2 empty after. */
static void case_lookup(const char *name, const char *ns, int found, uint64_t direct,
			uint64_t bad_sum, long long oversize)
{
	struct kvt_daemon b;
	struct g4c c;
	int k;

	node_start(&b, "off", "10s", "30s");
	k = kvt_lookup_chain(ns, "p", BB, N, BASE);
	c = g4c(ns);
	fprintf(stderr, "%s: found %d of %d; G4 hits %llu, read into G2 slots %llu, checksum "
		"failures %llu, oversize %lld\n", name, k, N, (unsigned long long)c.hits,
		(unsigned long long)c.direct, (unsigned long long)c.checksum_failures,
		kvt_metric("kvcached_g4_oversize_total"));
	CHECK_EQ(k, found);
	CHECK_EQ(c.hits, (uint64_t)found);
	CHECK_EQ(c.direct, direct);
	CHECK_EQ(c.checksum_failures, bad_sum);
	CHECK_EQ(kvt_metric("kvcached_g4_oversize_total"), oversize);
	CHECK_EQ(kvt_metric("kvcached_g4_direct_total"), (long long)direct);
	g2_empty();
	/* Again: the blocks served are in G1 now, nothing more from G4. */
	CHECK_EQ(kvt_lookup_chain(ns, "p", BB, N, BASE), found);
	CHECK_EQ(kvt_check(), 0);
	kvt_stop(&b);
}

/* A lookup of the chain of "d" in a child, which may be cut off. */
static int child_lookup(void *arg)
{
	(void)arg;
	return kvt_lookup_chain("d", "p", BB, N, BASE) == N ? 0 : 1;
}

static void cluster_pause(int stop)
{
	for (int i = 0; i < rc.n; i++)
		kvt_rc_pause(&rc, i, stop);
	if (!stop)
		CHECK(kvt_rc_wait_healthy(&rc, 60000) == 0);
}

/* Waits until a fetch is being read with its slots reserved: fetching 1,
 * G2 bytes used and no block in G2. */
static void wait_reserved(void)
{
	for (int tries = 0;; tries++) {
		struct g4c c = g4c("d");
		struct kvt_tier g2;

		kvt_tier(1, &g2);
		if (c.fetching == 1 && g2.used == (uint64_t)N * SLOT && !g2.blocks)
			return;
		CHECK(tries < 60000);
		usleep(1000);
	}
}

static void case_gone(void)
{
	struct kvt_daemon b;
	struct kvt_tier g2;
	pid_t pid;

	node_start(&b, "off", "60s", "30s");
	cluster_pause(1);
	pid = kvt_spawn(child_lookup, NULL);
	wait_reserved();
	/* Check with the fetch in flight: its slots (FETCH), its hold on the
	 * pool. */
	CHECK_EQ(kvt_check(), 0);
	CHECK(kill(pid, SIGKILL) == 0);
	CHECK_EQ(kvt_wait(pid), 128 + SIGKILL);
	cluster_pause(0);
	kvt_wait_sessions(0);
	for (int tries = 0; g4c("d").fetching; tries++) {
		CHECK(tries < 60000);
		usleep(1000);
	}
	kvt_tiers_settle();
	kvt_tier(1, &g2);
	fprintf(stderr, "gone: after the fetch whose client went, G2 holds %llu blocks in %llu "
		"bytes; read into G2 slots %llu\n", (unsigned long long)g2.blocks,
		(unsigned long long)g2.used, (unsigned long long)g4c("d").direct);
	/* Its lookup ran again (the daemon learns that the client went when
	 * it answers): the blocks are cached in G1 or G2, and every G2 slot
	 * used holds one of them. */
	CHECK_EQ(g2.used, g2.blocks * SLOT);
	CHECK_EQ(g4c("d").direct, N);
	CHECK_EQ(kvt_check(), 0);
	/* Here now: nothing more from G4. */
	CHECK_EQ(kvt_lookup_chain("d", "p", BB, N, BASE), N);
	CHECK_EQ(g4c("d").hits, N);
	g2_empty();
	kvt_stop(&b);
}

static void case_stop(void)
{
	struct kvt_daemon b;
	pid_t pid;

	/* No drain (the parked lookup's client would hold it until the
	 * fetch ends), and a short timeout: the stop waits for the read
	 * thread, which the stopped cluster holds until then, and the
	 * fetch's done() runs as the tiers stop. */
	node_start(&b, "off", "2s", "0");
	cluster_pause(1);
	pid = kvt_spawn(child_lookup, NULL);
	wait_reserved();
	kvt_stop(&b);
	CHECK_EQ(kvt_wait(pid), 1);   /* cut off */
	cluster_pause(0);
	fprintf(stderr, "stop: the daemon stopped under a fetch holding reserved slots\n");
}

static void write_conf_as(int how);

/* A fresh node B whose "d" may hold 3 G2 slots (quota_g2): a fetch
 * reserves no more than that, the rest come through the client's buffers
 * and find room only by dropping "d"'s own idle copies. Whatever it finds,
 * every byte is right, the namespace never holds more than its quota in G2
 * and nothing is left reserved; a second lookup finds at least as many. */
static void case_quota(void)
{
	struct kvt_daemon b;
	struct kvt_tier g2;
	int k, k2;

	write_conf_as(4);
	node_start(&b, "off", "10s", "30s");
	k = kvt_lookup_chain("d", "p", BB, N, BASE);
	kvt_tiers_settle();
	kvt_tier(1, &g2);
	fprintf(stderr, "quota: found %d of %d under a G2 quota of 3 slots; G4 hits %llu, read into "
		"G2 slots %llu; G2 holds %llu bytes\n", k, N, (unsigned long long)g4c("d").hits,
		(unsigned long long)g4c("d").direct, (unsigned long long)g2.used);
	CHECK(g2.used <= 3 * SLOT);
	CHECK_EQ(g2.used, g2.blocks * SLOT);
	CHECK_EQ(kvt_check(), 0);
	k2 = kvt_lookup_chain("d", "p", BB, N, BASE);
	CHECK(k2 >= k);
	CHECK_EQ(kvt_check(), 0);
	kvt_stop(&b);
	write_conf_as(0);
}

/* A fresh node B: a chain that lists each block of "d" twice in a row (a
 * fetch asks for each key twice, reserves two slots for it and fills both;
 * one is indexed, the other goes back): found whole, every byte right, G2
 * empty after. */
static void case_twice(void)
{
	struct kvt_daemon b;
	kvc_conn *c;
	kvc_hash h[2 * N];
	kvc_block blk[2 * N];
	int pool, k;

	node_start(&b, "off", "10s", "30s");
	c = kvt_connect("d");
	pool = kvt_pool(c, "p", BB);
	for (int i = 0; i < 2 * N; i++)
		h[i] = kvt_hash(BASE + (uint64_t)(i / 2));
	k = kvc_lookup(c, pool, h, 2 * N, blk);
	fprintf(stderr, "twice: found %d of %d; G4 hits %llu, read into G2 slots %llu\n", k,
		2 * N, (unsigned long long)g4c("d").hits, (unsigned long long)g4c("d").direct);
	CHECK_EQ(k, 2 * N);
	for (int i = 0; i < k; i++)
		CHECK(kvt_mem_verify(c, kvc_block_ptr(c, blk[i]), BB, BASE + (uint64_t)(i / 2)));
	CHECK_EQ(kvc_release(c, blk, (size_t)k), 0);
	kvc_close(c);
	g2_empty();
	kvt_stop(&b);
}

/* Reloads the configuration written as how says, and waits until it is
 * applied (kvcached_reloads_total; none refused). */
static void reload_as(struct kvt_daemon *d, int how)
{
	long long n = kvt_metric("kvcached_reloads_total");

	write_conf_as(how);
	CHECK(kill(d->pid, SIGHUP) == 0);
	for (int tries = 0; kvt_metric("kvcached_reloads_total") == n; tries++) {
		CHECK(tries < 60000);
		usleep(1000);
	}
	CHECK_EQ(kvt_metric("kvcached_reload_failures_total"), 0);
}

/* A reload under a fetch that holds reserved slots. how 1: "d" changes
 * under it (a G2 quota below what the fetch reserved, remote off, its
 * values to carry a tag, a TTL); how 2: "d" goes from the configuration
 * (undeclared now; the client, root, keeps its session: a session closed
 * by a reload is case gone's). The masters go on: the fetch ends as any fetch,
 * no slot is left reserved, Check passes, and the daemon serves. */
static void case_reload(int how)
{
	struct kvt_daemon b;
	struct kvt_tier g2;
	pid_t pid;
	int rc_child;

	node_start(&b, "off", "60s", "30s");
	cluster_pause(1);
	pid = kvt_spawn(child_lookup, NULL);
	wait_reserved();
	reload_as(&b, how);
	CHECK_EQ(kvt_check(), 0);
	cluster_pause(0);
	rc_child = kvt_wait(pid);
	for (int tries = 0; g4c("k").fetching; tries++) {
		CHECK(tries < 60000);
		usleep(1000);
	}
	kvt_tiers_settle();
	kvt_tier(1, &g2);
	fprintf(stderr, "reload %d: the client's lookup exited %d; G2 holds %llu blocks in %llu "
		"bytes\n", how, rc_child, (unsigned long long)g2.blocks,
		(unsigned long long)g2.used);
	CHECK_EQ(rc_child, 0);
	CHECK_EQ(g2.used, g2.blocks * SLOT);
	CHECK_EQ(kvt_check(), 0);
	reload_as(&b, 0);
	CHECK_EQ(kvt_lookup_chain("d", "p", BB, N, BASE), N);
	CHECK_EQ(kvt_check(), 0);
	kvt_stop(&b);
}

static void write_conf(void)
{
	write_conf_as(0);
}

static void write_conf_as(int how)
{
	char path[160], keyf[160];
	unsigned uid = (unsigned)getuid();
	FILE *f;

	snprintf(keyf, sizeof(keyf), "%s/k.g4key", tmp);
	CHECK((f = fopen(keyf, "w")) != NULL);
	fprintf(f, "%s\n", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
	fclose(f);
	CHECK(chmod(keyf, 0600) == 0);
	snprintf(path, sizeof(path), "%s/kvcached.conf.tmp", tmp);
	CHECK((f = fopen(path, "w")) != NULL);
	fprintf(f, "remote_seeds = %s\nremote_auth = off\nremote_fetch_timeout = 30s\n\n",
		kvt_rc_seeds(&rc));
	if (how == 0)
		fprintf(f, "[namespace d]\nusers = %u\nremote = yes\n\n", uid);
	else if (how == 4)
		fprintf(f, "[namespace d]\nusers = %u\nremote = yes\nquota_g2 = %u\n\n", uid,
			3 * SLOT);
	else if (how == 1)
		fprintf(f, "[namespace d]\nusers = %u\nremote = no\nquota_g2 = 64KiB\nttl = 1h\n"
			"remote_key_file = %s\n\n", uid, keyf);
	fprintf(f, "[namespace k]\nusers = %u\nremote = yes\nremote_key_file = %s\n", uid, keyf);
	fclose(f);
	{
		char to[160];

		snprintf(to, sizeof(to), "%s/kvcached.conf", tmp);
		CHECK(rename(path, to) == 0);
		snprintf(path, sizeof(path), "%s", to);
	}
	snprintf(conf_arg, sizeof(conf_arg), "--config=%s", path);
}

int main(void)
{
	struct kvt_daemon a;
	uint8_t *v3, *v5, *v7, *w;
	size_t l3, l5, l7;
	char k3[256], k5[256], k7[256];

	snprintf(tmp, sizeof(tmp), "/tmp/kvt-g4d.XXXXXX");
	CHECK(mkdtemp(tmp) != NULL);
	{
		/* Long: a stopped cluster must not fail its masters. */
		struct kvt_rc_opts o = { .node_timeout_ms = 15000 };

		kvt_rc_start(&rc, 3, 0, &o);
	}
	write_conf();
	node_start(&a, "demote", "10s", "30s");
	write_chain("d");
	write_chain("k");
	kvt_stop(&a);

	case_lookup("hits", "d", N, N, 0, 0);
	case_lookup("keyed", "k", N, N, 0, 0);

	v3 = value_get(BASE + 3, &l3, k3, sizeof(k3));
	v5 = value_get(BASE + 5, &l5, k5, sizeof(k5));
	v7 = value_get(BASE + 7, &l7, k7, sizeof(k7));
	CHECK((w = malloc(l3 + 1)) != NULL);

	value_set(k5, NULL, 0);
	case_lookup("miss", "d", 5, 5, 0, 0);
	value_set(k5, v5, l5);

	value_set(k3, v3, HDR + BB / 2);
	case_lookup("short", "d", 3, 3, 1, 0);

	memcpy(w, v3, l3);
	w[l3] = 'x';
	value_set(k3, w, l3 + 1);
	case_lookup("long", "d", 3, 3, 0, 1);

	value_set(k3, v7, l7);
	case_lookup("header", "d", 3, 3, 1, 0);

	memcpy(w, v3, l3);
	w[HDR + 100] ^= 0x5a;
	value_set(k3, w, l3);
	case_lookup("payload", "d", 3, 3, 1, 0);

	value_set(k3, v3, l3);
	case_lookup("hits again", "d", N, N, 0, 0);

	case_twice();
	case_quota();
	case_gone();
	case_reload(1);
	case_reload(2);
	case_stop();

	free(v3);
	free(v5);
	free(v7);
	free(w);
	kvt_rc_stop(&rc);
	{
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp);
		CHECK(system(cmd) == 0);
	}
	fprintf(stderr, "ok\n");
	return 0;
}
#endif
