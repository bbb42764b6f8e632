/* A promotion that must make room in G1 first, with two pools of different
 * block sizes and a host tier too full to take the other pool's block: the
 * demotion it starts for room looks for a G2 slot, finds none that fits and
 * drops the oldest idle G2 copy, which is the very block being promoted. It
 * must not be: the promotion pins what it promotes (found by fuzzing the
 * dispatcher; a release daemon died with SIGSEGV, ASan saw a use after free).
 *
 * Sizes are the ones of the report: a 64 KiB pool of 4 KiB pages in 16 KiB
 * segments and a 64 KiB host tier; pool A of 4 KiB blocks (8 KiB G2 slots),
 * pool B of 8 KiB blocks (12 KiB slots). G2 is full: seven of A's blocks
 * swapped out and the one cached copy the lookup asks for, the only idle one.
 * Demotion ahead of need is off (demote_low 0), so that G2 holds exactly
 * that. After the lookup: the daemon is alive, the block is served with its
 * bytes, and the invariant check is clean. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define A_BYTES 4096
#define B_BYTES 8192

int main(void)
{
	struct kvt_daemon d;
	struct kvt_tier t1, t2;
	kvc_conn *c;
	kvc_block b[16], hold[16], got;
	kvc_hash h;
	int pa, pb, i, n, held;
	uint64_t swap;

	if (kvt_cuda())
		return 77;  /* the sizes are the host backend's */
	kvt_start(&d, "--pool-size", "64KiB", "--segment-size", "16KiB", "--page-size", "4KiB",
		  "--host-tier-size", "64KiB", "--demote-low", "0", "--demote-high", "0", NULL);
	c = kvt_connect(NULL);
	pa = kvt_pool(c, "a", A_BYTES);
	pb = kvt_pool(c, "b", B_BYTES);

	/* G2 (64 KiB): 7 of pool A's blocks swapped out (7 slots of 8 KiB),
	 * then block HA, cached, demoted into the last slot: the only idle G2
	 * copy, so the one any eviction from G2 drops. */
	CHECK_EQ(kvc_alloc(c, pa, 7, b), 7);
	CHECK_EQ(kvc_swap_out(c, b, 7, &swap), 0);
	kvt_tiers_settle();
	h = kvt_hash(100);
	CHECK_EQ(kvc_alloc(c, pa, 1, b), 1);
	kvt_mem_fill(c, kvc_block_ptr(c, b[0]), A_BYTES, 100);
	CHECK_EQ(kvc_seal(c, pa, b, &h, 1, b), 1);
	CHECK_EQ(kvc_release(c, b, 1), 0);
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	kvt_tier(1, &t2);
	fprintf(stderr, "G2: %llu blocks (7 swapped, 1 cached), %llu of %llu bytes used\n",
		(unsigned long long)t2.blocks, (unsigned long long)t2.used,
		(unsigned long long)t2.capacity);
	CHECK_EQ(t2.blocks, 8);
	CHECK_EQ(t2.used, t2.capacity);

	/* Pool B fills G1 with cached blocks: no free room for A's promotion. */
	for (i = 0, n = 0; i < 16; i++) {
		h = kvt_hash(200 + (uint64_t)i);
		if (kvc_alloc(c, pb, 1, b) != 1)
			break;
		CHECK_EQ(kvc_seal(c, pb, b, &h, 1, b), 1);
		CHECK_EQ(kvc_release(c, b, 1), 0);
		n++;
	}
	/* Pool A takes what is left of G1 (its spare run, free pages) and
	 * holds it: its promotion finds no free room. */
	for (held = 0; held < 16; held++) {
		kvt_tier(0, &t1);
		if (t1.used >= t1.capacity)
			break;
		CHECK_EQ(kvc_alloc(c, pa, 1, &hold[held]), 1);
	}
	kvt_tier(0, &t1);
	fprintf(stderr, "G1: %d blocks of pool b cached, %d of pool a held, %llu of %llu bytes "
		"used\n", n, held, (unsigned long long)t1.used, (unsigned long long)t1.capacity);
	CHECK_EQ(t1.used, t1.capacity);

	/* The lookup of A's oldest G2 block. */
	h = kvt_hash(100);
	n = kvc_lookup(c, pa, &h, 1, &got);
	fprintf(stderr, "lookup: %s\n", n == 1 ? "served from G2" : "a miss");
	CHECK(kvt_alive(&d));
	/* Served: G1 room comes from pool B's cached blocks (dropped, since
	 * G2 has no slot for them), never from the block being promoted. */
	CHECK_EQ(n, 1);
	CHECK(kvt_mem_verify(c, kvc_block_ptr(c, got), A_BYTES, 100));
	CHECK_EQ(kvc_release(c, &got, 1), 0);
	CHECK_EQ(kvt_check(), 0);
	CHECK_EQ(kvc_release(c, hold, (size_t)held), 0);
	kvc_close(c);
	kvt_stop(&d);
	return 0;
}
