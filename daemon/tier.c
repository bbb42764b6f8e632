/* The lower tiers; see tier.h for the model and its rules. */
#include "tier.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "crc32c.h"
#include "disk.h"
#include "journal.h"
#include "log.h"

#define HDR_BYTES 4096u       /* a slot starts with its header, then the payload */
#define SLOT_MAGIC 0x31544c5333475648ull  /* "HVG3SLT1" */
#define SLOT_VERSION 1
#define BATCH 64              /* copies per copy_async */
#define L2 0                  /* index into t->lv[] */
#define L3 1

/* The header at the start of every slot (G2 and G3 alike, so a write-back
 * is one write of the whole slot). docs/architecture.md has the format. */
struct slot_hdr {
	uint64_t magic;
	uint32_t version;
	uint32_t hdr_crc;         /* CRC32C of this struct with hdr_crc = 0 */
	uint64_t ns;              /* XXH3-64 of the namespace name */
	uint64_t layout;          /* the pool's layout id */
	uint8_t hash[KV_HASH_BYTES];
	uint64_t payload_len;
	uint32_t payload_crc;     /* CRC32C of payload_len bytes after the header */
	uint32_t flags;
};

struct tpool;
struct tblock;

/* A run of slots: npages contiguous pages of a tier cut into nslots slots. */
struct srun {
	struct kv_list link;      /* its tpool's runs, or t->dormant */
	struct kv_list plink;     /* its tpool's partial list while a slot is free */
	struct tpool *tp;         /* NULL while dormant (G3 after a restart, no pool yet) */
	uint32_t first_page, npages, nslots, nused, free_head;
	uint32_t slot_bytes;
	uint64_t layout;
	struct tblock **occ;      /* per slot: its block, SWAP_SLOT, or NULL */
	uint32_t *next;           /* the free chain */
	uint8_t (*dhash)[KV_HASH_BYTES];  /* dormant: what each slot holds */
	uint8_t *dvalid;
};

#define SWAP_SLOT ((struct tblock *)1)

/* One pool's slots in one tier. */
struct tpool {
	struct kv_pool *pool;
	struct kv_list runs, partial;
	struct kv_list lru;       /* idle copies, front = newest (G2: dirty ones) */
	struct kv_list clean;     /* G2: idle copies that G3 holds too */
	uint32_t run_pages, nslots;
	uint64_t slot_bytes;
};

struct level {
	int on;
	struct kv_pages pages;
	uint32_t limit_pages;     /* G3 shrinks to what it holds on ENOSPC */
	struct tpool *tp[KV_MAX_POOLS];
	struct kv_tier_stats st;
};

enum { BUSY_DOWN = 1, BUSY_WB = 2, BUSY_READ = 4, BUSY_UP = 8, BUSY_WAKE = 16 };

/* A block held by the lower tiers. */
struct tblock {
	struct kv_index_entry ix;  /* kind KV_ENTRY_TIER */
	struct kv_tiers *t;
	struct kv_pool *pool;
	struct srun *run[2];       /* [L2], [L3]; NULL = no copy there */
	uint16_t slot[2];
	uint8_t g3_ok;             /* the G3 copy is written and recorded */
	uint8_t busy;              /* BUSY_*: off the LRUs while any is set */
	uint8_t dead;              /* out of the index: freed once not busy */
	uint8_t failed;            /* its promotion just failed: lookups miss */
	uint8_t evict_g2;          /* drop the G2 copy once written back */
	uint8_t indexed;
	uint64_t tick;
	struct kv_list lru[2];
	struct kv_list waiters;    /* parked lookups */
	uint64_t dst;              /* promotion: the G1 block being filled */
	struct kv_disk_op dop;
};

enum { OP_DEMOTE, OP_PROMOTE, OP_SWAP_OUT, OP_SWAP_IN };

struct copyop {
	int kind;
	uint32_t dev, n;
	uint64_t bytes;
	struct kv_swap *sw;
	struct tblock *tb[BATCH];
	uint64_t h[BATCH];
};

enum { SW_OUT_COPY, SW_OUT, SW_IN_COPY, SW_IN };

struct kv_swap {
	struct kv_list link;       /* the owner's list */
	struct kv_list all;        /* t->swaps */
	uint64_t id;
	struct kv_pool *pool;
	uint32_t n;
	int state, dead, err;
	struct kv_list waiters;
	struct srun **run;
	uint16_t *slot;
	uint64_t *h;               /* G1 blocks: SW_OUT_COPY, SW_IN_COPY, SW_IN */
};

struct kv_tiers {
	struct kv_pools *ps;
	struct kv_backend *be;
	struct kv_tiers_config cfg;
	uint64_t page_bytes;
	uint8_t *g2;
	uint64_t g2_bytes;
	struct level lv[2];
	struct kv_disk disk;
	struct kv_journal jr;
	uint64_t jlive;            /* records a rewrite would write */
	struct kv_list dormant;    /* G3 runs no pool has claimed since the restart */
	struct kv_list swaps;
	struct kv_list space_waiters;  /* lookups waiting for G2 staging room */
	uint64_t entries;          /* tblocks in the index */
	uint64_t tick, next_swap;
	uint64_t down_bytes[KV_MAX_DEVICES];  /* demotion copies in flight */
	uint8_t demoting[KV_MAX_DEVICES], writing_back;
	uint64_t wb_bytes;         /* write-backs in flight (G2 slot bytes) */
	uint64_t dirty_bytes;      /* G2 slot bytes of dirty copies */
	uint64_t swap_bytes;       /* G2 slot bytes of swapped blocks */
	struct kv_tier_stats g1;
};

void kv_tiers_config_defaults(struct kv_tiers_config *c)
{
	memset(c, 0, sizeof(*c));
	c->queue_depth = 64;
	c->g1_low = 10;
	c->g1_high = 20;
	c->g2_low = 10;
	c->g2_high = 25;
}

static uint64_t round4k(uint64_t n)
{
	return (n + 4095) & ~4095ull;
}

/* ---- slots ---------------------------------------------------------------- */

static uint8_t *g2_slot(struct kv_tiers *t, const struct srun *r, uint32_t s)
{
	return t->g2 + (uint64_t)r->first_page * t->page_bytes + (uint64_t)s * r->slot_bytes;
}

static uint64_t g3_off(struct kv_tiers *t, const struct srun *r, uint32_t s)
{
	return (uint64_t)r->first_page * t->page_bytes + (uint64_t)s * r->slot_bytes;
}

static void jappend(struct kv_tiers *t, int type, const struct srun *r, uint32_t slot,
		    const uint8_t *hash)
{
	struct kv_jrec rec = { .type = (uint8_t)type, .page = r->first_page };

	if (type == KV_J_RUN) {
		rec.npages = r->npages;
		rec.slot_bytes = r->slot_bytes;
		rec.nslots = r->nslots;
		rec.layout = r->layout;
		t->jlive++;
	} else if (type == KV_J_SLOT) {
		rec.slot = (uint16_t)slot;
		memcpy(rec.hash, hash, KV_HASH_BYTES);
		t->jlive++;
	} else if (t->jlive) {
		t->jlive--;
	}
	if (kv_journal_append(&t->jr, &rec) < 0)
		kv_warn("disk tier: index journal append failed: the next start may miss blocks");
}

static struct tpool *tpool_get(struct kv_tiers *t, int l, struct kv_pool *p)
{
	struct level *L = &t->lv[l];
	struct tpool *tp = L->tp[p->id];
	uint64_t slot_bytes = HDR_BYTES + round4k(p->block_bytes);
	uint32_t nslots;
	int pages;

	if (tp || !L->on)
		return tp;
	pages = kv_pool_run_size(t->page_bytes, L->pages.pages_per_seg, slot_bytes, &nslots);
	if (pages < 0 || !(tp = calloc(1, sizeof(*tp))))
		return NULL;
	tp->pool = p;
	kv_list_init(&tp->runs);
	kv_list_init(&tp->partial);
	kv_list_init(&tp->lru);
	kv_list_init(&tp->clean);
	tp->run_pages = (uint32_t)pages;
	tp->nslots = nslots;
	tp->slot_bytes = slot_bytes;
	L->tp[p->id] = tp;
	return tp;
}

static struct srun *srun_alloc(uint32_t nslots, int dormant)
{
	struct srun *r = calloc(1, sizeof(*r));

	if (!r)
		return NULL;
	r->occ = calloc(nslots, sizeof(*r->occ));
	r->next = calloc(nslots, sizeof(*r->next));
	if (dormant) {
		r->dhash = calloc(nslots, KV_HASH_BYTES);
		r->dvalid = calloc(nslots, 1);
	}
	if (!r->occ || !r->next || (dormant && (!r->dhash || !r->dvalid))) {
		free(r->occ);
		free(r->next);
		free(r->dhash);
		free(r->dvalid);
		free(r);
		return NULL;
	}
	r->nslots = nslots;
	kv_list_init(&r->plink);
	return r;
}

