/* kvg4rate: the rate at which the daemon's G4 tier delivers a prefix back
 * to G1, and the rate at which it writes a prefix to G4 at demotion, in
 * uncompressed bytes per second (and, for the writes, bytes stored per
 * second), for a pool with compress = off, fp8_e4m3 and fp8_e5m2, beside
 * redis-benchmark's GET and SET rates at the value sizes stored, on the
 * same cluster in the same run (issue 28, item 2).
 * Figures, never assertions: it exits 0 whatever they are, 1 only when
 * something did not work (a block that came back wrong, a block that did
 * not come from G4).
 *
 * It starts a Redis Cluster on loopback with tests/rcluster_harness.c (3
 * masters, no replica, cluster-node-timeout 15 s) and one real kvcached
 * (tests/harness.c; the host backend) with G2 and G4 but no G3, three
 * namespaces that write to G4 at demotion (remote_write = demote) and
 * differ in compress. For each block size and each namespace:
 *
 *   1. --passes times: a chain of N blocks (about --mib MiB) of FP16 values
 *      like a KV cache's (normal values, a scale per channel, two outlier
 *      channels in 128) is written into G1, sealed and released (outside
 *      the clock); then timed, from the Evict G1 call to the first poll of
 *      the daemon's Stats (every 0.5 ms, on the same connection) whose G4
 *      counters say N more blocks written and no byte in flight: the
 *      demotion to G2 (quantized for a compressing namespace: the copy
 *      thread), the loop's copy of each block into a G4 value, its CRC32C
 *      on the tier's worker, and the pipelined SETs of the write thread
 *      until the last reply (none may be dropped or fail). Printed too:
 *      when the Evict reply came, and the first poll that saw G2's
 *      demotions grown by N (the demotion done; the G4 writes of its
 *      first blocks overlap it, the rest follow). Evict G2 drops the
 *      chain: it is now in G4 only. The same hashes every pass: the
 *      first pass creates the keys, the others overwrite them (as
 *      redis-benchmark -t set below does with its keyspace);
 *   2. --passes times: with G1 and G2 holding none of it (the pool's cached
 *      blocks and G2's blocks are 0, there is no G3), one Lookup of the
 *      whole chain is timed, from the call to its reply: the tier fetches
 *      up to 64 blocks (at most 4 MiB of them) per batch from the cluster,
 *      copies them into G2 slots, and the promotion copies (or dequantizes)
 *      them into G1, the next batch read ahead meanwhile (docs/g4.md). G4's
 *      hits must have grown by N. Then, outside the
 *      clock, every block is compared with what it must hold: its bytes
 *      for a raw pool, the C reference's quantize-dequantize round trip of
 *      them (bit for bit: the daemon's fast path gives the same bytes) for a compressed
 *      one; then released and evicted from G1 and G2 again.
 *
 * Then the cluster is flushed, and for each value size the tier stored
 * (the 80-byte slot header + the block or its quantized form; G4's bytes_in
 * / hits), redis-benchmark --cluster -t get with the fair set-up of
 * docs/benchmarks.md (-c 3 -P 22 --threads 1: a connection per master, one
 * thread, ~64 in flight, as the tier's read thread has; its write thread
 * sends a batch of up to 256 at a time), every GET a hit (the masters'
 * keyspace counters are printed), then, the cluster flushed, -t set with
 * the same set-up over a keyspace of the chain's size (as many SETs as the
 * write passes made, at least 512 MiB). The write ratio is the tier's
 * bytes stored per second over redis-benchmark's SET bytes per second at
 * the same value size: the tier's clock also holds the demotion and the
 * copies, redis-benchmark's only its SETs.
 *
 *   kvg4rate [--mib M] [--passes P] [--rb C:P[:THREADS]] [SIZE...]
 *
 * SIZE: block bytes, with k or m (default 256k 2m); --mib 128; --passes 5;
 * --rb 3:22:1. The daemon is $KVCACHED_BIN, else the one built beside it.
 * $KVG4_PERF_FIFO (a perf control fifo) brackets the raw pool's timed
 * lookups with perf's enable and disable, or its timed writes with
 * $KVG4_PERF_PHASE=write, or another namespace's with $KVG4_PERF_NS
 * (docs/benchmarks.md has the command).
 * $KVG4_PERF_PHASE=rb-get or rb-set brackets redis-benchmark's GETs or SETs
 * instead. Last, for the raw pool and redis-benchmark at each value size:
 * the CPU time of each process (the daemon per thread: loop, G4 readers,
 * writer, the tier's worker, the rest; the cluster's servers; kvg4rate;
 * redis-benchmark) per GB of values over the timed parts, how many CPUs
 * that kept busy, and each process's sleeps and read/write system calls per
 * 1,000 values (docs/benchmarks.md, "G4 small values, fifth pass").
 * $KVG4_TRACE (1: a file of the run's, removed; else the file to keep)
 * has the daemon stamp its writes' steps there ($KVCACHED_G4_TRACE,
 * daemon/tier/remote_write.c) and prints, per timed write of the raw pool,
 * when the blocks came to G4, the write threads' time in their calls (one
 * at least, two at once) and between them (docs/benchmarks.md, "G4
 * writes, sixth pass").
 * Without redis-server or redis-cli it says it skipped and exits 0; without
 * redis-benchmark it measures the tier alone. */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "fp8.h"
#include "harness.h"
#include "quant.h"
#include "rbench.h"
#include "rcluster.h"

#define MAX_SIZES 8
#define NFMT 3
#define HDR 80          /* struct slot_hdr, before each G4 value's payload */
#define GB 1e9

#ifndef KVG4RATE_DAEMON
#define KVG4RATE_DAEMON ""
#endif

static const char *const fmt_ns[NFMT] = { "raw", "e4m3", "e5m2" };
static const char *const fmt_conf[NFMT] = { "off", "fp8_e4m3", "fp8_e5m2" };
static const enum kv_qfmt fmt_q[NFMT] = { KV_QFMT_RAW, KV_QFMT_E4M3, KV_QFMT_E5M2 };

/* CPU time (ns) of each process of a path, from each thread's schedstat
 * (the scheduler's run time, exact) and, for redis-benchmark, the waited
 * children's rusage: where the CPU goes per GB moved, on a machine with
 * two CPUs the floor that bounds both paths (docs/benchmarks.md, "G4 small
 * values, fifth pass"). The daemon's G4 threads are named (tier/remote.c);
 * the loop is its first thread; the rest (the host backend's copy thread,
 * the HTTP thread) is "copy". */
enum { CPU_LOOP, CPU_READ, CPU_WRITE, CPU_SUM, CPU_COPY, CPU_REDIS, CPU_SELF, CPU_RB, CPU_N };
static const char *const cpu_name[CPU_N] = {
	"loop", "g4read", "g4write", "g4sum", "copy", "redis-servers", "kvg4rate", "redis-benchmark"
};

