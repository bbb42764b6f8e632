/* kvctl status, pools, clients and metrics: views of the Stats and
 * ListClients replies, as tables or JSON. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvctl.h"

void json_pool(struct json *j, const Kvcached__PoolInfo *p)
{
	json_open(j, '{');
	json_u64(j, "pool_id", p->pool_id);
	json_str(j, "namespace", p->namespace_);
	json_str(j, "name", p->name);
	json_u64(j, "device", p->device);
	json_u64(j, "block_bytes", p->block_bytes);
	json_u64(j, "block_tokens", p->block_tokens);
	json_str(j, "dtype", p->dtype);
	json_str(j, "compress", p->compress && *p->compress ? p->compress : "off");
	json_u64(j, "run_bytes", p->run_bytes);
	json_u64(j, "blocks_per_run", p->blocks_per_run);
	json_u64(j, "runs", p->runs);
	json_u64(j, "blocks_free", p->blocks_free);
	json_u64(j, "blocks_writable", p->blocks_writable);
	json_u64(j, "blocks_sealed", p->blocks_sealed);
	json_u64(j, "blocks_cached", p->blocks_cached);
	json_u64(j, "allocs", p->allocs);
	json_u64(j, "lookups", p->lookups);
	json_u64(j, "hits", p->hits);
	json_ratio(j, "hit_rate", p->hits, p->lookups);
	json_u64(j, "evictions", p->evictions);
	json_u64(j, "dedups", p->dedups);
	json_close(j, '}');
}

static void json_namespaces(struct json *j, const Kvcached__StatsReply *s)
{
	size_t i;

	json_key(j, "namespaces");
	json_open(j, '[');
	for (i = 0; i < s->n_namespaces; i++) {
		const Kvcached__NamespaceInfo *n = s->namespaces[i];

		json_open(j, '{');
		json_str(j, "name", n->name);
		json_u64(j, "pools", n->pools);
		json_u64(j, "sessions", n->sessions);
		json_u64(j, "blocks_writable", n->blocks_writable);
		json_u64(j, "blocks_sealed", n->blocks_sealed);
		json_u64(j, "blocks_cached", n->blocks_cached);
		json_u64(j, "bytes", n->bytes);
		json_key(j, "used");
		json_open(j, '{');
		json_u64(j, "g1", n->bytes);
		json_u64(j, "g2", n->used_g2);
		json_u64(j, "g3", n->used_g3);
		json_close(j, '}');
		json_key(j, "quota");
		json_open(j, '{');
		json_u64(j, "g1", n->quota_g1);
		json_u64(j, "g2", n->quota_g2);
		json_u64(j, "g3", n->quota_g3);
		json_close(j, '}');
		json_u64(j, "reserve_g1", n->reserve_g1);
		json_u64(j, "priority", n->priority);
		json_u64(j, "ttl_ms", n->ttl_ms);
		json_u64(j, "lookups", n->lookups);
		json_u64(j, "hits", n->hits);
		json_ratio(j, "hit_rate", n->hits, n->lookups);
		json_u64(j, "quota_refusals", n->quota_refusals);
		json_close(j, '}');
	}
	json_close(j, ']');
}

/* The daemon-wide fields of a StatsReply, inside an open object. */
void json_stats_fields(struct json *j, const Kvcached__StatsReply *s)
{
	uint64_t lookups = 0, hits = 0;
	size_t i;

	for (i = 0; i < s->n_pools; i++) {
		lookups += s->pools[i]->lookups;
		hits += s->pools[i]->hits;
	}
	json_str(j, "version", s->version);
	json_str(j, "backend", s->backend);
	json_str(j, "state", s->draining ? "draining" : "serving");
	json_u64(j, "drain_deadline_ms", s->drain_deadline_ms);
	json_u64(j, "uptime_ms", s->uptime_ms);
	json_u64(j, "page_bytes", s->page_bytes);
	json_u64(j, "segment_bytes", s->segment_bytes);
	json_u64(j, "pages_total", s->pages_total);
	json_u64(j, "pages_free", s->pages_free);
	json_u64(j, "segments", s->segments);
	json_u64(j, "sessions", s->sessions);
	json_u64(j, "clients", s->clients);
	json_u64(j, "requests", s->requests);
	json_u64(j, "enospc", s->enospc);
	json_u64(j, "lookups", lookups);
	json_u64(j, "hits", hits);
	json_ratio(j, "hit_rate", hits, lookups);
	json_u64(j, "reloads", s->reloads);
	json_u64(j, "reload_failures", s->reload_failures);
}

