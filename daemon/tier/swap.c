/* Swap: a session's blocks copied into G2 (and, past G2's free room, through
 * G2 onto G3) and back into new G1 blocks. tier_int.h draws the states.
 *
 * Over 800 lines because the three movements of a swap (out in rounds, in in
 * rounds, evacuation of a resting swap) share one per-block placement and
 * one completion path (swap_round_end()); split apart, each file would need
 * the others' statics. */
#include "tier_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "log.h"

static void swap_round_end(struct kv_tiers *t, struct kv_swap *sw);

static void swap_unref(struct kv_tiers *t, uint64_t h)
{
	struct kv_block *b = kv_block_lookup(t->ps, h);

	kv_assert(b);  /* the swap holds a reference on it */
	kv_block_unref(b);
}

void tier_swap_free(struct kv_tiers *t, struct kv_swap *sw, int unref)
{
	uint32_t i;

	for (i = 0; sw->run && i < sw->k; i++)
		if (sw->run[i]) {
			t->swap_bytes -= sw->run[i]->slot_bytes;
			slot_put(t, L2, sw->run[i], sw->slot[i]);
			t->lv[L2].st.blocks--;
		}
	for (i = 0; sw->run3 && i < sw->n; i++)
		if (sw->run3[i]) {
			slot_put(t, L3, sw->run3[i], sw->slot3[i]);
			t->lv[L3].st.blocks--;
		}
	for (i = 0; unref && sw->loc && i < sw->n; i++) {
		if (sw->loc[i] == LOC_G1 && sw->h[i])
			swap_unref(t, sw->h[i]);
		if (sw->nh && sw->nh[i])
			swap_unref(t, sw->nh[i]);
	}
	if (kv_list_linked(&sw->all))
		kv_list_del(&sw->all);
	if (sw->pool)
		kv_pool_put(sw->pool);
	free(sw->run);
	free(sw->slot);
	free(sw->run3);
	free(sw->slot3);
	free(sw->loc);
	free(sw->h);
	free(sw->nh);
	free(sw->io);
	free(sw);
}

/* What a swap counts against its owner's max_swap_per_session. */
static uint64_t swap_bytes(const struct kv_swap *sw)
{
	return (uint64_t)sw->n * sw->pool->block_bytes;
}

/* Takes sw off its owner's list. */
static void swap_leave_owner(struct kv_swap_owner *owner, struct kv_swap *sw)
{
	kv_assert(owner->bytes >= swap_bytes(sw));
	owner->bytes -= swap_bytes(sw);
	kv_list_del(&sw->link);
}

/* Where the G2 slot j of sw starts (its header), and its payload. */
static uint8_t *stage_addr(struct kv_tiers *t, struct kv_swap *sw, uint32_t j)
{
	return tier_g2_addr(t, sw->run[j], sw->slot[j]);
}

/* Starts one copy batch of the blocks blk[0..cnt) between G1 and the G2
 * slots stage[0..cnt): out, from G1 (h[]) into the slots; in, from the slots
 * into the new G1 blocks (nh[]). Returns 0 or -errno (nothing started). */
static int swap_copy(struct kv_tiers *t, struct kv_swap *sw, int out, const uint32_t *blk,
		     const uint32_t *stage, uint32_t cnt)
{
	struct kv_copy *c = calloc(cnt, sizeof(*c));
	struct copyop *op = calloc(1, sizeof(*op));
	uint32_t i;
	int r;

	if (!c || !op) {
		free(c);
		free(op);
		return -ENOMEM;
	}
	kv_assert(cnt && cnt <= BATCH);
	op->kind = out ? OP_SWAP_OUT : OP_SWAP_IN;
	op->sw = sw;
	op->dev = sw->pool->device;
	op->n = cnt;
	for (i = 0; i < cnt; i++) {
		op->h[i] = blk[i];
		struct kv_block *b = kv_block_lookup(t->ps, out ? sw->h[blk[i]] : sw->nh[blk[i]]);

		kv_assert(b);
		c[i] = (struct kv_copy){ .dev_off = kv_block_offset(b),
					 .host = stage_addr(t, sw, stage[i]) + HDR_BYTES,
					 .len = sw->pool->block_bytes };
	}
	r = tier_copy_async(t, op->dev, out ? KV_COPY_D2H : KV_COPY_H2D, c, cnt, op);
	free(c);
	if (r < 0)
		free(op);
	else
		t->lv[L2].st.inflight++;
	return r;
}

