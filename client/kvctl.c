/* kvctl: the operator's view of a running kvcached.
 *
 *   kvctl [-s SOCKET] [-o human|json] COMMAND
 *
 * Human output is aligned tables for a terminal; -o json is one JSON document
 * for scripts. Exit status: 0 success, 1 failure (or `check` finding
 * problems), 2 usage error. Errors are one line on stderr:
 * "kvctl: <what>: <why>".
 *
 * Strings from the daemon are untrusted (any client names itself): human
 * output replaces control characters, JSON output escapes them and replaces
 * invalid UTF-8. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvc_internal.h"

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
	int depth;
	bool nonempty[JSON_MAX_DEPTH];  /* the container at depth has an item */
	bool after_key;
};

static void json_indent(struct json *j)
{
	int i;

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
	fputs(": ", j->f);
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

static Kvcached__Response *get_stats(kvc_conn *c)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Stats st = KVCACHED__STATS__INIT;

	req.op_case = KVCACHED__REQUEST__OP_STATS;
	req.stats = &st;
	return call(c, &req, KVCACHED__RESPONSE__RESULT_STATS, "stats");
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

static int cmd_status(kvc_conn *c, enum format fmt, int argc, char **argv)
{
	Kvcached__Response *resp = get_stats(c);
	const Kvcached__StatsReply *s;
	size_t i;

	if (!resp)
		return 1;
	s = resp->stats;
	if (fmt == FMT_JSON) {
		struct json j = { .f = stdout };

		json_open(&j, '{');
		json_str(&j, "version", s->version);
		json_str(&j, "backend", s->backend);
		json_u64(&j, "uptime_ms", s->uptime_ms);
		json_u64(&j, "page_bytes", s->page_bytes);
		json_u64(&j, "segment_bytes", s->segment_bytes);
		json_u64(&j, "pages_total", s->pages_total);
		json_u64(&j, "pages_free", s->pages_free);
		json_u64(&j, "segments", s->segments);
		json_u64(&j, "sessions", s->sessions);
		json_u64(&j, "requests", s->requests);
		json_u64(&j, "enospc", s->enospc);
		json_key(&j, "pools");
		json_open(&j, '[');
		for (i = 0; i < s->n_pools; i++)
			json_pool(&j, s->pools[i]);
		json_close(&j, ']');
		json_key(&j, "tiers");
		json_open(&j, '[');
		for (i = 0; i < s->n_tiers; i++)
			json_tier(&j, s->tiers[i]);
		json_close(&j, ']');
		json_close(&j, '}');
	} else {
		static const char *const phead[] = { "POOL", "NAMESPACE", "NAME", "DEV", "BLOCK",
						     "BLOCKS", "FREE", "CACHED", "HIT" };
		struct table pt = { .ncol = 9, .head = phead, .align = "rllrrrrrr" };
		char *a, *b;

		kv_line("version", "%s", s->version);
		kv_line("backend", "%s", s->backend);
		kv_line("uptime", "%s", a = fmt_duration(s->uptime_ms));
		free(a);
		kv_line("pages", "%" PRIu64 " free of %" PRIu64 " (%s each)", s->pages_free,
			s->pages_total, a = fmt_bytes(s->page_bytes));
		free(a);
		kv_line("segments", "%" PRIu32 " (%s each)", s->segments,
			a = fmt_bytes(s->segment_bytes));
		free(a);
		kv_line("sessions", "%" PRIu32, s->sessions);
		kv_line("requests", "%" PRIu64, s->requests);
		kv_line("enospc", "%" PRIu64, s->enospc);
		kv_line("pools", "%zu", s->n_pools);

		for (i = 0; i < s->n_pools; i++) {
			const Kvcached__PoolInfo *p = s->pools[i];

			cell(&pt, "%" PRIu32, p->pool_id);
			cell(&pt, "%s", p->namespace_);
			cell(&pt, "%s", p->name);
			cell(&pt, "%" PRIu32, p->device);
			cell(&pt, "%s", a = fmt_bytes(p->block_bytes));
			free(a);
			cell(&pt, "%" PRIu64, p->runs * p->blocks_per_run);
			cell(&pt, "%" PRIu64, p->blocks_free);
			cell(&pt, "%" PRIu64, p->blocks_cached);
			cell(&pt, "%s", b = fmt_pct(p->hits, p->lookups));
			free(b);
		}
		if (s->n_tiers)
			tiers_table(s);
		if (s->n_pools) {
			putchar('\n');
			table_print(&pt, stdout);
		}
	}
	kvcached__response__free_unpacked(resp, NULL);
	return 0;
}

static int cmd_pools(kvc_conn *c, enum format fmt, int argc, char **argv)
{
	Kvcached__Response *resp = get_stats(c);
	const Kvcached__StatsReply *s;
	size_t i;

	if (!resp)
		return 1;
	s = resp->stats;
	if (fmt == FMT_JSON) {
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
		char *a;

		for (i = 0; i < s->n_pools; i++) {
			const Kvcached__PoolInfo *p = s->pools[i];

			cell(&t, "%" PRIu32, p->pool_id);
			cell(&t, "%s", p->namespace_);
			cell(&t, "%s", p->name);
			cell(&t, "%" PRIu32, p->device);
			cell(&t, "%s", a = fmt_bytes(p->block_bytes));
			free(a);
			cell(&t, "%" PRIu32, p->blocks_per_run);
			cell(&t, "%" PRIu64, p->runs);
			cell(&t, "%" PRIu64, p->blocks_free);
			cell(&t, "%" PRIu64, p->blocks_writable);
			cell(&t, "%" PRIu64, p->blocks_sealed);
			cell(&t, "%" PRIu64, p->blocks_cached);
			cell(&t, "%" PRIu64, p->allocs);
			cell(&t, "%s", a = fmt_pct(p->hits, p->lookups));
			free(a);
			cell(&t, "%" PRIu64, p->evictions);
			cell(&t, "%" PRIu64, p->dedups);
		}
		table_print(&t, stdout);
	}
	kvcached__response__free_unpacked(resp, NULL);
	return 0;
}

static int cmd_clients(kvc_conn *c, enum format fmt, int argc, char **argv)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__ListClients lc = KVCACHED__LIST_CLIENTS__INIT;
	Kvcached__Response *resp;
	const Kvcached__ClientsReply *cr;
	size_t i;

	req.op_case = KVCACHED__REQUEST__OP_LIST_CLIENTS;
	req.list_clients = &lc;
	resp = call(c, &req, KVCACHED__RESPONSE__RESULT_CLIENTS, "clients");
	if (!resp)
		return 1;
	cr = resp->clients;
	if (fmt == FMT_JSON) {
		struct json j = { .f = stdout };

		json_open(&j, '{');
		json_key(&j, "clients");
		json_open(&j, '[');
		for (i = 0; i < cr->n_clients; i++) {
			const Kvcached__ClientInfo *ci = cr->clients[i];

			json_open(&j, '{');
			json_u64(&j, "session_id", ci->session_id);
			json_i64(&j, "pid", ci->pid);
			json_u64(&j, "uid", ci->uid);
			json_u64(&j, "gid", ci->gid);
			json_str(&j, "namespace", ci->namespace_);
			json_str(&j, "name", ci->name);
			json_u64(&j, "refs", ci->refs);
			json_u64(&j, "connected_ms", ci->connected_ms);
			json_u64(&j, "requests", ci->requests);
			json_close(&j, '}');
		}
		json_close(&j, ']');
		json_close(&j, '}');
	} else if (cr->n_clients == 0) {
		puts("no clients");
	} else {
		static const char *const head[] = { "SESSION", "PID", "UID", "NAMESPACE", "NAME",
						    "REFS", "CONNECTED", "REQUESTS" };
		struct table t = { .ncol = 8, .head = head, .align = "rrrllrlr" };
		char *a;

		for (i = 0; i < cr->n_clients; i++) {
			const Kvcached__ClientInfo *ci = cr->clients[i];

			cell(&t, "%" PRIu64, ci->session_id);
			cell(&t, "%" PRId32, ci->pid);
			cell(&t, "%" PRIu32, ci->uid);
			cell(&t, "%s", ci->namespace_);
			cell(&t, "%s", ci->name);
			cell(&t, "%" PRIu64, ci->refs);
			cell(&t, "%s", a = fmt_time(ci->connected_ms));
			free(a);
			cell(&t, "%" PRIu64, ci->requests);
		}
		table_print(&t, stdout);
	}
	kvcached__response__free_unpacked(resp, NULL);
	return 0;
}

