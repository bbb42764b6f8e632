/* Promotion: a G3 copy read into G2 and checked, a G2 copy copied into a new
 * G1 block; the lookups waiting for it. */
#include "tier_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "events.h"
#include "log.h"
#include "quant.h"

static void promote_read_done(struct kv_disk_op *dop, int res);

/* Clears flag and runs tb's waiting lookups again; with failed set they see
 * tb as a miss. tb stays allocated while they run (BUSY_WAKE), whatever they
 * do to it. */
static void tb_wake_waiters(struct kv_tiers *t, struct tblock *tb, int flag, int failed)
{
	kv_assert((tb->busy & flag) && !(tb->busy & BUSY_WAKE));
	tb->busy &= (uint8_t)~flag;
	tb->busy |= BUSY_WAKE;
	tb->failed = (uint8_t)failed;
	tier_wake_all(&tb->waiters);
	tb->failed = 0;
	tb_busy_clear(t, tb, BUSY_WAKE);
}

static void promote_failed(struct kv_tiers *t, struct tblock *tb, int flag)
{
	kv_debug("promotion of a block of pool '%s' failed", tb->pool->name);
	tb_wake_waiters(t, tb, flag, 1);
}

/* Starts the H2D copy of tb's G2 copy into a new G1 block. Returns 0;
 * -EAGAIN when G1 has no room until demotions or I/O in flight complete;
 * -ENOSPC when it has none at all; -ENOMEM, or the copy's -errno. */
static int promote_copy_start(struct kv_tiers *t, struct tblock *tb)
{
	struct kv_block *b;
	struct copyop *op;
	struct kv_copy c;
	char why[256];
	int r;

	kv_assert(tb->run[L2] && !tb->dead && !(tb->busy & (BUSY_DOWN | BUSY_UP)));
	/* A compressed copy whose scales the quantizer never writes (NaN, inf,
	 * zero, negative: a copy from disk or G4 that someone wrote with a
	 * checksum of its own) is not dequantized into G1: every copy of it
	 * goes (freed once no flag is left) and the lookup misses. */
	if (tb->pool->qfmt &&
	    !kv_quant_scales_ok(tier_g2_addr(t, tb->run[L2], tb->slot[L2]) + HDR_BYTES,
				kv_pool_stored_bytes(tb->pool), tb->pool->block_bytes / 2,
				KV_QUANT_GROUP)) {
		t->lv[L2].st.checksum_failures++;
		kv_warn("host tier: a compressed copy of a block of pool '%s' has a scale the "
			"quantizer never writes (NaN, infinite, zero or negative); treated as a "
			"miss, and dropped", tb->pool->name);
		tb_kill(t, tb);
		return -EBADMSG;
	}
	/* Room in G1 without dropping anything if possible: when there is
	 * none, demote (so that a cached block moves down instead of being
	 * lost) and let the caller wait for it. */
	if ((r = kv_pool_alloc_free(tb->pool, 1, &b)) < 0) {
		uint32_t dev = tb->pool->device;

		/* Over its quota a namespace makes room from its own cache:
		 * demoting others' blocks would not help it. */
		if (r != -EDQUOT && !t->down_bytes[dev]) {
			/* A demotion that finds no G2 slot for its pool drops
			 * the oldest idle G2 copy, which may be tb's: pinned
			 * meanwhile. Nothing here kills tb (only a seal of its
			 * hash does). */
			tb_busy_set(tb, BUSY_PIN);
			tier_demote(t, dev, NULL, 4 * tb->pool->block_bytes);
			/* G2 may be full of dirty copies: write-back frees it. */
			kv_tiers_kick(t);
			kv_assert(!tb->dead);
			tb_busy_clear(t, tb, BUSY_PIN);
		}
		if (r != -EDQUOT &&
		    (t->down_bytes[dev] || t->lv[L2].st.inflight || t->lv[L3].st.inflight))
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
			      .host = tier_g2_addr(t, tb->run[L2], tb->slot[L2]) + HDR_BYTES,
			      .len = tb->pool->block_bytes, .qfmt = tb->pool->qfmt,
			      .qdtype = tb->pool->qdtype };
	tb_busy_set(tb, BUSY_UP);
	op->start_ns = kv_hist_now_ns();
	r = tier_copy_async(t, op->dev, KV_COPY_H2D, &c, 1, op);
	if (r < 0) {
		free(op);
		kv_block_unref(b);
		t->lv[L2].st.io_errors++;
		tb_busy_clear(t, tb, BUSY_UP);  /* back on its LRU when idle */
		return r;
	}
	t->lv[L2].st.inflight++;
	return 0;
}

