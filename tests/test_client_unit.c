/* libkvcache against a scripted fake daemon: a thread of this process that
 * speaks the protocol from proto/ by hand. Covers the wire format of each op,
 * segment fds (early, split, missing), block addresses in shared memory,
 * daemon errors, protocol violations that break a connection, local limits,
 * and calls from several threads. Exits 0 (pass) or 1 (fail).
 * One file past 1,000 lines: every case talks to the one scripted daemon
 * defined here, and the cases are short. */
#include <errno.h>
#include <linux/sockios.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "kvc_internal.h"

static atomic_int failures;

#define CHECK(cond)                                                                      \
	do {                                                                             \
		if (!(cond)) {                                                           \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, \
				#cond);                                                  \
			atomic_fetch_add(&failures, 1);                                  \
		}                                                                        \
	} while (0)

/* The daemon's geometry in these tests. */
#define PAGE (64u * 1024)
#define SEG (1u << 20)
#define DEV (16u << 20)
#define NDEV 2u
#define MAX_FRAME 65536u
#define MAX_BATCH 64u
#define BLOCK 16384u
#define PAGES_PER_SEG (SEG / PAGE)

static kvc_block mkblock(uint32_t gen, uint32_t pool, uint32_t page, uint32_t slot)
{
	return (uint64_t)gen << 44 | (uint64_t)pool << 32 | (uint64_t)page << 12 | slot;
}

static int mkseg(void)
{
	int fd = memfd_create("kvseg", MFD_CLOEXEC);

	if (fd < 0 || ftruncate(fd, SEG) < 0) {
		perror("memfd");
		exit(1);
	}
	return fd;
}

/* --- the fake daemon ------------------------------------------------------ */

struct hello_params {
	uint32_t version;
	uint64_t page_bytes;
	uint32_t max_frame;
	int error;              /* nonzero: answer Hello with this error code */
};

static const struct hello_params std_hello = { 1, PAGE, MAX_FRAME, 0 };

struct srv {
	char dir[64];
	char path[96];
	int lfd;
	pthread_t th;
	void (*fn)(int fd, void *arg);
	void *arg;
	struct hello_params hello;
	/* What the client's Hello said. */
	uint64_t hello_id;
	uint32_t hello_min, hello_max;
	char hello_ns[64], hello_name[64];
};

static int read_full(int fd, void *p, size_t n)
{
	while (n > 0) {
		ssize_t r = read(fd, p, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		p = (char *)p + r;
		n -= (size_t)r;
	}
	return 0;
}

/* The next request, or NULL at EOF. */
static Kvcached__Request *srv_recv(int fd)
{
	uint8_t hdr[KV_FRAME_HDR], *buf;
	Kvcached__Request *req;
	uint32_t len;

	if (read_full(fd, hdr, sizeof(hdr)) < 0)
		return NULL;
	if (kv_frame_hdr_decode(hdr, MAX_FRAME, &len) < 0) {
		CHECK(!"bad request frame header");
		return NULL;
	}
	buf = malloc(len ? len : 1);
	if (!buf || read_full(fd, buf, len) < 0) {
		free(buf);
		return NULL;
	}
	req = kvcached__request__unpack(NULL, len, buf);
	CHECK(req);
	/* Byte for byte what protobuf-c packs (the library sends a Lookup's
	 * frame by hand, its hashes from the caller's array). */
	if (req) {
		size_t n = kvcached__request__get_packed_size(req);
		uint8_t *again = malloc(n ? n : 1);

		CHECK(again && n == len && kvcached__request__pack(req, again) == n &&
		      !memcmp(again, buf, n));
		free(again);
	}
	free(buf);
	return req;
}

static Kvcached__Request *srv_expect(int fd, Kvcached__Request__OpCase op)
{
	Kvcached__Request *req = srv_recv(fd);

	CHECK(req && req->op_case == op);
	if (req && req->op_case != op) {
		kvcached__request__free_unpacked(req, NULL);
		return NULL;
	}
	return req;
}

static void send_raw(int fd, const uint8_t *p, size_t n, const int *fds, int nfds)
{
	while (n > 0) {
		struct iovec iov = { .iov_base = (void *)p, .iov_len = n };
		ssize_t r = kv_sendmsg_fds(fd, &iov, 1, fds, nfds, 0);

		if (r <= 0) {
			CHECK(!"fake daemon: send failed");
			return;
		}
		p += r;
		n -= (size_t)r;
		nfds = 0;
	}
}

/* Waits until the client has read all that was sent on fd (SIOCOUTQ: the
 * bytes its socket has not consumed), so that what is sent next reaches it
 * apart; a pause would only make that likely. Gives up after 10 s: a client
 * that stopped reading fails its own checks. */
static void srv_wait_read(int fd)
{
	struct timespec ts = { 0, 50000 }, t0, t;
	int queued;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	do {
		if (ioctl(fd, SIOCOUTQ, &queued) < 0 || queued == 0)
			return;
		nanosleep(&ts, NULL);
		clock_gettime(CLOCK_MONOTONIC, &t);
	} while (t.tv_sec - t0.tv_sec < 10);
}

/* Sends resp; fds ride with the first byte. chunk > 0 sends it in pieces of
 * that size, each once the client has read the one before, so that it reads
 * them apart. */
static void srv_send(int fd, const Kvcached__Response *resp, const int *fds, int nfds,
		     size_t chunk)
{
	size_t len = kvcached__response__get_packed_size(resp), off;
	uint8_t *buf = malloc(KV_FRAME_HDR + len);

	kv_frame_hdr_encode(buf, (uint32_t)len, 0);
	kvcached__response__pack(resp, buf + KV_FRAME_HDR);
	if (!chunk)
		chunk = KV_FRAME_HDR + len;
	for (off = 0; off < KV_FRAME_HDR + len; off += chunk) {
		size_t n = KV_FRAME_HDR + len - off < chunk ? KV_FRAME_HDR + len - off : chunk;

		send_raw(fd, buf + off, n, off ? NULL : fds, off ? 0 : nfds);
		if (chunk < KV_FRAME_HDR + len)
			srv_wait_read(fd);
	}
	free(buf);
}

static void reply_blocks(int fd, uint64_t id, const kvc_block *b, size_t n,
			 Kvcached__Segment **segs, size_t nsegs, const int *fds, int nfds)
{
	Kvcached__Response resp = KVCACHED__RESPONSE__INIT;
	Kvcached__BlockList bl = KVCACHED__BLOCK_LIST__INIT;

	resp.id = id;
	bl.n_blocks = n;
	bl.blocks = (uint64_t *)b;
	resp.result_case = KVCACHED__RESPONSE__RESULT_BLOCKS;
	resp.blocks = &bl;
	resp.n_segments = nsegs;
	resp.segments = segs;
	srv_send(fd, &resp, fds, nfds, 0);
}

static void reply_error(int fd, uint64_t id, Kvcached__ErrorCode code, const char *msg)
{
	Kvcached__Response resp = KVCACHED__RESPONSE__INIT;
	Kvcached__Error err = KVCACHED__ERROR__INIT;

	err.code = code;
	err.message = (char *)msg;
	err.index = -1;
	resp.id = id;
	resp.error = &err;
	srv_send(fd, &resp, NULL, 0, 0);
}

static void *srv_main(void *arg)
{
	struct srv *s = arg;
	Kvcached__Response resp = KVCACHED__RESPONSE__INIT;
	Kvcached__HelloReply hr = KVCACHED__HELLO_REPLY__INIT;
	Kvcached__Request *req;
	int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);

	if (fd < 0) {
		CHECK(!"accept");
		return NULL;
	}
	req = srv_expect(fd, KVCACHED__REQUEST__OP_HELLO);
	if (!req)
		goto out;
	s->hello_id = req->id;
	s->hello_min = req->hello->min_version;
	s->hello_max = req->hello->max_version;
	snprintf(s->hello_ns, sizeof(s->hello_ns), "%s", req->hello->namespace_);
	snprintf(s->hello_name, sizeof(s->hello_name), "%s", req->hello->client_name);
	if (s->hello.error) {
		reply_error(fd, req->id, (Kvcached__ErrorCode)s->hello.error, "go away");
		goto out;
	}
	hr.version = s->hello.version;
	hr.page_bytes = s->hello.page_bytes;
	hr.segment_bytes = SEG;
	hr.device_bytes = DEV;
	hr.devices = NDEV;
	hr.backend = "host";
	hr.max_frame = s->hello.max_frame;
	hr.max_batch = MAX_BATCH;
	hr.session_id = 77;
	resp.id = req->id;
	resp.result_case = KVCACHED__RESPONSE__RESULT_HELLO;
	resp.hello = &hr;
	srv_send(fd, &resp, NULL, 0, 0);
	if (s->fn)
		s->fn(fd, s->arg);
out:
	kvcached__request__free_unpacked(req, NULL);
	close(fd);
	return NULL;
}

