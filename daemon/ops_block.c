/* The block operations: Hello, RegisterPool, Alloc, Seal, Lookup, Release,
 * Fork, Cow, SwapOut, SwapIn. See ops.h. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "cache.h"
#include "events.h"
#include "frame.h"
#include "log.h"
#include "ops_block.h"
#include "policy.h"
#include "tenant.h"

void kv_op_hello(struct req *q, const Kvcached__Hello *h)
{
	struct kv_daemon *d = q->d;
	Kvcached__HelloReply *r;
	char name[KV_NAME_MAX + 16], why[300];
	int rc, fresh;

	if (q->ss->ns) {
		kv_op_fail(q, KVCACHED__ERROR_CODE__EPROTO, -1, "Hello sent twice");
		return;
	}
	if (h->min_version > KV_PROTO_VERSION || h->max_version < KV_PROTO_VERSION) {
		kv_op_fail(q, KVCACHED__ERROR_CODE__EVERSION, -1,
			   "client speaks versions %u..%u, daemon speaks %u", h->min_version,
			   h->max_version, KV_PROTO_VERSION);
		return;
	}
	if (h->namespace_ && h->namespace_[0])
		snprintf(name, sizeof(name), "%s", h->namespace_);
	else
		kv_tenant_default_ns(q->ss, name, sizeof(name));
	if (!kv_ns_name_ok(h->namespace_ && h->namespace_[0] ? h->namespace_ : name)) {
		kv_op_fail(q, KVCACHED__ERROR_CODE__EINVAL, -1, "namespace '%.80s': a name is "
			   "1..%d of A-Z a-z 0-9 . _ : -", h->namespace_, KV_NAME_MAX - 1);
		return;
	}
	if (!kv_tenant_may_open(d, q->ss, name, why, sizeof(why))) {
		static struct kv_ratelimit refused_log = { .interval_ms = 1000 };
		uint64_t held;

		/* A client may repeat this at will: one line a second at most. */
		if (kv_ratelimit(&refused_log, &held))
			kv_warn("Hello refused: %s (%llu more refusals since the last such line)",
				why, (unsigned long long)held);
		kv_op_fail(q, KVCACHED__ERROR_CODE__EACCES, -1, "%s", why);
		return;
	}
	fresh = !kv_ns_find(kv_pools_nstab(d->pools), name);
	if ((rc = kv_session_enter_ns(q->ss, name)) < 0) {
		kv_op_fail(q, KVCACHED__ERROR_CODE__ENOSPC, -1, "namespace '%s': %d namespaces are "
			   "in use", name, KV_MAX_NS);
		return;
	}
	if (fresh)
		kv_tenant_apply(d, q->ss->ns);
	if (!(r = q_alloc(q, sizeof(*r))))
		return;
	kv_session_set_name(q->ss, h->client_name ? h->client_name : "");
	kvcached__hello_reply__init(r);
	r->version = KV_PROTO_VERSION;
	r->page_bytes = d->cfg.page_bytes;
	r->segment_bytes = d->be->segment_bytes;
	r->device_bytes = kv_backend_max_dev_bytes(d->be);
	r->devices = d->be->devices;
	if (d->be->has_uuid) {
		if (!(r->device_uuid = q_alloc(q, d->be->devices * sizeof(*r->device_uuid))))
			return;
		for (uint32_t i = 0; i < d->be->devices; i++)
			r->device_uuid[i] = (ProtobufCBinaryData){ 16, d->be->uuid[i] };
		r->n_device_uuid = d->be->devices;
	}
	r->backend = (char *)d->be->name;
	r->max_frame = d->cfg.max_frame;
	r->max_batch = d->cfg.max_batch;
	r->session_id = q->ss->id;
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_HELLO;
	q->rs->hello = r;
}

