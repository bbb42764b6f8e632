/* Listening socket, sessions, framing and output; see server.h. */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "kvcached.pb-c.h"
#include "log.h"
#include "ops.h"

#define READ_CHUNK 65536
/* Output a peer has not read yet beyond which its input is held back. */
#define OUT_BACKLOG (8u << 20)

uint64_t kv_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void kv_config_defaults(struct kv_config *c)
{
	memset(c, 0, sizeof(*c));
	c->socket_mode = 0660;
	snprintf(c->backend, sizeof(c->backend), "host");
	c->pool_bytes = 1ull << 30;
	c->segment_bytes = 1ull << 30;
	c->page_bytes = 2u << 20;
	c->max_frame = 4u << 20;
	c->max_batch = 65536;
	c->log_level = KV_LOG_INFO;
	kv_tiers_config_defaults(&c->tiers);
}

int kv_session_is_admin(const struct kv_session *ss)
{
	return ss->cred.uid == 0 || ss->cred.uid == geteuid();
}

/* ---- output ----------------------------------------------------------- */

static void session_close(struct kv_session *ss, const char *why);
static void session_input(struct kv_session *ss);

static void session_free(struct kv_session *ss)
{
	kv_list_del(&ss->link);
	kv_refmap_fini(&ss->refs);
	free(ss);
}

static void session_free_if_done(struct kv_session *ss)
{
	if (ss->closing && !ss->win.armed && !ss->wout.armed)
		session_free(ss);
}

static int out_reserve(struct kv_session *ss, size_t n)
{
	size_t cap;
	uint8_t *p;

	if (ss->out_off == ss->out_len)
		ss->out_off = ss->out_len = 0;
	if (ss->out_cap - ss->out_len >= n)
		return 0;
	if (ss->out_off > 0) {
		memmove(ss->out, ss->out + ss->out_off, ss->out_len - ss->out_off);
		ss->out_len -= ss->out_off;
		ss->out_off = 0;
		if (ss->out_cap - ss->out_len >= n)
			return 0;
	}
	cap = ss->out_cap ? ss->out_cap : 4096;
	while (cap - ss->out_len < n)
		cap *= 2;
	p = realloc(ss->out, cap);
	if (!p)
		return -ENOMEM;
	ss->out = p;
	ss->out_cap = cap;
	return 0;
}

/* Sends what is queued. fds go with the first bytes still unsent, which
 * precede the frames that announce them; the peer queues them until then. */
static int session_flush(struct kv_session *ss)
{
	while (ss->out_off < ss->out_len) {
		size_t left = ss->out_len - ss->out_off;
		int nfds = ss->nfds > KV_FRAME_MAX_FDS ? KV_FRAME_MAX_FDS : (int)ss->nfds;
		/* With more fds than one message carries, send one byte per batch
		 * of fds so that every batch has data to ride on. */
		struct iovec iov = { ss->out + ss->out_off, ss->nfds > KV_FRAME_MAX_FDS ? 1 : left };
		ssize_t n = kv_sendmsg_fds(ss->fd, &iov, 1, ss->fds, nfds, MSG_DONTWAIT);

		if (n == -EAGAIN) {
			if (!ss->wout.armed &&
			    kv_loop_poll(&ss->srv->loop, &ss->wout, ss->fd, POLLOUT, 0) < 0)
				return -EBUSY;
			return 0;
		}
		if (n < 0)
			return (int)n;
		if (nfds) {
			for (int i = 0; i < nfds; i++)
				close(ss->fds[i]);
			memmove(ss->fds, ss->fds + nfds, (ss->nfds - (size_t)nfds) * sizeof(int));
			ss->nfds -= (size_t)nfds;
		}
		ss->out_off += (size_t)n;
	}
	ss->out_off = ss->out_len = 0;
	return 0;
}

static void on_writable(struct kv_loop_watch *w, int res, int more)
{
	struct kv_session *ss = kv_container_of(w, struct kv_session, wout);
	int r;

	(void)more;
	if (!ss->closing) {
		if (res < 0 || (res & (POLLERR | POLLHUP))) {
			session_close(ss, "peer hung up");
		} else if ((r = session_flush(ss)) < 0) {
			session_close(ss, strerror(-r));
		} else if (ss->paused && ss->out_len - ss->out_off < OUT_BACKLOG) {
			ss->paused = 0;
			if (!ss->parked)
				session_input(ss);
		}
	}
	session_free_if_done(ss);
}

