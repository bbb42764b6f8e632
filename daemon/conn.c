/* Connections: framing, output, fds; see conn.h. Over 800 lines, on
 * purpose: input, output, the sweep and close all read and set the flags of
 * struct kv_conn that conn.h's drawing ties together (conn_assert_state());
 * a split would have to expose the struct and its rules to each part. */
#include "conn.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cache.h"
#include "frame.h"
#include "kvassert.h"
#include "kvcached.pb-c.h"
#include "lifecycle.h"
#include "log.h"
#include "ops.h"
#include "pbcheck.h"
#include "pbvarint.h"

/* The input buffer: READ_CHUNK when a frame starts, then grown by half of
 * what has arrived (so a frame announced as 4 MiB but never sent costs only
 * the bytes that were), and freed when it empties past READ_CHUNK. */
#define READ_CHUNK 65536
#define READ_MIN 4096             /* the least room a read is given */
/* Output a peer has not read yet is bounded by max_output_per_connection:
 * past it the connection is paused (its input left unread) until the peer
 * reads, so what is queued exceeds the bound by one reply at most. The
 * buffer is freed once sent when it grew past OUT_KEEP. */
#define OUT_KEEP 65536

/* struct kv_conn's magic while it is allocated (conn_of() checks it). */
#define CONN_MAGIC 0x6b76636eu
/* A frame may decode to at most DECODE_FACTOR times its size plus
 * DECODE_SLACK bytes (kv_pb_decode_cost(), checked before unpacking: protobuf-c
 * builds every sub-message before anything can look at a count). An honest
 * request estimates at 1-5x (a Seal with one short extra key per block and no
 * token ids: 4.6x; docs/operations.md section 13); a frame of millions of
 * empty sub-messages would decode to ~45x in ~0.3 s of the loop. */
#define DECODE_FACTOR 16
#define DECODE_SLACK (1u << 20)

/* The states and their flags are drawn in conn.h. */
struct kv_conn {
	struct kv_session ss;
	uint32_t magic;            /* CONN_MAGIC */
	struct kv_conns *cs;
	struct kv_list link;       /* cs->closing while CLOSING */
	int fd;
	int closing;
	int paused;                /* input held back until output drains */
	int parked;                /* the first frame in waits for a tier */
	int fds_held;              /* the first frame in waits for the peer to
				    * read the segment fds it was sent (KV_OP_HOLD) */
	int send_blocked;          /* sendmsg failed for want of a resource;
				    * the sweep tries again */
	int resume;                /* the sweep is to run its input again */
	int lingering;             /* no more input: closes once its output is
				    * sent, or frame_timeout after linger_ms */
	char linger_why[160];      /* what conn_close() logs then; "" nothing */
	uint64_t linger_ms;
	struct kv_loop_watch win, wout;
	uint8_t *in;
	size_t in_len, in_cap;
	/* Monotonic ms when the incomplete frame first in `in` began to
	 * arrive; 0 when there is none, or while input is held back (the
	 * frame waits for us then, not for the peer). */
	uint64_t partial_ms;
	uint8_t *out;
	size_t out_off, out_len, out_cap;
	/* budget.h: its uid's share, its place in the uid's list (oldest
	 * first), the bytes charged (in_cap + out_cap), and why a growth was
	 * refused (the close's reason; "" none). */
	struct kv_budget_uid *bu;
	struct kv_list ulink;
	size_t charged;
	char budget_why[200];
};

static void conn_close(struct kv_conn *c, const char *why);
static void conn_input(struct kv_conn *c);

/* The connection that carries ss: every session on d->sessions is one's
 * (conn.h). */
static struct kv_conn *conn_of(struct kv_session *ss)
{
	struct kv_conn *c = kv_container_of(ss, struct kv_conn, ss);

	kv_assert(c->magic == CONN_MAGIC);
	return c;
}

static struct kv_conn *conn_at(struct kv_list *pos)
{
	return conn_of(kv_container_of(pos, struct kv_session, link));
}

/* What conn.h draws for c's state; aborts (kv_assert) where it does not
 * hold. */
static void conn_assert_state(const struct kv_conn *c)
{
	kv_assert(c->magic == CONN_MAGIC);
	kv_assert(!(c->parked && c->fds_held));
	if (c->closing) {
		kv_assert(!kv_list_linked(&c->ss.link) && kv_list_linked(&c->link));
		kv_assert(c->fd < 0 && !c->in && !c->out);
		kv_assert(!c->parked && !c->fds_held && !c->send_blocked);
		return;
	}
	kv_assert(kv_list_linked(&c->ss.link) && !kv_list_linked(&c->link));
	kv_assert(c->fd >= 0);
	kv_assert(c->out_off <= c->out_len && c->out_len <= c->out_cap);
	kv_assert(c->in_len <= c->in_cap);
	if (c->lingering)
		kv_assert(!c->partial_ms);
}

static struct kv_loop *conn_loop(struct kv_conn *c)
{
	return &c->cs->d->loop;
}

/* Input is left unread: the peer must read its replies first, or the first
 * frame waits for a tier. */
static int conn_held(const struct kv_conn *c)
{
	return c->paused || c->parked || c->fds_held || c->lingering;
}

/* Whether the peer has read everything sent on the socket: then no fd we
 * sent is in flight (SIOCOUTQ counts what the peer has not consumed yet).
 * Clears the session's fds_unread if so. */
static void conn_fds_refresh(struct kv_conn *c)
{
	int q;

	if (c->ss.fds_unread && ioctl(c->fd, SIOCOUTQ, &q) == 0 && q == 0)
		kv_session_fds_read(&c->ss);
}

/* How often the sweep looks at a connection that waits for its peer to read
 * its fds, or for a resource to send them. */
#define FDS_POLL_MS 10
#define SEND_RETRY_MS 100

/* ---- the sweep -----------------------------------------------------------
 * One timer for all connections, armed for the earliest moment one of them
 * needs looking at (a partial frame's frame_timeout; a connection held for
 * its fds, polled every FDS_POLL_MS: no event says a peer has read), never
 * while none does. */

static void conns_tick(struct kv_loop_watch *w, int res, int more);

