/* The Prometheus endpoint over HTTP: GET /metrics, the same exposition
 * `kvctl metrics` prints (metrics.h), served by libmicrohttpd inside the
 * event loop thread.
 *
 * libmicrohttpd runs with no thread of its own (epoll, external loop): the
 * loop polls its epoll fd and arms one timer from MHD_get_timeout(), and
 * each wakeup calls MHD_run(), which never blocks. So the exposition is
 * written in the loop thread, like every other read of the daemon's state,
 * with no lock. What an HTTP client can make the daemon spend is bounded:
 * KV_HTTP_CONNS connections (more wait in the backlog), KV_HTTP_TIMEOUT_S
 * seconds of silence per connection, KV_HTTP_CONN_MEMORY bytes of request
 * per connection (a longer request line or header is refused by
 * libmicrohttpd), no request body read, and one exposition written at most
 * every KV_HTTP_CACHE_MS (scrapes in between get a copy of the last one).
 *
 * GET and HEAD of /metrics only: 404 for another path, 405 for another
 * method. The listening socket is metrics_listen (HOST:PORT, bound here), or
 * the socket systemd passes under the name "metrics" (kvcached-metrics.socket).
 *
 * Built without libmicrohttpd (KV_HAVE_HTTP 0), metrics_listen is refused
 * by the configuration check and a passed socket is closed with a warning. */
#ifndef KV_HTTP_H
#define KV_HTTP_H

#include <stddef.h>
#include <sys/socket.h>

#define KV_HTTP_CONNS 16
#define KV_HTTP_TIMEOUT_S 10
#define KV_HTTP_CONN_MEMORY (16 * 1024)
#define KV_HTTP_CACHE_MS 100

struct kv_daemon;
struct kv_http;

/* Whether this build serves HTTP. */
int kv_http_built(void);

/* Parses a metrics_listen value: "HOST:PORT" with a numeric IPv4 address,
 * or "[V6]:PORT" with a numeric IPv6 one; PORT 0..65535 (0: any free port).
 * Returns 0 with *sa and *len set, or -EINVAL with a message in err. */
int kv_http_parse_listen(const char *s, struct sockaddr_storage *sa, socklen_t *len, char *err,
			 size_t errlen);
/* The configuration check of metrics_listen: "" (off), or a valid address
 * in a build with HTTP. Returns 0 or -EINVAL with a message in err. */
int kv_http_check_listen(const char *s, char *err, size_t errlen);

/* Serves /metrics of d on fd (a listening stream socket from systemd,
 * taken over) or, when fd < 0, on a socket bound to listen. Returns 0 with
 * *out set, or -errno (logged; fd is closed). */
int kv_http_start(struct kv_daemon *d, const char *listen, int fd, struct kv_http **out);
/* Stops serving: closes the connections and the listening socket, frees h.
 * Called with the loop stopped (no completion is delivered after it), before
 * the loop's ring goes. NULL is fine. */
void kv_http_stop(struct kv_http *h);

#endif
