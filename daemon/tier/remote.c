/* G4: sealed blocks in a Redis Cluster that a fleet of nodes shares
 * (docs/g4.md). The cluster client (rcluster.h) runs on threads of the
 * tier's own, each with its own connections: remote_readers read (lookups
 * wait on them; a fetch a slow node holds holds one, for
 * remote_fetch_timeout at most), one writes (so that write-back never
 * delays a lookup). Every node must move remote_min_rate bytes a second
 * after remote_timeout, or is given up and backed off; the stop cancels
 * every call under way (issue 36). Both hand their
 * results to the loop through the disk tier's eventfd (without G3, one G4
 * makes itself: tier_remote_open()). Blocks are written to the cluster at
 * the moment remote_write names: at their write-back to G3 (from the G2
 * slot the write-back holds busy), as G2 drops them where there is no G3,
 * or as they come down into G2.
 *
 * Key:   <prefix>:<namespace>:<layout id, hex>:<hash, hex>
 * Value: struct slot_hdr (as at the start of a G3 slot: magic, version,
 *        namespace, layout, hash, length, CRC32C of payload and header),
 *        then the payload, then, for a namespace with remote_key_file, an
 *        HMAC-SHA-256 tag of both (g4mac.h). A value that does not check
 *        out is a miss and a checksum (or auth) failure, never served (Redis
 *        replies carry no request id: a server that shifts its replies is
 *        caught here too).
 *
 * Here: the tier's setup and teardown, its clients (one per user) and HMAC
 * keys, and its counters. The writes and their buffer pool are in
 * remote_write.c, the reads in remote_read.c, what the three share (the
 * structs, the keys and lengths of values) in remote_int.h; a build without
 * hiredis has remote_stub.c instead of the three .c files. */
#include "remote_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>

#include "g4mac.h"
#include "log.h"

/* ---- setup -------------------------------------------------------------- */

static int read_password(const char *path, char *buf, size_t len, char *err, size_t errlen)
{
	FILE *f = fopen(path, "re");
	size_t n;

	if (!f) {
		snprintf(err, errlen, "remote_password_file %s: %s", path, strerror(errno));
		return -errno;
	}
	n = fread(buf, 1, len - 1, f);
	fclose(f);
	buf[n] = 0;
	while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		buf[--n] = 0;
	return 0;
}

/* Client i of G4: as user (NULL: none) with the password in file (NULL:
 * no AUTH). Returns 0 or -errno with err set. */
static int client_open(struct kv_tiers *t, uint32_t i, const char *ns, const char *user,
		       const char *file, char *err, size_t errlen)
{
	const struct kv_tiers_config *c = &t->cfg;
	struct g4_client *cl = &t->g4->cl[i];
	char pw[256] = "", e[256];
	int r;

	snprintf(cl->ns, sizeof(cl->ns), "%s", ns);
	cl->pending_tail = &cl->pending;
	for (uint32_t k = 0; k < G4_WRITERS; k++)
		if (!(cl->wj[k] = calloc(1, sizeof(*cl->wj[k])))) {
			snprintf(err, errlen, "G4: out of memory");
			return -ENOMEM;
		}
	if (file && file[0] && (r = read_password(file, pw, sizeof(pw), err, errlen)) < 0)
		return r;
	r = 0;
	for (uint32_t k = 0; r == 0 && k < G4_WRITERS; k++)
		r = kv_rc_new(c->remote_seeds, user && user[0] ? user : NULL, pw[0] ? pw : NULL,
			      (unsigned)c->remote_timeout_ms, &cl->wr[k], e, sizeof(e));
	for (uint32_t k = 0; r == 0 && k < t->g4->nreaders; k++)
		r = kv_rc_new(c->remote_seeds, user && user[0] ? user : NULL, pw[0] ? pw : NULL,
			      (unsigned)c->remote_timeout_ms, &cl->rd[k], e, sizeof(e));
	memset(pw, 0, sizeof(pw));
	if (r < 0) {
		snprintf(err, errlen, "remote_seeds%s%s: %s", ns[0] ? ", namespace " : "", ns, e);
		return r;
	}
	/* Issue 36: every node moves remote_min_rate bytes a second or is
	 * given up (and backed off); a read (slot map included) ends within
	 * remote_fetch_timeout, and a batch of writes within
	 * remote_write_timeout, whatever the cluster sends (a node that
	 * answered just above the rate floor held the write thread, and the
	 * writes queued behind it, for as long as it liked). The readers share
	 * their nodes' backoffs, and the writers theirs: a node one of them
	 * found slow or down costs the others nothing while its backoff lasts. */
	for (uint32_t k = 0; k < t->g4->nreaders + G4_WRITERS; k++) {
		int wr = k >= t->g4->nreaders;
		struct kv_rc *rc = wr ? cl->wr[k - t->g4->nreaders] : cl->rd[k];
		struct kv_rc_limits l;

		kv_rc_get_limits(rc, &l);
		l.min_rate = (size_t)c->remote_min_rate;
		l.call_ms = (unsigned)(wr ? c->remote_write_timeout_ms
					  : c->remote_fetch_timeout_ms);
		if ((r = kv_rc_set_limits(rc, &l)) < 0) {
			snprintf(err, errlen, "remote_min_rate, remote_fetch_timeout, "
				 "remote_write_timeout: out of range");
			return r;
		}
		if (k && k != t->g4->nreaders &&
		    (r = kv_rc_share_backoff(rc, wr ? cl->wr[0] : cl->rd[0])) < 0) {
			snprintf(err, errlen, "G4: out of memory");
			return r;
		}
	}
	return 0;
}

