/* Hostile local clients (issue 10): every byte, length, count and fd a client
 * sends is the client's to get wrong, and a bad client may only close its own
 * connection. Each case runs a real daemon with its limits shrunk, a
 * well-behaved bystander (libkvcache), and a hostile peer on a raw socket
 * that speaks the protocol by hand (frames from proto/frame.h), then checks
 * that the daemon is alive, its invariant check is clean and a fresh client
 * works.
 *
 *   seal     ftruncate() on a segment fd the daemon sent fails (EPERM); a
 *            copy-on-write from that segment afterwards is intact
 *   refs     a block's references stop at max_block_refs: a fork, lookup or
 *            seal past it is refused whole (EQUOTA) and changes nothing
 *   conns    connections past max_connections_per_uid and max_connections
 *            are refused (an EAGAIN reply, then closed); the admin socket
 *            still works, so do the clients already in
 *   partial  frames announced as 4 MiB and never finished cost the bytes
 *            that arrived (RSS), and are closed after frame_timeout; an
 *            idle connection is not
 *   output   a client that pipelines and never reads is held to
 *            max_output_per_connection (RSS), others carry on
 *   fds      a client that looks up segment after segment and never reads
 *            is held at max_fds_per_connection, another is served; with
 *            max_fds_in_flight full, or the daemon's fd table, a request
 *            gets EAGAIN, not a closed session, and succeeds later
 *   fds_uid  a uid whose connections hold segment fds unread is refused more
 *            past max_fds_per_uid (EAGAIN naming it, to that client only,
 *            its sessions intact); another uid (a process of its own when
 *            run as root) is served meanwhile
 *
 * Waits are for conditions (a reply, EOF, a count) under a guard, never for
 * a fixed time. One file past 1,200 lines: the cases share the raw peer,
 * the shrunk daemon and the bystander defined at the top. */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "harness.h"
#include "kvsan.h"

#define BLOCK 8192u

/* ---- a raw peer ---------------------------------------------------------- */

struct raw {
	int fd;
	uint64_t id;                /* of the last request sent */
	int fds[1024];              /* fds received and not taken yet */
	int nfds;
};

static int raw_connect_path(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	CHECK(fd >= 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	CHECK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	return fd;
}

static void raw_open(struct raw *r)
{
	memset(r, 0, sizeof(*r));
	r->fd = raw_connect_path(getenv("KVCACHED_SOCKET"));
}

static void raw_close(struct raw *r)
{
	while (r->nfds > 0)
		close(r->fds[--r->nfds]);
	if (r->fd >= 0)
		close(r->fd);
	r->fd = -1;
}

static void send_all(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;

	while (n) {
		ssize_t k = send(fd, b, n, MSG_NOSIGNAL);

		CHECK(k > 0);
		b += k;
		n -= (size_t)k;
	}
}

/* Packs rq (id set here) into a frame in *buf (malloc'd). Returns its size. */
static size_t pack(struct raw *r, Kvcached__Request *rq, uint8_t **buf)
{
	size_t len;

	rq->id = ++r->id;
	len = kvcached__request__get_packed_size(rq);
	*buf = malloc(KV_FRAME_HDR + len);
	CHECK(*buf != NULL);
	kv_frame_hdr_encode(*buf, (uint32_t)len, 0);
	kvcached__request__pack(rq, *buf + KV_FRAME_HDR);
	return KV_FRAME_HDR + len;
}

static void raw_send(struct raw *r, Kvcached__Request *rq)
{
	uint8_t *buf;
	size_t n = pack(r, rq, &buf);

	send_all(r->fd, buf, n);
	free(buf);
}

/* Reads exactly n bytes, keeping the fds that come with them. Returns 0, or
 * -1 at EOF before the first byte (EOF later fails the test). */
static int raw_read(struct raw *r, void *p, size_t n)
{
	size_t got = 0;

	while (got < n) {
		int trunc = 0;
		ssize_t k = kv_recvmsg_fds(r->fd, (uint8_t *)p + got, n - got, r->fds, &r->nfds,
					   (int)(sizeof(r->fds) / sizeof(r->fds[0])), 0, &trunc);

		CHECK(!trunc);
		if (k == 0 && got == 0)
			return -1;
		CHECK(k > 0);
		got += (size_t)k;
	}
	return 0;
}

/* The next response, or NULL at EOF. */
static Kvcached__Response *raw_recv(struct raw *r)
{
	uint8_t hdr[KV_FRAME_HDR], *buf;
	Kvcached__Response *rs;
	uint32_t len;

	if (raw_read(r, hdr, sizeof(hdr)) < 0)
		return NULL;
	CHECK(kv_frame_hdr_decode(hdr, 64u << 20, &len) == 0);
	buf = malloc(len ? len : 1);
	CHECK(buf != NULL);
	CHECK(raw_read(r, buf, len) == 0);
	rs = kvcached__response__unpack(NULL, len, buf);
	free(buf);
	CHECK(rs != NULL);
	return rs;
}

/* Sends rq and returns its reply (its id checked). */
static Kvcached__Response *raw_call(struct raw *r, Kvcached__Request *rq)
{
	Kvcached__Response *rs;

	raw_send(r, rq);
	rs = raw_recv(r);
	CHECK(rs != NULL);
	if (rs->id != r->id && rs->error)
		fprintf(stderr, "reply %llu to request %llu: error %d: %s\n",
			(unsigned long long)rs->id, (unsigned long long)r->id, rs->error->code,
			rs->error->message);
	CHECK_EQ(rs->id, r->id);
	return rs;
}

/* Takes the first fd received (the caller owns it). */
static int raw_take_fd(struct raw *r)
{
	int fd;

	CHECK(r->nfds > 0);
	fd = r->fds[0];
	memmove(r->fds, r->fds + 1, (size_t)(r->nfds - 1) * sizeof(int));
	r->nfds--;
	return fd;
}

static void raw_hello(struct raw *r)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Hello h = KVCACHED__HELLO__INIT;
	Kvcached__Response *rs;

	h.min_version = h.max_version = KV_PROTO_VERSION;
	h.client_name = "hostile";
	rq.op_case = KVCACHED__REQUEST__OP_HELLO;
	rq.hello = &h;
	rs = raw_call(r, &rq);
	CHECK(rs->result_case == KVCACHED__RESPONSE__RESULT_HELLO);
	kvcached__response__free_unpacked(rs, NULL);
}

