/* The block allocator on the real host backend: run sizes for real model
 * layouts, the lifecycle, LRU eviction, ENOSPC, stale handles, dedup,
 * cross-pool and cross-namespace page sharing, and the checker itself. */
#include <errno.h>
#include <string.h>

#include "backend.h"
#include "check.h"
#include "pool.h"

static int problems;

static void report(void *ctx, const char *msg)
{
	(void)ctx;
	fprintf(stderr, "  checker: %s\n", msg);
	problems++;
}

static void must_be_consistent(struct kv_pools *ps)
{
	uint64_t blocks;

	problems = 0;
	CHECK_EQ(kv_pools_check(ps, 0, report, NULL, &blocks, 0), 0);
}

/* Real KV layouts: bytes per token per layer = 2 (K and V) * kv_heads *
 * head_dim * dtype bytes. Engines either keep all layers of a block together
 * or one block per layer; both must waste under 2%. */
static void test_layouts(void)
{
	static const struct { const char *name; int layers, kv_heads, head_dim; } m[] = {
		{ "Llama-3-8B", 32, 8, 128 },
		{ "Llama-3-70B", 80, 8, 128 },
		{ "Mistral-7B", 32, 8, 128 },
		{ "Qwen2-7B", 28, 4, 128 },
	};
	static const int tokens[] = { 16, 32 };
	static const struct { const char *name; int bytes; } dt[] = { { "fp16", 2 }, { "fp8", 1 } };
	const uint64_t page = 2u << 20;
	const uint32_t pages_per_seg = 512;  /* 1 GiB segments */
	size_t i, t, d, per_layer;

	printf("%-12s %6s %5s %-9s %12s %6s %7s %7s\n", "model", "tokens", "dtype", "blocks",
	       "block_bytes", "pages", "blocks", "waste%");
	for (i = 0; i < sizeof(m) / sizeof(m[0]); i++)
		for (t = 0; t < 2; t++)
			for (d = 0; d < 2; d++)
				for (per_layer = 0; per_layer < 2; per_layer++) {
					uint64_t bb = (uint64_t)tokens[t] * 2 * m[i].kv_heads *
						      m[i].head_dim * dt[d].bytes *
						      (per_layer ? 1 : (uint64_t)m[i].layers);
					uint32_t blocks = 0;
					int pages = kv_pool_run_size(page, pages_per_seg, bb, &blocks);
					double waste;

					CHECK(pages > 0);
					waste = 1.0 - (double)(blocks * bb) / (double)(pages * page);
					printf("%-12s %6d %5s %-9s %12llu %6d %7u %7.3f\n", m[i].name,
					       tokens[t], dt[d].name, per_layer ? "per-layer" : "all-layer",
					       (unsigned long long)bb, pages, blocks, waste * 100);
					CHECK(waste < 0.02);
					CHECK(blocks * bb <= (uint64_t)pages * page);
				}
	/* Odd sizes too: 4 KiB up to many MiB. */
	for (uint64_t bb = 4096; bb <= (64u << 20); bb = bb * 3 / 2 / 256 * 256) {
		uint32_t blocks = 0;
		int pages = kv_pool_run_size(page, pages_per_seg, bb, &blocks);

		CHECK(pages > 0);
		CHECK(1.0 - (double)(blocks * bb) / (double)((uint64_t)pages * page) < 0.02);
	}
	CHECK(kv_pool_run_size(page, 4, (8u << 20) + 256, &(uint32_t){ 0 }) == -EINVAL);
}

struct env {
	struct kv_backend *be;
	struct kv_pools *ps;
};

/* One device: nseg segments of seg_pages pages of 64 KiB. */
static void env_new(struct env *e, uint32_t nseg, uint32_t seg_pages)
{
	CHECK(kv_backend_host_create(65536ull * seg_pages, nseg, &e->be) == 0);
	CHECK(kv_pools_create(e->be, 65536, &e->ps) == 0);
	/* Namespaces 1 and 2 (a pool's namespace must be live: Hello opens it). */
	CHECK(kv_pools_ns(e->ps, "t1") == 1 && kv_pools_ns(e->ps, "t2") == 2);
}

static void env_free(struct env *e)
{
	kv_pools_destroy(e->ps);
	kv_backend_destroy(e->be);
}

static struct kv_pool *pool(struct env *e, uint32_t ns, const char *name, uint64_t bb)
{
	struct kv_pool_desc d = { .name = name, .block_bytes = bb, .block_tokens = 16, .dtype = "fp16" };
	struct kv_pool *p = NULL;
	char err[256];

	/* 1: created, 0: joined; either way with a hold, kept here: the
	 * test's pools live until the allocator goes. */
	CHECK(kv_pool_register(e->ps, ns, &d, &p, err, sizeof(err)) >= 0);
	return p;
}

static void hash_of(uint8_t *h, int i)
{
	memset(h, 0, KV_HASH_BYTES);
	memcpy(h, &i, sizeof(i));
	h[31] = 0x5a;
}

