/* The eviction policy across pools and namespaces: which cached block goes
 * when an allocation finds no room (docs/architecture.md section 5), whether
 * an allocation can succeed at all before anything is evicted for it, what
 * a namespace's quota and reserve allow, and eviction on demand for the
 * tiers and for kvctl. pool.c holds the mechanism it drives.
 *
 * The rules, in order:
 *   - a namespace over its G1 quota evicts its own cached blocks, and nobody
 *     else's (pool_quota_room);
 *   - an allocation that could not succeed even after evicting everything
 *     it may evict evicts nothing (pool_can_get): a segment holds one
 *     namespace at a time, so another namespace's cached blocks help only
 *     when evicting them empties their whole segment;
 *   - another namespace's blocks are taken only above its G1 reserve, and
 *     free segments are held back for the reserves other namespaces have not
 *     used yet (pool_keep_free_segs);
 *   - among what may go: the lowest eviction priority first; within one
 *     priority the allocating pool's own LRU, then other pools' spare runs,
 *     then the oldest block across pools. Another pool's blocks help only
 *     when evicting them empties their run (p needs whole pages): when its
 *     oldest block's run holds blocks in use, a block of a run of that pool
 *     that evicting would empty is taken instead (pool_helpful_block).
 *
 * LRU order is comparable across pools: ticks come from one daemon-wide
 * counter bumped each time a block becomes CACHED. */
#include "pool_int.h"

#include <errno.h>
#include <stdio.h>

#include "events.h"
#include "kvassert.h"

static struct kv_ns *pool_ns(const struct kv_pool *p)
{
	return &p->pools->nst.ns[p->ns - 1];
}

/* Evicts CACHED b (on its pool's LRU, so not demoting): out of the LRU and
 * the index, then FREE; the pool's heap key is the caller's (pool_lru_changed()
 * once the LRU's back has settled). keep_spare as pool_make_free(). */
static void pool_evict_one(struct kv_block *b, int keep_spare)
{
	struct kv_pool *p = b->run->pool;

	kv_assert(b->state == KV_BLOCK_CACHED && !b->demoting);
	kv_list_del(&b->node);
	b->run->nlru--;
	kv_index_remove(&p->pools->index, &b->ix);
	kv_events_removed(p->pools->ev, p->id, b->ix.hash, KV_MEDIUM_G1);
	pool_cached_add(p, -1);
	p->n.evictions++;
	pool_make_free(b, keep_spare);
}

/* pool_evict_one() and the heap key after it. */
static void pool_evict(struct kv_block *b, int keep_spare)
{
	struct kv_pool *p = b->run->pool;
	struct kv_list *next = b->node.prev;

	/* Evictions come one after another, each a cache miss on its block
	 * and on its index neighbours: ask for the next victim's neighbours
	 * now, and for the block after it, whose own line is then there when
	 * its turn comes (issue 38). Hints only. */
	if (next != &p->lru) {
		const struct kv_block *v = kv_container_of(next, struct kv_block, node);

		__builtin_prefetch(next->prev);
		__builtin_prefetch(v->ix.next);
		__builtin_prefetch(v->ix.pprev);
	}
	pool_evict_one(b, keep_spare);
	pool_lru_changed(p);
}

/* Victims of one batch (evict_own()), how far ahead of the one evicted
 * the index neighbours of a later one are asked for, and how far ahead of
 * that the walk of the LRU runs. */
#define EVICT_BATCH 64
#define EVICT_AHEAD 6
#define EVICT_WALK (2 * EVICT_AHEAD)

/* Recycles up to max of p's oldest blocks (its LRU's back), oldest first,
 * into out[] for an allocation of p: the blocks max calls of
 * pool_make_room() would evict one at a time once victim() has picked p's
 * own back, since evicting p's blocks changes nothing in another pool's
 * candidacy (issue 38: an allocation of 256 on a full pool evicted each
 * with its own search, its index neighbours' misses one after another,
 * and a stop on the free list). Each goes from CACHED to WRITABLE in one
 * step (pool_recycle()); the counters once. The walk of the LRU toward its
 * front is a chain of dependent misses (each victim's node.prev, cold after
 * a thousand requests): it runs EVICT_WALK victims ahead of the recycling,
 * one step a victim, so that its misses overlap the recycling's work
 * instead of coming all before it (issue 38, fifth pass); the victims'
 * index neighbours are asked for EVICT_AHEAD victims ahead, their entries'
 * lines having been asked for when the walk met them. Recycling a victim
 * unlinks it behind the walk: the links ahead are as they were. Returns
 * how many. */