/* The header of block i's G3 slot: the hash field names the swap and the
 * block, so that a slot read back for another swap or block fails. */
static void swap_hdr(struct kv_tiers *t, struct kv_swap *sw, uint32_t i, struct slot_hdr *h)
{
	memset(h, 0, sizeof(*h));
	h->magic = SLOT_MAGIC;
	h->version = SLOT_VERSION;
	h->ns = slot_hdr_ns(t, sw->pool);
	h->layout = t->layout_id[sw->pool->id];
	memcpy(h->hash, &sw->id, sizeof(sw->id));
	memcpy(h->hash + sizeof(sw->id), &i, sizeof(i));
	h->payload_len = sw->pool->block_bytes;
}

/* ---- out: rounds of G1 -> G2 slots -> G3, then the last k blocks to G2 ---- */

static void spill_written(struct kv_disk_op *dop, int res)
{
	struct swio *io = kv_container_of(dop, struct swio, dop);
	struct kv_swap *sw = io->sw;
	struct kv_tiers *t = sw->t;

	t->lv[L3].st.inflight--;
	if (res == (int)dop->len) {
		sw->loc[io->blk] = LOC_G3;
		swap_unref(t, sw->h[io->blk]);
		sw->h[io->blk] = 0;
		t->lv[L3].st.demotions++;
	} else {
		t->lv[L3].st.io_errors++;
		kv_warn("disk tier: swap write of %u bytes at %llu: %s; the block stays in G1",
			dop->len, (unsigned long long)dop->off,
			res < 0 ? strerror(-res) : "short write");
		sw->rerr = 1;
	}
	if (--sw->pending == 0)
		swap_round_end(t, sw);
}

/* Worker thread: the payload's checksum into the slot's header. */
static void spill_sum(struct kv_job *j)
{
	struct swio *io = kv_container_of(j, struct swio, job);
	uint8_t *slot = io->dop.buf;
	struct slot_hdr h;

	memcpy(&h, slot, sizeof(h));
	slot_hdr_seal(&h, kv_crc32c(0, slot + HDR_BYTES, h.payload_len));
	memcpy(slot, &h, sizeof(h));
}

static void spill_summed(struct kv_job *j)
{
	struct swio *io = kv_container_of(j, struct swio, job);
	struct kv_tiers *t = io->sw->t;

	if (t->stopping) {
		io->dop.done(&io->dop, -ESHUTDOWN);
		return;
	}
	kv_disk_submit(&t->disk, &io->dop);
}

/* Block i of sw, staged in slot (a G2 slot of the swap's), to its G3 slot:
 * the header written in front, the checksum on the worker (spill_sum), then
 * the write, whose completion is done. Counted in flight from here, the
 * checksum included, so that kv_tiers_destroy() waits for it. */
static void slot_write_start(struct kv_tiers *t, struct kv_swap *sw, struct swio *io, uint32_t i,
			     uint8_t *slot, void (*done)(struct kv_disk_op *, int))
{
	struct slot_hdr h;

	swap_hdr(t, sw, i, &h);
	memset(slot, 0, HDR_BYTES);
	memcpy(slot, &h, sizeof(h));
	io->blk = i;
	io->sw = sw;
	io->res = 0;
	io->dop = (struct kv_disk_op){ .done = done, .write = 1, .buf = slot,
				       .len = sw->run3[i]->slot_bytes,
				       .off = tier_g3_offset(t, sw->run3[i], sw->slot3[i]) };
	t->lv[L3].st.inflight++;
	tier_offload(t, &io->job, spill_sum, spill_summed);
}

/* The spill round's copy into the slots ended: write each slot to disk. */
static void spill_copied(struct kv_tiers *t, struct kv_swap *sw, uint32_t cnt, int res)
{
	uint32_t j;

	if (res < 0) {
		sw->rerr = 1;
		swap_round_end(t, sw);
		return;
	}
	sw->pending = cnt;
	for (j = 0; j < cnt; j++) {
		struct swio *io = &sw->io[j];
		uint32_t i = sw->cur + j;

		slot_write_start(t, sw, io, i, stage_addr(t, sw, j), spill_written);
	}
}