/* Joins the test pool kvt_pool(c, name, block) registered. Returns its id. */
static uint32_t raw_pool(struct raw *r, const char *name, uint64_t block)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__RegisterPool m = KVCACHED__REGISTER_POOL__INIT;
	Kvcached__Response *rs;
	uint32_t id;

	m.name = (char *)name;
	m.block_bytes = block;
	m.block_tokens = 16;
	m.dtype = "fp16";
	m.layout.data = (uint8_t *)"test";
	m.layout.len = 4;
	rq.op_case = KVCACHED__REQUEST__OP_REGISTER_POOL;
	rq.register_pool = &m;
	rs = raw_call(r, &rq);
	CHECK(rs->result_case == KVCACHED__RESPONSE__RESULT_REGISTER_POOL);
	id = rs->register_pool->pool_id;
	kvcached__response__free_unpacked(rs, NULL);
	return id;
}

/* A Lookup request of hashes[0..n) (not sent). */
struct lookup_rq {
	Kvcached__Request rq;
	Kvcached__Lookup m;
};

static void lookup_rq(struct lookup_rq *l, uint32_t pool, const kvc_hash *h, size_t n)
{
	kvcached__request__init(&l->rq);
	kvcached__lookup__init(&l->m);
	l->m.pool_id = pool;
	l->m.hashes.data = (uint8_t *)h;
	l->m.hashes.len = n * sizeof(*h);
	l->rq.op_case = KVCACHED__REQUEST__OP_LOOKUP;
	l->rq.lookup = &l->m;
}

/* ---- the daemon ------------------------------------------------------------ */

static struct kvt_daemon dm;

/* A fresh well-behaved client can connect, allocate, write, seal, look up
 * and release. */
static void fresh_client_works(void)
{
	kvc_conn *c = kvt_connect(NULL);
	int pool = kvt_pool(c, "p", BLOCK);
	kvc_block b, got;
	kvc_hash h = kvt_hash(0xf7e5);

	CHECK_EQ(kvc_alloc(c, pool, 1, &b), 1);
	kvt_mem_fill(c, kvc_block_ptr(c, b), BLOCK, 99);
	CHECK_EQ(kvc_seal(c, pool, &b, &h, 1, &b), 1);
	CHECK_EQ(kvc_lookup(c, pool, &h, 1, &got), 1);
	CHECK(got == b);
	CHECK(kvt_mem_verify(c, kvc_block_ptr(c, got), BLOCK, 99));
	CHECK_EQ(kvc_release(c, &got, 1), 0);
	CHECK_EQ(kvc_release(c, &b, 1), 0);
	kvc_close(c);
}

/* What every case ends with. */
static void daemon_fine(void)
{
	CHECK(kvt_alive(&dm));
	CHECK_EQ(kvt_check(), 0);
	fresh_client_works();
}

/* ---- seal ------------------------------------------------------------------ */

static void case_seal(void)
{
	struct raw r;
	kvc_conn *c;
	kvc_block b, f, copy;
	kvc_hash h = kvt_hash(1);
	Kvcached__Response *rs;
	struct lookup_rq l;
	uint32_t pool;
	int cpool, fd;

	kvt_start(&dm, "--pool-size", "8MiB", "--segment-size", "2MiB", NULL);
	c = kvt_connect(NULL);
	cpool = kvt_pool(c, "p", BLOCK);
	CHECK_EQ(kvc_alloc(c, cpool, 1, &b), 1);
	kvt_mem_fill(c, kvc_block_ptr(c, b), BLOCK, 7);
	CHECK_EQ(kvc_seal(c, cpool, &b, &h, 1, &b), 1);

	/* The hostile peer looks the block up: the reply brings the fd of its
	 * segment, which it tries to shrink and to grow. */
	raw_open(&r);
	raw_hello(&r);
	pool = raw_pool(&r, "p", BLOCK);
	lookup_rq(&l, pool, &h, 1);
	rs = raw_call(&r, &l.rq);
	CHECK(!rs->error && rs->blocks->n_blocks == 1 && rs->n_segments == 1);
	fd = raw_take_fd(&r);
	/* (A cuda segment's fd is no file that could be truncated.) */
	CHECK(ftruncate(fd, 0) < 0 && (errno == EPERM || kvt_cuda()));
	CHECK(ftruncate(fd, (off_t)rs->segments[0]->bytes * 2) < 0 &&
	      (errno == EPERM || kvt_cuda()));
	CHECK(kvt_cuda() || (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) < 0 && errno == EPERM));
	fprintf(stderr, "seal: ftruncate on the segment fd: %s\n", strerror(errno));
	kvcached__response__free_unpacked(rs, NULL);

	/* The daemon copies out of that segment: a second reference, then a
	 * copy-on-write of the sealed block. */
	CHECK_EQ(kvc_fork(c, &b, 1, &f), 1);
	CHECK_EQ(kvc_cow(c, &f, 1, &copy), 1);
	CHECK(copy != b);
	CHECK(kvt_mem_verify(c, kvc_block_ptr(c, copy), BLOCK, 7));
	CHECK(kvt_mem_verify(c, kvc_block_ptr(c, b), BLOCK, 7));
	close(fd);
	raw_close(&r);
	CHECK_EQ(kvc_release(c, &copy, 1), 0);
	CHECK_EQ(kvc_release(c, &b, 1), 0);
	daemon_fine();
	kvc_close(c);
	kvt_stop(&dm);
}

/* ---- refs ------------------------------------------------------------------ */

/* kvc_fork of n copies of b; returns its result. */
static int fork_n(kvc_conn *c, kvc_block b, size_t n)
{
	kvc_block *in = malloc(n * sizeof(*in)), *out = malloc(n * sizeof(*out));
	int r;

	CHECK(in && out);
	for (size_t i = 0; i < n; i++)
		in[i] = b;
	r = kvc_fork(c, in, n, out);
	free(in);
	free(out);
	return r;
}

