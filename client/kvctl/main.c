/* kvctl: the operator's tool for a running kvcached (kvctl(8)).
 *
 *   kvctl [-s SOCKET] [-o human|json] COMMAND [OPTIONS]
 *
 * It talks to the admin socket by default (kv_admin_socket_default()): the
 * one next to the worker socket, where admin operations are allowed.
 * Human output is aligned tables for a terminal (libsmartcols); -o json is
 * one JSON document for scripts (jansson; `top`: one compact document per
 * line and frame). Exit status: 0 success, 1 failure (or `check` finding
 * problems), 2 usage error. Errors are one line on stderr:
 * "kvctl: <what>: <why>". This file: the command table, the command line
 * and the call to the daemon; kvctl.h says where the commands are. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frame.h"
#include "kvctl.h"
#include "units.h"

int fail(kvc_conn *c, const char *what, int err)
{
	const char *msg = c ? kvc_last_error(c) : "";

	fprintf(stderr, "kvctl: %s: %s\n", what, *msg ? msg : kvc_strerror(err));
	return 1;
}

static const char *check_result(const Kvcached__Response *r, const void *arg)
{
	const Kvcached__Response__ResultCase *want = arg;

	return r->result_case == *want ? NULL : "unexpected reply from the daemon";
}

Kvcached__Response *call(kvc_conn *c, Kvcached__Request *req, Kvcached__Response__ResultCase want,
			 const char *what)
{
	Kvcached__Response *resp = NULL;
	int r = kvc_call_check(c, req, check_result, &want, &resp);

	if (r < 0) {
		fail(c, what, r);
		return NULL;
	}
	return resp;
}

/* --- command line -------------------------------------------------------- */

struct command {
	const char *name;
	int (*run)(kvc_conn *c, const struct args *a);
	unsigned opts;          /* O_* it takes */
	const char *args;       /* its options, for the usage line */
	const char *summary;
	const char *help;
};

