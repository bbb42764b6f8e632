/* G4's writes: which blocks go, the write pool, the batches the write
 * thread sends (the tier as a whole: remote.c).
 *
 * Write: tier_writeback_start() asks remote_want() whether the block goes
 * to G4 too (G4 on, the namespace has remote = yes, the block did not come
 * from G4, room under remote_max_inflight: reserved then, and a value
 * buffer taken from the write pool); the write-back's checksum job, on the
 * tier's worker thread while the slot is busy, copies header and payload
 * into that buffer (remote_copy()); back on the loop the buffer joins the
 * pending writes, which go out as one batch per write job (pipelined to
 * every master at once), a job per write thread per client (G4_WRITERS:
 * the next batch goes out while one waits for its last replies, while both
 * are under WRITE_PIPE_BYTES), in the client's own jobs (fixed arrays:
 * nothing allocated per batch). A write made from a G2
 * slot (remote_put()) is sealed on the worker: at demotion sent from the
 * slot itself, held BUSY_G4 until the SET is answered (no copy, no buffer
 * of the pool; issue 38), otherwise copied into a buffer on the loop. At
 * demotion on the host backend the copy into the slot summed it already
 * (tier_remote_put_sum()): the worker only tags it, or, without a tag, it
 * goes to its write thread with no seal job.
 *
 * Write buffers (issue 28): a value's buffer goes back to the write pool
 * when its SET is answered (or the write is dropped), and the next write
 * of that length takes it, pages mapped, instead of a malloc() per value
 * that glibc hands back to the kernel at each free() (128 KiB or more is
 * an mmap() of its own). Classes of one exact length (a pool's values all
 * have one), at most WPOOL_CLASSES, the one used longest ago making room;
 * a buffer is kept only while the pool's idle bytes and the bytes reserved
 * in flight stay within remote_max_inflight, and a new one is made only
 * after idle ones of other lengths go to make that hold, so G4's write
 * buffers, in use or idle, never hold more than that. The pool is
 * the loop's alone: buffers are taken in remote_want() and given back in
 * write_done(), seal_done(), or where a write is dropped (remote_want(),
 * remote_queue(), remote_put()), all on the loop; the
 * worker and the write thread only fill and read the buffers they were
 * handed (the worker may free() one whose tag failed: it never reaches
 * the pool). The fault point g4_buf (fault.h) fails the taking: the write
 * is dropped and counted, as an allocation failure is. */
#include "remote_int.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "crc32c.h"
#include "fault.h"
#include "g4mac.h"
#include "kvclock.h"
#include "log.h"

/* ---- the writes' timeline (KVCACHED_G4_TRACE; kvg4rate's KVG4_TRACE) ---- */

/* With $KVCACHED_G4_TRACE naming a file, every step of a write is stamped
 * into it (issue 38: where a 16 KiB write pass waits): a header whose first
 * 8 bytes count the events, then TRACE_MAX events of struct g4_tev, shared
 * mapped, so a reader sees them as they come; past TRACE_MAX nothing more
 * is stamped. A developer's instrument: off (one branch per step) unless
 * the variable is set at start; the file is made by whoever starts the
 * daemon, never by a client. The loop and the write threads all stamp (an
 * atomic count); a write job's events carry its write thread in n's top
 * 8 bits. */
#define TRACE_MAX (1u << 20)
#define TRACE_HDR 64

enum { TEV_PUT = 1, TEV_SEAL_SUB, TEV_SEAL_DONE, TEV_W_SUB, TEV_W_START, TEV_W_END,
       TEV_W_DONE };

struct g4_tev {
	uint64_t ns;
	uint32_t kind, n;
};

static struct {
	int state;                 /* 0: not looked; 1: on; -1: off */
	_Atomic uint64_t *count;
	struct g4_tev *ev;
} trace;

/* Loop: opens the trace file the first time (before any write job exists,
 * so the write thread sees trace.ev set by the job's hand-off). */
