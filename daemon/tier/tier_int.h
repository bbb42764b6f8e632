/* The lower tiers' internals, shared by the files of daemon/tier/ and by
 * nothing else: the slot format, the tier structures and the functions one
 * file calls in another. tier.h is the interface to the rest of the daemon. */
#ifndef KV_TIER_INT_H
#define KV_TIER_INT_H

#include <stdint.h>

#include "disk.h"
#include "journal.h"
#include "kvassert.h"
#include "tier.h"

#define HDR_BYTES 4096u       /* a slot starts with its header, then the payload */
#define SLOT_MAGIC 0x31544c5333475648ull  /* "HVG3SLT1" */
#define SLOT_VERSION 1
#define BATCH 64              /* copies per copy_async */
#define L2 0                  /* index into t->lv[] */
#define L3 1

/* The header at the start of every slot (G2 and G3 alike, so a write-back
 * is one write of the whole slot). docs/tiers.md has the format. */
struct slot_hdr {
	uint64_t magic;
	uint32_t version;
	uint32_t hdr_crc;         /* CRC32C of this struct with hdr_crc = 0 */
	uint64_t ns;              /* XXH3-64 of the namespace name */
	uint64_t layout;          /* the pool's layout id */
	uint8_t hash[KV_HASH_BYTES];
	uint64_t payload_len;
	uint32_t payload_crc;     /* CRC32C of payload_len bytes after the header */
	uint32_t flags;
};

struct tpool;
struct tblock;

/* A run of slots: npages contiguous pages of a tier cut into nslots slots. */
struct srun {
	struct kv_list link;      /* its tpool's runs, or t->dormant */
	struct kv_list plink;     /* its tpool's partial list while a slot is free */
	struct tpool *tp;         /* NULL while dormant (G3 after a restart, no pool yet) */
	uint32_t first_page, npages, nslots, nused, free_head;
	uint32_t slot_bytes;
	uint64_t layout;
	struct tblock **occ;      /* per slot: its block, SWAP_SLOT, or NULL */
	uint32_t *next;           /* the free chain */
	uint8_t (*dhash)[KV_HASH_BYTES];  /* dormant: what each slot holds */
	uint8_t *dvalid;
};

#define SWAP_SLOT ((struct tblock *)1)

/* One pool's slots in one tier. */
struct tpool {
	struct kv_pool *pool;
	struct kv_list runs, partial;
	struct kv_list lru;       /* idle copies, front = newest (G2: dirty ones) */
	struct kv_list clean;     /* G2: idle copies that G3 holds too */
	uint32_t run_pages, nslots;
	uint64_t slot_bytes;
};

struct level {
	int on;
	struct kv_pages pages;
	uint32_t limit_pages;     /* G3 shrinks to what it holds on ENOSPC */
	struct tpool *tp[KV_MAX_POOLS];
	/* A compressed pool's swap slots (swaps stay uncompressed, so their
	 * slots are another size): on no LRU, as every swap slot. NULL for an
	 * uncompressed pool, whose swaps use tp[]. */
	struct tpool *sw[KV_MAX_POOLS];
	/* Every idle copy of the level across pools (tblock.all), newest
	 * first: in tick order, so the oldest is the back, found in O(1) (it
	 * was a walk over every pool per eviction). G2: lru holds the dirty
	 * copies and clean the clean ones, as each tpool's lists do. */
	struct kv_list lru, clean;
	struct kv_tier_stats st;
};

/* BUSY_PIN: a promotion making room in G1 holds the block it promotes off
 * the LRUs, so that the demotions it starts cannot drop it for a G2 slot.
 * BUSY_FETCH: a G2 slot reserved for a G4 fetch (remote_read.c), which the read
 * thread writes the value into; not in the index until the fetch is done on
 * the loop and the value checked out.
 * BUSY_G4: a G2 copy written to G4 straight from its slot (tier_remote_put()
 * at demotion, remote_write.c: the worker sums it, the write thread sends
 * it): off the LRUs, so nothing drops it or hands its slot to another block
 * until its SET is answered (or fails, or the write is dropped) and
 * write_release() clears it; a block killed meanwhile (a seal, a promotion,
 * a reload) is freed then. At most remote_max_inflight bytes of them, each
 * for remote_write_timeout at most. */
