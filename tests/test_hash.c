/* Block hashes: kvc_hash_seed/block/chain against the serialization that
 * kvcache.h documents, built here by hand and hashed in one shot. Exits 0
 * (pass) or 1 (fail). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <xxhash.h>

#include "kvcache.h"

static int failures;

#define CHECK(cond)                                                                      \
	do {                                                                             \
		if (!(cond)) {                                                           \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, \
				#cond);                                                  \
			failures++;                                                      \
		}                                                                        \
	} while (0)

/* --- the reference: one buffer, one-shot hash ---------------------------- */

struct buf {
	uint8_t *p;
	size_t len, cap;
};

static void put(struct buf *b, const void *p, size_t n)
{
	if (b->len + n > b->cap) {
		b->cap = (b->len + n) * 2;
		b->p = realloc(b->p, b->cap);
		if (!b->p) {
			perror("realloc");
			exit(1);
		}
	}
	if (n)
		memcpy(b->p + b->len, p, n);
	b->len += n;
}

static void put_le(struct buf *b, uint64_t v, int bytes)
{
	uint8_t x[8];
	int i;

	for (i = 0; i < bytes; i++)
		x[i] = (uint8_t)(v >> (8 * i));
	put(b, x, (size_t)bytes);
}

static void sha256(const void *p, size_t n, kvc_hash *out)
{
	unsigned int len = 0;

	memset(out, 0, sizeof(*out));
	if (EVP_Digest(p, n, out->b, &len, EVP_sha256(), NULL) != 1 || len != 32) {
		fprintf(stderr, "EVP_Digest failed\n");
		exit(1);
	}
}

static void xxh128(const void *p, size_t n, kvc_hash *out)
{
	XXH128_canonical_t c;

	XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
	memset(out, 0, sizeof(*out));
	memcpy(out->b, c.digest, 16);
}

static void ref_block(enum kvc_hash_algo algo, const kvc_hash *parent, const uint32_t *t,
		      size_t n, const struct kvc_hash_extra *e, kvc_hash *out)
{
	struct buf b = { 0 };
	size_t i;

	put(&b, parent->b, 32);
	put_le(&b, n, 4);
	for (i = 0; i < n; i++)
		put_le(&b, t[i], 4);
	put_le(&b, e ? e->lora_id : 0, 8);
	put_le(&b, e ? e->salt_len : 0, 4);
	if (e)
		put(&b, e->salt, e->salt_len);
	put_le(&b, e ? e->mm_len : 0, 4);
	if (e)
		put(&b, e->mm, e->mm_len);
	if (algo == KVC_HASH_SHA256)
		sha256(b.p, b.len, out);
	else
		xxh128(b.p, b.len, out);
	free(b.p);
}

static int eq(const kvc_hash *a, const kvc_hash *b)
{
	return memcmp(a->b, b->b, 32) == 0;
}

/* --- the tests ----------------------------------------------------------- */

static void test_seed(void)
{
	static const char text[] = "kvcached/prefix/v1";
	kvc_hash s, want;

	CHECK(sizeof(text) - 1 == 18);
	sha256(text, sizeof(text) - 1, &want);
	kvc_hash_seed(&s);
	CHECK(eq(&s, &want));
}

static void test_block(enum kvc_hash_algo algo)
{
	static const uint32_t toks[] = { 0, 1, 0xdeadbeef, 50256, 0xffffffff, 7, 128000 };
	static const uint8_t salt[] = "tenant-a";
	static const uint8_t mm[] = { 0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88 };
	struct kvc_hash_extra extras[] = {
		{ 0 },
		{ .lora_id = 42 },
		{ .lora_id = 0x0102030405060708ull, .salt = salt, .salt_len = sizeof(salt) - 1 },
		{ .mm = mm, .mm_len = sizeof(mm) },
		{ .lora_id = 3, .salt = salt, .salt_len = 3, .mm = mm, .mm_len = 5 },
	};
	kvc_hash seed, parent, got, want;
	size_t i, n;

	kvc_hash_seed(&seed);
	memset(&parent, 0xa5, sizeof(parent));
	for (n = 0; n <= sizeof(toks) / sizeof(toks[0]); n += 3) {
		/* No extra keys: NULL and all-zero must agree. */
		CHECK(kvc_hash_block(algo, NULL, toks, n, NULL, &got) == 0);
		ref_block(algo, &seed, toks, n, NULL, &want);
		CHECK(eq(&got, &want));
		for (i = 0; i < sizeof(extras) / sizeof(extras[0]); i++) {
			CHECK(kvc_hash_block(algo, &parent, toks, n, &extras[i], &got) == 0);
			ref_block(algo, &parent, toks, n, &extras[i], &want);
			CHECK(eq(&got, &want));
			CHECK(kvc_hash_block(algo, NULL, toks, n, &extras[i], &got) == 0);
			ref_block(algo, &seed, toks, n, &extras[i], &want);
			CHECK(eq(&got, &want));
		}
	}
	if (algo == KVC_HASH_XXH3_128) {
		static const uint8_t zero[16];

		CHECK(kvc_hash_block(algo, NULL, toks, 4, NULL, &got) == 0);
		CHECK(memcmp(got.b + 16, zero, 16) == 0);
	}
}

