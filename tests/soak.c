/* soak: a long run of an engine-like load against a real daemon that is
 * killed and restarted, with workers killed too (scripts/soak runs it for as
 * long as asked; the test suite runs it for seconds).
 *
 *   soak [--seconds N] [--workers N] [--restart-every S] [--kill-every S]
 *
 * The daemon has a small G1, a host tier and a disk tier, so that pressure
 * demotes, writes back and promotes all the time, and G3 faults armed at
 * every start (write and read errors). Each worker loops over an engine's
 * mix: lookups of shared chains (every byte that hits is checked), allocs,
 * writes and seals, forks, copy-on-writes, swaps out and in (bytes checked),
 * releases. A worker that sees the daemon restart (kvc_restarts) forgets what
 * it held and goes on. Every kill_every seconds a random worker is killed
 * with SIGKILL and replaced; every restart_every seconds the daemon is
 * killed with SIGKILL and started again on the same socket.
 *
 * Once a second the daemon's RSS and open fds are sampled. At the end the
 * workers stop cleanly, and soak checks: no wrong byte was read (the workers'
 * exit codes), no block is left writable or sealed (every reference was
 * released, by the workers or by the daemon when they died), the daemon's
 * invariant check is clean, its RSS stayed under what its configuration
 * allows (pools + host tier + 64 MiB), and a burst of as many sessions again
 * leaves its fd count (memfds aside) where it was. Prints the figures; exits 0, or 1 on a
 * failed check. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define BB 16384
#define HASHES 1024        /* distinct block contents */
#define MAXHELD 48
#define MAXWORKERS 256
#define POOL_MIB 4
#define HOST_MIB 4
#define DISK_MIB 16

static char disk[128], faults[128];
static volatile sig_atomic_t stop_flag;

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static int gone(int r)
{
	return r == -EPIPE || r == -ECONNRESET;
}

/* --- the worker ------------------------------------------------------------ */

struct held {
	kvc_block b;
	int k;  /* the content's hash id + 1 when known (sealed, looked up), else 0 */
};

struct wstate {
	kvc_conn *c;
	int pool;
	uint64_t epoch, s;
	struct held h[MAXHELD];
	int n;
	uint64_t ops, bad, hits, swaps;
};

static void on_term(int sig)
{
	(void)sig;
	stop_flag = 1;
}

/* The block's content: its hash id's pattern, the whole block. */
static int verify(struct wstate *w, kvc_block b, int k)
{
	void *p = kvc_block_ptr(w->c, b);

	if (p && kvt_mem_verify(w->c, p, BB, (uint64_t)k))
		return 1;
	fprintf(stderr, "soak worker %d: block %#llx: wrong bytes for hash %d%s\n", (int)getpid(),
		(unsigned long long)b, k, p ? "" : " (not mapped)");
	w->bad++;
	return 0;
}

/* After a restart nothing held is: forget it. Returns whether it happened. */
static int restarted(struct wstate *w)
{
	if (kvc_restarts(w->c) == w->epoch)
		return 0;
	w->epoch = kvc_restarts(w->c);
	w->n = 0;
	return 1;
}

/* An error that is not a restart's, an ENOSPC or a quota: a defect. */
static void unexpected(struct wstate *w, const char *op, int r)
{
	if (r >= 0 || gone(r) || r == KVC_ENOSPC || r == KVC_EAGAIN || restarted(w))
		return;
	fprintf(stderr, "soak worker %d: %s: %s (%s)\n", (int)getpid(), op, kvc_strerror(r),
		kvc_last_error(w->c));
	w->bad++;
}

