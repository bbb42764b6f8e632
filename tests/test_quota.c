/* Namespace limits with a real daemon and real worker processes, each case on
 * a daemon of its own configured with [namespace NAME] sections:
 *   - quota_g1: an allocation past it evicts the namespace's own cached
 *     blocks, then fails with KV_EQUOTA and the numbers; others unaffected;
 *   - an allocation that cannot succeed (every segment held by another
 *     namespace) fails with KV_ENOSPC saying so, and evicts nothing;
 *   - priority: a lower-priority namespace's cache goes first, even when
 *     it is newer;
 *   - fairness: tenant A (another process) floods allocations and lookups
 *     while tenant B runs a prefix workload within its reserve_g1: B's
 *     prefix survives and B never gets KV_ENOSPC;
 *   - ttl: a prefix past its namespace's TTL misses, and can be sealed anew;
 *   - quota_g2 and quota_g3: swap-outs past the G2 quota fail with KV_EQUOTA;
 *     demotion and write-back never take a namespace past either quota.
 * After each: kvctl check clean (it verifies every namespace's usage).
 * Host backend only: the sizes are below the cuda backend's 2 MiB minimum. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/select.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static char dir[64], conf[128];

/* Starts d with the [namespace] sections in text and a 64 KiB page, plus up
 * to 12 extra arguments (NULL-terminated). */
static void start(struct kvt_daemon *d, const char *text, ...)
{
	const char *a[13] = { NULL };
	FILE *f = fopen(conf, "w");
	char arg[160];
	va_list ap;
	int n = 0;

	CHECK(f != NULL);
	fputs(text, f);
	CHECK(fclose(f) == 0);
	va_start(ap, text);
	while (n < 12 && (a[n] = va_arg(ap, const char *)))
		n++;
	va_end(ap);
	snprintf(arg, sizeof(arg), "--config=%s", conf);
	kvt_start(d, arg, "--log-level", getenv("KVT_DEBUG") ? "debug" : "info", "--page-size",
		  "64KiB", a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11],
		  NULL);
}

static void put_chain(kvc_conn *c, int pool, const kvc_hash *h, int n, uint64_t seed)
{
	kvc_block b[64];
	int i;

	CHECK(n <= 64);
	CHECK_EQ(kvc_alloc(c, pool, (uint32_t)n, b), n);
	for (i = 0; i < n; i++)
		kvt_mem_fill(c, kvc_block_ptr(c, b[i]), 4096, seed + (uint64_t)i);
	CHECK_EQ(kvc_seal(c, pool, b, h, (size_t)n, b), n);
	CHECK_EQ(kvc_release(c, b, (size_t)n), 0);
}

/* How many of chain h's n blocks hit (released again). */
static int hits(kvc_conn *c, int pool, const kvc_hash *h, int n)
{
	kvc_block b[64];
	int k = kvc_lookup(c, pool, h, (size_t)n, b);

	CHECK(k >= 0);
	CHECK_EQ(kvc_release(c, b, (size_t)k), 0);
	return k;
}

static void hashes(kvc_hash *h, int n, uint64_t base)
{
	for (int i = 0; i < n; i++)
		h[i] = kvt_hash(base + (uint64_t)i);
}

