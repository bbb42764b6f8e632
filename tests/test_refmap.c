/* The session reference map against a plain array model, with heavy churn so
 * that backward-shift deletion runs across wrapped probe sequences. */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "list.h"
#include "refmap.h"

#define N 5000

static uint32_t model[N];
static char keys[N];

static void sum(void *key, uint32_t count, void *ctx)
{
	uint64_t *s = ctx;

	CHECK(model[(char *)key - keys] == count);
	*s += count;
}

/* Counts stop at KV_REFMAP_COUNT_MAX: an add more is refused with
 * -EOVERFLOW and changes nothing. */
static void test_saturation(void)
{
	struct kv_refmap m;
	size_t i;

	kv_refmap_init(&m);
	CHECK(kv_refmap_add(&m, &keys[0]) == 0);
	CHECK(kv_refmap_add(&m, &keys[1]) == 0);
	/* Set keys[0]'s count one short of the maximum directly. */
	for (i = 0; i < m.cap; i++)
		if (m.slots[i].key == &keys[0])
			m.slots[i].count = KV_REFMAP_COUNT_MAX - 1;
	m.refs = (uint64_t)KV_REFMAP_COUNT_MAX;
	CHECK(kv_refmap_add(&m, &keys[0]) == 0);
	CHECK_EQ(kv_refmap_get(&m, &keys[0]), KV_REFMAP_COUNT_MAX);
	CHECK_EQ(m.refs, (uint64_t)KV_REFMAP_COUNT_MAX + 1);
	CHECK(kv_refmap_add(&m, &keys[0]) == -EOVERFLOW);
	CHECK_EQ(kv_refmap_get(&m, &keys[0]), KV_REFMAP_COUNT_MAX);
	CHECK_EQ(m.refs, (uint64_t)KV_REFMAP_COUNT_MAX + 1);
	CHECK_EQ(m.used, 2);
	/* Other keys are not affected, and the count comes back down as an
	 * int without wrapping negative. */
	CHECK(kv_refmap_add(&m, &keys[1]) == 0);
	CHECK_EQ(kv_refmap_get(&m, &keys[1]), 2);
	CHECK_EQ(kv_refmap_sub(&m, &keys[0]), (long long)KV_REFMAP_COUNT_MAX - 1);
	CHECK(kv_refmap_add(&m, &keys[0]) == 0);
	kv_refmap_fini(&m);
}

static void test_list(void)
{
	struct kv_list head, a, b, c;

	kv_list_init(&head);
	kv_list_init(&a);
	kv_list_init(&b);
	kv_list_init(&c);
	CHECK(kv_list_empty(&head) && !kv_list_linked(&a));
	kv_list_push_front(&head, &a);
	kv_list_push_front(&head, &b);
	kv_list_push_back(&head, &c);
	CHECK(kv_list_front(&head) == &b && kv_list_back(&head) == &c);
	kv_list_del(&b);
	kv_list_del(&b); /* harmless twice */
	CHECK(kv_list_front(&head) == &a && !kv_list_linked(&b));
	kv_list_del(&a);
	kv_list_del(&c);
	CHECK(kv_list_empty(&head) && kv_list_back(&head) == NULL);
}

int main(void)
{
	struct kv_refmap m;
	uint64_t total = 0, s = 0;
	uint32_t rnd = 12345;
	int i;

	test_list();
	test_saturation();
	kv_refmap_init(&m);
	CHECK(kv_refmap_get(&m, &keys[0]) == 0);
	CHECK_ABORTS(kv_refmap_sub(&m, &keys[0]));  /* not held: the caller's bug */
	CHECK(kv_refmap_add(&m, &keys[1]) == 0);
	CHECK_ABORTS(kv_refmap_sub(&m, &keys[0]));
	CHECK_EQ(kv_refmap_sub(&m, &keys[1]), 0);
	CHECK_ABORTS(kv_refmap_sub(&m, &keys[1]));  /* given back twice */
	for (i = 0; i < 400000; i++) {
		uint32_t k;

		rnd = rnd * 1103515245 + 12345;
		k = (rnd >> 8) % (i < 200000 ? N : N / 10);
		if ((rnd >> 4) & 1) {
			CHECK(kv_refmap_add(&m, &keys[k]) == 0);
			model[k]++;
			total++;
		} else if (model[k]) {
			CHECK_EQ(kv_refmap_sub(&m, &keys[k]), model[k] - 1);
			model[k]--;
			total--;
		} else {
			/* Subbing a key not held is an assertion (below). */
			CHECK_EQ(kv_refmap_get(&m, &keys[k]), 0);
		}
		if (i % 9973 == 0)
			for (k = 0; k < N; k++)
				CHECK_EQ(kv_refmap_get(&m, &keys[k]), model[k]);
	}
	kv_refmap_each(&m, sum, &s);
	CHECK_EQ(s, total);
	CHECK_EQ(m.refs, total);
	kv_refmap_fini(&m);
	return 0;
}
