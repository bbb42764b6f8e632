/* The invariant checker of the pool module: kv_pools_check() walks every
 * block, list, run and page against what pool.h and pages.h say holds. */
#include "pool_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

struct checker {
	void (*report)(void *ctx, const char *msg);
	void *ctx;
	int problems;
};

static void __attribute__((format(printf, 2, 3))) bad(struct checker *c, const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (c->problems++ < 100 && c->report)
		c->report(c->ctx, msg);
}

static void check_block(struct kv_pools *ps, struct checker *c, struct kv_block *b, int refs,
			uint64_t *counts)
{
	struct kv_pool *p = b->run->pool;
	unsigned long long h = (unsigned long long)kv_block_handle(b);
	struct kv_block *in_ix = b->state == KV_BLOCK_SEALED || b->state == KV_BLOCK_CACHED
					 ? kv_pool_find(p, b->ix.hash) : NULL;

	if (b->state > KV_BLOCK_CACHED) {
		bad(c, "block %#llx: bad state %u", h, b->state);
		return;
	}
	counts[b->state]++;
	switch (b->state) {
	case KV_BLOCK_FREE:
		if (b->ref || !kv_list_linked(&b->node))
			bad(c, "block %#llx FREE: ref %u, on list %d", h, b->ref,
			    kv_list_linked(&b->node));
		break;
	case KV_BLOCK_WRITABLE:
		if (!b->ref || kv_list_linked(&b->node))
			bad(c, "block %#llx WRITABLE: ref %u, on list %d", h, b->ref,
			    kv_list_linked(&b->node));
		break;
	case KV_BLOCK_SEALED:
		if (!b->ref || kv_list_linked(&b->node) || in_ix != b)
			bad(c, "block %#llx SEALED: ref %u, on list %d, indexed %d", h, b->ref,
			    kv_list_linked(&b->node), in_ix == b);
		break;
	case KV_BLOCK_CACHED:
		if (b->ref || !kv_list_linked(&b->node) || in_ix != b)
			bad(c, "block %#llx CACHED: ref %u, on list %d, indexed %d", h, b->ref,
			    kv_list_linked(&b->node), in_ix == b);
		break;
	}
	if (b->ref > KV_BLOCK_REF_MAX)
		bad(c, "block %#llx: ref %u over the maximum %u", h, b->ref, KV_BLOCK_REF_MAX);
	/* The owner slot (sessrefs.h): references counted only with an
	 * owner, never more than the block has, no owner on a FREE block;
	 * with refs, every owner lists the block (kv_sessrefs_each()). */
	if ((!b->owner && b->own) || b->own > b->ref || (b->state == KV_BLOCK_FREE && b->owner))
		bad(c, "block %#llx: owner %llu holds %u of its %u references", h,
		    (unsigned long long)b->owner, b->own, b->ref);
	if (refs && b->owner && !b->listed)
		bad(c, "block %#llx: its owner %llu does not list it", h,
		    (unsigned long long)b->owner);
	if (refs && b->check != b->ref)
		bad(c, "block %#llx: ref %u but sessions hold %u", h, b->ref, b->check);
	if (kv_block_lookup(ps, kv_block_handle(b)) != b)
		bad(c, "block %#llx: its handle does not resolve to it", h);
}

static void check_list(struct checker *c, struct kv_pool *p, struct kv_list *head, int state,
		       uint64_t want, int demoting)
{
	struct kv_list *pos;
	uint64_t n = 0, prev_tick = UINT64_MAX;

	kv_list_for_each(pos, head) {
		struct kv_block *b = kv_container_of(pos, struct kv_block, node);

		if (b->run->pool != p || b->state != state || b->demoting != demoting) {
			bad(c, "pool %u: list of state %d holds a block of pool %u state %u", p->id,
			    state, b->run->pool->id, b->state);
			return;
		}
		if (state == KV_BLOCK_CACHED && b->tick > prev_tick)
			bad(c, "pool %u: LRU out of order", p->id);
		prev_tick = b->tick;
		if (++n > want)
			break;
	}
	if (n != want)
		bad(c, "pool %u: list of state %d has %s%llu blocks, %llu counted", p->id, state,
		    n > want ? "more than " : "", (unsigned long long)n, (unsigned long long)want);
}