void kv_op_register(struct req *q, const Kvcached__RegisterPool *m)
{
	struct kv_pool_desc desc = {
		.name = m->name, .device = m->device, .block_bytes = m->block_bytes,
		.block_tokens = m->block_tokens, .dtype = m->dtype,
		.layout = m->layout.data, .layout_len = m->layout.len,
	};
	struct kv_daemon *d = q->d;
	struct kv_ns *ns = kv_ns_get(kv_pools_nstab(d->pools), q->ss->ns);
	Kvcached__RegisterPoolReply *r;
	struct kv_pool *p;
	char err[256];
	int rc;

	/* The daemon keeps the layout as long as the pool: bounded, as every
	 * byte a client can make it hold. */
	if (m->layout.len > d->cfg.max_layout_bytes) {
		kv_op_fail(q, KVCACHED__ERROR_CODE__EINVAL, -1,
			   "pool '%.80s': a layout of %zu bytes is larger than max_layout_bytes "
			   "(%" PRIu64 ")", m->name, m->layout.len, d->cfg.max_layout_bytes);
		return;
	}
	if (!kv_pools_by_name(d->pools, q->ss->ns, m->name) &&
	    ns->pools >= d->cfg.max_pools_per_namespace) {
		ns->quota_refusals++;
		kv_op_fail(q, KVCACHED__ERROR_CODE__EQUOTA, -1,
			   "pool '%.80s': namespace '%s' has %u pools, max_pools_per_namespace is %u",
			   m->name, ns->name, ns->pools, d->cfg.max_pools_per_namespace);
		return;
	}
	if (m->model && (strlen(m->model) > 128 || strchr(m->model, '@'))) {
		kv_op_fail(q, KVCACHED__ERROR_CODE__EINVAL, -1,
			   "pool '%.80s': a model name has at most 128 bytes and no '@'", m->name);
		return;
	}
	rc = kv_pool_register(d->pools, q->ss->ns, &desc, &p, err, sizeof(err));
	if (rc < 0) {
		kv_op_fail(q, rc == -EEXIST ? KVCACHED__ERROR_CODE__EEXIST
			   : rc == -ENOSPC ? KVCACHED__ERROR_CODE__ENOSPC
			   : rc == -ENOMEM ? KVCACHED__ERROR_CODE__EINTERNAL
					   : KVCACHED__ERROR_CODE__EINVAL, -1, "%s", err);
		return;
	}
	/* The pool lives at least as long as this session. */
	kv_session_keep_pool(q->ss, p);
	if (rc == 1) {
		kv_policy_pool_added(d, p, ns, m->model);
	}
	if (!(r = q_alloc(q, sizeof(*r))))
		return;
	kvcached__register_pool_reply__init(r);
	r->pool_id = p->id;
	r->run_bytes = (uint64_t)p->run_pages * d->cfg.page_bytes;
	r->blocks_per_run = p->blocks_per_run;
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_REGISTER_POOL;
	q->rs->register_pool = r;
	kv_debug("session %llu: pool %u '%s' block_bytes %llu: runs of %u pages, %u blocks",
		 (unsigned long long)q->ss->id, p->id, p->name, (unsigned long long)p->block_bytes,
		 p->run_pages, p->blocks_per_run);
}

/* How many blocks ahead a pass over a batch asks for a block's line
 * (kv_block_prefetch()). */
#define BLK_AHEAD 16

/* A value of b->check new to one pass over a request's blocks, which marks
 * each block it meets with it, so that a block listed twice is told by the
 * stamp (lookup_room_fast(), resolve_once()). An odd step visits every value
 * before one comes back, and small values (the counts the other uses of
 * check leave) seldom; a stamp left over of the same value only sends the
 * request to the exact check. */
static uint32_t check_stamp(void)
{
	static uint32_t stamp;   /* the event loop's alone */

	return stamp += 0x9e3779b9u;
}

/* kv_op_resolve() of a batch that lists no block twice (every Seal and
 * Release of an engine), in one pass over the blocks instead of two (issue
 * 38: Release's validation was a tenth of the loop's time in a lookup of
 * 1,000 and its release): each block resolved and checked as there, stamped
 * as this pass's (a repeat is told by the stamp), and holding at least one
 * reference of the session's, which is what kv_op_resolve() asks of a block
 * listed once whatever per is. Anything else (a bad count, a block stale,
 * forged, of another pool or namespace or not held, a repeat, a stamp left
 * over) goes to kv_op_resolve(), which decides and writes the refusal: the
 * same answers, all or nothing as there. Only b->check differs on success
 * (a stamp, not a count): the Seal and the Release, its callers, do not
 * read it. */
static int resolve_once(struct req *q, struct kv_pool *p, const uint64_t *handles, size_t n,
			uint32_t per)
{
	uint32_t stamp;
	size_t i;

	if (n == 0 || n > q->d->cfg.max_batch)
		return kv_op_resolve(q, p, handles, n, per);
	stamp = check_stamp();
	for (i = 0; i < n; i++) {
		struct kv_block *b = kv_block_lookup_near(q->d->pools, handles[i],
							  i ? q->blk[i - 1] : NULL);

		/* A batch's blocks are in L2 at best: the lines of those a
		 * few handles ahead are asked for when of b's run. */
		if (b && i + BLK_AHEAD < n)
			kv_block_prefetch_near(handles[i + BLK_AHEAD], b);
		if (!b || b->state == KV_BLOCK_FREE || kv_block_pool(b)->ns != q->ss->ns ||
		    (p && kv_block_pool(b) != p) || b->check == stamp ||
		    !kv_sessrefs_get(&q->ss->refs, b))
			return kv_op_resolve(q, p, handles, n, per);
		b->check = stamp;
		q->blk[i] = b;
	}
	return 0;
}

