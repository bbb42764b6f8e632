/* Per-namespace usage and the Prometheus exposition; see metrics.h. */
#include "metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "session.h"
#include "tier.h"

void kv_metrics_ns_usage(const struct kv_daemon *d, struct kv_ns_usage *u)
{
	const struct kv_list *pos;
	uint32_t id;

	memset(u, 0, (KV_MAX_NS + 1) * sizeof(*u));
	for (id = 0; id < kv_pools_end(d->pools); id++) {
		const struct kv_pool *p = kv_pool_get(d->pools, id);
		struct kv_ns_usage *n;

		if (!p)
			continue;
		if (p->ns > KV_MAX_NS)
			continue;
		n = &u[p->ns];
		n->pools++;
		n->writable += p->n.writable;
		n->sealed += p->n.sealed;
		n->cached += p->n.cached;
		n->bytes += (p->n.writable + p->n.sealed + p->n.cached) * p->block_bytes;
	}
	kv_list_for_each(pos, &d->sessions) {
		const struct kv_session *ss = kv_container_of(pos, struct kv_session, link);

		if (ss->ns <= KV_MAX_NS)
			u[ss->ns].sessions++;
	}
}

/* A label value with \, " and newline escaped. */
static void label(FILE *f, const char *name, const char *v, int first)
{
	fprintf(f, "%s%s=\"", first ? "" : ",", name);
	for (; *v; v++) {
		if (*v == '\\')
			fputs("\\\\", f);
		else if (*v == '"')
			fputs("\\\"", f);
		else if (*v == '\n')
			fputs("\\n", f);
		else
			fputc(*v, f);
	}
	fputc('"', f);
}

