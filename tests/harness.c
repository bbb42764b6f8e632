#include "harness.h"

#include "kvconfig.h"
#if KV_HAVE_CUDA
#include "cudrv.h"
#endif

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* How long the harness waits for the daemon to reach a state before it
 * fails the test: a guard against a hang, not a time any wait should take
 * (the suite runs under ASan too, on machines busy with other builds), and
 * short of meson's timeout so that the failure says what it waited for. */
#define KVT_WAIT_MS 60000

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static pid_t daemon_pid, starter_pid;

/* A failed check exits the test: take the daemon down with it, or meson
 * would wait on the daemon's copy of the output pipe. Workers (forked after
 * the start) must not. */
static void kill_daemon(void)
{
	if (daemon_pid > 0 && getpid() == starter_pid)
		kill(daemon_pid, SIGKILL);
}

int kvt_cuda(void)
{
	const char *b = getenv("KVT_BACKEND");

	return b && !strcmp(b, "cuda");
}

/* Exits 77 (1 under KVT_REQUIRE_GPU=1) unless a child process can load CUDA
 * and sees a device. Once per process: after this one has loaded CUDA itself
 * a forked child cannot, which says nothing about the GPU. */
static void probe_gpu(void)
{
#if KV_HAVE_CUDA
	static int probed;
	pid_t pid;
	int st;

	if (probed)
		return;
	fflush(stderr);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		int n = 0;

		if (kv_cu_load() < 0) {
			fprintf(stderr, "no usable GPU: %s\n", kv_cu_error());
			_exit(77);
		}
		if (kv_cu.cuDeviceGetCount(&n) != CUDA_SUCCESS || n == 0) {
			fprintf(stderr, "no usable GPU: no CUDA device\n");
			_exit(77);
		}
		_exit(0);
	}
	CHECK(waitpid(pid, &st, 0) == pid);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		GPU_SKIP("the probe (above) failed");
	probed = 1;
#else
	GPU_SKIP("built without CUDA");
#endif
}

/* Starts the daemon on d->sock with the extra arguments in ap and waits
 * until it accepts. */
static void start_on(struct kvt_daemon *d, va_list ap)
{
	const char *bin = getenv("KVCACHED_BIN");
	const char *argv[64];
	uint64_t deadline;
	int argc = 0;

	argv[argc++] = bin;
	/* No /etc/kvcached/kvcached.conf of this machine. */
	argv[argc++] = "--config=";
	argv[argc++] = "--socket";
	argv[argc++] = d->sock;
	if (kvt_cuda()) {
		argv[argc++] = "--backend";
		argv[argc++] = "cuda";
	}
	for (const char *a; (a = va_arg(ap, const char *)) && argc < 62;)
		argv[argc++] = a;
	argv[argc] = NULL;
	setenv("KVCACHED_SOCKET", d->sock, 1);
	d->pid = fork();
	CHECK(d->pid >= 0);
	if (d->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		execv(bin, (char **)argv);
		_exit(127);
	}
	if (!starter_pid) {
		starter_pid = getpid();
		atexit(kill_daemon);
	}
	daemon_pid = d->pid;
	deadline = now_ms() + KVT_WAIT_MS;
	for (;;) {
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		int fd = socket(AF_UNIX, SOCK_STREAM, 0), r;

		struct ucred cr = { 0 };
		socklen_t crlen = sizeof(cr);

		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", d->sock);
		r = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
		/* This daemon, not one killed a moment ago whose socket still
		 * accepts (kvt_restart). */
		if (r == 0 && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) == 0 &&
		    cr.pid != d->pid)
			r = -1;
		close(fd);
		if (r == 0)
			return;
		CHECK(kvt_alive(d));
		if (now_ms() > deadline) {
			fprintf(stderr, "daemon did not start listening in %d s\n",
				KVT_WAIT_MS / 1000);
			exit(1);
		}
		sleep_ms(10);
	}
}

