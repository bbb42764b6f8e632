/* KV events: see events.h; the format and its sources are in docs/events.md.
 *
 * One file of about 1,750 lines, on purpose: the encoder, the batches, the
 * publisher, the block records and the replay server all work on struct
 * kv_events's private state (the pending event, the removals held back, the
 * per-topic batches, the records, the replay ring), which no other module may
 * see; a split would need an internal header exposing all of it. A fifth of
 * the file is the no-events stubs and the socket setup. Sections: stubs
 * (KV_HAVE_EVENTS 0); encoding; batches and sending; block records; merging
 * events; topics; replay; setup. */
#include "events.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "index.h"
#include "kvcached.pb-c.h"
#include "kvconfig.h"
#include "kverr.h"

uint32_t kv_events_sub_hwm(const struct kv_config *cfg)
{
	uint64_t by_bytes = cfg->events_subscriber_max_bytes / KV_EVENTS_BATCH_BYTES;

	if (by_bytes < 16)
		by_bytes = 16;
	return by_bytes < cfg->events_hwm ? (uint32_t)by_bytes : cfg->events_hwm;
}

/* Translates the request's keys (moved here from the Seal handler, issue
 * 38: the handler validates, this module owns what an event says). */
void kv_events_sealed(struct kv_events *ev, uint32_t pool, uint32_t block_tokens,
		      const Kvcached__Seal *m, size_t i)
{
	struct kv_event_key keys[KV_EVENTS_KEYS_MAX];
	struct kv_events_meta meta = { .lora_name = m->lora_name, .lora_id = m->lora_id };
	const uint8_t *parent = NULL;

	if (!ev)
		return;
	if (m->n_token_ids)
		parent = i ? m->hashes.data + (i - 1) * KV_HASH_BYTES
			   : m->parent_hash.len ? m->parent_hash.data : NULL;
	if (m->n_extra_keys) {
		const Kvcached__BlockKeys *bk = m->extra_keys[i];

		meta.has_keys = 1;
		meta.keys = keys;
		meta.nkeys = bk->n_keys;
		for (size_t k = 0; k < bk->n_keys; k++) {
			const Kvcached__EventKey *e = bk->keys[k];

			keys[k] = (struct kv_event_key){ 0 };
			if (e->key_case == KVCACHED__EVENT_KEY__KEY_DIGEST) {
				keys[k].kind = KV_EVENT_KEY_DIGEST;
				keys[k].p = (const char *)e->digest.data;
				keys[k].len = e->digest.len;
			} else if (e->key_case == KVCACHED__EVENT_KEY__KEY_MM) {
				keys[k].kind = KV_EVENT_KEY_MM;
				keys[k].p = e->mm->identifier;
				keys[k].len = strlen(e->mm->identifier);
				keys[k].offset = e->mm->offset;
			} else {
				keys[k].kind = KV_EVENT_KEY_TEXT;
				keys[k].p = e->text;
				keys[k].len = strlen(e->text);
			}
		}
	}
	kv_events_stored_meta(ev, pool, m->hashes.data + i * KV_HASH_BYTES, parent, KV_MEDIUM_G1,
			      m->n_token_ids ? m->token_ids + (size_t)i * block_tokens : NULL, &meta);
}

#if !KV_HAVE_EVENTS

int kv_events_open(struct kv_events **out, const struct kv_config *cfg, struct kv_loop *loop,
		   char *err, size_t errlen)
{
	(void)loop;
	*out = NULL;
	if (!cfg->events_endpoint[0] && !cfg->events_replay_endpoint[0])
		return 0;
	kv_errf(err, errlen, "events_endpoint: this kvcached was built without KV events "
		"(meson -Devents=enabled needs libzmq and msgpack-c)");
	return -ENOTSUP;
}

void kv_events_close(struct kv_events *ev)
{
	(void)ev;
}

int kv_events_pool(struct kv_events *ev, uint32_t pool, const char *model, uint32_t block_size,
		   int tokens)
{
	return 0;
}

void kv_events_stored(struct kv_events *ev, uint32_t pool, const uint8_t *hash,
		      const uint8_t *parent, int medium, const uint32_t *tokens)
{
}

void kv_events_stored_meta(struct kv_events *ev, uint32_t pool, const uint8_t *hash,
			   const uint8_t *parent, int medium, const uint32_t *tokens,
			   const struct kv_events_meta *meta)
{
}

void kv_events_removed(struct kv_events *ev, uint32_t pool, const uint8_t *hash, int medium)
{
}

void kv_events_flush(struct kv_events *ev)
{
}

void kv_events_no_model(struct kv_events *ev, uint32_t pool)
{
}

void kv_events_stats(const struct kv_events *ev, struct kv_events_stats *st)
{
	memset(st, 0, sizeof(*st));
}

#else

#include <grp.h>
#include <malloc.h>
#include <poll.h>
#include <msgpack.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "index.h"
#include "list.h"
#include "log.h"
#include "loop.h"
#include "pool.h"

/* Room left in front of a batch's events for its header: fixarray(3),
 * float64 ts, array32 count. data_parallel_rank goes after the events. */
#define HDR_ROOM 15
#define RANK_MAX 9  /* a uint64 */
/* Hashes one pending event holds before it is written out. */
#define PEND_MAX 256
#define MAX_TOPICS 1024
#define TOPIC_MAX 320


struct buf {
	char *p;
	size_t len, cap;
};

struct topic {
	char name[TOPIC_MAX];
	size_t namelen;
	struct buf batch;     /* HDR_ROOM bytes, then the events */
	uint32_t nevents;
	int queued;           /* on the dirty list */
};

/* A batch kept for replay, shared (counted references) by the ring and by
 * every replay message that sends it: a replay copies nothing (issue 29).
 * ZMQ drops its references from its I/O thread: atomics. */
struct rbatch {
	_Atomic uint32_t refs;
	size_t len;
	char *p;              /* behind it: the publisher (a pointer), then the bytes */
};

struct replay {
	uint32_t topic;
	uint64_t seq;
	struct rbatch *b;
};

/* A replay requester (ZMQ routing id) with replay bytes still queued for it:
 * one replay in flight per peer. Freed by the loop once nothing is. */
struct rpeer {
	struct rpeer *next;
	_Atomic uint64_t inflight;   /* bytes of its replay messages ZMQ still holds */
	size_t idlen;
	unsigned char id[256];
};

/* The hint of one replay message: what its free drops. */
struct rsent {
	struct rbatch *b;
	struct rpeer *peer;
	_Atomic uint64_t *total;
};

#define REPLAY_PEERS_MAX 1024

enum { PEND_NONE, PEND_STORED, PEND_REMOVED };

/* What a block's first BlockStored said (its Seal's parent, token ids where
 * the namespace publishes them, LoRA, extra keys), kept while any medium
 * holds the block, so that the stores of its tier moves say it again: a
 * router that indexes by token ids (llm-d) can place them (issue 35). Keyed
 * by (pool, hash); freed at the end of the loop iteration in which its last
 * medium went (a demotion removes G1 before it stores G2). A Seal that said
 * nothing of a block (no parent, token ids, LoRA or keys) makes none. */
struct brec {
	struct brec *next;        /* in its bucket */
	struct brec *znext;       /* on the list of records to look at */
	uint8_t hash[KV_HASH_BYTES];
	uint8_t parent[KV_HASH_BYTES];
	uint32_t pool;
	uint8_t media;            /* 1 << KV_MEDIUM_* */
	uint8_t has_parent, has_keys, zlisted, dead;
	uint16_t lora_len;
	uint64_t lora_id;
	uint32_t ntok;            /* token ids, 0: none */
	uint32_t keys_len;        /* its extra keys, encoded */
	uint32_t tok[];           /* ntok token ids, the LoRA name, the keys */
};

/* Which hashes a list holds, by their first 8 bytes (a false positive
 * only writes an event out early): a store or a removal asks whether the
 * other side holds its block in O(1), not by a scan of up to PEND_MAX. */
#define HSET_SLOTS (2 * PEND_MAX)
struct hset {
	uint64_t k[HSET_SLOTS];
};

/* Removals of one medium waiting to be written (they commute with stores of
 * other media: held back, they follow the stores of a tier move). */
struct rset {
	uint32_t pool;
	uint32_t n;
	uint8_t h[PEND_MAX][KV_HASH_BYTES];
	struct hset set;
};

/* The most bytes one event may take in a batch: a batch is never more than
 * KV_EVENTS_BATCH_BYTES with its header and rank (issue 36). */
#define EVENT_MAX (KV_EVENTS_BATCH_BYTES - HDR_ROOM - RANK_MAX)
/* Room a pending BlockStored reserves besides its blocks. */
#define STORED_FIXED (256 + HASH_MAX + KV_EVENTS_LORA_MAX)
/* Memory subscribers' queues held past which it is given back once they
 * drain or go. */
#define TRIM_MIN (512u << 10)