static uint32_t evict_own(struct kv_pool *p, uint32_t max, struct kv_block **out)
{
	struct kv_block **v = out;
	struct kv_list *n = kv_list_back(&p->lru);
	uint32_t k = 0, i;

	if (max > EVICT_BATCH)
		max = EVICT_BATCH;
	for (i = 0; i < max; i++) {
		/* The walk: up to EVICT_WALK victims ahead of i. */
		for (; n != &p->lru && k < max && k <= i + EVICT_WALK; n = n->prev) {
			v[k] = kv_container_of(n, struct kv_block, node);
			__builtin_prefetch(&v[k]->ix);
			k++;
		}
		if (i >= k)
			break;
		if (i + EVICT_AHEAD < k) {
			const struct kv_index_entry *e = &v[i + EVICT_AHEAD]->ix;

			__builtin_prefetch(e->pprev, 1);
			if (e->next)
				__builtin_prefetch(&e->next->pprev, 1);
		}
		pool_recycle(v[i]);
	}
	pool_cached_add(p, -(int)k);
	p->n.writable += k;
	p->n.evictions += k;
	pool_lru_changed(p);
	return k;
}

/* Whether an allocation of namespace ns may evict q's cached blocks: its own
 * always, another namespace's only while it holds more than its reserve. */
static int may_take(const struct kv_pool *q, uint32_t ns)
{
	const struct kv_ns *m = pool_ns(q);

	return q->ns == ns || m->used[0] >= m->lim.reserve + q->block_bytes;
}

/* Whether every used block of run r is cached and evictable: now, or (with
 * later) once the demotions in flight complete and free theirs. */
static int run_all_cached(const struct kv_run *r, int later)
{
	return r->nused == r->nlru + (later ? r->ndemoting : 0);
}

/* Whether every run in segment s of dev holds only blocks ns may evict (now,
 * or later as run_all_cached()), so that evicting them frees the segment. */
static int seg_evictable(const struct kv_pages *dev, uint32_t s, uint32_t ns, int later)
{
	uint32_t i = s * dev->pages_per_seg, end = i + dev->pages_per_seg;

	while (i < end) {
		const struct kv_run *r = dev->owner[i];

		if (!r) {
			i++;
			continue;
		}
		if (r->nused && (!run_all_cached(r, later) || !may_take(r->pool, ns)))
			return 0;
		i += r->npages;
	}
	return 1;
}

/* Whether evicting the blocks of run gives pages pool p can use: the run
 * holds nothing but evictable blocks, and its segment is p's namespace's or
 * becomes free. */
static int run_helps(const struct kv_run *run, const struct kv_pool *p)
{
	const struct kv_pages *dev = pool_dev(p);
	uint32_t s = kv_pages_seg_of(dev, run->first_page);

	if (!run_all_cached(run, 0))
		return 0;
	return dev->segs[s].ns == p->ns || seg_evictable(dev, s, p->ns, 0);
}

uint32_t pool_keep_free_segs(const struct kv_pool *p)
{
	uint64_t r = kv_ns_reserved_for_others(&p->pools->nst, pool_ns(p));
	uint64_t sb = pool_dev(p)->segment_bytes;

	return (uint32_t)((r + sb - 1) / sb);
}

/* A cached block of one of q's runs that evicting would empty for p (every
 * block used in it cached and idle), or NULL. A walk of q's runs: only when
 * q's oldest block does not help, the way to pages that fragmentation of q's
 * runs by blocks in use would otherwise hide. */
static struct kv_block *pool_helpful_block(struct kv_pool *q, const struct kv_pool *p)
{
	struct kv_list *l;
	uint32_t i;

	kv_list_for_each(l, &q->runs) {
		struct kv_run *r = kv_container_of(l, struct kv_run, link);

		if (!r->nused || !run_helps(r, p))
			continue;
		for (i = 0; i < q->blocks_per_run; i++)
			if (r->blocks[i].state == KV_BLOCK_CACHED)
				return &r->blocks[i];
	}
	return NULL;
}

/* The block to evict for p next, or NULL: see the rules at the top. */
static struct kv_block *victim(struct kv_pool *p, int *spare, int *own_back)
{
	struct kv_pools *ps = p->pools;
	struct kv_list *n = kv_list_back(&p->lru);
	struct kv_block *best = n ? kv_container_of(n, struct kv_block, node) : NULL;
	uint32_t best_prio = pool_ns(p)->lim.priority, i;
	int own = best != NULL;

