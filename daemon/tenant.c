/* Tenants: authorization and limits of namespaces; see tenant.h. */
#include "tenant.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

void kv_tenant_default_ns(const struct kv_session *ss, char *buf, size_t len)
{
	snprintf(buf, len, "uid-%u", (unsigned)ss->cred.uid);
}

static int has_id(const uint32_t *ids, uint32_t n, uint32_t id)
{
	for (uint32_t i = 0; i < n; i++)
		if (ids[i] == id)
			return 1;
	return 0;
}

int kv_tenant_may_open(const struct kv_daemon *d, const struct kv_session *ss, const char *name,
		       char *why, size_t whylen)
{
	const struct kv_ns_conf *n = kv_nsconf_find(&d->cfg, name);
	char own[32];

	if (kv_session_is_admin(ss))
		return 1;
	/* A uid's private namespace stays its own when a section declares it
	 * (to set its limits, or to let others in too). */
	kv_tenant_default_ns(ss, own, sizeof(own));
	if (!strcmp(name, own))
		return 1;
	if (!n) {
		snprintf(why, whylen, "uid %u may not open namespace '%s': it is not declared in "
			 "the configuration ([namespace %s]); uid %u's own namespace is '%s'",
			 (unsigned)ss->cred.uid, name, name, (unsigned)ss->cred.uid, own);
		return 0;
	}
	if (n->anyone || has_id(n->uids, n->nuids, ss->cred.uid) ||
	    has_id(n->gids, n->ngids, ss->cred.gid))
		return 1;
	for (int i = 0; i < ss->ngroups; i++)
		if (has_id(n->gids, n->ngids, ss->groups[i]))
			return 1;
	snprintf(why, whylen, "uid %u (gid %u) may not open namespace '%s': not in its users or "
		 "groups", (unsigned)ss->cred.uid, (unsigned)ss->cred.gid, name);
	return 0;
}

/* A section's size in bytes: a percentage of total, or as written. */
static uint64_t resolve(uint64_t v, uint64_t total)
{
	if (!(v & KV_CFG_PCT_BIT))
		return v;
	v = (uint64_t)((unsigned __int128)total * (v & ~KV_CFG_PCT_BIT) / 10000);
	return v ? v : 1;   /* a percentage is never "none" */
}

/* G1 of every device: what the backend made, which is less than pool_size
 * where the cuda backend found less free. */
static uint64_t pool_total(const struct kv_backend *be)
{
	uint64_t t = 0;

	for (uint32_t i = 0; i < be->devices; i++)
		t += kv_backend_dev_bytes(be, i);
	return t;
}

void kv_tenant_apply(struct kv_daemon *d, uint32_t id)
{
	struct kv_ns_table *t = kv_pools_nstab(d->pools);
	const struct kv_ns_conf *c = kv_nsconf_find(&d->cfg, kv_ns_name(t, id));
	struct kv_ns_limits lim = { 0 };
	uint64_t total[KV_NS_TIERS] = {
		pool_total(d->be), d->cfg.tiers.host_bytes,
		d->cfg.tiers.disk_path[0] ? d->cfg.tiers.disk_bytes : 0,
	};

	if (c) {
		for (int i = 0; i < KV_NS_TIERS; i++)
			lim.quota[i] = resolve(c->quota[i], total[i]);
		lim.reserve = resolve(c->reserve, total[0]);
		lim.priority = c->priority;
		lim.ttl_ms = c->ttl_ms;
		lim.remote = c->remote;
		lim.quota_g4 = c->quota_g4;
		lim.remote_write = c->remote_write;
		lim.remote_unauth = (c->remote_auth ? c->remote_auth
				     : strcmp(d->cfg.tiers.remote_auth, "off") ? KV_NS_AUTH_REQUIRED
									       : KV_NS_AUTH_OFF) ==
				    KV_NS_AUTH_OFF;
	}
	kv_ns_set_limits(t, id, &lim);
}

uint32_t kv_tenants_reload(struct kv_daemon *d)
{
	struct kv_ns_table *t = kv_pools_nstab(d->pools);
	struct kv_list *pos, *tmp;
	uint32_t id, closed = 0;
	char why[300];

	uint32_t held[KV_CFG_MAX_NS], nheld = 0, i;

	/* The declared namespaces stay open: new ones first, then the old
	 * references go (a namespace still declared keeps its usage). */
	for (i = 0; i < d->cfg.nns; i++) {
		int r = kv_pools_ns(d->pools, d->cfg.ns[i].name);

		if (r > 0)
			held[nheld++] = (uint32_t)r;
		else
			kv_warn("namespace '%s': %d namespaces are open already; its limits apply "
				"when it opens", d->cfg.ns[i].name, KV_MAX_NS);
	}
	for (i = 0; i < d->ndeclared; i++)
		kv_pools_ns_put(d->pools, d->declared_ns[i]);
	memcpy(d->declared_ns, held, nheld * sizeof(*held));
	d->ndeclared = nheld;
	for (id = 1; id <= KV_MAX_NS; id++)
		if (kv_ns_get(t, id))
			kv_tenant_apply(d, id);
	kv_list_for_each_safe(pos, tmp, &d->sessions) {
		struct kv_session *ss = kv_container_of(pos, struct kv_session, link);

		if (!ss->ns || kv_tenant_may_open(d, ss, kv_ns_name(t, ss->ns), why, sizeof(why)))
			continue;
		kv_warn("reload: closing session %llu (pid %d): %s", (unsigned long long)ss->id,
			(int)ss->cred.pid, why);
		if (d->close_session) {
			d->close_session(ss, why);
			closed++;
		}
	}
	return closed;
}
