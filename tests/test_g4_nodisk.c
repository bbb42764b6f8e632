/* G4 without G3, and G4 written at demotion (issue 28 item 4): a real Redis
 * Cluster (3 masters) on loopback and kvcached daemons standing for nodes.
 *
 *   writeback: node A has no disk tier; namespace "wb" (remote = yes, the
 *              daemon's remote_write = writeback) seals a chain, evicts G1
 *              (into G2: nothing written yet) and G2 (each block goes to G4
 *              as G2 drops it); node B, no disk either, reads every byte;
 *   demote:    namespace "dm" (remote_write = demote) seals a chain and
 *              evicts G1 only: every block is written as it lands in G2,
 *              A still holds it there, B reads it from G4;
 *   off:       namespace "ro" (remote_write = off) writes nothing, whatever
 *              G2 drops; B finds none of it;
 *   flush:     namespace "wb" again: kvctl flush on a node without disk
 *              writes what G2 holds and G4 lacks;
 *   with G3:   node C has a disk tier; "dm" writes at demotion there too,
 *              before any write-back (no flush, no G2 pressure);
 *   compress:  namespace "cz" (remote_write = demote, compress = fp8_e4m3)
 *              writes values of half the bytes; B reads them back as the
 *              quantizer's round trip leaves the blocks;
 *   no buffer: node D cannot have 3 of its G4 value buffers (fault point
 *              g4_buf): writes at demotion take none (issue 38: sent from
 *              their G2 slots), so dm's chain goes out whole; wb's, written
 *              as G2 drops it, has those 3 dropped and counted, the others
 *              go out; a second chain goes out whole in buffers of the
 *              write pool; then values of two more lengths (wz's, cz's
 *              twin written back, and 128 KiB blocks) on D's
 *              remote_max_inflight of 1 MiB: the third length finds the
 *              idle buffers of the others past the bound, and the ones used
 *              longest ago go (the daemon asserts the bound each time a
 *              buffer comes back); B reads every chain written whole. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "kvconfig.h"
#include "quant.h"

#if !KV_HAVE_HIREDIS
int main(void)
{
	SKIP("built without hiredis: no G4");
}
#else
#include "rcluster_harness.h"

#define BB 65536u
#define N 8

static struct kvt_rc rc;
static char tmp[64], conf_arg[200];

static void node_start(struct kvt_daemon *d, int disk)
{
	char path[160];

	snprintf(path, sizeof(path), "%s/g3", tmp);
	if (disk < 0)   /* node D: G4's write buffers bounded at 1 MiB */
		kvt_start(d, conf_arg, "--pool-size", "4MiB", "--segment-size", "1MiB",
			  "--page-size", "64KiB", "--host-tier-size", "2MiB",
			  "--remote-max-inflight", "1MiB", NULL);
	else if (disk)
		kvt_start(d, conf_arg, "--pool-size", "4MiB", "--segment-size", "1MiB",
			  "--page-size", "64KiB", "--host-tier-size", "2MiB", "--disk-path", path,
			  "--disk-size", "8MiB", NULL);
	else
		kvt_start(d, conf_arg, "--pool-size", "4MiB", "--segment-size", "1MiB",
			  "--page-size", "64KiB", "--host-tier-size", "2MiB", NULL);
	setenv("KVCACHED_SOCKET", d->sock, 1);
}

/* G4 writes done and dropped by the node once nothing is in flight. */
static void counts_settled(const char *ns, uint64_t *writes, uint64_t *dropped)
{
	for (int tries = 0;; tries++) {
		Kvcached__Response *rs = kvt_g4_stats(ns);
		uint64_t in = rs->stats->remote->inflight_bytes;

		CHECK_EQ(rs->stats->remote->write_errors, 0);
		*writes = rs->stats->remote->writes;
		*dropped = rs->stats->remote->dropped;
		kvcached__response__free_unpacked(rs, NULL);
		if (!in)
			return;
		CHECK(tries < 60000);
		usleep(1000);
	}
}

