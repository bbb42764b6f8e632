/* libkvcache internals: what kvctl, the tests and the library's own modules
 * share beyond the public kvcache.h. Not installed, no ABI promise.
 *
 * Linking: these functions are hidden in the installed libkvcache.so (whose
 * ABI is kvcache.h alone). Programs of this build that use them link
 * `kvcache_dep`, which carries the library's objects statically together
 * with the one copy of the protobuf code (kvproto) they share; that way a
 * Kvcached__Response unpacked by the library can be freed by the caller with
 * kvcached__response__free_unpacked() (protobuf-c checks the descriptor's
 * address). */
#ifndef KVC_INTERNAL_H
#define KVC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcache.h"
#include "kvcached.pb-c.h"

/* Marks the definitions of the public API (the library is built with
 * -fvisibility=hidden). */
#define KVC_PUBLIC __attribute__((visibility("default")))

/* Block handle fields (fixed64: gen:20 | pool:12 | page:20 | slot:12). */
#define KVC_BLOCK_POOL(b) ((uint32_t)((b) >> 32) & 0xfffu)
#define KVC_BLOCK_PAGE(b) ((uint32_t)((b) >> 12) & 0xfffffu)
#define KVC_BLOCK_SLOT(b) ((uint32_t)(b) & 0xfffu)
#define KVC_MAX_POOLS 4096u

/* Frame limit for the HelloReply, before the daemon has told its max_frame. */
#define KVC_HELLO_MAX_FRAME (1u << 20)

/* --- conn.c --------------------------------------------------------------- */

/* What the daemon said in its HelloReply: one per daemon session, immutable
 * (a reconnection makes a new one). */
struct kvc_hello {
	uint32_t version;
	uint64_t page_bytes;
	uint64_t segment_bytes;
	uint64_t device_bytes;
	uint32_t devices;
	uint32_t max_frame;
	uint32_t max_batch;
	uint64_t session_id;
	char backend[32];
};

/* Sends req on c and waits for its response. Fills req->id (ids increase per
 * connection). Maps the segments the response announces, whatever its
 * outcome. Takes the connection's mutex.
 *
 * Returns 0 and sets *resp (the caller frees it with
 * kvcached__response__free_unpacked(*resp, NULL)), or:
 * - -(1000 + code) when the response carries an error (its message is kept
 *   for kvc_last_error(); the response is freed, *resp untouched); an error
 *   Response with id 0 is about the connection (refused over the daemon's
 *   connection limits: KVC_EAGAIN; a protocol error: KVC_EPROTO), and the
 *   connection breaks;
 * - KVC_E2BIG when the packed request exceeds the daemon's max_frame (nothing
 *   sent);
 * - -EPIPE when the connection is broken;
 * - -EPROTO for a bad response (wrong id, oversize or undecodable frame, fewer
 *   fds than segments, a segment that does not fit the device range) and
 *   -errno for a socket or mapping failure: both break the connection (it is
 *   shut down, so that the daemon releases its references; later calls return
 *   -EPIPE) and leave a description in kvc_last_error(). A daemon error
 *   KVC_EPROTO breaks it too.
 * The result case of *resp is not checked: see kvc_call_check(). */
int kvc_call(kvc_conn *c, Kvcached__Request *req, Kvcached__Response **resp);

/* Checks a successful response before kvc_call_check() returns it: NULL when
 * it is acceptable, else a static description of what is wrong. Runs under
 * the connection's mutex; must not call into c. */
typedef const char *kvc_check_fn(const Kvcached__Response *resp, const void *arg);

/* kvc_call() with check(resp, arg) applied to a response that carries no
 * error: a response it rejects is a protocol violation (-EPROTO, the
 * connection breaks, its description goes to kvc_last_error()). check NULL =
 * kvc_call(). */
int kvc_call_check(kvc_conn *c, Kvcached__Request *req, kvc_check_fn *check, const void *arg,
		   Kvcached__Response **resp);

/* A decoder of one form of response straight from the receive buffer
 * (issue 38: protobuf-c's unpack of a lookup of 1,000's reply, an 8 KB copy
 * into a malloc'ed array and its free, was the largest part of the library's
 * time in kvc_lookup() after the request's). take(frame, len, id, arg) sees
 * the complete frame[0..len) (no header) of the response to request id and
 * returns 1 when it is in its form, the answer to id and acceptable, having
 * written its outputs; or 0, having written nothing, for any other frame,
 * which protobuf-c then decodes and the call's check judges as before (so
 * every error is reported as without it). Runs under the connection's mutex;
 * must not call into c; reads nothing outside frame[0..len). */
struct kvc_fast {
	int (*take)(const uint8_t *frame, size_t len, uint64_t id, void *arg);
	void *arg;
};

