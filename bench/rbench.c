/* redis-benchmark beside a client on a harness cluster: rbench.h. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rbench.h"

#define GB 1e9

const char *rb_prog = "rbench";
const char *rb_bin;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "%s: ", rb_prog);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

uint64_t rb_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

size_t rb_parse_size(const char *s, size_t lo, size_t hi, size_t align)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 10);

	if (end == s)
		die("bad size %s", s);
	if (*end == 'k' || *end == 'K')
		v <<= 10, end++;
	else if (*end == 'm' || *end == 'M')
		v <<= 20, end++;
	if (*end || v < lo || v > hi || v % align)
		die("bad size %s (%zu to %zu bytes, a multiple of %zu)", s, lo, hi, align);
	return (size_t)v;
}

void rb_size_str(size_t n, char *out, size_t len)
{
	if (n >= (1u << 20) && !(n & ((1u << 20) - 1)))
		snprintf(out, len, "%zu MiB", n >> 20);
	else if (n >= 1024 && !(n & 1023))
		snprintf(out, len, "%zu KiB", n >> 10);
	else
		snprintf(out, len, "%zu B", n);
}


/* ---- the cluster, through the harness's own connections ---- */

redisReply *rb_node_cmd(struct kvt_rc *c, int i, const char *command)
{
	redisContext *ctx = kvt_rc_connect(c, i);
	redisReply *r;

	if (!ctx)
		die("cannot connect to node %d (port %d)", i, c->node[i].port);
	r = redisCommand(ctx, command);
	redisFree(ctx);
	if (!r || r->type == REDIS_REPLY_ERROR)
		die("%s failed", command);
	return r;
}

void rb_flush_all(struct kvt_rc *c)
{
	for (int i = 0; i < c->n; i++)
		if (kvt_rc_is_master(c, i))
			freeReplyObject(rb_node_cmd(c, i, "FLUSHALL"));
	if (c->replicas && kvt_rc_wait_replicated(c, KVT_RC_WAIT_MS))
		die("replicas did not catch up after FLUSHALL");
}

static unsigned long long info_num(const char *info, const char *field)
{
	const char *p = strstr(info, field);

	return p ? strtoull(p + strlen(field), NULL, 10) : 0;
}

/* Sum of keyspace_hits and keyspace_misses over the masters. */
static void hit_counters(struct kvt_rc *c, unsigned long long *hits, unsigned long long *misses)
{
	*hits = *misses = 0;
	for (int i = 0; i < c->n; i++) {
		redisReply *r;

		if (!kvt_rc_is_master(c, i))
			continue;
		r = rb_node_cmd(c, i, "INFO stats");
		*hits += info_num(r->str, "keyspace_hits:");
		*misses += info_num(r->str, "keyspace_misses:");
		freeReplyObject(r);
	}
}

int rb_a_master(struct kvt_rc *c)
{
	for (int i = 0; i < c->n; i++)
		if (kvt_rc_is_master(c, i))
			return i;
	die("no master");
}

/* ---- redis-benchmark ---- */

/* Runs redis-benchmark with argv (argv[0] left for the program), its
 * output (stdout and stderr) into out. Returns its exit status, -1 if it
 * did not run. */
static int run_benchmark(char **argv, char *out, size_t len)
{
	int fd[2], st;
	size_t used = 0;
	pid_t pid;

	argv[0] = (char *)rb_bin;
	if (pipe(fd) < 0)
		return -1;
	fflush(NULL);
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(fd[1], 1);
		dup2(fd[1], 2);
		close(fd[0]);
		close(fd[1]);
		execv(rb_bin, argv);
		_exit(127);
	}
	close(fd[1]);
	for (;;) {
		char sink[4096];
		ssize_t n;

		/* Keep the tail when the progress lines outgrow out. */
		if (used + 1 >= len) {
			memmove(out, out + len / 2, used - len / 2);
			used -= len / 2;
		}
		n = read(fd[0], used + 1 < len ? out + used : sink,
			 used + 1 < len ? len - 1 - used : sizeof(sink));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		used += (size_t)n;
	}
	out[used] = 0;
	close(fd[0]);
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* From the last "GET: R requests per second, p50=L msec" in out: R, and L
 * in *p50_ms; 0 if none. */
static double parse_rps(const char *out, double *p50_ms)
{
	const char *p, *last = NULL, *q;

	for (p = out; (p = strstr(p, " requests per second")); p++)
		last = p;
	if (!last)
		return 0;
	q = strstr(last, "p50=");
	*p50_ms = q ? strtod(q + 4, NULL) : 0;
	for (q = last; q > out && (q[-1] == '.' || (q[-1] >= '0' && q[-1] <= '9')); q--)
		;
	return strtod(q, NULL);
}

/* redis-benchmark's tags: one SET run of its own with -r 1 leaves one key
 * "key:{T}:000000000000" on each master it used. -c 3 --threads 1 puts a
 * connection on each master, on one event loop that lets each send its
 * first request before any gets an answer (with a thread per connection, a
 * late thread may find the run over, as happened here under load). */
