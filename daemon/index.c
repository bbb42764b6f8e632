#include "index.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hugemem.h"
/* XXH3 inlined: a key is 36 bytes, hashed once per block of every Seal
 * and Lookup, where the library call's dispatch was a tenth of a long
 * lookup's time (issue 38's profile). The same function, the same keys. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvassert.h"

/* A slot: the entry's address in the low 48 bits, its distance from its
 * home slot (saturated) in the next 8, the key's top byte in the top 8. */
#define SLOT_PTR ((1ull << 48) - 1)
#define DIST_SHIFT 48
#define DIST_MAX 255u
#define TAG_SHIFT 56

static inline struct kv_index_entry *slot_entry(uint64_t s)
{
	return (struct kv_index_entry *)(uintptr_t)(s & SLOT_PTR);
}

static inline unsigned slot_dist(uint64_t s)
{
	return (unsigned)(s >> DIST_SHIFT) & DIST_MAX;
}

static inline uint64_t slot_make(const struct kv_index_entry *e, uint64_t key, size_t dist)
{
	uint64_t d = dist < DIST_MAX ? dist : DIST_MAX;

	return (uint64_t)(uintptr_t)e | d << DIST_SHIFT | (key >> TAG_SHIFT) << TAG_SHIFT;
}

/* Slot i's distance from its entry's home in a table of mask + 1 slots: in
 * the slot, or past the saturation from the entry's key. */
static inline size_t slot_far_in(uint64_t s, size_t i, size_t mask)
{
	unsigned d = slot_dist(s);

	return d < DIST_MAX ? d : (i - (slot_entry(s)->key & mask)) & mask;
}

static inline size_t slot_far(const struct kv_index *ix, uint64_t s, size_t i)
{
	return slot_far_in(s, i, ix->nslots - 1);
}

uint64_t kv_index_key(const struct kv_index *ix, uint32_t pool, const uint8_t *hash)
{
	/* The pool goes into the seed rather than the input: XXH3 of 32
	 * bytes is two 16-byte mixes, of 36 four (issue 38's second profile:
	 * the key was a sixth of a lookup of 1,000 and its release). Still
	 * keyed by the daemon's secret seed; each pool's keys by another. */
	return XXH3_64bits_withSeed(hash, KV_HASH_BYTES,
				    ix->seed ^ ((uint64_t)pool + 1) * 0x9e3779b97f4a7c15ull);
}

/* From a huge page on, the table is a mapping of its own in huge pages
 * (hugemem.h: a Seal of fresh hashes reads a random slot a block); below it,
 * calloc(). A power of two of slots: whole huge pages. */
static uint64_t *slots_alloc(size_t n)
{
	size_t bytes = n * sizeof(uint64_t);

	if (bytes < KV_HUGE_BYTES)
		return calloc(n, sizeof(uint64_t));
	return kv_huge_map(bytes, 0);
}

static void slots_free(uint64_t *s, size_t n)
{
	size_t bytes = n * sizeof(uint64_t);

	if (bytes < KV_HUGE_BYTES)
		free(s);
	else
		kv_huge_unmap(s, bytes);
}

int kv_index_init(struct kv_index *ix, uint64_t seed)
{
	memset(ix, 0, sizeof(*ix));
	ix->nslots = 1024;
	ix->seed = seed;
	ix->slots = slots_alloc(ix->nslots);
	return ix->slots ? 0 : -ENOMEM;
}

void kv_index_fini(struct kv_index *ix)
{
	slots_free(ix->slots, ix->nslots);
	ix->slots = NULL;
	ix->count = 0;
}

struct kv_index_entry *kv_index_find(const struct kv_index *ix, uint32_t pool, const uint8_t *hash)
{
	return kv_index_find_key(ix, kv_index_key(ix, pool, hash), pool, hash);
}