void kv_op_alloc(struct req *q, const Kvcached__Alloc *m)
{
	struct kv_pool *p = kv_op_pool(q, m->pool_id);
	char why[512];
	uint32_t i;
	int r;

	if (!p)
		return;
	if (m->count == 0 || m->count > q->d->cfg.max_batch) {
		kv_op_fail(q, m->count ? KVCACHED__ERROR_CODE__E2BIG : KVCACHED__ERROR_CODE__EINVAL,
			   -1, "alloc of %u blocks: must be 1..%u", m->count, q->d->cfg.max_batch);
		return;
	}
	if (kv_sessrefs_reserve(&q->ss->refs, m->count) < 0) {
		q->out = KV_OP_NOMEM;
		return;
	}
	if ((r = kv_cache_alloc(q->d, q->ss, p, m->count, q->blk, why, sizeof(why))) < 0) {
		if (r == -EINPROGRESS)
			q->out = KV_OP_PARK;
		else
			kv_op_fail(q, kv_op_errno_code(r), -1, "%s", why);
		return;
	}
	if (kv_op_want_segments(q, q->blk, m->count) < 0) {
		kv_cache_alloc_undo(p, q->blk, m->count);
		return;
	}
	for (i = 0; i < m->count; i++)
		kv_sessrefs_add(&q->ss->refs, q->blk[i]);
	kv_op_reply_blocks(q, m->count);
}

/* What a seal learns of its batch before it changes anything. */
struct seal_plan {
	struct kv_cache_seal c;      /* what the cache holds under each hash */
	int repeats;                 /* some hash is listed more than once */
};

/* Counts into rep[] (zeroed), at the first listing of each hash, its later
 * listings. Returns whether there are any, or -ENOMEM (reply set). O(n): an
 * open-addressed table of the batch's keys, which are keyed hashes, so that
 * no client can make them collide. A slot per four keys or more: a batch of
 * fresh hashes (every engine's) then finds its slot free at the first probe
 * seven times in eight, where at one per two keys the probes' branches
 * missed often enough to be half of kv_op_seal()'s own samples in a Seal of 256
 * (issue 38). */
static int seal_repeats(struct req *q, const uint8_t *h, const uint64_t *key, size_t n,
			uint32_t *rep)
{
	size_t cap = 2, mask, i;
	uint32_t *t;
	int any = 0;

	while (cap < 4 * n)
		cap *= 2;
	if (!(t = q_alloc(q, cap * sizeof(*t))))
		return -ENOMEM;
	memset(t, 0, cap * sizeof(*t));
	mask = cap - 1;
	for (i = 0; i < n; i++) {
		size_t k = (size_t)(key[i] >> 32) & mask;

		for (; t[k]; k = (k + 1) & mask) {
			uint32_t f = t[k] - 1;

			if (key[f] == key[i] && !memcmp(h + (size_t)f * HASH, h + i * HASH, HASH))
				break;
		}
		if (t[k]) {
			rep[t[k] - 1]++;
			any = 1;
		} else {
			t[k] = (uint32_t)i + 1;
		}
	}
	return any;
}

/* Searches the index once per hash, into pl. Seal dedups every block whose
 * hash is published onto the published block, which takes a reference per
 * block: refuses (EQUOTA) a request that would take one past max_block_refs,
 * before anything changes. That includes a hash listed several times whose
 * first block is the one published by this very request. Returns 0, -EDQUOT
 * or -ENOMEM (reply set). */
static int seal_plan(struct req *q, struct kv_pool *p, const Kvcached__Seal *m,
		     struct seal_plan *pl)
{
	const uint8_t *h = m->hashes.data;
	struct kv_block **dedup;
	size_t n = m->n_blocks, i;
	uint32_t *rep;
	int r;

	pl->c.key = q_alloc(q, n * sizeof(*pl->c.key));
	pl->c.ie = q_alloc(q, n * sizeof(*pl->c.ie));
	dedup = pl->c.dedup = q_alloc(q, n * sizeof(*pl->c.dedup));
	rep = q_alloc(q, n * sizeof(*rep));
	if (!pl->c.key || !pl->c.ie || !dedup || !rep)
		return -ENOMEM;
	kv_cache_seal_plan(q->d, p, h, n, &pl->c);
	for (i = 0; i < n; i++)
		if (dedup[i])
			dedup[i]->check = 0;
	for (i = 0; i < n; i++)
		if (dedup[i] && (r = kv_op_ref_room(q, dedup[i], i, ++dedup[i]->check)) < 0)
			return r;
	memset(rep, 0, n * sizeof(*rep));
	if ((r = n > 1 ? seal_repeats(q, h, pl->c.key, n, rep) : 0) < 0)
		return r;
	pl->repeats = r;
	/* A hash first sealed by this request: its later listings dedup onto
	 * the caller's own block. */
	for (i = 0; pl->repeats && i < n; i++)
		if (rep[i] && !dedup[i] && (r = kv_op_ref_room(q, q->blk[i], i, rep[i])) < 0)
			return r;
	return 0;
}

