/* A session's block references (daemon/sessrefs.c) on the real allocator and
 * host backend: the owner slot on the block, the map for blocks another
 * session owns, owned[] across frees and reuse of runs, its compaction, the
 * release at disconnect, the batches' add and sub, and that the checker
 * reports each broken invariant (kv_pools_check() for the block's side,
 * kv_sessrefs_each() and the counted refs for the session's). */
#include <errno.h>
#include <string.h>

#include "backend.h"
#include "check.h"
#include "pool.h"
#include "sessrefs.h"

static int problems;

static void report(void *ctx, const char *msg)
{
	(void)ctx;
	fprintf(stderr, "  checker: %s\n", msg);
	problems++;
}

static void count_ref(struct kv_block *b, uint32_t count, void *ctx)
{
	(void)ctx;
	b->check += count;
}

/* The daemon's Check (ops_admin.c) with sessions a and b and nothing else
 * holding references: the number of problems found. */
static int check(struct kv_pools *ps, struct kv_sessrefs *a, struct kv_sessrefs *b)
{
	uint64_t blocks;
	struct kv_pool *p;
	int lost = 0;

	problems = 0;
	kv_pools_check_clear(ps);
	lost += kv_sessrefs_each(a, count_ref, NULL);
	lost += kv_sessrefs_each(b, count_ref, NULL);
	/* The test's pools keep the hold kv_pool_register() gave. */
	for (uint32_t id = 0; id < KV_MAX_POOLS; id++)
		if ((p = kv_pool_get(ps, id)))
			p->check_holds = p->holds;
	return lost + kv_pools_check(ps, 1, report, NULL, &blocks, 0);
}

/* The allocator's own check (no session counts): the block's side. */
static int check_pools(struct kv_pools *ps)
{
	uint64_t blocks;

	problems = 0;
	return kv_pools_check(ps, 0, report, NULL, &blocks, 0);
}

struct env {
	struct kv_backend *be;
	struct kv_pools *ps;
	struct kv_pool *p;
};

static void env_new(struct env *e)
{
	struct kv_pool_desc d = { .name = "p", .block_bytes = 16384, .block_tokens = 16,
				  .dtype = "fp16" };
	char err[256];

	/* 2 segments of 8 pages of 64 KiB: 4 blocks a run of one page. */
	CHECK(kv_backend_host_create(65536ull * 8, 2, &e->be) == 0);
	CHECK(kv_pools_create(e->be, 65536, &e->ps) == 0);
	CHECK(kv_pools_ns(e->ps, "t") == 1);
	CHECK(kv_pool_register(e->ps, 1, &d, &e->p, err, sizeof(err)) >= 0);
}

static void env_free(struct env *e)
{
	kv_pools_destroy(e->ps);
	kv_backend_destroy(e->be);
}

static void hash_of(uint8_t *h, int i)
{
	memset(h, 0, KV_HASH_BYTES);
	memcpy(h, &i, sizeof(i));
	h[31] = 0xa5;
}

