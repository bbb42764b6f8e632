/* The server: a daemon context (daemon.h) with its transport, the worker and
 * admin listening sockets (listener.h) and their connections (conn.h),
 * assembled and run. main.c is its only user.
 *
 * On the worker socket, root and the daemon's uid are admins too unless
 * worker_socket_admin is off (session.h). The states of a run (serving,
 * draining, stopping) are drawn in lifecycle.h. */
#ifndef KV_SERVER_H
#define KV_SERVER_H

#include "config.h"
#include "conn.h"
#include "daemon.h"
#include "http.h"
#include "listener.h"

struct kv_server {
	struct kv_daemon d;
	struct kv_conns conns;
	struct kv_listener worker, admin;
	struct kv_http *http;      /* GET /metrics (http.h); NULL when off */
};

/* Creates the daemon (backend, pools, tiers) and the listening sockets (or
 * takes them from socket activation). Returns 0 or -errno, logging what
 * failed; kv_server_fini() is needed either way. */
int kv_server_init(struct kv_server *s, const struct kv_config *cfg,
		   const struct kv_config_source *src);
/* Tells systemd it is ready and serves until stopped (lifecycle.h). Returns
 * 0 or -errno. */
int kv_server_run(struct kv_server *s);
/* Closes every connection, unlinks the sockets it bound, frees everything. */
void kv_server_fini(struct kv_server *s);

#endif
