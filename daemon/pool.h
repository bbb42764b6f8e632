/* Pools and blocks: the KV block allocator, its lifecycle and eviction.
 *
 * A pool is one KV layout in one namespace on one device. It takes pages from
 * the device (pages.h) a run at a time: run_pages contiguous pages cut into
 * blocks_per_run blocks, chosen when the pool is registered so that the tail
 * a run cannot use stays under 2% (a block never straddles a run).
 *
 * Block lifecycle (docs/architecture.md, section 4):
 *
 *   FREE --alloc--> WRITABLE(ref>=1) --seal--> SEALED(ref>=1) --ref 0--> CACHED
 *     ^                 | ref 0                   ^  lookup / fork: ref++    |
 *     +-----------------+-------------------------+-------------------------+ evict,
 *                                                                             demoted
 * What holds in each state (kv_block_assert_state() checks one block at each
 * transition; kv_pools_check() verifies all of it, lists and counters too):
 *   FREE      ref 0, on its pool's free list, not in the prefix index
 *   WRITABLE  ref >= 1, on no list, not in the index
 *   SEALED    ref >= 1, on no list, in the index under its hash
 *   CACHED    ref 0, on its pool's LRU list (front = newest), in the index
 * A CACHED block being copied down to the host tier (tier.h) is "demoting":
 * it sits on the pool's demoting list instead of the LRU, so eviction leaves
 * it alone until the copy is done, and a lookup that takes a reference on it
 * cancels the demotion (the copy's result is then thrown away). No block of
 * another state is demoting.
 * Every transition is O(1). A block's generation changes whenever it becomes
 * FREE, so a handle kept past its release is detected (ESTALE), never reused.
 * In every state ref <= KV_BLOCK_REF_MAX. Taking a reference on a FREE
 * block, dropping one from a block that has none (FREE, CACHED) and sealing
 * a block that is not WRITABLE are the caller's bugs: they fail an assertion
 * (ops_block.c refuses such requests first). A reference past KV_BLOCK_REF_MAX is
 * refused with an error, since clients can ask for it.
 *
 * Run lifecycle (the pages under a run: pages.h):
 *
 *   pool_run_new --> IN USE (nused >= 1) --last block FREE--> SPARE (p->spare)
 *                      ^                                        |
 *                      +------------- a block taken ------------+
 *   IN USE --last block FREE while p has a spare, or evicted for another
 *            pool or by kv_pools_evict_all()--> released (pages back)
 *   SPARE --another pool needs the pages / the pool freed / kv_pools_destroy--> released
 *
 * nused counts the run's blocks that are not FREE, 0 <= nused <=
 * blocks_per_run. A pool keeps at most one spare, and an empty run is always
 * the spare (but for the instant between pool_run_new() and the allocation
 * that takes its first block).
 *
 * Pool lifecycle:
 *
 *   kv_pool_register --> LIVE --no hold left and no block in use--> IDLE
 *                         ^                                          | kv_pools_collect
 *                         +------- held again (kv_pool_hold) --------+------> freed
 *
 * A pool is kept by its holds (kv_pool_hold: a session that registered it,
 * each lower-tier copy or swap of its blocks) and by its blocks in use (not
 * FREE). With neither it is IDLE: queued on the pools' idle list, and freed
 * by the next kv_pools_collect() if nothing took it back meanwhile: its
 * spare run's pages go back, its namespace reference is dropped, its id is
 * free. The free is deferred because a pool goes idle deep inside loops
 * that still use it (eviction, the tiers); the daemon collects before and
 * after every request, after a session closes and after tier completions.
 *   LIVE  holds >= 1 or a block not FREE; on the idle list only if it was
 *         idle a moment ago (collect checks again)
 *   IDLE  holds 0, every block FREE (at most the spare run); on the idle list
 *
 * Pool ids (12 bits in a handle) are handed out round robin: a freed id is
 * the last to be reused, so a stale pool id names nothing (ENOENT) for as
 * long as possible. A stale block handle stays stale across reuse anyway: a
 * run's generations start above everything handed out at its first page.
 * ps->pool[] keeps ids in place; a free id below the highest in use points
 * at an empty sentinel pool on no device (kv_pool_get() returns NULL for
 * it), so a loop over pool[0 .. npools) meets no NULL and nothing to take.
 *
 * This module knows nothing of sessions or the protocol: callers (ops.c)
 * check that a peer holds the references it gives back. Single-threaded:
 * only the event loop thread calls in.
 *
 * The module is pool.c (registration, runs, the block lifecycle, handles),
 * evict.c (the eviction policy across pools) and check.c (the invariant
 * checker); pool_int.h is what they share, and no other file includes it. */
