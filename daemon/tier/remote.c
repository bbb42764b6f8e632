/* G4: sealed blocks in a Redis Cluster that a fleet of nodes shares
 * (docs/g4.md). The cluster client (rcluster.h) runs on two threads of the
 * tier's own, each with its own connections: one reads (lookups wait on it),
 * one writes (so that write-back never delays a lookup). Both hand their
 * results to the loop through the disk tier's eventfd (G4 needs G3: blocks
 * are written to the cluster when they are written back to disk, from the
 * G2 slot the write-back holds busy).
 *
 * Key:   <prefix>:<namespace>:<layout id, hex>:<hash, hex>
 * Value: struct slot_hdr (as at the start of a G3 slot: magic, version,
 *        namespace, layout, hash, length, CRC32C of payload and header),
 *        then the payload, then, for a namespace with remote_key_file, an
 *        HMAC-SHA-256 tag of both (g4mac.h). A value that does not check
 *        out is a miss and a checksum (or auth) failure, never served (Redis
 *        replies carry no request id: a server that shifts its replies is
 *        caught here too).
 *
 * Bounds (issue 29): a read asks for GETRANGE key 0 N, N the length a
 * value of that pool has, so a longer value costs N + 1 bytes, is refused
 * (kvcached_g4_oversize_total) and never buffered whole; the client's
 * max_value is set just above it, so a server that sends more anyway loses
 * its connection. Fetches wait in per-namespace queues on the loop and go
 * to the read thread one at a time, namespaces taking turns, so one
 * tenant's fetches (at most FETCH_MAX values of one block each, or a node's
 * timeout; read-aheads included) delay another's by one fetch at most.
 *
 * Write: tier_writeback_start() asks remote_want() whether the block goes
 * to G4 too (G4 on, the namespace has remote = yes, the block did not come
 * from G4, room under remote_max_inflight: reserved then, and a value
 * buffer taken from the write pool); the write-back's checksum job, on the
 * tier's worker thread while the slot is busy, copies header and payload
 * into that buffer (remote_copy()); back on the loop the buffer joins the
 * pending writes, which go out as one batch per write job (pipelined to
 * every master at once), one job at a time per client, in the client's own
 * job (fixed arrays: nothing allocated per batch). A write made from a G2
 * slot (remote_put()) is copied on the loop and sealed on the worker.
 *
 * Write buffers (issue 28): a value's buffer goes back to the write pool
 * when its SET is answered (or the write is dropped), and the next write
 * of that length takes it, pages mapped, instead of a malloc() per value
 * that glibc hands back to the kernel at each free() (128 KiB or more is
 * an mmap() of its own). Classes of one exact length (a pool's values all
 * have one), at most WPOOL_CLASSES, the one used longest ago making room;
 * a buffer is kept only while the pool's idle bytes and the bytes reserved
 * in flight stay within remote_max_inflight, and a new one is made only
 * after idle ones of other lengths go to make that hold, so G4's write
 * buffers, in use or idle, never hold more than that. The pool is
 * the loop's alone: buffers are taken in remote_want() and given back in
 * write_done(), seal_done() and remote_queue(), all on the loop; the
 * worker and the write thread only fill and read the buffers they were
 * handed (the worker may free() one whose tag failed: it never reaches
 * the pool). The fault point g4_buf (fault.h) fails the taking: the write
 * is dropped and counted, as an allocation failure is.
 *
 * Read: a Lookup whose chain misses from block k on asks G4 for blocks
 * k..k+63, fewer where they would pass FETCH_BYTES of values
 * (kv_tiers_remote_fetch(): one job, one batched round). As the fetch
 * goes to the read thread, the loop reserves a free G2 slot per block
 * (fetch_reserve(): free room only, tblocks in FETCH), the read client
 * writes each value straight into its slot (kv_rc_get_into(): header at
 * the slot's start, payload at HDR_BYTES) and the read thread checks it
 * there as it lands; values without a slot (no free room, a tagged
 * namespace) come in the client's buffers and the loop copies them. On the
 * loop the leading run of good values becomes tier blocks with a G2 copy
 * (dirty: not on G3), the other reserved slots go back, and the parked
 * request runs again and promotes them the usual way. The waiter's
 * remote_mark then names the first block G4 did not give, so the rerun does
 * not ask again for what just missed. A cluster that is down costs a lookup
 * the client's timeout once, then nothing while its backoff lasts.
 *
 * Read-ahead: a lookup parked on the promotion of its chain's tier blocks,
 * whose chain then misses, asks for the next fetch's worth at once
 * (kv_tiers_remote_ahead(), from cache.c): the read thread fetches while the
 * loop and the copy thread promote, and the rerun finds the blocks in G2 or
 * waits on that fetch (kv_tiers_remote_fetch() adopts it). A lookup that
 * comes to wait on a fetch asks for the one after it at once too, so that
 * the read thread goes on without waiting for the loop. One per waiter at
 * a time (w->ahead, f->owner), queued as any fetch of its namespace, so the
 * turn-taking above holds as it is written. Until a waiter waits on it, its
 * blocks take G2 slots from free room or clean copies only
 * (slot_alloc_clean()): the dirty copies the last fetch brought for the same
 * lookup may still wait there for G1 room. A session that goes takes the
 * fetches of its namespace queued for no one with it
 * (kv_tiers_waiter_gone()).
 *
 * About 1,300 lines: the setup, the writes and the reads share struct kv_g4
 * and its queues, one concern (the tier); the stubs of a build without
 * hiredis are the last hundred. */
#include "tier_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <xxhash.h>

#include "crc32c.h"
#include "fault.h"
#include "g4mac.h"
#include "kvconfig.h"
#include "log.h"

#if KV_HAVE_HIREDIS
#include "rcluster.h"

#define FETCH_MAX 64          /* blocks one lookup asks G4 for */
/* ... and bytes of blocks (as stored: compressed or not): a fetch of large
 * blocks asks for fewer (at least one), so that what the read client buffers
 * for one fetch stays bounded whatever the block size, and a chain of large
 * blocks is several fetches, which the read-ahead overlaps with the
 * promotions (4 MiB: 64 blocks up to 64 KiB, 16 of 256 KiB, 2 of 2 MiB, 3 of
 * 2 MiB compressed; kvg4rate measured 1 to 16 MiB: 4 was the fastest,
 * docs/benchmarks.md). */
#define FETCH_BYTES (4u << 20)
#define WRITE_BATCH 256       /* writes one job sends */
#define KEY_MAX 200
#define WPOOL_CLASSES 8       /* value lengths the write pool keeps buffers of */

/* A write: from remote_want() to write_done(), the loop's, except while a
 * job holds it (the worker's seal job, the write thread's batch). */
