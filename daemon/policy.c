/* Per-pool policy from the namespace configuration; see policy.h. Moved
 * here from the RegisterPool handler (issue 38), which validates and
 * replies only. */
#include "policy.h"

#include <stdio.h>

#include "daemon.h"
#include "events.h"
#include "log.h"
#include "ns.h"

/* KV events: the topic of new pool p, kv@<node>@<model>, the model the
 * registration names; without one, no events. */
static void pool_events(struct kv_daemon *d, const struct kv_pool *p, const struct kv_ns *ns,
			const char *model)
{
	const struct kv_ns_conf *nc;
	char name[200];
	int tokens = d->cfg.events_token_ids;

	if (!d->events)
		return;
	nc = kv_nsconf_find(&d->cfg, ns->name);
	if (nc && nc->events)
		tokens = nc->events == KV_NS_EVENTS_TOKENS;
	if (nc && nc->events == KV_NS_EVENTS_OFF) {
		kv_events_pool(d->events, p->id, NULL, 0, 0);  /* no topic: no events */
		return;
	}
	if (!model || !*model) {
		/* No model: no router could match its topic (llm-d hashes a
		 * request's keys with the topic's model). Not published,
		 * counted (docs/events.md, "Topics"). */
		kv_events_no_model(d->events, p->id);
		return;
	}
	snprintf(name, sizeof(name), "%s", model);
	if (kv_events_pool(d->events, p->id, name, p->block_tokens, tokens) < 0)
		kv_warn("events: pool '%s': no topic for model '%s'", p->name, name);
}

/* compress of p's namespace, fixed now that p is created (before the tiers
 * compute its layout id, which names the format of its tier copies). */
static void pool_compress(struct kv_daemon *d, struct kv_pool *p, const struct kv_ns *ns)
{
	const struct kv_ns_conf *nc = kv_nsconf_find(&d->cfg, ns->name);
	enum kv_dtype t = kv_dtype_parse(p->dtype);

	if (!nc || !nc->compress)
		return;
	if (t == KV_DTYPE_NONE) {
		kv_info("pool '%s' of namespace '%s': dtype '%s' is not FP16 or BF16: its tier "
			"copies stay uncompressed", p->name, ns->name, p->dtype);
		return;
	}
	if (!d->be->quant) {
		/* cuda: a device could not load the kernels (logged at start). */
		kv_info("pool '%s' of namespace '%s': the %s backend does not compress tier "
			"copies here (see the start-up log): they stay uncompressed", p->name,
			ns->name, d->be->name);
		return;
	}
	p->qfmt = (uint8_t)nc->compress;
	p->qdtype = (uint8_t)t;
	kv_info("pool '%s' of namespace '%s': tier copies in FP8 %s, %llu bytes a block "
		"instead of %llu", p->name, ns->name, p->qfmt == KV_QFMT_E5M2 ? "E5M2" : "E4M3",
		(unsigned long long)kv_pool_stored_bytes(p),
		(unsigned long long)p->block_bytes);
}

void kv_policy_pool_added(struct kv_daemon *d, struct kv_pool *p, const struct kv_ns *ns,
			  const char *model)
{
	pool_events(d, p, ns, model);
	pool_compress(d, p, ns);
	kv_tiers_pool_added(d->tiers, p);
}