struct kv_events {
	void *zctx, *pub, *router;
	struct kv_loop *loop;
	struct kv_loop_watch rw;  /* the replay socket's ZMQ_FD */
	struct kv_loop_watch tw;  /* events_interval: the next send */
	uint64_t interval_ns;
	uint64_t pending_since;   /* CLOCK_MONOTONIC ns of the oldest unsent event; 0: none */
	struct kv_loop_watch gw;  /* while subscribers hold batches: give memory back */
	int rfd;
	int int_hashes;       /* events_hash_format = int */
	uint64_t seq;         /* the next batch's, one sequence for every topic */
	int stored_any;       /* a BlockStored was published */
	uint32_t dp_rank;     /* events_dp_rank */
	char node[256];           /* node_name, else the host name */
	struct topic *topics;
	uint32_t ntopics;
	uint16_t *dirty;      /* topics with events queued */
	uint32_t ndirty;
	/* per pool: topic + 1 (0: none), block size, token ids allowed */
	uint16_t pool_topic[KV_MAX_POOLS];
	uint32_t pool_bs[KV_MAX_POOLS];
	uint8_t pool_tokens[KV_MAX_POOLS];
	/* The event being gathered. */
	int pk;
	uint32_t ppool;
	int pmedium;
	int phas_parent, phas_tokens;
	uint8_t pparent[KV_HASH_BYTES];
	/* What the Seal said (kv_events_meta): the LoRA, and whether the
	 * event carries extra_keys, each block's encoded in pkeys. */
	uint64_t plora_id;
	size_t plora_len;
	char plora[KV_EVENTS_LORA_MAX];
	int phas_keys;
	struct buf pkeys;
	uint8_t phash[PEND_MAX][KV_HASH_BYTES];
	struct hset pset;         /* phash's */
	uint32_t nph;
	size_t psize;         /* the pending BlockStored's bytes at most */
	struct rset rm[KV_MEDIUMS];
	/* Block records (struct brec). */
	struct brec **recs;
	uint32_t nbuckets, nrecs;
	uint64_t rec_bytes;
	struct brec *zlist;
	struct buf kscratch;      /* one block's keys, encoded */
	/* Batches ZMQ's subscriber queues hold (bytes, counted once per
	 * message), and their most since memory was last given back. */
	_Atomic uint64_t pub_inflight;
	uint64_t pub_peak;
	uint64_t ring_bytes_max;
	uint32_t *ptok;
	size_t nptok, ptok_cap;
	/* Replay ring. */
	struct replay *ring;
	uint32_t ring_cap, ring_head, ring_n;
	/* Replays in flight (bytes referenced by messages ZMQ holds, counted
	 * once per message), their bound and their peers. */
	_Atomic uint64_t replay_inflight;
	uint64_t replay_max;
	struct rpeer *peers;
	uint32_t npeers;
	int trim;                 /* give memory back once no replay is in flight */
	struct kv_events_stats st;
	char scratch[256];
};

static int buf_room(struct buf *b, size_t more)
{
	size_t cap;
	char *np;

	if (b->len + more <= b->cap)
		return 0;
	cap = b->cap ? b->cap : 4096;
	while (cap < b->len + more)
		cap *= 2;
	np = realloc(b->p, cap);
	if (!np)
		return -ENOMEM;
	b->p = np;
	b->cap = cap;
	return 0;
}

static int buf_write(void *data, const char *s, size_t n)
{
	struct buf *b = data;

	if (buf_room(b, n) < 0)
		return -1;
	memcpy(b->p + b->len, s, n);
	b->len += n;
	return 0;
}

static void pack_cstr(msgpack_packer *pk, const char *s)
{
	size_t n = strlen(s);

	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}

static void topic_dirty(struct kv_events *ev, uint32_t t)
{
	if (!ev->topics[t].queued) {
		ev->topics[t].queued = 1;
		ev->dirty[ev->ndirty++] = (uint16_t)t;
	}
}

static int topic_open_batch(struct topic *tp)
{
	if (tp->batch.len)
		return 0;
	if (buf_room(&tp->batch, HDR_ROOM) < 0)
		return -ENOMEM;
	tp->batch.len = HDR_ROOM;
	return 0;
}

static void send_batch(struct kv_events *ev, uint32_t t);

/* msgpack by hand for the hot path: the events' constant parts are byte
 * strings (their keys and tags), written with one memcpy each; the variable
 * parts (array headers, hashes, token ids) straight into the batch buffer,
 * whose room is reserved once per event.
 *
 * Why not msgpack-c for all of it: the bytes must be the ones vLLM's
 * publisher writes (msgspec's encoder: every integer in its shortest form,
 * floats as float64, str/bin/array/map headers in their shortest form, a
 * struct's fields in declaration order), and msgpack-c has no say over key
 * order or which optional fields appear: the structure is ours either way.
 * What msgpack-c would add is the headers, which put_u64()/put_array() write
 * in the same shortest forms; msgpack-c still writes the cold parts (the
 * batch header, AllBlocksCleared). tests/test_vllm_interop.py checks every
 * payload of a real daemon byte for byte against vLLM 0.33's own msgspec
 * encoding of what vLLM's decoder read from it. */
#define LIT(s) s, sizeof(s) - 1
/* msgspec sizes a struct's map header for the most fields it could write
 * (the tag and every field): BlockStored's 16 take a map16 header even for
 * the 8 or 9 (with extra_keys) written; BlockRemoved's 7 and
 * AllBlocksCleared's 1 a fixmap. */
static const char stored_head[] = "\xa4type\xab" "BlockStored\xac" "block_hashes";
static const char parent_key[] = "\xb1parent_block_hash";
static const char tokens_key[] = "\xa9token_ids";
static const char size_key[] = "\xaa" "block_size";
static const char removed_head[] =
	"\x84\xa4type\xac" "BlockRemoved\xac" "block_hashes";
static const char group_idx_0[] = "\xa9group_idx\x00";
static const char lora_id_key[] = "\xa7lora_id";
static const char lora_name_key[] = "\xa9lora_name";
static const char extra_keys_key[] = "\xaa" "extra_keys";
/* medium <m>, vLLM's MEDIUM_GPU, MEDIUM_CPU, MEDIUM_STORAGE (kv_events.py). */
static const char *const removed_tail[KV_MEDIUMS] = {
	"\xa6medium\xa3GPU", "\xa6medium\xa3" "CPU", "\xa6medium\xa7" "STORAGE",
};

static char *put(char *w, const void *p, size_t n)
{
	if (n)  /* an empty digest has no data (NULL): memcpy's is UB */
		memcpy(w, p, n);
	return w + n;
}

/* An unsigned integer in its shortest form, as msgspec writes a Python int. */
static char *put_u64(char *w, uint64_t v)
{
	int i;

	if (v >> 32) {
		*w++ = (char)0xcf;
		for (i = 56; i >= 0; i -= 8)
			*w++ = (char)(v >> i);
		return w;
	}
	if (v < 0x80) {
		*w++ = (char)v;
	} else if (v < 0x100) {
		*w++ = (char)0xcc;
		*w++ = (char)v;
	} else if (v < 0x10000) {
		*w++ = (char)0xcd;
		*w++ = (char)(v >> 8);
		*w++ = (char)v;
	} else {
		*w++ = (char)0xce;
		*w++ = (char)(v >> 24);
		*w++ = (char)(v >> 16);
		*w++ = (char)(v >> 8);
		*w++ = (char)v;
	}
	return w;
}

static char *put_u32(char *w, uint32_t v)
{
	return put_u64(w, v);
}

/* A signed integer in its shortest form, as msgspec writes a Python int:
 * the unsigned forms for v >= 0, else negative fixint, int8 ... int64. */
static char *put_i64(char *w, int64_t v)
{
	uint64_t u = (uint64_t)v;
	int i, n;

	if (v >= 0)
		return put_u64(w, u);
	if (v >= -32) {
		*w++ = (char)u;
		return w;
	}
	if (v >= -128)
		*w++ = (char)0xd0, n = 1;
	else if (v >= -32768)
		*w++ = (char)0xd1, n = 2;
	else if (v >= INT32_MIN)
		*w++ = (char)0xd2, n = 4;
	else
		*w++ = (char)0xd3, n = 8;
	for (i = (n - 1) * 8; i >= 0; i -= 8)
		*w++ = (char)(u >> i);
	return w;
}

/* str and bin in their shortest forms (msgpack 2.0, as msgspec writes). */
static char *put_str(char *w, const char *s, size_t n)
{
	if (n < 32) {
		*w++ = (char)(0xa0 | n);
	} else if (n < 0x100) {
		*w++ = (char)0xd9;
		*w++ = (char)n;
	} else if (n < 0x10000) {
		*w++ = (char)0xda;
		*w++ = (char)(n >> 8);
		*w++ = (char)n;
	} else {
		*w++ = (char)0xdb;
		*w++ = (char)(n >> 24);
		*w++ = (char)(n >> 16);
		*w++ = (char)(n >> 8);
		*w++ = (char)n;
	}
	return put(w, s, n);
}

