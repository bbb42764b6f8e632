/* The strings of a message on the wire; see pbcheck.h. */
#include "pbcheck.h"

#include <stdio.h>
#include <string.h>

#include "kvtext.h"
#include "pbvarint.h"

/* Nesting deeper than the protocol has is refused (protobuf-c unpacks
 * deeper, but kvcached.proto nests three levels at most). */
#define DEPTH_MAX 16

/* 0: text; otherwise the offset + 1 of the first bad byte. */
static size_t bad_text(const uint8_t *s, size_t n)
{
	size_t i = 0;

	while (i < n) {
		size_t k = s[i] ? kv_utf8_len(s + i, n - i) : 0;

		if (!k)
			return i + 1;
		i += k;
	}
	return 0;
}

static int check(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len,
		 unsigned depth, char *why, size_t whylen)
{
	size_t off = 0;

	if (depth > DEPTH_MAX) {
		snprintf(why, whylen, "messages nested deeper than %d", DEPTH_MAX);
		return 0;
	}
	while (off < len) {
		const ProtobufCFieldDescriptor *f;
		uint64_t key, n;
		size_t bad;

		if (kv_pb_varint_get(buf, len, &off, 10, &key) < 0)
			goto trunc;
		switch (key & 7) {
		case 0:
			if (kv_pb_varint_get(buf, len, &off, 10, &n) < 0)
				goto trunc;
			continue;
		case 1:
			n = 8;
			break;
		case 5:
			n = 4;
			break;
		case 2:
			if (kv_pb_varint_get(buf, len, &off, 10, &n) < 0)
				goto trunc;
			break;
		default:
			snprintf(why, whylen, "%s: wire type %u", desc->name, (unsigned)(key & 7));
			return 0;
		}
		if (n > len - off)
			goto trunc;
		f = (key & 7) == 2 && key >> 3 <= UINT32_MAX
			    ? protobuf_c_message_descriptor_get_field(desc, (unsigned)(key >> 3))
			    : NULL;
		if (f && f->type == PROTOBUF_C_TYPE_STRING && (bad = bad_text(buf + off, n))) {
			snprintf(why, whylen, "%s.%s is not text: %s at byte %zu", desc->name,
				 f->name, buf[off + bad - 1] ? "invalid UTF-8" : "a NUL",
				 bad - 1);
			return 0;
		}
		if (f && f->type == PROTOBUF_C_TYPE_MESSAGE &&
		    !check(f->descriptor, buf + off, n, depth + 1, why, whylen))
			return 0;
		off += n;
	}
	return 1;
trunc:
	snprintf(why, whylen, "%s: a field runs past the end", desc->name);
	return 0;
}

int kv_pb_strings_ok(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len,
		     char *why, size_t whylen)
{
	return check(desc, buf, len, 0, why, whylen);
}

/* ---- the cost of unpacking (kv_pb_decode_cost) ------------------------- */

/* protobuf-c 1.4's ScannedMember: one per field met, in slabs that double. */
#define SCAN_BYTES 32
/* The arena rounds each allocation to 16 bytes (arena.c). */
#define ROUND(n) (((n) + 15) & ~15ull)

/* Bytes of one element of a repeated field of type t in its array. */
static size_t elem_bytes(ProtobufCType t)
{
	switch (t) {
	case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
	case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64: case PROTOBUF_C_TYPE_DOUBLE:
		return 8;
	case PROTOBUF_C_TYPE_STRING: case PROTOBUF_C_TYPE_MESSAGE:
		return sizeof(void *);
	case PROTOBUF_C_TYPE_BYTES:
		return sizeof(ProtobufCBinaryData);
	default:
		return 4;
	}
}

/* Elements in a packed run of n bytes of type t at p. */
static uint64_t packed_count(ProtobufCType t, const uint8_t *p, size_t n)
{
	uint64_t c = 0;

	switch (t) {
	case PROTOBUF_C_TYPE_FIXED64: case PROTOBUF_C_TYPE_SFIXED64: case PROTOBUF_C_TYPE_DOUBLE:
		return n / 8;
	case PROTOBUF_C_TYPE_FIXED32: case PROTOBUF_C_TYPE_SFIXED32: case PROTOBUF_C_TYPE_FLOAT:
		return n / 4;
	default:
		for (size_t i = 0; i < n; i++)
			c += !(p[i] & 0x80);
		return c;
	}
}

