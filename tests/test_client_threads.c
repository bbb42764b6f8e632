/* Threads on one connection (kvcache.h: "a kvc_conn may be shared by
 * threads; calls on it are serialized"), against the real daemon. Built
 * plainly in the 'threads' and 'integration' suites, and with
 * ThreadSanitizer by scripts/test --tsan, which is what proves the claim:
 * TSan sees every access of the library's threads.
 *
 * Eight threads run an engine's mix for a few thousand iterations each:
 * hash a chain of 1-4 blocks (SHA-256, XXH3 or vLLM's hashes), look it up,
 * check every byte of the prefix that hits, allocate the rest, write it
 * through kvc_block_ptr(), seal it (dedup against the other threads: most
 * chains are shared by all of them), fork and release, copy-on-write a
 * sealed block and write the copy, swap two blocks out and back in; release
 * the blocks of its previous step on that connection and keep this step's
 * (an engine's block table lives across steps); now and then Stats through
 * kvc_call(), kvc_register_pool() of the pool again; kvc_pool_block_bytes(),
 * kvc_restarts(), kvc_last_error(). The bytes of a block sealed under a hash
 * are a function of the hash, so any block a lookup or a seal returns must
 * hold them.
 *
 *   phase 1  one kvc_conn shared by the eight threads;
 *   phase 2  each thread its own kvc_conn (all connecting at once), and the
 *            shared one, in turns;
 *   phase 3  phase 2 while the daemon is killed with SIGKILL and started
 *            again on the same socket, three times;
 *   phase 4  a thread reads a block from before a restart while another
 *            thread's call reconnects the connection (see stale_phase()).
 *
 * Checks: each thread completes its iterations; each call succeeds, or in
 * phase 3 fails only the documented ways (-EPIPE or -ECONNRESET while the
 * daemon is away, KVC_ESTALE for a handle from before, KVC_ENOENT for a swap
 * from before) with a kvc_last_error() message for this thread's call; no
 * byte is wrong (in phase 3 a block from before a restart may read as zeros,
 * as documented, and nothing else); the daemon counted as many hashes looked
 * up and found as the threads did (phases 1 and 2); every thread goes on
 * working after each restart, on both its connections, and each connection
 * counts each restart once; after each phase nothing is held (no writable
 * or sealed block) and the daemon's invariant check passes.
 *
 * Block handles from before a restart must not reach kvc_block_ptr(): a
 * thread reads kvc_restarts() before the call that gave a handle and again
 * after kvc_block_ptr(), and leaves the block alone (releases it unwritten,
 * unsealed) when they differ. Swaps run on the thread's own connection only
 * in phase 3: the daemon numbers swaps from 1 in each process, so a swap id
 * from before a restart may name another thread's swap on a shared
 * connection (on its own connection a thread's first call after the restart
 * is the reconnection's, which has no swaps yet).
 *
 * Usage: test_client_threads [--iterations N] (per thread and phase; 2000). */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "harness.h"

#define THREADS 8
#define BB 4096
#define TOK 16             /* tokens per block */
#define MAXCHAIN 4
#define SHARED_CHAINS 24   /* chains every thread uses: lookups hit each other's blocks */
#define RESTARTS 3
#define WARM 100           /* clean iterations of every thread before each restart, and after */
#define WAIT_MS 120000     /* guard against a hang, far above any wait's length */

enum { OP_LOOKUP, OP_ALLOC, OP_SEAL, OP_FORK, OP_COW, OP_SWAP_OUT, OP_SWAP_IN, OP_RELEASE,
       OP_STATS, OP_REGISTER, NOPS };
static const char *const op_name[NOPS] = { "lookup", "alloc", "seal", "fork", "cow",
					   "swap_out", "swap_in", "release", "stats",
					   "register" };

struct counts {
	uint64_t calls[NOPS], ok[NOPS];
	uint64_t gone, stale, enoent;  /* failures phase 3 allows */
	uint64_t hashes, hits;         /* looked up, found (successful lookups) */
	uint64_t verified, wrong, zeroed, lost;  /* blocks */
	uint64_t iterations, clean;
};

