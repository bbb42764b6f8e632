/* A lookup asks the slot beside the last block it found before the index
 * (kv_block_beside(), cache.c's slots_beside()): a chain sealed from one
 * allocation lies in consecutive slots, ascending or descending. This tries
 * to make that shortcut answer what the index would not, each chain both
 * ways where the way matters:
 *  1. the next slot sealed under another hash, the chain's hash on a block
 *     elsewhere: the lookup returns the block elsewhere;
 *  2. the next slot's block evicted and allocated again (its entry's hash
 *     bytes still those of the chain, no longer in the index): the lookup
 *     stops before it, and never returns the new WRITABLE block;
 *  3. a chain across the ends of runs: every block found, each the one its
 *     hash was sealed on (under ASan, a read past a run's last block is
 *     reported: pool.c poisons the rest of a run's memory);
 *  4. the same hashes sealed in another pool, in the same namespace: each
 *     pool's lookup returns its own blocks;
 *  5. the next slot's block past its namespace's TTL: the lookup stops
 *     before it, as a probe of the index does.
 * Every block's bytes are checked against what was written under its hash:
 * no wrong KV. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define BB 16384

static unsigned slot_of(kvc_block b)
{
	return (unsigned)(b & 0xfff);
}

static unsigned run_of(kvc_block b)
{
	return (unsigned)((b >> 12) & 0xfffff);
}

/* b[1] is in the slot after b[0]'s. */
static int adjacent(kvc_block a, kvc_block b)
{
	return run_of(a) == run_of(b) && slot_of(b) == slot_of(a) + 1;
}

/* b[0..n) as an allocation gave them (ascending), reversed for desc. */
static void order(kvc_block *b, int n, int desc)
{
	for (int i = 0; desc && i < n / 2; i++) {
		kvc_block t = b[i];

		b[i] = b[n - 1 - i];
		b[n - 1 - i] = t;
	}
}

/* The same, checked to be consecutive slots of one run. */
static void chain_order(kvc_block *b, int n, int desc)
{
	order(b, n, desc);
	for (int i = 1; i < n; i++)
		CHECK(desc ? adjacent(b[i], b[i - 1]) : adjacent(b[i - 1], b[i]));
}

static void fill(kvc_conn *c, const kvc_block *b, int n, uint64_t seed)
{
	for (int i = 0; i < n; i++)
		kvt_mem_fill(c, kvc_block_ptr(c, b[i]), BB, seed + (uint64_t)i);
}

/* The chains below are longer than the lookup's first batch of index
 * probes (LOOKUP_STEP, 32: cache.c), and the slot each test sets a trap in
 * comes after it, where the lookup asks the next slot first. */
#define N 40
#define T 35

/* 1: N consecutive blocks, the one at T sealed under another hash, and the
 * chain's hash T on a block elsewhere: the lookup returns that one. */
static void other_hash_next(kvc_conn *c, int pool, int desc)
{
	kvc_block b[N + 1], sealed[N + 1], got[N];
	kvc_hash h[N + 1], chain[N];

	for (int i = 0; i < N; i++)
		h[i] = chain[i] = kvt_hash(100 + 1000 * (uint64_t)desc + (uint64_t)i);
	h[T] = kvt_hash(199 + 1000 * (uint64_t)desc);   /* the slot beside T - 1 */
	h[N] = chain[T];                                /* where the chain's T is */
	CHECK_EQ(kvc_alloc(c, pool, N + 1, b), N + 1);
	chain_order(b, N, desc);   /* the shortcut's case */
	fill(c, b, N + 1, 1000);
	CHECK_EQ(kvc_seal(c, pool, b, h, N + 1, sealed), N + 1);
	for (int i = 0; i <= N; i++)
		CHECK(sealed[i] == b[i]);
	CHECK_EQ(kvc_lookup(c, pool, chain, N, got), N);
	for (int i = 0; i < N; i++) {
		CHECK(got[i] == (i == T ? b[N] : b[i]));
		CHECK(kvt_mem_verify(c, kvc_block_ptr(c, got[i]), BB,
				     1000 + (uint64_t)(i == T ? N : i)));
	}
	CHECK_EQ(kvc_release(c, got, N), 0);
	/* The slot's own hash comes through it. */
	chain[T] = h[T];
	CHECK_EQ(kvc_lookup(c, pool, chain, N, got), N);
	for (int i = 0; i < N; i++)
		CHECK(got[i] == b[i]);
	CHECK_EQ(kvc_release(c, got, N), 0);
	CHECK_EQ(kvc_release(c, b, N + 1), 0);
}

/* 2: N consecutive blocks sealed as a chain and released, the one at T
 * first (the oldest); the pool then filled with held blocks until one more
 * allocation evicts it and takes its slot, whose entry still holds the
 * chain's hash T (out of the index). The lookup stops at T, and never
 * returns the new WRITABLE block. */