static void srun_free(struct srun *r)
{
	free(r->occ);
	free(r->next);
	free(r->dhash);
	free(r->dvalid);
	free(r);
}

/* Builds the free chain over the slots that are not occupied. */
static void srun_chain(struct srun *r)
{
	uint32_t s;

	r->free_head = UINT32_MAX;
	for (s = r->nslots; s-- > 0;)
		if (!r->occ[s]) {
			r->next[s] = r->free_head;
			r->free_head = s;
		}
}

static int run_new(struct kv_tiers *t, int l, struct tpool *tp)
{
	struct level *L = &t->lv[l];
	struct srun *r;
	int64_t first;
	int fresh;

	if (L->pages.npages - L->pages.nfree + tp->run_pages > L->limit_pages)
		return -ENOSPC;
	r = srun_alloc(tp->nslots, 0);
	if (!r)
		return -ENOMEM;
	first = kv_pages_alloc(&L->pages, tp->run_pages, 1, r, &fresh);
	if (first < 0) {
		srun_free(r);
		return (int)first;
	}
	r->tp = tp;
	r->first_page = (uint32_t)first;
	r->npages = tp->run_pages;
	r->slot_bytes = (uint32_t)tp->slot_bytes;
	r->layout = tp->pool->layout_id;
	srun_chain(r);
	kv_list_push_back(&tp->runs, &r->link);
	kv_list_push_back(&tp->partial, &r->plink);
	if (l == L3)
		jappend(t, KV_J_RUN, r, 0, NULL);
	return 0;
}

static void run_release(struct kv_tiers *t, int l, struct srun *r)
{
	if (l == L3)
		jappend(t, KV_J_RUN_FREE, r, 0, NULL);
	kv_list_del(&r->link);
	if (kv_list_linked(&r->plink))
		kv_list_del(&r->plink);
	kv_pages_free(&t->lv[l].pages, r->first_page, r->npages);
	srun_free(r);
}

static uint32_t slot_take(struct kv_tiers *t, int l, struct srun *r, struct tblock *occ)
{
	uint32_t s = r->free_head;

	r->free_head = r->next[s];
	r->occ[s] = occ;
	if (++r->nused == r->nslots)
		kv_list_del(&r->plink);
	t->lv[l].st.used += r->slot_bytes;
	return s;
}

static void slot_put(struct kv_tiers *t, int l, struct srun *r, uint32_t s)
{
	r->occ[s] = NULL;
	r->next[s] = r->free_head;
	r->free_head = s;
	t->lv[l].st.used -= r->slot_bytes;
	if (r->nused-- == r->nslots && r->tp)
		kv_list_push_back(&r->tp->partial, &r->plink);
	if (!r->nused)
		run_release(t, l, r);
}

/* ---- tier blocks ---------------------------------------------------------- */

static void dirty_add(struct kv_tiers *t, const struct tblock *tb, int d)
{
	t->lv[L2].st.dirty += (uint64_t)(int64_t)d;
	t->dirty_bytes += (uint64_t)((int64_t)d * (int64_t)tb->run[L2]->slot_bytes);
}

static void tb_unlist(struct tblock *tb)
{
	if (kv_list_linked(&tb->lru[L2]))
		kv_list_del(&tb->lru[L2]);
	if (kv_list_linked(&tb->lru[L3]))
		kv_list_del(&tb->lru[L3]);
}

/* Puts an idle tb on the lists its copies belong to. */
static void tb_idle(struct kv_tiers *t, struct tblock *tb)
{
	tb_unlist(tb);
	tb->tick = ++t->tick;
	if (tb->run[L2])
		kv_list_push_front(tb->g3_ok ? &tb->run[L2]->tp->clean : &tb->run[L2]->tp->lru,
				   &tb->lru[L2]);
	if (tb->run[L3] && tb->g3_ok)
		kv_list_push_front(&tb->run[L3]->tp->lru, &tb->lru[L3]);
}

static void tb_free(struct kv_tiers *t, struct tblock *tb)
{
	tb_unlist(tb);
	if (tb->run[L2]) {
		t->lv[L2].st.blocks--;
		if (!tb->g3_ok)
			dirty_add(t, tb, -1);
		slot_put(t, L2, tb->run[L2], tb->slot[L2]);
	}
	if (tb->run[L3]) {
		if (tb->g3_ok) {
			t->lv[L3].st.blocks--;
			jappend(t, KV_J_SLOT_FREE, tb->run[L3], tb->slot[L3], NULL);
		}
		slot_put(t, L3, tb->run[L3], tb->slot[L3]);
	}
	free(tb);
}

/* Takes tb out of the index; frees it now or when its I/O is done. */
static void tb_kill(struct kv_tiers *t, struct tblock *tb)
{
	if (tb->indexed) {
		kv_index_remove(kv_pools_index(t->ps), &tb->ix);
		tb->indexed = 0;
		t->entries--;
	}
	tb->dead = 1;
	if (!tb->busy)
		tb_free(t, tb);
}

static void tb_busy(struct tblock *tb, int flag)
{
	tb_unlist(tb);
	tb->busy |= (uint8_t)flag;
}

static void tb_unbusy(struct kv_tiers *t, struct tblock *tb, int flag)
{
	tb->busy &= (uint8_t)~flag;
	if (tb->busy)
		return;
	if (tb->dead)
		tb_free(t, tb);
	else
		tb_idle(t, tb);
}

static struct tblock *tb_new(struct kv_tiers *t, struct kv_pool *p, const uint8_t *hash)
{
	struct tblock *tb = calloc(1, sizeof(*tb));

	if (!tb)
		return NULL;
	tb->t = t;
	tb->pool = p;
	tb->ix.pool = p->id;
	tb->ix.kind = KV_ENTRY_TIER;
	memcpy(tb->ix.hash, hash, KV_HASH_BYTES);
	kv_list_init(&tb->lru[L2]);
	kv_list_init(&tb->lru[L3]);
	kv_list_init(&tb->waiters);
	return tb;
}

static void tb_index(struct kv_tiers *t, struct tblock *tb)
{
	kv_index_insert(kv_pools_index(t->ps), &tb->ix);
	tb->indexed = 1;
	t->entries++;
}

/* Drops tb's G2 copy (tb idle). Without a G3 copy the block is gone. */
static void drop_g2(struct kv_tiers *t, struct tblock *tb)
{
	tb_unlist(tb);
	t->lv[L2].st.blocks--;
	if (!tb->g3_ok)
		dirty_add(t, tb, -1);
	slot_put(t, L2, tb->run[L2], tb->slot[L2]);
	tb->run[L2] = NULL;
	t->lv[L2].st.evictions++;
	if (!tb->run[L3])
		tb_kill(t, tb);
	else
		tb_idle(t, tb);
}

/* Drops tb's G3 copy (tb idle). */
static void drop_g3(struct kv_tiers *t, struct tblock *tb)
{
	tb_unlist(tb);
	t->lv[L3].st.blocks--;
	jappend(t, KV_J_SLOT_FREE, tb->run[L3], tb->slot[L3], NULL);
	slot_put(t, L3, tb->run[L3], tb->slot[L3]);
	tb->run[L3] = NULL;
	tb->g3_ok = 0;
	t->lv[L3].st.evictions++;
	if (!tb->run[L2]) {
		tb_kill(t, tb);
	} else {
		dirty_add(t, tb, 1);
		tb_idle(t, tb);
	}
}

/* Frees one idle copy in tier l, own pool first, then the oldest of any
 * pool. In G2 clean copies go first; a dirty one only when there is no G3 to
 * write it to (with G3 the caller waits for write-back instead of dropping
 * what could be kept). Returns 1 if it freed one. */
static int evict_one(struct kv_tiers *t, int l, struct tpool *own)
{
	struct tblock *victim = NULL;
	struct kv_list *n;
	uint32_t i;

	if (l == L3 && !kv_list_empty(&t->dormant)) {
		struct srun *r = kv_container_of(kv_list_front(&t->dormant), struct srun, link);

		run_release(t, L3, r);
		return 1;
	}
	/* Clean G2 copies cost nothing to drop: all of them go before any
	 * dirty one. */
	if (l == L2 && own && (n = kv_list_back(&own->clean)))
		victim = kv_container_of(n, struct tblock, lru[L2]);
	for (i = 0; !victim && l == L2 && i < kv_pools_count(t->ps); i++) {
		struct tpool *tp = t->lv[l].tp[i];
		struct tblock *b;

		if (!tp || !(n = kv_list_back(&tp->clean)))
			continue;
		b = kv_container_of(n, struct tblock, lru[L2]);
		if (!victim || b->tick < victim->tick)
			victim = b;
	}
	if (l == L2 && t->lv[L3].on && !victim)
		return 0;
	if (!victim && own && (n = kv_list_back(&own->lru)))
		victim = kv_container_of(n, struct tblock, lru[l]);
	for (i = 0; !victim && i < kv_pools_count(t->ps); i++) {
		struct tpool *tp = t->lv[l].tp[i];
		struct tblock *b;

		if (!tp || !(n = kv_list_back(&tp->lru)))
			continue;
		b = kv_container_of(n, struct tblock, lru[l]);
		if (!victim || b->tick < victim->tick)
			victim = b;
	}
	if (!victim)
		return 0;
	if (l == L2)
		drop_g2(t, victim);
	else
		drop_g3(t, victim);
	return 1;
}

