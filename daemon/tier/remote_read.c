/* G4's reads: fetches, their queues and turns, the G2 slots values are read
 * straight into, read-ahead (the tier as a whole: remote.c).
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
 * (kv_tiers_waiter_gone()). */
#include "remote_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "crc32c.h"
#include "g4mac.h"
#include "log.h"

/* Whether pool p's namespace reads G4: remote = yes, and its values can be
 * authenticated (its remote_key_file was read at start), or it opted out
 * (remote_auth = off). A namespace that a reload made remote with a key
 * file the tier has not read, or without one, reads nothing (issue 36:
 * values are never taken on trust by default). */
static int ns_remote(struct kv_tiers *t, const struct kv_pool *p)
{
	const struct kv_ns *m = kv_ns_get(kv_pools_nstab(t->ps), p->ns);

	return m && m->lim.remote && (m->lim.remote_unauth || tier_g4_mac_key_of(t, p->ns));
}

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
 * its payload at slot + HDR_BYTES, its tag (with mac_key) in tag; len bytes
 * in all. The tag is checked over header and payload in their two places
 * (issue 36: with values authenticated by default, a tagged value is read
 * straight into its slot too). */
static int check_in_slot(const struct slot_hdr *want, const uint8_t *mac_key,
			 const uint8_t *slot, const uint8_t *tag, size_t len)
{
	struct slot_hdr h, w = *want;
	size_t vlen = sizeof(h) + w.payload_len + (mac_key ? KV_G4MAC_TAG_BYTES : 0);

	if (len > vlen)
		return G4_VALUE_OVERSIZE;
	if (len != vlen)
		return G4_VALUE_BAD;
	memcpy(&h, slot, sizeof(h));
	slot_hdr_seal(&w, kv_crc32c(0, slot + HDR_BYTES, w.payload_len));
	if (memcmp(&h, &w, sizeof(h)))
		return G4_VALUE_BAD;
	if (mac_key && !kv_g4mac_check2(mac_key, slot, sizeof(h), slot + HDR_BYTES, w.payload_len,
					tag))
		return G4_VALUE_BAD_TAG;
	return G4_VALUE_GOOD;
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
	f->chk[i] = (uint8_t)(check_in_slot(&want, f->mac_key, f->slot[i], f->tag[i], len) + 1);
}

/* The read thread: the values, and which of them check out. */
static void fetch_run(struct kv_job *j)
{
	struct g4_fetch *f = kv_container_of(j, struct g4_fetch, job);
	struct kv_rc *rc = f->t->g4->cl[f->cl].rd[f->rd];
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
		snprintf(f->why, sizeof(f->why), "%s", kv_rc_last_error(rc));
		return;
	}
	kv_rc_stats(rc, &f->rc);
	snprintf(f->why, sizeof(f->why), "%s", kv_rc_last_error(rc));
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
			c = f->chk[i] ? f->chk[i] - 1
				      : check_in_slot(&want, f->mac_key, f->slot[i], f->tag[i], v->len);
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

