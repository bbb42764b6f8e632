/* The fast host quantizer paths (kernels/quant_fast.c) against the reference
 * (kv_qfmt_quant_ref / kv_qfmt_dequant_ref), byte for byte, on each path this
 * CPU has (the portable one always, AVX2 + F16C where present):
 * - dequant: all 256 codes of E4M3 and E5M2 times scales that give normal,
 *   subnormal, zero, overflowing and NaN results (tiny, huge, zero,
 *   negative, inf, NaN and random scales), into FP16 and BF16;
 * - quant: all 65,536 FP16 and BF16 bit patterns (NaN, inf, subnormals) in
 *   groups of their neighbours and behind a forced largest magnitude of
 *   several sizes, so that each pattern is scaled many ways;
 * - random blocks of lengths around the vector width, groups that do not
 *   divide them, group 0 and group == n, at unaligned addresses. Buffers
 *   have their exact lengths, so ASan sees any access past them. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fp8.h"
#include "quant.h"
#include "quant_fast.h"

static uint64_t rs = 0x2545F4914F6CDD1Dull;

static uint64_t rnd(void)
{
	rs ^= rs << 13;
	rs ^= rs >> 7;
	rs ^= rs << 17;
	return rs;
}

static const char *const fname[] = { "raw", "e4m3", "e5m2" };
static const char *const tname[] = { "none", "fp16", "bf16" };

static void same(const char *what, enum kv_qfmt f, enum kv_dtype t, size_t n, size_t group,
		 const uint8_t *want, const uint8_t *got, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (want[i] != got[i]) {
			fprintf(stderr,
				"%s %s %s n %zu group %zu (%s): byte %zu is 0x%02x, the reference's "
				"0x%02x\n",
				what, fname[f], tname[t], n, group, kv_qfast_impl(), i, got[i], want[i]);
			exit(1);
		}
}

/* q (kv_quant_bytes(n, group) bytes) dequantized both ways. */
static void check_dequant(enum kv_qfmt f, enum kv_dtype t, const uint8_t *q, size_t n,
			  size_t group)
{
	size_t qb = kv_quant_bytes(n, group);
	uint8_t *want = malloc(2 * n), *got = malloc(2 * n + 1);

	CHECK(want && got);
	CHECK_EQ(kv_qfmt_dequant_ref(f, t, q, qb, n, group, want), 0);
	CHECK_EQ(kv_qfmt_dequant(f, t, q, qb, n, group, got + 1), 0);   /* unaligned */
	same("dequant", f, t, n, group, want, got + 1, 2 * n);
	free(want);
	free(got);
}

/* n elements at src (2 * n bytes) quantized both ways; then the result
 * dequantized both ways. */
static void check_quant(enum kv_qfmt f, enum kv_dtype t, const void *src, size_t n,
			size_t group)
{
	size_t qb = kv_quant_bytes(n, group);
	uint8_t *want = malloc(qb), *got = malloc(qb + 1);

	CHECK(want && got);
	CHECK_EQ(kv_qfmt_quant_ref(f, t, src, n, group, want, qb), 0);
	CHECK_EQ(kv_qfmt_quant(f, t, src, n, group, got + 1, qb), 0);
	same("quant", f, t, n, group, want, got + 1, qb);
	check_dequant(f, t, got + 1, n, group);
	free(want);
	free(got);
}

static float f32(uint32_t u)
{
	return kv_bits_f32(u);
}

/* Every code times each scale: one group of 256 codes per scale, then the
 * same bytes read as groups of 128 and 100 (a tail of 4 in some). */
