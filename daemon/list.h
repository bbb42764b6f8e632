/* Intrusive circular doubly linked list (the kernel's shape).
 *
 * A struct kv_list is both a head and a node. An unlinked node points at
 * itself, so kv_list_linked() is a cheap membership test and kv_list_del()
 * of an unlinked node is harmless. All operations are O(1). */
#ifndef KV_LIST_H
#define KV_LIST_H

#include <stddef.h>

struct kv_list {
	struct kv_list *prev, *next;
};

#define kv_container_of(ptr, type, member) \
	((type *)(void *)((char *)(ptr) - offsetof(type, member)))

static inline void kv_list_init(struct kv_list *l)
{
	l->prev = l->next = l;
}

static inline int kv_list_empty(const struct kv_list *head)
{
	return head->next == head;
}

static inline int kv_list_linked(const struct kv_list *n)
{
	return n->next != n;
}

static inline void kv_list__insert(struct kv_list *n, struct kv_list *prev, struct kv_list *next)
{
	n->prev = prev;
	n->next = next;
	prev->next = n;
	next->prev = n;
}

/* Inserts n right after head (the front: newest for an LRU). */
static inline void kv_list_push_front(struct kv_list *head, struct kv_list *n)
{
	kv_list__insert(n, head, head->next);
}

/* Inserts n right before head (the back: oldest for an LRU). */
static inline void kv_list_push_back(struct kv_list *head, struct kv_list *n)
{
	kv_list__insert(n, head->prev, head);
}

static inline void kv_list_del(struct kv_list *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	kv_list_init(n);
}

static inline struct kv_list *kv_list_front(const struct kv_list *head)
{
	return kv_list_empty(head) ? NULL : head->next;
}

static inline struct kv_list *kv_list_back(const struct kv_list *head)
{
	return kv_list_empty(head) ? NULL : head->prev;
}

#define kv_list_for_each(pos, head) \
	for ((pos) = (head)->next; (pos) != (head); (pos) = (pos)->next)

#define kv_list_for_each_safe(pos, tmp, head) \
	for ((pos) = (head)->next, (tmp) = (pos)->next; (pos) != (head); \
	     (pos) = (tmp), (tmp) = (pos)->next)

#endif