struct cpu {
	uint64_t ns[CPU_N];
	uint64_t sw[CPU_N];        /* voluntary context switches: sleeps, so wakeups */
	uint64_t sc[CPU_N];        /* read and write system calls (/proc's io: syscr + syscw) */
	uint64_t wall_ns, bytes;   /* accumulated: the timed parts, G4 value bytes moved */
};

struct fmt_row {
	size_t value_bytes;         /* one G4 value, as the tier read it */
	double gbs[64];             /* per pass: uncompressed bytes / lookup time */
	double lookup_ms[64];
	unsigned passes;
	uint64_t fetches;           /* G4 fetches of the timed lookups */
	uint64_t direct, hits;      /* ... their values read straight into G2 slots, of hits */
	double dequant_gbs;         /* kv_qfmt_dequant alone, GB/s of FP16 out */
	/* The writes at demotion, per pass: */
	size_t wvalue_bytes;        /* one G4 value, as the tier wrote it */
	double wgbs[64];            /* uncompressed bytes / (Evict G1 -> all written) */
	double wstored_gbs[64];     /* bytes stored / the same time */
	double wms[64], evict_ms[64], demoted_ms[64];
	struct cpu rcpu, wcpu;      /* the timed lookups; the timed writes but the first */
};

struct size_row {
	size_t block, n;
	struct fmt_row f[NFMT];
};

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* ---- the data: FP16 values shaped like a KV cache's ---- */

static uint64_t rs = 0x9e3779b97f4a7c15ull;

static uint64_t xorshift(void)
{
	rs ^= rs << 13;
	rs ^= rs >> 7;
	rs ^= rs << 17;
	return rs;
}

/* About normal (the sum of four uniforms, variance 1), times a scale per
 * channel of 128 (log-normal, channels 17 and 90 twenty times larger, as
 * bench/kvquant.c's "kv-like" set). */
static void fill_values(uint16_t *v, size_t n)
{
	float ch[128];

	for (int c = 0; c < 128; c++) {
		double u = 0;

		for (int k = 0; k < 4; k++)
			u += (double)(xorshift() >> 11) * 0x1p-53 - 0.5;
		ch[c] = (float)(exp2(0.5 * u * 1.7320508) * (c == 17 || c == 90 ? 20 : 1));
	}
	for (size_t i = 0; i < n; i++) {
		uint64_t x = xorshift();
		float u = (float)((x & 0xffff) + ((x >> 16) & 0xffff) + ((x >> 32) & 0xffff) +
				  (x >> 48)) / 65536.0f - 2.0f;

		v[i] = kv_f32_to_f16(u * 1.7320508f * ch[i % 128]);
	}
}

/* ---- the daemon ---- */

static struct kvt_rc cluster;
static struct kvt_daemon daemon_;
static char tmp[64];

static void write_conf(char *arg, size_t len, size_t max_inflight)
{
	char path[160];
	unsigned uid = (unsigned)getuid();
	FILE *f;

	snprintf(path, sizeof(path), "%s/kvcached.conf", tmp);
	if (!(f = fopen(path, "w")))
		die("cannot write %s", path);
	/* A long timeout: two busy vCPUs must not turn a slow node into
	 * misses (the timeout is not what is measured). */
	fprintf(f, "log_level = warn\nremote_seeds = %s\nremote_timeout = 10s\nremote_auth = off\n"
		"remote_fetch_timeout = 60s\nremote_max_inflight = %zu\n\n",
		kvt_rc_seeds(&cluster), max_inflight);
	for (int i = 0; i < NFMT; i++)
		fprintf(f, "[namespace %s]\nusers = %u\nremote = yes\nremote_write = demote\n"
			"compress = %s\n\n", fmt_ns[i], uid, fmt_conf[i]);
	fclose(f);
	snprintf(arg, len, "--config=%s", path);
}

/* Adds the run time (ns) of every thread of pid to c, by class. */
static void cpu_add_pid(struct cpu *c, pid_t pid, int daemon)
{
	char path[320], comm[32], line[128];
	struct dirent *e;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	if (!(d = opendir(path)))
		return;
	while ((e = readdir(d))) {
		unsigned long long run = 0, vsw = 0;
		int cls = CPU_REDIS;
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/schedstat", (int)pid, e->d_name);
		if (!(f = fopen(path, "re")))
			continue;
		if (!fgets(line, sizeof(line), f) || sscanf(line, "%llu", &run) != 1)
			run = 0;
		fclose(f);
		snprintf(path, sizeof(path), "/proc/%d/task/%s/status", (int)pid, e->d_name);
		if ((f = fopen(path, "re"))) {
			while (fgets(line, sizeof(line), f))
				if (sscanf(line, "voluntary_ctxt_switches: %llu", &vsw) == 1)
					break;
			fclose(f);
		}
		if (daemon) {
			comm[0] = 0;
			snprintf(path, sizeof(path), "/proc/%d/task/%s/comm", (int)pid, e->d_name);
			if ((f = fopen(path, "re"))) {
				if (!fgets(comm, sizeof(comm), f))
					comm[0] = 0;
				fclose(f);
			}
			cls = atoi(e->d_name) == (int)pid            ? CPU_LOOP
			      : !strncmp(comm, "kvd-g4read", 10)   ? CPU_READ
			      : !strncmp(comm, "kvd-g4write", 11)  ? CPU_WRITE
			      : !strncmp(comm, "kvd-g4sum", 9)     ? CPU_SUM
								   : CPU_COPY;
		} else if (pid == getpid()) {
			cls = CPU_SELF;
		}
		c->ns[cls] += run;
		c->sw[cls] += vsw;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/io", (int)pid, e->d_name);
		if ((f = fopen(path, "re"))) {
			unsigned long long v;

			while (fgets(line, sizeof(line), f))
				if (sscanf(line, "syscr: %llu", &v) == 1 || sscanf(line, "syscw: %llu", &v) == 1)
					c->sc[cls] += v;
			fclose(f);
		}
	}
	closedir(d);
}

/* The CPU time so far of the daemon's threads, the cluster's servers,
 * kvg4rate and its waited children (redis-benchmark). */
