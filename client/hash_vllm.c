/* vLLM-compatible block hashes (kvcache.h, "vLLM-compatible block hashes"):
 * what vLLM computes with prefix_caching_hash_algo = "sha256_cbor", so that a
 * router that indexes vLLM engines by block hash (llm-d's kv-cache indexer,
 * Dynamo's router) recognizes the blocks kvcached's workers seal.
 *
 * vLLM (vllm/v1/core/kv_cache_utils.py, hash_block_tokens and init_none_hash;
 * vllm/utils/hashing.py, sha256_cbor):
 *
 *   sha256_cbor(x) = SHA-256(cbor2.dumps(x, canonical=True))
 *   NONE_HASH      = sha256_cbor(os.environ["PYTHONHASHSEED"])   (a str)
 *   h_i            = sha256_cbor((h_{i-1} or NONE_HASH, tuple(tokens), extra_keys))
 *   extra_keys     = None, or a tuple: [lora_name] + mm keys + [cache_salt
 *                    on the first block only] + prompt-embeds keys
 *
 * Only the CBOR that these values produce is needed: arrays, byte strings,
 * text strings, unsigned integers and null, in the shortest ("canonical",
 * RFC 8949 section 4.2.1) head encoding. The serialization is fed to SHA-256
 * piece by piece; it is never built in memory. Multimodal and prompt-embeds
 * keys are not covered (documented in kvcache.h). */
#include "kvc_internal.h"

#include <errno.h>
#include <limits.h>
#include <string.h>

#include <openssl/evp.h>

enum { CBOR_UINT = 0, CBOR_BYTES = 2, CBOR_TEXT = 3, CBOR_ARRAY = 4 };
#define CBOR_NULL 0xf6

/* Returns 0 or -ENOMEM. */
static int put(EVP_MD_CTX *md, const void *p, size_t n)
{
	return n == 0 || EVP_DigestUpdate(md, p, n) == 1 ? 0 : -ENOMEM;
}

/* The head of a data item: major type and argument, shortest form. */
static int put_head(EVP_MD_CTX *md, unsigned major, uint64_t v)
{
	uint8_t b[9];
	size_t n, i;

	if (v < 24) {
		b[0] = (uint8_t)(major << 5 | v);
		return put(md, b, 1);
	}
	n = v <= 0xff ? 1 : v <= 0xffff ? 2 : v <= 0xffffffffu ? 4 : 8;
	b[0] = (uint8_t)(major << 5 | (n == 1 ? 24 : n == 2 ? 25 : n == 4 ? 26 : 27));
	for (i = 0; i < n; i++)
		b[1 + i] = (uint8_t)(v >> (8 * (n - 1 - i)));
	return put(md, b, 1 + n);
}

static int put_str(EVP_MD_CTX *md, unsigned major, const void *p, size_t n)
{
	int r = put_head(md, major, n);

	return r ? r : put(md, p, n);
}

static int digest_begin(EVP_MD_CTX *md)
{
	return EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1 ? 0 : -ENOMEM;
}

static int digest_end(EVP_MD_CTX *md, kvc_hash *out)
{
	unsigned int len = 0;

	return EVP_DigestFinal_ex(md, out->b, &len) == 1 && len == sizeof(out->b) ? 0 : -ENOMEM;
}

/* h = sha256_cbor((parent, tuple(tokens), extra_keys)). first: the block
 * that carries the cache salt. Returns 0 or -ENOMEM. */
static int block(EVP_MD_CTX *md, const kvc_hash *parent, const uint32_t *tokens, size_t n,
		 const struct kvc_vllm_keys *k, int first, kvc_hash *out)
{
	const char *lora = k && k->lora_name ? k->lora_name : NULL;
	const char *salt = first && k && k->cache_salt && k->cache_salt[0] ? k->cache_salt : NULL;
	unsigned nextra = (lora != NULL) + (salt != NULL);
	size_t i;
	int r;

	if ((r = digest_begin(md)) || (r = put_head(md, CBOR_ARRAY, 3)) ||
	    (r = put_str(md, CBOR_BYTES, parent->b, sizeof(parent->b))) ||
	    (r = put_head(md, CBOR_ARRAY, n)))
		return r;
	for (i = 0; i < n; i++)
		if ((r = put_head(md, CBOR_UINT, tokens[i])))
			return r;
	if (!nextra) {
		uint8_t null = CBOR_NULL;

		r = put(md, &null, 1);
	} else if (!(r = put_head(md, CBOR_ARRAY, nextra))) {
		if (lora)
			r = put_str(md, CBOR_TEXT, lora, strlen(lora));
		if (!r && salt)
			r = put_str(md, CBOR_TEXT, salt, strlen(salt));
	}
	return r ? r : digest_end(md, out);
}

KVC_PUBLIC int kvc_hash_vllm_seed(const char *pythonhashseed, kvc_hash *out)
{
	EVP_MD_CTX *md;
	int r;

	if (!pythonhashseed || !out)
		return -EINVAL;
	if (!(md = EVP_MD_CTX_new()))
		return -ENOMEM;
	r = digest_begin(md);
	if (!r)
		r = put_str(md, CBOR_TEXT, pythonhashseed, strlen(pythonhashseed));
	if (!r)
		r = digest_end(md, out);
	EVP_MD_CTX_free(md);
	return r;
}

KVC_PUBLIC int kvc_hash_vllm_block(const kvc_hash *parent, const uint32_t *tokens,
				   size_t ntokens, const struct kvc_vllm_keys *keys, int first,
				   kvc_hash *out)
{
	EVP_MD_CTX *md;
	int r;

	if (!parent || !out || (!tokens && ntokens))
		return -EINVAL;
	if (!(md = EVP_MD_CTX_new()))
		return -ENOMEM;
	r = block(md, parent, tokens, ntokens, keys, first, out);
	EVP_MD_CTX_free(md);
	return r;
}

KVC_PUBLIC int kvc_hash_vllm_chain(const char *pythonhashseed, const uint32_t *tokens,
				   size_t ntokens, uint32_t block_tokens,
				   const struct kvc_vllm_keys *keys, kvc_hash *out, size_t max)
{
	EVP_MD_CTX *md;
	kvc_hash parent, cur;
	size_t n, i;
	int r;

	if (!pythonhashseed || block_tokens == 0 || (!tokens && ntokens) || (!out && max))
		return -EINVAL;
	if ((r = kvc_hash_vllm_seed(pythonhashseed, &parent)) < 0)
		return r;
	n = ntokens / block_tokens;
	if (n > max)
		n = max;
	if (n > INT_MAX)
		n = INT_MAX;
	if (!(md = EVP_MD_CTX_new()))
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		r = block(md, &parent, tokens + i * block_tokens, block_tokens, keys, i == 0, &cur);
		if (r < 0)
			break;
		out[i] = cur;
		parent = cur;
	}
	EVP_MD_CTX_free(md);
	return r < 0 ? r : (int)n;
}
