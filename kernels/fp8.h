/* Scalar conversions between FP32, FP16, BF16 and FP8 E4M3 and E5M2, written once in
 * integer arithmetic and compiled both by the C compiler (quant.c, the
 * reference) and by nvcc (kernels.cu), so that the device produces exactly
 * the reference's bytes. Every function here is exact or rounds to nearest,
 * ties to even; none depends on the FPU's rounding mode, flush-to-zero or
 * fused multiply-add. The only floating-point operations of the quantizer
 * (one multiply per element, two divisions per group) are spelled with
 * kv_fmul/kv_fdiv: __fmul_rn/__fdiv_rn on the device, plain IEEE single
 * operations on the host (built with -ffp-contract=off). The decoders'
 * subnormal paths multiply a small integer by a power of two: exact, with a
 * normal FP32 result, so no mode can change them either.
 *
 * E4M3 as in the OCP 8-bit floating point spec (OFP8) and CUDA's
 * __nv_fp8_e4m3: sign, 4 exponent bits (bias 7), 3 mantissa bits; no
 * infinities; S.1111.111 is NaN; largest finite 448 (0x7E), smallest normal
 * 2^-6 (0x08), smallest subnormal 2^-9 (0x01). Conversion from FP32 follows
 * __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3): round to nearest
 * even, finite values beyond 448 and +-inf saturate to +-448, NaN becomes
 * 0x7F (sign dropped), values below half the smallest subnormal become a
 * signed zero. */
#ifndef KV_FP8_H
#define KV_FP8_H

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define KV_HD static inline __host__ __device__
#else
#define KV_HD static inline
#endif

#define KV_E4M3_MAX 448.0f
#define KV_E4M3_NAN 0x7Fu

KV_HD uint32_t kv_f32_bits(float f)
{
#if defined(__CUDA_ARCH__)
	return __float_as_uint(f);
#else
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
#endif
}

KV_HD float kv_bits_f32(uint32_t u)
{
#if defined(__CUDA_ARCH__)
	return __uint_as_float(u);
#else
	float f;

	memcpy(&f, &u, 4);
	return f;
#endif
}

KV_HD float kv_fmul(float a, float b)
{
#if defined(__CUDA_ARCH__)
	return __fmul_rn(a, b);
#else
	return a * b;
#endif
}

KV_HD float kv_fdiv(float a, float b)
{
#if defined(__CUDA_ARCH__)
	return __fdiv_rn(a, b);
#else
	return a / b;
#endif
}

/* Rounds m >> s to nearest even (1 <= s <= 31). */
KV_HD uint32_t kv_rne_shift(uint32_t m, unsigned s)
{
	uint32_t q = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);

	return q + (rem > half || (rem == half && (q & 1)));
}

/* ---- FP16 / BF16 <-> FP32 ----------------------------------------------- */

KV_HD float kv_f16_to_f32(uint16_t h)
{
	uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;

	if (e == 0x1f)  /* inf, NaN (payload kept, quiet bit set) */
		return kv_bits_f32(s | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0));
	if (e == 0)  /* zero or subnormal: m * 2^-24, exact in FP32 (a normal number) */
		return kv_bits_f32(s | kv_f32_bits((float)m * 0x1p-24f));
	return kv_bits_f32(s | ((e + 112) << 23) | (m << 13));  /* 112 = 127 - 15 */
}

/* Round to nearest even; overflow to inf; NaN to the quiet NaN 0x7E00 with
 * its sign. */
KV_HD uint16_t kv_f32_to_f16(float f)
{
	uint32_t u = kv_f32_bits(f), s = (u >> 16) & 0x8000, a = u & 0x7fffffffu;

	if (a > 0x7f800000u)
		return (uint16_t)(s | 0x7e00);
	if (a >= 0x477ff000u)  /* >= 65520: rounds to inf */
		return (uint16_t)(s | 0x7c00);
	if (a >= 0x38800000u)  /* >= 2^-14: normal */
		return (uint16_t)(s | (((a + 0xfff + ((a >> 13) & 1)) >> 13) - (112u << 10)));
	if (a < 0x33000000u)   /* < 2^-25 (half the smallest subnormal): zero */
		return (uint16_t)s;
	/* Subnormal: value * 2^24 = mant * 2^(E - 126), 14 <= 126 - E <= 24. */
	return (uint16_t)(s | kv_rne_shift((a & 0x7fffff) | 0x800000, 126 - (a >> 23)));
}