struct worker {
	int id;
	pthread_t th;
	kvc_conn *own;
	int own_pool;
	uint64_t rng;
	struct counts n;
	/* A sequence's blocks stay held until the thread's next step on the
	 * same connection ([0] shared, [1] own), as an engine keeps a block
	 * table across steps: across a restart they go stale. */
	kvc_block carry[2][MAXCHAIN];
	int ncarry[2];
	/* Phase 3, read by the main thread under lock: the restarts both
	 * connections have seen, and the clean iterations since. */
	uint64_t seen, clean_since;
};

static struct kvt_daemon d;
static kvc_conn *shared;
static int shared_pool;
static struct worker w[THREADS];
static int phase, iterations = 2000;
static atomic_bool stop;

/* Progress of phases 3 and 4, for the main thread's waits. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;

#define FAIL(...) do { \
	fprintf(stderr, __VA_ARGS__); \
	fprintf(stderr, "\n"); \
	exit(1); \
} while (0)

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int gone(int r)
{
	return r == -EPIPE || r == -ECONNRESET;
}

/* Counts the outcome r of op on c. Returns whether it succeeded; a failure
 * the phase does not allow fails the test. */
static int outcome(struct worker *t, kvc_conn *c, int op, int r)
{
	const char *msg;

	t->n.calls[op]++;
	if (r >= 0) {
		t->n.ok[op]++;
		return 1;
	}
	msg = kvc_last_error(c);
	if (phase == 3 && (gone(r) || r == KVC_ESTALE || (r == KVC_ENOENT && op == OP_SWAP_IN))) {
		/* Each thread gets the message of its own call. */
		if (!*msg)
			FAIL("thread %d: %s: %s with no kvc_last_error() message", t->id,
			     op_name[op], kvc_strerror(r));
		if (gone(r))
			t->n.gone++;
		else if (r == KVC_ESTALE)
			t->n.stale++;
		else
			t->n.enoent++;
		return 0;
	}
	FAIL("thread %d, phase %d: %s: %s (%s)", t->id, phase, op_name[op], kvc_strerror(r), msg);
}

/* The bytes of a block sealed under h. */
static uint64_t seed_of(const kvc_hash *h)
{
	uint64_t s;

	memcpy(&s, h->b, sizeof(s));
	return s ^ 0x5eed;
}

/* The address of b, got on c by a call made when kvc_restarts(c) was r0, or
 * NULL when a restart came since: then b may be a handle from before, which
 * must not be used (kvcache.h). Any address comes from the map of b's own
 * daemon: a new daemon's segments are mapped after kvc_restarts() moves. */
static void *addr(struct worker *t, kvc_conn *c, kvc_block b, uint64_t r0)
{
	void *p = kvc_block_ptr(c, b);

	if (kvc_restarts(c) != r0) {
		t->n.lost++;
		return NULL;
	}
	if (!p)
		FAIL("thread %d: no address for block %#llx", t->id, (unsigned long long)b);
	return p;
}

/* Checks every byte of b against seed. Words read as zero are what a block
 * from before a restart holds once the library let the old memory go. */
static void verify(struct worker *t, kvc_conn *c, kvc_block b, uint64_t seed, uint64_t r0)
{
	const uint64_t *p = addr(t, c, b, r0);
	uint64_t x = seed, want[BB / 8];
	size_t i, bad = 0, zero = 0;

	if (!p)
		return;
	kvt_fill(want, BB, x);
	for (i = 0; i < BB / 8; i++)
		if (p[i] != want[i]) {
			bad++;
			zero += p[i] == 0;
		}
	t->n.verified++;
	if (!bad)
		return;
	if (bad == zero && kvc_restarts(c) != r0) {
		t->n.zeroed++;
		return;
	}
	t->n.wrong++;
	fprintf(stderr, "thread %d, phase %d: block %#llx: %zu wrong words\n", t->id, phase,
		(unsigned long long)b, bad);
}

