/* The Redis Cluster client of the G4 tier; rcluster.h has the contract.
 *
 * One file past 1,500 lines: the node table, the slot map, the exchange
 * loop, redirects and the reply reader share one set of private structures
 * (struct rc_node, rc_op, rc_reply) and invariants (rc_check()); split, each
 * part would need the others' internals in a header of its own.
 *
 * Nodes. Every node the client knows (seeds, masters of the slot map,
 * targets of redirects) has a struct rc_node, found by host and port; the
 * table holds at most max_nodes. A slot-map load drops the nodes it no
 * longer names (seeds stay). owner[slot] points at the master of each slot,
 * or NULL where the map says nothing. A node's connection:
 *
 *        connect() started                writable, SO_ERROR 0
 *   DOWN ----------------> CONNECTING ----------------------> UP
 *    ^                          |                               |
 *    +--- failure: close, backoff (retry_at), keys errors ------+
 *
 *   DOWN:       c == NULL; retry_at says when a connect may be tried
 *               (backoff_ms 0: never failed, or a round succeeded since).
 *   CONNECTING: c != NULL, its non-blocking connect in flight.
 *   UP:         c != NULL; between calls nothing is queued, nothing is owed
 *               (every command sent was answered), so the next call's
 *               replies are its own.
 * rc_check() asserts this at the start and end of every call.
 *
 * A call. Each key is an op; ops are queued on the node that owns their
 * slot, and one exchange drives every such node at once: connect where
 * needed (AUTH first on a new connection), append commands while the
 * output buffer is under RC_OBUF_HIGH (so a large batch does not sit twice
 * in memory), send, read, hand each reply to the op it answers (replies
 * come in order on a connection). An op's queue is walked by two cursors:
 * send (the next op to append) and recv (the next op owed a reply). A node
 * leaves the exchange when recv reaches the end (success: its backoff is
 * reset), or when it fails: then every op from recv on is an error. A
 * redirected op is marked again and queued in the next exchange, on the
 * node the redirect named; at most max_redirects + 1 exchanges per call.
 *
 * Waiting. The only blocking call is poll(), with the earliest deadline of
 * the nodes in the exchange. A node has three:
 *   - silence: timeout_ms after its last progress (connect started, bytes
 *     sent or received), checked only after a poll() that waited until it
 *     and saw nothing from the node (time this thread spent elsewhere is
 *     not the node's silence);
 *   - rate: round start + timeout_ms + bytes moved / min_rate, checked
 *     after a poll() that saw nothing from it (so bytes already waiting are
 *     read first, and credited): a node that drips a reply, whether a
 *     value or a slot map, keeps the silence deadline away with every byte
 *     but not this one (issue 36: a value sent a byte every 0.1 s held the
 *     one read thread, so every tenant's lookups, for as long as the node
 *     liked);
 *   - the call's: call_ms after the call began (slot map included), checked
 *     every time round: what is unanswered then is an error.
 * kv_rc_cancel() makes every call end at once: an eventfd in every poll().
 * A slot map fetch ends as soon as one node's answer checks out (the others
 * owed one are closed, with no backoff: slow is not wrong there). Sockets
 * are non-blocking; writes use send(MSG_NOSIGNAL), so a closed peer is an
 * error, not a SIGPIPE.
 *
 * Replies are built by this module's reader functions (struct rc_reply, not
 * hiredis' redisReply), so that hostile lengths fail the reply instead of
 * the process: each reply may take at most max_value + RC_REPLY_SLACK bytes
 * of objects, array headers included (hiredis would calloc() what any
 * "*N" asks), and the bytes waiting in the reader may not pass that either.
 * A GET's value is copied once out of the reader's buffer: with
 * kv_rc_get_into() and a destination for its key, straight there (the
 * reader's string callback finds the key its reply answers as rc_reply()
 * does, and writes nothing when the value is longer than the destination);
 * otherwise into a buffer of
 * the value pool, and handed to the caller, who gives it back with
 * kv_rc_vals_release() (or frees it). The pool keeps buffers, and their
 * pages, from one batch to the next, up to pool_max bytes in a few size
 * classes (a class is a capacity rounded up to 4 KiB; the class used
 * longest ago goes when a new one needs its place): a value of 128 KiB or
 * more malloc'd per call is an mmap() of its own in glibc, unmapped at its
 * free(), so without the pool every batch page-faulted through fresh zeroed
 * memory. The reader's own buffer is kept too (hiredis frees it whenever it
 * is empty and more than 16 KiB; here it is kept up to twice the largest
 * value a call allows, plus RC_READER_KEEP). Every string a reply holds
 * sits behind a struct rc_vhdr, so that kv_rc_val_free() can free any. */
#include "rcluster.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "kvassert.h"
#include "kvclock.h"

#define RC_DEFAULT_TIMEOUT_MS 200
#define RC_HOST_MAX 255
#define RC_READ_CHUNK (64 * 1024)
#define RC_OBUF_HIGH (256 * 1024)
#define RC_REFRESH_FANOUT 3
#define RC_REPLY_SLACK (16u << 20)
#define RC_MAX_NODES_CAP 65535u
#define RC_MAX_VALUE_CAP (1u << 30)  /* sds ranges are ints in hiredis 0.14 */
#define RC_POOL_MIN 4096u            /* smaller strings are plain malloc()s */
#define RC_POOL_CLASSES 8
#define RC_POOL_DEFAULT (128u << 20)
#define RC_READER_KEEP (4u << 20)
#define RC_EXT_MIN 4096u             /* SET values this long are sent from where they are */
#define RC_EXT_MAX 64                /* ... at most this many in a node's output at once */
#define RC_SHARED_MAX 4096u          /* nodes a shared backoff table holds at most */

/* What precedes every string this module hands out; the bytes follow it. */
union rc_vhdr {
	struct {
		union rc_vhdr *next;   /* in its pool class */
		size_t cap;            /* bytes after the header */
	} h;
	max_align_t align;
};

struct rc_pool_class {
	size_t cap;                /* 0: unused */
	union rc_vhdr *head;
	uint64_t used;             /* tick of the last take or give */
};

enum rc_state { RC_DOWN, RC_CONNECTING, RC_UP };
enum rc_kind { RC_GET, RC_SET, RC_DEL, RC_SLOTS };

/* A reply as this module's reader functions build it. */
struct rc_reply {
	int type;                  /* REDIS_REPLY_* */
	long long integer;
	size_t len;                /* bytes of str, or elements of an array */
	char *str;                 /* malloc'd, len + 1 bytes, NUL-terminated */
	struct rc_reply **element;
	/* A GET's value with a destination (kv_rc_get_into()): RC_DST_WRITTEN
	 * (len bytes there, str NULL) or RC_DST_TOOLONG (nothing written). */
	int dst;
};

enum { RC_DST_NONE, RC_DST_WRITTEN, RC_DST_TOOLONG };

/* A nil array (*-1), told apart from a nil string ($-1). */
#define RC_REPLY_NIL_ARRAY 100

static const char *rc_type_name(int type)
{
	switch (type) {
	case REDIS_REPLY_STRING: return "a string";
	case REDIS_REPLY_ARRAY: return "an array";
	case REDIS_REPLY_INTEGER: return "an integer";
	case REDIS_REPLY_NIL: return "a nil";
	case REDIS_REPLY_STATUS: return "a status";
	case REDIS_REPLY_ERROR: return "an error";
	case RC_REPLY_NIL_ARRAY: return "a nil array";
	default: return "an unknown type";
	}
}

struct rc_node;

/* Backoffs shared by clients (kv_rc_share_backoff()): one entry per node
 * (host, port) any of them knows, its backoff as the last of them to fail
 * it or to succeed with it left it. Entries stay until the table goes with
 * its last client (at most RC_SHARED_MAX: a node past it is not shared);
 * every field but next, port and host under mu. */
struct rc_shnode {
	struct rc_shnode *next;
	int port;
	uint64_t retry_at;         /* ns */
	unsigned backoff_ms;
	char why[160];
	char host[];
};

struct rc_shared {
	pthread_mutex_t mu;
	atomic_uint refs;
	unsigned n;
	struct rc_shnode *head;
};

struct rc_op {
	struct rc_op *next;        /* in its node's queue */
	struct rc_node *node;      /* where it goes next; NULL: by the slot map */
	size_t idx;                /* the key's index; RC_SLOTS: the candidate's */
	uint16_t slot;
	uint8_t asking;            /* send ASKING before it */
	uint8_t asking_seen;       /* ASKING's reply has been read */
	uint8_t again;             /* redirected: goes in the next exchange */
	uint8_t redirects;
	int status;
	void *data;                /* RC_GET hit: the value; RC_SLOTS: the reply */
	size_t len;
};

struct rc_node {
	char *host;
	int port;
	unsigned seed : 1, ever_up : 1, reused : 1, retried : 1, mark : 1;
	enum rc_state state;
	redisContext *c;
	uint64_t retry_at;         /* ns */
	unsigned backoff_ms;
	char why[160];             /* why it last failed */
	struct kv_rc *rc;
	struct rc_shnode *sh;      /* its shared backoff (kv_rc_share_backoff()); NULL: none */

	/* During an exchange. */
	struct rc_op *head, *tail, *send, *recv;
	uint64_t deadline;         /* ns: silence */
	uint64_t round_start;      /* ns: when it joined the exchange */
	uint64_t moved;            /* bytes sent and received since */
	int auth_pending, replies;
	size_t budget;             /* bytes the reply being read has taken */
	/* A GET's value being read from the socket straight into its
	 * destination (rc_direct_start()): d NULL when none. */
	struct {
		const struct kv_rc_dst *d;
		size_t len, got;       /* its length, bytes of it read */
		char crlf[2];
		unsigned crlf_got;
	} direct;
	/* Values sent from the caller's memory (rc_append_argv()): the bytes to
	 * send are obuf up to ext[0].at, ext[0]'s, obuf on to ext[1].at, ...,
	 * the rest of obuf; ext_cur and ext_off (bytes of it sent), obuf_off
	 * (bytes of obuf sent) say how far sending has come. */
	struct {
		size_t at;
		const char *p;
		size_t len;
	} ext[RC_EXT_MAX];
	unsigned next, ext_cur;
	size_t ext_off, obuf_off, ext_left;  /* ext_left: bytes of ext not yet sent */
};

struct rc_call {
	int kind;
	const struct kv_rc_key *keys;
	const struct kv_rc_val *vals;
	const struct kv_rc_dst *parts; /* RC_SET: kv_rc_set_parts()'s values (vals NULL) */
	const struct kv_rc_dst *dst;   /* RC_GET: kv_rc_get_into()'s; NULL: none */
	kv_rc_value_fn *on_value;      /* ... and its callback (NULL: none) */
	void *arg;
	char ttl[24];              /* "" for none */
};

struct kv_rc {
	struct kv_rc_limits lim;
	char *user, *password;
	struct rc_node **nodes;
	unsigned nnodes, cap;
	struct rc_node **active;   /* cap entries: the nodes of an exchange */
	struct pollfd *pfd;        /* cap + 1 entries: the last is cfd's */
	int cfd;                   /* eventfd: readable once kv_rc_cancel() was called */
	atomic_int cancelled;
	uint64_t call_deadline;    /* ns; UINT64_MAX: none */
	struct rc_shared *shared;  /* backoffs shared with other clients; NULL: none */
	/* A slot-map fetch under way (rc_refresh()): its ops, and whether one
	 * answer was loaded already. */
	struct rc_op *map_ops;
	unsigned map_n, map_won;
	int have_map, refresh_due;
	unsigned nmasters;         /* owners in the map at its last load */
	uint64_t last_refresh;     /* ns */
	unsigned refresh_rr;
	struct rc_call *call;      /* the call in progress */
	struct {
		struct rc_pool_class c[RC_POOL_CLASSES];
		size_t bytes;          /* held in the classes */
		uint64_t tick;
	} pool;
	struct kv_rc_stats st;
	char err[256];
	struct {
		unsigned skip, count;
		int armed;
	} fault[KV_RC_FAULT_N];
	struct rc_node *owner[KV_RC_SLOTS];
	struct rc_node *scratch[KV_RC_SLOTS];  /* a map being parsed */
};

