/* vllm_hash: prints the vLLM-compatible hashes (kvc_hash_vllm_*) of a token
 * sequence, for tests/test_vllm_hash.py to compare with its own reference.
 *
 *   vllm_hash SEED BLOCK_TOKENS LORA|- SALT|- TOKENS
 *
 * TOKENS: comma-separated (may be empty: ""). Prints "seed HEX", then one
 * "chain HEX" per full block from kvc_hash_vllm_chain(), then one "block HEX"
 * per full block from kvc_hash_vllm_block() called block by block; exits 0,
 * or 1 on an error. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvcache.h"

static void print(const char *what, const kvc_hash *h)
{
	printf("%s ", what);
	for (size_t i = 0; i < sizeof(h->b); i++)
		printf("%02x", h->b[i]);
	printf("\n");
}

int main(int argc, char **argv)
{
	struct kvc_vllm_keys k = { 0 };
	uint32_t *tok = NULL, bt;
	size_t n = 0, cap = 0, nb, i;
	kvc_hash seed, *out, parent;
	char *s, *end;
	int r;

	if (argc != 6) {
		fprintf(stderr, "usage: vllm_hash SEED BLOCK_TOKENS LORA|- SALT|- TOKENS\n");
		return 1;
	}
	bt = (uint32_t)strtoul(argv[2], NULL, 10);
	k.lora_name = strcmp(argv[3], "-") ? argv[3] : NULL;
	k.cache_salt = strcmp(argv[4], "-") ? argv[4] : NULL;
	for (s = argv[5]; *s; s = *end ? end + 1 : end) {
		if (n == cap) {
			cap = cap ? 2 * cap : 64;
			if (!(tok = realloc(tok, cap * sizeof(*tok))))
				return 1;
		}
		errno = 0;
		tok[n++] = (uint32_t)strtoul(s, &end, 10);
		if (errno || end == s)
			return 1;
	}
	if (kvc_hash_vllm_seed(argv[1], &seed) < 0)
		return 1;
	print("seed", &seed);
	nb = bt ? n / bt : 0;
	if (!(out = calloc(nb + 1, sizeof(*out))))
		return 1;
	r = kvc_hash_vllm_chain(argv[1], tok, n, bt, &k, out, nb + 1);
	if (r != (int)nb) {
		fprintf(stderr, "kvc_hash_vllm_chain: %d, expected %zu\n", r, nb);
		return 1;
	}
	for (i = 0; i < nb; i++)
		print("chain", &out[i]);
	parent = seed;
	for (i = 0; i < nb; i++) {
		kvc_hash h;

		if (kvc_hash_vllm_block(&parent, tok + i * bt, bt, &k, i == 0, &h) < 0)
			return 1;
		print("block", &h);
		parent = h;
	}
	free(out);
	free(tok);
	return 0;
}
