/* The daemon context: everything a request handler reaches, apart from the
 * transport that brought the request.
 *
 * One struct kv_daemon per process, owned by the event loop thread: the live
 * configuration, the backend, the pools, the tiers, the sessions (protocol
 * state per connection, session.h), the per-request arena and scratch array,
 * the counters operators see, and the drain state. The modules are layered
 * on it, each knowing only those below it:
 *
 *   daemon     this context: the resources, the tier completions
 *   session    a peer's protocol state: namespace, references, segments sent
 *   cache      the prefix cache across G1-G4: lookup, seal, alloc's parking,
 *              the hit counters (cache.h)
 *   lifecycle  drain, reload, signals, watchdog and status timers, stop
 *   ops        the op table and one handler per protocol operation (ops.h,
 *              ops_block.c, ops_admin.c, ops_req.c)
 *   conn       the transport of one connection: framing, buffers, fds
 *   listener   the listening sockets
 *   server     assembles them (main.c calls it)
 *
 * The calls that go upward, from the modules to the transport, go through
 * the five hooks the server sets below: stop_accepting and worker_name (a
 * drain closes the worker socket and names it in the log), close_session (a
 * reload revokes a peer's access), refresh_fds (fds in flight before a
 * refusal) and queue_stats (the metrics). */
#ifndef KV_DAEMON_H
#define KV_DAEMON_H

#include <stdint.h>

#include "arena.h"
#include "backend.h"
#include "config.h"
#include "hist.h"
#include "list.h"
#include "loop.h"
#include "pool.h"
#include "tier.h"

struct kv_session;

/* Request kinds timed one by one: the op table's rows and "other" (ops.c,
 * kv_ops_index; a static assertion there keeps the two equal). */
#define KV_DAEMON_OPS 20

/* What waits in the transport, for the metrics: gathered on demand by the
 * server's hook (conn.c walks the connections), never kept up to date on
 * the hot path. */
struct kv_queue_stats {
	uint64_t parked;          /* requests waiting for a tier (a promotion, G2 room) */
	uint64_t held;            /* requests waiting for their peer to read fds */
	uint64_t paused;          /* connections not read until their peer reads */
	uint64_t out_bytes;       /* replies queued, not sent yet */
	uint64_t conn_bytes;      /* connections' buffers (budget.h) */
	uint64_t budget_closed;   /* connections closed over max_memory_per_uid or
				   * max_connection_memory */
};

