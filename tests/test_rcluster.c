/* The G4 tier's Redis Cluster client (rcluster/rcluster.c) against a real
 * cluster on loopback (rcluster_harness.h): 3 masters with a replica each,
 * then 3 masters with AUTH.
 *
 *   slots       CRC16 and hash tags: known answers, and 2000 binary keys
 *               against the server's CLUSTER KEYSLOT
 *   data        1000 binary keys (NULs in them), values of 4..64 KiB over
 *               every master, every byte checked; misses, DEL, EX, empty
 *   moved       a slot moved by hand under the client: MOVED followed
 *   ask         a slot half migrated: ASK followed, the map left alone
 *   timeout     a master stopped (SIGSTOP): its keys are errors after the
 *               timeout, the others are answered
 *   faults      injected resets and refusals: errors, backoff, recovery
 *   failover    kill -9 of a master: errors or right bytes, never a miss or
 *               wrong bytes; hits again once its replica has taken over
 *   down        every node dead: quick errors
 *   auth        right password (and ACL user) works, wrong ones fail with
 *               the server's words
 *
 * Timings are printed, and bounded only loosely (a batch < 10 s): the
 * machine may be slow, the sanitizers on. Exit 77 without hiredis at build
 * time or without redis-server/redis-cli. Over 800 lines: every case runs
 * against the one cluster started here, and splitting them would start it
 * once per file. */
#include "kvconfig.h"

#include "check.h"

#if !KV_HAVE_HIREDIS
int main(void)
{
	SKIP("built without hiredis: no G4 client");
}
#else

#include "rcluster.h"
#include "rcluster_harness.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <time.h>

/* The timeout of the client that expects answers: far above what a busy
 * machine makes a node take, so that only test_timeout (a client of its
 * own) sees one. */
#define SLOW_OK_MS 10000
/* test_timeout's: the node it stops must not be stopped for long. */
#define TIMEOUT_MS 1000

#define NKEYS 1000
#define MIN_VAL 4096
#define MAX_VAL 65536

static struct kv_rc_key keys[NKEYS];
static unsigned char keybuf[NKEYS][48];
static struct kv_rc_val vals[NKEYS];
static struct kv_rc_val out[NKEYS];
static int status[NKEYS];
static int owner[KV_RC_SLOTS];

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double since_ms(uint64_t t0)
{
	return (double)(now_ns() - t0) / 1e6;
}

/* The interval of a polling loop (gets until a condition holds): keeps the
 * test from taking the CPU the servers need. */
static void poll_pause(void)
{
	struct timespec ts = { 0, 5 * 1000000L };

	nanosleep(&ts, NULL);
}

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

/* Key i: its index in the first 4 bytes (so NULs in most keys), then
 * pseudo-random bytes; 12..40 bytes. base sets keys apart (absent ones). */
static void make_key(unsigned i, uint32_t base, unsigned char *buf, size_t *len)
{
	uint32_t v = base + i;
	size_t j;

	*len = 12 + mix(v) % 29;
	memcpy(buf, &v, 4);
	for (j = 4; j < *len; j++)
		buf[j] = (unsigned char)(mix(v * 131 + j) >> 24);
	buf[5] = 0;
}

static void fill(void *p, size_t n, uint64_t seed)
{
	unsigned char *b = p;
	uint64_t x = mix(seed) | 1;
	size_t j;

	for (j = 0; j < n; j++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		b[j] = (unsigned char)x;
	}
}

static size_t val_len(unsigned i)
{
	return MIN_VAL + mix(i + 77) % (MAX_VAL - MIN_VAL + 1);
}

/* Whether out[k] is key i's value. */
static int val_ok(const struct kv_rc_val *v, unsigned i)
{
	return v->len == vals[i].len && v->data && !memcmp(v->data, vals[i].data, v->len) &&
	       ((char *)v->data)[v->len] == 0;
}

static void setup_data(void)
{
	unsigned i;

	for (i = 0; i < NKEYS; i++) {
		make_key(i, 0, keybuf[i], &keys[i].len);
		keys[i].data = keybuf[i];
		vals[i].len = val_len(i);
		vals[i].data = malloc(vals[i].len);
		CHECK(vals[i].data != NULL);
		fill(vals[i].data, vals[i].len, i);
	}
}

struct tally {
	unsigned hits, misses, errors, wrong;
};

/* Gets keys[0..n), checks every hit's bytes, frees the values. */
static struct tally get_check(struct kv_rc *rc, size_t n)
{
	struct tally t = { 0 };
	size_t i;
	int rv = kv_rc_get(rc, n, keys, out);

