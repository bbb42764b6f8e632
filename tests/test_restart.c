/* Clients survive a daemon restart (kvcache.h, kvc_restarts): worker
 * processes loop over lookup / verify / alloc / write / seal / release of
 * shared chains while the daemon is killed with SIGKILL and started again on
 * the same socket, twice, with a disk tier that keeps the cache warm. Every
 * byte a worker reads through a lookup is checked against the chain's
 * content; each worker sees both restarts through kvc_restarts() and goes
 * on with the pool id it registered at the start. A held handle from before
 * a restart is KVC_ESTALE afterwards, a swap from before is unknown, and the
 * new daemon serves the chains again from its disk tier (G3 hits). */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define BB 16384
#define CHAIN 4
#define NCHAINS 64  /* 256 blocks: G1 holds 128, G2 64, G3 512 */
#define WORKERS 4
#define RESTARTS 2
#define AFTER 30  /* iterations after the last restart */

static char dir[64], disk[128];
static int report[2];  /* workers -> parent: 'w' warmed up, 'r' reconnected */

static void start_args(struct kvt_daemon *d, int restart)
{
	if (restart)
		kvt_restart(d, "--pool-size", "2MiB", "--page-size", "64KiB", "--host-tier-size",
			    "1MiB", "--disk-path", disk, "--disk-size", "8MiB", "--writeback-low",
			    "25", "--writeback-high", "50", NULL);
	else
		kvt_start(d, "--pool-size", "2MiB", "--page-size", "64KiB", "--host-tier-size",
			  "1MiB", "--disk-path", disk, "--disk-size", "8MiB", "--writeback-low", "25",
			  "--writeback-high", "50", NULL);
}

static uint64_t seed_of(int chain, int j)
{
	return (uint64_t)chain * 1000 + (uint64_t)j + 99;
}

/* Whether r says the daemon went away (the call in flight, or a call while
 * reconnecting waits for its backoff). */
static int gone(int r)
{
	return r == -EPIPE || r == -ECONNRESET;
}

/* One pass over a chain: the prefix that hits is checked byte for byte; the
 * rest is written and sealed. Returns 0 (done, or given up because handles
 * went stale), 2 when the daemon is away, or 1 on a wrong byte. */
static int pass(kvc_conn *c, int pool, int chain)
{
	kvc_block b[CHAIN];
	kvc_hash h[CHAIN];
	int k, j, r, bad = 0;

	for (j = 0; j < CHAIN; j++)
		h[j] = kvt_hash((uint64_t)chain * 100 + (uint64_t)j);
	k = kvc_lookup(c, pool, h, CHAIN, b);
	if (k < 0)
		return gone(k) ? 2 : 0;
	for (j = 0; j < k; j++)
		if (!kvt_mem_verify(c, kvc_block_ptr(c, b[j]), BB, seed_of(chain, j))) {
			fprintf(stderr, "worker %d: chain %d block %d: wrong bytes\n", (int)getpid(),
				chain, j);
			bad = 1;
		}
	if (k < CHAIN && (r = kvc_alloc(c, pool, (uint32_t)(CHAIN - k), b + k)) == CHAIN - k) {
		for (j = k; j < CHAIN; j++)
			kvt_mem_fill(c, kvc_block_ptr(c, b[j]), BB, seed_of(chain, j));
		/* May fail: the daemon went away, or the blocks went stale.
		 * Released below either way. */
		(void)kvc_seal(c, pool, b + k, h + k, (size_t)(CHAIN - k), b + k);
		k = CHAIN;
	}
	/* After a restart these handles are stale: KVC_ESTALE, not a crash. */
	r = kvc_release(c, b, (size_t)k);
	if (r < 0 && r != KVC_ESTALE && !gone(r)) {
		fprintf(stderr, "worker: release: %s (%s)\n", kvc_strerror(r), kvc_last_error(c));
		bad = 1;
	}
	return bad;
}

static int worker(void *arg)
{
	kvc_conn *c = kvt_connect(NULL);
	int pool = kvt_pool(c, "p", BB), i = 0, done = -1;
	uint64_t seen = 0;

	(void)arg;
	for (;;) {
		int r = pass(c, pool, (int)((unsigned)rand() % NCHAINS));

		if (r == 1)
			return 1;
		i++;
		if (i == 20)
			CHECK(write(report[1], "w", 1) == 1);
		while (seen < kvc_restarts(c)) {
			CHECK(write(report[1], "r", 1) == 1);
			seen++;
		}
		if (seen == RESTARTS && done < 0)
			done = i + AFTER;
		if (done >= 0 && i >= done)
			break;
		if (r == 2)
			poll(NULL, 0, 1);  /* the daemon is away: retry shortly */
	}
	/* The pool id from before both restarts still works. */
	CHECK(kvc_pool_block_bytes(c, pool) == BB);
	kvc_close(c);
	return 0;
}

