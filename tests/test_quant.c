/* FP8 E4M3 and E5M2 and FP16/BF16 conversions and block quantization (reference):
 * known answers (NaN, +-inf, saturation, subnormals, ties to even), every
 * encoder against a brute-force nearest-value oracle in double precision,
 * every decoder against its formula, and block round trips within the
 * format's error bound, special values included. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fp8.h"
#include "quant.h"

static uint64_t rs = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void)
{
	rs ^= rs << 13;
	rs ^= rs >> 7;
	rs ^= rs << 17;
	return rs;
}

static double urand(void)
{
	return (double)(rnd() >> 11) * 0x1p-53;
}

/* ---- oracles ------------------------------------------------------------ */

static double e4m3_val(unsigned c)   /* c in 0..0x7e */
{
	unsigned e = (c >> 3) & 15, m = c & 7;

	return e ? ldexp(1.0 + m / 8.0, (int)e - 7) : ldexp(m, -9);
}

static double e5m2_val(unsigned c)   /* c in 0..0x7b */
{
	unsigned e = (c >> 2) & 31, m = c & 3;

	return e ? ldexp(1.0 + m / 4.0, (int)e - 15) : ldexp(m, -16);
}

static double f16_val(unsigned c)    /* c in 0..0x7bff */
{
	unsigned e = (c >> 10) & 31, m = c & 0x3ff;

	return e ? ldexp(1.0 + m / 1024.0, (int)e - 15) : ldexp(m, -24);
}

static double bf16_val(unsigned c)   /* c in 0..0x7f7f */
{
	unsigned e = (c >> 7) & 255, m = c & 0x7f;

	return e ? ldexp(1.0 + m / 128.0, (int)e - 127) : ldexp(m, -133);
}

struct fmt {
	double (*val)(unsigned);
	unsigned max;         /* largest finite code */
	double beyond;        /* value past max for rounding to inf, 0 = saturate */
	unsigned inf;         /* code of inf when beyond != 0 */
};

static const struct fmt E4M3 = { e4m3_val, 0x7e, 0, 0 };
static const struct fmt E5M2 = { e5m2_val, 0x7b, 0, 0 };  /* SATFINITE: no inf made */
static const struct fmt F16 = { f16_val, 0x7bff, 65536.0, 0x7c00 };
static const struct fmt BF16 = { bf16_val, 0x7f7f, 0x1p128, 0x7f80 };

/* Nearest code to ax >= 0, ties to the even code. */
static unsigned nearest(const struct fmt *f, double ax)
{
	unsigned lo = 0, hi = f->max, c;
	double d0, d1, up;

	while (lo < hi) {  /* largest c with val(c) <= ax */
		unsigned mid = (lo + hi + 1) / 2;

		if (f->val(mid) <= ax)
			lo = mid;
		else
			hi = mid - 1;
	}
	c = lo;
	if (f->val(c) == ax)
		return c;
	if (c == f->max) {
		if (!f->beyond)
			return c;
		up = f->beyond;
	} else {
		up = f->val(c + 1);
	}
	d0 = ax - f->val(c);
	d1 = up - ax;
	if (d0 < d1 || (d0 == d1 && !(c & 1)))
		return c;
	return c == f->max ? f->inf : c + 1;
}

static unsigned oracle_e4m3(float x)
{
	if (isnan(x))
		return 0x7f;
	return (signbit(x) ? 0x80u : 0) | nearest(&E4M3, fabs((double)x));
}

static unsigned oracle_e5m2(float x)
{
	if (isnan(x))
		return 0x7f;
	return (signbit(x) ? 0x80u : 0) | nearest(&E5M2, fabs((double)x));
}

static unsigned oracle_f16(float x)
{
	if (isnan(x))
		return (signbit(x) ? 0x8000u : 0) | 0x7e00;
	return (signbit(x) ? 0x8000u : 0) | nearest(&F16, fabs((double)x));
}

static unsigned oracle_bf16(float x)
{
	return (signbit(x) ? 0x8000u : 0) | nearest(&BF16, fabs((double)x));
}

