/* KV events: what enters and leaves the prefix index, published for
 * prefix-aware routers in vLLM's KV-event format (docs/events.md).
 *
 * A sink: the pools and the tiers tell it (through the hook kv_pools_set_watch()
 * installs, pool.h) that a hash was stored in or removed from a medium (G1,
 * G2, G3); it knows nothing of pools, sessions or tiers. Events of one pool
 * go to the topic "kv@<node_name>@<model>" of that pool (kv_events_pool());
 * events are merged into vLLM events (consecutive hashes of one chain into one
 * BlockStored, consecutive removals into one BlockRemoved) and queued per
 * topic; kv_events_flush(), called once per loop iteration, sends each
 * topic's queue, once its oldest event is events_interval old (a timer on the
 * loop makes sure of it; 0: every iteration), as one message [topic, seq (8
 * bytes, big endian), msgpack [ts, [events...], data_parallel_rank]] (vLLM's
 * KVEventBatch as its publisher encodes it) with one sequence number for
 * every topic of the publisher (issue 35: llm-d keeps one last-seen seq per
 * endpoint), and keeps it for replay. A tier move's store repeats what the
 * block's Seal said (parent, token ids, LoRA, extra keys: a record per held
 * block) and comes before the remove it goes with.
 *
 * Threads: everything runs on the loop thread, which owns the ZeroMQ sockets
 * (they are not thread-safe). Nothing here blocks: sends are ZMQ_DONTWAIT; a
 * batch a subscriber has no room for (its ZMQ_SNDHWM queue full) is dropped
 * for that subscriber and counted (dropped), and stays in the replay buffer.
 * The replay socket (ZMQ_ROUTER) is polled by the loop through ZMQ_FD.
 *
 * Memory is bounded: a batch is never more than KV_EVENTS_BATCH_BYTES (a
 * long chain is cut into several BlockStored; a block whose token ids and
 * keys alone would pass it is published without them, counted), the replay
 * buffer holds at most events_buffer batches and events_buffer_max_bytes, a
 * subscriber's queue kv_events_sub_hwm() batches (events_subscriber_max_bytes),
 * sharing the ring's batches, and a replay peer's queue events_buffer + 2
 * messages (ZMQ_SNDHWM of the ROUTER socket, ZMQ_ROUTER_MANDATORY: a replay
 * that does not fit stops).
 *
 * Without ZeroMQ and msgpack-c (KV_HAVE_EVENTS 0), kv_events_open() refuses a
 * configuration that sets events_endpoint and every other call is a no-op. */
#ifndef KV_EVENTS_H
#define KV_EVENTS_H

#include <stddef.h>
#include <stdint.h>

struct kv_config;
struct kv_loop;
struct kv_events;

/* Media, as the tiers number them (KVCACHED__TIER__TIER_G1 ...); published
 * as vLLM's "GPU", "CPU", "STORAGE". */
enum { KV_MEDIUM_G1, KV_MEDIUM_G2, KV_MEDIUM_G3, KV_MEDIUMS };

#define KV_EVENTS_BATCH_BYTES (64u * 1024)

/* A subscriber's queue in batches: events_hwm, and no more than
 * events_subscriber_max_bytes of full batches (at least 16). */
uint32_t kv_events_sub_hwm(const struct kv_config *cfg);

struct kv_events_stats {
	uint64_t batches;          /* messages published */
	uint64_t events;           /* vLLM events in them */
	uint64_t dropped;          /* batches some subscriber had no room for (a
				    * stalled subscriber counted once: events.md §5) */
	uint64_t dropped_events;   /* vLLM events in those batches */
	uint64_t dropped_bytes;    /* their bytes */
	uint64_t replay_requests;  /* well-formed replay requests served */
	uint64_t replay_bad;       /* malformed requests, ignored */
	uint64_t replay_truncated; /* replays cut short: the peer's queue was full */
	uint64_t replay_refused;   /* replays refused: the peer's last one still queued,
				    * or events_replay_max_bytes in flight */
	uint64_t replay_dropped;   /* batches a replay asked for and did not send
				    * (refused or cut short) */
	uint64_t replay_dropped_bytes; /* their bytes */
	uint64_t replay_inflight_bytes; /* of replay messages ZMQ still holds */
	uint64_t buffered;         /* batches held for replay */
	uint64_t buffered_bytes;
	uint64_t no_model;         /* pools registered without a model: not published */
	uint64_t oversize;         /* blocks whose token ids and keys would pass a
				    * batch: published without them */
	uint64_t sub_inflight_bytes; /* of published batches ZMQ's queues hold */
	uint64_t blocks_known;     /* blocks whose Seal's parent, tokens, LoRA, keys
				    * the tier moves' stores repeat */
	uint64_t blocks_known_bytes;
};

