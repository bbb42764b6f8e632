/* GET /metrics over HTTP; see http.h.
 *
 * One file of about 900 lines, on purpose: the loop's side (building the
 * exposition a page a turn) and the HTTP thread's side (admission, the
 * bounds, the deadlines) hand one private struct kv_http and its eventfds
 * back and forth, and split in two they would need that struct in a shared
 * header only they include; the listen-address parsing at the top is the
 * only part that stands alone, and it is small. */
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "hist.h"
#include "kvconfig.h"
#include "log.h"

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

/* One HTTP connection, HTTP thread only. */
struct hconn {
	struct hconn *next, *prev;
	struct MHD_Connection *conn;
	int fd;
	unsigned char addr[16];      /* the peer's address (v4: the first 4 bytes) */
	uint64_t start_ns;           /* accepted */
	int requested;               /* its request is whole: no header deadline any more */
	int suspended;               /* waiting for an exposition */
	int closing;                 /* shut down by us; libmicrohttpd closes it */
	uint64_t want_gen;           /* suspended: served once gen reaches it */
};

struct kv_http {
	struct kv_daemon *d;
	kv_http_page_fn page;        /* builds the exposition (kv_metrics_page) */
	struct MHD_Daemon *mhd;
	int wake_http;               /* eventfd: the loop -> the HTTP thread */
	int wake_loop;               /* eventfd: the HTTP thread -> the loop */
	pthread_t thread;
	int thread_on;
	uint64_t min_interval_ns, header_ns;
	uint32_t max_conns, max_per_addr;

	/* Loop side: the build of one exposition, a page per turn. */
	struct kv_loop_watch ew;     /* poll of wake_loop: multishot */
	struct kv_loop_watch bw;     /* the next page: a timeout of 0 */
	int stopping;
	int building;
	uint64_t pos;
	char *buf;
	size_t len;
	uint64_t built_ns;           /* when the last build finished */
	uint64_t builds;
	uint64_t build_cpu_ns;       /* loop thread CPU time in build_step() */
	struct kv_ratelimit log_rl;

	/* Shared, under mu. */
	pthread_mutex_t mu;
	int stop;
	int has_ready;               /* a build finished that the HTTP thread has not taken */
	char *ready;                 /* its text (NULL: out of memory) */
	size_t ready_len;
	uint64_t ready_ns;
	char complaint[200];         /* libmicrohttpd's last, for the loop to log */
	uint64_t complaints;

	/* HTTP thread only. */
	struct MHD_Response *cur;    /* the last exposition, shared by every scrape */
	uint64_t cur_ns, gen;
	int asked;                   /* a build asked for, not delivered yet */
	struct hconn conns;          /* list head */
	uint32_t nconns;

	/* Counters (the HTTP thread writes, the loop reads: relaxed atomics). */
	_Atomic uint64_t served, evicted, deadline_closed, refused;
};

static const char content_type[] = "text/plain; version=0.0.4; charset=utf-8";

static void eventfd_poke(int fd)
{
	uint64_t one = 1;

	if (write(fd, &one, sizeof(one)) < 0) {
		/* EAGAIN: the counter is full, a wakeup is pending anyway */
	}
}

static void eventfd_drain(int fd)
{
	uint64_t v;

	if (read(fd, &v, sizeof(v)) < 0) {
		/* EAGAIN: nothing pending */
	}
}

/* ---- The loop's side: builds the exposition, one page per turn. ---- */

#define HTTP_PAGE_BYTES (64 * 1024)