/* Starts the next step of a swap out: a spill round, or the last copy. */
static void swap_out_step(struct kv_tiers *t, struct kv_swap *sw)
{
	uint32_t blk[BATCH], stage[BATCH], cnt = 0, j;
	uint32_t want = sw->cur < sw->m ? sw->m - sw->cur : sw->n - sw->cur;
	int r = 0;

	if (want > sw->k)
		want = sw->k;
	while (cnt < want) {
		uint32_t c = want - cnt > BATCH ? BATCH : want - cnt;

		for (j = 0; j < c; j++) {
			blk[j] = sw->cur + cnt + j;
			stage[j] = sw->cur < sw->m ? cnt + j : sw->cur + cnt + j - sw->m;
		}
		r = sw->dead ? -ECANCELED : swap_copy(t, sw, 1, blk, stage, c);
		if (r < 0)
			break;
		sw->pending++;
		cnt += c;
	}
	sw->batch = cnt;
	if (r < 0) {
		if (r != -ECANCELED) {
			t->lv[L2].st.io_errors++;
			kv_warn("host tier: swap out copy failed: %s; the blocks stay in G1",
				strerror(-r));
		}
		sw->rerr = 1;
		if (!sw->pending)
			swap_round_end(t, sw);
	}
}

/* ---- evacuation: a resting swap's G2 blocks written to G3, its slots freed -- */

/* Frees sw's G2 slots (none holds a block of it). */
static void swap_free_stage(struct kv_tiers *t, struct kv_swap *sw)
{
	uint32_t j;

	for (j = 0; j < sw->k; j++) {
		t->swap_bytes -= sw->run[j]->slot_bytes;
		slot_put(t, L2, sw->run[j], sw->slot[j]);
		sw->run[j] = NULL;
		t->lv[L2].st.blocks--;
	}
	sw->k = 0;
}

static void evac_written(struct kv_disk_op *dop, int res)
{
	struct swio *io = kv_container_of(dop, struct swio, dop);
	struct kv_swap *sw = io->sw;
	struct kv_tiers *t = sw->t;
	uint32_t i = io->blk;

	t->lv[L3].st.inflight--;
	if (res == (int)dop->len) {
		sw->loc[i] = LOC_G3;
		t->lv[L3].st.demotions++;
	} else {
		t->lv[L3].st.io_errors++;
		kv_warn("disk tier: swap write of %u bytes at %llu: %s; the block stays in G2",
			dop->len, (unsigned long long)dop->off,
			res < 0 ? strerror(-res) : "short write");
		slot_put(t, L3, sw->run3[i], sw->slot3[i]);
		sw->run3[i] = NULL;
		t->lv[L3].st.blocks--;
		sw->rerr = 1;
	}
	if (--sw->pending)
		return;
	if (sw->rerr)
		sw->evac_failed = 1;  /* not chosen again */
	else
		swap_free_stage(t, sw);
	sw->rerr = 0;
	sw->state = SW_OUT;
	if (sw->dead) {
		tier_swap_free(t, sw, 1);
		return;
	}
	tier_wake_all(&sw->waiters);
	tier_wake_all(&t->space_waiters);
}

/* Starts writing resting sw's G2 blocks to new G3 slots; once all are
 * written its G2 slots are freed (a failed write keeps them all, and the
 * block stays in G2). Returns 0 when started, 1 when sw had no block in G2
 * (its slots are freed now), -ENOSPC when G3 has no room for them. */
static int swap_evacuate(struct kv_tiers *t, struct kv_swap *sw)
{
	uint32_t i, cnt = 0;

	kv_assert(sw->state == SW_OUT && !sw->dead && sw->k && sw->run3);
	for (i = sw->m; i < sw->n; i++) {
		if (sw->loc[i] != LOC_G2)
			continue;
		if (slot_alloc(t, L3, sw->pool, SWAP_SLOT, &sw->run3[i], &sw->slot3[i]) < 0) {
			while (i-- > sw->m)
				if (sw->loc[i] == LOC_G2 && sw->run3[i]) {
					slot_put(t, L3, sw->run3[i], sw->slot3[i]);
					sw->run3[i] = NULL;
					t->lv[L3].st.blocks--;
				}
			sw->evac_failed = 1;
			return -ENOSPC;
		}
		t->lv[L3].st.blocks++;
		cnt++;
	}
	if (!cnt) {
		swap_free_stage(t, sw);
		return 1;
	}
	sw->state = SW_EVAC;
	sw->pending = cnt;
	for (i = sw->m, cnt = 0; i < sw->n; i++) {
		struct swio *io;

		if (sw->loc[i] != LOC_G2)
			continue;
		io = &sw->io[cnt++];
		slot_write_start(t, sw, io, i, stage_addr(t, sw, i - sw->m), evac_written);
	}
	return 0;
}