struct g4_write {
	struct g4_write *next;
	struct kv_job job;        /* the seal job of a write made from G2 */
	struct kv_tiers *t;
	const uint8_t *mac_key;   /* for that job */
	uint32_t cl;              /* the client (user) it goes out with */
	char key[KEY_MAX];
	size_t keylen;
	uint8_t *buf;             /* header + payload [+ tag]: len bytes, from the write pool */
	size_t len;
};

struct g4_fetch {
	struct kv_job job;
	struct kv_tiers *t;
	struct g4_fetch *next;    /* in its namespace's queue */
	uint32_t ns;
	uint32_t cl;
	const uint8_t *mac_key;   /* the namespace's (g4mac.h); NULL: none */
	size_t vlen;              /* what each value's length must be */
	struct kv_pool *pool;     /* held */
	struct kv_list waiters;
	/* A read-ahead (kv_tiers_remote_ahead()): the lookup that asked for
	 * it while it has not come to wait on it (then it is in waiters) and
	 * has not gone; NULL otherwise. */
	struct kv_waiter *owner;
	uint8_t ahead;
	uint32_t n, good;         /* asked; leading values that checked out */
	uint64_t start_ns;
	struct slot_hdr want;     /* the header every value must carry, hash aside */
	uint8_t hash[FETCH_MAX][KV_HASH_BYTES];
	char key[FETCH_MAX][KEY_MAX];
	struct kv_rc_key keys[FETCH_MAX];
	struct kv_rc_val vals[FETCH_MAX];
	/* The G2 slots reserved for the values (fetch_reserve()): tblocks in
	 * FETCH (the loop's, never touched by the read thread), their slots'
	 * addresses and where the read thread's client writes each value
	 * (header, payload); NULL and nparts 0 where none is reserved. */
	struct tblock *res[FETCH_MAX];
	uint8_t *slot[FETCH_MAX];
	struct kv_rc_dst dst[FETCH_MAX];
	uint8_t chk[FETCH_MAX];   /* read thread: check_in_slot()'s answer + 1; 0: none yet */
	uint32_t bad_sum, bad_mac, oversize, errors, misses;
	struct kv_rc_stats rc;    /* the client's counters after this job */
};

/* A client's write job, one at a time: the loop's while its client's
 * writing is 0, the write thread's from kv_worker_submit() to write_done(). */
struct g4_wjob {
	struct kv_job job;
	struct kv_tiers *t;
	uint32_t cl;
	struct g4_write *list;
	uint32_t n, ok;
	struct kv_rc_stats rc;
	struct kv_rc_key keys[WRITE_BATCH];
	struct kv_rc_val vals[WRITE_BATCH];
	int status[WRITE_BATCH];
};

/* A user the cluster is talked to as: the daemon's (remote_user), or a
 * namespace's own ([namespace X] remote_user). Each has a client per
 * thread, and its writes go out in jobs of their own. */
struct g4_client {
	char ns[64];              /* "" for the daemon's */
	struct kv_rc *rd, *wr;    /* each used by its own thread only */
	struct g4_write *pending, **pending_tail;
	int writing;              /* wj is under way */
	struct g4_wjob *wj;       /* its write job, made at start */
	struct kv_rc_stats rd_st, wr_st;  /* the clients' last counters */
};

/* The write pool's buffers of one length (the loop's: see the top). An
 * idle buffer's first bytes link it to the next. */
struct g4_wclass {
	size_t len;               /* 0: unused */
	void *head;
	uint64_t used;            /* wpool_tick when last taken or given */
};

/* A namespace's HMAC key (remote_key_file), read at start, never changed:
 * the threads read it. */
struct g4_key {
	char ns[64];
	uint8_t key[KV_G4MAC_KEY_BYTES];
};

struct kv_g4 {
	struct g4_client cl[65];
	uint32_t ncl;
	struct g4_key keys[64];
	uint32_t nkeys;
	/* Fetches waiting for the read thread, per namespace id; one is there
	 * at a time (reading), the namespaces taking turns (fetch_next). */
	struct g4_fetch *fq[KV_MAX_NS + 1], **fq_tail[KV_MAX_NS + 1];
	uint32_t fq_last;         /* the namespace served last */
	uint32_t fq_waiting;
	int reading;
	struct g4_fetch *cur;     /* the one being read */
	struct kv_worker rw, ww;
	unsigned ttl_s;
	uint64_t max_inflight, inflight;  /* write bytes reserved, pending or under way */
	uint64_t tokens, tokens_ms;  /* remote_write_rate's bucket */
	int mode;                  /* remote_write: KV_G4W_* (ns.h), the daemon's */
	struct g4_wclass wpool[WPOOL_CLASSES];
	uint64_t wpool_bytes, wpool_tick;  /* idle bytes in it */
	struct kv_g4_stats st;
};

/* The client namespace ns talks to the cluster with. */
static uint32_t client_of(struct kv_tiers *t, uint32_t ns)
{
	const char *name = kv_pools_ns_name(t->ps, ns);

	for (uint32_t i = 1; i < t->g4->ncl; i++)
		if (!strcmp(t->g4->cl[i].ns, name))
			return i;
	return 0;
}

/* The HMAC key of namespace ns, or NULL. */
static const uint8_t *mac_key_of(struct kv_tiers *t, uint32_t ns)
{
	const char *name = kv_pools_ns_name(t->ps, ns);

	for (uint32_t i = 0; i < t->g4->nkeys; i++)
		if (!strcmp(t->g4->keys[i].ns, name))
			return t->g4->keys[i].key;
	return NULL;
}

/* The length of a value of pool p in the cluster. */
static size_t value_len(const struct kv_pool *p, const uint8_t *mac_key)
{
	return sizeof(struct slot_hdr) + kv_pool_stored_bytes(p) +
	       (mac_key ? KV_G4MAC_TAG_BYTES : 0);
}

static size_t key_of(struct kv_tiers *t, const struct kv_pool *p, const uint8_t *hash, char *key)
{
	int n = snprintf(key, KEY_MAX, "%s:%s:%016llx:", t->cfg.remote_prefix,
			 kv_pools_ns_name(t->ps, p->ns),
			 (unsigned long long)t->layout_id[p->id]);

	/* The hash in hex by hand: a fetch makes 64 keys on the loop, and
	 * snprintf() per byte was a tenth of the loop's time at 16 KiB. */
	for (int i = 0; i < KV_HASH_BYTES && n + 2 < KEY_MAX; i++) {
		key[n++] = "0123456789abcdef"[hash[i] >> 4];
		key[n++] = "0123456789abcdef"[hash[i] & 15];
	}
	key[n < KEY_MAX ? n : KEY_MAX - 1] = 0;
	return (size_t)n;
}

static int ns_remote(struct kv_tiers *t, const struct kv_pool *p)
{
	const struct kv_ns *m = kv_ns_get(kv_pools_nstab(t->ps), p->ns);

	return m && m->lim.remote;
}

