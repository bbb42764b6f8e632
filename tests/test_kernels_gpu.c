/* The device kernels against their C references, bit for bit: FP8 E4M3
 * and E5M2 quantization and dequantization of FP16 and BF16 blocks (random
 * values, specials, subnormals, outliers, partial groups; the quantized side
 * in device memory, and in pinned host memory through its device address as
 * the cuda backend's tier copies use it), CRC32C of buffers of odd
 * lengths and alignments, gather and scatter of many small blocks. Exits 77
 * without a usable GPU. Suite 'gpu'. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "crc32c.h"
#include "fp8.h"
#include "check_cuda.h"
#include "kernels_cuda.h"

static uint64_t rs = 0x1234567887654321ull;

static uint64_t rnd(void)
{
	rs ^= rs << 13;
	rs ^= rs >> 7;
	rs ^= rs << 17;
	return rs;
}

static struct kv_cuda_kernels *K;
static CUstream S;

/* After uploads (cuMemcpyHtoD, cuMemsetD8: the legacy stream) and before a
 * launch on S, which is CU_STREAM_NON_BLOCKING and so does not wait for
 * them: a pageable upload may return before its DMA has landed. */
static void uploaded(void)
{
	CK(kv_cu.cuCtxSynchronize());
}

/* Pinned, device-mapped descriptors. */
static struct kv_gather_desc *desc_alloc(uint32_t n, CUdeviceptr *dptr)
{
	void *p;

