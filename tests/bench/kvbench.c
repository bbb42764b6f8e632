/* kvbench: latency and throughput figures of a running kvcached.
 *
 * Figures, never assertions: kvbench prints what it measured next to the
 * targets and exits 0 whatever the figures are (1 only when it could not
 * measure, e.g. no daemon). See docs/benchmarks.md for what each figure
 * means; scripts/bench starts the daemons and runs every section.
 *
 * Sections (--only picks some; default abcde, or f alone with --fill; g and
 * h only when asked for):
 *   a  the floor: a raw ping-pong over an AF_UNIX socketpair between two
 *      processes, with the request and response frame sizes of each op
 *      measured below (real protobuf frames, built with the generated code)
 *   b  alloc, seal and release of 1 block, three round trips, each timed
 *   c  the same with 16 and 256 blocks per request
 *   d  lookup of a 1,000-block chain sealed and cached beforehand
 *   e  1, 4 and 16 client processes, each its own connection, looping
 *      alloc+seal+release of 1 block for a fixed time
 *   f  --fill N: fill the pool with N cached 4 KiB blocks first, so that
 *      every alloc must evict; then alloc+seal+release of 1 block
 *   g  tier throughput (a daemon with --host-tier-size and --disk-path):
 *      per block size (256 KiB, 2 MiB, 8 MiB) a volume of written blocks
 *      moved G1 -> G2 (evict), G2 -> G3 (flush), G3 -> G1 (lookup), G1 ->
 *      G2 -> G1, in GB/s beside a memcpy floor and an fio floor on the file
 *      system of the daemon's disk (--disk-dir)
 *   h  the GPU data paths, in this process without a daemon (kvbench_gpu.c):
 *      first-touch import+map, G1<->G2 copies beside a cuMemcpyAsync floor,
 *      the gather kernel against per-block copies
 *
 * Hashes are synthetic (a per-process random stream): distinct for every
 * seal, so the daemon never dedups. In a-f blocks are 4 KiB and never
 * written; in g every block is written with a pattern and checked after
 * each promotion. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvbench_gpu.h"
#include "kvc_internal.h"  /* kvc_call() for the pool's counters; kvcached.pb-c.h */

#define FRAME_HDR 8u                  /* see proto/frame.h */
#define BLOCK_BYTES 4096u
#define POOL_NAME "kvbench-4k"
#define LAYOUT "kvbench: 4 KiB opaque blocks"
#define CHAIN_LEN 1000u
#define FILL_BATCH 4096u
#define MAX_CLIENTS 16
#define CLIENT_SAMPLES (1u << 20)     /* latencies kept per client process */

/* --- options and output --------------------------------------------------- */

static const char *sock_path;
static bool quick, json;
static char only[8] = "";
static uint64_t fill_n;
static int server_cpu = -1;       /* --server-cpu: where the floor's echo runs */
static const char *disk_dir;      /* --disk-dir: the file system of the daemon's G3 */
static uint64_t tier_volume;      /* --volume: bytes per block size in g; 0 = default */
static unsigned disk_depth = 64;  /* --disk-queue-depth: fio's iodepth */

/* Seconds each kind of measurement runs for (default, then --quick). */
struct durations {
	double floor, single, batch, lookup, clients, fill;
};
static const struct durations dur_default = { 0.5, 5.0, 4.0, 4.0, 4.0, 5.0 };
static const struct durations dur_quick = { 0.1, 1.0, 0.7, 0.7, 0.8, 1.5 };
static struct durations D;

struct row {
	char section;
	char name[48];
	uint32_t req, resp;          /* frame bytes with header; 0 = n/a */
	double p50, p99;             /* microseconds */
	double ops;                  /* per second */
	const char *ops_unit;        /* "ops/s", "blocks/s", ... */
	double floor_p50;            /* 0 = no comparison */
	double target;               /* ratio target, 0 = none */
	uint64_t n;                  /* samples */
	double evicted;              /* % of the allocs that evicted; NAN = n/a */
};

static struct row rows[64];
static size_t nrows;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	fputs("kvbench: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A line for humans (stdout), or on stderr under --json. */
static void note(const char *fmt, ...)
{
	FILE *f = json ? stderr : stdout;
	va_list ap;

	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	fputc('\n', f);
	fflush(f);
}

static void check(kvc_conn *c, int r, const char *what)
{
	if (r < 0)
		die("%s: %s%s%s", what, kvc_strerror(r), c && *kvc_last_error(c) ? ": " : "",
		    c ? kvc_last_error(c) : "");
}

static bool want(char s)
{
	return strchr(only, s) != NULL;
}

static void print_header(void)
{
	if (json)
		return;
	printf("%-34s %11s %9s %9s %16s %10s %7s %9s\n", "", "req/resp B", "p50 us", "p99 us",
	       "rate", "floor p50", "ratio", "target");
}

static void print_section(const char *title)
{
	if (!json)
		printf("%s\n", title);
	fflush(stdout);
}

static struct row *add_row(char section, const char *name)
{
	struct row *r;

	if (nrows == sizeof(rows) / sizeof(rows[0]))
		die("too many result rows");
	r = &rows[nrows++];
	memset(r, 0, sizeof(*r));
	r->section = section;
	snprintf(r->name, sizeof(r->name), "%s", name);
	r->ops_unit = "ops/s";
	r->evicted = NAN;
	return r;
}

static void print_row(const struct row *r)
{
	char fr[24] = "", rate[32], fl[16] = "", ra[16] = "", tg[16] = "", line[192];
	int n;

	if (json)
		return;
	if (r->req || r->resp)
		snprintf(fr, sizeof(fr), "%u/%u", r->req, r->resp);
	if (r->ops >= 1e6)
		snprintf(rate, sizeof(rate), "%.2fM %s", r->ops / 1e6, r->ops_unit);
	else if (r->ops >= 1e4)
		snprintf(rate, sizeof(rate), "%.1fk %s", r->ops / 1e3, r->ops_unit);
	else
		snprintf(rate, sizeof(rate), "%.0f %s", r->ops, r->ops_unit);
	if (r->floor_p50 > 0) {
		snprintf(fl, sizeof(fl), "%.1f", r->floor_p50);
		snprintf(ra, sizeof(ra), "%.2fx", r->p50 / r->floor_p50);
	}
	if (r->target > 0)
		snprintf(tg, sizeof(tg), "%s%.1fx", r->p50 / r->floor_p50 <= r->target ? "ok " : "MISS ",
			 r->target);
	n = snprintf(line, sizeof(line), "  %-32s %11s %9.1f %9.1f %16s %10s %7s %9s", r->name, fr,
		     r->p50, r->p99, rate, fl, ra, tg);
	while (n > 0 && line[n - 1] == ' ')
		line[--n] = '\0';
	puts(line);
	fflush(stdout);
}

/* --- time and samples ----------------------------------------------------- */

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

struct samples {
	uint64_t *v;
	size_t n, cap;
};

static void sample_add(struct samples *s, uint64_t ns)
{
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 65536;
		uint64_t *v = realloc(s->v, cap * sizeof(*v));

		if (!v)
			die("out of memory");
		s->v = v;
		s->cap = cap;
	}
	s->v[s->n++] = ns;
}

