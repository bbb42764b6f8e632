/* Latency histograms: a fixed array of log-spaced buckets, the Prometheus
 * histogram shape (_bucket{le=...}, _sum, _count) without allocation.
 *
 * Observing is a clock read, a scan of at most KV_HIST_BOUNDS compares and
 * three additions: cheap enough for every request. The bounds are the same
 * for every histogram (1-2.5-5 steps from 1 us to 10 s), so that operators
 * can compare and aggregate them; what falls past the last bound is counted
 * in +Inf only.
 *
 * Single-threaded, like everything the loop owns: no atomics. */
#ifndef KV_HIST_H
#define KV_HIST_H

#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "kvclock.h"

#define KV_HIST_BOUNDS 22

struct kv_hist {
	uint64_t count;
	uint64_t sum_ns;
	uint64_t n[KV_HIST_BOUNDS + 1];   /* per bucket, not cumulative; last: +Inf */
};

/* The upper bounds in nanoseconds, ascending. */
extern const uint64_t kv_hist_bounds_ns[KV_HIST_BOUNDS];

/* CLOCK_MONOTONIC in nanoseconds (kvclock.h). */
static inline uint64_t kv_hist_now_ns(void)
{
	return kv_mono_ns();
}

/* Counts one observation of ns nanoseconds. */
static inline void kv_hist_observe(struct kv_hist *h, uint64_t ns)
{
	unsigned i = 0;

	while (i < KV_HIST_BOUNDS && ns > kv_hist_bounds_ns[i])
		i++;
	h->n[i]++;
	h->count++;
	h->sum_ns += ns;
}

/* Counts the time since start_ns (a kv_hist_now_ns() value). */
static inline void kv_hist_since(struct kv_hist *h, uint64_t start_ns)
{
	uint64_t now = kv_hist_now_ns();

	kv_hist_observe(h, now > start_ns ? now - start_ns : 0);
}

/* Writes h's samples in the text exposition format: name_bucket{labels,le=}
 * (cumulative, +Inf last), name_sum (seconds) and name_count. labels is ""
 * or 'key="value"' pairs already escaped, without braces. */
void kv_hist_write(FILE *f, const char *name, const char *labels, const struct kv_hist *h);

#endif