static char *put_bin(char *w, const char *s, size_t n)
{
	if (n < 0x100) {
		*w++ = (char)0xc4;
		*w++ = (char)n;
	} else if (n < 0x10000) {
		*w++ = (char)0xc5;
		*w++ = (char)(n >> 8);
		*w++ = (char)n;
	} else {
		*w++ = (char)0xc6;
		*w++ = (char)(n >> 24);
		*w++ = (char)(n >> 16);
		*w++ = (char)(n >> 8);
		*w++ = (char)n;
	}
	return put(w, s, n);
}

#define STR_HDR 5  /* the most any str/bin/array header takes */

static char *put_array(char *w, uint32_t n)
{
	if (n < 16) {
		*w++ = (char)(0x90 | n);
	} else if (n < 0x10000) {
		*w++ = (char)0xdc;
		*w++ = (char)(n >> 8);
		*w++ = (char)n;
	} else {
		*w++ = (char)0xdd;
		*w++ = (char)(n >> 24);
		*w++ = (char)(n >> 16);
		*w++ = (char)(n >> 8);
		*w++ = (char)n;
	}
	return w;
}

#define HASH_MAX 34  /* bin8 header + 32 bytes; an int hash takes at most 9 */

static char *put_hash(const struct kv_events *ev, char *w, const uint8_t *h)
{
	if (ev->int_hashes) {
		/* vLLM's int form (maybe_convert_block_hash): the digest's
		 * last 8 bytes, big endian, a Python int msgspec writes in its
		 * shortest form. */
		uint64_t v = 0;
		int i;

		for (i = KV_HASH_BYTES - 8; i < KV_HASH_BYTES; i++)
			v = v << 8 | h[i];
		return put_u64(w, v);
	}
	*w++ = (char)0xc4;
	*w++ = KV_HASH_BYTES;
	return put(w, h, KV_HASH_BYTES);
}

static uint64_t hset_key(const uint8_t *h)
{
	uint64_t v;

	memcpy(&v, h, sizeof(v));
	return v | 1;  /* 0 marks an empty slot */
}

static uint32_t hset_find(const struct hset *st, uint64_t v)
{
	uint32_t i = (uint32_t)(v >> 17) & (HSET_SLOTS - 1);

	while (st->k[i] && st->k[i] != v)
		i = (i + 1) & (HSET_SLOTS - 1);
	return i;
}

static void hset_add(struct hset *st, const uint8_t *h)
{
	uint64_t v = hset_key(h);

	st->k[hset_find(st, v)] = v;
}

static int hset_has(const struct hset *st, const uint8_t *h)
{
	uint64_t v = hset_key(h);

	return st->k[hset_find(st, v)] == v;
}

/* Empties the set of the n hashes of h (at most PEND_MAX: it is never more
 * than half full): in the reverse of their order, so that each one's probe
 * still finds the slots of those before it. */
static void hset_clear(struct hset *st, const uint8_t (*h)[KV_HASH_BYTES], uint32_t n)
{
	while (n--) {
		uint64_t v = hset_key(h[n]);
		uint32_t i = hset_find(st, v);

		if (st->k[i] == v)
			st->k[i] = 0;
	}
}

/* Reserves room for an event of at most `room` bytes in topic t's batch:
 * a batch that could pass KV_EVENTS_BATCH_BYTES with it goes first. Returns
 * the write pointer or NULL (no memory). */
static char *batch_room(struct kv_events *ev, uint32_t t, size_t room)
{
	struct topic *tp = &ev->topics[t];

	if (tp->nevents && tp->batch.len + room > KV_EVENTS_BATCH_BYTES - RANK_MAX)
		send_batch(ev, t);
	if (topic_open_batch(tp) < 0 || buf_room(&tp->batch, room) < 0)
		return NULL;
	return tp->batch.p + tp->batch.len;
}

static void batch_done(struct kv_events *ev, uint32_t t, char *w)
{
	struct topic *tp = &ev->topics[t];

	tp->batch.len = (size_t)(w - tp->batch.p);
	tp->nevents++;
	topic_dirty(ev, t);
	if (tp->batch.len >= KV_EVENTS_BATCH_BYTES - RANK_MAX - 512)
		send_batch(ev, t);
}

/* Writes the pending BlockStored into its topic's batch. */
static void pend_write(struct kv_events *ev)
{
	uint32_t t, i;
	size_t room;
	char *w;

	if (ev->pk == PEND_NONE)
		return;
	t = ev->pool_topic[ev->ppool] - 1u;
	room = ev->psize;
	if (!(w = batch_room(ev, t, room)))
		goto out;  /* no memory: the event is lost, the next ones are not */
	/* vLLM's BlockStored as a tagged map (tag field "type"), its fields in
	 * declaration order; those without a default (lora_id, medium,
	 * lora_name) always, nil when unknown; those with a default of None
	 * omitted, as msgspec's omit_defaults does: extra_keys unless the Seal
	 * gave them; group_idx 0, as vLLM 0.33's block pool writes for a model
	 * of one KV-cache group; the rest never. */
	*w++ = (char)0xde;  /* map16 of 9 fields, 10 with extra_keys */
	*w++ = 0;
	*w++ = (char)(9 + !!ev->phas_keys);
	w = put(w, LIT(stored_head));
	w = put_array(w, ev->nph);
	for (i = 0; i < ev->nph; i++)
		w = put_hash(ev, w, ev->phash[i]);
	w = put(w, LIT(parent_key));
	if (ev->phas_parent)
		w = put_hash(ev, w, ev->pparent);
	else
		*w++ = (char)0xc0;
	w = put(w, LIT(tokens_key));
	w = put_array(w, ev->phas_tokens ? (uint32_t)ev->nptok : 0);
	for (i = 0; ev->phas_tokens && i < ev->nptok; i++)
		w = put_u32(w, ev->ptok[i]);
	w = put(w, LIT(size_key));
	w = put_u32(w, ev->pool_bs[ev->ppool]);
	w = put(w, LIT(lora_id_key));
	if (ev->plora_id)
		w = put_u64(w, ev->plora_id);
	else
		*w++ = (char)0xc0;
	w = put(w, removed_tail[ev->pmedium], strlen(removed_tail[ev->pmedium]));
	w = put(w, LIT(lora_name_key));
	if (ev->plora_len)
		w = put_str(w, ev->plora, ev->plora_len);
	else
		*w++ = (char)0xc0;
	if (ev->phas_keys) {
		w = put(w, LIT(extra_keys_key));
		w = put_array(w, ev->nph);
		w = put(w, ev->pkeys.p, ev->pkeys.len);
	}
	w = put(w, LIT(group_idx_0));
	batch_done(ev, t, w);
out:
	ev->pk = PEND_NONE;
	hset_clear(&ev->pset, ev->phash, ev->nph);
	ev->nph = 0;
	ev->nptok = 0;
	ev->psize = 0;
	ev->pkeys.len = 0;
}

/* Writes the removals of medium m held back. */
static void rm_write(struct kv_events *ev, int m)
{
	struct rset *rs = &ev->rm[m];
	uint32_t t, i;
	char *w;

	if (!rs->n)
		return;
	/* Stores held back go first: a tier move's store before its remove
	 * (they never name the same block in the same medium: each side
	 * writes the other out first when they would). */
	pend_write(ev);
	t = ev->pool_topic[rs->pool];
	if (!t--)
		goto out;  /* the pool's events stopped (a re-registration) */
	if (!(w = batch_room(ev, t, 64 + (size_t)rs->n * HASH_MAX)))
		goto out;
	w = put(w, LIT(removed_head));
	w = put_array(w, rs->n);
	for (i = 0; i < rs->n; i++)
		w = put_hash(ev, w, rs->h[i]);
	w = put(w, removed_tail[m], strlen(removed_tail[m]));
	w = put(w, LIT(group_idx_0));
	batch_done(ev, t, w);
out:
	hset_clear(&rs->set, rs->h, rs->n);
	rs->n = 0;
}

/* Everything held back, in an order a router can index: the pending store,
 * then the removals. */
static void pend_all(struct kv_events *ev)
{
	int m;

	pend_write(ev);
	for (m = 0; m < KV_MEDIUMS; m++)
		rm_write(ev, m);
}


static void write_cleared(struct kv_events *ev, uint32_t t)
{
	struct topic *tp = &ev->topics[t];
	msgpack_packer pk;

	if (topic_open_batch(tp) < 0)
		return;
	msgpack_packer_init(&pk, &tp->batch, buf_write);
	msgpack_pack_map(&pk, 1);
	pack_cstr(&pk, "type");
	pack_cstr(&pk, "AllBlocksCleared");
	tp->nevents++;
	topic_dirty(ev, t);
}

static void rbatch_put(struct rbatch *b)
{
	if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
		free(b);
}

/* Keeps batch b (a reference taken here) for replay: the oldest go while the
 * ring holds events_buffer batches or events_buffer_max_bytes. */
