/* Demotion: cached G1 blocks copied down into G2. */
#include "tier_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

_Static_assert(BATCH <= 64, "copyop.sum has a bit per copy");

/* Frees tb, whose demotion did not complete: its G2 slot was never counted
 * as a block, dirty or not (tb_free() would take it off those counts). */
static void demote_discard(struct kv_tiers *t, struct tblock *tb)
{
	kv_assert(tb->busy == BUSY_DOWN && !tb->indexed);
	tb->busy = 0;
	slot_put(t, L2, tb->run[L2], tb->slot[L2]);
	tb->run[L2] = NULL;
	tb_dealloc(tb);
}

/* The copy of op did not start: its blocks stay in G1, its tblocks go. */
static void demote_undo(struct kv_tiers *t, struct copyop *op)
{
	uint32_t i;

	for (i = 0; i < op->n; i++) {
		struct kv_block *b = kv_block_lookup(t->ps, op->h[i]);

		if (b)
			kv_block_demote_end(b, 0);
		demote_discard(t, op->tb[i]);
	}
	free(op);
}

/* Starts copying the oldest cached blocks of dev (of pool only, when set)
 * into G2 until want bytes are under way. Returns the bytes started. */
uint64_t tier_demote(struct kv_tiers *t, uint32_t dev, struct kv_pool *only, uint64_t want)
{
	uint64_t started = 0;

	/* The copies fail: nothing moves until the backoff ends; an operator's
	 * Evict (only set) tries anyway, as it would drop the blocks else. */
	if (!only && tier_io_held(t, BO_COPY))
		return 0;
	/* The pool of the block before, and whether its blocks go to G4 now. */
	const struct kv_pool *last = NULL;
	int sum = 0;

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

			/* With a disk behind it, G2 keeps g2_low percent free or
			 * clean for promotions to stage through: past that,
			 * demotion waits for write-back. */
			if (t->lv[L3].on && (t->dirty_bytes + t->swap_bytes) * 100 >=
						    t->lv[L2].st.capacity * (100 - t->cfg.g2_low))
				break;
			b = only ? kv_pool_oldest_cached(only) : kv_pools_oldest_cached(t->ps, dev);
			if (!b)
				break;
			tb = tb_new(t, kv_block_pool(b), b->ix.hash, b->ix.born_ms);
			if (!tb)
				break;
			if (slot_alloc(t, L2, tb->pool, tb, &tb->run[L2], &tb->slot[L2]) < 0) {
				tb_dealloc(tb);
				break;
			}
			tb->busy = BUSY_DOWN;
			kv_block_demote_begin(b);
			c[op->n] = (struct kv_copy){
				.dev_off = kv_block_offset(b),
				.host = tier_g2_addr(t, tb->run[L2], tb->slot[L2]) + HDR_BYTES,
				.len = tb->pool->block_bytes, .qfmt = tb->pool->qfmt,
				.qdtype = tb->pool->qdtype };
			if (tb->pool != last) {
				last = tb->pool;
				sum = t->be->crc && tier_remote_demotes(t, last);
			}
			if (sum) {   /* the copy sums it for its G4 value */
				c[op->n].crc = &op->crc[op->n];
				op->sum |= 1ull << op->n;
			}
			op->tb[op->n] = tb;
			op->h[op->n] = kv_block_handle(b);
			op->bytes += tb->pool->block_bytes;
			op->n++;
		}
		if (!op->n) {
			free(op);
			break;
		}
		op->start_ns = kv_hist_now_ns();
		r = tier_copy_async(t, dev, KV_COPY_D2H, c, op->n, op);
		if (r < 0) {
			t->lv[L2].st.io_errors++;
			if (r != -ESHUTDOWN)
				tier_io_failed(t, BO_COPY, "a demotion copy failed to start: %s",
					       strerror(-r));
			demote_undo(t, op);
			break;
		}
		started += op->bytes;
		t->down_bytes[dev] += op->bytes;
		t->lv[L2].st.inflight++;
	}
	return started;
}

void tier_demote_done(struct kv_tiers *t, struct copyop *op, int res)
{
	uint32_t i;

	t->down_bytes[op->dev] -= op->bytes;
	kv_hist_since(&t->hist[KV_TH_DEMOTE], op->start_ns);
	if (res < 0) {
		t->lv[L2].st.io_errors++;
		tier_io_failed(t, BO_COPY, "a demotion of %u blocks: %s; they stay in G1", op->n,
			       strerror(-res));
	} else {
		tier_io_ok(t, BO_COPY);
	}
	for (i = 0; i < op->n; i++) {
		struct kv_block *b = kv_block_lookup(t->ps, op->h[i]);
		struct tblock *tb = op->tb[i];

		kv_assert(tb->busy == BUSY_DOWN);
		if (b && kv_block_demote_end(b, res == 0)) {
			tb_index(t, tb);
			t->lv[L2].st.blocks++;
			g2_dirty_add(t, tb, 1);
			t->lv[L2].st.demotions++;
			tb_busy_clear(t, tb, BUSY_DOWN);
			/* idle now: may hold it */
			tier_remote_put_sum(t, tb, KV_G4W_DEMOTE,
					    op->sum >> i & 1 ? &op->crc[i] : NULL);
		} else {
			/* A lookup took the block meanwhile (or the copy failed):
			 * the block stays in G1, the copy goes. */
			demote_discard(t, tb);
		}
	}
}

void tier_demote_kick(struct kv_tiers *t)
{
	uint32_t d;

	for (d = 0; d < t->be->devices; d++) {
		uint64_t total, free = kv_pools_dev_room(t->ps, d, &total) + t->down_bytes[d];

		if (!t->demoting[d] && free * 100 >= total * t->cfg.g1_low)
			continue;
		t->demoting[d] = 1;
		if (free * 100 < total * t->cfg.g1_high)
			tier_demote(t, d, NULL, total * t->cfg.g1_high / 100 - free);
		free = kv_pools_dev_room(t->ps, d, &total) + t->down_bytes[d];
		if (free * 100 >= total * t->cfg.g1_high || !t->down_bytes[d])
			t->demoting[d] = 0;
	}
}
