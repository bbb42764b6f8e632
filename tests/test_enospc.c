/* A pool full of held blocks answers ENOSPC with the numbers and keeps
 * working; a pool full of cached blocks evicts LRU, a chain's tail first and
 * older chains before newer ones. */
#include <string.h>

#include "harness.h"

#define BB 32768
#define NB 64   /* 2 MiB pool (the smallest on cuda) of 32 KiB blocks */

int main(void)
{
	struct kvt_daemon d;
	kvc_conn *c;
	kvc_block b[NB], x[NB];
	kvc_hash h[NB];
	int pool, i;

	kvt_start(&d, "--pool-size", "2MiB", "--page-size", "128KiB", NULL);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BB);
	CHECK_EQ(kvc_alloc(c, pool, NB, b), NB);
	CHECK_EQ(kvc_alloc(c, pool, 1, x), KVC_ENOSPC);
	fprintf(stderr, "ENOSPC says: %s\n", kvc_last_error(c));
	CHECK(strstr(kvc_last_error(c), "64 writable") != NULL);
	CHECK(strstr(kvc_last_error(c), "(0 pages free") != NULL);
	/* All or nothing: 65 fails even after freeing one. */
	CHECK_EQ(kvc_release(c, b, 1), 0);
	CHECK_EQ(kvc_alloc(c, pool, 2, x), KVC_ENOSPC);
	CHECK_EQ(kvc_alloc(c, pool, 1, b), 1);

	/* Seal everything as one chain, release head first. */
	for (i = 0; i < NB; i++)
		h[i] = kvt_hash((uint64_t)i);
	CHECK_EQ(kvc_seal(c, pool, b, h, NB, b), NB);
	CHECK_EQ(kvc_release(c, b, NB), 0);
	CHECK_EQ(kvt_check(), 0);
	/* 8 new blocks evict the chain's last 8. */
	CHECK_EQ(kvc_alloc(c, pool, 8, x), 8);
	CHECK_EQ(kvc_lookup(c, pool, h, NB, b), NB - 8);
	CHECK_EQ(kvc_release(c, b, NB - 8), 0);
	CHECK_EQ(kvc_release(c, x, 8), 0);

	/* Two chains A (older) and B: pressure takes A's tail, then A's head,
	 * and B only after A is gone. */
	CHECK_EQ(kvc_alloc(c, pool, NB, x), NB);   /* evicts everything */
	CHECK_EQ(kvc_release(c, x, NB), 0);
	{
		kvc_hash ha[32], hb[32];
		kvc_block ba[32], bb[32];

		for (i = 0; i < 32; i++) {
			ha[i] = kvt_hash(1000 + (uint64_t)i);
			hb[i] = kvt_hash(2000 + (uint64_t)i);
		}
		CHECK_EQ(kvc_alloc(c, pool, 32, ba), 32);
		CHECK_EQ(kvc_seal(c, pool, ba, ha, 32, ba), 32);
		CHECK_EQ(kvc_release(c, ba, 32), 0);
		CHECK_EQ(kvc_alloc(c, pool, 32, bb), 32);
		CHECK_EQ(kvc_seal(c, pool, bb, hb, 32, bb), 32);
		CHECK_EQ(kvc_release(c, bb, 32), 0);
		CHECK_EQ(kvc_alloc(c, pool, 16, x), 16);
		CHECK_EQ(kvc_lookup(c, pool, ha, 32, ba), 16);
		CHECK_EQ(kvc_release(c, ba, 16), 0);
		CHECK_EQ(kvc_lookup(c, pool, hb, 32, bb), 32);
		CHECK_EQ(kvc_release(c, bb, 32), 0);
		CHECK_EQ(kvc_release(c, x, 16), 0);
		/* A lookup refreshes: A's head is now newer than B. */
		CHECK_EQ(kvc_lookup(c, pool, ha, 16, ba), 16);
		CHECK_EQ(kvc_release(c, ba, 16), 0);
		CHECK_EQ(kvc_alloc(c, pool, 40, x), 40);   /* 16 free + 24 evicted */
		CHECK_EQ(kvc_lookup(c, pool, hb, 32, bb), 8);   /* B lost its tail 24 */
		CHECK_EQ(kvc_release(c, bb, 8), 0);
		CHECK_EQ(kvc_lookup(c, pool, ha, 16, ba), 16);
		CHECK_EQ(kvc_release(c, ba, 16), 0);
		CHECK_EQ(kvc_release(c, x, 40), 0);
	}
	CHECK_EQ(kvt_check(), 0);

	/* test_cow_enospc_numbers: a Cow of 6 sealed blocks with room for 2
	 * says what the Cow needs (6) and what the pool holds without the 2
	 * copies it took and gave back (it said 1 block and 58 writable). */
	{
		kvc_hash hs[6];
		kvc_block s[6], y[6];

		CHECK_EQ(kvc_alloc(c, pool, NB - 8, x), NB - 8);
		CHECK_EQ(kvc_alloc(c, pool, 6, s), 6);
		for (i = 0; i < 6; i++)
			hs[i] = kvt_hash(3000 + (uint64_t)i);
		CHECK_EQ(kvc_seal(c, pool, s, hs, 6, s), 6);
		CHECK_EQ(kvc_cow(c, s, 6, y), KVC_ENOSPC);
		fprintf(stderr, "Cow ENOSPC says: %s\n", kvc_last_error(c));
		CHECK(strstr(kvc_last_error(c), "cannot get 6 more blocks") != NULL);
		CHECK(strstr(kvc_last_error(c), "holds 56 writable + 6 sealed") != NULL);
		CHECK_EQ(kvt_check(), 0);
		/* The caller's blocks are as they were: 2 copies fit. */
		CHECK_EQ(kvc_cow(c, s, 2, y), 2);
		CHECK_EQ(kvc_release(c, y, 2), 0);
		CHECK_EQ(kvc_release(c, s + 2, 4), 0);
		CHECK_EQ(kvc_release(c, x, NB - 8), 0);
	}
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_stop(&d);
	return 0;
}
