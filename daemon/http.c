/* GET /metrics over HTTP; see http.h. */
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"
#include "hist.h"
#include "kvconfig.h"
#include "log.h"
#include "metrics.h"

#if KV_HAVE_HTTP
#include <microhttpd.h>
#endif

int kv_http_built(void)
{
	return KV_HAVE_HTTP;
}

int kv_http_parse_listen(const char *s, struct sockaddr_storage *sa, socklen_t *len, char *err,
			 size_t errlen)
{
	char host[64];
	const char *colon, *port;
	unsigned long p;
	char *end;
	size_t hl;

	memset(sa, 0, sizeof(*sa));
	if (s[0] == '[') {
		const char *close = strchr(s, ']');

		if (!close || close[1] != ':')
			goto bad;
		hl = (size_t)(close - s - 1);
		if (hl >= sizeof(host))
			goto bad;
		memcpy(host, s + 1, hl);
		port = close + 2;
	} else {
		colon = strrchr(s, ':');
		if (!colon || strchr(s, ':') != colon)
			goto bad;
		hl = (size_t)(colon - s);
		if (hl >= sizeof(host))
			goto bad;
		memcpy(host, s, hl);
		port = colon + 1;
	}
	host[hl] = '\0';
	errno = 0;
	p = strtoul(port, &end, 10);
	if (!port[0] || *end || port[0] < '0' || port[0] > '9' || errno || p > 65535)
		goto bad;
	if (s[0] == '[') {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)sa;

		if (inet_pton(AF_INET6, host, &a->sin6_addr) != 1)
			goto bad;
		a->sin6_family = AF_INET6;
		a->sin6_port = htons((uint16_t)p);
		*len = sizeof(*a);
	} else {
		struct sockaddr_in *a = (struct sockaddr_in *)sa;

		if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
			goto bad;
		a->sin_family = AF_INET;
		a->sin_port = htons((uint16_t)p);
		*len = sizeof(*a);
	}
	return 0;
bad:
	snprintf(err, errlen, "metrics_listen: bad value '%s': allowed: HOST:PORT with a numeric "
		 "IPv4 address (127.0.0.1:9469) or [IPv6]:PORT ([::1]:9469), or empty (off)", s);
	return -EINVAL;
}

int kv_http_check_listen(const char *s, char *err, size_t errlen)
{
	struct sockaddr_storage sa;
	socklen_t len;

	if (!s[0])
		return 0;
	if (!KV_HAVE_HTTP) {
		snprintf(err, errlen, "metrics_listen: this kvcached is built without HTTP support "
			 "(libmicrohttpd; meson -Dhttp=enabled); use 'kvctl metrics' instead");
		return -EINVAL;
	}
	return kv_http_parse_listen(s, &sa, &len, err, errlen);
}

#if KV_HAVE_HTTP

/* "127.0.0.1:9464" or "[::1]:9464" of a bound socket, for the log. */
static const char *sock_name(int fd, char *buf, size_t len)
{
	struct sockaddr_storage sa;
	socklen_t sl = sizeof(sa);
	char a[INET6_ADDRSTRLEN];

	snprintf(buf, len, "fd %d", fd);
	if (getsockname(fd, (struct sockaddr *)&sa, &sl) < 0)
		return buf;
	if (sa.ss_family == AF_INET) {
		const struct sockaddr_in *s4 = (const struct sockaddr_in *)&sa;

		inet_ntop(AF_INET, &s4->sin_addr, a, sizeof(a));
		snprintf(buf, len, "%s:%u", a, ntohs(s4->sin_port));
	} else if (sa.ss_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)&sa;

		inet_ntop(AF_INET6, &s6->sin6_addr, a, sizeof(a));
		snprintf(buf, len, "[%s]:%u", a, ntohs(s6->sin6_port));
	} else if (sa.ss_family == AF_UNIX) {
		snprintf(buf, len, "a unix socket (fd %d)", fd);
	}
	return buf;
}

struct kv_http {
	struct kv_daemon *d;
	struct MHD_Daemon *mhd;
	int stopping;
	struct kv_loop_watch pw;   /* libmicrohttpd's epoll fd: multishot */
	struct kv_loop_watch tw;   /* its timeout (connection timeouts, more work) */
	uint64_t timer_due_ns;     /* of the last timer armed */
	/* The last exposition, reused for KV_HTTP_CACHE_MS. */
	char *text;
	size_t len;
	uint64_t text_ns;
	struct kv_ratelimit log_rl;
};

