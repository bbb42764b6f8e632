/* CRC32C on the host; see crc32c.h.
 *
 * The algebra (as in zlib's crc32_combine): in the reflected representation
 * a 32-bit CRC register r is a polynomial mod P. Feeding n zero bytes to the
 * register multiplies it by x^(8n) mod P, and the register update is linear,
 * so for data A|B with |B| = n: R(r, A|B) = R(r, A) * x^(8n) ^ R(0, B). The
 * three-stream SSE4.2 path and the device kernel both rely on it. */
#include "crc32c.h"

#include <string.h>

#include "crc32c_parts.h"  /* the polynomial arithmetic, shared with the kernel */

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define KV_CRC_X86 1
#else
#define KV_CRC_X86 0
#endif

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "crc32c.c assumes a little-endian machine"
#endif

/* Bytes per stream in the three-stream loop: 3 x 2 KiB per round, then
 * rounds of 3 x 256 bytes for what is left, so that at most 767 bytes go
 * through one stream (whose crc32 waits on the one before: a third of the
 * rate). A 16 KiB payload (a G4 value's, a G2 slot's) was two long rounds
 * and 4 KiB in one stream, about 3,070 cycles; now about 2,150. */
#define LANE 2048
#define SHORT 256

static uint32_t table[8][256];   /* slicing-by-8 */
static uint32_t x2n[32];         /* x^(2^k) mod P */
static uint32_t shift_lane[4][256];  /* r -> r * x^(8 LANE) mod P, by byte */
static uint32_t shift_short[4][256]; /* r -> r * x^(8 SHORT) mod P, by byte */
static int have_sse42;

__attribute__((constructor)) static void crc_init(void)
{
	uint32_t xl, xs;
	unsigned i, k;

	for (i = 0; i < 256; i++)
		table[0][i] = kv_crc_tab0(i);
	for (k = 1; k < 8; k++)
		for (i = 0; i < 256; i++)
			table[k][i] = (table[k - 1][i] >> 8) ^ table[0][table[k - 1][i] & 0xff];
	kv_crc_x2n_init(x2n);
	xl = kv_crc_shift(1u << 31, LANE, x2n);  /* x^(8 LANE) */
	xs = kv_crc_shift(1u << 31, SHORT, x2n);
	for (k = 0; k < 4; k++)
		for (i = 0; i < 256; i++) {
			shift_lane[k][i] = kv_crc_multmodp(xl, i << (8 * k));
			shift_short[k][i] = kv_crc_multmodp(xs, i << (8 * k));
		}
#if KV_CRC_X86
	__builtin_cpu_init();
	have_sse42 = __builtin_cpu_supports("sse4.2");
#endif
}

uint32_t kv_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
	return kv_crc_shift(crc_a, len_b, x2n) ^ crc_b;
}

static inline uint64_t load64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return v;
}

uint32_t kv_crc32c_sw(uint32_t crc, const void *buf, size_t n)
{
	const uint8_t *p = buf;
	uint32_t c = ~crc;

	while (n && ((uintptr_t)p & 7)) {
		c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
		n--;
	}
	while (n >= 8) {
		uint64_t w = load64(p) ^ c;

		c = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
		    table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^
		    table[2][(w >> 40) & 0xff] ^ table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
		p += 8;
		n -= 8;
	}
	while (n--)
		c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
	return ~c;
}

#if KV_CRC_X86
static inline uint32_t shift_by(const uint32_t (*tab)[256], uint32_t r)
{
	return tab[0][r & 0xff] ^ tab[1][(r >> 8) & 0xff] ^ tab[2][(r >> 16) & 0xff] ^
	       tab[3][r >> 24];
}

/* Rounds of three streams of lane bytes each over *p while *n holds one,
 * joined by tab (x^(8 lane)); returns the register, *p and *n moved past
 * them. Always inlined, so lane is a constant in each loop. */
__attribute__((target("sse4.2"))) static inline __attribute__((always_inline)) uint64_t
crc_rounds(uint64_t c, const uint8_t **pp, size_t *np, size_t lane, const uint32_t (*tab)[256])
{
	const uint8_t *p = *pp;
	size_t n = *np;

	while (n >= 3 * lane) {
		uint64_t a = c, b = 0, d = 0;

		for (size_t i = 0; i < lane; i += 8) {
			a = _mm_crc32_u64(a, load64(p + i));
			b = _mm_crc32_u64(b, load64(p + lane + i));
			d = _mm_crc32_u64(d, load64(p + 2 * lane + i));
		}
		c = shift_by(tab, shift_by(tab, (uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)d;
		p += 3 * lane;
		n -= 3 * lane;
	}
	*pp = p;
	*np = n;
	return c;
}

/* The crc32 instruction has a latency of 3 cycles and a throughput of 1:
 * three independent streams keep it busy; their registers are joined by
 * shifting (multiplying by x^(8 LANE)) and xoring. */
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p,
							  size_t n)
{
	uint64_t c = ~crc;

	while (n && ((uintptr_t)p & 7)) {
		c = _mm_crc32_u8((uint32_t)c, *p++);
		n--;
	}
	c = crc_rounds(c, &p, &n, LANE, shift_lane);
	c = crc_rounds(c, &p, &n, SHORT, shift_short);
	while (n >= 8) {
		c = _mm_crc32_u64(c, load64(p));
		p += 8;
		n -= 8;
	}
	while (n--)
		c = _mm_crc32_u8((uint32_t)c, *p++);
	return ~(uint32_t)c;
}
#endif

uint32_t kv_crc32c(uint32_t crc, const void *p, size_t n)
{
#if KV_CRC_X86
	if (have_sse42)
		return crc_hw(crc, p, n);
#endif
	return kv_crc32c_sw(crc, p, n);
}

/* Chunks of COPY_CHUNK: each summed right after its memcpy, from L1 (a
 * fused loop, each 8 or 32 bytes summed as they were stored, was measured
 * no faster than this on this machine's Zen 3: glibc's copy is the better
 * copy, and the sum of a chunk just written costs 40-60 ms per GB against
 * 100-110 for the same bytes cold). */
#ifndef COPY_CHUNK
#define COPY_CHUNK 8192
#endif

uint32_t kv_crc32c_copy(uint32_t crc, void *dst, const void *src, size_t n)
{
	uint8_t *d = dst;
	const uint8_t *s = src;

	while (n) {
		size_t k = n < COPY_CHUNK ? n : COPY_CHUNK;

		memcpy(d, s, k);
		crc = kv_crc32c(crc, d, k);
		d += k;
		s += k;
		n -= k;
	}
	return crc;
}

const char *kv_crc32c_impl(void)
{
	return have_sse42 ? "sse4.2" : "table";
}
