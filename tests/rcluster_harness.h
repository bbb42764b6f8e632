/* A real Redis Cluster on loopback for tests (the G4 client's, and later
 * the two-daemon integration tests').
 *
 * kvt_rc_start() starts masters * (1 + replicas) redis-server processes,
 * each in its own directory under one mkdtemp() directory, on ports picked
 * free at run time (a bind test of the port and of its cluster bus port,
 * port + 10000; a server that still fails to start is started again on
 * other ports), joins them with redis-cli --cluster create and waits until
 * the cluster is healthy (kvt_rc_healthy()). Every wait polls a condition
 * under a generous deadline (KVT_RC_WAIT_MS); none sleeps a fixed time
 * instead of checking.
 *
 * The servers die with the test: they are killed (and the directory
 * removed) when the test exits, fails a check, or gets SIGTERM (meson's
 * timeout), SIGINT, SIGHUP or SIGPIPE; by PR_SET_PDEATHSIG if it is killed
 * outright (the directory then stays).
 * A test that forks keeps the cleanup in the process that started them.
 *
 * Binaries: redis-server and redis-cli from PATH, or $KVT_REDIS_SERVER and
 * $KVT_REDIS_CLI; without them kvt_rc_start() exits 77 (skip).
 *
 * Everything here fails the test (exit 1, with a message) on what is not a
 * wait; waits return 0 or -ETIMEDOUT so that a test can say what it
 * waited for. Single-threaded. */
#ifndef KVT_RCLUSTER_HARNESS_H
#define KVT_RCLUSTER_HARNESS_H

#include <stddef.h>
#include <sys/types.h>

#include <hiredis/hiredis.h>

#define KVT_RC_MAX 32
/* The longest any harness wait lasts before it gives up: a guard against
 * a hang, far above what a wait takes (ASan, 2 busy cores). */
#define KVT_RC_WAIT_MS 60000

struct kvt_rc_opts {
	/* requirepass and masterauth: the default user's password. NULL: no
	 * AUTH anywhere. */
	const char *password;
	/* With password: also an ACL user of this name, same password, every
	 * right. NULL: none. */
	const char *user;
	unsigned node_timeout_ms;  /* cluster-node-timeout; 0: 1000 */
};

struct kvt_rc_node {
	int port;
	pid_t pid;          /* 0: not running */
	char id[41];        /* the cluster node id (kept across restarts) */
	char dir[300];
};

struct kvt_rc {
	char dir[256];
	int n, masters, replicas;
	unsigned node_timeout_ms;
	char password[128], user[64];
	char seeds[KVT_RC_MAX * 24];
	struct kvt_rc_node node[KVT_RC_MAX];
};

/* Starts a cluster of masters masters with replicas replicas each and
 * waits until it is healthy. opts NULL: no AUTH. */
void kvt_rc_start(struct kvt_rc *c, int masters, int replicas, const struct kvt_rc_opts *opts);
/* Kills every server and removes the directory. Twice: nothing. */
void kvt_rc_stop(struct kvt_rc *c);

/* The program name as the harness finds it: $env if set (NULL if that is
 * not executable), else the first in PATH, written into out; NULL if none. */
const char *kvt_rc_find_bin(const char *env, const char *name, char *out, size_t len);

/* "127.0.0.1:port,..." of every node, running or not. */
const char *kvt_rc_seeds(const struct kvt_rc *c);

/* kill -9 of node i (it must be running); reaps it. */
void kvt_rc_kill(struct kvt_rc *c, int i);
/* SIGSTOP (stop 1) or SIGCONT (stop 0) to node i. */
void kvt_rc_pause(struct kvt_rc *c, int i, int stop);
/* Starts node i again, same port, directory and node id (nodes.conf), and
 * waits until it answers (not until the cluster is healthy again). */
void kvt_rc_restart(struct kvt_rc *c, int i);
int kvt_rc_running(const struct kvt_rc *c, int i);

/* Whether, right now, every running node says cluster_state:ok, serves a
 * CLUSTER SLOTS that covers all 16384 slots with running nodes only and the
 * same on every node, and every running replica has its master link up. */
int kvt_rc_healthy(struct kvt_rc *c);
/* Waits for kvt_rc_healthy(); 0 or -ETIMEDOUT. */
int kvt_rc_wait_healthy(struct kvt_rc *c, unsigned timeout_ms);
/* Waits until every running master's connected replicas have acknowledged
 * all its writes so far (a SET, then WAIT); 0 or -ETIMEDOUT. */
int kvt_rc_wait_replicated(struct kvt_rc *c, unsigned timeout_ms);

/* A blocking hiredis connection to node i, authenticated, with 5 s
 * timeouts; the caller frees it (redisFree). NULL if it does not connect. */
redisContext *kvt_rc_connect(const struct kvt_rc *c, int i);
/* The master that holds the one key matching glob pattern (SCAN MATCH):
 * the key into key (len bytes), and a connection to that master (the
 * caller frees it). NULL when no master holds exactly one such key. */
redisContext *kvt_rc_find_key(struct kvt_rc *c, const char *pattern, char *key, size_t len);
/* The node serving slot, as the first running node's CLUSTER SLOTS says;
 * -1 if none. */
int kvt_rc_slot_owner(struct kvt_rc *c, unsigned slot);
/* owner[slot] for all 16384 slots: the node serving it (-1: none), from
 * the first running node's CLUSTER SLOTS. 0, or -1 if none answered. */
int kvt_rc_slot_map(struct kvt_rc *c, int *owner);
/* Whether node i is running and says role:master. */
int kvt_rc_is_master(struct kvt_rc *c, int i);

/* Moving a slot by hand, as redis-cli --cluster reshard does:
 * begin sets it IMPORTING on to and MIGRATING on from; move_keys migrates
 * the n keys given (n 0: every key left in the slot) from from to to; end
 * assigns it to to on to, on from, then on every other running master. */
void kvt_rc_slot_begin(struct kvt_rc *c, unsigned slot, int from, int to);
void kvt_rc_slot_move_keys(struct kvt_rc *c, unsigned slot, int from, int to, size_t n,
			   const void *const *keys, const size_t *lens);
void kvt_rc_slot_end(struct kvt_rc *c, unsigned slot, int from, int to);

#endif