static void check_float(float x)
{
	if (kv_f32_to_e4m3(x) != oracle_e4m3(x)) {
		fprintf(stderr, "e4m3(%a) = %#x, oracle %#x\n", x, kv_f32_to_e4m3(x), oracle_e4m3(x));
		exit(1);
	}
	if (kv_f32_to_e5m2(x) != oracle_e5m2(x)) {
		fprintf(stderr, "e5m2(%a) = %#x, oracle %#x\n", x, kv_f32_to_e5m2(x), oracle_e5m2(x));
		exit(1);
	}
	if (kv_f32_to_f16(x) != oracle_f16(x)) {
		fprintf(stderr, "f16(%a) = %#x, oracle %#x\n", x, kv_f32_to_f16(x), oracle_f16(x));
		exit(1);
	}
	if (!isnan(x) && kv_f32_to_bf16(x) != oracle_bf16(x)) {
		fprintf(stderr, "bf16(%a) = %#x, oracle %#x\n", x, kv_f32_to_bf16(x), oracle_bf16(x));
		exit(1);
	}
}

/* Each representable value of f, the midpoints between neighbours and one
 * float either side of each. */
static void check_boundaries(const struct fmt *f)
{
	for (unsigned c = 0; c <= f->max; c++) {
		double v = f->val(c), next = c < f->max ? f->val(c + 1) : (f->beyond ? f->beyond : v * 2);
		float pts[] = { (float)v, (float)((v + next) / 2) };

		for (int i = 0; i < 2; i++) {
			float p = pts[i];

			for (int s = 0; s < 2; s++) {
				check_float(s ? -p : p);
				check_float(s ? -nextafterf(p, 0) : nextafterf(p, 0));
				check_float(s ? -nextafterf(p, INFINITY) : nextafterf(p, INFINITY));
			}
		}
	}
}

/* ---- known answers -------------------------------------------------------- */

