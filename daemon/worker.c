/* The worker thread; see worker.h. */
#include "worker.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

static void finished(struct kv_worker *w, struct kv_job *j, int has_done)
{
	uint64_t one = 1;
	/* With one_wake, a list that was not empty has had its write since
	 * the last kv_worker_reap_clear(), which takes the whole list and
	 * clears efd under this lock. */
	int wake = has_done && (!w->one_wake || !w->done);

	if (has_done) {
		j->next = NULL;
		*w->done_tail = j;
		w->done_tail = &j->next;
	}
	w->finished++;
	if (wake && write(w->efd, &one, sizeof(one)) < 0) {
		/* EAGAIN: the counter is full, so the loop will wake anyway. */
	}
}

static void *worker_main(void *arg)
{
	struct kv_worker *w = arg;

	pthread_mutex_lock(&w->lock);
	for (;;) {
		struct kv_job *j = w->todo;
		int has_done;

		if (!j) {
			if (w->stop)
				break;
			pthread_cond_wait(&w->wake, &w->lock);
			continue;
		}
		w->todo = j->next;
		if (!w->todo)
			w->todo_tail = &w->todo;
		w->busy = 1;
		has_done = j->done != NULL;  /* without done(), run() may free j */
		pthread_mutex_unlock(&w->lock);
		j->run(j);
		pthread_mutex_lock(&w->lock);
		w->busy = 0;
		finished(w, j, has_done);
		pthread_cond_broadcast(&w->wake);
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

int kv_worker_start(struct kv_worker *w, int efd)
{
	sigset_t all, old;
	int r;

	memset(w, 0, sizeof(*w));
	w->todo_tail = &w->todo;
	w->done_tail = &w->done;
	w->efd = efd;
	if ((r = pthread_mutex_init(&w->lock, NULL)) != 0)
		return -r;
	if ((r = pthread_cond_init(&w->wake, NULL)) != 0) {
		pthread_mutex_destroy(&w->lock);
		return -r;
	}
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	r = pthread_create(&w->thread, NULL, worker_main, w);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r != 0) {
		pthread_cond_destroy(&w->wake);
		pthread_mutex_destroy(&w->lock);
		return -r;
	}
	w->started = 1;
	return 0;
}

void kv_worker_submit(struct kv_worker *w, struct kv_job *j)
{
	j->next = NULL;
	pthread_mutex_lock(&w->lock);
	*w->todo_tail = j;
	w->todo_tail = &j->next;
	w->submitted++;
	pthread_mutex_unlock(&w->lock);
	pthread_cond_broadcast(&w->wake);
}

static unsigned reap(struct kv_worker *w, int clear)
{
	struct kv_job *j;
	unsigned n = 0;
	uint64_t v;

	if (!w->started)
		return 0;
	pthread_mutex_lock(&w->lock);
	/* The thread writes efd under the lock: cleared here, it is readable
	 * again only for a job this call does not take. */
	if (clear && read(w->efd, &v, sizeof(v)) < 0) {
		/* EAGAIN: it was clear */
	}
	j = w->done;
	w->done = NULL;
	w->done_tail = &w->done;
	pthread_mutex_unlock(&w->lock);
	while (j) {
		struct kv_job *next = j->next;

		j->done(j);  /* may submit more, or free j */
		j = next;
		n++;
	}
	return n;
}

unsigned kv_worker_reap(struct kv_worker *w)
{
	return reap(w, 0);
}

unsigned kv_worker_reap_clear(struct kv_worker *w)
{
	return reap(w, 1);
}

void kv_worker_wait_idle(struct kv_worker *w)
{
	if (!w->started)
		return;
	pthread_mutex_lock(&w->lock);
	while (w->todo || w->busy)
		pthread_cond_wait(&w->wake, &w->lock);
	pthread_mutex_unlock(&w->lock);
}

void kv_worker_stop(struct kv_worker *w)
{
	if (!w->started)
		return;
	pthread_mutex_lock(&w->lock);
	w->stop = 1;
	pthread_mutex_unlock(&w->lock);
	pthread_cond_broadcast(&w->wake);
	pthread_join(w->thread, NULL);
	/* The done()s of the last jobs; they may submit nothing more. */
	kv_worker_reap(w);
	w->started = 0;
	pthread_cond_destroy(&w->wake);
	pthread_mutex_destroy(&w->lock);
}