static void trace_open(void)
{
	const char *path = getenv("KVCACHED_G4_TRACE");
	size_t len = TRACE_HDR + (size_t)TRACE_MAX * sizeof(struct g4_tev);
	void *m;
	int fd;

	trace.state = -1;
	if (!path || !path[0])
		return;
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0 || ftruncate(fd, (off_t)len) < 0 ||
	    (m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		kv_warn("KVCACHED_G4_TRACE %s: cannot map it; no trace", path);
		if (fd >= 0)
			close(fd);
		return;
	}
	close(fd);
	trace.count = m;
	trace.ev = (struct g4_tev *)((uint8_t *)m + TRACE_HDR);
	trace.state = 1;
	kv_info("G4: the writes' timeline goes to %s", path);
}

static void tev(uint32_t kind, uint32_t n)
{
	uint64_t i;

	if (!trace.ev)
		return;
	i = atomic_load_explicit(trace.count, memory_order_relaxed);
	if (i >= TRACE_MAX)
		return;
	i = atomic_fetch_add(trace.count, 1);
	if (i < TRACE_MAX)
		trace.ev[i] = (struct g4_tev){ kv_mono_ns(), kind, n };
}

/* ---- the write pool (loop only) ------------------------------------------ */

/* A buffer of len bytes for a G4 value: a kept one of that length, else a
 * new one; NULL when there is none (malloc, or the fault point g4_buf). */
static uint8_t *wbuf_get(struct kv_g4 *g, size_t len)
{
	if (kv_fault(KV_FAULT_G4_BUF))
		return NULL;
	for (unsigned i = 0; i < WPOOL_CLASSES; i++) {
		struct g4_wclass *c = &g->wpool[i];
		void *b = c->head;

		if (c->len != len || !b)
			continue;
		memcpy(&c->head, b, sizeof(void *));
		c->used = ++g->wpool_tick;
		g->wpool_bytes -= len;
		return b;
	}
	/* A new one: idle buffers of other lengths go first, those used
	 * longest ago, while they and the bytes in flight and this one would
	 * pass remote_max_inflight. */
	while (g->wpool_bytes && g->wpool_bytes + g->inflight + len > g->max_inflight) {
		struct g4_wclass *lru = NULL;
		void *b;

		for (unsigned i = 0; i < WPOOL_CLASSES; i++)
			if (g->wpool[i].head && (!lru || g->wpool[i].used < lru->used))
				lru = &g->wpool[i];
		b = lru->head;
		memcpy(&lru->head, b, sizeof(void *));
		g->wpool_bytes -= lru->len;
		free(b);
	}
	return malloc(len);
}

void tier_g4_wclass_drop(struct kv_g4 *g, struct g4_wclass *c)
{
	while (c->head) {
		void *b = c->head;

		memcpy(&c->head, b, sizeof(void *));
		g->wpool_bytes -= c->len;
		free(b);
	}
	c->len = 0;
}

/* Gives back buf (len bytes, from wbuf_get(); NULL: nothing), once its
 * bytes no longer count in g->inflight: kept while the idle bytes and the
 * bytes in flight stay within remote_max_inflight, else freed. */
static void wbuf_put(struct kv_g4 *g, uint8_t *buf, size_t len)
{
	struct g4_wclass *c = NULL, *spare = NULL;

	if (!buf)
		return;
	if (g->wpool_bytes + g->inflight + len > g->max_inflight) {
		free(buf);
		return;
	}
	for (unsigned i = 0; i < WPOOL_CLASSES; i++) {
		struct g4_wclass *x = &g->wpool[i];

		if (x->len == len) {
			c = x;
			break;
		}
		/* An unused class, else the one used longest ago. */
		if (!spare || (spare->len && (!x->len || x->used < spare->used)))
			spare = x;
	}
	if (!c) {
		c = spare;
		tier_g4_wclass_drop(g, c);
		c->len = len;
	}
	memcpy(buf, &c->head, sizeof(void *));
	c->head = buf;
	c->used = ++g->wpool_tick;
	g->wpool_bytes += len;
	kv_assert(g->wpool_bytes + g->inflight <= g->max_inflight);
}

