/* The prefix index: insert, find, remove across table growth. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "index.h"

#define N 50000
#define MANY 1000

static struct kv_index_entry e[N];
static uint8_t hs[MANY * KV_HASH_BYTES];
static uint64_t keys[MANY];
static struct kv_index_entry *found[MANY];

/* kv_index_find_many() answers as kv_index_find() does, hash by hash, for
 * batches of every length around its prefetch distance, with hits, misses
 * (a removed entry, another pool's hash) and repeats mixed. */
static void check_many(struct kv_index *ix, uint32_t pool)
{
	for (uint32_t n = 0; n <= MANY; n = n < 20 ? n + 1 : n * 3 + 1) {
		if (n > MANY)
			n = MANY;
		for (uint32_t i = 0; i < n; i++) {
			uint32_t j = (i * 7919u + n) % N;

			memcpy(hs + (size_t)i * KV_HASH_BYTES, i % 5 == 4 ? e[j / 2].hash : e[j].hash,
			       KV_HASH_BYTES);
		}
		kv_index_find_many(ix, pool, hs, n, keys, found);
		for (uint32_t i = 0; i < n; i++) {
			CHECK(found[i] == kv_index_find(ix, pool, hs + (size_t)i * KV_HASH_BYTES));
			CHECK_EQ(keys[i], kv_index_key(ix, pool, hs + (size_t)i * KV_HASH_BYTES));
		}
		if (n == MANY)
			break;
	}
}

static void key(struct kv_index_entry *x, uint32_t i)
{
	memset(x->hash, 0, sizeof(x->hash));
	memcpy(x->hash, &i, sizeof(i));
	x->hash[31] = (uint8_t)(i * 7);
	x->pool = i % 3;
}

/* Past 2 MiB of buckets (262,144 of them) the table is a mapping of its own
 * in huge pages (index.c): growth into it and across it, finds and removals
 * there, and the fini that unmaps it. */
static void test_big(void)
{
	enum { BIG = 600000 };
	struct kv_index_entry *x = calloc(BIG, sizeof(*x));
	struct kv_index ix;
	uint32_t i;

	CHECK(x != NULL);
	CHECK(kv_index_init(&ix, 7) == 0);
	for (i = 0; i < BIG; i++) {
		key(&x[i], i + N);
		kv_index_insert(&ix, &x[i]);
	}
	CHECK(ix.nslots >= 1u << 20 && ix.count == BIG);
	for (i = 0; i < BIG; i++)
		CHECK(kv_index_find(&ix, x[i].pool, x[i].hash) == &x[i]);
	for (i = 0; i < BIG; i += 3)
		kv_index_remove(&ix, &x[i]);
	CHECK(kv_index_check(&ix, NULL, 0) == 0);
	for (i = 0; i < BIG; i++)
		CHECK((kv_index_find(&ix, x[i].pool, x[i].hash) == &x[i]) == (i % 3 != 0));
	kv_index_fini(&ix);
	free(x);
}

/* One long cluster of the open-addressed table (index.h): 300 keys whose
 * home is one of the last 8 of 1,024 slots or the first 8, so that the
 * cluster wraps past the table's end and its distances pass the 255 a slot
 * can say (the rest read from the entry's key); then removals in a scrambled
 * order, the table's invariants (kv_index_check()) and every find after
 * each: a backward shift that stops early, moves an entry before its home
 * or loses the saturated distance leaves an entry a probe cannot reach. */
static void test_cluster(void)
{
	enum { K = 300, SLOTS = 1024 };
	static struct kv_index_entry c[K];
	struct kv_index ix;
	uint32_t i, n = 0, seen_far = 0, next;
	uint8_t h[KV_HASH_BYTES];
	char what[160];

	CHECK(kv_index_init(&ix, 99) == 0);
	CHECK_EQ(ix.nslots, SLOTS);
	for (i = 0; n < K; i++) {
		uint64_t home;

		key(&c[n], i);
		c[n].pool = 0;
		home = kv_index_key(&ix, 0, c[n].hash) & (SLOTS - 1);
		if (home >= SLOTS - 8 || home < 8)
			kv_index_insert(&ix, &c[n++]);
	}
	next = i;   /* past every key inserted */
	CHECK_EQ(ix.nslots, SLOTS);  /* no growth: one table all along */
	CHECK(kv_index_check(&ix, what, sizeof(what)) == 0);
	for (i = 0; i < SLOTS; i++)
		seen_far += ix.slots[i] && (ix.slots[i] >> 48 & 255) == 255;
	CHECK(seen_far > 0);
	/* A hash with a home in the cluster that is not there: a miss. */
	for (i = next;; i++) {
		struct kv_index_entry x;

		key(&x, i);
		memcpy(h, x.hash, sizeof(h));
		if ((kv_index_key(&ix, 0, h) & (SLOTS - 1)) == SLOTS - 4)
			break;
	}
	CHECK(kv_index_find(&ix, 0, h) == NULL);
	for (i = 0; i < K; i++) {
		uint32_t r = (i * 173u + 11u) % K, j;

		kv_index_remove(&ix, &c[r]);
		CHECK(kv_index_check(&ix, what, sizeof(what)) == 0);
		CHECK(kv_index_find(&ix, 0, c[r].hash) == NULL);
		for (j = 0; j < K; j++)
			if (c[j].linked)
				CHECK(kv_index_find(&ix, 0, c[j].hash) == &c[j]);
	}
	CHECK_EQ(ix.count, 0);
	kv_index_fini(&ix);
}

int main(void)
{
	struct kv_index ix;
	uint8_t h[32];
	uint32_t i;

	CHECK(kv_index_init(&ix, 42) == 0);
	for (i = 0; i < N; i++) {
		key(&e[i], i);
		kv_index_insert(&ix, &e[i]);
	}
	CHECK_EQ(ix.count, N);
	CHECK(ix.nslots >= N);
	for (i = 0; i < N; i++)
		CHECK(kv_index_find(&ix, e[i].pool, e[i].hash) == &e[i]);
	/* Same hash, another pool: a miss. */
	CHECK(kv_index_find(&ix, e[5].pool + 1, e[5].hash) == NULL);
	memset(h, 0xab, sizeof(h));
	CHECK(kv_index_find(&ix, 0, h) == NULL);
	check_many(&ix, 0);
	check_many(&ix, 1);
	for (i = 0; i < N; i += 2)
		kv_index_remove(&ix, &e[i]);
	CHECK_EQ(ix.count, N / 2);
	CHECK(kv_index_check(&ix, NULL, 0) == 0);
	for (i = 0; i < N; i++)
		CHECK((kv_index_find(&ix, e[i].pool, e[i].hash) == &e[i]) == (i % 2 == 1));
	check_many(&ix, 2);
	kv_index_fini(&ix);
	test_big();
	test_cluster();
	return 0;
}
