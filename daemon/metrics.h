/* What the daemon counts, for operators: per-namespace usage and the
 * Prometheus text exposition (format 0.0.4) that `kvctl metrics` prints:
 * daemon-wide, per pool, per tier and per namespace.
 *
 * Metric names start with kvcached_; counters end in _total. Labels carry
 * pool ids, namespace and pool names (escaped: \\, \", \n). Adding a metric:
 * one family() call and its samples in kv_metrics_write(). */
#ifndef KV_METRICS_H
#define KV_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "pool.h"

struct kv_daemon;

struct kv_ns_usage {
	uint32_t pools, sessions;
	uint64_t writable, sealed, cached;
	uint64_t bytes;   /* block_bytes of every writable, sealed and cached block */
};

/* Fills u[ns] for every namespace id 1..KV_MAX_NS (u has KV_MAX_NS + 1
 * entries; u[0] counts sessions before Hello). */
void kv_metrics_ns_usage(const struct kv_daemon *d, struct kv_ns_usage *u);

/* Writes the whole exposition to f. Returns 0, or -ENOMEM / -EIO when f
 * fails. */
int kv_metrics_write(const struct kv_daemon *d, FILE *f);

#endif
