/* kvbench: result rows and their printing, samples and percentiles,
 * synthetic hashes (kvbench.h). */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "kvbench.h"

/* --- output --------------------------------------------------------------- */

struct row rows[96];
size_t nrows;

void die(const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	fputs("kvbench: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

void note(const char *fmt, ...)
{
	FILE *f = json ? stderr : stdout;
	va_list ap;

	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	fputc('\n', f);
	fflush(f);
}

void check(kvc_conn *c, int r, const char *what)
{
	if (r < 0)
		die("%s: %s%s%s", what, kvc_strerror(r), c && *kvc_last_error(c) ? ": " : "",
		    c ? kvc_last_error(c) : "");
}

void print_header(void)
{
	if (json)
		return;
	printf("%-34s %11s %9s %9s %16s %10s %7s %9s\n", "", "req/resp B", "p50 us", "p99 us",
	       "rate", "floor p50", "ratio", "target");
}

void print_section(const char *title)
{
	if (!json)
		printf("%s\n", title);
	fflush(stdout);
}

struct row *add_row(char section, const char *name)
{
	struct row *r;

	if (nrows == sizeof(rows) / sizeof(rows[0]))
		die("too many result rows");
	r = &rows[nrows++];
	memset(r, 0, sizeof(*r));
	r->section = section;
	snprintf(r->name, sizeof(r->name), "%s", name);
	r->ops_unit = "ops/s";
	r->evicted = NAN;
	return r;
}

void print_row(const struct row *r)
{
	char fr[24] = "", rate[32], fl[16] = "", ra[16] = "", tg[16] = "", line[192];
	int n;

	if (json)
		return;
	if (r->req || r->resp)
		snprintf(fr, sizeof(fr), "%u/%u", r->req, r->resp);
	if (r->p10 > 0)
		snprintf(rate, sizeof(rate), "p10 %.1f", r->p10);
	else if (r->ops <= 0)
		rate[0] = '\0';
	else if (r->ops >= 1e6)
		snprintf(rate, sizeof(rate), "%.2fM %s", r->ops / 1e6, r->ops_unit);
	else if (r->ops >= 1e4)
		snprintf(rate, sizeof(rate), "%.1fk %s", r->ops / 1e3, r->ops_unit);
	else
		snprintf(rate, sizeof(rate), "%.0f %s", r->ops, r->ops_unit);
	if (r->floor_p50 > 0) {
		snprintf(fl, sizeof(fl), "%.1f", r->floor_p50);
		snprintf(ra, sizeof(ra), "%.2fx", r->p50 / r->floor_p50);
	}
	if (r->target > 0)
		snprintf(tg, sizeof(tg), "%s%.1fx", r->p50 / r->floor_p50 <= r->target ? "ok " : "MISS ",
			 r->target);
	n = snprintf(line, sizeof(line), "  %-32s %11s %9.1f %9.1f %16s %10s %7s %9s", r->name, fr,
		     r->p50, r->p99, rate, fl, ra, tg);
	while (n > 0 && line[n - 1] == ' ')
		line[--n] = '\0';
	puts(line);
	fflush(stdout);
}

void json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			printf("\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			printf("\\u%04x", *s);
		else
			putchar(*s);
	}
	putchar('"');
}

void json_num(const char *key, double v)
{
	printf(", \"%s\": ", key);
	if (isfinite(v))
		printf("%.3f", v);
	else
		printf("null");
}

/* --- time and samples ----------------------------------------------------- */

void sample_add(struct samples *s, uint64_t ns)
{
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 65536;
		uint64_t *v = realloc(s->v, cap * sizeof(*v));

		if (!v)
			die("out of memory");
		s->v = v;
		s->cap = cap;
	}
	s->v[s->n++] = ns;
}

void sample_free(struct samples *s)
{
	free(s->v);
	memset(s, 0, sizeof(*s));
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Nearest-rank percentile in microseconds; sorts s. */
static double pct(struct samples *s, double p)
{
	size_t k;

	if (!s->n)
		return NAN;
	qsort(s->v, s->n, sizeof(*s->v), cmp_u64);
	k = (size_t)ceil(p / 100.0 * (double)s->n);
	return (double)s->v[k ? k - 1 : 0] / 1e3;
}

static double sum_s(const struct samples *s)
{
	double t = 0;
	size_t i;

	for (i = 0; i < s->n; i++)
		t += (double)s->v[i];
	return t / 1e9;
}

void row_from(struct row *r, struct samples *s, double per)
{
	double t = sum_s(s);

	r->n = s->n;
	r->p50 = pct(s, 50);
	r->p99 = pct(s, 99);
	r->ops = t > 0 ? (double)s->n * per / t : 0;
}

void cpu_row(char section, const char *name, struct samples *s)
{
	cpu_row_of(section, "daemon", name, s);
}

void cpu_row_of(char section, const char *who, const char *name, struct samples *s)
{
	struct row *r = add_row(section, "");

	snprintf(r->name, sizeof(r->name), "  %s CPU, %s", who, name);
	row_from(r, s, 1);
	r->p10 = pct(s, 10);
	r->ops = 0;
	r->ops_unit = "";
	print_row(r);
}

/* --- synthetic hashes ----------------------------------------------------- */

static uint64_t rng_state;

uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

void rng_seed(void)
{
	uint64_t s = 0;

	if (getrandom(&s, sizeof(s), 0) != (ssize_t)sizeof(s))
		s = now_ns();
	rng_state = s ^ ((uint64_t)getpid() << 32);
}

void fresh_hashes(kvc_hash *h, size_t n)
{
	size_t i, j;

	for (i = 0; i < n; i++)
		for (j = 0; j < 4; j++) {
			uint64_t w = splitmix64(&rng_state);

			memcpy(h[i].b + 8 * j, &w, 8);
		}
}
