/* A Lookup's reply says the tier each block came from (BlockList.tiers,
 * kvc_lookup_tiers(); issue 34: vLLM's get_external_cache_hit_sources).
 *
 * One chain of six blocks, two in each of G1, G2 and G3 (sealed, then moved
 * down with the admin Evict and Flush): the lookup parks behind the
 * promotions and runs again, and its reply still says G1, G1, G2, G2, G3,
 * G3, every byte checked. Looked up again, all six are G1. kvc_lookup()
 * and kvc_lookup_tiers() without tiers answer the same blocks. (G4: in
 * test_g4_ahead, which has a Redis Cluster.) */
#include "harness.h"

#define BB 16384
#define N 6

static char dir[64], disk[128];

static uint64_t seed_of(int i)
{
	return 4242 + (uint64_t)i;
}

/* Seals blocks i0, i0 + 1 of the chain h (bytes seed_of(i)) and releases
 * them: cached in G1. */
static void put(kvc_conn *c, int pool, const kvc_hash *h, int i0)
{
	kvc_block b[2];

	CHECK_EQ(kvc_alloc(c, pool, 2, b), 2);
	for (int j = 0; j < 2; j++)
		kvt_mem_fill(c, kvc_block_ptr(c, b[j]), BB, seed_of(i0 + j));
	CHECK_EQ(kvc_seal(c, pool, b, h + i0, 2, b), 2);
	CHECK_EQ(kvc_release(c, b, 2), 0);
}

static void lookup_all(kvc_conn *c, int pool, const kvc_hash *h, const uint8_t *want)
{
	kvc_block b[N];
	uint8_t t[N];
	int k;

	memset(t, 0xee, sizeof(t));
	k = kvc_lookup_tiers(c, pool, h, N, b, t);
	if (k < 0)
		fprintf(stderr, "lookup: %s (%s)\n", kvc_strerror(k), kvc_last_error(c));
	CHECK_EQ(k, N);
	for (int i = 0; i < N; i++) {
		fprintf(stderr, "block %d: G%d\n", i, t[i] + 1);
		CHECK_EQ(t[i], want[i]);
		CHECK(kvt_mem_verify(c, kvc_block_ptr(c, b[i]), BB, seed_of(i)));
	}
	CHECK_EQ(kvc_release(c, b, N), 0);
}

int main(void)
{
	static const uint8_t mixed[N] = { KVC_TIER_G1, KVC_TIER_G1, KVC_TIER_G2, KVC_TIER_G2,
					  KVC_TIER_G3, KVC_TIER_G3 };
	static const uint8_t g1[N] = { 0 };
	struct kvt_daemon d;
	struct kvt_tier t2, t3;
	kvc_hash h[N];
	kvc_block b[N];
	kvc_conn *c;
	int pool;

	if (kvt_cuda())
		SKIP("host backend only (what the tiers say does not depend on it)");
	snprintf(dir, sizeof(dir), "/tmp/kvt-lt.XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	snprintf(disk, sizeof(disk), "%s/g3", dir);
	kvt_start(&d, "--pool-size", "1MiB", "--page-size", "64KiB", "--host-tier-size", "1MiB",
		  "--disk-path", disk, "--disk-size", "4MiB", NULL);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "lt", BB);
	for (int i = 0; i < N; i++)
		h[i] = kvt_hash(900 + (uint64_t)i);

	/* Blocks 4, 5 to G3; 2, 3 to G2; 0, 1 stay in G1. */
	put(c, pool, h, 4);
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	kvt_flush(c);
	kvt_evict(c, KVCACHED__TIER__TIER_G2);
	put(c, pool, h, 2);
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	put(c, pool, h, 0);
	kvt_tier(1, &t2);
	kvt_tier(2, &t3);
	CHECK_EQ(t2.blocks, 2);
	CHECK(t3.blocks >= 2);

	lookup_all(c, pool, h, mixed);
	lookup_all(c, pool, h, g1);
	CHECK_EQ(kvc_lookup_tiers(c, pool, h, N, b, NULL), N);
	CHECK_EQ(kvc_release(c, b, N), 0);
	CHECK_EQ(kvc_lookup(c, pool, h, N, b), N);
	CHECK_EQ(kvc_release(c, b, N), 0);

	kvc_close(c);
	CHECK_EQ(kvt_check(), 0);
	kvt_stop(&d);
	kvt_rm_disk(dir, disk);
	printf("lookup_tiers: ok\n");
	return 0;
}
