/* Tier pages, runs and slots; tier blocks and their lifecycle; eviction of
 * idle copies to make room. */
#include "tier_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "crc32c.h"
#include "events.h"
#include "log.h"

static uint64_t round4k(uint64_t n)
{
	return (n + 4095) & ~4095ull;
}

/* ---- slots ---------------------------------------------------------------- */

uint8_t *tier_g2_addr(struct kv_tiers *t, const struct srun *r, uint32_t s)
{
	kv_assert(s < r->nslots);
	return t->g2 + (uint64_t)r->first_page * t->page_bytes + (uint64_t)s * r->slot_bytes;
}

uint64_t tier_g3_offset(struct kv_tiers *t, const struct srun *r, uint32_t s)
{
	kv_assert(s < r->nslots);
	return (uint64_t)r->first_page * t->page_bytes + (uint64_t)s * r->slot_bytes;
}

void tier_journal_append(struct kv_tiers *t, int type, const struct srun *r, uint32_t slot,
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

struct tpool *tpool_get_or_create(struct kv_tiers *t, int l, struct kv_pool *p, int swap)
{
	struct level *L = &t->lv[l];
	struct tpool **at = swap && p->qfmt ? &L->sw[p->id] : &L->tp[p->id];
	struct tpool *tp = *at;
	uint64_t slot_bytes =
		HDR_BYTES + round4k(swap ? p->block_bytes : kv_pool_stored_bytes(p));
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
	*at = tp;
	return tp;
}

void kv_tiers_pool_gone(struct kv_tiers *t, struct kv_pool *p)
{
	int l;

	for (l = L2; l <= L3; l++)
		for (int swap = 0; swap < 2; swap++) {
			struct tpool **at = swap ? &t->lv[l].sw[p->id] : &t->lv[l].tp[p->id];
			struct tpool *tp = *at;

			if (!tp)
				continue;
			/* Nothing of p is left, so neither is a run: runs go
			 * with their last slot. */
			kv_assert(tp->pool == p && kv_list_empty(&tp->runs) &&
				  kv_list_empty(&tp->partial) && kv_list_empty(&tp->lru) &&
				  kv_list_empty(&tp->clean));
			free(tp);
			*at = NULL;
		}
	t->layout_id[p->id] = 0;
}

struct srun *srun_new(uint32_t nslots, int dormant)
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

void srun_free(struct srun *r)
{
	free(r->occ);
	free(r->next);
	free(r->dhash);
	free(r->dvalid);
	free(r);
}

/* Builds the free chain over the slots that are not occupied. */
void srun_build_free_chain(struct srun *r)
{
	uint32_t s;

	r->free_head = UINT32_MAX;
	for (s = r->nslots; s-- > 0;)
		if (!r->occ[s]) {
			r->next[s] = r->free_head;
			r->free_head = s;
		}
}

static int tpool_add_run(struct kv_tiers *t, int l, struct tpool *tp)
{
	struct level *L = &t->lv[l];
	struct srun *r;
	int64_t first;
	int fresh;

	if (L->pages.npages - L->pages.nfree + tp->run_pages > L->limit_pages)
		return -ENOSPC;
	r = srun_new(tp->nslots, 0);
	if (!r)
		return -ENOMEM;
	first = kv_pages_alloc(&L->pages, tp->run_pages, 1, r, &fresh, 0);
	if (first < 0) {
		srun_free(r);
		return (int)first;
	}
	r->tp = tp;
	r->first_page = (uint32_t)first;
	r->npages = tp->run_pages;
	r->slot_bytes = (uint32_t)tp->slot_bytes;
	r->layout = t->layout_id[tp->pool->id];
	srun_build_free_chain(r);
	kv_list_push_back(&tp->runs, &r->link);
	kv_list_push_back(&tp->partial, &r->plink);
	if (l == L3)
		tier_journal_append(t, KV_J_RUN, r, 0, NULL);
	return 0;
}

void srun_release(struct kv_tiers *t, int l, struct srun *r)
{
	/* Only a dormant run goes with slots in use: they were counted as
	 * used when it was replayed. */
	kv_assert(!r->nused || (l == L3 && !r->tp));
	t->lv[l].st.used -= (uint64_t)r->nused * r->slot_bytes;
	if (l == L3)
		tier_journal_append(t, KV_J_RUN_FREE, r, 0, NULL);
	kv_list_del(&r->link);
	if (kv_list_linked(&r->plink))
		kv_list_del(&r->plink);
	kv_pages_free(&t->lv[l].pages, r->first_page, r->npages);
	srun_free(r);
}

/* Charges (d = 1) or gives back (d = -1) one slot of run r (of a pool) to
 * the pool's namespace's usage of tier l. */
void slot_charge(struct kv_tiers *t, int l, const struct srun *r, int d)
{
	kv_assert(r->tp);
	kv_ns_charge(kv_pools_nstab(t->ps), r->tp->pool->ns, l + 1,
		     (int64_t)d * (int64_t)r->slot_bytes);
}

static uint32_t slot_take(struct kv_tiers *t, int l, struct srun *r, struct tblock *occ)
{
	uint32_t s = r->free_head;

	kv_assert(r->nused < r->nslots && s < r->nslots && !r->occ[s] && occ);
	slot_charge(t, l, r, 1);
	r->free_head = r->next[s];
	r->occ[s] = occ;
	if (++r->nused == r->nslots)
		kv_list_del(&r->plink);
	t->lv[l].st.used += r->slot_bytes;
	return s;
}

void slot_put(struct kv_tiers *t, int l, struct srun *r, uint32_t s)
{
	kv_assert(s < r->nslots && r->occ[s] && r->nused > 0 && !r->dvalid);
	kv_assert(t->lv[l].st.used >= r->slot_bytes);
	slot_charge(t, l, r, -1);
	r->occ[s] = NULL;
	r->next[s] = r->free_head;
	r->free_head = s;
	t->lv[l].st.used -= r->slot_bytes;
	if (r->nused-- == r->nslots && r->tp)
		kv_list_push_back(&r->tp->partial, &r->plink);
	if (!r->nused)
		srun_release(t, l, r);
}

/* ---- tier blocks ---------------------------------------------------------- */

void g2_dirty_add(struct kv_tiers *t, const struct tblock *tb, int d)
{
	kv_assert(tb->run[L2] && (d > 0 || t->lv[L2].st.dirty > 0));
	t->lv[L2].st.dirty += (uint64_t)(int64_t)d;
	t->dirty_bytes += (uint64_t)((int64_t)d * (int64_t)tb->run[L2]->slot_bytes);
}

static void tb_unlist(struct tblock *tb)
{
	for (int l = L2; l <= L3; l++)
		if (kv_list_linked(&tb->lru[l])) {
			kv_list_del(&tb->lru[l]);
			kv_list_del(&tb->all[l]);
		}
}

static unsigned tb_media(const struct tblock *tb)
{
	unsigned m = 0;

	if (!tb->indexed || tb->dead)
		return 0;
	if (tb->run[L2] && !(tb->busy & (BUSY_DOWN | BUSY_READ)))
		m |= 1u << KV_MEDIUM_G2;
	if (tb->g3_ok)
		m |= 1u << KV_MEDIUM_G3;
	return m;
}

void tb_ev_sync(struct kv_tiers *t, struct tblock *tb)
{
	struct kv_events *ev = kv_pools_events(t->ps);
	unsigned now = tb_media(tb), m;

	for (m = KV_MEDIUM_G2; m <= KV_MEDIUM_G3; m++) {
		unsigned bit = 1u << m;

		if ((now & bit) && !(tb->ev & bit))
			kv_events_stored(ev, tb->pool->id, tb->ix.hash, NULL, (int)m, NULL);
		else if (!(now & bit) && (tb->ev & bit))
			kv_events_removed(ev, tb->pool->id, tb->ix.hash, (int)m);
	}
	tb->ev = (uint8_t)now;
}

unsigned kv_tiers_entry_media(const struct kv_index_entry *e)
{
	if (e->kind == KV_ENTRY_BLOCK)
		return 1u << KV_MEDIUM_G1;
	return tb_media(kv_container_of(e, const struct tblock, ix));
}

/* Puts an idle tb on the lists its copies belong to. */
void tb_set_idle(struct kv_tiers *t, struct tblock *tb)
{
	kv_assert(!tb->busy && !tb->dead);
	tb_unlist(tb);
	tb->tick = ++t->tick;
	if (tb->run[L2]) {
		kv_list_push_front(tb->g3_ok ? &tb->run[L2]->tp->clean : &tb->run[L2]->tp->lru,
				   &tb->lru[L2]);
		kv_list_push_front(tb->g3_ok ? &t->lv[L2].clean : &t->lv[L2].lru, &tb->all[L2]);
	}
	if (tb->run[L3] && tb->g3_ok) {
		kv_list_push_front(&tb->run[L3]->tp->lru, &tb->lru[L3]);
		kv_list_push_front(&t->lv[L3].lru, &tb->all[L3]);
	}
	tb_assert_state(tb);
	tb_ev_sync(t, tb);
}

void tb_free(struct kv_tiers *t, struct tblock *tb)
{
	kv_assert(!tb->busy && !tb->indexed && kv_list_empty(&tb->waiters));
	tb_unlist(tb);
	if (tb->run[L2]) {
		kv_assert(t->lv[L2].st.blocks > 0);
		t->lv[L2].st.blocks--;
		if (!tb->g3_ok)
			g2_dirty_add(t, tb, -1);
		slot_put(t, L2, tb->run[L2], tb->slot[L2]);
	}
	if (tb->run[L3]) {
		if (tb->g3_ok) {
			kv_assert(t->lv[L3].st.blocks > 0);
			t->lv[L3].st.blocks--;
			tier_journal_append(t, KV_J_SLOT_FREE, tb->run[L3], tb->slot[L3], NULL);
		}
		slot_put(t, L3, tb->run[L3], tb->slot[L3]);
	}
	tb_dealloc(tb);
}

void tb_dealloc(struct tblock *tb)
{
	free(tb->g4_buf);
	kv_pool_put(tb->pool);
	free(tb);
}

/* Takes tb out of the index; frees it now or when its I/O is done. */
void tb_kill(struct kv_tiers *t, struct tblock *tb)
{
	if (tb->indexed) {
		kv_assert(t->entries > 0);
		kv_index_remove(kv_pools_index(t->ps), &tb->ix);
		tb->indexed = 0;
		t->entries--;
	}
	tb->dead = 1;
	tb_ev_sync(t, tb);
	if (!tb->busy)
		tb_free(t, tb);
}

void kv_tiers_forget(struct kv_tiers *t, struct kv_pool *p, const uint8_t *hash)
{
	struct kv_index_entry *e;

	if (!t->entries)
		return;  /* no tier block anywhere: spare the seal a second lookup */
	e = kv_pool_find_entry(p, hash);
	if (e && e->kind == KV_ENTRY_TIER)
		kv_tiers_forget_entry(t, e);
}

int kv_tiers_entry_tier(const struct kv_index_entry *e)
{
	const struct tblock *tb = kv_container_of(e, const struct tblock, ix);

	kv_assert(e->kind == KV_ENTRY_TIER);
	return !tb->run[L2] ? 2 : tb->from_g4 ? 3 : 1;
}

void kv_tiers_forget_entry(struct kv_tiers *t, struct kv_index_entry *e)
{
	kv_assert(e->kind == KV_ENTRY_TIER);
	tb_kill(t, kv_container_of(e, struct tblock, ix));
}

void tb_busy_set(struct tblock *tb, int flag)
{
	kv_assert(flag && !(tb->busy & flag) && !tb->dead);
	tb_unlist(tb);
	tb->busy |= (uint8_t)flag;
	tb_assert_state(tb);
}

void tb_busy_clear(struct kv_tiers *t, struct tblock *tb, int flag)
{
	kv_assert((tb->busy & flag) == flag);
	tb->busy &= (uint8_t)~flag;
	if (tb->busy)
		return;
	if (tb->dead)
		tb_free(t, tb);
	else
		tb_set_idle(t, tb);
}

struct tblock *tb_new(struct kv_tiers *t, struct kv_pool *p, const uint8_t *hash,
		     uint64_t born_ms)
{
	struct tblock *tb = calloc(1, sizeof(*tb));

	if (!tb)
		return NULL;
	tb->t = t;
	tb->pool = p;
	kv_pool_hold(p);
	tb->ix.pool = p->id;
	tb->ix.kind = KV_ENTRY_TIER;
	tb->ix.born_ms = born_ms;
	memcpy(tb->ix.hash, hash, KV_HASH_BYTES);
	kv_list_init(&tb->lru[L2]);
	kv_list_init(&tb->lru[L3]);
	kv_list_init(&tb->all[L2]);
	kv_list_init(&tb->all[L3]);
	kv_list_init(&tb->waiters);
	return tb;
}

void tb_index(struct kv_tiers *t, struct tblock *tb)
{
	kv_assert(!tb->indexed && !tb->dead && !kv_pool_find_entry(tb->pool, tb->ix.hash));
	kv_index_insert(kv_pools_index(t->ps), &tb->ix);
	tb->indexed = 1;
	t->entries++;
	tb_ev_sync(t, tb);
}

const char *tb_state_problem(const struct tblock *tb)
{
	int idle = !tb->busy && !tb->dead, l;

	if (tb->indexed + tb->dead + !!(tb->busy & BUSY_DOWN) + !!(tb->busy & BUSY_FETCH) != 1)
		return "tblock: not exactly one of indexed, dead, being demoted, being fetched";
	for (l = L2; l <= L3; l++)
		if (tb->run[l] && (tb->slot[l] >= tb->run[l]->nslots ||
				   tb->run[l]->occ[tb->slot[l]] != tb))
			return "tblock: its slot names another occupant";
	if (tb->g3_ok && !tb->run[L3])
		return "tblock: g3_ok without a G3 slot";
	if ((tb->busy & BUSY_DOWN) && (tb->busy != BUSY_DOWN || !tb->run[L2] || tb->run[L3]))
		return "tblock: being demoted, but busy otherwise or not with a G2 slot only";
	if ((tb->busy & BUSY_FETCH) && (tb->busy != BUSY_FETCH || !tb->run[L2] || tb->run[L3]))
		return "tblock: being fetched, but busy otherwise or not with a G2 slot only";
	if ((tb->busy & BUSY_WB) && (!tb->run[L2] || !tb->run[L3] || tb->g3_ok))
		return "tblock: written back without a G2 copy and an unwritten G3 slot";
	if ((tb->busy & BUSY_READ) &&
	    (!tb->run[L2] || !tb->run[L3] || !tb->g3_ok || (tb->busy & BUSY_WB)))
		return "tblock: read from G3 without a G3 copy and a G2 slot to read into";
	if ((tb->busy & BUSY_UP) && !tb->run[L2])
		return "tblock: promoted without a G2 copy";
	if ((tb->busy & BUSY_G4) && !tb->run[L2])
		return "tblock: copied into a G4 value without a G2 copy";
	if (idle && !tb->run[L2] && !tb->run[L3])
		return "tblock: idle without a copy";
	if (idle && tb->run[L3] && !tb->g3_ok)
		return "tblock: idle with an unwritten G3 slot";
	if (kv_list_linked(&tb->lru[L2]) != (idle && tb->run[L2]) ||
	    kv_list_linked(&tb->lru[L3]) != (idle && tb->run[L3]))
		return "tblock: on an LRU list while busy, or idle and on none";
	if (kv_list_linked(&tb->all[L2]) != kv_list_linked(&tb->lru[L2]) ||
	    kv_list_linked(&tb->all[L3]) != kv_list_linked(&tb->lru[L3]))
		return "tblock: on its pool's LRU and not its level's, or the reverse";
	if (!kv_list_empty(&tb->waiters) && !(tb->busy & (BUSY_READ | BUSY_UP)))
		return "tblock: lookups wait on it with no promotion under way";
	if (tb->failed && !(tb->busy & BUSY_WAKE))
		return "tblock: failed outside its waiters' wake-up";
	return NULL;
}

/* Drops tb's G2 copy (tb idle). Without a G3 copy the block is gone. */
void tb_drop_g2(struct kv_tiers *t, struct tblock *tb)
{
	kv_assert(!tb->busy && !tb->dead && tb->run[L2] && t->lv[L2].st.blocks > 0);
	/* A copy nowhere else (no G3, or a quota dropping a dirty one) goes to
	 * G4 first, when its namespace has it. */
	if (!tb->g3_ok && t->g2_dropping)
		t->g2_dropping(t, tb);
	tb_unlist(tb);
	t->lv[L2].st.blocks--;
	if (!tb->g3_ok)
		g2_dirty_add(t, tb, -1);
	slot_put(t, L2, tb->run[L2], tb->slot[L2]);
	tb->run[L2] = NULL;
	t->lv[L2].st.evictions++;
	if (!tb->run[L3])
		tb_kill(t, tb);
	else
		tb_set_idle(t, tb);
}

/* Drops tb's G3 copy (tb idle). */
void tb_drop_g3(struct kv_tiers *t, struct tblock *tb)
{
	kv_assert(!tb->busy && !tb->dead && tb->run[L3] && tb->g3_ok && t->lv[L3].st.blocks > 0);
	tb_unlist(tb);
	t->lv[L3].st.blocks--;
	tier_journal_append(t, KV_J_SLOT_FREE, tb->run[L3], tb->slot[L3], NULL);
	slot_put(t, L3, tb->run[L3], tb->slot[L3]);
	tb->run[L3] = NULL;
	tb->g3_ok = 0;
	t->lv[L3].st.evictions++;
	if (!tb->run[L2]) {
		tb_kill(t, tb);
	} else {
		g2_dirty_add(t, tb, 1);
		tb_set_idle(t, tb);
	}
}

struct tblock *tier_oldest_idle(struct kv_tiers *t, int l, int clean)
{
	struct kv_list *n = kv_list_back(clean ? &t->lv[l].clean : &t->lv[l].lru);

	return n ? kv_container_of(n, struct tblock, all[l]) : NULL;
}

/* Frees one idle copy in tier l, own pool first, then the oldest of any
 * pool. In G2 clean copies go first; a dirty one only when there is no G3 to
 * write it to (with G3 the caller waits for write-back instead of dropping
 * what could be kept), and never with clean_only. Returns how many it freed:
 * 1, or 0 when none can go. */
static int slot_evict_one(struct kv_tiers *t, int l, struct tpool *own, int clean_only)
{
	struct tblock *victim = NULL;
	struct kv_list *n;

	if (l == L3 && !kv_list_empty(&t->dormant)) {
		struct srun *r = kv_container_of(kv_list_front(&t->dormant), struct srun, link);

		srun_release(t, L3, r);
		return 1;
	}
	/* Clean G2 copies cost nothing to drop: all of them go before any
	 * dirty one. */
	if (l == L2) {
		if (own && (n = kv_list_back(&own->clean)))
			victim = kv_container_of(n, struct tblock, lru[L2]);
		else
			victim = tier_oldest_idle(t, L2, 1);
		if (!victim && (t->lv[L3].on || clean_only))
			return 0;
	}
	if (!victim && own && (n = kv_list_back(&own->lru)))
		victim = kv_container_of(n, struct tblock, lru[l]);
	/* A G3 copy that G2 holds too is not dropped for room in G3: its
	 * block would be dirty again, and writing it back would drop another
	 * (a write-back undone for each one done, for ever). */
	if (!victim || (l == L3 && victim->run[L2]))
		victim = tier_oldest_idle(t, l, 0);
	if (!victim || (l == L3 && victim->run[L2]))
		return 0;
	if (l == L2)
		tb_drop_g2(t, victim);
	else
		tb_drop_g3(t, victim);
	return 1;
}

/* The oldest idle copy in tier l of namespace ns (G2: clean ones first), or
 * NULL. */
static struct tblock *ns_oldest_idle(struct kv_tiers *t, int l, uint32_t ns)
{
	struct tblock *victim = NULL;
	int clean;

	for (clean = l == L2; clean >= 0 && !victim; clean--) {
		for (uint32_t i = 0; i < kv_pools_count(t->ps); i++) {
			struct tpool *tp = t->lv[l].tp[i];
			struct kv_list *n;
			struct tblock *b;

			if (!tp || tp->pool->ns != ns ||
			    !(n = kv_list_back(clean ? &tp->clean : &tp->lru)))
				continue;
			b = kv_container_of(n, struct tblock, lru[l]);
			if (!victim || b->tick < victim->tick)
				victim = b;
		}
	}
	return victim;
}

/* slot_alloc_()'s clean_only: 0 (any idle copy may go), 1 (only copies G3
 * holds too), or ALLOC_FREE (none: free room only). */
#define ALLOC_FREE 2

/* Room under the quota of tp's namespace in tier l for one more slot: its
 * own idle copies go, oldest first, in G3 only those G2 does not hold, in G2
 * with clean_only only those G3 holds too, with ALLOC_FREE none. Returns 0
 * or -EDQUOT. */
static int slot_quota_room(struct kv_tiers *t, int l, struct tpool *tp, int clean_only)
{
	struct kv_ns *m = kv_ns_get(kv_pools_nstab(t->ps), tp->pool->ns);
	uint64_t q = m->lim.quota[l + 1];

	if (clean_only == ALLOC_FREE)  /* drops nothing; not a refusal either */
		return q && m->used[l + 1] + tp->slot_bytes > q ? -EDQUOT : 0;
	while (q && m->used[l + 1] + tp->slot_bytes > q) {
		struct tblock *v = ns_oldest_idle(t, l, tp->pool->ns);

		/* Not a G3 copy that G2 holds too (slot_evict_one()): the
		 * caller's write-back would only make that block dirty again. */
		if (!v || (l == L3 && v->run[L2]) || (l == L2 && clean_only && !v->g3_ok)) {
			m->quota_refusals++;
			return -EDQUOT;
		}
		if (l == L2)
			tb_drop_g2(t, v);
		else
			tb_drop_g3(t, v);
	}
	return 0;
}

/* A free slot of tier l for pool p: a partial run, a new run, or (not with
 * ALLOC_FREE) by evicting idle copies; within the quota of p's namespace in
 * tier l, by dropping its own copies. Returns 0 with *run and *slot,
 * -EDQUOT or -ENOSPC. */
static int slot_alloc_(struct kv_tiers *t, int l, struct kv_pool *p, struct tblock *occ,
		       struct srun **run, uint16_t *slot, int clean_only)
{
	struct tpool *tp = tpool_get_or_create(t, l, p, occ == SWAP_SLOT);
	unsigned tries;
	int rc;

	if (!tp)
		return -ENOSPC;
	if ((rc = slot_quota_room(t, l, tp, clean_only)) < 0)
		return rc;
	for (tries = 0; tries < 4 * tp->nslots + 64; tries++) {
		if (!kv_list_empty(&tp->partial)) {
			struct srun *r = kv_container_of(kv_list_front(&tp->partial), struct srun,
							 plink);

			*run = r;
			*slot = (uint16_t)slot_take(t, l, r, occ);
			return 0;
		}
		if (tpool_add_run(t, l, tp) == 0)
			continue;
		if (clean_only == ALLOC_FREE || !slot_evict_one(t, l, tp, clean_only))
			break;
	}
	return -ENOSPC;
}

int slot_alloc(struct kv_tiers *t, int l, struct kv_pool *p, struct tblock *occ,
	       struct srun **run, uint16_t *slot)
{
	return slot_alloc_(t, l, p, occ, run, slot, 0);
}

int slot_alloc_clean(struct kv_tiers *t, struct kv_pool *p, struct tblock *occ,
		     struct srun **run, uint16_t *slot)
{
	return slot_alloc_(t, L2, p, occ, run, slot, 1);
}

int slot_alloc_free(struct kv_tiers *t, struct kv_pool *p, struct tblock *occ,
		    struct srun **run, uint16_t *slot)
{
	return slot_alloc_(t, L2, p, occ, run, slot, ALLOC_FREE);
}

uint64_t slot_hdr_ns(struct kv_tiers *t, const struct kv_pool *p)
{
	const char *ns = kv_pools_ns_name(t->ps, p->ns);

	return XXH3_64bits(ns, strlen(ns));
}

void slot_hdr_fill(struct kv_tiers *t, struct tblock *tb, struct slot_hdr *h, uint32_t crc)
{
	memset(h, 0, sizeof(*h));
	h->magic = SLOT_MAGIC;
	h->version = SLOT_VERSION;
	h->ns = slot_hdr_ns(t, tb->pool);
	h->layout = t->layout_id[tb->pool->id];
	memcpy(h->hash, tb->ix.hash, KV_HASH_BYTES);
	h->payload_len = kv_pool_stored_bytes(tb->pool);
	h->flags = tb->pool->qfmt;
	slot_hdr_seal(h, crc);
}

void slot_hdr_seal(struct slot_hdr *h, uint32_t crc)
{
	h->payload_crc = crc;
	h->hdr_crc = 0;
	h->hdr_crc = kv_crc32c(0, h, sizeof(*h));
}
