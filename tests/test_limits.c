/* What one client may make the daemon hold is bounded (issue 10): a pool's
 * layout (max_layout_bytes), the pools of a namespace
 * (max_pools_per_namespace), and the daemon's memory with hundreds of pools
 * registered at the largest layout allowed. Each refusal is a clear error
 * with the numbers; nothing changes and the connection keeps working.
 * Pools are freed once nothing uses them (no session that registered them,
 * no block in use, nothing in a lower tier): a request naming a freed pool
 * fails cleanly, its id is not handed out again at once, new pools work,
 * and the invariant check stays clean throughout. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "kvsan.h"

#define BB 8192

static int reg(kvc_conn *c, const char *name, const void *layout, size_t len)
{
	struct kvc_pool_desc d = { .name = name, .block_bytes = BB, .block_tokens = 16,
				   .dtype = "fp16", .layout = layout, .layout_len = len };

	return kvc_register_pool(c, &d);
}

/* The daemon's anonymous memory (heap and the like, not the shared segments
 * it maps), in KiB. */
static long rss_anon_kib(pid_t pid)
{
	char path[64], line[256];
	long kib = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	CHECK((f = fopen(path, "r")) != NULL);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "RssAnon: %ld kB", &kib) == 1)
			break;
	fclose(f);
	CHECK(kib >= 0);
	return kib;
}

static void still_works(kvc_conn *c, int pool)
{
	kvc_block b;

	CHECK_EQ(kvc_alloc(c, pool, 1, &b), 1);
	CHECK_EQ(kvc_release(c, &b, 1), 0);
}

static void test_layout_and_count(void)
{
	struct kvt_daemon d;
	kvc_conn *c, *o;
	char name[32], *big = calloc(1, 1 << 20);
	int p, i;

	CHECK(big != NULL);
	kvt_start(&d, "--pool-size", "8MiB", "--segment-size", "2MiB", "--max-layout-bytes",
		  "4KiB", "--max-pools-per-namespace", "8", NULL);
	c = kvt_connect("lim-a");
	o = kvt_connect("lim-b");
	p = reg(c, "p0", big, 4096);   /* at the limit: fine */
	CHECK(p >= 0);

	/* One byte over: EINVAL naming the size and the limit. */
	CHECK_EQ(reg(c, "p1", big, 4097), KVC_EINVAL);
	fprintf(stderr, "layout says: %s\n", kvc_last_error(c));
	CHECK(strstr(kvc_last_error(c), "4097") && strstr(kvc_last_error(c), "max_layout_bytes") &&
	      strstr(kvc_last_error(c), "4096"));
	CHECK_EQ(reg(c, "p1", big, 1 << 20), KVC_EINVAL);
	/* Even for a name that exists: the layout is checked first. */
	CHECK_EQ(reg(c, "p0", big, 1 << 20), KVC_EINVAL);
	still_works(c, p);

	/* Eight pools in lim-a; the ninth is refused with the numbers. */
	for (i = 1; i < 8; i++) {
		snprintf(name, sizeof(name), "p%d", i);
		CHECK(reg(c, name, "x", 1) >= 0);
	}
	CHECK_EQ(reg(c, "p8", "x", 1), KVC_EQUOTA);
	fprintf(stderr, "quota says: %s\n", kvc_last_error(c));
	CHECK(strstr(kvc_last_error(c), "lim-a") && strstr(kvc_last_error(c), "8 pools") &&
	      strstr(kvc_last_error(c), "max_pools_per_namespace"));
	/* Joining a pool that exists takes nothing new: allowed at the limit. */
	CHECK_EQ(reg(c, "p0", big, 4096), p);
	CHECK_EQ(reg(o, "p0", big, 4096) >= 0, 1);  /* another namespace has its own count */
	still_works(c, p);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(o);
	kvc_close(c);
	kvt_stop(&d);
	free(big);
}

/* 300 pools with layouts just under the default max_layout_bytes (64KiB),
 * in five namespaces of 60 (the default max_pools_per_namespace is 64),
 * between refused attempts at layouts of a few MiB: the daemon's heap grows
 * by what it must keep, the layouts, and no more. (Before the limit, 200
 * pools with 4 MiB layouts took it from 3 MB to 826 MB.) */
