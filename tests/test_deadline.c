/* Deadlines (kvcache.h, "Deadlines"): a daemon stopped with SIGSTOP takes
 * every call that reaches it past its deadline, and each returns -ETIMEDOUT
 * instead of hanging; once the daemon runs again the next call reconnects
 * and works, and what the dropped connections held is released.
 *
 * While the daemon is stopped, each on a connection of its own (so that each
 * is that connection's first call past a deadline, not one the reconnection
 * backoff answers at once): kvc_connect(), kvc_alloc(), kvc_lookup(),
 * kvc_seal() and kvc_release() of blocks held from before, the
 * registration of a pool, kvc_call() (Stats), kvc_alloc() with the default
 * deadline from $KVCACHE_TIMEOUT_MS; each returns -ETIMEDOUT, no
 * sooner than its deadline and well within a generous bound, with a
 * message. A second call on one of them returns -ETIMEDOUT (its
 * reconnection timed out) or -EPIPE (the backoff), at once or within its
 * deadline. kvc_close() of a connection holding blocks returns.
 *
 * Two threads on one connection: one's call waits for the stopped daemon
 * (a long deadline); the other, with a short one set meanwhile
 * (kvc_set_timeout()), waits for the first's call to end and returns
 * -ETIMEDOUT from that wait, the first still in its call, and the
 * connection is untouched: after SIGCONT the first call gets its answer.
 *
 * After SIGCONT: the daemon counts only the live sessions and holds no
 * block for any of them (the dropped ones' references are gone); each
 * connection's next call reconnects (kvc_restarts() moved by one) and
 * works; a handle from before is stale (KVC_ESTALE); the invariant check
 * passes.
 *
 * Without deadlines the first call hangs and the test's own timeout fails
 * it. Also in suite 'threads' (scripts/test --tsan). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "harness.h"

#define BB 4096
#define TMO 300           /* ms: the calls' deadline while the daemon is stopped */
#define BOUND_MS 30000    /* a call past its deadline returns well before this */
#define LONG_TMO 60000    /* ms: the first thread's call, which outlives the stop */
#define WAIT_MS 60000

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

/* The state letter of /proc/PID/stat ('T' once stopped). */
static char proc_state(pid_t pid)
{
	char path[64], buf[512], *p;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	CHECK(f != NULL);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	p = strrchr(buf, ')');
	CHECK(p && p[1] == ' ');
	return p[2];
}

/* Waits until the process is stopped (or no longer). */
static void wait_stopped(pid_t pid, int stopped)
{
	uint64_t deadline = now_ms() + WAIT_MS;

	while ((proc_state(pid) == 'T') != stopped && now_ms() < deadline)
		sleep_ms(5);
	CHECK_EQ(proc_state(pid) == 'T', stopped);
}

/* Checks that a call that began at t0 failed past its deadline: r is
 * -ETIMEDOUT, it took at least TMO ms (a deadline cannot pass early) and
 * returned within the bound, and c (if any) says why. */
static void check_timed_out(const char *what, int r, uint64_t t0, kvc_conn *c)
{
	uint64_t dt = now_ms() - t0;

	fprintf(stderr, "%s: %s after %llu ms%s%s\n", what, kvc_strerror(r),
		(unsigned long long)dt, c ? ": " : "", c ? kvc_last_error(c) : "");
	CHECK_EQ(r, -ETIMEDOUT);
	CHECK(dt + 1 >= TMO);
	CHECK(dt < BOUND_MS);
	if (c)
		CHECK(*kvc_last_error(c));
}

static kvc_conn *conn_tmo(int pool_name_too, int *pool)
{
	kvc_conn *c = kvt_connect(NULL);

	if (pool_name_too)
		*pool = kvt_pool(c, "dl", BB);
	return c;
}

static Kvcached__Response *stats_on(kvc_conn *c, int *r)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Stats st = KVCACHED__STATS__INIT;
	Kvcached__Response *rs = NULL;

	rq.op_case = KVCACHED__REQUEST__OP_STATS;
	rq.stats = &st;
	*r = kvc_call(c, &rq, &rs);
	return rs;
}

/* --- two threads on one connection --------------------------------------- */

struct first {
	kvc_conn *c;
	int pool;
	kvc_block b;
	int r;
	atomic_int started, done;
	pid_t tid;
};

static void *first_thread(void *arg)
{
	struct first *f = arg;

	f->tid = gettid();
	atomic_store(&f->started, 1);
	f->r = kvc_alloc(f->c, f->pool, 1, &f->b);
	atomic_store(&f->done, 1);
	return NULL;
}

/* Whether thread tid of this process is in poll() (x86-64: 7; aarch64 has
 * ppoll only, 73): the first thread's call waits for the daemon there. */