/* What a Seal says about its blocks for the events (kvcached.proto): a
 * client's counts and lengths are bounded here, before anything is sealed;
 * a bad one fails this request alone (EINVAL, with the block's index). The
 * strings are UTF-8 without NUL already (kv_pb_strings_ok()). Returns 0 or
 * -EINVAL, q failed. */
static int seal_meta_check(struct req *q, const Kvcached__Seal *m)
{
	size_t i, k;

	if (strlen(m->lora_name) > KV_EVENTS_LORA_MAX) {
		kv_op_fail(q, KVCACHED__ERROR_CODE__EINVAL, -1,
			   "seal: lora_name of %zu bytes, at most %d", strlen(m->lora_name),
			   KV_EVENTS_LORA_MAX);
		return -EINVAL;
	}
	if (m->n_extra_keys && m->n_extra_keys != m->n_blocks) {
		kv_op_fail(q, KVCACHED__ERROR_CODE__EINVAL, -1,
			   "seal of %zu blocks: extra_keys needs one entry per block or none, "
			   "got %zu", m->n_blocks, m->n_extra_keys);
		return -EINVAL;
	}
	for (i = 0; i < m->n_extra_keys; i++) {
		const Kvcached__BlockKeys *bk = m->extra_keys[i];

		if (bk->n_keys > KV_EVENTS_KEYS_MAX) {
			kv_op_fail(q, KVCACHED__ERROR_CODE__EINVAL, (int)i,
				   "seal: block %zu has %zu extra keys, at most %d", i, bk->n_keys,
				   KV_EVENTS_KEYS_MAX);
			return -EINVAL;
		}
		for (k = 0; k < bk->n_keys; k++) {
			const Kvcached__EventKey *e = bk->keys[k];
			size_t len;

			switch (e->key_case) {
			case KVCACHED__EVENT_KEY__KEY_TEXT:
				len = strlen(e->text);
				break;
			case KVCACHED__EVENT_KEY__KEY_DIGEST:
				len = e->digest.len;
				break;
			case KVCACHED__EVENT_KEY__KEY_MM:
				len = e->mm ? strlen(e->mm->identifier) : SIZE_MAX;
				break;
			default:
				len = SIZE_MAX;
			}
			if (len == SIZE_MAX || len > KV_EVENTS_KEY_MAX) {
				kv_op_fail(q, KVCACHED__ERROR_CODE__EINVAL, (int)i,
					   "seal: block %zu's extra key %zu is %s", i, k,
					   len == SIZE_MAX ? "empty (no text, digest or mm)"
							   : "over 1024 bytes");
				return -EINVAL;
			}
		}
	}
	return 0;
}

void kv_op_seal(struct req *q, const Kvcached__Seal *m)
{
	struct kv_pool *p = kv_op_pool(q, m->pool_id);
	int events = q->d->events != NULL;
	struct seal_plan pl;
	size_t i;

	if (!p)
		return;
	if (m->hashes.len != m->n_blocks * HASH) {
		kv_op_fail(q, KVCACHED__ERROR_CODE__EINVAL, -1,
			   "seal of %zu blocks needs %zu hash bytes, got %zu", m->n_blocks,
			   m->n_blocks * HASH, m->hashes.len);
		return;
	}
	/* Token ids (KV events): exactly block_tokens per block, or none. The
	 * frame bounds their number; a wrong one fails this request only. */
	if (m->n_token_ids && m->n_token_ids != (uint64_t)m->n_blocks * p->block_tokens) {
		kv_op_fail(q, KVCACHED__ERROR_CODE__EINVAL, -1,
			   "seal of %zu blocks of %u tokens needs %" PRIu64 " token ids or none, "
			   "got %zu", m->n_blocks, p->block_tokens,
			   (uint64_t)m->n_blocks * p->block_tokens, m->n_token_ids);
		return;
	}
	if (m->parent_hash.len && m->parent_hash.len != HASH) {
		kv_op_fail(q, KVCACHED__ERROR_CODE__EINVAL, -1,
			   "seal: parent_hash has %zu bytes, not %d", m->parent_hash.len, HASH);
		return;
	}
	if (seal_meta_check(q, m) < 0)
		return;
	if (resolve_once(q, p, m->blocks, m->n_blocks, 1) < 0)
		return;
	for (i = 0; i < m->n_blocks; i++) {
		if (q->blk[i]->state != KV_BLOCK_WRITABLE) {
			kv_op_fail(q, KVCACHED__ERROR_CODE__ESTATE, (int)i,
				   "block %#llx (index %zu) is sealed already",
				   (unsigned long long)m->blocks[i], i);
			return;
		}
	}
	/* The published blocks a dedup hands over may be in segments the
	 * peer has not seen. */
	if (seal_plan(q, p, m, &pl) < 0 || kv_op_want_segments(q, pl.c.dedup, m->n_blocks) < 0)
		return;
	if (kv_sessrefs_reserve(&q->ss->refs, m->n_blocks) < 0) {
		q->out = KV_OP_NOMEM;
		return;
	}
	/* The batch's blocks are born at one instant. */
	kv_pools_hold_clock(q->d->pools, kv_mono_ms());
	for (i = 0; i < m->n_blocks; i++) {
		struct kv_block *b = q->blk[i], *nb;
		/* A dedup drops b's reference, which may free b: the
		 * session's count on it goes first (sessrefs.h keeps it on
		 * the block). Only a hash the plan found, or any when the
		 * batch repeats one, can dedup. */
		int may_dedup = pl.repeats || pl.c.dedup[i];

		if (may_dedup)
			kv_sessrefs_sub(&q->ss->refs, b);
		nb = kv_cache_seal(q->d, p, b, m->hashes.data + i * HASH, &pl.c, i, pl.repeats);
		kv_assert(may_dedup || nb == b);
		if (events && nb == b && b->state == KV_BLOCK_SEALED)
			kv_events_sealed(q->d->events, p->id, p->block_tokens, m, i);
		if (may_dedup)
			kv_sessrefs_add(&q->ss->refs, nb);
		q->blk[i] = nb;
	}
	kv_pools_hold_clock(q->d->pools, 0);
	kv_op_reply_blocks(q, m->n_blocks);
}

