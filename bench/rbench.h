/* redis-benchmark beside a client on a cluster started by
 * tests/rcluster_harness.c: running it, reading its figures, and the key
 * names it reads in cluster mode. Shared by kvrcbench (the client alone)
 * and kvg4rate (the daemon's G4 tier); docs/benchmarks.md, "G4: the Redis
 * Cluster client beside redis-benchmark", says why the set-up is fair. */
#ifndef KV_BENCH_RBENCH_H
#define KV_BENCH_RBENCH_H

#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "rcluster_harness.h"

#define RB_MASTERS 3

struct rb_conf {
	int clients, pipeline, threads;   /* threads 0: redis-benchmark's default */
};

struct rb_result {
	double rps, gbs, p50_ms;   /* as redis-benchmark reports them */
	double wall_s;             /* its process, start to exit */
	unsigned long long hits, misses;
	int ok;
};

/* The program's name, for messages ("kvrcbench"). */
extern const char *rb_prog;
/* redis-benchmark's path; NULL: not found (set by the program). */
extern const char *rb_bin;

__attribute__((format(printf, 1, 2), noreturn))
void die(const char *fmt, ...);

/* CLOCK_MONOTONIC in ns. */
uint64_t rb_now_ns(void);
/* A size argument: bytes, with k or m for KiB or MiB; dies unless it is in
 * [lo, hi] and a multiple of align. */
size_t rb_parse_size(const char *s, size_t lo, size_t hi, size_t align);
/* n as "4 MiB", "256 KiB" or "1000 B". */
void rb_size_str(size_t n, char *out, size_t len);

/* A command on node i, through a connection of its own; dies on an error
 * reply. The caller frees the reply. */
redisReply *rb_node_cmd(struct kvt_rc *c, int i, const char *command);
/* FLUSHALL on every master (and waits for the replicas). */
void rb_flush_all(struct kvt_rc *c);
/* Some master's index. */
int rb_a_master(struct kvt_rc *c);

/* redis-benchmark's hash tags, one per master, learnt from a tiny SET run
 * of its own through port; the cluster is flushed afterwards. 0, or -1
 * (said on stderr). */
int rb_learn_tags(struct kvt_rc *c, const char *port, char tags[RB_MASTERS][8]);
/* The name of key i that redis-benchmark reads with -r per_tag: key i is
 * the (i % per_tag)-th of tag tags[i / per_tag] (tags: RB_MASTERS tags of
 * 8 bytes each, as rb_learn_tags() writes them). */
int rb_key_name(char *out, size_t len, const char *tags, size_t i, size_t per_tag);

/* "-c C -P P --threads T" */
void rb_label(const struct rb_conf *r, char *out, size_t len);
/* redis-benchmark --cluster -t test -d size -n n (rounded up to whole
 * pipelines) -r keyspace with conf's -c/-P/--threads through port; the
 * masters' keyspace hits and misses counted around it. */
void rb_run(struct kvt_rc *c, const char *port, const struct rb_conf *conf, const char *test,
	    size_t size, size_t n, size_t keyspace, struct rb_result *res);

#endif