static void srv_start(struct srv *s, const struct hello_params *h, void (*fn)(int, void *),
		      void *arg)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	memset(s, 0, sizeof(*s));
	s->hello = *h;
	s->fn = fn;
	s->arg = arg;
	snprintf(s->dir, sizeof(s->dir), "/tmp/kvc-unit-XXXXXX");
	if (!mkdtemp(s->dir)) {
		perror("mkdtemp");
		exit(1);
	}
	snprintf(s->path, sizeof(s->path), "%s/sock", s->dir);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", s->path);
	s->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    listen(s->lfd, 4) < 0 || pthread_create(&s->th, NULL, srv_main, s) != 0) {
		perror("fake daemon");
		exit(1);
	}
}

static void srv_stop(struct srv *s)
{
	pthread_join(s->th, NULL);
	close(s->lfd);
	unlink(s->path);
	rmdir(s->dir);
}

static kvc_conn *connect_to(struct srv *s)
{
	const struct kvc_options opt = { .ns = "tenant", .client_name = "unit" };
	kvc_conn *c = NULL;
	int r = kvc_connect(s->path, &opt, &c);

	CHECK(r == 0 && c);
	if (r < 0) {
		fprintf(stderr, "kvc_connect: %s\n", kvc_strerror(r));
		exit(1);
	}
	return c;
}

/* --- the whole happy path ------------------------------------------------- */

#define PATTERN 0x5c