/* The calling thread's CPU time, ns (0 if the clock fails). */
static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) < 0)
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void build_step(struct kv_http *h)
{
	uint64_t cpu = thread_cpu_ns();
	char *t;
	ssize_t n;

	n = h->page(h->d, &h->pos, HTTP_PAGE_BYTES, &t);
	if (n >= 0) {
		char *nb = realloc(h->buf, h->len + (size_t)n + 1);

		if (nb) {
			memcpy(nb + h->len, t, (size_t)n);
			h->len += (size_t)n;
			nb[h->len] = '\0';
			h->buf = nb;
		} else {
			n = -ENOMEM;
		}
		free(t);
	}
	if (n < 0) {
		/* Out of memory: an empty exposition answers 500 (below). */
		free(h->buf);
		h->buf = NULL;
		h->len = 0;
		h->pos = KV_HTTP_PAGE_DONE;
	}
	/* What a page holds the loop for, apart from waiting for a CPU. */
	h->build_cpu_ns += thread_cpu_ns() - cpu;
	if (h->pos != KV_HTTP_PAGE_DONE) {
		if (kv_loop_timeout(&h->d->loop, &h->bw, 0) == 0)
			return;
		/* No room in the ring: finish in this turn. */
		build_step(h);
		return;
	}
	h->building = 0;
	h->built_ns = kv_hist_now_ns();
	h->builds++;
	pthread_mutex_lock(&h->mu);
	free(h->ready);
	h->has_ready = 1;
	h->ready = h->buf;
	h->ready_len = h->len;
	h->ready_ns = h->built_ns;
	pthread_mutex_unlock(&h->mu);
	h->buf = NULL;
	h->len = 0;
	eventfd_poke(h->wake_http);
}

static void on_page(struct kv_loop_watch *w, int res, int more)
{
	struct kv_http *h = kv_container_of(w, struct kv_http, bw);

	(void)res;
	(void)more;
	if (!h->stopping && h->building)
		build_step(h);
}

/* The HTTP thread asks for an exposition. */
static void on_ask(struct kv_loop_watch *w, int res, int more)
{
	struct kv_http *h = kv_container_of(w, struct kv_http, ew);
	char msg[sizeof(h->complaint)];
	uint64_t n, held;

	(void)res;
	if (h->stopping)
		return;
	eventfd_drain(h->wake_loop);
	pthread_mutex_lock(&h->mu);
	n = h->complaints;
	h->complaints = 0;
	memcpy(msg, h->complaint, sizeof(msg));
	pthread_mutex_unlock(&h->mu);
	/* libmicrohttpd's complaints (a client can cause them at will): at
	 * most one line a second. */
	if (n && kv_ratelimit(&h->log_rl, &held))
		kv_warn("metrics over HTTP: %s (%llu such lines in all since the last)", msg,
			(unsigned long long)(n + held));
	if (!h->building) {
		h->building = 1;
		h->pos = 0;
		build_step(h);
	}
	if (!more && !h->d->loop.stop &&
	    kv_loop_poll(&h->d->loop, &h->ew, h->wake_loop, POLLIN, 1) < 0)
		kv_err("metrics over HTTP: cannot poll; the endpoint stops answering");
}

/* ---- The HTTP thread. ---- */

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status, const char *body,
			     size_t len, const char *type)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body,
								 MHD_RESPMEM_PERSISTENT);
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

static struct hconn *hconn_of(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return ci ? ci->socket_context : NULL;
}

/* Every request is answered on its first call, before any body is read:
 * libmicrohttpd then closes a connection whose request carried one. A
 * scrape that finds the last exposition older than metrics_min_interval
 * waits (suspended) for the next, which the loop builds once for every
 * scrape waiting. */
/* The query's first key (the lowest address): where the path's '?' was. */
static enum MHD_Result first_key(void *cls, enum MHD_ValueKind kind, const char *key,
				 const char *value)
{
	const char **first = cls;

	(void)kind;
	(void)value;
	if (key && (!*first || key < *first))
		*first = key;
	return MHD_YES;
}

/* Whether the request line as sent had a NUL in its method or its path.
 * libmicrohttpd hands over C strings, so "GET\0\0D /metrics" arrives as
 * method "GET" and "GET /metrics\0x HTTP/1.0" as path "/metrics" (found by
 * scripts/fuzz, harness http). It parses the line in place in its read
 * buffer, "METHOD SP+ PATH[?QUERY] SP+ VERSION", each first space and the
 * '?' made a NUL: so after the method's end come only the spaces before url,
 * and after url's end either the query's first key or only the spaces
 * before version. Where the strings are not so laid out (another
 * libmicrohttpd), nothing is concluded. */
