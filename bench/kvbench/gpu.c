/* kvbench section h: the GPU data paths, measured in-process (no daemon).
 *
 *   h1  first touch: a client's import + map of segments exported by another
 *       process (kvc_map_segment on the cuda backend), per segment and per
 *       2 MiB page, for 2 MiB and for large segments
 *   h2  G1 -> G2 and G2 -> G1 through the cuda backend's copy_async (batches
 *       of 64 KiB and of 2 MiB blocks between segments and the pinned
 *       arena, completions through completion_fd), beside the floor: one
 *       plain cuMemcpyAsync of a large buffer to or from pinned memory;
 *       and the compressing copies (compress = fp8_e4m3, BF16 blocks of
 *       256 KiB and 2 MiB): the quantizing kernel writing the arena (D2H)
 *       and the dequantizing one reading it (H2D), in GB/s of uncompressed
 *       block bytes, beside the same floor
 *   h3  64 KiB blocks scattered in device memory to pinned host memory and
 *       back: one cuMemcpyAsync per block, one cuMemcpyBatchAsync, the
 *       gather kernel writing host memory directly, and the gather kernel
 *       into device staging plus one large copy
 *
 * Without a GPU (or without CUDA in the build) it says "skipped: no GPU"
 * and why. Figures, never assertions, like the rest of kvbench. */
#include "gpu.h"

#include <stdio.h>

#include "kvconfig.h"

#if !KV_HAVE_CUDA

void kvbench_gpu(bool quick)
{
	(void)quick;
	printf("\n(h) GPU data paths\n  skipped: no GPU (this build has no CUDA)\n");
}

#else

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "cudrv.h"
#include "frame.h"
#include "kernels_cuda.h"
#include "kvc_internal.h"

#define KIB 1024ull
#define MIB (1024ull * KIB)
#define GIB (1024ull * MIB)

static double dur;  /* seconds per measurement */

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cu_ok(CUresult r, const char *what)
{
	if (r == CUDA_SUCCESS)
		return 1;
	printf("  %s: %s\n", what, kv_cu_name(r));
	return 0;
}

static void row(const char *name, double gbs, double floor_gbs)
{
	if (floor_gbs > 0)
		printf("  %-52s %8.2f GB/s   floor %8.2f GB/s   %5.0f%%\n", name, gbs, floor_gbs,
		       100 * gbs / floor_gbs);
	else
		printf("  %-52s %8.2f GB/s\n", name, gbs);
}

/* ---- h1: first touch ----------------------------------------------------- */

struct touch_cfg {
	uint64_t seg;
	uint32_t nseg;
};

/* The exporter: a child process with its own backend, sending the fds. */
static void exporter(int sock, const struct touch_cfg *cfg, int ncfg)
{
	struct kv_backend *be[4];
	char err[256], x = 0;
	int dev0 = 0;

	for (int k = 0; k < ncfg; k++) {
		int r = kv_backend_cuda_create(&dev0, 1, cfg[k].seg * cfg[k].nseg, cfg[k].seg, err,
					       sizeof(err), &be[k]);

		if (r < 0) {
			dprintf(2, "kvbench: exporter: %s\n", err);
			_exit(1);
		}
		for (uint32_t i = 0; i < cfg[k].nseg; i++) {
			int fd = be[k]->ops->segment_fd(be[k], 0, i);
			struct iovec iov = { &x, 1 };

			if (kv_sendmsg_fds(sock, &iov, 1, &fd, 1, 0) != 1)
				_exit(1);
		}
	}
	if (read(sock, &x, 1) < 0)
		_exit(1);
	for (int k = 0; k < ncfg; k++)
		kv_backend_destroy(be[k]);
	_exit(0);
}