#ifndef KV_POOL_H
#define KV_POOL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "backend.h"
#include "index.h"
#include "kvassert.h"
#include "kvclock.h"
#include "list.h"
#include "ns.h"
#include "pages.h"
#include "quant.h"

#define KV_MAX_POOLS 4096      /* the pool field of a handle is 12 bits */
#define KV_MAX_RUN_BLOCKS 4096 /* the slot field is 12 bits */
#define KV_MIN_BLOCK_BYTES 4096
#define KV_BLOCK_ALIGN 256

/* The most references one block carries; kv_block_ref() refuses more with
 * -EOVERFLOW instead of letting ref wrap (a client forking one block over
 * and over, 65536 a request, would otherwise reach 2^32 and free a block
 * others hold). Why 2^31 - 1 and not UINT32_MAX - 1: a session's count on a
 * block (refmap.h) is never more than the block's ref and stops at
 * KV_REFMAP_COUNT_MAX = INT32_MAX, since kv_refmap_sub() returns it as an
 * int; with blocks stopping no higher, adding to a session's refmap the
 * reference just taken on a block cannot overflow (pool.c checks the two
 * limits at compile time). Still 32768 full batches of forks of one block:
 * no honest client gets near it. */
#define KV_BLOCK_REF_MAX 0x7fffffffu

enum kv_block_state { KV_BLOCK_FREE, KV_BLOCK_WRITABLE, KV_BLOCK_SEALED, KV_BLOCK_CACHED };

struct kv_run;

/* Two cache lines, aligned (issue 38): the index entry alone in the first
 * (what a chain walk compares), the rest in the second (what the batch
 * loops of Lookup, Release and Alloc read and write, and the LRU links). */
struct kv_block {
	_Alignas(64) struct kv_index_entry ix;  /* SEALED, CACHED: in the index */
	struct kv_list node;       /* FREE: pool free list; CACHED: pool LRU */
	struct kv_run *run;
	uint64_t tick;             /* when it last became CACHED */
	uint32_t ref;
	uint32_t gen;              /* counts every reuse; its low 20 bits go in the handle */
	uint32_t check;            /* scratch: the checker and batch validation (ops.c) */
	uint16_t slot;
	uint8_t state;
	uint8_t demoting;          /* CACHED and on the demoting list */
	/* The one holder whose references are counted on the block itself
	 * (sessrefs.h: a session's id; 0: none) and how many of ref are its.
	 * The pool keeps them, and clears owner when it frees the block:
	 * own > 0 only with an owner, own <= ref, none on a FREE block
	 * (kv_block_assert_state(), kv_pools_check()). */
	uint32_t own;
	uint8_t listed;            /* scratch: the checker (in its owner's list) */
	uint64_t owner;
};

struct kv_pool_desc {
	const char *name;
	uint32_t device;
	uint64_t block_bytes;
	uint32_t block_tokens;
	const char *dtype;
	const void *layout;
	size_t layout_len;
};

struct kv_pool_counts {
	uint64_t runs, free, writable, sealed, cached;
	uint64_t allocs, lookups, hits, evictions, dedups;
	uint64_t demoting;         /* CACHED blocks on the demoting list */
};

