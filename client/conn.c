/* The connection to kvcached: socket, Hello, request/response framing, the
 * queue of received segment fds, the pool table and block addresses, and the
 * reconnection after a daemon restart. One file of about 1,000 lines: all of
 * it changes struct kvc_conn, which is private here, under one lock.
 *
 * One request is in flight per connection; c->lock serializes calls and owns
 * everything below it in struct kvc_conn except the pool table and the
 * session, which kvc_block_ptr() and the argument checks read without the
 * lock: pool slots are published with release stores (device before
 * block_bytes, block_bytes != 0 meaning "registered"); a session (what one
 * daemon's HelloReply said, and the map of its segments) is built whole and
 * then published with one release store, never changed after, and kept
 * until kvc_close() once a reconnection replaces it, since a reader may still
 * hold it; segments are published by the map module (see map.c).
 *
 * Connection states:
 *
 *   OPEN --socket error, EOF, bad frame, bad response, daemon EPROTO--> BROKEN
 *   BROKEN, because the daemon went away (EOF, reset) --next call--> OPEN again
 *
 * OPEN: the receive buffer holds no complete frame between calls, and every
 * fd in the queue belongs to a frame not yet parsed. BROKEN: the socket is
 * shut down (the daemon releases our references); every call returns -EPIPE
 * without touching it; mappings stay until kvc_close(). A connection broken
 * because the daemon died or restarted (not by a protocol error) reconnects
 * on the next call, at most once per backoff interval (10 ms doubling to 2 s):
 * Hello with the same namespace and name, every pool registered again, a new
 * map for the new daemon's segments (reconnect()). The caller's pool ids stay
 * valid (pool_app maps them to the new daemon's ids); block handles and swaps
 * from before are stale, and kvc_restarts() counts the reconnections.
 *
 * Deadlines: every call has one (c->timeout_ms from its start; none when
 * negative), over everything it waits for: c->lock, the socket's connect,
 * each send and receive (poll() then a non-blocking sendmsg/recvmsg), the
 * reconnection and the Hello. A call past it returns -ETIMEDOUT; if it had
 * the lock, the connection goes BROKEN as if the daemon had gone away
 * (gone: a later call reconnects), since a reply that comes late would be
 * taken for the next request's. c->lock is a flag under a mutex and a
 * condition variable (conn_lock()): a thread waits for a call of another
 * thread no longer than its own deadline. */
#include "kvc_internal.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "pbvarint.h"
#include "kvassert.h"
#include "kvtext.h"

#define RBUF_MIN (64u * 1024)
#define FDQ_MAX 1024u               /* unclaimed fds before we call it a flood */
#define MAX_DEVICES 1024u
#define MAX_SEGMENTS (1u << 24)     /* per device */
#define MAX_BATCH (1u << 24)        /* keeps every count an int */
#define MAX_DEVICE_BYTES (1ull << 50)

#define BACKOFF_MIN_MS 10u
#define BACKOFF_MAX_MS 2000u

/* kvc_options.timeout_ms 0: a minute. A stopped or wedged daemon fails the
 * call instead of hanging the engine, and no call of a daemon that works
 * comes near it (its own waits, a promotion or a G4 fetch, are bounded far
 * below; an engine that wants a tighter bound says so). */
#define TIMEOUT_DEFAULT_MS 60000
#define NO_DEADLINE UINT64_MAX

struct pool_slot {
	_Atomic uint64_t block_bytes;  /* 0: not registered on this connection */
	_Atomic uint32_t device;
};

/* A pool this connection registered: what registers it again after a
 * reconnection, and the id the caller knows it by. */
struct pool_rec {
	int app;                       /* the id kvc_register_pool() returned */
	uint32_t daemon;               /* the current daemon's id */
	char *name, *dtype, *model;    /* model: "" for none (KV events' topic) */
	uint32_t device, block_tokens;
	uint64_t block_bytes;
	uint8_t *layout;
	size_t layout_len;
};

/* One daemon's session: immutable once published (its map's segments
 * excepted, which the map module publishes itself). */
struct session {
	struct kvc_hello hello;
	struct kvc_map *map;
};

/* The connection's lock: held while busy, waited for on cv under mu (not a
 * mutex held for the call, which pthread_mutex_timedlock() would wait for
 * on CLOCK_REALTIME only). */
struct conn_lock {
	pthread_mutex_t mu;
	pthread_cond_t cv;             /* CLOCK_MONOTONIC */
	bool busy;
};

struct kvc_conn {
	struct conn_lock lock;
	int fd;
	_Atomic int timeout_ms;        /* > 0, or -1: no deadline (kvc_set_timeout()) */
	uint64_t deadline_ns;          /* the current call's (CLOCK_MONOTONIC), NO_DEADLINE */
	int call_ms;                   /* the current call's timeout (its message) */
	atomic_bool broken;
	bool gone;                     /* broken because the daemon went away */
	bool in_hello;                 /* a Hello is in flight: no segments, the Hello's
	                                * frame limit */
	uint64_t next_id;
	_Atomic(struct session *) sess;  /* NULL until the first HelloReply */

	/* Reconnection (see the top of this file). */
	bool reconnect;                /* $KVCACHE_RECONNECT is not "0" */
	char *path, *ns, *client_name;
	int cuda_device;               /* kvc_options.cuda_device - 1 */
	_Atomic uint64_t restarts;
	bool sess_done;                /* the current session is complete (Hello, pools
	                                * registered): replacing it is a restart */
	uint64_t next_try_ms;          /* CLOCK_MONOTONIC */
	uint32_t backoff_ms;
	struct session **retired;      /* earlier daemons' sessions, freed by kvc_close() */
	size_t nretired;
	struct pool_rec *recs;
	size_t nrecs;
	/* The caller's pool id -> the daemon's, -1 for none (then the id is
	 * passed through as it is). */
	_Atomic int32_t pool_app[KVC_MAX_POOLS];
	/* The caller's pool id -> the pool's block bytes, 0 for none: set when
	 * the pool is registered and kept, like the id, across reconnections,
	 * so that kvc_pool_block_bytes() (lock-free) never sees a pool go
	 * while a reconnection registers the pools again. */
	_Atomic uint64_t app_bytes[KVC_MAX_POOLS];

	uint8_t *rbuf;                 /* [rpos, rpos + rlen): received, unparsed */
	size_t rcap, rpos, rlen;
	uint8_t *sbuf;
	size_t scap;
	int *fdq;                      /* [fdq_head, fdq_head + fdq_len): unclaimed fds */
	size_t fdq_cap, fdq_head, fdq_len;

	/* The last call's message, whichever thread made it: the daemon
	 * sends at most 511 bytes. Threads read their own (err_unlock()). */
	char err[512];
	uint64_t serial;               /* this connection among those of the process: > 0 */
	struct pool_slot pools[KVC_MAX_POOLS];
};

/* kvc_last_error() gives each thread the message of its own call: a thread
 * sharing c with others must not read c->err, which belongs to c->lock and
 * which the next call, of any thread, clears. A call copies it here before
 * it unlocks; kvc_last_error() returns this copy when it is of c (the
 * thread's last call that took a lock was on c), else a copy of c->err made
 * under the lock (the last call on c, as with one thread). Connections are
 * told apart by serial, not by address, which a closed one passes on. */
static _Thread_local struct {
	uint64_t conn;                 /* the serial of the connection; 0 = none */
	char msg[sizeof(((kvc_conn *)0)->err)];
} thread_err;

static atomic_uint_fast64_t conn_serials;

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t mono_ms(void)
{
	return mono_ns() / 1000000u;
}

/* The deadline of a call that starts now with a timeout of ms (< 0: none). */
static uint64_t deadline_after(int ms)
{
	return ms < 0 ? NO_DEADLINE : mono_ns() + (uint64_t)ms * 1000000u;
}

