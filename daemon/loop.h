/* The event loop: one io_uring, one thread.
 *
 * A watch is an object the caller embeds; every completion for it calls
 * w->cb with the result and whether more completions will follow (a
 * multishot poll keeps firing until cancelled or failed). A watch must stay
 * allocated until its last completion (more == 0) has been delivered: to
 * stop a watch, kv_loop_cancel() it and free it from that last callback.
 *
 * Sockets are driven by readiness (poll) here, timers (kv_loop_timeout) by
 * the same ring; G3's disk I/O has a ring of its own (disk.h). */
#ifndef KV_LOOP_H
#define KV_LOOP_H

#include <liburing.h>
#include <stdint.h>

#include "hist.h"

struct kv_loop_watch;
typedef void (*kv_loop_cb)(struct kv_loop_watch *w, int res, int more);

struct kv_loop_watch {
	kv_loop_cb cb;
	int armed;   /* completions still to come */
};

struct kv_loop {
	struct io_uring ring;
	int stop;
	/* Called after each round of completions, before the loop sleeps
	 * again (KV events send their batch there); NULL: nothing. */
	void (*idle)(void *ctx);
	void *idle_ctx;
	/* How long each turn took, from the completions' arrival to the end of
	 * the idle hook: what a request arriving just then could wait
	 * (kvcached_loop_lag_seconds). A turn longer than lag_warn_ns (0:
	 * never) is logged, at most one line every 10 s. */
	struct kv_hist lag;
	uint64_t lag_warn_ns;
	uint64_t lag_next_log_ns, lag_held, lag_max_ns;
};

/* Returns 0 or -errno (io_uring not available, ...). */
int kv_loop_init(struct kv_loop *l, unsigned entries);
void kv_loop_fini(struct kv_loop *l);

/* Arms a poll of fd for events (POLLIN, POLLOUT); multishot keeps it armed.
 * res of a completion is the revents mask or -errno. Returns 0 or -errno. */
int kv_loop_poll(struct kv_loop *l, struct kv_loop_watch *w, int fd, unsigned events,
		 int multishot);

/* Fires w once after ns nanoseconds (res -ETIME). Returns 0 or -errno. */
int kv_loop_timeout(struct kv_loop *l, struct kv_loop_watch *w, uint64_t ns);

/* Cancels w's poll or timeout; its last completion follows. Returns 0 or -errno. */
int kv_loop_cancel(struct kv_loop *l, struct kv_loop_watch *w);

/* Runs until kv_loop_stop(). Returns 0 or -errno on a ring failure. */
int kv_loop_run(struct kv_loop *l);
/* One turn: submits what is queued, waits at most timeout_ms for a
 * completion and runs every one that has arrived (tests and fuzzers drive
 * the loop this way). Returns how many ran, or -errno. */
int kv_loop_run_once(struct kv_loop *l, unsigned timeout_ms);

static inline void kv_loop_stop(struct kv_loop *l)
{
	l->stop = 1;
}

#endif
