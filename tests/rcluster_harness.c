/* A real Redis Cluster on loopback; rcluster_harness.h has the contract. */
#include "rcluster_harness.h"

#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FAIL(...) do { \
	fprintf(stderr, "rcluster_harness: " __VA_ARGS__); \
	fputc('\n', stderr); \
	exit(1); \
} while (0)

static struct kvt_rc *live[4];
static pid_t owner_pid;
static const char *server_bin, *cli_bin;
static char server_buf[4096], cli_buf[4096];

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The interval of a polling wait: how often a condition is checked. */
static void poll_pause(void)
{
	struct timespec ts = { 0, 20 * 1000000L };

	nanosleep(&ts, NULL);
}

/* ---- cleanup, also from a signal ---- */

/* Async-signal-safe: kill, waitpid, fork, execv. */
static void kill_all(struct kvt_rc *c, int remove_dir)
{
	int i;

	for (i = 0; i < c->n; i++)
		if (c->node[i].pid > 0)
			kill(c->node[i].pid, SIGKILL);
	for (i = 0; i < c->n; i++) {
		if (c->node[i].pid > 0)
			waitpid(c->node[i].pid, NULL, 0);
		c->node[i].pid = 0;
	}
	if (remove_dir && c->dir[0]) {
		pid_t pid = fork();

		if (pid == 0) {
			char *argv[] = { "rm", "-rf", "--", c->dir, NULL };

			execv("/bin/rm", argv);
			_exit(127);
		}
		if (pid > 0)
			waitpid(pid, NULL, 0);
	}
}

static void on_signal(int sig)
{
	unsigned i;

	if (getpid() == owner_pid)
		for (i = 0; i < sizeof(live) / sizeof(live[0]); i++)
			if (live[i])
				kill_all(live[i], 1);
	signal(sig, SIG_DFL);
	raise(sig);
}

static void at_exit(void)
{
	unsigned i;

	if (getpid() != owner_pid)
		return;
	for (i = 0; i < sizeof(live) / sizeof(live[0]); i++)
		if (live[i])
			kvt_rc_stop(live[i]);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	remove(path);
	return 0;
}

/* ---- programs ---- */

const char *kvt_rc_find_bin(const char *env, const char *name, char *out, size_t len)
{
	const char *path = getenv("PATH"), *p, *e;

	if (getenv(env) && *getenv(env))
		return access(getenv(env), X_OK) == 0 ? getenv(env) : NULL;
	for (p = path ? path : "/usr/bin:/bin"; *p; p = *e ? e + 1 : e) {
		e = strchr(p, ':');
		if (!e)
			e = p + strlen(p);
		if (e == p)
			continue;
		snprintf(out, len, "%.*s/%s", (int)(e - p), p, name);
		if (access(out, X_OK) == 0)
			return out;
	}
	return NULL;
}

static uint64_t rnd_state;

static unsigned rnd(void)
{
	rnd_state ^= rnd_state << 13;
	rnd_state ^= rnd_state >> 7;
	rnd_state ^= rnd_state << 17;
	return (unsigned)(rnd_state >> 11);
}

static int bind_free(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM, 0), ok;

	if (fd < 0)
		return 0;
	ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	close(fd);
	return ok;
}

/* A port that, with its bus port (+10000), nobody holds now. */
static int pick_port(void)
{
	int tries, port;

	for (tries = 0; tries < 1000; tries++) {
		port = 20000 + (int)(rnd() % 35000);
		if (bind_free(port) && bind_free(port + 10000))
			return port;
	}
	FAIL("no free port pair found");
}

static pid_t spawn(const char *bin, char *const argv[], const char *log, const char *auth)
{
	pid_t parent = getpid(), pid;

	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		int fd = open("/dev/null", O_RDONLY), lfd;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		lfd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd < 0 || lfd < 0)
			_exit(126);
		dup2(fd, 0);
		dup2(lfd, 1);
		dup2(lfd, 2);
		if (auth)
			setenv("REDISCLI_AUTH", auth, 1);
		execv(bin, argv);
		_exit(127);
	}
	return pid;
}

/* ---- nodes ---- */