static void test_rss_bound(void)
{
	enum { NS = 5, PER = 60, LAYOUT = 60 << 10 };
	struct kvt_daemon d;
	kvc_conn *c[NS];
	char name[32];
	uint8_t *lay = malloc(3 << 20);
	long before, after, bound;
	int i, k;

	CHECK(lay != NULL);
	memset(lay, 0x5a, 3 << 20);
	kvt_start(&d, "--pool-size", "8MiB", "--segment-size", "2MiB", NULL);
	for (k = 0; k < NS; k++) {
		snprintf(name, sizeof(name), "rss-%d", k);
		c[k] = kvt_connect(name);
	}
	/* A first pool and a refused big layout, so that the buffers a request
	 * of this size needs exist before the baseline. */
	CHECK(reg(c[0], "warm", lay, LAYOUT) >= 0);
	CHECK_EQ(reg(c[0], "big", lay, 3 << 20), KVC_EINVAL);
	before = rss_anon_kib(d.pid);
	for (i = 0; i < PER; i++)
		for (k = 0; k < NS; k++) {
			if (k == 0 && i == PER - 1)
				continue;  /* "warm" is rss-0's sixtieth */
			snprintf(name, sizeof(name), "p%d", i);
			lay[0] = (uint8_t)i;
			CHECK(reg(c[k], name, lay, LAYOUT) >= 0);
			/* Through one connection: each one's input buffer
			 * grows to the largest frame it was sent, which is
			 * max_frame's business, not this test's. */
			CHECK_EQ(reg(c[0], "big", lay, (size_t)(1 + (i + k) % 3) << 20), KVC_EINVAL);
		}
	after = rss_anon_kib(d.pid);
	/* The layouts (60 KiB each), a KiB per pool of bookkeeping, 8 MiB of
	 * slack for the allocator. */
	bound = (long)NS * PER * (LAYOUT / 1024 + 1) + 8192;
	fprintf(stderr, "rss: %ld KiB before, %ld KiB after 300 pools (bound: +%ld KiB)\n", before,
		after, bound);
	/* Built with AddressSanitizer (KV_ASAN: the daemon too, in the same
	 * build), its quarantine keeps freed memory resident (256 MiB by
	 * default), so the daemon's RSS says nothing about what it keeps. */
	if (KV_ASAN)
		fprintf(stderr, "rss: not checked under AddressSanitizer (its quarantine)\n");
	else
		CHECK(after - before <= bound);
	CHECK_EQ(kvt_check(), 0);
	for (k = 0; k < NS; k++)
		kvc_close(c[k]);
	kvt_stop(&d);
	free(lay);
}

static Kvcached__Response *admin_call(Kvcached__Request *rq)
{
	kvc_conn *c = kvt_connect(NULL);
	Kvcached__Response *rs = NULL;

	CHECK_EQ(kvc_call(c, rq, &rs), 0);
	kvc_close(c);
	return rs;
}

/* Whether the daemon lists pool id under name. */
static int pool_listed(int id, const char *name)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Stats st = KVCACHED__STATS__INIT;
	Kvcached__Response *rs;
	int found = 0;
	size_t i;

	rq.op_case = KVCACHED__REQUEST__OP_STATS;
	rq.stats = &st;
	rs = admin_call(&rq);
	CHECK(rs->result_case == KVCACHED__RESPONSE__RESULT_STATS);
	for (i = 0; i < rs->stats->n_pools; i++)
		if ((int)rs->stats->pools[i]->pool_id == id && !strcmp(rs->stats->pools[i]->name, name))
			found = 1;
	kvcached__response__free_unpacked(rs, NULL);
	return found;
}

/* kvctl evict: tier (0 G1, 1 G2) of every pool. */
static void evict_all(int tier)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Evict ev = KVCACHED__EVICT__INIT;
	Kvcached__Response *rs;

	ev.tier = (Kvcached__Tier)tier;
	ev.all_pools = 1;
	rq.op_case = KVCACHED__REQUEST__OP_EVICT;
	rq.evict = &ev;
	rs = admin_call(&rq);
	CHECK(!rs->error && rs->result_case == KVCACHED__RESPONSE__RESULT_EVICT);
	kvcached__response__free_unpacked(rs, NULL);
}

