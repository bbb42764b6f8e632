/* Daemon logging. One line per event, written where the event is handled.
 *
 * Lines go to stderr ("12:00:00.000 kvcached warning: ...") or, when stderr is
 * connected to the systemd journal ($JOURNAL_STREAM names it) or the
 * log_target key says so, to the journal with structured fields: PRIORITY,
 * CODE_FILE, CODE_LINE, CODE_FUNC (of the kv_err()/kv_info()... call),
 * SYSLOG_IDENTIFIER=kvcached, and KV_SESSION / KV_NAMESPACE while a request of
 * a session is being handled (kv_log_context()). Without libsystemd the
 * journal gets "<N>message" lines, which journald reads as the priority.
 *
 * Single-threaded, like the rest of the daemon. */
#ifndef KV_LOG_H
#define KV_LOG_H

#include <stdint.h>

enum kv_log_level { KV_LOG_ERR = 3, KV_LOG_WARN = 4, KV_LOG_INFO = 6, KV_LOG_DEBUG = 7 };

enum kv_log_target { KV_LOG_TARGET_AUTO, KV_LOG_TARGET_STDERR, KV_LOG_TARGET_JOURNAL };

extern int kv_log_level;

/* Parses "err", "warn", "info", "debug" (or 3..7). Returns the level or -EINVAL. */
int kv_log_parse_level(const char *s);

/* Chooses where lines go: "auto" (the journal if stderr is a journal stream),
 * "stderr" or "journal". Returns 0 or -EINVAL. */
int kv_log_set_target(const char *name);
/* Whether lines go to the journal now. */
int kv_log_to_journal(void);

/* The session and namespace the following lines are about; 0 and NULL clear
 * them. ns must stay valid until it is cleared or replaced. */
void kv_log_context(uint64_t session, const char *ns);

void kv_log_at(int level, const char *file, int line, const char *func, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
/* The same without a code location. */
void kv_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* At most one line per interval for an event a client can repeat at will
 * (a refused connection): embed one per kind of line, zeroed, with
 * interval_ms set. */
struct kv_ratelimit {
	uint64_t interval_ms;
	uint64_t next_ms;          /* monotonic: when the next line may go */
	uint64_t held;             /* events since the last line */
};

/* Whether to log this event now; if so, *held gets how many events were not
 * logged since the last line (to say so in it). */
int kv_ratelimit(struct kv_ratelimit *rl, uint64_t *held);

#define KV_LOG_AT(level, ...) kv_log_at(level, __FILE__, __LINE__, __func__, __VA_ARGS__)
#define kv_err(...) KV_LOG_AT(KV_LOG_ERR, __VA_ARGS__)
#define kv_warn(...) KV_LOG_AT(KV_LOG_WARN, __VA_ARGS__)
#define kv_info(...) KV_LOG_AT(KV_LOG_INFO, __VA_ARGS__)
#define kv_debug(...) do { if (kv_log_level >= KV_LOG_DEBUG) KV_LOG_AT(KV_LOG_DEBUG, __VA_ARGS__); } while (0)

#endif
