/* Sizes, percentages and durations as an operator writes them, in the
 * configuration and on the command lines of kvcached and kvctl. One parser
 * of each, so that every place accepts the same syntax (kvcached.conf(5)).
 * Each returns 0 and sets *out, or -EINVAL and leaves it alone. */
#ifndef KV_UNITS_H
#define KV_UNITS_H

#include <stdint.h>

/* "64GiB", "2M", "4096": a decimal count of bytes, optionally followed by K,
 * M, G or T (any case) alone or with B or iB; all of them are binary (K is
 * 1024). No sign, no space, no fraction; an overflow is an error. */
int kv_parse_size(const char *s, uint64_t *out);

/* "90%", "12.5%", "0.25%": in hundredths of a percent, in (0, 10000]. At
 * most two decimals. */
int kv_parse_pct(const char *s, uint64_t *out);

/* "500ms", "30s", "30sec", "2m", "1min", "1h", "1.5s"; a bare number is
 * seconds. In milliseconds; decimals beyond the millisecond are dropped, and
 * at most six are read. No sign; an overflow is an error. */
int kv_parse_duration(const char *s, uint64_t *ms);

#endif
