/* kvbench section d: lookup of a 1,000-block chain sealed and cached just
 * before (every hash hits), then the release of the references it took,
 * timed apart. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "kvbench.h"
#include "pbvarint.h"

/* This thread's CPU time (user and system), ns. */
static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The floor of the client's CPU per lookup: kvbench's thread's CPU in a
 * Lookup of chain[0..n) written and read by hand on the library's socket,
 * with the library's system calls and none of its code (the frame as
 * client/conn.c send_lookup() writes it in one sendmsg(); poll() with a
 * timeout, then a recvmsg() with room for fds that does not block, until
 * the reply is whole, and its handles copied to held[], which the caller
 * releases), against the same daemon's service time, which an echo's floor
 * does not have. Request id id, which the daemon only echoes. Dies on
 * anything but a reply of n blocks. */
static uint64_t raw_lookup_cpu(struct bench_conn *bc, const kvc_hash *chain, uint32_t n,
			       uint64_t id, uint8_t *rb, size_t cap, kvc_block *held)
{
	int fd = kvc_conn_fd(bc->c), fds[KV_FRAME_MAX_FDS], nfds = 0, trunc = 0;
	uint8_t pre[KV_FRAME_HDR + 40], *p = pre + KV_FRAME_HDR;
	size_t hl = (size_t)n * sizeof(*chain), got = 0, need = KV_FRAME_HDR;
	uint64_t sub = (bc->pool ? 1 + kv_pb_varint_len((uint64_t)bc->pool) : 0) + 1 +
		       kv_pb_varint_len(hl) + hl, t0, t1;
	struct kvc_blocks_view v;
	struct iovec iov[2];
	uint32_t len = 0;

	t0 = thread_cpu_ns();
	*p++ = 0x08;   /* id */
	p += kv_pb_varint_put(p, id);
	*p++ = 0x72;   /* lookup */
	p += kv_pb_varint_put(p, sub);
	if (bc->pool) {
		*p++ = 0x08;   /* pool_id */
		p += kv_pb_varint_put(p, (uint64_t)bc->pool);
	}
	*p++ = 0x12;   /* hashes */
	p += kv_pb_varint_put(p, hl);
	kv_frame_hdr_encode(pre, (uint32_t)(p - pre - KV_FRAME_HDR + hl), 0);
	iov[0] = (struct iovec){ .iov_base = pre, .iov_len = (size_t)(p - pre) };
	iov[1] = (struct iovec){ .iov_base = (void *)chain, .iov_len = hl };
	if (kv_sendmsg_fds(fd, iov, 2, NULL, 0, MSG_DONTWAIT) != (ssize_t)(iov[0].iov_len + hl))
		die("raw lookup: short or failed send");
	while (got < need) {
		struct pollfd pf = { .fd = fd, .events = POLLIN };
		ssize_t k;

		if (poll(&pf, 1, 60000) <= 0)
			die("raw lookup: no reply");
		k = kv_recvmsg_fds(fd, rb + got, cap - got, fds, &nfds, KV_FRAME_MAX_FDS,
				   MSG_DONTWAIT, &trunc);
		if (k == -EAGAIN)
			continue;
		if (k <= 0 || nfds)
			die("raw lookup: the reply failed or carried fds");
		got += (size_t)k;
		if (need == KV_FRAME_HDR && got >= KV_FRAME_HDR) {
			if (kv_frame_hdr_decode(rb, (uint32_t)(cap - KV_FRAME_HDR), &len) < 0)
				die("raw lookup: bad reply header");
			need = KV_FRAME_HDR + len;
		}
	}
	if (got != need || kvc_blocks_view(rb + KV_FRAME_HDR, len, &v) != 1 || v.id != id ||
	    v.n != n)
		die("raw lookup: the reply is not the %u blocks of the chain", n);
	memcpy(held, v.blocks, (size_t)n * sizeof(*held));
	t1 = thread_cpu_ns();
	return t1 - t0;
}