static void happy_srv(int fd, void *arg)
{
	Kvcached__Response resp = KVCACHED__RESPONSE__INIT;
	Kvcached__RegisterPoolReply rp = KVCACHED__REGISTER_POOL_REPLY__INIT;
	Kvcached__StatsReply st = KVCACHED__STATS_REPLY__INIT;
	Kvcached__Segment seg1 = KVCACHED__SEGMENT__INIT, seg2 = KVCACHED__SEGMENT__INIT;
	Kvcached__Segment *segs1[] = { &seg1 }, *segs2[] = { &seg2 };
	Kvcached__Request *req;
	kvc_block b[4], out[4];
	int fd1 = mkseg(), fd2 = mkseg();
	uint8_t *mem1 = mmap(NULL, SEG, PROT_READ | PROT_WRITE, MAP_SHARED, fd1, 0);
	size_t i;

	(void)arg;
	CHECK(mem1 != MAP_FAILED);
	/* register_pool */
	req = srv_expect(fd, KVCACHED__REQUEST__OP_REGISTER_POOL);
	if (!req)
		goto out;
	CHECK(!strcmp(req->register_pool->name, "llama"));
	CHECK(req->register_pool->device == 1);
	CHECK(req->register_pool->block_bytes == BLOCK);
	CHECK(req->register_pool->block_tokens == 16);
	CHECK(!strcmp(req->register_pool->dtype, "fp16"));
	CHECK(req->register_pool->layout.len == 2 &&
	      !memcmp(req->register_pool->layout.data, "L1", 2));
	rp.pool_id = 5;
	rp.run_bytes = PAGE;
	rp.blocks_per_run = PAGE / BLOCK;
	resp.id = req->id;
	resp.result_case = KVCACHED__RESPONSE__RESULT_REGISTER_POOL;
	resp.register_pool = &rp;
	srv_send(fd, &resp, NULL, 0, 0);
	kvcached__request__free_unpacked(req, NULL);

	/* alloc 3: blocks in segment 1 of device 1, which comes with them */
	req = srv_expect(fd, KVCACHED__REQUEST__OP_ALLOC);
	if (!req)
		goto out;
	CHECK(req->alloc->pool_id == 5 && req->alloc->count == 3);
	for (i = 0; i < 3; i++)
		b[i] = mkblock(1, 5, PAGES_PER_SEG, (uint32_t)i);
	seg1.device = 1;
	seg1.index = 1;
	seg1.offset = SEG;
	seg1.bytes = SEG;
	reply_blocks(fd, req->id, b, 3, segs1, 1, &fd1, 1);
	kvcached__request__free_unpacked(req, NULL);

	/* seal: the client wrote the blocks first; dedup the second */
	req = srv_expect(fd, KVCACHED__REQUEST__OP_SEAL);
	if (!req)
		goto out;
	CHECK(req->seal->pool_id == 5 && req->seal->n_blocks == 3);
	CHECK(req->seal->hashes.len == 3 * 32);
	for (i = 0; i < 3 && req->seal->n_blocks == 3; i++) {
		CHECK(req->seal->blocks[i] == b[i]);
		CHECK(req->seal->hashes.data[32 * i] == i + 1);
	}
	CHECK(mem1[0] == PATTERN && mem1[BLOCK - 1] == PATTERN);
	CHECK(mem1[2 * BLOCK] == PATTERN + 2);
	out[0] = b[0];
	out[1] = mkblock(1, 5, PAGES_PER_SEG + 1, 0);
	out[2] = b[2];
	reply_blocks(fd, req->id, out, 3, NULL, 0, NULL, 0);
	kvcached__request__free_unpacked(req, NULL);

	/* lookup 4 -> 2 */
	req = srv_expect(fd, KVCACHED__REQUEST__OP_LOOKUP);
	if (!req)
		goto out;
	CHECK(req->lookup->pool_id == 5 && req->lookup->hashes.len == 4 * 32);
	reply_blocks(fd, req->id, out, 2, NULL, 0, NULL, 0);
	kvcached__request__free_unpacked(req, NULL);

	/* release: no result at all */
	req = srv_expect(fd, KVCACHED__REQUEST__OP_RELEASE);
	if (!req)
		goto out;
	CHECK(req->release->n_blocks == 2);
	resp = (Kvcached__Response)KVCACHED__RESPONSE__INIT;
	resp.id = req->id;
	srv_send(fd, &resp, NULL, 0, 0);
	kvcached__request__free_unpacked(req, NULL);

	/* fork: the fd of the next reply's segment rides with this reply's
	 * tail, as the kernel may deliver it */
	req = srv_expect(fd, KVCACHED__REQUEST__OP_FORK);
	if (!req)
		goto out;
	CHECK(req->fork->n_blocks == 2);
	{
		Kvcached__BlockList bl = KVCACHED__BLOCK_LIST__INIT;
		size_t len;
		uint8_t *buf;

		resp = (Kvcached__Response)KVCACHED__RESPONSE__INIT;
		resp.id = req->id;
		bl.n_blocks = req->fork->n_blocks;
		bl.blocks = req->fork->blocks;
		resp.result_case = KVCACHED__RESPONSE__RESULT_BLOCKS;
		resp.blocks = &bl;
		len = kvcached__response__get_packed_size(&resp);
		buf = malloc(KV_FRAME_HDR + len);
		kv_frame_hdr_encode(buf, (uint32_t)len, 0);
		kvcached__response__pack(&resp, buf + KV_FRAME_HDR);
		send_raw(fd, buf, KV_FRAME_HDR + len - 3, NULL, 0);
		srv_wait_read(fd);
		send_raw(fd, buf + KV_FRAME_HDR + len - 3, 3, &fd2, 1);
		free(buf);
	}
	kvcached__request__free_unpacked(req, NULL);

	/* cow: new blocks in segment 2 of device 1, its fd already sent; the
	 * frame goes out a byte at a time */
	req = srv_expect(fd, KVCACHED__REQUEST__OP_COW);
	if (!req)
		goto out;
	CHECK(req->cow->n_blocks == 1);
	b[3] = mkblock(2, 5, 2 * PAGES_PER_SEG + 3, 1);
	seg2.device = 1;
	seg2.index = 2;
	seg2.offset = 2ull * SEG;
	seg2.bytes = SEG;
	{
		Kvcached__BlockList bl = KVCACHED__BLOCK_LIST__INIT;

		resp = (Kvcached__Response)KVCACHED__RESPONSE__INIT;
		resp.id = req->id;
		bl.n_blocks = 1;
		bl.blocks = &b[3];
		resp.result_case = KVCACHED__RESPONSE__RESULT_BLOCKS;
		resp.blocks = &bl;
		resp.n_segments = 1;
		resp.segments = segs2;
		srv_send(fd, &resp, NULL, 0, 1);
	}
	kvcached__request__free_unpacked(req, NULL);

	/* stats through kvc_call */
	req = srv_expect(fd, KVCACHED__REQUEST__OP_STATS);
	if (!req)
		goto out;
	st.version = "9.9";
	st.backend = "host";
	st.pages_total = 512;
	resp = (Kvcached__Response)KVCACHED__RESPONSE__INIT;
	resp.id = req->id;
	resp.result_case = KVCACHED__RESPONSE__RESULT_STATS;
	resp.stats = &st;
	srv_send(fd, &resp, NULL, 0, 0);
	kvcached__request__free_unpacked(req, NULL);

	CHECK(srv_recv(fd) == NULL);
out:
	if (mem1 != MAP_FAILED)
		munmap(mem1, SEG);
	close(fd1);
	close(fd2);
}