static void release_n(kvc_conn *c, kvc_block b, size_t n)
{
	kvc_block *in = malloc(n * sizeof(*in));

	CHECK(in);
	for (size_t i = 0; i < n; i++)
		in[i] = b;
	CHECK_EQ(kvc_release(c, in, n), 0);
	free(in);
}

/* References stop at max_block_refs: fork, lookup and seal (dedup) that
 * would pass it are refused whole with EQUOTA, and take nothing. */
static void case_refs(void)
{
	kvc_conn *c, *c2;
	kvc_block b, w[3], got[4];
	kvc_hash h = kvt_hash(2), hs[3] = { kvt_hash(3), kvt_hash(2), kvt_hash(4) };
	uint64_t fr, wr, se, ca;
	int pool, r;

	kvt_start(&dm, "--pool-size", "8MiB", "--segment-size", "2MiB", "--max-block-refs", "100",
		  NULL);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BLOCK);
	CHECK_EQ(kvc_alloc(c, pool, 1, &b), 1);
	CHECK_EQ(kvc_seal(c, pool, &b, &h, 1, &b), 1);
	/* Doubling: 1, 2, 4, ... 64 references. */
	for (size_t held = 1; held < 64; held *= 2)
		CHECK_EQ(fork_n(c, b, held), (int)held);
	/* 64 more would make 128. */
	r = fork_n(c, b, 64);
	CHECK_EQ(r, KVC_EQUOTA);
	fprintf(stderr, "refs: fork: %s\n", kvc_last_error(c));
	CHECK(strstr(kvc_last_error(c), "already has 64 references") != NULL);
	CHECK_EQ(kvt_check(), 0);
	/* Up to exactly 100, from two sessions. */
	CHECK_EQ(fork_n(c, b, 32), 32);
	c2 = kvt_connect(NULL);
	CHECK_EQ(kvt_pool(c2, "p", BLOCK), pool);
	CHECK_EQ(kvc_lookup(c2, pool, (kvc_hash[]){ h, h, h }, 3, got), 3);
	CHECK_EQ(fork_n(c, b, 1), 1);
	/* 100: every way to take one more is refused, the connection stays. */
	CHECK_EQ(fork_n(c, b, 1), KVC_EQUOTA);
	CHECK_EQ(kvc_lookup(c2, pool, &h, 1, got), KVC_EQUOTA);
	fprintf(stderr, "refs: lookup: %s\n", kvc_last_error(c2));
	CHECK_EQ(kvc_alloc(c2, pool, 3, w), 3);
	CHECK_EQ(kvc_seal(c2, pool, w, hs, 3, w), KVC_EQUOTA);
	fprintf(stderr, "refs: seal: %s\n", kvc_last_error(c2));
	CHECK(strstr(kvc_last_error(c2), "(index 1)") != NULL);
	/* The seal took nothing: its three blocks are still writable. */
	kvt_pool_counts(pool, &fr, &wr, &se, &ca);
	CHECK_EQ(wr, 3);
	CHECK_EQ(se, 1);
	CHECK_EQ(kvt_check(), 0);
	/* Below the limit again, all three work. */
	release_n(c, b, 4);
	CHECK_EQ(kvc_seal(c2, pool, w, hs, 3, w), 3);
	CHECK(w[1] == b);
	CHECK_EQ(kvc_lookup(c2, pool, &h, 1, got + 3), 1);
	CHECK_EQ(fork_n(c, b, 2), 2);   /* 96 + 1 + 1 + 2 */
	CHECK_EQ(fork_n(c, b, 1), KVC_EQUOTA);
	/* A batch that lists one new hash more often than a block may be
	 * referenced: sealing the first would make the rest dedup onto it. */
	{
		kvc_block *many = malloc(101 * sizeof(*many));
		kvc_hash *hh = malloc(101 * sizeof(*hh));

		CHECK(many && hh);
		CHECK_EQ(kvc_alloc(c, pool, 101, many), 101);
		for (int i = 0; i < 101; i++)
			hh[i] = kvt_hash(5);
		CHECK_EQ(kvc_seal(c, pool, many, hh, 101, many), KVC_EQUOTA);
		fprintf(stderr, "refs: seal of one hash 101 times: %s\n", kvc_last_error(c));
		CHECK_EQ(kvc_seal(c, pool, many, hh, 100, many), 100);
		CHECK_EQ(kvc_release(c, many, 101), 0);
		free(many);
		free(hh);
	}
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c2);
	kvc_close(c);
	daemon_fine();
	kvt_stop(&dm);
}

/* ---- conns ------------------------------------------------------------------ */

/* The admin socket next to the worker socket. */
static const char *admin_path(void)
{
	static char p[128];

	snprintf(p, sizeof(p), "%s/kvcached-admin.sock", dm.dir);
	return p;
}

/* The harness's helpers, through the admin socket (the worker socket may be
 * full). */
static int admin_check(void)
{
	char worker[128];
	int n;

	snprintf(worker, sizeof(worker), "%s", getenv("KVCACHED_SOCKET"));
	setenv("KVCACHED_SOCKET", admin_path(), 1);
	n = kvt_check();
	setenv("KVCACHED_SOCKET", worker, 1);
	return n;
}

static void admin_wait_sessions(uint32_t n)
{
	char worker[128];

	snprintf(worker, sizeof(worker), "%s", getenv("KVCACHED_SOCKET"));
	setenv("KVCACHED_SOCKET", admin_path(), 1);
	kvt_wait_sessions(n);
	setenv("KVCACHED_SOCKET", worker, 1);
}

/* A connection that gets through: it says Hello and gets the reply. */
static int open_ok(void)
{
	struct raw r;

	raw_open(&r);
	raw_hello(&r);
	return r.fd;
}

/* A connection over a limit: accepted, told EAGAIN (id 0) naming the limit,
 * closed. */
static void open_refused(const char *limit)
{
	struct raw r;
	Kvcached__Response *rs;
	uint8_t b;

	raw_open(&r);
	rs = raw_recv(&r);
	CHECK(rs != NULL && rs->id == 0 && rs->error);
	fprintf(stderr, "conns: refused: %s\n", rs->error->message);
	CHECK_EQ(rs->error->code, KVCACHED__ERROR_CODE__EAGAIN);
	CHECK(strstr(rs->error->message, limit) != NULL);
	kvcached__response__free_unpacked(rs, NULL);
	CHECK(recv(r.fd, &b, 1, 0) == 0);
	raw_close(&r);
}

