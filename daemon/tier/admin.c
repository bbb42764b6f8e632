/* What operators ask of the tiers: evict, flush, stats, the invariant check. */
#include "tier_int.h"

#include <stdio.h>
#include <string.h>

uint64_t kv_tiers_evict(struct kv_tiers *t, int tier, int pool_id)
{
	uint32_t i, n = kv_pools_end(t->ps);
	uint64_t done = 0;

	for (i = 0; i < n; i++) {
		struct kv_pool *p = kv_pool_get(t->ps, i);
		struct tpool *tp2 = t->lv[L2].on ? t->lv[L2].tp[i] : NULL;
		struct tpool *tp3 = t->lv[L3].on ? t->lv[L3].tp[i] : NULL;
		struct kv_list *node;

		if (!p || (pool_id >= 0 && (uint32_t)pool_id != i))
			continue;
		if (tier == KV_TIER_G1) {
			if (!t->lv[L2].on) {
				done += kv_pools_evict_all(t->ps, (int)i);
				continue;
			}
			done += tier_demote(t, p->device, p, UINT64_MAX / 2) / p->block_bytes;
			/* What G2 could not take is dropped, as the operator asked. */
			done += kv_pools_evict_all(t->ps, (int)i);
		} else if (tier == KV_TIER_G2 && tp2) {
			while ((node = kv_list_back(&tp2->clean))) {
				tb_drop_g2(t, kv_container_of(node, struct tblock, lru[L2]));
				done++;
			}
			while ((node = kv_list_back(&tp2->lru))) {
				struct tblock *tb = kv_container_of(node, struct tblock, lru[L2]);

				if (tp3 || t->lv[L3].on) {
					tb->evict_g2 = 1;
					if (tier_writeback_start(t, tb) == 0) {
						done++;
						continue;
					}
					tb->evict_g2 = 0;
				}
				tb_drop_g2(t, tb);
				done++;
			}
		} else if (tier == KV_TIER_G3 && tp3) {
			while ((node = kv_list_back(&tp3->lru))) {
				tb_drop_g3(t, kv_container_of(node, struct tblock, lru[L3]));
				done++;
			}
		}
	}
	if (tier == KV_TIER_G3 && pool_id < 0)
		while (!kv_list_empty(&t->dormant)) {
			struct srun *r = kv_container_of(kv_list_front(&t->dormant), struct srun, link);

			done += r->nused;
			srun_release(t, L3, r);
		}
	if (t->lv[L3].on)
		kv_disk_flush(&t->disk);
	return done;
}

/* Starts writing back every idle dirty G2 copy; returns how many. */
static uint64_t flush_dirty(struct kv_tiers *t)
{
	uint64_t n = 0;
	uint32_t i;

	for (i = 0; i < kv_pools_end(t->ps); i++) {
		struct tpool *tp = t->lv[L2].tp[i];
		struct kv_list *node;

		while (tp && (node = kv_list_back(&tp->lru)) &&
		       tier_writeback_start(t, kv_container_of(node, struct tblock, lru[L2])) == 0)
			n++;
	}
	return n;
}

uint64_t kv_tiers_flush(struct kv_tiers *t)
{
	uint64_t n = 0;
	uint32_t i;

	if (!t->lv[L3].on) {
		/* No disk: what G2 holds that G4 lacks goes there. */
		for (i = 0; t->g4 && i < kv_pools_end(t->ps); i++) {
			struct tpool *tp = t->lv[L2].tp[i];
			struct kv_list *node;

			if (tp)
				kv_list_for_each(node, &tp->lru)
					n += (uint64_t)tier_remote_put(
						t, kv_container_of(node, struct tblock, lru[L2]),
						KV_G4W_WRITEBACK);
		}
		return n;
	}
	/* A barrier: what demotions in flight bring into G2 is written back
	 * too, as it lands (tier_flush_step()), until kv_tiers_durable(). */
	t->flushing = 1;
	n = flush_dirty(t);
	kv_disk_flush(&t->disk);
	return n;
}

void tier_flush_step(struct kv_tiers *t)
{
	if (!t->flushing)
		return;
	if (!tier_io_held(t, BO_DISK))
		flush_dirty(t);
	if (kv_tiers_durable(t))
		t->flushing = 0;
}

int kv_tiers_clean(const struct kv_tiers *t)
{
	return !t->lv[L3].on || (!t->lv[L2].st.dirty && !t->wb_bytes);
}