/* A free slot of tier l for pool p: a partial run, a new run, or by evicting
 * idle copies. Returns 0 with *run and *slot, or -ENOSPC. */
static int slot_alloc(struct kv_tiers *t, int l, struct kv_pool *p, struct tblock *occ,
		      struct srun **run, uint16_t *slot)
{
	struct tpool *tp = tpool_get(t, l, p);
	unsigned tries;

	if (!tp)
		return -ENOSPC;
	for (tries = 0; tries < 4 * tp->nslots + 64; tries++) {
		if (!kv_list_empty(&tp->partial)) {
			struct srun *r = kv_container_of(kv_list_front(&tp->partial), struct srun,
							 plink);

			*run = r;
			*slot = (uint16_t)slot_take(t, l, r, occ);
			return 0;
		}
		if (run_new(t, l, tp) == 0)
			continue;
		if (!evict_one(t, l, tp))
			break;
	}
	return -ENOSPC;
}

static uint64_t ns_key(struct kv_tiers *t, const struct kv_pool *p)
{
	const char *ns = kv_pools_ns_name(t->ps, p->ns);

	return XXH3_64bits(ns, strlen(ns));
}

static void hdr_fill(struct kv_tiers *t, struct tblock *tb, struct slot_hdr *h, uint32_t crc)
{
	memset(h, 0, sizeof(*h));
	h->magic = SLOT_MAGIC;
	h->version = SLOT_VERSION;
	h->ns = ns_key(t, tb->pool);
	h->layout = tb->pool->layout_id;
	memcpy(h->hash, tb->ix.hash, KV_HASH_BYTES);
	h->payload_len = tb->pool->block_bytes;
	h->payload_crc = crc;
	h->hdr_crc = kv_crc32c(0, h, sizeof(*h));
}

/* ---- waking parked requests ----------------------------------------------- */

static void wake_all(struct kv_list *waiters)
{
	struct kv_list local;

	kv_list_init(&local);
	while (!kv_list_empty(waiters)) {
		struct kv_list *n = kv_list_front(waiters);

		kv_list_del(n);
		kv_list_push_back(&local, n);
	}
	while (!kv_list_empty(&local)) {
		struct kv_waiter *w = kv_container_of(kv_list_front(&local), struct kv_waiter, link);

		kv_list_del(&w->link);
		w->wake(w);
	}
}

/* ---- demotion: G1 -> G2 ------------------------------------------------------ */

static void op_fail_undo(struct kv_tiers *t, struct copyop *op)
{
	uint32_t i;

	for (i = 0; i < op->n; i++) {
		struct kv_block *b = kv_block_lookup(t->ps, op->h[i]);

		if (b)
			kv_block_demote_end(b, 0);
		op->tb[i]->busy = 0;
		tb_free(t, op->tb[i]);
	}
	free(op);
}

/* Starts copying the oldest cached blocks of dev (of pool only, when set)
 * into G2 until want bytes are under way. Returns the bytes started. */
static uint64_t demote(struct kv_tiers *t, uint32_t dev, struct kv_pool *only, uint64_t want)
{
	uint64_t started = 0;

	while (started < want) {
		struct kv_copy c[BATCH];
		struct copyop *op = calloc(1, sizeof(*op));
		int r;

		if (!op)
			break;
		op->kind = OP_DEMOTE;
		op->dev = dev;
		while (op->n < BATCH && started + op->bytes < want) {
			struct kv_block *b;
			struct tblock *tb;
			struct kv_list *n;

			/* With a disk behind it, G2 keeps g2_low percent free or
			 * clean for promotions to stage through: past that,
			 * demotion waits for write-back. */
			if (t->lv[L3].on && (t->dirty_bytes + t->swap_bytes) * 100 >=
						    t->lv[L2].st.capacity * (100 - t->cfg.g2_low))
				break;
			if (only)
				b = (n = kv_list_back(&only->lru)) ? kv_container_of(n, struct kv_block, node)
								   : NULL;
			else
				b = kv_pools_oldest_cached(t->ps, dev);
			if (!b)
				break;
			tb = tb_new(t, kv_block_pool(b), b->ix.hash);
			if (!tb)
				break;
			if (slot_alloc(t, L2, tb->pool, tb, &tb->run[L2], &tb->slot[L2]) < 0) {
				free(tb);
				break;
			}
			tb->busy = BUSY_DOWN;
			kv_block_demote_begin(b);
			c[op->n] = (struct kv_copy){ .dev_off = kv_block_offset(b),
						      .host = g2_slot(t, tb->run[L2], tb->slot[L2]) +
							      HDR_BYTES,
						      .len = tb->pool->block_bytes };
			op->tb[op->n] = tb;
			op->h[op->n] = kv_block_handle(b);
			op->bytes += tb->pool->block_bytes;
			op->n++;
		}
		if (!op->n) {
			free(op);
			break;
		}
		r = t->be->ops->copy_async(t->be, dev, KV_COPY_D2H, c, op->n, (uint64_t)(uintptr_t)op);
		if (r < 0) {
			kv_warn("host tier: demotion copy failed to start: %s", strerror(-r));
			t->lv[L2].st.io_errors++;
			op_fail_undo(t, op);
			break;
		}
		started += op->bytes;
		t->down_bytes[dev] += op->bytes;
		t->lv[L2].st.inflight++;
	}
	return started;
}

static void demote_done(struct kv_tiers *t, struct copyop *op, int res)
{
	uint32_t i;

	t->down_bytes[op->dev] -= op->bytes;
	if (res < 0) {
		t->lv[L2].st.io_errors++;
		kv_warn("host tier: demotion of %u blocks failed: %s; they stay in G1", op->n,
			strerror(-res));
	}
	for (i = 0; i < op->n; i++) {
		struct kv_block *b = kv_block_lookup(t->ps, op->h[i]);
		struct tblock *tb = op->tb[i];

		if (b && kv_block_demote_end(b, res == 0)) {
			tb_index(t, tb);
			t->lv[L2].st.blocks++;
			dirty_add(t, tb, 1);
			t->lv[L2].st.demotions++;
			tb_unbusy(t, tb, BUSY_DOWN);
		} else {
			/* A lookup took the block meanwhile (or the copy failed):
			 * the block stays in G1, the copy goes. */
			tb->busy = 0;
			slot_put(t, L2, tb->run[L2], tb->slot[L2]);
			tb->run[L2] = NULL;
			free(tb);
		}
	}
}

/* ---- write-back: G2 -> G3 ------------------------------------------------------ */

static void wb_done(struct kv_disk_op *dop, int res);

static int writeback(struct kv_tiers *t, struct tblock *tb)
{
	uint8_t *slot = g2_slot(t, tb->run[L2], tb->slot[L2]);
	struct slot_hdr h;

	if (slot_alloc(t, L3, tb->pool, tb, &tb->run[L3], &tb->slot[L3]) < 0)
		return -ENOSPC;
	hdr_fill(t, tb, &h, kv_crc32c(0, slot + HDR_BYTES, tb->pool->block_bytes));
	memset(slot, 0, HDR_BYTES);
	memcpy(slot, &h, sizeof(h));
	tb_busy(tb, BUSY_WB);
	tb->dop = (struct kv_disk_op){ .done = wb_done, .write = 1, .buf = slot,
				       .len = tb->run[L3]->slot_bytes,
				       .off = g3_off(t, tb->run[L3], tb->slot[L3]) };
	t->wb_bytes += tb->run[L2]->slot_bytes;
	t->lv[L3].st.inflight++;
	kv_disk_submit(&t->disk, &tb->dop);
	return 0;
}

static void wb_done(struct kv_disk_op *dop, int res)
{
	struct tblock *tb = kv_container_of(dop, struct tblock, dop);
	struct kv_tiers *t = tb->t;
	struct level *L = &t->lv[L3];

	t->wb_bytes -= tb->run[L2]->slot_bytes;
	L->st.inflight--;
	if (res == (int)dop->len && !tb->dead) {
		tb->g3_ok = 1;
		L->st.blocks++;
		L->st.demotions++;
		dirty_add(t, tb, -1);
		jappend(t, KV_J_SLOT, tb->run[L3], tb->slot[L3], tb->ix.hash);
	} else {
		if (!tb->dead) {
			L->st.io_errors++;
			kv_warn("disk tier: write of %u bytes at %llu: %s; the block stays in G2",
				dop->len, (unsigned long long)dop->off,
				res < 0 ? strerror(-res) : "short write");
		}
		if (res == -ENOSPC || res == -EDQUOT) {
			uint32_t used = L->pages.npages - L->pages.nfree;

			if (used < L->limit_pages) {
				L->limit_pages = used;
				L->st.capacity = (uint64_t)used * t->page_bytes;
				kv_warn("disk tier: the file system is full; G3 shrinks to %u MiB",
					(unsigned)(L->st.capacity >> 20));
			}
		}
		slot_put(t, L3, tb->run[L3], tb->slot[L3]);
		tb->run[L3] = NULL;
	}
	tb->busy &= (uint8_t)~BUSY_WB;
	if (!tb->busy && tb->evict_g2 && tb->g3_ok && !tb->dead) {
		tb->evict_g2 = 0;
		drop_g2(t, tb);
		return;
	}
	tb_unbusy(t, tb, 0);
}