static int cmd_check(kvc_conn *c, enum format fmt, int argc, char **argv)
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
	if (fmt == FMT_JSON) {
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

/* Options of one command, parsed with the global ones. */
static const char *opt_tier, *opt_pool;

static int cmd_evict(kvc_conn *c, enum format fmt, int argc, char **argv)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Evict ev = KVCACHED__EVICT__INIT;
	Kvcached__Response *resp;
	const char *tier = opt_tier, *pool = opt_pool;

	(void)argc;
	(void)argv;
	if (!tier || strlen(tier) != 2 || (tier[0] != 'g' && tier[0] != 'G') || tier[1] < '1' ||
	    tier[1] > '3') {
		fprintf(stderr, "kvctl: evict: --tier g1, g2 or g3 is required\n");
		return 2;
	}
	ev.tier = (Kvcached__Tier)(tier[1] - '1');
	if (pool) {
		char *end;
		unsigned long v = strtoul(pool, &end, 10);

		if (*end || !*pool || v > UINT32_MAX) {
			fprintf(stderr, "kvctl: evict: bad pool id '%s'\n", pool);
			return 2;
		}
		ev.pool_id = (uint32_t)v;
	} else {
		ev.all_pools = 1;
	}
	req.op_case = KVCACHED__REQUEST__OP_EVICT;
	req.evict = &ev;
	resp = call(c, &req, KVCACHED__RESPONSE__RESULT_EVICT, "evict");
	if (!resp)
		return 1;
	if (fmt == FMT_JSON) {
		struct json j = { .f = stdout };

		json_open(&j, '{');
		json_str(&j, "tier", tier_names[ev.tier]);
		json_u64(&j, "blocks", resp->evict->blocks);
		json_close(&j, '}');
	} else {
		printf("%s: %" PRIu64 " blocks evicted\n", tier_names[ev.tier], resp->evict->blocks);
	}
	kvcached__response__free_unpacked(resp, NULL);
	return 0;
}

