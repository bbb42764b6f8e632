/* kvctl: the operator's tool for a running kvcached (kvctl(8)).
 *
 *   kvctl [-s SOCKET] [-o human|json] COMMAND [OPTIONS]
 *
 * It talks to the admin socket by default (kv_admin_socket_default()): the
 * one next to the worker socket, where admin operations are allowed.
 * Human output is aligned tables for a terminal; -o json is one JSON document
 * for scripts (`top`: one compact document per line and frame). Exit status:
 * 0 success, 1 failure (or `check` finding problems), 2 usage error. Errors
 * are one line on stderr: "kvctl: <what>: <why>".
 *
 * Strings from the daemon are untrusted (any client names itself): human
 * output replaces control characters, JSON output escapes them and replaces
 * invalid UTF-8. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "kvc_internal.h"
#include "units.h"

enum format { FMT_HUMAN, FMT_JSON };

static void *xrealloc(void *p, size_t n)
{
	p = realloc(p, n ? n : 1);
	if (!p) {
		fputs("kvctl: out of memory\n", stderr);
		exit(1);
	}
	return p;
}

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static char *xasprintf(const char *fmt, ...)
{
	va_list ap;
	char *s;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (n < 0) {
		fputs("kvctl: out of memory\n", stderr);
		exit(1);
	}
	return s;
}

/* --- JSON ---------------------------------------------------------------- */

#define JSON_MAX_DEPTH 16

struct json {
	FILE *f;
	bool compact;                   /* one line, no spaces (kvctl top) */
	int depth;
	bool nonempty[JSON_MAX_DEPTH];  /* the container at depth has an item */
	bool after_key;
};

static void json_indent(struct json *j)
{
	int i;

	if (j->compact)
		return;
	fputc('\n', j->f);
	for (i = 0; i < j->depth; i++)
		fputs("  ", j->f);
}

/* Before a value or a key: the comma and the line break. */
static void json_item(struct json *j)
{
	if (j->after_key) {
		j->after_key = false;
		return;
	}
	if (j->depth == 0)
		return;
	if (j->nonempty[j->depth])
		fputc(',', j->f);
	j->nonempty[j->depth] = true;
	json_indent(j);
}

static void json_open(struct json *j, char c)
{
	json_item(j);
	fputc(c, j->f);
	if (j->depth + 1 < JSON_MAX_DEPTH)
		j->depth++;
	j->nonempty[j->depth] = false;
}

static void json_close(struct json *j, char c)
{
	bool nonempty = j->nonempty[j->depth];

	j->depth--;
	if (nonempty)
		json_indent(j);
	fputc(c, j->f);
	if (j->depth == 0)
		fputc('\n', j->f);
}

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
	size_t len, i;
	uint32_t cp;

	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xc2 && s[0] <= 0xdf) {
		len = 2;
		cp = s[0] & 0x1f;
	} else if (s[0] >= 0xe0 && s[0] <= 0xef) {
		len = 3;
		cp = s[0] & 0x0f;
	} else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
		len = 4;
		cp = s[0] & 0x07;
	} else {
		return 0;
	}
	if (n < len)
		return 0;
	for (i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	/* Overlong forms, surrogates, beyond U+10FFFF. */
	if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
	    (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}

static void json_string_raw(FILE *f, const char *str)
{
	const unsigned char *s = (const unsigned char *)(str ? str : "");
	size_t n = strlen((const char *)s);

	fputc('"', f);
	while (n > 0) {
		size_t len;

		switch (*s) {
		case '"': fputs("\\\"", f); break;
		case '\\': fputs("\\\\", f); break;
		case '\b': fputs("\\b", f); break;
		case '\f': fputs("\\f", f); break;
		case '\n': fputs("\\n", f); break;
		case '\r': fputs("\\r", f); break;
		case '\t': fputs("\\t", f); break;
		default:
			if (*s < 0x20 || *s == 0x7f) {
				fprintf(f, "\\u%04x", *s);
				break;
			}
			len = utf8_len(s, n);
			if (len == 0) {
				fputs("\\ufffd", f);
				break;
			}
			fwrite(s, 1, len, f);
			s += len;
			n -= len;
			continue;
		}
		s++;
		n--;
	}
	fputc('"', f);
}

static void json_key(struct json *j, const char *k)
{
	json_item(j);
	json_string_raw(j->f, k);
	fputs(j->compact ? ":" : ": ", j->f);
	j->after_key = true;
}

static void json_str(struct json *j, const char *k, const char *v)
{
	if (k)
		json_key(j, k);
	json_item(j);
	json_string_raw(j->f, v);
}

static void json_u64(struct json *j, const char *k, uint64_t v)
{
	json_key(j, k);
	json_item(j);
	fprintf(j->f, "%" PRIu64, v);
}

static void json_i64(struct json *j, const char *k, int64_t v)
{
	json_key(j, k);
	json_item(j);
	fprintf(j->f, "%" PRId64, v);
}

static void json_bool(struct json *j, const char *k, bool v)
{
	json_key(j, k);
	json_item(j);
	fputs(v ? "true" : "false", j->f);
}

/* A ratio num/den, or null when den is 0. */
static void json_ratio(struct json *j, const char *k, uint64_t num, uint64_t den)
{
	json_key(j, k);
	json_item(j);
	if (den)
		fprintf(j->f, "%.6g", (double)num / (double)den);
	else
		fputs("null", j->f);
}

/* --- human tables -------------------------------------------------------- */

/* A copy of s safe for a terminal: control characters (C0, DEL, C1) and
 * bytes that are not UTF-8 become '?'. */
static char *sanitize(const char *s)
{
	size_t n = strlen(s ? s : ""), i = 0, o = 0;
	char *r = xrealloc(NULL, n + 1);

	while (i < n) {
		const unsigned char *p = (const unsigned char *)s + i;
		size_t len = utf8_len(p, n - i);

		if (len == 0 || *p < 0x20 || *p == 0x7f || (*p == 0xc2 && p[1] < 0xa0)) {
			r[o++] = '?';
			i += len ? len : 1;
		} else {
			memcpy(r + o, p, len);
			o += len;
			i += len;
		}
	}
	r[o] = '\0';
	return r;
}

/* Columns a string takes, counting UTF-8 sequences as one. */
static size_t width(const char *s)
{
	size_t w = 0;

	for (; *s; s++)
		if (((unsigned char)*s & 0xc0) != 0x80)
			w++;
	return w;
}

struct table {
	size_t ncol;
	const char *const *head;
	const char *align;      /* 'l' or 'r' per column */
	char **cell;            /* row-major, owned */
	size_t ncell;
};

/* Appends the next cell (rows fill left to right, then wrap). */
static void cell(struct table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void cell(struct table *t, const char *fmt, ...)
{
	va_list ap;
	char *s, *clean;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (n < 0) {
		fputs("kvctl: out of memory\n", stderr);
		exit(1);
	}
	clean = sanitize(s);
	free(s);
	t->cell = xrealloc(t->cell, (t->ncell + 1) * sizeof(*t->cell));
	t->cell[t->ncell++] = clean;
}

static void table_print(struct table *t, FILE *f)
{
	size_t *w = xrealloc(NULL, t->ncol * sizeof(*w));
	size_t r, k, nrow = t->ncell / t->ncol;

	for (k = 0; k < t->ncol; k++)
		w[k] = width(t->head[k]);
	for (r = 0; r < t->ncell; r++) {
		size_t cw = width(t->cell[r]);

		if (cw > w[r % t->ncol])
			w[r % t->ncol] = cw;
	}
	for (r = 0; r <= nrow; r++) {
		for (k = 0; k < t->ncol; k++) {
			const char *s = r == 0 ? t->head[k] : t->cell[(r - 1) * t->ncol + k];
			size_t pad = w[k] - width(s);
			bool last = k + 1 == t->ncol;

			if (t->align[k] == 'r')
				fprintf(f, "%*s%s", (int)pad, "", s);
			else if (last)
				fputs(s, f);
			else
				fprintf(f, "%s%*s", s, (int)pad, "");
			fputs(last ? "\n" : "  ", f);
		}
	}
	free(w);
	for (r = 0; r < t->ncell; r++)
		free(t->cell[r]);
	free(t->cell);
	t->cell = NULL;
	t->ncell = 0;
}

/* "512 B", "2 MiB", "1.5 GiB". */
static char *fmt_bytes(uint64_t v)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	int u = 0;

	while (u < 6 && v >= (1ull << (10 * (u + 1))))
		u++;
	if (u == 0 || v % (1ull << (10 * u)) == 0)
		return xasprintf("%" PRIu64 " %s", v >> (10 * u), unit[u]);
	return xasprintf("%.1f %s", (double)v / (double)(1ull << (10 * u)), unit[u]);
}

static char *fmt_duration(uint64_t ms)
{
	uint64_t s = ms / 1000;

	if (s >= 86400)
		return xasprintf("%" PRIu64 "d %02" PRIu64 "h %02" PRIu64 "m", s / 86400,
				 s / 3600 % 24, s / 60 % 60);
	if (s >= 3600)
		return xasprintf("%" PRIu64 "h %02" PRIu64 "m %02" PRIu64 "s", s / 3600,
				 s / 60 % 60, s % 60);
	if (s >= 60)
		return xasprintf("%" PRIu64 "m %02" PRIu64 "s", s / 60, s % 60);
	return xasprintf("%" PRIu64 ".%03" PRIu64 "s", s, ms % 1000);
}

static char *fmt_time(uint64_t ms)
{
	time_t t = (time_t)(ms / 1000);
	struct tm tm;
	char buf[64];

	if (!localtime_r(&t, &tm) || !strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm))
		return xasprintf("%" PRIu64, ms);
	return xasprintf("%s", buf);
}