/* Appends one frame holding rs. Returns 0 or -ENOMEM. */
static int session_reply(struct kv_session *ss, const Kvcached__Response *rs)
{
	size_t len = kvcached__response__get_packed_size(rs);

	if (out_reserve(ss, KV_FRAME_HDR + len) < 0)
		return -ENOMEM;
	kv_frame_hdr_encode(ss->out + ss->out_len, (uint32_t)len, 0);
	kvcached__response__pack(rs, ss->out + ss->out_len + KV_FRAME_HDR);
	ss->out_len += KV_FRAME_HDR + len;
	return 0;
}

/* Replies EPROTO (best effort) and closes the session. */
static void session_proto_error(struct kv_session *ss, uint64_t id, const char *what)
{
	Kvcached__Response rs = KVCACHED__RESPONSE__INIT;
	Kvcached__Error err = KVCACHED__ERROR__INIT;

	err.code = KVCACHED__ERROR_CODE__EPROTO;
	err.message = (char *)what;
	err.index = -1;
	rs.id = id;
	rs.error = &err;
	if (session_reply(ss, &rs) == 0)
		session_flush(ss);
	session_close(ss, what);
}

int kv_session_want_segment(struct kv_session *ss, uint32_t dev, uint32_t seg)
{
	struct kv_backend *be = ss->srv->be;
	uint32_t **sent = &ss->seg_sent[dev];
	int fd;

	if (!*sent) {
		*sent = calloc(be->segments[dev], sizeof(uint32_t));
		if (!*sent)
			return -ENOMEM;
	}
	if ((*sent)[seg] == be->epoch[dev][seg])
		return 0;
	if (ss->nfds == ss->fds_cap) {
		size_t cap = ss->fds_cap ? ss->fds_cap * 2 : 16;
		int *p = realloc(ss->fds, cap * sizeof(int));

		if (!p)
			return -ENOMEM;
		ss->fds = p;
		ss->fds_cap = cap;
	}
	/* A dup: the backend closes its fd when it recreates the segment, and
	 * the number could then name anything by the time we send it. */
	fd = be->ops->segment_fd(be, dev, seg);
	if (fd < 0)
		return fd;
	fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (fd < 0)
		return -errno;
	ss->fds[ss->nfds++] = fd;
	(*sent)[seg] = be->epoch[dev][seg];
	return 1;
}

/* ---- input ------------------------------------------------------------ */

/* Handles every complete frame in the input buffer. Returns 0, or -1 when
 * the session was closed. */
static int session_frames(struct kv_session *ss)
{
	struct kv_server *s = ss->srv;
	size_t off = 0;

	while (ss->in_len - off >= KV_FRAME_HDR && !ss->paused && !ss->parked) {
		Kvcached__Request *rq;
		Kvcached__Response rs = KVCACHED__RESPONSE__INIT;
		uint32_t len;
		int r = kv_frame_hdr_decode(ss->in + off, s->cfg.max_frame, &len);

		if (r < 0) {
			session_proto_error(ss, 0, r == -EMSGSIZE ? "frame larger than max_frame"
								  : "bad frame header");
			return -1;
		}
		if (ss->in_len - off < KV_FRAME_HDR + len)
			break;
		rq = kvcached__request__unpack(kv_arena_pb(&s->arena), len, ss->in + off + KV_FRAME_HDR);
		if (!rq) {
			kv_arena_reset(&s->arena);
			session_proto_error(ss, 0, "undecodable request");
			return -1;
		}
		r = kv_ops_handle(s, ss, rq, &rs);
		if (r == KV_OPS_PARK) {
			/* The frame stays first in the buffer; wake runs it again. */
			kv_arena_reset(&s->arena);
			ss->parked = 1;
			break;
		}
		off += KV_FRAME_HDR + len;
		ss->requests++;
		s->requests++;
		if (r >= 0 && session_reply(ss, &rs) < 0)
			r = -ENOMEM;
		kv_arena_reset(&s->arena);
		if (r == KV_OPS_CLOSE) {
			session_flush(ss);
			session_close(ss, "protocol error");
			return -1;
		}
		if (r < 0) {
			session_close(ss, "out of memory");
			return -1;
		}
		if (ss->out_len - ss->out_off >= OUT_BACKLOG)
			ss->paused = 1;
	}
	if (off) {
		memmove(ss->in, ss->in + off, ss->in_len - off);
		ss->in_len -= off;
	}
	kv_tiers_kick(s->tiers);
	return 0;
}

