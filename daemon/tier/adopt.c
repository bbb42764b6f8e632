/* Warm restart: the G3 journal, its compaction and replay, and the adoption
 * of the runs a previous daemon left by the pools that register again. */
#include "tier_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "log.h"

/* ---- the journal: compaction and replay ----------------------------------- */

/* Whether slot s of run r has a block written on disk (a replayed run: as
 * the journal said). */
static int slot_live(const struct srun *r, uint32_t s)
{
	const struct tblock *tb = r->occ[s];

	return r->dvalid ? r->dvalid[s]
			 : tb && tb != SWAP_SLOT && tb->g3_ok && tb->run[L3] == r;
}

struct jiter {
	struct srun **runs;
	size_t n, i;
	uint32_t slot;
	int run_done;
};

static int journal_compact_next(void *ctx, struct kv_jrec *rec)
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
			if (slot_live(r, s)) {
				rec->type = KV_J_SLOT;
				rec->slot = (uint16_t)s;
				memcpy(rec->hash, r->dvalid ? r->dhash[s] : r->occ[s]->ix.hash,
				       KV_HASH_BYTES);
				return 1;
			}
		}
		it->i++;
		it->run_done = 0;
	}
	return 0;
}

void tier_journal_compact(struct kv_tiers *t)
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
	r = kv_journal_rewrite(&t->jr, journal_compact_next, &it);
	if (r < 0)
		kv_warn("disk tier: cannot rewrite the index journal %s: %s", t->jr.path,
			strerror(-r));
	else
		t->jlive = t->jr.records;
	free(it.runs);
}

/* Adds run r's records (the run, then each live slot) to the compaction
 * under way; returns how many. */
static unsigned compact_run(struct kv_tiers *t, const struct srun *r)
{
	struct kv_jrec rec = { .type = KV_J_RUN, .page = r->first_page, .npages = r->npages,
			       .slot_bytes = r->slot_bytes, .nslots = r->nslots,
			       .layout = r->layout };
	unsigned n = 1;
	uint32_t s;

	kv_journal_compact_add(&t->jr, &rec);
	for (s = 0; s < r->nslots; s++) {
		if (!slot_live(r, s))
			continue;
		rec = (struct kv_jrec){ .type = KV_J_SLOT, .page = r->first_page,
					.slot = (uint16_t)s };
		memcpy(rec.hash, r->dvalid ? r->dhash[s] : r->occ[s]->ix.hash, KV_HASH_BYTES);
		kv_journal_compact_add(&t->jr, &rec);
		n++;
	}
	return n;
}

/* At most this many records, and this many pages looked at, per step: a
 * step costs the loop tens of microseconds whatever the disk's size. */
#define STEP_RECORDS 2048
#define STEP_PAGES 32768