/* Releases n blocks; after a restart the batch may mix stale handles with
 * the new daemon's (all-or-nothing: KVC_ESTALE), so then one by one. */
static void release(struct worker *t, kvc_conn *c, const kvc_block *b, size_t n)
{
	int r;

	if (!n)
		return;
	r = kvc_release(c, b, n);
	if (outcome(t, c, OP_RELEASE, r) || r != KVC_ESTALE || n == 1)
		return;
	for (size_t i = 0; i < n; i++)
		outcome(t, c, OP_RELEASE, kvc_release(c, &b[i], 1));
}

/* The hashes of chain k's first n blocks: the algorithm is the chain's, so
 * that every thread computes the same ones. */
static void chain_hashes(uint64_t k, int n, kvc_hash *h)
{
	uint32_t tok[MAXCHAIN * TOK];
	int i, r;

	for (i = 0; i < n * TOK; i++)
		tok[i] = (uint32_t)(k * 7919 + (uint64_t)i);
	switch (k % 3) {
	case 0:
		r = kvc_hash_chain(KVC_HASH_SHA256, tok, (size_t)n * TOK, TOK, NULL, h, MAXCHAIN);
		break;
	case 1:
		r = kvc_hash_chain(KVC_HASH_XXH3_128, tok, (size_t)n * TOK, TOK, NULL, h,
				   MAXCHAIN);
		break;
	default:
		r = kvc_hash_vllm_chain("0", tok, (size_t)n * TOK, TOK, NULL, h, MAXCHAIN);
		break;
	}
	if (r != n)
		FAIL("hashing chain %llu: %d", (unsigned long long)k, r);
}

/* Stats through kvc_call(), as kvctl asks. */
static int stats_call(kvc_conn *c)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Stats st = KVCACHED__STATS__INIT;
	Kvcached__Response *rs = NULL;
	int r;

	rq.op_case = KVCACHED__REQUEST__OP_STATS;
	rq.stats = &st;
	r = kvc_call(c, &rq, &rs);
	if (r < 0)
		return r;
	CHECK(rs->result_case == KVCACHED__RESPONSE__RESULT_STATS && rs->stats->n_pools >= 1);
	kvcached__response__free_unpacked(rs, NULL);
	return 0;
}

static const struct kvc_pool_desc pool_desc = {
	.name = "p", .block_bytes = BB, .block_tokens = TOK, .dtype = "fp16",
	.layout = "test", .layout_len = 4,
};

/* Two blocks out to the host tier and back. Returns whether it was clean. */
static int swap(struct worker *t, kvc_conn *c, int pool)
{
	kvc_block s[2], back[2];
	uint64_t r0 = kvc_restarts(c), id, seed = rnd(&t->rng);
	int r, j, tries;
	void *p;

	if (!outcome(t, c, OP_ALLOC, kvc_alloc(c, pool, 2, s)))
		return 0;
	for (j = 0; j < 2; j++) {
		if (!(p = addr(t, c, s[j], r0))) {
			release(t, c, s, 2);
			return 0;
		}
		kvt_fill(p, BB, seed + (uint64_t)j);
	}
	r = kvc_swap_out(c, s, 2, &id);
	if (!outcome(t, c, OP_SWAP_OUT, r)) {
		release(t, c, s, 2);
		return 0;
	}
	/* KVC_ENOSPC: the pool cannot take them back now (other threads hold
	 * it); the swap is kept, so try again. A guard, not a wait. */
	for (tries = 0; (r = kvc_swap_in(c, id, back, 2)) == KVC_ENOSPC; tries++) {
		if (tries == 100000)
			FAIL("thread %d: swap_in: KVC_ENOSPC %d times", t->id, tries);
		sched_yield();
	}
	if (!outcome(t, c, OP_SWAP_IN, r))
		return 0;
	CHECK_EQ(r, 2);
	for (j = 0; j < 2; j++)
		verify(t, c, back[j], seed + (uint64_t)j, r0);
	release(t, c, back, 2);
	return 1;
}

