/* Pool and block operations: each builds one request, lets kvc_call_check()
 * validate the reply under the connection's lock, and only then writes the
 * caller's outputs (untouched on any failure).
 *
 * Local checks return the code the daemon would have returned (KVC_EINVAL,
 * KVC_E2BIG, KVC_ENOENT) without a round trip. An empty batch is a no-op that
 * returns 0 without asking the daemon, except for alloc where a count of 0 is
 * an error. */
#include "kvc_internal.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kvtext.h"
#include "pbvarint.h"

enum reply_kind {
	REPLY_EXACT,   /* BlockList of exactly n blocks */
	REPLY_UPTO,    /* BlockList of at most n blocks (absent = none) */
	REPLY_EMPTY,   /* nothing, or an empty BlockList */
};

struct expect {
	enum reply_kind kind;
	size_t n;
	const uint32_t *pool;      /* every block must be of this pool: the request's pool id,
	                            * which kvc_call_check() has made the daemon's; NULL: any */
	const kvc_block *same;     /* block i must equal same[i] (fork) */
	const kvc_block *same_pool;/* block i must be of same_pool[i]'s pool (cow) */
	bool lookup;               /* a Lookup's reply: may say each block's tier */
	uint8_t *tiers;            /* Lookup: where to copy the blocks' tiers; NULL: none */
};

static const char *check_blocks(const Kvcached__Response *r, const void *arg)
{
	const struct expect *e = arg;
	const Kvcached__BlockList *l = r->result_case == KVCACHED__RESPONSE__RESULT_BLOCKS ?
					       r->blocks : NULL;
	size_t n = l ? l->n_blocks : 0, i;

	if (r->result_case != KVCACHED__RESPONSE__RESULT_BLOCKS &&
	    (r->result_case != KVCACHED__RESPONSE__RESULT__NOT_SET || e->kind == REPLY_EXACT))
		return "the daemon's reply is not a block list";
	switch (e->kind) {
	case REPLY_EXACT:
		if (n != e->n)
			return "the daemon returned the wrong number of blocks";
		break;
	case REPLY_UPTO:
		if (n > e->n)
			return "the daemon returned more blocks than asked for";
		break;
	case REPLY_EMPTY:
		if (n)
			return "the daemon returned blocks where none were expected";
		break;
	}
	if (l && l->n_tiers && (!e->lookup || l->n_tiers != n))
		return "the daemon returned tiers that do not match the blocks";
	for (i = 0; l && i < l->n_tiers; i++)
		if ((unsigned)l->tiers[i] > KVC_TIER_G4)
			return "the daemon returned an unknown tier";
	/* The pool of every block, in a loop of its own without a branch a
	 * block (issue 38: with the three checks in one loop, their pointers
	 * loaded again each block, it was a sixth of a lookup of 1,000's
	 * time in this library). */
	if (e->pool && n) {
		const uint64_t *bl = l->blocks;
		uint64_t want = *e->pool, bad = 0;

		for (i = 0; i < n; i++)
			bad |= KVC_BLOCK_POOL(bl[i]) ^ want;
		if (bad)
			return "the daemon returned a block of another pool";
	}
	for (i = 0; (e->same || e->same_pool) && i < n; i++) {
		kvc_block b = l->blocks[i];

		if (e->same && b != e->same[i])
			return "the daemon's fork returned another block";
		if (e->same_pool && KVC_BLOCK_POOL(b) != KVC_BLOCK_POOL(e->same_pool[i]))
			return "the daemon's copy-on-write moved a block to another pool";
	}
	return NULL;
}

/* Common argument checks for a batch of n. Returns 0 or a KVC_E* code. */
static int check_batch(kvc_conn *c, size_t n)
{
	const struct kvc_hello *h;

	if (!c)
		return KVC_EINVAL;
	h = kvc_conn_hello(c);
	return n > h->max_batch ? KVC_E2BIG : 0;
}

static int check_pool(int pool)
{
	return pool < 0 || (unsigned)pool >= KVC_MAX_POOLS ? KVC_ENOENT : 0;
}

