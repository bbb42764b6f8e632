#include "loop.h"

#include <errno.h>
#include <string.h>

#include "log.h"

/* user_data of completions nobody waits for (cancel requests). */
#define LOOP_IGNORE 0

int kv_loop_init(struct kv_loop *l, unsigned entries)
{
	memset(l, 0, sizeof(*l));
	return io_uring_queue_init(entries, &l->ring, 0);
}

void kv_loop_fini(struct kv_loop *l)
{
	io_uring_queue_exit(&l->ring);
}

static struct io_uring_sqe *get_sqe(struct kv_loop *l)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&l->ring);

	if (!sqe) {
		io_uring_submit(&l->ring);
		sqe = io_uring_get_sqe(&l->ring);
	}
	return sqe;
}

int kv_loop_poll(struct kv_loop *l, struct kv_loop_watch *w, int fd, unsigned events,
		 int multishot)
{
	struct io_uring_sqe *sqe = get_sqe(l);

	if (!sqe)
		return -EBUSY;
	if (multishot)
		io_uring_prep_poll_multishot(sqe, fd, events);
	else
		io_uring_prep_poll_add(sqe, fd, events);
	io_uring_sqe_set_data(sqe, w);
	w->armed++;
	return 0;
}

int kv_loop_timeout(struct kv_loop *l, struct kv_loop_watch *w, uint64_t ns)
{
	struct io_uring_sqe *sqe = get_sqe(l);
	/* The kernel copies the timespec at submission; submit right away so
	 * that a stack variable is fine. */
	struct __kernel_timespec ts = { .tv_sec = (long long)(ns / 1000000000u),
					.tv_nsec = (long long)(ns % 1000000000u) };

	if (!sqe)
		return -EBUSY;
	io_uring_prep_timeout(sqe, &ts, 0, 0);
	io_uring_sqe_set_data(sqe, w);
	w->armed++;
	io_uring_submit(&l->ring);
	return 0;
}

int kv_loop_cancel(struct kv_loop *l, struct kv_loop_watch *w)
{
	struct io_uring_sqe *sqe = get_sqe(l);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_cancel(sqe, w, IORING_ASYNC_CANCEL_ALL);
	io_uring_sqe_set_data64(sqe, LOOP_IGNORE);
	return 0;
}

/* Counts a turn that began at t0 and ran n completions; logs a long one. */
static void loop_lag(struct kv_loop *l, uint64_t t0, unsigned n)
{
	uint64_t now = kv_hist_now_ns(), ns = now - t0;

	kv_hist_observe(&l->lag, ns);
	if (!l->lag_warn_ns || ns <= l->lag_warn_ns)
		return;
	if (ns > l->lag_max_ns)
		l->lag_max_ns = ns;
	if (now < l->lag_next_log_ns) {
		l->lag_held++;
		return;
	}
	kv_warn("event loop: one turn took %.1f ms (%u completions; loop_lag_warn %.1f ms); "
		"%llu more such turns since the last line, the longest %.1f ms",
		(double)ns / 1e6, n, (double)l->lag_warn_ns / 1e6, (unsigned long long)l->lag_held,
		(double)l->lag_max_ns / 1e6);
	l->lag_held = 0;
	l->lag_max_ns = 0;
	l->lag_next_log_ns = now + 10000000000ull;
}

/* Calls the watch of every completion in the ring, then the idle hook;
 * returns how many. */
static unsigned loop_reap(struct kv_loop *l)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;
	uint64_t t0 = kv_hist_now_ns();

	io_uring_for_each_cqe(&l->ring, head, cqe) {
		struct kv_loop_watch *w = io_uring_cqe_get_data(cqe);
		int more = !!(cqe->flags & IORING_CQE_F_MORE);

		n++;
		if (!w)
			continue;
		if (!more)
			w->armed--;
		/* Consume first: the callback may free w or queue more. */
		w->cb(w, cqe->res, more);
	}
	io_uring_cq_advance(&l->ring, n);
	if (l->idle)
		l->idle(l->idle_ctx);
	if (n)
		loop_lag(l, t0, n);
	return n;
}

int kv_loop_run(struct kv_loop *l)
{
	while (!l->stop) {
		int r = io_uring_submit_and_wait(&l->ring, 1);

		if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY)
			return r;
		loop_reap(l);
	}
	return 0;
}

int kv_loop_run_once(struct kv_loop *l, unsigned timeout_ms)
{
	struct __kernel_timespec ts = { .tv_sec = timeout_ms / 1000,
					.tv_nsec = (long long)(timeout_ms % 1000) * 1000000 };
	struct io_uring_cqe *cqe;
	int r;

	io_uring_submit(&l->ring);
	r = io_uring_wait_cqe_timeout(&l->ring, &cqe, &ts);
	if (r < 0 && r != -ETIME && r != -EINTR)
		return r;
	return (int)loop_reap(l);
}
