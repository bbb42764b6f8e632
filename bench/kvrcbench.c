/* kvrcbench: G4 fetch throughput, the Redis Cluster client (rcluster/rcluster.c)
 * beside redis-benchmark on the same cluster and the same value size (issue
 * 14). Figures, never assertions: it exits 0 whatever they are, 1 only when
 * something did not work (a value that came back wrong included).
 *
 * It starts a cluster on loopback with tests/rcluster_harness.c (3 masters,
 * 0 or 1 replica each; the harness kills the servers and removes their
 * directory at exit or on a signal) and, for each value size:
 *
 *   1. kv_rc: SETs N keys (about --mib MiB in all) in batches of B, then
 *      GETs them all in batches of B, --passes times. Only the kv_rc_get()
 *      calls are timed; every value is checked byte for byte (and given back
 *      to the client's pool) between them, outside the clock.
 *   2. redis-benchmark -t get -n N x passes against the same cluster, per
 *      configuration of --rb (clients, pipeline, threads). redis-benchmark
 *      --cluster reads keys of its own naming, "key:{T}:<12 digits>": T is
 *      a hash tag of the first slot of the master the connection goes to,
 *      padded with '}' to 3 bytes (redis-benchmark.c, setClusterKeyHashTag();
 *      current_slot_index stays 0), the digits random below -r. So the tags
 *      are learnt once from a tiny SET run of its own (-r 1), and before its
 *      GETs the cluster holds, for every tag, the K = N/3 keys below -r K,
 *      each a value of the size measured: every GET is a hit of that size,
 *      which the masters' keyspace_hits and keyspace_misses (INFO stats,
 *      read before and after) confirm. Its requests/s x the value size is
 *      its GB/s.
 *
 *   3. the write path: redis-benchmark -t set -n N x passes of the same size
 *      with the fair peer's -c/-P (a connection per master, one thread),
 *      beside kv_rc's SETs of step 1 (--passes times over the N keys, all
 *      timed).
 *
 * The cluster is flushed between phases, so each side reads from a data set
 * of the same size (about N values).
 *
 *   kvrcbench [--replicas 0|1] [--mib M] [--batch B] [--passes P]
 *             [--rb C:P[:THREADS],...] [SIZE...]
 *
 * SIZE: bytes, with k or m for KiB or MiB (default 16k 256k 1m); --mib 256,
 * --batch 64, --passes 8. --rb default: 1:B:1 (one thread, one connection,
 * so one master), 3:B/3:1 (one thread and one connection per master, about
 * B requests in flight in all, as the client has), 3:B (redis-benchmark's
 * default for a cluster: a thread per master; 3 x B in flight). Without
 * redis-server or redis-cli it says it skipped and exits 0; without
 * redis-benchmark it measures the client alone. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "rcluster.h"
#include "rbench.h"

#define MASTERS RB_MASTERS
#define MAX_SIZES 16
#define MAX_RB 8
#define POOL_SPAN 65536   /* values start at one of this many offsets in the pool */
#define GB 1e9

static char bin_buf[4096];   /* rb_bin's, once the checks before it are done */
static unsigned char *pool;
static size_t pool_len;

/* Value i of a size: size bytes of the random pool from an offset that
 * differs for 65536 consecutive i (8191 is odd), so a value that comes back
 * under another key's name, or shifted, does not compare equal. */
static const unsigned char *value_of(size_t i)
{
	return pool + ((i * 8191) & (POOL_SPAN - 1));
}

