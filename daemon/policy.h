/* What the daemon decides for a pool when it is created, from the
 * configuration of its namespace (config.h's [namespace.*] sections):
 * which KV-event topic its blocks go to, and in which format its tier
 * copies are kept. Policy only: the events module publishes, the tiers
 * copy, the pool registry creates the pool; the RegisterPool handler
 * (ops_block.c) validates the request and replies, and calls this once a
 * pool is new.
 *
 * Single-threaded: the event loop thread only. */
#ifndef KV_POLICY_H
#define KV_POLICY_H

struct kv_daemon;
struct kv_ns;
struct kv_pool;

/* Pool p of namespace ns was just created by a registration that names
 * model (NULL or "": none; the handler bounded it): fixes its event topic
 * (kv@<node>@<model>; none without a model, or for a namespace with
 * events off) and its tier copies' format (compress of its namespace,
 * where its dtype and the backend allow), then tells the tiers, which
 * compute its layout id from that format. Logs what it could not do; the
 * pool works either way. */
void kv_policy_pool_added(struct kv_daemon *d, struct kv_pool *p, const struct kv_ns *ns,
			  const char *model);

#endif
