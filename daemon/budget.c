/* Connection memory per uid and in all; see budget.h. */
#include "budget.h"

#include <stdlib.h>

#include "kvassert.h"

struct kv_budget_uid *kv_budget_join(struct kv_budget *b, uid_t uid)
{
	struct kv_budget_uid *u;

	for (u = b->uids; u; u = u->next)
		if (u->uid == uid)
			break;
	if (!u) {
		if (!(u = calloc(1, sizeof(*u))))
			return NULL;
		u->uid = uid;
		kv_list_init(&u->list);
		u->next = b->uids;
		b->uids = u;
	}
	u->conns++;
	return u;
}

void kv_budget_leave(struct kv_budget *b, struct kv_budget_uid *u)
{
	struct kv_budget_uid **p;

	kv_assert(u->conns > 0);
	if (--u->conns)
		return;
	kv_assert(!u->bytes && !u->fds);
	for (p = &b->uids; *p != u; p = &(*p)->next)
		;
	*p = u->next;
	free(u);
}

int kv_budget_fits(const struct kv_budget *b, const struct kv_budget_uid *u, uint64_t more,
		   uint64_t per_uid, uint64_t global, int *which)
{
	if (per_uid && u->bytes + more > per_uid) {
		*which = 0;
		return 0;
	}
	if (global && b->total + more > global) {
		*which = 1;
		return 0;
	}
	return 1;
}

void kv_budget_charge(struct kv_budget *b, struct kv_budget_uid *u, int64_t delta)
{
	kv_assert(delta >= 0 || (uint64_t)-delta <= u->bytes);
	u->bytes = (uint64_t)((int64_t)u->bytes + delta);
	b->total = (uint64_t)((int64_t)b->total + delta);
}