/* Owner, map, both, and the release of each. */
static void test_owner_and_map(void)
{
	struct env e;
	struct kv_sessrefs a, b;
	struct kv_block *x[4];
	uint8_t h[KV_HASH_BYTES];
	char why[512];

	env_new(&e);
	kv_sessrefs_init(&a, 1, e.ps);
	kv_sessrefs_init(&b, 2, e.ps);
	CHECK(kv_sessrefs_reserve(&a, 4) == 0 && kv_sessrefs_reserve(&b, 4) == 0);
	CHECK(kv_pool_alloc(e.p, 4, x, why, sizeof(why)) == 0);
	for (int i = 0; i < 4; i++)
		kv_sessrefs_add(&a, x[i]);
	CHECK(x[0]->owner == 1 && x[0]->own == 1 && a.nowned == 4 && a.refs == 4);
	CHECK(a.map.used == 0);
	CHECK_EQ(check(e.ps, &a, &b), 0);

	/* Sealed and shared: a holds x[0] twice (fork), b once (lookup). */
	hash_of(h, 0);
	CHECK(kv_pool_seal(e.p, x[0], h) == x[0]);
	CHECK(kv_block_ref(x[0]) == 0);
	kv_sessrefs_add(&a, x[0]);
	CHECK(kv_block_ref(x[0]) == 0);
	kv_sessrefs_add(&b, x[0]);
	CHECK_EQ(kv_sessrefs_get(&a, x[0]), 2);
	CHECK_EQ(kv_sessrefs_get(&b, x[0]), 1);
	CHECK(x[0]->owner == 1 && x[0]->own == 2 && b.map.used == 1 && b.nowned == 0);
	CHECK_EQ(kv_sessrefs_get(&b, x[1]), 0);
	CHECK_EQ(check(e.ps, &a, &b), 0);

	/* a lets go of x[0]: still its owner, holding none; a's next
	 * reference is an add on the block again, nothing listed. */
	kv_sessrefs_sub(&a, x[0]);
	kv_block_unref(x[0]);
	kv_sessrefs_sub(&a, x[0]);
	kv_block_unref(x[0]);
	CHECK(x[0]->owner == 1 && x[0]->own == 0 && a.nowned == 3);
	CHECK_EQ(kv_sessrefs_get(&a, x[0]), 0);
	CHECK_EQ(check(e.ps, &a, &b), 0);
	CHECK(x[0]->owner == 0);  /* the check's compaction gave it up */
	CHECK(kv_block_ref(x[0]) == 0);
	kv_sessrefs_add(&a, x[0]);
	CHECK(x[0]->owner == 1 && x[0]->own == 1 && a.nowned == 4);
	{
		size_t n = a.n;

		kv_sessrefs_sub(&a, x[0]);
		kv_block_unref(x[0]);
		CHECK(kv_block_ref(x[0]) == 0);
		kv_sessrefs_add(&a, x[0]);
		CHECK(a.n == n && x[0]->own == 1);  /* nothing appended */
		kv_sessrefs_sub(&a, x[0]);
		kv_block_unref(x[0]);
	}
	/* b's next reference takes it over (a holds none) while b's first
	 * stays in its map: both parts count. */
	CHECK(kv_block_ref(x[0]) == 0);
	kv_sessrefs_add(&b, x[0]);
	CHECK(x[0]->owner == 2 && x[0]->own == 1 && b.map.used == 1);
	CHECK_EQ(kv_sessrefs_get(&b, x[0]), 2);
	CHECK_EQ(check(e.ps, &a, &b), 0);

	CHECK_EQ(kv_sessrefs_get(&a, x[0]), 0);
	CHECK_EQ(check(e.ps, &a, &b), 0);
	/* a goes (a disconnect): its WRITABLE blocks are freed, x[0] is b's. */
	kv_sessrefs_release(&a);
	CHECK(a.refs == 0 && a.nowned == 0 && a.n == 0);
	kv_sessrefs_fini(&a);
	CHECK(x[1]->state == KV_BLOCK_FREE && x[1]->owner == 0);
	CHECK(x[0]->ref == 2);
	kv_sessrefs_init(&a, 3, e.ps);
	CHECK_EQ(check(e.ps, &a, &b), 0);
	/* b goes: x[0] is cached, owned by nobody. */
	kv_sessrefs_release(&b);
	kv_sessrefs_fini(&b);
	CHECK(x[0]->state == KV_BLOCK_CACHED && x[0]->ref == 0 && x[0]->owner == 0);
	kv_sessrefs_init(&b, 4, e.ps);
	CHECK_EQ(check(e.ps, &a, &b), 0);
	kv_sessrefs_fini(&a);
	kv_sessrefs_fini(&b);
	env_free(&e);
}

/* kv_sessrefs_add_many() and kv_sessrefs_sub_many() (a Lookup's and a
 * Release's batches): the same counts as one add or sub a block, over a
 * batch that lists blocks twice, blocks another session owns (the map),
 * and a block the session owns with none of its references (own 0). */
