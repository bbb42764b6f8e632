/* G4 against a node that drips (issue 36): kvcached daemons and a scripted
 * Redis Cluster of two nodes, a process of this test (a thread per
 * connection) that speaks enough RESP (CLUSTER SLOTS, AUTH, SET, GETRANGE)
 * to be a G4 store, and that can send a reply one byte at a time, a byte every DRIP_MS, well inside
 * remote_timeout, so that a silence timeout never fires. Before issue 36 a
 * value sent that way held the one read thread (every tenant's G4 lookups)
 * for as long as the node liked, SIGTERM did not stop the daemon, and a
 * slot map sent that way held a lookup for as long as it took.
 *
 *   value:   namespace "drip" (its own remote_user, so its own
 *            connections) asks for a chain whose values the nodes drip; while
 *            its lookup is held, "other"'s lookups of chains of its own, on
 *            the same daemon and nodes, are timed: each must be served whole
 *            within BOUND_MS (remote_fetch_timeout is FETCH_MS; the drip would
 *            last 20 minutes); the dripped lookup itself ends within it too;
 *   sigterm: a daemon whose deadlines are long (remote_timeout 20 s) with a
 *            lookup held on a drip gets SIGTERM: it exits, status 0, within
 *            drain_timeout (1 s) and SLACK_MS;
 *   map:     node 0 drips its CLUSTER SLOTS answer (2 KB, 40 s): a fresh
 *            daemon's first lookup is served whole within BOUND_MS (node 1's
 *            map wins; nothing waits for node 0's).
 * Bounds are loose beside the deadlines (a busy 2-core machine, ASan): the
 * point is that the lookups are served, not held. Each timed wait is a child
 * process waited for with a deadline, so that a held lookup fails the test
 * at once. The figures are printed. KVT_G4_BEFORE=1 with KVCACHED_BIN of a
 * kvcached before issue 36 (no remote_min_rate, remote_fetch_timeout,
 * remote_readers, remote_auth): those keys left out, and what is held is
 * printed ("held more than N ms") instead of failing.
 * Needs no Redis; exit 77 only without hiredis. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "kvconfig.h"

#if !KV_HAVE_HIREDIS
int main(void)
{
	SKIP("built without hiredis: no G4");
}
#else
#include <errno.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>

#define BB 65536u
#define N 8
#define DRIP_MS 20
#define FETCH_MS 3000
#define BOUND_MS 10000
#define SLACK_MS 4000
#define WRITE_MS 2000

/* ---- the scripted cluster ---- */

struct entry {
	char *key, *val;
	size_t klen, vlen;
};

static pthread_mutex_t store_lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry store[256];
static int nstore;
static int port[2];
/* What the test's process sets and the nodes' process reads: in memory
 * both share (mmap() before the fork). The nodes run in a process of their
 * own so that the test's process has no thread when it forks its timed
 * children: a fork() while another thread held an allocator lock left the
 * child waiting on it for ever (under ASan, 1 run in 12-24 on a loaded
 * machine: "held more than 10000 ms", the child stuck in ASan's
 * SizeClassAllocator64 in its first malloc(), as gdb showed). */
struct shared {
	atomic_int stop, drip_values, drip_map_node, dripping, drip_sets;
	atomic_llong drips_started;
};
static struct shared *sh;

struct client {
	int fd, node;
	char *buf;
	size_t len, cap;
};

static int put(int fd, const void *s, size_t n)
{
	const char *p = s;

	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);

		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Sends n bytes one at a time, DRIP_MS apart, until done, the peer goes or
 * the test stops. Returns -1 when it did not finish. */
static int drip(int fd, const char *p, size_t n)
{
	struct timespec ts = { 0, DRIP_MS * 1000000L };
	int r = 0;

	sh->dripping++;
	sh->drips_started++;
	for (size_t i = 0; i < n && !r; i++) {
		if (sh->stop || put(fd, p + i, 1) < 0)
			r = -1;
		else
			nanosleep(&ts, NULL);
	}
	sh->dripping--;
	return r;
}

/* A SET's reply that never ends, sent just above the rate floor of the
 * write phase (remote_min_rate 1 KiB/s): a status line of 'O's, 40 bytes
 * every DRIP_MS (2 KB/s), until the peer goes, the test stops or the phase
 * ends. Returns -1 (the connection is done for). */