static void test_happy(void)
{
	static const struct kvc_pool_desc desc = {
		.name = "llama", .device = 1, .block_bytes = BLOCK, .block_tokens = 16,
		.dtype = "fp16", .layout = "L1", .layout_len = 2,
	};
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Stats stats = KVCACHED__STATS__INIT;
	Kvcached__Response *resp = NULL;
	const struct kvc_hello *h;
	kvc_hash hashes[4];
	kvc_block b[4], f[2], cw[1];
	struct srv s;
	kvc_conn *c;
	uint8_t *p;
	int i, pool;

	srv_start(&s, &std_hello, happy_srv, NULL);
	c = connect_to(&s);
	h = kvc_conn_hello(c);
	CHECK(h->version == 1 && h->page_bytes == PAGE && h->segment_bytes == SEG);
	CHECK(h->device_bytes == DEV && h->devices == NDEV && h->max_frame == MAX_FRAME);
	CHECK(h->max_batch == MAX_BATCH && h->session_id == 77 && !strcmp(h->backend, "host"));
	CHECK(kvc_conn_fd(c) >= 0 && !kvc_conn_broken(c));

	pool = kvc_register_pool(c, &desc);
	CHECK(pool == 5);
	CHECK(kvc_pool_block_bytes(c, 5) == BLOCK);
	CHECK(kvc_pool_block_bytes(c, 4) == 0 && kvc_pool_block_bytes(c, -1) == 0);
	CHECK(kvc_block_ptr(c, mkblock(1, 5, PAGES_PER_SEG, 0)) == NULL); /* not mapped yet */

	CHECK(kvc_alloc(c, pool, 3, b) == 3);
	CHECK(kvc_conn_segment_mapped(c, 1, 1) && !kvc_conn_segment_mapped(c, 1, 0));
	CHECK(!kvc_conn_segment_mapped(c, 0, 1));
	for (i = 0; i < 3; i++) {
		p = kvc_block_ptr(c, b[i]);
		CHECK(p != NULL);
		if (!p)
			continue;
		CHECK(p == (uint8_t *)kvc_block_ptr(c, b[0]) + (size_t)i * BLOCK);
		memset(p, PATTERN + i, BLOCK);
	}
	/* Same page and slot under another pool or an unmapped segment: NULL. */
	CHECK(kvc_block_ptr(c, mkblock(1, 4, PAGES_PER_SEG, 0)) == NULL);
	CHECK(kvc_block_ptr(c, mkblock(1, 5, 0, 0)) == NULL);
	CHECK(kvc_block_ptr(NULL, b[0]) == NULL);
	/* The block at the end of the device range must not run past it. */
	CHECK(kvc_block_ptr(c, mkblock(1, 5, DEV / PAGE - 1, PAGE / BLOCK)) == NULL);

	memset(hashes, 0, sizeof(hashes));
	for (i = 0; i < 4; i++)
		hashes[i].b[0] = (uint8_t)(i + 1);
	/* out aliases blocks */
	CHECK(kvc_seal(c, pool, b, hashes, 3, b) == 3);
	CHECK(b[1] == mkblock(1, 5, PAGES_PER_SEG + 1, 0));
	CHECK(kvc_block_ptr(c, b[1]) == (uint8_t *)kvc_block_ptr(c, b[0]) + PAGE);

	memset(f, 0xee, sizeof(f));
	CHECK(kvc_lookup(c, pool, hashes, 4, f) == 2);
	CHECK(f[0] == b[0] && f[1] == b[1]);
	CHECK(kvc_release(c, f, 2) == 0);
	CHECK(kvc_fork(c, b, 2, f) == 2);
	CHECK(f[0] == b[0] && f[1] == b[1]);
	CHECK(kvc_cow(c, &b[2], 1, cw) == 1);
	CHECK(cw[0] == mkblock(2, 5, 2 * PAGES_PER_SEG + 3, 1));
	CHECK(kvc_conn_segment_mapped(c, 1, 2));
	p = kvc_block_ptr(c, cw[0]);
	CHECK(p == (uint8_t *)kvc_block_ptr(c, b[0]) + (PAGES_PER_SEG + 3) * PAGE + BLOCK);
	if (p)
		p[0] = 1;  /* writable */

	req.op_case = KVCACHED__REQUEST__OP_STATS;
	req.stats = &stats;
	CHECK(kvc_call(c, &req, &resp) == 0);
	CHECK(resp && resp->result_case == KVCACHED__RESPONSE__RESULT_STATS);
	if (resp) {
		CHECK(!strcmp(resp->stats->version, "9.9") && resp->stats->pages_total == 512);
		kvcached__response__free_unpacked(resp, NULL);
	}
	CHECK(!strcmp(kvc_last_error(c), ""));
	CHECK(!kvc_conn_broken(c));
	kvc_close(c);
	srv_stop(&s);
}

/* --- daemon errors, local limits, then a violation ------------------------ */

static void errors_srv(int fd, void *arg)
{
	Kvcached__Request *req;
	kvc_block b[2] = { mkblock(1, 5, 0, 0), mkblock(1, 5, 0, 1) };

	(void)arg;
	req = srv_expect(fd, KVCACHED__REQUEST__OP_ALLOC);
	if (!req)
		return;
	reply_error(fd, req->id, KVCACHED__ERROR_CODE__ENOSPC, "pool 5 full: 0 free, 12 held");
	kvcached__request__free_unpacked(req, NULL);

	/* A good one: the connection survived. */
	req = srv_expect(fd, KVCACHED__REQUEST__OP_ALLOC);
	if (!req)
		return;
	reply_blocks(fd, req->id, b, 2, NULL, 0, NULL, 0);
	kvcached__request__free_unpacked(req, NULL);

	/* Wrong count: the client must break the connection. */
	req = srv_expect(fd, KVCACHED__REQUEST__OP_ALLOC);
	if (!req)
		return;
	reply_blocks(fd, req->id, b, 1, NULL, 0, NULL, 0);
	kvcached__request__free_unpacked(req, NULL);

	/* ... and send nothing more: we see EOF (shutdown). */
	req = srv_recv(fd);
	CHECK(req == NULL);
	kvcached__request__free_unpacked(req, NULL);
}

