/* kvbench section d, its client's floor: kvbench's thread's CPU in a
 * lookup of the cached chain made without libkvcache, on its socket. */
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

void raw_lookup_rows(struct bench_conn *bc)
{
	size_t cap = KV_FRAME_HDR + 16 + (size_t)CHAIN_LEN * 9 + 64;
	kvc_hash *chain;
	kvc_block *held;
	uint8_t *rb;
	uint64_t id = 1ull << 62;
	struct samples raw = { 0 };

	if (!daemon_cpu_ns(bc))   /* as the client's row, which needs it */
		return;
	chain = calloc(CHAIN_LEN, sizeof(*chain));
	held = calloc(CHAIN_LEN, sizeof(*held));
	rb = malloc(cap);
	if (!chain || !held || !rb)
		die("out of memory");
	/* A chain of its own, sealed and cached as section_lookup()'s first. */
	fresh_hashes(chain, CHAIN_LEN);
	check(bc->c, kvc_alloc(bc->c, bc->pool, CHAIN_LEN, held), "alloc");
	check(bc->c, kvc_seal(bc->c, bc->pool, held, chain, CHAIN_LEN, held), "seal");
	check(bc->c, kvc_release(bc->c, held, CHAIN_LEN), "release");
	for (unsigned i = 0; i < 300; i++) {   /* warm, untimed */
		raw_lookup_cpu(bc, chain, CHAIN_LEN, id++, rb, cap, held);
		check(bc->c, kvc_release(bc->c, held, CHAIN_LEN), "release");
	}
	/* The reads of the daemon's CPU around each call, as in the pass that
	 * measures kvc_lookup(). */
	for (unsigned i = 0; i < 3000; i++) {
		daemon_cpu_ns(bc);
		sample_add(&raw, raw_lookup_cpu(bc, chain, CHAIN_LEN, id++, rb, cap, held));
		daemon_cpu_ns(bc);
		check(bc->c, kvc_release(bc->c, held, CHAIN_LEN), "release");
		daemon_cpu_ns(bc);
	}
	cpu_row_of('d', "raw client", "lookup 1000", &raw);
	sample_free(&raw);
	free(chain);
	free(held);
	free(rb);
}