	CHECK(rv >= 0);
	for (i = 0; i < n; i++) {
		if (out[i].status == KV_RC_HIT) {
			t.hits++;
			if (!val_ok(&out[i], (unsigned)i)) {
				fprintf(stderr, "key %zu: wrong bytes (%zu, want %zu)\n", i, out[i].len,
					vals[i].len);
				t.wrong++;
			}
		} else if (out[i].status == KV_RC_MISS) {
			t.misses++;
			CHECK(out[i].data == NULL && out[i].len == 0);
		} else {
			CHECK_EQ(out[i].status, KV_RC_ERROR);
			CHECK(out[i].data == NULL && out[i].len == 0);
			t.errors++;
		}
	}
	CHECK_EQ(rv, t.hits);
	kv_rc_vals_free(n, out);
	return t;
}

/* Gets until every key hits (a condition wait: the client comes back from
 * backoff and refreshes its map on its own). */
static void wait_all_hit(struct kv_rc *rc, size_t n, const char *what)
{
	uint64_t t0 = now_ns();
	unsigned rounds = 0;

	for (;;) {
		struct tally t = get_check(rc, n);

		CHECK_EQ(t.wrong, 0);
		CHECK_EQ(t.misses, 0);
		rounds++;
		if (t.hits == n)
			break;
		if (since_ms(t0) > KVT_RC_WAIT_MS) {
			fprintf(stderr, "%s: still %u errors after %u rounds: %s\n", what, t.errors,
				rounds, kv_rc_last_error(rc));
			exit(1);
		}
		poll_pause();
	}
	printf("%s: all %zu hit after %u round(s), %.1f ms\n", what, n, rounds, since_ms(t0));
}

static void test_slots(void)
{
	static const char k9[] = "123456789";

	CHECK_EQ(kv_rc_crc16(k9, 9), 0x31c3);
	CHECK_EQ(kv_rc_keyslot(k9, 9), 12739);
	CHECK_EQ(kv_rc_crc16("", 0), 0);
	CHECK_EQ(kv_rc_keyslot("foo", 3), 12182);
	CHECK_EQ(kv_rc_keyslot("bar", 3), 5061);
	CHECK_EQ(kv_rc_keyslot("hello", 5), 866);
	/* Hash tags (the Redis Cluster specification's examples). */
	CHECK_EQ(kv_rc_keyslot("{user1000}.following", 20), kv_rc_keyslot("user1000", 8));
	CHECK_EQ(kv_rc_keyslot("{user1000}.followers", 20), kv_rc_keyslot("user1000", 8));
	CHECK_EQ(kv_rc_keyslot("foo{}{bar}", 10), kv_rc_crc16("foo{}{bar}", 10) & 16383);
	CHECK_EQ(kv_rc_keyslot("foo{{bar}}zap", 13), kv_rc_keyslot("{bar", 4));
	CHECK_EQ(kv_rc_keyslot("foo{bar}{zap}", 13), kv_rc_keyslot("bar", 3));
	CHECK_EQ(kv_rc_keyslot("{", 1), kv_rc_crc16("{", 1) & 16383);
	CHECK_EQ(kv_rc_keyslot("}{", 2), kv_rc_crc16("}{", 2) & 16383);
	CHECK_EQ(kv_rc_keyslot("a{\0b}c", 6), kv_rc_keyslot("\0b", 2));
}

static void test_new_args(void)
{
	static const char *bad[] = { "", " , ", "host", "host:", ":6379", "h:0", "h:65536",
				     "h:12a", "h:123456", "a:1,b", "[::1]", NULL };
	struct kv_rc *rc = NULL;
	char err[128];
	int i;

	for (i = 0; bad[i]; i++) {
		err[0] = 0;
		CHECK_EQ(kv_rc_new(bad[i], NULL, NULL, 0, &rc, err, sizeof(err)), -EINVAL);
		CHECK(rc == NULL && err[0]);
	}
	CHECK_EQ(kv_rc_new("127.0.0.1:1", NULL, NULL, 600001, &rc, err, sizeof(err)), -EINVAL);
	CHECK_EQ(kv_rc_new("a:1, b:2 ,[::1]:7000", "u", "p", 50, &rc, err, sizeof(err)), 0);
	{
		struct kv_rc_limits l;

		kv_rc_get_limits(rc, &l);
		CHECK_EQ(l.timeout_ms, 50);
		CHECK_EQ(l.backoff_min_ms, 100);
		CHECK_EQ(l.backoff_max_ms, 5000);
		l.max_nodes = 2;  /* fewer than the seeds known */
		CHECK_EQ(kv_rc_set_limits(rc, &l), -EINVAL);
		l.max_nodes = 1024;
		l.backoff_max_ms = 10;
		CHECK_EQ(kv_rc_set_limits(rc, &l), -EINVAL);
	}
	CHECK_EQ(kv_rc_get(rc, 1, NULL, out), -EINVAL);
	CHECK_EQ(kv_rc_get(rc, 0, keys, out), 0);
	kv_rc_free(rc);
	kv_rc_free(NULL);
	kv_rc_val_free(NULL);
}

