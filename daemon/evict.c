/* The eviction policy across pools: which cached block goes, and which
 * other pool gives pages back, when an allocation finds no room (steps 3 and
 * 4 of kv_pool_alloc(), docs/architecture.md section 5), and eviction on
 * demand for the tiers and for kvctl. pool.c holds the mechanism it drives.
 *
 * LRU order is comparable across pools: ticks come from one daemon-wide
 * counter bumped each time a block becomes CACHED. */
#include "pool_int.h"

#include "kvassert.h"

/* Evicts CACHED b (on its pool's LRU, so not demoting): out of the LRU and
 * the index, then FREE. keep_spare as pool_make_free(). */
static void pool_evict(struct kv_block *b, int keep_spare)
{
	struct kv_pool *p = b->run->pool;

	kv_assert(b->state == KV_BLOCK_CACHED && !b->demoting);
	kv_list_del(&b->node);
	kv_index_remove(&p->pools->index, &b->ix);
	p->n.cached--;
	p->n.evictions++;
	pool_make_free(b, keep_spare);
}

/* The oldest CACHED block on the LRUs of device dev's pools other than
 * except (NULL: all of them), or NULL. Demoting blocks are on no LRU. */
static struct kv_block *oldest_cached(struct kv_pools *ps, uint32_t dev,
				      const struct kv_pool *except)
{
	struct kv_block *oldest = NULL;
	uint32_t i;

	for (i = 0; i < ps->npools; i++) {
		struct kv_pool *q = ps->pool[i];
		struct kv_list *n;
		struct kv_block *b;

		if (q == except || q->device != dev || !(n = kv_list_back(&q->lru)))
			continue;
		b = kv_container_of(n, struct kv_block, node);
		if (!oldest || b->tick < oldest->tick)
			oldest = b;
	}
	return oldest;
}

/* Frees pages for p from other pools of the device: a spare run, else the
 * globally oldest cached block (runs it empties are released, not kept as
 * spares: the pages are what p needs). Returns 1 if it freed anything. */
static int pool_reclaim_other(struct kv_pool *p)
{
	struct kv_pools *ps = p->pools;
	struct kv_block *oldest;
	uint32_t i;

	for (i = 0; i < ps->npools; i++) {
		struct kv_pool *q = ps->pool[i];

		if (q != p && q->device == p->device && q->spare) {
			pool_run_release(q->spare);
			return 1;
		}
	}
	oldest = oldest_cached(ps, p->device, p);
	if (!oldest)
		return 0;
	pool_evict(oldest, 0);
	return 1;
}

int pool_make_room(struct kv_pool *p)
{
	struct kv_list *old = kv_list_back(&p->lru);

	if (old) {
		/* A run this empties may stay as p's spare: p refills it next. */
		pool_evict(kv_container_of(old, struct kv_block, node), 1);
		return 1;
	}
	return pool_reclaim_other(p);
}

struct kv_block *kv_pools_oldest_cached(struct kv_pools *ps, uint32_t dev)
{
	return oldest_cached(ps, dev, NULL);
}

uint64_t kv_pools_evict_all(struct kv_pools *ps, int pool_id)
{
	uint64_t n = 0;
	uint32_t i;

	for (i = 0; i < ps->npools; i++) {
		struct kv_list *old;

		if (pool_id >= 0 && (uint32_t)pool_id != i)
			continue;
		while ((old = kv_list_back(&ps->pool[i]->lru))) {
			pool_evict(kv_container_of(old, struct kv_block, node), 0);
			n++;
		}
	}
	return n;
}