/* "key       value", the value made safe for a terminal. */
static void kv_line(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void kv_line(const char *key, const char *fmt, ...)
{
	va_list ap;
	char *v, *clean;

	va_start(ap, fmt);
	if (vasprintf(&v, fmt, ap) < 0) {
		fputs("kvctl: out of memory\n", stderr);
		exit(1);
	}
	va_end(ap);
	clean = sanitize(v);
	printf("%-10s%s\n", key, clean);
	free(clean);
	free(v);
}

static char *fmt_pct(uint64_t num, uint64_t den)
{
	if (!den)
		return xasprintf("-");
	return xasprintf("%.1f%%", 100.0 * (double)num / (double)den);
}

/* --- talking to the daemon ----------------------------------------------- */

static int fail(kvc_conn *c, const char *what, int err)
{
	const char *msg = c ? kvc_last_error(c) : "";

	fprintf(stderr, "kvctl: %s: %s\n", what, *msg ? msg : kvc_strerror(err));
	return 1;
}

static const char *check_result(const Kvcached__Response *r, const void *arg)
{
	const Kvcached__Response__ResultCase *want = arg;

	return r->result_case == *want ? NULL : "unexpected reply from the daemon";
}

/* Sends req (op set by the caller) and returns the response of the wanted
 * kind, or NULL after printing the error. */
static Kvcached__Response *call(kvc_conn *c, Kvcached__Request *req,
				Kvcached__Response__ResultCase want, const char *what)
{
	Kvcached__Response *resp = NULL;
	int r = kvc_call_check(c, req, check_result, &want, &resp);

	if (r < 0) {
		fail(c, what, r);
		return NULL;
	}
	return resp;
}

/* --- commands ------------------------------------------------------------ */

/* Command-specific options, as bits of struct command.opts. */
enum { O_POOL = 1, O_ALL = 2, O_TIMEOUT = 4, O_WAIT = 8, O_COUNT = 16, O_DELAY = 32, O_TIER = 64 };

struct args {
	enum format fmt;
	const char *sock;
	unsigned used;          /* O_* given */
	uint32_t pool;
	int tier;               /* evict: 0..2 for G1..G3 */
	uint64_t timeout_ms;
	long count;             /* top: frames, 0 = until stopped */
	double delay;           /* top: seconds between frames */
	const char *topic;      /* help COMMAND */
};

static void json_pool(struct json *j, const Kvcached__PoolInfo *p)
{
	json_open(j, '{');
	json_u64(j, "pool_id", p->pool_id);
	json_str(j, "namespace", p->namespace_);
	json_str(j, "name", p->name);
	json_u64(j, "device", p->device);
	json_u64(j, "block_bytes", p->block_bytes);
	json_u64(j, "block_tokens", p->block_tokens);
	json_str(j, "dtype", p->dtype);
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
		json_close(j, '}');
	}
	json_close(j, ']');
}

/* The daemon-wide fields of a StatsReply, inside an open object. */
static void json_stats_fields(struct json *j, const Kvcached__StatsReply *s)
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

static Kvcached__Response *get_stats(kvc_conn *c)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Stats st = KVCACHED__STATS__INIT;

	req.op_case = KVCACHED__REQUEST__OP_STATS;
	req.stats = &st;
	return call(c, &req, KVCACHED__RESPONSE__RESULT_STATS, "stats");
}

static Kvcached__Response *get_clients(kvc_conn *c)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__ListClients lc = KVCACHED__LIST_CLIENTS__INIT;

	req.op_case = KVCACHED__REQUEST__OP_LIST_CLIENTS;
	req.list_clients = &lc;
	return call(c, &req, KVCACHED__RESPONSE__RESULT_CLIENTS, "clients");
}

