/* Pools, runs and blocks; see pool.h for the lifecycle and its invariants.
 * Over 800 lines: the block state machine and the run and page bookkeeping
 * under it change together (evict.c holds the eviction policy). */
#include "pool_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "events.h"
#include "hugemem.h"
#include "kvassert.h"
#include "kvsan.h"
#include "kvtext.h"
#include "refmap.h"

/* kvsan.h asks clang as well as GCC: the CI's ASan build is clang's, and
 * with GCC's test alone the runs' memory was never poisoned there. */
#if KV_ASAN
#include <sanitizer/asan_interface.h>
#define RUNMEM_POISON(a, n) ASAN_POISON_MEMORY_REGION((a), (n))
#define RUNMEM_UNPOISON(a, n) ASAN_UNPOISON_MEMORY_REGION((a), (n))
#else
#define RUNMEM_POISON(a, n) ((void)(a), (void)(n))
#define RUNMEM_UNPOISON(a, n) ((void)(a), (void)(n))
#endif

/* See KV_BLOCK_REF_MAX: a session's refmap count on a block is at most the
 * block's ref, so it must be able to reach it. */
/* pool.h's layout: the index entry in the first line, two lines a block. */
_Static_assert(sizeof(struct kv_index_entry) <= 64 && sizeof(struct kv_block) == 128,
	       "a block is two cache lines, its index entry the first");
_Static_assert(KV_BLOCK_REF_MAX <= KV_REFMAP_COUNT_MAX,
	       "a block's references must fit a session's refmap count");

#define GEN_MASK KV_HANDLE_GEN_MASK

struct kv_index *kv_pools_index(struct kv_pools *ps)
{
	return &ps->index;
}

void kv_pools_set_events(struct kv_pools *ps, struct kv_events *ev)
{
	ps->ev = ev;
}

struct kv_events *kv_pools_events(const struct kv_pools *ps)
{
	return ps->ev;
}

/* The index's bucket seed: unpredictable to peers, so that no client can
 * pick hashes that collide in one bucket. The kernel's random bytes; early in
 * boot, before its pool is ready, those it gives without waiting
 * (GRND_INSECURE) or the 16 it gave this process at exec (AT_RANDOM), mixed
 * with the pid and clock, never the clock alone. */
static uint64_t index_seed(void)
{
	uint64_t seed = 0, mix[4];
	const void *at;

	if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) == sizeof(seed))
		return seed;
#ifdef GRND_INSECURE
	if (getrandom(&seed, sizeof(seed), GRND_INSECURE) == sizeof(seed))
		return seed;
#endif
	memset(mix, 0, sizeof(mix));
	if ((at = (const void *)getauxval(AT_RANDOM)))
		memcpy(mix, at, 16);
	mix[2] = (uint64_t)getpid();
	mix[3] = kv_mono_ms();
	return XXH3_64bits(mix, sizeof(mix));
}

/* ---- where runs' structs live ----------------------------------------------
 * A run's struct (its blocks' metadata, two cache lines a block) was its own
 * aligned_alloc(): 4 KiB pages spread over the heap, so that eviction, a
 * Seal's index probes and a chain's lookup took a TLB miss on nearly every
 * block of a large pool (issue 38: with glibc's THP tunable the batches of
 * 256 ran 7-8% faster). Now each device has one mapping, reserved for its
 * pages (MAP_NORESERVE: only what runs touch is backed), in transparent huge
 * pages where the kernel gives them: a slot of runmem_stride bytes per page,
 * enough for the most blocks a page can hold (page_bytes / KV_MIN_BLOCK_BYTES)
 * plus a run's header, so a run of k pages at first page P fits in the slots
 * of P .. P+k-1, which no other run overlaps. A released run's memory stays
 * (reused when a run starts at that page again): at most a 32nd of the
 * device's bytes, what a pool of the smallest blocks over all of it uses. If
 * the mapping cannot be made, runs come from aligned_alloc() as before. */

static size_t runmem_stride(uint64_t page_bytes)
{
	uint64_t blocks = page_bytes / KV_MIN_BLOCK_BYTES;

	if (blocks > KV_MAX_RUN_BLOCKS)
		blocks = KV_MAX_RUN_BLOCKS;
	return (size_t)(blocks * sizeof(struct kv_block)) +
	       ((sizeof(struct kv_run) + _Alignof(struct kv_run) - 1) &
		~(_Alignof(struct kv_run) - 1));
}

static void runmem_init(struct kv_pools *ps, uint32_t d)
{
	size_t stride = runmem_stride(ps->dev[d].page_bytes);
	size_t bytes = kv_huge_round(stride * ps->dev[d].npages);
	uint8_t *a;

	if (!bytes || !(a = kv_huge_map(bytes, 1)))
		return;
	RUNMEM_POISON(a, bytes);
	ps->runmem[d] = a;
	ps->runmem_bytes[d] = bytes;
	ps->runmem_stride[d] = stride;
}

/* Memory for the struct of a run of p starting at page first. */
static struct kv_run *run_mem_get(struct kv_pool *p, uint32_t first)
{
	struct kv_pools *ps = p->pools;
	size_t bytes = sizeof(struct kv_run) + sizeof(struct kv_block) * p->blocks_per_run;
	struct kv_run *run;

	if (!ps->runmem[p->device])
		/* Aligned for its blocks' cache lines (pool.h); a multiple
		 * of it, as aligned_alloc() wants. */
		return aligned_alloc(_Alignof(struct kv_run),
				     (bytes + _Alignof(struct kv_run) - 1) &
				     ~(_Alignof(struct kv_run) - 1));
	kv_assert(bytes <= ps->runmem_stride[p->device] * p->run_pages);
	run = (struct kv_run *)(void *)(ps->runmem[p->device] +
					(size_t)first * ps->runmem_stride[p->device]);
	RUNMEM_UNPOISON(run, bytes);
	return run;
}

