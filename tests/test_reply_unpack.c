/* The library's view of a block list reply read in place (kvc_blocks_view(),
 * client/blocks.c, issue 38) against protobuf-c's decode: every reply of
 * blocks the daemon's packer writes (protobuf-c's pack of a Response with an
 * id and a BlockList, with and without tiers) is taken, and every frame it
 * takes, among those, hand-made odd forms and random mutations of both,
 * protobuf-c decodes to the same id, blocks and tiers, with no error, no
 * segments and the blocks' result, and the view stays inside the frame.
 * (What the library then checks in such a reply, the count, pools, tiers
 * and id, test_client_unit's violations drive through a fake daemon.)
 * Exit 0 pass, 1 fail. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvc_internal.h"
#include "mutate.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint64_t rnd(void)
{
	return kvt_rnd(&rng);
}

/* Whether the view v of buf[0..len) (of form 1: blocks, 2: no result) says
 * what protobuf-c's p says. */
static int same(int form, const struct kvc_blocks_view *v, const Kvcached__Response *p)
{
	const Kvcached__BlockList *l = p->blocks;

	if (p->id != v->id || p->error || p->n_segments)
		return 0;
	if (form == 2)
		return p->result_case == KVCACHED__RESPONSE__RESULT__NOT_SET;
	if (p->result_case != KVCACHED__RESPONSE__RESULT_BLOCKS || !l)
		return 0;
	if (l->n_blocks != v->n || l->n_tiers != v->ntiers)
		return 0;
	for (size_t i = 0; i < v->n; i++) {
		uint64_t b;

		memcpy(&b, v->blocks + 8 * i, 8);
		if (b != l->blocks[i])
			return 0;
	}
	for (size_t i = 0; i < v->ntiers; i++)
		if ((int)v->tiers[i] != (int)l->tiers[i])
			return 0;
	return 1;
}

/* Where each frame is read from: its last byte just before a page that
 * cannot be read, so that a read past the frame faults (ASan or not). */
static uint8_t *fence;
static size_t fence_room;

static int fence_init(size_t room)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	uint8_t *p;

	fence_room = (room + pg - 1) / pg * pg;
	p = mmap(NULL, fence_room + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
		 0);
	if (p == MAP_FAILED || mprotect(p + fence_room, pg, PROT_NONE) < 0)
		return -1;
	fence = p + fence_room;
	return 0;
}

/* 1: the view took frame[0..len) (copied against the fence first); 0: it
 * left it to protobuf-c. What it took must be what protobuf-c makes of it,
 * and inside the frame. */
static int compare(const uint8_t *frame, size_t len, const char *what)
{
	struct kvc_blocks_view v;
	uint8_t *buf = fence - len;
	int took;

	if (len > fence_room) {
		FAIL("%s: %zu bytes, over the test's room", what, len);
		return 0;
	}
	memcpy(buf, frame, len);
	took = kvc_blocks_view(buf, len, &v);
	Kvcached__Response *p;

	if (took < 0 || took > 2)
		FAIL("%s: returned %d", what, took);
	if (!took)
		return 0;
	p = kvcached__response__unpack(NULL, len, buf);
	if (!p)
		FAIL("%s: taken in place, refused by protobuf-c (%zu bytes)", what, len);
	else if (!same(took, &v, p))
		FAIL("%s: read otherwise than protobuf-c decodes it (%zu bytes)", what, len);
	if (p)
		kvcached__response__free_unpacked(p, NULL);
	if (took == 2)
		return took;
	if (v.n && (v.blocks < buf || v.blocks + 8 * v.n > buf + len))
		FAIL("%s: blocks outside the frame", what);
	if (v.ntiers && (v.tiers < buf || v.tiers + v.ntiers > buf + len))
		FAIL("%s: tiers outside the frame", what);
	return took;
}

/* A reply of n blocks as the daemon packs it (ops_req.c's
 * kv_op_reply_handles(), conn.c's conn_reply()): tiers when tiers. */
static size_t pack(uint64_t id, const uint64_t *blocks, size_t n, const Kvcached__Tier *tiers,
		   uint8_t *out)
{
	Kvcached__Response rs = KVCACHED__RESPONSE__INIT;
	Kvcached__BlockList bl = KVCACHED__BLOCK_LIST__INIT;

	bl.n_blocks = n;
	bl.blocks = (uint64_t *)blocks;
	if (tiers) {
		bl.n_tiers = n;
		bl.tiers = (Kvcached__Tier *)tiers;
	}
	rs.id = id;
	rs.result_case = KVCACHED__RESPONSE__RESULT_BLOCKS;
	rs.blocks = &bl;
	return kvcached__response__pack(&rs, out);
}