/* One engine step on c. Returns whether every call of it succeeded. */
static int step(struct worker *t, kvc_conn *c, int pool, int own, int iter)
{
	kvc_hash h[MAXCHAIN];
	kvc_block b[MAXCHAIN], f[MAXCHAIN], cw;
	uint64_t r0 = kvc_restarts(c), x = rnd(&t->rng), k;
	int n = 1 + (int)(x % MAXCHAIN), hit, held, j, r, clean = 1;
	void *p;

	/* Most chains are everyone's; the rest this thread's own. */
	k = (x >> 8) % 4 ? (x >> 16) % SHARED_CHAINS
			 : 1000000 + (uint64_t)phase * 100000000 + (uint64_t)t->id * 1000000 +
				   (uint64_t)iter;
	chain_hashes(k, n, h);

	r = kvc_lookup(c, pool, h, (size_t)n, b);
	if (!outcome(t, c, OP_LOOKUP, r))
		return 0;
	hit = held = r;
	t->n.hashes += (uint64_t)n;
	t->n.hits += (uint64_t)hit;
	for (j = 0; j < hit; j++)
		verify(t, c, b[j], seed_of(&h[j]), r0);

	if (hit < n) {
		int m = n - hit, filled = 1;

		r = kvc_alloc(c, pool, (uint32_t)m, b + hit);
		if (!outcome(t, c, OP_ALLOC, r)) {
			release(t, c, b, (size_t)held);
			return 0;
		}
		held = n;
		for (j = hit; j < n && filled; j++)
			if ((p = addr(t, c, b[j], r0)))
				kvt_fill(p, BB, seed_of(&h[j]));
			else
				filled = 0;
		/* Never seal a block that was not written. */
		if (!filled) {
			release(t, c, b, (size_t)held);
			return 0;
		}
		r = kvc_seal(c, pool, b + hit, h + hit, (size_t)m, b + hit);
		if (!outcome(t, c, OP_SEAL, r)) {
			release(t, c, b, (size_t)held);
			return 0;
		}
		/* Ours, or another thread's under the same hash (dedup). */
		for (j = hit; j < n; j++)
			verify(t, c, b[j], seed_of(&h[j]), r0);
	}

	if (x >> 40 & 1) {  /* beam search: another reference on each */
		r = kvc_fork(c, b, (size_t)held, f);
		if (outcome(t, c, OP_FORK, r))
			release(t, c, f, (size_t)held);
		else
			clean = 0;
	}
	if (x >> 41 & 1) {  /* a writable copy of the last block, which cow releases */
		r = kvc_cow(c, &b[held - 1], 1, &cw);
		if (outcome(t, c, OP_COW, r)) {
			held--;
			verify(t, c, cw, seed_of(&h[held]), r0);
			if ((p = addr(t, c, cw, r0))) {
				kvt_fill(p, BB, x);
				verify(t, c, cw, x, r0);
			}
			release(t, c, &cw, 1);
		} else {
			clean = 0;
		}
	}
	/* The last step's blocks go; this step's stay until the next. */
	release(t, c, t->carry[own], (size_t)t->ncarry[own]);
	memcpy(t->carry[own], b, (size_t)held * sizeof(b[0]));
	t->ncarry[own] = held;

	if ((x >> 42) % 8 == 0 && (own || phase != 3))
		clean &= swap(t, c, pool);
	if ((x >> 45) % 32 == 0)
		clean &= outcome(t, c, OP_STATS, stats_call(c));
	if ((x >> 50) % 64 == 0) {
		r = kvc_register_pool(c, &pool_desc);
		if (outcome(t, c, OP_REGISTER, r))
			CHECK_EQ(r, pool);  /* the id this connection knows the pool by */
		else
			clean = 0;
	}
	CHECK_EQ(kvc_pool_block_bytes(c, pool), BB);
	return clean;
}

