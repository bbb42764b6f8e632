/* The operators' operations: Stats, ListClients, Check, Evict, Flush,
 * Drain, Reload, Metrics, Dump. Stats is open to every session (its own
 * namespace only, unless admin); the others need an admin session, which
 * the op table (ops.c) checks before they run. See ops.h. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "events.h"
#include "lifecycle.h"
#include "log.h"
#include "metrics.h"
#include "ops_admin.h"

/* ---- paging (docs/protocol.md, "Paging") ----------------------------------
 *
 * A reply goes in one frame of at most max_frame bytes: the Response around
 * the reply (id, result tag and length) takes under REPLY_SLACK of them. A
 * paged Stats takes namespaces, then pools, while they fit, and says where
 * the next page starts; an unpaged one that does not fit is E2BIG, as is
 * better than a frame the client would refuse. */
#define REPLY_SLACK 64

struct page {
	int paged;
	size_t used, budget;     /* bytes of the reply so far, and the most it may take */
	size_t items;            /* namespaces and pools on it */
};

static size_t varint_bytes(size_t v)
{
	size_t n = 1;

	while (v >= 128) {
		v >>= 7;
		n++;
	}
	return n;
}

/* Whether an element of len bytes, in a repeated field whose tag takes tag
 * bytes, fits the page; counts it if so. The first always fits, so that
 * every page makes progress (one element is far below the smallest
 * max_frame). */
static int page_take(struct page *pg, size_t len, size_t tag)
{
	size_t add = tag + varint_bytes(len) + len;

	if (pg->paged && pg->items && pg->used + add > pg->budget)
		return 0;
	pg->used += add;
	pg->items++;
	return 1;
}

/* The open namespaces (with pools or sessions, or declared in the
 * configuration), from id first on: all for an admin, else the caller's. Returns 1 when all are in, 0 when the page is
 * full (r->next_namespace says where it stopped), or -ENOMEM. */
static int stats_namespaces(struct req *q, Kvcached__StatsReply *r, int admin, uint32_t first,
			    struct page *pg)
{
	struct kv_daemon *d = q->d;
	struct kv_ns_usage *u = malloc((KV_MAX_NS + 1) * sizeof(*u));
	uint32_t ns;
	int rc = 1;

	if (!u)
		return -ENOMEM;
	kv_metrics_ns_usage(d, u);
	r->namespaces = kv_arena_alloc(&d->arena, KV_MAX_NS * sizeof(*r->namespaces));
	for (ns = first ? first : 1; r->namespaces && ns <= KV_MAX_NS; ns++) {
		Kvcached__NamespaceInfo *ni;

		const struct kv_ns *m = kv_ns_get(kv_pools_nstab(d->pools), ns);

		if (!m || (!admin && ns != q->ss->ns))
			continue;
		ni = kv_arena_alloc(&d->arena, sizeof(*ni));
		if (!ni) {
			r->namespaces = NULL;
			break;
		}
		kvcached__namespace_info__init(ni);
		ni->name = (char *)kv_pools_ns_name(d->pools, ns);
		ni->pools = u[ns].pools;
		ni->sessions = u[ns].sessions;
		ni->blocks_writable = u[ns].writable;
		ni->blocks_sealed = u[ns].sealed;
		ni->blocks_cached = u[ns].cached;
		ni->bytes = u[ns].bytes;
		ni->used_g2 = m->used[1];
		ni->used_g3 = m->used[2];
		ni->quota_g1 = m->lim.quota[0];
		ni->quota_g2 = m->lim.quota[1];
		ni->quota_g3 = m->lim.quota[2];
		ni->reserve_g1 = m->lim.reserve;
		ni->priority = m->lim.priority;
		ni->ttl_ms = m->lim.ttl_ms;
		ni->lookups = m->lookups;
		ni->hits = m->hits;
		ni->quota_refusals = m->quota_refusals;
		if (!page_take(pg, kvcached__namespace_info__get_packed_size(ni), 2)) {
			r->next_namespace = ns;
			rc = 0;
			break;
		}
		r->namespaces[r->n_namespaces++] = ni;
	}
	free(u);
	return r->namespaces ? rc : -ENOMEM;
}

