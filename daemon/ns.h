/* Namespaces: the tenants' ids, names, lifetime, limits and usage.
 *
 * A namespace is where a client's pools, blocks and prefix hashes live; no
 * client reaches another namespace's. This module is the table of the
 * namespaces that exist now (mechanism): the allocator (pool.c) and the tiers
 * charge each block to its namespace here, and enforce the limits written
 * here. Who may open a namespace and what its limits are is policy: the
 * configuration's [namespace NAME] sections, applied by tenant.c.
 *
 * Lifetime: a namespace exists while something refers to it: a session that
 * opened it (Hello) or a pool of it (pools live while they hold blocks). The
 * last kv_ns_put() frees the slot and the id may be reused; nothing keeps an
 * id across that (pools and sessions are gone), so reuse is safe.
 *
 *   FREE (name "") --kv_ns_open--> LIVE (refs >= 1) --last kv_ns_put--> FREE
 *
 * Usage (bytes) per tier: G1 counts the blocks of the namespace's pools that
 * are not FREE (writable, sealed, cached, demoting), G2 and G3 the copies the
 * host and disk tiers hold of them and the swapped-out sequences of its
 * sessions. used[] is exact at every instant; kvctl check verifies G1.
 *
 * Single-threaded: the event loop's. */
#ifndef KV_NS_H
#define KV_NS_H

#include <stdint.h>

#define KV_MAX_NS 256
#define KV_NAME_MAX 64
#define KV_NS_TIERS 3   /* G1, G2, G3: the same order as tier.h's KV_TIER_* */

/* Limits of one namespace, in bytes (0 = none). */
struct kv_ns_limits {
	uint64_t quota[KV_NS_TIERS];  /* what it may hold per tier */
	uint64_t reserve;             /* G1 others' allocations never take it below */
	uint32_t priority;            /* eviction across namespaces: lower goes first */
	uint64_t ttl_ms;              /* a cached prefix older than this is not served */
	int remote;                   /* its sealed blocks go to G4 and are found there */
	uint64_t quota_g4;            /* bytes it may write to G4 per remote_ttl; 0 = no limit */
	int remote_write;             /* KV_G4W_*: when its blocks are written to G4 */
	int remote_unauth;            /* remote_auth = off: reads values without an HMAC tag */
};

/* remote_auth, daemon-wide and per namespace (docs/security.md "G4 values"): */
enum {
	KV_NS_AUTH_DEFAULT = 0,  /* a namespace's: the daemon's */
	KV_NS_AUTH_REQUIRED,     /* values are served only with a valid HMAC tag */
	KV_NS_AUTH_OFF,          /* header and CRC32C only: opted out */
};

/* remote_write, daemon-wide and per namespace (docs/g4.md): */
enum {
	KV_G4W_DEFAULT = 0,    /* a namespace's: the daemon's */
	KV_G4W_WRITEBACK,      /* when G2 writes it back to G3, or drops it without G3 */
	KV_G4W_DEMOTE,         /* when it comes down into G2 (and as writeback if not then) */
	KV_G4W_OFF,            /* never: only reads */
};

struct kv_ns {
	char name[KV_NAME_MAX];       /* "" while FREE */
	uint32_t id;                  /* 1..KV_MAX_NS; 0 is "no namespace" */
	uint32_t refs;                /* sessions in it + pools of it */
	uint32_t sessions, pools;
	uint64_t used[KV_NS_TIERS];
	uint64_t cached;              /* of used[G1]: CACHED blocks (evictable) */
	struct kv_ns_limits lim;
	uint64_t lookups, hits;       /* blocks asked for and found (any tier) */
	uint64_t quota_refusals;      /* EQUOTA replies */
	uint64_t enospc;              /* ENOSPC replies to allocations (alloc, cow, swap in) */
	uint64_t g4_bytes, g4_since;  /* bytes to G4 since g4_since (kv_mono_ms(), remote_write.c) */
};

struct kv_ns_table {
	struct kv_ns ns[KV_MAX_NS];   /* ns[id - 1] */
	uint32_t live;
	/* G1 bytes that namespaces' reserves hold back from the others: the sum
	 * over namespaces of max(0, reserve - used[G1]). */
	uint64_t reserve_unused;
	/* Bumped when a namespace's priority changes (evict.c orders pools
	 * by it). */
	uint32_t prio_epoch;
};

/* A valid namespace name: 1..63 bytes of [A-Za-z0-9._:-]. */
int kv_ns_name_ok(const char *name);

/* The id of namespace name, created (limits zero) if it does not exist, with
 * one more reference. Returns the id (>= 1), -EINVAL for a bad name, or
 * -ENOSPC when KV_MAX_NS namespaces are live. */
int kv_ns_open(struct kv_ns_table *t, const char *name);
/* The id of name if it is live, else 0. Takes no reference. */
uint32_t kv_ns_find(const struct kv_ns_table *t, const char *name);
/* Takes one more reference on live id. */
void kv_ns_hold(struct kv_ns_table *t, uint32_t id);
/* Drops a reference; the last one frees the namespace. */
void kv_ns_put(struct kv_ns_table *t, uint32_t id);
/* The live namespace id, or NULL. */
struct kv_ns *kv_ns_get(struct kv_ns_table *t, uint32_t id);
/* Its name, or "?" for an id that is not live. */
const char *kv_ns_name(const struct kv_ns_table *t, uint32_t id);

/* Sets id's limits (the reserve bookkeeping follows). */
void kv_ns_set_limits(struct kv_ns_table *t, uint32_t id, const struct kv_ns_limits *lim);
/* Adds delta bytes (negative: gives back) to id's usage of tier. */
void kv_ns_charge(struct kv_ns_table *t, uint32_t id, int tier, int64_t delta);

/* Bytes id may still take in tier under its quota (UINT64_MAX: no quota). */
static inline uint64_t kv_ns_quota_room(const struct kv_ns *n, int tier)
{
	uint64_t q = n->lim.quota[tier];

	if (!q)
		return UINT64_MAX;
	return n->used[tier] >= q ? 0 : q - n->used[tier];
}

/* G1 bytes that other namespaces' reserves hold back from id. */
static inline uint64_t kv_ns_reserved_for_others(const struct kv_ns_table *t, const struct kv_ns *n)
{
	uint64_t mine = n->lim.reserve > n->used[0] ? n->lim.reserve - n->used[0] : 0;

	return t->reserve_unused - mine;
}

/* Whether another namespace's allocation may evict id's cached G1 blocks:
 * not while id holds no more than its reserve. */
static inline int kv_ns_evictable(const struct kv_ns *n)
{
	return n->used[0] > n->lim.reserve;
}

#endif