struct kv_pool {
	uint32_t id, ns, device;
	char name[KV_NAME_MAX];
	char dtype[32];
	uint64_t block_bytes;
	uint32_t block_tokens;
	/* compress (its namespace's, when it was created; docs/tiers.md): the
	 * format of its blocks' tier copies (quant.h KV_QFMT_*; RAW: as in G1)
	 * and their element type. Set once, before the tiers see the pool. */
	uint8_t qfmt, qdtype;
	uint32_t run_pages, blocks_per_run;
	void *layout;
	size_t layout_len;
	struct kv_list free;       /* FREE blocks; front is taken first */
	struct kv_list lru;        /* CACHED blocks; back is evicted first */
	struct kv_list demoting;   /* CACHED blocks being copied to the host tier */
	struct kv_list runs;
	struct kv_run *spare;      /* one empty run kept against alloc/free churn */
	struct kv_pool_counts n;
	struct kv_pools *pools;
	uint32_t holds;            /* kv_pool_hold()s not put back */
	uint32_t check_holds;      /* scratch: the holds the checker's caller knows of */
	struct kv_list idle;       /* on the pools' idle list (see the lifecycle) */
	/* In its device's heap of pools with cached blocks (evict.c): where,
	 * or UINT32_MAX; and the key it is there by. */
	uint32_t heap_ix, heap_prio;
	uint64_t heap_tick;
};

struct kv_pools;

/* The bytes of a tier copy of one of p's blocks: block_bytes, or its
 * quantized size (quant.h). */
static inline uint64_t kv_pool_stored_bytes(const struct kv_pool *p)
{
	return p->qfmt ? kv_quant_bytes(p->block_bytes / 2, KV_QUANT_GROUP) : p->block_bytes;
}

/* Creates the allocator over the backend's segments, cut into page_bytes
 * pages. Returns 0 and *out, or -EINVAL / -ENOMEM. */
int kv_pools_create(struct kv_backend *be, uint64_t page_bytes, struct kv_pools **out);
/* Frees all pools and blocks (not the backend). NULL is fine. */
void kv_pools_destroy(struct kv_pools *ps);

/* The namespaces (ns.h). Each pool holds a reference on its namespace, and
 * the allocator charges G1 usage to it (blocks not FREE). */
struct kv_ns_table *kv_pools_nstab(struct kv_pools *ps);
/* kv_ns_open() on the pools' table: a new reference the caller drops with
 * kv_ns_put(). */
int kv_pools_ns(struct kv_pools *ps, const char *name);
const char *kv_pools_ns_name(const struct kv_pools *ps, uint32_t ns);

/* kv_ns_put() on the pools' table; when that frees the namespace, the
 * segments it last owned are marked so that whichever namespace takes
 * their id next gets fresh memory (pages.h), not this one's leftovers. */
void kv_pools_ns_put(struct kv_pools *ps, uint32_t ns);

/* Registers pool d->name in namespace ns, or returns the existing one when the
 * layout (device, block size and tokens, dtype, layout bytes) matches.
 * Returns 1 (created) or 0 (it existed) with *out carrying one hold that
 * the caller gives back with kv_pool_put(); -EEXIST for a different layout,
 * -EINVAL for a bad description, -ENOSPC when KV_MAX_POOLS exist, -ENOMEM;
 * err gets a message. */
int kv_pool_register(struct kv_pools *ps, uint32_t ns, const struct kv_pool_desc *d,
		     struct kv_pool **out, char *err, size_t errlen);
/* Keeps p (see the lifecycle above). */
void kv_pool_hold(struct kv_pool *p);
/* Gives a hold back; p goes idle when it was the last and no block is in
 * use. p stays valid until the next kv_pools_collect(). */
void kv_pool_put(struct kv_pool *p);
/* Frees every idle pool, first calling gone(ctx, p) (NULL: nothing) for
 * each, so that what others keep per pool id can go too. Returns how many. */
uint32_t kv_pools_collect(struct kv_pools *ps, void (*gone)(void *ctx, struct kv_pool *p),
			  void *ctx);