static int conn_timeout(const kvc_conn *c)
{
	return atomic_load_explicit((_Atomic int *)&c->timeout_ms, memory_order_relaxed);
}

/* Milliseconds left before deadline, rounded up: 0 once it passed, -1 for
 * none (poll()'s timeout). */
static int left_ms(uint64_t deadline)
{
	uint64_t now, ms;

	if (deadline == NO_DEADLINE)
		return -1;
	now = mono_ns();
	if (now >= deadline)
		return 0;
	ms = (deadline - now + 999999u) / 1000000u;
	return ms > INT_MAX ? INT_MAX : (int)ms;
}

static int conn_lock_init(struct conn_lock *l)
{
	pthread_condattr_t a;
	int r;

	if ((r = pthread_mutex_init(&l->mu, NULL)))
		return -r;
	if ((r = pthread_condattr_init(&a)))
		goto out_mu;
	r = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	if (!r)
		r = pthread_cond_init(&l->cv, &a);
	pthread_condattr_destroy(&a);
	if (!r)
		return 0;
out_mu:
	pthread_mutex_destroy(&l->mu);
	return -r;
}

static void conn_lock_destroy(struct conn_lock *l)
{
	pthread_cond_destroy(&l->cv);
	pthread_mutex_destroy(&l->mu);
}

/* Takes c's lock, waiting no later than deadline. Returns 0 or -ETIMEDOUT
 * (then it is not held, and the calling thread's kvc_last_error() says
 * why). */
static int conn_lock(kvc_conn *c, uint64_t deadline)
{
	struct timespec ts = {
		.tv_sec = (time_t)(deadline / 1000000000u),
		.tv_nsec = (long)(deadline % 1000000000u),
	};
	int r = 0;

	pthread_mutex_lock(&c->lock.mu);
	while (c->lock.busy && r == 0) {
		if (deadline == NO_DEADLINE)
			pthread_cond_wait(&c->lock.cv, &c->lock.mu);
		else
			r = pthread_cond_timedwait(&c->lock.cv, &c->lock.mu, &ts);
	}
	if (c->lock.busy) {
		pthread_mutex_unlock(&c->lock.mu);
		thread_err.conn = c->serial;
		snprintf(thread_err.msg, sizeof(thread_err.msg),
			 "timed out waiting for another thread's call on this connection");
		return -ETIMEDOUT;
	}
	c->lock.busy = true;
	pthread_mutex_unlock(&c->lock.mu);
	return 0;
}

static void conn_unlock(kvc_conn *c)
{
	pthread_mutex_lock(&c->lock.mu);
	c->lock.busy = false;
	pthread_cond_signal(&c->lock.cv);
	pthread_mutex_unlock(&c->lock.mu);
}

/* Starts a call on c: its lock and its deadline (c->deadline_ns) from the
 * connection's timeout. Returns 0 or -ETIMEDOUT. */
static int call_begin(kvc_conn *c)
{
	int ms = conn_timeout(c);
	uint64_t deadline = deadline_after(ms);
	int r = conn_lock(c, deadline);

	if (r == 0) {
		c->deadline_ns = deadline;
		c->call_ms = ms;
		c->err[0] = '\0';
	}
	return r;
}

/* Ends a call: its message to the calling thread, then c->lock unlocked. */
static void err_unlock(kvc_conn *c)
{
	thread_err.conn = c->serial;
	memcpy(thread_err.msg, c->err, strlen(c->err) + 1);
	conn_unlock(c);
}

