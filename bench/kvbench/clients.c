/* kvbench section e: 1, 4 and 16 client processes (fork), each its own
 * connection and pool registration, looping 1-block cycles for a fixed time
 * after a common start; the aggregate rate and the latency of a cycle. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvbench.h"

#define MAX_CLIENTS 16
#define CLIENT_SAMPLES (1u << 20)     /* latencies kept per client process */

struct client_shm {
	uint64_t start, end, ops;
	uint32_t nsamp;
	int failed;
	uint32_t lat[CLIENT_SAMPLES];  /* ns, capped at 4.29 s */
};

static void client_proc(struct client_shm *sh, int ready_fd, int go_fd, double secs)
{
	struct bench_conn bc;
	uint64_t t[4], end;
	char ch = 0;
	int i;

	rng_seed();
	bc_open(&bc, 1, "kvbench-client", true);
	for (i = 0; i < 200; i++)
		cycle(&bc, 1, t);
	if (write(ready_fd, &ch, 1) != 1 || read(go_fd, &ch, 1) != 1)
		_exit(1);
	sh->start = now_ns();
	end = sh->start + (uint64_t)(secs * 1e9);
	do {
		cycle(&bc, 1, t);
		if (sh->nsamp < CLIENT_SAMPLES) {
			uint64_t d = t[3] - t[0];

			sh->lat[sh->nsamp++] = d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
		}
		sh->ops++;
	} while (t[3] < end);
	sh->end = t[3];
	bc_close(&bc);
	_exit(0);
}

void section_clients(struct bench_conn *bc, int nclients)
{
	size_t shm_bytes = sizeof(struct client_shm) * (size_t)nclients;
	struct client_shm *sh;
	int ready[2], go[2], i, st;
	pid_t pids[MAX_CLIENTS];
	uint64_t start = UINT64_MAX, end = 0, ops = 0;
	struct samples s = { 0 };
	struct snap s0, s1;
	struct row *r;
	char name[48], buf[MAX_CLIENTS];

	if (nclients < 1 || nclients > MAX_CLIENTS)
		die("internal: %d clients", nclients);
	sh = mmap(NULL, shm_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		die("mmap: %s", strerror(errno));
	if (pipe(ready) < 0 || pipe(go) < 0)
		die("pipe: %s", strerror(errno));
	fflush(NULL);
	for (i = 0; i < nclients; i++) {
		pids[i] = fork();
		if (pids[i] < 0)
			die("fork: %s", strerror(errno));
		if (pids[i] == 0) {
			close(ready[0]);
			close(go[1]);
			client_proc(&sh[i], ready[1], go[0], D.clients);
		}
	}
	close(ready[1]);
	close(go[0]);
	for (i = 0; i < nclients; i++)
		if (read(ready[0], buf, 1) != 1)
			die("a client process failed to start");
	s0 = snap_take(bc);
	memset(buf, 'g', sizeof(buf));
	if (write(go[1], buf, (unsigned)nclients) != nclients)
		die("write: %s", strerror(errno));
	for (i = 0; i < nclients; i++) {
		if (waitpid(pids[i], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
			die("client process %d failed", (int)pids[i]);
	}
	s1 = snap_take(bc);
	close(ready[0]);
	close(go[1]);
	for (i = 0; i < nclients; i++) {
		uint32_t j;

		start = sh[i].start < start ? sh[i].start : start;
		end = sh[i].end > end ? sh[i].end : end;
		ops += sh[i].ops;
		for (j = 0; j < sh[i].nsamp; j++)
			sample_add(&s, sh[i].lat[j]);
	}
	snprintf(name, sizeof(name), "%d client%s: alloc+seal+release 1", nclients,
		 nclients > 1 ? "s" : "");
	r = add_row('e', name);
	row_from(r, &s, 1);
	r->ops = end > start ? (double)ops / ((double)(end - start) / 1e9) : 0;
	r->ops_unit = "cycles/s";
	print_row(r);
	r->evicted = evicted_note(s0, s1);
	sample_free(&s);
	munmap(sh, shm_bytes);
}