static void *worker_main(void *arg)
{
	struct worker *t = arg;

	/* Phase 2: the threads connect at once (kvc_connect() of one thread
	 * beside calls and kvc_connect() of the others). */
	if (phase == 2) {
		t->own = kvt_connect(NULL);
		t->own_pool = kvt_pool(t->own, pool_desc.name, BB);
	}
	for (int i = 0; phase == 3 ? !atomic_load(&stop) : i < iterations; i++) {
		/* Phases 2 and 3: the own connection or the shared one. */
		int own = phase > 1 && rnd(&t->rng) % 2;
		kvc_conn *c = own ? t->own : shared;
		int clean = step(t, c, own ? t->own_pool : shared_pool, own, i);

		t->n.iterations++;
		t->n.clean += (uint64_t)clean;
		if (phase == 3) {
			uint64_t a = kvc_restarts(t->own), b = kvc_restarts(shared);

			pthread_mutex_lock(&lock);
			if ((a < b ? a : b) > t->seen) {
				t->seen = a < b ? a : b;
				t->clean_since = 0;
			}
			t->clean_since += (uint64_t)clean;
			pthread_cond_broadcast(&cond);
			pthread_mutex_unlock(&lock);
		}
		/* The daemon is away, or the library waits out its backoff:
		 * try again shortly (test_restart does the same). */
		if (!clean && phase == 3)
			poll(NULL, 0, 1);
	}
	for (int own = 0; own < 2; own++) {
		release(t, own ? t->own : shared, t->carry[own], (size_t)t->ncarry[own]);
		t->ncarry[own] = 0;
	}
	return NULL;
}

/* Waits until every thread has seen restarts restarts on both connections
 * and worked cleanly WARM times since. */
static void wait_workers(uint64_t restarts)
{
	uint64_t deadline = now_ms() + WAIT_MS;
	int i;

	pthread_mutex_lock(&lock);
	for (;;) {
		struct timespec ts;

		for (i = 0; i < THREADS; i++)
			if (w[i].seen < restarts || w[i].clean_since < WARM)
				break;
		if (i == THREADS)
			break;
		if (now_ms() > deadline)
			FAIL("thread %d: %llu restarts seen, %llu clean iterations since, after "
			     "%d s", i, (unsigned long long)w[i].seen,
			     (unsigned long long)w[i].clean_since, WAIT_MS / 1000);
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 1;
		pthread_cond_timedwait(&cond, &lock, &ts);
	}
	pthread_mutex_unlock(&lock);
}

/* Hashes looked up and found in the pool, by the daemon's count. */
static void pool_lookups(uint64_t *hashes, uint64_t *hits)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Stats st = KVCACHED__STATS__INIT;
	Kvcached__Response *rs = NULL;
	kvc_conn *c = kvt_connect(NULL);
	size_t i;

	rq.op_case = KVCACHED__REQUEST__OP_STATS;
	rq.stats = &st;
	CHECK_EQ(kvc_call(c, &rq, &rs), 0);
	*hashes = *hits = 0;
	for (i = 0; i < rs->stats->n_pools; i++) {
		*hashes += rs->stats->pools[i]->lookups;
		*hits += rs->stats->pools[i]->hits;
	}
	kvcached__response__free_unpacked(rs, NULL);
	kvc_close(c);
}

/* Nothing is held: no writable block, no sealed block with a reference. */
static void check_nothing_held(void)
{
	uint64_t wr, se, ca;

	kvt_blocks_total(&wr, &se, &ca);
	fprintf(stderr, "  daemon: %llu writable, %llu sealed, %llu cached blocks\n",
		(unsigned long long)wr, (unsigned long long)se, (unsigned long long)ca);
	CHECK_EQ(wr, 0);
	CHECK_EQ(se, 0);
}