/* Has the sweep run no later than due (monotonic ms). */
static void conns_arm(struct kv_conns *cs, uint64_t due)
{
	struct kv_loop *loop = &cs->d->loop;
	uint64_t now = kv_mono_ms();

	if (cs->tick.armed) {
		/* A later one is armed: cancel it; its completion sweeps. */
		if (due < cs->tick_due && !cs->tick_cancelled && kv_loop_cancel(loop, &cs->tick) == 0)
			cs->tick_cancelled = 1;
		return;
	}
	if (loop->stop)
		return;
	if (kv_loop_timeout(loop, &cs->tick, (due > now ? due - now : 1) * 1000000ull) == 0)
		cs->tick_due = due;
	else
		kv_err("cannot arm the connections' timer");
}

static int conn_flush(struct kv_conn *c);

/* The bytes queued and not sent yet. */
static size_t out_queued(const struct kv_conn *c)
{
	return c->out_len - c->out_off;
}

/* Lifts a pause whose output has drained under max_output_bytes: 1 if it
 * did (the caller reads the input again, or has it read). */
static int conn_unpause(struct kv_conn *c)
{
	if (!c->paused || out_queued(c) >= c->cs->d->cfg.max_output_bytes)
		return 0;
	c->paused = 0;
	return 1;
}

/* When c next needs the sweep (0: never); closes it if its partial frame
 * has waited frame_timeout; marks it to resume (c->resume) once what held
 * its input is gone. Runs no request: that could close other connections. */
static uint64_t conn_sweep(struct kv_conn *c, uint64_t now)
{
	uint64_t timeout = c->cs->d->cfg.frame_timeout_ms;
	char why[256];
	int r;

	if (c->send_blocked) {
		c->send_blocked = 0;
		if ((r = conn_flush(c)) < 0) {
			conn_close(c, strerror(-r));
			return 0;
		}
		if (c->send_blocked)
			return now + SEND_RETRY_MS;
		if (c->lingering && !out_queued(c)) {
			conn_close(c, c->linger_why[0] ? c->linger_why : NULL);
			return 0;
		}
		if (conn_unpause(c))
			c->resume = !conn_held(c);
	}
	if (c->lingering) {
		if (!timeout)
			return c->send_blocked ? now + SEND_RETRY_MS : 0;
		if (now < c->linger_ms + timeout)
			return c->send_blocked ? now + SEND_RETRY_MS : c->linger_ms + timeout;
		snprintf(why, sizeof(why), "%s; its replies not read within frame_timeout (%llu ms)",
			 c->linger_why[0] ? c->linger_why : "end of input",
			 (unsigned long long)timeout);
		conn_close(c, why);
		return 0;
	}
	if (c->fds_held) {
		conn_fds_refresh(c);
		if (c->ss.nfds || c->ss.fds_unread)
			return now + FDS_POLL_MS;
		c->fds_held = 0;
		c->resume = !conn_held(c);
		return 0;   /* conn_input arms what it needs */
	}
	if (!c->partial_ms || !timeout)
		return 0;
	if (now < c->partial_ms + timeout)
		return c->partial_ms + timeout;
	if (c->in_len >= KV_FRAME_HDR)
		snprintf(why, sizeof(why), "frame incomplete for longer than frame_timeout "
			 "(%llu ms): %zu of %u bytes received", (unsigned long long)timeout,
			 c->in_len, (unsigned)(KV_FRAME_HDR + (c->in[0] | c->in[1] << 8 |
							      c->in[2] << 16 | (uint32_t)c->in[3] << 24)));
	else
		snprintf(why, sizeof(why), "frame incomplete for longer than frame_timeout "
			 "(%llu ms): %zu header bytes received", (unsigned long long)timeout,
			 c->in_len);
	conn_close(c, why);
	return 0;
}

static void conns_tick(struct kv_loop_watch *w, int res, int more)
{
	struct kv_conns *cs = kv_container_of(w, struct kv_conns, tick);
	uint64_t now = kv_mono_ms(), next = 0;
	struct kv_list *pos, *tmp;

	(void)res;
	(void)more;
	cs->tick_cancelled = 0;
	kv_list_for_each_safe(pos, tmp, &cs->d->sessions) {
		uint64_t due = conn_sweep(conn_at(pos), now);

		if (due && (!next || due < next))
			next = due;
	}
	if (next)
		conns_arm(cs, next);
	/* A request may close any session (a reload that revokes access):
	 * look for the next one to resume from the start each time. */
again:
	kv_list_for_each(pos, &cs->d->sessions) {
		struct kv_conn *c = conn_at(pos);

		conn_assert_state(c);
		if (c->resume) {
			c->resume = 0;
			if (!c->closing && !conn_held(c))
				conn_input(c);
			goto again;
		}
	}
}

static void conn_free_if_done(struct kv_conn *c)
{
	conn_assert_state(c);
	if (c->closing && !c->win.armed && !c->wout.armed) {
		kv_list_del(&c->link);
		c->magic = 0;
		free(c);
	}
}

/* ---- output ----------------------------------------------------------- */

/* ---- memory per uid (budget.h) ------------------------------------------ */

/* Charges what c's buffers hold now. */
static void conn_charge(struct kv_conn *c)
{
	size_t now = c->in_cap + c->out_cap;

	if (c->bu && now != c->charged) {
		kv_budget_charge(&c->cs->budget, c->bu, (int64_t)now - (int64_t)c->charged);
		c->charged = now;
	}
}

/* Whether c may grow its buffers by more bytes. Over max_memory_per_uid or
 * max_connection_memory, the newest connection of c's uid is closed (with
 * the reason logged) until the growth fits; when c is that newest, c is
 * refused: -EDQUOT, the reason in c->budget_why, for the caller to close it
 * with. Never a connection of another uid. */
