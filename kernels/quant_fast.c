/* Fast host block quantization; see quant_fast.h. Every path gives exactly
 * the reference's bytes (quant.c, fp8.h): tests/test_quant_fast.c checks
 * each against it over every FP16 and BF16 bit pattern and every FP8 code.
 *
 * Why the bytes are the same:
 * - FP8 -> FP32 (dequant): the portable path reads a 256-entry table filled
 *   at start-up by fp8.h's own decoders; the AVX2 path computes the same
 *   floats (bits moved into place; a subnormal's m * 2^-9 is exact), which
 *   beat a table gather;
 * - FP16 -> FP32 (quant): F16C's vcvtph2ps, exact for every input (a NaN
 *   stays a NaN, all the encoder looks at), or fp8.h's; BF16 is a shift;
 * - the one multiply per element is an IEEE single multiply in both (SSE or
 *   AVX; nothing to fuse it with, and -ffp-contract=off);
 * - after the multiply a NaN becomes the one quiet NaN, as kv_dequant_elem()
 *   does; FP32 -> FP16 is then vcvtps2ph with round to nearest even from the
 *   immediate (not MXCSR), which rounds, overflows to inf and makes
 *   subnormals as kv_f32_to_f16() does; FP32 -> BF16 of a non-NaN (or of the
 *   canonical NaN) is kv_f32_to_bf16()'s add-and-shift;
 * - FP32 -> FP8 (quant): fp8.h's kv_f32_to_e4m3 / e5m2 on the portable path;
 *   on the AVX2 path the same as one branchless formula: a normal result
 *   rounds the bits less the exponent bias, a subnormal one the mantissa
 *   with its hidden bit, both by round to nearest even of a right shift
 *   ((v + half - 1 + lsb) >> sh, as kv_rne_shift); a shift of 25 or more
 *   (clamped to 31) gives 0, the reference's zero range; then saturation
 *   and NaN as the reference's first two tests.
 *
 * The AVX2 path does 8 elements per step (16 for amax) within each group and
 * leaves a group's last few to the portable code. */
#include "quant_fast.h"

#include <string.h>

#include "fp8.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define KV_QF_X86 1
#else
#define KV_QF_X86 0
#endif

/* kv_f32_to_e4m3 / kv_f32_to_e5m2 as parameters of one formula. */
struct fp8_enc {
	uint32_t norm_min;  /* |x| bits from which the result is normal */
	uint32_t sat_min;   /* from which it saturates (inf too) */
	uint32_t sat;       /* the largest finite code */
	uint32_t sh;        /* FP32 mantissa bits a normal result drops */
	uint32_t bias;      /* (127 - the format's bias) << 23 */
	uint32_t sub;       /* a subnormal result shifts by sub - the exponent field */
};

static const struct fp8_enc enc_e4m3 = { 0x3c800000u, 0x43e80000u, 0x7e, 20, 120u << 23, 141 };
static const struct fp8_enc enc_e5m2 = { 0x38800000u, 0x47700000u, 0x7b, 21, 112u << 23, 134 };

static float dec_e4m3[256], dec_e5m2[256];
static enum kv_qimpl best, cur;

__attribute__((constructor)) static void qfast_init(void)
{
	for (unsigned i = 0; i < 256; i++) {
		dec_e4m3[i] = kv_e4m3_to_f32((uint8_t)i);
		dec_e5m2[i] = kv_e5m2_to_f32((uint8_t)i);
	}
	best = KV_QIMPL_PORTABLE;
#if KV_QF_X86
	{
		/* The builtin checks that the OS saves the AVX state; clang 14's
		 * does not know "f16c", so CPUID leaf 1 says that. */
		unsigned a, b, c, d;

		__builtin_cpu_init();
		if (__builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) &&
		    (c & bit_F16C))
			best = KV_QIMPL_AVX2;
	}
#endif
	cur = best;
}