static void known_answers(void)
{
	static const struct {
		float x;
		uint8_t q;
	} kat[] = {
		{ 0.0f, 0x00 }, { -0.0f, 0x80 }, { 1.0f, 0x38 }, { -1.0f, 0xb8 },
		{ 2.0f, 0x40 }, { 0.5f, 0x30 }, { 0.1f, 0x1d }, { -0.1f, 0x9d },
		{ 448.0f, 0x7e }, { -448.0f, 0xfe }, { 416.0f, 0x7d },
		{ 432.0f, 0x7e },          /* tie 416|448 -> even mantissa 6 */
		{ 440.0f, 0x7e }, { 460.0f, 0x7e },
		{ 464.0f, 0x7e },          /* tie 448|480: 448 (480 would be NaN) */
		{ 500.0f, 0x7e }, { -1e9f, 0xfe }, { 3.0e38f, 0x7e },
		{ 240.0f, 0x77 }, { 256.0f, 0x78 },
		{ 1.0625f, 0x38 },         /* tie 1|1.125 -> even (1) */
		{ 1.1875f, 0x3a },         /* tie 1.125|1.25 -> even (1.25) */
		{ 1.0625001f, 0x39 },      /* just above the tie */
		{ 0x1p-6f, 0x08 },         /* smallest normal */
		{ 0x1.cp-7f, 0x07 },       /* largest subnormal, 7 x 2^-9 */
		{ 0x1.ep-7f, 0x08 },       /* tie 7|8 x 2^-9 -> 8: the smallest normal */
		{ 0x1p-9f, 0x01 },         /* smallest subnormal */
		{ -0x1p-9f, 0x81 },
		{ 0x1.8p-9f, 0x02 },       /* tie 1|2 x 2^-9 -> 2 */
		{ 0x1.8p-8f, 0x03 },       /* 3 x 2^-9 exactly */
		{ 0x1p-10f, 0x00 },        /* tie 0|1 x 2^-9 -> 0 */
		{ -0x1p-10f, 0x80 },
		{ 0x1.000002p-10f, 0x01 }, /* just above half the smallest subnormal */
		{ 0x1p-11f, 0x00 }, { 1e-30f, 0x00 }, { -1e-45f, 0x80 },
	};
	size_t i;

	for (i = 0; i < sizeof(kat) / sizeof(kat[0]); i++) {
		if (kv_f32_to_e4m3(kat[i].x) != kat[i].q) {
			fprintf(stderr, "e4m3(%a) = %#x, want %#x\n", kat[i].x, kv_f32_to_e4m3(kat[i].x),
				kat[i].q);
			exit(1);
		}
	}
	/* No infinities in E4M3: saturate to the largest finite (SATFINITE). */
	CHECK_EQ(kv_f32_to_e4m3(INFINITY), 0x7e);
	CHECK_EQ(kv_f32_to_e4m3(-INFINITY), 0xfe);
	/* NaN of either sign, any payload: 0x7F. */
	CHECK_EQ(kv_f32_to_e4m3(NAN), 0x7f);
	CHECK_EQ(kv_f32_to_e4m3(-NAN), 0x7f);
	CHECK_EQ(kv_f32_to_e4m3(kv_bits_f32(0x7f800001u)), 0x7f);
	CHECK(isnan(kv_e4m3_to_f32(0x7f)) && isnan(kv_e4m3_to_f32(0xff)));
	/* The dequantizer's NaN is one value whatever the code's sign or the
	 * scale (the device's multiply would make another). */
	CHECK_EQ(kv_f32_bits(kv_dequant_elem(0xff, 2.0f)), 0x7fc00000u);
	CHECK_EQ(kv_f32_bits(kv_dequant_elem(0x7f, -3.0f)), 0x7fc00000u);
	CHECK_EQ(kv_f32_bits(kv_dequant_elem(0x10, kv_bits_f32(0xffc01234u))), 0x7fc00000u);
	CHECK(kv_e4m3_to_f32(0x7e) == 448.0f && kv_e4m3_to_f32(0xfe) == -448.0f);
	CHECK(kv_e4m3_to_f32(0x01) == 0x1p-9f && kv_e4m3_to_f32(0x08) == 0x1p-6f);
	CHECK(kv_e4m3_to_f32(0x80) == 0.0f && signbit(kv_e4m3_to_f32(0x80)));
	/* E5M2 landmarks: FP16's top byte where that is exact; saturation at
	 * 57344 (61440 is the tie 57344|65536, to the even 65536: saturated
	 * too); subnormals of 2^-16; no inf made, inf and NaN codes decoded. */
	CHECK_EQ(kv_f32_to_e5m2(1.0f), 0x3c);
	CHECK_EQ(kv_f32_to_e5m2(-1.0f), 0xbc);
	CHECK_EQ(kv_f32_to_e5m2(1.25f), 0x3d);
	CHECK_EQ(kv_f32_to_e5m2(1.125f), 0x3c);       /* tie 1|1.25 -> even (1) */
	CHECK_EQ(kv_f32_to_e5m2(1.375f), 0x3e);       /* tie 1.25|1.5 -> even (1.5) */
	CHECK_EQ(kv_f32_to_e5m2(57344.0f), 0x7b);
	CHECK_EQ(kv_f32_to_e5m2(61439.0f), 0x7b);
	CHECK_EQ(kv_f32_to_e5m2(61440.0f), 0x7b);
	CHECK_EQ(kv_f32_to_e5m2(1e9f), 0x7b);
	CHECK_EQ(kv_f32_to_e5m2(INFINITY), 0x7b);
	CHECK_EQ(kv_f32_to_e5m2(-INFINITY), 0xfb);
	CHECK_EQ(kv_f32_to_e5m2(NAN), 0x7f);
	CHECK_EQ(kv_f32_to_e5m2(-NAN), 0x7f);
	CHECK_EQ(kv_f32_to_e5m2(0x1p-14f), 0x04);     /* smallest normal */
	CHECK_EQ(kv_f32_to_e5m2(0x1.8p-15f), 0x03);   /* largest subnormal, 3 x 2^-16 */
	CHECK_EQ(kv_f32_to_e5m2(0x1.cp-15f), 0x04);   /* tie 3|4 x 2^-16 -> 4 */
	CHECK_EQ(kv_f32_to_e5m2(0x1p-16f), 0x01);     /* smallest subnormal */
	CHECK_EQ(kv_f32_to_e5m2(0x1p-17f), 0x00);     /* tie 0|1 -> 0 */
	CHECK_EQ(kv_f32_to_e5m2(-0x1p-17f), 0x80);
	CHECK_EQ(kv_f32_to_e5m2(0x1.000002p-17f), 0x01);
	CHECK_EQ(kv_f32_to_e5m2(0.0f), 0x00);
	CHECK_EQ(kv_f32_to_e5m2(-0.0f), 0x80);
	CHECK(isinf(kv_e5m2_to_f32(0x7c)) && isinf(kv_e5m2_to_f32(0xfc)));
	CHECK(isnan(kv_e5m2_to_f32(0x7d)) && isnan(kv_e5m2_to_f32(0xff)));
	CHECK_EQ(kv_f32_bits(kv_dequant_elem_e5m2(0xfe, 2.0f)), 0x7fc00000u);
	CHECK(kv_e5m2_to_f32(0x7b) == 57344.0f && kv_e5m2_to_f32(0x01) == 0x1p-16f);
	/* FP16 / BF16 landmarks. */
	CHECK_EQ(kv_f32_to_f16(65504.0f), 0x7bff);
	CHECK_EQ(kv_f32_to_f16(65519.99f), 0x7bff);
	CHECK_EQ(kv_f32_to_f16(65520.0f), 0x7c00);  /* tie -> even: inf */
	CHECK_EQ(kv_f32_to_f16(-INFINITY), 0xfc00);
	CHECK_EQ(kv_f32_to_f16(0x1p-24f), 0x0001);
	CHECK_EQ(kv_f32_to_f16(0x1p-25f), 0x0000);   /* tie -> even: zero */
	CHECK_EQ(kv_f32_to_f16(0x1.8p-24f), 0x0002); /* tie 1|2 -> 2 */
	CHECK_EQ(kv_f32_to_f16(NAN), 0x7e00);
	CHECK_EQ(kv_f32_to_bf16(1.0f), 0x3f80);
	CHECK_EQ(kv_f32_to_bf16(0x1.01p0f), 0x3f80);  /* tie -> even */
	CHECK_EQ(kv_f32_to_bf16(0x1.03p0f), 0x3f82);  /* tie -> even */
	CHECK_EQ(kv_f32_to_bf16(3.4e38f), 0x7f80);    /* rounds past the largest: inf */
	CHECK(kv_f32_to_bf16(NAN) == 0x7fc0);
}

