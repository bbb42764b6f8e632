/* The fast host paths of kv_qfmt_quant / kv_qfmt_dequant (quant.h): the
 * same bytes as the reference (kv_qfmt_quant_ref / kv_qfmt_dequant_ref, and
 * so the device kernels'), faster. Internal to kernels/: quant.c calls these
 * after checking the arguments; tests and kvquant pick an implementation. */
#ifndef KV_QUANT_FAST_H
#define KV_QUANT_FAST_H

#include <stddef.h>
#include <string.h>

#include "fp8.h"
#include "quant.h"

/* Element i of 2-byte elements at p, whatever p's alignment. */
static inline uint16_t ld16(const uint8_t *p, size_t i)
{
	uint16_t v;

	memcpy(&v, p + 2 * i, 2);
	return v;
}

static inline float to_f32(enum kv_dtype t, uint16_t v)
{
	return t == KV_DTYPE_F16 ? kv_f16_to_f32(v) : kv_bf16_to_f32(v);
}

enum kv_qimpl {
	KV_QIMPL_REF = 0,       /* the reference, element by element (fp8.h) */
	KV_QIMPL_PORTABLE = 1,  /* table decode: plain C, any CPU */
	KV_QIMPL_AVX2 = 2,      /* AVX2 + F16C, where the CPU has them (x86-64) */
};

/* Arguments already checked by quant.c: f and t known, n >= 1,
 * 1 <= group <= n, the buffers long enough. */
void kv_qfast_quant(enum kv_qfmt f, enum kv_dtype t, const void *src, size_t n, size_t group,
		    void *dst);
void kv_qfast_dequant(enum kv_qfmt f, enum kv_dtype t, const void *src, size_t n, size_t group,
		      void *dst);

/* Makes kv_qfmt_quant / kv_qfmt_dequant use impl, or the best this CPU has
 * below it; returns the one now used. The default is the best. For tests and
 * benchmarks, not thread-safe: call it before any other thread quantizes. */
enum kv_qimpl kv_qfast_select(enum kv_qimpl impl);

/* The name of the implementation in use: "reference", "portable", "avx2". */
const char *kv_qfast_impl(void);

#endif