/* ---- the write pool (loop only) ------------------------------------------ */

/* A buffer of len bytes for a G4 value: a kept one of that length, else a
 * new one; NULL when there is none (malloc, or the fault point g4_buf). */
static uint8_t *wbuf_get(struct kv_g4 *g, size_t len)
{
	if (kv_fault(KV_FAULT_G4_BUF))
		return NULL;
	for (unsigned i = 0; i < WPOOL_CLASSES; i++) {
		struct g4_wclass *c = &g->wpool[i];
		void *b = c->head;

		if (c->len != len || !b)
			continue;
		memcpy(&c->head, b, sizeof(void *));
		c->used = ++g->wpool_tick;
		g->wpool_bytes -= len;
		return b;
	}
	/* A new one: idle buffers of other lengths go first, those used
	 * longest ago, while they and the bytes in flight and this one would
	 * pass remote_max_inflight. */
	while (g->wpool_bytes && g->wpool_bytes + g->inflight + len > g->max_inflight) {
		struct g4_wclass *lru = NULL;
		void *b;

		for (unsigned i = 0; i < WPOOL_CLASSES; i++)
			if (g->wpool[i].head && (!lru || g->wpool[i].used < lru->used))
				lru = &g->wpool[i];
		b = lru->head;
		memcpy(&lru->head, b, sizeof(void *));
		g->wpool_bytes -= lru->len;
		free(b);
	}
	return malloc(len);
}

static void wclass_drop(struct kv_g4 *g, struct g4_wclass *c)
{
	while (c->head) {
		void *b = c->head;

		memcpy(&c->head, b, sizeof(void *));
		g->wpool_bytes -= c->len;
		free(b);
	}
	c->len = 0;
}

/* Gives back buf (len bytes, from wbuf_get(); NULL: nothing), once its
 * bytes no longer count in g->inflight: kept while the idle bytes and the
 * bytes in flight stay within remote_max_inflight, else freed. */
static void wbuf_put(struct kv_g4 *g, uint8_t *buf, size_t len)
{
	struct g4_wclass *c = NULL, *spare = NULL;

	if (!buf)
		return;
	if (g->wpool_bytes + g->inflight + len > g->max_inflight) {
		free(buf);
		return;
	}
	for (unsigned i = 0; i < WPOOL_CLASSES; i++) {
		struct g4_wclass *x = &g->wpool[i];

		if (x->len == len) {
			c = x;
			break;
		}
		/* An unused class, else the one used longest ago. */
		if (!spare || (spare->len && (!x->len || x->used < spare->used)))
			spare = x;
	}
	if (!c) {
		c = spare;
		wclass_drop(g, c);
		c->len = len;
	}
	memcpy(buf, &c->head, sizeof(void *));
	c->head = buf;
	c->used = ++g->wpool_tick;
	g->wpool_bytes += len;
	kv_assert(g->wpool_bytes + g->inflight <= g->max_inflight);
}

/* ---- setup -------------------------------------------------------------- */

static int read_password(const char *path, char *buf, size_t len, char *err, size_t errlen)
{
	FILE *f = fopen(path, "re");
	size_t n;

	if (!f) {
		snprintf(err, errlen, "remote_password_file %s: %s", path, strerror(errno));
		return -errno;
	}
	n = fread(buf, 1, len - 1, f);
	fclose(f);
	buf[n] = 0;
	while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		buf[--n] = 0;
	return 0;
}

/* Client i of G4: as user (NULL: none) with the password in file (NULL:
 * no AUTH). Returns 0 or -errno with err set. */
static int client_open(struct kv_tiers *t, uint32_t i, const char *ns, const char *user,
		       const char *file, char *err, size_t errlen)
{
	const struct kv_tiers_config *c = &t->cfg;
	struct g4_client *cl = &t->g4->cl[i];
	char pw[256] = "", e[256];
	int r;

	snprintf(cl->ns, sizeof(cl->ns), "%s", ns);
	cl->pending_tail = &cl->pending;
	if (!(cl->wj = calloc(1, sizeof(*cl->wj)))) {
		snprintf(err, errlen, "G4: out of memory");
		return -ENOMEM;
	}
	if (file && file[0] && (r = read_password(file, pw, sizeof(pw), err, errlen)) < 0)
		return r;
	r = kv_rc_new(c->remote_seeds, user && user[0] ? user : NULL, pw[0] ? pw : NULL,
		      (unsigned)c->remote_timeout_ms, &cl->rd, e, sizeof(e));
	if (r == 0)
		r = kv_rc_new(c->remote_seeds, user && user[0] ? user : NULL, pw[0] ? pw : NULL,
			      (unsigned)c->remote_timeout_ms, &cl->wr, e, sizeof(e));
	memset(pw, 0, sizeof(pw));
	if (r < 0)
		snprintf(err, errlen, "remote_seeds%s%s: %s", ns[0] ? ", namespace " : "", ns, e);
	return r;
}

/* t->g2_dropping: a copy only G2 holds is about to go. */
static void g2_dropping(struct kv_tiers *t, struct tblock *tb)
{
	tier_remote_put(t, tb, KV_G4W_WRITEBACK);
}

int tier_remote_open(struct kv_tiers *t, char *err, size_t errlen)
{
	const struct kv_tiers_config *c = &t->cfg;
	struct kv_g4 *g;
	int r;

	if (!c->remote_seeds[0])
		return 0;
	if (!(g = calloc(1, sizeof(*g))))
		return -ENOMEM;
	g->ttl_s = (unsigned)(c->remote_ttl_ms / 1000);
	g->max_inflight = c->remote_max_inflight;
	g->tokens = c->remote_write_rate;
	g->tokens_ms = kv_mono_ms();
	g->mode = !strcmp(c->remote_write, "off")      ? KV_G4W_OFF
		  : !strcmp(c->remote_write, "demote") ? KV_G4W_DEMOTE
						       : KV_G4W_WRITEBACK;
	t->g4 = g;
	t->g2_dropping = g2_dropping;
	/* Client 0 is the daemon's; then one per namespace with a user of
	 * its own. */
	g->ncl = 1;
	if ((r = client_open(t, 0, "", c->remote_user, c->remote_password_file, err, errlen)) < 0)
		return r;
	for (unsigned i = 0; i < c->nremote_users; i++, g->ncl++)
		if ((r = client_open(t, g->ncl, c->remote_users[i].ns, c->remote_users[i].user,
				     c->remote_users[i].password_file, err, errlen)) < 0)
			return r;
	for (unsigned i = 0; i < c->nremote_keys && i < 64; i++, g->nkeys++) {
		char e[384];

		snprintf(g->keys[i].ns, sizeof(g->keys[i].ns), "%s", c->remote_keys[i].ns);
		if ((r = kv_g4mac_load(c->remote_keys[i].key_file, g->keys[i].key, e, sizeof(e))) < 0) {
			snprintf(err, errlen, "[namespace %s] %s", c->remote_keys[i].ns, e);
			return r;
		}
	}
	/* Without G3 the threads' completions need an eventfd of their own
	 * (the loop watches kv_tiers_disk_fd()), and the tier's worker, which
	 * seals G4 writes made from G2, is started here. */
	if (!t->lv[L3].on) {
		t->disk.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (t->disk.efd < 0 || (r = kv_worker_start(&t->wk, t->disk.efd)) < 0) {
			r = t->disk.efd < 0 ? -errno : r;
			snprintf(err, errlen, "G4: eventfd or worker: %s", strerror(-r));
			return r;
		}
	}
	if ((r = kv_worker_start(&g->rw, t->disk.efd)) < 0 ||
	    (r = kv_worker_start(&g->ww, t->disk.efd)) < 0) {
		snprintf(err, errlen, "G4: cannot start its threads: %s", strerror(-r));
		return r;
	}
	kv_info("G4: Redis Cluster at %s, keys %s:*, ttl %us, %u namespace%s with a user of its "
		"own, %u with authenticated values", c->remote_seeds, c->remote_prefix, g->ttl_s,
		g->ncl - 1, g->ncl == 2 ? "" : "s", g->nkeys);
	return 0;
}