/* ---- decoders ------------------------------------------------------------- */

static void decoders(void)
{
	unsigned c;

	for (c = 0; c < 256; c++) {
		float v = kv_e4m3_to_f32((uint8_t)c);

		if ((c & 0x7f) == 0x7f) {
			CHECK(isnan(v));
			continue;
		}
		CHECK((double)v == ((c & 0x80) ? -1 : 1) * e4m3_val(c & 0x7f));
		CHECK_EQ(kv_f32_to_e4m3(v), c);  /* every code round-trips */
	}
	for (c = 0; c < 256; c++) {
		float v = kv_e5m2_to_f32((uint8_t)c);

		if ((c & 0x7c) == 0x7c) {
			CHECK((c & 3) ? isnan(v) : isinf(v));
			continue;
		}
		CHECK((double)v == ((c & 0x80) ? -1 : 1) * e5m2_val(c & 0x7f));
		CHECK_EQ(kv_f32_to_e5m2(v), c);
		/* E5M2 is FP16's top byte: the same value. */
		CHECK(v == kv_f16_to_f32((uint16_t)(c << 8)));
	}
	for (c = 0; c < 65536; c++) {
		float h = kv_f16_to_f32((uint16_t)c), b = kv_bf16_to_f32((uint16_t)c);
		unsigned a = c & 0x7fff;
		double sg = (c & 0x8000) ? -1 : 1;

		if (a > 0x7c00)
			CHECK(isnan(h) && isnan(kv_bits_f32(kv_f32_bits(h))));
		else if (a == 0x7c00)
			CHECK(isinf(h) && (signbit(h) != 0) == ((c & 0x8000) != 0));
		else
			CHECK((double)h == sg * f16_val(a) && kv_f32_to_f16(h) == c);
		if (a > 0x7f80)
			CHECK(isnan(b));
		else if (a < 0x7f80)
			CHECK((double)b == sg * bf16_val(a) && kv_f32_to_bf16(b) == c);
	}
}

/* ---- encoders against the oracle ------------------------------------------ */

static void encoders(void)
{
	int i;

	check_boundaries(&E4M3);
	check_boundaries(&E5M2);
	check_boundaries(&F16);
	check_boundaries(&BF16);
	for (i = 0; i < 200000; i++) {
		uint32_t u = (uint32_t)rnd();
		float lin = (float)((urand() * 2 - 1) * (i & 2 ? 70000 : 600));
		float lg = (float)ldexp(1 + urand(), (int)(rnd() % 40) - 28);

		check_float(kv_bits_f32(u));
		check_float(lin);
		check_float(i & 1 ? -lg : lg);
	}
}

