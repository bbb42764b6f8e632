/* The lower tiers with a real daemon, a real disk file and io_uring, with
 * tiny sizes so that every path runs in seconds:
 *   - sealed chains pushed past G1 demote to G2 then G3; lookups of the oldest
 *     promote them back with identical bytes;
 *   - swap out and in: identical bytes, new handles, G1 space freed meanwhile;
 *     a swap bigger than G2's free room spills to G3, and one that finds G2
 *     all swap slots moves the oldest swap to G3; faults lose nothing;
 *   - a byte flipped in a slot on disk: a miss, the checksum counter rises;
 *   - injected write failures, ENOSPC, read EIO and copy failures: nothing in
 *     use is lost, errors are counted;
 *   - kill -9 with a warm G3, restart: the same prefixes hit from G3; runs
 *     no pool claims after a restart make room when G3 fills;
 *   - a clean stop writes dirty G2 copies back first: warm after a restart;
 *   - many concurrent lookups of one block on disk share one promotion;
 *   - sealing a hash that G2 or G3 holds: the new G1 block wins.
 * In the gpu suite (KVT_BACKEND=cuda) every size doubles (the smallest VMM
 * segment is 2 MiB), so the block counts are the same, and each case runs in
 * a child process: CUDA does not survive fork(), and cases fork workers. */
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define BB bb              /* block bytes: 16 KiB, 32 KiB on cuda */
static unsigned bb = 16384;
/* G2's slots for blocks of BB bytes, as the swap cases count them: a slot is
 * a block and its 4 KiB header, packed in runs of pages, so the count does
 * not double with the sizes: 48 here (3 slots of 20 KiB in each 64 KiB
 * page), 56 on cuda (32 KiB blocks, 128 KiB pages; seen on an H200). */
static unsigned g2_slots = 48;
#define CHAIN 4            /* blocks per chain */
#define NCHAINS 40         /* 160 blocks: G1 holds 64, G2 48, G3 192 */

static char dir[64], disk[128];

static void start(struct kvt_daemon *d)
{
	if (kvt_cuda())
		kvt_start(d, "--pool-size", "2MiB", "--page-size", "128KiB", "--host-tier-size",
			  "2MiB", "--disk-path", disk, "--disk-size", "8MiB", "--writeback-low", "25",
			  "--writeback-high", "50", NULL);
	else
		kvt_start(d, "--pool-size", "1MiB", "--page-size", "64KiB", "--host-tier-size", "1MiB",
			  "--disk-path", disk, "--disk-size", "4MiB", "--writeback-low", "25",
			  "--writeback-high", "50", NULL);
}

static void chain_hashes(int chain, kvc_hash *h)
{
	int j;

	for (j = 0; j < CHAIN; j++)
		h[j] = kvt_hash((uint64_t)chain * 100 + (uint64_t)j);
}

static uint64_t seed_of(int chain, int j)
{
	return (uint64_t)chain * 1000 + (uint64_t)j + 7;
}

/* Writes chain's blocks, seals and releases them. */
static void put_chain(kvc_conn *c, int pool, int chain)
{
	kvc_block b[CHAIN];
	kvc_hash h[CHAIN];
	int j;

	chain_hashes(chain, h);
	CHECK_EQ(kvc_alloc(c, pool, CHAIN, b), CHAIN);
	for (j = 0; j < CHAIN; j++)
		kvt_mem_fill(c, kvc_block_ptr(c, b[j]), BB, seed_of(chain, j));
	CHECK_EQ(kvc_seal(c, pool, b, h, CHAIN, b), CHAIN);
	CHECK_EQ(kvc_release(c, b, CHAIN), 0);
}

/* Looks chain up; returns how many blocks hit, after checking their bytes. */
static int get_chain(kvc_conn *c, int pool, int chain)
{
	kvc_block b[CHAIN];
	kvc_hash h[CHAIN];
	int j, k;

	chain_hashes(chain, h);
	k = kvc_lookup(c, pool, h, CHAIN, b);
	if (k < 0)
		fprintf(stderr, "lookup: %s (%s)\n", kvc_strerror(k), kvc_last_error(c));
	CHECK(k >= 0);
	for (j = 0; j < k; j++)
		CHECK(kvt_mem_verify(c, kvc_block_ptr(c, b[j]), BB, seed_of(chain, j)));
	if (k)
		CHECK_EQ(kvc_release(c, b, (size_t)k), 0);
	return k;
}

