// Device kernels: FP8 block quantization, batched gather/scatter, CRC32C.
//
// Compiled by nvcc into a fatbin (kernels/meson.build) that kernels_cuda.c
// embeds and loads with cuModuleLoadData, so nothing links the CUDA runtime.
// Every kernel takes its work as an array of struct kv_gather_desc in
// device-accessible memory (device memory, or pinned host memory through
// unified addressing) and has a C reference in this folder that produces the
// same bytes: quant.c (through the shared fp8.h), gather.c, crc32c.c.
//
// No -use_fast_math: the quantizer's arithmetic is fp8.h's, with __fmul_rn
// and __fdiv_rn, so neither contraction nor approximate division can change
// a bit.

#include <stdint.h>

#include "crc32c_parts.h"
#include "fp8.h"
#include "gather.h"

#define THREADS 256

// ---- block reductions -----------------------------------------------------

__device__ static uint32_t block_max_u32(uint32_t v, uint32_t *sh)
{
	for (int o = 16; o > 0; o >>= 1)
		v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
	if ((threadIdx.x & 31) == 0)
		sh[threadIdx.x >> 5] = v;
	__syncthreads();
	if (threadIdx.x < 32) {
		v = threadIdx.x < (blockDim.x >> 5) ? sh[threadIdx.x] : 0;
		for (int o = 16; o > 0; o >>= 1)
			v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
		if (threadIdx.x == 0)
			sh[0] = v;
	}
	__syncthreads();
	v = sh[0];
	__syncthreads();
	return v;
}

// ---- quantization -----------------------------------------------------------

template <int BF16> __device__ static float to_f32(uint16_t v)
{
	return BF16 ? kv_bf16_to_f32(v) : kv_f16_to_f32(v);
}

template <int BF16> __device__ static uint16_t abs_finite(uint16_t v)
{
	return BF16 ? kv_bf16_abs_finite(v) : kv_f16_abs_finite(v);
}

template <int BF16> __device__ static uint16_t from_f32(float x)
{
	return BF16 ? kv_f32_to_bf16(x) : kv_f32_to_f16(x);
}

template <int E5M2> __device__ static void scale_of(float amax, float *scale, float *inv)
{
	kv_quant_scale_to(amax, E5M2 ? KV_E5M2_MAX : KV_E4M3_MAX, scale, inv);
}

template <int E5M2> __device__ static uint8_t to_fp8(float x, float inv)
{
	return E5M2 ? kv_quant_elem_e5m2(x, inv) : kv_quant_elem(x, inv);
}

template <int E5M2> __device__ static float from_fp8(uint8_t q, float scale)
{
	return E5M2 ? kv_dequant_elem_e5m2(q, scale) : kv_dequant_elem(q, scale);
}