/* ---- the writes' structs (loop only) ------------------------------------ */

/* A write's struct, zeroed: an idle one of the loop's list, else a new
 * one; NULL when there is none. The list (at most WFREE_MAX) spares the
 * loop a calloc() and free() per write (issue 38: with the structs of a
 * pass freed at its end, glibc gave the heap's top back to the kernel and
 * the next pass faulted it in again: _int_malloc and the page faults were
 * about a third of the loop's samples in kvg4rate's 16 KiB writes). */
static struct g4_write *write_new(struct kv_g4 *g)
{
	struct g4_write *w = g->wfree;

	if (!w)
		return calloc(1, sizeof(*w));
	g->wfree = w->next;
	g->nwfree--;
	*w = (struct g4_write){ 0 };
	return w;
}

static void write_put(struct kv_g4 *g, struct g4_write *w)
{
	if (g->nwfree >= WFREE_MAX) {
		free(w);
		return;
	}
	w->next = g->wfree;
	g->wfree = w;
	g->nwfree++;
}

void tier_g4_wfree_drop(struct kv_g4 *g)
{
	while (g->wfree) {
		struct g4_write *w = g->wfree;

		g->wfree = w->next;
		free(w);
	}
	g->nwfree = 0;
}

/* ---- writes ------------------------------------------------------------- */

/* Whether len bytes may go out now under remote_write_rate (a token bucket
 * of one second's worth) and the namespace's quota_g4 (bytes per remote_ttl,
 * so about what it may hold in the cluster: every key expires after it);
 * takes them if so. */
static int write_allowed(struct kv_tiers *t, struct kv_ns *m, uint64_t len)
{
	struct kv_g4 *g = t->g4;
	uint64_t now = kv_mono_ms(), rate = t->cfg.remote_write_rate;

	if (rate) {
		g->tokens += (now - g->tokens_ms) * rate / 1000;
		if (g->tokens > rate)
			g->tokens = rate;
		g->tokens_ms = now;
		if (g->tokens < len)
			return 0;
	}
	if (m->lim.quota_g4) {
		if (now - m->g4_since >= t->cfg.remote_ttl_ms) {
			m->g4_since = now;
			m->g4_bytes = 0;
		}
		if (m->g4_bytes + len > m->lim.quota_g4)
			return 0;
		m->g4_bytes += len;
	}
	if (rate)
		g->tokens -= len;
	return 1;
}

/* tier_remote_want(), and a buffer from the write pool in tb->g4_buf when
 * buf (a write sent from its G2 slot needs none: the room it reserves is
 * the slot's, held until the reply). */
static int remote_want(struct kv_tiers *t, struct tblock *tb, int when, int buf)
{
	struct kv_g4 *g = t->g4;
	struct kv_ns *m = kv_ns_get(kv_pools_nstab(t->ps), tb->pool->ns);
	uint64_t len;
	int mode;

	if (!g || t->stopping || tb->g4_ok || !m || !m->lim.remote)
		return 0;
	mode = m->lim.remote_write ? m->lim.remote_write : g->mode;
	/* writeback's moments come to a demote namespace too: what was not
	 * written at demotion (throttled, full) gets a second chance. */
	if (mode == KV_G4W_OFF || (when == KV_G4W_DEMOTE && mode != KV_G4W_DEMOTE))
		return 0;
	tb->g4_key = tier_g4_mac_key_of(t, tb->pool->ns);
	len = tier_g4_value_len(tb->pool, tb->g4_key);
	tb->g4_buf = NULL;
	if (g->inflight + len > g->max_inflight || (buf && !(tb->g4_buf = wbuf_get(g, len)))) {
		g->st.dropped++;
		return 0;
	}
	if (!write_allowed(t, m, len)) {
		wbuf_put(g, tb->g4_buf, len);
		tb->g4_buf = NULL;
		g->st.throttled++;
		return 0;
	}
	g->inflight += len;
	return 1;
}

