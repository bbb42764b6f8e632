/* The cuda backend: segments are CUDA VMM allocations shared as file
 * descriptors. One file of about 1,100 lines: segments, copies and the
 * completion thread all work on struct cuda_dev under one lock and one
 * context discipline (use_ctx), which a split would have to expose; the
 * compressing copies, which need neither, are in backend_cuda_quant.c.
 *
 * Per device (an entry of the device list, a CUDA ordinal):
 * - the primary context, retained for the backend's life (the context the
 *   CUDA runtime and engines such as PyTorch use too);
 * - segments: cuMemCreate physical allocations of segment_bytes with a
 *   POSIX-fd handle type, all created up front (no client request ever pays
 *   for cuMemCreate), exported once with cuMemExportToShareableHandle; the
 *   fd is what clients receive over the socket and import;
 * - one virtual range of its own, segments mapped back to back, so that a
 *   device offset is base + offset for copies;
 * - two streams: copy_async batches run in order on one (the copy engines),
 *   copy() (copy-on-write, synchronous) on the other so that a CoW does not
 *   wait behind a long demotion;
 * - the FP8 kernels (kernels_cuda.h), for compressing copies: a D2H or H2D
 *   copy with a format is a kernel launch on the copy stream, not a memcpy
 *   (backend_cuda_quant.h); quant is 0 if a device cannot load them;
 * - a completion thread: each batch ends with an event (blocking-sync, so
 *   the thread sleeps in the driver rather than spinning); the thread waits
 *   for the events in order, moves (tag, result) to the done list and
 *   writes completion_fd. Why a thread and not cuLaunchHostFunc: a host
 *   function is not called at all once the context has an error, so a
 *   failed copy would never complete; cuEventSynchronize returns the error,
 *   which becomes the batch's result (-EIO).
 *
 * The G2 arena (host_alloc) is anonymous memory registered with
 * cuMemHostRegister (portable, device-mapped), not cuMemHostAlloc: both are
 * pinned, but cuMemHostAlloc memory is a mapping of the NVIDIA device file,
 * which io_uring refuses as fixed buffers, and the arena is what G3 I/O
 * registers.
 *
 * A recreated segment (segment_create on one that exists: it changes
 * namespace) gets a new allocation and a new fd; the old allocation lives on
 * in the driver until the last client mapping of it goes, so until clients
 * of the previous namespace have remapped or disconnected the device holds
 * both. If the new allocation cannot be made even after releasing the old
 * one, the segment is left without memory and its epoch bumped; segment_fd
 * and copies try to allocate it again (and fail with -ENOMEM meanwhile).
 *
 * A sticky error (kv_cu_sticky: an illegal address, an uncorrectable ECC
 * error) leaves the device's context unusable for good, and with it every
 * copy and segment: the backend logs it and ends the process with status
 * KV_EXIT_DEVICE_LOST, so that the service manager starts a new daemon (what
 * G2 and G3 hold survives as after a kill -9: the journal's warm restart).
 *
 * Copies name host memory by the address the device sees:
 * cuMemHostGetDevicePointer of the arena, which equals the host address
 * wherever CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM is 1 (every 64-bit Linux
 * device so far) and is translated where it is not.
 *
 * Threads: everything but the completion threads runs on the daemon's loop
 * thread. The lock protects the pending queues and the done list. The
 * completion threads and the driver's own threads start with every signal
 * blocked (see signals_off), so the daemon's signalfd gets them all. */
#include "backend.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvconfig.h"

#if KV_HAVE_CUDA

#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend_cuda_quant.h"
#include "cudrv.h"
#include "kernels_cuda.h"
#include "kverr.h"
#include "fault.h"
#include "log.h"

/* What a device short of free memory keeps free beside its segments (streams,
 * events, the driver's own needs). */
#define KV_CUDA_SPARE (256ull << 20)

struct cuda_seg {
	CUmemGenericAllocationHandle h;  /* 0: no memory (a recreate failed) */
	int fd;
	int mapped;
};

/* A batch in flight: its event, and its result if enqueueing failed part
 * way (the event still marks the end of what was enqueued). */
struct pending {
	struct pending *next;
	CUevent ev;
	uint64_t tag;
	int res;
	int fault;                     /* the 'device' fault point: a sticky error */
	struct kv_cudaq_descs qd;      /* its quantizing copies' descriptors */
};

struct cuda_dev {
	struct cuda_backend *cb;
	int ordinal;
	CUdevice dev;
	CUcontext ctx;                 /* retained primary context, NULL if not */
	CUstream copy_stream, sync_stream;
	struct kv_cuda_kernels *kern;  /* the quantizers; NULL: not loaded */
	CUdeviceptr base;              /* 0 until reserved */
	uint64_t reserved;
	struct cuda_seg *segs;
	pthread_t thread;
	int thread_started, cond_ok;
	pthread_cond_t cond;
	struct pending *head, *tail;   /* in flight, in stream order */
	struct pending *spare;         /* finished, events kept for reuse */
};

struct host_region {
	void *p;
	uint64_t bytes;
	CUdeviceptr dp;                /* the device's address of p */
};

struct cuda_backend {
	struct kv_backend be;
	struct cuda_dev dev[KV_MAX_DEVICES];
	pthread_mutex_t lock;
	int stop;
	struct kv_copy_done *done;     /* finished, not yet reaped (lock) */
	size_t ndone, done_cap;
	size_t inflight;               /* batches queued (lock) */
	struct host_region *host;      /* loop thread only */
	size_t nhost, host_cap;
	CUdeviceptr *bsrc, *bdst;      /* scratch for cuMemcpyBatchAsync */
	size_t *bsize, bcap;
	struct kv_cudaq_copy *bq;      /* scratch: the quantizing copies */
	int batch_off;                 /* cuMemcpyBatchAsync failed once: per-copy */
};