static redisContext *connect_port(const struct kvt_rc *c, int port)
{
	struct timeval tv = { 5, 0 }, ctv = { 1, 0 };
	redisContext *r = redisConnectWithTimeout("127.0.0.1", port, ctv);

	if (!r || r->err || redisSetTimeout(r, tv) != REDIS_OK)
		goto fail;
	if (c->password[0]) {
		redisReply *rep = redisCommand(r, "AUTH %s", c->password);
		int ok = rep && rep->type == REDIS_REPLY_STATUS;

		freeReplyObject(rep);
		if (!ok)
			goto fail;
	}
	return r;
fail:
	if (r)
		redisFree(r);
	return NULL;
}

redisContext *kvt_rc_connect(const struct kvt_rc *c, int i)
{
	if (i < 0 || i >= c->n || !c->node[i].pid)
		return NULL;
	return connect_port(c, c->node[i].port);
}

redisContext *kvt_rc_find_key(struct kvt_rc *c, const char *pattern, char *key, size_t len)
{
	for (int n = 0; n < c->n; n++) {
		redisContext *x;
		redisReply *r;

		if (!kvt_rc_is_master(c, n) || !(x = kvt_rc_connect(c, n)))
			continue;
		r = redisCommand(x, "SCAN 0 MATCH %s COUNT 100000", pattern);
		if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
		    r->element[1]->elements == 1) {
			snprintf(key, len, "%s", r->element[1]->element[0]->str);
			freeReplyObject(r);
			return x;
		}
		freeReplyObject(r);
		redisFree(x);
	}
	return NULL;
}

/* A command's reply, or NULL (connection error); the caller frees it. */
__attribute__((format(printf, 3, 4)))
static redisReply *cmd(const struct kvt_rc *c, int i, const char *fmt, ...)
{
	redisContext *r = kvt_rc_connect(c, i);
	redisReply *rep = NULL;
	va_list ap;

	if (!r)
		return NULL;
	va_start(ap, fmt);
	rep = redisvCommand(r, fmt, ap);
	va_end(ap);
	redisFree(r);
	return rep;
}

/* A field of an INFO-like reply ("name:value\r\n"), into out. */
static int info_field(const redisReply *rep, const char *name, char *out, size_t len)
{
	size_t nl = strlen(name);
	const char *p;

	if (!rep || (rep->type != REDIS_REPLY_STRING && rep->type != REDIS_REPLY_STATUS) ||
	    !rep->str)
		return -1;
	for (p = rep->str; p; p = strchr(p, '\n')) {
		if (*p == '\n')
			p++;
		if (!strncmp(p, name, nl) && p[nl] == ':') {
			size_t n = strcspn(p + nl + 1, "\r\n");

			snprintf(out, len, "%.*s", (int)n, p + nl + 1);
			return 0;
		}
	}
	return -1;
}

/* Starts node i on its port; waits until that process answers. Returns 0,
 * or -1 if it exited (its port was taken after all) or never answered. */
static int node_spawn(struct kvt_rc *c, int i)
{
	struct kvt_rc_node *nd = &c->node[i];
	char port[16], timeout[16], log[400], conf_log[400], pass_rule[160];
	char *argv[48];
	int a = 0;
	uint64_t end;

	snprintf(port, sizeof(port), "%d", nd->port);
	snprintf(timeout, sizeof(timeout), "%u", c->node_timeout_ms);
	snprintf(log, sizeof(log), "%s/stdout.log", nd->dir);
	snprintf(conf_log, sizeof(conf_log), "%s/redis.log", nd->dir);
	argv[a++] = (char *)server_bin;
	argv[a++] = "--port"; argv[a++] = port;
	argv[a++] = "--bind"; argv[a++] = "127.0.0.1";
	argv[a++] = "--cluster-enabled"; argv[a++] = "yes";
	argv[a++] = "--cluster-config-file"; argv[a++] = "nodes.conf";
	argv[a++] = "--cluster-node-timeout"; argv[a++] = timeout;
	argv[a++] = "--appendonly"; argv[a++] = "no";
	argv[a++] = "--save"; argv[a++] = "";
	argv[a++] = "--dir"; argv[a++] = nd->dir;
	argv[a++] = "--logfile"; argv[a++] = conf_log;
	argv[a++] = "--daemonize"; argv[a++] = "no";
	if (c->password[0]) {
		argv[a++] = "--requirepass"; argv[a++] = c->password;
		argv[a++] = "--masterauth"; argv[a++] = c->password;
		if (c->user[0]) {
			/* One argument per word: redis-server quotes each. */
			snprintf(pass_rule, sizeof(pass_rule), ">%s", c->password);
			argv[a++] = "--user"; argv[a++] = c->user;
			argv[a++] = "on"; argv[a++] = pass_rule;
			argv[a++] = "~*"; argv[a++] = "&*"; argv[a++] = "+@all";
		}
	}
	argv[a] = NULL;
	nd->pid = spawn(server_bin, argv, log, NULL);

	end = now_ms() + KVT_RC_WAIT_MS;
	while (now_ms() < end) {
		redisContext *r;
		int st;

		if (waitpid(nd->pid, &st, WNOHANG) == nd->pid) {
			nd->pid = 0;
			return -1;
		}
		r = connect_port(c, nd->port);
		if (r) {
			redisReply *rep = redisCommand(r, "INFO server");
			char pid[32];
			int ours = !info_field(rep, "process_id", pid, sizeof(pid)) &&
				   atoi(pid) == nd->pid;

			freeReplyObject(rep);
			redisFree(r);
			if (ours)
				return 0;
		}
		poll_pause();
	}
	kill(nd->pid, SIGKILL);
	waitpid(nd->pid, NULL, 0);
	nd->pid = 0;
	return -1;
}