/* Moves the n elements of *from (an array of a reply to be freed) to the
 * end of *to (*nto of them): the reply they came from then frees only its
 * empty array (protobuf-c frees arrays and elements with free()). */
static void move_items(void ***to, size_t *nto, void ***from, size_t *nfrom)
{
	if (!*nfrom)
		return;
	*to = xrealloc(*to, (*nto + *nfrom) * sizeof(**to));
	memcpy(*to + *nto, *from, *nfrom * sizeof(**to));
	*nto += *nfrom;
	*nfrom = 0;
}

/* The Stats reply, its pages (docs/protocol.md, "Paging") merged into the
 * first: the same reply an unpaged Stats would give, had it fitted. A
 * daemon that does not page answers with one page (more unset). */
Kvcached__Response *get_stats(kvc_conn *c)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Stats st = KVCACHED__STATS__INIT;
	Kvcached__Response *first = NULL, *resp;

	st.page = 1;
	req.op_case = KVCACHED__REQUEST__OP_STATS;
	req.stats = &st;
	for (;;) {
		Kvcached__StatsReply *s;
		int more;

		resp = call(c, &req, KVCACHED__RESPONSE__RESULT_STATS, "stats");
		if (!resp)
			break;
		s = resp->stats;
		more = s->more;
		/* Each page starts past the last one; else the daemon is not
		 * paging as it says it does, and this would never end. */
		if (more && (s->next_namespace < st.first_namespace ||
			     (s->next_namespace == st.first_namespace &&
			      s->next_pool <= st.first_pool))) {
			fprintf(stderr, "kvctl: stats: the daemon's pages do not advance\n");
			kvcached__response__free_unpacked(resp, NULL);
			resp = NULL;
			break;
		}
		st.first_namespace = s->next_namespace;
		st.first_pool = s->next_pool;
		if (!first) {
			first = resp;
		} else {
			Kvcached__StatsReply *f = first->stats;

			move_items((void ***)&f->namespaces, &f->n_namespaces, (void ***)&s->namespaces,
				   &s->n_namespaces);
			move_items((void ***)&f->pools, &f->n_pools, (void ***)&s->pools, &s->n_pools);
			kvcached__response__free_unpacked(resp, NULL);
		}
		if (!more)
			return first;
	}
	if (first)
		kvcached__response__free_unpacked(first, NULL);
	return NULL;
}

Kvcached__Response *get_clients(kvc_conn *c)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__ListClients lc = KVCACHED__LIST_CLIENTS__INIT;

	req.op_case = KVCACHED__REQUEST__OP_LIST_CLIENTS;
	req.list_clients = &lc;
	return call(c, &req, KVCACHED__RESPONSE__RESULT_CLIENTS, "clients");
}

const char *const tier_names[3] = { "G1", "G2", "G3" };

static void json_tier(struct json *j, const Kvcached__TierInfo *t)
{
	json_open(j, '{');
	json_str(j, "tier", t->tier < 3 ? tier_names[t->tier] : "?");
	json_u64(j, "capacity_bytes", t->capacity_bytes);
	json_u64(j, "used_bytes", t->used_bytes);
	json_u64(j, "blocks", t->blocks);
	json_u64(j, "dirty", t->dirty);
	json_u64(j, "hits", t->hits);
	json_u64(j, "promotions", t->promotions);
	json_u64(j, "demotions", t->demotions);
	json_u64(j, "evictions", t->evictions);
	json_u64(j, "io_errors", t->io_errors);
	json_u64(j, "checksum_failures", t->checksum_failures);
	json_u64(j, "inflight", t->inflight);
	json_u64(j, "compressed_bytes", t->compressed_bytes);
	json_u64(j, "compression_saved_bytes", t->compression_saved_bytes);
	json_close(j, '}');
}

