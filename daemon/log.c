#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int kv_log_level = KV_LOG_INFO;

int kv_log_parse_level(const char *s)
{
	static const struct { const char *name; int level; } names[] = {
		{ "err", KV_LOG_ERR }, { "error", KV_LOG_ERR }, { "warn", KV_LOG_WARN },
		{ "warning", KV_LOG_WARN }, { "info", KV_LOG_INFO }, { "debug", KV_LOG_DEBUG },
	};
	size_t i;

	for (i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (!strcmp(s, names[i].name))
			return names[i].level;
	if (s[0] >= '3' && s[0] <= '7' && !s[1])
		return s[0] - '0';
	return -EINVAL;
}

void kv_log(int level, const char *fmt, ...)
{
	static const char *tag[] = { "", "", "", "error", "warning", "", "info", "debug" };
	char line[1024];
	struct timespec ts;
	struct tm tm;
	va_list ap;
	int n;

	if (level > kv_log_level)
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n = snprintf(line, sizeof(line), "%02d:%02d:%02d.%03ld kvcached %s: ", tm.tm_hour,
		     tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, tag[level & 7]);
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s\n", line);
}
