/* Frame header codec and fd-passing socket helpers; see frame.h. */
#include "frame.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kvassert.h"

void kv_frame_hdr_encode(uint8_t out[KV_FRAME_HDR], uint32_t len, uint16_t flags)
{
	out[0] = len & 0xff;
	out[1] = (len >> 8) & 0xff;
	out[2] = (len >> 16) & 0xff;
	out[3] = (len >> 24) & 0xff;
	out[4] = flags & 0xff;
	out[5] = flags >> 8;
	out[6] = KV_FRAME_MAGIC & 0xff;
	out[7] = KV_FRAME_MAGIC >> 8;
}

int kv_frame_hdr_decode(const uint8_t in[KV_FRAME_HDR], uint32_t max, uint32_t *len)
{
	uint32_t l = (uint32_t)in[0] | (uint32_t)in[1] << 8 | (uint32_t)in[2] << 16 |
		     (uint32_t)in[3] << 24;
	uint16_t flags = (uint16_t)(in[4] | in[5] << 8);
	uint16_t magic = (uint16_t)(in[6] | in[7] << 8);

	if (magic != KV_FRAME_MAGIC || flags != 0)
		return -EPROTO;
	if (l > max)
		return -EMSGSIZE;
	*len = l;
	return 0;
}

ssize_t kv_sendmsg_fds(int sock, const struct iovec *iov, int iovcnt,
		       const int *fds, int nfds, int flags)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * KV_FRAME_MAX_FDS)];
		struct cmsghdr align;
	} u;
	struct msghdr msg = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt };
	ssize_t n;

	if (nfds < 0 || nfds > KV_FRAME_MAX_FDS)
		return -EINVAL;
	if (nfds > 0) {
		struct cmsghdr *c;

		memset(&u, 0, sizeof(u));
		msg.msg_control = u.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
	}
	do
		n = sendmsg(sock, &msg, flags | MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	return n < 0 ? -errno : n;
}

ssize_t kv_recvmsg_fds(int sock, void *buf, size_t len, int *fds, int *nfds,
		       int maxfds, int flags, int *truncated)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * KV_FRAME_MAX_FDS)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1,
			      .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	struct cmsghdr *c;
	ssize_t n;

	do
		n = recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	kv_assert(*nfds >= 0 && *nfds <= maxfds);
	for (c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		size_t i, cnt;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		cnt = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (i = 0; i < cnt; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (*nfds < maxfds) {
				fds[(*nfds)++] = fd;
			} else {
				close(fd);
				if (truncated)
					*truncated = 1;
			}
		}
	}
	if ((msg.msg_flags & MSG_CTRUNC) && truncated)
		*truncated = 1;
	return n;
}

int kv_socket_default(char *buf, size_t len)
{
	const char *env = secure_getenv("KVCACHED_SOCKET");
	const char *xdg = secure_getenv("XDG_RUNTIME_DIR");
	int n;

	if (env && *env)
		n = snprintf(buf, len, "%s", env);
	else if (geteuid() != 0 && xdg && *xdg)
		n = snprintf(buf, len, "%s/kvcached.sock", xdg);
	else
		n = snprintf(buf, len, "/run/kvcached/kvcached.sock");
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int kv_admin_socket_default(const char *worker, char *buf, size_t len)
{
	const char *env = secure_getenv("KVCACHED_ADMIN_SOCKET");
	size_t n = strlen(worker);
	int r;

	if (env && *env)
		r = snprintf(buf, len, "%s", env);
	else if (n >= 5 && !strcmp(worker + n - 5, ".sock"))
		r = snprintf(buf, len, "%.*s-admin.sock", (int)(n - 5), worker);
	else
		r = snprintf(buf, len, "%s-admin.sock", worker);
	return r < 0 || (size_t)r >= len ? -ENAMETOOLONG : 0;
}
