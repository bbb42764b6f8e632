/* Listening sockets, sessions, framing and output, drain and reload; see
 * server.h. */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
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
#include "service.h"

#define READ_CHUNK 65536
/* Output a peer has not read yet beyond which its input is held back. */
#define OUT_BACKLOG (8u << 20)

uint64_t kv_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int kv_session_is_admin(const struct kv_session *ss)
{
	return ss->admin || (ss->srv->cfg.worker_socket_admin &&
			     (ss->cred.uid == 0 || ss->cred.uid == geteuid()));
}

/* ---- output ----------------------------------------------------------- */

static void session_close(struct kv_session *ss, const char *why);
static void session_input(struct kv_session *ss);
static void drain_check(struct kv_server *s);

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
		kv_log_context(ss->id, ss->ns ? kv_pools_ns_name(s->pools, ss->ns) : NULL);
		r = kv_ops_handle(s, ss, rq, &rs);
		kv_log_context(0, NULL);
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
	kv_log_context(ss->id, ss->ns ? kv_pools_ns_name(s->pools, ss->ns) : NULL);
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
	kv_log_context(0, NULL);
	/* The struct itself goes once its watches have completed. */
	if (s->draining)
		drain_check(s);
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

static void session_new(struct kv_server *s, int fd, int admin)
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
	ss->admin = admin;
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
	kv_debug("session %llu: pid %d uid %u gid %u on the %s socket", (unsigned long long)ss->id,
		 (int)ss->cred.pid, ss->cred.uid, ss->cred.gid, admin ? "admin" : "worker");
}


/* ---- listening sockets ---------------------------------------------------- */

static void listener_close(struct kv_listener *l);

static void on_accept(struct kv_loop_watch *w, int res, int more)
{
	struct kv_listener *l = kv_container_of(w, struct kv_listener, w);
	struct kv_server *s = l->srv;

	(void)res;
	if (l->fd < 0)
		return;   /* closed by a drain; this is the cancellation */
	for (;;) {
		int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE)
				kv_warn("accept on the %s socket: %s", l->what, strerror(errno));
			break;
		}
		session_new(s, fd, l->admin);
	}
	if (!more && !s->loop.stop && kv_loop_poll(&s->loop, &l->w, l->fd, POLLIN, 1) < 0)
		kv_err("cannot poll the %s socket", l->what);
}

/* The gid of a group name or number; -1 for "". Returns 0 or -ENOENT. */
static int group_id(const char *name, gid_t *gid)
{
	struct group *g;
	char *end;
	unsigned long v;

	*gid = (gid_t)-1;
	if (!name[0])
		return 0;
	v = strtoul(name, &end, 10);
	if (name[0] >= '0' && name[0] <= '9' && !*end) {
		*gid = (gid_t)v;
		return 0;
	}
	g = getgrnam(name);
	if (!g)
		return -ENOENT;
	*gid = g->gr_gid;
	return 0;
}

/* Binds l to path with mode and group. Returns 0 or -errno (logged). */
static int listener_bind(struct kv_listener *l, const char *path, unsigned mode,
			 const char *group)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char dir[sizeof(sa.sun_path)], *slash;
	struct stat st;
	gid_t gid;
	int fd, probe, r;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		kv_err("%s socket path too long: %s", l->what, path);
		return -ENAMETOOLONG;
	}
	if (group_id(group, &gid) < 0) {
		kv_err("%s socket: no group '%s'", l->what, group);
		return -ENOENT;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	snprintf(dir, sizeof(dir), "%s", path);
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
			kv_err("another daemon listens on %s", path);
			return -EADDRINUSE;
		}
	}
	unlink(path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || stat(path, &st) < 0 ||
	    (gid != (gid_t)-1 && chown(path, (uid_t)-1, gid) < 0) || chmod(path, mode) < 0 ||
	    listen(fd, 512) < 0) {
		r = -errno;
		kv_err("cannot listen on %s: %s", path, strerror(errno));
		close(fd);
		return r;
	}
	l->fd = fd;
	snprintf(l->path, sizeof(l->path), "%s", path);
	l->dev = st.st_dev;
	l->ino = st.st_ino;
	return 0;
}