static int drip_status(int fd)
{
	struct timespec ts = { 0, DRIP_MS * 1000000L };
	char b[40];

	memset(b, 'O', sizeof(b));
	b[0] = '+';
	sh->dripping++;
	sh->drips_started++;
	for (size_t i = 0; !sh->stop && sh->drip_sets; i++) {
		if (put(fd, i ? b + 1 : b, i ? sizeof(b) - 1 : sizeof(b)) < 0)
			break;
		nanosleep(&ts, NULL);
	}
	sh->dripping--;
	return -1;
}

/* The map: node 0 serves slots 0-8191, node 1 the rest. Each entry names
 * 20 replicas (ignored by the client), so that the answer is ~2 KB. */
static size_t make_map(char *b, size_t len)
{
	size_t n = (size_t)snprintf(b, len, "*2\r\n");

	for (int i = 0; i < 2; i++) {
		n += (size_t)snprintf(b + n, len - n, "*23\r\n:%d\r\n:%d\r\n*3\r\n$9\r\n127.0.0.1\r\n"
				      ":%d\r\n$40\r\n%040d\r\n", i ? 8192 : 0, i ? 16383 : 8191,
				      port[i], i);
		for (int r = 0; r < 20; r++)
			n += (size_t)snprintf(b + n, len - n, "*3\r\n$9\r\n127.0.0.1\r\n:1\r\n"
					      "$40\r\n%040d\r\n", 100 + r);
	}
	return n;
}

static struct entry *find(const char *k, size_t kl)
{
	for (int i = 0; i < nstore; i++)
		if (store[i].klen == kl && !memcmp(store[i].key, k, kl))
			return &store[i];
	return NULL;
}

static long parse_cmd(struct client *c, int *argc, const char **argv, size_t *lens)
{
	char *p = c->buf, *end = c->buf + c->len, *nl;
	long n, i, len;

	if (!c->len)
		return 0;
	if (*p != '*')
		return -1;
	if (!(nl = memchr(p, '\n', c->len)))
		return 0;
	n = strtol(p + 1, NULL, 10);
	if (n < 1 || n > 8)
		return -1;
	p = nl + 1;
	for (i = 0; i < n; i++) {
		if (p >= end)
			return 0;
		if (*p != '$')
			return -1;
		if (!(nl = memchr(p, '\n', (size_t)(end - p))))
			return 0;
		len = strtol(p + 1, NULL, 10);
		if (len < 0)
			return -1;
		p = nl + 1;
		if (end - p < len + 2)
			return 0;
		argv[i] = p;
		lens[i] = (size_t)len;
		p += len + 2;
	}
	*argc = (int)n;
	return p - c->buf;
}

#define ARG_IS(i, s) (lens[i] == strlen(s) && !strncasecmp(argv[i], s, lens[i]))

/* Answers one command; -1 to hang up. The map is made per answer, in a
 * buffer of this thread's own: every connection has a thread, a map fetch
 * asks both nodes at once, and a node drips its map for a minute, so a
 * buffer shared by the threads was rewritten under a send (each snprintf()
 * leaves a NUL where the next entry starts): the daemon got a map with a
 * NUL for a type byte, gave the node up as it should, and the test failed
 * (under ASan, whose slower snprintf() widened the window, 5-6 runs in 12:
 * a node's keys errors, "1 of 8", a fill phase's write errors, a map
 * lookup that waited out the dripping node's grace). */