static void test_quota_g1(void)
{
	struct kvt_daemon d;
	kvc_conn *a, *b;
	kvc_block x[20];
	kvc_hash h[4];
	int pa, pb;

	/* 1 MiB pool of 16 pages; 16 KiB blocks: the quota is 8 of them. */
	start(&d, "[namespace qa]\nquota_g1 = 128KiB\n", "--pool-size", "1MiB", NULL);
	a = kvt_connect("qa");
	b = kvt_connect("qb");
	pa = kvt_pool(a, "p", 16384);
	pb = kvt_pool(b, "p", 16384);
	CHECK_EQ(kvc_alloc(a, pa, 8, x), 8);
	CHECK_EQ(kvc_alloc(a, pa, 1, x + 8), KVC_EQUOTA);
	fprintf(stderr, "EQUOTA says: %s\n", kvc_last_error(a));
	CHECK(strstr(kvc_last_error(a), "namespace 'qa' is at its G1 quota") != NULL);
	CHECK(strstr(kvc_last_error(a), "131072 of 131072 bytes") != NULL);
	/* Another namespace is not held to it. */
	CHECK_EQ(kvc_alloc(b, pb, 12, x + 8), 12);
	CHECK_EQ(kvc_release(b, x + 8, 12), 0);
	/* Cached blocks of its own make room: 4 sealed and released, 4 freed;
	 * 6 more evict the chain's 2 oldest (its tail). */
	hashes(h, 4, 100);
	CHECK_EQ(kvc_seal(a, pa, x, h, 4, x), 4);
	CHECK_EQ(kvc_release(a, x, 8), 0);
	CHECK_EQ(kvc_alloc(a, pa, 6, x), 6);
	CHECK_EQ(hits(a, pa, h, 4), 2);
	/* What it holds fills the quota: nothing to evict, EQUOTA. */
	CHECK_EQ(kvc_alloc(a, pa, 2, x + 6), 2);
	CHECK_EQ(kvc_alloc(a, pa, 1, x + 8), KVC_EQUOTA);
	CHECK_EQ(kvc_release(a, x, 8), 0);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(a);
	kvc_close(b);
	kvt_stop(&d);
}

static void test_doomed(void)
{
	struct kvt_daemon d;
	kvc_conn *a, *b;
	kvc_block x[4], y;
	kvc_hash h[3];
	int pa, pb;

	/* One segment: whoever holds a block in it owns the device. */
	start(&d, "", "--pool-size", "1MiB", "--segment-size", "1MiB", NULL);
	a = kvt_connect("tenant-a");
	b = kvt_connect("tenant-b");
	pa = kvt_pool(a, "p", 16384);
	pb = kvt_pool(b, "p", 16384);
	hashes(h, 3, 200);
	put_chain(a, pa, h, 3, 1);
	CHECK_EQ(kvc_alloc(a, pa, 1, x), 1);   /* held: the segment stays tenant-a's */
	CHECK_EQ(kvc_alloc(b, pb, 1, &y), KVC_ENOSPC);
	fprintf(stderr, "ENOSPC says: %s\n", kvc_last_error(b));
	CHECK(strstr(kvc_last_error(b), "1 other namespaces' with blocks in use") != NULL);
	CHECK(strstr(kvc_last_error(b), "a segment holds one namespace at a time") != NULL);
	/* Nothing of tenant-a's was evicted for it. */
	CHECK_EQ(hits(a, pa, h, 3), 3);
	/* Once tenant-a holds nothing but cache, its blocks go for tenant-b. */
	CHECK_EQ(kvc_release(a, x, 1), 0);
	CHECK_EQ(kvc_alloc(b, pb, 1, &y), 1);
	CHECK_EQ(hits(a, pa, h, 3), 0);
	CHECK_EQ(kvc_release(b, &y, 1), 0);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(a);
	kvc_close(b);
	kvt_stop(&d);
}

static void test_priority(void)
{
	struct kvt_daemon d;
	kvc_conn *hi, *lo, *x;
	kvc_block b[12];
	kvc_hash hh[4], hl[4];
	int phi, plo, px;

	/* 16 segments of one 64 KiB block each. */
	start(&d, "[namespace hi]\npriority = 10\n[namespace lo]\npriority = 0\n"
		  "[namespace x]\npriority = 5\n",
	      "--pool-size", "1MiB", "--segment-size", "64KiB", NULL);
	hi = kvt_connect("hi");
	lo = kvt_connect("lo");
	x = kvt_connect("x");
	phi = kvt_pool(hi, "p", 65536);
	plo = kvt_pool(lo, "p", 65536);
	px = kvt_pool(x, "p", 65536);
	hashes(hh, 4, 300);
	hashes(hl, 4, 400);
	put_chain(hi, phi, hh, 4, 1);   /* older */
	put_chain(lo, plo, hl, 4, 2);   /* newer, but lower priority */
	CHECK_EQ(kvc_alloc(x, px, 12, b), 12);   /* 8 free + 4 evicted */
	CHECK_EQ(hits(lo, plo, hl, 4), 0);
	CHECK_EQ(hits(hi, phi, hh, 4), 4);
	CHECK_EQ(kvc_release(x, b, 12), 0);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(hi);
	kvc_close(lo);
	kvc_close(x);
	kvt_stop(&d);
}