/* The oldest idle dirty G2 copy of any pool. */
static struct tblock *oldest_dirty(struct kv_tiers *t)
{
	struct tblock *victim = NULL;
	uint32_t i;

	for (i = 0; i < kv_pools_count(t->ps); i++) {
		struct tpool *tp = t->lv[L2].tp[i];
		struct kv_list *n;
		struct tblock *b;

		if (!tp || !(n = kv_list_back(&tp->lru)))
			continue;
		b = kv_container_of(n, struct tblock, lru[L2]);
		if (!victim || b->tick < victim->tick)
			victim = b;
	}
	return victim;
}

/* ---- promotion: G3 -> G2 -> G1 ----------------------------------------------- */

static void read_done(struct kv_disk_op *dop, int res);

/* Clears flag and runs tb's waiting lookups again; with failed set they see
 * tb as a miss. tb stays allocated while they run (BUSY_WAKE), whatever they
 * do to it. */
static void wake_waiters(struct kv_tiers *t, struct tblock *tb, int flag, int failed)
{
	tb->busy &= (uint8_t)~flag;
	tb->busy |= BUSY_WAKE;
	tb->failed = (uint8_t)failed;
	wake_all(&tb->waiters);
	tb->failed = 0;
	tb_unbusy(t, tb, BUSY_WAKE);
}

static void promote_fail(struct kv_tiers *t, struct tblock *tb, int flag)
{
	kv_debug("promotion of a block of pool '%s' failed", tb->pool->name);
	wake_waiters(t, tb, flag, 1);
}

static int up_start(struct kv_tiers *t, struct tblock *tb)
{
	struct kv_block *b;
	struct copyop *op;
	struct kv_copy c;
	char why[256];
	int r;

	/* Room in G1 without dropping anything if possible: when there is
	 * none, demote (so that a cached block moves down instead of being
	 * lost) and let the caller wait for it. */
	if (kv_pool_alloc_free(tb->pool, 1, &b) < 0) {
		uint32_t dev = tb->pool->device;

		if (!t->down_bytes[dev]) {
			demote(t, dev, NULL, 4 * tb->pool->block_bytes);
			/* G2 may be full of dirty copies: write-back frees it. */
			kv_tiers_kick(t);
		}
		if (t->down_bytes[dev] || t->lv[L2].st.inflight || t->lv[L3].st.inflight)
			return -EAGAIN;
		if (kv_pool_alloc(tb->pool, 1, &b, why, sizeof(why)) < 0)
			return -ENOSPC;
	}
	op = calloc(1, sizeof(*op));
	if (!op) {
		kv_block_unref(b);
		return -ENOMEM;
	}
	op->kind = OP_PROMOTE;
	op->dev = tb->pool->device;
	op->n = 1;
	op->tb[0] = tb;
	op->h[0] = tb->dst = kv_block_handle(b);
	c = (struct kv_copy){ .dev_off = kv_block_offset(b),
			      .host = g2_slot(t, tb->run[L2], tb->slot[L2]) + HDR_BYTES,
			      .len = tb->pool->block_bytes };
	tb_busy(tb, BUSY_UP);
	r = t->be->ops->copy_async(t->be, op->dev, KV_COPY_H2D, &c, 1, (uint64_t)(uintptr_t)op);
	if (r < 0) {
		free(op);
		kv_block_unref(b);
		tb->busy &= (uint8_t)~BUSY_UP;
		t->lv[L2].st.io_errors++;
		return r;
	}
	t->lv[L2].st.inflight++;
	return 0;
}

static void up_done(struct kv_tiers *t, struct copyop *op, int res)
{
	struct tblock *tb = op->tb[0];
	struct kv_block *b = kv_block_lookup(t->ps, op->h[0]);

	t->lv[L2].st.inflight--;
	if (res < 0 || !b) {
		t->lv[L2].st.io_errors++;
		kv_warn("host tier: promotion copy failed: %s", strerror(res < 0 ? -res : EIO));
		if (b)
			kv_block_unref(b);
		promote_fail(t, tb, BUSY_UP);
		return;
	}
	if (tb->dead) {
		/* The hash was sealed in G1 meanwhile: that block wins. */
		kv_block_unref(b);
	} else {
		if (tb->indexed) {
			kv_index_remove(kv_pools_index(t->ps), &tb->ix);
			tb->indexed = 0;
			t->entries--;
		}
		b = kv_pool_seal(tb->pool, b, tb->ix.hash);
		kv_block_unref(b);
		tb->dead = 1;
		t->g1.promotions++;
	}
	wake_waiters(t, tb, BUSY_UP, 0);
}

static int read_start(struct kv_tiers *t, struct tblock *tb)
{
	if (slot_alloc(t, L2, tb->pool, tb, &tb->run[L2], &tb->slot[L2]) < 0)
		return -ENOSPC;
	tb_busy(tb, BUSY_READ);
	tb->dop = (struct kv_disk_op){ .done = read_done, .buf = g2_slot(t, tb->run[L2], tb->slot[L2]),
				       .len = tb->run[L3]->slot_bytes,
				       .off = g3_off(t, tb->run[L3], tb->slot[L3]) };
	t->lv[L3].st.inflight++;
	kv_disk_submit(&t->disk, &tb->dop);
	return 0;
}

/* Whether the slot read into buf is what tb names. */
static const char *slot_bad(struct kv_tiers *t, struct tblock *tb, const uint8_t *buf)
{
	struct slot_hdr h, want;

	memcpy(&h, buf, sizeof(h));
	if (h.magic != SLOT_MAGIC)
		return "bad magic";
	if (h.version != SLOT_VERSION)
		return "unknown format version";
	hdr_fill(t, tb, &want, h.payload_crc);
	if (h.hdr_crc != want.hdr_crc || memcmp(&h, &want, sizeof(h)))
		return h.ns != want.ns ? "another namespace"
		       : h.layout != want.layout ? "another layout"
		       : memcmp(h.hash, want.hash, KV_HASH_BYTES) ? "another hash"
		       : h.payload_len != want.payload_len ? "another length"
							   : "header checksum mismatch";
	if (kv_crc32c(0, buf + HDR_BYTES, h.payload_len) != h.payload_crc)
		return "payload checksum mismatch";
	return NULL;
}

static void read_done(struct kv_disk_op *dop, int res)
{
	struct tblock *tb = kv_container_of(dop, struct tblock, dop);
	struct kv_tiers *t = tb->t;
	struct level *L = &t->lv[L3];
	const char *bad = NULL;

	L->st.inflight--;
	if (res != (int)dop->len) {
		L->st.io_errors++;
		bad = res < 0 ? strerror(-res) : "short read";
	} else if ((bad = slot_bad(t, tb, dop->buf))) {
		L->st.checksum_failures++;
	}
	if (bad) {
		kv_warn("disk tier: slot at %llu of pool '%s': %s; treated as a miss",
			(unsigned long long)dop->off, tb->pool->name, bad);
		slot_put(t, L2, tb->run[L2], tb->slot[L2]);
		tb->run[L2] = NULL;
		/* The copy on disk is not to be trusted again. */
		L->st.blocks--;
		jappend(t, KV_J_SLOT_FREE, tb->run[L3], tb->slot[L3], NULL);
		slot_put(t, L3, tb->run[L3], tb->slot[L3]);
		tb->run[L3] = NULL;
		tb->g3_ok = 0;
		tb_kill(t, tb);  /* freed by wake_waiters(): still busy here */
		wake_waiters(t, tb, BUSY_READ, 1);
		return;
	}
	t->lv[L2].st.blocks++;  /* a clean G2 copy now */
	if (!tb->dead) {
		int r = up_start(t, tb);

		if (r == 0) {
			tb->busy &= (uint8_t)~BUSY_READ;
			return;
		}
		if (r == -EAGAIN) {
			/* No G1 room yet: the waiters run again and wait for it,
			 * promoting from the G2 copy. */
			wake_waiters(t, tb, BUSY_READ, 0);
			return;
		}
	}
	promote_fail(t, tb, BUSY_READ);
}