	CK(kv_cu.cuMemHostAlloc(&p, n * sizeof(struct kv_gather_desc),
				CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
	CK(kv_cu.cuMemHostGetDevicePointer(dptr, p, 0));
	return p;
}

static uint16_t special(enum kv_dtype t, uint64_t r)
{
	static const float v[] = { 0.0f, -0.0f, 1.0f / 0.0f, -1.0f / 0.0f, 65504.0f, -65504.0f,
				   6e-8f, -6e-8f, 1e-5f, 448.0f, 3e38f, 1e-30f };
	float x = v[r % (sizeof(v) / sizeof(v[0]))];

	if (r % 13 == 0)
		return t == KV_DTYPE_F16 ? 0x7e00 : 0x7fc0;  /* NaN */
	return t == KV_DTYPE_F16 ? kv_f32_to_f16(x) : kv_f32_to_bf16(x);
}

/* mapped: the quantized blocks in pinned host memory, written and read by
 * the kernels through its device address (zero-copy). */
static void quant_case(enum kv_qfmt f, enum kv_dtype t, uint64_t n, uint64_t group, int mapped)
{
	enum { ND = 6 };
	size_t qb = kv_quant_bytes(n, group), qs = (qb + 15) & ~(size_t)15;
	uint16_t *src = malloc(ND * n * 2), *deq = malloc(ND * n * 2), *deq_ref = malloc(n * 2);
	uint8_t *q = NULL, *q_ref = malloc(qb);
	CUdeviceptr dsrc, dq, dd, ddesc;
	struct kv_gather_desc *d = desc_alloc(ND, &ddesc);
	uint64_t i, b;

	if (mapped) {
		void *hp;

		CK(kv_cu.cuMemHostAlloc(&hp, ND * qs,
					CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
		CK(kv_cu.cuMemHostGetDevicePointer(&dq, hp, 0));
		q = hp;
		memset(q, 0xA5, ND * qs);
	} else {
		q = malloc(ND * qs);
	}
	CHECK(src && deq && deq_ref && q && q_ref);
	for (b = 0; b < ND; b++)
		for (i = 0; i < n; i++) {
			uint64_t r = rnd();
			float x = (float)((double)(int64_t)r / 9.2e18) *
				  (b == 3 ? 1e-6f : b == 4 && i % 64 == 7 ? 300.0f : 2.0f);
			uint16_t v = t == KV_DTYPE_F16 ? kv_f32_to_f16(x) : kv_f32_to_bf16(x);

			if (b == 5)
				v = 0;
			else if (r % 101 == 0)
				v = special(t, r >> 8);
			src[b * n + i] = v;
		}
	CK(kv_cu.cuMemAlloc(&dsrc, ND * n * 2));
	if (!mapped)
		CK(kv_cu.cuMemAlloc(&dq, ND * qs));
	CK(kv_cu.cuMemAlloc(&dd, ND * n * 2));
	CK(kv_cu.cuMemcpyHtoD(dsrc, src, ND * n * 2));
	uploaded();
	for (b = 0; b < ND; b++)
		d[b] = (struct kv_gather_desc){ .src = dsrc + b * n * 2, .dst = dq + b * qs };
	CHECK_EQ(kv_cuda_quant(K, f, t, ddesc, ND, n, group, S), 0);
	CK(kv_cu.cuStreamSynchronize(S));
	if (!mapped)
		CK(kv_cu.cuMemcpyDtoH(q, dq, ND * qs));
	for (b = 0; b < ND; b++) {
		CHECK_EQ(kv_qfmt_quant_ref(f, t, src + b * n, n, group, q_ref, qb), 0);
		if (memcmp(q + b * qs, q_ref, qb)) {
			for (i = 0; i < qb && q[b * qs + i] == q_ref[i]; i++)
				;
			fprintf(stderr, "quant fmt %d dtype %d n %llu group %llu mapped %d block "
				"%llu: byte %llu is %#x, reference %#x\n", f, t, (unsigned long long)n,
				(unsigned long long)group, mapped, (unsigned long long)b,
				(unsigned long long)i, q[b * qs + i], q_ref[i]);
			exit(1);
		}
	}
	/* Dequantize what the device produced (equal to the reference's). */
	for (b = 0; b < ND; b++)
		d[b] = (struct kv_gather_desc){ .src = dq + b * qs, .dst = dd + b * n * 2 };
	CHECK_EQ(kv_cuda_dequant(K, f, t, ddesc, ND, n, group, S), 0);
	CK(kv_cu.cuStreamSynchronize(S));
	CK(kv_cu.cuMemcpyDtoH(deq, dd, ND * n * 2));
	for (b = 0; b < ND; b++) {
		CHECK_EQ(kv_qfmt_dequant_ref(f, t, q + b * qs, qb, n, group, deq_ref), 0);
		if (memcmp(deq + b * n, deq_ref, n * 2)) {
			for (i = 0; i < n && deq[b * n + i] == deq_ref[i]; i++)
				;
			fprintf(stderr, "dequant fmt %d dtype %d n %llu mapped %d block %llu: "
				"element %llu is %#x, reference %#x\n", f, t, (unsigned long long)n,
				mapped, (unsigned long long)b, (unsigned long long)i,
				deq[b * n + i], deq_ref[i]);
			exit(1);
		}
	}
	CK(kv_cu.cuMemFree(dsrc));
	if (mapped)
		CK(kv_cu.cuMemFreeHost(q));
	else
		CK(kv_cu.cuMemFree(dq));
	CK(kv_cu.cuMemFree(dd));
	CK(kv_cu.cuMemFreeHost(d));
	free(src);
	free(deq);
	free(deq_ref);
	if (!mapped)
		free(q);
	free(q_ref);
}

static void crc_case(void)
{
	static const uint64_t lens[] = { 0, 1, 3, 9, 255, 4096, 12345, 65536, 65537, 2 << 20 };
	enum { NL = sizeof(lens) / sizeof(lens[0]), NOFF = 4 };
	uint64_t total = 0, off[NL * NOFF], i, j, k = 0;
	uint8_t *buf;
	uint32_t out[NL * NOFF];
	CUdeviceptr dbuf, dout, ddesc;
	struct kv_gather_desc *d = desc_alloc(NL * NOFF, &ddesc);

	for (i = 0; i < NL; i++)
		total += (lens[i] + 16) * NOFF;
	buf = malloc(total);
	CHECK(buf != NULL);
	for (i = 0; i < total; i++)
		buf[i] = (uint8_t)rnd();
	CK(kv_cu.cuMemAlloc(&dbuf, total));
	CK(kv_cu.cuMemAlloc(&dout, sizeof(out)));
	CK(kv_cu.cuMemcpyHtoD(dbuf, buf, total));
	uploaded();
	total = 0;
	for (i = 0; i < NL; i++)
		for (j = 0; j < NOFF; j++, k++) {
			off[k] = total + j;  /* alignments 0..3 */
			d[k] = (struct kv_gather_desc){ .src = dbuf + off[k], .dst = dout + 4 * k,
							.len = lens[i] };
			total += lens[i] + 16;
		}
	CHECK_EQ(kv_cuda_crc32c(K, ddesc, NL * NOFF, S), 0);
	CK(kv_cu.cuStreamSynchronize(S));
	CK(kv_cu.cuMemcpyDtoH(out, dout, sizeof(out)));
	for (k = 0; k < NL * NOFF; k++) {
		uint32_t want = kv_crc32c(0, buf + off[k], d[k].len);

		if (out[k] != want) {
			fprintf(stderr, "crc32c of %llu bytes at offset %llu: %#x, reference %#x\n",
				(unsigned long long)d[k].len, (unsigned long long)off[k], out[k], want);
			exit(1);
		}
	}
	CK(kv_cu.cuMemFree(dbuf));
	CK(kv_cu.cuMemFree(dout));
	CK(kv_cu.cuMemFreeHost(d));
	free(buf);
}

static void copy_case(void)
{
	enum { N = 200 };
	uint64_t blocks[N], back[N], lens[N], total = 0, maxlen = 0, i;
	CUdeviceptr dblocks, dback, dstage, ddesc;
	struct kv_gather_desc *d = desc_alloc(N, &ddesc);
	uint8_t *h, *h2, *stage;

	for (i = 0; i < N; i++) {
		lens[i] = i % 4 == 0 ? 65536 : i % 4 == 1 ? 16 * (rnd() % 300 + 1) : rnd() % 5000 + 1;
		if (i == 7)
			lens[i] = 2 << 20;   /* split among CUDA blocks */
		total += lens[i];
		maxlen = lens[i] > maxlen ? lens[i] : maxlen;
	}
	h = malloc(total);
	h2 = malloc(total);
	stage = malloc(total);
	CHECK(h && h2 && stage);
	for (i = 0; i < total; i++)
		h[i] = (uint8_t)rnd();
	CK(kv_cu.cuMemAlloc(&dblocks, total + 16 * N));
	CK(kv_cu.cuMemAlloc(&dback, total + 16 * N));
	CK(kv_cu.cuMemAlloc(&dstage, total));
	CK(kv_cu.cuMemsetD8(dback, 0, total + 16 * N));
	{
		uint64_t o = 0, src = 0;

		for (i = 0; i < N; i++) {
			o += i % 3;  /* some blocks off 16-byte alignment */
			blocks[i] = dblocks + o;
			back[i] = dback + o;
			CK(kv_cu.cuMemcpyHtoD(blocks[i], h + src, lens[i]));
			o += lens[i];
			src += lens[i];
		}
	}
	uploaded();
	CHECK_EQ(kv_gather_plan(d, dstage, blocks, lens, N, 0), total);
	CHECK_EQ(kv_cuda_copy_batch(K, ddesc, N, maxlen, S), 0);
	CK(kv_cu.cuStreamSynchronize(S));
	CK(kv_cu.cuMemcpyDtoH(stage, dstage, total));
	CHECK(memcmp(stage, h, total) == 0);
	CHECK_EQ(kv_gather_plan(d, dstage, back, lens, N, 1), total);
	CHECK_EQ(kv_cuda_copy_batch(K, ddesc, N, maxlen, S), 0);
	CK(kv_cu.cuStreamSynchronize(S));
	{
		uint64_t src = 0;

		for (i = 0; i < N; i++) {
			CK(kv_cu.cuMemcpyDtoH(h2 + src, back[i], lens[i]));
			src += lens[i];
		}
	}
	CHECK(memcmp(h2, h, total) == 0);
	CK(kv_cu.cuMemFree(dblocks));
	CK(kv_cu.cuMemFree(dback));
	CK(kv_cu.cuMemFree(dstage));
	CK(kv_cu.cuMemFreeHost(d));
	free(h);
	free(h2);
	free(stage);
}

int main(void)
{
	char err[256];
	CUdevice dev;
	CUcontext ctx;
	int n = 0, t, f;

	if (kv_cu_load() < 0)
		GPU_SKIP(kv_cu_error());
	CK(kv_cu.cuDeviceGetCount(&n));
	if (!n)
		GPU_SKIP("no CUDA device");
	CK(kv_cu.cuDeviceGet(&dev, 0));
	CK(kv_cu.cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(kv_cu.cuCtxSetCurrent(ctx));
	if (kv_cuda_kernels_load(&K, err, sizeof(err)) < 0) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	CK(kv_cu.cuStreamCreate(&S, CU_STREAM_NON_BLOCKING));
	for (f = KV_QFMT_E4M3; f <= KV_QFMT_E5M2; f++)
		for (t = KV_DTYPE_F16; t <= KV_DTYPE_BF16; t++) {
			enum kv_qfmt qf = (enum kv_qfmt)f;
			enum kv_dtype dt = (enum kv_dtype)t;

			quant_case(qf, dt, 32768, 0, 0);
			quant_case(qf, dt, 32768, 128, 0);
			quant_case(qf, dt, 1000, 96, 0);
			quant_case(qf, dt, 1, 0, 0);
			/* A tier copy's shape: a 16 KiB block, KV_QUANT_GROUP. */
			quant_case(qf, dt, 8192, KV_QUANT_GROUP, 1);
			quant_case(qf, dt, 1000, 96, 1);
		}
	/* Arguments the launchers refuse. */
	CHECK_EQ(kv_cuda_quant(K, KV_QFMT_RAW, KV_DTYPE_F16, 4096, 1, 8, 0, S), -EINVAL);
	CHECK_EQ(kv_cuda_dequant(K, (enum kv_qfmt)3, KV_DTYPE_F16, 4096, 1, 8, 0, S), -EINVAL);
	CHECK_EQ(kv_cuda_quant(K, KV_QFMT_E5M2, KV_DTYPE_NONE, 4096, 1, 8, 0, S), -EINVAL);
	crc_case();
	copy_case();
	CK(kv_cu.cuStreamDestroy(S));
	kv_cuda_kernels_unload(K);
	CK(kv_cu.cuDevicePrimaryCtxRelease(dev));
	fprintf(stderr, "kernels match their references\n");
	return 0;
}
