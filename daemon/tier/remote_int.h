/* What the files of the G4 tier share (docs/g4.md): struct kv_g4 and the
 * structs its queues and jobs hold, the keys and lengths of values, and the
 * one function remote.c (setup, clients, HMAC keys, counters) calls in
 * remote_write.c (the writes and their pool) beside the tier_remote_*() of
 * tier_int.h; remote_read.c (the fetches) calls neither. Private to
 * daemon/tier/, and built only with hiredis (daemon/meson.build; without it,
 * remote_stub.c). */
#ifndef KV_TIER_REMOTE_INT_H
#define KV_TIER_REMOTE_INT_H

#include "tier_int.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "g4mac.h"
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
/* Write threads, each with its own client per user: a client's next batch
 * goes out on one while the other waits for its batch's last replies
 * (issue 38: with one, the write thread spent 20-60% of its calls at 16 KiB
 * with everything sent, waiting for the servers, and the servers waited
 * between its calls). */
#define G4_WRITERS 2
/* ... but a second batch goes out beside one in flight only while both
 * are under this many bytes: short batches (at 16 KiB, 256 values are 4
 * MiB, a few ms) lose a large share of each call to its last replies; a
 * batch of large values already keeps the masters busy, and a second one
 * beside it only took CPU from them (kvg4rate at 64-256 KiB: no gain, or
 * less; docs/benchmarks.md, "G4 writes, sixth pass"). */
#define WRITE_PIPE_BYTES (8u << 20)
/* Writes one seal job of the tier's worker sums (remote_write.c), and such
 * jobs in flight at once: one wakeup of the worker and one of the loop per
 * batch, not per value (issue 38: at 16 KiB, an eventfd write and a loop
 * wakeup per value), while a second batch keeps the worker busy as the loop
 * takes the first; small enough that the write thread gets the first values
 * of a demotion within a few microseconds of CRC32C. */
#define SEAL_BATCH 32
#define SEAL_JOBS 2
#define KEY_MAX 200
#define WFREE_MAX 1024            /* idle write structs the loop keeps */
#define WPOOL_CLASSES 8       /* value lengths the write pool keeps buffers of */
#define G4_READERS_MAX 16     /* remote_readers at most */

/* A write: from remote_want() to write_done(), the loop's, except while a
 * job holds it (the worker's seal job, the write thread's batch). */
struct g4_write {
	struct g4_write *next;
	const uint8_t *mac_key;   /* for its seal job */
	uint32_t cl;              /* the client (user) it goes out with */
	char key[KEY_MAX];
	size_t keylen;
	uint8_t *buf;             /* header + payload [+ tag]: len bytes, from the write pool;
	                           * NULL for a write sent from its G2 slot (tb) */
	size_t len;
	/* A write made at demotion: the block, held BUSY_G4 until its SET is
	 * answered (write_done()), its payload in its G2 slot, which the
	 * write thread sends from where it lies (issue 38: no copy), and the
	 * header and tag the worker made for it; tb NULL when the loop copied
	 * the block into buf. */
	struct tblock *tb;
	const uint8_t *slot;
	uint8_t head[sizeof(struct slot_hdr)];
	uint8_t tag[KV_G4MAC_TAG_BYTES];
	uint8_t sealed;           /* the worker made head (and tag): it may go out */
	uint8_t summed;           /* head sealed with the CRC32C the demotion's copy
	                           * summed (tier_remote_put_sum()): no second pass */
};

/* A seal job: up to SEAL_BATCH writes made from G2, summed (and tagged) on
 * the tier's worker, then handed to their clients' pending lists on the
 * loop (remote_write.c). list NULL: free. */
struct g4_sjob {
	struct kv_job job;
	struct kv_tiers *t;
	struct g4_write *list;
};

struct g4_fetch {
	struct kv_job job;
	struct kv_tiers *t;
	struct g4_fetch *next;    /* in its namespace's queue */
	uint32_t ns;
	uint32_t cl;
	uint32_t rd;              /* the reader it went to (fetch_next()) */
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
	uint8_t tag[FETCH_MAX][KV_G4MAC_TAG_BYTES];  /* a reserved value's tag (with mac_key) */
	uint8_t chk[FETCH_MAX];   /* read thread: check_in_slot()'s answer + 1; 0: none yet */
	uint32_t bad_sum, bad_mac, oversize, errors, misses;
	struct kv_rc_stats rc;    /* the client's counters after this job */
	char why[160];            /* the client's first error of this job ("": none) */
};

