/* KV events: see events.h; the format and its sources are in docs/events.md.
 *
 * One file of about 1,280 lines, on purpose: the encoder, the batches, the
 * publisher and the replay server all work on struct kv_events's private
 * state (the pending event, the per-topic batches, the replay ring), which no
 * other module may see; a split would need an internal header exposing all of
 * it. A quarter of the file is the no-events stubs and the socket setup.
 * Sections: stubs (KV_HAVE_EVENTS 0); encoding; batches and sending; merging
 * events; topics; replay; setup. */
#include "events.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "kvconfig.h"
#include "kverr.h"

uint32_t kv_events_sub_hwm(const struct kv_config *cfg)
{
	uint64_t by_bytes = cfg->events_subscriber_max_bytes / KV_EVENTS_BATCH_BYTES;

	if (by_bytes < 16)
		by_bytes = 16;
	return by_bytes < cfg->events_hwm ? (uint32_t)by_bytes : cfg->events_hwm;
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
	uint64_t seq;         /* the next batch's */
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
	char p[];
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

struct kv_events {
	void *zctx, *pub, *router;
	struct kv_loop *loop;
	struct kv_loop_watch rw;  /* the replay socket's ZMQ_FD */
	struct kv_loop_watch tw;  /* events_interval: the next send */
	uint64_t interval_ns;
	uint64_t pending_since;   /* CLOCK_MONOTONIC ns of the oldest unsent event; 0: none */
	int rfd;
	int int_hashes;       /* events_hash_format = int */
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
	uint32_t nph;
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
	"\x83\xa4type\xac" "BlockRemoved\xac" "block_hashes";
static const char lora_id_key[] = "\xa7lora_id";
static const char lora_name_key[] = "\xa9lora_name";
static const char extra_keys_key[] = "\xaa" "extra_keys";
/* medium <m>, vLLM's MEDIUM_GPU, MEDIUM_CPU, MEDIUM_STORAGE (kv_events.py). */
static const char *const removed_tail[KV_MEDIUMS] = {
	"\xa6medium\xa3GPU", "\xa6medium\xa3" "CPU", "\xa6medium\xa7" "STORAGE",
};

static char *put(char *w, const void *p, size_t n)
{
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

/* Writes the pending event into its topic's batch. */
static void pend_write(struct kv_events *ev)
{
	uint32_t t, i;
	struct topic *tp;
	size_t room;
	char *w;

	if (ev->pk == PEND_NONE)
		return;
	t = ev->pool_topic[ev->ppool] - 1u;
	tp = &ev->topics[t];
	room = 256 + (size_t)(ev->nph + 1) * HASH_MAX + ev->nptok * 5 + ev->plora_len +
	       ev->pkeys.len;
	if (topic_open_batch(tp) < 0 || buf_room(&tp->batch, room) < 0)
		goto out;  /* no memory: the event is lost, the next ones are not */
	w = tp->batch.p + tp->batch.len;
	if (ev->pk == PEND_STORED) {
		/* vLLM's BlockStored as a tagged map (tag field "type"), its
		 * fields in declaration order; those without a default
		 * (lora_id, medium, lora_name) always, nil when unknown; those
		 * with a default of None omitted, as msgspec's omit_defaults
		 * does: extra_keys unless the Seal gave them, group_idx and
		 * the rest always. */
		*w++ = (char)0xde;  /* map16 of 8 fields, 9 with extra_keys */
		*w++ = 0;
		*w++ = (char)(8 + !!ev->phas_keys);
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
	} else {
		w = put(w, LIT(removed_head));
		w = put_array(w, ev->nph);
		for (i = 0; i < ev->nph; i++)
			w = put_hash(ev, w, ev->phash[i]);
		w = put(w, removed_tail[ev->pmedium], strlen(removed_tail[ev->pmedium]));
	}
	tp->batch.len = (size_t)(w - tp->batch.p);
	tp->nevents++;
	topic_dirty(ev, t);
	if (tp->batch.len >= KV_EVENTS_BATCH_BYTES)
		send_batch(ev, t);
out:
	ev->pk = PEND_NONE;
	ev->nph = 0;
	ev->nptok = 0;
	ev->pkeys.len = 0;
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

static void ring_put(struct kv_events *ev, uint32_t t, uint64_t seq, const char *p, size_t len)
{
	struct replay *r;
	struct rbatch *copy;

	if (!ev->ring_cap)
		return;
	copy = malloc(sizeof(*copy) + len);
	if (!copy)
		return;  /* a hole in the replay: the client sees the seq gap */
	atomic_init(&copy->refs, 1);
	copy->len = len;
	memcpy(copy->p, p, len);
	if (ev->ring_n == ev->ring_cap) {
		r = &ev->ring[ev->ring_head];
		ev->st.buffered_bytes -= r->b->len;
		rbatch_put(r->b);
		ev->ring_head = (ev->ring_head + 1) % ev->ring_cap;
		ev->ring_n--;
	}
	r = &ev->ring[(ev->ring_head + ev->ring_n) % ev->ring_cap];
	r->topic = t;
	r->seq = seq;
	r->b = copy;
	ev->ring_n++;
	ev->st.buffered_bytes += len;
}

static void put_be64(unsigned char *b, uint64_t v)
{
	int i;

	for (i = 7; i >= 0; i--, v >>= 8)
		b[i] = (unsigned char)v;
}

/* One multipart message to every subscriber with room for it. XPUB with
 * ZMQ_XPUB_NODROP refuses (EAGAIN) a message some subscriber's queue is full
 * for: that is how a drop is seen and counted; the message then goes to the
 * others with NODROP off, as a PUB socket sends. */
static int pub_send(struct kv_events *ev, const struct topic *tp, const unsigned char *seq,
		    const char *p, size_t len)
{
	int pass, off = 0, on = 1, dropped = 0;

	for (pass = 0; pass < 2; pass++) {
		if (zmq_send(ev->pub, tp->name, tp->namelen, ZMQ_DONTWAIT | ZMQ_SNDMORE) >= 0) {
			zmq_send(ev->pub, seq, 8, ZMQ_DONTWAIT | ZMQ_SNDMORE);
			zmq_send(ev->pub, p, len, ZMQ_DONTWAIT);
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
	char *p;
	size_t len;
	int r;

	if (!tp->nevents) {
		tp->batch.len = 0;
		return;
	}
	if (buf_room(&tp->batch, RANK_MAX) < 0) {
		/* No room for the rank: the batch cannot be sent right. */
		ev->st.dropped++;
		ev->st.dropped_events += tp->nevents;
		ev->st.dropped_bytes += tp->batch.len;
		tp->seq++;
		tp->nevents = 0;
		tp->batch.len = 0;
		return;
	}
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
	put_be64(seq, tp->seq);
	r = pub_send(ev, tp, seq, p, len);
	if (r != 0) {
		if (r < 0 && ev->st.dropped == 0)
			kv_warn("events: send failed: %s", zmq_strerror(zmq_errno()));
		ev->st.dropped++;
		ev->st.dropped_events += tp->nevents;
		ev->st.dropped_bytes += len;
	}
	ring_put(ev, t, tp->seq, p, len);
	tp->seq++;
	ev->st.batches++;
	ev->st.events += tp->nevents;
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
	char sub[256];

	if ((ev->pk == PEND_NONE && !ev->ndirty) || !due(ev, force))
		return;
	ev->pending_since = 0;
	pend_write(ev);
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

void kv_events_flush(struct kv_events *ev)
{
	if (!ev)
		return;
	/* The replays' memory went back to ZMQ's allocator, in its I/O
	 * thread's arena: hand it back to the system once none is in flight. */
	if (ev->trim && !atomic_load_explicit(&ev->replay_inflight, memory_order_relaxed)) {
		ev->trim = 0;
		malloc_trim(0);
	}
	flush(ev, 0);
}

static int can_merge(const struct kv_events *ev, int kind, uint32_t pool, int medium,
		     const uint8_t *parent, int has_tokens, const struct kv_events_meta *m,
		     size_t lora_len)
{
	if (ev->pk != kind || ev->ppool != pool || ev->pmedium != medium || ev->nph == PEND_MAX)
		return 0;
	if (kind == PEND_REMOVED)
		return 1;
	/* One BlockStored is one chain of one request: the new block's parent
	 * is the last block of the event, and it has the same LoRA. */
	return ev->phas_tokens == has_tokens && parent &&
	       !memcmp(parent, ev->phash[ev->nph - 1], KV_HASH_BYTES) &&
	       ev->phas_keys == (m && m->has_keys) && ev->plora_id == (m ? m->lora_id : 0) &&
	       ev->plora_len == lora_len && (!lora_len || !memcmp(ev->plora, m->lora_name, lora_len));
}

/* Appends one block's extra keys, as msgspec writes the tuple vLLM's
 * to_event_extra_keys makes of them (nil for none), to the pending event's.
 * Returns 0 or -ENOMEM. */
static int keys_put(struct kv_events *ev, const struct kv_events_meta *m)
{
	size_t room = STR_HDR, i;
	char *w;

	for (i = 0; i < m->nkeys; i++)
		room += 1 + STR_HDR + m->keys[i].len + 9;
	if (buf_room(&ev->pkeys, room) < 0)
		return -ENOMEM;
	w = ev->pkeys.p + ev->pkeys.len;
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
	ev->pkeys.len = (size_t)(w - ev->pkeys.p);
	return 0;
}

void kv_events_stored(struct kv_events *ev, uint32_t pool, const uint8_t *hash,
		      const uint8_t *parent, int medium, const uint32_t *tokens)
{
	kv_events_stored_meta(ev, pool, hash, parent, medium, tokens, NULL);
}

void kv_events_stored_meta(struct kv_events *ev, uint32_t pool, const uint8_t *hash,
			   const uint8_t *parent, int medium, const uint32_t *tokens,
			   const struct kv_events_meta *meta)
{
	struct kv_events_meta m0;
	size_t lora_len;
	uint32_t bs;

	if (!ev || pool >= KV_MAX_POOLS || !ev->pool_topic[pool])
		return;
	if (!ev->pool_tokens[pool]) {
		tokens = NULL;
		if (meta && meta->has_keys) {
			/* The extra keys are as private as the tokens. */
			m0 = *meta;
			m0.has_keys = 0;
			meta = &m0;
		}
	}
	lora_len = meta && meta->lora_name ? strnlen(meta->lora_name, KV_EVENTS_LORA_MAX) : 0;
	bs = ev->pool_bs[pool];
	if (!can_merge(ev, PEND_STORED, pool, medium, parent, tokens != NULL, meta, lora_len)) {
		pend_write(ev);
		ev->pk = PEND_STORED;
		ev->ppool = pool;
		ev->pmedium = medium;
		ev->phas_parent = parent != NULL;
		if (parent)
			memcpy(ev->pparent, parent, KV_HASH_BYTES);
		ev->phas_tokens = tokens != NULL;
		ev->plora_id = meta ? meta->lora_id : 0;
		ev->plora_len = lora_len;
		if (lora_len)
			memcpy(ev->plora, meta->lora_name, lora_len);
		ev->phas_keys = meta && meta->has_keys;
	}
	if (tokens) {
		if (ev->nptok + bs > ev->ptok_cap) {
			size_t cap = ev->ptok_cap ? ev->ptok_cap : 1024;
			uint32_t *np;

			while (cap < ev->nptok + bs)
				cap *= 2;
			np = realloc(ev->ptok, cap * sizeof(*np));
			if (!np) {
				/* Announce the hash without its tokens rather
				 * than not at all. */
				pend_write(ev);
				kv_events_stored_meta(ev, pool, hash, parent, medium, NULL, meta);
				return;
			}
			ev->ptok = np;
			ev->ptok_cap = cap;
		}
		memcpy(ev->ptok + ev->nptok, tokens, bs * sizeof(*tokens));
		ev->nptok += bs;
	}
	if (ev->phas_keys && keys_put(ev, meta) < 0) {
		/* No memory for the keys: announce the hash without them
		 * (the event's other blocks lose theirs too: extra_keys has
		 * one entry per block or none). */
		ev->phas_keys = 0;
		ev->pkeys.len = 0;
	}
	memcpy(ev->phash[ev->nph++], hash, KV_HASH_BYTES);
}

void kv_events_removed(struct kv_events *ev, uint32_t pool, const uint8_t *hash, int medium)
{
	if (!ev || pool >= KV_MAX_POOLS || !ev->pool_topic[pool])
		return;
	if (!can_merge(ev, PEND_REMOVED, pool, medium, NULL, 0, NULL, 0)) {
		pend_write(ev);
		ev->pk = PEND_REMOVED;
		ev->ppool = pool;
		ev->pmedium = medium;
	}
	memcpy(ev->phash[ev->nph++], hash, KV_HASH_BYTES);
}

int kv_events_pool(struct kv_events *ev, uint32_t pool, const char *model, uint32_t block_size,
		   int tokens)
{
	char name[TOPIC_MAX];
	uint32_t t;
	int n;

	if (!ev || pool >= KV_MAX_POOLS)
		return 0;
	/* Events of the pool that had this id before go out first. */
	if (ev->pk != PEND_NONE && ev->ppool == pool)
		pend_write(ev);
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
	} else if (ev->ntopics == 1) {
		t = 0;
	} else {
		all = 1;  /* several topics and none named: every batch */
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
	unsigned char id[256], fr[3][TOPIC_MAX];
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
		r = zmq_recv(ev->router, fr[n < 3 ? n : 2], TOPIC_MAX, ZMQ_DONTWAIT);
		if (r < 0)
			break;
		if (n < 3)
			flen[n] = r;
		n++;
	}
	if ((size_t)idlen > sizeof(id) || (n != 2 && n != 3) || flen[0] != 0 || flen[1] != 8 ||
	    (n == 3 && flen[2] > TOPIC_MAX)) {
		ev->st.replay_bad++;
		return;
	}
	for (r = 0; r < 8; r++)
		start = start << 8 | fr[1][r];
	/* A negative start (vLLM's seq is signed) is 0. */
	if (start >> 63)
		start = 0;
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
}

#endif
