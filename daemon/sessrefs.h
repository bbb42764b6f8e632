/* The block references one session holds (issue 38: a probe of a hash map
 * per block was a fifth of a lookup of a 1,000-block chain and its release).
 *
 * A block has one owner slot (pool.h: b->owner, b->own): the id of one
 * session and how many of the block's references that session holds. The
 * first session to take a reference on a block nobody owns becomes its owner;
 * the owner's further references go on b->own, with no probe. A session's
 * references on a block somebody else owns go in its map (refmap.h), as
 * before. In the common case (one engine per block) the map stays empty and
 * every add, check and drop is a compare on the block itself.
 *
 * So that the references can be given back when the session goes, the
 * session records the handle of each block it becomes the owner of in
 * owned[]. Nothing is taken off it when the session stops owning the block:
 * it may hold handles gone stale (the block was freed or reused) and the same
 * block more than once. A handle in owned[] is only ever resolved through
 * kv_block_lookup() (a stale one resolves to NULL or to another block, whose
 * owner is then checked), never kept as a pointer: runs are freed. When
 * owned[] must grow and holds more than twice the blocks the session owns,
 * it is compacted first (each owned block once), so its length stays
 * O(blocks owned) amortized, and every append O(1) amortized.
 *
 * Invariants (the checker, kv_op_check(), verifies them through
 * kv_sessrefs_each(): a block's ref is the sum of what sessions and tiers
 * say they hold; check.c the block's own side):
 *   b->owner == 0  iff  b->own == 0;  b->own <= b->ref;  a FREE block has
 *   no owner;
 *   every block whose owner is a session's id is in that session's owned[];
 *   a session's count on b is (b->owner == id ? b->own : 0) + its map's.
 * Single-threaded (the event loop). */
#ifndef KV_SESSREFS_H
#define KV_SESSREFS_H

#include <stddef.h>
#include <stdint.h>

#include "kvassert.h"
#include "pool.h"
#include "refmap.h"

struct kv_sessrefs {
	struct kv_refmap map;   /* references on blocks another session owns */
	uint64_t id;            /* what this session puts in b->owner (never 0) */
	uint64_t *owned;        /* handles of blocks it became the owner of (see above) */
	size_t n, cap;
	uint64_t nowned;        /* blocks whose owner is id */
	uint64_t refs;          /* every reference held: on owned blocks and in map */
};

/* id: the session's id, unique for the daemon's life, not 0 and below 2^63. */
void kv_sessrefs_init(struct kv_sessrefs *r, uint64_t id);
/* Frees the map and owned[]; the references must have been given back
 * (kv_sessrefs_release()). */
void kv_sessrefs_fini(struct kv_sessrefs *r);

/* Makes sure n calls of kv_sessrefs_add() cannot fail. 0 or -ENOMEM. */
int kv_sessrefs_reserve(struct kv_sessrefs *r, struct kv_pools *ps, size_t n);

/* The references r holds on b. */
static inline uint32_t kv_sessrefs_get(const struct kv_sessrefs *r, const struct kv_block *b)
{
	uint32_t n = b->owner == r->id ? b->own : 0;

	return r->map.used ? n + kv_refmap_get(&r->map, b) : n;
}

void kv_sessrefs_add_slow(struct kv_sessrefs *r, struct kv_block *b);

/* Records one more reference of r on b, which the caller has taken
 * (kv_block_ref(), an allocation): so b->ref >= the count. Room was made by
 * kv_sessrefs_reserve(). */
static inline void kv_sessrefs_add(struct kv_sessrefs *r, struct kv_block *b)
{
	if (b->owner == r->id) {
		kv_assert(b->own < b->ref);
		b->own++;
		r->refs++;
		return;
	}
	kv_sessrefs_add_slow(r, b);
}

/* Forgets one reference of r on b, which r must hold (the caller checked with
 * kv_sessrefs_get()); the caller drops or passes on the block's reference. */
static inline void kv_sessrefs_sub(struct kv_sessrefs *r, struct kv_block *b)
{
	kv_assert(r->refs > 0);
	r->refs--;
	if (b->owner == r->id) {
		if (--b->own == 0) {
			b->owner = 0;
			r->nowned--;
		}
		return;
	}
	(void)kv_refmap_sub(&r->map, b);
}

/* Calls fn(b, count, ctx) once for every block r holds references on (a
 * block both owned and in the map: twice, each with its part). Compacts
 * owned[] first. fn must not change r or the blocks' references. Returns 0,
 * or 1 when the blocks naming r their owner are not r->nowned (broken: the
 * checker reports it; a block owned but not listed shows as a ref the
 * sessions do not account for). */
int kv_sessrefs_each(struct kv_sessrefs *r, struct kv_pools *ps,
		     void (*fn)(struct kv_block *b, uint32_t count, void *ctx), void *ctx);

/* Gives back (kv_block_unref()) every reference r holds; r is left empty. */
void kv_sessrefs_release(struct kv_sessrefs *r, struct kv_pools *ps);

#endif
