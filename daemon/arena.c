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
	a->spare = NULL;
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
		struct kv_arena_chunk **sp = &a->spare;
		size_t size = n > CHUNK ? n : CHUNK;

		while (*sp && (*sp)->size < n)
			sp = &(*sp)->next;
		if (*sp) {
			c = *sp;
			*sp = c->next;
		} else {
			if (!(c = malloc(sizeof(*c) + size)))
				return NULL;
			c->size = size;
		}
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
	struct kv_arena_chunk *c = a->head, *next;
	size_t kept = 0;

	for (next = a->spare; next; next = next->next)
		kept += next->size;
	/* The used chunks join the spare ones while they fit in KV_ARENA_KEEP;
	 * the rest go back to malloc. */
	for (; c; c = next) {
		next = c->next;
		if (kept + c->size <= KV_ARENA_KEEP) {
			kept += c->size;
			c->next = a->spare;
			a->spare = c;
		} else {
			free(c);
		}
	}
	a->head = NULL;
}

void kv_arena_fini(struct kv_arena *a)
{
	struct kv_arena_chunk *c, *next;

	kv_arena_reset(a);
	for (c = a->spare; c; c = next) {
		next = c->next;
		free(c);
	}
	a->spare = NULL;
}