static void test_errors(void)
{
	kvc_block b[MAX_BATCH + 1], before[MAX_BATCH + 1];
	kvc_hash h[MAX_BATCH + 1];
	struct srv s;
	kvc_conn *c;

	memset(b, 0x11, sizeof(b));
	memcpy(before, b, sizeof(b));
	memset(h, 0, sizeof(h));
	srv_start(&s, &std_hello, errors_srv, NULL);
	c = connect_to(&s);

	/* Local checks: no traffic. */
	CHECK(kvc_alloc(c, 5, 0, b) == KVC_EINVAL);
	CHECK(kvc_alloc(c, 5, MAX_BATCH + 1, b) == KVC_E2BIG);
	CHECK(kvc_alloc(c, -1, 1, b) == KVC_ENOENT);
	CHECK(kvc_alloc(c, 4096, 1, b) == KVC_ENOENT);
	CHECK(kvc_seal(c, 5, b, h, MAX_BATCH + 1, b) == KVC_E2BIG);
	CHECK(kvc_lookup(c, 5, h, MAX_BATCH + 1, b) == KVC_E2BIG);
	CHECK(kvc_release(c, b, MAX_BATCH + 1) == KVC_E2BIG);
	CHECK(kvc_fork(c, b, MAX_BATCH + 1, b) == KVC_E2BIG);
	CHECK(kvc_cow(c, b, MAX_BATCH + 1, b) == KVC_E2BIG);
	CHECK(kvc_release(c, b, 0) == 0);
	CHECK(kvc_lookup(c, 5, h, 0, b) == 0);
	CHECK(kvc_register_pool(c, NULL) == KVC_EINVAL);
	CHECK(!memcmp(b, before, sizeof(b)));

	/* A daemon error: code, message, outputs untouched, still usable. */
	CHECK(kvc_alloc(c, 5, 2, b) == KVC_ENOSPC);
	CHECK(!strcmp(kvc_last_error(c), "pool 5 full: 0 free, 12 held"));
	CHECK(!memcmp(b, before, sizeof(b)));
	CHECK(!kvc_conn_broken(c));
	CHECK(kvc_alloc(c, 5, 2, b) == 2);
	CHECK(b[1] == mkblock(1, 5, 0, 1));
	CHECK(!strcmp(kvc_last_error(c), ""));

	memcpy(before, b, sizeof(b));
	CHECK(kvc_alloc(c, 5, 2, b) == -EPROTO);
	CHECK(!memcmp(b, before, sizeof(b)));
	CHECK(kvc_conn_broken(c));
	CHECK(*kvc_last_error(c) != '\0');
	CHECK(kvc_alloc(c, 5, 2, b) == -EPIPE);
	CHECK(kvc_release(c, b, 1) == -EPIPE);
	kvc_close(c);
	srv_stop(&s);
}

/* --- protocol violations, one connection each ----------------------------- */

enum violation { V_WRONG_ID, V_OVERSIZE, V_MISSING_FD, V_BAD_SEGMENT, V_DAEMON_EPROTO,
		 V_BAD_FLAGS, V_GARBAGE, V_EOF, V_WRONG_POOL, V_FORK_OTHER,
		 /* Replies of blocks in the form the library reads in place
		  * (blocks.c take_fast(), issue 38), each wrong in one way its
		  * checks must see: a lookup (of one hash, with tiers asked),
		  * an alloc of one, a release. */
		 V_LOOKUP_MORE, V_LOOKUP_WRONG_ID, V_LOOKUP_WRONG_POOL, V_LOOKUP_TIERS_SHORT,
		 V_LOOKUP_TIER_VALUE, V_ALLOC_FEWER, V_ALLOC_TIERS, V_ALLOC_NOTHING, V_RELEASE_BLOCKS,
		 /* the same, through kvc_lookup_many() (one chain of one) */
		 V_MANY_MORE, V_MANY_WRONG_POOL };

/* A reply of n blocks with n tiers (tiers != NULL) or none. */
static void reply_tiers(int fd, uint64_t id, const kvc_block *b, size_t n,
			const Kvcached__Tier *tiers, size_t ntiers)
{
	Kvcached__Response resp = KVCACHED__RESPONSE__INIT;
	Kvcached__BlockList bl = KVCACHED__BLOCK_LIST__INIT;

	resp.id = id;
	bl.n_blocks = n;
	bl.blocks = (uint64_t *)b;
	bl.n_tiers = ntiers;
	bl.tiers = (Kvcached__Tier *)tiers;
	resp.result_case = KVCACHED__RESPONSE__RESULT_BLOCKS;
	resp.blocks = &bl;
	srv_send(fd, &resp, NULL, 0, 0);
}