static int conn_budget(struct kv_conn *c, size_t more)
{
	const struct kv_config *cfg = &c->cs->d->cfg;
	struct kv_budget *b = &c->cs->budget;
	int which;

	if (!c->bu)
		return 0;
	while (!kv_budget_fits(b, c->bu, more, cfg->max_memory_per_uid,
			       cfg->max_connection_memory, &which)) {
		struct kv_conn *newest = kv_container_of(kv_list_back(&c->bu->list), struct kv_conn,
							 ulink);
		char why[sizeof(c->budget_why)];

		if (which == 0)
			snprintf(why, sizeof(why), "uid %u's connections hold %llu bytes of buffers and "
				 "one more needs %zu: over max_memory_per_uid (%llu); its newest "
				 "connection closed", (unsigned)c->bu->uid,
				 (unsigned long long)c->bu->bytes, more,
				 (unsigned long long)cfg->max_memory_per_uid);
		else
			snprintf(why, sizeof(why), "all connections hold %llu bytes of buffers and "
				 "one of uid %u needs %zu more: over max_connection_memory (%llu); "
				 "uid %u's newest connection closed", (unsigned long long)b->total,
				 (unsigned)c->bu->uid, more,
				 (unsigned long long)cfg->max_connection_memory, (unsigned)c->bu->uid);
		b->closed++;
		if (newest == c) {
			memcpy(c->budget_why, why, sizeof(why));
			return -EDQUOT;
		}
		conn_close(newest, why);
	}
	return 0;
}

/* Room for n more bytes of output. The buffer doubles, but never past what
 * the bound and one reply need. Returns 0 or -ENOMEM. */
static int out_reserve(struct kv_conn *c, size_t n)
{
	size_t cap, need, limit = (size_t)c->cs->d->cfg.max_output_bytes + n;
	uint8_t *p;

	if (c->out_off == c->out_len)
		c->out_off = c->out_len = 0;
	if (c->out_cap - c->out_len >= n)
		return 0;
	if (c->out_off > 0) {
		memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
		c->out_len -= c->out_off;
		c->out_off = 0;
		if (c->out_cap - c->out_len >= n)
			return 0;
	}
	need = c->out_len + n;
	cap = c->out_cap ? c->out_cap * 2 : 4096;
	if (cap > limit)
		cap = limit;
	if (cap < need)
		cap = need;
	if (conn_budget(c, cap - c->out_cap) < 0)
		return -EDQUOT;
	p = realloc(c->out, cap);
	if (!p)
		return -ENOMEM;
	c->out = p;
	c->out_cap = cap;
	conn_charge(c);
	return 0;
}

/* Sends what is queued. fds go with the first bytes still unsent, which
 * precede the frames that announce them; the peer queues them until then.
 * Returns 0 (all sent, or the rest waits for POLLOUT) or -errno. */
static int conn_flush(struct kv_conn *c)
{
	struct kv_session *ss = &c->ss;

	while (c->out_off < c->out_len) {
		size_t left = c->out_len - c->out_off;
		int nfds = ss->nfds > KV_FRAME_MAX_FDS ? KV_FRAME_MAX_FDS : (int)ss->nfds;
		/* With more fds than one message carries, send one byte per batch
		 * of fds so that every batch has data to ride on. */
		struct iovec iov = { c->out + c->out_off, ss->nfds > KV_FRAME_MAX_FDS ? 1 : left };
		ssize_t n = kv_sendmsg_fds(c->fd, &iov, 1, ss->fds, nfds, MSG_DONTWAIT);

		if (n == -EAGAIN) {
			if (!c->wout.armed &&
			    kv_loop_poll(conn_loop(c), &c->wout, c->fd, POLLOUT, 0) < 0)
				return -EBUSY;
			return 0;
		}
		if (n == -ETOOMANYREFS || n == -ENOBUFS || n == -ENOMEM) {
			/* Fds in flight for the daemon's user past RLIMIT_NOFILE
			 * (another process of its uid passes fds too), or kernel
			 * memory: short for now, not this peer's fault. The
			 * bytes and fds stay queued; the sweep tries again. */
			if (!c->send_blocked)
				kv_warn("session %llu: sendmsg: %s; its replies wait",
					(unsigned long long)ss->id, strerror((int)-n));
			c->send_blocked = 1;
			conns_arm(c->cs, kv_mono_ms() + SEND_RETRY_MS);
			return 0;
		}
		if (n < 0)
			return (int)n;
		kv_session_fds_sent(ss, (size_t)nfds);
		c->out_off += (size_t)n;
	}
	c->out_off = c->out_len = 0;
	if (c->out_cap > OUT_KEEP) {
		free(c->out);
		c->out = NULL;
		c->out_cap = 0;
		conn_charge(c);
	}
	return 0;
}

static void on_writable(struct kv_loop_watch *w, int res, int more)
{
	struct kv_conn *c = kv_container_of(w, struct kv_conn, wout);
	int r;

	(void)more;
	if (!c->closing) {
		if (res < 0 || (res & (POLLERR | POLLHUP))) {
			conn_close(c, "peer hung up");
		} else if ((r = conn_flush(c)) < 0) {
			conn_close(c, strerror(-r));
		} else if (c->lingering) {
			if (!out_queued(c))
				conn_close(c, c->linger_why[0] ? c->linger_why : NULL);
		} else if (conn_unpause(c) && !c->parked) {
			conn_input(c);
		}
	}
	conn_free_if_done(c);
}

int kv_resp_blocks_size(const Kvcached__Response *rs, size_t *len)
{
	const Kvcached__BlockList *bl = rs->blocks;
	size_t in = 0;
	unsigned hi = 0;

	if (rs->error || rs->n_segments || rs->base.n_unknown_fields)
		return 0;
	*len = rs->id ? 1 + kv_pb_varint_len(rs->id) : 0;
	if (rs->result_case == KVCACHED__RESPONSE__RESULT__NOT_SET)   /* a Release's */
		return 1;
	if (rs->result_case != KVCACHED__RESPONSE__RESULT_BLOCKS || !bl ||
	    bl->base.n_unknown_fields)
		return 0;
	for (size_t i = 0; i < bl->n_tiers; i++)
		hi |= (unsigned)bl->tiers[i];
	if (hi > 0x7f)   /* a tier not in one byte (none is) */
		return 0;
	if (bl->n_blocks)
		in += 1 + kv_pb_varint_len(8 * (uint64_t)bl->n_blocks) + 8 * bl->n_blocks;
	if (bl->n_tiers)
		in += 1 + kv_pb_varint_len(bl->n_tiers) + bl->n_tiers;
	*len += 1 + kv_pb_varint_len(in) + in;
	return 1;
}

