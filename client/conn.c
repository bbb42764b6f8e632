/* The connection to kvcached: socket, Hello, request/response framing, the
 * queue of received segment fds, the pool table and block addresses.
 *
 * One request is in flight per connection; c->lock serializes calls and owns
 * everything below it in struct kvc_conn except the pool table and the map,
 * which kvc_block_ptr() reads without the lock: pool slots are published with
 * release stores (device before block_bytes, block_bytes != 0 meaning
 * "registered"), segments by the map module (see map.c).
 *
 * Connection states:
 *
 *   OPEN --socket error, EOF, bad frame, bad response, daemon EPROTO--> BROKEN
 *
 * OPEN: the receive buffer holds no complete frame between calls, and every
 * fd in the queue belongs to a frame not yet parsed. BROKEN: the socket is
 * shut down (the daemon releases our references); every call returns -EPIPE
 * without touching it; mappings stay until kvc_close(). */
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
#include <unistd.h>

#include "frame.h"
#include "kvassert.h"

#define RBUF_MIN (64u * 1024)
#define FDQ_MAX 1024u               /* unclaimed fds before we call it a flood */
#define MAX_DEVICES 1024u
#define MAX_SEGMENTS (1u << 24)     /* per device */
#define MAX_BATCH (1u << 24)        /* keeps every count an int */
#define MAX_DEVICE_BYTES (1ull << 50)

struct pool_slot {
	_Atomic uint64_t block_bytes;  /* 0: not registered on this connection */
	_Atomic uint32_t device;
};

struct kvc_conn {
	pthread_mutex_t lock;
	int fd;
	atomic_bool broken;
	uint64_t next_id;
	struct kvc_hello hello;        /* max_frame 0 until the HelloReply */
	struct kvc_map *map;           /* NULL until the HelloReply */

	uint8_t *rbuf;                 /* [rpos, rpos + rlen): received, unparsed */
	size_t rcap, rpos, rlen;
	uint8_t *sbuf;
	size_t scap;
	int *fdq;                      /* [fdq_head, fdq_head + fdq_len): unclaimed fds */
	size_t fdq_cap, fdq_head, fdq_len;

	char err[512];                 /* kvc_last_error(): the daemon sends at most 511 bytes */
	struct pool_slot pools[KVC_MAX_POOLS];
};

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

/* Returns 0 or -ENAMETOOLONG. */
KVC_PUBLIC int kvc_default_socket(char *buf, size_t len)
{
	return kv_socket_default(buf, len);
}

/* --- sending ------------------------------------------------------------- */

