/* Stale, forged and foreign handles, double release, sealing twice, other
 * pools and other namespaces: each a clear error, nothing changed, and the
 * connection keeps working. */
#include <string.h>

#include "harness.h"

#define BB 8192

static void still_works(kvc_conn *c, int pool)
{
	kvc_block b;

	CHECK_EQ(kvc_alloc(c, pool, 1, &b), 1);
	CHECK_EQ(kvc_release(c, &b, 1), 0);
}

int main(void)
{
	struct kvt_daemon d;
	kvc_conn *c, *o, *t;
	kvc_block b[4], x[4], stale;
	kvc_hash h[4];
	int p, q, tp, i;

	kvt_start(&d, "--pool-size", "8MiB", "--segment-size", "2MiB", NULL);
	c = kvt_connect(NULL);
	o = kvt_connect(NULL);
	t = kvt_connect("tenant-b");
	p = kvt_pool(c, "p", BB);
	q = kvt_pool(c, "q", BB);
	CHECK_EQ(kvt_pool(o, "p", BB), p);
	tp = kvt_pool(t, "p", BB);
	CHECK(tp != p);   /* same name, another namespace: another pool */
	for (i = 0; i < 4; i++)
		h[i] = kvt_hash((uint64_t)i);

	/* Same name with another layout. */
	{
		struct kvc_pool_desc dd = { .name = "p", .block_bytes = 2 * BB, .block_tokens = 16,
					    .dtype = "fp16", .layout = "test", .layout_len = 4 };

		CHECK_EQ(kvc_register_pool(c, &dd), KVC_EEXIST);
		dd.name = "bad";
		dd.block_bytes = 1000;
		CHECK_EQ(kvc_register_pool(c, &dd), KVC_EINVAL);
	}
	CHECK_EQ(kvc_alloc(c, 999, 1, b), KVC_ENOENT);
	CHECK_EQ(kvc_alloc(t, p, 1, b), KVC_ENOENT);   /* pool of another namespace */

	CHECK_EQ(kvc_alloc(c, p, 4, b), 4);
	stale = b[3];
	CHECK_EQ(kvc_release(c, &b[3], 1), 0);
	/* Released twice: stale. */
	CHECK_EQ(kvc_release(c, &stale, 1), KVC_ESTALE);
	fprintf(stderr, "stale says: %s\n", kvc_last_error(c));
	/* Reallocated: the old handle stays stale. */
	CHECK_EQ(kvc_alloc(c, p, 1, &b[3]), 1);
	CHECK(b[3] != stale);
	CHECK_EQ(kvc_release(c, &stale, 1), KVC_ESTALE);
	/* Forged handles. */
	{
		kvc_block f[3] = { 0, ~0ull, b[0] ^ (1ull << 50) };

		for (i = 0; i < 3; i++)
			CHECK_EQ(kvc_release(c, &f[i], 1), KVC_ESTALE);
	}
	/* A batch with one bad handle changes nothing (all or nothing). */
	{
		kvc_block mix[3] = { b[0], stale, b[1] };

		CHECK_EQ(kvc_release(c, mix, 3), KVC_ESTALE);
		CHECK_EQ(kvc_fork(c, mix, 3, x), KVC_ESTALE);
	}
	/* A block of pool p sealed as pool q. */
	CHECK_EQ(kvc_seal(c, q, b, h, 1, x), KVC_ESTALE);
	/* Handles of another connection are not ours to release or seal... */
	CHECK_EQ(kvc_release(o, b, 1), KVC_ESTALE);
	CHECK_EQ(kvc_seal(o, p, b, h, 1, x), KVC_ESTALE);
	/* ...nor of another namespace's. */
	CHECK_EQ(kvc_release(t, b, 1), KVC_ESTALE);
	/* Sealing twice; listing a block twice. */
	CHECK_EQ(kvc_seal(c, p, b, h, 1, x), 1);
	CHECK_EQ(kvc_seal(c, p, b, h + 1, 1, x), KVC_ESTATE);
	{
		kvc_block two[2] = { b[1], b[1] };

		CHECK_EQ(kvc_seal(c, p, two, h + 1, 2, x), KVC_ESTATE);
		CHECK_EQ(kvc_release(c, two, 2), KVC_ESTATE);  /* held once, listed twice */
	}
	/* Repeats apart in a batch (Seal's and Release's one-pass check tells
	 * a repeat by its stamp, issue 38): refused whole while the session
	 * holds fewer references than listings, nothing dropped; taken when
	 * it holds as many. */
	{
		kvc_block rep[3] = { b[1], b[2], b[1] }, f;

		CHECK_EQ(kvc_seal(c, p, rep, h + 1, 3, x), KVC_ESTATE);
		CHECK_EQ(kvc_release(c, rep, 3), KVC_ESTATE);
		CHECK_EQ(kvc_fork(c, &b[1], 1, &f), 1);   /* b[1] held twice now */
		CHECK(f == b[1]);
		CHECK_EQ(kvt_check(), 0);
		CHECK_EQ(kvc_release(c, rep, 3), 0);
		/* b[1] and b[2] are gone: each handle is stale now. */
		CHECK_EQ(kvc_release(c, &b[1], 1), KVC_ESTALE);
		CHECK_EQ(kvc_release(c, &b[2], 1), KVC_ESTALE);
		CHECK_EQ(kvc_alloc(c, p, 2, &b[1]), 2);
		CHECK_EQ(kvt_check(), 0);
	}
	/* The other tenant does not see the sealed block. */
	CHECK_EQ(kvc_lookup(t, tp, h, 1, x), 0);
	CHECK_EQ(kvc_lookup(o, p, h, 1, x), 1);
	CHECK(x[0] == b[0]);
	CHECK_EQ(kvc_release(o, x, 1), 0);
	CHECK_EQ(kvc_release(o, x, 1), KVC_ESTALE);
	/* Empty batches: nothing to do. */
	CHECK_EQ(kvc_release(c, b, 0), 0);
	CHECK_EQ(kvc_lookup(c, p, h, 0, x), 0);

	still_works(c, p);
	still_works(o, p);
	still_works(t, tp);
	CHECK_EQ(kvt_check(), 0);
	CHECK_EQ(kvc_release(c, b, 4), 0);
	kvc_close(c);
	kvc_close(o);
	kvc_close(t);
	kvt_wait_sessions(0);
	CHECK_EQ(kvt_check(), 0);
	kvt_stop(&d);
	return 0;
}