int main(void)
{
	static const uint64_t ids[] = { 0, 1, 127, 128, 300, 1ull << 32, (1ull << 63) + 5,
					UINT64_MAX };
	static const size_t counts[] = { 0, 1, 2, 15, 16, 17, 255, 256, 1000, 4096 };
	enum { MAXN = 4096, BUF = MAXN * 9 + 64 };
	uint64_t *blocks = malloc(MAXN * sizeof(*blocks));
	Kvcached__Tier *tiers = malloc(MAXN * sizeof(*tiers));
	uint8_t *buf = malloc(BUF), *mut = malloc(BUF + 8);
	size_t packed = 0, taken = 0, mtaken = 0;

	if (!blocks || !tiers || !buf || !mut || fence_init(BUF + 8) < 0)
		return 1;
	for (size_t i = 0; i < MAXN; i++) {
		blocks[i] = rnd();
		tiers[i] = (Kvcached__Tier)(rnd() % 4);
	}
	/* Every reply of blocks the daemon writes is taken, and reads the same. */
	for (size_t a = 0; a < sizeof(ids) / sizeof(ids[0]); a++)
		for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
			for (int t = 0; t < 2; t++) {
				size_t n = pack(ids[a], blocks, counts[c], t ? tiers : NULL, buf);

				packed++;
				if (compare(buf, n, "packed") == 1)
					taken++;
				else
					FAIL("packed reply (id %llu, %zu blocks, tiers %d) not taken",
					     (unsigned long long)ids[a], counts[c], t);
			}
	/* A reply of nothing but its id, as the daemon packs a Release's. */
	for (size_t a = 0; a < sizeof(ids) / sizeof(ids[0]); a++) {
		Kvcached__Response rs = KVCACHED__RESPONSE__INIT;
		size_t n;

		rs.id = ids[a];
		n = kvcached__response__pack(&rs, buf);
		packed++;
		if (compare(buf, n, "packed, no result") == 2)
			taken++;
		else
			FAIL("packed reply of id %llu alone not taken", (unsigned long long)ids[a]);
	}
	/* Forms the daemon does not write: left to protobuf-c, or read the
	 * same. */
	{
		static const struct {
			const char *what;
			uint8_t b[40];
			size_t n;
			int take;   /* 1: taken, 2: taken as no result; 0: left; -1: either */
		} odd[] = {
			{ "empty frame", { 0 }, 0, 2 },
			{ "id only (a Release's reply)", { 0x08, 0x05 }, 2, 2 },
			{ "id in 10 bytes alone",
			  { 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01 }, 11, 2 },
			{ "id twice alone", { 0x08, 0x01, 0x08, 0x02 }, 4, 0 },
			{ "an error alone", { 0x12, 0x02, 0x08, 0x05 }, 4, 0 },
			{ "empty block list", { 0x62, 0x00 }, 2, 1 },
			{ "id, empty block list", { 0x08, 0x07, 0x62, 0x00 }, 4, 1 },
			{ "empty packed blocks", { 0x62, 0x02, 0x0a, 0x00 }, 4, 1 },
			{ "one block", { 0x62, 0x0a, 0x0a, 0x08, 1, 2, 3, 4, 5, 6, 7, 8 }, 12, 1 },
			{ "one block and its tier",
			  { 0x62, 0x0d, 0x0a, 0x08, 1, 2, 3, 4, 5, 6, 7, 8, 0x12, 0x01, 0x03 }, 15, 1 },
			{ "blocks of 7 bytes", { 0x62, 0x09, 0x0a, 0x07, 1, 2, 3, 4, 5, 6, 7 }, 11, 0 },
			{ "blocks of 9 bytes",
			  { 0x62, 0x0b, 0x0a, 0x09, 1, 2, 3, 4, 5, 6, 7, 8, 9 }, 13, 0 },
			{ "blocks past the list",
			  { 0x62, 0x0a, 0x0a, 0x10, 1, 2, 3, 4, 5, 6, 7, 8 }, 12, 0 },
			{ "blocks past the frame",
			  { 0x62, 0x12, 0x0a, 0x10, 1, 2, 3, 4, 5, 6, 7, 8 }, 12, 0 },
			{ "list past the frame", { 0x62, 0x05, 0x0a, 0x00 }, 4, 0 },
			{ "list short of the frame", { 0x62, 0x00, 0x0a, 0x00 }, 4, 0 },
			{ "blocks length cut", { 0x62, 0x02, 0x0a, 0x80 }, 4, 0 },
			{ "list length cut", { 0x62, 0x80 }, 2, 0 },
			{ "list length in 6 bytes",
			  { 0x62, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00 }, 7, 0 },
			{ "blocks length 0 in 2 bytes", { 0x62, 0x03, 0x0a, 0x80, 0x00 }, 5, -1 },
			{ "blocks length 0 in 6 bytes",
			  { 0x62, 0x07, 0x0a, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00 }, 9, 0 },
			{ "tiers length 0 in 6 bytes",
			  { 0x62, 0x07, 0x12, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00 }, 9, 0 },
			{ "tiers length past the frame (their bytes not there)",
			  { 0x62, 0x02, 0x12, 0x7f }, 4, 0 },
			{ "blocks one by one (unpacked fixed64)",
			  { 0x62, 0x09, 0x09, 1, 2, 3, 4, 5, 6, 7, 8 }, 11, 0 },
			{ "blocks twice",
			  { 0x62, 0x14, 0x0a, 0x08, 1, 2, 3, 4, 5, 6, 7, 8, 0x0a, 0x08, 1, 2, 3, 4, 5,
			    6, 7, 8 },
			  22, 0 },
			{ "tiers before blocks",
			  { 0x62, 0x0d, 0x12, 0x01, 0x01, 0x0a, 0x08, 1, 2, 3, 4, 5, 6, 7, 8 }, 15, 0 },
			{ "tiers twice", { 0x62, 0x06, 0x12, 0x01, 0x01, 0x12, 0x01, 0x02 }, 8, 0 },
			{ "a tier in 2 bytes", { 0x62, 0x04, 0x12, 0x02, 0x81, 0x00 }, 6, 0 },
			{ "a tier cut", { 0x62, 0x03, 0x12, 0x01, 0x81 }, 5, 0 },
			{ "a tier of 127", { 0x62, 0x03, 0x12, 0x01, 0x7f }, 5, 1 },
			{ "tiers past the list", { 0x62, 0x03, 0x12, 0x02, 0x01 }, 5, 0 },
			{ "unknown field in the list", { 0x62, 0x02, 0x18, 0x01 }, 4, 0 },
			{ "list then id", { 0x62, 0x00, 0x08, 0x01 }, 4, 0 },
			{ "list twice (protobuf-c merges)", { 0x62, 0x00, 0x62, 0x00 }, 4, 0 },
			{ "id twice", { 0x08, 0x01, 0x08, 0x02, 0x62, 0x00 }, 6, 0 },
			{ "id cut", { 0x08, 0x80 }, 2, 0 },
			{ "id in 10 bytes",
			  { 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x62, 0x00 },
			  13, 1 },
			{ "id in 11 bytes",
			  { 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x81, 0x00, 0x62,
			    0x00 },
			  14, 0 },
			{ "an error, then blocks",
			  { 0x08, 0x01, 0x12, 0x02, 0x08, 0x05, 0x62, 0x00 }, 8, 0 },
			{ "a segment, then blocks",
			  { 0x08, 0x01, 0x1a, 0x02, 0x08, 0x00, 0x62, 0x00 }, 8, 0 },
			{ "blocks, then an error", { 0x62, 0x00, 0x12, 0x02, 0x08, 0x05 }, 6, 0 },
			{ "another result (swap_out)", { 0x08, 0x01, 0xaa, 0x01, 0x00 }, 5, 0 },
			{ "the list as a varint", { 0x60, 0x01 }, 2, 0 },
			{ "the list's tag in 2 bytes", { 0xe2, 0x00, 0x00 }, 3, 0 },
		};

		for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
			int took = compare(odd[i].b, odd[i].n, odd[i].what);

			if (odd[i].take >= 0 && took != odd[i].take)
				FAIL("%s: returned %d", odd[i].what, took);
		}
	}
	/* Random mutations of packed replies: whatever is taken reads as
	 * protobuf-c decodes it. */
	for (int it = 0; it < 200000; it++) {
		size_t n = pack(rnd() >> (rnd() & 63), blocks, (size_t)(rnd() % 6), (rnd() & 1) ? tiers
										       : NULL,
				buf);

		memcpy(mut, buf, n);
		n = kvt_mutate(mut, n, &rng);
		mtaken += compare(mut, n, "mutated") != 0;
	}
	/* The pool check of a view's handles (kvc_blocks_of_pool(), in
	 * vectors and then one at a time) against KVC_BLOCK_POOL() of each:
	 * every count up to 70 and some longer, handles of the pool with one
	 * bit changed anywhere (in the pool's field or not) at any place or
	 * none, pools at the field's ends and past it; read against the
	 * fence, so that a read past the last handle faults. */
	for (int it = 0; it < 100000; it++) {
		static const uint64_t wants[] = { 0, 1, 5, KVC_MAX_POOLS - 1, KVC_MAX_POOLS,
						  1ull << 32, UINT64_MAX };
		static const size_t longer[] = { 255, 256, 257, 1000, 4096 };
		size_t n = it % 8 ? (size_t)(rnd() % 71) : longer[rnd() % 5];
		uint64_t want = rnd() & 1 ? wants[rnd() % 7] : rnd() % KVC_MAX_POOLS;
		uint8_t *h = fence - 8 * n;
		bool ok = true, got;

		size_t at = n && rnd() % 2 ? (size_t)(rnd() % n) : n;   /* n: none */

		for (size_t i = 0; i < n; i++) {
			uint64_t b = (rnd() & ~((uint64_t)0xfff << 32)) | (want & 0xfff) << 32;

			if (i == at)
				b ^= 1ull << (rnd() % 64);
			memcpy(h + 8 * i, &b, 8);
			ok = ok && KVC_BLOCK_POOL(b) == want;
		}
		got = kvc_blocks_of_pool(h, n, want);
		if (got != ok)
			FAIL("pool check of %zu handles, pool %llu: %d, one at a time %d", n,
			     (unsigned long long)want, got, ok);
	}
	printf("packed: %zu of %zu taken; mutated: %zu of 200000 taken\n", taken, packed, mtaken);
	free(blocks);
	free(tiers);
	free(buf);
	free(mut);
	if (fails)
		fprintf(stderr, "%d failures\n", fails);
	return fails ? 1 : 0;
}