void tier_remote_close(struct kv_tiers *t)
{
	struct kv_g4 *g = t->g4;

	if (!g)
		return;
	/* Runs what is queued (reads and writes finish; their done()s see
	 * t->stopping and make nothing new). */
	kv_worker_stop(&g->rw);
	kv_worker_stop(&g->ww);
	for (uint32_t ns = 0; ns <= KV_MAX_NS; ns++)
		while (g->fq[ns]) {
			struct g4_fetch *f = g->fq[ns];

			g->fq[ns] = f->next;
			if (f->owner)
				f->owner->ahead = NULL;
			tier_wake_all(&f->waiters);
			kv_pool_put(f->pool);
			free(f);
		}
	explicit_bzero(g->keys, sizeof(g->keys));
	for (uint32_t i = 0; i < g->ncl; i++) {
		struct g4_client *cl = &g->cl[i];

		while (cl->pending) {
			struct g4_write *w = cl->pending;

			cl->pending = w->next;
			free(w->buf);
			free(w);
		}
		kv_rc_free(cl->rd);
		kv_rc_free(cl->wr);
		free(cl->wj);
	}
	for (unsigned i = 0; i < WPOOL_CLASSES; i++)
		wclass_drop(g, &g->wpool[i]);
	free(g);
	t->g4 = NULL;
	t->g2_dropping = NULL;
}

void tier_remote_reap(struct kv_tiers *t)
{
	if (t->g4) {
		kv_worker_reap(&t->g4->rw);
		kv_worker_reap(&t->g4->ww);
	}
}

/* ---- writes ------------------------------------------------------------- */

/* Whether len bytes may go out now under remote_write_rate (a token bucket
 * of one second's worth) and the namespace's quota_g4 (bytes per remote_ttl,
 * so about what it may hold in the cluster: every key expires after it);
 * takes them if so. */
static int write_allowed(struct kv_tiers *t, struct kv_ns *m, uint64_t len)
{
	struct kv_g4 *g = t->g4;
	uint64_t now = kv_mono_ms(), rate = t->cfg.remote_write_rate;

	if (rate) {
		g->tokens += (now - g->tokens_ms) * rate / 1000;
		if (g->tokens > rate)
			g->tokens = rate;
		g->tokens_ms = now;
		if (g->tokens < len)
			return 0;
	}
	if (m->lim.quota_g4) {
		if (now - m->g4_since >= t->cfg.remote_ttl_ms) {
			m->g4_since = now;
			m->g4_bytes = 0;
		}
		if (m->g4_bytes + len > m->lim.quota_g4)
			return 0;
		m->g4_bytes += len;
	}
	if (rate)
		g->tokens -= len;
	return 1;
}

int tier_remote_want(struct kv_tiers *t, struct tblock *tb, int when)
{
	struct kv_g4 *g = t->g4;
	struct kv_ns *m = kv_ns_get(kv_pools_nstab(t->ps), tb->pool->ns);
	uint64_t len;
	int mode;

	if (!g || t->stopping || tb->g4_ok || !m || !m->lim.remote)
		return 0;
	mode = m->lim.remote_write ? m->lim.remote_write : g->mode;
	/* writeback's moments come to a demote namespace too: what was not
	 * written at demotion (throttled, full) gets a second chance. */
	if (mode == KV_G4W_OFF || (when == KV_G4W_DEMOTE && mode != KV_G4W_DEMOTE))
		return 0;
	tb->g4_key = mac_key_of(t, tb->pool->ns);
	len = value_len(tb->pool, tb->g4_key);
	if (g->inflight + len > g->max_inflight || !(tb->g4_buf = wbuf_get(g, len))) {
		g->st.dropped++;
		return 0;
	}
	if (!write_allowed(t, m, len)) {
		wbuf_put(g, tb->g4_buf, len);
		tb->g4_buf = NULL;
		g->st.throttled++;
		return 0;
	}
	g->inflight += len;
	return 1;
}

/* Worker thread: fills the buffer remote_want() took on the loop; a
 * buffer whose tag fails is freed here (plain free(): the pool is the
 * loop's, and this buffer simply never goes back to it). */
void tier_remote_copy(struct tblock *tb, const uint8_t *slot)
{
	struct slot_hdr h;
	size_t len;

	memcpy(&h, slot, sizeof(h));
	len = sizeof(h) + h.payload_len;
	memcpy(tb->g4_buf, &h, sizeof(h));
	memcpy(tb->g4_buf + sizeof(h), slot + HDR_BYTES, h.payload_len);
	if (tb->g4_key && kv_g4mac_tag(tb->g4_key, tb->g4_buf, len, tb->g4_buf + len) < 0) {
		free(tb->g4_buf);   /* not written: counted as dropped */
		tb->g4_buf = NULL;
	}
}

static void write_run(struct kv_job *j)
{
	struct g4_wjob *w = kv_container_of(j, struct g4_wjob, job);
	struct kv_g4 *g = w->t->g4;
	struct g4_write *x;
	uint32_t i = 0;

	for (x = w->list; x; x = x->next, i++) {
		w->keys[i] = (struct kv_rc_key){ .data = x->key, .len = x->keylen };
		w->vals[i] = (struct kv_rc_val){ .data = x->buf, .len = x->len };
	}
	if (kv_rc_set(g->cl[w->cl].wr, w->n, w->keys, w->vals, g->ttl_s, w->status) >= 0)
		for (i = 0; i < w->n; i++)
			w->ok += w->status[i] == KV_RC_OK;
	kv_rc_stats(g->cl[w->cl].wr, &w->rc);
}