static void set_err(kvc_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void set_err(kvc_conn *c, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
}

static void conn_break(kvc_conn *c)
{
	if (!atomic_exchange(&c->broken, true))
		shutdown(c->fd, SHUT_RDWR);
}

/* The current session, or NULL before the first HelloReply. */
static struct session *conn_sess(const kvc_conn *c)
{
	return atomic_load_explicit((_Atomic(struct session *) *)&c->sess,
				    memory_order_acquire);
}

static struct kvc_map *conn_map(const kvc_conn *c)
{
	struct session *s = conn_sess(c);

	return s ? s->map : NULL;
}

static void session_free(struct session *s)
{
	if (!s)
		return;
	kvc_map_free(s->map);
	free(s);
}

/* Returns 0 or -ENAMETOOLONG. */
KVC_PUBLIC int kvc_default_socket(char *buf, size_t len)
{
	return kv_socket_default(buf, len);
}

/* Waits until c's socket is ready for events (POLLIN, POLLOUT), or an error
 * or hang-up that the next sendmsg/recvmsg reports, no later than the
 * call's deadline. Returns 0, -ETIMEDOUT or -errno. */
static int wait_fd(kvc_conn *c, short events)
{
	for (;;) {
		struct pollfd p = { .fd = c->fd, .events = events };
		int ms = left_ms(c->deadline_ns), n;

		if (ms == 0)
			return -ETIMEDOUT;
		n = poll(&p, 1, ms);
		if (n > 0)
			return 0;
		if (n < 0 && errno != EINTR)
			return -errno;
	}
}

/* --- sending ------------------------------------------------------------- */

/* Without a deadline a blocking sendmsg; with one, a non-blocking one after
 * poll() says there is room. Sends iov[0..niov) whole (iov is consumed). */
static int send_allv(kvc_conn *c, struct iovec *iov, int niov)
{
	bool bounded = c->deadline_ns != NO_DEADLINE;

	while (niov > 0 && !iov->iov_len) {
		iov++;
		niov--;
	}
	while (niov > 0) {
		ssize_t n = kv_sendmsg_fds(c->fd, iov, niov, NULL, 0, bounded ? MSG_DONTWAIT : 0);

		if (n == -EAGAIN && bounded) {
			int r = wait_fd(c, POLLOUT);

			if (r < 0)
				return r;
			continue;
		}
		if (n < 0)
			return (int)n;
		if (n == 0)
			return -EPIPE;
		while (niov > 0 && (size_t)n >= iov->iov_len) {
			n -= (ssize_t)iov->iov_len;
			iov++;
			niov--;
		}
		if (niov > 0) {
			iov->iov_base = (uint8_t *)iov->iov_base + n;
			iov->iov_len -= (size_t)n;
		}
		while (niov > 0 && !iov->iov_len) {
			iov++;
			niov--;
		}
	}
	return 0;
}

static int send_all(kvc_conn *c, const uint8_t *p, size_t len)
{
	struct iovec iov = { .iov_base = (void *)p, .iov_len = len };

	return send_allv(c, &iov, 1);
}

static uint32_t frame_max(const kvc_conn *c);

/* Sends Lookup request req as protobuf-c would pack it, byte for byte (the
 * fields in order, proto3 defaults left out), with the caller's hashes sent
 * from where they are (issue 38: packing copied a chain's 32 bytes a block
 * into the send buffer first, the largest part of a lookup of 1,000's time
 * in this library). Returns what send_request() does. */
static int send_lookup(kvc_conn *c, const Kvcached__Request *req)
{
	const Kvcached__Lookup *m = req->lookup;
	uint8_t pre[KV_FRAME_HDR + 40], *p = pre + KV_FRAME_HDR, post[2];
	size_t hl = m->hashes.len;
	uint64_t sub = (m->pool_id ? 1 + kv_pb_varint_len(m->pool_id) : 0) +
		       (hl ? 1 + kv_pb_varint_len(hl) + hl : 0) + (m->tiers ? 2 : 0);
	uint64_t len = (req->id ? 1 + kv_pb_varint_len(req->id) : 0) + 1 + kv_pb_varint_len(sub) + sub;
	struct iovec iov[3];

	if (len > frame_max(c)) {
		set_err(c, "request of %llu bytes exceeds max_frame %u", (unsigned long long)len,
			frame_max(c));
		return KVC_E2BIG;
	}
	kv_frame_hdr_encode(pre, (uint32_t)len, 0);
	if (req->id) {
		*p++ = 0x08;   /* id = 1, varint */
		p += kv_pb_varint_put(p, req->id);
	}
	*p++ = 0x72;           /* lookup = 14, length-delimited */
	p += kv_pb_varint_put(p, sub);
	if (m->pool_id) {
		*p++ = 0x08;   /* pool_id = 1, varint */
		p += kv_pb_varint_put(p, m->pool_id);
	}
	if (hl) {
		*p++ = 0x12;   /* hashes = 2, length-delimited */
		p += kv_pb_varint_put(p, hl);
	}
	post[0] = 0x18;        /* tiers = 3, varint */
	post[1] = 1;
	iov[0] = (struct iovec){ .iov_base = pre, .iov_len = (size_t)(p - pre) };
	iov[1] = (struct iovec){ .iov_base = hl ? m->hashes.data : NULL, .iov_len = hl };
	iov[2] = (struct iovec){ .iov_base = post, .iov_len = m->tiers ? 2 : 0 };
	return send_allv(c, iov, 3);
}

static uint32_t frame_max(const kvc_conn *c)
{
	struct session *s = c->in_hello ? NULL : conn_sess(c);

	return s ? s->hello.max_frame : KVC_HELLO_MAX_FRAME;
}

/* Returns 0, KVC_E2BIG (nothing sent, c intact) or -errno (c broken). */
static int send_request(kvc_conn *c, const Kvcached__Request *req)
{
	size_t len;

	if (req->op_case == KVCACHED__REQUEST__OP_LOOKUP && req->lookup)
		return send_lookup(c, req);
	len = kvcached__request__get_packed_size(req);

	if (len > frame_max(c)) {
		set_err(c, "request of %zu bytes exceeds max_frame %u", len, frame_max(c));
		return KVC_E2BIG;
	}
	if (c->scap < KV_FRAME_HDR + len) {
		uint8_t *p = realloc(c->sbuf, KV_FRAME_HDR + len);

		if (!p)
			return -ENOMEM;
		c->sbuf = p;
		c->scap = KV_FRAME_HDR + len;
	}
	kv_frame_hdr_encode(c->sbuf, (uint32_t)len, 0);
	kvcached__request__pack(req, c->sbuf + KV_FRAME_HDR);
	return send_all(c, c->sbuf, KV_FRAME_HDR + len);
}

/* --- receiving ----------------------------------------------------------- */

/* Queues fds in arrival order. Consumes them on failure too. */
static int fdq_push(kvc_conn *c, const int *fds, int n)
{
	size_t need;
	int i;

	if (n <= 0)
		return 0;
	need = c->fdq_len + (size_t)n;
	if (need > FDQ_MAX)
		goto fail;
	if (c->fdq_head + need > c->fdq_cap) {
		if (c->fdq_head) {
			memmove(c->fdq, c->fdq + c->fdq_head, c->fdq_len * sizeof(int));
			c->fdq_head = 0;
		}
		if (need > c->fdq_cap) {
			size_t cap = c->fdq_cap ? c->fdq_cap : 16;
			int *q;

			while (cap < need)
				cap *= 2;
			q = realloc(c->fdq, cap * sizeof(int));
			if (!q)
				goto fail;
			c->fdq = q;
			c->fdq_cap = cap;
		}
	}
	memcpy(c->fdq + c->fdq_head + c->fdq_len, fds, (size_t)n * sizeof(int));
	c->fdq_len = need;
	return 0;
fail:
	for (i = 0; i < n; i++)
		close(fds[i]);
	set_err(c, "too many unclaimed file descriptors from the daemon");
	return need > FDQ_MAX ? -EPROTO : -ENOMEM;
}

static int fdq_pop(kvc_conn *c)
{
	int fd;

	kv_assert(c->fdq_len > 0);
	fd = c->fdq[c->fdq_head];
	c->fdq_head++;
	if (--c->fdq_len == 0)
		c->fdq_head = 0;
	return fd;
}

/* Makes room for need bytes from rpos. */
static int rbuf_reserve(kvc_conn *c, size_t need)
{
	if (c->rpos + need <= c->rcap)
		return 0;
	if (need > c->rcap) {
		size_t cap = c->rcap ? c->rcap : RBUF_MIN;
		uint8_t *p;

		while (cap < need)
			cap *= 2;
		p = malloc(cap);
		if (!p)
			return -ENOMEM;
		if (c->rlen)
			memcpy(p, c->rbuf + c->rpos, c->rlen);
		free(c->rbuf);
		c->rbuf = p;
		c->rcap = cap;
	} else {
		memmove(c->rbuf, c->rbuf + c->rpos, c->rlen);
	}
	c->rpos = 0;
	return 0;
}

/* Takes one complete response frame out of c->rbuf and decodes it: 1 and
 * *out (NULL when fast, if given, took the frame as the answer to request
 * id), or 0 when the frame is not all there yet (*need: the bytes it needs
 * from rpos), or -EPROTO. Reads nothing. */
static int rbuf_take_fast(kvc_conn *c, const struct kvc_fast *fast, uint64_t id,
			  Kvcached__Response **out, size_t *need)
{
	uint32_t len;
	int r;

	*need = KV_FRAME_HDR;
	if (c->rlen < KV_FRAME_HDR)
		return 0;
	r = kv_frame_hdr_decode(c->rbuf + c->rpos, frame_max(c), &len);
	if (r == -EMSGSIZE) {
		set_err(c, "response frame exceeds max_frame %u", frame_max(c));
		return -EPROTO;
	}
	if (r < 0) {
		set_err(c, "bad frame header from the daemon");
		return -EPROTO;
	}
	*need = KV_FRAME_HDR + (size_t)len;
	if (c->rlen < *need)
		return 0;
	if (fast && fast->take(c->rbuf + c->rpos + KV_FRAME_HDR, len, id, fast->arg)) {
		*out = NULL;
		c->rpos += *need;
		c->rlen -= *need;
		if (c->rlen == 0)
			c->rpos = 0;
		return 1;
	}
	*out = kvcached__response__unpack(NULL, len, c->rbuf + c->rpos + KV_FRAME_HDR);
	c->rpos += *need;
	c->rlen -= *need;
	if (c->rlen == 0)
		c->rpos = 0;
	if (!*out) {
		set_err(c, "undecodable response from the daemon");
		return -EPROTO;
	}
	return 1;
}

/* One recvmsg into c->rbuf, with room for need bytes from rpos made first
 * (flags: MSG_DONTWAIT or 0). Returns the bytes read, -EAGAIN, -ECONNRESET
 * (the daemon closed the connection), -EPROTO or -errno. */
static int rbuf_fill(kvc_conn *c, size_t need, int flags)
{
	int fds[KV_FRAME_MAX_FDS], nfds = 0, trunc = 0;
	ssize_t n;
	int r = rbuf_reserve(c, need);

	if (r < 0)
		return r;
	n = kv_recvmsg_fds(c->fd, c->rbuf + c->rpos + c->rlen, c->rcap - c->rpos - c->rlen, fds,
			   &nfds, KV_FRAME_MAX_FDS, flags, &trunc);
	r = fdq_push(c, fds, nfds);
	if (n < 0)
		return (int)n;
	if (r < 0)
		return r;
	if (trunc) {
		set_err(c, "file descriptors from the daemon were truncated");
		return -EPROTO;
	}
	if (n == 0) {
		set_err(c, "the daemon closed the connection");
		return -ECONNRESET;
	}
	c->rlen += (size_t)n;
	return n > INT_MAX ? INT_MAX : (int)n;
}

/* Reads one response frame and decodes it (fast first, if given: *out NULL
 * when it took the frame). Returns 0 or -EPROTO/-errno. */
static int recv_response(kvc_conn *c, const struct kvc_fast *fast, uint64_t id,
			 Kvcached__Response **out)
{
	bool bounded = c->deadline_ns != NO_DEADLINE;

	for (;;) {
		size_t need;
		int r = rbuf_take_fast(c, fast, id, out, &need);

		if (r != 0)
			return r < 0 ? r : 0;
		/* With a deadline: poll() first (the reply is seldom there
		 * yet), then a recvmsg that does not block. */
		if (bounded && (r = wait_fd(c, POLLIN)) < 0)
			return r;
		r = rbuf_fill(c, need, bounded ? MSG_DONTWAIT : 0);
		if (r == -EAGAIN && bounded)
			continue;
		if (r < 0)
			return r;
	}
}

/* Maps the segments resp announces, claiming their fds. Returns 0, -EPROTO
 * or -errno; every announced fd is consumed either way. */
static int take_segments(kvc_conn *c, const Kvcached__Response *resp)
{
	size_t i;
	int r = 0;

	if (resp->n_segments == 0)
		return 0;
	if (resp->n_segments > c->fdq_len) {
		set_err(c, "response names %zu segments but carried %zu fds", resp->n_segments,
			c->fdq_len);
		return -EPROTO;
	}
	for (i = 0; i < resp->n_segments; i++) {
		const Kvcached__Segment *s = resp->segments[i];
		int fd = fdq_pop(c), e;
		struct kvc_map *m = c->in_hello ? NULL : conn_map(c);

		if (!m) {
			close(fd);
			e = -EPROTO;
		} else {
			e = kvc_map_segment(m, s->device, s->index, s->offset, s->bytes, fd);
		}
		if (e < 0 && r == 0) {
			r = e;
			if (e == -EPROTO)
				set_err(c, "segment %u of device %u does not fit the device range",
					s->index, s->device);
			else if (*kvc_map_error(m))
				set_err(c, "%s", kvc_map_error(m));
			else
				set_err(c, "mapping segment %u of device %u: %s", s->index,
					s->device, kvc_strerror(e));
		}
	}
	return r;
}

/* --- calls --------------------------------------------------------------- */

/* What a call makes of resp, the response to request id on c: 0 when it is
 * the answer and acceptable (check passed, its segments mapped), else the
 * call's error, with *brk saying whether it breaks c (everything but a
 * daemon's error other than KVC_EPROTO does). resp is the caller's to free. */
static int resp_judge(kvc_conn *c, uint64_t id, const Kvcached__Response *resp,
		      kvc_check_fn *check, const void *arg, bool *brk)
{
	const char *why;
	int r;

	*brk = true;
	if (resp->id == 0 && resp->error && resp->error->code > 0 &&
	    resp->error->code < KVC_ERR_BASE) {
		/* About the connection, not the request (a connection over the
		 * daemon's limits, a protocol error): the daemon closes it. */
		set_err(c, "%s", resp->error->message ? resp->error->message : "");
		return -(KVC_ERR_BASE + (int)resp->error->code);
	}
	if (resp->id != id) {
		if (resp->error && resp->error->message && *resp->error->message)
			set_err(c, "%s", resp->error->message);
		else
			set_err(c, "response id %llu to request %llu",
				(unsigned long long)resp->id, (unsigned long long)id);
		return -EPROTO;
	}
	r = take_segments(c, resp);
	if (r < 0)
		return r;
	if (resp->error && resp->error->code != KVCACHED__ERROR_CODE__OK) {
		int code = (int)resp->error->code;

		set_err(c, "%s", resp->error->message ? resp->error->message : "");
		if (code < 1 || code >= KVC_ERR_BASE)
			return -EPROTO;
		r = -(KVC_ERR_BASE + code);
		*brk = r == KVC_EPROTO;
		return r;
	}
	if (check && (why = check(resp, arg))) {
		set_err(c, "%s", why);
		return -EPROTO;
	}
	return 0;
}

/* A call failed with r in a way that breaks c. */
static void call_broke(kvc_conn *c, int r)
{
	/* The socket failed or the daemon hung up: it went away (it died, or
	 * stops), which a reconnection may mend; anything else is a protocol
	 * failure, which it would not. */
	c->gone = r == -EPIPE || r == -ECONNRESET || r == -ETIMEDOUT;
	if (r == -ETIMEDOUT)
		/* The daemon is stopped or wedged: dropped like a daemon that
		 * went away (it releases what c held when it sees the close),
		 * since its late answer would be taken for the next request's. */
		set_err(c, "no answer from the daemon within the call's deadline (%d ms); "
			"the connection is dropped", c->call_ms);
	else if (c->gone && !c->err[0])
		set_err(c, "the connection to the daemon failed: %s", strerror(-r));
	conn_break(c);
}

/* One request and its response on c, whose lock the caller holds and which
 * is not broken. Returns what kvc_call_fast() returns. */
static int call_locked(kvc_conn *c, Kvcached__Request *req, const struct kvc_fast *fast,
		       kvc_check_fn *check, const void *arg, Kvcached__Response **out)
{
	Kvcached__Response *resp = NULL;
	bool brk = true;
	int r;

	req->id = ++c->next_id;
	r = send_request(c, req);
	if (r == KVC_E2BIG)
		brk = false;
	if (r == -EPIPE || r == -ECONNRESET) {
		/* The daemon may have said why before it closed (a connection
		 * over its limits is told so at once): that is the answer. */
		if ((r = recv_response(c, NULL, 0, &resp)) < 0 || resp->id != 0 || !resp->error) {
			if (r >= 0)
				r = -EPIPE;
			goto out;
		}
	} else if (r < 0) {
		goto out;
	} else if ((r = recv_response(c, fast, req->id, &resp)) < 0) {
		goto out;
	} else if (!resp) {
		*out = NULL;   /* fast took it */
		goto out;
	}
	r = resp_judge(c, req->id, resp, check, arg, &brk);
	if (r < 0)
		goto out;
	*out = resp;
	resp = NULL;
out:
	if (r < 0 && brk)
		call_broke(c, r);
	kvcached__response__free_unpacked(resp, NULL);
	return r;
}

/* Bytes of packed requests kvc_call_many() keeps ready to send. */
#define SEND_WINDOW (64u * 1024)

/* Packs reqs[i] behind the unsent bytes [*soff, *slen) of c->sbuf. */
static int pack_behind(kvc_conn *c, const Kvcached__Request *req, size_t *soff, size_t *slen)
{
	size_t len = kvcached__request__get_packed_size(req);

	if (*soff) {
		memmove(c->sbuf, c->sbuf + *soff, *slen - *soff);
		*slen -= *soff;
		*soff = 0;
	}
	if (c->scap < *slen + KV_FRAME_HDR + len) {
		uint8_t *p = realloc(c->sbuf, *slen + KV_FRAME_HDR + len);

		if (!p)
			return -ENOMEM;
		c->sbuf = p;
		c->scap = *slen + KV_FRAME_HDR + len;
	}
	kv_frame_hdr_encode(c->sbuf + *slen, (uint32_t)len, 0);
	kvcached__request__pack(req, c->sbuf + *slen + KV_FRAME_HDR);
	*slen += KV_FRAME_HDR + len;
	return 0;
}

/* n requests and their responses on c, pipelined (see kvc_call_many_fast());
 * the caller holds c's lock and c is not broken. */
static int call_many_locked(kvc_conn *c, Kvcached__Request *const *reqs, size_t n,
			    const struct kvc_fast *fast, kvc_check_fn *check,
			    const void *const *args, Kvcached__Response **resps, int *rc)
{
	size_t packed = 0, got = 0, soff = 0, slen = 0, need = KV_FRAME_HDR, i;
	int r = 0, send_err = 0;
	bool brk = true;

	for (i = 0; i < n; i++) {
		size_t len = kvcached__request__get_packed_size(reqs[i]);

		resps[i] = NULL;
		if (len > frame_max(c)) {
			set_err(c, "request %zu of %zu bytes exceeds max_frame %u", i, len,
				frame_max(c));
			return KVC_E2BIG;
		}
	}
	for (i = 0; i < n; i++)
		reqs[i]->id = ++c->next_id;
	while (got < n) {
		bool progress = false;
		short ev = POLLIN;

		/* Send what the socket takes, never waiting for room: the
		 * daemon stops reading while its answers are unread, so the
		 * answers are read before anything waits. */
		while (!send_err && packed < n && slen - soff < SEND_WINDOW) {
			if ((r = pack_behind(c, reqs[packed], &soff, &slen)) < 0)
				goto out;
			packed++;
		}
		if (!send_err && soff < slen) {
			struct iovec iov = { .iov_base = c->sbuf + soff, .iov_len = slen - soff };
			ssize_t k = kv_sendmsg_fds(c->fd, &iov, 1, NULL, 0, MSG_DONTWAIT);

			if (k > 0) {
				soff += (size_t)k;
				progress = true;
				if (soff == slen)
					soff = slen = 0;
			} else if (k != -EAGAIN) {
				/* The daemon may have said why before it closed:
				 * its answers are read to the end. */
				send_err = k == 0 ? -EPIPE : (int)k;
				if (send_err != -EPIPE && send_err != -ECONNRESET) {
					r = send_err;
					goto out;
				}
			}
		}
		for (;;) {
			Kvcached__Response *resp = NULL;
			int e = rbuf_take_fast(c, fast ? &fast[got] : NULL, reqs[got]->id, &resp,
					       &need);

			if (e < 0) {
				r = e;
				goto out;
			}
			if (e == 0)
				break;
			progress = true;
			if (!resp) {   /* fast[got] took it */
				rc[got++] = 0;
				if (got == n)
					break;
				continue;
			}
			e = resp_judge(c, reqs[got]->id, resp, check, args ? args[got] : NULL, &brk);
			if (e < 0) {
				kvcached__response__free_unpacked(resp, NULL);
				if (brk) {
					r = e;
					goto out;
				}
				brk = true;
			} else {
				resps[got] = resp;
			}
			rc[got++] = e;
			if (got == n)
				break;
		}
		if (got == n)
			break;
		r = rbuf_fill(c, need, MSG_DONTWAIT);
		if (r > 0)
			progress = true;
		else if (r == -ECONNRESET && send_err)
			r = send_err;
		if (r < 0 && r != -EAGAIN)
			goto out;
		r = 0;
		if (progress)
			continue;
		if (!send_err && (soff < slen || packed < n))
			ev |= POLLOUT;
		if ((r = wait_fd(c, ev)) < 0)
			goto out;
	}
	return 0;
out:
	for (i = 0; i < got; i++) {
		kvcached__response__free_unpacked(resps[i], NULL);
		resps[i] = NULL;
	}
	if (r < 0)
		call_broke(c, r);
	return r;
}

static int reconnect(kvc_conn *c);

/* Where req (Alloc, Seal, Lookup) carries a pool id, or NULL. */
static uint32_t *req_pool(Kvcached__Request *req)
{
	return req->op_case == KVCACHED__REQUEST__OP_ALLOC    ? &req->alloc->pool_id
	       : req->op_case == KVCACHED__REQUEST__OP_SEAL   ? &req->seal->pool_id
	       : req->op_case == KVCACHED__REQUEST__OP_LOOKUP ? &req->lookup->pool_id
							      : NULL;
}

/* The caller's pool id app becomes the daemon's in *id. */
static void pool_to_daemon(kvc_conn *c, uint32_t *id, uint32_t app)
{
	int32_t d;

	if (id)
		*id = app < KVC_MAX_POOLS &&
		      (d = atomic_load_explicit(&c->pool_app[app], memory_order_relaxed)) >= 0
			      ? (uint32_t)d : app;
}

int kvc_call_fast(kvc_conn *c, Kvcached__Request *req, const struct kvc_fast *fast,
		  kvc_check_fn *check, const void *arg, Kvcached__Response **out)
{
	uint32_t *id, app = 0;
	int r;

	if (!c || !req || !out)
		return -EINVAL;
	if ((id = req_pool(req)))
		app = *id;
	if ((r = call_begin(c)) < 0)
		return r;
	if (atomic_load(&c->broken) && (r = reconnect(c)) < 0)
		goto out;
	pool_to_daemon(c, id, app);
	r = call_locked(c, req, fast, check, arg, out);
	if (r < 0 && r != -ETIMEDOUT && c->gone && c->reconnect && c->next_try_ms == 0) {
		/* The daemon went away, before or while it served req: all it
		 * held is gone with it, so req may run again on the next one
		 * (its handles, if any, are stale there). Once per call. */
		if ((r = reconnect(c)) == 0) {
			pool_to_daemon(c, id, app);
			r = call_locked(c, req, fast, check, arg, out);
		}
	}
out:
	err_unlock(c);
	return r;
}

int kvc_call_check(kvc_conn *c, Kvcached__Request *req, kvc_check_fn *check, const void *arg,
		   Kvcached__Response **out)
{
	return kvc_call_fast(c, req, NULL, check, arg, out);
}

int kvc_call(kvc_conn *c, Kvcached__Request *req, Kvcached__Response **out)
{
	return kvc_call_check(c, req, NULL, NULL, out);
}

static void pools_to_daemon(kvc_conn *c, Kvcached__Request *const *reqs, const uint32_t *apps,
			    size_t n)
{
	for (size_t i = 0; i < n; i++)
		pool_to_daemon(c, req_pool(reqs[i]), apps[i]);
}

int kvc_call_many(kvc_conn *c, Kvcached__Request *const *reqs, size_t n, kvc_check_fn *check,
		  const void *const *args, Kvcached__Response **resps, int *rc)
{
	return kvc_call_many_fast(c, reqs, n, NULL, check, args, resps, rc);
}

int kvc_call_many_fast(kvc_conn *c, Kvcached__Request *const *reqs, size_t n,
		       const struct kvc_fast *fast, kvc_check_fn *check, const void *const *args,
		       Kvcached__Response **resps, int *rc)
{
	uint32_t *apps, *id;
	size_t i;
	int r;

	if (!c || (n && (!reqs || !resps || !rc)))
		return -EINVAL;
	if (n == 0)
		return 0;
	if (n > MAX_BATCH || !(apps = malloc(n * sizeof(*apps))))
		return -ENOMEM;
	for (i = 0; i < n; i++)
		apps[i] = (id = req_pool(reqs[i])) ? *id : 0;
	if ((r = call_begin(c)) < 0)
		goto out_free;
	if (atomic_load(&c->broken) && (r = reconnect(c)) < 0)
		goto out;
	pools_to_daemon(c, reqs, apps, n);
	r = call_many_locked(c, reqs, n, fast, check, args, resps, rc);
	if (r < 0 && r != -ETIMEDOUT && c->gone && c->reconnect && c->next_try_ms == 0) {
		/* As kvc_call_check(): the whole batch once more on the next
		 * daemon (what the first one answered went with it). */
		if ((r = reconnect(c)) == 0) {
			pools_to_daemon(c, reqs, apps, n);
			r = call_many_locked(c, reqs, n, fast, check, args, resps, rc);
		}
	}
out:
	err_unlock(c);
out_free:
	free(apps);
	return r;
}

/* --- connecting ---------------------------------------------------------- */

/* Connects to path no later than deadline. An AF_UNIX connect() waits while
 * the listener's backlog is full (a daemon that does not accept), for as
 * long as SO_SNDTIMEO says, then fails with EAGAIN; interrupted, it has not
 * connected and is tried again. Returns 0, -ETIMEDOUT or -errno. */
static int connect_unix(const char *path, uint64_t deadline, int *out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct timeval tv = { 0 };
	int fd, r;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	for (;;) {
		int ms = left_ms(deadline);

		if (ms == 0) {
			r = -ETIMEDOUT;
			break;
		}
		if (ms > 0) {
			tv = (struct timeval){ .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };
			if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0) {
				r = -errno;
				break;
			}
		}
		r = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ? -errno : 0;
		if (r == -EISCONN)
			r = 0;
		if (r != -EINTR && (r != -EAGAIN || ms < 0))
			break;
	}
	/* Sends with a deadline do not block (MSG_DONTWAIT); those without
	 * one wait as long as it takes. */
	if (r == 0 && tv.tv_sec + tv.tv_usec) {
		tv = (struct timeval){ 0 };
		if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0)
			r = -errno;
	}
	if (r < 0) {
		close(fd);
		return r;
	}
	*out = fd;
	return 0;
}

