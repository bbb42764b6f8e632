/* The lower tiers: G2 (a host DRAM arena only the daemon maps) and G3 (a
 * file or block device read and written with io_uring), and the movement of
 * cached blocks between them and G1 (docs/tiers.md).
 *
 *   G1 CACHED --demote (watermark, copy_async D2H)--> G2 --write back--> G3
 *        ^                                            |                  |
 *        +------ promote (lookup hit, H2D) <--- G2 <--+--- read, check --+
 *
 * A block lives in exactly one index entry whatever tier holds it: a G1
 * block, or a tier block (struct kv_tblock, kind KV_ENTRY_TIER) with a G2
 * copy, a G3 copy or both. A G2 copy is clean when G3 holds the same bytes;
 * G2 evicts clean copies first (free), then dirty ones (dropped: counted).
 *
 * Demotion runs ahead of need: when a device's free space falls under
 * g1_low percent, the oldest cached blocks are copied down in batches until
 * g1_high percent is free (counting copies in flight), so that an alloc
 * finds free blocks instead of waiting. Likewise G2 writes dirty copies back
 * to G3 when less than g2_low percent of it is
 * free or clean. A lookup that takes a block being demoted
 * cancels the demotion (the copy's result is thrown away); a lookup that
 * hits G2 or G3 starts a promotion and parks the request until it is done
 * (the request is then run again from the start); concurrent lookups of one
 * block wait on the same promotion.
 *
 * Swap: swap_out copies a session's held blocks into G2 (past G2's free
 * room, through G2 onto G3) and releases each from G1 when its copy or write
 * is done; swap_in copies them into new G1 blocks.
 * Swapped data belongs to the session and is freed when it goes.
 *
 * Each tier block and each swap holds its pool (kv_pool_hold), so a pool is
 * never freed while the tiers keep anything of it; per pool id the tiers
 * keep a layout id and a tpool per level, dropped by kv_tiers_pool_gone().
 *
 * Warm restart: journal.h records which G3 runs and slots hold what; a
 * restarted daemon replays it and offers each run to the pool that registers
 * with the same layout id (namespace, name, block size and tokens, dtype,
 * layout bytes). Every slot read is checked against its header (magic,
 * version, namespace, layout, hash, length, CRC32C of the payload): a
 * mismatch is a miss, counted and logged, never data served. */
#ifndef KV_TIER_H
#define KV_TIER_H

#include <stdint.h>

#include "backend.h"
#include "config.h"
#include "hist.h"
#include "list.h"
#include "pool.h"

/* A parked request: wake() runs it again. */
struct kv_waiter {
	struct kv_list link;
	void (*wake)(struct kv_waiter *w);
	/* Before wake(): a promotion the request waited for hands it the G1
	 * block it brought up, to keep (one reference) until the request has
	 * run again, so that demotion cannot take it back first (the request
	 * may run later: its connection paused). NULL: none. */
	void (*hold)(struct kv_waiter *w, struct kv_block *b);
	uint64_t remote_mark;      /* kv_tiers_remote_fetch() */
	void *ahead;               /* its G4 read-ahead in flight (kv_tiers_remote_ahead()) */
};

enum { KV_TIER_G1, KV_TIER_G2, KV_TIER_G3, KV_NTIERS };

struct kv_tier_stats {
	uint64_t capacity, used;   /* bytes */
	uint64_t blocks, dirty;    /* dirty: G2 copies not on G3 */
	uint64_t hits, promotions, demotions, evictions;
	uint64_t io_errors, checksum_failures, inflight;
	uint64_t queued;           /* G3: disk I/Os waiting for room in its ring */
	/* G2, G3: the slots of compressed pools' copies (pool.h qfmt): their
	 * payload bytes, and what the blocks uncompressed would take more. */
	uint64_t comp_bytes, comp_saved;
	/* G2: its copies, G3: its disk I/O failing: rounds backed off, and
	 * whether it is failing (from a failed round to the next success;
	 * tier_int.h, BO_*). */
	uint64_t backoffs, backing_off;
};

/* The tiers' latency histograms (hist.h), from the start of each copy or
 * disk I/O to its completion, failed ones included. */