/* Nothing listening: errors at once, then the backoff. */
static void test_nothing_there(void)
{
	struct kv_rc *rc;
	struct kv_rc_stats st;
	struct tally t;
	uint64_t t0;
	char err[128];

	/* Port 1 on loopback: refused (nothing runs as tcpmux). */
	CHECK_EQ(kv_rc_new("127.0.0.1:1", NULL, NULL, 0, &rc, err, sizeof(err)), 0);
	t0 = now_ns();
	t = get_check(rc, 20);
	CHECK_EQ(t.errors, 20);
	printf("nothing there: 20 gets, all errors in %.2f ms (%s)\n", since_ms(t0),
	       kv_rc_last_error(rc));
	CHECK(strstr(kv_rc_last_error(rc), "127.0.0.1:1: ") == kv_rc_last_error(rc));
	t = get_check(rc, 20);
	CHECK_EQ(t.errors, 20);
	kv_rc_stats(rc, &st);
	CHECK(st.connect_failures >= 1);
	CHECK_EQ(st.errors, 40);
	CHECK_EQ(st.hits + st.misses, 0);
	kv_rc_free(rc);
}

/* 2000 binary keys: our slot against the server's. */
static void test_slots_server(struct kvt_rc *c)
{
	redisContext *r = kvt_rc_connect(c, 0);
	unsigned i;

	CHECK(r != NULL);
	for (i = 0; i < 2000; i++) {
		unsigned char k[48];
		const char *argv[3] = { "CLUSTER", "KEYSLOT", (const char *)k };
		size_t lens[3] = { 7, 7, 0 };
		redisReply *rep;
		size_t j;

		lens[2] = i % 47;
		for (j = 0; j < lens[2]; j++)
			k[j] = (unsigned char)(mix(i * 64 + j) >> 40);
		if (i % 5 == 0 && lens[2] > 6) {  /* hash tags, some empty */
			k[1] = '{';
			k[1 + i % 4] = '}';
		}
		rep = redisCommandArgv(r, 3, argv, lens);
		CHECK(rep && rep->type == REDIS_REPLY_INTEGER);
		CHECK_EQ(kv_rc_keyslot(k, lens[2]), rep->integer);
		freeReplyObject(rep);
	}
	redisFree(r);
}

static void test_data(struct kvt_rc *c, struct kv_rc *rc)
{
	static unsigned char absent_buf[200][48];
	struct kv_rc_key absent[200], one;
	struct kv_rc_val v, empty = { .data = NULL, .len = 0 };
	struct kv_rc_stats st;
	unsigned per[KVT_RC_MAX] = { 0 }, i;
	uint64_t t0;
	int rv;

	t0 = now_ns();
	rv = kv_rc_set(rc, NKEYS, keys, vals, 0, status);
	printf("set: %d keys, %.1f ms\n", rv, since_ms(t0));
	if (rv != NKEYS)
		fprintf(stderr, "set: %s\n", kv_rc_last_error(rc));
	CHECK_EQ(rv, NKEYS);
	for (i = 0; i < NKEYS; i++)
		CHECK_EQ(status[i], KV_RC_OK);
	t0 = now_ns();
	{
		struct tally t = get_check(rc, NKEYS);

		printf("get: %u hits, %.1f ms\n", t.hits, since_ms(t0));
		CHECK_EQ(t.hits, NKEYS);
		CHECK_EQ(t.wrong, 0);
	}
	/* Spread over every master. */
	CHECK_EQ(kvt_rc_slot_map(c, owner), 0);
	for (i = 0; i < NKEYS; i++) {
		int o = owner[kv_rc_keyslot(keys[i].data, keys[i].len)];

		CHECK(o >= 0 && o < c->n);
		per[o]++;
	}
	for (i = 0; i < (unsigned)c->n; i++)
		if (kvt_rc_is_master(c, (int)i))
			CHECK(per[i] > 100);
	CHECK_EQ(kv_rc_masters(rc), 3);

	/* Misses are misses. */
	for (i = 0; i < 200; i++) {
		make_key(i, 1000000, absent_buf[i], &absent[i].len);
		absent[i].data = absent_buf[i];
	}
	CHECK_EQ(kv_rc_get(rc, 200, absent, out), 0);
	for (i = 0; i < 200; i++)
		CHECK_EQ(out[i].status, KV_RC_MISS);

	/* DEL, then the key is a miss; put it back. */
	CHECK_EQ(kv_rc_del(rc, 10, keys + NKEYS - 10, status), 10);
	CHECK_EQ(kv_rc_del(rc, 10, keys + NKEYS - 10, status), 0);
	for (i = 0; i < 10; i++)
		CHECK_EQ(status[i], KV_RC_MISS);
	CHECK_EQ(kv_rc_get(rc, 10, keys + NKEYS - 10, out), 0);
	CHECK_EQ(kv_rc_set(rc, 10, keys + NKEYS - 10, vals + NKEYS - 10, 0, status), 10);

	/* EX: a TTL is set; an empty value is a hit of 0 bytes. */
	one = absent[0];
	CHECK_EQ(kv_rc_set(rc, 1, &one, &vals[0], 100, status), 1);
	{
		int o = owner[kv_rc_keyslot(one.data, one.len)];
		redisContext *r = kvt_rc_connect(c, o);
		const char *argv[2] = { "TTL", one.data };
		size_t lens[2] = { 3, one.len };
		redisReply *rep;

		CHECK(r != NULL);
		rep = redisCommandArgv(r, 2, argv, lens);
		CHECK(rep && rep->type == REDIS_REPLY_INTEGER && rep->integer > 0 &&
		      rep->integer <= 100);
		freeReplyObject(rep);
		redisFree(r);
	}
	CHECK_EQ(kv_rc_set(rc, 1, &one, &empty, 0, status), 1);
	CHECK_EQ(kv_rc_get(rc, 1, &one, &v), 1);
	CHECK(v.status == KV_RC_HIT && v.len == 0 && v.data != NULL);
	kv_rc_val_free(&v);
	CHECK(v.data == NULL);
	CHECK_EQ(kv_rc_del(rc, 1, &one, status), 1);

	kv_rc_stats(rc, &st);
	printf("stats: rounds %llu, bytes in %llu, out %llu, refreshes %llu\n",
	       (unsigned long long)st.rounds, (unsigned long long)st.bytes_in,
	       (unsigned long long)st.bytes_out, (unsigned long long)st.refreshes);
	CHECK(st.bytes_in > 1000ull * MIN_VAL && st.bytes_out > 1000ull * MIN_VAL);
	CHECK_EQ(st.errors, 0);
	CHECK(st.refreshes >= 1);
}