static void test_lifecycle(void)
{
	struct env e;
	struct kv_pool *p;
	struct kv_block *b[64], *x;
	uint8_t h[KV_HASH_BYTES];
	uint64_t handle;
	char why[512];
	int i, ns;

	env_new(&e, 1, 16);  /* 1 MiB: 16 pages of 64 KiB */
	ns = kv_pools_ns(e.ps, "default");
	CHECK(ns == 3 && kv_pools_ns(e.ps, "default") == 3);
	CHECK(kv_pools_ns(e.ps, "bad name") == -EINVAL && kv_pools_ns(e.ps, "") == -EINVAL);
	/* Namespaces are freed with their last reference, and the id reused. */
	kv_ns_put(kv_pools_nstab(e.ps), 3);
	kv_ns_put(kv_pools_nstab(e.ps), 3);
	CHECK(!kv_ns_find(kv_pools_nstab(e.ps), "default"));
	CHECK(kv_pools_ns(e.ps, "other") == 3 && !strcmp(kv_pools_ns_name(e.ps, 3), "other"));
	p = pool(&e, 1, "llama", 16384);  /* 4 blocks a page */
	CHECK(p->run_pages == 1 && p->blocks_per_run == 4);

	/* Registering again returns the same pool; another layout is refused. */
	{
		struct kv_pool_desc d = { .name = "llama", .block_bytes = 32768, .dtype = "fp16" };
		struct kv_pool *q;
		char err[256];

		CHECK(kv_pool_register(e.ps, 1, &d, &q, err, sizeof(err)) == -EEXIST);
		d.block_bytes = 1000; /* not a multiple of 256 */
		d.name = "odd";
		CHECK(kv_pool_register(e.ps, 1, &d, &q, err, sizeof(err)) == -EINVAL);
		CHECK(pool(&e, 1, "llama", 16384) == p);
	}

	CHECK(kv_pool_alloc(p, 64, b, why, sizeof(why)) == 0);
	for (i = 0; i < 64; i++)
		CHECK(b[i]->state == KV_BLOCK_WRITABLE && b[i]->ref == 1);
	must_be_consistent(e.ps);
	/* Full of held blocks: ENOSPC with the numbers, and nothing changed. */
	CHECK(kv_pool_alloc(p, 1, &x, why, sizeof(why)) == -ENOSPC);
	CHECK(strstr(why, "64 writable") != NULL);
	CHECK_EQ(p->n.writable, 64);
	must_be_consistent(e.ps);

	/* Handles resolve; after a free the old handle is stale. */
	handle = kv_block_handle(b[10]);
	CHECK(kv_block_lookup(e.ps, handle) == b[10]);
	CHECK(kv_block_lookup(e.ps, handle ^ (1ull << 44)) == NULL);  /* wrong gen */
	CHECK(kv_block_lookup(e.ps, handle | 0xfff) == NULL);          /* bad slot */
	CHECK(kv_block_lookup(e.ps, handle + (5ull << 32)) == NULL);   /* no such pool */
	kv_block_unref(b[10]);
	CHECK(b[10]->state == KV_BLOCK_FREE);
	CHECK(kv_block_lookup(e.ps, handle) == NULL);   /* the free changed its gen */
	CHECK(kv_pool_alloc(p, 1, &x, why, sizeof(why)) == 0);
	CHECK(x == b[10] && kv_block_handle(x) != handle);  /* reused with a new gen */
	CHECK(kv_block_lookup(e.ps, handle) == NULL);

	/* Seal 0..63 under distinct hashes; dedup a second block onto hash 0. */
	for (i = 0; i < 64; i++) {
		hash_of(h, i);
		CHECK(kv_pool_seal(p, b[i], h) == b[i]);
	}
	must_be_consistent(e.ps);
	/* Release as a chain, head first, tail aged first (as ops.c does). */
	for (i = 63; i >= 0; i--)
		kv_block_unref(b[i]);
	CHECK_EQ(p->n.cached, 64);
	must_be_consistent(e.ps);

	/* A lookup hit takes the block out of the LRU. */
	hash_of(h, 0);
	x = kv_pool_find(p, h);
	CHECK(x == b[0]);
	kv_block_ref(x);
	CHECK(x->state == KV_BLOCK_SEALED);

	/* Allocating now evicts LRU: the chain's tail (63) goes first. */
	CHECK(kv_pool_alloc(p, 1, &x, why, sizeof(why)) == 0);
	hash_of(h, 63);
	CHECK(kv_pool_find(p, h) == NULL);
	hash_of(h, 1);
	CHECK(kv_pool_find(p, h) != NULL);
	CHECK_EQ(p->n.evictions, 1);

	/* Dedup: sealing x under hash 1 returns the cached block, frees x. */
	{
		struct kv_block *y = kv_pool_seal(p, x, h);

		CHECK(y == b[1] && y->ref == 1 && y->state == KV_BLOCK_SEALED);
		CHECK(x->state == KV_BLOCK_FREE);
		CHECK_EQ(p->n.dedups, 1);
		kv_block_unref(y);
	}
	must_be_consistent(e.ps);

	/* The checker notices a broken invariant. */
	b[0]->ref++;
	b[0]->check = 5;
	CHECK(kv_pools_check(e.ps, 0, NULL, NULL, NULL, 0) == 0);  /* ref>=1 SEALED is fine... */
	CHECK(kv_pools_check(e.ps, 1, NULL, NULL, NULL, 0) > 0);   /* ...but not what sessions hold */
	b[0]->ref--;
	kv_block_unref(b[0]);
	b[2]->state = KV_BLOCK_WRITABLE;                         /* on the LRU while WRITABLE */
	CHECK(kv_pools_check(e.ps, 0, NULL, NULL, NULL, 0) > 0);
	b[2]->state = KV_BLOCK_CACHED;
	must_be_consistent(e.ps);

	CHECK(kv_pools_evict_all(e.ps, -1) == p->n.evictions - 1);
	CHECK_EQ(p->n.cached, 0);
	must_be_consistent(e.ps);
	env_free(&e);
}

