/* A segment that passes from namespace a to b and back to a gets fresh memory
 * each time, and a connection of a that stayed open is sent the new memory
 * (regression: it kept its first mapping, so what it wrote and sealed read
 * as zeros elsewhere). b never sees a's bytes, a never sees b's. */
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define BB 131072
#define NB 16   /* one 2 MiB segment (the smallest on cuda) of 128 KiB pages */

static int go[2];

/* Forked before the parent touches block memory (CUDA does not survive
 * fork()); connects when told. */
static int reader_a(void *arg)
{
	kvc_conn *c;
	kvc_hash h[NB];
	kvc_block b[NB];
	int pool, i;
	char x;

	(void)arg;
	CHECK(read(go[0], &x, 1) == 1);
	c = kvt_connect("a");
	pool = kvt_pool(c, "p", BB);
	for (i = 0; i < NB; i++)
		h[i] = kvt_hash((uint64_t)i);
	CHECK_EQ(kvc_lookup(c, pool, h, NB, b), NB);
	for (i = 0; i < NB; i++)
		CHECK(kvt_mem_all(c, kvc_block_ptr(c, b[i]), 0xcc, BB));
	kvc_close(c);
	return 0;
}

int main(void)
{
	struct kvt_daemon d;
	kvc_conn *a, *b;
	kvc_block x[NB], y[NB];
	kvc_hash h[NB];
	uint8_t *old[NB];
	int pa, pb, i;
	pid_t reader;

	kvt_start(&d, "--pool-size", "2MiB", "--page-size", "128KiB", NULL);
	CHECK(pipe(go) == 0);
	reader = kvt_spawn(reader_a, NULL);
	a = kvt_connect("a");
	pa = kvt_pool(a, "p", BB);
	CHECK_EQ(kvc_alloc(a, pa, NB, x), NB);
	for (i = 0; i < NB; i++) {
		old[i] = kvc_block_ptr(a, x[i]);
		kvt_mem_set(a, old[i], 0xaa, BB);
	}
	CHECK_EQ(kvc_release(a, x, NB), 0);

	/* b takes the whole segment: fresh memory, none of a's bytes. */
	b = kvt_connect("b");
	pb = kvt_pool(b, "p", BB);
	CHECK_EQ(kvc_alloc(b, pb, NB, y), NB);
	for (i = 0; i < NB; i++) {
		uint8_t *p = kvc_block_ptr(b, y[i]);

		CHECK(kvt_mem_all(b, p, 0, BB));
		kvt_mem_set(b, p, 0xbb, BB);
	}
	/* a's old mapping is not b's memory. */
	for (i = 0; i < NB; i++)
		CHECK(kvt_mem_all(a, old[i], 0xaa, BB));
	CHECK_EQ(kvc_release(b, y, NB), 0);
	kvc_close(b);
	kvt_wait_sessions(1);

	/* Back to a, on the connection that stayed open. */
	CHECK_EQ(kvc_alloc(a, pa, NB, x), NB);
	for (i = 0; i < NB; i++) {
		uint8_t *p = kvc_block_ptr(a, x[i]);

		CHECK(kvt_mem_all(a, p, 0, BB));   /* neither b's bytes nor a's old ones */
		kvt_mem_set(a, p, 0xcc, BB);
		h[i] = kvt_hash((uint64_t)i);
	}
	CHECK_EQ(kvc_seal(a, pa, x, h, NB, x), NB);
	CHECK(write(go[1], "g", 1) == 1);
	CHECK_EQ(kvt_wait(reader), 0);
	CHECK_EQ(kvc_release(a, x, NB), 0);
	kvc_close(a);
	kvt_wait_sessions(0);
	CHECK_EQ(kvt_check(), 0);
	kvt_stop(&d);
	return 0;
}
