/* Daemon logging. One line per event, written where the event is handled.
 * Goes to stderr for now; the systemd issue adds journald fields. */
#ifndef KV_LOG_H
#define KV_LOG_H

enum kv_log_level { KV_LOG_ERR = 3, KV_LOG_WARN = 4, KV_LOG_INFO = 6, KV_LOG_DEBUG = 7 };

extern int kv_log_level;

/* Parses "err", "warn", "info", "debug" (or 3..7). Returns the level or -EINVAL. */
int kv_log_parse_level(const char *s);

void kv_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define kv_err(...) kv_log(KV_LOG_ERR, __VA_ARGS__)
#define kv_warn(...) kv_log(KV_LOG_WARN, __VA_ARGS__)
#define kv_info(...) kv_log(KV_LOG_INFO, __VA_ARGS__)
#define kv_debug(...) do { if (kv_log_level >= KV_LOG_DEBUG) kv_log(KV_LOG_DEBUG, __VA_ARGS__); } while (0)

#endif
