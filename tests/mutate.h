/* tests/mutate.h: what the tests that check a hand-written decoder against
 * protobuf-c's share (test_req_unpack, test_reply_unpack): a failure
 * counted while the run goes on, and random edits of a packed frame, for
 * frames that are not quite what a packer writes. */
#ifndef KVT_MUTATE_H
#define KVT_MUTATE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The failures so far: the test exits 1 when there are any. */
static int fails;

#define FAIL(...)                                                            \
	do {                                                                 \
		fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);         \
		fprintf(stderr, __VA_ARGS__);                                \
		fprintf(stderr, "\n");                                       \
		fails++;                                                     \
	} while (0)

/* xorshift64: the next number of state *s (not zero). */
static inline uint64_t kvt_rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* mut[0..n) edited one to three times at random: a byte changed, a bit
 * flipped, the frame cut, a byte put in. mut has room for n + 3 bytes.
 * Returns its new length. */
static inline size_t kvt_mutate(uint8_t *mut, size_t n, uint64_t *s)
{
	int edits = 1 + (int)(kvt_rnd(s) % 3);

	for (int e = 0; e < edits; e++) {
		switch (kvt_rnd(s) % 4) {
		case 0:   /* a byte changed */
			if (n)
				mut[kvt_rnd(s) % n] = (uint8_t)kvt_rnd(s);
			break;
		case 1:   /* a bit flipped */
			if (n)
				mut[kvt_rnd(s) % n] ^= (uint8_t)(1u << (kvt_rnd(s) % 8));
			break;
		case 2:   /* cut */
			if (n)
				n = kvt_rnd(s) % n;
			break;
		default: { /* a byte put in */
			size_t at = n ? kvt_rnd(s) % (n + 1) : 0;

			memmove(mut + at + 1, mut + at, n - at);
			mut[at] = (uint8_t)kvt_rnd(s);
			n++;
		}
		}
	}
	return n;
}

#endif