static void json_tiers(struct json *j, const Kvcached__StatsReply *s)
{
	const Kvcached__RemoteInfo *g = s->remote;
	size_t i;

	json_key(j, "tiers");
	json_open(j, '[');
	for (i = 0; i < s->n_tiers; i++)
		json_tier(j, s->tiers[i]);
	json_close(j, ']');
	if (!g)
		return;
	json_key(j, "g4");
	json_open(j, '{');
	json_u64(j, "fetches", g->fetches);
	json_u64(j, "hits", g->hits);
	json_u64(j, "misses", g->misses);
	json_u64(j, "errors", g->errors);
	json_u64(j, "checksum_failures", g->checksum_failures);
	json_u64(j, "bytes_in", g->bytes_in);
	json_u64(j, "bytes_out", g->bytes_out);
	json_u64(j, "writes", g->writes);
	json_u64(j, "write_errors", g->write_errors);
	json_u64(j, "dropped", g->dropped);
	json_u64(j, "throttled", g->throttled);
	json_u64(j, "inflight_bytes", g->inflight_bytes);
	json_u64(j, "redirects", g->redirects);
	json_u64(j, "reconnects", g->reconnects);
	json_u64(j, "connect_failures", g->connect_failures);
	json_u64(j, "read_aheads", g->read_aheads);
	json_u64(j, "direct", g->direct);
	json_u64(j, "fetching", g->fetching);
	json_close(j, '}');
}

static void json_events(struct json *j, const Kvcached__EventsInfo *e)
{
	json_open(j, '{');
	json_u64(j, "batches", e->batches);
	json_u64(j, "events", e->events);
	json_key(j, "subscribers");
	json_open(j, '{');
	json_u64(j, "dropped_batches", e->dropped);
	json_u64(j, "dropped_events", e->dropped_events);
	json_u64(j, "dropped_bytes", e->dropped_bytes);
	json_close(j, '}');
	json_key(j, "replay");
	json_open(j, '{');
	json_u64(j, "requests", e->replay_requests);
	json_u64(j, "refused", e->replay_refused);
	json_u64(j, "truncated", e->replay_truncated);
	json_u64(j, "bad", e->replay_bad);
	json_u64(j, "dropped_batches", e->replay_dropped);
	json_u64(j, "dropped_bytes", e->replay_dropped_bytes);
	json_u64(j, "inflight_bytes", e->replay_inflight_bytes);
	json_u64(j, "buffered_batches", e->buffered);
	json_u64(j, "buffered_bytes", e->buffered_bytes);
	json_close(j, '}');
	json_u64(j, "no_model_pools", e->no_model);
	json_u64(j, "oversize_blocks", e->oversize);
	json_u64(j, "subscriber_bytes", e->sub_inflight_bytes);
	json_u64(j, "blocks_known", e->blocks_known);
	json_u64(j, "blocks_known_bytes", e->blocks_known_bytes);
	json_close(j, '}');
}

/* KV events, when configured: what was published, and what subscribers
 * and replays did not get. */
static void events_lines(const Kvcached__EventsInfo *e)
{
	char *a, *b, *c, *d;

	kv_line("published", "%" PRIu64 " batches, %" PRIu64 " events", e->batches, e->events);
	kv_line("dropped", "%" PRIu64 " batches, %" PRIu64 " events, %s (some subscriber had no "
		"room)", e->dropped, e->dropped_events, a = fmt_bytes(e->dropped_bytes));
	kv_line("replays", "%" PRIu64 " served, %" PRIu64 " refused, %" PRIu64 " cut short, %"
		PRIu64 " malformed", e->replay_requests, e->replay_refused, e->replay_truncated,
		e->replay_bad);
	kv_line("unsent", "%" PRIu64 " batches, %s (replays asked for them: refused or cut short)",
		e->replay_dropped, b = fmt_bytes(e->replay_dropped_bytes));
	kv_line("buffered", "%" PRIu64 " batches, %s; %s in flight to replay peers", e->buffered,
		c = fmt_bytes(e->buffered_bytes), d = fmt_bytes(e->replay_inflight_bytes));
	free(a);
	free(b);
	free(c);
	free(d);
	kv_line("queued", "%s in subscribers' queues", a = fmt_bytes(e->sub_inflight_bytes));
	kv_line("no model", "%" PRIu64 " pools (registered without a model: not published)",
		e->no_model);
	kv_line("oversize", "%" PRIu64 " blocks (published without token ids: past a batch)",
		e->oversize);
	kv_line("known", "%" PRIu64 " blocks, %s (what their Seals said, for their tier moves)",
		e->blocks_known, b = fmt_bytes(e->blocks_known_bytes));
	free(a);
	free(b);
}