static void write_flush(struct kv_tiers *t, uint32_t cl);

static void write_done(struct kv_job *j)
{
	struct g4_wjob *w = kv_container_of(j, struct g4_wjob, job);
	struct kv_g4 *g = w->t->g4;

	g->st.writes += w->ok;
	g->st.write_errors += w->n - w->ok;
	g->cl[w->cl].wr_st = w->rc;
	while (w->list) {
		struct g4_write *x = w->list;

		w->list = x->next;
		g->st.bytes_out += x->len;
		g->inflight -= x->len;
		wbuf_put(g, x->buf, x->len);
		free(x);
	}
	g->cl[w->cl].writing = 0;
	write_flush(w->t, w->cl);
}

/* Hands what client cl has pending to the write thread, one job of it at a
 * time, so that its writes wait in one list and go out together. */
static void write_flush(struct kv_tiers *t, uint32_t cl)
{
	struct g4_client *c = &t->g4->cl[cl];
	struct g4_wjob *w;
	struct g4_write **tail;

	if (c->writing || !c->pending || t->stopping)
		return;
	w = c->wj;
	w->t = t;
	w->cl = cl;
	w->n = w->ok = 0;
	w->list = c->pending;
	for (tail = &c->pending; *tail && w->n < WRITE_BATCH; tail = &(*tail)->next)
		w->n++;
	c->pending = *tail;
	*tail = NULL;
	if (!c->pending)
		c->pending_tail = &c->pending;
	c->writing = 1;
	w->job.run = write_run;
	w->job.done = write_done;
	kv_worker_submit(&t->g4->ww, &w->job);
}

void tier_remote_queue(struct kv_tiers *t, struct tblock *tb)
{
	struct kv_g4 *g = t->g4;
	uint64_t len = value_len(tb->pool, tb->g4_key);
	struct g4_write *w;

	if (!tb->g4_buf || t->stopping || !(w = calloc(1, sizeof(*w)))) {
		g->inflight -= len;
		wbuf_put(g, tb->g4_buf, len);
		tb->g4_buf = NULL;
		g->st.dropped++;
		return;
	}
	w->keylen = key_of(t, tb->pool, tb->ix.hash, w->key);
	w->buf = tb->g4_buf;
	w->len = len;
	w->cl = client_of(t, tb->pool->ns);
	tb->g4_buf = NULL;
	tb->g4_ok = 1;   /* written once */
	*g->cl[w->cl].pending_tail = w;
	g->cl[w->cl].pending_tail = &w->next;
	write_flush(t, w->cl);
}

/* A write made from a G2 slot on the loop (remote_write = demote, or a block
 * G2 drops without G3): the copy is the loop's, its checksums and tag the
 * tier's worker's (w->job); the tblock may be gone by then. A buffer whose
 * tag fails is freed on the worker (see tier_remote_copy()). */
static void seal_run(struct kv_job *j)
{
	struct g4_write *w = kv_container_of(j, struct g4_write, job);
	struct slot_hdr h;
	size_t body;

	memcpy(&h, w->buf, sizeof(h));
	body = sizeof(h) + h.payload_len;
	slot_hdr_seal(&h, kv_crc32c(0, w->buf + sizeof(h), h.payload_len));
	memcpy(w->buf, &h, sizeof(h));
	if (w->mac_key && kv_g4mac_tag(w->mac_key, w->buf, body, w->buf + body) < 0) {
		free(w->buf);   /* not written: counted as dropped */
		w->buf = NULL;
	}
}

static void seal_done(struct kv_job *j)
{
	struct g4_write *w = kv_container_of(j, struct g4_write, job);
	struct kv_tiers *t = w->t;
	struct kv_g4 *g = t->g4;

	if (!w->buf || t->stopping) {
		g->inflight -= w->len;
		wbuf_put(g, w->buf, w->len);
		g->st.dropped++;
		free(w);
		return;
	}
	*g->cl[w->cl].pending_tail = w;
	g->cl[w->cl].pending_tail = &w->next;
	write_flush(t, w->cl);
}

int tier_remote_put(struct kv_tiers *t, struct tblock *tb, int when)
{
	struct kv_g4 *g = t->g4;
	struct g4_write *w;
	struct slot_hdr h;
	uint64_t len;

	if (!tb->run[L2] || !tier_remote_want(t, tb, when))
		return 0;
	len = value_len(tb->pool, tb->g4_key);
	if (!(w = calloc(1, sizeof(*w)))) {
		g->inflight -= len;
		wbuf_put(g, tb->g4_buf, len);
		tb->g4_buf = NULL;
		g->st.dropped++;
		return 0;
	}
	w->buf = tb->g4_buf;
	tb->g4_buf = NULL;
	slot_hdr_fill(t, tb, &h, 0);
	memcpy(w->buf, &h, sizeof(h));
	memcpy(w->buf + sizeof(h), tier_g2_addr(t, tb->run[L2], tb->slot[L2]) + HDR_BYTES,
	       h.payload_len);
	w->keylen = key_of(t, tb->pool, tb->ix.hash, w->key);
	w->len = len;
	w->cl = client_of(t, tb->pool->ns);
	tb->g4_ok = 1;   /* written once */
	w->t = t;
	w->mac_key = tb->g4_key;
	tier_offload(t, &w->job, seal_run, seal_done);
	return 1;
}

/* ---- reads -------------------------------------------------------------- */

int tier_remote_check(const struct slot_hdr *want, const uint8_t *mac_key, const void *data,
		      size_t len)
{
	size_t body = sizeof(struct slot_hdr) + want->payload_len,
	       vlen = body + (mac_key ? KV_G4MAC_TAG_BYTES : 0);
	struct slot_hdr h, w = *want;

	if (len > vlen)
		return G4_VALUE_OVERSIZE;
	if (len != vlen)
		return G4_VALUE_BAD;
	memcpy(&h, data, sizeof(h));
	slot_hdr_seal(&w, kv_crc32c(0, (const uint8_t *)data + sizeof(h), w.payload_len));
	if (memcmp(&h, &w, sizeof(h)))
		return G4_VALUE_BAD;
	if (mac_key && !kv_g4mac_check(mac_key, data, body, (const uint8_t *)data + body))
		return G4_VALUE_BAD_TAG;
	return G4_VALUE_GOOD;
}

/* tier_remote_check() of a value read into a G2 slot: its header at slot,
 * its payload at slot + HDR_BYTES, len bytes in all (no tag: a namespace
 * with a key reserves no slot). */