static void fill(kvc_conn *c, int pool)
{
	int i;

	for (i = 0; i < NCHAINS; i++) {
		put_chain(c, pool, i);
		kvt_tiers_settle();
	}
}

/* Moves everything cached down to G3 only. */
static void all_to_g3(kvc_conn *c)
{
	struct kvt_tier t2;

	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	kvt_flush(c);
	kvt_evict(c, KVCACHED__TIER__TIER_G2);
	kvt_tier(1, &t2);
	CHECK_EQ(t2.blocks, 0);
}

static void fresh_disk(void)
{
	char idx[160];

	unlink(disk);
	snprintf(idx, sizeof(idx), "%s.idx", disk);
	unlink(idx);
}

static void test_demote_promote(void)
{
	struct kvt_daemon d;
	struct kvt_tier t1, t2, t3;
	kvc_conn *c;
	int pool, i;

	fresh_disk();
	start(&d);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BB);
	fill(c, pool);
	kvt_tier(0, &t1);
	kvt_tier(1, &t2);
	kvt_tier(2, &t3);
	fprintf(stderr, "after fill: G1 %llu blocks (%llu dropped), G2 %llu blocks (%llu demoted, "
		"%llu dirty, %llu dropped), G3 %llu blocks (%llu written, %llu dropped)\n",
		(unsigned long long)t1.blocks, (unsigned long long)t1.evictions,
		(unsigned long long)t2.blocks, (unsigned long long)t2.demotions,
		(unsigned long long)t2.dirty, (unsigned long long)t2.evictions,
		(unsigned long long)t3.blocks, (unsigned long long)t3.demotions,
		(unsigned long long)t3.evictions);
	CHECK(t2.present && t3.present);
	CHECK(t2.demotions > 0);
	CHECK(t3.demotions > 0);
	CHECK(t3.blocks > 0);
	CHECK_EQ(t3.io_errors + t3.checksum_failures + t2.io_errors, 0);
	/* Every chain, oldest first: all of it comes back, byte for byte. */
	for (i = 0; i < NCHAINS; i++) {
		int k = get_chain(c, pool, i);

		if (k != CHAIN)
			fprintf(stderr, "chain %d: %d hits\n", i, k);
		CHECK_EQ(k, CHAIN);
	}
	kvt_tier(0, &t1);
	kvt_tier(2, &t3);
	fprintf(stderr, "after lookups: %llu promotions, %llu G3 hits\n",
		(unsigned long long)t1.promotions, (unsigned long long)t3.hits);
	CHECK(t1.promotions > 0);
	CHECK(t3.hits > 0);
	kvt_tiers_settle();
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_stop(&d);
}

