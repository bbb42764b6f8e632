/* Request handlers; see ops.h. */
#include "ops.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "log.h"
#include "metrics.h"

#define HASH KV_HASH_BYTES

struct req {
	struct kv_server *s;
	struct kv_session *ss;
	Kvcached__Response *rs;
	struct kv_block **blk;  /* s->scratch: max_batch entries */
};

static int __attribute__((format(printf, 4, 5)))
fail(struct req *q, Kvcached__ErrorCode code, int index, const char *fmt, ...)
{
	Kvcached__Error *e = kv_arena_alloc(&q->s->arena, sizeof(*e));
	char *msg = kv_arena_alloc(&q->s->arena, 256);
	va_list ap;

	if (!e || !msg)
		return -ENOMEM;
	kvcached__error__init(e);
	va_start(ap, fmt);
	vsnprintf(msg, 256, fmt, ap);
	va_end(ap);
	e->code = code;
	e->message = msg;
	e->index = index;
	q->rs->error = e;
	q->rs->result_case = KVCACHED__RESPONSE__RESULT__NOT_SET;
	return code == KVCACHED__ERROR_CODE__EPROTO ? KV_OPS_CLOSE : 0;
}

static int need_admin(struct req *q, const char *what)
{
	return fail(q, KVCACHED__ERROR_CODE__EPERM, -1,
		    "%s is an admin operation: use the admin socket (%s), or connect as root or "
		    "the daemon's uid", what, q->s->cfg.admin_socket_path);
}

/* The pool id names in this session's namespace, or NULL (error set). */
static struct kv_pool *get_pool(struct req *q, uint32_t id)
{
	struct kv_pool *p = kv_pool_get(q->s->pools, id);

	if (!p || p->ns != q->ss->ns) {
		fail(q, KVCACHED__ERROR_CODE__ENOENT, -1, "no pool %u in namespace '%s'", id,
		     kv_pools_ns_name(q->s->pools, q->ss->ns));
		return NULL;
	}
	return p;
}

/* Replies with the handles of q->blk[0..n), sending the fd of every segment
 * they live in that this session has not seen yet. */
static int reply_blocks(struct req *q, size_t n)
{
	Kvcached__BlockList *bl = kv_arena_alloc(&q->s->arena, sizeof(*bl));
	uint64_t *h = kv_arena_alloc(&q->s->arena, (n ? n : 1) * sizeof(uint64_t));
	Kvcached__Segment **segs = NULL;
	size_t i, nseg = 0;

	if (!bl || !h)
		return -ENOMEM;
	kvcached__block_list__init(bl);
	for (i = 0; i < n; i++) {
		uint32_t dev, seg;
		int r;

		h[i] = kv_block_handle(q->blk[i]);
		kv_block_where(q->blk[i], &dev, &seg);
		r = kv_session_want_segment(q->ss, dev, seg);
		if (r < 0)
			return r;
		if (r == 0)
			continue;
		if (!segs && !(segs = kv_arena_alloc(&q->s->arena, n * sizeof(*segs))))
			return -ENOMEM;
		segs[nseg] = kv_arena_alloc(&q->s->arena, sizeof(**segs));
		if (!segs[nseg])
			return -ENOMEM;
		kvcached__segment__init(segs[nseg]);
		segs[nseg]->device = dev;
		segs[nseg]->index = seg;
		segs[nseg]->offset = (uint64_t)seg * q->s->be->segment_bytes;
		segs[nseg]->bytes = q->s->be->segment_bytes;
		nseg++;
	}
	bl->n_blocks = n;
	bl->blocks = h;
	q->rs->n_segments = nseg;
	q->rs->segments = segs;
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_BLOCKS;
	q->rs->blocks = bl;
	return 0;
}

/* Resolves handles[0..n) into q->blk, each a block this session holds, of
 * pool p when p is given. At most `per` references per block may be listed
 * (0: as many as the session holds). Returns 0, or the error reply's code. */
static int resolve(struct req *q, struct kv_pool *p, const uint64_t *handles, size_t n,
		   uint32_t per, int *err)
{
	size_t i;

	*err = 0;
	if (n == 0 || n > q->s->cfg.max_batch) {
		*err = fail(q, n ? KVCACHED__ERROR_CODE__E2BIG : KVCACHED__ERROR_CODE__EINVAL, -1,
			    "batch of %zu blocks: must be 1..%u", n, q->s->cfg.max_batch);
		return -1;
	}
	for (i = 0; i < n; i++) {
		struct kv_block *b = kv_block_lookup(q->s->pools, handles[i]);

		if (!b || b->state == KV_BLOCK_FREE || kv_block_pool(b)->ns != q->ss->ns ||
		    (p && kv_block_pool(b) != p)) {
			*err = fail(q, KVCACHED__ERROR_CODE__ESTALE, (int)i,
				    "block %#llx (index %zu) is stale, forged or %s",
				    (unsigned long long)handles[i], i,
				    b && p && kv_block_pool(b) != p ? "of another pool" : "unknown");
			return -1;
		}
		b->check = 0;
		q->blk[i] = b;
	}
	for (i = 0; i < n; i++) {
		struct kv_block *b = q->blk[i];
		uint32_t held = kv_refmap_get(&q->ss->refs, b);
		uint32_t limit = per && per < held ? per : held;

		if (++b->check > limit) {
			*err = fail(q, held ? KVCACHED__ERROR_CODE__ESTATE : KVCACHED__ERROR_CODE__ESTALE,
				    (int)i, "block %#llx (index %zu): %s",
				    (unsigned long long)handles[i], i,
				    !held ? "not held by this connection"
					  : per == 1 ? "listed twice"
						     : "listed more times than references held");
			return -1;
		}
	}
	return 0;
}

