#include "arena.h"

#include <stdint.h>
#include <stdlib.h>

#define CHUNK 65536

struct kv_arena_chunk {
	struct kv_arena_chunk *next;
	size_t size, used;
	_Alignas(16) unsigned char data[];
};

static void *pb_alloc(void *ctx, size_t n)
{
	return kv_arena_alloc(ctx, n);
}

static void pb_free(void *ctx, void *p)
{
	(void)ctx;
	(void)p;
}

void kv_arena_init(struct kv_arena *a)
{
	a->head = NULL;
	a->pb.alloc = pb_alloc;
	a->pb.free = pb_free;
	a->pb.allocator_data = a;
}

void *kv_arena_alloc(struct kv_arena *a, size_t n)
{
	struct kv_arena_chunk *c = a->head;
	void *p;

	n = (n + 15) & ~(size_t)15;
	if (!n)
		n = 16;
	if (!c || c->size - c->used < n) {
		size_t size = n > CHUNK ? n : CHUNK;

		c = malloc(sizeof(*c) + size);
		if (!c)
			return NULL;
		c->size = size;
		c->used = 0;
		c->next = a->head;
		a->head = c;
	}
	p = c->data + c->used;
	c->used += n;
	return p;
}

void kv_arena_reset(struct kv_arena *a)
{
	struct kv_arena_chunk *c = a->head;

	if (!c)
		return;
	/* Keep the oldest chunk (the last in the list) if it is the usual size. */
	while (c->next) {
		struct kv_arena_chunk *next = c->next;

		free(c);
		c = next;
	}
	if (c->size > CHUNK) {
		free(c);
		c = NULL;
	} else {
		c->used = 0;
	}
	a->head = c;
}

void kv_arena_fini(struct kv_arena *a)
{
	struct kv_arena_chunk *c = a->head;

	while (c) {
		struct kv_arena_chunk *next = c->next;

		free(c);
		c = next;
	}
	a->head = NULL;
}
