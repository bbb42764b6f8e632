/* The primitives every step of the tiers uses (tier_int.h): waking parked
 * requests, starting a copy, offloading a job to the worker thread, setting
 * up a level. They call no step (demote.c, promote.c, ...), so that the
 * steps and tier.c, which dispatches their completions, use them without a
 * circle. */
#include "tier_int.h"

#include <errno.h>

/* Runs every waiter on waiters (moved off it first: a wake may park again). */
void tier_wake_all(struct kv_list *waiters)
{
	struct kv_list local;

	kv_list_init(&local);
	while (!kv_list_empty(waiters)) {
		struct kv_list *n = kv_list_front(waiters);

		kv_list_del(n);
		kv_list_push_back(&local, n);
	}
	while (!kv_list_empty(&local)) {
		struct kv_waiter *w = kv_container_of(kv_list_front(&local), struct kv_waiter, link);

		kv_list_del(&w->link);
		w->wake(w);
	}
}

int tier_copy_async(struct kv_tiers *t, uint32_t dev, enum kv_copy_dir dir,
		    const struct kv_copy *c, uint32_t n, void *op)
{
	if (t->stopping)
		return -ESHUTDOWN;
	return t->be->ops->copy_async(t->be, dev, dir, c, n, (uint64_t)(uintptr_t)op);
}

void tier_offload(struct kv_tiers *t, struct kv_job *job, kv_job_fn run, kv_job_fn done)
{
	job->run = run;
	job->done = done;
	if (t->wk.started) {
		kv_worker_submit(&t->wk, job);
	} else {
		run(job);
		done(job);
	}
}

int tier_level_init(struct kv_tiers *t, int l, uint64_t bytes)
{
	uint64_t seg = 1ull << 30, pages;
	struct level *L = &t->lv[l];
	int r;

	bytes -= bytes % t->page_bytes;
	if (seg > bytes)
		seg = bytes;
	seg -= seg % t->page_bytes;
	if (!seg)
		return -EINVAL;
	bytes -= bytes % seg;
	r = kv_pages_init(&L->pages, (uint32_t)l, (uint32_t)(bytes / seg), seg, t->page_bytes);
	if (r < 0)
		return r;
	pages = bytes / t->page_bytes;
	L->limit_pages = (uint32_t)pages;
	L->st.capacity = bytes;
	L->on = 1;
	return 0;
}