static void test_swap(void)
{
	struct kvt_daemon d;
	uint64_t f0, f1, f2, w, s, cached, sw;
	kvc_block b[8], nb[8];
	kvc_hash h[4];
	kvc_conn *c;
	int pool, j;

	fresh_disk();
	start(&d);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BB);
	CHECK_EQ(kvc_alloc(c, pool, 8, b), 8);
	for (j = 0; j < 8; j++)
		kvt_mem_fill(c, kvc_block_ptr(c, b[j]), BB, 500 + (uint64_t)j);
	/* Half sealed, half still writable. */
	for (j = 0; j < 4; j++)
		h[j] = kvt_hash(900 + (uint64_t)j);
	CHECK_EQ(kvc_seal(c, pool, b, h, 4, b), 4);
	kvt_pool_counts(pool, &f0, &w, &s, &cached);
	CHECK_EQ(w, 4);
	CHECK_EQ(s, 4);
	CHECK_EQ(kvc_swap_out(c, b, 8, &sw), 0);
	kvt_tiers_settle();
	kvt_pool_counts(pool, &f1, &w, &s, &cached);
	fprintf(stderr, "swap out: free %llu -> %llu, writable %llu sealed %llu cached %llu\n",
		(unsigned long long)f0, (unsigned long long)f1, (unsigned long long)w,
		(unsigned long long)s, (unsigned long long)cached);
	CHECK_EQ(w, 0);
	CHECK_EQ(s, 0);
	CHECK_EQ(f1, f0 + 4);            /* the writable ones are free again */
	CHECK_EQ(kvt_check(), 0);
	/* The old handles are gone. */
	CHECK_EQ(kvc_release(c, b, 1), KVC_ESTALE);
	CHECK_EQ(kvc_swap_in(c, sw + 1000, nb, 8), KVC_ENOENT);
	CHECK_EQ(kvc_swap_in(c, sw, nb, 8), 8);
	for (j = 0; j < 8; j++) {
		CHECK(kvt_mem_verify(c, kvc_block_ptr(c, nb[j]), BB, 500 + (uint64_t)j));
	}
	kvt_pool_counts(pool, &f2, &w, &s, &cached);
	CHECK_EQ(w, 8);
	CHECK_EQ(kvc_swap_in(c, sw, nb, 8), KVC_ENOENT);  /* used up */
	CHECK_EQ(kvc_release(c, nb, 8), 0);
	/* Preemption by swap: with the pool full of the worker's writable
	 * blocks, it swaps 16 out and at once allocates 16 for another
	 * sequence. The swap's references go only when its copy ends (on a
	 * thread, or the device's engine): the allocation waits for that, and
	 * never gets ENOSPC for it. */
	{
		kvc_block all[64], more[16], back[16];

		CHECK_EQ(kvc_alloc(c, pool, 64, all), 64);
		CHECK_EQ(kvc_alloc(c, pool, 1, more), KVC_ENOSPC);
		CHECK_EQ(kvc_swap_out(c, all, 16, &sw), 0);
		CHECK_EQ(kvc_alloc(c, pool, 16, more), 16);
		CHECK_EQ(kvc_release(c, all + 16, 48), 0);
		CHECK_EQ(kvc_release(c, more, 16), 0);
		CHECK_EQ(kvc_swap_in(c, sw, back, 16), 16);
		CHECK_EQ(kvc_release(c, back, 16), 0);
	}
	/* Swapped data of a connection that goes is freed. */
	CHECK_EQ(kvc_alloc(c, pool, 8, b), 8);
	CHECK_EQ(kvc_swap_out(c, b, 8, &sw), 0);
	kvc_close(c);
	kvt_wait_sessions(0);
	kvt_tiers_settle();
	{
		struct kvt_tier t2;

		kvt_tier(1, &t2);
		CHECK_EQ(t2.used, 0);
	}
	CHECK_EQ(kvt_check(), 0);
	kvt_stop(&d);
}

/* A swap larger than G2's free room spills the rest to G3 through G2 and
 * comes back byte for byte; with faults injected (fault: a KVCACHED_FAULTS
 * spec or NULL) nothing is lost: a failed write leaves its blocks in G1, a
 * failed read makes swap_in say KVC_EIO and keeps the swap for a retry. G2
 * holds g2_slots (48, on cuda 56) and G1 64 blocks. */
