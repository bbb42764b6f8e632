/* 16 worker processes x 10,000 mixed operations (alloc, seal with dedup,
 * lookup with byte checks, release, fork, cow) on a pool small enough to
 * evict. Half of the workers clean up, half just exit, a few are killed. At
 * the end no block is leaked: nothing writable or sealed remains, and the
 * daemon's invariant check passes. With KVT_TIERS=1 (test stress_tiers) the
 * daemon has a small host tier and disk tier, and pressure raises demotion
 * to G2 (with the workers' demotion watermark high, so it runs all the time),
 * write-back to G3 and promotions by lookups, all checked the same way. */
#include <stdlib.h>
#include <unistd.h>
#include <signal.h>
#include <string.h>

#include "harness.h"

#define BB 16384
#define WORKERS 16
#define OPS 10000
#define MAXHELD 64
#define HASHES 512

struct held {
	kvc_block b;
	int sealed;  /* hash id + 1 when sealed; SHARED for a forked writable block */
};

/* A writable block more than one reference points at: beam search shares it
 * read-only until a copy-on-write. Never written or sealed through. */
#define SHARED (-1)

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* A block sealed under hash id k holds the bytes of seed k: every worker
 * fills it so before sealing, so any block found by lookup must verify. */
static void fill_for(kvc_conn *c, kvc_block b, int k)
{
	kvt_mem_fill(c, kvc_block_ptr(c, b), 256, (uint64_t)k);
}

static int worker(void *arg)
{
	int id = (int)(intptr_t)arg, pool, nheld = 0, i, r;
	uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(id + 1);
	struct held h[MAXHELD];
	kvc_conn *c = kvt_connect(NULL);
	uint64_t counts[7] = { 0 };

	pool = kvt_pool(c, "stress", BB);
	for (i = 0; i < OPS; i++) {
		int op = (int)(rnd(&s) % 100), j = nheld ? (int)(rnd(&s) % (uint64_t)nheld) : 0;

		if (op < 25 || nheld == 0) {            /* alloc 1..4 */
			kvc_block b[4];
			int n = 1 + (int)(rnd(&s) % 4);

			if (nheld + n > MAXHELD)
				continue;
			r = kvc_alloc(c, pool, (uint32_t)n, b);
			if (r == KVC_ENOSPC)
				continue;
			CHECK_EQ(r, n);
			for (int k = 0; k < n; k++)
				h[nheld++] = (struct held){ b[k], 0 };
			counts[0]++;
		} else if (op < 45) {                   /* seal a writable one */
			int k = (int)(rnd(&s) % HASHES);
			kvc_hash hh = kvt_hash((uint64_t)k);
			kvc_block out;

			if (h[j].sealed)
				continue;  /* sealed already, or shared */
			fill_for(c, h[j].b, k);
			CHECK_EQ(kvc_seal(c, pool, &h[j].b, &hh, 1, &out), 1);
			CHECK(kvt_mem_verify(c, kvc_block_ptr(c, out), 256, (uint64_t)k));
			h[j] = (struct held){ out, k + 1 };
			counts[1]++;
		} else if (op < 60) {                   /* lookup a chain of 1..4 */
			kvc_hash hh[4];
			kvc_block out[4];
			int n = 1 + (int)(rnd(&s) % 4), base = (int)(rnd(&s) % HASHES);

			if (nheld + n > MAXHELD)
				continue;
			for (int k = 0; k < n; k++)
				hh[k] = kvt_hash((uint64_t)((base + k) % HASHES));
			r = kvc_lookup(c, pool, hh, (size_t)n, out);
			CHECK(r >= 0 && r <= n);
			for (int k = 0; k < r; k++) {
				CHECK(kvt_mem_verify(c, kvc_block_ptr(c, out[k]), 256,
						     (uint64_t)((base + k) % HASHES)));
				h[nheld++] = (struct held){ out[k], (base + k) % HASHES + 1 };
			}
			counts[2]++;
		} else if (op < 85) {                   /* release one or a few */
			int n = 1 + (int)(rnd(&s) % 3);
			kvc_block b[3];

			if (n > nheld)
				n = nheld;
			for (int k = 0; k < n; k++)
				b[k] = h[nheld - n + k].b;
			CHECK_EQ(kvc_release(c, b, (size_t)n), 0);
			nheld -= n;
			counts[3]++;
		} else if (op < 92) {                   /* fork */
			kvc_block out;

			if (nheld == MAXHELD)
				continue;
			CHECK_EQ(kvc_fork(c, &h[j].b, 1, &out), 1);
			CHECK(out == h[j].b);
			if (!h[j].sealed)
				h[j].sealed = SHARED;
			h[nheld++] = h[j];
			counts[4]++;
		} else {                                /* copy on write */
			kvc_block out;

			r = kvc_cow(c, &h[j].b, 1, &out);
			if (r == KVC_ENOSPC)
				continue;
			CHECK_EQ(r, 1);
			if (h[j].sealed > 0)
				CHECK(kvt_mem_verify(c, kvc_block_ptr(c, out), 256,
						     (uint64_t)h[j].sealed - 1));
			h[j] = (struct held){ out, 0 };
			counts[5]++;
		}
	}
	if (id % 2 == 0) {
		for (i = 0; i < nheld; i++)
			CHECK_EQ(kvc_release(c, &h[i].b, 1), 0);
		kvc_close(c);
	}
	/* Odd workers exit holding everything: the daemon must clean up. */
	if (id == 0)
		fprintf(stderr, "worker 0: alloc %llu seal %llu lookup %llu release %llu fork %llu "
				"cow %llu\n", (unsigned long long)counts[0],
			(unsigned long long)counts[1], (unsigned long long)counts[2],
			(unsigned long long)counts[3], (unsigned long long)counts[4],
			(unsigned long long)counts[5]);
	return 0;
}

