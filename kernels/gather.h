/* Batched gather/scatter of many small blocks into one contiguous staging
 * buffer and back: for block sizes where one copy per block cannot reach the
 * bus bandwidth (per-copy overhead), one kernel launch moves them all.
 *
 * A batch is a list of descriptors, each a plain copy of len bytes from src
 * to dst; gather and scatter are the two ways of planning one (staging as
 * the destinations or as the sources). The device kernel (kernels.cu,
 * kv_cuda_copy_batch) takes device addresses, or host addresses of pinned
 * mapped memory; this reference takes host addresses. Descriptors of one
 * batch must not overlap (they run in any order). */
#ifndef KV_GATHER_H
#define KV_GATHER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct kv_gather_desc {
	uint64_t dst;  /* address */
	uint64_t src;  /* address */
	uint64_t len;  /* bytes */
};

/* Fills d[0..n): blocks[i] (lens[i] bytes) to staging, back to back in list
 * order (scatter != 0: the reverse, staging to blocks[i]). Returns the
 * staging bytes the batch covers. */
uint64_t kv_gather_plan(struct kv_gather_desc *d, uint64_t staging, const uint64_t *blocks,
			const uint64_t *lens, size_t n, int scatter);

/* Runs a batch on the host: memcpy for each descriptor (host addresses). */
void kv_gather_run(const struct kv_gather_desc *d, size_t n);

#ifdef __cplusplus
}
#endif
#endif