/* Copies the blocks of resp (checked by check_blocks() against e) to out
 * (may be NULL for none) and their tiers to e->tiers. Returns how many. */
static size_t take_blocks(const Kvcached__Response *resp, const struct expect *e, kvc_block *out)
{
	size_t n = 0;

	if (resp->result_case == KVCACHED__RESPONSE__RESULT_BLOCKS) {
		n = resp->blocks->n_blocks;
		if (n && out)
			memcpy(out, resp->blocks->blocks, n * sizeof(*out));
		/* A daemon from before BlockList.tiers sends none. */
		for (size_t i = 0; e->tiers && i < n; i++)
			e->tiers[i] = resp->blocks->n_tiers ? (uint8_t)resp->blocks->tiers[i]
							    : KVC_TIER_UNKNOWN;
	}
	return n;
}

int kvc_blocks_view(const uint8_t *frame, size_t len, struct kvc_blocks_view *v)
{
	size_t off = 0;
	uint64_t x;

	*v = (struct kvc_blocks_view){ 0 };
	if (off < len && frame[off] == 0x08) {   /* id */
		off++;
		if (kv_pb_varint_get(frame, len, &off, 10, &v->id) < 0)
			return 0;
	}
	if (off == len)   /* no result (a Release's reply) */
		return 2;
	/* blocks (the result), the rest of the frame */
	if (off >= len || frame[off++] != 0x62 || kv_pb_varint_get(frame, len, &off, 5, &x) < 0 ||
	    x != len - off)
		return 0;
	if (off < len && frame[off] == 0x0a) {   /* BlockList.blocks */
		off++;
		if (kv_pb_varint_get(frame, len, &off, 5, &x) < 0 || x > len - off || x % 8)
			return 0;
		v->blocks = frame + off;
		v->n = (size_t)x / 8;
		off += (size_t)x;
	}
	if (off < len && frame[off] == 0x12) {   /* BlockList.tiers */
		uint8_t hi = 0;

		off++;
		if (kv_pb_varint_get(frame, len, &off, 5, &x) < 0 || x > len - off)
			return 0;
		for (size_t i = 0; i < x; i++)
			hi |= frame[off + i];
		if (hi & 0x80)   /* a tier in more than one byte */
			return 0;
		v->tiers = frame + off;
		v->ntiers = (size_t)x;
		off += (size_t)x;
	}
	return off == len;
}

/* The bits of a handle that KVC_BLOCK_POOL() reads. */
#define POOL_FIELD ((uint64_t)0xfffu << 32)
_Static_assert(KVC_BLOCK_POOL(POOL_FIELD) == KVC_MAX_POOLS - 1 && KVC_BLOCK_POOL(~POOL_FIELD) == 0,
	       "POOL_FIELD is KVC_BLOCK_POOL()'s field");

/* The handles XORed with want in the pool's field and ORed together have
 * nothing in that field: sixteen bytes at a time, in four accumulators
 * (issue 38: a block at a time, its field shifted out and compared, the
 * loop took 0.6 us of a lookup of 1,000, 0.1 us this way; gcc does not
 * vectorize a loop of unknown count at -O2). */
bool kvc_blocks_of_pool(const uint8_t *blocks, size_t n, uint64_t want)
{
	typedef uint64_t v2 __attribute__((vector_size(16)));
	const uint64_t w = want << 32;
	v2 wv = { w, w }, a0 = { 0, 0 }, a1 = a0, a2 = a0, a3 = a0;
	uint64_t acc;
	size_t i = 0;

	if (want >= KVC_MAX_POOLS)   /* no handle's pool */
		return n == 0;
	for (; i + 8 <= n; i += 8) {
		v2 x0, x1, x2, x3;

		memcpy(&x0, blocks + i * 8, sizeof(x0));
		memcpy(&x1, blocks + i * 8 + 16, sizeof(x1));
		memcpy(&x2, blocks + i * 8 + 32, sizeof(x2));
		memcpy(&x3, blocks + i * 8 + 48, sizeof(x3));
		a0 |= x0 ^ wv;
		a1 |= x1 ^ wv;
		a2 |= x2 ^ wv;
		a3 |= x3 ^ wv;
	}
	a0 |= a1 | a2 | a3;
	acc = a0[0] | a0[1];
	for (; i < n; i++) {
		uint64_t b;

		memcpy(&b, blocks + i * sizeof(b), sizeof(b));
		acc |= b ^ w;
	}
	return !(acc & POOL_FIELD);
}