/* kv_rc_set_parts() (issue 38: the tier sends a value from its G2 slot,
 * header and tag apart): every value sent again in up to 4 parts (a small
 * head, the middle, which from 4 KiB on goes from where it lies, a small
 * tail, an empty part), read back whole and right; 5 parts or a NULL part
 * with a length are refused before anything is sent. */
static void test_parts(struct kv_rc *rc)
{
	static struct kv_rc_dst d[NKEYS];
	unsigned i;

	CHECK_EQ(kv_rc_del(rc, NKEYS, keys, status), NKEYS);
	for (i = 0; i < NKEYS; i++) {
		char *p = vals[i].data;
		size_t len = vals[i].len, a = len < 112 ? len / 2 : 80, b = len < 112 ? 0 : 32;

		d[i] = (struct kv_rc_dst){ .part = { { p, a }, { p + a, len - a - b },
						     { NULL, 0 }, { p + len - b, b } },
					   .nparts = i % 2 ? 4 : 2 };
		if (d[i].nparts == 2)
			d[i].part[1].len = len - a;
	}
	CHECK_EQ(kv_rc_set_parts(rc, NKEYS, keys, d, 0, status), NKEYS);
	{
		struct tally t = get_check(rc, NKEYS);

		printf("set in parts: %u hits, %u wrong\n", t.hits, t.wrong);
		CHECK_EQ(t.hits, NKEYS);
		CHECK_EQ(t.wrong, 0);
	}
	d[0].nparts = KV_RC_DST_PARTS + 1;
	CHECK_EQ(kv_rc_set_parts(rc, 1, keys, d, 0, status), -EINVAL);
	d[0].nparts = 2;
	d[0].part[1].p = NULL;
	CHECK_EQ(kv_rc_set_parts(rc, 1, keys, d, 0, status), -EINVAL);
	CHECK_EQ(kv_rc_set(rc, 1, keys, vals, 0, status), 1);
}

/* The value pool: buffers given back are read into again, the bytes come
 * back right (NUL after them included) whatever buffer they land in, a pool
 * of many sizes (more than its 8 classes) and a small pool_max stay right,
 * and pool_max 0 keeps nothing. */
