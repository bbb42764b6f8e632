/* The latency histogram: bucket edges (a value equal to a bound falls in
 * that bound's bucket), +Inf, the sum, and the exposition it writes
 * (cumulative buckets ending in +Inf == _count). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "hist.h"

static void test_edges(void)
{
	struct kv_hist h;
	unsigned i;

	memset(&h, 0, sizeof(h));
	for (i = 1; i < KV_HIST_BOUNDS; i++)
		CHECK(kv_hist_bounds_ns[i] > kv_hist_bounds_ns[i - 1]);
	kv_hist_observe(&h, 0);                      /* first bucket */
	kv_hist_observe(&h, kv_hist_bounds_ns[0]);   /* le is inclusive */
	kv_hist_observe(&h, kv_hist_bounds_ns[0] + 1);
	kv_hist_observe(&h, kv_hist_bounds_ns[KV_HIST_BOUNDS - 1]);
	kv_hist_observe(&h, kv_hist_bounds_ns[KV_HIST_BOUNDS - 1] + 1);   /* +Inf */
	kv_hist_observe(&h, UINT64_MAX / 4);
	CHECK_EQ(h.n[0], 2);
	CHECK_EQ(h.n[1], 1);
	CHECK_EQ(h.n[KV_HIST_BOUNDS - 1], 1);
	CHECK_EQ(h.n[KV_HIST_BOUNDS], 2);
	CHECK_EQ(h.count, 6);
}

static void test_since(void)
{
	struct kv_hist h;
	uint64_t t0 = kv_hist_now_ns();

	memset(&h, 0, sizeof(h));
	kv_hist_since(&h, t0);
	kv_hist_since(&h, t0 + 1000000000000ull);   /* a start in the future counts 0 */
	CHECK_EQ(h.count, 2);
	CHECK(kv_hist_now_ns() >= t0);
}

/* Parses what kv_hist_write() wrote back: every bucket line in order, the
 * counts cumulative, +Inf last and equal to _count, _sum in seconds. */
static void test_write(void)
{
	struct kv_hist h;
	char *buf = NULL, *line, *save = NULL;
	size_t len = 0;
	unsigned buckets = 0;
	unsigned long long prev = 0, inf = 0, count = 0;
	double sum = -1;
	FILE *f;

	memset(&h, 0, sizeof(h));
	kv_hist_observe(&h, 3000);          /* 3 us */
	kv_hist_observe(&h, 2000000);       /* 2 ms */
	kv_hist_observe(&h, 20000000000ull);   /* 20 s: +Inf */
	f = open_memstream(&buf, &len);
	CHECK(f);
	kv_hist_write(f, "t_seconds", "op=\"alloc\"", &h);
	kv_hist_write(f, "u_seconds", "", &h);
	CHECK(fclose(f) == 0);
	CHECK(strstr(buf, "t_seconds_bucket{op=\"alloc\",le=\"1e-06\"} 0\n"));
	CHECK(strstr(buf, "t_seconds_bucket{op=\"alloc\",le=\"5e-06\"} 1\n"));
	CHECK(strstr(buf, "t_seconds_bucket{op=\"alloc\",le=\"0.0025\"} 2\n"));
	CHECK(strstr(buf, "t_seconds_bucket{op=\"alloc\",le=\"10\"} 2\n"));
	CHECK(strstr(buf, "u_seconds_bucket{le=\"+Inf\"} 3\n"));
	CHECK(strstr(buf, "u_seconds_count 3\n"));
	CHECK(strstr(buf, "u_seconds_sum 20.002003000\n"));
	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		unsigned long long v;

		if (strncmp(line, "t_seconds", 9))
			continue;
		if (!strncmp(line, "t_seconds_bucket", 16)) {
			v = strtoull(strrchr(line, ' ') + 1, NULL, 10);
			CHECK(v >= prev);
			prev = v;
			buckets++;
			if (strstr(line, "le=\"+Inf\""))
				inf = v;
		} else if (!strncmp(line, "t_seconds_count{op=\"alloc\"} ", 28)) {
			count = strtoull(line + 28, NULL, 10);
		} else if (!strncmp(line, "t_seconds_sum{op=\"alloc\"} ", 26)) {
			sum = strtod(line + 26, NULL);
		}
	}
	CHECK_EQ(buckets, KV_HIST_BOUNDS + 1);
	CHECK_EQ(inf, 3);
	CHECK_EQ(count, 3);
	CHECK(sum > 20.0 && sum < 20.01);
	free(buf);
}

int main(void)
{
	test_edges();
	test_since();
	test_write();
	return 0;
}