int tier_remote_want(struct kv_tiers *t, struct tblock *tb, int when)
{
	return remote_want(t, tb, when, 1);
}

/* Worker thread: fills the buffer remote_want() took on the loop; a
 * buffer whose tag fails is freed here (plain free(): the pool is the
 * loop's, and this buffer simply never goes back to it). */
void tier_remote_copy(struct tblock *tb, const uint8_t *slot)
{
	struct slot_hdr h;
	size_t len;

	memcpy(&h, slot, sizeof(h));
	len = sizeof(h) + h.payload_len;
	memcpy(tb->g4_buf, &h, sizeof(h));
	memcpy(tb->g4_buf + sizeof(h), slot + HDR_BYTES, h.payload_len);
	if (tb->g4_key && kv_g4mac_tag(tb->g4_key, tb->g4_buf, len, tb->g4_buf + len) < 0) {
		free(tb->g4_buf);   /* not written: counted as dropped */
		tb->g4_buf = NULL;
	}
}

static void write_run(struct kv_job *j)
{
	struct g4_wjob *w = kv_container_of(j, struct g4_wjob, job);
	struct kv_g4 *g = w->t->g4;
	struct g4_write *x;
	uint32_t i = 0;

	tev(TEV_W_START, w->k << 24 | w->n);
	for (x = w->list; x; x = x->next, i++) {
		struct kv_rc_dst *d = &w->vals[i];

		w->keys[i] = (struct kv_rc_key){ .data = x->key, .len = x->keylen };
		if (x->buf) {
			*d = (struct kv_rc_dst){ .part = { { x->buf, x->len } }, .nparts = 1 };
		} else {
			/* Sent from its G2 slot, held until this call returns. */
			size_t pl = x->len - sizeof(x->head) - (x->mac_key ? sizeof(x->tag) : 0);

			*d = (struct kv_rc_dst){ .part = { { x->head, sizeof(x->head) },
							   { (void *)x->slot, pl },
							   { x->tag, sizeof(x->tag) } },
						 .nparts = x->mac_key ? 3 : 2 };
		}
	}
	if (kv_rc_set_parts(g->cl[w->cl].wr[w->k], w->n, w->keys, w->vals, g->ttl_s, w->status) >= 0)
		for (i = 0; i < w->n; i++)
			w->ok += w->status[i] == KV_RC_OK;
	tev(TEV_W_END, w->k << 24 | w->n);
	kv_rc_stats(g->cl[w->cl].wr[w->k], &w->rc);
	if (w->ok < w->n)   /* on the write thread: its client's error, before the next job */
		snprintf(w->why, sizeof(w->why), "%s", kv_rc_last_error(g->cl[w->cl].wr[w->k]));
}

static void write_flush(struct kv_tiers *t, uint32_t cl);

/* Loop: a write sent from its G2 slot is over (answered, failed, dropped,
 * or the stop): the slot is released, back on its LRU, or freed if a seal,
 * a promotion or a reload killed the block meanwhile. */
static void write_release(struct kv_tiers *t, struct g4_write *x)
{
	if (!x->tb)
		return;
	tb_busy_clear(t, x->tb, BUSY_G4);
	t->g4->held--;
	x->tb = NULL;
	x->slot = NULL;
}

void tier_g4_write_free(struct kv_tiers *t, struct g4_write *x)
{
	write_release(t, x);
	free(x->buf);
	free(x);
}