static void violation_srv(int fd, void *arg)
{
	enum violation v = *(enum violation *)arg;
	Kvcached__Segment seg = KVCACHED__SEGMENT__INIT, *segs[] = { &seg };
	Kvcached__Request *req = srv_recv(fd);
	kvc_block b[1] = { mkblock(1, 5, 0, 0) }, two[2] = { mkblock(1, 5, 0, 0), mkblock(1, 5, 0, 1) };
	const Kvcached__Tier t1[2] = { KVCACHED__TIER__TIER_G2, KVCACHED__TIER__TIER_G1 };
	const Kvcached__Tier bad_tier[1] = { (Kvcached__Tier)(KVC_TIER_G4 + 1) };
	uint8_t hdr[KV_FRAME_HDR];
	int sfd;

	if (!req)
		return;
	switch (v) {
	case V_WRONG_ID:
		reply_blocks(fd, req->id + 1, b, 1, NULL, 0, NULL, 0);
		break;
	case V_OVERSIZE:
		kv_frame_hdr_encode(hdr, MAX_FRAME + 1, 0);
		send_raw(fd, hdr, sizeof(hdr), NULL, 0);
		break;
	case V_MISSING_FD:
		seg.device = 0;
		seg.index = 0;
		seg.bytes = SEG;
		reply_blocks(fd, req->id, b, 1, segs, 1, NULL, 0);
		break;
	case V_BAD_SEGMENT:
		sfd = mkseg();
		seg.device = 0;
		seg.index = 1;
		seg.offset = 0;  /* should be SEG */
		seg.bytes = SEG;
		reply_blocks(fd, req->id, b, 1, segs, 1, &sfd, 1);
		close(sfd);
		break;
	case V_DAEMON_EPROTO:
		reply_error(fd, req->id, KVCACHED__ERROR_CODE__EPROTO, "bad frame");
		break;
	case V_BAD_FLAGS:
		kv_frame_hdr_encode(hdr, 0, 1);
		send_raw(fd, hdr, sizeof(hdr), NULL, 0);
		break;
	case V_GARBAGE:
		kv_frame_hdr_encode(hdr, 3, 0);
		send_raw(fd, hdr, sizeof(hdr), NULL, 0);
		send_raw(fd, (const uint8_t *)"\xff\xff\xff", 3, NULL, 0);
		break;
	case V_EOF:
		break;
	case V_WRONG_POOL:
		b[0] = mkblock(1, 6, 0, 0);
		reply_blocks(fd, req->id, b, 1, NULL, 0, NULL, 0);
		break;
	case V_FORK_OTHER:
		b[0] = mkblock(2, 5, 0, 0);
		reply_blocks(fd, req->id, b, 1, NULL, 0, NULL, 0);
		break;
	case V_LOOKUP_MORE:
		reply_tiers(fd, req->id, two, 2, t1, 2);
		break;
	case V_LOOKUP_WRONG_ID:
		reply_tiers(fd, req->id + 1, b, 1, t1, 1);
		break;
	case V_LOOKUP_WRONG_POOL:
		b[0] = mkblock(1, 6, 0, 0);
		reply_tiers(fd, req->id, b, 1, t1, 1);
		break;
	case V_LOOKUP_TIERS_SHORT:   /* one block, two tiers */
		reply_tiers(fd, req->id, b, 1, t1, 2);
		break;
	case V_LOOKUP_TIER_VALUE:
		reply_tiers(fd, req->id, b, 1, bad_tier, 1);
		break;
	case V_ALLOC_FEWER:
		reply_tiers(fd, req->id, NULL, 0, NULL, 0);
		break;
	case V_ALLOC_TIERS:
		reply_tiers(fd, req->id, b, 1, t1, 1);
		break;
	case V_ALLOC_NOTHING: {   /* the id alone, as a Release is answered */
		Kvcached__Response resp = KVCACHED__RESPONSE__INIT;

		resp.id = req->id;
		srv_send(fd, &resp, NULL, 0, 0);
		break;
	}
	case V_RELEASE_BLOCKS:
		reply_tiers(fd, req->id, b, 1, NULL, 0);
		break;
	case V_MANY_MORE:
		reply_tiers(fd, req->id, two, 2, NULL, 0);
		break;
	case V_MANY_WRONG_POOL:
		b[0] = mkblock(1, 6, 0, 0);
		reply_tiers(fd, req->id, b, 1, NULL, 0);
		break;
	}
	kvcached__request__free_unpacked(req, NULL);
	if (v != V_EOF) {
		req = srv_recv(fd);
		CHECK(req == NULL);
		kvcached__request__free_unpacked(req, NULL);
	}
}

static void test_violation(enum violation v, int want)
{
	kvc_block b[1] = { 42 }, in[1] = { mkblock(1, 5, 0, 0) };
	kvc_hash h[1] = { { { 7 } } };
	uint8_t tiers[1] = { 42 };
	size_t one = 1;
	int found = 42;
	struct srv s;
	kvc_conn *c;
	int r;

	srv_start(&s, &std_hello, violation_srv, &v);
	c = connect_to(&s);
	if (v == V_FORK_OTHER)
		r = kvc_fork(c, in, 1, b);
	else if (v >= V_LOOKUP_MORE && v <= V_LOOKUP_TIER_VALUE)
		r = kvc_lookup_tiers(c, 5, h, 1, b, tiers);
	else if (v == V_RELEASE_BLOCKS)
		r = kvc_release(c, in, 1);
	else if (v >= V_MANY_MORE)
		r = kvc_lookup_many(c, 5, h, &one, 1, b, NULL, &found);
	else
		r = kvc_alloc(c, 5, 1, b);
	if (r != want)
		fprintf(stderr, "violation %d: got %d (%s), want %d\n", v, r, kvc_strerror(r),
			want);
	CHECK(r == want);
	CHECK(b[0] == 42);
	CHECK(tiers[0] == 42);
	CHECK(found == 42);
	CHECK(kvc_conn_broken(c));
	CHECK(kvc_alloc(c, 5, 1, b) == -EPIPE);
	kvc_close(c);
	srv_stop(&s);
}

/* A lookup of MAX_BATCH hashes answered, in the form read in place, with as
 * many blocks of its pool but one, at, whose pool differs in one bit of the
 * field (at MAX_BATCH: none): the pool check runs on more handles than one
 * (kvc_blocks_of_pool(), its vectors and its tail). */
struct long_pool {
	size_t at;
	uint32_t bit;
};

static kvc_block long_pool_block(const struct long_pool *p, size_t i)
{
	return mkblock((uint32_t)i + 1, i == p->at ? 5 ^ p->bit : 5, (uint32_t)i, (uint32_t)i);
}

static void long_pool_srv(int fd, void *arg)
{
	const struct long_pool *p = arg;
	Kvcached__Request *req = srv_recv(fd);
	kvc_block b[MAX_BATCH];

	if (!req)
		return;
	for (size_t i = 0; i < MAX_BATCH; i++)
		b[i] = long_pool_block(p, i);
	reply_tiers(fd, req->id, b, MAX_BATCH, NULL, 0);
	kvcached__request__free_unpacked(req, NULL);
	req = srv_recv(fd);   /* the close, or the break */
	CHECK(req == NULL);
	kvcached__request__free_unpacked(req, NULL);
}

static void test_long_pool(void)
{
	static const struct long_pool cases[] = {
		{ MAX_BATCH, 0 }, { 0, 1 }, { 37, 0x800 }, { 31, 1 }, { 62, 0x800 },
		{ MAX_BATCH - 1, 1 },
	};

	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		const struct long_pool *p = &cases[k];
		kvc_hash h[MAX_BATCH] = { { { 0 } } };
		kvc_block b[MAX_BATCH];
		struct srv s;
		kvc_conn *c;
		size_t i;
		int r;

		for (i = 0; i < MAX_BATCH; i++)
			b[i] = 42;
		srv_start(&s, &std_hello, long_pool_srv, (void *)p);
		c = connect_to(&s);
		r = kvc_lookup(c, 5, h, MAX_BATCH, b);
		if (p->at == MAX_BATCH) {
			CHECK(r == (int)MAX_BATCH);
			for (i = 0; i < MAX_BATCH; i++)
				CHECK(b[i] == long_pool_block(p, i));
			CHECK(!kvc_conn_broken(c));
		} else {
			if (r != -EPROTO)
				fprintf(stderr, "long pool case %zu: got %d, want -EPROTO\n", k, r);
			CHECK(r == -EPROTO);
			for (i = 0; i < MAX_BATCH; i++)
				CHECK(b[i] == 42);
			CHECK(kvc_conn_broken(c));
		}
		kvc_close(c);
		srv_stop(&s);
	}
}