static void test_pool(struct kvt_rc *c)
{
	struct kv_rc_limits lim;
	struct kv_rc_stats s0, s1;
	struct kv_rc *rc;
	char err[128];
	unsigned i, round;

	CHECK_EQ(kv_rc_new(kvt_rc_seeds(c), NULL, NULL, SLOW_OK_MS, &rc, err, sizeof(err)), 0);
	kv_rc_get_limits(rc, &lim);
	CHECK_EQ(lim.pool_max, 128u << 20);
	/* One size only: the second batch reads into the first's buffers.
	 * Keys 0..63 hold values of many sizes; key 0's value, 64 times. */
	{
		struct kv_rc_key k64[64];

		for (i = 0; i < 64; i++)
			k64[i] = keys[0];
		CHECK_EQ(kv_rc_get(rc, 64, k64, out), 64);
		for (i = 0; i < 64; i++)
			CHECK(val_ok(&out[i], 0));
		kv_rc_vals_release(rc, 64, out);
		for (i = 0; i < 64; i++)
			CHECK(out[i].data == NULL && out[i].len == 0);
		kv_rc_stats(rc, &s0);
		for (i = 0; i < 64; i++)
			memset(&out[i], 0xa5, sizeof(out[i]));
		CHECK_EQ(kv_rc_get(rc, 64, k64, out), 64);
		kv_rc_stats(rc, &s1);
		CHECK_EQ(s1.pool_hits - s0.pool_hits, 64);
		CHECK_EQ(s1.pool_misses, s0.pool_misses);
		for (i = 0; i < 64; i++)
			CHECK(val_ok(&out[i], 0));
		kv_rc_vals_release(rc, 64, out);
	}
	/* Many sizes, several rounds: classes come and go. */
	for (round = 0; round < 3; round++) {
		struct tally t = { 0 };

		CHECK_EQ(kv_rc_get(rc, NKEYS, keys, out), NKEYS);
		for (i = 0; i < NKEYS; i++)
			t.wrong += !val_ok(&out[i], i);
		CHECK_EQ(t.wrong, 0);
		kv_rc_vals_release(rc, NKEYS, out);
	}
	/* A small pool: what does not fit is freed (ASan counts the rest). */
	lim.pool_max = 3 * MAX_VAL;
	CHECK_EQ(kv_rc_set_limits(rc, &lim), 0);
	CHECK_EQ(kv_rc_get(rc, NKEYS, keys, out), NKEYS);
	for (i = 0; i < NKEYS; i++)
		CHECK(val_ok(&out[i], i));
	kv_rc_vals_release(rc, NKEYS, out);
	/* None kept. */
	lim.pool_max = 0;
	CHECK_EQ(kv_rc_set_limits(rc, &lim), 0);
	CHECK_EQ(kv_rc_get(rc, 64, keys, out), 64);
	kv_rc_vals_release(rc, 64, out);
	kv_rc_stats(rc, &s0);
	CHECK_EQ(kv_rc_get(rc, 64, keys, out), 64);
	kv_rc_stats(rc, &s1);
	CHECK_EQ(s1.pool_hits, s0.pool_hits);
	for (i = 0; i < 64; i++)
		CHECK(val_ok(&out[i], i));
	/* Values outlive their client, and kv_rc_val_free() frees them. */
	kv_rc_free(rc);
	kv_rc_vals_free(64, out);
	kv_rc_vals_release(NULL, 0, out);
	printf("pool: %llu values read into kept buffers, %llu into new ones\n",
	       (unsigned long long)s1.pool_hits, (unsigned long long)s1.pool_misses);
}

/* Another master than m. */
static int other_master(struct kvt_rc *c, int m)
{
	int i;

	for (i = 0; i < c->n; i++)
		if (i != m && kvt_rc_is_master(c, i))
			return i;
	CHECK(!"no other master");
	return -1;
}

static void test_moved(struct kvt_rc *c, struct kv_rc *rc)
{
	struct kv_rc_stats a, b;
	unsigned slot = kv_rc_keyslot(keys[0].data, keys[0].len), i, nin = 0;
	int from, to;

	CHECK_EQ(kvt_rc_slot_map(c, owner), 0);
	from = owner[slot];
	to = other_master(c, from);
	kvt_rc_slot_begin(c, slot, from, to);
	kvt_rc_slot_move_keys(c, slot, from, to, 0, NULL, NULL);
	kvt_rc_slot_end(c, slot, from, to);
	/* Every node says so (replicas learn it by gossip), so that a map the
	 * client loads from now on has it: only its old map is stale. */
	CHECK_EQ(kvt_rc_wait_healthy(c, KVT_RC_WAIT_MS), 0);
	for (i = 0; i < NKEYS; i++)
		nin += kv_rc_keyslot(keys[i].data, keys[i].len) == slot;

	kv_rc_stats(rc, &a);
	{
		struct tally t = get_check(rc, NKEYS);

		CHECK_EQ(t.hits, NKEYS);
	}
	kv_rc_stats(rc, &b);
	CHECK(b.redirects_moved >= a.redirects_moved + 1);
	CHECK(b.redirects_moved <= a.redirects_moved + nin);
	CHECK_EQ(b.redirects_ask, a.redirects_ask);
	printf("moved: slot %u (%u key(s)) from node %d to node %d: %llu MOVED followed\n", slot,
	       nin, from, to, (unsigned long long)(b.redirects_moved - a.redirects_moved));
	/* The owner was updated: no redirect the second time. */
	get_check(rc, 1);
	kv_rc_stats(rc, &a);
	CHECK_EQ(a.redirects_moved, b.redirects_moved);
}

