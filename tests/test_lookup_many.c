/* kvc_lookup_many() (issue 34: the vLLM connector's scheduler looks a
 * step's requests up in one call): several lookups pipelined on one
 * connection.
 *
 * - Answers: chains that hit whole, in part, not at all, and empty ones,
 *   in one batch, give what kvc_lookup_tiers() of each gives (blocks,
 *   tiers, references: every block released once per hit, then the
 *   daemon's invariant check passes).
 * - A batch far bigger than the sockets' buffers: 3000 lookups (about
 *   12 MiB of requests, 2.5 MiB of replies) against a daemon that stops
 *   reading a connection once 64 KiB of its replies are unread
 *   (max_output_per_connection): a client that wrote everything before
 *   reading would wait on a full socket while the daemon waits for it to
 *   read; the call's deadline (20 s) would end it with -ETIMEDOUT.
 * - A lookup the daemon refuses (max_block_refs: the third reference on a
 *   block is refused) fails alone: found[i] is its error, the others
 *   stand, and the connection works on.
 * - The daemon stopped (SIGSTOP): the batch returns -ETIMEDOUT within its
 *   deadline; after SIGCONT the next batch reconnects and works.
 * - The daemon killed and restarted: the next batch reconnects (the pool
 *   registered again) and finds nothing. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define BB 4096
#define NB 64              /* blocks of the sealed chain */
#define BIG 3000           /* lookups in the big batch */
#define BIG_LEN 127        /* hashes in each (NB of them cached) */

static kvc_hash chain[BIG_LEN];

static void seal_chain(kvc_conn *c, int pool)
{
	kvc_block b[NB];

	CHECK_EQ(kvc_alloc(c, pool, NB, b), NB);
	for (int i = 0; i < NB; i++)
		kvt_mem_fill(c, kvc_block_ptr(c, b[i]), BB, 77 + (uint64_t)i);
	CHECK_EQ(kvc_seal(c, pool, b, chain, NB, b), NB);
	CHECK_EQ(kvc_release(c, b, NB), 0);
}

static void release_all(kvc_conn *c, const kvc_block *b, size_t n)
{
	while (n) {
		size_t k = n > 50000 ? 50000 : n;

		CHECK_EQ(kvc_release(c, b, k), 0);
		b += k;
		n -= k;
	}
}

/* Mixed chains in one batch against one kvc_lookup_tiers() each. */
static void answers(kvc_conn *c, int pool)
{
	enum { NC = 6 };
	kvc_hash miss[8], *h;
	size_t n[NC] = { NB, 0, 10, 8, BIG_LEN, 1 }, total = 0, off = 0;
	int found[NC];
	kvc_block *out, one[BIG_LEN];
	uint8_t *tiers, t1[BIG_LEN];

	for (int i = 0; i < 8; i++)
		miss[i] = kvt_hash(5000 + (uint64_t)i);
	for (int i = 0; i < NC; i++)
		total += n[i];
	h = calloc(total, sizeof(*h));
	out = calloc(total, sizeof(*out));
	tiers = calloc(total, 1);
	CHECK(h && out && tiers);
	/* The whole chain, nothing, its head, a miss, the chain and more, a
	 * head of one. */
	memcpy(h, chain, NB * sizeof(*h));
	memcpy(h + NB, chain, 10 * sizeof(*h));
	memcpy(h + NB + 10, miss, 8 * sizeof(*h));
	memcpy(h + NB + 18, chain, BIG_LEN * sizeof(*h));
	memcpy(h + NB + 18 + BIG_LEN, chain, sizeof(*h));
	memset(found, 0x55, sizeof(found));
	memset(tiers, 0xee, total);
	CHECK_EQ(kvc_lookup_many(c, pool, h, n, NC, out, tiers, found), NC);
	for (int i = 0; i < NC; off += n[i], i++) {
		int k = n[i] ? kvc_lookup_tiers(c, pool, h + off, n[i], one, t1) : 0;
		int want = i == 0 ? NB : i == 1 ? 0 : i == 2 ? 10 : i == 3 ? 0 : i == 4 ? NB : 1;

		CHECK_EQ(found[i], want);
		CHECK_EQ(k, want);
		for (int j = 0; j < k; j++) {
			CHECK_EQ(out[off + j], one[j]);
			CHECK_EQ(tiers[off + j], KVC_TIER_G1);
			CHECK_EQ(t1[j], KVC_TIER_G1);
			CHECK(kvt_mem_verify(c, kvc_block_ptr(c, out[off + j]), BB, 77 + (uint64_t)j));
		}
		/* Two references each: the batch's and the single lookup's. */
		release_all(c, out + off, (size_t)k);
		release_all(c, one, (size_t)k);
	}
	/* Tiers NULL, and a batch of empty chains only. */
	CHECK_EQ(kvc_lookup_many(c, pool, h, n, 1, out, NULL, found), 1);
	CHECK_EQ(found[0], NB);
	release_all(c, out, NB);
	CHECK_EQ(kvc_lookup_many(c, pool, NULL, n + 1, 1, NULL, NULL, found), 1);
	CHECK_EQ(found[0], 0);
	free(h);
	free(out);
	free(tiers);
}

