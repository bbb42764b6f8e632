/* The helpers every request handler shares; see ops_req.h. */
#include "ops_req.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "budget.h"
#include "kvassert.h"
#include "log.h"

void *q_alloc(struct req *q, size_t n)
{
	void *p = kv_arena_alloc(&q->d->arena, n);

	if (!p)
		q->out = KV_OP_NOMEM;
	return p;
}

char *q_strdup(struct req *q, const char *s)
{
	size_t n = strlen(s) + 1;
	char *p = q_alloc(q, n);

	if (p)
		memcpy(p, s, n);
	return p;
}

void kv_op_fail(struct req *q, Kvcached__ErrorCode code, int index, const char *fmt, ...)
{
	Kvcached__Error *e = q_alloc(q, sizeof(*e));
	char *msg = q_alloc(q, KV_OP_MSG_MAX);
	va_list ap;

	if (!e || !msg)
		return;
	kvcached__error__init(e);
	va_start(ap, fmt);
	vsnprintf(msg, KV_OP_MSG_MAX, fmt, ap);
	va_end(ap);
	e->code = code;
	e->message = msg;
	e->index = index;
	q->rs->error = e;
	q->rs->result_case = KVCACHED__RESPONSE__RESULT__NOT_SET;
	if (code == KVCACHED__ERROR_CODE__EPROTO)
		q->out = KV_OP_CLOSE;
}

Kvcached__ErrorCode kv_op_errno_code(int r)
{
	switch (r) {
	case -ENOSPC: return KVCACHED__ERROR_CODE__ENOSPC;
	case -EDQUOT: return KVCACHED__ERROR_CODE__EQUOTA;
	case -EACCES: return KVCACHED__ERROR_CODE__EACCES;
	case -EAGAIN: return KVCACHED__ERROR_CODE__EAGAIN;
	case -ENOENT: return KVCACHED__ERROR_CODE__ENOENT;
	case -E2BIG: return KVCACHED__ERROR_CODE__E2BIG;
	case -EIO: return KVCACHED__ERROR_CODE__EIO;
	case -EINVAL: return KVCACHED__ERROR_CODE__EINVAL;
	default: return KVCACHED__ERROR_CODE__EINTERNAL;
	}
}

struct kv_pool *kv_op_pool(struct req *q, uint32_t id)
{
	struct kv_pool *p = kv_pool_get(q->d->pools, id);

	if (!p || p->ns != q->ss->ns) {
		kv_op_fail(q, KVCACHED__ERROR_CODE__ENOENT, -1, "no pool %u in namespace '%s'", id,
			   kv_pools_ns_name(q->d->pools, q->ss->ns));
		return NULL;
	}
	return p;
}

/* Whether one more fd may be queued for q: 0, -EBUSY (hold) or -EAGAIN
 * (reply set). */
static int fds_room(struct req *q, uint64_t n)
{
	struct kv_daemon *d = q->d;
	struct kv_session *ss = q->ss;
	uint64_t max;

	if (!q->nsegs)
		q->fds_before = ss->nfds + ss->fds_unread;
	/* A session with nothing out may take what one reply needs, however
	 * many; one with fds out waits rather than pass the bound. */
	if (q->fds_before && q->fds_before + q->nsegs + n > d->cfg.max_fds_per_conn) {
		q->out = KV_OP_HOLD;
		return -EBUSY;
	}
	max = kv_daemon_fds_max(d);
	if (d->fds_out + n > max && d->refresh_fds && !q->refreshed) {
		q->refreshed = 1;
		d->refresh_fds(d);
	}
	if (d->fds_out + n > max) {
		kv_op_fail(q, KVCACHED__ERROR_CODE__EAGAIN, -1,
			   "segment fds: %llu are out to clients that have not read them and this "
			   "reply needs %llu or more, past the %llu the daemon passes at once "
			   "(max_fds_in_flight, RLIMIT_NOFILE); nothing changed, retry",
			   (unsigned long long)(d->fds_out - q->nsegs),
			   (unsigned long long)(q->nsegs + n), (unsigned long long)max);
		return -EAGAIN;
	}
	/* One uid's connections together: a uid with none out besides this
	 * request may take what one reply needs (as a session may), one with
	 * some out may not pass max_fds_per_uid, so that the others keep
	 * their share of max_fds_in_flight whatever it holds. */
	if (!ss->bu)
		return 0;
	max = kv_daemon_fds_per_uid_max(d);
	if (ss->bu->fds > q->nsegs && ss->bu->fds + n > max && d->refresh_fds && !q->refreshed) {
		q->refreshed = 1;
		d->refresh_fds(d);
	}
	if (ss->bu->fds > q->nsegs && ss->bu->fds + n > max) {
		d->fds_uid_refused++;
		kv_op_fail(q, KVCACHED__ERROR_CODE__EAGAIN, -1,
			   "segment fds: uid %u's connections have %llu that they have not read and "
			   "this reply needs %llu or more, past the %llu one uid may have out "
			   "(max_fds_per_uid); nothing changed, retry once they have read them",
			   (unsigned)ss->cred.uid, (unsigned long long)(ss->bu->fds - q->nsegs),
			   (unsigned long long)(q->nsegs + n), (unsigned long long)max);
		return -EAGAIN;
	}
	return 0;
}

