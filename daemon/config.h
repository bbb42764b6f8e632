/* The daemon's configuration: one table, one row per key.
 *
 * Every key has a row in kv_cfg_keys[] (config.c): its name, its type, where
 * it lives in struct kv_config, whether SIGHUP may change it at run time, its
 * default and one line of documentation. The INI file, the command line
 * (--pool-size=8GiB for pool_size), --help, --print-config and the reload diff
 * all walk that table, so a new key is one field here and one row there:
 *
 *   { "host_tier_size", 0, KV_CFG_SIZE_PCT, KV_CFG_FIELD(host_tier_bytes),
 *     KV_CFG_PCT_RAM, 0, 0, "0", "pinned host memory for the G2 tier", NULL },
 *
 * Cross-key rules (the pool a multiple of the segment, ...) and defaults that
 * depend on other keys live in kv_config_finish(). Reloadable keys are copied
 * into the live configuration by kv_config_reload(); what they change is
 * applied by lifecycle.c (apply_config()).
 *
 * Sources, later ones winning: the defaults, the file (--config PATH, default
 * KV_CONFIG_PATH; a missing default file is fine, a missing explicit one is an
 * error), then the command line. A reload reads the file again and applies the
 * same command-line overrides on top, so the command line keeps winning. */
#ifndef KV_CONFIG_H
#define KV_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>


/* The lower tiers' part of the configuration (tier.h reads it; config.h
 * includes nothing of the daemon, so that every module may read its
 * settings without depending on the modules above). */
struct kv_tiers_config {
	uint64_t host_bytes;       /* G2 size; 0 = no lower tiers */
	char disk_path[256];       /* G3 file or block device; "" = no G3 */
	uint64_t disk_bytes;
	char disk_index[256];      /* "" = disk_path + ".idx" */
	unsigned queue_depth;      /* G3 I/Os in flight */
	unsigned g1_low, g1_high;  /* percent free of a device: demotion starts, stops */
	unsigned g2_low, g2_high;  /* percent free of G2: write-back starts, stops */
	/* G4 on Redis Cluster (docs/g4.md); remote_seeds "" = none. */
	char remote_seeds[512];    /* host:port[,host:port...] */
	char remote_prefix[64];    /* of every key */
	char remote_user[64];      /* ACL user; "" = none (AUTH with the password alone) */
	char remote_password_file[256];
	uint64_t remote_ttl_ms, remote_timeout_ms;
	uint64_t remote_max_inflight;  /* bytes of writes queued or under way */
	uint64_t remote_write_rate;    /* bytes per second written at most; 0 = no limit */
	char remote_write[16];         /* "writeback", "demote" or "off" (read only): ns.h KV_G4W_* */
	uint64_t remote_min_rate;      /* bytes/s a node moves at least (rcluster.h min_rate) */
	uint64_t remote_fetch_timeout_ms;  /* a read call's deadline (rcluster.h call_ms) */
	unsigned remote_readers;       /* read threads */
	uint64_t remote_write_timeout_ms;  /* a write batch's deadline (rcluster.h call_ms) */
	char remote_auth[16];          /* "required" or "off": the namespaces' default */
	/* The namespaces with remote = yes that read unauthenticated values
	 * (remote_auth = off, no remote_key_file), comma-separated: warned
	 * at start. */
	char remote_unauth[1024];
	/* [namespace X] remote_user / remote_password_file: the namespaces
	 * that talk to the cluster as a user of their own (read at start). */
	struct kv_remote_user {
		char ns[64], user[64], password_file[256];
	} remote_users[64];
	unsigned nremote_users;
	/* [namespace X] remote_key_file: the namespaces whose G4 values carry
	 * an HMAC-SHA-256 tag (g4mac.h; read at start). */
	struct kv_remote_key {
		char ns[64], key_file[256];
	} remote_keys[64];
	unsigned nremote_keys;
};

#define KV_CONFIG_PATH "/etc/kvcached/kvcached.conf"