/* The pool named name in namespace ns, or NULL. */
struct kv_pool *kv_pools_by_name(struct kv_pools *ps, uint32_t ns, const char *name);

/* How many pools exist. */
uint32_t kv_pools_count(const struct kv_pools *ps);
/* One past the highest pool id in use: ids of live pools are below it (some
 * below it may be free: kv_pool_get() says). */
uint32_t kv_pools_end(const struct kv_pools *ps);
/* The live pool of id, or NULL. */
struct kv_pool *kv_pool_get(struct kv_pools *ps, uint32_t id);
/* Calls fn for each live pool in id order. */
void kv_pools_each(struct kv_pools *ps, void (*fn)(struct kv_pool *p, void *ctx), void *ctx);

/* Picks the run size for block_bytes: the fewest pages whose unusable tail is
 * under 2% (or the least waste possible). Returns pages, and blocks per run in
 * *blocks, or -EINVAL. Exposed for tests. */
int kv_pool_run_size(uint64_t page_bytes, uint32_t pages_per_seg, uint64_t block_bytes,
		     uint32_t *blocks);

/* Handle: gen:20 | pool:12 | page:20 | slot:12. */
uint64_t kv_block_handle(const struct kv_block *b);
/* The live block named by h, whatever its state (FREE blocks too: callers
 * check the state), or NULL when no block with that generation exists. */
struct kv_block *kv_block_lookup(struct kv_pools *ps, uint64_t h);
/* The same, quicker when h names a block of near's run (a batch's handles
 * come in runs): near is a block resolved just before, or NULL. Inline
 * (below): a call per handle was a tenth of Release's validation of 1,000
 * (issue 38). */
static inline struct kv_block *kv_block_lookup_near(struct kv_pools *ps, uint64_t h,
						    const struct kv_block *near);
static inline struct kv_pool *kv_block_pool(const struct kv_block *b);

/* Allocates n WRITABLE blocks (ref 1) into out, all or nothing: from the free
 * list, then fresh pages, then by evicting (evict.c: this pool's LRU, other
 * pools' spare runs, the oldest cached block of any namespace it may take
 * from, lowest eviction priority first). A namespace over its G1 quota
 * evicts its own cached blocks first. Returns 0, -EDQUOT (the quota) or
 * -ENOSPC, with the numbers in why; nothing is evicted for an allocation
 * that cannot succeed. */
int kv_pool_alloc(struct kv_pool *p, uint32_t n, struct kv_block **out, char *why, size_t whylen);

/* After kv_pool_alloc() failed with -ENOSPC: whether it would succeed once
 * the demotions in flight on p's device complete (their blocks are freed
 * then; until then they cannot be evicted, a copy reads them). */
int kv_pool_room_after_demotions(struct kv_pool *p, uint32_t n);

/* kv_pool_alloc() from free blocks and free pages only: evicts nothing.
 * Returns 0, -EDQUOT or -ENOSPC. */
int kv_pool_alloc_free(struct kv_pool *p, uint32_t n, struct kv_block **out);

/* Seals b (WRITABLE, of pool p) under hash. Returns the block that now carries the
 * caller's reference: b, or the block already cached under hash, in which
 * case the caller's reference on b has been dropped (dedup). Only a G1 block
 * may be indexed under hash: the caller has removed any other entry. When
 * the block under hash holds KV_BLOCK_REF_MAX references already, there is
 * no dedup and no seal: b is returned as it was, WRITABLE (a hash is indexed
 * once, and the block under it already serves lookups; the caller keeps its
 * own copy). */
struct kv_block *kv_pool_seal(struct kv_pool *p, struct kv_block *b, const uint8_t *hash);

/* kv_pool_seal() of a caller that has searched the index already: key is
 * kv_index_key() of (p's id, hash) and ie what the index holds under it now
 * (NULL or a KV_ENTRY_BLOCK). Saves the seal of a batch a second probe per
 * block (ops_block.c). */