static int send_all(int fd, const uint8_t *p, size_t len)
{
	while (len > 0) {
		struct iovec iov = { .iov_base = (void *)p, .iov_len = len };
		ssize_t n = kv_sendmsg_fds(fd, &iov, 1, NULL, 0, 0);

		if (n < 0)
			return (int)n;
		if (n == 0)
			return -EPIPE;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static uint32_t frame_max(const kvc_conn *c)
{
	return c->hello.max_frame ? c->hello.max_frame : KVC_HELLO_MAX_FRAME;
}

/* Returns 0, KVC_E2BIG (nothing sent, c intact) or -errno (c broken). */
static int send_request(kvc_conn *c, const Kvcached__Request *req)
{
	size_t len = kvcached__request__get_packed_size(req);

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
	return send_all(c->fd, c->sbuf, KV_FRAME_HDR + len);
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

/* Reads one response frame and decodes it. Returns 0 or -EPROTO/-errno. */
static int recv_response(kvc_conn *c, Kvcached__Response **out)
{
	for (;;) {
		int fds[KV_FRAME_MAX_FDS], nfds = 0, trunc = 0;
		size_t need = KV_FRAME_HDR;
		ssize_t n;
		int r;

		if (c->rlen >= KV_FRAME_HDR) {
			uint32_t len;

			r = kv_frame_hdr_decode(c->rbuf + c->rpos, frame_max(c), &len);
			if (r == -EMSGSIZE) {
				set_err(c, "response frame exceeds max_frame %u", frame_max(c));
				return -EPROTO;
			}
			if (r < 0) {
				set_err(c, "bad frame header from the daemon");
				return -EPROTO;
			}
			need = KV_FRAME_HDR + (size_t)len;
			if (c->rlen >= need) {
				Kvcached__Response *resp = kvcached__response__unpack(
					NULL, len, c->rbuf + c->rpos + KV_FRAME_HDR);

				c->rpos += need;
				c->rlen -= need;
				if (c->rlen == 0)
					c->rpos = 0;
				if (!resp) {
					set_err(c, "undecodable response from the daemon");
					return -EPROTO;
				}
				*out = resp;
				return 0;
			}
		}
		r = rbuf_reserve(c, need);
		if (r < 0)
			return r;
		n = kv_recvmsg_fds(c->fd, c->rbuf + c->rpos + c->rlen,
				   c->rcap - c->rpos - c->rlen, fds, &nfds, KV_FRAME_MAX_FDS, 0,
				   &trunc);
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

		if (!c->map) {
			close(fd);
			e = -EPROTO;
		} else {
			e = kvc_map_segment(c->map, s->device, s->index, s->offset, s->bytes, fd);
		}
		if (e < 0 && r == 0) {
			r = e;
			if (e == -EPROTO)
				set_err(c, "segment %u of device %u does not fit the device range",
					s->index, s->device);
			else if (*kvc_map_error(c->map))
				set_err(c, "%s", kvc_map_error(c->map));
			else
				set_err(c, "mapping segment %u of device %u: %s", s->index,
					s->device, kvc_strerror(e));
		}
	}
	return r;
}

/* --- calls --------------------------------------------------------------- */

int kvc_call_check(kvc_conn *c, Kvcached__Request *req, kvc_check_fn *check, const void *arg,
		   Kvcached__Response **out)
{
	Kvcached__Response *resp = NULL;
	bool brk = true;
	const char *why;
	int r;

	if (!c || !req || !out)
		return -EINVAL;
	pthread_mutex_lock(&c->lock);
	c->err[0] = '\0';
	if (atomic_load(&c->broken)) {
		set_err(c, "connection broken by an earlier error");
		r = -EPIPE;
		brk = false;
		goto out;
	}
	req->id = ++c->next_id;
	r = send_request(c, req);
	if (r == KVC_E2BIG)
		brk = false;
	if (r == -EPIPE || r == -ECONNRESET) {
		/* The daemon may have said why before it closed (a connection
		 * over its limits is told so at once): that is the answer. */
		if (recv_response(c, &resp) < 0 || resp->id != 0 || !resp->error)
			goto out;
	} else if (r < 0) {
		goto out;
	} else if ((r = recv_response(c, &resp)) < 0) {
		goto out;
	}
	if (resp->id == 0 && resp->error && resp->error->code > 0 &&
	    resp->error->code < KVC_ERR_BASE) {
		/* About the connection, not the request (a connection over the
		 * daemon's limits, a protocol error): the daemon closes it. */
		set_err(c, "%s", resp->error->message ? resp->error->message : "");
		r = -(KVC_ERR_BASE + (int)resp->error->code);
		goto out;
	}
	if (resp->id != req->id) {
		if (resp->error && resp->error->message && *resp->error->message)
			set_err(c, "%s", resp->error->message);
		else
			set_err(c, "response id %llu to request %llu",
				(unsigned long long)resp->id, (unsigned long long)req->id);
		r = -EPROTO;
		goto out;
	}
	r = take_segments(c, resp);
	if (r < 0)
		goto out;
	if (resp->error && resp->error->code != KVCACHED__ERROR_CODE__OK) {
		int code = (int)resp->error->code;

		set_err(c, "%s", resp->error->message ? resp->error->message : "");
		if (code < 1 || code >= KVC_ERR_BASE) {
			r = -EPROTO;
			goto out;
		}
		r = -(KVC_ERR_BASE + code);
		brk = r == KVC_EPROTO;
		goto out;
	}
	if (check && (why = check(resp, arg))) {
		set_err(c, "%s", why);
		r = -EPROTO;
		goto out;
	}
	*out = resp;
	resp = NULL;
	r = 0;
out:
	if (r < 0 && brk)
		conn_break(c);
	pthread_mutex_unlock(&c->lock);
	kvcached__response__free_unpacked(resp, NULL);
	return r;
}

int kvc_call(kvc_conn *c, Kvcached__Request *req, Kvcached__Response **out)
{
	return kvc_call_check(c, req, NULL, NULL, out);
}

/* --- connecting ---------------------------------------------------------- */

static int connect_unix(const char *path, int *out)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, r;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = -errno;
		/* Interrupted, the connection goes on: wait for its outcome. */
		if (r == -EINTR) {
			struct pollfd p = { .fd = fd, .events = POLLOUT };
			socklen_t len = sizeof(r);
			int e = 0;

			while (poll(&p, 1, -1) < 0 && errno == EINTR)
				;
			r = getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) < 0 ? -errno : -e;
		}
		if (r < 0) {
			close(fd);
			return r;
		}
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
	if (h->max_frame < 64 || h->max_batch == 0 || h->max_batch > MAX_BATCH)
		return "the daemon's max_frame or max_batch is invalid";
	return NULL;
}

/* Returns 0 or a negative error; *out untouched on failure. */
KVC_PUBLIC int kvc_connect(const char *path, const struct kvc_options *opt, kvc_conn **out)
{
	char def[sizeof(((struct sockaddr_un *)0)->sun_path)];
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Hello hello = KVCACHED__HELLO__INIT;
	Kvcached__Response *resp = NULL;
	const Kvcached__HelloReply *h;
	kvc_conn *c;
	int r;

	if (!out)
		return -EINVAL;
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
	r = -pthread_mutex_init(&c->lock, NULL);
	if (r < 0) {
		free(c);
		return r;
	}
	r = connect_unix(path, &c->fd);
	if (r < 0)
		goto out;

	hello.min_version = KV_PROTO_VERSION;
	hello.max_version = KV_PROTO_VERSION;
	hello.namespace_ = (char *)(opt && opt->ns ? opt->ns : "");
	hello.client_name = (char *)(opt && opt->client_name ? opt->client_name
							       : program_invocation_short_name);
	req.op_case = KVCACHED__REQUEST__OP_HELLO;
	req.hello = &hello;
	r = kvc_call_check(c, &req, check_hello, NULL, &resp);
	if (r < 0)
		goto out;
	h = resp->hello;
	r = kvc_map_new(h->backend, h->devices, h->device_bytes, h->segment_bytes, &c->map);
	if (r < 0)
		goto out;
	c->hello = (struct kvc_hello){
		.version = h->version,
		.page_bytes = h->page_bytes,
		.segment_bytes = h->segment_bytes,
		.device_bytes = h->device_bytes,
		.devices = h->devices,
		.max_frame = h->max_frame,
		.max_batch = h->max_batch,
		.session_id = h->session_id,
	};
	snprintf(c->hello.backend, sizeof(c->hello.backend), "%s", h->backend ? h->backend : "");
	*out = c;
	c = NULL;
	r = 0;
out:
	kvcached__response__free_unpacked(resp, NULL);
	kvc_close(c);
	return r;
}

KVC_PUBLIC void kvc_close(kvc_conn *c)
{
	if (!c)
		return;
	if (c->fd >= 0)
		close(c->fd);
	while (c->fdq_len)
		close(fdq_pop(c));
	kvc_map_free(c->map);
	free(c->fdq);
	free(c->rbuf);
	free(c->sbuf);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

/* --- pools and blocks ---------------------------------------------------- */

int kvc_conn_pool_set(kvc_conn *c, uint32_t pool, uint32_t device, uint64_t block_bytes)
{
	if (!c || pool >= KVC_MAX_POOLS || block_bytes == 0)
		return -EINVAL;
	atomic_store_explicit(&c->pools[pool].device, device, memory_order_relaxed);
	atomic_store_explicit(&c->pools[pool].block_bytes, block_bytes, memory_order_release);
	return 0;
}

KVC_PUBLIC uint64_t kvc_pool_block_bytes(kvc_conn *c, int pool)
{
	if (!c || pool < 0 || (unsigned)pool >= KVC_MAX_POOLS)
		return 0;
	return atomic_load_explicit(&c->pools[pool].block_bytes, memory_order_acquire);
}

/* Lock-free: reads only the pool slot and the map, both published with
 * release stores. */
KVC_PUBLIC void *kvc_block_ptr(kvc_conn *c, kvc_block b)
{
	uint32_t pool = KVC_BLOCK_POOL(b), dev;
	uint64_t bb, off, seg, s, last;
	char *base;

	if (!c || !c->map)
		return NULL;
	bb = atomic_load_explicit(&c->pools[pool].block_bytes, memory_order_acquire);
	if (!bb)
		return NULL;
	dev = atomic_load_explicit(&c->pools[pool].device, memory_order_relaxed);
	/* page < 2^20, page_bytes <= 2^50, slot < 2^12: no overflow below. */
	if (bb > c->hello.device_bytes)
		return NULL;
	off = (uint64_t)KVC_BLOCK_PAGE(b) * c->hello.page_bytes +
	      (uint64_t)KVC_BLOCK_SLOT(b) * bb;
	if (off > c->hello.device_bytes - bb)
		return NULL;
	seg = c->hello.segment_bytes;
	last = (off + bb - 1) / seg;
	for (s = off / seg; s <= last; s++)
		if (!kvc_map_is_mapped(c->map, dev, (uint32_t)s))
			return NULL;
	base = kvc_map_base(c->map, dev);
	return base ? base + off : NULL;
}

/* --- accessors and errors ------------------------------------------------ */

const struct kvc_hello *kvc_conn_hello(const kvc_conn *c)
{
	return &c->hello;
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
	return c && kvc_map_is_mapped(c->map, dev, index);
}

KVC_PUBLIC const char *kvc_last_error(kvc_conn *c)
{
	return c ? c->err : "";
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