static void run_mem_put(struct kv_run *run)
{
	struct kv_pools *ps;

	if (!run)
		return;
	ps = run->pool->pools;
	if (!ps->runmem[run->pool->device]) {
		free(run);
		return;
	}
	RUNMEM_POISON(run, sizeof(struct kv_run) + sizeof(struct kv_block) * run->pool->blocks_per_run);
}

int kv_pools_create(struct kv_backend *be, uint64_t page_bytes, struct kv_pools **out)
{
	struct kv_pools *ps = calloc(1, sizeof(*ps));
	uint32_t d;
	int r;

	if (!ps)
		return -ENOMEM;
	ps->be = be;
	ps->ndev = be->devices;
	/* The sentinel behind every free id: on no device, with nothing on
	 * its lists, it is skipped by whatever a loop looks for. */
	ps->hole.device = UINT32_MAX;
	ps->hole.pools = ps;
	kv_list_init(&ps->hole.free);
	kv_list_init(&ps->hole.lru);
	kv_list_init(&ps->hole.demoting);
	kv_list_init(&ps->hole.runs);
	kv_list_init(&ps->hole.idle);
	for (d = 0; d < KV_MAX_POOLS; d++)
		ps->pool[d] = &ps->hole;
	ps->hole.heap_ix = UINT32_MAX;
	kv_list_init(&ps->idle);
	for (d = 0; d < be->devices; d++) {
		r = kv_pages_init(&ps->dev[d], d, be->segments[d], be->segment_bytes, page_bytes);
		if (r < 0)
			goto err;
		r = -ENOMEM;
		if (!(ps->heap[d] = calloc(KV_MAX_POOLS, sizeof(*ps->heap[d]))))
			goto err;
		runmem_init(ps, d);
	}
	r = -ENOMEM;
	if (!(ps->scratch = calloc(KV_MAX_POOLS + 1, sizeof(*ps->scratch))))
		goto err;
	r = kv_index_init(&ps->index, index_seed());
	if (r < 0)
		goto err;
	*out = ps;
	return 0;
err:
	kv_pools_destroy(ps);
	return r;
}

static void pool_free(struct kv_pool *p)
{
	struct kv_list *pos, *tmp;

	if (!p)
		return;
	kv_list_for_each_safe(pos, tmp, &p->runs)
		run_mem_put(kv_container_of(pos, struct kv_run, link));
	free(p->layout);
	free(p);
}

void kv_pools_destroy(struct kv_pools *ps)
{
	uint32_t i;

	if (!ps)
		return;
	for (i = 0; i < ps->npools; i++)
		pool_free(pool_at(ps, i));
	for (i = 0; i < ps->ndev; i++) {
		kv_pages_fini(&ps->dev[i]);
		free(ps->heap[i]);
		/* ASan keeps its poison on addresses, not on a mapping: a
		 * later mapping at the same place (an io_uring ring of the
		 * next daemon in one fuzzing process) would read as poisoned. */
		if (ps->runmem[i])
			RUNMEM_UNPOISON(ps->runmem[i], ps->runmem_bytes[i]);
		kv_huge_unmap(ps->runmem[i], ps->runmem_bytes[i]);
	}
	free(ps->scratch);
	kv_index_fini(&ps->index);
	free(ps);
}

struct kv_ns_table *kv_pools_nstab(struct kv_pools *ps)
{
	return &ps->nst;
}

int kv_pools_ns(struct kv_pools *ps, const char *name)
{
	return kv_ns_open(&ps->nst, name);
}

void kv_pools_ns_put(struct kv_pools *ps, uint32_t ns)
{
	uint32_t d;

	kv_ns_put(&ps->nst, ns);
	if (kv_ns_get(&ps->nst, ns))
		return;
	for (d = 0; d < ps->ndev; d++)
		kv_pages_forget_ns(&ps->dev[d], ns);
}

const char *kv_pools_ns_name(const struct kv_pools *ps, uint32_t ns)
{
	return kv_ns_name(&ps->nst, ns);
}

int kv_pool_run_size(uint64_t page_bytes, uint32_t pages_per_seg, uint64_t block_bytes,
		     uint32_t *blocks)
{
	uint32_t k, best = 0;
	double best_waste = 2.0;

	if (!block_bytes || block_bytes > page_bytes * pages_per_seg)
		return -EINVAL;
	for (k = 1; k <= pages_per_seg; k++) {
		uint64_t bytes = page_bytes * k, n = bytes / block_bytes;
		double waste;

		if (n == 0)
			continue;
		if (n > KV_MAX_RUN_BLOCKS)  /* the slot field's limit */
			n = KV_MAX_RUN_BLOCKS;
		waste = (double)(bytes - n * block_bytes) / (double)bytes;
		if (waste < best_waste) {
			best_waste = waste;
			best = k;
		}
		if (waste < 0.02)
			break;
	}
	if (!best)
		return -EINVAL;
	*blocks = (uint32_t)(page_bytes * best / block_bytes);
	if (*blocks > KV_MAX_RUN_BLOCKS)
		*blocks = KV_MAX_RUN_BLOCKS;
	return (int)best;
}

static int desc_matches(const struct kv_pool *p, const struct kv_pool_desc *d)
{
	const char *dtype = d->dtype ? d->dtype : "";

	return p->device == d->device && p->block_bytes == d->block_bytes &&
	       p->block_tokens == d->block_tokens && !strcmp(p->dtype, dtype) &&
	       p->layout_len == d->layout_len &&
	       (!d->layout_len || !memcmp(p->layout, d->layout, d->layout_len));
}

int kv_pool_register(struct kv_pools *ps, uint32_t ns, const struct kv_pool_desc *d,
		     struct kv_pool **out, char *err, size_t errlen)
{
	const char *dtype = d->dtype ? d->dtype : "";
	struct kv_pool *p;
	uint32_t i, blocks;
	int pages;

