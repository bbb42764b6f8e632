/* A session's block references; see sessrefs.h. */
#include "sessrefs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Set on b->owner while owned[] is compacted: the block was kept already. */
#define MARK (UINT64_C(1) << 63)

void kv_sessrefs_init(struct kv_sessrefs *r, uint64_t id, struct kv_pools *ps)
{
	kv_assert(id != 0 && !(id & MARK));
	memset(r, 0, sizeof(*r));
	kv_refmap_init(&r->map);
	r->id = id;
	r->ps = ps;
}

void kv_sessrefs_fini(struct kv_sessrefs *r)
{
	kv_assert(r->refs == 0 && r->nowned == 0);
	kv_refmap_fini(&r->map);
	free(r->owned);
	r->owned = NULL;
	r->n = r->cap = 0;
}

/* Leaves in owned[] each block r holds references on as its owner, once, in
 * the order first listed; the blocks it owns with none are given up (their
 * owner cleared). Sets b->listed on those kept if listed. Returns how many:
 * r->nowned unless an invariant is broken. */
static size_t compact(struct kv_sessrefs *r, int listed)
{
	struct kv_block *near = NULL;   /* nothing is freed meanwhile */
	size_t i, k = 0;

	for (i = 0; i < r->n; i++) {
		struct kv_block *b = kv_block_lookup_near(r->ps, r->owned[i], near);

		if (b)
			near = b;
		if (!b || b->owner != r->id)
			continue;   /* stale, taken over, or kept already */
		if (b->own == 0) {
			b->owner = 0;
			continue;
		}
		b->owner |= MARK;
		r->owned[k++] = r->owned[i];
	}
	near = NULL;
	for (i = 0; i < k; i++) {
		struct kv_block *b = kv_block_lookup_near(r->ps, r->owned[i], near);

		kv_assert(b && b->owner == (r->id | MARK));
		near = b;
		b->owner = r->id;
		if (listed)
			b->listed = 1;
	}
	r->n = k;
	return k;
}

int kv_sessrefs_reserve(struct kv_sessrefs *r, size_t n)
{
	/* owned[] needs no room: a block that cannot be listed goes in the
	 * map (kv_sessrefs_add_slow()). */
	return kv_refmap_reserve(&r->map, n);
}

/* Room for one more handle in owned[]: 1, or 0 when there is no memory. */
static int owned_room(struct kv_sessrefs *r)
{
	size_t cap;
	uint64_t *o;

	if (r->n < r->cap)
		return 1;
	if (r->n >= 2 * r->nowned + 64) {
		/* Every block r holds references on as owner is listed
		 * (sessrefs.h): each is kept once. */
		size_t k = compact(r, 0);

		kv_assert(k == r->nowned);
		(void)k;
		if (r->n < r->cap)
			return 1;
	}
	cap = r->cap ? 2 * r->cap : 64;
	if (!(o = realloc(r->owned, cap * sizeof(*o))))
		return 0;
	r->owned = o;
	r->cap = cap;
	return 1;
}

void kv_sessrefs_add_slow(struct kv_sessrefs *r, struct kv_block *b)
{
	kv_assert(b->ref > 0 && b->state != KV_BLOCK_FREE);
	if (b->own == 0 && owned_room(r)) {
		/* Nobody holds references as its owner: r becomes it. */
		r->owned[r->n++] = kv_block_handle(b);
		b->owner = r->id;
		b->own = 1;
		r->nowned++;
	} else {
		/* Cannot fail: room was reserved, and a session's count on b
		 * is at most b->ref <= KV_BLOCK_REF_MAX = KV_REFMAP_COUNT_MAX. */
		int rc = kv_refmap_add(&r->map, b);

		kv_assert(rc == 0);
		(void)rc;
	}
	r->refs++;
}

struct each_map {
	void (*fn)(struct kv_block *b, uint32_t count, void *ctx);
	void *ctx;
};

static void each_map(void *key, uint32_t count, void *ctx)
{
	struct each_map *e = ctx;

	e->fn(key, count, e->ctx);
}

int kv_sessrefs_each(struct kv_sessrefs *r,
		     void (*fn)(struct kv_block *b, uint32_t count, void *ctx), void *ctx)
{
	struct each_map e = { fn, ctx };
	size_t k = compact(r, 1);

	for (size_t i = 0; i < r->n; i++) {
		struct kv_block *b = kv_block_lookup(r->ps, r->owned[i]);

		fn(b, b->own, ctx);
	}
	kv_refmap_each(&r->map, each_map, &e);
	return k != r->nowned;
}

static void release_map(void *key, uint32_t count, void *ctx)
{
	(void)ctx;
	while (count--)
		kv_block_unref(key);
}

void kv_sessrefs_release(struct kv_sessrefs *r)
{
	/* The map first: it holds no reference on an owned block's behalf,
	 * and a block with references left is not freed, so every owned
	 * block still resolves. */
	kv_refmap_each(&r->map, release_map, NULL);
	kv_refmap_fini(&r->map);
	for (size_t i = 0; i < r->n; i++) {
		struct kv_block *b = kv_block_lookup(r->ps, r->owned[i]);
		uint32_t n;

		if (!b || b->owner != r->id)
			continue;   /* stale, taken over, or listed before */
		n = b->own;
		b->owner = 0;
		b->own = 0;
		if (n)
			r->nowned--;
		while (n--)
			kv_block_unref(b);
	}
	kv_assert(r->nowned == 0);
	r->n = 0;
	r->refs = 0;
}
