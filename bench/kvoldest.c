/* kvoldest: what finding the block to demote next costs, against the number
 * of pools. Demotion takes the oldest cached block of the lowest priority
 * across every pool of a device, once per block it copies down. Before
 * issue 15 that was a walk over every pool (kept here as walk(), the same
 * code as kv_pools_oldest_cached() was); now it is the top of a heap of
 * pools (evict.c). For each pool count this fills the pools of one
 * namespace with cached blocks (on the real host backend and allocator),
 * then times picks: each takes the oldest block, starts its demotion and
 * ends it as failed (which puts the block back as the newest, so the next
 * pick is another block of another pool), by the heap and by the walk on
 * the same state. Figures, never assertions.
 *
 *   kvoldest [POOLS...]        (default 1 16 256 4000) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "kvclock.h"
#include "ns.h"
#include "pool.h"

#define BLOCKS 4     /* cached blocks per pool */
#define PICKS 200000

/* The pools the bench registered, in the order of their ids (pool.h's
 * interface has no walk over them: the walk below keeps its own list and
 * takes each pool's oldest through kv_pool_oldest_cached(), as pool_int.h
 * and the pools' LRU lists are the pool module's alone). */
static struct kv_pool **pools;
static uint32_t npools_reg;

/* kv_pools_oldest_cached() as it was before the heap: every pool looked at. */
static struct kv_block *walk(struct kv_pools *ps, uint32_t dev)
{
	struct kv_block *oldest = NULL;
	uint32_t i, best_prio = 0;

	for (i = 0; i < npools_reg; i++) {
		struct kv_pool *q = pools[i];
		struct kv_block *b;
		struct kv_ns *m;

		if (!q || q->device != dev || !(b = kv_pool_oldest_cached(q)))
			continue;
		m = kv_ns_get(kv_pools_nstab(ps), q->ns);
		if (m->used[0] < m->lim.reserve + q->block_bytes)
			continue;
		if (!oldest || m->lim.priority < best_prio ||
		    (m->lim.priority == best_prio && b->tick < oldest->tick)) {
			oldest = b;
			best_prio = m->lim.priority;
		}
	}
	return oldest;
}

/* ns per pick by pick(), over PICKS picks; *same counts picks where the
 * heap and the walk agree (they must: a check on the bench itself). */
static double run(struct kv_pools *ps, struct kv_block *(*pick)(struct kv_pools *, uint32_t),
		  uint64_t *same)
{
	uint64_t t0 = kv_mono_ns();

	for (int i = 0; i < PICKS; i++) {
		struct kv_block *b = pick(ps, 0);

		if (same)
			*same += b == walk(ps, 0);
		kv_block_demote_begin(b);
		kv_block_demote_end(b, 0);
	}
	return (double)(kv_mono_ns() - t0) / PICKS;
}

int main(int argc, char **argv)
{
	static const uint32_t def[] = { 1, 16, 256, 4000 };
	uint32_t counts[16], ncounts = 0;

	for (int i = 1; i < argc && ncounts < 16; i++)
		counts[ncounts++] = (uint32_t)strtoul(argv[i], NULL, 10);
	if (!ncounts)
		for (ncounts = 0; ncounts < 4; ncounts++)
			counts[ncounts] = def[ncounts];
	printf("%8s %14s %14s %8s\n", "pools", "heap ns/pick", "walk ns/pick", "walk/heap");
	for (uint32_t c = 0; c < ncounts; c++) {
		uint32_t npools = counts[c];
		uint64_t pages = (uint64_t)npools * BLOCKS, same = 0;
		struct kv_backend *be;
		struct kv_pools *ps;
		double heap, walked;
		char err[256];
		int ns;

		/* One page (4 KiB) per block, one segment per 1,024 pages. */
		if (kv_backend_host_create(4096ull * 1024, (uint32_t)((pages + 1023) / 1024), &be) < 0 ||
		    kv_pools_create(be, 4096, &ps) < 0 || (ns = kv_pools_ns(ps, "bench")) < 1) {
			fprintf(stderr, "kvoldest: cannot set up %u pools\n", npools);
			return 1;
		}
		free(pools);
		if (!(pools = calloc(npools, sizeof(*pools)))) {
			fprintf(stderr, "kvoldest: out of memory\n");
			return 1;
		}
		npools_reg = npools;
		for (uint32_t i = 0; i < npools; i++) {
			char name[32];
			struct kv_pool_desc d = { .name = name, .block_bytes = 4096,
						  .block_tokens = 16, .dtype = "fp16" };
			struct kv_block *b[BLOCKS];
			struct kv_pool *p;
			uint8_t h[32] = { 0 };

			snprintf(name, sizeof(name), "p%u", i);
			if (kv_pool_register(ps, (uint32_t)ns, &d, &p, err, sizeof(err)) < 0 ||
			    kv_pool_alloc(p, BLOCKS, b, err, sizeof(err)) < 0) {
				fprintf(stderr, "kvoldest: pool %u: %s\n", i, err);
				return 1;
			}
			pools[i] = p;
			for (int k = 0; k < BLOCKS; k++) {
				memcpy(h, &i, sizeof(i));
				h[4] = (uint8_t)k;
				kv_block_unref(kv_pool_seal(p, b[k], h));
			}
		}
		run(ps, kv_pools_oldest_cached, &same);    /* warm, and checked */
		heap = run(ps, kv_pools_oldest_cached, NULL);
		walked = run(ps, walk, NULL);
		printf("%8u %14.1f %14.1f %7.1fx%s\n", npools, heap, walked, walked / heap,
		       same == PICKS ? "" : "  (the heap and the walk disagreed!)");
		kv_pools_destroy(ps);
		kv_backend_destroy(be);
	}
	free(pools);
	return 0;
}