int kv_tiers_durable(const struct kv_tiers *t)
{
	uint32_t d;

	if (!kv_tiers_clean(t))
		return 0;
	if (!t->lv[L3].on)
		return 1;
	for (d = 0; d < t->be->devices; d++)
		if (t->down_bytes[d])
			return 0;   /* demotions land in G2 dirty */
	/* Every record written, and none lost since the last compaction that
	 * committed began (a lost one: tier_journal_step() compacts again). */
	return !kv_journal_pending(&t->jr) && !kv_journal_behind(&t->jr);
}

int kv_tiers_disk_busy(const struct kv_tiers *t)
{
	return t->lv[L3].on && t->lv[L3].st.inflight;
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
	for (d = 0; d < kv_pools_end(t->ps); d++) {
		const struct kv_pool *p = kv_pool_get(t->ps, d);

		if (!p)
			continue;
		st[KV_TIER_G1].blocks += p->n.writable + p->n.sealed + p->n.cached;
		st[KV_TIER_G1].hits += p->n.hits;
		st[KV_TIER_G1].evictions += p->n.evictions;
	}
	st[KV_TIER_G1].inflight = t->lv[L2].st.inflight;
	if (t->lv[L2].on) {
		st[KV_TIER_G2] = t->lv[L2].st;
		/* and the G2 copies being copied out into G4 values (BUSY_G4) */
		st[KV_TIER_G2].inflight += tier_remote_held(t);
	}
	if (t->lv[L3].on)
		st[KV_TIER_G3] = t->lv[L3].st;
	st[KV_TIER_G2].backoffs = t->bo[BO_COPY].total;
	/* From a failed round to the next success, the retries between the
	 * rounds included: the gauge does not blink while a retry is in flight. */
	st[KV_TIER_G2].backing_off = t->bo[BO_COPY].rounds != 0;
	if (t->lv[L3].on) {
		st[KV_TIER_G3].backoffs = t->bo[BO_DISK].total;
		st[KV_TIER_G3].backing_off = t->bo[BO_DISK].rounds != 0;
	}
	if (t->lv[L3].on) {
		st[KV_TIER_G3].io_errors += t->jr.errors;
		st[KV_TIER_G3].queued = t->disk.nqueued;
		/* The index records of what was written are G3's too: until
		 * they are in the journal file a kill -9 loses those blocks. */
		st[KV_TIER_G3].inflight += kv_journal_pending(&t->jr);
	}
	/* Compressed copies: the slots of the compressed pools' tpools (their
	 * swaps have tpools of their own), counted here, off the hot paths. */
	for (int l = L2; l <= L3; l++)
		for (d = 0; t->lv[l].on && d < kv_pools_end(t->ps); d++) {
			const struct tpool *tp = t->lv[l].tp[d];
			const struct kv_list *n;
			uint64_t used = 0, q;

			if (!tp || !tp->pool->qfmt)
				continue;
			kv_list_for_each(n, &tp->runs)
				used += kv_container_of(n, const struct srun, link)->nused;
			q = kv_pool_stored_bytes(tp->pool);
			st[KV_TIER_G2 + l].comp_bytes += used * q;
			st[KV_TIER_G2 + l].comp_saved += used * (tp->pool->block_bytes - q);
		}
}

const struct kv_hist *kv_tiers_hist(const struct kv_tiers *t, int which)
{
	return &t->hist[which];
}

uint64_t kv_tiers_entries(const struct kv_tiers *t)
{
	return t->entries;
}

/* Adds each tier block's hold on its pool to the pool's check_holds: every
 * tier block has a slot (one with none is freed), so each is found once, at
 * its G2 slot or, without one, its G3 slot; and each G4 fetch's. */
static void tier_count_holds(struct kv_tiers *t)
{
	int l;

	for (l = L2; l <= L3; l++) {
		struct level *L = &t->lv[l];
		uint32_t pg, s;

		for (pg = 0; L->on && pg < L->pages.npages; pg++) {
			struct srun *r = L->pages.owner[pg];

			if (!r || r->first_page != pg || r->dvalid)
				continue;
			for (s = 0; s < r->nslots; s++) {
				struct tblock *tb = r->occ[s];

				if (tb && tb != SWAP_SLOT && (l == L2 || !tb->run[L2]))
					tb->pool->check_holds++;
			}
		}
	}
	tier_remote_count_holds(t);
}

