/* The references one session holds: block -> count, an open-addressing hash
 * map with linear probing and backward-shift deletion (no tombstones), so
 * every operation is O(1) expected whatever the churn.
 *
 * A count stops at KV_REFMAP_COUNT_MAX: kv_refmap_sub() returns it as an int.
 * The daemon never gets there first: a session's count on a block is at most
 * the block's ref, which stops at KV_BLOCK_REF_MAX (pool.h), no higher. refs,
 * the sum of the counts, is a uint64_t: it would take 2^33 keys at the
 * maximum count to overflow it.
 *
 * A block a session holds has ref >= 1 and therefore cannot be freed, so the
 * block pointer is a stable key for as long as it is in the map. */
#ifndef KV_REFMAP_H
#define KV_REFMAP_H

#include <stddef.h>
#include <stdint.h>

#define KV_REFMAP_COUNT_MAX 0x7fffffffu  /* INT32_MAX */

struct kv_refmap_slot {
	void *key;
	uint32_t count;
};

struct kv_refmap {
	struct kv_refmap_slot *slots;
	size_t cap;    /* a power of two, or 0 */
	size_t used;   /* distinct keys */
	uint64_t refs; /* sum of counts */
};

void kv_refmap_init(struct kv_refmap *m);
void kv_refmap_fini(struct kv_refmap *m);

/* The count held on key (0 if none). */
uint32_t kv_refmap_get(const struct kv_refmap *m, const void *key);

/* Adds one reference. Returns 0, or -ENOMEM, or -EOVERFLOW when key's count
 * is KV_REFMAP_COUNT_MAX already; on an error nothing changed. */
int kv_refmap_add(struct kv_refmap *m, void *key);

/* Makes sure one more kv_refmap_add() of a new key cannot fail; n keys.
 * Returns 0 or -ENOMEM. */
int kv_refmap_reserve(struct kv_refmap *m, size_t n);

/* Drops one reference, which must be held (an assertion: callers check with
 * kv_refmap_get() first). Returns the count left. */
int kv_refmap_sub(struct kv_refmap *m, const void *key);

/* Calls fn(key, count, ctx) for every held key. fn must not change m. */
void kv_refmap_each(const struct kv_refmap *m, void (*fn)(void *key, uint32_t count, void *ctx),
		    void *ctx);

#endif