	/* Names and dtypes reach logs, JSON and Prometheus labels: text. */
	if (!d->name || !d->name[0] || strlen(d->name) >= KV_NAME_MAX || !kv_text_ok(d->name)) {
		snprintf(err, errlen, "pool name must be 1..%d bytes of UTF-8 text without control "
			 "characters", KV_NAME_MAX - 1);
		return -EINVAL;
	}
	if (!kv_text_ok(dtype)) {
		snprintf(err, errlen, "pool '%s': dtype must be UTF-8 text without control "
			 "characters", d->name);
		return -EINVAL;
	}
	for (i = 0; i < ps->npools; i++) {
		p = pool_at(ps, i);
		if (!p || p->ns != ns || strcmp(p->name, d->name))
			continue;
		if (!desc_matches(p, d)) {
			snprintf(err, errlen,
				 "pool '%s' exists with another layout (device %u, block_bytes %llu, "
				 "block_tokens %u, dtype '%s')", p->name, p->device,
				 (unsigned long long)p->block_bytes, p->block_tokens, p->dtype);
			return -EEXIST;
		}
		kv_pool_hold(p);
		*out = p;
		return 0;
	}
	if (d->device >= ps->ndev) {
		snprintf(err, errlen, "device %u does not exist (%u devices)", d->device, ps->ndev);
		return -EINVAL;
	}
	if (d->block_bytes < KV_MIN_BLOCK_BYTES || d->block_bytes % KV_BLOCK_ALIGN ||
	    d->block_bytes > ps->dev[d->device].segment_bytes) {
		snprintf(err, errlen,
			 "block_bytes %llu: must be a multiple of %d from %d to the segment size %llu",
			 (unsigned long long)d->block_bytes, KV_BLOCK_ALIGN, KV_MIN_BLOCK_BYTES,
			 (unsigned long long)ps->dev[d->device].segment_bytes);
		return -EINVAL;
	}
	if (strlen(dtype) >= sizeof(p->dtype)) {
		snprintf(err, errlen, "dtype longer than %zu bytes", sizeof(p->dtype) - 1);
		return -EINVAL;
	}
	if (ps->nlive == KV_MAX_POOLS) {
		snprintf(err, errlen, "%d pools exist already", KV_MAX_POOLS);
		return -ENOSPC;
	}
	pages = kv_pool_run_size(ps->dev[d->device].page_bytes, ps->dev[d->device].pages_per_seg,
				 d->block_bytes, &blocks);
	if (pages < 0) {
		snprintf(err, errlen, "no run size fits block_bytes %llu",
			 (unsigned long long)d->block_bytes);
		return -EINVAL;
	}
	p = calloc(1, sizeof(*p));
	if (!p || (d->layout_len && !(p->layout = malloc(d->layout_len)))) {
		free(p);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	/* Round robin from the last id handed out: the id freed longest ago
	 * comes back first (pool.h). */
	for (i = 0; i < KV_MAX_POOLS; i++)
		if (ps->pool[(ps->next_id + i) % KV_MAX_POOLS] == &ps->hole)
			break;
	kv_assert(i < KV_MAX_POOLS);  /* nlive < KV_MAX_POOLS */
	p->id = (ps->next_id + i) % KV_MAX_POOLS;
	ps->next_id = (p->id + 1) % KV_MAX_POOLS;
	p->ns = ns;
	p->device = d->device;
	memcpy(p->name, d->name, strlen(d->name) + 1);
	memcpy(p->dtype, dtype, strlen(dtype) + 1);
	p->block_bytes = d->block_bytes;
	p->block_tokens = d->block_tokens;
	p->run_pages = (uint32_t)pages;
	p->blocks_per_run = blocks;
	if (d->layout_len)
		memcpy(p->layout, d->layout, d->layout_len);
	p->layout_len = d->layout_len;
	kv_list_init(&p->free);
	kv_list_init(&p->lru);
	kv_list_init(&p->demoting);
	kv_list_init(&p->runs);
	kv_list_init(&p->idle);
	p->heap_ix = UINT32_MAX;
	p->pools = ps;
	p->holds = 1;  /* the caller's */
	ps->pool[p->id] = p;
	ps->nlive++;
	if (p->id >= ps->npools)
		ps->npools = p->id + 1;
	/* The pool keeps its namespace: the namespace's usage is its blocks'. */
	kv_ns_hold(&ps->nst, ns);
	kv_ns_get(&ps->nst, ns)->pools++;
	*out = p;
	return 1;
}

/* Blocks not FREE (demoting ones are CACHED). */
static uint64_t pool_in_use(const struct kv_pool *p)
{
	return p->n.writable + p->n.sealed + p->n.cached;
}

/* Queues p for kv_pools_collect() if nothing keeps it any more. */
static void pool_check_idle(struct kv_pool *p)
{
	if (!p->holds && !pool_in_use(p) && !kv_list_linked(&p->idle))
		kv_list_push_back(&p->pools->idle, &p->idle);
}

void kv_pool_hold(struct kv_pool *p)
{
	kv_assert(p != &p->pools->hole && p->holds < UINT32_MAX);
	p->holds++;
}

void kv_pool_put(struct kv_pool *p)
{
	kv_assert(p != &p->pools->hole && p->holds > 0);
	if (--p->holds == 0)
		pool_check_idle(p);
}

/* Frees idle p: its spare run, its namespace reference, its id. */
static void pool_destroy(struct kv_pools *ps, struct kv_pool *p)
{
	uint32_t ns = p->ns;

	kv_assert(!p->holds && !pool_in_use(p) && !kv_list_linked(&p->idle));
	kv_assert(p->heap_ix == UINT32_MAX);   /* no block on its LRU */
	if (p->spare)
		pool_run_release(p->spare);
	/* An empty run is always the spare: nothing else is left. */
	kv_assert(kv_list_empty(&p->runs) && !p->n.runs && !p->n.free && !p->n.demoting);
	kv_assert(ps->pool[p->id] == p && ps->nlive > 0);
	ps->pool[p->id] = &ps->hole;
	ps->nlive--;
	while (ps->npools && ps->pool[ps->npools - 1] == &ps->hole)
		ps->npools--;
	kv_ns_get(&ps->nst, ns)->pools--;
	pool_free(p);
	kv_pools_ns_put(ps, ns);
}

uint32_t kv_pools_collect(struct kv_pools *ps, void (*gone)(void *ctx, struct kv_pool *p),
			  void *ctx)
{
	uint32_t n = 0;

	while (!kv_list_empty(&ps->idle)) {
		struct kv_pool *p = kv_container_of(kv_list_front(&ps->idle), struct kv_pool, idle);

		kv_list_del(&p->idle);
		/* Held again, or given a block, since it went idle. */
		if (p->holds || pool_in_use(p))
			continue;
		if (gone)
			gone(ctx, p);
		pool_destroy(ps, p);
		n++;
	}
	return n;
}

struct kv_pool *kv_pools_by_name(struct kv_pools *ps, uint32_t ns, const char *name)
{
	uint32_t i;

