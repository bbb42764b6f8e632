/* The block operations (ops_block.c): Hello, RegisterPool, Alloc, Seal,
 * Lookup, Release, Fork, Cow, SwapOut, SwapIn. Called through the op table
 * (ops.c) only. */
#ifndef KV_OPS_BLOCK_H
#define KV_OPS_BLOCK_H

#include "ops_req.h"

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

#endif
