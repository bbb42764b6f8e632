/* A request being handled, and the helpers every handler shares
 * (ops_req.c): arena allocation, error replies, handle resolution, the
 * reference bound, segment fds and block replies. Used by the dispatcher
 * (ops.c) and the handlers (ops_block.c, ops_admin.c); not by other modules:
 * they call kv_ops_dispatch().
 *
 * A handler returns nothing: it fills q->rs with a result or an error and
 * leaves the outcome in q->out. q_alloc() turns a failed allocation into
 * KV_OP_NOMEM, kv_op_fail() an EPROTO error into KV_OP_CLOSE, so a handler
 * just returns once it has set a reply or seen NULL. */
#ifndef KV_OPS_REQ_H
#define KV_OPS_REQ_H

#include "ops.h"

#define HASH KV_HASH_BYTES

/* A segment whose fd the request queued, and what the session had before. */
struct req_seg {
	uint32_t dev, seg, old;
};

struct req {
	struct kv_daemon *d;
	struct kv_session *ss;
	Kvcached__Response *rs;
	struct kv_block **blk;     /* d->scratch: max_batch entries */
	enum kv_op_outcome out;
	/* kv_op_want_segments(): the fds queued for the reply, in order. */
	struct req_seg *segs;
	size_t nsegs, segs_cap;
	uint64_t fds_before;       /* the session's fds out before the first */
	int refreshed;             /* d->refresh_fds has run for this request */
};

/* n bytes from the request arena, or NULL with q->out = KV_OP_NOMEM. */
void *q_alloc(struct req *q, size_t n);
/* A copy of s in the request arena, or NULL (KV_OP_NOMEM). */
char *q_strdup(struct req *q, const char *s);

/* The longest error message a reply carries (longer ones are cut). */
#define KV_OP_MSG_MAX 512

/* Sets the error reply (EPROTO also closes the session). */
void kv_op_fail(struct req *q, Kvcached__ErrorCode code, int index, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* The protocol's code for -errno from the tiers. */
Kvcached__ErrorCode kv_op_errno_code(int r);

/* The pool id names in this session's namespace, or NULL (error set). */
struct kv_pool *kv_op_pool(struct req *q, uint32_t id);
/* Resolves handles[0..n) into q->blk, each a block this session holds, of
 * pool p when p is given. At most `per` references per block may be listed
 * (0: as many as the session holds). Returns 0, or -errno with the error
 * reply set: -EINVAL or -E2BIG (batch size), -ESTALE (not held), -EBUSY
 * (listed more often than held). */
int kv_op_resolve(struct req *q, struct kv_pool *p, const uint64_t *handles, size_t n,
		  uint32_t per);
/* 0 when b may take n more references: it would then carry at most
 * max_block_refs (a client forking or looking up one block over and over
 * would otherwise run its count up to the mechanism's KV_BLOCK_REF_MAX, and
 * every other holder of the block with it). Else -EDQUOT, with the EQUOTA
 * reply set, naming b and index, its first listing in the request. Changes
 * nothing: handlers check every block before they take any reference. */
int kv_op_ref_room(struct req *q, const struct kv_block *b, size_t index, uint32_t n);
/* kv_op_ref_room() not counting mine of b's references (mine <= b->ref): the
 * request's own, which go before it ends (a rerun Lookup's pins). */
int kv_op_ref_room_less(struct req *q, const struct kv_block *b, size_t index, uint32_t n,
			uint32_t mine);
/* Queues the fd of every segment that blocks[0..n) (NULL entries skipped)
 * live in and the session has not been sent, for the reply. Call it before
 * the request changes what cannot be taken back; several times if need be.
 * Returns 0, or, with everything this request queued taken back:
 * -EBUSY  with q->out KV_OP_HOLD: the session has fds out, and these would
 *         take it past max_fds_per_connection (no reply: the request runs
 *         again once its peer has read them);
 * -EAGAIN with the EAGAIN reply set: the daemon's fds in flight
 *         (kv_daemon_fds_max) or its fd table are full for now.
 * The handler must then undo what it did and return. */
int kv_op_want_segments(struct req *q, struct kv_block *const *blocks, size_t n);
/* kv_op_want_segments()'s checks for up to n fds, queuing nothing (before a
 * change that cannot be undone, when the blocks are not known yet). */
int kv_op_fds_room(struct req *q, uint64_t n);
/* Replies with the handles of q->blk[0..n) and the segments
 * kv_op_want_segments() queued; every block's segment must be the
 * session's. */
void kv_op_reply_blocks(struct req *q, size_t n);
/* kv_op_reply_blocks() in two parts, for a handler that writes the handles
 * while it has the blocks in cache (issue 38: Lookup's references and its
 * reply in one pass over the chain): the handle of each of blk[0..n) into
 * h[0..n) (any stretch at a time; each block's segment the session's), then
 * the reply of h (the caller's q_alloc(), all n written) and the segments. */
void kv_op_handles(struct req *q, struct kv_block *const *blk, size_t n, uint64_t *h);
void kv_op_reply_handles(struct req *q, uint64_t *h, size_t n);

/* Takes back every fd q queued, last first (a reply that carries no
 * blocks sends none). */
void kv_op_unwant_all(struct req *q);

#endif