	for (i = 0; i < ps->npools; i++) {
		struct kv_pool *p = pool_at(ps, i);

		if (p && p->ns == ns && !strcmp(p->name, name))
			return p;
	}
	return NULL;
}

uint32_t kv_pools_count(const struct kv_pools *ps)
{
	return ps->nlive;
}

uint32_t kv_pools_end(const struct kv_pools *ps)
{
	return ps->npools;
}

struct kv_pool *kv_pool_get(struct kv_pools *ps, uint32_t id)
{
	return id < ps->npools ? pool_at(ps, id) : NULL;
}

void kv_pools_each(struct kv_pools *ps, void (*fn)(struct kv_pool *p, void *ctx), void *ctx)
{
	uint32_t i;

	for (i = 0; i < ps->npools; i++)
		if (pool_at(ps, i))
			fn(ps->pool[i], ctx);
}

uint64_t kv_block_handle(const struct kv_block *b)
{
	/* Each field must fit its bits, or the handle names another block.
	 * The generation counts in 32 bits; its low 20 go in the handle. */
	kv_assert(b->run->pool->id < KV_MAX_POOLS);
	kv_assert(b->run->first_page <= 0xfffff);
	kv_assert(b->slot < KV_MAX_RUN_BLOCKS);
	return (uint64_t)(b->gen & GEN_MASK) << 44 | (uint64_t)b->run->pool->id << 32 |
	       (uint64_t)b->run->first_page << 12 | b->slot;
}

struct kv_block *kv_block_lookup(struct kv_pools *ps, uint64_t h)
{
	uint32_t gen = (uint32_t)(h >> 44), pool = (h >> 32) & 0xfff;
	uint32_t page = (h >> 12) & 0xfffff, slot = h & 0xfff;
	struct kv_pool *p = kv_pool_get(ps, pool);
	struct kv_run *run;
	struct kv_block *b;

	if (!p || page >= pool_dev(p)->npages)
		return NULL;
	run = pool_dev(p)->owner[page];
	if (!run || run->pool != p || run->first_page != page || slot >= p->blocks_per_run)
		return NULL;
	b = &run->blocks[slot];
	return (b->gen & GEN_MASK) == gen ? b : NULL;
}

/* ---- runs ---------------------------------------------------------------- */

static int pool_run_new(struct kv_pool *p)
{
	struct kv_pages *dev = pool_dev(p);
	struct kv_run *run;
	int64_t first;
	uint32_t i, gen;
	int fresh, r;

	/* Pages first: on a full device this is the common failure, and it
	 * costs nothing (nfree is checked before any scan). */
	first = kv_pages_alloc(dev, p->run_pages, p->ns, NULL, &fresh, pool_keep_free_segs(p));
	if (first < 0)
		return (int)first;
	run = run_mem_get(p, (uint32_t)first);
	if (!run) {
		r = -ENOMEM;
		goto err;
	}
	run->pool = p;
	if (fresh) {
		/* Another namespace's clients may still map this segment: give it
		 * fresh memory so they cannot see or touch this namespace's data. */
		uint32_t seg = kv_pages_seg_of(dev, (uint32_t)first);

		r = p->pools->be->ops->segment_create(p->pools->be, p->device, seg);
		if (r < 0)
			goto err;
		kv_pages_fresh(dev, seg);
	}
	if (p->pools->be->ops->populate)
		p->pools->be->ops->populate(p->pools->be, p->device,
					    (uint64_t)first * dev->page_bytes,
					    (uint64_t)p->run_pages * dev->page_bytes);
	for (i = 0; i < p->run_pages; i++)
		dev->owner[first + i] = run;
	run->pool = p;
	run->first_page = (uint32_t)first;
	run->npages = p->run_pages;
	run->nused = run->nlru = run->ndemoting = 0;
	gen = dev->gen[first] + 1;
	for (i = 0; i < p->blocks_per_run; i++) {
		struct kv_block *b = &run->blocks[i];

		*b = (struct kv_block){ .run = run, .gen = gen, .slot = (uint16_t)i,
					.state = KV_BLOCK_FREE, .ix.pool = p->id };
		kv_list_push_back(&p->free, &b->node);
	}
	kv_list_push_back(&p->runs, &run->link);
	p->n.runs++;
	p->n.free += p->blocks_per_run;
	return 0;
err:
	kv_pages_free(dev, (uint32_t)first, p->run_pages);
	run_mem_put(run);
	return r;
}

/* Gives an empty run's pages back to the device. */
void pool_run_release(struct kv_run *run)
{
	struct kv_pool *p = run->pool;
	struct kv_pages *dev = pool_dev(p);
	uint32_t i, maxgen = dev->gen[run->first_page];

	kv_assert(run->nused == 0);
	for (i = 0; i < p->blocks_per_run; i++) {
		kv_assert(run->blocks[i].state == KV_BLOCK_FREE);
		kv_list_del(&run->blocks[i].node);
		/* Counters started at most 2^31 and grow by one per use:
		 * no wrap in 32 bits in a daemon's life. */
		if (run->blocks[i].gen > maxgen)
			maxgen = run->blocks[i].gen;
	}
	/* A later run starting at this page starts its generations above every
	 * generation handed out here, so old handles stay stale. */
	dev->gen[run->first_page] = maxgen;
	if (p->spare == run)
		p->spare = NULL;
	kv_list_del(&run->link);
	p->n.runs--;
	p->n.free -= p->blocks_per_run;
	kv_pages_free(dev, run->first_page, run->npages);
	run_mem_put(run);
}

/* ---- block transitions ---------------------------------------------------- */

/* The table in pool.h: what holds in each state. */
static const struct {
	uint8_t no_ref, listed, indexed;
} state_holds[] = {
	[KV_BLOCK_FREE] = { 1, 1, 0 },
	[KV_BLOCK_WRITABLE] = { 0, 0, 0 },
	[KV_BLOCK_SEALED] = { 0, 0, 1 },
	[KV_BLOCK_CACHED] = { 1, 1, 1 },
};

/* Inlined at the allocator's own transitions (issue 38: out of line, it was
 * a tenth of a lookup of 1,000 and its release): the caller's loads of the
 * block's fields serve the checks too. */
static inline __attribute__((always_inline)) void block_assert_state(const struct kv_block *b)
{
	kv_assert(b->state <= KV_BLOCK_CACHED);
	kv_assert((b->ref == 0) == state_holds[b->state].no_ref);
	kv_assert(kv_list_linked(&b->node) == state_holds[b->state].listed);
	/* kv_index_remove() clears pprev: an entry is linked iff it is set. */
	kv_assert((b->ix.pprev != NULL) == state_holds[b->state].indexed);
	kv_assert(!b->demoting || b->state == KV_BLOCK_CACHED);
	kv_assert(b->ref <= KV_BLOCK_REF_MAX);
	kv_assert(b->slot < b->run->pool->blocks_per_run);
	kv_assert((b->owner || !b->own) && b->own <= b->ref);
}

void kv_block_assert_state(const struct kv_block *b)
{
	block_assert_state(b);
}

static struct kv_block *take_free(struct kv_pool *p)
{
	struct kv_list *n = kv_list_front(&p->free);
	struct kv_block *b;