enum { BUSY_DOWN = 1, BUSY_WB = 2, BUSY_READ = 4, BUSY_UP = 8, BUSY_WAKE = 16, BUSY_PIN = 32,
       BUSY_FETCH = 64, BUSY_G4 = 128 };

/* A block held by the lower tiers: a tblock, with a G2 copy, a G3 copy or
 * both. Its state is its copies (run[L2], run[L3] and g3_ok), its busy flags
 * (a copy or I/O in flight, or its waiters running), dead and indexed:
 *
 *   tb_new --demote--> DOWN --copy done, G1 block freed--> G2 dirty <-----------+
 *                        |                                   |                   |
 *                        | cancelled (a lookup took the      | write-back        | write
 *                        | G1 block) or failed: freed,       v                   | failed
 *                        | never indexed                    WB (G3 slot written) -+
 *                                                            | written, journalled
 *                                                            v
 *   adopted after a restart --> G3 only <--drop G2-- G2 clean + G3 (g3_ok)
 *                                  |                    ^     |
 *                                  +--lookup: READ -----+     +--drop G3--> G2 dirty
 *                                     (G3 read into a new G2 slot and checked;
 *                                     a bad slot: both copies go, tb dies)
 *
 *   tb_new --G4 fetch handed to the read thread--> FETCH (a G2 slot only, the
 *                        value written into it there) --checked out, on the
 *                        loop--> G2 dirty; else freed, never indexed
 *
 *   any G2 copy --lookup--> UP (H2D copy into dst, a new G1 block): done, dst
 *                           is sealed under the hash, takes the index entry
 *                           and tb dies; failed, tb is as before
 *   losing its last copy (eviction, kv_tiers_forget(), a bad slot) --> dead:
 *                           out of the index, freed once no busy flag is left
 *
 * A READ that finds G1 room goes on to UP (both flags for a moment); WB and UP
 * can be under way together (a lookup promotes a block being written back);
 * WAKE is set while the waiters run (tb_wake_waiters()), whatever they do.
 * What holds (tb_state_problem() checks it, kv_tiers_check() reports it):
 *   - indexed, or dead, or DOWN, or FETCH: exactly one. Nothing in the index or on a
 *     list points at a dead tblock.
 *   - run[l] set: run[l]->occ[slot[l]] == tb. g3_ok: run[L3] set.
 *   - DOWN: no other flag, a G2 slot only, its bytes being copied in.
 *     FETCH: the same, its bytes being read from G4.
 *   - WB: a G2 copy and a G3 slot, !g3_ok. READ: a G3 copy (g3_ok), a G2 slot
 *     being filled, not WB. UP: a G2 copy.
 *   - idle (busy 0, not dead): a G2 copy, or a G3 copy only; a G3 slot only
 *     with g3_ok; the G2 copy on its tpool's clean list (g3_ok) or lru (dirty),
 *     the G3 copy on the G3 tpool's lru. Busy: on no LRU (eviction and
 *     write-back take only idle copies).
 *   - waiters non-empty only while READ or UP. failed only while WAKE.
 * Counted: G2's blocks are the G2 copies of tblocks past DOWN (a READ's slot
 * once read) and the swap slots; its dirty ones, those copies without g3_ok;
 * G3's blocks, the copies with g3_ok. */