static void first_touch(bool quick)
{
	static const struct touch_cfg big[] = { { 2 * MIB, 64 }, { 512 * MIB, 4 } };
	static const struct touch_cfg small[] = { { 2 * MIB, 32 }, { 256 * MIB, 2 } };
	const struct touch_cfg *cfg = quick ? small : big;
	int sv[2], st, r;
	pid_t pid;
	CUcontext ctx;
	CUdevice dev;

	printf("(h1) first touch: import + map of segments another process exported\n");
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
		printf("  socketpair: %s\n", strerror(errno));
		return;
	}
	/* Fork before this process touches CUDA. */
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		close(sv[0]);
		exporter(sv[1], cfg, 2);
	}
	close(sv[1]);
	if (kv_cu_load() < 0 || !cu_ok(kv_cu.cuDeviceGet(&dev, 0), "cuDeviceGet") ||
	    !cu_ok(kv_cu.cuDevicePrimaryCtxRetain(&ctx, dev), "context") ||
	    !cu_ok(kv_cu.cuCtxSetCurrent(ctx), "context"))
		goto out;
	for (int k = 0; k < 2; k++) {
		struct kvc_map *m;
		double t_map = 0, t0;
		uint32_t i;
		char name[80];

		if (kvc_map_new("cuda", 1, cfg[k].seg * cfg[k].nseg, cfg[k].seg, &m) < 0)
			goto out;
		for (i = 0; i < cfg[k].nseg; i++) {
			int fd = -1, nfds = 0, trunc = 0;
			char x;

			if (kv_recvmsg_fds(sv[0], &x, 1, &fd, &nfds, 1, 0, &trunc) != 1 || nfds != 1) {
				printf("  the exporter failed (see above)\n");
				kvc_map_free(m);
				goto out;
			}
			t0 = now();
			r = kvc_map_segment(m, 0, i, i * cfg[k].seg, cfg[k].seg, fd);
			t_map += now() - t0;
			if (r < 0) {
				printf("  kvc_map_segment: %s: %s\n", strerror(-r), kvc_map_error(m));
				kvc_map_free(m);
				goto out;
			}
		}
		t0 = now();
		kvc_map_free(m);
		snprintf(name, sizeof(name), "%u segments of %llu MiB", cfg[k].nseg,
			 (unsigned long long)(cfg[k].seg / MIB));
		printf("  %-32s %9.1f us per segment  %7.2f us per 2 MiB page  unmap %7.1f us "
		       "per segment\n", name, 1e6 * t_map / cfg[k].nseg,
		       1e6 * t_map / cfg[k].nseg / (double)(cfg[k].seg / (2 * MIB)),
		       1e6 * (now() - t0) / cfg[k].nseg);
	}
out:
	if (write(sv[0], "x", 1) < 0)
		(void)0;
	close(sv[0]);
	waitpid(pid, &st, 0);
}

/* ---- h2: G1 <-> G2 through the backend ------------------------------------ */

static struct kv_backend *be;

/* Waits for n completions; returns how many failed. */
static int reap_n(int n)
{
	int bad = 0;

	while (n > 0) {
		struct pollfd p = { .fd = be->completion_fd, .events = POLLIN };
		struct kv_copy_done d[64];
		int k;

		if (poll(&p, 1, 10000) != 1)
			return n;
		k = be->ops->reap(be, d, 64);
		for (int i = 0; i < k; i++)
			bad += d[i].res != 0;
		n -= k;
	}
	return bad;
}

/* GB/s of copy_async over the whole pool in blocks of bs, batches of batch;
 * qfmt (a KV_QFMT_*): quantized copies of BF16 blocks, each block's
 * compressed form at the start of its bs bytes of arena, the rate in
 * uncompressed bytes. */
static double tier_rate(enum kv_copy_dir dir, uint8_t *arena, uint64_t pool, uint64_t bs,
			uint32_t batch, uint8_t qfmt)
{
	uint64_t n = pool / bs, bytes = 0;
	struct kv_copy *c = calloc(batch, sizeof(*c));
	double t0 = now(), t;

	if (!c)
		return 0;
	do {
		int inflight = 0;

		for (uint64_t i = 0; i < n; i += batch) {
			uint32_t k = (uint32_t)(n - i < batch ? n - i : batch);

			for (uint32_t j = 0; j < k; j++)
				c[j] = (struct kv_copy){ .dev_off = (i + j) * bs,
							 .host = arena + (i + j) * bs, .len = bs,
							 .qfmt = qfmt,
							 .qdtype = qfmt ? KV_DTYPE_BF16 : 0 };
			if (be->ops->copy_async(be, 0, dir, c, k, i) < 0) {
				free(c);
				return 0;
			}
			inflight++;
		}
		if (reap_n(inflight)) {
			free(c);
			return 0;
		}
		bytes += n * bs;
		t = now() - t0;
	} while (t < dur);
	free(c);
	return (double)bytes / t / 1e9;
}