static void run_phase(int p)
{
	uint64_t h0 = 0, k0 = 0, h1, k1, hashes = 0, hits = 0, t0 = now_ms();
	int i, o;

	phase = p;
	atomic_store(&stop, false);
	if (p != 3)
		pool_lookups(&h0, &k0);
	for (i = 0; i < THREADS; i++) {
		memset(&w[i].n, 0, sizeof(w[i].n));
		w[i].seen = w[i].clean_since = 0;
		CHECK(pthread_create(&w[i].th, NULL, worker_main, &w[i]) == 0);
	}
	if (p == 3) {
		wait_workers(0);
		for (i = 1; i <= RESTARTS; i++) {
			uint64_t t1 = now_ms(), t2;

			kvt_restart(&d, "--pool-size", "2MiB", "--page-size", "64KiB",
				    "--host-tier-size", "1MiB", NULL);
			t2 = now_ms();
			wait_workers((uint64_t)i);
			fprintf(stderr, "  restart %d: daemon pid %d accepts after %llu ms; every "
				"thread back on both connections %d times after %llu ms more\n", i,
				(int)d.pid, (unsigned long long)(t2 - t1), WARM,
				(unsigned long long)(now_ms() - t2));
		}
		atomic_store(&stop, true);
	}
	for (i = 0; i < THREADS; i++)
		CHECK(pthread_join(w[i].th, NULL) == 0);

	fprintf(stderr, "phase %d: %llu ms\n", p, (unsigned long long)(now_ms() - t0));
	for (i = 0; i < THREADS; i++) {
		struct counts *n = &w[i].n;
		uint64_t calls = 0, ok = 0;

		for (o = 0; o < NOPS; o++) {
			calls += n->calls[o];
			ok += n->ok[o];
		}
		fprintf(stderr, "  thread %d: %llu iterations (%llu clean), %llu calls: %llu ok, "
			"%llu daemon away, %llu stale, %llu unknown swap; %llu blocks verified, "
			"%llu wrong, %llu zeroed, %llu left alone\n", i,
			(unsigned long long)n->iterations, (unsigned long long)n->clean,
			(unsigned long long)calls, (unsigned long long)ok,
			(unsigned long long)n->gone, (unsigned long long)n->stale,
			(unsigned long long)n->enoent, (unsigned long long)n->verified,
			(unsigned long long)n->wrong, (unsigned long long)n->zeroed,
			(unsigned long long)n->lost);
		/* Every call accounted for: a success or an allowed failure. */
		CHECK_EQ(calls, ok + n->gone + n->stale + n->enoent);
		CHECK_EQ(n->wrong, 0);
		CHECK(n->verified > 0);
		if (p != 3) {
			CHECK_EQ(n->iterations, iterations);
			CHECK_EQ(ok, calls);
			CHECK_EQ(n->zeroed + n->lost, 0);
		}
		hashes += n->hashes;
		hits += n->hits;
	}
	if (p != 3) {
		pool_lookups(&h1, &k1);
		fprintf(stderr, "  %llu hashes looked up, %llu found\n", (unsigned long long)hashes,
			(unsigned long long)hits);
		CHECK_EQ(h1 - h0, hashes);
		CHECK_EQ(k1 - k0, hits);
		CHECK(hits > 0);
	} else {
		/* Each restart, once, on every connection. */
		CHECK_EQ(kvc_restarts(shared), RESTARTS);
		for (i = 0; i < THREADS; i++)
			CHECK_EQ(kvc_restarts(w[i].own), RESTARTS);
	}
	check_nothing_held();
	CHECK_EQ(kvt_check(), 0);
}

/* Phase 4: a thread reads a block from before a restart, and the pool's
 * block bytes, over and over while the main thread's next call on the shared
 * connection reconnects it: the block holds its bytes until the library lets
 * the old daemon's memory go, then zeros, nothing else (kvcache.h); once it
 * has read a zero, kvc_restarts() has moved (what verify() relies on to tell
 * a restart from corruption); the pool id keeps its block bytes throughout. */
static struct {
	const volatile uint64_t *p;
	uint64_t seed, r0, passes, wrong, bytes_wrong, zero_unmoved;
	int started;  /* under lock */
} stale;

