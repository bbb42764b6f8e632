/* kvctl's output: JSON documents through jansson, tables through
 * libsmartcols, and the formatting of sizes, durations and times. Strings
 * from the daemon are untrusted (any client names itself): tables replace
 * control characters and invalid UTF-8 with '?'; JSON replaces invalid UTF-8
 * with U+FFFD and jansson escapes the rest. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libsmartcols.h>

#include "kvctl.h"
#include "kvtext.h"

void *xrealloc(void *p, size_t n)
{
	p = realloc(p, n ? n : 1);
	if (!p) {
		fputs("kvctl: out of memory\n", stderr);
		exit(1);
	}
	return p;
}

char *xasprintf(const char *fmt, ...)
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

/* ---- JSON ---------------------------------------------------------------- */

/* s as valid UTF-8: each invalid byte becomes U+FFFD. */
static json_t *utf8_string(const char *str)
{
	const unsigned char *s = (const unsigned char *)(str ? str : "");
	size_t n = strlen((const char *)s), i = 0, o = 0;
	char *r = xrealloc(NULL, 3 * n + 1);
	json_t *v;

	while (i < n) {
		size_t len = kv_utf8_len(s + i, n - i);

		if (len == 0) {
			memcpy(r + o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
		} else {
			memcpy(r + o, s + i, len);
			o += len;
			i += len;
		}
	}
	r[o] = '\0';
	v = json_stringn(r, o);
	free(r);
	return v;
}

static void oom(void)
{
	fputs("kvctl: out of memory\n", stderr);
	exit(1);
}

/* Puts v (a new reference, taken over) into the open container. */
static void json_put(struct json *j, json_t *v)
{
	json_t *top = j->depth ? j->stack[j->depth - 1] : NULL;

	if (!v)
		oom();
	if (!top) {
		json_decref(v);
		return;
	}
	if (json_is_object(top)) {
		if (json_object_set_new(top, j->key ? j->key : "", v) < 0)
			oom();
	} else if (json_array_append_new(top, v) < 0) {
		oom();
	}
	free(j->key);
	j->key = NULL;
}

void json_key(struct json *j, const char *k)
{
	json_t *s = utf8_string(k);

	free(j->key);
	j->key = s ? strdup(json_string_value(s)) : NULL;
	json_decref(s);
	if (!j->key)
		oom();
}

void json_open(struct json *j, char c)
{
	json_t *v = c == '{' ? json_object() : json_array();

	if (!v || j->depth == JSON_MAX_DEPTH)
		oom();
	if (j->depth)
		json_put(j, json_incref(v));
	j->stack[j->depth++] = v;
}

void json_close(struct json *j, char c)
{
	json_t *v = j->stack[--j->depth];

	(void)c;
	if (j->depth == 0) {
		size_t flags = JSON_REAL_PRECISION(6) | (j->compact ? JSON_COMPACT : JSON_INDENT(2));

		if (json_dumpf(v, stdout, flags) < 0)
			oom();
		putchar('\n');
	}
	json_decref(v);
}

void json_str(struct json *j, const char *k, const char *v)
{
	if (k)
		json_key(j, k);
	json_put(j, utf8_string(v));
}

void json_u64(struct json *j, const char *k, uint64_t v)
{
	json_key(j, k);
	/* json_int_t is signed: past INT64_MAX (never a count), a number
	 * without its last digits rather than a negative one. */
	json_put(j, v <= INT64_MAX ? json_integer((json_int_t)v) : json_real((double)v));
}

void json_i64(struct json *j, const char *k, int64_t v)
{
	json_key(j, k);
	json_put(j, json_integer((json_int_t)v));
}

void json_f64(struct json *j, const char *k, double v)
{
	json_key(j, k);
	json_put(j, json_real(v));
}

void json_bool(struct json *j, const char *k, bool v)
{
	json_key(j, k);
	json_put(j, json_boolean(v));
}

void json_ratio(struct json *j, const char *k, uint64_t num, uint64_t den)
{
	json_key(j, k);
	json_put(j, den ? json_real((double)num / (double)den) : json_null());
}

/* ---- tables --------------------------------------------------------------- */

/* A copy of s safe for a terminal (kv_text_clean(): control characters and
 * bytes that are not UTF-8 become '?'); NULL is "". Never longer than s. */
char *sanitize(const char *s)
{
	size_t n = strlen(s ? s : "");
	char *r = xrealloc(NULL, n + 1);

	kv_text_clean(r, n, s ? s : "");
	return r;
}

void cell(struct table *t, const char *fmt, ...)
{
	va_list ap;
	char *s, *clean;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (n < 0)
		oom();
	clean = sanitize(s);
	free(s);
	/* Doubling: thousands of pools make tens of thousands of cells. */
	if (t->ncell == t->cap) {
		t->cap = t->cap ? 2 * t->cap : 64;
		t->cell = xrealloc(t->cell, t->cap * sizeof(*t->cell));
	}
	t->cell[t->ncell++] = clean;
}

void table_print(struct table *t)
{
	struct libscols_table *tb = scols_new_table();
	size_t r, k;

	if (!tb || scols_table_set_column_separator(tb, "  ") < 0)
		oom();
	for (k = 0; k < t->ncol; k++)
		if (!scols_table_new_column(tb, t->head[k], 0,
					    t->align[k] == 'r' ? SCOLS_FL_RIGHT : 0))
			oom();
	for (r = 0; r + t->ncol <= t->ncell; r += t->ncol) {
		struct libscols_line *ln = scols_table_new_line(tb, NULL);

		if (!ln)
			oom();
		for (k = 0; k < t->ncol; k++)
			if (scols_line_set_data(ln, k, t->cell[r + k]) < 0)
				oom();
	}
	scols_print_table(tb);
	scols_unref_table(tb);
	for (r = 0; r < t->ncell; r++)
		free(t->cell[r]);
	free(t->cell);
	t->cell = NULL;
	t->ncell = t->cap = 0;
}

int listing_print(const struct args *a, struct listing *l)
{
	size_t i;

	if (a->fmt == FMT_JSON) {
		struct json j = { 0 };

		json_open(&j, '{');
		if (l->json_doc) {
			l->json_doc(&j, l->reply);
		} else {
			json_key(&j, l->key);
			json_open(&j, '[');
			for (i = 0; i < l->nrows; i++)
				l->json_row(&j, l->reply, i);
			json_close(&j, ']');
		}
		json_close(&j, '}');
	} else if (l->nrows == 0) {
		puts(l->none);
	} else {
		for (i = 0; i < l->nrows; i++)
			l->table_row(&l->table, l->reply, i);
		table_print(&l->table);
	}
	return 0;
}

/* ---- values --------------------------------------------------------------- */

/* "512 B", "2 MiB", "1.5 GiB". */
char *fmt_bytes(uint64_t v)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	int u = 0;

	while (u < 6 && v >= (1ull << (10 * (u + 1))))
		u++;
	if (u == 0 || v % (1ull << (10 * u)) == 0)
		return xasprintf("%" PRIu64 " %s", v >> (10 * u), unit[u]);
	return xasprintf("%.1f %s", (double)v / (double)(1ull << (10 * u)), unit[u]);
}

char *fmt_duration(uint64_t ms)
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

char *fmt_time(uint64_t ms)
{
	time_t t = (time_t)(ms / 1000);
	struct tm tm;
	char buf[64];

	if (!localtime_r(&t, &tm) || !strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm))
		return xasprintf("%" PRIu64, ms);
	return xasprintf("%s", buf);
}

void kv_line(const char *key, const char *fmt, ...)
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

char *fmt_pct(uint64_t num, uint64_t den)
{
	if (!den)
		return xasprintf("-");
	return xasprintf("%.1f%%", 100.0 * (double)num / (double)den);
}

char *fmt_deadline(uint64_t deadline_ms)
{
	struct timespec ts;
	uint64_t now;

	clock_gettime(CLOCK_REALTIME, &ts);
	now = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
	return xasprintf("%" PRIu64 " s", deadline_ms > now ? (deadline_ms - now + 999) / 1000 : 0);
}