/* Runs in a child as another uid: opens n connections that get through and
 * one that is refused by max_connections, tells the parent, and keeps them
 * open until the parent closes the pipe. */
static int other_uid(void *arg)
{
	int *p = arg, fds[16], n = p[2];
	char ok = 1;

	close(p[3]);   /* the parent's ends */
	close(p[4]);
	if (setgid(65534) < 0 || setuid(65534) < 0)
		return 2;
	for (int i = 0; i < n; i++)
		fds[i] = open_ok();
	open_refused("max_connections ");
	CHECK(write(p[1], &ok, 1) == 1);
	CHECK(read(p[0], &ok, 1) == 0);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	return 0;
}

/* A flood of connections: max_connections_per_uid, then max_connections,
 * refuse the next one cleanly; the admin socket still takes kvctl; the
 * clients already in carry on. */
static void case_conns(void)
{
	kvc_conn *c, *x = NULL;
	kvc_block held, b;
	int fds[8], n = 0, pool;

	kvt_start(&dm, "--pool-size", "8MiB", "--segment-size", "2MiB", "--max-connections", "8",
		  "--max-connections-per-uid", "5", "--socket-mode", "0666", NULL);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BLOCK);
	CHECK_EQ(kvc_alloc(c, pool, 1, &held), 1);
	kvt_mem_set(c, kvc_block_ptr(c, held), 0x42, BLOCK);
	/* Ours: the bystander and four more, then refused. */
	while (n < 4)
		fds[n++] = open_ok();
	open_refused("max_connections_per_uid 5");
	CHECK_EQ(kvc_connect(NULL, NULL, &x), KVC_EAGAIN);
	CHECK(x == NULL);
	/* Another uid is not held back by ours, only by the total. */
	if (geteuid() == 0) {
		int up[2], down[2], arg[5];
		char ok;
		pid_t pid;

		CHECK(chmod(dm.dir, 0755) == 0);
		CHECK(pipe(up) == 0 && pipe(down) == 0);
		arg[0] = down[0];
		arg[1] = up[1];
		arg[2] = 3;   /* 5 + 3 = max_connections */
		arg[3] = down[1];
		arg[4] = up[0];
		pid = kvt_spawn(other_uid, arg);
		close(down[0]);
		close(up[1]);
		CHECK(read(up[0], &ok, 1) == 1);
		CHECK_EQ(admin_check(), 0);
		close(down[1]);
		CHECK_EQ(kvt_wait(pid), 0);
		close(up[0]);
	} else {
		fprintf(stderr, "conns: not root: another uid's connections not tried\n");
	}
	/* The admin socket is not counted. */
	CHECK_EQ(admin_check(), 0);
	/* The bystander is unaffected. */
	CHECK(kvt_mem_all(c, kvc_block_ptr(c, held), 0x42, BLOCK));
	CHECK_EQ(kvc_alloc(c, pool, 1, &b), 1);
	CHECK_EQ(kvc_release(c, &b, 1), 0);
	/* Places come back as connections close. */
	while (n > 0)
		close(fds[--n]);
	admin_wait_sessions(1);
	daemon_fine();
	kvc_close(c);
	kvt_stop(&dm);

	/* max_connections alone, for any uid. */
	kvt_start(&dm, "--pool-size", "8MiB", "--segment-size", "2MiB", "--max-connections", "3",
		  NULL);
	while (n < 3)
		fds[n++] = open_ok();
	open_refused("max_connections 3");
	CHECK_EQ(admin_check(), 0);
	close(fds[--n]);
	admin_wait_sessions(2);
	fresh_client_works();
	while (n > 0)
		close(fds[--n]);
	admin_wait_sessions(0);
	daemon_fine();
	kvt_stop(&dm);
}

/* ---- partial ---------------------------------------------------------------- */

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void nap(void)
{
	struct timespec ts = { 0, 2000000 };

	nanosleep(&ts, NULL);
}

/* Whether the daemon's RSS says anything about its buffers: not under
 * AddressSanitizer, whose allocator keeps freed memory in quarantine and
 * adds shadow and redzones (the same build compiles this test). */
#define RSS_MEANINGFUL (!KV_ASAN)

/* The daemon's resident memory, KiB. */
static long rss_kib(void)
{
	char path[64], line[256];
	long kib = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)dm.pid);
	f = fopen(path, "re");
	CHECK(f != NULL);
	/* RssAnon, not VmRSS: the daemon's own allocations (buffers, frames).
	 * VmRSS also counts the pool's memfd pages the daemon maps, which it
	 * populates when a pool takes them (backend_host.c): 2 MiB a page,
	 * nothing to do with what is measured here. */
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "RssAnon: %ld kB", &kib) == 1)
			break;
	fclose(f);
	CHECK(kib > 0);
	return kib;
}

/* Waits (under a guard) until the daemon has read everything sent on fd. */
static void wait_read(int fd)
{
	uint64_t deadline = now_ms() + 60000;
	int q;

	for (;;) {
		CHECK(ioctl(fd, SIOCOUTQ, &q) == 0);
		if (q == 0)
			return;
		CHECK(now_ms() < deadline);
		nap();
	}
}

/* Waits (under a guard) for the daemon to close fd; returns when it did. */
static uint64_t wait_eof(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	uint8_t b[4096];
	ssize_t n;

	for (;;) {
		CHECK(poll(&p, 1, 60000) == 1);
		n = recv(fd, b, sizeof(b), MSG_DONTWAIT);
		if (n == 0)
			return now_ms();
		CHECK(n > 0 || errno == EAGAIN);
	}
}

/* Sends the header of a frame of len bytes and `sent` bytes of it. */
static void send_partial(int fd, uint32_t len, size_t sent)
{
	uint8_t *buf = calloc(1, KV_FRAME_HDR + sent);

	CHECK(buf != NULL);
	kv_frame_hdr_encode(buf, len, 0);
	send_all(fd, buf, KV_FRAME_HDR + sent);
	free(buf);
}