/* Stops l accepting: its watch is cancelled, its fd closed, and the file it
 * bound removed if it is still ours (a newer daemon may have bound the path
 * meanwhile). NULL-safe and idempotent. */
static void listener_close(struct kv_listener *l)
{
	struct stat st;

	if (!l || !l->srv)
		return;
	if (l->w.armed && l->srv->loop.ring.ring_fd > 0)
		kv_loop_cancel(&l->srv->loop, &l->w);
	if (l->fd >= 0)
		close(l->fd);
	l->fd = -1;
	if (l->path[0] && stat(l->path, &st) == 0 && st.st_dev == l->dev && st.st_ino == l->ino)
		unlink(l->path);
	l->path[0] = 0;
}

/* Where l listens, for the log. */
static const char *listener_name(const struct kv_listener *l, char *buf, size_t len)
{
	struct sockaddr_un sa;
	socklen_t sl = sizeof(sa);

	if (l->path[0])
		return l->path;
	memset(&sa, 0, sizeof(sa));
	if (getsockname(l->fd, (struct sockaddr *)&sa, &sl) == 0 && sa.sun_path[0])
		snprintf(buf, len, "%s (from systemd)", sa.sun_path);
	else
		snprintf(buf, len, "fd %d (from systemd)", l->fd);
	return buf;
}

/* ---- service: status, watchdog, drain, reload ----------------------------- */

uint32_t kv_server_clients(const struct kv_server *s)
{
	const struct kv_list *pos;
	uint32_t n = 0;

	kv_list_for_each(pos, &s->sessions) {
		const struct kv_session *ss = kv_container_of(pos, struct kv_session, link);

		if (!ss->admin || ss->refs.refs)
			n++;
	}
	return n;
}

static void status_line(struct kv_server *s, char *buf, size_t len)
{
	uint64_t total, nfree, page_bytes;
	uint32_t clients = kv_server_clients(s);

	kv_pools_pages(s->pools, &total, &nfree, &page_bytes);
	if (s->draining) {
		uint64_t now = kv_now_ms();
		uint64_t left = s->drain_deadline_ms > now ? s->drain_deadline_ms - now : 0;

		snprintf(buf, len, "draining: %" PRIu32 " client%s left, exiting in %" PRIu64 " s at "
			 "the latest", clients, clients == 1 ? "" : "s", (left + 999) / 1000);
		return;
	}
	snprintf(buf, len, "%" PRIu32 " client%s, %" PRIu64 " of %" PRIu64 " pages in use (%" PRIu64
		 "%%), %" PRIu64 " requests, %" PRIu64 " allocations refused", clients,
		 clients == 1 ? "" : "s", total - nfree, total,
		 total ? (total - nfree) * 100 / total : 0, s->requests, s->enospc);
}

static void on_status(struct kv_loop_watch *w, int res, int more)
{
	struct kv_server *s = kv_container_of(w, struct kv_server, statw);
	char st[256];

	(void)res;
	(void)more;
	if (s->loop.stop || !s->cfg.status_interval_ms)
		return;
	status_line(s, st, sizeof(st));
	kv_service_status(st);
	kv_loop_timeout(&s->loop, &s->statw, s->cfg.status_interval_ms * 1000000ull);
}

static void on_watchdog(struct kv_loop_watch *w, int res, int more)
{
	struct kv_server *s = kv_container_of(w, struct kv_server, wdogw);

	(void)res;
	(void)more;
	if (s->loop.stop)
		return;
	/* From the loop: a loop that hangs stops the pings and systemd
	 * restarts the daemon. */
	kv_service_watchdog();
	kv_loop_timeout(&s->loop, &s->wdogw, s->watchdog_usec * 1000 / 2);
}