static void *stale_reader(void *arg)
{
	uint64_t want[BB / 8], deadline = now_ms() + WAIT_MS;
	size_t i, zero;

	(void)arg;
	kvt_fill(want, BB, stale.seed);
	do {
		for (i = zero = 0; i < BB / 8; i++) {
			uint64_t v = stale.p[i];

			zero += v == 0;
			stale.wrong += v && v != want[i];
		}
		stale.zero_unmoved += zero && kvc_restarts(shared) == stale.r0;
		stale.bytes_wrong += kvc_pool_block_bytes(shared, shared_pool) != BB;
		if (stale.passes++ == 0) {
			pthread_mutex_lock(&lock);
			stale.started = 1;
			pthread_cond_broadcast(&cond);
			pthread_mutex_unlock(&lock);
		}
		if (now_ms() > deadline)
			FAIL("phase 4: the old block still reads as it was after %d s",
			     WAIT_MS / 1000);
	} while (zero < BB / 8);
	return NULL;
}

static void stale_phase(void)
{
	kvc_block old, b;
	pthread_t th;
	void *p;
	int r;

	phase = 4;
	CHECK_EQ(kvc_alloc(shared, shared_pool, 1, &old), 1);
	CHECK((p = kvc_block_ptr(shared, old)) != NULL);
	stale.p = p;
	stale.seed = 4242;
	stale.r0 = kvc_restarts(shared);
	kvt_fill(p, BB, stale.seed);
	CHECK(pthread_create(&th, NULL, stale_reader, NULL) == 0);
	pthread_mutex_lock(&lock);
	while (!stale.started)
		pthread_cond_wait(&cond, &lock);
	pthread_mutex_unlock(&lock);
	kvt_restart(&d, "--pool-size", "2MiB", "--page-size", "64KiB", "--host-tier-size", "1MiB",
		    NULL);
	/* The new daemon accepts: this call reconnects. */
	while ((r = kvc_alloc(shared, shared_pool, 1, &b)) != 1) {
		CHECK(gone(r));
		poll(NULL, 0, 1);
	}
	CHECK(pthread_join(th, NULL) == 0);
	fprintf(stderr, "phase 4: %llu reads of a block from before a restart, %llu wrong\n",
		(unsigned long long)stale.passes, (unsigned long long)stale.wrong);
	CHECK_EQ(stale.wrong, 0);
	CHECK_EQ(stale.bytes_wrong, 0);
	CHECK_EQ(stale.zero_unmoved, 0);
	CHECK_EQ(kvc_restarts(shared), RESTARTS + 1);
	CHECK_EQ(kvc_release(shared, &old, 1), KVC_ESTALE);
	CHECK_EQ(kvc_release(shared, &b, 1), 0);
}

int main(int argc, char **argv)
{
	int i;

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--iterations") && i + 1 < argc)
			iterations = atoi(argv[++i]);
		else
			FAIL("usage: %s [--iterations N]", argv[0]);
	}
	CHECK(iterations > 0);
	if (kvt_cuda())
		SKIP("block bytes are written from the CPU here (host backend)");
	/* 512 blocks of G1, 256 of G2, 64 KiB segments: eviction, demotion,
	 * promotion and new segments all the time. */
	kvt_start(&d, "--pool-size", "2MiB", "--page-size", "64KiB", "--host-tier-size", "1MiB",
		  NULL);
	shared = kvt_connect(NULL);
	shared_pool = kvt_pool(shared, pool_desc.name, BB);
	for (i = 0; i < THREADS; i++) {
		w[i].id = i;
		w[i].rng = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
	}

	run_phase(1);
	run_phase(2);
	run_phase(3);
	stale_phase();

	for (i = 0; i < THREADS; i++)
		kvc_close(w[i].own);
	kvc_close(shared);
	check_nothing_held();
	CHECK_EQ(kvt_check(), 0);
	kvt_stop(&d);
	return 0;
}