#define FAIR_ROUNDS 300

/* Tenant A: takes every block it can, seals and looks up some, lets go,
 * again, until the pipe from the parent closes. Fails on any error but
 * ENOSPC. */
static int flood(void *arg)
{
	int *pfd = arg, stop_fd = pfd[0];
	kvc_conn *c;
	int pool, round;
	static kvc_block held[512];
	kvc_hash h[4];

	close(pfd[1]);   /* the parent's end: its close is the signal to stop */
	c = kvt_connect("A");
	pool = kvt_pool(c, "p", 32768);
	for (round = 0;; round++) {
		struct timespec no_wait = { 0, 0 };
		fd_set rd;
		int n = 0, r;

		FD_ZERO(&rd);
		FD_SET(stop_fd, &rd);
		if (pselect(stop_fd + 1, &rd, NULL, NULL, &no_wait, NULL) > 0)
			break;
		while (n + 4 <= 512 && (r = kvc_alloc(c, pool, 4, held + n)) == 4)
			n += 4;
		if (n + 4 <= 512 && r != KVC_ENOSPC) {
			fprintf(stderr, "tenant A: alloc: %s\n", kvc_last_error(c));
			return 1;
		}
		hashes(h, 4, 10000 + (uint64_t)(round % 8) * 4);
		if (n >= 4 && kvc_seal(c, pool, held, h, 4, held) != 4)
			return 1;
		if (kvc_release(c, held, (size_t)n) < 0)
			return 1;
		hits(c, pool, h, 4);
	}
	kvc_close(c);
	return 0;
}

static void test_fairness(void)
{
	struct kvt_daemon d;
	kvc_conn *b;
	kvc_block x[8];
	kvc_hash h[8];
	int pool, round, pfd[2];
	pid_t a;

	/* 2 MiB in 16 segments of 2 pages; 32 KiB blocks. B's reserve is 16
	 * blocks (4 segments); it holds a chain of 8 and allocates 4 at a time. */
	start(&d, "[namespace B]\nreserve_g1 = 512KiB\n", "--pool-size", "2MiB", "--segment-size",
	      "128KiB", NULL);
	b = kvt_connect("B");
	pool = kvt_pool(b, "p", 32768);
	hashes(h, 8, 500);
	put_chain(b, pool, h, 8, 77);
	CHECK(pipe(pfd) == 0);
	a = kvt_spawn(flood, pfd);
	close(pfd[0]);
	for (round = 0; round < FAIR_ROUNDS; round++) {
		int k = kvc_lookup(b, pool, h, 8, x), r;

		CHECK_EQ(k, 8);
		for (int i = 0; i < 8; i++)
			CHECK(kvt_mem_verify(b, kvc_block_ptr(b, x[i]), 4096, 77 + (uint64_t)i));
		CHECK_EQ(kvc_release(b, x, 8), 0);
		r = kvc_alloc(b, pool, 4, x);
		if (r != 4)
			fprintf(stderr, "round %d: tenant B: %s\n", round, kvc_last_error(b));
		CHECK_EQ(r, 4);
		CHECK_EQ(kvc_release(b, x, 4), 0);
	}
	close(pfd[1]);
	CHECK_EQ(kvt_wait(a), 0);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(b);
	kvt_stop(&d);
}

