/* kvbench: frame sizes, and section (a), the floor: a raw ping-pong over an
 * AF_UNIX socketpair between two processes with the request and response
 * frame sizes of each op that (b)-(f) measure. The frames are real: built
 * with the generated protobuf code, their packed size asked of protobuf-c. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvbench.h"

#define FRAME_HDR 8u                  /* see proto/frame.h */

/* --- frame sizes ---------------------------------------------------------- */

/* A representative request id: ids grow by one per request; a few hundred
 * thousand in, the varint takes 3 bytes. */
#define REP_ID 300000u

static uint32_t req_bytes(Kvcached__Request *q)
{
	q->id = REP_ID;
	return FRAME_HDR + (uint32_t)kvcached__request__get_packed_size(q);
}

static uint32_t resp_bytes(size_t nblocks, kvc_block handle, bool with_list)
{
	Kvcached__Response rs = KVCACHED__RESPONSE__INIT;
	Kvcached__BlockList bl = KVCACHED__BLOCK_LIST__INIT;
	uint64_t *v = calloc(nblocks ? nblocks : 1, sizeof(*v));
	size_t i, len;

	if (!v)
		die("out of memory");
	for (i = 0; i < nblocks; i++)
		v[i] = handle;
	rs.id = REP_ID;
	if (with_list) {
		bl.n_blocks = nblocks;
		bl.blocks = v;
		rs.result_case = KVCACHED__RESPONSE__RESULT_BLOCKS;
		rs.blocks = &bl;
	}
	len = kvcached__response__get_packed_size(&rs);
	free(v);
	return FRAME_HDR + (uint32_t)len;
}

/* The frames of op on n blocks of pool, with a real handle's value. */
static struct frames frames_of(enum op op, int pool, size_t n, kvc_block handle)
{
	Kvcached__Request q = KVCACHED__REQUEST__INIT;
	Kvcached__Alloc a = KVCACHED__ALLOC__INIT;
	Kvcached__Seal s = KVCACHED__SEAL__INIT;
	Kvcached__Release r = KVCACHED__RELEASE__INIT;
	Kvcached__Lookup l = KVCACHED__LOOKUP__INIT;
	uint64_t *v = calloc(n, sizeof(*v));
	uint8_t *h = calloc(n, 32);
	struct frames f = { 0, 0 };
	size_t i;

	if (!v || !h)
		die("out of memory");
	for (i = 0; i < n; i++)
		v[i] = handle;
	switch (op) {
	case OP_ALLOC:
		a.pool_id = (uint32_t)pool;
		a.count = (uint32_t)n;
		q.op_case = KVCACHED__REQUEST__OP_ALLOC;
		q.alloc = &a;
		f.resp = resp_bytes(n, handle, true);
		break;
	case OP_SEAL:
		s.pool_id = (uint32_t)pool;
		s.n_blocks = n;
		s.blocks = v;
		s.hashes.len = 32 * n;
		s.hashes.data = h;
		q.op_case = KVCACHED__REQUEST__OP_SEAL;
		q.seal = &s;
		f.resp = resp_bytes(n, handle, true);
		break;
	case OP_RELEASE:
		r.n_blocks = n;
		r.blocks = v;
		q.op_case = KVCACHED__REQUEST__OP_RELEASE;
		q.release = &r;
		f.resp = resp_bytes(0, handle, false);
		break;
	case OP_LOOKUP:
		l.pool_id = (uint32_t)pool;
		l.hashes.len = 32 * n;
		l.hashes.data = h;
		q.op_case = KVCACHED__REQUEST__OP_LOOKUP;
		q.lookup = &l;
		f.resp = resp_bytes(n, handle, true);
		break;
	}
	f.req = req_bytes(&q);
	free(v);
	free(h);
	return f;
}

const char *const opname[] = { "alloc", "seal", "release", "lookup" };

/* Frame sizes need a pool id and a handle value (fixed64: the size does not
 * depend on it): set once by rep_init(). */
static int rep_pool;
static kvc_block rep_handle;

void rep_init(struct bench_conn *bc)
{
	check(bc->c, kvc_alloc(bc->c, bc->pool, 1, bc->b), "alloc");
	rep_pool = bc->pool;
	rep_handle = bc->b[0];
	check(bc->c, kvc_release(bc->c, bc->b, 1), "release");
}

