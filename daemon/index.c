#include "index.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "hugemem.h"
/* XXH3 inlined: a key is 36 bytes, hashed once per block of every Seal
 * and Lookup, where the library call's dispatch was a tenth of a long
 * lookup's time (issue 38's profile). The same function, the same keys. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvassert.h"

/* Inlined into kv_index_find_many()'s loops (issue 38: called, the key and
 * the compare were two calls a hash of a lookup of 1,000). */
static inline __attribute__((always_inline)) uint64_t ix_key(const struct kv_index *ix,
							     uint32_t pool, const uint8_t *hash)
{
	/* The pool goes into the seed rather than the input: XXH3 of 32
	 * bytes is two 16-byte mixes, of 36 four (issue 38's second profile:
	 * the key was a sixth of a lookup of 1,000 and its release). Still
	 * keyed by the daemon's secret seed; each pool's keys by another. */
	return XXH3_64bits_withSeed(hash, KV_HASH_BYTES,
				    ix->seed ^ ((uint64_t)pool + 1) * 0x9e3779b97f4a7c15ull);
}

/* An empty bucket's probe compares ix->none (no pool's, next NULL) rather
 * than branch on the bucket: a Seal's fresh hashes find a bucket empty or
 * not at random, and that branch missed on a third of them. The hash is
 * compared first, so that ix->none (hash zero) and an entry of another
 * hash take the same branches. */
static inline __attribute__((always_inline)) struct kv_index_entry *
ix_find(const struct kv_index *ix, uint64_t key, uint32_t pool, const uint8_t *hash)
{
	struct kv_index_entry *h = ix->buckets[key & (ix->nbuckets - 1)];
	const struct kv_index_entry *e = h ? h : &ix->none;

	do {
		if (!memcmp(e->hash, hash, KV_HASH_BYTES) && e->pool == pool)
			return e == &ix->none ? NULL : (struct kv_index_entry *)e;
	} while ((e = e->next));
	return NULL;
}

/* The entry at the head of key's bucket, or ix->none: what a probe asks
 * for ahead of its compare, without a branch on an empty bucket. */
static inline __attribute__((always_inline)) const struct kv_index_entry *
ix_head(const struct kv_index *ix, uint64_t key)
{
	const struct kv_index_entry *h = ix->buckets[key & (ix->nbuckets - 1)];

	return h ? h : &ix->none;
}

uint64_t kv_index_key(const struct kv_index *ix, uint32_t pool, const uint8_t *hash)
{
	return ix_key(ix, pool, hash);
}

/* From a huge page on, the bucket array is a mapping of its own in huge
 * pages (hugemem.h: a Seal of fresh hashes reads a random bucket a block);
 * below it, calloc(). A power of two of buckets: whole huge pages. */
static struct kv_index_entry **buckets_alloc(size_t n)
{
	size_t bytes = n * sizeof(struct kv_index_entry *);

	if (bytes < KV_HUGE_BYTES)
		return calloc(n, sizeof(struct kv_index_entry *));
	return kv_huge_map(bytes, 0);
}

static void buckets_free(struct kv_index_entry **b, size_t n)
{
	size_t bytes = n * sizeof(struct kv_index_entry *);

	if (bytes < KV_HUGE_BYTES)
		free(b);
	else
		kv_huge_unmap(b, bytes);
}

static size_t ix_bucket(const struct kv_index *ix, size_t nbuckets, uint32_t pool, const uint8_t *hash)
{
	return (size_t)kv_index_key(ix, pool, hash) & (nbuckets - 1);
}

int kv_index_init(struct kv_index *ix, uint64_t seed)
{
	memset(ix, 0, sizeof(*ix));
	ix->none.pool = UINT32_MAX;
	ix->nbuckets = 1024;
	ix->seed = seed;
	ix->buckets = buckets_alloc(ix->nbuckets);
	return ix->buckets ? 0 : -ENOMEM;
}

void kv_index_fini(struct kv_index *ix)
{
	buckets_free(ix->buckets, ix->nbuckets);
	ix->buckets = NULL;
	ix->count = 0;
}

