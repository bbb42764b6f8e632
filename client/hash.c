/* Block content hashes (see kvcache.h for the serialization). The bytes fed
 * to H never depend on the host: every integer is little endian, so hashes
 * agree across processes, machines and restarts. Hashing is incremental: the
 * block's serialization is never built in memory. */
#include "kvc_internal.h"

#include <errno.h>
#include <limits.h>
#include <string.h>

#include <openssl/evp.h>
#include <xxhash.h>

/* SHA-256("kvcached/prefix/v1"); tests/test_hash.c recomputes it. */
static const kvc_hash seed = { {
	0xf7, 0x77, 0x4e, 0xe3, 0xf0, 0x53, 0x33, 0x17, 0xd9, 0x91, 0x3c, 0x64, 0x5c, 0xf0, 0x00, 0x2c,
	0x0a, 0xce, 0x41, 0x58, 0x41, 0xa4, 0xa4, 0x1e, 0x43, 0xd8, 0xfe, 0x26, 0x9b, 0xd5, 0xd2, 0x40,
} };

KVC_PUBLIC void kvc_hash_seed(kvc_hash *out)
{
	*out = seed;
}

/* One hash function, reusable across the blocks of a chain. */
struct hasher {
	enum kvc_hash_algo algo;
	EVP_MD_CTX *md;
	XXH3_state_t *xx;
};

static void hasher_fini(struct hasher *h)
{
	EVP_MD_CTX_free(h->md);
	XXH3_freeState(h->xx);
}

/* Returns 0, -EINVAL (unknown algo) or -ENOMEM. */
static int hasher_init(struct hasher *h, enum kvc_hash_algo algo)
{
	h->algo = algo;
	h->md = NULL;
	h->xx = NULL;
	switch (algo) {
	case KVC_HASH_SHA256:
		h->md = EVP_MD_CTX_new();
		return h->md ? 0 : -ENOMEM;
	case KVC_HASH_XXH3_128:
		h->xx = XXH3_createState();
		return h->xx ? 0 : -ENOMEM;
	}
	return -EINVAL;
}

static int hasher_begin(struct hasher *h)
{
	if (h->md)
		return EVP_DigestInit_ex(h->md, EVP_sha256(), NULL) == 1 ? 0 : -ENOMEM;
	return XXH3_128bits_reset(h->xx) == XXH_OK ? 0 : -EINVAL;
}

static int hasher_update(struct hasher *h, const void *p, size_t n)
{
	if (n == 0)
		return 0;
	if (h->md)
		return EVP_DigestUpdate(h->md, p, n) == 1 ? 0 : -ENOMEM;
	return XXH3_128bits_update(h->xx, p, n) == XXH_OK ? 0 : -EINVAL;
}

static int hasher_final(struct hasher *h, kvc_hash *out)
{
	kvc_hash r;

	memset(&r, 0, sizeof(r));
	if (h->md) {
		unsigned int len = 0;

		if (EVP_DigestFinal_ex(h->md, r.b, &len) != 1 || len != sizeof(r.b))
			return -ENOMEM;
	} else {
		XXH128_canonical_t canon;

		XXH128_canonicalFromHash(&canon, XXH3_128bits_digest(h->xx));
		memcpy(r.b, canon.digest, sizeof(canon.digest));
	}
	*out = r;
	return 0;
}

static void put_u32le(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static void put_u64le(uint8_t *p, uint64_t v)
{
	put_u32le(p, (uint32_t)v);
	put_u32le(p + 4, (uint32_t)(v >> 32));
}

static int update_u32(struct hasher *h, uint32_t v)
{
	uint8_t b[4];

	put_u32le(b, v);
	return hasher_update(h, b, sizeof(b));
}

static int update_tokens(struct hasher *h, const uint32_t *tokens, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	return hasher_update(h, tokens, n * sizeof(*tokens));
#else
	uint8_t buf[1024];
	int r;

	while (n > 0) {
		size_t i, k = n < sizeof(buf) / 4 ? n : sizeof(buf) / 4;

		for (i = 0; i < k; i++)
			put_u32le(buf + 4 * i, tokens[i]);
		r = hasher_update(h, buf, 4 * k);
		if (r < 0)
			return r;
		tokens += k;
		n -= k;
	}
	return 0;
#endif
}

static bool extra_valid(const struct kvc_hash_extra *e)
{
	return !e || ((e->salt || e->salt_len == 0) && (e->mm || e->mm_len == 0) &&
		      e->salt_len <= UINT32_MAX && e->mm_len <= UINT32_MAX);
}

/* Returns 0 or -errno. */
static int hash_one(struct hasher *h, const kvc_hash *parent, const uint32_t *tokens,
		    size_t ntokens, const struct kvc_hash_extra *e, kvc_hash *out)
{
	static const struct kvc_hash_extra none;
	uint8_t lora[8];
	int r;

	if (!e)
		e = &none;
	put_u64le(lora, e->lora_id);
	r = hasher_begin(h);
	if (!r)
		r = hasher_update(h, parent->b, sizeof(parent->b));
	if (!r)
		r = update_u32(h, (uint32_t)ntokens);
	if (!r)
		r = update_tokens(h, tokens, ntokens);
	if (!r)
		r = hasher_update(h, lora, sizeof(lora));
	if (!r)
		r = update_u32(h, (uint32_t)e->salt_len);
	if (!r)
		r = hasher_update(h, e->salt, e->salt_len);
	if (!r)
		r = update_u32(h, (uint32_t)e->mm_len);
	if (!r)
		r = hasher_update(h, e->mm, e->mm_len);
	if (!r)
		r = hasher_final(h, out);
	return r;
}

/* Returns 0, -EINVAL (unknown algo, NULL or oversize input) or -ENOMEM. */
KVC_PUBLIC int kvc_hash_block(enum kvc_hash_algo algo, const kvc_hash *parent,
			      const uint32_t *tokens, size_t ntokens,
			      const struct kvc_hash_extra *extra, kvc_hash *out)
{
	struct hasher h;
	int r;

	if (!out || (!tokens && ntokens) || ntokens > UINT32_MAX || !extra_valid(extra))
		return -EINVAL;
	r = hasher_init(&h, algo);
	if (r < 0)
		goto out;
	r = hash_one(&h, parent ? parent : &seed, tokens, ntokens, extra, out);
out:
	hasher_fini(&h);
	return r;
}

/* Returns the number of hashes written, -EINVAL or -ENOMEM. out is written
 * only on success. */
KVC_PUBLIC int kvc_hash_chain(enum kvc_hash_algo algo, const uint32_t *tokens, size_t ntokens,
			      uint32_t block_tokens, const struct kvc_hash_extra *extra,
			      kvc_hash *out, size_t max)
{
	struct hasher h;
	kvc_hash parent = seed, cur;
	size_t n, i;
	int r;

	if (block_tokens == 0 || (!tokens && ntokens) || (!out && max) || !extra_valid(extra))
		return -EINVAL;
	n = ntokens / block_tokens;
	if (n > max)
		n = max;
	if (n > INT_MAX)
		n = INT_MAX;
	r = hasher_init(&h, algo);
	if (r < 0)
		goto out;
	/* The only failure past the first block is OpenSSL running out of
	 * memory; out[0..i) then holds correct hashes, which is harmless. */
	for (i = 0; i < n; i++) {
		r = hash_one(&h, &parent, tokens + i * block_tokens, block_tokens, extra, &cur);
		if (r < 0)
			goto out;
		out[i] = cur;
		parent = cur;
	}
	r = (int)n;
out:
	hasher_fini(&h);
	return r;
}
