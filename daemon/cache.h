/* The prefix cache across G1-G4: the one module that decides what a lookup
 * finds, what a seal publishes and when an allocation waits for room.
 *
 * The pools (pool.h) are the G1 mechanism, the tiers (tier.h) the G2-G4
 * engines, the index (index.h) where a hash is; this module is the policy
 * that spans them. The request handlers (ops_block.c, ops_admin.c) validate
 * requests, resolve handles, pass segment fds and build replies: they touch
 * no index entry and no pool counter, and call this module for the rest.
 *
 * A hash of a pool, as the cache sees it:
 *
 *   absent --seal--> G1 (a SEALED/CACHED block) --demote--> G2 --write-back--> G3
 *     ^                ^  |                                  |                  |
 *     |                |  +--seal of the same hash: dedup    +--promote: G1 <---+
 *     |                |     (the caller's block is dropped,     (lookup parks)
 *     |                |      the published one referenced)
 *     |                +-- seal over a lower tier's copy: the copy is dropped,
 *     |                    the G1 block wins
 *     +-- evicted / past its namespace's TTL (a lookup drops it) / G4 only:
 *         a lookup asks G4 for the rest of its chain, parks until it is in G2
 *
 * What holds:
 *   - A hash is in the index once: as a G1 block (KV_ENTRY_BLOCK) or as a
 *     lower tier's copy (KV_ENTRY_TIER), never both.
 *   - A lookup hits a prefix of its chain: blocks 0..k-1 all in G1, each
 *     referenced once per listing. While a promotion or a G4 fetch of the
 *     chain is under way the request parks (ss->waiter) and changes nothing
 *     but its pins: the chain's G1 blocks stay pinned (ss->pins) until the
 *     run that finds them all, so that making room for a promotion never
 *     demotes a block of the same chain. A rerun resumes after the head of
 *     the chain that its last run pinned (ss->lk_done): a block with a
 *     reference stays in G1 and in the index, so only the TTL can have
 *     changed its answer, and that is checked on the oldest of them (after
 *     the rerun is checked to be the same lookup: pool, length and an XXH3
 *     of the carried blocks' hashes; else it walks from block 0).
 *   - An allocation refused for room (ENOSPC) parks when copies in flight
 *     would make the room once they end; else it fails and is counted.
 *   - lookups >= hits, per pool and per namespace; allocs counts blocks
 *     handed out (an allocation taken back is not counted).
 *
 * Single-threaded: the event loop thread only. */
#ifndef KV_CACHE_H
#define KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "pool.h"

struct kv_daemon;
struct kv_session;

/* Looks up the chain hashes[0..n) (KV_HASH_BYTES each) of pool p for ss.
 * Returns k >= 0: blk[0..k) are the chain's first k blocks, all in G1, no
 * reference taken yet (the caller takes them, then calls
 * kv_cache_lookup_done()); expired prefixes met on the way are dropped.
 * -EINPROGRESS: a promotion or a G4 fetch is under way, ss->waiter is
 * queued on it; run the request again when woken (pins kept).
 * -ENOMEM: nothing more can be done for the session.
 * *old_pins is the pin count of the previous (parked) run, for
 * kv_cache_lookup_done().
 * tiers[0..n) (NULL: not wanted): for each block of the chain met in a
 * lower tier, raised to that tier (kv_tiers_entry_tier()); the caller keeps
 * them across the runs of one lookup, 0 (G1) for a new one, so that a
 * block promoted while the lookup was parked is reported where it was. */
int kv_cache_lookup(struct kv_daemon *d, struct kv_session *ss, struct kv_pool *p,
		    const uint8_t *hashes, size_t n, struct kv_block **blk, uint32_t *old_pins,
		    uint8_t *tiers);
