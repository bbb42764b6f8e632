/* G4 against hostile values (issue 29): a real Redis Cluster (3 masters) on
 * loopback and kvcached daemons standing for nodes of a fleet.
 *
 *   keyed:    namespace "keyed" has remote_key_file: node A writes a chain
 *             (each value tagged with HMAC-SHA-256), node B reads all of it;
 *   forged:   a value changed in the cluster with its header and CRC32C
 *             recomputed (what whoever can write the key but lacks the
 *             secret can do) is a miss on a fresh node, counted as an auth
 *             failure, the chain served up to it, never a wrong byte;
 *   oversize: a 64 MiB value (KVT_G4_BIG_MIB) planted under a block's key (a block is 64 KiB)
 *             is refused after one byte more than a block (counted), the
 *             daemon's peak RSS stays far below the value, and the other
 *             tenant ("other") is served its whole chain meanwhile;
 *   default:  (issue 36) G4 values are authenticated unless the operator
 *             opts out: a namespace with remote = yes and no
 *             remote_key_file, in the default configuration, stops the
 *             daemon's start with a message naming it; every one of
 *             "keyed"'s 8 values forged (3 of them "other"'s blocks moved
 *             under "keyed"'s keys, headers and CRC32C recomputed): 0
 *             served, 8 auth failures; "other" opted out (remote_auth =
 *             off): the start-up WARNING names it (and not "keyed"), and the
 *             same forgeries of its values are all served, which is what the
 *             opt-out means; a reload that takes the opt-out away (no key) is
 *             refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvconfig.h"

#if !KV_HAVE_HIREDIS
int main(void)
{
	SKIP("built without hiredis: no G4");
}
#else
#include "crc32c.h"
#include "rcluster_harness.h"

#define BB 65536u
#define N 8
#define HDR 80   /* struct slot_hdr */
#define TAG 32
/* The planted value: 64 MiB, or $KVT_G4_BIG_MIB (the figure in
 * docs/benchmarks.md used 300). */
static unsigned BIG = 64u << 20;
/* $KVT_G4_BEFORE=1: for the "before" figure with a kvcached that has no
 * remote_key_file (KVCACHED_BIN=...): no key, only the oversize part, and
 * no check of what it does, only the peak RSS printed. */
static int before;
/* Whether "other" opts out (remote_auth = off) in write_conf()'s file. */
static int other_optout = 1;

static struct kvt_rc rc;
static char tmp[64], conf_arg[200];
static int ndaemons;

static void node_start(struct kvt_daemon *d)
{
	char disk[160];

	snprintf(disk, sizeof(disk), "%s/g3-%d", tmp, ndaemons++);
	kvt_start(d, conf_arg, "--pool-size", "4MiB", "--segment-size", "1MiB", "--page-size",
		  "64KiB", "--host-tier-size", "2MiB", "--disk-path", disk, "--disk-size", "8MiB",
		  NULL);
	setenv("KVCACHED_SOCKET", d->sock, 1);
}

/* Seals the chain of ns (block i: seed base + i), demotes and writes it
 * back so that it goes to G4; waits for the N writes. */
static void seal_chain(const char *ns, uint64_t base)
{
	kvc_conn *c = kvt_connect(ns);
	int pool = kvt_pool(c, "p", BB);
	uint64_t want;
	Kvcached__Response *rs;

	kvt_seal_chain(c, pool, BB, N, base);
	rs = kvt_g4_stats(ns);
	want = rs->stats->remote->writes + N;
	kvcached__response__free_unpacked(rs, NULL);
	kvt_evict(c, KVCACHED__TIER__TIER_G1);
	kvt_flush(c);
	for (int tries = 0;; tries++) {
		uint64_t w, in;

		rs = kvt_g4_stats(ns);
		w = rs->stats->remote->writes;
		in = rs->stats->remote->inflight_bytes;
		CHECK_EQ(rs->stats->remote->write_errors, 0);
		kvcached__response__free_unpacked(rs, NULL);
		if (w >= want && !in)
			break;
		CHECK(tries < 60000);
		usleep(1000);
	}
	kvc_close(c);
}

