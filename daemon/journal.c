#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crc32c.h"
#include "fault.h"
#include "list.h"
#include "worker.h"

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
	j->newfd = -1;
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

static void tmp_path(const struct kv_journal *j, char *tmp, size_t len)
{
	snprintf(tmp, len, "%s.new", j->path);
}

void kv_journal_close(struct kv_journal *j)
{
	char tmp[sizeof(j->path) + 8];

	if (j->w)
		kv_journal_detach(j);
	if (j->fd >= 0)
		close(j->fd);
	j->fd = -1;
	if (j->newfd >= 0) {
		close(j->newfd);
		tmp_path(j, tmp, sizeof(tmp));
		unlink(tmp);
		j->newfd = -1;
	}
	free(j->stage);
	free(j->snap);
	j->stage = j->snap = NULL;
}

/* ---- asynchronous mode: batches of records for the worker ----------------- */

enum { JB_APPEND, JB_SNAP, JB_BEGIN, JB_END };

struct jbatch {
	struct kv_jctl c;
	uint32_t n, cap;
	struct kv_jrec r[];
};

/* Worker thread: writes what j's batch or control job says, in order. */
static void jrun(struct kv_job *job)
{
	struct kv_jctl *c = kv_container_of(job, struct kv_jctl, job);
	struct jbatch *b = (struct jbatch *)c;
	struct kv_journal *j = c->j;
	char tmp[sizeof(j->path) + 8];
	struct jhdr h;

	switch (c->kind) {
	case JB_APPEND:
		if (write_all(j->fd, b->r, b->n * sizeof(b->r[0])) < 0) {
			j->errors++;
			j->lost += b->n;
		} else
			j->records += b->n;
		j->unwritten -= b->n;
		/* During a compaction the new file gets them too. */
		/* fall through */
	case JB_SNAP:
		if (j->newfd >= 0 && !j->new_failed) {
			if (write_all(j->newfd, b->r, b->n * sizeof(b->r[0])) < 0)
				j->new_failed = 1;
			else
				j->new_records += b->n;
		}
		if (c->kind == JB_SNAP)
			free(b);   /* an append batch goes in jdone(), on the loop */
		break;
	case JB_BEGIN:
		tmp_path(j, tmp, sizeof(tmp));
		j->newfd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		j->new_failed = j->newfd < 0;
		j->new_records = 0;
		hdr_fill(&h, j);
		if (j->newfd >= 0 && write_all(j->newfd, &h, sizeof(h)) < 0)
			j->new_failed = 1;
		break;
	case JB_END:
		tmp_path(j, tmp, sizeof(tmp));
		if (j->newfd >= 0 && !j->new_failed && fsync(j->newfd) == 0 &&
		    rename(tmp, j->path) == 0) {
			close(j->fd);
			j->fd = j->newfd;
			j->records = j->new_records;
			j->covered = j->lost_begin;
		} else {
			j->errors++;
			if (j->newfd >= 0)
				close(j->newfd);
			unlink(tmp);
		}
		j->newfd = -1;
		j->new_failed = 0;
		atomic_store(&j->committed, 1);
		break;
	}
}

/* On the loop, after an append batch was written: the worker has written
 * the loop's eventfd for it, so that whoever waits for the journal's
 * pending records (kv_journal_pending(), counted in G3's in flight) wakes. */
static void jdone(struct kv_job *job)
{
	free(kv_container_of(job, struct kv_jctl, job));
}

/* Adds r to the batch at *bp (made or grown as needed). */
static int batch_add(struct kv_journal *j, struct jbatch **bp, int kind, const struct kv_jrec *r)
{
	struct jbatch *b = *bp;

	if (!b || b->n == b->cap) {
		uint32_t cap = b ? 2 * b->cap : 64;
		struct jbatch *nb = realloc(b, sizeof(*b) + (size_t)cap * sizeof(b->r[0]));

		if (!nb) {
			j->errors++;
			j->lost++;
			return -ENOMEM;
		}
		if (!b) {
			memset(nb, 0, sizeof(*nb));
			nb->c = (struct kv_jctl){ .job.run = jrun,
						  .job.done = kind == JB_APPEND ? jdone : NULL,
						  .j = j, .kind = kind };
		}
		nb->cap = cap;
		*bp = b = nb;
	}
	b->r[b->n++] = *r;
	return 0;
}