static void test_swap_spill(const char *fault, int read_fails)
{
	struct kvt_daemon d;
	struct kvt_tier t2, t3;
	kvc_block b[60], back[60];
	uint64_t sw1, sw2;
	kvc_conn *c;
	int pool, j, r;

	fresh_disk();
	if (fault)
		setenv("KVCACHED_FAULTS", fault, 1);
	start(&d);
	unsetenv("KVCACHED_FAULTS");
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BB);
	CHECK_EQ(kvc_alloc(c, pool, 60, b), 60);
	for (j = 0; j < 60; j++)
		kvt_mem_fill(c, kvc_block_ptr(c, b[j]), BB, 7000 + (uint64_t)j);
	/* 40 fit in G2; of the next 20, g2_slots - 40 do and the rest go on to
	 * disk. */
	CHECK_EQ(kvc_swap_out(c, b, 40, &sw1), 0);
	CHECK_EQ(kvc_swap_out(c, b + 40, 20, &sw2), 0);
	kvt_tiers_settle();
	kvt_tier(1, &t2);
	kvt_tier(2, &t3);
	fprintf(stderr, "swap spill (%s): G2 %llu blocks, G3 %llu blocks, %llu bytes used, "
		"io_errors %llu\n", fault ? fault : "no faults", (unsigned long long)t2.blocks,
		(unsigned long long)t3.blocks, (unsigned long long)t3.used,
		(unsigned long long)t3.io_errors);
	if (!fault) {
		CHECK_EQ(t2.blocks, g2_slots);
		CHECK_EQ(t3.blocks, 60 - g2_slots);
	}
	CHECK_EQ(kvt_check(), 0);
	/* The old handles are gone (or, where a write failed, still held by
	 * the swap, not by this connection). */
	CHECK_EQ(kvc_release(c, b + 59, 1), KVC_ESTALE);
	r = kvc_swap_in(c, sw2, back, 60);
	if (read_fails) {
		CHECK_EQ(r, KVC_EIO);
		CHECK_EQ(kvt_check(), 0);
		r = kvc_swap_in(c, sw2, back, 60);
	}
	CHECK_EQ(r, 20);
	for (j = 0; j < 20; j++)
		CHECK(kvt_mem_verify(c, kvc_block_ptr(c, back[j]), BB, 7040 + (uint64_t)j));
	CHECK_EQ(kvc_release(c, back, 20), 0);
	CHECK_EQ(kvc_swap_in(c, sw1, back, 60), 40);
	for (j = 0; j < 40; j++)
		CHECK(kvt_mem_verify(c, kvc_block_ptr(c, back[j]), BB, 7000 + (uint64_t)j));
	CHECK_EQ(kvc_release(c, back, 40), 0);
	kvt_tiers_settle();
	kvt_tier(1, &t2);
	kvt_tier(2, &t3);
	CHECK_EQ(t2.used, 0);
	CHECK_EQ(t3.used, 0);
	CHECK_EQ(kvt_check(), 0);
	CHECK_EQ(kvc_alloc(c, pool, 60, b), 60);
	CHECK_EQ(kvc_swap_out(c, b, 60, &sw1), 0);
	/* A swap of a connection that goes is freed from both tiers, also
	 * while its spill is under way. */
	kvc_close(c);
	kvt_wait_sessions(0);
	kvt_tiers_settle();
	kvt_tier(1, &t2);
	kvt_tier(2, &t3);
	CHECK_EQ(t2.used, 0);
	CHECK_EQ(t3.used, 0);
	CHECK_EQ(kvt_check(), 0);
	kvt_stop(&d);
}

/* G2 is all one swap's slots: the next swap waits while that one goes to
 * disk (evacuated: its blocks written to G3, its G2 slots freed), then takes
 * the slots; the evacuated swap comes back through G2 slots taken at swap
 * in. With a write fault the evacuation fails: nothing moves, the new swap
 * is refused (ENOSPC) and the caller keeps its blocks. */