/* Ends a drain when no client is left. */
static void drain_check(struct kv_server *s)
{
	if (!s->draining || s->loop.stop || kv_server_clients(s))
		return;
	kv_info("drained: no client left; exiting");
	kv_loop_stop(&s->loop);
}

static void on_drain_timeout(struct kv_loop_watch *w, int res, int more)
{
	struct kv_server *s = kv_container_of(w, struct kv_server, drainw);
	struct kv_list *pos;
	uint64_t refs = 0;

	(void)res;
	(void)more;
	if (s->loop.stop)
		return;
	kv_list_for_each(pos, &s->sessions)
		refs += kv_container_of(pos, struct kv_session, link)->refs.refs;
	kv_warn("drain timeout (%" PRIu64 " ms): %" PRIu32 " client%s still connected, holding "
		"%" PRIu64 " references; exiting", s->cfg.drain_timeout_ms, kv_server_clients(s),
		kv_server_clients(s) == 1 ? "" : "s", refs);
	kv_loop_stop(&s->loop);
}

int kv_server_drain(struct kv_server *s, uint64_t timeout_ms, const char *why)
{
	char st[256], name[160];

	if (s->draining)
		return -EALREADY;
	s->draining = 1;
	s->drain_deadline_ms = kv_now_ms() + timeout_ms;
	kv_info("%s: draining: the worker socket %s no longer accepts; %" PRIu32 " client%s may "
		"release what they hold for %" PRIu64 " ms", why,
		listener_name(&s->worker, name, sizeof(name)), kv_server_clients(s),
		kv_server_clients(s) == 1 ? "" : "s", timeout_ms);
	/* An activated socket stays with systemd: connections wait in its queue
	 * for the next instance. */
	listener_close(&s->worker);
	status_line(s, st, sizeof(st));
	kv_service_stopping(st);
	if (!timeout_ms) {
		kv_loop_stop(&s->loop);
		return 0;
	}
	kv_loop_timeout(&s->loop, &s->drainw, timeout_ms * 1000000ull);
	drain_check(s);
	return 0;
}

/* Applies what the live configuration says to the running daemon, after
 * init and after each reload. */
static void apply_config(struct kv_server *s)
{
	kv_log_level = s->cfg.log_level;
	kv_log_set_target(s->cfg.log_target);
	if (s->cfg.status_interval_ms && !s->statw.armed && kv_service_notifying() &&
	    s->loop.ring.ring_fd > 0)
		kv_loop_timeout(&s->loop, &s->statw, s->cfg.status_interval_ms * 1000000ull);
	/* tiers: the watermarks (demote_*, writeback_*) are applied here once
	 * kv_tiers takes new ones (it keeps its own copy of s->cfg.tiers): flag
	 * their rows KV_CFG_RELOAD in config.c and pass s->cfg.tiers on. Quotas
	 * too, when they exist. */
}

struct reload_ctx {
	void (*report)(void *ctx, const char *line, int applied);
	void *ctx;
	char applied[512], kept[512];
};

static void reload_key(void *ctx, const struct kv_cfg_key *k, const char *old, const char *now,
		       int applied)
{
	struct reload_ctx *x = ctx;
	char line[600], *list = applied ? x->applied : x->kept;
	size_t n = strlen(list);

	snprintf(line, sizeof(line), "%s: %s -> %s", k->name, old, now);
	snprintf(list + n, sizeof(x->applied) - n, "%s%s", n ? "; " : "", line);
	if (x->report)
		x->report(x->ctx, line, applied);
}

