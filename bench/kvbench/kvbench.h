/* kvbench's internal interface: what its files share. main.c says what
 * kvbench measures; docs/benchmarks.md what the figures mean.
 *
 *   main.c     options, which sections run, the JSON output
 *   common.c   result rows and their printing, samples and percentiles,
 *              synthetic hashes
 *   floor.c    frame sizes, and (a): the socketpair floor
 *   conn.c     the daemon connection, one alloc+seal+release cycle, the
 *              pool's counters: what (b)-(f) share
 *   cycles.c   (b) and (c): cycles of 1, 16 and 256 blocks
 *   lookup.c   (d): lookup of a cached chain
 *   rawlookup.c  (d): the client's floor, a lookup without libkvcache
 *   clients.c  (e): several client processes
 *   fill.c     (f): a pool full of cached blocks
 *   tiers.c    (g): tier throughput
 *   tiers_cuda.c  (g) on the cuda backend: blocks in GPU memory through the
 *              copy engine, its floors (tiers_cuda.h)
 *   gpu.c      (h): the GPU data paths; shares nothing but its entry point
 *              (gpu.h)
 *
 * One thread (forked processes aside). kvbench is a program, not a library:
 * its names keep no prefix (the libraries it links export kv-prefixed names
 * only). die() exits; nothing here returns an error. */
#ifndef KVBENCH_H
#define KVBENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "kvc_internal.h"  /* kvc_call() for the pool's counters; kvcached.pb-c.h */

#define POOL_NAME "kvbench-4k"      /* the 4 KiB pool of sections a-f */
#define CHAIN_LEN 1000u               /* blocks in (d)'s chain */
#define FILL_BATCH 4096u              /* blocks per request while (f) fills */

/* --- options (main.c) --- */

extern const char *sock_path;
extern bool quick, json;
extern uint64_t fill_n;
extern int server_cpu;                /* --server-cpu: where the floor's echo runs */
extern const char *disk_dir;          /* --disk-dir: the file system of the daemon's G3 */
extern uint64_t tier_volume;          /* --volume: bytes per block size in g; 0 = default */
extern unsigned disk_depth;           /* --disk-queue-depth: fio's iodepth */

/* Seconds each kind of measurement runs for (default, then --quick). */
struct durations {
	double floor, single, batch, lookup, clients, fill;
};
extern struct durations D;

/* --- result rows and output (common.c) --- */

struct row {
	char section;
	char name[48];
	uint32_t req, resp;          /* frame bytes with header; 0 = n/a */
	double p50, p99;             /* microseconds */
	double p10;                  /* the CPU rows' (cpu_row()); 0 = n/a */
	double ops;                  /* per second */
	const char *ops_unit;        /* "ops/s", "blocks/s", ... */
	double floor_p50;            /* 0 = no comparison */
	double target;               /* ratio target, 0 = none */
	uint64_t n;                  /* samples */
	double evicted;              /* % of the allocs that evicted; NAN = n/a */
};

extern struct row rows[96];
extern size_t nrows;

void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* A line for humans (stdout), or on stderr under --json. */
void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Dies with the library's message when r < 0. */
void check(kvc_conn *c, int r, const char *what);
void print_header(void);
void print_section(const char *title);
/* A new zeroed row; valid until the program exits. */
struct row *add_row(char section, const char *name);
void print_row(const struct row *r);
/* A JSON string, and ", key: number" (null for NAN and infinities). */
void json_str(const char *s);
void json_num(const char *key, double v);

/* --- time and samples (common.c) --- */

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

void sample_add(struct samples *s, uint64_t ns);
void sample_free(struct samples *s);
/* Fills a row from samples: p50, p99, and a serial rate = samples / their
 * total time, times `per` (blocks per sample for block rates). Sorts s. */
void row_from(struct row *r, struct samples *s, double per);

/* --- synthetic hashes (common.c) --- */

uint64_t splitmix64(uint64_t *s);
/* Seeds this process's stream; a forked client calls it again. */
void rng_seed(void);
/* n fresh random hashes: distinct (2^-256 odds aside) across processes and
 * runs, so no seal dedups. */
void fresh_hashes(kvc_hash *h, size_t n);

/* --- frame sizes and the floor (floor.c) --- */

struct frames {
	uint32_t req, resp;
};

enum op { OP_ALLOC, OP_SEAL, OP_RELEASE, OP_LOOKUP };

extern const char *const opname[];

