/* kvt_worker: a worker process for the script tests (drain, reload,
 * socket activation), driven one line at a time on stdin:
 *
 *   kvt_worker SOCKET [NAMESPACE]     connects; prints "ready SESSION" or "err ..."
 *
 *   pool NAME BYTES   registers a pool         -> "ok ID"
 *   alloc N           allocates N blocks       -> "ok N"
 *   seal              seals what it holds      -> "ok N"
 *   release           releases all it holds    -> "ok N"
 *   ping              asks for the stats       -> "ok"
 *
 * For the KV-event tests (test_events.py), pool block_tokens 16:
 *   mpool NAME BYTES MODEL  registers a pool naming its model -> "ok ID"
 *   chain SEED N      allocates N blocks, seals them as one chain of hashes
 *                     derived from SEED with token ids, releases them -> "ok N"
 *   lchain SEED N     chain, sealed with kvc_seal_events(): LoRA "lora-SEED", id
 *                     SEED + 1; block i has the first i % 4 of the extra keys
 *                     text "tSEED-i", 32 bytes of i, mm ("img<i>", -1000 i - 7)
 *                     (N <= 64) -> "ok N"
 *   lookup SEED N     looks the chain up (promotes what the tiers hold) and
 *                     releases what it found -> "ok K" (the prefix found)
 *   badtokens         seals one block with 15 token ids -> the error
 *   tpool NAME BYTES MODEL T  mpool with T tokens a block (issue 36: Seals at
 *                     the frame limit)                       -> "ok ID"
 *   tchain SEED N     chain of N blocks of tpool's T token ids each, every id
 *                     2**28 or more (5 bytes in a frame and in msgpack) -> "ok N"
 *   echain SEED       one block sealed with one extra key: an empty digest
 *                     (the NULL data protobuf-c gives it)   -> "ok 1"
 *   quit              exits 0
 *
 * A failed call answers "err CODE MESSAGE" (CODE: kvc error number, e.g.
 * -1012 for KVC_ESHUTDOWN) and the worker carries on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvc_internal.h"

#define MAX_HELD 4096

static kvc_block held[MAX_HELD];
static size_t nheld;
static int pool = -1;
static unsigned tpool_tokens;

#define TOKENS 16

/* Hash i of chain seed: 32 bytes from splitmix64. */
static void chain_hash(unsigned long long seed, size_t i, kvc_hash *h)
{
	uint64_t x = seed * 0x9e3779b97f4a7c15ull + i;
	size_t k;

	for (k = 0; k < 4; k++) {
		uint64_t z = (x += 0x9e3779b97f4a7c15ull);

		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
		z ^= z >> 31;
		memcpy(h->b + 8 * k, &z, 8);
	}
}

