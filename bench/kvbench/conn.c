/* kvbench: the daemon connection that sections b-f share: the 4 KiB pool,
 * one alloc+seal+release cycle, the pool's counters. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvbench.h"

#define BLOCK_BYTES 4096u
#define LAYOUT "kvbench: 4 KiB opaque blocks"

void bc_open(struct bench_conn *bc, size_t cap, const char *name, bool with_pool)
{
	struct kvc_options opt = { .client_name = name };
	struct kvc_pool_desc d = {
		.name = POOL_NAME,
		.block_bytes = BLOCK_BYTES,
		.block_tokens = 16,
		.dtype = "opaque",
		.layout = LAYOUT,
		.layout_len = sizeof(LAYOUT) - 1,
	};
	int r;

	memset(bc, 0, sizeof(*bc));
	r = kvc_connect(sock_path, &opt, &bc->c);
	if (r < 0)
		die("cannot connect to kvcached at %s: %s", sock_path, kvc_strerror(r));
	bc->pool = -1;
	bc->cpu_fd = -1;
	{
		struct ucred uc;
		socklen_t len = sizeof(uc);
		char path[64];

		if (getsockopt(kvc_conn_fd(bc->c), SOL_SOCKET, SO_PEERCRED, &uc, &len) == 0 &&
		    uc.pid > 0) {
			snprintf(path, sizeof(path), "/proc/%d/schedstat", (int)uc.pid);
			bc->cpu_fd = open(path, O_RDONLY | O_CLOEXEC);
		}
	}
	if (with_pool) {
		/* A model name: a pool without one publishes no KV events
		 * (docs/events.md), and scripts/bench-events.sh measures them. */
		r = kvc_register_pool_model(bc->c, &d, "kvbench");
		check(bc->c, r, "registering the pool");
		bc->pool = r;
	}
	bc->cap = cap;
	bc->h = calloc(cap, sizeof(*bc->h));
	bc->b = calloc(cap, sizeof(*bc->b));
	bc->o = calloc(cap, sizeof(*bc->o));
	if (!bc->h || !bc->b || !bc->o)
		die("out of memory");
}

void bc_close(struct bench_conn *bc)
{
	kvc_close(bc->c);
	if (bc->cpu_fd >= 0)
		close(bc->cpu_fd);
	free(bc->h);
	free(bc->b);
	free(bc->o);
	memset(bc, 0, sizeof(*bc));
	bc->cpu_fd = -1;
}

uint64_t daemon_cpu_ns(struct bench_conn *bc)
{
	char buf[128];
	ssize_t k;

	if (bc->cpu_fd < 0)
		return 0;
	k = pread(bc->cpu_fd, buf, sizeof(buf) - 1, 0);
	if (k <= 0)
		return 0;
	buf[k] = '\0';
	return strtoull(buf, NULL, 10);
}

bool cycles_cpu(struct bench_conn *bc, uint32_t n, unsigned cycles, struct samples s[3])
{
	uint64_t c[4];
	int r;

	if (!daemon_cpu_ns(bc))
		return false;
	for (unsigned i = 0; i < cycles; i++) {
		fresh_hashes(bc->h, n);
		c[0] = daemon_cpu_ns(bc);
		r = kvc_alloc(bc->c, bc->pool, n, bc->b);
		c[1] = daemon_cpu_ns(bc);
		check(bc->c, r, "alloc");
		r = kvc_seal(bc->c, bc->pool, bc->b, bc->h, n, bc->o);
		c[2] = daemon_cpu_ns(bc);
		check(bc->c, r, "seal");
		r = kvc_release(bc->c, bc->o, n);
		c[3] = daemon_cpu_ns(bc);
		check(bc->c, r, "release");
		for (int j = 0; j < 3; j++)
			sample_add(&s[j], c[j + 1] - c[j]);
	}
	return true;
}

void cycle(struct bench_conn *bc, uint32_t n, uint64_t t[4])
{
	int r;

	fresh_hashes(bc->h, n);
	t[0] = now_ns();
	r = kvc_alloc(bc->c, bc->pool, n, bc->b);
	t[1] = now_ns();
	check(bc->c, r, "alloc");
	r = kvc_seal(bc->c, bc->pool, bc->b, bc->h, n, bc->o);
	t[2] = now_ns();
	check(bc->c, r, "seal");
	r = kvc_release(bc->c, bc->o, n);
	t[3] = now_ns();
	check(bc->c, r, "release");
}

bool pool_info(struct bench_conn *bc, Kvcached__PoolInfo *out, uint64_t *pages_free)
{
	Kvcached__Request q = KVCACHED__REQUEST__INIT;
	Kvcached__Stats st = KVCACHED__STATS__INIT;
	Kvcached__Response *rs = NULL;
	bool found = false;
	size_t i;

	q.op_case = KVCACHED__REQUEST__OP_STATS;
	q.stats = &st;
	if (kvc_call(bc->c, &q, &rs) < 0)
		return false;
	if (rs->result_case == KVCACHED__RESPONSE__RESULT_STATS) {
		for (i = 0; i < rs->stats->n_pools; i++)
			if (rs->stats->pools[i]->pool_id == (uint32_t)bc->pool) {
				*out = *rs->stats->pools[i];
				out->namespace_ = out->name = out->dtype = NULL;
				found = true;
			}
		if (pages_free)
			*pages_free = rs->stats->pages_free;
	}
	kvcached__response__free_unpacked(rs, NULL);
	return found;
}

struct snap snap_take(struct bench_conn *bc)
{
	Kvcached__PoolInfo pi;
	struct snap sn = { 0 };

	if (pool_info(bc, &pi, NULL)) {
		sn.ok = true;
		sn.allocs = pi.allocs;
		sn.evictions = pi.evictions;
	}
	return sn;
}

double evicted_note(struct snap a, struct snap b)
{
	uint64_t allocs = b.allocs - a.allocs, ev = b.evictions - a.evictions;
	double pct;

	if (!a.ok || !b.ok || !allocs)
		return NAN;
	pct = 100.0 * (double)ev / (double)allocs;
	note("  pool: %" PRIu64 " blocks allocated (warm-up included), %" PRIu64
	     " of them (%.0f%%) by evicting a cached block", allocs, ev, pct);
	return pct;
}

void cycles_run(struct bench_conn *bc, uint32_t n, double secs, struct samples s[4])
{
	uint64_t t[4], warm_end = now_ns() + (uint64_t)(secs * 0.15e9), end;

	while (now_ns() < warm_end)
		cycle(bc, n, t);
	end = now_ns() + (uint64_t)(secs * 1e9);
	do {
		cycle(bc, n, t);
		sample_add(&s[0], t[1] - t[0]);
		sample_add(&s[1], t[2] - t[1]);
		sample_add(&s[2], t[3] - t[2]);
		sample_add(&s[3], t[3] - t[0]);
	} while (t[3] < end);
}
