/* Flush is a barrier (issue 36, item 6): a planned restart does
 * `kvctl evict --tier g1 --all && kvctl flush`, then stops the daemon, and
 * must lose nothing. Here, on a real daemon with a host tier and a disk tier:
 * chains of blocks of known bytes cached in G1; Evict of G1 (its demotions
 * start and the reply comes before they end); Flush right after, asked again
 * until it answers clean, as kvctl does; then kill -9 (nothing more is
 * written) and a restart on the same disk: every block is found on disk
 * (warm restart) and every byte checked. Main before the fix answered clean
 * to the first Flush while the demotions were in flight, so the blocks never
 * reached the disk and the lookups after the restart missed. Several rounds,
 * so that the window is hit however the copies are scheduled.
 *
 * The last round's daemon runs with its first journal appends failing
 * (KVCACHED_FAULTS g3_index): the blocks are on disk but the records that
 * say where are lost, so Flush may answer clean only once a compaction that
 * began after the losses has committed. Main before that fix answered clean
 * at once, and the restart missed the blocks whose records were lost. */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "frame.h"
#include "harness.h"

#define BB (256u * 1024)
#define N 48               /* blocks per round: 12 MiB */
#define ROUNDS 4     /* the last with failing journal appends */

static char dir[64], disk[128];

static void start(struct kvt_daemon *d, int restart)
{
	if (restart)
		kvt_restart(d, "--pool-size", "64MiB", "--host-tier-size", "64MiB", "--disk-path",
			    disk, "--disk-size", "256MiB", "--writeback-low", "10",
			    "--writeback-high", "20", NULL);
	else
		kvt_start(d, "--pool-size", "64MiB", "--host-tier-size", "64MiB", "--disk-path",
			  disk, "--disk-size", "256MiB", "--writeback-low", "10",
			  "--writeback-high", "20", NULL);
}

static void send_all(int fd, const uint8_t *b, size_t n)
{
	while (n) {
		ssize_t k = send(fd, b, n, MSG_NOSIGNAL);

		CHECK(k > 0);
		b += k;
		n -= (size_t)k;
	}
}

static void read_all(int fd, uint8_t *p, size_t n)
{
	while (n) {
		ssize_t k = recv(fd, p, n, 0);

		CHECK(k > 0);
		p += k;
		n -= (size_t)k;
	}
}

/* Appends rq as a frame at *o in buf. */
static void put_frame(uint8_t *buf, size_t *o, Kvcached__Request *rq)
{
	size_t len = kvcached__request__get_packed_size(rq);

	kv_frame_hdr_encode(buf + *o, (uint32_t)len, 0);
	kvcached__request__pack(rq, buf + *o + KV_FRAME_HDR);
	*o += KV_FRAME_HDR + len;
}

static Kvcached__Response *get_reply(int fd)
{
	uint8_t hdr[KV_FRAME_HDR], *buf;
	Kvcached__Response *rs;
	uint32_t len;

	read_all(fd, hdr, sizeof(hdr));
	CHECK(kv_frame_hdr_decode(hdr, 64u << 20, &len) == 0);
	buf = malloc(len ? len : 1);
	CHECK(buf != NULL);
	read_all(fd, buf, len);
	rs = kvcached__response__unpack(NULL, len, buf);
	free(buf);
	CHECK(rs != NULL);
	return rs;
}

/* Hello, then Evict of G1 (all pools) and Flush in one write, as
 * `kvctl evict --tier g1 --all && kvctl flush` would send them at the
 * soonest: the daemon reads both before any demotion copy can end. Returns
 * the Evict's count; *clean is the Flush's answer. */
