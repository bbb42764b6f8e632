/* Sessions; see session.h. */
#include "session.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "budget.h"
#include "kvassert.h"
#include "kvtext.h"
#include "log.h"

int kv_session_pin(struct kv_session *ss, struct kv_block *b)
{
	if (ss->npins == ss->pins_cap) {
		uint32_t cap = ss->pins_cap ? 2 * ss->pins_cap : 16;
		void *np = realloc(ss->pins, cap * sizeof(*ss->pins));

		if (!np)
			return -ENOMEM;
		ss->pins = np;
		ss->pins_cap = cap;
	}
	/* A block with the most references it may have is not pinned: being
	 * held, it is not demoted either. */
	if (kv_block_ref(b) == 0)
		ss->pins[ss->npins++] = b;
	return 0;
}

/* kv_waiter.hold: a promoted block stays pinned until the parked request
 * has run again (its lookup drops the pins it started with). Out of memory
 * it is not pinned: the request may then promote it once more. */
static void session_hold(struct kv_waiter *w, struct kv_block *b)
{
	(void)kv_session_pin(kv_container_of(w, struct kv_session, waiter), b);
}

void kv_session_open(struct kv_daemon *d, struct kv_session *ss, const struct ucred *cred,
		     int admin)
{
	ss->d = d;
	ss->cred = *cred;
	ss->admin = admin;
	ss->id = ++d->next_session;
	ss->connected_ms = kv_now_ms();
	kv_sessrefs_init(&ss->refs, ss->id, d->pools);
	kv_list_init(&ss->waiter.link);
	ss->waiter.hold = session_hold;
	kv_swap_owner_init(&ss->swaps);
	kv_list_push_back(&d->sessions, &ss->link);
	d->nsessions++;
}

void kv_session_peer_groups(struct kv_session *ss, int fd)
{
	uint32_t first[KV_SESSION_GROUPS], *g = NULL;
	socklen_t len = sizeof(first);
	int r;

	_Static_assert(sizeof(gid_t) == sizeof(uint32_t), "SO_PEERGROUPS gives gid_t");
	ss->ngroups = -1;
	r = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, first, &len);
	/* More than a first guess (users of a directory service are often in
	 * hundreds): ERANGE, and len says how many. They were fixed when the
	 * peer connected, so the second call gets them all. */
	if (r < 0 && errno == ERANGE && len > sizeof(first)) {
		if (!(g = malloc(len)))
			goto fail;
		r = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &len);
	} else if (r == 0 && len) {
		if (!(g = malloc(len)))
			goto fail;
		memcpy(g, first, len);
	}
	if (r < 0)
		goto fail;
	ss->groups = g;
	ss->ngroups = (int)(len / sizeof(gid_t));
	return;
fail:
	/* A group that grants a namespace is not seen: its Hello is refused. */
	kv_warn("session %llu: the peer's supplementary groups: %s; only its primary gid counts",
		(unsigned long long)ss->id, strerror(errno));
	free(g);
}

/* n fds more (negative: fewer) out to ss: the daemon's count and its uid's. */
static void fds_count(struct kv_session *ss, int64_t n)
{
	kv_assert(n >= 0 || (uint64_t)-n <= ss->d->fds_out);
	ss->d->fds_out = (uint64_t)((int64_t)ss->d->fds_out + n);
	if (ss->bu) {
		kv_assert(n >= 0 || (uint64_t)-n <= ss->bu->fds);
		ss->bu->fds = (uint64_t)((int64_t)ss->bu->fds + n);
	}
}

void kv_session_release(struct kv_session *ss)
{
	struct kv_daemon *d = ss->d;
	uint32_t dev, w;

	if (!kv_list_linked(&ss->link))
		return;
	/* Nothing a worker held leaks; nothing it sealed is lost. */
	kv_sessrefs_release(&ss->refs);
	kv_sessrefs_fini(&ss->refs);
	if (kv_list_linked(&ss->waiter.link))
		kv_list_del(&ss->waiter.link);
	kv_tiers_waiter_gone(d->tiers, &ss->waiter, ss->ns);
	ss->lk_done = 0;
	while (ss->npins)
		kv_block_unref(ss->pins[--ss->npins]);
	free(ss->pins);
	ss->pins = NULL;
	free(ss->lk_tier);
	ss->lk_tier = NULL;
	ss->lk_tier_n = ss->lk_tier_cap = 0;
	kv_tiers_owner_gone(d->tiers, &ss->swaps);
	for (w = 0; w < KV_MAX_POOLS / 64; w++)
		while (ss->pools[w]) {
			uint32_t id = w * 64 + (uint32_t)__builtin_ctzll(ss->pools[w]);

			ss->pools[w] &= ss->pools[w] - 1;
			kv_pool_put(kv_pool_get(d->pools, id));
		}
	/* What was sent and not read is the peer's to drop with its socket. */
	for (size_t i = 0; i < ss->nfds; i++)
		close(ss->fds[i]);
	fds_count(ss, -(int64_t)(ss->nfds + ss->fds_unread));
	ss->nfds = 0;
	ss->fds_unread = 0;
	free(ss->fds);
	ss->fds = NULL;
	ss->fds_cap = 0;
	free(ss->groups);
	ss->groups = NULL;
	ss->ngroups = -1;
	for (dev = 0; dev < KV_MAX_DEVICES; dev++)
		free(ss->seg_sent[dev]);
	memset(ss->seg_sent, 0, sizeof(ss->seg_sent));
	if (ss->ns)
		kv_session_leave_ns(ss);
	kv_list_del(&ss->link);
	kv_assert(d->nsessions > 0);
	d->nsessions--;
	/* The pools and namespace nothing else used go now. */
	kv_daemon_collect(d);
}