/* What call_blocks() hands take_fast(), and what it gets back. */
struct fast_blocks {
	const struct expect *e;
	kvc_block *out;
	size_t n;
};

/* kvc_fast's take for a reply of blocks: the frame read in place, checked as
 * check_blocks() checks a decoded one, and the blocks copied once into the
 * caller's array (and the tiers into theirs). Anything it does not take,
 * including every reply check_blocks() would refuse, goes to protobuf-c and
 * check_blocks(), which say what is wrong. */
static int take_fast(const uint8_t *frame, size_t len, uint64_t id, void *arg)
{
	struct fast_blocks *f = arg;
	const struct expect *e = f->e;
	struct kvc_blocks_view v;
	uint64_t bad = 0;
	size_t i;
	int form;

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
	return 0;   /* the handles are little-endian on the wire */
#endif
	if (e->same || e->same_pool || !(form = kvc_blocks_view(frame, len, &v)) || v.id != id)
		return 0;
	if (form == 2) {   /* no result: no blocks, where that is an answer */
		if (e->kind == REPLY_EXACT)
			return 0;
		f->n = 0;
		return 1;
	}
	if (e->kind == REPLY_EXACT ? v.n != e->n : e->kind == REPLY_UPTO ? v.n > e->n : v.n != 0)
		return 0;
	if (v.ntiers && (!e->lookup || v.ntiers != v.n))
		return 0;
	for (i = 0; i < v.ntiers; i++)
		bad |= v.tiers[i] > KVC_TIER_G4;
	if (bad || (e->pool && !kvc_blocks_of_pool(v.blocks, v.n, *e->pool)))
		return 0;
	if (v.n && f->out)
		memcpy(f->out, v.blocks, v.n * sizeof(*f->out));
	for (i = 0; e->tiers && i < v.n; i++)
		e->tiers[i] = v.ntiers ? v.tiers[i] : KVC_TIER_UNKNOWN;
	f->n = v.n;
	return 1;
}

/* Sends req expecting blocks; copies them to out (may be NULL for none).
 * Returns the number of blocks or a negative error. */
static int call_blocks(kvc_conn *c, Kvcached__Request *req, const struct expect *e,
		       kvc_block *out)
{
	Kvcached__Response *resp = NULL;
	struct fast_blocks f = { .e = e, .out = out };
	const struct kvc_fast fast = { .take = take_fast, .arg = &f };
	size_t n = 0;
	int r;

	r = kvc_call_fast(c, req, &fast, check_blocks, e, &resp);
	if (r < 0)
		return r;
	if (!resp)   /* read in place */
		return (int)f.n;
	n = take_blocks(resp, e, out);
	kvcached__response__free_unpacked(resp, NULL);
	return (int)n;
}

/* Returns the pool id or a negative error. */
KVC_PUBLIC int kvc_register_pool(kvc_conn *c, const struct kvc_pool_desc *d)
{
	return kvc_register_pool_model(c, d, NULL);
}

/* Returns the pool id or a negative error. */
KVC_PUBLIC int kvc_register_pool_model(kvc_conn *c, const struct kvc_pool_desc *d,
				       const char *model)
{
	if (!c || !d || !d->name || (!d->layout && d->layout_len) || d->block_bytes == 0 ||
	    d->block_bytes > kvc_conn_hello(c)->device_bytes)
		return KVC_EINVAL;
	return kvc_conn_register(c, d, model);
}