static void test_swap_evacuate(const char *fault)
{
	struct kvt_daemon d;
	struct kvt_tier t2, t3;
	kvc_block b[60], back[60];
	uint64_t sw1, sw2;
	kvc_conn *c;
	int pool, j;

	fresh_disk();
	if (fault)
		setenv("KVCACHED_FAULTS", fault, 1);
	start(&d);
	unsetenv("KVCACHED_FAULTS");
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BB);
	CHECK_EQ(kvc_alloc(c, pool, 60, b), 60);
	for (j = 0; j < 60; j++)
		kvt_mem_fill(c, kvc_block_ptr(c, b[j]), BB, 9000 + (uint64_t)j);
	CHECK_EQ(kvc_swap_out(c, b, g2_slots, &sw1), 0);
	kvt_tiers_settle();
	if (fault) {
		CHECK_EQ(kvc_swap_out(c, b + g2_slots, 60 - g2_slots, &sw2), KVC_ENOSPC);
		for (j = (int)g2_slots; j < 60; j++)
			CHECK(kvt_mem_verify(c, kvc_block_ptr(c, b[j]), BB, 9000 + (uint64_t)j));
		CHECK_EQ(kvc_release(c, b + g2_slots, 60 - g2_slots), 0);
		CHECK_EQ(kvt_check(), 0);
	} else {
		CHECK_EQ(kvc_swap_out(c, b + g2_slots, 60 - g2_slots, &sw2), 0);
		kvt_tiers_settle();
		kvt_tier(1, &t2);
		kvt_tier(2, &t3);
		fprintf(stderr, "swap evacuated: G2 %llu blocks, G3 %llu blocks\n",
			(unsigned long long)t2.blocks, (unsigned long long)t3.blocks);
		CHECK_EQ(t2.blocks, 60 - g2_slots);
		CHECK_EQ(t3.blocks, g2_slots);
		CHECK_EQ(kvt_check(), 0);
		CHECK_EQ(kvc_swap_in(c, sw2, back, 60), (int)(60 - g2_slots));
		for (j = 0; j < (int)(60 - g2_slots); j++)
			CHECK(kvt_mem_verify(c, kvc_block_ptr(c, back[j]), BB,
					     9000 + g2_slots + (uint64_t)j));
		CHECK_EQ(kvc_release(c, back, 60 - g2_slots), 0);
	}
	CHECK_EQ(kvc_swap_in(c, sw1, back, 60), (int)g2_slots);
	for (j = 0; j < (int)g2_slots; j++)
		CHECK(kvt_mem_verify(c, kvc_block_ptr(c, back[j]), BB, 9000 + (uint64_t)j));
	CHECK_EQ(kvc_release(c, back, g2_slots), 0);
	kvt_tiers_settle();
	kvt_tier(1, &t2);
	kvt_tier(2, &t3);
	CHECK_EQ(t2.used, 0);
	CHECK_EQ(t3.used, 0);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_stop(&d);
}

/* Finds the slot of hash h in the disk file; returns its offset or -1. */
/* Seals the hashes of chain again from new blocks with other bytes (seed
 * base + j) while a lower tier holds them: the new G1 blocks win, the tier
 * copies are dropped (kv_tiers_forget), and lookups see the new bytes. */
static void reseal_chain(kvc_conn *c, int pool, int chain, uint64_t base)
{
	kvc_block b[CHAIN];
	kvc_hash h[CHAIN];
	int j;

	chain_hashes(chain, h);
	CHECK_EQ(kvc_alloc(c, pool, CHAIN, b), CHAIN);
	for (j = 0; j < CHAIN; j++)
		kvt_mem_fill(c, kvc_block_ptr(c, b[j]), BB, base + (uint64_t)j);
	CHECK_EQ(kvc_seal(c, pool, b, h, CHAIN, b), CHAIN);
	CHECK_EQ(kvc_release(c, b, CHAIN), 0);
	CHECK_EQ(kvc_lookup(c, pool, h, CHAIN, b), CHAIN);
	for (j = 0; j < CHAIN; j++)
		CHECK(kvt_mem_verify(c, kvc_block_ptr(c, b[j]), BB, base + (uint64_t)j));
	CHECK_EQ(kvc_release(c, b, CHAIN), 0);
}

static void test_seal_over_lower_tier(void)
{
	struct kvt_daemon d;
	struct kvt_tier t2, t3;
	kvc_conn *c;
	int pool;

	fresh_disk();
	start(&d);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BB);
	/* Chain 0 in G2 only, chain 1 in G3 only. */
	put_chain(c, pool, 1);
	all_to_g3(c);
	kvt_tier(2, &t3);
	CHECK_EQ(t3.blocks, CHAIN);
	put_chain(c, pool, 0);
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	kvt_tier(1, &t2);
	CHECK_EQ(t2.blocks, CHAIN);
	reseal_chain(c, pool, 0, 5000);
	reseal_chain(c, pool, 1, 6000);
	kvt_tiers_settle();
	kvt_tier(1, &t2);
	kvt_tier(2, &t3);
	CHECK_EQ(t2.blocks, 0);
	CHECK_EQ(t3.blocks, 0);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_stop(&d);
}