static CUresult use_ctx(struct cuda_dev *d)
{
	return kv_cu.cuCtxSetCurrent(d->ctx);
}

/* Ends the process on a sticky error r of device d (see the top). */
static void check_lost(const struct cuda_dev *d, CUresult r, const char *what)
{
	if (!kv_cu_sticky(r))
		return;
	kv_err("cuda: device %d: %s: %s: the device's context is lost for good; exiting "
	       "(status %d) so that the service manager starts kvcached again",
	       d->ordinal, what, kv_cu_name(r), KV_EXIT_DEVICE_LOST);
	_exit(KV_EXIT_DEVICE_LOST);
}

/* ---- completions -------------------------------------------------------- */

static void push_done(struct cuda_backend *cb, uint64_t tag, int res)
{
	uint64_t one = 1;

	/* Room was reserved by copy_async (inflight). */
	cb->done[cb->ndone++] = (struct kv_copy_done){ .tag = tag, .res = res };
	if (cb->ndone == 1 && write(cb->be.completion_fd, &one, sizeof(one)) < 0)
		kv_warn("cuda: completion eventfd: %s", strerror(errno));
}

static void *completion_thread(void *arg)
{
	struct cuda_dev *d = arg;
	struct cuda_backend *cb = d->cb;

	use_ctx(d);
	pthread_mutex_lock(&cb->lock);
	for (;;) {
		struct pending *p;
		CUresult r;

		while (!d->head && !cb->stop)
			pthread_cond_wait(&d->cond, &cb->lock);
		if (!d->head)
			break;
		p = d->head;
		pthread_mutex_unlock(&cb->lock);
		r = kv_cu.cuEventSynchronize(p->ev);
		if (p->fault && r == CUDA_SUCCESS)
			r = CUDA_ERROR_ILLEGAL_ADDRESS;
		check_lost(d, r, "a copy batch");
		if (r != CUDA_SUCCESS)
			kv_err("cuda: device %d: copy batch %llu failed: %s", d->ordinal,
			       (unsigned long long)p->tag, kv_cu_name(r));
		pthread_mutex_lock(&cb->lock);
		d->head = p->next;
		if (!d->head)
			d->tail = NULL;
		cb->inflight--;
		push_done(cb, p->tag, p->res ? p->res : r != CUDA_SUCCESS ? -EIO : 0);
		p->next = d->spare;
		d->spare = p;
	}
	pthread_mutex_unlock(&cb->lock);
	return NULL;
}

/* ---- segments ----------------------------------------------------------- */

static void seg_drop(struct cuda_backend *cb, struct cuda_dev *d, uint32_t idx)
{
	struct cuda_seg *s = &d->segs[idx];
	uint64_t sb = cb->be.segment_bytes;

	if (s->mapped)
		kv_cu.cuMemUnmap(d->base + idx * sb, sb);
	if (s->h)
		kv_cu.cuMemRelease(s->h);
	if (s->fd >= 0)
		close(s->fd);
	s->h = 0;
	s->fd = -1;
	s->mapped = 0;
}

static CUmemAllocationProp seg_prop(const struct cuda_dev *d)
{
	CUmemAllocationProp prop;

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = d->ordinal;
	return prop;
}

/* Maps handle h as segment idx, zeroes it and fills in the segment. The
 * slot must be empty (unmapped). Consumes h and fd on failure. */
static CUresult seg_install(struct cuda_backend *cb, struct cuda_dev *d, uint32_t idx,
			    CUmemGenericAllocationHandle h, int fd)
{
	uint64_t sb = cb->be.segment_bytes;
	CUdeviceptr at = d->base + idx * sb;
	CUmemAccessDesc acc;
	CUresult r;

	memset(&acc, 0, sizeof(acc));
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = d->ordinal;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	r = kv_cu.cuMemMap(at, sb, 0, h, 0);
	if (r != CUDA_SUCCESS)
		goto err;
	if ((r = kv_cu.cuMemSetAccess(at, sb, &acc, 1)) != CUDA_SUCCESS ||
	    /* New memory may hold what another tenant (or process) left there. */
	    (r = kv_cu.cuMemsetD8Async(at, 0, sb, d->sync_stream)) != CUDA_SUCCESS ||
	    (r = kv_cu.cuStreamSynchronize(d->sync_stream)) != CUDA_SUCCESS) {
		kv_cu.cuMemUnmap(at, sb);
		goto err;
	}
	d->segs[idx] = (struct cuda_seg){ .h = h, .fd = fd, .mapped = 1 };
	return CUDA_SUCCESS;
err:
	kv_cu.cuMemRelease(h);
	close(fd);
	return r;
}

