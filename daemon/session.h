/* A session: one peer's protocol state, whatever transport carries it.
 *
 *   NEW --Hello ok--> READY --EOF / bad frame / error--> CLOSED
 *
 *   NEW     only Hello is accepted (ns 0); anything else is a protocol error
 *   READY   ns set; pools the pools it registered, one hold on each; refs
 *           holds exactly the references the peer holds; pins
 *           the references a parked lookup holds for itself; seg_sent the
 *           backend epoch of every segment the peer was sent (0: none);
 *           fds the dups queued for the next replies, fds_unread those sent
 *           that the peer may not have read yet (both count in d->fds_out)
 *   CLOSED  kv_session_release() has dropped every reference (sealed blocks
 *           stay cached), the pins, the swaps and its holds on pools (those
 *           nothing else uses are freed); the session is off the daemon's
 *           list
 *
 * The transport (conn.h) embeds a session, sets waiter.wake and sends the
 * fds queued here ahead of the reply that announces them. Request handlers
 * (ops.h) change sessions; nothing here knows sockets or frames. */
#ifndef KV_SESSION_H
#define KV_SESSION_H

#include <stdint.h>
#include <sys/socket.h>

#include "daemon.h"
#include "refmap.h"
#include "sessrefs.h"

struct kv_budget_uid;

/* Supplementary groups asked for first; a peer in more costs a second call. */
#define KV_SESSION_GROUPS 64

struct kv_session {
	struct kv_list link;       /* d->sessions while open */
	struct kv_daemon *d;
	uint64_t id;
	struct ucred cred;
	uint32_t *groups;          /* the peer's supplementary groups (owned) */
	int ngroups;               /* -1: could not be learnt (then none count) */
	uint32_t ns;               /* 0 until Hello */
	char name[64];
	int admin;                 /* accepted on the admin socket */
	struct kv_waiter waiter;   /* a parked request waits on a tier with it */
	/* A parked lookup's G1 blocks, each with a reference, so that they stay
	 * in G1 until the lookup runs again and takes its own (ops_block.c). */
	struct kv_block **pins;
	uint32_t npins, pins_cap;
	/* Where the parked lookup resumes (cache.c): blocks 0..lk_done-1 of
	 * its chain of lk_n in pool lk_pool are G1 blocks it pinned, in chain
	 * order, at pins[0..lk_done); pins[lk_oldest] is the oldest of them
	 * (born_ms); lk_req is requests when it parked (the rerun is the same
	 * frame: none ended since), lk_sum XXH3 of the last at most 32 of
	 * those hashes. lk_done 0: none (set only while the lookup is parked). */
	const struct kv_pool *lk_pool;
	uint32_t lk_n, lk_done, lk_oldest;
	uint64_t lk_sum, lk_req;
	/* The tiers a parked or held lookup found its blocks in so far
	 * (ops_block.c: lk_tier[0..lk_tier_n) for the lookup of lk_tier_n
	 * hashes in lk_tier_pool, kept while requests is lk_tier_req: the
	 * same frame run again; lk_tier_n 0: none), for its reply's
	 * BlockList.tiers. */
	uint8_t *lk_tier;
	uint32_t lk_tier_n, lk_tier_cap;
	const struct kv_pool *lk_tier_pool;
	uint64_t lk_tier_req;
	struct kv_swap_owner swaps;  /* swapped-out sequences (tier.h) */
	/* The ids of the pools it registered, each holding its pool (pool.h):
	 * a pool lives at least as long as a session that registered it. */
	uint64_t pools[KV_MAX_POOLS / 64];
	int *fds;                  /* our dups of segment fds, not sent yet */
	size_t nfds, fds_cap;
	/* fds sent since the peer was last seen to have read everything the
	 * transport sent it: an upper bound on this session's fds in flight,
	 * which the kernel charges to the daemon's user until they are read
	 * (conn.c counts and clears it). */
	uint32_t fds_unread;
	/* Its uid's share (budget.h), which counts nfds + fds_unread of all
	 * the uid's sessions; NULL for a session without a connection. */
	struct kv_budget_uid *bu;
	uint32_t *seg_sent[KV_MAX_DEVICES];  /* backend epoch of each segment sent, 0 = none */
	struct kv_sessrefs refs;   /* the block references it holds */
	uint64_t connected_ms;
	/* Frames finished (the transport counts them: conn.c). Not counted
	 * while one is parked or held, which runs again before any other: a
	 * lookup that finds it unchanged since it parked is that frame's rerun
	 * (cache.c, ops_block.c), and its hashes the same bytes. */
	uint64_t requests;
};

