#include "pages.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "kvassert.h"

static int bit_get(const uint64_t *b, uint32_t i)
{
	return (int)(b[i / 64] >> (i % 64)) & 1;
}

static void bit_set(uint64_t *b, uint32_t i, int v)
{
	if (v)
		b[i / 64] |= 1ull << (i % 64);
	else
		b[i / 64] &= ~(1ull << (i % 64));
}

int kv_pages_init(struct kv_pages *p, uint32_t dev, uint32_t nsegs, uint64_t segment_bytes,
		  uint64_t page_bytes)
{
	uint64_t pages;
	uint32_t i;

	memset(p, 0, sizeof(*p));
	if (!page_bytes || !nsegs || segment_bytes % page_bytes || segment_bytes < page_bytes)
		return -EINVAL;
	pages = segment_bytes / page_bytes * nsegs;
	if (pages > (1u << 20))  /* the page field of a block handle */
		return -EINVAL;
	p->dev = dev;
	p->page_bytes = page_bytes;
	p->segment_bytes = segment_bytes;
	p->nsegs = p->free_segs = nsegs;
	p->pages_per_seg = (uint32_t)(segment_bytes / page_bytes);
	p->npages = p->nfree = (uint32_t)pages;
	p->free_bits = calloc((pages + 63) / 64, sizeof(uint64_t));
	p->owner = calloc(pages, sizeof(void *));
	p->gen = calloc(pages, sizeof(uint32_t));
	p->segs = calloc(nsegs, sizeof(*p->segs));
	if (!p->free_bits || !p->owner || !p->gen || !p->segs) {
		kv_pages_fini(p);
		return -ENOMEM;
	}
	for (i = 0; i < p->npages; i++)
		bit_set(p->free_bits, i, 1);
	/* Generations start at random: a handle from before a restart of the
	 * daemon names a block of the new one only by a 1 in 2^20 chance (and
	 * even then only one its session holds), so a client that reconnects
	 * gets KV_ESTALE for its old handles. */
	if (getrandom(p->gen, pages * sizeof(uint32_t), 0) != (ssize_t)(pages * sizeof(uint32_t)))
		memset(p->gen, 0, pages * sizeof(uint32_t));
	for (i = 0; i < p->npages; i++)
		p->gen[i] &= 0x7fffffffu;  /* room to count up in 32 bits */
	return 0;
}

void kv_pages_fini(struct kv_pages *p)
{
	free(p->free_bits);
	free(p->owner);
	free(p->gen);
	free(p->segs);
	memset(p, 0, sizeof(*p));
}

/* First fit of n free pages inside segment s, or -1. */
static int64_t seg_find(const struct kv_pages *p, uint32_t s, uint32_t n)
{
	uint32_t first = s * p->pages_per_seg, end = first + p->pages_per_seg, i, run = 0;

	if (p->pages_per_seg - p->segs[s].used < n)
		return -1;
	for (i = first; i < end; i++) {
		run = bit_get(p->free_bits, i) ? run + 1 : 0;
		if (run == n)
			return (int64_t)(i + 1 - n);
	}
	return -1;
}

int64_t kv_pages_alloc(struct kv_pages *p, uint32_t n, uint32_t ns, void *owner, int *new_owner,
		       uint32_t keep_free)
{
	int64_t at = -1;
	uint32_t s, i;

	*new_owner = 0;
	if (n == 0 || n > p->pages_per_seg || n > p->nfree)
		return -ENOSPC;
	for (s = 0; s < p->nsegs && at < 0; s++)
		if (p->segs[s].ns == ns)
			at = seg_find(p, s, n);
	for (s = 0; s < p->nsegs && at < 0 && p->free_segs > keep_free; s++) {
		if (p->segs[s].ns == 0) {
			at = seg_find(p, s, n);
			if (at >= 0) {
				/* last_ns changes only once the caller has given
				 * the segment fresh memory (kv_pages_fresh). */
				*new_owner = p->segs[s].last_ns != 0 && p->segs[s].last_ns != ns;
				p->segs[s].ns = ns;
				p->free_segs--;
				if (!*new_owner)
					p->segs[s].last_ns = ns;
			}
		}
	}
	if (at < 0)
		return -ENOSPC;
	s = kv_pages_seg_of(p, (uint32_t)at);
	for (i = 0; i < n; i++) {
		kv_assert(!p->owner[at + i]);  /* a free page has no owner */
		bit_set(p->free_bits, (uint32_t)at + i, 0);
		p->owner[at + i] = owner;
	}
	p->segs[s].used += n;
	p->nfree -= n;
	return at;
}

int kv_pages_claim(struct kv_pages *p, uint32_t first, uint32_t n, uint32_t ns, void *owner)
{
	uint32_t s, i;

	if (!n || first >= p->npages || n > p->npages - first ||
	    kv_pages_seg_of(p, first) != kv_pages_seg_of(p, first + n - 1))
		return -EBUSY;
	s = kv_pages_seg_of(p, first);
	if (p->segs[s].ns && p->segs[s].ns != ns)
		return -EBUSY;
	for (i = 0; i < n; i++)
		if (!bit_get(p->free_bits, first + i))
			return -EBUSY;
	for (i = 0; i < n; i++) {
		kv_assert(!p->owner[first + i]);
		bit_set(p->free_bits, first + i, 0);
		p->owner[first + i] = owner;
	}
	if (!p->segs[s].ns)
		p->free_segs--;
	p->segs[s].ns = p->segs[s].last_ns = ns;
	p->segs[s].used += n;
	p->nfree -= n;
	return 0;
}

void kv_pages_free(struct kv_pages *p, uint32_t first, uint32_t n)
{
	uint32_t s = kv_pages_seg_of(p, first), i;

	/* n pages of one segment, all in use (a page freed twice, or never
	 * taken, is the caller's bug) and all of one owner: what one
	 * kv_pages_alloc() or kv_pages_claim() handed out. */
	kv_assert(n >= 1 && first < p->npages && n <= p->npages - first);
	kv_assert(kv_pages_seg_of(p, first + n - 1) == s);
	kv_assert(p->segs[s].used >= n && p->nfree <= p->npages - n);
	for (i = 0; i < n; i++) {
		kv_assert(!bit_get(p->free_bits, first + i));
		kv_assert(p->owner[first + i] == p->owner[first]);
	}
	for (i = 0; i < n; i++) {
		bit_set(p->free_bits, first + i, 1);
		p->owner[first + i] = NULL;
	}
	p->segs[s].used -= n;
	p->nfree += n;
	if (p->segs[s].used == 0) {
		p->segs[s].ns = 0;
		p->free_segs++;
	}
}

void kv_pages_forget_ns(struct kv_pages *p, uint32_t ns)
{
	uint32_t s;

	for (s = 0; s < p->nsegs; s++) {
		kv_assert(p->segs[s].ns != ns);
		if (p->segs[s].last_ns == ns)
			p->segs[s].last_ns = KV_PAGES_NS_GONE;
	}
}

void kv_pages_fresh(struct kv_pages *p, uint32_t seg)
{
	kv_assert(seg < p->nsegs);
	p->segs[seg].last_ns = p->segs[seg].ns;
}
