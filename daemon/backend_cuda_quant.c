/* Compress on demote on the cuda backend: see backend_cuda_quant.h. Built
 * only with CUDA (daemon/meson.build). */
#include "kvconfig.h"

#if KV_HAVE_CUDA

#include "backend_cuda_quant.h"

#include <errno.h>

#include "cudrv.h"
#include "kernels_cuda.h"
#include "log.h"
#include "quant.h"

int kv_cudaq_load(int ordinal, struct kv_cuda_kernels **k)
{
	char err[256] = "";
	int r = kv_cuda_kernels_load(k, err, sizeof(err));

	if (r < 0) {
		*k = NULL;
		kv_warn("cuda: device %d: %s: tier copies stay uncompressed (namespaces with "
			"compress too)", ordinal, err);
	}
	return r;
}

void kv_cudaq_descs_free(struct kv_cudaq_descs *qd)
{
	if (qd->h)
		kv_cu.cuMemFreeHost(qd->h);
	*qd = (struct kv_cudaq_descs){ 0 };
}

/* At least n entries in qd. A page at least, doubling: a batch of the same
 * size as the last never allocates. */
static int descs_room(struct kv_cudaq_descs *qd, uint32_t n)
{
	uint64_t cap = 4096 / sizeof(struct kv_gather_desc);
	CUdeviceptr d;
	CUresult r;
	void *p;

	if (n <= qd->cap)
		return 0;
	if (cap < 2 * (uint64_t)qd->cap)
		cap = 2 * (uint64_t)qd->cap;
	if (cap < n)
		cap = n;
	r = kv_cu.cuMemHostAlloc(&p, cap * sizeof(struct kv_gather_desc),
				 CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
	if (r != CUDA_SUCCESS) {
		kv_err("cuda: %llu bytes of pinned memory for copy descriptors: %s",
		       (unsigned long long)(cap * sizeof(struct kv_gather_desc)), kv_cu_name(r));
		return -ENOMEM;
	}
	r = kv_cu.cuMemHostGetDevicePointer(&d, p, 0);
	if (r != CUDA_SUCCESS) {
		kv_err("cuda: the device address of copy descriptors: %s", kv_cu_name(r));
		kv_cu.cuMemFreeHost(p);
		return kv_cu_errno(r);
	}
	kv_cudaq_descs_free(qd);
	qd->h = p;
	qd->d = d;
	qd->cap = (uint32_t)cap;
	return 0;
}

int kv_cudaq_launch(struct kv_cudaq_descs *qd, struct kv_cuda_kernels *k, enum kv_copy_dir dir,
		    struct kv_cudaq_copy *q, uint32_t n, CUstream s, uint32_t *started)
{
	uint32_t i, j, at = 0;
	int r;

	*started = 0;
	if (!n)
		return 0;
	if (!k || (dir != KV_COPY_D2H && dir != KV_COPY_H2D))
		return -EINVAL;
	if ((r = descs_room(qd, n)) < 0)
		return r;
	for (i = 0; i < n; i++)
		q[i].taken = 0;
	/* Group by (qfmt, qdtype, len) in first-seen order; a group's entries
	 * are contiguous in qd, each launch reads its own range. */
	for (i = 0; i < n; i++) {
		uint32_t first = at;

		if (q[i].taken)
			continue;
		for (j = i; j < n; j++) {
			if (q[j].taken || q[j].qfmt != q[i].qfmt || q[j].qdtype != q[i].qdtype ||
			    q[j].len != q[i].len)
				continue;
			q[j].taken = 1;
			qd->h[at++] = dir == KV_COPY_D2H
				? (struct kv_gather_desc){ .dst = q[j].host, .src = q[j].dev,
							   .len = q[j].len }
				: (struct kv_gather_desc){ .dst = q[j].dev, .src = q[j].host,
							   .len = q[j].len };
		}
		if (dir == KV_COPY_D2H)
			r = kv_cuda_quant(k, (enum kv_qfmt)q[i].qfmt, (enum kv_dtype)q[i].qdtype,
					  qd->d + first * sizeof(struct kv_gather_desc), at - first,
					  q[i].len / 2, KV_QUANT_GROUP, s);
		else
			r = kv_cuda_dequant(k, (enum kv_qfmt)q[i].qfmt, (enum kv_dtype)q[i].qdtype,
					    qd->d + first * sizeof(struct kv_gather_desc), at - first,
					    q[i].len / 2, KV_QUANT_GROUP, s);
		if (r < 0)
			return r;
		*started += at - first;
	}
	return 0;
}

#endif