static void node_id(struct kvt_rc *c, int i)
{
	redisReply *rep = cmd(c, i, "CLUSTER MYID");

	if (!rep || rep->type != REDIS_REPLY_STRING || rep->len != 40)
		FAIL("node %d: CLUSTER MYID failed", i);
	memcpy(c->node[i].id, rep->str, 40);
	c->node[i].id[40] = 0;
	freeReplyObject(rep);
}

static void create_cluster(struct kvt_rc *c)
{
	char *argv[KVT_RC_MAX + 16], addr[KVT_RC_MAX][24], reps[16], log[300];
	int a = 0, i, st;
	pid_t pid;
	uint64_t end;

	argv[a++] = (char *)cli_bin;
	argv[a++] = "--cluster";
	argv[a++] = "create";
	for (i = 0; i < c->n; i++) {
		snprintf(addr[i], sizeof(addr[i]), "127.0.0.1:%d", c->node[i].port);
		argv[a++] = addr[i];
	}
	snprintf(reps, sizeof(reps), "%d", c->replicas);
	argv[a++] = "--cluster-replicas";
	argv[a++] = reps;
	argv[a++] = "--cluster-yes";
	argv[a] = NULL;
	snprintf(log, sizeof(log), "%s/create.log", c->dir);
	pid = spawn(cli_bin, argv, log, c->password[0] ? c->password : NULL);
	end = now_ms() + KVT_RC_WAIT_MS;
	while (waitpid(pid, &st, WNOHANG) != pid) {
		if (now_ms() >= end) {
			kill(pid, SIGKILL);
			waitpid(pid, NULL, 0);
			FAIL("redis-cli --cluster create did not finish (see %s)", log);
		}
		poll_pause();
	}
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		char line[512];
		FILE *f = fopen(log, "r");

		while (f && fgets(line, sizeof(line), f))
			fputs(line, stderr);
		if (f)
			fclose(f);
		FAIL("redis-cli --cluster create failed (status %d)", st);
	}
}

