/* conn.c's decoder of a Lookup frame with its hashes in place
 * (kv_req_unpack_lookup(), issue 38) against protobuf-c's: every frame a
 * packer writes is taken by it, and every frame it takes, among packed ones,
 * hand-made odd forms and random mutations of both, protobuf-c decodes to
 * the same id, pool, hashes and tiers. The same of a Seal's
 * (kv_req_unpack_seal()): the same id, pool, handles and hashes, and no
 * Seal with KV-event fields taken. And conn.c's packer of a reply of
 * blocks (kv_resp_blocks_size(), kv_resp_blocks_pack()) against protobuf-c's
 * pack: the same bytes for every reply it takes, and every other reply left
 * to protobuf-c. Exit 0 pass, 1 fail. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "conn.h"
#include "kvcached.pb-c.h"
#include "mutate.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	return kvt_rnd(&rng);
}

static int same(const Kvcached__Request *a, const Kvcached__Request *b)
{
	const Kvcached__Lookup *x = a->lookup, *y = b->lookup;

	if (a->id != b->id || a->op_case != b->op_case || a->op_case != KVCACHED__REQUEST__OP_LOOKUP)
		return 0;
	if (!x || !y || x->pool_id != y->pool_id || x->tiers != y->tiers ||
	    x->hashes.len != y->hashes.len || !x->hashes.data != !y->hashes.data)
		return 0;
	return !x->hashes.len || !memcmp(x->hashes.data, y->hashes.data, x->hashes.len);
}

/* 1: the fast decoder took buf; 0: it left it to protobuf-c. Either way,
 * what it took must be what protobuf-c makes of it. */
static int compare(struct kv_arena *ar, const uint8_t *buf, size_t len, const char *what)
{
	Kvcached__Request *f = kv_req_unpack_lookup(ar, buf, len), *p;
	int took = f != NULL;

	if (f) {
		p = kvcached__request__unpack(NULL, len, buf);
		if (!p)
			FAIL("%s: taken by the fast decoder, refused by protobuf-c (%zu bytes)", what,
			     len);
		else if (!same(f, p))
			FAIL("%s: decoded otherwise than protobuf-c (%zu bytes)", what, len);
		if (p)
			kvcached__request__free_unpacked(p, NULL);
		/* The hashes are read in place. */
		if (f->lookup->hashes.len &&
		    (f->lookup->hashes.data < buf || f->lookup->hashes.data >= buf + len))
			FAIL("%s: hashes not in the frame", what);
	}
	kv_arena_reset(ar);
	return took;
}

static size_t pack(uint64_t id, uint32_t pool, size_t nhash, int tiers, uint8_t *hb, uint8_t *out)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Lookup m = KVCACHED__LOOKUP__INIT;

	m.pool_id = pool;
	m.hashes.len = nhash;
	m.hashes.data = nhash ? hb : NULL;
	m.tiers = tiers;
	rq.id = id;
	rq.op_case = KVCACHED__REQUEST__OP_LOOKUP;
	rq.lookup = &m;
	return kvcached__request__pack(&rq, out);
}

/* ---- Seal ---- */

static int seal_same(const Kvcached__Request *a, const Kvcached__Request *b)
{
	const Kvcached__Seal *x = a->seal, *y = b->seal;

	if (a->id != b->id || a->op_case != b->op_case || a->op_case != KVCACHED__REQUEST__OP_SEAL)
		return 0;
	if (!x || !y || x->pool_id != y->pool_id || x->n_blocks != y->n_blocks ||
	    x->hashes.len != y->hashes.len || !x->hashes.data != !y->hashes.data)
		return 0;
	/* What the handler reads of the event fields: none in either. */
	if (x->n_token_ids || y->n_token_ids || x->parent_hash.len || y->parent_hash.len ||
	    x->n_extra_keys || y->n_extra_keys || x->lora_id || y->lora_id ||
	    strcmp(x->lora_name, y->lora_name))
		return 0;
	if (x->n_blocks && memcmp(x->blocks, y->blocks, x->n_blocks * sizeof(*x->blocks)))
		return 0;
	return !x->hashes.len || !memcmp(x->hashes.data, y->hashes.data, x->hashes.len);
}