static void test_corrupt(void)
{
	struct kvt_daemon d;
	struct kvt_tier t3;
	kvc_hash h[CHAIN];
	kvc_conn *c;
	int pool, fd;
	off_t off;
	uint8_t byte;

	fresh_disk();
	start(&d);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BB);
	put_chain(c, pool, 3);
	all_to_g3(c);
	chain_hashes(3, h);
	off = kvt_find_slot(disk, &h[2], NULL);
	CHECK(off >= 0);
	fd = open(disk, O_RDWR);
	CHECK(fd >= 0);
	CHECK(pread(fd, &byte, 1, off + 4096 + 1234) == 1);
	byte ^= 0x40;
	CHECK(pwrite(fd, &byte, 1, off + 4096 + 1234) == 1);
	close(fd);
	/* The first two blocks hit; the corrupt third is a miss, so is the
	 * fourth (a prefix ends at the first miss). */
	CHECK_EQ(get_chain(c, pool, 3), 2);
	kvt_tier(2, &t3);
	CHECK_EQ(t3.checksum_failures, 1);
	/* It is gone for good, not served on a second try. */
	CHECK_EQ(get_chain(c, pool, 3), 2);
	kvt_tier(2, &t3);
	CHECK_EQ(t3.checksum_failures, 1);
	kvt_tiers_settle();
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_stop(&d);
}

/* A worker holds blocks through all the faults: they stay intact. */
static void test_faults(const char *spec, int expect_write_errors, int expect_read_misses)
{
	struct kvt_daemon d;
	struct kvt_tier t2, t3;
	kvc_block held[4];
	kvc_conn *c;
	int pool, i, j, hits = 0;

	fresh_disk();
	setenv("KVCACHED_FAULTS", spec, 1);
	start(&d);
	unsetenv("KVCACHED_FAULTS");
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BB);
	CHECK_EQ(kvc_alloc(c, pool, 4, held), 4);
	for (j = 0; j < 4; j++)
		kvt_mem_fill(c, kvc_block_ptr(c, held[j]), BB, 4242 + (uint64_t)j);
	for (i = 0; i < 8; i++)
		put_chain(c, pool, i);
	kvt_tiers_settle();
	all_to_g3(c);
	kvt_tier(1, &t2);
	kvt_tier(2, &t3);
	fprintf(stderr, "faults '%s': G2 io_errors %llu, G3 io_errors %llu, G3 blocks %llu\n", spec,
		(unsigned long long)t2.io_errors, (unsigned long long)t3.io_errors,
		(unsigned long long)t3.blocks);
	if (expect_write_errors)
		CHECK(t3.io_errors + t2.io_errors >= (uint64_t)expect_write_errors);
	for (i = 0; i < 8; i++)
		hits += get_chain(c, pool, i);
	fprintf(stderr, "faults '%s': %d of %d blocks hit\n", spec, hits, 8 * CHAIN);
	if (expect_read_misses >= 0)
		CHECK_EQ(hits, 8 * CHAIN - expect_read_misses * CHAIN);
	for (j = 0; j < 4; j++)
		CHECK(kvt_mem_verify(c, kvc_block_ptr(c, held[j]), BB, 4242 + (uint64_t)j));
	kvt_tiers_settle();
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_stop(&d);
}

/* What G2 can stage at once (48 slots): evict --tier g1 drops the rest. */
#define WARM 10