int kv_server_reload(struct kv_server *s,
		     void (*report)(void *ctx, const char *line, int applied), void *ctx,
		     char *err, size_t errlen)
{
	struct reload_ctx x = { .report = report, .ctx = ctx };
	struct kv_config next;
	char st[256];
	int r;

	kv_service_reloading();
	s->reloads++;
	if (!s->src) {
		next = s->cfg;
		r = 0;
	} else {
		r = kv_config_build(&next, s->src, err, errlen);
	}
	if (r < 0) {
		s->reload_failures++;
		kv_err("reload failed, the running configuration stays: %s", err);
	} else {
		kv_config_reload(&s->cfg, &next, reload_key, &x);
		apply_config(s);
		kv_info("reloaded %s: %s%s%s%s", s->src && s->src->path[0] ? s->src->path
								  : "the command line",
			x.applied[0] ? "applied " : "nothing changed at run time", x.applied,
			x.kept[0] ? "; not applied (needs a restart): " : "", x.kept);
	}
	status_line(s, st, sizeof(st));
	kv_service_ready(st);
	return r < 0 ? -EINVAL : 0;
}

static void on_signal(struct kv_loop_watch *w, int res, int more)
{
	struct kv_server *s = kv_container_of(w, struct kv_server, sigw);
	struct signalfd_siginfo si;
	char why[64], err[512];

	(void)res;
	while (read(s->sigfd, &si, sizeof(si)) == sizeof(si)) {
		if (si.ssi_signo == SIGHUP) {
			kv_info("SIGHUP: reloading the configuration");
			kv_server_reload(s, NULL, NULL, err, sizeof(err));
		} else if (!s->draining) {
			snprintf(why, sizeof(why), "SIG%s", sigabbrev_np((int)si.ssi_signo));
			kv_server_drain(s, s->cfg.drain_timeout_ms, why);
		} else if (!s->loop.stop) {
			kv_warn("SIG%s while draining: exiting now", sigabbrev_np((int)si.ssi_signo));
			kv_loop_stop(&s->loop);
		}
	}
	if (!more && !s->loop.stop)
		kv_loop_poll(&s->loop, &s->sigw, s->sigfd, POLLIN, 1);
}

/* ---- server ------------------------------------------------------------ */

static void listener_init(struct kv_server *s, struct kv_listener *l, const char *what, int admin)
{
	l->srv = s;
	l->what = what;
	l->fd = -1;
	l->admin = admin;
	l->w.cb = on_accept;
}

