/* The disk tier's I/O: one preallocated file (or block device) read and
 * written with io_uring, O_DIRECT where the file system allows it.
 *
 * The disk has its own ring: its fixed buffers (the G2 arena, registered in
 * chunks of at most 1 GiB) belong to it, and its depth is bounded apart from
 * the sockets'. An eventfd registered with the ring is what the event loop
 * polls; kv_disk_reap() then delivers completions. Ops beyond the depth wait
 * on a FIFO and go out as earlier ones complete; submissions made during one
 * turn of the loop go to the kernel together (kv_disk_flush()). */
#ifndef KV_DISK_H
#define KV_DISK_H

#include <liburing.h>
#include <stdint.h>

#include "list.h"

struct kv_disk_op;
typedef void (*kv_disk_cb)(struct kv_disk_op *op, int res);

struct kv_disk_op {
	struct kv_list link;   /* while queued */
	kv_disk_cb done;       /* res: bytes moved or -errno */
	int write;
	void *buf;             /* inside the registered arena */
	uint32_t len;
	uint64_t off;          /* byte offset in the file */
	int res;               /* < 0: an injected failure */
};

struct kv_disk {
	int fd;
	int direct;            /* opened with O_DIRECT */
	uint64_t bytes;        /* usable size */
	struct io_uring ring;
	int ring_ok;
	int efd;               /* readable when completions wait */
	unsigned depth, inflight, unsubmitted;
	uint8_t *arena;        /* registered buffers: chunks of chunk bytes */
	uint64_t arena_bytes, chunk;
	struct kv_list queued; /* waiting for room in the ring */
	uint64_t nqueued;      /* on it */
	uint64_t reads, writes, read_bytes, write_bytes, errors;
};

/* Opens (creating it if needed) path and makes it bytes long (fallocate on a
 * file; a block device is used up to its size or bytes, whichever is less).
 * arena[0..arena_bytes) is registered as fixed buffers of chunk bytes each
 * (an op's buffer must not straddle two chunks). Returns 0 or -errno with a
 * message in err. */
int kv_disk_open(struct kv_disk *d, const char *path, uint64_t bytes, unsigned depth,
		 void *arena, uint64_t arena_bytes, uint64_t chunk, char *err, size_t errlen);
void kv_disk_close(struct kv_disk *d);

/* Queues op (its fields set); the callback runs from kv_disk_reap(), never
 * from inside this call. */
void kv_disk_submit(struct kv_disk *d, struct kv_disk_op *op);
/* Hands queued submissions to the kernel. */
void kv_disk_flush(struct kv_disk *d);
/* Delivers every completion that has arrived. */
void kv_disk_reap(struct kv_disk *d);

#endif