static bool is_pow2(uint64_t v)
{
	return v && !(v & (v - 1));
}

static const char *check_hello(const Kvcached__Response *resp, const void *arg)
{
	const Kvcached__HelloReply *h = resp->hello;
	uint64_t os_page = (uint64_t)sysconf(_SC_PAGESIZE);

	(void)arg;
	if (resp->result_case != KVCACHED__RESPONSE__RESULT_HELLO || !h)
		return "no HelloReply from the daemon";
	if (h->version != KV_PROTO_VERSION)
		return "the daemon chose a protocol version this library does not speak";
	if (!is_pow2(h->page_bytes) || h->page_bytes < os_page || h->segment_bytes == 0 ||
	    h->segment_bytes % h->page_bytes || h->device_bytes == 0 ||
	    h->device_bytes > MAX_DEVICE_BYTES || h->device_bytes % h->segment_bytes ||
	    h->device_bytes / h->segment_bytes > MAX_SEGMENTS)
		return "the daemon's page, segment or device size is invalid";
	if (h->devices == 0 || h->devices > MAX_DEVICES)
		return "the daemon's device count is invalid";
	if (h->n_device_uuid && h->n_device_uuid != h->devices)
		return "the daemon sent device UUIDs for another number of devices";
	for (size_t i = 0; i < h->n_device_uuid; i++)
		if (h->device_uuid[i].len != 16)
			return "the daemon sent a device UUID that is not 16 bytes";
	if (h->max_frame < 64 || h->max_batch == 0 || h->max_batch > MAX_BATCH)
		return "the daemon's max_frame or max_batch is invalid";
	return NULL;
}