int kv_tiers_promote(struct kv_tiers *t, struct kv_index_entry *e, struct kv_waiter *w)
{
	struct tblock *tb = kv_container_of(e, struct tblock, ix);

	if (tb->failed)
		return -ENOENT;
	if (!(tb->busy & (BUSY_READ | BUSY_UP))) {
		int from_g2 = tb->run[L2] != NULL;
		int r = from_g2 ? up_start(t, tb) : read_start(t, tb);

		if (r == -EAGAIN ||
		    (r == -ENOSPC && !from_g2 && (t->lv[L2].st.inflight || t->lv[L3].st.inflight))) {
			/* No room (G1, or G2 to stage in) until some copy or
			 * I/O completes. */
			if (!w)
				return -EAGAIN;
			kv_list_push_back(&t->space_waiters, &w->link);
			return 1;
		}
		if (r < 0) {
			kv_debug("promotion from G%d of a block of pool '%s' cannot start: %s",
				 from_g2 ? 2 : 3, tb->pool->name, strerror(-r));
			return -ENOENT;
		}
		t->lv[from_g2 ? L2 : L3].st.hits++;
	}
	if (w)
		kv_list_push_back(&tb->waiters, &w->link);
	return 1;
}

/* ---- swap -------------------------------------------------------------------- */

static void swap_free(struct kv_tiers *t, struct kv_swap *sw)
{
	uint32_t i;

	for (i = 0; i < sw->n; i++)
		if (sw->run[i]) {
			t->swap_bytes -= sw->run[i]->slot_bytes;
			slot_put(t, L2, sw->run[i], sw->slot[i]);
			t->lv[L2].st.blocks--;
		}
	if (kv_list_linked(&sw->all))
		kv_list_del(&sw->all);
	free(sw->run);
	free(sw->slot);
	free(sw->h);
	free(sw);
}

static void swap_unref(struct kv_tiers *t, struct kv_swap *sw)
{
	uint32_t i;

	for (i = 0; i < sw->n; i++) {
		struct kv_block *b = kv_block_lookup(t->ps, sw->h[i]);

		if (b)
			kv_block_unref(b);
	}
}

static int swap_copy(struct kv_tiers *t, struct kv_swap *sw, int kind, struct kv_block **blocks)
{
	struct kv_copy *c = calloc(sw->n, sizeof(*c));
	struct copyop *op = calloc(1, sizeof(*op));
	uint32_t i;
	int r;

	if (!c || !op) {
		free(c);
		free(op);
		return -ENOMEM;
	}
	op->kind = kind;
	op->sw = sw;
	op->dev = sw->pool->device;
	for (i = 0; i < sw->n; i++) {
		c[i] = (struct kv_copy){ .dev_off = kv_block_offset(blocks[i]),
					 .host = g2_slot(t, sw->run[i], sw->slot[i]) + HDR_BYTES,
					 .len = sw->pool->block_bytes };
		sw->h[i] = kv_block_handle(blocks[i]);
	}
	r = t->be->ops->copy_async(t->be, op->dev, kind == OP_SWAP_OUT ? KV_COPY_D2H : KV_COPY_H2D,
				   c, sw->n, (uint64_t)(uintptr_t)op);
	free(c);
	if (r < 0)
		free(op);
	else
		t->lv[L2].st.inflight++;
	return r;
}

int kv_tiers_swap_out(struct kv_tiers *t, struct kv_list *owner, struct kv_pool *p,
		      struct kv_block **blocks, uint32_t n, uint64_t *handle, char *why,
		      size_t whylen)
{
	struct kv_swap *sw;
	uint32_t i;
	int r;

	if (!t->lv[L2].on) {
		snprintf(why, whylen, "no host tier: start kvcached with --host-tier-size");
		return -ENOSPC;
	}
	sw = calloc(1, sizeof(*sw));
	if (!sw || !(sw->run = calloc(n, sizeof(*sw->run))) ||
	    !(sw->slot = calloc(n, sizeof(*sw->slot))) || !(sw->h = calloc(n, sizeof(*sw->h)))) {
		if (sw) {
			free(sw->run);
			free(sw->slot);
		}
		free(sw);
		return -ENOMEM;
	}
	sw->pool = p;
	kv_list_init(&sw->waiters);
	kv_list_init(&sw->all);
	for (i = 0; i < n; i++) {
		if (slot_alloc(t, L2, p, SWAP_SLOT, &sw->run[i], &sw->slot[i]) < 0) {
			snprintf(why, whylen,
				 "the host tier cannot hold %u blocks of %llu bytes (got %u; %llu of "
				 "%llu bytes in use)", n, (unsigned long long)p->block_bytes, i,
				 (unsigned long long)t->lv[L2].st.used,
				 (unsigned long long)t->lv[L2].st.capacity);
			sw->n = i;
			swap_free(t, sw);
			return -ENOSPC;
		}
		sw->n = i + 1;
		t->lv[L2].st.blocks++;
		t->swap_bytes += sw->run[i]->slot_bytes;
	}
	r = swap_copy(t, sw, OP_SWAP_OUT, blocks);
	if (r < 0) {
		snprintf(why, whylen, "copy to the host tier failed: %s", strerror(-r));
		t->lv[L2].st.io_errors++;
		swap_free(t, sw);
		return -EIO;
	}
	sw->state = SW_OUT_COPY;
	sw->id = ++t->next_swap;
	kv_list_push_back(owner, &sw->link);
	kv_list_push_back(&t->swaps, &sw->all);
	*handle = sw->id;
	return 0;
}

static void swap_done(struct kv_tiers *t, struct copyop *op, int res)
{
	struct kv_swap *sw = op->sw;

	t->lv[L2].st.inflight--;
	if (res < 0) {
		t->lv[L2].st.io_errors++;
		kv_warn("host tier: swap %s of %u blocks failed: %s",
			op->kind == OP_SWAP_OUT ? "out" : "in", sw->n, strerror(-res));
	}
	if (op->kind == OP_SWAP_OUT) {
		if (res < 0) {
			/* Keep the blocks in G1: swap_in hands them back as they are. */
			sw->state = SW_IN;
		} else {
			swap_unref(t, sw);
			sw->state = SW_OUT;
			t->lv[L2].st.demotions += sw->n;
		}
	} else if (res < 0) {
		swap_unref(t, sw);
		sw->state = SW_OUT;
		sw->err = -EIO;
	} else {
		uint32_t i;

		for (i = 0; i < sw->n; i++) {
			t->swap_bytes -= sw->run[i]->slot_bytes;
			slot_put(t, L2, sw->run[i], sw->slot[i]);
			sw->run[i] = NULL;
			t->lv[L2].st.blocks--;
		}
		sw->state = SW_IN;
		t->g1.promotions += sw->n;
	}
	if (sw->dead) {
		if (sw->state == SW_IN)
			swap_unref(t, sw);
		swap_free(t, sw);
		return;
	}
	wake_all(&sw->waiters);
}

int kv_tiers_swap_in(struct kv_tiers *t, struct kv_list *owner, uint64_t handle,
		     struct kv_waiter *w, struct kv_block **out, uint32_t max, uint32_t *n,
		     char *why, size_t whylen)
{
	struct kv_swap *sw = NULL;
	struct kv_list *pos;
	uint32_t i;
	int r;

	kv_list_for_each(pos, owner) {
		struct kv_swap *s = kv_container_of(pos, struct kv_swap, link);

		if (s->id == handle) {
			sw = s;
			break;
		}
	}
	if (!sw) {
		snprintf(why, whylen, "no swap %llu on this connection", (unsigned long long)handle);
		return -ENOENT;
	}
	if (sw->state == SW_OUT_COPY || sw->state == SW_IN_COPY) {
		kv_list_push_back(&sw->waiters, &w->link);
		return 1;
	}
	if (sw->err) {
		sw->err = 0;
		snprintf(why, whylen, "copy from the host tier failed; the swap is kept, try again");
		return -EIO;
	}
	if (sw->n > max) {
		snprintf(why, whylen, "swap of %u blocks is larger than max_batch %u", sw->n, max);
		return -E2BIG;
	}
	if (sw->state == SW_OUT) {
		r = kv_pool_alloc(sw->pool, sw->n, out, why, whylen);
		if (r < 0)
			return r;
		r = swap_copy(t, sw, OP_SWAP_IN, out);
		if (r < 0) {
			for (i = 0; i < sw->n; i++)
				kv_block_unref(out[i]);
			t->lv[L2].st.io_errors++;
			snprintf(why, whylen, "copy from the host tier failed: %s", strerror(-r));
			return -EIO;
		}
		sw->state = SW_IN_COPY;
		kv_list_push_back(&sw->waiters, &w->link);
		return 1;
	}
	for (i = 0; i < sw->n; i++)
		out[i] = kv_block_lookup(t->ps, sw->h[i]);
	*n = sw->n;
	kv_list_del(&sw->link);
	swap_free(t, sw);
	return 0;
}

void kv_tiers_owner_gone(struct kv_tiers *t, struct kv_list *owner)
{
	while (!kv_list_empty(owner)) {
		struct kv_swap *sw = kv_container_of(kv_list_front(owner), struct kv_swap, link);

		kv_list_del(&sw->link);
		if (sw->state == SW_OUT_COPY || sw->state == SW_IN_COPY) {
			sw->dead = 1;
			continue;
		}
		if (sw->state == SW_IN)
			swap_unref(t, sw);
		swap_free(t, sw);
	}
}

