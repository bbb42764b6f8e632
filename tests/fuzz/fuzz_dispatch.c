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

#include "config.h"
#include "daemon.h"
#include "log.h"
#include "ops.h"
#include "pool.h"
#include "session.h"
#include "tier.h"

#define NSESS 3
#define ADMIN NSESS
#define MAXH 64
#define MAXSW 8

struct track {
	uint64_t h[MAXH];
	int n;
	uint64_t sw[MAXSW];
	int nsw;
	uint32_t pool[2];
	int woken;
};

static struct kv_daemon D;
static struct kv_session S[NSESS + 1];
static struct track T[NSESS + 1];
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

static void finding(const char *what)
{
	fprintf(stderr, "fuzz_dispatch: %s\n", what);
	abort();
}

static void wake(struct kv_waiter *w)
{
	struct kv_session *ss = kv_container_of(w, struct kv_session, waiter);

	T[ss - S].woken = 1;
}

static void hello(int i, const char *ns);

/* A fresh session i, past its Hello in namespace ns. */
static void open_session_ns(int i, const char *ns)
{
	struct ucred cr = { .pid = getpid(), .uid = 0, .gid = 0 };

	memset(&S[i], 0, sizeof(S[i]));
	memset(&T[i], 0, sizeof(T[i]));
	kv_session_open(&D, &S[i], &cr, i == ADMIN);
	S[i].waiter.wake = wake;
	hello(i, ns);
}

static void open_session(int i)
{
	open_session_ns(i, "");
}

static int in_flight(void)
{
	struct kv_tier_stats st[KV_NTIERS];

	kv_tiers_stats(D.tiers, st);
	return st[KV_TIER_G1].inflight || st[KV_TIER_G2].inflight || st[KV_TIER_G3].inflight;
}

/* Runs the completions of copies and disk I/O until nothing is in flight. */
static void pump(void)
{
	for (int k = 0; k < 10000; k++) {
		struct pollfd p[2] = { { D.be->completion_fd, POLLIN, 0 },
				       { kv_tiers_disk_fd(D.tiers), POLLIN, 0 } };

		kv_tiers_copies_done(D.tiers);
		kv_tiers_disk_done(D.tiers);
		kv_daemon_collect(&D);
		kv_tiers_kick(D.tiers);
		if (!in_flight())
			return;
		poll(p, p[1].fd >= 0 ? 2 : 1, 100);
	}
	finding("tier I/O still in flight after 10,000 pumps");
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
static Kvcached__Response *run(int i, Kvcached__Request *rq)
{
	static Kvcached__Response rs;
	enum kv_op_outcome out;

	for (int tries = 0;; tries++) {
		kvcached__response__init(&rs);
		T[i].woken = 0;
		kv_daemon_collect(&D);
		out = kv_ops_dispatch(&D, &S[i], rq, &rs);
		if (out == KV_OP_HOLD) {
			kv_session_fds_read(&S[i]);  /* our peer reads everything at once */
		} else if (out == KV_OP_PARK) {
			pump();
			if (!T[i].woken && !in_flight())
				finding("a parked request nobody will wake");
		} else {
			break;
		}
		kv_arena_reset(&D.arena);
		if (tries > 1000)
			finding("a request parked or held 1,000 times");
	}
	kv_session_fds_sent(&S[i], S[i].nfds);
	kv_session_fds_read(&S[i]);
	kv_tiers_kick(D.tiers);
	if (getenv("FUZZ_TRACE"))
		fprintf(stderr, "session %d op %d: %s%s (%zu blocks)\n", i, (int)rq->op_case,
			out == KV_OP_CLOSE ? "closed: " : out == KV_OP_NOMEM ? "no memory" : "",
			rs.error && rs.error->code ? rs.error->message : "ok",
			rs.result_case == KVCACHED__RESPONSE__RESULT_BLOCKS ? rs.blocks->n_blocks : 0);
	if (out == KV_OP_CLOSE || out == KV_OP_NOMEM) {
		kv_arena_reset(&D.arena);
		kv_session_release(&S[i]);
		kv_daemon_collect(&D);
		open_session(i);
		return NULL;
	}
	return &rs;
}

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

static void hello(int i, const char *ns)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Hello h = KVCACHED__HELLO__INIT;

	h.min_version = h.max_version = 1;
	h.namespace_ = (char *)ns;
	h.client_name = "fuzz";
	rq.op_case = KVCACHED__REQUEST__OP_HELLO;
	rq.hello = &h;
	run(i, &rq);
	kv_arena_reset(&D.arena);
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
		kv_session_release(&S[i]);
		kv_daemon_collect(&D);
		open_session_ns(i, ns[take(in) % 3]);
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
		rs = run(i, &rq);
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
		keep(i, rs = run(i, &rq));
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
		rs = run(i, &rq);
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
		keep(i, rs = run(i, &rq));
		break;
	}
	case 5: {
		Kvcached__Release m = KVCACHED__RELEASE__INIT;

		m.n_blocks = n;
		m.blocks = h;
		rq.op_case = KVCACHED__REQUEST__OP_RELEASE;
		rq.release = &m;
		rs = run(i, &rq);
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
		rs = run(i, &rq);
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
		rs = run(i, &rq);
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
		keep(i, rs = run(i, &rq));
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
		run(take(in) % 2 ? ADMIN : i, &rq);
		break;
	}
	case 12: {
		Kvcached__Stats st = KVCACHED__STATS__INIT;

		rq.op_case = KVCACHED__REQUEST__OP_STATS;
		rq.stats = &st;
		run(i, &rq);
		break;
	}
	case 13:
		kv_session_release(&S[i]);
		kv_daemon_collect(&D);
		open_session(i);
		break;
	case 14:
		pump();
		break;
	default: {
		/* A raw Request: whatever protobuf-c makes of the bytes. */
		size_t len = take(in) % 64;
		Kvcached__Request *raw;

		if (len > in->n)
			len = in->n;
		raw = kvcached__request__unpack(kv_arena_pb(&D.arena), len, in->p);
		in->p += len;
		in->n -= len;
		if (raw && raw->op_case != KVCACHED__REQUEST__OP_HELLO)
			keep(i, run(i, raw));
		break;
	}
	}
	kv_arena_reset(&D.arena);
}

