/* CUDA mapping of segments, for a daemon on the cuda backend: map.c's
 * contracts (kvc_internal.h) with device memory instead of memfds.
 *
 * Per daemon device: one virtual range of device_bytes reserved with
 * cuMemAddressReserve the first time a segment of it arrives; segment s is
 * imported from its fd (cuMemImportFromShareableHandle), mapped whole at
 * base + offset(s) (cuMemMap) and made readable and writable
 * (cuMemSetAccess) for the worker's device, so kvc_block_ptr() returns a
 * device pointer. The imported handle is released at once: the mapping keeps
 * the allocation alive. A segment sent again (fresh memory after a change of
 * namespace) is unmapped and the new memory mapped at the same address.
 *
 * Which GPU a daemon device is: the one of this process whose UUID the
 * daemon sent in Hello (so CUDA_VISIBLE_DEVICES may differ between daemon and
 * worker); from a daemon that sent none, the ordinal the segment's allocation
 * names. Access is granted to that GPU always, whatever context is current
 * on the calling thread (a PyTorch thread may have none), and also to the
 * device kvc_options.cuda_device names, if any, which must then have peer
 * access to it. A daemon device this process does not see, or a named device
 * that cannot reach it, gets -ENODEV and kvc_last_error() says which. The
 * calls run in the current context, or else in the primary context of the
 * accessing device, retained until kvc_close(). The driver is loaded at the
 * first segment, not at connect, so a process may connect, fork, and use
 * CUDA in the child.
 *
 * Lock-free readers see a device once its state is published with a release
 * store, after the reservation exists, and a segment flag only after its
 * memory is mapped and accessible. */
#include "kvc_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvconfig.h"

#if KV_HAVE_CUDA
#include "cudrv.h"

struct cu_dev {
	CUdeviceptr base;         /* device_bytes reserved */
	CUdevice own;             /* the GPU the daemon device is */
	CUdevice access;          /* read/write access: own, or kvc_options.cuda_device */
	CUcontext retained;       /* primary context of access we retained, or NULL */
	uint64_t *size;           /* bytes mapped per segment (0: none) */
	atomic_uchar mapped[];    /* per segment index: 1 once mapped */
};

struct kvc_map_cu {
	uint32_t devices;
	uint64_t device_bytes;
	uint64_t segment_bytes;
	size_t nseg;
	int cuda_device;          /* kvc_options.cuda_device - 1: -1 = own device */
	int has_uuid;
	unsigned char (*uuid)[16];  /* per daemon device, if has_uuid */
	char err[256];
	_Atomic(struct cu_dev *) dev[];
};