static int line_has_nul(struct MHD_Connection *conn, const char *method, const char *url,
			const char *version)
{
	size_t m = strlen(method), u = strlen(url);
	const char *p, *key = NULL;

	if (url > method + m && url - method <= KV_HTTP_CONN_MEMORY)
		for (p = method + m + 1; p < url; p++)
			if (*p != ' ')
				return 1;
	MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, first_key, &key);
	if (key && key > url && key - url <= KV_HTTP_CONN_MEMORY)
		return key != url + u + 1;
	if (version > url + u && version - url <= KV_HTTP_CONN_MEMORY)
		for (p = url + u + 1; p < version; p++)
			if (*p != ' ')
				return 1;
	return 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
				  const char *method, const char *version,
				  const char *upload_data, size_t *upload_data_size,
				  void **req_cls)
{
	static const char not_found[] = "not found: kvcached serves /metrics only\n";
	static const char not_allowed[] = "method not allowed: GET or HEAD /metrics\n";
	static const char bad_line[] = "bad request line\n";
	static const char no_memory[] = "out of memory\n";
	struct kv_http *h = cls;
	struct hconn *hc = hconn_of(conn);
	uint64_t now = kv_hist_now_ns();

	(void)upload_data;
	(void)upload_data_size;
	if (hc)
		hc->requested = 1;
	if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
		return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, not_allowed, sizeof(not_allowed) - 1,
			     "text/plain; charset=utf-8");
	/* A NUL in the line (or an empty query, "/metrics?", which this check
	 * cannot tell from "/metrics\0"): 400. */
	if (line_has_nul(conn, method, url, version))
		return reply(conn, MHD_HTTP_BAD_REQUEST, bad_line, sizeof(bad_line) - 1,
			     "text/plain; charset=utf-8");
	/* url is the path as sent (no unescaping: on_unescape), so
	 * "/metrics%00.txt" is not "/metrics". */
	if (strcmp(url, "/metrics"))
		return reply(conn, MHD_HTTP_NOT_FOUND, not_found, sizeof(not_found) - 1,
			     "text/plain; charset=utf-8");
	if (h->cur && (now - h->cur_ns < h->min_interval_ns ||
		       (*req_cls && h->gen >= (uint64_t)(uintptr_t)*req_cls))) {
		atomic_fetch_add_explicit(&h->served, 1, memory_order_relaxed);
		return MHD_queue_response(conn, MHD_HTTP_OK, h->cur);
	}
	if (*req_cls && h->gen >= (uint64_t)(uintptr_t)*req_cls)   /* built, but no memory */
		return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, no_memory, sizeof(no_memory) - 1,
			     "text/plain; charset=utf-8");
	/* Wait for the next one. */
	*req_cls = (void *)(uintptr_t)(h->gen + 1);
	if (!h->asked) {
		h->asked = 1;
		eventfd_poke(h->wake_loop);
	}
	if (hc) {
		hc->suspended = 1;
		hc->want_gen = h->gen + 1;
	}
	MHD_suspend_connection(conn);
	return MHD_YES;
}

/* The path is compared as sent: no %-decoding (a client has no reason to
 * encode "/metrics", and a decoded NUL would end the string early). */
static size_t on_unescape(void *cls, struct MHD_Connection *c, char *s)
{
	(void)cls;
	(void)c;
	return strlen(s);
}

static void hconn_close(struct kv_http *h, struct hconn *hc, _Atomic uint64_t *counter)
{
	if (hc->closing)
		return;
	hc->closing = 1;
	atomic_fetch_add_explicit(counter, 1, memory_order_relaxed);
	/* libmicrohttpd sees the end of the stream and closes it; a suspended
	 * connection is resumed first, or it would never look. */
	shutdown(hc->fd, SHUT_RDWR);
	(void)h;
}

/* A connection over a bound: the oldest one from the same address (or,
 * over the global bound, from anyone) still sending its request after
 * HTTP_GRACE_NS makes room; when none is, the newcomer goes. So a peer that
 * holds connections open without finishing a request loses them to whoever
 * comes next, and a scrape's connection, whole within a round trip, keeps
 * its place even while a burst of newcomers arrives beside it. */
#define HTTP_GRACE_NS (250 * 1000000ull)

/* Whether the peer of a connection still sending its request has gone: an
 * end of stream with nothing left to read, or an error. Such a connection
 * can never finish its request; libmicrohttpd closes it on its next read,
 * but a burst of accepts can come before that read. */