static void family(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void pool_labels(FILE *f, const struct kv_daemon *d, const struct kv_pool *p)
{
	char id[16], dev[16];

	snprintf(id, sizeof(id), "%" PRIu32, p->id);
	snprintf(dev, sizeof(dev), "%" PRIu32, p->device);
	label(f, "pool", id, 1);
	label(f, "namespace", kv_pools_ns_name(d->pools, p->ns), 0);
	label(f, "name", p->name, 0);
	label(f, "device", dev, 0);
}

/* The first live pool of id *id or above (*id moves to it), or NULL. */
static const struct kv_pool *pool_at(const struct kv_daemon *d, uint32_t *id)
{
	for (; *id < kv_pools_end(d->pools); ++*id) {
		const struct kv_pool *p = kv_pool_get(d->pools, *id);

		if (p)
			return p;
	}
	return NULL;
}

/* One counter or gauge per pool, read by off from its counts. */
static void pool_family(FILE *f, const struct kv_daemon *d, const char *name, const char *type,
			const char *help, size_t off)
{
	const struct kv_pool *p;
	uint32_t id;

	family(f, name, type, help);
	for (id = 0; (p = pool_at(d, &id)); id++) {
		fprintf(f, "%s{", name);
		pool_labels(f, d, p);
		fprintf(f, "} %" PRIu64 "\n", *(const uint64_t *)((const char *)&p->n + off));
	}
}

/* One gauge or counter per tier (G1 always; G2, G3 when configured), read
 * by off from its stats. */
static void tier_family(FILE *f, const struct kv_tier_stats *st, int nt, const char *name,
			const char *type, const char *help, size_t off)
{
	static const char *const tiers[] = { "G1", "G2", "G3" };
	int t;

	family(f, name, type, help);
	for (t = 0; t < nt; t++) {
		fprintf(f, "%s{", name);
		label(f, "tier", tiers[t], 1);
		fprintf(f, "} %" PRIu64 "\n", *(const uint64_t *)((const char *)&st[t] + off));
	}
}

static void tier_families(FILE *f, const struct kv_daemon *d)
{
	struct kv_tier_stats st[KV_NTIERS];
	int nt = kv_tiers_on(d->tiers) ? KV_NTIERS : 1;

	kv_tiers_stats(d->tiers, st);
	if (nt == KV_NTIERS && !st[KV_TIER_G3].capacity)
		nt--;
#define T(name, type, help, field) \
	tier_family(f, st, nt, name, type, help, offsetof(struct kv_tier_stats, field))
	T("kvcached_tier_capacity_bytes", "gauge", "Bytes a tier can hold.", capacity);
	T("kvcached_tier_used_bytes", "gauge", "Bytes a tier holds.", used);
	T("kvcached_tier_blocks", "gauge", "Blocks a tier holds.", blocks);
	T("kvcached_tier_dirty_blocks", "gauge", "Host-tier copies not on disk yet.", dirty);
	T("kvcached_tier_inflight", "gauge", "Copies or I/Os under way.", inflight);
	T("kvcached_tier_hits_total", "counter", "Lookups answered from a tier.", hits);
	T("kvcached_tier_promotions_total", "counter", "Blocks brought back up into G1.",
	  promotions);
	T("kvcached_tier_demotions_total", "counter", "Blocks that arrived in a tier from above.",
	  demotions);
	T("kvcached_tier_evictions_total", "counter", "Blocks dropped from a tier.", evictions);
	T("kvcached_tier_io_errors_total", "counter", "Failed tier copies and disk I/Os.",
	  io_errors);
	T("kvcached_tier_checksum_failures_total", "counter",
	  "Disk slots that failed their check (served as misses).", checksum_failures);
#undef T
}

int kv_metrics_write(const struct kv_daemon *d, FILE *f)
{
	static const char *const states[] = { "free", "writable", "sealed", "cached" };
	struct kv_ns_usage *u = calloc(KV_MAX_NS + 1, sizeof(*u));
	uint64_t total, nfree, page_bytes;
	const struct kv_pool *p;
	uint32_t id, ns;
	int k;

	if (!u)
		return -ENOMEM;
	kv_metrics_ns_usage(d, u);
	kv_pools_pages(d->pools, &total, &nfree, &page_bytes);

	family(f, "kvcached_info", "gauge", "The daemon's version and backend (always 1).");
	fputs("kvcached_info{", f);
	label(f, "version", KV_VERSION, 1);
	label(f, "backend", d->be->name, 0);
	fputs("} 1\n", f);
	family(f, "kvcached_uptime_seconds", "gauge", "Seconds since the daemon started.");
	fprintf(f, "kvcached_uptime_seconds %.3f\n", (double)(kv_now_ms() - d->start_ms) / 1000.0);
	family(f, "kvcached_page_bytes", "gauge", "Bytes per page.");
	fprintf(f, "kvcached_page_bytes %" PRIu64 "\n", page_bytes);
	family(f, "kvcached_pages_total", "gauge", "Pages of KV memory, all devices.");
	fprintf(f, "kvcached_pages_total %" PRIu64 "\n", total);
	family(f, "kvcached_pages_free", "gauge", "Pages not assigned to any pool.");
	fprintf(f, "kvcached_pages_free %" PRIu64 "\n", nfree);
	family(f, "kvcached_sessions", "gauge", "Open connections, both sockets.");
	fprintf(f, "kvcached_sessions %" PRIu32 "\n", d->nsessions);
	family(f, "kvcached_draining", "gauge", "1 while the daemon drains before exiting.");
	fprintf(f, "kvcached_draining %d\n", d->draining);
	family(f, "kvcached_requests_total", "counter", "Requests handled.");
	fprintf(f, "kvcached_requests_total %" PRIu64 "\n", d->requests);
	family(f, "kvcached_enospc_total", "counter",
	       "Allocations refused for want of memory after eviction.");
	fprintf(f, "kvcached_enospc_total %" PRIu64 "\n", d->enospc);
	family(f, "kvcached_reloads_total", "counter", "Configuration reloads tried.");
	fprintf(f, "kvcached_reloads_total %" PRIu64 "\n", d->reloads);
	family(f, "kvcached_reload_failures_total", "counter",
	       "Configuration reloads refused (invalid configuration).");
	fprintf(f, "kvcached_reload_failures_total %" PRIu64 "\n", d->reload_failures);

	family(f, "kvcached_pool_blocks", "gauge", "Blocks of a pool by state.");
	for (id = 0; (p = pool_at(d, &id)); id++) {
		const uint64_t n[] = { p->n.free, p->n.writable, p->n.sealed, p->n.cached };

		for (k = 0; k < 4; k++) {
			fputs("kvcached_pool_blocks{", f);
			pool_labels(f, d, p);
			label(f, "state", states[k], 0);
			fprintf(f, "} %" PRIu64 "\n", n[k]);
		}
	}
	family(f, "kvcached_pool_block_bytes", "gauge", "Bytes per block of a pool.");
	for (id = 0; (p = pool_at(d, &id)); id++) {
		fputs("kvcached_pool_block_bytes{", f);
		pool_labels(f, d, p);
		fprintf(f, "} %" PRIu64 "\n", p->block_bytes);
	}
	pool_family(f, d, "kvcached_pool_runs", "gauge", "Runs of pages a pool holds.",
		    offsetof(struct kv_pool_counts, runs));
	pool_family(f, d, "kvcached_pool_allocs_total", "counter",
		    "Blocks allocated (copy-on-write copies included).",
		    offsetof(struct kv_pool_counts, allocs));
	pool_family(f, d, "kvcached_pool_lookups_total", "counter", "Hashes looked up.",
		    offsetof(struct kv_pool_counts, lookups));
	pool_family(f, d, "kvcached_pool_hits_total", "counter", "Hashes found by lookups.",
		    offsetof(struct kv_pool_counts, hits));
	pool_family(f, d, "kvcached_pool_evictions_total", "counter", "Cached blocks evicted.",
		    offsetof(struct kv_pool_counts, evictions));
	pool_family(f, d, "kvcached_pool_dedups_total", "counter",
		    "Seals that found the hash published already.",
		    offsetof(struct kv_pool_counts, dedups));

	tier_families(f, d);

	family(f, "kvcached_namespace_pools", "gauge", "Pools of a namespace.");
	for (ns = 1; ns <= KV_MAX_NS; ns++) {
		if (!u[ns].pools && !u[ns].sessions)
			continue;
		fputs("kvcached_namespace_pools{", f);
		label(f, "namespace", kv_pools_ns_name(d->pools, ns), 1);
		fprintf(f, "} %" PRIu32 "\n", u[ns].pools);
	}
	family(f, "kvcached_namespace_sessions", "gauge", "Open connections of a namespace.");
	for (ns = 1; ns <= KV_MAX_NS; ns++) {
		if (!u[ns].pools && !u[ns].sessions)
			continue;
		fputs("kvcached_namespace_sessions{", f);
		label(f, "namespace", kv_pools_ns_name(d->pools, ns), 1);
		fprintf(f, "} %" PRIu32 "\n", u[ns].sessions);
	}
	family(f, "kvcached_namespace_blocks", "gauge", "Blocks of a namespace's pools by state.");
	for (ns = 1; ns <= KV_MAX_NS; ns++) {
		const uint64_t n[] = { u[ns].writable, u[ns].sealed, u[ns].cached };

		if (!u[ns].pools && !u[ns].sessions)
			continue;
		for (k = 0; k < 3; k++) {
			fputs("kvcached_namespace_blocks{", f);
			label(f, "namespace", kv_pools_ns_name(d->pools, ns), 1);
			label(f, "state", states[k + 1], 0);
			fprintf(f, "} %" PRIu64 "\n", n[k]);
		}
	}
	family(f, "kvcached_namespace_bytes", "gauge",
	       "Bytes of a namespace's writable, sealed and cached blocks.");
	for (ns = 1; ns <= KV_MAX_NS; ns++) {
		if (!u[ns].pools && !u[ns].sessions)
			continue;
		fputs("kvcached_namespace_bytes{", f);
		label(f, "namespace", kv_pools_ns_name(d->pools, ns), 1);
		fprintf(f, "} %" PRIu64 "\n", u[ns].bytes);
	}
	free(u);
	if (fflush(f) != 0 || ferror(f))
		return -EIO;
	return 0;
}
