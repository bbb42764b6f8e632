/* Fuzzing the daemon's frame reader (conn.c) with arbitrary bytes and fds:
 * one connection per input over a real socketpair, taken over with
 * kv_conn_accept() and driven by the daemon's own event loop, one turn at a
 * time (kv_loop_run_once). libFuzzer; replayed by the normal suite.
 *
 * An input: byte 0 says how many fds (0..7, dups of /dev/null) go with the
 * stream and byte 1 after how many chunks; the rest is the stream, sent in
 * chunks whose sizes the stream's own bytes pick (so frames split anywhere),
 * then the peer's write side shuts. The peer reads and discards whatever the
 * daemon answers (fds included). The connection must end: the daemon closes
 * its side, on EOF or a bad frame. Then the invariant check must pass and
 * every block be released. Seeds are valid conversations (Hello, pools,
 * allocs, releases) for the mutations to start from. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "conn.h"
#include "frame.h"
#include "fuzzd.h"
#include "list.h"
#include "loop.h"

static struct kv_conns cs;
static char dir[64];

int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	snprintf(dir, sizeof(dir), "/tmp/kvfuzzf-XXXXXX");
	fz_start(dir, 0);
	kv_conns_init(&cs, &fz_d);
	return 0;
}

/* Reads and drops what the daemon sent; returns 1 once it closed. */
static int drain(int fd)
{
	for (;;) {
		uint8_t buf[4096];
		int fds[KV_FRAME_MAX_FDS], nfds = 0;
		ssize_t n = kv_recvmsg_fds(fd, buf, sizeof(buf), fds, &nfds, KV_FRAME_MAX_FDS,
					   MSG_DONTWAIT, NULL);

		while (nfds > 0)
			close(fds[--nfds]);
		if (n == 0)
			return 1;
		if (n < 0)
			return n != -EAGAIN && n != -EWOULDBLOCK;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int sv[2], nfds = size ? data[0] % 8 : 0, at = size > 1 ? data[1] % 8 : 0, fds[8];
	size_t off = size > 2 ? 2 : size;
	int closed = 0, chunk = 0;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		fz_finding("socketpair");
	fcntl(sv[0], F_SETFL, O_NONBLOCK);
	fcntl(sv[1], F_SETFL, O_NONBLOCK);
	kv_conn_accept(&cs, sv[0], 0);
	for (int i = 0; i < nfds; i++)
		fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
	while (off < size && !closed) {
		size_t len = 1 + data[off] % 64;
		struct iovec iov;
		ssize_t n;

		if (len > size - off)
			len = size - off;
		iov = (struct iovec){ (void *)(data + off), len };
		n = kv_sendmsg_fds(sv[1], &iov, 1, chunk == at ? fds : NULL,
				   chunk == at ? nfds : 0, MSG_DONTWAIT);
		if (n > 0) {
			off += (size_t)n;
			chunk++;
		} else if (n != -EAGAIN && n != -EWOULDBLOCK) {
			closed = 1;  /* the daemon closed: a bad frame */
		}
		kv_loop_run_once(&fz_d.loop, 0);
		closed |= drain(sv[1]);
	}
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	shutdown(sv[1], SHUT_WR);
	for (int k = 0; !closed; k++) {
		if (k > 2000)
			fz_finding("the daemon kept a connection whose peer had hung up");
		kv_loop_run_once(&fz_d.loop, 10);
		closed = drain(sv[1]);
	}
	close(sv[1]);
	/* The connection's last completions, then the checks. */
	for (int k = 0; k < 100 && kv_loop_run_once(&fz_d.loop, 0) > 0; k++)
		;
	fz_pump();
	/* The check runs through an admin session on no socket, opened only
	 * while no connection is open and the loop does not turn (conn.c
	 * takes every session it walks for one of its connections). */
	if (!kv_list_empty(&fz_d.sessions))
		fz_finding("a session outlived its connection");
	fz_open(FZ_ADMIN, "");
	if (!fz_check())
		fz_finding("the invariant check failed after a connection");
	kv_session_release(&fz_s[FZ_ADMIN]);
	if (fz_held_blocks())
		fz_finding("blocks held after the connection closed");
	return 0;
}