/* The pools from id first on (all for an admin, else the caller's
 * namespace's). Returns 1 when all are in, 0 when the page is full
 * (r->next_pool says where it stopped), or -ENOMEM. */
static int stats_pools(struct req *q, Kvcached__StatsReply *r, int admin, uint64_t page_bytes,
		       uint32_t first, struct page *pg)
{
	struct kv_daemon *d = q->d;
	uint32_t id;

	r->pools = kv_arena_alloc(&d->arena, KV_MAX_POOLS * sizeof(*r->pools));
	if (!r->pools)
		return -ENOMEM;
	for (id = first; id < kv_pools_end(d->pools); id++) {
		struct kv_pool *p = kv_pool_get(d->pools, id);
		Kvcached__PoolInfo *pi;

		if (!p)
			continue;
		if (!admin && p->ns != q->ss->ns)
			continue;
		pi = kv_arena_alloc(&d->arena, sizeof(*pi));
		if (!pi)
			return -ENOMEM;
		kvcached__pool_info__init(pi);
		pi->pool_id = p->id;
		pi->namespace_ = (char *)kv_pools_ns_name(d->pools, p->ns);
		pi->name = p->name;
		pi->device = p->device;
		pi->block_bytes = p->block_bytes;
		pi->block_tokens = p->block_tokens;
		pi->dtype = p->dtype;
		pi->compress = (char *)(p->qfmt == KV_QFMT_E4M3   ? "fp8_e4m3"
					: p->qfmt == KV_QFMT_E5M2 ? "fp8_e5m2"
								  : "off");
		pi->run_bytes = (uint64_t)p->run_pages * page_bytes;
		pi->blocks_per_run = p->blocks_per_run;
		pi->runs = p->n.runs;
		pi->blocks_free = p->n.free;
		pi->blocks_writable = p->n.writable;
		pi->blocks_sealed = p->n.sealed;
		pi->blocks_cached = p->n.cached;
		pi->allocs = p->n.allocs;
		pi->lookups = p->n.lookups;
		pi->hits = p->n.hits;
		pi->evictions = p->n.evictions;
		pi->dedups = p->n.dedups;
		if (!page_take(pg, kvcached__pool_info__get_packed_size(pi), 1)) {
			r->next_pool = id;
			return 0;
		}
		r->pools[r->n_pools++] = pi;
	}
	return 1;
}

static int stats_tiers(struct req *q, Kvcached__StatsReply *r)
{
	struct kv_daemon *d = q->d;
	struct kv_tier_stats st[KV_NTIERS];
	int t, nt = kv_tiers_on(d->tiers) ? KV_NTIERS : 1;

	kv_tiers_stats(d->tiers, st);
	r->tiers = kv_arena_alloc(&d->arena, KV_NTIERS * sizeof(*r->tiers));
	if (!r->tiers)
		return -ENOMEM;
	for (t = 0; t < nt; t++) {
		Kvcached__TierInfo *ti;

		if (t == KV_TIER_G3 && !st[t].capacity)
			break;
		if (!(ti = kv_arena_alloc(&d->arena, sizeof(*ti))))
			return -ENOMEM;
		kvcached__tier_info__init(ti);
		ti->tier = (Kvcached__Tier)t;
		ti->capacity_bytes = st[t].capacity;
		ti->used_bytes = st[t].used;
		ti->blocks = st[t].blocks;
		ti->dirty = st[t].dirty;
		ti->hits = st[t].hits;
		ti->promotions = st[t].promotions;
		ti->demotions = st[t].demotions;
		ti->evictions = st[t].evictions;
		ti->io_errors = st[t].io_errors;
		ti->checksum_failures = st[t].checksum_failures;
		ti->inflight = st[t].inflight;
		ti->compressed_bytes = st[t].comp_bytes;
		ti->compression_saved_bytes = st[t].comp_saved;
		r->tiers[r->n_tiers++] = ti;
	}
	return 0;
}

