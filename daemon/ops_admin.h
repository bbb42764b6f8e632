/* The operators' operations (ops_admin.c): Stats, ListClients, Check,
 * Evict, Flush, Drain, Reload, Metrics, Dump. Called through the op table
 * (ops.c) only, which refuses every one but Stats to a session that is not
 * admin before the handler runs. */
#ifndef KV_OPS_ADMIN_H
#define KV_OPS_ADMIN_H

#include "ops_req.h"

void kv_op_stats(struct req *q, const Kvcached__Stats *m);
void kv_op_clients(struct req *q);
void kv_op_check(struct req *q);
void kv_op_evict(struct req *q, const Kvcached__Evict *m);
void kv_op_flush(struct req *q);
void kv_op_drain(struct req *q, const Kvcached__Drain *m);
void kv_op_reload(struct req *q);
void kv_op_metrics(struct req *q, const Kvcached__Metrics *m);
void kv_op_dump(struct req *q, const Kvcached__Dump *m);

#endif