/* ---- CRC16 and slots ---- */

static const uint16_t crc16tab[256] = {
	0x0000, 0x1021, 0x2042, 0x3063, 0x4084, 0x50a5, 0x60c6, 0x70e7,
	0x8108, 0x9129, 0xa14a, 0xb16b, 0xc18c, 0xd1ad, 0xe1ce, 0xf1ef,
	0x1231, 0x0210, 0x3273, 0x2252, 0x52b5, 0x4294, 0x72f7, 0x62d6,
	0x9339, 0x8318, 0xb37b, 0xa35a, 0xd3bd, 0xc39c, 0xf3ff, 0xe3de,
	0x2462, 0x3443, 0x0420, 0x1401, 0x64e6, 0x74c7, 0x44a4, 0x5485,
	0xa56a, 0xb54b, 0x8528, 0x9509, 0xe5ee, 0xf5cf, 0xc5ac, 0xd58d,
	0x3653, 0x2672, 0x1611, 0x0630, 0x76d7, 0x66f6, 0x5695, 0x46b4,
	0xb75b, 0xa77a, 0x9719, 0x8738, 0xf7df, 0xe7fe, 0xd79d, 0xc7bc,
	0x48c4, 0x58e5, 0x6886, 0x78a7, 0x0840, 0x1861, 0x2802, 0x3823,
	0xc9cc, 0xd9ed, 0xe98e, 0xf9af, 0x8948, 0x9969, 0xa90a, 0xb92b,
	0x5af5, 0x4ad4, 0x7ab7, 0x6a96, 0x1a71, 0x0a50, 0x3a33, 0x2a12,
	0xdbfd, 0xcbdc, 0xfbbf, 0xeb9e, 0x9b79, 0x8b58, 0xbb3b, 0xab1a,
	0x6ca6, 0x7c87, 0x4ce4, 0x5cc5, 0x2c22, 0x3c03, 0x0c60, 0x1c41,
	0xedae, 0xfd8f, 0xcdec, 0xddcd, 0xad2a, 0xbd0b, 0x8d68, 0x9d49,
	0x7e97, 0x6eb6, 0x5ed5, 0x4ef4, 0x3e13, 0x2e32, 0x1e51, 0x0e70,
	0xff9f, 0xefbe, 0xdfdd, 0xcffc, 0xbf1b, 0xaf3a, 0x9f59, 0x8f78,
	0x9188, 0x81a9, 0xb1ca, 0xa1eb, 0xd10c, 0xc12d, 0xf14e, 0xe16f,
	0x1080, 0x00a1, 0x30c2, 0x20e3, 0x5004, 0x4025, 0x7046, 0x6067,
	0x83b9, 0x9398, 0xa3fb, 0xb3da, 0xc33d, 0xd31c, 0xe37f, 0xf35e,
	0x02b1, 0x1290, 0x22f3, 0x32d2, 0x4235, 0x5214, 0x6277, 0x7256,
	0xb5ea, 0xa5cb, 0x95a8, 0x8589, 0xf56e, 0xe54f, 0xd52c, 0xc50d,
	0x34e2, 0x24c3, 0x14a0, 0x0481, 0x7466, 0x6447, 0x5424, 0x4405,
	0xa7db, 0xb7fa, 0x8799, 0x97b8, 0xe75f, 0xf77e, 0xc71d, 0xd73c,
	0x26d3, 0x36f2, 0x0691, 0x16b0, 0x6657, 0x7676, 0x4615, 0x5634,
	0xd94c, 0xc96d, 0xf90e, 0xe92f, 0x99c8, 0x89e9, 0xb98a, 0xa9ab,
	0x5844, 0x4865, 0x7806, 0x6827, 0x18c0, 0x08e1, 0x3882, 0x28a3,
	0xcb7d, 0xdb5c, 0xeb3f, 0xfb1e, 0x8bf9, 0x9bd8, 0xabbb, 0xbb9a,
	0x4a75, 0x5a54, 0x6a37, 0x7a16, 0x0af1, 0x1ad0, 0x2ab3, 0x3a92,
	0xfd2e, 0xed0f, 0xdd6c, 0xcd4d, 0xbdaa, 0xad8b, 0x9de8, 0x8dc9,
	0x7c26, 0x6c07, 0x5c64, 0x4c45, 0x3ca2, 0x2c83, 0x1ce0, 0x0cc1,
	0xef1f, 0xff3e, 0xcf5d, 0xdf7c, 0xaf9b, 0xbfba, 0x8fd9, 0x9ff8,
	0x6e17, 0x7e36, 0x4e55, 0x5e74, 0x2e93, 0x3eb2, 0x0ed1, 0x1ef0,
};

uint16_t kv_rc_crc16(const void *p, size_t n)
{
	const unsigned char *b = p;
	uint16_t crc = 0;
	size_t i;

	for (i = 0; i < n; i++)
		crc = (uint16_t)(crc << 8) ^ crc16tab[((crc >> 8) ^ b[i]) & 0xff];
	return crc;
}

unsigned kv_rc_keyslot(const void *key, size_t len)
{
	const char *k = key, *open, *close;

	open = len ? memchr(k, '{', len) : NULL;
	if (open) {
		size_t rest = len - (size_t)(open - k) - 1;

		close = rest ? memchr(open + 1, '}', rest) : NULL;
		if (close && close > open + 1)
			return kv_rc_crc16(open + 1, (size_t)(close - open - 1)) & (KV_RC_SLOTS - 1);
	}
	return kv_rc_crc16(k, len) & (KV_RC_SLOTS - 1);
}

/* ---- small helpers ---- */

static uint64_t now_ns(void)
{
	return kv_mono_ns();
}

static uint64_t ms_ns(unsigned ms)
{
	return (uint64_t)ms * 1000000u;
}

/* Records the first error of a call. */
__attribute__((format(printf, 2, 3)))
static void rc_error(struct kv_rc *rc, const char *fmt, ...)
{
	va_list ap;

	if (rc->err[0])
		return;
	va_start(ap, fmt);
	vsnprintf(rc->err, sizeof(rc->err), fmt, ap);
	va_end(ap);
}

/* Whether fault point p fires now. */
static int rc_fault(struct kv_rc *rc, enum kv_rc_fault p)
{
	if (!rc->fault[p].armed)
		return 0;
	if (rc->fault[p].skip) {
		rc->fault[p].skip--;
		return 0;
	}
	if (rc->fault[p].count != UINT_MAX && --rc->fault[p].count == 0)
		rc->fault[p].armed = 0;
	return 1;
}

void kv_rc_fault(struct kv_rc *rc, enum kv_rc_fault point, unsigned skip, unsigned count)
{
	if (!rc || point >= KV_RC_FAULT_N)
		return;
	rc->fault[point].skip = skip;
	rc->fault[point].count = count;
	rc->fault[point].armed = count != 0;
}

/* ---- strings and the value pool ---- */

static size_t rc_pool_cap(size_t need)
{
	return (need + RC_POOL_MIN - 1) / RC_POOL_MIN * RC_POOL_MIN;
}

/* need bytes behind a header, from the pool when one of that class is
 * there; NULL when malloc fails. */
static char *rc_str_alloc(struct kv_rc *rc, size_t need)
{
	size_t cap = need >= RC_POOL_MIN ? rc_pool_cap(need) : need;
	union rc_vhdr *h;
	unsigned i;

	if (rc && need >= RC_POOL_MIN)
		for (i = 0; i < RC_POOL_CLASSES; i++) {
			struct rc_pool_class *c = &rc->pool.c[i];

			if (c->cap != cap || !c->head)
				continue;
			h = c->head;
			c->head = h->h.next;
			c->used = ++rc->pool.tick;
			rc->pool.bytes -= cap;
			rc->st.pool_hits++;
			return (char *)(h + 1);
		}
	if (cap > SIZE_MAX - sizeof(*h) || !(h = malloc(sizeof(*h) + cap)))
		return NULL;
	h->h.cap = cap;
	if (rc && need >= RC_POOL_MIN)
		rc->st.pool_misses++;
	return (char *)(h + 1);
}

static void rc_str_free(void *p)
{
	if (p)
		free((union rc_vhdr *)p - 1);
}

static void rc_pool_drop(struct kv_rc *rc, struct rc_pool_class *c)
{
	while (c->head) {
		union rc_vhdr *h = c->head;

		c->head = h->h.next;
		rc->pool.bytes -= c->cap;
		free(h);
	}
	c->cap = 0;
}

/* Keeps p for a later value, or frees it when the pool is full. */
static void rc_str_give(struct kv_rc *rc, void *p)
{
	struct rc_pool_class *c = NULL, *spare = NULL;
	union rc_vhdr *h;
	size_t cap;
	unsigned i;

	if (!p)
		return;
	h = (union rc_vhdr *)p - 1;
	cap = h->h.cap;
	if (cap < RC_POOL_MIN || rc->pool.bytes > rc->lim.pool_max ||
	    cap > rc->lim.pool_max - rc->pool.bytes) {
		free(h);
		return;
	}
	for (i = 0; i < RC_POOL_CLASSES; i++) {
		struct rc_pool_class *x = &rc->pool.c[i];

		if (x->cap == cap) {
			c = x;
			break;
		}
		/* An unused class, else the one used longest ago. */
		if (!spare || (spare->cap && (!x->cap || x->used < spare->used)))
			spare = x;
	}
	if (!c) {
		c = spare;
		rc_pool_drop(rc, c);
		c->cap = cap;
	}
	h->h.next = c->head;
	c->head = h;
	c->used = ++rc->pool.tick;
	rc->pool.bytes += cap;
}

/* ---- replies ---- */

static void rc_reply_free(void *p)
{
	struct rc_reply *r = p;
	size_t i;

	if (!r)
		return;
	if (r->type == REDIS_REPLY_ARRAY && r->element) {
		for (i = 0; i < r->len; i++)
			rc_reply_free(r->element[i]);
		free(r->element);
	}
	rc_str_free(r->str);
	free(r);
}

/* Counts extra bytes against the reply being read; 0 when they fit. */
static int rc_reply_charge(const redisReadTask *task, size_t extra)
{
	struct rc_node *node = task->privdata;
	size_t cap = node->rc->lim.max_value + RC_REPLY_SLACK;

	if (!task->parent)
		node->budget = 0;  /* a new reply */
	if (extra > cap || node->budget > cap - extra)
		return -1;
	node->budget += extra;
	return 0;
}

/* Hooks r into its parent array, if any. The reader only gives an index
 * below the count the parent was created with. */
static void *rc_reply_link(const redisReadTask *task, struct rc_reply *r)
{
	if (task->parent) {
		struct rc_reply *parent = task->parent->obj;

		kv_assert(parent->type == REDIS_REPLY_ARRAY && (size_t)task->idx < parent->len);
		parent->element[task->idx] = r;
	}
	return r;
}

/* The caller's destination for the next reply node reads, when it is a
 * GET's value and kv_rc_get_into() gave one for that key; else NULL. The
 * reply answers node->recv, as rc_reply() sees it: not AUTH's, not
 * ASKING's, not one to a command not sent. */