/* G2 has no slot for a new swap: makes room by evacuating the oldest
 * resting swap that has G2 slots. Returns 0 when an evacuation is under
 * way (started now or before: wait for it), 1 when slots were freed at
 * once, -ENOSPC when none can be. */
static int swap_make_room(struct kv_tiers *t)
{
	struct kv_list *l;
	int r;

	if (!t->lv[L3].on || t->stopping)
		return -ENOSPC;
	kv_list_for_each(l, &t->swaps) {
		const struct kv_swap *o = kv_container_of(l, struct kv_swap, all);

		if (o->state == SW_EVAC)
			return 0;
	}
	kv_list_for_each(l, &t->swaps) {
		struct kv_swap *o = kv_container_of(l, struct kv_swap, all);

		if (o->state != SW_OUT || o->dead || !o->k || o->evac_failed || !o->run3)
			continue;
		if ((r = swap_evacuate(t, o)) >= 0)
			return r;
	}
	return -ENOSPC;
}

/* ---- in: the G2 blocks, then rounds of G3 -> G2 slots -> G1 -------------- */

static void fill_read(struct kv_disk_op *dop, int res);

/* Worker thread: checks the slot read for block io->blk. */
static void fill_check(struct kv_job *j)
{
	struct swio *io = kv_container_of(j, struct swio, job);
	const uint8_t *slot = io->dop.buf;
	struct slot_hdr h, want = io->want;
	uint32_t crc;

	memcpy(&h, slot, sizeof(h));
	crc = h.hdr_crc;
	h.hdr_crc = 0;
	want.payload_crc = h.payload_crc;
	if (crc != kv_crc32c(0, &h, sizeof(h)) || memcmp(&h, &want, sizeof(h)) != 0 ||
	    h.payload_crc != kv_crc32c(0, slot + HDR_BYTES, h.payload_len))
		io->res = -EBADMSG;
}

static void fill_checked(struct kv_job *j)
{
	struct swio *io = kv_container_of(j, struct swio, job);
	struct kv_swap *sw = io->sw;
	struct kv_tiers *t = sw->t;

	t->lv[L3].st.inflight--;
	if (io->res == -EBADMSG) {
		t->lv[L3].st.checksum_failures++;
		kv_warn("disk tier: a swapped block read back from disk does not check out");
	}
	if (--sw->pending == 0)
		swap_round_end(t, sw);
}

static void fill_read(struct kv_disk_op *dop, int res)
{
	struct swio *io = kv_container_of(dop, struct swio, dop);
	struct kv_swap *sw = io->sw;
	struct kv_tiers *t = sw->t;

	if (res != (int)dop->len) {
		t->lv[L3].st.inflight--;
		t->lv[L3].st.io_errors++;
		kv_warn("disk tier: swap read of %u bytes at %llu: %s", dop->len,
			(unsigned long long)dop->off, res < 0 ? strerror(-res) : "short read");
		io->res = res < 0 ? res : -EIO;
		if (--sw->pending == 0)
			swap_round_end(t, sw);
		return;
	}
	tier_offload(t, &io->job, fill_check, fill_checked);
}

/* Starts the next step of a swap in: the copy of every G2 block, or a round
 * of reads of up to k G3 blocks into the slots. Sets batch to 0 when there
 * is nothing left to move. */