struct tblock {
	struct kv_index_entry ix;  /* kind KV_ENTRY_TIER */
	struct kv_tiers *t;
	struct kv_pool *pool;
	struct srun *run[2];       /* [L2], [L3]; NULL = no copy there */
	uint16_t slot[2];
	uint8_t g3_ok;             /* the G3 copy is written and recorded */
	uint8_t busy;              /* BUSY_*: off the LRUs while any is set */
	uint8_t dead;              /* out of the index: freed once not busy */
	uint8_t failed;            /* its promotion just failed: lookups miss */
	uint8_t evict_g2;          /* drop the G2 copy once written back */
	uint8_t indexed;
	uint8_t ev;                /* media announced in KV events (tb_ev_sync()) */
	uint64_t tick;
	struct kv_list lru[2];     /* on its tpool's list of each level */
	struct kv_list all[2];     /* on the level's list (struct level) */
	struct kv_list waiters;    /* parked lookups */
	uint64_t dst;              /* promotion: the G1 block being filled */
	struct kv_disk_op dop;
	uint64_t dop_ns;           /* when dop was submitted (hist.h) */
	struct kv_job job;         /* the checksum of a write-back or a read (worker.h) */
	uint32_t job_crc;
	uint8_t g4_ok;             /* in G4 (written, or fetched from there) */
	uint8_t from_g4;           /* its G2 copy was fetched from G4 (a Lookup's tiers) */
	uint8_t g4_want;           /* its write-back copies it for G4 (g4_buf) */
	uint8_t *g4_buf;           /* header and payload for G4, made by that job */
	const uint8_t *g4_key;     /* its namespace's HMAC key (g4mac.h); NULL: none */
};

enum { OP_DEMOTE, OP_PROMOTE, OP_SWAP_OUT, OP_SWAP_IN };

struct copyop {
	int kind;
	uint32_t dev, n;
	uint64_t bytes;
	uint64_t start_ns;         /* when the copy started (hist.h) */
	struct kv_swap *sw;
	struct tblock *tb[BATCH];
	uint64_t h[BATCH];
	/* A demotion: the CRC32C of tb[i]'s payload where the copy summed it
	 * (sum bit i: its block goes to G4 at once; kv_copy.crc). */
	uint64_t sum;
	uint32_t crc[BATCH];
};

/* A swap: one session's blocks, parked in G2 slots that are not in the index
 * and on no LRU (occ is SWAP_SLOT), and, when G2 has fewer free slots than the
 * swap has blocks, in G3 slots too (occ SWAP_SLOT, never journalled: a swap
 * does not outlive the daemon). The swap holds k G2 slots; its first m
 * blocks go to G3 (k + m = n, k >= 1), staged through those slots in rounds
 * of up to k blocks: D2H into the slots, then written to disk; the last k
 * blocks then stay in the slots. swap_in reverses it: the G2 blocks first,
 * then rounds of G3 reads into the slots, checked, then H2D.
 *
 *   swap_out --> OUT_COPY --all moved, or a copy or write failed--> OUT or IN
 *                                                                    |
 *                 IN <--all in G1-- IN_COPY <--swap_in (new G1 blocks)-+ OUT
 *                  |                   +--a copy, read or check failed--> OUT, err = -EIO
 *                  v swap_in
 *          gone: the blocks are the caller's
 *
 * Each block is in one place, loc[i]: G1 (h[i] holds one reference on it),
 * G2 (block i >= m, in slot i - m), or G3 (in run3[i]/slot3[i]: block i < m, or any
 * block once evacuated).
 * A copy or disk I/O that fails leaves the block where it was: nothing is
 * lost, the swap rests in OUT with its blocks spread over G1, G2 and G3 (or
 * in IN when all are in G1), and the next swap_in moves what is not in G1.
 *
 *   OUT_COPY  blocks move out of G1 (one round in flight); IN_COPY: into
 *             new G1 blocks nh[i] (one reference each, for every block not in
 *             G1), a round in flight. Only these two states have waiters
 *             (swap_in requests) or dead set (the owner went: off its list,
 *             freed when the round in flight ends).
 *   OUT       some block is not in G1; err (-EIO) is reported by the next
 *             swap_in. IN: every block in G1 (swap_in hands h[] over).
 *   EVAC      from OUT, when a new swap finds G2 all swap slots: the G2
 *             blocks are written to new G3 slots (run3[i] set for blocks
 *             i >= m too), then the k G2 slots freed (k = 0); back to OUT.
 *             A write that fails keeps that block in G2 and every G2 slot
 *             (evac_failed: not tried again). swap_in with k = 0 first takes G2 slots to read
 *             through. Waiters and dead as in the _COPY states. */