/* A client's write job, one per write thread: the loop's while its bit in
 * the client's writing is 0, write thread k's from kv_worker_submit() to
 * write_done(). */
struct g4_wjob {
	struct kv_job job;
	struct kv_tiers *t;
	uint32_t cl;
	uint32_t k;               /* its write thread, and the client's wr[k] */
	struct g4_write *list;
	uint32_t n, ok;
	uint64_t bytes;           /* of its values */
	struct kv_rc_stats rc;
	struct kv_rc_key keys[WRITE_BATCH];
	struct kv_rc_dst vals[WRITE_BATCH];   /* a buffer, or header, G2 slot, tag */
	int status[WRITE_BATCH];
	char why[160];            /* the client's first error when a write failed */
};

/* A user the cluster is talked to as: the daemon's (remote_user), or a
 * namespace's own ([namespace X] remote_user). Each has a client per
 * thread, and its writes go out in jobs of their own. */
struct g4_client {
	char ns[64];              /* "" for the daemon's */
	/* Each used by its own thread only: rd[r] by reader r, wr[k] by
	 * write thread k. */
	struct kv_rc *rd[G4_READERS_MAX], *wr[G4_WRITERS];
	struct g4_write *pending, **pending_tail;
	unsigned writing;         /* bit k: wj[k] is under way */
	struct g4_wjob *wj[G4_WRITERS];  /* its write jobs, made at start */
	struct kv_rc_stats rd_st[G4_READERS_MAX], wr_st[G4_WRITERS];  /* the clients' last counters */
};

/* The write pool's buffers of one length (the loop's: see remote_write.c's
 * top). An
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
	/* Fetches waiting for a reader, per namespace id; each of the nreaders
	 * read threads has one at a time (cur[r]), the namespaces taking turns
	 * (fetch_next): a fetch that a slow node holds (for remote_fetch_timeout
	 * at most) holds one reader, not the others (issue 36). */
	struct g4_fetch *fq[KV_MAX_NS + 1], **fq_tail[KV_MAX_NS + 1];
	uint32_t fq_last;         /* the namespace served last */
	uint32_t fq_waiting;
	uint32_t nreaders, nreading;
	struct g4_fetch *cur[G4_READERS_MAX];  /* being read by reader r; NULL: idle */
	struct kv_worker rw[G4_READERS_MAX], ww[G4_WRITERS];
	unsigned ttl_s;
	uint64_t max_inflight, inflight;  /* write bytes reserved, pending or under way */
	uint64_t tokens, tokens_ms;  /* remote_write_rate's bucket */
	int mode;                  /* remote_write: KV_G4W_* (ns.h), the daemon's */
	struct g4_wclass wpool[WPOOL_CLASSES];
	uint64_t wpool_bytes, wpool_tick;  /* idle bytes in it */
	uint64_t held;             /* G2 copies held BUSY_G4 (tier_remote_put() to write_done()) */
	/* Writes made from G2 waiting for a seal job, in order; the jobs
	 * (sealing of them in flight on the tier's worker). */
	struct g4_write *seal_q, **seal_tail;
	struct g4_sjob sj[SEAL_JOBS];
	uint32_t sealing;
	int seal_flushing;         /* seal_flush() is on the stack */
	struct g4_write *wfree;    /* idle write structs (remote_write.c write_new()) */
	uint32_t nwfree;
	struct kv_g4_stats st;
};

/* What the writes and the reads both ask: which client and HMAC key a
 * namespace uses, a value's length and key. Inline here, not in remote.c,
 * which calls into remote_write.c: so neither calls back up
 * (scripts/include-graph --check). */