void kv_resp_blocks_pack(const Kvcached__Response *rs, uint8_t *out)
{
	const Kvcached__BlockList *bl = rs->blocks;
	size_t in = 0;

	if (rs->id) {
		*out++ = 0x08;
		out += kv_pb_varint_put(out, rs->id);
	}
	if (rs->result_case != KVCACHED__RESPONSE__RESULT_BLOCKS)
		return;
	if (bl->n_blocks)
		in += 1 + kv_pb_varint_len(8 * (uint64_t)bl->n_blocks) + 8 * bl->n_blocks;
	if (bl->n_tiers)
		in += 1 + kv_pb_varint_len(bl->n_tiers) + bl->n_tiers;
	*out++ = 0x62;   /* blocks = 12 */
	out += kv_pb_varint_put(out, in);
	if (bl->n_blocks) {
		*out++ = 0x0a;
		out += kv_pb_varint_put(out, 8 * (uint64_t)bl->n_blocks);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
		memcpy(out, bl->blocks, 8 * bl->n_blocks);
		out += 8 * bl->n_blocks;
#else
		for (size_t i = 0; i < bl->n_blocks; i++)
			for (int j = 0; j < 8; j++)
				*out++ = (uint8_t)(bl->blocks[i] >> (8 * j));
#endif
	}
	if (bl->n_tiers) {
		*out++ = 0x12;
		out += kv_pb_varint_put(out, bl->n_tiers);
		for (size_t i = 0; i < bl->n_tiers; i++)
			*out++ = (uint8_t)bl->tiers[i];
	}
}

/* Appends one frame holding rs. Returns 0 or -ENOMEM. */
static int conn_reply(struct kv_conn *c, const Kvcached__Response *rs)
{
	/* A reply of blocks and nothing else (Lookup, Alloc, Seal...), or of
	 * nothing (Release), packed by hand: protobuf-c's walk of the
	 * descriptors was a tenth of the reply's cost in a lookup of 1,000
	 * (issue 38). */
	size_t len;
	int fast = kv_resp_blocks_size(rs, &len);

	if (!fast)
		len = kvcached__response__get_packed_size(rs);

	if (out_reserve(c, KV_FRAME_HDR + len) < 0)
		return -ENOMEM;
	kv_frame_hdr_encode(c->out + c->out_len, (uint32_t)len, 0);
	if (fast)
		kv_resp_blocks_pack(rs, c->out + c->out_len + KV_FRAME_HDR);
	else
		kvcached__response__pack(rs, c->out + c->out_len + KV_FRAME_HDR);
	c->out_len += KV_FRAME_HDR + len;
	return 0;
}

/* No more input is read from c (the peer has shut its side, or broke the
 * protocol); it closes once what is queued for it has been sent, so that
 * every request before is answered, or once frame_timeout has passed if the
 * peer does not read. why (or NULL: nothing) is logged then. */
static void conn_linger(struct kv_conn *c, const char *why)
{
	int r = conn_flush(c);

	if (r < 0 || !out_queued(c)) {
		conn_close(c, r < 0 ? strerror(-r) : why);
		return;
	}
	c->lingering = 1;
	snprintf(c->linger_why, sizeof(c->linger_why), "%s", why ? why : "");
	c->linger_ms = kv_mono_ms();
	c->partial_ms = 0;
	if (c->win.armed)
		kv_loop_cancel(conn_loop(c), &c->win);
	if (c->cs->d->cfg.frame_timeout_ms)
		conns_arm(c->cs, c->linger_ms + c->cs->d->cfg.frame_timeout_ms);
}

/* Replies EPROTO, after every reply queued before it, and closes the
 * connection once they have been sent. */
static void conn_proto_error(struct kv_conn *c, uint64_t id, const char *what)
{
	Kvcached__Response rs = KVCACHED__RESPONSE__INIT;
	Kvcached__Error err = KVCACHED__ERROR__INIT;

	err.code = KVCACHED__ERROR_CODE__EPROTO;
	err.message = (char *)what;
	err.index = -1;
	rs.id = id;
	rs.error = &err;
	if (conn_reply(c, &rs) < 0) {
		conn_close(c, what);
		return;
	}
	conn_linger(c, what);
}

/* ---- input ------------------------------------------------------------ */

/* The hand-packed forms kv_req_unpack_seal() and kv_req_unpack_lookup()
 * take, read a field at a time from *off: each returns 0, or -1 for a frame
 * not in that form (protobuf-c decodes it). */

/* The frame's head: id (1, varint), then the op's field (tag), which holds
 * the rest of the frame. */
static int fast_head(const uint8_t *buf, size_t len, uint8_t tag, size_t *off, uint64_t *id)
{
	uint64_t v;

	if (*off < len && buf[*off] == 0x08) {   /* id */
		++*off;
		if (kv_pb_varint_get(buf, len, off, 10, id) < 0)
			return -1;
	}
	if (*off >= len || buf[(*off)++] != tag || kv_pb_varint_get(buf, len, off, 5, &v) < 0 ||
	    v != len - *off)
		return -1;
	return 0;
}

/* An optional pool_id (1, varint) no wider than 32 bits, where protobuf-c
 * would cut a wider one. */
static int fast_pool(const uint8_t *buf, size_t len, size_t *off, uint32_t *pool)
{
	uint64_t v;

	if (*off < len && buf[*off] == 0x08) {
		++*off;
		if (kv_pb_varint_get(buf, len, off, 5, &v) < 0 || v > UINT32_MAX)
			return -1;
		*pool = (uint32_t)v;
	}
	return 0;
}

/* An optional length-delimited field (tag): its bytes in place, *n of them,
 * a multiple of unit. */