static void swap_in_step(struct kv_tiers *t, struct kv_swap *sw)
{
	uint32_t blk[BATCH], stage[BATCH], cnt = 0, i;
	int r = 0;

	sw->batch = 0;
	sw->phase_g2 = 0;
	for (i = sw->m; i < sw->n; i++)
		if (sw->loc[i] == LOC_G2) {
			blk[cnt] = i;
			stage[cnt] = i - sw->m;
			if (++cnt == BATCH) {
				if ((r = swap_copy(t, sw, 0, blk, stage, cnt)) < 0)
					break;
				sw->pending++;
				sw->batch += cnt;
				cnt = 0;
			}
		}
	if (r == 0 && cnt) {
		if ((r = swap_copy(t, sw, 0, blk, stage, cnt)) == 0) {
			sw->pending++;
			sw->batch += cnt;
		}
	}
	if (r < 0) {
		t->lv[L2].st.io_errors++;
		kv_warn("host tier: swap in copy failed: %s", strerror(-r));
		sw->rerr = 1;
		if (!sw->pending)
			swap_round_end(t, sw);
		return;
	}
	if (sw->batch) {
		sw->phase_g2 = 1;
		return;
	}
	/* The G3 blocks, k at a time: the slots are free now. */
	for (i = 0; i < sw->n && cnt < sw->k; i++) {
		struct swio *io;

		if (sw->loc[i] != LOC_G3)
			continue;
		io = &sw->io[cnt];
		io->blk = i;
		io->res = 0;
		io->sw = sw;
		swap_hdr(t, sw, i, &io->want);
		io->dop = (struct kv_disk_op){ .done = fill_read, .buf = stage_addr(t, sw, cnt),
					       .len = sw->run3[i]->slot_bytes,
					       .off = tier_g3_offset(t, sw->run3[i], sw->slot3[i]) };
		cnt++;
	}
	sw->batch = cnt;
	if (!cnt)
		return;
	if (t->stopping) {
		sw->rerr = 1;
		sw->batch = 0;
		return;
	}
	sw->pending = cnt;
	for (i = 0; i < cnt; i++) {
		t->lv[L3].st.inflight++;
		kv_disk_submit(&t->disk, &sw->io[i].dop);
	}
}

/* The G3 round's reads are checked: copy the good ones into G1. */
static void fill_copy(struct kv_tiers *t, struct kv_swap *sw)
{
	uint32_t blk[BATCH], stage[BATCH], cnt = 0, j;
	int r;

	sw->phase_copy = 1;
	for (j = 0; j < sw->batch; j++) {
		if (sw->io[j].res < 0) {
			sw->rerr = 1;
		} else {
			blk[cnt] = sw->io[j].blk;
			stage[cnt++] = j;
		}
		if (cnt && (cnt == BATCH || j + 1 == sw->batch)) {
			if ((r = swap_copy(t, sw, 0, blk, stage, cnt)) < 0) {
				t->lv[L2].st.io_errors++;
				kv_warn("host tier: swap in copy failed: %s", strerror(-r));
				sw->rerr = 1;
				break;
			}
			sw->pending++;
			cnt = 0;
		}
	}
	if (!sw->pending)
		swap_round_end(t, sw);
}

/* ---- both ------------------------------------------------------------------ */

/* Ends the operation: the state it rests in, the new G1 blocks not filled
 * given back, the waiters woken; a dead swap is freed. */
static void swap_finish(struct kv_tiers *t, struct kv_swap *sw)
{
	uint32_t i, in_g1 = 0;

	for (i = 0; i < sw->n; i++) {
		if (sw->nh[i]) {
			swap_unref(t, sw->nh[i]);
			sw->nh[i] = 0;
		}
		in_g1 += sw->loc[i] == LOC_G1;
	}
	if (sw->rerr && sw->state == SW_IN_COPY)
		sw->err = -EIO;
	sw->rerr = 0;
	sw->state = in_g1 == sw->n ? SW_IN : SW_OUT;
	if (sw->state == SW_IN)
		sw->err = 0;
	if (sw->dead) {
		tier_swap_free(t, sw, 1);
		return;
	}
	tier_wake_all(&sw->waiters);
	tier_wake_all(&t->space_waiters);
}

