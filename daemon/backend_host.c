/* The host backend: segments are memfds. The daemon maps each one (for
 * copies); clients map the same memfd, so all see one set of bytes.
 *
 * A segment's size is sealed (F_SEAL_SHRINK | F_SEAL_GROW, then F_SEAL_SEAL)
 * before anyone else sees its fd: a client that could ftruncate the memfd it
 * was sent would make the daemon's next copy from or to that segment (CoW,
 * demotion, promotion) fault with SIGBUS. Its ftruncate now fails with EPERM.
 * Writes stay allowed: workers write their blocks through the same memfd.
 *
 * Asynchronous copies (demotion, promotion, swap) are memcpys on a worker
 * thread (worker.h), so that the event loop does not wait for megabytes to
 * move; the synchronous copy (Cow) stays on the caller's thread.
 *
 * The daemon's own mapping of a segment gets its page-table entries when a
 * pool is handed the pages (populate, MADV_POPULATE_WRITE on the worker
 * thread), not at its first copy from them: otherwise the first demotion of
 * freshly written blocks faults in the daemon once per 16 pages and runs at
 * about half of memcpy's speed (docs/benchmarks.md, (g)). The pages are
 * allocated then rather than at the client's first write; a segment never
 * handed to a pool still costs no memory.
 *
 * Each page is populated once per mapping (issue 38): a bitmap per segment
 * (one bit per 4 KiB page, made with the mapping and gone with it) says which
 * pages were already handed to MADV_POPULATE_WRITE, and a populate that finds
 * them all set asks the kernel for nothing. Without it, every run a pool
 * takes again after giving it back (a promotion into a pool that a demotion
 * just emptied) walked its page tables again on the copy thread, in front of
 * the copies: a quarter of that thread's time in a G2 -> G1 lookup of 256 KiB
 * blocks (docs/benchmarks.md, issue 38). The page-table entries of a shared
 * mapping stay until it is unmapped (the memfd is never punched), so a set
 * bit stays true; were the kernel to drop one, the next copy faults once,
 * as it would have without any populate.
 *
 * Plugged (plug(be, 1), issue 38), copy_async checks and accepts each batch
 * as always but holds it; the held batches go to the copy thread as one job
 * once KV_HOST_PLUG_BYTES are held or at plug(be, 0), and finish together: one
 * hand-off to the thread, one lock and one completion wakeup for all, in
 * place of one each. A lookup that promotes 1,024 blocks of 256 KiB from G2
 * made 1,024 jobs, and the loop woke for their completions 270-340 times
 * (one_wake's write, an IPI to the other CPU, a reap, and a rerun of the
 * lookup that walks the rest of the chain); plugged it makes 64 jobs and
 * about 60 wakeups (docs/benchmarks.md, issue 38). Each batch keeps its
 * own result and tag: a fault stops that batch alone. */
#include "backend.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "crc32c.h"
#include "fault.h"
#include "kvassert.h"
#include "list.h"
#include "log.h"
#include "quant.h"
#include "worker.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  /* Linux 5.14; older kernels say EINVAL */
#endif

struct host_seg {
	int fd;
	uint8_t *map;
	uint64_t *pop;              /* a bit per 4 KiB page of map: populated */
};

#define POP_PAGE 4096u

struct host_backend {
	struct kv_backend be;
	struct host_seg *segs;
	struct hbatch *fin;         /* finished batches not yet reaped */
	struct kv_worker wk;        /* does copy_async's memcpys; not started: inline */
	int no_populate;            /* the kernel has no MADV_POPULATE_WRITE */
	unsigned plugged;           /* plug() depth */
	struct hbatch *held;        /* plugged: batches not yet handed to wk, */
	struct hbatch **held_tail;  /* in copy_async's order */
	uint64_t held_bytes;
};

/* A copy_async batch for the worker: what to move, decided on the loop (the
 * segments and the faults), moved on the worker thread. */
struct hbatch {
	struct kv_job job;
	struct hbatch *next_fin;
	struct hbatch *next_held;   /* the next batch of the same job (plug) */
	struct host_backend *h;
	uint64_t tag;
	int res;
	uint32_t n;
	struct hmove {
		uint8_t *dst;
		const uint8_t *src;
		uint64_t len;        /* raw: the bytes; quantized: the device side's */
		uint32_t *crc;       /* D2H: kv_copy.crc */
		uint8_t qfmt, qdtype, dir;
	} m[];
};