static int answer(struct client *c, int argc, const char **argv, const size_t *lens)
{
	char map[8192];
	char hdr[64];

	if (ARG_IS(0, "AUTH") || ARG_IS(0, "ASKING"))
		return put(c->fd, "+OK\r\n", 5);
	if (ARG_IS(0, "CLUSTER")) {
		size_t n = make_map(map, sizeof(map));

		return sh->drip_map_node == c->node ? drip(c->fd, map, n) : put(c->fd, map, n);
	}
	if (ARG_IS(0, "SET") && argc >= 3 && sh->drip_sets && memmem(argv[1], lens[1], ":drip:", 6))
		return drip_status(c->fd);   /* not stored: a write that never finishes */
	if (ARG_IS(0, "SET") && argc >= 3) {
		struct entry *e;

		pthread_mutex_lock(&store_lock);
		if (!(e = find(argv[1], lens[1]))) {
			CHECK(nstore < 256);
			e = &store[nstore++];
			e->key = malloc(lens[1]);
			CHECK(e->key != NULL);
			memcpy(e->key, argv[1], lens[1]);
			e->klen = lens[1];
		}
		free(e->val);
		e->val = malloc(lens[2] ? lens[2] : 1);
		CHECK(e->val != NULL);
		memcpy(e->val, argv[2], lens[2]);
		e->vlen = lens[2];
		pthread_mutex_unlock(&store_lock);
		return put(c->fd, "+OK\r\n", 5);
	}
	if ((ARG_IS(0, "GETRANGE") && argc == 4) || (ARG_IS(0, "GET") && argc == 2)) {
		size_t want = argc == 4 ? (size_t)strtoul(argv[3], NULL, 10) + 1 : SIZE_MAX;
		char *v = NULL;
		size_t n = 0;
		int dr, r;

		pthread_mutex_lock(&store_lock);
		struct entry *e = find(argv[1], lens[1]);

		if (e) {
			n = e->vlen < want ? e->vlen : want;
			v = malloc(n + 64);
			CHECK(v != NULL);
			int h = snprintf(v, 64, "$%zu\r\n", n);

			memmove(v + h, e->val, n);
			memcpy(v + h + n, "\r\n", 2);
			n += (size_t)h + 2;
		}
		pthread_mutex_unlock(&store_lock);
		if (!v) {
			snprintf(hdr, sizeof(hdr), argc == 4 ? "$0\r\n\r\n" : "$-1\r\n");
			return put(c->fd, hdr, strlen(hdr));
		}
		dr = sh->drip_values && memmem(argv[1], lens[1], ":drip:", 6);
		r = dr ? drip(c->fd, v, n) : put(c->fd, v, n);
		free(v);
		return r;
	}
	return put(c->fd, "-ERR unknown\r\n", 14);
}

static void *serve_conn(void *arg)
{
	struct client *c = arg;

	while (!sh->stop) {
		struct pollfd p = { .fd = c->fd, .events = POLLIN };
		const char *argv[8];
		size_t lens[8];
		long used;
		int argc, bye = 0;
		ssize_t r;

		if (poll(&p, 1, 20) <= 0)
			continue;
		if (c->len == c->cap) {
			c->cap *= 2;
			CHECK((c->buf = realloc(c->buf, c->cap)) != NULL);
		}
		if ((r = read(c->fd, c->buf + c->len, c->cap - c->len)) <= 0)
			break;
		c->len += (size_t)r;
		while (!bye && (used = parse_cmd(c, &argc, argv, lens)) > 0) {
			bye = answer(c, argc, argv, lens) < 0;
			memmove(c->buf, c->buf + used, c->len - (size_t)used);
			c->len -= (size_t)used;
		}
		if (bye || used < 0)
			break;
	}
	close(c->fd);
	free(c->buf);
	free(c);
	return NULL;
}

static void *server(void *arg)
{
	int node = (int)(intptr_t)arg, lfd;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t alen = sizeof(a);
	static int lfds[2];

	if (!lfds[node]) {
		CHECK((lfd = socket(AF_INET, SOCK_STREAM, 0)) >= 0);
		CHECK(bind(lfd, (struct sockaddr *)&a, sizeof(a)) == 0);
		CHECK(listen(lfd, 64) == 0);
		CHECK(getsockname(lfd, (struct sockaddr *)&a, &alen) == 0);
		port[node] = ntohs(a.sin_port);
		lfds[node] = lfd;
		return NULL;
	}
	lfd = lfds[node];
	while (!sh->stop) {
		struct pollfd p = { .fd = lfd, .events = POLLIN };
		struct client *c;
		pthread_t t;
		int fd;

		if (poll(&p, 1, 20) <= 0 || (fd = accept(lfd, NULL, NULL)) < 0)
			continue;
		CHECK((c = calloc(1, sizeof(*c))) != NULL);
		c->fd = fd;
		c->node = node;
		c->cap = 1 << 17;
		CHECK((c->buf = malloc(c->cap)) != NULL);
		CHECK(pthread_create(&t, NULL, serve_conn, c) == 0);
		pthread_detach(t);
	}
	return NULL;
}

/* ---- the daemons ---- */

static char tmp[64];
static int ndaemons, before;

/* Waits for pid at most limit_ms: its time in ms and its exit status in
 * *st, or -1 (pid killed) when it ran longer. */
static long wait_for(pid_t pid, uint64_t limit_ms, int *st)
{
	uint64_t t0 = mono_ms();

	for (;;) {
		struct timespec ts = { 0, 2000000 };
		int w;
		pid_t r = waitpid(pid, &w, WNOHANG);

		CHECK(r >= 0 || errno == EINTR);
		if (r == pid) {
			*st = WIFEXITED(w) ? WEXITSTATUS(w) : 128 + WTERMSIG(w);
			return (long)(mono_ms() - t0);
		}
		if (mono_ms() - t0 > limit_ms) {
			kill(pid, SIGKILL);
			waitpid(pid, &w, 0);
			return -1;
		}
		nanosleep(&ts, NULL);
	}
}