int main(void)
{
	struct kvt_daemon d;
	pid_t pid[WORKERS];
	uint64_t fr, wr, se, ca;
	kvc_conn *c;
	int i;

	char dir[64] = "/var/tmp/kvt-stress-XXXXXX", disk[100] = "";
	int tiers = getenv("KVT_TIERS") != NULL;

	/* 16 MiB of 16 KiB blocks = 1024 blocks for 16 x 64 held at most.
	 * 2 MiB segments: the smallest the cuda backend allows. */
	if (tiers) {
		struct kvt_tier t1, t2, t3;

		CHECK(mkdtemp(dir) != NULL);
		snprintf(disk, sizeof(disk), "%s/g3", dir);
		kvt_start(&d, "--pool-size", "16MiB", "--segment-size", "2MiB", "--page-size",
			  "64KiB", "--host-tier-size", "2MiB", "--disk-path", disk, "--disk-size",
			  "4MiB", "--demote-low", "60", "--demote-high", "70", NULL);
		for (i = 0; i < WORKERS; i++)
			pid[i] = kvt_spawn(worker, (void *)(intptr_t)i);
		for (i = 0; i < WORKERS; i++)
			CHECK_EQ(kvt_wait(pid[i]), 0);
		kvt_wait_sessions(0);
		kvt_tiers_settle();
		kvt_tier(0, &t1);
		kvt_tier(1, &t2);
		kvt_tier(2, &t3);
		fprintf(stderr, "tiers: %llu promotions; G2 %llu demotions %llu hits; G3 %llu writes "
			"%llu hits; errors %llu %llu %llu\n", (unsigned long long)t1.promotions,
			(unsigned long long)t2.demotions, (unsigned long long)t2.hits,
			(unsigned long long)t3.demotions, (unsigned long long)t3.hits,
			(unsigned long long)t2.io_errors, (unsigned long long)t3.io_errors,
			(unsigned long long)t3.checksum_failures);
		CHECK(t2.demotions > 0 && t3.demotions > 0 && t1.promotions > 0);
		CHECK_EQ(t2.io_errors + t3.io_errors + t3.checksum_failures, 0);
		CHECK_EQ(kvt_check(), 0);
		kvt_stop(&d);
		unlink(disk);
		strcat(disk, ".idx");
		unlink(disk);
		rmdir(dir);
		return 0;
	}
	kvt_start(&d, "--pool-size", "16MiB", "--segment-size", "2MiB", "--page-size", "64KiB",
		  NULL);
	for (i = 0; i < WORKERS; i++)
		pid[i] = kvt_spawn(worker, (void *)(intptr_t)i);
	for (i = 0; i < WORKERS; i++)
		CHECK_EQ(kvt_wait(pid[i]), 0);
	kvt_wait_sessions(0);
	CHECK_EQ(kvt_check(), 0);
	c = kvt_connect(NULL);
	kvt_pool_counts(kvt_pool(c, "stress", BB), &fr, &wr, &se, &ca);
	fprintf(stderr, "after: free %llu writable %llu sealed %llu cached %llu\n",
		(unsigned long long)fr, (unsigned long long)wr, (unsigned long long)se,
		(unsigned long long)ca);
	CHECK_EQ(wr, 0);
	CHECK_EQ(se, 0);
	CHECK(ca <= HASHES);
	kvc_close(c);
	kvt_stop(&d);
	return 0;
}