static const struct command commands[] = {
	{ "status", cmd_status, 0, "", "daemon summary, pools and namespaces",
	  "Shows the daemon's version, backend, state (serving or draining) and uptime, its\n"
	  "page and segment usage, sessions and clients, requests, allocation failures\n"
	  "(enospc), the overall hit rate and the reloads, then one line per pool (blocks in\n"
	  "total, free and cached, hit rate) and one per namespace (pools, sessions, blocks\n"
	  "by state, bytes).\n" },
	{ "pools", cmd_pools, 0, "", "per-pool block states and counters",
	  "Shows one row per pool: id, namespace, name, device, block size, blocks per\n"
	  "run and runs held, blocks free / writable / sealed / cached, allocations,\n"
	  "lookup hit rate, evictions and seal deduplications.\n" },
	{ "namespaces", cmd_namespaces, 0, "", "per-namespace usage against limits",
	  "Shows one row per open namespace (with sessions or pools, or declared by a\n"
	  "[namespace NAME] section): sessions, pools, what it holds in G1 (blocks), G2\n"
	  "and G3 (slots) against its quota where one is set (\"used / quota\"), its G1\n"
	  "reserve, eviction priority and TTL, the hit rate of its lookups, and how many\n"
	  "requests its quotas refused (KV_EQUOTA). Without admin rights, only the\n"
	  "caller's own namespace.\n" },
	{ "clients", cmd_clients, 0, "", "connected sessions",
	  "Shows one row per connected session: session id, pid, uid, namespace, the\n"
	  "name the client gave, the socket it came through (worker or admin), block\n"
	  "references held, when it connected and how many requests it made.\n" },
	{ "evict", cmd_evict, O_POOL | O_ALL | O_TIER,
	  " [--tier g1|g2|g3] (--pool ID | --all)", "evict idle blocks of one tier",
	  "Evicts the idle blocks (held by nobody) of one tier, of pool ID or of every\n"
	  "pool, as memory pressure would; blocks that workers hold are never touched.\n"
	  "g1 (the default) demotes every cached device block to the host tier, or\n"
	  "drops it when there is none; g2 drops host-tier copies that are on disk and\n"
	  "writes the others to disk first (dropped when there is no disk tier); g3\n"
	  "drops the disk tier's blocks. Prints how many blocks it acted on.\n\n"
	  "  --tier g1|g2|g3  the tier (default g1); with --tier alone, every pool\n"
	  "  --pool ID        the pool (kvctl pools lists the ids)\n"
	  "  --all            every pool\n" },
	{ "flush", cmd_flush, 0, "", "write the host tier back to disk",
	  "Writes every host-tier block that is not on disk yet to the disk tier and\n"
	  "waits until all writes are done (at most 60 s; exit 1 if not done).\n" },
	{ "drain", cmd_drain, O_TIMEOUT | O_WAIT, " [--timeout DURATION] [--wait]",
	  "stop taking work and exit when clients are gone",
	  "Starts the drain SIGTERM starts: the worker socket stops accepting, new\n"
	  "pools, allocations and lookups are refused (ESHUTDOWN), clients may release\n"
	  "what they hold, and kvcached exits once no client is left or the timeout\n"
	  "passes. A drain under way keeps its deadline.\n\n"
	  "  --timeout DURATION  how long clients may take (default: the drain_timeout\n"
	  "                      key); 500ms, 30s, 2m, a bare number is seconds\n"
	  "  --wait              return only when kvcached has exited\n" },
	{ "reload", cmd_reload, 0, "", "re-read the configuration file",
	  "Makes kvcached read its configuration again, as SIGHUP does, and apply the\n"
	  "keys that can change at run time (log_level, log_target, drain_timeout,\n"
	  "status_interval, worker_socket_admin). Prints each key that changed, and\n"
	  "those that need a restart. An invalid file changes nothing and is an error.\n" },
	{ "check", cmd_check, 0, "", "run the daemon's consistency check",
	  "Asks the daemon to check its invariants (block states, lists, references,\n"
	  "prefix index) and prints \"ok\" or the problems it found. Exits 1 when the\n"
	  "check finds a problem.\n" },
	{ "metrics", cmd_metrics, 0, "", "Prometheus text exposition",
	  "Prints the daemon's metrics in the Prometheus text format (0.0.4): pages,\n"
	  "sessions, requests, enospc, uptime, per pool blocks by state, allocations,\n"
	  "lookups, hits, evictions and dedups, per namespace usage, per tier. With -o\n"
	  "json, the same figures from the daemon's Stats reply: the document of\n"
	  "status -o json.\n" },
	{ "events", cmd_events, O_COUNT | O_EVENTS,
	  " [--endpoint E [--topic PREFIX] [--replay-endpoint R [--from SEQ]] [-n COUNT]]",
	  "KV-event counters, or follow the stream",
	  "Without --endpoint: the publisher's counters from the admin socket: batches\n"
	  "and events published; batches, events and bytes some subscriber had no room\n"
	  "for (a subscriber that stops reading is counted once, at the batch it\n"
	  "missed first: it then misses batches until it reads and sees the gap in the\n"
	  "sequence numbers); replay requests served, refused, cut short and\n"
	  "malformed, and the batches and bytes they asked for and did not get; the\n"
	  "replay buffer and the replay bytes in flight. With -o json, one document.\n\n"
	  "With --endpoint: subscribes to the KV events kvcached publishes\n"
	  "(docs/events.md) and prints one line per event: the batch's sequence\n"
	  "number and time, the topic\n"
	  "(kv@NODE@MODEL), the type (BlockStored, BlockRemoved, AllBlocksCleared), the\n"
	  "medium (GPU, CPU, STORAGE), the block hashes (the first 6 bytes of the first\n"
	  "four), the parent hash and the number of token ids. With -o json, one\n"
	  "compact JSON object per event and line, hashes in full. Talks to the\n"
	  "endpoints, not to the admin socket; Ctrl-C stops it.\n\n"
	  "  --endpoint E         the events_endpoint of the daemon (e.g.\n"
	  "                       ipc:///run/kvcached/events.sock)\n"
	  "  --topic PREFIX       only topics that start with PREFIX (default: all)\n"
	  "  --replay-endpoint R  first ask R (events_replay_endpoint) for the batches\n"
	  "                       still buffered from --from on\n"
	  "  --from SEQ           the first sequence number to replay (default 0)\n"
	  "  -n, --count COUNT    stop after COUNT batches\n" },
	{ "dump", cmd_dump, 0, "", "list every cached hash and its tiers",
	  "Lists every hash in the prefix index, one line per copy: pool id, tier (G1,\n"
	  "G2, G3) and the 32-byte hash in hex; a block with a host and a disk copy\n"
	  "has two lines. This is the set the KV events add up to. With -o json, an\n"
	  "array of {pool, tier, hash}. Read it while the daemon is idle: blocks that\n"
	  "move while it is paged through may be listed twice or missed.\n" },
	{ "top", cmd_top, O_COUNT | O_DELAY, " [-n COUNT] [-d SECONDS]", "live refreshing view",
	  "Shows the daemon's state, pools and clients with rates, refreshed every\n"
	  "SECONDS (default 2), until q or Ctrl-C on a terminal, or COUNT frames.\n"
	  "Not on a terminal, frames follow each other plainly; with -o json, one\n"
	  "compact JSON document per line and frame.\n\n"
	  "  -n, --count COUNT    stop after COUNT frames\n"
	  "  -d, --delay SECONDS  between frames (at least 0.1)\n" },
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *f)
{
	size_t i;

	fputs("Usage: kvctl [-s SOCKET] [-o human|json] COMMAND [OPTIONS]\n"
	      "\n"
	      "Operates a running kvcached daemon through its admin socket.\n"
	      "\n"
	      "Commands:\n", f);
	for (i = 0; i < NCOMMANDS; i++)
		fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].summary);
	fputs("  help      this help, or a command's (kvctl help COMMAND)\n"
	      "\n"
	      "Options:\n"
	      "  -s, --socket PATH    the daemon's admin socket (default: $KVCACHED_ADMIN_SOCKET,\n"
	      "                       else next to the worker socket: /run/kvcached/\n"
	      "                       kvcached-admin.sock for root, else $XDG_RUNTIME_DIR/\n"
	      "                       kvcached-admin.sock, or $KVCACHED_SOCKET with -admin.sock)\n"
	      "  -o, --output FORMAT  human (default) or json\n"
	      "  -h, --help           this help; COMMAND --help for a command's\n"
	      "  -V, --version        kvctl's version\n"
	      "\n"
	      "Exit status: 0 success, 1 failure (or problems found by check), 2 usage error.\n",
	      f);
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("kvctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("; try 'kvctl --help'\n", stderr);
	return 2;
}

