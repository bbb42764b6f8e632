/* A Redis Cluster client for the G4 tier (docs/g4.md): batched GET, SET and
 * DEL of binary keys over the masters of a cluster, with bounded waits.
 *
 * Mechanism only: it knows slots, nodes and redirects, nothing of blocks,
 * pools or the protocol. The tier runs it on one I/O thread of its own
 * (worker.h) and hands results to the loop.
 *
 * Threads: a struct kv_rc is used by one thread at a time (no locks inside);
 * every call is synchronous and returns within a bounded time:
 *   - a connection attempt waits at most timeout_ms;
 *   - a node that sends or accepts nothing for timeout_ms during a call is
 *     given up for that call; and one that moves bytes slower than
 *     min_rate on average (after a grace of timeout_ms) is given up too,
 *     however it spaces them: a node that drips a value or a slot map
 *     holds a call for about timeout_ms, not for as long as it likes;
 *   - a whole call, slot map included, ends within call_ms when set;
 *   - a node that failed (refused, timed out, closed, bad reply, failed
 *     AUTH) is not tried again until its backoff has passed: backoff_min_ms,
 *     doubling up to backoff_max_ms, reset by a round that succeeds. Its keys
 *     are errors meanwhile, at no cost, so a cluster that is down turns every
 *     call into quick errors.
 * Names (not IP literals) in seeds or redirects are resolved by hiredis with
 * getaddrinfo(), which no timeout bounds: give IP addresses where that
 * matters. Nodes learned from CLUSTER SLOTS are what the cluster announces
 * (IP addresses unless it is set to announce hostnames).
 *
 * A call groups its keys per master and sends each master its commands
 * pipelined, all masters at once (one poll() loop), then follows redirects
 * in further rounds (at most max_redirects per key): -MOVED updates that
 * slot's owner, asks for a new slot map at the next call and retries the key
 * there; -ASK sends ASKING and the command to the node named, for that key
 * only. -TRYAGAIN, -CLUSTERDOWN and every other error reply is an error for
 * that key (no waiting, no retry). A reply of an unexpected type is an error
 * for its key; a reply that breaks the protocol, or is larger than
 * max_value, drops the connection, as do bytes nobody asked for. (RESP has
 * no request ids: a server that slips an extra reply into a pipeline
 * shifts the answers of the keys after it, so the tier checks what it
 * reads: STYLE.md, data that leaves memory carries a checksum.) A connection that was idle since an
 * earlier call and turns out closed is opened again once, at once; any other
 * connection failure errs the node's unanswered keys of this call, starts
 * its backoff and asks for a new slot map, which the next call fetches from
 * another node (CLUSTER SLOTS, sent to up to three nodes not in backoff at
 * once; at most one fetch per refresh_min_ms).
 *
 * AUTH: with a password, every new connection starts with AUTH user pass
 * (user given) or AUTH pass; a refused AUTH is an error for the node's keys,
 * with the server's words in kv_rc_last_error(), and backs the node off.
 *
 * Not here: TLS (hiredis 0.14, the Debian 12 library, has none: a G4 on an
 * untrusted network needs a tunnel or a newer hiredis), reads from replicas,
 * RESP3, pub/sub. hiredis 0.14 aborts when malloc fails inside it (command
 * formatting, connection setup); replies are built by this module, which
 * fails the call instead.
 *
 * Built only when hiredis is found (KV_HAVE_HIREDIS in kvconfig.h). */
#ifndef KV_RCLUSTER_H
#define KV_RCLUSTER_H

#include <stddef.h>
#include <stdint.h>

#define KV_RC_SLOTS 16384

/* Per-key results. */
enum {
	KV_RC_ERROR = -1,  /* no answer, or an error: the caller treats it as a miss */
	KV_RC_OK = 0,      /* set: stored; del: deleted */
	KV_RC_HIT = 1,     /* get: data and len hold the value */
	KV_RC_MISS = 2,    /* get, del: no such key */
	KV_RC_TOOLONG = 3, /* get into a destination: the value is longer than it (nothing written) */
};