void kv_op_stats(struct req *q, const Kvcached__Stats *m)
{
	struct kv_daemon *d = q->d;
	Kvcached__StatsReply *r = q_alloc(q, sizeof(*r));
	uint64_t total, nfree, page_bytes;
	int admin = kv_session_is_admin(q->ss), rc;
	struct page pg = { .paged = m->page, .budget = d->cfg.max_frame - REPLY_SLACK };
	size_t bytes;

	if (!r)
		return;
	kvcached__stats_reply__init(r);
	kv_pools_pages(d->pools, &total, &nfree, &page_bytes);
	r->version = (char *)KV_VERSION;
	r->backend = (char *)d->be->name;
	r->uptime_ms = kv_mono_ms() - d->start_mono_ms;
	r->page_bytes = page_bytes;
	r->segment_bytes = d->be->segment_bytes;
	r->pages_total = total;
	r->pages_free = nfree;
	r->segments = d->be->segments[0];
	r->sessions = d->nsessions;
	r->requests = d->requests;
	r->enospc = d->enospc;
	r->draining = d->draining;
	r->drain_deadline_ms = d->draining ? kv_daemon_wall_ms(d->drain_deadline_ms) : 0;
	r->reloads = d->reloads;
	r->reload_failures = d->reload_failures;
	r->clients = kv_sessions_clients(d);
	{
		struct kv_g4_stats g;
		Kvcached__RemoteInfo *ri;

		if (kv_tiers_remote_stats(d->tiers, &g) && (ri = q_alloc(q, sizeof(*ri)))) {
			kvcached__remote_info__init(ri);
			ri->fetches = g.fetches;
			ri->hits = g.hits;
			ri->misses = g.misses;
			ri->errors = g.errors;
			ri->checksum_failures = g.checksum_failures;
			ri->bytes_in = g.bytes_in;
			ri->bytes_out = g.bytes_out;
			ri->writes = g.writes;
			ri->write_errors = g.write_errors;
			ri->dropped = g.dropped;
			ri->throttled = g.throttled;
			ri->inflight_bytes = g.inflight_bytes;
			ri->redirects = g.redirects;
			ri->reconnects = g.reconnects;
			ri->connect_failures = g.connect_failures;
			ri->read_aheads = g.read_aheads;
			ri->fetching = g.fetching;
			ri->direct = g.direct;
			r->remote = ri;
		}
	}
	if (d->events) {
		struct kv_events_stats es;
		Kvcached__EventsInfo *ei = q_alloc(q, sizeof(*ei));

		kv_events_stats(d->events, &es);
		if (ei) {
			kvcached__events_info__init(ei);
			ei->batches = es.batches;
			ei->events = es.events;
			ei->dropped = es.dropped;
			ei->dropped_events = es.dropped_events;
			ei->dropped_bytes = es.dropped_bytes;
			ei->replay_requests = es.replay_requests;
			ei->replay_refused = es.replay_refused;
			ei->replay_truncated = es.replay_truncated;
			ei->replay_bad = es.replay_bad;
			ei->replay_dropped = es.replay_dropped;
			ei->replay_dropped_bytes = es.replay_dropped_bytes;
			ei->replay_inflight_bytes = es.replay_inflight_bytes;
			ei->buffered = es.buffered;
			ei->buffered_bytes = es.buffered_bytes;
			ei->no_model = es.no_model;
			ei->oversize = es.oversize;
			ei->sub_inflight_bytes = es.sub_inflight_bytes;
			ei->blocks_known = es.blocks_known;
			ei->blocks_known_bytes = es.blocks_known_bytes;
			r->events = ei;
		}
	}
	if (stats_tiers(q, r) < 0) {
		q->out = KV_OP_NOMEM;
		return;
	}
	/* Every page carries the daemon-wide fields and the tiers; the paging
	 * fields, at their largest, are counted from the start. */
	pg.used = kvcached__stats_reply__get_packed_size(r) + 3 + 2 * (2 + 5);
	rc = stats_namespaces(q, r, admin, m->page ? m->first_namespace : 0, &pg);
	if (rc == 1) {
		r->next_namespace = KV_MAX_NS + 1;
		rc = stats_pools(q, r, admin, page_bytes, m->page ? m->first_pool : 0, &pg);
		if (rc == 1)
			r->next_pool = kv_pools_end(d->pools);
	} else if (rc == 0) {
		r->next_pool = m->first_pool;
	}
	if (rc < 0) {
		q->out = KV_OP_NOMEM;
		return;
	}
	r->more = rc == 0;
	if (!m->page) {
		r->next_namespace = r->next_pool = 0;
		bytes = kvcached__stats_reply__get_packed_size(r);
		if (bytes + REPLY_SLACK > d->cfg.max_frame) {
			kv_op_fail(q, KVCACHED__ERROR_CODE__E2BIG, -1,
				   "the stats of %zu namespaces and %zu pools (%zu bytes) do not fit "
				   "max_frame (%" PRIu32 "): ask for them in pages (Stats.page; kvctl "
				   "does)", r->n_namespaces, r->n_pools, bytes, d->cfg.max_frame);
			return;
		}
	}
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_STATS;
	q->rs->stats = r;
}

