/* A lookup's promotions from G2 go to the copy thread together (issue 38:
 * the host backend's plug, tier.h's kv_tiers_plug()), and each block of
 * such a batch is still its own promotion: nothing may free or reuse a
 * block of a batch in flight, nor its G2 copy.
 *
 * A chain of N blocks of 64 KiB (6 MiB: two jobs of the copy thread, one
 * full at the plug's 4 MiB, one at the end of the lookup) sealed, moved to
 * G2 (admin Evict), then looked up in one Lookup while a second process
 * races it: the admin Evict of G1 (demoting what was just promoted) and of
 * G2 (dropping idle G2 copies), its own Lookup of the same chain (parked
 * on the same promotions), seals of the same hashes (a seal in G1 kills the
 * tier copy: "that block wins"), and namespace reloads (SIGHUP) that move
 * the namespace's G1 and G2 quotas down and up again. Every block either
 * Lookup finds must hold its bytes; the pools' check passes at the end.
 * Then, with nothing racing, every promotion of a batch must succeed: the
 * whole chain, moved to G2 again, comes back in one Lookup, byte for
 * byte. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define BB 65536u
#define N 96
#define BASE 5100
#define ROUNDS 12
#define POOL (16u << 20)

static char tmp[64], conf_path[160], conf_arg[200];
static struct kvt_daemon d;

static void write_conf(int small)
{
	FILE *f;

	CHECK((f = fopen(conf_path, "w")) != NULL);
	fprintf(f, "[namespace pb]\nusers = %u\nquota_g1 = %s\nquota_g2 = %s\n", (unsigned)getuid(),
		small ? "25%" : "100%", small ? "25%" : "100%");
	fclose(f);
}

/* A reload (SIGHUP) to the full quotas, or to 25%; with wait, returns once
 * the daemon applied it. */
static void reload(int small, int wait)
{
	write_conf(small);
	CHECK(kill(d.pid, SIGHUP) == 0);
	for (int tries = 0; wait; tries++) {
		uint64_t used[3], quota[3];

		kvt_ns_usage("pb", used, quota);
		if (small ? quota[0] == POOL / 4 : (!quota[0] || quota[0] == POOL))
			break;
		if (tries == 100)
			fprintf(stderr, "quota_g1 %llu\n", (unsigned long long)quota[0]);
		CHECK(tries < 10000);
		usleep(1000);
	}
}

/* Seals blocks [i0, i1) of the chain with their bytes and releases them.
 * Only with must does a refused allocation (the namespace's quota, a full
 * pool) fail the test. */
static void seal_range(kvc_conn *c, int pool, int i0, int i1, int must)
{
	kvc_block b[N];
	kvc_hash h[N];
	int n = i1 - i0, r;

	r = kvc_alloc(c, pool, (size_t)n, b);
	if (!must && r < 0)
		return;
	CHECK_EQ(r, n);
	for (int i = 0; i < n; i++) {
		h[i] = kvt_hash(BASE + (uint64_t)(i0 + i));
		kvt_mem_fill(c, kvc_block_ptr(c, b[i]), BB, BASE + (uint64_t)(i0 + i));
	}
	CHECK_EQ(kvc_seal(c, pool, b, h, (size_t)n, b), n);
	CHECK_EQ(kvc_release(c, b, (size_t)n), 0);
}

static int pipes[2][2];  /* [0]: parent -> racer (stop); [1]: racer -> parent (ready) */

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The second process: connected, says so, then races the parent's Lookup
 * until the parent writes to the pipe (40 steps at most). */