static int check_in_slot(const struct slot_hdr *want, const uint8_t *slot, size_t len)
{
	struct slot_hdr h, w = *want;

	if (len > sizeof(h) + w.payload_len)
		return G4_VALUE_OVERSIZE;
	if (len != sizeof(h) + w.payload_len)
		return G4_VALUE_BAD;
	memcpy(&h, slot, sizeof(h));
	slot_hdr_seal(&w, kv_crc32c(0, slot + HDR_BYTES, w.payload_len));
	return memcmp(&h, &w, sizeof(h)) ? G4_VALUE_BAD : G4_VALUE_GOOD;
}

/* The read thread, during kv_rc_get_into(): value i was just read into
 * its slot; checked at once, while its bytes are in cache. */
static void fetch_value(void *arg, size_t i, size_t len)
{
	struct g4_fetch *f = arg;
	struct slot_hdr want = f->want;

	if (i >= f->n || !f->slot[i])
		return;
	memcpy(want.hash, f->hash[i], KV_HASH_BYTES);
	f->chk[i] = (uint8_t)(check_in_slot(&want, f->slot[i], len) + 1);
}

/* The read thread: the values, and which of them check out. */
static void fetch_run(struct kv_job *j)
{
	struct g4_fetch *f = kv_container_of(j, struct g4_fetch, job);
	struct kv_rc *rc = f->t->g4->cl[f->cl].rd;
	struct kv_rc_limits lim;
	uint32_t i;

	/* At most one byte more than a value of this pool: a longer one is
	 * refused below after vlen + 1 bytes, whatever its length. */
	kv_rc_get_limits(rc, &lim);
	lim.get_max = f->vlen;
	lim.max_value = f->vlen + 4096;
	if (kv_rc_set_limits(rc, &lim) < 0 ||
	    kv_rc_get_into(rc, f->n, f->keys, f->dst, fetch_value, f, f->vals) < 0) {
		f->errors = f->n;
		kv_rc_stats(rc, &f->rc);
		return;
	}
	kv_rc_stats(rc, &f->rc);
	for (i = 0; i < f->n; i++) {
		struct kv_rc_val *v = &f->vals[i];
		struct slot_hdr want = f->want;
		int c;

		if (v->status == KV_RC_TOOLONG) {
			/* Longer than its slot: nothing was written there. */
			f->oversize++;
			break;
		}
		if (v->status != KV_RC_HIT) {
			f->errors += v->status == KV_RC_ERROR;
			f->misses += v->status == KV_RC_MISS;
			break;
		}
		memcpy(want.hash, f->hash[i], KV_HASH_BYTES);
		if (f->slot[i])
			c = f->chk[i] ? f->chk[i] - 1 : check_in_slot(&want, f->slot[i], v->len);
		else
			c = tier_remote_check(&want, f->mac_key, v->data, v->len);
		if (c != G4_VALUE_GOOD) {
			f->oversize += c == G4_VALUE_OVERSIZE;
			f->bad_sum += c == G4_VALUE_BAD;
			f->bad_mac += c == G4_VALUE_BAD_TAG;
			break;
		}
		if (f->slot[i])   /* the rest of the slot's header block, as the loop's copy leaves it */
			memset(f->slot[i] + sizeof(struct slot_hdr), 0,
			       HDR_BYTES - sizeof(struct slot_hdr));
		f->good++;
	}
	/* What is not served is not kept: a refused value's bytes go now
	 * (back to the client's pool, for the next fetch to read into). */
	kv_rc_vals_release(rc, f->n - i, f->vals + i);
}

static void fetch_next(struct kv_tiers *t);

/* Gives back the G2 slots reserved for f that no block took. */
static void fetch_unreserve(struct kv_tiers *t, struct g4_fetch *f)
{
	for (uint32_t i = 0; i < f->n; i++) {
		struct tblock *tb = f->res[i];

		if (!tb)
			continue;
		f->res[i] = NULL;
		kv_assert(tb->busy == BUSY_FETCH && !tb->indexed);
		tb->busy = 0;
		slot_put(t, L2, tb->run[L2], tb->slot[L2]);
		tb->run[L2] = NULL;
		tb_dealloc(tb);
	}
}

static void fetch_done(struct kv_job *j)
{
	struct g4_fetch *f = kv_container_of(j, struct g4_fetch, job);
	struct kv_tiers *t = f->t;
	struct kv_g4 *g = t->g4;
	struct kv_list *pos;
	uint32_t i, made = 0;
	uint64_t mark;
	int clean_only;

	g->st.hits += f->good;
	g->st.misses += f->misses;
	g->st.errors += f->errors;
	g->st.checksum_failures += f->bad_sum;
	g->st.auth_failures += f->bad_mac;
	g->st.oversize += f->oversize;
	g->cl[f->cl].rd_st = f->rc;
	if (f->bad_sum)
		kv_warn("G4: a value for pool '%s' did not check out (header or CRC32C); treated "
			"as a miss", f->pool->name);
	if (f->bad_mac)
		kv_warn("G4: a value for pool '%s' has a header and CRC32C that check out but no "
			"valid HMAC tag (forged, or written without this namespace's "
			"remote_key_file); treated as a miss", f->pool->name);
	if (f->oversize)
		kv_warn("G4: a value for pool '%s' is longer than its %zu bytes; refused after "
			"%zu bytes, treated as a miss", f->pool->name, f->vlen, f->vlen + 1);
	g->reading = 0;
	g->cur = NULL;
	g->st.fetching--;
	kv_hist_since(&g->st.hist, f->start_ns);
	/* A read-ahead that its lookup has not come to wait on takes no dirty
	 * copy's slot: those include the blocks the last fetch brought for
	 * that lookup, which it may not have promoted yet (G1 full). */
	clean_only = f->ahead && kv_list_empty(&f->waiters);
	for (i = 0; i < f->good && !t->stopping; i++) {
		struct tblock *tb;
		uint8_t *slot;

		g->st.bytes_in += f->vals[i].len;
		if (kv_pool_find_entry(f->pool, f->hash[i])) {
			made++;   /* here already (sealed or fetched meanwhile) */
			continue;  /* its reserved slot, if any, goes back below */
		}
		if ((tb = f->res[i])) {
			/* Read into its slot on the thread and checked there. */
			f->res[i] = NULL;
			tb->busy = 0;
			g->st.direct++;
			goto index_it;
		}
		if (!(tb = tb_new(t, f->pool, f->hash[i], kv_mono_ms())))
			break;
		if ((clean_only ? slot_alloc_clean(t, f->pool, tb, &tb->run[L2], &tb->slot[L2])
				: slot_alloc(t, L2, f->pool, tb, &tb->run[L2], &tb->slot[L2])) < 0) {
			tb_dealloc(tb);
			break;
		}
		/* The copy into the slot is the loop's (one block at a time, at
		 * most FETCH_MAX per lookup); the checks ran on the thread. */
		slot = tier_g2_addr(t, tb->run[L2], tb->slot[L2]);
		memset(slot, 0, HDR_BYTES);
		memcpy(slot, f->vals[i].data, sizeof(struct slot_hdr));
		memcpy(slot + HDR_BYTES, (const uint8_t *)f->vals[i].data + sizeof(struct slot_hdr),
		       f->vals[i].len - sizeof(struct slot_hdr));
index_it:
		tb->g4_ok = 1;
		tb_index(t, tb);
		t->lv[L2].st.blocks++;
		g2_dirty_add(t, tb, 1);
		tb_set_idle(t, tb);
		made++;
	}
	/* The read thread is idle (reading is 0, and nothing was handed to
	 * it since): the buffers go back to its client's pool, pages mapped,
	 * for the next fetch; before the waiters run, whose reruns may hand it
	 * the next fetch (a read-ahead) at once. */
	kv_rc_vals_release(g->cl[f->cl].rd, f->n, f->vals);
	fetch_unreserve(t, f);
	mark = made < f->n ? kv_tiers_remote_mark(f->pool, f->hash[made]) : 0;
	kv_list_for_each(pos, &f->waiters)
		kv_container_of(pos, struct kv_waiter, link)->remote_mark = mark;
	if (f->owner) {
		/* Its lookup, parked elsewhere, will not ask again for the
		 * block G4 did not have; it will for those that found no G2
		 * slot here (it may evict for them when it waits). */
		if (made == f->good && made < f->n)
			f->owner->remote_mark = mark;
		f->owner->ahead = NULL;
	}
	tier_wake_all(&f->waiters);
	kv_pool_put(f->pool);
	free(f);
	fetch_next(t);
}