/* Opens the publisher of cfg (events_endpoint, ...) and polls the replay
 * socket on loop. *out is NULL, and 0 returned, when events_endpoint is
 * empty. Returns 0 or -errno with a message in err (a bad endpoint, a build
 * without events). */
int kv_events_open(struct kv_events **out, const struct kv_config *cfg, struct kv_loop *loop,
		   char *err, size_t errlen);
/* Sends what is queued, closes the sockets (linger 0). Accepts NULL. */
void kv_events_close(struct kv_events *ev);

/* Pool id's events go to topic kv@<node>@<model>; block_size is its
 * block_tokens; tokens: whether its Seals' token ids may be published
 * (docs/security.md); model NULL: the pool's events are not published. A
 * topic seen for the first time before any block was stored starts with an
 * AllBlocksCleared event (a new daemon: forget what an older one said); one
 * seen later does not (llm-d would clear the whole pod, every model). What
 * the pool that had this id before recorded of its blocks goes. Returns 0,
 * -EINVAL (a name too long) or -ENOSPC (too many topics): the pool's events
 * are then not published. */
int kv_events_pool(struct kv_events *ev, uint32_t pool, const char *model, uint32_t block_size,
		   int tokens);

/* hash (32 bytes) of pool was stored in medium by the daemon itself (a tier
 * move, an adoption): parent and tokens NULL publish what the block's Seal
 * said, when the daemon has it (kv_events_stored_meta() recorded it), else
 * nothing; non-NULL, these (the parent: the hash of the block before it in
 * its chain; tokens: its block_size token ids). */
void kv_events_stored(struct kv_events *ev, uint32_t pool, const uint8_t *hash,
		      const uint8_t *parent, int medium, const uint32_t *tokens);

/* Bounds of what a Seal may say about its blocks for the events
 * (kvcached.proto, Seal): the daemon refuses more before it gets here. */
#define KV_EVENTS_LORA_MAX 256    /* bytes of a LoRA name */
#define KV_EVENTS_KEYS_MAX 64     /* extra keys of one block */
#define KV_EVENTS_KEY_MAX 1024    /* bytes of one key's text or digest */

/* One extra key of a block as vLLM's events publish it (untagged). */
enum { KV_EVENT_KEY_TEXT = 1, KV_EVENT_KEY_DIGEST, KV_EVENT_KEY_MM };
struct kv_event_key {
	int kind;
	const char *p;      /* TEXT, MM (the identifier): UTF-8; DIGEST: bytes */
	size_t len;
	int64_t offset;     /* MM */
};

/* What a Seal said about one block, for vLLM's BlockStored fields lora_id,
 * lora_name and extra_keys; read during the call only, within the bounds
 * above (checked by the caller). */
struct kv_events_meta {
	const char *lora_name;  /* NULL or "": nil */
	uint64_t lora_id;       /* 0: nil */
	int has_keys;           /* 0: extra_keys left out of the event */
	const struct kv_event_key *keys;  /* the block's keys; none: nil */
	size_t nkeys;
};

/* kv_events_stored() with what the Seal said; meta NULL: nothing (nil
 * lora_id and lora_name, no extra_keys). The extra keys are published only
 * where the pool's token ids are (they carry the cache salt and what
 * identifies multimodal inputs); the LoRA always. */
void kv_events_stored_meta(struct kv_events *ev, uint32_t pool, const uint8_t *hash,
			   const uint8_t *parent, int medium, const uint32_t *tokens,
			   const struct kv_events_meta *meta);
void kv_events_removed(struct kv_events *ev, uint32_t pool, const uint8_t *hash, int medium);

/* Block i of Seal m (kvcached.proto) of pool (blocks of block_tokens
 * tokens) went into G1: its BlockStored, translated from the request. With
 * token ids the blocks of one Seal are one chain: block i's parent is block
 * i - 1, block 0's m->parent_hash. The LoRA and block i's extra keys go
 * with it. m was checked by the Seal handler first: hashes, token ids and
 * parent_hash of the right lengths, extra_keys one per block or none, at
 * most KV_EVENTS_KEYS_MAX keys a block, each a text, digest or mm of at
 * most KV_EVENTS_KEY_MAX bytes, lora_name at most KV_EVENTS_LORA_MAX. ev
 * NULL: nothing. */
struct Kvcached__Seal;
void kv_events_sealed(struct kv_events *ev, uint32_t pool, uint32_t block_tokens,
		      const struct Kvcached__Seal *m, size_t i);

/* Pool id registered without a model: its events are not published (no
 * router could match its topic), and it is counted (no_model). */
void kv_events_no_model(struct kv_events *ev, uint32_t pool);

/* Sends the queued batches when they are due (events_interval); once per
 * loop iteration. */
void kv_events_flush(struct kv_events *ev);

/* Zeroes *st when ev is NULL. */
void kv_events_stats(const struct kv_events *ev, struct kv_events_stats *st);

#endif