struct kv_block *kv_pool_seal_found(struct kv_pool *p, struct kv_block *b, const uint8_t *hash,
				    uint64_t key, struct kv_index_entry *ie);

/* The SEALED or CACHED block under hash, or NULL (also when a lower tier
 * holds the hash). Takes no reference. */
struct kv_block *kv_pool_find(struct kv_pool *p, const uint8_t *hash);
/* The index entry under hash, whatever tier holds it, or NULL. */
struct kv_index_entry *kv_pool_find_entry(struct kv_pool *p, const uint8_t *hash);
struct kv_index *kv_pools_index(struct kv_pools *ps);
/* The KV-event sink told when a hash enters or leaves a medium (events.h):
 * the pools report G1 removals, the ops G1 seals, the tiers G2 and G3.
 * NULL (the default): nobody listens. The caller's; it must outlive ps's use. */
struct kv_events;
void kv_pools_set_events(struct kv_pools *ps, struct kv_events *ev);
struct kv_events *kv_pools_events(const struct kv_pools *ps);

/* ---- for the tiers ---- */
/* The CACHED block (not demoting) of device dev that demotion takes next:
 * of the lowest eviction priority, then the oldest; none of a namespace at or
 * below its G1 reserve. NULL if none. */
struct kv_block *kv_pools_oldest_cached(struct kv_pools *ps, uint32_t dev);
/* The CACHED block (not demoting) of pool p that its LRU gives up first (an
 * operator's Evict of one pool), whatever its namespace's reserve. NULL if
 * none. O(1). The tiers go through this, never through p->lru. */
struct kv_block *kv_pool_oldest_cached(struct kv_pool *p);
/* Whether the prefix of index entry e (of pool p) is past its namespace's
 * TTL: lookups miss it and a seal of the same hash replaces it. */
int kv_pool_expired(const struct kv_pool *p, const struct kv_index_entry *e);
/* Whether p's namespace has a TTL at all: when not, nothing of p expires
 * (a loop over a chain asks once). */
int kv_pool_has_ttl(const struct kv_pool *p);
/* The time (kv_mono_ms()) the seals and TTL checks that follow go by, until
 * called again with 0 (read the clock each time): one reading for a batch
 * (issue 38: clock_gettime per block was a twentieth of a Seal of 256). */
void kv_pools_hold_clock(struct kv_pools *ps, uint64_t now_ms);
/* Evicts b if it is CACHED and not being demoted (a prefix past its TTL).
 * Returns 1 if it did. */
int kv_pools_drop_cached(struct kv_block *b);
/* Free bytes of device dev: free pages plus free blocks of its pools. */
uint64_t kv_pools_dev_free(const struct kv_pools *ps, uint32_t dev, uint64_t *total);
/* The same, but counting a segment's free pages only when they are at least
 * the smallest run of a pool on dev: what allocations can use (the pages a
 * segment's size leaves over after whole runs are not). What demotion's
 * watermarks go by. O(segments + pools). */
uint64_t kv_pools_dev_room(const struct kv_pools *ps, uint32_t dev, uint64_t *total);
/* Moves CACHED b (not demoting) from the LRU to the demoting list. */
void kv_block_demote_begin(struct kv_block *b);
/* Ends b's demotion: if it is still demoting (no lookup took it meanwhile),
 * b leaves the index and becomes FREE, and 1 is returned; otherwise 0. With
 * ok == 0 (the copy failed) b goes back to the LRU instead, as its newest. */
int kv_block_demote_end(struct kv_block *b, int ok);
/* Device offset of b's bytes. */
uint64_t kv_block_offset(const struct kv_block *b);

/* Takes a reference (a CACHED block becomes SEALED). b must not be FREE.
 * Returns 0, or -EOVERFLOW when b holds KV_BLOCK_REF_MAX references already;
 * then nothing changed. */
