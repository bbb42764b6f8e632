/* The prefix cache across G1-G4; see cache.h. */
#include "cache.h"

#include <errno.h>
#include <string.h>
#include <xxhash.h>

#include "daemon.h"
#include "events.h"
#include "index.h"
#include "session.h"

/* ---- lookup ------------------------------------------------------------- */

/* Hashes a lookup probes the index for at once (kv_index_find_many()): at
 * first LOOKUP_STEP, so that a chain that misses early wastes at most this
 * many probes; then twice as many each time, up to LOOKUP_STEP_MAX, so that
 * a long chain's probes overlap across fewer restarts (each step's first
 * compares wait for their lines; issue 38). */
#define LOOKUP_STEP 32
#define LOOKUP_STEP_MAX 256

/* Blocks found in a row in the slots beside the last (slots_beside()) from
 * which the next batch of probes starts again at one hash: a probe alone
 * waits on its lines where a batch overlaps them, so a stretch shorter
 * than a few probes' worth of overlap pays less as a batch. */
#define SLOTS_STRETCH 8

/* Drops pins [from, to) of ss; the rest keep their order. */
static void unpin_range(struct kv_session *ss, uint32_t from, uint32_t to)
{
	uint32_t i;

	if (from == to)
		return;
	for (i = from; i < to; i++)
		kv_block_unref(ss->pins[i]);
	memmove(ss->pins + from, ss->pins + to, (ss->npins - to) * sizeof(*ss->pins));
	ss->npins -= to - from;
}

/* Drops the pins taken after the first keep (this run's, when keep is
 * the count it started with). */
static void unpin_after(struct kv_session *ss, uint32_t keep)
{
	while (ss->npins > keep)
		kv_block_unref(ss->pins[--ss->npins]);
}

/* The carried hashes a rerun digests (lk_sum): the last of them, so that
 * a rerun's cost does not grow with what it carries. */
#define RESUME_SUM 32

static uint64_t resume_sum(const uint8_t *hashes, uint32_t c)
{
	uint32_t from = c > RESUME_SUM ? c - RESUME_SUM : 0;

	return XXH3_64bits(hashes + (size_t)from * KV_HASH_BYTES,
			   (size_t)(c - from) * KV_HASH_BYTES);
}

/* How many blocks at the head of the chain a rerun of a parked lookup need
 * not look up again: those its last run found in G1 and left pinned, in
 * chain order, at pins[0..c) (ss->lk_done). What is pinned has a reference,
 * so it is SEALED: in the index under its hash until its last reference
 * goes (pool.h), never evicted, demoted or dropped as expired (only CACHED
 * blocks are), and its born_ms does not change. While the request is
 * parked its connection runs nothing else, so the next lookup of ss is this
 * one again: the same frame, which the session's count of finished frames
 * tells (ss->requests unchanged since the park: session.h), checked all
 * the same by pool, length and a digest of the last carried hashes. It was
 * a digest of all of them, read on every rerun and every park: a chain
 * fetched from G4 64 blocks at a time read its head twice on each of its
 * ~1.5 reruns per fetch (issue 38). Only time can have changed their
 * answer: a namespace's TTL, which the oldest of them tells (and which a
 * reload may have shortened); then the walk starts from block 0 again, as
 * a fresh lookup would. */
static uint32_t resume_point(const struct kv_session *ss, const struct kv_pool *p,
			     const uint8_t *hashes, size_t n)
{
	uint32_t c = ss->lk_done;

	if (!c || ss->lk_req != ss->requests || ss->lk_pool != p || ss->lk_n != n || c > n ||
	    c > ss->npins || ss->lk_oldest >= c)
		return 0;
	if (resume_sum(hashes, c) != ss->lk_sum)
		return 0;
	if (kv_pool_expired(p, &ss->pins[ss->lk_oldest]->ix))
		return 0;
	return c;
}

/* blk[g..) taken from the slots beside blk[g - 1] and on (kv_block_beside():
 * what the index would give, for a chain sealed from one allocation), in
 * the direction the last one went (*dir, 1 or -1), else the other, as far
 * as they hold the chain's next hashes; returns the first g they did not
 * give. *expired when that one's slot held it past p's TTL (ttl: p has
 * one), which the walks below then handle as an index probe's. */
static size_t slots_beside(const struct kv_pool *p, const uint8_t *hashes, size_t g, size_t n,
			   struct kv_block **blk, int ttl, int *dir, int *expired)
{
	struct kv_block *b = blk[g - 1], *nb;
	const struct kv_block *first, *end;

