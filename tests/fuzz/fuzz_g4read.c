/* Fuzzing the G4 read path against a scripted node (issue 36): the Redis
 * Cluster client (rcluster.h) reads a batch of keys, some into destinations
 * (kv_rc_get_into(), as the tier reads values into G2 slots), from a node
 * that is a thread of this process and answers with the input: any bytes,
 * in segments sent after delays or dripped a byte at a time, as the answer
 * to the GETRANGE batch or to CLUSTER SLOTS (libFuzzer; replayed by the
 * normal suite).
 *
 * Input: byte 0 flags (bit 0: the script answers CLUSTER SLOTS, else a
 * valid map is sent and the script answers the reads; bit 1: the node hangs
 * up after the script, else it stays silent; bits 2-4: keys - 1), byte 1 the
 * drip step in ms (low 4 bits), then segments: a length byte, a wait byte
 * (steps before the segment; 255: drip it, a step per byte) and the bytes.
 * What the script waits in all is capped at MAX_WAIT_MS (3 s: past the
 * deadline and its slack, so a client that lets a drip hold it is a
 * finding; a client that hangs up on time ends the script at once).
 * Findings: a crash or sanitizer report; a call that does not return within
 * its call_ms deadline (+ SLACK_MS for a loaded machine and ASan), however
 * the node spaces its bytes; a status out of range; a byte written outside a
 * destination's parts. */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kvconfig.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#if KV_HAVE_HIREDIS
#include "rcluster.h"

#define CALL_MS 250
#define SLACK_MS 1500
#define MAX_WAIT_MS 3000
#define GUARD 0xd7

static void finding(const char *what)
{
	fprintf(stderr, "finding: %s\n", what);
	abort();
}

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* The run's script, set before the call; the node thread reads it. */
static struct {
	const uint8_t *p;
	size_t n;
	int map_scripted, hang_up;
	unsigned step;
} script;
static int lfd, port;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
/* Runs begun; whose client was freed (its sockets closed); that the node
 * is done with (nothing of it left to accept or serve). */
static unsigned long runs, freed, served;

static int put(int fd, const void *p, size_t n)
{
	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);

		if (w <= 0)
			return -1;
		p = (const char *)p + w;
		n -= (size_t)w;
	}
	return 0;
}

/* Sends the script: -1 when the peer went. */
static int play(int fd)
{
	const uint8_t *p = script.p, *end = script.p + script.n;
	unsigned waited = 0;

	while (p + 2 <= end) {
		size_t len = p[0];
		unsigned wait = p[1];

		p += 2;
		if (len > (size_t)(end - p))
			len = (size_t)(end - p);
		if (wait == 255) {
			for (size_t i = 0; i < len; i++) {
				if (put(fd, p + i, 1) < 0)
					return -1;
				if (waited + script.step <= MAX_WAIT_MS) {
					sleep_ms(script.step);
					waited += script.step;
				}
			}
		} else {
			unsigned ms = wait * script.step;

			if (waited + ms > MAX_WAIT_MS)
				ms = MAX_WAIT_MS - waited;
			sleep_ms(ms);
			waited += ms;
			if (put(fd, p, len) < 0)
				return -1;
		}
		p += len;
	}
	return 0;
}

/* One connection: answers CLUSTER SLOTS and the read batch as scripted,
 * then reads until the client hangs up. */
static void serve(int fd)
{
	char buf[65536], map[160];
	size_t have = 0;
	int mapped = 0, played = 0;

	snprintf(map, sizeof(map), "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n",
		 port);
	for (;;) {
		struct pollfd pf = { .fd = fd, .events = POLLIN };
		ssize_t r;

		if (poll(&pf, 1, 5000) <= 0)
			break;   /* the client is gone or stuck: the run's check says which */
		if ((r = read(fd, buf + have, sizeof(buf) - 1 - have)) <= 0)
			break;
		have += (size_t)r;
		buf[have] = 0;
		if (!mapped && memmem(buf, have, "CLUSTER", 7)) {
			mapped = 1;
			if (script.map_scripted) {
				played = 1;
				if (play(fd) < 0 || script.hang_up)
					break;
			} else if (put(fd, map, strlen(map)) < 0) {
				break;
			}
		}
		if (!played && memmem(buf, have, "GETRANGE", 8)) {
			played = 1;
			if (play(fd) < 0 || script.hang_up)
				break;
		}
		if (have > sizeof(buf) / 2)
			have = 0;   /* what it asks no longer matters */
	}
	close(fd);
}