enum kv_qimpl kv_qfast_select(enum kv_qimpl impl)
{
	cur = impl < best ? impl : best;
	return cur;
}

const char *kv_qfast_impl(void)
{
	return cur == KV_QIMPL_AVX2 ? "avx2" : cur == KV_QIMPL_PORTABLE ? "portable" : "reference";
}

/* ---- portable: table decode (dequant), the reference's arithmetic (quant) */

static uint16_t amax_port(enum kv_dtype t, const uint8_t *s, size_t lo, size_t hi)
{
	uint16_t lim = t == KV_DTYPE_F16 ? 0x7c00 : 0x7f80, m = 0;

	for (size_t i = lo; i < hi; i++) {
		uint16_t a = ld16(s, i) & 0x7fff;

		a = a < lim ? a : 0;
		m = a > m ? a : m;
	}
	return m;
}

/* fp8.h's encoders themselves: one element at a time, their branches
 * (predictable on real data) cost fewer instructions than the branchless
 * formula. */
static void quant_port(const struct fp8_enc *e, enum kv_dtype t, const uint8_t *s, size_t lo,
		       size_t hi, float inv, uint8_t *q)
{
	if (e == &enc_e4m3)
		for (size_t i = lo; i < hi; i++)
			q[i] = kv_quant_elem(to_f32(t, ld16(s, i)), inv);
	else
		for (size_t i = lo; i < hi; i++)
			q[i] = kv_quant_elem_e5m2(to_f32(t, ld16(s, i)), inv);
}

static void dequant_port(const float *dec, enum kv_dtype t, const uint8_t *q, size_t lo,
			 size_t hi, float scale, uint8_t *d)
{
	for (size_t i = lo; i < hi; i++) {
		float x = kv_fmul(dec[q[i]], scale);
		uint16_t v;

		if ((kv_f32_bits(x) & 0x7fffffffu) > 0x7f800000u)
			x = kv_bits_f32(0x7fc00000u);
		v = t == KV_DTYPE_F16 ? kv_f32_to_f16(x) : kv_f32_to_bf16(x);
		memcpy(d + 2 * i, &v, 2);
	}
}

/* ---- AVX2 + F16C -------------------------------------------------------- */

#if KV_QF_X86
#define AVX2 __attribute__((target("avx2,f16c")))

#define I32(x) _mm256_set1_epi32((int)(x))

AVX2 static inline __m256i enc8(const struct fp8_enc *e, __m256i u)
{
	const __m256i one = I32(1);
	__m256i a = _mm256_and_si256(u, I32(0x7fffffff));
	__m256i s = _mm256_and_si256(_mm256_srli_epi32(u, 24), I32(0x80));
	__m256i norm = _mm256_cmpgt_epi32(a, I32(e->norm_min - 1));  /* a >= 0: signed compare */
	__m256i v = _mm256_blendv_epi8(_mm256_or_si256(_mm256_and_si256(a, I32(0x7fffff)),
						       I32(0x800000)),
				       _mm256_sub_epi32(a, I32(e->bias)), norm);
	__m256i shs = _mm256_min_epu32(_mm256_sub_epi32(I32(e->sub), _mm256_srli_epi32(a, 23)),
				       I32(31));
	__m256i sh = _mm256_blendv_epi8(shs, I32(e->sh), norm);
	__m256i half1 = _mm256_sub_epi32(_mm256_sllv_epi32(one, _mm256_sub_epi32(sh, one)), one);
	__m256i lsb = _mm256_and_si256(_mm256_srlv_epi32(v, sh), one);
	__m256i r = _mm256_srlv_epi32(_mm256_add_epi32(_mm256_add_epi32(v, half1), lsb), sh);

	r = _mm256_blendv_epi8(r, I32(e->sat), _mm256_cmpgt_epi32(a, I32(e->sat_min - 1)));
	r = _mm256_or_si256(r, s);
	return _mm256_blendv_epi8(r, I32(0x7f), _mm256_cmpgt_epi32(a, I32(0x7f800000)));
}