/* Loop, as f goes to the read thread: a G2 slot for each block it asks
 * for, which the read client writes the value into (header at the slot's
 * start, payload at HDR_BYTES: the slot as a G2 copy holds it), so that
 * fetch_done() only indexes what checked out. Taken from free room only
 * (slot_alloc_free(): nothing cached is dropped for blocks that may well
 * miss, which also keeps a read-ahead's rule, slot_alloc_clean()); none for a
 * block here already, none from the first that finds no room on, none for a
 * namespace whose values carry a tag (checked over header and payload in
 * one piece). Those values are read into the client's buffers and copied
 * on the loop, as before. A reserved slot is the fetch's until fetch_done():
 * its tblock (FETCH) is in no index and on no LRU, so nothing on the loop
 * reads, evicts or frees it meanwhile, and only the read thread writes its
 * bytes. */
static void fetch_reserve(struct kv_tiers *t, struct g4_fetch *f)
{
	if (f->mac_key || !t->lv[L2].on)
		return;
	for (uint32_t i = 0; i < f->n; i++) {
		struct tblock *tb;
		uint8_t *slot;

		if (kv_pool_find_entry(f->pool, f->hash[i]))
			continue;
		if (!(tb = tb_new(t, f->pool, f->hash[i], kv_mono_ms())))
			return;
		if (slot_alloc_free(t, f->pool, tb, &tb->run[L2], &tb->slot[L2]) < 0) {
			tb_dealloc(tb);
			return;
		}
		tb_busy_set(tb, BUSY_FETCH);
		slot = tier_g2_addr(t, tb->run[L2], tb->slot[L2]);
		f->res[i] = tb;
		f->slot[i] = slot;
		f->dst[i].part[0].p = slot;
		f->dst[i].part[0].len = sizeof(struct slot_hdr);
		f->dst[i].part[1].p = slot + HDR_BYTES;
		f->dst[i].part[1].len = f->want.payload_len;
		f->dst[i].nparts = 2;
	}
}

/* Hands the read thread the next fetch, if it is idle: the first waiting
 * of the namespace after the one served last. */
static void fetch_next(struct kv_tiers *t)
{
	struct kv_g4 *g = t->g4;
	struct g4_fetch *f;
	uint32_t ns;

	if (g->reading || !g->fq_waiting || t->stopping)
		return;
	for (uint32_t k = 1; k <= KV_MAX_NS + 1; k++) {
		ns = (g->fq_last + k) % (KV_MAX_NS + 1);
		if (!(f = g->fq[ns]))
			continue;
		if (!(g->fq[ns] = f->next))
			g->fq_tail[ns] = &g->fq[ns];
		g->fq_waiting--;
		g->fq_last = ns;
		g->reading = 1;
		g->cur = f;
		fetch_reserve(t, f);
		kv_worker_submit(&g->rw, &f->job);
		return;
	}
}

uint64_t kv_tiers_remote_mark(const struct kv_pool *p, const uint8_t *hash)
{
	uint8_t k[4 + KV_HASH_BYTES];

	memcpy(k, &p->id, 4);
	memcpy(k + 4, hash, KV_HASH_BYTES);
	return XXH3_64bits(k, sizeof(k)) | 1;
}

/* A fetch of the first hashes of hashes[0..n) of pool p, not queued: at most
 * FETCH_MAX, at most FETCH_BYTES of values but at least one; NULL when out
 * of memory. */
static struct g4_fetch *fetch_new(struct kv_tiers *t, struct kv_pool *p, const uint8_t *hashes,
				  size_t n)
{
	struct g4_fetch *f;
	uint64_t pl;
	uint32_t i;

	if (!(f = calloc(1, sizeof(*f))))
		return NULL;
	f->t = t;
	f->cl = client_of(t, p->ns);
	f->ns = p->ns;
	f->mac_key = mac_key_of(t, p->ns);
	f->vlen = value_len(p, f->mac_key);
	f->pool = p;
	kv_pool_hold(p);
	kv_list_init(&f->waiters);
	f->n = n < FETCH_MAX ? (uint32_t)n : FETCH_MAX;
	pl = kv_pool_stored_bytes(p);   /* a value less its header and tag */
	if (f->n > 1 && (uint64_t)f->n * pl > FETCH_BYTES)
		f->n = pl < FETCH_BYTES ? (uint32_t)(FETCH_BYTES / pl) : 1;
	f->want = (struct slot_hdr){ .magic = SLOT_MAGIC, .version = SLOT_VERSION,
				     .ns = slot_hdr_ns(t, p), .layout = t->layout_id[p->id],
				     .payload_len = kv_pool_stored_bytes(p), .flags = p->qfmt };
	for (i = 0; i < f->n; i++) {
		memcpy(f->hash[i], hashes + (size_t)i * KV_HASH_BYTES, KV_HASH_BYTES);
		f->keys[i].data = f->key[i];
		f->keys[i].len = key_of(t, p, f->hash[i], f->key[i]);
	}
	f->job.run = fetch_run;
	f->job.done = fetch_done;
	return f;
}