struct kv_daemon {
	struct kv_config cfg;
	/* Where cfg came from, for reloads (NULL: reloads re-apply nothing).
	 * The caller's. */
	const struct kv_config_source *src;
	struct kv_loop loop;
	struct kv_backend *be;
	struct kv_pools *pools;
	struct kv_tiers *tiers;
	struct kv_loop_watch copyw, diskw;  /* tier completions */
	struct kv_loop_watch retryw;        /* a failing tier's backoff ends (kv_tiers_retry_ms) */
	struct kv_events *events;  /* KV events (events.h); NULL when off */
	struct kv_list sessions;   /* open sessions (struct kv_session) */
	uint32_t nsessions;
	uint64_t next_session;
	struct kv_arena arena;     /* per request: reset after each reply */
	void *scratch;             /* max_batch block pointers for ops */
	uint64_t start_mono_ms;       /* kv_mono_ms() at start: uptime */
	uint64_t requests, enospc;
	/* Service time per operation: from a whole frame in the buffer to its
	 * reply queued (conn.c); a parked request counts its last run only. */
	struct kv_hist op_hist[KV_DAEMON_OPS];
	uint64_t reloads, reload_failures;
	/* tenant.c: the namespaces the configuration declares, each held open
	 * (one reference) so that its reserve and limits hold while no client
	 * uses it. */
	uint32_t declared_ns[KV_CFG_MAX_NS];
	uint32_t ndeclared;
	/* Segment fds passed to clients: queued dups plus those sent and maybe
	 * not read yet (session.h); kv_daemon_fds_max() bounds them. Set by
	 * the server (0 where nobody did: tests): fd_limit, RLIMIT_NOFILE;
	 * fd_reserved, the fds the daemon needs besides worker connections
	 * and those: its own, the admin socket's connections, a margin. */
	uint64_t fds_out;
	uint64_t fds_uid_refused;  /* requests refused over max_fds_per_uid */
	uint64_t fd_limit, fd_reserved;
	/* lifecycle.c */
	int draining;
	uint64_t drain_deadline_ms;   /* kv_mono_ms(); kv_daemon_wall_ms() for peers */
	uint64_t drain_timeout_ms;    /* the one this drain runs with */
	int flushing;                 /* stopping: writing dirty G2 back to G3 */
	int sigfd;
	uint64_t watchdog_usec;
	struct kv_loop_watch sigw, drainw, wdogw, statw;
	/* Set by the server: stops new connections on the worker socket. */
	void (*stop_accepting)(struct kv_daemon *d);
	/* Set by the server: closes ss's connection, logging why (a reload
	 * that revoked its peer's access). */
	void (*close_session)(struct kv_session *ss, const char *why);
	/* For the log: where the worker socket listens. */
	const char *(*worker_name)(struct kv_daemon *d, char *buf, size_t len);
	/* Set by the server: learns which sessions' peers have read what they
	 * were sent (their fds_unread cleared), before a request is refused
	 * for fds in flight. */
	void (*refresh_fds)(struct kv_daemon *d);
	/* Set by the server: what waits in the connections (zeros where
	 * nobody set it: tests that drive the dispatcher directly). */
	void (*queue_stats)(const struct kv_daemon *d, struct kv_queue_stats *q);
	/* Set by the server: GET /metrics (http.h), for its counters; NULL off. */
	const struct kv_http *http;
	/* Set by the server: the connections (conn.h), for their memory
	 * per uid (budget.h) in the metrics; NULL in tests without a server. */
	const struct kv_conns *conns;
};

/* Creates the backend, the pools, the tiers and the event loop from cfg, and
 * polls the tiers' completions. Returns 0 or -errno, logging what failed;
 * kv_daemon_fini() frees what was made either way. */
int kv_daemon_init(struct kv_daemon *d, const struct kv_config *cfg);
/* Frees what kv_daemon_init() made (sessions must be gone). */
void kv_daemon_fini(struct kv_daemon *d);

/* A stop (lifecycle.h, STOPPING) writes the dirty G2 copies back to G3:
 * starts the write-backs, or goes on with them after a disk completion.
 * Returns 1 when the stop may complete (nothing dirty is left, or nothing
 * more can be written: logged), 0 while writes are in flight (d->flushing
 * is set, and the disk completion that finishes them stops the loop). */
int kv_daemon_stop_flush(struct kv_daemon *d);

/* Frees the pools nothing uses any more (pool.h, kv_pools_collect) and
 * what the tiers keep for each. Called where no caller up the stack holds
 * a pool: before and after each request, after a session is released,
 * after tier completions. */
void kv_daemon_collect(struct kv_daemon *d);
/* The most segment fds that may be out (d->fds_out) at once:
 * max_fds_in_flight when set, and no more than RLIMIT_NOFILE leaves once
 * fd_reserved and a place for every worker connection (max_connections) are
 * counted (the same limit bounds the fds the kernel holds in flight for the
 * daemon's user); UINT64_MAX when neither is known. */
uint64_t kv_daemon_fds_max(const struct kv_daemon *d);
/* The most of them the connections of one uid may have out at once:
 * max_fds_per_uid when set, else half of kv_daemon_fds_max(); never more
 * than kv_daemon_fds_max(). */
uint64_t kv_daemon_fds_per_uid_max(const struct kv_daemon *d);

/* Milliseconds of the wall clock (what operators compare with dates). */
uint64_t kv_now_ms(void);
/* The wall clock time (ms since the epoch) of mono, a kv_mono_ms() value:
 * deadlines are kept on the monotonic clock, so that setting the clock
 * neither ends nor extends them, and shown to peers as wall clock. */
uint64_t kv_daemon_wall_ms(uint64_t mono);

#endif