static void session_input(struct kv_session *ss)
{
	struct kv_server *s = ss->srv;

	for (;;) {
		int fds[8], nfds = 0, trunc = 0;
		size_t want = (size_t)s->cfg.max_frame + KV_FRAME_HDR;
		ssize_t n;

		if (session_frames(ss) < 0)
			return;
		if (ss->paused || ss->parked)
			break;
		if (ss->in_cap - ss->in_len < READ_CHUNK && ss->in_cap < want + READ_CHUNK) {
			size_t cap = ss->in_cap ? ss->in_cap * 2 : READ_CHUNK * 2;
			uint8_t *p = realloc(ss->in, cap);

			if (!p) {
				session_close(ss, "out of memory");
				return;
			}
			ss->in = p;
			ss->in_cap = cap;
		}
		n = kv_recvmsg_fds(ss->fd, ss->in + ss->in_len, ss->in_cap - ss->in_len, fds, &nfds,
				   8, MSG_DONTWAIT, &trunc);
		if (n == -EAGAIN)
			break;
		if (n < 0) {
			session_close(ss, strerror((int)-n));
			return;
		}
		if (nfds || trunc) {
			while (nfds > 0)
				close(fds[--nfds]);
			session_proto_error(ss, 0, "file descriptors are not accepted from clients");
			return;
		}
		if (n == 0) {
			session_close(ss, ss->in_len ? "EOF inside a frame" : NULL);
			return;
		}
		ss->in_len += (size_t)n;
	}
	if (session_flush(ss) < 0)
		session_close(ss, "send failed");
}

static void on_readable(struct kv_loop_watch *w, int res, int more)
{
	struct kv_session *ss = kv_container_of(w, struct kv_session, win);

	if (!ss->closing) {
		if (res < 0) {
			session_close(ss, strerror(-res));
		} else {
			if (!ss->paused && !ss->parked)
				session_input(ss);
			/* A multishot poll can end (overflow); arm it again. */
			if (!ss->closing && !more &&
			    kv_loop_poll(&ss->srv->loop, &ss->win, ss->fd, POLLIN, 1) < 0)
				session_close(ss, "cannot poll");
		}
	}
	session_free_if_done(ss);
}

/* ---- session lifetime --------------------------------------------------- */

static void release_ref(void *key, uint32_t count, void *ctx)
{
	struct kv_block *b = key;

	(void)ctx;
	while (count--)
		kv_block_unref(b);
}

static void session_close(struct kv_session *ss, const char *why)
{
	struct kv_server *s = ss->srv;
	uint32_t d;

	if (ss->closing)
		return;
	ss->closing = 1;
	if (why)
		kv_info("session %llu (pid %d) closed: %s; released %llu references",
			(unsigned long long)ss->id, (int)ss->cred.pid, why,
			(unsigned long long)ss->refs.refs);
	else
		kv_debug("session %llu (pid %d) disconnected", (unsigned long long)ss->id,
			 (int)ss->cred.pid);
	/* Nothing a worker held leaks; nothing it sealed is lost. */
	kv_refmap_each(&ss->refs, release_ref, NULL);
	if (kv_list_linked(&ss->waiter.link))
		kv_list_del(&ss->waiter.link);
	ss->parked = 0;
	while (ss->npins)
		kv_block_unref(ss->pins[--ss->npins]);
	free(ss->pins);
	ss->pins = NULL;
	kv_tiers_owner_gone(s->tiers, &ss->swaps);
	kv_list_del(&ss->link);
	kv_list_push_back(&s->closing, &ss->link);
	s->nsessions--;
	if (ss->win.armed)
		kv_loop_cancel(&s->loop, &ss->win);
	if (ss->wout.armed)
		kv_loop_cancel(&s->loop, &ss->wout);
	close(ss->fd);
	ss->fd = -1;
	while (ss->nfds > 0)
		close(ss->fds[--ss->nfds]);
	free(ss->in);
	free(ss->out);
	free(ss->fds);
	ss->in = ss->out = NULL;
	ss->fds = NULL;
	for (d = 0; d < KV_MAX_DEVICES; d++)
		free(ss->seg_sent[d]);
	memset(ss->seg_sent, 0, sizeof(ss->seg_sent));
	/* The struct itself goes once its watches have completed. */
}

/* A tier finished what the parked request waits for: run it again. */
static void session_wake(struct kv_waiter *w)
{
	struct kv_session *ss = kv_container_of(w, struct kv_session, waiter);

	ss->parked = 0;
	if (!ss->closing && !ss->paused)
		session_input(ss);
}