static void answer(kvc_conn *c, int r, long n)
{
	if (r < 0)
		printf("err %d %s\n", r, *kvc_last_error(c) ? kvc_last_error(c) : kvc_strerror(r));
	else
		printf("ok %ld\n", n);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	struct kvc_options o = { .ns = argc > 2 ? argv[2] : NULL, .client_name = "kvt_worker" };
	char line[256], name[64], model[128];
	unsigned long long seed;
	kvc_conn *c = NULL;
	unsigned long long bytes;
	unsigned n;
	int r;

	if (argc < 2) {
		fputs("usage: kvt_worker SOCKET [NAMESPACE]\n", stderr);
		return 2;
	}
	r = kvc_connect(argv[1], &o, &c);
	if (r < 0) {
		printf("err %d connect: %s\n", r, kvc_strerror(r));
		return 1;
	}
	printf("ready %llu\n", (unsigned long long)kvc_conn_hello(c)->session_id);
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin)) {
		if (sscanf(line, "pool %63s %llu", name, &bytes) == 2) {
			struct kvc_pool_desc d = { .name = name, .block_bytes = bytes,
						   .block_tokens = 16, .dtype = "fp16" };

			r = kvc_register_pool(c, &d);
			if (r >= 0)
				pool = r;
			answer(c, r, r);
		} else if (sscanf(line, "alloc %u", &n) == 1) {
			if (n > MAX_HELD - nheld)
				n = (unsigned)(MAX_HELD - nheld);
			r = kvc_alloc(c, pool, n, held + nheld);
			if (r > 0)
				nheld += (size_t)r;
			answer(c, r, r);
		} else if (!strncmp(line, "seal", 4)) {
			kvc_hash h[MAX_HELD];
			size_t i;

			for (i = 0; i < nheld; i++) {
				memset(&h[i], 0, sizeof(h[i]));
				snprintf((char *)h[i].b, sizeof(h[i].b), "kvt-%d-%zu", (int)getpid(), i);
			}
			r = nheld ? kvc_seal(c, pool, held, h, nheld, held) : 0;
			answer(c, r, r);
		} else if (!strncmp(line, "release", 7)) {
			r = nheld ? kvc_release(c, held, nheld) : 0;
			answer(c, r, r < 0 ? 0 : (long)nheld);
			if (r >= 0)
				nheld = 0;
		} else if (!strncmp(line, "ping", 4)) {
			Kvcached__Request rq = KVCACHED__REQUEST__INIT;
			Kvcached__Stats st = KVCACHED__STATS__INIT;
			Kvcached__Response *rs = NULL;

			rq.op_case = KVCACHED__REQUEST__OP_STATS;
			rq.stats = &st;
			r = kvc_call(c, &rq, &rs);
			if (rs)
				kvcached__response__free_unpacked(rs, NULL);
			answer(c, r, 0);
		} else if (sscanf(line, "mpool %63s %llu %127s", name, &bytes, model) == 3) {
			struct kvc_pool_desc d = { .name = name, .block_bytes = bytes,
						   .block_tokens = TOKENS, .dtype = "fp16" };

			r = kvc_register_pool_model(c, &d, model);
			if (r >= 0)
				pool = r;
			answer(c, r, r);
		} else if (sscanf(line, "tpool %63s %llu %127s %u", name, &bytes, model, &n) == 4) {
			struct kvc_pool_desc d = { .name = name, .block_bytes = bytes,
						   .block_tokens = n, .dtype = "fp16" };

			r = kvc_register_pool_model(c, &d, model);
			if (r >= 0) {
				pool = r;
				tpool_tokens = n;
			}
			answer(c, r, r);
		} else if (sscanf(line, "tchain %llu %u", &seed, &n) == 2 && n > 0 && n <= 256 &&
			   tpool_tokens) {
			size_t nt = (size_t)n * tpool_tokens, i;
			uint32_t *tok = malloc(nt * sizeof(*tok));
			kvc_hash h[256];
			kvc_block b[256];

			for (i = 0; tok && i < nt; i++)
				tok[i] = (uint32_t)(0x10000000u + seed * 7919u + i);
			for (i = 0; i < n; i++)
				chain_hash(seed, i, &h[i]);
			r = tok ? kvc_alloc(c, pool, n, b) : -1;
			if (r >= 0)
				r = kvc_seal_tokens(c, pool, b, h, n, NULL, tok, nt, b);
			if (r >= 0)
				r = kvc_release(c, b, n) < 0 ? -1 : (int)n;
			free(tok);
			answer(c, r, r);
		} else if (sscanf(line, "echain %llu", &seed) == 1) {
			static uint32_t tok[TOKENS], nkeys[1] = { 1 };
			static const struct kvc_event_key key = { KVC_EVENT_KEY_BYTES, NULL, 0, 0 };
			struct kvc_seal_info info = { .token_ids = tok, .ntokens = TOKENS,
						      .nkeys = nkeys, .keys = &key };
			kvc_hash h;
			kvc_block b;

			chain_hash(seed, 0, &h);
			r = kvc_alloc(c, pool, 1, &b);
			if (r >= 0)
				r = kvc_seal_events(c, pool, &b, &h, 1, &info, &b);
			if (r >= 0)
				r = kvc_release(c, &b, 1) < 0 ? -1 : 1;
			answer(c, r, r);
		} else if (sscanf(line, "chain %llu %u", &seed, &n) == 2 && n > 0 && n <= 256) {
			static kvc_hash h[256];
			static uint32_t tok[256 * TOKENS];
			kvc_block b[256];
			size_t i;

			for (i = 0; i < n; i++) {
				chain_hash(seed, i, &h[i]);
				for (size_t k = 0; k < TOKENS; k++)
					tok[i * TOKENS + k] = (uint32_t)(seed * 1000 + i * TOKENS + k);
			}
			r = kvc_alloc(c, pool, n, b);
			if (r >= 0)
				r = kvc_seal_tokens(c, pool, b, h, n, NULL, tok, (size_t)n * TOKENS, b);
			if (r >= 0)
				r = kvc_release(c, b, n) < 0 ? -1 : (int)n;
			answer(c, r, r);
		} else if (sscanf(line, "lchain %llu %u", &seed, &n) == 2 && n > 0 && n <= 64) {
			static kvc_hash h[64];
			static uint32_t tok[64 * TOKENS], nkeys[64];
			static struct kvc_event_key keys[64 * 3];
			static char text[64][32], mm[64][16];
			static uint8_t dig[64][32];
			char lora[32];
			struct kvc_seal_info info = { .token_ids = tok, .ntokens = (size_t)n * TOKENS,
						      .lora_name = lora, .lora_id = seed + 1,
						      .nkeys = nkeys, .keys = keys };
			kvc_block b[64];
			size_t i, k = 0;

			snprintf(lora, sizeof(lora), "lora-%llu", seed);
			for (i = 0; i < n; i++) {
				chain_hash(seed, i, &h[i]);
				for (size_t t = 0; t < TOKENS; t++)
					tok[i * TOKENS + t] = (uint32_t)(seed * 1000 + i * TOKENS + t);
				snprintf(text[i], sizeof(text[i]), "t%llu-%zu", seed, i);
				snprintf(mm[i], sizeof(mm[i]), "img%zu", i);
				memset(dig[i], (int)i, sizeof(dig[i]));
				nkeys[i] = (uint32_t)(i % 4);
				if (nkeys[i] > 0)
					keys[k++] = (struct kvc_event_key){ KVC_EVENT_KEY_TEXT, text[i],
									    strlen(text[i]), 0 };
				if (nkeys[i] > 1)
					keys[k++] = (struct kvc_event_key){ KVC_EVENT_KEY_BYTES, dig[i],
									    32, 0 };
				if (nkeys[i] > 2)
					keys[k++] = (struct kvc_event_key){
						KVC_EVENT_KEY_MM, mm[i], strlen(mm[i]),
						-1000 * (int64_t)i - 7 };
			}
			r = kvc_alloc(c, pool, n, b);
			if (r >= 0)
				r = kvc_seal_events(c, pool, b, h, n, &info, b);
			if (r >= 0)
				r = kvc_release(c, b, n) < 0 ? -1 : (int)n;
			answer(c, r, r);
		} else if (sscanf(line, "lookup %llu %u", &seed, &n) == 2 && n > 0 && n <= 256) {
			kvc_hash h[256];
			kvc_block b[256];
			size_t i;

			for (i = 0; i < n; i++)
				chain_hash(seed, i, &h[i]);
			r = kvc_lookup(c, pool, h, n, b);
			if (r > 0 && kvc_release(c, b, (size_t)r) < 0)
				r = -1;
			answer(c, r, r);
		} else if (!strncmp(line, "badtokens", 9)) {
			uint32_t tok[TOKENS - 1] = { 0 };
			kvc_block b;
			kvc_hash h;

			chain_hash(~0ull, 0, &h);
			r = kvc_alloc(c, pool, 1, &b);
			if (r >= 0) {
				int s2 = kvc_seal_tokens(c, pool, &b, &h, 1, NULL, tok, TOKENS - 1, &b);

				/* Keep the error; give the block back either way. */
				answer(c, s2, s2);
				kvc_release(c, &b, 1);
				continue;
			}
			answer(c, r, r);
		} else if (!strncmp(line, "quit", 4)) {
			break;
		} else {
			printf("err 0 unknown command\n");
			fflush(stdout);
		}
	}
	kvc_close(c);
	return 0;
}
