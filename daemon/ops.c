/* The op table and the dispatcher; see ops.h.
 *
 * One row per operation of the protocol (Redis's command table is the
 * model): its name (the metrics' op label), its handler, whether it is for
 * admin sessions only, and what a drain refuses of it. The row's place in
 * the table is its metrics slot. Dispatch, names, metrics and the drain
 * check read the table and nothing else; test_ops_table fails when an op of
 * kvcached.proto has no row. */
#include "ops.h"

#include <inttypes.h>
#include <stddef.h>

#include "kvassert.h"
#include "ops_admin.h"
#include "ops_block.h"
#include "ops_req.h"

/* Adapters: a row's handler takes the whole request. */
#define RUN(fn, field)                                                               \
	static void run_##fn(struct req *q, const Kvcached__Request *rq)             \
	{                                                                            \
		kv_op_##fn(q, rq->field);                                            \
	}
#define RUN0(fn)                                                                     \
	static void run_##fn(struct req *q, const Kvcached__Request *rq)             \
	{                                                                            \
		(void)rq;                                                            \
		kv_op_##fn(q);                                                       \
	}
RUN(hello, hello)
RUN(register, register_pool)
RUN(alloc, alloc)
RUN(seal, seal)
RUN(lookup, lookup)
RUN(release, release)
RUN(fork, fork)
RUN(cow, cow)
RUN(swap_out, swap_out)
RUN(swap_in, swap_in)
RUN(stats, stats)
RUN0(clients)
RUN0(check)
RUN(evict, evict)
RUN0(flush)
RUN(drain, drain)
RUN0(reload)
RUN(metrics, metrics)
RUN(dump, dump)

struct op_row {
	int op_case;          /* Kvcached__Request's op_case */
	const char *name;     /* the metrics' op label */
	void (*run)(struct req *q, const Kvcached__Request *rq);
	/* Admin sessions only: what the refusal calls the operation; NULL:
	 * every session. */
	const char *admin;
	/* While draining, what would take new memory or new references is
	 * refused ("no new <drain>"); NULL: goes on (releasing and sealing
	 * what a client holds, the operators' operations). */
	const char *drain;
};

#define OP(c) KVCACHED__REQUEST__OP_##c
static const struct op_row ops[] = {
	{ OP(HELLO), "hello", run_hello, NULL, NULL },
	{ OP(REGISTER_POOL), "register_pool", run_register, NULL, "pools" },
	{ OP(ALLOC), "alloc", run_alloc, NULL, "allocations" },
	{ OP(SEAL), "seal", run_seal, NULL, NULL },
	{ OP(LOOKUP), "lookup", run_lookup, NULL, "lookups or references" },
	{ OP(RELEASE), "release", run_release, NULL, NULL },
	{ OP(FORK), "fork", run_fork, NULL, "lookups or references" },
	{ OP(COW), "cow", run_cow, NULL, "allocations" },
	{ OP(SWAP_OUT), "swap_out", run_swap_out, NULL, NULL },
	{ OP(SWAP_IN), "swap_in", run_swap_in, NULL, "allocations" },
	{ OP(STATS), "stats", run_stats, NULL, NULL },
	{ OP(LIST_CLIENTS), "list_clients", run_clients, "listing clients", NULL },
	{ OP(CHECK), "check", run_check, "the invariant check", NULL },
	{ OP(EVICT), "evict", run_evict, "evict", NULL },
	{ OP(FLUSH), "flush", run_flush, "flush", NULL },
	{ OP(DRAIN), "drain", run_drain, "drain", NULL },
	{ OP(RELOAD), "reload", run_reload, "reload", NULL },
	{ OP(METRICS), "metrics", run_metrics, "metrics", NULL },
	{ OP(DUMP), "dump", run_dump, "dump", NULL },
};
#undef OP

/* The metrics have a slot per row and one for the rest ("other"). */
_Static_assert(sizeof(ops) / sizeof(ops[0]) == KV_DAEMON_OPS - 1,
	       "KV_DAEMON_OPS (daemon.h) must be the op table's rows + 1");

static const struct op_row *op_row(int op_case)
{
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		if (ops[i].op_case == op_case)
			return &ops[i];
	return NULL;
}

unsigned kv_ops_index(int op_case)
{
	const struct op_row *r = op_row(op_case);

	return r ? (unsigned)(r - ops) : KV_DAEMON_OPS - 1;
}

const char *kv_ops_name(unsigned index)
{
	return index < KV_DAEMON_OPS - 1 ? ops[index].name : "other";
}

/* While draining, what the row says is refused. */
static void refuse_draining(struct req *q, const char *what)
{
	uint64_t now = kv_mono_ms();
	uint64_t left = q->d->drain_deadline_ms > now ? q->d->drain_deadline_ms - now : 0;

	kv_op_fail(q, KVCACHED__ERROR_CODE__ESHUTDOWN, -1,
		   "kvcached is shutting down: no new %s; release what you hold and disconnect "
		   "(the daemon exits within %" PRIu64 " s)", what, (left + 999) / 1000);
}

static void dispatch(struct req *q, const Kvcached__Request *rq)
{
	const struct op_row *r = op_row(rq->op_case);

	if (!r) {
		kv_op_fail(q, KVCACHED__ERROR_CODE__EPROTO, -1, "unknown operation");
		return;
	}
	if (r->drain && q->d->draining) {
		refuse_draining(q, r->drain);
		return;
	}
	if (r->admin && !kv_session_is_admin(q->ss)) {
		kv_op_fail(q, KVCACHED__ERROR_CODE__EPERM, -1,
			   "%s is an admin operation: use the admin socket (%s), or connect as root "
			   "or the daemon's uid", r->admin, q->d->cfg.admin_socket_path);
		return;
	}
	r->run(q, rq);
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
	else
		dispatch(&q, rq);
	/* A parked or held request changed nothing and is run again from the
	 * start. Only a reply with blocks sends the fds queued for it. */
	kv_assert((q.out != KV_OP_PARK && q.out != KV_OP_HOLD) || !rs->error);
	if (q.nsegs && (q.out != KV_OP_REPLY || rs->error))
		kv_op_unwant_all(&q);
	kv_daemon_collect(d);
	return q.out;
}
