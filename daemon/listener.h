/* A listening socket: the worker socket or the admin socket, bound here or
 * taken from systemd (socket activation). Accepted connections go to
 * conn.h; sessions from the admin socket may use admin operations (evict,
 * flush, drain, reload, metrics, clients, check, every namespace's pools). */
#ifndef KV_LISTENER_H
#define KV_LISTENER_H

#include <stdint.h>

#include "conn.h"

struct kv_listener {
	struct kv_conns *conns;
	const char *what;          /* "worker" or "admin" */
	int fd;                    /* -1 once closed */
	int admin;
	int activated;             /* from systemd: never unlinked here */
	char path[108];            /* the file we bound, "" if none */
	uint64_t dev, ino;         /* of that file, to unlink only our own */
	int lock_fd;               /* flock of lock_path while bound; -1 */
	char lock_path[116];       /* "<path>.lock" */
	struct kv_loop_watch w;
	struct kv_ratelimit emfile_log;
};

/* Sets l up, not listening yet; fd, when >= 0, is a socket from systemd. */
void kv_listener_init(struct kv_listener *l, struct kv_conns *conns, const char *what,
		      int admin, int fd);
/* Binds l to path with mode and group (a name or a number; "" keeps ours),
 * unless it came from systemd. A socket file left by a daemon that died is
 * replaced; one a live daemon answers on, or whose "<path>.lock" another
 * daemon holds, is not (-EADDRINUSE). The socket is reachable at path only
 * with its mode and group set. Returns 0 or -errno (logged). */
int kv_listener_bind(struct kv_listener *l, const char *path, unsigned mode, const char *group);
/* Starts accepting. Returns 0 or -errno. */
int kv_listener_start(struct kv_listener *l);
/* Stops l accepting: its watch is cancelled, its fd closed, and the file it
 * bound removed if it is still ours (a newer daemon may have bound the path
 * meanwhile), then its lock file. Idempotent. */
void kv_listener_close(struct kv_listener *l);
/* Where l listens, for the log. */
const char *kv_listener_name(const struct kv_listener *l, char *buf, size_t len);

#endif