void kvt_start(struct kvt_daemon *d, ...)
{
	va_list ap;

	if (!getenv("KVCACHED_BIN"))
		SKIP("KVCACHED_BIN is not set (run through meson test)");
	if (kvt_cuda())
		probe_gpu();
	snprintf(d->dir, sizeof(d->dir), "/tmp/kvt.XXXXXX");
	CHECK(mkdtemp(d->dir) != NULL);
	snprintf(d->sock, sizeof(d->sock), "%s/kvcached.sock", d->dir);
	va_start(ap, d);
	start_on(d, ap);
	va_end(ap);
}

void kvt_restart(struct kvt_daemon *d, ...)
{
	va_list ap;
	int st;

	CHECK(kill(d->pid, SIGKILL) == 0);
	CHECK(waitpid(d->pid, &st, 0) == d->pid);
	daemon_pid = 0;
	va_start(ap, d);
	start_on(d, ap);
	va_end(ap);
}

int kvt_alive(const struct kvt_daemon *d)
{
	int st;

	return waitpid(d->pid, &st, WNOHANG) == 0;
}

void kvt_stop(struct kvt_daemon *d)
{
	CHECK(kill(d->pid, SIGTERM) == 0);
	CHECK_EQ(kvt_wait(d->pid), 0);
	daemon_pid = 0;
	rmdir(d->dir);
}

kvc_conn *kvt_connect(const char *ns)
{
	struct kvc_options o = { .ns = ns, .client_name = "test" };
	kvc_conn *c = NULL;
	int r = kvc_connect(NULL, &o, &c);

	if (r < 0) {
		fprintf(stderr, "kvc_connect: %s\n", kvc_strerror(r));
		exit(1);
	}
	return c;
}

int kvt_pool(kvc_conn *c, const char *name, uint64_t block_bytes)
{
	struct kvc_pool_desc d = { .name = name, .block_bytes = block_bytes, .block_tokens = 16,
				   .dtype = "fp16", .layout = "test", .layout_len = 4 };
	int id = kvc_register_pool(c, &d);

	if (id < 0) {
		fprintf(stderr, "register %s: %s: %s\n", name, kvc_strerror(id), kvc_last_error(c));
		exit(1);
	}
	return id;
}

static Kvcached__Response *call(Kvcached__Request *rq)
{
	kvc_conn *c = kvt_connect(NULL);
	Kvcached__Response *rs = NULL;
	int r = kvc_call(c, rq, &rs);

	if (r < 0) {
		fprintf(stderr, "admin call: %s: %s\n", kvc_strerror(r), kvc_last_error(c));
		exit(1);
	}
	kvc_close(c);
	return rs;
}

uint64_t kvt_evict_nowait(kvc_conn *c, Kvcached__Tier tier)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Evict ev = KVCACHED__EVICT__INIT;
	Kvcached__Response *rs = NULL;
	uint64_t n;

	ev.tier = tier;
	ev.all_pools = 1;
	rq.op_case = KVCACHED__REQUEST__OP_EVICT;
	rq.evict = &ev;
	CHECK_EQ(kvc_call(c, &rq, &rs), 0);
	CHECK(!rs->error && rs->result_case == KVCACHED__RESPONSE__RESULT_EVICT);
	n = rs->evict->blocks;
	kvcached__response__free_unpacked(rs, NULL);
	return n;
}

uint64_t kvt_evict(kvc_conn *c, Kvcached__Tier tier)
{
	uint64_t n = kvt_evict_nowait(c, tier);

	kvt_tiers_settle();
	return n;
}

void kvt_flush(kvc_conn *c)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Flush fl = KVCACHED__FLUSH__INIT;
	Kvcached__Response *rs = NULL;

	rq.op_case = KVCACHED__REQUEST__OP_FLUSH;
	rq.flush = &fl;
	CHECK_EQ(kvc_call(c, &rq, &rs), 0);
	CHECK(!rs->error && rs->result_case == KVCACHED__RESPONSE__RESULT_FLUSH);
	kvcached__response__free_unpacked(rs, NULL);
	kvt_tiers_settle();
}