static int peer_gone(const struct hconn *hc)
{
	char b;
	ssize_t n;

	if (hc->requested || hc->fd < 0)
		return 0;
	n = recv(hc->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
	return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* The connections that hold a place: not closing, and (sweep) not gone. */
static void count_live(struct kv_http *h, const struct hconn *nc, int sweep, uint32_t *same,
		       uint32_t *live)
{
	struct hconn *hc;

	*same = *live = 0;
	for (hc = h->conns.next; hc != &h->conns; hc = hc->next) {
		if (hc->closing)
			continue;
		if (sweep && hc != nc && peer_gone(hc)) {
			hc->closing = 1;
			shutdown(hc->fd, SHUT_RDWR);
			continue;
		}
		(*live)++;
		if (!memcmp(hc->addr, nc->addr, sizeof(nc->addr)))
			(*same)++;
	}
}

static void admit(struct kv_http *h, struct hconn *nc)
{
	struct hconn *hc, *oldest;
	uint32_t same, live;
	int over_addr, over_all;

	count_live(h, nc, 0, &same, &live);
	if (same > h->max_per_addr || live > h->max_conns)
		count_live(h, nc, 1, &same, &live);   /* peers that left hold no place */
	over_addr = same > h->max_per_addr;
	over_all = live > h->max_conns;
	if (!over_addr && !over_all)
		return;
	oldest = NULL;
	for (hc = h->conns.next; hc != &h->conns; hc = hc->next) {
		if (hc == nc || hc->closing || hc->requested ||
		    nc->start_ns - hc->start_ns < HTTP_GRACE_NS)
			continue;
		if (over_addr && !over_all && memcmp(hc->addr, nc->addr, sizeof(nc->addr)))
			continue;
		if (!oldest || hc->start_ns < oldest->start_ns)
			oldest = hc;
	}
	if (oldest)
		hconn_close(h, oldest, &h->evicted);
	else
		hconn_close(h, nc, &h->refused);
}

static void on_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
		      enum MHD_ConnectionNotificationCode toe)
{
	struct kv_http *h = cls;
	struct hconn *hc;

	if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *fi, *ai;

		*socket_context = NULL;
		if (!(hc = calloc(1, sizeof(*hc))))
			return;   /* untracked: libmicrohttpd's own bounds still hold */
		hc->conn = conn;
		fi = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
		hc->fd = fi ? fi->connect_fd : -1;
		ai = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
		if (ai && ai->client_addr) {
			if (ai->client_addr->sa_family == AF_INET)
				memcpy(hc->addr, &((const struct sockaddr_in *)ai->client_addr)->sin_addr, 4);
			else if (ai->client_addr->sa_family == AF_INET6)
				memcpy(hc->addr, &((const struct sockaddr_in6 *)ai->client_addr)->sin6_addr,
				       16);
		}
		hc->start_ns = kv_hist_now_ns();
		hc->next = &h->conns;
		hc->prev = h->conns.prev;
		h->conns.prev->next = hc;
		h->conns.prev = hc;
		h->nconns++;
		*socket_context = hc;
		if (hc->fd >= 0)
			admit(h, hc);
	} else if (toe == MHD_CONNECTION_NOTIFY_CLOSED && (hc = *socket_context)) {
		hc->prev->next = hc->next;
		hc->next->prev = hc->prev;
		h->nconns--;
		free(hc);
		*socket_context = NULL;
	}
}

/* libmicrohttpd's complaints: kept for the loop to log (the log is the
 * loop's). */
static void on_log(void *cls, const char *fmt, va_list ap)
{
	struct kv_http *h = cls;
	char msg[sizeof(h->complaint)];
	size_t n;

	vsnprintf(msg, sizeof(msg), fmt, ap);
	n = strlen(msg);
	while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
		msg[--n] = '\0';
	pthread_mutex_lock(&h->mu);
	memcpy(h->complaint, msg, sizeof(msg));
	h->complaints++;
	pthread_mutex_unlock(&h->mu);
}

/* Takes what the loop built: the new shared response; wakes the scrapes
 * that waited for it. Returns how many it woke. */
