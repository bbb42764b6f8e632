/* The memory backend: where segments come from and how bytes move inside them.
 *
 * Everything above this interface (pages, pools, the prefix index, the
 * protocol) is the same for every backend. A backend owns its segments: it
 * creates them (all up front, so no client request pays for it), exports each
 * as a file descriptor that clients map, and copies between block locations.
 * Locations are byte offsets in a device's range: segment s covers
 * [s * segment_bytes, (s + 1) * segment_bytes).
 *
 * Tiers (G2 host DRAM, G3 NVMe) need two more things of a backend: host
 * memory for the G2 arena (pinned on cuda, so that copies use the copy
 * engines and io_uring can register it as fixed buffers), and asynchronous
 * batched copies between device locations and that memory, whose completions
 * reach the event loop through an fd (an eventfd) without blocking it.
 *
 * Backends: host (memfd segments; runs anywhere) and cuda (VMM,
 * backend_cuda.c). */
#ifndef KV_BACKEND_H
#define KV_BACKEND_H

#include <stdint.h>

#include "quant.h"

#define KV_MAX_DEVICES 16

/* The daemon's exit status when a device's context is lost for good (a
 * sticky CUDA error): see kvcached(8). */
#define KV_EXIT_DEVICE_LOST 3

struct kv_backend;

/* One copy of a batch: device offset <-> host pointer (H2D, D2H) or device
 * offset <-> device offset (D2D, src_off). */
enum kv_copy_dir { KV_COPY_D2H, KV_COPY_H2D, KV_COPY_D2D };

struct kv_copy {
	uint64_t dev_off;   /* device location: the source of D2H, the destination otherwise */
	uint64_t src_off;   /* D2D: the source */
	void *host;         /* D2H: destination; H2D: source (arena memory) */
	uint64_t len;       /* the device side's bytes */
	/* D2H and H2D on a backend with quant set: the host side holds the
	 * block quantized (quant.h), kv_quant_bytes(len / 2, KV_QUANT_GROUP)
	 * bytes of format qfmt of elements of type qdtype; KV_QFMT_RAW (0):
	 * len raw bytes. */
	uint8_t qfmt, qdtype;
	/* D2H on a backend with crc set: NULL, or where the CRC32C (crc32c.h,
	 * from 0) of the bytes written at host goes, summed by the copy while
	 * they are in cache (issue 38: a G4 value's sum, not a second pass
	 * over the slot on another thread). Written before the batch's
	 * completion is reaped; a failed batch leaves it undefined. */
	uint32_t *crc;
};

/* Whether copy c of a dir batch asks for a format a quantizing backend does:
 * none (raw), or D2H/H2D of a non-empty, even len of FP16 or BF16 elements
 * in E4M3 or E5M2. Any other copy_async refuses with -EINVAL. */
static inline int kv_copy_qvalid(enum kv_copy_dir dir, const struct kv_copy *c)
{
	return !c->qfmt ||
	       (dir != KV_COPY_D2D && (c->qfmt == KV_QFMT_E4M3 || c->qfmt == KV_QFMT_E5M2) &&
		(c->qdtype == KV_DTYPE_F16 || c->qdtype == KV_DTYPE_BF16) && c->len &&
		c->len % 2 == 0);
}

/* A finished batch: the tag given to copy_async and 0 or -errno. */
struct kv_copy_done {
	uint64_t tag;
	int res;
};

struct kv_backend_ops {
	/* (Re)creates segment idx of device dev. A segment that already exists is
	 * replaced by fresh memory: mappings of the old one that clients still
	 * hold no longer alias the new one. Returns 0 or -errno. */
	int (*segment_create)(struct kv_backend *be, uint32_t dev, uint32_t idx);
	/* The fd that exports segment idx. Owned by the backend; valid until the
	 * segment is recreated or the backend destroyed. */
	int (*segment_fd)(struct kv_backend *be, uint32_t dev, uint32_t idx);
	/* Copies len bytes between offsets of device dev. Returns 0 or -errno. */
	int (*copy)(struct kv_backend *be, uint32_t dev, uint64_t dst, uint64_t src, uint64_t len);
	/* Optional (NULL: nothing to do). A hint that bytes [off, off + len) of
	 * device dev were just handed to a pool: the backend may make its own
	 * mapping of them ready, so that its first copy from them does not fault
	 * page by page. Never fails, never changes a byte; may finish later. */
	void (*populate)(struct kv_backend *be, uint32_t dev, uint64_t off, uint64_t len);
	/* Host memory for the G2 arena, zeroed, page aligned, mapped only by the
	 * daemon. Returns NULL on failure. host_free takes the same bytes. */
	void *(*host_alloc)(struct kv_backend *be, uint64_t bytes);
	void (*host_free)(struct kv_backend *be, void *p, uint64_t bytes);
	/* Starts n copies of direction dir on device dev (host pointers inside a
	 * host_alloc region). When all have finished, (tag, result) is returned by
	 * reap() and completion_fd becomes readable. Returns 0, or -errno when
	 * nothing was started (no completion follows). */
	int (*copy_async)(struct kv_backend *be, uint32_t dev, enum kv_copy_dir dir,
			  const struct kv_copy *c, uint32_t n, uint64_t tag);
	/* Optional (NULL: nothing to do). Between plug(be, 1) and plug(be, 0)
	 * (nested calls count), copy_async may hold the batches it is given and
	 * hand them to its copy engine together, up to a size of its own, so
	 * that a lookup's many one-block promotions cost one hand-off to the
	 * copy thread and one completion wakeup instead of one each (issue 38).
	 * copy_async still checks and accepts or refuses each batch at once,
	 * and each still completes on its own with its own tag and result;
	 * plug(be, 0) starts what is held. Never fails. */
	void (*plug)(struct kv_backend *be, int on);
	/* Collects up to max finished batches, in any order; returns how many
	 * (0 when none) and clears completion_fd's readiness once all are taken. */
	int (*reap)(struct kv_backend *be, struct kv_copy_done *done, int max);
	/* Frees every segment and be itself. */
	void (*destroy)(struct kv_backend *be);
};