void kvt_seal_chain(kvc_conn *c, int pool, uint32_t block_bytes, int n, uint64_t base)
{
	kvc_block *b = calloc((size_t)n, sizeof(*b));
	kvc_hash *h = calloc((size_t)n, sizeof(*h));

	CHECK(n > 0 && b && h);
	CHECK_EQ(kvc_alloc(c, pool, (size_t)n, b), n);
	for (int i = 0; i < n; i++) {
		kvt_mem_fill(c, kvc_block_ptr(c, b[i]), block_bytes, base + (uint64_t)i);
		h[i] = kvt_hash(base + (uint64_t)i);
	}
	CHECK_EQ(kvc_seal(c, pool, b, h, (size_t)n, b), n);
	CHECK_EQ(kvc_release(c, b, (size_t)n), 0);
	free(b);
	free(h);
}

int kvt_lookup_held(kvc_conn *c, int pool, uint32_t block_bytes, int n, uint64_t base,
		    kvc_block *b)
{
	kvc_hash *h = calloc((size_t)n, sizeof(*h));
	int k;

	CHECK(n > 0 && h);
	for (int i = 0; i < n; i++)
		h[i] = kvt_hash(base + (uint64_t)i);
	k = kvc_lookup(c, pool, h, (size_t)n, b);
	if (k < 0)
		fprintf(stderr, "lookup: %s\n", kvc_last_error(c));
	CHECK(k >= 0);
	for (int i = 0; i < k; i++)
		CHECK(kvt_mem_verify(c, kvc_block_ptr(c, b[i]), block_bytes, base + (uint64_t)i));
	free(h);
	return k;
}

int kvt_lookup_chain(const char *ns, const char *pool_name, uint32_t block_bytes, int n,
		     uint64_t base)
{
	kvc_conn *c = kvt_connect(ns);
	int pool = kvt_pool(c, pool_name, block_bytes), k;
	kvc_block *b = calloc(n > 0 ? (size_t)n : 1, sizeof(*b));

	CHECK(b != NULL);
	k = kvt_lookup_held(c, pool, block_bytes, n, base, b);
	if (k)
		CHECK_EQ(kvc_release(c, b, (size_t)k), 0);
	kvc_close(c);
	free(b);
	return k;
}

Kvcached__Response *kvt_g4_stats(const char *ns)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Stats st = KVCACHED__STATS__INIT;
	Kvcached__Response *rs = NULL;
	kvc_conn *c = kvt_connect(ns);

	rq.op_case = KVCACHED__REQUEST__OP_STATS;
	rq.stats = &st;
	CHECK_EQ(kvc_call(c, &rq, &rs), 0);
	CHECK(rs->result_case == KVCACHED__RESPONSE__RESULT_STATS && rs->stats->remote);
	kvc_close(c);
	return rs;
}

uint64_t kvt_g4_settled(const char *ns, uint64_t want)
{
	for (int tries = 0;; tries++) {
		Kvcached__Response *rs = kvt_g4_stats(ns);
		uint64_t w = rs->stats->remote->writes, in = rs->stats->remote->inflight_bytes;

		CHECK_EQ(rs->stats->remote->write_errors, 0);
		CHECK_EQ(rs->stats->remote->dropped, 0);
		kvcached__response__free_unpacked(rs, NULL);
		if (w >= want && !in)
			return w;
		CHECK(tries < 60000);
		usleep(1000);
	}
}