void section_lookup(struct bench_conn *bc)
{
	kvc_hash *chain = calloc(CHAIN_LEN, sizeof(*chain));
	kvc_block *held = calloc(CHAIN_LEN, sizeof(*held));
	struct samples s = { 0 }, rel = { 0 }, cl = { 0 }, raw = { 0 };
	uint64_t warm_end, end, t0, t1, t2;
	struct frames f = fr(OP_LOOKUP, CHAIN_LEN);
	double fl = floor_op(OP_LOOKUP, CHAIN_LEN), flr = floor_op(OP_RELEASE, CHAIN_LEN);
	struct row *r;
	int k;

	if (!chain || !held)
		die("out of memory");
	fresh_hashes(chain, CHAIN_LEN);
	check(bc->c, kvc_alloc(bc->c, bc->pool, CHAIN_LEN, held), "alloc");
	check(bc->c, kvc_seal(bc->c, bc->pool, held, chain, CHAIN_LEN, held), "seal");
	check(bc->c, kvc_release(bc->c, held, CHAIN_LEN), "release");

	warm_end = now_ns() + (uint64_t)(D.lookup * 0.15e9);
	end = 0;
	for (;;) {
		t0 = now_ns();
		k = kvc_lookup(bc->c, bc->pool, chain, CHAIN_LEN, held);
		t1 = now_ns();
		check(bc->c, k, "lookup");
		if (k != (int)CHAIN_LEN)
			die("lookup found %d of the %u blocks of a chain sealed just before: "
			    "evicted under our feet? (pool too small)", k, CHAIN_LEN);
		check(bc->c, kvc_release(bc->c, held, CHAIN_LEN), "release");
		t2 = now_ns();
		if (!end) {
			if (t2 >= warm_end)
				end = t2 + (uint64_t)(D.lookup * 1e9);
			continue;
		}
		sample_add(&s, t1 - t0);
		sample_add(&rel, t2 - t1);
		if (t2 >= end)
			break;
	}
	r = add_row('d', "lookup 1000 (all hit)");
	row_from(r, &s, 1);
	r->req = f.req;
	r->resp = f.resp;
	r->floor_p50 = fl;
	print_row(r);
	r = add_row('d', "  per hash (lookup / 1000)");
	row_from(r, &s, CHAIN_LEN);
	r->p50 /= CHAIN_LEN;
	r->p99 /= CHAIN_LEN;
	r->ops_unit = "hashes/s";
	print_row(r);
	r = add_row('d', "release 1000 (after each lookup)");
	row_from(r, &rel, 1);
	f = fr(OP_RELEASE, CHAIN_LEN);
	r->req = f.req;
	r->resp = f.resp;
	r->floor_p50 = flr;
	print_row(r);
	sample_free(&s);
	sample_free(&rel);
	/* The daemon's CPU per lookup and per release: a pass of its own (the
	 * reads between the requests stay out of the timed one). */
	if (daemon_cpu_ns(bc)) {
		size_t cap = KV_FRAME_HDR + 16 + (size_t)CHAIN_LEN * 9 + 64;
		uint8_t *rb = malloc(cap);
		uint64_t id = 1ull << 62;

		if (!rb)
			die("out of memory");
		for (unsigned i = 0; i < 3000; i++) {
			uint64_t c0 = daemon_cpu_ns(bc), c1, c2, u0, u1;

			u0 = thread_cpu_ns();
			k = kvc_lookup(bc->c, bc->pool, chain, CHAIN_LEN, held);
			u1 = thread_cpu_ns();
			c1 = daemon_cpu_ns(bc);
			check(bc->c, k, "lookup");
			if (k != (int)CHAIN_LEN)
				die("lookup found %d of the %u blocks of its chain", k, CHAIN_LEN);
			check(bc->c, kvc_release(bc->c, held, CHAIN_LEN), "release");
			c2 = daemon_cpu_ns(bc);
			sample_add(&s, c1 - c0);
			sample_add(&rel, c2 - c1);
			sample_add(&cl, u1 - u0);
			/* The client's floor, alternated with it: the same lookup
			 * by hand (raw_lookup_cpu()), between the same reads of
			 * the daemon's CPU, and the library's release. */
			daemon_cpu_ns(bc);
			sample_add(&raw, raw_lookup_cpu(bc, chain, CHAIN_LEN, id++, rb, cap, held));
			daemon_cpu_ns(bc);
			check(bc->c, kvc_release(bc->c, held, CHAIN_LEN), "release");
			daemon_cpu_ns(bc);
		}
		cpu_row('d', "lookup 1000", &s);
		cpu_row('d', "release 1000", &rel);
		/* kvbench's own thread in kvc_lookup(): the frames' encode and
		 * decode, the reply's checks and the socket calls. */
		cpu_row_of('d', "client", "lookup 1000", &cl);
		cpu_row_of('d', "raw client", "lookup 1000", &raw);
		sample_free(&s);
		sample_free(&rel);
		sample_free(&cl);
		sample_free(&raw);
		free(rb);
	}
	free(chain);
	free(held);
}