int cmd_events_stats(kvc_conn *c, const struct args *a)
{
	Kvcached__Response *resp = get_stats(c);
	const Kvcached__EventsInfo *e;

	if (!resp)
		return 1;
	e = resp->stats->events;
	if (!e) {
		kvcached__response__free_unpacked(resp, NULL);
		fputs("kvctl: events: the daemon publishes no KV events (events_endpoint)\n",
		      stderr);
		return 1;
	}
	if (a->fmt == FMT_JSON) {
		struct json j = { 0 };

		json_events(&j, e);
	} else {
		events_lines(e);
	}
	kvcached__response__free_unpacked(resp, NULL);
	return 0;
}

/* G4, when configured: one line of what it did. */
static void g4_line(const Kvcached__StatsReply *s)
{
	const Kvcached__RemoteInfo *g = s->remote;
	char *in, *out;

	if (!g)
		return;
	in = fmt_bytes(g->bytes_in);
	out = fmt_bytes(g->bytes_out);
	printf("\nG4 (Redis Cluster): %" PRIu64 " fetches, %" PRIu64 " blocks hit, %" PRIu64
	       " misses, %" PRIu64 " errors, %" PRIu64 " checksum failures; %" PRIu64
	       " written (%" PRIu64 " failed, %" PRIu64 " dropped, %" PRIu64 " throttled); %s in, "
	       "%s out; %" PRIu64 " redirects, %" PRIu64 " reconnects\n", g->fetches, g->hits,
	       g->misses, g->errors, g->checksum_failures, g->writes, g->write_errors, g->dropped,
	       g->throttled, in, out,
	       g->redirects, g->reconnects);
	free(in);
	free(out);
}

static void tiers_table(const Kvcached__StatsReply *s)
{
	static const char *const head[] = { "TIER", "CAPACITY", "USED", "BLOCKS", "DIRTY", "HITS",
					    "PROMOTED", "DEMOTED", "EVICTED", "IOERR", "CSUMERR",
					    "INFLIGHT" };
	struct table t = { .ncol = 12, .head = head, .align = "lrrrrrrrrrrr" };
	size_t i;
	char *a;

	for (i = 0; i < s->n_tiers; i++) {
		const Kvcached__TierInfo *ti = s->tiers[i];

		cell(&t, "%s", ti->tier < 3 ? tier_names[ti->tier] : "?");
		cell(&t, "%s", a = fmt_bytes(ti->capacity_bytes));
		free(a);
		cell(&t, "%s", a = fmt_pct(ti->used_bytes, ti->capacity_bytes));
		free(a);
		cell(&t, "%" PRIu64, ti->blocks);
		cell(&t, "%" PRIu64, ti->dirty);
		cell(&t, "%" PRIu64, ti->hits);
		cell(&t, "%" PRIu64, ti->promotions);
		cell(&t, "%" PRIu64, ti->demotions);
		cell(&t, "%" PRIu64, ti->evictions);
		cell(&t, "%" PRIu64, ti->io_errors);
		cell(&t, "%" PRIu64, ti->checksum_failures);
		cell(&t, "%" PRIu64, ti->inflight);
	}
	putchar('\n');
	table_print(&t);
	/* Only where some namespace compresses (compress = fp8_e4m3). */
	for (i = 0; i < s->n_tiers; i++) {
		const Kvcached__TierInfo *ti = s->tiers[i];
		char *b;

		if (!ti->compressed_bytes)
			continue;
		a = fmt_bytes(ti->compressed_bytes);
		b = fmt_bytes(ti->compression_saved_bytes);
		printf("%s compressed copies: %s stored, %s saved\n",
		       ti->tier < 3 ? tier_names[ti->tier] : "?", a, b);
		free(a);
		free(b);
	}
}

static void namespaces_table(const Kvcached__StatsReply *s)
{
	static const char *const head[] = { "NAMESPACE", "POOLS", "SESSIONS", "WRITABLE", "SEALED",
					    "CACHED", "BYTES" };
	struct table t = { .ncol = 7, .head = head, .align = "lrrrrrr" };
	size_t i;
	char *a;

	for (i = 0; i < s->n_namespaces; i++) {
		const Kvcached__NamespaceInfo *n = s->namespaces[i];

		cell(&t, "%s", n->name);
		cell(&t, "%" PRIu32, n->pools);
		cell(&t, "%" PRIu32, n->sessions);
		cell(&t, "%" PRIu64, n->blocks_writable);
		cell(&t, "%" PRIu64, n->blocks_sealed);
		cell(&t, "%" PRIu64, n->blocks_cached);
		cell(&t, "%s", a = fmt_bytes(n->bytes));
		free(a);
	}
	table_print(&t);
}

