/* Listening sockets; see listener.h. */
#include "listener.h"

#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"

static struct kv_loop *listener_loop(const struct kv_listener *l)
{
	return &l->conns->d->loop;
}

static void on_accept(struct kv_loop_watch *w, int res, int more)
{
	struct kv_listener *l = kv_container_of(w, struct kv_listener, w);
	struct kv_loop *loop = listener_loop(l);

	(void)res;
	if (l->fd < 0)
		return;   /* closed by a drain; this is the cancellation */
	for (;;) {
		int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			uint64_t held;

			/* The connection waits in the backlog; a flood of them
			 * must not flood the log. */
			if ((errno == EMFILE || errno == ENFILE) && kv_ratelimit(&l->emfile_log, &held))
				kv_warn("accept on the %s socket: %s (%llu more since the last such "
					"line); raise LimitNOFILE or lower max_connections", l->what,
					strerror(errno), (unsigned long long)held);
			break;
		}
		kv_conn_accept(l->conns, fd, l->admin);
	}
	if (!more && !loop->stop && kv_loop_poll(loop, &l->w, l->fd, POLLIN, 1) < 0)
		kv_err("cannot poll the %s socket", l->what);
}

void kv_listener_init(struct kv_listener *l, struct kv_conns *conns, const char *what,
		      int admin, int fd)
{
	memset(l, 0, sizeof(*l));
	l->conns = conns;
	l->what = what;
	l->fd = fd;
	l->activated = fd >= 0;
	l->admin = admin;
	l->w.cb = on_accept;
	l->emfile_log.interval_ms = 1000;
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

int kv_listener_bind(struct kv_listener *l, const char *path, unsigned mode, const char *group)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char dir[sizeof(sa.sun_path)], *slash;
	struct stat st;
	gid_t gid;
	int fd, probe, r;

	if (l->activated)
		return 0;
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
	 * daemon listens on is not. A daemon killed a moment ago may still
	 * accept connections (its io_uring lets go of the socket after the
	 * process is gone): what counts is whether the listener's process,
	 * which SO_PEERCRED names, still exists. */
	probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (probe >= 0) {
		struct ucred cr = { 0 };
		socklen_t crlen = sizeof(cr);
		int live;

		r = connect(probe, (struct sockaddr *)&sa, sizeof(sa));
		live = r == 0 && (getsockopt(probe, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) < 0 ||
				  cr.pid <= 0 || kill(cr.pid, 0) == 0 || errno != ESRCH);
		close(probe);
		if (live) {
			kv_err("another daemon (pid %d) listens on %s", (int)cr.pid, path);
			return -EADDRINUSE;
		}
		if (r == 0)
			kv_info("%s: its listener, pid %d, is gone: replaced", path, (int)cr.pid);
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

int kv_listener_start(struct kv_listener *l)
{
	return kv_loop_poll(listener_loop(l), &l->w, l->fd, POLLIN, 1);
}

void kv_listener_close(struct kv_listener *l)
{
	struct stat st;

	if (!l->conns)
		return;
	if (l->w.armed && listener_loop(l)->ring.ring_fd > 0)
		kv_loop_cancel(listener_loop(l), &l->w);
	if (l->fd >= 0)
		close(l->fd);
	l->fd = -1;
	if (l->path[0] && stat(l->path, &st) == 0 && st.st_dev == l->dev && st.st_ino == l->ino)
		unlink(l->path);
	l->path[0] = 0;
}

const char *kv_listener_name(const struct kv_listener *l, char *buf, size_t len)
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