static int take_ready(struct kv_http *h)
{
	struct MHD_Response *r = NULL;
	struct hconn *hc;
	char *text;
	size_t len;
	uint64_t at;
	int has, woke = 0;

	pthread_mutex_lock(&h->mu);
	has = h->has_ready;
	text = h->ready;
	len = h->ready_len;
	at = h->ready_ns;
	h->ready = NULL;
	h->has_ready = 0;
	pthread_mutex_unlock(&h->mu);
	if (!has)
		return 0;
	if (text) {
		r = MHD_create_response_from_buffer_with_free_callback(len, text, free);
		if (r)
			MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
		else
			free(text);
	}
	if (h->cur)
		MHD_destroy_response(h->cur);   /* connections still sending it hold it */
	h->cur = r;
	h->cur_ns = at;
	h->gen++;
	h->asked = 0;
	for (hc = h->conns.next; hc != &h->conns; hc = hc->next) {
		if (hc->suspended && h->gen >= hc->want_gen) {
			hc->suspended = 0;
			MHD_resume_connection(hc->conn);
			woke++;
		}
	}
	return woke;
}

/* Closes connections past their header deadline; returns the ms until the
 * next deadline (or limit). */
static uint64_t sweep(struct kv_http *h, uint64_t limit_ms)
{
	uint64_t now = kv_hist_now_ns(), next = limit_ms;
	struct hconn *hc;

	for (hc = h->conns.next; hc != &h->conns; hc = hc->next) {
		uint64_t due = hc->start_ns + h->header_ns;

		if (hc->requested || hc->closing || hc->fd < 0)
			continue;
		if (now >= due)
			hconn_close(h, hc, &h->deadline_closed);
		else if ((due - now) / 1000000 + 1 < next)
			next = (due - now) / 1000000 + 1;
	}
	return next;
}

static void *http_main(void *arg)
{
	struct kv_http *h = arg;
	const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_EPOLL_FD);
	struct pollfd p[2] = { { .fd = info->epoll_fd, .events = POLLIN },
			       { .fd = h->wake_http, .events = POLLIN } };

	for (;;) {
		MHD_UNSIGNED_LONG_LONG ms;
		uint64_t wait;
		int stop;

		MHD_run(h->mhd);
		/* Resumed connections are taken up by the next MHD_run(), at once:
		 * their wakeup may not show on the epoll fd. */
		if (take_ready(h))
			continue;
		if (MHD_get_timeout(h->mhd, &ms) != MHD_YES || ms > 1000)
			ms = 1000;
		wait = sweep(h, ms);
		pthread_mutex_lock(&h->mu);
		stop = h->stop;
		pthread_mutex_unlock(&h->mu);
		if (stop)
			break;
		if (poll(p, 2, (int)wait) > 0 && (p[1].revents & POLLIN))
			eventfd_drain(h->wake_http);
	}
	return NULL;
}

void kv_http_stats(const struct kv_http *h, struct kv_http_stats *st)
{
	memset(st, 0, sizeof(*st));
	if (!h)
		return;
	st->builds = h->builds;
	st->build_cpu_ns = h->build_cpu_ns;
	st->served = atomic_load_explicit(&h->served, memory_order_relaxed);
	st->evicted = atomic_load_explicit(&h->evicted, memory_order_relaxed);
	st->deadline_closed = atomic_load_explicit(&h->deadline_closed, memory_order_relaxed);
	st->refused = atomic_load_explicit(&h->refused, memory_order_relaxed);
}