/* The whole Stats reply as one JSON document (status, metrics). */
static int stats_json(kvc_conn *c)
{
	Kvcached__Response *resp = get_stats(c);
	const Kvcached__StatsReply *s;
	struct json j = { 0 };
	size_t i;

	if (!resp)
		return 1;
	s = resp->stats;
	json_open(&j, '{');
	json_stats_fields(&j, s);
	json_namespaces(&j, s);
	json_key(&j, "pools");
	json_open(&j, '[');
	for (i = 0; i < s->n_pools; i++)
		json_pool(&j, s->pools[i]);
	json_close(&j, ']');
	json_tiers(&j, s);
	if (s->events) {
		json_key(&j, "events");
		json_events(&j, s->events);
	}
	json_close(&j, '}');
	kvcached__response__free_unpacked(resp, NULL);
	return 0;
}

int cmd_status(kvc_conn *c, const struct args *a)
{
	Kvcached__Response *resp = get_stats(c);
	const Kvcached__StatsReply *s;
	uint64_t lookups = 0, hits = 0;
	size_t i;

	if (!resp)
		return 1;
	s = resp->stats;
	for (i = 0; i < s->n_pools; i++) {
		lookups += s->pools[i]->lookups;
		hits += s->pools[i]->hits;
	}
	if (a->fmt == FMT_JSON) {
		kvcached__response__free_unpacked(resp, NULL);
		return stats_json(c);
	} else {
		static const char *const phead[] = { "POOL", "NAMESPACE", "NAME", "DEV", "BLOCK",
						     "BLOCKS", "FREE", "CACHED", "HIT" };
		struct table pt = { .ncol = 9, .head = phead, .align = "rllrrrrrr" };
		char *x, *y;

		kv_line("version", "%s", s->version);
		kv_line("backend", "%s", s->backend);
		if (s->draining) {
			kv_line("state", "draining: exits within %s", x = fmt_deadline(s->drain_deadline_ms));
			free(x);
		} else {
			kv_line("state", "serving");
		}
		kv_line("uptime", "%s", x = fmt_duration(s->uptime_ms));
		free(x);
		kv_line("pages", "%" PRIu64 " free of %" PRIu64 " (%s each)", s->pages_free,
			s->pages_total, x = fmt_bytes(s->page_bytes));
		free(x);
		kv_line("segments", "%" PRIu32 " (%s each)", s->segments,
			x = fmt_bytes(s->segment_bytes));
		free(x);
		kv_line("sessions", "%" PRIu32 " (%" PRIu32 " clients)", s->sessions, s->clients);
		kv_line("requests", "%" PRIu64, s->requests);
		kv_line("enospc", "%" PRIu64, s->enospc);
		kv_line("hit rate", "%s (%" PRIu64 " of %" PRIu64 " hashes looked up)",
			x = fmt_pct(hits, lookups), hits, lookups);
		free(x);
		kv_line("reloads", "%" PRIu64 " (%" PRIu64 " refused)", s->reloads,
			s->reload_failures);
		kv_line("pools", "%zu", s->n_pools);
		if (s->n_tiers)
			tiers_table(s);
		g4_line(s);

		for (i = 0; i < s->n_pools; i++) {
			const Kvcached__PoolInfo *p = s->pools[i];

			cell(&pt, "%" PRIu32, p->pool_id);
			cell(&pt, "%s", p->namespace_);
			cell(&pt, "%s", p->name);
			cell(&pt, "%" PRIu32, p->device);
			cell(&pt, "%s", x = fmt_bytes(p->block_bytes));
			free(x);
			cell(&pt, "%" PRIu64, p->runs * p->blocks_per_run);
			cell(&pt, "%" PRIu64, p->blocks_free);
			cell(&pt, "%" PRIu64, p->blocks_cached);
			cell(&pt, "%s", y = fmt_pct(p->hits, p->lookups));
			free(y);
		}
		if (s->n_pools) {
			putchar('\n');
			table_print(&pt);
		}
		if (s->n_namespaces) {
			putchar('\n');
			namespaces_table(s);
		}
		if (s->events) {
			printf("\nKV events:\n");
			events_lines(s->events);
		}
	}
	kvcached__response__free_unpacked(resp, NULL);
	return 0;
}