static void test_sharing(void)
{
	struct env e;
	struct kv_pool *a, *b, *c;
	struct kv_block *blk[64];
	uint8_t h[KV_HASH_BYTES];
	uint32_t dev, seg_a, seg_c;
	char why[512];
	int i;

	env_new(&e, 4, 4);  /* 4 segments of 4 pages */
	a = pool(&e, 1, "a", 65536);   /* 1 block per page */
	b = pool(&e, 1, "b", 32768);   /* 2 per page */
	c = pool(&e, 2, "c", 65536);   /* another tenant */

	/* a fills two segments with cached blocks. */
	CHECK(kv_pool_alloc(a, 8, blk, why, sizeof(why)) == 0);
	for (i = 0; i < 8; i++) {
		hash_of(h, i);
		kv_pool_seal(a, blk[i], h);
	}
	for (i = 7; i >= 0; i--)
		kv_block_unref(blk[i]);
	/* c (tenant 2) takes the two free segments, never a's. */
	CHECK(kv_pool_alloc(c, 8, blk, why, sizeof(why)) == 0);
	kv_block_where(blk[0], &dev, &seg_c);
	for (i = 0; i < 8; i++) {
		uint32_t s;

		kv_block_where(blk[i], &dev, &s);
		CHECK(s >= 2);
	}
	must_be_consistent(e.ps);
	/* b (tenant 1) needs pages: it evicts a's oldest cached blocks. */
	{
		struct kv_block *x[4];

		CHECK(kv_pool_alloc(b, 4, x, why, sizeof(why)) == 0);
		CHECK_EQ(a->n.evictions, 2);
		kv_block_where(x[0], &dev, &seg_a);
		CHECK(seg_a < 2);
		hash_of(h, 7);
		CHECK(kv_pool_find(a, h) == NULL);   /* tail evicted */
		hash_of(h, 0);
		CHECK(kv_pool_find(a, h) != NULL);   /* head kept */
		for (i = 0; i < 4; i++)
			kv_block_unref(x[i]);
	}
	must_be_consistent(e.ps);
	/* Tenant 2 releases everything; a tenant-1 pool may then take its
	 * segments, which get fresh memory. */
	for (i = 0; i < 8; i++)
		kv_block_unref(blk[i]);
	kv_pools_evict_all(e.ps, -1);
	CHECK(kv_pool_alloc(a, 16, blk, why, sizeof(why)) == 0);
	must_be_consistent(e.ps);
	CHECK(kv_pool_alloc(c, 1, blk + 16, why, sizeof(why)) == -ENOSPC);
	(void)seg_c;
	env_free(&e);
}

/* Demotion (tier.c drives it): a finished copy frees the block, a lookup
 * meanwhile cancels it, a failed copy puts the block back on the LRU. */
static void test_demote(void)
{
	struct env e;
	struct kv_pool *p;
	struct kv_block *b[4], *x;
	uint8_t h[KV_HASH_BYTES];
	char why[512];
	int i;

	env_new(&e, 1, 4);
	p = pool(&e, 1, "p", 16384);
	CHECK(kv_pool_alloc(p, 4, b, why, sizeof(why)) == 0);
	for (i = 0; i < 4; i++) {
		hash_of(h, i);
		CHECK(kv_pool_seal(p, b[i], h) == b[i]);
	}
	for (i = 3; i >= 0; i--)
		kv_block_unref(b[i]);
	must_be_consistent(e.ps);

	/* Oldest first: 3, then 2 once 3 is demoting. */
	x = kv_pools_oldest_cached(e.ps, 0);
	CHECK(x == b[3]);
	kv_block_demote_begin(x);
	CHECK(x->demoting && p->n.demoting == 1);
	CHECK(kv_pools_oldest_cached(e.ps, 0) == b[2]);
	must_be_consistent(e.ps);
	CHECK(kv_block_demote_end(x, 1) == 1);
	CHECK(x->state == KV_BLOCK_FREE && p->n.demoting == 0);
	must_be_consistent(e.ps);

	/* A reference taken meanwhile cancels it. */
	kv_block_demote_begin(b[2]);
	kv_block_ref(b[2]);
	CHECK(b[2]->state == KV_BLOCK_SEALED && !b[2]->demoting);
	CHECK(kv_block_demote_end(b[2], 1) == 0);
	must_be_consistent(e.ps);
	kv_block_unref(b[2]);
	must_be_consistent(e.ps);

	/* A failed copy: back on the LRU, which stays in tick order. */
	x = kv_pools_oldest_cached(e.ps, 0);
	CHECK(x == b[1]);
	kv_block_demote_begin(x);
	CHECK(kv_block_demote_end(x, 0) == 0);
	CHECK(x->state == KV_BLOCK_CACHED && !x->demoting);
	must_be_consistent(e.ps);
	env_free(&e);
}

/* An allocation that finds no room while blocks are being demoted: they
 * cannot be evicted (a copy reads them), so it fails now, but
 * kv_pool_room_after_demotions() says it would succeed once they are freed
 * (the daemon parks the request until then), and it does then. Pool a has a
 * block held in each of three runs and, in the fourth, one block demoting and
 * one cached; pool b needs a whole page. */
static void test_room_after_demotions(void)
{
	struct env e;
	struct kv_pool *a, *b;
	struct kv_block *blk[8], *x[2];
	uint8_t h[KV_HASH_BYTES];
	char why[512];
	int i;

	env_new(&e, 1, 4);
	a = pool(&e, 1, "a", 32768);   /* 2 blocks per page */
	b = pool(&e, 1, "b", 65536);   /* 1 per page */
	CHECK(kv_pool_alloc(a, 8, blk, why, sizeof(why)) == 0);
	for (i = 0; i < 8; i++) {
		hash_of(h, 100 + i);
		CHECK(kv_pool_seal(a, blk[i], h) == blk[i]);
	}
	for (i = 0; i < 6; i += 2)
		kv_block_unref(blk[i]);
	kv_block_unref(blk[7]);
	CHECK(blk[6]->run == blk[7]->run);
	/* Nothing in flight: no room now or later. */
	CHECK(kv_pool_alloc(b, 1, x, why, sizeof(why)) == -ENOSPC);
	CHECK(kv_pool_room_after_demotions(b, 1) == 0);
	kv_block_unref(blk[6]);
	kv_block_demote_begin(blk[6]);
	must_be_consistent(e.ps);
	CHECK(kv_pool_alloc(b, 1, x, why, sizeof(why)) == -ENOSPC);
	CHECK(blk[6]->demoting && blk[7]->state == KV_BLOCK_CACHED);  /* nothing taken */
	CHECK(kv_pool_room_after_demotions(b, 1) == 1);
	CHECK(kv_pool_room_after_demotions(b, 2) == 0);  /* the other runs hold blocks */
	CHECK(kv_block_demote_end(blk[6], 1) == 1);
	CHECK(kv_pool_room_after_demotions(b, 1) == 0);  /* none in flight now */
	CHECK(kv_pool_alloc(b, 1, x, why, sizeof(why)) == 0);
	hash_of(h, 107);
	CHECK(kv_pool_find(a, h) == NULL);  /* evicted for it */
	must_be_consistent(e.ps);
	/* A demotion a reference cancels is counted out of its run too. */
	kv_block_unref(blk[1]);
	kv_block_demote_begin(blk[1]);
	CHECK(blk[1]->run->ndemoting == 1);
	kv_block_ref(blk[1]);
	CHECK(blk[1]->run->ndemoting == 0 && kv_block_demote_end(blk[1], 1) == 0);
	must_be_consistent(e.ps);
	kv_block_unref(blk[1]);
	kv_block_unref(blk[3]);
	kv_block_unref(blk[5]);
	kv_block_unref(x[0]);
	must_be_consistent(e.ps);
	env_free(&e);
}

