/* Frame header codec and fd passing over a real socketpair. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "frame.h"

int main(void)
{
	uint8_t h[KV_FRAME_HDR];
	uint32_t len = 7;
	int sv[2], fds[KV_FRAME_MAX_FDS], got[8], ngot = 0, trunc = 0, i;
	char buf[64];
	struct iovec iov = { "hello", 5 };

	kv_frame_hdr_encode(h, 123456, 0);
	CHECK(kv_frame_hdr_decode(h, 1 << 20, &len) == 0 && len == 123456);
	CHECK(kv_frame_hdr_decode(h, 1000, &len) == -EMSGSIZE && len == 123456);
	h[7] ^= 1;
	CHECK(kv_frame_hdr_decode(h, 1 << 20, &len) == -EPROTO);
	kv_frame_hdr_encode(h, 1, 3); /* flags are reserved */
	CHECK(kv_frame_hdr_decode(h, 1 << 20, &len) == -EPROTO);

	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	for (i = 0; i < 3; i++)
		fds[i] = open("/dev/null", O_RDONLY);
	CHECK(kv_sendmsg_fds(sv[0], &iov, 1, fds, 3, 0) == 5);
	CHECK(kv_recvmsg_fds(sv[1], buf, sizeof(buf), got, &ngot, 8, 0, &trunc) == 5);
	CHECK(ngot == 3 && !trunc && !memcmp(buf, "hello", 5));
	CHECK((fcntl(got[0], F_GETFD) & FD_CLOEXEC) != 0);
	for (i = 0; i < 3; i++)
		close(got[i]);

	/* More fds than the receiver takes: the rest are closed, trunc is set. */
	ngot = 0;
	CHECK(kv_sendmsg_fds(sv[0], &iov, 1, fds, 3, 0) == 5);
	CHECK(kv_recvmsg_fds(sv[1], buf, sizeof(buf), got, &ngot, 1, 0, &trunc) == 5);
	CHECK(ngot == 1 && trunc);
	close(got[0]);
	CHECK(kv_sendmsg_fds(sv[0], &iov, 1, fds, KV_FRAME_MAX_FDS + 1, 0) == -EINVAL);
	close(sv[0]);
	ngot = 0;
	CHECK(kv_recvmsg_fds(sv[1], buf, sizeof(buf), got, &ngot, 8, 0, NULL) == 0);
	for (i = 0; i < 3; i++)
		close(fds[i]);
	close(sv[1]);
	return 0;
}
