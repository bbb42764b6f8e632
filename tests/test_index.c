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
	CHECK(ix.nbuckets >= 1u << 20 && ix.count == BIG);
	for (i = 0; i < BIG; i++)
		CHECK(kv_index_find(&ix, x[i].pool, x[i].hash) == &x[i]);
	for (i = 0; i < BIG; i += 3)
		kv_index_remove(&ix, &x[i]);
	for (i = 0; i < BIG; i++)
		CHECK((kv_index_find(&ix, x[i].pool, x[i].hash) == &x[i]) == (i % 3 != 0));
	kv_index_fini(&ix);
	free(x);
}

/* Every chain linked both ways, and ix->none (what an empty bucket's probe
 * compares, whose pprev an insert or removal without a neighbour writes)
 * in none of them, its next NULL and its pool no pool's (issue 38). */
static void check_links(const struct kv_index *ix)
{
	size_t b, n = 0;

	CHECK(ix->none.next == NULL && ix->none.pool == UINT32_MAX);
	for (b = 0; b < ix->nbuckets; b++) {
		const struct kv_index_entry *x = ix->buckets[b];

		CHECK(!x || x->pprev == &ix->buckets[b]);
		for (; x; x = x->next, n++) {
			CHECK(x != &ix->none);
			CHECK(!x->next || x->next->pprev == &x->next);
		}
	}
	CHECK_EQ(n, ix->count);
}

/* A probe of an empty bucket compares ix->none and still misses, even for
 * the one key that looks like it (pool UINT32_MAX, hash zero); that key,
 * once inserted, is found as itself. */
static void test_none(void)
{
	static struct kv_index_entry z, y;
	static const uint8_t zero[KV_HASH_BYTES];
	struct kv_index ix;

	CHECK(kv_index_init(&ix, 9) == 0);
	CHECK(kv_index_find(&ix, UINT32_MAX, zero) == NULL);
	kv_index_find_many(&ix, UINT32_MAX, zero, 1, keys, found);
	CHECK(found[0] == NULL);
	z.pool = UINT32_MAX;   /* hash zero */
	kv_index_insert(&ix, &z);
	CHECK(kv_index_find(&ix, UINT32_MAX, zero) == &z);
	kv_index_find_many(&ix, UINT32_MAX, zero, 1, keys, found);
	CHECK(found[0] == &z);
	/* A second entry in z's bucket ahead of it, then each removed. */
	y.pool = 3;
	kv_index_insert_key(&ix, &y, kv_index_key(&ix, UINT32_MAX, zero));
	check_links(&ix);
	kv_index_remove(&ix, &z);
	check_links(&ix);
	CHECK(kv_index_find(&ix, UINT32_MAX, zero) == NULL);
	kv_index_remove(&ix, &y);
	check_links(&ix);
	CHECK(kv_index_find(&ix, 3, zero) == NULL);
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
	CHECK(ix.nbuckets >= N);
	check_links(&ix);
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
	check_links(&ix);
	for (i = 0; i < N; i++)
		CHECK((kv_index_find(&ix, e[i].pool, e[i].hash) == &e[i]) == (i % 2 == 1));
	check_many(&ix, 2);
	kv_index_fini(&ix);
	test_big();
	test_none();
	return 0;
}
