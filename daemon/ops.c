/* The dispatcher and the helpers every handler shares; see ops.h. */
#include "ops_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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

void kv_op_count_enospc(struct req *q)
{
	struct kv_ns *n = kv_ns_get(kv_pools_nstab(q->d->pools), q->ss->ns);

	q->d->enospc++;
	if (n)
		n->enospc++;
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
	return 0;
}

/* Takes back every fd q queued, last first. */
static void unwant_all(struct req *q)
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

	for (size_t i = 0; i < n; i++) {
		uint32_t dev, seg, old;
		uint64_t held;
		int r;

		if (!blocks[i])
			continue;
		kv_block_where(blocks[i], &dev, &seg);
		if (kv_session_has_segment(q->ss, dev, seg))
			continue;
		if (q->nsegs == q->segs_cap) {
			size_t cap = q->segs_cap ? 2 * q->segs_cap : (n < 64 ? 64 : n);
			struct req_seg *p = kv_arena_alloc(&q->d->arena, cap * sizeof(*p));

			if (!p) {
				unwant_all(q);
				q->out = KV_OP_NOMEM;
				return -ENOMEM;
			}
			if (q->nsegs)
				memcpy(p, q->segs, q->nsegs * sizeof(*p));
			q->segs = p;
			q->segs_cap = cap;
		}
		if ((r = fds_room(q, 1)) < 0) {
			unwant_all(q);
			return r;
		}
		if ((r = kv_session_want_segment(q->ss, dev, seg, &old)) < 0) {
			/* The daemon's fd table (or memory) is short: as transient
			 * as the fds in flight that fill it. */
			unwant_all(q);
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

void kv_op_reply_blocks(struct req *q, size_t n)
{
	struct kv_backend *be = q->d->be;
	Kvcached__BlockList *bl = q_alloc(q, sizeof(*bl));
	uint64_t *h = q_alloc(q, (n ? n : 1) * sizeof(uint64_t));
	Kvcached__Segment **segs = NULL;
	size_t i;

	if (!bl || !h)
		return;
	if (q->nsegs && !(segs = q_alloc(q, q->nsegs * sizeof(*segs))))
		return;
	kvcached__block_list__init(bl);
	for (i = 0; i < n; i++) {
		uint32_t dev, seg;

		kv_block_where(q->blk[i], &dev, &seg);
		kv_assert(kv_session_has_segment(q->ss, dev, seg));
		h[i] = kv_block_handle(q->blk[i]);
	}
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
		struct kv_block *b = kv_block_lookup(q->d->pools, handles[i]);

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
		uint32_t held = kv_refmap_get(&q->ss->refs, b);
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

int kv_op_ref_room(struct req *q, const struct kv_block *b, size_t index, uint32_t n)
{
	uint32_t max = q->d->cfg.max_block_refs;

	if (max > KV_BLOCK_REF_MAX)
		max = KV_BLOCK_REF_MAX;
	if (b->ref <= max && n <= max - b->ref)
		return 1;
	kv_op_fail(q, KVCACHED__ERROR_CODE__EQUOTA, (int)index,
		   "block %#llx (index %zu) already has %u reference%s; %u more would pass "
		   "max_block_refs (%u): nothing was taken", (unsigned long long)kv_block_handle(b),
		   index, b->ref, b->ref == 1 ? "" : "s", n, max);
	return 0;
}

/* While draining, what would take new memory or new references is refused;
 * releasing and sealing what a client holds goes on. */
static void refuse_draining(struct req *q, const char *what)
{
	uint64_t now = kv_mono_ms();
	uint64_t left = q->d->drain_deadline_ms > now ? q->d->drain_deadline_ms - now : 0;

	kv_op_fail(q, KVCACHED__ERROR_CODE__ESHUTDOWN, -1,
		   "kvcached is shutting down: no new %s; release what you hold and disconnect "
		   "(the daemon exits within %" PRIu64 " s)", what, (left + 999) / 1000);
}

/* Whether rq is refused while draining (the reply is then set). */
static int refused_draining(struct req *q, const Kvcached__Request *rq)
{
	if (!q->d->draining)
		return 0;
	switch (rq->op_case) {
	case KVCACHED__REQUEST__OP_REGISTER_POOL:
		refuse_draining(q, "pools");
		return 1;
	case KVCACHED__REQUEST__OP_ALLOC:
	case KVCACHED__REQUEST__OP_COW:
	case KVCACHED__REQUEST__OP_SWAP_IN:
		refuse_draining(q, "allocations");
		return 1;
	case KVCACHED__REQUEST__OP_LOOKUP:
	case KVCACHED__REQUEST__OP_FORK:
		refuse_draining(q, "lookups or references");
		return 1;
	default:
		return 0;
	}
}

const char *const kv_ops_names[KV_DAEMON_OPS] = {
	"hello", "register_pool", "alloc", "seal", "lookup", "release", "fork", "cow",
	"swap_out", "swap_in", "stats", "list_clients", "check", "evict", "flush", "drain",
	"reload", "metrics", "other",
};

unsigned kv_ops_index(int op_case)
{
	switch (op_case) {
	case KVCACHED__REQUEST__OP_HELLO: return 0;
	case KVCACHED__REQUEST__OP_REGISTER_POOL: return 1;
	case KVCACHED__REQUEST__OP_ALLOC: return 2;
	case KVCACHED__REQUEST__OP_SEAL: return 3;
	case KVCACHED__REQUEST__OP_LOOKUP: return 4;
	case KVCACHED__REQUEST__OP_RELEASE: return 5;
	case KVCACHED__REQUEST__OP_FORK: return 6;
	case KVCACHED__REQUEST__OP_COW: return 7;
	case KVCACHED__REQUEST__OP_SWAP_OUT: return 8;
	case KVCACHED__REQUEST__OP_SWAP_IN: return 9;
	case KVCACHED__REQUEST__OP_STATS: return 10;
	case KVCACHED__REQUEST__OP_LIST_CLIENTS: return 11;
	case KVCACHED__REQUEST__OP_CHECK: return 12;
	case KVCACHED__REQUEST__OP_EVICT: return 13;
	case KVCACHED__REQUEST__OP_FLUSH: return 14;
	case KVCACHED__REQUEST__OP_DRAIN: return 15;
	case KVCACHED__REQUEST__OP_RELOAD: return 16;
	case KVCACHED__REQUEST__OP_METRICS: return 17;
	default: return KV_DAEMON_OPS - 1;
	}
}

static void dispatch(struct req *q, const Kvcached__Request *rq)
{
	switch (rq->op_case) {
	case KVCACHED__REQUEST__OP_HELLO: kv_op_hello(q, rq->hello); break;
	case KVCACHED__REQUEST__OP_REGISTER_POOL: kv_op_register(q, rq->register_pool); break;
	case KVCACHED__REQUEST__OP_ALLOC: kv_op_alloc(q, rq->alloc); break;
	case KVCACHED__REQUEST__OP_SEAL: kv_op_seal(q, rq->seal); break;
	case KVCACHED__REQUEST__OP_LOOKUP: kv_op_lookup(q, rq->lookup); break;
	case KVCACHED__REQUEST__OP_RELEASE: kv_op_release(q, rq->release); break;
	case KVCACHED__REQUEST__OP_FORK: kv_op_fork(q, rq->fork); break;
	case KVCACHED__REQUEST__OP_COW: kv_op_cow(q, rq->cow); break;
	case KVCACHED__REQUEST__OP_SWAP_OUT: kv_op_swap_out(q, rq->swap_out); break;
	case KVCACHED__REQUEST__OP_SWAP_IN: kv_op_swap_in(q, rq->swap_in); break;
	case KVCACHED__REQUEST__OP_STATS: kv_op_stats(q, rq->stats); break;
	case KVCACHED__REQUEST__OP_LIST_CLIENTS: kv_op_clients(q); break;
	case KVCACHED__REQUEST__OP_CHECK: kv_op_check(q); break;
	case KVCACHED__REQUEST__OP_EVICT: kv_op_evict(q, rq->evict); break;
	case KVCACHED__REQUEST__OP_FLUSH: kv_op_flush(q); break;
	case KVCACHED__REQUEST__OP_DRAIN: kv_op_drain(q, rq->drain); break;
	case KVCACHED__REQUEST__OP_RELOAD: kv_op_reload(q); break;
	case KVCACHED__REQUEST__OP_METRICS: kv_op_metrics(q, rq->metrics); break;
	case KVCACHED__REQUEST__OP_DUMP: kv_op_dump(q, rq->dump); break;
	default:
		kv_op_fail(q, KVCACHED__ERROR_CODE__EPROTO, -1, "unknown operation");
		break;
	}
}

enum kv_op_outcome kv_ops_dispatch(struct kv_daemon *d, struct kv_session *ss,
				   const Kvcached__Request *rq, Kvcached__Response *rs)
{
	struct req q = { .d = d, .ss = ss, .rs = rs, .blk = d->scratch, .out = KV_OP_REPLY };

	rs->id = rq->id;
	/* Pools that went idle since (in the tiers' work after the last batch,
	 * say) go first: a request sees no pool that nothing keeps. */
	kv_daemon_collect(d);
	if (!ss->ns && rq->op_case != KVCACHED__REQUEST__OP_HELLO)
		kv_op_fail(&q, KVCACHED__ERROR_CODE__EPROTO, -1, "the first request must be Hello");
	else if (!refused_draining(&q, rq))
		dispatch(&q, rq);
	/* A parked or held request changed nothing and is run again from the
	 * start. Only a reply with blocks sends the fds queued for it. */
	kv_assert((q.out != KV_OP_PARK && q.out != KV_OP_HOLD) || !rs->error);
	if (q.nsegs && (q.out != KV_OP_REPLY || rs->error))
		unwant_all(&q);
	kv_daemon_collect(d);
	return q.out;
}