/* What demotion's watermarks see: pages a segment leaves over after whole
 * runs are free but of no use, so kv_pools_dev_room() leaves them out where
 * kv_pools_dev_free() counts them. 96 KiB blocks in 4-page segments of 64 KiB
 * pages: runs of 3 pages holding 2 blocks, one page over per segment. Found
 * by the engine benchmark: with 360 KiB blocks in 4 MiB segments a fifth of
 * G1 was such pages, the device never looked full and nothing was demoted. */
static void test_dev_room(void)
{
	struct env e;
	struct kv_pool *p;
	struct kv_block *b[4];
	uint64_t total;
	char why[512];

	env_new(&e, 2, 4);
	CHECK(kv_pools_dev_room(e.ps, 0, &total) == total);   /* no pool yet: all of it */
	p = pool(&e, 1, "p", 98304);
	CHECK(p->run_pages == 3 && p->blocks_per_run == 2);
	CHECK(kv_pools_dev_room(e.ps, 0, &total) == total && total == 8 * 65536);
	CHECK(kv_pool_alloc(p, 4, b, why, sizeof(why)) == 0);  /* both segments' runs */
	CHECK(kv_pools_dev_free(e.ps, 0, &total) == 2 * 65536);
	CHECK(kv_pools_dev_room(e.ps, 0, &total) == 0);
	kv_block_unref(b[3]);
	CHECK(kv_pools_dev_room(e.ps, 0, &total) == 98304);    /* a free block counts */
	for (int i = 0; i < 3; i++)
		kv_block_unref(b[i]);
	must_be_consistent(e.ps);
	env_free(&e);
}

/* A block's references stop at KV_BLOCK_REF_MAX: a reference more is
 * refused with -EOVERFLOW and changes nothing; a seal that would dedup onto
 * a full block keeps the caller's block instead. */
static void test_ref_saturation(void)
{
	struct env e;
	struct kv_pool *p;
	struct kv_block *b[3], *x;
	struct kv_pool_counts before;
	uint8_t h[KV_HASH_BYTES];
	char why[512];

	env_new(&e, 1, 4);
	p = pool(&e, 1, "p", 16384);
	CHECK(kv_pool_alloc(p, 3, b, why, sizeof(why)) == 0);
	hash_of(h, 7);
	CHECK(kv_pool_seal(p, b[0], h) == b[0]);

	/* Room: counted without overflow, whatever n. */
	CHECK(kv_block_ref_room(b[0], KV_BLOCK_REF_MAX - 1) == 1);
	CHECK(kv_block_ref_room(b[0], KV_BLOCK_REF_MAX) == 0);
	CHECK(kv_block_ref_room(b[0], UINT32_MAX) == 0);

	/* SEALED b[0] one short of the maximum: one more fits, then no more. */
	b[0]->ref = KV_BLOCK_REF_MAX - 1;
	CHECK(kv_block_ref_room(b[0], 1) == 1 && kv_block_ref_room(b[0], 2) == 0);
	CHECK(kv_block_ref(b[0]) == 0);
	CHECK(b[0]->ref == KV_BLOCK_REF_MAX);
	CHECK(kv_block_ref_room(b[0], 0) == 1 && kv_block_ref_room(b[0], 1) == 0);
	before = p->n;
	CHECK(kv_block_ref(b[0]) == -EOVERFLOW);
	CHECK(b[0]->ref == KV_BLOCK_REF_MAX && b[0]->state == KV_BLOCK_SEALED);
	CHECK(memcmp(&before, &p->n, sizeof(before)) == 0);
	must_be_consistent(e.ps);

	/* Sealing b[1] under the same hash cannot dedup onto b[0]: b[1] comes
	 * back WRITABLE, still the caller's, and b[0] is untouched. */
	x = kv_pool_seal(p, b[1], h);
	CHECK(x == b[1] && b[1]->state == KV_BLOCK_WRITABLE && b[1]->ref == 1);
	CHECK(b[0]->ref == KV_BLOCK_REF_MAX && kv_pool_find(p, h) == b[0]);
	CHECK(memcmp(&before, &p->n, sizeof(before)) == 0);
	must_be_consistent(e.ps);

	/* With room again, the same seal dedups. */
	b[0]->ref = 1;
	x = kv_pool_seal(p, b[1], h);
	CHECK(x == b[0] && b[0]->ref == 2 && b[1]->state == KV_BLOCK_FREE);
	CHECK_EQ(p->n.dedups, before.dedups + 1);
	must_be_consistent(e.ps);

	/* A WRITABLE block (fork before seal) saturates the same way. */
	b[2]->ref = KV_BLOCK_REF_MAX;
	CHECK(kv_block_ref(b[2]) == -EOVERFLOW && b[2]->ref == KV_BLOCK_REF_MAX);
	CHECK(b[2]->state == KV_BLOCK_WRITABLE);
	b[2]->ref = 1;

	/* The checker and the state assertion catch a ref past the maximum. */
	b[2]->ref = KV_BLOCK_REF_MAX + 1;
	CHECK(kv_pools_check(e.ps, 0, NULL, NULL, NULL, 0) > 0);
	CHECK_ABORTS(kv_block_assert_state(b[2]));
	b[2]->ref = 1;
	must_be_consistent(e.ps);
	env_free(&e);
}