void kv_op_clients(struct req *q)
{
	struct kv_daemon *d = q->d;
	Kvcached__ClientsReply *r;
	struct kv_list *pos;

	if (!(r = q_alloc(q, sizeof(*r))))
		return;
	kvcached__clients_reply__init(r);
	if (!(r->clients = q_alloc(q, (d->nsessions + 1) * sizeof(void *))))
		return;
	kv_list_for_each(pos, &d->sessions) {
		struct kv_session *ss = kv_container_of(pos, struct kv_session, link);
		Kvcached__ClientInfo *ci = q_alloc(q, sizeof(*ci));

		if (!ci)
			return;
		kvcached__client_info__init(ci);
		ci->session_id = ss->id;
		ci->pid = ss->cred.pid;
		ci->uid = ss->cred.uid;
		ci->gid = ss->cred.gid;
		ci->namespace_ = (char *)(ss->ns ? kv_pools_ns_name(d->pools, ss->ns) : "");
		ci->name = ss->name;
		ci->refs = ss->refs.refs;
		ci->connected_ms = ss->connected_ms;
		ci->requests = ss->requests;
		ci->admin = ss->admin;
		r->clients[r->n_clients++] = ci;
	}
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_CLIENTS;
	q->rs->clients = r;
}

struct check_ctx {
	struct req *q;
	Kvcached__CheckReply *r;
	size_t cap;
};

static void count_ref(struct kv_block *b, uint32_t count, void *ctx)
{
	(void)ctx;
	b->check += count;
}

static void add_problem(void *ctx, const char *msg)
{
	struct check_ctx *c = ctx;

	if (c->r->n_problems < c->cap && (c->r->problems[c->r->n_problems] = q_strdup(c->q, msg)))
		c->r->n_problems++;
}

/* Runs the whole invariant check, including that each block's refcount is
 * exactly what the sessions and the tiers hold. O(blocks); an operator's
 * tool. */