/* Segments per device by default (segment_size): a segment is owned by one
 * namespace at a time, so at most this many tenants hold memory on a device
 * at once. */
#define KV_DEFAULT_SEGMENTS 64

/* The cuda backend's segments are whole VMM allocations: multiples of the
 * device's allocation granularity, 2MiB on every GPU so far. A default
 * segment_size on that backend is a multiple of this. */
#define KV_CUDA_SEGMENT_ALIGN (2u << 20)

/* The longest drain, from drain_timeout or an admin's Drain (a day). */
#define KV_DRAIN_TIMEOUT_MAX_MS 86400000ull

/* A [namespace NAME] section (nsconf.c): who may open the namespace, and its
 * limits. Sizes may be percentages of the tier (PCT_BIT set, in hundredths
 * of a percent) until tenant.c resolves them against the tiers' sizes. */
#define KV_CFG_MAX_NS 64
#define KV_CFG_NS_IDS 32
#define KV_CFG_PCT_BIT (1ull << 63)

struct kv_ns_conf {
	char name[64];
	int anyone;                   /* users = *: every local user */
	uint32_t uids[KV_CFG_NS_IDS], nuids;
	uint32_t gids[KV_CFG_NS_IDS], ngids;
	uint64_t quota[3];            /* quota_g1, quota_g2, quota_g3; 0 = none */
	uint64_t reserve;             /* reserve_g1 */
	uint32_t priority;
	uint64_t ttl_ms;
	int events;                   /* KV_NS_EVENTS_*: 0 = events_token_ids decides */
	int remote;                   /* remote = yes: the G4 tier (docs/g4.md) */
	uint64_t quota_g4;            /* quota_g4: bytes per remote_ttl; 0 = none */
	int remote_write;             /* remote_write: KV_G4W_* (ns.h); 0 = the daemon's */
	char remote_user[64];         /* G4 ACL user of its own; "" = the daemon's */
	char remote_password_file[256];
	char remote_key_file[256];    /* G4 values' HMAC key (g4mac.h); "" = CRC32C only */
	int remote_auth;              /* KV_NS_AUTH_*: 0 = the daemon's remote_auth */
	int compress;                 /* compress: KV_QFMT_* (quant.h) of new pools' tier copies */
};

/* [namespace NAME] events = off | hashes | tokens (events.h). A pool's choice
 * is made when it is created; a reload changes pools created afterwards. */
enum { KV_NS_EVENTS_DEFAULT, KV_NS_EVENTS_OFF, KV_NS_EVENTS_HASHES, KV_NS_EVENTS_TOKENS };

