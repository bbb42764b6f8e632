/* common/units.c: the sizes, percentages and durations that the daemon's
 * configuration and kvctl accept, and what they refuse. Suite 'unit'. */
#include <errno.h>
#include <stdint.h>

#include "check.h"
#include "units.h"

static void size_ok(const char *s, uint64_t want)
{
	uint64_t v = 0;

	if (kv_parse_size(s, &v) != 0 || v != want) {
		fprintf(stderr, "size '%s': got %llu, want %llu\n", s, (unsigned long long)v,
			(unsigned long long)want);
		exit(1);
	}
}

static void size_bad(const char *s)
{
	uint64_t v = 12345;

	if (kv_parse_size(s, &v) != -EINVAL || v != 12345) {
		fprintf(stderr, "size '%s' accepted or changed the output\n", s);
		exit(1);
	}
}

static void pct_ok(const char *s, uint64_t want)
{
	uint64_t v = 0;

	CHECK_EQ(kv_parse_pct(s, &v), 0);
	CHECK_EQ(v, want);
}

static void pct_bad(const char *s)
{
	uint64_t v = 7;

	if (kv_parse_pct(s, &v) != -EINVAL || v != 7) {
		fprintf(stderr, "percentage '%s' accepted\n", s);
		exit(1);
	}
}

static void dur_ok(const char *s, uint64_t want)
{
	uint64_t v = 0;

	if (kv_parse_duration(s, &v) != 0 || v != want) {
		fprintf(stderr, "duration '%s': got %llu ms, want %llu\n", s,
			(unsigned long long)v, (unsigned long long)want);
		exit(1);
	}
}

static void dur_bad(const char *s)
{
	uint64_t v = 99;

	if (kv_parse_duration(s, &v) != -EINVAL || v != 99) {
		fprintf(stderr, "duration '%s' accepted\n", s);
		exit(1);
	}
}

int main(void)
{
	size_ok("0", 0);
	size_ok("4096", 4096);
	size_ok("2M", 2ull << 20);
	size_ok("2m", 2ull << 20);
	size_ok("64KiB", 64ull << 10);
	size_ok("64kib", 64ull << 10);
	size_ok("1GB", 1ull << 30);
	size_ok("3T", 3ull << 40);
	size_ok("18446744073709551615", UINT64_MAX);
	size_ok("16777215TiB", 16777215ull << 40);
	size_bad("");
	size_bad("-1");
	size_bad("+1");
	size_bad(" 1");
	size_bad("1 GiB");
	size_bad("1.5GiB");
	size_bad("1P");
	size_bad("1Gi");
	size_bad("1GiBs");
	size_bad("GiB");
	size_bad("18446744073709551616");
	size_bad("16777216TiB");

	pct_ok("90%", 9000);
	pct_ok("12.5%", 1250);
	pct_ok("0.25%", 25);
	pct_ok("100%", 10000);
	pct_bad("0%");
	pct_bad("100.01%");
	pct_bad("101%");
	pct_bad("90");
	pct_bad("%");
	pct_bad("");
	pct_bad("1.234%");
	pct_bad("-5%");
	pct_bad("5%%");
	pct_bad("99999999999999999999%");

	dur_ok("500ms", 500);
	dur_ok("30s", 30000);
	dur_ok("30sec", 30000);
	dur_ok("30", 30000);
	dur_ok("2m", 120000);
	dur_ok("1min", 60000);
	dur_ok("1h", 3600000);
	dur_ok("1.5s", 1500);
	dur_ok("1.5", 1500);
	dur_ok("0.0004s", 0);
	dur_ok("0ms", 0);
	dur_ok("1800000000000h", 1800000000000ull * 3600000);
	dur_bad("");
	dur_bad("-1s");
	dur_bad("+1s");
	dur_bad("1 s");
	dur_bad("1d");
	dur_bad("s");
	dur_bad(".5s");
	dur_bad("1.5.2s");
	dur_bad("99999999999999999999");
	fprintf(stderr, "sizes, percentages and durations parse as documented\n");
	return 0;
}
