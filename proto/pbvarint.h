/* Protobuf's base-128 varints, the wire form's one integer encoding: read
 * (pbcheck.c's walk of a message, the daemon's in-place Lookup decoder) and
 * written (the library's hand-packed Lookup, tests that forge frames).
 * A leaf: header only. */
#ifndef KV_PBVARINT_H
#define KV_PBVARINT_H

#include <stddef.h>
#include <stdint.h>

/* The varint at buf[*off] (buf holding len bytes) of at most max bytes
 * (10 for a uint64), decoded as protobuf-c 1.4 does (the bits past the
 * 64th dropped), *off moved past it. 0, or -1: longer than max, or cut by
 * len. */
static inline int kv_pb_varint_get(const uint8_t *buf, size_t len, size_t *off, unsigned max,
				   uint64_t *v)
{
	uint64_t r = 0;

	for (unsigned i = 0; i < max && *off + i < len; i++) {
		uint8_t b = buf[*off + i];

		r |= (uint64_t)(b & 0x7f) << (7 * i);
		if (!(b & 0x80)) {
			*off += i + 1;
			*v = r;
			return 0;
		}
	}
	return -1;
}

/* v written as a varint at p; returns its length (at most 10). */
static inline size_t kv_pb_varint_put(uint8_t *p, uint64_t v)
{
	size_t n = 0;

	while (v >= 0x80) {
		p[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	p[n++] = (uint8_t)v;
	return n;
}

/* The length of v as a varint. */
static inline size_t kv_pb_varint_len(uint64_t v)
{
	size_t n = 1;

	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

#endif
