/* Replies larger than a frame come in pages (docs/protocol.md, "Paging"):
 * with 3000 pools in three namespaces and a 64 KiB max_frame, an unpaged
 * Stats or Metrics is a clean E2BIG (the connection goes on), and kvctl's
 * metrics, pools and status, as tables and as JSON, print exactly what
 * they print from a daemon whose frames hold it all at once (the same pools
 * and blocks; only the uptime and request counts differ). kvctl is
 * $KVCTL_BIN. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define NPOOLS 3000
#define BB 8192

static const char *const cmds[] = { "metrics", "pools", "-o json pools", "status",
				    "-o json status", "-o json metrics" };
#define NCMDS (sizeof(cmds) / sizeof(cmds[0]))

/* The same pools and blocks every time: 1000 pools in each of three
 * namespaces, and in every 100th pool two sealed blocks (cached once
 * released) and one held. */
static void populate(kvc_conn *c[3])
{
	char name[32];
	int i, p;

	for (i = 0; i < NPOOLS; i++) {
		kvc_conn *k = c[i % 3];

		snprintf(name, sizeof(name), "pool-%04d", i);
		p = kvt_pool(k, name, BB);
		if (i % 100 == 0) {
			kvc_block b[3];
			kvc_hash h[2] = { kvt_hash((uint64_t)i * 2), kvt_hash((uint64_t)i * 2 + 1) };

			CHECK_EQ(kvc_alloc(k, p, 3, b), 3);
			CHECK_EQ(kvc_seal(k, p, b, h, 2, b), 2);
			CHECK_EQ(kvc_release(k, b, 2), 0);
		}
	}
}

/* Runs kvctl ARGS into a malloc()ed string, without the lines that differ
 * from one daemon to the next whatever they hold: uptime, requests, the
 * requests' service times, the loop's turns and the connections' buffers
 * (kvctl's own reply among them). */
static char *kvctl(const char *args)
{
	char cmd[512], line[4096];
	const char *bin = getenv("KVCTL_BIN");
	size_t len = 0, cap = 1 << 20;
	char *out = malloc(cap);
	FILE *f;

	CHECK(bin && out);
	snprintf(cmd, sizeof(cmd), "%s %s 2>&1", bin, args);
	CHECK((f = popen(cmd, "r")) != NULL);
	while (fgets(line, sizeof(line), f)) {
		size_t n = strlen(line);

		if (strstr(line, "kvcached_uptime_seconds ") == line ||
		    strstr(line, "kvcached_requests_total ") == line || strstr(line, "uptime ") == line ||
		    strstr(line, "requests ") == line || strstr(line, "\"uptime_ms\":") ||
		    strstr(line, "\"requests\":") ||
		    strstr(line, "kvcached_request_duration_seconds") == line ||
		    strstr(line, "kvcached_loop_lag_seconds") == line ||
		    strstr(line, "kvcached_connection_buffer_bytes ") == line)
			continue;
		while (len + n + 1 > cap)
			CHECK((out = realloc(out, cap *= 2)) != NULL);
		memcpy(out + len, line, n + 1);
		len += n;
	}
	if (pclose(f) != 0) {
		fprintf(stderr, "kvctl %s failed:\n%.2000s\n", args, out);
		exit(1);
	}
	return out;
}

/* Lines of s that start with what. (Not strstr() in a loop: under
 * AddressSanitizer each call checks the whole rest of the string.) */
static size_t count_lines(const char *s, const char *what)
{
	size_t n = 0, len = strlen(what);

	while (*s) {
		const char *nl = strchr(s, '\n');

		n += !strncmp(s, what, len);
		if (!nl)
			break;
		s = nl + 1;
	}
	return n;
}

/* JSON keys (one per line, as kvctl indents). */
static size_t count_keys(const char *s, const char *key)
{
	size_t n = 0, len = strlen(key);

	while (*s) {
		const char *nl = strchr(s, '\n');

		while (*s == ' ')
			s++;
		n += !strncmp(s, key, len);
		if (!nl)
			break;
		s = nl + 1;
	}
	return n;
}

/* Stats and Metrics without paging: E2BIG with the sizes, and the
 * connection carries on. */