/* Opens ss (zeroed by the caller) for a peer with cred: NEW (it must say Hello
 * first), on d's list. admin: it came through the admin socket. */
void kv_session_open(struct kv_daemon *d, struct kv_session *ss, const struct ucred *cred,
		     int admin);
/* Learns the supplementary groups of the peer on socket fd (SO_PEERGROUPS:
 * the peer's groups when it connected, however many). If the kernel cannot
 * say, or there is no memory for them, only the primary gid counts (logged). */
void kv_session_peer_groups(struct kv_session *ss, int fd);
/* Pins b for ss (one reference, in ss->pins, dropped by the lookup that
 * runs next or when ss goes): 0, or -ENOMEM. A block at max_block_refs is
 * not pinned (held, it is not demoted either). */
int kv_session_pin(struct kv_session *ss, struct kv_block *b);
/* Releases everything ss holds and takes it off d's list (CLOSED).
 * Idempotent. */
void kv_session_release(struct kv_session *ss);

/* Sets the client's name (Hello's client_name) as shown in logs, kvctl and
 * metrics: at most sizeof(ss->name) - 1 bytes, cut between characters, with
 * every control character and every byte that is not part of valid UTF-8
 * replaced by '?' (a client picks the name; nothing it picks may forge a log
 * line or break a JSON or Prometheus consumer). */
void kv_session_set_name(struct kv_session *ss, const char *name);

/* Records that ss registered p: it keeps the hold kv_pool_register() gave
 * until it closes, one per pool (a second registration's is put back). */
void kv_session_keep_pool(struct kv_session *ss, struct kv_pool *p);

/* Puts ss (NEW) in namespace name, created if need be (Hello; the caller
 * has checked that the peer may). Returns 0, -EINVAL for a bad name or
 * -ENOSPC when KV_MAX_NS namespaces are live. */
int kv_session_enter_ns(struct kv_session *ss, const char *name);
/* Takes ss out of its namespace (release; nothing of it may be held). */
void kv_session_leave_ns(struct kv_session *ss);

/* Whether the peer has (dev, seg)'s current memory: sent, or queued to go
 * with a reply. */
int kv_session_has_segment(const struct kv_session *ss, uint32_t dev, uint32_t seg);
/* Queues a dup of (dev, seg)'s fd to go with the next reply; the peer must
 * not have the segment's current memory (kv_session_has_segment() 0). *old
 * gets what kv_session_unwant_segment() needs to take it back. Returns 0,
 * or -errno (-EMFILE, -ENFILE: the daemon's fd table; -ENOMEM) with nothing
 * queued. */
int kv_session_want_segment(struct kv_session *ss, uint32_t dev, uint32_t seg, uint32_t *old);
/* Takes back the fd queued last, that of (dev, seg) whose previous state was
 * old (a request that queued it failed or waits, and was not answered). */
void kv_session_unwant_segment(struct kv_session *ss, uint32_t dev, uint32_t seg, uint32_t old);
/* The first n queued fds were sent: closes our dups; they count in
 * fds_unread until kv_session_fds_read(). */
void kv_session_fds_sent(struct kv_session *ss, size_t n);
/* The peer has read everything sent to it: nothing of ours is in flight. */
void kv_session_fds_read(struct kv_session *ss);
/* Whether the peer may use admin operations: the admin socket, or root or
 * the daemon's uid on the worker socket unless worker_socket_admin is off. */
int kv_session_is_admin(const struct kv_session *ss);
/* The namespace's name, NULL before Hello (for the log). */
const char *kv_session_ns_name(const struct kv_session *ss);

/* Sessions that keep a drain going: those of the worker socket, and those of
 * the admin socket that hold references. */
uint32_t kv_sessions_clients(const struct kv_daemon *d);
/* References all sessions hold. */
uint64_t kv_sessions_refs(const struct kv_daemon *d);

#endif