/* The session's record of the tiers lookup m (n hashes of pool p) found
 * its blocks in (kv_cache_lookup()): kept from the lookup's earlier runs
 * (it parked or was held), else zeroed (G1) for a new lookup, told apart by
 * the session's count of finished frames (unchanged: the same frame run
 * again, session.h), pool and length. It was an XXH3 of all its hashes,
 * twice per rerun. NULL: no memory (KV_OP_NOMEM). */
static uint8_t *lookup_tiers(struct req *q, const struct kv_pool *p,
			     const Kvcached__Lookup *m, size_t n)
{
	struct kv_session *ss = q->ss;
	int again = ss->lk_tier_n == n && ss->lk_tier_pool == p &&
		    ss->lk_tier_req == ss->requests;

	ss->lk_tier_n = 0;
	if (n > ss->lk_tier_cap) {
		uint8_t *t = realloc(ss->lk_tier, n);

		if (!t) {
			q->out = KV_OP_NOMEM;
			return NULL;
		}
		ss->lk_tier = t;
		ss->lk_tier_cap = (uint32_t)n;
	}
	if (!again)
		memset(ss->lk_tier, 0, n);
	return ss->lk_tier;
}

/* Lookup m runs again later (parked, held): its tiers so far are kept. */
static void lookup_tiers_keep(struct req *q, const struct kv_pool *p, size_t n)
{
	q->ss->lk_tier_n = (uint32_t)n;
	q->ss->lk_tier_pool = p;
	q->ss->lk_tier_req = q->ss->requests;
}

/* Blocks whose references a batch takes or drops at once: a stretch still
 * in cache when the session's counts follow. */
#define REF_STRETCH 64

/* Takes one reference on each of q->blk[0..n) for q's session, whose room
 * (max_block_refs, kv_sessrefs_reserve()) the caller checked: a stretch at
 * a time, the blocks' references (kv_blocks_ref(): the counters once), the
 * session's counts on them and, with h, their reply handles into h[0..n)
 * (kv_op_handles()), while the stretch is in cache (issue 38: Lookup's
 * references and its reply were two passes over the chain). Head first:
 * taken from the tail back, so that Lookup's room pass had left the
 * stretches' lines in L1, a lookup of 1,000 measured 2-3 us slower (the
 * sixth pass in docs/benchmarks.md). */
static void take_refs(struct req *q, size_t n, uint64_t *h)
{
	for (size_t i = 0; i < n; i += REF_STRETCH) {
		size_t e = n - i < REF_STRETCH ? n : i + REF_STRETCH;

		kv_blocks_ref(q->blk + i, e - i);
		kv_sessrefs_add_many(&q->ss->refs, q->blk + i, e - i);
		if (h)
			kv_op_handles(q, q->blk + i, e - i, h + i);
	}
}

/* The common case of Lookup's max_block_refs check in one pass instead of
 * two (issue 38): no block listed twice and each with room for one more
 * reference (ref - mine[i] < max_block_refs, ref < KV_BLOCK_REF_MAX). A
 * repeat is told by a stamp of this pass in b->check (every other use of
 * check sets it before reading it). The same pass lists in first[] the
 * first block of each stretch of one run, which is all that
 * kv_op_want_segments() reads of the others (their segment is their run's):
 * *nfirst of them. 1: all have room; 0: the exact check decides (a repeat,
 * a block without room, or a stamp left over from an earlier pass of the
 * same value: only slower, never wrong). */