static void write_done(struct kv_job *j)
{
	struct g4_wjob *w = kv_container_of(j, struct g4_wjob, job);
	struct kv_g4 *g = w->t->g4;

	tev(TEV_W_DONE, w->k << 24 | w->n);
	g->st.writes += w->ok;
	g->st.write_errors += w->n - w->ok;
	g->cl[w->cl].wr_st[w->k] = w->rc;
	if (w->ok < w->n)
		kv_debug("G4: %u of a batch of %u writes failed; the cluster client's first error: %s",
			 w->n - w->ok, w->n, w->why);
	while (w->list) {
		struct g4_write *x = w->list;

		w->list = x->next;
		g->st.bytes_out += x->len;
		g->inflight -= x->len;
		write_release(w->t, x);
		wbuf_put(g, x->buf, x->len);
		write_put(g, x);
	}
	g->cl[w->cl].writing &= ~(1u << w->k);
	write_flush(w->t, w->cl);
}

/* Whether a job of bytes may go out beside client c's jobs in flight: none
 * is, or it and each of them are under WRITE_PIPE_BYTES. */
static int write_pipe_ok(const struct g4_client *c, uint64_t bytes)
{
	for (uint32_t k = 0; k < G4_WRITERS; k++)
		if ((c->writing & (1u << k)) && (c->wj[k]->bytes >= WRITE_PIPE_BYTES ||
						 bytes >= WRITE_PIPE_BYTES))
			return 0;
	return 1;
}

/* Hands what client cl has pending to the write threads, a job of up to
 * WRITE_BATCH to each that has none of this client's, so that its writes
 * wait in one list and go out together, and its next batch goes out while
 * the one before waits for its last replies (G4_WRITERS, while the batches
 * are short: WRITE_PIPE_BYTES). */
static void write_flush(struct kv_tiers *t, uint32_t cl)
{
	struct g4_client *c = &t->g4->cl[cl];

	for (uint32_t k = 0; k < G4_WRITERS && c->pending && !t->stopping; k++) {
		struct g4_wjob *w = c->wj[k];
		struct g4_write **tail;
		uint32_t n = 0;
		uint64_t bytes = 0;

		if (c->writing & (1u << k))
			continue;
		for (tail = &c->pending; *tail && n < WRITE_BATCH; tail = &(*tail)->next) {
			bytes += (*tail)->len;
			n++;
		}
		if (!write_pipe_ok(c, bytes))
			return;
		w->t = t;
		w->cl = cl;
		w->k = k;
		w->n = n;
		w->ok = 0;
		w->bytes = bytes;
		w->list = c->pending;
		c->pending = *tail;
		*tail = NULL;
		if (!c->pending)
			c->pending_tail = &c->pending;
		c->writing |= 1u << k;
		w->job.run = write_run;
		w->job.done = write_done;
		tev(TEV_W_SUB, k << 24 | w->n);
		kv_worker_submit(&t->g4->ww[k], &w->job);
	}
}

void tier_remote_queue(struct kv_tiers *t, struct tblock *tb)
{
	struct kv_g4 *g = t->g4;
	uint64_t len = tier_g4_value_len(tb->pool, tb->g4_key);
	struct g4_write *w;

	if (!trace.state)
		trace_open();
	if (!tb->g4_buf || t->stopping || !(w = write_new(g))) {
		g->inflight -= len;
		wbuf_put(g, tb->g4_buf, len);
		tb->g4_buf = NULL;
		g->st.dropped++;
		return;
	}
	w->keylen = tier_g4_key_of(t, tb->pool, tb->ix.hash, w->key);
	w->buf = tb->g4_buf;
	w->len = len;
	w->cl = tier_g4_client_of(t, tb->pool->ns);
	tb->g4_buf = NULL;
	tb->g4_ok = 1;   /* written once */
	*g->cl[w->cl].pending_tail = w;
	g->cl[w->cl].pending_tail = &w->next;
	write_flush(t, w->cl);
}

