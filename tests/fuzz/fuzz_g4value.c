/* Fuzzing the check of a G4 value (issue 29): tier_remote_check(), what the
 * read thread runs on every value the cluster returns, keyed
 * (remote_key_file: HMAC-SHA-256 tag) or not (libFuzzer; replayed by the
 * normal suite).
 *
 * Input: byte 0 flags (bit 0: keyed; bit 1: the rest is a whole value, as a
 * hostile cluster would return it; else bytes 1.. are a payload; bit 2: the
 * pool compresses, its values' header flags say FP8 E4M3), bytes 1..2 a
 * position, the rest data.
 *   - whole value: checked as it is; accepted only if it is the value a
 *     writer makes for that header and payload (rebuilt and compared);
 *   - payload: the value a writer makes from it must be accepted, and the
 *     same value with the byte at the position flipped must not (a change
 *     anywhere, header, payload or tag, is caught), nor the value one byte
 *     shorter or longer, nor the same payload written in the other format
 *     (compressed for a raw pool, raw for a compressed one).
 * Findings: a crash or sanitizer report, a value accepted that is not the
 * writer's, the writer's refused. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "g4mac.h"
#include "kvconfig.h"
#include "quant.h"
#include "tier/tier_int.h"

#define PL 512   /* payload bytes of the pool */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	return 0;
}

#if KV_HAVE_HIREDIS
static const uint8_t key[KV_G4MAC_KEY_BYTES] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
						 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25,
						 26, 27, 28, 29, 30, 31, 32 };

static void finding(const char *what)
{
	fprintf(stderr, "finding: %s\n", what);
	abort();
}

/* The value a writer makes: header sealed, payload, tag. */
static size_t make(const struct slot_hdr *want, const uint8_t *payload, int keyed, uint8_t *out)
{
	struct slot_hdr h = *want;
	size_t body = sizeof(h) + PL;

	slot_hdr_seal(&h, kv_crc32c(0, payload, PL));
	memcpy(out, &h, sizeof(h));
	memcpy(out + sizeof(h), payload, PL);
	if (keyed && kv_g4mac_tag(key, out, body, out + body) < 0)
		finding("kv_g4mac_tag failed");
	return body + (keyed ? KV_G4MAC_TAG_BYTES : 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const struct slot_hdr raw = { .magic = SLOT_MAGIC, .version = SLOT_VERSION,
					     .ns = 0x1122334455667788ull,
					     .layout = 0x99aabbccddeeff00ull, .hash = { 7, 7, 7 },
					     .payload_len = PL };
	struct slot_hdr want = raw, other = raw;
	uint8_t payload[PL] = { 0 }, v[sizeof(struct slot_hdr) + PL + KV_G4MAC_TAG_BYTES + 1];
	const uint8_t *mk;
	size_t len, pos;
	int keyed, r;

	if (size < 3)
		return 0;
	keyed = data[0] & 1;
	if (data[0] & 4)
		want.flags = KV_QFMT_E4M3;
	else
		other.flags = KV_QFMT_E4M3;
	mk = keyed ? key : NULL;
	pos = (size_t)data[1] | (size_t)data[2] << 8;
	data += 3;
	size -= 3;
	if (data[-3] & 2) {
		/* A whole value from a hostile cluster: from the heap, its exact
		 * size, so that a read past it is reported. */
		uint8_t *copy = malloc(size ? size : 1);

		memcpy(copy, data, size);
		r = tier_remote_check(&want, mk, copy, size);
		if (r == G4_VALUE_GOOD) {
			if (size < sizeof(struct slot_hdr) + PL)
				finding("a short value accepted");
			len = make(&want, copy + sizeof(struct slot_hdr), keyed, v);
			if (len != size || memcmp(v, copy, len))
				finding("a value accepted that is not the writer's");
		}
		if (r == G4_VALUE_OVERSIZE && size <= sizeof(struct slot_hdr) + PL +
						      (keyed ? KV_G4MAC_TAG_BYTES : 0))
			finding("a value of the right size called oversize");
		free(copy);
		return 0;
	}
	memcpy(payload, data, size < PL ? size : PL);
	len = make(&want, payload, keyed, v);
	if (tier_remote_check(&want, mk, v, len) != G4_VALUE_GOOD)
		finding("the writer's value refused");
	if (tier_remote_check(&want, mk, v, len - 1) == G4_VALUE_GOOD)
		finding("a value one byte short accepted");
	v[len] = 0;
	if (tier_remote_check(&want, mk, v, len + 1) != G4_VALUE_OVERSIZE)
		finding("a value one byte long not refused as oversize");
	if (tier_remote_check(&want, mk, v, make(&other, payload, keyed, v)) == G4_VALUE_GOOD)
		finding("a value of the other format accepted");
	len = make(&want, payload, keyed, v);
	pos %= len;
	v[pos] ^= (uint8_t)((size ? data[0] : 0) | 1);
	if (tier_remote_check(&want, mk, v, len) == G4_VALUE_GOOD)
		finding("a value with a changed byte accepted");
	return 0;
}
#else
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	(void)data;
	(void)size;
	return 0;   /* no G4 in this build */
}
#endif