void tier_promote_done(struct kv_tiers *t, struct copyop *op, int res)
{
	struct tblock *tb = op->tb[0];
	struct kv_block *b = kv_block_lookup(t->ps, op->h[0]);

	kv_assert(op->n == 1 && (tb->busy & BUSY_UP));
	t->lv[L2].st.inflight--;
	kv_hist_since(&t->hist[KV_TH_PROMOTE_G2], op->start_ns);
	if (res < 0 || !b) {
		t->lv[L2].st.io_errors++;
		tier_io_failed(t, BO_COPY, "a promotion copy: %s", strerror(res < 0 ? -res : EIO));
		if (b)
			kv_block_unref(b);
		promote_failed(t, tb, BUSY_UP);
		return;
	}
	tier_io_ok(t, BO_COPY);
	if (tb->dead) {
		/* The hash was sealed in G1 meanwhile: that block wins. */
		kv_block_unref(b);
	} else {
		if (tb->indexed) {
			kv_index_remove(kv_pools_index(t->ps), &tb->ix);
			tb->indexed = 0;
			t->entries--;
			tb_ev_sync(t, tb);
		}
		struct kv_block *nb = kv_pool_seal(tb->pool, b, tb->ix.hash);

		if (nb == b && b->state == KV_BLOCK_SEALED)
			kv_events_stored(kv_pools_events(t->ps), tb->pool->id, tb->ix.hash, NULL,
					 KV_MEDIUM_G1, NULL);

		/* The prefix keeps its age (the TTL counts from its first seal). */
		if (nb == b && b->state == KV_BLOCK_SEALED)
			b->ix.born_ms = tb->ix.born_ms;
		/* Each waiter keeps it in G1 until it has run again: woken
		 * later than now, it would otherwise find it demoted again and
		 * promote it again, for ever where G1 has room for one block
		 * (fuzz_dispatch). */
		{
			struct kv_list *pos;

			kv_list_for_each(pos, &tb->waiters) {
				struct kv_waiter *w = kv_container_of(pos, struct kv_waiter, link);

				if (w->hold)
					w->hold(w, nb);
			}
		}
		kv_block_unref(nb);
		tb->dead = 1;
		t->g1.promotions++;
	}
	tb_wake_waiters(t, tb, BUSY_UP, 0);
}

/* Starts reading tb's G3 copy into a new G2 slot. Returns 0 or -ENOSPC (no
 * G2 slot). */
static int promote_read_start(struct kv_tiers *t, struct tblock *tb)
{
	kv_assert(!tb->run[L2] && tb->run[L3] && tb->g3_ok &&
		  !(tb->busy & (BUSY_DOWN | BUSY_WB | BUSY_READ | BUSY_UP)));
	if (t->stopping)
		return -ESHUTDOWN;
	if (slot_alloc(t, L2, tb->pool, tb, &tb->run[L2], &tb->slot[L2]) < 0)
		return -ENOSPC;
	tb_busy_set(tb, BUSY_READ);
	tb->dop = (struct kv_disk_op){ .done = promote_read_done,
				       .buf = tier_g2_addr(t, tb->run[L2], tb->slot[L2]),
				       .len = tb->run[L3]->slot_bytes,
				       .off = tier_g3_offset(t, tb->run[L3], tb->slot[L3]) };
	t->lv[L3].st.inflight++;
	tb->dop_ns = kv_hist_now_ns();
	kv_disk_submit(&t->disk, &tb->dop);
	return 0;
}

/* Whether the header of the slot read into buf is what tb names (its
 * payload's checksum is checked on the worker thread). */
static const char *slot_mismatch(struct kv_tiers *t, struct tblock *tb, const uint8_t *buf)
{
	struct slot_hdr h, want;

	memcpy(&h, buf, sizeof(h));
	if (h.magic != SLOT_MAGIC)
		return "bad magic";
	if (h.version != SLOT_VERSION)
		return "unknown format version";
	slot_hdr_fill(t, tb, &want, h.payload_crc);
	if (h.hdr_crc != want.hdr_crc || memcmp(&h, &want, sizeof(h)))
		return h.ns != want.ns ? "another namespace"
		       : h.layout != want.layout ? "another layout"
		       : memcmp(h.hash, want.hash, KV_HASH_BYTES) ? "another hash"
		       : h.flags != want.flags ? "another format (compress)"
		       : h.payload_len != want.payload_len ? "another length"
							   : "header checksum mismatch";
	return NULL;
}

/* The read of tb's G3 copy is over: bad says why it cannot be used (io: an
 * I/O error, else a checksum or header mismatch), NULL if it can. */
