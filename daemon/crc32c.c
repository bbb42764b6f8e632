#include "crc32c.h"

#include <string.h>

static uint32_t table[8][256];
static int have_sse42 = -1;

static void init(void)
{
	uint32_t i, j, c;

	for (i = 0; i < 256; i++) {
		c = i;
		for (j = 0; j < 8; j++)
			c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
		table[0][i] = c;
	}
	for (i = 0; i < 256; i++)
		for (j = 1; j < 8; j++)
			table[j][i] = (table[j - 1][i] >> 8) ^ table[0][table[j - 1][i] & 0xff];
#if defined(__x86_64__)
	have_sse42 = __builtin_cpu_supports("sse4.2");
#else
	have_sse42 = 0;
#endif
}

/* Slicing by 8. */
static uint32_t crc_table(uint32_t c, const uint8_t *p, size_t n)
{
	while (n >= 8) {
		uint64_t w;

		memcpy(&w, p, 8);
		w ^= c;
		c = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
		    table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^
		    table[2][(w >> 40) & 0xff] ^ table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
		p += 8;
		n -= 8;
	}
	while (n--)
		c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
	return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t c, const uint8_t *p, size_t n)
{
	uint64_t c64 = c;

	while (n >= 8) {
		uint64_t x;

		memcpy(&x, p, 8);
		c64 = __builtin_ia32_crc32di(c64, x);
		p += 8;
		n -= 8;
	}
	c = (uint32_t)c64;
	while (n--)
		c = __builtin_ia32_crc32qi(c, *p++);
	return c;
}
#endif

uint32_t kv_crc32c(uint32_t crc, const void *p, size_t n)
{
	uint32_t c = ~crc;

	if (have_sse42 < 0)
		init();
#if defined(__x86_64__)
	if (have_sse42)
		return ~crc_hw(c, p, n);
#endif
	return ~crc_table(c, p, n);
}