/* ---- completions and the watermarks ----------------------------------------- */

void kv_tiers_copies_done(struct kv_tiers *t)
{
	struct kv_copy_done done[32];
	int n, i;

	while ((n = t->be->ops->reap(t->be, done, 32)) > 0) {
		for (i = 0; i < n; i++) {
			struct copyop *op = (struct copyop *)(uintptr_t)done[i].tag;

			switch (op->kind) {
			case OP_DEMOTE:
				t->lv[L2].st.inflight--;
				demote_done(t, op, done[i].res);
				break;
			case OP_PROMOTE:
				up_done(t, op, done[i].res);
				break;
			default:
				swap_done(t, op, done[i].res);
				break;
			}
			free(op);
		}
	}
	/* Lookups waiting for staging room first: demotion must not take
	 * the slots that promotions just gave back. */
	wake_all(&t->space_waiters);
	kv_tiers_kick(t);
}

void kv_tiers_disk_done(struct kv_tiers *t)
{
	if (t->lv[L3].on)
		kv_disk_reap(&t->disk);
	/* Lookups waiting for staging room first: demotion must not take
	 * the slots that promotions just gave back. */
	wake_all(&t->space_waiters);
	kv_tiers_kick(t);
}

static void journal_compact(struct kv_tiers *t);

void kv_tiers_kick(struct kv_tiers *t)
{
	struct level *L = &t->lv[L2];
	uint32_t d;

	if (!L->on)
		return;
	if (t->lv[L3].on) {
		uint64_t cap = L->st.capacity;
		uint64_t pinned = t->dirty_bytes + t->swap_bytes, wb = t->wb_bytes;
		struct tblock *tb;

		/* Clean copies cost nothing to drop, so what fills G2 is what is
		 * dirty (and swapped): write back when the rest falls under
		 * g2_low percent, until it reaches g2_high (counting writes in
		 * flight). */
		if (t->writing_back || (cap - pinned) * 100 < cap * t->cfg.g2_low) {
			t->writing_back = 1;
			while ((cap - pinned + wb) * 100 < cap * t->cfg.g2_high &&
			       (tb = oldest_dirty(t)) && writeback(t, tb) == 0)
				wb += tb->run[L2]->slot_bytes;
			if ((cap - pinned + wb) * 100 >= cap * t->cfg.g2_high || !t->wb_bytes)
				t->writing_back = 0;
		}
	}
	for (d = 0; d < t->be->devices; d++) {
		uint64_t total, free = kv_pools_dev_free(t->ps, d, &total) + t->down_bytes[d];

		if (!t->demoting[d] && free * 100 >= total * t->cfg.g1_low)
			continue;
		t->demoting[d] = 1;
		if (free * 100 < total * t->cfg.g1_high)
			demote(t, d, NULL, total * t->cfg.g1_high / 100 - free);
		free = kv_pools_dev_free(t->ps, d, &total) + t->down_bytes[d];
		if (free * 100 >= total * t->cfg.g1_high || !t->down_bytes[d])
			t->demoting[d] = 0;
	}
	if (t->lv[L3].on) {
		kv_disk_flush(&t->disk);
		if (t->jr.records > 2 * t->jlive + 16384)
			journal_compact(t);
	}
}

/* ---- the journal: compaction and replay ----------------------------------- */

struct jiter {
	struct srun **runs;
	size_t n, i;
	uint32_t slot;
	int run_done;
};

static int jnext(void *ctx, struct kv_jrec *rec)
{
	struct jiter *it = ctx;

	while (it->i < it->n) {
		struct srun *r = it->runs[it->i];

		memset(rec, 0, sizeof(*rec));
		rec->page = r->first_page;
		if (!it->run_done) {
			it->run_done = 1;
			it->slot = 0;
			rec->type = KV_J_RUN;
			rec->npages = r->npages;
			rec->slot_bytes = r->slot_bytes;
			rec->nslots = r->nslots;
			rec->layout = r->layout;
			return 1;
		}
		while (it->slot < r->nslots) {
			uint32_t s = it->slot++;
			struct tblock *tb = r->occ[s];

			if (r->dvalid ? r->dvalid[s] : tb && tb != SWAP_SLOT && tb->g3_ok &&
								 tb->run[L3] == r) {
				rec->type = KV_J_SLOT;
				rec->slot = (uint16_t)s;
				memcpy(rec->hash, r->dvalid ? r->dhash[s] : tb->ix.hash, KV_HASH_BYTES);
				return 1;
			}
		}
		it->i++;
		it->run_done = 0;
	}
	return 0;
}

static void journal_compact(struct kv_tiers *t)
{
	struct level *L = &t->lv[L3];
	struct jiter it = { 0 };
	uint32_t pg;
	int r;

	it.runs = calloc(L->pages.npages + 1, sizeof(*it.runs));
	if (!it.runs)
		return;
	/* Every run, in page order: each page's owner is its run. */
	for (pg = 0; pg < L->pages.npages; pg++) {
		struct srun *run = L->pages.owner[pg];

		if (run && run->first_page == pg)
			it.runs[it.n++] = run;
	}
	r = kv_journal_rewrite(&t->jr, jnext, &it);
	if (r < 0)
		kv_warn("disk tier: cannot rewrite the index journal %s: %s", t->jr.path,
			strerror(-r));
	else
		t->jlive = t->jr.records;
	free(it.runs);
}

/* Replay: builds dormant runs indexed by their first page. */
struct replay {
	struct kv_tiers *t;
	struct srun **at;   /* per page: the dormant run starting there */
	uint32_t npages;
};

static void replay_drop(struct replay *rp, uint32_t page)
{
	if (page < rp->npages && rp->at[page]) {
		srun_free(rp->at[page]);
		rp->at[page] = NULL;
	}
}

static void replay_rec(void *ctx, const struct kv_jrec *rec)
{
	struct replay *rp = ctx;
	struct srun *r;
	uint32_t pg;

	switch (rec->type) {
	case KV_J_RUN:
		if (rec->page >= rp->npages || !rec->npages || rec->npages > rp->npages - rec->page ||
		    !rec->nslots || rec->nslots > KV_MAX_RUN_BLOCKS ||
		    (uint64_t)rec->nslots * rec->slot_bytes > (uint64_t)rec->npages * rp->t->page_bytes)
			return;
		/* A run that overlaps this one is gone. */
		for (pg = rec->page > KV_MAX_RUN_BLOCKS ? rec->page - KV_MAX_RUN_BLOCKS : 0;
		     pg < rec->page + rec->npages && pg < rp->npages; pg++)
			if (rp->at[pg] && pg + rp->at[pg]->npages > rec->page)
				replay_drop(rp, pg);
		r = srun_alloc(rec->nslots, 1);
		if (!r)
			return;
		r->first_page = rec->page;
		r->npages = rec->npages;
		r->slot_bytes = rec->slot_bytes;
		r->layout = rec->layout;
		rp->at[rec->page] = r;
		break;
	case KV_J_RUN_FREE:
		replay_drop(rp, rec->page);
		break;
	case KV_J_SLOT:
	case KV_J_SLOT_FREE:
		if (rec->page >= rp->npages || !(r = rp->at[rec->page]) || rec->slot >= r->nslots)
			return;
		r->dvalid[rec->slot] = rec->type == KV_J_SLOT;
		if (rec->type == KV_J_SLOT)
			memcpy(r->dhash[rec->slot], rec->hash, KV_HASH_BYTES);
		break;
	}
}

/* Claims the replayed runs that still hold something; they wait on the
 * dormant list for their pool. Returns how many blocks they hold. */
static uint64_t replay_finish(struct kv_tiers *t, struct replay *rp)
{
	uint64_t blocks = 0;
	uint32_t pg, s;

	for (pg = 0; pg < rp->npages; pg++) {
		struct srun *r = rp->at[pg];
		uint32_t used = 0;

		if (!r)
			continue;
		for (s = 0; s < r->nslots; s++)
			used += r->dvalid[s];
		if (!used || kv_pages_claim(&t->lv[L3].pages, r->first_page, r->npages, 1, r) < 0) {
			srun_free(r);
			continue;
		}
		r->nused = used;
		t->lv[L3].st.used += (uint64_t)used * r->slot_bytes;
		blocks += used;
		kv_list_push_back(&t->dormant, &r->link);
	}
	return blocks;
}