static const struct kv_rc_dst *rc_reply_dst(const struct rc_node *node)
{
	const struct rc_call *call = node->rc->call;
	const struct rc_op *op = node->recv;

	if (!call || call->kind != RC_GET || !call->dst || node->auth_pending || !op ||
	    op == node->send || (op->asking && !op->asking_seen))
		return NULL;
	return call->dst[op->idx].nparts ? &call->dst[op->idx] : NULL;
}

/* Writes len bytes at str into d's parts, in order, when they fit. */
static int rc_dst_write(const struct kv_rc_dst *d, const char *str, size_t len)
{
	size_t cap = 0;
	unsigned i;

	for (i = 0; i < d->nparts; i++)
		cap += d->part[i].len;
	if (len > cap)
		return RC_DST_TOOLONG;
	for (i = 0; i < d->nparts && len; i++) {
		size_t k = len < d->part[i].len ? len : d->part[i].len;

		memcpy(d->part[i].p, str, k);
		str += k;
		len -= k;
	}
	return RC_DST_WRITTEN;
}

static void *rc_reply_string(const redisReadTask *task, char *str, size_t len)
{
	const struct kv_rc_dst *d = NULL;
	struct rc_reply *r;

	if (rc_reply_charge(task, sizeof(*r) + len + 1))
		return NULL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	if (!task->parent && task->type == REDIS_REPLY_STRING)
		d = rc_reply_dst(task->privdata);
	if (d) {
		/* Straight from the reader's buffer to where the caller wants
		 * it; never past the destination's end. */
		r->dst = rc_dst_write(d, str, len);
		r->len = len;
		r->type = task->type;
		return rc_reply_link(task, r);
	}
	r->str = rc_str_alloc(((struct rc_node *)task->privdata)->rc, len + 1);
	if (!r->str) {
		free(r);
		return NULL;
	}
	memcpy(r->str, str, len);
	r->str[len] = 0;
	r->len = len;
	r->type = task->type;  /* STRING, STATUS or ERROR */
	return rc_reply_link(task, r);
}

static void *rc_reply_array(const redisReadTask *task, int elements)
{
	struct rc_reply *r;

	if (elements < 0 ||
	    rc_reply_charge(task, sizeof(*r) + (size_t)elements * sizeof(r->element[0])))
		return NULL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	if (elements > 0) {
		r->element = calloc((size_t)elements, sizeof(r->element[0]));
		if (!r->element) {
			free(r);
			return NULL;
		}
	}
	r->type = REDIS_REPLY_ARRAY;
	r->len = (size_t)elements;
	return rc_reply_link(task, r);
}

static void *rc_reply_integer(const redisReadTask *task, long long v)
{
	struct rc_reply *r;

	if (rc_reply_charge(task, sizeof(*r)))
		return NULL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	r->type = REDIS_REPLY_INTEGER;
	r->integer = v;
	return rc_reply_link(task, r);
}

static void *rc_reply_nil(const redisReadTask *task)
{
	struct rc_reply *r;

	if (rc_reply_charge(task, sizeof(*r)))
		return NULL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return NULL;
	/* *-1 is not $-1: no GET answers with it. */
	r->type = task->type == REDIS_REPLY_ARRAY ? RC_REPLY_NIL_ARRAY : REDIS_REPLY_NIL;
	return rc_reply_link(task, r);
}

static redisReplyObjectFunctions rc_reply_fns = {
	.createString = rc_reply_string,
	.createArray = rc_reply_array,
	.createInteger = rc_reply_integer,
	.createNil = rc_reply_nil,
	.freeObject = rc_reply_free,
};

/* ---- nodes ---- */

static void rc_node_close(struct rc_node *node)
{
	if (node->c)
		redisFree(node->c);
	node->c = NULL;
	node->state = RC_DOWN;
	node->direct.d = NULL;
	node->next = node->ext_cur = 0;
	node->ext_off = node->obuf_off = node->ext_left = 0;
}

static void rc_node_free(struct rc_node *node)
{
	if (!node)
		return;
	rc_node_close(node);
	free(node->host);
	free(node);
}

/* Links node to its entry in rc's shared backoff table, made if new (no
 * table, a full one or no memory: it stays unshared). */
static void rc_sh_attach(struct kv_rc *rc, struct rc_node *node)
{
	struct rc_shared *t = rc->shared;
	struct rc_shnode *e;
	size_t len;

	if (!t || node->sh)
		return;
	len = strlen(node->host);
	pthread_mutex_lock(&t->mu);
	for (e = t->head; e; e = e->next)
		if (e->port == node->port && !strcmp(e->host, node->host))
			break;
	if (!e && t->n < RC_SHARED_MAX && (e = calloc(1, sizeof(*e) + len + 1))) {
		e->port = node->port;
		memcpy(e->host, node->host, len + 1);
		e->next = t->head;
		t->head = e;
		t->n++;
	}
	pthread_mutex_unlock(&t->mu);
	node->sh = e;
}

static void rc_shared_put(struct rc_shared *t)
{
	if (!t || atomic_fetch_sub(&t->refs, 1) != 1)
		return;
	while (t->head) {
		struct rc_shnode *e = t->head;

		t->head = e->next;
		free(e);
	}
	pthread_mutex_destroy(&t->mu);
	free(t);
}

/* The node host:port (host len bytes, not NUL-terminated), added if new.
 * NULL when the table is full or memory is short. */
static struct rc_node *rc_node_get(struct kv_rc *rc, const char *host, size_t len, int port)
{
	struct rc_node *node;
	unsigned i;

	for (i = 0; i < rc->nnodes; i++) {
		node = rc->nodes[i];
		if (node->port == port && strlen(node->host) == len && !memcmp(node->host, host, len))
			return node;
	}
	if (rc->nnodes >= rc->lim.max_nodes)
		return NULL;
	if (rc->nnodes == rc->cap) {
		unsigned cap = rc->cap ? rc->cap * 2 : 16;
		struct rc_node **nodes, **active;
		struct pollfd *pfd;

		nodes = realloc(rc->nodes, cap * sizeof(*nodes));
		if (!nodes)
			return NULL;
		rc->nodes = nodes;
		active = realloc(rc->active, cap * sizeof(*active));
		if (!active)
			return NULL;
		rc->active = active;
		pfd = realloc(rc->pfd, (cap + 1) * sizeof(*pfd));
		if (!pfd)
			return NULL;
		rc->pfd = pfd;
		rc->cap = cap;
	}
	node = calloc(1, sizeof(*node));
	if (!node)
		return NULL;
	node->host = strndup(host, len);
	if (!node->host) {
		free(node);
		return NULL;
	}
	node->port = port;
	node->rc = rc;
	rc_sh_attach(rc, node);
	rc->nodes[rc->nnodes++] = node;
	return node;
}

/* Parses "host:port" or "[host]:port" (len bytes). Returns 0 with *host,
 * *hlen, *port, or -EINVAL. An empty host is allowed (redirects use it for
 * "the node that answered"). */
static int rc_parse_addr(const char *s, size_t len, const char **host, size_t *hlen, int *port)
{
	const char *colon = NULL;
	size_t i;
	long p = 0;

	for (i = len; i > 0; i--) {
		if (s[i - 1] == ':') {
			colon = s + i - 1;
			break;
		}
	}
	if (!colon || colon == s + len - 1 || len - (size_t)(colon - s) - 1 > 5)
		return -EINVAL;
	for (i = (size_t)(colon - s) + 1; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -EINVAL;
		p = p * 10 + (s[i] - '0');
	}
	if (p < 1 || p > 65535)
		return -EINVAL;
	*host = s;
	*hlen = (size_t)(colon - s);
	if (*hlen >= 2 && s[0] == '[' && s[*hlen - 1] == ']') {
		*host = s + 1;
		*hlen -= 2;
	}
	if (*hlen > RC_HOST_MAX || memchr(*host, 0, *hlen))
		return -EINVAL;
	*port = (int)p;
	return 0;
}

/* Whether the reader holds bytes or a reply begun: a connection that is
 * owed nothing must have neither. (A reader that ran out of bytes between
 * two replies has ridx 0 with a task of no type yet; one that has read a
 * reply's type byte or an array header has not.) */
static int rc_leftover(const redisContext *c)
{
	const redisReader *r = c->reader;

	return r->pos != r->len || r->reply || (r->ridx >= 0 && r->rstack[0].type >= 0);
}

/* What must hold between calls (the header's state drawing). */
__attribute__((unused))
static int rc_check(const struct kv_rc *rc)
{
	unsigned i;

	if (rc->nnodes > rc->lim.max_nodes || rc->nnodes > rc->cap)
		return 0;
	for (i = 0; i < rc->nnodes; i++) {
		const struct rc_node *node = rc->nodes[i];

		if ((node->c != NULL) != (node->state != RC_DOWN) || node->state == RC_CONNECTING)
			return 0;
		if (node->head || node->send || node->recv || node->auth_pending)
			return 0;
		if (node->state == RC_UP && (sdslen(node->c->obuf) || node->next || node->direct.d ||
					     rc_leftover(node->c)))
			return 0;
	}
	return 1;
}

/* ---- one exchange with many nodes ---- */

/* Starts or lengthens the node's backoff (node->why says why), in the
 * shared table too: a node another client sharing it has just backed off
 * takes that backoff as it is (one failure seen twice is not two). */
static void rc_backoff(struct kv_rc *rc, struct rc_node *node)
{
	struct rc_shnode *e = node->sh;
	uint64_t now = now_ns();
	unsigned b = node->backoff_ms;

	if (e) {
		pthread_mutex_lock(&rc->shared->mu);
		if (e->retry_at > now) {
			node->backoff_ms = e->backoff_ms;
			node->retry_at = e->retry_at;
			pthread_mutex_unlock(&rc->shared->mu);
			return;
		}
		if (e->backoff_ms > b)
			b = e->backoff_ms;
	}
	b = b ? (b >= rc->lim.backoff_max_ms / 2 ? rc->lim.backoff_max_ms : b * 2)
	      : rc->lim.backoff_min_ms;
	node->backoff_ms = b;
	node->retry_at = now + ms_ns(b);
	if (e) {
		e->backoff_ms = b;
		e->retry_at = node->retry_at;
		memcpy(e->why, node->why, sizeof(e->why));
		pthread_mutex_unlock(&rc->shared->mu);
	}
}

/* Whether the node is in backoff at now: its own, or one another client
 * sharing its table started since (issue 36's fix, per node: a node one
 * reader found slow costs the others nothing while it lasts). A node taken
 * over so is closed (no backoff of its own counted: it failed nothing
 * here). Only between exchanges, or before the node joins one. */
static int rc_in_backoff(struct kv_rc *rc, struct rc_node *node, uint64_t now)
{
	struct rc_shnode *e = node->sh;
	int adopt = 0;

	if (e) {
		pthread_mutex_lock(&rc->shared->mu);
		if (e->retry_at > now && e->retry_at > node->retry_at) {
			node->backoff_ms = e->backoff_ms;
			node->retry_at = e->retry_at;
			memcpy(node->why, e->why, sizeof(node->why));
			adopt = 1;
		}
		pthread_mutex_unlock(&rc->shared->mu);
		if (adopt && node->state != RC_DOWN)
			rc_node_close(node);
	}
	return node->state == RC_DOWN && node->backoff_ms && now < node->retry_at;
}

/* A round with the node succeeded: its backoff is over, and the shared one
 * unless another client started it after this round began. */
