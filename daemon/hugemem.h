/* Anonymous mappings in transparent huge pages where the kernel gives them:
 * the address aligned to a huge page, the size a multiple of one. For the
 * daemon's large metadata arrays that are read at random (the index's
 * buckets, the runs' structs): with 4 KiB pages each such read was a TLB
 * miss as well as a cache miss (issue 38). A leaf. */
#ifndef KV_HUGEMEM_H
#define KV_HUGEMEM_H

#include <stddef.h>

#define KV_HUGE_BYTES ((size_t)2 << 20)

static inline size_t kv_huge_round(size_t bytes)
{
	return (bytes + KV_HUGE_BYTES - 1) & ~(KV_HUGE_BYTES - 1);
}

/* bytes (a multiple of KV_HUGE_BYTES) of zeroes; noreserve: backed only as
 * touched (MAP_NORESERVE). The huge pages are a hint: without them, 4 KiB
 * pages. NULL when the mapping cannot be made. */
void *kv_huge_map(size_t bytes, int noreserve);
void kv_huge_unmap(void *p, size_t bytes);

#endif