	if (!n)
		return NULL;
	b = kv_container_of(n, struct kv_block, node);
	block_assert_state(b);
	kv_assert(b->state == KV_BLOCK_FREE);
	kv_assert(b->run->nused < p->blocks_per_run);
	kv_list_del(n);
	b->state = KV_BLOCK_WRITABLE;
	b->ref = 1;
	if (b->run->nused++ == 0 && p->spare == b->run)
		p->spare = NULL;
	p->n.free--;
	p->n.writable++;
	kv_ns_charge(&p->pools->nst, p->ns, 0, (int64_t)p->block_bytes);
	block_assert_state(b);
	return b;
}

/* Makes b (ref 0, not on a list, out of the index) FREE. keep_spare: an
 * emptied run may stay as the pool's spare; otherwise it is released. */
void pool_make_free(struct kv_block *b, int keep_spare)
{
	struct kv_run *run = b->run;
	struct kv_pool *p = run->pool;

	kv_assert(b->state != KV_BLOCK_FREE);
	kv_assert(b->ref == 0 && !b->demoting);
	kv_assert(!kv_list_linked(&b->node) && !b->ix.pprev);
	kv_assert(b->own == 0);
	kv_assert(run->nused > 0);
	b->state = KV_BLOCK_FREE;
	b->owner = 0;   /* one that held no references (sessrefs.h) */
	b->gen++;
	kv_list_push_front(&p->free, &b->node);
	p->n.free++;
	kv_ns_charge(&p->pools->nst, p->ns, 0, -(int64_t)p->block_bytes);
	block_assert_state(b);
	if (--run->nused == 0) {
		if (keep_spare && !p->spare)
			p->spare = run;
		else
			pool_run_release(run);
	}
	pool_check_idle(p);
}

void pool_recycle(struct kv_block *b)
{
	struct kv_pool *p = b->run->pool;

	kv_assert(b->state == KV_BLOCK_CACHED && !b->demoting && b->ref == 0);
	kv_list_del(&b->node);
	b->run->nlru--;
	kv_index_remove(&p->pools->index, &b->ix);
	kv_events_removed(p->pools->ev, p->id, b->ix.hash, KV_MEDIUM_G1);
	/* As pool_make_free() and take_free() would leave it. */
	b->state = KV_BLOCK_WRITABLE;
	b->ref = 1;
	b->owner = 0;
	b->gen++;
	block_assert_state(b);
}

static int pool_alloc(struct kv_pool *p, uint32_t n, struct kv_block **out, char *why,
		      size_t whylen, int may_evict)
{
	uint32_t got = 0, taken;
	int checked = 0, r;

	/* Limits first: nothing is evicted or taken for an allocation they
	 * refuse. */
	if ((r = pool_quota_room(p, n, may_evict, why, whylen)) < 0)
		return r;
	while (got < n) {
		struct kv_block *b = take_free(p);

		if (b) {
			out[got++] = b;
			continue;
		}
		if (pool_run_new(p) == 0)
			continue;
		if (!may_evict)
			break;
		/* Before the first eviction: would evicting all it may be
		 * enough? Then evict in the rules' order (a batch of the
		 * pool's own oldest at a time when they are what goes). */
		if (!checked && !pool_can_get(p, n - got, 0))
			break;
		checked = 1;
		if (!pool_make_room(p, n - got, out + got, &taken))
			break;
		got += taken;
	}
	if (got == n) {
		p->n.allocs += n;
		return 0;
	}
	if (why)
		pool_enospc_why(p, n, got, why, whylen);
	while (got > 0) {
		struct kv_block *b = out[--got];

		b->ref = 0;
		p->n.writable--;
		pool_make_free(b, 1);
	}
	return -ENOSPC;
}

int kv_pool_alloc(struct kv_pool *p, uint32_t n, struct kv_block **out, char *why, size_t whylen)
{
	return pool_alloc(p, n, out, why, whylen, 1);
}

int kv_pool_alloc_free(struct kv_pool *p, uint32_t n, struct kv_block **out)
{
	return pool_alloc(p, n, out, NULL, 0, 0);
}

struct kv_index_entry *kv_pool_find_entry(struct kv_pool *p, const uint8_t *hash)
{
	return kv_index_find(&p->pools->index, p->id, hash);
}

/* The clock a prefix is born by and expires by: the request's (held by
 * kv_pools_hold_clock()), else read now. */
static uint64_t pool_now_ms(const struct kv_pools *ps)
{
	return ps->clock_ms ? ps->clock_ms : kv_mono_ms();
}

void kv_pools_hold_clock(struct kv_pools *ps, uint64_t now_ms)
{
	ps->clock_ms = now_ms;
}

int kv_pool_expired(const struct kv_pool *p, const struct kv_index_entry *e)
{
	uint64_t ttl = p->pools->nst.ns[p->ns - 1].lim.ttl_ms;

	return ttl && pool_now_ms(p->pools) - e->born_ms >= ttl;
}

int kv_pool_has_ttl(const struct kv_pool *p)
{
	return p->pools->nst.ns[p->ns - 1].lim.ttl_ms != 0;
}

struct kv_block *kv_pool_find(struct kv_pool *p, const uint8_t *hash)
{
	struct kv_index_entry *e = kv_index_find(&p->pools->index, p->id, hash);