static void ring_put(struct kv_events *ev, uint32_t t, uint64_t seq, struct rbatch *b)
{
	struct replay *r;

	if (!ev->ring_cap || b->len > ev->ring_bytes_max)
		return;  /* a hole in the replay: the client sees the seq gap */
	while (ev->ring_n &&
	       (ev->ring_n == ev->ring_cap || ev->st.buffered_bytes + b->len > ev->ring_bytes_max)) {
		r = &ev->ring[ev->ring_head];
		ev->st.buffered_bytes -= r->b->len;
		rbatch_put(r->b);
		ev->ring_head = (ev->ring_head + 1) % ev->ring_cap;
		ev->ring_n--;
	}
	atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
	r = &ev->ring[(ev->ring_head + ev->ring_n) % ev->ring_cap];
	r->topic = t;
	r->seq = seq;
	r->b = b;
	ev->ring_n++;
	ev->st.buffered_bytes += b->len;
}

static void put_be64(unsigned char *b, uint64_t v)
{
	int i;

	for (i = 7; i >= 0; i--, v >>= 8)
		b[i] = (unsigned char)v;
}

/* ZMQ is done with a published batch (sent to every subscriber, or dropped
 * with a subscriber that went). */
static void psent_free(void *data, void *hint)
{
	struct rbatch *b = hint;
	struct kv_events *ev = *(struct kv_events **)((char *)data - sizeof(void *));

	atomic_fetch_sub_explicit(&ev->pub_inflight, b->len, memory_order_relaxed);
	rbatch_put(b);
}

/* The payload of one published batch: b itself, not a copy; every
 * subscriber's queue shares it, and the ring too. */
static int pub_payload(struct kv_events *ev, struct rbatch *b)
{
	zmq_msg_t m;

	atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&ev->pub_inflight, b->len, memory_order_relaxed);
	if (zmq_msg_init_data(&m, b->p, b->len, psent_free, b) < 0) {
		psent_free(b->p, b);
		return -1;
	}
	if (zmq_msg_send(&m, ev->pub, ZMQ_DONTWAIT) < 0) {
		zmq_msg_close(&m);
		return -1;
	}
	return 0;
}

/* One multipart message to every subscriber with room for it. XPUB with
 * ZMQ_XPUB_NODROP refuses (EAGAIN) a message some subscriber's queue is full
 * for: that is how a drop is seen and counted; the message then goes to the
 * others with NODROP off, as a PUB socket sends. */
static int pub_send(struct kv_events *ev, const struct topic *tp, const unsigned char *seq,
		    struct rbatch *b)
{
	int pass, off = 0, on = 1, dropped = 0;

	for (pass = 0; pass < 2; pass++) {
		if (zmq_send(ev->pub, tp->name, tp->namelen, ZMQ_DONTWAIT | ZMQ_SNDMORE) >= 0) {
			zmq_send(ev->pub, seq, 8, ZMQ_DONTWAIT | ZMQ_SNDMORE);
			pub_payload(ev, b);
			break;
		}
		if (zmq_errno() != EAGAIN || pass)
			return -1;
		dropped = 1;
		zmq_setsockopt(ev->pub, ZMQ_XPUB_NODROP, &off, sizeof(off));
	}
	if (dropped)
		zmq_setsockopt(ev->pub, ZMQ_XPUB_NODROP, &on, sizeof(on));
	return dropped;
}

static void send_batch(struct kv_events *ev, uint32_t t)
{
	struct topic *tp = &ev->topics[t];
	unsigned char hdr[HDR_ROOM], seq[8];
	char *w;
	struct buf h = { (char *)hdr, 0, sizeof(hdr) };
	struct timespec now;
	msgpack_packer pk;
	struct rbatch *b;
	char *p;
	size_t len;
	int r;

	if (!tp->nevents) {
		tp->batch.len = 0;
		return;
	}
	if (buf_room(&tp->batch, RANK_MAX) < 0)
		goto nomem;
	clock_gettime(CLOCK_REALTIME, &now);
	msgpack_packer_init(&pk, &h, buf_write);
	/* EventBatch is array_like: [ts, events, data_parallel_rank]; vLLM's
	 * publisher sets the rank (its default None would be omitted) before
	 * encoding, so a batch always has three elements. */
	msgpack_pack_array(&pk, 3);
	msgpack_pack_double(&pk, (double)now.tv_sec + now.tv_nsec / 1e9);
	msgpack_pack_array(&pk, tp->nevents);
	w = put_u64(tp->batch.p + tp->batch.len, ev->dp_rank);
	tp->batch.len = (size_t)(w - tp->batch.p);
	p = tp->batch.p + HDR_ROOM - h.len;
	memcpy(p, hdr, h.len);
	len = tp->batch.len - (HDR_ROOM - h.len);
	/* Behind the batch, the publisher: psent_free finds its counter. */
	b = malloc(sizeof(*b) + sizeof(void *) + len);
	if (!b)
		goto nomem;
	atomic_init(&b->refs, 1);
	b->len = len;
	b->p = (char *)(b + 1) + sizeof(void *);
	memcpy((char *)(b + 1), &ev, sizeof(void *));
	memcpy(b->p, p, len);
	put_be64(seq, ev->seq);
	r = pub_send(ev, tp, seq, b);
	if (r != 0) {
		if (r < 0 && ev->st.dropped == 0)
			kv_warn("events: send failed: %s", zmq_strerror(zmq_errno()));
		ev->st.dropped++;
		ev->st.dropped_events += tp->nevents;
		ev->st.dropped_bytes += len;
	}
	ring_put(ev, t, ev->seq, b);
	rbatch_put(b);
	if (atomic_load_explicit(&ev->pub_inflight, memory_order_relaxed) > ev->pub_peak)
		ev->pub_peak = atomic_load_explicit(&ev->pub_inflight, memory_order_relaxed);
	ev->seq++;
	ev->st.batches++;
	ev->st.events += tp->nevents;
	goto out;
nomem:
	/* The batch cannot be sent right: its seq is a gap. */
	ev->st.dropped++;
	ev->st.dropped_events += tp->nevents;
	ev->st.dropped_bytes += tp->batch.len;
	ev->seq++;
out:
	tp->nevents = 0;
	tp->batch.len = 0;
	/* Keep one batch's buffer; give back what a burst grew. */
	if (tp->batch.cap > 4 * KV_EVENTS_BATCH_BYTES) {
		free(tp->batch.p);
		tp->batch.p = NULL;
		tp->batch.cap = 0;
	}
}

static uint64_t mono_ns(void)
{
	return kv_mono_ns();
}

static void interval_done(struct kv_loop_watch *w, int res, int more)
{
	/* Nothing to do here: the loop's idle hook (kv_events_flush) runs
	 * after this completion and sends what is due. */
	(void)w;
	(void)res;
	(void)more;
}

/* Sends the queued batches when the oldest is events_interval old; else
 * makes sure a timer wakes the loop then. Returns 1 when it sent. */
static int due(struct kv_events *ev, int force)
{
	uint64_t now;

	if (force || !ev->interval_ns)
		return 1;
	now = mono_ns();
	if (!ev->pending_since)
		ev->pending_since = now;
	if (now - ev->pending_since >= ev->interval_ns)
		return 1;
	if (!ev->tw.armed &&
	    kv_loop_timeout(ev->loop, &ev->tw, ev->interval_ns - (now - ev->pending_since)) < 0)
		return 1;  /* no timer: send now rather than late */
	return 0;
}

static void flush(struct kv_events *ev, int force)
{
	uint32_t i;
	int m, held = ev->pk != PEND_NONE;
	char sub[256];

	for (m = 0; m < KV_MEDIUMS; m++)
		held |= ev->rm[m].n != 0;
	if ((!held && !ev->ndirty) || !due(ev, force))
		return;
	ev->pending_since = 0;
	pend_all(ev);
	for (i = 0; i < ev->ndirty; i++) {
		ev->topics[ev->dirty[i]].queued = 0;
		send_batch(ev, ev->dirty[i]);
	}
	ev->ndirty = 0;
	/* XPUB queues (un)subscriptions for us to read: read them, so that a
	 * subscriber flapping its subscriptions grows nothing here. Only when
	 * something was sent: a zmq_recv that finds nothing costs a poll(). */
	while (zmq_recv(ev->pub, sub, sizeof(sub), ZMQ_DONTWAIT) >= 0)
		;
}

/* ---- block records ---- */

static uint32_t rec_bucket(const struct kv_events *ev, uint32_t pool, const uint8_t *hash)
{
	uint64_t v;

	memcpy(&v, hash, sizeof(v));  /* a digest: its bytes are spread already */
	v ^= (uint64_t)pool * 0x9e3779b97f4a7c15ull;
	return (uint32_t)(v ^ v >> 29) & (ev->nbuckets - 1);
}

static struct brec **rec_slot(struct kv_events *ev, uint32_t pool, const uint8_t *hash)
{
	struct brec **pp;