static int fast_bytes(const uint8_t *buf, size_t len, size_t *off, uint8_t tag, size_t unit,
		      const uint8_t **p, size_t *n)
{
	uint64_t v;

	if (*off < len && buf[*off] == tag) {
		++*off;
		if (kv_pb_varint_get(buf, len, off, 5, &v) < 0 || v > len - *off || v % unit)
			return -1;
		*p = v ? buf + *off : NULL;
		*n = (size_t)v;
		*off += (size_t)v;
	}
	return 0;
}

/* The Seal request in buf[0..len) decoded with its hashes read in place
 * (issue 38: protobuf-c's walk of the frame, its copy of the hashes and its
 * bound on the decode were a tenth of a Seal of 256's time in the daemon),
 * or NULL: the frame is not in the one form this accepts, and protobuf-c
 * decodes it. That form is what kvc_seal() writes: id (1, varint), then
 * seal (13) holding pool_id (1, varint), blocks (2, packed fixed64) and
 * hashes (3), each at most once, in that order, nothing else (a Seal with
 * token ids, a parent hash, a LoRA or extra keys goes to protobuf-c);
 * pool_id no wider than 32 bits, blocks a whole number of 8-byte handles.
 * Everything it accepts protobuf-c decodes to the same values
 * (test_req_unpack). The handles are copied into arena a (aligned, as
 * protobuf-c copies them), the hashes point into buf, which outlives the
 * request as kv_req_unpack_lookup()'s do. The structs come from arena a. */
Kvcached__Request *kv_req_unpack_seal(struct kv_arena *a, const uint8_t *buf, size_t len)
{
	const uint8_t *blocks = NULL, *hashes = NULL;
	size_t off = 0, nblocks = 0, nhashes = 0;
	uint32_t pool = 0;
	uint64_t id = 0;
	Kvcached__Request *rq;
	Kvcached__Seal *m;

	if (__BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__)
		return NULL;   /* the handles are copied as they are */
	if (fast_head(buf, len, 0x6a, &off, &id) < 0 || fast_pool(buf, len, &off, &pool) < 0 ||
	    fast_bytes(buf, len, &off, 0x12, 8, &blocks, &nblocks) < 0 ||
	    fast_bytes(buf, len, &off, 0x1a, 1, &hashes, &nhashes) < 0 || off != len)
		return NULL;
	rq = kv_arena_alloc(a, sizeof(*rq));
	m = kv_arena_alloc(a, sizeof(*m));
	if (!rq || !m)
		return NULL;
	*rq = (Kvcached__Request)KVCACHED__REQUEST__INIT;
	*m = (Kvcached__Seal)KVCACHED__SEAL__INIT;
	rq->id = id;
	rq->op_case = KVCACHED__REQUEST__OP_SEAL;
	rq->seal = m;
	m->pool_id = pool;
	if (nblocks) {
		if (!(m->blocks = kv_arena_alloc(a, nblocks)))
			return NULL;
		memcpy(m->blocks, blocks, nblocks);
	}
	m->n_blocks = nblocks / 8;
	m->hashes.len = nhashes;
	m->hashes.data = (uint8_t *)hashes;
	return rq;
}

/* The Lookup request in buf[0..len) decoded with its hashes read in place
 * (issue 38: protobuf-c's copy of a chain's 32 bytes a block was 5% of a
 * lookup of 1,000's samples), or NULL: the frame is not in the one form
 * this accepts, and protobuf-c decodes it. That form is what a packer
 * writes: id (1, varint), then lookup (14) holding pool_id (1, varint),
 * hashes (2) and tiers (3, varint), each at most once, in that order,
 * nothing else; pool_id no wider than 32 bits and tiers 0 or 1 in one
 * byte, where protobuf-c would cut or fold other values. Everything it
 * accepts protobuf-c decodes to the same values (test_req_unpack). The
 * hashes point into buf, which outlives the request as the arena does:
 * the frame stays in the input buffer until its dispatch has returned,
 * and a parked one is decoded again. The structs come from arena a. */
Kvcached__Request *kv_req_unpack_lookup(struct kv_arena *a, const uint8_t *buf, size_t len)
{
	const uint8_t *hashes = NULL;
	size_t off = 0, nhashes = 0;
	uint32_t pool = 0;
	uint64_t id = 0;
	int tiers = 0;
	Kvcached__Request *rq;
	Kvcached__Lookup *m;

	if (fast_head(buf, len, 0x72, &off, &id) < 0 || fast_pool(buf, len, &off, &pool) < 0 ||
	    fast_bytes(buf, len, &off, 0x12, 1, &hashes, &nhashes) < 0)
		return NULL;
	if (off < len && buf[off] == 0x18) {   /* tiers */
		if (len - off < 2 || buf[off + 1] > 1)
			return NULL;
		tiers = buf[off + 1];
		off += 2;
	}
	if (off != len)
		return NULL;
	rq = kv_arena_alloc(a, sizeof(*rq));
	m = kv_arena_alloc(a, sizeof(*m));
	if (!rq || !m)
		return NULL;
	*rq = (Kvcached__Request)KVCACHED__REQUEST__INIT;
	*m = (Kvcached__Lookup)KVCACHED__LOOKUP__INIT;
	rq->id = id;
	rq->op_case = KVCACHED__REQUEST__OP_LOOKUP;
	rq->lookup = m;
	m->pool_id = pool;
	m->hashes.len = nhashes;
	m->hashes.data = (uint8_t *)hashes;
	m->tiers = tiers;
	return rq;
}

/* Handles every complete frame in the input buffer. Returns 0, or -1 when
 * the connection was closed. */