static int lookup_room_fast(struct req *q, size_t k, const uint32_t *mine,
			    struct kv_block **first, size_t *nfirst)
{
	uint32_t max = q->d->cfg.max_block_refs, stamp = check_stamp();
	const struct kv_run *run = NULL;
	size_t f = 0;

	if (max > KV_BLOCK_REF_MAX)
		max = KV_BLOCK_REF_MAX;
	for (size_t i = 0; i < k; i++) {
		struct kv_block *b = q->blk[i];

		/* A chain's blocks are in L2 at best: their lines are asked
		 * for a few blocks ahead. */
		if (i + BLK_AHEAD < k)
			kv_block_prefetch(q->blk[i + BLK_AHEAD]);
		if (b->check == stamp || b->ref - (mine ? mine[i] : 0) >= max ||
		    b->ref >= KV_BLOCK_REF_MAX)
			return 0;
		b->check = stamp;
		if (b->run != run) {
			run = b->run;
			first[f++] = b;
		}
	}
	*nfirst = f;
	return 1;
}

void kv_op_lookup(struct req *q, const Kvcached__Lookup *m)
{
	struct kv_pool *p = kv_op_pool(q, m->pool_id);
	size_t n = m->hashes.len / HASH, k, nfirst = 0;
	uint32_t old_pins, *mine = NULL;
	struct kv_block **first = NULL, **segs;
	uint64_t *h;
	uint8_t *tiers = NULL;
	Kvcached__Tier *tv = NULL;
	int r;

	if (!p)
		return;
	if (m->hashes.len % HASH || n > q->d->cfg.max_batch) {
		kv_op_fail(q, m->hashes.len % HASH ? KVCACHED__ERROR_CODE__EINVAL
						   : KVCACHED__ERROR_CODE__E2BIG, -1,
			   "lookup of %zu hash bytes: must be a multiple of %d, at most %u hashes",
			   m->hashes.len, HASH, q->d->cfg.max_batch);
		return;
	}
	if (m->tiers && n && !(tiers = lookup_tiers(q, p, m, n)))
		return;
	r = kv_cache_lookup(q->d, q->ss, p, m->hashes.data, n, q->blk, &old_pins, tiers);
	if (r == -EINPROGRESS) {
		q->out = KV_OP_PARK;
		if (tiers)
			lookup_tiers_keep(q, p, n);
		return;
	}
	if (r < 0) {
		q->out = KV_OP_NOMEM;
		return;
	}
	k = (size_t)r;
	/* A hit that would take a block past max_block_refs refuses the whole
	 * lookup, before any reference is taken (a chain may list one block
	 * many times: b->check counts them). The pins a parked run left go
	 * once the references are taken, so they do not count (mine[i]: how
	 * many of blk[i]'s references they are, kv_cache_lookup_held()). */
	if (old_pins && k) {
		if (!(mine = q_alloc(q, k * sizeof(*mine)))) {
			kv_cache_lookup_done(q->ss, old_pins);
			return;
		}
		kv_cache_lookup_held(q->ss, q->blk, k, old_pins, mine);
	}
	if (k && !(first = q_alloc(q, k * sizeof(*first)))) {
		kv_cache_lookup_done(q->ss, old_pins);
		return;
	}
	if (lookup_room_fast(q, k, mine, first, &nfirst)) {
		segs = first;
	} else {
		for (size_t i = 0; i < k; i++)
			q->blk[i]->check = 0;
		for (size_t i = 0; i < k; i++)
			if (kv_op_ref_room_less(q, q->blk[i], i, ++q->blk[i]->check,
						mine ? mine[i] : 0) < 0) {
				kv_cache_lookup_done(q->ss, old_pins);
				return;
			}
		segs = q->blk;
		nfirst = k;
	}
	if (kv_op_want_segments(q, segs, nfirst) < 0) {
		/* A held lookup keeps its pins for when it runs again. */
		if (q->out != KV_OP_HOLD)
			kv_cache_lookup_done(q->ss, old_pins);
		else if (tiers)
			lookup_tiers_keep(q, p, n);
		return;
	}
	if (kv_sessrefs_reserve(&q->ss->refs, k) < 0) {
		q->out = KV_OP_NOMEM;
		return;
	}
	if (tiers && k && !(tv = q_alloc(q, k * sizeof(*tv))))
		return;
	if (!(h = q_alloc(q, (k ? k : 1) * sizeof(*h))))
		return;
	take_refs(q, k, h);
	kv_cache_lookup_done(q->ss, old_pins);
	kv_cache_count_lookup(q->d, p, n, k);
	kv_op_reply_handles(q, h, k);
	if (tv && q->rs->result_case == KVCACHED__RESPONSE__RESULT_BLOCKS) {
		for (size_t i = 0; i < k; i++)
			tv[i] = (Kvcached__Tier)tiers[i];
		q->rs->blocks->n_tiers = k;
		q->rs->blocks->tiers = tv;
	}
}

