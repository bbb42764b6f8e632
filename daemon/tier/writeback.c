/* Write-back: dirty G2 copies written to G3. */
#include "tier_int.h"

#include <errno.h>
#include <string.h>

#include "crc32c.h"
#include "log.h"

/* ---- write-back: G2 -> G3 ------------------------------------------------------ */

static void wb_done(struct kv_disk_op *dop, int res);

int writeback(struct kv_tiers *t, struct tblock *tb)
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
struct tblock *oldest_dirty(struct kv_tiers *t)
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