static int cmd_flush(kvc_conn *c, enum format fmt, int argc, char **argv)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Flush fl = KVCACHED__FLUSH__INIT;
	Kvcached__Response *resp;
	uint64_t started;
	int waited_ms = 0, clean;

	(void)argc;
	(void)argv;
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
		Kvcached__Response *st;
		size_t i;

		struct timespec ts = { 0, 10 * 1000 * 1000 };
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
	if (fmt == FMT_JSON) {
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

/* --- command line -------------------------------------------------------- */

struct command {
	const char *name;
	int (*run)(kvc_conn *c, enum format fmt, int argc, char **argv);
	const char *summary;
	const char *help;
};

static const struct command commands[] = {
	{ "status", cmd_status, "daemon summary and one line per pool",
	  "Shows the daemon's version, backend and uptime, its page and segment usage,\n"
	  "sessions, requests and allocation failures (enospc), then one line per pool:\n"
	  "its blocks in total, free and cached, and its lookup hit rate.\n" },
	{ "pools", cmd_pools, "per-pool block states and counters",
	  "Shows one row per pool: id, namespace, name, device, block size, blocks per\n"
	  "run and runs held, blocks free / writable / sealed / cached, allocations,\n"
	  "lookup hit rate, evictions and seal deduplications.\n" },
	{ "clients", cmd_clients, "connected sessions",
	  "Shows one row per connected session: session id, pid, uid, namespace, the\n"
	  "name the client gave, block references held, when it connected and how\n"
	  "many requests it made.\n" },
	{ "evict", cmd_evict, "evict idle blocks of one tier",
	  "Options: --tier g1|g2|g3 (required), --pool ID\n\n"
	  "g1: demotes every cached (unreferenced) device block to the host tier, or\n"
	  "drops it when there is none; g2: drops host-tier copies that are on disk\n"
	  "and writes the others to disk first (dropped when there is no disk tier);\n"
	  "g3: drops the disk tier's blocks. Blocks that workers hold are never\n"
	  "touched. Without --pool, every pool.\n" },
	{ "flush", cmd_flush, "write the host tier back to disk",
	  "Writes every host-tier block that is not on disk yet to the disk tier and\n"
	  "waits until all writes are done (at most 60 s; exit 1 if not done).\n" },
	{ "check", cmd_check, "run the daemon's consistency check",
	  "Asks the daemon to check its invariants (block states, lists, references,\n"
	  "prefix index) and prints \"ok\" or the problems it found. Exits 1 when the\n"
	  "check finds a problem.\n" },
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *f)
{
	size_t i;

	fputs("Usage: kvctl [-s SOCKET] [-o human|json] COMMAND\n"
	      "\n"
	      "Inspects a running kvcached daemon.\n"
	      "\n"
	      "Commands:\n", f);
	for (i = 0; i < NCOMMANDS; i++)
		fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].summary);
	fputs("\n"
	      "Options:\n"
	      "  -s, --socket PATH    the daemon's socket (default: $KVCACHED_SOCKET, else\n"
	      "                       /run/kvcached/kvcached.sock for root, else\n"
	      "                       $XDG_RUNTIME_DIR/kvcached.sock)\n"
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
	fputs("\nTry 'kvctl --help'.\n", stderr);
	return 2;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "output", required_argument, NULL, 'o' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ "tier", required_argument, NULL, 't' },
		{ "pool", required_argument, NULL, 'p' },
		{ 0 },
	};
	const struct kvc_options copt = { .client_name = "kvctl" };
	const struct command *cmd = NULL;
	const char *sock = NULL;
	enum format fmt = FMT_HUMAN;
	char def[108], *what;
	bool help = false;
	kvc_conn *c = NULL;
	int o, r, ret;
	size_t i;

	opterr = 0;
	while ((o = getopt_long(argc, argv, ":s:o:hVt:p:", opts, NULL)) != -1) {
		switch (o) {
		case 's':
			sock = optarg;
			break;
		case 'o':
			if (!strcmp(optarg, "human"))
				fmt = FMT_HUMAN;
			else if (!strcmp(optarg, "json"))
				fmt = FMT_JSON;
			else
				return usage_error("unknown output format '%s' (human or json)",
						   optarg);
			break;
		case 'h':
			help = true;
			break;
		case 't':
			opt_tier = optarg;
			break;
		case 'p':
			opt_pool = optarg;
			break;
		case 'V':
			printf("kvctl %s\n", KV_VERSION);
			return 0;
		case ':':
			return usage_error("option '%s' needs an argument", argv[optind - 1]);
		default:
			return usage_error("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc) {
		for (i = 0; i < NCOMMANDS; i++)
			if (!strcmp(argv[optind], commands[i].name))
				cmd = &commands[i];
		if (!cmd)
			return usage_error("unknown command '%s'", argv[optind]);
		if (optind + 1 < argc)
			return usage_error("%s takes no arguments", cmd->name);
		if ((opt_tier || opt_pool) && cmd->run != cmd_evict)
			return usage_error("--tier and --pool are options of evict");
	}
	if (help) {
		if (cmd)
			printf("Usage: kvctl [-s SOCKET] [-o human|json] %s\n\n%s", cmd->name,
			       cmd->help);
		else
			usage(stdout);
		return 0;
	}
	if (!cmd)
		return usage_error("no command given");

	if (!sock) {
		r = kvc_default_socket(def, sizeof(def));
		if (r < 0) {
			fprintf(stderr, "kvctl: socket path: %s\n", kvc_strerror(r));
			return 1;
		}
		sock = def;
	}
	r = kvc_connect(sock, &copt, &c);
	if (r < 0) {
		what = xasprintf("connect %s", sock);
		fail(NULL, what, r);
		free(what);
		return 1;
	}
	ret = cmd->run(c, fmt, 0, NULL);
	kvc_close(c);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "kvctl: writing output: %s\n", strerror(errno));
		return 1;
	}
	return ret;
}