/* Returns n or a negative error. */
KVC_PUBLIC int kvc_alloc(kvc_conn *c, int pool, uint32_t n, kvc_block *out)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Alloc a = KVCACHED__ALLOC__INIT;
	struct expect e = { .kind = REPLY_EXACT, .n = n, .pool = &a.pool_id };
	int r;

	if (!c || n == 0 || !out)
		return KVC_EINVAL;
	r = check_pool(pool);
	if (!r)
		r = check_batch(c, n);
	if (r < 0)
		return r;
	a.pool_id = (uint32_t)pool;
	a.count = n;
	req.op_case = KVCACHED__REQUEST__OP_ALLOC;
	req.alloc = &a;
	return call_blocks(c, &req, &e, out);
}

/* Returns n or a negative error. */
KVC_PUBLIC int kvc_seal(kvc_conn *c, int pool, const kvc_block *blocks, const kvc_hash *hashes,
			size_t n, kvc_block *out)
{
	return kvc_seal_tokens(c, pool, blocks, hashes, n, NULL, NULL, 0, out);
}

/* Returns n or a negative error. */
KVC_PUBLIC int kvc_seal_tokens(kvc_conn *c, int pool, const kvc_block *blocks,
			       const kvc_hash *hashes, size_t n, const kvc_hash *parent,
			       const uint32_t *token_ids, size_t ntokens, kvc_block *out)
{
	struct kvc_seal_info info = { .parent = parent, .token_ids = token_ids,
				      .ntokens = ntokens };

	return kvc_seal_events(c, pool, blocks, hashes, n, &info, out);
}

/* Whether len bytes at p are UTF-8 without NUL (what the daemon accepts in a
 * string, proto/pbcheck.h). */
static bool text_ok(const void *p, size_t len)
{
	const unsigned char *s = p;

	if (len && !p)
		return false;
	while (len) {
		size_t k = kv_utf8_len(s, len);

		if (!k || !*s)
			return false;
		s += k;
		len -= k;
	}
	return true;
}

/* The Seal's extra_keys from info (kvcache.h): one BlockKeys per block, in
 * one allocation (*mem, freed by the caller) with NUL-terminated copies of
 * the texts. Returns 0 or KVC_EINVAL / -ENOMEM; nothing to free then. */
static int seal_keys(Kvcached__Seal *s, size_t n, const struct kvc_seal_info *info,
		     void **mem)
{
	size_t total = 0, text = 0, i, k, j;
	Kvcached__BlockKeys *bk, **bkp;
	Kvcached__EventKey *ek, **ekp;
	Kvcached__MmKey *mm;
	char *t;
	unsigned char *m;

	for (i = 0; i < n; i++)
		total += info->nkeys[i];
	if (total && !info->keys)
		return KVC_EINVAL;
	for (k = 0; k < total; k++) {
		const struct kvc_event_key *e = &info->keys[k];

		if (e->kind == KVC_EVENT_KEY_BYTES) {
			if (e->len && !e->data)
				return KVC_EINVAL;
			continue;
		}
		if ((e->kind != KVC_EVENT_KEY_TEXT && e->kind != KVC_EVENT_KEY_MM) ||
		    !text_ok(e->data, e->len))
			return KVC_EINVAL;
		text += e->len + 1;
	}
	m = calloc(1, n * (sizeof(*bk) + sizeof(*bkp)) +
			      total * (sizeof(*ek) + sizeof(*ekp) + sizeof(*mm)) + text);
	if (!m)
		return -ENOMEM;
	*mem = m;
	/* Pointers first, then the structs (all of pointer alignment), then
	 * the texts. */
	bkp = (Kvcached__BlockKeys **)m;
	ekp = (Kvcached__EventKey **)(bkp + n);
	bk = (Kvcached__BlockKeys *)(ekp + total);
	ek = (Kvcached__EventKey *)(bk + n);
	mm = (Kvcached__MmKey *)(ek + total);
	t = (char *)(mm + total);
	for (i = 0, k = 0; i < n; i++) {
		kvcached__block_keys__init(&bk[i]);
		bk[i].n_keys = info->nkeys[i];
		bk[i].keys = ekp + k;
		bkp[i] = &bk[i];
		for (j = 0; j < info->nkeys[i]; j++, k++) {
			const struct kvc_event_key *e = &info->keys[k];

			kvcached__event_key__init(&ek[k]);
			ekp[k] = &ek[k];
			if (e->kind == KVC_EVENT_KEY_BYTES) {
				ek[k].key_case = KVCACHED__EVENT_KEY__KEY_DIGEST;
				ek[k].digest.data = (uint8_t *)e->data;
				ek[k].digest.len = e->len;
				continue;
			}
			if (e->len)
				memcpy(t, e->data, e->len);
			t[e->len] = 0;
			if (e->kind == KVC_EVENT_KEY_TEXT) {
				ek[k].key_case = KVCACHED__EVENT_KEY__KEY_TEXT;
				ek[k].text = t;
			} else {
				kvcached__mm_key__init(&mm[k]);
				mm[k].identifier = t;
				mm[k].offset = e->offset;
				ek[k].key_case = KVCACHED__EVENT_KEY__KEY_MM;
				ek[k].mm = &mm[k];
			}
			t += e->len + 1;
		}
	}
	s->n_extra_keys = n;
	s->extra_keys = bkp;
	return 0;
}