static int op_hello(struct req *q, const Kvcached__Hello *h)
{
	struct kv_server *s = q->s;
	Kvcached__HelloReply *r;
	int ns;

	if (q->ss->ns)
		return fail(q, KVCACHED__ERROR_CODE__EPROTO, -1, "Hello sent twice");
	if (h->min_version > KV_PROTO_VERSION || h->max_version < KV_PROTO_VERSION)
		return fail(q, KVCACHED__ERROR_CODE__EVERSION, -1,
			    "client speaks versions %u..%u, daemon speaks %u", h->min_version,
			    h->max_version, KV_PROTO_VERSION);
	ns = kv_pools_ns(s->pools, h->namespace_ && h->namespace_[0] ? h->namespace_ : "default");
	if (ns < 0)
		return fail(q, KVCACHED__ERROR_CODE__EINVAL, -1, "namespace '%s': %s",
			    h->namespace_, ns == -ENOSPC ? "too many namespaces" : "bad name");
	q->ss->ns = (uint32_t)ns;
	snprintf(q->ss->name, sizeof(q->ss->name), "%s", h->client_name ? h->client_name : "");
	r = kv_arena_alloc(&s->arena, sizeof(*r));
	if (!r)
		return -ENOMEM;
	kvcached__hello_reply__init(r);
	r->version = KV_PROTO_VERSION;
	r->page_bytes = s->cfg.page_bytes;
	r->segment_bytes = s->be->segment_bytes;
	r->device_bytes = s->be->segment_bytes * s->be->segments[0];
	r->devices = s->be->devices;
	r->backend = (char *)s->be->name;
	r->max_frame = s->cfg.max_frame;
	r->max_batch = s->cfg.max_batch;
	r->session_id = q->ss->id;
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_HELLO;
	q->rs->hello = r;
	return 0;
}

static int op_register(struct req *q, const Kvcached__RegisterPool *m)
{
	struct kv_pool_desc d = {
		.name = m->name, .device = m->device, .block_bytes = m->block_bytes,
		.block_tokens = m->block_tokens, .dtype = m->dtype,
		.layout = m->layout.data, .layout_len = m->layout.len,
	};
	Kvcached__RegisterPoolReply *r;
	struct kv_pool *p;
	char err[256];
	uint32_t before = kv_pools_count(q->s->pools);
	int rc = kv_pool_register(q->s->pools, q->ss->ns, &d, &p, err, sizeof(err));

	if (rc == 0 && kv_pools_count(q->s->pools) != before)
		kv_tiers_pool_added(q->s->tiers, p);
	if (rc < 0)
		return fail(q, rc == -EEXIST ? KVCACHED__ERROR_CODE__EEXIST
			       : rc == -ENOSPC ? KVCACHED__ERROR_CODE__ENOSPC
			       : rc == -ENOMEM ? KVCACHED__ERROR_CODE__EINTERNAL
					       : KVCACHED__ERROR_CODE__EINVAL, -1, "%s", err);
	r = kv_arena_alloc(&q->s->arena, sizeof(*r));
	if (!r)
		return -ENOMEM;
	kvcached__register_pool_reply__init(r);
	r->pool_id = p->id;
	r->run_bytes = (uint64_t)p->run_pages * q->s->cfg.page_bytes;
	r->blocks_per_run = p->blocks_per_run;
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_REGISTER_POOL;
	q->rs->register_pool = r;
	kv_debug("session %llu: pool %u '%s' block_bytes %llu: runs of %u pages, %u blocks",
		 (unsigned long long)q->ss->id, p->id, p->name, (unsigned long long)p->block_bytes,
		 p->run_pages, p->blocks_per_run);
	return 0;
}

static int op_alloc(struct req *q, const Kvcached__Alloc *m)
{
	struct kv_pool *p = get_pool(q, m->pool_id);
	char why[512];
	uint32_t i;

	if (!p)
		return 0;
	if (m->count == 0 || m->count > q->s->cfg.max_batch)
		return fail(q, m->count ? KVCACHED__ERROR_CODE__E2BIG : KVCACHED__ERROR_CODE__EINVAL,
			    -1, "alloc of %u blocks: must be 1..%u", m->count, q->s->cfg.max_batch);
	if (kv_refmap_reserve(&q->ss->refs, m->count) < 0)
		return -ENOMEM;
	if (kv_pool_alloc(p, m->count, q->blk, why, sizeof(why)) < 0) {
		q->s->enospc++;
		return fail(q, KVCACHED__ERROR_CODE__ENOSPC, -1, "%s", why);
	}
	for (i = 0; i < m->count; i++)
		kv_refmap_add(&q->ss->refs, q->blk[i]);
	return reply_blocks(q, m->count);
}

