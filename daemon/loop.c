#include "loop.h"

#include <errno.h>
#include <string.h>

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

/* Calls the watch of every completion in the ring, then the idle hook;
 * returns how many. */
static unsigned loop_reap(struct kv_loop *l)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;

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