struct kv_config {
	char socket_path[108];        /* worker socket */
	char metrics_listen[64];      /* HOST:PORT of GET /metrics (http.h); "" off */
	uint64_t metrics_min_interval_ms;  /* one exposition built at most this often */
	uint64_t metrics_header_timeout_ms; /* a request not whole after this is closed */
	uint32_t metrics_max_connections;
	uint32_t metrics_max_connections_per_address;
	uint64_t loop_lag_warn_ms;    /* a loop turn longer than this is logged (0: never) */
	unsigned socket_mode;
	char socket_group[64];
	char admin_socket_path[108];
	unsigned admin_socket_mode;
	char admin_socket_group[64];
	int worker_socket_admin;      /* root and the daemon's uid are admins on the worker socket */
	char backend[16];
	uint64_t pool_bytes;
	uint64_t segment_bytes;       /* 0 until finish: 1GiB, or the pool if smaller */
	uint64_t page_bytes;
	uint32_t max_frame;
	uint32_t max_batch;
	uint32_t max_block_refs;      /* references one block may carry (ops.c refuses more) */
	uint32_t max_connections;     /* on the worker socket (conn.c refuses more) */
	uint32_t max_connections_per_uid;
	uint64_t frame_timeout_ms;    /* a frame incomplete for longer closes its connection */
	uint32_t max_output_bytes;    /* unsent replies past which a connection's input waits */
	uint32_t max_fds_per_conn;    /* segment fds out to one connection past which it waits */
	uint32_t max_fds_in_flight;   /* all connections together (0: from RLIMIT_NOFILE) */
	uint32_t max_fds_per_uid;     /* all connections of one uid (0: half of the above) */
	uint64_t max_memory_per_uid;  /* connection buffers of one uid (budget.h); 0 none */
	uint64_t max_connection_memory; /* of all connections together; 0 none */
	int log_level;
	char log_target[16];          /* auto, stderr, journal */
	uint64_t drain_timeout_ms;
	uint64_t status_interval_ms;
	/* What one client may make the daemon hold (docs/operations.md, "Limits
	 * on pools, layouts, swap and replies"); all reloadable: read where
	 * they are enforced (ops_block.c). */
	uint64_t max_layout_bytes;    /* a pool's layout blob */
	uint32_t max_pools_per_namespace;
	uint64_t max_swap_per_session;  /* block bytes one session holds swapped out */
	struct kv_tiers_config tiers; /* host_tier_size, disk_*, demote_*, writeback_* */
	/* KV events (events.h) */
	char events_endpoint[256];
	char events_replay_endpoint[256];
	int events_connect;
	uint32_t events_buffer;
	uint32_t events_hwm;
	uint64_t events_subscriber_max_bytes; /* a subscriber's queue, in full batches */
	uint64_t events_replay_max_bytes;     /* replay messages in flight, all peers */
	uint64_t events_interval_ms;
	int events_token_ids;
	char events_hash_format[8];
	uint32_t events_dp_rank;
	uint64_t events_buffer_max_bytes;     /* the replay ring, in bytes */
	char node_name[64];
	struct kv_ns_conf ns[KV_CFG_MAX_NS];  /* the [namespace NAME] sections */
	uint32_t nns;
};

enum kv_cfg_type {
	KV_CFG_SIZE,       /* uint64_t: 4096, 64KiB, 2MiB, 8GiB */
	KV_CFG_SIZE_PCT,   /* uint64_t: a size, or a percentage of memory (90%, 12.5%) */
	KV_CFG_UINT,       /* uint32_t */
	KV_CFG_STRING,     /* char[size]; "" is allowed */
	KV_CFG_CHOICE,     /* char[size]: one of `choices` */
	KV_CFG_MODE,       /* unsigned: octal permissions 0..0777 */
	KV_CFG_GROUP,      /* char[size]: an existing group name or gid, or "" */
	KV_CFG_BOOL,       /* int 0/1: yes no true false on off 1 0 */
	KV_CFG_DURATION,   /* uint64_t ms: 500ms, 30s, 2m, 1h; a bare number is seconds */
	KV_CFG_LOG_LEVEL,  /* int: err, warn, info, debug (or 3..7) */
	KV_CFG_PERCENT,    /* unsigned 0..100: 10 or 10% */
};

/* Row flags. */
#define KV_CFG_RELOAD 0x1u   /* SIGHUP / kvctl reload applies a change at run time */
#define KV_CFG_PCT_RAM 0x2u  /* SIZE_PCT: percent of host RAM, not of device memory */

struct kv_cfg_key {
	const char *name;      /* in the file; "--" + name with '-' for '_' on the command line */
	char short_opt;        /* 0 or a short option letter */
	enum kv_cfg_type type;
	size_t offset, size;   /* the field in struct kv_config (KV_CFG_FIELD) */
	unsigned flags;
	uint64_t min, max;     /* SIZE, SIZE_PCT (bytes), UINT, DURATION (ms): range; max 0 = none */
	const char *def;       /* the default as written in the file ("" = computed, see doc) */
	const char *doc;       /* one line */
	const char *choices;   /* CHOICE: the allowed values, '|'-separated */
};

#define KV_CFG_FIELD(f) offsetof(struct kv_config, f), sizeof(((struct kv_config *)0)->f)

extern const struct kv_cfg_key kv_cfg_keys[];
extern const size_t kv_cfg_nkeys;