/* kvc_call_check() with fast tried on the response first (NULL: none).
 * Returns 0 with *resp NULL when fast took it, else what kvc_call_check()
 * returns. */
int kvc_call_fast(kvc_conn *c, Kvcached__Request *req, const struct kvc_fast *fast,
		  kvc_check_fn *check, const void *arg, Kvcached__Response **resp);

/* n requests on c, pipelined: written while their responses are read (never
 * waiting for room to write while answers are unread, so that any number of
 * them fits through the sockets' buffers), under one deadline for the whole
 * (the connection's timeout from the start of the call). Ids and pool ids
 * are filled as kvc_call_check() does. rc[i] is request i's outcome: 0 with
 * resps[i] set (check(resp, args[i]) passed; args may be NULL), or the
 * daemon's error for it (-(1000 + code), resps[i] NULL, c intact).
 * Returns 0 (every rc[i] set; the caller frees every non-NULL resps[i]), or
 * the failure of the whole, every resps[i] NULL: KVC_E2BIG (a request over
 * max_frame; nothing sent), -ENOMEM, or what breaks c in kvc_call() (-EPIPE,
 * -ETIMEDOUT, -EPROTO, a daemon error about the connection, -errno). A
 * daemon that went away is reconnected once and the whole batch runs again,
 * as in kvc_call_check(). */
int kvc_call_many(kvc_conn *c, Kvcached__Request *const *reqs, size_t n, kvc_check_fn *check,
		  const void *const *args, Kvcached__Response **resps, int *rc);

/* kvc_call_many() with fast[i] (fast NULL: none) tried on request i's
 * response first: rc[i] 0 with resps[i] NULL when it took it. A take that
 * wrote its outputs stays written if a later response breaks the batch. */
int kvc_call_many_fast(kvc_conn *c, Kvcached__Request *const *reqs, size_t n,
		       const struct kvc_fast *fast, kvc_check_fn *check, const void *const *args,
		       Kvcached__Response **resps, int *rc);

/* Registers pool d (checked by the caller) and remembers it: for
 * kvc_block_ptr() and kvc_pool_block_bytes(), and to register it again after
 * a reconnection. Returns the caller's id for it (the daemon's id, unless a
 * reconnection made them differ: Alloc, Seal and Lookup requests carry the
 * caller's id into kvc_call_check(), which puts the daemon's in its place)
 * or a negative error. */
int kvc_conn_register(kvc_conn *c, const struct kvc_pool_desc *d, const char *model);

/* The current session's HelloReply values; valid (unchanged) until
 * kvc_close(), while a reconnection may make another one current. Lock-free. */
const struct kvc_hello *kvc_conn_hello(const kvc_conn *c);

/* The socket, for tests that write raw bytes. Still owned by c. */
int kvc_conn_fd(const kvc_conn *c);

/* Whether a protocol or socket failure has broken c. */
bool kvc_conn_broken(const kvc_conn *c);

/* Whether segment index of device dev is mapped in this process. Lock-free. */
bool kvc_conn_segment_mapped(const kvc_conn *c, uint32_t dev, uint32_t index);

/* --- blocks.c ------------------------------------------------------------ */

/* A Response frame in the one form the daemon's packer writes for a block
 * list and nothing else (a success without segments): id (1, varint), at
 * most once, then blocks (12) to the end of the frame, holding blocks (1,
 * packed fixed64) and tiers (2, packed enum, each in one byte), each at most
 * once, in that order, nothing else. Every length is checked against the
 * frame, which the view points into (blocks: n little-endian fixed64s,
 * unaligned; tiers: ntiers bytes, each below 0x80). What it takes,
 * protobuf-c decodes to the same id, blocks and tiers with no error, no
 * segments and the blocks' result (test_reply_unpack). */
struct kvc_blocks_view {
	uint64_t id;
	const uint8_t *blocks;
	size_t n;
	const uint8_t *tiers;
	size_t ntiers;
};

/* 1 and *v when frame[0..len) is in that form; 2 and v->id when it holds an
 * id (at most once) and nothing else, which protobuf-c decodes to that id
 * with no error, no segments and no result (a Release's reply); else 0
 * (*v then meaningless). */
int kvc_blocks_view(const uint8_t *frame, size_t len, struct kvc_blocks_view *v);

/* Whether KVC_BLOCK_POOL(b) == want for every handle b of blocks[0..n) (n
 * fixed64s in the machine's order, unaligned, as a view holds them on a
 * little-endian machine, the only one take_fast() reads in place): true for
 * n 0, else false for any want >= KVC_MAX_POOLS. Reads nothing else. */
bool kvc_blocks_of_pool(const uint8_t *blocks, size_t n, uint64_t want);