struct kv_index_entry *kv_index_find_key(const struct kv_index *ix, uint64_t key, uint32_t pool,
					 const uint8_t *hash)
{
	size_t mask = ix->nslots - 1, i = key & mask, d = 0;
	uint64_t tag = key >> TAG_SHIFT, s;

	/* Ends at an empty slot (the table always keeps one) or at an entry
	 * nearer its home than key would be here: Robin Hood order says key
	 * would have taken that slot. */
	for (; (s = ix->slots[i]); i = (i + 1) & mask, d++) {
		const struct kv_index_entry *e = slot_entry(s);

		if (slot_far(ix, s, i) < d)
			break;
		if (s >> TAG_SHIFT == tag && e->key == key && e->pool == pool &&
		    !memcmp(e->hash, hash, KV_HASH_BYTES))
			return slot_entry(s);
	}
	return NULL;
}

/* How many hashes ahead of the one compared kv_index_find_many() has the
 * entry of its home slot loaded: enough misses in flight to cover a memory
 * latency, few enough that the lines are still cached when compared. */
#define IX_AHEAD 16

/* Asks for the entry in key's home slot when its tag matches (a hit's line;
 * a miss's home slot mostly holds another key, whose entry is not read). */
static inline void ix_prefetch_entry(const struct kv_index *ix, uint64_t key, size_t mask)
{
	uint64_t s = ix->slots[key & mask];

	if (s && s >> TAG_SHIFT == key >> TAG_SHIFT)
		__builtin_prefetch(slot_entry(s));
}

void kv_index_find_many(const struct kv_index *ix, uint32_t pool, const uint8_t *hashes, size_t n,
			uint64_t *key, struct kv_index_entry **out)
{
	size_t mask = ix->nslots - 1, i;

	/* Keys first, each home slot's line asked for as soon as its key is
	 * known; then each home slot's entry a few hashes ahead of its
	 * compare. */
	for (i = 0; i < n; i++) {
		size_t h;

		key[i] = kv_index_key(ix, pool, hashes + i * KV_HASH_BYTES);
		h = key[i] & mask;
		__builtin_prefetch(&ix->slots[h]);
		/* A probe reads about two slots: from the last two of a line
		 * on, the next line too. */
		if ((h & 7) >= 6)
			__builtin_prefetch(&ix->slots[(h + 2) & mask]);
	}
	for (i = 0; i < n && i < IX_AHEAD; i++)
		ix_prefetch_entry(ix, key[i], mask);
	for (i = 0; i < n; i++) {
		if (i + IX_AHEAD < n)
			ix_prefetch_entry(ix, key[i + IX_AHEAD], mask);
		out[i] = kv_index_find_key(ix, key[i], pool, hashes + i * KV_HASH_BYTES);
	}
}

/* Places e under key in slots (mask + 1 of them, an empty one among them),
 * in Robin Hood order: an entry further from its home than the one met
 * takes its slot, and the one met moves on (Celis, 1986). So along a
 * cluster the distances grow at most one a slot, a probe for a key that is
 * not there stops at the first entry nearer its home than the key would be,
 * and a removal's shift stops at the first entry at its home. */
static void slots_put(uint64_t *slots, size_t mask, struct kv_index_entry *e, uint64_t key)
{
	size_t i = key & mask, d = 0;
	uint64_t tag = (key >> TAG_SHIFT) << TAG_SHIFT, s;

	for (; (s = slots[i]); i = (i + 1) & mask, d++) {
		size_t sd = slot_far_in(s, i, mask);

		if (sd < d) {
			slots[i] = slot_make(e, tag, d);
			e = slot_entry(s);
			tag = (s >> TAG_SHIFT) << TAG_SHIFT;
			d = sd;
		}
	}
	slots[i] = slot_make(e, tag, d);
}

/* Rehashes into twice the slots. O(count), at most log2(blocks) times in a
 * daemon's life, since the index never shrinks. */
static void ix_grow(struct kv_index *ix)
{
	size_t n = ix->nslots * 2, i;
	uint64_t *t = slots_alloc(n);

	if (!t)
		return;
	for (i = 0; i < ix->nslots; i++) {
		uint64_t s = ix->slots[i];

		if (s)
			slots_put(t, n - 1, slot_entry(s), slot_entry(s)->key);
	}
	slots_free(ix->slots, ix->nslots);
	ix->slots = t;
	ix->nslots = n;
}

