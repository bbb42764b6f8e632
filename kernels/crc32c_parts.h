/* The pieces of the device CRC32C (kernels.cu, kv_crc32c_batch), written
 * once for nvcc and the C compiler so that tests/test_crc32c.c can run the
 * kernel's algorithm on the host, thread by thread, against kv_crc32c().
 *
 * A CUDA block of T threads computes one buffer's CRC: thread t takes the
 * t-th piece of ceil(n / T) bytes rounded up to 16, computes its raw register
 * R(0, piece) (initial 0, no final inversion) with slicing-by-4 tables, the
 * pieces are joined pairwise, R(0, A|B) = R(0, A) * x^(8|B|) ^ R(0, B), and
 * the standard value is ~(~0 * x^(8n) ^ R(0, data)). */
#ifndef KV_CRC32C_PARTS_H
#define KV_CRC32C_PARTS_H

#include <stdint.h>

#include "fp8.h"  /* KV_HD */

#define KV_CRC_POLY 0x82F63B78u

/* a * b mod P, reflected. */
KV_HD uint32_t kv_crc_multmodp(uint32_t a, uint32_t b)
{
	uint32_t m = 1u << 31, p = 0;

	for (;;) {
		if (a & m) {
			p ^= b;
			if ((a & (m - 1)) == 0)
				break;
		}
		m >>= 1;
		b = b & 1 ? (b >> 1) ^ KV_CRC_POLY : b >> 1;
	}
	return p;
}

/* x2n[k] = x^(2^k) mod P. */
KV_HD void kv_crc_x2n_init(uint32_t *x2n)
{
	uint32_t p = 1u << 30;  /* x^1 */

	for (int k = 0; k < 32; k++) {
		x2n[k] = p;
		p = kv_crc_multmodp(p, p);
	}
}

/* The byte table: tab[k][i] for slicing-by-4, entry i of row k (k 0..3).
 * Row 0 first, then each row from the one before. */
KV_HD uint32_t kv_crc_tab0(uint32_t i)
{
	for (int k = 0; k < 8; k++)
		i = i & 1 ? (i >> 1) ^ KV_CRC_POLY : i >> 1;
	return i;
}

/* r * x^(8 len) mod P: the register after len more zero bytes. */
KV_HD uint32_t kv_crc_shift(uint32_t r, uint64_t len, const uint32_t *x2n)
{
	uint32_t p = 1u << 31;
	unsigned k = 3;

	while (len) {
		if (len & 1)
			p = kv_crc_multmodp(x2n[k & 31], p);
		len >>= 1;
		k++;
	}
	return kv_crc_multmodp(p, r);
}

/* R(0, p[lo, hi)). tab is 4 x 256 entries, row-major. */
KV_HD uint32_t kv_crc_piece(const uint8_t *p, uint64_t lo, uint64_t hi, const uint32_t *tab)
{
	uint32_t r = 0;
	uint64_t i = lo;

	if (((uintptr_t)(p + lo) & 3) == 0) {
		for (; i + 4 <= hi; i += 4) {
			uint32_t w = *(const uint32_t *)(const void *)(p + i) ^ r;

			r = tab[3 * 256 + (w & 0xff)] ^ tab[2 * 256 + ((w >> 8) & 0xff)] ^
			    tab[256 + ((w >> 16) & 0xff)] ^ tab[w >> 24];
		}
	}
	for (; i < hi; i++)
		r = (r >> 8) ^ tab[(r ^ p[i]) & 0xff];
	return r;
}

/* Thread t's piece of n bytes among nthreads: [*lo, *hi). */
KV_HD void kv_crc_split(uint64_t n, unsigned nthreads, unsigned t, uint64_t *lo, uint64_t *hi)
{
	uint64_t chunk = ((n + nthreads - 1) / nthreads + 15) & ~(uint64_t)15;

	*lo = (uint64_t)t * chunk;
	*hi = *lo + chunk < n ? *lo + chunk : n;
	if (*lo >= n)
		*lo = *hi = n;
}

/* The standard CRC from the joined raw register of n bytes. */
KV_HD uint32_t kv_crc_finish(uint32_t raw, uint64_t n, const uint32_t *x2n)
{
	return ~(kv_crc_shift(0xffffffffu, n, x2n) ^ raw);
}

#endif
