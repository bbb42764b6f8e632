/* CRC32C: the standard check value, the RFC 3720 (iSCSI) vectors, and the
 * SSE4.2 path against the table path and a bitwise definition on random
 * buffers at every alignment, around the three-stream boundaries (the 6 KiB
 * rounds and the 768-byte ones after them), at random lengths and
 * alignments, and chained and combined in pieces. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "crc32c.h"
#include "crc32c_parts.h"

/* The definition, one bit at a time. */
static uint32_t crc_bitwise(uint32_t crc, const uint8_t *p, size_t n)
{
	crc = ~crc;
	while (n--) {
		crc ^= *p++;
		for (int k = 0; k < 8; k++)
			crc = crc & 1 ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
	}
	return ~crc;
}

static uint64_t rnd_state = 0x2545F4914F6CDD1Dull;

static uint64_t rnd(void)
{
	rnd_state ^= rnd_state << 13;
	rnd_state ^= rnd_state >> 7;
	rnd_state ^= rnd_state << 17;
	return rnd_state;
}

/* The device kernel's algorithm (kv_crc32c_batch), thread by thread. */
static uint32_t crc_kernel_sim(const uint8_t *p, uint64_t n)
{
	enum { T = 256 };
	static uint32_t tab[4 * 256], x2n[32];
	uint32_t part[T];
	uint64_t plen[T], lo, hi;
	unsigned t, s;

	for (t = 0; t < 256; t++)
		tab[t] = kv_crc_tab0(t);
	for (s = 1; s < 4; s++)
		for (t = 0; t < 256; t++)
			tab[s * 256 + t] = (tab[(s - 1) * 256 + t] >> 8) ^
					   tab[tab[(s - 1) * 256 + t] & 0xff];
	kv_crc_x2n_init(x2n);
	for (t = 0; t < T; t++) {
		kv_crc_split(n, T, t, &lo, &hi);
		part[t] = kv_crc_piece(p, lo, hi, tab);
		plen[t] = hi - lo;
	}
	for (s = 1; s < T; s <<= 1)
		for (t = 0; t < T; t++)
			if ((t & (2 * s - 1)) == 0 && t + s < T) {
				part[t] = kv_crc_shift(part[t], plen[t + s], x2n) ^ part[t + s];
				plen[t] += plen[t + s];
			}
	CHECK_EQ(plen[0], n);
	return kv_crc_finish(part[0], n, x2n);
}