static int op_seal(struct req *q, const Kvcached__Seal *m)
{
	struct kv_pool *p = get_pool(q, m->pool_id);
	size_t i;
	int err;

	if (!p)
		return 0;
	if (m->hashes.len != m->n_blocks * HASH)
		return fail(q, KVCACHED__ERROR_CODE__EINVAL, -1,
			    "seal of %zu blocks needs %zu hash bytes, got %zu", m->n_blocks,
			    m->n_blocks * HASH, m->hashes.len);
	if (resolve(q, p, m->blocks, m->n_blocks, 1, &err) < 0)
		return err;
	for (i = 0; i < m->n_blocks; i++)
		if (q->blk[i]->state != KV_BLOCK_WRITABLE)
			return fail(q, KVCACHED__ERROR_CODE__ESTATE, (int)i,
				    "block %#llx (index %zu) is sealed already",
				    (unsigned long long)m->blocks[i], i);
	if (kv_refmap_reserve(&q->ss->refs, m->n_blocks) < 0)
		return -ENOMEM;
	for (i = 0; i < m->n_blocks; i++) {
		struct kv_block *b = q->blk[i];
		kv_tiers_forget(q->s->tiers, p, m->hashes.data + i * HASH);
		struct kv_block *nb = kv_pool_seal(p, b, m->hashes.data + i * HASH);

		if (nb != b) {
			kv_refmap_sub(&q->ss->refs, b);
			kv_refmap_add(&q->ss->refs, nb);
			q->blk[i] = nb;
		}
	}
	return reply_blocks(q, m->n_blocks);
}

/* Drops the pins a parked lookup held (it has run again and holds what it
 * needs now). */
static void unpin(struct kv_session *ss, uint32_t n)
{
	uint32_t i;

	if (!n)
		return;
	for (i = 0; i < n; i++)
		kv_block_unref(ss->pins[i]);
	memmove(ss->pins, ss->pins + n, (ss->npins - n) * sizeof(*ss->pins));
	ss->npins -= n;
}

static int pin(struct kv_session *ss, struct kv_block *b)
{
	if (ss->npins == ss->pins_cap) {
		uint32_t cap = ss->pins_cap ? 2 * ss->pins_cap : 16;
		void *np = realloc(ss->pins, cap * sizeof(*ss->pins));

		if (!np)
			return -ENOMEM;
		ss->pins = np;
		ss->pins_cap = cap;
	}
	kv_block_ref(b);
	ss->pins[ss->npins++] = b;
	return 0;
}

static int op_lookup(struct req *q, const Kvcached__Lookup *m)
{
	struct kv_pool *p = get_pool(q, m->pool_id);
	size_t n = m->hashes.len / HASH, k;
	uint32_t old_pins = q->ss->npins;
	int parked = 0;

	if (!p)
		return 0;
	if (m->hashes.len % HASH || n > q->s->cfg.max_batch)
		return fail(q, m->hashes.len % HASH ? KVCACHED__ERROR_CODE__EINVAL
						    : KVCACHED__ERROR_CODE__E2BIG, -1,
			    "lookup of %zu hash bytes: must be a multiple of %d, at most %u hashes",
			    m->hashes.len, HASH, q->s->cfg.max_batch);
	/* Blocks in lower tiers are promoted first: all of the chain's at once,
	 * and the request parks on the first; when it runs again the next
	 * promotion still under way parks it, until the whole prefix is in G1. */
	for (k = 0; k < n; k++) {
		struct kv_index_entry *e = kv_pool_find_entry(p, m->hashes.data + k * HASH);

		if (!e)
			break;
		if (e->kind == KV_ENTRY_TIER) {
			int r = kv_tiers_promote(q->s->tiers, e, parked ? NULL : &q->ss->waiter);

			if (r == -EAGAIN)
				break;  /* no room to start more now: the rerun will */
			if (r < 0)
				break;  /* a miss from here on */
			parked = 1;
			continue;
		}
		q->blk[k] = kv_container_of(e, struct kv_block, ix);
	}
	if (parked) {
		/* While the request waits for the rest of the chain, the blocks
		 * it has found stay in G1: demotion would otherwise take them
		 * and the request could chase its own chain forever. */
		for (size_t i = 0; i < k; i++) {
			struct kv_index_entry *e = kv_pool_find_entry(p, m->hashes.data + i * HASH);

			if (e && e->kind == KV_ENTRY_BLOCK &&
			    pin(q->ss, kv_container_of(e, struct kv_block, ix)) < 0)
				return -ENOMEM;
		}
		unpin(q->ss, old_pins);
		return KV_OPS_PARK;
	}
	if (kv_refmap_reserve(&q->ss->refs, k) < 0)
		return -ENOMEM;
	for (size_t i = 0; i < k; i++) {
		kv_block_ref(q->blk[i]);
		kv_refmap_add(&q->ss->refs, q->blk[i]);
	}
	unpin(q->ss, old_pins);
	p->n.lookups += n;
	p->n.hits += k;
	return reply_blocks(q, k);
}