#define NPARTIAL 16

/* Frames that never complete: each costs only the bytes that arrived, and
 * after frame_timeout its connection is closed and the memory given back.
 * A connection that is merely idle stays. */
static void case_partial(void)
{
	struct raw idle, part[NPARTIAL + 1];
	uint64_t t0, t;
	long base, peak, after;
	size_t sent = 0;

	kvt_start(&dm, "--pool-size", "8MiB", "--segment-size", "2MiB", "--frame-timeout", "500ms",
		  NULL);
	fresh_client_works();
	base = rss_kib();
	raw_open(&idle);
	raw_hello(&idle);
	t0 = now_ms();
	/* Announced 4 MiB each, 256 KiB sent; one of them after a Hello. */
	for (int i = 0; i < NPARTIAL; i++) {
		raw_open(&part[i]);
		if (i == 0)
			raw_hello(&part[i]);
		send_partial(part[i].fd, 4u << 20, 256u << 10);
		sent += KV_FRAME_HDR + (256u << 10);
	}
	/* And one whole frame but its last byte. */
	raw_open(&part[NPARTIAL]);
	send_partial(part[NPARTIAL].fd, 4u << 20, (4u << 20) - 1);
	sent += KV_FRAME_HDR + (4u << 20) - 1;
	for (int i = 0; i <= NPARTIAL; i++)
		wait_read(part[i].fd);
	peak = rss_kib();
	fprintf(stderr, "partial: RSS %ld KiB, %ld KiB with %zu KiB of partial frames in\n", base,
		peak, sent >> 10);
	/* What arrived, half again for growth, and a read's room each. */
	CHECK(!RSS_MEANINGFUL ||
	      peak - base < (long)(sent * 3 / 2 + (NPARTIAL + 1) * 64 * 1024) / 1024 + 4096);
	for (int i = 0; i <= NPARTIAL; i++) {
		t = wait_eof(part[i].fd);
		CHECK(t - t0 >= 500 - 2);   /* (clocks read in whole ms) */
		raw_close(&part[i]);
	}
	fprintf(stderr, "partial: all closed after %llu ms\n", (unsigned long long)(t - t0));
	admin_wait_sessions(1);
	after = rss_kib();
	fprintf(stderr, "partial: RSS %ld KiB once they are closed\n", after);
	CHECK(!RSS_MEANINGFUL || after - base < 4096);
	/* The idle connection is still there and works. */
	{
		struct pollfd p = { .fd = idle.fd, .events = POLLIN };

		Kvcached__Request rq = KVCACHED__REQUEST__INIT;
		Kvcached__Stats st = KVCACHED__STATS__INIT;
		Kvcached__Response *rs;

		CHECK(poll(&p, 1, 0) == 0);
		rq.op_case = KVCACHED__REQUEST__OP_STATS;
		rq.stats = &st;
		rs = raw_call(&idle, &rq);
		CHECK(rs->result_case == KVCACHED__RESPONSE__RESULT_STATS);
		kvcached__response__free_unpacked(rs, NULL);
	}
	raw_close(&idle);
	daemon_fine();
	kvt_stop(&dm);
}

/* ---- output ----------------------------------------------------------------- */

#define CHAIN 1000

/* A client that pipelines requests and never reads: once the replies it has
 * not read pass max_output_per_connection the daemon stops reading it, so
 * they stay within the bound and one reply (RSS); another client works
 * meanwhile; when it reads at last, every request has its reply, in order. */
static void case_output(void)
{
	kvc_conn *c;
	kvc_block b, got;
	kvc_hash h = kvt_hash(6), *chain = malloc(CHAIN * sizeof(*chain));
	struct lookup_rq l;
	struct raw r;
	uint8_t *frame;
	size_t flen, sent = 0, nsent = 0, off;
	long base, peak;
	int pool;

	CHECK(chain != NULL);
	kvt_start(&dm, "--pool-size", "8MiB", "--segment-size", "2MiB",
		  "--max-output-per-connection", "1MiB", NULL);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BLOCK);
	CHECK_EQ(kvc_alloc(c, pool, 1, &b), 1);
	CHECK_EQ(kvc_seal(c, pool, &b, &h, 1, &b), 1);
	CHECK_EQ(kvc_release(c, &b, 1), 0);
	base = rss_kib();
	/* A lookup of one hash listed CHAIN times: CHAIN handles a reply. */
	for (int i = 0; i < CHAIN; i++)
		chain[i] = h;
	raw_open(&r);
	raw_hello(&r);
	lookup_rq(&l, raw_pool(&r, "p", BLOCK), chain, CHAIN);
	/* Pipelined until the socket stays full: the daemon has stopped
	 * reading. (A pause of 200 ms means "stays": were the daemon only
	 * slow, more requests would go, and the bound would still hold.) Up
	 * to 64 MiB of requests, 16 times the replies the bound allows. */
	while (sent < (64u << 20)) {
		struct pollfd p = { .fd = r.fd, .events = POLLOUT };

		flen = pack(&r, &l.rq, &frame);
		for (off = 0; off < flen;) {
			ssize_t k = send(r.fd, frame + off, flen - off, MSG_DONTWAIT | MSG_NOSIGNAL);

			if (k > 0) {
				off += (size_t)k;
				continue;
			}
			CHECK(errno == EAGAIN);
			if (poll(&p, 1, off ? 60000 : 200) == 0)
				break;
		}
		free(frame);
		if (off < flen) {
			CHECK(off == 0);
			r.id--;   /* not sent */
			break;
		}
		sent += flen;
		nsent++;
	}
	peak = rss_kib();
	fprintf(stderr, "output: %zu requests (%zu KiB) sent, %zu KiB of replies; RSS %ld -> %ld "
		"KiB\n", nsent, sent >> 10, nsent * (CHAIN * 8 + 16) >> 10, base, peak);
	CHECK(nsent * (CHAIN * 8) >= (1u << 20));   /* the bound was reached */
	/* The bound, a reply over it, a frame in the input buffer, slack. */
	CHECK(!RSS_MEANINGFUL || peak - base < 1024 + 16 + (long)(flen >> 10) + 2048);
	/* Someone else is served meanwhile. */
	fresh_client_works();
	CHECK_EQ(kvc_lookup(c, pool, &h, 1, &got), 1);
	CHECK_EQ(kvc_release(c, &got, 1), 0);
	/* Every reply comes, in order. */
	for (size_t i = 0; i < nsent; i++) {
		Kvcached__Response *rs = raw_recv(&r);

		CHECK(rs != NULL);
		CHECK_EQ(rs->id, r.id - nsent + 1 + i);
		CHECK(!rs->error && rs->blocks->n_blocks == CHAIN);
		kvcached__response__free_unpacked(rs, NULL);
	}
	raw_close(&r);
	free(chain);
	admin_wait_sessions(1);
	daemon_fine();
	kvc_close(c);
	kvt_stop(&dm);
}