static void test_warm_restart(void)
{
	struct kvt_daemon d;
	struct kvt_tier t3;
	kvc_conn *c;
	int pool, i, st;

	fresh_disk();
	start(&d);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BB);
	for (i = 0; i < WARM; i++)
		put_chain(c, pool, i);
	kvt_tiers_settle();
	all_to_g3(c);
	kvc_close(c);
	/* No clean shutdown: what the journal has is what there is. */
	CHECK(kill(d.pid, SIGKILL) == 0);
	CHECK(waitpid(d.pid, &st, 0) == d.pid);
	start(&d);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BB);
	kvt_tier(2, &t3);
	fprintf(stderr, "warm restart: G3 holds %llu blocks\n", (unsigned long long)t3.blocks);
	CHECK_EQ(t3.blocks, WARM * CHAIN);
	kvc_close(c);
	/* A clean stop and a start: warm again. */
	kvt_stop(&d);
	start(&d);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BB);
	kvt_tier(2, &t3);
	CHECK_EQ(t3.blocks, WARM * CHAIN);
	for (i = 0; i < WARM; i++)
		CHECK_EQ(get_chain(c, pool, i), CHAIN);
	kvt_tier(2, &t3);
	CHECK_EQ(t3.hits, WARM * CHAIN);
	/* Another namespace with a pool of the same name does not see them. */
	{
		kvc_conn *o = kvt_connect("other");
		int op = kvt_pool(o, "p", BB);

		CHECK_EQ(get_chain(o, op, 0), 0);
		kvc_close(o);
	}
	kvt_tiers_settle();
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_stop(&d);
}

/* A clean stop writes the dirty G2 copies back to G3 (lifecycle.h,
 * STOPPING): a planned restart keeps its warm cache. Two chains are too few
 * for the write-back watermark, so only the stop can have written them. */
static void test_stop_writes_back(void)
{
	struct kvt_daemon d;
	struct kvt_tier t2, t3;
	kvc_conn *c;
	int pool, i;

	fresh_disk();
	start(&d);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BB);
	for (i = 0; i < 2; i++)
		put_chain(c, pool, i);
	kvt_tiers_settle();
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	kvt_tier(1, &t2);
	kvt_tier(2, &t3);
	CHECK_EQ(t2.blocks, 2 * CHAIN);
	CHECK_EQ(t2.dirty, 2 * CHAIN);
	CHECK_EQ(t3.blocks, 0);
	kvc_close(c);
	kvt_stop(&d);
	start(&d);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BB);
	kvt_tier(2, &t3);
	CHECK_EQ(t3.blocks, 2 * CHAIN);
	for (i = 0; i < 2; i++)
		CHECK_EQ(get_chain(c, pool, i), CHAIN);
	kvt_tiers_settle();
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_stop(&d);
}

struct race {
	int go, go_w;
	int pool;
};

/* Runs a previous daemon left for a layout no pool has registered since
 * (dormant) are the first to go when G3 needs room; their bytes leave G3's
 * used count with them. */
static void test_dormant_runs_evicted(void)
{
	struct kvt_daemon d;
	struct kvt_tier t3;
	kvc_conn *c;
	int pool, i;

	fresh_disk();
	start(&d);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BB);
	for (i = 0; i < WARM; i++)
		put_chain(c, pool, i);
	kvt_tiers_settle();
	all_to_g3(c);
	kvc_close(c);
	kvt_stop(&d);
	start(&d);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "q", BB);
	kvt_tier(2, &t3);
	CHECK(t3.used >= (uint64_t)WARM * CHAIN * BB);
	CHECK_EQ(t3.blocks, 0);
	/* Twice what G3 holds besides them. */
	for (i = 0; i < 2 * NCHAINS; i++) {
		put_chain(c, pool, 100 + i);
		kvt_tiers_settle();
		if (i % 8 == 7)
			all_to_g3(c);
	}
	kvt_tier(2, &t3);
	CHECK(t3.used <= t3.capacity);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_stop(&d);
}

static int racer(void *arg)
{
	struct race *r = arg;
	kvc_conn *c = kvt_connect(NULL);
	int pool = kvt_pool(c, "p", BB), k;
	char x;

	close(r->go_w);
	CHECK(read(r->go, &x, 1) == 0);  /* EOF: go */
	k = get_chain(c, pool, 5);
	kvc_close(c);
	return k == CHAIN ? 0 : 1;
}