/* --- map.c ---------------------------------------------------------------
 * Where segments live in this process: one virtual range of device_bytes per
 * device, reserved the first time a segment of the device arrives, and
 * segment s mapped whole at base + offset(s). On the host backend this is
 * mmap of the segment's memfd; on the cuda backend (map_cuda.c,
 * kvc_map_cu_*) cuMemImportFromShareableHandle + cuMemMap into a
 * cuMemAddressReserve range, and the addresses are device pointers.
 *
 * Threads: kvc_map_reserve and kvc_map_segment are called by one thread at a
 * time (the connection's mutex); kvc_map_base and kvc_map_is_mapped may run
 * concurrently with them from any thread. */
struct kvc_map;

/* A map for devices of device_bytes, cut into segments of segment_bytes (a
 * divisor of device_bytes), for the daemon's backend ("host" or "cuda"; ""
 * or NULL: host). Nothing is reserved or loaded yet (CUDA is loaded with the
 * first segment). Returns 0 or -ENOMEM, -EINVAL, -EPROTO (another backend
 * name), -ENOTSUP ("cuda" in a library built without CUDA). */
int kvc_map_new(const char *backend, uint32_t devices, uint64_t device_bytes,
		uint64_t segment_bytes, struct kvc_map **out);

/* cuda: the daemon devices' UUIDs (Hello; NULL from a daemon that sent
 * none), by which the map finds each one's GPU in this process, and the
 * device that gets access besides (kvc_options.cuda_device - 1; -1: none).
 * Before the first segment. Nothing on the host backend. */
void kvc_map_set_devices(struct kvc_map *m, const unsigned char (*uuid)[16], int cuda_device);

/* What the last failed kvc_map_segment() found beyond its return value (a
 * CUDA error, the devices involved), or "". Same thread rules as
 * kvc_map_segment(). */
const char *kvc_map_error(const struct kvc_map *m);

/* Whether addresses from this map are CUDA device pointers. */
bool kvc_map_is_cuda(const struct kvc_map *m);

/* Unmaps everything and frees m. NULL is fine. */
void kvc_map_free(struct kvc_map *m);

/* m belongs to a daemon that went away: its segments' memory is let go
 * (host: each mapped slice becomes private zero pages, so that a stale
 * pointer reads zeros instead of faulting; cuda: kept until kvc_map_free(),
 * since device pointers may still be in flight in kernels). Lock-free
 * readers may go on using m until kvc_map_free(). */
void kvc_map_retire(struct kvc_map *m);

/* Reserves dev's range if it is not yet. Returns 0, -EINVAL for a device out
 * of range, or -errno from the reservation. */
int kvc_map_reserve(struct kvc_map *m, uint32_t dev);

/* Maps segment index (bytes long, at offset in dev's range) from fd,
 * reserving the range first if needed. Always consumes fd (closed on success
 * and on failure). A segment already mapped is left as is. Returns 0,
 * -EPROTO for a segment that does not fit (offset != index * segment_bytes,
 * bytes 0 or over segment_bytes, device out of range), or -errno. */
int kvc_map_segment(struct kvc_map *m, uint32_t dev, uint32_t index, uint64_t offset,
		    uint64_t bytes, int fd);

/* Whether the segment is mapped; false for anything out of range. */
bool kvc_map_is_mapped(const struct kvc_map *m, uint32_t dev, uint32_t index);

/* The start of dev's range, or NULL when not reserved. */
void *kvc_map_base(const struct kvc_map *m, uint32_t dev);

/* Unmaps every segment and reservation (pointers into them become invalid);
 * m can be used again. Not concurrent with kvc_map_base/kvc_map_is_mapped
 * (kvc_close() time). */
void kvc_map_unmap_all(struct kvc_map *m);

/* map_cuda.c: the same functions for the cuda backend (called by map.c). */
struct kvc_map_cu;
int kvc_map_cu_new(uint32_t devices, uint64_t device_bytes, uint64_t segment_bytes,
		   struct kvc_map_cu **out);
void kvc_map_cu_free(struct kvc_map_cu *m);
void kvc_map_cu_set_devices(struct kvc_map_cu *m, const unsigned char (*uuid)[16],
			    int cuda_device);
void kvc_map_cu_unmap_all(struct kvc_map_cu *m);
int kvc_map_cu_segment(struct kvc_map_cu *m, uint32_t dev, uint32_t index, uint64_t offset,
		       uint64_t bytes, int fd);
bool kvc_map_cu_is_mapped(const struct kvc_map_cu *m, uint32_t dev, uint32_t index);
void *kvc_map_cu_base(const struct kvc_map_cu *m, uint32_t dev);
const char *kvc_map_cu_error(const struct kvc_map_cu *m);

#endif