static int seal_compare(struct kv_arena *ar, const uint8_t *buf, size_t len, const char *what)
{
	Kvcached__Request *f = kv_req_unpack_seal(ar, buf, len), *p;
	int took = f != NULL;

	if (f) {
		p = kvcached__request__unpack(NULL, len, buf);
		if (!p)
			FAIL("%s: seal taken by the fast decoder, refused by protobuf-c (%zu bytes)",
			     what, len);
		else if (!seal_same(f, p))
			FAIL("%s: seal decoded otherwise than protobuf-c (%zu bytes)", what, len);
		if (p)
			kvcached__request__free_unpacked(p, NULL);
		if (f->seal->hashes.len &&
		    (f->seal->hashes.data < buf || f->seal->hashes.data >= buf + len))
			FAIL("%s: seal's hashes not in the frame", what);
		if (f->seal->n_blocks && (uintptr_t)f->seal->blocks % sizeof(uint64_t))
			FAIL("%s: seal's handles not aligned", what);
	}
	/* Never a Lookup's decoder's, nor the other way round. */
	if (kv_req_unpack_lookup(ar, buf, len) && took)
		FAIL("%s: taken by both decoders", what);
	kv_arena_reset(ar);
	return took;
}

/* A Seal as kvc_seal() packs it; ev: with the KV-event field ev (1 token
 * ids, 2 parent hash, 3 LoRA name, 4 LoRA id, 5 extra keys) too. */
static size_t seal_pack(uint64_t id, uint32_t pool, const uint64_t *blk, size_t nblk,
			size_t nhash, const uint8_t *hb, int ev, uint8_t *out)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Seal m = KVCACHED__SEAL__INIT;
	Kvcached__BlockKeys bk = KVCACHED__BLOCK_KEYS__INIT, *bkp = &bk;
	uint32_t tok[16] = { 1, 2, 3 };

	m.pool_id = pool;
	m.n_blocks = nblk;
	m.blocks = (uint64_t *)blk;
	m.hashes.len = nhash;
	m.hashes.data = nhash ? (uint8_t *)hb : NULL;
	if (ev == 1) {
		m.n_token_ids = 16;
		m.token_ids = tok;
	} else if (ev == 2) {
		m.parent_hash.len = 32;
		m.parent_hash.data = (uint8_t *)hb;
	} else if (ev == 3) {
		m.lora_name = (char *)"adapter";
	} else if (ev == 4) {
		m.lora_id = 7;
	} else if (ev == 5) {
		m.n_extra_keys = 1;
		m.extra_keys = &bkp;
	}
	rq.id = id;
	rq.op_case = KVCACHED__REQUEST__OP_SEAL;
	rq.seal = &m;
	return kvcached__request__pack(&rq, out);
}