enum { SW_OUT_COPY, SW_OUT, SW_IN_COPY, SW_IN, SW_EVAC };
enum { LOC_G1, LOC_G2, LOC_G3 };

struct kv_swap;

/* One staging slot's disk I/O in a round. */
struct swio {
	struct kv_disk_op dop;
	struct kv_job job;
	struct kv_swap *sw;
	uint32_t blk;              /* the block it moves */
	int res;                   /* 0, or why it failed */
	struct slot_hdr want;      /* a read: the header the slot must carry */
};

struct kv_swap {
	struct kv_list link;       /* the owner's list */
	struct kv_list all;        /* t->swaps */
	uint64_t id;
	struct kv_pool *pool;
	uint32_t n, k, m;
	int state, dead, err;
	struct kv_list waiters;
	struct srun **run;         /* [k] its G2 slots */
	uint16_t *slot;
	struct srun **run3;        /* [n] G3 slots (G3 on), NULL where none */
	uint16_t *slot3;
	uint8_t *loc;              /* [n] LOC_* */
	uint64_t *h;               /* [n] G1 blocks of loc G1 */
	uint64_t *nh;              /* [n] IN_COPY: the new G1 block of block i (0: none) */
	struct kv_tiers *t;
	uint32_t cur;              /* the next block a round takes */
	uint32_t batch;            /* blocks the step in flight moves */
	uint8_t phase_g2;          /* IN_COPY: the step in flight copies G2 blocks */
	uint8_t phase_copy;        /* IN_COPY: ... copies a G3 round's blocks */
	uint8_t evac_failed;       /* an evacuation of it failed: not tried again */
	uint32_t pending;          /* disk I/Os and checks of the round in flight */
	int rerr;                  /* a round failed: stop after it */
	struct swio *io;           /* [n] (G3 on) */
};

/* A tier I/O path that fails backs off (engine.c): copies between G1 and G2
 * (BO_COPY) and G3's disk I/O (BO_DISK). After a failure no new I/O of that
 * path starts for BO_BASE_MS, doubled per failed round up to BO_MAX_MS
 * (failures of I/O started before the round began do not count again):
 * the watermarks (demotion, write-back) start none, what they would have
 * moved stays where it is (G1, G2 dirty). A lookup's promotion still tries
 * (one I/O per lookup, which a failing read then drops or misses: no spin),
 * and so do an operator's Evict and Flush. One warning per BO_LOG_MS with the
 * count since (promotions' failures included); the first success ends it. The daemon kicks the tiers when the wait ends
 * (kv_tiers_retry_ms()). */
enum { BO_COPY, BO_DISK, BO_N };
#define BO_BASE_MS 10
#define BO_MAX_MS 5000
#define BO_LOG_MS 5000

struct tier_backoff {
	uint32_t rounds;           /* failed rounds in a row (0: healthy) */
	uint64_t until_ms;         /* no new I/O before (kv_mono_ms()) */
	uint64_t logged_ms;        /* the last line logged */
	uint64_t quiet;            /* failures since, not logged */
	uint64_t total;            /* rounds ever (stats: backoffs) */
};

