/* Listening sockets; see listener.h. */
#include "listener.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
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
	l->lock_fd = -1;
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

/* Takes "<path>.lock" (flock, held while l is bound): two daemons started
 * together on one path would otherwise both find it free, and the second's
 * replacing the file would leave the first listening on a socket nobody can
 * reach. The file is removed when l closes; so a lock taken on a file that
 * was removed meanwhile (its holder closed between our open and our flock)
 * is taken again on the file now at the path. Returns 0 or -errno (logged). */
static int bind_lock(struct kv_listener *l, const char *path)
{
	struct stat a, b;
	int fd, tries;

	snprintf(l->lock_path, sizeof(l->lock_path), "%s.lock", path);
	for (tries = 0; tries < 16; tries++) {
		fd = open(l->lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (fd < 0) {
			int r = -errno;

			kv_err("%s socket: cannot open %s: %s", l->what, l->lock_path, strerror(-r));
			return r;
		}
		if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
			int r = errno == EWOULDBLOCK ? -EADDRINUSE : -errno;

			kv_err("%s socket %s: another daemon holds %s (%s)", l->what, path,
			       l->lock_path, strerror(errno));
			close(fd);
			return r;
		}
		if (fstat(fd, &a) == 0 && stat(l->lock_path, &b) == 0 && a.st_dev == b.st_dev &&
		    a.st_ino == b.st_ino) {
			l->lock_fd = fd;
			return 0;
		}
		close(fd);
	}
	kv_err("%s socket %s: %s keeps changing under us", l->what, path, l->lock_path);
	return -EADDRINUSE;
}

/* Whether a live daemon listens on path. A daemon killed a moment ago may
 * still accept connections (its io_uring lets go of the socket after the
 * process is gone): what counts is whether the listener's process, which
 * SO_PEERCRED names, still exists. */
static int listener_live(const struct sockaddr_un *sa, pid_t *pid)
{
	int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), r, live;
	struct ucred cr = { 0 };
	socklen_t crlen = sizeof(cr);

	*pid = 0;
	if (probe < 0)
		return 0;
	r = connect(probe, (const struct sockaddr *)sa, sizeof(*sa));
	live = r == 0 && (getsockopt(probe, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) < 0 ||
			  cr.pid <= 0 || kill(cr.pid, 0) == 0 || errno != ESRCH);
	close(probe);
	if (r == 0)
		*pid = cr.pid;
	return live;
}

/* Binds fd at path and listens, then sets its group and mode; or, where a private
 * directory beside path can hold it (the path is short enough), binds it
 * there first and renames it over path, so that it is never reachable
 * with the mode the umask gave it. *st: the bound file. Returns 0 or -errno. */
static int bind_at(int fd, const char *path, gid_t gid, unsigned mode, struct stat *st)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char tmpdir[sizeof(sa.sun_path)], *slash;
	int r = 0, n;

	snprintf(tmpdir, sizeof(tmpdir), "%s", path);
	slash = strrchr(tmpdir, '/');
	if (slash)
		slash[1] = 0;
	else
		tmpdir[0] = 0;
	n = snprintf(sa.sun_path, sizeof(sa.sun_path), "%s.kvcached-XXXXXX/s", tmpdir);
	if (n > 0 && (size_t)n < sizeof(sa.sun_path)) {
		sa.sun_path[n - 2] = 0;
		if (!mkdtemp(sa.sun_path))
			return -errno;
		snprintf(tmpdir, sizeof(tmpdir), "%s", sa.sun_path);
		sa.sun_path[n - 2] = '/';
	} else {
		tmpdir[0] = 0;
		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	}
	/* Listening before the rename: a client that sees the path can
	 * connect (test_alerts once saw ECONNREFUSED from a daemon whose
	 * socket file was there and not yet listened on); bound at path
	 * itself, only once its group and mode are set. */
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    (gid != (gid_t)-1 && chown(sa.sun_path, (uid_t)-1, gid) < 0) ||
	    chmod(sa.sun_path, mode) < 0 || listen(fd, 512) < 0 ||
	    (tmpdir[0] && rename(sa.sun_path, path) < 0) ||
	    stat(path, st) < 0)
		r = -errno;
	if (tmpdir[0]) {
		if (r < 0)
			unlink(sa.sun_path);
		rmdir(tmpdir);
	}
	return r;
}

int kv_listener_bind(struct kv_listener *l, const char *path, unsigned mode, const char *group)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char dir[sizeof(sa.sun_path)], *slash;
	struct stat st;
	gid_t gid;
	pid_t pid;
	int fd, r;

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
	if ((r = bind_lock(l, path)) < 0)
		return r;
	/* Under the lock: a socket file left by a daemon that died is
	 * replaced; one a live daemon listens on is not. */
	if (listener_live(&sa, &pid)) {
		kv_err("another daemon (pid %d) listens on %s", (int)pid, path);
		r = -EADDRINUSE;
		goto err;
	}
	if (pid)
		kv_info("%s: its listener, pid %d, is gone: replaced", path, (int)pid);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		r = -errno;
		goto err;
	}
	unlink(path);   /* a socket file of a daemon that died: bind wants none */
	if ((r = bind_at(fd, path, gid, mode, &st)) < 0) {
		kv_err("cannot listen on %s: %s", path, strerror(-r));
		close(fd);
		goto err;
	}
	l->fd = fd;
	snprintf(l->path, sizeof(l->path), "%s", path);
	l->dev = st.st_dev;
	l->ino = st.st_ino;
	return 0;
err:
	close(l->lock_fd);
	l->lock_fd = -1;
	return r;
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
	/* After the socket: a new daemon may bind once the lock is free. The
	 * file goes first, while we hold it (bind_lock() checks that the file
	 * it locked is still the one at the path). */
	if (l->lock_fd >= 0) {
		unlink(l->lock_path);
		close(l->lock_fd);
	}
	l->lock_fd = -1;
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