/* The row of key name ('-' and '_' are the same), or NULL. */
const struct kv_cfg_key *kv_config_key(const char *name);

/* Every key at its default (computed defaults stay empty until finish). */
void kv_config_defaults(struct kv_config *c);

/* Parses value into k's field of c. Returns 0, or -EINVAL with a message
 * naming the key, the value and what is allowed in err; c is untouched on
 * error. */
int kv_config_set(struct kv_config *c, const struct kv_cfg_key *k, const char *value,
		  char *err, size_t errlen);

/* Reads an INI file into c: "key = value" lines, optionally under a
 * [kvcached] section; '#' or ';' start a comment line. Returns 0, -ENOENT
 * when the file does not exist (err set), or -EINVAL / -errno with
 * "path:line: ..." in err. */
int kv_config_load_file(struct kv_config *c, const char *path, char *err, size_t errlen);

/* Computed defaults (socket paths, segment size), percentages turned into
 * bytes, then the rules between keys. Returns 0 or -EINVAL (err set). */
int kv_config_finish(struct kv_config *c, char *err, size_t errlen);

/* Where a configuration comes from, kept for reloads. */
struct kv_config_source {
	char path[4096];
	int explicit_path;   /* given with --config: a missing file is an error */
	struct kv_config_override {
		const struct kv_cfg_key *key;
		char *value;
	} *ov;
	size_t nov;
};

/* Appends a command-line override (value copied). Returns 0 or -ENOMEM. */
int kv_config_source_add(struct kv_config_source *src, const struct kv_cfg_key *k,
			 const char *value);
void kv_config_source_free(struct kv_config_source *src);

/* Defaults, the file, the overrides, finish: the whole configuration of src
 * into c. Returns 0 or -errno with the message in err (c undefined then). */
int kv_config_build(struct kv_config *c, const struct kv_config_source *src, char *err,
		    size_t errlen);

/* Writes the value of k in c as the file would say it ("2MiB", "0660"). */
void kv_config_format(const struct kv_config *c, const struct kv_cfg_key *k, char *buf,
		      size_t len);

/* Writes every key of c as a configuration file, each with its doc. */
void kv_config_write(const struct kv_config *c, FILE *f);

/* ---- [namespace NAME] sections (nsconf.c) ---- */
/* Sets key of the section of namespace name (created on its first key).
 * Keys: users, groups, quota_g1, quota_g2, quota_g3, reserve_g1, priority,
 * ttl. Returns 0 or -EINVAL with the message in err. */
int kv_nsconf_set(struct kv_config *c, const char *name, const char *key, const char *value,
		  char *err, size_t errlen);
/* The section of namespace name, or NULL. */
const struct kv_ns_conf *kv_nsconf_find(const struct kv_config *c, const char *name);
/* Rules between a section's keys. Returns 0 or -EINVAL (err set). */
int kv_nsconf_finish(struct kv_config *c, char *err, size_t errlen);
/* Writes the sections as the file would say them. */
void kv_nsconf_write(const struct kv_config *c, FILE *f);
/* Writes a size field of a section ("8GiB", "25%", "" for none). */
void kv_nsconf_format_size(uint64_t v, char *buf, size_t len);

/* Copies the reloadable keys that differ from next into live. For each key
 * that differs, calls report(ctx, key, old value, new value, applied):
 * applied is 0 for a key that needs a restart (live keeps its value).
 * The namespace sections are all reloadable: each section added, removed or
 * changed is reported with k NULL and its name as old/now ("namespace X").
 * Returns how many keys and sections differed. */
int kv_config_reload(struct kv_config *live, const struct kv_config *next,
		     void (*report)(void *ctx, const struct kv_cfg_key *k, const char *old,
				    const char *now, int applied),
		     void *ctx);

/* Memory that percentages refer to: device memory of the backend and host
 * RAM (sysinfo totalram, the same as MemTotal). The host backend's device
 * memory is host RAM. Returns 0 or -errno. */
int kv_config_memory(const char *backend, uint64_t *device_bytes, uint64_t *ram_bytes);

#endif