static int seal_tests(struct kv_arena *ar, const uint8_t *hb, uint8_t *buf, uint8_t *mut)
{
	static const uint64_t ids[] = { 0, 1, 128, (1ull << 63) + 5, UINT64_MAX };
	static const uint32_t pools[] = { 0, 1, 128, UINT32_MAX };
	static const size_t nblks[] = { 0, 1, 2, 16, 256 };
	uint64_t blk[256];
	size_t packed = 0, taken = 0, mtaken = 0;

	for (size_t i = 0; i < 256; i++)
		blk[i] = rnd() >> (rnd() & 63);
	/* Every packed Seal without event fields is taken, and decodes the
	 * same; none with one is. */
	for (size_t a = 0; a < sizeof(ids) / sizeof(ids[0]); a++)
		for (size_t b = 0; b < sizeof(pools) / sizeof(pools[0]); b++)
			for (size_t c = 0; c < sizeof(nblks) / sizeof(nblks[0]); c++)
				for (int h = 0; h < 3; h++)
					for (int ev = 0; ev <= 5; ev++) {
						/* hashes: none, 32 per block, 5 bytes */
						size_t nh = h == 0 ? 0 : h == 1 ? 32 * nblks[c] : 5;
						size_t n = seal_pack(ids[a], pools[b], blk, nblks[c], nh,
								     hb, ev, buf);
						int took = seal_compare(ar, buf, n, "packed seal");

						packed++;
						taken += (size_t)took;
						if (took != !ev)
							FAIL("packed seal (id %llu pool %u %zu blocks %zu "
							     "hash bytes event field %d) %s",
							     (unsigned long long)ids[a], pools[b], nblks[c],
							     nh, ev, took ? "taken" : "not taken");
					}
	{
		static const struct {
			const char *what;
			uint8_t b[24];
			size_t n;
			int take;   /* 1: must be taken; 0: must be left; -1: either */
		} odd[] = {
			{ "empty seal", { 0x6a, 0x00 }, 2, 1 },
			{ "id only", { 0x08, 0x05 }, 2, 0 },
			{ "a lookup", { 0x72, 0x00 }, 2, 0 },
			{ "pool 2^32", { 0x6a, 0x06, 0x08, 0x80, 0x80, 0x80, 0x80, 0x10 }, 8, 0 },
			{ "pool in 6 bytes", { 0x6a, 0x07, 0x08, 0x81, 0x80, 0x80, 0x80, 0x80, 0x00 }, 9, 0 },
			{ "pool twice", { 0x6a, 0x04, 0x08, 0x01, 0x08, 0x02 }, 6, 0 },
			{ "one handle", { 0x6a, 0x0a, 0x12, 0x08, 1, 2, 3, 4, 5, 6, 7, 8 }, 12, 1 },
			{ "handles of 7 bytes", { 0x6a, 0x09, 0x12, 0x07, 1, 2, 3, 4, 5, 6, 7 }, 11, 0 },
			{ "handles of 9 bytes", { 0x6a, 0x0b, 0x12, 0x09, 1, 2, 3, 4, 5, 6, 7, 8, 9 }, 13, 0 },
			{ "handles twice (protobuf-c joins them)",
			  { 0x6a, 0x14, 0x12, 0x08, 1, 2, 3, 4, 5, 6, 7, 8, 0x12, 0x08, 1, 2, 3, 4, 5, 6, 7,
			    8 },
			  22, 0 },
			{ "a handle unpacked (fixed64, wire type 1)",
			  { 0x6a, 0x09, 0x11, 1, 2, 3, 4, 5, 6, 7, 8 }, 11, 0 },
			{ "handles past the seal", { 0x6a, 0x04, 0x12, 0x08, 1, 2 }, 6, 0 },
			{ "handles length cut", { 0x6a, 0x02, 0x12, 0x80 }, 4, 0 },
			{ "hashes before handles", { 0x6a, 0x0d, 0x1a, 0x01, 0xaa, 0x12, 0x08, 1, 2, 3, 4, 5, 6,
						     7, 8 }, 15, 0 },
			{ "hashes twice", { 0x6a, 0x06, 0x1a, 0x01, 0xaa, 0x1a, 0x01, 0xbb }, 8, 0 },
			{ "hashes past the seal", { 0x6a, 0x03, 0x1a, 0x05, 0xaa, 0xbb }, 6, 0 },
			{ "token ids", { 0x6a, 0x03, 0x22, 0x01, 0x05 }, 5, 0 },
			{ "parent hash", { 0x6a, 0x03, 0x2a, 0x01, 0xaa }, 5, 0 },
			{ "lora name", { 0x6a, 0x03, 0x32, 0x01, 0x61 }, 5, 0 },
			{ "lora id", { 0x6a, 0x02, 0x38, 0x01 }, 4, 0 },
			{ "extra keys", { 0x6a, 0x02, 0x42, 0x00 }, 4, 0 },
			{ "unknown field", { 0x6a, 0x02, 0x48, 0x01 }, 4, 0 },
			{ "seal then id", { 0x6a, 0x00, 0x08, 0x01 }, 4, 0 },
			{ "seal twice", { 0x6a, 0x02, 0x08, 0x01, 0x6a, 0x02, 0x08, 0x02 }, 8, 0 },
			{ "id twice", { 0x08, 0x01, 0x08, 0x02, 0x6a, 0x00 }, 6, 0 },
			{ "seal past the end", { 0x6a, 0x05, 0x08, 0x01 }, 4, 0 },
			{ "seal length in 6 bytes", { 0x6a, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00 }, 7, 0 },
			{ "seal as a varint", { 0x68, 0x01 }, 2, 0 },
		};

		for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
			int took = seal_compare(ar, odd[i].b, odd[i].n, odd[i].what);

			if (odd[i].take >= 0 && took != odd[i].take)
				FAIL("%s: %s", odd[i].what, took ? "taken" : "not taken");
		}
	}
	/* Random mutations of packed Seals, event fields or not. */
	for (int it = 0; it < 200000; it++) {
		size_t nb = (size_t)(rnd() % 4);
		size_t n = seal_pack(rnd() >> (rnd() & 63), (uint32_t)(rnd() >> (rnd() & 31)), blk, nb,
				     (size_t)(rnd() % 3) * 16, hb, (int)(rnd() % 8 < 6 ? 0 : 1 + rnd() % 5),
				     buf);

		memcpy(mut, buf, n);
		n = kvt_mutate(mut, n, &rng);
		mtaken += (size_t)seal_compare(ar, mut, n, "mutated seal");
	}
	printf("seal packed: %zu of %zu taken; mutated: %zu of 200000 taken\n", taken, packed,
	       mtaken);
	return 0;
}