void kv_tiers_pool_added(struct kv_tiers *t, struct kv_pool *p)
{
	const char *ns = kv_pools_ns_name(t->ps, p->ns);
	struct kv_list *pos, *tmp;
	XXH3_state_t *st = XXH3_createState();
	struct tpool *tp;
	uint64_t adopted = 0;

	if (!st)
		return;
	/* The layout id: what must match for a block's bytes to mean the same. */
	XXH3_64bits_reset(st);
	XXH3_64bits_update(st, ns, strlen(ns) + 1);
	XXH3_64bits_update(st, p->name, strlen(p->name) + 1);
	XXH3_64bits_update(st, &p->block_bytes, sizeof(p->block_bytes));
	XXH3_64bits_update(st, &p->block_tokens, sizeof(p->block_tokens));
	XXH3_64bits_update(st, p->dtype, strlen(p->dtype) + 1);
	if (p->layout_len)
		XXH3_64bits_update(st, p->layout, p->layout_len);
	p->layout_id = XXH3_64bits_digest(st);
	XXH3_freeState(st);
	if (!t->lv[L3].on || kv_list_empty(&t->dormant) || !(tp = tpool_get(t, L3, p)))
		return;
	kv_list_for_each_safe(pos, tmp, &t->dormant) {
		struct srun *r = kv_container_of(pos, struct srun, link);
		uint32_t s;

		if (r->layout != p->layout_id || r->slot_bytes != tp->slot_bytes ||
		    r->nslots != tp->nslots || r->npages != tp->run_pages)
			continue;
		kv_list_del(&r->link);
		r->tp = tp;
		kv_list_push_back(&tp->runs, &r->link);
		for (s = 0; s < r->nslots; s++) {
			struct tblock *tb;

			if (!r->dvalid[s])
				continue;
			if (kv_pool_find_entry(p, r->dhash[s]) || !(tb = tb_new(t, p, r->dhash[s]))) {
				r->dvalid[s] = 0;
				r->nused--;
				t->lv[L3].st.used -= r->slot_bytes;
				continue;
			}
			tb->run[L3] = r;
			tb->slot[L3] = (uint16_t)s;
			tb->g3_ok = 1;
			r->occ[s] = tb;
			tb_index(t, tb);
			tb_idle(t, tb);
			t->lv[L3].st.blocks++;
			adopted++;
		}
		free(r->dhash);
		free(r->dvalid);
		r->dhash = NULL;
		r->dvalid = NULL;
		srun_chain(r);
		if (!r->nused) {
			kv_list_del(&r->link);
			kv_pages_free(&t->lv[L3].pages, r->first_page, r->npages);
			srun_free(r);
		} else if (r->nused < r->nslots) {
			kv_list_push_back(&tp->partial, &r->plink);
		}
	}
	if (adopted)
		kv_info("disk tier: pool '%s' of namespace '%s' finds %llu blocks from before "
			"the restart", p->name, ns, (unsigned long long)adopted);
}

/* ---- setup ----------------------------------------------------------------- */

/* kv_pool_seal() of a hash a lower tier holds: the G1 block wins. */
static void tier_drop(void *ctx, struct kv_index_entry *e)
{
	tb_kill(ctx, kv_container_of(e, struct tblock, ix));
}

static int level_init(struct kv_tiers *t, int l, uint64_t bytes)
{
	uint64_t seg = 1ull << 30, pages;
	struct level *L = &t->lv[l];
	int r;

	bytes -= bytes % t->page_bytes;
	if (seg > bytes)
		seg = bytes;
	seg -= seg % t->page_bytes;
	if (!seg)
		return -EINVAL;
	bytes -= bytes % seg;
	r = kv_pages_init(&L->pages, (uint32_t)l, (uint32_t)(bytes / seg), seg, t->page_bytes);
	if (r < 0)
		return r;
	pages = bytes / t->page_bytes;
	L->limit_pages = (uint32_t)pages;
	L->st.capacity = bytes;
	L->on = 1;
	return 0;
}

int kv_tiers_create(struct kv_pools *ps, struct kv_backend *be, uint64_t page_bytes,
		    const struct kv_tiers_config *cfg, struct kv_tiers **out, char *err,
		    size_t errlen)
{
	struct kv_tiers *t = calloc(1, sizeof(*t));
	int r;

	if (!t)
		return -ENOMEM;
	t->ps = ps;
	t->be = be;
	t->cfg = *cfg;
	t->page_bytes = page_bytes;
	t->disk.fd = t->disk.efd = -1;
	t->jr.fd = -1;
	kv_list_init(&t->dormant);
	kv_list_init(&t->swaps);
	kv_list_init(&t->space_waiters);
	kv_pools_set_tier_drop(ps, tier_drop, t);
	*out = t;
	if (!cfg->host_bytes) {
		if (cfg->disk_path[0]) {
			snprintf(err, errlen, "disk_path needs a host tier (host_tier_size) to stage "
					      "its I/O through");
			goto fail_einval;
		}
		return 0;
	}
	if (cfg->g1_low > cfg->g1_high || cfg->g1_high > 100 || cfg->g2_low > cfg->g2_high ||
	    cfg->g2_high > 100) {
		snprintf(err, errlen, "watermarks: need low <= high <= 100 (g1 %u/%u, g2 %u/%u)",
			 cfg->g1_low, cfg->g1_high, cfg->g2_low, cfg->g2_high);
		goto fail_einval;
	}
	if (cfg->host_bytes < page_bytes) {
		snprintf(err, errlen, "host_tier_size %llu is less than one page (%llu bytes)",
			 (unsigned long long)cfg->host_bytes, (unsigned long long)page_bytes);
		goto fail_einval;
	}
	r = level_init(t, L2, cfg->host_bytes);
	if (r < 0) {
		snprintf(err, errlen, "host tier: %s", strerror(-r));
		goto fail;
	}
	t->g2_bytes = t->lv[L2].st.capacity;
	t->g2 = be->ops->host_alloc(be, t->g2_bytes);
	if (!t->g2) {
		snprintf(err, errlen, "host tier: cannot allocate %llu bytes",
			 (unsigned long long)t->g2_bytes);
		r = -ENOMEM;
		goto fail;
	}
	if (cfg->disk_path[0]) {
		struct replay rp = { .t = t };
		char jpath[sizeof(cfg->disk_index) + 8];
		uint64_t blocks;

		if (cfg->disk_bytes < page_bytes) {
			snprintf(err, errlen, "disk_size %llu is less than one page (%llu bytes)",
				 (unsigned long long)cfg->disk_bytes, (unsigned long long)page_bytes);
			goto fail_einval;
		}
		r = kv_disk_open(&t->disk, cfg->disk_path, cfg->disk_bytes, cfg->queue_depth, t->g2,
				 t->g2_bytes, t->lv[L2].pages.segment_bytes, err, errlen);
		if (r < 0)
			goto fail;
		if (!t->disk.direct)
			kv_warn("disk tier: %s does not support O_DIRECT; using the page cache",
				cfg->disk_path);
		r = level_init(t, L3, t->disk.bytes);
		if (r < 0) {
			snprintf(err, errlen, "disk tier: %s", strerror(-r));
			goto fail;
		}
		rp.npages = t->lv[L3].pages.npages;
		rp.at = calloc(rp.npages, sizeof(*rp.at));
		if (!rp.at) {
			r = -ENOMEM;
			snprintf(err, errlen, "out of memory");
			goto fail;
		}
		if (cfg->disk_index[0])
			snprintf(jpath, sizeof(jpath), "%s", cfg->disk_index);
		else
			snprintf(jpath, sizeof(jpath), "%s.idx", cfg->disk_path);
		r = kv_journal_open(&t->jr, jpath, page_bytes, t->lv[L3].st.capacity, replay_rec, &rp,
				    err, errlen);
		if (r < 0) {
			free(rp.at);
			goto fail;
		}
		blocks = replay_finish(t, &rp);
		free(rp.at);
		journal_compact(t);
		kv_info("disk tier: %s, %llu MiB%s, index %s: %llu blocks from before", cfg->disk_path,
			(unsigned long long)(t->lv[L3].st.capacity >> 20),
			t->disk.direct ? ", O_DIRECT" : "", jpath, (unsigned long long)blocks);
	}
	return 0;
fail_einval:
	r = -EINVAL;
fail:
	kv_tiers_destroy(t);
	*out = NULL;
	return r;
}

/* Frees every tier block and run of level l. */
static void level_fini(struct kv_tiers *t, int l)
{
	struct level *L = &t->lv[l];
	uint32_t pg, s;

	for (pg = 0; L->on && pg < L->pages.npages; pg++) {
		struct srun *r = L->pages.owner[pg];

		if (!r || r->first_page != pg)
			continue;
		for (s = 0; s < r->nslots; s++) {
			struct tblock *tb = r->occ[s];

			if (!tb || tb == SWAP_SLOT)
				continue;
			tb->run[l] = NULL;
			if (!tb->run[L2] && !tb->run[L3])
				free(tb);
		}
		pg += r->npages - 1;  /* its other pages point at it too */
		srun_free(r);
	}
	for (s = 0; s < KV_MAX_POOLS; s++)
		free(L->tp[s]);
	kv_pages_fini(&L->pages);
}