void tier_remote_count_holds(struct kv_tiers *t)
{
	struct kv_g4 *g = t->g4;

	if (!g)
		return;
	for (uint32_t k = 0; k < g->nreaders; k++)
		if (g->cur[k])
			g->cur[k]->pool->check_holds++;
	for (uint32_t ns = 0; ns <= KV_MAX_NS; ns++)
		for (struct g4_fetch *f = g->fq[ns]; f; f = f->next)
			f->pool->check_holds++;
}

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
	struct tblock *mk[FETCH_MAX];
	struct kv_index *ix = kv_pools_index(t->ps);
	struct kv_index_entry *ie[FETCH_MAX];
	uint64_t key[FETCH_MAX];
	uint32_t i, made = 0, nmk = 0;
	uint64_t mark;
	int clean_only;

	g->st.hits += f->good;
	g->st.misses += f->misses;
	g->st.errors += f->errors;
	g->st.checksum_failures += f->bad_sum;
	g->st.auth_failures += f->bad_mac;
	g->st.oversize += f->oversize;
	g->cl[f->cl].rd_st[f->rd] = f->rc;
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
	if (f->why[0])
		kv_debug("G4: a fetch of %u blocks for pool '%s': %u served, %u misses, %u errors "
			 "in %llu ms; the cluster client's first error: %s", f->n, f->pool->name,
			 f->good, f->misses, f->errors,
			 (unsigned long long)((kv_hist_now_ns() - f->start_ns) / 1000000), f->why);
	g->nreading--;
	g->cur[f->rd] = NULL;
	g->st.fetching--;
	kv_hist_since(&g->st.hist, f->start_ns);
	/* A read-ahead that its lookup has not come to wait on takes no dirty
	 * copy's slot: those include the blocks the last fetch brought for
	 * that lookup, which it may not have promoted yet (G1 full). */
	clean_only = f->ahead && kv_list_empty(&f->waiters);
	/* The keys, and the index's buckets in cache, for all at once
	 * (kv_index_find_many()); each is probed again as it comes (with its
	 * key, in a bucket in cache): a block made below, or a copy dropped
	 * for its room, changes the answer for a later one. */
	if (f->good && !t->stopping)
		kv_index_find_many(ix, f->pool->id, f->hash[0], f->good, key, ie);
	for (i = 0; i < f->good && !t->stopping; i++) {
		struct tblock *tb;
		uint8_t *slot;

		g->st.bytes_in += f->vals[i].len;
		if (kv_index_find_key(ix, key[i], f->pool->id, f->hash[i])) {
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
		tb->from_g4 = 1;
		tb_index(t, tb);
		t->lv[L2].st.blocks++;
		g2_dirty_add(t, tb, 1);
		mk[nmk++] = tb;
		made++;
	}
	/* Idle (on the LRUs, so that room can be made by dropping them) only
	 * now: the room for this fetch's later blocks must not come from its
	 * earlier ones. Under a G2 quota below a fetch's worth, each block
	 * dropped the one before it, the chain's head was gone when the
	 * lookup ran again, and it fetched the whole chain again, forever
	 * (test_g4_direct: quota). Now the fetch stops at the first block
	 * without room: the rerun promotes those before it and does not ask
	 * again for that one (remote_mark). */
	for (i = 0; i < nmk; i++)
		if (!mk[i]->busy)   /* nothing took it meanwhile (no waiter ran) */
			tb_set_idle(t, mk[i]);
	/* Its reader is idle (cur[rd] is NULL, and nothing was handed to it
	 * since): the buffers go back to its client's pool, pages mapped, for
	 * the next fetch; before the waiters run, whose reruns may hand it the
	 * next fetch (a read-ahead) at once. */
	kv_rc_vals_release(g->cl[f->cl].rd[f->rd], f->n, f->vals);
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
 * block here already, none from the first that finds no room on (those
 * values are read into the client's buffers and copied on the loop, as
 * before). A value's tag, with the namespace's key, goes into f->tag. A
 * reserved slot is the fetch's until fetch_done():
 * its tblock (FETCH) is in no index and on no LRU, so nothing on the loop
 * reads, evicts or frees it meanwhile, and only the read thread writes its
 * bytes. */
static void fetch_reserve(struct kv_tiers *t, struct g4_fetch *f)
{
	struct kv_index_entry *ie[FETCH_MAX];
	uint64_t key[FETCH_MAX];

	if (!t->lv[L2].on)
		return;
	/* The index probed for all of them at once (kv_index_find_many():
	 * the cache misses overlapped; one after another they were up to a
	 * sixth of the loop's time at 16 KiB). Nothing below changes the index. */
	kv_index_find_many(kv_pools_index(t->ps), f->pool->id, f->hash[0], f->n, key, ie);
	for (uint32_t i = 0; i < f->n; i++) {
		struct tblock *tb;
		uint8_t *slot;

		if (ie[i])
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
		if (f->mac_key) {
			f->dst[i].part[2].p = f->tag[i];
			f->dst[i].part[2].len = KV_G4MAC_TAG_BYTES;
			f->dst[i].nparts = 3;
		}
	}
}

/* Hands each idle reader a fetch: the first waiting of the namespace
 * after the one served last. */
static void fetch_next(struct kv_tiers *t)
{
	struct kv_g4 *g = t->g4;
	struct g4_fetch *f;
	uint32_t ns, r;

	while (g->nreading < g->nreaders && g->fq_waiting && !t->stopping) {
		for (r = 0; r < g->nreaders && g->cur[r]; r++)
			;
		kv_assert(r < g->nreaders);
		for (uint32_t k = 1; k <= KV_MAX_NS + 1; k++) {
			ns = (g->fq_last + k) % (KV_MAX_NS + 1);
			if (!(f = g->fq[ns]))
				continue;
			if (!(g->fq[ns] = f->next))
				g->fq_tail[ns] = &g->fq[ns];
			g->fq_waiting--;
			g->fq_last = ns;
			g->nreading++;
			g->cur[r] = f;
			f->rd = r;
			fetch_reserve(t, f);
			kv_worker_submit(&g->rw[r], &f->job);
			break;
		}
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
	int pre;

	if (!(f = calloc(1, sizeof(*f))))
		return NULL;
	f->t = t;
	f->cl = tier_g4_client_of(t, p->ns);
	f->ns = p->ns;
	f->mac_key = tier_g4_mac_key_of(t, p->ns);
	f->vlen = tier_g4_value_len(p, f->mac_key);
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
	/* The keys' common part formatted once (snprintf() per key was a
	 * twentieth of the loop's time at 16 KiB), then copied; a key that
	 * would not fit whole is made as the write path makes it. */
	pre = tier_g4_key_prefix(t, p, f->key[0]);
	for (i = 0; i < f->n; i++) {
		memcpy(f->hash[i], hashes + (size_t)i * KV_HASH_BYTES, KV_HASH_BYTES);
		f->keys[i].data = f->key[i];
		if (pre < 0 || pre + 2 * KV_HASH_BYTES + 2 >= KEY_MAX) {
			f->keys[i].len = tier_g4_key_of(t, p, f->hash[i], f->key[i]);
			continue;
		}
		if (i)
			memcpy(f->key[i], f->key[0], (size_t)pre);
		f->keys[i].len = tier_g4_key_hash(f->key[i], pre, f->hash[i]);
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
