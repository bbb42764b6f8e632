/* What one client may make the daemon hold is bounded (issue 10): a pool's
 * layout (max_layout_bytes), the pools of a namespace
 * (max_pools_per_namespace), and the daemon's memory with hundreds of pools
 * registered at the largest layout allowed. Each refusal is a clear error
 * with the numbers; nothing changes and the connection keeps working. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

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
	CHECK(after - before <= bound);
	CHECK_EQ(kvt_check(), 0);
	for (k = 0; k < NS; k++)
		kvc_close(c[k]);
	kvt_stop(&d);
	free(lay);
}

int main(void)
{
	test_layout_and_count();
	test_rss_bound();
	return 0;
}
