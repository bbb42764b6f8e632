/* A bump allocator for one request's decoded message and its response.
 * Everything allocated is freed at once by kv_arena_reset(); protobuf-c
 * decodes into it through kv_arena_pb(). */
#ifndef KV_ARENA_H
#define KV_ARENA_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>

struct kv_arena_chunk;

struct kv_arena {
	struct kv_arena_chunk *head;  /* current chunk; the first is kept across resets */
	ProtobufCAllocator pb;
};

void kv_arena_init(struct kv_arena *a);
void kv_arena_fini(struct kv_arena *a);
/* 16-byte aligned memory valid until the next reset, or NULL. */
void *kv_arena_alloc(struct kv_arena *a, size_t n);
void kv_arena_reset(struct kv_arena *a);

static inline ProtobufCAllocator *kv_arena_pb(struct kv_arena *a)
{
	return &a->pb;
}

#endif