void kv_session_set_name(struct kv_session *ss, const char *name)
{
	kv_text_clean(ss->name, sizeof(ss->name) - 1, name);
}

void kv_session_keep_pool(struct kv_session *ss, struct kv_pool *p)
{
	uint64_t bit = 1ull << (p->id % 64);

	if (ss->pools[p->id / 64] & bit) {
		kv_pool_put(p);
		return;
	}
	ss->pools[p->id / 64] |= bit;
}

int kv_session_enter_ns(struct kv_session *ss, const char *name)
{
	struct kv_ns_table *t = kv_pools_nstab(ss->d->pools);
	int id;

	kv_assert(!ss->ns);
	id = kv_ns_open(t, name);
	if (id < 0)
		return id;
	ss->ns = (uint32_t)id;
	kv_ns_get(t, ss->ns)->sessions++;
	return 0;
}

void kv_session_leave_ns(struct kv_session *ss)
{
	struct kv_ns_table *t = kv_pools_nstab(ss->d->pools);

	kv_assert(ss->ns);
	kv_ns_get(t, ss->ns)->sessions--;
	kv_pools_ns_put(ss->d->pools, ss->ns);
	ss->ns = 0;
}

int kv_session_has_segment(const struct kv_session *ss, uint32_t dev, uint32_t seg)
{
	const struct kv_backend *be = ss->d->be;

	kv_assert(dev < be->devices && seg < be->segments[dev]);
	return ss->seg_sent[dev] && ss->seg_sent[dev][seg] == be->epoch[dev][seg];
}

int kv_session_want_segment(struct kv_session *ss, uint32_t dev, uint32_t seg, uint32_t *old)
{
	struct kv_backend *be = ss->d->be;
	uint32_t **sent = &ss->seg_sent[dev];
	int fd;

	kv_assert(!kv_session_has_segment(ss, dev, seg));
	if (!*sent) {
		*sent = calloc(be->segments[dev], sizeof(uint32_t));
		if (!*sent)
			return -ENOMEM;
	}
	if (ss->nfds == ss->fds_cap) {
		size_t cap = ss->fds_cap ? ss->fds_cap * 2 : 16;
		int *p = realloc(ss->fds, cap * sizeof(int));

		if (!p)
			return -ENOMEM;
		ss->fds = p;
		ss->fds_cap = cap;
	}
	/* A dup: the backend closes its fd when it recreates the segment, and
	 * the number could then name anything by the time we send it. */
	fd = be->ops->segment_fd(be, dev, seg);
	if (fd < 0)
		return fd;
	fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (fd < 0)
		return -errno;
	ss->fds[ss->nfds++] = fd;
	fds_count(ss, 1);
	*old = (*sent)[seg];
	(*sent)[seg] = be->epoch[dev][seg];
	return 0;
}

void kv_session_unwant_segment(struct kv_session *ss, uint32_t dev, uint32_t seg, uint32_t old)
{
	kv_assert(ss->nfds > 0 && kv_session_has_segment(ss, dev, seg));
	close(ss->fds[--ss->nfds]);
	fds_count(ss, -1);
	ss->seg_sent[dev][seg] = old;
}

void kv_session_fds_sent(struct kv_session *ss, size_t n)
{
	kv_assert(n <= ss->nfds);
	if (n == 0)
		return;
	for (size_t i = 0; i < n; i++)
		close(ss->fds[i]);
	memmove(ss->fds, ss->fds + n, (ss->nfds - n) * sizeof(int));
	ss->nfds -= n;
	ss->fds_unread += (uint32_t)n;
}

void kv_session_fds_read(struct kv_session *ss)
{
	fds_count(ss, -(int64_t)ss->fds_unread);
	ss->fds_unread = 0;
}

int kv_session_is_admin(const struct kv_session *ss)
{
	return ss->admin || (ss->d->cfg.worker_socket_admin &&
			     (ss->cred.uid == 0 || ss->cred.uid == geteuid()));
}

const char *kv_session_ns_name(const struct kv_session *ss)
{
	return ss->ns ? kv_pools_ns_name(ss->d->pools, ss->ns) : NULL;
}

uint32_t kv_sessions_clients(const struct kv_daemon *d)
{
	const struct kv_list *pos;
	uint32_t n = 0;

	kv_list_for_each(pos, &d->sessions) {
		const struct kv_session *ss = kv_container_of(pos, struct kv_session, link);

		if (!ss->admin || ss->refs.refs)
			n++;
	}
	return n;
}

uint64_t kv_sessions_refs(const struct kv_daemon *d)
{
	const struct kv_list *pos;
	uint64_t refs = 0;

	kv_list_for_each(pos, &d->sessions)
		refs += kv_container_of(pos, struct kv_session, link)->refs.refs;
	return refs;
}