static void test_chain(enum kvc_hash_algo algo)
{
	enum { NTOK = 100, BT = 16, NB = NTOK / BT };
	static const uint8_t salt[] = "s";
	struct kvc_hash_extra ex = { .lora_id = 9, .salt = salt, .salt_len = 1 };
	struct kvc_hash_extra lora = { .lora_id = 10 };
	uint32_t toks[NTOK];
	kvc_hash h[NB + 2], again[NB + 2], other[NB + 2], want, parent;
	int i, n;

	for (i = 0; i < NTOK; i++)
		toks[i] = (uint32_t)(i * 2654435761u);

	n = kvc_hash_chain(algo, toks, NTOK, BT, NULL, h, NB + 2);
	CHECK(n == NB);
	kvc_hash_seed(&parent);
	for (i = 0; i < NB; i++) {
		CHECK(kvc_hash_block(algo, &parent, toks + i * BT, BT, NULL, &want) == 0);
		CHECK(eq(&h[i], &want));
		parent = want;
	}
	/* Deterministic. */
	CHECK(kvc_hash_chain(algo, toks, NTOK, BT, NULL, again, NB) == NB);
	for (i = 0; i < NB; i++)
		CHECK(eq(&h[i], &again[i]));
	/* max caps the count. */
	CHECK(kvc_hash_chain(algo, toks, NTOK, BT, NULL, again, 2) == 2);
	CHECK(kvc_hash_chain(algo, toks, BT - 1, BT, NULL, again, NB) == 0);

	/* Extra keys change every hash. */
	CHECK(kvc_hash_chain(algo, toks, NTOK, BT, &ex, other, NB) == NB);
	for (i = 0; i < NB; i++)
		CHECK(!eq(&h[i], &other[i]));
	CHECK(kvc_hash_chain(algo, toks, NTOK, BT, &lora, again, NB) == NB);
	for (i = 0; i < NB; i++)
		CHECK(!eq(&again[i], &other[i]) && !eq(&again[i], &h[i]));
	/* ... and the chain with them is the hand-built one. */
	kvc_hash_seed(&parent);
	for (i = 0; i < NB; i++) {
		ref_block(algo, &parent, toks + i * BT, BT, &ex, &want);
		CHECK(eq(&other[i], &want));
		parent = want;
	}

	/* A token changed in block 2 changes hashes 2.. and nothing before. */
	toks[2 * BT + 5] ^= 1;
	CHECK(kvc_hash_chain(algo, toks, NTOK, BT, NULL, other, NB) == NB);
	for (i = 0; i < NB; i++)
		CHECK(eq(&h[i], &other[i]) == (i < 2));
	/* A token past the last full block changes nothing. */
	toks[2 * BT + 5] ^= 1;
	toks[NTOK - 1] ^= 1;
	CHECK(kvc_hash_chain(algo, toks, NTOK, BT, NULL, other, NB) == NB);
	for (i = 0; i < NB; i++)
		CHECK(eq(&h[i], &other[i]));
}

static void test_algos_differ(void)
{
	static const uint32_t toks[] = { 1, 2, 3 };
	kvc_hash a, b;

	CHECK(kvc_hash_block(KVC_HASH_SHA256, NULL, toks, 3, NULL, &a) == 0);
	CHECK(kvc_hash_block(KVC_HASH_XXH3_128, NULL, toks, 3, NULL, &b) == 0);
	CHECK(!eq(&a, &b));
}

static void test_errors(void)
{
	static const uint32_t toks[] = { 1, 2, 3 };
	struct kvc_hash_extra bad = { .salt = NULL, .salt_len = 4 };
	kvc_hash h, before;

	memset(&h, 0x5a, sizeof(h));
	before = h;
	CHECK(kvc_hash_block((enum kvc_hash_algo)7, NULL, toks, 3, NULL, &h) == -EINVAL);
	CHECK(kvc_hash_block(KVC_HASH_SHA256, NULL, NULL, 3, NULL, &h) == -EINVAL);
	CHECK(kvc_hash_block(KVC_HASH_SHA256, NULL, toks, 3, &bad, &h) == -EINVAL);
	CHECK(eq(&h, &before));
	CHECK(kvc_hash_chain(KVC_HASH_SHA256, toks, 3, 0, NULL, &h, 1) == -EINVAL);
	CHECK(kvc_hash_chain((enum kvc_hash_algo)7, toks, 3, 1, NULL, &h, 1) == -EINVAL);
	CHECK(eq(&h, &before));
}

int main(void)
{
	test_seed();
	test_block(KVC_HASH_SHA256);
	test_block(KVC_HASH_XXH3_128);
	test_chain(KVC_HASH_SHA256);
	test_chain(KVC_HASH_XXH3_128);
	test_algos_differ();
	test_errors();
	if (failures) {
		fprintf(stderr, "test_hash: %d checks failed\n", failures);
		return 1;
	}
	printf("test_hash: ok\n");
	return 0;
}