static void test_many(void)
{
	struct env e;
	struct kv_sessrefs a, b;
	struct kv_block *x[4];
	char why[512];

	env_new(&e);
	kv_sessrefs_init(&a, 1, e.ps);
	kv_sessrefs_init(&b, 2, e.ps);
	CHECK(kv_sessrefs_reserve(&a, 16) == 0 && kv_sessrefs_reserve(&b, 16) == 0);
	CHECK(kv_pool_alloc(e.p, 4, x, why, sizeof(why)) == 0);
	kv_sessrefs_add(&a, x[0]);
	kv_sessrefs_add(&a, x[1]);
	kv_sessrefs_add(&b, x[2]);
	kv_sessrefs_add(&b, x[3]);
	/* x[1]: b takes a reference (its map), a lets go of its own. */
	CHECK(kv_block_ref(x[1]) == 0);
	kv_sessrefs_add(&b, x[1]);
	kv_sessrefs_sub(&a, x[1]);
	kv_block_unref(x[1]);
	/* (No check() here: its compaction would give x[1] up.) */
	CHECK(x[1]->owner == 1 && x[1]->own == 0 && a.nowned == 1 && a.refs == 1);
	{
		struct kv_block *batch[7] = { x[0], x[2], x[1], x[0], x[3], x[2], x[1] };

		for (int i = 0; i < 7; i++)
			CHECK(kv_block_ref(batch[i]) == 0);
		kv_sessrefs_add_many(&a, batch, 7);
		CHECK_EQ(kv_sessrefs_get(&a, x[0]), 3);
		CHECK_EQ(kv_sessrefs_get(&a, x[1]), 2);
		CHECK_EQ(kv_sessrefs_get(&a, x[2]), 2);
		CHECK_EQ(kv_sessrefs_get(&a, x[3]), 1);
		CHECK(a.refs == 8 && a.nowned == 2 && a.map.used == 2);
		CHECK(x[1]->owner == 1 && x[1]->own == 2);
		CHECK(b.refs == 3 && b.nowned == 2);
		CHECK_EQ(check(e.ps, &a, &b), 0);
		kv_sessrefs_sub_many(&a, batch, 7);
		for (int i = 0; i < 7; i++)
			kv_block_unref(batch[i]);
		CHECK_EQ(kv_sessrefs_get(&a, x[0]), 1);
		CHECK_EQ(kv_sessrefs_get(&a, x[1]), 0);
		CHECK_EQ(kv_sessrefs_get(&a, x[2]), 0);
		CHECK(a.refs == 1 && a.nowned == 1 && a.map.used == 0);
		CHECK_EQ(check(e.ps, &a, &b), 0);
	}
	kv_sessrefs_release(&a);
	kv_sessrefs_release(&b);
	kv_sessrefs_fini(&a);
	kv_sessrefs_fini(&b);
	CHECK(e.p->n.writable == 0);
	env_free(&e);
}

/* owned[] across churn: blocks freed, runs given back and made again, the
 * same block owned again under a new generation. It stays O(blocks owned),
 * its stale handles never resolve to a block it does not own, and the
 * release gives back exactly what is held. */
static void test_churn(void)
{
	struct env e;
	struct kv_sessrefs a, b;
	struct kv_block *keep[4], *x[8];
	char why[512];

	env_new(&e);
	kv_sessrefs_init(&a, 7, e.ps);
	kv_sessrefs_init(&b, 8, e.ps);
	CHECK(kv_sessrefs_reserve(&a, 4) == 0);
	CHECK(kv_pool_alloc(e.p, 4, keep, why, sizeof(why)) == 0);
	for (int i = 0; i < 4; i++)
		kv_sessrefs_add(&a, keep[i]);
	for (int round = 0; round < 5000; round++) {
		CHECK(kv_sessrefs_reserve(&a, 8) == 0);
		CHECK(kv_pool_alloc(e.p, 8, x, why, sizeof(why)) == 0);
		for (int i = 0; i < 8; i++)
			kv_sessrefs_add(&a, x[i]);
		/* owned[] does not grow with the churn: it is compacted
		 * before it grows past twice what a owns and the slack. */
		CHECK(a.cap <= 4 * (a.nowned + 64 + 8));
		for (int i = 0; i < 8; i++) {
			kv_sessrefs_sub(&a, x[i]);
			kv_block_unref(x[i]);   /* WRITABLE, ref 0: freed */
		}
		if (round % 1000 == 0)
			CHECK_EQ(check(e.ps, &a, &b), 0);
	}
	CHECK(a.nowned == 4 && a.refs == 4);
	CHECK_EQ(check(e.ps, &a, &b), 0);
	CHECK(a.n == 4);  /* check() compacted it */
	kv_sessrefs_release(&a);
	kv_sessrefs_fini(&a);
	kv_sessrefs_fini(&b);
	/* All given back (their run may be gone: no look at keep[]). */
	CHECK(e.p->n.writable == 0 && e.p->n.sealed == 0);
	CHECK_EQ(check(e.ps, &a, &b), 0);
	env_free(&e);
}

/* Each broken invariant is reported, and the allocator refuses to free an
 * owned block. */