static void fill_pool(size_t max_size)
{
	uint64_t x = 0x9e3779b97f4a7c15ull;

	pool_len = max_size + POOL_SPAN;
	pool = malloc(pool_len);
	if (!pool)
		die("out of memory");
	for (size_t i = 0; i < pool_len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		pool[i] = (unsigned char)(x >> 32);
	}
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* ---- kv_rc ---- */

struct keys {
	size_t n;
	char (*name)[32];
	struct kv_rc_key *key;
};

static void keys_make(struct keys *k, size_t n, const char *tag, size_t per_tag)
{
	k->n = n;
	k->name = calloc(n, sizeof(*k->name));
	k->key = calloc(n, sizeof(*k->key));
	if (!k->name || !k->key)
		die("out of memory");
	for (size_t i = 0; i < n; i++) {
		int len;

		if (tag)   /* redis-benchmark's names: tags[i / per_tag], i % per_tag */
			len = rb_key_name(k->name[i], sizeof(k->name[i]), tag, i, per_tag);
		else
			len = snprintf(k->name[i], sizeof(k->name[i]), "kvrc:%08zu", i);
		k->key[i].data = k->name[i];
		k->key[i].len = (size_t)len;
	}
}

static void keys_free(struct keys *k)
{
	free(k->name);
	free(k->key);
}

/* SETs every key (value i for key i), B at a time; returns the seconds. */
static double set_all(struct kv_rc *rc, const struct keys *k, size_t size, size_t b)
{
	struct kv_rc_val *v = calloc(b, sizeof(*v));
	int *st = calloc(b, sizeof(*st));
	uint64_t t0 = rb_now_ns();

	if (!v || !st)
		die("out of memory");
	for (size_t i = 0; i < k->n; i += b) {
		size_t m = k->n - i < b ? k->n - i : b;

		for (size_t j = 0; j < m; j++) {
			v[j].data = (void *)value_of(i + j);
			v[j].len = size;
		}
		if (kv_rc_set(rc, m, k->key + i, v, 0, st) != (int)m)
			die("kv_rc_set: %s", kv_rc_last_error(rc));
	}
	free(v);
	free(st);
	return (double)(rb_now_ns() - t0) / 1e9;
}

struct get_result {
	double secs;          /* in kv_rc_get() only */
	double p50_ms, p99_ms, mean_ms;
	double best_pass_gbs, worst_pass_gbs;
	uint64_t rounds;
};

/* GETs every key passes times, B at a time, checking each value. */
static void get_all(struct kv_rc *rc, const struct keys *k, size_t size, size_t b,
		    unsigned passes, struct get_result *res)
{
	size_t nb = (k->n + b - 1) / b, done = 0;
	struct kv_rc_val *v = calloc(b, sizeof(*v));
	double *lat = calloc(nb * passes, sizeof(*lat));
	struct kv_rc_stats s0, s1;

	if (!v || !lat)
		die("out of memory");
	memset(res, 0, sizeof(*res));
	res->worst_pass_gbs = 1e30;
	kv_rc_stats(rc, &s0);
	for (unsigned p = 0; p < passes; p++) {
		double pass_secs = 0;

		for (size_t i = 0; i < k->n; i += b) {
			size_t m = k->n - i < b ? k->n - i : b;
			uint64_t t0 = rb_now_ns();
			int hits = kv_rc_get(rc, m, k->key + i, v);
			double dt = (double)(rb_now_ns() - t0) / 1e9;

			if (hits != (int)m)
				die("kv_rc_get: not all hits: %s", kv_rc_last_error(rc));
			for (size_t j = 0; j < m; j++)
				if (v[j].status != KV_RC_HIT || v[j].len != size ||
				    memcmp(v[j].data, value_of(i + j), size))
					die("%s: the value came back wrong", k->name[i + j]);
			kv_rc_vals_release(rc, m, v);  /* as the tier does */
			lat[done++] = dt;
			pass_secs += dt;
		}
		double gbs = (double)k->n * size / pass_secs / GB;

		res->secs += pass_secs;
		res->best_pass_gbs = gbs > res->best_pass_gbs ? gbs : res->best_pass_gbs;
		res->worst_pass_gbs = gbs < res->worst_pass_gbs ? gbs : res->worst_pass_gbs;
	}
	kv_rc_stats(rc, &s1);
	res->rounds = s1.rounds - s0.rounds;
	res->mean_ms = res->secs / (double)done * 1e3;
	qsort(lat, done, sizeof(*lat), cmp_double);
	res->p50_ms = lat[(done - 1) / 2] * 1e3;
	res->p99_ms = lat[(size_t)((double)(done - 1) * 0.99 + 0.5)] * 1e3;
	free(v);
	free(lat);
}

static void usage(void)
{
	fputs("usage: kvrcbench [--replicas 0|1] [--mib M] [--batch B] [--passes P]\n"
	      "                 [--rb C:P[:THREADS],...] [SIZE...]\n", stderr);
	exit(2);
}

int main(int argc, char **argv)
{
	size_t sizes[MAX_SIZES], nsizes = 0, mib = 256, batch = 64, max_size = 0;
	struct rb_conf rb[MAX_RB];
	int nrb = -1, replicas = 0;
	unsigned passes = 8;
	char tags[MASTERS * 8] = { 0 }, port[16], err[256], tag_rows[MASTERS][8];
	struct kvt_rc cluster;
	struct kv_rc *rc;
	struct {
		size_t n;
		double set_gbs;
		struct get_result get;
		struct rb_result rb[MAX_RB];
		struct rb_result rb_set;   /* the write path's peer */
	} row[MAX_SIZES];
	int set_peer = 0;

	rb_prog = "kvrcbench";
	for (int a = 1; a < argc; a++) {
		const char *v = a + 1 < argc ? argv[a + 1] : NULL;

		if (!strcmp(argv[a], "--replicas") && v) {
			replicas = atoi(v), a++;
			if (replicas < 0 || replicas > 1)
				usage();
		} else if (!strcmp(argv[a], "--mib") && v) {
			mib = strtoull(v, NULL, 10), a++;
		} else if (!strcmp(argv[a], "--batch") && v) {
			batch = strtoull(v, NULL, 10), a++;
		} else if (!strcmp(argv[a], "--passes") && v) {
			passes = (unsigned)strtoul(v, NULL, 10), a++;
		} else if (!strcmp(argv[a], "--rb") && v) {
			char *s = strdup(v), *save = NULL, *t;

			nrb = 0;
			for (t = strtok_r(s, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
				struct rb_conf r = { 0, 0, 0 };

				if (nrb == MAX_RB || sscanf(t, "%d:%d:%d", &r.clients, &r.pipeline,
							     &r.threads) < 2 ||
				    r.clients < 1 || r.pipeline < 1 || r.threads < 0)
					usage();
				rb[nrb++] = r;
			}
			free(s);
			a++;
		} else if (argv[a][0] == '-' || nsizes == MAX_SIZES) {
			usage();
		} else {
			sizes[nsizes++] = rb_parse_size(argv[a], 1, 256u << 20, 1);
		}
	}
	if (!mib || !batch || !passes)
		usage();
	if (!nsizes) {
		sizes[0] = 16 << 10;
		sizes[1] = 256 << 10;
		sizes[2] = 1 << 20;
		nsizes = 3;
	}
	if (nrb < 0) {
		rb[0] = (struct rb_conf){ 1, (int)batch, 1 };
		rb[1] = (struct rb_conf){ MASTERS, (int)((batch + MASTERS - 1) / MASTERS), 1 };
		rb[2] = (struct rb_conf){ MASTERS, (int)batch, 0 };
		nrb = 3;
	}
	/* The write path's peer: the first --rb with a connection per master
	 * and one thread (the client's shape), else the first. */
	for (int r = nrb - 1; r >= 0; r--)
		if (rb[r].clients == MASTERS && rb[r].threads == 1)
			set_peer = r;
	for (size_t s = 0; s < nsizes; s++)
		max_size = sizes[s] > max_size ? sizes[s] : max_size;

	/* The harness exits 77 without them; a benchmark that cannot run says
	 * so and exits 0, as a skipped test would not fail a run. */
	if (!kvt_rc_find_bin("KVT_REDIS_SERVER", "redis-server", bin_buf, sizeof(bin_buf)) ||
	    !kvt_rc_find_bin("KVT_REDIS_CLI", "redis-cli", bin_buf, sizeof(bin_buf))) {
		printf("kvrcbench: skipped: redis-server or redis-cli not found "
		       "(Debian: redis-server, redis-tools)\n");
		return 0;
	}
	rb_bin = kvt_rc_find_bin("KVRCBENCH_REDIS_BENCHMARK", "redis-benchmark", bin_buf,
					sizeof(bin_buf));
	if (!rb_bin)
		printf("kvrcbench: redis-benchmark not found: the client alone\n");

	fill_pool(max_size);
	/* cluster-node-timeout 15 s, not the harness's 1 s: a master that a
	 * busy machine keeps off the CPU for a second would be failed over in
	 * the middle of a run (seen here with replicas, at load 10). */
	kvt_rc_start(&cluster, MASTERS, replicas,
		     &(struct kvt_rc_opts){ .node_timeout_ms = 15000 });
	snprintf(port, sizeof(port), "%d", cluster.node[rb_a_master(&cluster)].port);
	/* A long timeout: two busy vCPUs must not turn a slow answer into an
	 * error (the client's timeouts are not what is measured). */
	if (kv_rc_new(kvt_rc_seeds(&cluster), NULL, NULL, 10000, &rc, err, sizeof(err)) < 0)
		die("kv_rc_new: %s", err);
	printf("kvrcbench: %d masters, %d replica%s each, loopback; batches of %zu, %u passes, "
	       "about %zu MiB per size\n", MASTERS, replicas, replicas == 1 ? "" : "s", batch,
	       passes, mib);
	if (rb_bin && rb_learn_tags(&cluster, port, tag_rows) < 0) {
		printf("kvrcbench: redis-benchmark's keys not found: the client alone\n");
		rb_bin = NULL;
	}
	if (rb_bin) {
		for (int t = 0; t < MASTERS; t++)
			memcpy(tags + t * 8, tag_rows[t], 8);
		printf("kvrcbench: redis-benchmark's hash tags %s %s %s\n", tag_rows[0],
		       tag_rows[1], tag_rows[2]);
	}

	for (size_t s = 0; s < nsizes; s++) {
		size_t size = sizes[s], n = ((size_t)mib << 20) / size, per_tag;
		struct keys k;
		char sz[24];

		if (n < batch)
			n = batch;
		per_tag = (n + MASTERS - 1) / MASTERS;
		row[s].n = n;
		rb_size_str(size, sz, sizeof(sz));

		rb_flush_all(&cluster);
		keys_make(&k, n, NULL, 0);
		/* The write path: passes times over the same keys (the first
		 * creates them, the others overwrite), as redis-benchmark's SETs
		 * below. */
		{
			double secs = 0;

			for (unsigned p = 0; p < passes; p++)
				secs += set_all(rc, &k, size, batch);
			row[s].set_gbs = (double)n * passes * size / secs / GB;
		}
		if (replicas && kvt_rc_wait_replicated(&cluster, KVT_RC_WAIT_MS))
			die("replicas did not catch up");
		get_all(rc, &k, size, batch, passes, &row[s].get);
		keys_free(&k);
		printf("%s: kv_rc %zu keys: SET %.2f GB/s; GET %.2f GB/s (passes %.2f-%.2f), "
		       "a batch of %zu %.2f ms mean, p50 %.2f, p99 %.2f; %.1f node rounds per "
		       "batch\n", sz, n, row[s].set_gbs, (double)n * passes * size /
		       row[s].get.secs / GB, row[s].get.worst_pass_gbs, row[s].get.best_pass_gbs,
		       batch, row[s].get.mean_ms, row[s].get.p50_ms, row[s].get.p99_ms,
		       (double)row[s].get.rounds / (double)(passes * ((n + batch - 1) / batch)));
		fflush(stdout);
		if (!rb_bin)
			continue;

		/* redis-benchmark's keys: per tag per_tag values of this size. */
		rb_flush_all(&cluster);
		keys_make(&k, per_tag * MASTERS, tags, per_tag);
		set_all(rc, &k, size, batch);
		keys_free(&k);
		if (replicas && kvt_rc_wait_replicated(&cluster, KVT_RC_WAIT_MS))
			die("replicas did not catch up");
		for (int r = 0; r < nrb; r++) {
			struct rb_result *res = &row[s].rb[r];
			char label[64];

			rb_run(&cluster, port, &rb[r], "get", size, n * passes, per_tag, res);
			rb_label(&rb[r], label, sizeof(label));
			printf("%s: redis-benchmark %s: %.0f GET/s, %.2f GB/s, p50 %.3f ms; "
			       "keyspace hits %llu, misses %llu; hits / its whole run %.2f GB/s\n",
			       sz, label, res->rps, res->gbs, res->p50_ms, res->hits, res->misses,
			       (double)res->hits * (double)size / res->wall_s / GB);
			fflush(stdout);
		}
		/* The write path: redis-benchmark SETs n x passes values of this
		 * size over n keys (random below -r), after a flush, as kv_rc's
		 * SET passes did. */
		{
			struct rb_result *res = &row[s].rb_set;
			char label[64];

			rb_flush_all(&cluster);
			rb_run(&cluster, port, &rb[set_peer], "set", size, n * passes, per_tag, res);
			rb_label(&rb[set_peer], label, sizeof(label));
			printf("%s: redis-benchmark %s -t set: %.0f SET/s, %.2f GB/s, p50 %.3f ms\n",
			       sz, label, res->rps, res->gbs, res->p50_ms);
			fflush(stdout);
		}
	}

	/* The tables, as docs/benchmarks.md shows them. */
	printf("\n| value size | keys | kv_rc GB/s (a batch of %zu: p50 ms) |", batch);
	for (int r = 0; rb_bin && r < nrb; r++) {
		char label[64];

		rb_label(&rb[r], label, sizeof(label));
		printf(" redis-benchmark `%s` GB/s (p50 ms) | kv_rc / it |", label);
	}
	printf("\n|---|---|---|");
	for (int r = 0; rb_bin && r < nrb; r++)
		printf("---|---|");
	printf("\n");
	for (size_t s = 0; s < nsizes; s++) {
		double gbs = (double)row[s].n * passes * sizes[s] / row[s].get.secs / GB;
		char sz[24];

		rb_size_str(sizes[s], sz, sizeof(sz));
		printf("| %s | %zu | %.2f (%.2f) |", sz, row[s].n, gbs, row[s].get.p50_ms);
		for (int r = 0; rb_bin && r < nrb; r++) {
			const struct rb_result *res = &row[s].rb[r];

			if (res->ok)
				printf(" %.2f (%.2f)%s | %.2fx |", res->gbs, res->p50_ms,
				       res->misses ? " (misses!)" : "", gbs / res->gbs);
			else
				printf(" - | - |");
		}
		printf("\n");
	}
	if (rb_bin) {
		char label[64];

		rb_label(&rb[set_peer], label, sizeof(label));
		printf("\n| value size | keys | kv_rc SET GB/s (batches of %zu) | redis-benchmark `%s "
		       "-t set` GB/s (p50 ms) | kv_rc / it |\n|---|---|---|---|---|\n", batch, label);
		for (size_t s = 0; s < nsizes; s++) {
			const struct rb_result *res = &row[s].rb_set;
			char sz[24];

			rb_size_str(sizes[s], sz, sizeof(sz));
			if (res->ok)
				printf("| %s | %zu | %.2f | %.2f (%.2f) | %.2fx |\n", sz, row[s].n,
				       row[s].set_gbs, res->gbs, res->p50_ms, row[s].set_gbs / res->gbs);
			else
				printf("| %s | %zu | %.2f | - | - |\n", sz, row[s].n, row[s].set_gbs);
		}
	}
	kv_rc_free(rc);
	kvt_rc_stop(&cluster);
	free(pool);
	return 0;
}