/* What the allocator's callers must never do fails an assertion, not
 * silently: the state machines in pool.h and pages.h. */
static void test_asserts(void)
{
	struct env e;
	struct kv_pool *p;
	struct kv_block *b[4];
	struct kv_pages pg;
	uint8_t h[KV_HASH_BYTES];
	char why[512];
	int fresh;

	env_new(&e, 1, 4);
	p = pool(&e, 1, "p", 16384);
	CHECK(kv_pool_alloc(p, 4, b, why, sizeof(why)) == 0);
	hash_of(h, 1);
	CHECK(kv_pool_seal(p, b[1], h) == b[1]);
	hash_of(h, 2);
	CHECK(kv_pool_seal(p, b[2], h) == b[2]);
	kv_block_unref(b[2]);                         /* CACHED, ref 0 */
	kv_block_unref(b[0]);                         /* FREE */
	CHECK(b[0]->state == KV_BLOCK_FREE && b[2]->state == KV_BLOCK_CACHED);
	must_be_consistent(e.ps);

	CHECK_ABORTS(kv_block_unref(b[0]));           /* unref of a FREE block */
	CHECK_ABORTS(kv_block_unref(b[2]));           /* unref of a CACHED block */
	CHECK_ABORTS(kv_block_ref(b[0]));             /* ref of a FREE block */
	CHECK_ABORTS(kv_pool_seal(p, b[1], h));       /* seal of a SEALED block */
	CHECK_ABORTS(kv_pool_seal(p, b[0], h));       /* seal of a FREE block */
	CHECK_ABORTS(kv_block_demote_begin(b[1]));    /* demotion of a SEALED block */
	CHECK_ABORTS({ b[1]->slot = KV_MAX_RUN_BLOCKS; kv_block_handle(b[1]); });  /* slot out of range */
	CHECK_ABORTS({ b[1]->ref = 0; kv_block_assert_state(b[1]); });  /* SEALED, ref 0 */
	CHECK_ABORTS({ b[3]->run->nused = 0; kv_block_unref(b[3]); });   /* nused underflow */
	/* The batch transitions (kv_blocks_ref(), kv_blocks_unref_back())
	 * check each block on its fields before they change it (issue 38):
	 * every broken state that kv_block_assert_state() catches after a
	 * single-block transition, they catch too. */
	CHECK_ABORTS(kv_blocks_ref(&b[0], 1));                               /* FREE */
	CHECK_ABORTS({ b[1]->ref = 0; kv_blocks_ref(&b[1], 1); });           /* SEALED, ref 0 */
	CHECK_ABORTS({ b[1]->ref = KV_BLOCK_REF_MAX; kv_blocks_ref(&b[1], 1); });  /* no room */
	CHECK_ABORTS({ b[1]->ix.pprev = NULL; kv_blocks_ref(&b[1], 1); });   /* SEALED, unindexed */
	CHECK_ABORTS({ b[3]->ix.pprev = &b[3]->ix.next; kv_blocks_ref(&b[3], 1); });  /* WRITABLE, indexed */
	CHECK_ABORTS({ b[1]->demoting = 1; kv_blocks_ref(&b[1], 1); });      /* SEALED, demoting */
	CHECK_ABORTS({ kv_list_push_front(&p->lru, &b[1]->node); kv_blocks_ref(&b[1], 1); });  /* SEALED, listed */
	CHECK_ABORTS({ kv_list_del(&b[2]->node); kv_blocks_ref(&b[2], 1); });  /* CACHED, on no list */
	CHECK_ABORTS({ b[2]->ref = 1; kv_blocks_ref(&b[2], 1); });           /* CACHED, ref 1 */
	CHECK_ABORTS({ b[1]->slot = (uint16_t)p->blocks_per_run; kv_blocks_ref(&b[1], 1); });  /* slot */
	CHECK_ABORTS({ b[1]->own = 2; b[1]->owner = 9; kv_blocks_ref(&b[1], 1); });  /* own > ref */
	CHECK_ABORTS({ b[1]->own = 0; b[1]->owner = 0; b[1]->own = 1; kv_blocks_ref(&b[1], 1); });  /* own, no owner */
	CHECK_ABORTS(kv_blocks_unref_back(&b[0], 1));                        /* FREE */
	CHECK_ABORTS(kv_blocks_unref_back(&b[2], 1));                        /* CACHED */
	CHECK_ABORTS({ b[1]->ix.pprev = NULL; kv_blocks_unref_back(&b[1], 1); });  /* last ref, unindexed */
	CHECK_ABORTS({ b[1]->demoting = 1; kv_blocks_unref_back(&b[1], 1); });    /* last ref, demoting */
	CHECK_ABORTS({ kv_list_push_front(&p->lru, &b[1]->node); kv_blocks_unref_back(&b[1], 1); });
	CHECK_ABORTS({ b[1]->own = 1; b[1]->owner = 9; kv_blocks_unref_back(&b[1], 1); });  /* owner's ref left */
	CHECK_ABORTS({ b[1]->slot = (uint16_t)p->blocks_per_run; kv_blocks_unref_back(&b[1], 1); });
	/* The children changed nothing here. */
	must_be_consistent(e.ps);
	env_free(&e);

	/* Pages: 2 segments of 4. Freeing a page twice, one never taken, or a
	 * range across two segments. */
	CHECK(kv_pages_init(&pg, 0, 2, 4 * 65536, 65536) == 0);
	CHECK(kv_pages_alloc(&pg, 2, 1, &pg, &fresh, 0) == 0);
	kv_pages_free(&pg, 0, 2);
	CHECK_ABORTS(kv_pages_free(&pg, 0, 2));
	CHECK_ABORTS(kv_pages_free(&pg, 5, 1));
	CHECK(kv_pages_claim(&pg, 2, 2, 1, &pg) == 0);
	CHECK(kv_pages_claim(&pg, 4, 2, 1, &fresh) == 0);
	CHECK_ABORTS(kv_pages_free(&pg, 2, 4));
	kv_pages_free(&pg, 2, 2);
	kv_pages_free(&pg, 4, 2);
	CHECK_EQ(pg.nfree, 8);
	kv_pages_fini(&pg);
}