/* A write made from a G2 slot (remote_write = demote, a block G2 drops
 * without G3, a flush without G3): its checksums and tag are the tier's
 * worker's, in a seal job of up to SEAL_BATCH writes (seal_flush()). At
 * demotion the value is not copied at all (issue 38: the copy was the
 * loop's, 45% of its time in the profile of kvg4rate's writes, then the
 * worker's): the worker sums the payload where it lies in the slot, which
 * BUSY_G4 holds until the SET is answered (write_done()), and makes the
 * header and tag the write thread sends around it; otherwise the loop
 * copied it into w->buf, and the tblock may be gone by then. A buffer whose
 * tag fails is freed on the worker (see tier_remote_copy()). */
static void seal_one(struct g4_write *w)
{
	struct slot_hdr h;
	size_t body;

	if (!w->buf) {
		memcpy(&h, w->head, sizeof(h));
		if (!w->summed) {
			slot_hdr_seal(&h, kv_crc32c(0, w->slot, h.payload_len));
			memcpy(w->head, &h, sizeof(h));
		}
		w->sealed = !w->mac_key || kv_g4mac_tag2(w->mac_key, w->head, sizeof(h), w->slot,
							  h.payload_len, w->tag) == 0;
		return;
	}
	memcpy(&h, w->buf, sizeof(h));
	body = sizeof(h) + h.payload_len;
	slot_hdr_seal(&h, kv_crc32c(0, w->buf + sizeof(h), h.payload_len));
	memcpy(w->buf, &h, sizeof(h));
	if (w->mac_key && kv_g4mac_tag(w->mac_key, w->buf, body, w->buf + body) < 0) {
		free(w->buf);   /* not written: counted as dropped */
		w->buf = NULL;
		return;
	}
	w->sealed = 1;
}

static void seal_run(struct kv_job *j)
{
	struct g4_sjob *s = kv_container_of(j, struct g4_sjob, job);

	for (struct g4_write *w = s->list; w; w = w->next)
		seal_one(w);
}

static void seal_flush(struct kv_tiers *t);

/* Loop: each write of the batch joins its client's pending writes, or is
 * dropped (its tag failed, or the stop). */
static void seal_done(struct kv_job *j)
{
	struct g4_sjob *s = kv_container_of(j, struct g4_sjob, job);
	struct kv_tiers *t = s->t;
	struct kv_g4 *g = t->g4;
	struct g4_write *list = s->list;

	s->list = NULL;
	g->sealing--;
	tev(TEV_SEAL_DONE, 0);
	while (list) {
		struct g4_write *w = list;

		list = w->next;
		w->next = NULL;
		if (!w->sealed || t->stopping) {
			g->inflight -= w->len;
			write_release(t, w);
			wbuf_put(g, w->buf, w->len);
			g->st.dropped++;
			write_put(g, w);
			continue;
		}
		*g->cl[w->cl].pending_tail = w;
		g->cl[w->cl].pending_tail = &w->next;
	}
	for (uint32_t cl = 0; cl < g->ncl; cl++)
		write_flush(t, cl);
	seal_flush(t);
}

/* Hands the writes waiting to be sealed to the tier's worker, SEAL_BATCH
 * to a job, while fewer than SEAL_JOBS are in flight: one at once when
 * the worker is idle (no wait for a batch to fill), the rest batched
 * behind it. */
static void seal_flush(struct kv_tiers *t)
{
	struct kv_g4 *g = t->g4;

	if (g->seal_flushing)
		return;   /* a job run at once (tier_offload() without a worker) */
	g->seal_flushing = 1;
	while (g->seal_q && g->sealing < SEAL_JOBS && !t->stopping) {
		struct g4_sjob *s = &g->sj[0];
		struct g4_write **tail = &g->seal_q;
		uint32_t n = 0;

		for (uint32_t k = 1; s->list && k < SEAL_JOBS; k++)
			s = &g->sj[k];
		kv_assert(!s->list);
		while (*tail && n < SEAL_BATCH) {
			tail = &(*tail)->next;
			n++;
		}
		s->t = t;
		s->list = g->seal_q;
		g->seal_q = *tail;
		*tail = NULL;
		if (!g->seal_q)
			g->seal_tail = &g->seal_q;
		g->sealing++;
		tev(TEV_SEAL_SUB, n);
		tier_offload(t, &s->job, seal_run, seal_done);
	}
	g->seal_flushing = 0;
}