static void cpu_snap(struct cpu *c, const struct kvt_daemon *dm, const struct kvt_rc *rc)
{
	struct rusage ru;

	memset(c, 0, sizeof(*c));
	if (dm && dm->pid > 0)
		cpu_add_pid(c, dm->pid, 1);
	for (int i = 0; i < rc->n; i++)
		if (rc->node[i].pid > 0)
			cpu_add_pid(c, rc->node[i].pid, 0);
	cpu_add_pid(c, getpid(), 0);
	if (!getrusage(RUSAGE_CHILDREN, &ru))
		c->ns[CPU_RB] = ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) *
					1000000000ull +
				((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000ull;
}

/* acc += b - a, with the wall time and bytes of that part. */
static void cpu_acc(struct cpu *acc, const struct cpu *a, const struct cpu *b, uint64_t wall_ns,
		    uint64_t bytes)
{
	for (int i = 0; i < CPU_N; i++) {
		acc->ns[i] += b->ns[i] - a->ns[i];
		acc->sw[i] += b->sw[i] - a->sw[i];
		acc->sc[i] += b->sc[i] - a->sc[i];
	}
	acc->wall_ns += wall_ns;
	acc->bytes += bytes;
}

/* One row of the CPU table: ms of CPU per GB moved, per process class,
 * all together, how many CPUs were busy on average, and the rate two
 * CPUs would allow at that cost. */
static void cpu_row(const char *what, size_t value_bytes, const struct cpu *c)
{
	double gb = (double)c->bytes / GB, all = 0;

	if (!c->bytes || !c->wall_ns)
		return;
	printf("| %s | %zu |", what, value_bytes);
	for (int i = 0; i < CPU_N; i++) {
		all += (double)c->ns[i] / 1e6;
		if (c->ns[i])
			printf(" %.0f |", (double)c->ns[i] / 1e6 / gb);
		else
			printf(" - |");
	}
	printf(" %.0f | %.2f | %.2f | %.2f |\n", all / gb, all / ((double)c->wall_ns / 1e6),
	       gb / ((double)c->wall_ns / 1e9), 2.0 * gb / (all / 1e3));
}

/* The same path's sleeps (voluntary context switches, each one wakeup)
 * per 1,000 values moved, per process class. */
static void cpu_sw_row(const char *what, size_t value_bytes, const struct cpu *c)
{
	double vals = (double)c->bytes / (double)value_bytes;

	if (!c->bytes || !value_bytes)
		return;
	printf("| %s | %zu |", what, value_bytes);
	for (int i = 0; i < CPU_N; i++)
		if (i != CPU_RB && (c->sw[i] || c->sc[i]))
			printf(" %.0f / %.0f |", (double)c->sw[i] * 1000 / vals,
			       (double)c->sc[i] * 1000 / vals);
		else
			printf(" - |");
	printf("\n");
}

struct g4c {
	uint64_t hits, fetches, bytes_in, bytes_out, writes, write_errors, dropped, inflight,
		sum_fail, g2_demotions, direct;
};

/* G2's demotions (blocks come down from G1) in a Stats reply. */
static uint64_t g2_demotions(const Kvcached__Response *resp)
{
	for (size_t i = 0; i < resp->stats->n_tiers; i++)
		if (resp->stats->tiers[i]->tier == KVCACHED__TIER__TIER_G2)
			return resp->stats->tiers[i]->demotions;
	return 0;
}

/* G4's counters from a Stats response (freed here). */
static void g4_from(Kvcached__Response *r, struct g4c *g)
{
	const Kvcached__RemoteInfo *ri = r->stats->remote;

	g->hits = ri->hits;
	g->fetches = ri->fetches;
	g->bytes_in = ri->bytes_in;
	g->bytes_out = ri->bytes_out;
	g->writes = ri->writes;
	g->write_errors = ri->write_errors;
	g->dropped = ri->dropped;
	g->inflight = ri->inflight_bytes;
	g->sum_fail = ri->checksum_failures;
	g->direct = ri->direct;
	g->g2_demotions = g2_demotions(r);
	kvcached__response__free_unpacked(r, NULL);
}

static void g4_read(const char *ns, struct g4c *g)
{
	g4_from(kvt_g4_stats(ns), g);
}

/* G4's counters through c (no connection made per poll). */
static void g4_read_on(kvc_conn *c, struct g4c *g)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Stats st = KVCACHED__STATS__INIT;
	Kvcached__Response *resp = NULL;

	rq.op_case = KVCACHED__REQUEST__OP_STATS;
	rq.stats = &st;
	if (kvc_call(c, &rq, &resp) || resp->result_case != KVCACHED__RESPONSE__RESULT_STATS ||
	    !resp->stats->remote)
		die("Stats failed: %s", kvc_last_error(c));
	g4_from(resp, g);
}

/* G4's counters once every write queued or under way is out. */
static void g4_settled(const char *ns, struct g4c *g)
{
	uint64_t t0 = rb_now_ns();

	for (;;) {
		g4_read(ns, g);
		if (!g->inflight)
			return;
		if (rb_now_ns() - t0 > 120 * 1000000000ull)
			die("G4 writes still in flight after 2 minutes");
		usleep(1000);
	}
}

/* Neither G1 nor G2 holds any of pool's blocks, and there is no G3. */
static void check_g4_only(int pool)
{
	uint64_t fr, wr, se, ca;
	struct kvt_tier g2, g3;

	kvt_tiers_settle();
	kvt_pool_counts(pool, &fr, &wr, &se, &ca);
	kvt_tier(1, &g2);
	kvt_tier(2, &g3);
	if (wr || se || ca || !g2.present || g2.blocks || g3.present)
		die("before a timed lookup: G1 has %llu writable, %llu sealed, %llu cached blocks; "
		    "G2 %s %llu; G3 %s", (unsigned long long)wr, (unsigned long long)se,
		    (unsigned long long)ca, g2.present ? "holds" : "absent,",
		    (unsigned long long)g2.blocks, g3.present ? "present" : "absent");
}

/* Evict G1 of every pool through c, returning with its reply (the tiers
 * not waited for: kvt_evict() would). */
static void evict_g1(kvc_conn *c)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Evict ev = KVCACHED__EVICT__INIT;
	Kvcached__Response *resp = NULL;

	ev.tier = KVCACHED__TIER__TIER_G1;
	ev.all_pools = 1;
	rq.op_case = KVCACHED__REQUEST__OP_EVICT;
	rq.evict = &ev;
	if (kvc_call(c, &rq, &resp) || resp->error ||
	    resp->result_case != KVCACHED__RESPONSE__RESULT_EVICT)
		die("Evict G1 failed");
	kvcached__response__free_unpacked(resp, NULL);
}

static double median(const double *v, unsigned n, double *lo, double *hi)
{
	double sorted[64];

	memcpy(sorted, v, n * sizeof(double));
	qsort(sorted, n, sizeof(double), cmp_double);
	if (lo)
		*lo = sorted[0];
	if (hi)
		*hi = sorted[n - 1];
	return sorted[(n - 1) / 2];
}

/* One block size, one namespace: steps 1 and 2 of the comment above. */
/* $KVG4_PERF_FIFO: perf's control fifo (perf record -D -1
 * --control=fifo:PATH ...): "enable" before and "disable" after each timed
 * lookup (write: each timed write at demotion but the first, which creates
 * the cluster's keys and the write pool's buffers, when $KVG4_PERF_PHASE is
 * "write") of the raw pool (or the namespace $KVG4_PERF_NS names: raw,
 * e4m3, e5m2), so that a profile holds those only. write: 0 for a lookup,
 * 1 for a write, -1 for the first write (never bracketed). */