enum {
	KV_TH_DEMOTE,         /* G1 -> G2 copies (one per batch) */
	KV_TH_PROMOTE_G2,     /* G2 -> G1 copies */
	KV_TH_PROMOTE_G3,     /* G3 -> G2 reads (a promotion from disk, first leg) */
	KV_TH_WRITEBACK,      /* G2 -> G3 writes */
	KV_TIER_HISTS
};

struct kv_tiers;

/* G4 (tier/remote*.c, docs/g4.md). */
struct kv_g4_stats {
	uint64_t fetches;          /* lookups that asked the cluster (read-aheads included) */
	uint64_t read_aheads;      /* of them, asked ahead of need (kv_tiers_remote_ahead()) */
	uint64_t fetching;         /* fetches queued or being read now */
	uint64_t hits, misses;     /* blocks found, and the first not found of a fetch */
	uint64_t errors;           /* blocks the cluster did not answer for (down, slow) */
	uint64_t checksum_failures;/* values that did not check out: misses */
	uint64_t auth_failures;    /* values whose HMAC tag did not check out: misses */
	uint64_t oversize;         /* values longer than a block can be: refused, misses */
	uint64_t direct;           /* blocks read straight into G2 slots reserved for them */
	uint64_t bytes_in, bytes_out;
	uint64_t writes, write_errors;
	uint64_t dropped;          /* blocks not written: remote_max_inflight was full */
	uint64_t throttled;        /* blocks not written: remote_write_rate or quota_g4 */
	uint64_t inflight_bytes;
	uint64_t redirects, reconnects, connect_failures;
	struct kv_hist hist;       /* fetch latency, from the ask to the answer on the loop */
};

/* Creates the tiers for the pools (always: with host_bytes 0 every call is a
 * cheap no-op). Returns 0 or -errno with err set. */
int kv_tiers_create(struct kv_pools *ps, struct kv_backend *be, uint64_t page_bytes,
		    const struct kv_tiers_config *cfg, struct kv_tiers **out, char *err,
		    size_t errlen);
/* Rewrites the G3 journal (so the next start is warm) and frees all. */
void kv_tiers_destroy(struct kv_tiers *t);
/* Whether a host tier is configured. */
int kv_tiers_on(const struct kv_tiers *t);

/* The fds the event loop polls: the backend's copy completions and the disk
 * ring's (-1 when there is no G3), and what to call when each is readable. */
int kv_tiers_disk_fd(const struct kv_tiers *t);
void kv_tiers_copies_done(struct kv_tiers *t);
void kv_tiers_disk_done(struct kv_tiers *t);

/* Checks the watermarks and starts demotions and write-backs. Called after
 * each batch of requests and each completion. */
void kv_tiers_kick(struct kv_tiers *t);

/* A pool was registered: computes its layout id and gives it the G3 runs a
 * previous daemon left for that layout. */
void kv_tiers_pool_added(struct kv_tiers *t, struct kv_pool *p);

/* Pool p is being freed (pool.h): no tier block or swap of it is left (each
 * holds its pool); drops what the tiers keep per pool id, so that the id
 * starts clean when another pool gets it. */
void kv_tiers_pool_gone(struct kv_tiers *t, struct kv_pool *p);

/* A G1 block is about to be sealed under hash in pool p: drops the lower
 * tiers' copy, if any (the G1 block wins), so that kv_pool_seal() finds at
 * most a G1 block under hash. */
void kv_tiers_forget(struct kv_tiers *t, struct kv_pool *p, const uint8_t *hash);

/* The same for a caller that found the entry already: e is of kind
 * KV_ENTRY_TIER, in the index. */
void kv_tiers_forget_entry(struct kv_tiers *t, struct kv_index_entry *e);

/* The tier a lookup finds e (kind KV_ENTRY_TIER) in, as the protocol's Tier
 * numbers it: 1 (G2) for a G2 copy, 3 (G4) for one a G4 fetch put there
 * (not yet promoted), else 2 (G3). */
int kv_tiers_entry_tier(const struct kv_index_entry *e);

/* e (kind KV_ENTRY_TIER) was hit by a lookup; w, unless NULL, is the request,
 * to be woken (run again) when there is news. Returns
 *   0        the promotion is under way (started now or earlier) and w is
 *            queued on it; or it cannot start until a copy or I/O in flight
 *            completes (no room in G1, or in G2 to stage through) and w is
 *            queued for that. Either way the caller parks (unless w is NULL);
 *   -EAGAIN  there is no room to start it now and w is NULL: nothing is
 *            queued (the caller, parked already, tries again when woken);
 *   -ENOENT  it is to be treated as a miss (its promotion just failed, or
 *            cannot start at all). */
