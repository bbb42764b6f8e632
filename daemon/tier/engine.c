/* The primitives every step of the tiers uses (tier_int.h): waking parked
 * requests, starting a copy, offloading a job to the worker thread, setting
 * up a level. They call no step (demote.c, promote.c, ...), so that the
 * steps and tier.c, which dispatches their completions, use them without a
 * circle. */
#include "tier_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

#include "log.h"

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

void kv_tiers_plug(struct kv_tiers *t, int on)
{
	if (t->be->ops->plug)
		t->be->ops->plug(t->be, on);
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

static const char *const bo_name[BO_N] = { "host tier: copies", "disk tier: I/O" };

void tier_io_failed(struct kv_tiers *t, int path, const char *fmt, ...)
{
	struct tier_backoff *b = &t->bo[path];
	uint64_t now = kv_mono_ms(), delay;
	char what[200];
	va_list ap;

	if (b->until_ms > now) {
		b->quiet++;   /* I/O started before this round: it counts once */
		return;
	}
	b->rounds++;
	b->total++;
	delay = b->rounds > 16 ? BO_MAX_MS : (uint64_t)BO_BASE_MS << (b->rounds - 1);
	if (delay > BO_MAX_MS)
		delay = BO_MAX_MS;
	b->until_ms = now + delay;
	if (t->retry)
		t->retry(t->retry_ctx, delay);
	if (b->logged_ms && now - b->logged_ms < BO_LOG_MS) {
		b->quiet++;
		return;
	}
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	kv_warn("%s failing: %s; %llu more failures since the last line; nothing new starts "
		"for %llu ms (backing off, %d ms at most; the blocks stay where they are)",
		bo_name[path], what, (unsigned long long)b->quiet, (unsigned long long)delay,
		BO_MAX_MS);
	b->logged_ms = now;
	b->quiet = 0;
}

void tier_io_ok(struct kv_tiers *t, int path)
{
	struct tier_backoff *b = &t->bo[path];

	if (!b->rounds)
		return;
	kv_info("%s works again after %u failed rounds", bo_name[path], b->rounds);
	b->rounds = 0;
	b->until_ms = 0;
	b->quiet = 0;
}

int tier_io_held(const struct kv_tiers *t, int path)
{
	return t->bo[path].until_ms && t->bo[path].until_ms > kv_mono_ms();
}

uint64_t kv_tiers_retry_ms(const struct kv_tiers *t)
{
	uint64_t now = kv_mono_ms(), ms = 0;

	for (int p = 0; p < BO_N; p++)
		if (t->bo[p].until_ms > now && (!ms || t->bo[p].until_ms - now < ms))
			ms = t->bo[p].until_ms - now;
	return ms;
}

void kv_tiers_on_retry(struct kv_tiers *t, void (*fn)(void *ctx, uint64_t ms), void *ctx)
{
	t->retry = fn;
	t->retry_ctx = ctx;
}

int kv_tiers_disk_failing(const struct kv_tiers *t)
{
	return t->lv[L3].on && tier_io_held(t, BO_DISK);
}