static int conn_frames(struct kv_conn *c)
{
	struct kv_daemon *d = c->cs->d;
	size_t off = 0;
	char why[160];

	while (c->in_len - off >= KV_FRAME_HDR && !conn_held(c)) {
		Kvcached__Request *rq, *fast;
		Kvcached__Response rs = KVCACHED__RESPONSE__INIT;
		enum kv_op_outcome out;
		uint64_t t0;
		uint32_t len;
		int r = kv_frame_hdr_decode(c->in + off, d->cfg.max_frame, &len);

		if (r < 0) {
			conn_proto_error(c, 0, r == -EMSGSIZE ? "frame larger than max_frame"
							      : "bad frame header");
			return -1;
		}
		if (c->in_len - off < KV_FRAME_HDR + len)
			break;
		t0 = kv_hist_now_ns();
		/* A Lookup in its packer's form: its hashes read in place, two
		 * structs of the arena (no bound on the decode needed). */
		fast = kv_req_unpack_lookup(&d->arena, c->in + off + KV_FRAME_HDR, len);
		if (!fast)   /* a Seal in its packer's form, the same way */
			fast = kv_req_unpack_seal(&d->arena, c->in + off + KV_FRAME_HDR, len);
		if (!fast) {
			long long max = (long long)len * DECODE_FACTOR + DECODE_SLACK;
			long long cost = kv_pb_decode_cost(&kvcached__request__descriptor,
							   c->in + off + KV_FRAME_HDR, len,
							   (unsigned long long)max);

			if (cost > max) {
				kv_arena_reset(&d->arena);
				snprintf(why, sizeof(why),
					 "frame of %u bytes would decode to more than %lld bytes "
					 "(%d x its size + 1 MiB)", len, max, DECODE_FACTOR);
				conn_proto_error(c, 0, why);
				return -1;
			}
		}
		rq = fast ? fast
			  : kvcached__request__unpack(kv_arena_pb(&d->arena), len,
						      c->in + off + KV_FRAME_HDR);
		if (!rq) {
			kv_arena_reset(&d->arena);
			conn_proto_error(c, 0, "undecodable request");
			return -1;
		}
		/* Strings are UTF-8 (proto3) and hold no NUL (C strings): a
		 * strict parser would refuse what the daemon echoes otherwise,
		 * and "pool\0x" would silently be "pool". (A Lookup has none.) */
		if (!fast && !kv_pb_strings_ok(&kvcached__request__descriptor, c->in + off + KV_FRAME_HDR,
				      len, why, sizeof(why))) {
			uint64_t id = rq->id;

			kv_arena_reset(&d->arena);
			conn_proto_error(c, id, why);
			return -1;
		}
		/* Fresh counts of what the peer has read, for the limits on
		 * fds (one ioctl, only while some are out). */
		conn_fds_refresh(c);
		kv_log_context(c->ss.id, kv_session_ns_name(&c->ss));
		out = kv_ops_dispatch(d, &c->ss, rq, &rs);
		kv_log_context(0, NULL);
		if (out == KV_OP_PARK || out == KV_OP_HOLD) {
			/* The frame stays first in the buffer; wake, or the
			 * sweep once the peer has read its fds, runs it again. */
			kv_arena_reset(&d->arena);
			if (out == KV_OP_PARK) {
				c->parked = 1;
			} else {
				c->fds_held = 1;
				conns_arm(c->cs, kv_mono_ms() + FDS_POLL_MS);
			}
			break;
		}
		off += KV_FRAME_HDR + len;
		c->ss.requests++;
		d->requests++;
		if (out != KV_OP_NOMEM && conn_reply(c, &rs) < 0)
			out = KV_OP_NOMEM;
		kv_hist_since(&d->op_hist[kv_ops_index(rq->op_case)], t0);
		kv_arena_reset(&d->arena);
		if (out == KV_OP_CLOSE) {
			conn_linger(c, "protocol error");
			return -1;
		}
		if (out == KV_OP_NOMEM) {
			conn_close(c, c->budget_why[0] ? c->budget_why : "out of memory");
			return -1;
		}
		if (out_queued(c) >= d->cfg.max_output_bytes)
			c->paused = 1;
	}
	if (off) {
		memmove(c->in, c->in + off, c->in_len - off);
		c->in_len -= off;
		c->partial_ms = 0;   /* what is left is a new frame */
		if (!c->in_len && c->in_cap > READ_CHUNK) {
			free(c->in);
			c->in = NULL;
			c->in_cap = 0;
			conn_charge(c);
		}
	}
	kv_cache_batch_done(d);
	return 0;
}

/* Room for the next read: the buffer grows by half of what has arrived (at
 * least READ_CHUNK), and no further than the first frame needs when its
 * header is in, so that its memory follows the bytes received, never the
 * length a header announces. Returns 0 or -ENOMEM. */
static int in_reserve(struct kv_conn *c)
{
	size_t cap, need;
	uint32_t len;
	uint8_t *p;

	if (c->in_cap - c->in_len >= READ_MIN)
		return 0;
	cap = c->in_len + (c->in_len / 2 > READ_CHUNK ? c->in_len / 2 : READ_CHUNK);
	/* conn_frames() has checked the header already. */
	if (c->in_len >= KV_FRAME_HDR &&
	    kv_frame_hdr_decode(c->in, c->cs->d->cfg.max_frame, &len) == 0) {
		need = KV_FRAME_HDR + (size_t)len;
		if (need > c->in_len && need + READ_MIN < cap)
			cap = need + READ_MIN;
	}
	if (conn_budget(c, cap - c->in_cap) < 0)
		return -EDQUOT;
	p = realloc(c->in, cap);
	if (!p)
		return -ENOMEM;
	c->in = p;
	c->in_cap = cap;
	conn_charge(c);
	return 0;
}

/* Reads and handles c's input until the socket is empty (or c is held),
 * then sends what is queued. short_ok: a read that came back short ends
 * it (see on_readable()); else only one that finds nothing (EAGAIN). */