static void unpaged_refused(void)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Stats st = KVCACHED__STATS__INIT;
	Kvcached__Metrics m = KVCACHED__METRICS__INIT;
	Kvcached__Response *rs = NULL;
	kvc_conn *c = kvt_connect(NULL);

	rq.op_case = KVCACHED__REQUEST__OP_STATS;
	rq.stats = &st;
	CHECK_EQ(kvc_call(c, &rq, &rs), KVC_E2BIG);
	fprintf(stderr, "unpaged stats: %s\n", kvc_last_error(c));
	CHECK(strstr(kvc_last_error(c), "3000 pools") && strstr(kvc_last_error(c), "max_frame"));
	rq.op_case = KVCACHED__REQUEST__OP_METRICS;
	rq.metrics = &m;
	CHECK_EQ(kvc_call(c, &rq, &rs), KVC_E2BIG);
	fprintf(stderr, "unpaged metrics: %s\n", kvc_last_error(c));
	/* Paged: the first page, and more to come. */
	st.page = 1;
	rq.op_case = KVCACHED__REQUEST__OP_STATS;
	rq.stats = &st;
	CHECK_EQ(kvc_call(c, &rq, &rs), 0);
	CHECK(rs->stats->more && rs->stats->n_pools > 0 && rs->stats->n_pools < NPOOLS);
	CHECK_EQ(rs->stats->n_namespaces, 4);   /* three, and ours */
	fprintf(stderr, "first stats page: %zu pools, next %u\n", rs->stats->n_pools,
		rs->stats->next_pool);
	kvcached__response__free_unpacked(rs, NULL);
	kvc_close(c);
}

static void run(char *out[NCMDS], const char *max_frame, int small)
{
	struct kvt_daemon d;
	kvc_conn *c[3];
	size_t i;

	kvt_start(&d, "--pool-size", "8MiB", "--segment-size", "2MiB", "--page-size", "64KiB",
		  "--max-frame", max_frame,
		  "--max-batch", "64", "--max-pools-per-namespace", "1000", NULL);
	c[0] = kvt_connect("pg-a");
	c[1] = kvt_connect("pg-b");
	c[2] = kvt_connect("pg-c");
	populate(c);
	if (small)
		unpaged_refused();
	for (i = 0; i < NCMDS; i++)
		out[i] = kvctl(cmds[i]);
	CHECK_EQ(kvt_check(), 0);
	for (i = 0; i < 3; i++)
		kvc_close(c[i]);
	kvt_stop(&d);
}

int main(void)
{
	char *small[NCMDS], *big[NCMDS];
	size_t i;

	if (!getenv("KVCTL_BIN")) {
		fprintf(stderr, "KVCTL_BIN is not set (run through meson test)\n");
		return 77;
	}
	run(small, "64KiB", 1);
	run(big, "64MiB", 0);
	for (i = 0; i < NCMDS; i++) {
		fprintf(stderr, "kvctl %s: %zu bytes\n", cmds[i], strlen(big[i]));
		if (strcmp(small[i], big[i])) {
			size_t k = 0;

			while (small[i][k] == big[i][k])
				k++;
			fprintf(stderr, "kvctl %s differs at byte %zu:\n--- paged:\n%.300s\n--- "
				"whole:\n%.300s\n", cmds[i], k, small[i] + (k > 100 ? k - 100 : 0),
				big[i] + (k > 100 ? k - 100 : 0));
			return 1;
		}
	}
	/* Whole, and well formed: each family once, every pool in it. */
	CHECK_EQ(count_lines(small[0], "# HELP kvcached_pool_runs "), 1);
	CHECK_EQ(count_lines(small[0], "kvcached_pool_runs{"), NPOOLS);
	CHECK_EQ(count_lines(small[0], "kvcached_pool_blocks{"), 4 * NPOOLS);
	CHECK_EQ(count_lines(small[0], "# HELP "), count_lines(small[0], "# TYPE "));
	CHECK_EQ(count_keys(small[2], "\"pool_id\":"), NPOOLS);
	CHECK(strstr(small[3], "pools     3000\n") != NULL);
	for (i = 0; i < NCMDS; i++) {
		free(small[i]);
		free(big[i]);
	}
	return 0;
}
