/* kvbench section g: tier throughput, against a daemon with a host tier and
 * a disk tier (--host-tier-size, --disk-path); only with --only g.
 *
 * For each block size, a volume V of written blocks sealed as one chain goes
 * G1 -> G2 (Evict g1), G2 -> G3 (Flush), is dropped from G2 (Evict g2),
 * comes back G3 -> G1 (one lookup), goes G1 -> G2 again and comes back
 * G2 -> G1 (one lookup); then the pool's tiers are emptied for the next
 * size. Each move is timed from the request to the Stats reply that shows
 * it done (polled every ~1 ms), beside floors measured here: a memcpy of V
 * between two pre-faulted buffers in B-sized calls, as the daemon copies
 * (best of 3), and fio on the file system of the daemon's disk file.
 *
 * On the cuda backend (the daemon's Hello says "cuda") the blocks are device
 * memory: kvbench writes each block's pattern into a pinned staging buffer
 * and copies it in with cuMemcpyHtoD, and checks a promoted block by copying
 * it back with cuMemcpyDtoH, never through a host pointer; the G1 <-> G2
 * floors are then the copy engine's (cuMemcpyDtoHAsync / cuMemcpyHtoDAsync
 * of the same volume in B-sized calls on one stream, pinned host memory,
 * best of 3) instead of memcpy. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvbench.h"
#include "tiers_cuda.h"

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

/* $KVBENCH_PERF_FIFO: perf's control fifo (perf record -D -1
 * --control=fifo:PATH ...): "enable" before and "disable" after each timed
 * G1 -> G2 demotion (the first and the second: $KVBENCH_PERF_PHASE=demote)
 * or each timed G2 -> G1 lookup (promote, the default), so that a profile of
 * the daemon holds those only. */
