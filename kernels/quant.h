/* Block quantization for compress-on-demote: FP16 or BF16 KV blocks to FP8
 * E4M3 (or E5M2: kv_qfmt_quant) with one float32 scale per group of
 * elements, and back. Lossy: a pool
 * opts in (off by default); docs/kernels.md has the formats and the measured
 * error.
 *
 * Quantized layout of n elements in groups of g (g = 0: one group of n):
 *
 *   [ngroups x float32 scale, host order][n x E4M3 byte]
 *   ngroups = ceil(n / g), scale_i = amax_i / 448
 *
 * amax_i is the largest finite magnitude of group i (inf and NaN are left
 * out); each element is stored as e4m3(x * (448 / amax_i)) with round to
 * nearest even and saturation to +-448 (so +-inf becomes +-amax_i on the way
 * back, NaN stays NaN); dequantization is e4m3 * scale_i rounded to the
 * element type. fp8.h defines every step bit for bit; the device kernels
 * (kernels.cu) produce the same bytes.
 *
 * kv_qfmt_quant_ref / kv_qfmt_dequant_ref are the reference versions,
 * element by element: the definition the device kernels and the fast host
 * paths (quant_fast.c: portable C with a table decode, and AVX2 + F16C where
 * the CPU has them) are tested against. The other functions give exactly their
 * bytes, on the fast paths; the host backend runs those. */
#ifndef KV_QUANT_H
#define KV_QUANT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum kv_dtype {
	KV_DTYPE_NONE = 0,
	KV_DTYPE_F16 = 1,   /* IEEE binary16 */
	KV_DTYPE_BF16 = 2,  /* bfloat16 */
};

/* The format of a block's copy below G1 (the tiers' slot header carries it
 * in its flags field; docs/tiers.md): raw bytes, or this quantized layout of
 * the block's 2-byte elements with one scale per KV_QUANT_GROUP of them, the
 * bytes E4M3 or E5M2 (fp8.h; E5M2's scale_i = amax_i / 57344). */
enum kv_qfmt {
	KV_QFMT_RAW = 0,
	KV_QFMT_E4M3 = 1,
	KV_QFMT_E5M2 = 2,
};

/* Elements per scale of a compressed tier copy: a head row of 128 channels
 * in the common layouts (docs/kernels.md, "Accuracy": half the RMS error of
 * one scale per block, for 3% more bytes). */
#define KV_QUANT_GROUP 128u

/* The element type a pool's dtype string names ("fp16", "float16", "half",
 * "f16"; "bf16", "bfloat16"), or KV_DTYPE_NONE for anything else (which
 * then cannot be compressed). */
enum kv_dtype kv_dtype_parse(const char *s);

/* Bytes of the quantized form of n elements with one scale per group
 * elements (0: one scale for all n): 4 * ceil(n / group) + n. 0 for n 0. */
size_t kv_quant_bytes(size_t n, size_t group);

/* Quantizes n elements of type t at src (2-byte elements, host order) into
 * dst, which holds dst_len >= kv_quant_bytes(n, group) bytes. No alignment
 * is required of either buffer. Returns 0, or -EINVAL for an unknown type, n
 * 0 or dst_len too small (dst untouched). */
int kv_quant_block(enum kv_dtype t, const void *src, size_t n, size_t group, void *dst,
		   size_t dst_len);

/* The inverse: reads kv_quant_bytes(n, group) <= src_len bytes at src and
 * writes n elements of type t to dst. Returns 0 or -EINVAL. */
int kv_dequant_block(enum kv_dtype t, const void *src, size_t src_len, size_t n, size_t group,
		     void *dst);

/* The same in format f (KV_QFMT_E4M3: the two above; KV_QFMT_E5M2: E5M2
 * bytes, scale_i = amax_i / 57344). -EINVAL for another format too. */
int kv_qfmt_quant(enum kv_qfmt f, enum kv_dtype t, const void *src, size_t n, size_t group,
		  void *dst, size_t dst_len);
int kv_qfmt_dequant(enum kv_qfmt f, enum kv_dtype t, const void *src, size_t src_len, size_t n,
		    size_t group, void *dst);

/* Whether every scale of the quantized form of n elements in groups of
 * group at src (src_len >= kv_quant_bytes(n, group) bytes) is one the
 * quantizer writes: a positive normal float (1.0, or amax / max with amax
 * at least KV_QUANT_TINY, fp8.h). NaN, infinity, zero, a subnormal or a
 * negative scale is not: a copy that carries one did not come from
 * kv_qfmt_quant() and is not to be dequantized (a G3 or G4 copy with a
 * recomputed checksum). Returns 1, or 0 (also for bad arguments). O(n /
 * group). */
int kv_quant_scales_ok(const void *src, size_t src_len, size_t n, size_t group);

/* The reference versions of the two above: the same arguments, results and
 * bytes, element by element (slower). */
int kv_qfmt_quant_ref(enum kv_qfmt f, enum kv_dtype t, const void *src, size_t n, size_t group,
		      void *dst, size_t dst_len);
int kv_qfmt_dequant_ref(enum kv_qfmt f, enum kv_dtype t, const void *src, size_t src_len,
			size_t n, size_t group, void *dst);

#ifdef __cplusplus
}
#endif
#endif