	kv_block_run_span(b, &first, &end);
	for (; g < n; g++) {
		const uint8_t *h = hashes + g * KV_HASH_BYTES;

		if (!(nb = kv_block_beside(b, *dir, first, end, p->id, h))) {
			if (!(nb = kv_block_beside(b, -*dir, first, end, p->id, h)))
				break;
			*dir = -*dir;
		}
		if (ttl && kv_pool_expired(p, &nb->ix)) {
			*expired = 1;
			break;
		}
		blk[g] = b = nb;
	}
	return g;
}

int kv_cache_lookup(struct kv_daemon *d, struct kv_session *ss, struct kv_pool *p,
		    const uint8_t *hashes, size_t n, struct kv_block **blk, uint32_t *old_pins,
		    uint8_t *tiers)
{
	uint32_t c = resume_point(ss, p, hashes, n), old = ss->npins, done = c;
	uint32_t oldest = c ? ss->lk_oldest : 0;
	uint64_t born = c ? ss->pins[oldest]->ix.born_ms : 0;
	int parked = 0, expired = 0, gap = 0, run = 1, started = 0, ttl = kv_pool_has_ttl(p);
	int dir = 1;   /* which way the chain's slots went last (slots_beside()) */
	size_t k, g, walked, step = LOOKUP_STEP;

	ss->lk_done = 0;
	*old_pins = old;
	/* The chain's blocks in G1 are pinned before any promotion starts: a
	 * promotion makes its room in G1 by demotion, which must not take a
	 * block of this very chain (with room for one, two blocks of a chain
	 * took turns there forever: the promotion of one demoted the other,
	 * found by fuzz_dispatch). While the request waits, the pins keep them
	 * in G1, or it could chase its own chain forever. Those the last run
	 * left pinned at the head of the chain are carried over (blocks
	 * 0..c-1: resume_point()), so that a chain fetched or promoted a batch
	 * at a time costs O(n) lookups, not one walk from block 0 per rerun;
	 * this run's unbroken run of pinned G1 blocks after them (0..done-1)
	 * is carried to the next, should it park. */
	/* First the G1 blocks at the head of the rest of the chain, without
	 * pins (blk[c..g)): a chain all in G1 is a hit that starts nothing,
	 * and would drop the pins as soon as taken (below). One index probe
	 * a block, or a compare of the slot beside the last (slots_beside()),
	 * which the walks below reuse. */
	for (g = c; g < n; step = step < LOOKUP_STEP_MAX ? 2 * step : step) {
		struct kv_index_entry *ie[LOOKUP_STEP_MAX];
		uint64_t key[LOOKUP_STEP_MAX];
		size_t m, j;
		int past = 0;

		if (g > c) {
			size_t from = g;

			g = slots_beside(p, hashes, g, n, blk, ttl, &dir, &past);
			/* A stretch of slots ended: the chain's next stretch
			 * likely starts at the next hash (a full pool's
			 * allocations are the LRU's oldest chains, a stretch
			 * each), so it is probed alone, and the batches grow
			 * again only while no stretch follows. */
			if (g - from >= SLOTS_STRETCH)
				step = 1;
		}
		if (g == n || past)
			break;
		m = n - g < step ? n - g : step;
		kv_index_find_many(kv_pools_index(d->pools), p->id, hashes + g * KV_HASH_BYTES, m,
				   key, ie);
		for (j = 0; j < m; j++, g++) {
			struct kv_index_entry *e = ie[j];

			if (!e || e->kind != KV_ENTRY_BLOCK || (ttl && kv_pool_expired(p, e)))
				break;
			blk[g] = kv_container_of(e, struct kv_block, ix);
		}
		if (j < m)
			break;
	}
	if (g == n) {
		for (k = 0; k < c; k++)
			blk[k] = ss->pins[k];
		return (int)n;
	}
	for (k = c; k < n; k++) {
		struct kv_index_entry *e;
		struct kv_block *b;
		uint32_t before = ss->npins;

		if (k < g) {
			b = blk[k];
		} else {
			e = kv_pool_find_entry(p, hashes + k * KV_HASH_BYTES);
			if (!e || kv_pool_expired(p, e))
				break;
			if (e->kind != KV_ENTRY_BLOCK) {
				blk[k] = NULL;
				run = 0;
				continue;
			}
			b = blk[k] = kv_container_of(e, struct kv_block, ix);
		}
		if (kv_session_pin(ss, b) < 0)
			return -ENOMEM;
		if (!run || ss->npins == before) {
			run = 0;   /* not pinned (at max_block_refs): not carried */
			continue;
		}
		/* Its pin is pins[old + k - c]; pins[k] once the last run's
		 * other pins have gone (below). */
		if (!done || b->ix.born_ms < born) {
			born = b->ix.born_ms;
			oldest = (uint32_t)k;
		}
		done = (uint32_t)k + 1;
	}
	/* blk[c..walked): the G1 blocks the walk above found, NULL where a
	 * lower tier's copy is; at walked it stopped (no entry, or expired). */
	walked = k;
	for (k = 0; k < c; k++)
		blk[k] = ss->pins[k];
	/* Blocks in lower tiers are promoted first: all of the chain's at once,
	 * and the request parks on the first; when it runs again the next
	 * promotion still under way parks it, until the whole prefix is in G1.
	 * Until the first promotion starts nothing has changed the index since
	 * the walk above, so its G1 blocks are taken as found (one index probe
	 * a block for a chain all in G1); a promotion may demote or evict to
	 * make room, so after it every hash is searched again. */
	for (k = c; k < n; k++) {
		struct kv_index_entry *e;

		if (!started && k < walked && blk[k])
			continue;
		e = kv_pool_find_entry(p, hashes + k * KV_HASH_BYTES);
		if (!e) {
			gap = 1;
			break;
		}
		if (kv_pool_expired(p, e)) {
			/* Past the namespace's TTL: a miss from here on, and
			 * what is cached of it goes (what a session holds stays
			 * until released, unseen). */
			if (e->kind == KV_ENTRY_TIER)
				kv_tiers_forget(d->tiers, p, hashes + k * KV_HASH_BYTES);
			else
				kv_pools_drop_cached(kv_container_of(e, struct kv_block, ix));
			expired = 1;
			break;
		}
		if (e->kind == KV_ENTRY_TIER) {
			int r, tier = kv_tiers_entry_tier(e);

			if (tiers && tiers[k] < tier)
				tiers[k] = (uint8_t)tier;
			if (!started)
				kv_tiers_plug(d->tiers, 1);
			started = 1;
			r = kv_tiers_promote(d->tiers, e, parked ? NULL : &ss->waiter);

			if (r == -EAGAIN)
				break;  /* no room to start more now: the rerun will */
			if (r < 0)
				break;  /* a miss from here on */
			parked = 1;
			continue;
		}
		blk[k] = kv_container_of(e, struct kv_block, ix);
	}
	/* The copies the promotions above started go to the copy engine
	 * together (tier.h). */
	if (started)
		kv_tiers_plug(d->tiers, 0);
	/* The rest of the chain may be in G4 (another node's work): ask, and
	 * park until the answer is in G2 (the rerun promotes it). */
	if (!parked && !expired && k < n) {
		int r = kv_tiers_remote_fetch(d->tiers, p, hashes + k * KV_HASH_BYTES, n - k,
					      &ss->waiter);

		if (r == -ENOMEM)
			return -ENOMEM;
		parked = r == 0;
	} else if (parked && gap) {
		/* Every tier block before k is on its way up (or this request
		 * waits for G1 room for the first): the rerun would ask G4
		 * for the rest then, so ask now, while they are copied (a
		 * read-ahead: the rerun finds its blocks, or waits on it). */
		kv_tiers_remote_ahead(d->tiers, p, hashes + k * KV_HASH_BYTES, n - k, &ss->waiter);
	}
	if (parked) {
		/* This run's pins stay, and those it carried over; the last
		 * run's others go. */
		unpin_range(ss, c, old);
		if (done) {
			ss->lk_pool = p;
			ss->lk_n = (uint32_t)n;
			ss->lk_done = done;
			ss->lk_oldest = oldest;
			ss->lk_sum = resume_sum(hashes, done);
			ss->lk_req = ss->requests;
		}
		return -EINPROGRESS;
	}
	/* Nothing started: this run's pins have done their work (the last
	 * run's, if it parked, go once the references are taken). */
	unpin_after(ss, old);
	return (int)k;
}