/* Connects c (lock held, or not yet shared) to c->path: a fresh socket, the
 * Hello, a new session. On success the old session, if any, is retired (its
 * map's memory replaced by zero pages: stale pointers read zeros, never the
 * new daemon's memory or a fault) and c is OPEN. Returns 0 or a negative
 * error; c is left as it was on failure. */
static int open_session(kvc_conn *c)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Hello hello = KVCACHED__HELLO__INIT;
	Kvcached__Response *resp = NULL;
	const Kvcached__HelloReply *h;
	struct session *sess = NULL, *old = conn_sess(c), **rt;
	int fd = -1, r, oldfd = c->fd;

	r = connect_unix(c->path, c->deadline_ns, &fd);
	if (r < 0)
		return r;
	/* The old socket's unread bytes and fds belong to the old daemon. */
	while (c->fdq_len)
		close(fdq_pop(c));
	c->rpos = c->rlen = 0;
	c->fd = fd;
	atomic_store(&c->broken, false);
	hello.min_version = KV_PROTO_VERSION;
	hello.max_version = KV_PROTO_VERSION;
	hello.namespace_ = c->ns;
	hello.client_name = c->client_name;
	req.op_case = KVCACHED__REQUEST__OP_HELLO;
	req.hello = &hello;
	/* A Hello reply that names segments is a protocol violation
	 * (take_segments() refuses it). */
	c->in_hello = true;
	r = call_locked(c, &req, NULL, check_hello, NULL, &resp);
	c->in_hello = false;
	if (r < 0)
		goto fail;
	h = resp->hello;
	r = -ENOMEM;
	if (old) {
		if (!(rt = realloc(c->retired, (c->nretired + 1) * sizeof(*rt))))
			goto fail;
		c->retired = rt;
	}
	if (!(sess = calloc(1, sizeof(*sess))))
		goto fail;
	r = kvc_map_new(h->backend, h->devices, h->device_bytes, h->segment_bytes, &sess->map);
	if (r < 0)
		goto fail;
	if (h->n_device_uuid) {
		/* Checked above: 16 bytes per device (or none: an old daemon).
		 * On the heap: a caller's thread may have a small stack. */
		unsigned char (*uuid)[16] = malloc(h->n_device_uuid * sizeof(*uuid));

		if (!uuid)
			goto fail;
		for (size_t i = 0; i < h->n_device_uuid; i++)
			memcpy(uuid[i], h->device_uuid[i].data, 16);
		kvc_map_set_devices(sess->map, uuid, c->cuda_device);
		free(uuid);
	} else {
		kvc_map_set_devices(sess->map, NULL, c->cuda_device);
	}
	sess->hello = (struct kvc_hello){
		.version = h->version,
		.page_bytes = h->page_bytes,
		.segment_bytes = h->segment_bytes,
		.device_bytes = h->device_bytes,
		.devices = h->devices,
		.max_frame = h->max_frame,
		.max_batch = h->max_batch,
		.session_id = h->session_id,
	};
	snprintf(sess->hello.backend, sizeof(sess->hello.backend), "%s",
		 h->backend ? h->backend : "");
	kvcached__response__free_unpacked(resp, NULL);
	if (old) {
		c->retired[c->nretired++] = old;
		/* kvc_restarts() moves before the old memory goes: a thread
		 * that reads zeros through a pointer from before and then
		 * asks sees that it moved. Not for a session whose
		 * reconnection failed half-way: it served nothing. */
		if (c->sess_done)
			atomic_fetch_add(&c->restarts, 1);
		c->sess_done = false;
		kvc_map_retire(old->map);
	}
	atomic_store_explicit(&c->sess, sess, memory_order_release);
	if (oldfd >= 0)
		close(oldfd);
	return 0;