	return e && e->kind == KV_ENTRY_BLOCK ? kv_container_of(e, struct kv_block, ix) : NULL;
}

/* A CACHED block (demoting or not, as told: the batch passes the field it
 * loaded before its stores) becomes SEALED: off its LRU, or its demotion
 * cancelled (the copy's completion sees it). block_ref()'s and
 * block_ref_batch()'s common part. */
static inline __attribute__((always_inline)) void block_cached_to_sealed(struct kv_pool *p,
									 struct kv_block *b,
									 int demoting)
{
	if (demoting) {
		b->demoting = 0;
		p->n.demoting--;
		b->run->ndemoting--;
		kv_list_del(&b->node);
	} else {
		/* The pool's heap is keyed by its LRU's back: only taking the
		 * back (the oldest) off moves its key (issue 38: a lookup of a
		 * chain takes a block off mid-list each time). */
		int back = b->node.next == &p->lru;

		b->run->nlru--;
		kv_list_del(&b->node);
		if (back)
			pool_lru_changed(p);
	}
	b->state = KV_BLOCK_SEALED;
}

/* A SEALED block that lost its last reference becomes CACHED, the newest on
 * its pool's LRU: block_unref()'s and block_unref_batch()'s common part. */
static inline __attribute__((always_inline)) void block_sealed_to_cached(struct kv_pool *p,
									 struct kv_block *b)
{
	/* At the front: the back, the heap's key, moves only when the LRU
	 * was empty. */
	int was_empty = kv_list_empty(&p->lru);

	b->state = KV_BLOCK_CACHED;
	b->tick = ++p->pools->tick;
	kv_list_push_front(&p->lru, &b->node);
	if (was_empty)
		pool_lru_changed(p);
	b->run->nlru++;
}

/* A reference on b (of p, not FREE, with room for it): a CACHED block leaves
 * its LRU (or its demotion) and becomes SEALED. Returns 1 when it did, for
 * the caller to count (p->n.sealed++, pool_cached_add(p, -1)): a batch
 * counts once (kv_blocks_ref()). */
static inline __attribute__((always_inline)) int block_ref(struct kv_pool *p, struct kv_block *b)
{
	int moved = 0;

	if (b->state == KV_BLOCK_CACHED) {
		block_cached_to_sealed(p, b, b->demoting);
		moved = 1;
	}
	b->ref++;
	block_assert_state(b);
	return moved;
}

/* n blocks of p went from CACHED to SEALED. */
static inline void pool_count_ref(struct kv_pool *p, uint64_t n)
{
	p->n.sealed += n;
	p->n.cached -= n;
	p->pools->nst.ns[p->ns - 1].cached -= n * p->block_bytes;
}

int kv_block_ref(struct kv_block *b)
{
	struct kv_pool *p = b->run->pool;

	kv_assert(b->state != KV_BLOCK_FREE);
	if (!kv_block_ref_room(b, 1))
		return -EOVERFLOW;
	if (block_ref(p, b))
		pool_count_ref(p, 1);
	return 0;
}

/* How many blocks ahead kv_blocks_ref() and kv_blocks_unref_back() ask for
 * the next block's line. */
#define REF_AHEAD 16

/* block_ref() in a batch (kv_blocks_ref()): the same transition, with
 * block_assert_state()'s checks of the block after it made on the block
 * before it, every field loaded before the first store. Checked after the
 * LRU's stores, the fields had to be loaded again once those stores were
 * told apart from them (the neighbours' links may alias b's fields, for all
 * the compiler knows): half of kv_blocks_ref()'s time in a lookup of 1,000
 * (issue 38). What the transition writes (state, ref, the links, demoting)
 * holds by construction; what it leaves (the index entry, slot, owner) is
 * checked as the state after it needs it, and the state before it is
 * checked whole (pool.h's table): as strong as the check after, or
 * stronger. */
static inline __attribute__((always_inline)) int block_ref_batch(struct kv_pool *p,
								 struct kv_block *b)
{
	uint32_t ref = b->ref, own = b->own;
	uint8_t state = b->state, demoting = b->demoting;
	int linked = kv_list_linked(&b->node), indexed = b->ix.pprev != NULL;
	int cached = state == KV_BLOCK_CACHED;

