/* Reference gather/scatter; see gather.h. */
#include "gather.h"

#include <string.h>

uint64_t kv_gather_plan(struct kv_gather_desc *d, uint64_t staging, const uint64_t *blocks,
			const uint64_t *lens, size_t n, int scatter)
{
	uint64_t off = 0;
	size_t i;

	for (i = 0; i < n; i++) {
		d[i].dst = scatter ? blocks[i] : staging + off;
		d[i].src = scatter ? staging + off : blocks[i];
		d[i].len = lens[i];
		off += lens[i];
	}
	return off;
}

void kv_gather_run(const struct kv_gather_desc *d, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (d[i].len)
			memcpy((void *)(uintptr_t)d[i].dst, (const void *)(uintptr_t)d[i].src,
			       d[i].len);
}