void kv_cache_lookup_held(struct kv_session *ss, struct kv_block *const *blk, size_t k,
			  uint32_t old_pins, uint32_t *mine)
{
	size_t i;

	if (!old_pins) {
		memset(mine, 0, k * sizeof(*mine));
		return;
	}
	/* b->check counts b's pins among the last run's; read per listing. */
	for (i = 0; i < k; i++)
		blk[i]->check = 0;
	for (uint32_t j = 0; j < old_pins; j++)
		ss->pins[j]->check = 0;
	for (uint32_t j = 0; j < old_pins; j++)
		ss->pins[j]->check++;
	for (i = 0; i < k; i++)
		mine[i] = blk[i]->check;
}

void kv_cache_lookup_done(struct kv_session *ss, uint32_t old_pins)
{
	unpin_range(ss, 0, old_pins);
}

void kv_cache_count_lookup(struct kv_daemon *d, struct kv_pool *p, size_t n, size_t k)
{
	struct kv_ns *ns = kv_ns_get(kv_pools_nstab(d->pools), p->ns);

	p->n.lookups += n;
	p->n.hits += k;
	ns->lookups += n;
	ns->hits += k;
}

/* ---- seal --------------------------------------------------------------- */

void kv_cache_seal_plan(struct kv_daemon *d, struct kv_pool *p, const uint8_t *hashes,
			size_t n, struct kv_cache_seal *pl)
{
	kv_index_find_many(kv_pools_index(d->pools), p->id, hashes, n, pl->key, pl->ie);
	for (size_t i = 0; i < n; i++) {
		struct kv_index_entry *e = pl->ie[i];

		pl->dedup[i] = e && e->kind == KV_ENTRY_BLOCK ? kv_container_of(e, struct kv_block, ix)
							      : NULL;
	}
}