/* t->g2_dropping: a copy only G2 holds is about to go. */
static void g2_dropping(struct kv_tiers *t, struct tblock *tb)
{
	tier_remote_put(t, tb, KV_G4W_WRITEBACK);
}

/* Names a G4 thread (top -H, perf's comm, /proc/PID/task/TID/comm) so
 * that its CPU time can be told from the loop's and the copy thread's
 * (bench/kvg4rate's CPU table). Best effort: a name is only a label. */
static void thread_name(struct kv_worker *w, const char *name)
{
	(void)pthread_setname_np(w->thread, name);
}

int tier_remote_open(struct kv_tiers *t, char *err, size_t errlen)
{
	const struct kv_tiers_config *c = &t->cfg;
	struct kv_g4 *g;
	int r;

	if (!c->remote_seeds[0])
		return 0;
	if (!(g = calloc(1, sizeof(*g))))
		return -ENOMEM;
	g->ttl_s = (unsigned)(c->remote_ttl_ms / 1000);
	g->max_inflight = c->remote_max_inflight;
	g->tokens = c->remote_write_rate;
	g->tokens_ms = kv_mono_ms();
	g->seal_tail = &g->seal_q;
	g->nreaders = c->remote_readers ? c->remote_readers : 2;
	if (g->nreaders > G4_READERS_MAX)
		g->nreaders = G4_READERS_MAX;
	g->mode = !strcmp(c->remote_write, "off")      ? KV_G4W_OFF
		  : !strcmp(c->remote_write, "demote") ? KV_G4W_DEMOTE
						       : KV_G4W_WRITEBACK;
	t->g4 = g;
	t->g2_dropping = g2_dropping;
	/* Client 0 is the daemon's; then one per namespace with a user of
	 * its own. */
	g->ncl = 1;
	if ((r = client_open(t, 0, "", c->remote_user, c->remote_password_file, err, errlen)) < 0)
		return r;
	for (unsigned i = 0; i < c->nremote_users; i++, g->ncl++)
		if ((r = client_open(t, g->ncl, c->remote_users[i].ns, c->remote_users[i].user,
				     c->remote_users[i].password_file, err, errlen)) < 0)
			return r;
	for (unsigned i = 0; i < c->nremote_keys && i < 64; i++, g->nkeys++) {
		char e[384];

		snprintf(g->keys[i].ns, sizeof(g->keys[i].ns), "%s", c->remote_keys[i].ns);
		if ((r = kv_g4mac_load(c->remote_keys[i].key_file, g->keys[i].key, e, sizeof(e))) < 0) {
			snprintf(err, errlen, "[namespace %s] %s", c->remote_keys[i].ns, e);
			return r;
		}
	}
	/* Without G3 the threads' completions need an eventfd of their own
	 * (the loop watches kv_tiers_disk_fd()), and the tier's worker, which
	 * seals G4 writes made from G2, is started here. */
	if (!t->lv[L3].on) {
		t->disk.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (t->disk.efd < 0 || (r = kv_worker_start(&t->wk, t->disk.efd)) < 0) {
			r = t->disk.efd < 0 ? -errno : r;
			snprintf(err, errlen, "G4: eventfd or worker: %s", strerror(-r));
			return r;
		}
		thread_name(&t->wk, "kvd-g4sum");
	}
	for (uint32_t k = 0; k < g->nreaders; k++) {
		char name[16];

		if ((r = kv_worker_start(&g->rw[k], t->disk.efd)) < 0) {
			snprintf(err, errlen, "G4: cannot start its threads: %s", strerror(-r));
			return r;
		}
		snprintf(name, sizeof(name), "kvd-g4read%u", (unsigned)k);
		thread_name(&g->rw[k], name);
	}
	for (uint32_t k = 0; k < G4_WRITERS; k++) {
		char name[16];

		if ((r = kv_worker_start(&g->ww[k], t->disk.efd)) < 0) {
			snprintf(err, errlen, "G4: cannot start its threads: %s", strerror(-r));
			return r;
		}
		snprintf(name, sizeof(name), "kvd-g4write%u", (unsigned)k);
		thread_name(&g->ww[k], name);
	}
	kv_info("G4: Redis Cluster at %s, keys %s:*, ttl %us, %u namespace%s with a user of its "
		"own, %u with authenticated values, %u readers, reads within %llu ms, writes within "
		"%llu ms, nodes at %llu bytes/s at least", c->remote_seeds, c->remote_prefix,
		g->ttl_s, g->ncl - 1, g->ncl == 2 ? "" : "s", g->nkeys, g->nreaders,
		(unsigned long long)c->remote_fetch_timeout_ms,
		(unsigned long long)c->remote_write_timeout_ms,
		(unsigned long long)c->remote_min_rate);
	/* remote_auth = off (issue 36): said loudly, once, naming each. */
	if (c->remote_unauth[0])
		kv_warn("G4: namespace%s %s read%s values from the shared cluster at %s WITHOUT "
			"authentication (remote_auth = off, no remote_key_file): whoever can write "
			"their keys there (a cluster user, a compromised node) can feed their engines "
			"any KV; give each a remote_key_file", strchr(c->remote_unauth, ',') ? "s" : "",
			c->remote_unauth, strchr(c->remote_unauth, ',') ? "" : "s", c->remote_seeds);
	return 0;
}