int kv_block_ref(struct kv_block *b);
/* kv_block_ref() of blk[0], blk[1], ... blk[n-1] in that order, the same
 * transitions and LRU moves, with the pool and namespace counters added once
 * per pool met instead of once per block (issue 38: a lookup of 1,000). The
 * caller has checked the room (kv_block_ref_room() of each block's count in
 * the batch): none may be at KV_BLOCK_REF_MAX (an assertion). */
void kv_blocks_ref(struct kv_block *const *blk, size_t n);
/* kv_block_unref() of blk[n-1], blk[n-2], ... blk[0] (the tail of a chain
 * first), the same transitions and LRU order, the counters added once per
 * pool met. Each must hold a reference for each listing. */
void kv_blocks_unref_back(struct kv_block *const *blk, size_t n);
/* 1 if n more references fit on b (n calls of kv_block_ref() would all
 * succeed), else 0: validates a batch before anything changes. A block
 * listed k times in a batch needs kv_block_ref_room(b, k). */
static inline int kv_block_ref_room(const struct kv_block *b, uint32_t n);
/* Drops a reference; at 0 a SEALED block becomes CACHED (newest in the LRU),
 * a WRITABLE one FREE. b must hold one (WRITABLE or SEALED). */
void kv_block_unref(struct kv_block *b);

/* Copies src's bytes over dst's (same pool). Returns 0 or -errno. */
int kv_block_copy(struct kv_block *dst, const struct kv_block *src);

/* Device and segment index a block lives in. */
void kv_block_where(const struct kv_block *b, uint32_t *dev, uint32_t *seg);

/* Whole-allocator numbers for stats. */
void kv_pools_pages(const struct kv_pools *ps, uint64_t *total, uint64_t *free,
		    uint64_t *page_bytes);

/* Evicts every CACHED block (of pool id, or of all pools if id < 0).
 * Returns how many. */
uint64_t kv_pools_evict_all(struct kv_pools *ps, int pool_id);

/* Checks, with kv_assert(), what pool.h says holds for a block in its state
 * (ref, list, index, demoting, generation and slot in range). O(1): the
 * allocator runs it at its transitions; callers may too. */
void kv_block_assert_state(const struct kv_block *b);

/* The invariant checker. Walks every pool, block, list, run and page and
 * calls report(ctx, message) for each broken invariant; with refs set it also
 * compares each block's ref with its check field, and each pool's holds with
 * its check_holds, which the caller has filled with the references and holds
 * it knows of (kv_pools_check_clear() zeroes them).
 * tier_entries is how many index entries the lower tiers hold.
 * Returns the number of problems found; *blocks gets the blocks walked. */
int kv_pools_check(struct kv_pools *ps, int refs, void (*report)(void *ctx, const char *msg),
		   void *ctx, uint64_t *blocks, uint64_t tier_entries);
void kv_pools_check_clear(struct kv_pools *ps);

struct kv_run {
	struct kv_pool *pool;
	struct kv_list link;      /* pool->runs */
	uint32_t first_page, npages;
	uint32_t nused;           /* blocks not FREE */
	uint32_t nlru;            /* of those, CACHED on the LRU (evictable now) */
	uint32_t ndemoting;       /* of those, CACHED and being demoted (free once copied) */
	struct kv_block blocks[];
};

static inline struct kv_pool *kv_block_pool(const struct kv_block *b)
{
	return b->run->pool;
}

static inline int kv_block_ref_room(const struct kv_block *b, uint32_t n)
{
	return b->ref <= KV_BLOCK_REF_MAX && n <= KV_BLOCK_REF_MAX - b->ref;
}

/* Asks for the line of b that the batch loops read and write (all but the
 * index entry, which has the first line to itself), to write it: a pass
 * over a batch calls it a few blocks ahead (issue 38). */
static inline void kv_block_prefetch(const struct kv_block *b)
{
	__builtin_prefetch(&b->node, 1);
}

/* b's run's blocks, [*first, *end): the slots kv_block_beside() may give. */
static inline void kv_block_run_span(const struct kv_block *b, const struct kv_block **first,
				     const struct kv_block **end)
{
	*first = b->run->blocks;
	*end = *first + b->run->pool->blocks_per_run;
}