void kv_op_release(struct req *q, const Kvcached__Release *m)
{
	size_t i;

	if (resolve_once(q, NULL, m->blocks, m->n_blocks, 0) < 0)
		return;
	/* Tail first: a chain listed head first leaves its tail the oldest in
	 * the LRU, so eviction takes it before the head. A stretch at a time
	 * (still in cache): the session's counts (which go first: an unref
	 * may free the block), then the blocks' references. */
	for (i = m->n_blocks; i > 0;) {
		size_t from = i > REF_STRETCH ? i - REF_STRETCH : 0;

		kv_sessrefs_sub_many(&q->ss->refs, q->blk + from, i - from);
		kv_blocks_unref_back(q->blk + from, i - from);
		i = from;
	}
	q->rs->result_case = KVCACHED__RESPONSE__RESULT__NOT_SET;
}

void kv_op_fork(struct req *q, const Kvcached__Fork *m)
{
	size_t i;

	if (kv_op_resolve(q, NULL, m->blocks, m->n_blocks, 0) < 0)
		return;
	/* b->check: how often the request lists b. */
	for (i = 0; i < m->n_blocks; i++)
		if (kv_op_ref_room(q, q->blk[i], i, q->blk[i]->check) < 0)
			return;
	if (kv_sessrefs_reserve(&q->ss->refs, m->n_blocks) < 0) {
		q->out = KV_OP_NOMEM;
		return;
	}
	/* The blocks are held: their segments are the session's already. */
	take_refs(q, m->n_blocks, NULL);
	kv_op_reply_blocks(q, m->n_blocks);
}

static void unref_copies(struct kv_block **copy, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (copy[i])
			kv_block_unref(copy[i]);
}

void kv_op_cow(struct req *q, const Kvcached__Cow *m)
{
	struct kv_block **copy, **tmp;
	size_t i, n = m->n_blocks;
	char why[512];
	int r;

	if (kv_op_resolve(q, NULL, m->blocks, n, 0) < 0)
		return;
	if (!(copy = q_alloc(q, n * sizeof(*copy))) || !(tmp = q_alloc(q, n * sizeof(*tmp))))
		return;
	if (kv_sessrefs_reserve(&q->ss->refs, n) < 0) {
		q->out = KV_OP_NOMEM;
		return;
	}
	/* Allocate every copy first so that ENOSPC leaves the caller's blocks
	 * and references as they were (cached blocks evicted on the way stay
	 * evicted: they were only a cache). A block written only through this
	 * reference needs no copy. The copies of one pool are one allocation,
	 * so that an ENOSPC names what the whole Cow needs of it, not of one
	 * block with the others it took for itself counted as held. */
	for (i = 0; i < n; i++) {
		struct kv_block *b = q->blk[i];

		copy[i] = NULL;
		if (b->state == KV_BLOCK_WRITABLE && b->ref == 1)
			copy[i] = b;   /* marks "no copy" until the loop below */
	}
	for (i = 0; i < n; i++) {
		struct kv_pool *p = kv_block_pool(q->blk[i]);
		uint32_t k = 0, j;

		if (copy[i])
			continue;
		for (j = (uint32_t)i; j < n; j++)
			if (!copy[j] && kv_block_pool(q->blk[j]) == p)
				tmp[k++] = q->blk[j];
		r = kv_cache_alloc(q->d, q->ss, p, k, tmp, why, sizeof(why));
		if (r < 0) {
			for (j = 0; j < n; j++)
				if (copy[j] == q->blk[j])
					copy[j] = NULL;
			unref_copies(copy, n);
			if (r == -EINPROGRESS) {
				q->out = KV_OP_PARK;
				return;
			}
			kv_op_fail(q, kv_op_errno_code(r), -1, "copy-on-write of %zu blocks: %s", n,
				   why);
			return;
		}
		for (j = (uint32_t)i, k = 0; j < n; j++)
			if (!copy[j] && kv_block_pool(q->blk[j]) == p)
				copy[j] = tmp[k++];
	}
	for (i = 0; i < n; i++)
		if (copy[i] == q->blk[i])
			copy[i] = NULL;
	if (kv_op_want_segments(q, copy, n) < 0) {
		unref_copies(copy, n);
		return;
	}
	for (i = 0; i < n; i++) {
		if (copy[i] && (r = kv_block_copy(copy[i], q->blk[i])) < 0) {
			unref_copies(copy, n);
			kv_err("copy-on-write: backend copy failed: %s", strerror(-r));
			kv_op_fail(q, KVCACHED__ERROR_CODE__EINTERNAL, -1, "block copy failed: %s",
				   strerror(-r));
			return;
		}
	}
	for (i = 0; i < n; i++) {
		if (!copy[i])
			continue;
		kv_sessrefs_sub(&q->ss->refs, q->blk[i]);
		kv_block_unref(q->blk[i]);
		kv_sessrefs_add(&q->ss->refs, copy[i]);
		q->blk[i] = copy[i];
	}
	kv_op_reply_blocks(q, n);
}

