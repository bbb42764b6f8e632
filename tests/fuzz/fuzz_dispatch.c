/* Fuzzing the request dispatcher with real daemon state (libFuzzer; also
 * built with tests/fuzz/run_inputs.c to replay inputs in the normal suite).
 *
 * One daemon for the process: the host backend, a 64 KiB pool in 16 KiB
 * segments of 4 KiB pages, a 64 KiB host tier and a 256 KiB disk tier in a
 * temporary file, so that G1, G2 and G3 all fill within a few requests.
 * Built with FUZZ_NO_DISK (harness dispatch_g2) there is no disk tier: G2
 * then drops idle copies for room, which a disk tier would keep, and other
 * paths open.
 * Three worker sessions and an admin one, opened with kv_session_open() on
 * no socket at all (ops.h: the dispatcher needs none).
 *
 * An input is a program: each step takes a session and an operation from
 * the next bytes, then its arguments (counts, which of the handles the
 * session was given, hash ids, pools of two block sizes (4 and 8 KiB, so G2
 * slots of two sizes), forged handles and swaps now and then), or a raw
 * protobuf Request. Requests that park on a tier run again once the copies
 * and disk I/O they wait for complete (pumped here, without the loop); one
 * still parked when nothing is in flight would wait forever: a finding.
 * After every input: the invariant check (kvctl check's), then every
 * session is closed and the caches emptied, and no block may be left
 * writable or sealed: a reference the daemon lost track of is a finding. */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzzd.h"

#define NSESS FZ_NSESS
#define MAXH 64
#define MAXSW 8

struct track {
	uint64_t h[MAXH];
	int n;
	uint64_t sw[MAXSW];
	int nsw;
	uint32_t pool[2];
};

static struct track T[FZ_NSESS + 1];
static char dir[64];

struct in {
	const uint8_t *p;
	size_t n;
};

static unsigned take(struct in *in)
{
	if (!in->n)
		return 0;
	in->n--;
	return *in->p++;
}

static uint64_t take64(struct in *in)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v = v << 8 | take(in);
	return v;
}

static void on_open(int i)
{
	memset(&T[i], 0, sizeof(T[i]));
}

static void forget(int i, uint64_t h)
{
	for (int k = 0; k < T[i].n; k++)
		if (T[i].h[k] == h) {
			T[i].h[k] = T[i].h[--T[i].n];
			return;
		}
}

/* Dispatches rq for session i as the transport would; returns the reply
 * (valid until the next run) or NULL when the session was closed. */
/* After a reply: the handles and swaps it gave session i. */
static void keep(int i, const Kvcached__Response *rs)
{
	if (!rs || (rs->error && rs->error->code))
		return;
	if (rs->result_case == KVCACHED__RESPONSE__RESULT_BLOCKS)
		for (size_t k = 0; k < rs->blocks->n_blocks && T[i].n < MAXH; k++)
			T[i].h[T[i].n++] = rs->blocks->blocks[k];
	if (rs->result_case == KVCACHED__RESPONSE__RESULT_SWAP_OUT && T[i].nsw < MAXSW)
		T[i].sw[T[i].nsw++] = rs->swap_out->swap;
}

/* A handle session i holds, or a forged one now and then. */
static uint64_t pick(int i, struct in *in)
{
	unsigned c = take(in);

	if (c == 255)
		return take64(in);
	return T[i].n ? T[i].h[c % T[i].n] : take64(in);
}

static void hash_of(unsigned id, uint8_t out[32])
{
	memset(out, 0, 32);
	out[0] = (uint8_t)id;
	out[1] = 0x5a;
}

