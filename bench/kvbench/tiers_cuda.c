/* kvbench section g on the cuda backend: see tiers_cuda.h. */
#include "tiers_cuda.h"

#include <stdlib.h>
#include <string.h>

#include "kvbench.h"
#include "kvconfig.h"

#if KV_HAVE_CUDA
#include "cudrv.h"

static CUcontext ctx;
static CUdevice dev;

static void cu_die(CUresult r, const char *what)
{
	const char *name = NULL;

	if (r == CUDA_SUCCESS)
		return;
	kv_cu.cuGetErrorName(r, &name);
	die("section g on the cuda backend: %s: %s", what, name ? name : "?");
}

void tier_dev_init(void)
{
	if (kv_cu_load() < 0)
		die("section g: the daemon serves CUDA memory, but CUDA is unusable here: %s",
		    kv_cu_error());
	cu_die(kv_cu.cuDeviceGet(&dev, 0), "cuDeviceGet");
	cu_die(kv_cu.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
	cu_die(kv_cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

void tier_dev_fini(void)
{
	if (!ctx)
		return;
	kv_cu.cuCtxSetCurrent(NULL);
	kv_cu.cuDevicePrimaryCtxRelease(dev);
	ctx = NULL;
}

void *tier_dev_host_alloc(uint64_t bytes)
{
	void *p = NULL;

	if (kv_cu.cuMemHostAlloc(&p, bytes, CU_MEMHOSTALLOC_PORTABLE) != CUDA_SUCCESS)
		return NULL;
	return p;
}

void tier_dev_host_free(void *p)
{
	if (p)
		kv_cu.cuMemFreeHost(p);
}

void tier_dev_write(void *dst, const void *src, uint64_t bytes)
{
	cu_die(kv_cu.cuMemcpyHtoD((CUdeviceptr)(uintptr_t)dst, src, bytes), "cuMemcpyHtoD");
}

void tier_dev_read(void *dst, const void *src, uint64_t bytes)
{
	cu_die(kv_cu.cuMemcpyDtoH(dst, (CUdeviceptr)(uintptr_t)src, bytes), "cuMemcpyDtoH");
}

double tier_copy_floor(bool d2h, uint64_t bytes, uint64_t block)
{
	CUdeviceptr dbuf = 0;
	CUstream st = NULL;
	void *host = NULL;
	double best = 0;
	int rep;

	if (kv_cu.cuMemAlloc(&dbuf, bytes) != CUDA_SUCCESS ||
	    !(host = tier_dev_host_alloc(bytes)) ||
	    kv_cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
		goto out;
	memset(host, 0x5a, bytes);
	for (rep = 0; rep < 3; rep++) {
		uint64_t t0 = now_ns(), off;
		double secs;

		for (off = 0; off + block <= bytes; off += block) {
			CUresult r = d2h ? kv_cu.cuMemcpyDtoHAsync((char *)host + off, dbuf + off, block, st)
					 : kv_cu.cuMemcpyHtoDAsync(dbuf + off, (char *)host + off, block, st);
			if (r != CUDA_SUCCESS)
				goto out;
		}
		if (kv_cu.cuStreamSynchronize(st) != CUDA_SUCCESS)
			goto out;
		secs = (double)(now_ns() - t0) * 1e-9;
		if (secs > 0 && (double)bytes / 1e9 / secs > best)
			best = (double)bytes / 1e9 / secs;
	}
out:
	if (st)
		kv_cu.cuStreamDestroy(st);
	tier_dev_host_free(host);
	if (dbuf)
		kv_cu.cuMemFree(dbuf);
	return best;
}

#else

void tier_dev_init(void)
{
	die("section g: the daemon serves CUDA memory, but this kvbench was built without CUDA");
}

void tier_dev_fini(void)
{
}

void *tier_dev_host_alloc(uint64_t bytes)
{
	(void)bytes;
	return NULL;
}

void tier_dev_host_free(void *p)
{
	(void)p;
}

void tier_dev_write(void *dst, const void *src, uint64_t bytes)
{
	(void)dst, (void)src, (void)bytes;
}

void tier_dev_read(void *dst, const void *src, uint64_t bytes)
{
	(void)dst, (void)src, (void)bytes;
}

double tier_copy_floor(bool d2h, uint64_t bytes, uint64_t block)
{
	(void)d2h, (void)bytes, (void)block;
	return 0;
}
#endif
