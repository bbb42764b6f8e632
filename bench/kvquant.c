/* kvquant: what compress-on-demote costs in accuracy and CPU time, measured
 * on the C references (docs/kernels.md has a run's figures).
 *
 * For FP16 and BF16 blocks of 32768 elements (64 KiB), quantized to FP8 E4M3
 * and E5M2 with one scale per block, per 128 elements (one head row of a typical
 * layout) and per 32, then dequantized:
 *   uniform  values uniform in [-1, 1]
 *   normal   N(0, 1)
 *   kv-like  16 tokens x 16 heads x 128 channels, channel scales log-normal
 *            (sigma 0.5), 2 channels of 128 with 20x outliers in every head,
 *            as in key caches
 * it prints the largest absolute error, the largest relative error over
 * elements the format holds as normal numbers (|x| >= 2^-6 * scale for E4M3,
 * 2^-14 * scale for E5M2), the mean
 * relative error there, the error energy relative to the signal's (RMS),
 * and the share of nonzero inputs that came back as zero. Then the
 * throughput of kv_qfmt_quant and kv_qfmt_dequant on each path this CPU has
 * (the reference, the portable fast path, AVX2 + F16C: quant_fast.h) and of
 * kv_crc32c.
 *
 * Deterministic (fixed seed). Figures only: exits 0. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "crc32c.h"
#include "fp8.h"
#include "quant.h"
#include "quant_fast.h"

#define N 32768
#define BLOCKS 64

static uint64_t rs = 0x853c49e6748fea9bull;

static double urand(void)
{
	rs ^= rs << 13;
	rs ^= rs >> 7;
	rs ^= rs << 17;
	return ((double)(rs >> 11) + 0.5) * 0x1p-53;
}

static double nrand(void)
{
	return sqrt(-2 * log(urand())) * cos(2 * M_PI * urand());
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

enum dataset { UNIFORM, NORMAL, KVLIKE, NSETS };
static const char *const set_name[] = { "uniform", "normal", "kv-like" };

static void make(enum dataset s, enum kv_dtype t, uint16_t *out)
{
	static double chs[16 * 128];
	int i;

	if (s == KVLIKE)
		for (i = 0; i < 16 * 128; i++)
			chs[i] = exp(0.5 * nrand()) * ((i % 128 == 17 || i % 128 == 90) ? 20 : 1);
	for (i = 0; i < N; i++) {
		double x = s == UNIFORM ? 2 * urand() - 1 : s == NORMAL ? nrand()
					 : nrand() * chs[i % (16 * 128)];

		out[i] = t == KV_DTYPE_F16 ? kv_f32_to_f16((float)x) : kv_f32_to_bf16((float)x);
	}
}

static double val(enum kv_dtype t, uint16_t v)
{
	return t == KV_DTYPE_F16 ? kv_f16_to_f32(v) : kv_bf16_to_f32(v);
}

static void accuracy(void)
{
	static uint16_t src[N], dst[N];
	static uint8_t q[N + 4 * N];
	static const size_t groups[] = { 0, 128, 32 };

	printf("%-5s %-8s %-5s %-9s %11s %11s %11s %11s %9s %7s\n", "fp8", "data", "type",
	       "scale per", "max abs", "max rel", "mean rel", "rms rel", "to zero", "bytes");
	for (int f = KV_QFMT_E4M3; f <= KV_QFMT_E5M2; f++)   /* the format, then as before */
	for (int s = 0; s < NSETS; s++)
		for (int t = KV_DTYPE_F16; t <= KV_DTYPE_BF16; t++)
			for (size_t g = 0; g < sizeof(groups) / sizeof(groups[0]); g++) {
				double maxabs = 0, maxrel = 0, sumrel = 0, e2 = 0, x2 = 0;
				uint64_t nrel = 0, nz = 0, zeroed = 0;
				size_t gs = groups[g] ? groups[g] : N, qb = kv_quant_bytes(N, groups[g]);
				char gname[16];

				for (int b = 0; b < BLOCKS; b++) {
					make((enum dataset)s, (enum kv_dtype)t, src);
					kv_qfmt_quant((enum kv_qfmt)f, (enum kv_dtype)t, src, N, groups[g],
						      q, sizeof(q));
					kv_qfmt_dequant((enum kv_qfmt)f, (enum kv_dtype)t, q, qb, N,
							groups[g], dst);
					for (int i = 0; i < N; i++) {
						double x = val((enum kv_dtype)t, src[i]);
						double y = val((enum kv_dtype)t, dst[i]), e = fabs(x - y);
						float scale;

						memcpy(&scale, q + 4 * (i / gs), 4);
						maxabs = e > maxabs ? e : maxabs;
						e2 += e * e;
						x2 += x * x;
						if (x != 0) {
							nz++;
							zeroed += y == 0;
						}
						/* In the format's normal range. */
						if (fabs(x) >= (f == KV_QFMT_E4M3 ? 0x1p-6 : 0x1p-14) *
								       scale) {
							double r = e / fabs(x);

							maxrel = r > maxrel ? r : maxrel;
							sumrel += r;
							nrel++;
						}
					}
				}
				snprintf(gname, sizeof(gname), "%s",
					 groups[g] ? (groups[g] == 128 ? "128" : "32") : "block");
				printf("%-5s %-8s %-5s %-9s %11.3e %11.3e %11.3e %11.3e %8.3f%% %6.3fx\n",
				       f == KV_QFMT_E4M3 ? "e4m3" : "e5m2", set_name[s],
				       t == KV_DTYPE_F16 ? "fp16" : "bf16", gname, maxabs, maxrel,
				       sumrel / (double)nrel, sqrt(e2 / x2),
				       100.0 * (double)zeroed / (double)nz, (double)qb / (2.0 * N));
			}
}