AVX2 static uint16_t amax_avx2(enum kv_dtype t, const uint8_t *s, size_t lo, size_t hi)
{
	__m256i lim = _mm256_set1_epi16(t == KV_DTYPE_F16 ? 0x7c00 : 0x7f80), m = _mm256_setzero_si256();
	uint16_t lanes[16], r;
	size_t i = lo;

	for (; i + 16 <= hi; i += 16) {
		__m256i a = _mm256_and_si256(_mm256_loadu_si256((const void *)(s + 2 * i)),
					     _mm256_set1_epi16(0x7fff));

		m = _mm256_max_epi16(m, _mm256_and_si256(a, _mm256_cmpgt_epi16(lim, a)));
	}
	_mm256_storeu_si256((void *)lanes, m);
	r = amax_port(t, s, i, hi);
	for (i = 0; i < 16; i++)
		r = lanes[i] > r ? lanes[i] : r;
	return r;
}

AVX2 static void quant_avx2(const struct fp8_enc *e, enum kv_dtype t, const uint8_t *s, size_t lo,
			    size_t hi, float inv, uint8_t *q)
{
	const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
					      -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1,
					      -1, -1, -1, -1);
	__m256 vinv = _mm256_set1_ps(inv);
	size_t i = lo;

	for (; i + 8 <= hi; i += 8) {
		__m128i h = _mm_loadu_si128((const void *)(s + 2 * i));
		__m256 x = t == KV_DTYPE_F16
				   ? _mm256_cvtph_ps(h)
				   : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
		__m256i c = _mm256_shuffle_epi8(enc8(e, _mm256_castps_si256(_mm256_mul_ps(x, vinv))),
						pick);

		_mm_storel_epi64((void *)(q + i), _mm_unpacklo_epi32(_mm256_castsi256_si128(c),
								      _mm256_extracti128_si256(c, 1)));
	}
	quant_port(e, t, s, i, hi, inv, q);
}

/* kv_e4m3_to_f32 / kv_e5m2_to_f32 of 8 codes (int32 lanes): a normal code's
 * bits moved into place, a subnormal's m * 2^-9 (2^-16), exact; NaN the
 * quiet NaN, E5M2's infinities inf, each with the code's sign. */
AVX2 static inline __m256 dec8(int e5m2, __m256i c)
{
	__m256i q7 = _mm256_and_si256(c, I32(0x7f));
	__m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, I32(0x80)), 24);
	__m256 v, sub;

	if (!e5m2) {
		v = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(q7, 20), I32(120u << 23)));
		sub = _mm256_mul_ps(_mm256_cvtepi32_ps(q7), _mm256_set1_ps(0x1p-9f));
		v = _mm256_blendv_ps(v, sub, _mm256_castsi256_ps(_mm256_cmpgt_epi32(I32(8), q7)));
		v = _mm256_blendv_ps(v, _mm256_castsi256_ps(I32(0x7fc00000)),
				     _mm256_castsi256_ps(_mm256_cmpeq_epi32(q7, I32(0x7f))));
	} else {
		v = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(q7, 21), I32(112u << 23)));
		sub = _mm256_mul_ps(_mm256_cvtepi32_ps(q7), _mm256_set1_ps(0x1p-16f));
		v = _mm256_blendv_ps(v, sub, _mm256_castsi256_ps(_mm256_cmpgt_epi32(I32(4), q7)));
		v = _mm256_blendv_ps(v, _mm256_castsi256_ps(I32(0x7f800000)),
				     _mm256_castsi256_ps(_mm256_cmpeq_epi32(q7, I32(0x7c))));
		v = _mm256_blendv_ps(v, _mm256_castsi256_ps(I32(0x7fc00000)),
				     _mm256_castsi256_ps(_mm256_cmpgt_epi32(q7, I32(0x7c))));
	}
	return _mm256_or_ps(v, _mm256_castsi256_ps(sign));
}