static int check_ok(void)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Check c = KVCACHED__CHECK__INIT;
	Kvcached__Response *rs;
	int ok;

	rq.op_case = KVCACHED__REQUEST__OP_CHECK;
	rq.check = &c;
	rs = run(ADMIN, &rq);
	ok = rs && rs->result_case == KVCACHED__RESPONSE__RESULT_CHECK && rs->check->ok;
	if (!ok && rs && rs->result_case == KVCACHED__RESPONSE__RESULT_CHECK)
		for (size_t k = 0; k < rs->check->n_problems; k++)
			fprintf(stderr, "  %s\n", rs->check->problems[k]);
	kv_arena_reset(&D.arena);
	return ok;
}

static void evict(Kvcached__Tier tier)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Evict e = KVCACHED__EVICT__INIT;

	e.tier = tier;
	e.all_pools = 1;
	rq.op_case = KVCACHED__REQUEST__OP_EVICT;
	rq.evict = &e;
	run(ADMIN, &rq);
	kv_arena_reset(&D.arena);
	pump();
}

static void set(struct kv_config *c, const char *k, const char *v)
{
	char err[256];

	if (kv_config_set(c, kv_config_key(k), v, err, sizeof(err)) < 0) {
		fprintf(stderr, "fuzz_dispatch: %s\n", err);
		exit(1);
	}
}

int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	static struct kv_config cfg;
	char err[256], disk[96];

	(void)argc;
	(void)argv;
	snprintf(dir, sizeof(dir), "/tmp/kvfuzz-XXXXXX");
	if (!mkdtemp(dir))
		exit(1);
	snprintf(disk, sizeof(disk), "%s/g3", dir);
	kv_config_defaults(&cfg);
	set(&cfg, "pool_size", "64KiB");
	set(&cfg, "segment_size", "16KiB");
	set(&cfg, "page_size", "4KiB");
	set(&cfg, "host_tier_size", "64KiB");
#ifndef FUZZ_NO_DISK
	set(&cfg, "disk_path", disk);
	set(&cfg, "disk_size", "256KiB");
#endif
	set(&cfg, "max_batch", "64");
	set(&cfg, "log_level", getenv("FUZZ_LOG") ? "debug" : "err");
	kv_log_level = getenv("FUZZ_LOG") ? KV_LOG_DEBUG : KV_LOG_ERR;
	if (kv_config_finish(&cfg, err, sizeof(err)) < 0 || kv_daemon_init(&D, &cfg) < 0) {
		fprintf(stderr, "fuzz_dispatch: %s\n", err);
		exit(1);
	}
	for (int i = 0; i <= NSESS; i++)
		open_session(i);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct in in = { data, size };
	uint64_t wr = 0, se = 0;

	for (int k = 0; in.n && k < 256; k++)
		step(&in);
	pump();
	if (!check_ok())
		finding("the invariant check failed after the input");
	/* Everyone leaves; the caches empty: nothing may stay held. */
	for (int i = 0; i < NSESS; i++) {
		kv_session_release(&S[i]);
		open_session(i);
	}
	kv_daemon_collect(&D);
	pump();
	evict(KVCACHED__TIER__TIER_G1);
	evict(KVCACHED__TIER__TIER_G2);
	evict(KVCACHED__TIER__TIER_G3);
	for (uint32_t id = 0; id < kv_pools_end(D.pools); id++) {
		const struct kv_pool *p = kv_pool_get(D.pools, id);

		if (p) {
			wr += p->n.writable;
			se += p->n.sealed;
		}
	}
	if (wr || se) {
		fprintf(stderr, "  %llu writable, %llu sealed\n", (unsigned long long)wr,
			(unsigned long long)se);
		finding("blocks still held after every session closed");
	}
	if (!check_ok())
		finding("the invariant check failed after every session closed");
	return 0;
}