static void perf_ctl(const char *phase, const char *cmd)
{
	const char *path = getenv("KVBENCH_PERF_FIFO"), *want = getenv("KVBENCH_PERF_PHASE");
	FILE *f;

	if (!path || strcmp(want ? want : "promote", phase) || !(f = fopen(path, "we")))
		return;
	fprintf(f, "%s\n", cmd);
	fclose(f);
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

/* --- blocks in device memory (cuda backend: tiers_cuda.c) --- */

static bool tier_cuda;        /* the daemon serves device memory */
static uint64_t *tier_stage;  /* one block of staging (pinned on cuda) */
static uint64_t tier_stage_bytes;

static void stage_fini(void)
{
	if (tier_cuda)
		tier_dev_host_free(tier_stage);
	else
		free(tier_stage);
	tier_stage = NULL;
	tier_stage_bytes = 0;
}

static void stage_init(uint64_t block)
{
	if (tier_stage_bytes >= block)
		return;
	stage_fini();
	tier_stage = tier_cuda ? tier_dev_host_alloc(block) : malloc(block);
	if (!tier_stage)
		die("out of memory");
	tier_stage_bytes = block;
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

/* Writes block i's pattern into the block at p: directly on the host
 * backend, through the staging buffer and cuMemcpyHtoD on cuda. */
static void block_fill(void *p, uint64_t block, uint64_t i)
{
	if (!tier_cuda) {
		pattern_fill(p, block, i);
		return;
	}
	pattern_fill(tier_stage, block, i);
	tier_dev_write(p, tier_stage, block);
}

/* block_fill()'s counterpart: pattern_check() of the block's bytes. */
static int64_t block_check(const void *p, uint64_t block, uint64_t i)
{
	if (!tier_cuda)
		return pattern_check(p, block, i);
	memset(tier_stage, 0, block);
	tier_dev_read(tier_stage, p, block);
	return pattern_check(tier_stage, block, i);
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
		w = block_check(p, block, i);
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
	double mc, up, fw = 0, fr = 0;
	const char *down_name = tier_cuda ? "cuMemcpy D2H" : "memcpy";
	const char *up_name = tier_cuda ? "cuMemcpy H2D" : "memcpy";
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
	if (tier_cuda) {
		mc = tier_copy_floor(true, volume, block);
		up = tier_copy_floor(false, volume, block);
	} else {
		mc = up = memcpy_floor(volume, block);
	}
	stage_init(block);
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
			block_fill(p, block, i + j);
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
	perf_ctl("demote", "enable");
	t0 = now_ns();
	ev = tier_evict(c, 0, pool);
	t1 = now_ns();
	t2 = tiers_settle(c, pool, &w, timeout, "G1 -> G2", &s1);
	perf_ctl("demote", "disable");
	if (ev != n)
		note("  warning: evict g1 acted on %" PRIu64 " blocks, not %" PRIu64, ev, n);
	note("  %s: evict g1 replied after %.3f s, G2 settled after %.3f s", bs, secs_between(t0, t1),
	     secs_between(t0, t2));
	tier_row_add("G1->G2 demote (evict g1)", block, n, secs_between(t0, t2), mc, down_name,
		     "no floor", 0.8)->reply_secs = secs_between(t0, t1);

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
	perf_ctl("demote", "enable");
	t0 = now_ns();
	ev = tier_evict(c, 0, pool);
	t1 = now_ns();
	t2 = tiers_settle(c, pool, &w, timeout, "G1 -> G2 again", &s0);
	perf_ctl("demote", "disable");
	if (ev != n)
		note("  warning: evict g1 acted on %" PRIu64 " blocks, not %" PRIu64, ev, n);
	tier_row_add("G1->G2 demote again", block, n, secs_between(t0, t2), mc, down_name,
		     "no floor", 0.8)->reply_secs = secs_between(t0, t1);
	perf_ctl("promote", "enable");
	t0 = now_ns();
	k = kvc_lookup(c, pool, chain, n, b);
	t1 = now_ns();
	perf_ctl("promote", "disable");
	check(c, k, "lookup (G2 -> G1)");
	tiers_read(c, pool, &s1);
	if ((uint64_t)k != n)
		die("lookup found %d of the %" PRIu64 " blocks demoted to G2 just before (G2 hits +%" PRIu64
		    "): a daemon bug?", k, n, s1.t[1].hits - s0.t[1].hits);
	if (s1.t[1].hits - s0.t[1].hits != n)
		note("  warning: G2 hits +%" PRIu64 ", not %" PRIu64, s1.t[1].hits - s0.t[1].hits, n);
	tier_row_add("G2->G1 promote (lookup)", block, n, secs_between(t0, t1), up, up_name,
		     "no floor", 0.8);
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

void section_tiers(kvc_conn *c)
{
	const struct kvc_hello *h = kvc_conn_hello(c);
	uint64_t volume = tier_volume ? tier_volume : quick ? 256ull << 20 : 1ull << 30;
	uint64_t g1_room, g2_room, g3_room, cap, most = 0;
	bool have_fio = in_path("fio");
	struct tstate s;
	char v1[32], v2[32];
	size_t i;

	tier_cuda = !strcmp(h->backend, "cuda");
	if (tier_cuda)
		tier_dev_init();
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
	print_section(tier_cuda ? "(g) tiers, cuda backend: written blocks through G1 -> G2 -> G3 "
		      "-> G1 and G1 -> G2 -> G1, GB = 10^9 bytes" :
		      "(g) tiers: written blocks through G1 -> G2 -> G3 -> G1 and G1 -> G2 -> G1, "
		      "GB = 10^9 bytes");
	if (tier_cuda)
		note("  blocks in GPU memory, written (cuMemcpyHtoD from pinned staging) and checked "
		     "(cuMemcpyDtoH) by the copy engine; G1 <-> G2 floors: cuMemcpy of the volume "
		     "in block-sized calls");
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
		if (v > most && !tier_cuda) {
			memcpy_floor_fini();
			memcpy_floor_init(v);
			most = v;
		}
		tier_size(c, block, v, have_fio);
	}
	memcpy_floor_fini();
	stage_fini();
	if (tier_cuda)
		tier_dev_fini();
}

void tiers_print_json(void)
{
	size_t i;

	if (!ntrows)
		return;
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