/* Binary-safe: any bytes, NULs included. */
struct kv_rc_key {
	const void *data;
	size_t len;
};

/* A value: what kv_rc_get() fills in (data owned by the caller, given back
 * with kv_rc_vals_release() for the next calls to reuse, or freed with
 * kv_rc_val_free(); never free() it), or what kv_rc_set() stores (data the
 * caller's, only read; status unused). */
struct kv_rc_val {
	void *data;
	size_t len;
	int status;   /* KV_RC_HIT, KV_RC_MISS or KV_RC_ERROR (kv_rc_get_into(): or
	               * KV_RC_TOOLONG) */
};

/* Where kv_rc_get_into() writes one key's value: its first part[0].len
 * bytes at part[0].p, the next part[1].len at part[1].p, and so on; the
 * destination's capacity is the sum of the parts' lengths. nparts 0: no
 * destination, the value is read as kv_rc_get() reads it. */
#define KV_RC_DST_PARTS 4
struct kv_rc_dst {
	struct {
		void *p;
		size_t len;
	} part[KV_RC_DST_PARTS];
	unsigned nparts;
};

struct kv_rc_stats {
	uint64_t rounds;           /* pipelined exchanges with one node */
	uint64_t keys_get, keys_set;
	uint64_t hits, misses;     /* gets */
	uint64_t errors;           /* keys (get, set, del) that ended KV_RC_ERROR */
	uint64_t redirects_moved, redirects_ask;
	uint64_t refreshes;        /* slot maps loaded */
	uint64_t reconnects;       /* connections made to a node that had one before */
	uint64_t connect_failures; /* connections that did not come up (AUTH included) */
	uint64_t bytes_in, bytes_out;
	uint64_t pool_hits;        /* values of 4 KiB or more read into a kept buffer */
	uint64_t pool_misses;      /* ... into a new one */
	uint64_t direct;           /* values written into a caller's destination */
	uint64_t toolong;          /* values longer than their destination: refused */
};

/* Every limit, with its default. */
struct kv_rc_limits {
	unsigned timeout_ms;       /* connect; silence during a call (200) */
	unsigned backoff_min_ms;   /* first wait after a node failed (100) */
	unsigned backoff_max_ms;   /* the doubling stops there (5000) */
	unsigned max_redirects;    /* MOVED/ASK followed per key per call (3) */
	unsigned refresh_min_ms;   /* at most one slot-map fetch per (100) */
	unsigned max_nodes;        /* nodes known at once, seeds included (1024, at most 65535) */
	size_t max_value;          /* larger replies drop the connection (512 MiB) */
	/* 0 (the default): kv_rc_get() sends GET. Else it sends GETRANGE key 0
	 * get_max, so that the server sends get_max + 1 bytes of a value at
	 * most (a value that long is longer than the caller can use: it sees
	 * get_max + 1 bytes and refuses it, nothing more is read or buffered);
	 * GETRANGE answers a missing key with an empty string, so an empty
	 * value is KV_RC_MISS then. Keep max_value above get_max. */
	size_t get_max;
	/* Value buffers kept by kv_rc_vals_release() for later calls, in
	 * bytes (128 MiB); 0: none kept. Only values of 4 KiB or more are
	 * kept, in at most 8 sizes (rounded up to 4 KiB). Lowering it frees
	 * what is over. */
	size_t pool_max;
	/* A node must move at least min_rate bytes per second (sent and
	 * received together) over its part of an exchange, after a grace of
	 * timeout_ms: it is given up when now passes
	 *   round start + timeout_ms + bytes moved / min_rate,
	 * however often single bytes arrive (a node that drips a value or a
	 * slot map one byte at a time never resets it). 0: no floor. The
	 * default is 1 MiB/s. */
	size_t min_rate;
	/* A call (kv_rc_get*(), kv_rc_set(), kv_rc_del()) returns within
	 * call_ms, the slot map it may fetch first included: what is
	 * unanswered then is KV_RC_ERROR, the nodes owing it are given up
	 * (backoff). 0 (the default): no whole-call bound beyond the per-node
	 * ones. */
	unsigned call_ms;
};

