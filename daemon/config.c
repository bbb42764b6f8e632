/* The configuration table, its parsers and the INI file; see config.h. One
 * file over 800 lines, most of it the table: every key's row, parser and
 * the rules between keys belong together. */
#include "config.h"
#include "kverr.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <ini.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/sysinfo.h>

#include "backend.h"
#include "frame.h"
#include "http.h"
#include "kvconfig.h"
#include "log.h"
#include "pool.h"
#include "units.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define GiB (1ull << 30)

/* A SIZE_PCT value before kv_config_finish(): this bit and hundredths of a
 * percent (90% = 9000). No real size comes near bit 63. */
#define PCT_BIT (1ull << 63)

const struct kv_cfg_key kv_cfg_keys[] = {
	{ "socket", 's', KV_CFG_STRING, KV_CFG_FIELD(socket_path), 0, 0, 0, "",
	  "worker socket path (default: $KVCACHED_SOCKET, else /run/kvcached/kvcached.sock "
	  "for root, else $XDG_RUNTIME_DIR/kvcached.sock)", NULL },
	{ "socket_mode", 0, KV_CFG_MODE, KV_CFG_FIELD(socket_mode), 0, 0, 0, "0660",
	  "octal permissions of the worker socket file", NULL },
	{ "socket_group", 0, KV_CFG_GROUP, KV_CFG_FIELD(socket_group), 0, 0, 0, "",
	  "group of the worker socket file (default: the daemon's group)", NULL },
	{ "admin_socket", 0, KV_CFG_STRING, KV_CFG_FIELD(admin_socket_path), 0, 0, 0, "",
	  "admin socket path (default: $KVCACHED_ADMIN_SOCKET, else the worker path with "
	  "-admin.sock for .sock)", NULL },
	{ "admin_socket_mode", 0, KV_CFG_MODE, KV_CFG_FIELD(admin_socket_mode), 0, 0, 0, "0600",
	  "octal permissions of the admin socket file", NULL },
	{ "admin_socket_group", 0, KV_CFG_GROUP, KV_CFG_FIELD(admin_socket_group), 0, 0, 0, "",
	  "group of the admin socket file (default: the daemon's group)", NULL },
	{ "worker_socket_admin", 0, KV_CFG_BOOL, KV_CFG_FIELD(worker_socket_admin), KV_CFG_RELOAD,
	  0, 0, "yes",
	  "whether root and the daemon's uid may use admin operations on the worker socket", NULL },
	{ "backend", 'b', KV_CFG_CHOICE, KV_CFG_FIELD(backend), 0, 0, 0, "host",
	  "memory backend: host (memfd segments), or cuda (every visible GPU, pool_size on each)",
	  "host|cuda" },
	{ "pool_size", 'p', KV_CFG_SIZE_PCT, KV_CFG_FIELD(pool_bytes), 0, 4 * KiB, 0, "1GiB",
	  "KV memory per device: a size, or a percentage of device memory (host backend: of RAM)",
	  NULL },
	{ "segment_size", 0, KV_CFG_SIZE, KV_CFG_FIELD(segment_bytes), 0, 4 * KiB, 0, "",
	  "unit of export to clients and of ownership by a namespace (default: "
	  "the pool / 64, at most 1GiB, at least a page)", NULL },
	{ "page_size", 0, KV_CFG_SIZE, KV_CFG_FIELD(page_bytes), 0, 4 * KiB, 0, "2MiB",
	  "unit of assignment to pools, a multiple of 4KiB", NULL },
	{ "max_frame", 0, KV_CFG_SIZE, KV_CFG_FIELD(max_frame), 0, 4 * KiB, GiB, "4MiB",
	  "largest protocol frame", NULL },
	{ "max_batch", 0, KV_CFG_UINT, KV_CFG_FIELD(max_batch), 0, 1, 1u << 20, "65536",
	  "most blocks or hashes in one request", NULL },
	/* The limits on what one client may take (docs/operations.md, section 13). */
	{ "max_block_refs", 0, KV_CFG_UINT, KV_CFG_FIELD(max_block_refs), KV_CFG_RELOAD,
	  1, KV_BLOCK_REF_MAX, "1073741824",
	  "most references one block may carry; a fork, lookup or seal that would take more is "
	  "refused (EQUOTA)", NULL },
	{ "max_connections", 0, KV_CFG_UINT, KV_CFG_FIELD(max_connections), KV_CFG_RELOAD,
	  1, 1u << 20, "1024",
	  "most connections open on the worker socket (the admin socket has 64 of its own)", NULL },
	{ "max_connections_per_uid", 0, KV_CFG_UINT, KV_CFG_FIELD(max_connections_per_uid),
	  KV_CFG_RELOAD, 1, 1u << 20, "256",
	  "most connections one uid may have open on the worker socket", NULL },
	{ "frame_timeout", 0, KV_CFG_DURATION, KV_CFG_FIELD(frame_timeout_ms), KV_CFG_RELOAD,
	  0, 3600000, "30s",
	  "a connection whose frame stays incomplete for longer is closed (0: never)", NULL },
	{ "max_output_per_connection", 0, KV_CFG_SIZE, KV_CFG_FIELD(max_output_bytes),
	  KV_CFG_RELOAD, 64 * KiB, GiB, "8MiB",
	  "replies a client has not read past which the daemon stops reading its requests", NULL },
	{ "max_fds_per_connection", 0, KV_CFG_UINT, KV_CFG_FIELD(max_fds_per_conn), KV_CFG_RELOAD,
	  1, 1u << 20, "256",
	  "segment fds sent to one client and not read yet past which its requests that need more "
	  "wait until it reads", NULL },
	{ "max_fds_in_flight", 0, KV_CFG_UINT, KV_CFG_FIELD(max_fds_in_flight), KV_CFG_RELOAD,
	  0, UINT32_MAX, "0",
	  "segment fds sent to all clients and not read yet past which a request that needs more "
	  "is refused (EAGAIN); 0: as many as RLIMIT_NOFILE leaves", NULL },
	{ "max_fds_per_uid", 0, KV_CFG_UINT, KV_CFG_FIELD(max_fds_per_uid), KV_CFG_RELOAD,
	  0, UINT32_MAX, "0",
	  "segment fds sent to all connections of one uid and not read yet past which a request "
	  "of that uid that needs more is refused (EAGAIN), unless the uid has none out; 0: half "
	  "of max_fds_in_flight (or of what RLIMIT_NOFILE leaves)", NULL },
	{ "max_memory_per_uid", 0, KV_CFG_SIZE, KV_CFG_FIELD(max_memory_per_uid), KV_CFG_RELOAD, 0,
	  0, "256MiB", "input and output buffers all connections of one uid may hold; past it "
	  "that uid's newest connection is closed (0: no bound)", NULL },
	{ "max_connection_memory", 0, KV_CFG_SIZE, KV_CFG_FIELD(max_connection_memory),
	  KV_CFG_RELOAD, 0, 0, "1GiB", "input and output buffers all connections may hold; past it "
	  "the newest connection of the uid whose connection grows is closed (0: no bound)",
	  NULL },
	{ "log_level", 'l', KV_CFG_LOG_LEVEL, KV_CFG_FIELD(log_level), KV_CFG_RELOAD, 0, 0, "info",
	  "least severe messages logged: err, warn, info or debug", NULL },
	{ "log_target", 0, KV_CFG_CHOICE, KV_CFG_FIELD(log_target), KV_CFG_RELOAD, 0, 0, "auto",
	  "where logs go: auto (the journal when stderr is connected to it), stderr, journal",
	  "auto|stderr|journal" },
	{ "drain_timeout", 0, KV_CFG_DURATION, KV_CFG_FIELD(drain_timeout_ms), KV_CFG_RELOAD,
	  0, KV_DRAIN_TIMEOUT_MAX_MS, "30s",
	  "on SIGTERM, how long clients may keep working before the daemon exits (0: at once)",
	  NULL },
	{ "status_interval", 0, KV_CFG_DURATION, KV_CFG_FIELD(status_interval_ms), KV_CFG_RELOAD,
	  0, 3600000, "5s", "how often the systemd STATUS= line is refreshed (0: never)", NULL },
	/* Bounds on what clients may make the daemon hold (docs/operations.md,
	 * "Limits on pools, layouts, swap and replies"). */
	{ "max_layout_bytes", 0, KV_CFG_SIZE, KV_CFG_FIELD(max_layout_bytes), KV_CFG_RELOAD, 0, GiB,
	  "64KiB", "largest layout description a RegisterPool may carry (kept while the pool lives)",
	  NULL },
	{ "max_pools_per_namespace", 0, KV_CFG_UINT, KV_CFG_FIELD(max_pools_per_namespace),
	  KV_CFG_RELOAD, 1, 4096, "64", "most pools one namespace may have at once", NULL },
	{ "max_swap_per_session", 0, KV_CFG_SIZE, KV_CFG_FIELD(max_swap_per_session), KV_CFG_RELOAD,
	  0, 0, "4GiB", "most block bytes one connection may hold swapped out to the host tier",
	  NULL },
	/* The lower tiers (tier.h, docs/tiers.md). The watermarks are not
	 * reloadable yet: kv_tiers keeps its own copy (see apply_config()). */
	{ "host_tier_size", 0, KV_CFG_SIZE_PCT, KV_CFG_FIELD(tiers.host_bytes), KV_CFG_PCT_RAM, 0, 0,
	  "0", "G2: host memory for blocks demoted from the device, a size or a percentage of RAM "
	  "(0: no lower tiers)", NULL },
	{ "disk_path", 0, KV_CFG_STRING, KV_CFG_FIELD(tiers.disk_path), 0, 0, 0, "",
	  "G3: file or block device for blocks demoted from the host tier (default: none; needs "
	  "host_tier_size and disk_size)", NULL },
	{ "disk_size", 0, KV_CFG_SIZE, KV_CFG_FIELD(tiers.disk_bytes), 0, 0, 0, "0",
	  "G3 size (a file is preallocated to it)", NULL },
	{ "disk_index", 0, KV_CFG_STRING, KV_CFG_FIELD(tiers.disk_index), 0, 0, 0, "",
	  "G3 index journal (default: disk_path with .idx appended)", NULL },
	{ "disk_queue_depth", 0, KV_CFG_UINT, KV_CFG_FIELD(tiers.queue_depth), 0, 1, 4096, "64",
	  "G3 I/Os in flight; more wait in a queue", NULL },
	{ "demote_low", 0, KV_CFG_PERCENT, KV_CFG_FIELD(tiers.g1_low), 0, 0, 100, "10",
	  "demote cached device blocks when less than this percentage of a device is free", NULL },
	{ "demote_high", 0, KV_CFG_PERCENT, KV_CFG_FIELD(tiers.g1_high), 0, 0, 100, "20",
	  "... until this percentage is free", NULL },
	{ "writeback_low", 0, KV_CFG_PERCENT, KV_CFG_FIELD(tiers.g2_low), 0, 0, 100, "10",
	  "write host-tier blocks to disk when less than this percentage of it is free or clean",
	  NULL },
	{ "writeback_high", 0, KV_CFG_PERCENT, KV_CFG_FIELD(tiers.g2_high), 0, 0, 100, "25",
	  "... until this percentage is", NULL },
	/* G4, a Redis Cluster shared by a fleet (docs/g4.md); not reloadable. */
	{ "remote_seeds", 0, KV_CFG_STRING, KV_CFG_FIELD(tiers.remote_seeds), 0, 0, 0, "",
	  "G4: Redis Cluster nodes to learn the cluster from, host:port[,host:port...] (default: "
	  "none, no G4; needs host_tier_size)", NULL },
	{ "remote_prefix", 0, KV_CFG_STRING, KV_CFG_FIELD(tiers.remote_prefix), 0, 0, 0, "kvc",
	  "G4: the prefix of every key kvcached writes", NULL },
	{ "remote_ttl", 0, KV_CFG_DURATION, KV_CFG_FIELD(tiers.remote_ttl_ms), 0, 1000,
	  2592000000ull, "1h", "G4: how long a block stays in the cluster after it was written",
	  NULL },
	{ "remote_timeout", 0, KV_CFG_DURATION, KV_CFG_FIELD(tiers.remote_timeout_ms), 0, 1, 60000,
	  "200ms", "G4: how long a cluster node may stay silent before its keys are misses", NULL },
	{ "remote_user", 0, KV_CFG_STRING, KV_CFG_FIELD(tiers.remote_user), 0, 0, 0, "",
	  "G4: the ACL user kvcached authenticates as (default: none)", NULL },
	{ "remote_password_file", 0, KV_CFG_STRING, KV_CFG_FIELD(tiers.remote_password_file), 0,
	  0, 0, "", "G4: a file holding the password (default: no AUTH)", NULL },
	{ "remote_write", 0, KV_CFG_CHOICE, KV_CFG_FIELD(tiers.remote_write), 0, 0, 0,
	  "writeback", "G4: when blocks are written to the cluster: writeback (when they are "
	  "written back to disk, or dropped from the host tier without one), demote (when they "
	  "come down into the host tier) or off (this node only reads); a namespace may say "
	  "otherwise", "writeback|demote|off" },
	{ "remote_write_rate", 0, KV_CFG_SIZE, KV_CFG_FIELD(tiers.remote_write_rate), 0, 0, 0,
	  "0", "G4: bytes per second written to the cluster at most; past it blocks are not "
	  "written (counted; 0: no limit)", NULL },
	{ "remote_max_inflight", 0, KV_CFG_SIZE, KV_CFG_FIELD(tiers.remote_max_inflight), 0,
	  1048576, 0, "64MiB", "G4: block bytes queued for the cluster at most (and the write "
	  "buffers kept idle for the next writes count in it); past it blocks are not written "
	  "(counted)", NULL },
	/* G4 against nodes that drip and values that lie (issue 36). */
	{ "remote_min_rate", 0, KV_CFG_SIZE, KV_CFG_FIELD(tiers.remote_min_rate), 0, 1024, 0,
	  "1MiB", "G4: bytes per second a cluster node must send or accept at least, after "
	  "remote_timeout; a slower one's keys are misses and it is left alone for a while", NULL },
	{ "remote_fetch_timeout", 0, KV_CFG_DURATION, KV_CFG_FIELD(tiers.remote_fetch_timeout_ms), 0,
	  1, 600000, "2s", "G4: a read (up to 64 blocks, and the slot map) ends within this "
	  "whatever the cluster sends; what did not come is a miss", NULL },
	{ "remote_readers", 0, KV_CFG_UINT, KV_CFG_FIELD(tiers.remote_readers), 0, 1, 16, "2",
	  "G4: threads that read from the cluster, each with connections of its own (a fetch "
	  "held by a slow node holds one)", NULL },
	{ "remote_auth", 0, KV_CFG_CHOICE, KV_CFG_FIELD(tiers.remote_auth), 0, 0, 0, "required",
	  "G4: required (a namespace with remote = yes needs remote_key_file: values without a "
	  "valid HMAC tag are never served) or off (header and CRC32C only; warned at start); a "
	  "namespace may say otherwise", "required|off" },
	/* A write batch's whole-call deadline: a node that answers just above
	 * remote_min_rate for ever does not hold the write thread. */
	{ "remote_write_timeout", 0, KV_CFG_DURATION, KV_CFG_FIELD(tiers.remote_write_timeout_ms), 0,
	  1, 600000, "10s", "G4: a batch of writes (up to 256 blocks, and the slot map) ends "
	  "within this whatever the cluster does; what is not answered then is a write error, "
	  "the block stays where it was", NULL },
	/* Prometheus over HTTP (http.h, docs/operations.md "Scraping metrics
	 * over HTTP"). */
	{ "metrics_listen", 0, KV_CFG_STRING, KV_CFG_FIELD(metrics_listen), 0, 0, 0, "",
	  "HOST:PORT (or [IPv6]:PORT) where GET /metrics answers over HTTP, e.g. 127.0.0.1:9464 "
	  "(default: off; a socket named metrics from systemd is used instead)", NULL },
	{ "metrics_min_interval", 0, KV_CFG_DURATION, KV_CFG_FIELD(metrics_min_interval_ms), 0, 0,
	  60000, "1s", "GET /metrics: the exposition is built at most this often, off the HTTP "
	  "thread; scrapes in between share the last one (0: one build per scrape burst)", NULL },
	{ "metrics_header_timeout", 0, KV_CFG_DURATION, KV_CFG_FIELD(metrics_header_timeout_ms), 0,
	  100, 60000, "2s", "GET /metrics: an HTTP connection whose request is not whole this long "
	  "after it was accepted is closed", NULL },
	{ "metrics_max_connections", 0, KV_CFG_UINT, KV_CFG_FIELD(metrics_max_connections), 0, 1,
	  4096, "64", "GET /metrics: HTTP connections open at once; past it the oldest one still "
	  "sending its request is closed for the newcomer", NULL },
	{ "metrics_max_connections_per_address", 0, KV_CFG_UINT,
	  KV_CFG_FIELD(metrics_max_connections_per_address), 0, 1, 4096, "16",
	  "GET /metrics: HTTP connections from one peer address at once (same rule)", NULL },
	{ "loop_lag_warn", 0, KV_CFG_DURATION, KV_CFG_FIELD(loop_lag_warn_ms), 0, 0, 3600000,
	  "100ms", "an event loop turn that takes longer is logged, at most one line every 10 s "
	  "(all turns: kvcached_loop_lag_seconds; 0: never logged)", NULL },
	/* KV events (events.h, docs/events.md); not reloadable. */
	{ "events_endpoint", 0, KV_CFG_STRING, KV_CFG_FIELD(events_endpoint), 0, 0, 0, "",
	  "ZeroMQ endpoint the KV events are published on, e.g. ipc:///run/kvcached/events.sock "
	  "or tcp://127.0.0.1:5557 (default: none, no events)", NULL },
	{ "events_connect", 0, KV_CFG_BOOL, KV_CFG_FIELD(events_connect), 0, 0, 0, "no",
	  "connect the publisher to events_endpoint (a subscriber that binds, as llm-d's indexer "
	  "does) instead of binding it", NULL },
	{ "events_replay_endpoint", 0, KV_CFG_STRING, KV_CFG_FIELD(events_replay_endpoint), 0, 0, 0,
	  "", "ZeroMQ ROUTER endpoint where subscribers ask for the batches they missed "
	  "(default: none)", NULL },
	{ "events_buffer", 0, KV_CFG_UINT, KV_CFG_FIELD(events_buffer), 0, 1, 1u << 20, "1000",
	  "event batches kept for replay", NULL },
	{ "events_hwm", 0, KV_CFG_UINT, KV_CFG_FIELD(events_hwm), 0, 1, 1u << 24, "10000",
	  "batches queued for one subscriber past which it misses batches (counted as dropped)",
	  NULL },
	{ "events_subscriber_max_bytes", 0, KV_CFG_SIZE, KV_CFG_FIELD(events_subscriber_max_bytes), 0,
	  1048576, 0, "64MiB", "a subscriber's queue holds no more batches than this many bytes of "
	  "full ones (64 KiB each; at least 16, at most events_hwm); past it it misses batches "
	  "(counted as dropped)", NULL },
	{ "events_replay_max_bytes", 0, KV_CFG_SIZE, KV_CFG_FIELD(events_replay_max_bytes), 0,
	  65536, 0, "64MiB", "bytes of replayed batches queued for all replay peers at once (each "
	  "peer one replay at a time); past it a replay gets the end marker alone (counted)",
	  NULL },
	{ "events_interval", 0, KV_CFG_DURATION, KV_CFG_FIELD(events_interval_ms), 0, 0, 1000,
	  "1ms", "events are sent at most this long after they happen, in one batch per topic "
	  "(0: at the end of each loop iteration)", NULL },
	{ "events_token_ids", 0, KV_CFG_BOOL, KV_CFG_FIELD(events_token_ids), 0, 0, 0, "no",
	  "publish the token ids Seals carry (prompt content: docs/security.md); a [namespace] "
	  "section's events key overrides it", NULL },
	{ "events_hash_format", 0, KV_CFG_CHOICE, KV_CFG_FIELD(events_hash_format), 0, 0, 0,
	  "int", "block hashes in events: int (the last 8 bytes, big endian: vLLM's default, "
	  "what Dynamo and SGLang read) or bytes (all 32)", "bytes|int" },
	{ "events_dp_rank", 0, KV_CFG_UINT, KV_CFG_FIELD(events_dp_rank), 0, 0, 1u << 16, "0",
	  "data_parallel_rank of every event batch (vLLM's KVEventBatch), the engine rank whose "
	  "blocks this daemon announces", NULL },
	{ "events_buffer_max_bytes", 0, KV_CFG_SIZE, KV_CFG_FIELD(events_buffer_max_bytes), 0,
	  65536, 0, "64MiB", "bytes of event batches kept for replay (with events_buffer: "
	  "the older of the two bounds drops the oldest batch)", NULL },
	{ "node_name", 0, KV_CFG_STRING, KV_CFG_FIELD(node_name), 0, 0, 0, "",
	  "this node in event topics kv@NODE@MODEL (default: the host name)", NULL },
};