	if (!ev->nbuckets)
		return NULL;
	for (pp = &ev->recs[rec_bucket(ev, pool, hash)]; *pp; pp = &(*pp)->next)
		if ((*pp)->pool == pool && !memcmp((*pp)->hash, hash, KV_HASH_BYTES))
			return pp;
	return NULL;
}

static void rec_zlist(struct kv_events *ev, struct brec *r)
{
	if (!r->zlisted) {
		r->zlisted = 1;
		r->znext = ev->zlist;
		ev->zlist = r;
	}
}

static size_t rec_size(const struct brec *r)
{
	return sizeof(*r) + (size_t)r->ntok * 4 + r->lora_len + r->keys_len;
}

/* Unlinks r from its bucket; frees it unless the list still holds it. */
static void rec_drop(struct kv_events *ev, struct brec **pp)
{
	struct brec *r = *pp;

	*pp = r->next;
	ev->nrecs--;
	ev->rec_bytes -= rec_size(r);
	if (r->zlisted)
		r->dead = 1;  /* freed by rec_reap() */
	else
		free(r);
}

static void rec_grow(struct kv_events *ev)
{
	uint32_t n = ev->nbuckets ? ev->nbuckets * 2 : 1024, i;
	struct brec **nb = calloc(n, sizeof(*nb)), *r;
	uint32_t old = ev->nbuckets;
	struct brec **ob = ev->recs;

	if (!nb)
		return;  /* longer chains */
	ev->recs = nb;
	ev->nbuckets = n;
	for (i = 0; i < old; i++)
		while ((r = ob[i])) {
			uint32_t k = rec_bucket(ev, r->pool, r->hash);

			ob[i] = r->next;
			r->next = nb[k];
			nb[k] = r;
		}
	free(ob);
}

/* Records what a Seal said of (pool, hash), in medium. */
static void rec_set(struct kv_events *ev, uint32_t pool, const uint8_t *hash,
		    const uint8_t *parent, int medium, const uint32_t *tokens, uint32_t ntok,
		    uint64_t lora_id, const char *lora, size_t lora_len, int has_keys,
		    const char *keys, size_t keys_len)
{
	struct brec **pp = rec_slot(ev, pool, hash), *r;
	uint8_t media = 0;

	if (pp) {
		media = (*pp)->media;
		rec_drop(ev, pp);
	}
	if (ev->nrecs >= ev->nbuckets)
		rec_grow(ev);
	if (!ev->nbuckets)
		return;
	r = malloc(sizeof(*r) + (size_t)ntok * 4 + lora_len + keys_len);
	if (!r)
		return;  /* its tier moves are published without what it said */
	memset(r, 0, sizeof(*r));
	memcpy(r->hash, hash, KV_HASH_BYTES);
	r->pool = pool;
	r->media = (uint8_t)(media | 1u << medium);
	r->has_parent = parent != NULL;
	if (parent)
		memcpy(r->parent, parent, KV_HASH_BYTES);
	r->ntok = ntok;
	if (ntok)
		memcpy(r->tok, tokens, (size_t)ntok * 4);
	r->lora_id = lora_id;
	r->lora_len = (uint16_t)lora_len;
	if (lora_len)
		memcpy((char *)(r->tok + ntok), lora, lora_len);
	r->has_keys = (uint8_t)!!has_keys;
	r->keys_len = (uint32_t)keys_len;
	if (keys_len)
		memcpy((char *)(r->tok + ntok) + lora_len, keys, keys_len);
	pp = &ev->recs[rec_bucket(ev, pool, hash)];
	r->next = *pp;
	*pp = r;
	ev->nrecs++;
	ev->rec_bytes += rec_size(r);
}

/* The end of a loop iteration: records no medium holds any more go. */
static void rec_reap(struct kv_events *ev)
{
	struct brec *r, *next, **pp;

	for (r = ev->zlist, ev->zlist = NULL; r; r = next) {
		next = r->znext;
		r->zlisted = 0;
		if (r->dead) {
			free(r);
		} else if (!r->media && (pp = rec_slot(ev, r->pool, r->hash)) && *pp == r) {
			rec_drop(ev, pp);
		}
	}
}

/* Every record of pool (a new pool took its id). */
static void rec_drop_pool(struct kv_events *ev, uint32_t pool)
{
	uint32_t i;
	struct brec **pp;

	for (i = 0; i < ev->nbuckets; i++)
		for (pp = &ev->recs[i]; *pp;)
			if ((*pp)->pool == pool)
				rec_drop(ev, pp);
			else
				pp = &(*pp)->next;
}

static void trim_done(struct kv_loop_watch *w, int res, int more)
{
	(void)w;
	(void)res;
	(void)more;
}

void kv_events_flush(struct kv_events *ev)
{
	uint64_t held;

	if (!ev)
		return;
	rec_reap(ev);
	/* The replays' memory went back to ZMQ's allocator, in its I/O
	 * thread's arena: hand it back to the system once none is in flight. */
	if (ev->trim && !atomic_load_explicit(&ev->replay_inflight, memory_order_relaxed)) {
		ev->trim = 0;
		malloc_trim(0);
	}
	/* So with the batches a stalled subscriber held, once it reads or
	 * goes: while they are held a timer looks again (the loop may have
	 * nothing else to wake it). */
	held = atomic_load_explicit(&ev->pub_inflight, memory_order_relaxed);
	if (held) {
		int zev;
		size_t zsz = sizeof(zev);

		/* A socket handles its pipes' ends (a subscriber gone: its
		 * queue freed) only when called: call it, and again in a
		 * while if batches are still held. */
		zmq_getsockopt(ev->pub, ZMQ_EVENTS, &zev, &zsz);
		held = atomic_load_explicit(&ev->pub_inflight, memory_order_relaxed);
		if (held && !ev->gw.armed)
			kv_loop_timeout(ev->loop, &ev->gw, 100 * 1000000ull);
	}
	if (ev->pub_peak >= TRIM_MIN && held <= ev->pub_peak / 4) {
		ev->pub_peak = held;
		malloc_trim(0);
	}
	flush(ev, 0);
}

static int can_merge(const struct kv_events *ev, uint32_t pool, int medium,
		     const uint8_t *parent, int has_tokens, uint64_t lora_id, const char *lora,
		     size_t lora_len, int has_keys, size_t more)
{
	if (ev->pk != PEND_STORED || ev->ppool != pool || ev->pmedium != medium ||
	    ev->nph == PEND_MAX || ev->psize + more > EVENT_MAX)
		return 0;
	/* One BlockStored is one chain of one request: the new block's parent
	 * is the last block of the event, and it has the same LoRA. */
	return ev->phas_tokens == has_tokens && parent &&
	       !memcmp(parent, ev->phash[ev->nph - 1], KV_HASH_BYTES) &&
	       ev->phas_keys == has_keys && ev->plora_id == lora_id &&
	       ev->plora_len == lora_len && (!lora_len || !memcmp(ev->plora, lora, lora_len));
}

/* Encodes one block's extra keys, as msgspec writes the tuple vLLM's
 * to_event_extra_keys makes of them (nil for none), into kscratch.
 * Returns 0 or -ENOMEM. */
static int keys_enc(struct kv_events *ev, const struct kv_events_meta *m)
{
	size_t room = STR_HDR, i;
	char *w;

	ev->kscratch.len = 0;
	for (i = 0; i < m->nkeys; i++)
		room += 1 + STR_HDR + m->keys[i].len + 9;
	if (buf_room(&ev->kscratch, room) < 0)
		return -ENOMEM;
	w = ev->kscratch.p;
	if (!m->nkeys) {
		*w++ = (char)0xc0;
	} else {
		w = put_array(w, (uint32_t)m->nkeys);
		for (i = 0; i < m->nkeys; i++) {
			const struct kv_event_key *k = &m->keys[i];

			if (k->kind == KV_EVENT_KEY_DIGEST) {
				w = put_bin(w, k->p, k->len);
			} else if (k->kind == KV_EVENT_KEY_MM) {
				*w++ = (char)0x92;  /* (identifier, offset) */
				w = put_str(w, k->p, k->len);
				w = put_i64(w, k->offset);
			} else {
				w = put_str(w, k->p, k->len);
			}
		}
	}
	ev->kscratch.len = (size_t)(w - ev->kscratch.p);
	return 0;
}

/* One block stored in medium, with what its store says. A removal of the
 * block held back in this medium goes first (remove, then store again); in
 * other media it waits: a router sees the store of a tier move before the
 * remove. */