/* Everything of the step in flight has ended: the next step, or the end. */
static void swap_round_end(struct kv_tiers *t, struct kv_swap *sw)
{
	kv_assert(!sw->pending);
	if (sw->state == SW_OUT_COPY) {
		sw->cur += sw->batch;
		sw->batch = 0;
		if (sw->rerr || sw->dead || sw->cur >= sw->n) {
			swap_finish(t, sw);
			return;
		}
		/* G1 blocks went: allocations waiting for them go on. */
		tier_wake_all(&t->space_waiters);
		swap_out_step(t, sw);
		return;
	}
	kv_assert(sw->state == SW_IN_COPY);
	if (!sw->phase_g2 && !sw->phase_copy && sw->batch && !sw->rerr && !sw->dead) {
		/* the reads of a G3 round are checked */
		fill_copy(t, sw);
		return;
	}
	sw->phase_copy = 0;
	if (sw->rerr || sw->dead) {
		swap_finish(t, sw);
		return;
	}
	swap_in_step(t, sw);
	if (!sw->batch && !sw->pending)
		swap_finish(t, sw);
}

void tier_swap_done(struct kv_tiers *t, struct copyop *op, int res)
{
	struct kv_swap *sw = op->sw;
	uint32_t i;

	kv_assert(sw->state == (op->kind == OP_SWAP_OUT ? SW_OUT_COPY : SW_IN_COPY));
	kv_assert(sw->pending > 0);
	t->lv[L2].st.inflight--;
	if (res < 0) {
		t->lv[L2].st.io_errors++;
		kv_warn("host tier: swap %s copy failed: %s; the blocks stay where they were",
			op->kind == OP_SWAP_OUT ? "out" : "in", strerror(-res));
	}
	if (op->kind == OP_SWAP_OUT && sw->cur < sw->m) {
		/* a spill round: its writes go out once all its copies ended */
		if (res < 0)
			sw->rerr = 1;
		if (--sw->pending)
			return;
		if (sw->rerr)
			swap_round_end(t, sw);
		else
			spill_copied(t, sw, sw->batch, 0);
		return;
	}
	if (res < 0) {
		sw->rerr = 1;
	} else if (op->kind == OP_SWAP_OUT) {
		for (i = 0; i < op->n; i++) {
			uint32_t b = (uint32_t)op->h[i];

			swap_unref(t, sw->h[b]);
			sw->h[b] = 0;
			sw->loc[b] = LOC_G2;
		}
		t->lv[L2].st.demotions += op->n;
	} else {
		/* Which blocks this copy filled: those whose stage it read. */
		for (i = 0; i < op->n; i++) {
			uint32_t b = (uint32_t)op->h[i];

			sw->h[b] = sw->nh[b];
			sw->nh[b] = 0;
			if (sw->loc[b] == LOC_G3) {
				slot_put(t, L3, sw->run3[b], sw->slot3[b]);
				sw->run3[b] = NULL;
				t->lv[L3].st.blocks--;
				t->lv[L3].st.promotions++;
			}
			sw->loc[b] = LOC_G1;
			t->g1.promotions++;
		}
	}
	if (--sw->pending == 0)
		swap_round_end(t, sw);
}