static const char content_type[] = "text/plain; version=0.0.4; charset=utf-8";

/* The current exposition in h->text; 0 or -ENOMEM. */
static int exposition(struct kv_http *h)
{
	uint64_t now = kv_hist_now_ns(), pos = 0;
	char *t;
	ssize_t n;

	if (h->text && now - h->text_ns < (uint64_t)KV_HTTP_CACHE_MS * 1000000u)
		return 0;
	n = kv_metrics_page(h->d, &pos, 0, &t);
	if (n < 0)
		return (int)n;
	free(h->text);
	h->text = t;
	h->len = (size_t)n;
	h->text_ns = now;
	return 0;
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *body,
			     size_t len, int copy, const char *type)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(
		len, (void *)body, copy ? MHD_RESPMEM_MUST_COPY : MHD_RESPMEM_PERSISTENT);
	enum MHD_Result ret;

	if (!r)
		return MHD_NO;   /* libmicrohttpd closes the connection */
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
	ret = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return ret;
}

/* Every request is answered on its first call, before any body is read:
 * libmicrohttpd then closes a connection whose request carried one. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
				  const char *method, const char *version,
				  const char *upload_data, size_t *upload_data_size,
				  void **req_cls)
{
	static const char not_found[] = "not found: kvcached serves /metrics only\n";
	static const char not_allowed[] = "method not allowed: GET or HEAD /metrics\n";
	static const char no_memory[] = "out of memory\n";
	struct kv_http *h = cls;

	(void)version;
	(void)upload_data;
	(void)upload_data_size;
	(void)req_cls;
	if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
		return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, not_allowed, sizeof(not_allowed) - 1,
			     0, "text/plain; charset=utf-8");
	if (strcmp(url, "/metrics"))
		return reply(conn, MHD_HTTP_NOT_FOUND, not_found, sizeof(not_found) - 1, 0,
			     "text/plain; charset=utf-8");
	if (exposition(h) < 0)
		return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, no_memory, sizeof(no_memory) - 1,
			     0, "text/plain; charset=utf-8");
	return reply(conn, MHD_HTTP_OK, h->text, h->len, 1, content_type);
}

/* libmicrohttpd's complaints (a connection refused over the limit, a bad
 * request): a client can cause them at will, so at most one line a second. */
static void on_log(void *cls, const char *fmt, va_list ap)
{
	struct kv_http *h = cls;
	char msg[256];
	uint64_t held;
	size_t n;

	if (!kv_ratelimit(&h->log_rl, &held))
		return;
	vsnprintf(msg, sizeof(msg), fmt, ap);
	n = strlen(msg);
	while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
		msg[--n] = '\0';
	kv_warn("metrics over HTTP: %s (%llu more such lines held back)", msg,
		(unsigned long long)held);
}

static void run(struct kv_http *h);

static void on_poll(struct kv_loop_watch *w, int res, int more)
{
	struct kv_http *h = kv_container_of(w, struct kv_http, pw);
	struct MHD_Daemon *mhd = h->mhd;
	int fd;

	(void)res;
	if (h->stopping)
		return;
	run(h);
	if (!more && !h->d->loop.stop) {
		fd = MHD_get_daemon_info(mhd, MHD_DAEMON_INFO_EPOLL_FD)->epoll_fd;
		if (kv_loop_poll(&h->d->loop, &h->pw, fd, POLLIN, 1) < 0)
			kv_err("metrics over HTTP: cannot poll; the endpoint stops answering");
	}
}

static void on_timer(struct kv_loop_watch *w, int res, int more)
{
	struct kv_http *h = kv_container_of(w, struct kv_http, tw);

	(void)res;
	(void)more;
	if (!h->stopping)
		run(h);   /* a cancelled timer too: harmless, and re-arms */
}

/* Lets libmicrohttpd work (it never blocks), then arms the timer for when
 * it next wants to run: a connection's timeout, or at once when it left
 * work undone. A timer already armed for earlier stays. */