/* ---- fds --------------------------------------------------------------------- */

#define SEGS 64
#define SEG_BYTES 65536u

/* Fds the daemon has open. */
static int daemon_fds(void)
{
	char path[64];
	struct dirent *e;
	DIR *dir;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)dm.pid);
	dir = opendir(path);
	CHECK(dir != NULL);
	while ((e = readdir(dir)))
		n += e->d_name[0] != '.';
	closedir(dir);
	return n;
}

/* Frames waiting in fd's receive queue, read nothing. */
static int frames_waiting(int fd)
{
	static uint8_t buf[1 << 20];
	ssize_t n = recv(fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
	int frames = 0;
	uint32_t len;

	for (size_t off = 0; n > 0 && off + KV_FRAME_HDR <= (size_t)n; off += KV_FRAME_HDR + len) {
		CHECK(kv_frame_hdr_decode(buf + off, sizeof(buf), &len) == 0);
		if (off + KV_FRAME_HDR + len > (size_t)n)
			break;
		frames++;
	}
	return frames;
}

/* SEGS sealed blocks held once by c under hashes 100 + i: blocks of a
 * segment each, so one per segment (the lookups below count the fds). */
static int seal_one_per_segment(kvc_conn *c, kvc_block *b, kvc_hash *h)
{
	int pool = kvt_pool(c, "seg", SEG_BYTES);

	CHECK_EQ(kvc_alloc(c, pool, SEGS, b), SEGS);
	for (int i = 0; i < SEGS; i++)
		h[i] = kvt_hash(100 + (uint64_t)i);
	CHECK_EQ(kvc_seal(c, pool, b, h, SEGS, b), SEGS);
	return pool;
}

/* Segment fds in flight. A client that pipelines lookups each bringing a new
 * segment and never reads is held at max_fds_per_connection (its later
 * lookups wait, nothing fails), and resumes as it reads; another client's
 * lookup of all the segments at once goes through meanwhile. With
 * max_fds_in_flight (all clients) full, a request that needs more fds is
 * answered EAGAIN, its session intact, and succeeds once fds are read. */
static void case_fds(void)
{
	kvc_conn *c, *c2;
	kvc_block b[SEGS], got[SEGS];
	kvc_hash h[SEGS];
	struct lookup_rq l[SEGS];
	struct raw r;
	uint32_t rpool;
	int pool, fds0, fdsn, fds_got = 0;

	if (kvt_cuda()) {
		/* Its segments cannot be smaller than the GPU's 2 MiB granularity,
		 * and the fd logic above the backend is the same. */
		fprintf(stderr, "fds: not run on the cuda backend\n");
		return;
	}
	kvt_start(&dm, "--pool-size", "8MiB", "--segment-size", "64KiB", "--page-size", "64KiB",
		  "--max-fds-per-connection", "8", NULL);
	c = kvt_connect(NULL);
	pool = seal_one_per_segment(c, b, h);
	fds0 = daemon_fds();
	raw_open(&r);
	raw_hello(&r);
	rpool = raw_pool(&r, "seg", SEG_BYTES);
	{
		/* All SEGS lookups in one write. */
		uint8_t *all = NULL, *f;
		size_t len = 0, n;

		for (int i = 0; i < SEGS; i++) {
			lookup_rq(&l[i], rpool, &h[i], 1);
			n = pack(&r, &l[i].rq, &f);
			all = realloc(all, len + n);
			CHECK(all != NULL);
			memcpy(all + len, f, n);
			len += n;
			free(f);
		}
		send_all(r.fd, all, len);
		free(all);
	}
	/* The daemon answers what it may and flushes the replies together;
	 * then it waits for the reader, which does not read. */
	{
		uint64_t deadline = now_ms() + 60000;

		while (frames_waiting(r.fd) < 8) {
			CHECK(now_ms() < deadline);
			nap();
		}
	}
	c2 = kvt_connect(NULL);
	CHECK_EQ(kvt_pool(c2, "seg", SEG_BYTES), pool);
	CHECK_EQ(kvc_lookup(c2, pool, h, SEGS, got), SEGS);
	CHECK(kvt_mem_all(c2, kvc_block_ptr(c2, got[SEGS - 1]), 0, SEG_BYTES));
	CHECK_EQ(kvc_release(c2, got, SEGS), 0);
	fdsn = daemon_fds();
	fprintf(stderr, "fds: %d replies wait for the reader that does not read; daemon fds %d -> "
		"%d\n", frames_waiting(r.fd), fds0, fdsn);
	CHECK_EQ(frames_waiting(r.fd), 8);   /* not one more meanwhile */
	/* Its connection and no dup more: the held lookups queued nothing. */
	CHECK(fdsn <= fds0 + 2);
	fresh_client_works();
	/* It reads at last: every lookup is answered, each with its segment. */
	for (int i = 0; i < SEGS; i++) {
		Kvcached__Response *rs = raw_recv(&r);

		CHECK(rs != NULL && !rs->error && rs->blocks->n_blocks == 1);
		fds_got += (int)rs->n_segments;
		kvcached__response__free_unpacked(rs, NULL);
	}
	CHECK_EQ(fds_got, SEGS);
	CHECK_EQ(r.nfds, SEGS);
	raw_close(&r);
	kvc_close(c2);
	CHECK_EQ(kvc_release(c, b, SEGS), 0);
	admin_wait_sessions(1);
	daemon_fine();
	kvc_close(c);
	kvt_stop(&dm);

	/* All clients together: max_fds_in_flight. */
	/* (max_fds_per_uid as high: these clients are all of one uid.) */
	kvt_start(&dm, "--pool-size", "8MiB", "--segment-size", "64KiB", "--page-size", "64KiB",
		  "--max-fds-in-flight", "100", "--max-fds-per-uid", "100", NULL);
	c = kvt_connect(NULL);
	pool = seal_one_per_segment(c, b, h);
	raw_open(&r);
	raw_hello(&r);
	rpool = raw_pool(&r, "seg", SEG_BYTES);
	lookup_rq(&l[0], rpool, h, SEGS);
	raw_send(&r, &l[0].rq);   /* 64 fds, never read (for now) */
	wait_read(r.fd);
	c2 = kvt_connect(NULL);
	CHECK_EQ(kvt_pool(c2, "seg", SEG_BYTES), pool);
	CHECK_EQ(kvc_lookup(c2, pool, h, SEGS, got), KVC_EAGAIN);
	fprintf(stderr, "fds: %s\n", kvc_last_error(c2));
	/* The session carries on: what needs 30 fds fits. */
	CHECK_EQ(kvc_lookup(c2, pool, h, 30, got), 30);
	CHECK(kvt_mem_all(c2, kvc_block_ptr(c2, got[29]), 0, SEG_BYTES));
	CHECK_EQ(kvc_release(c2, got, 30), 0);
	CHECK_EQ(admin_check(), 0);
	/* The hoarder reads: the rest fits now. */
	{
		Kvcached__Response *rs = raw_recv(&r);

		CHECK(rs != NULL && !rs->error && rs->blocks->n_blocks == SEGS);
		CHECK_EQ(rs->n_segments, SEGS);
		kvcached__response__free_unpacked(rs, NULL);
	}
	CHECK_EQ(kvc_lookup(c2, pool, h, SEGS, got), SEGS);
	CHECK_EQ(kvc_release(c2, got, SEGS), 0);
	raw_close(&r);
	kvc_close(c2);
	admin_wait_sessions(1);

	/* The daemon's own fd table full: the dup of a segment fd fails
	 * (EMFILE), and the request gets EAGAIN, nothing else. */
	{
		struct rlimit old, low;
		kvc_hash miss = kvt_hash(99);

		c2 = kvt_connect(NULL);
		CHECK_EQ(kvt_pool(c2, "seg", SEG_BYTES), pool);
		CHECK(prlimit(dm.pid, RLIMIT_NOFILE, NULL, &old) == 0);
		low = old;
		low.rlim_cur = (rlim_t)daemon_fds();
		CHECK(prlimit(dm.pid, RLIMIT_NOFILE, &low, NULL) == 0);
		CHECK_EQ(kvc_lookup(c2, pool, h, SEGS, got), KVC_EAGAIN);
		fprintf(stderr, "fds: %s\n", kvc_last_error(c2));
		CHECK(strstr(kvc_last_error(c2), "Too many open files") != NULL);
		CHECK_EQ(kvc_lookup(c2, pool, &miss, 1, got), 0);
		CHECK(prlimit(dm.pid, RLIMIT_NOFILE, &old, NULL) == 0);
		CHECK_EQ(kvc_lookup(c2, pool, h, SEGS, got), SEGS);
		CHECK(kvt_mem_all(c2, kvc_block_ptr(c2, got[0]), 0, SEG_BYTES));
		CHECK_EQ(kvc_release(c2, got, SEGS), 0);
		kvc_close(c2);
	}
	CHECK_EQ(kvc_release(c, b, SEGS), 0);
	admin_wait_sessions(1);
	daemon_fine();
	kvc_close(c);
	kvt_stop(&dm);
}

/* Uid A (a child, setuid() to 54321 when run as root) seals SEGS blocks, one
 * per segment; its first raw connection looks them up (SEGS fds) and does
 * not read the reply; its second
 * asks for SEGS more, past max_fds_per_uid (SEGS + 16), and is refused
 * (EAGAIN naming max_fds_per_uid), its session intact: 16 fit. The parent's
 * uid is served all SEGS meanwhile. Once the first reads, A is served. */
struct fds_uid_arg {
	int up, down;       /* the child's ends: to the parent, from it */
	int close_up, close_down;
};

static int fds_uid_child(void *arg)
{
	struct fds_uid_arg *a = arg;
	struct lookup_rq l;
	struct raw r1, r2;
	Kvcached__Response *rs;
	uint64_t deadline;
	kvc_conn *c;
	kvc_block b[SEGS];
	kvc_hash h[SEGS];
	uint32_t pool;
	char ok = 1;

	close(a->close_up);
	close(a->close_down);
	if (geteuid() == 0 && (setgid(54321) < 0 || setuid(54321) < 0))
		return 2;
	/* Its own blocks, in its own namespace, one per segment. */
	c = kvt_connect(NULL);
	seal_one_per_segment(c, b, h);
	raw_open(&r1);
	raw_hello(&r1);
	pool = raw_pool(&r1, "seg", SEG_BYTES);
	lookup_rq(&l, pool, h, SEGS);
	raw_send(&r1, &l.rq);   /* SEGS fds, not read for now */
	deadline = now_ms() + 60000;
	while (frames_waiting(r1.fd) < 1) {
		CHECK(now_ms() < deadline);
		nap();
	}
	raw_open(&r2);
	raw_hello(&r2);
	CHECK_EQ(raw_pool(&r2, "seg", SEG_BYTES), pool);
	lookup_rq(&l, pool, h, SEGS);
	rs = raw_call(&r2, &l.rq);
	CHECK(rs->error != NULL);
	fprintf(stderr, "fds_uid: uid %u: %s\n", (unsigned)getuid(), rs->error->message);
	CHECK_EQ(rs->error->code, KVCACHED__ERROR_CODE__EAGAIN);
	CHECK(strstr(rs->error->message, "max_fds_per_uid") != NULL);
	kvcached__response__free_unpacked(rs, NULL);
	/* The session carries on: what stays within the bound fits. */
	lookup_rq(&l, pool, h, 16);
	rs = raw_call(&r2, &l.rq);
	CHECK(!rs->error && rs->blocks->n_blocks == 16 && rs->n_segments == 16);
	kvcached__response__free_unpacked(rs, NULL);
	CHECK(write(a->up, &ok, 1) == 1);
	CHECK(read(a->down, &ok, 1) == 0);
	/* The first reads at last: its reply is whole, and then the second
	 * gets the rest. */
	rs = raw_recv(&r1);
	CHECK(rs != NULL && !rs->error && rs->blocks->n_blocks == SEGS &&
	      rs->n_segments == SEGS);
	kvcached__response__free_unpacked(rs, NULL);
	CHECK_EQ(r1.nfds, SEGS);
	lookup_rq(&l, pool, h, SEGS);
	rs = raw_call(&r2, &l.rq);
	CHECK(!rs->error && rs->blocks->n_blocks == SEGS && rs->n_segments == SEGS - 16);
	kvcached__response__free_unpacked(rs, NULL);
	raw_close(&r1);
	raw_close(&r2);
	CHECK_EQ(kvc_release(c, b, SEGS), 0);
	kvc_close(c);
	return 0;
}

static void case_fds_uid(void)
{
	struct fds_uid_arg a;
	kvc_conn *c, *c2;
	kvc_block b[SEGS], got[SEGS];
	kvc_hash h[SEGS];
	int up[2], down[2], pool, root = geteuid() == 0;
	char ok;
	pid_t pid;

	if (kvt_cuda()) {
		fprintf(stderr, "fds_uid: not run on the cuda backend\n");
		return;
	}
	kvt_start(&dm, "--pool-size", "16MiB", "--segment-size", "64KiB", "--page-size", "64KiB",
		  "--max-fds-per-uid", "80", "--socket-mode", "0666", NULL);
	CHECK(chmod(dm.dir, 0755) == 0);
	c = kvt_connect(NULL);
	pool = seal_one_per_segment(c, b, h);
	CHECK(pipe(up) == 0 && pipe(down) == 0);
	a = (struct fds_uid_arg){ .up = up[1], .down = down[0], .close_up = up[0],
				  .close_down = down[1] };
	pid = kvt_spawn(fds_uid_child, &a);
	close(up[1]);
	close(down[0]);
	CHECK(read(up[0], &ok, 1) == 1);   /* A holds SEGS + 16 fds unread, or failed */
	if (root) {
		/* Another uid: its own share, all SEGS at once. */
		c2 = kvt_connect(NULL);
		CHECK_EQ(kvt_pool(c2, "seg", SEG_BYTES), pool);
		CHECK_EQ(kvc_lookup(c2, pool, h, SEGS, got), SEGS);
		CHECK(kvt_mem_all(c2, kvc_block_ptr(c2, got[SEGS - 1]), 0, SEG_BYTES));
		CHECK_EQ(kvc_release(c2, got, SEGS), 0);
		kvc_close(c2);
		fprintf(stderr, "fds_uid: uid %u served %d segments beside uid 54321's\n",
			(unsigned)geteuid(), SEGS);
	} else {
		fprintf(stderr, "fds_uid: not root: another uid not tried\n");
	}
	CHECK_EQ(admin_check(), 0);
	close(down[1]);
	CHECK_EQ(kvt_wait(pid), 0);
	close(up[0]);
	CHECK_EQ(kvc_release(c, b, SEGS), 0);
	admin_wait_sessions(1);
	daemon_fine();
	kvc_close(c);
	kvt_stop(&dm);
}

/* test_drain_timeout_overflow: an admin's Drain with timeout_ms UINT64_MAX
 * (now + timeout and timeout * 10^6 overflowed: the deadline came out in the
 * past and the timer short) drains for a day at most, and the daemon keeps
 * draining (it used to exit at once). */
static void case_drain_overflow(void)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Drain dr = KVCACHED__DRAIN__INIT;
	Kvcached__Response *rs;
	struct timespec ts;
	uint64_t now;
	struct raw r;

	kvc_conn *c;
	kvc_block b;

	kvt_start(&dm, "--pool-size", "8MiB", "--segment-size", "2MiB", NULL);
	c = kvt_connect(NULL);   /* a worker that holds a block keeps it draining */
	CHECK_EQ(kvc_alloc(c, kvt_pool(c, "p", BLOCK), 1, &b), 1);
	memset(&r, 0, sizeof(r));
	r.fd = raw_connect_path(admin_path());
	raw_hello(&r);
	dr.timeout_ms = UINT64_MAX;
	rq.op_case = KVCACHED__REQUEST__OP_DRAIN;
	rq.drain = &dr;
	rs = raw_call(&r, &rq);
	CHECK(rs->result_case == KVCACHED__RESPONSE__RESULT_DRAIN);
	clock_gettime(CLOCK_REALTIME, &ts);
	now = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
	fprintf(stderr, "Drain UINT64_MAX: deadline in %lld s\n",
		(long long)(rs->drain->deadline_ms - now) / 1000);
	CHECK(rs->drain->deadline_ms > now + 86390000ull);
	CHECK(rs->drain->deadline_ms < now + 86410000ull);
	kvcached__response__free_unpacked(rs, NULL);
	/* Still there, draining, after another round trip on the loop. */
	{
		Kvcached__Request sq = KVCACHED__REQUEST__INIT;
		Kvcached__Stats st = KVCACHED__STATS__INIT;

		sq.op_case = KVCACHED__REQUEST__OP_STATS;
		sq.stats = &st;
		rs = raw_call(&r, &sq);
		CHECK(rs->result_case == KVCACHED__RESPONSE__RESULT_STATS);
		CHECK(rs->stats->drain_deadline_ms > now + 86390000ull);
		kvcached__response__free_unpacked(rs, NULL);
	}
	CHECK(kvt_alive(&dm));
	raw_close(&r);
	kvc_close(c);
	kvt_stop(&dm);
}

int main(void)
{
	if (!RSS_MEANINGFUL)
		fprintf(stderr, "AddressSanitizer: the daemon's RSS is printed, not checked\n");
	case_seal();
	case_refs();
	case_conns();
	case_partial();
	case_output();
	case_fds();
	case_fds_uid();
	case_drain_overflow();
	return 0;
}
