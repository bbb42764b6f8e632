/* Logging to stderr or the journal; see log.h. */
#include "log.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "kvclock.h"
#include "kvconfig.h"
#if KV_HAVE_SYSTEMD
/* We pass CODE_FILE/LINE/FUNC of the caller ourselves. */
#define SD_JOURNAL_SUPPRESS_LOCATION
#include <systemd/sd-journal.h>
#endif

int kv_log_level = KV_LOG_INFO;

static int to_journal;
static int journal_native;   /* journald's socket is there: structured fields */
static uint64_t ctx_session;
static const char *ctx_ns;

int kv_log_parse_level(const char *s)
{
	static const struct { const char *name; int level; } names[] = {
		{ "err", KV_LOG_ERR }, { "error", KV_LOG_ERR }, { "warn", KV_LOG_WARN },
		{ "warning", KV_LOG_WARN }, { "info", KV_LOG_INFO }, { "debug", KV_LOG_DEBUG },
	};
	size_t i;

	for (i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (!strcmp(s, names[i].name))
			return names[i].level;
	if (s[0] >= '3' && s[0] <= '7' && !s[1])
		return s[0] - '0';
	return -EINVAL;
}

/* Whether stderr is the stream systemd connected to the journal: the
 * "device:inode" in $JOURNAL_STREAM is fd 2's (systemd.exec(5)). */
static int stderr_is_journal(void)
{
	const char *env = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (!env || sscanf(env, "%llu:%llu", &dev, &ino) != 2 || fstat(2, &st) < 0)
		return 0;
	return st.st_dev == dev && st.st_ino == ino;
}

int kv_log_set_target(const char *name)
{
	if (!strcmp(name, "auto"))
		to_journal = stderr_is_journal();
	else if (!strcmp(name, "journal"))
		to_journal = 1;
	else if (!strcmp(name, "stderr"))
		to_journal = 0;
	else
		return -EINVAL;
	/* sd_journal_send() drops lines silently when journald is not there;
	 * then the "<N>" lines on stderr are the better bet. */
	journal_native = KV_HAVE_SYSTEMD && to_journal &&
			 access("/run/systemd/journal/socket", W_OK) == 0;
	return 0;
}

int kv_log_to_journal(void)
{
	return to_journal;
}

void kv_log_context(uint64_t session, const char *ns)
{
	ctx_session = session;
	ctx_ns = ns;
}

#if KV_HAVE_SYSTEMD
/* "daemon/server.c" from "../daemon/server.c" or "/src/kvcached/daemon/server.c". */
static const char *short_file(const char *file)
{
	const char *last = strrchr(file, '/'), *p;

	if (!last)
		return file;
	for (p = last - 1; p > file && *p != '/'; p--)
		;
	return p > file || *p == '/' ? p + 1 : file;
}

/* Returns 0, or -errno when the journal cannot be reached. */
static int journal_send(int level, const char *file, int line, const char *func, const char *msg)
{
	char prio[16], fl[256], ln[32], fn[128], sess[40], ns[96];
	char *m;
	struct iovec iov[9];
	int n = 0, r;

	if (asprintf(&m, "MESSAGE=%s", msg) < 0)
		return -ENOMEM;
#define FIELD(buf, ...) do { \
		snprintf(buf, sizeof(buf), __VA_ARGS__); \
		iov[n].iov_base = buf; \
		iov[n++].iov_len = strlen(buf); \
	} while (0)
	iov[n].iov_base = m;
	iov[n++].iov_len = strlen(m);
	FIELD(prio, "PRIORITY=%d", level);
	iov[n].iov_base = (char *)"SYSLOG_IDENTIFIER=kvcached";
	iov[n++].iov_len = strlen("SYSLOG_IDENTIFIER=kvcached");
	if (file) {
		FIELD(fl, "CODE_FILE=%s", short_file(file));
		FIELD(ln, "CODE_LINE=%d", line);
		FIELD(fn, "CODE_FUNC=%s", func);
	}
	if (ctx_session)
		FIELD(sess, "KV_SESSION=%" PRIu64, ctx_session);
	if (ctx_ns && ctx_ns[0])
		FIELD(ns, "KV_NAMESPACE=%s", ctx_ns);
#undef FIELD
	r = sd_journal_sendv(iov, n);
	free(m);
	return r;
}
#endif

static void vlog(int level, const char *file, int line, const char *func, const char *fmt,
		 va_list ap)
{
	static const char *tag[] = { "", "", "", "error", "warning", "notice", "info", "debug" };
	char msg[1024];
	struct timespec ts;
	struct tm tm;

	if (level > kv_log_level)
		return;
	vsnprintf(msg, sizeof(msg), fmt, ap);
	if (to_journal) {
#if KV_HAVE_SYSTEMD
		if (journal_native && journal_send(level, file, line, func, msg) >= 0)
			return;
#endif
		/* journald reads a "<N>" prefix as the priority. */
		fprintf(stderr, "<%d>%s\n", level & 7, msg);
		return;
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	fprintf(stderr, "%02d:%02d:%02d.%03ld kvcached %s: %s\n", tm.tm_hour, tm.tm_min,
		tm.tm_sec, ts.tv_nsec / 1000000, tag[level & 7], msg);
}

void kv_log_at(int level, const char *file, int line, const char *func, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vlog(level, file, line, func, fmt, ap);
	va_end(ap);
}

void kv_log(int level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vlog(level, NULL, 0, NULL, fmt, ap);
	va_end(ap);
}

int kv_ratelimit(struct kv_ratelimit *rl, uint64_t *held)
{
	uint64_t now = kv_mono_ms();

	if (now < rl->next_ms) {
		rl->held++;
		return 0;
	}
	*held = rl->held;
	rl->held = 0;
	rl->next_ms = now + rl->interval_ms;
	return 1;
}