static void on_copies(struct kv_loop_watch *w, int res, int more)
{
	struct kv_server *s = kv_container_of(w, struct kv_server, copyw);

	if (res >= 0)
		kv_tiers_copies_done(s->tiers);
	if (!more && !s->loop.stop)
		kv_loop_poll(&s->loop, &s->copyw, s->be->completion_fd, POLLIN, 1);
}

static void on_disk(struct kv_loop_watch *w, int res, int more)
{
	struct kv_server *s = kv_container_of(w, struct kv_server, diskw);

	if (res >= 0)
		kv_tiers_disk_done(s->tiers);
	if (!more && !s->loop.stop)
		kv_loop_poll(&s->loop, &s->diskw, kv_tiers_disk_fd(s->tiers), POLLIN, 1);
}

static void session_new(struct kv_server *s, int fd)
{
	struct kv_session *ss = calloc(1, sizeof(*ss));
	socklen_t len = sizeof(ss->cred);

	if (!ss) {
		kv_err("out of memory accepting a connection");
		close(fd);
		return;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &ss->cred, &len) < 0) {
		kv_warn("SO_PEERCRED: %s; connection refused", strerror(errno));
		close(fd);
		free(ss);
		return;
	}
	ss->srv = s;
	ss->fd = fd;
	ss->id = ++s->next_session;
	ss->connected_ms = kv_now_ms();
	ss->win.cb = on_readable;
	ss->wout.cb = on_writable;
	kv_refmap_init(&ss->refs);
	kv_list_init(&ss->waiter.link);
	ss->waiter.wake = session_wake;
	kv_list_init(&ss->swaps);
	if (kv_loop_poll(&s->loop, &ss->win, fd, POLLIN, 1) < 0) {
		kv_err("cannot poll a new connection");
		close(fd);
		free(ss);
		return;
	}
	kv_list_push_back(&s->sessions, &ss->link);
	s->nsessions++;
	kv_debug("session %llu: pid %d uid %u gid %u", (unsigned long long)ss->id,
		 (int)ss->cred.pid, ss->cred.uid, ss->cred.gid);
}

static void on_accept(struct kv_loop_watch *w, int res, int more)
{
	struct kv_server *s = kv_container_of(w, struct kv_server, lw);

	for (;;) {
		int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE)
				kv_warn("accept: %s", strerror(errno));
			break;
		}
		session_new(s, fd);
	}
	if (!more && !s->loop.stop && kv_loop_poll(&s->loop, &s->lw, s->lfd, POLLIN, 1) < 0)
		kv_err("cannot poll the listening socket");
	(void)res;
}

static void on_signal(struct kv_loop_watch *w, int res, int more)
{
	struct kv_server *s = kv_container_of(w, struct kv_server, sigw);
	struct signalfd_siginfo si;

	while (read(s->sigfd, &si, sizeof(si)) == sizeof(si)) {
		kv_info("signal %u: shutting down", si.ssi_signo);
		kv_loop_stop(&s->loop);
	}
	if (!more && !s->loop.stop)
		kv_loop_poll(&s->loop, &s->sigw, s->sigfd, POLLIN, 1);
	(void)res;
}

/* ---- server ------------------------------------------------------------ */

static int listen_socket(const struct kv_config *cfg)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char dir[sizeof(sa.sun_path)], *slash;
	int fd, probe, r;

	if (strlen(cfg->socket_path) >= sizeof(sa.sun_path)) {
		kv_err("socket path too long: %s", cfg->socket_path);
		return -ENAMETOOLONG;
	}
	memcpy(sa.sun_path, cfg->socket_path, strlen(cfg->socket_path) + 1);
	snprintf(dir, sizeof(dir), "%s", cfg->socket_path);
	slash = strrchr(dir, '/');
	if (slash && slash != dir) {
		*slash = 0;
		if (mkdir(dir, 0755) < 0 && errno != EEXIST)
			kv_warn("mkdir %s: %s", dir, strerror(errno));
	}
	/* A socket file left by a daemon that died is removed; one that a live
	 * daemon listens on is not. */
	probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (probe >= 0) {
		r = connect(probe, (struct sockaddr *)&sa, sizeof(sa));
		close(probe);
		if (r == 0) {
			kv_err("another daemon listens on %s", cfg->socket_path);
			return -EADDRINUSE;
		}
	}
	unlink(cfg->socket_path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    chmod(cfg->socket_path, cfg->socket_mode) < 0 || listen(fd, 512) < 0) {
		r = -errno;
		kv_err("cannot listen on %s: %s", cfg->socket_path, strerror(errno));
		close(fd);
		return r;
	}
	return fd;
}

