/* See units.h. */
#include "units.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int kv_parse_size(const char *s, uint64_t *out)
{
	static const char units[] = "KMGT";
	char *end;
	unsigned long long v;
	uint64_t mul = 1;
	size_t i;

	if (s[0] < '0' || s[0] > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return -EINVAL;
	if (*end) {
		for (i = 0; i < 4; i++) {
			if (toupper((unsigned char)*end) == units[i] &&
			    (!end[1] || !strcasecmp(end + 1, "iB") || !strcasecmp(end + 1, "B"))) {
				mul = 1ull << (10 * (i + 1));
				break;
			}
		}
		if (i == 4)
			return -EINVAL;
	}
	if (v > UINT64_MAX / mul)
		return -EINVAL;
	*out = v * mul;
	return 0;
}

int kv_parse_pct(const char *s, uint64_t *out)
{
	uint64_t v = 0;
	int frac = -1;

	if (!*s || *s == '%')
		return -EINVAL;
	for (; *s && *s != '%'; s++) {
		if (*s == '.' && frac < 0) {
			frac = 0;
			continue;
		}
		if (*s < '0' || *s > '9' || frac >= 2 || v > 1000000)
			return -EINVAL;
		v = v * 10 + (uint64_t)(*s - '0');
		if (frac >= 0)
			frac++;
	}
	if (strcmp(s, "%"))
		return -EINVAL;
	for (frac = frac < 0 ? 0 : frac; frac < 2; frac++)
		v *= 10;
	if (v == 0 || v > 10000)
		return -EINVAL;
	*out = v;
	return 0;
}

int kv_parse_duration(const char *s, uint64_t *ms)
{
	static const struct { const char *unit; uint64_t ms; } units[] = {
		{ "ms", 1 }, { "s", 1000 }, { "sec", 1000 }, { "m", 60000 }, { "min", 60000 },
		{ "h", 3600000 }, { "", 1000 },
	};
	uint64_t whole = 0, frac = 0, div = 1;
	const char *p = s;
	size_t i;

	if (*p < '0' || *p > '9')
		return -EINVAL;
	for (; *p >= '0' && *p <= '9'; p++) {
		/* Up to 1.8e12: times 3,600,000 (h) still fits 64 bits. */
		if (whole > UINT64_MAX / 10000000)
			return -EINVAL;
		whole = whole * 10 + (uint64_t)(*p - '0');
	}
	if (*p == '.') {
		for (p++; *p >= '0' && *p <= '9'; p++) {
			if (div < 1000000) {
				frac = frac * 10 + (uint64_t)(*p - '0');
				div *= 10;
			}
		}
	}
	for (i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (!strcmp(p, units[i].unit)) {
			*ms = whole * units[i].ms + frac * units[i].ms / div;
			return 0;
		}
	}
	return -EINVAL;
}