/* Bytes written in a block survive a copy (copy-on-write's mechanism). */
static void test_copy(void)
{
	struct env e;
	struct kv_pool *p;
	struct kv_block *b[2];
	char why[512];

	env_new(&e, 1, 4);
	p = pool(&e, 1, "p", 8192);
	CHECK(kv_pool_alloc(p, 2, b, why, sizeof(why)) == 0);
	CHECK(kv_block_copy(b[1], b[0]) == 0);
	env_free(&e);
}

/* Pools are freed once nothing keeps them (pool.h): not while held or while
 * a block is in use; their ids come back last; a stale handle stays stale;
 * the namespace goes with its last pool and session, and the segments it
 * last owned get fresh memory for whichever namespace takes its id next. */
static int gone_calls;

static void gone(void *ctx, struct kv_pool *p)
{
	CHECK(ctx == (void *)&gone_calls && p->holds == 0);
	gone_calls++;
}

static void test_free(void)
{
	struct env e;
	struct kv_ns_table *t;
	struct kv_pool *p, *q, *r, *sp;
	struct kv_block *b[8];
	uint8_t h[KV_HASH_BYTES];
	uint64_t stale;
	uint32_t dev, seg, epoch, pid, ns3;
	char why[512];
	int i;

	env_new(&e, 2, 4);  /* 2 segments of 4 pages of 64 KiB */
	t = kv_pools_nstab(e.ps);
	ns3 = (uint32_t)kv_pools_ns(e.ps, "t3");   /* a session's reference */
	CHECK(ns3 == 3);
	p = pool(&e, ns3, "p", 65536);
	q = pool(&e, 1, "q", 65536);
	CHECK(p->id == 0 && q->id == 1 && kv_pools_count(e.ps) == 2 && kv_ns_get(t, ns3)->pools == 1);
	pid = p->id;

	/* Held, or with a block in use: kept. */
	CHECK(kv_pool_alloc(p, 2, b, why, sizeof(why)) == 0);
	hash_of(h, 1);
	kv_pool_seal(p, b[0], h);
	stale = kv_block_handle(b[1]);
	kv_pool_put(p);  /* the registration's hold */
	CHECK(kv_pools_collect(e.ps, gone, &gone_calls) == 0);
	kv_block_unref(b[1]);   /* writable: FREE */
	kv_block_unref(b[0]);   /* sealed: CACHED, still in use */
	CHECK(kv_pools_collect(e.ps, gone, &gone_calls) == 0 && kv_pool_get(e.ps, pid) == p);
	must_be_consistent(e.ps);
	kv_block_where(b[0], &dev, &seg);
	epoch = e.be->epoch[dev][seg];

	/* Held again while idle: kept (collect looks again). */
	kv_pools_evict_all(e.ps, (int)pid);
	kv_pool_hold(p);
	CHECK(kv_pools_collect(e.ps, gone, &gone_calls) == 0 && kv_pool_get(e.ps, pid) == p);
	kv_pool_put(p);
	must_be_consistent(e.ps);   /* idle, queued: consistent */

	/* The session leaves t3: the pool keeps the namespace. */
	kv_pools_ns_put(e.ps, ns3);
	CHECK(kv_ns_find(t, "t3") == ns3);
	CHECK(kv_pools_collect(e.ps, gone, &gone_calls) == 1 && gone_calls == 1);
	CHECK(kv_pool_get(e.ps, pid) == NULL && kv_pools_count(e.ps) == 1);
	/* With its last pool gone, so is t3; all its pages are back. */
	CHECK(kv_ns_find(t, "t3") == 0 && kv_ns_get(t, ns3) == NULL);
	{
		uint64_t total, nfree, pb;

		kv_pools_pages(e.ps, &total, &nfree, &pb);
		CHECK(nfree == total);
	}
	must_be_consistent(e.ps);
	/* A handle of the freed pool names nothing. */
	CHECK(kv_block_lookup(e.ps, stale) == NULL);

	/* Ids come back last: the next pool gets 2, not the freed 0. */
	r = pool(&e, 1, "r", 65536);
	CHECK(r->id == 2 && kv_pools_end(e.ps) == 3);
	CHECK(kv_block_lookup(e.ps, stale) == NULL);

	/* A new namespace gets t3's id; the segment t3 used last is given
	 * fresh memory before its pages go to it. */
	CHECK(kv_pools_ns(e.ps, "t4") == (int)ns3);
	sp = pool(&e, ns3, "s", 65536);
	CHECK(kv_pool_alloc(sp, 8, b, why, sizeof(why)) == 0);  /* every page */
	CHECK(e.be->epoch[dev][seg] != epoch);
	for (i = 0; i < 8; i++)
		kv_block_unref(b[i]);
	/* Eviction and allocation across the free id 0 (the sentinel). */
	CHECK(kv_pool_alloc(q, 8, b, why, sizeof(why)) == 0);
	for (i = 0; i < 8; i++) {
		hash_of(h, 100 + i);
		kv_block_unref(kv_pool_seal(q, b[i], h));
	}
	CHECK(kv_pool_alloc(r, 4, b, why, sizeof(why)) == 0);  /* evicts q's oldest */
	CHECK(q->n.evictions == 4);
	for (i = 0; i < 4; i++)
		kv_block_unref(b[i]);
	CHECK(kv_pools_evict_all(e.ps, -1) == 4);
	must_be_consistent(e.ps);

	/* The top ids freed (2 and 3): the end comes down past the free ids. */
	CHECK(sp->id == 3);
	kv_pool_put(r);
	kv_pool_put(sp);
	CHECK(kv_pools_collect(e.ps, NULL, NULL) == 2 && kv_pools_end(e.ps) == 2);
	/* Ids go round: 4 .. 4095 (round robin goes on from the last one
	 * handed out), then the free ones from 0. */
	{
		struct kv_pool *last = NULL;
		char name[16];

		for (i = 0; i < KV_MAX_POOLS - 1; i++) {
			snprintf(name, sizeof(name), "n%d", i);
			last = pool(&e, 2, name, 65536);
			/* 4 .. 4095, then 0, 2, 3 (q has 1). */
			CHECK(last->id == (i < KV_MAX_POOLS - 4 ? (uint32_t)i + 4
								: (uint32_t[]){ 0, 2, 3 }[i - (KV_MAX_POOLS - 4)]));
		}
		CHECK(kv_pools_count(e.ps) == KV_MAX_POOLS && last->id == 3);
		CHECK(kv_pools_end(e.ps) == KV_MAX_POOLS);
		{
			struct kv_pool_desc d = { .name = "full", .block_bytes = 65536 };
			struct kv_pool *x;

			CHECK(kv_pool_register(e.ps, 2, &d, &x, why, sizeof(why)) == -ENOSPC);
		}
		must_be_consistent(e.ps);
	}
	env_free(&e);
}

