/* kvbench: the daemon connection that sections b-f share: the 4 KiB pool,
 * one alloc+seal+release cycle, the pool's counters. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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
	free(bc->h);
	free(bc->b);
	free(bc->o);
	memset(bc, 0, sizeof(*bc));
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