static void step(struct wstate *w)
{
	int op = (int)(rnd(&w->s) % 100), j = w->n ? (int)(rnd(&w->s) % (uint64_t)w->n) : 0;
	kvc_block b[4], out[4];
	kvc_hash hh[4];
	int r, n, k;

	if (op < 30 || w->n == 0) {                       /* lookup a chain of 1..4 */
		n = 1 + (int)(rnd(&w->s) % 4);
		k = (int)(rnd(&w->s) % HASHES);
		if (w->n + n > MAXHELD)
			goto release;
		for (int i = 0; i < n; i++)
			hh[i] = kvt_hash((uint64_t)((k + i) % HASHES));
		r = kvc_lookup(w->c, w->pool, hh, (size_t)n, out);
		if (r < 0 || restarted(w)) {
			unexpected(w, "lookup", r);
			return;
		}
		for (int i = 0; i < r; i++) {
			verify(w, out[i], (k + i) % HASHES);
			w->h[w->n++] = (struct held){ out[i], (k + i) % HASHES + 1 };
		}
		w->hits += (uint64_t)r;
	} else if (op < 50) {                             /* alloc, write, seal */
		n = 1 + (int)(rnd(&w->s) % 4);
		k = (int)(rnd(&w->s) % HASHES);
		if (w->n + n > MAXHELD)
			goto release;
		r = kvc_alloc(w->c, w->pool, (uint32_t)n, b);
		if (r != n || restarted(w)) {
			unexpected(w, "alloc", r);
			return;
		}
		for (int i = 0; i < n; i++) {
			hh[i] = kvt_hash((uint64_t)((k + i) % HASHES));
			kvt_mem_fill(w->c, kvc_block_ptr(w->c, b[i]), BB, (uint64_t)((k + i) % HASHES));
		}
		r = kvc_seal(w->c, w->pool, b, hh, (size_t)n, out);
		if (r != n || restarted(w)) {
			unexpected(w, "seal", r);
			if (!restarted(w))
				(void)kvc_release(w->c, b, (size_t)n);
			return;
		}
		for (int i = 0; i < n; i++) {
			verify(w, out[i], (k + i) % HASHES);
			w->h[w->n++] = (struct held){ out[i], (k + i) % HASHES + 1 };
		}
	} else if (op < 58) {                             /* fork (n > 1 sampling) */
		if (w->n == MAXHELD)
			goto release;
		r = kvc_fork(w->c, &w->h[j].b, 1, out);
		if (r != 1 || restarted(w)) {
			unexpected(w, "fork", r);
			return;
		}
		w->h[w->n++] = w->h[j];
	} else if (op < 64) {                             /* copy on write */
		r = kvc_cow(w->c, &w->h[j].b, 1, out);
		if (r != 1 || restarted(w)) {
			unexpected(w, "cow", r);
			return;
		}
		if (w->h[j].k)
			verify(w, out[0], w->h[j].k - 1);
		w->h[j].b = out[0];  /* writable now; its bytes are still the content */
	} else if (op < 68) {                             /* preempt by swap, resume */
		uint64_t sw;
		int m = w->n < 4 ? w->n : 4, base = w->n - m, got;
		struct held keep[4];

		for (int i = 0; i < m; i++) {
			b[i] = w->h[base + i].b;
			keep[i] = w->h[base + i];
		}
		r = kvc_swap_out(w->c, b, (size_t)m, &sw);
		if (r < 0 || restarted(w)) {
			unexpected(w, "swap out", r);
			return;
		}
		w->n = base;  /* the handles are the daemon's now */
		got = kvc_swap_in(w->c, sw, out, 4);
		if (got < 0 || restarted(w)) {
			unexpected(w, "swap in", got);
			return;
		}
		for (int i = 0; i < got; i++) {
			if (keep[i].k)
				verify(w, out[i], keep[i].k - 1);
			w->h[w->n++] = (struct held){ out[i], keep[i].k };
		}
		w->swaps++;
	} else {
release:                                              /* release one to three */
		n = 1 + (int)(rnd(&w->s) % 3);
		if (n > w->n)
			n = w->n;
		for (int i = 0; i < n; i++)
			b[i] = w->h[w->n - n + i].b;
		r = kvc_release(w->c, b, (size_t)n);
		if (r < 0 && !restarted(w))
			unexpected(w, "release", r);
		else if (r == 0)
			w->n -= n;
	}
}

/* Connects and registers the pool, waiting out a daemon that restarts. */
static void join(struct wstate *w)
{
	struct kvc_pool_desc d = { .name = "soak", .block_bytes = BB, .block_tokens = 16,
				   .dtype = "fp16", .layout = "test", .layout_len = 4 };
	struct kvc_options o = { .client_name = "soak" };
	int r;

	for (int i = 0; (r = kvc_connect(NULL, &o, &w->c)) < 0; i++) {
		CHECK(i < 60000 && (r == -ECONNREFUSED || r == -ENOENT || gone(r)));
		poll(NULL, 0, 1);
	}
	for (int i = 0; (w->pool = kvc_register_pool(w->c, &d)) < 0; i++) {
		CHECK(i < 60000 && gone(w->pool));
		poll(NULL, 0, 1);
	}
	w->epoch = kvc_restarts(w->c);
}

static int worker(void *arg)
{
	struct wstate w = { .s = 0x9E3779B97F4A7C15ull * ((uint64_t)(intptr_t)arg + 1) };

	signal(SIGTERM, on_term);
	join(&w);
	while (!stop_flag) {
		step(&w);
		w.ops++;
		/* While the daemon is down calls fail at once: do not spin. */
		if (kvc_conn_broken(w.c))
			poll(NULL, 0, 1);
	}
	while (w.n > 0 && !restarted(&w)) {
		int r = kvc_release(w.c, &w.h[w.n - 1].b, 1);

		if (r < 0 && !gone(r) && !restarted(&w))
			unexpected(&w, "release at the end", r);
		w.n--;
	}
	kvc_close(w.c);
	return w.bad ? 2 : 0;
}

