#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crc32c.h"
#include "fault.h"

#define JMAGIC 0x315844493347564bull  /* "KVG3IDX1" */
#define JVERSION 1

struct jhdr {
	uint64_t magic;
	uint32_t version;
	uint32_t crc;        /* of the header with crc = 0 */
	uint64_t page_bytes;
	uint64_t disk_bytes;
	uint8_t pad[32];
};

_Static_assert(sizeof(struct jhdr) == 64, "the journal header is 64 bytes");

static uint32_t rec_crc(const struct kv_jrec *r)
{
	return kv_crc32c(0, (const uint8_t *)r + 4, sizeof(*r) - 4);
}

static void hdr_fill(struct jhdr *h, const struct kv_journal *j)
{
	memset(h, 0, sizeof(*h));
	h->magic = JMAGIC;
	h->version = JVERSION;
	h->page_bytes = j->page_bytes;
	h->disk_bytes = j->disk_bytes;
	h->crc = kv_crc32c(0, h, sizeof(*h));
}

static int write_all(int fd, const void *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p = (const uint8_t *)p + w;
		n -= (size_t)w;
	}
	return 0;
}

int kv_journal_open(struct kv_journal *j, const char *path, uint64_t page_bytes,
		    uint64_t disk_bytes, void (*replay)(void *ctx, const struct kv_jrec *r),
		    void *ctx, char *err, size_t errlen)
{
	struct jhdr h, want;
	struct kv_jrec r;
	off_t good;
	int r2;

	memset(j, 0, sizeof(*j));
	if (strlen(path) >= sizeof(j->path)) {
		snprintf(err, errlen, "disk_index %s: path too long", path);
		return -ENAMETOOLONG;
	}
	strcpy(j->path, path);
	j->page_bytes = page_bytes;
	j->disk_bytes = disk_bytes;
	j->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (j->fd < 0) {
		r2 = -errno;
		snprintf(err, errlen, "disk_index %s: %s", path, strerror(-r2));
		return r2;
	}
	hdr_fill(&want, j);
	if (pread(j->fd, &h, sizeof(h), 0) == (ssize_t)sizeof(h) && !memcmp(&h, &want, sizeof(h))) {
		good = sizeof(h);
		while (pread(j->fd, &r, sizeof(r), good) == (ssize_t)sizeof(r) &&
		       r.crc == rec_crc(&r)) {
			replay(ctx, &r);
			good += (off_t)sizeof(r);
			j->records++;
		}
	} else {
		/* Empty, another geometry or not a journal: start over. */
		good = 0;
	}
	if (ftruncate(j->fd, good) < 0 || lseek(j->fd, good, SEEK_SET) < 0 ||
	    (!good && (r2 = write_all(j->fd, &want, sizeof(want))) < 0)) {
		r2 = -errno;
		snprintf(err, errlen, "disk_index %s: %s", path, strerror(-r2));
		close(j->fd);
		j->fd = -1;
		return r2;
	}
	return 0;
}

void kv_journal_close(struct kv_journal *j)
{
	if (j->fd >= 0)
		close(j->fd);
	j->fd = -1;
}

int kv_journal_append(struct kv_journal *j, struct kv_jrec *r)
{
	int e = kv_fault(KV_FAULT_G3_INDEX);

	r->crc = rec_crc(r);
	if (e < 0 || (e = write_all(j->fd, r, sizeof(*r))) < 0) {
		j->errors++;
		return e;
	}
	j->records++;
	return 0;
}

int kv_journal_rewrite(struct kv_journal *j, int (*next)(void *ctx, struct kv_jrec *r), void *ctx)
{
	char tmp[sizeof(j->path) + 8];
	struct kv_jrec buf[256];
	struct jhdr h;
	uint64_t n = 0;
	int fd, r = 0, k = 0;

	snprintf(tmp, sizeof(tmp), "%s.new", j->path);
	fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	hdr_fill(&h, j);
	r = write_all(fd, &h, sizeof(h));
	while (!r && next(ctx, &buf[k])) {
		buf[k].crc = rec_crc(&buf[k]);
		n++;
		if (++k == 256) {
			r = write_all(fd, buf, sizeof(buf));
			k = 0;
		}
	}
	if (!r && k)
		r = write_all(fd, buf, (size_t)k * sizeof(buf[0]));
	if (!r && fsync(fd) < 0)
		r = -errno;
	if (!r && rename(tmp, j->path) < 0)
		r = -errno;
	if (r) {
		close(fd);
		unlink(tmp);
		j->errors++;
		return r;
	}
	close(j->fd);
	j->fd = fd;
	j->records = n;
	if (lseek(fd, 0, SEEK_END) < 0)
		return -errno;
	return 0;
}