static void test_ask(struct kvt_rc *c, struct kv_rc *rc)
{
	char kb[3][32];
	struct kv_rc_key k[3];
	struct kv_rc_val v[3], out3[3];
	struct kv_rc_stats a, b;
	unsigned slot, i;
	int from, to, tag = 0;

	/* Three keys of one slot, not the slot the MOVED test moved. */
	do {
		snprintf(kb[0], sizeof(kb[0]), "{ask%d}", tag++);
		slot = kv_rc_keyslot(kb[0], strlen(kb[0]));
	} while (slot == kv_rc_keyslot(keys[0].data, keys[0].len));
	for (i = 0; i < 3; i++) {
		snprintf(kb[i], sizeof(kb[i]), "{ask%d}%c", tag - 1, 'a' + i);
		k[i].data = kb[i];
		k[i].len = strlen(kb[i]);
		CHECK_EQ(kv_rc_keyslot(k[i].data, k[i].len), slot);
		v[i] = vals[i];
	}
	CHECK_EQ(kv_rc_set(rc, 2, k, v, 0, status), 2);  /* a and b; c stays absent */

	CHECK_EQ(kvt_rc_slot_map(c, owner), 0);
	from = owner[slot];
	to = other_master(c, from);
	kvt_rc_slot_begin(c, slot, from, to);
	{
		const void *mk[1] = { k[0].data };
		size_t ml[1] = { k[0].len };

		kvt_rc_slot_move_keys(c, slot, from, to, 1, mk, ml);
	}

	/* a moved: ASK; b still at the source: no redirect; c absent: ASK,
	 * then nil at the target. */
	kv_rc_stats(rc, &a);
	CHECK_EQ(kv_rc_get(rc, 1, &k[0], out3), 1);
	CHECK(out3[0].len == vals[0].len && !memcmp(out3[0].data, vals[0].data, vals[0].len));
	kv_rc_val_free(&out3[0]);
	kv_rc_stats(rc, &b);
	CHECK_EQ(b.redirects_ask, a.redirects_ask + 1);
	CHECK_EQ(b.redirects_moved, a.redirects_moved);
	CHECK_EQ(kv_rc_get(rc, 1, &k[1], out3), 1);
	kv_rc_val_free(&out3[0]);
	kv_rc_stats(rc, &a);
	CHECK_EQ(a.redirects_ask, b.redirects_ask);
	CHECK_EQ(a.redirects_moved, b.redirects_moved);
	CHECK_EQ(kv_rc_get(rc, 3, k, out3), 2);
	CHECK(out3[0].status == KV_RC_HIT && out3[1].status == KV_RC_HIT &&
	      out3[2].status == KV_RC_MISS);
	for (i = 0; i < 2; i++)
		CHECK(out3[i].len == vals[i].len && !memcmp(out3[i].data, vals[i].data, vals[i].len));
	kv_rc_vals_free(3, out3);
	kv_rc_stats(rc, &b);
	CHECK_EQ(b.redirects_ask, a.redirects_ask + 2);
	CHECK_EQ(b.redirects_moved, a.redirects_moved);
	printf("ask: slot %u half migrated from node %d to node %d: ASK followed, map kept\n",
	       slot, from, to);

	/* Finish the migration: MOVED from then on. */
	kvt_rc_slot_move_keys(c, slot, from, to, 0, NULL, NULL);
	kvt_rc_slot_end(c, slot, from, to);
	CHECK_EQ(kvt_rc_wait_healthy(c, KVT_RC_WAIT_MS), 0);
	CHECK_EQ(kv_rc_get(rc, 2, k, out3), 2);
	kv_rc_vals_free(2, out3);
	kv_rc_stats(rc, &a);
	CHECK(a.redirects_moved >= b.redirects_moved + 1);
	CHECK_EQ(kv_rc_del(rc, 2, k, status), 2);
}

/* A master that accepts connections and answers nothing. */
static void test_timeout(struct kvt_rc *c)
{
	struct kv_rc *rc;
	struct tally t;
	unsigned i, mine = 0;
	uint64_t t0;
	double ms;
	int m;
	char err[128];

	CHECK_EQ(kvt_rc_slot_map(c, owner), 0);
	m = owner[kv_rc_keyslot(keys[0].data, keys[0].len)];
	/* 60 keys: short, so that the node is not stopped for long (the
	 * cluster would fail it over after cluster-node-timeout). */
	for (i = 0; i < 60; i++)
		mine += owner[kv_rc_keyslot(keys[i].data, keys[i].len)] == m;
	CHECK_EQ(kv_rc_new(kvt_rc_seeds(c), NULL, NULL, TIMEOUT_MS, &rc, err, sizeof(err)), 0);
	wait_all_hit(rc, 60, "timeout: a client of its own");  /* connected, map loaded */
	kvt_rc_pause(c, m, 1);
	t0 = now_ns();
	t = get_check(rc, 60);
	ms = since_ms(t0);
	kvt_rc_pause(c, m, 0);
	printf("timeout: a stopped master (%u of 60 keys): errors after %.1f ms (timeout %u ms): "
	       "%s\n", mine, ms, TIMEOUT_MS, kv_rc_last_error(rc));
	CHECK_EQ(t.errors, mine);
	CHECK_EQ(t.hits, 60 - mine);
	CHECK(strstr(kv_rc_last_error(rc), "no reply within"));
	CHECK(ms < 10000);
	wait_all_hit(rc, NKEYS, "timeout: after SIGCONT");
	kv_rc_free(rc);
}