static uint64_t evict_flush(int *clean)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	Kvcached__Request h = KVCACHED__REQUEST__INIT, e = KVCACHED__REQUEST__INIT,
			  f = KVCACHED__REQUEST__INIT;
	Kvcached__Hello he = KVCACHED__HELLO__INIT;
	Kvcached__Evict ev = KVCACHED__EVICT__INIT;
	Kvcached__Flush fl = KVCACHED__FLUSH__INIT;
	Kvcached__Response *rs;
	uint8_t buf[1024];
	size_t o = 0;
	uint64_t n;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	CHECK(fd >= 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", getenv("KVCACHED_SOCKET"));
	CHECK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	he.min_version = he.max_version = KV_PROTO_VERSION;
	he.client_name = "flush_barrier";
	h.id = 1;
	h.op_case = KVCACHED__REQUEST__OP_HELLO;
	h.hello = &he;
	put_frame(buf, &o, &h);
	send_all(fd, buf, o);
	rs = get_reply(fd);
	CHECK(!rs->error);
	kvcached__response__free_unpacked(rs, NULL);
	o = 0;
	ev.tier = KVCACHED__TIER__TIER_G1;
	ev.all_pools = 1;
	e.id = 2;
	e.op_case = KVCACHED__REQUEST__OP_EVICT;
	e.evict = &ev;
	f.id = 3;
	f.op_case = KVCACHED__REQUEST__OP_FLUSH;
	f.flush = &fl;
	put_frame(buf, &o, &e);
	put_frame(buf, &o, &f);
	send_all(fd, buf, o);
	rs = get_reply(fd);
	CHECK(!rs->error && rs->result_case == KVCACHED__RESPONSE__RESULT_EVICT);
	n = rs->evict->blocks;
	kvcached__response__free_unpacked(rs, NULL);
	rs = get_reply(fd);
	CHECK(!rs->error && rs->result_case == KVCACHED__RESPONSE__RESULT_FLUSH);
	*clean = rs->flush->clean;
	kvcached__response__free_unpacked(rs, NULL);
	close(fd);
	return n;
}

/* Flush until it answers clean (kvctl flush's loop, under a one-minute
 * guard). Returns how many Flushes it took. */
static int flush_clean(kvc_conn *c)
{
	for (int i = 1; i <= 6000; i++) {
		Kvcached__Request rq = KVCACHED__REQUEST__INIT;
		Kvcached__Flush fl = KVCACHED__FLUSH__INIT;
		Kvcached__Response *rs = NULL;
		int clean;

		rq.op_case = KVCACHED__REQUEST__OP_FLUSH;
		rq.flush = &fl;
		CHECK_EQ(kvc_call(c, &rq, &rs), 0);
		CHECK(!rs->error && rs->result_case == KVCACHED__RESPONSE__RESULT_FLUSH);
		clean = rs->flush->clean;
		kvcached__response__free_unpacked(rs, NULL);
		if (clean)
			return i;
		usleep(10000);
	}
	fprintf(stderr, "flush: not clean after a minute\n");
	exit(1);
}

int main(void)
{
	struct kvt_daemon d;
	int lost = 0;

	snprintf(dir, sizeof(dir), "/tmp/kvt-flush.XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	snprintf(disk, sizeof(disk), "%s/g3", dir);
	start(&d, 0);
	for (int r = 0; r < ROUNDS; r++) {
		kvc_conn *c, *a;
		int pool, k, asks, clean;
		uint64_t base = 1000 * (uint64_t)(r + 1), n;

		if (r == ROUNDS - 1) {
			/* The run records and the first slots' records are lost. */
			setenv("KVCACHED_FAULTS", "g3_index=EIO:count=12", 1);
			start(&d, 1);
			unsetenv("KVCACHED_FAULTS");
		}
		c = kvt_connect("fb");
		a = kvt_connect(NULL);
		pool = kvt_pool(c, "p", BB);

		kvt_seal_chain(c, pool, BB, N, base);
		n = evict_flush(&clean);
		asks = clean ? 1 : 1 + flush_clean(a);
		printf("round %d: evict g1 acted on %llu blocks; flush clean after %d asks\n", r,
		       (unsigned long long)n, asks);
		CHECK(n >= N);   /* the blocks of the rounds before were promoted again */
		kvc_close(c);
		kvc_close(a);
		start(&d, 1);   /* kill -9, then the same disk */
		c = kvt_connect("fb");
		pool = kvt_pool(c, "p", BB);
		k = kvt_lookup_chain("fb", "p", BB, N, base);
		printf("round %d: after kill -9 and a restart, %d of %d blocks found\n", r, k, N);
		lost += N - k;
		kvc_close(c);
	}
	CHECK_EQ(kvt_check(), 0);
	kvt_stop(&d);
	kvt_rm_disk(dir, disk);
	CHECK_EQ(lost, 0);
	return 0;
}
