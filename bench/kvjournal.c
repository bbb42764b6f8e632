/* kvjournal: what compacting the G3 index journal costs the event loop.
 * Before issue 15 the loop rewrote the whole file at once (write, fsync,
 * rename: kv_journal_rewrite(), still what a start and a clean stop do);
 * now it hands the worker thread a chunk of at most 2,048 records per turn
 * (tier/adopt.c) and the thread writes, fsyncs and renames. For N live
 * records this prints the time of the whole rewrite (wall and CPU: the
 * fsync waits without CPU), the CPU time of the longest chunk (the loop's
 * share; CPU time, as a shared machine preempts), and how long the worker
 * took in all. Figures, never
 * assertions.
 *
 *   kvjournal DIR RECORDS...     (DIR: where the journal file goes) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "journal.h"
#include "worker.h"

#define CHUNK 2048

static uint64_t clock_ns(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t now_ns(void)
{
	return clock_ns(CLOCK_MONOTONIC);
}

/* This thread's CPU time: what the work costs without the time another
 * process had the CPU (a shared machine preempts). */
static uint64_t cpu_ns(void)
{
	return clock_ns(CLOCK_THREAD_CPUTIME_ID);
}

static void nothing(void *ctx, const struct kv_jrec *r)
{
	(void)ctx;
	(void)r;
}

static uint64_t left;

static int next(void *ctx, struct kv_jrec *r)
{
	(void)ctx;
	if (!left)
		return 0;
	memset(r, 0, sizeof(*r));
	r->type = KV_J_SLOT;
	r->page = (uint32_t)(left / 64);
	r->slot = (uint16_t)(left % 64);
	memcpy(r->hash, &left, sizeof(left));
	left--;
	return 1;
}

int main(int argc, char **argv)
{
	char path[512], err[256];
	int efd[2];

	if (argc < 3) {
		fputs("usage: kvjournal DIR RECORDS...\n", stderr);
		return 2;
	}
	snprintf(path, sizeof(path), "%s/kvjournal.idx", argv[1]);
	if (pipe(efd) < 0)
		return 1;
	for (int a = 2; a < argc; a++) {
		uint64_t n = strtoull(argv[a], NULL, 0), t0, c0, whole, whole_cpu, worst = 0, total;
		struct kv_journal j;
		struct kv_worker w;
		struct kv_jrec r;

		unlink(path);
		if (kv_journal_open(&j, path, 4096, 1ull << 40, nothing, NULL, err, sizeof(err)) < 0) {
			fprintf(stderr, "kvjournal: %s\n", err);
			return 1;
		}
		left = n;
		t0 = now_ns();
		c0 = cpu_ns();
		if (kv_journal_rewrite(&j, next, NULL) < 0) {
			fputs("kvjournal: rewrite failed\n", stderr);
			return 1;
		}
		whole = now_ns() - t0;
		whole_cpu = cpu_ns() - c0;

		if (kv_worker_start(&w, efd[1]) < 0)
			return 1;
		kv_journal_attach(&j, &w);
		left = n;
		t0 = now_ns();
		kv_journal_compact_begin(&j);
		while (left) {
			uint64_t c;

			c0 = cpu_ns();
			for (int k = 0; k < CHUNK && next(NULL, &r); k++)
				kv_journal_compact_add(&j, &r);
			kv_journal_compact_push(&j);
			c = cpu_ns() - c0;
			worst = c > worst ? c : worst;
		}
		kv_journal_compact_end(&j);
		kv_worker_wait_idle(&w);
		total = now_ns() - t0;
		kv_journal_detach(&j);
		kv_worker_stop(&w);
		kv_journal_close(&j);
		printf("kvjournal: %llu records (%.1f MiB): whole rewrite on the loop %.1f ms (%.1f ms "
		       "CPU); in chunks: the longest chunk %.1f us CPU on the loop, the worker done "
		       "after %.1f ms\n",
		       (unsigned long long)n, n * 64.0 / (1 << 20), whole / 1e6, whole_cpu / 1e6,
		       worst / 1e3, total / 1e6);
	}
	unlink(path);
	return 0;
}
