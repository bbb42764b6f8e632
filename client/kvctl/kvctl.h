/* kvctl's shared declarations: the arguments, the output layer (output.c:
 * JSON through jansson, tables through libsmartcols, value formatting), the
 * call to the daemon (main.c) and the commands, one file per group:
 * stats.c (status, pools, clients, metrics), admin.c (check, evict, flush,
 * drain, reload), events.c (events, dump), top.c. */
#ifndef KVCTL_H
#define KVCTL_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "kvc_internal.h"

enum format { FMT_HUMAN, FMT_JSON };

/* Command-specific options, as bits of struct command.opts. */
enum { O_POOL = 1, O_ALL = 2, O_TIMEOUT = 4, O_WAIT = 8, O_COUNT = 16, O_DELAY = 32, O_TIER = 64,
       O_EVENTS = 128 };

struct args {
	enum format fmt;
	const char *sock;
	unsigned used;          /* O_* given */
	uint32_t pool;
	int tier;               /* evict: 0..2 for G1..G3 */
	uint64_t timeout_ms;
	long count;             /* top: frames, 0 = until stopped */
	double delay;           /* top: seconds between frames */
	const char *topic;      /* help COMMAND */
	/* events */
	const char *endpoint, *replay_endpoint, *topic_filter;
	uint64_t from;
};

extern const char *const tier_names[3];

/* ---- output.c ---- */
void *xrealloc(void *p, size_t n);
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A JSON document built in the order it reads, on jansson: open a
 * container, give keys and values, close it; closing the outermost one
 * prints the document (indented, or on one line when compact) and a
 * newline. Strings from the daemon are untrusted: invalid UTF-8 becomes
 * U+FFFD, and jansson escapes control characters. */
#define JSON_MAX_DEPTH 16
struct json {
	bool compact;                   /* one line (kvctl top) */
	int depth;
	json_t *stack[JSON_MAX_DEPTH];
	char *key;                      /* for the next value, in an object */
};
void json_open(struct json *j, char c);    /* '{' or '[' */
void json_close(struct json *j, char c);
void json_key(struct json *j, const char *k);
void json_str(struct json *j, const char *k, const char *v);   /* k NULL: in an array */
void json_u64(struct json *j, const char *k, uint64_t v);
void json_i64(struct json *j, const char *k, int64_t v);
void json_f64(struct json *j, const char *k, double v);
void json_bool(struct json *j, const char *k, bool v);
/* num/den, or null when den is 0. */
void json_ratio(struct json *j, const char *k, uint64_t num, uint64_t den);

/* A table for a terminal, printed by libsmartcols: a header per column,
 * 'l' or 'r' alignment, cells filled row by row (made safe for a terminal). */
struct table {
	size_t ncol;
	const char *const *head;
	const char *align;      /* 'l' or 'r' per column */
	char **cell;            /* row-major, owned */
	size_t ncell, cap;      /* cells, and room for them (grown by doubling) */
};
void cell(struct table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void table_print(struct table *t);

/* The skeleton of a listing command (pools, namespaces, clients): the
 * reply's rows as {"KEY": [row, ...]} (json_doc, when set, writes the whole
 * object's members instead), or as a table, or the line `none` when there
 * are no rows. Returns 0. */
struct listing {
	const char *key;
	const char *none;
	size_t nrows;
	const void *reply;
	void (*json_row)(struct json *j, const void *reply, size_t i);
	void (*json_doc)(struct json *j, const void *reply);
	void (*table_row)(struct table *t, const void *reply, size_t i);
	struct table table;     /* its head and alignment; the cells are the rows' */
};
int listing_print(const struct args *a, struct listing *l);

/* "key       value", the value made safe for a terminal. */
void kv_line(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
char *fmt_bytes(uint64_t v);        /* "512 B", "2 MiB", "1.5 GiB" */
char *fmt_duration(uint64_t ms);    /* "1m 05s" */
char *fmt_time(uint64_t ms);        /* local time of a wall-clock ms */
char *fmt_pct(uint64_t num, uint64_t den);
char *fmt_deadline(uint64_t deadline_ms);  /* "12 s" from now */
/* A copy of s safe for a terminal: control characters and invalid UTF-8
 * become '?'. */
char *sanitize(const char *s);

/* ---- main.c ---- */
/* Prints "kvctl: what: why" (the daemon's message when there is one);
 * returns 1. */
int fail(kvc_conn *c, const char *what, int err);
/* Sends req (op set by the caller) and returns the response of the wanted
 * kind, or NULL after printing the error. */
Kvcached__Response *call(kvc_conn *c, Kvcached__Request *req, Kvcached__Response__ResultCase want,
			 const char *what);

/* ---- stats.c ---- */
Kvcached__Response *get_stats(kvc_conn *c);
Kvcached__Response *get_clients(kvc_conn *c);
void json_stats_fields(struct json *j, const Kvcached__StatsReply *s);
void json_pool(struct json *j, const Kvcached__PoolInfo *p);
void json_client(struct json *j, const Kvcached__ClientInfo *ci);
int cmd_status(kvc_conn *c, const struct args *a);
int cmd_pools(kvc_conn *c, const struct args *a);
int cmd_namespaces(kvc_conn *c, const struct args *a);
int cmd_clients(kvc_conn *c, const struct args *a);
int cmd_metrics(kvc_conn *c, const struct args *a);

/* ---- admin.c ---- */
int cmd_check(kvc_conn *c, const struct args *a);
int cmd_evict(kvc_conn *c, const struct args *a);
int cmd_flush(kvc_conn *c, const struct args *a);
int cmd_drain(kvc_conn *c, const struct args *a);
int cmd_reload(kvc_conn *c, const struct args *a);

/* ---- events.c ---- */
int cmd_events(kvc_conn *c, const struct args *a);   /* c is NULL: no daemon call */
/* kvctl events without --endpoint: the publisher's counters (Stats). */
int cmd_events_stats(kvc_conn *c, const struct args *a);
int cmd_dump(kvc_conn *c, const struct args *a);

/* ---- top.c ---- */
int cmd_top(kvc_conn *c, const struct args *a);

#endif