static const char *const tier_names[] = { "G1", "G2", "G3" };

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
	json_close(j, '}');
}

static void json_tiers(struct json *j, const Kvcached__StatsReply *s)
{
	size_t i;

	json_key(j, "tiers");
	json_open(j, '[');
	for (i = 0; i < s->n_tiers; i++)
		json_tier(j, s->tiers[i]);
	json_close(j, ']');
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
	table_print(&t, stdout);
}

static char *fmt_deadline(uint64_t deadline_ms)
{
	struct timespec ts;
	uint64_t now;

	clock_gettime(CLOCK_REALTIME, &ts);
	now = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
	return xasprintf("%" PRIu64 " s", deadline_ms > now ? (deadline_ms - now + 999) / 1000 : 0);
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
	table_print(&t, stdout);
}

static int cmd_status(kvc_conn *c, const struct args *a)
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
		struct json j = { .f = stdout };

		json_open(&j, '{');
		json_stats_fields(&j, s);
		json_namespaces(&j, s);
		json_key(&j, "pools");
		json_open(&j, '[');
		for (i = 0; i < s->n_pools; i++)
			json_pool(&j, s->pools[i]);
		json_close(&j, ']');
		json_tiers(&j, s);
		json_close(&j, '}');
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
			table_print(&pt, stdout);
		}
		if (s->n_namespaces) {
			putchar('\n');
			namespaces_table(s);
		}
	}
	kvcached__response__free_unpacked(resp, NULL);
	return 0;
}

static int cmd_pools(kvc_conn *c, const struct args *a)
{
	Kvcached__Response *resp = get_stats(c);
	const Kvcached__StatsReply *s;
	size_t i;

	if (!resp)
		return 1;
	s = resp->stats;
	if (a->fmt == FMT_JSON) {
		struct json j = { .f = stdout };

		json_open(&j, '{');
		json_key(&j, "pools");
		json_open(&j, '[');
		for (i = 0; i < s->n_pools; i++)
			json_pool(&j, s->pools[i]);
		json_close(&j, ']');
		json_close(&j, '}');
	} else if (s->n_pools == 0) {
		puts("no pools");
	} else {
		static const char *const head[] = {
			"ID", "NAMESPACE", "NAME", "DEV", "BLOCK", "PER_RUN", "RUNS", "FREE",
			"WRITABLE", "SEALED", "CACHED", "ALLOCS", "HIT", "EVICTIONS", "DEDUPS",
		};
		struct table t = { .ncol = 15, .head = head, .align = "rllrrrrrrrrrrrr" };
		char *x;

		for (i = 0; i < s->n_pools; i++) {
			const Kvcached__PoolInfo *p = s->pools[i];

			cell(&t, "%" PRIu32, p->pool_id);
			cell(&t, "%s", p->namespace_);
			cell(&t, "%s", p->name);
			cell(&t, "%" PRIu32, p->device);
			cell(&t, "%s", x = fmt_bytes(p->block_bytes));
			free(x);
			cell(&t, "%" PRIu32, p->blocks_per_run);
			cell(&t, "%" PRIu64, p->runs);
			cell(&t, "%" PRIu64, p->blocks_free);
			cell(&t, "%" PRIu64, p->blocks_writable);
			cell(&t, "%" PRIu64, p->blocks_sealed);
			cell(&t, "%" PRIu64, p->blocks_cached);
			cell(&t, "%" PRIu64, p->allocs);
			cell(&t, "%s", x = fmt_pct(p->hits, p->lookups));
			free(x);
			cell(&t, "%" PRIu64, p->evictions);
			cell(&t, "%" PRIu64, p->dedups);
		}
		table_print(&t, stdout);
	}
	kvcached__response__free_unpacked(resp, NULL);
	return 0;
}

static void json_client(struct json *j, const Kvcached__ClientInfo *ci)
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

static int cmd_clients(kvc_conn *c, const struct args *a)
{
	Kvcached__Response *resp = get_clients(c);
	const Kvcached__ClientsReply *cr;
	size_t i;

	if (!resp)
		return 1;
	cr = resp->clients;
	if (a->fmt == FMT_JSON) {
		struct json j = { .f = stdout };

		json_open(&j, '{');
		json_key(&j, "clients");
		json_open(&j, '[');
		for (i = 0; i < cr->n_clients; i++)
			json_client(&j, cr->clients[i]);
		json_close(&j, ']');
		json_close(&j, '}');
	} else if (cr->n_clients == 0) {
		puts("no clients");
	} else {
		static const char *const head[] = { "SESSION", "PID", "UID", "NAMESPACE", "NAME",
						    "SOCKET", "REFS", "CONNECTED", "REQUESTS" };
		struct table t = { .ncol = 9, .head = head, .align = "rrrlllrlr" };
		char *x;

		for (i = 0; i < cr->n_clients; i++) {
			const Kvcached__ClientInfo *ci = cr->clients[i];

			cell(&t, "%" PRIu64, ci->session_id);
			cell(&t, "%" PRId32, ci->pid);
			cell(&t, "%" PRIu32, ci->uid);
			cell(&t, "%s", ci->namespace_);
			cell(&t, "%s", ci->name);
			cell(&t, "%s", ci->admin ? "admin" : "worker");
			cell(&t, "%" PRIu64, ci->refs);
			cell(&t, "%s", x = fmt_time(ci->connected_ms));
			free(x);
			cell(&t, "%" PRIu64, ci->requests);
		}
		table_print(&t, stdout);
	}
	kvcached__response__free_unpacked(resp, NULL);
	return 0;
}

static int cmd_check(kvc_conn *c, const struct args *a)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Check ck = KVCACHED__CHECK__INIT;
	Kvcached__Response *resp;
	const Kvcached__CheckReply *cr;
	size_t i;
	int ret;

	req.op_case = KVCACHED__REQUEST__OP_CHECK;
	req.check = &ck;
	resp = call(c, &req, KVCACHED__RESPONSE__RESULT_CHECK, "check");
	if (!resp)
		return 1;
	cr = resp->check;
	if (a->fmt == FMT_JSON) {
		struct json j = { .f = stdout };

		json_open(&j, '{');
		json_bool(&j, "ok", cr->ok);
		json_u64(&j, "blocks_checked", cr->blocks_checked);
		json_key(&j, "problems");
		json_open(&j, '[');
		for (i = 0; i < cr->n_problems; i++)
			json_str(&j, NULL, cr->problems[i]);
		json_close(&j, ']');
		json_close(&j, '}');
	} else if (cr->ok) {
		printf("ok: %" PRIu64 " blocks checked\n", cr->blocks_checked);
	} else {
		printf("FAILED: %zu problem%s in %" PRIu64 " blocks checked\n", cr->n_problems,
		       cr->n_problems == 1 ? "" : "s", cr->blocks_checked);
		for (i = 0; i < cr->n_problems; i++) {
			char *p = sanitize(cr->problems[i]);

			printf("  %s\n", p);
			free(p);
		}
	}
	ret = cr->ok ? 0 : 1;
	kvcached__response__free_unpacked(resp, NULL);
	return ret;
}