/* The cluster key of ns's block (seed) and a connection to its master. */
static redisContext *find_key(const char *ns, uint64_t seed, char *key, size_t len)
{
	kvc_hash h = kvt_hash(seed);
	char hex[2 * sizeof(h.b) + 1], pat[256];
	redisContext *x;

	for (size_t j = 0; j < sizeof(h.b); j++)
		snprintf(hex + 2 * j, 3, "%02x", h.b[j]);
	snprintf(pat, sizeof(pat), "kvc:%s:*%s", ns, hex);
	if (!(x = kvt_rc_find_key(&rc, pat, key, len))) {
		fprintf(stderr, "no key for %s block %llu\n", ns, (unsigned long long)seed);
		exit(1);
	}
	return x;
}

/* What a party that can write the key but has no secret can do: change the
 * payload, recompute its CRC32C and the header's, keep the length. */
static void forge(const char *ns, uint64_t seed)
{
	char key[256];
	redisContext *x = find_key(ns, seed, key, sizeof(key));
	redisReply *r = redisCommand(x, "GET %s", key), *s;
	uint8_t *v;
	uint32_t crc, zero = 0;

	CHECK(r && r->type == REDIS_REPLY_STRING && r->len == HDR + BB + TAG);
	v = malloc(r->len);
	memcpy(v, r->str, r->len);
	v[HDR + 200] ^= 0x5a;
	crc = kv_crc32c(0, v + HDR, BB);
	memcpy(v + 72, &crc, 4);        /* payload_crc */
	memcpy(v + 12, &zero, 4);       /* hdr_crc = 0, then the header's CRC */
	crc = kv_crc32c(0, v, HDR);
	memcpy(v + 12, &crc, 4);
	s = redisCommand(x, "SET %s %b", key, v, r->len);
	CHECK(s && s->type == REDIS_REPLY_STATUS);
	freeReplyObject(s);
	freeReplyObject(r);
	free(v);
	redisFree(x);
}

/* A BIG value under the key of ns's block (seed): made by the server
 * (SETRANGE pads with zeros), nothing that large crosses the test. */
static void plant_big(const char *ns, uint64_t seed)
{
	char key[256];
	redisContext *x = find_key(ns, seed, key, sizeof(key));
	redisReply *r = redisCommand(x, "SETRANGE %s %u x", key, BIG - 1);

	CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == BIG);
	freeReplyObject(r);
	redisFree(x);
}

/* VmHWM of pid in KiB: the peak resident set. */
static long peak_kib(pid_t pid)
{
	char path[64], line[256];
	long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	CHECK((f = fopen(path, "r")) != NULL);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmHWM: %ld kB", &v) == 1)
			break;
	fclose(f);
	return v;
}

static void write_conf(void)
{
	char path[160], keyf[160];
	FILE *f;
	unsigned uid = (unsigned)getuid();

	snprintf(keyf, sizeof(keyf), "%s/keyed.g4key", tmp);
	CHECK((f = fopen(keyf, "w")) != NULL);
	fprintf(f, "%s\n", "3f1c0b9e5a7d2468ace0f1e2d3c4b5a6978877665544332211ffeeddccbbaa99");
	fclose(f);
	CHECK(chmod(keyf, 0600) == 0);
	snprintf(path, sizeof(path), "%s/kvcached.conf", tmp);
	CHECK((f = fopen(path, "w")) != NULL);
	fprintf(f, "remote_seeds = %s\nremote_timeout = 2s\n%s\n", kvt_rc_seeds(&rc),
		before ? "" : "remote_fetch_timeout = 30s\n");
	fprintf(f, "[namespace keyed]\nusers = %u\nremote = yes\n%s%s\n\n", uid,
		before ? "" : "remote_key_file = ", before ? "" : keyf);
	/* The operator's opt-out (issue 36): before it, the default. */
	fprintf(f, "[namespace other]\nusers = %u\nremote = yes\n%s", uid,
		before || !other_optout ? "" : "remote_auth = off\n");
	fclose(f);
	snprintf(conf_arg, sizeof(conf_arg), "--config=%s", path);
}