void kv_op_unwant_all(struct req *q)
{
	while (q->nsegs) {
		struct req_seg *g = &q->segs[--q->nsegs];

		kv_session_unwant_segment(q->ss, g->dev, g->seg, g->old);
	}
}

int kv_op_fds_room(struct req *q, uint64_t n)
{
	return n ? fds_room(q, n) : 0;
}

int kv_op_want_segments(struct req *q, struct kv_block *const *blocks, size_t n)
{
	static struct kv_ratelimit dup_log = { .interval_ms = 1000 };
	const struct kv_run *last = NULL;

	for (size_t i = 0; i < n; i++) {
		uint32_t dev, seg, old;
		uint64_t held;
		int r;

		/* A run lies in one segment, and a batch's blocks mostly come
		 * in runs: a block of the run just checked is the peer's. */
		if (!blocks[i] || blocks[i]->run == last)
			continue;
		last = blocks[i]->run;
		kv_block_where(blocks[i], &dev, &seg);
		if (kv_session_has_segment(q->ss, dev, seg))
			continue;
		if (q->nsegs == q->segs_cap) {
			size_t cap = q->segs_cap ? 2 * q->segs_cap : (n < 64 ? 64 : n);
			struct req_seg *p = kv_arena_alloc(&q->d->arena, cap * sizeof(*p));

			if (!p) {
				kv_op_unwant_all(q);
				q->out = KV_OP_NOMEM;
				return -ENOMEM;
			}
			if (q->nsegs)
				memcpy(p, q->segs, q->nsegs * sizeof(*p));
			q->segs = p;
			q->segs_cap = cap;
		}
		if ((r = fds_room(q, 1)) < 0) {
			kv_op_unwant_all(q);
			return r;
		}
		if ((r = kv_session_want_segment(q->ss, dev, seg, &old)) < 0) {
			/* The daemon's fd table (or memory) is short: as transient
			 * as the fds in flight that fill it. */
			kv_op_unwant_all(q);
			kv_op_fail(q, KVCACHED__ERROR_CODE__EAGAIN, -1,
				   "segment fds: cannot pass one now (%s); nothing changed, retry",
				   strerror(-r));
			if (kv_ratelimit(&dup_log, &held))
				kv_warn("session %llu: cannot duplicate a segment fd to pass it: %s; "
					"the request is answered EAGAIN (%llu more since the last such "
					"line)", (unsigned long long)q->ss->id, strerror(-r),
					(unsigned long long)held);
			return -EAGAIN;
		}
		q->segs[q->nsegs++] = (struct req_seg){ .dev = dev, .seg = seg, .old = old };
	}
	return 0;
}

void kv_op_handles(struct req *q, struct kv_block *const *blk, size_t n, uint64_t *h)
{
	uint64_t base = 0;

	for (size_t i = 0; i < n; i++) {
		const struct kv_block *b = blk[i];
		uint32_t dev, seg;

		if (!i || b->run != blk[i - 1]->run) {
			kv_block_where(b, &dev, &seg);
			kv_assert(kv_session_has_segment(q->ss, dev, seg));
			base = kv_run_handle_base(b->run);
		}
		h[i] = kv_block_handle_in(b, base);
	}
}

