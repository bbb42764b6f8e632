/* A tier whose every I/O fails backs off (issue 36, item 4). A real daemon
 * with G2 and G3 (io_uring on a real file), KVCACHED_FAULTS making every G3
 * write fail with EIO, then with ENOSPC, then every G1 <-> G2 copy fail with
 * EIO (the fault harness: daemon/fault.h). A worker fills G1 so that
 * demotion and write-back want to run; then the daemon is left idle for a
 * measured window. Counted, from the daemon's own log (its stderr, a file
 * here) and /proc: its warning lines and its CPU seconds. Main before the
 * fix retried each failed I/O at once from its completion, for ever: over a
 * million warnings and more than a core of CPU (the figures: 8.5 s
 * of CPU in 5 s). Now:
 *   - the tier backs off (kvcached_tier_backing_off 1, backoffs counted,
 *     io_errors counted), the daemon idles (CPU under an eighth of the
 *     window; printed), and it logs a handful of lines (at most one per
 *     5 s of backoff and path, plus the start's);
 *   - the blocks stay where they are (G2's dirty copies stay dirty, the
 *     worker's last chain is still served from G1);
 *   - with a fault that runs out (count=N), the tier comes back by itself:
 *     G3 (or G2) fills without anyone asking, the backoff gauge drops to 0.
 * Each window is a measurement, not a wait for a condition; waits for
 * conditions have a one-minute guard. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define BB 65536u
#define CHAIN 8
#define NCHAINS 48   /* 24 MiB through a 4 MiB G1 */

static char dir[64], disk[128], logpath[128];

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The daemon's CPU seconds (user + system) so far. */
static double cpu_s(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long long ut = 0, st = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	CHECK((f = fopen(path, "r")) != NULL);
	CHECK(fgets(buf, sizeof(buf), f) != NULL);
	fclose(f);
	p = strrchr(buf, ')');
	CHECK(p != NULL);
	/* fields 14 and 15 (utime, stime); p points at the end of field 2 */
	CHECK(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) ==
	      2);
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* Lines of the daemon's log with "warning" in them. */
static long warnings(void)
{
	char line[2048];
	long n = 0;
	FILE *f = fopen(logpath, "r");

	CHECK(f != NULL);
	while (fgets(line, sizeof(line), f))
		n += strstr(line, " warning: ") != NULL;
	fclose(f);
	return n;
}

/* The value of `name{tier="tier"}` in the daemon's exposition; -1: absent. */
static long long tier_metric(const char *name, const char *tier)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Metrics m = KVCACHED__METRICS__INIT;
	char key[160];
	long long v = -1;
	uint64_t first = 0;

	snprintf(key, sizeof(key), "%s{tier=\"%s\"} ", name, tier);
	for (;;) {
		Kvcached__Response *rs = NULL;
		kvc_conn *c = kvt_connect(NULL);
		const char *t;
		int more;

		m.page = 1;
		m.first = first;
		rq.op_case = KVCACHED__REQUEST__OP_METRICS;
		rq.metrics = &m;
		CHECK_EQ(kvc_call(c, &rq, &rs), 0);
		CHECK(rs->result_case == KVCACHED__RESPONSE__RESULT_METRICS);
		for (t = rs->metrics->text; t && *t; t = strchr(t, '\n') ? strchr(t, '\n') + 1 : "")
			if (!strncmp(t, key, strlen(key)))
				v = atoll(t + strlen(key));
		more = rs->metrics->more;
		first = rs->metrics->next;
		kvcached__response__free_unpacked(rs, NULL);
		kvc_close(c);
		if (!more)
			break;
	}
	return v;
}

/* Admin Evict of G1, then a wait (one-minute guard) until its copies into
 * G2 have landed; not for the disk's I/O (kvt_evict() waits for that too,
 * which a daemon that retries failed writes for ever never ends). */
static void evict_g1(kvc_conn *c)
{
	struct kvt_tier t2;
	double t0 = now_s();

	kvt_evict_nowait(c, KVCACHED__TIER__TIER_G1);
	for (;;) {
		kvt_tier(1, &t2);
		if (!t2.inflight)
			break;
		CHECK(now_s() - t0 < 60);
		usleep(10000);
	}
}

/* Starts the daemon with faults armed, its log in logpath. */
static void start(struct kvt_daemon *d, const char *faults)
{
	int saved = dup(2), fd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	CHECK(saved >= 0 && fd >= 0);
	unlink(disk);
	fflush(stderr);
	CHECK(dup2(fd, 2) == 2);
	close(fd);
	setenv("KVCACHED_FAULTS", faults, 1);
	kvt_start(d, "--pool-size", "4MiB", "--page-size", "256KiB", "--host-tier-size", "4MiB",
		  "--disk-path", disk, "--disk-size", "32MiB", "--writeback-low", "25",
		  "--writeback-high", "50", NULL);
	unsetenv("KVCACHED_FAULTS");
	CHECK(dup2(saved, 2) == 2);
	close(saved);
}