const size_t kv_cfg_nkeys = sizeof(kv_cfg_keys) / sizeof(kv_cfg_keys[0]);

/* The tiers' settings before the table's defaults apply (G2 off). */
static void tiers_config_defaults(struct kv_tiers_config *c)
{
	memset(c, 0, sizeof(*c));
	c->queue_depth = 64;
	c->g1_low = 10;
	c->g1_high = 20;
	c->g2_low = 10;
	c->g2_high = 25;
}

const struct kv_cfg_key *kv_config_key(const char *name)
{
	size_t i, j;

	for (i = 0; i < kv_cfg_nkeys; i++) {
		const char *k = kv_cfg_keys[i].name;

		for (j = 0; k[j] && (name[j] == k[j] || (name[j] == '-' && k[j] == '_')); j++)
			;
		if (!k[j] && !name[j])
			return &kv_cfg_keys[i];
	}
	return NULL;
}

/* ---- values ------------------------------------------------------------- */

static int parse_bool(const char *s, int *out)
{
	static const char *const yes[] = { "yes", "true", "on", "1" };
	static const char *const no[] = { "no", "false", "off", "0" };
	size_t i;

	for (i = 0; i < 4; i++) {
		if (!strcasecmp(s, yes[i])) {
			*out = 1;
			return 0;
		}
		if (!strcasecmp(s, no[i])) {
			*out = 0;
			return 0;
		}
	}
	return -EINVAL;
}