static void test_ttl(void)
{
	struct kvt_daemon d;
	kvc_conn *c;
	kvc_hash h[4];
	int pool, k;
	struct timespec poll = { 0, 20 * 1000 * 1000 };
	time_t deadline;

	start(&d, "[namespace t]\nttl = 1s\n", "--pool-size", "1MiB", NULL);
	c = kvt_connect("t");
	pool = kvt_pool(c, "p", 16384);
	hashes(h, 4, 600);
	put_chain(c, pool, h, 4, 5);
	/* Wait for the TTL to pass: the chain then misses. */
	deadline = time(NULL) + 60;
	while ((k = hits(c, pool, h, 4)) > 0) {
		CHECK(time(NULL) < deadline);
		nanosleep(&poll, NULL);
	}
	CHECK_EQ(k, 0);
	/* Sealed anew, it is served again. */
	put_chain(c, pool, h, 4, 9);
	CHECK_EQ(hits(c, pool, h, 4), 4);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_stop(&d);
}

static void test_quota_tiers(void)
{
	struct kvt_daemon d;
	kvc_conn *c;
	kvc_block x[24];
	kvc_hash h[4];
	uint64_t sw, sw2, used[3], quota[3];
	int pool, i;
	char disk[128];

	/* G2 quota 16 blocks of 16 KiB (a slot is the block and a 4 KiB
	 * header: 20 KiB); write-back starts when less than 95% of the host
	 * tier is clean or free (3 dirty slots of 51); G3 quota 8 slots. So
	 * write-back wants more of the namespace on disk than its quota holds:
	 * the quota once made room by dropping G3 copies that G2 still held,
	 * each dirty again, and write-back and quota undid each other for ever
	 * (1.28 M writes in 25 s, the tiers never idle; with write-back at 75%
	 * it showed only on a busy machine). */
	snprintf(disk, sizeof(disk), "%s/disk", dir);
	start(&d, "[namespace g]\nquota_g2 = 320KiB\nquota_g3 = 160KiB\n", "--pool-size", "1MiB",
	      "--host-tier-size", "1MiB", "--disk-path", disk, "--disk-size", "1MiB",
	      "--writeback-low", "95", "--writeback-high", "99", NULL);
	c = kvt_connect("g");
	pool = kvt_pool(c, "p", 16384);
	CHECK_EQ(kvc_alloc(c, pool, 24, x), 24);
	CHECK_EQ(kvc_swap_out(c, x, 16, &sw), 0);
	CHECK_EQ(kvc_swap_out(c, x + 16, 8, &sw2), KVC_EQUOTA);
	fprintf(stderr, "swap EQUOTA says: %s\n", kvc_last_error(c));
	CHECK(strstr(kvc_last_error(c), "G2 quota") != NULL);
	CHECK_EQ(kvc_swap_in(c, sw, x, 16), 16);
	CHECK_EQ(kvc_release(c, x, 24), 0);
	/* Demotion and write-back of 40 chains: within both quotas at every
	 * check, and consistent. */
	for (i = 0; i < 40; i++) {
		hashes(h, 4, 700 + (uint64_t)i * 4);
		put_chain(c, pool, h, 4, (uint64_t)i);
		kvt_ns_usage("g", used, quota);
		CHECK(used[1] <= quota[1] && used[2] <= quota[2]);
	}
	kvt_tiers_settle();
	kvt_ns_usage("g", used, quota);
	fprintf(stderr, "namespace g holds G1 %llu, G2 %llu of %llu, G3 %llu of %llu bytes\n",
		(unsigned long long)used[0], (unsigned long long)used[1],
		(unsigned long long)quota[1], (unsigned long long)used[2],
		(unsigned long long)quota[2]);
	CHECK(used[1] <= quota[1] && used[2] <= quota[2]);
	CHECK(used[2] > 0);   /* write-back ran, within the G3 quota */
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_stop(&d);
}

int main(void)
{
	if (kvt_cuda())
		return 77;
	snprintf(dir, sizeof(dir), "/tmp/kvt-quota-XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	snprintf(conf, sizeof(conf), "%s/kvcached.conf", dir);
	test_quota_g1();
	test_doomed();
	test_priority();
	test_fairness();
	test_ttl();
	test_quota_tiers();
	unlink(conf);
	{
		char disk[128];

		snprintf(disk, sizeof(disk), "%s/disk", dir);
		unlink(disk);
	}
	rmdir(dir);
	return 0;
}
