/* The transport of one connection: input framing, output buffering and
 * back-pressure, fd sending, close. Each connection carries one session
 * (session.h), whose requests it hands to kv_ops_dispatch() one frame at a
 * time.
 *
 *   accept --> OPEN --EOF / bad frame / protocol error--> LINGERING
 *               |  \                                        | output sent, or
 *               |   +--frame_timeout / error / send failure--+ frame_timeout
 *               |                                            v
 *               +----------------------------------------> CLOSING --last
 *                                                         completion--> freed
 *
 *   OPEN       polled for input (multishot POLLIN); orthogonal to it, each
 *              a flag of struct kv_conn (conn.c):
 *              paused        max_output_per_connection bytes of output are
 *                            unsent (one reply more at most): input is left
 *                            unread until the peer reads (one-shot POLLOUT)
 *              parked        the first frame in the buffer waits for a tier
 *                            (session.waiter is queued on it); it runs again
 *                            from the start when woken
 *              fds_held      the first frame's reply needs segment fds, and
 *                            the peer has not read those it was sent yet: it
 *                            runs again once it has (polled by the sweep,
 *                            SIOCOUTQ = 0)
 *              send_blocked  sendmsg failed for want of a resource (fds in
 *                            flight for the daemon's user, kernel memory):
 *                            the output stays queued, the sweep retries
 *              resume        what held the input is gone: the sweep runs the
 *                            input again (it runs no request itself)
 *              partial       a frame has begun to arrive and not ended, while
 *                            input is not held back (partial_ms): after
 *                            frame_timeout the connection closes (the sweep,
 *                            one timer for all connections)
 *              parked and fds_held are never both set (one first frame).
 *   LINGERING  (lingering) no more input is read: it closes once its output
 *              is sent, so that every request before is answered, or
 *              frame_timeout after linger_ms if the peer does not read.
 *              No partial frame; the flags above but parked and fds_held
 *              may still be set.
 *   CLOSING    (closing) the session released, the socket closed, the
 *              buffers freed, no flag set; on cs->closing until the io_uring
 *              completions of its watches have arrived.
 *
 * Sessions and connections: in a daemon that serves sockets (server.c), every
 * session on d->sessions is the session of an OPEN or LINGERING connection,
 * which embeds it (conn.c's conn_of() checks that with a magic number), and
 * a connection's session is on d->sessions exactly until it is CLOSING. A
 * session is opened by kv_conn_accept() only, and released by the close of
 * its connection only (others ask for that through kv_conn_close_session(),
 * d->close_session). Tests and fuzzers that drive kv_ops_dispatch() directly
 * keep sessions of their own and no connections. conn_assert_state() checks
 * one connection against the drawing at each transition.
 *
 * A bad frame (bad header, oversize, undecodable, unknown op, fds attached)
 * gets an EPROTO reply where one can be sent, then that connection closes;
 * no other connection notices. */
#ifndef KV_CONN_H
#define KV_CONN_H

#include "budget.h"
#include "daemon.h"
#include "log.h"
#include "session.h"

/* Connections on the admin socket, which max_connections and
 * max_connections_per_uid do not count, so that kvctl gets in when workers
 * have taken every place. */
#define KV_ADMIN_CONNS_MAX 64

/* The connections of a daemon: the closing ones wait here for their last
 * completions. Embedded in the server. */
struct kv_conns {
	struct kv_daemon *d;
	struct kv_list closing;
	uint64_t refused;          /* connections refused over a limit */
	struct kv_ratelimit refused_log;
	struct kv_loop_watch tick; /* the sweep (conn.c): partial frames, held fds */
	uint64_t tick_due;         /* monotonic ms it is armed for */
	int tick_cancelled;        /* cancelled for an earlier one; its completion re-arms */
	struct kv_budget budget;   /* connection memory per uid (budget.h) */
};

void kv_conns_init(struct kv_conns *cs, struct kv_daemon *d);
/* Closes every connection and frees them all (the loop is stopped: no
 * completion will come for them any more). */
void kv_conns_fini(struct kv_conns *cs);

/* Takes over fd, an accepted socket: records the peer's credentials, opens
 * its session and polls it. admin: from the admin socket. A connection over
 * max_connections or max_connections_per_uid (worker socket), or over
 * KV_ADMIN_CONNS_MAX (admin socket), is refused: it is sent one EAGAIN
 * Response with id 0 that says which limit, then closed, and a warning is
 * logged at most once a second. On failure fd is closed and the reason
 * logged. */
void kv_conn_accept(struct kv_conns *cs, int fd, int admin);

/* Closes the connection that carries ss (an open session), logging why. */
void kv_conn_close_session(struct kv_session *ss, const char *why);

/* Clears fds_unread of every session whose peer has read all it was sent
 * (d->refresh_fds). */
void kv_conns_refresh_fds(struct kv_daemon *d);
/* What waits in the connections now (struct kv_queue_stats): one walk over
 * them, for a scrape. */
void kv_conns_queue_stats(const struct kv_daemon *d, struct kv_queue_stats *q);
/* A request frame's body buf[0..len) decoded when it is a Lookup in the
 * form a packer writes, its hashes pointing into buf (conn.c); NULL
 * otherwise (protobuf-c decodes it). Structs from arena a. */
struct Kvcached__Request *kv_req_unpack_lookup(struct kv_arena *a, const uint8_t *buf, size_t len);
/* The same of a Seal without KV-event fields: its hashes in buf, its
 * handles copied into arena a (conn.c). */
struct Kvcached__Request *kv_req_unpack_seal(struct kv_arena *a, const uint8_t *buf, size_t len);
/* A Response of blocks and nothing else (an id, a BlockList of handles and
 * tiers that each fit a byte; no error, no segments, no unknown fields), or
 * of nothing but its id (a Release's), packed by hand, byte for byte as
 * protobuf-c packs it (conn.c, test_req_unpack): kv_resp_blocks_size() is
 * 1 and *len its packed size, or 0 for any other Response (protobuf-c packs
 * it); kv_resp_blocks_pack() writes those *len bytes at out. */
struct Kvcached__Response;
int kv_resp_blocks_size(const struct Kvcached__Response *rs, size_t *len);
void kv_resp_blocks_pack(const struct Kvcached__Response *rs, uint8_t *out);

#endif