void kv_op_check(struct req *q)
{
	struct kv_daemon *d = q->d;
	struct check_ctx c = { .q = q, .cap = 100 };
	struct kv_list *pos;
	int problems, lost = 0;

	if (!(c.r = q_alloc(q, sizeof(*c.r))))
		return;
	kvcached__check_reply__init(c.r);
	if (!(c.r->problems = q_alloc(q, c.cap * sizeof(char *))))
		return;
	kv_pools_check_clear(d->pools);
	kv_list_for_each(pos, &d->sessions) {
		struct kv_session *ss = kv_container_of(pos, struct kv_session, link);

		if (kv_sessrefs_each(&ss->refs, count_ref, NULL) && ++lost == 1)
			add_problem(&c, "a session's count of the blocks it owns differs from "
					"the blocks that name it their owner");
		for (uint32_t i = 0; i < ss->npins; i++)
			ss->pins[i]->check++;
		for (uint32_t id = 0; id < KV_MAX_POOLS; id++) {
			struct kv_pool *p;

			if (!(ss->pools[id / 64] >> (id % 64) & 1))
				continue;
			if ((p = kv_pool_get(d->pools, id)))
				p->check_holds++;
			else if (++lost == 1)
				add_problem(&c, "a session registered a pool that does not exist");
		}
	}
	kv_tiers_count_refs(d->tiers);
	problems = lost + kv_pools_check(d->pools, 1, add_problem, &c, &c.r->blocks_checked,
				  kv_tiers_entries(d->tiers));
	problems += kv_tiers_check(d->tiers, add_problem, &c);
	c.r->ok = problems == 0;
	if (problems)
		kv_warn("invariant check: %d problems, first: %s", problems,
			c.r->n_problems ? c.r->problems[0] : "?");
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_CHECK;
	q->rs->check = c.r;
}

void kv_op_evict(struct req *q, const Kvcached__Evict *m)
{
	Kvcached__EvictReply *r;

	if (!(r = q_alloc(q, sizeof(*r))))
		return;
	if (!m->all_pools && !kv_pool_get(q->d->pools, m->pool_id)) {
		kv_op_fail(q, KVCACHED__ERROR_CODE__ENOENT, -1, "no pool %u", m->pool_id);
		return;
	}
	if (m->tier > KVCACHED__TIER__TIER_G3) {
		kv_op_fail(q, KVCACHED__ERROR_CODE__EINVAL, -1, "no tier %d", (int)m->tier);
		return;
	}
	kvcached__evict_reply__init(r);
	r->blocks = kv_tiers_evict(q->d->tiers, (int)m->tier, m->all_pools ? -1 : (int)m->pool_id);
	kv_info("evict of tier G%d, %s: %llu blocks", (int)m->tier + 1,
		m->all_pools ? "all pools" : "one pool", (unsigned long long)r->blocks);
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_EVICT;
	q->rs->evict = r;
}

void kv_op_flush(struct req *q)
{
	Kvcached__FlushReply *r;

	if (!(r = q_alloc(q, sizeof(*r))))
		return;
	kvcached__flush_reply__init(r);
	r->started = kv_tiers_flush(q->d->tiers);
	r->clean = kv_tiers_durable(q->d->tiers);
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_FLUSH;
	q->rs->flush = r;
}

void kv_op_drain(struct req *q, const Kvcached__Drain *m)
{
	struct kv_daemon *d = q->d;
	Kvcached__DrainReply *r;
	char why[64];

	if (!(r = q_alloc(q, sizeof(*r))))
		return;
	kvcached__drain_reply__init(r);
	snprintf(why, sizeof(why), "drain asked by pid %d", (int)q->ss->cred.pid);
	r->already = kv_daemon_drain(d, m->timeout_ms ? m->timeout_ms : d->cfg.drain_timeout_ms,
				     why) == -EALREADY;
	r->clients = kv_sessions_clients(d);
	r->deadline_ms = kv_daemon_wall_ms(d->drain_deadline_ms);
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_DRAIN;
	q->rs->drain = r;
}

struct reload_reply {
	struct req *q;
	Kvcached__ReloadReply *r;
};

static void reload_line(void *ctx, const char *line, int applied)
{
	struct reload_reply *x = ctx;
	char ***list = applied ? &x->r->applied : &x->r->not_applied;
	size_t *n = applied ? &x->r->n_applied : &x->r->n_not_applied;
	char *copy = q_strdup(x->q, line);

	if (!*list)
		*list = q_alloc(x->q, kv_cfg_nkeys * sizeof(char *));
	if (copy && *list && *n < kv_cfg_nkeys)
		(*list)[(*n)++] = copy;
}