int kv_server_init(struct kv_server *s, const struct kv_config *cfg)
{
	char err[256], wname[160], aname[160];
	int wfd, afd;
	uint64_t nseg;
	sigset_t mask;
	int r;

	memset(s, 0, sizeof(*s));
	s->cfg = *cfg;
	s->sigfd = -1;
	listener_init(s, &s->worker, "worker", 0);
	listener_init(s, &s->admin, "admin", 1);
	s->drainw.cb = on_drain_timeout;
	s->wdogw.cb = on_watchdog;
	s->statw.cb = on_status;
	kv_list_init(&s->sessions);
	kv_list_init(&s->closing);
	kv_arena_init(&s->arena);
	s->start_ms = kv_now_ms();
	/* Taken first: a failure below must not leave them to a child. */
	r = kv_service_listen_fds(&wfd, &afd, err, sizeof(err));
	if (r < 0) {
		kv_err("%s", err);
		return r;
	}
	s->worker.fd = wfd;
	s->worker.activated = wfd >= 0;
	s->admin.fd = afd;
	s->admin.activated = afd >= 0;
	nseg = cfg->pool_bytes / cfg->segment_bytes;
	if (!strcmp(cfg->backend, "cuda")) {
		/* Every visible device, pool_bytes on each. */
		err[0] = '\0';
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
	err[0] = 0;
	r = kv_tiers_create(s->pools, s->be, cfg->page_bytes, &cfg->tiers, &s->tiers, err,
			    sizeof(err));
	if (r < 0) {
		kv_err("tiers: %s", err[0] ? err : strerror(-r));
		return r;
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
	sigaddset(&mask, SIGHUP);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	s->sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	if (s->sigfd < 0)
		return -errno;
	if (s->worker.fd < 0 &&
	    (r = listener_bind(&s->worker, cfg->socket_path, cfg->socket_mode,
			       cfg->socket_group)) < 0)
		return r;
	if (s->admin.fd < 0 &&
	    (r = listener_bind(&s->admin, cfg->admin_socket_path, cfg->admin_socket_mode,
			       cfg->admin_socket_group)) < 0)
		return r;
	s->sigw.cb = on_signal;
	s->copyw.cb = on_copies;
	s->diskw.cb = on_disk;
	if ((r = kv_loop_poll(&s->loop, &s->worker.w, s->worker.fd, POLLIN, 1)) < 0 ||
	    (r = kv_loop_poll(&s->loop, &s->admin.w, s->admin.fd, POLLIN, 1)) < 0 ||
	    (r = kv_loop_poll(&s->loop, &s->sigw, s->sigfd, POLLIN, 1)) < 0 ||
	    (kv_tiers_on(s->tiers) &&
	     (r = kv_loop_poll(&s->loop, &s->copyw, s->be->completion_fd, POLLIN, 1)) < 0) ||
	    (kv_tiers_disk_fd(s->tiers) >= 0 &&
	     (r = kv_loop_poll(&s->loop, &s->diskw, kv_tiers_disk_fd(s->tiers), POLLIN, 1)) < 0))
		return r;
	kv_info("listening on %s (workers) and %s (admin): backend %s, %llu MiB in %llu segments "
		"of %llu MiB, pages of %llu KiB",
		listener_name(&s->worker, wname, sizeof(wname)),
		listener_name(&s->admin, aname, sizeof(aname)), s->be->name,
		(unsigned long long)(nseg * cfg->segment_bytes >> 20), (unsigned long long)nseg,
		(unsigned long long)(cfg->segment_bytes >> 20),
		(unsigned long long)(cfg->page_bytes >> 10));
	if (s->worker.activated || s->admin.activated)
		kv_info("socket activation: %s socket%s from systemd, not bound here",
			s->worker.activated && s->admin.activated ? "worker and admin"
			: s->worker.activated ? "worker" : "admin",
			s->worker.activated && s->admin.activated ? "s" : "");
	return 0;
}

void kv_server_on_shutdown(struct kv_server *s)
{
	/* tiers: flush the G3 index here, so that a restarted daemon finds its
	 * NVMe cache again. (kv_tiers_destroy() in kv_server_fini() rewrites the
	 * journal today; what must happen before the sessions close, such as
	 * writing dirty G2 copies back, goes here.) */
	(void)s;
}

int kv_server_run(struct kv_server *s)
{
	char st[256];
	int r;

	apply_config(s);
	s->watchdog_usec = kv_service_watchdog_usec();
	if (s->watchdog_usec) {
		kv_info("systemd watchdog: every %" PRIu64 " ms", s->watchdog_usec / 2000);
		kv_service_watchdog();
		kv_loop_timeout(&s->loop, &s->wdogw, s->watchdog_usec * 1000 / 2);
	}
	/* The pool exists and both sockets listen: connections made from now
	 * on are served. */
	status_line(s, st, sizeof(st));
	kv_service_ready(st);
	r = kv_loop_run(&s->loop);
	if (!s->draining)
		kv_service_stopping("stopping");
	kv_server_on_shutdown(s);
	return r;
}

void kv_server_fini(struct kv_server *s)
{
	struct kv_list *pos, *tmp;

	kv_list_for_each_safe(pos, tmp, &s->sessions)
		session_close(kv_container_of(pos, struct kv_session, link), NULL);
	/* The ring goes below: no completion will come for these any more. */
	kv_list_for_each_safe(pos, tmp, &s->closing)
		session_free(kv_container_of(pos, struct kv_session, link));
	listener_close(&s->worker);
	listener_close(&s->admin);
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
