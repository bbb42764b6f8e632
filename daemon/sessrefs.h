/* The block references one session holds (issue 38: a probe of a hash map
 * per block was a fifth of a lookup of a 1,000-block chain and its release).
 *
 * A block has one owner slot (pool.h: b->owner, b->own): the id of one
 * session and how many of the block's references that session holds. A
 * session that references a block with no owner, or whose owner holds none
 * of its references (own == 0), becomes its owner and lists the block's
 * handle in owned[]; the owner's references on it are then an add on the
 * block, with no probe. A session's references on a block another session
 * owns (own > 0) go in its map (refmap.h), as before. In the common case (one
 * engine per block) the map stays empty.
 *
 * The owner stays when its count drops to 0 (a Release): the block stays
 * listed, and the next Lookup of the same chain by the same session finds
 * itself the owner again without appending anything. The allocator clears
 * the owner when it frees the block; another session takes it over while
 * own == 0; the session's compaction of owned[] forgets it.
 *
 * Nothing is taken off owned[] when the session stops owning a block: it may
 * hold handles gone stale (the block was freed or reused, or taken over) and
 * the same block more than once. A handle in owned[] is only resolved through
 * kv_block_lookup() (a stale one resolves to NULL or to a block whose owner
 * is then checked), never kept as a pointer: runs are freed. When owned[] is
 * full and holds at least twice the blocks the session holds references on
 * (plus 64), it is compacted (each such block once; blocks it owns with
 * own == 0 are given up), else it grows; if it cannot grow, the reference
 * goes in the map, for which room was reserved. So owned[] stays O(blocks
 * held) and each append is O(1) amortized.
 *
 * Invariants (check.c verifies the block's side; kv_op_check() the
 * session's, through kv_sessrefs_each() and the counted refs):
 *   b->owner == 0 implies b->own == 0;  b->own <= b->ref;  a FREE block
 *   has no owner;
 *   every block whose owner is a session's id is in that session's owned[];
 *   r->nowned is the number of blocks with owner == r->id and own > 0;
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
	uint64_t nowned;        /* blocks whose owner is id, with own > 0 */
	struct kv_pools *ps;    /* the blocks' allocator (kv_block_lookup()) */
	uint64_t refs;          /* every reference held: on owned blocks and in map */
};

/* id: the session's id, unique for the daemon's life, not 0 and below 2^63;
 * ps: the allocator of every block it will hold. */
void kv_sessrefs_init(struct kv_sessrefs *r, uint64_t id, struct kv_pools *ps);
/* Frees the map and owned[]; the references must have been given back
 * (kv_sessrefs_release()). */
void kv_sessrefs_fini(struct kv_sessrefs *r);

/* Makes sure n calls of kv_sessrefs_add() cannot fail. 0 or -ENOMEM. */
int kv_sessrefs_reserve(struct kv_sessrefs *r, size_t n);

/* The references r holds on b. */
static inline uint32_t kv_sessrefs_get(const struct kv_sessrefs *r, const struct kv_block *b)
{
	uint32_t n = b->owner == r->id ? b->own : 0;

	return r->map.used ? n + kv_refmap_get(&r->map, b) : n;
}

void kv_sessrefs_add_slow(struct kv_sessrefs *r, struct kv_block *b);

/* Records one more reference of r on each of blk[0..n) in turn (a block
 * listed twice gets two), which the caller has taken (kv_block_ref(), an
 * allocation): so b->ref >= the count. Room was made by
 * kv_sessrefs_reserve(). r's counts are kept in registers over the batch:
 * the compiler cannot tell r's fields from the blocks' it writes
 * (-fno-strict-aliasing), and reloaded r->id and stored the counts once a
 * block (issue 38: the counts were a tenth of a lookup of 1,000). */
static inline void kv_sessrefs_add_many(struct kv_sessrefs *r, struct kv_block *const *blk,
					size_t n)
{
	const uint64_t id = r->id;
	uint64_t refs = 0, nowned = 0;

	for (size_t i = 0; i < n; i++) {
		struct kv_block *b = blk[i];

		if (b->owner != id) {
			r->refs += refs;
			r->nowned += nowned;
			refs = nowned = 0;
			kv_sessrefs_add_slow(r, b);
			continue;
		}
		kv_assert(b->own < b->ref);
		nowned += b->own++ == 0;
		refs++;
	}
	r->refs += refs;
	r->nowned += nowned;
}

/* kv_sessrefs_add_many() of b alone. */
static inline void kv_sessrefs_add(struct kv_sessrefs *r, struct kv_block *b)
{
	kv_sessrefs_add_many(r, &b, 1);
}

/* Forgets one reference of r on each of blk[0..n) in turn, which r must
 * hold (the caller checked with kv_sessrefs_get()); the caller drops or
 * passes on the blocks' references. The counts as above. */
static inline void kv_sessrefs_sub_many(struct kv_sessrefs *r, struct kv_block *const *blk,
					size_t n)
{
	const uint64_t id = r->id;
	uint64_t gone = 0;

	kv_assert(r->refs >= n);
	r->refs -= n;
	for (size_t i = 0; i < n; i++) {
		struct kv_block *b = blk[i];

		/* At own 0 r stays the owner, listed: see above. */
		if (b->owner == id && b->own > 0)
			gone += --b->own == 0;
		else
			(void)kv_refmap_sub(&r->map, b);
	}
	r->nowned -= gone;
}

/* kv_sessrefs_sub_many() of b alone. */
static inline void kv_sessrefs_sub(struct kv_sessrefs *r, struct kv_block *b)
{
	kv_sessrefs_sub_many(r, &b, 1);
}

/* Calls fn(b, count, ctx) once for every block r holds references on (a
 * block both owned and in the map: twice, each with its part). Compacts
 * owned[] first, and sets b->listed on each block it keeps there (the
 * checker's scratch: kv_pools_check() with refs wants it on every block that
 * names an owner). fn must not change r or the blocks' references. Returns
 * 0, or 1 when the listed blocks r holds references on are not r->nowned
 * (broken: the checker reports it). */
int kv_sessrefs_each(struct kv_sessrefs *r,
		     void (*fn)(struct kv_block *b, uint32_t count, void *ctx), void *ctx);

/* Gives back (kv_block_unref()) every reference r holds; r is left empty. */
void kv_sessrefs_release(struct kv_sessrefs *r);

#endif