	kv_assert(state == KV_BLOCK_WRITABLE || state == KV_BLOCK_SEALED || cached);
	kv_assert(ref < KV_BLOCK_REF_MAX);   /* room for one (kv_block_ref_room()) */
	kv_assert((ref == 0) == cached && linked == cached);
	kv_assert(indexed == (state != KV_BLOCK_WRITABLE));
	kv_assert(!demoting || cached);
	kv_assert(b->slot < p->blocks_per_run);
	kv_assert((b->owner || !own) && own <= ref);
	b->ref = ref + 1;
	if (!cached)
		return 0;
	block_cached_to_sealed(p, b, demoting);
	return 1;
}

void kv_blocks_ref(struct kv_block *const *blk, size_t n)
{
	struct kv_pool *p = NULL;
	uint64_t moved = 0;   /* of p, not counted yet */

	/* The counters are read by nothing in the loop (the LRU's heap key is
	 * the tick of its back): they are added once per pool met. */
	for (size_t i = 0; i < n; i++) {
		struct kv_block *b = blk[i];

		/* The line each transition reads and writes (pool.h), a few
		 * blocks ahead: a chain's blocks are in L2 at best. */
		if (i + REF_AHEAD < n)
			__builtin_prefetch(&blk[i + REF_AHEAD]->node, 1);
		if (b->run->pool != p) {
			if (moved)
				pool_count_ref(p, moved);
			p = b->run->pool;
			moved = 0;
		}
		moved += (uint64_t)block_ref_batch(p, b);
	}
	if (moved)
		pool_count_ref(p, moved);
}

/* Drops a reference from b (of p, WRITABLE or SEALED, holding one). At 0 a
 * SEALED block becomes CACHED, the newest on the LRU, and 1 is returned for
 * the caller to count (p->n.sealed--, pool_cached_add(p, 1)); a WRITABLE
 * one becomes FREE. */
static inline __attribute__((always_inline)) int block_unref(struct kv_pool *p, struct kv_block *b)
{
	kv_assert(b->state == KV_BLOCK_WRITABLE || b->state == KV_BLOCK_SEALED);
	kv_assert(b->ref > 0);
	if (--b->ref > 0)
		return 0;
	if (b->state == KV_BLOCK_SEALED) {
		block_sealed_to_cached(p, b);
		block_assert_state(b);
		return 1;
	}
	p->n.writable--;
	pool_make_free(b, 1);
	return 0;
}

/* n blocks of p went from SEALED to CACHED. */
static inline void pool_count_unref(struct kv_pool *p, uint64_t n)
{
	p->n.sealed -= n;
	p->n.cached += n;
	p->pools->nst.ns[p->ns - 1].cached += n * p->block_bytes;
}

void kv_block_unref(struct kv_block *b)
{
	struct kv_pool *p = b->run->pool;

	if (block_unref(p, b))
		pool_count_unref(p, 1);
}

/* block_unref() in a batch (kv_blocks_unref_back()): the same transitions,
 * with block_assert_state()'s checks of a block that becomes CACHED made on
 * the fields loaded before the LRU's stores, as block_ref_batch() does
 * (the state before checked whole; what the transition writes holds by
 * construction). */
static inline __attribute__((always_inline)) int block_unref_batch(struct kv_pool *p,
								   struct kv_block *b)
{
	uint32_t ref = b->ref;
	uint8_t state = b->state;

	kv_assert(state == KV_BLOCK_WRITABLE || state == KV_BLOCK_SEALED);
	kv_assert(ref > 0 && ref <= KV_BLOCK_REF_MAX);
	b->ref = ref - 1;
	if (ref > 1)
		return 0;
	if (state != KV_BLOCK_SEALED) {
		p->n.writable--;
		pool_make_free(b, 1);
		return 0;
	}
	/* SEALED with its last reference: on no list, indexed, not
	 * demoting; a CACHED block's owner holds none of its references. */
	kv_assert(!kv_list_linked(&b->node) && b->ix.pprev && !b->demoting);
	kv_assert(b->slot < p->blocks_per_run);
	kv_assert(b->own == 0);
	block_sealed_to_cached(p, b);
	return 1;
}

void kv_blocks_unref_back(struct kv_block *const *blk, size_t n)
{
	struct kv_pool *p = NULL;
	uint64_t moved = 0;

	/* As kv_blocks_ref(): a block freed on the way (WRITABLE, pool
	 * idle checks) reads the sum sealed + cached, which the moves not
	 * counted yet leave as it is. */
	for (size_t i = n; i-- > 0;) {
		struct kv_block *b = blk[i];

		/* Both lines: a SEALED block's last reference checks its
		 * index entry (pprev) too. */
		if (i >= REF_AHEAD) {
			__builtin_prefetch(&blk[i - REF_AHEAD]->node, 1);
			__builtin_prefetch(&blk[i - REF_AHEAD]->ix.pprev);
		}
		if (b->run->pool != p) {
			if (moved)
				pool_count_unref(p, moved);
			p = b->run->pool;
			moved = 0;
		}
		moved += (uint64_t)block_unref_batch(p, b);
	}
	if (moved)
		pool_count_unref(p, moved);
}

struct kv_block *kv_pool_seal(struct kv_pool *p, struct kv_block *b, const uint8_t *hash)
{
	const struct kv_index *ix = &p->pools->index;
	uint64_t key = kv_index_key(ix, p->id, hash);

