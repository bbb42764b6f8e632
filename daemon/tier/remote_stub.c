/* The G4 tier of a build without hiredis (daemon/meson.build builds this
 * file instead of remote.c, remote_write.c and remote_read.c): no G4;
 * remote_seeds is refused at start. */
#include "tier_int.h"

#include <errno.h>
#include <stdio.h>

int tier_remote_open(struct kv_tiers *t, char *err, size_t errlen)
{
	if (!t->cfg.remote_seeds[0])
		return 0;
	snprintf(err, errlen, "remote_seeds: this kvcached was built without hiredis (no G4)");
	return -ENOTSUP;
}

void tier_remote_close(struct kv_tiers *t)
{
	(void)t;
}

void tier_remote_reap(struct kv_tiers *t)
{
	(void)t;
}

uint64_t tier_remote_held(const struct kv_tiers *t)
{
	(void)t;
	return 0;
}

int tier_remote_want(struct kv_tiers *t, struct tblock *tb, int when)
{
	(void)t;
	(void)tb;
	(void)when;
	return 0;
}

int tier_remote_put(struct kv_tiers *t, struct tblock *tb, int when)
{
	(void)t;
	(void)tb;
	(void)when;
	return 0;
}

int tier_remote_put_sum(struct kv_tiers *t, struct tblock *tb, int when, const uint32_t *crc)
{
	(void)t;
	(void)tb;
	(void)when;
	(void)crc;
	return 0;
}

int tier_remote_demotes(struct kv_tiers *t, const struct kv_pool *p)
{
	(void)t;
	(void)p;
	return 0;
}

void tier_remote_copy(struct tblock *tb, const uint8_t *slot)
{
	(void)tb;
	(void)slot;
}

void tier_remote_queue(struct kv_tiers *t, struct tblock *tb)
{
	(void)t;
	(void)tb;
}

void tier_remote_count_holds(struct kv_tiers *t)
{
	(void)t;
}

uint64_t kv_tiers_remote_mark(const struct kv_pool *p, const uint8_t *hash)
{
	(void)p;
	(void)hash;
	return 0;
}

void kv_tiers_remote_ahead(struct kv_tiers *t, struct kv_pool *p, const uint8_t *hashes,
			   size_t n, struct kv_waiter *w)
{
	(void)t;
	(void)p;
	(void)hashes;
	(void)n;
	(void)w;
}

void kv_tiers_waiter_gone(struct kv_tiers *t, struct kv_waiter *w, uint32_t ns)
{
	(void)t;
	(void)ns;
	w->ahead = NULL;
}

int kv_tiers_remote_fetch(struct kv_tiers *t, struct kv_pool *p, const uint8_t *hashes,
			  size_t n, struct kv_waiter *w)
{
	(void)t;
	(void)p;
	(void)hashes;
	(void)n;
	(void)w;
	return -ENOENT;
}

int kv_tiers_remote_stats(const struct kv_tiers *t, struct kv_g4_stats *st)
{
	(void)t;
	(void)st;
	return 0;
}