/* Queues f in its namespace's queue (the read thread takes it in turn). */
static void fetch_queue(struct kv_tiers *t, struct g4_fetch *f)
{
	struct kv_g4 *g = t->g4;

	f->start_ns = kv_hist_now_ns();
	g->st.fetches++;
	g->st.fetching++;
	if (!g->fq_tail[f->ns])
		g->fq_tail[f->ns] = &g->fq[f->ns];
	*g->fq_tail[f->ns] = f;
	g->fq_tail[f->ns] = &f->next;
	g->fq_waiting++;
	fetch_next(t);
}

int kv_tiers_remote_fetch(struct kv_tiers *t, struct kv_pool *p, const uint8_t *hashes,
			  size_t n, struct kv_waiter *w)
{
	struct kv_g4 *g = t->g4;
	struct g4_fetch *f;

	if (!g || t->stopping || !n || !ns_remote(t, p) || !t->layout_id[p->id])
		return -ENOENT;
	if (w->remote_mark == kv_tiers_remote_mark(p, hashes)) {
		w->remote_mark = 0;   /* asked already: a miss this time */
		return -ENOENT;
	}
	if ((f = w->ahead)) {
		/* Its read-ahead, queued or being read: it waits on that one
		 * (which is an ordinary fetch from now on). One that asks for
		 * something else (the chain moved on: another client sealed
		 * or fetched those blocks) goes on unowned. */
		w->ahead = NULL;
		f->owner = NULL;
		if (f->pool == p && !memcmp(f->hash[0], hashes, KV_HASH_BYTES)) {
			kv_list_push_back(&f->waiters, &w->link);
			goto ahead;
		}
	}
	if (!(f = fetch_new(t, p, hashes, n)))
		return -ENOMEM;
	kv_list_push_back(&f->waiters, &w->link);
	fetch_queue(t, f);
ahead:
	/* The next fetch's worth at once, queued behind this one: the read
	 * thread goes on to it as soon as this one is read, while the loop
	 * indexes these blocks and the copy thread promotes them (a second
	 * fetch in flight; the rerun adopts it). */
	if (n > f->n)
		kv_tiers_remote_ahead(t, p, hashes + (size_t)f->n * KV_HASH_BYTES, n - f->n, w);
	return 0;
}

void kv_tiers_remote_ahead(struct kv_tiers *t, struct kv_pool *p, const uint8_t *hashes,
			   size_t n, struct kv_waiter *w)
{
	struct kv_g4 *g = t->g4;
	struct g4_fetch *f;

	if (!g || t->stopping || !n || w->ahead || !ns_remote(t, p) || !t->layout_id[p->id] ||
	    w->remote_mark == kv_tiers_remote_mark(p, hashes) || !(f = fetch_new(t, p, hashes, n)))
		return;
	f->ahead = 1;
	f->owner = w;
	w->ahead = f;
	g->st.read_aheads++;
	fetch_queue(t, f);
}

void kv_tiers_waiter_gone(struct kv_tiers *t, struct kv_waiter *w, uint32_t ns)
{
	struct kv_g4 *g = t ? t->g4 : NULL;
	struct g4_fetch **pp;

	if (w->ahead) {
		struct g4_fetch *f = w->ahead;

		kv_assert(f->owner == w && kv_list_empty(&f->waiters));
		w->ahead = NULL;
		f->owner = NULL;
	}
	if (!g || ns > KV_MAX_NS)
		return;
	/* What waits in the namespace's queue for nobody now goes (w was
	 * taken off its fetch's waiters already); the fetch being read ends
	 * as any fetch, its blocks cached. */
	for (pp = &g->fq[ns]; *pp;) {
		struct g4_fetch *f = *pp;

		if (!kv_list_empty(&f->waiters) || f->owner) {
			pp = &f->next;
			continue;
		}
		*pp = f->next;
		if (g->fq_tail[ns] == &f->next)
			g->fq_tail[ns] = pp;
		g->fq_waiting--;
		g->st.fetching--;
		kv_pool_put(f->pool);
		free(f);
	}
}

int kv_tiers_remote_stats(const struct kv_tiers *t, struct kv_g4_stats *st)
{
	if (!t->g4)
		return 0;
	*st = t->g4->st;
	st->inflight_bytes = t->g4->inflight;
	st->redirects = st->reconnects = st->connect_failures = 0;
	for (uint32_t i = 0; i < t->g4->ncl; i++) {
		const struct g4_client *c = &t->g4->cl[i];

		st->redirects += c->rd_st.redirects_moved + c->rd_st.redirects_ask +
				 c->wr_st.redirects_moved + c->wr_st.redirects_ask;
		st->reconnects += c->rd_st.reconnects + c->wr_st.reconnects;
		st->connect_failures += c->rd_st.connect_failures + c->wr_st.connect_failures;
	}
	return 1;
}

#else /* no hiredis: no G4 */

int tier_remote_open(struct kv_tiers *t, char *err, size_t errlen)
{
	if (!t->cfg.remote_seeds[0])
		return 0;
	snprintf(err, errlen, "remote_seeds: this kvcached was built without hiredis (no G4)");
	return -ENOTSUP;
}

void tier_remote_close(struct kv_tiers *t)
{
	(void)t;
}

void tier_remote_reap(struct kv_tiers *t)
{
	(void)t;
}

int tier_remote_want(struct kv_tiers *t, struct tblock *tb, int when)
{
	(void)t;
	(void)tb;
	(void)when;
	return 0;
}

int tier_remote_put(struct kv_tiers *t, struct tblock *tb, int when)
{
	(void)t;
	(void)tb;
	(void)when;
	return 0;
}

void tier_remote_copy(struct tblock *tb, const uint8_t *slot)
{
	(void)tb;
	(void)slot;
}

void tier_remote_queue(struct kv_tiers *t, struct tblock *tb)
{
	(void)t;
	(void)tb;
}

uint64_t kv_tiers_remote_mark(const struct kv_pool *p, const uint8_t *hash)
{
	(void)p;
	(void)hash;
	return 0;
}

void kv_tiers_remote_ahead(struct kv_tiers *t, struct kv_pool *p, const uint8_t *hashes,
			   size_t n, struct kv_waiter *w)
{
	(void)t;
	(void)p;
	(void)hashes;
	(void)n;
	(void)w;
}

void kv_tiers_waiter_gone(struct kv_tiers *t, struct kv_waiter *w, uint32_t ns)
{
	(void)t;
	(void)ns;
	w->ahead = NULL;
}

int kv_tiers_remote_fetch(struct kv_tiers *t, struct kv_pool *p, const uint8_t *hashes,
			  size_t n, struct kv_waiter *w)
{
	(void)t;
	(void)p;
	(void)hashes;
	(void)n;
	(void)w;
	return -ENOENT;
}

int kv_tiers_remote_stats(const struct kv_tiers *t, struct kv_g4_stats *st)
{
	(void)t;
	(void)st;
	return 0;
}

#endif