void kv_tiers_destroy(struct kv_tiers *t)
{
	if (!t)
		return;
	/* Let what is in flight finish, so that nothing points at freed
	 * memory and the journal records every write that completed. */
	while (t->lv[L3].on && t->disk.inflight) {
		struct io_uring_cqe *cqe;

		kv_disk_flush(&t->disk);
		if (io_uring_wait_cqe(&t->disk.ring, &cqe) < 0)
			break;
		kv_disk_reap(&t->disk);
	}
	if (t->lv[L2].on)
		kv_tiers_copies_done(t);
	while (!kv_list_empty(&t->swaps)) {
		struct kv_swap *sw = kv_container_of(kv_list_front(&t->swaps), struct kv_swap, all);

		if (kv_list_linked(&sw->link))
			kv_list_del(&sw->link);
		swap_free(t, sw);
	}
	if (t->lv[L3].on && t->jr.fd >= 0)
		journal_compact(t);
	while (!kv_list_empty(&t->dormant)) {
		struct srun *r = kv_container_of(kv_list_front(&t->dormant), struct srun, link);

		kv_list_del(&r->link);
		kv_pages_free(&t->lv[L3].pages, r->first_page, r->npages);
		srun_free(r);
	}
	level_fini(t, L3);
	level_fini(t, L2);
	kv_journal_close(&t->jr);
	if (t->disk.fd >= 0 || t->disk.ring_ok)
		kv_disk_close(&t->disk);
	if (t->g2)
		t->be->ops->host_free(t->be, t->g2, t->g2_bytes);
	kv_pools_set_tier_drop(t->ps, NULL, NULL);
	free(t);
}

int kv_tiers_disk_fd(const struct kv_tiers *t)
{
	return t->lv[L3].on ? t->disk.efd : -1;
}

int kv_tiers_on(const struct kv_tiers *t)
{
	return t->lv[L2].on;
}

/* ---- operators ---------------------------------------------------------------- */

uint64_t kv_tiers_evict(struct kv_tiers *t, int tier, int pool_id)
{
	uint32_t i, n = kv_pools_count(t->ps);
	uint64_t done = 0;

	for (i = 0; i < n; i++) {
		struct kv_pool *p = kv_pool_get(t->ps, i);
		struct tpool *tp2 = t->lv[L2].on ? t->lv[L2].tp[i] : NULL;
		struct tpool *tp3 = t->lv[L3].on ? t->lv[L3].tp[i] : NULL;
		struct kv_list *node;

		if (pool_id >= 0 && (uint32_t)pool_id != i)
			continue;
		if (tier == KV_TIER_G1) {
			if (!t->lv[L2].on) {
				done += kv_pools_evict_all(t->ps, (int)i);
				continue;
			}
			done += demote(t, p->device, p, UINT64_MAX / 2) / p->block_bytes;
			/* What G2 could not take is dropped, as the operator asked. */
			done += kv_pools_evict_all(t->ps, (int)i);
		} else if (tier == KV_TIER_G2 && tp2) {
			while ((node = kv_list_back(&tp2->clean))) {
				drop_g2(t, kv_container_of(node, struct tblock, lru[L2]));
				done++;
			}
			while ((node = kv_list_back(&tp2->lru))) {
				struct tblock *tb = kv_container_of(node, struct tblock, lru[L2]);

				if (tp3 || t->lv[L3].on) {
					tb->evict_g2 = 1;
					if (writeback(t, tb) == 0) {
						done++;
						continue;
					}
					tb->evict_g2 = 0;
				}
				drop_g2(t, tb);
				done++;
			}
		} else if (tier == KV_TIER_G3 && tp3) {
			while ((node = kv_list_back(&tp3->lru))) {
				drop_g3(t, kv_container_of(node, struct tblock, lru[L3]));
				done++;
			}
		}
	}
	if (tier == KV_TIER_G3 && pool_id < 0)
		while (!kv_list_empty(&t->dormant)) {
			struct srun *r = kv_container_of(kv_list_front(&t->dormant), struct srun, link);

			done += r->nused;
			t->lv[L3].st.used -= (uint64_t)r->nused * r->slot_bytes;
			run_release(t, L3, r);
		}
	if (t->lv[L3].on)
		kv_disk_flush(&t->disk);
	return done;
}

uint64_t kv_tiers_flush(struct kv_tiers *t)
{
	uint64_t n = 0;
	uint32_t i;

	if (!t->lv[L3].on)
		return 0;
	for (i = 0; i < kv_pools_count(t->ps); i++) {
		struct tpool *tp = t->lv[L2].tp[i];
		struct kv_list *node;

		while (tp && (node = kv_list_back(&tp->lru)) &&
		       writeback(t, kv_container_of(node, struct tblock, lru[L2])) == 0)
			n++;
	}
	kv_disk_flush(&t->disk);
	return n;
}

int kv_tiers_clean(const struct kv_tiers *t)
{
	return !t->lv[L3].on || (!t->lv[L2].st.dirty && !t->wb_bytes);
}

void kv_tiers_stats(const struct kv_tiers *t, struct kv_tier_stats st[KV_NTIERS])
{
	uint32_t d;
	uint64_t total = 0, free = 0, tot;

	memset(st, 0, sizeof(struct kv_tier_stats) * KV_NTIERS);
	for (d = 0; d < t->be->devices; d++) {
		free += kv_pools_dev_free(t->ps, d, &tot);
		total += tot;
	}
	st[KV_TIER_G1] = t->g1;
	st[KV_TIER_G1].capacity = total;
	st[KV_TIER_G1].used = total - free;
	for (d = 0; d < kv_pools_count(t->ps); d++) {
		const struct kv_pool *p = kv_pool_get(t->ps, d);

		st[KV_TIER_G1].blocks += p->n.writable + p->n.sealed + p->n.cached;
		st[KV_TIER_G1].hits += p->n.hits;
		st[KV_TIER_G1].evictions += p->n.evictions;
	}
	st[KV_TIER_G1].inflight = t->lv[L2].st.inflight;
	if (t->lv[L2].on)
		st[KV_TIER_G2] = t->lv[L2].st;
	if (t->lv[L3].on)
		st[KV_TIER_G3] = t->lv[L3].st;
	if (t->lv[L3].on)
		st[KV_TIER_G3].io_errors += t->jr.errors;
}

uint64_t kv_tiers_entries(const struct kv_tiers *t)
{
	return t->entries;
}

void kv_tiers_count_refs(struct kv_tiers *t)
{
	struct kv_list *pos;
	uint32_t i;

	kv_list_for_each(pos, &t->swaps) {
		struct kv_swap *sw = kv_container_of(pos, struct kv_swap, all);

		if (sw->state == SW_OUT)
			continue;
		for (i = 0; i < sw->n; i++) {
			struct kv_block *b = kv_block_lookup(t->ps, sw->h[i]);

			if (b)
				b->check++;
		}
	}
	for (i = 0; t->lv[L2].on && i < t->lv[L2].pages.npages; i++) {
		struct srun *r = t->lv[L2].pages.owner[i];
		uint32_t s;

		if (!r || r->first_page != i)
			continue;
		for (s = 0; s < r->nslots; s++) {
			struct tblock *tb = r->occ[s];
			struct kv_block *b;

			if (tb && tb != SWAP_SLOT && (tb->busy & BUSY_UP) &&
			    (b = kv_block_lookup(t->ps, tb->dst)))
				b->check++;
		}
	}
}

int kv_tiers_check(struct kv_tiers *t, void (*report)(void *ctx, const char *msg), void *ctx)
{
	uint64_t used[2] = { 0 }, indexed = 0;
	int problems = 0, l;
	char msg[200];

	for (l = 0; l < 2; l++) {
		struct level *L = &t->lv[l];
		uint32_t pg, s;

		for (pg = 0; L->on && pg < L->pages.npages; pg++) {
			struct srun *r = L->pages.owner[pg];
			uint32_t n = 0;

			if (!r || r->first_page != pg)
				continue;
			for (s = 0; s < r->nslots; s++) {
				struct tblock *tb = r->occ[s];

				if (r->dvalid) {
					n += r->dvalid[s];
					continue;
				}
				if (!tb)
					continue;
				n++;
				if (tb == SWAP_SLOT)
					continue;
				if (tb->run[l] != r || tb->slot[l] != s) {
					snprintf(msg, sizeof(msg), "tier G%d: slot %u of the run at page %u "
						 "names a block that is elsewhere", l + 2, s, pg);
					report(ctx, msg);
					problems++;
				}
				/* Count each block once: at its G2 copy, or its G3 copy. */
				if (tb->indexed && (l == L2 || !tb->run[L2]))
					indexed++;
			}
			if (n != r->nused) {
				snprintf(msg, sizeof(msg), "tier G%d: run at page %u: %u slots used, %u "
					 "counted", l + 2, pg, n, r->nused);
				report(ctx, msg);
				problems++;
			}
			used[l] += (uint64_t)n * r->slot_bytes;
		}
		if (L->on && used[l] != L->st.used) {
			snprintf(msg, sizeof(msg), "tier G%d: %llu bytes in used slots, %llu counted",
				 l + 2, (unsigned long long)used[l], (unsigned long long)L->st.used);
			report(ctx, msg);
			problems++;
		}
	}
	if (indexed != t->entries) {
		snprintf(msg, sizeof(msg), "tiers: %llu blocks in the index, %llu counted",
			 (unsigned long long)indexed, (unsigned long long)t->entries);
		report(ctx, msg);
		problems++;
	}
	return problems;
}