	*spare = 0;
	for (i = 0; i < ps->npools; i++) {
		struct kv_pool *q = pool_at(ps, i);
		struct kv_block *b;
		uint32_t prio;

		if (!q || q == p || q->device != p->device || !(n = kv_list_back(&q->lru)))
			continue;
		prio = pool_ns(q)->lim.priority;
		b = kv_container_of(n, struct kv_block, node);
		if (!may_take(q, p->ns))
			continue;
		if (!run_helps(b->run, p) && !(b = pool_helpful_block(q, p)))
			continue;
		if (!best || prio < best_prio || (prio == best_prio && !own && b->tick < best->tick)) {
			best = b;
			best_prio = prio;
			own = 0;
		}
	}
	/* Another pool's empty spare run costs nothing to give back: before
	 * any block of the same priority as p's own. */
	if (!own || !best) {
		for (i = 0; i < ps->npools; i++) {
			struct kv_pool *q = pool_at(ps, i);

			if (q && q != p && q->device == p->device && q->spare) {
				pool_run_release(q->spare);
				*spare = 1;
				return NULL;
			}
		}
	}
	*own_back = own;
	return best;
}

uint32_t pool_make_room(struct kv_pool *p, uint32_t want, struct kv_block **out,
			uint32_t *taken)
{
	int spare, own = 0;
	struct kv_block *b = victim(p, &spare, &own);

	*taken = 0;
	if (spare)
		return 1;
	if (!b)
		return 0;
	/* p's own oldest: the next victims are its next oldest, as long as
	 * it has some (evict_own()). */
	if (own && out)
		return *taken = evict_own(p, want, out);
	/* A run of p's that this empties may stay as p's spare: p refills it
	 * next; another pool's is released: the pages are what p needs. */
	pool_evict(b, b->run->pool == p);
	return 1;
}

int pool_can_get(struct kv_pool *p, uint32_t n, int later)
{
	struct kv_pool *q;
	struct kv_pages *dev = pool_dev(p);
	uint64_t blocks = p->n.free + p->n.cached - (later ? 0 : p->n.demoting);
	uint32_t s, free_segs = 0, keep = pool_keep_free_segs(p);

	if (blocks >= n)
		return 1;
	/* Runs p could get: per segment it may use, its free pages plus those
	 * of other pools' runs that eviction would empty, in whole runs. */
	for (s = 0; s < dev->nsegs && blocks < n; s++) {
		uint32_t i = s * dev->pages_per_seg, end = i + dev->pages_per_seg, pages = 0;

		if (dev->segs[s].ns == 0) {
			free_segs++;
			continue;
		}
		if (dev->segs[s].ns != p->ns && !seg_evictable(dev, s, p->ns, later))
			continue;
		while (i < end) {
			const struct kv_run *r = dev->owner[i];

			if (!r) {
				pages++;
				i++;
				continue;
			}
			q = r->pool;
			if (q != p && (!r->nused || (run_all_cached(r, later) && may_take(q, p->ns))))
				pages += r->npages;
			i += r->npages;
		}
		blocks += (uint64_t)(pages / p->run_pages) * p->blocks_per_run;
	}
	if (free_segs > keep)
		blocks += (uint64_t)(free_segs - keep) * (dev->pages_per_seg / p->run_pages) *
			  p->blocks_per_run;
	return blocks >= n;
}

int kv_pool_room_after_demotions(struct kv_pool *p, uint32_t n)
{
	struct kv_pools *ps = p->pools;
	uint32_t i;

	for (i = 0; i < ps->npools; i++) {
		struct kv_pool *q = pool_at(ps, i);

		if (q && q->device == p->device && q->n.demoting)
			return pool_can_get(p, n, 1);
	}
	return 0;
}

