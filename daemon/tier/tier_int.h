/* The lower tiers' internals, shared by the files of daemon/tier/ and by
 * nothing else: the slot format, the tier structures and the functions one
 * file calls in another. tier.h is the interface to the rest of the daemon. */
#ifndef KV_TIER_INT_H
#define KV_TIER_INT_H

#include <stdint.h>

#include "disk.h"
#include "journal.h"
#include "tier.h"

#define HDR_BYTES 4096u       /* a slot starts with its header, then the payload */
#define SLOT_MAGIC 0x31544c5333475648ull  /* "HVG3SLT1" */
#define SLOT_VERSION 1
#define BATCH 64              /* copies per copy_async */
#define L2 0                  /* index into t->lv[] */
#define L3 1

/* The header at the start of every slot (G2 and G3 alike, so a write-back
 * is one write of the whole slot). docs/architecture.md has the format. */
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
	struct kv_tier_stats st;
};

enum { BUSY_DOWN = 1, BUSY_WB = 2, BUSY_READ = 4, BUSY_UP = 8, BUSY_WAKE = 16 };

/* A block held by the lower tiers. */
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
	uint64_t tick;
	struct kv_list lru[2];
	struct kv_list waiters;    /* parked lookups */
	uint64_t dst;              /* promotion: the G1 block being filled */
	struct kv_disk_op dop;
};

enum { OP_DEMOTE, OP_PROMOTE, OP_SWAP_OUT, OP_SWAP_IN };

struct copyop {
	int kind;
	uint32_t dev, n;
	uint64_t bytes;
	struct kv_swap *sw;
	struct tblock *tb[BATCH];
	uint64_t h[BATCH];
};

enum { SW_OUT_COPY, SW_OUT, SW_IN_COPY, SW_IN };

struct kv_swap {
	struct kv_list link;       /* the owner's list */
	struct kv_list all;        /* t->swaps */
	uint64_t id;
	struct kv_pool *pool;
	uint32_t n;
	int state, dead, err;
	struct kv_list waiters;
	struct srun **run;
	uint16_t *slot;
	uint64_t *h;               /* G1 blocks: SW_OUT_COPY, SW_IN_COPY, SW_IN */
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
	struct kv_list dormant;    /* G3 runs no pool has claimed since the restart */
	struct kv_list swaps;
	struct kv_list space_waiters;  /* lookups waiting for G2 staging room */
	uint64_t entries;          /* tblocks in the index */
	uint64_t tick, next_swap;
	uint64_t down_bytes[KV_MAX_DEVICES];  /* demotion copies in flight */
	uint8_t demoting[KV_MAX_DEVICES], writing_back;
	uint64_t wb_bytes;         /* write-backs in flight (G2 slot bytes) */
	uint64_t dirty_bytes;      /* G2 slot bytes of dirty copies */
	uint64_t swap_bytes;       /* G2 slot bytes of swapped blocks */
	struct kv_tier_stats g1;
};

/* Replay: builds dormant runs indexed by their first page. */
struct replay {
	struct kv_tiers *t;
	struct srun **at;   /* per page: the dormant run starting there */
	uint32_t npages;
};

/* ---- between the files ---------------------------------------------------- */

uint8_t *g2_slot(struct kv_tiers *t, const struct srun *r, uint32_t s);
uint64_t g3_off(struct kv_tiers *t, const struct srun *r, uint32_t s);
void jappend(struct kv_tiers *t, int type, const struct srun *r, uint32_t slot,
	     const uint8_t *hash);
struct tpool *tpool_get(struct kv_tiers *t, int l, struct kv_pool *p);
struct srun *srun_alloc(uint32_t nslots, int dormant);
void srun_free(struct srun *r);
void srun_chain(struct srun *r);
void run_release(struct kv_tiers *t, int l, struct srun *r);
void slot_put(struct kv_tiers *t, int l, struct srun *r, uint32_t s);
void dirty_add(struct kv_tiers *t, const struct tblock *tb, int d);
void tb_idle(struct kv_tiers *t, struct tblock *tb);
void tb_free(struct kv_tiers *t, struct tblock *tb);
void tb_kill(struct kv_tiers *t, struct tblock *tb);
void tb_busy(struct tblock *tb, int flag);
void tb_unbusy(struct kv_tiers *t, struct tblock *tb, int flag);
struct tblock *tb_new(struct kv_tiers *t, struct kv_pool *p, const uint8_t *hash);
void tb_index(struct kv_tiers *t, struct tblock *tb);
void drop_g2(struct kv_tiers *t, struct tblock *tb);
void drop_g3(struct kv_tiers *t, struct tblock *tb);
int slot_alloc(struct kv_tiers *t, int l, struct kv_pool *p, struct tblock *occ,
	       struct srun **run, uint16_t *slot);
void hdr_fill(struct kv_tiers *t, struct tblock *tb, struct slot_hdr *h, uint32_t crc);
void wake_all(struct kv_list *waiters);
uint64_t demote(struct kv_tiers *t, uint32_t dev, struct kv_pool *only, uint64_t want);
void demote_done(struct kv_tiers *t, struct copyop *op, int res);
int writeback(struct kv_tiers *t, struct tblock *tb);
struct tblock *oldest_dirty(struct kv_tiers *t);
void up_done(struct kv_tiers *t, struct copyop *op, int res);
void swap_free(struct kv_tiers *t, struct kv_swap *sw);
void swap_done(struct kv_tiers *t, struct copyop *op, int res);
void journal_compact(struct kv_tiers *t);
void replay_rec(void *ctx, const struct kv_jrec *rec);
uint64_t replay_finish(struct kv_tiers *t, struct replay *rp);

#endif