/* A wait that went past its bound: a failure, or (before) a figure. */
static void held(const char *what, uint64_t limit_ms)
{
	fprintf(stderr, "  %s: held more than %llu ms\n", what, (unsigned long long)limit_ms);
	if (!before)
		exit(1);
}

static void write_conf(const char *name, const char *extra)
{
	char path[160], pw[160];
	unsigned uid = (unsigned)getuid();
	FILE *f;

	snprintf(pw, sizeof(pw), "%s/dripper.pw", tmp);
	CHECK((f = fopen(pw, "w")) != NULL);
	fprintf(f, "secret\n");
	fclose(f);
	snprintf(path, sizeof(path), "%s/%s", tmp, name);
	CHECK((f = fopen(path, "w")) != NULL);
	fprintf(f, "remote_seeds = 127.0.0.1:%d,127.0.0.1:%d\n%s", port[0], port[1],
		before ? "" : "remote_auth = off\n");
	/* Before issue 36 only remote_timeout and drain_timeout existed. */
	for (const char *p = extra, *nl; *p; p = nl + 1) {
		nl = strchr(p, '\n');
		if (!before || !strncmp(p, "remote_timeout", 14) || !strncmp(p, "drain_timeout", 13))
			fprintf(f, "%.*s\n", (int)(nl - p), p);
	}
	fputc('\n', f);
	fprintf(f, "[namespace drip]\nusers = %u\nremote = yes\nremote_user = dripper\n"
		"remote_password_file = %s\n\n", uid, pw);
	fprintf(f, "[namespace other]\nusers = %u\nremote = yes\n", uid);
	fclose(f);
}

static void node_start(struct kvt_daemon *d, const char *conf)
{
	char disk[160], arg[200];

	snprintf(disk, sizeof(disk), "%s/g3-%d", tmp, ndaemons++);
	snprintf(arg, sizeof(arg), "--config=%s/%s", tmp, conf);
	kvt_start(d, arg, "--pool-size", "4MiB", "--segment-size", "1MiB", "--page-size", "64KiB",
		  "--host-tier-size", "4MiB", "--disk-path", disk, "--disk-size", "16MiB", NULL);
}

/* Seals ns's chain of N blocks (seeds base + i) and sends it to G4. */
static void seal_chain(const char *ns, uint64_t base)
{
	kvc_conn *c = kvt_connect(ns);
	int pool = kvt_pool(c, "p", BB);
	Kvcached__Response *rs;
	uint64_t want;

	kvt_seal_chain(c, pool, BB, N, base);
	rs = kvt_g4_stats(ns);
	want = rs->stats->remote->writes + N;
	kvcached__response__free_unpacked(rs, NULL);
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	kvt_flush(c);
	kvt_g4_settled(ns, want);
	kvc_close(c);
}

/* kvt_stop(), or (before) kill -9: a daemon whose read thread a drip holds
 * would not exit. */
static void node_stop(struct kvt_daemon *d)
{
	if (!before) {
		kvt_stop(d);
		return;
	}
	kill(d->pid, SIGKILL);
	kvt_wait(d->pid);
}

static int lookup_drip(void *arg)
{
	(void)arg;
	return kvt_lookup_chain("drip", "p", BB, N, 1000);
}

/* The same, for a daemon that goes under it: its answer does not matter. */
static int lookup_drip_any(void *arg)
{
	kvc_conn *c = kvt_connect("drip");
	int pool = kvt_pool(c, "p", BB), k;
	kvc_block b[N];
	kvc_hash h[N];

	(void)arg;
	for (int i = 0; i < N; i++)
		h[i] = kvt_hash(1000 + (uint64_t)i);
	k = kvc_lookup(c, pool, h, N, b);
	return k < 0 ? 0 : k;
}

/* Waits (a minute at most) until a drip has started since `since`. */
static void wait_drip(long long since)
{
	uint64_t end = mono_ms() + 60000;

	while (sh->drips_started <= since) {
		struct timespec ts = { 0, 2000000 };

		CHECK(mono_ms() < end);
		nanosleep(&ts, NULL);
	}
}

static int lookup_other(void *arg)
{
	return kvt_lookup_chain("other", "p", BB, N, (uint64_t)(uintptr_t)arg);
}