static int choice_ok(const char *choices, const char *s)
{
	size_t n = strlen(s);
	const char *p = choices;

	while (n && *p) {
		const char *bar = strchr(p, '|');
		size_t len = bar ? (size_t)(bar - p) : strlen(p);

		if (len == n && !strncmp(p, s, n))
			return 1;
		p += len + (bar ? 1 : 0);
	}
	return 0;
}

/* "2MiB" for exact multiples, else the bytes. */
static void format_size(uint64_t v, char *buf, size_t len)
{
	static const char *const unit[] = { "KiB", "MiB", "GiB", "TiB" };
	int u;

	for (u = 3; u >= 0; u--) {
		uint64_t m = 1ull << (10 * (u + 1));

		if (v && v % m == 0) {
			snprintf(buf, len, "%" PRIu64 "%s", v / m, unit[u]);
			return;
		}
	}
	snprintf(buf, len, "%" PRIu64, v);
}

static void format_duration(uint64_t ms, char *buf, size_t len)
{
	if (ms && ms % 3600000 == 0)
		snprintf(buf, len, "%" PRIu64 "h", ms / 3600000);
	else if (ms && ms % 60000 == 0)
		snprintf(buf, len, "%" PRIu64 "m", ms / 60000);
	else if (ms % 1000 == 0)
		snprintf(buf, len, "%" PRIu64 "s", ms / 1000);
	else
		snprintf(buf, len, "%" PRIu64 "ms", ms);
}