static void dequant_all_codes(void)
{
	float scales[96];
	size_t ns = 0, n, i;
	uint8_t *q;

	scales[ns++] = 1.0f;
	scales[ns++] = -1.0f;
	scales[ns++] = 0.0f;
	scales[ns++] = -0.0f;
	scales[ns++] = 1.0f / 448;
	scales[ns++] = 1.0f / 57344;
	scales[ns++] = 0x1p-14f;    /* FP16 subnormal results */
	scales[ns++] = 0x1p-20f;
	scales[ns++] = 0x1p-30f;    /* FP16 zeros, BF16 normals */
	scales[ns++] = 0x1p-120f;   /* FP32 subnormal products */
	scales[ns++] = 0x1p-140f;
	scales[ns++] = f32(1);      /* the smallest FP32 subnormal */
	scales[ns++] = 65504.0f / 448;   /* the largest FP16 */
	scales[ns++] = 146.25f;     /* 448 * s just past it: rounds to inf */
	scales[ns++] = 300.0f;
	scales[ns++] = 0x1p100f;
	scales[ns++] = f32(0x7f7fffff);  /* FLT_MAX: inf products */
	scales[ns++] = INFINITY;          /* inf, and NaN for code 0 */
	scales[ns++] = -INFINITY;
	scales[ns++] = f32(0x7fc00000);
	scales[ns++] = f32(0xffc00001);   /* a negative NaN with a payload */
	scales[ns++] = f32(0x7f800001);   /* a signalling NaN */
	while (ns < 64)   /* random magnitudes from 2^-50 to 2^30 */
		scales[ns++] = ldexpf((float)(rnd() >> 40) * 0x1p-24f + 0.5f, (int)(rnd() % 80) - 50) *
			       (rnd() & 1 ? 1 : -1);
	while (ns < 96)   /* random bits */
		scales[ns++] = f32((uint32_t)rnd());
	n = 256 * ns;
	for (int f = KV_QFMT_E4M3; f <= KV_QFMT_E5M2; f++)
		for (int t = KV_DTYPE_F16; t <= KV_DTYPE_BF16; t++) {
			static const size_t groups[] = { 256, 128, 100 };

			for (size_t g = 0; g < sizeof(groups) / sizeof(groups[0]); g++) {
				size_t ng = (n + groups[g] - 1) / groups[g];

				q = malloc(kv_quant_bytes(n, groups[g]));
				CHECK(q);
				for (i = 0; i < ng; i++)
					memcpy(q + 4 * i, &scales[i % ns], 4);
				for (i = 0; i < n; i++)
					q[4 * ng + i] = (uint8_t)i;
				check_dequant((enum kv_qfmt)f, (enum kv_dtype)t, q, n, groups[g]);
				free(q);
			}
		}
}

/* Every bit pattern: in order (a group's amax is its neighbours'), and
 * behind a forced amax at the head of every group of 128, so that each
 * pattern is scaled by several inverse scales; also in groups of 7 and
 * as one group. */
static void quant_all_patterns(void)
{
	static const uint16_t amax16[] = { 0x0001, 0x0200, 0x0400, 0x1400, 0x2e66, 0x3c00,
					   0x3c01, 0x5bff, 0x6c00, 0x7bff };
	static const uint16_t amaxbf[] = { 0x0001, 0x0080, 0x0d00, 0x3000, 0x3f80, 0x3f81,
					   0x4700, 0x5f00, 0x7000, 0x7f7f };
	size_t na = sizeof(amax16) / sizeof(amax16[0]), i, n = 65536 / 127 * 128 + 128;
	uint16_t *all = malloc(65536 * 2), *b = malloc(n * 2);

	CHECK(all && b);
	for (i = 0; i < 65536; i++)
		all[i] = (uint16_t)i;
	for (int f = KV_QFMT_E4M3; f <= KV_QFMT_E5M2; f++)
		for (int t = KV_DTYPE_F16; t <= KV_DTYPE_BF16; t++) {
			check_quant((enum kv_qfmt)f, (enum kv_dtype)t, all, 65536, 128);
			check_quant((enum kv_qfmt)f, (enum kv_dtype)t, all, 65536, 7);
			check_quant((enum kv_qfmt)f, (enum kv_dtype)t, all, 65536, 0);
			for (size_t a = 0; a < na; a++) {
				size_t k = 0;

				for (i = 0; i < 65536; i++) {
					if (k % 128 == 0)
						b[k++] = (t == KV_DTYPE_F16 ? amax16 : amaxbf)[a] |
							 (uint16_t)(rnd() & 0x8000);
					b[k++] = all[i];
				}
				check_quant((enum kv_qfmt)f, (enum kv_dtype)t, b, k, 128);
			}
		}
	free(all);
	free(b);
}

