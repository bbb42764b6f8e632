#include "hugemem.h"

#include <stdint.h>
#include <sys/mman.h>

void *kv_huge_map(size_t bytes, int noreserve)
{
	uint8_t *m, *a;

	m = mmap(NULL, bytes + KV_HUGE_BYTES, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | (noreserve ? MAP_NORESERVE : 0), -1, 0);
	if (m == MAP_FAILED)
		return NULL;
	/* Aligned to a huge page: what is before and after goes back. */
	a = (uint8_t *)(((uintptr_t)m + KV_HUGE_BYTES - 1) & ~(uintptr_t)(KV_HUGE_BYTES - 1));
	if (a > m)
		munmap(m, (size_t)(a - m));
	munmap(a + bytes, (size_t)(m + KV_HUGE_BYTES - a));
	(void)madvise(a, bytes, MADV_HUGEPAGE);
	return a;
}

void kv_huge_unmap(void *p, size_t bytes)
{
	if (p)
		munmap(p, bytes);
}
