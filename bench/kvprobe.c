/* kvprobe: how long the daemon's event loop keeps a client waiting while it
 * does other work. One connection sends the cheapest request there is (a
 * Lookup of one hash nobody sealed: a miss, one round trip) back to back for
 * a number of seconds and prints the round trips' p50, p99, p99.9 and
 * maximum. Run it beside a load (scripts/bench-stalls runs it beside kvbench
 * section g's tier traffic): a loop that blocks on work that grows with size
 * shows in the tail. Figures, never assertions.
 *
 *   kvprobe SOCKET SECONDS      (SIGTERM or SIGINT: stop early and print) */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvcache.h"

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	struct kvc_pool_desc d = { .name = "kvprobe", .block_bytes = 4096, .block_tokens = 16 };
	size_t n = 0, cap = 1 << 20;
	uint64_t *lat, end;
	kvc_conn *c;
	kvc_hash h;
	kvc_block b;
	int pool, r;

	if (argc != 3) {
		fputs("usage: kvprobe SOCKET SECONDS\n", stderr);
		return 2;
	}
	r = kvc_connect(argv[1], NULL, &c);
	if (r < 0) {
		fprintf(stderr, "kvprobe: connect %s: %s\n", argv[1], kvc_strerror(r));
		return 1;
	}
	pool = kvc_register_pool(c, &d);
	lat = malloc(cap * sizeof(*lat));
	if (pool < 0 || !lat) {
		fprintf(stderr, "kvprobe: %s\n", pool < 0 ? kvc_strerror(pool) : "out of memory");
		return 1;
	}
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	memset(&h, 0x5a, sizeof(h));
	end = now_ns() + (uint64_t)atoi(argv[2]) * 1000000000u;
	while (n < cap) {
		uint64_t t0 = now_ns();

		r = kvc_lookup(c, pool, &h, 1, &b);
		if (r < 0) {
			fprintf(stderr, "kvprobe: lookup: %s\n", kvc_strerror(r));
			return 1;
		}
		lat[n++] = now_ns() - t0;
		if (t0 > end || stop)
			break;
	}
	qsort(lat, n, sizeof(*lat), cmp);
	printf("kvprobe: %zu round trips: p50 %.1f us, p99 %.1f us, p99.9 %.1f us, max %.1f us\n", n,
	       lat[n / 2] / 1e3, lat[n * 99 / 100] / 1e3, lat[n * 999 / 1000] / 1e3,
	       lat[n - 1] / 1e3);
	kvc_close(c);
	free(lat);
	return 0;
}