void kvt_rc_start(struct kvt_rc *c, int masters, int replicas, const struct kvt_rc_opts *opts)
{
	const char *tmp = getenv("TMPDIR");
	unsigned k;
	int i, tries;
	size_t off = 0;

	server_bin = kvt_rc_find_bin("KVT_REDIS_SERVER", "redis-server", server_buf,
				     sizeof(server_buf));
	cli_bin = kvt_rc_find_bin("KVT_REDIS_CLI", "redis-cli", cli_buf, sizeof(cli_buf));
	if (!server_bin || !cli_bin)
		SKIP("redis-server or redis-cli not found (Debian: redis-server, redis-tools)");
	CHECK(masters >= 3 && replicas >= 0 && masters * (1 + replicas) <= KVT_RC_MAX);

	memset(c, 0, sizeof(*c));
	c->masters = masters;
	c->replicas = replicas;
	c->n = masters * (1 + replicas);
	c->node_timeout_ms = opts && opts->node_timeout_ms ? opts->node_timeout_ms : 1000;
	if (opts && opts->password) {
		snprintf(c->password, sizeof(c->password), "%s", opts->password);
		if (opts->user)
			snprintf(c->user, sizeof(c->user), "%s", opts->user);
	}
	if (!rnd_state)
		rnd_state = ((uint64_t)getpid() << 32) ^ now_ms() ^ 0x9e3779b97f4a7c15ull;

	/* Cleanup first, so that nothing started below outlives the test. */
	if (!owner_pid) {
		owner_pid = getpid();
		atexit(at_exit);
		signal(SIGTERM, on_signal);
		signal(SIGINT, on_signal);
		signal(SIGHUP, on_signal);
		signal(SIGPIPE, on_signal);  /* a test piped into head(1) */
	}
	for (k = 0; k < sizeof(live) / sizeof(live[0]) && live[k]; k++)
		;
	CHECK(k < sizeof(live) / sizeof(live[0]));
	snprintf(c->dir, sizeof(c->dir), "%s/kvt-rc-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	CHECK(mkdtemp(c->dir) != NULL);
	live[k] = c;

	for (i = 0; i < c->n; i++) {
		struct kvt_rc_node *nd = &c->node[i];

		snprintf(nd->dir, sizeof(nd->dir), "%s/n%d", c->dir, i);
		CHECK(mkdir(nd->dir, 0700) == 0);
		for (tries = 0; tries < 20; tries++) {
			char conf[340];

			/* A start that failed may have written a nodes.conf. */
			snprintf(conf, sizeof(conf), "%s/nodes.conf", nd->dir);
			unlink(conf);
			nd->port = pick_port();
			if (node_spawn(c, i) == 0)
				break;
		}
		if (tries == 20)
			FAIL("node %d would not start (see %s/redis.log)", i, nd->dir);
		off += (size_t)snprintf(c->seeds + off, sizeof(c->seeds) - off, "%s127.0.0.1:%d",
					i ? "," : "", nd->port);
	}
	create_cluster(c);
	for (i = 0; i < c->n; i++)
		node_id(c, i);
	if (kvt_rc_wait_healthy(c, KVT_RC_WAIT_MS))
		FAIL("the cluster in %s did not become healthy", c->dir);
}

void kvt_rc_stop(struct kvt_rc *c)
{
	unsigned k;

	kill_all(c, 0);
	if (c->dir[0])
		nftw(c->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	c->dir[0] = 0;
	for (k = 0; k < sizeof(live) / sizeof(live[0]); k++)
		if (live[k] == c)
			live[k] = NULL;
}

const char *kvt_rc_seeds(const struct kvt_rc *c)
{
	return c->seeds;
}

int kvt_rc_running(const struct kvt_rc *c, int i)
{
	return i >= 0 && i < c->n && c->node[i].pid > 0;
}

void kvt_rc_kill(struct kvt_rc *c, int i)
{
	CHECK(kvt_rc_running(c, i));
	CHECK(kill(c->node[i].pid, SIGKILL) == 0);
	CHECK(waitpid(c->node[i].pid, NULL, 0) == c->node[i].pid);
	c->node[i].pid = 0;
}

void kvt_rc_pause(struct kvt_rc *c, int i, int stop)
{
	CHECK(kvt_rc_running(c, i));
	CHECK(kill(c->node[i].pid, stop ? SIGSTOP : SIGCONT) == 0);
}

void kvt_rc_restart(struct kvt_rc *c, int i)
{
	CHECK(i >= 0 && i < c->n && !c->node[i].pid);
	if (node_spawn(c, i))
		FAIL("node %d would not start again on port %d (see %s/redis.log)", i,
		     c->node[i].port, c->node[i].dir);
}

static int node_by_port(const struct kvt_rc *c, long long port)
{
	int i;

	for (i = 0; i < c->n; i++)
		if (c->node[i].port == port)
			return i;
	return -1;
}

/* owner[slot] = the node index CLUSTER SLOTS of node i gives (-1: none).
 * Returns 0, or -1 if the node did not answer with a map. */
static int slots_of(struct kvt_rc *c, int i, int *owner)
{
	redisReply *rep = cmd(c, i, "CLUSTER SLOTS");
	size_t e;
	int rv = -1;

	for (e = 0; e < 16384; e++)
		owner[e] = -1;
	if (!rep || rep->type != REDIS_REPLY_ARRAY)
		goto out;
	for (e = 0; e < rep->elements; e++) {
		redisReply *r = rep->element[e], *m;
		long long s;

		if (r->type != REDIS_REPLY_ARRAY || r->elements < 3)
			goto out;
		m = r->element[2];
		if (m->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
		    m->element[1]->type != REDIS_REPLY_INTEGER)
			goto out;
		for (s = r->element[0]->integer; s <= r->element[1]->integer && s < 16384; s++)
			if (s >= 0)
				owner[s] = node_by_port(c, m->element[1]->integer);
	}
	rv = 0;
out:
	freeReplyObject(rep);
	return rv;
}

int kvt_rc_healthy(struct kvt_rc *c)
{
	static int first[16384], mine[16384];
	int i, s, have_first = 0;

	for (i = 0; i < c->n; i++) {
		redisReply *rep;
		char v[64];
		int ok;

		if (!c->node[i].pid)
			continue;
		rep = cmd(c, i, "CLUSTER INFO");
		ok = !info_field(rep, "cluster_state", v, sizeof(v)) && !strcmp(v, "ok");
		freeReplyObject(rep);
		if (!ok)
			return 0;
		rep = cmd(c, i, "INFO replication");
		ok = !info_field(rep, "role", v, sizeof(v));
		if (ok && !strcmp(v, "slave"))
			ok = !info_field(rep, "master_link_status", v, sizeof(v)) && !strcmp(v, "up");
		freeReplyObject(rep);
		if (!ok)
			return 0;
		if (slots_of(c, i, have_first ? mine : first))
			return 0;
		for (s = 0; s < 16384; s++) {
			int o = have_first ? mine[s] : first[s];

			if (o < 0 || !c->node[o].pid || (have_first && mine[s] != first[s]))
				return 0;
		}
		have_first = 1;
	}
	return have_first;
}

int kvt_rc_wait_healthy(struct kvt_rc *c, unsigned timeout_ms)
{
	uint64_t end = now_ms() + timeout_ms;

	for (;;) {
		if (kvt_rc_healthy(c))
			return 0;
		if (now_ms() >= end)
			return -ETIMEDOUT;
		poll_pause();
	}
}

int kvt_rc_slot_map(struct kvt_rc *c, int *owner)
{
	int i;

	for (i = 0; i < c->n; i++)
		if (c->node[i].pid && slots_of(c, i, owner) == 0)
			return 0;
	return -1;
}

int kvt_rc_slot_owner(struct kvt_rc *c, unsigned slot)
{
	static int owner[16384];
	int i;

	for (i = 0; i < c->n; i++)
		if (c->node[i].pid && slots_of(c, i, owner) == 0)
			return slot < 16384 ? owner[slot] : -1;
	return -1;
}

int kvt_rc_is_master(struct kvt_rc *c, int i)
{
	redisReply *rep;
	char v[32];
	int master;

	if (!kvt_rc_running(c, i))
		return 0;
	rep = cmd(c, i, "INFO replication");
	master = !info_field(rep, "role", v, sizeof(v)) && !strcmp(v, "master");
	freeReplyObject(rep);
	return master;
}

int kvt_rc_wait_replicated(struct kvt_rc *c, unsigned timeout_ms)
{
	static int owner[16384];
	uint64_t end = now_ms() + timeout_ms;
	int i;

	for (i = 0; i < c->n; i++) {
		redisContext *r;
		redisReply *rep;
		char v[32], key[64];
		int s, nrep, n, acked = 0;

		if (!kvt_rc_is_master(c, i))
			continue;
		if (slots_of(c, i, owner))
			return -ETIMEDOUT;
		for (s = 0; s < 16384 && owner[s] != i; s++)
			;
		if (s == 16384)
			continue;  /* a master without slots takes no writes */
		r = kvt_rc_connect(c, i);
		if (!r)
			return -ETIMEDOUT;
		/* A key of a slot this master serves. */
		for (n = 0;; n++) {
			snprintf(key, sizeof(key), "kvt:sync:%d", n);
			rep = redisCommand(r, "CLUSTER KEYSLOT %s", key);
			if (!rep || rep->type != REDIS_REPLY_INTEGER)
				FAIL("CLUSTER KEYSLOT failed");
			s = (int)rep->integer;
			freeReplyObject(rep);
			if (owner[s] == i)
				break;
		}
		rep = redisCommand(r, "INFO replication");
		nrep = !info_field(rep, "connected_slaves", v, sizeof(v)) ? atoi(v) : 0;
		freeReplyObject(rep);
		/* Writes replicate in order: once this SET is acknowledged, so
		 * is every write before it. */
		rep = redisCommand(r, "SET %s 1", key);
		freeReplyObject(rep);
		while (nrep && acked < nrep) {
			uint64_t now = now_ms();

			if (now >= end) {
				redisFree(r);
				return -ETIMEDOUT;
			}
			rep = redisCommand(r, "WAIT %d %d", nrep, (int)(end - now > 1000 ? 1000 : end - now));
			acked = rep && rep->type == REDIS_REPLY_INTEGER ? (int)rep->integer : 0;
			freeReplyObject(rep);
		}
		redisFree(r);
	}
	return 0;
}

/* Runs a command on node i that must answer +OK. */
static void must_ok(struct kvt_rc *c, int i, redisReply *rep, const char *what)
{
	if (!rep || rep->type != REDIS_REPLY_STATUS)
		FAIL("node %d: %s: %s", i, what, rep && rep->str ? rep->str : "no reply");
	freeReplyObject(rep);
}

void kvt_rc_slot_begin(struct kvt_rc *c, unsigned slot, int from, int to)
{
	must_ok(c, to, cmd(c, to, "CLUSTER SETSLOT %u IMPORTING %s", slot, c->node[from].id),
		"SETSLOT IMPORTING");
	must_ok(c, from, cmd(c, from, "CLUSTER SETSLOT %u MIGRATING %s", slot, c->node[to].id),
		"SETSLOT MIGRATING");
}

void kvt_rc_slot_move_keys(struct kvt_rc *c, unsigned slot, int from, int to, size_t n,
			   const void *const *keys, const size_t *lens)
{
	redisContext *r = kvt_rc_connect(c, from);
	redisReply *all = NULL, *rep;
	const char **argv;
	size_t *argl, i, a = 0;
	char port[16];

	CHECK(r != NULL);
	if (!n) {
		all = redisCommand(r, "CLUSTER GETKEYSINSLOT %u 100000", slot);
		CHECK(all && all->type == REDIS_REPLY_ARRAY);
		n = all->elements;
	}
	if (n) {
		argv = calloc(n + 12, sizeof(*argv));
		argl = calloc(n + 12, sizeof(*argl));
		CHECK(argv && argl);
		snprintf(port, sizeof(port), "%d", c->node[to].port);
		argv[a++] = "MIGRATE";
		argv[a++] = "127.0.0.1";
		argv[a++] = port;
		argv[a++] = "";
		argv[a++] = "0";
		argv[a++] = "5000";
		if (c->password[0]) {
			argv[a++] = "AUTH";
			argv[a++] = c->password;
		}
		argv[a++] = "KEYS";
		for (i = 0; i < a; i++)
			argl[i] = strlen(argv[i]);
		for (i = 0; i < n; i++, a++) {
			argv[a] = all ? all->element[i]->str : keys[i];
			argl[a] = all ? all->element[i]->len : lens[i];
		}
		rep = redisCommandArgv(r, (int)a, argv, argl);
		must_ok(c, from, rep, "MIGRATE");
		free(argv);
		free(argl);
	}
	freeReplyObject(all);
	redisFree(r);
}

void kvt_rc_slot_end(struct kvt_rc *c, unsigned slot, int from, int to)
{
	int i;

	must_ok(c, to, cmd(c, to, "CLUSTER SETSLOT %u NODE %s", slot, c->node[to].id),
		"SETSLOT NODE (target)");
	must_ok(c, from, cmd(c, from, "CLUSTER SETSLOT %u NODE %s", slot, c->node[to].id),
		"SETSLOT NODE (source)");
	for (i = 0; i < c->n; i++)
		if (i != to && i != from && kvt_rc_is_master(c, i))
			must_ok(c, i, cmd(c, i, "CLUSTER SETSLOT %u NODE %s", slot, c->node[to].id),
				"SETSLOT NODE");
}