/* --- the supervisor -------------------------------------------------------- */

static long proc_rss_kib(pid_t pid)
{
	char path[64], line[256];
	long kib = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	if (!(f = fopen(path, "r")))
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

/* The daemon's open fds, not counting segment memfds (a segment's memory
 * is made when first used and remade for another namespace: that count
 * moves with the load, bounded by the pool's segments). */
static int proc_fds_print(pid_t pid, int print)
{
	char path[64], fd[320], target[256];
	struct dirent *e;
	DIR *d;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	if (!(d = opendir(path)))
		return -1;
	while ((e = readdir(d))) {
		ssize_t len;

		if (e->d_name[0] == '.')
			continue;
		snprintf(fd, sizeof(fd), "%s/%s", path, e->d_name);
		len = readlink(fd, target, sizeof(target) - 1);
		target[len > 0 ? len : 0] = 0;
		n += strncmp(target, "/memfd:", 7) != 0;
		if (print && strncmp(target, "/memfd:", 7))
			fprintf(stderr, "  fd %s -> %s\n", e->d_name, target);
	}
	closedir(d);
	return n;
}

static int proc_fds(pid_t pid)
{
	return proc_fds_print(pid, 0);
}

/* The daemon's fds (memfds aside) once it serves no session but the one
 * asking (whose socket is counted; every other connection, the harness's
 * short-lived ones included, is closed). */
static int quiet_fds(pid_t pid)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Stats st = KVCACHED__STATS__INIT;
	kvc_conn *c = kvt_connect(NULL);
	int n;

	rq.op_case = KVCACHED__REQUEST__OP_STATS;
	rq.stats = &st;
	for (int i = 0;; i++) {
		Kvcached__Response *rs = NULL;
		uint32_t sessions;

		CHECK_EQ(kvc_call(c, &rq, &rs), 0);
		sessions = rs->stats->sessions;
		kvcached__response__free_unpacked(rs, NULL);
		if (sessions == 1)
			break;
		CHECK(i < 6000);
		poll(NULL, 0, 10);
	}
	n = proc_fds(pid);
	kvc_close(c);
	return n;
}

/* n workers for a moment (each does 200 steps, then stops and releases). */
static int burst_worker(void *arg)
{
	struct wstate w = { .s = 77 + (uint64_t)(intptr_t)arg };

	join(&w);
	for (int i = 0; i < 200; i++)
		step(&w);
	while (w.n > 0) {
		CHECK_EQ(kvc_release(w.c, &w.h[w.n - 1].b, 1), 0);
		w.n--;
	}
	kvc_close(w.c);
	return w.bad ? 2 : 0;
}

static void burst(unsigned n)
{
	pid_t p[MAXWORKERS];

	for (unsigned i = 0; i < n; i++)
		p[i] = kvt_spawn(burst_worker, (void *)(intptr_t)i);
	for (unsigned i = 0; i < n; i++)
		CHECK_EQ(kvt_wait(p[i]), 0);
}