static double floor_rate(int d2h, CUdeviceptr dbuf, void *host, uint64_t len, CUstream s)
{
	uint64_t bytes = 0;
	double t0 = now(), t;

	do {
		CUresult r = d2h ? kv_cu.cuMemcpyDtoHAsync(host, dbuf, len, s)
				 : kv_cu.cuMemcpyHtoDAsync(dbuf, host, len, s);

		if (r != CUDA_SUCCESS || kv_cu.cuStreamSynchronize(s) != CUDA_SUCCESS)
			return 0;
		bytes += len;
		t = now() - t0;
	} while (t < dur);
	return (double)bytes / t / 1e9;
}

static void tiers(bool quick)
{
	uint64_t pool = quick ? 512 * MIB : 2 * GIB, seg = 256 * MIB, flen = 256 * MIB;
	static const uint64_t sizes[] = { 64 * KIB, 2 * MIB }, qsizes[] = { 256 * KIB, 2 * MIB };
	double fd2h = 0, fh2d = 0;
	CUdeviceptr dbuf = 0;
	CUstream s = NULL;
	uint8_t *arena;
	char err[256];
	int dev0 = 0;

	printf("(h2) G1 <-> G2: cuda backend copy_async between segments and the pinned arena\n");
	if (kv_backend_cuda_create(&dev0, 1, pool, seg, err, sizeof(err), &be) < 0) {
		printf("  %s\n", err);
		return;
	}
	arena = be->ops->host_alloc(be, pool);
	if (!arena) {
		printf("  cannot pin %llu MiB of host memory\n", (unsigned long long)(pool / MIB));
		goto out;
	}
	/* The floor: one large copy between a plain allocation and the arena. */
	if (cu_ok(kv_cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate") &&
	    cu_ok(kv_cu.cuMemAlloc(&dbuf, flen), "cuMemAlloc")) {
		fd2h = floor_rate(1, dbuf, arena, flen, s);
		fh2d = floor_rate(0, dbuf, arena, flen, s);
	}
	printf("  cuMemcpyBatchAsync: %s\n", kv_cu.cuMemcpyBatchAsync ? "yes" : "no (one "
	       "cuMemcpyAsync per copy)");
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		char name[96];

		snprintf(name, sizeof(name), "G1->G2 (D2H) %llu KiB blocks, batches of 256",
			 (unsigned long long)(sizes[i] / KIB));
		row(name, tier_rate(KV_COPY_D2H, arena, pool, sizes[i], 256, 0), fd2h);
		snprintf(name, sizeof(name), "G2->G1 (H2D) %llu KiB blocks, batches of 256",
			 (unsigned long long)(sizes[i] / KIB));
		row(name, tier_rate(KV_COPY_H2D, arena, pool, sizes[i], 256, 0), fh2d);
	}
	/* The segments are zeroed: the kernels' work does not depend on the
	 * values (one scale and one conversion per element either way). */
	if (!be->quant)
		printf("  compressing copies: not available (the kernels did not load; see "
		       "above)\n");
	for (size_t i = 0; be->quant && i < sizeof(qsizes) / sizeof(qsizes[0]); i++) {
		char name[96];

		snprintf(name, sizeof(name), "G1->G2 E4M3 quantizing, BF16 %llu KiB blocks",
			 (unsigned long long)(qsizes[i] / KIB));
		row(name, tier_rate(KV_COPY_D2H, arena, pool, qsizes[i], 256, KV_QFMT_E4M3), fd2h);
		snprintf(name, sizeof(name), "G2->G1 E4M3 dequantizing, BF16 %llu KiB blocks",
			 (unsigned long long)(qsizes[i] / KIB));
		row(name, tier_rate(KV_COPY_H2D, arena, pool, qsizes[i], 256, KV_QFMT_E4M3), fh2d);
	}
	if (be->quant)
		printf("  (quantizing rows: GB/s of uncompressed bytes; %.3f of them cross the "
		       "bus)\n", (double)kv_quant_bytes(MIB / 2, KV_QUANT_GROUP) / (double)MIB);
	row("floor: one cuMemcpyAsync of 256 MiB, D2H", fd2h, 0);
	row("floor: one cuMemcpyAsync of 256 MiB, H2D", fh2d, 0);
out:
	if (dbuf)
		kv_cu.cuMemFree(dbuf);
	if (s)
		kv_cu.cuStreamDestroy(s);
	if (arena)
		be->ops->host_free(be, arena, pool);
	kv_backend_destroy(be);
	be = NULL;
}