struct kv_backend {
	const struct kv_backend_ops *ops;
	const char *name;
	uint32_t devices;
	uint64_t segment_bytes;
	uint32_t segments[KV_MAX_DEVICES];  /* per device */
	/* Per device and segment: bumped by every segment_create, so that a
	 * session that was sent an older fd of the segment is sent the new one. */
	uint32_t *epoch[KV_MAX_DEVICES];
	/* Readable (an eventfd) while copy_async batches are waiting in reap(). */
	int completion_fd;
	/* copy_async quantizes D2H and dequantizes H2D copies that ask for it
	 * (kv_copy.qfmt): host, with the C reference on its copy thread; cuda,
	 * with the device kernels (backend_cuda_quant.h). 0: it does not (cuda
	 * when a device could not load its kernels), and no pool's tier copies
	 * are compressed. */
	int quant;
	/* copy_async fills kv_copy.crc of D2H copies: host; 0: it does not
	 * (cuda), and the tiers sum the bytes themselves. */
	int crc;
	/* cuda: each device's UUID (cuDeviceGetUuid), which Hello sends so that
	 * a worker with its own CUDA_VISIBLE_DEVICES finds its GPU; host: none. */
	int has_uuid;
	unsigned char uuid[KV_MAX_DEVICES][16];
	/* Bytes populate() has asked the kernel to populate (host: handed to
	 * MADV_POPULATE_WRITE; each page once per mapping of its segment), for
	 * the tests. */
	uint64_t populated;
};

/* The bytes of device dev's segments, and the most of any device (the range a
 * client reserves per device). Devices differ when the cuda backend sized a
 * device from what was free (kv_backend_cuda_create). */
static inline uint64_t kv_backend_dev_bytes(const struct kv_backend *be, uint32_t dev)
{
	return be->segment_bytes * be->segments[dev];
}

static inline uint64_t kv_backend_max_dev_bytes(const struct kv_backend *be)
{
	uint64_t m = 0;

	for (uint32_t i = 0; i < be->devices; i++)
		if (kv_backend_dev_bytes(be, i) > m)
			m = kv_backend_dev_bytes(be, i);
	return m;
}

/* Plugged (plug), the host backend hands its held batches to the copy
 * thread once this many bytes are held (else at plug(be, 0)): big enough
 * that a hand-off is paid per 16 blocks of 256 KiB, small enough that the
 * loop indexes and wakes the lookups of one job (about a microsecond a
 * block) while the thread copies the next. */
#define KV_HOST_PLUG_BYTES (4u << 20)

/* Creates the host backend: one device of nseg memfd segments of seg_bytes.
 * Returns 0 and *out, or -errno. */
int kv_backend_host_create(uint64_t seg_bytes, uint32_t nseg, struct kv_backend **out);

/* Creates the cuda backend (backend_cuda.c; docs/architecture.md, "The cuda
 * backend"): one device per entry of devs (CUDA ordinals as this process sees
 * them; NULL or ndev 0 = every visible device, at most KV_MAX_DEVICES), each
 * with floor(bytes_per_dev / seg_bytes) segments of seg_bytes, seg_bytes a
 * multiple of the device's VMM granularity (2 MiB on current GPUs). A device
 * with less free memory than that gets as many segments as fit (a warning
 * says so): after a restart, memory of the previous daemon that workers still
 * map is not free until they remap. Every segment is allocated, exported and
 * zeroed here. Returns 0 and *out, or
 * -errno with a description in err: -ENOTSUP when built without CUDA,
 * -ENODEV without a driver or device, -ENOMEM when not one segment is free. */
int kv_backend_cuda_create(const int *devs, uint32_t ndev, uint64_t bytes_per_dev,
			   uint64_t seg_bytes, char *err, unsigned errlen, struct kv_backend **out);

/* Free and total memory of CUDA device dev (an ordinal), for sizing the pool
 * as a share of free memory before kv_backend_cuda_create. Returns 0, or
 * -errno (-ENOTSUP without CUDA, -ENODEV without a driver or that device);
 * kv_backend_cuda_error() then says what failed. */
int kv_backend_cuda_mem_info(int dev, uint64_t *free_bytes, uint64_t *total_bytes);

/* How many CUDA devices this process sees, or -errno (kv_backend_cuda_error()). */
int kv_backend_cuda_device_count(void);

/* What the last failed kv_backend_cuda_mem_info or _device_count call found
 * (a static string, "" if none; the loop thread's, like every call here). */
const char *kv_backend_cuda_error(void);

static inline void kv_backend_destroy(struct kv_backend *be)
{
	if (be)
		be->ops->destroy(be);
}

#endif