static void test_faults(struct kvt_rc *c, struct kv_rc *rc)
{
	struct kv_rc_stats a, b;
	struct tally t;

	/* A reset on the first send of a kept connection: opened again at
	 * once, nothing lost. */
	kv_rc_stats(rc, &a);
	kv_rc_fault(rc, KV_RC_FAULT_WRITE, 0, 1);
	t = get_check(rc, 30);
	CHECK_EQ(t.hits, 30);
	kv_rc_stats(rc, &b);
	CHECK(b.reconnects >= a.reconnects + 1);

	/* Every read fails: every node errs (after its one retry). */
	kv_rc_fault(rc, KV_RC_FAULT_READ, 0, UINT_MAX);
	t = get_check(rc, 30);
	kv_rc_fault(rc, KV_RC_FAULT_READ, 0, 0);
	CHECK_EQ(t.errors, 30);
	CHECK(strstr(kv_rc_last_error(rc), "fault injected"));
	/* Back from the backoff, the first connect refused. */
	kv_rc_stats(rc, &a);
	kv_rc_fault(rc, KV_RC_FAULT_CONNECT, 0, 1);
	wait_all_hit(rc, NKEYS, "faults: after resets and a refused connect");
	kv_rc_stats(rc, &b);
	CHECK(b.connect_failures >= a.connect_failures + 1);
	CHECK(b.reconnects >= a.reconnects + 3);
	(void)c;
}

static void test_failover(struct kvt_rc *c, struct kv_rc *rc)
{
	unsigned rounds = 0, with_errors = 0, i, mine = 0;
	uint64_t t0;
	double healthy_ms;
	int m;

	CHECK_EQ(kvt_rc_wait_healthy(c, KVT_RC_WAIT_MS), 0);
	CHECK_EQ(kvt_rc_wait_replicated(c, KVT_RC_WAIT_MS), 0);
	CHECK_EQ(kvt_rc_slot_map(c, owner), 0);
	m = owner[kv_rc_keyslot(keys[0].data, keys[0].len)];
	for (i = 0; i < NKEYS; i++)
		mine += owner[kv_rc_keyslot(keys[i].data, keys[i].len)] == m;
	kvt_rc_kill(c, m);
	t0 = now_ns();
	for (;;) {
		struct tally t = get_check(rc, NKEYS);

		rounds++;
		CHECK_EQ(t.wrong, 0);
		CHECK_EQ(t.misses, 0);
		with_errors += t.errors > 0;
		if (kvt_rc_healthy(c))
			break;
		CHECK(since_ms(t0) < KVT_RC_WAIT_MS);
		poll_pause();
	}
	healthy_ms = since_ms(t0);
	printf("failover: master %d (%u keys) killed; replica in charge after %.0f ms; "
	       "%u rounds meanwhile, %u with errors, none wrong\n", m, mine, healthy_ms, rounds,
	       with_errors);
	wait_all_hit(rc, NKEYS, "failover: after the promotion");
	/* The old master comes back as a replica. */
	kvt_rc_restart(c, m);
	CHECK_EQ(kvt_rc_wait_healthy(c, KVT_RC_WAIT_MS), 0);
	CHECK(!kvt_rc_is_master(c, m));
	wait_all_hit(rc, NKEYS, "failover: old master back as a replica");
}

static void test_all_down(struct kvt_rc *c, struct kv_rc *rc)
{
	struct tally t;
	uint64_t t0;
	double ms1, ms2;
	int i;

	for (i = 0; i < c->n; i++)
		if (kvt_rc_running(c, i))
			kvt_rc_kill(c, i);
	t0 = now_ns();
	t = get_check(rc, NKEYS);
	ms1 = since_ms(t0);
	CHECK_EQ(t.errors, NKEYS);
	t0 = now_ns();
	t = get_check(rc, NKEYS);
	ms2 = since_ms(t0);
	CHECK_EQ(t.errors, NKEYS);
	printf("down: every node dead: %d gets all errors in %.2f ms, then %.2f ms (backoff): %s\n",
	       NKEYS, ms1, ms2, kv_rc_last_error(rc));
	CHECK(ms1 < 10000 && ms2 < 10000);
	CHECK(kv_rc_last_error(rc)[0]);
	CHECK_EQ(kv_rc_set(rc, 10, keys, vals, 0, status), 0);
	for (i = 0; i < 10; i++)
		CHECK_EQ(status[i], KV_RC_ERROR);
}