/* GB/s of the uncompressed side of one call on n elements, repeated for
 * half a second. */
static double rate(int dequant, enum kv_qfmt f, enum kv_dtype ty, const uint16_t *src,
		   uint8_t *q, size_t qcap, uint16_t *dst)
{
	size_t qb = kv_quant_bytes(N, 128);
	double t0, t;
	uint64_t n;

	for (n = 0, t0 = now(); (t = now() - t0) < 0.5; n++)
		if (dequant)
			kv_qfmt_dequant(f, ty, q, qb, N, 128, dst);
		else
			kv_qfmt_quant(f, ty, src, N, 128, q, qcap);
	return n * 2.0 * N / t / 1e9;
}

static void speed(void)
{
	static uint16_t src[2][N], dst[N];
	static uint8_t q[N + 4 * N], buf[1 << 20];
	double t0, t;
	uint64_t n;
	volatile uint32_t sink = 0;
	enum kv_qimpl best = kv_qfast_select(KV_QIMPL_AVX2);

	make(KVLIKE, KV_DTYPE_F16, src[0]);
	make(KVLIKE, KV_DTYPE_BF16, src[1]);
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)(i * 131);
	printf("\nthroughput on this CPU, one thread (GB/s of the uncompressed side), kv-like "
	       "blocks of 64 KiB, scale per 128;\nkv_qfmt_quant / kv_qfmt_dequant on each path "
	       "(the same bytes; reference = kv_qfmt_*_ref):\n");
	printf("  %-10s %-5s %-5s %8s %8s\n", "path", "fp8", "type", "quant", "dequant");
	for (int impl = KV_QIMPL_REF; impl <= (int)best; impl++) {
		kv_qfast_select((enum kv_qimpl)impl);
		for (int f = KV_QFMT_E4M3; f <= KV_QFMT_E5M2; f++)
			for (int ty = KV_DTYPE_F16; ty <= KV_DTYPE_BF16; ty++) {
				double rq = rate(0, (enum kv_qfmt)f, (enum kv_dtype)ty, src[ty - 1], q,
						 sizeof(q), dst);
				double rd = rate(1, (enum kv_qfmt)f, (enum kv_dtype)ty, src[ty - 1], q,
						 sizeof(q), dst);

				printf("  %-10s %-5s %-5s %8.2f %8.2f\n", kv_qfast_impl(),
				       f == KV_QFMT_E4M3 ? "e4m3" : "e5m2",
				       ty == KV_DTYPE_F16 ? "fp16" : "bf16", rq, rd);
			}
	}
	kv_qfast_select(best);
	for (n = 0, t0 = now(); (t = now() - t0) < 0.5; n++)
		sink ^= kv_crc32c(0, buf, sizeof(buf));
	printf("  kv_crc32c (%s), 1 MiB buffers            %7.2f\n", kv_crc32c_impl(),
	       n * (double)sizeof(buf) / t / 1e9);
	for (n = 0, t0 = now(); (t = now() - t0) < 0.5; n++)
		sink ^= kv_crc32c_sw(0, buf, sizeof(buf));
	printf("  kv_crc32c_sw (slicing-by-8), 1 MiB buffers     %7.2f\n",
	       n * (double)sizeof(buf) / t / 1e9);
	(void)sink;
}

int main(void)
{
	accuracy();
	speed();
	return 0;
}