fail:
	kvcached__response__free_unpacked(resp, NULL);
	session_free(sess);
	close(fd);
	c->fd = oldfd;
	atomic_store(&c->broken, true);
	return r;
}

static const char *check_register(const Kvcached__Response *r, const void *arg)
{
	(void)arg;
	if (r->result_case != KVCACHED__RESPONSE__RESULT_REGISTER_POOL)
		return "the daemon's reply is not a RegisterPoolReply";
	if (r->register_pool->pool_id >= KVC_MAX_POOLS)
		return "the daemon returned a pool id out of range";
	return NULL;
}

/* Registers rec on c (lock held, OPEN). Returns the daemon's id or an error. */
static int register_rec(kvc_conn *c, const struct pool_rec *rec)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__RegisterPool rp = KVCACHED__REGISTER_POOL__INIT;
	Kvcached__Response *resp = NULL;
	int r;

	rp.name = rec->name;
	rp.device = rec->device;
	rp.block_bytes = rec->block_bytes;
	rp.block_tokens = rec->block_tokens;
	rp.dtype = rec->dtype;
	rp.layout.data = rec->layout;
	rp.layout.len = rec->layout_len;
	rp.model = rec->model;
	req.op_case = KVCACHED__REQUEST__OP_REGISTER_POOL;
	req.register_pool = &rp;
	r = call_locked(c, &req, NULL, check_register, NULL, &resp);
	if (r < 0)
		return r;
	r = (int)resp->register_pool->pool_id;
	kvcached__response__free_unpacked(resp, NULL);
	return r;
}