struct frames fr(enum op op, uint32_t n)
{
	return frames_of(op, rep_pool, n, rep_handle);
}

/* --- (a) the floor: socketpair ping-pong ---------------------------------- */

static int read_full(int fd, uint8_t *p, size_t n)
{
	while (n) {
		ssize_t r = read(fd, p, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

static int write_full(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t r = write(fd, p, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

/* Times nst request/response exchanges per sample over a socketpair with a
 * forked echo process that answers each request frame with a response of
 * the given size. Runs for secs after a warm-up. */
static void floor_run(const struct frames *st, int nst, double secs, struct samples *out)
{
	size_t big = 0;
	uint8_t *buf;
	int sv[2], i, status;
	uint64_t end, warm_end;
	pid_t pid;

	for (i = 0; i < nst; i++) {
		big = st[i].req > big ? st[i].req : big;
		big = st[i].resp > big ? st[i].resp : big;
	}
	buf = calloc(1, big);
	if (!buf)
		die("out of memory");
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		die("socketpair: %s", strerror(errno));
	fflush(NULL);
	pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		close(sv[0]);
		if (server_cpu >= 0) {
			cpu_set_t set;

			CPU_ZERO(&set);
			CPU_SET(server_cpu, &set);
			if (sched_setaffinity(0, sizeof(set), &set) < 0) {
				fprintf(stderr, "kvbench: --server-cpu %d: %s\n", server_cpu,
					strerror(errno));
				_exit(1);
			}
		}
		for (;;)
			for (i = 0; i < nst; i++)
				if (read_full(sv[1], buf, st[i].req) < 0 ||
				    write_full(sv[1], buf, st[i].resp) < 0)
					_exit(0);
	}
	close(sv[1]);
	warm_end = now_ns() + (uint64_t)(secs * 0.2e9);
	end = 0;
	for (;;) {
		uint64_t t0 = now_ns(), t1;

		for (i = 0; i < nst; i++)
			if (write_full(sv[0], buf, st[i].req) < 0 ||
			    read_full(sv[0], buf, st[i].resp) < 0)
				die("floor ping-pong: the echo process went away");
		t1 = now_ns();
		if (!end) {
			if (t1 < warm_end)
				continue;
			end = t1 + (uint64_t)(secs * 1e9);
			continue;
		}
		sample_add(out, t1 - t0);
		if (t1 >= end)
			break;
	}
	close(sv[0]);
	waitpid(pid, &status, 0);
	free(buf);
}

/* Floor p50s by frame pair, so later sections find theirs. */
struct floor_entry {
	struct frames f[3];
	int nf;
	double p50;
};
static struct floor_entry floors[32];
static size_t nfloors;

static double floor_measure(char section, const char *name, const struct frames *f, int nf)
{
	struct samples s = { 0 };
	struct floor_entry *e;
	struct row *r;
	size_t i;

	for (i = 0; i < nfloors; i++)
		if (floors[i].nf == nf && !memcmp(floors[i].f, f, (size_t)nf * sizeof(*f)))
			return floors[i].p50;
	floor_run(f, nf, D.floor, &s);
	r = add_row(section, name);
	for (i = 0; i < (size_t)nf; i++) {
		r->req += f[i].req;
		r->resp += f[i].resp;
	}
	row_from(r, &s, 1);
	print_row(r);
	sample_free(&s);
	if (nfloors < sizeof(floors) / sizeof(floors[0])) {
		e = &floors[nfloors++];
		memcpy(e->f, f, (size_t)nf * sizeof(*f));
		e->nf = nf;
		e->p50 = r->p50;
	}
	return r->p50;
}

double floor_op(enum op op, uint32_t n)
{
	struct frames f = fr(op, n);
	char name[48];

	snprintf(name, sizeof(name), "%s %u frames", opname[op], n);
	return floor_measure('a', name, &f, 1);
}

double floor_cycle(uint32_t n)
{
	struct frames f[3] = { fr(OP_ALLOC, n), fr(OP_SEAL, n), fr(OP_RELEASE, n) };
	char name[48];

	snprintf(name, sizeof(name), "alloc+seal+release %u frames", n);
	return floor_measure('a', name, f, 3);
}