/* ---- blocks --------------------------------------------------------------- */

static uint16_t enc(enum kv_dtype t, float x)
{
	return t == KV_DTYPE_F16 ? kv_f32_to_f16(x) : kv_f32_to_bf16(x);
}

static float dec(enum kv_dtype t, uint16_t v)
{
	return t == KV_DTYPE_F16 ? kv_f16_to_f32(v) : kv_bf16_to_f32(v);
}

static void block_known(void)
{
	uint16_t src[4], out[4];
	uint8_t q[4 + 4];
	float scale;
	const float want_scale = 2.0f / 448.0f;

	/* amax 2: scale 2/448, inv 224: 1 -> 224 (0x76), -2 -> -448 (0xfe),
	 * 0.5 -> 112 (0x6e), 0 -> 0. */
	src[0] = kv_f32_to_f16(1.0f);
	src[1] = kv_f32_to_f16(-2.0f);
	src[2] = kv_f32_to_f16(0.5f);
	src[3] = kv_f32_to_f16(0.0f);
	CHECK_EQ(kv_quant_bytes(4, 0), 8);
	CHECK_EQ(kv_quant_block(KV_DTYPE_F16, src, 4, 0, q, sizeof(q)), 0);
	memcpy(&scale, q, 4);
	CHECK(kv_f32_bits(scale) == kv_f32_bits(want_scale));
	CHECK_EQ(q[4], 0x76);
	CHECK_EQ(q[5], 0xfe);
	CHECK_EQ(q[6], 0x6e);
	CHECK_EQ(q[7], 0x00);
	CHECK_EQ(kv_dequant_block(KV_DTYPE_F16, q, sizeof(q), 4, 0, out), 0);
	CHECK(dec(KV_DTYPE_F16, out[0]) == 1.0f && dec(KV_DTYPE_F16, out[1]) == -2.0f);
	CHECK(dec(KV_DTYPE_F16, out[2]) == 0.5f && out[3] == 0);

	/* Argument checks. */
	CHECK_EQ(kv_quant_block(KV_DTYPE_NONE, src, 4, 0, q, sizeof(q)), -EINVAL);
	CHECK_EQ(kv_quant_block(KV_DTYPE_F16, src, 0, 0, q, sizeof(q)), -EINVAL);
	CHECK_EQ(kv_quant_block(KV_DTYPE_F16, src, 4, 0, q, 7), -EINVAL);
	CHECK_EQ(kv_dequant_block(KV_DTYPE_BF16, q, 7, 4, 0, out), -EINVAL);
	CHECK_EQ(kv_quant_bytes(0, 0), 0);
	CHECK_EQ(kv_quant_bytes(10, 4), 3 * 4 + 10);
	CHECK_EQ(kv_quant_bytes(10, 100), 4 + 10);
	CHECK_EQ(kv_dtype_parse("fp16"), KV_DTYPE_F16);
	CHECK_EQ(kv_dtype_parse("Float16"), KV_DTYPE_F16);
	CHECK_EQ(kv_dtype_parse("bf16"), KV_DTYPE_BF16);
	CHECK_EQ(kv_dtype_parse("bfloat16"), KV_DTYPE_BF16);
	CHECK_EQ(kv_dtype_parse("fp8"), KV_DTYPE_NONE);
	CHECK_EQ(kv_dtype_parse(NULL), KV_DTYPE_NONE);
}