/* A lookup of other's chain (base), in a child: within BOUND_MS, whole. */
static void timed_other(uint64_t base)
{
	pid_t pid = kvt_spawn(lookup_other, (void *)(uintptr_t)base);
	int k = -1;
	long ms = wait_for(pid, BOUND_MS, &k);
	char what[64];

	snprintf(what, sizeof(what), "other's chain %llu", (unsigned long long)base);
	if (ms < 0) {
		held(what, BOUND_MS);
		return;
	}
	fprintf(stderr, "  %s: %d of %d blocks in %ld ms\n", what, k, N, ms);
	CHECK_EQ(k, N);
}

static int lookup_drip_chain(void *arg)
{
	return kvt_lookup_chain("drip", "p", BB, N, (uint64_t)(uintptr_t)arg);
}

/* A lookup of the drip tenant's chain (base), in a child: within BOUND_MS,
 * whole, every byte checked. */
static void timed_drip_chain(uint64_t base, const char *what)
{
	pid_t pid = kvt_spawn(lookup_drip_chain, (void *)(uintptr_t)base);
	int k = -1;
	long ms = wait_for(pid, BOUND_MS, &k);

	if (ms < 0) {
		held(what, BOUND_MS);
		return;
	}
	fprintf(stderr, "  %s: %d of %d blocks in %ld ms\n", what, k, N, ms);
	CHECK_EQ(k, N);
}

/* Issue 36's write half: a node that answers a SET just above
 * remote_min_rate for ever (a status line 2 KB/s, against a floor of 1 KiB/s
 * and 256 KiB of values sent: the floor alone would hold the batch for
 * minutes) held the write thread, and the writes queued behind it, for as
 * long as it liked. Now the batch ends at remote_write_timeout: every write
 * an error, nothing in flight, the blocks served from G2 all along (byte
 * for byte), the daemon answering meanwhile. */
