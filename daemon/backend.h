/* The memory backend: where segments come from and how bytes move inside them.
 *
 * Everything above this interface (pages, pools, the prefix index, the
 * protocol) is the same for every backend. A backend owns its segments: it
 * creates them (all up front, so no client request pays for it), exports each
 * as a file descriptor that clients map, and copies between block locations.
 * Locations are byte offsets in a device's range: segment s covers
 * [s * segment_bytes, (s + 1) * segment_bytes).
 *
 * Backends: host (memfd segments; runs anywhere) and, later, cuda (VMM). */
#ifndef KV_BACKEND_H
#define KV_BACKEND_H

#include <stdint.h>

#define KV_MAX_DEVICES 16

struct kv_backend;

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
};

/* Creates the host backend: one device of nseg memfd segments of seg_bytes.
 * Returns 0 and *out, or -errno. */
int kv_backend_host_create(uint64_t seg_bytes, uint32_t nseg, struct kv_backend **out);

static inline void kv_backend_destroy(struct kv_backend *be)
{
	if (be)
		be->ops->destroy(be);
}

#endif