int rb_learn_tags(struct kvt_rc *c, const char *port, char tags[RB_MASTERS][8])
{
	char *argv[] = { NULL, "--cluster", "-h", "127.0.0.1", "-p", (char *)port, "-t", "set",
			 "-n", "300", "-c", "3", "--threads", "1", "-r", "1", "-d", "1", "-q",
			 NULL };
	static char out[1 << 16];
	int st, n = 0;

	st = run_benchmark(argv, out, sizeof(out));
	if (st != 0) {
		fprintf(stderr, "%s: redis-benchmark (status %d) said:\n%s\n", rb_prog, st, out);
		return -1;
	}
	for (int i = 0; i < c->n; i++) {
		redisReply *r;

		if (!kvt_rc_is_master(c, i))
			continue;
		r = rb_node_cmd(c, i, "KEYS key:*");
		for (size_t k = 0; k < r->elements && n < RB_MASTERS; k++) {
			const char *s = r->element[k]->str;

			/* "key:" "{" 3 bytes "}" ":" 12 digits; a tag of 1 or 2 bytes
			 * is padded with '}' ("{ab}}"): the 5 bytes are taken as they are. */
			if (r->element[k]->len != 22 || strncmp(s, "key:{", 5) ||
			    strcmp(s + 9, ":000000000000"))
				continue;
			snprintf(tags[n++], 8, "%.5s", s + 4);
		}
		freeReplyObject(r);
	}
	if (n != RB_MASTERS) {
		fprintf(stderr, "%s: found %d redis-benchmark key tags, not %d\n", rb_prog, n,
			RB_MASTERS);
		return -1;
	}
	rb_flush_all(c);
	return 0;
}


void rb_label(const struct rb_conf *r, char *out, size_t len)
{
	if (r->threads)
		snprintf(out, len, "-c %d -P %d --threads %d", r->clients, r->pipeline, r->threads);
	else
		snprintf(out, len, "-c %d -P %d", r->clients, r->pipeline);
}

void rb_run(struct kvt_rc *c, const char *port, const struct rb_conf *conf, const char *test,
	    size_t size, size_t n, size_t keyspace, struct rb_result *res)
{
	char sz[24], nn[24], cc[24], pp[24], rr[24], tt[24], label[64];
	char *argv[24];
	static char out[1 << 16];
	unsigned long long h0, m0, h1, m1;
	int a = 1, st;
	uint64_t t0;

	snprintf(sz, sizeof(sz), "%zu", size);
	/* A multiple of the pipeline: redis-benchmark sends whole pipelines
	 * while fewer than -n requests have gone out. */
	n = (n + (size_t)conf->pipeline - 1) / (size_t)conf->pipeline * (size_t)conf->pipeline;
	snprintf(nn, sizeof(nn), "%zu", n);
	snprintf(cc, sizeof(cc), "%d", conf->clients);
	snprintf(pp, sizeof(pp), "%d", conf->pipeline);
	snprintf(rr, sizeof(rr), "%zu", keyspace);
	snprintf(tt, sizeof(tt), "%d", conf->threads);
	argv[a++] = "--cluster";
	argv[a++] = "-h"; argv[a++] = "127.0.0.1";
	argv[a++] = "-p"; argv[a++] = (char *)port;
	argv[a++] = "-t"; argv[a++] = (char *)test;
	argv[a++] = "-d"; argv[a++] = sz;
	argv[a++] = "-n"; argv[a++] = nn;
	argv[a++] = "-c"; argv[a++] = cc;
	argv[a++] = "-P"; argv[a++] = pp;
	argv[a++] = "-r"; argv[a++] = rr;
	if (conf->threads) {
		argv[a++] = "--threads";
		argv[a++] = tt;
	}
	argv[a++] = "-q";
	argv[a] = NULL;

	memset(res, 0, sizeof(*res));
	hit_counters(c, &h0, &m0);
	t0 = now_ns();
	st = run_benchmark(argv, out, sizeof(out));
	res->wall_s = (double)(now_ns() - t0) / 1e9;
	hit_counters(c, &h1, &m1);
	res->hits = h1 - h0;
	res->misses = m1 - m0;
	res->rps = parse_rps(out, &res->p50_ms);
	res->gbs = res->rps * (double)size / GB;
	res->ok = st == 0 && res->rps > 0;
	rb_label(conf, label, sizeof(label));
	if (!res->ok)
		fprintf(stderr, "%s: redis-benchmark %s (status %d) said:\n%s\n", rb_prog, label,
			st, out);
}

int rb_key_name(char *out, size_t len, const char *tags, size_t i, size_t per_tag)
{
	return snprintf(out, len, "key:%.5s:%012zu", tags + (i / per_tag) * 8, i % per_tag);
}