struct kv_rc;

/* A client for the cluster reachable through seeds: "host:port" items
 * separated by commas ("[v6addr]:port" for IPv6). user NULL: no user name;
 * password NULL: no AUTH (user is then ignored). timeout_ms 0: 200. Nothing
 * is connected until the first call. The strings are copied.
 * Returns 0 and *out, or -EINVAL (a bad seed list or timeout, the reason in
 * err) or -ENOMEM; *out is untouched on failure. */
int kv_rc_new(const char *seeds, const char *user, const char *password, unsigned timeout_ms,
	      struct kv_rc **out, char *err, size_t errlen);
/* Closes every connection and frees rc. NULL: nothing. */
void kv_rc_free(struct kv_rc *rc);

/* Batches of n 0 return 0 at once, sending nothing.
 *
 * Reads out[i] for keys[i], i < n. Each out[i] gets a status: KV_RC_HIT
 * (data the caller's, from the value pool or malloc'd, len bytes, plus a NUL after them that len does not count),
 * KV_RC_MISS or KV_RC_ERROR (data NULL, len 0). A node that is down makes
 * its keys errors; the other nodes' keys are answered. Returns the number of
 * hits, or -EINVAL/-ENOMEM (before anything is sent; out untouched). */
int kv_rc_get(struct kv_rc *rc, size_t n, const struct kv_rc_key *keys, struct kv_rc_val *out);
/* Called by kv_rc_get_into() on its thread, during the call, for each key i
 * whose value was just written into its destination (len bytes), as soon as
 * that answer is final: the bytes are still in the CPU's caches. It must
 * not call rc. */
typedef void kv_rc_value_fn(void *arg, size_t i, size_t len);

/* kv_rc_get() that writes the value of keys[i] into dst[i] (dst NULL: no
 * destination for any key) straight from the socket reader's buffer, one
 * copy, instead of into a buffer of its own. For a key with a destination:
 *   - KV_RC_HIT: len bytes (at most its capacity) were written in order
 *     into its parts, from the start; data is NULL (nothing to release);
 *     what lies past len in the destination is untouched;
 *   - KV_RC_TOOLONG: the value is longer than the capacity; len holds its
 *     length, nothing was written (never past the end, nor partly);
 *   - KV_RC_MISS, KV_RC_ERROR: nothing was written.
 * Keys without one (nparts 0) are answered as kv_rc_get() answers them.
 * on_value (NULL: none) is called with arg for every KV_RC_HIT written into
 * a destination, before the call returns.
 * The destinations are written only during the call, by the calling thread;
 * a hostile server can put any bytes there, up to the capacity (a reply that
 * answers another key's command lands in that key's destination), so the
 * caller checks what it reads. Returns the number of KV_RC_HIT, or -EINVAL
 * (more than KV_RC_DST_PARTS parts, a NULL part with a length) / -ENOMEM
 * before anything is sent. */
int kv_rc_get_into(struct kv_rc *rc, size_t n, const struct kv_rc_key *keys,
		   const struct kv_rc_dst *dst, kv_rc_value_fn *on_value, void *arg,
		   struct kv_rc_val *out);
/* SET keys[i] vals[i] (EX ttl_s unless ttl_s is 0: no expiry); status[i]
 * gets KV_RC_OK or KV_RC_ERROR. Returns the number stored, or -EINVAL/-ENOMEM
 * (nothing sent, status untouched). */
int kv_rc_set(struct kv_rc *rc, size_t n, const struct kv_rc_key *keys,
	      const struct kv_rc_val *vals, unsigned ttl_s, int *status);
/* kv_rc_set() of values in parts: vals[i]'s value is its parts' bytes in
 * order (the tier's: a header, a G2 slot's payload, a tag), each part of
 * 4 KiB or more sent from where it lies, never copied (up to 64 of them
 * per node's output at once; past that, copied): the caller keeps them
 * unchanged until the call returns. Returns as kv_rc_set(); -EINVAL also
 * for more than KV_RC_DST_PARTS parts or a NULL part with a length. */