int kv_tiers_swap_out(struct kv_tiers *t, struct kv_swap_owner *owner, struct kv_pool *p,
		      struct kv_block **blocks, uint32_t n, struct kv_waiter *w, uint64_t *handle,
		      char *why, size_t whylen)
{
	struct kv_swap *sw;
	uint32_t i, k = 0;
	int r = 0;

	if (!t->lv[L2].on) {
		snprintf(why, whylen, "no host tier: start kvcached with --host-tier-size");
		return -ENOSPC;
	}
	sw = calloc(1, sizeof(*sw));
	if (!sw)
		return -ENOMEM;
	sw->n = n;
	sw->t = t;
	sw->pool = p;
	kv_pool_hold(p);
	kv_list_init(&sw->waiters);
	kv_list_init(&sw->all);
	sw->run = calloc(n, sizeof(*sw->run));
	sw->slot = calloc(n, sizeof(*sw->slot));
	sw->loc = calloc(n, sizeof(*sw->loc));
	sw->h = calloc(n, sizeof(*sw->h));
	sw->nh = calloc(n, sizeof(*sw->nh));
	if (!sw->run || !sw->slot || !sw->loc || !sw->h || !sw->nh) {
		tier_swap_free(t, sw, 0);
		return -ENOMEM;
	}
	/* As many G2 slots as there are, the rest on G3. */
	for (i = 0; i < n; i++) {
		r = slot_alloc(t, L2, p, SWAP_SLOT, &sw->run[i], &sw->slot[i]);
		if (r < 0)
			break;
		sw->k = i + 1;
		t->lv[L2].st.blocks++;
		t->swap_bytes += sw->run[i]->slot_bytes;
	}
	k = sw->k;
	if (k < n && k && t->lv[L3].on) {
		sw->m = n - k;
		sw->run3 = calloc(n, sizeof(*sw->run3));
		sw->slot3 = calloc(n, sizeof(*sw->slot3));
		sw->io = calloc(n, sizeof(*sw->io));
		if (!sw->run3 || !sw->slot3 || !sw->io) {
			tier_swap_free(t, sw, 0);
			return -ENOMEM;
		}
		for (i = 0; i < sw->m; i++) {
			r = slot_alloc(t, L3, p, SWAP_SLOT, &sw->run3[i], &sw->slot3[i]);
			if (r < 0)
				break;
			t->lv[L3].st.blocks++;
		}
		if (r < 0)
			snprintf(why, whylen,
				 "the host and disk tiers cannot hold %u blocks of %llu bytes "
				 "(%u fit in G2, %u of the other %u in G3)", n,
				 (unsigned long long)p->block_bytes, k, i, sw->m);
	} else if (!k && r == -ENOSPC && w && (r = swap_make_room(t)) >= 0) {
		/* G2 is all other swaps' slots: one of them goes to disk. */
		tier_swap_free(t, sw, 0);
		if (r == 1)
			return kv_tiers_swap_out(t, owner, p, blocks, n, w, handle, why, whylen);
		kv_list_push_back(&t->space_waiters, &w->link);
		return -EINPROGRESS;
	} else if (k < n) {
		const struct kv_ns *m = kv_ns_get(kv_pools_nstab(t->ps), p->ns);

		if (!k && r >= 0)
			r = -ENOSPC;
		if (r == -EDQUOT && (!t->lv[L3].on || !k))
			snprintf(why, whylen,
				 "namespace '%s' is at its G2 quota: it holds %llu of %llu bytes; "
				 "a swap of %u blocks of %llu bytes does not fit (got %u)",
				 m->name, (unsigned long long)m->used[1],
				 (unsigned long long)m->lim.quota[1], n,
				 (unsigned long long)p->block_bytes, k);
		else
			snprintf(why, whylen,
				 "the host tier cannot hold %u blocks of %llu bytes (got %u; %llu of "
				 "%llu bytes in use)%s", n, (unsigned long long)p->block_bytes, k,
				 (unsigned long long)t->lv[L2].st.used,
				 (unsigned long long)t->lv[L2].st.capacity,
				 !k && t->lv[L3].on ? "; a swap that spills to disk needs one free "
						      "G2 slot to stage through" : "");
		if (r >= 0)
			r = -ENOSPC;
	} else {
		r = 0;
	}
	if (r >= 0 && t->lv[L3].on && !sw->run3) {
		/* For a later evacuation (swap_evacuate()). */
		sw->run3 = calloc(n, sizeof(*sw->run3));
		sw->slot3 = calloc(n, sizeof(*sw->slot3));
		sw->io = calloc(n, sizeof(*sw->io));
		if (!sw->run3 || !sw->slot3 || !sw->io)
			r = -ENOMEM;
	}
	if (r < 0) {
		tier_swap_free(t, sw, 0);
		return r;
	}
	for (i = 0; i < n; i++) {
		sw->h[i] = kv_block_handle(blocks[i]);
		sw->loc[i] = LOC_G1;
	}
	sw->id = ++t->next_swap;
	sw->state = SW_OUT_COPY;
	swap_out_step(t, sw);
	if (sw->state == SW_IN && sw->cur == 0) {
		/* Nothing started: the caller keeps its references. */
		snprintf(why, whylen, "copy to the host tier failed");
		tier_swap_free(t, sw, 0);
		return -EIO;
	}
	kv_list_push_back(&owner->list, &sw->link);
	owner->bytes += swap_bytes(sw);
	kv_list_push_back(&t->swaps, &sw->all);
	*handle = sw->id;
	return 0;
}

int kv_tiers_wait_room(struct kv_tiers *t, uint32_t dev, uint32_t ns, int demotions,
		       struct kv_waiter *w)
{
	struct kv_list *l;
	int wait;

