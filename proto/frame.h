/* Framing of the kvcached protocol over an AF_UNIX stream socket.
 *
 * A frame is an 8-byte header then `len` bytes of protobuf payload:
 *
 *   offset 0  u32 len     payload bytes, little endian, <= the negotiated max
 *   offset 4  u16 flags   reserved, must be 0 in version 1
 *   offset 6  u16 magic   0x4B56, little endian
 *
 * File descriptors travel as SCM_RIGHTS ancillary data, in order, no later
 * than the frame that announces them: a sender attaches them to the first
 * bytes it has not sent yet (which may be the tail of an earlier frame), at
 * most 253 per message. A receiver queues every fd it receives in arrival
 * order and takes them off the queue as the frames that announce them are
 * parsed.
 *
 * Used by both the daemon and libkvcache; knows nothing of either. */
#ifndef KV_FRAME_H
#define KV_FRAME_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#define KV_FRAME_HDR 8u
#define KV_FRAME_MAGIC 0x4B56u
#define KV_FRAME_MAX_FDS 253  /* fds one sendmsg may carry (SCM_MAX_FD) */
#define KV_PROTO_VERSION 1u

void kv_frame_hdr_encode(uint8_t out[KV_FRAME_HDR], uint32_t len, uint16_t flags);

/* Parses a header. Returns 0 and sets *len, -EPROTO for a bad magic or
 * flags, -EMSGSIZE when the length exceeds max. *len is untouched on error. */
int kv_frame_hdr_decode(const uint8_t in[KV_FRAME_HDR], uint32_t max, uint32_t *len);

/* sendmsg() of iov with fds (nfds may be 0) attached. MSG_NOSIGNAL is always
 * set; pass MSG_DONTWAIT in flags for a non-blocking send. Returns bytes sent
 * (possibly short) or -errno. The fds remain the caller's. */
ssize_t kv_sendmsg_fds(int sock, const struct iovec *iov, int iovcnt,
                       const int *fds, int nfds, int flags);

/* recvmsg() into buf, collecting SCM_RIGHTS fds into fds[*nfds..maxfds) and
 * advancing *nfds; fds beyond maxfds are closed and *truncated is set (may be
 * NULL). All received fds are O_CLOEXEC. Returns bytes read, 0 on EOF, or
 * -errno. */
ssize_t kv_recvmsg_fds(int sock, void *buf, size_t len, int *fds, int *nfds,
                       int maxfds, int flags, int *truncated);

/* The socket path every program resolves the same way: $KVCACHED_SOCKET,
 * else $XDG_RUNTIME_DIR/kvcached.sock for a user other than root, else
 * /run/kvcached/kvcached.sock. Returns 0, or -ENAMETOOLONG if buf is too
 * small. */
int kv_socket_default(char *buf, size_t len);

/* The admin socket that goes with the worker socket at `worker`:
 * $KVCACHED_ADMIN_SOCKET, else `worker` with its ".sock" suffix replaced by
 * "-admin.sock" ("-admin.sock" appended when it has none), so
 * /run/kvcached/kvcached.sock goes with /run/kvcached/kvcached-admin.sock.
 * Returns 0, or -ENAMETOOLONG if buf is too small. */
int kv_admin_socket_default(const char *worker, char *buf, size_t len);

#endif