static int op_release(struct req *q, const Kvcached__Release *m)
{
	size_t i;
	int err;

	if (resolve(q, NULL, m->blocks, m->n_blocks, 0, &err) < 0)
		return err;
	/* Tail first: a chain listed head first leaves its tail the oldest in
	 * the LRU, so eviction takes it before the head. */
	for (i = m->n_blocks; i-- > 0;) {
		kv_refmap_sub(&q->ss->refs, q->blk[i]);
		kv_block_unref(q->blk[i]);
	}
	q->rs->result_case = KVCACHED__RESPONSE__RESULT__NOT_SET;
	return 0;
}

static int op_fork(struct req *q, const Kvcached__Fork *m)
{
	size_t i;
	int err;

	if (resolve(q, NULL, m->blocks, m->n_blocks, 0, &err) < 0)
		return err;
	if (kv_refmap_reserve(&q->ss->refs, m->n_blocks) < 0)
		return -ENOMEM;
	for (i = 0; i < m->n_blocks; i++) {
		kv_block_ref(q->blk[i]);
		kv_refmap_add(&q->ss->refs, q->blk[i]);
	}
	return reply_blocks(q, m->n_blocks);
}

static int op_cow(struct req *q, const Kvcached__Cow *m)
{
	struct kv_block **copy;
	size_t i, n = m->n_blocks;
	char why[512];
	int err, r;

	if (resolve(q, NULL, m->blocks, n, 0, &err) < 0)
		return err;
	copy = kv_arena_alloc(&q->s->arena, n * sizeof(*copy));
	if (!copy || kv_refmap_reserve(&q->ss->refs, n) < 0)
		return -ENOMEM;
	/* Allocate every copy first so that ENOSPC leaves the caller's blocks
	 * and references as they were (cached blocks evicted on the way stay
	 * evicted: they were only a cache). A block written only through this
	 * reference needs no copy. */
	for (i = 0; i < n; i++) {
		struct kv_block *b = q->blk[i];

		copy[i] = NULL;
		if (b->state == KV_BLOCK_WRITABLE && b->ref == 1)
			continue;
		if (kv_pool_alloc(kv_block_pool(b), 1, &copy[i], why, sizeof(why)) < 0) {
			while (i-- > 0)
				if (copy[i])
					kv_block_unref(copy[i]);
			q->s->enospc++;
			return fail(q, KVCACHED__ERROR_CODE__ENOSPC, -1, "%s", why);
		}
	}
	for (i = 0; i < n; i++) {
		if (!copy[i])
			continue;
		r = kv_block_copy(copy[i], q->blk[i]);
		if (r < 0) {
			for (i = 0; i < n; i++)
				if (copy[i])
					kv_block_unref(copy[i]);
			kv_err("copy-on-write: backend copy failed: %s", strerror(-r));
			return fail(q, KVCACHED__ERROR_CODE__EINTERNAL, -1, "block copy failed: %s",
				    strerror(-r));
		}
	}
	for (i = 0; i < n; i++) {
		if (!copy[i])
			continue;
		kv_refmap_sub(&q->ss->refs, q->blk[i]);
		kv_block_unref(q->blk[i]);
		kv_refmap_add(&q->ss->refs, copy[i]);
		q->blk[i] = copy[i];
	}
	return reply_blocks(q, n);
}

/* ---- stats, clients, check -------------------------------------------- */

static Kvcached__ErrorCode errno_code(int r)
{
	switch (r) {
	case -ENOSPC: return KVCACHED__ERROR_CODE__ENOSPC;
	case -ENOENT: return KVCACHED__ERROR_CODE__ENOENT;
	case -E2BIG: return KVCACHED__ERROR_CODE__E2BIG;
	case -EIO: return KVCACHED__ERROR_CODE__EIO;
	case -EINVAL: return KVCACHED__ERROR_CODE__EINVAL;
	default: return KVCACHED__ERROR_CODE__EINTERNAL;
	}
}

static int op_swap_out(struct req *q, const Kvcached__SwapOut *m)
{
	Kvcached__SwapOutReply *r = kv_arena_alloc(&q->s->arena, sizeof(*r));
	struct kv_pool *p;
	uint64_t handle;
	char why[256];
	size_t i;
	int err, rc;

	if (!r)
		return -ENOMEM;
	if (resolve(q, NULL, m->blocks, m->n_blocks, 1, &err) < 0)
		return err;
	p = kv_block_pool(q->blk[0]);
	for (i = 1; i < m->n_blocks; i++)
		if (kv_block_pool(q->blk[i]) != p)
			return fail(q, KVCACHED__ERROR_CODE__EINVAL, (int)i,
				    "swap out: block %zu is of another pool than block 0", i);
	rc = kv_tiers_swap_out(q->s->tiers, &q->ss->swaps, p, q->blk, (uint32_t)m->n_blocks,
			       &handle, why, sizeof(why));
	if (rc < 0)
		return fail(q, errno_code(rc), -1, "swap out: %s", why);
	/* The swap holds these references now. */
	for (i = 0; i < m->n_blocks; i++)
		kv_refmap_sub(&q->ss->refs, q->blk[i]);
	kvcached__swap_out_reply__init(r);
	r->swap = handle;
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_SWAP_OUT;
	q->rs->swap_out = r;
	return 0;
}