/* Across pools the oldest cached block is found through a heap keyed by each
 * pool's LRU back (evict.c); kv_block_ref() and kv_block_unref() move that
 * key only when they touch the back or empty/fill the list (issue 38). Two
 * pools with interleaved ticks: references taken on the back, mid-list and
 * on every block of one pool, then given back; after each step the checker
 * verifies every heap key against its LRU's back, and at the end the blocks
 * come out oldest first across both pools, in the order of their last
 * release. */
static void test_heap_keys(void)
{
	struct env e;
	struct kv_pool *a, *c;
	struct kv_block *ba[4], *bc[4], *want[8], *x;
	uint8_t h[KV_HASH_BYTES];
	char why[512];
	int i, n = 0;

	env_new(&e, 2, 4);
	a = pool(&e, 1, "a", 16384);
	c = pool(&e, 1, "c", 16384);
	CHECK(kv_pool_alloc(a, 4, ba, why, sizeof(why)) == 0);
	CHECK(kv_pool_alloc(c, 4, bc, why, sizeof(why)) == 0);
	for (i = 0; i < 4; i++) {
		hash_of(h, i);
		CHECK(kv_pool_seal(a, ba[i], h) == ba[i]);
		CHECK(kv_pool_seal(c, bc[i], h) == bc[i]);
	}
	/* Ticks: a0 < c0 < a1 < c1 < ... */
	for (i = 0; i < 4; i++) {
		kv_block_unref(ba[i]);
		kv_block_unref(bc[i]);
	}
	must_be_consistent(e.ps);
	CHECK(kv_pools_oldest_cached(e.ps, 0) == ba[0]);

	/* a's back taken: a's key moves to a1, c0 is now the oldest. */
	CHECK(kv_block_ref(ba[0]) == 0);
	must_be_consistent(e.ps);
	CHECK(kv_pools_oldest_cached(e.ps, 0) == bc[0]);
	/* Mid-list: no key moves. */
	CHECK(kv_block_ref(bc[2]) == 0);
	must_be_consistent(e.ps);
	CHECK(kv_pools_oldest_cached(e.ps, 0) == bc[0]);
	/* c's back: c's key moves to c1, a1 is the oldest. */
	CHECK(kv_block_ref(bc[0]) == 0);
	must_be_consistent(e.ps);
	CHECK(kv_pools_oldest_cached(e.ps, 0) == ba[1]);
	/* Every block of c taken: c leaves the heap. */
	CHECK(kv_block_ref(bc[1]) == 0 && kv_block_ref(bc[3]) == 0);
	must_be_consistent(e.ps);
	CHECK(kv_pools_oldest_cached(e.ps, 0) == ba[1]);
	/* Given back, newest first (release order): c comes back with c3. */
	kv_block_unref(bc[3]);
	must_be_consistent(e.ps);
	kv_block_unref(ba[0]);  /* to a's front: a's key stays a1 */
	must_be_consistent(e.ps);
	CHECK(kv_pools_oldest_cached(e.ps, 0) == ba[1]);
	kv_block_unref(bc[2]);
	kv_block_unref(bc[0]);
	kv_block_unref(bc[1]);
	must_be_consistent(e.ps);

	/* Oldest first: a1 a2 a3 (their first release), then c3, a0, c2, c0, c1. */
	want[0] = ba[1], want[1] = ba[2], want[2] = ba[3], want[3] = bc[3];
	want[4] = ba[0], want[5] = bc[2], want[6] = bc[0], want[7] = bc[1];
	while ((x = kv_pools_oldest_cached(e.ps, 0))) {
		CHECK(n < 8 && x == want[n]);
		CHECK(kv_pools_drop_cached(x) == 1);
		must_be_consistent(e.ps);
		n++;
	}
	CHECK_EQ(n, 8);
	env_free(&e);
}

/* kv_block_lookup_near() answers as kv_block_lookup() for every handle,
 * good, stale or forged, whatever block it is given as near. */
