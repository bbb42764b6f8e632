/* A bump allocator for one request's decoded message and its response.
 * Everything allocated is freed at once by kv_arena_reset(); protobuf-c
 * decodes into it through kv_arena_pb(). */
#ifndef KV_ARENA_H
#define KV_ARENA_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>

struct kv_arena_chunk;

/* Chunks are kept across resets, up to KV_ARENA_KEEP bytes of them: a
 * batch's request and reply (a Lookup of max_batch hashes) take several,
 * and giving them back to malloc after every request moved the heap's top
 * with brk(), which waits on the mm lock while a worker populates pool
 * memory (issue 38's profile). */
#define KV_ARENA_KEEP (1u << 20)

struct kv_arena {
	struct kv_arena_chunk *head;   /* the chunks in use, the current first */
	struct kv_arena_chunk *spare;  /* kept by the last reset, empty */
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