/* Seals ns's chain of n blocks of bb bytes in pool name (block i: seed
 * base + i) and releases it: cached in G1. */
static kvc_conn *seal_chain_of(const char *ns, const char *name, uint32_t bb, uint32_t n,
			       uint64_t base)
{
	kvc_conn *c = kvt_connect(ns);
	kvt_seal_chain(c, kvt_pool(c, name, bb), bb, (int)n, base);
	return c;
}

static kvc_conn *seal_chain(const char *ns, uint64_t base)
{
	return seal_chain_of(ns, "p", BB, N, base);
}

/* Namespace cz's chain base as node B finds it: every block as the FP8
 * round trip of its FP16 values leaves it. Returns how many hit. */
static int lookup_compressed_in(const char *ns, uint64_t base)
{
	kvc_conn *c = kvt_connect(ns);
	int pool = kvt_pool(c, "p", BB), k;
	size_t qn = kv_quant_bytes(BB / 2, KV_QUANT_GROUP);
	uint8_t *v = malloc(BB), *q = malloc(qn), *want = malloc(BB), *got = malloc(BB);
	kvc_block b[N];
	kvc_hash h[N];

	CHECK(v && q && want && got);
	for (int i = 0; i < N; i++)
		h[i] = kvt_hash(base + (uint64_t)i);
	k = kvc_lookup(c, pool, h, N, b);
	CHECK(k >= 0);
	for (int i = 0; i < k; i++) {
		kvt_fill(v, BB, base + (uint64_t)i);
		CHECK_EQ(kv_qfmt_quant_ref(KV_QFMT_E4M3, KV_DTYPE_F16, v, BB / 2, KV_QUANT_GROUP, q,
					   qn), 0);
		CHECK_EQ(kv_qfmt_dequant_ref(KV_QFMT_E4M3, KV_DTYPE_F16, q, qn, BB / 2,
					     KV_QUANT_GROUP, want), 0);
		kvt_mem_read(c, got, kvc_block_ptr(c, b[i]), BB);
		CHECK(memcmp(got, want, BB) == 0);
	}
	if (k)
		CHECK_EQ(kvc_release(c, b, (size_t)k), 0);
	kvc_close(c);
	free(v);
	free(q);
	free(want);
	free(got);
	return k;
}

static int lookup_compressed(uint64_t base)
{
	return lookup_compressed_in("cz", base);
}

static void write_conf(void)
{
	char path[160];
	FILE *f;
	unsigned uid = (unsigned)getuid();

	snprintf(path, sizeof(path), "%s/kvcached.conf", tmp);
	CHECK((f = fopen(path, "w")) != NULL);
	fprintf(f, "remote_seeds = %s\nremote_timeout = 2s\nremote_auth = off\n"
		"remote_fetch_timeout = 30s\n\n", kvt_rc_seeds(&rc));
	fprintf(f, "[namespace wb]\nusers = %u\nremote = yes\n\n", uid);
	fprintf(f, "[namespace dm]\nusers = %u\nremote = yes\nremote_write = demote\n\n", uid);
	fprintf(f, "[namespace ro]\nusers = %u\nremote = yes\nremote_write = off\n\n", uid);
	fprintf(f, "[namespace cz]\nusers = %u\nremote = yes\nremote_write = demote\n"
		"compress = fp8_e4m3\n\n", uid);
	fprintf(f, "[namespace wz]\nusers = %u\nremote = yes\ncompress = fp8_e4m3\n", uid);
	fclose(f);
	snprintf(conf_arg, sizeof(conf_arg), "--config=%s", path);
}