long long kvt_metric(const char *name)
{
	uint64_t first = 0;
	long long v = -1;
	size_t nl = strlen(name);

	for (;;) {
		Kvcached__Request rq = KVCACHED__REQUEST__INIT;
		Kvcached__Metrics m = KVCACHED__METRICS__INIT;
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
			if (!strncmp(t, name, nl) && t[nl] == ' ')
				v = atoll(t + nl + 1);
		more = rs->metrics->more;
		first = rs->metrics->next;
		kvcached__response__free_unpacked(rs, NULL);
		kvc_close(c);
		if (!more)
			break;
	}
	CHECK(v >= 0);
	return v;
}

int kvt_check(void)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Check ck = KVCACHED__CHECK__INIT;
	Kvcached__Response *rs;
	int n;
	size_t i;

	rq.op_case = KVCACHED__REQUEST__OP_CHECK;
	rq.check = &ck;
	rs = call(&rq);
	CHECK(rs->result_case == KVCACHED__RESPONSE__RESULT_CHECK);
	for (i = 0; i < rs->check->n_problems; i++)
		fprintf(stderr, "  daemon check: %s\n", rs->check->problems[i]);
	n = rs->check->ok ? 0 : (int)(rs->check->n_problems ? rs->check->n_problems : 1);
	kvcached__response__free_unpacked(rs, NULL);
	return n;
}

static Kvcached__Response *stats(void)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Stats st = KVCACHED__STATS__INIT;
	Kvcached__Response *rs;

	rq.op_case = KVCACHED__REQUEST__OP_STATS;
	rq.stats = &st;
	rs = call(&rq);
	CHECK(rs->result_case == KVCACHED__RESPONSE__RESULT_STATS);
	return rs;
}

/* Tier tier's numbers from a Stats reply. */
static void tier_of(const Kvcached__Response *rs, int tier, struct kvt_tier *t)
{
	size_t i;

	memset(t, 0, sizeof(*t));
	t->present = 0;
	for (i = 0; i < rs->stats->n_tiers; i++) {
		Kvcached__TierInfo *ti = rs->stats->tiers[i];

		if ((int)ti->tier != tier)
			continue;
		t->present = 1;
		t->capacity = ti->capacity_bytes;
		t->used = ti->used_bytes;
		t->blocks = ti->blocks;
		t->dirty = ti->dirty;
		t->hits = ti->hits;
		t->promotions = ti->promotions;
		t->demotions = ti->demotions;
		t->evictions = ti->evictions;
		t->io_errors = ti->io_errors;
		t->checksum_failures = ti->checksum_failures;
		t->inflight = ti->inflight;
		t->comp_bytes = ti->compressed_bytes;
		t->comp_saved = ti->compression_saved_bytes;
	}
}

void kvt_tier(int tier, struct kvt_tier *t)
{
	Kvcached__Response *rs = stats();

	tier_of(rs, tier, t);
	kvcached__response__free_unpacked(rs, NULL);
}

/* The daemon starts the next tier move from the completion of the last one
 * (a write-back that ends can start a demotion), so "nothing in flight" is
 * only true of G2 and G3 read from one Stats reply: read apart, a move could
 * start between the two reads and neither would show it. */
void kvt_tiers_settle(void)
{
	uint64_t deadline = now_ms() + KVT_WAIT_MS;
	struct kvt_tier g2, g3;

	for (;;) {
		Kvcached__Response *rs = stats();

		tier_of(rs, 1, &g2);
		tier_of(rs, 2, &g3);
		kvcached__response__free_unpacked(rs, NULL);
		if (!g2.inflight && !g3.inflight)
			return;
		if (now_ms() > deadline) {
			fprintf(stderr, "tiers: %llu G2 copies and %llu G3 I/Os still in flight "
				"after %d s\n", (unsigned long long)g2.inflight,
				(unsigned long long)g3.inflight, KVT_WAIT_MS / 1000);
			exit(1);
		}
		sleep_ms(1);
	}
}