static int op_swap_in(struct req *q, const Kvcached__SwapIn *m)
{
	char why[512];
	uint32_t n = 0, i;
	int rc;

	if (kv_refmap_reserve(&q->ss->refs, q->s->cfg.max_batch) < 0)
		return -ENOMEM;
	rc = kv_tiers_swap_in(q->s->tiers, &q->ss->swaps, m->swap, &q->ss->waiter, q->blk,
			      q->s->cfg.max_batch, &n, why, sizeof(why));
	if (rc == -EINPROGRESS)
		return KV_OPS_PARK;
	if (rc < 0) {
		if (rc == -ENOSPC)
			q->s->enospc++;
		return fail(q, errno_code(rc), -1, "swap in: %s", why);
	}
	for (i = 0; i < n; i++)
		kv_refmap_add(&q->ss->refs, q->blk[i]);
	return reply_blocks(q, n);
}

static int op_evict(struct req *q, const Kvcached__Evict *m)
{
	Kvcached__EvictReply *r = kv_arena_alloc(&q->s->arena, sizeof(*r));

	if (!kv_session_is_admin(q->ss))
		return need_admin(q, "evict");
	if (!r)
		return -ENOMEM;
	if (!m->all_pools && !kv_pool_get(q->s->pools, m->pool_id))
		return fail(q, KVCACHED__ERROR_CODE__ENOENT, -1, "no pool %u", m->pool_id);
	if (m->tier > KVCACHED__TIER__TIER_G3)
		return fail(q, KVCACHED__ERROR_CODE__EINVAL, -1, "no tier %d", (int)m->tier);
	kvcached__evict_reply__init(r);
	r->blocks = kv_tiers_evict(q->s->tiers, (int)m->tier, m->all_pools ? -1 : (int)m->pool_id);
	kv_info("evict of tier G%d, %s: %llu blocks", (int)m->tier + 1,
		m->all_pools ? "all pools" : "one pool", (unsigned long long)r->blocks);
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_EVICT;
	q->rs->evict = r;
	return 0;
}

static int op_flush(struct req *q)
{
	Kvcached__FlushReply *r = kv_arena_alloc(&q->s->arena, sizeof(*r));

	if (!kv_session_is_admin(q->ss))
		return need_admin(q, "flush");
	if (!r)
		return -ENOMEM;
	kvcached__flush_reply__init(r);
	r->started = kv_tiers_flush(q->s->tiers);
	r->clean = kv_tiers_clean(q->s->tiers);
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_FLUSH;
	q->rs->flush = r;
	return 0;
}

static char *arena_str(struct kv_arena *a, const char *s)
{
	size_t n = strlen(s) + 1;
	char *p = kv_arena_alloc(a, n);

	if (p)
		memcpy(p, s, n);
	return p;
}

/* The namespaces with pools or sessions: all for an admin, else the caller's. */
static int stats_namespaces(struct req *q, Kvcached__StatsReply *r, int admin)
{
	struct kv_server *s = q->s;
	struct kv_ns_usage *u = malloc((KV_MAX_NS + 1) * sizeof(*u));
	uint32_t ns;

	if (!u)
		return -ENOMEM;
	kv_metrics_ns_usage(s, u);
	r->namespaces = kv_arena_alloc(&s->arena, KV_MAX_NS * sizeof(*r->namespaces));
	for (ns = 1; r->namespaces && ns <= KV_MAX_NS; ns++) {
		Kvcached__NamespaceInfo *ni;

		if ((!u[ns].pools && !u[ns].sessions) || (!admin && ns != q->ss->ns))
			continue;
		ni = kv_arena_alloc(&s->arena, sizeof(*ni));
		if (!ni) {
			r->namespaces = NULL;
			break;
		}
		kvcached__namespace_info__init(ni);
		ni->name = (char *)kv_pools_ns_name(s->pools, ns);
		ni->pools = u[ns].pools;
		ni->sessions = u[ns].sessions;
		ni->blocks_writable = u[ns].writable;
		ni->blocks_sealed = u[ns].sealed;
		ni->blocks_cached = u[ns].cached;
		ni->bytes = u[ns].bytes;
		r->namespaces[r->n_namespaces++] = ni;
	}
	free(u);
	return r->namespaces ? 0 : -ENOMEM;
}