void tier_g4_seal_drop(struct kv_tiers *t)
{
	struct kv_g4 *g = t->g4;

	while (g->seal_q) {
		struct g4_write *w = g->seal_q;

		g->seal_q = w->next;
		g->inflight -= w->len;
		tier_g4_write_free(t, w);   /* its held G2 slot, if any, released */
	}
	g->seal_tail = &g->seal_q;
}

uint64_t tier_remote_held(const struct kv_tiers *t)
{
	return t->g4 ? t->g4->held : 0;
}

int tier_remote_demotes(struct kv_tiers *t, const struct kv_pool *p)
{
	struct kv_ns *m;

	if (!t->g4 || t->stopping)
		return 0;
	m = kv_ns_get(kv_pools_nstab(t->ps), p->ns);
	return m && m->lim.remote &&
	       (m->lim.remote_write ? m->lim.remote_write : t->g4->mode) == KV_G4W_DEMOTE;
}

int tier_remote_put(struct kv_tiers *t, struct tblock *tb, int when)
{
	return tier_remote_put_sum(t, tb, when, NULL);
}

int tier_remote_put_sum(struct kv_tiers *t, struct tblock *tb, int when, const uint32_t *crc)
{
	struct kv_g4 *g = t->g4;
	struct g4_write *w;
	struct slot_hdr h;
	const uint8_t *slot;
	uint64_t len;
	/* At demotion it stays in G2: sent from its slot, held. */
	int held = when == KV_G4W_DEMOTE && !tb->busy;

	if (!trace.state)
		trace_open();
	if (!tb->run[L2] || !remote_want(t, tb, when, !held))
		return 0;
	len = tier_g4_value_len(tb->pool, tb->g4_key);
	if (!(w = write_new(g))) {
		g->inflight -= len;
		wbuf_put(g, tb->g4_buf, len);
		tb->g4_buf = NULL;
		g->st.dropped++;
		return 0;
	}
	w->buf = tb->g4_buf;
	tb->g4_buf = NULL;
	slot_hdr_fill(t, tb, &h, 0);
	slot = tier_g2_addr(t, tb->run[L2], tb->slot[L2]) + HDR_BYTES;
	if (held) {
		tb_busy_set(tb, BUSY_G4);
		g->held++;
		w->tb = tb;
		w->slot = slot;
		if (crc) {   /* summed by the demotion's copy */
			slot_hdr_seal(&h, *crc);
			w->summed = 1;
		}
		memcpy(w->head, &h, sizeof(h));
	} else {
		memcpy(w->buf, &h, sizeof(h));
		memcpy(w->buf + sizeof(h), slot, h.payload_len);
	}
	w->keylen = tier_g4_key_of(t, tb->pool, tb->ix.hash, w->key);
	w->len = len;
	w->cl = tier_g4_client_of(t, tb->pool->ns);
	tb->g4_ok = 1;   /* written once */
	w->mac_key = tb->g4_key;
	tev(TEV_PUT, 1);
	if (w->summed && !w->mac_key) {
		/* Nothing for the worker: straight to its client's writes. */
		w->sealed = 1;
		*g->cl[w->cl].pending_tail = w;
		g->cl[w->cl].pending_tail = &w->next;
		write_flush(t, w->cl);
		return 1;
	}
	*g->seal_tail = w;
	g->seal_tail = &w->next;
	seal_flush(t);
	return 1;
}