/* --- Hello ----------------------------------------------------------------- */

static void test_hello(void)
{
	struct hello_params h = std_hello;
	struct srv s;
	kvc_conn *c = NULL;

	/* What the client says, with options and without. */
	srv_start(&s, &std_hello, NULL, NULL);
	c = connect_to(&s);
	kvc_close(c);
	srv_stop(&s);
	CHECK(s.hello_id == 1 && s.hello_min == 1 && s.hello_max == 1);
	CHECK(!strcmp(s.hello_ns, "tenant") && !strcmp(s.hello_name, "unit"));

	srv_start(&s, &std_hello, NULL, NULL);
	c = NULL;
	CHECK(kvc_connect(s.path, NULL, &c) == 0);
	kvc_close(c);
	srv_stop(&s);
	CHECK(!strcmp(s.hello_ns, "") && !strcmp(s.hello_name, program_invocation_short_name));

	/* Refused: the daemon's code, *out untouched. */
	h.error = KVCACHED__ERROR_CODE__EVERSION;
	srv_start(&s, &h, NULL, NULL);
	c = (kvc_conn *)0x1;
	CHECK(kvc_connect(s.path, NULL, &c) == KVC_EVERSION);
	CHECK(c == (kvc_conn *)0x1);
	srv_stop(&s);

	/* Nonsense geometry or version. */
	h = std_hello;
	h.page_bytes = 3000;
	srv_start(&s, &h, NULL, NULL);
	CHECK(kvc_connect(s.path, NULL, &c) == -EPROTO);
	srv_stop(&s);
	h = std_hello;
	h.version = 2;
	srv_start(&s, &h, NULL, NULL);
	CHECK(kvc_connect(s.path, NULL, &c) == -EPROTO);
	srv_stop(&s);

	CHECK(kvc_connect("/nonexistent/kvcached.sock", NULL, &c) == -ENOENT);
	CHECK(c == (kvc_conn *)0x1);
}

/* --- a request over max_frame is refused locally --------------------------- */

static void small_frame_srv(int fd, void *arg)
{
	Kvcached__Request *req = srv_expect(fd, KVCACHED__REQUEST__OP_LOOKUP);

	(void)arg;
	if (!req)
		return;
	CHECK(req->lookup->hashes.len == 32);
	reply_blocks(fd, req->id, NULL, 0, NULL, 0, NULL, 0);
	kvcached__request__free_unpacked(req, NULL);
}

static void test_max_frame(void)
{
	struct hello_params h = std_hello;
	kvc_hash hashes[20];
	kvc_block b[20];
	struct srv s;
	kvc_conn *c;

	memset(hashes, 7, sizeof(hashes));
	h.max_frame = 256;
	srv_start(&s, &h, small_frame_srv, NULL);
	c = connect_to(&s);
	CHECK(kvc_lookup(c, 5, hashes, 20, b) == KVC_E2BIG);
	CHECK(!kvc_conn_broken(c));
	CHECK(kvc_lookup(c, 5, hashes, 1, b) == 0);
	kvc_close(c);
	srv_stop(&s);
}

/* --- threads --------------------------------------------------------------- */

#define THREADS 4
#define ROUNDS 200

/* Answers every alloc with blocks numbered by request id, so that a reply
 * delivered to the wrong caller shows. Registers pools as asked. */
static void echo_srv(int fd, void *arg)
{
	Kvcached__Request *req;

	(void)arg;
	while ((req = srv_recv(fd))) {
		if (req->op_case == KVCACHED__REQUEST__OP_ALLOC) {
			kvc_block b[MAX_BATCH];
			uint32_t i;

			for (i = 0; i < req->alloc->count && i < MAX_BATCH; i++)
				b[i] = mkblock((uint32_t)req->id & 0xfffff, req->alloc->pool_id,
					       i, 0);
			reply_blocks(fd, req->id, b, req->alloc->count, NULL, 0, NULL, 0);
		} else if (req->op_case == KVCACHED__REQUEST__OP_REGISTER_POOL) {
			Kvcached__Response resp = KVCACHED__RESPONSE__INIT;
			Kvcached__RegisterPoolReply rp = KVCACHED__REGISTER_POOL_REPLY__INIT;

			rp.pool_id = req->register_pool->block_tokens;  /* test's choice */
			resp.id = req->id;
			resp.result_case = KVCACHED__RESPONSE__RESULT_REGISTER_POOL;
			resp.register_pool = &rp;
			srv_send(fd, &resp, NULL, 0, 0);
		} else {
			CHECK(!"unexpected op");
		}
		kvcached__request__free_unpacked(req, NULL);
	}
}

struct worker {
	kvc_conn *c;
	int idx;
	pthread_t th;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	uint64_t last = 0;
	int i;

	for (i = 0; i < ROUNDS; i++) {
		uint32_t n = (uint32_t)(i % 7) + 1, k;
		kvc_block b[8];
		int r = kvc_alloc(w->c, w->idx + 1, n, b);

		CHECK(r == (int)n);
		if (r != (int)n)
			break;
		for (k = 0; k < n; k++)
			CHECK(KVC_BLOCK_POOL(b[k]) == (uint32_t)w->idx + 1 &&
			      KVC_BLOCK_PAGE(b[k]) == k && (b[k] >> 44) == (b[0] >> 44));
		/* Ids grow per connection: each thread sees its own grow too. */
		CHECK((b[0] >> 44) > last);
		last = b[0] >> 44;
	}
	return NULL;
}