AVX2 static void dequant_avx2(const float *dec, enum kv_dtype t, const uint8_t *q, size_t lo,
			      size_t hi, float scale, uint8_t *d)
{
	int e5m2 = dec == dec_e5m2;
	const __m256 vs = _mm256_set1_ps(scale), qnan = _mm256_castsi256_ps(I32(0x7fc00000));
	size_t i = lo;

	for (; i + 8 <= hi; i += 8) {
		__m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const void *)(q + i)));
		__m256 x = _mm256_mul_ps(dec8(e5m2, idx), vs);
		__m128i h;

		x = _mm256_blendv_ps(x, qnan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
		if (t == KV_DTYPE_F16) {
			h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
		} else {
			__m256i u = _mm256_castps_si256(x), one = I32(1);
			__m256i r = _mm256_srli_epi32(
				_mm256_add_epi32(_mm256_add_epi32(u, I32(0x7fff)),
						 _mm256_and_si256(_mm256_srli_epi32(u, 16), one)),
				16);

			r = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
			h = _mm256_castsi256_si128(r);
		}
		_mm_storeu_si128((void *)(d + 2 * i), h);
	}
	dequant_port(dec, t, q, i, hi, scale, d);
}
#endif

/* ---- per group ---------------------------------------------------------- */

void kv_qfast_quant(enum kv_qfmt f, enum kv_dtype t, const void *src, size_t n, size_t group,
		    void *dst)
{
	const struct fp8_enc *e = f == KV_QFMT_E5M2 ? &enc_e5m2 : &enc_e4m3;
	float max = f == KV_QFMT_E5M2 ? KV_E5M2_MAX : KV_E4M3_MAX;
	size_t ng = (n + group - 1) / group;
	const uint8_t *s = src;
	uint8_t *d = dst, *q = d + 4 * ng;

	if (cur == KV_QIMPL_REF) {
		(void)kv_qfmt_quant_ref(f, t, src, n, group, dst, kv_quant_bytes(n, group));
		return;
	}
	for (size_t g = 0; g < ng; g++) {
		size_t lo = g * group, hi = lo + group < n ? lo + group : n;
		float scale, inv;

#if KV_QF_X86
		if (cur == KV_QIMPL_AVX2) {
			kv_quant_scale_to(to_f32(t, amax_avx2(t, s, lo, hi)), max, &scale, &inv);
			quant_avx2(e, t, s, lo, hi, inv, q);
			memcpy(d + 4 * g, &scale, 4);
			continue;
		}
#endif
		kv_quant_scale_to(to_f32(t, amax_port(t, s, lo, hi)), max, &scale, &inv);
		quant_port(e, t, s, lo, hi, inv, q);
		memcpy(d + 4 * g, &scale, 4);
	}
}

void kv_qfast_dequant(enum kv_qfmt f, enum kv_dtype t, const void *src, size_t n, size_t group,
		      void *dst)
{
	const float *dec = f == KV_QFMT_E5M2 ? dec_e5m2 : dec_e4m3;
	size_t ng = (n + group - 1) / group;
	const uint8_t *s = src, *q = s + 4 * ng;
	uint8_t *d = dst;

	if (cur == KV_QIMPL_REF) {
		(void)kv_qfmt_dequant_ref(f, t, src, kv_quant_bytes(n, group), n, group, dst);
		return;
	}
	for (size_t g = 0; g < ng; g++) {
		size_t lo = g * group, hi = lo + group < n ? lo + group : n;
		float scale;

		memcpy(&scale, s + 4 * g, 4);
#if KV_QF_X86
		if (cur == KV_QIMPL_AVX2) {
			dequant_avx2(dec, t, q, lo, hi, scale, d);
			continue;
		}
#endif
		dequant_port(dec, t, q, lo, hi, scale, d);
	}
}
