/* Per-namespace usage and the Prometheus exposition; see metrics.h. */
#include "metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>

#include "events.h"
#include "hist.h"
#include "http.h"
#include "kvtext.h"
#include "ops.h"
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

/* A label value with \, " and newline escaped (the exposition format's
 * only escapes). The names that reach here are checked text already (pool
 * names, namespaces); should anything else slip in, other control
 * characters and bytes that are not UTF-8 are written as '?', so that no
 * value can forge a line or break a strict scraper. */
static void label(FILE *f, const char *name, const char *v, int first)
{
	size_t left = strlen(v), n, run;

	if (!first)
		fputc(',', f);
	fputs(name, f);
	fputs("=\"", f);
	while (left) {
		unsigned char c;

		/* The longest run that goes out as it is, in one write: a whole
		 * name, usually (a write per character was a quarter of the
		 * CPU time of a page of 1,000 pools' exposition). */
		for (run = 0; run < left; run += n) {
			c = (unsigned char)v[run];
			if (c == '\\' || c == '"' || c < 0x20 || c == 0x7f)
				break;
			if (!(n = kv_utf8_len((const unsigned char *)v + run, left - run)))
				break;
		}
		fwrite(v, 1, run, f);
		v += run;
		left -= run;
		if (!left)
			break;
		/* What ended the run: an escape, or '?'. */
		c = (unsigned char)*v;
		n = kv_utf8_len((const unsigned char *)v, left);
		if (c == '\\')
			fputs("\\\\", f);
		else if (c == '"')
			fputs("\\\"", f);
		else if (c == '\n')
			fputs("\\n", f);
		else
			fputc('?', f);
		if (!n)
			n = 1;
		v += n;
		left -= n;
	}
	fputc('"', f);
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

/* ---- the families --------------------------------------------------------
 *
 * The exposition is a list of families, each a header (# HELP, # TYPE) and
 * its items: one for a daemon-wide figure, one per pool (by id), per tier or
 * per namespace (by id), each item one or a few sample lines. A page stops
 * between two items (kv_metrics_page), and its position says where the next
 * one starts: family << 32 | item, item 0 being the header, item k + 1 the
 * pool, tier or namespace k (namespaces: their id, from 1). */

enum fam_kind { F_ONE, F_POOL, F_TIER, F_NS, F_OP, F_G4 };

/* What a page is written from, gathered once per page. */
struct expo {
	const struct kv_daemon *d;
	struct kv_ns_usage *u;           /* per namespace id */
	struct kv_tier_stats st[KV_NTIERS];
	int nt;                          /* tiers shown */
	uint64_t pages_total, pages_free, page_bytes;
	struct kv_queue_stats q;         /* what waits in the connections */
	struct kv_g4_stats g4;
	int g4on;                        /* G4 configured: its families have samples */
};

struct fam {
	const char *name, *type, *help;
	enum fam_kind kind;
	/* Writes item k's samples (k: the pool id, tier or namespace id). */
	void (*item)(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k);
	size_t off;                      /* in kv_pool_counts or kv_tier_stats */
};

static const char *const states[] = { "free", "writable", "sealed", "cached" };
static const char *const tier_label[] = { "G1", "G2", "G3" };

static void one_info(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	(void)fm;
	(void)k;
	fputs("kvcached_info{", f);
	label(f, "version", KV_VERSION, 1);
	label(f, "backend", x->d->be->name, 0);
	fputs("} 1\n", f);
}

static void one_uptime(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	(void)k;
	fprintf(f, "%s %.3f\n", fm->name, (double)(kv_mono_ms() - x->d->start_mono_ms) / 1000.0);
}

static void g4_u64(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	(void)k;
	fprintf(f, "%s %" PRIu64 "\n", fm->name,
		*(const uint64_t *)((const char *)&x->g4 + fm->off));
}

static void g4_hist(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	(void)k;
	kv_hist_write(f, fm->name, "", &x->g4.hist);
}

#define G4(name, type, help, field)                                                 \
	{ name, type, help, F_G4, g4_u64, offsetof(struct kv_g4_stats, field) }

/* The daemon-wide figures, by index (struct fam.off of their rows). */
enum { V_PAGE_BYTES, V_PAGES_TOTAL, V_PAGES_FREE, V_SESSIONS, V_DRAINING, V_REQUESTS, V_ENOSPC,
       V_RELOADS, V_RELOAD_FAILURES, V_FDS_UID_REFUSED };

static void one_u64(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	const struct kv_daemon *d = x->d;
	const uint64_t v[] = {
		[V_PAGE_BYTES] = x->page_bytes, [V_PAGES_TOTAL] = x->pages_total,
		[V_PAGES_FREE] = x->pages_free, [V_SESSIONS] = d->nsessions,
		[V_DRAINING] = (uint64_t)d->draining, [V_REQUESTS] = d->requests,
		[V_ENOSPC] = d->enospc, [V_RELOADS] = d->reloads,
		[V_RELOAD_FAILURES] = d->reload_failures,
		[V_FDS_UID_REFUSED] = d->fds_uid_refused,
	};

	(void)k;
	fprintf(f, "%s %" PRIu64 "\n", fm->name, v[fm->off]);
}

static void pool_states(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	const struct kv_pool *p = kv_pool_get(x->d->pools, k);
	const uint64_t n[] = { p->n.free, p->n.writable, p->n.sealed, p->n.cached };
	int i;

	for (i = 0; i < 4; i++) {
		fprintf(f, "%s{", fm->name);
		pool_labels(f, x->d, p);
		label(f, "state", states[i], 0);
		fprintf(f, "} %" PRIu64 "\n", n[i]);
	}
}

static void pool_block_bytes(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	const struct kv_pool *p = kv_pool_get(x->d->pools, k);

	fprintf(f, "%s{", fm->name);
	pool_labels(f, x->d, p);
	fprintf(f, "} %" PRIu64 "\n", p->block_bytes);
}

/* A counter or gauge of the pool, read by off from its counts. */
static void pool_count(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	const struct kv_pool *p = kv_pool_get(x->d->pools, k);

	fprintf(f, "%s{", fm->name);
	pool_labels(f, x->d, p);
	fprintf(f, "} %" PRIu64 "\n", *(const uint64_t *)((const char *)&p->n + fm->off));
}

static void tier_stat(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	fprintf(f, "%s{", fm->name);
	label(f, "tier", tier_label[k], 1);
	fprintf(f, "} %" PRIu64 "\n", *(const uint64_t *)((const char *)&x->st[k] + fm->off));
}

static void ns_pools(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	fprintf(f, "%s{", fm->name);
	label(f, "namespace", kv_pools_ns_name(x->d->pools, k), 1);
	fprintf(f, "} %" PRIu32 "\n", x->u[k].pools);
}

static void ns_sessions(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	fprintf(f, "%s{", fm->name);
	label(f, "namespace", kv_pools_ns_name(x->d->pools, k), 1);
	fprintf(f, "} %" PRIu32 "\n", x->u[k].sessions);
}

static void ns_blocks(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	const uint64_t n[] = { x->u[k].writable, x->u[k].sealed, x->u[k].cached };
	int i;

	for (i = 0; i < 3; i++) {
		fprintf(f, "%s{", fm->name);
		label(f, "namespace", kv_pools_ns_name(x->d->pools, k), 1);
		label(f, "state", states[i + 1], 0);
		fprintf(f, "} %" PRIu64 "\n", n[i]);
	}
}

static void ns_bytes(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	fprintf(f, "%s{", fm->name);
	label(f, "namespace", kv_pools_ns_name(x->d->pools, k), 1);
	fprintf(f, "} %" PRIu64 "\n", x->u[k].bytes);
}

/* The namespace table's usage and limits (ns.h): per tier, or one value. */
static const struct kv_ns *ns_of(const struct expo *x, uint32_t k)
{
	return kv_ns_get(kv_pools_nstab(x->d->pools), k);
}

static void ns_tiers(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	const struct kv_ns *n = ns_of(x, k);
	const uint64_t *v = (const uint64_t *)((const char *)n + fm->off);

	for (int i = 0; i < KV_NS_TIERS; i++) {
		if (fm->off == offsetof(struct kv_ns, lim.quota) && !v[i])
			continue;   /* no quota there */
		fprintf(f, "%s{", fm->name);
		label(f, "namespace", n->name, 1);
		label(f, "tier", tier_label[i], 0);
		fprintf(f, "} %" PRIu64 "\n", v[i]);
	}
}

static void ns_u64(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	const struct kv_ns *n = ns_of(x, k);

	fprintf(f, "%s{", fm->name);
	label(f, "namespace", n->name, 1);
	fprintf(f, "} %" PRIu64 "\n", *(const uint64_t *)((const char *)n + fm->off));
}

/* ---- latencies and queues (issue 11) ---- */

/* An operation's service time; only operations seen at least once. */
static void op_hist(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	char l[64];

	snprintf(l, sizeof(l), "op=\"%s\"", kv_ops_name(k));
	kv_hist_write(f, fm->name, l, &x->d->op_hist[k]);
}

/* A tier histogram by off (KV_TH_*); promotions by the tier they come from. */
static void tier_hist(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	(void)k;
	if (fm->off == KV_TH_PROMOTE_G2) {
		kv_hist_write(f, fm->name, "from=\"G2\"", kv_tiers_hist(x->d->tiers, KV_TH_PROMOTE_G2));
		kv_hist_write(f, fm->name, "from=\"G3\"", kv_tiers_hist(x->d->tiers, KV_TH_PROMOTE_G3));
	} else {
		kv_hist_write(f, fm->name, "", kv_tiers_hist(x->d->tiers, (int)fm->off));
	}
}

/* A figure of what waits in the connections, by off in kv_queue_stats
 * (~0: the segment fds in flight, the daemon's own count). */
static void one_queue(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	(void)k;
	fprintf(f, "%s %" PRIu64 "\n", fm->name,
		fm->off == (size_t)~0 ? x->d->fds_out
				      : *(const uint64_t *)((const char *)&x->q + fm->off));
}

/* KV events (events.h): daemon-wide counters of the publisher, 0 when off. */
static void one_events(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	struct kv_events_stats st;

	(void)k;
	kv_events_stats(x->d->events, &st);
	fprintf(f, "%s %" PRIu64 "\n", fm->name, *(const uint64_t *)((const char *)&st + fm->off));
}

/* GET /metrics's own counters (http.h) and the loop's turns. */
static void one_http(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	struct kv_http_stats st;

	(void)k;
	kv_http_stats(x->d->http, &st);
	fprintf(f, "%s %" PRIu64 "\n", fm->name, *(const uint64_t *)((const char *)&st + fm->off));
}

/* A kv_http_stats figure in ns, written in seconds. */
static void one_http_seconds(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	struct kv_http_stats st;
	uint64_t ns;

	(void)k;
	kv_http_stats(x->d->http, &st);
	ns = *(const uint64_t *)((const char *)&st + fm->off);
	fprintf(f, "%s %" PRIu64 ".%09" PRIu64 "\n", fm->name, ns / 1000000000u, ns % 1000000000u);
}

static void one_lag(FILE *f, const struct expo *x, const struct fam *fm, uint32_t k)
{
	(void)k;
	kv_hist_write(f, fm->name, "", &x->d->loop.lag);
}

#define HTTP(n, t, h, field) { n, t, h, F_ONE, one_http, offsetof(struct kv_http_stats, field) }
#define EVENTS(n, t, h, field) { n, t, h, F_ONE, one_events, offsetof(struct kv_events_stats, field) }
#define ONE(n, t, h, v) { n, t, h, F_ONE, one_u64, v }
#define POOL(n, t, h, field) { n, t, h, F_POOL, pool_count, offsetof(struct kv_pool_counts, field) }
#define TIER(n, t, h, field) { n, t, h, F_TIER, tier_stat, offsetof(struct kv_tier_stats, field) }

/* Adding a metric: one row here (and an item function if none fits). */
static const struct fam fams[] = {
	{ "kvcached_info", "gauge", "The daemon's version and backend (always 1).", F_ONE,
	  one_info, 0 },
	{ "kvcached_uptime_seconds", "gauge", "Seconds since the daemon started.", F_ONE,
	  one_uptime, 0 },
	ONE("kvcached_page_bytes", "gauge", "Bytes per page.", V_PAGE_BYTES),
	ONE("kvcached_pages", "gauge", "Pages of KV memory, all devices.",
	    V_PAGES_TOTAL),
	ONE("kvcached_pages_free", "gauge", "Pages not assigned to any pool.", V_PAGES_FREE),
	ONE("kvcached_sessions", "gauge", "Open connections, both sockets.", V_SESSIONS),
	ONE("kvcached_draining", "gauge", "1 while the daemon drains before exiting.",
	    V_DRAINING),
	ONE("kvcached_requests_total", "counter", "Requests handled.", V_REQUESTS),
	ONE("kvcached_enospc_total", "counter",
	    "Allocations refused for want of memory after eviction.", V_ENOSPC),
	ONE("kvcached_reloads_total", "counter", "Configuration reloads tried.", V_RELOADS),
	ONE("kvcached_reload_failures_total", "counter",
	    "Configuration reloads refused (invalid configuration).", V_RELOAD_FAILURES),
	{ "kvcached_pool_blocks", "gauge", "Blocks of a pool by state.", F_POOL, pool_states, 0 },
	{ "kvcached_pool_block_bytes", "gauge", "Bytes per block of a pool.", F_POOL,
	  pool_block_bytes, 0 },
	POOL("kvcached_pool_runs", "gauge", "Runs of pages a pool holds.", runs),
	POOL("kvcached_pool_allocs_total", "counter",
	     "Blocks allocated (copy-on-write copies included).", allocs),
	POOL("kvcached_pool_lookups_total", "counter", "Hashes looked up.", lookups),
	POOL("kvcached_pool_hits_total", "counter", "Hashes found by lookups.", hits),
	POOL("kvcached_pool_evictions_total", "counter", "Cached blocks evicted.", evictions),
	POOL("kvcached_pool_dedups_total", "counter", "Seals that found the hash published already.",
	     dedups),
	TIER("kvcached_tier_capacity_bytes", "gauge", "Bytes a tier can hold.", capacity),
	TIER("kvcached_tier_used_bytes", "gauge", "Bytes a tier holds.", used),
	TIER("kvcached_tier_blocks", "gauge", "Blocks a tier holds.", blocks),
	TIER("kvcached_tier_dirty_blocks", "gauge", "Host-tier copies not on disk yet.", dirty),
	TIER("kvcached_tier_inflight", "gauge",
	     "Copies or I/Os under way (G3: and index journal records not written yet).", inflight),
	TIER("kvcached_tier_hits_total", "counter", "Lookups answered from a tier.", hits),
	TIER("kvcached_tier_promotions_total", "counter", "Blocks brought back up into G1.",
	     promotions),
	TIER("kvcached_tier_demotions_total", "counter", "Blocks that arrived in a tier from above.",
	     demotions),
	TIER("kvcached_tier_evictions_total", "counter", "Blocks dropped from a tier.", evictions),
	TIER("kvcached_tier_io_errors_total", "counter", "Failed tier copies and disk I/Os.",
	     io_errors),
	TIER("kvcached_tier_backoffs_total", "counter",
	     "Rounds a tier's failing copies (G2) or disk I/O (G3) stopped starting new ones.",
	     backoffs),
	TIER("kvcached_tier_backing_off", "gauge",
	     "1 from a failed round of a tier's copies (G2) or disk I/O (G3) to the next success.",
	     backing_off),
	TIER("kvcached_tier_checksum_failures_total", "counter",
	     "Disk slots that failed their check (served as misses).", checksum_failures),
	TIER("kvcached_tier_compressed_bytes", "gauge",
	     "Payload bytes of the compressed copies a tier holds (namespace key compress).",
	     comp_bytes),
	TIER("kvcached_tier_compression_saved_bytes", "gauge",
	     "Bytes the compressed copies of a tier would take more uncompressed.", comp_saved),
	{ "kvcached_namespace_pools", "gauge", "Pools of a namespace.", F_NS, ns_pools, 0 },
	{ "kvcached_namespace_sessions", "gauge", "Open connections of a namespace.", F_NS,
	  ns_sessions, 0 },
	{ "kvcached_namespace_blocks", "gauge", "Blocks of a namespace's pools by state.", F_NS,
	  ns_blocks, 0 },
	{ "kvcached_namespace_bytes", "gauge",
	  "Bytes of a namespace's writable, sealed and cached blocks.", F_NS, ns_bytes, 0 },
	{ "kvcached_namespace_used_bytes", "gauge",
	  "What a namespace holds per tier (G1 blocks, G2 and G3 slots).", F_NS, ns_tiers,
	  offsetof(struct kv_ns, used) },
	{ "kvcached_namespace_quota_bytes", "gauge",
	  "A namespace's quota per tier (only where one is set).", F_NS, ns_tiers,
	  offsetof(struct kv_ns, lim.quota) },
	{ "kvcached_namespace_reserve_bytes", "gauge",
	  "G1 bytes other namespaces cannot evict a namespace below.", F_NS, ns_u64,
	  offsetof(struct kv_ns, lim.reserve) },
	{ "kvcached_namespace_lookups_total", "counter", "Hashes a namespace looked up.", F_NS,
	  ns_u64, offsetof(struct kv_ns, lookups) },
	{ "kvcached_namespace_hits_total", "counter", "Of those, found (any tier).", F_NS, ns_u64,
	  offsetof(struct kv_ns, hits) },
	{ "kvcached_namespace_quota_refusals_total", "counter",
	  "Requests a namespace's quota refused (KV_EQUOTA).", F_NS, ns_u64,
	  offsetof(struct kv_ns, quota_refusals) },
	/* Latencies, queues and ENOSPC per namespace (issue 11). */
	{ "kvcached_request_duration_seconds", "histogram",
	  "Daemon-side service time of a request, by operation: from its whole frame received to "
	  "its reply queued (a request parked on a tier: its last run).", F_OP, op_hist, 0 },
	{ "kvcached_promotion_duration_seconds", "histogram",
	  "Promotion copies and reads, start to completion: G2 to G1 copies, G3 to G2 reads.",
	  F_ONE, tier_hist, KV_TH_PROMOTE_G2 },
	{ "kvcached_demotion_duration_seconds", "histogram",
	  "Demotion copies (G1 to G2, one per batch), start to completion.", F_ONE, tier_hist,
	  KV_TH_DEMOTE },
	{ "kvcached_writeback_duration_seconds", "histogram",
	  "Write-backs of G2 copies to G3, submission to completion.", F_ONE, tier_hist,
	  KV_TH_WRITEBACK },
	TIER("kvcached_tier_queued_ios", "gauge",
	     "Disk I/Os waiting for room in the disk ring (G3; disk_queue_depth are in flight).",
	     queued),
	G4("kvcached_g4_fetches_total", "counter", "Lookups that asked G4 (the Redis Cluster).",
	   fetches),
	G4("kvcached_g4_hits_total", "counter", "Blocks found in G4 and checked.", hits),
	G4("kvcached_g4_misses_total", "counter", "G4 fetches that ended on a block not there.",
	   misses),
	G4("kvcached_g4_errors_total", "counter",
	   "Blocks G4 did not answer for (a node down, slow or refusing): misses.", errors),
	G4("kvcached_g4_checksum_failures_total", "counter",
	   "G4 values that did not check out (header, CRC32C): misses, never served.",
	   checksum_failures),
	G4("kvcached_g4_auth_failures_total", "counter",
	   "G4 values of a namespace with remote_key_file whose HMAC tag did not check out "
	   "(forged, or written without the key): misses, never served.", auth_failures),
	G4("kvcached_g4_oversize_total", "counter",
	   "G4 values longer than a block of their pool can be: refused after one byte more, "
	   "misses.", oversize),
	G4("kvcached_g4_read_bytes_total", "counter", "Bytes of values read from G4.", bytes_in),
	G4("kvcached_g4_written_bytes_total", "counter", "Bytes of values written to G4.",
	   bytes_out),
	G4("kvcached_g4_writes_total", "counter", "Blocks written to G4.", writes),
	G4("kvcached_g4_write_errors_total", "counter", "Blocks G4 did not take.", write_errors),
	G4("kvcached_g4_dropped_total", "counter",
	   "Blocks not written to G4: remote_max_inflight was full.", dropped),
	G4("kvcached_g4_throttled_total", "counter",
	   "Blocks not written to G4: remote_write_rate or the namespace's quota_g4.", throttled),
	G4("kvcached_g4_inflight_bytes", "gauge", "Bytes of writes to G4 queued or under way.",
	   inflight_bytes),
	G4("kvcached_g4_redirects_total", "counter", "MOVED and ASK redirects followed.",
	   redirects),
	G4("kvcached_g4_reconnects_total", "counter", "Connections to a G4 node made again.",
	   reconnects),
	G4("kvcached_g4_connect_failures_total", "counter",
	   "Connections to a G4 node that did not come up (AUTH included).", connect_failures),
	G4("kvcached_g4_read_aheads_total", "counter",
	   "G4 fetches a lookup asked for ahead of its need, while it promoted what came before.",
	   read_aheads),
	G4("kvcached_g4_fetching", "gauge", "G4 fetches queued or being read.", fetching),
	G4("kvcached_g4_direct_total", "counter",
	   "G4 blocks read straight into G2 slots reserved for them (no copy on the loop).",
	   direct),
	{ "kvcached_g4_fetch_duration_seconds", "histogram",
	  "G4 fetches, from the lookup's ask to the answer on the daemon's loop.", F_G4, g4_hist,
	  0 },
	{ "kvcached_parked_requests", "gauge",
	  "Requests waiting for a tier (a promotion, G2 staging room, a swap copy).", F_ONE,
	  one_queue, offsetof(struct kv_queue_stats, parked) },
	{ "kvcached_held_requests", "gauge",
	  "Requests waiting for their client to read the segment fds it was sent.", F_ONE,
	  one_queue, offsetof(struct kv_queue_stats, held) },
	{ "kvcached_paused_connections", "gauge",
	  "Connections not read until their client reads its replies "
	  "(max_output_per_connection).", F_ONE, one_queue,
	  offsetof(struct kv_queue_stats, paused) },
	{ "kvcached_output_queued_bytes", "gauge", "Reply bytes queued to clients, not sent yet.",
	  F_ONE, one_queue, offsetof(struct kv_queue_stats, out_bytes) },
	{ "kvcached_connection_buffer_bytes", "gauge",
	  "Input and output buffers the connections hold (max_memory_per_uid, "
	  "max_connection_memory).", F_ONE, one_queue, offsetof(struct kv_queue_stats, conn_bytes) },
	{ "kvcached_connection_memory_closes_total", "counter",
	  "Connections closed because their uid's buffers, or all connections', were over "
	  "max_memory_per_uid or max_connection_memory.", F_ONE, one_queue,
	  offsetof(struct kv_queue_stats, budget_closed) },
	{ "kvcached_segment_fds_in_flight", "gauge",
	  "Segment fds passed to clients and not read by them yet (max_fds_in_flight).", F_ONE,
	  one_queue, (size_t)~0 },
	ONE("kvcached_segment_fds_uid_refusals_total", "counter",
	    "Requests answered EAGAIN: their uid's connections had max_fds_per_uid segment fds "
	    "out.", V_FDS_UID_REFUSED),
	{ "kvcached_namespace_enospc_total", "counter",
	  "Allocations of a namespace refused for want of memory after eviction (KV_ENOSPC).",
	  F_NS, ns_u64, offsetof(struct kv_ns, enospc) },
	{ "kvcached_loop_lag_seconds", "histogram",
	  "Event loop turns, from the completions' arrival to the end of their work: how long a "
	  "request arriving then could wait.", F_ONE, one_lag, 0 },
	HTTP("kvcached_http_expositions_built_total", "counter",
	     "Expositions built for GET /metrics (at most one per metrics_min_interval).", builds),
	{ "kvcached_http_build_cpu_seconds_total", "counter",
	  "CPU time the event loop spent building those (in pages of 64 KiB, one per turn).",
	  F_ONE, one_http_seconds, offsetof(struct kv_http_stats, build_cpu_ns) },
	HTTP("kvcached_http_scrapes_total", "counter", "GET /metrics answered 200.", served),
	HTTP("kvcached_http_evicted_total", "counter",
	     "HTTP connections closed, still sending their request, for a newcomer over "
	     "metrics_max_connections(_per_address).", evicted),
	HTTP("kvcached_http_header_timeouts_total", "counter",
	     "HTTP connections closed: request not whole within metrics_header_timeout.",
	     deadline_closed),
	HTTP("kvcached_http_refused_total", "counter",
	     "HTTP connections closed at once: over a bound, and every other had sent its request.",
	     refused),
	EVENTS("kvcached_events_published_total", "counter",
	       "KV event batches published (one message per topic and loop iteration).", batches),
	EVENTS("kvcached_events_total", "counter",
	       "KV events (BlockStored, BlockRemoved, AllBlocksCleared) in them.", events),
	EVENTS("kvcached_events_dropped_total", "counter",
	       "Batches some subscriber had no room for (events_subscriber_max_bytes; a stalled "
	       "subscriber counted once); replay has them.", dropped),
	EVENTS("kvcached_events_dropped_events_total", "counter",
	       "KV events in the batches of kvcached_events_dropped_total.", dropped_events),
	EVENTS("kvcached_events_dropped_bytes_total", "counter",
	       "Bytes of the batches of kvcached_events_dropped_total.", dropped_bytes),
	EVENTS("kvcached_events_replay_requests_total", "counter", "Replay requests served.",
	       replay_requests),
	EVENTS("kvcached_events_replay_truncated_total", "counter",
	       "Replays cut short: the requester's queue was full.", replay_truncated),
	EVENTS("kvcached_events_replay_bad_total", "counter", "Malformed replay requests ignored.",
	       replay_bad),
	EVENTS("kvcached_events_replay_refused_total", "counter",
	       "Replays refused (the end marker alone): the peer's last replay was still queued, or "
	       "events_replay_max_bytes were in flight.", replay_refused),
	EVENTS("kvcached_events_replay_dropped_total", "counter",
	       "Batches replay requests asked for and did not get (refused or cut short).",
	       replay_dropped),
	EVENTS("kvcached_events_replay_dropped_bytes_total", "counter",
	       "Bytes of the batches of kvcached_events_replay_dropped_total.",
	       replay_dropped_bytes),
	EVENTS("kvcached_events_replay_inflight_bytes", "gauge",
	       "Bytes of replayed batches queued for replay peers (shared with the ring, not "
	       "copied).", replay_inflight_bytes),
	EVENTS("kvcached_events_buffered_batches", "gauge", "Batches held for replay.", buffered),
	EVENTS("kvcached_events_buffered_bytes", "gauge", "Bytes of those batches.", buffered_bytes),
	EVENTS("kvcached_events_no_model_pools_total", "counter",
	       "Pools registered without a model: their events are not published.", no_model),
	EVENTS("kvcached_events_oversize_total", "counter",
	       "Blocks whose token ids and extra keys would pass a batch (64 KiB): published "
	       "without them.", oversize),
	EVENTS("kvcached_events_subscriber_bytes", "gauge",
	       "Bytes of published batches subscribers' queues hold (each batch counted once).",
	       sub_inflight_bytes),
	EVENTS("kvcached_events_blocks_known", "gauge",
	       "Blocks whose Seal's parent, token ids, LoRA and keys their tier moves repeat.",
	       blocks_known),
	EVENTS("kvcached_events_blocks_known_bytes", "gauge", "Memory those records take.",
	       blocks_known_bytes),
};

#define NFAMS (sizeof(fams) / sizeof(fams[0]))

/* The first item of fm at or after k that exists (k: as the item
 * functions take it), in *k; 0 when none is left. */
static int next_item(const struct expo *x, const struct fam *fm, uint32_t *k)
{
	switch (fm->kind) {
	case F_ONE:
		return *k == 0;
	case F_POOL:
		for (; *k < kv_pools_end(x->d->pools); ++*k)
			if (kv_pool_get(x->d->pools, *k))
				return 1;
		return 0;
	case F_TIER:
		return *k < (uint32_t)x->nt;
	case F_NS:
		for (*k = *k ? *k : 1; *k <= KV_MAX_NS; ++*k)
			if (ns_of(x, *k))   /* open: pools, sessions, or declared */
				return 1;
		return 0;
	case F_OP:
		for (; *k < KV_DAEMON_OPS; ++*k)
			if (x->d->op_hist[*k].count)
				return 1;
		return 0;
	case F_G4:
		return *k == 0 && x->g4on;
	}
	return 0;
}

ssize_t kv_metrics_page(const struct kv_daemon *d, uint64_t *pos, size_t limit, char **text)
{
	struct expo x = { .d = d };
	uint64_t at = *pos;
	uint32_t fi = (uint32_t)(at >> 32), item = (uint32_t)at;
	size_t len = 0, page_end = 0, items = 0;
	char *buf = NULL;
	FILE *f;

	*text = NULL;
	if (at == KV_METRICS_DONE || fi >= NFAMS)
		fi = NFAMS;
	if (!(x.u = calloc(KV_MAX_NS + 1, sizeof(*x.u))))
		return -ENOMEM;
	kv_metrics_ns_usage(d, x.u);
	kv_pools_pages(d->pools, &x.pages_total, &x.pages_free, &x.page_bytes);
	kv_tiers_stats(d->tiers, x.st);
	x.g4on = kv_tiers_remote_stats(d->tiers, &x.g4);
	if (d->queue_stats)
		d->queue_stats(d, &x.q);
	x.nt = kv_tiers_on(d->tiers) ? KV_NTIERS : 1;
	if (x.nt == KV_NTIERS && !x.st[KV_TIER_G3].capacity)
		x.nt--;
	if (!(f = open_memstream(&buf, &len))) {
		free(x.u);
		return -ENOMEM;
	}
	/* f is this call's alone: stdio need not lock it for each write
	 * (that was about half of a page's CPU time, the rest formatting). */
	__fsetlocking(f, FSETLOCKING_BYCALLER);
	/* Item by item; past limit, the page ends before the item that went
	 * over (there is always at least one, so that paging goes on). */
	*pos = KV_METRICS_DONE;
	for (; fi < NFAMS; fi++, item = 0) {
		const struct fam *fm = &fams[fi];
		uint32_t k;

		if (item == 0) {
			fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", fm->name, fm->help, fm->name,
				fm->type);
			if (limit && items && (size_t)ftell(f) > limit) {
				*pos = (uint64_t)fi << 32;
				break;
			}
			page_end = (size_t)ftell(f);
			items++;
			item = 1;
		}
		for (k = item - 1; next_item(&x, fm, &k); k++) {
			fm->item(f, &x, fm, k);
			if (limit && items && (size_t)ftell(f) > limit) {
				*pos = (uint64_t)fi << 32 | (k + 1);
				break;
			}
			page_end = (size_t)ftell(f);
			items++;
		}
		if (*pos != KV_METRICS_DONE)
			break;
	}
	free(x.u);
	if (fclose(f) != 0 || !buf) {
		free(buf);
		return -ENOMEM;
	}
	if (*pos == KV_METRICS_DONE)
		page_end = len;
	buf[page_end] = '\0';
	*text = buf;
	return (ssize_t)page_end;
}
