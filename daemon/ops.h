/* Request handlers: what each protocol operation does to the pools and to
 * the references a session holds. Policy lives here; pool.c is mechanism.
 *
 * Batched operations are validated whole before anything changes, so a bad
 * handle at index i fails the request with nothing done (Error.index = i). */
#ifndef KV_OPS_H
#define KV_OPS_H

#include "kvcached.pb-c.h"
#include "server.h"

/* kv_ops_handle() result that asks the server to close the session after
 * sending the reply (protocol violations). */
#define KV_OPS_CLOSE 1
/* kv_ops_handle() result: the request waits for a tier (ss->waiter is queued
 * on what it waits for). Nothing was changed and no reply built: the server
 * keeps the frame and runs it again when woken. */
#define KV_OPS_PARK 2

/* Fills rs (allocated from s->arena) for rq. Returns 0, KV_OPS_CLOSE, or
 * -ENOMEM when no reply could be built. */
int kv_ops_handle(struct kv_server *s, struct kv_session *ss, const Kvcached__Request *rq,
		  Kvcached__Response *rs);

#endif