int kv_tiers_promote(struct kv_tiers *t, struct kv_index_entry *e, struct kv_waiter *w);

/* Around a run of kv_tiers_promote() calls (on, then off; nested calls
 * count): the copies they start may be handed to the backend's copy engine
 * together, one hand-off for the run instead of one per block (backend.h,
 * plug). Each promotion still starts, fails and completes on its own. */
void kv_tiers_plug(struct kv_tiers *t, int on);

/* An allocation of namespace ns on device dev found no room. When a copy in
 * flight may make some, queues w, to be woken when a copy completes, and
 * returns 0 (the caller parks, then runs the allocation again): a demotion
 * on dev, if the caller found that those would make room
 * (kv_pool_room_after_demotions(): demotions is 1), or a swap out of ns's
 * blocks on dev (its references go when the copy ends: a worker that swaps
 * a sequence out to make room for another allocates at once). -ENOSPC
 * otherwise: the allocation fails. Swaps of other namespaces never hold it up. */
int kv_tiers_wait_room(struct kv_tiers *t, uint32_t dev, uint32_t ns, int demotions,
		       struct kv_waiter *w);

/* The swaps of one session: a list, and the block bytes they hold (what
 * max_swap_per_session bounds; ops_block.c checks it before a swap out). */
struct kv_swap_owner {
	struct kv_list list;
	uint64_t bytes;
};

static inline void kv_swap_owner_init(struct kv_swap_owner *o)
{
	kv_list_init(&o->list);
	o->bytes = 0;
}

/* Swap. owner is the session's. swap_out takes over the caller's
 * references on blocks[0..n) (all of pool p) and returns a handle; the
 * caller must not touch the blocks again. -EINPROGRESS, with w queued on
 * the tiers' space waiters, while another swap is moved to G3 to make G2
 * room (the request runs again when woken). -ENOSPC when G2 and G3 together
 * cannot hold them, or G2 has no free slot and no swap can be moved out of
 * it (-EDQUOT at a namespace quota); the caller keeps its references then.
 * owner->bytes counts n * block_bytes from then until the swap leaves the
 * owner (swapped in, or the owner gone). */
int kv_tiers_swap_out(struct kv_tiers *t, struct kv_swap_owner *owner, struct kv_pool *p,
		      struct kv_block **blocks, uint32_t n, struct kv_waiter *w, uint64_t *handle,
		      char *why, size_t whylen);
/* Returns 0 with *n blocks (each carrying one reference, now the caller's) in
 * out, and the swap gone; -EINPROGRESS while copies are in flight (started
 * now or earlier), with w queued to be woken when they are done; -ENOENT for
 * an unknown handle, -E2BIG when it holds more than max blocks, -ENOSPC when
 * G1 cannot take them, -EIO when a copy failed (the swap stays, it can be
 * tried again). */
int kv_tiers_swap_in(struct kv_tiers *t, struct kv_swap_owner *owner, uint64_t handle,
		     struct kv_waiter *w, struct kv_block **out, uint32_t max, uint32_t *n,
		     char *why, size_t whylen);
/* Frees every swap of owner (the session is going). */
void kv_tiers_owner_gone(struct kv_tiers *t, struct kv_swap_owner *owner);

/* Operators: evicts the idle blocks of tier (KV_TIER_G1: demote every cached
 * block; G2: drop clean copies and write dirty ones back; G3: drop) of pool
 * pool_id, or all pools when < 0. Returns how many blocks it acted on. */
uint64_t kv_tiers_evict(struct kv_tiers *t, int tier, int pool_id);
/* Starts writing every dirty G2 copy back to G3; returns how many. */
uint64_t kv_tiers_flush(struct kv_tiers *t);
/* True when no write-back is dirty or in flight (flush finished). */
int kv_tiers_clean(const struct kv_tiers *t);
/* A failing tier backs off (tier_int.h, BO_*): the milliseconds until the
 * first path that backs off may try again (0: none does). fn, when set, is
 * called with that wait whenever a new backoff round begins: the daemon
 * arms a timer that calls kv_tiers_kick() then (and again while
 * kv_tiers_retry_ms() says so), so that the tier comes back by itself. */