	return kv_pool_seal_found(p, b, hash, key, kv_index_find_key(ix, key, p->id, hash));
}

struct kv_block *kv_pool_seal_found(struct kv_pool *p, struct kv_block *b, const uint8_t *hash,
				    uint64_t key, struct kv_index_entry *ie)
{
	struct kv_block *e;

	kv_assert(b->state == KV_BLOCK_WRITABLE && b->run->pool == p);
	kv_assert(!ie || ie->kind == KV_ENTRY_BLOCK);
	e = ie ? kv_container_of(ie, struct kv_block, ix) : NULL;
	/* A prefix past its namespace's TTL is not served: a cached one gives
	 * way to b; one still held keeps the hash, and b stays the caller's. */
	if (e && kv_pool_expired(p, ie)) {
		if (!kv_pools_drop_cached(e))
			return b;
		e = NULL;
	}
	if (e) {
		/* A block at KV_BLOCK_REF_MAX cannot take the caller's
		 * reference; b cannot go into the index beside it: b stays as
		 * it is, WRITABLE, the caller's own (pool.h). */
		if (kv_block_ref(e) < 0)
			return b;
		kv_block_unref(b);
		p->n.dedups++;
		return e;
	}
	memcpy(b->ix.hash, hash, KV_HASH_BYTES);
	b->ix.born_ms = pool_now_ms(p->pools);
	b->ix.pool = p->id;
	b->ix.kind = KV_ENTRY_BLOCK;
	kv_index_insert_key(&p->pools->index, &b->ix, key);
	b->state = KV_BLOCK_SEALED;
	p->n.writable--;
	p->n.sealed++;
	block_assert_state(b);
	return b;
}

struct kv_block *kv_pool_oldest_cached(struct kv_pool *p)
{
	struct kv_list *n = kv_list_back(&p->lru);

	return n ? kv_container_of(n, struct kv_block, node) : NULL;
}

uint64_t kv_block_offset(const struct kv_block *b)
{
	const struct kv_pool *p = b->run->pool;

	return (uint64_t)b->run->first_page * pool_dev(p)->page_bytes + b->slot * p->block_bytes;
}

/* Bytes in the free blocks of dev's pools; *min_run (unless NULL): the
 * smallest run of those pools, in pages (1 when there is none). */
static uint64_t pools_free_bytes(const struct kv_pools *ps, uint32_t dev, uint32_t *min_run)
{
	uint64_t n = 0;
	uint32_t i, m = UINT32_MAX;

	for (i = 0; i < ps->npools; i++) {
		const struct kv_pool *p = pool_at(ps, i);

		if (p && p->device == dev) {
			n += p->n.free * p->block_bytes;
			if (p->run_pages < m)
				m = p->run_pages;
		}
	}
	if (min_run)
		*min_run = m == UINT32_MAX ? 1 : m;
	return n;
}

uint64_t kv_pools_dev_free(const struct kv_pools *ps, uint32_t dev, uint64_t *total)
{
	const struct kv_pages *d = &ps->dev[dev];

	*total = (uint64_t)d->npages * d->page_bytes;
	return (uint64_t)d->nfree * d->page_bytes + pools_free_bytes(ps, dev, NULL);
}

uint64_t kv_pools_dev_room(const struct kv_pools *ps, uint32_t dev, uint64_t *total)
{
	const struct kv_pages *d = &ps->dev[dev];
	uint32_t s, min_run;
	uint64_t n = pools_free_bytes(ps, dev, &min_run);

	for (s = 0; s < d->nsegs; s++) {
		uint32_t f = d->pages_per_seg - d->segs[s].used;

		if (f >= min_run)
			n += (uint64_t)f * d->page_bytes;
	}
	*total = (uint64_t)d->npages * d->page_bytes;
	return n;
}

void kv_block_demote_begin(struct kv_block *b)
{
	struct kv_pool *p = b->run->pool;

	kv_assert(b->state == KV_BLOCK_CACHED && !b->demoting);
	kv_list_del(&b->node);
	pool_lru_changed(p);
	b->run->nlru--;
	b->run->ndemoting++;
	kv_list_push_front(&p->demoting, &b->node);
	b->demoting = 1;
	p->n.demoting++;
	block_assert_state(b);
}

int kv_block_demote_end(struct kv_block *b, int ok)
{
	struct kv_pool *p = b->run->pool;

	if (b->state != KV_BLOCK_CACHED || !b->demoting)
		return 0;
	b->demoting = 0;
	p->n.demoting--;
	b->run->ndemoting--;
	kv_list_del(&b->node);
	if (!ok) {
		/* Back at the front, so with the newest tick: the LRU stays in
		 * tick order, which kv_pools_check() verifies and the choice of
		 * the oldest block across pools relies on. */
		b->tick = ++p->pools->tick;
		kv_list_push_front(&p->lru, &b->node);
		pool_lru_changed(p);
		b->run->nlru++;
		block_assert_state(b);
		return 0;
	}
	kv_index_remove(&p->pools->index, &b->ix);
	kv_events_removed(p->pools->ev, p->id, b->ix.hash, KV_MEDIUM_G1);
	pool_cached_add(p, -1);
	pool_make_free(b, 1);
	return 1;
}

int kv_block_copy(struct kv_block *dst, const struct kv_block *src)
{
	struct kv_pool *p = src->run->pool;

	return p->pools->be->ops->copy(p->pools->be, p->device, kv_block_offset(dst),
				       kv_block_offset(src), p->block_bytes);
}

void kv_block_where(const struct kv_block *b, uint32_t *dev, uint32_t *seg)
{
	const struct kv_pool *p = b->run->pool;

	*dev = p->device;
	*seg = kv_pages_seg_of(pool_dev(p), b->run->first_page);
}

void kv_pools_pages(const struct kv_pools *ps, uint64_t *total, uint64_t *free,
		    uint64_t *page_bytes)
{
	uint32_t d;

	*total = *free = 0;
	for (d = 0; d < ps->ndev; d++) {
		*total += ps->dev[d].npages;
		*free += ps->dev[d].nfree;
	}
	*page_bytes = ps->ndev ? ps->dev[0].page_bytes : 0;
}
