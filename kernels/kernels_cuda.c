/* Loading and launching the device kernels; see kernels_cuda.h. */
#include "kernels_cuda.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "kverr.h"

/* kernels.fatbin, embedded by embed.py. */
extern const unsigned char kv_kernels_fatbin[];
extern const size_t kv_kernels_fatbin_len;

#define THREADS 256      /* kernels.cu's THREADS */
#define COPY_CHUNK 65536 /* kernels.cu's COPY_CHUNK */

struct kv_cuda_kernels {
	CUmodule mod;
	CUfunction quant[3][3], dequant[3][3];  /* by enum kv_qfmt, enum kv_dtype */
	CUfunction copy, crc;
};


int kv_cuda_kernels_load(struct kv_cuda_kernels **out, char *err, unsigned errlen)
{
	enum { NFN = 10 };
	static const char *const names[NFN] = {
		"kv_quant_f16",      "kv_quant_bf16",      "kv_dequant_f16",      "kv_dequant_bf16",
		"kv_quant_e5m2_f16", "kv_quant_e5m2_bf16", "kv_dequant_e5m2_f16", "kv_dequant_e5m2_bf16",
		"kv_copy_batch",     "kv_crc32c_batch"
	};
	struct kv_cuda_kernels *k = calloc(1, sizeof(*k));
	CUfunction *fn[NFN];
	CUresult r;
	size_t i;

	if (!k) {
		kv_errf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	(void)kv_kernels_fatbin_len;
	fn[0] = &k->quant[KV_QFMT_E4M3][KV_DTYPE_F16];
	fn[1] = &k->quant[KV_QFMT_E4M3][KV_DTYPE_BF16];
	fn[2] = &k->dequant[KV_QFMT_E4M3][KV_DTYPE_F16];
	fn[3] = &k->dequant[KV_QFMT_E4M3][KV_DTYPE_BF16];
	fn[4] = &k->quant[KV_QFMT_E5M2][KV_DTYPE_F16];
	fn[5] = &k->quant[KV_QFMT_E5M2][KV_DTYPE_BF16];
	fn[6] = &k->dequant[KV_QFMT_E5M2][KV_DTYPE_F16];
	fn[7] = &k->dequant[KV_QFMT_E5M2][KV_DTYPE_BF16];
	fn[8] = &k->copy;
	fn[9] = &k->crc;
	r = kv_cu.cuModuleLoadData(&k->mod, kv_kernels_fatbin);
	if (r != CUDA_SUCCESS) {
		kv_errf(err, errlen, "loading the kernels: %s%s", kv_cu_name(r),
			r == CUDA_ERROR_NO_BINARY_FOR_GPU || r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION
				? " (no code for this GPU; rebuild with its architecture in "
				  "-Dgpu_archs, or a newer driver)"
				: "");
		free(k);
		return r == CUDA_ERROR_NO_BINARY_FOR_GPU ||
		       r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION ? -ENOEXEC : kv_cu_errno(r);
	}
	for (i = 0; i < NFN; i++) {
		r = kv_cu.cuModuleGetFunction(fn[i], k->mod, names[i]);
		if (r != CUDA_SUCCESS) {
			kv_errf(err, errlen, "kernel %s: %s", names[i], kv_cu_name(r));
			kv_cuda_kernels_unload(k);
			return kv_cu_errno(r);
		}
	}
	*out = k;
	return 0;
}

void kv_cuda_kernels_unload(struct kv_cuda_kernels *k)
{
	if (!k)
		return;
	if (k->mod)
		kv_cu.cuModuleUnload(k->mod);
	free(k);
}

static int launch(CUfunction f, uint32_t gx, uint32_t gy, CUstream s, void **args)
{
	CUresult r = kv_cu.cuLaunchKernel(f, gx, gy, 1, THREADS, 1, 1, 0, s, args, NULL);

	return kv_cu_errno(r);
}

static uint32_t min_u64(uint64_t a, uint64_t b)
{
	return (uint32_t)(a < b ? a : b);
}

static int quant_common(CUfunction f, uint64_t desc, uint32_t nd, uint64_t n, uint64_t group,
			CUstream s)
{
	uint64_t ng;
	void *args[5];

	if (!f || !desc || !n)
		return -EINVAL;
	if (!nd)
		return 0;
	if (!group || group > n)
		group = n;
	ng = (n + group - 1) / group;
	args[0] = &desc;
	args[1] = &nd;
	args[2] = &n;
	args[3] = &group;
	args[4] = &ng;
	/* Group index on x, block index on y (at most 65535; the kernel strides). */
	return launch(f, min_u64(ng, 4096), min_u64(nd, 65535), s, args);
}

/* The kernel of format f and type t, or NULL for another. */
static CUfunction pick(CUfunction (*tab)[3], enum kv_qfmt f, enum kv_dtype t)
{
	if ((f != KV_QFMT_E4M3 && f != KV_QFMT_E5M2) || (t != KV_DTYPE_F16 && t != KV_DTYPE_BF16))
		return NULL;
	return tab[f][t];
}

int kv_cuda_quant(struct kv_cuda_kernels *k, enum kv_qfmt f, enum kv_dtype t, uint64_t desc,
		  uint32_t nd, uint64_t n, uint64_t group, CUstream s)
{
	if (!k)
		return -EINVAL;
	return quant_common(pick(k->quant, f, t), desc, nd, n, group, s);
}

int kv_cuda_dequant(struct kv_cuda_kernels *k, enum kv_qfmt f, enum kv_dtype t, uint64_t desc,
		    uint32_t nd, uint64_t n, uint64_t group, CUstream s)
{
	if (!k)
		return -EINVAL;
	return quant_common(pick(k->dequant, f, t), desc, nd, n, group, s);
}

int kv_cuda_copy_batch(struct kv_cuda_kernels *k, uint64_t desc, uint32_t nd, uint64_t max_len,
		       CUstream s)
{
	uint64_t chunks = max_len ? (max_len + COPY_CHUNK - 1) / COPY_CHUNK : 1;
	void *args[2] = { &desc, &nd };

	if (!k || !desc)
		return -EINVAL;
	if (!nd)
		return 0;
	return launch(k->copy, min_u64(nd, 1u << 20), min_u64(chunks, 64), s, args);
}

int kv_cuda_crc32c(struct kv_cuda_kernels *k, uint64_t desc, uint32_t nd, CUstream s)
{
	void *args[2] = { &desc, &nd };

	if (!k || !desc)
		return -EINVAL;
	if (!nd)
		return 0;
	return launch(k->crc, min_u64(nd, 1u << 20), 1, s, args);
}