	if (!t || dev >= KV_MAX_DEVICES)
		return -ENOSPC;
	wait = demotions && t->down_bytes[dev];
	for (l = t->swaps.next; !wait && l != &t->swaps; l = l->next) {
		const struct kv_swap *sw = kv_container_of(l, struct kv_swap, all);

		wait = sw->state == SW_OUT_COPY && sw->pool->device == dev && sw->pool->ns == ns;
	}
	if (!wait)
		return -ENOSPC;
	kv_list_push_back(&t->space_waiters, &w->link);
	return 0;
}

int kv_tiers_swap_in(struct kv_tiers *t, struct kv_swap_owner *owner, uint64_t handle,
		     struct kv_waiter *w, struct kv_block **out, uint32_t max, uint32_t *n,
		     char *why, size_t whylen)
{
	struct kv_swap *sw = NULL;
	struct kv_block **nb;
	struct kv_list *pos;
	uint32_t i, need = 0, j;
	int r, evacuated;

	kv_list_for_each(pos, &owner->list) {
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
	kv_assert(!sw->dead && (sw->state == SW_OUT || !sw->err));
	if (sw->state == SW_OUT_COPY || sw->state == SW_IN_COPY || sw->state == SW_EVAC) {
		kv_list_push_back(&sw->waiters, &w->link);
		return -EINPROGRESS;
	}
	if (sw->err) {
		sw->err = 0;
		snprintf(why, whylen, "copy or read of a swapped block failed; the swap is kept, "
			 "try again");
		return -EIO;
	}
	if (sw->n > max) {
		snprintf(why, whylen, "swap of %u blocks is larger than max_batch %u", sw->n, max);
		return -E2BIG;
	}
	if (sw->state == SW_OUT) {
		for (i = 0; i < sw->n; i++)
			need += sw->loc[i] != LOC_G1;
		/* Evacuated: G2 slots to read its blocks back through, as many
		 * as G2 gives up to one per block. */
		evacuated = !sw->k;
		while (evacuated && sw->k < need &&
		       slot_alloc(t, L2, sw->pool, SWAP_SLOT, &sw->run[sw->k], &sw->slot[sw->k]) == 0) {
			t->swap_bytes += sw->run[sw->k]->slot_bytes;
			t->lv[L2].st.blocks++;
			sw->k++;
		}
		if (!sw->k) {
			snprintf(why, whylen, "the host tier has no free slot to read the swap back "
				 "through; it is kept, try again");
			return -ENOSPC;
		}
		/* out[] is max >= n long: the new blocks go there first. */
		nb = out;
		r = kv_pool_alloc(sw->pool, need, nb, why, whylen);
		if (r < 0)
			return r;
		for (i = 0, j = 0; i < sw->n; i++)
			if (sw->loc[i] != LOC_G1)
				sw->nh[i] = kv_block_handle(nb[j++]);
		sw->state = SW_IN_COPY;
		sw->cur = 0;
		swap_in_step(t, sw);
		if (sw->state == SW_IN_COPY && !sw->batch && !sw->pending)
			swap_finish(t, sw);
		if (sw->state != SW_IN_COPY) {
			/* failed at once (or nothing to move) */
			if (sw->err) {
				sw->err = 0;
				snprintf(why, whylen, "copy from the host tier failed; the swap is "
					 "kept, try again");
				return -EIO;
			}
		} else {
			kv_list_push_back(&sw->waiters, &w->link);
			return -EINPROGRESS;
		}
	}
	kv_assert(sw->state == SW_IN);
	for (i = 0; i < sw->n; i++) {
		out[i] = kv_block_lookup(t->ps, sw->h[i]);
		kv_assert(out[i]);  /* sw holds a reference on it */
		sw->h[i] = 0;
	}
	*n = sw->n;
	swap_leave_owner(owner, sw);
	tier_swap_free(t, sw, 0);
	return 0;
}

void kv_tiers_owner_gone(struct kv_tiers *t, struct kv_swap_owner *owner)
{
	while (!kv_list_empty(&owner->list)) {
		struct kv_swap *sw = kv_container_of(kv_list_front(&owner->list), struct kv_swap, link);

		swap_leave_owner(owner, sw);
		if (sw->state == SW_OUT_COPY || sw->state == SW_IN_COPY || sw->state == SW_EVAC) {
			sw->dead = 1;
			continue;
		}
		tier_swap_free(t, sw, 1);
	}
}