static int op_stats(struct req *q)
{
	struct kv_server *s = q->s;
	Kvcached__StatsReply *r = kv_arena_alloc(&s->arena, sizeof(*r));
	uint64_t total, nfree, page_bytes;
	int admin = kv_session_is_admin(q->ss);
	uint32_t id;

	if (!r)
		return -ENOMEM;
	kvcached__stats_reply__init(r);
	kv_pools_pages(s->pools, &total, &nfree, &page_bytes);
	r->version = (char *)KV_VERSION;
	r->backend = (char *)s->be->name;
	r->uptime_ms = kv_now_ms() - s->start_ms;
	r->page_bytes = page_bytes;
	r->segment_bytes = s->be->segment_bytes;
	r->pages_total = total;
	r->pages_free = nfree;
	r->segments = s->be->segments[0];
	r->sessions = s->nsessions;
	r->requests = s->requests;
	r->enospc = s->enospc;
	r->draining = s->draining;
	r->drain_deadline_ms = s->draining ? s->drain_deadline_ms : 0;
	r->reloads = s->reloads;
	r->reload_failures = s->reload_failures;
	r->clients = kv_server_clients(s);
	if (stats_namespaces(q, r, admin) < 0)
		return -ENOMEM;
	r->pools = kv_arena_alloc(&s->arena, KV_MAX_POOLS * sizeof(*r->pools));
	if (!r->pools)
		return -ENOMEM;
	for (id = 0; id < KV_MAX_POOLS; id++) {
		struct kv_pool *p = kv_pool_get(s->pools, id);
		Kvcached__PoolInfo *pi;

		if (!p)
			break;
		if (!admin && p->ns != q->ss->ns)
			continue;
		pi = kv_arena_alloc(&s->arena, sizeof(*pi));
		if (!pi)
			return -ENOMEM;
		kvcached__pool_info__init(pi);
		pi->pool_id = p->id;
		pi->namespace_ = (char *)kv_pools_ns_name(s->pools, p->ns);
		pi->name = p->name;
		pi->device = p->device;
		pi->block_bytes = p->block_bytes;
		pi->block_tokens = p->block_tokens;
		pi->dtype = p->dtype;
		pi->run_bytes = (uint64_t)p->run_pages * page_bytes;
		pi->blocks_per_run = p->blocks_per_run;
		pi->runs = p->n.runs;
		pi->blocks_free = p->n.free;
		pi->blocks_writable = p->n.writable;
		pi->blocks_sealed = p->n.sealed;
		pi->blocks_cached = p->n.cached;
		pi->allocs = p->n.allocs;
		pi->lookups = p->n.lookups;
		pi->hits = p->n.hits;
		pi->evictions = p->n.evictions;
		pi->dedups = p->n.dedups;
		r->pools[r->n_pools++] = pi;
	}
	{
		struct kv_tier_stats st[KV_NTIERS];
		int t, nt = kv_tiers_on(s->tiers) ? KV_NTIERS : 1;

		kv_tiers_stats(s->tiers, st);
		r->tiers = kv_arena_alloc(&s->arena, KV_NTIERS * sizeof(*r->tiers));
		if (!r->tiers)
			return -ENOMEM;
		for (t = 0; t < nt; t++) {
			Kvcached__TierInfo *ti = kv_arena_alloc(&s->arena, sizeof(*ti));

			if (!ti)
				return -ENOMEM;
			if (t == KV_TIER_G3 && !st[t].capacity)
				break;
			kvcached__tier_info__init(ti);
			ti->tier = (Kvcached__Tier)t;
			ti->capacity_bytes = st[t].capacity;
			ti->used_bytes = st[t].used;
			ti->blocks = st[t].blocks;
			ti->dirty = st[t].dirty;
			ti->hits = st[t].hits;
			ti->promotions = st[t].promotions;
			ti->demotions = st[t].demotions;
			ti->evictions = st[t].evictions;
			ti->io_errors = st[t].io_errors;
			ti->checksum_failures = st[t].checksum_failures;
			ti->inflight = st[t].inflight;
			r->tiers[r->n_tiers++] = ti;
		}
	}
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_STATS;
	q->rs->stats = r;
	return 0;
}

static int op_clients(struct req *q)
{
	struct kv_server *s = q->s;
	Kvcached__ClientsReply *r = kv_arena_alloc(&s->arena, sizeof(*r));
	struct kv_list *pos;

	if (!kv_session_is_admin(q->ss))
		return need_admin(q, "listing clients");
	if (!r)
		return -ENOMEM;
	kvcached__clients_reply__init(r);
	r->clients = kv_arena_alloc(&s->arena, (s->nsessions + 1) * sizeof(void *));
	if (!r->clients)
		return -ENOMEM;
	kv_list_for_each(pos, &s->sessions) {
		struct kv_session *ss = kv_container_of(pos, struct kv_session, link);
		Kvcached__ClientInfo *ci = kv_arena_alloc(&s->arena, sizeof(*ci));

		if (!ci)
			return -ENOMEM;
		kvcached__client_info__init(ci);
		ci->session_id = ss->id;
		ci->pid = ss->cred.pid;
		ci->uid = ss->cred.uid;
		ci->gid = ss->cred.gid;
		ci->namespace_ = (char *)(ss->ns ? kv_pools_ns_name(s->pools, ss->ns) : "");
		ci->name = ss->name;
		ci->refs = ss->refs.refs;
		ci->connected_ms = ss->connected_ms;
		ci->requests = ss->requests;
		ci->admin = ss->admin;
		r->clients[r->n_clients++] = ci;
	}
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_CLIENTS;
	q->rs->clients = r;
	return 0;
}

