/* The eviction policy across pools: which cached block goes, and which
 * other pool gives pages back, when an allocation finds no room (steps 3 and
 * 4 of kv_pool_alloc(), see pool.h), and eviction on demand for the tiers and
 * for kvctl. pool.c holds the mechanism it drives. */
#include "pool_int.h"

void pool_evict(struct kv_block *b, int keep_spare)
{
	struct kv_pool *p = b->run->pool;

	kv_list_del(&b->node);
	kv_index_remove(&p->pools->index, &b->ix);
	p->n.cached--;
	p->n.evictions++;
	pool_make_free(b, keep_spare);
}

/* Frees pages for p from other pools of the device: a spare run, else the
 * globally oldest cached block. Returns 1 if it freed anything. */
int pool_reclaim_other(struct kv_pool *p)
{
	struct kv_pools *ps = p->pools;
	struct kv_block *oldest = NULL;
	uint32_t i;

	for (i = 0; i < ps->npools; i++) {
		struct kv_pool *q = ps->pool[i];

		if (q != p && q->device == p->device && q->spare) {
			pool_run_release(q->spare);
			return 1;
		}
	}
	for (i = 0; i < ps->npools; i++) {
		struct kv_pool *q = ps->pool[i];
		struct kv_list *n;
		struct kv_block *b;

		if (q == p || q->device != p->device || !(n = kv_list_back(&q->lru)))
			continue;
		b = kv_container_of(n, struct kv_block, node);
		if (!oldest || b->tick < oldest->tick)
			oldest = b;
	}
	if (!oldest)
		return 0;
	pool_evict(oldest, 0);
	return 1;
}

struct kv_block *kv_pools_oldest_cached(struct kv_pools *ps, uint32_t dev)
{
	struct kv_block *oldest = NULL;
	uint32_t i;

	for (i = 0; i < ps->npools; i++) {
		struct kv_pool *q = ps->pool[i];
		struct kv_list *n;
		struct kv_block *b;

		if (q->device != dev || !(n = kv_list_back(&q->lru)))
			continue;
		b = kv_container_of(n, struct kv_block, node);
		if (!oldest || b->tick < oldest->tick)
			oldest = b;
	}
	return oldest;
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
