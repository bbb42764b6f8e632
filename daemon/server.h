/* The server: the listening sockets, sessions and framing, and the service
 * life cycle around them (readiness, reload, drain).
 *
 * Session states:
 *
 *   NEW --Hello ok--> READY --EOF / bad frame / error--> CLOSING --last completion--> freed
 *
 *   NEW      only Hello is accepted; anything else is a protocol error
 *   READY    ns set; every reference the session holds is in refs
 *   CLOSING  refs released (sealed blocks stay cached), fd closed, on the
 *            server's closing list until its poll watches finish
 *
 * A bad frame (bad header, oversize, undecodable, unknown op, fds attached)
 * gets an EPROTO reply where one can be sent, then that session closes; no
 * other session notices.
 *
 * Two listening sockets: the worker socket, and the admin socket, whose
 * sessions may use admin operations (evict, flush, drain, reload, metrics, clients,
 * check, every namespace's pools). On the worker socket, root and the
 * daemon's uid are admins too unless worker_socket_admin is off. Either may
 * come from systemd (socket activation) instead of being bound here.
 *
 * Server states:
 *
 *   SERVING --SIGTERM / SIGINT / Drain--> DRAINING --no client left, or
 *                                                    drain_timeout--> stopped
 *   SERVING, DRAINING --second SIGTERM / SIGINT--> stopped
 *
 *   DRAINING  the worker socket no longer accepts (a bound one is closed and
 *             unlinked, so a new daemon can start; an activated one is left
 *             to systemd, whose queue the next instance serves); the admin
 *             socket still does. Register, Alloc, Lookup, Fork and Cow get
 *             ESHUTDOWN; Release and Seal work. "No client left" means every
 *             session still open came through the admin socket and holds no
 *             reference.
 *   stopped   kv_server_run() calls kv_server_on_shutdown() and returns 0. */
#ifndef KV_SERVER_H
#define KV_SERVER_H

#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "arena.h"
#include "backend.h"
#include "config.h"
#include "list.h"
#include "loop.h"
#include "pool.h"
#include "refmap.h"
#include "tier.h"

struct kv_session {
	struct kv_list link;
	struct kv_server *srv;
	uint64_t id;
	int fd;
	struct ucred cred;
	uint32_t ns;               /* 0 until Hello */
	char name[64];
	int closing;
	int admin;                 /* accepted on the admin socket */
	int paused;                /* input held back until output drains */
	int parked;                /* the first frame in waits for a tier (waiter) */
	struct kv_waiter waiter;
	/* A parked lookup's G1 blocks, each with a reference, so that they stay
	 * in G1 until the lookup runs again and takes its own (ops.c). */
	struct kv_block **pins;
	uint32_t npins, pins_cap;
	struct kv_list swaps;      /* swapped-out sequences (tier.c) */
	struct kv_loop_watch win, wout;
	uint8_t *in;
	size_t in_len, in_cap;
	uint8_t *out;
	size_t out_off, out_len, out_cap;
	int *fds;                  /* our dups of segment fds, to send ahead of out[out_off..] */
	size_t nfds, fds_cap;
	uint32_t *seg_sent[KV_MAX_DEVICES];  /* backend epoch of each segment sent, 0 = none */
	struct kv_refmap refs;
	uint64_t connected_ms, requests;
};

/* A listening socket. */
struct kv_listener {
	struct kv_server *srv;
	const char *what;          /* "worker" or "admin" */
	int fd;                    /* -1 once closed */
	int admin;
	int activated;             /* from systemd: never unlinked here */
	char path[108];            /* the file we bound, "" if none */
	uint64_t dev, ino;         /* of that file, to unlink only our own */
	struct kv_loop_watch w;
};

struct kv_server {
	struct kv_config cfg;
	/* Where cfg came from, for reloads (set by the caller after init; NULL:
	 * reloads re-apply nothing). The caller's. */
	const struct kv_config_source *src;
	struct kv_loop loop;
	struct kv_backend *be;
	struct kv_pools *pools;
	struct kv_tiers *tiers;
	struct kv_listener worker, admin;
	int sigfd;
	struct kv_loop_watch sigw;
	struct kv_loop_watch copyw, diskw;  /* tier completions */
	struct kv_list sessions;   /* NEW and READY */
	struct kv_list closing;    /* CLOSING, waiting for their last completions */
	uint32_t nsessions;
	uint64_t next_session;
	struct kv_arena arena;
	void *scratch;             /* max_batch block pointers for ops */
	uint64_t start_ms;
	uint64_t requests, enospc;
	int draining;
	uint64_t drain_deadline_ms;   /* wall clock */
	struct kv_loop_watch drainw, wdogw, statw;
	uint64_t watchdog_usec;
	uint64_t reloads, reload_failures;
};

/* Creates the backend, the pools and the listening sockets (or takes them
 * from socket activation). Returns 0 or -errno, logging what failed. */
int kv_server_init(struct kv_server *s, const struct kv_config *cfg);
/* Tells systemd it is ready and serves until stopped (see the states above).
 * Returns 0 or -errno. */
int kv_server_run(struct kv_server *s);
/* Closes every session, unlinks the sockets it bound, frees everything. */
void kv_server_fini(struct kv_server *s);

/* Starts draining with timeout_ms (0: stop now). why goes to the log.
 * Returns 0, or -EALREADY when draining already. */
int kv_server_drain(struct kv_server *s, uint64_t timeout_ms, const char *why);

/* Reads the configuration again (s->src) and applies the reloadable keys
 * that changed. report(ctx, line, applied) is called for each key that
 * differs ("log_level: info -> debug"); applied 0 means it needs a restart.
 * Returns 0, or -EINVAL with the reason in err when the configuration is
 * invalid (nothing changed then). Logs the outcome. */
int kv_server_reload(struct kv_server *s,
		     void (*report)(void *ctx, const char *line, int applied), void *ctx,
		     char *err, size_t errlen);

/* Sessions that keep a drain going: those of the worker socket, and those of
 * the admin socket that hold references. */
uint32_t kv_server_clients(const struct kv_server *s);

/* Called once when the server stops, drained or not, before sessions close. */
void kv_server_on_shutdown(struct kv_server *s);

/* For ops.c: queues the fd of (dev, seg) to go with the next reply unless
 * this session has the segment's current memory already. Returns 1 if
 * queued, 0 if sent before, or -errno. */
int kv_session_want_segment(struct kv_session *ss, uint32_t dev, uint32_t seg);
/* Whether the peer may use admin operations (root or the daemon's uid). */
int kv_session_is_admin(const struct kv_session *ss);
uint64_t kv_now_ms(void);

#endif