static void pool_slot_set(kvc_conn *c, uint32_t pool, uint32_t device, uint64_t block_bytes)
{
	atomic_store_explicit(&c->pools[pool].device, device, memory_order_relaxed);
	atomic_store_explicit(&c->pools[pool].block_bytes, block_bytes, memory_order_release);
}

/* A connection the daemon's going away broke comes back (lock held): at most
 * one try per backoff interval. Returns 0 (OPEN again, pools registered
 * again) or a negative error with c still BROKEN. */
static int reconnect(kvc_conn *c)
{
	uint64_t now = mono_ms();
	size_t i;
	int r;

	if (!c->gone || !c->reconnect) {
		set_err(c, "connection broken by an earlier error");
		return -EPIPE;
	}
	if (now < c->next_try_ms) {
		set_err(c, "the daemon went away; the next reconnection attempt is in %llu ms",
			(unsigned long long)(c->next_try_ms - now));
		return -EPIPE;
	}
	r = open_session(c);
	for (i = 0; r == 0 && i < c->nrecs; i++) {
		int d = register_rec(c, &c->recs[i]);

		if (d < 0)
			r = d;
		else
			c->recs[i].daemon = (uint32_t)d;
	}
	if (r < 0) {
		char why[sizeof(c->err)];

		snprintf(why, sizeof(why), "%s", c->err[0] ? c->err : strerror(-r));
		conn_break(c);
		c->gone = true;
		c->backoff_ms = c->backoff_ms ? c->backoff_ms * 2 : BACKOFF_MIN_MS;
		if (c->backoff_ms > BACKOFF_MAX_MS)
			c->backoff_ms = BACKOFF_MAX_MS;
		c->next_try_ms = mono_ms() + c->backoff_ms;
		set_err(c, "the daemon went away and reconnecting failed (%s); next try in %u ms",
			why, c->backoff_ms);
		return r == -ETIMEDOUT ? r : -EPIPE;
	}
	/* The old daemon's pool ids name nothing now (its handles are stale,
	 * whatever pool they name); then the new ids. */
	for (i = 0; i < KVC_MAX_POOLS; i++)
		atomic_store_explicit(&c->pools[i].block_bytes, 0, memory_order_release);
	for (i = 0; i < c->nrecs; i++) {
		pool_slot_set(c, c->recs[i].daemon, c->recs[i].device, c->recs[i].block_bytes);
		atomic_store_explicit(&c->pool_app[c->recs[i].app], (int32_t)c->recs[i].daemon,
				      memory_order_relaxed);
	}
	c->gone = false;
	c->backoff_ms = 0;
	c->next_try_ms = 0;
	c->sess_done = true;
	c->err[0] = '\0';
	return 0;
}

static char *dup_or_empty(const char *s)
{
	return strdup(s ? s : "");
}

/* A copy of s as text, bytes that are not UTF-8 and control characters as
 * '?' (the daemon refuses a request whose strings are not UTF-8, and shows
 * control characters so; a client name is free text, and the program's
 * name may be any bytes). */
static char *dup_text(const char *s)
{
	size_t len = strlen(s);
	char *t = malloc(len + 1);

	if (t)
		kv_text_clean(t, len, s);
	return t;
}

/* The library's default timeout: $KVCACHE_TIMEOUT_MS (milliseconds, or a
 * negative number for none) when set to a number other than 0, else
 * TIMEOUT_DEFAULT_MS. */
static int timeout_default(void)
{
	const char *env = getenv("KVCACHE_TIMEOUT_MS");
	char *end;
	long v;

	if (!env || !*env)
		return TIMEOUT_DEFAULT_MS;
	errno = 0;
	v = strtol(env, &end, 10);
	if (errno || *end || v == 0)
		return TIMEOUT_DEFAULT_MS;
	return v < 0 ? -1 : v > INT_MAX ? INT_MAX : (int)v;
}

/* timeout_ms as kvc_options says (0: the default) to what c keeps. */
static int timeout_resolve(int timeout_ms)
{
	return timeout_ms == 0 ? timeout_default() : timeout_ms < 0 ? -1 : timeout_ms;
}

/* Returns 0 or -EINVAL. */
KVC_PUBLIC int kvc_set_timeout(kvc_conn *c, int timeout_ms)
{
	if (!c)
		return -EINVAL;
	atomic_store(&c->timeout_ms, timeout_resolve(timeout_ms));
	return 0;
}