void kvt_pool_counts(int pool, uint64_t *free, uint64_t *writable, uint64_t *sealed,
		     uint64_t *cached)
{
	Kvcached__Response *rs = stats();
	size_t i;

	*free = *writable = *sealed = *cached = UINT64_MAX;
	for (i = 0; i < rs->stats->n_pools; i++) {
		Kvcached__PoolInfo *p = rs->stats->pools[i];

		if ((int)p->pool_id != pool)
			continue;
		*free = p->blocks_free;
		*writable = p->blocks_writable;
		*sealed = p->blocks_sealed;
		*cached = p->blocks_cached;
	}
	kvcached__response__free_unpacked(rs, NULL);
	CHECK(*free != UINT64_MAX);
}

void kvt_rm_disk(const char *dir, const char *path)
{
	char idx[256];

	unlink(path);
	snprintf(idx, sizeof(idx), "%s.idx", path);
	unlink(idx);
	rmdir(dir);
}

void kvt_blocks_total(uint64_t *writable, uint64_t *sealed, uint64_t *cached)
{
	Kvcached__Response *rs = stats();

	*writable = *sealed = *cached = 0;
	for (size_t i = 0; i < rs->stats->n_pools; i++) {
		*writable += rs->stats->pools[i]->blocks_writable;
		*sealed += rs->stats->pools[i]->blocks_sealed;
		*cached += rs->stats->pools[i]->blocks_cached;
	}
	kvcached__response__free_unpacked(rs, NULL);
}

void kvt_ns_usage(const char *name, uint64_t used[3], uint64_t quota[3])
{
	Kvcached__Response *rs = stats();
	int found = 0;

	for (size_t i = 0; i < rs->stats->n_namespaces; i++) {
		Kvcached__NamespaceInfo *n = rs->stats->namespaces[i];

		if (strcmp(n->name, name))
			continue;
		used[0] = n->bytes;
		used[1] = n->used_g2;
		used[2] = n->used_g3;
		quota[0] = n->quota_g1;
		quota[1] = n->quota_g2;
		quota[2] = n->quota_g3;
		found = 1;
	}
	kvcached__response__free_unpacked(rs, NULL);
	CHECK(found);
}

uint32_t kvt_sessions(void)
{
	Kvcached__Response *rs = stats();
	uint32_t n = rs->stats->sessions - 1;  /* not counting our own */

	kvcached__response__free_unpacked(rs, NULL);
	return n;
}

void kvt_wait_sessions(uint32_t n)
{
	uint64_t deadline = now_ms() + KVT_WAIT_MS;

	while (kvt_sessions() != n && now_ms() <= deadline)
		sleep_ms(10);
	CHECK_EQ(kvt_sessions(), n);
}

pid_t kvt_spawn(int (*fn)(void *arg), void *arg)
{
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (pid == 0) {
		fflush(stdout);
		_exit(fn(arg));
	}
	return pid;
}

