/* Fuzzing GET /metrics (issue 29): whatever bytes a client sends on an HTTP
 * connection, through libmicrohttpd and kvcached's callbacks (admission,
 * header deadline, the path as sent, the exposition the loop builds and
 * hands over) (libFuzzer; replayed by the normal suite).
 *
 * Once per process: fuzzd.h's tiny daemon, with a pool, and kv_http on a
 * loopback socket of the harness's (metrics_min_interval 0: every scrape
 * asks the loop for an exposition, which this thread builds by turning the
 * loop). Each input is sent on a new connection, which is then shut for
 * writing; the reply is read to its end while the loop turns.
 * Findings: a crash or sanitizer report; a 200 to anything but a GET or
 * HEAD of exactly /metrics (a query string aside; see asks_metrics()); a 200 without the
 * exposition; no answer and no close within 10 s. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzzd.h"
#include "http.h"
#include "metrics.h"
#include "kvconfig.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct sockaddr_in at;
static struct kv_http *http;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	static char dir[] = "/tmp/kvfuzz-http.XXXXXX";
	socklen_t len = sizeof(at);
	int fd;

	(void)argc;
	(void)argv;
	if (!kv_http_built())
		return 0;
	fz_start(dir, 0);
	fz_d.cfg.metrics_min_interval_ms = 0;
	/* A partial request waits for the header deadline (libmicrohttpd does
	 * not notice the end of input there): short, for speed. */
	fz_d.cfg.metrics_header_timeout_ms = 20;
	fz_d.cfg.metrics_max_connections = 8;
	fz_d.cfg.metrics_max_connections_per_address = 8;
	fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	at.sin_family = AF_INET;
	at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || bind(fd, (struct sockaddr *)&at, sizeof(at)) < 0 || listen(fd, 64) < 0 ||
	    getsockname(fd, (struct sockaddr *)&at, &len) < 0 ||
	    kv_http_start(&fz_d, kv_metrics_page, "", fd, &http) < 0) {
		fprintf(stderr, "fuzz_http: cannot serve HTTP\n");
		exit(1);
	}
	return 0;
}

/* The method of data's request line if that line asks for /metrics (GET or
 * HEAD, the path "/metrics" or "/metrics?query"), else NULL. The request line
 * is found as libmicrohttpd (0.9.75, connection.c) finds it: a line ends at
 * an LF or a CR LF (a bare CR is an ordinary byte); lines before it that are
 * empty (RFC 9112 2.2 lets a server ignore them) or begin with a NUL (empty
 * as C strings: libmicrohttpd drops them whole, nothing on them is read) are
 * skipped. Its first word is the method, the next after a run of spaces the
 * path. A NUL inside the request line stays part of its word here, so such
 * a line asks for nothing (the daemon answers 400). */
static const char *asks_metrics(const uint8_t *data, size_t size)
{
	static const char *const methods[] = { "GET", "HEAD" };
	const uint8_t *p = data, *end = data + size, *eol, *w, *path;
	size_t mlen, plen;

	for (;;) {
		const uint8_t *lf = memchr(p, '\n', (size_t)(end - p));

		eol = lf ? lf : end;
		if (lf && eol > p && eol[-1] == '\r')
			eol--;
		if (eol > p && *p != '\0')
			break;   /* the request line (without its end, if it has none) */
		if (!lf)
			return NULL;
		p = lf + 1;
	}
	for (w = p; w < eol && *w != ' '; w++)
		;
	mlen = (size_t)(w - p);
	while (w < eol && *w == ' ')
		w++;
	for (path = w; w < eol && *w != ' '; w++)
		;
	plen = (size_t)(w - path);
	if (!(plen == 8 || (plen > 8 && path[8] == '?')) || memcmp(path, "/metrics", 8))
		return NULL;
	for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++)
		if (mlen == strlen(methods[i]) && !memcmp(p, methods[i], mlen))
			return methods[i];
	return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char reply[1 << 20];
	size_t got = 0;
	int c, n, eof = 0;

	if (!http)
		return 0;
	c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c < 0 || connect(c, (struct sockaddr *)&at, sizeof(at)) < 0) {
		perror("fuzz_http: connect");
		exit(1);
	}
	if (size)
		(void)!send(c, data, size, MSG_NOSIGNAL);
	shutdown(c, SHUT_WR);
	for (n = 0; n < 10000 && !eof; n++) {
		struct pollfd p = { .fd = c, .events = POLLIN };

		kv_loop_run_once(&fz_d.loop, 0);
		if (poll(&p, 1, 1) <= 0)
			continue;
		for (;;) {
			ssize_t r = recv(c, reply + got, sizeof(reply) - 1 - got, MSG_DONTWAIT);

			if (r > 0) {
				got += (size_t)r;
				if (got == sizeof(reply) - 1)
					eof = 1;   /* enough to judge */
				continue;
			}
			if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
				eof = 1;
			break;
		}
	}
	close(c);
	if (!eof)
		fz_finding("no answer and no close within 10 s");
	reply[got] = '\0';
	if (got >= 12 && !memcmp(reply, "HTTP/1.", 7) && !memcmp(reply + 8, " 200", 4)) {
		const char *method = asks_metrics(data, size);

		if (!method)
			fz_finding("200 to a request that is not GET or HEAD of /metrics");
		if (method && !strcmp(method, "GET") && !strstr(reply, "kvcached_info"))
			fz_finding("200 without the exposition");
	}
	return 0;
}
