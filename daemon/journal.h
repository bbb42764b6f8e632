/* The disk tier's index journal: what lets a restarted daemon find its
 * cached blocks on disk again (warm restart).
 *
 * An append-only file of 64-byte records after a 64-byte header; each record
 * carries a CRC32C, so a torn tail (a crash mid-append) ends the replay there.
 * Appends are plain write()s to the page cache: they survive kill -9 of the
 * daemon; kv_journal_rewrite() (start, clean stop, and when the file grows
 * past twice what is live) writes a compact copy, fsyncs it and renames it
 * over the old one. The records only tell where to look: every slot read
 * from disk is checked against its own header and checksum anyway, so a
 * journal that is behind the disk costs misses, never wrong data.
 * docs/tiers.md has the format. */
#ifndef KV_JOURNAL_H
#define KV_JOURNAL_H

#include <stddef.h>
#include <stdint.h>

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
	int fd;
	char path[256];
	uint64_t page_bytes, disk_bytes;
	uint64_t records;   /* in the file now */
	uint64_t errors;
};

/* Opens path and calls replay(ctx, rec) for each intact record of a journal
 * written for the same page_bytes and disk_bytes (another geometry, a bad
 * header or no file: nothing replayed). Returns 0 or -errno with err set. */
int kv_journal_open(struct kv_journal *j, const char *path, uint64_t page_bytes,
		    uint64_t disk_bytes, void (*replay)(void *ctx, const struct kv_jrec *r),
		    void *ctx, char *err, size_t errlen);
void kv_journal_close(struct kv_journal *j);

/* Appends r (its crc is filled in). Returns 0 or -errno. */
int kv_journal_append(struct kv_journal *j, struct kv_jrec *r);

/* Replaces the file by a header and the records next(ctx, &rec) yields until
 * it returns 0; fsyncs and renames. Returns 0 or -errno (the old file stays). */
int kv_journal_rewrite(struct kv_journal *j, int (*next)(void *ctx, struct kv_jrec *r), void *ctx);

#endif