void kv_tiers_count_refs(struct kv_tiers *t)
{
	struct kv_list *pos;
	uint32_t i;

	kv_list_for_each(pos, &t->swaps) {
		struct kv_swap *sw = kv_container_of(pos, struct kv_swap, all);

		sw->pool->check_holds++;
		for (i = 0; i < sw->n; i++) {
			struct kv_block *b = sw->loc[i] == LOC_G1 && sw->h[i]
						     ? kv_block_lookup(t->ps, sw->h[i]) : NULL;

			if (b)
				b->check++;
			if (sw->nh[i] && (b = kv_block_lookup(t->ps, sw->nh[i])))
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
	tier_count_holds(t);
}

int kv_tiers_check(struct kv_tiers *t, void (*report)(void *ctx, const char *msg), void *ctx)
{
	uint64_t used[2] = { 0 }, indexed = 0, ns_used[2][KV_MAX_NS] = { { 0 } };
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
				if (l == L2 || !tb->run[L2]) {
					const char *why = tb_state_problem(tb);

					if (why) {
						snprintf(msg, sizeof(msg), "tier G%d: slot %u of the run "
							 "at page %u: %s", l + 2, s, pg, why);
						report(ctx, msg);
						problems++;
					}
					indexed += tb->indexed;
				}
			}
			if (n != r->nused) {
				snprintf(msg, sizeof(msg), "tier G%d: run at page %u: %u slots used, %u "
					 "counted", l + 2, pg, n, r->nused);
				report(ctx, msg);
				problems++;
			}
			used[l] += (uint64_t)n * r->slot_bytes;
			if (r->tp)
				ns_used[l][r->tp->pool->ns - 1] += (uint64_t)n * r->slot_bytes;
		}
		for (uint32_t i = 0; L->on && i < KV_MAX_NS; i++) {
			const struct kv_ns *m = &kv_pools_nstab(t->ps)->ns[i];

			if (m->refs && m->used[l + 1] != ns_used[l][i]) {
				snprintf(msg, sizeof(msg), "tier G%d: namespace '%s' holds %llu bytes, "
					 "%llu counted", l + 2, m->name,
					 (unsigned long long)ns_used[l][i],
					 (unsigned long long)m->used[l + 1]);
				report(ctx, msg);
				problems++;
			}
		}
		if (L->on && used[l] != L->st.used) {
			snprintf(msg, sizeof(msg), "tier G%d: %llu bytes in used slots, %llu counted",
				 l + 2, (unsigned long long)used[l], (unsigned long long)L->st.used);
			report(ctx, msg);
			problems++;
		}
	}
	/* The levels' lists: in tick order (the oldest is their back), each
	 * copy on the list that matches its pool's list. */
	for (l = 0; l < 2; l++)
		for (int clean = 0; clean <= (l == L2); clean++) {
			const struct kv_list *head = clean ? &t->lv[l].clean : &t->lv[l].lru;
			const struct kv_list *n;
			uint64_t newer = UINT64_MAX;

			kv_list_for_each(n, head) {
				const struct tblock *tb = kv_container_of(n, struct tblock, all[l]);

				if (tb->tick >= newer || (l == L2 && !clean != !tb->g3_ok) ||
				    !tb->run[l]) {
					snprintf(msg, sizeof(msg), "tier G%d: the %s list is out of tick "
						 "order or holds a block that is not %s", l + 2,
						 clean ? "clean" : "idle", clean ? "clean" : "idle here");
					report(ctx, msg);
					problems++;
					break;
				}
				newer = tb->tick;
			}
		}
	/* Per pool id: state only for a live pool, and for that pool. */
	for (uint32_t id = 0; id < KV_MAX_POOLS; id++) {
		const struct kv_pool *p = kv_pool_get(t->ps, id);

		for (l = 0; l < 4; l++) {
			const struct tpool *tp = l < 2 ? t->lv[l].tp[id] : t->lv[l - 2].sw[id];

			if (tp && tp->pool != p) {
				snprintf(msg, sizeof(msg), "tier G%d: the state of pool id %u is %s",
					 l % 2 + 2, id, p ? "another pool's" : "left from a freed pool");
				report(ctx, msg);
				problems++;
			}
		}
		if (!p && t->layout_id[id]) {
			snprintf(msg, sizeof(msg), "tiers: pool id %u is free but has a layout id", id);
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