static void pool_json_row(struct json *j, const void *reply, size_t i)
{
	json_pool(j, ((const Kvcached__StatsReply *)reply)->pools[i]);
}

static void pool_row(struct table *t, const void *reply, size_t i)
{
	const Kvcached__PoolInfo *p = ((const Kvcached__StatsReply *)reply)->pools[i];
	char *x;

	cell(t, "%" PRIu32, p->pool_id);
	cell(t, "%s", p->namespace_);
	cell(t, "%s", p->name);
	cell(t, "%" PRIu32, p->device);
	cell(t, "%s", x = fmt_bytes(p->block_bytes));
	free(x);
	cell(t, "%" PRIu32, p->blocks_per_run);
	cell(t, "%" PRIu64, p->runs);
	cell(t, "%" PRIu64, p->blocks_free);
	cell(t, "%" PRIu64, p->blocks_writable);
	cell(t, "%" PRIu64, p->blocks_sealed);
	cell(t, "%" PRIu64, p->blocks_cached);
	cell(t, "%" PRIu64, p->allocs);
	cell(t, "%s", x = fmt_pct(p->hits, p->lookups));
	free(x);
	cell(t, "%" PRIu64, p->evictions);
	cell(t, "%" PRIu64, p->dedups);
}

int cmd_pools(kvc_conn *c, const struct args *a)
{
	static const char *const head[] = {
		"ID", "NAMESPACE", "NAME", "DEV", "BLOCK", "PER_RUN", "RUNS", "FREE",
		"WRITABLE", "SEALED", "CACHED", "ALLOCS", "HIT", "EVICTIONS", "DEDUPS",
	};
	Kvcached__Response *resp = get_stats(c);
	struct listing l = {
		.key = "pools", .none = "no pools", .json_row = pool_json_row, .table_row = pool_row,
		.table = { .ncol = 15, .head = head, .align = "rllrrrrrrrrrrrr" },
	};

	if (!resp)
		return 1;
	l.reply = resp->stats;
	l.nrows = resp->stats->n_pools;
	listing_print(a, &l);
	kvcached__response__free_unpacked(resp, NULL);
	return 0;
}

/* "used / quota", or "used" alone when there is no quota. */
static char *usage(uint64_t used, uint64_t quota)
{
	char *u = fmt_bytes(used), *q, *out = NULL;

	if (!quota)
		return u;
	q = fmt_bytes(quota);
	if (asprintf(&out, "%s / %s", u, q) < 0)
		out = NULL;
	free(u);
	free(q);
	return out;
}

static void namespaces_json(struct json *j, const void *reply)
{
	json_namespaces(j, reply);
}

static void namespace_row(struct table *t, const void *reply, size_t i)
{
	const Kvcached__NamespaceInfo *n = ((const Kvcached__StatsReply *)reply)->namespaces[i];
	char *x;

	cell(t, "%s", n->name);
	cell(t, "%" PRIu32, n->sessions);
	cell(t, "%" PRIu32, n->pools);
	cell(t, "%s", x = usage(n->bytes, n->quota_g1));
	free(x);
	cell(t, "%s", x = usage(n->used_g2, n->quota_g2));
	free(x);
	cell(t, "%s", x = usage(n->used_g3, n->quota_g3));
	free(x);
	cell(t, "%s", x = n->reserve_g1 ? fmt_bytes(n->reserve_g1) : strdup("-"));
	free(x);
	cell(t, "%" PRIu32, n->priority);
	cell(t, "%s", x = n->ttl_ms ? fmt_duration(n->ttl_ms) : strdup("-"));
	free(x);
	cell(t, "%s", x = fmt_pct(n->hits, n->lookups));
	free(x);
	cell(t, "%" PRIu64, n->quota_refusals);
}