int kvt_wait(pid_t pid)
{
	int st;

	while (waitpid(pid, &st, 0) < 0)
		CHECK(errno == EINTR);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static uint64_t splitmix(uint64_t *x)
{
	uint64_t z = (*x += 0x9E3779B97F4A7C15ull);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

void kvt_fill(void *p, size_t n, uint64_t seed)
{
	uint64_t *w = p, x = seed;
	size_t i;

	for (i = 0; i < n / 8; i++)
		w[i] = splitmix(&x);
}

int kvt_verify(const void *p, size_t n, uint64_t seed)
{
	const uint64_t *w = p;
	uint64_t x = seed;
	size_t i;

	for (i = 0; i < n / 8; i++)
		if (w[i] != splitmix(&x))
			return 0;
	return 1;
}

kvc_hash kvt_hash(uint64_t i)
{
	kvc_hash h;
	uint64_t x = i * 7919 + 17;
	int k;

	for (k = 0; k < 4; k++) {
		uint64_t v = splitmix(&x);

		memcpy(h.b + 8 * k, &v, 8);
	}
	return h;
}

/* ---- block bytes on either backend ------------------------------------- */

static int conn_cuda(kvc_conn *c)
{
	return !strcmp(kvc_conn_hello(c)->backend, "cuda");
}

#if KV_HAVE_CUDA
/* A current context for the copies: the one the engine (here: nobody) set,
 * else device 0's primary context, kept for the process's life. */
static void cuda_ctx(void)
{
	CUcontext ctx = NULL;
	CUdevice dev;

	CHECK(kv_cu_load() == 0);
	if (kv_cu.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx)
		return;
	CHECK(kv_cu.cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
	CHECK(kv_cu.cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
	CHECK(kv_cu.cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
}
#endif

void kvt_mem_write(kvc_conn *c, void *p, const void *src, size_t n)
{
	CHECK(p != NULL);
	if (!conn_cuda(c)) {
		memcpy(p, src, n);
		return;
	}
#if KV_HAVE_CUDA
	cuda_ctx();
	CHECK(kv_cu.cuMemcpyHtoD((CUdeviceptr)(uintptr_t)p, src, n) == CUDA_SUCCESS);
	/* From pageable memory the copy may return before the DMA is done;
	 * other processes (the daemon's CoW) read the block next. */
	CHECK(kv_cu.cuCtxSynchronize() == CUDA_SUCCESS);
#else
	CHECK(!"cuda daemon, library without CUDA");
#endif
}

void kvt_mem_read(kvc_conn *c, void *dst, const void *p, size_t n)
{
	CHECK(p != NULL);
	if (!conn_cuda(c)) {
		memcpy(dst, p, n);
		return;
	}
#if KV_HAVE_CUDA
	cuda_ctx();
	CHECK(kv_cu.cuMemcpyDtoH(dst, (CUdeviceptr)(uintptr_t)p, n) == CUDA_SUCCESS);
#else
	CHECK(!"cuda daemon, library without CUDA");
#endif
}

void kvt_mem_fill(kvc_conn *c, void *p, size_t n, uint64_t seed)
{
	void *buf = malloc(n);

	CHECK(buf != NULL);
	kvt_fill(buf, n, seed);
	kvt_mem_write(c, p, buf, n);
	free(buf);
}

int kvt_mem_verify(kvc_conn *c, const void *p, size_t n, uint64_t seed)
{
	void *buf = malloc(n);
	int ok;

	CHECK(buf != NULL);
	kvt_mem_read(c, buf, p, n);
	ok = kvt_verify(buf, n, seed);
	free(buf);
	return ok;
}

void kvt_mem_set(kvc_conn *c, void *p, int v, size_t n)
{
	void *buf = malloc(n);

	CHECK(buf != NULL);
	memset(buf, v, n);
	kvt_mem_write(c, p, buf, n);
	free(buf);
}

int kvt_mem_all(kvc_conn *c, const void *p, int v, size_t n)
{
	uint8_t *buf = malloc(n);
	size_t i;
	int ok = 1;

	CHECK(buf != NULL);
	kvt_mem_read(c, buf, p, n);
	for (i = 0; i < n && ok; i++)
		ok = buf[i] == (uint8_t)v;
	free(buf);
	return ok;
}

off_t kvt_find_slot(const char *disk, const kvc_hash *h, uint32_t *flags)
{
	int fd = open(disk, O_RDONLY);
	uint8_t hdr[80];
	off_t off, found = -1;
	struct stat st;

	CHECK(fd >= 0);
	CHECK(fstat(fd, &st) == 0);
	for (off = 0; off + 4096 <= st.st_size && found < 0; off += 4096) {
		if (pread(fd, hdr, sizeof(hdr), off) != (ssize_t)sizeof(hdr))
			break;
		if (!memcmp(hdr, "HVG3SLT1", 8) && !memcmp(hdr + 32, h->b, 32)) {
			found = off;
			if (flags)
				memcpy(flags, hdr + 76, 4);   /* struct slot_hdr's flags */
		}
	}
	close(fd);
	return found;
}
