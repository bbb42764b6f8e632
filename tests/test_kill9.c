/* kill -9 of a worker holding writable, sealed, forked and looked-up blocks:
 * every reference comes back, what it sealed stays cached, the checker passes. */
#include <signal.h>
#include <unistd.h>

#include "harness.h"

#define BB 8192

static int ready[2];

static int victim(void *arg)
{
	kvc_conn *c = kvt_connect(NULL);
	int pool = kvt_pool(c, "p", BB), i;
	kvc_block b[300], f[50], l[50];
	kvc_hash h[50];

	(void)arg;
	CHECK_EQ(kvc_alloc(c, pool, 300, b), 300);
	for (i = 0; i < 50; i++)
		h[i] = kvt_hash((uint64_t)i);
	CHECK_EQ(kvc_seal(c, pool, b, h, 50, b), 50);
	CHECK_EQ(kvc_fork(c, b + 50, 50, f), 50);
	CHECK_EQ(kvc_lookup(c, pool, h, 50, l), 50);
	CHECK(write(ready[1], "r", 1) == 1);
	pause();
	return 0;
}

int main(void)
{
	struct kvt_daemon d;
	uint64_t fr, wr, se, ca;
	kvc_conn *c;
	pid_t pid;
	char x;
	int round;

	kvt_start(&d, "--pool-size", "16MiB", "--segment-size", "2MiB", NULL);
	CHECK(pipe(ready) == 0);
	for (round = 0; round < 3; round++) {
		pid = kvt_spawn(victim, NULL);
		CHECK(read(ready[0], &x, 1) == 1);
		CHECK_EQ(kvt_check(), 0);
		CHECK(kill(pid, SIGKILL) == 0);
		CHECK_EQ(kvt_wait(pid), 128 + SIGKILL);
		kvt_wait_sessions(0);
		CHECK_EQ(kvt_check(), 0);
		c = kvt_connect(NULL);
		kvt_pool_counts(kvt_pool(c, "p", BB), &fr, &wr, &se, &ca);
		CHECK_EQ(wr, 0);
		CHECK_EQ(se, 0);
		CHECK_EQ(ca, 50);
		kvc_close(c);
	}
	CHECK(kvt_alive(&d));
	kvt_stop(&d);
	return 0;
}