/* The hand packer of rs against protobuf-c: take says whether it must take
 * rs; what it takes must be protobuf-c's bytes, no more. */
static void compare_pack(const Kvcached__Response *rs, int take, const char *what)
{
	size_t want = kvcached__response__get_packed_size(rs), got = 0;
	int took = kv_resp_blocks_size(rs, &got);
	uint8_t *a = malloc(want + 1), *b = malloc(want + 17);

	if (!a || !b)
		exit(1);
	if (took != take)
		FAIL("%s: %s by the hand packer", what, took ? "taken" : "not taken");
	if (took) {
		kvcached__response__pack(rs, a);
		memset(b, 0xee, want + 17);
		kv_resp_blocks_pack(rs, b);
		if (got != want)
			FAIL("%s: %zu bytes where protobuf-c packs %zu", what, got, want);
		else if (memcmp(a, b, want))
			FAIL("%s: other bytes than protobuf-c's (%zu)", what, want);
		for (size_t i = got; i < want + 17 && got <= want; i++)
			if (b[i] != 0xee) {
				FAIL("%s: wrote past its %zu bytes", what, got);
				break;
			}
	}
	free(a);
	free(b);
}

static void replies(void)
{
	static const uint64_t ids[] = { 0, 1, 127, 128, 300, 1ull << 32, UINT64_MAX };
	static const size_t counts[] = { 0, 1, 2, 15, 16, 17, 255, 256, 1000, 4096 };
	enum { MAXN = 4096 };
	uint64_t *h = malloc(MAXN * sizeof(*h));
	Kvcached__Tier *t = malloc(MAXN * sizeof(*t));
	Kvcached__Response rs;
	Kvcached__BlockList bl;
	Kvcached__Error err = KVCACHED__ERROR__INIT;
	Kvcached__Segment seg = KVCACHED__SEGMENT__INIT, *segs[1] = { &seg };
	Kvcached__SwapOutReply so = KVCACHED__SWAP_OUT_REPLY__INIT;

	if (!h || !t)
		exit(1);
	for (size_t i = 0; i < MAXN; i++) {
		h[i] = rnd();
		t[i] = (Kvcached__Tier)(rnd() % 4);
	}
	for (size_t a = 0; a < sizeof(ids) / sizeof(ids[0]); a++)
		for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
			for (int tiers = 0; tiers < 3; tiers++) {
				rs = (Kvcached__Response)KVCACHED__RESPONSE__INIT;
				bl = (Kvcached__BlockList)KVCACHED__BLOCK_LIST__INIT;
				rs.id = ids[a];
				rs.result_case = KVCACHED__RESPONSE__RESULT_BLOCKS;
				rs.blocks = &bl;
				bl.n_blocks = counts[c];
				bl.blocks = h;
				/* tiers: none, one per block, or a count of their
				 * own (the packer does not judge it) */
				bl.n_tiers = tiers == 0 ? 0 : tiers == 1 ? counts[c] : counts[c] / 2 + 3;
				bl.tiers = t;
				compare_pack(&rs, 1, "blocks");
			}
	/* Tiers at the edge of one byte, and past it. */
	{
		static const int tv[] = { 0, 3, 127, 128, 300, -1 };

		for (size_t i = 0; i < sizeof(tv) / sizeof(tv[0]); i++) {
			Kvcached__Tier one[3] = { KVCACHED__TIER__TIER_G1, (Kvcached__Tier)tv[i],
						  KVCACHED__TIER__TIER_G2 };

			rs = (Kvcached__Response)KVCACHED__RESPONSE__INIT;
			bl = (Kvcached__BlockList)KVCACHED__BLOCK_LIST__INIT;
			rs.id = 9;
			rs.result_case = KVCACHED__RESPONSE__RESULT_BLOCKS;
			rs.blocks = &bl;
			bl.n_blocks = 3;
			bl.blocks = h;
			bl.n_tiers = 3;
			bl.tiers = one;
			compare_pack(&rs, tv[i] >= 0 && tv[i] < 128, "a tier at the edge");
		}
	}
	/* Anything else is protobuf-c's. */
	rs = (Kvcached__Response)KVCACHED__RESPONSE__INIT;
	bl = (Kvcached__BlockList)KVCACHED__BLOCK_LIST__INIT;
	compare_pack(&rs, 1, "nothing at all");
	rs.id = 5;
	compare_pack(&rs, 1, "an id alone (a Release's reply)");
	rs.id = UINT64_MAX;
	compare_pack(&rs, 1, "a long id alone");
	rs.id = 5;
	rs.error = &err;
	compare_pack(&rs, 0, "an id and an error");
	rs.error = NULL;
	rs.result_case = KVCACHED__RESPONSE__RESULT_BLOCKS;
	rs.blocks = &bl;
	bl.n_blocks = 2;
	bl.blocks = h;
	rs.error = &err;
	err.code = KVCACHED__ERROR_CODE__ENOSPC;
	compare_pack(&rs, 0, "blocks and an error");
	rs.error = NULL;
	rs.n_segments = 1;
	rs.segments = segs;
	compare_pack(&rs, 0, "blocks and a segment");
	rs.n_segments = 0;
	rs.segments = NULL;
	compare_pack(&rs, 1, "blocks again");
	rs.result_case = KVCACHED__RESPONSE__RESULT_SWAP_OUT;
	rs.swap_out = &so;
	compare_pack(&rs, 0, "another result");
	free(h);
	free(t);
}