static void phase_write(void)
{
	struct kvt_daemon w;
	kvc_conn *c;
	int pool;
	long long since;
	uint64_t t0, ms = 0;
	Kvcached__Response *rs;

	node_start(&w, "wdrip.conf");
	sh->drip_sets = 1;
	since = sh->drips_started;
	c = kvt_connect("drip");
	pool = kvt_pool(c, "p", BB);
	kvt_seal_chain(c, pool, BB, N, 7000);
	kvt_evict_nowait(c, KVCACHED__TIER__TIER_G1);   /* into G2: written at demotion */
	wait_drip(since);
	t0 = mono_ms();
	fprintf(stderr, "write: the nodes answer the drip tenant's SETs at 2 KB/s for ever "
		"(remote_min_rate 1 KiB/s, remote_write_timeout %u ms)\n", WRITE_MS);
	timed_drip_chain(7000, "the chain, from G2, while its writes are held");
	kvt_evict_nowait(c, KVCACHED__TIER__TIER_G1);
	for (;;) {
		struct timespec ts = { 0, 5000000L };
		uint64_t err, in;

		rs = kvt_g4_stats("drip");
		err = rs->stats->remote->write_errors;
		in = rs->stats->remote->inflight_bytes;
		kvcached__response__free_unpacked(rs, NULL);
		ms = mono_ms() - t0;
		if (err >= N && !in)
			break;
		if (ms > BOUND_MS) {
			fprintf(stderr, "  %llu of %d writes failed, %llu bytes in flight\n",
				(unsigned long long)err, N, (unsigned long long)in);
			held("the dripped writes", BOUND_MS);
			break;
		}
		nanosleep(&ts, NULL);
	}
	fprintf(stderr, "  the writes ended (errors) %llu ms after the drip began\n",
		(unsigned long long)ms);
	rs = kvt_g4_stats("drip");
	CHECK_EQ(rs->stats->remote->writes, 0);
	kvcached__response__free_unpacked(rs, NULL);
	timed_drip_chain(7000, "the chain, from G2, after");
	kvc_close(c);
	sh->drip_sets = 0;
	node_stop(&w);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

int main(void)
{
	struct kvt_daemon a, b, d, m;
	pthread_t srv[2];
	char extra[256];
	uint64_t t0, ms;
	int st;
	long long since;
	pid_t child, nodes;

	before = getenv("KVT_G4_BEFORE") && atoi(getenv("KVT_G4_BEFORE"));
	snprintf(tmp, sizeof(tmp), "/tmp/kvt-g4drip.XXXXXX");
	CHECK(mkdtemp(tmp) != NULL);
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(sh != MAP_FAILED);
	sh->drip_map_node = -1;
	for (int i = 0; i < 2; i++)
		server((void *)(intptr_t)i);   /* binds, learns the port */
	CHECK((nodes = fork()) >= 0);
	if (!nodes) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		for (int i = 0; i < 2; i++)
			CHECK(pthread_create(&srv[i], NULL, server, (void *)(intptr_t)i) == 0);
		for (int i = 0; i < 2; i++)
			pthread_join(srv[i], NULL);
		_exit(0);
	}
	/* Small deadlines (tests shrink limits): a node gets 500 ms of grace,
	 * then must move 64 KiB/s; a read ends within FETCH_MS. */
	snprintf(extra, sizeof(extra), "remote_timeout = 500ms\nremote_min_rate = 64KiB\n"
		 "remote_fetch_timeout = %ums\nremote_readers = 2\n", FETCH_MS);
	write_conf("fast.conf", extra);
	/* The chains are written with the defaults: the small deadlines are
	 * for the reads under test. */
	write_conf("fill.conf", "");
	snprintf(extra, sizeof(extra), "remote_timeout = 500ms\nremote_min_rate = 1KiB\n"
		 "remote_write = demote\nremote_write_timeout = %ums\n", WRITE_MS);
	write_conf("wdrip.conf", extra);
	write_conf("slow.conf", "remote_timeout = 20s\nremote_min_rate = 1KiB\n"
		   "remote_fetch_timeout = 60s\ndrain_timeout = 1s\n");

	node_start(&a, "fill.conf");
	seal_chain("drip", 1000);
	for (uint64_t base = 3000; base <= 6000; base += 1000)
		seal_chain("other", base);
	kvt_stop(&a);

	/* value: the drip tenant's lookup is held by the drip; the other's
	 * are served meanwhile. */
	node_start(&b, "fast.conf");
	sh->drip_values = 1;
	since = sh->drips_started;
	t0 = mono_ms();
	child = kvt_spawn(lookup_drip, NULL);
	wait_drip(since);
	fprintf(stderr, "value: a node drips the drip tenant's values (a byte every %d ms)\n",
		DRIP_MS);
	timed_other(3000);
	timed_other(4000);
	if (wait_for(child, BOUND_MS, &st) < 0) {
		held("the dripped lookup", BOUND_MS);
	} else {
		ms = mono_ms() - t0;
		fprintf(stderr, "  the dripped lookup ended in %llu ms (found %d)\n",
			(unsigned long long)ms, st);
		CHECK(st < N);
	}
	sh->drip_values = 0;
	node_stop(&b);

	/* sigterm: deadlines far away (remote_timeout 20 s), a lookup held on
	 * a drip; the drain (1 s) ends it. */
	node_start(&d, "slow.conf");
	sh->drip_values = 1;
	since = sh->drips_started;
	child = kvt_spawn(lookup_drip_any, NULL);
	wait_drip(since);
	CHECK(kill(d.pid, SIGTERM) == 0);
	fprintf(stderr, "sigterm: a lookup held on a drip, SIGTERM, drain_timeout 1000 ms\n");
	if ((ms = (uint64_t)wait_for(d.pid, 1000 + SLACK_MS, &st)) == (uint64_t)-1) {
		held("the daemon's exit", 1000 + SLACK_MS);   /* and killed */
	} else {
		fprintf(stderr, "  exited %llu ms after SIGTERM, status %d\n",
			(unsigned long long)ms, st);
		CHECK_EQ(st, 0);
	}
	kvt_wait(child);   /* its daemon went under it: any answer */
	sh->drip_values = 0;

	/* write: the nodes answer the drip tenant's SETs just above the rate
	 * floor, for ever; the writes end at remote_write_timeout (WRITE_MS),
	 * the chain is served from G2 meanwhile and after. */
	if (!before)
		phase_write();

	/* map: node 0 drips its slot map; a fresh node's first lookup. */
	sh->drip_map_node = 0;
	node_start(&m, "fast.conf");
	fprintf(stderr, "map: node 0 drips CLUSTER SLOTS (%zu bytes, a byte every %d ms)\n",
		make_map((char[8192]){ 0 }, 8192), DRIP_MS);
	timed_other(5000);
	sh->drip_map_node = -1;
	node_stop(&m);

	sh->stop = 1;
	CHECK_EQ(kvt_wait(nodes), 0);
	nftw(tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	fprintf(stderr, "ok\n");
	return 0;
}
#endif