static void conn_read(struct kv_conn *c, int short_ok)
{
	int drained = 0;

again:
	for (;;) {
		int fds[8], nfds = 0, trunc = 0;
		size_t room;
		ssize_t n;

		if (conn_frames(c) < 0)
			return;
		if (conn_held(c))
			break;
		/* The last read came back short, so it emptied the socket: the
		 * answers to its frames go out now, not after the next read,
		 * which most often finds nothing (issue 38: a lookup's reply
		 * waited on that recvmsg's EAGAIN). */
		if (drained && out_queued(c) && conn_flush(c) < 0) {
			conn_close(c, "send failed");
			return;
		}
		if (drained && short_ok)
			break;
		if (in_reserve(c) < 0) {
			conn_close(c, c->budget_why[0] ? c->budget_why : "out of memory");
			return;
		}
		room = c->in_cap - c->in_len;
		n = kv_recvmsg_fds(c->fd, c->in + c->in_len, room, fds, &nfds, 8, MSG_DONTWAIT,
				   &trunc);
		if (n == -EAGAIN)
			break;
		if (n < 0) {
			conn_close(c, strerror((int)-n));
			return;
		}
		if (nfds || trunc) {
			while (nfds > 0)
				close(fds[--nfds]);
			conn_proto_error(c, 0, "file descriptors are not accepted from clients");
			return;
		}
		if (n == 0) {
			/* A peer that shut its side after whole requests
			 * (shutdown(SHUT_WR)) still gets every reply. */
			if (c->in_len)
				conn_close(c, "EOF inside a frame");
			else
				conn_linger(c, NULL);
			return;
		}
		c->in_len += (size_t)n;
		drained = (size_t)n < room;
	}
	/* A frame has begun and not ended: it has frame_timeout to. */
	if (conn_held(c) || !c->in_len) {
		c->partial_ms = 0;
	} else if (!c->partial_ms) {
		c->partial_ms = kv_mono_ms();
		if (c->cs->d->cfg.frame_timeout_ms)
			conns_arm(c->cs, c->partial_ms + c->cs->d->cfg.frame_timeout_ms);
	}
	if (conn_flush(c) < 0) {
		conn_close(c, "send failed");
		return;
	}
	/* Paused, and the flush sent all that paused it at once: no POLLOUT
	 * will come to lift the pause, and a pipelining peer would wait on it
	 * for ever (its writes blocked on the unread input). */
	if (conn_unpause(c) && !conn_held(c))
		goto again;
}

static void conn_input(struct kv_conn *c)
{
	conn_read(c, 0);
}

/* The events c's input is polled for: POLLRDHUP too, so that res says
 * whether the peer has shut its side. */
#define CONN_POLL_IN (POLLIN | POLLRDHUP)

/* Issue 38: a read that came back short ends the reading here, without the
 * second recvmsg() that would answer EAGAIN. It cannot lose input: a short
 * read on an AF_UNIX stream socket means its queue was empty at that
 * moment (unix_stream_read_generic() stops only there, at a message with
 * fds, which the daemon refuses, where the writer's credentials change,
 * which it checks only with SO_PASSCRED, not set here, or at a mark of
 * MSG_OOB data, which only stalls the peer that sends it); whatever arrives later
 * wakes the multishot poll, which posts a completion for every wake-up
 * after it, and so calls this again (or, once it has ended, is armed again
 * below, and an arming reports what is there already). The peer's
 * shutdown is the one event that a completion may have reported before the
 * read (data and EOF in one wake-up) with nothing after it: with POLLRDHUP,
 * POLLHUP or POLLERR in res, the socket is read until EAGAIN or EOF as
 * before. Every other caller of conn_input() (a wake, a resume, an unpause)
 * reads until EAGAIN: the completions that came while c was held were
 * spent. */
static void on_readable(struct kv_loop_watch *w, int res, int more)
{
	struct kv_conn *c = kv_container_of(w, struct kv_conn, win);

	if (!c->closing) {
		if (res < 0) {
			conn_close(c, strerror(-res));
		} else {
			if (!conn_held(c))
				conn_read(c, !(res & (POLLRDHUP | POLLHUP | POLLERR)));
			/* A multishot poll can end (overflow); arm it again. */
			if (!c->closing && !c->lingering && !more &&
			    kv_loop_poll(conn_loop(c), &c->win, c->fd, CONN_POLL_IN, 1) < 0)
				conn_close(c, "cannot poll");
		}
	}
	conn_free_if_done(c);
}

/* A tier finished what the parked request waits for: run it again. */
static void conn_wake(struct kv_waiter *w)
{
	struct kv_conn *c = kv_container_of(w, struct kv_conn, ss.waiter);

	c->parked = 0;
	conn_assert_state(c);
	if (!c->closing && !c->paused)
		conn_input(c);
}

/* ---- lifetime ----------------------------------------------------------- */

static void conn_close(struct kv_conn *c, const char *why)
{
	struct kv_daemon *d = c->cs->d;

	if (c->closing)
		return;
	c->closing = 1;
	kv_log_context(c->ss.id, kv_session_ns_name(&c->ss));
	if (why)
		kv_info("session %llu (pid %d) closed: %s; released %llu references",
			(unsigned long long)c->ss.id, (int)c->ss.cred.pid, why,
			(unsigned long long)c->ss.refs.refs);
	else
		kv_debug("session %llu (pid %d) disconnected", (unsigned long long)c->ss.id,
			 (int)c->ss.cred.pid);
	kv_session_release(&c->ss);
	c->parked = c->fds_held = c->send_blocked = 0;
	kv_list_push_back(&c->cs->closing, &c->link);
	if (c->win.armed)
		kv_loop_cancel(&d->loop, &c->win);
	if (c->wout.armed)
		kv_loop_cancel(&d->loop, &c->wout);
	close(c->fd);
	c->fd = -1;
	free(c->in);
	free(c->out);
	c->in = c->out = NULL;
	c->in_cap = c->out_cap = 0;
	if (c->bu) {
		conn_charge(c);
		c->ss.bu = NULL;   /* kv_session_release() gave its fds back */
		kv_list_del(&c->ulink);
		kv_budget_leave(&c->cs->budget, c->bu);
		c->bu = NULL;
	}
	kv_log_context(0, NULL);
	conn_assert_state(c);
	/* The struct itself goes once its watches have completed. */
	kv_daemon_drain_check(d);
}

/* Whether a peer with cred may not open another connection (on the admin
 * socket when admin); the reason in why. Open connections count (a closing
 * one has given its place back). O(connections): they are bounded. */