struct kv_block *kv_cache_seal(struct kv_daemon *d, struct kv_pool *p, struct kv_block *b,
			       const uint8_t *hash, const struct kv_cache_seal *pl, size_t i,
			       int repeats)
{
	struct kv_index_entry *e = pl->ie[i];

	if (repeats) {
		/* What the plan found may have changed under an earlier
		 * listing of the same hash: search again. */
		kv_tiers_forget(d->tiers, p, hash);
		return kv_pool_seal(p, b, hash);
	}
	/* Each hash once: nothing before it in this batch touched its entry.
	 * A lower tier's copy gives way to the G1 block. */
	if (e && e->kind == KV_ENTRY_TIER) {
		kv_tiers_forget_entry(d->tiers, e);
		e = NULL;
	}
	return kv_pool_seal_found(p, b, hash, pl->key[i], e);
}

/* ---- alloc -------------------------------------------------------------- */

void kv_cache_count_enospc(struct kv_daemon *d, uint32_t ns)
{
	struct kv_ns *n = kv_ns_get(kv_pools_nstab(d->pools), ns);

	d->enospc++;
	if (n)
		n->enospc++;
}

int kv_cache_alloc(struct kv_daemon *d, struct kv_session *ss, struct kv_pool *p, uint32_t n,
		   struct kv_block **out, char *why, size_t whylen)
{
	int r = kv_pool_alloc(p, n, out, why, whylen);

	if (r != -ENOSPC)
		return r;
	/* Rather than fail for a moment's want of room, park until a copy
	 * ends and run again (kv_tiers_wait_room()). */
	if (kv_tiers_wait_room(d->tiers, p->device, p->ns, kv_pool_room_after_demotions(p, n),
			       &ss->waiter) == 0)
		return -EINPROGRESS;
	kv_cache_count_enospc(d, ss->ns);
	return r;
}

void kv_cache_alloc_undo(struct kv_pool *p, struct kv_block **blk, uint32_t n)
{
	/* Cached blocks evicted on the way stay evicted, as after ENOSPC. */
	for (uint32_t i = 0; i < n; i++)
		kv_block_unref(blk[i]);
	p->n.allocs -= n;
}

/* ---- the rest ----------------------------------------------------------- */

uint64_t kv_cache_walk(struct kv_daemon *d, uint64_t first, size_t max,
		       int (*fn)(void *arg, uint32_t pool, const uint8_t *hash, unsigned tier),
		       void *arg)
{
	const struct kv_index *ix = kv_pools_index(d->pools);
	uint64_t b = first;
	size_t n = 0;

	for (; b < ix->nbuckets && n < max; b++) {
		const struct kv_index_entry *e;

		for (e = ix->buckets[b]; e; e = e->next) {
			unsigned media = kv_tiers_entry_media(e), t;

			for (t = 0; t < KV_MEDIUMS; t++) {
				if (!(media & (1u << t)))
					continue;
				if (fn(arg, e->pool, e->hash, t))
					return KV_CACHE_WALK_DONE;
				n++;
			}
		}
	}
	return b < ix->nbuckets ? b : KV_CACHE_WALK_DONE;
}

void kv_cache_batch_done(struct kv_daemon *d)
{
	kv_tiers_kick(d->tiers);
}