struct kv_tiers {
	struct kv_pools *ps;
	struct kv_backend *be;
	struct kv_tiers_config cfg;
	uint64_t page_bytes;
	uint8_t *g2;
	uint64_t g2_bytes;
	struct level lv[2];
	struct kv_disk disk;
	struct kv_journal jr;
	uint64_t jlive;            /* records a rewrite would write */
	struct kv_worker wk;       /* checksums and the journal's writes (G3 on) */
	int jactive;               /* a compaction is walking the pages */
	uint32_t jpage;            /* the next page it looks at */
	struct kv_list dormant;    /* G3 runs no pool has claimed since the restart */
	struct kv_list swaps;
	struct kv_list space_waiters;  /* requests waiting for a copy to end: lookups for
					G2 staging room, allocations for demotions */
	uint64_t entries;          /* tblocks in the index */
	uint64_t tick, next_swap;
	uint64_t down_bytes[KV_MAX_DEVICES];  /* demotion copies in flight */
	uint8_t demoting[KV_MAX_DEVICES], writing_back;
	/* kv_tiers_destroy() has begun: no copy or disk I/O starts (the
	 * watermarks do nothing, new ones fail with -ESHUTDOWN); what is in
	 * flight finishes. */
	uint8_t stopping;
	uint8_t flushing;          /* a Flush waits for kv_tiers_durable() (admin.c) */
	struct tier_backoff bo[BO_N];
	void (*retry)(void *ctx, uint64_t ms);  /* kv_tiers_on_retry() */
	void *retry_ctx;
	struct kv_g4 *g4;          /* remote.c, remote_int.h; NULL: no G4 */
	/* Called by tb_drop_g2() for a copy G3 does not hold, before it goes:
	 * remote.c's, set when G4 is on (a pointer, so that slots.c stays
	 * below remote*.c, which allocate slots). */
	void (*g2_dropping)(struct kv_tiers *t, struct tblock *tb);
	uint64_t wb_bytes;         /* write-backs in flight (G2 slot bytes) */
	uint64_t dirty_bytes;      /* G2 slot bytes of dirty copies */
	uint64_t swap_bytes;       /* G2 slot bytes of swapped blocks */
	struct kv_tier_stats g1;
	uint64_t layout_id[KV_MAX_POOLS];  /* per pool id: names its layout across restarts */
	struct kv_hist hist[KV_TIER_HISTS];
};

/* ---- between the files ---------------------------------------------------- */

/* engine.c: runs job on the worker thread (run(), then done() from the loop
 * later), or both right away when the worker could not start. */
void tier_offload(struct kv_tiers *t, struct kv_job *job, kv_job_fn run, kv_job_fn done);
/* A copy or disk I/O of path (BO_*) failed: what failed, printf-style, for
 * the warning (logged at most once per BO_LOG_MS). Starts or extends the
 * backoff. */