static void store_one(struct kv_events *ev, uint32_t pool, const uint8_t *hash,
		      const uint8_t *parent, int medium, const uint32_t *tokens, uint32_t ntok,
		      uint64_t lora_id, const char *lora, size_t lora_len, int has_keys,
		      const char *keys, size_t keys_len)
{
	size_t more;

	ev->stored_any = 1;
	if (ev->rm[medium].n && ev->rm[medium].pool == pool &&
	    hset_has(&ev->rm[medium].set, hash)) {
		pend_write(ev);
		rm_write(ev, medium);
	}
	more = HASH_MAX + (size_t)ntok * 5 + keys_len;
	if (STORED_FIXED + more > EVENT_MAX) {
		/* One block whose token ids and keys pass a batch: published
		 * without them (counted), so that no batch passes its bound. */
		ev->st.oversize++;
		tokens = NULL;
		ntok = 0;
		has_keys = 0;
		keys_len = 0;
		more = HASH_MAX;
	}
	if (!can_merge(ev, pool, medium, parent, tokens != NULL, lora_id, lora, lora_len,
		       has_keys, more)) {
		pend_write(ev);
		ev->pk = PEND_STORED;
		ev->ppool = pool;
		ev->pmedium = medium;
		ev->phas_parent = parent != NULL;
		if (parent)
			memcpy(ev->pparent, parent, KV_HASH_BYTES);
		ev->phas_tokens = tokens != NULL;
		ev->plora_id = lora_id;
		ev->plora_len = lora_len;
		if (lora_len)
			memcpy(ev->plora, lora, lora_len);
		ev->phas_keys = has_keys;
		ev->psize = STORED_FIXED;
	}
	if (tokens) {
		if (ev->nptok + ntok > ev->ptok_cap) {
			size_t cap = ev->ptok_cap ? ev->ptok_cap : 1024;
			uint32_t *np;

			while (cap < ev->nptok + ntok)
				cap *= 2;
			np = realloc(ev->ptok, cap * sizeof(*np));
			if (!np) {
				/* Announce the hash without its tokens rather
				 * than not at all. */
				pend_write(ev);
				store_one(ev, pool, hash, parent, medium, NULL, 0, lora_id, lora,
					  lora_len, 0, NULL, 0);
				return;
			}
			ev->ptok = np;
			ev->ptok_cap = cap;
		}
		memcpy(ev->ptok + ev->nptok, tokens, (size_t)ntok * sizeof(*tokens));
		ev->nptok += ntok;
	}
	if (ev->phas_keys && buf_write(&ev->pkeys, keys, keys_len) < 0) {
		/* No memory for the keys: announce the hash without them
		 * (the event's other blocks lose theirs too: extra_keys has
		 * one entry per block or none). */
		ev->phas_keys = 0;
		ev->pkeys.len = 0;
	}
	ev->psize += more;
	hset_add(&ev->pset, hash);
	memcpy(ev->phash[ev->nph++], hash, KV_HASH_BYTES);
}

/* A store the daemon makes itself (a tier move, an adoption): what the
 * block's Seal said, when the daemon still has it. */
void kv_events_stored(struct kv_events *ev, uint32_t pool, const uint8_t *hash,
		      const uint8_t *parent, int medium, const uint32_t *tokens)
{
	struct brec **pp, *r;

	if (!ev || pool >= KV_MAX_POOLS || !ev->pool_topic[pool])
		return;
	if (parent || tokens || !(pp = rec_slot(ev, pool, hash))) {
		store_one(ev, pool, hash, parent, medium, ev->pool_tokens[pool] ? tokens : NULL,
			  tokens ? ev->pool_bs[pool] : 0, 0, NULL, 0, 0, NULL, 0);
		return;
	}
	r = *pp;
	r->media |= (uint8_t)(1u << medium);
	if (r->has_parent && (!(pp = rec_slot(ev, pool, r->parent)) || !(*pp)->media)) {
		/* Its parent is held nowhere any more, so a router has
		 * forgotten it too: a store naming it would be dropped
		 * (llm-d cannot resolve the parent's key). Without token ids
		 * and parent, llm-d places the store by the block's own key,
		 * which it still knows (the store comes before the remove). */
		store_one(ev, pool, hash, NULL, medium, NULL, 0, r->lora_id,
			  (const char *)(r->tok + r->ntok), r->lora_len, 0, NULL, 0);
		return;
	}
	store_one(ev, pool, hash, r->has_parent ? r->parent : NULL, medium,
		  r->ntok ? r->tok : NULL, r->ntok, r->lora_id, (const char *)(r->tok + r->ntok),
		  r->lora_len, r->has_keys, (const char *)(r->tok + r->ntok) + r->lora_len,
		  r->keys_len);
}

void kv_events_stored_meta(struct kv_events *ev, uint32_t pool, const uint8_t *hash,
			   const uint8_t *parent, int medium, const uint32_t *tokens,
			   const struct kv_events_meta *meta)
{
	size_t lora_len;
	int has_keys;
	uint32_t ntok;

	if (!ev || pool >= KV_MAX_POOLS || !ev->pool_topic[pool])
		return;
	/* The extra keys are as private as the tokens. */
	has_keys = meta && meta->has_keys && ev->pool_tokens[pool];
	if (!ev->pool_tokens[pool])
		tokens = NULL;
	ntok = tokens ? ev->pool_bs[pool] : 0;
	lora_len = meta && meta->lora_name ? strnlen(meta->lora_name, KV_EVENTS_LORA_MAX) : 0;
	ev->kscratch.len = 0;
	if (has_keys && keys_enc(ev, meta) < 0)
		has_keys = 0;  /* no memory: published without them */
	if (parent || tokens || lora_len || has_keys || (meta && meta->lora_id)) {
		rec_set(ev, pool, hash, parent, medium, tokens, ntok, meta ? meta->lora_id : 0,
			lora_len ? meta->lora_name : NULL, lora_len, has_keys, ev->kscratch.p,
			has_keys ? ev->kscratch.len : 0);
	} else {
		/* Nothing for its tier moves to repeat: no record (a router
		 * could not place a block stored without token ids either,
		 * so its children's tier stores go without a parent). */
		struct brec **pp = rec_slot(ev, pool, hash);

		if (pp)
			rec_drop(ev, pp);
	}
	store_one(ev, pool, hash, parent, medium, tokens, ntok, meta ? meta->lora_id : 0,
		  lora_len ? meta->lora_name : NULL, lora_len, has_keys, ev->kscratch.p,
		  has_keys ? ev->kscratch.len : 0);
}

void kv_events_removed(struct kv_events *ev, uint32_t pool, const uint8_t *hash, int medium)
{
	struct rset *rs;
	struct brec **pp;

	if (!ev || pool >= KV_MAX_POOLS || !ev->pool_topic[pool])
		return;
	if ((pp = rec_slot(ev, pool, hash))) {
		(*pp)->media &= (uint8_t)~(1u << medium);
		if (!(*pp)->media)
			rec_zlist(ev, *pp);
	}
	/* The store of this block in this medium, if pending, goes first. */
	if (ev->pk == PEND_STORED && ev->ppool == pool && ev->pmedium == medium &&
	    hset_has(&ev->pset, hash))
		pend_write(ev);
	rs = &ev->rm[medium];
	if (rs->n && (rs->pool != pool || rs->n == PEND_MAX))
		rm_write(ev, medium);
	rs->pool = pool;
	hset_add(&rs->set, hash);
	memcpy(rs->h[rs->n++], hash, KV_HASH_BYTES);
}

void kv_events_no_model(struct kv_events *ev, uint32_t pool)
{
	if (!ev || pool >= KV_MAX_POOLS)
		return;
	kv_events_pool(ev, pool, NULL, 0, 0);
	ev->st.no_model++;
}

int kv_events_pool(struct kv_events *ev, uint32_t pool, const char *model, uint32_t block_size,
		   int tokens)
{
	char name[TOPIC_MAX];
	uint32_t t;
	int n;

	if (!ev || pool >= KV_MAX_POOLS)
		return 0;
	/* Events of the pool that had this id before go out first; what
	 * its Seals said goes. */
	if (ev->pk != PEND_NONE && ev->ppool == pool)
		pend_write(ev);
	for (n = 0; n < KV_MEDIUMS; n++)
		if (ev->rm[n].n && ev->rm[n].pool == pool)
			rm_write(ev, n);
	rec_drop_pool(ev, pool);
	if (!model) {
		ev->pool_topic[pool] = 0;
		return 0;
	}
	n = snprintf(name, sizeof(name), "kv@%s@%s", ev->node, model);
	if (n < 0 || (size_t)n >= sizeof(name))
		return -EINVAL;
	for (t = 0; t < ev->ntopics; t++)
		if (!strcmp(ev->topics[t].name, name))
			break;
	if (t == ev->ntopics) {
		if (t == MAX_TOPICS)
			return -ENOSPC;
		memset(&ev->topics[t], 0, sizeof(ev->topics[t]));
		memcpy(ev->topics[t].name, name, (size_t)n + 1);
		ev->topics[t].namelen = (size_t)n;
		ev->ntopics++;
		/* A new daemon: forget what an older one said. llm-d clears
		 * the whole pod (every model) on an AllBlocksCleared: a topic
		 * that appears once blocks were stored starts without one, or
		 * it would wipe the other models' blocks from its index. */
		if (!ev->stored_any)
			write_cleared(ev, t);
	}
	ev->pool_topic[pool] = (uint16_t)(t + 1);
	ev->pool_bs[pool] = block_size;
	ev->pool_tokens[pool] = (uint8_t)!!tokens;
	return 0;
}