static int cmd_evict(kvc_conn *c, const struct args *a)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Evict ev = KVCACHED__EVICT__INIT;
	Kvcached__Response *resp;

	/* Without --pool: every pool. */
	ev.all_pools = !(a->used & O_POOL);
	ev.pool_id = a->pool;
	ev.tier = (Kvcached__Tier)a->tier;
	req.op_case = KVCACHED__REQUEST__OP_EVICT;
	req.evict = &ev;
	resp = call(c, &req, KVCACHED__RESPONSE__RESULT_EVICT, "evict");
	if (!resp)
		return 1;
	if (a->fmt == FMT_JSON) {
		struct json j = { .f = stdout };

		json_open(&j, '{');
		json_str(&j, "tier", tier_names[a->tier]);
		json_u64(&j, "blocks", resp->evict->blocks);
		json_close(&j, '}');
	} else if (ev.all_pools) {
		printf("%s: %" PRIu64 " blocks evicted from every pool\n", tier_names[a->tier],
		       resp->evict->blocks);
	} else {
		printf("%s: %" PRIu64 " blocks evicted from pool %" PRIu32 "\n", tier_names[a->tier],
		       resp->evict->blocks, a->pool);
	}
	kvcached__response__free_unpacked(resp, NULL);
	return 0;
}

static int cmd_flush(kvc_conn *c, const struct args *a)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Flush fl = KVCACHED__FLUSH__INIT;
	Kvcached__Response *resp;
	uint64_t started;
	int waited_ms = 0, clean;

	req.op_case = KVCACHED__REQUEST__OP_FLUSH;
	req.flush = &fl;
	resp = call(c, &req, KVCACHED__RESPONSE__RESULT_FLUSH, "flush");
	if (!resp)
		return 1;
	started = resp->flush->started;
	clean = resp->flush->clean;
	kvcached__response__free_unpacked(resp, NULL);
	/* Wait until every write-back is done (the stats say so). */
	while (!clean && waited_ms < 60000) {
		struct timespec ts = { 0, 10 * 1000 * 1000 };
		Kvcached__Response *st;
		size_t i;

		nanosleep(&ts, NULL);
		waited_ms += 10;
		if (!(st = get_stats(c)))
			return 1;
		clean = 1;
		for (i = 0; i < st->stats->n_tiers; i++)
			if (st->stats->tiers[i]->tier == KVCACHED__TIER__TIER_G2 &&
			    st->stats->tiers[i]->dirty)
				clean = 0;
			else if (st->stats->tiers[i]->tier == KVCACHED__TIER__TIER_G3 &&
				 st->stats->tiers[i]->inflight)
				clean = 0;
		kvcached__response__free_unpacked(st, NULL);
	}
	if (a->fmt == FMT_JSON) {
		struct json j = { .f = stdout };

		json_open(&j, '{');
		json_u64(&j, "started", started);
		json_bool(&j, "clean", clean);
		json_close(&j, '}');
	} else {
		printf("%" PRIu64 " blocks written back; %s\n", started,
		       clean ? "nothing dirty is left" : "still writing after 60 s");
	}
	return clean ? 0 : 1;
}

/* Waits until the daemon closes c (it exits) or until deadline_ms (wall
 * clock) plus a grace of 10 s. Returns 0 or 1 (error printed). */
static int wait_exit(kvc_conn *c, uint64_t deadline_ms)
{
	struct pollfd pfd = { .fd = kvc_conn_fd(c), .events = POLLIN };
	struct timespec ts;
	uint64_t now;
	char b;

	for (;;) {
		int r;

		clock_gettime(CLOCK_REALTIME, &ts);
		now = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
		if (now > deadline_ms + 10000) {
			fputs("kvctl: drain: the daemon is still running 10 s after its deadline\n",
			      stderr);
			return 1;
		}
		r = poll(&pfd, 1, (int)(deadline_ms + 10000 - now));
		if (r < 0 && errno != EINTR) {
			fprintf(stderr, "kvctl: drain: poll: %s\n", strerror(errno));
			return 1;
		}
		/* Nothing is in flight, so readable means EOF. */
		if (r > 0 && recv(pfd.fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) <= 0)
			return 0;
	}
}

static int cmd_drain(kvc_conn *c, const struct args *a)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Drain dr = KVCACHED__DRAIN__INIT;
	Kvcached__Response *resp;
	const Kvcached__DrainReply *d;
	int ret = 0;
	char *x;

	dr.timeout_ms = a->used & O_TIMEOUT ? a->timeout_ms : 0;
	if ((a->used & O_TIMEOUT) && !dr.timeout_ms)
		dr.timeout_ms = 1;   /* 0 means "the configured one" on the wire */
	req.op_case = KVCACHED__REQUEST__OP_DRAIN;
	req.drain = &dr;
	resp = call(c, &req, KVCACHED__RESPONSE__RESULT_DRAIN, "drain");
	if (!resp)
		return 1;
	d = resp->drain;
	if (a->fmt == FMT_JSON) {
		struct json j = { .f = stdout };

		json_open(&j, '{');
		json_bool(&j, "already", d->already);
		json_u64(&j, "clients", d->clients);
		json_u64(&j, "deadline_ms", d->deadline_ms);
		json_close(&j, '}');
	} else {
		printf("%s: %" PRIu32 " client%s left; kvcached exits when they are gone, within "
		       "%s at the latest\n", d->already ? "draining already" : "draining", d->clients,
		       d->clients == 1 ? "" : "s", x = fmt_deadline(d->deadline_ms));
		free(x);
	}
	fflush(stdout);
	if (a->used & O_WAIT) {
		ret = wait_exit(c, d->deadline_ms);
		if (ret == 0 && a->fmt == FMT_HUMAN)
			puts("kvcached has exited");
	}
	kvcached__response__free_unpacked(resp, NULL);
	return ret;
}

