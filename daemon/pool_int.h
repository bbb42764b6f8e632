/* What the files of the pool module share: pool.c (the allocator and the
 * block lifecycle), evict.c (the eviction policy across pools) and check.c
 * (the invariant checker). Nothing else includes it: pool.h is the module's
 * interface. Single-threaded, as pool.h. */
#ifndef KV_POOL_INT_H
#define KV_POOL_INT_H

#include "pool.h"

struct kv_pools {
	struct kv_backend *be;
	struct kv_pages dev[KV_MAX_DEVICES];
	uint32_t ndev;
	/* By id. A free id below npools points at hole, an empty pool on no
	 * device, so that loops over pool[0 .. npools) (evict.c) need no test;
	 * pool_at() and kv_pool_get() say NULL for it. */
	struct kv_pool *pool[KV_MAX_POOLS];
	uint32_t npools;           /* one past the highest id in use */
	uint32_t nlive;            /* pools that exist */
	uint32_t next_id;          /* where the round-robin search for a free id starts */
	struct kv_pool hole;
	struct kv_list idle;       /* pools that went idle (pool.h), to collect */
	struct kv_ns_table nst;
	struct kv_index index;
	uint64_t tick;
	struct kv_events *ev;      /* kv_pools_set_events() */
	/* Per device, the pools with blocks on their LRU, in a binary heap by
	 * (their namespace's priority, the tick of their LRU's back): the
	 * block demotion takes next is found from the top instead of by a
	 * walk over every pool (evict.c). heap[d] has room for every pool;
	 * scratch for the search (KV_MAX_POOLS + 1). */
	struct kv_pool **heap[KV_MAX_DEVICES];
	uint32_t nheap[KV_MAX_DEVICES];
	uint32_t heap_epoch;       /* nst.prio_epoch the keys were taken at */
	uint32_t *scratch;
	uint64_t clock_ms;         /* kv_pools_hold_clock(); 0: read the clock */
	/* Per device, where its runs' structs live (pool.c run_mem_get()):
	 * one mapping in transparent huge pages, a slot of runmem_stride bytes
	 * per page, a run's struct at its first page's slot; NULL: each run
	 * from aligned_alloc(). */
	uint8_t *runmem[KV_MAX_DEVICES];
	size_t runmem_bytes[KV_MAX_DEVICES], runmem_stride[KV_MAX_DEVICES];
};

/* The live pool of id i < npools, or NULL for a free id. */
static inline struct kv_pool *pool_at(const struct kv_pools *ps, uint32_t i)
{
	return ps->pool[i] == &ps->hole ? NULL : ps->pool[i];
}

static inline struct kv_pages *pool_dev(const struct kv_pool *p)
{
	return &p->pools->dev[p->device];
}

/* b (of p) becomes CACHED (d = 1) or stops being CACHED (d = -1): the pool's
 * and the namespace's counts follow. */
static inline void pool_cached_add(struct kv_pool *p, int d)
{
	p->n.cached += (uint64_t)(int64_t)d;
	p->pools->nst.ns[p->ns - 1].cached += (uint64_t)((int64_t)d * (int64_t)p->block_bytes);
}

/* ---- evict.c ---- */
/* p's LRU changed (a block put on or taken off it): its place in its
 * device's heap follows. O(log pools), O(1) when its back stays. Only a
 * change of the back (or of the list's emptiness) moves the key, so the hot
 * paths (kv_block_ref/unref) call it only then; kv_pools_check() verifies
 * every heap entry's key against its LRU's back. */
void pool_lru_changed(struct kv_pool *p);
/* p leaves its heap (it is being freed; its LRU is empty). */
void pool_heap_remove(struct kv_pool *p);

/* ---- pool.c ---- */
/* Gives an empty run's pages back to the device. */
void pool_run_release(struct kv_run *run);
/* Makes b (ref 0, not on a list, out of the index) FREE. keep_spare: an
 * emptied run may stay as the pool's spare; otherwise it is released. */
void pool_make_free(struct kv_block *b, int keep_spare);

/* ---- evict.c (the rules are at its top) ---- */
/* Frees room for more blocks of p, up to want (>= 1): evicts the block the
 * rules pick, or gives back another pool's spare run. When the rules pick
 * p's own oldest block and out is not NULL, up to want of its oldest (the
 * blocks want calls would evict, in the same order) go straight into
 * out[0..*taken) as WRITABLE blocks of the allocation (pool_recycle()).
 * Returns how many blocks it evicted (1 for a spare run given back), 0 when
 * nothing p may take would help; *taken: how many of them are in out. */
uint32_t pool_make_room(struct kv_pool *p, uint32_t want, struct kv_block **out,
			uint32_t *taken);
/* b (CACHED, on p's LRU, not demoting) is evicted for an allocation of its
 * own pool and becomes WRITABLE (ref 1) in one step: what pool_evict() and
 * take_free() would leave (out of the LRU and the index, the removal told to
 * the events, a new generation, no owner), without the stop on the free
 * list, so its run stays in use and its namespace's G1 bytes as they were.
 * The counters are the caller's: p->n.cached and the namespace's cached
 * bytes down, p->n.writable and p->n.evictions up. */
void pool_recycle(struct kv_block *b);
/* Whether p could get n more blocks by evicting what it may (an optimistic
 * count: whole runs per segment, contiguity aside); with later, counting the
 * blocks being demoted as evictable (they are freed when their copy ends). */
int pool_can_get(struct kv_pool *p, uint32_t n, int later);
/* Free segments of p's device that p must leave for the G1 reserves other
 * namespaces have not used yet. */
uint32_t pool_keep_free_segs(const struct kv_pool *p);
/* The ENOSPC message for p after getting got of n blocks. */
void pool_enospc_why(struct kv_pool *p, uint32_t n, uint32_t got, char *why, size_t len);
/* Makes room under p's namespace's G1 quota for n more blocks of p, evicting
 * its own cached blocks (if may_evict). Returns 0, or -EDQUOT with the numbers
 * in why (may be NULL). */
int pool_quota_room(struct kv_pool *p, uint32_t n, int may_evict, char *why, size_t len);

#endif