/* What a party that can write ns's keys but has no secret can do to all of
 * them: blocks 0-2 get the payload of ons's blocks obase + i (another
 * tenant's KV moved under ns's keys), the others their own payload with a
 * byte changed; headers (ns's own) and CRC32C recomputed, a tag kept as it
 * was (the forger cannot make one). GETRANGE, so that a value planted
 * larger gives its first bytes. */
static void forge_all(const char *ns, uint64_t base, const char *ons, uint64_t obase)
{
	for (int i = 0; i < N; i++) {
		char key[256], okey[256];
		redisContext *x = find_key(ns, base + (uint64_t)i, key, sizeof(key)), *y;
		redisReply *r = redisCommand(x, "GETRANGE %s 0 %u", key, HDR + BB + TAG - 1), *o, *s;
		uint8_t *v;
		uint32_t crc, zero = 0;

		CHECK(r && r->type == REDIS_REPLY_STRING && r->len >= HDR + BB);
		v = malloc(r->len);
		CHECK(v != NULL);
		memcpy(v, r->str, r->len);
		if (i < 3) {
			y = find_key(ons, obase + (uint64_t)i, okey, sizeof(okey));
			o = redisCommand(y, "GETRANGE %s %u %u", okey, HDR, HDR + BB - 1);
			CHECK(o && o->type == REDIS_REPLY_STRING && o->len == BB);
			memcpy(v + HDR, o->str, BB);
			freeReplyObject(o);
			redisFree(y);
		} else {
			v[HDR + 300 + i] ^= 0xa5;
		}
		crc = kv_crc32c(0, v + HDR, BB);
		memcpy(v + 72, &crc, 4);        /* payload_crc */
		memcpy(v + 12, &zero, 4);       /* hdr_crc = 0, then the header's CRC */
		crc = kv_crc32c(0, v, HDR);
		memcpy(v + 12, &crc, 4);
		s = redisCommand(x, "SET %s %b", key, v, r->len);
		CHECK(s && s->type == REDIS_REPLY_STATUS);
		freeReplyObject(s);
		freeReplyObject(r);
		free(v);
		redisFree(x);
	}
}

/* ns's blocks base + i looked up one at a time (each a chain of one, so
 * that a refused block hides none after it): how many were served in
 * *served, and of them how many hold bytes that are not the block's (a
 * forgery served) as the return. */
static int forged_served(const char *ns, uint64_t base, int *served)
{
	kvc_conn *c = kvt_connect(ns);
	int pool = kvt_pool(c, "p", BB), bad = 0;

	*served = 0;
	for (int i = 0; i < N; i++) {
		kvc_hash h = kvt_hash(base + (uint64_t)i);
		kvc_block b;
		int k = kvc_lookup(c, pool, &h, 1, &b);

		CHECK(k >= 0);
		if (k == 1) {
			(*served)++;
			bad += !kvt_mem_verify(c, kvc_block_ptr(c, b), BB, base + (uint64_t)i);
			CHECK_EQ(kvc_release(c, &b, 1), 0);
		}
	}
	kvc_close(c);
	return bad;
}

/* The daemon with conf (a path): its exit status (it must exit within a
 * minute: a start it refuses) and what it logged, into out. */
static int run_refused(const char *conf, char *out, size_t len)
{
	char arg[200], logp[160], sock[160];
	pid_t pid;
	FILE *f;
	size_t n;
	int st;

	snprintf(arg, sizeof(arg), "--config=%s", conf);
	snprintf(logp, sizeof(logp), "%s/refused.log", tmp);
	snprintf(sock, sizeof(sock), "%s/refused.sock", tmp);
	CHECK((pid = fork()) >= 0);
	if (pid == 0) {
		int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0600);

		if (fd < 0 || dup2(fd, 2) < 0)
			_exit(127);
		execl(getenv("KVCACHED_BIN"), "kvcached", arg, "--socket", sock, "--host-tier-size",
		      "2MiB", (char *)NULL);
		_exit(127);
	}
	for (int i = 0;; i++) {
		pid_t r = waitpid(pid, &st, WNOHANG);

		CHECK(r >= 0);
		if (r == pid)
			break;
		if (i > 60000) {
			kill(pid, SIGKILL);
			fprintf(stderr, "the daemon started with %s (it should refuse)\n", conf);
			exit(1);
		}
		usleep(1000);
	}
	CHECK((f = fopen(logp, "r")) != NULL);
	n = fread(out, 1, len - 1, f);
	out[n] = 0;
	fclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* node_start() with the daemon's stderr in tmp/name instead. */