struct kv_index_entry *kv_index_find(const struct kv_index *ix, uint32_t pool, const uint8_t *hash)
{
	return kv_index_find_key(ix, kv_index_key(ix, pool, hash), pool, hash);
}

struct kv_index_entry *kv_index_find_key(const struct kv_index *ix, uint64_t key, uint32_t pool,
					 const uint8_t *hash)
{
	return ix_find(ix, key, pool, hash);
}

/* How many hashes ahead of the one compared kv_index_find_many() has its
 * chain's head loaded: enough misses in flight to cover a memory latency,
 * few enough that the lines are still cached when compared. 32: a Seal of
 * 256 fresh hashes waited on the heads at 16 (issue 38: its CPU 0.9 us
 * lower at the median of eight alternated pairs). */
#define IX_AHEAD 32

void kv_index_find_many(const struct kv_index *ix, uint32_t pool, const uint8_t *hashes, size_t n,
			uint64_t *key, struct kv_index_entry **out)
{
	size_t mask = ix->nbuckets - 1, i;

	/* Keys first, each bucket's line asked for as soon as its key is
	 * known; then each chain's head a few hashes ahead of its compare. */
	for (i = 0; i < n; i++) {
		key[i] = ix_key(ix, pool, hashes + i * KV_HASH_BYTES);
		__builtin_prefetch(&ix->buckets[key[i] & mask]);
	}
	for (i = 0; i < n && i < IX_AHEAD; i++)
		__builtin_prefetch(ix_head(ix, key[i])->hash);
	for (i = 0; i < n; i++) {
		if (i + IX_AHEAD < n)
			__builtin_prefetch(ix_head(ix, key[i + IX_AHEAD])->hash);
		out[i] = ix_find(ix, key[i], pool, hashes + i * KV_HASH_BYTES);
	}
}

/* Rehashes into twice the buckets. O(count), at most log2(blocks) times in a
 * daemon's life, since the index never shrinks. */
static void ix_grow(struct kv_index *ix)
{
	size_t n = ix->nbuckets * 2, i;
	struct kv_index_entry **b = buckets_alloc(n);

	if (!b)
		return;
	for (i = 0; i < ix->nbuckets; i++) {
		struct kv_index_entry *e = ix->buckets[i], *next;

		for (; e; e = next) {
			size_t k = ix_bucket(ix, n, e->pool, e->hash);

			next = e->next;
			e->next = b[k];
			if (e->next)
				e->next->pprev = &e->next;
			e->pprev = &b[k];
			b[k] = e;
		}
	}
	buckets_free(ix->buckets, ix->nbuckets);
	ix->buckets = b;
	ix->nbuckets = n;
}

void kv_index_insert(struct kv_index *ix, struct kv_index_entry *e)
{
	kv_index_insert_key(ix, e, kv_index_key(ix, e->pool, e->hash));
}

void kv_index_insert_key(struct kv_index *ix, struct kv_index_entry *e, uint64_t key)
{
	size_t k;

	kv_assert(!e->pprev);  /* not linked already */
	/* At most one entry per two buckets: a probe for a hash not there (a
	 * Seal's, mostly) walks the whole chain, one cache miss an entry,
	 * and at one entry a bucket a quarter of the chains had a second
	 * (issue 38: the probes of a Seal of 256 fresh hashes waited on
	 * them). */
	if (ix->count >= ix->nbuckets / 2)
		ix_grow(ix);
	k = key & (ix->nbuckets - 1);
	e->next = ix->buckets[k];
	(e->next ? e->next : &ix->none)->pprev = &e->next;
	e->pprev = &ix->buckets[k];
	ix->buckets[k] = e;
	ix->count++;
}

void kv_index_remove(struct kv_index *ix, struct kv_index_entry *e)
{
	kv_assert(e->pprev && *e->pprev == e && ix->count > 0);  /* e is in the index */
	*e->pprev = e->next;
	(e->next ? e->next : &ix->none)->pprev = e->pprev;
	e->next = NULL;
	e->pprev = NULL;
	ix->count--;
}