static void sample_free(struct samples *s)
{
	free(s->v);
	memset(s, 0, sizeof(*s));
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Nearest-rank percentile in microseconds; sorts s. */
static double pct(struct samples *s, double p)
{
	size_t k;

	if (!s->n)
		return NAN;
	qsort(s->v, s->n, sizeof(*s->v), cmp_u64);
	k = (size_t)ceil(p / 100.0 * (double)s->n);
	return (double)s->v[k ? k - 1 : 0] / 1e3;
}

static double sum_s(const struct samples *s)
{
	double t = 0;
	size_t i;

	for (i = 0; i < s->n; i++)
		t += (double)s->v[i];
	return t / 1e9;
}

/* Fills a row from samples: p50, p99, and a serial rate = samples / their
 * total time, times `per` (blocks per sample for block rates). */
static void row_from(struct row *r, struct samples *s, double per)
{
	double t = sum_s(s);

	r->n = s->n;
	r->p50 = pct(s, 50);
	r->p99 = pct(s, 99);
	r->ops = t > 0 ? (double)s->n * per / t : 0;
}

/* --- synthetic hashes ----------------------------------------------------- */

static uint64_t rng_state;

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void rng_seed(void)
{
	uint64_t s = 0;

	if (getrandom(&s, sizeof(s), 0) != (ssize_t)sizeof(s))
		s = now_ns();
	rng_state = s ^ ((uint64_t)getpid() << 32);
}

/* n fresh random hashes: distinct (2^-256 odds aside) across processes and
 * runs, so no seal dedups. */
static void fresh_hashes(kvc_hash *h, size_t n)
{
	size_t i, j;

	for (i = 0; i < n; i++)
		for (j = 0; j < 4; j++) {
			uint64_t w = splitmix64(&rng_state);

			memcpy(h[i].b + 8 * j, &w, 8);
		}
}

/* --- frame sizes ---------------------------------------------------------- */

/* A representative request id: ids grow by one per request; a few hundred
 * thousand in, the varint takes 3 bytes. */
#define REP_ID 300000u

struct frames {
	uint32_t req, resp;
};

static uint32_t req_bytes(Kvcached__Request *q)
{
	q->id = REP_ID;
	return FRAME_HDR + (uint32_t)kvcached__request__get_packed_size(q);
}

static uint32_t resp_bytes(size_t nblocks, kvc_block handle, bool with_list)
{
	Kvcached__Response rs = KVCACHED__RESPONSE__INIT;
	Kvcached__BlockList bl = KVCACHED__BLOCK_LIST__INIT;
	uint64_t *v = calloc(nblocks ? nblocks : 1, sizeof(*v));
	size_t i, len;

	if (!v)
		die("out of memory");
	for (i = 0; i < nblocks; i++)
		v[i] = handle;
	rs.id = REP_ID;
	if (with_list) {
		bl.n_blocks = nblocks;
		bl.blocks = v;
		rs.result_case = KVCACHED__RESPONSE__RESULT_BLOCKS;
		rs.blocks = &bl;
	}
	len = kvcached__response__get_packed_size(&rs);
	free(v);
	return FRAME_HDR + (uint32_t)len;
}

enum op { OP_ALLOC, OP_SEAL, OP_RELEASE, OP_LOOKUP };

/* The frames of op on n blocks of pool, with a real handle's value. */
static struct frames frames_of(enum op op, int pool, size_t n, kvc_block handle)
{
	Kvcached__Request q = KVCACHED__REQUEST__INIT;
	Kvcached__Alloc a = KVCACHED__ALLOC__INIT;
	Kvcached__Seal s = KVCACHED__SEAL__INIT;
	Kvcached__Release r = KVCACHED__RELEASE__INIT;
	Kvcached__Lookup l = KVCACHED__LOOKUP__INIT;
	uint64_t *v = calloc(n, sizeof(*v));
	uint8_t *h = calloc(n, 32);
	struct frames f = { 0, 0 };
	size_t i;

	if (!v || !h)
		die("out of memory");
	for (i = 0; i < n; i++)
		v[i] = handle;
	switch (op) {
	case OP_ALLOC:
		a.pool_id = (uint32_t)pool;
		a.count = (uint32_t)n;
		q.op_case = KVCACHED__REQUEST__OP_ALLOC;
		q.alloc = &a;
		f.resp = resp_bytes(n, handle, true);
		break;
	case OP_SEAL:
		s.pool_id = (uint32_t)pool;
		s.n_blocks = n;
		s.blocks = v;
		s.hashes.len = 32 * n;
		s.hashes.data = h;
		q.op_case = KVCACHED__REQUEST__OP_SEAL;
		q.seal = &s;
		f.resp = resp_bytes(n, handle, true);
		break;
	case OP_RELEASE:
		r.n_blocks = n;
		r.blocks = v;
		q.op_case = KVCACHED__REQUEST__OP_RELEASE;
		q.release = &r;
		f.resp = resp_bytes(0, handle, false);
		break;
	case OP_LOOKUP:
		l.pool_id = (uint32_t)pool;
		l.hashes.len = 32 * n;
		l.hashes.data = h;
		q.op_case = KVCACHED__REQUEST__OP_LOOKUP;
		q.lookup = &l;
		f.resp = resp_bytes(n, handle, true);
		break;
	}
	f.req = req_bytes(&q);
	free(v);
	free(h);
	return f;
}

/* --- (a) the floor: socketpair ping-pong ---------------------------------- */

static int read_full(int fd, uint8_t *p, size_t n)
{
	while (n) {
		ssize_t r = read(fd, p, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

static int write_full(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t r = write(fd, p, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

/* Times nst request/response exchanges per sample over a socketpair with a
 * forked echo process that answers each request frame with a response of
 * the given size. Runs for secs after a warm-up. */
static void floor_run(const struct frames *st, int nst, double secs, struct samples *out)
{
	size_t big = 0;
	uint8_t *buf;
	int sv[2], i, status;
	uint64_t end, warm_end;
	pid_t pid;

	for (i = 0; i < nst; i++) {
		big = st[i].req > big ? st[i].req : big;
		big = st[i].resp > big ? st[i].resp : big;
	}
	buf = calloc(1, big);
	if (!buf)
		die("out of memory");
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		die("socketpair: %s", strerror(errno));
	fflush(NULL);
	pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		close(sv[0]);
		if (server_cpu >= 0) {
			cpu_set_t set;

			CPU_ZERO(&set);
			CPU_SET(server_cpu, &set);
			if (sched_setaffinity(0, sizeof(set), &set) < 0) {
				fprintf(stderr, "kvbench: --server-cpu %d: %s\n", server_cpu,
					strerror(errno));
				_exit(1);
			}
		}
		for (;;)
			for (i = 0; i < nst; i++)
				if (read_full(sv[1], buf, st[i].req) < 0 ||
				    write_full(sv[1], buf, st[i].resp) < 0)
					_exit(0);
	}
	close(sv[1]);
	warm_end = now_ns() + (uint64_t)(secs * 0.2e9);
	end = 0;
	for (;;) {
		uint64_t t0 = now_ns(), t1;

		for (i = 0; i < nst; i++)
			if (write_full(sv[0], buf, st[i].req) < 0 ||
			    read_full(sv[0], buf, st[i].resp) < 0)
				die("floor ping-pong: the echo process went away");
		t1 = now_ns();
		if (!end) {
			if (t1 < warm_end)
				continue;
			end = t1 + (uint64_t)(secs * 1e9);
			continue;
		}
		sample_add(out, t1 - t0);
		if (t1 >= end)
			break;
	}
	close(sv[0]);
	waitpid(pid, &status, 0);
	free(buf);
}

/* Floor p50s by frame pair, so later sections find theirs. */
struct floor_entry {
	struct frames f[3];
	int nf;
	double p50;
};
static struct floor_entry floors[32];
static size_t nfloors;

static double floor_measure(char section, const char *name, const struct frames *f, int nf)
{
	struct samples s = { 0 };
	struct floor_entry *e;
	struct row *r;
	size_t i;

	for (i = 0; i < nfloors; i++)
		if (floors[i].nf == nf && !memcmp(floors[i].f, f, (size_t)nf * sizeof(*f)))
			return floors[i].p50;
	floor_run(f, nf, D.floor, &s);
	r = add_row(section, name);
	for (i = 0; i < (size_t)nf; i++) {
		r->req += f[i].req;
		r->resp += f[i].resp;
	}
	row_from(r, &s, 1);
	print_row(r);
	sample_free(&s);
	if (nfloors < sizeof(floors) / sizeof(floors[0])) {
		e = &floors[nfloors++];
		memcpy(e->f, f, (size_t)nf * sizeof(*f));
		e->nf = nf;
		e->p50 = r->p50;
	}
	return r->p50;
}

static const char *const opname[] = { "alloc", "seal", "release", "lookup" };

/* Frame sizes need a pool id and a handle value (fixed64: the size does not
 * depend on it): set once by rep_init(). */
static int rep_pool;
static kvc_block rep_handle;

static struct frames fr(enum op op, uint32_t n)
{
	return frames_of(op, rep_pool, n, rep_handle);
}

/* The floor of one op's frames, measured the first time. */
static double floor_op(enum op op, uint32_t n)
{
	struct frames f = fr(op, n);
	char name[48];

	snprintf(name, sizeof(name), "%s %u frames", opname[op], n);
	return floor_measure('a', name, &f, 1);
}

/* The floor of an alloc+seal+release cycle: three exchanges in a row. */
static double floor_cycle(uint32_t n)
{
	struct frames f[3] = { fr(OP_ALLOC, n), fr(OP_SEAL, n), fr(OP_RELEASE, n) };
	char name[48];

	snprintf(name, sizeof(name), "alloc+seal+release %u frames", n);
	return floor_measure('a', name, f, 3);
}

/* --- the daemon ----------------------------------------------------------- */

struct bench_conn {
	kvc_conn *c;
	int pool;
	kvc_hash *h;
	kvc_block *b, *o;
	size_t cap;
};

/* Connects; registers the 4 KiB pool unless with_pool is false (section g
 * alone registers its own pools). */
static void bc_open(struct bench_conn *bc, size_t cap, const char *name, bool with_pool)
{
	struct kvc_options opt = { .client_name = name };
	struct kvc_pool_desc d = {
		.name = POOL_NAME,
		.block_bytes = BLOCK_BYTES,
		.block_tokens = 16,
		.dtype = "opaque",
		.layout = LAYOUT,
		.layout_len = sizeof(LAYOUT) - 1,
	};
	int r;

	memset(bc, 0, sizeof(*bc));
	r = kvc_connect(sock_path, &opt, &bc->c);
	if (r < 0)
		die("cannot connect to kvcached at %s: %s", sock_path, kvc_strerror(r));
	bc->pool = -1;
	if (with_pool) {
		r = kvc_register_pool(bc->c, &d);
		check(bc->c, r, "registering the pool");
		bc->pool = r;
	}
	bc->cap = cap;
	bc->h = calloc(cap, sizeof(*bc->h));
	bc->b = calloc(cap, sizeof(*bc->b));
	bc->o = calloc(cap, sizeof(*bc->o));
	if (!bc->h || !bc->b || !bc->o)
		die("out of memory");
}

static void bc_close(struct bench_conn *bc)
{
	kvc_close(bc->c);
	free(bc->h);
	free(bc->b);
	free(bc->o);
	memset(bc, 0, sizeof(*bc));
}

/* One alloc+seal+release of n blocks with fresh hashes; t[0..3] get the
 * times before alloc, seal, release and after. */
static void cycle(struct bench_conn *bc, uint32_t n, uint64_t t[4])
{
	int r;

	fresh_hashes(bc->h, n);
	t[0] = now_ns();
	r = kvc_alloc(bc->c, bc->pool, n, bc->b);
	t[1] = now_ns();
	check(bc->c, r, "alloc");
	r = kvc_seal(bc->c, bc->pool, bc->b, bc->h, n, bc->o);
	t[2] = now_ns();
	check(bc->c, r, "seal");
	r = kvc_release(bc->c, bc->o, n);
	t[3] = now_ns();
	check(bc->c, r, "release");
}

/* The pool's counters, or false when the daemon would not say. */
static bool pool_info(struct bench_conn *bc, Kvcached__PoolInfo *out, uint64_t *pages_free)
{
	Kvcached__Request q = KVCACHED__REQUEST__INIT;
	Kvcached__Stats st = KVCACHED__STATS__INIT;
	Kvcached__Response *rs = NULL;
	bool found = false;
	size_t i;

	q.op_case = KVCACHED__REQUEST__OP_STATS;
	q.stats = &st;
	if (kvc_call(bc->c, &q, &rs) < 0)
		return false;
	if (rs->result_case == KVCACHED__RESPONSE__RESULT_STATS) {
		for (i = 0; i < rs->stats->n_pools; i++)
			if (rs->stats->pools[i]->pool_id == (uint32_t)bc->pool) {
				*out = *rs->stats->pools[i];
				out->namespace_ = out->name = out->dtype = NULL;
				found = true;
			}
		if (pages_free)
			*pages_free = rs->stats->pages_free;
	}
	kvcached__response__free_unpacked(rs, NULL);
	return found;
}

/* The pool's alloc and eviction counters, to tell whether a measurement
 * ran on a pool with free blocks or on a full one where allocs evict. */
struct snap {
	bool ok;
	uint64_t allocs, evictions;
};

static struct snap snap_take(struct bench_conn *bc)
{
	Kvcached__PoolInfo pi;
	struct snap sn = { 0 };

	if (pool_info(bc, &pi, NULL)) {
		sn.ok = true;
		sn.allocs = pi.allocs;
		sn.evictions = pi.evictions;
	}
	return sn;
}

/* Percentage of the allocs between a and b that evicted a cached block, and
 * a note saying so; NAN when the daemon gave no counters. */
static double evicted_note(struct snap a, struct snap b)
{
	uint64_t allocs = b.allocs - a.allocs, ev = b.evictions - a.evictions;
	double pct;

	if (!a.ok || !b.ok || !allocs)
		return NAN;
	pct = 100.0 * (double)ev / (double)allocs;
	note("  pool: %" PRIu64 " blocks allocated (warm-up included), %" PRIu64
	     " of them (%.0f%%) by evicting a cached block", allocs, ev, pct);
	return pct;
}

/* Takes the representative handle for frame sizes from a real alloc. */
static void rep_init(struct bench_conn *bc)
{
	check(bc->c, kvc_alloc(bc->c, bc->pool, 1, bc->b), "alloc");
	rep_pool = bc->pool;
	rep_handle = bc->b[0];
	check(bc->c, kvc_release(bc->c, bc->b, 1), "release");
}

/* Runs cycles of n blocks for secs after a warm-up; s[0..2] get the alloc,
 * seal and release times, s[3] the whole cycle. */
static void cycles_run(struct bench_conn *bc, uint32_t n, double secs, struct samples s[4])
{
	uint64_t t[4], warm_end = now_ns() + (uint64_t)(secs * 0.15e9), end;

	while (now_ns() < warm_end)
		cycle(bc, n, t);
	end = now_ns() + (uint64_t)(secs * 1e9);
	do {
		cycle(bc, n, t);
		sample_add(&s[0], t[1] - t[0]);
		sample_add(&s[1], t[2] - t[1]);
		sample_add(&s[2], t[3] - t[2]);
		sample_add(&s[3], t[3] - t[0]);
	} while (t[3] < end);
}

/* Sections b and c: cycles of n blocks, each op and the whole, against the
 * floor of the same frames. */
static void section_cycles(struct bench_conn *bc, char section, uint32_t n, double target)
{
	struct samples s[4] = { { 0 } };
	struct frames f[3] = { fr(OP_ALLOC, n), fr(OP_SEAL, n), fr(OP_RELEASE, n) };
	double fl[4] = { floor_op(OP_ALLOC, n), floor_op(OP_SEAL, n), floor_op(OP_RELEASE, n),
			 floor_cycle(n) };
	struct row *r;
	char name[48];
	struct snap s0 = snap_take(bc), s1;
	double ev;
	int i;

	cycles_run(bc, n, section == 'b' ? D.single : D.batch, s);
	s1 = snap_take(bc);
	for (i = 0; i < 4; i++) {
		if (i < 3)
			snprintf(name, sizeof(name), "%s %u", opname[i], n);
		else
			snprintf(name, sizeof(name), "alloc+seal+release %u", n);
		r = add_row(section, name);
		row_from(r, &s[i], 1);
		r->req = i < 3 ? f[i].req : f[0].req + f[1].req + f[2].req;
		r->resp = i < 3 ? f[i].resp : f[0].resp + f[1].resp + f[2].resp;
		r->floor_p50 = fl[i];
		r->target = target;
		if (i == 3)
			r->ops_unit = "cycles/s";
		print_row(r);
	}
	if (n > 1) {
		r = add_row(section, "");
		snprintf(r->name, sizeof(r->name), "  per block (cycle / %u)", n);
		row_from(r, &s[3], n);
		r->p50 /= n;
		r->p99 /= n;
		r->ops_unit = "blocks/s";
		print_row(r);
	}
	ev = evicted_note(s0, s1);
	for (i = 0; i < 4 + (n > 1); i++)
		rows[nrows - 1 - (size_t)i].evicted = ev;
	for (i = 0; i < 4; i++)
		sample_free(&s[i]);
}

/* Section d: lookup of a cached 1,000-block chain. */
static void section_lookup(struct bench_conn *bc)
{
	kvc_hash *chain = calloc(CHAIN_LEN, sizeof(*chain));
	kvc_block *held = calloc(CHAIN_LEN, sizeof(*held));
	struct samples s = { 0 }, rel = { 0 };
	uint64_t warm_end, end, t0, t1, t2;
	struct frames f = fr(OP_LOOKUP, CHAIN_LEN);
	double fl = floor_op(OP_LOOKUP, CHAIN_LEN), flr = floor_op(OP_RELEASE, CHAIN_LEN);
	struct row *r;
	int k;

	if (!chain || !held)
		die("out of memory");
	fresh_hashes(chain, CHAIN_LEN);
	check(bc->c, kvc_alloc(bc->c, bc->pool, CHAIN_LEN, held), "alloc");
	check(bc->c, kvc_seal(bc->c, bc->pool, held, chain, CHAIN_LEN, held), "seal");
	check(bc->c, kvc_release(bc->c, held, CHAIN_LEN), "release");

	warm_end = now_ns() + (uint64_t)(D.lookup * 0.15e9);
	end = 0;
	for (;;) {
		t0 = now_ns();
		k = kvc_lookup(bc->c, bc->pool, chain, CHAIN_LEN, held);
		t1 = now_ns();
		check(bc->c, k, "lookup");
		if (k != (int)CHAIN_LEN)
			die("lookup found %d of the %u blocks of a chain sealed just before: "
			    "evicted under our feet? (pool too small)", k, CHAIN_LEN);
		check(bc->c, kvc_release(bc->c, held, CHAIN_LEN), "release");
		t2 = now_ns();
		if (!end) {
			if (t2 >= warm_end)
				end = t2 + (uint64_t)(D.lookup * 1e9);
			continue;
		}
		sample_add(&s, t1 - t0);
		sample_add(&rel, t2 - t1);
		if (t2 >= end)
			break;
	}
	r = add_row('d', "lookup 1000 (all hit)");
	row_from(r, &s, 1);
	r->req = f.req;
	r->resp = f.resp;
	r->floor_p50 = fl;
	print_row(r);
	r = add_row('d', "  per hash (lookup / 1000)");
	row_from(r, &s, CHAIN_LEN);
	r->p50 /= CHAIN_LEN;
	r->p99 /= CHAIN_LEN;
	r->ops_unit = "hashes/s";
	print_row(r);
	r = add_row('d', "release 1000 (after each lookup)");
	row_from(r, &rel, 1);
	f = fr(OP_RELEASE, CHAIN_LEN);
	r->req = f.req;
	r->resp = f.resp;
	r->floor_p50 = flr;
	print_row(r);
	sample_free(&s);
	sample_free(&rel);
	free(chain);
	free(held);
}

/* --- (e) several client processes ----------------------------------------- */

struct client_shm {
	uint64_t start, end, ops;
	uint32_t nsamp;
	int failed;
	uint32_t lat[CLIENT_SAMPLES];  /* ns, capped at 4.29 s */
};

static void client_proc(struct client_shm *sh, int ready_fd, int go_fd, double secs)
{
	struct bench_conn bc;
	uint64_t t[4], end;
	char ch = 0;
	int i;

	rng_seed();
	bc_open(&bc, 1, "kvbench-client", true);
	for (i = 0; i < 200; i++)
		cycle(&bc, 1, t);
	if (write(ready_fd, &ch, 1) != 1 || read(go_fd, &ch, 1) != 1)
		_exit(1);
	sh->start = now_ns();
	end = sh->start + (uint64_t)(secs * 1e9);
	do {
		cycle(&bc, 1, t);
		if (sh->nsamp < CLIENT_SAMPLES) {
			uint64_t d = t[3] - t[0];

			sh->lat[sh->nsamp++] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
		}
		sh->ops++;
	} while (t[3] < end);
	sh->end = t[3];
	bc_close(&bc);
	_exit(0);
}

static void section_clients(struct bench_conn *bc, int nclients)
{
	size_t shm_bytes = sizeof(struct client_shm) * (size_t)nclients;
	struct client_shm *sh;
	int ready[2], go[2], i, st;
	pid_t pids[MAX_CLIENTS];
	uint64_t start = UINT64_MAX, end = 0, ops = 0;
	struct samples s = { 0 };
	struct snap s0, s1;
	struct row *r;
	char name[48], buf[MAX_CLIENTS];

	if (nclients < 1 || nclients > MAX_CLIENTS)
		die("internal: %d clients", nclients);
	sh = mmap(NULL, shm_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		die("mmap: %s", strerror(errno));
	if (pipe(ready) < 0 || pipe(go) < 0)
		die("pipe: %s", strerror(errno));
	fflush(NULL);
	for (i = 0; i < nclients; i++) {
		pids[i] = fork();
		if (pids[i] < 0)
			die("fork: %s", strerror(errno));
		if (pids[i] == 0) {
			close(ready[0]);
			close(go[1]);
			client_proc(&sh[i], ready[1], go[0], D.clients);
		}
	}
	close(ready[1]);
	close(go[0]);
	for (i = 0; i < nclients; i++)
		if (read(ready[0], buf, 1) != 1)
			die("a client process failed to start");
	s0 = snap_take(bc);
	memset(buf, 'g', sizeof(buf));
	if (write(go[1], buf, (unsigned)nclients) != nclients)
		die("write: %s", strerror(errno));
	for (i = 0; i < nclients; i++) {
		if (waitpid(pids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
			die("client process %d failed", (int)pids[i]);
	}
	s1 = snap_take(bc);
	close(ready[0]);
	close(go[1]);
	for (i = 0; i < nclients; i++) {
		uint32_t j;

		start = sh[i].start < start ? sh[i].start : start;
		end = sh[i].end > end ? sh[i].end : end;
		ops += sh[i].ops;
		for (j = 0; j < sh[i].nsamp; j++)
			sample_add(&s, sh[i].lat[j]);
	}
	snprintf(name, sizeof(name), "%d client%s: alloc+seal+release 1", nclients,
		 nclients > 1 ? "s" : "");
	r = add_row('e', name);
	row_from(r, &s, 1);
	r->ops = end > start ? (double)ops / ((double)(end - start) / 1e9) : 0;
	r->ops_unit = "cycles/s";
	print_row(r);
	r->evicted = evicted_note(s0, s1);
	sample_free(&s);
	munmap(sh, shm_bytes);
}

/* --- (f) per-op cost with a full pool ------------------------------------- */

static void section_fill(struct bench_conn *bc)
{
	static const char *const what[3] = { "  alloc 1 (evicting)", "  seal 1", "  release 1" };
	struct frames f[3] = { fr(OP_ALLOC, 1), fr(OP_SEAL, 1), fr(OP_RELEASE, 1) };
	double fl[4] = { floor_op(OP_ALLOC, 1), floor_op(OP_SEAL, 1), floor_op(OP_RELEASE, 1),
			 floor_cycle(1) };
	uint64_t left = fill_n, t0 = now_ns(), pages_free = 0;
	struct samples s[4] = { { 0 } };
	uint32_t batch = FILL_BATCH;
	Kvcached__PoolInfo pi;
	struct snap s0, s1;
	struct row *r;
	char name[48];
	double secs, ev;
	int i;

	if (kvc_conn_hello(bc->c)->max_batch < batch)
		batch = kvc_conn_hello(bc->c)->max_batch;
	while (left) {
		uint32_t n = left < batch ? (uint32_t)left : batch;

		if (bc->cap < n)
			die("internal: batch %u over %zu", n, bc->cap);
		fresh_hashes(bc->h, n);
		check(bc->c, kvc_alloc(bc->c, bc->pool, n, bc->b), "fill: alloc");
		check(bc->c, kvc_seal(bc->c, bc->pool, bc->b, bc->h, n, bc->o), "fill: seal");
		check(bc->c, kvc_release(bc->c, bc->o, n), "fill: release");
		left -= n;
	}
	secs = (double)(now_ns() - t0) / 1e9;
	if (pool_info(bc, &pi, &pages_free)) {
		note("  filled %" PRIu64 " blocks in %.2f s (%.0f blocks/s): the pool holds %" PRIu64
		     " cached and %" PRIu64 " free blocks, %" PRIu64 " pages are free", fill_n, secs,
		     (double)fill_n / secs, pi.blocks_cached, pi.blocks_free, pages_free);
		if (pi.blocks_free || pages_free)
			note("  warning: the pool is not full: some allocs below will not evict");
	} else {
		note("  filled %" PRIu64 " blocks in %.2f s", fill_n, secs);
	}
	s0 = snap_take(bc);
	cycles_run(bc, 1, D.fill, s);
	s1 = snap_take(bc);
	snprintf(name, sizeof(name), "alloc+seal+release 1, N=%" PRIu64, fill_n);
	r = add_row('f', name);
	row_from(r, &s[3], 1);
	r->req = f[0].req + f[1].req + f[2].req;
	r->resp = f[0].resp + f[1].resp + f[2].resp;
	r->floor_p50 = fl[3];
	r->ops_unit = "cycles/s";
	print_row(r);
	for (i = 0; i < 3; i++) {
		r = add_row('f', what[i]);
		row_from(r, &s[i], 1);
		r->req = f[i].req;
		r->resp = f[i].resp;
		r->floor_p50 = fl[i];
		print_row(r);
	}
	ev = evicted_note(s0, s1);
	for (i = 0; i < 4; i++) {
		rows[nrows - 1 - (size_t)i].evicted = ev;
		sample_free(&s[i]);
	}
}

/* --- (g) tier throughput ---------------------------------------------------- */

/* For each block size, a volume V of written blocks sealed as one chain goes
 * G1 -> G2 (Evict g1), G2 -> G3 (Flush), is dropped from G2 (Evict g2),
 * comes back G3 -> G1 (one lookup), goes G1 -> G2 again and comes back
 * G2 -> G1 (one lookup); then the pool's tiers are emptied for the next
 * size. Each move is timed from the request to the Stats reply that shows
 * it done (polled every ~1 ms), beside floors measured here: a memcpy of V
 * between two pre-faulted buffers in B-sized calls, as the daemon copies
 * (best of 3), and fio on the file system of the daemon's disk file. */

#define TIER_LAYOUT "kvbench: tier blocks"
#define TIER_POLL_NS 1000000ull
#define GB 1e9

static const uint64_t tier_sizes[] = { 256u << 10, 2u << 20, 8u << 20 };

struct tier_row {
	char op[40];
	uint64_t block_bytes, bytes, blocks;
	double secs, gbps;
	double reply_secs;          /* evict, flush: until the daemon's reply; NAN = n/a */
	double floor_gbps;          /* 0 = no floor (floor_why says why) */
	const char *floor_name;     /* "memcpy", "fio write", "fio read" */
	char floor_why[32];
	double target;              /* ratio the figure should reach, 0 = none */
};
static struct tier_row trows[32];
static size_t ntrows;

/* What Stats says about one tier (the TierInfo fields kvbench uses). */
struct tinfo {
	uint64_t capacity, used, blocks, dirty, hits, promotions, demotions, evictions;
	uint64_t io_errors, checksum_failures, inflight;
};

struct tstate {
	bool on[3];
	struct tinfo t[3];          /* G1, G2, G3 */
	uint64_t pool_cached;       /* the pool asked for: cached G1 blocks */
};

static void tiers_read(kvc_conn *c, int pool, struct tstate *s)
{
	Kvcached__Request q = KVCACHED__REQUEST__INIT;
	Kvcached__Stats st = KVCACHED__STATS__INIT;
	Kvcached__Response *rs = NULL;
	size_t i;

	q.op_case = KVCACHED__REQUEST__OP_STATS;
	q.stats = &st;
	check(c, kvc_call(c, &q, &rs), "stats");
	if (rs->result_case != KVCACHED__RESPONSE__RESULT_STATS)
		die("stats: the daemon answered something else");
	memset(s, 0, sizeof(*s));
	for (i = 0; i < rs->stats->n_tiers; i++) {
		const Kvcached__TierInfo *ti = rs->stats->tiers[i];
		struct tinfo *t;

		if ((unsigned)ti->tier > 2)
			continue;
		s->on[ti->tier] = true;
		t = &s->t[ti->tier];
		t->capacity = ti->capacity_bytes;
		t->used = ti->used_bytes;
		t->blocks = ti->blocks;
		t->dirty = ti->dirty;
		t->hits = ti->hits;
		t->promotions = ti->promotions;
		t->demotions = ti->demotions;
		t->evictions = ti->evictions;
		t->io_errors = ti->io_errors;
		t->checksum_failures = ti->checksum_failures;
		t->inflight = ti->inflight;
	}
	for (i = 0; i < rs->stats->n_pools; i++)
		if ((int)rs->stats->pools[i]->pool_id == pool)
			s->pool_cached = rs->stats->pools[i]->blocks_cached;
	kvcached__response__free_unpacked(rs, NULL);
}

/* Evict{tier, pool}: returns the blocks the daemon acted on. */
static uint64_t tier_evict(kvc_conn *c, int tier, int pool)
{
	Kvcached__Request q = KVCACHED__REQUEST__INIT;
	Kvcached__Evict ev = KVCACHED__EVICT__INIT;
	Kvcached__Response *rs = NULL;
	uint64_t n;

	ev.tier = (Kvcached__Tier)tier;
	ev.pool_id = (uint32_t)pool;
	q.op_case = KVCACHED__REQUEST__OP_EVICT;
	q.evict = &ev;
	check(c, kvc_call(c, &q, &rs), "evict");
	if (rs->result_case != KVCACHED__RESPONSE__RESULT_EVICT)
		die("evict: the daemon answered something else");
	n = rs->evict->blocks;
	kvcached__response__free_unpacked(rs, NULL);
	return n;
}

/* Flush{}: returns how many write-backs it started. */
static uint64_t tier_flush(kvc_conn *c)
{
	Kvcached__Request q = KVCACHED__REQUEST__INIT;
	Kvcached__Flush fl = KVCACHED__FLUSH__INIT;
	Kvcached__Response *rs = NULL;
	uint64_t n;

	q.op_case = KVCACHED__REQUEST__OP_FLUSH;
	q.flush = &fl;
	check(c, kvc_call(c, &q, &rs), "flush");
	if (rs->result_case != KVCACHED__RESPONSE__RESULT_FLUSH)
		die("flush: the daemon answered something else");
	n = rs->flush->started;
	kvcached__response__free_unpacked(rs, NULL);
	return n;
}

/* What a wait needs besides nothing in flight in G2 and G3. */
struct twant {
	uint64_t g2_demotions, g3_demotions;  /* at least these counts */
	bool g2_clean;                        /* no dirty G2 copy */
};

/* Polls Stats every ~1 ms until no copy or disk I/O is in flight and w
 * holds; returns the time the reply that showed it arrived (so a figure is
 * at most one poll pessimistic). Dies after timeout seconds: the tiers
 * never settling is a daemon fault, not a figure. */
static uint64_t tiers_settle(kvc_conn *c, int pool, const struct twant *w, double timeout,
			     const char *what, struct tstate *s)
{
	uint64_t deadline = now_ns() + (uint64_t)(timeout * 1e9);
	struct timespec ts = { 0, (long)TIER_POLL_NS };

	for (;;) {
		uint64_t t;

		tiers_read(c, pool, s);
		t = now_ns();
		if (!s->t[1].inflight && !s->t[2].inflight && s->t[1].demotions >= w->g2_demotions &&
		    s->t[2].demotions >= w->g3_demotions && (!w->g2_clean || !s->t[1].dirty))
			return t;
		if (t > deadline)
			die("%s: the tiers did not settle in %.0f s: G2 %" PRIu64 " in flight, %" PRIu64
			    " demotions (waiting for %" PRIu64 "), %" PRIu64 " dirty; G3 %" PRIu64
			    " in flight, %" PRIu64 " written (waiting for %" PRIu64 "), %" PRIu64
			    " I/O errors", what, timeout, s->t[1].inflight, s->t[1].demotions,
			    w->g2_demotions, s->t[1].dirty, s->t[2].inflight, s->t[2].demotions,
			    w->g3_demotions, s->t[2].io_errors);
		nanosleep(&ts, NULL);
	}
}

static double secs_between(uint64_t a, uint64_t b)
{
	return (double)(b - a) / 1e9;
}

static const char *size_str(uint64_t b, char *buf, size_t len)
{
	if (b >= (1u << 20) && !(b & ((1u << 20) - 1)))
		snprintf(buf, len, "%" PRIu64 " MiB", b >> 20);
	else if (b >= 1024 && !(b & 1023))
		snprintf(buf, len, "%" PRIu64 " KiB", b >> 10);
	else
		snprintf(buf, len, "%" PRIu64 " B", b);
	return buf;
}

/* Parses 4096, 64KiB, 256MiB, 1GiB (K/M/G alone mean the same). */
static int parse_size(const char *s, uint64_t *out)
{
	static const struct {
		const char *suffix;
		int shift;
	} units[] = { { "", 0 }, { "K", 10 }, { "KiB", 10 }, { "M", 20 }, { "MiB", 20 },
		      { "G", 30 }, { "GiB", 30 } };
	char *end;
	uint64_t v;
	size_t i;

	if (!*s || *s == '-')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -1;
	for (i = 0; i < sizeof(units) / sizeof(units[0]); i++)
		if (!strcmp(end, units[i].suffix)) {
			if (v > (UINT64_MAX >> units[i].shift))
				return -1;
			*out = v << units[i].shift;
			return 0;
		}
	return -1;
}

/* --- the floors --- */

static uint8_t *floor_src, *floor_dst;
static uint64_t floor_bytes;

static void memcpy_floor_init(uint64_t bytes)
{
	floor_bytes = bytes;
	floor_src = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	floor_dst = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (floor_src == MAP_FAILED || floor_dst == MAP_FAILED)
		die("memcpy floor: cannot map 2 x %" PRIu64 " bytes: %s", bytes, strerror(errno));
	memset(floor_src, 0x5a, bytes);
	memset(floor_dst, 0xa5, bytes);
}

static void memcpy_floor_fini(void)
{
	if (floor_src)
		munmap(floor_src, floor_bytes);
	if (floor_dst)
		munmap(floor_dst, floor_bytes);
	floor_src = floor_dst = NULL;
}

/* GB/s of copying bytes in memcpy calls of block bytes, best of 3. */
static double memcpy_floor(uint64_t bytes, uint64_t block)
{
	double best = 0;
	int rep;

	for (rep = 0; rep < 3; rep++) {
		uint64_t t0 = now_ns(), off;
		double gbps;

		for (off = 0; off + block <= bytes; off += block)
			memcpy(floor_dst + off, floor_src + off, block);
		__asm__ __volatile__("" ::: "memory");
		gbps = (double)bytes / GB / secs_between(t0, now_ns());
		if (gbps > best)
			best = gbps;
	}
	return best;
}

static bool in_path(const char *prog)
{
	const char *path = getenv("PATH"), *p, *e;
	char buf[4096];

	if (!path)
		path = "/usr/bin:/bin";
	for (p = path; *p; p = *e ? e + 1 : e) {
		size_t n;

		e = strchr(p, ':');
		if (!e)
			e = p + strlen(p);
		n = (size_t)(e - p);
		if (snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, n ? p : ".", prog) <
			    (int)sizeof(buf) &&
		    access(buf, X_OK) == 0)
			return true;
	}
	return false;
}

/* The number after "bw_bytes" in the "read" or "write" object of fio's
 * first job; -1 if it is not there. */
static double fio_bw(const char *json_text, const char *dir)
{
	const char *p = strstr(json_text, "\"jobs\""), *q;
	char key[16];

	if (!p)
		return -1;
	snprintf(key, sizeof(key), "\"%s\"", dir);
	/* "rw" : "write" names the direction too: the object is the one
	 * followed by a colon and a brace. */
	while ((p = strstr(p, key))) {
		p += strlen(key);
		q = p;
		while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r')
			q++;
		if (*q++ != ':')
			continue;
		while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r')
			q++;
		if (*q != '{')
			continue;
		q = strstr(q, "\"bw_bytes\"");
		if (!q || !(q = strchr(q, ':')))
			return -1;
		return strtod(q + 1, NULL);
	}
	return -1;
}

/* Runs fio (rw "write" or "read") on dir/fio.tmp; returns GB/s, or 0 with
 * why set. */
static double fio_floor(const char *rw, uint64_t bytes, uint64_t block, char *why, size_t whylen)
{
	char a_file[4200], a_size[40], a_bs[40], a_rw[20], a_depth[32], *out = NULL;
	char *argv[] = { "fio", "--name=w", a_file, a_size, a_bs, a_rw, "--ioengine=io_uring",
			 "--direct=1", a_depth, "--output-format=json", NULL };
	size_t len = 0, cap = 0;
	int pfd[2], st;
	double bw;
	pid_t pid;

	snprintf(a_file, sizeof(a_file), "--filename=%s/fio.tmp", disk_dir);
	snprintf(a_size, sizeof(a_size), "--size=%" PRIu64, bytes);
	snprintf(a_bs, sizeof(a_bs), "--bs=%" PRIu64, block);
	snprintf(a_rw, sizeof(a_rw), "--rw=%s", rw);
	snprintf(a_depth, sizeof(a_depth), "--iodepth=%u", disk_depth);
	if (pipe(pfd) < 0)
		die("pipe: %s", strerror(errno));
	fflush(NULL);
	pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		close(pfd[0]);
		if (dup2(pfd[1], 1) < 0)
			_exit(127);
		execvp("fio", argv);
		_exit(127);
	}
	close(pfd[1]);
	for (;;) {
		ssize_t r;

		if (cap - len < 4096) {
			char *p = realloc(out, cap ? 2 * cap : 65536);

			if (!p)
				die("out of memory");
			out = p;
			cap = cap ? 2 * cap : 65536;
		}
		r = read(pfd[0], out + len, cap - len - 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		len += (size_t)r;
	}
	close(pfd[0]);
	out[len] = '\0';
	if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
		snprintf(why, whylen, "fio failed");
		note("  fio --rw=%s failed (%s %d); see its messages above", rw,
		     WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
		free(out);
		return 0;
	}
	bw = fio_bw(out, rw);
	free(out);
	if (bw <= 0) {
		snprintf(why, whylen, "fio: no bw_bytes");
		note("  fio --rw=%s: no bw_bytes in its JSON output", rw);
		return 0;
	}
	return bw / GB;
}

/* --- the table --- */

static void print_tier_header(void)
{
	if (json)
		return;
	printf("  %-28s %8s %7s %8s %7s %10s %-10s %6s %s\n", "op", "block", "blocks", "time s",
	       "GB/s", "floor GB/s", "floor", "ratio", "target");
}

static struct tier_row *tier_row_add(const char *op, uint64_t block, uint64_t blocks,
				     double secs, double floor_gbps, const char *floor_name,
				     const char *why, double target)
{
	struct tier_row *r;
	char bs[32], fl[16] = "", ra[16] = "", tg[24] = "";

	if (ntrows == sizeof(trows) / sizeof(trows[0]))
		die("too many result rows");
	r = &trows[ntrows++];
	memset(r, 0, sizeof(*r));
	snprintf(r->op, sizeof(r->op), "%s", op);
	r->block_bytes = block;
	r->blocks = blocks;
	r->bytes = block * blocks;
	r->secs = secs;
	r->reply_secs = NAN;
	r->gbps = secs > 0 ? (double)r->bytes / GB / secs : 0;
	r->floor_gbps = floor_gbps;
	r->floor_name = floor_name;
	snprintf(r->floor_why, sizeof(r->floor_why), "%s", floor_gbps > 0 ? "" : why);
	r->target = target;
	if (json)
		return r;
	if (floor_gbps > 0) {
		snprintf(fl, sizeof(fl), "%.2f", floor_gbps);
		snprintf(ra, sizeof(ra), "%.2fx", r->gbps / floor_gbps);
		if (target > 0)
			snprintf(tg, sizeof(tg), "%s >= %.2fx",
				 r->gbps / floor_gbps >= target ? "ok" : "MISS", target);
	} else if (target > 0) {
		snprintf(tg, sizeof(tg), ">= %.2fx", target);
	}
	printf("  %-28s %8s %7" PRIu64 " %8.3f %7.2f %10s %-10s %6s %s\n", op,
	       size_str(block, bs, sizeof(bs)), blocks, secs, r->gbps,
	       floor_gbps > 0 ? fl : "-", floor_gbps > 0 ? floor_name : why, ra, tg);
	fflush(stdout);
	return r;
}

/* --- one block size --- */

static uint64_t pattern_base(uint64_t block, uint64_t i)
{
	uint64_t s = block * 0x100000001b3ull ^ (i + 1) * 0x9e3779b97f4a7c15ull;

	return splitmix64(&s);
}

static void pattern_fill(void *p, uint64_t block, uint64_t i)
{
	uint64_t *w = p, base = pattern_base(block, i), k;

	for (k = 0; k < block / 8; k++)
		w[k] = base + k;
}

/* Index of the first word of block i that is not its pattern, or -1. */
static int64_t pattern_check(const void *p, uint64_t block, uint64_t i)
{
	const uint64_t *w = p;
	uint64_t base = pattern_base(block, i), k;

	for (k = 0; k < block / 8; k++)
		if (w[k] != base + k)
			return (int64_t)k;
	return -1;
}

/* Checks every byte of the n blocks a lookup returned; dies on a
 * difference: wrong bytes are a daemon bug, not a figure. */
static void verify_blocks(kvc_conn *c, const kvc_block *b, uint64_t n, uint64_t block,
			  const char *what)
{
	uint64_t i;

	for (i = 0; i < n; i++) {
		const void *p = kvc_block_ptr(c, b[i]);
		int64_t w;

		if (!p)
			die("%s: block %" PRIu64 " of the chain has no address in this process", what, i);
		w = pattern_check(p, block, i);
		if (w >= 0)
			die("%s: block %" PRIu64 " of %" PRIu64 " (%" PRIu64 " bytes) differs from what "
			    "was written at byte %" PRId64 ": a daemon bug", what, i, n, block, w * 8);
	}
}

/* Releases n handles in batches of at most batch. */
static void release_all(kvc_conn *c, const kvc_block *b, uint64_t n, uint32_t batch)
{
	uint64_t i;

	for (i = 0; i < n; i += batch)
		check(c, kvc_release(c, b + i, n - i < batch ? n - i : batch), "release");
}

/* Empties the pool's tiers: G1 demoted to G2, G2 written back and dropped,
 * G3 dropped. */
static void tier_cleanup(kvc_conn *c, int pool, double timeout, const char *what)
{
	struct twant w = { 0 };
	struct tstate s;

	tier_evict(c, 0, pool);
	tiers_settle(c, pool, &w, timeout, what, &s);
	tier_evict(c, 1, pool);
	w.g2_clean = true;
	tiers_settle(c, pool, &w, timeout, what, &s);
	tier_evict(c, 2, pool);
	tiers_settle(c, pool, &w, timeout, what, &s);
}

static void tier_size(kvc_conn *c, uint64_t block, uint64_t volume, bool have_fio)
{
	struct kvc_pool_desc d = {
		.block_bytes = block,
		.block_tokens = 16,
		.dtype = "opaque",
		.layout = TIER_LAYOUT,
		.layout_len = sizeof(TIER_LAYOUT) - 1,
	};
	const struct kvc_hello *h = kvc_conn_hello(c);
	uint64_t n = volume / block, i, t0, t1, t2, ev;
	uint32_t batch = h->max_batch;
	double timeout = 30 + (double)volume / 20e6;  /* 20 MB/s is far below any disk */
	double mc, fw = 0, fr = 0;
	char name[40], bs[32], why_w[32], why_r[32];
	struct twant w = { 0 };
	struct tstate s0, s1;
	kvc_hash *chain;
	kvc_block *b;
	int pool, k;

	size_str(block, bs, sizeof(bs));
	snprintf(name, sizeof(name), "kvbench-tier-%" PRIu64 "%s",
		 block >= (1u << 20) ? block >> 20 : block >> 10, block >= (1u << 20) ? "m" : "k");
	d.name = name;
	if ((uint64_t)batch * 64 > h->max_frame)
		batch = h->max_frame / 64;
	chain = calloc(n, sizeof(*chain));
	b = calloc(n, sizeof(*b));
	if (!chain || !b)
		die("out of memory");
	pool = kvc_register_pool(c, &d);
	check(c, pool, "registering a tier pool");
	tier_cleanup(c, pool, timeout, "emptying the pool's tiers before the run");

	/* The floors, before the daemon touches anything for this size. */
	mc = memcpy_floor(volume, block);
	snprintf(why_w, sizeof(why_w), "%s", !disk_dir ? "no --disk-dir" : "fio missing");
	snprintf(why_r, sizeof(why_r), "%s", why_w);
	if (disk_dir && have_fio) {
		char path[4200];

		snprintf(path, sizeof(path), "%s/fio.tmp", disk_dir);
		unlink(path);
		fw = fio_floor("write", volume, block, why_w, sizeof(why_w));
		fr = fio_floor("read", volume, block, why_r, sizeof(why_r));
		unlink(path);
	}

	/* 1. alloc, write, seal as one chain, release: N cached blocks in G1. */
	fresh_hashes(chain, n);
	t0 = now_ns();
	for (i = 0; i < n; i += batch) {
		uint32_t m = n - i < batch ? (uint32_t)(n - i) : batch, j;

		check(c, kvc_alloc(c, pool, m, b + i), "alloc");
		for (j = 0; j < m; j++) {
			void *p = kvc_block_ptr(c, b[i + j]);

			if (!p)
				die("alloc: block without an address in this process");
			pattern_fill(p, block, i + j);
		}
		check(c, kvc_seal(c, pool, b + i, chain + i, m, b + i), "seal");
	}
	release_all(c, b, n, batch);
	t1 = now_ns();
	tiers_read(c, pool, &s0);
	note("  %s: %" PRIu64 " blocks (%" PRIu64 " MiB) written, sealed as one chain and released "
	     "in %.2f s; %" PRIu64 " of them cached in G1", bs, n, volume >> 20, secs_between(t0, t1),
	     s0.pool_cached);

	/* 2. G1 -> G2. */
	w = (struct twant){ .g2_demotions = s0.t[1].demotions + n };
	t0 = now_ns();
	ev = tier_evict(c, 0, pool);
	t1 = now_ns();
	t2 = tiers_settle(c, pool, &w, timeout, "G1 -> G2", &s1);
	if (ev != n)
		note("  warning: evict g1 acted on %" PRIu64 " blocks, not %" PRIu64, ev, n);
	note("  %s: evict g1 replied after %.3f s, G2 settled after %.3f s", bs, secs_between(t0, t1),
	     secs_between(t0, t2));
	tier_row_add("G1->G2 demote (evict g1)", block, n, secs_between(t0, t2), mc, "memcpy", "",
		     0.8)->reply_secs = secs_between(t0, t1);

	/* 3. G2 -> G3. */
	s0 = s1;
	w = (struct twant){ .g3_demotions = s0.t[2].demotions + n, .g2_clean = true };
	t0 = now_ns();
	ev = tier_flush(c);
	t1 = now_ns();
	t2 = tiers_settle(c, pool, &w, timeout, "G2 -> G3", &s1);
	if (ev != n)
		note("  warning: flush started %" PRIu64 " write-backs, not %" PRIu64, ev, n);
	if (s1.t[2].io_errors != s0.t[2].io_errors)
		note("  warning: %" PRIu64 " G3 I/O errors during the write-back",
		     s1.t[2].io_errors - s0.t[2].io_errors);
	note("  %s: flush replied after %.3f s, G3 settled after %.3f s", bs, secs_between(t0, t1),
	     secs_between(t0, t2));
	tier_row_add("G2->G3 write-back (flush)", block, n, secs_between(t0, t2), fw, "fio write",
		     why_w, 0.9)->reply_secs = secs_between(t0, t1);

	/* 4. Drop the clean G2 copies: the blocks are on disk only. */
	s0 = s1;
	w = (struct twant){ 0 };
	ev = tier_evict(c, 1, pool);
	tiers_settle(c, pool, &w, timeout, "evict g2", &s1);
	if (ev != n || s0.t[1].blocks - s1.t[1].blocks != n)
		note("  warning: evict g2 dropped %" PRIu64 " copies (G2 blocks %" PRIu64 " -> %" PRIu64
		     "), not %" PRIu64, ev, s0.t[1].blocks, s1.t[1].blocks, n);

	/* 5. G3 -> G1: one lookup of the chain. */
	s0 = s1;
	t0 = now_ns();
	k = kvc_lookup(c, pool, chain, n, b);
	t1 = now_ns();
	check(c, k, "lookup (G3 -> G1)");
	tiers_read(c, pool, &s1);
	if ((uint64_t)k != n)
		die("lookup found %d of the %" PRIu64 " blocks written to G3 just before (G3 hits +%" PRIu64
		    ", checksum failures +%" PRIu64 ", I/O errors +%" PRIu64 "): a daemon bug?", k, n,
		    s1.t[2].hits - s0.t[2].hits, s1.t[2].checksum_failures - s0.t[2].checksum_failures,
		    s1.t[2].io_errors - s0.t[2].io_errors);
	if (s1.t[2].hits - s0.t[2].hits != n || s1.t[0].promotions - s0.t[0].promotions != n)
		note("  warning: G3 hits +%" PRIu64 ", G1 promotions +%" PRIu64 ", not %" PRIu64,
		     s1.t[2].hits - s0.t[2].hits, s1.t[0].promotions - s0.t[0].promotions, n);
	tier_row_add("G3->G1 promote (lookup)", block, n, secs_between(t0, t1), fr, "fio read",
		     why_r, 0.9);
	verify_blocks(c, b, n, block, "after the promotion from G3");
	release_all(c, b, n, batch);

	/* 6. G1 -> G2 again, then G2 -> G1: one lookup. */
	w = (struct twant){ .g2_demotions = s1.t[1].demotions + n };
	t0 = now_ns();
	ev = tier_evict(c, 0, pool);
	t1 = now_ns();
	t2 = tiers_settle(c, pool, &w, timeout, "G1 -> G2 again", &s0);
	if (ev != n)
		note("  warning: evict g1 acted on %" PRIu64 " blocks, not %" PRIu64, ev, n);
	tier_row_add("G1->G2 demote again", block, n, secs_between(t0, t2), mc, "memcpy", "", 0.8)
		->reply_secs = secs_between(t0, t1);
	t0 = now_ns();
	k = kvc_lookup(c, pool, chain, n, b);
	t1 = now_ns();
	check(c, k, "lookup (G2 -> G1)");
	tiers_read(c, pool, &s1);
	if ((uint64_t)k != n)
		die("lookup found %d of the %" PRIu64 " blocks demoted to G2 just before (G2 hits +%" PRIu64
		    "): a daemon bug?", k, n, s1.t[1].hits - s0.t[1].hits);
	if (s1.t[1].hits - s0.t[1].hits != n)
		note("  warning: G2 hits +%" PRIu64 ", not %" PRIu64, s1.t[1].hits - s0.t[1].hits, n);
	tier_row_add("G2->G1 promote (lookup)", block, n, secs_between(t0, t1), mc, "memcpy", "",
		     0.8);
	verify_blocks(c, b, n, block, "after the promotion from G2");
	release_all(c, b, n, batch);

	/* 7. Empty the pool's tiers for the next size. */
	t0 = now_ns();
	tier_cleanup(c, pool, timeout, "emptying the pool's tiers");
	tiers_read(c, pool, &s1);
	note("  %s: bytes of all %" PRIu64 " blocks checked after both promotions; tiers emptied in "
	     "%.2f s (G1 %" PRIu64 " cached in the pool, G2 %" PRIu64 ", G3 %" PRIu64 " blocks left)",
	     bs, n, secs_between(t0, now_ns()), s1.pool_cached, s1.t[1].blocks, s1.t[2].blocks);
	free(chain);
	free(b);
}

static void section_tiers(kvc_conn *c)
{
	const struct kvc_hello *h = kvc_conn_hello(c);
	uint64_t volume = tier_volume ? tier_volume : quick ? 256ull << 20 : 1ull << 30;
	uint64_t g1_room, g2_room, g3_room, cap, most = 0;
	bool have_fio = in_path("fio");
	struct tstate s;
	char v1[32], v2[32];
	size_t i;

	tiers_read(c, -1, &s);
	if (!s.on[1] || !s.on[2])
		die("section g needs a daemon with a host tier and a disk tier (--host-tier-size, "
		    "--disk-path, --disk-size)");
	/* Room: G1 keeps a quarter free (demotion starts at 10% free by
	 * default), G2 and G3 hold slots of a 4 KiB header + the block, and
	 * G2 starts writing back at 90% dirty. */
	g1_room = s.t[0].capacity - s.t[0].used;
	g1_room = g1_room > s.t[0].capacity / 4 ? g1_room - s.t[0].capacity / 4 : 0;
	g2_room = (s.t[1].capacity - s.t[1].used) / 10 * 8;
	g3_room = (s.t[2].capacity - s.t[2].used) / 10 * 9;
	print_section("(g) tiers: written blocks through G1 -> G2 -> G3 -> G1 and G1 -> G2 -> G1, "
		      "GB = 10^9 bytes");
	note("  tiers: G1 %" PRIu64 " MiB (%" PRIu64 " used), G2 %" PRIu64 " MiB, G3 %" PRIu64
	     " MiB; volume %s per block size%s", s.t[0].capacity >> 20, s.t[0].used >> 20,
	     s.t[1].capacity >> 20, s.t[2].capacity >> 20, size_str(volume, v1, sizeof(v1)),
	     tier_volume ? " (--volume)" : quick ? " (--quick)" : "");
	if (!disk_dir)
		note("  no --disk-dir: no fio floor for the disk rows");
	else if (!have_fio)
		note("  fio: not installed");
	else
		note("  fio floor: --filename=%s/fio.tmp --ioengine=io_uring --direct=1 --iodepth=%u, "
		     "bs = the block size, size = the volume", disk_dir, disk_depth);
	print_tier_header();
	for (i = 0; i < sizeof(tier_sizes) / sizeof(tier_sizes[0]); i++) {
		uint64_t block = tier_sizes[i], slot = block + 4096, v = volume;

		cap = g1_room;
		if (g2_room / slot * block < cap)
			cap = g2_room / slot * block;
		if (g3_room / slot * block < cap)
			cap = g3_room / slot * block;
		if ((uint64_t)h->max_batch * block < cap)
			cap = (uint64_t)h->max_batch * block;
		if ((uint64_t)(h->max_frame / 40) * block < cap)  /* one lookup of the chain */
			cap = (uint64_t)(h->max_frame / 40) * block;
		if (v > cap) {
			v = cap;
			note("  %s: the volume is capped to %s by the daemon's tier sizes", size_str(block, v1, sizeof(v1)),
			     size_str(v / block * block, v2, sizeof(v2)));
		}
		v = v / block * block;
		if (!v) {
			note("  %s: no room for one block: skipped", size_str(block, v1, sizeof(v1)));
			continue;
		}
		if (v > most) {
			memcpy_floor_fini();
			memcpy_floor_init(v);
			most = v;
		}
		tier_size(c, block, v, have_fio);
	}
	memcpy_floor_fini();
}

/* --- output --------------------------------------------------------------- */

static void json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			printf("\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			printf("\\u%04x", *s);
		else
			putchar(*s);
	}
	putchar('"');
}

/* ", key: number" (null for NAN and infinities). */
static void json_num(const char *key, double v)
{
	printf(", \"%s\": ", key);
	if (isfinite(v))
		printf("%.3f", v);
	else
		printf("null");
}

static void print_json(const struct utsname *u, long ncpu)
{
	size_t i;

	printf("{\"kvbench\": ");
	json_str(KV_VERSION);
	printf(", \"socket\": ");
	json_str(sock_path);
	printf(", \"quick\": %s, \"fill\": %" PRIu64 ", \"cpus\": %ld, \"kernel\": ",
	       quick ? "true" : "false", fill_n, ncpu);
	json_str(u->release);
	printf(",\n \"results\": [\n");
	for (i = 0; i < nrows; i++) {
		const struct row *r = &rows[i];
		char sec[2] = { r->section, 0 };
		double ratio = r->floor_p50 > 0 ? r->p50 / r->floor_p50 : NAN;

		printf("  {\"section\": ");
		json_str(sec);
		printf(", \"name\": ");
		json_str(r->name[0] == ' ' ? r->name + 2 : r->name);
		printf(", \"req_bytes\": %u, \"resp_bytes\": %u, \"samples\": %" PRIu64, r->req,
		       r->resp, r->n);
		json_num("p50_us", r->p50);
		json_num("p99_us", r->p99);
		json_num("rate", r->ops);
		printf(", \"rate_unit\": ");
		json_str(r->ops_unit);
		json_num("floor_p50_us", r->floor_p50 > 0 ? r->floor_p50 : NAN);
		json_num("ratio", ratio);
		json_num("target_ratio", r->target > 0 ? r->target : NAN);
		if (r->target > 0)
			printf(", \"target_met\": %s", ratio <= r->target ? "true" : "false");
		json_num("evicted_pct", r->evicted);
		printf("}%s\n", i + 1 < nrows ? "," : "");
	}
	printf(" ]");
	if (ntrows) {
		printf(",\n \"tiers\": [\n");
		for (i = 0; i < ntrows; i++) {
			const struct tier_row *r = &trows[i];
			double ratio = r->floor_gbps > 0 ? r->gbps / r->floor_gbps : NAN;

			printf("  {\"section\": \"g\", \"op\": ");
			json_str(r->op);
			printf(", \"block_bytes\": %" PRIu64 ", \"blocks\": %" PRIu64
			       ", \"bytes\": %" PRIu64, r->block_bytes, r->blocks, r->bytes);
			json_num("seconds", r->secs);
			json_num("reply_seconds", r->reply_secs);
			json_num("gb_per_s", r->gbps);
			json_num("floor_gb_per_s", r->floor_gbps > 0 ? r->floor_gbps : NAN);
			printf(", \"floor\": ");
			json_str(r->floor_gbps > 0 ? r->floor_name : r->floor_why);
			json_num("ratio", ratio);
			json_num("target_ratio", r->target > 0 ? r->target : NAN);
			if (r->target > 0 && r->floor_gbps > 0)
				printf(", \"target_met\": %s", ratio >= r->target ? "true" : "false");
			printf("}%s\n", i + 1 < ntrows ? "," : "");
		}
		printf(" ]");
	}
	printf("}\n");
}

/* This process's allowed CPUs as "0,2-3". */
static void cpus_str(char *buf, size_t len)
{
	cpu_set_t set;
	size_t used = 0;
	int c, start = -1;

	buf[0] = '\0';
	if (sched_getaffinity(0, sizeof(set), &set) < 0) {
		snprintf(buf, len, "?");
		return;
	}
	for (c = 0; c <= CPU_SETSIZE; c++) {
		bool in = c < CPU_SETSIZE && CPU_ISSET(c, &set);

		if (in && start < 0)
			start = c;
		if (!in && start >= 0 && used < len) {
			used += (size_t)snprintf(buf + used, len - used, "%s%d", used ? "," : "", start);
			if (c - 1 > start && used < len)
				used += (size_t)snprintf(buf + used, len - used, "-%d", c - 1);
			start = -1;
		}
	}
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: kvbench [OPTION]...\n"
		"Latency and throughput of a running kvcached, next to the floor of a raw\n"
		"AF_UNIX ping-pong with the same frame sizes. Prints figures, asserts nothing.\n\n"
		"  -s, --socket PATH  the daemon's socket (default: $KVCACHED_SOCKET, else\n"
		"                     /run/kvcached/kvcached.sock for root, else\n"
		"                     $XDG_RUNTIME_DIR/kvcached.sock)\n"
		"  -q, --quick        short runs (~10 s instead of ~60 s)\n"
		"  -j, --json         results as JSON on stdout (notes go to stderr)\n"
		"  -f, --fill N       fill the pool with N cached 4 KiB blocks first and\n"
		"                     measure alloc+seal+release on the full pool (section f)\n"
		"  -o, --only LIST    sections to run, e.g. 'abd' (default: abcde, or f\n"
		"                     with --fill; g and h only when listed):\n"
		"                       a floor  b single ops  c batches of 16, 256\n"
		"                       d lookup of 1,000  e 1/4/16 clients  f full pool\n"
		"                       g tier throughput (needs a daemon with G2 and G3)\n"
		"                       h GPU data paths (no daemon; text output only)\n"
		"  -c, --server-cpu N pin the floor's echo process to CPU N: give the CPU the\n"
		"                     daemon is pinned to, so that the floor and the daemon\n"
		"                     see the same placement (default: not pinned)\n"
		"  -d, --disk-dir DIR section g: a directory on the file system of the\n"
		"                     daemon's --disk-path, for the fio floor (fio writes and\n"
		"                     reads DIR/fio.tmp, then deletes it); without it, no\n"
		"                     floor for the disk rows\n"
		"  -V, --volume SIZE  section g: bytes moved per block size (default 1GiB,\n"
		"                     --quick 256MiB; capped to what the tiers can hold)\n"
		"  -D, --disk-queue-depth N  section g: fio's iodepth; give the daemon's\n"
		"                     --disk-queue-depth (default 64)\n"
		"  -h, --help         this text\n\n"
		"The daemon's pool needs room for a few thousand 4 KiB blocks (it evicts\n"
		"beyond that); section g wants a daemon of its own (it reads the tiers'\n"
		"global counters) with e.g. --pool-size 2GiB --host-tier-size 2GiB\n"
		"--disk-path DIR/g3 --disk-size 4GiB. scripts/bench starts daemons and runs\n"
		"every section.\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "quick", no_argument, NULL, 'q' },
		{ "json", no_argument, NULL, 'j' },
		{ "fill", required_argument, NULL, 'f' },
		{ "only", required_argument, NULL, 'o' },
		{ "server-cpu", required_argument, NULL, 'c' },
		{ "disk-dir", required_argument, NULL, 'd' },
		{ "volume", required_argument, NULL, 'V' },
		{ "disk-queue-depth", required_argument, NULL, 'D' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	static char sock_buf[108];
	char cpus[64], echo[32] = "the same CPUs";
	bool classic;
	struct bench_conn bc;
	struct utsname u;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	char *end;
	int o;

	while ((o = getopt_long(argc, argv, "s:qjf:o:c:d:V:D:h", opts, NULL)) != -1) {
		switch (o) {
		case 's':
			sock_path = optarg;
			break;
		case 'q':
			quick = true;
			break;
		case 'j':
			json = true;
			break;
		case 'f':
			errno = 0;
			fill_n = strtoull(optarg, &end, 10);
			if (errno || *end || !optarg[0] || optarg[0] == '-' || !fill_n)
				die("--fill: '%s' is not a positive count of blocks", optarg);
			break;
		case 'o':
			if (strlen(optarg) >= sizeof(only) || strspn(optarg, "abcdefgh") != strlen(optarg))
				die("--only: '%s': letters among a, b, c, d, e, f, g, h", optarg);
			snprintf(only, sizeof(only), "%s", optarg);
			break;
		case 'c':
			errno = 0;
			server_cpu = (int)strtol(optarg, &end, 10);
			if (errno || *end || !optarg[0] || server_cpu < 0 || server_cpu >= CPU_SETSIZE)
				die("--server-cpu: '%s' is not a CPU number", optarg);
			break;
		case 'd': {
			struct stat st;

			if (stat(optarg, &st) < 0 || !S_ISDIR(st.st_mode))
				die("--disk-dir: '%s' is not a directory", optarg);
			disk_dir = optarg;
			break;
		}
		case 'V':
			if (parse_size(optarg, &tier_volume) < 0 || !tier_volume)
				die("--volume: '%s' is not a size like 256MiB or 1GiB", optarg);
			break;
		case 'D': {
			long v;

			errno = 0;
			v = strtol(optarg, &end, 10);
			if (errno || *end || !optarg[0] || v < 1 || v > 4096)
				die("--disk-queue-depth: '%s' is not a depth in 1..4096", optarg);
			disk_depth = (unsigned)v;
			break;
		}
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		usage(stderr);
		return 2;
	}
	if (!only[0])
		snprintf(only, sizeof(only), "%s", fill_n ? "f" : "abcde");
	if (want('f') && !fill_n)
		die("section f needs --fill N");
	if (!sock_path) {
		if (kvc_default_socket(sock_buf, sizeof(sock_buf)) < 0)
			die("the default socket path is too long");
		sock_path = sock_buf;
	}
	D = quick ? dur_quick : dur_default;
	signal(SIGPIPE, SIG_IGN);
	rng_seed();
	uname(&u);

	if (!strpbrk(only, "abcdefg")) {  /* h alone: no daemon */
		kvbench_gpu(quick);
		return 0;
	}
	classic = strpbrk(only, "abcdef") != NULL;
	bc_open(&bc, fill_n ? FILL_BATCH : CHAIN_LEN, "kvbench", classic);
	note("kvbench %s: %s, %ld CPUs, Linux %s, daemon backend %s, %s run", KV_VERSION,
	     sock_path, ncpu, u.release, kvc_conn_hello(bc.c)->backend, quick ? "quick" : "full");
	cpus_str(cpus, sizeof(cpus));
	if (server_cpu >= 0)
		snprintf(echo, sizeof(echo), "CPU %d", server_cpu);
	if (classic) {
		note("kvbench on CPU %s, the floor's echo process on %s", cpus, echo);
		note("pool \"%s\" of 4 KiB blocks (id %d); frames in bytes with the 8-byte header; "
		     "rates are serial (1 / mean) except in (e)", POOL_NAME, bc.pool);
		print_header();
		rep_init(&bc);
	} else {
		note("kvbench on CPU %s", cpus);
	}
	if (want('a')) {
		static const uint32_t ns[] = { 1, 16, 256 };
		bool alone = !strpbrk(only, "bcdef");  /* --only a: every floor */

		print_section("(a) floor: AF_UNIX socketpair ping-pong between two processes");
		for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++) {
			if (!alone && (ns[i] == 1 ? !strpbrk(only, "bef") : !want('c')))
				continue;
			floor_op(OP_ALLOC, ns[i]);
			floor_op(OP_SEAL, ns[i]);
			floor_op(OP_RELEASE, ns[i]);
			floor_cycle(ns[i]);
		}
		if (alone || want('d')) {
			floor_op(OP_LOOKUP, CHAIN_LEN);
			floor_op(OP_RELEASE, CHAIN_LEN);
		}
	}
	if (want('b')) {
		print_section("(b) 1 block: alloc, seal, release (three round trips)");
		section_cycles(&bc, 'b', 1, 1.5);
	}
	if (want('c')) {
		print_section("(c) batches: alloc, seal, release of 16 and 256 blocks per request");
		section_cycles(&bc, 'c', 16, 0);
		section_cycles(&bc, 'c', 256, 3.0);
	}
	if (want('d')) {
		print_section("(d) lookup of a cached 1,000-block chain");
		section_lookup(&bc);
	}
	if (want('e')) {
		static const int n[] = { 1, 4, 16 };

		print_section("(e) client processes, each its own connection (aggregate rate)");
		for (size_t i = 0; i < sizeof(n) / sizeof(n[0]); i++)
			section_clients(&bc, n[i]);
	}
	if (want('f')) {
		print_section("(f) alloc+seal+release with the pool full of cached blocks");
		section_fill(&bc);
	}
	if (want('g'))
		section_tiers(bc.c);
	bc_close(&bc);
	if (json)
		print_json(&u, ncpu);
	else if (want('h'))
		kvbench_gpu(quick);
	return 0;
}
