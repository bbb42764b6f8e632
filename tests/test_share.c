/* Two worker processes share a sealed prefix: the reader finds it by lookup
 * and sees the writer's bytes through its own mapping; a diverging suffix
 * misses. Then fork and copy-on-write between processes. */
#include <string.h>

#include "harness.h"

#define BB 65536
#define NB 24
#define TOK 16

static uint32_t tokens[(NB + 4) * TOK];

static int writer(void *arg)
{
	kvc_conn *c = kvt_connect(NULL);
	int pool = kvt_pool(c, "llama", BB), i;
	kvc_hash h[NB];
	kvc_block b[NB];

	(void)arg;
	CHECK_EQ(kvc_hash_chain(KVC_HASH_SHA256, tokens, NB * TOK, TOK, NULL, h, NB), NB);
	CHECK_EQ(kvc_lookup(c, pool, h, NB, b), 0);
	CHECK_EQ(kvc_alloc(c, pool, NB, b), NB);
	for (i = 0; i < NB; i++) {
		uint8_t *p = kvc_block_ptr(c, b[i]);

		CHECK(p != NULL);
		kvt_mem_fill(c, p, BB, (uint64_t)i);
	}
	CHECK_EQ(kvc_seal(c, pool, b, h, NB, b), NB);
	CHECK_EQ(kvc_release(c, b, NB), 0);
	kvc_close(c);
	return 0;
}

static int reader(void *arg)
{
	kvc_conn *c = kvt_connect(NULL);
	int pool = kvt_pool(c, "llama", BB), i, k;
	uint32_t mine[(NB + 4) * TOK];
	kvc_hash h[NB + 4];
	kvc_block b[NB + 4];

	(void)arg;
	/* Same first NB - 4 blocks, then a different user turn. */
	memcpy(mine, tokens, sizeof(mine));
	for (i = (NB - 4) * TOK; i < (NB + 4) * TOK; i++)
		mine[i] = 900000 + (uint32_t)i;
	CHECK_EQ(kvc_hash_chain(KVC_HASH_SHA256, mine, (NB + 4) * TOK, TOK, NULL, h, NB + 4), NB + 4);
	k = kvc_lookup(c, pool, h, NB + 4, b);
	CHECK_EQ(k, NB - 4);
	for (i = 0; i < k; i++) {
		const uint8_t *p = kvc_block_ptr(c, b[i]);

		CHECK(p != NULL);
		CHECK(kvt_mem_verify(c, p, BB, (uint64_t)i));
	}
	/* Another salt is another prefix: nothing matches. */
	{
		struct kvc_hash_extra x = { .salt = "tenant-b", .salt_len = 8 };
		kvc_hash hs[4];
		kvc_block bs[4];

		CHECK_EQ(kvc_hash_chain(KVC_HASH_SHA256, mine, 4 * TOK, TOK, &x, hs, 4), 4);
		CHECK_EQ(kvc_lookup(c, pool, hs, 4, bs), 0);
	}
	CHECK_EQ(kvc_release(c, b, (size_t)k), 0);
	kvc_close(c);
	return 0;
}

/* Beam search: a process forks its writable block, copies it on write and
 * the two diverge; the shared original is untouched. */
static int cow(void *arg)
{
	kvc_conn *c = kvt_connect(NULL);
	int pool = kvt_pool(c, "llama", BB);
	kvc_block b, f, w, w2;
	uint8_t *pb, *pw;

	(void)arg;
	CHECK_EQ(kvc_alloc(c, pool, 1, &b), 1);
	pb = kvc_block_ptr(c, b);
	kvt_mem_fill(c, pb, BB, 777);
	/* Exclusive writable: cow returns the block itself. */
	CHECK_EQ(kvc_cow(c, &b, 1, &w), 1);
	CHECK(w == b);
	CHECK_EQ(kvc_fork(c, &b, 1, &f), 1);
	CHECK(f == b);
	CHECK_EQ(kvc_cow(c, &f, 1, &w), 1);
	CHECK(w != b);
	pw = kvc_block_ptr(c, w);
	CHECK(pw != NULL && pw != pb);
	CHECK(kvt_mem_verify(c, pw, BB, 777));
	kvt_mem_set(c, pw, 0x11, 64);
	CHECK(kvt_mem_verify(c, pb, BB, 777));
	/* The original is held once now; the copy once. */
	CHECK_EQ(kvc_release(c, &b, 1), 0);
	CHECK_EQ(kvc_release(c, &b, 1), KVC_ESTALE);
	/* cow of a sealed block gives a writable copy. */
	{
		kvc_hash h = kvt_hash(4242);

		CHECK_EQ(kvc_seal(c, pool, &w, &h, 1, &w), 1);
		CHECK_EQ(kvc_cow(c, &w, 1, &w2), 1);
		CHECK(w2 != w);
		CHECK(kvt_mem_all(c, kvc_block_ptr(c, w2), 0x11, 1));
		/* cow dropped our reference on w: it is cached, and sealing the
		 * copy under the same hash dedups back onto it. */
		CHECK_EQ(kvc_seal(c, pool, &w2, &h, 1, &w2), 1);
		CHECK(w2 == w);
		CHECK_EQ(kvc_release(c, &w2, 1), 0);
		CHECK_EQ(kvc_release(c, &w, 1), KVC_ESTALE);
	}
	kvc_close(c);
	return 0;
}

int main(void)
{
	struct kvt_daemon d;
	uint64_t fr, wr, se, ca;
	int i;

	for (i = 0; i < (NB + 4) * TOK; i++)
		tokens[i] = (uint32_t)(i * 31 + 7);
	kvt_start(&d, "--pool-size", "32MiB", "--segment-size", "4MiB", NULL);
	CHECK_EQ(kvt_wait(kvt_spawn(writer, NULL)), 0);
	CHECK_EQ(kvt_wait(kvt_spawn(reader, NULL)), 0);
	CHECK_EQ(kvt_wait(kvt_spawn(cow, NULL)), 0);
	kvt_wait_sessions(0);
	CHECK_EQ(kvt_check(), 0);
	{
		kvc_conn *c = kvt_connect(NULL);
		int pool = kvt_pool(c, "llama", BB);

		kvt_pool_counts(pool, &fr, &wr, &se, &ca);
		CHECK_EQ(wr, 0);
		CHECK_EQ(se, 0);
		CHECK_EQ(ca, NB + 1);
		kvc_close(c);
	}
	kvt_stop(&d);
	return 0;
}