static void set_err(struct kvc_map_cu *m, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void set_err(struct kvc_map_cu *m, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(m->err, sizeof(m->err), fmt, ap);
	va_end(ap);
}

int kvc_map_cu_new(uint32_t devices, uint64_t device_bytes, uint64_t segment_bytes,
		   struct kvc_map_cu **out)
{
	struct kvc_map_cu *m = malloc(sizeof(*m) + devices * sizeof(m->dev[0]));
	uint32_t i;

	if (!m)
		return -ENOMEM;
	m->devices = devices;
	m->device_bytes = device_bytes;
	m->segment_bytes = segment_bytes;
	m->nseg = (size_t)(device_bytes / segment_bytes);
	m->cuda_device = -1;
	m->has_uuid = 0;
	m->uuid = calloc(devices, sizeof(*m->uuid));
	if (!m->uuid) {
		free(m);
		return -ENOMEM;
	}
	m->err[0] = 0;
	for (i = 0; i < devices; i++)
		atomic_init(&m->dev[i], NULL);
	*out = m;
	return 0;
}

void kvc_map_cu_unmap_all(struct kvc_map_cu *m)
{
	uint32_t i;
	size_t s;

	if (!m)
		return;
	for (i = 0; i < m->devices; i++) {
		struct cu_dev *d = atomic_exchange(&m->dev[i], NULL);
		CUcontext ctx;
		int pushed;

		if (!d)
			continue;
		pushed = d->retained && kv_cu.cuCtxPushCurrent(d->retained) == CUDA_SUCCESS;
		for (s = 0; s < m->nseg; s++)
			if (d->size[s])
				kv_cu.cuMemUnmap(d->base + s * m->segment_bytes, d->size[s]);
		kv_cu.cuMemAddressFree(d->base, m->device_bytes);
		if (pushed)
			kv_cu.cuCtxPopCurrent(&ctx);
		if (d->retained)
			kv_cu.cuDevicePrimaryCtxRelease(d->access);
		free(d->size);
		free(d);
	}
}

void kvc_map_cu_free(struct kvc_map_cu *m)
{
	kvc_map_cu_unmap_all(m);
	if (m)
		free(m->uuid);
	free(m);
}

void kvc_map_cu_set_devices(struct kvc_map_cu *m, const unsigned char (*uuid)[16],
			    int cuda_device)
{
	if (uuid) {
		memcpy(m->uuid, uuid, m->devices * sizeof(*m->uuid));
		m->has_uuid = 1;
	}
	m->cuda_device = cuda_device;
}

/* The GPU of this process that daemon device dev is: by UUID, else the
 * ordinal its allocation names (prop). */
static int find_own(struct kvc_map_cu *m, uint32_t dev, const CUmemAllocationProp *prop,
		    CUdevice *own)
{
	char want[KV_CU_UUID_STR];
	const char *vis = getenv("CUDA_VISIBLE_DEVICES");
	CUresult r;
	int n = 0;

	if (!m->has_uuid) {
		if ((r = kv_cu.cuDeviceGet(own, prop->location.id)) != CUDA_SUCCESS) {
			set_err(m, "daemon device %u is CUDA device %d of the daemon, which this "
				"process does not have: %s", dev, prop->location.id, kv_cu_name(r));
			return -ENODEV;
		}
		return 0;
	}
	if ((r = kv_cu.cuDeviceGetCount(&n)) != CUDA_SUCCESS)
		n = 0;
	for (int i = 0; i < n; i++) {
		CUuuid u;

		if (kv_cu.cuDeviceGet(own, i) == CUDA_SUCCESS &&
		    kv_cu.cuDeviceGetUuid(&u, *own) == CUDA_SUCCESS &&
		    !memcmp(u.bytes, m->uuid[dev], 16))
			return 0;
	}
	kv_cu_uuid_str(m->uuid[dev], want);
	set_err(m, "daemon device %u is %s, which is not among the %d CUDA devices this "
		"process sees (CUDA_VISIBLE_DEVICES=%s)", dev, want, n, vis ? vis : "unset");
	return -ENODEV;
}

/* Sets up daemon device dev for a segment with allocation properties prop:
 * finds its GPU and the accessing one, reserves the range, aligned to the
 * allocation granularity. Called with no context pushed; leaves d->retained
 * (if any) unpushed. */
static int dev_setup(struct kvc_map_cu *m, uint32_t dev, const CUmemAllocationProp *prop,
		     struct cu_dev **out)
{
	struct cu_dev *d;
	CUcontext cur = NULL;
	size_t i, gran = 0;
	CUresult r = CUDA_SUCCESS;
	int can = 0, err;

	d = calloc(1, sizeof(*d) + m->nseg * sizeof(d->mapped[0]));
	if (!d || !(d->size = calloc(m->nseg, sizeof(*d->size)))) {
		free(d);
		return -ENOMEM;
	}
	for (i = 0; i < m->nseg; i++)
		atomic_init(&d->mapped[i], 0);
	if ((err = find_own(m, dev, prop, &d->own)) < 0)
		goto fail;
	d->access = d->own;
	if (m->cuda_device >= 0 && (r = kv_cu.cuDeviceGet(&d->access, m->cuda_device)) != CUDA_SUCCESS) {
		set_err(m, "kvc_options.cuda_device names CUDA device %d, which this process does "
			"not have: %s", m->cuda_device, kv_cu_name(r));
		err = -ENODEV;
		goto fail;
	}
	if (d->access != d->own &&
	    (kv_cu.cuDeviceCanAccessPeer(&can, d->access, d->own) != CUDA_SUCCESS || !can)) {
		set_err(m, "kvc_options.cuda_device names CUDA device %d, which cannot access "
			"daemon device %u (CUDA device %d here) without peer access; name that "
			"device or none", m->cuda_device, dev, (int)d->own);
		err = -ENODEV;
		goto fail;
	}
	if ((kv_cu.cuCtxGetCurrent(&cur) != CUDA_SUCCESS || !cur) &&
	    (r = kv_cu.cuDevicePrimaryCtxRetain(&d->retained, d->access)) != CUDA_SUCCESS) {
		set_err(m, "no CUDA context is current and device %d's primary context cannot "
			"be retained: %s", (int)d->access, kv_cu_name(r));
		err = kv_cu_errno(r);
		goto fail;
	}
	if (d->retained)
		kv_cu.cuCtxPushCurrent(d->retained);
	if (kv_cu.cuMemGetAllocationGranularity(&gran, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
	    CUDA_SUCCESS || (gran & (gran - 1)))
		gran = 0;  /* the driver's default alignment */
	r = kv_cu.cuMemAddressReserve(&d->base, m->device_bytes, gran, 0, 0);
	if (d->retained)
		kv_cu.cuCtxPopCurrent(&cur);
	if (r != CUDA_SUCCESS) {
		set_err(m, "reserving %llu MiB of device address space: %s",
			(unsigned long long)(m->device_bytes >> 20), kv_cu_name(r));
		if (d->retained)
			kv_cu.cuDevicePrimaryCtxRelease(d->access);
		err = kv_cu_errno(r);
		goto fail;
	}
	*out = d;
	return 0;
fail:
	free(d->size);
	free(d);
	return err;
}

/* Consumes fd. */
int kvc_map_cu_segment(struct kvc_map_cu *m, uint32_t dev, uint32_t index, uint64_t offset,
		       uint64_t bytes, int fd)
{
	CUmemGenericAllocationHandle h = 0;
	CUmemAllocationProp prop;
	CUmemAccessDesc acc[2];
	struct cu_dev *d;
	CUcontext ctx;
	CUresult cr = CUDA_SUCCESS;
	int r, pushed = 0;

	if (dev >= m->devices || index >= m->nseg || offset != (uint64_t)index * m->segment_bytes ||
	    bytes == 0 || bytes > m->segment_bytes) {
		close(fd);
		return -EPROTO;
	}
	r = kv_cu_load();
	if (r < 0) {
		set_err(m, "the daemon serves CUDA memory, but CUDA is unusable here: %s",
			kv_cu_error());
		close(fd);
		return r;
	}
	cr = kv_cu.cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
						  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (cr == CUDA_ERROR_INVALID_CONTEXT) {
		/* A driver that wants a context even for this: device 0's
		 * primary one, for the call only. */
		CUdevice d0;

		if (kv_cu.cuDeviceGet(&d0, 0) == CUDA_SUCCESS &&
		    kv_cu.cuDevicePrimaryCtxRetain(&ctx, d0) == CUDA_SUCCESS) {
			if (kv_cu.cuCtxPushCurrent(ctx) == CUDA_SUCCESS) {
				cr = kv_cu.cuMemImportFromShareableHandle(
					&h, (void *)(uintptr_t)fd,
					CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
				kv_cu.cuCtxPopCurrent(&ctx);
			}
			kv_cu.cuDevicePrimaryCtxRelease(d0);
		}
	}
	close(fd);
	if (cr != CUDA_SUCCESS) {
		set_err(m, "importing segment %u of device %u: %s", index, dev, kv_cu_name(cr));
		return kv_cu_errno(cr);
	}
	memset(&prop, 0, sizeof(prop));
	if ((cr = kv_cu.cuMemGetAllocationPropertiesFromHandle(&prop, h)) != CUDA_SUCCESS) {
		set_err(m, "segment %u of device %u: allocation properties: %s", index, dev,
			kv_cu_name(cr));
		r = kv_cu_errno(cr);
		goto out;
	}
	if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
		set_err(m, "segment %u of device %u is not device memory", index, dev);
		r = -EPROTO;
		goto out;
	}
	d = atomic_load_explicit(&m->dev[dev], memory_order_relaxed);
	if (!d) {
		r = dev_setup(m, dev, &prop, &d);
		if (r < 0)
			goto out;
		atomic_store_explicit(&m->dev[dev], d, memory_order_release);
	}
	if (d->retained)
		pushed = kv_cu.cuCtxPushCurrent(d->retained) == CUDA_SUCCESS;
	/* Sent again: fresh memory replaces the old at the same address. The
	 * old memory held no block this connection still holds. */
	if (d->size[index]) {
		atomic_store_explicit(&d->mapped[index], 0, memory_order_release);
		kv_cu.cuMemUnmap(d->base + offset, d->size[index]);
		d->size[index] = 0;
	}
	memset(acc, 0, sizeof(acc));
	for (int i = 0; i < 2; i++) {
		acc[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		acc[i].location.id = i ? (int)d->access : (int)d->own;
		acc[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	}
	cr = kv_cu.cuMemMap(d->base + offset, bytes, 0, h, 0);
	if (cr == CUDA_SUCCESS) {
		cr = kv_cu.cuMemSetAccess(d->base + offset, bytes, acc,
					  d->access == d->own ? 1 : 2);
		if (cr != CUDA_SUCCESS)
			kv_cu.cuMemUnmap(d->base + offset, bytes);
	}
	if (pushed)
		kv_cu.cuCtxPopCurrent(&ctx);
	if (cr != CUDA_SUCCESS) {
		set_err(m, "mapping segment %u of device %u (CUDA device %d here): %s", index, dev,
			(int)d->own, kv_cu_name(cr));
		r = kv_cu_errno(cr);
		goto out;
	}
	d->size[index] = bytes;
	atomic_store_explicit(&d->mapped[index], 1, memory_order_release);
	r = 0;
out:
	kv_cu.cuMemRelease(h);  /* a mapping holds the allocation */
	return r;
}

bool kvc_map_cu_is_mapped(const struct kvc_map_cu *m, uint32_t dev, uint32_t index)
{
	struct cu_dev *d;

	if (!m || dev >= m->devices || index >= m->nseg)
		return false;
	d = atomic_load_explicit((_Atomic(struct cu_dev *) *)&m->dev[dev], memory_order_acquire);
	return d && atomic_load_explicit((atomic_uchar *)&d->mapped[index], memory_order_acquire);
}

void *kvc_map_cu_base(const struct kvc_map_cu *m, uint32_t dev)
{
	struct cu_dev *d;

	if (!m || dev >= m->devices)
		return NULL;
	d = atomic_load_explicit((_Atomic(struct cu_dev *) *)&m->dev[dev], memory_order_acquire);
	return d ? (void *)(uintptr_t)d->base : NULL;
}

const char *kvc_map_cu_error(const struct kvc_map_cu *m)
{
	return m ? m->err : "";
}

#else /* !KV_HAVE_CUDA: a daemon on the cuda backend cannot be served. */

int kvc_map_cu_new(uint32_t devices, uint64_t device_bytes, uint64_t segment_bytes,
		   struct kvc_map_cu **out)
{
	(void)devices, (void)device_bytes, (void)segment_bytes, (void)out;
	return -ENOTSUP;
}

void kvc_map_cu_free(struct kvc_map_cu *m)
{
	(void)m;
}

void kvc_map_cu_unmap_all(struct kvc_map_cu *m)
{
	(void)m;
}

void kvc_map_cu_set_devices(struct kvc_map_cu *m, const unsigned char (*uuid)[16],
			    int cuda_device)
{
	(void)m, (void)uuid, (void)cuda_device;
}

int kvc_map_cu_segment(struct kvc_map_cu *m, uint32_t dev, uint32_t index, uint64_t offset,
		       uint64_t bytes, int fd)
{
	(void)m, (void)dev, (void)index, (void)offset, (void)bytes;
	close(fd);
	return -ENOTSUP;
}

bool kvc_map_cu_is_mapped(const struct kvc_map_cu *m, uint32_t dev, uint32_t index)
{
	(void)m, (void)dev, (void)index;
	return false;
}

void *kvc_map_cu_base(const struct kvc_map_cu *m, uint32_t dev)
{
	(void)m, (void)dev;
	return NULL;
}

const char *kvc_map_cu_error(const struct kvc_map_cu *m)
{
	(void)m;
	return "";
}

#endif
