/* The strings of a message on the wire; see pbcheck.h. */
#include "pbcheck.h"

#include <stdio.h>

#include "kvtext.h"

/* Nesting deeper than the protocol has is refused (protobuf-c unpacks
 * deeper, but kvcached.proto nests three levels at most). */
#define DEPTH_MAX 16

static int varint(const uint8_t *buf, size_t len, size_t *off, uint64_t *v)
{
	*v = 0;
	for (unsigned shift = 0; shift < 64 && *off < len; shift += 7) {
		uint8_t b = buf[(*off)++];

		*v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80))
			return 0;
	}
	return -1;
}

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

		if (varint(buf, len, &off, &key) < 0)
			goto trunc;
		switch (key & 7) {
		case 0:
			if (varint(buf, len, &off, &n) < 0)
				goto trunc;
			continue;
		case 1:
			n = 8;
			break;
		case 5:
			n = 4;
			break;
		case 2:
			if (varint(buf, len, &off, &n) < 0)
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