/* The id map: live pools where their ids say, the sentinel everywhere
 * else, npools just past the highest live id. */
static void check_ids(struct kv_pools *ps, struct checker *c)
{
	const struct kv_pool *h = &ps->hole;
	uint32_t i;

	if (h->device != UINT32_MAX || !kv_list_empty(&h->free) || !kv_list_empty(&h->lru) ||
	    !kv_list_empty(&h->demoting) || !kv_list_empty(&h->runs) || h->spare || h->holds)
		bad(c, "the free-id sentinel pool is not empty");
	if (ps->npools > KV_MAX_POOLS || (ps->npools && ps->pool[ps->npools - 1] == h))
		bad(c, "pool ids end at %u, not just past the highest live one", ps->npools);
	for (i = 0; i < KV_MAX_POOLS; i++) {
		if (ps->pool[i] == h)
			continue;
		if (i >= ps->npools || ps->pool[i]->id != i)
			bad(c, "pool id %u: holds pool %u (ids end at %u)", i, ps->pool[i]->id,
			    ps->npools);
	}
}

/* Each device's heap of pools (evict.c): exactly the pools of the device
 * with blocks on their LRU, each where its heap_ix says, keyed by its LRU's
 * back, in heap order. */
static void check_heaps(struct kv_pools *ps, struct checker *c)
{
	uint32_t i, d, on = 0, want = 0;

	for (d = 0; d < ps->ndev; d++) {
		struct kv_pool **h = ps->heap[d];

		for (i = 0; i < ps->nheap[d]; i++) {
			const struct kv_pool *p = h[i];

			if (p->device != d || p->heap_ix != i || kv_list_empty(&p->lru) ||
			    p->heap_tick != kv_container_of(kv_list_back(&p->lru), struct kv_block,
							    node)->tick) {
				bad(c, "device %u: heap entry %u (pool %u) is misplaced or keyed by "
				    "another block than its LRU's oldest", d, i, p->id);
				return;
			}
			if (i > 0 && (h[(i - 1) / 2]->heap_prio > p->heap_prio ||
				      (h[(i - 1) / 2]->heap_prio == p->heap_prio &&
				       h[(i - 1) / 2]->heap_tick > p->heap_tick))) {
				bad(c, "device %u: heap out of order at %u", d, i);
				return;
			}
		}
		on += ps->nheap[d];
	}
	for (i = 0; i < ps->npools; i++) {
		const struct kv_pool *p = pool_at(ps, i);

		if (p && !kv_list_empty(&p->lru))
			want++;
		if (p && kv_list_empty(&p->lru) && p->heap_ix != UINT32_MAX)
			bad(c, "pool %u: in the heap with an empty LRU", p->id);
	}
	if (on != want)
		bad(c, "%u pools in the heaps, %u have cached blocks on their LRU", on, want);
}

