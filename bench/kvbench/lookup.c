/* kvbench section d: lookup of a 1,000-block chain sealed and cached just
 * before (every hash hits), then the release of the references it took,
 * timed apart; and the same of a chain whose blocks are out of order. */
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

/* The rows of a lookup of chain (CHAIN_LEN hashes, sealed and cached) and
 * of the release of what it took, timed apart, and the daemon's and the
 * client's CPU per lookup and per release. */
struct lookup_names {
	const char *lookup, *release;          /* the timed rows */
	const char *cpu_lookup, *cpu_release;  /* the CPU rows */
};

static void lookup_rows(struct bench_conn *bc, const kvc_hash *chain, kvc_block *held,
			const struct lookup_names *nm)
{
	struct samples s = { 0 }, rel = { 0 }, cl = { 0 };
	uint64_t warm_end, end, t0, t1, t2;
	struct frames f = fr(OP_LOOKUP, CHAIN_LEN);
	double fl = floor_op(OP_LOOKUP, CHAIN_LEN), flr = floor_op(OP_RELEASE, CHAIN_LEN);
	struct row *r;
	int k;

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
	r = add_row('d', nm->lookup);
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
	r = add_row('d', nm->release);
	row_from(r, &rel, 1);
	f = fr(OP_RELEASE, CHAIN_LEN);
	r->req = f.req;
	r->resp = f.resp;
	r->floor_p50 = flr;
	print_row(r);
	sample_free(&s);
	sample_free(&rel);
	/* The CPU: a pass of its own (the reads between the requests stay
	 * out of the timed one). */
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
		cpu_row('d', nm->cpu_lookup, &s);
		cpu_row('d', nm->cpu_release, &rel);
		/* kvbench's own thread in kvc_lookup(): the frames' encode and
		 * decode, the reply's checks and the socket calls. */
		cpu_row_of('d', "client", nm->cpu_lookup, &cl);
		sample_free(&s);
		sample_free(&rel);
		sample_free(&cl);
	}
}

/* How many of b[1..n) lie in the slot after the one before them (dir 1)
 * or before it (-1); a handle names its run by its first page, bits
 * 12-31, and its slot, bits 0-11. The daemon's lookup takes those without
 * a probe of its index, so a chain's figures depend on them, and the
 * pool's history decides them. */
static size_t beside(const kvc_block *b, size_t n, int dir)
{
	size_t k = 0;

	for (size_t i = 1; i < n; i++)
		k += ((b[i] ^ b[i - 1]) & 0xfffff000u) == 0 &&
		     (int64_t)(b[i] & 0xfff) - (int64_t)(b[i - 1] & 0xfff) == dir;
	return k;
}

/* A chain sealed from one allocation lies in consecutive slots, and the
 * daemon's lookup asks each block's next slot before its index (issue 38).
 * The second chain is sealed on its allocation's blocks in a random order,
 * so that every hash takes the index: the lookup of a chain whose blocks
 * came from many allocations. */
void section_lookup(struct bench_conn *bc)
{
	kvc_hash *chain = calloc(CHAIN_LEN, sizeof(*chain));
	kvc_block *held = calloc(CHAIN_LEN, sizeof(*held));
	kvc_block *shuf = calloc(CHAIN_LEN, sizeof(*shuf));

	if (!chain || !held || !shuf)
		die("out of memory");
	fresh_hashes(chain, CHAIN_LEN);
	check(bc->c, kvc_alloc(bc->c, bc->pool, CHAIN_LEN, held), "alloc");
	note("  the chain: of its blocks after the first, %zu in the slot after the one before "
	     "and %zu in the slot before it (the pool's free blocks and evictions decide)",
	     beside(held, CHAIN_LEN, 1), beside(held, CHAIN_LEN, -1));
	check(bc->c, kvc_seal(bc->c, bc->pool, held, chain, CHAIN_LEN, held), "seal");
	check(bc->c, kvc_release(bc->c, held, CHAIN_LEN), "release");
	lookup_rows(bc, chain, held, &(struct lookup_names){ "lookup 1000 (all hit)",
		    "release 1000 (after each lookup)", "lookup 1000", "release 1000" });

	fresh_hashes(chain, CHAIN_LEN);
	check(bc->c, kvc_alloc(bc->c, bc->pool, CHAIN_LEN, shuf), "alloc");
	for (size_t i = CHAIN_LEN - 1; i > 0; i--) {
		size_t j = (size_t)(splitmix64(&(uint64_t){ i * 0x9e3779b97f4a7c15ull }) % (i + 1));
		kvc_block t = shuf[i];

		shuf[i] = shuf[j];
		shuf[j] = t;
	}
	note("  the second chain: %zu after, %zu before", beside(shuf, CHAIN_LEN, 1),
	     beside(shuf, CHAIN_LEN, -1));
	check(bc->c, kvc_seal(bc->c, bc->pool, shuf, chain, CHAIN_LEN, shuf), "seal");
	check(bc->c, kvc_release(bc->c, shuf, CHAIN_LEN), "release");
	lookup_rows(bc, chain, held, &(struct lookup_names){ "lookup 1000, blocks out of order",
		    "release 1000 (after each)", "lookup 1000 out of order",
		    "release 1000 out of order" });
	free(chain);
	free(held);
	free(shuf);
}