int main(void)
{
	/* RFC 3720, B.4: a SCSI Read (10) command PDU. */
	static const uint8_t read_pdu[48] = {
		0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
		0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
		0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
		0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
	};
	uint8_t b[32];
	size_t big = 3 * 3 * 2048 + 777, n, off, i;
	uint8_t *buf = malloc(big + 16);

	fprintf(stderr, "crc32c implementation: %s\n", kv_crc32c_impl());
	CHECK(buf != NULL);
	CHECK_EQ(kv_crc32c(0, "123456789", 9), 0xE3069283u);
	CHECK_EQ(kv_crc32c_sw(0, "123456789", 9), 0xE3069283u);
	CHECK_EQ(kv_crc32c(0, NULL, 0), 0);
	CHECK_EQ(kv_crc32c(0x12345678u, NULL, 0), 0x12345678u);
	memset(b, 0, 32);
	CHECK_EQ(kv_crc32c(0, b, 32), 0x8A9136AAu);
	memset(b, 0xff, 32);
	CHECK_EQ(kv_crc32c(0, b, 32), 0x62A8AB43u);
	for (i = 0; i < 32; i++)
		b[i] = (uint8_t)i;
	CHECK_EQ(kv_crc32c(0, b, 32), 0x46DD794Eu);
	for (i = 0; i < 32; i++)
		b[i] = (uint8_t)(31 - i);
	CHECK_EQ(kv_crc32c(0, b, 32), 0x113FDB5Cu);
	CHECK_EQ(kv_crc32c(0, read_pdu, 48), 0xD9963A56u);
	CHECK_EQ(kv_crc32c_sw(0, read_pdu, 48), 0xD9963A56u);
	CHECK_EQ(crc_kernel_sim(read_pdu, 48), 0xD9963A56u);
	CHECK_EQ(crc_kernel_sim((const uint8_t *)"123456789", 9), 0xE3069283u);

	for (i = 0; i < big + 16; i++)
		buf[i] = (uint8_t)rnd();
	/* Every alignment, lengths around the 6 KiB rounds of the SSE path. */
	for (off = 0; off < 9; off++) {
		size_t lens[] = { 0,    1,    7,    8,     9,     63,    767,   768,
				  769,  1535, 1536, 4096, 6143,  6144,  6145,  6144 + 767,
				  6144 + 768, 12288 + 5, 16384, 16384 + 80, big };

		for (i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
			uint32_t want = crc_bitwise(0, buf + off, lens[i]);

			n = lens[i];
			CHECK_EQ(kv_crc32c(0, buf + off, n), want);
			CHECK_EQ(kv_crc32c_sw(0, buf + off, n), want);
			CHECK_EQ(crc_kernel_sim(buf + off, n), want);
		}
	}
	/* Random lengths at random alignments: every mix of long rounds, short
	 * rounds and the single stream. */
	for (i = 0; i < 3000; i++) {
		size_t o = (size_t)(rnd() % 16), len = (size_t)(rnd() % (big + 1 - o));
		uint32_t seed = i & 1 ? (uint32_t)rnd() : 0;

		CHECK_EQ(kv_crc32c(seed, buf + o, len), kv_crc32c_sw(seed, buf + o, len));
		if (i % 100 == 0)
			CHECK_EQ(kv_crc32c(seed, buf + o, len), crc_bitwise(seed, buf + o, len));
	}
	/* The copy that sums (kv_crc32c_copy): the same sum, every byte
	 * copied, none outside dst, at every mix of alignments and rounds. */
	{
		uint8_t *dst = malloc(big + 64);

		CHECK(dst != NULL);
		for (i = 0; i < 2000; i++) {
			size_t o = (size_t)(rnd() % 16), od = 8 + (size_t)(rnd() % 16);
			size_t len = i < 64 ? i * 97 % (big - 16) : (size_t)(rnd() % (big + 1 - o));
			uint32_t seed = i & 1 ? (uint32_t)rnd() : 0;

			if (i % 7 == 0)
				len = (size_t)(rnd() % 4) * 6144 + (size_t)(rnd() % 3) * 768 +
				      (size_t)(rnd() % 17);
			if (len + o > big)
				len = big - o;
			memset(dst, 0xA5, big + 64);
			CHECK_EQ(kv_crc32c_copy(seed, dst + od, buf + o, len),
				 kv_crc32c_sw(seed, buf + o, len));
			CHECK(memcmp(dst + od, buf + o, len) == 0);
			for (size_t k = 0; k < od; k++)
				CHECK_EQ(dst[k], 0xA5);
			for (size_t k = od + len; k < big + 64; k++)
				CHECK_EQ(dst[k], 0xA5);
		}
		free(dst);
	}
	/* Chained in pieces, and combined from independent pieces. */
	for (i = 0; i < 200; i++) {
		size_t cut = (size_t)(rnd() % big), len = big;
		uint32_t whole = kv_crc32c(0, buf, len);
		uint32_t a = kv_crc32c(0, buf, cut), bb = kv_crc32c(0, buf + cut, len - cut);

		CHECK_EQ(kv_crc32c(a, buf + cut, len - cut), whole);
		CHECK_EQ(kv_crc32c_combine(a, bb, len - cut), whole);
		CHECK_EQ(kv_crc32c_sw(kv_crc32c_sw(0, buf, cut), buf + cut, len - cut), whole);
	}
	free(buf);
	return 0;
}