/* ---- h3: gather kernel vs per-block copies -------------------------------- */

typedef int (*run_fn)(void *ctx);

static double rate(run_fn fn, void *ctx, uint64_t bytes)
{
	uint64_t done = 0;
	double t0 = now(), t;

	do {
		if (fn(ctx) < 0)
			return 0;
		done += bytes;
		t = now() - t0;
	} while (t < dur);
	return (double)done / t / 1e9;
}

struct gctx {
	struct kv_cuda_kernels *k;
	CUstream s;
	uint32_t n;
	uint64_t bs;
	CUdeviceptr blocks;      /* block i at blocks + 2 * i * bs */
	CUdeviceptr dstage;
	uint8_t *hstage;         /* pinned, device-mapped */
	CUdeviceptr hstage_dev;
	struct kv_gather_desc *desc;  /* pinned, device-mapped */
	CUdeviceptr desc_dev;
	CUdeviceptr *bsrc, *bdst;
	size_t *bsize;
	int h2d;
};

static int sync_s(struct gctx *g)
{
	return kv_cu.cuStreamSynchronize(g->s) == CUDA_SUCCESS ? 0 : -1;
}

static int per_block(void *arg)
{
	struct gctx *g = arg;

	for (uint32_t i = 0; i < g->n; i++) {
		CUdeviceptr b = g->blocks + 2 * i * g->bs;
		CUresult r = g->h2d ? kv_cu.cuMemcpyHtoDAsync(b, g->hstage + i * g->bs, g->bs, g->s)
				    : kv_cu.cuMemcpyDtoHAsync(g->hstage + i * g->bs, b, g->bs, g->s);

		if (r != CUDA_SUCCESS)
			return -1;
	}
	return sync_s(g);
}

static int batch_api(void *arg)
{
	struct gctx *g = arg;
	CUmemcpyAttributes attr;
	size_t idx = 0;

	memset(&attr, 0, sizeof(attr));
	attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
	for (uint32_t i = 0; i < g->n; i++) {
		CUdeviceptr b = g->blocks + 2 * i * g->bs, h = g->hstage_dev + i * g->bs;

		g->bdst[i] = g->h2d ? b : h;
		g->bsrc[i] = g->h2d ? h : b;
		g->bsize[i] = g->bs;
	}
	if (kv_cu.cuMemcpyBatchAsync(g->bdst, g->bsrc, g->bsize, g->n, &attr, &idx, 1, g->s) !=
	    CUDA_SUCCESS)
		return -1;
	return sync_s(g);
}

static int kernel_direct(void *arg)
{
	struct gctx *g = arg;
	uint64_t blocks[1], lens[1];

	for (uint32_t i = 0; i < g->n; i++) {
		blocks[0] = g->blocks + 2 * i * g->bs;
		lens[0] = g->bs;
		kv_gather_plan(&g->desc[i], g->hstage_dev + i * g->bs, blocks, lens, 1, g->h2d);
	}
	if (kv_cuda_copy_batch(g->k, g->desc_dev, g->n, g->bs, g->s) < 0)
		return -1;
	return sync_s(g);
}

static int kernel_staged(void *arg)
{
	struct gctx *g = arg;
	uint64_t blocks[1], lens[1], total = (uint64_t)g->n * g->bs;

	for (uint32_t i = 0; i < g->n; i++) {
		blocks[0] = g->blocks + 2 * i * g->bs;
		lens[0] = g->bs;
		kv_gather_plan(&g->desc[i], g->dstage + i * g->bs, blocks, lens, 1, g->h2d);
	}
	if (g->h2d) {
		if (kv_cu.cuMemcpyHtoDAsync(g->dstage, g->hstage, total, g->s) != CUDA_SUCCESS ||
		    kv_cuda_copy_batch(g->k, g->desc_dev, g->n, g->bs, g->s) < 0)
			return -1;
	} else if (kv_cuda_copy_batch(g->k, g->desc_dev, g->n, g->bs, g->s) < 0 ||
		   kv_cu.cuMemcpyDtoHAsync(g->hstage, g->dstage, total, g->s) != CUDA_SUCCESS) {
		return -1;
	}
	return sync_s(g);
}

