/* kvbatchcpu: the daemon's CPU per batch request, alone. Cycles of alloc,
 * seal (fresh hashes, so the daemon never dedups) and release of N blocks
 * (default 256) on kvbench's 4 KiB pool of a running kvcached, after enough
 * warm-up cycles to fill a 1 GiB pool (every alloc then evicts, as in
 * kvbench's section c); prints the daemon's CPU per request of each kind
 * (its schedstat read around each request, as kvbench's `daemon CPU` rows:
 * user and kernel time, not latency), p10, p50 and mean, in us. kvbench's
 * section c times 16 and 256 together and takes ~4 s; this runs one batch
 * size in ~2 s, so that a before/after comparison can alternate many
 * fresh daemons, and a profile of the daemon holds one request size only
 * (issue 38, docs/benchmarks.md "Seal and alloc of 256, seventh pass").
 * Prints figures, asserts nothing. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvc_internal.h"  /* kvc_conn_fd(): the daemon's pid, for its schedstat */

#define LAYOUT "kvbench: 4 KiB opaque blocks"   /* kvbench's pool, shared with it */

static int cpu_fd = -1;

static uint64_t daemon_cpu_ns(void)
{
	char buf[128];
	ssize_t k = pread(cpu_fd, buf, sizeof(buf) - 1, 0);

	if (k <= 0)
		return 0;
	buf[k] = '\0';
	return strtoull(buf, NULL, 10);
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void print(const char *what, double *v, size_t n)
{
	double sum = 0;

	for (size_t i = 0; i < n; i++)
		sum += v[i];
	qsort(v, n, sizeof(*v), cmp);
	printf("daemon CPU, %-8s  p10 %7.2f us  p50 %7.2f us  mean %7.2f us\n", what, v[n / 10],
	       v[n / 2], sum / (double)n);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "blocks", required_argument, NULL, 'n' },
		{ "cycles", required_argument, NULL, 'c' },
		{ "warm", required_argument, NULL, 'w' },
		{ 0 },
	};
	struct kvc_pool_desc d = { .name = "kvbench-4k", .block_bytes = 4096, .block_tokens = 16,
				   .dtype = "opaque", .layout = LAYOUT,
				   .layout_len = sizeof(LAYOUT) - 1 };
	struct kvc_options o = { .client_name = "kvbatchcpu" };
	char sock[108] = "", path[64];
	unsigned long n = 256, cycles = 3000, warm = 1100;
	uint64_t rng = 0x6b766261ull ^ (uint64_t)getpid() << 32;
	kvc_block *b, *ob;
	kvc_hash *h;
	double *t[3];
	struct ucred uc;
	socklen_t ul = sizeof(uc);
	kvc_conn *c;
	int opt, pool, r;

	while ((opt = getopt_long(argc, argv, "s:n:c:w:", opts, NULL)) != -1) {
		switch (opt) {
		case 's':
			snprintf(sock, sizeof(sock), "%s", optarg);
			break;
		case 'n':
			n = strtoul(optarg, NULL, 0);
			break;
		case 'c':
			cycles = strtoul(optarg, NULL, 0);
			break;
		case 'w':
			warm = strtoul(optarg, NULL, 0);
			break;
		default:
			fprintf(stderr, "Usage: kvbatchcpu [-s SOCKET] [-n BLOCKS] [-c CYCLES] "
					"[-w WARMUP_CYCLES]\n");
			return 2;
		}
	}
	if (n == 0 || n > 65536 || cycles == 0 || cycles > 10000000) {
		fprintf(stderr, "kvbatchcpu: blocks 1..65536, cycles 1..10^7\n");
		return 2;
	}
	if (!sock[0] && kvc_default_socket(sock, sizeof(sock)) < 0) {
		fprintf(stderr, "kvbatchcpu: no socket\n");
		return 1;
	}
	if ((r = kvc_connect(sock, &o, &c)) < 0) {
		fprintf(stderr, "kvbatchcpu: %s: %s\n", sock, kvc_strerror(r));
		return 1;
	}
	if (getsockopt(kvc_conn_fd(c), SOL_SOCKET, SO_PEERCRED, &uc, &ul) < 0 || uc.pid <= 0) {
		fprintf(stderr, "kvbatchcpu: the daemon's pid: %s\n", strerror(errno));
		return 1;
	}
	snprintf(path, sizeof(path), "/proc/%d/schedstat", (int)uc.pid);
	if ((cpu_fd = open(path, O_RDONLY | O_CLOEXEC)) < 0 || !daemon_cpu_ns()) {
		fprintf(stderr, "kvbatchcpu: %s unreadable\n", path);
		return 77;
	}
	if ((pool = kvc_register_pool_model(c, &d, "kvbench")) < 0) {
		fprintf(stderr, "kvbatchcpu: registering the pool: %s\n", kvc_strerror(pool));
		return 1;
	}
	b = calloc(n, sizeof(*b));
	ob = calloc(n, sizeof(*ob));
	h = calloc(n, sizeof(*h));
	for (int k = 0; k < 3; k++)
		t[k] = calloc(cycles, sizeof(double));
	if (!b || !ob || !h || !t[0] || !t[1] || !t[2]) {
		fprintf(stderr, "kvbatchcpu: out of memory\n");
		return 1;
	}
	for (unsigned long it = 0; it < warm + cycles; it++) {
		uint64_t c0, c1, c2, c3;

		for (unsigned long i = 0; i < n; i++)
			for (int j = 0; j < 4; j++) {
				uint64_t w = splitmix64(&rng);

				memcpy(h[i].b + 8 * j, &w, 8);
			}
		c0 = daemon_cpu_ns();
		r = kvc_alloc(c, pool, (uint32_t)n, b);
		c1 = daemon_cpu_ns();
		if (r >= 0) {
			r = kvc_seal(c, pool, b, h, n, ob);
			c2 = daemon_cpu_ns();
		}
		if (r >= 0) {
			r = kvc_release(c, ob, n);
			c3 = daemon_cpu_ns();
		}
		if (r < 0) {
			fprintf(stderr, "kvbatchcpu: cycle %lu: %s\n", it, kvc_strerror(r));
			return 1;
		}
		if (it >= warm) {
			t[0][it - warm] = (double)(c1 - c0) / 1e3;
			t[1][it - warm] = (double)(c2 - c1) / 1e3;
			t[2][it - warm] = (double)(c3 - c2) / 1e3;
		}
	}
	printf("kvbatchcpu: %lu cycles of %lu blocks after %lu warm-up cycles, daemon pid %d\n",
	       cycles, n, warm, (int)uc.pid);
	print("alloc", t[0], cycles);
	print("seal", t[1], cycles);
	print("release", t[2], cycles);
	kvc_close(c);
	return 0;
}