static void test_broken(void)
{
	struct env e;
	struct kv_sessrefs a, b;
	struct kv_block *x[4], *y;
	char why[512];

	env_new(&e);
	kv_sessrefs_init(&a, 1, e.ps);
	kv_sessrefs_init(&b, 2, e.ps);
	CHECK(kv_sessrefs_reserve(&a, 4) == 0);
	CHECK(kv_pool_alloc(e.p, 4, x, why, sizeof(why)) == 0);
	for (int i = 0; i < 3; i++)
		kv_sessrefs_add(&a, x[i]);
	/* x[3] is held by nobody the checker knows of. */
	CHECK(check(e.ps, &a, &b) > 0);
	kv_sessrefs_add(&a, x[3]);
	CHECK_EQ(check(e.ps, &a, &b), 0);

	/* The owner slot: more than the block's references, a count with no
	 * owner, an owner on a FREE block: the allocator's check alone sees
	 * each. An owner holding none is no fault of the block's (a's count
	 * of what it holds is then wrong). */
	x[0]->own = 2;
	CHECK(check_pools(e.ps) > 0 && check(e.ps, &a, &b) > 0);
	x[0]->own = 1;
	x[1]->own = 0;
	CHECK(check_pools(e.ps) == 0 && check(e.ps, &a, &b) > 0);
	x[1]->own = 1;
	x[1]->owner = 1;
	CHECK(a.n < a.cap);
	a.owned[a.n++] = kv_block_handle(x[1]);  /* the check gave it up */
	CHECK_EQ(check(e.ps, &a, &b), 0);
	x[2]->owner = 0;
	CHECK(check_pools(e.ps) > 0 && check(e.ps, &a, &b) > 0);
	/* The check's compaction dropped x[2] from owned[] meanwhile (it
	 * named no owner): listed again. */
	x[2]->owner = 1;
	CHECK(a.n < a.cap);
	a.owned[a.n++] = kv_block_handle(x[2]);
	CHECK_EQ(check(e.ps, &a, &b), 0);

	/* A block naming a as its owner that a does not list: a reference
	 * taken but not recorded. */
	CHECK(kv_pool_alloc(e.p, 1, &y, why, sizeof(why)) == 0);
	kv_block_unref(y);
	CHECK(y->state == KV_BLOCK_FREE);
	y->owner = 9;
	y->own = 0;
	CHECK(check_pools(e.ps) > 0);
	y->owner = 0;
	CHECK_EQ(check_pools(e.ps), 0);
	CHECK(kv_pool_alloc(e.p, 1, &y, why, sizeof(why)) == 0);
	y->owner = 1;
	y->own = 1;
	a.nowned++;
	a.refs++;
	CHECK(check(e.ps, &a, &b) > 0);
	y->owner = 0;
	y->own = 0;
	a.nowned--;
	a.refs--;
	kv_block_unref(y);
	CHECK_EQ(check(e.ps, &a, &b), 0);
	/* A block whose owner does not list it, holding none of its
	 * references (b holds its one in its map): only the listing rule
	 * sees it. */
	CHECK(kv_sessrefs_reserve(&b, 1) == 0);
	CHECK(kv_pool_alloc(e.p, 1, &y, why, sizeof(why)) == 0);
	CHECK(kv_refmap_add(&b.map, y) == 0);
	b.refs++;
	CHECK_EQ(check(e.ps, &a, &b), 0);
	y->owner = 2;
	CHECK_EQ(check_pools(e.ps), 0);
	CHECK(check(e.ps, &a, &b) > 0);
	y->owner = 0;
	kv_sessrefs_sub(&b, y);
	kv_block_unref(y);
	CHECK_EQ(check(e.ps, &a, &b), 0);
	/* A session counting a block as owned that no block names. */
	a.nowned++;
	CHECK(check(e.ps, &a, &b) > 0);
	a.nowned--;
	CHECK_EQ(check(e.ps, &a, &b), 0);

	/* Freeing a block that still names an owner aborts; so does a count
	 * over the block's references at a transition. */
	CHECK_ABORTS(kv_block_unref(x[0]));
	CHECK_ABORTS({ x[1]->own = 2; kv_block_assert_state(x[1]); });
	CHECK_EQ(check(e.ps, &a, &b), 0);
	kv_sessrefs_release(&a);
	kv_sessrefs_fini(&a);
	kv_sessrefs_fini(&b);
	CHECK_EQ(check(e.ps, &a, &b), 0);
	env_free(&e);
}

int main(void)
{
	test_owner_and_map();
	test_many();
	test_churn();
	test_broken();
	return 0;
}