/* Returns n or a negative error. */
KVC_PUBLIC int kvc_seal_events(kvc_conn *c, int pool, const kvc_block *blocks,
			       const kvc_hash *hashes, size_t n, const struct kvc_seal_info *info,
			       kvc_block *out)
{
	static const struct kvc_seal_info none;
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Seal s = KVCACHED__SEAL__INIT;
	struct expect e = { .kind = REPLY_EXACT, .n = n, .pool = &s.pool_id };
	void *mem = NULL;
	int r;

	if (!info)
		info = &none;
	if (!c || (n && (!blocks || !hashes || !out)) || (info->ntokens && !info->token_ids))
		return KVC_EINVAL;
	if (info->lora_name && !kv_utf8_ok(info->lora_name))
		return KVC_EINVAL;
	r = check_pool(pool);
	if (!r)
		r = check_batch(c, n);
	if (r < 0 || n == 0)
		return r;
	if (info->nkeys && (r = seal_keys(&s, n, info, &mem)) < 0)
		return r;
	s.n_token_ids = info->ntokens;
	s.token_ids = (uint32_t *)info->token_ids;
	if (info->parent) {
		s.parent_hash.data = (uint8_t *)info->parent;
		s.parent_hash.len = sizeof(*info->parent);
	}
	if (info->lora_name)
		s.lora_name = (char *)info->lora_name;
	s.lora_id = info->lora_id;
	s.pool_id = (uint32_t)pool;
	s.n_blocks = n;
	s.blocks = (uint64_t *)blocks;
	s.hashes.data = (uint8_t *)hashes;
	s.hashes.len = n * sizeof(*hashes);
	req.op_case = KVCACHED__REQUEST__OP_SEAL;
	req.seal = &s;
	r = call_blocks(c, &req, &e, out);
	free(mem);
	return r;
}

/* Returns the cached prefix length k <= n or a negative error. */
KVC_PUBLIC int kvc_lookup(kvc_conn *c, int pool, const kvc_hash *chain, size_t n, kvc_block *out)
{
	return kvc_lookup_tiers(c, pool, chain, n, out, NULL);
}

/* Returns the number of blocks found or a negative error. */
KVC_PUBLIC int kvc_lookup_tiers(kvc_conn *c, int pool, const kvc_hash *chain, size_t n,
				kvc_block *out, uint8_t *tiers)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Lookup l = KVCACHED__LOOKUP__INIT;
	struct expect e = { .kind = REPLY_UPTO, .n = n, .pool = &l.pool_id, .lookup = true,
			    .tiers = tiers };
	int r;

	if (!c || (n && (!chain || !out)))
		return KVC_EINVAL;
	r = check_pool(pool);
	if (!r)
		r = check_batch(c, n);
	if (r < 0 || n == 0)
		return r;
	l.pool_id = (uint32_t)pool;
	l.hashes.data = (uint8_t *)chain;
	l.hashes.len = n * sizeof(*chain);
	l.tiers = tiers != NULL;
	req.op_case = KVCACHED__REQUEST__OP_LOOKUP;
	req.lookup = &l;
	return call_blocks(c, &req, &e, out);
}