/* What a key of type t accepts, for error messages. */
static void allowed(const struct kv_cfg_key *k, char *buf, size_t len)
{
	char lo[32], hi[32];

	switch (k->type) {
	case KV_CFG_SIZE:
	case KV_CFG_SIZE_PCT:
		format_size(k->min, lo, sizeof(lo));
		format_size(k->max, hi, sizeof(hi));
		snprintf(buf, len, "a size with an optional unit (4096, 64KiB, 2MiB, 8GiB)%s, "
			 "at least %s%s%s",
			 k->type == KV_CFG_SIZE_PCT
				 ? (k->flags & KV_CFG_PCT_RAM ? " or a percentage of RAM (50%)"
							      : " or a percentage of device memory (90%)")
				 : "",
			 lo, k->max ? " and at most " : "", k->max ? hi : "");
		break;
	case KV_CFG_UINT:
		snprintf(buf, len, "a whole number from %" PRIu64 " to %" PRIu64, k->min, k->max);
		break;
	case KV_CFG_STRING:
		snprintf(buf, len, "at most %zu bytes", k->size - 1);
		break;
	case KV_CFG_CHOICE:
		snprintf(buf, len, "one of %s", k->choices);
		break;
	case KV_CFG_MODE:
		snprintf(buf, len, "an octal mode from 0 to 0777, like 0660");
		break;
	case KV_CFG_GROUP:
		snprintf(buf, len, "an existing group name or a numeric gid, or empty");
		break;
	case KV_CFG_BOOL:
		snprintf(buf, len, "yes or no (true/false, on/off, 1/0)");
		break;
	case KV_CFG_DURATION:
		format_duration(k->max, hi, sizeof(hi));
		snprintf(buf, len, "a duration like 500ms, 30s, 2m or 1h (a bare number is seconds), "
			 "at most %s", hi);
		break;
	case KV_CFG_LOG_LEVEL:
		snprintf(buf, len, "err, warn, info or debug");
		break;
	case KV_CFG_PERCENT:
		snprintf(buf, len, "a percentage from %" PRIu64 " to %" PRIu64 ", like 10 or 10%%",
			 k->min, k->max);
		break;
	}
}