static void test_pools_freed(void)
{
	struct kvt_daemon d;
	kvc_conn *a, *o, *c2;
	kvc_block b[3], x, stale;
	kvc_hash h = kvt_hash(1);
	int pa, q, p2, lonely;

	kvt_start(&d, "--pool-size", "8MiB", "--segment-size", "2MiB", NULL);
	a = kvt_connect("fr");
	pa = kvt_pool(a, "p", BB);
	CHECK_EQ(kvc_alloc(a, pa, 2, b), 2);
	CHECK_EQ(kvc_seal(a, pa, b, &h, 1, b), 1);
	stale = b[1];
	CHECK_EQ(kvc_release(a, b, 2), 0);   /* one cached, one free */
	kvc_close(a);
	kvt_wait_sessions(0);
	/* No session registered it any more, but a cached block keeps it. */
	CHECK(pool_listed(pa, "p"));
	CHECK_EQ(kvt_check(), 0);
	/* A session of the namespace may use it without registering... */
	o = kvt_connect("fr");
	CHECK_EQ(kvc_lookup(o, pa, &h, 1, &x), 1);
	CHECK_EQ(kvc_release(o, &x, 1), 0);
	/* ...until its last block goes: then it is freed. */
	evict_all(0);
	CHECK(!pool_listed(pa, "p"));
	CHECK_EQ(kvt_check(), 0);
	CHECK_EQ(kvc_alloc(o, pa, 1, &x), KVC_ENOENT);
	fprintf(stderr, "freed pool says: %s\n", kvc_last_error(o));
	CHECK_EQ(kvc_lookup(o, pa, &h, 1, &x), KVC_ENOENT);
	CHECK_EQ(kvc_release(o, &stale, 1), KVC_ESTALE);
	/* New pools get new ids, the freed one is not handed out again yet;
	 * the same name makes a new pool. */
	q = kvt_pool(o, "q", BB);
	p2 = kvt_pool(o, "p", BB);
	CHECK(q != pa && p2 != pa && q != p2);
	still_works(o, q);
	still_works(o, p2);
	CHECK_EQ(kvc_lookup(o, p2, &h, 1, &x), 0);  /* nothing of the old pool */
	CHECK_EQ(kvc_alloc(o, pa, 1, &x), KVC_ENOENT);
	CHECK_EQ(kvt_check(), 0);

	/* A session that goes takes the pools only it used, with the blocks it
	 * held, along. */
	c2 = kvt_connect("fr2");
	lonely = kvt_pool(c2, "lonely", BB);
	CHECK_EQ(kvc_alloc(c2, lonely, 3, b), 3);
	CHECK(pool_listed(lonely, "lonely"));
	kvc_close(c2);
	kvt_wait_sessions(1);
	CHECK(!pool_listed(lonely, "lonely"));
	CHECK(pool_listed(q, "q") && pool_listed(p2, "p"));  /* o still has them */
	still_works(o, q);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(o);
	kvt_wait_sessions(0);
	CHECK(!pool_listed(q, "q") && !pool_listed(p2, "p"));
	CHECK_EQ(kvt_check(), 0);
	kvt_stop(&d);
}

/* A pool whose blocks live on only in the host tier is kept until the tier
 * drops them: what is found there is still served. */
