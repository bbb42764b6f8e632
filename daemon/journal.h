/* The disk tier's index journal: what lets a restarted daemon find its
 * cached blocks on disk again (warm restart).
 *
 * An append-only file of 64-byte records after a 64-byte header; each record
 * carries a CRC32C, so a torn tail (a crash mid-append) ends the replay there.
 * Appends are plain write()s to the page cache: they survive kill -9 of the
 * daemon. A rewrite writes a compact copy, fsyncs it and renames it over the
 * old one: kv_journal_rewrite() all at once (start and clean stop, before the
 * loop runs and after it stops), kv_journal_compact_*() a chunk at a time
 * while the daemon serves. The records only tell where to look: every slot
 * read from disk is checked against its own header and checksum anyway, so a
 * journal that is behind the disk costs misses, never wrong data.
 * docs/tiers.md has the format.
 *
 * Asynchronous mode (kv_journal_attach(), while the loop runs): appends and
 * compaction chunks are staged in memory and written by the worker thread
 * (worker.h), in order, so no write(), fsync() or rename() happens on the
 * loop. During a compaction every append goes to the old file and to the new
 * one; the new file is the snapshot's chunks interleaved with the appends
 * made between them, which replays to the same state, because each record
 * sets what it names (a run: made anew; a slot: set or cleared; records
 * about a run the replay does not know are ignored) and a chunk holds every
 * live slot of its runs at the moment it was made. */
#ifndef KV_JOURNAL_H
#define KV_JOURNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "worker.h"

struct jbatch;
struct kv_journal;

/* A job without records (begin and end of a compaction). */
struct kv_jctl {
	struct kv_job job;
	struct kv_journal *j;
	int kind;
};

enum kv_jrec_type {
	KV_J_RUN = 1,       /* pages [page, page + npages) hold a run of layout, slot_bytes */
	KV_J_RUN_FREE = 2,  /* the run at page is gone */
	KV_J_SLOT = 3,      /* slot of the run at page holds hash */
	KV_J_SLOT_FREE = 4, /* slot of the run at page is empty */
};

struct kv_jrec {
	uint32_t crc;       /* CRC32C of the 60 bytes that follow */
	uint8_t type;
	uint8_t pad;
	uint16_t slot;
	uint32_t page;
	uint32_t npages;
	uint32_t slot_bytes;
	uint32_t nslots;
	uint64_t layout;
	uint8_t hash[32];
};

_Static_assert(sizeof(struct kv_jrec) == 64, "journal records are 64 bytes");

struct kv_journal {
	int fd;             /* asynchronous mode: the worker's */
	int newfd;          /* the worker's: the compaction's file, -1 for none */
	int new_failed;     /* the worker's: a write to newfd failed */
	uint64_t new_records;
	char path[256];
	uint64_t page_bytes, disk_bytes;
	_Atomic uint64_t records;   /* in the file now */
	_Atomic uint64_t errors;
	/* Records lost (an append that failed or could not be staged, a
	 * compaction chunk's record that could not be), and how many had been
	 * lost when the last rewrite or compaction that committed began: the
	 * file holds every live record only while they are equal. */
	_Atomic uint64_t lost;
	_Atomic uint64_t covered;
	uint64_t lost_begin;        /* lost when the compaction under way began */
	/* Asynchronous mode: the loop's side. */
	struct kv_worker *w;        /* NULL: synchronous */
	struct jbatch *stage;       /* appends not handed to the worker yet */
	struct jbatch *snap;        /* a compaction chunk being made */
	struct kv_jctl begin, end;
	_Atomic uint64_t unwritten; /* appends handed to the worker, not written yet */
	int compacting;             /* begun, and the worker has not committed */
	_Atomic int committed;      /* set by the worker when it has */
};

/* Opens path and calls replay(ctx, rec) for each intact record of a journal
 * written for the same page_bytes and disk_bytes (another geometry, a bad
 * header or no file: nothing replayed). Returns 0 or -errno with err set. */
int kv_journal_open(struct kv_journal *j, const char *path, uint64_t page_bytes,
		    uint64_t disk_bytes, void (*replay)(void *ctx, const struct kv_jrec *r),
		    void *ctx, char *err, size_t errlen);
void kv_journal_close(struct kv_journal *j);

/* Appends r (its crc is filled in). Synchronous mode: written now; returns 0
 * or -errno. Asynchronous: staged until kv_journal_flush(); returns 0 or
 * -ENOMEM (the record is lost, and counted in errors). */
int kv_journal_append(struct kv_journal *j, struct kv_jrec *r);

/* Replaces the file by a header and the records next(ctx, &rec) yields until
 * it returns 0; fsyncs and renames. Synchronous mode only. Returns 0 or
 * -errno (the old file stays). */
int kv_journal_rewrite(struct kv_journal *j, int (*next)(void *ctx, struct kv_jrec *r), void *ctx);

/* Asynchronous mode from now on: writes go through w (started). */
void kv_journal_attach(struct kv_journal *j, struct kv_worker *w);
/* Synchronous again: hands over what is staged and waits for the worker to
 * write it (the loop has stopped). A compaction not committed is dropped. */
void kv_journal_detach(struct kv_journal *j);
/* Hands the staged appends to the worker. */
void kv_journal_flush(struct kv_journal *j);
/* Appends not in the file yet (staged, or handed over and not written): in
 * asynchronous mode what a kill -9 now would lose. 0 in synchronous mode. */
uint64_t kv_journal_pending(const struct kv_journal *j);

/* Whether a record was lost since the last rewrite or compaction that
 * committed began: a kill -9 now would lose blocks from the warm restart
 * until the next one commits. */
int kv_journal_behind(const struct kv_journal *j);

/* A compaction while the loop runs: begin, then add every live record over
 * any number of turns (kv_journal_compact_push() hands each chunk over, after
 * the appends staged before it), then end; the worker fsyncs and renames.
 * begin returns -EBUSY while the previous one is not committed. */
int kv_journal_compact_begin(struct kv_journal *j);
int kv_journal_compact_add(struct kv_journal *j, const struct kv_jrec *r);
void kv_journal_compact_push(struct kv_journal *j);
void kv_journal_compact_end(struct kv_journal *j);
/* Whether a compaction has begun and the worker has not committed it. */
int kv_journal_compacting(struct kv_journal *j);

#endif
