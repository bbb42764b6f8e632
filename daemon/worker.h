/* One thread for the work whose cost grows with a size: the event loop hands
 * it over instead of doing it between two requests (issue 15: the loop never
 * blocks on work that grows with size).
 *
 * Two have one: the disk tier (the CRC32C of a block written back to G3 and
 * of a block read from it, tier/writeback.c and tier/promote.c, and every
 * write to the G3 index journal, its compaction's fsync and rename included,
 * journal.c) and the host backend (the memcpys of its asynchronous copies,
 * backend_host.c). Jobs run one at a time in the order they were submitted,
 * so a journal's writes stay in order.
 *
 * A job's run() is called on the worker thread and may touch only what the
 * loop has handed over with it (a G2 slot that is busy, a buffer of journal
 * records); its done(), if any, is called later on the loop from
 * kv_worker_reap(), in submission order. The thread writes 1 to efd (an
 * eventfd the loop polls: the disk tier's, the backend's completion_fd) when
 * a job with a done() has finished. The thread starts with every signal blocked, so SIGTERM and
 * friends still reach the daemon's signalfd. */
#ifndef KV_WORKER_H
#define KV_WORKER_H

#include <pthread.h>
#include <stdint.h>

struct kv_job;
typedef void (*kv_job_fn)(struct kv_job *j);

struct kv_job {
	struct kv_job *next;
	kv_job_fn run;   /* on the worker thread; with no done(), may free j */
	kv_job_fn done;  /* on the loop, from kv_worker_reap(); NULL: none */
};

struct kv_worker {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	struct kv_job *todo, **todo_tail;  /* submitted, not run yet */
	struct kv_job *done, **done_tail;  /* run, done() not called yet */
	int efd;
	int started, stop, busy;
	/* Set after kv_worker_start() where efd is the worker's own and only
	 * kv_worker_reap_clear() clears it: the thread then writes efd only
	 * when its done list goes from empty to not empty, one wakeup of the
	 * loop (and one write) per run of finished jobs instead of one per job
	 * (issue 38: a lookup's promotions of 256 KiB blocks, one job each). */
	int one_wake;
	uint64_t submitted, finished;      /* counts (under lock) */
};

/* Starts the thread; efd is written when a job with a done() finishes.
 * Returns 0 or -errno. */
int kv_worker_start(struct kv_worker *w, int efd);
/* Runs what is queued, stops the thread and calls the done()s still due.
 * A worker never started: nothing. */
void kv_worker_stop(struct kv_worker *w);
void kv_worker_submit(struct kv_worker *w, struct kv_job *j);
/* Calls done() of every job that has finished, in order; returns how many. */
unsigned kv_worker_reap(struct kv_worker *w);
/* The same, clearing efd first (under the lock the thread writes it with):
 * for an efd of the worker's own, readable only while jobs wait. */
unsigned kv_worker_reap_clear(struct kv_worker *w);
/* Waits until every job submitted so far has run (the loop blocks: for
 * tests, shutdown and kvctl check only). */
void kv_worker_wait_idle(struct kv_worker *w);

#endif