void pool_enospc_why(struct kv_pool *p, uint32_t n, uint32_t got, char *why, size_t len)
{
	struct kv_pages *dev = pool_dev(p);
	uint32_t s, own = 0, own_free = 0, free_segs = 0, other = 0, keep = pool_keep_free_segs(p);

	for (s = 0; s < dev->nsegs; s++) {
		if (!dev->segs[s].ns) {
			free_segs++;
		} else if (dev->segs[s].ns == p->ns) {
			own++;
			own_free += dev->pages_per_seg - dev->segs[s].used;
		} else {
			other++;
		}
	}
	snprintf(why, len,
		 "pool '%s' cannot get %u more blocks (got %u; it holds %llu writable + %llu sealed, "
		 "none cached): device %u has %u segments of %llu KiB: %u namespace '%s''s (%u "
		 "pages free, %u per run), %u free (%u held for others' reserves), %u other "
		 "namespaces' with blocks in use; a segment holds one namespace at a time",
		 p->name, n, got, (unsigned long long)p->n.writable - got,
		 (unsigned long long)p->n.sealed, p->device, dev->nsegs,
		 (unsigned long long)(dev->segment_bytes >> 10), own,
		 kv_ns_name(&p->pools->nst, p->ns), own_free, p->run_pages, free_segs,
		 keep < free_segs ? keep : free_segs, other);
}

int pool_quota_room(struct kv_pool *p, uint32_t n, int may_evict, char *why, size_t len)
{
	struct kv_ns *m = pool_ns(p);
	uint64_t q = m->lim.quota[0], need = (uint64_t)n * p->block_bytes;
	struct kv_ns_table *t = &p->pools->nst;

	if (!q || m->used[0] + need <= q)
		return 0;
	/* Only what it has cached can go, and only for an allocation that then
	 * fits. */
	if (may_evict && m->used[0] - m->cached + need <= q) {
		while (m->used[0] + need > q) {
			struct kv_block *oldest = NULL;
			struct kv_list *l = kv_list_back(&p->lru);
			uint32_t i;

			if (l) {
				oldest = kv_container_of(l, struct kv_block, node);
			} else {
				for (i = 0; i < p->pools->npools; i++) {
					struct kv_pool *o = pool_at(p->pools, i);
					struct kv_block *b;

					if (!o || o->ns != p->ns || !(l = kv_list_back(&o->lru)))
						continue;
					b = kv_container_of(l, struct kv_block, node);
					if (!oldest || b->tick < oldest->tick)
						oldest = b;
				}
			}
			if (!oldest)
				break;  /* the rest is being demoted */
			pool_evict(oldest, oldest->run->pool == p);
		}
		if (m->used[0] + need <= q)
			return 0;
	}
	m->quota_refusals++;
	if (why)
		snprintf(why, len,
			 "namespace '%s' is at its G1 quota: it holds %llu of %llu bytes (%llu in "
			 "use, %llu cached); %u more blocks of %llu bytes do not fit",
			 kv_ns_name(t, p->ns), (unsigned long long)m->used[0],
			 (unsigned long long)q, (unsigned long long)(m->used[0] - m->cached),
			 (unsigned long long)m->cached, n, (unsigned long long)p->block_bytes);
	return -EDQUOT;
}

/* ---- the heap of pools by their oldest cached block ------------------------
 * Per device, the pools whose LRU is not empty, in a binary min-heap by
 * (priority of their namespace, tick of their LRU's back). Ticks are unique
 * (one counter for all pools), so the order is total. A pool's key changes
 * only when its LRU's back does (its oldest block leaves, or the LRU empties
 * or fills), and priorities when a reload changes them (nst.prio_epoch:
 * every heap is rebuilt then, on the next search). */

static int heap_less(const struct kv_pool *a, const struct kv_pool *b)
{
	return a->heap_prio != b->heap_prio ? a->heap_prio < b->heap_prio
					    : a->heap_tick < b->heap_tick;
}

static void heap_put(struct kv_pool **h, uint32_t i, struct kv_pool *p)
{
	h[i] = p;
	p->heap_ix = i;
}

static void heap_sift(struct kv_pool **h, uint32_t n, uint32_t i)
{
	struct kv_pool *p = h[i];

	while (i > 0 && heap_less(p, h[(i - 1) / 2])) {
		heap_put(h, i, h[(i - 1) / 2]);
		i = (i - 1) / 2;
	}
	for (;;) {
		uint32_t c = 2 * i + 1;

		if (c >= n)
			break;
		if (c + 1 < n && heap_less(h[c + 1], h[c]))
			c++;
		if (!heap_less(h[c], p))
			break;
		heap_put(h, i, h[c]);
		i = c;
	}
	heap_put(h, i, p);
}

static void heap_key(struct kv_pool *p)
{
	struct kv_list *n = kv_list_back(&p->lru);

	p->heap_tick = kv_container_of(n, struct kv_block, node)->tick;
	p->heap_prio = pool_ns(p)->lim.priority;
}