/* tier: "G2" (copies) or "G3" (disk), where the failures are counted. */
static void failing(const char *faults, const char *tier)
{
	struct kvt_daemon d;
	struct kvt_tier t2a, t2b;
	kvc_conn *c;
	int pool;
	double t0, c0, c1, win = 2.0;
	long w0, w1;

	start(&d, faults);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BB);
	t0 = now_s();
	for (int i = 0; i < NCHAINS; i++)
		kvt_seal_chain(c, pool, BB, CHAIN, 1000 * (uint64_t)i);
	/* Disk: G2 filled with dirty copies for certain (the watermarks alone
	 * may drop G1's blocks first, depending on the copies' timing). */
	if (!strcmp(tier, "G3"))
		evict_g1(c);
	kvt_seal_chain(c, pool, BB, CHAIN, 1000 * NCHAINS);
	/* The idle window. */
	kvt_tier(1, &t2a);
	c0 = cpu_s(d.pid);
	w0 = warnings();
	usleep((useconds_t)(win * 1e6));
	c1 = cpu_s(d.pid);
	w1 = warnings();
	kvt_tier(1, &t2b);
	printf("%s: %.2f s of load then %.1f s idle: daemon CPU %.2f s in the idle window; "
	       "%ld warning lines in all (%ld in the window)\n",
	       faults, now_s() - t0 - win, win, c1 - c0, w1, w1 - w0);
	printf("%s: G2 %llu blocks, %llu dirty\n", faults, (unsigned long long)t2a.blocks,
	       (unsigned long long)t2a.dirty);
	printf("%s: %s io_errors %lld, backoffs %lld, backing off %lld\n", faults, tier,
	       tier_metric("kvcached_tier_io_errors_total", tier),
	       tier_metric("kvcached_tier_backoffs_total", tier),
	       tier_metric("kvcached_tier_backing_off", tier));
	CHECK(tier_metric("kvcached_tier_io_errors_total", tier) > 0);
	CHECK(tier_metric("kvcached_tier_backoffs_total", tier) > 0);
	CHECK_EQ(tier_metric("kvcached_tier_backing_off", tier), 1);
	CHECK(c1 - c0 < win / 8);
	/* The start's lines, then at most one per 5 s per path (and one for a
	 * shrink on ENOSPC). */
	CHECK(w1 <= 8);
	/* The blocks stay where they are: dirty G2 copies stay (disk), the
	 * last chain is served from G1 (copies). */
	if (!strcmp(tier, "G3")) {
		CHECK(t2a.dirty > 0);
		CHECK_EQ(t2b.dirty, t2a.dirty);
	}
	CHECK_EQ(kvt_lookup_chain(NULL, "p", BB, CHAIN, 1000 * NCHAINS), CHAIN);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_stop(&d);
}

/* A fault that runs out: the tier comes back by itself. */
static void recovers(const char *faults, const char *tier)
{
	struct kvt_daemon d;
	struct kvt_tier ts;
	kvc_conn *c;
	int pool, l = !strcmp(tier, "G3") ? 2 : 1;
	double t0;

	start(&d, faults);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", BB);
	for (int i = 0; i < NCHAINS; i++)
		kvt_seal_chain(c, pool, BB, CHAIN, 1000 * (uint64_t)i);
	if (l == 2)
		evict_g1(c);
	/* The copies are asynchronous: their failures come when they end. */
	t0 = now_s();
	while (tier_metric("kvcached_tier_backoffs_total", tier) == 0) {
		CHECK(now_s() - t0 < 60);
		usleep(10000);
	}
	t0 = now_s();
	for (;;) {
		kvt_tier(l, &ts);
		if (ts.blocks > 0 && tier_metric("kvcached_tier_backing_off", tier) == 0)
			break;
		if (now_s() - t0 > 60) {
			fprintf(stderr, "%s: the tier did not come back in a minute\n", faults);
			exit(1);
		}
		usleep(20000);
	}
	printf("%s: %s back by itself after %.2f s (%llu blocks there)\n", faults, tier,
	       now_s() - t0, (unsigned long long)ts.blocks);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_stop(&d);
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	snprintf(dir, sizeof(dir), "/tmp/kvt-faults.XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	snprintf(disk, sizeof(disk), "%s/g3", dir);
	snprintf(logpath, sizeof(logpath), "%s/log", dir);
	failing("g3_write=ENOSPC:count=0", "G3");
	failing("g3_write=EIO:count=0", "G3");
	failing("copy=EIO:count=0", "G2");
	recovers("g3_write=EIO:count=200", "G3");
	recovers("copy=EIO:count=5", "G2");
	kvt_rm_disk(dir, disk);
	unlink(logpath);
	rmdir(dir);
	return 0;
}