/* ---- replay ---- */

/* ZMQ is done with a replay message (sent, or dropped with its peer). */
static void rsent_free(void *data, void *hint)
{
	struct rsent *x = hint;

	(void)data;
	atomic_fetch_sub_explicit(&x->peer->inflight, x->b->len, memory_order_relaxed);
	atomic_fetch_sub_explicit(x->total, x->b->len, memory_order_relaxed);
	rbatch_put(x->b);
	free(x);
}

/* The peer of routing id, made if need be (peers with nothing in flight are
 * freed on the way); NULL when REPLAY_PEERS_MAX have replays in flight. */
static struct rpeer *rpeer_get(struct kv_events *ev, const void *id, size_t idlen)
{
	struct rpeer **pp = &ev->peers, *p, *found = NULL;

	while ((p = *pp)) {
		if (!found && p->idlen == idlen && !memcmp(p->id, id, idlen)) {
			found = p;
		} else if (!atomic_load_explicit(&p->inflight, memory_order_acquire)) {
			*pp = p->next;
			free(p);
			ev->npeers--;
			continue;
		}
		pp = &p->next;
	}
	if (found || ev->npeers >= REPLAY_PEERS_MAX || !(found = calloc(1, sizeof(*found))))
		return found;
	memcpy(found->id, id, idlen);
	found->idlen = idlen;
	found->next = ev->peers;
	ev->peers = found;
	ev->npeers++;
	return found;
}

/* One batch of the ring to peer, without copying it. 0 or -1 (its queue is
 * full: the replay is cut). */
static int replay_batch(struct kv_events *ev, struct rpeer *peer, const struct replay *r)
{
	struct rsent *x = malloc(sizeof(*x));
	zmq_msg_t m;

	if (!x)
		return -1;
	x->b = r->b;
	x->peer = peer;
	x->total = &ev->replay_inflight;
	atomic_fetch_add_explicit(&r->b->refs, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&peer->inflight, r->b->len, memory_order_relaxed);
	atomic_fetch_add_explicit(&ev->replay_inflight, r->b->len, memory_order_relaxed);
	if (zmq_msg_init_data(&m, r->b->p, r->b->len, rsent_free, x) < 0) {
		rsent_free(NULL, x);
		return -1;
	}
	if (zmq_msg_send(&m, ev->router, ZMQ_DONTWAIT) < 0) {
		zmq_msg_close(&m);   /* frees through rsent_free */
		return -1;
	}
	return 0;
}

static void replay_send(struct kv_events *ev, const void *id, size_t idlen, uint64_t start,
			const char *topic, size_t tlen)
{
	unsigned char seq[8];
	uint32_t i, t = UINT32_MAX, n = 0;
	uint64_t bytes = 0;
	struct rpeer *peer;
	int all = 0, refused = 0;

	if (topic) {
		for (t = 0; t < ev->ntopics; t++)
			if (ev->topics[t].namelen == tlen && !memcmp(ev->topics[t].name, topic, tlen))
				break;
	} else {
		all = 1;  /* every topic's batches, in their one sequence */
	}
	for (i = 0; i < ev->ring_n; i++) {
		const struct replay *r = &ev->ring[(ev->ring_head + i) % ev->ring_cap];

		if ((all || r->topic == t) && r->seq >= start) {
			bytes += r->b->len;
			n++;
		}
	}
	/* One replay in flight per peer, and events_replay_max_bytes for all
	 * of them: past either the peer gets the end marker alone (counted). */
	peer = rpeer_get(ev, id, idlen);
	if (!peer || atomic_load_explicit(&peer->inflight, memory_order_acquire) ||
	    atomic_load_explicit(&ev->replay_inflight, memory_order_relaxed) + bytes >
		    ev->replay_max) {
		ev->st.replay_refused++;
		refused = 1;
	}
	for (i = 0; !refused && i < ev->ring_n; i++) {
		const struct replay *r = &ev->ring[(ev->ring_head + i) % ev->ring_cap];

		if ((!all && r->topic != t) || r->seq < start)
			continue;
		put_be64(seq, r->seq);
		if (zmq_send(ev->router, id, idlen, ZMQ_DONTWAIT | ZMQ_SNDMORE) < 0) {
			ev->st.replay_truncated++;
			goto unsent;
		}
		/* vLLM >= 0.26: [identity, "", topic, seq, payload]. */
		zmq_send(ev->router, "", 0, ZMQ_DONTWAIT | ZMQ_SNDMORE);
		zmq_send(ev->router, ev->topics[r->topic].name, ev->topics[r->topic].namelen,
			 ZMQ_DONTWAIT | ZMQ_SNDMORE);
		zmq_send(ev->router, seq, 8, ZMQ_DONTWAIT | ZMQ_SNDMORE);
		if (replay_batch(ev, peer, r) < 0) {
			ev->st.replay_truncated++;
			goto unsent;
		}
		ev->trim = 1;
		bytes -= r->b->len;
		n--;
	}
	/* The end, vLLM's END_SEQ: an empty topic, seq -1, an empty payload. */
	memset(seq, 0xff, sizeof(seq));
	if (zmq_send(ev->router, id, idlen, ZMQ_DONTWAIT | ZMQ_SNDMORE) < 0) {
		ev->st.replay_truncated++;
		goto unsent;
	}
	zmq_send(ev->router, "", 0, ZMQ_DONTWAIT | ZMQ_SNDMORE);
	zmq_send(ev->router, "", 0, ZMQ_DONTWAIT | ZMQ_SNDMORE);
	zmq_send(ev->router, seq, 8, ZMQ_DONTWAIT | ZMQ_SNDMORE);
	zmq_send(ev->router, "", 0, ZMQ_DONTWAIT);
	if (!refused)
		return;
unsent:
	/* What the request asked for and did not get: bytes and n count down
	 * as batches go. */
	ev->st.replay_dropped += n;
	ev->st.replay_dropped_bytes += bytes;
}

/* Reads one request: [identity, "", seq (8 bytes, big endian)] as vLLM's
 * publisher takes it, optionally a fourth frame naming the topic. */
static void replay_one(struct kv_events *ev)
{
	unsigned char id[256], fr[3][4096];
	int idlen, flen[3] = { -1, -1, -1 }, n = 0, more, r;
	size_t msz = sizeof(more);
	uint64_t start = 0;

	idlen = zmq_recv(ev->router, id, sizeof(id), ZMQ_DONTWAIT);
	if (idlen < 0)
		return;
	for (;;) {
		if (zmq_getsockopt(ev->router, ZMQ_RCVMORE, &more, &msz) < 0 || !more)
			break;
		/* Frames past the third are read and dropped (the request is
		 * bad); zmq_recv truncates a frame to the buffer and returns
		 * its real length. */
		r = zmq_recv(ev->router, fr[n < 3 ? n : 2], sizeof(fr[0]), ZMQ_DONTWAIT);
		if (r < 0)
			break;
		if (n < 3)
			flen[n] = r;
		n++;
	}
	/* As vLLM's _service_replay: [identity, any, start] (the delimiter is
	 * not looked at), the start read as int.from_bytes(start, "big"), an
	 * unsigned integer of any length (past 2**64 - 1: after every seq,
	 * nothing is replayed, the end marker is sent). A fourth frame names
	 * a topic (kvcached's). */
	if ((size_t)idlen > sizeof(id) || (n != 2 && n != 3) || flen[1] > (int)sizeof(fr[1]) ||
	    (n == 3 && flen[2] > TOPIC_MAX)) {
		ev->st.replay_bad++;
		return;
	}
	for (r = 0; r < flen[1]; r++) {
		if (start >> 56) {
			start = UINT64_MAX;
			break;
		}
		start = start << 8 | fr[1][r];
	}
	ev->st.replay_requests++;
	replay_send(ev, id, (size_t)idlen, start, n == 3 ? (const char *)fr[2] : NULL,
		    n == 3 ? (size_t)flen[2] : 0);
}

static void replay_ready(struct kv_loop_watch *w, int res, int more)
{
	struct kv_events *ev = kv_container_of(w, struct kv_events, rw);
	int events, budget = 64;
	size_t sz = sizeof(events);

	if (!ev->router || res < 0)
		return;
	if (!more && kv_loop_poll(ev->loop, &ev->rw, ev->rfd, POLLIN, 1) < 0)
		kv_warn("events: replay socket no longer polled");
	/* ZMQ_FD signals edges: read until ZMQ_EVENTS says nothing is left,
	 * at most budget requests per wakeup (the fd stays readable while
	 * requests wait, so the loop comes back). */
	while (budget-- > 0) {
		if (zmq_getsockopt(ev->router, ZMQ_EVENTS, &events, &sz) < 0 ||
		    !(events & ZMQ_POLLIN))
			return;
		replay_one(ev);
	}
}

