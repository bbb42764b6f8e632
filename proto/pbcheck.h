/* A check of a protobuf message's strings, on its wire bytes: proto3 says a
 * `string` is UTF-8, and the daemon's C code cannot hold a NUL inside one
 * (protobuf-c hands it a C string, so "pool\0zzz" would silently become
 * "pool"). Run on a request that has unpacked, before anything looks at it. */
#ifndef KV_PBCHECK_H
#define KV_PBCHECK_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

/* Whether every `string` field of the message of type desc in buf[0..len)
 * (nested messages included) is valid UTF-8 without NUL. buf must be a
 * message that unpacks (its framing is trusted only as far as it is
 * checked here: a truncated field is a failure). On failure writes which
 * field and why into why. Returns 1 or 0. */
int kv_pb_strings_ok(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len,
		     char *why, size_t whylen);

/* What protobuf-c would allocate to unpack the message of type desc in
 * buf[0..len), from its wire bytes alone, before anything is built: each
 * message's struct, the arrays of its repeated fields, its strings and bytes,
 * and the scratch protobuf-c keeps per field it meets, each allocation
 * rounded as the daemon's arena rounds it. An upper estimate (a frame of
 * millions of empty sub-messages costs ~50 times its size; the daemon refuses
 * a frame whose estimate passes its bound before unpacking it: conn.c,
 * docs/security.md). O(len) time, no allocation, recursion bounded as
 * kv_pb_strings_ok()'s. Stops as soon as the estimate passes limit: returns
 * the bytes (more than limit when it stopped there), or -1 when buf does not
 * parse as far as this looks (unpacking it would fail too). */
long long kv_pb_decode_cost(const ProtobufCMessageDescriptor *desc, const uint8_t *buf,
			    size_t len, unsigned long long limit);

#endif