static int cmd_reload(kvc_conn *c, const struct args *a)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Reload rl = KVCACHED__RELOAD__INIT;
	Kvcached__Response *resp;
	const Kvcached__ReloadReply *r;
	size_t i;

	req.op_case = KVCACHED__REQUEST__OP_RELOAD;
	req.reload = &rl;
	resp = call(c, &req, KVCACHED__RESPONSE__RESULT_RELOAD, "reload");
	if (!resp)
		return 1;
	r = resp->reload;
	if (a->fmt == FMT_JSON) {
		struct json j = { .f = stdout };

		json_open(&j, '{');
		json_str(&j, "config_path", r->config_path);
		json_key(&j, "applied");
		json_open(&j, '[');
		for (i = 0; i < r->n_applied; i++)
			json_str(&j, NULL, r->applied[i]);
		json_close(&j, ']');
		json_key(&j, "not_applied");
		json_open(&j, '[');
		for (i = 0; i < r->n_not_applied; i++)
			json_str(&j, NULL, r->not_applied[i]);
		json_close(&j, ']');
		json_close(&j, '}');
	} else {
		kv_line("reloaded", "%s", r->config_path[0] ? r->config_path : "(no file)");
		if (!r->n_applied && !r->n_not_applied)
			kv_line("changes", "none");
		for (i = 0; i < r->n_applied; i++)
			kv_line("applied", "%s", r->applied[i]);
		for (i = 0; i < r->n_not_applied; i++)
			kv_line("restart", "%s (not applied: needs a restart)", r->not_applied[i]);
	}
	kvcached__response__free_unpacked(resp, NULL);
	return 0;
}

/* The exposition as JSON: families with their samples. Only parses what
 * kvcached writes (name{labels} value). */
static void metrics_json(const char *text)
{
	struct json j = { .f = stdout };
	const char *p = text;
	bool in_family = false;

	json_open(&j, '{');
	json_key(&j, "metrics");
	json_open(&j, '[');
	while (*p) {
		const char *eol = strchr(p, '\n');
		size_t len = eol ? (size_t)(eol - p) : strlen(p);
		char *line = xasprintf("%.*s", (int)len, p);

		p += len + (eol ? 1 : 0);
		if (!strncmp(line, "# HELP ", 7)) {
			char *name = line + 7, *help = strchr(name, ' ');

			if (in_family) {
				json_close(&j, ']');
				json_close(&j, '}');
			}
			if (help)
				*help++ = '\0';
			json_open(&j, '{');
			json_str(&j, "name", name);
			json_str(&j, "help", help ? help : "");
			in_family = true;
		} else if (!strncmp(line, "# TYPE ", 7) && in_family) {
			char *type = strchr(line + 7, ' ');

			json_str(&j, "type", type ? type + 1 : "untyped");
			json_key(&j, "samples");
			json_open(&j, '[');
		} else if (line[0] && line[0] != '#' && in_family) {
			char *q = line + strcspn(line, "{ "), *val;

			json_open(&j, '{');
			json_key(&j, "labels");
			json_open(&j, '{');
			if (*q == '{') {
				*q++ = '\0';
				while (*q && *q != '}') {
					char *k = q, *v, *o;

					q = strchr(q, '=');
					if (!q || q[1] != '"')
						break;
					*q = '\0';
					v = o = q + 2;
					for (q = v; *q && *q != '"'; q++) {
						if (*q == '\\' && q[1]) {
							q++;
							*o++ = *q == 'n' ? '\n' : *q;
						} else {
							*o++ = *q;
						}
					}
					/* Past the closing quote first: o may
					 * have caught up with it. */
					if (*q)
						q++;
					*o = '\0';
					json_str(&j, k, v);
					if (*q == ',')
						q++;
				}
				q = strchr(q, ' ');
			} else if (*q) {
				*q = '\0';
			}
			json_close(&j, '}');
			val = q ? q + 1 : (char *)"";
			while (*val == ' ')
				val++;
			json_key(&j, "value");
			json_item(&j);
			{
				char *end;
				double d = strtod(val, &end);

				if (end != val && !*end && isfinite(d))
					fputs(val, j.f);
				else
					json_string_raw(j.f, val);
			}
			json_close(&j, '}');
		}
		free(line);
	}
	if (in_family) {
		json_close(&j, ']');
		json_close(&j, '}');
	}
	json_close(&j, ']');
	json_close(&j, '}');
}

static int cmd_metrics(kvc_conn *c, const struct args *a)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Metrics m = KVCACHED__METRICS__INIT;
	Kvcached__Response *resp;

	req.op_case = KVCACHED__REQUEST__OP_METRICS;
	req.metrics = &m;
	resp = call(c, &req, KVCACHED__RESPONSE__RESULT_METRICS, "metrics");
	if (!resp)
		return 1;
	if (a->fmt == FMT_JSON)
		metrics_json(resp->metrics->text);
	else
		fputs(resp->metrics->text, stdout);
	kvcached__response__free_unpacked(resp, NULL);
	return 0;
}

/* --- top ------------------------------------------------------------------ */

static volatile sig_atomic_t top_stop;
static struct termios top_saved;
static bool top_raw;

static void top_signal(int sig)
{
	(void)sig;
	top_stop = 1;
}