static void test_shared_promotion(void)
{
	struct kvt_daemon d;
	struct kvt_tier before, after, t3;
	struct race r;
	pid_t pid[8];
	int fds[2], i, pool;
	kvc_conn *c;

	fresh_disk();
	start(&d);
	/* The racers first: they connect and wait, and are forked before this
	 * process has touched block memory (on cuda: loaded CUDA). */
	CHECK(pipe(fds) == 0);
	r.go = fds[0];
	r.go_w = fds[1];
	for (i = 0; i < 8; i++)
		pid[i] = kvt_spawn(racer, &r);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BB);
	r.pool = pool;
	put_chain(c, pool, 5);
	all_to_g3(c);
	kvt_tier(0, &before);
	kvt_wait_sessions(9 - 1 + 1);
	close(fds[1]);
	for (i = 0; i < 8; i++)
		CHECK_EQ(kvt_wait(pid[i]), 0);
	close(fds[0]);
	kvt_tier(0, &after);
	kvt_tier(2, &t3);
	fprintf(stderr, "8 concurrent lookups: %llu promotions, %llu G3 reads\n",
		(unsigned long long)(after.promotions - before.promotions),
		(unsigned long long)t3.hits);
	CHECK_EQ(after.promotions - before.promotions, CHAIN);  /* once per block */
	CHECK_EQ(t3.hits, CHAIN);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_stop(&d);
}

/* A case's child exited with st: 77 (no GPU) skips the whole test. */
static void child_done(int st)
{
	if (st == 77) {
		fresh_disk();
		rmdir(dir);
		GPU_SKIP("a case's child found none");
	}
	CHECK_EQ(st, 0);
}

/* Runs one case; on cuda in a child process, so that this one never loads
 * CUDA and every case may fork workers. */
#define RUN(call) do { \
	if (kvt_cuda()) { \
		pid_t p_; \
		fflush(NULL); \
		p_ = fork(); \
		CHECK(p_ >= 0); \
		if (p_ == 0) { \
			call; \
			exit(0); \
		} \
		child_done(kvt_wait(p_)); \
	} else { \
		call; \
	} \
} while (0)

int main(void)
{
	snprintf(dir, sizeof(dir), "/var/tmp/kvt-tiers-XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	snprintf(disk, sizeof(disk), "%s/g3", dir);
	if (kvt_cuda()) {
		bb = 32768;
		g2_slots = 56;
	}

	RUN(test_demote_promote());
	RUN(test_swap());
	RUN(test_swap_spill(NULL, 0));
	/* A spill write fails: that block stays in G1; swap_in still gives
	 * every byte back. */
	RUN(test_swap_spill("g3_write=EIO:count=1", 0));
	RUN(test_swap_spill("g3_write=short:count=1", 0));
	/* A read back fails: KVC_EIO, the swap is kept, the retry works. */
	RUN(test_swap_spill("g3_read=EIO:count=1", 1));
	/* The copy of a spill round fails: the blocks stay in G1. */
	RUN(test_swap_spill("copy=EIO:skip=1:count=1", 0));
	RUN(test_swap_evacuate(NULL));
	RUN(test_swap_evacuate("g3_write=EIO:count=1"));
	RUN(test_seal_over_lower_tier());
	RUN(test_corrupt());
	/* Writes fail: the blocks stay in G2 and are written on a later try. */
	RUN(test_faults("g3_write=EIO:count=3", 3, 0));
	RUN(test_faults("g3_write=short:count=2", 2, 0));
	/* The file system is full: G3 shrinks; what does not fit is dropped
	 * from the cache, nothing held is touched. */
	RUN(test_faults("g3_write=ENOSPC:skip=10:count=1", 1, -1));
	/* A read fails: that block is a miss (its chain stops there). */
	RUN(test_faults("g3_read=EIO:count=1", 0, 1));
	/* Demotion copies fail: the blocks stay in G1. */
	RUN(test_faults("copy=EIO:count=1", 1, 0));
	/* A short copy is a failed one: the blocks stay in G1 too (it used to
	 * count as done, and a lookup then served stale bytes). */
	RUN(test_faults("copy=short:count=1", 1, 0));
	RUN(test_warm_restart());
	RUN(test_stop_writes_back());
	RUN(test_dormant_runs_evicted());
	RUN(test_shared_promotion());

	fresh_disk();
	rmdir(dir);
	return 0;
}