void kv_index_insert(struct kv_index *ix, struct kv_index_entry *e)
{
	kv_index_insert_key(ix, e, kv_index_key(ix, e->pool, e->hash));
}

void kv_index_insert_key(struct kv_index *ix, struct kv_index_entry *e, uint64_t key)
{
	kv_assert(!e->linked);  /* not linked already */
	kv_assert(((uintptr_t)e & ~(uintptr_t)SLOT_PTR) == 0 && e);
	/* At most one entry per two slots: a probe for a hash not there (a
	 * Seal's, mostly) reads slots up to an empty one, and linear probing's
	 * clusters grow fast past half full. */
	if (ix->count >= ix->nslots / 2)
		ix_grow(ix);
	kv_assert(ix->count + 1 < ix->nslots);  /* an empty slot stays */
	e->key = key;
	e->linked = 1;
	slots_put(ix->slots, ix->nslots - 1, e, key);
	ix->count++;
}

void kv_index_remove(struct kv_index *ix, struct kv_index_entry *e)
{
	size_t mask = ix->nslots - 1, i = e->key & mask, j;
	uint64_t s;

	kv_assert(e->linked && ix->count > 0);  /* e is in the index */
	while (slot_entry(ix->slots[i]) != e) {
		kv_assert(ix->slots[i]);  /* e is where its key leads */
		i = (i + 1) & mask;
	}
	/* Backward shift: each later entry of the cluster moves back a slot,
	 * into the hole, up to an empty slot or an entry at its home (Robin
	 * Hood order: nothing after it belongs before it). Every probe that
	 * passed the hole still finds what it sought. */
	for (;; i = j) {
		size_t d;

		j = (i + 1) & mask;
		s = ix->slots[j];
		if (!s || !(d = slot_far(ix, s, j)))
			break;
		ix->slots[i] = slot_make(slot_entry(s), (s >> TAG_SHIFT) << TAG_SHIFT, d - 1);
	}
	ix->slots[i] = 0;
	e->linked = 0;
	ix->count--;
}

/* The table's invariants, for the checker and the tests: every slot's
 * entry linked, under its key's tag, with the distance from its home that
 * the slot says (or more, saturated), no empty slot between its home and it
 * (a probe reaches it), and count entries in all. Returns the number of
 * problems; the first is described in what (at most len bytes). */
size_t kv_index_check(const struct kv_index *ix, char *what, size_t len)
{
	size_t mask = ix->nslots - 1, n = 0, bad = 0, i, k;

	for (i = 0; i < ix->nslots; i++) {
		uint64_t s = ix->slots[i];
		const struct kv_index_entry *e = slot_entry(s);
		size_t far;
		const char *why = NULL;

		if (!s)
			continue;
		n++;
		far = (i - (e->key & mask)) & mask;
		if (!e->linked)
			why = "its entry is not linked";
		else if (s >> TAG_SHIFT != e->key >> TAG_SHIFT)
			why = "its tag is not its key's";
		else if (slot_dist(s) != (far < DIST_MAX ? far : DIST_MAX))
			why = "its distance from home is wrong";
		for (k = 1; !why && k <= far; k++)
			if (!ix->slots[(i - k) & mask])
				why = "an empty slot lies between its home and it";
		if (!why && far && slot_far(ix, ix->slots[(i - 1) & mask], (i - 1) & mask) + 1 < far)
			why = "it is further from its home than the slot before allows (Robin Hood order)";
		if (why && !bad++ && len)
			snprintf(what, len, "index slot %zu of %zu: %s", i, ix->nslots, why);
	}
	if (n != ix->count || n + 1 > ix->nslots) {
		if (!bad++ && len)
			snprintf(what, len, "index: %zu entries in its slots, %zu counted, %zu slots",
				 n, ix->count, ix->nslots);
	}
	return bad;
}