/* The block in the slot beside b's (the one after it for dir 1, before it
 * for -1) within [first, end) (kv_block_run_span(b)), when it is in the
 * index under hash (SEALED or CACHED), else NULL: what a probe of the index
 * for pool (b's pool's id) and hash would find, since the index holds one
 * entry per pool and hash. A chain sealed from one allocation lies in
 * consecutive slots of a run, or, from a full pool's evictions of its
 * LRU's oldest chains, in stretches of them, ascending or descending (both
 * seen in kvbench's section (d) after (b) and (c)), so a lookup
 * asks the slot beside the last block before the index: a compare of the
 * line next to the last one's, where a probe is a keyed hash and a random
 * line (issue 38: the index's probes were a third of the daemon's time in a
 * lookup of 1,000). Reads only that block's index entry. */
static inline struct kv_block *kv_block_beside(const struct kv_block *b, int dir,
						const struct kv_block *first,
						const struct kv_block *end, uint32_t pool,
						const uint8_t *hash)
{
	const struct kv_block *nb;

	if (dir > 0 ? end - b <= 1 : b == first)
		return NULL;
	nb = b + dir;
	if (!nb->ix.pprev || memcmp(nb->ix.hash, hash, KV_HASH_BYTES))
		return NULL;
	/* Of b's run, so of b's pool: the one the lookup asks of. */
	kv_assert(nb->ix.pool == pool && nb->ix.kind == KV_ENTRY_BLOCK);
	return (struct kv_block *)nb;
}

/* kv_block_prefetch() of the block handle h names when it is of near's run
 * (what kv_block_lookup_near() of h then reads without a miss); nothing
 * otherwise. Reads only near's run: a pass resolving a batch's handles
 * asks a few handles ahead. */
static inline void kv_block_prefetch_near(uint64_t h, const struct kv_block *near)
{
	const struct kv_run *run = near->run;

	if (((h >> 12) & 0xfffff) == run->first_page && ((h >> 32) & 0xfff) == run->pool->id &&
	    (h & 0xfff) < run->pool->blocks_per_run)
		kv_block_prefetch(&run->blocks[h & 0xfff]);
}

/* kv_block_handle() a run at a time (issue 38: a reply of 1,000 handles):
 * the part the blocks of run r share, then each block's with it. */
#define KV_HANDLE_GEN_MASK 0xfffffu
static inline uint64_t kv_run_handle_base(const struct kv_run *r)
{
	kv_assert(r->pool->id < KV_MAX_POOLS && r->first_page <= 0xfffff);
	return (uint64_t)r->pool->id << 32 | (uint64_t)r->first_page << 12;
}

static inline uint64_t kv_block_handle_in(const struct kv_block *b, uint64_t base)
{
	kv_assert(b->slot < KV_MAX_RUN_BLOCKS);
	return (uint64_t)(b->gen & KV_HANDLE_GEN_MASK) << 44 | base | b->slot;
}

static inline struct kv_block *kv_block_lookup_near(struct kv_pools *ps, uint64_t h,
						    const struct kv_block *near)
{
	const struct kv_run *run;
	const struct kv_block *b;

	/* near's run is alive (near is held or was just resolved) and owns
	 * its pages: a handle naming its pool and first page names it, as
	 * kv_block_lookup() would find through the pool and the page. */
	if (!near)
		return kv_block_lookup(ps, h);
	run = near->run;
	if (((h >> 12) & 0xfffff) != run->first_page || ((h >> 32) & 0xfff) != run->pool->id)
		return kv_block_lookup(ps, h);
	if ((h & 0xfff) >= run->pool->blocks_per_run)
		return NULL;
	b = &run->blocks[h & 0xfff];
	return (b->gen & KV_HANDLE_GEN_MASK) == (uint32_t)(h >> 44) ? (struct kv_block *)b : NULL;
}

#endif