/* A duration (units.h) of at most a day. */
static int parse_timeout(const char *s, uint64_t *ms)
{
	return kv_parse_duration(s, ms) < 0 || *ms > 86400000 ? -EINVAL : 0;
}

int main(int argc, char **argv)
{
	enum { OPT_POOL = 1000, OPT_ALL, OPT_TIMEOUT, OPT_WAIT, OPT_TIER, OPT_ENDPOINT,
	       OPT_REPLAY, OPT_FROM, OPT_TOPIC };
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "output", required_argument, NULL, 'o' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ "pool", required_argument, NULL, OPT_POOL },
		{ "all", no_argument, NULL, OPT_ALL },
		{ "timeout", required_argument, NULL, OPT_TIMEOUT },
		{ "wait", no_argument, NULL, OPT_WAIT },
		{ "tier", required_argument, NULL, OPT_TIER },
		{ "count", required_argument, NULL, 'n' },
		{ "delay", required_argument, NULL, 'd' },
		{ "endpoint", required_argument, NULL, OPT_ENDPOINT },
		{ "replay-endpoint", required_argument, NULL, OPT_REPLAY },
		{ "from", required_argument, NULL, OPT_FROM },
		{ "topic", required_argument, NULL, OPT_TOPIC },
		{ 0 },
	};
	static const struct { unsigned bit; const char *name; } optnames[] = {
		{ O_POOL, "--pool" }, { O_ALL, "--all" }, { O_TIMEOUT, "--timeout" },
		{ O_WAIT, "--wait" }, { O_COUNT, "--count" }, { O_DELAY, "--delay" },
		{ O_TIER, "--tier" }, { O_EVENTS, "--endpoint, --replay-endpoint, --from, --topic" },
	};
	const struct kvc_options copt = { .client_name = "kvctl" };
	struct args a = { .fmt = FMT_HUMAN, .delay = 2.0 };
	static const struct command events_stats = { .name = "events", .run = cmd_events_stats };
	const struct command *cmd = NULL;
	char def[108], wdef[108], *what, *end;
	bool help = false;
	kvc_conn *c = NULL;
	unsigned long v;
	int o, r, ret;
	size_t i;

	opterr = 0;
	while ((o = getopt_long(argc, argv, ":s:o:hVn:d:", opts, NULL)) != -1) {
		switch (o) {
		case 's':
			a.sock = optarg;
			break;
		case 'o':
			if (!strcmp(optarg, "human"))
				a.fmt = FMT_HUMAN;
			else if (!strcmp(optarg, "json"))
				a.fmt = FMT_JSON;
			else
				return usage_error("unknown output format '%s' (human or json)",
						   optarg);
			break;
		case 'h':
			help = true;
			break;
		case 'V':
			printf("kvctl %s\n", KV_VERSION);
			return 0;
		case OPT_POOL:
			errno = 0;
			v = strtoul(optarg, &end, 10);
			if (errno || end == optarg || *end || optarg[0] == '-' || v > 4095)
				return usage_error("--pool '%s': a pool id from 0 to 4095", optarg);
			a.pool = (uint32_t)v;
			a.used |= O_POOL;
			break;
		case OPT_ALL:
			a.used |= O_ALL;
			break;
		case OPT_TIMEOUT:
			if (parse_timeout(optarg, &a.timeout_ms) < 0)
				return usage_error("--timeout '%s': a duration like 500ms, 30s or 2m "
						   "(at most 24h)", optarg);
			a.used |= O_TIMEOUT;
			break;
		case OPT_WAIT:
			a.used |= O_WAIT;
			break;
		case OPT_TIER:
			if (strlen(optarg) != 2 || (optarg[0] != 'g' && optarg[0] != 'G') ||
			    optarg[1] < '1' || optarg[1] > '3')
				return usage_error("--tier '%s': g1, g2 or g3", optarg);
			a.tier = optarg[1] - '1';
			a.used |= O_TIER;
			break;
		case 'n':
			errno = 0;
			v = strtoul(optarg, &end, 10);
			if (errno || end == optarg || *end || optarg[0] == '-' || v < 1 ||
			    v > 100000000)
				return usage_error("-n '%s': a count of frames, at least 1", optarg);
			a.count = (long)v;
			a.used |= O_COUNT;
			break;
		case 'd':
			errno = 0;
			a.delay = strtod(optarg, &end);
			if (errno || end == optarg || *end || !isfinite(a.delay) || a.delay < 0.1 ||
			    a.delay > 86400)
				return usage_error("-d '%s': seconds between frames, from 0.1", optarg);
			a.used |= O_DELAY;
			break;
		case OPT_ENDPOINT:
			a.endpoint = optarg;
			a.used |= O_EVENTS;
			break;
		case OPT_REPLAY:
			a.replay_endpoint = optarg;
			a.used |= O_EVENTS;
			break;
		case OPT_TOPIC:
			a.topic_filter = optarg;
			a.used |= O_EVENTS;
			break;
		case OPT_FROM:
			errno = 0;
			a.from = strtoull(optarg, &end, 10);
			if (errno || end == optarg || *end || optarg[0] == '-')
				return usage_error("--from '%s': a sequence number", optarg);
			a.used |= O_EVENTS;
			break;
		case ':':
			return usage_error("option '%s' needs an argument", argv[optind - 1]);
		default:
			return usage_error("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc) {
		if (!strcmp(argv[optind], "help")) {
			help = true;
			if (optind + 1 < argc)
				a.topic = argv[optind + 1];
			if (optind + 2 < argc)
				return usage_error("help takes one command");
			optind = argc;
		} else {
			a.topic = argv[optind++];
		}
		if (a.topic) {
			for (i = 0; i < NCOMMANDS; i++)
				if (!strcmp(a.topic, commands[i].name))
					cmd = &commands[i];
			if (!cmd)
				return usage_error("unknown command '%s'", a.topic);
		}
		if (optind < argc)
			return usage_error("unexpected argument '%s' for %s", argv[optind],
					   cmd->name);
	}
	if (help) {
		if (cmd)
			printf("Usage: kvctl [-s SOCKET] [-o human|json] %s%s\n\n%s", cmd->name,
			       cmd->args, cmd->help);
		else
			usage(stdout);
		return 0;
	}
	if (!cmd)
		return usage_error("no command given");
	for (i = 0; i < sizeof(optnames) / sizeof(optnames[0]); i++)
		if ((a.used & optnames[i].bit) && !(cmd->opts & optnames[i].bit))
			return usage_error("%s does not take %s", cmd->name, optnames[i].name);
	if (cmd->run == cmd_evict && !(a.used & (O_POOL | O_ALL | O_TIER)))
		return usage_error("evict needs --pool ID, --all or --tier TIER");
	if (cmd->run == cmd_evict && (a.used & O_POOL) && (a.used & O_ALL))
		return usage_error("evict takes --pool ID or --all, not both");
	if (cmd->run == cmd_events && !a.endpoint) {
		/* Without an endpoint: the counters, from the admin socket. */
		if (a.used & O_EVENTS)
			return usage_error("events: --topic, --replay-endpoint and --from need "
					   "--endpoint");
		if (a.used & O_COUNT)
			return usage_error("events: -n needs --endpoint");
		cmd = &events_stats;
	} else if (cmd->run == cmd_events) {
		/* The event endpoints, not the admin socket. */
		ret = cmd_events(NULL, &a);
		fflush(stdout);
		return ret;
	}

	if (!a.sock) {
		r = kvc_default_socket(wdef, sizeof(wdef));
		if (r == 0)
			r = kv_admin_socket_default(wdef, def, sizeof(def));
		if (r < 0) {
			fprintf(stderr, "kvctl: socket path: %s\n", kvc_strerror(r));
			return 1;
		}
		a.sock = def;
	}
	r = kvc_connect(a.sock, &copt, &c);
	if (r < 0) {
		what = xasprintf("connect %s", a.sock);
		fail(NULL, what, r);
		free(what);
		return 1;
	}
	ret = cmd->run(c, &a);
	kvc_close(c);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "kvctl: writing output: %s\n", strerror(errno));
		return 1;
	}
	return ret;
}