static void evicted_next(kvc_conn *c, int pool)
{
	kvc_block b[N], got[N], x;
	kvc_hash h[N];
	kvc_block *held = NULL;
	uint64_t fr, wr, se, ca;
	size_t nheld = 0, cap = 0;

	for (int i = 0; i < N; i++)
		h[i] = kvt_hash(200 + (uint64_t)i);
	CHECK_EQ(kvc_alloc(c, pool, N, b), N);
	for (int i = 1; i < N; i++)
		CHECK(adjacent(b[i - 1], b[i]));
	fill(c, b, N, 2000);
	CHECK_EQ(kvc_seal(c, pool, b, h, N, b), N);
	CHECK_EQ(kvc_release(c, &b[T], 1), 0);
	CHECK_EQ(kvc_release(c, b, T), 0);
	CHECK_EQ(kvc_release(c, b + T + 1, N - T - 1), 0);
	kvt_pool_counts(pool, &fr, &wr, &se, &ca);
	CHECK_EQ(ca, N);
	/* One block at a time until the pool evicts: its oldest, T. */
	for (;;) {
		CHECK_EQ(kvc_alloc(c, pool, 1, &x), 1);
		if (nheld == cap) {
			cap = cap ? 2 * cap : 256;
			CHECK((held = realloc(held, cap * sizeof(*held))) != NULL);
		}
		held[nheld++] = x;
		kvt_pool_counts(pool, &fr, &wr, &se, &ca);
		if (ca < N)
			break;
	}
	CHECK_EQ(ca, N - 1);
	/* The block just allocated took T's slot: the shortcut's trap. */
	CHECK(run_of(x) == run_of(b[T]) && slot_of(x) == slot_of(b[T]));
	kvt_mem_fill(c, kvc_block_ptr(c, x), BB, 2999);
	CHECK_EQ(kvc_lookup(c, pool, h, N, got), T);
	for (int i = 0; i < T; i++) {
		CHECK(got[i] == b[i]);
		CHECK(kvt_mem_verify(c, kvc_block_ptr(c, got[i]), BB, 2000 + (uint64_t)i));
	}
	CHECK_EQ(kvc_release(c, got, T), 0);
	/* Sealed again under T's hash, the slot is the chain's again. */
	CHECK_EQ(kvc_seal(c, pool, &x, &h[T], 1, &x), 1);
	held[nheld - 1] = x;
	CHECK_EQ(kvc_lookup(c, pool, h, N, got), N);
	for (int i = 0; i < N; i++) {
		CHECK(got[i] == (i == T ? x : b[i]));
		CHECK(kvt_mem_verify(c, kvc_block_ptr(c, got[i]), BB,
				     i == T ? 2999 : 2000 + (uint64_t)i));
	}
	CHECK_EQ(kvc_release(c, got, N), 0);
	CHECK_EQ(kvc_release(c, held, nheld), 0);
	free(held);
}

/* 3: a chain of n blocks from one allocation that crosses a run's end. */
static void across_runs(kvc_conn *c, int pool, int n, int desc)
{
	kvc_block *b = calloc((size_t)n, sizeof(*b)), *got = calloc((size_t)n, sizeof(*got));
	kvc_hash *h = calloc((size_t)n, sizeof(*h));
	int ends = 0;

	CHECK(b && got && h);
	for (int i = 0; i < n; i++)
		h[i] = kvt_hash(300000 + 1000 * (uint64_t)desc + (uint64_t)i);
	CHECK_EQ(kvc_alloc(c, pool, (size_t)n, b), n);
	order(b, n, desc);
	/* A run ends after the lookup's first batch of probes. */
	for (int i = 32; i < n; i++)
		ends += run_of(b[i]) != run_of(b[i - 1]);
	CHECK(ends > 0);
	fill(c, b, n, 3000);
	CHECK_EQ(kvc_seal(c, pool, b, h, (size_t)n, b), n);
	CHECK_EQ(kvc_release(c, b, (size_t)n), 0);
	CHECK_EQ(kvc_lookup(c, pool, h, (size_t)n, got), n);
	for (int i = 0; i < n; i++) {
		CHECK(got[i] == b[i]);
		CHECK(kvt_mem_verify(c, kvc_block_ptr(c, got[i]), BB, 3000 + (uint64_t)i));
	}
	CHECK_EQ(kvc_release(c, got, (size_t)n), 0);
	free(b);
	free(got);
	free(h);
}

