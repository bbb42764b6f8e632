/* Two workers seal the same hash at the same moment: one block survives, both
 * end up holding it, the duplicate is freed. Repeated for many hashes. */
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define BB 16384
#define N 200

static int go[2], res[2], done[2];

static int worker(void *arg)
{
	kvc_conn *c = kvt_connect(NULL);
	int pool = kvt_pool(c, "p", BB), i;
	kvc_block b[N], out[N];
	kvc_hash h[N];
	char x;

	for (i = 0; i < N; i++)
		h[i] = kvt_hash((uint64_t)i);
	CHECK_EQ(kvc_alloc(c, pool, N, b), N);
	for (i = 0; i < N; i++)
		kvt_mem_fill(c, kvc_block_ptr(c, b[i]), BB, (uint64_t)i);
	CHECK(read(go[0], &x, 1) == 1);
	/* Half one request at a time, half in one batch. */
	for (i = 0; i < N / 2; i++)
		CHECK_EQ(kvc_seal(c, pool, &b[i], &h[i], 1, &out[i]), 1);
	CHECK_EQ(kvc_seal(c, pool, b + N / 2, h + N / 2, N / 2, out + N / 2), N / 2);
	for (i = 0; i < N; i++)
		CHECK(kvt_mem_verify(c, kvc_block_ptr(c, out[i]), BB, (uint64_t)i));
	CHECK(write(res[1], out, sizeof(out)) == (ssize_t)sizeof(out));
	CHECK(read(done[0], &x, 1) == 1);  /* hold until the parent has counted */
	kvc_close(c);
	(void)arg;
	return 0;
}

int main(void)
{
	struct kvt_daemon d;
	kvc_block a[N], b[N];
	uint64_t fr, wr, se, ca;
	pid_t p1, p2;
	int i;

	kvt_start(&d, "--pool-size", "16MiB", "--segment-size", "4MiB", NULL);
	/* Separate pipes per phase: with one, a fast worker could take the
	 * other's start byte as its own release. */
	CHECK(pipe(go) == 0 && pipe(res) == 0 && pipe(done) == 0);
	p1 = kvt_spawn(worker, NULL);
	p2 = kvt_spawn(worker, NULL);
	kvt_wait_sessions(2);
	CHECK(write(go[1], "xx", 2) == 2);
	CHECK(read(res[0], a, sizeof(a)) == (ssize_t)sizeof(a));
	CHECK(read(res[0], b, sizeof(b)) == (ssize_t)sizeof(b));
	for (i = 0; i < N; i++)
		CHECK(a[i] == b[i]);
	{
		kvc_conn *c = kvt_connect(NULL);

		kvt_pool_counts(kvt_pool(c, "p", BB), &fr, &wr, &se, &ca);
		CHECK_EQ(se, N);   /* one block per hash, held by both */
		CHECK_EQ(wr, 0);   /* duplicates freed */
		kvc_close(c);
	}
	CHECK_EQ(kvt_check(), 0);
	CHECK(write(done[1], "xx", 2) == 2);
	CHECK_EQ(kvt_wait(p1), 0);
	CHECK_EQ(kvt_wait(p2), 0);
	kvt_wait_sessions(0);
	CHECK_EQ(kvt_check(), 0);
	kvt_stop(&d);
	return 0;
}