static int conn_over_limit(struct kv_conns *cs, const struct ucred *cred, int admin, char *why,
			   size_t len)
{
	const struct kv_config *cfg = &cs->d->cfg;
	uint32_t workers = 0, admins = 0, mine = 0;
	struct kv_list *pos;

	kv_list_for_each(pos, &cs->d->sessions) {
		const struct kv_session *ss = kv_container_of(pos, struct kv_session, link);

		if (ss->admin) {
			admins++;
		} else {
			workers++;
			mine += ss->cred.uid == cred->uid;
		}
	}
	if (admin) {
		if (admins < KV_ADMIN_CONNS_MAX)
			return 0;
		snprintf(why, len, "too many connections: %u open on the admin socket (at most %u); "
			 "retry later", admins, KV_ADMIN_CONNS_MAX);
		return 1;
	}
	if (workers >= cfg->max_connections) {
		snprintf(why, len, "too many connections: %u open on the worker socket "
			 "(max_connections %u); retry later", workers, cfg->max_connections);
		return 1;
	}
	if (mine >= cfg->max_connections_per_uid) {
		snprintf(why, len, "too many connections: uid %u has %u open "
			 "(max_connections_per_uid %u); retry later", (unsigned)cred->uid, mine,
			 cfg->max_connections_per_uid);
		return 1;
	}
	return 0;
}

/* Tells the peer why (an EAGAIN reply with id 0, best effort: its socket
 * buffer is empty), closes fd and logs it, at most once a second. */
static void conn_refuse(struct kv_conns *cs, int fd, const struct ucred *cred, int admin,
			const char *why)
{
	Kvcached__Response rs = KVCACHED__RESPONSE__INIT;
	Kvcached__Error err = KVCACHED__ERROR__INIT;
	uint8_t buf[KV_FRAME_HDR + 512];
	char more[64] = "";
	uint64_t held;
	size_t len;

	err.code = KVCACHED__ERROR_CODE__EAGAIN;
	err.message = (char *)why;
	err.index = -1;
	rs.error = &err;
	len = kvcached__response__get_packed_size(&rs);
	if (len <= sizeof(buf) - KV_FRAME_HDR) {
		kv_frame_hdr_encode(buf, (uint32_t)len, 0);
		kvcached__response__pack(&rs, buf + KV_FRAME_HDR);
		if (send(fd, buf, KV_FRAME_HDR + len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
			kv_debug("refused connection: %s", strerror(errno));
	}
	close(fd);
	cs->refused++;
	if (!kv_ratelimit(&cs->refused_log, &held))
		return;
	if (held)
		snprintf(more, sizeof(more), " (and %llu more since the last such line)",
			 (unsigned long long)held);
	kv_warn("connection refused on the %s socket: pid %d uid %u: %s%s", admin ? "admin" : "worker",
		(int)cred->pid, (unsigned)cred->uid, why, more);
}

void kv_conn_accept(struct kv_conns *cs, int fd, int admin)
{
	struct kv_conn *c;
	struct ucred cred;
	socklen_t len = sizeof(cred);
	char why[200];

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		kv_warn("SO_PEERCRED: %s; connection refused", strerror(errno));
		close(fd);
		return;
	}
	if (conn_over_limit(cs, &cred, admin, why, sizeof(why))) {
		conn_refuse(cs, fd, &cred, admin, why);
		return;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		kv_err("out of memory accepting a connection");
		close(fd);
		return;
	}
	c->magic = CONN_MAGIC;
	c->cs = cs;
	c->fd = fd;
	if (!(c->bu = kv_budget_join(&cs->budget, cred.uid))) {
		kv_err("out of memory accepting a connection");
		close(fd);
		free(c);
		return;
	}
	kv_list_push_back(&c->bu->list, &c->ulink);
	c->win.cb = on_readable;
	c->wout.cb = on_writable;
	kv_list_init(&c->link);
	if (kv_loop_poll(&cs->d->loop, &c->win, fd, CONN_POLL_IN, 1) < 0) {
		kv_err("cannot poll a new connection");
		close(fd);
		kv_list_del(&c->ulink);
		kv_budget_leave(&cs->budget, c->bu);
		free(c);
		return;
	}
	kv_session_open(cs->d, &c->ss, &cred, admin);
	c->ss.bu = c->bu;   /* its segment fds count for its uid too */
	kv_session_peer_groups(&c->ss, fd);
	c->ss.waiter.wake = conn_wake;
	conn_assert_state(c);
	kv_debug("session %llu: pid %d uid %u gid %u on the %s socket", (unsigned long long)c->ss.id,
		 (int)cred.pid, cred.uid, cred.gid, admin ? "admin" : "worker");
}

void kv_conn_close_session(struct kv_session *ss, const char *why)
{
	conn_close(conn_of(ss), why);
}

void kv_conns_init(struct kv_conns *cs, struct kv_daemon *d)
{
	cs->d = d;
	kv_list_init(&cs->closing);
	cs->refused_log.interval_ms = 1000;
	cs->tick.cb = conns_tick;
}

void kv_conns_refresh_fds(struct kv_daemon *d)
{
	struct kv_list *pos;

	kv_list_for_each(pos, &d->sessions)
		conn_fds_refresh(conn_at(pos));
}

void kv_conns_queue_stats(const struct kv_daemon *d, struct kv_queue_stats *q)
{
	const struct kv_list *pos;

	memset(q, 0, sizeof(*q));
	kv_list_for_each(pos, &d->sessions) {
		const struct kv_conn *c = conn_at((struct kv_list *)pos);

		conn_assert_state(c);
		q->parked += c->parked;
		q->held += c->fds_held;
		q->paused += c->paused;
		q->out_bytes += out_queued(c);
	}
	if (d->conns) {
		q->conn_bytes = d->conns->budget.total;
		q->budget_closed = d->conns->budget.closed;
	}
}

void kv_conns_fini(struct kv_conns *cs)
{
	struct kv_list *pos, *tmp;

	if (!cs->d)
		return;
	kv_list_for_each_safe(pos, tmp, &cs->d->sessions)
		conn_close(conn_at(pos), NULL);
	kv_list_for_each_safe(pos, tmp, &cs->closing) {
		struct kv_conn *c = kv_container_of(pos, struct kv_conn, link);

		kv_assert(c->closing);
		kv_list_del(&c->link);
		c->magic = 0;
		free(c);
	}
}