static void gather(bool quick)
{
	struct gctx g = { .n = quick ? 1024 : 4096, .bs = 64 * KIB };
	uint64_t total = (uint64_t)g.n * g.bs;
	char err[256];
	CUcontext ctx;
	CUdevice dev;
	void *p;

	printf("(h3) %u blocks of 64 KiB, scattered in device memory, to pinned host memory "
	       "and back\n", g.n);
	/* Its own context: the backend of (h2) left none current. */
	if (!cu_ok(kv_cu.cuDeviceGet(&dev, 0), "cuDeviceGet") ||
	    !cu_ok(kv_cu.cuDevicePrimaryCtxRetain(&ctx, dev), "context"))
		return;
	if (!cu_ok(kv_cu.cuCtxSetCurrent(ctx), "context"))
		goto out;
	if (kv_cuda_kernels_load(&g.k, err, sizeof(err)) < 0) {
		printf("  %s\n", err);
		goto out;
	}
	if (!cu_ok(kv_cu.cuStreamCreate(&g.s, CU_STREAM_NON_BLOCKING), "cuStreamCreate") ||
	    !cu_ok(kv_cu.cuMemAlloc(&g.blocks, 2 * total), "cuMemAlloc") ||
	    !cu_ok(kv_cu.cuMemAlloc(&g.dstage, total), "cuMemAlloc") ||
	    !cu_ok(kv_cu.cuMemHostAlloc(&p, total, CU_MEMHOSTALLOC_PORTABLE |
						       CU_MEMHOSTALLOC_DEVICEMAP), "cuMemHostAlloc"))
		goto out;
	g.hstage = p;
	if (!cu_ok(kv_cu.cuMemHostGetDevicePointer(&g.hstage_dev, p, 0), "device pointer") ||
	    !cu_ok(kv_cu.cuMemHostAlloc(&p, g.n * sizeof(*g.desc), CU_MEMHOSTALLOC_PORTABLE |
						       CU_MEMHOSTALLOC_DEVICEMAP), "cuMemHostAlloc"))
		goto out;
	g.desc = p;
	if (!cu_ok(kv_cu.cuMemHostGetDevicePointer(&g.desc_dev, p, 0), "device pointer"))
		goto out;
	g.bsrc = calloc(g.n, sizeof(*g.bsrc));
	g.bdst = calloc(g.n, sizeof(*g.bdst));
	g.bsize = calloc(g.n, sizeof(*g.bsize));
	if (!g.bsrc || !g.bdst || !g.bsize)
		goto out;
	for (g.h2d = 0; g.h2d < 2; g.h2d++) {
		const char *dir = g.h2d ? "host -> device (scatter)" : "device -> host (gather)";
		double base = rate(per_block, &g, total);
		char name[96];

		printf("  %s\n", dir);
		row("one cuMemcpyAsync per block", base, 0);
		if (kv_cu.cuMemcpyBatchAsync)
			row("one cuMemcpyBatchAsync", rate(batch_api, &g, total), base);
		snprintf(name, sizeof(name), "%s kernel, host memory mapped",
			 g.h2d ? "scatter" : "gather");
		row(name, rate(kernel_direct, &g, total), base);
		snprintf(name, sizeof(name), "%s kernel + one %s copy via device staging",
			 g.h2d ? "scatter" : "gather", g.h2d ? "H2D" : "D2H");
		row(name, rate(kernel_staged, &g, total), base);
	}
	printf("  (percentages: of one cuMemcpyAsync per block)\n");
out:
	free(g.bsrc);
	free(g.bdst);
	free(g.bsize);
	if (g.desc)
		kv_cu.cuMemFreeHost(g.desc);
	if (g.hstage)
		kv_cu.cuMemFreeHost(g.hstage);
	if (g.dstage)
		kv_cu.cuMemFree(g.dstage);
	if (g.blocks)
		kv_cu.cuMemFree(g.blocks);
	if (g.s)
		kv_cu.cuStreamDestroy(g.s);
	kv_cuda_kernels_unload(g.k);
	kv_cu.cuCtxSetCurrent(NULL);
	kv_cu.cuDevicePrimaryCtxRelease(dev);
}