/* Writes cmd to perf's control fifo, then waits for perf's "ack" on
 * $KVG4_PERF_ACK when set (perf record --control=fifo:CTL,ACK): without
 * it, perf enables and disables when it gets round to it, and a profile
 * holds some of what comes after the timed part (the Evicts, the Stats
 * polls). */
static void perf_send(const char *path, const char *cmd)
{
	const char *ack = getenv("KVG4_PERF_ACK");
	char buf[16];
	FILE *f;

	if (!(f = fopen(path, "we")))
		return;
	fprintf(f, "%s\n", cmd);
	fclose(f);
	if (ack && (f = fopen(ack, "re"))) {
		while (fgets(buf, sizeof(buf), f) && strncmp(buf, "ack", 3))
			;
		fclose(f);
	}
}

static void perf_ctl(int fi, int write, const char *cmd)
{
	const char *path = getenv("KVG4_PERF_FIFO");
	const char *phase = getenv("KVG4_PERF_PHASE"), *ns = getenv("KVG4_PERF_NS");

	if (!path || strcmp(ns ? ns : "raw", fmt_ns[fi]) || (phase && !strncmp(phase, "rb-", 3)) ||
	    write != (phase && !strcmp(phase, "write")))
		return;
	perf_send(path, cmd);
}

/* The same for redis-benchmark's runs: $KVG4_PERF_PHASE rb-get or rb-set
 * brackets its GETs or SETs (every value size). */
static void rb_perf_ctl(const char *test, const char *cmd)
{
	const char *path = getenv("KVG4_PERF_FIFO"), *phase = getenv("KVG4_PERF_PHASE");

	if (!path || !phase || strncmp(phase, "rb-", 3) || strcmp(phase + 3, test))
		return;
	perf_send(path, cmd);
}

/* ---- the writes' timeline ($KVG4_TRACE) ---- */

/* The daemon's trace of its G4 writes (daemon/tier/remote_write.c,
 * $KVCACHED_G4_TRACE: a count, then events of { ns, kind, n }), mapped
 * read-only here; NULL without $KVG4_TRACE. */
#define TR_HDR 64
#define TR_MAX (1u << 20)
enum { TR_PUT = 1, TR_SEAL_SUB, TR_SEAL_DONE, TR_W_SUB, TR_W_START, TR_W_END, TR_W_DONE };

struct tr_ev {
	uint64_t ns;
	uint32_t kind, n;
};

static const volatile uint64_t *tr_count;
static const struct tr_ev *tr_ev;