void pool_heap_remove(struct kv_pool *p)
{
	struct kv_pools *ps = p->pools;
	struct kv_pool **h = ps->heap[p->device];
	uint32_t i = p->heap_ix, last;

	if (i == UINT32_MAX)
		return;
	last = --ps->nheap[p->device];
	p->heap_ix = UINT32_MAX;
	if (i != last) {
		heap_put(h, i, h[last]);
		heap_sift(h, last, i);
	}
}

void pool_lru_changed(struct kv_pool *p)
{
	struct kv_pools *ps = p->pools;
	uint32_t dev = p->device;
	uint64_t tick;

	if (kv_list_empty(&p->lru)) {
		pool_heap_remove(p);
		return;
	}
	tick = kv_container_of(kv_list_back(&p->lru), struct kv_block, node)->tick;
	if (p->heap_ix == UINT32_MAX) {
		heap_key(p);
		heap_put(ps->heap[dev], ps->nheap[dev]++, p);
	} else if (tick != p->heap_tick || pool_ns(p)->lim.priority != p->heap_prio) {
		heap_key(p);
	} else {
		return;
	}
	heap_sift(ps->heap[dev], ps->nheap[dev], p->heap_ix);
}

/* Every key taken again and every heap rebuilt: priorities changed. */
static void heap_rebuild(struct kv_pools *ps)
{
	for (uint32_t d = 0; d < ps->ndev; d++) {
		struct kv_pool **h = ps->heap[d];
		uint32_t n = ps->nheap[d], i;

		for (i = 0; i < n; i++)
			heap_key(h[i]);
		for (i = n / 2; i-- > 0;)
			heap_sift(h, n, i);
	}
	ps->heap_epoch = ps->nst.prio_epoch;
}

/* The block demotion takes next on device dev: the lowest priority first,
 * then the oldest; never from a namespace at or below its G1 reserve. The
 * heap's top, unless its namespace is at its reserve: then the heap is
 * searched best first (a second heap of its indices, in scratch), so the
 * cost grows with the pools passed over, not with all of them. */
struct kv_block *kv_pools_oldest_cached(struct kv_pools *ps, uint32_t dev)
{
	struct kv_pool **h = ps->heap[dev];
	uint32_t n = ps->nheap[dev], *q = ps->scratch, nq = 0;

	if (ps->heap_epoch != ps->nst.prio_epoch)
		heap_rebuild(ps);
	if (n)
		q[nq++] = 0;
	while (nq) {
		uint32_t i = q[0], j = 0, c, k;
		struct kv_pool *p = h[i];
		const struct kv_ns *m = pool_ns(p);

		if (m->used[0] >= m->lim.reserve + p->block_bytes)
			return kv_container_of(kv_list_back(&p->lru), struct kv_block, node);
		/* Pop i from q (a min-heap of indices into h), push its children. */
		q[0] = q[--nq];
		for (;;) {
			c = 2 * j + 1;
			if (c >= nq)
				break;
			if (c + 1 < nq && heap_less(h[q[c + 1]], h[q[c]]))
				c++;
			if (!heap_less(h[q[c]], h[q[j]]))
				break;
			k = q[c], q[c] = q[j], q[j] = k;
			j = c;
		}
		for (c = 2 * i + 1; c <= 2 * i + 2 && c < n; c++) {
			for (j = nq++, q[j] = c; j > 0 && heap_less(h[q[j]], h[q[(j - 1) / 2]]);
			     j = (j - 1) / 2)
				k = q[j], q[j] = q[(j - 1) / 2], q[(j - 1) / 2] = k;
		}
	}
	return NULL;
}

uint64_t kv_pools_evict_all(struct kv_pools *ps, int pool_id)
{
	uint64_t n = 0;
	uint32_t i;

	for (i = 0; i < ps->npools; i++) {
		struct kv_list *old;

		if ((pool_id >= 0 && (uint32_t)pool_id != i) || !pool_at(ps, i))
			continue;
		while ((old = kv_list_back(&ps->pool[i]->lru))) {
			pool_evict(kv_container_of(old, struct kv_block, node), 0);
			n++;
		}
	}
	return n;
}

int kv_pools_drop_cached(struct kv_block *b)
{
	if (b->state != KV_BLOCK_CACHED || b->demoting)
		return 0;
	pool_evict(b, 1);
	return 1;
}