/* Waits for n report bytes of kind k from the workers. */
static void wait_reports(char k, int n)
{
	char x;

	while (n > 0) {
		CHECK(read(report[0], &x, 1) == 1);
		if (x == k)
			n--;
	}
}

/* Waits until G3 holds blocks: the workers' chains do not fit G1 and G2,
 * so write-back puts some on disk, where the next daemon finds them. */
static void wait_g3(void)
{
	struct kvt_tier t3;

	for (int i = 0; i < 60000; i++) {
		kvt_tier(2, &t3);
		if (t3.blocks > 0)
			return;
		poll(NULL, 0, 1);
	}
	CHECK(!"G3 stayed empty for a minute");
}

int main(void)
{
	struct kvt_daemon d;
	struct kvt_tier t3;
	pid_t w[WORKERS];
	kvc_conn *c;
	kvc_block held, b;
	uint64_t swap;
	int pool, i;

	if (kvt_cuda())
		return 77;  /* the worker loop is the host backend's (plain memory) */
	snprintf(dir, sizeof(dir), "/var/tmp/kvt-restart-XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	snprintf(disk, sizeof(disk), "%s/g3", dir);
	CHECK(pipe(report) == 0);
	start_args(&d, 0);

	/* The parent's own connection: a held block and a swap across the
	 * restart. */
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BB);
	CHECK_EQ(kvc_alloc(c, pool, 1, &held), 1);
	CHECK_EQ(kvc_alloc(c, pool, 1, &b), 1);
	CHECK_EQ(kvc_swap_out(c, &b, 1, &swap), 0);

	for (i = 0; i < WORKERS; i++) {
		srand((unsigned)i + 1);
		w[i] = kvt_spawn(worker, NULL);
	}
	wait_reports('w', WORKERS);
	for (i = 0; i < RESTARTS; i++) {
		wait_g3();
		kvt_tier(2, &t3);
		fprintf(stderr, "before restart %d: G3 holds %llu blocks\n", i + 1,
			(unsigned long long)t3.blocks);
		start_args(&d, 1);
		fprintf(stderr, "restart %d: daemon pid %d\n", i + 1, (int)d.pid);
		wait_reports('r', WORKERS);
	}
	for (i = 0; i < WORKERS; i++)
		CHECK_EQ(kvt_wait(w[i]), 0);

	/* What the parent held: stale now, and said so; the pool id works. */
	CHECK_EQ(kvc_release(c, &held, 1), KVC_ESTALE);
	fprintf(stderr, "old handle after the restarts: %s\n", kvc_last_error(c));
	CHECK_EQ(kvc_restarts(c), 1);  /* one reconnection: its first call since */
	CHECK_EQ(kvc_swap_in(c, swap, &b, 1), KVC_ENOENT);
	CHECK_EQ(kvc_alloc(c, pool, 1, &b), 1);
	CHECK(kvc_block_ptr(c, b) != NULL);
	/* test_swap_ids_after_restart: a swap of the new daemon does not take
	 * the old one's id (both daemons counted from 1: an old id named the
	 * new swap, and a thread sharing the connection took another's blocks). */
	{
		uint64_t fresh;
		kvc_block back;

		CHECK_EQ(kvc_swap_out(c, &b, 1, &fresh), 0);
		CHECK(fresh != swap);
		CHECK_EQ(kvc_swap_in(c, swap, &back, 1), KVC_ENOENT);
		CHECK_EQ(kvc_swap_in(c, fresh, &b, 1), 1);
	}
	CHECK_EQ(kvc_release(c, &b, 1), 0);

	/* The workers' lookups after the last restart found chains on disk. */
	kvt_tier(2, &t3);
	fprintf(stderr, "after the last restart: %llu G3 hits\n", (unsigned long long)t3.hits);
	CHECK(t3.hits > 0);
	kvt_tiers_settle();
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_stop(&d);
	kvt_rm_disk(dir, disk);
	return 0;
}
