#include "disk.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fault.h"

int kv_disk_open(struct kv_disk *d, const char *path, uint64_t bytes, unsigned depth,
		 void *arena, uint64_t arena_bytes, uint64_t chunk, char *err, size_t errlen)
{
	struct iovec iov[64];
	unsigned niov = 0;
	struct stat st;
	uint64_t o;
	int r;

	memset(d, 0, sizeof(*d));
	d->efd = -1;
	kv_list_init(&d->queued);
	d->fd = open(path, O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
	d->direct = d->fd >= 0;
	if (d->fd < 0 && errno == EINVAL)  /* tmpfs and friends: no O_DIRECT */
		d->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (d->fd < 0) {
		r = -errno;
		snprintf(err, errlen, "disk_path %s: %s", path, strerror(-r));
		return r;
	}
	if (fstat(d->fd, &st) < 0) {
		r = -errno;
		snprintf(err, errlen, "disk_path %s: %s", path, strerror(-r));
		goto fail;
	}
	if (S_ISBLK(st.st_mode)) {
		uint64_t dev_bytes = 0;

		if (ioctl(d->fd, BLKGETSIZE64, &dev_bytes) < 0) {
			r = -errno;
			snprintf(err, errlen, "disk_path %s: cannot read its size: %s", path,
				 strerror(-r));
			goto fail;
		}
		d->bytes = bytes && bytes < dev_bytes ? bytes : dev_bytes;
	} else if (S_ISREG(st.st_mode)) {
		r = posix_fallocate(d->fd, 0, (off_t)bytes);
		if (r == EOPNOTSUPP || r == EINVAL)
			r = ftruncate(d->fd, (off_t)bytes) < 0 ? errno : 0;
		if (r) {
			snprintf(err, errlen, "disk_path %s: cannot allocate %llu bytes: %s", path,
				 (unsigned long long)bytes, strerror(r));
			r = -r;
			goto fail;
		}
		d->bytes = bytes;
	} else {
		snprintf(err, errlen, "disk_path %s: not a regular file or block device", path);
		r = -EINVAL;
		goto fail;
	}
	d->depth = depth ? depth : 64;
	r = io_uring_queue_init(d->depth * 2, &d->ring, 0);
	if (r < 0) {
		snprintf(err, errlen, "disk tier: io_uring_queue_init: %s", strerror(-r));
		goto fail;
	}
	d->ring_ok = 1;
	d->arena = arena;
	d->arena_bytes = arena_bytes;
	d->chunk = chunk;
	for (o = 0; o < arena_bytes && niov < 64; o += chunk, niov++) {
		iov[niov].iov_base = (uint8_t *)arena + o;
		iov[niov].iov_len = arena_bytes - o < chunk ? arena_bytes - o : chunk;
	}
	if (o < arena_bytes) {
		snprintf(err, errlen, "disk tier: host tier larger than 64 buffers of %llu bytes",
			 (unsigned long long)chunk);
		r = -EINVAL;
		goto fail;
	}
	r = io_uring_register_buffers(&d->ring, iov, niov);
	if (r < 0) {
		snprintf(err, errlen,
			 "disk tier: cannot register the host tier as io_uring buffers: %s "
			 "(RLIMIT_MEMLOCK? see docs/operations.md)", strerror(-r));
		goto fail;
	}
	d->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (d->efd < 0 || (r = io_uring_register_eventfd(&d->ring, d->efd)) < 0) {
		r = d->efd < 0 ? -errno : r;
		snprintf(err, errlen, "disk tier: eventfd: %s", strerror(-r));
		goto fail;
	}
	return 0;
fail:
	kv_disk_close(d);
	return r;
}

void kv_disk_close(struct kv_disk *d)
{
	if (d->ring_ok)
		io_uring_queue_exit(&d->ring);
	d->ring_ok = 0;
	if (d->efd >= 0)
		close(d->efd);
	if (d->fd >= 0)
		close(d->fd);
	d->efd = d->fd = -1;
}

/* Submissions are handed to the kernel in groups of this many at least, so
 * that a long burst (a flush computing checksums as it goes) keeps the disk
 * busy instead of waiting for the end of the burst. */
#define SUBMIT_BATCH 8

/* Puts op in the ring if there is room; returns 0 or -EBUSY. */
static int start(struct kv_disk *d, struct kv_disk_op *op)
{
	struct io_uring_sqe *sqe;
	uint32_t len = op->len;
	int f, idx;

	if (d->inflight >= d->depth || !(sqe = io_uring_get_sqe(&d->ring)))
		return -EBUSY;
	f = kv_fault(op->write ? KV_FAULT_G3_WRITE : KV_FAULT_G3_READ);
	if (f < 0) {
		/* An injected failure: a no-op carries it to reap, as a real
		 * failure would arrive. */
		op->res = f;
		io_uring_prep_nop(sqe);
		io_uring_sqe_set_data(sqe, op);
		d->inflight++;
		d->unsubmitted++;
		return 0;
	}
	if (f == KV_FAULT_SHORT)
		len /= 2;
	op->res = 1;  /* take the cqe's result */
	idx = (int)(((uint8_t *)op->buf - d->arena) / d->chunk);
	if (op->write)
		io_uring_prep_write_fixed(sqe, d->fd, op->buf, len, op->off, idx);
	else
		io_uring_prep_read_fixed(sqe, d->fd, op->buf, len, op->off, idx);
	io_uring_sqe_set_data(sqe, op);
	d->inflight++;
	if (++d->unsubmitted >= SUBMIT_BATCH)
		kv_disk_flush(d);
	return 0;
}

void kv_disk_submit(struct kv_disk *d, struct kv_disk_op *op)
{
	if (!kv_list_empty(&d->queued) || start(d, op) < 0) {
		kv_list_push_back(&d->queued, &op->link);
		d->nqueued++;
	}
}

void kv_disk_flush(struct kv_disk *d)
{
	if (d->unsubmitted) {
		int r = io_uring_submit(&d->ring);

		if (r > 0)
			d->unsubmitted -= (unsigned)r < d->unsubmitted ? (unsigned)r : d->unsubmitted;
	}
}

void kv_disk_reap(struct kv_disk *d)
{
	uint64_t v;

	if (read(d->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		return;
	for (;;) {
		struct io_uring_cqe *cqe;
		struct kv_disk_op *op;
		int res;

		if (io_uring_peek_cqe(&d->ring, &cqe) != 0)
			break;
		op = io_uring_cqe_get_data(cqe);
		res = op->res < 0 ? op->res : cqe->res;
		io_uring_cqe_seen(&d->ring, cqe);
		d->inflight--;
		if (res < 0)
			d->errors++;
		else if (op->write) {
			d->writes++;
			d->write_bytes += (uint64_t)res;
		} else {
			d->reads++;
			d->read_bytes += (uint64_t)res;
		}
		while (!kv_list_empty(&d->queued)) {
			struct kv_disk_op *q =
				kv_container_of(kv_list_front(&d->queued), struct kv_disk_op, link);

			kv_list_del(&q->link);
			if (start(d, q) < 0) {
				kv_list_push_front(&d->queued, &q->link);
				break;
			}
			d->nqueued--;
		}
		op->done(op, res);
	}
	kv_disk_flush(d);
}
