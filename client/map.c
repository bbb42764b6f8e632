/* Host mapping of segments: a PROT_NONE reservation of device_bytes per
 * device, and each segment's memfd mapped whole over its slice of it with
 * MAP_FIXED. See kvc_internal.h for the interface. A map for a daemon on the
 * cuda backend hands every call to map_cuda.c instead.
 *
 * Lock-free readers (kvc_block_ptr) see a device only once its state is
 * published with a release store, after the reservation exists, and a segment
 * flag only after its mmap() returned: whatever they see mapped is mapped. */
#include "kvc_internal.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvsan.h"

/* ThreadSanitizer takes an mmap() for a write of every byte it maps, which
 * retiring a map is not: kvcache.h lets a thread go on reading a block
 * through a pointer from before a restart while another thread's call
 * reconnects and the old daemon's memory turns into zero pages under it (it
 * reads the old bytes or zeros, a page at a time). With the thread's
 * accesses ignored, TSan forgets the range's history instead. */
#if KV_TSAN
void AnnotateIgnoreWritesBegin(const char *file, int line);
void AnnotateIgnoreWritesEnd(const char *file, int line);
#define NOT_A_WRITE_BEGIN() AnnotateIgnoreWritesBegin(__FILE__, __LINE__)
#define NOT_A_WRITE_END() AnnotateIgnoreWritesEnd(__FILE__, __LINE__)
#else
#define NOT_A_WRITE_BEGIN() do { } while (0)
#define NOT_A_WRITE_END() do { } while (0)
#endif

struct map_dev {
	void *base;               /* device_bytes reserved */
	atomic_uchar mapped[];    /* per segment index: 1 once mapped */
};

struct kvc_map {
	struct kvc_map_cu *cu;             /* cuda backend: everything goes there */
	uint32_t devices;
	uint64_t device_bytes;
	uint64_t segment_bytes;
	size_t nseg;                       /* device_bytes / segment_bytes */
	_Atomic(struct map_dev *) dev[];   /* NULL until reserved */
};

/* Returns 0 or -ENOMEM, -EINVAL, -EPROTO, -ENOTSUP. */
int kvc_map_new(const char *backend, uint32_t devices, uint64_t device_bytes,
		uint64_t segment_bytes, struct kvc_map **out)
{
	struct kvc_map *m;
	uint32_t i;
	int cuda = backend && !strcmp(backend, "cuda"), r;

	if (devices == 0 || segment_bytes == 0 || device_bytes == 0 ||
	    device_bytes % segment_bytes != 0 || device_bytes > SIZE_MAX)
		return -EINVAL;
	if (!cuda && backend && *backend && strcmp(backend, "host"))
		return -EPROTO;
	m = malloc(sizeof(*m) + devices * sizeof(m->dev[0]));
	if (!m)
		return -ENOMEM;
	m->cu = NULL;
	if (cuda && (r = kvc_map_cu_new(devices, device_bytes, segment_bytes, &m->cu)) < 0) {
		free(m);
		return r;
	}
	m->devices = devices;
	m->device_bytes = device_bytes;
	m->segment_bytes = segment_bytes;
	m->nseg = (size_t)(device_bytes / segment_bytes);
	for (i = 0; i < devices; i++)
		atomic_init(&m->dev[i], NULL);
	*out = m;
	return 0;
}

void kvc_map_unmap_all(struct kvc_map *m)
{
	uint32_t i;

	if (!m)
		return;
	kvc_map_cu_unmap_all(m->cu);
	for (i = 0; i < m->devices; i++) {
		struct map_dev *d = atomic_exchange(&m->dev[i], NULL);

		if (!d)
			continue;
		/* One munmap takes the segments with the reservation. */
		munmap(d->base, (size_t)m->device_bytes);
		free(d);
	}
}

