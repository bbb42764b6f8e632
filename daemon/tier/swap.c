/* Swap: a session's blocks copied into G2 and back into new G1 blocks. */
#include "tier_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

void tier_swap_free(struct kv_tiers *t, struct kv_swap *sw)
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
	kv_pool_put(sw->pool);
	free(sw->run);
	free(sw->slot);
	free(sw->h);
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

static void swap_unref_g1(struct kv_tiers *t, struct kv_swap *sw)
{
	uint32_t i;

	for (i = 0; i < sw->n; i++) {
		struct kv_block *b = kv_block_lookup(t->ps, sw->h[i]);

		kv_assert(b);  /* sw holds a reference on it */
		kv_block_unref(b);
	}
}

static int swap_copy_start(struct kv_tiers *t, struct kv_swap *sw, int kind,
			   struct kv_block **blocks)
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
		c[i] = (struct kv_copy){
			.dev_off = kv_block_offset(blocks[i]),
			.host = tier_g2_addr(t, sw->run[i], sw->slot[i]) + HDR_BYTES,
			.len = sw->pool->block_bytes };
		sw->h[i] = kv_block_handle(blocks[i]);
	}
	r = tier_copy_async(t, op->dev, kind == OP_SWAP_OUT ? KV_COPY_D2H : KV_COPY_H2D, c, sw->n,
			    op);
	free(c);
	if (r < 0)
		free(op);
	else
		t->lv[L2].st.inflight++;
	return r;
}

int kv_tiers_swap_out(struct kv_tiers *t, struct kv_swap_owner *owner, struct kv_pool *p,
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
	kv_pool_hold(p);
	kv_list_init(&sw->waiters);
	kv_list_init(&sw->all);
	for (i = 0; i < n; i++) {
		r = slot_alloc(t, L2, p, SWAP_SLOT, &sw->run[i], &sw->slot[i]);
		if (r == -EDQUOT) {
			const struct kv_ns *m = kv_ns_get(kv_pools_nstab(t->ps), p->ns);

			snprintf(why, whylen,
				 "namespace '%s' is at its G2 quota: it holds %llu of %llu bytes; "
				 "a swap of %u blocks of %llu bytes does not fit (got %u)",
				 m->name, (unsigned long long)m->used[1],
				 (unsigned long long)m->lim.quota[1], n,
				 (unsigned long long)p->block_bytes, i);
		} else if (r < 0) {
			snprintf(why, whylen,
				 "the host tier cannot hold %u blocks of %llu bytes (got %u; %llu of "
				 "%llu bytes in use)", n, (unsigned long long)p->block_bytes, i,
				 (unsigned long long)t->lv[L2].st.used,
				 (unsigned long long)t->lv[L2].st.capacity);
		}
		if (r < 0) {
			sw->n = i;
			tier_swap_free(t, sw);
			return r;
		}
		sw->n = i + 1;
		t->lv[L2].st.blocks++;
		t->swap_bytes += sw->run[i]->slot_bytes;
	}
	r = swap_copy_start(t, sw, OP_SWAP_OUT, blocks);
	if (r < 0) {
		snprintf(why, whylen, "copy to the host tier failed: %s", strerror(-r));
		t->lv[L2].st.io_errors++;
		tier_swap_free(t, sw);
		return -EIO;
	}
	sw->state = SW_OUT_COPY;
	sw->id = ++t->next_swap;
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

void tier_swap_done(struct kv_tiers *t, struct copyop *op, int res)
{
	struct kv_swap *sw = op->sw;

	kv_assert(sw->state == (op->kind == OP_SWAP_OUT ? SW_OUT_COPY : SW_IN_COPY));
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
			swap_unref_g1(t, sw);
			sw->state = SW_OUT;
			t->lv[L2].st.demotions += sw->n;
		}
	} else if (res < 0) {
		swap_unref_g1(t, sw);
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
			swap_unref_g1(t, sw);
		tier_swap_free(t, sw);
		return;
	}
	tier_wake_all(&sw->waiters);
}

int kv_tiers_swap_in(struct kv_tiers *t, struct kv_swap_owner *owner, uint64_t handle,
		     struct kv_waiter *w, struct kv_block **out, uint32_t max, uint32_t *n,
		     char *why, size_t whylen)
{
	struct kv_swap *sw = NULL;
	struct kv_list *pos;
	uint32_t i;
	int r;

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
	if (sw->state == SW_OUT_COPY || sw->state == SW_IN_COPY) {
		kv_list_push_back(&sw->waiters, &w->link);
		return -EINPROGRESS;
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
		r = swap_copy_start(t, sw, OP_SWAP_IN, out);
		if (r < 0) {
			for (i = 0; i < sw->n; i++)
				kv_block_unref(out[i]);
			t->lv[L2].st.io_errors++;
			snprintf(why, whylen, "copy from the host tier failed: %s", strerror(-r));
			return -EIO;
		}
		sw->state = SW_IN_COPY;
		kv_list_push_back(&sw->waiters, &w->link);
		return -EINPROGRESS;
	}
	kv_assert(sw->state == SW_IN);
	for (i = 0; i < sw->n; i++) {
		out[i] = kv_block_lookup(t->ps, sw->h[i]);
		kv_assert(out[i]);  /* sw holds a reference on it */
	}
	*n = sw->n;
	swap_leave_owner(owner, sw);
	tier_swap_free(t, sw);
	return 0;
}

void kv_tiers_owner_gone(struct kv_tiers *t, struct kv_swap_owner *owner)
{
	while (!kv_list_empty(&owner->list)) {
		struct kv_swap *sw = kv_container_of(kv_list_front(&owner->list), struct kv_swap, link);

		swap_leave_owner(owner, sw);
		if (sw->state == SW_OUT_COPY || sw->state == SW_IN_COPY) {
			sw->dead = 1;
			continue;
		}
		if (sw->state == SW_IN)
			swap_unref_g1(t, sw);
		tier_swap_free(t, sw);
	}
}
