/* Compress on demote on the cuda backend (backend_cuda.c's copy_async hook).
 *
 * A D2H copy with a format (struct kv_copy's qfmt) is not a memcpy: the
 * quantizing kernel (kernels/kernels_cuda.h) reads the block in device
 * memory and writes kv_quant_bytes(len / 2, KV_QUANT_GROUP) bytes straight
 * into the G2 slot through the slot's device address (the arena is pinned
 * and device-mapped), so the kernel is the copy and only the compressed
 * bytes cross the bus. An H2D copy with a format is the dequantizing kernel
 * reading the slot the same way and writing the block. Both run on the
 * device's copy stream in the batch's order, beside the batch's raw copies
 * (cuMemcpyBatchAsync), before the batch's event; the bytes are those of
 * kv_qfmt_quant / kv_qfmt_dequant (quant.h), which the host backend runs.
 *
 * Copies of one batch with the same (qfmt, qdtype, len) go in one launch.
 * Its descriptors (struct kv_gather_desc) live in pinned, device-mapped
 * memory that the batch's struct pending owns (struct kv_cudaq_descs): the
 * kernel reads them when it runs, so they are rewritten only once the
 * batch has completed, when backend_cuda.c hands the pending out again.
 *
 * Alignment: the kernels read 2-byte elements and write (read) 4-byte
 * scales at the start of the quantized form, so the block's device address
 * must be even and the slot's 4-byte aligned; copy_async refuses others
 * (-EINVAL). G2 slot payloads start 4 KiB into a page-aligned slot
 * (tier_int.h HDR_BYTES, slots.c), and blocks of an even size start at even
 * offsets, so the daemon never makes one.
 *
 * Threads: the loop thread, with the device's context current. */
#ifndef KV_BACKEND_CUDA_QUANT_H
#define KV_BACKEND_CUDA_QUANT_H

#include <cuda.h>
#include <stdint.h>

#include "backend.h"
#include "gather.h"

struct kv_cuda_kernels;

/* One quantizing copy, its addresses resolved: dev, the block's device
 * address; host, the slot's device-visible address; len, the block's bytes
 * (the slot side holds kv_quant_bytes(len / 2, KV_QUANT_GROUP)). */
struct kv_cudaq_copy {
	CUdeviceptr dev, host;
	uint64_t len;
	uint8_t qfmt, qdtype;
	uint8_t taken;                 /* kv_cudaq_launch's scratch */
};

/* A batch's descriptor memory: cap entries at host address h, device
 * address d. Zeroed: none yet. */
struct kv_cudaq_descs {
	struct kv_gather_desc *h;
	CUdeviceptr d;
	uint32_t cap;
};

/* Loads the kernels into the current context (that of CUDA device
 * ordinal). On failure logs a warning that says why and that compressing
 * pools stay raw, sets *k NULL and returns -errno. */
int kv_cudaq_load(int ordinal, struct kv_cuda_kernels **k);

/* Enqueues q[0, n) of direction dir (KV_COPY_D2H: quantize; KV_COPY_H2D:
 * dequantize) on stream s, a launch per (qfmt, qdtype, len), descriptors in
 * qd (grown as needed; it must not be in use by an unfinished batch).
 * *started: how many copies were enqueued, also on failure. Returns 0 or
 * -errno (-ENOMEM: no descriptor memory; a launch's error); the copies not
 * counted in *started were not enqueued. */
int kv_cudaq_launch(struct kv_cudaq_descs *qd, struct kv_cuda_kernels *k, enum kv_copy_dir dir,
		    struct kv_cudaq_copy *q, uint32_t n, CUstream s, uint32_t *started);

/* Frees qd's memory (nothing may still read it) and zeroes it. */
void kv_cudaq_descs_free(struct kv_cudaq_descs *qd);

#endif