static int bad_value(const struct kv_cfg_key *k, const char *value, char *err, size_t errlen)
{
	char what[256];

	allowed(k, what, sizeof(what));
	return kv_einval(err, errlen, "%s: bad value '%s': allowed: %s", k->name, value, what);
}

int kv_config_set(struct kv_config *c, const struct kv_cfg_key *k, const char *value,
		  char *err, size_t errlen)
{
	void *field = (char *)c + k->offset;
	uint64_t v = 0;
	int b;
	char *end;

	/* An empty value brings back a computed default. */
	if (!value[0] && !k->def[0]) {
		memset(field, 0, k->size);
		return 0;
	}
	switch (k->type) {
	case KV_CFG_SIZE:
	case KV_CFG_SIZE_PCT:
		if (k->type == KV_CFG_SIZE_PCT && strchr(value, '%')) {
			if (kv_parse_pct(value, &v) < 0)
				return bad_value(k, value, err, errlen);
			v |= PCT_BIT;
		} else if (kv_parse_size(value, &v) < 0 || v < k->min || (k->max && v > k->max)) {
			return bad_value(k, value, err, errlen);
		}
		if (k->size == sizeof(uint32_t)) {
			if (v > UINT32_MAX)
				return bad_value(k, value, err, errlen);
			*(uint32_t *)field = (uint32_t)v;
		} else {
			*(uint64_t *)field = v;
		}
		return 0;
	case KV_CFG_UINT:
		errno = 0;
		v = strtoull(value, &end, 10);
		if (errno || end == value || *end || value[0] < '0' || value[0] > '9' ||
		    v < k->min || v > k->max || v > UINT32_MAX)
			return bad_value(k, value, err, errlen);
		*(uint32_t *)field = (uint32_t)v;
		return 0;
	case KV_CFG_STRING:
		if (strlen(value) >= k->size)
			return bad_value(k, value, err, errlen);
		snprintf(field, k->size, "%s", value);
		return 0;
	case KV_CFG_CHOICE:
		if (strlen(value) >= k->size || !choice_ok(k->choices, value))
			return bad_value(k, value, err, errlen);
		snprintf(field, k->size, "%s", value);
		return 0;
	case KV_CFG_MODE:
		errno = 0;
		v = strtoull(value, &end, 8);
		if (errno || end == value || *end || value[0] < '0' || value[0] > '7' || v > 0777)
			return bad_value(k, value, err, errlen);
		*(unsigned *)field = (unsigned)v;
		return 0;
	case KV_CFG_GROUP:
		if (strlen(value) >= k->size)
			return bad_value(k, value, err, errlen);
		if (value[0]) {
			errno = 0;
			v = strtoull(value, &end, 10);
			if ((value[0] < '0' || value[0] > '9' || *end || errno || v >= UINT32_MAX) &&
			    !getgrnam(value))
				return bad_value(k, value, err, errlen);
		}
		snprintf(field, k->size, "%s", value);
		return 0;
	case KV_CFG_BOOL:
		if (parse_bool(value, &b) < 0)
			return bad_value(k, value, err, errlen);
		*(int *)field = b;
		return 0;
	case KV_CFG_DURATION:
		if (kv_parse_duration(value, &v) < 0 || v < k->min || (k->max && v > k->max))
			return bad_value(k, value, err, errlen);
		*(uint64_t *)field = v;
		return 0;
	case KV_CFG_LOG_LEVEL:
		b = kv_log_parse_level(value);
		if (b < 0)
			return bad_value(k, value, err, errlen);
		*(int *)field = b;
		return 0;
	case KV_CFG_PERCENT:
		errno = 0;
		v = strtoull(value, &end, 10);
		if (*end == '%')
			end++;
		if (errno || end == value || *end || value[0] < '0' || value[0] > '9' ||
		    v < k->min || v > k->max)
			return bad_value(k, value, err, errlen);
		*(unsigned *)field = (unsigned)v;
		return 0;
	}
	return bad_value(k, value, err, errlen);
}