void kvc_map_retire(struct kvc_map *m)
{
	uint32_t i;
	size_t k;

	if (!m || m->cu)
		return;
	for (i = 0; i < m->devices; i++) {
		struct map_dev *d = atomic_load_explicit(&m->dev[i], memory_order_acquire);

		if (!d)
			continue;
		NOT_A_WRITE_BEGIN();
		for (k = 0; k < m->nseg; k++)
			if (atomic_load_explicit(&d->mapped[k], memory_order_acquire))
				mmap((char *)d->base + k * m->segment_bytes, (size_t)m->segment_bytes,
				     PROT_READ | PROT_WRITE,
				     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
		NOT_A_WRITE_END();
	}
}

void kvc_map_free(struct kvc_map *m)
{
	if (!m)
		return;
	kvc_map_unmap_all(m);
	kvc_map_cu_free(m->cu);
	free(m);
}

/* Returns 0, -EINVAL or -errno. */
int kvc_map_reserve(struct kvc_map *m, uint32_t dev)
{
	struct map_dev *d;
	size_t i;

	if (dev >= m->devices)
		return -EINVAL;
	if (m->cu)  /* map_cuda.c reserves with the first segment */
		return 0;
	if (atomic_load_explicit(&m->dev[dev], memory_order_acquire))
		return 0;
	d = malloc(sizeof(*d) + m->nseg * sizeof(d->mapped[0]));
	if (!d)
		return -ENOMEM;
	for (i = 0; i < m->nseg; i++)
		atomic_init(&d->mapped[i], 0);
	d->base = mmap(NULL, (size_t)m->device_bytes, PROT_NONE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (d->base == MAP_FAILED) {
		int err = -errno;

		free(d);
		return err;
	}
	atomic_store_explicit(&m->dev[dev], d, memory_order_release);
	return 0;
}

/* Consumes fd. Returns 0, -EPROTO or -errno. */
int kvc_map_segment(struct kvc_map *m, uint32_t dev, uint32_t index, uint64_t offset,
		    uint64_t bytes, int fd)
{
	struct map_dev *d;
	void *p;
	int r;

	if (m->cu)
		return kvc_map_cu_segment(m->cu, dev, index, offset, bytes, fd);
	if (dev >= m->devices || index >= m->nseg ||
	    offset != (uint64_t)index * m->segment_bytes || bytes == 0 ||
	    bytes > m->segment_bytes) {
		r = -EPROTO;
		goto out;
	}
	r = kvc_map_reserve(m, dev);
	if (r < 0)
		goto out;
	d = atomic_load_explicit(&m->dev[dev], memory_order_relaxed);
	/* The daemon names a segment again when it has replaced the memory
	 * behind it (the segment went to another namespace and came back):
	 * map the new memory over the old, at the same address. The old
	 * memory held no block this connection holds any more. */
	p = mmap((char *)d->base + offset, (size_t)bytes, PROT_READ | PROT_WRITE,
		 MAP_SHARED | MAP_FIXED, fd, 0);
	if (p == MAP_FAILED) {
		r = -errno;
		/* A failed MAP_FIXED may have unmapped the slice: restore the
		 * reservation so that nothing else lands inside the range. */
		mmap((char *)d->base + offset, (size_t)bytes, PROT_NONE,
		     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
		goto out;
	}
	atomic_store_explicit(&d->mapped[index], 1, memory_order_release);
out:
	close(fd);
	return r;
}

bool kvc_map_is_mapped(const struct kvc_map *m, uint32_t dev, uint32_t index)
{
	struct map_dev *d;

	if (m && m->cu)
		return kvc_map_cu_is_mapped(m->cu, dev, index);
	if (!m || dev >= m->devices || index >= m->nseg)
		return false;
	/* The atomics are only read; the casts drop const for C11's loads,
	 * which older compilers declare without it. */
	d = atomic_load_explicit((_Atomic(struct map_dev *) *)&m->dev[dev],
				 memory_order_acquire);
	return d && atomic_load_explicit((atomic_uchar *)&d->mapped[index],
					 memory_order_acquire);
}

void *kvc_map_base(const struct kvc_map *m, uint32_t dev)
{
	struct map_dev *d;

	if (m && m->cu)
		return kvc_map_cu_base(m->cu, dev);
	if (!m || dev >= m->devices)
		return NULL;
	d = atomic_load_explicit((_Atomic(struct map_dev *) *)&m->dev[dev],
				 memory_order_acquire);
	return d ? d->base : NULL;
}

const char *kvc_map_error(const struct kvc_map *m)
{
	return m && m->cu ? kvc_map_cu_error(m->cu) : "";
}

void kvc_map_set_devices(struct kvc_map *m, const unsigned char (*uuid)[16], int cuda_device)
{
	if (m->cu)
		kvc_map_cu_set_devices(m->cu, uuid, cuda_device);
}

bool kvc_map_is_cuda(const struct kvc_map *m)
{
	return m && m->cu;
}
