/* Reference block quantization; see quant.h. The arithmetic is fp8.h's,
 * shared with the device kernels. Built with -ffp-contract=off (kernels/
 * meson.build): a fused multiply-add would round differently from the
 * device's __fmul_rn.
 *
 * kv_qfmt_quant_ref / kv_qfmt_dequant_ref are the definition (element by
 * element, fp8.h); kv_qfmt_quant / kv_qfmt_dequant check the arguments and
 * run quant_fast.c's faster paths, which give the same bytes. */
#include "quant.h"

#include <errno.h>
#include <string.h>
#include <strings.h>

#include "fp8.h"
#include "quant_fast.h"

enum kv_dtype kv_dtype_parse(const char *s)
{
	static const char *const f16[] = { "fp16", "float16", "half", "f16" };
	static const char *const bf16[] = { "bf16", "bfloat16" };
	size_t i;

	if (!s)
		return KV_DTYPE_NONE;
	for (i = 0; i < sizeof(f16) / sizeof(f16[0]); i++)
		if (!strcasecmp(s, f16[i]))
			return KV_DTYPE_F16;
	for (i = 0; i < sizeof(bf16) / sizeof(bf16[0]); i++)
		if (!strcasecmp(s, bf16[i]))
			return KV_DTYPE_BF16;
	return KV_DTYPE_NONE;
}

size_t kv_quant_bytes(size_t n, size_t group)
{
	if (!n)
		return 0;
	if (!group || group > n)
		group = n;
	return 4 * ((n + group - 1) / group) + n;
}

static inline float fmt_max(enum kv_qfmt f)
{
	return f == KV_QFMT_E5M2 ? KV_E5M2_MAX : KV_E4M3_MAX;
}

int kv_qfmt_quant_ref(enum kv_qfmt f, enum kv_dtype t, const void *src, size_t n, size_t group,
		      void *dst, size_t dst_len)
{
	const uint8_t *s = src;
	uint8_t *d = dst, *q;
	size_t ng, g, i, j;

	if ((f != KV_QFMT_E4M3 && f != KV_QFMT_E5M2) || (t != KV_DTYPE_F16 && t != KV_DTYPE_BF16) ||
	    !n || dst_len < kv_quant_bytes(n, group))
		return -EINVAL;
	if (!group || group > n)
		group = n;
	ng = (n + group - 1) / group;
	q = d + 4 * ng;
	for (g = 0; g < ng; g++) {
		size_t lo = g * group, hi = lo + group < n ? lo + group : n;
		uint16_t amax = 0;
		float scale, inv;

		for (i = lo; i < hi; i++) {
			uint16_t v = ld16(s, i);
			uint16_t a = t == KV_DTYPE_F16 ? kv_f16_abs_finite(v) : kv_bf16_abs_finite(v);

			if (a > amax)
				amax = a;
		}
		kv_quant_scale_to(to_f32(t, amax), fmt_max(f), &scale, &inv);
		memcpy(d + 4 * g, &scale, 4);
		if (f == KV_QFMT_E4M3)
			for (j = lo; j < hi; j++)
				q[j] = kv_quant_elem(to_f32(t, ld16(s, j)), inv);
		else
			for (j = lo; j < hi; j++)
				q[j] = kv_quant_elem_e5m2(to_f32(t, ld16(s, j)), inv);
	}
	return 0;
}

int kv_qfmt_dequant_ref(enum kv_qfmt f, enum kv_dtype t, const void *src, size_t src_len,
			size_t n, size_t group, void *dst)
{
	const uint8_t *s = src, *q;
	uint8_t *d = dst;
	size_t ng, g, i;

	if ((f != KV_QFMT_E4M3 && f != KV_QFMT_E5M2) || (t != KV_DTYPE_F16 && t != KV_DTYPE_BF16) ||
	    !n || src_len < kv_quant_bytes(n, group))
		return -EINVAL;
	if (!group || group > n)
		group = n;
	ng = (n + group - 1) / group;
	q = s + 4 * ng;
	for (g = 0; g < ng; g++) {
		size_t lo = g * group, hi = lo + group < n ? lo + group : n;
		float scale;

		memcpy(&scale, s + 4 * g, 4);
		for (i = lo; i < hi; i++) {
			float x = f == KV_QFMT_E4M3 ? kv_dequant_elem(q[i], scale)
						    : kv_dequant_elem_e5m2(q[i], scale);
			uint16_t v = t == KV_DTYPE_F16 ? kv_f32_to_f16(x) : kv_f32_to_bf16(x);

			memcpy(d + 2 * i, &v, 2);
		}
	}
	return 0;
}

static int bad_args(enum kv_qfmt f, enum kv_dtype t, size_t n)
{
	return (f != KV_QFMT_E4M3 && f != KV_QFMT_E5M2) || (t != KV_DTYPE_F16 && t != KV_DTYPE_BF16) ||
	       !n;
}

int kv_qfmt_quant(enum kv_qfmt f, enum kv_dtype t, const void *src, size_t n, size_t group,
		  void *dst, size_t dst_len)
{
	if (bad_args(f, t, n) || dst_len < kv_quant_bytes(n, group))
		return -EINVAL;
	kv_qfast_quant(f, t, src, n, !group || group > n ? n : group, dst);
	return 0;
}

int kv_qfmt_dequant(enum kv_qfmt f, enum kv_dtype t, const void *src, size_t src_len, size_t n,
		    size_t group, void *dst)
{
	if (bad_args(f, t, n) || src_len < kv_quant_bytes(n, group))
		return -EINVAL;
	kv_qfast_dequant(f, t, src, n, !group || group > n ? n : group, dst);
	return 0;
}

int kv_quant_block(enum kv_dtype t, const void *src, size_t n, size_t group, void *dst,
		   size_t dst_len)
{
	return kv_qfmt_quant(KV_QFMT_E4M3, t, src, n, group, dst, dst_len);
}

int kv_dequant_block(enum kv_dtype t, const void *src, size_t src_len, size_t n, size_t group,
		     void *dst)
{
	return kv_qfmt_dequant(KV_QFMT_E4M3, t, src, src_len, n, group, dst);
}

int kv_quant_scales_ok(const void *src, size_t src_len, size_t n, size_t group)
{
	const uint8_t *s = src;
	size_t ng, g;

	if (!n || src_len < kv_quant_bytes(n, group))
		return 0;
	if (!group || group > n)
		group = n;
	ng = (n + group - 1) / group;
	for (g = 0; g < ng; g++) {
		uint32_t b, e;

		memcpy(&b, s + 4 * g, 4);
		e = b >> 23 & 0xff;
		if (b >> 31 || e == 0 || e == 0xff)
			return 0;
	}
	return 1;
}