struct bench_conn;
/* Takes the representative handle for frame sizes from a real alloc; before
 * any fr(). */
void rep_init(struct bench_conn *bc);
/* The frames of op on n blocks. */
struct frames fr(enum op op, uint32_t n);
/* The floor p50 of one op's frames, and of an alloc+seal+release cycle
 * (three exchanges in a row): measured and printed the first time. */
double floor_op(enum op op, uint32_t n);
double floor_cycle(uint32_t n);

/* --- the daemon (conn.c) --- */

struct bench_conn {
	kvc_conn *c;
	int pool;
	kvc_hash *h;
	kvc_block *b, *o;
	size_t cap;
	int cpu_fd;                       /* the daemon's /proc/PID/schedstat, or -1 */
};

/* Connects; registers the 4 KiB pool unless with_pool is false (section g
 * alone registers its own pools). cap: blocks per request at most. */
void bc_open(struct bench_conn *bc, size_t cap, const char *name, bool with_pool);
void bc_close(struct bench_conn *bc);
/* One alloc+seal+release of n blocks with fresh hashes; t[0..3] get the
 * times before alloc, seal, release and after. */
void cycle(struct bench_conn *bc, uint32_t n, uint64_t t[4]);
/* The CPU time (ns) the daemon's main thread, its event loop, has run so
 * far: /proc/PID/schedstat of the socket's peer (SO_PEERCRED), which the
 * kernel brings up to date when read. 0 when it cannot be read (another
 * pid namespace, another user): the CPU rows are left out then. Load on
 * the machine moves it far less than a latency (issue 38: benchmarks on a
 * shared machine). */
uint64_t daemon_cpu_ns(struct bench_conn *bc);
/* The daemon's CPU per op of an alloc+seal+release cycle of n blocks, over
 * `cycles` cycles, into s[0..2] (ns), each op's read before and after it.
 * Returns false (nothing added) when daemon_cpu_ns() cannot read. */
bool cycles_cpu(struct bench_conn *bc, uint32_t n, unsigned cycles, struct samples s[3]);
/* Adds and prints a row "  daemon CPU, NAME" of s (microseconds, no floor,
 * no rate, its 10th percentile in the rate's column): what the daemon's
 * loop spent per request. The p10 is the request whose lines the machine's
 * other processes left in cache: what load moves least. */
void cpu_row(char section, const char *name, struct samples *s);
/* The same row for another process's or thread's CPU (who: "client"). */
void cpu_row_of(char section, const char *who, const char *name, struct samples *s);
/* Runs cycles of n blocks for secs after a warm-up; s[0..2] get the alloc,
 * seal and release times, s[3] the whole cycle. */
void cycles_run(struct bench_conn *bc, uint32_t n, double secs, struct samples s[4]);
/* The pool's counters, or false when the daemon would not say. */
bool pool_info(struct bench_conn *bc, Kvcached__PoolInfo *out, uint64_t *pages_free);

/* The pool's alloc and eviction counters, to tell whether a measurement
 * ran on a pool with free blocks or on a full one where allocs evict. */
struct snap {
	bool ok;
	uint64_t allocs, evictions;
};

struct snap snap_take(struct bench_conn *bc);
/* Percentage of the allocs between a and b that evicted a cached block, and
 * a note saying so; NAN when the daemon gave no counters. */
double evicted_note(struct snap a, struct snap b);

/* --- the sections --- */

/* (b) and (c): cycles of n blocks, each op and the whole, against the floor
 * of the same frames; target: the p50 ratio to reach, 0 = none. */
void section_cycles(struct bench_conn *bc, char section, uint32_t n, double target);
void section_lookup(struct bench_conn *bc);                  /* (d) */
/* (d)'s floor of the client's CPU per lookup (rawlookup.c), after
 * section_lookup(): the row "raw client CPU, lookup 1000", 3,000 lookups of
 * a cached chain of CHAIN_LEN by hand on bc's socket, each released by the
 * library. Nothing without access to the daemon's CPU (as the client's
 * row). */
void raw_lookup_rows(struct bench_conn *bc);
void section_clients(struct bench_conn *bc, int nclients);   /* (e) */
void section_fill(struct bench_conn *bc);                    /* (f) */
void section_tiers(kvc_conn *c);                             /* (g) */
/* (g)'s rows as a JSON member ",\n \"tiers\": [...]"; nothing without any. */
void tiers_print_json(void);

#endif
