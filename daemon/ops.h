/* Request handlers: what each protocol operation does to the references a
 * session holds. Who may do what is checked here; what the cache finds,
 * publishes and parks for is cache.h's; pool.c is mechanism. ops.c holds the
 * op table and dispatches; ops_block.c has the block operations, ops_admin.c the
 * operators' ones; ops_req.c the helpers they share; the prefix cache
 * itself is cache.c's.
 *
 * Batched operations are validated whole before anything changes, so a bad
 * handle at index i fails the request with nothing done (Error.index = i).
 * The segment fds a reply needs are queued before the request changes what
 * cannot be taken back: when they cannot be passed now (the daemon's fds in
 * flight, or its fd table, are full) the request is answered EAGAIN with
 * nothing changed, and the session carries on.
 *
 * The dispatcher needs no socket and no event loop: a daemon context and a
 * session are all it takes, so tests and fuzzers can drive it directly. */
#ifndef KV_OPS_H
#define KV_OPS_H

#include "daemon.h"
#include "kvcached.pb-c.h"
#include "session.h"

/* What became of a request. */
enum kv_op_outcome {
	KV_OP_REPLY,     /* rs holds the reply (a result or an error) */
	KV_OP_CLOSE,     /* rs holds an EPROTO error: send it, then close */
	KV_OP_PARK,      /* the request waits for a tier (ss->waiter is queued on
			  * it); nothing changed and no reply: run the same
			  * request again when woken */
	KV_OP_NOMEM,     /* no reply could be built: close the session */
	KV_OP_HOLD,      /* the reply would need more segment fds than this
			  * session may have out (max_fds_per_connection) while
			  * its peer has not read those it was sent: nothing
			  * changed and no reply; run the same request again
			  * once the peer has read them all */
};

/* The operations by name, for the per-operation metrics (metrics.c):
 * kv_ops_index() maps a request's op_case to its row of the op table (ops.c),
 * 0..KV_DAEMON_OPS - 2, and anything else (an unknown operation) to
 * KV_DAEMON_OPS - 1, "other". kv_ops_name() is the name of a slot. */
unsigned kv_ops_index(int op_case);
const char *kv_ops_name(unsigned index);

/* Runs rq for ss and fills rs, allocated from d->arena (valid until the
 * arena is reset, which the caller does after packing rs). */
enum kv_op_outcome kv_ops_dispatch(struct kv_daemon *d, struct kv_session *ss,
				   const Kvcached__Request *rq, Kvcached__Response *rs);

#endif
