/* kvbench section f: --fill N fills the pool with N cached blocks first, so
 * that the pool has no free block and every later alloc must evict; then
 * 1-block cycles: whether the per-op cost stays flat as the population
 * grows. */
#include <inttypes.h>
#include <stdio.h>

#include "kvbench.h"

void section_fill(struct bench_conn *bc)
{
	static const char *const what[3] = { "  alloc 1 (evicting)", "  seal 1", "  release 1" };
	struct frames f[3] = { fr(OP_ALLOC, 1), fr(OP_SEAL, 1), fr(OP_RELEASE, 1) };
	double fl[4] = { floor_op(OP_ALLOC, 1), floor_op(OP_SEAL, 1), floor_op(OP_RELEASE, 1),
			 floor_cycle(1) };
	uint64_t left = fill_n, t0 = now_ns(), pages_free = 0;
	struct samples s[4] = { { 0 } };
	uint32_t batch = FILL_BATCH;
	Kvcached__PoolInfo pi;
	struct snap s0, s1;
	struct row *r;
	char name[48];
	double secs, ev;
	int i;

	if (kvc_conn_hello(bc->c)->max_batch < batch)
		batch = kvc_conn_hello(bc->c)->max_batch;
	while (left) {
		uint32_t n = left < batch ? (uint32_t)left : batch;

		if (bc->cap < n)
			die("internal: batch %u over %zu", n, bc->cap);
		fresh_hashes(bc->h, n);
		check(bc->c, kvc_alloc(bc->c, bc->pool, n, bc->b), "fill: alloc");
		check(bc->c, kvc_seal(bc->c, bc->pool, bc->b, bc->h, n, bc->o), "fill: seal");
		check(bc->c, kvc_release(bc->c, bc->o, n), "fill: release");
		left -= n;
	}
	secs = (double)(now_ns() - t0) / 1e9;
	if (pool_info(bc, &pi, &pages_free)) {
		note("  filled %" PRIu64 " blocks in %.2f s (%.0f blocks/s): the pool holds %" PRIu64
		     " cached and %" PRIu64 " free blocks, %" PRIu64 " pages are free", fill_n, secs,
		     (double)fill_n / secs, pi.blocks_cached, pi.blocks_free, pages_free);
		if (pi.blocks_free || pages_free)
			note("  warning: the pool is not full: some allocs below will not evict");
	} else {
		note("  filled %" PRIu64 " blocks in %.2f s", fill_n, secs);
	}
	s0 = snap_take(bc);
	cycles_run(bc, 1, D.fill, s);
	s1 = snap_take(bc);
	snprintf(name, sizeof(name), "alloc+seal+release 1, N=%" PRIu64, fill_n);
	r = add_row('f', name);
	row_from(r, &s[3], 1);
	r->req = f[0].req + f[1].req + f[2].req;
	r->resp = f[0].resp + f[1].resp + f[2].resp;
	r->floor_p50 = fl[3];
	r->ops_unit = "cycles/s";
	print_row(r);
	for (i = 0; i < 3; i++) {
		r = add_row('f', what[i]);
		row_from(r, &s[i], 1);
		r->req = f[i].req;
		r->resp = f[i].resp;
		r->floor_p50 = fl[i];
		print_row(r);
	}
	ev = evicted_note(s0, s1);
	for (i = 0; i < 4; i++) {
		rows[nrows - 1 - (size_t)i].evicted = ev;
		sample_free(&s[i]);
	}
}
