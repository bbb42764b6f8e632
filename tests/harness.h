/* Integration test harness: a real kvcached on a private socket, real worker
 * processes. The daemon binary comes from $KVCACHED_BIN (meson sets it). */
#ifndef KV_TEST_HARNESS_H
#define KV_TEST_HARNESS_H

#include <stdint.h>
#include <sys/types.h>

#include "check.h"
#include "kvc_internal.h"

struct kvt_daemon {
	pid_t pid;
	char dir[64];
	char sock[100];
};

/* Starts the daemon with the given extra arguments (NULL-terminated) on a
 * fresh socket, exports KVCACHED_SOCKET, and waits until it accepts (fails
 * the test if it exits first or does not accept within a minute). */
void kvt_start(struct kvt_daemon *d, ...) __attribute__((sentinel));
/* kill -9, then a new daemon on the same socket with the given extra
 * arguments (NULL-terminated); waits until it accepts. */
void kvt_restart(struct kvt_daemon *d, ...) __attribute__((sentinel));
/* SIGTERM, wait, require exit status 0, remove the socket dir. */
void kvt_stop(struct kvt_daemon *d);
/* Whether the daemon process is still alive. */
int kvt_alive(const struct kvt_daemon *d);

kvc_conn *kvt_connect(const char *ns);
/* Registers a test pool. */
int kvt_pool(kvc_conn *c, const char *name, uint64_t block_bytes);

/* Runs the daemon's invariant checker; prints problems. Returns their count. */
int kvt_check(void);
/* The daemon's stats for pool id (blocks by state). */
void kvt_pool_counts(int pool, uint64_t *free, uint64_t *writable, uint64_t *sealed,
		     uint64_t *cached);
/* Removes a disk tier's file and index journal (path, path.idx) and the
 * directory dir that held them. */
void kvt_rm_disk(const char *dir, const char *path);
/* Blocks by state, summed over every pool of the daemon. */
void kvt_blocks_total(uint64_t *writable, uint64_t *sealed, uint64_t *cached);
/* The daemon's numbers for one tier (0 G1, 1 G2, 2 G3); present 0 when the
 * daemon has no such tier. */
struct kvt_tier {
	int present;
	uint64_t capacity, used, blocks, dirty, hits, promotions, demotions, evictions;
	uint64_t io_errors, checksum_failures, inflight;
	uint64_t comp_bytes, comp_saved;   /* compressed copies (compress = fp8_e4m3) */
};
void kvt_tier(int tier, struct kvt_tier *t);
/* Waits until no tier copy or disk I/O is in flight (fails the test after
 * a minute). */
void kvt_tiers_settle(void);
/* Stats as a client of namespace ns sees them, G4's counters included
 * (rs->stats->remote; fails the test without them). The caller frees rs
 * with kvcached__response__free_unpacked(). */
Kvcached__Response *kvt_g4_stats(const char *ns);
/* G4 writes done by the node (Stats as a client of ns) once at least want
 * are done and nothing is queued or under way; fails the test on a write
 * error or a dropped write, or after a minute. */
uint64_t kvt_g4_settled(const char *ns, uint64_t want);
/* The value of the sample name (no labels) in the daemon's exposition
 * (Metrics, paged, on the worker socket as an admin: the test's uid is the
 * daemon's); fails the test when it is not there. */
long long kvt_metric(const char *name);
/* The offset in the disk tier's file disk of the slot that holds hash h
 * (-1: none), and its header's flags when flags is not NULL. */
off_t kvt_find_slot(const char *disk, const kvc_hash *h, uint32_t *flags);
/* Admin Evict of every pool's cached blocks out of tier (returns how many
 * it moved) and admin Flush (G2's dirty copies written to G3), each
 * checked; then each waits for the tiers to settle (they start copies and
 * return). */
uint64_t kvt_evict(kvc_conn *c, Kvcached__Tier tier);
/* kvt_evict() without the wait: returns with the reply, copies under way. */
uint64_t kvt_evict_nowait(kvc_conn *c, Kvcached__Tier tier);
void kvt_flush(kvc_conn *c);
/* Allocates n blocks in session c, pool, writes kvt_mem_fill's pattern of
 * seed base + i into block i (block_bytes), seals them as one chain under
 * kvt_hash(base + i) and releases them: the chain kvt_lookup_held() and
 * kvt_lookup_chain() look for. Every step checked. */
void kvt_seal_chain(kvc_conn *c, int pool, uint32_t block_bytes, int n, uint64_t base);
/* A Lookup in session c, pool, of the chain of n blocks whose block i
 * holds kvt_mem_fill's pattern of seed base + i (block_bytes), under
 * kvt_hash(base + i): how many it found, every byte of each checked; they
 * are held, in b, for the caller to release. */
int kvt_lookup_held(kvc_conn *c, int pool, uint32_t block_bytes, int n, uint64_t base,
		    kvc_block *b);
/* kvt_lookup_held() in a session of namespace ns, pool pool_name, the
 * blocks found released again: how many it found. */
int kvt_lookup_chain(const char *ns, const char *pool_name, uint32_t block_bytes, int n,
		     uint64_t base);
/* What namespace name holds per tier (G1, G2, G3 bytes) and its quotas. */
void kvt_ns_usage(const char *name, uint64_t used[3], uint64_t quota[3]);
uint32_t kvt_sessions(void);
/* Waits until the daemon counts n sessions (fails the test after a minute). */
void kvt_wait_sessions(uint32_t n);

/* Forks a worker running fn(arg); its exit status is fn's return. */
pid_t kvt_spawn(int (*fn)(void *arg), void *arg);
/* Waits for pid; returns its exit status, or 128 + signal. */
int kvt_wait(pid_t pid);

/* Deterministic test bytes for (seed, offset). */
void kvt_fill(void *p, size_t n, uint64_t seed);
int kvt_verify(const void *p, size_t n, uint64_t seed);

/* Whether this test runs the daemon on the cuda backend: $KVT_BACKEND=cuda,
 * set by the 'gpu' suite, which runs the integration tests again that way.
 * kvt_start() then adds --backend cuda, or exits 77 when no GPU is usable
 * (probed in a child process: CUDA does not survive fork(), so a test's main
 * process must not touch CUDA before it spawns its workers). */
int kvt_cuda(void);

/* Block bytes through c's mapping, on either backend: plain memory on the
 * host backend, device memory through copies on cuda. p is a pointer from
 * kvc_block_ptr(c, ...) (or into a block). */
void kvt_mem_write(kvc_conn *c, void *p, const void *src, size_t n);
void kvt_mem_read(kvc_conn *c, void *dst, const void *p, size_t n);
void kvt_mem_fill(kvc_conn *c, void *p, size_t n, uint64_t seed);
int kvt_mem_verify(kvc_conn *c, const void *p, size_t n, uint64_t seed);
void kvt_mem_set(kvc_conn *c, void *p, int v, size_t n);
/* Whether all n bytes at p are v. */
int kvt_mem_all(kvc_conn *c, const void *p, int v, size_t n);

/* A distinct test hash. */
kvc_hash kvt_hash(uint64_t i);

#endif
