/* The Prometheus endpoint over HTTP: GET /metrics, the same exposition
 * `kvctl metrics` prints (metrics.h).
 *
 * Nothing an HTTP client does can hold the event loop (issue 29): the HTTP
 * connections are served by a thread of their own (libmicrohttpd driven by
 * MHD_run() from http_main), which never reads the daemon's state. A scrape
 * takes the last exposition if it is younger than metrics_min_interval, else
 * it waits (suspended) and asks the loop for one; the loop builds it in
 * pages of 64 KiB, one per turn (so a worker's request waits for one page at
 * most, whatever the number of pools), and hands it over. One exposition is
 * shared by every scrape that sends it (one libmicrohttpd response, counted
 * references, no copy), and one build answers every scrape waiting.
 *
 * What a client can make the daemon spend is bounded: metrics_max_connections
 * connections, metrics_max_connections_per_address from one peer address (over
 * either, the oldest connection still sending its request is closed for the
 * newcomer, or the newcomer when every connection has sent its request),
 * metrics_header_timeout from accept to a whole request (the header deadline:
 * a byte now and then does not extend it), KV_HTTP_TIMEOUT_S seconds of
 * silence while the reply is sent, KV_HTTP_CONN_MEMORY bytes of request
 * (a longer request line or header is refused by libmicrohttpd), no request
 * body read.
 *
 * GET and HEAD of /metrics only, the path compared as sent (no %-decoding:
 * "/metrics%00.txt" is a 404): 404 for another path, 405 for another method,
 * 400 for a NUL byte in the request line's method or path.
 * The listening socket is metrics_listen (HOST:PORT, bound here), or the
 * socket systemd passes under the name "metrics" (kvcached-metrics.socket).
 *
 * Built without libmicrohttpd (KV_HAVE_HTTP 0), metrics_listen is refused
 * by the configuration check and a passed socket is closed with a warning. */
#ifndef KV_HTTP_H
#define KV_HTTP_H

#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <stdint.h>

#define KV_HTTP_TIMEOUT_S 10
#define KV_HTTP_CONN_MEMORY (16 * 1024)

/* For the metrics (kvcached_http_*). */
struct kv_http_stats {
	uint64_t builds;            /* expositions built */
	uint64_t build_cpu_ns;      /* the loop thread's CPU time building them */
	uint64_t served;            /* scrapes answered 200 */
	uint64_t evicted;           /* connections closed for a newcomer (over a bound) */
	uint64_t deadline_closed;   /* closed past metrics_header_timeout */
	uint64_t refused;           /* newcomers closed: every connection had sent its request */
};

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

/* What builds the exposition, a page per call, on the loop: metrics.h's
 * kv_metrics_page(), which the server passes in (so that http, the metrics
 * module and the modules they read do not include each other). *pos is 0 at
 * the start and becomes KV_HTTP_PAGE_DONE after the last page. */
typedef ssize_t (*kv_http_page_fn)(const struct kv_daemon *d, uint64_t *pos, size_t limit,
				   char **text);
#define KV_HTTP_PAGE_DONE UINT64_MAX

/* Serves /metrics of d, built by page, on fd (a listening stream socket
 * from systemd, taken over) or, when fd < 0, on a socket bound to listen.
 * Returns 0 with *out set, or -errno (logged; fd is closed). */
int kv_http_start(struct kv_daemon *d, kv_http_page_fn page, const char *listen, int fd,
		  struct kv_http **out);
/* Stops serving: closes the connections and the listening socket, frees h.
 * Called with the loop stopped (no completion is delivered after it), before
 * the loop's ring goes. NULL is fine. */
void kv_http_stop(struct kv_http *h);
/* h's counters; zeros for NULL (HTTP off). Called from the loop. */
void kv_http_stats(const struct kv_http *h, struct kv_http_stats *st);

#endif