void tier_io_failed(struct kv_tiers *t, int path, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* One succeeded: the path is healthy again. */
void tier_io_ok(struct kv_tiers *t, int path);
/* Whether path is backing off: no new I/O of it is to start. */
int tier_io_held(const struct kv_tiers *t, int path);
/* The backend's copy_async, refused (-ESHUTDOWN) once the tiers stop. */
int tier_copy_async(struct kv_tiers *t, uint32_t dev, enum kv_copy_dir dir,
		    const struct kv_copy *c, uint32_t n, void *op);

/* adopt.c: a step of the journal's compaction while the loop runs, begun
 * when the file holds more than twice what is live. */
void tier_journal_step(struct kv_tiers *t);

/* slots.c: where a slot's bytes are, the G3 journal records, runs and slots */
uint8_t *tier_g2_addr(struct kv_tiers *t, const struct srun *r, uint32_t s);
uint64_t tier_g3_offset(struct kv_tiers *t, const struct srun *r, uint32_t s);
/* Appends a KV_J_* record (a warning, not an error, when that fails: the
 * next start may then miss blocks) and keeps t->jlive. */
void tier_journal_append(struct kv_tiers *t, int type, const struct srun *r, uint32_t slot,
			 const uint8_t *hash);
/* The tpool of p in tier l (swap: of its swaps' slots), made on first use;
 * NULL when l is off or out of memory. Its slots hold a header and
 * kv_pool_stored_bytes(p) (swap: block_bytes) rounded to 4 KiB. */
struct tpool *tpool_get_or_create(struct kv_tiers *t, int l, struct kv_pool *p, int swap);
/* A run of nslots empty slots, not on any list; dormant: with the per-slot
 * hashes a replayed run carries. NULL when out of memory. */
struct srun *srun_new(uint32_t nslots, int dormant);
void srun_free(struct srun *r);
/* Links the slots that hold nothing into r's free chain. */
void srun_build_free_chain(struct srun *r);
/* Gives r's pages back to tier l and frees r (journalled in G3); the slots a
 * dormant run still holds stop counting as used. */
void srun_release(struct kv_tiers *t, int l, struct srun *r);
/* A free slot of tier l for pool p, for occ (a tblock or SWAP_SLOT): from a
 * partial run, a new run, or by evicting idle copies. Returns 0 with *run and
 * *slot set, or -ENOSPC. */
int slot_alloc(struct kv_tiers *t, int l, struct kv_pool *p, struct tblock *occ,
	       struct srun **run, uint16_t *slot);
/* slot_alloc() in G2 that drops no dirty copy, its own namespace's
 * included: what it evicts, G3 holds (a G4 read-ahead's, remote_read.c: the
 * copies fetched for a lookup and not yet promoted are dirty). */
int slot_alloc_clean(struct kv_tiers *t, struct kv_pool *p, struct tblock *occ,
		     struct srun **run, uint16_t *slot);
/* slot_alloc() in G2 from free room only (a partial run or free pages),
 * within the namespace's quota without dropping anything: evicts nothing
 * (a G4 fetch's slots, taken before anyone knows whether the blocks are
 * there). */
int slot_alloc_free(struct kv_tiers *t, struct kv_pool *p, struct tblock *occ,
		    struct srun **run, uint16_t *slot);
/* The oldest idle copy in tier l of any pool: on the tpools' clean lists
 * (G2 only) or on their lru lists (in G2, the dirty copies). NULL if none. */
struct tblock *tier_oldest_idle(struct kv_tiers *t, int l, int clean);
/* Frees slot s of r (occupied); the run goes when its last slot does. */
void slot_put(struct kv_tiers *t, int l, struct srun *r, uint32_t s);
/* The namespace field of p's slot headers: XXH3-64 of its namespace's name. */
uint64_t slot_hdr_ns(struct kv_tiers *t, const struct kv_pool *p);
/* The header that tb's slot carries, with payload CRC32C crc. */
void slot_hdr_fill(struct kv_tiers *t, struct tblock *tb, struct slot_hdr *h, uint32_t crc);
/* Puts the payload's crc in h and the header's own checksum (any thread). */
void slot_hdr_seal(struct slot_hdr *h, uint32_t crc);

/* slots.c: tier blocks */
/* Charges (d = 1) or gives back (d = -1) one slot of run r (of a pool) to
 * the pool's namespace's usage of tier l (ns.h). */
void slot_charge(struct kv_tiers *t, int l, const struct srun *r, int d);
/* A tblock of pool p (which it holds) under hash, born at born_ms (the
 * prefix's first seal), in no state yet. */
struct tblock *tb_new(struct kv_tiers *t, struct kv_pool *p, const uint8_t *hash,
		     uint64_t born_ms);
/* Frees tb's memory and puts its hold on its pool (its slots are gone). */
void tb_dealloc(struct tblock *tb);
/* Puts tb in the index under its hash (no entry may be there). */
void tb_index(struct kv_tiers *t, struct tblock *tb);
/* Takes tb out of the index (if it is in) and marks it dead; frees it now
 * when idle, else when its last busy flag clears. */
void tb_kill(struct kv_tiers *t, struct tblock *tb);
/* KV events: announces the media tb's copies are in now (a G2 copy that is
 * read or being filled is not one yet), and withdraws those it left; all of
 * them once tb is out of the index. Idempotent: called wherever copies or
 * flags change (tb_index, tb_kill, tb_set_idle, the completions). */
void tb_ev_sync(struct kv_tiers *t, struct tblock *tb);
/* Frees tb's slots and tb (not busy; out of the index or never in it). */
void tb_free(struct kv_tiers *t, struct tblock *tb);
/* Puts idle tb on the LRU lists its copies belong to, as the newest. */
void tb_set_idle(struct kv_tiers *t, struct tblock *tb);
/* Sets busy flag (off the LRUs while any is set). */
void tb_busy_set(struct tblock *tb, int flag);
/* Clears flag; when none is left, frees tb if dead, else makes it idle. */
void tb_busy_clear(struct kv_tiers *t, struct tblock *tb, int flag);
/* What breaks the rules above (drawn over struct tblock), or NULL. */
const char *tb_state_problem(const struct tblock *tb);
/* kv_assert() of those rules, with the broken one in the message. */
#ifdef NDEBUG
#define tb_assert_state(tb) ((void)0)
#else
#define tb_assert_state(tb)                                                          \
	do {                                                                          \
		const char *tb_why_ = tb_state_problem(tb);                           \
		if (tb_why_)                                                          \
			kv_assert_fail(tb_why_, __FILE__, __LINE__, __func__);        \
	} while (0)
#endif
/* Drops idle tb's G2 (G3) copy; with no copy left tb is killed. */
void tb_drop_g2(struct kv_tiers *t, struct tblock *tb);
void tb_drop_g3(struct kv_tiers *t, struct tblock *tb);
/* Counts tb's G2 copy as dirty (d = 1) or no longer dirty (d = -1). */
void g2_dirty_add(struct kv_tiers *t, const struct tblock *tb, int d);

/* admin.c: after a Flush, writes back what has landed in G2 dirty since,
 * until kv_tiers_durable() (each kick). */
void tier_flush_step(struct kv_tiers *t);

/* demote.c */
/* Starts copying the oldest cached blocks of dev (of only, when set) into G2
 * until want bytes are under way. Returns the bytes started. */
uint64_t tier_demote(struct kv_tiers *t, uint32_t dev, struct kv_pool *only, uint64_t want);
void tier_demote_done(struct kv_tiers *t, struct copyop *op, int res);
/* The G1 watermarks: demotes on the devices under g1_low percent free. */
void tier_demote_kick(struct kv_tiers *t);

/* writeback.c */
/* Starts writing idle tb's dirty G2 copy to G3. Returns 0 or -ENOSPC. */
int tier_writeback_start(struct kv_tiers *t, struct tblock *tb);
/* The G2 watermarks: writes back when under g2_low percent of G2 is
 * free or clean. */
void tier_writeback_kick(struct kv_tiers *t);

/* promote.c */
void tier_promote_done(struct kv_tiers *t, struct copyop *op, int res);

/* swap.c */
void tier_swap_done(struct kv_tiers *t, struct copyop *op, int res);
/* Frees sw's G2 and G3 slots and sw, and takes it off t->swaps; with unref,
 * puts the G1 references it holds too (h[] of blocks in G1, nh[]). The
 * owner's list is the caller's to handle. */
void tier_swap_free(struct kv_tiers *t, struct kv_swap *sw, int unref);

/* adopt.c */
/* Rewrites the G3 journal with only what is live now. */
void tier_journal_compact(struct kv_tiers *t);
/* Opens G3 (t->cfg.disk_path; G2 is set up) and replays its journal: the
 * runs a previous daemon left wait on t->dormant for their pools. Returns 0
 * or -errno with err set; kv_tiers_destroy() frees what was opened. */
int tier_g3_open(struct kv_tiers *t, char *err, size_t errlen);

/* remote.c, remote_write.c, remote_read.c (remote_stub.c without hiredis): G4 */
/* Connects nothing yet: starts the client's threads when remote_seeds is
 * set (after G3, when there is one). Returns 0 or -errno with err set. */
int tier_remote_open(struct kv_tiers *t, char *err, size_t errlen);
/* Stops the threads (what is queued runs) and frees G4. */
void tier_remote_close(struct kv_tiers *t);
/* The done()s of G4's finished jobs (from kv_tiers_disk_done()). */
void tier_remote_reap(struct kv_tiers *t);
/* Whether tb goes to G4 now (reserves the room): when is KV_G4W_WRITEBACK
 * (its write-back to G3, or G2 dropping it without G3) or KV_G4W_DEMOTE
 * (it came down into G2), against its namespace's remote_write. */
int tier_remote_want(struct kv_tiers *t, struct tblock *tb, int when);
/* Loop, tb's G2 slot holding its payload: when tier_remote_want() says so,
 * a G4 value of it is made and written: at demotion (KV_G4W_DEMOTE; tb idle,
 * and it stays) the slot is held BUSY_G4 while the worker sums it and the
 * write thread sends it from where it lies, until the SET's reply;
 * otherwise (G2 is about to drop it, or a flush walks the LRU) the loop
 * copies it and the worker sums the copy. Returns 1 when a write is under
 * way. */
int tier_remote_put(struct kv_tiers *t, struct tblock *tb, int when);
/* tier_remote_put() with crc NULL, or the CRC32C of tb's payload in its G2
 * slot as the demotion's copy summed it (kv_copy.crc): the worker does
 * not read it again, and without a tag the write goes to its write thread
 * with no seal job (issue 38). */
int tier_remote_put_sum(struct kv_tiers *t, struct tblock *tb, int when, const uint32_t *crc);
/* Whether a block of pool p demoted now goes to G4 at once (G4 on, its
 * namespace remote with remote_write = demote): its demotion's copy sums
 * it then. */
int tier_remote_demotes(struct kv_tiers *t, const struct kv_pool *p);
/* Whether a G4 value of len bytes at data is the block want describes
 * (want: the header it must carry, hash included, CRCs aside): its length
 * (header, want->payload_len, and a tag when mac_key), header and CRC32Cs,
 * and with mac_key its HMAC-SHA-256 tag (g4mac.h). Any thread; reads no
 * more than len bytes. */
enum { G4_VALUE_GOOD, G4_VALUE_OVERSIZE, G4_VALUE_BAD, G4_VALUE_BAD_TAG };
int tier_remote_check(const struct slot_hdr *want, const uint8_t *mac_key, const void *data,
		      size_t len);
/* Worker thread, slot busy: header and payload into tb->g4_buf. */
void tier_remote_copy(struct tblock *tb, const uint8_t *slot);
/* G2 copies held BUSY_G4 now (their values being summed or sent from
 * their slots): counted in G2's inflight in Stats, so that what waits for the
 * tiers to settle waits for them too (an Evict of G2 does not drop them). */
uint64_t tier_remote_held(const struct kv_tiers *t);
/* Loop: tb->g4_buf (or its absence: the room goes back) joins the writes. */
void tier_remote_queue(struct kv_tiers *t, struct tblock *tb);
/* Check: adds each G4 fetch's hold on its pool (queued or being read) to
 * the pool's check_holds. */
void tier_remote_count_holds(struct kv_tiers *t);

/* engine.c */
/* Runs every waiter on waiters (moved off it first: a wake may park again). */
void tier_wake_all(struct kv_list *waiters);
/* Sets up tier l over bytes (rounded down to whole segments of at most 1 GiB
 * of pages). Returns 0 or -errno. */
int tier_level_init(struct kv_tiers *t, int l, uint64_t bytes);

#endif