static void step(struct in *in)
{
	static const char *const ns[] = { "", "a", "b" };
	static const uint64_t bb[] = { 4096, 8192, 8192 };
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	int i = (int)(take(in) % NSESS), op = (int)(take(in) % 16);
	uint64_t h[8];
	uint8_t hashes[8 * 32];
	unsigned n = 1 + take(in) % 4;
	Kvcached__Response *rs = NULL;

	for (unsigned k = 0; k < n; k++)
		h[k] = pick(i, in);
	switch (op) {
	case 0:
		/* Leaves, and comes back in another namespace. */
		kv_session_release(&fz_s[i]);
		kv_daemon_collect(&fz_d);
		fz_open(i, ns[take(in) % 3]);
		return;
	case 1: {
		Kvcached__RegisterPool m = KVCACHED__REGISTER_POOL__INIT;
		unsigned which = take(in) % 3;

		m.name = which == 1 ? "p8" : "p4";
		m.block_bytes = bb[which];
		m.block_tokens = 16;
		m.dtype = "fp16";
		rq.op_case = KVCACHED__REQUEST__OP_REGISTER_POOL;
		rq.register_pool = &m;
		rs = fz_run(i, &rq);
		if (rs && rs->result_case == KVCACHED__RESPONSE__RESULT_REGISTER_POOL)
			T[i].pool[which == 1] = rs->register_pool->pool_id;
		break;
	}
	case 2: {
		Kvcached__Alloc m = KVCACHED__ALLOC__INIT;

		m.pool_id = take(in) % 8 == 7 ? take(in) : T[i].pool[take(in) % 2];
		m.count = 1 + take(in) % 8;
		rq.op_case = KVCACHED__REQUEST__OP_ALLOC;
		rq.alloc = &m;
		keep(i, rs = fz_run(i, &rq));
		break;
	}
	case 3: {
		Kvcached__Seal m = KVCACHED__SEAL__INIT;
		unsigned base = take(in) % 16;

		for (unsigned k = 0; k < n; k++)
			hash_of(base + (take(in) % 4 == 0 ? 0 : k), hashes + 32 * k);
		m.pool_id = T[i].pool[take(in) % 2];
		m.n_blocks = n;
		m.blocks = h;
		m.hashes.data = hashes;
		m.hashes.len = 32 * n - (take(in) % 32 == 0);
		rq.op_case = KVCACHED__REQUEST__OP_SEAL;
		rq.seal = &m;
		rs = fz_run(i, &rq);
		if (rs && rs->result_case == KVCACHED__RESPONSE__RESULT_BLOCKS) {
			for (unsigned k = 0; k < n; k++)
				forget(i, h[k]);
			keep(i, rs);
		}
		break;
	}
	case 4: {
		Kvcached__Lookup m = KVCACHED__LOOKUP__INIT;
		unsigned base = take(in) % 16;

		for (unsigned k = 0; k < n; k++)
			hash_of(base + k, hashes + 32 * k);
		m.pool_id = T[i].pool[take(in) % 2];
		m.hashes.data = hashes;
		m.hashes.len = 32 * n;
		rq.op_case = KVCACHED__REQUEST__OP_LOOKUP;
		rq.lookup = &m;
		keep(i, rs = fz_run(i, &rq));
		break;
	}
	case 5: {
		Kvcached__Release m = KVCACHED__RELEASE__INIT;

		m.n_blocks = n;
		m.blocks = h;
		rq.op_case = KVCACHED__REQUEST__OP_RELEASE;
		rq.release = &m;
		rs = fz_run(i, &rq);
		if (rs && (!rs->error || !rs->error->code))
			for (unsigned k = 0; k < n; k++)
				forget(i, h[k]);
		break;
	}
	case 6:
	case 7: {
		Kvcached__Fork f = KVCACHED__FORK__INIT;
		Kvcached__Cow c = KVCACHED__COW__INIT;

		if (op == 6) {
			f.n_blocks = n;
			f.blocks = h;
			rq.op_case = KVCACHED__REQUEST__OP_FORK;
			rq.fork = &f;
		} else {
			c.n_blocks = n;
			c.blocks = h;
			rq.op_case = KVCACHED__REQUEST__OP_COW;
			rq.cow = &c;
		}
		rs = fz_run(i, &rq);
		if (rs && op == 7 && rs->result_case == KVCACHED__RESPONSE__RESULT_BLOCKS)
			for (unsigned k = 0; k < n; k++)
				forget(i, h[k]);
		keep(i, rs);
		break;
	}
	case 8: {
		Kvcached__SwapOut m = KVCACHED__SWAP_OUT__INIT;

		m.n_blocks = n;
		m.blocks = h;
		rq.op_case = KVCACHED__REQUEST__OP_SWAP_OUT;
		rq.swap_out = &m;
		rs = fz_run(i, &rq);
		if (rs && rs->result_case == KVCACHED__RESPONSE__RESULT_SWAP_OUT)
			for (unsigned k = 0; k < n; k++)
				forget(i, h[k]);
		keep(i, rs);
		break;
	}
	case 9: {
		Kvcached__SwapIn m = KVCACHED__SWAP_IN__INIT;

		m.swap = T[i].nsw && take(in) != 255 ? T[i].sw[take(in) % T[i].nsw] : take64(in);
		rq.op_case = KVCACHED__REQUEST__OP_SWAP_IN;
		rq.swap_in = &m;
		keep(i, rs = fz_run(i, &rq));
		break;
	}
	case 10:
	case 11: {
		Kvcached__Evict e = KVCACHED__EVICT__INIT;
		Kvcached__Flush fl = KVCACHED__FLUSH__INIT;

		if (op == 10) {
			e.tier = (Kvcached__Tier)(take(in) % 3);
			e.all_pools = 1;
			rq.op_case = KVCACHED__REQUEST__OP_EVICT;
			rq.evict = &e;
		} else {
			rq.op_case = KVCACHED__REQUEST__OP_FLUSH;
			rq.flush = &fl;
		}
		fz_run(take(in) % 2 ? FZ_ADMIN : i, &rq);
		break;
	}
	case 12: {
		Kvcached__Stats st = KVCACHED__STATS__INIT;

		rq.op_case = KVCACHED__REQUEST__OP_STATS;
		rq.stats = &st;
		fz_run(i, &rq);
		break;
	}
	case 13:
		kv_session_release(&fz_s[i]);
		kv_daemon_collect(&fz_d);
		fz_open(i, "");
		break;
	case 14:
		fz_pump();
		break;
	default: {
		/* A raw Request: whatever protobuf-c makes of the bytes. */
		size_t len = take(in) % 64;
		Kvcached__Request *raw;

		if (len > in->n)
			len = in->n;
		raw = kvcached__request__unpack(kv_arena_pb(&fz_d.arena), len, in->p);
		in->p += len;
		in->n -= len;
		if (raw && raw->op_case != KVCACHED__REQUEST__OP_HELLO)
			keep(i, fz_run(i, raw));
		break;
	}
	}
	kv_arena_reset(&fz_d.arena);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	snprintf(dir, sizeof(dir), "/tmp/kvfuzz-XXXXXX");
#ifdef FUZZ_NO_DISK
	fz_start(dir, 0);
#else
	fz_start(dir, 1);
#endif
	fz_on_open = on_open;
	for (int i = 0; i <= NSESS; i++)
		fz_open(i, "");
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct in in = { data, size };
	uint64_t held;

	for (int k = 0; in.n && k < 256; k++)
		step(&in);
	fz_pump();
	if (!fz_check())
		fz_finding("the invariant check failed after the input");
	/* Everyone leaves; the caches empty: nothing may stay held. */
	for (int i = 0; i < NSESS; i++) {
		kv_session_release(&fz_s[i]);
		fz_open(i, "");
	}
	kv_daemon_collect(&fz_d);
	fz_pump();
	fz_evict(KVCACHED__TIER__TIER_G1);
	fz_evict(KVCACHED__TIER__TIER_G2);
	fz_evict(KVCACHED__TIER__TIER_G3);
	if ((held = fz_held_blocks())) {
		fprintf(stderr, "  %llu blocks writable or sealed\n", (unsigned long long)held);
		fz_finding("blocks still held after every session closed");
	}
	if (!fz_check())
		fz_finding("the invariant check failed after every session closed");
	return 0;
}
