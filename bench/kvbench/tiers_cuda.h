/* kvbench section g on the cuda backend (tiers_cuda.c): the blocks are GPU
 * memory, so kvbench reaches them through the copy engine only. Every
 * function dies on a CUDA error (kvbench's habit: nothing returns an error)
 * and, in a build without CUDA, tier_dev_init() dies saying so and the
 * others are never reached. One thread: the one that called init. */
#ifndef KVBENCH_TIERS_CUDA_H
#define KVBENCH_TIERS_CUDA_H

#include <stdbool.h>
#include <stdint.h>

/* Makes device 0's primary context current on this thread (the client
 * library then maps the daemon's segments for it); before the first block. */
void tier_dev_init(void);
void tier_dev_fini(void);

/* Pinned host memory of bytes, or NULL; tier_dev_host_free() accepts NULL. */
void *tier_dev_host_alloc(uint64_t bytes);
void tier_dev_host_free(void *p);

/* Synchronous copies into / out of a block (dst / src: kvc_block_ptr()). */
void tier_dev_write(void *dst, const void *src, uint64_t bytes);
void tier_dev_read(void *dst, const void *src, uint64_t bytes);

/* GB/s (10^9) of cuMemcpyDtoHAsync (d2h) or cuMemcpyHtoDAsync of bytes in
 * block-sized calls on one stream between device memory and pinned host
 * memory, best of 3: the copy engine's floor; 0 when it cannot be measured. */
double tier_copy_floor(bool d2h, uint64_t bytes, uint64_t block);

#endif
