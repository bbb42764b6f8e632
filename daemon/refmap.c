#include "refmap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvassert.h"

static size_t slot_of(const struct kv_refmap *m, const void *key)
{
	uint64_t x = (uint64_t)(uintptr_t)key;

	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return (size_t)x & (m->cap - 1);
}

void kv_refmap_init(struct kv_refmap *m)
{
	memset(m, 0, sizeof(*m));
}

void kv_refmap_fini(struct kv_refmap *m)
{
	free(m->slots);
	kv_refmap_init(m);
}

static struct kv_refmap_slot *find(const struct kv_refmap *m, const void *key)
{
	size_t i;

	if (!m->cap)
		return NULL;
	for (i = slot_of(m, key);; i = (i + 1) & (m->cap - 1)) {
		if (m->slots[i].key == key)
			return &m->slots[i];
		if (!m->slots[i].key)
			return NULL;
	}
}

uint32_t kv_refmap_get(const struct kv_refmap *m, const void *key)
{
	const struct kv_refmap_slot *s = find(m, key);

	return s ? s->count : 0;
}

static void put(struct kv_refmap *m, void *key, uint32_t count)
{
	size_t i = slot_of(m, key);

	while (m->slots[i].key)
		i = (i + 1) & (m->cap - 1);
	m->slots[i].key = key;
	m->slots[i].count = count;
}

/* Keeps the load under 1/2. */
int kv_refmap_reserve(struct kv_refmap *m, size_t n)
{
	struct kv_refmap_slot *old = m->slots;
	size_t oldcap = m->cap, cap = m->cap ? m->cap : 16, i;

	while ((m->used + n) * 2 > cap)
		cap *= 2;
	if (cap == m->cap)
		return 0;
	m->slots = calloc(cap, sizeof(*m->slots));
	if (!m->slots) {
		m->slots = old;
		return -ENOMEM;
	}
	m->cap = cap;
	for (i = 0; i < oldcap; i++)
		if (old[i].key)
			put(m, old[i].key, old[i].count);
	free(old);
	return 0;
}

int kv_refmap_add(struct kv_refmap *m, void *key)
{
	size_t i = 0;

	kv_assert(m->refs < UINT64_MAX);
	/* One probe: it ends at the key or at the empty slot a new key goes
	 * into, which is taken as is unless the map must grow first. */
	if (m->cap)
		for (i = slot_of(m, key); m->slots[i].key && m->slots[i].key != key;
		     i = (i + 1) & (m->cap - 1))
			;
	if (m->cap && m->slots[i].key) {
		if (m->slots[i].count >= KV_REFMAP_COUNT_MAX)
			return -EOVERFLOW;
		m->slots[i].count++;
	} else if ((m->used + 1) * 2 <= m->cap) {
		m->slots[i].key = key;
		m->slots[i].count = 1;
		m->used++;
	} else {
		if (kv_refmap_reserve(m, 1) < 0)
			return -ENOMEM;
		put(m, key, 1);
		m->used++;
	}
	m->refs++;
	return 0;
}

int kv_refmap_sub(struct kv_refmap *m, const void *key)
{
	struct kv_refmap_slot *s = find(m, key);
	size_t i, j, k;

	/* Giving back what the session does not hold is the caller's bug
	 * (ops.c checks first). A held key has a count of at least 1. */
	kv_assert(s != NULL);
	kv_assert(s->count > 0 && m->refs >= s->count);
	m->refs--;
	if (--s->count > 0)
		return (int)s->count;
	/* Backward-shift deletion: pull later members of the probe run into
	 * the hole so that lookups never stop early. */
	i = (size_t)(s - m->slots);
	for (j = (i + 1) & (m->cap - 1); m->slots[j].key; j = (j + 1) & (m->cap - 1)) {
		k = slot_of(m, m->slots[j].key);
		/* Move j to i unless its home k lies cyclically in (i, j]. */
		if ((j > i && (k <= i || k > j)) || (j < i && (k <= i && k > j))) {
			m->slots[i] = m->slots[j];
			i = j;
		}
	}
	m->slots[i].key = NULL;
	m->slots[i].count = 0;
	m->used--;
	return 0;
}

void kv_refmap_each(const struct kv_refmap *m, void (*fn)(void *key, uint32_t count, void *ctx),
		    void *ctx)
{
	size_t i;

	for (i = 0; i < m->cap; i++)
		if (m->slots[i].key)
			fn(m->slots[i].key, m->slots[i].count, ctx);
}