static void *node(void *arg)
{
	(void)arg;
	for (;;) {
		struct pollfd pf = { .fd = lfd, .events = POLLIN };
		int fd;

		if (poll(&pf, 1, 20) > 0 && (fd = accept(lfd, NULL, NULL)) >= 0) {
			serve(fd);
			continue;
		}
		/* No connection waiting after the run's client went: the node is
		 * done with it. */
		pthread_mutex_lock(&lock);
		if (served != runs && freed == runs) {
			served = runs;
			pthread_cond_broadcast(&cond);
		}
		pthread_mutex_unlock(&lock);
	}
	return NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t alen = sizeof(a);
	pthread_t t;

	(void)argc;
	(void)argv;
	if ((lfd = socket(AF_INET, SOCK_STREAM, 0)) < 0 ||
	    bind(lfd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(lfd, 16) < 0 ||
	    getsockname(lfd, (struct sockaddr *)&a, &alen) < 0)
		finding("cannot listen on loopback");
	port = ntohs(a.sin_port);
	if (pthread_create(&t, NULL, node, NULL) != 0)
		finding("cannot start the node's thread");
	pthread_detach(t);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t dbuf[8][256];
	struct kv_rc_key keys[8];
	struct kv_rc_val out[8];
	struct kv_rc_dst dst[8];
	struct kv_rc_limits l;
	struct kv_rc *rc;
	char seeds[32], err[128], names[8][4];
	unsigned nkeys;
	uint64_t t0, ms;
	int hits;

	if (size < 2)
		return 0;
	if (!port)
		LLVMFuzzerInitialize(NULL, NULL);
	nkeys = ((data[0] >> 2) & 7) + 1;
	pthread_mutex_lock(&lock);
	script.map_scripted = data[0] & 1;
	script.hang_up = (data[0] >> 1) & 1;
	script.step = data[1] & 15;
	script.p = data + 2;
	script.n = size - 2;
	runs++;
	pthread_mutex_unlock(&lock);

	snprintf(seeds, sizeof(seeds), "127.0.0.1:%d", port);
	if (kv_rc_new(seeds, NULL, NULL, 30, &rc, err, sizeof(err)) < 0)
		finding(err);
	kv_rc_get_limits(rc, &l);
	l.min_rate = 64 << 10;
	l.call_ms = CALL_MS;
	l.backoff_min_ms = 1;
	l.backoff_max_ms = 2;
	l.max_value = 1 << 20;
	l.get_max = 64;
	if (kv_rc_set_limits(rc, &l) < 0)
		finding("kv_rc_set_limits refused the harness's limits");
	/* Even keys into destinations of two parts with guard bytes around
	 * them (a G2 slot's header and payload), odd keys into the client's
	 * buffers. */
	memset(dbuf, GUARD, sizeof(dbuf));
	for (unsigned i = 0; i < nkeys; i++) {
		snprintf(names[i], sizeof(names[i]), "k%u", i);
		keys[i].data = names[i];
		keys[i].len = 2;
		memset(&dst[i], 0, sizeof(dst[i]));
		if (i % 2 == 0) {
			dst[i].part[0].p = dbuf[i] + 16;
			dst[i].part[0].len = 16;
			dst[i].part[1].p = dbuf[i] + 64;
			dst[i].part[1].len = 48;
			dst[i].nparts = 2;
		}
	}
	t0 = mono_ms();
	hits = kv_rc_get_into(rc, nkeys, keys, dst, NULL, NULL, out);
	ms = mono_ms() - t0;
	if (ms > CALL_MS + SLACK_MS) {
		fprintf(stderr, "the call took %llu ms (call_ms %u)\n", (unsigned long long)ms,
			CALL_MS);
		finding("a call outlived its deadline");
	}
	if (hits < 0 || hits > (int)nkeys)
		finding("a count of hits out of range");
	for (unsigned i = 0; i < nkeys; i++) {
		int st = out[i].status;

		if (st != KV_RC_HIT && st != KV_RC_MISS && st != KV_RC_ERROR && st != KV_RC_TOOLONG)
			finding("a status out of range");
		if (dst[i].nparts) {
			if (out[i].data)
				finding("a value with a destination came in a buffer");
			if (st == KV_RC_HIT && out[i].len > 64)
				finding("a value longer than its destination reported written");
		} else if (st == KV_RC_HIT && (!out[i].data || out[i].len > l.max_value)) {
			finding("a hit without its bytes");
		} else if (st == KV_RC_TOOLONG) {
			finding("TOOLONG for a key without a destination");
		}
		for (size_t b = 0; b < sizeof(dbuf[i]); b++) {
			int in = dst[i].nparts && ((b >= 16 && b < 32) || (b >= 64 && b < 112));

			if (!in && dbuf[i][b] != GUARD)
				finding("a byte written outside a destination");
		}
	}
	kv_rc_vals_free(nkeys, out);
	kv_rc_free(rc);
	pthread_mutex_lock(&lock);
	freed = runs;
	pthread_mutex_unlock(&lock);
	/* The node is done with this run before the next one begins (a
	 * minute at most: its reads wait 5 s for a client that is gone). */
	pthread_mutex_lock(&lock);
	while (served != runs) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 60;
		if (pthread_cond_timedwait(&cond, &lock, &ts) == ETIMEDOUT)
			finding("the scripted node did not finish");
	}
	pthread_mutex_unlock(&lock);
	return 0;
}
#else
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	(void)data;
	(void)size;
	return 0;
}
#endif
