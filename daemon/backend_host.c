/* The host backend: segments are memfds. The daemon maps each one (for
 * copies); clients map the same memfd, so all see one set of bytes. */
#include "backend.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct host_seg {
	int fd;
	uint8_t *map;
};

struct host_backend {
	struct kv_backend be;
	struct host_seg *segs;
};

static void host_seg_drop(struct host_backend *h, struct host_seg *s)
{
	if (s->map)
		munmap(s->map, h->be.segment_bytes);
	if (s->fd >= 0)
		close(s->fd);
	s->map = NULL;
	s->fd = -1;
}

static int host_segment_create(struct kv_backend *be, uint32_t dev, uint32_t idx)
{
	struct host_backend *h = (struct host_backend *)be;
	struct host_seg ns = { .fd = -1 };
	char name[32];
	int r;

	if (dev != 0 || idx >= be->segments[0])
		return -EINVAL;
	snprintf(name, sizeof(name), "kvcached-seg%u", idx);
	ns.fd = memfd_create(name, MFD_CLOEXEC);
	if (ns.fd < 0)
		return -errno;
	if (ftruncate(ns.fd, (off_t)be->segment_bytes) < 0) {
		r = -errno;
		goto err;
	}
	ns.map = mmap(NULL, be->segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ns.fd, 0);
	if (ns.map == MAP_FAILED) {
		ns.map = NULL;
		r = -errno;
		goto err;
	}
	host_seg_drop(h, &h->segs[idx]);
	h->segs[idx] = ns;
	be->epoch[0][idx]++;
	return 0;
err:
	host_seg_drop(h, &ns);
	return r;
}

static int host_segment_fd(struct kv_backend *be, uint32_t dev, uint32_t idx)
{
	struct host_backend *h = (struct host_backend *)be;

	return dev == 0 && idx < be->segments[0] ? h->segs[idx].fd : -EINVAL;
}

static uint8_t *host_addr(struct host_backend *h, uint64_t off, uint64_t len)
{
	uint64_t s = off / h->be.segment_bytes, o = off % h->be.segment_bytes;

	if (s >= h->be.segments[0] || o + len > h->be.segment_bytes || !h->segs[s].map)
		return NULL;
	return h->segs[s].map + o;
}

static int host_copy(struct kv_backend *be, uint32_t dev, uint64_t dst, uint64_t src, uint64_t len)
{
	struct host_backend *h = (struct host_backend *)be;
	uint8_t *d = host_addr(h, dst, len), *s = host_addr(h, src, len);

	if (dev != 0 || !d || !s)
		return -EINVAL;
	memcpy(d, s, len);
	return 0;
}

static void host_destroy(struct kv_backend *be)
{
	struct host_backend *h = (struct host_backend *)be;
	uint32_t i;

	for (i = 0; i < be->segments[0]; i++)
		host_seg_drop(h, &h->segs[i]);
	free(h->segs);
	free(be->epoch[0]);
	free(h);
}

static const struct kv_backend_ops host_ops = {
	.segment_create = host_segment_create,
	.segment_fd = host_segment_fd,
	.copy = host_copy,
	.destroy = host_destroy,
};

int kv_backend_host_create(uint64_t seg_bytes, uint32_t nseg, struct kv_backend **out)
{
	struct host_backend *h;
	uint32_t i;
	int r;

	if (!seg_bytes || !nseg || seg_bytes % 4096)
		return -EINVAL;
	h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->be.ops = &host_ops;
	h->be.name = "host";
	h->be.devices = 1;
	h->be.segment_bytes = seg_bytes;
	h->be.segments[0] = nseg;
	h->segs = calloc(nseg, sizeof(*h->segs));
	h->be.epoch[0] = calloc(nseg, sizeof(uint32_t));
	if (!h->segs || !h->be.epoch[0]) {
		free(h->segs);
		free(h->be.epoch[0]);
		free(h);
		return -ENOMEM;
	}
	for (i = 0; i < nseg; i++)
		h->segs[i].fd = -1;
	for (i = 0; i < nseg; i++) {
		r = host_segment_create(&h->be, 0, i);
		if (r < 0) {
			host_destroy(&h->be);
			return r;
		}
	}
	*out = &h->be;
	return 0;
}