/* Returns 0 or a negative error; *out untouched on failure. */
KVC_PUBLIC int kvc_connect(const char *path, const struct kvc_options *opt, kvc_conn **out)
{
	char def[sizeof(((struct sockaddr_un *)0)->sun_path)];
	const char *env = getenv("KVCACHE_RECONNECT");
	/* The deadline runs from the call's start. */
	int timeout_ms = timeout_resolve(opt ? opt->timeout_ms : 0);
	uint64_t deadline = deadline_after(timeout_ms);
	kvc_conn *c;
	size_t i;
	int r;

	if (!out)
		return -EINVAL;
	if (opt && opt->ns && !kv_utf8_ok(opt->ns))
		return KVC_EINVAL;   /* the daemon would refuse the Hello */
	if (!path) {
		r = kvc_default_socket(def, sizeof(def));
		if (r < 0)
			return r;
		path = def;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->fd = -1;
	c->serial = atomic_fetch_add(&conn_serials, 1) + 1;
	atomic_init(&c->timeout_ms, timeout_ms);
	c->deadline_ns = deadline;
	c->call_ms = timeout_ms;
	r = conn_lock_init(&c->lock);
	if (r < 0) {
		free(c);
		return r;
	}
	for (i = 0; i < KVC_MAX_POOLS; i++)
		atomic_init(&c->pool_app[i], -1);
	c->reconnect = !env || strcmp(env, "0");
	c->path = strdup(path);
	c->ns = dup_or_empty(opt ? opt->ns : NULL);
	c->client_name = dup_text(opt && opt->client_name ? opt->client_name
							  : program_invocation_short_name);
	c->cuda_device = opt && opt->cuda_device > 0 ? opt->cuda_device - 1 : -1;
	if (!c->path || !c->ns || !c->client_name) {
		r = -ENOMEM;
		goto out;
	}
	r = open_session(c);
	if (r < 0)
		goto out;
	c->sess_done = true;
	*out = c;
	c = NULL;
	r = 0;
out:
	kvc_close(c);
	return r;
}

KVC_PUBLIC void kvc_close(kvc_conn *c)
{
	size_t i;

	if (!c)
		return;
	if (c->fd >= 0)
		close(c->fd);
	while (c->fdq_len)
		close(fdq_pop(c));
	session_free(conn_sess(c));
	for (i = 0; i < c->nretired; i++)
		session_free(c->retired[i]);
	for (i = 0; i < c->nrecs; i++) {
		free(c->recs[i].name);
		free(c->recs[i].dtype);
		free(c->recs[i].model);
		free(c->recs[i].layout);
	}
	free(c->recs);
	free(c->retired);
	free(c->path);
	free(c->ns);
	free(c->client_name);
	free(c->fdq);
	free(c->rbuf);
	free(c->sbuf);
	conn_lock_destroy(&c->lock);
	free(c);
}

KVC_PUBLIC uint64_t kvc_restarts(kvc_conn *c)
{
	return c ? atomic_load(&c->restarts) : 0;
}

/* --- pools and blocks ---------------------------------------------------- */

/* The caller's id for daemon pool d: the id it had before a reconnection,
 * else d itself where that is free, else the lowest free one. */
static int pick_app(kvc_conn *c, uint32_t d)
{
	size_t i;

	for (i = 0; i < c->nrecs; i++)
		if (c->recs[i].daemon == d)
			return c->recs[i].app;
	if (atomic_load_explicit(&c->pool_app[d], memory_order_relaxed) < 0)
		return (int)d;
	for (i = 0; i < KVC_MAX_POOLS; i++)
		if (atomic_load_explicit(&c->pool_app[i], memory_order_relaxed) < 0)
			return (int)i;
	return -1;
}

int kvc_conn_register(kvc_conn *c, const struct kvc_pool_desc *d, const char *model)
{
	struct pool_rec rec = {
		.name = (char *)d->name, .dtype = (char *)(d->dtype ? d->dtype : ""),
		.model = (char *)(model ? model : ""),
		.device = d->device, .block_tokens = d->block_tokens,
		.block_bytes = d->block_bytes, .layout = (uint8_t *)d->layout,
		.layout_len = d->layout ? d->layout_len : 0,
	};
	struct pool_rec *recs;
	size_t i;
	int r, app;

	if ((r = call_begin(c)) < 0)
		return r;
	if (!kv_utf8_ok(rec.name) || !kv_utf8_ok(rec.dtype) || !kv_utf8_ok(rec.model)) {
		/* The daemon closes a connection that sends a string that is
		 * not UTF-8 (a protocol error); a caller's mistake is EINVAL. */
		r = KVC_EINVAL;
		set_err(c, "the pool's name, dtype or model is not valid UTF-8");
		goto out;
	}
	if (atomic_load(&c->broken) && (r = reconnect(c)) < 0)
		goto out;
	if ((r = register_rec(c, &rec)) < 0)
		goto out;
	rec.daemon = (uint32_t)r;
	for (i = 0; i < c->nrecs && c->recs[i].daemon != rec.daemon; i++)
		;
	if (i == c->nrecs) {
		/* Kept to register it again after a reconnection. */
		if ((app = pick_app(c, rec.daemon)) < 0) {
			r = KVC_E2BIG;
			set_err(c, "this connection has %u pools already", KVC_MAX_POOLS);
			goto out;
		}
		recs = realloc(c->recs, (c->nrecs + 1) * sizeof(*recs));
		if (!recs) {
			r = -ENOMEM;
			goto out;
		}
		c->recs = recs;
		rec.app = app;
		rec.name = strdup(rec.name);
		rec.dtype = strdup(rec.dtype);
		rec.model = strdup(rec.model);
		rec.layout = rec.layout_len ? malloc(rec.layout_len) : NULL;
		if (!rec.name || !rec.dtype || !rec.model || (rec.layout_len && !rec.layout)) {
			free(rec.name);
			free(rec.dtype);
			free(rec.model);
			free(rec.layout);
			r = -ENOMEM;
			goto out;
		}
		if (rec.layout_len)
			memcpy(rec.layout, d->layout, rec.layout_len);
		c->recs[c->nrecs++] = rec;
	}
	pool_slot_set(c, c->recs[i].daemon, d->device, d->block_bytes);
	atomic_store_explicit(&c->pool_app[c->recs[i].app], (int32_t)c->recs[i].daemon,
			      memory_order_relaxed);
	atomic_store_explicit(&c->app_bytes[c->recs[i].app], c->recs[i].block_bytes,
			      memory_order_relaxed);
	r = c->recs[i].app;
out:
	err_unlock(c);
	return r;
}

/* Lock-free. */
KVC_PUBLIC uint64_t kvc_pool_block_bytes(kvc_conn *c, int pool)
{
	if (!c || pool < 0 || (unsigned)pool >= KVC_MAX_POOLS)
		return 0;
	return atomic_load_explicit(&c->app_bytes[pool], memory_order_relaxed);
}

/* Lock-free: reads only the pool slot and the map, both published with
 * release stores. */
KVC_PUBLIC void *kvc_block_ptr(kvc_conn *c, kvc_block b)
{
	uint32_t pool = KVC_BLOCK_POOL(b), dev;
	uint64_t bb, off, seg, s, last;
	const struct kvc_hello *h;
	struct session *sess;
	char *base;

	/* One session's geometry and map: those of the same daemon. */
	if (!c || !(sess = conn_sess(c)))
		return NULL;
	h = &sess->hello;
	bb = atomic_load_explicit(&c->pools[pool].block_bytes, memory_order_acquire);
	if (!bb)
		return NULL;
	dev = atomic_load_explicit(&c->pools[pool].device, memory_order_relaxed);
	/* page < 2^20, page_bytes <= 2^50, slot < 2^12: no overflow below. */
	if (bb > h->device_bytes)
		return NULL;
	off = (uint64_t)KVC_BLOCK_PAGE(b) * h->page_bytes + (uint64_t)KVC_BLOCK_SLOT(b) * bb;
	if (off > h->device_bytes - bb)
		return NULL;
	seg = h->segment_bytes;
	last = (off + bb - 1) / seg;
	for (s = off / seg; s <= last; s++)
		if (!kvc_map_is_mapped(sess->map, dev, (uint32_t)s))
			return NULL;
	base = kvc_map_base(sess->map, dev);
	return base ? base + off : NULL;
}

/* --- accessors and errors ------------------------------------------------ */

/* The current session's: a reconnection publishes a new one; the old one
 * stays readable until kvc_close(). */
const struct kvc_hello *kvc_conn_hello(const kvc_conn *c)
{
	return &conn_sess(c)->hello;
}

int kvc_conn_fd(const kvc_conn *c)
{
	return c->fd;
}

bool kvc_conn_broken(const kvc_conn *c)
{
	return atomic_load((atomic_bool *)&c->broken);
}

bool kvc_conn_segment_mapped(const kvc_conn *c, uint32_t dev, uint32_t index)
{
	return c && kvc_map_is_mapped(conn_map(c), dev, index);
}

/* The calling thread's copy (see thread_err): valid until the thread's next
 * call into the library. */
KVC_PUBLIC const char *kvc_last_error(kvc_conn *c)
{
	if (!c)
		return "";
	/* Past the deadline, conn_lock() leaves its own message. */
	if (thread_err.conn != c->serial && conn_lock(c, deadline_after(conn_timeout(c))) == 0)
		err_unlock(c);
	return thread_err.msg;
}

static const char *const kvc_errors[] = {
	[1] = "invalid argument",
	[2] = "no space in the pool, even after eviction",
	[3] = "no such pool or namespace",
	[4] = "stale, forged or foreign block handle",
	[5] = "operation not permitted for this peer",
	[6] = "protocol violation, connection closed",
	[7] = "no common protocol version",
	[8] = "pool exists with another layout",
	[9] = "batch or frame larger than the daemon allows",
	[10] = "internal daemon error",
	[11] = "block in the wrong state for this operation",
	[12] = "daemon shutting down",
	[13] = "a tier copy or disk I/O failed; the data stays where it was",
	/* 14..15: the tiers */
	[16] = "invalid daemon configuration",
	[17] = "this user may not open that namespace",
	[18] = "the namespace's quota is full of blocks it holds",
	[19] = "the daemon is short of a resource for now; retry",
};

KVC_PUBLIC const char *kvc_strerror(int err)
{
	const char *s;

	if (err == 0)
		return "success";
	if (err <= -KVC_ERR_BASE && err > -2 * KVC_ERR_BASE) {
		int code = -err - KVC_ERR_BASE;

		if (code < (int)(sizeof(kvc_errors) / sizeof(kvc_errors[0])) && kvc_errors[code])
			return kvc_errors[code];
		return "unknown daemon error";
	}
	if (err == INT_MIN)
		return "unknown error";
	s = strerrordesc_np(err < 0 ? -err : err);
	return s ? s : "unknown error";
}