void kv_config_format(const struct kv_config *c, const struct kv_cfg_key *k, char *buf,
		      size_t len)
{
	const void *field = (const char *)c + k->offset;
	static const char *const levels[] = { "", "", "", "err", "warn", "5", "info",
					      "debug" };
	uint64_t v;

	switch (k->type) {
	case KV_CFG_SIZE:
	case KV_CFG_SIZE_PCT:
		v = k->size == sizeof(uint32_t) ? *(const uint32_t *)field : *(const uint64_t *)field;
		if (k->type == KV_CFG_SIZE_PCT && (v & PCT_BIT)) {
			v &= ~PCT_BIT;
			if (v % 100)
				snprintf(buf, len, "%" PRIu64 ".%02" PRIu64 "%%", v / 100, v % 100);
			else
				snprintf(buf, len, "%" PRIu64 "%%", v / 100);
		} else {
			format_size(v, buf, len);
		}
		break;
	case KV_CFG_UINT:
		snprintf(buf, len, "%" PRIu32, *(const uint32_t *)field);
		break;
	case KV_CFG_STRING:
	case KV_CFG_CHOICE:
	case KV_CFG_GROUP:
		snprintf(buf, len, "%s", (const char *)field);
		break;
	case KV_CFG_MODE:
		snprintf(buf, len, "%04o", *(const unsigned *)field);
		break;
	case KV_CFG_BOOL:
		snprintf(buf, len, "%s", *(const int *)field ? "yes" : "no");
		break;
	case KV_CFG_DURATION:
		format_duration(*(const uint64_t *)field, buf, len);
		break;
	case KV_CFG_LOG_LEVEL:
		snprintf(buf, len, "%s", levels[*(const int *)field & 7]);
		break;
	case KV_CFG_PERCENT:
		snprintf(buf, len, "%u%%", *(const unsigned *)field);
		break;
	}
}

void kv_config_defaults(struct kv_config *c)
{
	size_t i;

	memset(c, 0, sizeof(*c));
	/* Fields of the tiers' that have no key get the tiers' defaults. */
	tiers_config_defaults(&c->tiers);
	for (i = 0; i < kv_cfg_nkeys; i++) {
		const struct kv_cfg_key *k = &kv_cfg_keys[i];

		/* An empty default is computed in finish; the table's defaults
		 * are valid (the config test runs every one through here). */
		if (k->def[0] && kv_config_set(c, k, k->def, NULL, 0) < 0)
			abort();
	}
}

/* ---- the file ----------------------------------------------------------- */

struct load_ctx {
	struct kv_config *c;
	FILE *f;
	int line;          /* of the line last read */
	int err_line;      /* of the first error we reported, 0 if none */
	char err[512];
};

/* fgets that counts lines for the handler's messages. A line longer than
 * inih's buffer is an error (its rest is skipped). */
static char *read_line(char *str, int num, void *stream)
{
	struct load_ctx *x = stream;
	char *r = fgets(str, num, x->f);
	size_t n;
	int ch;

	if (!r)
		return NULL;
	x->line++;
	n = strlen(str);
	if (n && str[n - 1] != '\n' && !feof(x->f)) {
		while ((ch = fgetc(x->f)) != EOF && ch != '\n')
			;
		if (!x->err_line) {
			x->err_line = x->line;
			snprintf(x->err, sizeof(x->err), "line longer than %d bytes", num - 2);
		}
		str[0] = '\0';
	}
	return r;
}

static int on_key(void *user, const char *section, const char *name, const char *value)
{
	struct load_ctx *x = user;
	const struct kv_cfg_key *k;

	if (x->err_line)
		return 1;   /* keep the first error only */
	if (!strncmp(section, "namespace ", 10)) {
		if (kv_nsconf_set(x->c, section + 10, name, value, x->err, sizeof(x->err)) < 0) {
			x->err_line = x->line;
			return 0;
		}
		return 1;
	}
	if (section[0] && strcmp(section, "kvcached")) {
		x->err_line = x->line;
		snprintf(x->err, sizeof(x->err), "unknown section [%s]: keys go at the top, under "
			 "[kvcached], or in a [namespace NAME] section", section);
		return 0;
	}
	k = kv_config_key(name);
	if (!k) {
		x->err_line = x->line;
		snprintf(x->err, sizeof(x->err), "unknown key '%s' (kvcached --help lists them)",
			 name);
		return 0;
	}
	if (kv_config_set(x->c, k, value, x->err, sizeof(x->err)) < 0) {
		x->err_line = x->line;
		return 0;
	}
	return 1;
}

int kv_config_load_file(struct kv_config *c, const char *path, char *err, size_t errlen)
{
	struct load_ctx x = { .c = c };
	int r;

	x.f = fopen(path, "re");
	if (!x.f) {
		r = -errno;
		kv_errf(err, errlen, "%s: %s", path, strerror(errno));
		return r;
	}
	r = ini_parse_stream(read_line, &x, on_key, &x);
	fclose(x.f);
	if (r == 0 && !x.err_line)
		return 0;
	if (r < 0)
		return kv_einval(err, errlen, "%s: cannot parse (out of memory)", path);
	if (x.err_line && (r == 0 || x.err_line <= r))
		return kv_einval(err, errlen, "%s:%d: %s", path, x.err_line, x.err);
	return kv_einval(err, errlen, "%s:%d: syntax error: expected 'key = value', '[section]' or "
		     "a comment", path, r);
}

/* ---- finishing ---------------------------------------------------------- */

/* What a default segment is made of: whole pages and, on the cuda backend,
 * whole KV_CUDA_SEGMENT_ALIGN (the VMM allocation granularity of every GPU
 * so far; the backend checks the device's own at start). */
static uint64_t seg_unit(const struct kv_config *c)
{
	uint64_t a = c->page_bytes, b = KV_CUDA_SEGMENT_ALIGN, t;

	if (strcmp(c->backend, "cuda"))
		return c->page_bytes;
	while (b) {  /* the least common multiple: page * align / gcd */
		t = a % b;
		a = b;
		b = t;
	}
	return c->page_bytes / a * KV_CUDA_SEGMENT_ALIGN;
}

int kv_config_memory(const char *backend, uint64_t *device_bytes, uint64_t *ram_bytes)
{
	struct sysinfo si;

	if (sysinfo(&si) < 0)
		return -errno;
	*ram_bytes = (uint64_t)si.totalram * si.mem_unit;
	/* The host backend's device is host memory; on cuda a percentage is
	 * of device 0's free memory at start (what the engines have not taken). */
	*device_bytes = *ram_bytes;
	if (!strcmp(backend, "cuda")) {
		uint64_t free_b = 0, total_b = 0;

		if (kv_backend_cuda_mem_info(0, &free_b, &total_b) < 0)
			return -ENODEV;
		*device_bytes = free_b;
	}
	return 0;
}

