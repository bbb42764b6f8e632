/* The watermarks: after each batch of requests and each completion, G2's
 * write-back to G3, then each device's demotion (tier.h, kv_tiers_kick). */
#include "tier_int.h"

/* Every watermark: G2's write-back, then each device's demotion. */
void kv_tiers_kick(struct kv_tiers *t)
{
	if (!t->lv[L2].on || t->stopping)
		return;
	if (t->lv[L3].on) {
		tier_flush_step(t);
		tier_writeback_kick(t);
	}
	tier_demote_kick(t);
	if (t->lv[L3].on) {
		kv_disk_flush(&t->disk);
		tier_journal_step(t);
		kv_journal_flush(&t->jr);
	}
}
