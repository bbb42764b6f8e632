/* Write-back: dirty G2 copies written to G3. */
#include "tier_int.h"

#include <errno.h>
#include <string.h>

#include "crc32c.h"
#include "log.h"

static void writeback_done(struct kv_disk_op *dop, int res);

/* Worker thread: the checksums of the slot (BUSY_WB: nobody else touches
 * it) go into its header. */
static void writeback_sum(struct kv_job *j)
{
	struct tblock *tb = kv_container_of(j, struct tblock, job);
	uint8_t *slot = tb->dop.buf;
	struct slot_hdr h;

	memcpy(&h, slot, sizeof(h));
	slot_hdr_seal(&h, kv_crc32c(0, slot + HDR_BYTES, h.payload_len));
	memcpy(slot, &h, sizeof(h));
	if (tb->g4_want)
		tier_remote_copy(tb, slot);
}

static void writeback_summed(struct kv_job *j)
{
	struct tblock *tb = kv_container_of(j, struct tblock, job);

	if (tb->g4_want) {
		tb->g4_want = 0;
		tier_remote_queue(tb->t, tb);
	}
	kv_disk_submit(&tb->t->disk, &tb->dop);
}

/* The header is filled here, its checksums on the worker thread (the
 * payload's is O(block bytes)); then the write goes out. */
int tier_writeback_start(struct kv_tiers *t, struct tblock *tb)
{
	uint8_t *slot = tier_g2_addr(t, tb->run[L2], tb->slot[L2]);
	struct slot_hdr h;

	kv_assert(!tb->busy && !tb->dead && !tb->run[L3] && !tb->g3_ok);
	if (t->stopping)
		return -ESHUTDOWN;
	if (slot_alloc(t, L3, tb->pool, tb, &tb->run[L3], &tb->slot[L3]) < 0)
		return -ENOSPC;
	slot_hdr_fill(t, tb, &h, 0);
	memset(slot, 0, HDR_BYTES);
	memcpy(slot, &h, sizeof(h));
	tb_busy_set(tb, BUSY_WB);
	tb->dop = (struct kv_disk_op){ .done = writeback_done, .write = 1, .buf = slot,
				       .len = tb->run[L3]->slot_bytes,
				       .off = tier_g3_offset(t, tb->run[L3], tb->slot[L3]) };
	t->wb_bytes += tb->run[L2]->slot_bytes;
	t->lv[L3].st.inflight++;
	tb->g4_want = (uint8_t)tier_remote_want(t, tb, KV_G4W_WRITEBACK);
	tb->dop_ns = kv_hist_now_ns();
	tier_offload(t, &tb->job, writeback_sum, writeback_summed);
	return 0;
}

static void writeback_done(struct kv_disk_op *dop, int res)
{
	struct tblock *tb = kv_container_of(dop, struct tblock, dop);
	struct kv_tiers *t = tb->t;
	struct level *L = &t->lv[L3];

	kv_assert((tb->busy & BUSY_WB) && tb->run[L2] && tb->run[L3] && !tb->g3_ok);
	t->wb_bytes -= tb->run[L2]->slot_bytes;
	L->st.inflight--;
	kv_hist_since(&t->hist[KV_TH_WRITEBACK], tb->dop_ns);
	if (res == (int)dop->len)
		tier_io_ok(t, BO_DISK);
	if (res == (int)dop->len && !tb->dead) {
		tb->g3_ok = 1;
		L->st.blocks++;
		L->st.demotions++;
		g2_dirty_add(t, tb, -1);
		tier_journal_append(t, KV_J_SLOT, tb->run[L3], tb->slot[L3], tb->ix.hash);
		tb_ev_sync(t, tb);
	} else {
		if (!tb->dead)
			L->st.io_errors++;
		if (res != (int)dop->len)
			tier_io_failed(t, BO_DISK, "a write of %u bytes at %llu: %s; the block stays "
				       "in G2", dop->len, (unsigned long long)dop->off,
				       res < 0 ? strerror(-res) : "short write");
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
		tb_drop_g2(t, tb);
		return;
	}
	tb_busy_clear(t, tb, 0);
}

/* What of G2 could be dropped at once were the write-backs in flight done:
 * its free and clean room (swaps and dirty copies pin theirs). */
static uint64_t g2_droppable(const struct kv_tiers *t)
{
	return t->lv[L2].st.capacity - t->dirty_bytes - t->swap_bytes + t->wb_bytes;
}

void tier_writeback_kick(struct kv_tiers *t)
{
	uint64_t cap = t->lv[L2].st.capacity;
	struct tblock *tb;
	int rc;

	/* Clean copies cost nothing to drop, so what fills G2 is what is
	 * dirty (and swapped): write back when the rest falls under g2_low
	 * percent, until it reaches g2_high (counting writes in flight). */
	if (!t->writing_back && (cap - t->dirty_bytes - t->swap_bytes) * 100 >= cap * t->cfg.g2_low)
		return;
	if (tier_io_held(t, BO_DISK))
		return;   /* the disk fails: the timer kicks again when the backoff ends */
	t->writing_back = 1;
	while (g2_droppable(t) * 100 < cap * t->cfg.g2_high && (tb = tier_oldest_idle(t, L2, 0))) {
		rc = tier_writeback_start(t, tb);
		/* Its namespace's G3 quota is full of copies that G2 holds
		 * too (slot_quota_room() does not undo one write-back for
		 * another): the block cannot be kept below G2, and G2 wants
		 * the room, so it goes as it would without a G3. */
		if (rc == -EDQUOT)
			tb_drop_g2(t, tb);
		else if (rc < 0)
			break;
	}
	if (g2_droppable(t) * 100 >= cap * t->cfg.g2_high || !t->wb_bytes)
		t->writing_back = 0;
}