struct check_ctx {
	struct kv_arena *arena;
	Kvcached__CheckReply *r;
	size_t cap;
};

static void count_ref(void *key, uint32_t count, void *ctx)
{
	(void)ctx;
	((struct kv_block *)key)->check += count;
}

static void add_problem(void *ctx, const char *msg)
{
	struct check_ctx *c = ctx;

	if (c->r->n_problems < c->cap && (c->r->problems[c->r->n_problems] = arena_str(c->arena, msg)))
		c->r->n_problems++;
}

/* Runs the whole invariant check, including that each block's refcount is
 * exactly what the sessions hold. O(blocks); an operator's tool. */
static int run_check(struct kv_server *s, Kvcached__CheckReply *r)
{
	struct check_ctx c = { .arena = &s->arena, .r = r, .cap = 100 };
	struct kv_list *pos;
	int problems;

	r->problems = kv_arena_alloc(&s->arena, c.cap * sizeof(char *));
	if (!r->problems)
		return -ENOMEM;
	kv_pools_check_clear(s->pools);
	kv_list_for_each(pos, &s->sessions) {
		struct kv_session *ss = kv_container_of(pos, struct kv_session, link);

		kv_refmap_each(&ss->refs, count_ref, NULL);
		for (uint32_t i = 0; i < ss->npins; i++)
			ss->pins[i]->check++;
	}
	kv_tiers_count_refs(s->tiers);
	problems = kv_pools_check(s->pools, 1, add_problem, &c, &r->blocks_checked,
				  kv_tiers_entries(s->tiers));
	problems += kv_tiers_check(s->tiers, add_problem, &c);
	r->ok = problems == 0;
	if (problems)
		kv_warn("invariant check: %d problems, first: %s", problems,
			r->n_problems ? r->problems[0] : "?");
	return 0;
}

static int op_check(struct req *q)
{
	Kvcached__CheckReply *r = kv_arena_alloc(&q->s->arena, sizeof(*r));

	if (!kv_session_is_admin(q->ss))
		return need_admin(q, "the invariant check");
	if (!r)
		return -ENOMEM;
	kvcached__check_reply__init(r);
	if (run_check(q->s, r) < 0)
		return -ENOMEM;
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_CHECK;
	q->rs->check = r;
	return 0;
}

/* ---- admin: evict, drain, reload, metrics ------------------------------ */

static int op_drain(struct req *q, const Kvcached__Drain *m)
{
	Kvcached__DrainReply *r;
	char why[64];

	if (!kv_session_is_admin(q->ss))
		return need_admin(q, "drain");
	r = kv_arena_alloc(&q->s->arena, sizeof(*r));
	if (!r)
		return -ENOMEM;
	kvcached__drain_reply__init(r);
	snprintf(why, sizeof(why), "drain asked by pid %d", (int)q->ss->cred.pid);
	r->already = kv_server_drain(q->s, m->timeout_ms ? m->timeout_ms
							  : q->s->cfg.drain_timeout_ms, why) == -EALREADY;
	r->clients = kv_server_clients(q->s);
	r->deadline_ms = q->s->drain_deadline_ms;
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_DRAIN;
	q->rs->drain = r;
	return 0;
}

struct reload_reply {
	struct req *q;
	Kvcached__ReloadReply *r;
	int nomem;
};

static void reload_line(void *ctx, const char *line, int applied)
{
	struct reload_reply *x = ctx;
	char *copy = arena_str(&x->q->s->arena, line);
	char ***list = applied ? &x->r->applied : &x->r->not_applied;
	size_t *n = applied ? &x->r->n_applied : &x->r->n_not_applied;

	if (!*list)
		*list = kv_arena_alloc(&x->q->s->arena, kv_cfg_nkeys * sizeof(char *));
	if (!copy || !*list || *n >= kv_cfg_nkeys) {
		x->nomem = 1;
		return;
	}
	(*list)[(*n)++] = copy;
}

static int op_reload(struct req *q)
{
	struct reload_reply x = { .q = q };
	char err[512];

	if (!kv_session_is_admin(q->ss))
		return need_admin(q, "reload");
	x.r = kv_arena_alloc(&q->s->arena, sizeof(*x.r));
	if (!x.r)
		return -ENOMEM;
	kvcached__reload_reply__init(x.r);
	if (kv_server_reload(q->s, reload_line, &x, err, sizeof(err)) < 0)
		return fail(q, KVCACHED__ERROR_CODE__ECONFIG, -1, "%s", err);
	if (x.nomem)
		return -ENOMEM;
	x.r->config_path = (char *)(q->s->src ? q->s->src->path : "");
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_RELOAD;
	q->rs->reload = x.r;
	return 0;
}