static void test_pools_kept_by_tiers(void)
{
	struct kvt_daemon d;
	kvc_conn *a;
	kvc_block b[8];
	kvc_hash h[8];
	struct kvt_tier g2;
	int p, i;

	kvt_start(&d, "--pool-size", "8MiB", "--segment-size", "2MiB", "--host-tier-size", "8MiB",
		  NULL);
	for (i = 0; i < 8; i++)
		h[i] = kvt_hash(100 + (uint64_t)i);
	a = kvt_connect("tk");
	p = kvt_pool(a, "p", BB);
	CHECK_EQ(kvc_alloc(a, p, 8, b), 8);
	CHECK_EQ(kvc_seal(a, p, b, h, 8, b), 8);
	CHECK_EQ(kvc_release(a, b, 8), 0);
	kvc_close(a);
	kvt_wait_sessions(0);
	evict_all(0);   /* G1: demoted into G2 */
	kvt_tiers_settle();
	kvt_tier(1, &g2);
	CHECK_EQ(g2.blocks, 8);
	CHECK(pool_listed(p, "p"));
	CHECK_EQ(kvt_check(), 0);
	/* The same pool again, and its blocks, promoted. */
	a = kvt_connect("tk");
	CHECK_EQ(kvt_pool(a, "p", BB), p);
	CHECK_EQ(kvc_lookup(a, p, h, 8, b), 8);
	CHECK_EQ(kvc_release(a, b, 8), 0);
	kvc_close(a);
	kvt_wait_sessions(0);
	evict_all(0);
	kvt_tiers_settle();
	CHECK(pool_listed(p, "p"));
	CHECK_EQ(kvt_check(), 0);
	evict_all(1);   /* G2 dropped (no disk tier): nothing is left of the pool */
	kvt_tiers_settle();
	kvt_tier(1, &g2);
	CHECK_EQ(g2.blocks, 0);
	CHECK(!pool_listed(p, "p"));
	CHECK_EQ(kvt_check(), 0);
	/* And a new one works, through the tier too. */
	a = kvt_connect("tk");
	p = kvt_pool(a, "p", BB);
	CHECK_EQ(kvc_lookup(a, p, h, 8, b), 0);
	CHECK_EQ(kvc_alloc(a, p, 8, b), 8);
	CHECK_EQ(kvc_seal(a, p, b, h, 8, b), 8);
	CHECK_EQ(kvc_release(a, b, 8), 0);
	evict_all(0);
	kvt_tiers_settle();
	CHECK_EQ(kvc_lookup(a, p, h, 8, b), 8);
	CHECK_EQ(kvc_release(a, b, 8), 0);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(a);
	kvt_stop(&d);
}

/* A warm restart finds the blocks of a pool by its layout, whatever its id:
 * here the pool had id 1 before (id 0 was another pool's, freed), and gets
 * id 0 after. */
static void test_adopt_after_free(void)
{
	struct kvt_daemon d;
	char dir[] = "/tmp/kvt-limits.XXXXXX", disk[64], idx[80];
	kvc_conn *a;
	kvc_block b[8];
	kvc_hash h[8];
	int p, x, i;

	CHECK(mkdtemp(dir) != NULL);
	snprintf(disk, sizeof(disk), "%s/g3", dir);
	snprintf(idx, sizeof(idx), "%s.idx", disk);
	for (i = 0; i < 8; i++)
		h[i] = kvt_hash(200 + (uint64_t)i);
	kvt_start(&d, "--pool-size", "8MiB", "--segment-size", "2MiB", "--host-tier-size", "8MiB",
		  "--disk-path", disk, "--disk-size", "16MiB", NULL);
	a = kvt_connect("ad");
	x = kvt_pool(a, "x", BB);
	p = kvt_pool(a, "p", BB);
	CHECK(x == 0 && p == 1);
	CHECK_EQ(kvc_alloc(a, p, 8, b), 8);
	for (i = 0; i < 8; i++)
		kvt_mem_fill(a, kvc_block_ptr(a, b[i]), BB, 300 + (uint64_t)i);
	CHECK_EQ(kvc_seal(a, p, b, h, 8, b), 8);
	CHECK_EQ(kvc_release(a, b, 8), 0);
	kvc_close(a);
	kvt_wait_sessions(0);
	evict_all(0);   /* into G2: the pool stays, x goes */
	kvt_tiers_settle();
	CHECK(!pool_listed(x, "x") && pool_listed(p, "p"));
	CHECK_EQ(kvt_check(), 0);
	kvt_stop(&d);   /* writes G2 back to G3 and the journal */

	kvt_start(&d, "--pool-size", "8MiB", "--segment-size", "2MiB", "--host-tier-size", "8MiB",
		  "--disk-path", disk, "--disk-size", "16MiB", NULL);
	a = kvt_connect("ad");
	p = kvt_pool(a, "p", BB);
	CHECK_EQ(p, 0);
	CHECK_EQ(kvc_lookup(a, p, h, 8, b), 8);
	for (i = 0; i < 8; i++)
		CHECK(kvt_mem_verify(a, kvc_block_ptr(a, b[i]), BB, 300 + (uint64_t)i));
	CHECK_EQ(kvc_release(a, b, 8), 0);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(a);
	kvt_stop(&d);
	unlink(disk);
	unlink(idx);
	CHECK(rmdir(dir) == 0);
}