static void batch_submit(struct kv_journal *j, struct jbatch **bp)
{
	if (*bp) {
		if ((*bp)->c.kind == JB_APPEND)
			j->unwritten += (*bp)->n;
		kv_worker_submit(j->w, &(*bp)->c.job);
		*bp = NULL;
	}
}

void kv_journal_attach(struct kv_journal *j, struct kv_worker *w)
{
	j->w = w;
	j->begin = (struct kv_jctl){ .job.run = jrun, .j = j, .kind = JB_BEGIN };
	j->end = (struct kv_jctl){ .job.run = jrun, .j = j, .kind = JB_END };
}

void kv_journal_flush(struct kv_journal *j)
{
	if (j->w)
		batch_submit(j, &j->stage);
}

uint64_t kv_journal_pending(const struct kv_journal *j)
{
	return (j->stage ? j->stage->n : 0) + atomic_load(&j->unwritten);
}

void kv_journal_detach(struct kv_journal *j)
{
	if (!j->w)
		return;
	kv_journal_flush(j);
	kv_worker_wait_idle(j->w);
	/* A compaction without its end: its file goes in kv_journal_close(). */
	free(j->snap);
	j->snap = NULL;
	j->compacting = 0;
	j->w = NULL;
}

int kv_journal_append(struct kv_journal *j, struct kv_jrec *r)
{
	int e = kv_fault(KV_FAULT_G3_INDEX);

	r->crc = rec_crc(r);
	if (e < 0) {
		j->errors++;
		j->lost++;
		return e;
	}
	if (j->w)
		return batch_add(j, &j->stage, JB_APPEND, r);
	if ((e = write_all(j->fd, r, sizeof(*r))) < 0) {
		j->errors++;
		j->lost++;
		return e;
	}
	j->records++;
	return 0;
}

int kv_journal_behind(const struct kv_journal *j)
{
	return atomic_load(&j->lost) != atomic_load(&j->covered);
}

int kv_journal_compacting(struct kv_journal *j)
{
	if (j->compacting && atomic_load(&j->committed))
		j->compacting = 0;
	return j->compacting;
}

int kv_journal_compact_begin(struct kv_journal *j)
{
	if (!j->w)
		return -EINVAL;
	if (kv_journal_compacting(j))
		return -EBUSY;
	kv_journal_flush(j);
	atomic_store(&j->committed, 0);
	j->lost_begin = atomic_load(&j->lost);   /* the worker reads it at the end */
	j->compacting = 1;
	kv_worker_submit(j->w, &j->begin.job);
	return 0;
}

int kv_journal_compact_add(struct kv_journal *j, const struct kv_jrec *r)
{
	struct kv_jrec rec = *r;

	rec.crc = rec_crc(&rec);
	return batch_add(j, &j->snap, JB_SNAP, &rec);
}

void kv_journal_compact_push(struct kv_journal *j)
{
	/* After the appends made before this chunk was. */
	kv_journal_flush(j);
	batch_submit(j, &j->snap);
}

void kv_journal_compact_end(struct kv_journal *j)
{
	kv_journal_compact_push(j);
	kv_worker_submit(j->w, &j->end.job);
}

int kv_journal_rewrite(struct kv_journal *j, int (*next)(void *ctx, struct kv_jrec *r), void *ctx)
{
	char tmp[sizeof(j->path) + 8];
	struct kv_jrec buf[256];
	struct jhdr h;
	uint64_t n = 0, lost = atomic_load(&j->lost);
	int fd, r = 0, k = 0;

	tmp_path(j, tmp, sizeof(tmp));
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
	j->covered = lost;
	if (lseek(fd, 0, SEEK_END) < 0)
		return -errno;
	return 0;
}
