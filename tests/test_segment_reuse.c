/* A segment that passes from namespace a to b and back to a gets fresh memory
 * each time, and a connection of a that stayed open is sent the new memory
 * (regression: it kept its first mapping, so what it wrote and sealed read
 * as zeros elsewhere). b never sees a's bytes, a never sees b's. */
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define BB 65536
#define NB 16   /* one 1 MiB segment of 64 KiB pages */

static int all(const uint8_t *p, size_t n, uint8_t v)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != v)
			return 0;
	return 1;
}

static int reader_a(void *arg)
{
	kvc_conn *c = kvt_connect("a");
	int pool = kvt_pool(c, "p", BB), i;
	kvc_hash h[NB];
	kvc_block b[NB];

	(void)arg;
	for (i = 0; i < NB; i++)
		h[i] = kvt_hash((uint64_t)i);
	CHECK_EQ(kvc_lookup(c, pool, h, NB, b), NB);
	for (i = 0; i < NB; i++)
		CHECK(all(kvc_block_ptr(c, b[i]), BB, 0xcc));
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

	kvt_start(&d, "--pool-size", "1MiB", "--page-size", "64KiB", NULL);
	a = kvt_connect("a");
	pa = kvt_pool(a, "p", BB);
	CHECK_EQ(kvc_alloc(a, pa, NB, x), NB);
	for (i = 0; i < NB; i++) {
		old[i] = kvc_block_ptr(a, x[i]);
		memset(old[i], 0xaa, BB);
	}
	CHECK_EQ(kvc_release(a, x, NB), 0);

	/* b takes the whole segment: fresh memory, none of a's bytes. */
	b = kvt_connect("b");
	pb = kvt_pool(b, "p", BB);
	CHECK_EQ(kvc_alloc(b, pb, NB, y), NB);
	for (i = 0; i < NB; i++) {
		uint8_t *p = kvc_block_ptr(b, y[i]);

		CHECK(all(p, BB, 0));
		memset(p, 0xbb, BB);
	}
	/* a's old mapping is not b's memory. */
	for (i = 0; i < NB; i++)
		CHECK(all(old[i], BB, 0xaa));
	CHECK_EQ(kvc_release(b, y, NB), 0);
	kvc_close(b);
	kvt_wait_sessions(1);

	/* Back to a, on the connection that stayed open. */
	CHECK_EQ(kvc_alloc(a, pa, NB, x), NB);
	for (i = 0; i < NB; i++) {
		uint8_t *p = kvc_block_ptr(a, x[i]);

		CHECK(all(p, BB, 0));   /* neither b's bytes nor a's old ones */
		memset(p, 0xcc, BB);
		h[i] = kvt_hash((uint64_t)i);
	}
	CHECK_EQ(kvc_seal(a, pa, x, h, NB, x), NB);
	CHECK_EQ(kvt_wait(kvt_spawn(reader_a, NULL)), 0);
	CHECK_EQ(kvc_release(a, x, NB), 0);
	kvc_close(a);
	kvt_wait_sessions(0);
	CHECK_EQ(kvt_check(), 0);
	kvt_stop(&d);
	return 0;
}
