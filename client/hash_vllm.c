/* vLLM-compatible block hashes (kvcache.h, "vLLM-compatible block hashes"):
 * what vLLM computes with prefix_caching_hash_algo = "sha256_cbor", so that a
 * router that indexes vLLM engines by block hash (llm-d's kv-cache indexer,
 * Dynamo's router) recognizes the blocks kvcached's workers seal.
 *
 * vLLM 0.33 (vllm/v1/core/kv_cache_utils.py: init_none_hash,
 * resolve_none_hash_seed, hash_block_tokens, generate_block_hash_extra_keys;
 * vllm/utils/hashing.py: sha256_cbor):
 *
 *   sha256_cbor(x) = SHA-256(cbor2.dumps(x, canonical=True))
 *   NONE_HASH      = sha256_cbor(PYTHONHASHSEED, else "vllm-none-hash")  (a str)
 *   h_i            = sha256_cbor((h_{i-1} or NONE_HASH, tuple(tokens), extra_keys))
 *   extra_keys     = None, or a tuple of tagged keys, in this order:
 *                    ("lora", name, path), ("mm", identifier, offset in the
 *                    block) per multimodal item the block overlaps,
 *                    ("cache_salt", salt) on the first block only,
 *                    ("prompt_embeds", sha256 of the block's embeddings)
 *
 * vLLM 0.30 and earlier hashed the keys untagged ([lora_name, cache_salt]):
 * kvc_hash_vllm_block()/kvc_hash_vllm_chain() keep that form, as an explicit
 * compatibility option.
 *
 * Only the CBOR that these values produce is needed: arrays, byte strings,
 * text strings, integers and null, in the shortest ("canonical", RFC 8949
 * section 4.2.1) head encoding. The serialization is fed to SHA-256 piece by
 * piece; it is never built in memory. */
#include "kvc_internal.h"

#include <errno.h>
#include <limits.h>
#include <string.h>

#include <openssl/evp.h>

enum { CBOR_UINT = 0, CBOR_NEGINT = 1, CBOR_BYTES = 2, CBOR_TEXT = 3, CBOR_ARRAY = 4 };
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

static int put_text(EVP_MD_CTX *md, const char *s)
{
	return put_str(md, CBOR_TEXT, s, strlen(s));
}