/* max_swap_per_session: one connection's swapped-out block bytes are
 * bounded (EQUOTA with the numbers, nothing changed); a swap in gives room
 * back; another connection has its own allowance; swaps hold their pool. */
static void test_swap_cap(void)
{
	struct kvt_daemon d;
	kvc_conn *a, *o, *o2;
	kvc_block b[16], ain[16], back[16], x[2];
	uint64_t s1, s2, s3, s4;
	int p;

	kvt_start(&d, "--pool-size", "8MiB", "--segment-size", "2MiB", "--host-tier-size", "8MiB",
		  "--max-swap-per-session", "64KiB", NULL);
	a = kvt_connect("sw");
	o = kvt_connect("sw");
	p = kvt_pool(a, "p", BB);   /* 8 KiB blocks: 8 fit the cap */
	CHECK_EQ(kvt_pool(o, "p", BB), p);
	CHECK_EQ(kvc_alloc(a, p, 11, b), 11);
	CHECK_EQ(kvc_swap_out(a, b, 6, &s1), 0);   /* 48 KiB */
	CHECK_EQ(kvc_swap_out(a, b + 6, 3, &s2), KVC_EQUOTA);   /* 72 KiB */
	fprintf(stderr, "swap says: %s\n", kvc_last_error(a));
	CHECK(strstr(kvc_last_error(a), "24576") && strstr(kvc_last_error(a), "49152") &&
	      strstr(kvc_last_error(a), "max_swap_per_session") && strstr(kvc_last_error(a), "65536"));
	/* Nothing changed: the blocks are still ours. */
	CHECK_EQ(kvc_release(a, b + 8, 1), 0);
	CHECK_EQ(kvc_swap_out(a, b + 6, 2, &s2), 0);   /* exactly 64 KiB */
	/* Another connection swaps on its own account. */
	CHECK_EQ(kvc_alloc(o, p, 8, back), 8);
	CHECK_EQ(kvc_swap_out(o, back, 8, &s3), 0);
	/* Swapping in gives the room back. */
	CHECK_EQ(kvc_swap_in(a, s1, ain, 16), 6);
	CHECK_EQ(kvc_swap_out(a, b + 9, 2, &s1), 0);
	CHECK_EQ(kvt_check(), 0);
	/* A swap keeps its pool: o2 never registers it, a and o close (a's
	 * swaps go with it), and the pool stays while o2's swap holds it. */
	o2 = kvt_connect("sw");
	CHECK_EQ(kvc_alloc(o2, p, 2, x), 2);
	CHECK_EQ(kvc_swap_out(o2, x, 2, &s4), 0);
	CHECK_EQ(kvc_swap_in(o, s3, back, 16), 8);
	CHECK_EQ(kvc_release(o, back, 8), 0);
	kvc_close(a);
	kvc_close(o);
	kvt_wait_sessions(1);
	CHECK(pool_listed(p, "p"));
	CHECK_EQ(kvt_check(), 0);
	CHECK_EQ(kvc_swap_in(o2, s4, x, 2), 2);
	CHECK_EQ(kvc_release(o2, x, 2), 0);
	CHECK(!pool_listed(p, "p"));
	CHECK_EQ(kvt_check(), 0);
	kvc_close(o2);
	kvt_stop(&d);
}

int main(void)
{
	test_layout_and_count();
	test_rss_bound();
	test_pools_freed();
	test_pools_kept_by_tiers();
	test_adopt_after_free();
	test_swap_cap();
	return 0;
}