/* One Lookup of a kvc_lookup_many() batch. */
struct many_item {
	Kvcached__Request req;
	Kvcached__Lookup l;
	struct expect e;
	struct fast_blocks f;   /* its reply read in place (take_fast()) */
};

/* Returns nchains or a negative error (see kvcache.h). */
KVC_PUBLIC int kvc_lookup_many(kvc_conn *c, int pool, const kvc_hash *chains, const size_t *n,
			       size_t nchains, kvc_block *out, uint8_t *tiers, int *found)
{
	struct many_item *it = NULL;
	struct kvc_fast *fast = NULL;
	Kvcached__Request **reqs = NULL;
	Kvcached__Response **resps = NULL;
	const void **args = NULL;
	size_t i, k = 0, off = 0, *at = NULL;
	int r, *rc = NULL;

	if (!c || (nchains && (!n || !found)) || nchains > INT_MAX)
		return KVC_EINVAL;
	if ((r = check_pool(pool)) < 0)
		return r;
	for (i = 0; i < nchains; i++) {
		if (n[i] && (!chains || !out))
			return KVC_EINVAL;
		if ((r = check_batch(c, n[i])) < 0)
			return r;
		if (n[i] > SIZE_MAX - off)
			return KVC_EINVAL;
		off += n[i];
		k += n[i] != 0;
	}
	if (k) {
		it = calloc(k, sizeof(*it));
		fast = calloc(k, sizeof(*fast));
		reqs = calloc(k, sizeof(*reqs));
		resps = calloc(k, sizeof(*resps));
		args = calloc(k, sizeof(*args));
		at = calloc(k, sizeof(*at));
		rc = calloc(k, sizeof(*rc));
		if (!it || !fast || !reqs || !resps || !args || !at || !rc) {
			r = -ENOMEM;
			goto out;
		}
	}
	/* Item j: the j-th chain that is not empty, at offset at[j]. */
	for (i = 0, k = 0, off = 0; i < nchains; off += n[i], i++) {
		struct many_item *m;

		if (n[i] == 0)
			continue;
		m = &it[k];
		m->req = (Kvcached__Request)KVCACHED__REQUEST__INIT;
		m->l = (Kvcached__Lookup)KVCACHED__LOOKUP__INIT;
		m->l.pool_id = (uint32_t)pool;
		m->l.hashes.data = (uint8_t *)(chains + off);
		m->l.hashes.len = n[i] * sizeof(*chains);
		m->l.tiers = tiers != NULL;
		m->req.op_case = KVCACHED__REQUEST__OP_LOOKUP;
		m->req.lookup = &m->l;
		m->e = (struct expect){ .kind = REPLY_UPTO, .n = n[i], .pool = &m->l.pool_id,
					.lookup = true, .tiers = tiers ? tiers + off : NULL };
		m->f = (struct fast_blocks){ .e = &m->e, .out = out + off };
		fast[k] = (struct kvc_fast){ .take = take_fast, .arg = &m->f };
		reqs[k] = &m->req;
		args[k] = &m->e;
		at[k++] = off;
	}
	r = kvc_call_many_fast(c, reqs, k, fast, check_blocks, args, resps, rc);
	if (r < 0)
		goto out;
	for (i = 0, k = 0; i < nchains; i++) {
		if (n[i] == 0) {
			found[i] = 0;
			continue;
		}
		found[i] = rc[k] < 0 ? rc[k]
			   : !resps[k] ? (int)it[k].f.n   /* read in place */
				       : (int)take_blocks(resps[k], &it[k].e, out + at[k]);
		kvcached__response__free_unpacked(resps[k], NULL);
		k++;
	}
	r = (int)nchains;
out:
	free(it);
	free(fast);
	free(reqs);
	free(resps);
	free(args);
	free(at);
	free(rc);
	return r;
}