int kv_http_start(struct kv_daemon *d, kv_http_page_fn page, const char *listen_at, int fd,
		  struct kv_http **out)
{
	const struct kv_config *cfg = &d->cfg;
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
		if (bind(fd, (struct sockaddr *)&sa, len) < 0 || listen(fd, 128) < 0) {
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
	h->page = page;
	h->ew.cb = on_ask;
	h->bw.cb = on_page;
	h->log_rl.interval_ms = 1000;
	h->conns.next = h->conns.prev = &h->conns;
	h->min_interval_ns = cfg->metrics_min_interval_ms * 1000000u;
	h->header_ns = (cfg->metrics_header_timeout_ms ? cfg->metrics_header_timeout_ms : 2000) *
		       1000000u;
	h->max_conns = cfg->metrics_max_connections ? cfg->metrics_max_connections : 64;
	h->max_per_addr = cfg->metrics_max_connections_per_address
				  ? cfg->metrics_max_connections_per_address : 16;
	pthread_mutex_init(&h->mu, NULL);
	h->wake_loop = -1;
	h->wake_http = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	h->wake_loop = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (h->wake_http < 0 || h->wake_loop < 0) {
		r = -errno;
		goto fail_fd;
	}
	/* No thread of libmicrohttpd's: MHD_run() from ours (http_main), which
	 * also keeps the header deadline. One more connection than the bound
	 * is let in, so that admit() can choose who goes. */
	h->mhd = MHD_start_daemon(MHD_USE_EPOLL | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME, 0,
				  NULL, NULL, on_request, h,
				  MHD_OPTION_EXTERNAL_LOGGER, on_log, h,
				  MHD_OPTION_NOTIFY_CONNECTION, on_notify, h,
				  MHD_OPTION_UNESCAPE_CALLBACK, on_unescape, h,
				  MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
				  MHD_OPTION_CONNECTION_LIMIT, (unsigned)h->max_conns + 1,
				  MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)KV_HTTP_TIMEOUT_S,
				  MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)KV_HTTP_CONN_MEMORY,
				  MHD_OPTION_END);
	if (!h->mhd) {
		kv_err("metrics over HTTP: libmicrohttpd did not start on %s",
		       sock_name(fd, name, sizeof(name)));
		r = -EINVAL;
		goto fail_fd;
	}
	if ((r = -pthread_create(&h->thread, NULL, http_main, h)) < 0) {
		kv_err("metrics over HTTP: cannot start its thread: %s", strerror(-r));
		goto fail_mhd;
	}
	if ((r = kv_loop_poll(&d->loop, &h->ew, h->wake_loop, POLLIN, 1)) < 0) {
		kv_err("metrics over HTTP: cannot poll its eventfd");
		pthread_mutex_lock(&h->mu);
		h->stop = 1;
		pthread_mutex_unlock(&h->mu);
		eventfd_poke(h->wake_http);
		pthread_join(h->thread, NULL);
		goto fail_mhd;
	}
	h->thread_on = 1;
	kv_info("metrics over HTTP on %s%s: GET /metrics", sock_name(fd, name, sizeof(name)),
		from_systemd ? " (from systemd)" : "");
	*out = h;
	return 0;
fail_fd:
	close(fd);
fail_mhd:
	if (h->mhd)
		MHD_stop_daemon(h->mhd);   /* closes fd */
	if (h->wake_http >= 0)
		close(h->wake_http);
	if (h->wake_loop >= 0)
		close(h->wake_loop);
	if (h->cur)
		MHD_destroy_response(h->cur);
	pthread_mutex_destroy(&h->mu);
	free(h->ready);
	free(h);
	return r;
}

void kv_http_stop(struct kv_http *h)
{
	if (!h)
		return;
	h->stopping = 1;
	if (h->d->loop.ring.ring_fd > 0) {
		if (h->ew.armed)
			kv_loop_cancel(&h->d->loop, &h->ew);
		if (h->bw.armed)
			kv_loop_cancel(&h->d->loop, &h->bw);
	}
	if (h->thread_on) {
		pthread_mutex_lock(&h->mu);
		h->stop = 1;
		pthread_mutex_unlock(&h->mu);
		eventfd_poke(h->wake_http);
		pthread_join(h->thread, NULL);
	}
	/* Suspended connections are resumed before libmicrohttpd stops. */
	{
		struct hconn *hc;

		for (hc = h->conns.next; hc != &h->conns; hc = hc->next)
			if (hc->suspended) {
				hc->suspended = 0;
				MHD_resume_connection(hc->conn);
			}
	}
	if (h->cur)
		MHD_destroy_response(h->cur);
	h->cur = NULL;
	MHD_stop_daemon(h->mhd);   /* closes the connections and the listening socket */
	close(h->wake_http);
	close(h->wake_loop);
	pthread_mutex_destroy(&h->mu);
	free(h->ready);
	free(h->buf);
	free(h);
}

#else /* !KV_HAVE_HTTP */

int kv_http_start(struct kv_daemon *d, kv_http_page_fn page, const char *listen_at, int fd,
		  struct kv_http **out)
{
	(void)d;
	(void)page;
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

void kv_http_stats(const struct kv_http *h, struct kv_http_stats *st)
{
	(void)h;
	memset(st, 0, sizeof(*st));
}

#endif