static void test_lookup_near(void)
{
	struct env e;
	struct kv_pool *p, *q;
	struct kv_block *b[12], *near[14];
	uint64_t h[12 * 6];
	char why[512];
	int i, j, n = 0;

	env_new(&e, 2, 8);
	p = pool(&e, 1, "p", 16384);   /* 4 blocks a run */
	q = pool(&e, 1, "q", 16384);
	CHECK(kv_pool_alloc(p, 8, b, why, sizeof(why)) == 0);
	CHECK(kv_pool_alloc(q, 4, b + 8, why, sizeof(why)) == 0);
	for (i = 0; i < 12; i++) {
		uint64_t x = kv_block_handle(b[i]);

		h[n++] = x;
		h[n++] = x ^ (1ull << 44);              /* another generation */
		h[n++] = (x & ~0xfffull) | 0xfff;       /* slot past the run */
		h[n++] = (x & ~0xfffull) | 3;           /* another slot, same run */
		h[n++] = x ^ (1ull << 12);              /* another page */
		h[n++] = x ^ (1ull << 32);              /* another pool id */
	}
	kv_block_unref(b[5]);                           /* FREE: its handle stale */
	for (i = 0; i < 12; i++)
		near[i] = b[i];
	near[12] = NULL;
	near[13] = b[0];
	for (i = 0; i < n; i++)
		for (j = 0; j < 14; j++)
			CHECK(kv_block_lookup_near(e.ps, h[i], near[j]) == kv_block_lookup(e.ps, h[i]));
	for (i = 0; i < 12; i++)
		if (i != 5)
			kv_block_unref(b[i]);
	must_be_consistent(e.ps);
	env_free(&e);
}

/* An allocation on a full pool evicts its pool's oldest blocks a batch at a
 * time (evict.c evict_own(), recycled straight into the allocation): the
 * same blocks, oldest release first, as one eviction at a time; a block
 * with a reference is never taken; each victim's old handle goes stale; an
 * allocation that cannot succeed evicts nothing. Batches of more than one
 * evict_own() round (64) and a remainder. */
static void test_evict_batch(void)
{
	enum { N = 128, HELD = 3 };
	static const int held[HELD] = { 7, 64, 100 };
	struct env e;
	struct kv_pool *p;
	struct kv_block *b[N], *out[N];
	uint64_t handle[N];
	uint8_t h[KV_HASH_BYTES];
	int age[N], i, j, k;
	char why[512];

	env_new(&e, 1, 32);  /* 2 MiB: 128 blocks of 16 KiB */
	p = pool(&e, 1, "evb", 16384);
	CHECK(kv_pool_alloc(p, N, b, why, sizeof(why)) == 0);
	for (i = 0; i < N; i++) {
		hash_of(h, i);
		CHECK(kv_pool_seal(p, b[i], h) == b[i]);
		handle[i] = kv_block_handle(b[i]);
	}
	/* Released in a scrambled order (37 is prime to 128): age[i] is
	 * block i's place in the LRU, 0 the oldest. The held ones keep their
	 * reference. */
	for (i = 0, k = 0; i < N; i++) {
		j = (i * 37 + 11) % N;
		for (int x = 0; x < HELD; x++)
			if (held[x] == j)
				goto keep;
		age[j] = k++;
		kv_block_unref(b[j]);
		continue;
keep:
		age[j] = -1;
	}
	CHECK_EQ(p->n.cached, N - HELD);
	must_be_consistent(e.ps);

	/* More than the cached blocks: ENOSPC, and nothing evicted. */
	CHECK(kv_pool_alloc(p, N - HELD + 1, out, why, sizeof(why)) == -ENOSPC);
	CHECK_EQ(p->n.evictions, 0);
	CHECK_EQ(p->n.cached, N - HELD);
	must_be_consistent(e.ps);

	/* 100: the 100 oldest go, in two rounds (64 + 36). */
	CHECK(kv_pool_alloc(p, 100, out, why, sizeof(why)) == 0);
	CHECK_EQ(p->n.evictions, 100);
	CHECK_EQ(p->n.cached, N - HELD - 100);
	CHECK_EQ(p->n.writable, 100);
	for (i = 0; i < N; i++) {
		hash_of(h, i);
		if (age[i] < 0) {
			CHECK(b[i]->state == KV_BLOCK_SEALED && b[i]->ref == 1);
			CHECK(kv_pool_find(p, h) == b[i]);
			CHECK(kv_block_lookup(e.ps, handle[i]) == b[i]);
		} else if (age[i] < 100) {
			CHECK(kv_pool_find(p, h) == NULL);
			CHECK(kv_block_lookup(e.ps, handle[i]) == NULL);
		} else {
			CHECK(kv_pool_find(p, h) == b[i] && b[i]->state == KV_BLOCK_CACHED);
			CHECK(kv_block_lookup(e.ps, handle[i]) == b[i]);
		}
	}
	for (i = 0; i < 100; i++) {
		CHECK(out[i]->state == KV_BLOCK_WRITABLE && out[i]->ref == 1 && !out[i]->owner);
		for (j = 0; j < i; j++)
			CHECK(out[j] != out[i]);
	}
	must_be_consistent(e.ps);
	/* The rest, then nothing more: the held blocks stay. */
	CHECK(kv_pool_alloc(p, N - HELD - 100, out + 100, why, sizeof(why)) == 0);
	CHECK_EQ(p->n.cached, 0);
	CHECK(kv_pool_alloc(p, 1, out + N - HELD, why, sizeof(why)) == -ENOSPC);
	for (i = 0; i < HELD; i++) {
		hash_of(h, held[i]);
		CHECK(kv_pool_find(p, h) == b[held[i]] && b[held[i]]->ref == 1);
	}
	must_be_consistent(e.ps);
	for (i = 0; i < N - HELD; i++)
		kv_block_unref(out[i]);
	for (i = 0; i < HELD; i++)
		kv_block_unref(b[held[i]]);
	must_be_consistent(e.ps);
	env_free(&e);
}

int main(void)
{
	test_layouts();
	test_lifecycle();
	test_sharing();
	test_copy();
	test_demote();
	test_heap_keys();
	test_lookup_near();
	test_evict_batch();
	test_room_after_demotions();
	test_dev_room();
	test_ref_saturation();
	test_asserts();
	test_free();
	return 0;
}