static int in_poll(pid_t tid)
{
	char path[64], buf[64];
	FILE *f;
	long nr = -1;

	snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", (int)tid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	if (fgets(buf, sizeof(buf), f))
		nr = strtol(buf, NULL, 10);
	fclose(f);
#if defined(__x86_64__)
	return nr == 7 || nr == 271;
#else
	return nr == 73;
#endif
}

int main(void)
{
	struct kvt_daemon d;
	struct kvc_options o = { .client_name = "deadline", .timeout_ms = TMO };
	kvc_conn *ca, *cl, *cs, *cr, *cg, *cst, *cc, *ct, *ce, *nc = NULL;
	int pa, pl, ps, pr, pc, pt, pe, r;
	kvc_block b[4], held_s, held_r[2], held_c[2], bl[2];
	kvc_hash h[2] = { kvt_hash(1), kvt_hash(2) }, hs = kvt_hash(3);
	uint64_t t0, w, s, cached, rs0[8];
	struct first f = { 0 };
	pthread_t th;
	Kvcached__Response *resp;

	kvt_start(&d, NULL);

	/* A chain of two sealed blocks for the lookup to hit. */
	{
		kvc_conn *c = kvt_connect(NULL);
		int p = kvt_pool(c, "dl", BB);

		CHECK_EQ(kvc_alloc(c, p, 2, b), 2);
		CHECK_EQ(kvc_seal(c, p, b, h, 2, b), 2);
		CHECK_EQ(kvc_release(c, b, 2), 0);
		kvc_close(c);
	}
	ca = conn_tmo(1, &pa);
	cl = conn_tmo(1, &pl);
	cs = conn_tmo(1, &ps);
	cr = conn_tmo(1, &pr);
	cg = conn_tmo(0, NULL);
	cst = conn_tmo(0, NULL);
	cc = conn_tmo(1, &pc);
	ct = conn_tmo(1, &pt);
	/* The default deadline from the environment (kvc_options.timeout_ms 0). */
	CHECK(setenv("KVCACHE_TIMEOUT_MS", "300", 1) == 0);
	ce = conn_tmo(1, &pe);
	CHECK(unsetenv("KVCACHE_TIMEOUT_MS") == 0);
	/* Held across the stop: released by the daemon when it sees the
	 * connections dropped. */
	CHECK_EQ(kvc_alloc(cs, ps, 1, &held_s), 1);
	CHECK_EQ(kvc_alloc(cr, pr, 2, held_r), 2);
	CHECK_EQ(kvc_alloc(cc, pc, 2, held_c), 2);
	CHECK_EQ(kvc_lookup(cl, pl, h, 2, bl), 2);
	kvc_conn *all[] = { ca, cl, cs, cr, cg, cst, ct };
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		CHECK_EQ(kvc_set_timeout(all[i], TMO), 0);
		rs0[i] = kvc_restarts(all[i]);
	}
	CHECK_EQ(kvc_set_timeout(NULL, TMO), -EINVAL);
	CHECK_EQ(kvc_set_timeout(ct, LONG_TMO), 0);

	CHECK(kill(d.pid, SIGSTOP) == 0);
	wait_stopped(d.pid, 1);

	/* kvc_connect(): the Hello goes unanswered. */
	t0 = now_ms();
	r = kvc_connect(d.sock, &o, &nc);
	check_timed_out("connect", r, t0, NULL);
	CHECK(nc == NULL);

	t0 = now_ms();
	r = kvc_alloc(ca, pa, 2, b);
	check_timed_out("alloc", r, t0, ca);
	t0 = now_ms();
	r = kvc_lookup(cl, pl, h, 2, b);
	check_timed_out("lookup", r, t0, cl);
	t0 = now_ms();
	r = kvc_seal(cs, ps, &held_s, &hs, 1, b);
	check_timed_out("seal", r, t0, cs);
	t0 = now_ms();
	r = kvc_release(cr, held_r, 2);
	check_timed_out("release", r, t0, cr);
	{
		struct kvc_pool_desc pd = { .name = "dl2", .block_bytes = BB, .block_tokens = 16,
					    .dtype = "fp16" };

		t0 = now_ms();
		r = kvc_register_pool(cg, &pd);
		check_timed_out("register_pool", r, t0, cg);
	}
	t0 = now_ms();
	resp = stats_on(cst, &r);
	check_timed_out("stats", r, t0, cst);
	CHECK(resp == NULL);
	t0 = now_ms();
	r = kvc_alloc(ce, pe, 1, b);
	check_timed_out("alloc, $KVCACHE_TIMEOUT_MS", r, t0, ce);

	/* A second call on a dropped connection: its reconnection times out
	 * (-ETIMEDOUT), or the backoff answers at once (-EPIPE). */
	for (int i = 0; i < 3; i++) {
		t0 = now_ms();
		r = kvc_alloc(ca, pa, 1, b);
		fprintf(stderr, "alloc again: %s after %llu ms: %s\n", kvc_strerror(r),
			(unsigned long long)(now_ms() - t0), kvc_last_error(ca));
		CHECK(r == -ETIMEDOUT || r == -EPIPE);
		CHECK(now_ms() - t0 < BOUND_MS);
	}

	/* kvc_close() of a connection that holds blocks. */
	t0 = now_ms();
	kvc_close(cc);
	CHECK(now_ms() - t0 < BOUND_MS);

	/* Two threads: the first waits for the daemon (LONG_TMO), the second
	 * for the first (TMO). */
	f.c = ct;
	f.pool = pt;
	CHECK(pthread_create(&th, NULL, first_thread, &f) == 0);
	{
		uint64_t deadline = now_ms() + WAIT_MS;

		while (!(atomic_load(&f.started) && in_poll(f.tid)) && now_ms() < deadline)
			sleep_ms(2);
		CHECK(atomic_load(&f.started) && in_poll(f.tid));
	}
	CHECK_EQ(kvc_set_timeout(ct, TMO), 0);
	t0 = now_ms();
	r = kvc_lookup(ct, pt, h, 2, b);
	check_timed_out("lookup, second thread", r, t0, ct);
	CHECK(strstr(kvc_last_error(ct), "another thread"));
	CHECK(!atomic_load(&f.done));

	CHECK(kill(d.pid, SIGCONT) == 0);
	wait_stopped(d.pid, 0);

	/* The first thread's call is answered on the connection the second
	 * left alone. */
	CHECK(pthread_join(th, NULL) == 0);
	CHECK_EQ(f.r, 1);
	CHECK_EQ(kvc_restarts(ct), rs0[6]);
	CHECK_EQ(kvc_release(ct, &f.b, 1), 0);

	/* The dropped connections are gone in the daemon, and all they held:
	 * 7 live sessions (ca..cst's old ones and cc's closed; ct lives) ->
	 * only ct's. */
	kvt_wait_sessions(1);
	kvt_blocks_total(&w, &s, &cached);
	CHECK_EQ(w, 0);
	CHECK_EQ(s, 0);

	/* Each dropped connection's next call reconnects and works. */
	CHECK_EQ(kvc_alloc(cl, pl, 1, b), 1);
	CHECK_EQ(kvc_release(cl, b, 1), 0);
	CHECK_EQ(kvc_restarts(cl), rs0[1] + 1);
	CHECK_EQ(kvc_lookup(cs, ps, h, 2, b), 2);
	CHECK_EQ(kvc_release(cs, b, 2), 0);
	CHECK_EQ(kvc_restarts(cs), rs0[2] + 1);
	/* A handle from before the drop is stale. */
	CHECK_EQ(kvc_release(cr, held_r, 2), KVC_ESTALE);
	CHECK_EQ(kvc_restarts(cr), rs0[3] + 1);
	{
		struct kvc_pool_desc pd = { .name = "dl2", .block_bytes = BB, .block_tokens = 16,
					    .dtype = "fp16" };

		CHECK(kvc_register_pool(cg, &pd) >= 0);
		CHECK_EQ(kvc_restarts(cg), rs0[4] + 1);
	}
	resp = stats_on(cst, &r);
	CHECK_EQ(r, 0);
	kvcached__response__free_unpacked(resp, NULL);
	CHECK_EQ(kvc_restarts(cst), rs0[5] + 1);
	/* ca's reconnection backed off: within the backoff (at most 2 s),
	 * -EPIPE at once, then it works. */
	{
		uint64_t deadline = now_ms() + WAIT_MS;

		while ((r = kvc_alloc(ca, pa, 1, b)) == -EPIPE && now_ms() < deadline)
			sleep_ms(10);
		CHECK_EQ(r, 1);
		CHECK_EQ(kvc_release(ca, b, 1), 0);
		CHECK_EQ(kvc_restarts(ca), rs0[0] + 1);
	}
	/* And a fresh connection with the short deadline. */
	CHECK_EQ(kvc_connect(d.sock, &o, &nc), 0);
	CHECK_EQ(kvc_alloc(nc, kvt_pool(nc, "dl", BB), 1, b), 1);
	kvc_close(nc);

	kvc_close(ca);
	kvc_close(cl);
	kvc_close(cs);
	kvc_close(cr);
	kvc_close(cg);
	kvc_close(cst);
	kvc_close(ct);
	CHECK_EQ(kvc_alloc(ce, pe, 1, b), 1);
	kvc_close(ce);
	kvt_wait_sessions(0);
	kvt_blocks_total(&w, &s, &cached);
	CHECK_EQ(w, 0);
	CHECK_EQ(s, 0);
	CHECK_EQ(kvt_check(), 0);
	kvt_stop(&d);
	printf("deadline: ok\n");
	return 0;
}