void tier_journal_step(struct kv_tiers *t)
{
	struct level *L = &t->lv[L3];
	unsigned recs = 0, pages = 0;

	if (!t->jr.w)
		return;
	if (!t->jactive) {
		/* When the file has grown to twice what it holds, or a Flush waits
		 * on a journal that lost a record (kv_tiers_durable()). */
		int repair = t->flushing && kv_journal_behind(&t->jr) &&
			     !kv_journal_compacting(&t->jr) && !tier_io_held(t, BO_DISK);

		if ((!repair && t->jr.records <= 2 * t->jlive + 16384) ||
		    kv_journal_compact_begin(&t->jr) < 0)
			return;
		t->jactive = 1;
		t->jpage = 0;
	}
	/* Each run whole in one step, in page order: a run changed after its
	 * step has its change in an append the new file gets after it. */
	for (; t->jpage < L->pages.npages && recs < STEP_RECORDS && pages < STEP_PAGES;
	     t->jpage++, pages++) {
		struct srun *run = L->pages.owner[t->jpage];

		if (run && run->first_page == t->jpage)
			recs += compact_run(t, run);
	}
	kv_journal_compact_push(&t->jr);
	if (t->jpage == L->pages.npages) {
		kv_journal_compact_end(&t->jr);
		t->jactive = 0;
	}
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
		r = srun_new(rec->nslots, 1);
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

int tier_g3_open(struct kv_tiers *t, char *err, size_t errlen)
{
	const struct kv_tiers_config *cfg = &t->cfg;
	struct replay rp = { .t = t };
	char jpath[sizeof(cfg->disk_index) + 8];
	uint64_t blocks;
	int r;

	if (cfg->disk_bytes < t->page_bytes) {
		snprintf(err, errlen, "disk_size %llu is less than one page (%llu bytes)",
			 (unsigned long long)cfg->disk_bytes, (unsigned long long)t->page_bytes);
		return -EINVAL;
	}
	r = kv_disk_open(&t->disk, cfg->disk_path, cfg->disk_bytes, cfg->queue_depth, t->g2,
			 t->g2_bytes, t->lv[L2].pages.segment_bytes, err, errlen);
	if (r < 0)
		return r;
	if (!t->disk.direct)
		kv_warn("disk tier: %s does not support O_DIRECT; using the page cache",
			cfg->disk_path);
	r = tier_level_init(t, L3, t->disk.bytes);
	if (r < 0) {
		snprintf(err, errlen, "disk tier: %s", strerror(-r));
		return r;
	}
	rp.npages = t->lv[L3].pages.npages;
	rp.at = calloc(rp.npages, sizeof(*rp.at));
	if (!rp.at) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	if (cfg->disk_index[0])
		snprintf(jpath, sizeof(jpath), "%s", cfg->disk_index);
	else
		snprintf(jpath, sizeof(jpath), "%s.idx", cfg->disk_path);
	r = kv_journal_open(&t->jr, jpath, t->page_bytes, t->lv[L3].st.capacity, replay_rec, &rp,
			    err, errlen);
	if (r < 0) {
		free(rp.at);
		return r;
	}
	blocks = replay_finish(t, &rp);
	free(rp.at);
	tier_journal_compact(t);
	/* From now on the journal's writes and the blocks' checksums happen
	 * on the worker thread; without one (it could not start), here. */
	r = kv_worker_start(&t->wk, t->disk.efd);
	if (r < 0)
		kv_warn("disk tier: no worker thread (%s): checksums and the index journal's "
			"writes happen on the event loop", strerror(-r));
	else
		kv_journal_attach(&t->jr, &t->wk);
	kv_info("disk tier: %s, %llu MiB%s, index %s: %llu blocks from before", cfg->disk_path,
		(unsigned long long)(t->lv[L3].st.capacity >> 20),
		t->disk.direct ? ", O_DIRECT" : "", jpath, (unsigned long long)blocks);
	return 0;
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
	/* A compressed pool's copies are another format: another layout (an
	 * uncompressed pool's id is what it was before compression existed, so
	 * its old G3 slots and G4 values are still found). */
	if (p->qfmt)
		XXH3_64bits_update(st, &p->qfmt, sizeof(p->qfmt));
	t->layout_id[p->id] = XXH3_64bits_digest(st);
	XXH3_freeState(st);
	if (!t->lv[L3].on || kv_list_empty(&t->dormant) || !(tp = tpool_get_or_create(t, L3, p, 0)))
		return;
	kv_list_for_each_safe(pos, tmp, &t->dormant) {
		struct srun *r = kv_container_of(pos, struct srun, link);
		uint32_t s;

		if (r->layout != t->layout_id[p->id] || r->slot_bytes != tp->slot_bytes ||
		    r->nslots != tp->nslots || r->npages != tp->run_pages)
			continue;
		kv_list_del(&r->link);
		r->tp = tp;
		kv_list_push_back(&tp->runs, &r->link);
		for (s = 0; s < r->nslots; s++) {
			struct tblock *tb;

			if (!r->dvalid[s])
				continue;
			if (kv_pool_find_entry(p, r->dhash[s]) || !(tb = tb_new(t, p, r->dhash[s], kv_mono_ms()))) {
				r->dvalid[s] = 0;
				r->nused--;
				t->lv[L3].st.used -= r->slot_bytes;
				continue;
			}
			tb->run[L3] = r;
			tb->slot[L3] = (uint16_t)s;
			tb->g3_ok = 1;
			r->occ[s] = tb;
			slot_charge(t, L3, r, 1);
			tb_index(t, tb);
			tb_set_idle(t, tb);
			t->lv[L3].st.blocks++;
			adopted++;
		}
		free(r->dhash);
		free(r->dvalid);
		r->dhash = NULL;
		r->dvalid = NULL;
		srun_build_free_chain(r);
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