// Grid: x over the groups of a block, y over the blocks (desc entries).
// desc[i].src: n elements; desc[i].dst: 4-byte aligned, kv_quant_bytes(n,
// group) bytes (scales, then the FP8 bytes: E4M3, or E5M2 when E5M2 is 1).
// Either side may be pinned host memory through its device address (the
// cuda backend quantizes straight into a G2 slot): every byte is written
// once, so a store that crosses the bus is never read back here.
template <int BF16, int E5M2>
__device__ static void quant(const struct kv_gather_desc *desc, uint32_t nd, uint64_t n,
			     uint64_t group, uint64_t ngroups)
{
	__shared__ uint32_t sh[32];
	__shared__ float s_inv;

	for (uint32_t b = blockIdx.y; b < nd; b += gridDim.y) {
		const uint16_t *src = (const uint16_t *)desc[b].src;
		float *scales = (float *)desc[b].dst;
		uint8_t *q = (uint8_t *)desc[b].dst + 4 * ngroups;

		for (uint64_t g = blockIdx.x; g < ngroups; g += gridDim.x) {
			uint64_t lo = g * group, hi = lo + group < n ? lo + group : n;
			uint32_t m = 0;

			for (uint64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
				m = max(m, (uint32_t)abs_finite<BF16>(src[i]));
			m = block_max_u32(m, sh);
			if (threadIdx.x == 0) {
				float scale, inv;

				scale_of<E5M2>(to_f32<BF16>((uint16_t)m), &scale, &inv);
				scales[g] = scale;
				s_inv = inv;
			}
			__syncthreads();
			float inv = s_inv;

			for (uint64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
				q[i] = to_fp8<E5M2>(to_f32<BF16>(src[i]), inv);
			__syncthreads();  // s_inv is rewritten by the next group
		}
	}
}

template <int BF16, int E5M2>
__device__ static void dequant(const struct kv_gather_desc *desc, uint32_t nd, uint64_t n,
			       uint64_t group, uint64_t ngroups)
{
	for (uint32_t b = blockIdx.y; b < nd; b += gridDim.y) {
		const float *scales = (const float *)desc[b].src;
		const uint8_t *q = (const uint8_t *)desc[b].src + 4 * ngroups;
		uint16_t *dst = (uint16_t *)desc[b].dst;

		for (uint64_t g = blockIdx.x; g < ngroups; g += gridDim.x) {
			uint64_t lo = g * group, hi = lo + group < n ? lo + group : n;
			float scale = scales[g];

			for (uint64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
				dst[i] = from_f32<BF16>(from_fp8<E5M2>(q[i], scale));
		}
	}
}

// The entry points, by format and element type (kernels_cuda.c looks them
// up by these names).
#define KV_QUANT_KERNELS(fmt, e5m2, dt, bf16)                                              \
	extern "C" __global__ void __launch_bounds__(THREADS)                               \
		kv_quant_##fmt##dt(const struct kv_gather_desc *d, uint32_t nd, uint64_t n,  \
				   uint64_t group, uint64_t ngroups)                         \
	{                                                                                   \
		quant<bf16, e5m2>(d, nd, n, group, ngroups);                                \
	}                                                                                   \
	extern "C" __global__ void __launch_bounds__(THREADS)                               \
		kv_dequant_##fmt##dt(const struct kv_gather_desc *d, uint32_t nd, uint64_t n, \
				     uint64_t group, uint64_t ngroups)                       \
	{                                                                                   \
		dequant<bf16, e5m2>(d, nd, n, group, ngroups);                              \
	}

// E4M3 keeps its first names (kv_quant_f16, ...); E5M2's carry the format.
KV_QUANT_KERNELS(, 0, f16, 0)
KV_QUANT_KERNELS(, 0, bf16, 1)
KV_QUANT_KERNELS(e5m2_, 1, f16, 0)
KV_QUANT_KERNELS(e5m2_, 1, bf16, 1)

// ---- batched copy (gather / scatter) ----------------------------------------

#define COPY_CHUNK 65536u

// Grid: x over the descriptors, y over COPY_CHUNK pieces of each. 16-byte
// accesses where source, destination and length allow, bytes otherwise.
extern "C" __global__ void __launch_bounds__(THREADS)
	kv_copy_batch(const struct kv_gather_desc *desc, uint32_t nd)
{
	for (uint32_t b = blockIdx.x; b < nd; b += gridDim.x) {
		uint64_t dst = desc[b].dst, src = desc[b].src, len = desc[b].len;

		for (uint64_t lo = (uint64_t)blockIdx.y * COPY_CHUNK; lo < len;
		     lo += (uint64_t)gridDim.y * COPY_CHUNK) {
			uint64_t hi = lo + COPY_CHUNK < len ? lo + COPY_CHUNK : len;

			if (((dst | src | lo | hi) & 15) == 0) {
				const uint4 *s = (const uint4 *)(src + lo);
				uint4 *d = (uint4 *)(dst + lo);

				for (uint64_t i = threadIdx.x; i < (hi - lo) / 16; i += blockDim.x)
					d[i] = s[i];
			} else {
				const uint8_t *s = (const uint8_t *)src;
				uint8_t *d = (uint8_t *)dst;

				for (uint64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
					d[i] = s[i];
			}
		}
	}
}

// ---- CRC32C -------------------------------------------------------------------

// One CUDA block per descriptor, crc32c_parts.h's algorithm: each thread's
// piece, then a tree of joins. *(uint32_t *)desc[i].dst = kv_crc32c(0,
// desc[i].src, desc[i].len).
extern "C" __global__ void __launch_bounds__(THREADS)
	kv_crc32c_batch(const struct kv_gather_desc *desc, uint32_t nd)
{
	__shared__ uint32_t tab[4 * 256];
	__shared__ uint32_t x2n[32];
	__shared__ uint32_t part[THREADS];
	__shared__ uint64_t plen[THREADS];
	unsigned t = threadIdx.x;

	for (unsigned i = t; i < 256; i += blockDim.x)
		tab[i] = kv_crc_tab0(i);
	__syncthreads();
	for (int k = 1; k < 4; k++) {
		for (unsigned i = t; i < 256; i += blockDim.x)
			tab[k * 256 + i] = (tab[(k - 1) * 256 + i] >> 8) ^
					   tab[tab[(k - 1) * 256 + i] & 0xff];
		__syncthreads();
	}
	if (t == 0)
		kv_crc_x2n_init(x2n);
	__syncthreads();

	for (uint32_t b = blockIdx.x; b < nd; b += gridDim.x) {
		const uint8_t *p = (const uint8_t *)desc[b].src;
		uint64_t n = desc[b].len, lo, hi;

		kv_crc_split(n, blockDim.x, t, &lo, &hi);
		part[t] = kv_crc_piece(p, lo, hi, tab);
		plen[t] = hi - lo;
		__syncthreads();
		for (unsigned s = 1; s < blockDim.x; s <<= 1) {
			if ((t & (2 * s - 1)) == 0 && t + s < blockDim.x) {
				part[t] = kv_crc_shift(part[t], plen[t + s], x2n) ^ part[t + s];
				plen[t] += plen[t + s];
			}
			__syncthreads();
		}
		if (t == 0)
			*(uint32_t *)desc[b].dst = kv_crc_finish(part[0], n, x2n);
		__syncthreads();
	}
}