/* A signed integer: major type 1 holds -1 - v. */
static int put_int(EVP_MD_CTX *md, int64_t v)
{
	return v >= 0 ? put_head(md, CBOR_UINT, (uint64_t)v)
		      : put_head(md, CBOR_NEGINT, (uint64_t)(-(v + 1)));
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

/* ---- vLLM <= 0.30: untagged extra keys (compatibility) ---- */

/* h = sha256_cbor((parent, tuple(tokens), extra_keys)) with extra_keys
 * [lora_name, cache_salt]. first: the block that carries the cache salt.
 * Returns 0 or -ENOMEM. */
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

/* ---- vLLM >= 0.31: tagged extra keys ---- */

/* The multimodal items block [s, e) overlaps, as _gen_mm_extra_hash_keys
 * walks them (items sorted by offset): writes each as ("mm", identifier,
 * offset - s), or only counts them when md is NULL. Returns the count or
 * -ENOMEM. */
static int mm_keys(EVP_MD_CTX *md, const struct kvc_vllm_extra *x, uint64_t s, uint64_t e)
{
	size_t i;
	int n = 0, r;

	for (i = 0; i < x->nmm; i++) {
		const struct kvc_vllm_mm *m = &x->mm[i];
		uint64_t end = m->offset + m->length;

		if (e <= m->offset)
			break;  /* the block has not reached this item */
		if (s >= end)
			continue;  /* the block is past it */
		if (md && ((r = put_head(md, CBOR_ARRAY, 3)) || (r = put_text(md, "mm")) ||
			   (r = put_text(md, m->identifier)) ||
			   (r = put_int(md, (int64_t)m->offset - (int64_t)s))))
			return r;
		n++;
		if (e < end)
			break;  /* the item goes on past the block */
	}
	return n;
}

static int check_extra(const struct kvc_vllm_extra *x)
{
	size_t i;

	if (!x)
		return 0;
	if ((x->lora_name && !x->lora_path) || (x->nmm && !x->mm) || x->nmm > INT_MAX ||
	    (x->nprompt_embeds && !x->prompt_embeds))
		return -EINVAL;
	for (i = 0; i < x->nmm; i++)
		if (!x->mm[i].identifier || x->mm[i].offset > INT64_MAX ||
		    x->mm[i].length > INT64_MAX - x->mm[i].offset)
			return -EINVAL;
	return 0;
}

/* h = sha256_cbor((parent, tuple(tokens), extra_keys)) for the block of
 * tokens [start, start + n) of the request x describes; bi: its block index
 * (its prompt-embeds digest). Returns 0, -EINVAL or -ENOMEM. */
static int block_tagged(EVP_MD_CTX *md, const kvc_hash *parent, const uint32_t *tokens,
			size_t n, uint64_t start, size_t bi, const struct kvc_vllm_extra *x,
			kvc_hash *out)
{
	static const struct kvc_vllm_extra none;
	const char *salt;
	int nmm, r;
	unsigned nextra;
	size_t i;

	if (!x)
		x = &none;
	salt = start == 0 && x->cache_salt && x->cache_salt[0] ? x->cache_salt : NULL;
	if (x->prompt_embeds && bi >= x->nprompt_embeds)
		return -EINVAL;
	if ((nmm = mm_keys(NULL, x, start, start + n)) < 0)
		return nmm;
	nextra = (x->lora_name != NULL) + (unsigned)nmm + (salt != NULL) +
		 (x->prompt_embeds != NULL);
	if ((r = digest_begin(md)) || (r = put_head(md, CBOR_ARRAY, 3)) ||
	    (r = put_str(md, CBOR_BYTES, parent->b, sizeof(parent->b))) ||
	    (r = put_head(md, CBOR_ARRAY, n)))
		return r;
	for (i = 0; i < n; i++)
		if ((r = put_head(md, CBOR_UINT, tokens[i])))
			return r;
	if (!nextra) {
		uint8_t null = CBOR_NULL;

		if ((r = put(md, &null, 1)))
			return r;
		return digest_end(md, out);
	}
	if ((r = put_head(md, CBOR_ARRAY, nextra)))
		return r;
	if (x->lora_name && ((r = put_head(md, CBOR_ARRAY, 3)) || (r = put_text(md, "lora")) ||
			     (r = put_text(md, x->lora_name)) || (r = put_text(md, x->lora_path))))
		return r;
	if ((r = mm_keys(md, x, start, start + n)) < 0)
		return r;
	if (salt && ((r = put_head(md, CBOR_ARRAY, 2)) || (r = put_text(md, "cache_salt")) ||
		     (r = put_text(md, salt))))
		return r;
	if (x->prompt_embeds &&
	    ((r = put_head(md, CBOR_ARRAY, 2)) || (r = put_text(md, "prompt_embeds")) ||
	     (r = put_str(md, CBOR_BYTES, x->prompt_embeds[bi].b, sizeof(x->prompt_embeds[bi].b)))))
		return r;
	return digest_end(md, out);
}

KVC_PUBLIC int kvc_hash_vllm_block_extra(const kvc_hash *parent, const uint32_t *tokens,
					 size_t ntokens, size_t start,
					 const struct kvc_vllm_extra *extra, kvc_hash *out)
{
	EVP_MD_CTX *md;
	int r;

	if (!parent || !out || (!tokens && ntokens) || check_extra(extra) < 0)
		return -EINVAL;
	if (extra && extra->prompt_embeds && (!ntokens || start % ntokens))
		return -EINVAL;
	if (!(md = EVP_MD_CTX_new()))
		return -ENOMEM;
	r = block_tagged(md, parent, tokens, ntokens, start, ntokens ? start / ntokens : 0, extra,
			 out);
	EVP_MD_CTX_free(md);
	return r;
}

/* One block of a chain: block i of block_tokens tokens under parent. */
typedef int (*chain_block_fn)(EVP_MD_CTX *md, const kvc_hash *parent, const uint32_t *tokens,
			      uint32_t block_tokens, size_t i, const void *keys, kvc_hash *out);

static int one_tagged(EVP_MD_CTX *md, const kvc_hash *parent, const uint32_t *tokens,
		      uint32_t block_tokens, size_t i, const void *keys, kvc_hash *out)
{
	return block_tagged(md, parent, tokens, block_tokens, (uint64_t)i * block_tokens, i, keys,
			    out);
}

static int one_legacy(EVP_MD_CTX *md, const kvc_hash *parent, const uint32_t *tokens,
		      uint32_t block_tokens, size_t i, const void *keys, kvc_hash *out)
{
	return block(md, parent, tokens, block_tokens, keys, i == 0, out);
}

/* The full blocks of tokens as a chain from the seed's NONE_HASH, one()
 * hashing each: at most max into out. Returns how many, or -errno. */
static int chain(const char *pythonhashseed, const uint32_t *tokens, size_t ntokens,
		 uint32_t block_tokens, kvc_hash *out, size_t max, chain_block_fn one,
		 const void *keys)
{
	EVP_MD_CTX *md;
	kvc_hash parent, cur;
	size_t n, i;
	int r = 0;

	if (block_tokens == 0 || (!tokens && ntokens) || (!out && max))
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
		r = one(md, &parent, tokens + i * block_tokens, block_tokens, i, keys, &cur);
		if (r < 0)
			break;
		out[i] = cur;
		parent = cur;
	}
	EVP_MD_CTX_free(md);
	return r < 0 ? r : (int)n;
}

KVC_PUBLIC int kvc_hash_vllm_chain_extra(const char *pythonhashseed, const uint32_t *tokens,
					 size_t ntokens, uint32_t block_tokens,
					 const struct kvc_vllm_extra *extra, kvc_hash *out,
					 size_t max)
{
	if (check_extra(extra) < 0)
		return -EINVAL;
	return chain(pythonhashseed, tokens, ntokens, block_tokens, out, max, one_tagged, extra);
}

/* ---- common ---- */

KVC_PUBLIC int kvc_hash_vllm_seed(const char *pythonhashseed, kvc_hash *out)
{
	EVP_MD_CTX *md;
	int r;

	if (!out)
		return -EINVAL;
	if (!pythonhashseed)
		pythonhashseed = KVC_VLLM_DEFAULT_SEED;
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
	return chain(pythonhashseed, tokens, ntokens, block_tokens, out, max, one_legacy, keys);
}