/* A new exported allocation in *h, *fd. */
static CUresult seg_new(struct cuda_backend *cb, struct cuda_dev *d,
			CUmemGenericAllocationHandle *h, int *fd)
{
	CUmemAllocationProp prop = seg_prop(d);
	CUresult r;

	*fd = -1;
	r = kv_cu.cuMemCreate(h, cb->be.segment_bytes, &prop, 0);
	if (r != CUDA_SUCCESS)
		return r;
	r = kv_cu.cuMemExportToShareableHandle(fd, *h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	if (r != CUDA_SUCCESS) {
		kv_cu.cuMemRelease(*h);
		*fd = -1;
	}
	return r;
}

/* (Re)creates segment idx of d with fresh, zeroed memory. */
static int seg_create(struct cuda_backend *cb, struct cuda_dev *d, uint32_t idx)
{
	struct cuda_seg *s = &d->segs[idx];
	CUmemGenericAllocationHandle h;
	CUresult r;
	int fd;

	if ((r = use_ctx(d)) != CUDA_SUCCESS)
		return kv_cu_errno(r);
	r = seg_new(cb, d, &h, &fd);
	if (r == CUDA_ERROR_OUT_OF_MEMORY && s->h) {
		/* No room for both: give the old memory back first. */
		kv_cu.cuStreamSynchronize(d->copy_stream);
		seg_drop(cb, d, idx);
		cb->be.epoch[d - cb->dev][idx]++;
		r = seg_new(cb, d, &h, &fd);
	}
	if (r != CUDA_SUCCESS) {
		kv_err("cuda: device %d: segment %u: cuMemCreate/export: %s", d->ordinal, idx,
		       kv_cu_name(r));
		return kv_cu_errno(r);
	}
	if (s->h) {
		/* Copies still queued may touch the old memory. */
		kv_cu.cuStreamSynchronize(d->copy_stream);
		seg_drop(cb, d, idx);
	}
	r = seg_install(cb, d, idx, h, fd);
	cb->be.epoch[d - cb->dev][idx]++;
	if (r != CUDA_SUCCESS) {
		kv_err("cuda: device %d: segment %u: map: %s", d->ordinal, idx, kv_cu_name(r));
		return kv_cu_errno(r);
	}
	return 0;
}

/* The segment has memory, allocating it again if a recreate left it
 * without. Returns 0 or -errno. */
static int seg_ready(struct cuda_backend *cb, struct cuda_dev *d, uint32_t idx)
{
	return d->segs[idx].h ? 0 : seg_create(cb, d, idx);
}

static struct cuda_dev *get_dev(struct cuda_backend *cb, uint32_t dev)
{
	return dev < cb->be.devices ? &cb->dev[dev] : NULL;
}

/* The daemon's address of [off, off + len) of d, which must lie in one
 * segment with memory; 0 otherwise. */
static CUdeviceptr dev_addr(struct cuda_backend *cb, struct cuda_dev *d, uint64_t off,
			    uint64_t len)
{
	uint64_t sb = cb->be.segment_bytes, s = off / sb, o = off % sb;

	if (s >= cb->be.segments[d - cb->dev] || len > sb - o || seg_ready(cb, d, (uint32_t)s))
		return 0;
	return d->base + off;
}

static int cuda_segment_create(struct kv_backend *be, uint32_t dev, uint32_t idx)
{
	struct cuda_backend *cb = (struct cuda_backend *)be;
	struct cuda_dev *d = get_dev(cb, dev);

	if (!d || idx >= be->segments[dev])
		return -EINVAL;
	return seg_create(cb, d, idx);
}

static int cuda_segment_fd(struct kv_backend *be, uint32_t dev, uint32_t idx)
{
	struct cuda_backend *cb = (struct cuda_backend *)be;
	struct cuda_dev *d = get_dev(cb, dev);
	int r;

	if (!d || idx >= be->segments[dev])
		return -EINVAL;
	r = seg_ready(cb, d, idx);
	return r < 0 ? r : d->segs[idx].fd;
}

/* ---- copies ------------------------------------------------------------- */

static int cuda_copy(struct kv_backend *be, uint32_t dev, uint64_t dst, uint64_t src,
		     uint64_t len)
{
	struct cuda_backend *cb = (struct cuda_backend *)be;
	struct cuda_dev *d = get_dev(cb, dev);
	CUdeviceptr a, b;
	CUresult r;

	if (!d || !(a = dev_addr(cb, d, dst, len)) || !(b = dev_addr(cb, d, src, len)))
		return -EINVAL;
	if ((r = use_ctx(d)) != CUDA_SUCCESS ||
	    (r = kv_cu.cuMemcpyDtoDAsync(a, b, len, d->sync_stream)) != CUDA_SUCCESS ||
	    (r = kv_cu.cuStreamSynchronize(d->sync_stream)) != CUDA_SUCCESS) {
		check_lost(d, r, "a copy");
		kv_err("cuda: device %d: copy of %llu bytes: %s", d->ordinal,
		       (unsigned long long)len, kv_cu_name(r));
		return kv_cu_errno(r);
	}
	return 0;
}

static void *cuda_host_alloc(struct kv_backend *be, uint64_t bytes)
{
	struct cuda_backend *cb = (struct cuda_backend *)be;
	CUdeviceptr dp;
	void *p;
	CUresult r;

	if (!bytes)
		return NULL;
	if (cb->nhost == cb->host_cap) {
		size_t cap = cb->host_cap ? 2 * cb->host_cap : 8;
		void *q = realloc(cb->host, cap * sizeof(*cb->host));

		if (!q)
			return NULL;
		cb->host = q;
		cb->host_cap = cap;
	}
	p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	if ((r = use_ctx(&cb->dev[0])) != CUDA_SUCCESS ||
	    (r = kv_cu.cuMemHostRegister(p, bytes, CU_MEMHOSTREGISTER_PORTABLE |
						       CU_MEMHOSTREGISTER_DEVICEMAP)) !=
		    CUDA_SUCCESS) {
		kv_err("cuda: pinning %llu MiB of host memory: %s (RLIMIT_MEMLOCK?)",
		       (unsigned long long)(bytes >> 20), kv_cu_name(r));
		munmap(p, bytes);
		return NULL;
	}
	if ((r = kv_cu.cuMemHostGetDevicePointer(&dp, p, 0)) != CUDA_SUCCESS) {
		kv_err("cuda: the device address of pinned host memory: %s", kv_cu_name(r));
		kv_cu.cuMemHostUnregister(p);
		munmap(p, bytes);
		return NULL;
	}
	if (dp != (CUdeviceptr)(uintptr_t)p)
		kv_info("cuda: the devices see the host arena at another address (%#llx for %p): "
			"copies translate", (unsigned long long)dp, p);
	cb->host[cb->nhost++] = (struct host_region){ .p = p, .bytes = bytes, .dp = dp };
	return p;
}

static void cuda_host_free(struct kv_backend *be, void *p, uint64_t bytes)
{
	struct cuda_backend *cb = (struct cuda_backend *)be;
	size_t i;

	if (!p)
		return;
	for (i = 0; i < cb->nhost && cb->host[i].p != p; i++)
		;
	if (i < cb->nhost)
		cb->host[i] = cb->host[--cb->nhost];
	use_ctx(&cb->dev[0]);
	kv_cu.cuMemHostUnregister(p);
	munmap(p, bytes);
}

/* The device's address of [p, p + len), which must lie in one host_alloc
 * region; 0 if it does not. */
static CUdeviceptr host_addr(const struct cuda_backend *cb, const void *p, uint64_t len)
{
	uintptr_t a = (uintptr_t)p;
	size_t i;

	for (i = 0; i < cb->nhost; i++) {
		uintptr_t lo = (uintptr_t)cb->host[i].p;

		if (a >= lo && a - lo <= cb->host[i].bytes && len <= cb->host[i].bytes - (a - lo))
			return cb->host[i].dp + (a - lo);
	}
	return 0;
}

static int batch_room(struct cuda_backend *cb, uint32_t n)
{
	if (n <= cb->bcap)
		return 0;
	free(cb->bsrc);
	free(cb->bdst);
	free(cb->bsize);
	free(cb->bq);
	cb->bsrc = malloc(n * sizeof(*cb->bsrc));
	cb->bdst = malloc(n * sizeof(*cb->bdst));
	cb->bsize = malloc(n * sizeof(*cb->bsize));
	cb->bq = malloc(n * sizeof(*cb->bq));
	cb->bcap = cb->bsrc && cb->bdst && cb->bsize && cb->bq ? n : 0;
	return cb->bcap ? 0 : -ENOMEM;
}

/* Enqueues the copies cb->b* [0, n). Returns how many were enqueued and the
 * first failure in *r. */
static uint32_t enqueue(struct cuda_backend *cb, struct cuda_dev *d, uint32_t n, CUresult *r)
{
	uint32_t i;

	*r = CUDA_SUCCESS;
	if (n > 1 && kv_cu.cuMemcpyBatchAsync && !cb->batch_off) {
		CUmemcpyAttributes attr;
		size_t idx = 0;

		memset(&attr, 0, sizeof(attr));
		attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
		*r = kv_cu.cuMemcpyBatchAsync(cb->bdst, cb->bsrc, cb->bsize, n, &attr, &idx, 1,
					      d->copy_stream);
		if (*r == CUDA_SUCCESS)
			return n;
		/* A driver that has the entry point but not for these pointers:
		 * nothing was enqueued (the call validates first); go per copy. */
		kv_warn("cuda: cuMemcpyBatchAsync: %s; using one cuMemcpyAsync per copy",
			kv_cu_name(*r));
		cb->batch_off = 1;
	}
	for (i = 0; i < n; i++) {
		*r = kv_cu.cuMemcpyAsync(cb->bdst[i], cb->bsrc[i], cb->bsize[i], d->copy_stream);
		if (*r != CUDA_SUCCESS)
			break;
	}
	return i;
}

static int cuda_copy_async(struct kv_backend *be, uint32_t dev, enum kv_copy_dir dir,
			   const struct kv_copy *c, uint32_t n, uint64_t tag)
{
	struct cuda_backend *cb = (struct cuda_backend *)be;
	struct cuda_dev *d = get_dev(cb, dev);
	struct pending *p;
	uint32_t i, m = 0, nr = 0, nq = 0, started, qstarted = 0;
	int res = 0, qres = 0;
	CUresult r;

	if (!d || (n && !c))
		return -EINVAL;
	if (batch_room(cb, n) < 0)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		/* A quantized copy's host side is the slot's compressed bytes. */
		uint64_t hlen = c[i].qfmt ? kv_quant_bytes(c[i].len / 2, KV_QUANT_GROUP) : c[i].len;
		CUdeviceptr a = dev_addr(cb, d, c[i].dev_off, c[i].len), h = 0, s = 0;

		if (!kv_copy_qvalid(dir, &c[i]) || (c[i].qfmt && !d->kern))
			return -EINVAL;
		if (!a || (dir != KV_COPY_D2D && !(h = host_addr(cb, c[i].host, hlen))) ||
		    (dir == KV_COPY_D2D && !(s = dev_addr(cb, d, c[i].src_off, c[i].len))))
			return -EINVAL;
		if (c[i].qfmt && (a % 2 || h % 4))  /* backend_cuda_quant.h, alignment */
			return -EINVAL;
		cb->bdst[i] = dir == KV_COPY_D2H ? h : a;
		cb->bsrc[i] = dir == KV_COPY_D2H ? a : dir == KV_COPY_H2D ? h : s;
		cb->bsize[i] = c[i].len;
		cb->bq[i] = (struct kv_cudaq_copy){ .dev = a, .host = h, .len = c[i].len,
						    .qfmt = c[i].qfmt, .qdtype = c[i].qdtype };
	}
	/* The fault point fails the copy it hits and the batch with it, after
	 * the copies before it (as on the host backend). A copy is not short:
	 * "short" fails it with EIO too. */
	for (m = 0; m < n && !(res = kv_fault(KV_FAULT_COPY)); m++)
		;
	if (res == KV_FAULT_SHORT)
		res = -EIO;
	/* Copies [0, m): raw ones to cb->b* [0, nr), quantizing ones (kernel
	 * launches) to cb->bq [0, nq); in place, as nr, nq <= i. */
	for (i = 0; i < m; i++) {
		if (cb->bq[i].qfmt) {
			cb->bq[nq++] = cb->bq[i];
		} else {
			cb->bdst[nr] = cb->bdst[i];
			cb->bsrc[nr] = cb->bsrc[i];
			cb->bsize[nr++] = cb->bsize[i];
		}
	}
	pthread_mutex_lock(&cb->lock);
	if (cb->done_cap < cb->ndone + cb->inflight + 1) {
		size_t cap = 2 * (cb->ndone + cb->inflight + 1);
		void *q = realloc(cb->done, cap * sizeof(*cb->done));

		if (!q) {
			pthread_mutex_unlock(&cb->lock);
			return -ENOMEM;
		}
		cb->done = q;
		cb->done_cap = cap;
	}
	p = d->spare;
	if (p)
		d->spare = p->next;
	pthread_mutex_unlock(&cb->lock);
	if ((r = use_ctx(d)) != CUDA_SUCCESS)
		goto fail_nothing;
	if (!p) {
		p = calloc(1, sizeof(*p));
		if (!p)
			return -ENOMEM;
		r = kv_cu.cuEventCreate(&p->ev, CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING);
		if (r != CUDA_SUCCESS) {
			free(p);
			p = NULL;
			goto fail_nothing;
		}
	}
	started = enqueue(cb, d, nr, &r);
	check_lost(d, r, "enqueueing copies");
	if (r == CUDA_SUCCESS && nq) {
		qres = kv_cudaq_launch(&p->qd, d->kern, dir, cb->bq, nq, d->copy_stream, &qstarted);
		started += qstarted;
		if (qres < 0) {
			check_lost(d, kv_cu.cuStreamQuery(d->copy_stream), "a quantizing copy");
			kv_err("cuda: device %d: %s of %u blocks: %s", d->ordinal,
			       dir == KV_COPY_D2H ? "quantizing" : "dequantizing", nq, strerror(-qres));
			if (!started)
				goto fail_nothing;  /* r is CUDA_SUCCESS: qres is returned */
			res = qres;
		}
	}
	if (r != CUDA_SUCCESS) {
		kv_err("cuda: device %d: enqueueing copy %u of %u: %s", d->ordinal, started, n,
		       kv_cu_name(r));
		if (!started)
			goto fail_nothing;
		res = kv_cu_errno(r);
	}
	p->tag = tag;
	p->res = res;
	p->fault = kv_fault(KV_FAULT_DEVICE) != 0;
	p->next = NULL;
	r = kv_cu.cuEventRecord(p->ev, d->copy_stream);
	pthread_mutex_lock(&cb->lock);
	if (r != CUDA_SUCCESS) {
		/* No event to wait for: wait here, report at once. */
		pthread_mutex_unlock(&cb->lock);
		kv_cu.cuStreamSynchronize(d->copy_stream);
		pthread_mutex_lock(&cb->lock);
		push_done(cb, tag, res ? res : kv_cu_errno(r));
		p->next = d->spare;
		d->spare = p;
	} else {
		if (d->tail)
			d->tail->next = p;
		else
			d->head = p;
		d->tail = p;
		cb->inflight++;
		pthread_cond_signal(&d->cond);
	}
	pthread_mutex_unlock(&cb->lock);
	return 0;
fail_nothing:
	if (p) {
		pthread_mutex_lock(&cb->lock);
		p->next = d->spare;
		d->spare = p;
		pthread_mutex_unlock(&cb->lock);
	}
	return r != CUDA_SUCCESS ? kv_cu_errno(r) : qres;
}

