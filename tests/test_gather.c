/* Gather/scatter reference: many small blocks of assorted sizes gathered
 * into one staging buffer back to back, then scattered into fresh blocks:
 * every byte lands where the plan says. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gather.h"

#define N 100

int main(void)
{
	uint8_t *blk[N], *back[N], *staging;
	uint64_t addr[N], baddr[N], lens[N], total = 0, off = 0;
	struct kv_gather_desc d[N];
	size_t i, j;

	for (i = 0; i < N; i++) {
		lens[i] = (i * 37) % 300 + (i % 3 == 0 ? 65536 : 1);
		blk[i] = malloc(lens[i]);
		back[i] = calloc(1, lens[i]);
		CHECK(blk[i] && back[i]);
		for (j = 0; j < lens[i]; j++)
			blk[i][j] = (uint8_t)(i * 131 + j * 7);
		addr[i] = (uintptr_t)blk[i];
		baddr[i] = (uintptr_t)back[i];
		total += lens[i];
	}
	staging = malloc(total);
	CHECK(staging != NULL);
	CHECK_EQ(kv_gather_plan(d, (uintptr_t)staging, addr, lens, N, 0), total);
	kv_gather_run(d, N);
	for (i = 0; i < N; i++) {
		CHECK(d[i].src == addr[i] && d[i].dst == (uintptr_t)staging + off);
		CHECK(memcmp(staging + off, blk[i], lens[i]) == 0);
		off += lens[i];
	}
	CHECK_EQ(kv_gather_plan(d, (uintptr_t)staging, baddr, lens, N, 1), total);
	kv_gather_run(d, N);
	for (i = 0; i < N; i++) {
		CHECK(memcmp(back[i], blk[i], lens[i]) == 0);
		free(blk[i]);
		free(back[i]);
	}
	kv_gather_run(d, 0);
	free(staging);
	return 0;
}
