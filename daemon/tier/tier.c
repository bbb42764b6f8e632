/* The lower tiers; see tier.h for the model and its rules, tier_int.h for
 * the structures. Here: setup and teardown, and the completions that drive
 * the rest (the watermarks are kick.c's, the primitives every step uses
 * engine.c's). */
#include "tier_int.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "log.h"

/* ---- completions ----------------------------------------- */

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
				tier_demote_done(t, op, done[i].res);
				break;
			case OP_PROMOTE:
				tier_promote_done(t, op, done[i].res);
				break;
			default:
				kv_assert(op->kind == OP_SWAP_OUT || op->kind == OP_SWAP_IN);
				tier_swap_done(t, op, done[i].res);
				break;
			}
			free(op);
		}
	}
	/* Lookups waiting for staging room first: demotion must not take
	 * the slots that promotions just gave back. */
	tier_wake_all(&t->space_waiters);
	kv_tiers_kick(t);
}

void kv_tiers_disk_done(struct kv_tiers *t)
{
	if (t->lv[L3].on)
		kv_disk_reap(&t->disk);
	if (t->lv[L3].on || t->g4) {
		kv_worker_reap(&t->wk);
		tier_remote_reap(t);
	}
	/* Lookups waiting for staging room first: demotion must not take
	 * the slots that promotions just gave back. */
	tier_wake_all(&t->space_waiters);
	kv_tiers_kick(t);
}

/* ---- setup ----------------------------------------------------------------- */

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
	t->jr.fd = t->jr.newfd = -1;
	kv_list_init(&t->dormant);
	for (int l = 0; l < 2; l++) {
		kv_list_init(&t->lv[l].lru);
		kv_list_init(&t->lv[l].clean);
	}
	kv_list_init(&t->swaps);
	kv_list_init(&t->space_waiters);
	/* Swap ids start anywhere below 2^52 (exact in a double, for JSON):
	 * a client that reconnected to a new daemon must not find its old
	 * ids naming the new daemon's swaps (one connection, shared by
	 * threads, holds both), as block handles do not (their generations
	 * start at random too). */
	if (getrandom(&t->next_swap, sizeof(t->next_swap), GRND_NONBLOCK) != sizeof(t->next_swap))
		t->next_swap = (uint64_t)getpid() << 32 ^ kv_mono_ms();
	t->next_swap &= (1ull << 52) - 1;
	*out = t;
	if (!cfg->host_bytes) {
		if (cfg->disk_path[0] || cfg->remote_seeds[0]) {
			snprintf(err, errlen, "%s needs a host tier (host_tier_size) to stage "
					      "its I/O through", cfg->disk_path[0] ? "disk_path"
										: "remote_seeds");
			goto err_inval;
		}
		return 0;
	}
	if (cfg->g1_low > cfg->g1_high || cfg->g1_high > 100 || cfg->g2_low > cfg->g2_high ||
	    cfg->g2_high > 100) {
		snprintf(err, errlen, "watermarks: need low <= high <= 100 (g1 %u/%u, g2 %u/%u)",
			 cfg->g1_low, cfg->g1_high, cfg->g2_low, cfg->g2_high);
		goto err_inval;
	}
	if (cfg->host_bytes < page_bytes) {
		snprintf(err, errlen, "host_tier_size %llu is less than one page (%llu bytes)",
			 (unsigned long long)cfg->host_bytes, (unsigned long long)page_bytes);
		goto err_inval;
	}
	r = tier_level_init(t, L2, cfg->host_bytes);
	if (r < 0) {
		snprintf(err, errlen, "host tier: %s", strerror(-r));
		goto err;
	}
	t->g2_bytes = t->lv[L2].st.capacity;
	t->g2 = be->ops->host_alloc(be, t->g2_bytes);
	if (!t->g2) {
		snprintf(err, errlen, "host tier: cannot allocate %llu bytes",
			 (unsigned long long)t->g2_bytes);
		r = -ENOMEM;
		goto err;
	}
	if (cfg->disk_path[0]) {
		r = tier_g3_open(t, err, errlen);
		if (r < 0)
			goto err;
	}
	r = tier_remote_open(t, err, errlen);
	if (r < 0)
		goto err;
	return 0;
err_inval:
	r = -EINVAL;
err:
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
				tb_dealloc(tb);
		}
		pg += r->npages - 1;  /* its other pages point at it too */
		srun_free(r);
	}
	for (s = 0; s < KV_MAX_POOLS; s++) {
		free(L->tp[s]);
		free(L->sw[s]);
	}
	kv_pages_fini(&L->pages);
}

void kv_tiers_destroy(struct kv_tiers *t)
{
	if (!t)
		return;
	/* Nothing new starts from here (a completion below would otherwise
	 * start a write-back or a demotion, whose I/O would outlive the ring
	 * and the arena); what is in flight finishes (copies, disk I/O and the
	 * checksums the worker computes before a write or after a read), so
	 * that nothing points at freed memory and the journal records every
	 * write that completed. */
	t->stopping = 1;
	for (;;) {
		struct io_uring_cqe *cqe;

		if (t->lv[L3].on) {
			kv_worker_wait_idle(&t->wk);
			kv_worker_reap(&t->wk);
			kv_disk_flush(&t->disk);
			if (t->disk.inflight) {
				if (io_uring_wait_cqe(&t->disk.ring, &cqe) < 0)
					break;
				kv_disk_reap(&t->disk);
				continue;
			}
		}
		if (t->lv[L2].on && t->lv[L2].st.inflight) {
			struct pollfd pf = { .fd = t->be->completion_fd, .events = POLLIN };

			if (poll(&pf, 1, 100) < 0 && errno != EINTR)
				break;
			kv_tiers_copies_done(t);
			continue;
		}
		break;
	}
	/* The checksums of G4 writes made from G2 (remote_write.c, tier_remote_put)
	 * finish, and their done()s run, while G4 is still there. */
	if (t->wk.started) {
		kv_worker_wait_idle(&t->wk);
		kv_worker_reap(&t->wk);
	}
	tier_remote_close(t);
	/* The journal is written on this thread again from here on. */
	kv_journal_detach(&t->jr);
	kv_worker_stop(&t->wk);
	while (!kv_list_empty(&t->swaps)) {
		struct kv_swap *sw = kv_container_of(kv_list_front(&t->swaps), struct kv_swap, all);

		if (kv_list_linked(&sw->link))
			kv_list_del(&sw->link);
		tier_swap_free(t, sw, 0);
	}
	if (t->lv[L3].on && t->jr.fd >= 0)
		tier_journal_compact(t);
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
	else if (t->disk.efd >= 0)
		close(t->disk.efd);   /* G4 without G3: tier_remote_open()'s */
	if (t->g2)
		t->be->ops->host_free(t->be, t->g2, t->g2_bytes);
	free(t);
}

int kv_tiers_disk_fd(const struct kv_tiers *t)
{
	return t->lv[L3].on || t->g4 ? t->disk.efd : -1;
}

int kv_tiers_on(const struct kv_tiers *t)
{
	return t->lv[L2].on;
}