int cmd_namespaces(kvc_conn *c, const struct args *a)
{
	static const char *const head[] = { "NAMESPACE", "SESSIONS", "POOLS", "G1", "G2", "G3",
					    "RESERVE", "PRIO", "TTL", "HIT", "EQUOTA" };
	Kvcached__Response *resp = get_stats(c);
	struct listing l = {
		.none = "no namespaces", .json_doc = namespaces_json, .table_row = namespace_row,
		.table = { .ncol = 11, .head = head, .align = "lrrrrrrrrrr" },
	};

	if (!resp)
		return 1;
	l.reply = resp->stats;
	l.nrows = resp->stats->n_namespaces;
	listing_print(a, &l);
	kvcached__response__free_unpacked(resp, NULL);
	return 0;
}

void json_client(struct json *j, const Kvcached__ClientInfo *ci)
{
	json_open(j, '{');
	json_u64(j, "session_id", ci->session_id);
	json_i64(j, "pid", ci->pid);
	json_u64(j, "uid", ci->uid);
	json_u64(j, "gid", ci->gid);
	json_str(j, "namespace", ci->namespace_);
	json_str(j, "name", ci->name);
	json_str(j, "socket", ci->admin ? "admin" : "worker");
	json_u64(j, "refs", ci->refs);
	json_u64(j, "connected_ms", ci->connected_ms);
	json_u64(j, "requests", ci->requests);
	json_close(j, '}');
}

static void client_json_row(struct json *j, const void *reply, size_t i)
{
	json_client(j, ((const Kvcached__ClientsReply *)reply)->clients[i]);
}

static void client_row(struct table *t, const void *reply, size_t i)
{
	const Kvcached__ClientInfo *ci = ((const Kvcached__ClientsReply *)reply)->clients[i];
	char *x;

	cell(t, "%" PRIu64, ci->session_id);
	cell(t, "%" PRId32, ci->pid);
	cell(t, "%" PRIu32, ci->uid);
	cell(t, "%s", ci->namespace_);
	cell(t, "%s", ci->name);
	cell(t, "%s", ci->admin ? "admin" : "worker");
	cell(t, "%" PRIu64, ci->refs);
	cell(t, "%s", x = fmt_time(ci->connected_ms));
	free(x);
	cell(t, "%" PRIu64, ci->requests);
}

int cmd_clients(kvc_conn *c, const struct args *a)
{
	static const char *const head[] = { "SESSION", "PID", "UID", "NAMESPACE", "NAME",
					    "SOCKET", "REFS", "CONNECTED", "REQUESTS" };
	Kvcached__Response *resp = get_clients(c);
	struct listing l = {
		.key = "clients", .none = "no clients", .json_row = client_json_row,
		.table_row = client_row,
		.table = { .ncol = 9, .head = head, .align = "rrrlllrlr" },
	};

	if (!resp)
		return 1;
	l.reply = resp->clients;
	l.nrows = resp->clients->n_clients;
	listing_print(a, &l);
	kvcached__response__free_unpacked(resp, NULL);
	return 0;
}

/* -o json: the figures of the Prometheus families, from the structured
 * Stats reply (the daemon makes the text from the same numbers): the
 * daemon's fields, and its namespaces, pools and tiers. */
int cmd_metrics(kvc_conn *c, const struct args *a)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Metrics m = KVCACHED__METRICS__INIT;
	Kvcached__Response *resp;

	char *text = NULL;
	size_t len = 0;

	if (a->fmt == FMT_JSON)
		return stats_json(c);
	/* Page after page (docs/protocol.md, "Paging"), printed once all have
	 * come: their texts concatenated are the exposition. */
	m.page = 1;
	req.op_case = KVCACHED__REQUEST__OP_METRICS;
	req.metrics = &m;
	for (;;) {
		size_t n;
		int more;

		resp = call(c, &req, KVCACHED__RESPONSE__RESULT_METRICS, "metrics");
		if (!resp) {
			free(text);
			return 1;
		}
		n = strlen(resp->metrics->text);
		text = xrealloc(text, len + n + 1);
		memcpy(text + len, resp->metrics->text, n + 1);
		len += n;
		more = resp->metrics->more;
		if (more && resp->metrics->next <= m.first) {
			fprintf(stderr, "kvctl: metrics: the daemon's pages do not advance\n");
			kvcached__response__free_unpacked(resp, NULL);
			free(text);
			return 1;
		}
		m.first = resp->metrics->next;
		kvcached__response__free_unpacked(resp, NULL);
		if (!more)
			break;
	}
	fputs(text ? text : "", stdout);
	free(text);
	return 0;
}