static int racer(void *arg)
{
	int first = *(int *)arg;
	kvc_conn *c = kvt_connect("pb");
	int pool = kvt_pool(c, "p", BB);

	CHECK(write(pipes[1][1], "r", 1) == 1);
	/* Its first step once the parent's promotions are in flight (G2's
	 * copies), unless the Lookup is over first: said, not asserted (how
	 * the two processes interleave is the scheduler's). */
	for (uint64_t t0 = mono_ms();;) {
		struct kvt_tier t2;
		char x;

		kvt_tier(1, &t2);
		if (t2.inflight) {
			fprintf(stderr, "round %d: the racer starts with %llu copies in flight\n", first,
				(unsigned long long)t2.inflight);
			break;
		}
		if (read(pipes[0][0], &x, 1) == 1 || mono_ms() - t0 > 2000) {
			kvc_close(c);
			return 0;
		}
	}
	for (int it = first; it < first + 40; it++) {
		char x;

		switch (it % 5) {
		case 0:
			seal_range(c, pool, (it * 7) % (N - 8), (it * 7) % (N - 8) + 8, 0);
			break;
		case 1:
			kvt_lookup_chain("pb", "p", BB, N, BASE);
			break;
		case 2:
			kvt_evict(c, KVCACHED__TIER__TIER_G1);
			break;
		case 3:
			reload(it % 2, 0);
			break;
		default:
			kvt_evict(c, KVCACHED__TIER__TIER_G2);
			break;
		}
		if (read(pipes[0][0], &x, 1) == 1)
			break;
	}
	kvc_close(c);
	return 0;
}

int main(void)
{
	kvc_block b[N];
	kvc_conn *c;
	int pool, k, found = 0;

	if (kvt_cuda())
		SKIP("host backend only (the plug is the host backend's)");
	signal(SIGPIPE, SIG_IGN);
	snprintf(tmp, sizeof(tmp), "/tmp/kvt-pb.XXXXXX");
	CHECK(mkdtemp(tmp) != NULL);
	snprintf(conf_path, sizeof(conf_path), "%s/kvcached.conf", tmp);
	snprintf(conf_arg, sizeof(conf_arg), "--config=%s", conf_path);
	write_conf(0);
	kvt_start(&d, conf_arg, "--pool-size", "16MiB", "--segment-size", "1MiB", "--page-size",
		  "64KiB", "--host-tier-size", "16MiB", NULL);
	c = kvt_connect("pb");
	pool = kvt_pool(c, "p", BB);

	for (int r = 0; r < ROUNDS; r++) {
		pid_t pid;
		char x;

		reload(0, 1);
		seal_range(c, pool, 0, N, 1);
		kvt_evict(c, KVCACHED__TIER__TIER_G1);
		CHECK(pipe(pipes[0]) == 0 && pipe(pipes[1]) == 0);
		CHECK(fcntl(pipes[0][0], F_SETFL, O_NONBLOCK) == 0);
		pid = kvt_spawn(racer, &r);
		close(pipes[0][0]);
		close(pipes[1][1]);
		CHECK(read(pipes[1][0], &x, 1) == 1);  /* the racer is connected */
		/* Its first step (each round another) and this Lookup reach
		 * the daemon in either order: both are races worth running. */
		k = kvt_lookup_held(c, pool, BB, N, BASE, b);
		found += k;
		if (k)
			CHECK_EQ(kvc_release(c, b, (size_t)k), 0);
		if (write(pipes[0][1], "x", 1) < 0) {
			/* EPIPE: the racer is done already */
		}
		close(pipes[0][1]);
		close(pipes[1][0]);
		CHECK_EQ(kvt_wait(pid), 0);
		CHECK(kvt_alive(&d));
	}
	fprintf(stderr, "racing lookups found %d of %d blocks\n", found, ROUNDS * N);
	CHECK_EQ(kvt_check(), 0);

	/* Nothing racing: every promotion of the batches succeeds. */
	reload(0, 1);
	for (int r = 0; r < 3; r++) {
		seal_range(c, pool, 0, N, 1);
		kvt_evict(c, KVCACHED__TIER__TIER_G1);
		CHECK_EQ(kvt_lookup_held(c, pool, BB, N, BASE, b), N);
		CHECK_EQ(kvc_release(c, b, N), 0);
	}
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_stop(&d);
	unlink(conf_path);
	rmdir(tmp);
	printf("promote_batch: ok\n");
	return 0;
}