/* BIG lookups of BIG_LEN hashes in one call. */
static void big(kvc_conn *c, int pool)
{
	kvc_hash *h = calloc((size_t)BIG * BIG_LEN, sizeof(*h));
	kvc_block *out = calloc((size_t)BIG * BIG_LEN, sizeof(*out)), *got;
	size_t *n = calloc(BIG, sizeof(*n));
	int *found = calloc(BIG, sizeof(*found));

	CHECK(h && out && n && found);
	for (int i = 0; i < BIG; i++) {
		memcpy(h + (size_t)i * BIG_LEN, chain, sizeof(chain));
		n[i] = BIG_LEN;
	}
	CHECK_EQ(kvc_set_timeout(c, 20000), 0);
	CHECK_EQ(kvc_lookup_many(c, pool, h, n, BIG, out, NULL, found), BIG);
	CHECK(got = calloc((size_t)BIG * NB, sizeof(*got)));
	for (int i = 0; i < BIG; i++) {
		CHECK_EQ(found[i], NB);
		CHECK(memcmp(out + (size_t)i * BIG_LEN, out, NB * sizeof(*out)) == 0);
		memcpy(got + (size_t)i * NB, out + (size_t)i * BIG_LEN, NB * sizeof(*out));
	}
	release_all(c, got, (size_t)BIG * NB);
	free(got);
	free(h);
	free(out);
	free(n);
	free(found);
}

/* With max_block_refs 2: the third lookup's references are refused. */
static void refused(kvc_conn *c, int pool)
{
	enum { NC = 4 };
	kvc_hash h[NC * NB];
	kvc_block out[NC * NB];
	size_t n[NC];
	int found[NC], ok = 0, bad = 0;
	kvc_block b[NB];

	for (int i = 0; i < NC; i++) {
		memcpy(h + i * NB, chain, NB * sizeof(*h));
		n[i] = NB;
	}
	CHECK_EQ(kvc_lookup_many(c, pool, h, n, NC, out, NULL, found), NC);
	for (int i = 0; i < NC; i++) {
		fprintf(stderr, "refused: chain %d: %d (%s)\n", i, found[i],
			found[i] < 0 ? kvc_strerror(found[i]) : "blocks");
		if (found[i] == NB)
			ok++;
		else
			CHECK(found[i] < 0 && ++bad);
	}
	CHECK_EQ(ok, 2);
	CHECK_EQ(bad, 2);
	for (int i = 0; i < NC; i++)
		if (found[i] == NB)
			release_all(c, out + i * NB, NB);
	/* The connection works on. */
	CHECK_EQ(kvc_lookup(c, pool, chain, NB, b), NB);
	release_all(c, b, NB);
}

int main(void)
{
	struct kvt_daemon d;
	kvc_conn *c;
	int pool, found[2];
	size_t n[2] = { NB, NB };
	kvc_hash h[2 * NB];
	kvc_block out[2 * NB];

	if (kvt_cuda())
		SKIP("host backend only (the pipelining does not depend on it)");
	for (int i = 0; i < BIG_LEN; i++)
		chain[i] = kvt_hash(100 + (uint64_t)i);
	memcpy(h, chain, NB * sizeof(*h));
	memcpy(h + NB, chain, NB * sizeof(*h));

	kvt_start(&d, "--pool-size", "4MiB", "--page-size", "64KiB",
		  "--max-output-per-connection", "64KiB", NULL);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "lm", BB);
	seal_chain(c, pool);
	answers(c, pool);
	big(c, pool);
	CHECK_EQ(kvt_check(), 0);

	/* Stopped: the batch ends at its deadline; SIGCONT: it works again. */
	CHECK_EQ(kvc_set_timeout(c, 300), 0);
	CHECK_EQ(kill(d.pid, SIGSTOP), 0);
	CHECK_EQ(kvc_lookup_many(c, pool, h, n, 2, out, NULL, found), -ETIMEDOUT);
	CHECK_EQ(kill(d.pid, SIGCONT), 0);
	CHECK_EQ(kvc_set_timeout(c, 20000), 0);
	/* The timed-out call dropped the connection (no failed reconnection,
	 * so no backoff): this one reconnects. */
	CHECK_EQ(kvc_lookup_many(c, pool, h, n, 2, out, NULL, found), 2);
	CHECK_EQ(kvc_restarts(c), 1);
	CHECK_EQ(found[0], NB);
	CHECK_EQ(found[1], NB);
	release_all(c, out, 2 * NB);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_stop(&d);

	/* Per-lookup refusals. */
	kvt_start(&d, "--pool-size", "4MiB", "--page-size", "64KiB", "--max-block-refs", "2",
		  NULL);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "lm", BB);
	seal_chain(c, pool);
	refused(c, pool);

	/* A daemon killed and restarted: reconnected, an empty cache. */
	kvt_restart(&d, "--pool-size", "4MiB", "--page-size", "64KiB", NULL);
	CHECK_EQ(kvc_lookup_many(c, pool, h, n, 2, out, NULL, found), 2);
	CHECK_EQ(found[0], 0);
	CHECK_EQ(found[1], 0);
	CHECK(kvc_restarts(c) >= 1);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_stop(&d);
	printf("lookup_many: ok\n");
	return 0;
}
