/* The prefix index: (pool, 32-byte content hash) -> block.
 *
 * An open-addressed table (linear probing) of one 64-bit word a slot: the
 * entry's address (48 bits), how far the entry sits from its home slot (8
 * bits, saturated at 255) and a tag of its key (8 bits). The entries stay
 * embedded in what they index, so an insert never allocates (only a resize
 * does); each keeps its key. Issue 38: with chains through the entries, a
 * probe for a hash not there (a Seal's) read the entries of its chain, an
 * insert the head's line and a removal (an eviction) both neighbours'; here
 * a miss reads the table alone (an entry only when its tag matches, 1 in 256
 * of the other slots probed), an insert writes the table alone, and a
 * removal moves later entries of its cluster back into the hole, by the
 * distances in the table (backward-shift deletion: no tombstones, no entry
 * read but past a saturated distance).
 *
 * Home slots come from a keyed hash of the key with a random per-daemon
 * seed: the content hashes arrive from clients, and a client that could pick
 * home slots could build one long cluster that every probe of another tenant
 * walks. The table holds at most one entry per two slots. Keys are unique:
 * inserting a key that is present is the caller's bug. Entry addresses must
 * fit in 48 bits (every user-space address on x86-64 and arm64 Linux unless
 * mmap() is asked for a higher one; an assertion). */
#ifndef KV_INDEX_H
#define KV_INDEX_H

#include <stddef.h>
#include <stdint.h>

#define KV_HASH_BYTES 32

struct kv_index_entry {
	uint64_t key;                   /* kv_index_key() of (pool, hash), while linked */
	uint64_t born_ms;               /* when the prefix was first sealed (CLOCK_MONOTONIC) */
	uint32_t pool;
	uint8_t kind;                   /* what embeds it: KV_ENTRY_BLOCK (G1) or KV_ENTRY_TIER */
	uint8_t linked;                 /* in the table (a zeroed entry is not) */
	uint8_t hash[KV_HASH_BYTES];
};

/* A hash is in the index once, whichever tier holds the block. */
enum { KV_ENTRY_BLOCK, KV_ENTRY_TIER };

struct kv_index {
	uint64_t *slots;  /* 0: empty; else address | distance << 48 | tag << 56 */
	size_t nslots;    /* a power of two */
	size_t count;
	uint64_t seed;
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

/* Links e (its pool and hash set), which must not be linked (as a zeroed
 * entry or one after kv_index_remove()). Grows the table (doubles it) when it
 * holds an entry per two slots; a failed grow is tried again at the next
 * insert and is harmless (clusters get longer) until the table has one empty
 * slot left, which it keeps (an assertion). */
void kv_index_insert(struct kv_index *ix, struct kv_index_entry *e);
void kv_index_insert_key(struct kv_index *ix, struct kv_index_entry *e, uint64_t key);

/* Unlinks e, which must be in the index (an assertion). O(cluster): the
 * later entries of its cluster may move back; no rehash. An entry may
 * move to another slot (kv_index_at()'s walk). */
void kv_index_remove(struct kv_index *ix, struct kv_index_entry *e);

/* Asks for the table's line that a kv_index_remove(e) will write (a hint;
 * reads e->key: e's line had better be there). */
static inline void kv_index_prefetch_remove(const struct kv_index *ix,
					    const struct kv_index_entry *e)
{
	__builtin_prefetch(&ix->slots[e->key & (ix->nslots - 1)], 1);
}

/* Checks the table's invariants (index.c). 0: none broken; else how many
 * slots break one, the first described in what[0..len). O(slots). */
size_t kv_index_check(const struct kv_index *ix, char *what, size_t len);

/* The entry in slot i (< nslots), or NULL: a walk of the whole index in
 * slot order (Dump). Entries move between slots as others are removed and as
 * the table grows. */
static inline struct kv_index_entry *kv_index_at(const struct kv_index *ix, size_t i)
{
	return (struct kv_index_entry *)(uintptr_t)(ix->slots[i] & ((1ull << 48) - 1));
}

#endif
