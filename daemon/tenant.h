/* Tenants: who may open which namespace, and the limits each namespace runs
 * under (policy; ns.h is the mechanism, the configuration's [namespace NAME]
 * sections the source). docs/security.md has the threat model.
 *
 * Who may open namespace N (checked at Hello against the peer's SO_PEERCRED
 * uid and gid and its SO_PEERGROUPS supplementary groups):
 *   - an admin (kv_session_is_admin(): the admin socket, or root and the
 *     daemon's own uid on the worker socket): any namespace;
 *   - "uid-<uid>", the peer's private namespace (what a Hello with no
 *     namespace opens): always its owner, declared or not; a section for
 *     it sets its limits and may let others in as well;
 *   - N declared by a [namespace N] section: a uid in its users, anyone if
 *     users = *, or a member of one of its groups;
 *   - any other N: nobody.
 * So with nothing declared every local user has a namespace of its own, and
 * two users never share KV unless an operator says so. */
#ifndef KV_TENANT_H
#define KV_TENANT_H

#include <stddef.h>

#include "daemon.h"
#include "session.h"

/* The namespace a Hello without one opens: "uid-<uid>". */
void kv_tenant_default_ns(const struct kv_session *ss, char *buf, size_t len);

/* Whether ss's peer may open namespace name. Returns 1, or 0 with the
 * reason (naming the uid and the namespace) in why. */
int kv_tenant_may_open(const struct kv_daemon *d, const struct kv_session *ss, const char *name,
		       char *why, size_t whylen);

/* Sets the limits of live namespace id from the configuration (a section's
 * percentages resolved against the tiers' sizes; none for an undeclared
 * namespace). */
void kv_tenant_apply(struct kv_daemon *d, uint32_t id);

/* At start and after a reload: holds every declared namespace open
 * (d->declared_ns), applies the limits to every live namespace and closes
 * (d->close_session) each session whose peer may no longer open its
 * namespace. Returns how many were closed. */
uint32_t kv_tenants_reload(struct kv_daemon *d);

#endif