static void rc_backoff_reset(struct kv_rc *rc, struct rc_node *node)
{
	struct rc_shnode *e = node->sh;

	node->backoff_ms = 0;
	if (e) {
		pthread_mutex_lock(&rc->shared->mu);
		if (e->backoff_ms && e->retry_at <= node->round_start + ms_ns(e->backoff_ms)) {
			e->backoff_ms = 0;
			e->retry_at = 0;
		}
		pthread_mutex_unlock(&rc->shared->mu);
	}
}

static void rc_op_fail(struct rc_op *op)
{
	op->status = KV_RC_ERROR;
	op->again = 0;
}

/* Gives the node up for this call: closes the connection, starts (or
 * lengthens) its backoff, errs every op still owed a reply and asks for a
 * new slot map. */
__attribute__((format(printf, 3, 4)))
static void rc_node_fail(struct kv_rc *rc, struct rc_node *node, const char *fmt, ...)
{
	struct rc_op *op;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(node->why, sizeof(node->why), fmt, ap);
	va_end(ap);
	rc_error(rc, "%s:%d: %s", node->host, node->port, node->why);
	if (node->state == RC_CONNECTING)
		rc->st.connect_failures++;
	rc_node_close(node);
	rc_backoff(rc, node);
	for (op = node->recv; op; op = op->next)
		rc_op_fail(op);
	node->send = node->recv = NULL;
	node->auth_pending = 0;
	rc->refresh_due = 1;
}

static void rc_connect(struct kv_rc *rc, struct rc_node *node);

/* A connection kept from an earlier call turned out closed before it
 * answered anything of this one (the server restarted, or closed it while
 * idle): opens it again, once, at once, and sends everything again.
 * Returns 1 if it did, 0 where the failure is to count. */
static int rc_node_retry(struct kv_rc *rc, struct rc_node *node)
{
	struct rc_op *op;

	if (!node->reused || node->retried || node->replies)
		return 0;
	rc_node_close(node);
	node->retried = 1;
	node->reused = 0;
	node->send = node->recv = node->head;
	for (op = node->head; op; op = op->next)
		op->asking_seen = 0;
	node->auth_pending = 0;
	rc_connect(rc, node);
	return 1;
}

/* Starts a non-blocking connect. On failure the node is failed. */
static void rc_connect(struct kv_rc *rc, struct rc_node *node)
{
	redisContext *c;

	kv_assert(node->state == RC_DOWN);
	node->state = RC_CONNECTING;  /* so that a failure counts as one to connect */
	if (rc_fault(rc, KV_RC_FAULT_CONNECT)) {
		rc_node_fail(rc, node, "connect: %s (fault injected)", strerror(ECONNREFUSED));
		return;
	}
	c = redisConnectNonBlock(node->host, node->port);
	if (!c || c->err) {
		rc_node_fail(rc, node, "connect: %s", c ? c->errstr : "out of memory");
		if (c)
			redisFree(c);
		return;
	}
	/* Swap the reader's object functions before it has read anything. */
	c->reader->fn = &rc_reply_fns;
	c->reader->privdata = node;
	node->c = c;
	node->deadline = now_ns() + ms_ns(rc->lim.timeout_ms);
}