static void trace_map(const char *path)
{
	size_t len = TR_HDR + (size_t)TR_MAX * sizeof(struct tr_ev);
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	void *m;

	if (fd < 0 || ftruncate(fd, (off_t)len) < 0 ||
	    (m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED)
		die("KVG4_TRACE: cannot map %s", path);
	close(fd);
	tr_count = m;
	tr_ev = (const struct tr_ev *)((const uint8_t *)m + TR_HDR);
}

static uint64_t trace_now(void)
{
	uint64_t n = tr_count ? *tr_count : 0;

	return n < TR_MAX ? n : TR_MAX;
}

/* One timed write pass's timeline, events [from, to) of the trace, t0 the
 * Evict call, t1 the poll that saw every write answered: when the blocks
 * came to G4 (demotion), how long the write threads were in their calls
 * (one at least, and two at once), the rate while one was, and where each
 * thread's time between its calls went: the loop's turn from a call's end
 * to its done() on the loop, waiting there for sealed writes (done() to
 * the next job), the thread's wakeup (the job handed over to its start). */
#define TR_WRITERS 8
static void trace_pass(const char *sz, unsigned p, uint64_t from, uint64_t to, uint64_t t0,
		       uint64_t t1, size_t vbytes)
{
	uint64_t sub[TR_WRITERS] = { 0 }, start[TR_WRITERS] = { 0 }, end[TR_WRITERS] = { 0 };
	uint64_t done[TR_WRITERS] = { 0 };
	uint64_t put0 = 0, put1 = 0, first = 0, last = 0, turn = 0, wait = 0, wake = 0;
	uint64_t puts = 0, vals = 0, calls = 0, any = 0, two = 0, since = 0;
	unsigned in = 0, writers = 0;

	for (uint64_t i = from; i < to; i++) {
		const struct tr_ev *e = &tr_ev[i];
		unsigned k = e->n >> 24;
		uint32_t n = e->n & 0xffffff;

		if (e->ns < t0 || e->ns > t1 || k >= TR_WRITERS)
			continue;
		switch (e->kind) {
		case TR_PUT:
			put0 = put0 ? put0 : e->ns;
			put1 = e->ns;
			puts += n;
			break;
		case TR_W_SUB:
			sub[k] = e->ns;
			if (done[k])
				wait += sub[k] - done[k];
			break;
		case TR_W_START:
			start[k] = e->ns;
			first = first ? first : e->ns;
			if (sub[k])
				wake += start[k] - sub[k];
			if (in >= 1)
				any += e->ns - since;
			if (in >= 2)
				two += e->ns - since;
			since = e->ns;
			in++;
			writers |= 1u << k;
			break;
		case TR_W_END:
			if (!start[k] || !in)
				break;
			end[k] = last = e->ns;
			any += e->ns - since;
			if (in >= 2)
				two += e->ns - since;
			since = e->ns;
			in--;
			vals += n;
			calls++;
			break;
		case TR_W_DONE:
			if (!end[k])
				break;
			done[k] = e->ns;
			turn += done[k] - end[k];
			break;
		}
	}
	if (!calls) {
		printf("trace %s pass %u: no write call in the window\n", sz, p);
		return;
	}
	printf("trace %s pass %u: %.1f ms; blocks to G4 (%llu) from %.2f to %.2f ms; write calls "
	       "%llu (%.0f values each) on %d threads from %.2f to %.2f ms: one at least in a "
	       "call %.1f ms, two at once %.1f ms, %.2f GB/s while one was; each thread between "
	       "its calls: the loop's turn %.1f ms, waiting for sealed writes %.1f ms, the "
	       "wakeup %.1f ms (summed); after the last %.2f ms\n", sz, p,
	       (double)(t1 - t0) / 1e6, (unsigned long long)puts,
	       put0 ? (double)(put0 - t0) / 1e6 : 0, put1 ? (double)(put1 - t0) / 1e6 : 0,
	       (unsigned long long)calls, (double)vals / (double)calls,
	       __builtin_popcount(writers), (double)(first - t0) / 1e6, (double)(last - t0) / 1e6,
	       (double)any / 1e6, (double)two / 1e6,
	       any ? (double)vals * (double)vbytes / (double)any : 0, (double)turn / 1e6,
	       (double)wait / 1e6, (double)wake / 1e6, (double)(t1 - last) / 1e6);
}

static void measure(struct size_row *row, int fi, const uint16_t *values, uint8_t *want,
		    uint8_t *got, uint64_t base, unsigned passes)
{
	size_t bb = row->block, n = row->n;
	struct fmt_row *fr = &row->f[fi];
	kvc_conn *c = kvt_connect(fmt_ns[fi]);
	char name[32];
	int pool;
	kvc_block *b = calloc(n, sizeof(*b));
	kvc_hash *h = calloc(n, sizeof(*h));
	struct g4c g0, g1;

	if (!b || !h)
		die("out of memory");
	snprintf(name, sizeof(name), "p%zu", bb);
	pool = kvt_pool(c, name, bb);
	for (size_t i = 0; i < n; i++)
		h[i] = kvt_hash(base + i);

	/* 1: into G1, sealed, demoted (written to G4: timed), dropped from
	 * G2; --passes times, the same hashes. */
	for (unsigned p = 0; p < passes; p++) {
		uint64_t t0, t_ev, t_dm = 0, t1, tr0;
		struct cpu ca, cb;

		if (kvc_alloc(c, pool, (uint32_t)n, b) != (int)n)
			die("alloc of %zu blocks: %s", n, kvc_last_error(c));
		for (size_t i = 0; i < n; i++)
			kvt_mem_write(c, kvc_block_ptr(c, b[i]), (const uint8_t *)values + i * bb,
				      bb);
		if (kvc_seal(c, pool, b, h, n, b) != (int)n)
			die("seal: %s", kvc_last_error(c));
		if (kvc_release(c, b, n))
			die("release: %s", kvc_last_error(c));
		g4_settled(fmt_ns[fi], &g0);
		perf_ctl(fi, p ? 1 : -1, "enable");
		cpu_snap(&ca, &daemon_, &cluster);
		tr0 = trace_now();
		t0 = rb_now_ns();
		evict_g1(c);
		t_ev = rb_now_ns();
		for (;;) {
			g4_read_on(c, &g1);
			if (!t_dm && g1.g2_demotions - g0.g2_demotions >= n)
				t_dm = rb_now_ns();
			if (g1.writes + g1.dropped + g1.write_errors >=
				    g0.writes + g0.dropped + g0.write_errors + n &&
			    !g1.inflight)
				break;
			if (rb_now_ns() - t0 > 120 * 1000000000ull)
				die("%s: %llu of %zu G4 writes after 2 minutes", fmt_ns[fi],
				    (unsigned long long)(g1.writes - g0.writes), n);
			usleep(500);
		}
		t1 = rb_now_ns();
		cpu_snap(&cb, &daemon_, &cluster);
		perf_ctl(fi, p ? 1 : -1, "disable");
		if (p || passes == 1)
			cpu_acc(&fr->wcpu, &ca, &cb, t1 - t0, g1.bytes_out - g0.bytes_out);
		if (g1.writes - g0.writes != n || g1.dropped != g0.dropped ||
		    g1.write_errors != g0.write_errors)
			die("%s: %llu G4 writes of %zu blocks, %llu dropped, %llu failed",
			    fmt_ns[fi], (unsigned long long)(g1.writes - g0.writes), n,
			    (unsigned long long)(g1.dropped - g0.dropped),
			    (unsigned long long)(g1.write_errors - g0.write_errors));
		fr->wvalue_bytes = (size_t)((g1.bytes_out - g0.bytes_out) / n);
		if (tr_ev && fi == 0) {
			char sz[24];

			rb_size_str(bb, sz, sizeof(sz));
			trace_pass(sz, p, tr0, trace_now(), t0, t1, fr->wvalue_bytes);
		}
		fr->wms[p] = (double)(t1 - t0) / 1e6;
		fr->evict_ms[p] = (double)(t_ev - t0) / 1e6;
		fr->demoted_ms[p] = (double)((t_dm ? t_dm : t1) - t0) / 1e6;
		fr->wgbs[p] = (double)(n * bb) / ((double)(t1 - t0) / 1e9) / GB;
		fr->wstored_gbs[p] = (double)(g1.bytes_out - g0.bytes_out) /
				     ((double)(t1 - t0) / 1e9) / GB;
		kvt_evict(c, KVCACHED__TIER__TIER_G1);   /* settles the tiers */
		kvt_evict(c, KVCACHED__TIER__TIER_G2);
	}

	/* What each block must read back as: raw bytes, or the reference's
	 * round trip of them. */
	if (fmt_q[fi] == KV_QFMT_RAW) {
		memcpy(want, values, n * bb);
	} else {
		size_t qn = kv_quant_bytes(bb / 2, KV_QUANT_GROUP);
		uint8_t *q = malloc(qn * n);
		uint64_t t0;

		if (!q)
			die("out of memory");
		for (size_t i = 0; i < n; i++)
			if (kv_qfmt_quant_ref(fmt_q[fi], KV_DTYPE_F16,
					      (const uint8_t *)values + i * bb, bb / 2,
					      KV_QUANT_GROUP, q + i * qn, qn))
				die("the reference quantizer failed");
		/* The dequantizer's rate on its own, here, one thread: what
		 * the promotion runs on the daemon's copy thread (the fast
		 * path, quant_fast.c); then the reference's bytes, which the
		 * blocks must match. */
		t0 = rb_now_ns();
		for (size_t i = 0; i < n; i++)
			if (kv_qfmt_dequant(fmt_q[fi], KV_DTYPE_F16, q + i * qn, qn, bb / 2,
					    KV_QUANT_GROUP, want + i * bb))
				die("the dequantizer failed");
		fr->dequant_gbs = (double)(n * bb) / ((double)(rb_now_ns() - t0) / 1e9) / GB;
		for (size_t i = 0; i < n; i++)
			if (kv_qfmt_dequant_ref(fmt_q[fi], KV_DTYPE_F16, q + i * qn, qn, bb / 2,
						KV_QUANT_GROUP, want + i * bb))
				die("the reference dequantizer failed");
		free(q);
	}

	/* 2: the timed lookups. */
	fr->passes = passes;
	for (unsigned p = 0; p < passes; p++) {
		uint64_t t0, t1;
		struct cpu ca, cb;
		int k;

		check_g4_only(pool);
		g4_settled(fmt_ns[fi], &g0);
		perf_ctl(fi, 0, "enable");
		cpu_snap(&ca, &daemon_, &cluster);
		t0 = rb_now_ns();
		k = kvc_lookup(c, pool, h, n, b);
		t1 = rb_now_ns();
		cpu_snap(&cb, &daemon_, &cluster);
		perf_ctl(fi, 0, "disable");
		g4_settled(fmt_ns[fi], &g1);
		cpu_acc(&fr->rcpu, &ca, &cb, t1 - t0, g1.bytes_in - g0.bytes_in);
		if (k != (int)n)
			die("%s, %zu-byte blocks: the lookup found %d of %zu blocks (%s)", fmt_ns[fi],
			    bb, k, n, k < 0 ? kvc_last_error(c) : "G4 misses");
		if (g1.hits - g0.hits != n || g1.sum_fail != g0.sum_fail)
			die("%s: %llu blocks came from G4, not %zu (%llu checksum failures)",
			    fmt_ns[fi], (unsigned long long)(g1.hits - g0.hits), n,
			    (unsigned long long)(g1.sum_fail - g0.sum_fail));
		fr->value_bytes = (size_t)((g1.bytes_in - g0.bytes_in) / n);
		fr->fetches += g1.fetches - g0.fetches;
		fr->direct += g1.direct - g0.direct;
		fr->hits += g1.hits - g0.hits;
		fr->lookup_ms[p] = (double)(t1 - t0) / 1e6;
		fr->gbs[p] = (double)(n * bb) / ((double)(t1 - t0) / 1e9) / GB;
		for (size_t i = 0; i < n; i++) {
			kvt_mem_read(c, got, kvc_block_ptr(c, b[i]), bb);
			if (memcmp(got, want + i * bb, bb))
				die("%s: block %zu of %zu bytes came back wrong", fmt_ns[fi], i, bb);
		}
		if (kvc_release(c, b, n))
			die("release: %s", kvc_last_error(c));
		kvt_evict(c, KVCACHED__TIER__TIER_G1);
		kvt_evict(c, KVCACHED__TIER__TIER_G2);
		g4_settled(fmt_ns[fi], &g1);
	}
	if (kvt_check())
		die("the daemon's invariant checker found problems");
	kvc_close(c);
	free(b);
	free(h);
}

/* ---- redis-benchmark at the sizes the tier stored ---- */

/* SETs per_tag values of size bytes under each of redis-benchmark's tags. */
static void rb_fill(struct kv_rc *rc, const char *tags, size_t per_tag, size_t size)
{
	enum { B = 64 };
	char name[B][32];
	struct kv_rc_key key[B];
	struct kv_rc_val val[B];
	int st[B];
	uint8_t *v = malloc(size);

	if (!v)
		die("out of memory");
	memset(v, 0x5a, size);
	for (size_t i = 0; i < per_tag * RB_MASTERS; i += B) {
		size_t m = per_tag * RB_MASTERS - i < B ? per_tag * RB_MASTERS - i : B;

		for (size_t j = 0; j < m; j++) {
			key[j].len = (size_t)rb_key_name(name[j], sizeof(name[j]), tags, i + j,
							  per_tag);
			key[j].data = name[j];
			val[j].data = v;
			val[j].len = size;
		}
		if (kv_rc_set(rc, m, key, val, 0, st) != (int)m)
			die("kv_rc_set: %s", kv_rc_last_error(rc));
	}
	free(v);
}

static void usage(void)
{
	fputs("usage: kvg4rate [--mib M] [--passes P] [--rb C:P[:THREADS]] [SIZE...]\n", stderr);
	exit(2);
}

/* redis-benchmark's figures at one value size. */
struct rb_size {
	size_t size;
	struct rb_result r, set;
	struct cpu rcpu, wcpu;
};

/* The rows of one raw-pool CPU table (row_fn() prints one): each size's
 * lookup and write, each followed by redis-benchmark's GET or SET at its
 * value size. */
static void cpu_rows(void (*row_fn)(const char *, size_t, const struct cpu *),
		     const struct size_row *row, size_t nsizes, const struct rb_size *rbv,
		     size_t nrbv)
{
	for (size_t s = 0; s < nsizes; s++) {
		const struct fmt_row *fr = &row[s].f[0];

		row_fn("G4 -> G1 (lookup)", fr->value_bytes, &fr->rcpu);
		for (size_t k = 0; k < nrbv; k++)
			if (rbv[k].size == fr->value_bytes)
				row_fn("redis-benchmark GET", rbv[k].size, &rbv[k].rcpu);
		row_fn("demotion -> G4 (write)", fr->wvalue_bytes, &fr->wcpu);
		for (size_t k = 0; k < nrbv; k++)
			if (rbv[k].size == fr->wvalue_bytes)
				row_fn("redis-benchmark SET", rbv[k].size, &rbv[k].wcpu);
	}
}

int main(int argc, char **argv)
{
	static char bin_buf[4096], conf_arg[200];
	size_t sizes[MAX_SIZES], nsizes = 0, mib = 128, max_bytes = 0, max_block = 0;
	struct size_row row[MAX_SIZES];
	struct rb_conf rbc = { RB_MASTERS, 22, 1 };
	unsigned passes = 5;
	char tag_rows[RB_MASTERS][8], tags[RB_MASTERS * 8], port[16], err[256], label[64];
	char pool_arg[40], tier_arg[40];
	struct rb_size rbv[MAX_SIZES * NFMT];
	size_t nrbv = 0;
	uint16_t *values;
	uint8_t *want, *got;
	uint64_t t_start = rb_now_ns();

	rb_prog = "kvg4rate";
	for (int a = 1; a < argc; a++) {
		const char *v = a + 1 < argc ? argv[a + 1] : NULL;

		if (!strcmp(argv[a], "--mib") && v) {
			mib = strtoull(v, NULL, 10), a++;
		} else if (!strcmp(argv[a], "--passes") && v) {
			passes = (unsigned)strtoul(v, NULL, 10), a++;
		} else if (!strcmp(argv[a], "--rb") && v) {
			rbc.threads = 0;
			if (sscanf(v, "%d:%d:%d", &rbc.clients, &rbc.pipeline, &rbc.threads) < 2 ||
			    rbc.clients < 1 || rbc.pipeline < 1 || rbc.threads < 0)
				usage();
			a++;
		} else if (argv[a][0] == '-' || nsizes == MAX_SIZES) {
			usage();
		} else {
			sizes[nsizes++] = rb_parse_size(argv[a], 4096, 64u << 20, 4096);
		}
	}
	if (!mib || mib > 4096 || !passes || passes > 64)
		usage();
	if (!nsizes) {
		sizes[0] = 256 << 10;
		sizes[1] = 2 << 20;
		nsizes = 2;
	}
	for (size_t s = 0; s < nsizes; s++) {
		size_t n = ((size_t)mib << 20) / sizes[s];

		row[s].block = sizes[s];
		row[s].n = n ? n : 1;
		memset(row[s].f, 0, sizeof(row[s].f));
		max_bytes = row[s].n * sizes[s] > max_bytes ? row[s].n * sizes[s] : max_bytes;
		max_block = sizes[s] > max_block ? sizes[s] : max_block;
	}

	if (!kvt_rc_find_bin("KVT_REDIS_SERVER", "redis-server", bin_buf, sizeof(bin_buf)) ||
	    !kvt_rc_find_bin("KVT_REDIS_CLI", "redis-cli", bin_buf, sizeof(bin_buf))) {
		printf("kvg4rate: skipped: redis-server or redis-cli not found "
		       "(Debian: redis-server, redis-tools)\n");
		return 0;
	}
	rb_bin = kvt_rc_find_bin("KVRCBENCH_REDIS_BENCHMARK", "redis-benchmark", bin_buf,
				 sizeof(bin_buf));
	if (!rb_bin)
		printf("kvg4rate: redis-benchmark not found: the tier alone\n");
	if (!getenv("KVCACHED_BIN")) {
		if (!*KVG4RATE_DAEMON || access(KVG4RATE_DAEMON, X_OK))
			die("no daemon: set KVCACHED_BIN");
		setenv("KVCACHED_BIN", KVG4RATE_DAEMON, 1);
	}
	if (kvt_cuda())
		die("the host backend only (KVT_BACKEND=cuda is set)");

	values = malloc(max_bytes);
	want = malloc(max_bytes);
	got = malloc(max_block);
	if (!values || !want || !got)
		die("out of memory");
	fill_values(values, max_bytes / 2);

	snprintf(tmp, sizeof(tmp), "/tmp/kvg4rate.XXXXXX");
	if (!mkdtemp(tmp))
		die("mkdtemp failed");
	kvt_rc_start(&cluster, RB_MASTERS, 0, &(struct kvt_rc_opts){ .node_timeout_ms = 15000 });
	snprintf(port, sizeof(port), "%d", cluster.node[rb_a_master(&cluster)].port);
	write_conf(conf_arg, sizeof(conf_arg), 2 * max_bytes + (64u << 20));
	/* G1 and G2 hold a chain twice over (G2 keeps the fetched copies while
	 * the promotion copies them); no G3. */
	snprintf(pool_arg, sizeof(pool_arg), "%zuMiB", 2 * (max_bytes >> 20) + 64);
	snprintf(tier_arg, sizeof(tier_arg), "%zuMiB", 2 * (max_bytes >> 20) + 64);
	if (getenv("KVG4_TRACE")) {
		char path[200];

		/* "1": in the run's directory, removed at the end; else kept there. */
		if (strcmp(getenv("KVG4_TRACE"), "1"))
			snprintf(path, sizeof(path), "%s", getenv("KVG4_TRACE"));
		else
			snprintf(path, sizeof(path), "%s/g4trace", tmp);
		trace_map(path);
		setenv("KVCACHED_G4_TRACE", path, 1);
	}
	kvt_start(&daemon_, conf_arg, "--pool-size", pool_arg, "--host-tier-size", tier_arg,
		  NULL);
	printf("kvg4rate: %d masters, loopback; one kvcached (host backend, G2 %s, no G3); "
	       "chains of about %zu MiB, %u timed lookups each\n", RB_MASTERS, tier_arg, mib,
	       passes);
	fflush(stdout);

	for (size_t s = 0; s < nsizes; s++) {
		char sz[24];

		rb_size_str(sizes[s], sz, sizeof(sz));
		for (int fi = 0; fi < NFMT; fi++) {
			struct fmt_row *fr = &row[s].f[fi];
			double sorted[64];

			measure(&row[s], fi, values, want, got, ((uint64_t)s * NFMT + (uint64_t)fi) << 32,
				passes);
			memcpy(sorted, fr->gbs, passes * sizeof(double));
			qsort(sorted, passes, sizeof(double), cmp_double);
			printf("%s blocks, compress %s: %zu blocks in G4 only, values of %zu bytes; "
			       "G4 -> G1 %.2f GB/s median (%.2f-%.2f), a lookup %.1f ms first, "
			       "%.1f fetches", sz, fmt_conf[fi], row[s].n, fr->value_bytes,
			       sorted[(passes - 1) / 2], sorted[0], sorted[passes - 1],
			       fr->lookup_ms[0], (double)fr->fetches / passes);
			if (fr->dequant_gbs > 0)
				printf("; the dequantizer alone %.2f GB/s", fr->dequant_gbs);
			printf("; %llu of %llu values read straight into G2 slots\n",
			       (unsigned long long)fr->direct, (unsigned long long)fr->hits);
			{
				double lo, hi, med = median(fr->wstored_gbs, passes, &lo, &hi);

				printf("%s blocks, compress %s: demotion -> G4, values of %zu bytes: "
				       "%.2f GB/s stored median (%.2f-%.2f), %.2f GB/s of KV; "
				       "%.1f ms median (the Evict reply %.2f ms, all in G2 %.1f ms)\n",
				       sz, fmt_conf[fi], fr->wvalue_bytes, med, lo, hi,
				       median(fr->wgbs, passes, NULL, NULL),
				       median(fr->wms, passes, NULL, NULL),
				       median(fr->evict_ms, passes, NULL, NULL),
				       median(fr->demoted_ms, passes, NULL, NULL));
			}
			fflush(stdout);
		}
	}
	kvt_stop(&daemon_);

	if (rb_bin && rb_learn_tags(&cluster, port, tag_rows) < 0) {
		printf("kvg4rate: redis-benchmark's keys not found: the tier alone\n");
		rb_bin = NULL;
	}
	if (rb_bin) {
		struct kv_rc *rc;

		for (int t = 0; t < RB_MASTERS; t++)
			memcpy(tags + t * 8, tag_rows[t], 8);
		if (kv_rc_new(kvt_rc_seeds(&cluster), NULL, NULL, 10000, &rc, err, sizeof(err)) < 0)
			die("kv_rc_new: %s", err);
		rb_label(&rbc, label, sizeof(label));
		for (size_t s = 0; s < nsizes; s++) {
			for (int fi = 0; fi < NFMT; fi++) {
				size_t vs = row[s].f[fi].value_bytes, per_tag, reqs, reqs_sent;
				struct cpu ca, cb;
				int seen = 0;

				for (size_t k = 0; k < nrbv; k++)
					seen |= rbv[k].size == vs;
				if (seen)
					continue;
				/* The chain's volume as keys; as many GETs as the
				 * timed lookups made, and at least 512 MiB. */
				per_tag = (row[s].n + RB_MASTERS - 1) / RB_MASTERS;
				reqs = row[s].n * passes;
				if (reqs * vs < (512u << 20))
					reqs = ((size_t)512 << 20) / vs;
				rb_flush_all(&cluster);
				rb_fill(rc, tags, per_tag, vs);
				rbv[nrbv].size = vs;
				memset(&rbv[nrbv].rcpu, 0, sizeof(rbv[nrbv].rcpu));
				memset(&rbv[nrbv].wcpu, 0, sizeof(rbv[nrbv].wcpu));
				rb_perf_ctl("get", "enable");
				cpu_snap(&ca, NULL, &cluster);
				rb_run(&cluster, port, &rbc, "get", vs, reqs, per_tag, &rbv[nrbv].r);
				cpu_snap(&cb, NULL, &cluster);
				rb_perf_ctl("get", "disable");
				reqs_sent = (reqs + (size_t)rbc.pipeline - 1) / (size_t)rbc.pipeline *
					    (size_t)rbc.pipeline;
				cpu_acc(&rbv[nrbv].rcpu, &ca, &cb,
					(uint64_t)(rbv[nrbv].r.wall_s * 1e9), reqs_sent * vs);
				printf("redis-benchmark %s -d %zu: %.0f GET/s, %.2f GB/s, p50 %.3f ms; "
				       "keyspace hits %llu, misses %llu\n", label, vs, rbv[nrbv].r.rps,
				       rbv[nrbv].r.gbs, rbv[nrbv].r.p50_ms, rbv[nrbv].r.hits,
				       rbv[nrbv].r.misses);
				fflush(stdout);
				/* The write path's peer: as many SETs as the write
				 * passes made (the first pass creates the keys, as the
				 * tier's first pass did), at least 512 MiB. */
				rb_flush_all(&cluster);
				rb_perf_ctl("set", "enable");
				cpu_snap(&ca, NULL, &cluster);
				rb_run(&cluster, port, &rbc, "set", vs, reqs, per_tag,
				       &rbv[nrbv].set);
				cpu_snap(&cb, NULL, &cluster);
				rb_perf_ctl("set", "disable");
				cpu_acc(&rbv[nrbv].wcpu, &ca, &cb,
					(uint64_t)(rbv[nrbv].set.wall_s * 1e9), reqs_sent * vs);
				printf("redis-benchmark %s -t set -d %zu: %.0f SET/s, %.2f GB/s, "
				       "p50 %.3f ms\n", label, vs, rbv[nrbv].set.rps, rbv[nrbv].set.gbs,
				       rbv[nrbv].set.p50_ms);
				fflush(stdout);
				nrbv++;
			}
		}
		rb_flush_all(&cluster);
		kv_rc_free(rc);
	}

	/* The table, as docs/benchmarks.md shows it. */
	printf("\n| block | compress | G4 value bytes | G4 -> G1 GB/s of KV, median (range) | "
	       "G4 bytes GB/s | / raw pool | dequantizer alone GB/s |");
	if (rb_bin)
		printf(" redis-benchmark `%s` GET GB/s at the value size | KV rate / it |", label);
	printf("\n|---|---|---|---|---|---|---|%s\n", rb_bin ? "---|---|" : "");
	for (size_t s = 0; s < nsizes; s++) {
		double raw_med = 0;
		char sz[24];

		rb_size_str(sizes[s], sz, sizeof(sz));
		for (int fi = 0; fi < NFMT; fi++) {
			const struct fmt_row *fr = &row[s].f[fi];
			double sorted[64], med;

			memcpy(sorted, fr->gbs, passes * sizeof(double));
			qsort(sorted, passes, sizeof(double), cmp_double);
			med = sorted[(passes - 1) / 2];
			if (!fi)
				raw_med = med;
			printf("| %s | %s | %zu | %.2f (%.2f-%.2f) | %.2f | %.2fx |", sz, fmt_conf[fi],
			       fr->value_bytes, med, sorted[0], sorted[passes - 1],
			       med * (double)fr->value_bytes / (double)sizes[s], med / raw_med);
			if (fr->dequant_gbs > 0)
				printf(" %.2f |", fr->dequant_gbs);
			else
				printf(" - |");
			for (size_t k = 0; rb_bin && k < nrbv; k++) {
				if (rbv[k].size != fr->value_bytes)
					continue;
				if (rbv[k].r.ok)
					printf(" %.2f%s | %.2fx |", rbv[k].r.gbs,
					       rbv[k].r.misses ? " (misses!)" : "", med / rbv[k].r.gbs);
				else
					printf(" - | - |");
			}
			printf("\n");
		}
	}
	/* The writes at demotion. */
	printf("\n| block | compress | G4 value bytes | demotion -> G4 written, GB/s stored, median "
	       "(range) | GB/s of KV | ms, median | all in G2 by, ms |");
	if (rb_bin)
		printf(" redis-benchmark `%s` SET GB/s at the value size | stored / it | KV / it |",
		       label);
	printf("\n|---|---|---|---|---|---|---|%s\n", rb_bin ? "---|---|---|" : "");
	for (size_t s = 0; s < nsizes; s++) {
		char sz[24];

		rb_size_str(sizes[s], sz, sizeof(sz));
		for (int fi = 0; fi < NFMT; fi++) {
			const struct fmt_row *fr = &row[s].f[fi];
			double lo, hi, med = median(fr->wstored_gbs, passes, &lo, &hi),
				       kv = median(fr->wgbs, passes, NULL, NULL);

			printf("| %s | %s | %zu | %.2f (%.2f-%.2f) | %.2f | %.1f | %.1f |", sz,
			       fmt_conf[fi], fr->wvalue_bytes, med, lo, hi, kv,
			       median(fr->wms, passes, NULL, NULL),
			       median(fr->demoted_ms, passes, NULL, NULL));
			for (size_t k = 0; rb_bin && k < nrbv; k++) {
				if (rbv[k].size != fr->wvalue_bytes)
					continue;
				if (rbv[k].set.ok)
					printf(" %.2f | %.2fx | %.2fx |", rbv[k].set.gbs,
					       med / rbv[k].set.gbs, kv / rbv[k].set.gbs);
				else
					printf(" - | - | - |");
			}
			printf("\n");
		}
	}
	/* Where the CPU went, per GB of G4 values moved: raw pool only. */
	printf("\n| path | value bytes |");
	for (int i = 0; i < CPU_N; i++)
		printf(" %s ms/GB |", cpu_name[i]);
	printf(" all ms/GB | CPUs busy | GB/s | 2 CPUs / cost, GB/s |\n|---|---|");
	for (int i = 0; i < CPU_N + 4; i++)
		printf("---|");
	printf("\n");
	cpu_rows(cpu_row, row, nsizes, rbv, nrbv);
	printf("\n| path | value bytes |");
	for (int i = 0; i < CPU_N; i++)
		printf(" %s sleeps / read+write calls, per 1000 values |", cpu_name[i]);
	printf("\n|---|---|");
	for (int i = 0; i < CPU_N; i++)
		printf("---|");
	printf("\n");
	cpu_rows(cpu_sw_row, row, nsizes, rbv, nrbv);
	{
		FILE *f = fopen("/proc/loadavg", "r");
		char la[64] = "?";

		if (f) {
			if (!fgets(la, sizeof(la), f))
				la[0] = 0;
			la[strcspn(la, "\n")] = 0;
			fclose(f);
		}
		printf("\nkvg4rate: %.0f s in all; load average now %s\n",
		       (double)(rb_now_ns() - t_start) / 1e9, la);
	}
	kvt_rc_stop(&cluster);
	{
		char path[200];

		snprintf(path, sizeof(path), "%s/kvcached.conf", tmp);
		unlink(path);
		snprintf(path, sizeof(path), "%s/g4trace", tmp);
		unlink(path);
		rmdir(tmp);
	}
	free(values);
	free(want);
	free(got);
	return 0;
}