int kv_config_finish(struct kv_config *c, char *err, size_t errlen)
{
	const struct kv_cfg_key *pool_key = kv_config_key("pool_size");
	uint64_t dev_bytes = 0, ram_bytes = 0, pct = 0;
	char a[32], b[32];
	size_t i;
	int r;

	if (!c->socket_path[0] && kv_socket_default(c->socket_path, sizeof(c->socket_path)) < 0)
		return kv_einval(err, errlen, "socket: $KVCACHED_SOCKET is longer than %zu bytes",
			     sizeof(c->socket_path) - 1);
	if (!c->admin_socket_path[0] &&
	    kv_admin_socket_default(c->socket_path, c->admin_socket_path,
				    sizeof(c->admin_socket_path)) < 0)
		return kv_einval(err, errlen, "admin_socket: the default next to '%s' is longer than "
			     "%zu bytes; set admin_socket", c->socket_path,
			     sizeof(c->admin_socket_path) - 1);
	if (!strcmp(c->socket_path, c->admin_socket_path))
		return kv_einval(err, errlen, "admin_socket: '%s' is the worker socket too; give it "
			     "its own path", c->admin_socket_path);
	if ((r = kv_http_check_listen(c->metrics_listen, err, errlen)) < 0)
		return r;
	/* KV events (events.h). */
	if (!KV_HAVE_EVENTS && (c->events_endpoint[0] || c->events_replay_endpoint[0]))
		return kv_einval(err, errlen, "events_endpoint: this kvcached was built without KV "
			     "events (libzmq and msgpack-c; meson -Devents=enabled)");
	if (strchr(c->node_name, '@'))
		return kv_einval(err, errlen, "node_name: '%s' has an '@', which separates the parts "
			     "of an event topic", c->node_name);

	/* Percentages: of device memory, or of RAM for keys that say so. */
	for (i = 0; i < kv_cfg_nkeys; i++) {
		const struct kv_cfg_key *k = &kv_cfg_keys[i];
		uint64_t *v = (uint64_t *)((char *)c + k->offset), total, p;

		if (k->type != KV_CFG_SIZE_PCT || !(*v & PCT_BIT))
			continue;
		p = *v & ~PCT_BIT;
		if (!ram_bytes && (r = kv_config_memory(c->backend, &dev_bytes, &ram_bytes)) < 0)
			return kv_einval(err, errlen, "%s: cannot learn the memory size: %s", k->name,
				     strerror(-r));
		total = k->flags & KV_CFG_PCT_RAM ? ram_bytes : dev_bytes;
		if (!total)
			return kv_einval(err, errlen, "%s: the %s backend does not report its memory; "
				     "give a size", k->name, c->backend);
		if (k == pool_key)
			pct = p;
		/* Whole pages: every size key is at least one. */
		*v = (uint64_t)((unsigned __int128)total * p / 10000);
		*v -= *v % (4 * KiB);
		if (k == pool_key)
			*v -= *v % c->page_bytes;
		if (*v < k->min)
			return kv_einval(err, errlen, "%s: %" PRIu64 ".%02" PRIu64 "%% of %" PRIu64
				     " bytes is less than %" PRIu64 " bytes", k->name,
				     p / 100, p % 100, total, k->min);
	}

	if (c->page_bytes % (4 * KiB))
		return kv_einval(err, errlen, "page_size: %" PRIu64 " is not a multiple of 4KiB",
			     c->page_bytes);
	/* The default segment cuts the pool into KV_DEFAULT_SEGMENTS (at most
	 * 1GiB each, at least a unit, whole units of seg_unit): a segment belongs to one
	 * namespace at a time, so this is how many tenants can hold memory on a
	 * device at once. A pool given in bytes gets the largest such segment
	 * that divides it. */
	if (!c->segment_bytes && c->page_bytes) {
		uint64_t s = c->pool_bytes / KV_DEFAULT_SEGMENTS, u = seg_unit(c);

		s = s > GiB ? GiB : s;
		s -= s % u;
		if (s < u)
			s = u;
		while (!pct && s > u && c->pool_bytes % s)
			s -= u;
		c->segment_bytes = s;
	}
	/* A pool given as a percentage is rounded down to whole segments. */
	if (pct && c->pool_bytes % c->segment_bytes)
		c->pool_bytes -= c->pool_bytes % c->segment_bytes;
	if (!c->pool_bytes)
		return kv_einval(err, errlen, "pool_size: %" PRIu64 ".%02" PRIu64 "%% is less than one "
			     "segment", pct / 100, pct % 100);
	if (c->segment_bytes % c->page_bytes || c->pool_bytes % c->segment_bytes) {
		format_size(c->segment_bytes, a, sizeof(a));
		format_size(c->page_bytes, b, sizeof(b));
		return kv_einval(err, errlen, "pool_size, segment_size, page_size: the pool (%" PRIu64
			     " bytes) must be a multiple of the segment size (%s), and that of "
			     "the page size (%s)", c->pool_bytes, a, b);
	}
	if (c->pool_bytes / c->page_bytes > (1u << 20))
		return kv_einval(err, errlen, "pool_size, page_size: %" PRIu64 " pages, at most 1048576 "
			     "per device: use a larger page_size",
			     c->pool_bytes / c->page_bytes);
	if (c->tiers.disk_path[0] && (!c->tiers.disk_bytes || !c->tiers.host_bytes))
		return kv_einval(err, errlen, "disk_path, disk_size, host_tier_size: a disk tier (%s) "
			     "needs disk_size and a host tier (host_tier_size)", c->tiers.disk_path);
	if (c->tiers.g1_low > c->tiers.g1_high || c->tiers.g2_low > c->tiers.g2_high)
		return kv_einval(err, errlen, "demote_low, demote_high, writeback_low, writeback_high: "
			     "each low watermark must be at most its high one (%u%%..%u%%, "
			     "%u%%..%u%%)", c->tiers.g1_low, c->tiers.g1_high, c->tiers.g2_low,
			     c->tiers.g2_high);
	if ((r = kv_nsconf_finish(c, err, errlen)) < 0)
		return r;
	if ((uint64_t)c->max_batch * 40 + 4096 > c->max_frame)
		return kv_einval(err, errlen, "max_frame, max_batch: a max_frame of %" PRIu32 " is too "
			     "small for a max_batch of %" PRIu32 " (needs %" PRIu64 ")", c->max_frame,
			     c->max_batch, (uint64_t)c->max_batch * 40 + 4096);
	return 0;
}