/* ---- setup ---- */

static int zopt(void *s, int opt, int v)
{
	return zmq_setsockopt(s, opt, &v, sizeof(v));
}

/* An ipc:// endpoint's socket file gets the admin socket's mode and group:
 * who may read events is who may administer the daemon (docs/security.md). */
static int ipc_perms(const struct kv_config *cfg, const char *ep, char *err, size_t errlen)
{
	const char *path;

	if (strncmp(ep, "ipc://", 6))
		return 0;
	path = ep + 6;
	if (cfg->admin_socket_group[0]) {
		struct group *g = getgrnam(cfg->admin_socket_group);
		char *end;
		long v = strtol(cfg->admin_socket_group, &end, 10);
		gid_t gid = g ? g->gr_gid : (gid_t)v;

		if ((g || !*end) && chown(path, (uid_t)-1, gid) < 0) {
			kv_errf(err, errlen, "%s: chown: %s", path, strerror(errno));
			return -errno;
		}
	}
	if (chmod(path, cfg->admin_socket_mode & 0660) < 0) {
		kv_errf(err, errlen, "%s: chmod: %s", path, strerror(errno));
		return -errno;
	}
	return 0;
}

int kv_events_open(struct kv_events **out, const struct kv_config *cfg, struct kv_loop *loop,
		   char *err, size_t errlen)
{
	struct kv_events *ev;
	size_t sz = sizeof(int);
	int rc = -EINVAL;

	*out = NULL;
	if (!cfg->events_endpoint[0]) {
		if (cfg->events_replay_endpoint[0]) {
			kv_errf(err, errlen, "events_replay_endpoint needs events_endpoint");
			return -EINVAL;
		}
		return 0;
	}
	ev = calloc(1, sizeof(*ev));
	if (!ev)
		return -ENOMEM;
	ev->loop = loop;
	ev->rfd = -1;
	ev->tw.cb = interval_done;
	ev->interval_ns = cfg->events_interval_ms * 1000000u;
	snprintf(ev->node, sizeof(ev->node), "%s", cfg->node_name);
	if (!ev->node[0] && (gethostname(ev->node, sizeof(ev->node) - 1) < 0 || !ev->node[0]))
		snprintf(ev->node, sizeof(ev->node), "localhost");
	/* A host name has no '@' (node_name is checked by the configuration). */
	ev->int_hashes = !strcmp(cfg->events_hash_format, "int");
	ev->dp_rank = cfg->events_dp_rank;
	ev->ring_bytes_max = cfg->events_buffer_max_bytes;
	ev->gw.cb = trim_done;
	ev->topics = calloc(MAX_TOPICS, sizeof(*ev->topics));
	ev->dirty = calloc(MAX_TOPICS, sizeof(*ev->dirty));
	ev->zctx = zmq_ctx_new();
	if (!ev->topics || !ev->dirty || !ev->zctx) {
		rc = -ENOMEM;
		goto err;
	}
	ev->pub = zmq_socket(ev->zctx, ZMQ_XPUB);
	ev->replay_max = cfg->events_replay_max_bytes;
	if (!ev->pub || zopt(ev->pub, ZMQ_SNDHWM, (int)kv_events_sub_hwm(cfg)) < 0 ||
	    zopt(ev->pub, ZMQ_XPUB_NODROP, 1) < 0 || zopt(ev->pub, ZMQ_LINGER, 0) < 0) {
		kv_errf(err, errlen, "events: %s", zmq_strerror(zmq_errno()));
		goto err;
	}
	/* Subscriptions are short; a peer sending more is cut off. */
	{
		int64_t max = 1024;

		zmq_setsockopt(ev->pub, ZMQ_MAXMSGSIZE, &max, sizeof(max));
	}
	if ((cfg->events_connect ? zmq_connect(ev->pub, cfg->events_endpoint)
				 : zmq_bind(ev->pub, cfg->events_endpoint)) < 0) {
		kv_errf(err, errlen, "events_endpoint %s: %s", cfg->events_endpoint,
			zmq_strerror(zmq_errno()));
		goto err;
	}
	if (!cfg->events_connect && (rc = ipc_perms(cfg, cfg->events_endpoint, err, errlen)) < 0)
		goto err;
	rc = -EINVAL;
	if (cfg->events_replay_endpoint[0]) {
		int64_t max = 4096;

		ev->ring_cap = cfg->events_buffer;
		ev->ring = calloc(ev->ring_cap, sizeof(*ev->ring));
		ev->router = zmq_socket(ev->zctx, ZMQ_ROUTER);
		if (!ev->ring || !ev->router ||
		    zopt(ev->router, ZMQ_SNDHWM, (int)cfg->events_buffer + 2) < 0 ||
		    zopt(ev->router, ZMQ_ROUTER_MANDATORY, 1) < 0 ||
		    zopt(ev->router, ZMQ_LINGER, 0) < 0 ||
		    zmq_setsockopt(ev->router, ZMQ_MAXMSGSIZE, &max, sizeof(max)) < 0 ||
		    zmq_bind(ev->router, cfg->events_replay_endpoint) < 0 ||
		    zmq_getsockopt(ev->router, ZMQ_FD, &ev->rfd, &sz) < 0) {
			kv_errf(err, errlen, "events_replay_endpoint %s: %s",
				cfg->events_replay_endpoint, zmq_strerror(zmq_errno()));
			goto err;
		}
		if ((rc = ipc_perms(cfg, cfg->events_replay_endpoint, err, errlen)) < 0)
			goto err;
		ev->rw.cb = replay_ready;
		if ((rc = kv_loop_poll(loop, &ev->rw, ev->rfd, POLLIN, 1)) < 0) {
			kv_errf(err, errlen, "events: cannot poll the replay socket");
			goto err;
		}
	}
	if (!strncmp(cfg->events_endpoint, "tcp://", 6) &&
	    !strstr(cfg->events_endpoint, "127.0.0.1") && !strstr(cfg->events_endpoint, "[::1]") &&
	    !strstr(cfg->events_endpoint, "localhost"))
		kv_warn("events: %s is reachable from the network; events carry prompt hashes "
			"and, with events_token_ids, token ids (docs/security.md)",
			cfg->events_endpoint);
	kv_info("events: publishing on %s%s%s", cfg->events_endpoint,
		cfg->events_replay_endpoint[0] ? ", replay on " : "", cfg->events_replay_endpoint);
	*out = ev;
	return 0;
err:
	kv_events_close(ev);
	return rc;
}

void kv_events_close(struct kv_events *ev)
{
	uint32_t i;

	if (!ev)
		return;
	if (ev->pub)
		flush(ev, 1);
	if (ev->tw.armed)
		kv_loop_cancel(ev->loop, &ev->tw);
	if (ev->gw.armed)
		kv_loop_cancel(ev->loop, &ev->gw);
	if (ev->router) {
		if (ev->rw.armed)
			kv_loop_cancel(ev->loop, &ev->rw);
		zmq_close(ev->router);
		ev->router = NULL;
	}
	if (ev->pub)
		zmq_close(ev->pub);
	if (ev->zctx)
		zmq_ctx_term(ev->zctx);
	/* zmq_ctx_term() dropped every message still queued: no replay is in
	 * flight any more. */
	for (i = 0; i < ev->ring_n; i++)
		rbatch_put(ev->ring[(ev->ring_head + i) % ev->ring_cap].b);
	free(ev->ring);
	while (ev->peers) {
		struct rpeer *p = ev->peers;

		ev->peers = p->next;
		free(p);
	}
	for (i = 0; ev->topics && i < ev->ntopics; i++)
		free(ev->topics[i].batch.p);
	free(ev->topics);
	free(ev->dirty);
	free(ev->ptok);
	free(ev->pkeys.p);
	free(ev->kscratch.p);
	while (ev->zlist) {
		struct brec *r = ev->zlist;

		ev->zlist = r->znext;
		r->zlisted = 0;
		if (r->dead)
			free(r);
	}
	for (i = 0; i < ev->nbuckets; i++)
		while (ev->recs[i]) {
			struct brec *r = ev->recs[i];

			ev->recs[i] = r->next;
			free(r);
		}
	free(ev->recs);
	/* A cancelled watch still gets its last completion: the loop is gone
	 * by now (daemon fini), so nothing calls back into ev. */
	free(ev);
}

void kv_events_stats(const struct kv_events *ev, struct kv_events_stats *st)
{
	if (!ev) {
		memset(st, 0, sizeof(*st));
		return;
	}
	*st = ev->st;
	st->buffered = ev->ring_n;
	st->replay_inflight_bytes = atomic_load_explicit(&ev->replay_inflight, memory_order_relaxed);
	st->sub_inflight_bytes = atomic_load_explicit(&ev->pub_inflight, memory_order_relaxed);
	st->blocks_known = ev->nrecs;
	st->blocks_known_bytes = ev->rec_bytes + (uint64_t)ev->nbuckets * sizeof(*ev->recs);
}

#endif