/* Returns 0 or a negative error. */
KVC_PUBLIC int kvc_release(kvc_conn *c, const kvc_block *blocks, size_t n)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Release rel = KVCACHED__RELEASE__INIT;
	struct expect e = { .kind = REPLY_EMPTY, .pool = NULL };
	int r;

	if (!c || (n && !blocks))
		return KVC_EINVAL;
	r = check_batch(c, n);
	if (r < 0 || n == 0)
		return r;
	rel.n_blocks = n;
	rel.blocks = (uint64_t *)blocks;
	req.op_case = KVCACHED__REQUEST__OP_RELEASE;
	req.release = &rel;
	r = call_blocks(c, &req, &e, NULL);
	return r < 0 ? r : 0;
}

/* Fork and Cow: n handles in, n handles out (Fork: the same ones; Cow: of
 * the same pools). Returns n or a negative error. */
static int fork_or_cow(kvc_conn *c, const kvc_block *blocks, size_t n, kvc_block *out, int cow)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Fork f = KVCACHED__FORK__INIT;
	Kvcached__Cow cw = KVCACHED__COW__INIT;
	struct expect e = { .kind = REPLY_EXACT, .n = n, .pool = NULL };
	int r;

	if (!c || (n && (!blocks || !out)))
		return KVC_EINVAL;
	r = check_batch(c, n);
	if (r < 0 || n == 0)
		return r;
	if (cow) {
		e.same_pool = blocks;
		cw.n_blocks = n;
		cw.blocks = (uint64_t *)blocks;
		req.op_case = KVCACHED__REQUEST__OP_COW;
		req.cow = &cw;
	} else {
		e.same = blocks;
		f.n_blocks = n;
		f.blocks = (uint64_t *)blocks;
		req.op_case = KVCACHED__REQUEST__OP_FORK;
		req.fork = &f;
	}
	return call_blocks(c, &req, &e, out);
}

KVC_PUBLIC int kvc_fork(kvc_conn *c, const kvc_block *blocks, size_t n, kvc_block *out)
{
	return fork_or_cow(c, blocks, n, out, 0);
}

KVC_PUBLIC int kvc_cow(kvc_conn *c, const kvc_block *blocks, size_t n, kvc_block *out)
{
	return fork_or_cow(c, blocks, n, out, 1);
}

static const char *check_swap_out(const Kvcached__Response *r, const void *arg)
{
	(void)arg;
	return r->result_case == KVCACHED__RESPONSE__RESULT_SWAP_OUT
		       ? NULL : "the daemon's reply is not a SwapOutReply";
}

KVC_PUBLIC int kvc_swap_out(kvc_conn *c, const kvc_block *blocks, size_t n, uint64_t *swap)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__SwapOut so = KVCACHED__SWAP_OUT__INIT;
	Kvcached__Response *resp = NULL;
	int r;

	if (!c || !blocks || !n || !swap)
		return KVC_EINVAL;
	r = check_batch(c, n);
	if (r < 0)
		return r;
	so.n_blocks = n;
	so.blocks = (uint64_t *)blocks;
	req.op_case = KVCACHED__REQUEST__OP_SWAP_OUT;
	req.swap_out = &so;
	r = kvc_call_check(c, &req, check_swap_out, NULL, &resp);
	if (r < 0)
		return r;
	*swap = resp->swap_out->swap;
	kvcached__response__free_unpacked(resp, NULL);
	return 0;
}

KVC_PUBLIC int kvc_swap_in(kvc_conn *c, uint64_t swap, kvc_block *out, size_t max)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__SwapIn si = KVCACHED__SWAP_IN__INIT;
	struct expect e = { .kind = REPLY_UPTO, .n = max, .pool = NULL };

	if (!c || !out || !max)
		return KVC_EINVAL;
	si.swap = swap;
	req.op_case = KVCACHED__REQUEST__OP_SWAP_IN;
	req.swap_in = &si;
	return call_blocks(c, &req, &e, out);
}