static atomic_bool stop_readers;

static void *reader_main(void *arg)
{
	kvc_conn *c = arg;
	uint32_t pool = 0;

	/* kvc_block_ptr never locks and never sees a half-registered pool:
	 * nothing is mapped here, so everything is NULL, and TSan (if used)
	 * sees only atomics. */
	while (!atomic_load(&stop_readers)) {
		CHECK(kvc_block_ptr(c, mkblock(1, pool, 0, 0)) == NULL);
		(void)kvc_pool_block_bytes(c, (int)pool);
		pool = (pool + 1) % 64;
	}
	return NULL;
}

static void test_threads(void)
{
	struct worker w[THREADS];
	pthread_t reader;
	struct srv s;
	kvc_conn *c;
	int i;

	srv_start(&s, &std_hello, echo_srv, NULL);
	c = connect_to(&s);
	atomic_store(&stop_readers, false);
	pthread_create(&reader, NULL, reader_main, c);
	for (i = 0; i < 64; i++) {
		struct kvc_pool_desc d = { .name = "p", .device = 0, .block_bytes = BLOCK,
					   .block_tokens = (uint32_t)i };

		CHECK(kvc_register_pool(c, &d) == i);
	}
	for (i = 0; i < THREADS; i++) {
		w[i].c = c;
		w[i].idx = i;
		pthread_create(&w[i].th, NULL, worker_main, &w[i]);
	}
	for (i = 0; i < THREADS; i++)
		pthread_join(w[i].th, NULL);
	atomic_store(&stop_readers, true);
	pthread_join(reader, NULL);
	for (i = 0; i < 64; i++)
		CHECK(kvc_pool_block_bytes(c, i) == BLOCK);
	kvc_close(c);
	srv_stop(&s);
}

/* --- pure functions -------------------------------------------------------- */

static void test_strerror(void)
{
	int codes[] = { KVC_EINVAL, KVC_ENOSPC, KVC_ENOENT, KVC_ESTALE, KVC_EPERM, KVC_EPROTO,
			KVC_EVERSION, KVC_EEXIST, KVC_E2BIG, KVC_EINTERNAL, KVC_ESTATE,
			KVC_ESHUTDOWN, KVC_EIO };
	size_t i, j, n = sizeof(codes) / sizeof(codes[0]);

	for (i = 0; i < n; i++) {
		const char *s = kvc_strerror(codes[i]);

		CHECK(s && *s && strcmp(s, "unknown daemon error") != 0);
		for (j = 0; j < i; j++)
			CHECK(strcmp(s, kvc_strerror(codes[j])) != 0);
		CHECK(codes[i] == -(KVC_ERR_BASE + (int)i + 1));
	}
	/* 14..15 are the tiers'. */
	CHECK(KVC_ECONFIG == -(KVC_ERR_BASE + 16));
	CHECK(strcmp(kvc_strerror(KVC_ECONFIG), "unknown daemon error") != 0);
	CHECK(KVC_EACCES == -(KVC_ERR_BASE + 17) && KVC_EQUOTA == -(KVC_ERR_BASE + 18) &&
	      KVC_EAGAIN == -(KVC_ERR_BASE + 19));
	CHECK(strcmp(kvc_strerror(KVC_EACCES), kvc_strerror(KVC_EQUOTA)) != 0);
	CHECK(strcmp(kvc_strerror(KVC_EAGAIN), "unknown daemon error") != 0);
	CHECK(!strcmp(kvc_strerror(-ENOENT), "No such file or directory"));
	CHECK(!strcmp(kvc_strerror(-1099), "unknown daemon error"));
	CHECK(kvc_strerror(-99999) != NULL && kvc_strerror(0) != NULL);
	CHECK(!strcmp(kvc_last_error(NULL), ""));
	kvc_close(NULL);
}

static void test_default_socket(void)
{
	char buf[256], tiny[8];

	setenv("KVCACHED_SOCKET", "/x/y.sock", 1);
	CHECK(kvc_default_socket(buf, sizeof(buf)) == 0 && !strcmp(buf, "/x/y.sock"));
	CHECK(kvc_default_socket(tiny, sizeof(tiny)) == -ENAMETOOLONG);
	unsetenv("KVCACHED_SOCKET");
	setenv("XDG_RUNTIME_DIR", "/run/user/1000", 1);
	CHECK(kvc_default_socket(buf, sizeof(buf)) == 0);
	if (geteuid() == 0)
		CHECK(!strcmp(buf, "/run/kvcached/kvcached.sock"));
	else
		CHECK(!strcmp(buf, "/run/user/1000/kvcached.sock"));
	unsetenv("XDG_RUNTIME_DIR");
	CHECK(kvc_default_socket(buf, sizeof(buf)) == 0 &&
	      !strcmp(buf, "/run/kvcached/kvcached.sock"));
}

int main(void)
{
	/* The fake daemon serves one connection: a broken one must stay
	 * broken here (reconnection is tested against the real daemon, in
	 * test_restart.c). */
	setenv("KVCACHE_RECONNECT", "0", 1);
	test_strerror();
	test_default_socket();
	test_hello();
	test_happy();
	test_errors();
	test_violation(V_WRONG_ID, -EPROTO);
	test_violation(V_OVERSIZE, -EPROTO);
	test_violation(V_MISSING_FD, -EPROTO);
	test_violation(V_BAD_SEGMENT, -EPROTO);
	test_violation(V_DAEMON_EPROTO, KVC_EPROTO);
	test_violation(V_BAD_FLAGS, -EPROTO);
	test_violation(V_GARBAGE, -EPROTO);
	test_violation(V_EOF, -ECONNRESET);
	test_violation(V_WRONG_POOL, -EPROTO);
	test_violation(V_FORK_OTHER, -EPROTO);
	for (enum violation v = V_LOOKUP_MORE; v <= V_MANY_WRONG_POOL; v++)
		test_violation(v, -EPROTO);
	test_long_pool();
	test_max_frame();
	test_threads();
	if (failures) {
		fprintf(stderr, "test_client_unit: %d checks failed\n", atomic_load(&failures));
		return 1;
	}
	printf("test_client_unit: ok\n");
	return 0;
}
