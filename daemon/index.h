/* The prefix index: (pool, 32-byte content hash) -> block.
 *
 * A chained hash table over entries embedded in the blocks themselves, so an
 * insert never allocates (only a resize does). Bucket positions come from a
 * keyed hash of the key with a random per-daemon seed: the content hashes
 * arrive from clients, and a client that could pick bucket positions could
 * make every lookup of another tenant walk one long chain. Keys are unique:
 * inserting a key that is present is the caller's bug. */
#ifndef KV_INDEX_H
#define KV_INDEX_H

#include <stddef.h>
#include <stdint.h>

#define KV_HASH_BYTES 32

struct kv_index_entry {
	struct kv_index_entry *next;
	struct kv_index_entry **pprev;  /* what points at this entry: O(1) removal */
	uint64_t born_ms;               /* when the prefix was first sealed (CLOCK_MONOTONIC) */
	uint32_t pool;
	uint8_t kind;                   /* what embeds it: KV_ENTRY_BLOCK (G1) or KV_ENTRY_TIER */
	uint8_t hash[KV_HASH_BYTES];
};

/* A hash is in the index once, whichever tier holds the block. */
enum { KV_ENTRY_BLOCK, KV_ENTRY_TIER };

struct kv_index {
	struct kv_index_entry **buckets;
	size_t nbuckets;  /* a power of two */
	size_t count;
	uint64_t seed;
	/* Never linked: what a probe compares in place of an empty bucket's
	 * head (its pool no pool's, its next NULL), and whose pprev an insert
	 * into an empty bucket, or the removal of a chain's last entry, writes
	 * in place of a neighbour's, so that neither branches on whether
	 * there is one (issue 38: those branches, taken at random, were a
	 * third of the index's time in a Seal of 256). Read or written by
	 * nobody else. */
	struct kv_index_entry none;
};

/* Returns 0 or -ENOMEM. */
int kv_index_init(struct kv_index *ix, uint64_t seed);
void kv_index_fini(struct kv_index *ix);

struct kv_index_entry *kv_index_find(const struct kv_index *ix, uint32_t pool, const uint8_t *hash);
/* kv_index_find() of n hashes (KV_HASH_BYTES each) of pool at once: their
 * keys into key[0..n) and what the index holds under each into out[0..n)
 * (NULL: absent). The same answers as n calls, with the probes' memory
 * loads overlapped (prefetched a few hashes ahead) instead of one miss
 * after another: what a batch (Seal, Lookup) costs per block in a large
 * index is its cache misses. */
void kv_index_find_many(const struct kv_index *ix, uint32_t pool, const uint8_t *hashes, size_t n,
			uint64_t *key, struct kv_index_entry **out);

/* The keyed hash of (pool, hash) that places it in the table: a caller that
 * finds and then inserts one key (a seal) computes it once and passes it to
 * the _key variants; it also serves as a well-spread, unguessable hash of
 * the key for the caller's own tables. */
uint64_t kv_index_key(const struct kv_index *ix, uint32_t pool, const uint8_t *hash);
struct kv_index_entry *kv_index_find_key(const struct kv_index *ix, uint64_t key, uint32_t pool,
					 const uint8_t *hash);

/* Links e (its pool and hash set), which must not be linked: pprev NULL, as
 * in a zeroed entry or after kv_index_remove(). Grows the table (doubles it)
 * when it holds an entry per two buckets; a failed grow is harmless (chains
 * get longer). */
void kv_index_insert(struct kv_index *ix, struct kv_index_entry *e);
void kv_index_insert_key(struct kv_index *ix, struct kv_index_entry *e, uint64_t key);

/* Unlinks e, which must be in the index (an assertion), and clears its
 * pprev. O(1): no rehash, no chain walk. */
void kv_index_remove(struct kv_index *ix, struct kv_index_entry *e);

#endif