static void block_specials(enum kv_dtype t)
{
	uint16_t src[8], out[8];
	uint8_t q[4 + 8];
	float scale;

	src[0] = enc(t, 3.0f);
	src[1] = enc(t, INFINITY);
	src[2] = enc(t, -INFINITY);
	src[3] = enc(t, NAN);
	src[4] = enc(t, -0.0f);
	src[5] = enc(t, -1.5f);
	src[6] = enc(t, 0.0f);
	src[7] = enc(t, 1e-3f);
	CHECK_EQ(kv_quant_block(t, src, 8, 0, q, sizeof(q)), 0);
	memcpy(&scale, q, 4);
	/* inf and NaN do not set the scale: amax is 3. */
	CHECK(scale == 3.0f / 448.0f);
	CHECK_EQ(q[4 + 0], 0x7e);
	CHECK_EQ(q[4 + 1], 0x7e);   /* +inf saturates */
	CHECK_EQ(q[4 + 2], 0xfe);   /* -inf saturates */
	CHECK_EQ(q[4 + 3], 0x7f);   /* NaN */
	CHECK_EQ(q[4 + 4], 0x80);   /* -0 keeps its sign */
	CHECK_EQ(kv_dequant_block(t, q, sizeof(q), 8, 0, out), 0);
	CHECK(fabsf(dec(t, out[1]) - 3.0f) <= 3.0f / 64);   /* +inf -> +amax */
	CHECK(fabsf(dec(t, out[2]) + 3.0f) <= 3.0f / 64);
	CHECK(isnan(dec(t, out[3])));
	CHECK(dec(t, out[4]) == 0.0f && signbit(dec(t, out[4])));
	CHECK(out[6] == 0);

	/* All zeros, and a group of only non-finite values: scale 1. */
	memset(src, 0, sizeof(src));
	src[5] = enc(t, NAN);
	CHECK_EQ(kv_quant_block(t, src, 8, 0, q, sizeof(q)), 0);
	memcpy(&scale, q, 4);
	CHECK(scale == 1.0f);
	CHECK_EQ(kv_dequant_block(t, q, sizeof(q), 8, 0, out), 0);
	CHECK(out[0] == 0 && isnan(dec(t, out[5])));
}

/* |x - y| within half an E4M3 ulp of x / scale (2^-4 relative for normals,
 * 2^-10 absolute below 2^-6) plus the element type's own rounding. */
static void block_roundtrip_fmt(enum kv_qfmt f, enum kv_dtype t, size_t n, size_t group)
{
	uint16_t *src = malloc(n * 2), *out = malloc(n * 2);
	size_t qb = kv_quant_bytes(n, group), g = group ? group : n, i;
	uint8_t *q = malloc(qb);
	double ulp_t = t == KV_DTYPE_F16 ? 0x1p-11 : 0x1p-8;
	/* Half an ulp: relative for normals, absolute (times the scale) for
	 * subnormals. */
	double rel = f == KV_QFMT_E4M3 ? 0x1p-4 : 0x1p-3, sub = f == KV_QFMT_E4M3 ? 0x1p-10 : 0x1p-17;

	CHECK(src && out && q);
	for (i = 0; i < n; i++) {
		double v = (urand() * 2 - 1) * ldexp(1, (int)(rnd() % 12) - 6);

		src[i] = enc(t, (float)v);
	}
	CHECK_EQ(kv_qfmt_quant(f, t, src, n, group, q, qb), 0);
	CHECK_EQ(kv_qfmt_dequant(f, t, q, qb, n, group, out), 0);
	for (i = 0; i < n; i++) {
		float scale, x = dec(t, src[i]), y = dec(t, out[i]);
		double err = fabs((double)x - y), bound;

		memcpy(&scale, q + 4 * (i / g), 4);
		bound = fabs(x) * (rel + 1e-6) + scale * sub + fabs(y) * ulp_t;
		if (err > bound) {
			fprintf(stderr, "dtype %d n %zu group %zu: x %g y %g err %g bound %g\n", t, n,
				group, x, y, err, bound);
			exit(1);
		}
	}
	free(src);
	free(out);
	free(q);
}

static void block_roundtrip(enum kv_dtype t, size_t n, size_t group)
{
	block_roundtrip_fmt(KV_QFMT_E4M3, t, n, group);
	block_roundtrip_fmt(KV_QFMT_E5M2, t, n, group);
}

/* E5M2 blocks: the scale is amax / 57344; inf saturates to amax, NaN stays
 * NaN; the E4M3 entry points are format E4M3; unknown formats refused. */