KV_HD float kv_bf16_to_f32(uint16_t b)
{
	return kv_bits_f32((uint32_t)b << 16);
}

/* Round to nearest even; NaN stays NaN (quiet bit set). */
KV_HD uint16_t kv_f32_to_bf16(float f)
{
	uint32_t u = kv_f32_bits(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* ---- E4M3 --------------------------------------------------------------- */

KV_HD uint8_t kv_f32_to_e4m3(float f)
{
	uint32_t u = kv_f32_bits(f), s = (u >> 24) & 0x80, a = u & 0x7fffffffu, r;

	if (a > 0x7f800000u)
		return KV_E4M3_NAN;
	if (a >= 0x3c800000u) {  /* >= 2^-6: normal (or saturated) */
		/* From 464 up (inf too) rounding would give 480 (the NaN code)
		 * or more: saturate. 464 itself is a tie, to the even 448. */
		if (a >= 0x43e80000u)
			return (uint8_t)(s | 0x7e);
		r = ((a + 0x7ffff + ((a >> 20) & 1)) >> 20) - (120u << 3);  /* 120 = 127 - 7 */
		return (uint8_t)(s | r);
	}
	if (a < 0x3a800000u)  /* < 2^-10, half the smallest subnormal: zero */
		return (uint8_t)s;
	/* Subnormal (2^-10 itself is a tie, to the even zero): value * 2^9 =
	 * mant * 2^(E - 141), 21 <= 141 - E <= 24; a
	 * result of 8 is the smallest normal, which is the right encoding. */
	return (uint8_t)(s | kv_rne_shift((a & 0x7fffff) | 0x800000, 141 - (a >> 23)));
}

KV_HD float kv_e4m3_to_f32(uint8_t q)
{
	uint32_t s = (uint32_t)(q & 0x80) << 24, e = (q >> 3) & 0xf, m = q & 7;

	if ((q & 0x7f) == 0x7f)
		return kv_bits_f32(0x7fc00000u | s);
	if (e == 0)  /* zero or subnormal: m * 2^-9, exact in FP32 */
		return kv_bits_f32(s | kv_f32_bits((float)m * 0x1p-9f));
	return kv_bits_f32(s | ((e + 120) << 23) | (m << 20));
}

/* ---- E5M2 --------------------------------------------------------------- */

/* E5M2 as in OFP8 and CUDA's __nv_fp8_e5m2: sign, 5 exponent bits (bias
 * 15), 2 mantissa bits (FP16's top byte); S.11111.00 is infinity, S.11111.xx
 * (xx != 0) NaN; largest finite 57344 (0x7B), smallest normal 2^-14 (0x04),
 * smallest subnormal 2^-16 (0x01). Conversion from FP32 as
 * __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2): round to nearest
 * even, finite values from 61440 up (ties to even past 57344 give 65536)
 * and +-inf saturate to +-57344, NaN becomes 0x7F, below half the smallest
 * subnormal a signed zero. Wider range than E4M3, one mantissa bit fewer:
 * twice its relative error (2^-3). */
#define KV_E5M2_MAX 57344.0f
#define KV_E5M2_NAN 0x7Fu

KV_HD uint8_t kv_f32_to_e5m2(float f)
{
	uint32_t u = kv_f32_bits(f), s = (u >> 24) & 0x80, a = u & 0x7fffffffu, r;

	if (a > 0x7f800000u)
		return KV_E5M2_NAN;
	if (a >= 0x38800000u) {  /* >= 2^-14: normal (or saturated) */
		if (a >= 0x47700000u)  /* >= 61440 (inf too): saturate */
			return (uint8_t)(s | 0x7b);
		r = ((a + 0xfffff + ((a >> 21) & 1)) >> 21) - (112u << 2);  /* 112 = 127 - 15 */
		return (uint8_t)(s | r);
	}
	if (a < 0x37000000u)  /* < 2^-17, half the smallest subnormal: zero */
		return (uint8_t)s;
	/* Subnormal: value * 2^16 = mant * 2^(E - 134), 22 <= 134 - E <= 24;
	 * a result of 4 is the smallest normal, the right encoding. */
	return (uint8_t)(s | kv_rne_shift((a & 0x7fffff) | 0x800000, 134 - (a >> 23)));
}

KV_HD float kv_e5m2_to_f32(uint8_t q)
{
	uint32_t s = (uint32_t)(q & 0x80) << 24, e = (q >> 2) & 0x1f, m = q & 3;

	if (e == 0x1f)
		return kv_bits_f32(m ? 0x7fc00000u | s : 0x7f800000u | s);
	if (e == 0)  /* zero or subnormal: m * 2^-16, exact in FP32 */
		return kv_bits_f32(s | kv_f32_bits((float)m * 0x1p-16f));
	return kv_bits_f32(s | ((e + 112) << 23) | (m << 21));
}

/* ---- block quantization ------------------------------------------------- */

/* Below this a group's largest magnitude is treated as zero: scale 1, so the
 * group quantizes to (signed) zeros and tiny subnormals, an absolute error
 * under 2^-100, instead of an inverse scale that overflows. */
#define KV_QUANT_TINY 0x1p-100f

/* scale = amax / max and inv = max / amax, both rounded once; max is the
 * format's largest finite value (KV_E4M3_MAX, KV_E5M2_MAX). */
KV_HD void kv_quant_scale_to(float amax, float max, float *scale, float *inv)
{
	if (!(amax >= KV_QUANT_TINY)) {
		*scale = 1.0f;
		*inv = 1.0f;
		return;
	}
	*scale = kv_fdiv(amax, max);
	*inv = kv_fdiv(max, amax);
}

/* E4M3's: scale = amax / 448 and inv = 448 / amax. */
KV_HD void kv_quant_scale(float amax, float *scale, float *inv)
{
	kv_quant_scale_to(amax, KV_E4M3_MAX, scale, inv);
}

KV_HD uint8_t kv_quant_elem(float x, float inv)
{
	return kv_f32_to_e4m3(kv_fmul(x, inv));
}

/* A NaN code, or a NaN scale, gives the one quiet NaN 0x7FC00000: the
 * device's multiply returns its own canonical NaN (0x7FFFFFFF) where the
 * host's keeps the operand's payload, so neither is used for it. */
KV_HD float kv_dequant_elem(uint8_t q, float scale)
{
	float r = kv_fmul(kv_e4m3_to_f32(q), scale);

	if ((kv_f32_bits(r) & 0x7fffffffu) > 0x7f800000u)
		return kv_bits_f32(0x7fc00000u);
	return r;
}

KV_HD uint8_t kv_quant_elem_e5m2(float x, float inv)
{
	return kv_f32_to_e5m2(kv_fmul(x, inv));
}

/* As kv_dequant_elem(); E5M2's infinity codes (never made by the quantizer)
 * come back as infinities. */
KV_HD float kv_dequant_elem_e5m2(uint8_t q, float scale)
{
	float r = kv_fmul(kv_e5m2_to_f32(q), scale);

	if ((kv_f32_bits(r) & 0x7fffffffu) > 0x7f800000u)
		return kv_bits_f32(0x7fc00000u);
	return r;
}

/* |x| as bits, or 0 for inf and NaN (they do not set a group's scale). For
 * finite values of either format the bits order as the magnitudes do. */
KV_HD uint16_t kv_f16_abs_finite(uint16_t h)
{
	return (h & 0x7fff) < 0x7c00 ? (uint16_t)(h & 0x7fff) : 0;
}

KV_HD uint16_t kv_bf16_abs_finite(uint16_t b)
{
	return (b & 0x7fff) < 0x7f80 ? (uint16_t)(b & 0x7fff) : 0;
}

#endif
