/* kvbench section d: lookup of a 1,000-block chain sealed and cached just
 * before (every hash hits), then the release of the references it took,
 * timed apart. */
#include <stdlib.h>
#include <time.h>

#include "kvbench.h"

/* This thread's CPU time (user and system), ns. */
static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void section_lookup(struct bench_conn *bc)
{
	kvc_hash *chain = calloc(CHAIN_LEN, sizeof(*chain));
	kvc_block *held = calloc(CHAIN_LEN, sizeof(*held));
	struct samples s = { 0 }, rel = { 0 }, cl = { 0 };
	uint64_t warm_end, end, t0, t1, t2;
	struct frames f = fr(OP_LOOKUP, CHAIN_LEN);
	double fl = floor_op(OP_LOOKUP, CHAIN_LEN), flr = floor_op(OP_RELEASE, CHAIN_LEN);
	struct row *r;
	int k;

	if (!chain || !held)
		die("out of memory");
	fresh_hashes(chain, CHAIN_LEN);
	check(bc->c, kvc_alloc(bc->c, bc->pool, CHAIN_LEN, held), "alloc");
	check(bc->c, kvc_seal(bc->c, bc->pool, held, chain, CHAIN_LEN, held), "seal");
	check(bc->c, kvc_release(bc->c, held, CHAIN_LEN), "release");

	warm_end = now_ns() + (uint64_t)(D.lookup * 0.15e9);
	end = 0;
	for (;;) {
		t0 = now_ns();
		k = kvc_lookup(bc->c, bc->pool, chain, CHAIN_LEN, held);
		t1 = now_ns();
		check(bc->c, k, "lookup");
		if (k != (int)CHAIN_LEN)
			die("lookup found %d of the %u blocks of a chain sealed just before: "
			    "evicted under our feet? (pool too small)", k, CHAIN_LEN);
		check(bc->c, kvc_release(bc->c, held, CHAIN_LEN), "release");
		t2 = now_ns();
		if (!end) {
			if (t2 >= warm_end)
				end = t2 + (uint64_t)(D.lookup * 1e9);
			continue;
		}
		sample_add(&s, t1 - t0);
		sample_add(&rel, t2 - t1);
		if (t2 >= end)
			break;
	}
	r = add_row('d', "lookup 1000 (all hit)");
	row_from(r, &s, 1);
	r->req = f.req;
	r->resp = f.resp;
	r->floor_p50 = fl;
	print_row(r);
	r = add_row('d', "  per hash (lookup / 1000)");
	row_from(r, &s, CHAIN_LEN);
	r->p50 /= CHAIN_LEN;
	r->p99 /= CHAIN_LEN;
	r->ops_unit = "hashes/s";
	print_row(r);
	r = add_row('d', "release 1000 (after each lookup)");
	row_from(r, &rel, 1);
	f = fr(OP_RELEASE, CHAIN_LEN);
	r->req = f.req;
	r->resp = f.resp;
	r->floor_p50 = flr;
	print_row(r);
	sample_free(&s);
	sample_free(&rel);
	/* The daemon's CPU per lookup and per release: a pass of its own (the
	 * reads between the requests stay out of the timed one). */
	if (daemon_cpu_ns(bc)) {
		for (unsigned i = 0; i < 3000; i++) {
			uint64_t c0 = daemon_cpu_ns(bc), c1, c2, u0, u1;

			u0 = thread_cpu_ns();
			k = kvc_lookup(bc->c, bc->pool, chain, CHAIN_LEN, held);
			u1 = thread_cpu_ns();
			c1 = daemon_cpu_ns(bc);
			check(bc->c, k, "lookup");
			if (k != (int)CHAIN_LEN)
				die("lookup found %d of the %u blocks of its chain", k, CHAIN_LEN);
			check(bc->c, kvc_release(bc->c, held, CHAIN_LEN), "release");
			c2 = daemon_cpu_ns(bc);
			sample_add(&s, c1 - c0);
			sample_add(&rel, c2 - c1);
			sample_add(&cl, u1 - u0);
		}
		cpu_row('d', "lookup 1000", &s);
		cpu_row('d', "release 1000", &rel);
		/* kvbench's own thread in kvc_lookup(): the frames' encode and
		 * decode, the reply's checks and the socket calls. */
		cpu_row_of('d', "client", "lookup 1000", &cl);
		sample_free(&s);
		sample_free(&rel);
		sample_free(&cl);
	}
	free(chain);
	free(held);
}
