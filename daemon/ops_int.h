/* What the request handlers share (ops.c, ops_block.c, ops_admin.c). Not for
 * other modules: they call kv_ops_dispatch().
 *
 * A handler returns nothing: it fills q->rs with a result or an error and
 * leaves the outcome in q->out. q_alloc() turns a failed allocation into
 * KV_OP_NOMEM, kv_op_fail() an EPROTO error into KV_OP_CLOSE, so a handler
 * just returns once it has set a reply or seen NULL. */
#ifndef KV_OPS_INT_H
#define KV_OPS_INT_H

#include "ops.h"

#define HASH KV_HASH_BYTES

struct req {
	struct kv_daemon *d;
	struct kv_session *ss;
	Kvcached__Response *rs;
	struct kv_block **blk;     /* d->scratch: max_batch entries */
	enum kv_op_outcome out;
};

/* n bytes from the request arena, or NULL with q->out = KV_OP_NOMEM. */
void *q_alloc(struct req *q, size_t n);
/* A copy of s in the request arena, or NULL (KV_OP_NOMEM). */
char *q_strdup(struct req *q, const char *s);

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
/* 1 when b may take n more references: it would then carry at most
 * max_block_refs (a client forking or looking up one block over and over
 * would otherwise run its count up to the mechanism's KV_BLOCK_REF_MAX, and
 * every other holder of the block with it). Else 0, with the EQUOTA reply
 * set, naming b and index, its first listing in the request. Changes
 * nothing: handlers check every block before they take any reference. */
int kv_op_ref_room(struct req *q, const struct kv_block *b, size_t index, uint32_t n);
/* Replies with the handles of q->blk[0..n), sending the fd of every segment
 * they live in that this session has not seen yet. */
void kv_op_reply_blocks(struct req *q, size_t n);

/* ops_block.c */
void kv_op_hello(struct req *q, const Kvcached__Hello *h);
void kv_op_register(struct req *q, const Kvcached__RegisterPool *m);
void kv_op_alloc(struct req *q, const Kvcached__Alloc *m);
void kv_op_seal(struct req *q, const Kvcached__Seal *m);
void kv_op_lookup(struct req *q, const Kvcached__Lookup *m);
void kv_op_release(struct req *q, const Kvcached__Release *m);
void kv_op_fork(struct req *q, const Kvcached__Fork *m);
void kv_op_cow(struct req *q, const Kvcached__Cow *m);
void kv_op_swap_out(struct req *q, const Kvcached__SwapOut *m);
void kv_op_swap_in(struct req *q, const Kvcached__SwapIn *m);

/* ops_admin.c */
void kv_op_stats(struct req *q);
void kv_op_clients(struct req *q);
void kv_op_check(struct req *q);
void kv_op_evict(struct req *q, const Kvcached__Evict *m);
void kv_op_flush(struct req *q);
void kv_op_drain(struct req *q, const Kvcached__Drain *m);
void kv_op_reload(struct req *q);
void kv_op_metrics(struct req *q);

#endif