void kv_op_reload(struct req *q)
{
	struct reload_reply x = { .q = q };
	char err[512];

	if (!(x.r = q_alloc(q, sizeof(*x.r))))
		return;
	kvcached__reload_reply__init(x.r);
	if (kv_daemon_reload(q->d, reload_line, &x, err, sizeof(err)) < 0) {
		kv_op_fail(q, KVCACHED__ERROR_CODE__ECONFIG, -1, "%s", err);
		return;
	}
	x.r->config_path = (char *)(q->d->src ? q->d->src->path : "");
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_RELOAD;
	q->rs->reload = x.r;
}

void kv_op_metrics(struct req *q, const Kvcached__Metrics *m)
{
	Kvcached__MetricsReply *r;
	uint64_t pos = m->page ? m->first : 0;
	/* The text's field: tag, length (at most 5 bytes); then more and next. */
	size_t limit = m->page ? q->d->cfg.max_frame - REPLY_SLACK - 6 - 2 - 11 : 0;
	char *text = NULL;
	ssize_t len;

	if (!(r = q_alloc(q, sizeof(*r))))
		return;
	kvcached__metrics_reply__init(r);
	len = kv_metrics_page(q->d, &pos, limit, &text);
	if (len < 0) {
		q->out = KV_OP_NOMEM;
		return;
	}
	r->text = q_strdup(q, text);
	free(text);
	if (!r->text)
		return;
	r->more = pos != KV_METRICS_DONE;
	r->next = r->more ? pos : 0;
	/* Unpaged, the reply must fit the client's frame limit. */
	if (!m->page && (size_t)len + REPLY_SLACK + 6 > q->d->cfg.max_frame) {
		kv_op_fail(q, KVCACHED__ERROR_CODE__E2BIG, -1,
			   "the metrics (%zd bytes) do not fit max_frame (%" PRIu32 "): ask for "
			   "them in pages (Metrics.page; kvctl does), or raise max_frame", len,
			   q->d->cfg.max_frame);
		return;
	}
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_METRICS;
	q->rs->metrics = r;
}

/* Dump's entries so far: an array in the request arena, grown by doubling. */
struct dump_list {
	struct req *q;
	Kvcached__DumpEntry **es;
	size_t n, cap;
};

static int dump_one(void *arg, uint32_t pool, const uint8_t *hash, unsigned tier)
{
	struct dump_list *l = arg;
	Kvcached__DumpEntry *de;

	if (l->n == l->cap) {
		Kvcached__DumpEntry **ne = q_alloc(l->q, 2 * l->cap * sizeof(*ne));

		if (!ne)
			return -ENOMEM;
		memcpy(ne, l->es, l->n * sizeof(*l->es));
		l->es = ne;
		l->cap *= 2;
	}
	if (!(de = q_alloc(l->q, sizeof(*de))))
		return -ENOMEM;
	kvcached__dump_entry__init(de);
	de->pool_id = pool;
	de->hash.data = (uint8_t *)hash;
	de->hash.len = KV_HASH_BYTES;
	de->tier = (Kvcached__Tier)tier;
	l->es[l->n++] = de;
	return 0;
}

/* Dump: every (pool, hash, tier) of the prefix cache, a page of index
 * buckets at a time: a chain is never split, so a page may pass the
 * estimate by a chain (short: the index keeps a load factor under one). */
void kv_op_dump(struct req *q, const Kvcached__Dump *m)
{
	/* A DumpEntry: tags, pool id, 32-byte hash, tier, lengths: < 48 bytes. */
	size_t max = (q->d->cfg.max_frame - REPLY_SLACK - 16) / 48;
	struct dump_list l = { .q = q, .cap = 64 };
	Kvcached__DumpReply *r;
	uint64_t next;

	if (!(r = q_alloc(q, sizeof(*r))) ||
	    !(l.es = q_alloc(q, l.cap * sizeof(*l.es))))
		return;
	kvcached__dump_reply__init(r);
	next = kv_cache_walk(q->d, m->first, max, dump_one, &l);
	if (q->out == KV_OP_NOMEM)
		return;
	r->entries = l.es;
	r->n_entries = l.n;
	r->more = next != KV_CACHE_WALK_DONE;
	r->next = r->more ? next : 0;
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_DUMP;
	q->rs->dump = r;
}