static void test_auth(void)
{
	static const char pass[] = "kvt-g4-secret";
	struct kvt_rc_opts o = { .password = pass, .user = "g4user" };
	struct kvt_rc c;
	struct kv_rc *rc;
	struct kv_rc_stats st;
	struct tally t;
	char err[128];

	kvt_rc_start(&c, 3, 0, &o);
	/* The default user's password. */
	CHECK_EQ(kv_rc_new(kvt_rc_seeds(&c), NULL, pass, SLOW_OK_MS, &rc, err, sizeof(err)), 0);
	CHECK_EQ(kv_rc_set(rc, 50, keys, vals, 0, status), 50);
	t = get_check(rc, 50);
	CHECK_EQ(t.hits, 50);
	kv_rc_free(rc);
	/* The ACL user. */
	CHECK_EQ(kv_rc_new(kvt_rc_seeds(&c), "g4user", pass, SLOW_OK_MS, &rc, err, sizeof(err)), 0);
	t = get_check(rc, 50);
	CHECK_EQ(t.hits, 50);
	kv_rc_free(rc);
	/* Wrong password, wrong user: errors, with the server's words. */
	CHECK_EQ(kv_rc_new(kvt_rc_seeds(&c), NULL, "wrong", SLOW_OK_MS, &rc, err, sizeof(err)), 0);
	t = get_check(rc, 50);
	CHECK_EQ(t.errors, 50);
	printf("auth: wrong password: %s\n", kv_rc_last_error(rc));
	CHECK(strstr(kv_rc_last_error(rc), "AUTH refused: WRONGPASS"));
	kv_rc_stats(rc, &st);
	CHECK(st.connect_failures >= 1);
	kv_rc_free(rc);
	CHECK_EQ(kv_rc_new(kvt_rc_seeds(&c), "nobody", pass, SLOW_OK_MS, &rc, err, sizeof(err)), 0);
	t = get_check(rc, 50);
	CHECK_EQ(t.errors, 50);
	CHECK(strstr(kv_rc_last_error(rc), "AUTH refused: WRONGPASS"));
	kv_rc_free(rc);
	/* No password at all. */
	CHECK_EQ(kv_rc_new(kvt_rc_seeds(&c), NULL, NULL, SLOW_OK_MS, &rc, err, sizeof(err)), 0);
	t = get_check(rc, 50);
	CHECK_EQ(t.errors, 50);
	printf("auth: no password: %s\n", kv_rc_last_error(rc));
	CHECK(strstr(kv_rc_last_error(rc), "NOAUTH"));
	kv_rc_free(rc);
	kvt_rc_stop(&c);
}

int main(void)
{
	/* A node stopped for test_timeout's second must not look failed. */
	struct kvt_rc_opts o = { .node_timeout_ms = 3000 };
	struct kvt_rc c;
	struct kv_rc *rc;
	char err[128];
	unsigned i;

	setvbuf(stdout, NULL, _IOLBF, 0);
	test_slots();
	test_new_args();
	setup_data();
	test_nothing_there();

	kvt_rc_start(&c, 3, 1, &o);
	printf("cluster: 3 masters + 3 replicas at %s\n", kvt_rc_seeds(&c));
	test_slots_server(&c);
	CHECK_EQ(kv_rc_new(kvt_rc_seeds(&c), NULL, NULL, SLOW_OK_MS, &rc, err, sizeof(err)), 0);
	test_data(&c, rc);
	test_parts(rc);
	test_pool(&c);
	test_moved(&c, rc);
	test_ask(&c, rc);
	test_timeout(&c);
	test_faults(&c, rc);
	test_failover(&c, rc);
	test_all_down(&c, rc);
	{
		struct kv_rc_stats st;

		kv_rc_stats(rc, &st);
		printf("stats: rounds %llu gets %llu sets %llu hits %llu misses %llu errors %llu "
		       "moved %llu ask %llu refreshes %llu reconnects %llu connect_failures %llu\n",
		       (unsigned long long)st.rounds, (unsigned long long)st.keys_get,
		       (unsigned long long)st.keys_set, (unsigned long long)st.hits,
		       (unsigned long long)st.misses, (unsigned long long)st.errors,
		       (unsigned long long)st.redirects_moved, (unsigned long long)st.redirects_ask,
		       (unsigned long long)st.refreshes, (unsigned long long)st.reconnects,
		       (unsigned long long)st.connect_failures);
	}
	kv_rc_free(rc);
	kvt_rc_stop(&c);

	test_auth();
	for (i = 0; i < NKEYS; i++)
		free(vals[i].data);
	return 0;
}
#endif
