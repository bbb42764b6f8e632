/* The server: the listening socket, sessions and framing.
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
 * other session notices. */
#ifndef KV_SERVER_H
#define KV_SERVER_H

#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "arena.h"
#include "backend.h"
#include "list.h"
#include "loop.h"
#include "pool.h"
#include "refmap.h"
#include "tier.h"

struct kv_config {
	char socket_path[108];
	unsigned socket_mode;
	char backend[16];
	uint64_t pool_bytes;
	uint64_t segment_bytes;
	uint64_t page_bytes;
	uint32_t max_frame;
	uint32_t max_batch;
	int log_level;
	struct kv_tiers_config tiers;
};

struct kv_session {
	struct kv_list link;
	struct kv_server *srv;
	uint64_t id;
	int fd;
	struct ucred cred;
	uint32_t ns;               /* 0 until Hello */
	char name[64];
	int closing;
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

struct kv_server {
	struct kv_config cfg;
	struct kv_loop loop;
	struct kv_backend *be;
	struct kv_pools *pools;
	struct kv_tiers *tiers;
	int lfd, sigfd;
	struct kv_loop_watch lw, sigw;
	struct kv_loop_watch copyw, diskw;  /* tier completions */
	struct kv_list sessions;   /* NEW and READY */
	struct kv_list closing;    /* CLOSING, waiting for their last completions */
	uint32_t nsessions;
	uint64_t next_session;
	struct kv_arena arena;
	void *scratch;             /* max_batch block pointers for ops */
	uint64_t start_ms;
	uint64_t requests, enospc;
};

/* Sets the documented defaults. */
void kv_config_defaults(struct kv_config *c);

/* Creates the backend, the pools and the listening socket. Returns 0 or
 * -errno, logging what failed. */
int kv_server_init(struct kv_server *s, const struct kv_config *cfg);
/* Serves until SIGTERM/SIGINT. Returns 0 or -errno. */
int kv_server_run(struct kv_server *s);
/* Closes every session, unlinks the socket, frees everything. */
void kv_server_fini(struct kv_server *s);

/* For ops.c: queues the fd of (dev, seg) to go with the next reply unless
 * this session has the segment's current memory already. Returns 1 if
 * queued, 0 if sent before, or -errno. */
int kv_session_want_segment(struct kv_session *ss, uint32_t dev, uint32_t seg);
/* Whether the peer may use admin operations (root or the daemon's uid). */
int kv_session_is_admin(const struct kv_session *ss);
uint64_t kv_now_ms(void);

#endif