/* The cost of the message in buf[0..len), added to *sum; stops (returns 1)
 * as soon as *sum passes limit. Returns 0, 1, or -1 when buf does not
 * parse. */
static int cost(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len,
		unsigned depth, unsigned long long *sum, unsigned long long limit)
{
	/* Elements per repeated field (by index), counted as the wire goes:
	 * the arrays are allocated once per field, so one rounding each. */
	uint64_t nelem[64];
	unsigned long long total = ROUND(desc->sizeof_message);
	const ProtobufCFieldDescriptor *f = NULL;
	uint64_t fields = 0, last = 0;
	size_t off = 0;
	int have = 0;

	if (depth > DEPTH_MAX)
		return -1;
	*sum += total;
	if (*sum > limit)
		return 1;
	if (!len)
		return 0;
	total = 0;
	/* Only this message's fields: a sub-message is visited per instance. */
	memset(nelem, 0, sizeof(nelem[0]) * (desc->n_fields < 64 ? desc->n_fields : 64));
	while (off < len) {
		uint64_t key, n = 0;
		size_t at;

		if (kv_pb_varint_get(buf, len, &off, 10, &key) < 0)
			return -1;
		fields++;
		/* Every 4096 fields: past the limit already? */
		if (!(fields & 4095) && *sum + total + 2 * fields * SCAN_BYTES > limit)
			return 1;
		at = off;
		switch (key & 7) {
		case 0:
			if (kv_pb_varint_get(buf, len, &off, 10, &n) < 0)
				return -1;
			n = 0;
			at = off;
			break;
		case 1:
			n = 8;
			break;
		case 5:
			n = 4;
			break;
		case 2:
			if (kv_pb_varint_get(buf, len, &off, 10, &n) < 0)
				return -1;
			at = off;
			break;
		default:
			return -1;
		}
		if (n > len - at)
			return -1;
		off = at + n;
		/* A repeated field comes as a run of one tag: looked up once. */
		if (!have || key >> 3 != last) {
			have = 1;
			last = key >> 3;
			f = last <= UINT32_MAX
				    ? protobuf_c_message_descriptor_get_field(desc, (unsigned)last)
				    : NULL;
		}
		if (!f)
			continue;   /* unknown: skipped (protobuf-c keeps none of it) */
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			unsigned i = (unsigned)(f - desc->fields);
			int scalar = f->type != PROTOBUF_C_TYPE_STRING &&
				     f->type != PROTOBUF_C_TYPE_BYTES &&
				     f->type != PROTOBUF_C_TYPE_MESSAGE;
			uint64_t k = scalar && (key & 7) == 2 ? packed_count(f->type, buf + at, n)
							       : 1;

			if (i < 64)
				nelem[i] += k;
			else
				total += ROUND(k * elem_bytes(f->type));
			if (scalar)
				continue;
		}
		if (f->type == PROTOBUF_C_TYPE_STRING)
			total += ROUND(n + 1);
		else if (f->type == PROTOBUF_C_TYPE_BYTES && n)
			total += ROUND(n);
		else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
			int r = cost(f->descriptor, buf + at, n, depth + 1, sum, limit);

			if (r)
				return r;
		}
		if (*sum + total > limit)
			return 1;
	}
	for (unsigned i = 0; i < 64 && i < desc->n_fields; i++)
		if (nelem[i])
			total += ROUND(nelem[i] * elem_bytes(desc->fields[i].type));
	/* The scratch: 16 fields live on protobuf-c's stack, then slabs of
	 * 16, 32, 64, ... (at most twice what is used). */
	if (fields > 16)
		total += 2 * (fields - 16) * SCAN_BYTES + 16 * 64;
	*sum += total;
	return *sum > limit;
}

long long kv_pb_decode_cost(const ProtobufCMessageDescriptor *desc, const uint8_t *buf,
			    size_t len, unsigned long long limit)
{
	unsigned long long sum = 0;
	int r;

	if (limit > (1ull << 62))
		limit = 1ull << 62;
	r = cost(desc, buf, len, 0, &sum, limit);
	if (r > 0 && sum <= limit)
		sum = limit + 1;   /* stopped on what was bound to come */
	return r < 0 ? -1 : (long long)sum;
}