/* 4: the same hashes sealed in pools p and q of one namespace. */
static void two_pools(kvc_conn *c, int p, int q)
{
	kvc_block a[N], b[N], got[N];
	kvc_hash h[N];

	for (int i = 0; i < N; i++)
		h[i] = kvt_hash(400 + (uint64_t)i);
	CHECK_EQ(kvc_alloc(c, p, N, a), N);
	CHECK_EQ(kvc_alloc(c, q, N, b), N);
	fill(c, a, N, 4000);
	fill(c, b, N, 5000);
	CHECK_EQ(kvc_seal(c, p, a, h, N, a), N);
	CHECK_EQ(kvc_seal(c, q, b, h, N, b), N);
	CHECK_EQ(kvc_lookup(c, q, h, N, got), N);
	for (int i = 0; i < N; i++) {
		CHECK(got[i] == b[i]);
		CHECK(kvt_mem_verify(c, kvc_block_ptr(c, got[i]), BB, 5000 + (uint64_t)i));
	}
	CHECK_EQ(kvc_release(c, got, N), 0);
	CHECK_EQ(kvc_lookup(c, p, h, N, got), N);
	for (int i = 0; i < N; i++)
		CHECK(got[i] == a[i]);
	CHECK_EQ(kvc_release(c, got, N), 0);
	CHECK_EQ(kvc_release(c, a, N), 0);
	CHECK_EQ(kvc_release(c, b, N), 0);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* 5: N consecutive blocks of a namespace with a TTL of ttl_ms; those from T
 * on sealed (and released) first, those before T once the first are past
 * the TTL: the lookup finds T blocks. Again with fresh hashes when the
 * lookup came so late that the young blocks had passed it too. */
static void expired_next(kvc_conn *c, int pool, uint64_t ttl_ms)
{
	for (int tries = 0;; tries++) {
		kvc_block b[N], got[N];
		kvc_hash h[N];
		uint64_t t0, t1, t2;
		int k;

		CHECK(tries < 5);
		for (int i = 0; i < N; i++)
			h[i] = kvt_hash(600000 + 1000 * (uint64_t)tries + (uint64_t)i);
		CHECK_EQ(kvc_alloc(c, pool, N, b), N);
		for (int i = 1; i < N; i++)
			CHECK(adjacent(b[i - 1], b[i]));
		fill(c, b, N, 6000);
		CHECK_EQ(kvc_seal(c, pool, b + T, h + T, N - T, b + T), N - T);
		CHECK_EQ(kvc_release(c, b + T, N - T), 0);
		/* Waits for the clock, not for the daemon: its TTL is time. */
		for (t0 = now_ms(); now_ms() - t0 <= ttl_ms + 20;)
			usleep(10000);
		t1 = now_ms();
		CHECK_EQ(kvc_seal(c, pool, b, h, T, b), T);
		CHECK_EQ(kvc_release(c, b, T), 0);
		k = kvc_lookup(c, pool, h, N, got);
		t2 = now_ms();
		CHECK(k >= 0);
		CHECK_EQ(kvc_release(c, got, (size_t)k), 0);
		if (t2 - t1 + 20 >= ttl_ms) {
			fprintf(stderr, "expired_next: the lookup came %llu ms after the seal "
				"(TTL %llu ms): again\n", (unsigned long long)(t2 - t1),
				(unsigned long long)ttl_ms);
			continue;
		}
		CHECK_EQ(k, T);
		for (int i = 0; i < T; i++)
			CHECK(got[i] == b[i]);
		return;
	}
}

int main(void)
{
	struct kvt_daemon d;
	kvc_conn *c;
	int pool, other;

	/* 3 checks that its chain crosses a run's end (2 MiB pages: a run of
	 * 16 KiB blocks is 128 of them or a multiple). */
	kvt_start(&d, "--pool-size", "16MiB", "--segment-size", "4MiB", NULL);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BB);
	other = kvt_pool(c, "q", BB);
	other_hash_next(c, pool, 0);
	other_hash_next(c, pool, 1);
	two_pools(c, pool, other);
	across_runs(c, pool, 300, 0);
	across_runs(c, pool, 300, 1);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_wait_sessions(0);
	kvt_stop(&d);
	/* 5 in a namespace with a TTL, on a daemon of its own. */
	{
		char dir[] = "/tmp/kvt-slots.XXXXXX", conf[64], arg[80];
		FILE *f;

		CHECK(mkdtemp(dir) != NULL);
		snprintf(conf, sizeof(conf), "%s/kvcached.conf", dir);
		CHECK((f = fopen(conf, "w")) != NULL);
		fputs("[namespace tt]\nttl = 1s\n", f);
		CHECK(fclose(f) == 0);
		snprintf(arg, sizeof(arg), "--config=%s", conf);
		kvt_start(&d, arg, "--pool-size", "16MiB", "--segment-size", "4MiB", NULL);
		c = kvt_connect("tt");
		expired_next(c, kvt_pool(c, "p", BB), 1000);
		CHECK_EQ(kvt_check(), 0);
		kvc_close(c);
		kvt_wait_sessions(0);
		kvt_stop(&d);
		CHECK(unlink(conf) == 0 && rmdir(dir) == 0);
	}
	/* 2 on a daemon of its own: nothing cached older than the block at T. */
	kvt_start(&d, "--pool-size", "16MiB", "--segment-size", "4MiB", NULL);
	c = kvt_connect(NULL);
	evicted_next(c, kvt_pool(c, "p", BB));
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_wait_sessions(0);
	CHECK_EQ(kvt_check(), 0);
	kvt_stop(&d);
	return 0;
}
