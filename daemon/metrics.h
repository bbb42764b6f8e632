/* What the daemon counts, for operators: per-namespace usage and the
 * Prometheus text exposition (format 0.0.4) that `kvctl metrics` prints:
 * daemon-wide, per pool, per tier and per namespace.
 *
 * Metric names start with kvcached_; counters end in _total. Labels carry
 * pool ids, namespace and pool names (escaped: \\, \", \n). Adding a metric:
 * one row in fams[] (metrics.c). */
#ifndef KV_METRICS_H
#define KV_METRICS_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

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

/* Where kv_metrics_page() says the exposition is complete. */
#define KV_METRICS_DONE UINT64_MAX /* = KV_HTTP_PAGE_DONE: http.c serves these pages */

/* A page of the exposition: what follows position *pos (0: the start), as
 * many whole items (a family's header, a daemon-wide sample, one pool's,
 * tier's or namespace's samples) as fit in limit bytes (0: no limit; a page
 * holds at least one item). Pages concatenated in order are the whole
 * exposition, byte for byte (each family once, its samples together), though
 * each reflects the moment it was written. *pos becomes where the next page
 * starts, or KV_METRICS_DONE. Returns the page's length with *text a
 * NUL-terminated malloc()ed string the caller frees, or -ENOMEM. */
ssize_t kv_metrics_page(const struct kv_daemon *d, uint64_t *pos, size_t limit, char **text);

#endif