/* A value of type t: mostly ordinary magnitudes, sometimes anything. */
static uint16_t rnd_val(enum kv_dtype t)
{
	uint64_t r = rnd();
	float x;

	if (r % 64 == 0)
		return (uint16_t)(r >> 16);
	x = ldexpf((float)(r >> 40) * 0x1p-24f, (int)((r >> 8) % 24) - 12) * (r & 2 ? 1 : -1);
	return t == KV_DTYPE_F16 ? kv_f32_to_f16(x) : kv_f32_to_bf16(x);
}

static void random_blocks(void)
{
	static const size_t lens[] = { 1, 2, 7, 8, 9, 15, 16, 17, 127, 128, 129, 1000, 4096, 32768 + 3 };
	static const size_t groups[] = { 0, 1, 3, 8, 16, 96, 128, 4096 };

	for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++) {
		size_t n = lens[l];
		uint8_t *raw = malloc(2 * n + 1), *src = raw + 1;   /* unaligned on purpose */

		CHECK(raw);
		for (int f = KV_QFMT_E4M3; f <= KV_QFMT_E5M2; f++)
			for (int t = KV_DTYPE_F16; t <= KV_DTYPE_BF16; t++) {
				for (size_t i = 0; i < n; i++) {
					uint16_t v = rnd_val((enum kv_dtype)t);

					memcpy(src + 2 * i, &v, 2);
				}
				for (size_t g = 0; g < sizeof(groups) / sizeof(groups[0]); g++)
					check_quant((enum kv_qfmt)f, (enum kv_dtype)t, src, n,
						    groups[g]);
				check_quant((enum kv_qfmt)f, (enum kv_dtype)t, src, n, n);
			}
		free(raw);
	}
}

int main(void)
{
	enum kv_qimpl best = kv_qfast_select(KV_QIMPL_AVX2);
	uint16_t src[4] = { 0 };
	uint8_t q[8];

	/* The switch itself; and the public entry points still refuse bad
	 * arguments whatever the path. */
	CHECK_EQ(kv_qfast_select(KV_QIMPL_REF), KV_QIMPL_REF);
	CHECK(!strcmp(kv_qfast_impl(), "reference"));
	CHECK_EQ(kv_qfast_select(KV_QIMPL_PORTABLE), KV_QIMPL_PORTABLE);
	CHECK(!strcmp(kv_qfast_impl(), "portable"));
	for (int impl = KV_QIMPL_PORTABLE; impl <= (int)best; impl++) {
		CHECK_EQ(kv_qfast_select((enum kv_qimpl)impl), impl);
		fprintf(stderr, "test_quant_fast: the %s path against the reference\n",
			kv_qfast_impl());
		CHECK_EQ(kv_qfmt_quant(KV_QFMT_E4M3, KV_DTYPE_F16, src, 4, 0, q, 7), -EINVAL);
		CHECK_EQ(kv_qfmt_quant(KV_QFMT_RAW, KV_DTYPE_F16, src, 4, 0, q, 8), -EINVAL);
		CHECK_EQ(kv_qfmt_dequant(KV_QFMT_E5M2, KV_DTYPE_NONE, q, 8, 4, 0, src), -EINVAL);
		CHECK_EQ(kv_qfmt_dequant(KV_QFMT_E5M2, KV_DTYPE_F16, q, 8, 0, 0, src), -EINVAL);
		dequant_all_codes();
		quant_all_patterns();
		random_blocks();
	}
	if (best < KV_QIMPL_AVX2)
		fprintf(stderr, "test_quant_fast: this CPU has no AVX2 + F16C: the portable path "
				"only\n");
	return 0;
}