void tier_remote_close(struct kv_tiers *t)
{
	struct kv_g4 *g = t->g4;

	if (!g)
		return;
	/* Whatever the cluster does, the threads end now (issue 36: a node
	 * that dripped held the read thread, so the daemon's exit, past any
	 * drain timeout): every client's call under way returns at once, with
	 * what is unanswered an error (a read is a miss, a write is counted
	 * as failed), and what is queued runs as at once; their done()s see
	 * t->stopping and make nothing new. */
	for (uint32_t i = 0; i < g->ncl; i++) {
		for (uint32_t k = 0; k < g->nreaders; k++)
			kv_rc_cancel(g->cl[i].rd[k]);
		for (uint32_t k = 0; k < G4_WRITERS; k++)
			kv_rc_cancel(g->cl[i].wr[k]);
	}
	for (uint32_t k = 0; k < g->nreaders; k++)
		kv_worker_stop(&g->rw[k]);
	for (uint32_t k = 0; k < G4_WRITERS; k++)
		kv_worker_stop(&g->ww[k]);
	for (uint32_t ns = 0; ns <= KV_MAX_NS; ns++)
		while (g->fq[ns]) {
			struct g4_fetch *f = g->fq[ns];

			g->fq[ns] = f->next;
			if (f->owner)
				f->owner->ahead = NULL;
			tier_wake_all(&f->waiters);
			kv_pool_put(f->pool);
			free(f);
		}
	explicit_bzero(g->keys, sizeof(g->keys));
	tier_g4_seal_drop(t);
	for (uint32_t i = 0; i < g->ncl; i++) {
		struct g4_client *cl = &g->cl[i];

		while (cl->pending) {
			struct g4_write *w = cl->pending;

			cl->pending = w->next;
			tier_g4_write_free(t, w);   /* its held G2 slot, if any, released */
		}
		for (uint32_t k = 0; k < g->nreaders; k++)
			kv_rc_free(cl->rd[k]);
		for (uint32_t k = 0; k < G4_WRITERS; k++) {
			kv_rc_free(cl->wr[k]);
			free(cl->wj[k]);
		}
	}
	for (unsigned i = 0; i < WPOOL_CLASSES; i++)
		tier_g4_wclass_drop(g, &g->wpool[i]);
	tier_g4_wfree_drop(g);
	free(g);
	t->g4 = NULL;
	t->g2_dropping = NULL;
}

void tier_remote_reap(struct kv_tiers *t)
{
	if (t->g4) {
		for (uint32_t k = 0; k < t->g4->nreaders; k++)
			kv_worker_reap(&t->g4->rw[k]);
		for (uint32_t k = 0; k < G4_WRITERS; k++)
			kv_worker_reap(&t->g4->ww[k]);
	}
}

int kv_tiers_remote_stats(const struct kv_tiers *t, struct kv_g4_stats *st)
{
	if (!t->g4)
		return 0;
	*st = t->g4->st;
	st->inflight_bytes = t->g4->inflight;
	st->redirects = st->reconnects = st->connect_failures = 0;
	for (uint32_t i = 0; i < t->g4->ncl; i++) {
		const struct g4_client *c = &t->g4->cl[i];

		for (uint32_t k = 0; k < G4_WRITERS; k++) {
			st->redirects += c->wr_st[k].redirects_moved + c->wr_st[k].redirects_ask;
			st->reconnects += c->wr_st[k].reconnects;
			st->connect_failures += c->wr_st[k].connect_failures;
		}
		for (uint32_t k = 0; k < t->g4->nreaders; k++) {
			st->redirects += c->rd_st[k].redirects_moved + c->rd_st[k].redirects_ask;
			st->reconnects += c->rd_st[k].reconnects;
			st->connect_failures += c->rd_st[k].connect_failures;
		}
	}
	return 1;
}