static int attr(CUdevice dev, CUdevice_attribute a)
{
	int v = -1;

	return kv_cu.cuDeviceGetAttribute(&v, a, dev) == CUDA_SUCCESS ? v : -1;
}

/* (h0): what the cuda backend and the client rely on, per device. */
static void probe(int n)
{
	printf("(h0) the driver and devices: driver %d.%d, cuMemcpyBatchAsync %s\n",
	       kv_cu.driver_version / 1000, kv_cu.driver_version % 1000 / 10,
	       kv_cu.cuMemcpyBatchAsync ? "yes" : "no");
	for (int i = 0; i < n; i++) {
		CUmemAllocationProp prop;
		size_t gmin = 0, grec = 0, total = 0;
		char name[128] = "", uuid[KV_CU_UUID_STR] = "?";
		CUuuid u;
		CUdevice dev;

		if (kv_cu.cuDeviceGet(&dev, i) != CUDA_SUCCESS)
			continue;
		kv_cu.cuDeviceGetName(name, sizeof(name), dev);
		if (kv_cu.cuDeviceGetUuid(&u, dev) == CUDA_SUCCESS)
			kv_cu_uuid_str((const unsigned char *)u.bytes, uuid);
		kv_cu.cuDeviceTotalMem(&total, dev);
		memset(&prop, 0, sizeof(prop));
		prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
		prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		prop.location.id = i;
		prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
		kv_cu.cuMemGetAllocationGranularity(&gmin, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
		kv_cu.cuMemGetAllocationGranularity(&grec, &prop,
						    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
		printf("  device %d: %s, %s, sm_%d%d, %zu MiB\n", i, name, uuid,
		       attr(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
		       attr(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR), total >> 20);
		printf("    VMM %d, POSIX fd export %d, unified addressing %d, host pointer for "
		       "registered memory %d, GPUDirect RDMA %d\n",
		       attr(dev, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED),
		       attr(dev, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED),
		       attr(dev, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING),
		       attr(dev, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM),
		       attr(dev, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED));
		printf("    VMM granularity %zu KiB minimum, %zu KiB recommended; %d copy "
		       "engines; PCI %04x:%02x:%02x\n", gmin >> 10, grec >> 10,
		       attr(dev, CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT),
		       attr(dev, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
		       attr(dev, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
		       attr(dev, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID));
	}
}

void kvbench_gpu(bool quick)
{
	char name[128] = "";
	int n = 0, r;
	pid_t pid;
	CUdevice dev;

	dur = quick ? 0.3 : 1.5;
	printf("\n(h) GPU data paths (in this process, no daemon)\n");
	/* Probe in a child: the first-touch measurement forks an exporter and
	 * must do so before this process loads CUDA. */
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		if (kv_cu_load() < 0) {
			printf("  skipped: no GPU (%s)\n", kv_cu_error());
			fflush(stdout);
			_exit(77);
		}
		if (kv_cu.cuDeviceGetCount(&n) != CUDA_SUCCESS || n == 0) {
			printf("  skipped: no GPU (no CUDA device visible)\n");
			fflush(stdout);
			_exit(77);
		}
		probe(n);
		fflush(stdout);
		_exit(0);
	}
	fflush(stdout);
	if (pid < 0 || waitpid(pid, &r, 0) != pid || !WIFEXITED(r) || WEXITSTATUS(r) != 0)
		return;
	first_touch(quick);
	if (kv_cu_load() < 0 || kv_cu.cuDeviceGet(&dev, 0) != CUDA_SUCCESS)
		return;
	kv_cu.cuDeviceGetName(name, sizeof(name), dev);
	printf("  device 0: %s, driver %d.%d\n", name, kv_cu.driver_version / 1000,
	       kv_cu.driver_version % 1000 / 10);
	tiers(quick);
	gather(quick);
}

#endif
