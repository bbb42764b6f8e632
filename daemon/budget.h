/* The memory the daemon holds for clients' connections, per uid and in all
 * (issue 29): the input and output buffers of every connection, charged to
 * the uid of its peer (SO_PEERCRED).
 *
 * conn.c charges a buffer's growth before it makes it (kv_budget_fits) and
 * its whole capacity while it has it (kv_budget_charge). A growth past
 * max_memory_per_uid, or past max_connection_memory for all uids together,
 * closes the newest connection of the uid whose connection grows (the one
 * growing, when it is the newest), with a logged reason, until the growth
 * fits: never a connection of another uid.
 *
 * Segment fds out to a uid's connections (queued for a reply, or sent and not
 * read yet: session.h) are counted here too (fds), by session.c; ops_req.c
 * refuses a reply that would take a uid past max_fds_per_uid (EAGAIN to that
 * client), so one uid cannot take the whole of max_fds_in_flight, nor the
 * daemon's fd table, from the others. Loop thread only. */
#ifndef KV_BUDGET_H
#define KV_BUDGET_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "list.h"

/* One uid's share: its open connections (oldest first) and their bytes. */
struct kv_budget_uid {
	struct kv_budget_uid *next;
	uid_t uid;
	uint32_t conns;
	uint64_t bytes;
	uint64_t fds;              /* segment fds out to its connections */
	struct kv_list list;       /* of its connections: the caller's links */
};

struct kv_budget {
	struct kv_budget_uid *uids;
	uint64_t total;            /* bytes, every uid */
	uint64_t closed;           /* connections closed over a bound */
};

/* The share of uid, made if need be; NULL when out of memory. */
struct kv_budget_uid *kv_budget_join(struct kv_budget *b, uid_t uid);
/* A connection of u is gone (its bytes uncharged already): frees u after
 * its last. */
void kv_budget_leave(struct kv_budget *b, struct kv_budget_uid *u);
/* Whether u may hold more bytes more under per_uid and global (0: no bound);
 * if not, which bound in *which (0: per uid, 1: global). */
int kv_budget_fits(const struct kv_budget *b, const struct kv_budget_uid *u, uint64_t more,
		   uint64_t per_uid, uint64_t global, int *which);
/* Adds delta bytes (negative: gives back) to u and the total. */
void kv_budget_charge(struct kv_budget *b, struct kv_budget_uid *u, int64_t delta);

#endif