static void promote_read_end(struct kv_tiers *t, struct tblock *tb, const char *bad, int io)
{
	struct level *L = &t->lv[L3];

	kv_assert(tb->busy & BUSY_READ);
	L->st.inflight--;
	kv_hist_since(&t->hist[KV_TH_PROMOTE_G3], tb->dop_ns);
	if (bad) {
		if (io) {
			L->st.io_errors++;
			tier_io_failed(t, BO_DISK, "a read of the slot at %llu of pool '%s': %s; "
				       "treated as a miss", (unsigned long long)tb->dop.off,
				       tb->pool->name, bad);
		} else {
			L->st.checksum_failures++;
			kv_warn("disk tier: slot at %llu of pool '%s': %s; treated as a miss",
				(unsigned long long)tb->dop.off, tb->pool->name, bad);
		}
		slot_put(t, L2, tb->run[L2], tb->slot[L2]);
		tb->run[L2] = NULL;
		/* The copy on disk is not to be trusted again. */
		L->st.blocks--;
		tier_journal_append(t, KV_J_SLOT_FREE, tb->run[L3], tb->slot[L3], NULL);
		slot_put(t, L3, tb->run[L3], tb->slot[L3]);
		tb->run[L3] = NULL;
		tb->g3_ok = 0;
		tb_kill(t, tb);  /* freed by tb_wake_waiters(): still busy here */
		tb_wake_waiters(t, tb, BUSY_READ, 1);
		return;
	}
	t->lv[L2].st.blocks++;  /* a clean G2 copy now */
	if (!tb->dead) {
		int r = promote_copy_start(t, tb);

		if (r == 0) {
			tb->busy &= (uint8_t)~BUSY_READ;
			tb_ev_sync(t, tb);
			return;
		}
		if (r == -EAGAIN) {
			/* No G1 room yet: the waiters run again and wait for it,
			 * promoting from the G2 copy. */
			tb_wake_waiters(t, tb, BUSY_READ, 0);
			return;
		}
	}
	promote_failed(t, tb, BUSY_READ);
}

/* Worker thread: the payload's checksum (the G2 slot is BUSY_READ). */
static void promote_sum(struct kv_job *j)
{
	struct tblock *tb = kv_container_of(j, struct tblock, job);
	const uint8_t *buf = tb->dop.buf;
	struct slot_hdr h;

	memcpy(&h, buf, sizeof(h));
	tb->job_crc = kv_crc32c(0, buf + HDR_BYTES, h.payload_len);
}

static void promote_summed(struct kv_job *j)
{
	struct tblock *tb = kv_container_of(j, struct tblock, job);
	struct slot_hdr h;

	memcpy(&h, tb->dop.buf, sizeof(h));
	promote_read_end(tb->t, tb, tb->job_crc != h.payload_crc ? "payload checksum mismatch" : NULL,
			 0);
}

static void promote_read_done(struct kv_disk_op *dop, int res)
{
	struct tblock *tb = kv_container_of(dop, struct tblock, dop);
	struct kv_tiers *t = tb->t;
	const char *bad;

	kv_assert(tb->busy & BUSY_READ);
	if (res == (int)dop->len)
		tier_io_ok(t, BO_DISK);
	if (res != (int)dop->len)
		promote_read_end(t, tb, res < 0 ? strerror(-res) : "short read", 1);
	else if ((bad = slot_mismatch(t, tb, dop->buf)))
		promote_read_end(t, tb, bad, 0);
	else
		tier_offload(t, &tb->job, promote_sum, promote_summed);
}

int kv_tiers_promote(struct kv_tiers *t, struct kv_index_entry *e, struct kv_waiter *w)
{
	struct tblock *tb = kv_container_of(e, struct tblock, ix);

	kv_assert(e->kind == KV_ENTRY_TIER && tb->indexed);
	if (tb->failed)
		return -ENOENT;
	if (!(tb->busy & (BUSY_READ | BUSY_UP))) {
		int from_g2 = tb->run[L2] != NULL;
		int r = from_g2 ? promote_copy_start(t, tb) : promote_read_start(t, tb);

		if (r == -EAGAIN ||
		    (r == -ENOSPC && !from_g2 && (t->lv[L2].st.inflight || t->lv[L3].st.inflight))) {
			/* No room (G1, or G2 to stage in) until some copy or
			 * I/O completes. */
			if (!w)
				return -EAGAIN;
			kv_list_push_back(&t->space_waiters, &w->link);
			return 0;
		}
		if (r == -EBADMSG)
			return -ENOENT;  /* killed: tb may be gone */
		if (r < 0) {
			kv_debug("promotion from G%d of a block of pool '%s' cannot start: %s",
				 from_g2 ? 2 : 3, tb->pool->name, strerror(-r));
			return -ENOENT;
		}
		t->lv[from_g2 ? L2 : L3].st.hits++;
	}
	if (w)
		kv_list_push_back(&tb->waiters, &w->link);
	return 0;
}