static void node_start_logged(struct kvt_daemon *d, const char *name)
{
	char logp[160];
	int fd, saved = dup(2);

	snprintf(logp, sizeof(logp), "%s/%s", tmp, name);
	CHECK(saved >= 0 && (fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0600)) >= 0);
	CHECK(dup2(fd, 2) == 2);
	close(fd);
	node_start(d);
	CHECK(dup2(saved, 2) == 2);
	close(saved);
}

/* Whether the log tmp/name has a WARNING of unauthenticated reads that
 * names namespace ns. */
static int warned_about(const char *name, const char *ns)
{
	char path[160], line[4096], a[80], b[80];
	int hit = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", tmp, name);
	snprintf(a, sizeof(a), " %s ", ns);
	snprintf(b, sizeof(b), " %s,", ns);
	CHECK((f = fopen(path, "r")) != NULL);
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "warning") && strstr(line, "WITHOUT authentication") &&
		    (strstr(line, a) || strstr(line, b)))
			hit = 1;
	fclose(f);
	return hit;
}

/* Issue 36: no G4 value is taken on trust by default. */
static void test_default(void)
{
	struct kvt_daemon n1, n2;
	char conf[160], out[8192];
	int served, bad;
	FILE *f;

	if (!before) {
		/* The default configuration, a namespace without a key: refused. */
		snprintf(conf, sizeof(conf), "%s/default.conf", tmp);
		CHECK((f = fopen(conf, "w")) != NULL);
		fprintf(f, "remote_seeds = %s\n\n[namespace nokey]\nusers = %u\nremote = yes\n",
			kvt_rc_seeds(&rc), (unsigned)getuid());
		fclose(f);
		CHECK(run_refused(conf, out, sizeof(out)) != 0);
		fprintf(stderr, "default: a namespace without a key stops the start: %s", out);
		CHECK(strstr(out, "[namespace nokey]") && strstr(out, "remote_key_file") &&
		      strstr(out, "remote_auth = off"));
	}
	/* Every value of keyed forged (three are other's blocks): none served. */
	if (!before) {
		forge_all("keyed", 1000, "other", 3000);
		node_start_logged(&n1, "n1.log");
		bad = forged_served("keyed", 1000, &served);
		fprintf(stderr, "default: keyed (remote_key_file): %d of %d forged values served\n",
			served, N);
		CHECK_EQ(served, 0);
		CHECK_EQ(bad, 0);
		CHECK_EQ(kvt_metric("kvcached_g4_auth_failures_total"), N);
		CHECK(warned_about("n1.log", "other") && !warned_about("n1.log", "keyed"));
		kvt_stop(&n1);
	}
	/* The opt-out serves what anyone who can write the keys puts there. */
	forge_all("other", 3000, "keyed", 1003);
	node_start(&n2);
	bad = forged_served("other", 3000, &served);
	fprintf(stderr, "%s: other (%s): %d of %d forged values served\n",
		before ? "before" : "opted out", before ? "no key: the default" : "remote_auth = off",
		bad, N);
	CHECK_EQ(bad, N);
	if (!before) {
		/* A reload that would leave "other" reading without a key and
		 * without the opt-out is refused; the running configuration stays. */
		other_optout = 0;
		write_conf();
		CHECK(kill(n2.pid, SIGHUP) == 0);
		for (int tries = 0; kvt_metric("kvcached_reload_failures_total") < 1; tries++) {
			CHECK(tries < 60000);
			usleep(1000);
		}
		fprintf(stderr, "default: a reload that drops other's opt-out is refused\n");
		other_optout = 1;
		write_conf();
	}
	kvt_stop(&n2);
}