/* The connect finished: checks how. */
static void rc_connected(struct kv_rc *rc, struct rc_node *node)
{
	int err = 0;
	socklen_t len = sizeof(err);

	if (getsockopt(node->c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
		err = errno;
	if (err) {
		rc_node_fail(rc, node, "connect: %s", strerror(err));
		return;
	}
	node->state = RC_UP;
	if (node->ever_up)
		rc->st.reconnects++;
	node->ever_up = 1;
	node->deadline = now_ns() + ms_ns(rc->lim.timeout_ms);
	if (rc->password) {
		const char *argv[3] = { "AUTH", rc->user, rc->password };
		size_t lens[3] = { 4, rc->user ? strlen(rc->user) : 0, strlen(rc->password) };
		int argc = 3;

		if (!rc->user) {
			argv[1] = rc->password;
			lens[1] = lens[2];
			argc = 2;
		}
		if (redisAppendCommandArgv(node->c, argc, argv, lens) != REDIS_OK) {
			rc_node_fail(rc, node, "out of memory");
			return;
		}
		node->auth_pending = 1;
	}
}

/* Bytes of the node's output not sent yet: obuf's and the values' sent
 * from where they are. */
static size_t rc_out_left(const struct rc_node *node)
{
	return sdslen(node->c->obuf) - node->obuf_off + node->ext_left;
}

/* Writes c, n in decimal and CRLF at w; returns the end (at most 23 bytes). */
static char *rc_put_len(char *w, char c, size_t n)
{
	char d[20];
	int k = 0;

	do {
		d[k++] = (char)('0' + n % 10);
		n /= 10;
	} while (n);
	*w++ = c;
	while (k)
		*w++ = d[--k];
	*w++ = '\r';
	*w++ = '\n';
	return w;
}

/* Sets sds s's length to len (within its room) and its NUL: sdsIncrLen()
 * takes an int. */
static void rc_sds_setlen(sds s, size_t len)
{
	size_t cur = sdslen(s);

	while (len - cur > INT_MAX) {
		sdsIncrLen(s, INT_MAX);
		cur += INT_MAX;
	}
	sdsIncrLen(s, (int)(len - cur));
}

/* Appends a command to the node's output buffer, formatted in place: one
 * copy of each argument, no buffer per command (hiredis' AppendCommandArgv
 * formats into a malloc'd command, then copies that into the buffer).
 * Argument ext (-1: none) is in parts (vp; NULL: argv[ext] is its one
 * part), and each part of RC_EXT_MIN bytes or more, while the node has room
 * for one, is not copied at all: rc_write() sends it from where it is,
 * which the caller keeps until the call returns (kv_rc_set()'s values,
 * kv_rc_set_parts()'s parts: the tier's G2 slots). */
static int rc_append_argv(struct rc_node *node, int argc, const char **argv, const size_t *lens,
			  int ext, const struct kv_rc_dst *vp)
{
	struct kv_rc_dst one = { .nparts = 1 };
	size_t total = 0;
	char *base, *w;
	sds o;
	int i;

	if (ext >= 0 && !vp) {
		one.part[0].p = (void *)argv[ext];
		one.part[0].len = lens[ext];
		vp = &one;
	}
	for (i = 0; i < argc; i++) {
		size_t l = i == ext ? 0 : lens[i];

		if (i == ext) {
			/* Only the parts that will be copied (as below). */
			for (unsigned k = 0, free_ext = RC_EXT_MAX - node->next; k < vp->nparts; k++) {
				if (vp->part[k].len >= RC_EXT_MIN && free_ext) {
					free_ext--;
					continue;
				}
				if (vp->part[k].len > SIZE_MAX / 2 - l)
					return -ENOMEM;
				l += vp->part[k].len;
			}
		}
		if (l > SIZE_MAX / 2 - total)
			return -ENOMEM;
		total += l + 32;
	}
	if (!(o = sdsMakeRoomFor(node->c->obuf, total + 16)))
		return -ENOMEM;
	node->c->obuf = o;
	/* Written where the room was made, the lengths in decimal by hand,
	 * then the length set once (issue 38: snprintf() per argument and an
	 * sdscatlen() per piece were a tenth of the write thread's own time
	 * in kvg4rate's 16 KiB writes). */
	base = o;
	w = o + sdslen(o);
	w = rc_put_len(w, '*', (size_t)argc);
	for (i = 0; i < argc; i++) {
		w = rc_put_len(w, '$', lens[i]);
		if (i != ext) {
			memcpy(w, argv[i], lens[i]);
			w += lens[i];
		} else {
			for (unsigned k = 0; k < vp->nparts; k++) {
				const char *p = vp->part[k].p;
				size_t l = vp->part[k].len;

				if (!l)
					continue;
				if (l < RC_EXT_MIN || node->next >= RC_EXT_MAX) {
					memcpy(w, p, l);
					w += l;
					continue;
				}
				node->ext[node->next].at = (size_t)(w - base);
				node->ext[node->next].p = p;
				node->ext[node->next++].len = l;
				node->ext_left += l;
			}
		}
		*w++ = '\r';
		*w++ = '\n';
	}
	rc_sds_setlen(o, (size_t)(w - base));
	return 0;
}

/* The bytes of a value in parts. */
static size_t rc_parts_len(const struct kv_rc_dst *d)
{
	size_t len = 0;

	for (unsigned k = 0; k < d->nparts; k++)
		len += d->part[k].len;
	return len;
}

/* Appends op's command(s) to the node's output buffer. */
static int rc_append(struct kv_rc *rc, struct rc_node *node, struct rc_op *op)
{
	const struct rc_call *call = rc->call;
	const char *argv[5];
	size_t lens[5];
	char range[24];
	int argc = 2;

	if (op->asking && redisAppendCommand(node->c, "ASKING") != REDIS_OK)
		return -ENOMEM;
	switch (call->kind) {
	case RC_GET:
	case RC_DEL:
		argv[0] = call->kind == RC_GET ? "GET" : "DEL";
		lens[0] = 3;
		if (call->kind == RC_GET && rc->lim.get_max) {
			/* GETRANGE key 0 get_max: a long value costs get_max + 1 bytes */
			argv[0] = "GETRANGE";
			lens[0] = 8;
			argv[2] = "0";
			lens[2] = 1;
			snprintf(range, sizeof(range), "%zu", rc->lim.get_max);
			argv[3] = range;
			lens[3] = strlen(range);
			argc = 4;
		}
		break;
	case RC_SET:
		argv[0] = "SET";
		lens[0] = 3;
		if (call->parts) {
			argv[2] = "";
			lens[2] = rc_parts_len(&call->parts[op->idx]);
		} else {
			argv[2] = call->vals[op->idx].data ? call->vals[op->idx].data : "";
			lens[2] = call->vals[op->idx].len;
		}
		argc = 3;
		if (call->ttl[0]) {
			argv[3] = "EX";
			lens[3] = 2;
			argv[4] = call->ttl;
			lens[4] = strlen(call->ttl);
			argc = 5;
		}
		break;
	default:
		argv[0] = "CLUSTER";
		lens[0] = 7;
		argv[1] = "SLOTS";
		lens[1] = 5;
		break;
	}
	if (call->kind != RC_SLOTS) {
		argv[1] = call->keys[op->idx].data ? call->keys[op->idx].data : "";
		lens[1] = call->keys[op->idx].len;
	}
	return rc_append_argv(node, argc, argv, lens, call->kind == RC_SET ? 2 : -1,
			      call->kind == RC_SET && call->parts ? &call->parts[op->idx] : NULL);
}

/* Appends commands while the output buffer has room, and room for one
 * more value sent from where it is: those cost no memory here, so a batch
 * of large SETs goes out RC_EXT_MAX values to a sendmsg(), not what
 * RC_OBUF_HIGH would hold. */
static void rc_fill(struct kv_rc *rc, struct rc_node *node)
{
	while (node->send && sdslen(node->c->obuf) - node->obuf_off < RC_OBUF_HIGH &&
	       node->next < RC_EXT_MAX) {
		if (rc_append(rc, node, node->send)) {
			rc_node_fail(rc, node, "out of memory");
			return;
		}
		node->send = node->send->next;
	}
}

/* Sends what it can of the node's output in one sendmsg(): obuf's bytes
 * and the values sent from where they are, in order. */
static void rc_write(struct kv_rc *rc, struct rc_node *node)
{
	sds obuf = node->c->obuf;
	int fault = rc_fault(rc, KV_RC_FAULT_WRITE);
	struct iovec iov[2 * RC_EXT_MAX + 1];
	struct msghdr msg = { .msg_iov = iov };
	size_t off = node->obuf_off, left;
	unsigned e, k = 0;
	ssize_t n;

	for (e = node->ext_cur; e < node->next; e++) {
		size_t skip = e == node->ext_cur ? node->ext_off : 0;

		if (node->ext[e].at > off)
			iov[k++] = (struct iovec){ obuf + off, node->ext[e].at - off };
		off = node->ext[e].at;
		iov[k++] = (struct iovec){ (void *)(node->ext[e].p + skip), node->ext[e].len - skip };
	}
	if (sdslen(obuf) > off)
		iov[k++] = (struct iovec){ obuf + off, sdslen(obuf) - off };
	msg.msg_iovlen = k;
	n = fault ? (errno = ECONNRESET, -1) : sendmsg(node->c->fd, &msg, MSG_NOSIGNAL);
	if (n < 0) {
		if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
		    !rc_node_retry(rc, node))
			rc_node_fail(rc, node, "send: %s%s", strerror(errno),
				     fault ? " (fault injected)" : "");
		return;
	}
	rc->st.bytes_out += (uint64_t)n;
	node->moved += (uint64_t)n;
	/* Forward over what went: obuf never past the next value's place
	 * until that value is out. */
	for (left = (size_t)n; left;) {
		size_t step;

		if (node->ext_cur < node->next && node->obuf_off == node->ext[node->ext_cur].at) {
			step = node->ext[node->ext_cur].len - node->ext_off;
			step = step < left ? step : left;
			node->ext_off += step;
			node->ext_left -= step;
			if (node->ext_off == node->ext[node->ext_cur].len) {
				node->ext_cur++;
				node->ext_off = 0;
			}
		} else {
			step = node->ext_cur < node->next
				? node->ext[node->ext_cur].at - node->obuf_off
				: sdslen(obuf) - node->obuf_off;
			step = step < left ? step : left;
			node->obuf_off += step;
		}
		left -= step;
	}
	if (node->ext_cur) {
		/* The values out make room for more (rc_fill()). */
		memmove(node->ext, node->ext + node->ext_cur,
			(node->next - node->ext_cur) * sizeof(node->ext[0]));
		node->next -= node->ext_cur;
		node->ext_cur = 0;
	}
	if (node->obuf_off == sdslen(obuf) && !node->next) {
		sdsclear(obuf);   /* all out: no move, the allocation stays */
		node->obuf_off = 0;
	} else if (node->obuf_off >= RC_OBUF_HIGH) {
		/* What was sent goes (headers, mostly: the values are not here). */
		sdsrange(obuf, (int)node->obuf_off, -1);
		for (e = node->ext_cur; e < node->next; e++)
			node->ext[e].at -= node->obuf_off;
		node->obuf_off = 0;
	}
	node->deadline = now_ns() + ms_ns(rc->lim.timeout_ms);
}

/* An error reply to op: follows MOVED and ASK, else errs the op. */
static void rc_error_reply(struct kv_rc *rc, struct rc_node *node, struct rc_op *op,
			   const struct rc_reply *r)
{
	int moved = !strncmp(r->str, "MOVED ", 6), ask = !strncmp(r->str, "ASK ", 4);
	const char *p, *host;
	struct rc_node *to;
	size_t hlen;
	char *end;
	long slot;
	int port;

	if ((!moved && !ask) || rc->call->kind == RC_SLOTS)
		goto err;
	p = r->str + (moved ? 6 : 4);
	errno = 0;
	slot = strtol(p, &end, 10);
	if (errno || end == p || *end != ' ' || slot != op->slot)
		goto err;
	p = end + 1;
	if (rc_parse_addr(p, r->len - (size_t)(p - r->str), &host, &hlen, &port))
		goto err;
	if (hlen == 0) {  /* the endpoint is the node that answered */
		host = node->host;
		hlen = strlen(node->host);
	}
	to = rc_node_get(rc, host, hlen, port);
	if (!to) {
		rc_error(rc, "%s:%d: %.*s: no room for another node (max_nodes %u)", node->host,
			 node->port, (int)(r->len > 100 ? 100 : r->len), r->str, rc->lim.max_nodes);
		rc_op_fail(op);
		return;
	}
	if (op->redirects >= rc->lim.max_redirects) {
		rc_error(rc, "%s:%d: %.*s: more than %u redirects", node->host, node->port,
			 (int)(r->len > 100 ? 100 : r->len), r->str, rc->lim.max_redirects);
		rc_op_fail(op);
		return;
	}
	op->redirects++;
	op->node = to;
	op->again = 1;
	op->asking = (uint8_t)ask;
	if (moved) {
		rc->owner[slot] = to;
		rc->refresh_due = 1;
		rc->st.redirects_moved++;
	} else {
		rc->st.redirects_ask++;
	}
	return;
err:
	rc_error(rc, "%s:%d: %.*s", node->host, node->port, (int)(r->len > 160 ? 160 : r->len),
		 r->str);
	rc_op_fail(op);
}

/* Hands reply r (consumed) to what it answers. */
static void rc_reply(struct kv_rc *rc, struct rc_node *node, struct rc_reply *r)
{
	struct rc_op *op = node->recv;
	int kind = rc->call->kind;

	node->replies++;
	if (node->auth_pending) {
		node->auth_pending = 0;
		if (r->type != REDIS_REPLY_STATUS) {
			/* Counted as a connection that did not come up. */
			rc->st.connect_failures++;
			rc_node_fail(rc, node, "AUTH refused: %.100s",
				     r->type == REDIS_REPLY_ERROR ? r->str : "(not a status reply)");
		}
		goto out;
	}
	if (!op || op == node->send) {
		rc_node_fail(rc, node, "a reply to no command");
		goto out;
	}
	if (op->asking && !op->asking_seen) {
		/* Whatever ASKING got, the command's own reply decides. */
		op->asking_seen = 1;
		goto out;
	}
	node->recv = op->next;
	op->again = 0;
	if (r->type == REDIS_REPLY_ERROR) {
		rc_error_reply(rc, node, op, r);
		goto out;
	}
	op->status = KV_RC_ERROR;
	switch (kind) {
	case RC_GET:
		if (r->type == REDIS_REPLY_STRING && !r->len && rc->lim.get_max) {
			op->status = KV_RC_MISS;   /* GETRANGE of a missing key: "" */
		} else if (r->type == REDIS_REPLY_STRING && r->dst == RC_DST_TOOLONG) {
			op->status = KV_RC_TOOLONG;
			op->len = r->len;
		} else if (r->type == REDIS_REPLY_STRING) {
			op->status = KV_RC_HIT;
			op->data = r->str;
			op->len = r->len;
			r->str = NULL;
			/* Final (an answered key is not asked again): the caller
			 * may look at the value while its bytes are in cache. */
			if (r->dst == RC_DST_WRITTEN && rc->call->on_value)
				rc->call->on_value(rc->call->arg, op->idx, r->len);
		} else if (r->type == REDIS_REPLY_NIL) {
			op->status = KV_RC_MISS;
		}
		break;
	case RC_SET:
		if (r->type == REDIS_REPLY_STATUS && r->len == 2 && !memcmp(r->str, "OK", 2))
			op->status = KV_RC_OK;
		break;
	case RC_DEL:
		if (r->type == REDIS_REPLY_INTEGER && (r->integer == 0 || r->integer == 1))
			op->status = r->integer ? KV_RC_OK : KV_RC_MISS;
		break;
	default:
		op->status = KV_RC_OK;
		op->data = r;
		r = NULL;
		break;
	}
	if (op->status == KV_RC_ERROR)
		rc_error(rc, "%s:%d: a reply of the wrong kind (%s)", node->host, node->port,
			 rc_type_name(r->type));
out:
	rc_reply_free(r);
}

/* Bytes of d's parts from offset off on, as iovecs (at most
 * KV_RC_DST_PARTS), up to len bytes in all; returns how many. */
static unsigned rc_dst_iov(const struct kv_rc_dst *d, size_t off, size_t len, struct iovec *iov)
{
	unsigned i, k = 0;

	for (i = 0; i < d->nparts && len; i++) {
		size_t pl = d->part[i].len, m;

		if (off >= pl) {
			off -= pl;
			continue;
		}
		m = pl - off < len ? pl - off : len;
		iov[k++] = (struct iovec){ (char *)d->part[i].p + off, m };
		len -= m;
		off = 0;
	}
	return k;
}

/* After the reader ran out of bytes: when what it holds is the start of a
 * GET's value that has a destination, and whose length fits it, the bytes
 * of it already read are copied there, the reader is emptied, and the rest
 * of the value will be read from the socket straight into the destination
 * (rc_read()), not through the reader's buffer (one copy a value less, and
 * none from the reader's buffer to the slot). Anything else, a value too
 * long or a length that is not plain digits included, is left to the
 * reader, whose rules (and rc_read()'s bound on what it holds) apply as
 * before. */
static void rc_direct_start(struct rc_node *node)
{
	redisReader *r = node->c->reader;
	const struct kv_rc_dst *d;
	const char *p = r->buf + r->pos, *e;
	size_t have = r->len - r->pos, len = 0, cap = 0, hdr, got;
	struct iovec iov[KV_RC_DST_PARTS];
	unsigned i, k;

	if (r->err || r->reply || r->ridx != 0 || r->rstack[0].type != REDIS_REPLY_STRING ||
	    !(d = rc_reply_dst(node)))
		return;
	/* The reader has taken the '$': the length and its CRLF follow. */
	e = memchr(p, '\r', have < 21 ? have : 21);
	if (!e || e == p || (size_t)(e - p) + 2 > have || e[1] != '\n')
		return;
	for (const char *q = p; q < e; q++) {
		if (*q < '0' || *q > '9' || len > (SIZE_MAX - 9) / 10)
			return;
		len = len * 10 + (size_t)(*q - '0');
	}
	for (i = 0; i < d->nparts; i++)
		cap += d->part[i].len;
	hdr = (size_t)(e - p) + 2;
	/* Not empty (a GETRANGE's miss), not longer than the destination, not
	 * more than a reply may take, and not all here (then the reader has
	 * it). */
	if (!len || len > cap || len > node->rc->lim.max_value || have - hdr >= len + 2)
		return;
	got = have - hdr < len ? have - hdr : len;
	k = rc_dst_iov(d, 0, got, iov);
	p += hdr;
	for (i = 0; i < k; i++) {
		memcpy(iov[i].iov_base, p, iov[i].iov_len);
		p += iov[i].iov_len;
	}
	/* One byte of the CRLF may be here already. */
	node->direct.crlf_got = (unsigned)(have - hdr - got);
	if (node->direct.crlf_got)
		node->direct.crlf[0] = *p;
	node->direct.d = d;
	node->direct.len = len;
	node->direct.got = got;
	/* The reader starts afresh: it holds nothing of this reply now. */
	sdsclear(r->buf);
	r->pos = r->len = 0;
	r->ridx = -1;
}

/* n bytes came into the direct value's iovecs (and, past them, into the
 * reader's buffer: not counted here); returns how many were the value's
 * (its payload and CRLF). Hands the value's reply on once it is whole. */
static size_t rc_direct_take(struct kv_rc *rc, struct rc_node *node, size_t n)
{
	size_t took = 0, m;
	struct rc_reply *r;

	m = node->direct.len - node->direct.got;
	m = m < n ? m : n;
	node->direct.got += m;
	took += m;
	n -= m;
	m = 2 - node->direct.crlf_got;
	m = m < n ? m : n;
	node->direct.crlf_got += (unsigned)m;
	took += m;
	if (node->direct.crlf_got < 2)
		return took;
	if (memcmp(node->direct.crlf, "\r\n", 2)) {
		rc_node_fail(rc, node, "reply: a value not followed by CRLF");
		return took;
	}
	if (!(r = calloc(1, sizeof(*r)))) {
		rc_node_fail(rc, node, "out of memory");
		return took;
	}
	r->type = REDIS_REPLY_STRING;
	r->len = node->direct.len;
	r->dst = RC_DST_WRITTEN;
	node->direct.d = NULL;
	rc_reply(rc, node, r);
	return took;
}

/* Takes the whole GET values the reader holds next, each with a
 * destination that fits it, without the reader: copied into the
 * destination (the one copy), the reader's position moved past them.
 * hiredis' redisReaderGetReply() moves the unread rest of its buffer to
 * the front after every reply once 1 KiB of it is consumed (sdsrange()),
 * so a read that held several 16 KiB values moved each one's successors
 * again, about as many bytes as the values themselves (issue 38, fifth
 * pass: half of the read threads' memmove); the buffer is now moved once a
 * read, by the next redisReaderGetReply(). Only a length of plain digits,
 * not 0 (a GETRANGE's miss), within the destination and max_value, with the
 * whole value and its CRLF here, is taken here; anything else is the
 * reader's, with its rules, as before. A value not followed by CRLF fails
 * the node, as in rc_direct_take(). */
static void rc_fast(struct kv_rc *rc, struct rc_node *node)
{
	redisReader *r = node->c->reader;

	while (node->state == RC_UP && !r->err && !r->reply &&
	       (r->ridx == -1 || (r->ridx == 0 && r->rstack[0].type == -1))) {
		const char *p = r->buf + r->pos, *e;
		size_t have = r->len - r->pos, len = 0, cap = 0, hdr;
		const struct kv_rc_dst *d;
		struct rc_reply *rep;
		int digits = 1;

		if (have < 4 || p[0] != '$' || !(d = rc_reply_dst(node)))
			return;
		e = memchr(p + 1, '\r', have - 1 < 21 ? have - 1 : 21);
		if (!e || e == p + 1 || (size_t)(e - p) + 2 > have || e[1] != '\n')
			return;
		for (const char *q = p + 1; q < e && digits; q++) {
			if (*q < '0' || *q > '9' || len > (SIZE_MAX - 9) / 10)
				digits = 0;
			else
				len = len * 10 + (size_t)(*q - '0');
		}
		for (unsigned i = 0; i < d->nparts; i++)
			cap += d->part[i].len;
		hdr = (size_t)(e - p) + 2;
		if (!digits || !len || len > cap || len > rc->lim.max_value || have - hdr < len + 2)
			return;
		if (p[hdr + len] != '\r' || p[hdr + len + 1] != '\n') {
			rc_node_fail(rc, node, "reply: a value not followed by CRLF");
			return;
		}
		if (!(rep = calloc(1, sizeof(*rep)))) {
			rc_node_fail(rc, node, "out of memory");
			return;
		}
		rep->type = REDIS_REPLY_STRING;
		rep->len = len;
		rep->dst = rc_dst_write(d, p + hdr, len);
		r->pos += hdr + len + 2;
		rc_reply(rc, node, rep);
	}
}

/* Hands on every whole reply the reader holds, then lets a value begun
 * be read straight into its destination. */
static void rc_parse(struct kv_rc *rc, struct rc_node *node)
{
	redisReader *reader = node->c->reader;
	void *r;

	while (node->state == RC_UP) {
		rc_fast(rc, node);
		if (node->state != RC_UP)
			return;
		r = NULL;
		if (redisReaderGetReply(reader, &r) != REDIS_OK) {
			rc_node_fail(rc, node, "reply: %s", reader->errstr);
			return;
		}
		if (!r)
			break;
		rc_reply(rc, node, r);
	}
	if (node->state == RC_UP)
		rc_direct_start(node);
}

/* Reads what the node sent: into the rest of a value being read straight
 * into its destination, if one is, and on into the reader's own buffer
 * (no copy through a buffer of ours: hiredis' redisReaderFeed() would copy
 * it in). */
static void rc_read(struct kv_rc *rc, struct rc_node *node)
{
	int fault = rc_fault(rc, KV_RC_FAULT_READ);
	redisReader *reader = node->c->reader;
	struct iovec iov[KV_RC_DST_PARTS + 2];
	unsigned k = 0;
	ssize_t n;
	sds b;

	if (reader->err) {
		rc_node_fail(rc, node, "reply: %s", reader->errstr);
		return;
	}
	/* hiredis frees an empty buffer over maxbuf at the next feed: keep
	 * one that holds the largest value a call allows. */
	reader->maxbuf = RC_READER_KEEP + 2 * (rc->lim.get_max ? rc->lim.get_max : 0);
	if (reader->len == 0 && sdsavail(reader->buf) > reader->maxbuf) {
		sdsfree(reader->buf);
		reader->buf = sdsempty();
		reader->pos = 0;
	}
	if (!reader->buf || !(b = sdsMakeRoomFor(reader->buf, RC_READ_CHUNK))) {
		rc_node_fail(rc, node, "out of memory");
		return;
	}
	reader->buf = b;
	if (node->direct.d) {
		k = rc_dst_iov(node->direct.d, node->direct.got,
			       node->direct.len - node->direct.got, iov);
		if (node->direct.crlf_got < 2)
			iov[k++] = (struct iovec){ node->direct.crlf + node->direct.crlf_got,
						   2 - node->direct.crlf_got };
	}
	iov[k++] = (struct iovec){ b + sdslen(b), RC_READ_CHUNK };
	n = fault ? (errno = ECONNRESET, -1) : readv(node->c->fd, iov, (int)k);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return;
	if (n <= 0) {
		if (!rc_node_retry(rc, node))
			rc_node_fail(rc, node, "read: %s%s", n ? strerror(errno) : "connection closed",
				     fault ? " (fault injected)" : "");
		return;
	}
	rc->st.bytes_in += (uint64_t)n;
	node->moved += (uint64_t)n;
	node->deadline = now_ns() + ms_ns(rc->lim.timeout_ms);
	if (node->direct.d) {
		n -= (ssize_t)rc_direct_take(rc, node, (size_t)n);
		if (node->state != RC_UP)
			return;
	}
	if (n) {
		sdsIncrLen(reader->buf, (int)n);
		reader->len = sdslen(reader->buf);
	}
	rc_parse(rc, node);
	if (node->state == RC_UP &&
	    reader->len - reader->pos > rc->lim.max_value + (size_t)RC_REPLY_SLACK)
		rc_node_fail(rc, node, "a reply larger than max_value (%zu bytes)", rc->lim.max_value);
}

/* Whether a connection kept from an earlier call is still open and quiet:
 * a server sends nothing unasked, so bytes waiting mean it is out of step. */
static int rc_idle_ok(const struct rc_node *node)
{
	char b;
	ssize_t n = recv(node->c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);

	return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

/* The node's rate deadline (see the top: round start + timeout_ms + bytes
 * moved / min_rate); UINT64_MAX without a floor. */
static uint64_t rc_rate_deadline(const struct kv_rc *rc, const struct rc_node *node)
{
	uint64_t r = rc->lim.min_rate, m = node->moved, extra;

	if (!r)
		return UINT64_MAX;
	extra = m / r * 1000000000u + m % r * 1000000000u / r;
	return node->round_start + ms_ns(rc->lim.timeout_ms) + extra;
}

/* Gives up, for this call only, a node that owes replies but did nothing
 * wrong (another node's slot map won): closed, no backoff. */
static void rc_node_drop(struct rc_node *node)
{
	struct rc_op *op;

	rc_node_close(node);
	for (op = node->recv; op; op = op->next)
		rc_op_fail(op);
	node->send = node->recv = NULL;
	node->auth_pending = 0;
}

static int rc_map_won(struct kv_rc *rc);

/* Drives every node that has ops queued until each has its replies or has
 * failed, or the call's deadline passed, or the call was cancelled. */
static void rc_exchange(struct kv_rc *rc)
{
	unsigned i, na = 0;
	uint64_t now = now_ns();
	int late = now >= rc->call_deadline || atomic_load(&rc->cancelled);

	for (i = 0; i < rc->nnodes; i++) {
		struct rc_node *node = rc->nodes[i];

		if (!node->head)
			continue;
		node->send = node->recv = node->head;
		node->replies = 0;
		node->retried = 0;
		if (late) {
			/* Nothing more is sent once the call is over. */
			for (struct rc_op *op = node->head; op; op = op->next)
				rc_op_fail(op);
			node->send = node->recv = NULL;
			continue;
		}
		if (node->state == RC_UP && !rc_idle_ok(node))
			rc_node_close(node);  /* closed or out of step: a new one, no backoff */
		if (rc_in_backoff(rc, node, now)) {
			rc_error(rc, "%s:%d: down, next try in %llu ms (%s)", node->host,
				 node->port,
				 (unsigned long long)((node->retry_at - now) / 1000000u),
				 node->why);
			for (struct rc_op *op = node->head; op; op = op->next)
				rc_op_fail(op);
			node->send = node->recv = NULL;
			rc->refresh_due = 1;
			continue;
		}
		node->reused = node->state == RC_UP;
		if (node->state == RC_DOWN) {
			rc_connect(rc, node);
			if (node->state == RC_DOWN)
				continue;
		}
		node->deadline = now + ms_ns(rc->lim.timeout_ms);
		node->round_start = now;
		node->moved = 0;
		rc->st.rounds++;
		rc->active[na++] = node;
	}
	if (late)
		rc_error(rc, "%s", atomic_load(&rc->cancelled) ? "cancelled"
			 : "the call's deadline passed before this round");

	while (na) {
		uint64_t first = rc->call_deadline;
		unsigned j, k;
		int ms, rv, over;

		now = now_ns();
		for (j = 0; j < na; j++) {
			struct rc_node *node = rc->active[j];
			uint64_t rd;

			if (node->state == RC_UP)
				rc_fill(rc, node);
			if (node->state == RC_DOWN) {
				rc->pfd[j].fd = -1;
				continue;
			}
			rc->pfd[j].fd = node->c->fd;
			rc->pfd[j].events = node->state == RC_CONNECTING ? POLLOUT :
				POLLIN | (rc_out_left(node) ? POLLOUT : 0);
			rc->pfd[j].revents = 0;
			if (node->deadline < first)
				first = node->deadline;
			if ((rd = rc_rate_deadline(rc, node)) < first)
				first = rd;
		}
		/* Drop the nodes that are done or failed. */
		for (j = k = 0; j < na; j++) {
			struct rc_node *node = rc->active[j];

			if (node->state == RC_DOWN)
				continue;
			rc->active[k] = node;
			rc->pfd[k++] = rc->pfd[j];
		}
		na = k;
		if (!na)
			break;
		rc->pfd[na].fd = rc->cfd;
		rc->pfd[na].events = POLLIN;
		rc->pfd[na].revents = 0;
		if (first == UINT64_MAX)
			ms = -1;
		else if (first <= now)
			ms = 0;
		else
			ms = first - now > (uint64_t)INT_MAX * 1000000u ? INT_MAX
				: (int)((first - now + 999999u) / 1000000u);
		rv = poll(rc->pfd, na + 1, ms);
		if (rv < 0 && errno != EINTR) {
			for (j = 0; j < na; j++)
				rc_node_fail(rc, rc->active[j], "poll: %s", strerror(errno));
			break;
		}
		if (atomic_load(&rc->cancelled)) {
			for (j = 0; j < na; j++)
				rc_node_drop(rc->active[j]);
			rc_error(rc, "cancelled");
			break;
		}
		for (j = 0; rv > 0 && j < na; j++) {
			struct rc_node *node = rc->active[j];
			short ev = rc->pfd[j].revents;

			if (!ev)
				continue;
			if (node->state == RC_CONNECTING) {
				rc_connected(rc, node);
				continue;
			}
			if ((ev & POLLOUT) && rc_out_left(node))
				rc_write(rc, node);
			if (node->state == RC_UP && (ev & (POLLIN | POLLHUP | POLLERR)))
				rc_read(rc, node);
		}
		/* A slot map that checks out ends the fetch: the rest are not
		 * waited for. */
		if (rc->call->kind == RC_SLOTS && rc_map_won(rc)) {
			for (j = 0; j < na; j++)
				if (rc->active[j]->state != RC_DOWN && rc->active[j]->recv)
					rc_node_drop(rc->active[j]);
		}
		/* Timed out: silent through a poll() that waited until its
		 * deadline (not merely past it: time this thread spent on other
		 * nodes, or off the CPU, is not the node's silence); or below
		 * the rate floor with nothing more from it in this poll(); or
		 * the call's deadline passed. */
		now = now_ns();
		over = now >= rc->call_deadline;
		for (j = 0; rv >= 0 && j < na; j++) {
			struct rc_node *node = rc->active[j];
			uint64_t rd;

			if (node->state == RC_DOWN)
				continue;
			if (!rc->pfd[j].revents && now >= node->deadline)
				rc_node_fail(rc, node, node->state == RC_CONNECTING ?
					     "connect: timed out after %u ms" :
					     "no reply within %u ms", rc->lim.timeout_ms);
			else if (!rc->pfd[j].revents && now >= (rd = rc_rate_deadline(rc, node)))
				rc_node_fail(rc, node, "too slow: %llu bytes in %llu ms, under "
					     "min_rate %zu bytes/s after %u ms",
					     (unsigned long long)node->moved,
					     (unsigned long long)((now - node->round_start) / 1000000u),
					     rc->lim.min_rate, rc->lim.timeout_ms);
			else if (over)
				rc_node_fail(rc, node, "the call's deadline (%u ms) passed",
					     rc->lim.call_ms);
		}
		/* Done: every reply in. */
		for (j = k = 0; j < na; j++) {
			struct rc_node *node = rc->active[j];

			if (node->state == RC_UP && !node->recv && !node->auth_pending) {
				rc_backoff_reset(rc, node);
				if (rc_leftover(node->c))
					rc_node_close(node);  /* more than was asked for */
				continue;
			}
			rc->active[k++] = node;
		}
		na = k;
	}
}

/* Queues op on node for the next exchange. */
static void rc_queue(struct rc_node *node, struct rc_op *op)
{
	op->next = NULL;
	op->asking_seen = 0;
	op->status = KV_RC_ERROR;  /* until answered */
	if (node->tail)
		node->tail->next = op;
	else
		node->head = op;
	node->tail = op;
}

static void rc_unqueue_all(struct kv_rc *rc)
{
	unsigned i;

	for (i = 0; i < rc->nnodes; i++) {
		struct rc_node *node = rc->nodes[i];

		node->head = node->tail = node->send = node->recv = NULL;
		node->auth_pending = 0;
	}
}

/* ---- the slot map ---- */

/* Parses a CLUSTER SLOTS reply from node into rc->scratch. Returns the
 * number of slots covered, or -1 with the reason in why (nothing of the
 * reply is trusted then). */
static int rc_parse_slots(struct kv_rc *rc, struct rc_node *node, const struct rc_reply *r,
			  char *why, size_t whylen)
{
	struct rc_node *last = NULL;
	size_t i;
	int covered = 0;

	memset(rc->scratch, 0, sizeof(rc->scratch));
	if (r->type != REDIS_REPLY_ARRAY) {
		snprintf(why, whylen, "%s, not an array", rc_type_name(r->type));
		return -1;
	}
	for (i = 0; i < r->len; i++) {
		const struct rc_reply *e = r->element[i], *m, *h, *p;
		const char *host;
		size_t hlen;
		long long s, start, end;

		if (!e || e->type != REDIS_REPLY_ARRAY || e->len < 3 ||
		    e->element[0]->type != REDIS_REPLY_INTEGER ||
		    e->element[1]->type != REDIS_REPLY_INTEGER ||
		    e->element[2]->type != REDIS_REPLY_ARRAY || e->element[2]->len < 2) {
			snprintf(why, whylen, "entry %zu: not [start, end, [host, port, ...], ...]", i);
			return -1;
		}
		start = e->element[0]->integer;
		end = e->element[1]->integer;
		m = e->element[2];
		h = m->element[0];
		p = m->element[1];
		if (start < 0 || end >= KV_RC_SLOTS || start > end) {
			snprintf(why, whylen, "entry %zu: bad slot range %lld-%lld", i, start, end);
			return -1;
		}
		if (h->type != REDIS_REPLY_STRING || h->len > RC_HOST_MAX ||
		    memchr(h->str, 0, h->len) || p->type != REDIS_REPLY_INTEGER ||
		    p->integer < 1 || p->integer > 65535) {
			snprintf(why, whylen, "entry %zu: bad host or port", i);
			return -1;
		}
		if (h->len == 1 && h->str[0] == '?')
			continue;  /* endpoint unknown (Redis 7): those slots stay unknown */
		host = h->len ? h->str : node->host;
		hlen = h->len ? h->len : strlen(node->host);
		if (!last || last->port != p->integer || strlen(last->host) != hlen ||
		    memcmp(last->host, host, hlen))
			last = rc_node_get(rc, host, hlen, (int)p->integer);
		if (!last) {
			snprintf(why, whylen, "entry %zu: more nodes than max_nodes (%u)", i,
				 rc->lim.max_nodes);
			return -1;
		}
		for (s = start; s <= end; s++) {
			if (!rc->scratch[s])
				covered++;
			rc->scratch[s] = last;
		}
	}
	if (!covered)
		snprintf(why, whylen, "no slot covered");
	return covered;
}

/* Drops the nodes the map no longer names (seeds stay). Only between
 * exchanges: no op points at a node then. */
static void rc_gc_nodes(struct kv_rc *rc)
{
	unsigned i, k;

	for (i = 0; i < rc->nnodes; i++)
		rc->nodes[i]->mark = 0;
	for (i = 0; i < KV_RC_SLOTS; i++)
		if (rc->owner[i])
			rc->owner[i]->mark = 1;
	rc->nmasters = 0;
	for (i = k = 0; i < rc->nnodes; i++) {
		struct rc_node *node = rc->nodes[i];

		rc->nmasters += node->mark;
		if (node->mark || node->seed)
			rc->nodes[k++] = node;
		else
			rc_node_free(node);
	}
	rc->nnodes = k;
}

/* During a slot-map fetch: loads the first answer that checks out, once.
 * Returns whether one is loaded. Answers that do not check out are freed
 * as they are looked at, with the reason as the call's error. */
static int rc_map_won(struct kv_rc *rc)
{
	char why[96];

	if (rc->map_won)
		return 1;
	for (unsigned i = 0; i < rc->map_n; i++) {
		struct rc_op *op = &rc->map_ops[i];
		struct rc_reply *r = op->data;
		int covered;

		if (op->status != KV_RC_OK || !r)
			continue;
		covered = rc_parse_slots(rc, op->node, r, why, sizeof(why));
		rc_reply_free(r);
		op->data = NULL;
		if (covered <= 0) {
			rc_error(rc, "%s:%d: CLUSTER SLOTS: %s", op->node->host, op->node->port, why);
			continue;
		}
		memcpy(rc->owner, rc->scratch, sizeof(rc->owner));
		rc->have_map = 1;
		rc->refresh_due = 0;
		rc->st.refreshes++;
		rc->map_won = 1;
		return 1;
	}
	return 0;
}

/* Loads a slot map when one is due: CLUSTER SLOTS to up to
 * RC_REFRESH_FANOUT nodes not in backoff (the connected first, taken in
 * turns), the first that gives a valid map wins, and the others are not
 * waited for (a node that drips its map holds nothing while another
 * answers). */
static void rc_refresh(struct kv_rc *rc)
{
	struct rc_op ops[RC_REFRESH_FANOUT];
	struct rc_call call = { .kind = RC_SLOTS };
	struct rc_call *saved = rc->call;
	uint64_t now = now_ns();
	unsigned i, n = 0, pass, start;

	if (rc->have_map && (!rc->refresh_due || now - rc->last_refresh < ms_ns(rc->lim.refresh_min_ms)))
		return;
	if (!rc->nnodes)
		return;
	rc->last_refresh = now;
	start = rc->refresh_rr++ % rc->nnodes;
	memset(ops, 0, sizeof(ops));
	for (pass = 0; pass < 2 && n < RC_REFRESH_FANOUT; pass++) {
		for (i = 0; i < rc->nnodes && n < RC_REFRESH_FANOUT; i++) {
			struct rc_node *node = rc->nodes[(start + i) % rc->nnodes];

			if ((pass == 0) != (node->state == RC_UP) || node->head)
				continue;
			if (rc_in_backoff(rc, node, now))
				continue;
			ops[n].idx = n;
			ops[n].node = node;
			rc_queue(node, &ops[n]);
			n++;
		}
	}
	if (!n) {
		rc_error(rc, "no node to ask for the slot map: all %u in backoff", rc->nnodes);
		return;
	}
	rc->call = &call;
	rc->map_ops = ops;
	rc->map_n = n;
	rc->map_won = 0;
	rc_exchange(rc);
	rc_unqueue_all(rc);
	rc_map_won(rc);   /* the last answers in, if none won yet */
	for (i = 0; i < n; i++) {
		rc_reply_free(ops[i].data);
		ops[i].data = NULL;
	}
	rc->call = saved;
	rc->map_ops = NULL;
	rc->map_n = 0;
	if (rc->map_won)
		rc_gc_nodes(rc);
}

/* ---- calls ---- */

static int rc_run(struct kv_rc *rc, struct rc_call *call, size_t n, struct rc_op **opsp)
{
	struct rc_op *ops;
	unsigned round;
	size_t i;

	if (n > INT_MAX || (n && !call->keys))
		return -EINVAL;
	if (!n) {
		*opsp = NULL;
		return 0;
	}
	for (i = 0; i < n; i++)
		if (!call->keys[i].data && call->keys[i].len)
			return -EINVAL;
	ops = calloc(n, sizeof(*ops));
	if (!ops)
		return -ENOMEM;
	kv_assert(rc_check(rc));
	rc->err[0] = 0;
	rc->call_deadline = rc->lim.call_ms ? now_ns() + ms_ns(rc->lim.call_ms) : UINT64_MAX;
	if (atomic_load(&rc->cancelled))
		rc->call_deadline = 0;   /* every key an error, nothing sent */
	else
		rc_refresh(rc);
	rc->call = call;
	for (i = 0; i < n; i++) {
		ops[i].idx = i;
		ops[i].slot = (uint16_t)kv_rc_keyslot(call->keys[i].data, call->keys[i].len);
		ops[i].again = 1;
		ops[i].status = KV_RC_ERROR;
		size_t vlen = call->kind != RC_SET ? 0
			      : call->parts ? rc_parts_len(&call->parts[i]) : call->vals[i].len;

		if (call->kind == RC_SET && vlen > rc->lim.max_value) {
			rc_error(rc, "a value of %zu bytes: more than max_value", vlen);
			ops[i].again = 0;
		}
	}
	for (round = 0; round <= rc->lim.max_redirects; round++) {
		int queued = 0;

		for (i = 0; i < n; i++) {
			struct rc_op *op = &ops[i];
			struct rc_node *node;

			if (!op->again)
				continue;
			node = op->node ? op->node : rc->owner[op->slot];
			if (!node) {
				rc_error(rc, "slot %u: no node known to serve it", op->slot);
				rc->refresh_due = 1;
				rc_op_fail(op);
				continue;
			}
			op->node = node;
			rc_queue(node, op);
			queued = 1;
		}
		if (!queued)
			break;
		rc_exchange(rc);
		rc_unqueue_all(rc);
	}
	if (rc->call_deadline == 0)
		rc_error(rc, "cancelled");
	for (i = 0; i < n; i++)
		if (ops[i].again)
			rc_op_fail(&ops[i]);  /* left over after the last round */
	rc->call = NULL;
	kv_assert(rc_check(rc));
	*opsp = ops;
	return 0;
}

int kv_rc_get_into(struct kv_rc *rc, size_t n, const struct kv_rc_key *keys,
		   const struct kv_rc_dst *dst, kv_rc_value_fn *on_value, void *arg,
		   struct kv_rc_val *out)
{
	struct rc_call call = { .kind = RC_GET, .keys = keys, .dst = dst, .on_value = on_value,
				.arg = arg };
	struct rc_op *ops;
	int hits = 0, rv;
	size_t i;

	if (!rc || (n && !out))
		return -EINVAL;
	for (i = 0; dst && i < n; i++) {
		if (dst[i].nparts > KV_RC_DST_PARTS)
			return -EINVAL;
		for (unsigned k = 0; k < dst[i].nparts; k++)
			if (!dst[i].part[k].p && dst[i].part[k].len)
				return -EINVAL;
	}
	rv = rc_run(rc, &call, n, &ops);
	if (rv)
		return rv;
	rc->st.keys_get += n;
	for (i = 0; i < n; i++) {
		int st = ops[i].status;

		out[i].status = st;
		out[i].data = st == KV_RC_HIT ? ops[i].data : NULL;
		out[i].len = st == KV_RC_HIT || st == KV_RC_TOOLONG ? ops[i].len : 0;
		if (st == KV_RC_HIT) {
			hits++;
			rc->st.hits++;
			rc->st.direct += dst && dst[i].nparts;
		} else if (st == KV_RC_TOOLONG) {
			rc->st.toolong++;
		} else if (st == KV_RC_MISS) {
			rc->st.misses++;
		} else {
			rc->st.errors++;
		}
	}
	free(ops);
	return hits;
}

int kv_rc_get(struct kv_rc *rc, size_t n, const struct kv_rc_key *keys, struct kv_rc_val *out)
{
	return kv_rc_get_into(rc, n, keys, NULL, NULL, NULL, out);
}

static int rc_set(struct kv_rc *rc, struct rc_call *call, size_t n, unsigned ttl_s,
		  int *status)
{
	struct rc_op *ops;
	int stored = 0, rv;
	size_t i;

	if (ttl_s)
		snprintf(call->ttl, sizeof(call->ttl), "%u", ttl_s);
	rv = rc_run(rc, call, n, &ops);
	if (rv)
		return rv;
	rc->st.keys_set += n;
	for (i = 0; i < n; i++) {
		status[i] = ops[i].status;
		if (ops[i].status == KV_RC_OK)
			stored++;
		else
			rc->st.errors++;
	}
	free(ops);
	return stored;
}

int kv_rc_set(struct kv_rc *rc, size_t n, const struct kv_rc_key *keys,
	      const struct kv_rc_val *vals, unsigned ttl_s, int *status)
{
	struct rc_call call = { .kind = RC_SET, .keys = keys, .vals = vals };

	if (!rc || (n && (!vals || !status)))
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (!vals[i].data && vals[i].len)
			return -EINVAL;
	return rc_set(rc, &call, n, ttl_s, status);
}

int kv_rc_set_parts(struct kv_rc *rc, size_t n, const struct kv_rc_key *keys,
		    const struct kv_rc_dst *vals, unsigned ttl_s, int *status)
{
	struct rc_call call = { .kind = RC_SET, .keys = keys, .parts = vals };

	if (!rc || (n && (!vals || !status)))
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		size_t len = 0;

		if (vals[i].nparts > KV_RC_DST_PARTS)
			return -EINVAL;
		for (unsigned k = 0; k < vals[i].nparts; k++) {
			if ((!vals[i].part[k].p && vals[i].part[k].len) ||
			    vals[i].part[k].len > SIZE_MAX / 8 - len)
				return -EINVAL;
			len += vals[i].part[k].len;
		}
	}
	return rc_set(rc, &call, n, ttl_s, status);
}

int kv_rc_del(struct kv_rc *rc, size_t n, const struct kv_rc_key *keys, int *status)
{
	struct rc_call call = { .kind = RC_DEL, .keys = keys };
	struct rc_op *ops;
	int deleted = 0, rv;
	size_t i;

	if (!rc || (n && !status))
		return -EINVAL;
	rv = rc_run(rc, &call, n, &ops);
	if (rv)
		return rv;
	for (i = 0; i < n; i++) {
		status[i] = ops[i].status;
		if (ops[i].status == KV_RC_OK)
			deleted++;
		else if (ops[i].status == KV_RC_ERROR)
			rc->st.errors++;
	}
	free(ops);
	return deleted;
}

void kv_rc_vals_release(struct kv_rc *rc, size_t n, struct kv_rc_val *v)
{
	size_t i;

	if (!rc) {
		kv_rc_vals_free(n, v);
		return;
	}
	for (i = 0; v && i < n; i++) {
		rc_str_give(rc, v[i].data);
		v[i].data = NULL;
		v[i].len = 0;
	}
}

void kv_rc_val_free(struct kv_rc_val *v)
{
	if (!v)
		return;
	rc_str_free(v->data);
	v->data = NULL;
	v->len = 0;
}

void kv_rc_vals_free(size_t n, struct kv_rc_val *v)
{
	size_t i;

	for (i = 0; v && i < n; i++)
		kv_rc_val_free(&v[i]);
}

/* ---- the handle ---- */

static const struct kv_rc_limits rc_defaults = {
	.timeout_ms = RC_DEFAULT_TIMEOUT_MS,
	.backoff_min_ms = 100,
	.backoff_max_ms = 5000,
	.max_redirects = 3,
	.refresh_min_ms = 100,
	.max_nodes = 1024,
	.max_value = 512u << 20,
	.pool_max = RC_POOL_DEFAULT,
	.min_rate = 1u << 20,
};

int kv_rc_set_limits(struct kv_rc *rc, const struct kv_rc_limits *l)
{
	if (!rc || !l || !l->timeout_ms || l->timeout_ms > 600000 || !l->backoff_min_ms ||
	    l->backoff_max_ms < l->backoff_min_ms || l->backoff_max_ms > 3600000 ||
	    l->max_redirects > 100 || l->refresh_min_ms > 3600000 || !l->max_nodes ||
	    l->max_nodes > RC_MAX_NODES_CAP || l->max_nodes < rc->nnodes || !l->max_value ||
	    l->max_value > RC_MAX_VALUE_CAP || (l->get_max && l->get_max >= l->max_value) ||
	    l->call_ms > 3600000)
		return -EINVAL;
	rc->lim = *l;
	for (unsigned i = 0; i < RC_POOL_CLASSES && rc->pool.bytes > rc->lim.pool_max; i++)
		rc_pool_drop(rc, &rc->pool.c[i]);
	return 0;
}

void kv_rc_get_limits(const struct kv_rc *rc, struct kv_rc_limits *l)
{
	*l = rc->lim;
}

int kv_rc_new(const char *seeds, const char *user, const char *password, unsigned timeout_ms,
	      struct kv_rc **out, char *err, size_t errlen)
{
	struct kv_rc *rc;
	const char *p, *end;
	int rv = -ENOMEM;

	if (err && errlen)
		err[0] = 0;
	if (!seeds || !out || timeout_ms > 600000) {
		if (err && errlen)
			snprintf(err, errlen, "%s", !seeds ? "no seeds" : "timeout_ms out of range");
		return -EINVAL;
	}
	rc = calloc(1, sizeof(*rc));
	if (!rc)
		return -ENOMEM;
	rc->lim = rc_defaults;
	rc->cfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (rc->cfd < 0) {
		rv = -errno;
		free(rc);
		return rv;
	}
	if (timeout_ms)
		rc->lim.timeout_ms = timeout_ms;
	if (password) {
		rc->password = strdup(password);
		if (!rc->password || (user && !(rc->user = strdup(user))))
			goto fail;
	}
	for (p = seeds; *p; p = *end ? end + 1 : end) {
		const char *host;
		struct rc_node *node;
		size_t len, hlen;
		int port;

		end = strchr(p, ',');
		if (!end)
			end = p + strlen(p);
		while (p < end && (*p == ' ' || *p == '\t'))
			p++;
		len = (size_t)(end - p);
		while (len && (p[len - 1] == ' ' || p[len - 1] == '\t'))
			len--;
		if (!len)
			continue;
		if (rc_parse_addr(p, len, &host, &hlen, &port) || !hlen) {
			if (err && errlen)
				snprintf(err, errlen, "bad seed \"%.*s\": want host:port", (int)len, p);
			rv = -EINVAL;
			goto fail;
		}
		node = rc_node_get(rc, host, hlen, port);
		if (!node) {
			if (rc->nnodes >= rc->lim.max_nodes) {
				if (err && errlen)
					snprintf(err, errlen, "more than %u seeds", rc->lim.max_nodes);
				rv = -EINVAL;
			}
			goto fail;
		}
		node->seed = 1;
	}
	if (!rc->nnodes) {
		if (err && errlen)
			snprintf(err, errlen, "no seeds in \"%.100s\"", seeds);
		rv = -EINVAL;
		goto fail;
	}
	*out = rc;
	return 0;
fail:
	kv_rc_free(rc);
	return rv;
}

void kv_rc_free(struct kv_rc *rc)
{
	unsigned i;

	if (!rc)
		return;
	for (i = 0; i < rc->nnodes; i++)
		rc_node_free(rc->nodes[i]);
	free(rc->nodes);
	free(rc->active);
	free(rc->pfd);
	for (i = 0; i < RC_POOL_CLASSES; i++)
		rc_pool_drop(rc, &rc->pool.c[i]);
	rc_shared_put(rc->shared);
	free(rc->user);
	close(rc->cfd);
	if (rc->password) {
		explicit_bzero(rc->password, strlen(rc->password));
		free(rc->password);
	}
	free(rc);
}

int kv_rc_share_backoff(struct kv_rc *rc, struct kv_rc *with)
{
	struct rc_shared *t;

	if (!rc || !with || rc == with || rc->shared)
		return -EINVAL;
	if (!(t = with->shared)) {
		if (!(t = calloc(1, sizeof(*t))))
			return -ENOMEM;
		if (pthread_mutex_init(&t->mu, NULL)) {
			free(t);
			return -ENOMEM;
		}
		atomic_init(&t->refs, 1);
		with->shared = t;
		for (unsigned i = 0; i < with->nnodes; i++)
			rc_sh_attach(with, with->nodes[i]);
	}
	atomic_fetch_add(&t->refs, 1);
	rc->shared = t;
	for (unsigned i = 0; i < rc->nnodes; i++)
		rc_sh_attach(rc, rc->nodes[i]);
	return 0;
}

void kv_rc_cancel(struct kv_rc *rc)
{
	uint64_t one = 1;

	if (!rc)
		return;
	atomic_store(&rc->cancelled, 1);
	if (write(rc->cfd, &one, sizeof(one)) < 0) {
		/* EAGAIN: the counter is full, so it is readable anyway */
	}
}

const char *kv_rc_last_error(const struct kv_rc *rc)
{
	return rc->err;
}

void kv_rc_stats(const struct kv_rc *rc, struct kv_rc_stats *st)
{
	*st = rc->st;
}

unsigned kv_rc_masters(const struct kv_rc *rc)
{
	return rc->nmasters;
}