/* ---- sources, printing, reloading ---------------------------------------- */

int kv_config_source_add(struct kv_config_source *src, const struct kv_cfg_key *k,
			 const char *value)
{
	struct kv_config_override *p = realloc(src->ov, (src->nov + 1) * sizeof(*p));

	if (!p)
		return -ENOMEM;
	src->ov = p;
	p[src->nov].key = k;
	p[src->nov].value = strdup(value);
	if (!p[src->nov].value)
		return -ENOMEM;
	src->nov++;
	return 0;
}

void kv_config_source_free(struct kv_config_source *src)
{
	size_t i;

	if (!src)
		return;
	for (i = 0; i < src->nov; i++)
		free(src->ov[i].value);
	free(src->ov);
	src->ov = NULL;
	src->nov = 0;
}

int kv_config_build(struct kv_config *c, const struct kv_config_source *src, char *err,
		    size_t errlen)
{
	char msg[512];
	size_t i;
	int r;

	kv_config_defaults(c);
	if (src->path[0]) {
		r = kv_config_load_file(c, src->path, err, errlen);
		if (r < 0 && !(r == -ENOENT && !src->explicit_path))
			return r;
	}
	for (i = 0; i < src->nov; i++) {
		if (kv_config_set(c, src->ov[i].key, src->ov[i].value, msg, sizeof(msg)) < 0)
			return kv_einval(err, errlen, "command line: %s", msg);
	}
	return kv_config_finish(c, err, errlen);
}

void kv_config_write(const struct kv_config *c, FILE *f)
{
	char v[512];
	size_t i;

	fputs("# kvcached configuration (kvcached.conf(5)). Keys marked 'reloadable'\n"
	      "# change on SIGHUP or 'kvctl reload'; the others need a restart.\n", f);
	for (i = 0; i < kv_cfg_nkeys; i++) {
		const struct kv_cfg_key *k = &kv_cfg_keys[i];

		kv_config_format(c, k, v, sizeof(v));
		fprintf(f, "\n# %s%s\n%s =%s%s\n", k->doc,
			k->flags & KV_CFG_RELOAD ? " (reloadable)" : "", k->name, v[0] ? " " : "", v);
	}
	kv_nsconf_write(c, f);
}

static int field_equal(const struct kv_config *a, const struct kv_config *b,
		       const struct kv_cfg_key *k)
{
	const char *x = (const char *)a + k->offset, *y = (const char *)b + k->offset;

	switch (k->type) {
	case KV_CFG_STRING:
	case KV_CFG_CHOICE:
	case KV_CFG_GROUP:
		return !strcmp(x, y);
	default:
		return !memcmp(x, y, k->size);
	}
}

/* One line of what a namespace section says, for the reload report. */
static void nsconf_line(const struct kv_ns_conf *n, char *buf, size_t len)
{
	char q[3][32], r[32];

	if (!n) {
		snprintf(buf, len, "(none)");
		return;
	}
	for (int i = 0; i < 3; i++)
		kv_nsconf_format_size(n->quota[i], q[i], sizeof(q[i]));
	kv_nsconf_format_size(n->reserve, r, sizeof(r));
	snprintf(buf, len, "%s%u users, %u groups, quota %s/%s/%s, reserve %s, priority %u, "
		 "ttl %llums", n->anyone ? "anyone, " : "", n->nuids, n->ngids,
		 q[0][0] ? q[0] : "-", q[1][0] ? q[1] : "-", q[2][0] ? q[2] : "-",
		 r[0] ? r : "-", n->priority, (unsigned long long)n->ttl_ms);
}

/* The namespace sections: all reloadable, reported one per section. */
static int nsconf_reload(struct kv_config *live, const struct kv_config *next,
			 void (*report)(void *ctx, const struct kv_cfg_key *k, const char *old,
					const char *now, int applied),
			 void *ctx)
{
	char old[300], now[300], what[400];
	uint32_t i;
	int n = 0;

	for (i = 0; i < live->nns + next->nns; i++) {
		const struct kv_ns_conf *a, *b;

		if (i < live->nns) {
			a = &live->ns[i];
			b = kv_nsconf_find(next, a->name);
		} else {
			b = &next->ns[i - live->nns];
			if (kv_nsconf_find(live, b->name))
				continue;
			a = NULL;
		}
		if (a && b && !memcmp(a, b, sizeof(*a)))
			continue;
		n++;
		nsconf_line(a, old, sizeof(old));
		nsconf_line(b, now, sizeof(now));
		snprintf(what, sizeof(what), "[namespace %s] %s", a ? a->name : b->name, old);
		if (report)
			report(ctx, NULL, what, now, 1);
	}
	memcpy(live->ns, next->ns, sizeof(live->ns));
	live->nns = next->nns;
	return n;
}

int kv_config_reload(struct kv_config *live, const struct kv_config *next,
		     void (*report)(void *ctx, const struct kv_cfg_key *k, const char *old,
				    const char *now, int applied),
		     void *ctx)
{
	char old[512], now[512];
	size_t i;
	int n = 0;

	for (i = 0; i < kv_cfg_nkeys; i++) {
		const struct kv_cfg_key *k = &kv_cfg_keys[i];
		int reload = !!(k->flags & KV_CFG_RELOAD);

		if (field_equal(live, next, k))
			continue;
		n++;
		kv_config_format(live, k, old, sizeof(old));
		kv_config_format(next, k, now, sizeof(now));
		if (reload)
			memcpy((char *)live + k->offset, (const char *)next + k->offset, k->size);
		if (report)
			report(ctx, k, old, now, reload);
	}
	n += nsconf_reload(live, next, report, ctx);
	return n;
}