int main(void)
{
	struct kvt_daemon a, b, b2, b3;
	Kvcached__Response *rs;
	long base_kib, peak;
	int k;

	if (getenv("KVT_G4_BIG_MIB"))
		BIG = (unsigned)atoi(getenv("KVT_G4_BIG_MIB")) << 20;
	before = getenv("KVT_G4_BEFORE") && atoi(getenv("KVT_G4_BEFORE"));
	snprintf(tmp, sizeof(tmp), "/tmp/kvt-g4h.XXXXXX");
	CHECK(mkdtemp(tmp) != NULL);
	kvt_rc_start(&rc, 3, 0, NULL);
	write_conf();
	node_start(&a);
	seal_chain("keyed", 1000);
	seal_chain("other", 3000);

	/* keyed: B reads every tagged value */
	node_start(&b);
	k = kvt_lookup_chain("keyed", "p", BB, N, 1000);
	fprintf(stderr, "keyed: node B found %d of %d\n", k, N);
	CHECK_EQ(k, N);
	rs = kvt_g4_stats("keyed");
	CHECK_EQ(rs->stats->remote->hits, N);
	kvcached__response__free_unpacked(rs, NULL);

	if (before) {
		plant_big("keyed", 1002);
		node_start(&b3);
		base_kib = peak_kib(b3.pid);
		k = kvt_lookup_chain("keyed", "p", BB, N, 1000);
		peak = peak_kib(b3.pid);
		fprintf(stderr, "before: found %d; peak RSS %ld KiB before the lookup, %ld after "
			"(the value is %u KiB)\n", k, base_kib, peak, BIG >> 10);
		kvt_stop(&b3);
		test_default();
		return 0;
	}
	/* forged: block 4 with a valid header and CRC32C but no valid tag */
	forge("keyed", 1004);
	node_start(&b2);
	k = kvt_lookup_chain("keyed", "p", BB, N, 1000);
	fprintf(stderr, "forged: node B2 found %d (the chain up to the forged block)\n", k);
	CHECK_EQ(k, 4);
	CHECK_EQ(kvt_metric("kvcached_g4_auth_failures_total"), 1);
	CHECK_EQ(kvt_metric("kvcached_g4_checksum_failures_total"), 0);
	kvt_stop(&b2);

	/* oversize: block 2 of "keyed" becomes 64 MiB; a fresh node B3 */
	plant_big("keyed", 1002);
	node_start(&b3);
	base_kib = peak_kib(b3.pid);
	k = kvt_lookup_chain("keyed", "p", BB, N, 1000);
	fprintf(stderr, "oversize: node B3 found %d\n", k);
	CHECK_EQ(k, 2);
	/* The other tenant, on the same node and cluster, is served whole. */
	CHECK_EQ(kvt_lookup_chain("other", "p", BB, N, 3000), N);
	peak = peak_kib(b3.pid);
	fprintf(stderr, "oversize: node B3 peak RSS %ld KiB before the lookups, %ld after "
		"(the value is %u KiB)\n", base_kib, peak, BIG >> 10);
	CHECK(peak - base_kib < (long)(BIG >> 10) / 4);
	CHECK_EQ(kvt_metric("kvcached_g4_oversize_total"), 1);
	CHECK_EQ(kvt_metric("kvcached_g4_auth_failures_total"), 0);
	kvt_stop(&b3);

	/* The forged value counted on the node that met it. */
	node_start(&b2);
	CHECK_EQ(kvt_lookup_chain("keyed", "p", BB, N, 1000), 2);   /* block 2 is the big one now */
	CHECK_EQ(kvt_metric("kvcached_g4_oversize_total"), 1);
	CHECK_EQ(kvt_check(), 0);
	kvt_stop(&b2);
	test_default();
	kvt_stop(&b);
	kvt_stop(&a);
	kvt_rc_stop(&rc);
	fprintf(stderr, "ok\n");
	return 0;
}
#endif