int kv_server_init(struct kv_server *s, const struct kv_config *cfg)
{
	uint64_t nseg;
	sigset_t mask;
	int r;

	memset(s, 0, sizeof(*s));
	s->cfg = *cfg;
	s->lfd = s->sigfd = -1;
	kv_list_init(&s->sessions);
	kv_list_init(&s->closing);
	kv_arena_init(&s->arena);
	s->start_ms = kv_now_ms();
	nseg = cfg->pool_bytes / cfg->segment_bytes;
	if (!strcmp(cfg->backend, "cuda")) {
		/* Every visible device, pool_bytes on each. */
		char err[256] = "";

		r = kv_backend_cuda_create(NULL, 0, cfg->pool_bytes, cfg->segment_bytes, err,
					   sizeof(err), &s->be);
		if (r < 0) {
			kv_err("cuda backend: %s", err);
			return r;
		}
	} else if (strcmp(cfg->backend, "host")) {
		kv_err("backend '%s' is not built in (available: host, cuda)", cfg->backend);
		return -EINVAL;
	} else if ((r = kv_backend_host_create(cfg->segment_bytes, (uint32_t)nseg, &s->be)) < 0) {
		kv_err("host backend: %llu segments of %llu bytes: %s", (unsigned long long)nseg,
		       (unsigned long long)cfg->segment_bytes, strerror(-r));
		return r;
	}
	r = kv_pools_create(s->be, cfg->page_bytes, &s->pools);
	if (r < 0) {
		kv_err("page allocator: %s", strerror(-r));
		return r;
	}
	{
		char err[256] = "";

		r = kv_tiers_create(s->pools, s->be, cfg->page_bytes, &cfg->tiers, &s->tiers, err,
				    sizeof(err));
		if (r < 0) {
			kv_err("tiers: %s", err[0] ? err : strerror(-r));
			return r;
		}
	}
	s->scratch = calloc(cfg->max_batch, sizeof(void *));
	if (!s->scratch)
		return -ENOMEM;
	r = kv_loop_init(&s->loop, 1024);
	if (r < 0) {
		kv_err("io_uring: %s", strerror(-r));
		return r;
	}
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	s->sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	if (s->sigfd < 0)
		return -errno;
	s->lfd = listen_socket(cfg);
	if (s->lfd < 0)
		return s->lfd;
	s->lw.cb = on_accept;
	s->sigw.cb = on_signal;
	s->copyw.cb = on_copies;
	s->diskw.cb = on_disk;
	if ((r = kv_loop_poll(&s->loop, &s->lw, s->lfd, POLLIN, 1)) < 0 ||
	    (r = kv_loop_poll(&s->loop, &s->sigw, s->sigfd, POLLIN, 1)) < 0 ||
	    (kv_tiers_on(s->tiers) &&
	     (r = kv_loop_poll(&s->loop, &s->copyw, s->be->completion_fd, POLLIN, 1)) < 0) ||
	    (kv_tiers_disk_fd(s->tiers) >= 0 &&
	     (r = kv_loop_poll(&s->loop, &s->diskw, kv_tiers_disk_fd(s->tiers), POLLIN, 1)) < 0))
		return r;
	kv_info("listening on %s: backend %s, %llu MiB in %llu segments of %llu MiB, "
		"pages of %llu KiB", cfg->socket_path, s->be->name,
		(unsigned long long)(nseg * cfg->segment_bytes >> 20), (unsigned long long)nseg,
		(unsigned long long)(cfg->segment_bytes >> 20),
		(unsigned long long)(cfg->page_bytes >> 10));
	return 0;
}

int kv_server_run(struct kv_server *s)
{
	return kv_loop_run(&s->loop);
}

void kv_server_fini(struct kv_server *s)
{
	struct kv_list *pos, *tmp;

	kv_list_for_each_safe(pos, tmp, &s->sessions)
		session_close(kv_container_of(pos, struct kv_session, link), NULL);
	/* The ring goes below: no completion will come for these any more. */
	kv_list_for_each_safe(pos, tmp, &s->closing)
		session_free(kv_container_of(pos, struct kv_session, link));
	if (s->lfd >= 0) {
		close(s->lfd);
		unlink(s->cfg.socket_path);
	}
	if (s->sigfd >= 0)
		close(s->sigfd);
	if (s->loop.ring.ring_fd > 0)
		kv_loop_fini(&s->loop);
	kv_tiers_destroy(s->tiers);
	kv_pools_destroy(s->pools);
	kv_backend_destroy(s->be);
	kv_arena_fini(&s->arena);
	free(s->scratch);
}