static void run(struct kv_http *h)
{
	MHD_UNSIGNED_LONG_LONG ms;
	uint64_t now, due;

	MHD_run(h->mhd);
	if (MHD_get_timeout(h->mhd, &ms) != MHD_YES)
		return;
	if (ms > 3600000)
		ms = 3600000;
	now = kv_hist_now_ns();
	due = now + (uint64_t)ms * 1000000u;
	if (h->tw.armed && due >= h->timer_due_ns)
		return;
	if (h->tw.armed)
		kv_loop_cancel(&h->d->loop, &h->tw);
	if (kv_loop_timeout(&h->d->loop, &h->tw, (uint64_t)ms * 1000000u) == 0)
		h->timer_due_ns = due;
}

int kv_http_start(struct kv_daemon *d, const char *listen_at, int fd, struct kv_http **out)
{
	const union MHD_DaemonInfo *info;
	struct kv_http *h;
	char name[96], err[256];
	int from_systemd = fd >= 0, r, one = 1;

	*out = NULL;
	if (fd < 0) {
		struct sockaddr_storage sa;
		socklen_t len;

		if (kv_http_parse_listen(listen_at, &sa, &len, err, sizeof(err)) < 0) {
			kv_err("%s", err);
			return -EINVAL;
		}
		fd = socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			r = -errno;
			kv_err("metrics over HTTP: socket: %s%s", strerror(errno),
			       errno == EAFNOSUPPORT || errno == EPERM
				       ? " (RestrictAddressFamilies=? use kvcached-metrics.socket)" : "");
			return r;
		}
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (sa.ss_family == AF_INET6)
			setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
		if (bind(fd, (struct sockaddr *)&sa, len) < 0 || listen(fd, 64) < 0) {
			r = -errno;
			kv_err("metrics over HTTP: cannot listen on %s: %s", listen_at, strerror(errno));
			close(fd);
			return r;
		}
	}
	if (!(h = calloc(1, sizeof(*h)))) {
		close(fd);
		return -ENOMEM;
	}
	h->d = d;
	h->pw.cb = on_poll;
	h->tw.cb = on_timer;
	h->log_rl.interval_ms = 1000;
	/* No internal thread: MHD_run() from the loop. Without
	 * MHD_USE_INTERNAL_POLLING_THREAD libmicrohttpd starts none. */
	h->mhd = MHD_start_daemon(MHD_USE_EPOLL | MHD_USE_ERROR_LOG, 0, NULL, NULL, on_request, h,
				  MHD_OPTION_EXTERNAL_LOGGER, on_log, h,
				  MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
				  MHD_OPTION_CONNECTION_LIMIT, (unsigned)KV_HTTP_CONNS,
				  MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)KV_HTTP_TIMEOUT_S,
				  MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)KV_HTTP_CONN_MEMORY,
				  MHD_OPTION_END);
	if (!h->mhd) {
		kv_err("metrics over HTTP: libmicrohttpd did not start on %s",
		       sock_name(fd, name, sizeof(name)));
		close(fd);
		free(h);
		return -EINVAL;
	}
	info = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_EPOLL_FD);
	if (!info || (r = kv_loop_poll(&d->loop, &h->pw, info->epoll_fd, POLLIN, 1)) < 0) {
		kv_err("metrics over HTTP: cannot poll libmicrohttpd's epoll fd");
		MHD_stop_daemon(h->mhd);   /* closes fd */
		free(h);
		return -EIO;
	}
	kv_info("metrics over HTTP on %s%s: GET /metrics", sock_name(fd, name, sizeof(name)),
		from_systemd ? " (from systemd)" : "");
	*out = h;
	return 0;
}

void kv_http_stop(struct kv_http *h)
{
	if (!h)
		return;
	h->stopping = 1;
	if (h->d->loop.ring.ring_fd > 0) {
		if (h->pw.armed)
			kv_loop_cancel(&h->d->loop, &h->pw);
		if (h->tw.armed)
			kv_loop_cancel(&h->d->loop, &h->tw);
	}
	MHD_stop_daemon(h->mhd);   /* closes the connections and the listening socket */
	free(h->text);
	free(h);
}

#else /* !KV_HAVE_HTTP */

int kv_http_start(struct kv_daemon *d, const char *listen_at, int fd, struct kv_http **out)
{
	(void)d;
	(void)listen_at;
	*out = NULL;
	if (fd >= 0) {
		kv_warn("a metrics socket was passed (fd %d) but this kvcached is built without HTTP "
			"support: closed; use 'kvctl metrics'", fd);
		close(fd);
	}
	return 0;
}

void kv_http_stop(struct kv_http *h)
{
	(void)h;
}

#endif