int main(void)
{
	struct kvt_daemon a, b, c3, d;
	uint64_t dr;
	kvc_conn *c;
	uint64_t w0, w1;
	int k;

	snprintf(tmp, sizeof(tmp), "/tmp/kvt-g4n.XXXXXX");
	CHECK(mkdtemp(tmp) != NULL);
	kvt_rc_start(&rc, 3, 0, NULL);
	write_conf();
	node_start(&a, 0);

	/* writeback, without G3: written when G2 drops the blocks */
	w0 = kvt_g4_settled("wb", 0);
	c = seal_chain("wb", 1000);
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	w1 = kvt_g4_settled("wb", 0);
	fprintf(stderr, "writeback: %llu writes after the demotion\n",
		(unsigned long long)(w1 - w0));
	CHECK_EQ(w1, w0);
	kvt_evict(c, KVCACHED__TIER__TIER_G2);
	w1 = kvt_g4_settled("wb", 0);
	fprintf(stderr, "writeback: %llu writes after G2 dropped the chain\n",
		(unsigned long long)(w1 - w0));
	CHECK_EQ(w1 - w0, N);
	kvc_close(c);

	/* demote: written as the blocks land in G2 */
	w0 = w1;
	c = seal_chain("dm", 2000);
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	w1 = kvt_g4_settled("dm", 0);
	fprintf(stderr, "demote: %llu writes after the demotion\n", (unsigned long long)(w1 - w0));
	CHECK_EQ(w1 - w0, N);
	kvc_close(c);

	/* compress: values of the compressed size, written at demotion */
	{
		Kvcached__Response *rs = kvt_g4_stats("cz");
		uint64_t out0 = rs->stats->remote->bytes_out, out1, wz0, wz1;

		kvcached__response__free_unpacked(rs, NULL);
		wz0 = kvt_g4_settled("cz", 0);
		c = seal_chain("cz", 6000);
		kvt_evict(c, KVCACHED__TIER__TIER_G1);
		wz1 = kvt_g4_settled("cz", 0);
		CHECK_EQ(wz1 - wz0, N);
		rs = kvt_g4_stats("cz");
		out1 = rs->stats->remote->bytes_out;
		kvcached__response__free_unpacked(rs, NULL);
		fprintf(stderr, "compress: %llu bytes out for %d blocks of %u bytes\n",
			(unsigned long long)(out1 - out0), N, BB);
		/* A value: the slot header (80 bytes) and the quantized block. */
		CHECK_EQ(out1 - out0, N * (80 + kv_quant_bytes(BB / 2, KV_QUANT_GROUP)));
		kvc_close(c);
		w1 = kvt_g4_settled("wb", 0);
	}

	/* off: nothing written, whatever G2 drops */
	w0 = w1;
	c = seal_chain("ro", 3000);
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	kvt_evict(c, KVCACHED__TIER__TIER_G2);
	kvc_close(c);
	w1 = kvt_g4_settled("ro", 0);
	CHECK_EQ(w1, w0);

	/* flush without G3: what G2 holds and G4 lacks */
	c = seal_chain("wb", 4000);
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	CHECK_EQ(kvt_g4_settled("wb", 0), w1);
	kvt_flush(c);
	w1 = kvt_g4_settled("wb", 0);
	fprintf(stderr, "flush: %llu writes\n", (unsigned long long)(w1 - w0));
	CHECK_EQ(w1 - w0, N);
	kvc_close(c);
	/* A's own G2 still holds the chain written at demotion (promoted
	 * here: demoted again later, it would be written again). */
	CHECK_EQ(kvt_lookup_chain("dm", "p", BB, N, 2000), N);
	CHECK_EQ(kvt_check(), 0);

	/* Node B, no disk: reads A's chains from G4. */
	node_start(&b, 0);
	k = kvt_lookup_chain("wb", "p", BB, N, 1000);
	fprintf(stderr, "node B found %d of wb's first chain\n", k);
	CHECK_EQ(k, N);
	CHECK_EQ(kvt_lookup_chain("dm", "p", BB, N, 2000), N);
	CHECK_EQ(kvt_lookup_chain("wb", "p", BB, N, 4000), N);
	CHECK_EQ(kvt_lookup_chain("ro", "p", BB, N, 3000), 0);
	CHECK_EQ(lookup_compressed(6000), N);
	{
		Kvcached__Response *rs = kvt_g4_stats("wb");

		CHECK(rs->stats->remote->hits >= 3 * N);
		CHECK_EQ(rs->stats->remote->checksum_failures, 0);
		kvcached__response__free_unpacked(rs, NULL);
	}
	CHECK_EQ(kvt_check(), 0);
	kvt_stop(&b);

	/* With G3: demote writes at demotion, before any write-back. */
	node_start(&c3, 1);
	w0 = kvt_g4_settled("dm", 0);
	c = seal_chain("dm", 5000);
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	w1 = kvt_g4_settled("dm", 0);
	fprintf(stderr, "with G3: %llu writes after the demotion\n", (unsigned long long)(w1 - w0));
	CHECK_EQ(w1 - w0, N);
	/* ... and not again at write-back. */
	kvt_flush(c);
	CHECK_EQ(kvt_g4_settled("dm", 0), w1);
	kvc_close(c);
	CHECK_EQ(kvt_check(), 0);
	kvt_stop(&c3);
	kvt_stop(&a);
	node_start(&b, 0);
	CHECK_EQ(kvt_lookup_chain("dm", "p", BB, N, 5000), N);
	kvt_stop(&b);

	/* No buffer: the 3rd to 5th value buffers node D takes fail. */
	setenv("KVCACHED_FAULTS", "g4_buf=ENOMEM:skip=2:count=3", 1);
	node_start(&d, -1);
	unsetenv("KVCACHED_FAULTS");
	c = seal_chain("dm", 7000);
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	counts_settled("dm", &w1, &dr);
	fprintf(stderr, "no buffer: %llu written at demotion, %llu dropped\n",
		(unsigned long long)w1, (unsigned long long)dr);
	CHECK_EQ(w1, N);
	CHECK_EQ(dr, 0);
	kvc_close(c);
	c = seal_chain("wb", 7100);
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	kvt_evict(c, KVCACHED__TIER__TIER_G2);
	counts_settled("dm", &w1, &dr);
	fprintf(stderr, "no buffer: %llu written after G2 dropped wb's chain, %llu dropped\n",
		(unsigned long long)(w1 - N), (unsigned long long)dr);
	CHECK_EQ(w1, 2 * N - 3);
	CHECK_EQ(dr, 3);
	kvc_close(c);
	c = seal_chain("wb", 8000);
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	kvt_evict(c, KVCACHED__TIER__TIER_G2);
	counts_settled("dm", &w1, &dr);
	CHECK_EQ(w1, 3 * N - 3);
	CHECK_EQ(dr, 3);
	kvc_close(c);
	/* Idle now: 8 values of 64 KiB blocks (0.5 MiB); then 8 of wz's
	 * (about 0.26 MiB), kept too; then 4 of 128 KiB blocks (0.5 MiB):
	 * past 1 MiB with the idle ones, which go, the 64 KiB ones first. */
	c = seal_chain("wz", 6100);
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	kvt_evict(c, KVCACHED__TIER__TIER_G2);
	counts_settled("wz", &w1, &dr);
	CHECK_EQ(w1, 4 * N - 3);
	kvc_close(c);
	c = seal_chain_of("wb", "q", 2 * BB, 4, 9000);
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	kvt_evict(c, KVCACHED__TIER__TIER_G2);
	counts_settled("dm", &w1, &dr);
	fprintf(stderr, "no buffer: %llu written in all, %llu dropped\n", (unsigned long long)w1,
		(unsigned long long)dr);
	CHECK_EQ(w1, 4 * N - 3 + 4);
	CHECK_EQ(dr, 3);
	kvc_close(c);
	CHECK_EQ(kvt_check(), 0);
	kvt_stop(&d);
	node_start(&b, 0);
	CHECK_EQ(kvt_lookup_chain("dm", "p", BB, N, 7000), N);
	CHECK_EQ(kvt_lookup_chain("wb", "p", BB, N, 8000), N);
	CHECK_EQ(lookup_compressed_in("wz", 6100), N);
	CHECK_EQ(kvt_lookup_chain("wb", "q", 2 * BB, 4, 9000), 4);
	kvt_stop(&b);
	kvt_rc_stop(&rc);
	fprintf(stderr, "ok\n");
	return 0;
}
#endif
