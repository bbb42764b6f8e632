/* The page allocator of one device: segments cut into fixed pages.
 *
 * Pages are handed out as runs of n contiguous pages inside one segment (a
 * segment is mapped whole by clients, so a run never straddles two). Each
 * segment belongs to at most one namespace at a time: pages of a segment go
 * only to pools of the namespace that owns it, and a segment is free for
 * another namespace once all its pages are free. The segment fd is the
 * capability, so a client never receives an fd holding another tenant's data.
 *
 * Runs are rare events (one per blocks_per_run allocations); a search is a
 * first-fit scan over the free bitmap of candidate segments.
 *
 * Page and segment states (kv_pools_check() verifies them for the devices'
 * pages; kv_pages_free() asserts its part):
 *
 *   page:    FREE (bit set, owner NULL) --alloc / claim--> USED (bit clear,
 *            owner: what the caller passed, or set) --free--> FREE
 *   segment: UNOWNED (ns 0, used 0) --a page taken for ns--> OWNED (ns,
 *            used >= 1) --its last page freed--> UNOWNED (last_ns kept)
 *
 * Pages go back exactly as they were handed out: kv_pages_free() of pages
 * that are free already, or of a range spanning two owners or two segments,
 * is the caller's bug and fails an assertion. pool.c passes a NULL owner to
 * kv_pages_alloc() and fills owner[] in once its run exists. */
#ifndef KV_PAGES_H
#define KV_PAGES_H

#include <stdint.h>

/* last_ns of a segment whose last owner is gone: its id may be another
 * namespace's by now, and no namespace id equals this. */
#define KV_PAGES_NS_GONE UINT32_MAX

struct kv_pages_seg {
	uint32_t ns;        /* owning namespace id, 0 = none */
	uint32_t last_ns;   /* the last owner: its clients may still map it;
			     * KV_PAGES_NS_GONE once that namespace is gone */
	uint32_t used;      /* pages in use */
};

struct kv_pages {
	uint32_t dev;
	uint64_t page_bytes, segment_bytes;
	uint32_t nsegs, pages_per_seg, npages, nfree;
	uint32_t free_segs;           /* segments no namespace owns */
	uint64_t *free_bits;          /* bit set = page free */
	void **owner;                 /* per page: the run that holds it, or NULL */
	uint32_t *gen;                /* per page: generation floor for a new run here */
	struct kv_pages_seg *segs;
};

/* Returns 0 or -EINVAL (sizes not multiples) / -ENOMEM. */
int kv_pages_init(struct kv_pages *p, uint32_t dev, uint32_t nsegs, uint64_t segment_bytes,
		  uint64_t page_bytes);
void kv_pages_fini(struct kv_pages *p);

/* Claims n contiguous free pages inside one segment owned by ns, or else in a
 * free segment, which then becomes ns's (*new_owner set to 1 when that segment
 * had another owner before, so the caller must give it fresh memory) unless
 * that would leave fewer than keep_free free segments (held back for other
 * namespaces' reserves). Returns the first page, or -ENOSPC. */
int64_t kv_pages_alloc(struct kv_pages *p, uint32_t n, uint32_t ns, void *owner, int *new_owner,
		       uint32_t keep_free);

/* Records that segment seg got fresh memory for its current owner: the
 * earlier owner's clients can no longer reach what is in it. Until this is
 * called, kv_pages_alloc() keeps reporting the segment as new_owner. */
void kv_pages_fresh(struct kv_pages *p, uint32_t seg);

/* Claims exactly pages [first, first + n) for ns (a warm restart putting
 * back what a journal recorded). Returns 0, or -EBUSY when any is taken or
 * the range leaves its segment. */
int kv_pages_claim(struct kv_pages *p, uint32_t first, uint32_t n, uint32_t ns, void *owner);

/* Namespace ns is gone and its id may name another namespace next: every
 * segment ns owned last counts as another owner's, so the next to take it
 * gets fresh memory. No segment may be owned by ns now. */
void kv_pages_forget_ns(struct kv_pages *p, uint32_t ns);

/* Returns n pages from first on: in use, of one owner and one segment. */
void kv_pages_free(struct kv_pages *p, uint32_t first, uint32_t n);

static inline uint32_t kv_pages_seg_of(const struct kv_pages *p, uint32_t page)
{
	return page / p->pages_per_seg;
}

#endif
