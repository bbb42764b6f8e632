/* kv_errf(): a message for the caller, formatted into the buffer it passed
 * (err may be NULL or errlen 0: then nothing is written). For functions that
 * return -errno and say why in words ("char *err, size_t errlen").
 * kv_einval(): the same, and evaluates to -EINVAL (the parsers' "return
 * kv_einval(err, errlen, ...)"). */
#ifndef KV_KVERR_H
#define KV_KVERR_H

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

static inline void __attribute__((format(printf, 3, 4)))
kv_errf(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

#define kv_einval(err, errlen, ...) (kv_errf((err), (errlen), __VA_ARGS__), -EINVAL)

#endif