static void block_e5m2(void)
{
	uint16_t src[4], out[4];
	uint8_t q[4 + 4], q2[4 + 4];
	float scale;

	src[0] = kv_f32_to_f16(1.0f);
	src[1] = kv_f32_to_f16(-2.0f);
	src[2] = kv_f32_to_f16(INFINITY);
	src[3] = kv_f32_to_f16(NAN);
	CHECK_EQ(kv_qfmt_quant(KV_QFMT_E5M2, KV_DTYPE_F16, src, 4, 0, q, sizeof(q)), 0);
	memcpy(&scale, q, 4);
	CHECK(scale == 2.0f / 57344.0f);
	CHECK_EQ(q[4], 0x77);   /* 28672 = 1.75 * 2^14 */
	CHECK_EQ(q[5], 0xfb);   /* -57344 */
	CHECK_EQ(q[6], 0x7b);   /* +inf saturates */
	CHECK_EQ(q[7], 0x7f);
	CHECK_EQ(kv_qfmt_dequant(KV_QFMT_E5M2, KV_DTYPE_F16, q, sizeof(q), 4, 0, out), 0);
	CHECK(kv_f16_to_f32(out[0]) == 1.0f && kv_f16_to_f32(out[1]) == -2.0f);
	CHECK(kv_f16_to_f32(out[2]) == 2.0f && isnan(kv_f16_to_f32(out[3])));
	CHECK_EQ(kv_qfmt_quant(KV_QFMT_E4M3, KV_DTYPE_F16, src, 4, 0, q, sizeof(q)), 0);
	CHECK_EQ(kv_quant_block(KV_DTYPE_F16, src, 4, 0, q2, sizeof(q2)), 0);
	CHECK(memcmp(q, q2, sizeof(q)) == 0);
	CHECK_EQ(kv_qfmt_quant(KV_QFMT_RAW, KV_DTYPE_F16, src, 4, 0, q, sizeof(q)), -EINVAL);
	CHECK_EQ(kv_qfmt_quant((enum kv_qfmt)3, KV_DTYPE_F16, src, 4, 0, q, sizeof(q)), -EINVAL);
	CHECK_EQ(kv_qfmt_dequant(KV_QFMT_RAW, KV_DTYPE_F16, q, sizeof(q), 4, 0, out), -EINVAL);
	CHECK_EQ(kv_qfmt_quant(KV_QFMT_E5M2, KV_DTYPE_NONE, src, 4, 0, q, sizeof(q)), -EINVAL);
}

/* Scales the quantizer writes pass kv_quant_scales_ok(); NaN, infinity,
 * zero, subnormal and negative ones, which it never writes, do not (issue 36:
 * such a tier copy is a miss). Extremes of both types and formats included. */
static void scales_checked(void)
{
	static const float in[] = { 0.0f, 1e-38f, 1e-30f, 1.0f, 65504.0f, 3e38f };
	static const uint32_t bad[] = { 0x7fc00000u, 0xffc00000u, 0x7f800000u, 0xff800000u,
					0, 0x80000000u, 1, 0x007fffffu, 0xbf800000u };
	uint16_t src[256];
	uint8_t q[8 + 256];

	for (int t = KV_DTYPE_F16; t <= KV_DTYPE_BF16; t++)
		for (int f = KV_QFMT_E4M3; f <= KV_QFMT_E5M2; f++)
			for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); i++) {
				for (int k = 0; k < 256; k++)
					src[k] = enc((enum kv_dtype)t, k % 3 ? in[i] : -in[i]);
				CHECK_EQ(kv_qfmt_quant((enum kv_qfmt)f, (enum kv_dtype)t, src, 256, 128,
						       q, sizeof(q)), 0);
				CHECK(kv_quant_scales_ok(q, sizeof(q), 256, 128));
			}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memcpy(q + 4, &bad[i], 4);   /* the second group's scale */
		CHECK(!kv_quant_scales_ok(q, sizeof(q), 256, 128));
	}
	CHECK(!kv_quant_scales_ok(q, 8 + 255, 256, 128));   /* too short */
}

int main(void)
{
	scales_checked();
	block_e5m2();
	known_answers();
	decoders();
	encoders();
	block_known();
	for (int t = KV_DTYPE_F16; t <= KV_DTYPE_BF16; t++) {
		block_specials((enum kv_dtype)t);
		block_roundtrip((enum kv_dtype)t, 32768, 0);
		block_roundtrip((enum kv_dtype)t, 32768, 128);
		block_roundtrip((enum kv_dtype)t, 1000, 96);   /* partial last group */
		block_roundtrip((enum kv_dtype)t, 1, 0);
	}
	return 0;
}