uint64_t kv_tiers_retry_ms(const struct kv_tiers *t);
/* Whether G3's disk I/O backs off after failures now. */
int kv_tiers_disk_failing(const struct kv_tiers *t);
void kv_tiers_on_retry(struct kv_tiers *t, void (*fn)(void *ctx, uint64_t ms), void *ctx);
/* Flush's barrier: kv_tiers_clean(), no demotion in flight (its blocks
 * would land in G2 dirty) and every G3 write recorded in the journal's file
 * (the page cache: it survives kill -9 of the daemon). After
 * kv_tiers_flush() the tiers write back what lands in G2 until this holds. */
int kv_tiers_durable(const struct kv_tiers *t);
/* Disk reads or writes of G3 in flight (not counting the index journal's
 * appends, which the worker thread writes). */
int kv_tiers_disk_busy(const struct kv_tiers *t);

void kv_tiers_stats(const struct kv_tiers *t, struct kv_tier_stats st[KV_NTIERS]);
/* Histogram which (KV_TH_*); valid while t lives. */
const struct kv_hist *kv_tiers_hist(const struct kv_tiers *t, int which);
/* Index entries the lower tiers hold (for kv_pools_check), and their own
 * invariants: problems are reported like the pool checker's. */
uint64_t kv_tiers_entries(const struct kv_tiers *t);
/* Adds the references the tiers hold (swaps, promotions) to each block's
 * check field, and their holds (tier blocks, swaps) to each pool's
 * check_holds, as sessions' are (kv_pools_check). */
void kv_tiers_count_refs(struct kv_tiers *t);
int kv_tiers_check(struct kv_tiers *t, void (*report)(void *ctx, const char *msg), void *ctx);

/* G4. A Lookup whose chain misses from hashes[0] on (n hashes) asks the
 * cluster for them: 0 when a fetch started and w is queued on it (the
 * caller parks; when w is woken, the blocks found are tier blocks in G2 and
 * w->remote_mark names the first that was not, so that the rerun does not
 * ask for it again), -ENOENT when there is nothing to ask (no G4, the
 * namespace does not use it, or w->remote_mark says it was just asked:
 * then the mark is cleared), -ENOMEM. */
int kv_tiers_remote_fetch(struct kv_tiers *t, struct kv_pool *p, const uint8_t *hashes,
			  size_t n, struct kv_waiter *w);
/* A Lookup parked on the promotion of its chain's tier blocks, whose chain
 * then misses from hashes[0] on: asks the cluster for them now, without
 * waiting (a read-ahead: the fetch overlaps the promotions), so that the
 * rerun that would ask finds them in G2, or the fetch under way (it waits on
 * that one). At most one per waiter at a time; none where
 * kv_tiers_remote_fetch() would not ask. Its blocks take G2 slots from free
 * room or clean copies only (never a dirty one: the chain's own fetched
 * blocks, not yet promoted, are). Best effort: nothing to report. */
void kv_tiers_remote_ahead(struct kv_tiers *t, struct kv_pool *p, const uint8_t *hashes,
			   size_t n, struct kv_waiter *w);
/* w, of namespace ns, goes (its session closes; it is on no list now): the
 * fetches of ns queued for no one now (its read-ahead, one only it waited
 * on) go too; one being read ends as any fetch, its blocks cached in G2. */
void kv_tiers_waiter_gone(struct kv_tiers *t, struct kv_waiter *w, uint32_t ns);
/* The mark of (p, hash) that kv_tiers_remote_fetch() leaves in a waiter. */
uint64_t kv_tiers_remote_mark(const struct kv_pool *p, const uint8_t *hash);
/* G4's counters; 0 (st untouched) when there is no G4. */
int kv_tiers_remote_stats(const struct kv_tiers *t, struct kv_g4_stats *st);

/* The media (1 << KV_MEDIUM_G1 ... G3, events.h) holding the copies of the
 * block behind index entry e, as KV events announce them: G1 for a G1 block;
 * for a lower-tier block, G2 when its host copy is whole, G3 when its disk
 * copy is written. */
struct kv_index_entry;
unsigned kv_tiers_entry_media(const struct kv_index_entry *e);

#endif