void kv_op_reply_handles(struct req *q, uint64_t *h, size_t n)
{
	struct kv_backend *be = q->d->be;
	Kvcached__BlockList *bl = q_alloc(q, sizeof(*bl));
	Kvcached__Segment **segs = NULL;
	size_t i;

	if (!bl)
		return;
	if (q->nsegs && !(segs = q_alloc(q, q->nsegs * sizeof(*segs))))
		return;
	kvcached__block_list__init(bl);
	for (i = 0; i < q->nsegs; i++) {
		if (!(segs[i] = q_alloc(q, sizeof(**segs))))
			return;
		kvcached__segment__init(segs[i]);
		segs[i]->device = q->segs[i].dev;
		segs[i]->index = q->segs[i].seg;
		segs[i]->offset = (uint64_t)q->segs[i].seg * be->segment_bytes;
		segs[i]->bytes = be->segment_bytes;
	}
	bl->n_blocks = n;
	bl->blocks = h;
	q->rs->n_segments = q->nsegs;
	q->rs->segments = segs;
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_BLOCKS;
	q->rs->blocks = bl;
}

void kv_op_reply_blocks(struct req *q, size_t n)
{
	uint64_t *h = q_alloc(q, (n ? n : 1) * sizeof(uint64_t));

	if (!h)
		return;
	kv_op_handles(q, q->blk, n, h);
	kv_op_reply_handles(q, h, n);
}

int kv_op_resolve(struct req *q, struct kv_pool *p, const uint64_t *handles, size_t n,
		  uint32_t per)
{
	size_t i;

	if (n == 0 || n > q->d->cfg.max_batch) {
		kv_op_fail(q, n ? KVCACHED__ERROR_CODE__E2BIG : KVCACHED__ERROR_CODE__EINVAL, -1,
			   "batch of %zu blocks: must be 1..%u", n, q->d->cfg.max_batch);
		return n ? -E2BIG : -EINVAL;
	}
	for (i = 0; i < n; i++) {
		struct kv_block *b = kv_block_lookup_near(q->d->pools, handles[i],
							  i ? q->blk[i - 1] : NULL);

		if (!b || b->state == KV_BLOCK_FREE || kv_block_pool(b)->ns != q->ss->ns ||
		    (p && kv_block_pool(b) != p)) {
			kv_op_fail(q, KVCACHED__ERROR_CODE__ESTALE, (int)i,
				   "block %#llx (index %zu) is stale, forged or %s",
				   (unsigned long long)handles[i], i,
				   b && p && kv_block_pool(b) != p ? "of another pool" : "unknown");
			return -ESTALE;
		}
		b->check = 0;
		q->blk[i] = b;
	}
	/* b->check counts how often each block is listed. */
	for (i = 0; i < n; i++) {
		struct kv_block *b = q->blk[i];
		uint32_t held = kv_sessrefs_get(&q->ss->refs, b);
		uint32_t limit = per && per < held ? per : held;

		if (++b->check > limit) {
			kv_op_fail(q, held ? KVCACHED__ERROR_CODE__ESTATE : KVCACHED__ERROR_CODE__ESTALE,
				   (int)i, "block %#llx (index %zu): %s",
				   (unsigned long long)handles[i], i,
				   !held ? "not held by this connection"
					 : per == 1 ? "listed twice"
						    : "listed more times than references held");
			return held ? -EBUSY : -ESTALE;
		}
	}
	return 0;
}

int kv_op_ref_room_less(struct req *q, const struct kv_block *b, size_t index, uint32_t n,
			uint32_t mine)
{
	uint32_t max = q->d->cfg.max_block_refs, ref;

	kv_assert(mine <= b->ref);
	ref = b->ref - mine;
	if (max > KV_BLOCK_REF_MAX)
		max = KV_BLOCK_REF_MAX;
	/* The references are taken before the request's own go: b->ref + n
	 * within the mechanism's bound too. */
	if (ref <= max && n <= max - ref && n <= KV_BLOCK_REF_MAX - b->ref)
		return 0;
	kv_op_fail(q, KVCACHED__ERROR_CODE__EQUOTA, (int)index,
		   "block %#llx (index %zu) already has %u reference%s; %u more would pass "
		   "max_block_refs (%u): nothing was taken", (unsigned long long)kv_block_handle(b),
		   index, ref, ref == 1 ? "" : "s", n, max);
	return -EDQUOT;
}

int kv_op_ref_room(struct req *q, const struct kv_block *b, size_t index, uint32_t n)
{
	return kv_op_ref_room_less(q, b, index, n, 0);
}
