/* The prefix index: insert, find, remove across table growth. */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "index.h"

#define N 50000

static struct kv_index_entry e[N];

static void key(struct kv_index_entry *x, uint32_t i)
{
	memset(x->hash, 0, sizeof(x->hash));
	memcpy(x->hash, &i, sizeof(i));
	x->hash[31] = (uint8_t)(i * 7);
	x->pool = i % 3;
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
	for (i = 0; i < N; i++)
		CHECK(kv_index_find(&ix, e[i].pool, e[i].hash) == &e[i]);
	/* Same hash, another pool: a miss. */
	CHECK(kv_index_find(&ix, e[5].pool + 1, e[5].hash) == NULL);
	memset(h, 0xab, sizeof(h));
	CHECK(kv_index_find(&ix, 0, h) == NULL);
	for (i = 0; i < N; i += 2)
		kv_index_remove(&ix, &e[i]);
	CHECK_EQ(ix.count, N / 2);
	for (i = 0; i < N; i++)
		CHECK((kv_index_find(&ix, e[i].pool, e[i].hash) == &e[i]) == (i % 2 == 1));
	kv_index_fini(&ix);
	return 0;
}