static void host_seg_drop(struct host_backend *h, struct host_seg *s)
{
	if (s->map)
		munmap(s->map, h->be.segment_bytes);
	if (s->fd >= 0)
		close(s->fd);
	free(s->pop);
	s->pop = NULL;
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
	ns.fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (ns.fd < 0)
		return -errno;
	if (ftruncate(ns.fd, (off_t)be->segment_bytes) < 0 ||
	    fcntl(ns.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		r = -errno;
		goto err;
	}
	ns.map = mmap(NULL, be->segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ns.fd, 0);
	if (ns.map == MAP_FAILED) {
		ns.map = NULL;
		r = -errno;
		goto err;
	}
	ns.pop = calloc((be->segment_bytes / POP_PAGE + 63) / 64, sizeof(uint64_t));
	if (!ns.pop) {
		r = -ENOMEM;
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

/* Populating on the worker: the job owns itself. madvise is a system call,
 * so a segment recreated (unmapped) meanwhile makes it fail (ENOMEM), never
 * fault; a range mapped again at the same address is only populated early.
 * The memcpys of later batches queue behind it, which is what they would
 * wait for anyway: the same page faults. */
struct hpop {
	struct kv_job job;
	uint8_t *p;
	uint64_t len;
};

static void hpop_run(struct kv_job *j)
{
	struct hpop *w = kv_container_of(j, struct hpop, job);

	(void)madvise(w->p, w->len, MADV_POPULATE_WRITE);
	free(w);
}

/* Marks the pages of [off, off + len) (one segment's) populated; returns
 * the first and one past the last page that were not, first == end when
 * none. */
static void pop_mark(struct host_backend *h, uint64_t off, uint64_t len, uint64_t *first,
		     uint64_t *end)
{
	uint64_t *bits = h->segs[off / h->be.segment_bytes].pop;
	uint64_t o = off % h->be.segment_bytes, i;
	uint64_t a = o / POP_PAGE, z = (o + len + POP_PAGE - 1) / POP_PAGE;

	*first = *end = a;
	for (i = a; i < z; i++) {
		uint64_t m = 1ull << (i % 64);

		if (bits[i / 64] & m)
			continue;
		bits[i / 64] |= m;
		if (*first == *end)
			*first = i;
		*end = i + 1;
	}
}

static void host_populate(struct kv_backend *be, uint32_t dev, uint64_t off, uint64_t len)
{
	struct host_backend *h = (struct host_backend *)be;
	uint8_t *p = host_addr(h, off, len);
	uint64_t first, end;
	struct hpop *w;

	if (dev != 0 || !p || !len || h->no_populate)
		return;
	/* Only the span of pages not populated yet (usually all or none). */
	pop_mark(h, off, len, &first, &end);
	if (first == end)
		return;
	p = h->segs[off / be->segment_bytes].map + first * POP_PAGE;
	len = (end - first) * POP_PAGE;  /* segment_bytes is a multiple of 4 KiB */
	be->populated += len;
	if (!h->wk.started) {
		if (madvise(p, len, MADV_POPULATE_WRITE) < 0 && errno == EINVAL)
			h->no_populate = 1;  /* a kernel before 5.14 */
		return;
	}
	w = malloc(sizeof(*w));
	if (!w)
		return;  /* a hint: the first copy faults instead */
	*w = (struct hpop){ .job = { .run = hpop_run }, .p = p, .len = len };
	kv_worker_submit(&h->wk, &w->job);
}

/* G2 on the host backend is plain anonymous memory, locked where
 * RLIMIT_MEMLOCK allows (so it is never swapped), unlocked otherwise. Either
 * way its pages are there from the start, touched once (issue 38): mlock
 * faults them in, and where it is refused MADV_POPULATE_WRITE does, so the
 * first demotion into each page does not take a fault per 4 KiB page (on
 * this VM a first touch costs 5-10 times the copy of the page). Not huge
 * pages: MADV_HUGEPAGE made a daemon with a 1 GiB host tier take 2-5 times
 * longer to start here (the kernel compacts memory to find them), for no
 * copy measurably faster (issue 38, docs/benchmarks.md). */
static void *host_host_alloc(struct kv_backend *be, uint64_t bytes)
{
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	if (mlock(p, bytes) < 0)
		(void)madvise(p, bytes, MADV_POPULATE_WRITE);
	return p;
}

static void host_host_free(struct kv_backend *be, void *p, uint64_t bytes)
{
	if (p)
		munmap(p, bytes);
}

/* completion_fd is readable while finished batches wait for reap(). */
static void signal_done(struct host_backend *h)
{
	uint64_t one = 1;

	if (write(h->be.completion_fd, &one, sizeof(one)) < 0) {
		/* Cannot fail for a nonblocking eventfd below its maximum. */
	}
}

static void hbatch_run(struct kv_job *j)
{
	struct hbatch *b = kv_container_of(j, struct hbatch, job);

	for (uint32_t i = 0; i < b->n; i++) {
		const struct hmove *m = &b->m[i];
		size_t n = m->len / 2, q = kv_quant_bytes(n, KV_QUANT_GROUP);
		enum kv_qfmt f = (enum kv_qfmt)m->qfmt;
		enum kv_dtype t = (enum kv_dtype)m->qdtype;

		/* The formats were checked when the batch was made: no failure. */
		if (!f && m->crc) {
			*m->crc = kv_crc32c_copy(0, m->dst, m->src, m->len);
		} else if (!f) {
			memcpy(m->dst, m->src, m->len);
		} else if (m->dir == KV_COPY_D2H) {
			(void)kv_qfmt_quant(f, t, m->src, n, KV_QUANT_GROUP, m->dst, q);
			if (m->crc)   /* the q bytes just written, in cache */
				*m->crc = kv_crc32c(0, m->dst, q);
		} else {
			(void)kv_qfmt_dequant(f, t, m->src, q, n, KV_QUANT_GROUP, m->dst);
		}
	}
}

static void hbatch_done(struct kv_job *j)
{
	struct hbatch *b = kv_container_of(j, struct hbatch, job);

	b->next_fin = b->h->fin;
	b->h->fin = b;
}

/* A job of held batches (the first one's job): each moved in turn, then
 * each finished, in the order copy_async was given them. */
static void hheld_run(struct kv_job *j)
{
	for (struct hbatch *b = kv_container_of(j, struct hbatch, job); b; b = b->next_held)
		hbatch_run(&b->job);
}

static void hheld_done(struct kv_job *j)
{
	struct hbatch *b = kv_container_of(j, struct hbatch, job), *next;

	for (; b; b = next) {
		next = b->next_held;
		hbatch_done(&b->job);
	}
}

/* Hands the held batches to the copy thread as one job. */
static void host_unhold(struct host_backend *h)
{
	struct hbatch *first = h->held;

	if (!first)
		return;
	h->held = NULL;
	h->held_tail = &h->held;
	h->held_bytes = 0;
	if (first->next_held) {
		first->job.run = hheld_run;
		first->job.done = hheld_done;
	}
	kv_worker_submit(&h->wk, &first->job);
}

static void host_plug(struct kv_backend *be, int on)
{
	struct host_backend *h = (struct host_backend *)be;

	if (on) {
		h->plugged++;
		return;
	}
	kv_assert(h->plugged);
	if (!--h->plugged)
		host_unhold(h);
}

/* The bytes move on the worker thread (inline when it did not start); the
 * completion goes through completion_fd either way, as on cuda. Where each
 * copy goes and the faults are decided here: a fault stops the batch at that
 * copy (copy=short: half its bytes move, then the batch fails with EIO, as
 * a copy engine reports no partial transfers, only errors). */
static int host_copy_async(struct kv_backend *be, uint32_t dev, enum kv_copy_dir dir,
			   const struct kv_copy *c, uint32_t n, uint64_t tag)
{
	struct host_backend *h = (struct host_backend *)be;
	struct hbatch *b;
	int res = 0;
	uint32_t i;

	if (dev != 0)
		return -EINVAL;
	b = malloc(sizeof(*b) + (size_t)n * sizeof(b->m[0]));
	if (!b)
		return -ENOMEM;
	for (i = 0; i < n && !res; i++) {
		uint8_t *d = host_addr(h, c[i].dev_off, c[i].len);
		struct hmove *m = &b->m[i];

		if (!d) {
			res = -EINVAL;
			break;
		}
		if (!kv_copy_qvalid(dir, &c[i])) {
			res = -EINVAL;
			break;
		}
		res = kv_fault(KV_FAULT_COPY);
		if (res < 0)
			break;
		m->qfmt = c[i].qfmt;
		m->qdtype = c[i].qdtype;
		m->dir = (uint8_t)dir;
		m->len = c[i].len;
		m->crc = dir == KV_COPY_D2H ? c[i].crc : NULL;
		if (res == KV_FAULT_SHORT) {
			/* Half of the smaller side, raw: a torn copy either way. */
			if (m->qfmt && kv_quant_bytes(m->len / 2, KV_QUANT_GROUP) < m->len)
				m->len = kv_quant_bytes(m->len / 2, KV_QUANT_GROUP);
			m->len /= 2;
			m->qfmt = 0;
		}
		if (dir == KV_COPY_D2H) {
			m->dst = c[i].host;
			m->src = d;
		} else if (dir == KV_COPY_H2D) {
			m->dst = d;
			m->src = c[i].host;
		} else {
			m->dst = d;
			m->src = host_addr(h, c[i].src_off, c[i].len);
			if (!m->src) {
				res = -EINVAL;
				break;
			}
		}
		if (res == KV_FAULT_SHORT) {
			res = -EIO;
			i++;
			break;
		}
	}
	*b = (struct hbatch){ .job = { .run = hbatch_run, .done = hbatch_done }, .h = h,
			      .tag = tag, .res = res, .n = i };
	if (h->wk.started && h->plugged) {
		*h->held_tail = b;
		h->held_tail = &b->next_held;
		for (uint32_t k = 0; k < b->n; k++)
			h->held_bytes += b->m[k].len;
		if (h->held_bytes >= KV_HOST_PLUG_BYTES)
			host_unhold(h);
	} else if (h->wk.started) {
		kv_worker_submit(&h->wk, &b->job);
	} else {
		hbatch_run(&b->job);
		hbatch_done(&b->job);
		signal_done(h);
	}
	return 0;
}

static int host_reap(struct kv_backend *be, struct kv_copy_done *done, int max)
{
	struct host_backend *h = (struct host_backend *)be;
	uint64_t v;
	int n = 0;

	/* Cleared first: a batch that finishes after this makes it readable
	 * again. */
	if (!h->wk.started && read(be->completion_fd, &v, sizeof(v)) < 0) {
		/* EAGAIN: already clear */
	}
	kv_worker_reap_clear(&h->wk);
	while (n < max && h->fin) {
		struct hbatch *b = h->fin;

		h->fin = b->next_fin;
		done[n++] = (struct kv_copy_done){ .tag = b->tag, .res = b->res };
		free(b);
	}
	if (h->fin)
		signal_done(h);  /* more to take */
	return n;
}

static void host_destroy(struct kv_backend *be)
{
	struct host_backend *h = (struct host_backend *)be;
	uint32_t i;

	/* The last copies finish before their memory goes. */
	host_unhold(h);
	kv_worker_stop(&h->wk);
	while (h->fin) {
		struct hbatch *b = h->fin;

		h->fin = b->next_fin;
		free(b);
	}
	for (i = 0; h->segs && i < be->segments[0]; i++)
		host_seg_drop(h, &h->segs[i]);
	free(h->segs);
	free(be->epoch[0]);
	if (be->completion_fd >= 0)
		close(be->completion_fd);
	free(h);
}

static const struct kv_backend_ops host_ops = {
	.segment_create = host_segment_create,
	.segment_fd = host_segment_fd,
	.copy = host_copy,
	.populate = host_populate,
	.host_alloc = host_host_alloc,
	.host_free = host_host_free,
	.copy_async = host_copy_async,
	.plug = host_plug,
	.reap = host_reap,
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
	h->be.quant = 1;
	h->be.crc = 1;
	h->be.devices = 1;
	h->be.segment_bytes = seg_bytes;
	h->be.segments[0] = nseg;
	h->held_tail = &h->held;
	h->segs = calloc(nseg, sizeof(*h->segs));
	for (i = 0; h->segs && i < nseg; i++)
		h->segs[i].fd = -1;
	h->be.epoch[0] = calloc(nseg, sizeof(uint32_t));
	h->be.completion_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (!h->segs || !h->be.epoch[0] || h->be.completion_fd < 0) {
		r = h->be.completion_fd < 0 ? -errno : -ENOMEM;
		host_destroy(&h->be);
		return r;
	}
	for (i = 0; i < nseg; i++) {
		r = host_segment_create(&h->be, 0, i);
		if (r < 0) {
			host_destroy(&h->be);
			return r;
		}
	}
	/* Without the thread, copies happen inline: slower, not wrong. */
	if (kv_worker_start(&h->wk, h->be.completion_fd) < 0)
		kv_warn("host backend: no copy thread; copies run inline");
	else
		h->wk.one_wake = 1;  /* host_reap() clears completion_fd through reap_clear */
	*out = &h->be;
	return 0;
}
