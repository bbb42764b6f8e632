/* The namespace table; see ns.h. */
#include "ns.h"

#include <errno.h>
#include <string.h>

#include "kvassert.h"

int kv_ns_name_ok(const char *name)
{
	size_t i, len = strlen(name);

	if (!len || len >= KV_NAME_MAX)
		return 0;
	/* Names reach logs, metrics labels and file names: no spaces, quotes,
	 * control bytes or slashes. */
	for (i = 0; i < len; i++) {
		char ch = name[i];

		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == ':' || ch == '-'))
			return 0;
	}
	return 1;
}

uint32_t kv_ns_find(const struct kv_ns_table *t, const char *name)
{
	uint32_t i;

	for (i = 0; i < KV_MAX_NS; i++)
		if (t->ns[i].refs && !strcmp(t->ns[i].name, name))
			return i + 1;
	return 0;
}

/* Unused reserve of n: what it adds to t->reserve_unused. */
static uint64_t unused_reserve(const struct kv_ns *n)
{
	return n->lim.reserve > n->used[0] ? n->lim.reserve - n->used[0] : 0;
}

int kv_ns_open(struct kv_ns_table *t, const char *name)
{
	uint32_t id = kv_ns_find(t, name), i;
	struct kv_ns *n;

	if (!kv_ns_name_ok(name))
		return -EINVAL;
	if (id) {
		t->ns[id - 1].refs++;
		return (int)id;
	}
	for (i = 0; i < KV_MAX_NS && t->ns[i].refs; i++)
		;
	if (i == KV_MAX_NS)
		return -ENOSPC;
	n = &t->ns[i];
	memset(n, 0, sizeof(*n));
	strcpy(n->name, name);
	n->id = i + 1;
	n->refs = 1;
	t->live++;
	return (int)n->id;
}

struct kv_ns *kv_ns_get(struct kv_ns_table *t, uint32_t id)
{
	return id >= 1 && id <= KV_MAX_NS && t->ns[id - 1].refs ? &t->ns[id - 1] : NULL;
}

const char *kv_ns_name(const struct kv_ns_table *t, uint32_t id)
{
	return id >= 1 && id <= KV_MAX_NS && t->ns[id - 1].refs ? t->ns[id - 1].name : "?";
}

void kv_ns_hold(struct kv_ns_table *t, uint32_t id)
{
	struct kv_ns *n = kv_ns_get(t, id);

	kv_assert(n);
	n->refs++;
}

void kv_ns_put(struct kv_ns_table *t, uint32_t id)
{
	struct kv_ns *n = kv_ns_get(t, id);

	kv_assert(n && n->refs > 0);
	if (--n->refs)
		return;
	/* Pools hold a reference while they hold blocks, sessions while they
	 * hold anything: nothing can be charged to a namespace nobody refers
	 * to. */
	kv_assert(!n->used[0] && !n->used[1] && !n->used[2]);
	t->reserve_unused -= unused_reserve(n);
	n->name[0] = '\0';
	t->live--;
}

void kv_ns_set_limits(struct kv_ns_table *t, uint32_t id, const struct kv_ns_limits *lim)
{
	struct kv_ns *n = kv_ns_get(t, id);

	kv_assert(n);
	t->reserve_unused -= unused_reserve(n);
	if (n->lim.priority != lim->priority)
		t->prio_epoch++;
	n->lim = *lim;
	t->reserve_unused += unused_reserve(n);
}

void kv_ns_charge(struct kv_ns_table *t, uint32_t id, int tier, int64_t delta)
{
	struct kv_ns *n = kv_ns_get(t, id);

	kv_assert(n && tier >= 0 && tier < KV_NS_TIERS);
	kv_assert(delta >= 0 || n->used[tier] >= (uint64_t)-delta);
	if (tier == 0)
		t->reserve_unused -= unused_reserve(n);
	n->used[tier] += (uint64_t)delta;
	if (tier == 0)
		t->reserve_unused += unused_reserve(n);
}