/* How many of the references blk[i] (blk[0..k) from kv_cache_lookup())
 * has are the pins of the lookup's previous, parked run (old_pins of
 * them), into mine[0..k): they go once the caller's references are taken
 * (kv_cache_lookup_done()), so a rerun's room under max_block_refs is what
 * a fresh lookup's would be, also when the chain lists a block many times
 * and the last run pinned it as many times. All 0 when old_pins is 0.
 * Uses b->check of the blocks. */
void kv_cache_lookup_held(struct kv_session *ss, struct kv_block *const *blk, size_t k,
			  uint32_t old_pins, uint32_t *mine);
/* The lookup is over (answered or refused): drops the previous run's pins
 * (old_pins from kv_cache_lookup()). Not called for a held request, which
 * keeps them for when it runs again. */
void kv_cache_lookup_done(struct kv_session *ss, uint32_t old_pins);
/* Counts a lookup of n hashes that hit k blocks, for p and its namespace. */
void kv_cache_count_lookup(struct kv_daemon *d, struct kv_pool *p, size_t n, size_t k);

/* What a seal of n hashes finds before it changes anything: per hash its
 * index key, what the index holds under it, and the published G1 block it
 * would dedup onto (NULL: none). Arrays of n, the caller's. */
struct kv_cache_seal {
	uint64_t *key;
	struct kv_index_entry **ie;
	struct kv_block **dedup;
};
void kv_cache_seal_plan(struct kv_daemon *d, struct kv_pool *p, const uint8_t *hashes,
			size_t n, struct kv_cache_seal *pl);
/* Seals b (WRITABLE, of p) under hash i of the plan: a lower tier's copy of
 * the hash gives way to the G1 block. repeats: the batch lists some hash
 * more than once, so the plan may be stale (the index is searched again).
 * Returns the block that carries the caller's reference now: b, or the
 * published block it was deduped onto (b's reference dropped). */
struct kv_block *kv_cache_seal(struct kv_daemon *d, struct kv_pool *p, struct kv_block *b,
			       const uint8_t *hash, const struct kv_cache_seal *pl, size_t i,
			       int repeats);

/* Allocates n WRITABLE blocks of p for ss into out (kv_pool_alloc()).
 * Returns 0; -EINPROGRESS when the room is short for now but copies in
 * flight would make it once they end (demotions whose blocks cannot be
 * evicted while a copy reads them, or swap outs of the namespace's own
 * blocks): ss->waiter is queued, run the request again when woken; or
 * -ENOSPC / -EDQUOT / another -errno with the reason in why (an ENOSPC is
 * counted: kv_cache_count_enospc()). */
int kv_cache_alloc(struct kv_daemon *d, struct kv_session *ss, struct kv_pool *p, uint32_t n,
		   struct kv_block **out, char *why, size_t whylen);
/* Takes back an allocation of n blocks that could not be answered: the
 * blocks are freed and not counted as allocated. */
void kv_cache_alloc_undo(struct kv_pool *p, struct kv_block **blk, uint32_t n);
/* Counts an allocation refused with ENOSPC, daemon-wide and for namespace
 * ns (the metrics' kvcached_enospc_total). */
void kv_cache_count_enospc(struct kv_daemon *d, uint32_t ns);

/* Calls fn for every (pool, hash, tier) the cache holds, from index bucket
 * first on, bucket by bucket (a bucket's chain is never split), until at
 * least max have been passed (the bucket that passes max is finished) or fn
 * returns nonzero. Returns the next bucket to start from, or
 * KV_CACHE_WALK_DONE when every bucket was walked or fn stopped it. */
#define KV_CACHE_WALK_DONE UINT64_MAX
uint64_t kv_cache_walk(struct kv_daemon *d, uint64_t first, size_t max,
		       int (*fn)(void *arg, uint32_t pool, const uint8_t *hash, unsigned tier),
		       void *arg);

/* After a batch of requests: starts the demotions and write-backs the
 * watermarks call for. */
void kv_cache_batch_done(struct kv_daemon *d);

#endif