static void top_restore(void)
{
	if (top_raw) {
		tcsetattr(0, TCSANOW, &top_saved);
		fputs("\033[?25h", stdout);   /* cursor back */
		fflush(stdout);
		top_raw = false;
	}
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static const Kvcached__PoolInfo *find_pool(const Kvcached__StatsReply *s, uint32_t id)
{
	size_t i;

	for (i = 0; s && i < s->n_pools; i++)
		if (s->pools[i]->pool_id == id)
			return s->pools[i];
	return NULL;
}

static const Kvcached__ClientInfo *find_client(const Kvcached__ClientsReply *cr, uint64_t id)
{
	size_t i;

	for (i = 0; cr && i < cr->n_clients; i++)
		if (cr->clients[i]->session_id == id)
			return cr->clients[i];
	return NULL;
}

/* Per second between two counters; 0 without a previous frame. */
static double rate(uint64_t now, uint64_t before, double dt, bool have)
{
	return have && dt > 0 && now >= before ? (double)(now - before) / dt : 0.0;
}

static void top_frame_json(const Kvcached__StatsReply *s, const Kvcached__StatsReply *ps,
			   const Kvcached__ClientsReply *cr, double dt)
{
	struct json j = { .f = stdout, .compact = true };
	struct timespec ts;
	size_t i;

	clock_gettime(CLOCK_REALTIME, &ts);
	json_open(&j, '{');
	json_u64(&j, "time_ms", (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000);
	json_stats_fields(&j, s);
	json_key(&j, "requests_per_s");
	json_item(&j);
	fprintf(j.f, "%.3f", rate(s->requests, ps ? ps->requests : 0, dt, ps != NULL));
	json_key(&j, "pools");
	json_open(&j, '[');
	for (i = 0; i < s->n_pools; i++)
		json_pool(&j, s->pools[i]);
	json_close(&j, ']');
	json_key(&j, "clients");
	json_open(&j, '[');
	for (i = 0; cr && i < cr->n_clients; i++)
		json_client(&j, cr->clients[i]);
	json_close(&j, ']');
	json_close(&j, '}');
}

static void top_frame_human(const Kvcached__StatsReply *s, const Kvcached__StatsReply *ps,
			    const Kvcached__ClientsReply *cr, const Kvcached__ClientsReply *pcr,
			    double dt, bool tty, int rows)
{
	static const char *const phead[] = { "POOL", "NAMESPACE", "NAME", "BLOCK", "BLOCKS",
					     "WRITABLE", "SEALED", "CACHED", "ALLOC/s", "LOOKUP/s",
					     "HIT", "EVICT/s" };
	static const char *const chead[] = { "SESSION", "PID", "UID", "NAMESPACE", "NAME", "REFS",
					     "REQ/s" };
	struct table pt = { .ncol = 12, .head = phead, .align = "rllrrrrrrrrr" };
	struct table ct = { .ncol = 7, .head = chead, .align = "rrrllrr" };
	uint64_t used = s->pages_total - s->pages_free;
	bool have = ps != NULL;
	char *x, *y, clock[16];
	time_t t = time(NULL);
	struct tm tm;
	int lines, shown = 0;
	size_t i;

	localtime_r(&t, &tm);
	strftime(clock, sizeof(clock), "%H:%M:%S", &tm);
	if (tty)
		fputs("\033[H\033[2J", stdout);
	x = fmt_duration(s->uptime_ms);
	printf("kvctl top - %s  kvcached %s (%s), up %s, %s\n", clock, s->version, s->backend, x,
	       s->draining ? "DRAINING" : "serving");
	free(x);
	x = fmt_bytes(used * s->page_bytes);
	y = fmt_bytes(s->pages_total * s->page_bytes);
	printf("memory  %s of %s in use (%.1f%%), %" PRIu64 " of %" PRIu64 " pages free\n", x, y,
	       s->pages_total ? 100.0 * (double)used / (double)s->pages_total : 0.0, s->pages_free,
	       s->pages_total);
	free(x);
	free(y);
	printf("clients %" PRIu32 "  sessions %" PRIu32 "  requests %" PRIu64 " (%.1f/s)  enospc %"
	       PRIu64 "\n\n", s->clients, s->sessions, s->requests,
	       rate(s->requests, have ? ps->requests : 0, dt, have), s->enospc);
	lines = 4;
	for (i = 0; i < s->n_pools; i++) {
		const Kvcached__PoolInfo *p = s->pools[i], *q = find_pool(ps, p->pool_id);

		cell(&pt, "%" PRIu32, p->pool_id);
		cell(&pt, "%s", p->namespace_);
		cell(&pt, "%s", p->name);
		cell(&pt, "%s", x = fmt_bytes(p->block_bytes));
		free(x);
		cell(&pt, "%" PRIu64, p->runs * p->blocks_per_run);
		cell(&pt, "%" PRIu64, p->blocks_writable);
		cell(&pt, "%" PRIu64, p->blocks_sealed);
		cell(&pt, "%" PRIu64, p->blocks_cached);
		cell(&pt, "%.1f", rate(p->allocs, q ? q->allocs : 0, dt, q != NULL));
		cell(&pt, "%.1f", rate(p->lookups, q ? q->lookups : 0, dt, q != NULL));
		cell(&pt, "%s", x = fmt_pct(p->hits, p->lookups));
		free(x);
		cell(&pt, "%.1f", rate(p->evictions, q ? q->evictions : 0, dt, q != NULL));
	}
	if (s->n_pools) {
		table_print(&pt, stdout);
		lines += (int)s->n_pools + 2;
		putchar('\n');
	}
	for (i = 0; cr && i < cr->n_clients; i++) {
		const Kvcached__ClientInfo *ci = cr->clients[i], *pc;

		/* On a terminal, what fits; the rest is counted. */
		if (tty && rows > 0 && lines + shown + 3 > rows)
			break;
		pc = find_client(pcr, ci->session_id);
		cell(&ct, "%" PRIu64, ci->session_id);
		cell(&ct, "%" PRId32, ci->pid);
		cell(&ct, "%" PRIu32, ci->uid);
		cell(&ct, "%s", ci->namespace_);
		cell(&ct, "%s", ci->name);
		cell(&ct, "%" PRIu64, ci->refs);
		cell(&ct, "%.1f", rate(ci->requests, pc ? pc->requests : 0, dt, pc != NULL));
		shown++;
	}
	if (shown)
		table_print(&ct, stdout);
	if (cr && (size_t)shown < cr->n_clients)
		printf("... %zu more sessions\n", cr->n_clients - (size_t)shown);
	if (tty)
		fputs("\n(q to quit)", stdout);
	else
		putchar('\n');
}

static int cmd_top(kvc_conn *c, const struct args *a)
{
	Kvcached__Response *st = NULL, *pst = NULL, *cl = NULL, *pcl = NULL;
	bool tty = isatty(1) && a->fmt == FMT_HUMAN, keys = tty && isatty(0);
	struct sigaction sa;
	double t = 0, pt = 0;
	int ret = 0;
	long i;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = top_signal;   /* no SA_RESTART: the wait returns */
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	if (keys && tcgetattr(0, &top_saved) == 0) {
		struct termios raw = top_saved;

		raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
		raw.c_cc[VMIN] = 0;
		raw.c_cc[VTIME] = 0;
		if (tcsetattr(0, TCSANOW, &raw) == 0) {
			top_raw = true;
			atexit(top_restore);
			fputs("\033[?25l", stdout);   /* no cursor */
		}
	}
	for (i = 0; !top_stop && (a->count == 0 || i < a->count); i++) {
		struct winsize ws = { 0 };
		int rows = 0;

		if (tty && ioctl(1, TIOCGWINSZ, &ws) == 0)
			rows = ws.ws_row;
		st = get_stats(c);
		if (!st) {
			ret = 1;
			break;
		}
		cl = get_clients(c);
		if (!cl) {
			ret = 1;
			break;
		}
		t = now_s();
		if (a->fmt == FMT_JSON)
			top_frame_json(st->stats, pst ? pst->stats : NULL, cl->clients, t - pt);
		else
			top_frame_human(st->stats, pst ? pst->stats : NULL, cl->clients,
					pcl ? pcl->clients : NULL, t - pt, tty, rows);
		fflush(stdout);
		if (pst)
			kvcached__response__free_unpacked(pst, NULL);
		if (pcl)
			kvcached__response__free_unpacked(pcl, NULL);
		pst = st;
		pcl = cl;
		st = cl = NULL;
		pt = t;
		if (a->count && i + 1 >= a->count)
			break;
		/* The delay, cut short by q or a signal. */
		for (double end = now_s() + a->delay; !top_stop;) {
			double left = end - now_s();
			struct pollfd pfd = { .fd = 0, .events = POLLIN };
			char ch;

			if (left <= 0)
				break;
			if (poll(&pfd, keys ? 1 : 0, (int)(left * 1000) + 1) > 0 &&
			    read(0, &ch, 1) == 1 && (ch == 'q' || ch == 'Q'))
				top_stop = 1;
		}
	}
	if (tty)
		putchar('\n');
	top_restore();
	if (st)
		kvcached__response__free_unpacked(st, NULL);
	if (pst)
		kvcached__response__free_unpacked(pst, NULL);
	if (pcl)
		kvcached__response__free_unpacked(pcl, NULL);
	return ret;
}

/* --- command line -------------------------------------------------------- */

struct command {
	const char *name;
	int (*run)(kvc_conn *c, const struct args *a);
	unsigned opts;          /* O_* it takes */
	const char *args;       /* its options, for the usage line */
	const char *summary;
	const char *help;
};

static const struct command commands[] = {
	{ "status", cmd_status, 0, "", "daemon summary, pools and namespaces",
	  "Shows the daemon's version, backend, state (serving or draining) and uptime, its\n"
	  "page and segment usage, sessions and clients, requests, allocation failures\n"
	  "(enospc), the overall hit rate and the reloads, then one line per pool (blocks in\n"
	  "total, free and cached, hit rate) and one per namespace (pools, sessions, blocks\n"
	  "by state, bytes).\n" },
	{ "pools", cmd_pools, 0, "", "per-pool block states and counters",
	  "Shows one row per pool: id, namespace, name, device, block size, blocks per\n"
	  "run and runs held, blocks free / writable / sealed / cached, allocations,\n"
	  "lookup hit rate, evictions and seal deduplications.\n" },
	{ "clients", cmd_clients, 0, "", "connected sessions",
	  "Shows one row per connected session: session id, pid, uid, namespace, the\n"
	  "name the client gave, the socket it came through (worker or admin), block\n"
	  "references held, when it connected and how many requests it made.\n" },
	{ "evict", cmd_evict, O_POOL | O_ALL | O_TIER,
	  " [--tier g1|g2|g3] (--pool ID | --all)", "evict idle blocks of one tier",
	  "Evicts the idle blocks (held by nobody) of one tier, of pool ID or of every\n"
	  "pool, as memory pressure would; blocks that workers hold are never touched.\n"
	  "g1 (the default) demotes every cached device block to the host tier, or\n"
	  "drops it when there is none; g2 drops host-tier copies that are on disk and\n"
	  "writes the others to disk first (dropped when there is no disk tier); g3\n"
	  "drops the disk tier's blocks. Prints how many blocks it acted on.\n\n"
	  "  --tier g1|g2|g3  the tier (default g1); with --tier alone, every pool\n"
	  "  --pool ID        the pool (kvctl pools lists the ids)\n"
	  "  --all            every pool\n" },
	{ "flush", cmd_flush, 0, "", "write the host tier back to disk",
	  "Writes every host-tier block that is not on disk yet to the disk tier and\n"
	  "waits until all writes are done (at most 60 s; exit 1 if not done).\n" },
	{ "drain", cmd_drain, O_TIMEOUT | O_WAIT, " [--timeout DURATION] [--wait]",
	  "stop taking work and exit when clients are gone",
	  "Starts the drain SIGTERM starts: the worker socket stops accepting, new\n"
	  "pools, allocations and lookups are refused (ESHUTDOWN), clients may release\n"
	  "what they hold, and kvcached exits once no client is left or the timeout\n"
	  "passes. A drain under way keeps its deadline.\n\n"
	  "  --timeout DURATION  how long clients may take (default: the drain_timeout\n"
	  "                      key); 500ms, 30s, 2m, a bare number is seconds\n"
	  "  --wait              return only when kvcached has exited\n" },
	{ "reload", cmd_reload, 0, "", "re-read the configuration file",
	  "Makes kvcached read its configuration again, as SIGHUP does, and apply the\n"
	  "keys that can change at run time (log_level, log_target, drain_timeout,\n"
	  "status_interval, worker_socket_admin). Prints each key that changed, and\n"
	  "those that need a restart. An invalid file changes nothing and is an error.\n" },
	{ "check", cmd_check, 0, "", "run the daemon's consistency check",
	  "Asks the daemon to check its invariants (block states, lists, references,\n"
	  "prefix index) and prints \"ok\" or the problems it found. Exits 1 when the\n"
	  "check finds a problem.\n" },
	{ "metrics", cmd_metrics, 0, "", "Prometheus text exposition",
	  "Prints the daemon's metrics in the Prometheus text format (0.0.4): pages,\n"
	  "sessions, requests, enospc, uptime, per pool blocks by state, allocations,\n"
	  "lookups, hits, evictions and dedups, per namespace usage. With -o json, the\n"
	  "same as {\"metrics\": [{name, help, type, samples: [{labels, value}]}]}.\n" },
	{ "top", cmd_top, O_COUNT | O_DELAY, " [-n COUNT] [-d SECONDS]", "live refreshing view",
	  "Shows the daemon's state, pools and clients with rates, refreshed every\n"
	  "SECONDS (default 2), until q or Ctrl-C on a terminal, or COUNT frames.\n"
	  "Not on a terminal, frames follow each other plainly; with -o json, one\n"
	  "compact JSON document per line and frame.\n\n"
	  "  -n, --count COUNT    stop after COUNT frames\n"
	  "  -d, --delay SECONDS  between frames (at least 0.1)\n" },
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *f)
{
	size_t i;

	fputs("Usage: kvctl [-s SOCKET] [-o human|json] COMMAND [OPTIONS]\n"
	      "\n"
	      "Operates a running kvcached daemon through its admin socket.\n"
	      "\n"
	      "Commands:\n", f);
	for (i = 0; i < NCOMMANDS; i++)
		fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].summary);
	fputs("  help      this help, or a command's (kvctl help COMMAND)\n"
	      "\n"
	      "Options:\n"
	      "  -s, --socket PATH    the daemon's admin socket (default: $KVCACHED_ADMIN_SOCKET,\n"
	      "                       else next to the worker socket: /run/kvcached/\n"
	      "                       kvcached-admin.sock for root, else $XDG_RUNTIME_DIR/\n"
	      "                       kvcached-admin.sock, or $KVCACHED_SOCKET with -admin.sock)\n"
	      "  -o, --output FORMAT  human (default) or json\n"
	      "  -h, --help           this help; COMMAND --help for a command's\n"
	      "  -V, --version        kvctl's version\n"
	      "\n"
	      "Exit status: 0 success, 1 failure (or problems found by check), 2 usage error.\n",
	      f);
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("kvctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("; try 'kvctl --help'\n", stderr);
	return 2;
}

/* A duration (units.h) of at most a day. */
static int parse_timeout(const char *s, uint64_t *ms)
{
	return kv_parse_duration(s, ms) < 0 || *ms > 86400000 ? -EINVAL : 0;
}

int main(int argc, char **argv)
{
	enum { OPT_POOL = 1000, OPT_ALL, OPT_TIMEOUT, OPT_WAIT, OPT_TIER };
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "output", required_argument, NULL, 'o' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ "pool", required_argument, NULL, OPT_POOL },
		{ "all", no_argument, NULL, OPT_ALL },
		{ "timeout", required_argument, NULL, OPT_TIMEOUT },
		{ "wait", no_argument, NULL, OPT_WAIT },
		{ "tier", required_argument, NULL, OPT_TIER },
		{ "count", required_argument, NULL, 'n' },
		{ "delay", required_argument, NULL, 'd' },
		{ 0 },
	};
	static const struct { unsigned bit; const char *name; } optnames[] = {
		{ O_POOL, "--pool" }, { O_ALL, "--all" }, { O_TIMEOUT, "--timeout" },
		{ O_WAIT, "--wait" }, { O_COUNT, "--count" }, { O_DELAY, "--delay" },
		{ O_TIER, "--tier" },
	};
	const struct kvc_options copt = { .client_name = "kvctl" };
	struct args a = { .fmt = FMT_HUMAN, .delay = 2.0 };
	const struct command *cmd = NULL;
	char def[108], wdef[108], *what, *end;
	bool help = false;
	kvc_conn *c = NULL;
	unsigned long v;
	int o, r, ret;
	size_t i;

	opterr = 0;
	while ((o = getopt_long(argc, argv, ":s:o:hVn:d:", opts, NULL)) != -1) {
		switch (o) {
		case 's':
			a.sock = optarg;
			break;
		case 'o':
			if (!strcmp(optarg, "human"))
				a.fmt = FMT_HUMAN;
			else if (!strcmp(optarg, "json"))
				a.fmt = FMT_JSON;
			else
				return usage_error("unknown output format '%s' (human or json)",
						   optarg);
			break;
		case 'h':
			help = true;
			break;
		case 'V':
			printf("kvctl %s\n", KV_VERSION);
			return 0;
		case OPT_POOL:
			errno = 0;
			v = strtoul(optarg, &end, 10);
			if (errno || end == optarg || *end || optarg[0] == '-' || v > 4095)
				return usage_error("--pool '%s': a pool id from 0 to 4095", optarg);
			a.pool = (uint32_t)v;
			a.used |= O_POOL;
			break;
		case OPT_ALL:
			a.used |= O_ALL;
			break;
		case OPT_TIMEOUT:
			if (parse_timeout(optarg, &a.timeout_ms) < 0)
				return usage_error("--timeout '%s': a duration like 500ms, 30s or 2m "
						   "(at most 24h)", optarg);
			a.used |= O_TIMEOUT;
			break;
		case OPT_WAIT:
			a.used |= O_WAIT;
			break;
		case OPT_TIER:
			if (strlen(optarg) != 2 || (optarg[0] != 'g' && optarg[0] != 'G') ||
			    optarg[1] < '1' || optarg[1] > '3')
				return usage_error("--tier '%s': g1, g2 or g3", optarg);
			a.tier = optarg[1] - '1';
			a.used |= O_TIER;
			break;
		case 'n':
			errno = 0;
			v = strtoul(optarg, &end, 10);
			if (errno || end == optarg || *end || optarg[0] == '-' || v < 1 ||
			    v > 100000000)
				return usage_error("-n '%s': a count of frames, at least 1", optarg);
			a.count = (long)v;
			a.used |= O_COUNT;
			break;
		case 'd':
			errno = 0;
			a.delay = strtod(optarg, &end);
			if (errno || end == optarg || *end || !isfinite(a.delay) || a.delay < 0.1 ||
			    a.delay > 86400)
				return usage_error("-d '%s': seconds between frames, from 0.1", optarg);
			a.used |= O_DELAY;
			break;
		case ':':
			return usage_error("option '%s' needs an argument", argv[optind - 1]);
		default:
			return usage_error("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc) {
		if (!strcmp(argv[optind], "help")) {
			help = true;
			if (optind + 1 < argc)
				a.topic = argv[optind + 1];
			if (optind + 2 < argc)
				return usage_error("help takes one command");
			optind = argc;
		} else {
			a.topic = argv[optind++];
		}
		if (a.topic) {
			for (i = 0; i < NCOMMANDS; i++)
				if (!strcmp(a.topic, commands[i].name))
					cmd = &commands[i];
			if (!cmd)
				return usage_error("unknown command '%s'", a.topic);
		}
		if (optind < argc)
			return usage_error("unexpected argument '%s' for %s", argv[optind],
					   cmd->name);
	}
	if (help) {
		if (cmd)
			printf("Usage: kvctl [-s SOCKET] [-o human|json] %s%s\n\n%s", cmd->name,
			       cmd->args, cmd->help);
		else
			usage(stdout);
		return 0;
	}
	if (!cmd)
		return usage_error("no command given");
	for (i = 0; i < sizeof(optnames) / sizeof(optnames[0]); i++)
		if ((a.used & optnames[i].bit) && !(cmd->opts & optnames[i].bit))
			return usage_error("%s does not take %s", cmd->name, optnames[i].name);
	if (cmd->run == cmd_evict && !(a.used & (O_POOL | O_ALL | O_TIER)))
		return usage_error("evict needs --pool ID, --all or --tier TIER");
	if (cmd->run == cmd_evict && (a.used & O_POOL) && (a.used & O_ALL))
		return usage_error("evict takes --pool ID or --all, not both");

	if (!a.sock) {
		r = kvc_default_socket(wdef, sizeof(wdef));
		if (r == 0)
			r = kv_admin_socket_default(wdef, def, sizeof(def));
		if (r < 0) {
			fprintf(stderr, "kvctl: socket path: %s\n", kvc_strerror(r));
			return 1;
		}
		a.sock = def;
	}
	r = kvc_connect(a.sock, &copt, &c);
	if (r < 0) {
		what = xasprintf("connect %s", a.sock);
		fail(NULL, what, r);
		free(what);
		return 1;
	}
	ret = cmd->run(c, &a);
	kvc_close(c);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "kvctl: writing output: %s\n", strerror(errno));
		return 1;
	}
	return ret;
}
