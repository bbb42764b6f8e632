/* A session's block references; see sessrefs.h. */
#include "sessrefs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Set on b->owner while owned[] is compacted: the block was kept already. */
#define MARK (UINT64_C(1) << 63)

void kv_sessrefs_init(struct kv_sessrefs *r, uint64_t id)
{
	kv_assert(id != 0 && !(id & MARK));
	memset(r, 0, sizeof(*r));
	kv_refmap_init(&r->map);
	r->id = id;
}

void kv_sessrefs_fini(struct kv_sessrefs *r)
{
	kv_assert(r->refs == 0 && r->nowned == 0);
	kv_refmap_fini(&r->map);
	free(r->owned);
	r->owned = NULL;
	r->n = r->cap = 0;
}

/* Leaves in owned[] each block r owns once, in the order first listed.
 * Returns how many: r->nowned unless an invariant is broken. */
static size_t compact(struct kv_sessrefs *r, struct kv_pools *ps)
{
	size_t i, k = 0;

	for (i = 0; i < r->n; i++) {
		struct kv_block *b = kv_block_lookup(ps, r->owned[i]);

		if (b && b->owner == r->id) {
			b->owner |= MARK;
			r->owned[k++] = r->owned[i];
		}
	}
	for (i = 0; i < k; i++) {
		struct kv_block *b = kv_block_lookup(ps, r->owned[i]);

		kv_assert(b && b->owner == (r->id | MARK));
		b->owner = r->id;
	}
	r->n = k;
	return k;
}

int kv_sessrefs_reserve(struct kv_sessrefs *r, struct kv_pools *ps, size_t n)
{
	size_t cap;
	uint64_t *o;

	if (kv_refmap_reserve(&r->map, n) < 0)
		return -ENOMEM;
	if (n <= r->cap - r->n)
		return 0;
	if (r->n >= 2 * r->nowned + 64) {
		/* Every block r owns is listed (sessrefs.h): kept once. */
		size_t k = compact(r, ps);

		kv_assert(k == r->nowned);
		(void)k;
		if (n <= r->cap - r->n)
			return 0;
	}
	cap = r->cap ? r->cap : 64;
	while (cap - r->n < n)
		cap *= 2;
	if (!(o = realloc(r->owned, cap * sizeof(*o))))
		return -ENOMEM;
	r->owned = o;
	r->cap = cap;
	return 0;
}

void kv_sessrefs_add_slow(struct kv_sessrefs *r, struct kv_block *b)
{
	kv_assert(b->ref > 0 && b->state != KV_BLOCK_FREE);
	if (b->owner == 0) {
		/* kv_sessrefs_reserve() made room. */
		kv_assert(r->n < r->cap);
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

int kv_sessrefs_each(struct kv_sessrefs *r, struct kv_pools *ps,
		     void (*fn)(struct kv_block *b, uint32_t count, void *ctx), void *ctx)
{
	struct each_map e = { fn, ctx };
	size_t k = compact(r, ps);

	for (size_t i = 0; i < r->n; i++) {
		struct kv_block *b = kv_block_lookup(ps, r->owned[i]);

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

void kv_sessrefs_release(struct kv_sessrefs *r, struct kv_pools *ps)
{
	/* The map first: it holds no reference on an owned block's behalf,
	 * and a block with references left is not freed, so every owned
	 * block still resolves. */
	kv_refmap_each(&r->map, release_map, NULL);
	kv_refmap_fini(&r->map);
	for (size_t i = 0; i < r->n; i++) {
		struct kv_block *b = kv_block_lookup(ps, r->owned[i]);
		uint32_t n;

		if (!b || b->owner != r->id)
			continue;   /* stale, or listed before and released */
		n = b->own;
		b->owner = 0;
		b->own = 0;
		r->nowned--;
		while (n--)
			kv_block_unref(b);
	}
	kv_assert(r->nowned == 0);
	r->n = 0;
	r->refs = 0;
}