static void start(struct kvt_daemon *d, int again)
{
	/* Armed at every start: some write-backs and some reads of G3 fail. */
	setenv("KVCACHED_FAULTS", faults, 1);
	if (again)
		kvt_restart(d, "--pool-size", "4MiB", "--page-size", "64KiB", "--host-tier-size",
			    "4MiB", "--disk-path", disk, "--disk-size", "16MiB", "--writeback-low",
			    "25", "--writeback-high", "50", "--demote-low", "30", "--demote-high",
			    "60", NULL);
	else
		kvt_start(d, "--pool-size", "4MiB", "--page-size", "64KiB", "--host-tier-size",
			  "4MiB", "--disk-path", disk, "--disk-size", "16MiB", "--writeback-low",
			  "25", "--writeback-high", "50", "--demote-low", "30", "--demote-high", "60",
			  NULL);
	unsetenv("KVCACHED_FAULTS");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "seconds", required_argument, NULL, 's' },
		{ "workers", required_argument, NULL, 'w' },
		{ "restart-every", required_argument, NULL, 'r' },
		{ "kill-every", required_argument, NULL, 'k' },
		{ NULL, 0, NULL, 0 },
	};
	unsigned seconds = 20, nworkers = 64, restart_every = 7, kill_every = 2, id = 0;
	uint64_t t0, next_restart, next_kill, next_sample, s = 42, wrong = 0;
	long rss_max = 0, rss_limit_kib = (POOL_MIB + HOST_MIB + 64) * 1024;
	int fds_end, fds_burst, restarts = 0, kills = 0, opt;
	pid_t w[MAXWORKERS];
	struct kvt_daemon d;
	char dir[64];
	uint64_t wr, se, ca;

	while ((opt = getopt_long(argc, argv, "s:w:r:k:", opts, NULL)) != -1) {
		unsigned v = (unsigned)strtoul(optarg, NULL, 10);

		if (opt == 's')
			seconds = v;
		else if (opt == 'w')
			nworkers = v;
		else if (opt == 'r')
			restart_every = v;
		else if (opt == 'k')
			kill_every = v;
		else
			return 2;
	}
	if (nworkers == 0 || nworkers > MAXWORKERS || !seconds || !restart_every || !kill_every) {
		fprintf(stderr, "soak: --workers 1..%d, --seconds, --restart-every and "
			"--kill-every > 0\n", MAXWORKERS);
		return 2;
	}
	if (kvt_cuda())
		return 77;
	snprintf(dir, sizeof(dir), "/var/tmp/kvsoak-XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	snprintf(disk, sizeof(disk), "%s/g3", dir);
	snprintf(faults, sizeof(faults), "g3_write=EIO:skip=300:count=5,g3_read=EIO:skip=200:count=3");
	start(&d, 0);

	for (id = 0; id < nworkers; id++)
		w[id] = kvt_spawn(worker, (void *)(intptr_t)id);
	t0 = mono_ms();
	next_restart = t0 + restart_every * 1000ull;
	next_kill = t0 + kill_every * 1000ull;
	next_sample = t0;
	fprintf(stderr, "soak: %u workers for %u s; daemon killed every %u s, a worker every %u s\n",
		nworkers, seconds, restart_every, kill_every);
	while (mono_ms() < t0 + seconds * 1000ull) {
		uint64_t now = mono_ms();
		long rss;

		if (now >= next_sample) {
			rss = proc_rss_kib(d.pid);
			if (rss > rss_max)
				rss_max = rss;
			printf("t=%5.1fs daemon pid %d rss %ld KiB fds %d\n", (now - t0) / 1000.0,
			       (int)d.pid, rss, proc_fds(d.pid));
			fflush(stdout);
			next_sample = now + 1000;
		}
		if (now >= next_kill) {
			unsigned i = (unsigned)(rnd(&s) % nworkers);
			int st;

			kill(w[i], SIGKILL);
			st = kvt_wait(w[i]);
			CHECK(st == 128 + SIGKILL || st == 0);
			w[i] = kvt_spawn(worker, (void *)(intptr_t)(id++));
			kills++;
			next_kill = now + kill_every * 1000ull;
		}
		if (now >= next_restart) {
			start(&d, 1);
			restarts++;
			next_restart = mono_ms() + restart_every * 1000ull;
		}
		poll(NULL, 0, 50);
	}
	/* The end: every worker stops, releasing what it holds. */
	for (unsigned i = 0; i < nworkers; i++)
		kill(w[i], SIGTERM);
	for (unsigned i = 0; i < nworkers; i++) {
		int st = kvt_wait(w[i]);

		if (st != 0) {
			fprintf(stderr, "soak: a worker exited with %d%s\n", st,
				st == 2 ? " (it read wrong bytes or met an unexpected error)" : "");
			wrong++;
		}
	}
	/* Every session gone (the daemon has seen each disconnect), nothing
	 * moving between tiers: a quiet daemon. */
	kvt_tiers_settle();
	kvt_blocks_total(&wr, &se, &ca);
	fds_end = quiet_fds(d.pid);
	/* A burst of sessions that come and go leaves no fd behind. */
	burst(nworkers);
	kvt_tiers_settle();
	fds_burst = quiet_fds(d.pid);
	printf("soak: %u s, %d daemon restarts, %d workers killed, %llu workers failed\n", seconds,
	       restarts, kills, (unsigned long long)wrong);
	printf("soak: blocks left: %llu writable, %llu sealed, %llu cached\n",
	       (unsigned long long)wr, (unsigned long long)se, (unsigned long long)ca);
	printf("soak: daemon RSS at most %ld KiB (bound %ld KiB); fds with no worker %d, after "
	       "another %u sessions came and went %d\n", rss_max, rss_limit_kib, fds_end,
	       nworkers, fds_burst);
	CHECK_EQ(wrong, 0);
	CHECK_EQ(wr, 0);
	CHECK_EQ(se, 0);
	CHECK_EQ(kvt_check(), 0);
	CHECK(rss_max <= rss_limit_kib);
	if (fds_burst != fds_end) {
		fprintf(stderr, "soak: the daemon's fds after the burst:\n");
		proc_fds_print(d.pid, 1);
	}
	CHECK_EQ(fds_burst, fds_end);
	kvt_stop(&d);
	kvt_rm_disk(dir, disk);
	return 0;
}
