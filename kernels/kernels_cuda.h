/* The device kernels (kernels.cu), loaded from a fatbin embedded in the
 * program with cuModuleLoadData: no CUDA runtime, and the driver comes from
 * kernels/cudrv.h. Each launch function enqueues on a stream and returns at
 * once; the work is done when the stream says so.
 *
 * Work lists are arrays of struct kv_gather_desc (gather.h) at a
 * device-accessible address: device memory, or pinned host memory (which
 * unified addressing lets the kernel read directly). The array and every
 * buffer it names must stay valid until the kernel has finished.
 *
 * Every kernel gives exactly the bytes of its C reference: kv_qfmt_quant /
 * kv_qfmt_dequant (quant.h), kv_gather_run (gather.h), kv_crc32c
 * (crc32c.h); tests/test_kernels_gpu.c compares them on a GPU.
 *
 * Threads: a loaded set belongs to the context that was current at load;
 * launch from any thread with that context current. */
#ifndef KV_KERNELS_CUDA_H
#define KV_KERNELS_CUDA_H

#include <stdint.h>

#include "cudrv.h"
#include "gather.h"
#include "quant.h"

struct kv_cuda_kernels;

/* Loads the kernels into the calling thread's current context (kv_cu_load()
 * must have succeeded). Returns 0 and *out, or -errno with a description in
 * err (-ENOEXEC: no code in the fatbin for this GPU and its driver cannot
 * JIT the PTX, e.g. a driver older than CUDA 13). */
int kv_cuda_kernels_load(struct kv_cuda_kernels **out, char *err, unsigned errlen);

/* Unloads the module. NULL is fine. */
void kv_cuda_kernels_unload(struct kv_cuda_kernels *k);

/* Quantizes nd blocks of n elements of type t into format f (KV_QFMT_E4M3
 * or KV_QFMT_E5M2, quant.h): desc[i].src (n elements, 2-byte aligned) to
 * desc[i].dst (kv_quant_bytes(n, group) bytes, 4-byte aligned); len is not
 * used. The bytes are kv_qfmt_quant's. Returns 0 or -errno (-EINVAL for bad
 * arguments, else the launch's error). */
int kv_cuda_quant(struct kv_cuda_kernels *k, enum kv_qfmt f, enum kv_dtype t, uint64_t desc,
		  uint32_t nd, uint64_t n, uint64_t group, CUstream s);

/* The inverse (kv_qfmt_dequant's bytes): desc[i].src quantized (4-byte
 * aligned), desc[i].dst n elements of type t. */
int kv_cuda_dequant(struct kv_cuda_kernels *k, enum kv_qfmt f, enum kv_dtype t, uint64_t desc,
		    uint32_t nd, uint64_t n, uint64_t group, CUstream s);

/* Runs nd copies (gather or scatter, see kv_gather_plan): len bytes from
 * src to dst each. max_len, the largest len (0 if unknown: taken as 64 KiB),
 * sizes the grid: larger copies are split among several CUDA blocks. */
int kv_cuda_copy_batch(struct kv_cuda_kernels *k, uint64_t desc, uint32_t nd, uint64_t max_len,
		       CUstream s);

/* *(uint32_t *)desc[i].dst = kv_crc32c(0, desc[i].src, desc[i].len), for
 * i < nd (dst 4-byte aligned). */
int kv_cuda_crc32c(struct kv_cuda_kernels *k, uint64_t desc, uint32_t nd, CUstream s);

#endif