void kv_op_swap_out(struct req *q, const Kvcached__SwapOut *m)
{
	Kvcached__SwapOutReply *r = q_alloc(q, sizeof(*r));
	uint64_t held = q->ss->swaps.bytes, want, handle;
	struct kv_pool *p;
	char why[512];
	size_t i;
	int rc;

	if (!r || kv_op_resolve(q, NULL, m->blocks, m->n_blocks, 1) < 0)
		return;
	p = kv_block_pool(q->blk[0]);
	for (i = 1; i < m->n_blocks; i++) {
		if (kv_block_pool(q->blk[i]) != p) {
			kv_op_fail(q, KVCACHED__ERROR_CODE__EINVAL, (int)i,
				   "swap out: block %zu is of another pool than block 0", i);
			return;
		}
	}
	/* One connection may not take the whole host tier from the others. */
	want = (uint64_t)m->n_blocks * p->block_bytes;
	if (held > q->d->cfg.max_swap_per_session || want > q->d->cfg.max_swap_per_session - held) {
		kv_ns_get(kv_pools_nstab(q->d->pools), q->ss->ns)->quota_refusals++;
		kv_op_fail(q, KVCACHED__ERROR_CODE__EQUOTA, -1,
			   "swap out of %zu blocks (%" PRIu64 " bytes): this connection holds %" PRIu64
			   " bytes swapped out already, max_swap_per_session is %" PRIu64,
			   m->n_blocks, want, held, q->d->cfg.max_swap_per_session);
		return;
	}
	rc = kv_tiers_swap_out(q->d->tiers, &q->ss->swaps, p, q->blk, (uint32_t)m->n_blocks,
			       &q->ss->waiter, &handle, why, sizeof(why));
	if (rc == -EINPROGRESS) {
		q->out = KV_OP_PARK;  /* another swap goes to disk to make room */
		return;
	}
	if (rc < 0) {
		kv_op_fail(q, kv_op_errno_code(rc), -1, "swap out: %s", why);
		return;
	}
	/* The swap holds these references now. */
	for (i = 0; i < m->n_blocks; i++)
		kv_sessrefs_sub(&q->ss->refs, q->blk[i]);
	kvcached__swap_out_reply__init(r);
	r->swap = handle;
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_SWAP_OUT;
	q->rs->swap_out = r;
}

/* How many segments (of every device) the peer has not been sent, up to
 * max: the most fds a reply of blocks unknown yet could need. */
static uint64_t unsent_segments(const struct kv_session *ss, uint64_t max)
{
	const struct kv_backend *be = ss->d->be;
	uint64_t n = 0;

	for (uint32_t dev = 0; dev < be->devices; dev++)
		for (uint32_t seg = 0; seg < be->segments[dev] && n < max; seg++)
			n += !kv_session_has_segment(ss, dev, seg);
	return n;
}

void kv_op_swap_in(struct req *q, const Kvcached__SwapIn *m)
{
	char why[512];
	uint32_t n = 0, i;
	int rc;

	if (kv_sessrefs_reserve(&q->ss->refs, q->d->cfg.max_batch) < 0) {
		q->out = KV_OP_NOMEM;
		return;
	}
	/* A swap-in cannot be undone once it returns its blocks: room for
	 * the fds of every segment they could be in is made sure of first. */
	if (kv_op_fds_room(q, unsent_segments(q->ss, q->d->cfg.max_batch)) < 0)
		return;
	rc = kv_tiers_swap_in(q->d->tiers, &q->ss->swaps, m->swap, &q->ss->waiter, q->blk,
			      q->d->cfg.max_batch, &n, why, sizeof(why));
	if (rc == -EINPROGRESS) {
		q->out = KV_OP_PARK;
		return;
	}
	if (rc < 0) {
		if (rc == -ENOSPC)
			kv_cache_count_enospc(q->d, q->ss->ns);
		kv_op_fail(q, kv_op_errno_code(rc), -1, "swap in: %s", why);
		return;
	}
	for (i = 0; i < n; i++)
		kv_sessrefs_add(&q->ss->refs, q->blk[i]);
	if (kv_op_want_segments(q, q->blk, n) < 0) {
		/* Only a dup that failed gets here (room was checked): the
		 * blocks are the session's now and cannot be given back. */
		kv_err("session %llu: swap in: the segment fds cannot be passed; closing the session "
		       "(its blocks are released with it)", (unsigned long long)q->ss->id);
		q->out = KV_OP_NOMEM;
		return;
	}
	kv_op_reply_blocks(q, n);
}