/* The client (index into g4->cl) namespace ns talks to the cluster with. */
static inline uint32_t tier_g4_client_of(struct kv_tiers *t, uint32_t ns)
{
	const char *name = kv_pools_ns_name(t->ps, ns);

	for (uint32_t i = 1; i < t->g4->ncl; i++)
		if (!strcmp(t->g4->cl[i].ns, name))
			return i;
	return 0;
}

/* Namespace ns's HMAC key (remote_key_file), or NULL: read at start, never changed. */
static inline const uint8_t *tier_g4_mac_key_of(struct kv_tiers *t, uint32_t ns)
{
	const char *name = kv_pools_ns_name(t->ps, ns);

	for (uint32_t i = 0; i < t->g4->nkeys; i++)
		if (!strcmp(t->g4->keys[i].ns, name))
			return t->g4->keys[i].key;
	return NULL;
}

/* A value's length in the cluster for pool p: header, stored payload, tag with mac_key. */
static inline size_t tier_g4_value_len(const struct kv_pool *p, const uint8_t *mac_key)
{
	return sizeof(struct slot_hdr) + kv_pool_stored_bytes(p) +
	       (mac_key ? KV_G4MAC_TAG_BYTES : 0);
}

/* Writes the part of pool p's keys before the hash into key (KEY_MAX
 * bytes); returns its length, which may be KEY_MAX - 1 or more (cut). */
static inline int tier_g4_key_prefix(struct kv_tiers *t, const struct kv_pool *p, char *key)
{
	const char *pre = t->cfg.remote_prefix, *ns = kv_pools_ns_name(t->ps, p->ns);
	size_t lp = strlen(pre), ln = strlen(ns), n;
	uint64_t id = t->layout_id[p->id];

	/* By hand, the same bytes as the snprintf() below (issue 38: every
	 * write makes its key on the loop, and snprintf() was a tenth of the
	 * loop's samples in kvg4rate's 16 KiB writes); a cut key as before. */
	if (lp + ln + 19 >= KEY_MAX)
		return snprintf(key, KEY_MAX, "%s:%s:%016llx:", pre, ns, (unsigned long long)id);
	memcpy(key, pre, lp);
	key[lp] = ':';
	memcpy(key + lp + 1, ns, ln);
	n = lp + 1 + ln;
	key[n++] = ':';
	for (int i = 60; i >= 0; i -= 4)
		key[n++] = "0123456789abcdef"[id >> i & 15];
	key[n++] = ':';
	key[n] = 0;
	return (int)n;
}

/* Ends the key whose first n bytes tier_g4_key_prefix() wrote (n its answer)
 * with the hash; returns the key's length. */
static inline size_t tier_g4_key_hash(char *key, int n, const uint8_t *hash)
{
	/* The hash in hex by hand: a fetch makes 64 keys on the loop, and
	 * snprintf() per byte was a tenth of the loop's time at 16 KiB. */
	for (int i = 0; i < KV_HASH_BYTES && n + 2 < KEY_MAX; i++) {
		key[n++] = "0123456789abcdef"[hash[i] >> 4];
		key[n++] = "0123456789abcdef"[hash[i] & 15];
	}
	key[n < KEY_MAX ? n : KEY_MAX - 1] = 0;
	return (size_t)n;
}

/* Writes block hash's key of pool p into key (KEY_MAX bytes); returns its length. */
static inline size_t tier_g4_key_of(struct kv_tiers *t, const struct kv_pool *p,
				     const uint8_t *hash, char *key)
{
	return tier_g4_key_hash(key, tier_g4_key_prefix(t, p, key), hash);
}

/* remote_write.c */
/* Loop: frees the write pool's idle buffers of class c and leaves it unused. */
void tier_g4_wclass_drop(struct kv_g4 *g, struct g4_wclass *c);
/* Loop, at the stop: frees the idle write structs. */
void tier_g4_wfree_drop(struct kv_g4 *g);
/* Loop, at the stop: frees a write never sent, its G2 slot released. */
void tier_g4_write_free(struct kv_tiers *t, struct g4_write *x);
/* Loop, at the stop (the worker idle, its done()s run): frees the writes
 * still waiting for a seal job, their G2 slots released. */
void tier_g4_seal_drop(struct kv_tiers *t);

#endif