int kv_pools_check(struct kv_pools *ps, int refs, void (*report)(void *ctx, const char *msg),
		   void *ctx, uint64_t *blocks, uint64_t tier_entries)
{
	struct checker c = { .report = report, .ctx = ctx };
	uint64_t walked = 0, indexed = 0, unused = 0;
	uint64_t ns_used[KV_MAX_NS], ns_cached[KV_MAX_NS];  /* per namespace id - 1 */
	uint32_t i, d, pg, live = 0, ns_pools[KV_MAX_NS + 1] = { 0 };
	struct kv_list *ipos;

	memset(ns_used, 0, sizeof(ns_used));
	memset(ns_cached, 0, sizeof(ns_cached));
	check_ids(ps, &c);
	check_heaps(ps, &c);
	for (i = 0; i < ps->npools; i++) {
		struct kv_pool *p = pool_at(ps, i);
		uint64_t counts[4] = { 0 }, runs = 0;
		struct kv_list *pos;

		if (!p)
			continue;
		live++;
		if (p->ns >= 1 && p->ns <= KV_MAX_NS)
			ns_pools[p->ns]++;
		if (!kv_ns_get(&ps->nst, p->ns))
			bad(&c, "pool %u: its namespace %u is not live", p->id, p->ns);
		if (refs && p->holds != p->check_holds)
			bad(&c, "pool %u: %u holds, %u known (sessions that registered it, tier "
				"copies and swaps)", p->id, p->holds, p->check_holds);
		/* Idle means queued: the next collection frees it. */
		if (!p->holds && !p->n.writable && !p->n.sealed && !p->n.cached &&
		    !kv_list_linked(&p->idle))
			bad(&c, "pool %u: nothing uses it, yet it is not queued to be freed", p->id);

		kv_list_for_each(pos, &p->runs) {
			struct kv_run *run = kv_container_of(pos, struct kv_run, link);
			struct kv_pages *dev = pool_dev(p);
			uint32_t used = 0, lru = 0, demoting = 0, s;

			runs++;
			for (pg = 0; pg < run->npages; pg++)
				if (dev->owner[run->first_page + pg] != run)
					bad(&c, "pool %u: page %u of a run is not owned by it", p->id,
					    run->first_page + pg);
			for (s = 0; s < p->blocks_per_run; s++) {
				const struct kv_block *b = &run->blocks[s];

				check_block(ps, &c, &run->blocks[s], refs, counts);
				used += b->state != KV_BLOCK_FREE;
				lru += b->state == KV_BLOCK_CACHED && !b->demoting;
				demoting += b->demoting;
			}
			if (used != run->nused || lru != run->nlru || demoting != run->ndemoting)
				bad(&c, "pool %u run at page %u: %u blocks used (%u on the LRU, %u "
				    "being demoted), %u (%u, %u) counted", p->id, run->first_page, used,
				    lru, demoting, run->nused, run->nlru, run->ndemoting);
			if (!used && p->spare != run)
				bad(&c, "pool %u run at page %u: empty but not the spare", p->id,
				    run->first_page);
			walked += p->blocks_per_run;
		}
		if (runs != p->n.runs || counts[0] != p->n.free || counts[1] != p->n.writable ||
		    counts[2] != p->n.sealed || counts[3] != p->n.cached)
			bad(&c, "pool %u: counters (runs %llu free %llu writable %llu sealed %llu "
				"cached %llu) differ from blocks (%llu %llu %llu %llu %llu)", p->id,
			    (unsigned long long)p->n.runs, (unsigned long long)p->n.free,
			    (unsigned long long)p->n.writable, (unsigned long long)p->n.sealed,
			    (unsigned long long)p->n.cached, (unsigned long long)runs,
			    (unsigned long long)counts[0], (unsigned long long)counts[1],
			    (unsigned long long)counts[2], (unsigned long long)counts[3]);
		if (kv_ns_get(&ps->nst, p->ns)) {
			ns_used[p->ns - 1] += (counts[1] + counts[2] + counts[3]) * p->block_bytes;
			ns_cached[p->ns - 1] += counts[3] * p->block_bytes;
		}
		check_list(&c, p, &p->free, KV_BLOCK_FREE, counts[0], 0);
		check_list(&c, p, &p->lru, KV_BLOCK_CACHED, counts[3] - p->n.demoting, 0);
		check_list(&c, p, &p->demoting, KV_BLOCK_CACHED, p->n.demoting, 1);
		indexed += counts[2] + counts[3];
	}
	/* Every namespace's G1 usage is its pools' blocks, exactly; the
	 * reserves' bookkeeping follows from it. */
	for (i = 0; i < KV_MAX_NS; i++) {
		const struct kv_ns *n = &ps->nst.ns[i];

		if (!n->refs)
			continue;
		if (n->used[0] != ns_used[i] || n->cached != ns_cached[i])
			bad(&c, "namespace '%s': G1 %llu bytes used (%llu cached) counted, its "
				"blocks hold %llu (%llu)", n->name, (unsigned long long)n->used[0],
			    (unsigned long long)n->cached, (unsigned long long)ns_used[i],
			    (unsigned long long)ns_cached[i]);
		unused += n->lim.reserve > n->used[0] ? n->lim.reserve - n->used[0] : 0;
	}
	if (unused != ps->nst.reserve_unused)
		bad(&c, "namespaces: %llu bytes of reserve unused, %llu counted",
		    (unsigned long long)unused, (unsigned long long)ps->nst.reserve_unused);
	if (live != ps->nlive)
		bad(&c, "%u pools live, %u counted", live, ps->nlive);
	for (d = 1; d <= KV_MAX_NS; d++) {
		const struct kv_ns *n = kv_ns_get(&ps->nst, d);

		if (n ? n->pools != ns_pools[d] : ns_pools[d] != 0)
			bad(&c, "namespace %u: %u pools, %u counted", d, ns_pools[d], n ? n->pools : 0);
	}
	kv_list_for_each(ipos, &ps->idle) {
		const struct kv_pool *p = kv_container_of(ipos, struct kv_pool, idle);

		if (p == &ps->hole || p->id >= ps->npools || ps->pool[p->id] != p)
			bad(&c, "the idle list holds a pool that is not live");
	}
	if (indexed + tier_entries != ps->index.count)
		bad(&c, "index holds %zu entries, %llu blocks are sealed or cached, %llu in lower tiers",
		    ps->index.count, (unsigned long long)indexed, (unsigned long long)tier_entries);
	for (d = 0; d < ps->ndev; d++) {
		struct kv_pages *dev = &ps->dev[d];
		uint32_t nfree = 0, free_segs = 0, s;

		for (pg = 0; pg < dev->npages; pg++) {
			int isfree = (int)(dev->free_bits[pg / 64] >> (pg % 64)) & 1;

			nfree += isfree;
			if (isfree == (dev->owner[pg] != NULL))
				bad(&c, "device %u page %u: free bit %d but owner %p", d, pg, isfree,
				    dev->owner[pg]);
		}
		if (nfree != dev->nfree)
			bad(&c, "device %u: %u pages free, %u counted", d, nfree, dev->nfree);
		for (s = 0; s < dev->nsegs; s++) {
			uint32_t used = 0;

			for (pg = s * dev->pages_per_seg; pg < (s + 1) * dev->pages_per_seg; pg++)
				used += dev->owner[pg] != NULL;
			if (used != dev->segs[s].used || (!used && dev->segs[s].ns))
				bad(&c, "device %u segment %u: %u pages used, %u counted, owner %u", d,
				    s, used, dev->segs[s].used, dev->segs[s].ns);
			free_segs += !dev->segs[s].ns;
		}
		if (free_segs != dev->free_segs)
			bad(&c, "device %u: %u segments free, %u counted", d, free_segs,
			    dev->free_segs);
	}
	if (blocks)
		*blocks = walked;
	return c.problems;
}

void kv_pools_check_clear(struct kv_pools *ps)
{
	uint32_t i, s;

	for (i = 0; i < ps->npools; i++) {
		struct kv_list *pos;

		ps->pool[i]->check_holds = 0;
		kv_list_for_each(pos, &ps->pool[i]->runs) {
			struct kv_run *run = kv_container_of(pos, struct kv_run, link);

			for (s = 0; s < ps->pool[i]->blocks_per_run; s++)
				run->blocks[s].check = 0, run->blocks[s].listed = 0;
		}
	}
}