static int cuda_reap(struct kv_backend *be, struct kv_copy_done *done, int max)
{
	struct cuda_backend *cb = (struct cuda_backend *)be;
	uint64_t v;
	int n = 0;

	pthread_mutex_lock(&cb->lock);
	while (n < max && cb->ndone)
		done[n++] = cb->done[--cb->ndone];
	/* Under the lock: a completion thread writes the fd under it too, so
	 * readiness always matches a non-empty list. */
	if (!cb->ndone && read(be->completion_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		kv_warn("cuda: completion eventfd: %s", strerror(errno));
	pthread_mutex_unlock(&cb->lock);
	return n;
}

/* ---- life --------------------------------------------------------------- */

static void dev_fini(struct cuda_backend *cb, struct cuda_dev *d, uint32_t nseg)
{
	struct pending *p;
	uint32_t i;

	if (!d->ctx) {
		if (d->cond_ok)
			pthread_cond_destroy(&d->cond);
		return;
	}
	use_ctx(d);
	if (d->copy_stream)
		kv_cu.cuStreamSynchronize(d->copy_stream);
	if (d->thread_started) {
		pthread_mutex_lock(&cb->lock);
		cb->stop = 1;
		pthread_cond_broadcast(&d->cond);
		pthread_mutex_unlock(&cb->lock);
		pthread_join(d->thread, NULL);
	}
	if (d->cond_ok)
		pthread_cond_destroy(&d->cond);
	while ((p = d->spare)) {
		d->spare = p->next;
		kv_cu.cuEventDestroy(p->ev);
		kv_cudaq_descs_free(&p->qd);
		free(p);
	}
	kv_cuda_kernels_unload(d->kern);
	d->kern = NULL;
	for (i = 0; d->segs && i < nseg; i++)
		seg_drop(cb, d, i);
	free(d->segs);
	if (d->base)
		kv_cu.cuMemAddressFree(d->base, d->reserved);
	if (d->copy_stream)
		kv_cu.cuStreamDestroy(d->copy_stream);
	if (d->sync_stream)
		kv_cu.cuStreamDestroy(d->sync_stream);
	kv_cu.cuCtxSetCurrent(NULL);
	kv_cu.cuDevicePrimaryCtxRelease(d->dev);
	d->ctx = NULL;
}

static void cuda_destroy(struct kv_backend *be)
{
	struct cuda_backend *cb = (struct cuda_backend *)be;
	uint32_t i;

	/* The host arena is unregistered while the context that registered it
	 * is alive, after every copy that could touch it has finished. */
	for (i = 0; i < KV_MAX_DEVICES; i++)
		if (cb->dev[i].ctx && cb->dev[i].copy_stream && use_ctx(&cb->dev[i]) == CUDA_SUCCESS)
			kv_cu.cuStreamSynchronize(cb->dev[i].copy_stream);
	if (cb->nhost)
		use_ctx(&cb->dev[0]);
	for (i = 0; i < cb->nhost; i++) {
		kv_cu.cuMemHostUnregister(cb->host[i].p);
		munmap(cb->host[i].p, cb->host[i].bytes);
	}
	for (i = 0; i < KV_MAX_DEVICES; i++)
		dev_fini(cb, &cb->dev[i], be->segments[i]);
	for (i = 0; i < KV_MAX_DEVICES; i++)
		free(be->epoch[i]);
	free(cb->host);
	free(cb->done);
	free(cb->bsrc);
	free(cb->bdst);
	free(cb->bsize);
	free(cb->bq);
	if (be->completion_fd >= 0)
		close(be->completion_fd);
	pthread_mutex_destroy(&cb->lock);
	free(cb);
}

static const struct kv_backend_ops cuda_ops = {
	.segment_create = cuda_segment_create,
	.segment_fd = cuda_segment_fd,
	.copy = cuda_copy,
	.host_alloc = cuda_host_alloc,
	.host_free = cuda_host_free,
	.copy_async = cuda_copy_async,
	.reap = cuda_reap,
	.destroy = cuda_destroy,
};

#define CU_TRY(call, what)                                                             \
	do {                                                                           \
		CUresult r_ = (call);                                                  \
		if (r_ != CUDA_SUCCESS) {                                              \
			kv_errf(err, errlen, "CUDA device %d: %s: %s", d->ordinal, what, \
				kv_cu_name(r_));                                       \
			return kv_cu_errno(r_);                                        \
		}                                                                      \
	} while (0)

/* Opens device i of the backend: context, checks, streams, reservation,
 * segments, completion thread. Returns 0 or -errno (err set); dev_fini
 * undoes whatever was done. */
static int dev_init(struct cuda_backend *cb, struct cuda_dev *d, uint32_t i, int ordinal,
		    uint64_t bytes_per_dev, char *err, unsigned errlen)
{
	uint64_t sb = cb->be.segment_bytes, gmin = 0, grec = 0, nseg;
	size_t free_b = 0, total_b = 0, g;
	CUmemAllocationProp prop;
	char name[96] = "", uuid[KV_CU_UUID_STR];
	int vmm = 0, fdh = 0, uva = 0;
	uint32_t s;

	d->cb = cb;
	d->ordinal = ordinal;
	if (pthread_cond_init(&d->cond, NULL) != 0) {
		kv_errf(err, errlen, "pthread_cond_init failed");
		return -ENOMEM;
	}
	d->cond_ok = 1;
	CU_TRY(kv_cu.cuDeviceGet(&d->dev, ordinal), "cuDeviceGet");
	CU_TRY(kv_cu.cuDevicePrimaryCtxRetain(&d->ctx, d->dev), "retaining its primary context");
	CU_TRY(use_ctx(d), "cuCtxSetCurrent");
	kv_cu.cuDeviceGetName(name, sizeof(name), d->dev);
	CU_TRY(kv_cu.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
					  d->dev), "cuDeviceGetAttribute");
	CU_TRY(kv_cu.cuDeviceGetAttribute(&fdh,
					  CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
					  d->dev), "cuDeviceGetAttribute");
	CU_TRY(kv_cu.cuDeviceGetAttribute(&uva, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, d->dev),
	       "cuDeviceGetAttribute");
	if (!vmm || !fdh || !uva) {
		kv_errf(err, errlen, "CUDA device %d (%s) lacks %s", ordinal, name,
			!vmm ? "virtual memory management" : !fdh ? "POSIX fd memory export"
								: "unified addressing");
		return -ENOTSUP;
	}
	prop = seg_prop(d);
	CU_TRY(kv_cu.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
	       "cuMemGetAllocationGranularity");
	gmin = g;
	CU_TRY(kv_cu.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
	       "cuMemGetAllocationGranularity");
	grec = g;
	if (!gmin || sb % gmin) {
		kv_errf(err, errlen, "the segment size (%llu KiB) must be a multiple of CUDA device "
			"%d's allocation granularity (%llu KiB)", (unsigned long long)(sb >> 10),
			ordinal, (unsigned long long)(gmin >> 10));
		return -EINVAL;
	}
	nseg = bytes_per_dev / sb;
	if (!nseg || nseg > UINT32_MAX) {
		kv_errf(err, errlen, "a pool of %llu bytes per device holds no segment of %llu",
			(unsigned long long)bytes_per_dev, (unsigned long long)sb);
		return -EINVAL;
	}
	CU_TRY(kv_cu.cuDeviceGetUuid((CUuuid *)cb->be.uuid[i], d->dev), "cuDeviceGetUuid");
	CU_TRY(kv_cu.cuMemGetInfo(&free_b, &total_b), "cuMemGetInfo");
	if (nseg * sb > free_b) {
		/* Memory a previous daemon exported lives on while workers
		 * still map it (until they reconnect and remap): start with
		 * what is free rather than fail, and so restart, in a loop. */
		if (free_b < sb) {
			kv_errf(err, errlen, "CUDA device %d (%s) has %llu MiB free of %llu, not "
				"one segment of %llu MiB", ordinal, name,
				(unsigned long long)(free_b >> 20), (unsigned long long)(total_b >> 20),
				(unsigned long long)(sb >> 20));
			return -ENOMEM;
		}
		kv_warn("cuda: CUDA device %d (%s) has %llu MiB free of %llu: its pool is %llu "
			"of %llu segments (%llu MiB); memory still mapped by workers of an "
			"earlier kvcached, or used by other processes, is not free", ordinal, name,
			(unsigned long long)(free_b >> 20), (unsigned long long)(total_b >> 20),
			(unsigned long long)((free_b - KV_CUDA_SPARE) / sb), (unsigned long long)nseg,
			(unsigned long long)((free_b - KV_CUDA_SPARE) / sb * sb >> 20));
		nseg = (free_b - (free_b / sb > 1 ? KV_CUDA_SPARE : 0)) / sb;
	}
	cb->be.segments[i] = (uint32_t)nseg;
	cb->be.epoch[i] = calloc(nseg, sizeof(uint32_t));
	d->segs = calloc(nseg, sizeof(*d->segs));
	if (!cb->be.epoch[i] || !d->segs) {
		kv_errf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (s = 0; s < nseg; s++)
		d->segs[s].fd = -1;
	CU_TRY(kv_cu.cuStreamCreate(&d->copy_stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
	CU_TRY(kv_cu.cuStreamCreate(&d->sync_stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
	d->reserved = nseg * sb;
	CU_TRY(kv_cu.cuMemAddressReserve(&d->base, d->reserved, grec > gmin && sb % grec == 0 ? grec
										       : gmin,
					 0, 0),
	       "reserving the daemon's address range");
	for (s = 0; s < nseg; s++) {
		CUmemGenericAllocationHandle h;
		int fd;

		CU_TRY(seg_new(cb, d, &h, &fd), "creating a segment");
		CU_TRY(seg_install(cb, d, s, h, fd), "mapping a segment");
		cb->be.epoch[i][s] = 1;
	}
	if (kv_cudaq_load(ordinal, &d->kern) < 0)
		cb->be.quant = 0;
	if (pthread_create(&d->thread, NULL, completion_thread, d) != 0) {
		kv_errf(err, errlen, "cannot start the completion thread");
		return -EAGAIN;
	}
	d->thread_started = 1;
	kv_cu_uuid_str(cb->be.uuid[i], uuid);
	kv_info("cuda: device %u = CUDA device %d (%s, %s): %llu segments of %llu MiB, "
		"granularity %llu KiB, %llu of %llu MiB free before", i, ordinal, name, uuid,
		(unsigned long long)nseg, (unsigned long long)(sb >> 20),
		(unsigned long long)(gmin >> 10), (unsigned long long)(free_b >> 20),
		(unsigned long long)(total_b >> 20));
	return 0;
}
#undef CU_TRY

static char last_err[256];

const char *kv_backend_cuda_error(void)
{
	return last_err;
}

/* Loads the driver (the daemon's first CUDA call: config's percentages, or
 * the backend) and counts the devices. An NVSwitch machine's driver says
 * CUDA_ERROR_SYSTEM_NOT_READY until its Fabric Manager is up: wait for it
 * for a minute (the unit's start timeout is 90 s), then fail, and the unit
 * restarts the daemon. */
static int device_count(char *err, unsigned errlen)
{
	int r, n = 0;
	CUresult cr;

	kv_cu_ready_wait_s = 60;
	r = kv_cu_load();

	if (r < 0) {
		kv_errf(err, errlen, "%s", kv_cu_error());
		return r;
	}
	cr = kv_cu.cuDeviceGetCount(&n);
	if (cr != CUDA_SUCCESS) {
		kv_errf(err, errlen, "cuDeviceGetCount: %s", kv_cu_name(cr));
		return kv_cu_errno(cr);
	}
	return n;
}

static int mem_info(int dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
	char *err = last_err;
	unsigned errlen = sizeof(last_err);
	size_t f = 0, t = 0;
	CUcontext ctx;
	CUdevice d;
	CUresult cr;
	int r = device_count(err, errlen);

	if (r < 0)
		return r;
	if (dev < 0 || dev >= r) {
		kv_errf(err, errlen, "no CUDA device %d (%d visible)", dev, r);
		return -ENODEV;
	}
	if ((cr = kv_cu.cuDeviceGet(&d, dev)) != CUDA_SUCCESS ||
	    (cr = kv_cu.cuDevicePrimaryCtxRetain(&ctx, d)) != CUDA_SUCCESS) {
		kv_errf(err, errlen, "CUDA device %d: %s", dev, kv_cu_name(cr));
		return kv_cu_errno(cr);
	}
	if ((cr = kv_cu.cuCtxPushCurrent(ctx)) == CUDA_SUCCESS) {
		cr = kv_cu.cuMemGetInfo(&f, &t);
		kv_cu.cuCtxPopCurrent(&ctx);
	}
	kv_cu.cuDevicePrimaryCtxRelease(d);
	if (cr != CUDA_SUCCESS) {
		kv_errf(err, errlen, "CUDA device %d: cuMemGetInfo: %s", dev, kv_cu_name(cr));
		return kv_cu_errno(cr);
	}
	*free_bytes = f;
	*total_bytes = t;
	return 0;
}

static int create(const int *devs, uint32_t ndev, uint64_t bytes_per_dev, uint64_t seg_bytes,
		  char *err, unsigned errlen, struct kv_backend **out)
{
	struct cuda_backend *cb;
	uint32_t i;
	int r, count;

	if (!seg_bytes || !bytes_per_dev) {
		kv_errf(err, errlen, "no pool or segment size");
		return -EINVAL;
	}
	count = device_count(err, errlen);
	if (count < 0)
		return count;
	if (count == 0) {
		kv_errf(err, errlen, "no CUDA device is visible");
		return -ENODEV;
	}
	if (!devs || !ndev)
		ndev = (uint32_t)(count < KV_MAX_DEVICES ? count : KV_MAX_DEVICES);
	if (ndev > KV_MAX_DEVICES) {
		kv_errf(err, errlen, "at most %d devices", KV_MAX_DEVICES);
		return -EINVAL;
	}
	for (i = 0; devs && i < ndev; i++) {
		uint32_t j;

		if (devs[i] < 0 || devs[i] >= count) {
			kv_errf(err, errlen, "no CUDA device %d (%d visible)", devs[i], count);
			return -ENODEV;
		}
		for (j = 0; j < i; j++)
			if (devs[j] == devs[i]) {
				kv_errf(err, errlen, "CUDA device %d listed twice", devs[i]);
				return -EINVAL;
			}
	}
	cb = calloc(1, sizeof(*cb));
	if (!cb) {
		kv_errf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	pthread_mutex_init(&cb->lock, NULL);
	cb->be.ops = &cuda_ops;
	cb->be.name = "cuda";
	cb->be.segment_bytes = seg_bytes;
	cb->be.has_uuid = 1;
	cb->be.quant = 1;  /* until a device cannot load its kernels */
	cb->be.completion_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (cb->be.completion_fd < 0) {
		r = -errno;
		kv_errf(err, errlen, "eventfd: %s", strerror(errno));
		cuda_destroy(&cb->be);
		return r;
	}
	for (i = 0; i < ndev; i++) {
		cb->be.devices = i + 1;
		r = dev_init(cb, &cb->dev[i], i, devs ? devs[i] : (int)i, bytes_per_dev, err, errlen);
		if (r < 0) {
			cuda_destroy(&cb->be);
			return r;
		}
	}
	use_ctx(&cb->dev[0]);
	*out = &cb->be;
	return 0;
}

/* The driver starts threads of its own (at cuInit, with each context), and
 * so does this backend; none of them may take the daemon's signals, which it
 * reads from a signalfd with them blocked, perhaps only after this runs.
 * Whatever may start threads runs with every signal blocked, and the threads
 * inherit that mask. */
static void signals_off(sigset_t *old)
{
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, old);
}

static void signals_on(const sigset_t *old)
{
	pthread_sigmask(SIG_SETMASK, old, NULL);
}

int kv_backend_cuda_device_count(void)
{
	sigset_t old;
	int r;

	signals_off(&old);
	r = device_count(last_err, sizeof(last_err));
	signals_on(&old);
	return r;
}

int kv_backend_cuda_mem_info(int dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
	sigset_t old;
	int r;

	signals_off(&old);
	r = mem_info(dev, free_bytes, total_bytes);
	signals_on(&old);
	return r;
}

int kv_backend_cuda_create(const int *devs, uint32_t ndev, uint64_t bytes_per_dev,
			   uint64_t seg_bytes, char *err, unsigned errlen, struct kv_backend **out)
{
	sigset_t old;
	int r;

	signals_off(&old);
	r = create(devs, ndev, bytes_per_dev, seg_bytes, err, errlen, out);
	signals_on(&old);
	return r;
}

#else /* !KV_HAVE_CUDA */

static void no_cuda(char *err, unsigned errlen)
{
	if (err && errlen)
		snprintf(err, errlen, "this kvcached was built without CUDA (meson -Dcuda=enabled, "
			 "with the CUDA toolkit installed)");
}

int kv_backend_cuda_create(const int *devs, uint32_t ndev, uint64_t bytes_per_dev,
			   uint64_t seg_bytes, char *err, unsigned errlen, struct kv_backend **out)
{
	(void)devs, (void)ndev, (void)bytes_per_dev, (void)seg_bytes, (void)out;
	no_cuda(err, errlen);
	return -ENOTSUP;
}

static char last_err[128];

const char *kv_backend_cuda_error(void)
{
	return last_err;
}

int kv_backend_cuda_mem_info(int dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
	(void)dev, (void)free_bytes, (void)total_bytes;
	no_cuda(last_err, sizeof(last_err));
	return -ENOTSUP;
}

int kv_backend_cuda_device_count(void)
{
	no_cuda(last_err, sizeof(last_err));
	return -ENOTSUP;
}

#endif