int main(void)
{
	static const uint64_t ids[] = { 0, 1, 127, 128, 300, 1ull << 32, (1ull << 63) + 5,
					UINT64_MAX };
	static const uint32_t pools[] = { 0, 1, 127, 128, 70000, UINT32_MAX };
	static const size_t lens[] = { 0, 1, 5, 32, 64, 4096, 32000 };
	uint8_t *hb = malloc(32000), *buf = malloc(40000), *mut = malloc(40000);
	struct kv_arena ar;
	size_t packed = 0, taken = 0, mtaken = 0;

	if (!hb || !buf || !mut)
		return 1;
	kv_arena_init(&ar);
	for (size_t i = 0; i < 32000; i++)
		hb[i] = (uint8_t)rnd();
	/* Every packed Lookup is taken, and decodes the same. */
	for (size_t a = 0; a < sizeof(ids) / sizeof(ids[0]); a++)
		for (size_t b = 0; b < sizeof(pools) / sizeof(pools[0]); b++)
			for (size_t c = 0; c < sizeof(lens) / sizeof(lens[0]); c++)
				for (int t = 0; t < 2; t++) {
					size_t n = pack(ids[a], pools[b], lens[c], t, hb, buf);

					packed++;
					if (compare(&ar, buf, n, "packed"))
						taken++;
					else
						FAIL("packed lookup (id %llu pool %u %zu bytes tiers %d) "
						     "not taken",
						     (unsigned long long)ids[a], pools[b], lens[c], t);
				}
	/* Forms a packer does not write: refused, or decoded the same. */
	{
		static const struct {
			const char *what;
			uint8_t b[24];
			size_t n;
			int take;   /* 1: must be taken; 0: must be left; -1: either */
		} odd[] = {
			{ "empty frame", { 0 }, 0, 0 },
			{ "id only", { 0x08, 0x05 }, 2, 0 },
			{ "empty lookup", { 0x72, 0x00 }, 2, 1 },
			{ "pool 2^32 (protobuf-c cuts it to 0)",
			  { 0x72, 0x06, 0x08, 0x80, 0x80, 0x80, 0x80, 0x10 }, 8, 0 },
			{ "pool in 6 bytes", { 0x72, 0x07, 0x08, 0x81, 0x80, 0x80, 0x80, 0x80, 0x00 }, 9, 0 },
			{ "pool 0 in 2 bytes", { 0x72, 0x03, 0x08, 0x80, 0x00 }, 5, -1 },
			{ "tiers 2 (protobuf-c: true)", { 0x72, 0x02, 0x18, 0x02 }, 4, 0 },
			{ "tiers in 2 bytes", { 0x72, 0x03, 0x18, 0x81, 0x00 }, 5, 0 },
			{ "tiers 1", { 0x72, 0x02, 0x18, 0x01 }, 4, 1 },
			{ "pool twice", { 0x72, 0x04, 0x08, 0x01, 0x08, 0x02 }, 6, 0 },
			{ "hashes twice", { 0x72, 0x06, 0x12, 0x01, 0xaa, 0x12, 0x01, 0xbb }, 8, 0 },
			{ "tiers before pool", { 0x72, 0x04, 0x18, 0x01, 0x08, 0x02 }, 6, 0 },
			{ "unknown field in lookup", { 0x72, 0x02, 0x20, 0x01 }, 4, 0 },
			{ "lookup then id", { 0x72, 0x00, 0x08, 0x01 }, 4, 0 },
			{ "lookup twice", { 0x72, 0x02, 0x08, 0x01, 0x72, 0x02, 0x08, 0x02 }, 8, 0 },
			{ "id twice", { 0x08, 0x01, 0x08, 0x02, 0x72, 0x00 }, 6, 0 },
			{ "lookup past the end", { 0x72, 0x05, 0x08, 0x01 }, 4, 0 },
			{ "hashes past the lookup", { 0x72, 0x03, 0x12, 0x05, 0xaa, 0xbb }, 6, 0 },
			{ "hashes length cut", { 0x72, 0x02, 0x12, 0x80 }, 4, 0 },
			{ "id cut", { 0x08, 0x80 }, 2, 0 },
			{ "id in 10 bytes",
			  { 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x72, 0x00 },
			  13, 1 },
			{ "id in 11 bytes",
			  { 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x81, 0x00, 0x72,
			    0x00 },
			  14, 0 },
			{ "lookup as a varint", { 0x70, 0x01 }, 2, 0 },
			{ "a release", { 0x7a, 0x00 }, 2, 0 },
		};

		for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
			int took = compare(&ar, odd[i].b, odd[i].n, odd[i].what);

			if (odd[i].take >= 0 && took != odd[i].take)
				FAIL("%s: %s", odd[i].what, took ? "taken" : "not taken");
		}
	}
	/* Random mutations of packed frames: whatever is taken decodes the
	 * same as protobuf-c's. */
	for (int it = 0; it < 200000; it++) {
		size_t n = pack(rnd() >> (rnd() & 63), (uint32_t)(rnd() >> (rnd() & 31)),
				(size_t)(rnd() % 5) * 7, (int)(rnd() & 1), hb, buf);

		memcpy(mut, buf, n);
		n = kvt_mutate(mut, n, &rng);
		mtaken += (size_t)compare(&ar, mut, n, "mutated");
	}
	printf("packed: %zu of %zu taken; mutated: %zu of 200000 taken\n", taken, packed, mtaken);
	seal_tests(&ar, hb, buf, mut);
	replies();
	kv_arena_fini(&ar);
	free(hb);
	free(buf);
	free(mut);
	if (fails)
		fprintf(stderr, "%d failures\n", fails);
	return fails ? 1 : 0;
}