int kv_rc_set_parts(struct kv_rc *rc, size_t n, const struct kv_rc_key *keys,
		    const struct kv_rc_dst *vals, unsigned ttl_s, int *status);
/* DEL keys[i]; status[i] gets KV_RC_OK (deleted), KV_RC_MISS (absent) or
 * KV_RC_ERROR. Returns the number deleted, or -EINVAL/-ENOMEM. */
int kv_rc_del(struct kv_rc *rc, size_t n, const struct kv_rc_key *keys, int *status);

/* Gives what kv_rc_get() put in v[0..n) back to rc's value pool (what
 * does not fit pool_max is freed) and leaves the values empty: the next
 * kv_rc_get() reads into those buffers, whose pages are already mapped.
 * Counts as a use of rc (one thread at a time). rc NULL: kv_rc_vals_free(). */
void kv_rc_vals_release(struct kv_rc *rc, size_t n, struct kv_rc_val *v);
/* Frees what kv_rc_get() put in v (NULL or an empty value: nothing) and
 * leaves v empty. */
void kv_rc_val_free(struct kv_rc_val *v);
/* The same for n values. */
void kv_rc_vals_free(size_t n, struct kv_rc_val *v);

/* Makes rc share its nodes' backoffs with `with` (and with every client
 * already sharing with it): a node that one of them gives up (refused,
 * timed out, too slow, the call's deadline) is in backoff for all of them
 * until it passes, each failing that node's keys at once instead of
 * finding it slow again, and a round that succeeds with it after that
 * ends the backoff for all (the tier's readers, issue 36). Each client is
 * still used by one thread at a time; the table has a lock of its own and
 * goes with the last client freed. Call before rc is used. Returns 0,
 * -EINVAL (rc already shares, or rc == with) or -ENOMEM. */
int kv_rc_share_backoff(struct kv_rc *rc, struct kv_rc *with);

/* Makes the call under way on rc's thread (if any) and every later call
 * return at once, with every key unanswered KV_RC_ERROR and nothing more
 * sent: for a daemon that stops (whatever the cluster does, its threads
 * end now). Permanent. The one function that may be called from another
 * thread than rc's (async-signal-safe too: an atomic store and a write()
 * to an eventfd). */
void kv_rc_cancel(struct kv_rc *rc);

/* The first error of the last call, or "" if it had none: "host:port: what"
 * (a refused connection, a timeout, an AUTH the server refused with its
 * words, an error reply). Valid until the next call on rc. */
const char *kv_rc_last_error(const struct kv_rc *rc);

void kv_rc_stats(const struct kv_rc *rc, struct kv_rc_stats *st);
void kv_rc_get_limits(const struct kv_rc *rc, struct kv_rc_limits *l);
/* Returns 0, or -EINVAL for a zero or absurd value (rc unchanged). */
int kv_rc_set_limits(struct kv_rc *rc, const struct kv_rc_limits *l);

/* How many masters owned slots in the map at its last load (0: none
 * loaded yet); MOVED updates since are not counted. */
unsigned kv_rc_masters(const struct kv_rc *rc);

/* CRC16-XMODEM (poly 0x1021, init 0), Redis Cluster's key hash. */
uint16_t kv_rc_crc16(const void *p, size_t n);
/* The slot of a key: CRC16 of the bytes between the first '{' and the
 * first '}' after it when there is at least one, else of the whole key;
 * mod 16384. */
unsigned kv_rc_keyslot(const void *key, size_t len);

/* Fault points for tests: the point passes skip calls, then fails count
 * (UINT_MAX: every one from then on; 0 disarms it); a failure looks like the
 * real one (a refused connection, a reset on send, a reset on read). */
enum kv_rc_fault {
	KV_RC_FAULT_CONNECT,
	KV_RC_FAULT_WRITE,
	KV_RC_FAULT_READ,
	KV_RC_FAULT_N
};
void kv_rc_fault(struct kv_rc *rc, enum kv_rc_fault point, unsigned skip, unsigned count);

#endif