static int op_metrics(struct req *q)
{
	Kvcached__MetricsReply *r;
	char *text = NULL;
	size_t len = 0;
	FILE *f;
	int rc;

	if (!kv_session_is_admin(q->ss))
		return need_admin(q, "metrics");
	r = kv_arena_alloc(&q->s->arena, sizeof(*r));
	f = open_memstream(&text, &len);
	if (!r || !f) {
		if (f)
			fclose(f);
		free(text);
		return -ENOMEM;
	}
	kvcached__metrics_reply__init(r);
	rc = kv_metrics_write(q->s, f);
	if (fclose(f) != 0 || rc < 0 || !(r->text = arena_str(&q->s->arena, text))) {
		free(text);
		return -ENOMEM;
	}
	free(text);
	/* The reply must fit the client's frame limit. */
	if (len + 4096 > q->s->cfg.max_frame)
		return fail(q, KVCACHED__ERROR_CODE__E2BIG, -1,
			    "the metrics (%zu bytes) do not fit max_frame (%" PRIu32 "); raise it",
			    len, q->s->cfg.max_frame);
	q->rs->result_case = KVCACHED__RESPONSE__RESULT_METRICS;
	q->rs->metrics = r;
	return 0;
}

/* While draining, what would take new memory or new references is refused;
 * releasing and sealing what a client holds goes on. */
static int refuse_draining(struct req *q, const char *what)
{
	uint64_t now = kv_now_ms();
	uint64_t left = q->s->drain_deadline_ms > now ? q->s->drain_deadline_ms - now : 0;

	return fail(q, KVCACHED__ERROR_CODE__ESHUTDOWN, -1,
		    "kvcached is shutting down: no new %s; release what you hold and disconnect "
		    "(the daemon exits within %" PRIu64 " s)", what, (left + 999) / 1000);
}

int kv_ops_handle(struct kv_server *s, struct kv_session *ss, const Kvcached__Request *rq,
		  Kvcached__Response *rs)
{
	struct req q = { .s = s, .ss = ss, .rs = rs, .blk = s->scratch };

	rs->id = rq->id;
	if (!ss->ns && rq->op_case != KVCACHED__REQUEST__OP_HELLO)
		return fail(&q, KVCACHED__ERROR_CODE__EPROTO, -1, "the first request must be Hello");
	if (s->draining) {
		switch (rq->op_case) {
		case KVCACHED__REQUEST__OP_REGISTER_POOL:
			return refuse_draining(&q, "pools");
		case KVCACHED__REQUEST__OP_ALLOC:
		case KVCACHED__REQUEST__OP_COW:
		case KVCACHED__REQUEST__OP_SWAP_IN:
			return refuse_draining(&q, "allocations");
		case KVCACHED__REQUEST__OP_LOOKUP:
		case KVCACHED__REQUEST__OP_FORK:
			return refuse_draining(&q, "lookups or references");
		default:
			break;
		}
	}
	switch (rq->op_case) {
	case KVCACHED__REQUEST__OP_HELLO:
		return op_hello(&q, rq->hello);
	case KVCACHED__REQUEST__OP_REGISTER_POOL:
		return op_register(&q, rq->register_pool);
	case KVCACHED__REQUEST__OP_ALLOC:
		return op_alloc(&q, rq->alloc);
	case KVCACHED__REQUEST__OP_SEAL:
		return op_seal(&q, rq->seal);
	case KVCACHED__REQUEST__OP_LOOKUP:
		return op_lookup(&q, rq->lookup);
	case KVCACHED__REQUEST__OP_RELEASE:
		return op_release(&q, rq->release);
	case KVCACHED__REQUEST__OP_FORK:
		return op_fork(&q, rq->fork);
	case KVCACHED__REQUEST__OP_COW:
		return op_cow(&q, rq->cow);
	case KVCACHED__REQUEST__OP_STATS:
		return op_stats(&q);
	case KVCACHED__REQUEST__OP_LIST_CLIENTS:
		return op_clients(&q);
	case KVCACHED__REQUEST__OP_CHECK:
		return op_check(&q);
	case KVCACHED__REQUEST__OP_SWAP_OUT:
		return op_swap_out(&q, rq->swap_out);
	case KVCACHED__REQUEST__OP_SWAP_IN:
		return op_swap_in(&q, rq->swap_in);
	case KVCACHED__REQUEST__OP_EVICT:
		return op_evict(&q, rq->evict);
	case KVCACHED__REQUEST__OP_FLUSH:
		return op_flush(&q);
	case KVCACHED__REQUEST__OP_DRAIN:
		return op_drain(&q, rq->drain);
	case KVCACHED__REQUEST__OP_RELOAD:
		return op_reload(&q);
	case KVCACHED__REQUEST__OP_METRICS:
		return op_metrics(&q);
	default:
		return fail(&q, KVCACHED__ERROR_CODE__EPROTO, -1, "unknown operation");
	}
}
