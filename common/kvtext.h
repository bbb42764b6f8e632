/* Text that clients send and operators read (names in logs, kvctl's JSON,
 * Prometheus labels): UTF-8 checks shared by the daemon's modules. */
#ifndef KV_TEXT_H
#define KV_TEXT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The length (1..4) of the valid UTF-8 sequence at s, of which avail bytes
 * (at least 1) may be read, or 0: truncated sequences, overlong forms,
 * surrogates and code points past U+10FFFF are invalid. Shared by the
 * daemon's checks and kvctl's output. */
static inline size_t kv_utf8_len(const unsigned char *s, size_t avail)
{
	size_t n, i;
	uint32_t c;

	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		n = 2, c = s[0] & 0x1f;
	else if (s[0] >= 0xe0 && s[0] <= 0xef)
		n = 3, c = s[0] & 0x0f;
	else if (s[0] >= 0xf0 && s[0] <= 0xf4)
		n = 4, c = s[0] & 0x07;
	else
		return 0;
	if (avail < n)
		return 0;
	for (i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		c = c << 6 | (s[i] & 0x3f);
	}
	if ((n == 3 && c < 0x800) || (n == 4 && (c < 0x10000 || c > 0x10ffff)) ||
	    (c >= 0xd800 && c <= 0xdfff))
		return 0;
	return n;
}

/* Whether the valid UTF-8 character of n bytes at s is a control character:
 * C0, DEL or C1 (U+0080..U+009F, which terminals may read as escapes). */
static inline int kv_text_control(const unsigned char *s, size_t n)
{
	return (n == 1 && (*s < 0x20 || *s == 0x7f)) || (n == 2 && s[0] == 0xc2 && s[1] < 0xa0);
}

/* Copies src into dst as text: at most cap bytes, cut between characters,
 * each byte that is not part of valid UTF-8 and each control character
 * (kv_text_control()) as '?'; then a NUL (dst has cap + 1 bytes). Returns
 * the length. The one cleaner of text for logs, metrics and terminals: the
 * daemon's client names, the client library's, kvctl's output. */
static inline size_t kv_text_clean(char *dst, size_t cap, const char *src)
{
	const unsigned char *s = (const unsigned char *)src;
	size_t o = 0, left = strlen(src);

	while (left) {
		size_t n = kv_utf8_len(s, left);

		if (n == 0 || kv_text_control(s, n)) {
			n = n ? n : 1;
			if (o + 1 > cap)
				break;
			dst[o++] = '?';
		} else {
			if (o + n > cap)
				break;
			memcpy(dst + o, s, n);
			o += n;
		}
		s += n;
		left -= n;
	}
	dst[o] = 0;
	return o;
}

/* Whether s is valid UTF-8 (what proto3 requires of a string). */
static inline int kv_utf8_ok(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t left = strlen(s);

	while (left) {
		size_t n = kv_utf8_len(p, left);

		if (!n)
			return 0;
		p += n;
		left -= n;
	}
	return 1;
}

/* Whether s is valid UTF-8 without control characters (C0 and DEL). */
static inline int kv_text_ok(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t left = strlen(s);

	while (left) {
		size_t n = kv_utf8_len(p, left);

		if (!n || *p < 0x20 || *p == 0x7f)
			return 0;
		p += n;
		left -= n;
	}
	return 1;
}

#endif
