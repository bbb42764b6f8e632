/* libkvcache: the client library of kvcached.
 *
 * An engine connects to the node's kvcached daemon, registers the KV layout it
 * uses as a pool, and then allocates, seals (publishes under a content hash),
 * looks up, forks, copies-on-write and releases KV blocks. Blocks live in
 * memory the daemon owns; the library maps it into this process, so
 * kvc_block_ptr() gives a pointer the engine reads and writes directly, and
 * every process of the same namespace sees the same bytes (zero copies).
 *
 * Conventions
 * - Every function that can fail returns 0 or a count on success and a
 *   negative error otherwise: -errno for a local or socket failure (-EPIPE,
 *   -ECONNRESET, -ENOMEM, ...) or one of the KVC_E* codes below for an error
 *   the daemon reported. kvc_strerror() names both; kvc_last_error() gives the
 *   daemon's own message for the last call on a connection.
 * - Output arrays are written only on success.
 * - Batched calls are all-or-nothing: on error nothing changed in the daemon.
 * - The library never prints and never aborts.
 *
 * Threads: a kvc_conn may be shared by threads; calls on it are serialized by
 * an internal mutex (one call in flight per connection - one request, or
 * kvc_lookup_many()'s pipelined batch; use one connection per thread for
 * parallelism). kvc_block_ptr() takes no lock.
 * kvc_last_error() answers for the calling thread's own calls.
 *
 * Deadlines: every call that talks to the daemon has one, timeout_ms from
 * its start (kvc_options.timeout_ms, kvc_set_timeout(); by default 60 s,
 * or $KVCACHE_TIMEOUT_MS at kvc_connect() time): the wait for another
 * thread's call on the same connection, the connect and Hello (of
 * kvc_connect() and of a reconnection), every request and its reply, the
 * segment fds that come with it. A call past its deadline returns
 * -ETIMEDOUT. One that had begun talking to the daemon drops the
 * connection first, as if the daemon had gone away (a late reply would be
 * taken for the next call's): the daemon releases everything it held once
 * it sees the close, handles from before are stale, and the next call
 * reconnects (kvc_restarts() below, with its backoff). A call that only
 * waited for another thread's leaves the connection as it was. kvc_close()
 * does not talk to the daemon and never waits.
 *
 * Handles: a kvc_block is an opaque 64-bit value (generation, pool, page and
 * slot). A handle is valid while this connection holds a reference on it;
 * once released, the daemon rejects it (KVC_ESTALE).
 */
#ifndef KVCACHE_H
#define KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Errors reported by the daemon: -(1000 + the protocol's ErrorCode). */
#define KVC_ERR_BASE 1000
#define KVC_EINVAL (-1001)     /* malformed argument */
#define KVC_ENOSPC (-1002)     /* pool full of held blocks, even after eviction */
#define KVC_ENOENT (-1003)     /* no such pool */
#define KVC_ESTALE (-1004)     /* stale, forged or foreign block handle */
#define KVC_EPERM (-1005)      /* not allowed for this peer */
#define KVC_EPROTO (-1006)     /* protocol violation; connection closed */
#define KVC_EVERSION (-1007)   /* no common protocol version */
#define KVC_EEXIST (-1008)     /* pool exists with another layout */
#define KVC_E2BIG (-1009)      /* batch larger than the daemon's max_batch */
#define KVC_EINTERNAL (-1010)  /* daemon bug */
#define KVC_ESTATE (-1011)     /* block in the wrong state (e.g. sealed twice) */
#define KVC_ESHUTDOWN (-1012)  /* daemon draining */
#define KVC_EIO (-1013)        /* a tier copy or disk I/O failed; nothing was lost */
#define KVC_ECONFIG (-1016)    /* reload: the daemon's configuration is invalid */
#define KVC_EACCES (-1017)     /* Hello: this uid/gid may not open that namespace */
#define KVC_EQUOTA (-1018)     /* the namespace's quota is full of blocks it holds */
#define KVC_EAGAIN (-1019)     /* the daemon is short of a resource for now: retry */

typedef struct kvc_conn kvc_conn;
typedef uint64_t kvc_block;

/* A block content hash: 32 bytes (XXH3-128 fills 16 and zeroes the rest). */
typedef struct kvc_hash {
	uint8_t b[32];
} kvc_hash;

enum kvc_hash_algo {
	KVC_HASH_SHA256 = 0,    /* default: prompts are adversarial input */
	KVC_HASH_XXH3_128 = 1,  /* opt-in, for trusted deployments */
};

struct kvc_options {
	const char *ns;           /* namespace (tenant, UTF-8); NULL or "" = the caller's own
	                           * "uid-<uid>" */
	const char *client_name;  /* shown by `kvctl clients`; NULL = program name; bytes
	                           * that are not UTF-8 are sent as '?' */
	/* cuda backend: blocks of each daemon device are mapped for the GPU
	 * they live on, found by its UUID (whatever CUDA_VISIBLE_DEVICES says),
	 * whatever context is current. 0 (the default): that alone.
	 * KVC_CUDA_DEVICE(n): CUDA device n of this process gets access too,
	 * for a worker that reads another GPU's blocks over peer access
	 * (without it, the call that maps them fails with -ENODEV). */
	int cuda_device;
	/* Each call's deadline in milliseconds (see Deadlines above): 0 = the
	 * library's default (60000, or $KVCACHE_TIMEOUT_MS), negative = none
	 * (a call waits for the daemon as long as it takes). */
	int timeout_ms;
};

#define KVC_CUDA_DEVICE(n) ((n) + 1)

/* Resolves the daemon socket path the way the daemon, kvctl and kvbench do:
 * $KVCACHED_SOCKET, else /run/kvcached/kvcached.sock for root, else
 * $XDG_RUNTIME_DIR/kvcached.sock, else /run/kvcached/kvcached.sock. Returns
 * 0, or -ENAMETOOLONG if buf is too small. */
int kvc_default_socket(char *buf, size_t len);

/* Connects and says Hello. path NULL = kvc_default_socket(). opt may be NULL.
 * On success *out owns the socket and every mapping; free with kvc_close().
 * KVC_EINVAL for a namespace that is not UTF-8 (or of 64 bytes or more);
 * KVC_ENOSPC when the daemon has 256 namespaces open and this is another;
 * -ETIMEDOUT when the daemon did not answer within opt->timeout_ms. */
int kvc_connect(const char *path, const struct kvc_options *opt, kvc_conn **out);

/* Sets the deadline of c's calls from now on, in milliseconds, as
 * kvc_options.timeout_ms (0: the default, negative: none); a call already
 * under way keeps its own. Any thread. Returns 0, or -EINVAL for c NULL. */
int kvc_set_timeout(kvc_conn *c, int timeout_ms);

/* Closes the connection and unmaps everything; the daemon releases every
 * reference the connection held (sealed blocks stay cached). NULL is fine.
 * Pointers from kvc_block_ptr() are invalid afterwards. */
void kvc_close(kvc_conn *c);

/* When the daemon dies or restarts, the call in flight fails (-EPIPE or
 * -ECONNRESET; -ETIMEDOUT for a daemon that stopped answering, see
 * Deadlines) and the next call reconnects: the same socket path, namespace
 * and client name, every pool registered again (the pool ids this connection
 * returned stay valid), the new daemon's segments mapped. At most one attempt
 * per interval (10 ms, doubling to 2 s); between attempts calls return -EPIPE
 * at once, with the reason in kvc_last_error() (an attempt that fails
 * returns -EPIPE, or -ETIMEDOUT when the call's deadline passed in it).
 * Everything held before is gone: block handles from before are stale
 * (KVC_ESTALE where the daemon sees them; do not pass them to
 * kvc_block_ptr()), swaps are unknown (KVC_ENOENT), and what was mapped
 * reads as zeros. An engine treats its cached blocks as
 * misses and carries on; the prefix cache of the new daemon (warm from its
 * disk tier after a restart) serves lookups again.
 *
 * kvc_restarts() counts the reconnections of c: compare it with the value
 * seen when a block table was filled to learn that its handles are gone. It
 * moves as a reconnection lets the old daemon's memory go (before its call
 * returns): a thread that reads zeros through a pointer from before and then
 * asks sees that it moved.
 * A connection broken by a protocol error does not reconnect; nor does any
 * when the environment has KVCACHE_RECONNECT=0 at kvc_connect() time. */
uint64_t kvc_restarts(kvc_conn *c);

struct kvc_pool_desc {
	const char *name;         /* pool name (UTF-8, no control characters); workers of one
	                           * model share it */
	uint32_t device;          /* device index (0 on the host backend) */
	uint64_t block_bytes;     /* bytes of one KV block, >= 4096 */
	uint32_t block_tokens;    /* tokens per block */
	const char *dtype;        /* e.g. "fp16"; must match to share a pool */
	const void *layout;       /* opaque layout description; must match */
	size_t layout_len;
};

/* Registers (or joins) a pool. Returns the pool id (>= 0) or an error;
 * KVC_EEXIST when the name exists with another layout; KVC_EINVAL when the
 * name, dtype or model is not UTF-8 (nothing is sent) or the daemon refuses
 * it (control characters, too long). */
int kvc_register_pool(kvc_conn *c, const struct kvc_pool_desc *d);

/* kvc_register_pool() naming the model the pool caches, for KV events: their
 * topic is kv@<node>@<model> (docs/events.md). model: at most 128 bytes, no
 * '@'; NULL or "" is kvc_register_pool() (the topic then names
 * "<namespace>/<pool name>"). The first registration of a pool sets it. */
int kvc_register_pool_model(kvc_conn *c, const struct kvc_pool_desc *d, const char *model);

/* Allocates n writable blocks (ref 1, held by this connection), evicting
 * cached blocks in LRU order if needed. Returns n or KVC_ENOSPC. */
int kvc_alloc(kvc_conn *c, int pool, uint32_t n, kvc_block *out);

/* Seals n full blocks under their hashes. out[i] is the block now held in
 * place of blocks[i]: the same handle, or, when the hash was already cached
 * (dedup), the existing block, and blocks[i] has been freed. out may alias
 * blocks. Returns n. */
int kvc_seal(kvc_conn *c, int pool, const kvc_block *blocks, const kvc_hash *hashes,
	     size_t n, kvc_block *out);

/* kvc_seal() that also gives the blocks' token ids, which KV events publish
 * (docs/events.md) so that a router such as llm-d's can index them: ntokens
 * is n * the pool's block_tokens (the ids of blocks[0], then blocks[1], ...)
 * or 0 (token_ids unused: kvc_seal()). With token ids the n blocks must be
 * one chain in order, and parent (NULL for a chain's head) is the hash of the
 * block before blocks[0]. A wrong ntokens fails the call with KVC_EINVAL and
 * seals nothing. Returns n. */
int kvc_seal_tokens(kvc_conn *c, int pool, const kvc_block *blocks, const kvc_hash *hashes,
		    size_t n, const kvc_hash *parent, const uint32_t *token_ids, size_t ntokens,
		    kvc_block *out);

/* What a worker may say about the blocks it seals, for the KV events'
 * BlockStored (docs/events.md): what vLLM's own BlockStored carries.
 *
 * One extra key of a block as vLLM's events publish it: untagged, in the
 * order the block was hashed with them (vllm/v1/core/kv_cache_utils.py
 * to_event_extra_keys): the LoRA name (text), one (identifier, offset) per
 * multimodal item (mm), the cache salt (text, first block only), the
 * prompt-embeds digest (bytes). */
enum kvc_event_key_kind {
	KVC_EVENT_KEY_TEXT = 1,   /* UTF-8 text: a LoRA name, a cache salt */
	KVC_EVENT_KEY_BYTES = 2,  /* bytes: a prompt-embeds digest */
	KVC_EVENT_KEY_MM = 3,     /* a multimodal item: identifier (UTF-8) and offset */
};

/* Bounds the daemon enforces (a Seal past one fails with KVC_EINVAL and
 * seals nothing). */
#define KVC_LORA_NAME_MAX 256    /* bytes of lora_name */
#define KVC_EVENT_KEYS_MAX 64    /* extra keys of one block */
#define KVC_EVENT_KEY_MAX 1024   /* bytes of one key's data */

struct kvc_event_key {
	int kind;                 /* enum kvc_event_key_kind */
	const void *data;         /* TEXT, MM's identifier: UTF-8, no NUL; BYTES: bytes */
	size_t len;               /* bytes at data, at most KVC_EVENT_KEY_MAX */
	int64_t offset;           /* MM: the item's first token minus the block's first
	                           * token (negative for an item begun in an earlier block) */
};

/* Read during the call only. Every member may be NULL/0. */
struct kvc_seal_info {
	const kvc_hash *parent;   /* as kvc_seal_tokens() */
	const uint32_t *token_ids;
	size_t ntokens;
	const char *lora_name;    /* vLLM's lora_request.name; NULL or "" = none (nil) */
	uint64_t lora_id;         /* vLLM's lora_request.adapter_id; 0 = none (nil) */
	/* Per block, how many keys of keys[] it has (0: none, published as
	 * nil), blocks[0]'s first; NULL: the events leave extra_keys out (as
	 * kvc_seal_tokens() does). keys: the blocks' keys, concatenated. */
	const uint32_t *nkeys;
	const struct kvc_event_key *keys;
};

/* kvc_seal_tokens() that also says, for the events, the LoRA adapter and the
 * per-block extra keys the blocks were hashed with; the events then carry
 * vLLM's lora_id, lora_name and extra_keys as vLLM's own BlockStored does
 * (the extra keys only where token ids may be published, docs/events.md).
 * info NULL is kvc_seal(). KVC_EINVAL, nothing sealed: a bad ntokens, a
 * lora_name or key text that is not UTF-8 or holds a NUL, an unknown kind
 * (nothing is sent), or past the bounds above (the daemon refuses it).
 * Returns n. */
int kvc_seal_events(kvc_conn *c, int pool, const kvc_block *blocks, const kvc_hash *hashes,
		    size_t n, const struct kvc_seal_info *info, kvc_block *out);

/* Looks up a hash chain (head first) and returns the length k of the longest
 * cached prefix; out[0..k) receive the blocks, each with a reference taken. */
int kvc_lookup(kvc_conn *c, int pool, const kvc_hash *chain, size_t n, kvc_block *out);

/* Where a lookup found each block (the protocol's Tier). */
enum kvc_tier {
	KVC_TIER_G1 = 0,        /* in device memory (the shared pool) already */
	KVC_TIER_G2 = 1,        /* promoted from the host tier for this lookup */
	KVC_TIER_G3 = 2,        /* promoted from the disk tier */
	KVC_TIER_G4 = 3,        /* fetched from the cluster tier (another node's) */
	KVC_TIER_UNKNOWN = 255, /* a daemon that does not say */
};

/* kvc_lookup() that also says where each block came from: tiers[i] (enum
 * kvc_tier) for out[i], written for i < the returned k. tiers NULL is
 * kvc_lookup(). */
int kvc_lookup_tiers(kvc_conn *c, int pool, const kvc_hash *chain, size_t n, kvc_block *out,
		     uint8_t *tiers);

/* Several lookups in one call, pipelined: the requests are written while the
 * replies are read, so a batch costs a few system calls instead of three a
 * chain, and any number of chains fits through the sockets (the call never
 * waits for room to write while replies are unread, so neither side blocks on
 * a full socket). Chain i is the n[i] hashes (each at most the daemon's batch
 * limit) that start at chains + n[0] + ... + n[i-1]; each is looked up as
 * kvc_lookup_tiers() does, in order. found[i] is chain i's cached prefix
 * length k_i, its blocks at out[o_i .. o_i + k_i) with o_i = n[0] + ... +
 * n[i-1] (so out, like tiers, has room for the sum of n), each with a
 * reference taken; or a negative error of its own (the daemon refused that
 * lookup: nothing is taken for it, and the others stand). tiers NULL: none.
 * One deadline covers the whole batch. Returns nchains, or an error of the
 * whole call, with nothing taken and found untouched: KVC_EINVAL, KVC_ENOENT,
 * KVC_E2BIG (a chain over the batch limit; nothing sent), or what any call
 * returns when the daemon is gone or past the deadline (the connection is
 * dropped, as for any call). */
int kvc_lookup_many(kvc_conn *c, int pool, const kvc_hash *chains, const size_t *n,
		    size_t nchains, kvc_block *out, uint8_t *tiers, int *found);

/* Drops one reference on each block. Sealed blocks whose count reaches 0 stay
 * cached; unsealed ones are freed. List a chain head first: the daemon ages
 * its tail first. Returns 0. */
int kvc_release(kvc_conn *c, const kvc_block *blocks, size_t n);

/* Takes another reference on each block (beam search, parallel sampling).
 * out[i] == blocks[i]; each needs its own kvc_release(). Returns n. */
int kvc_fork(kvc_conn *c, const kvc_block *blocks, size_t n, kvc_block *out);

/* Copy-on-write: for each block, a writable block only this connection holds
 * with the same contents. A block already writable with a single reference is
 * returned as is; otherwise a new block is allocated, the bytes copied and the
 * reference on blocks[i] dropped. Returns n or KVC_ENOSPC. */
int kvc_cow(kvc_conn *c, const kvc_block *blocks, size_t n, kvc_block *out);

/* Swaps a sequence out of the device tier (preemption by swap): the daemon
 * copies the n blocks (held by this connection, writable or sealed, all of
 * one pool) into its host tier (past its free room, through it onto the
 * disk tier) and drops this connection's references on each when its copy
 * ends; the handles must not be used again. It returns at
 * once; a kvc_alloc() or kvc_cow() of this namespace that needs the room
 * waits for the copy (so an engine swaps one sequence out and allocates for
 * another right away). *swap names the sequence for kvc_swap_in(). Returns
 * 0, KVC_ENOSPC when the host and disk tiers cannot hold it (or no host
 * tier is configured). When the host tier is all other swaps, it waits
 * while the oldest of them is moved to the disk tier.
 * Swapped data is freed when the connection closes. */
int kvc_swap_out(kvc_conn *c, const kvc_block *blocks, size_t n, uint64_t *swap);

/* Brings a swapped sequence back into new writable blocks with the same
 * bytes, in the order given to kvc_swap_out(); out needs room for as many.
 * Waits for the copies. Returns the number of blocks, KVC_ENOENT for an
 * unknown swap, KVC_ENOSPC when the pool cannot take them now (the swap is
 * kept: try again later), KVC_EIO when a copy failed (kept too). */
int kvc_swap_in(kvc_conn *c, uint64_t swap, kvc_block *out, size_t max);

/* The block's address in this process, or NULL for a handle whose pool or
 * segment this connection has not seen. Valid until kvc_close(). Lock-free.
 * With a daemon on the cuda backend it is a CUDA device pointer, readable and
 * writable from the GPU the block lives on (and from kvc_options.cuda_device,
 * if named), whatever context is current; finish writing a block (synchronize
 * the stream) before sealing or copying it, since other processes and the
 * daemon read it from then on. */
void *kvc_block_ptr(kvc_conn *c, kvc_block b);

/* Bytes of one block of the pool, or 0 for an unknown pool. */
uint64_t kvc_pool_block_bytes(kvc_conn *c, int pool);

/* The daemon's message for the calling thread's last failed call on c (""
 * if none): threads sharing c each get their own call's. Valid until this
 * thread's next call into the library. (When the thread's last call was on
 * another connection, the last message on c, whichever thread's.) */
const char *kvc_last_error(kvc_conn *c);

/* A static description of an error code returned by this library. */
const char *kvc_strerror(int err);

/* --- Block hashes ---------------------------------------------------------
 * h_i = H(h_{i-1} || u32le(ntokens) || ntokens x u32le(token) || u64le(lora_id)
 *         || u32le(salt_len) || salt || u32le(mm_len) || mm)
 * with h_{-1} = the seed: SHA-256 of the 18 ASCII bytes "kvcached/prefix/v1".
 * H is SHA-256 (32 bytes) or XXH3-128 (16 bytes, canonical big-endian form,
 * then 16 zero bytes); the parent always enters as its full 32 bytes. */
struct kvc_hash_extra {
	uint64_t lora_id;         /* 0 = none */
	const void *salt;         /* cache salt (per-tenant isolation), may be NULL */
	size_t salt_len;
	const void *mm;           /* multimodal input hash, may be NULL */
	size_t mm_len;
};

/* The fixed parent of the first block. */
void kvc_hash_seed(kvc_hash *out);

/* Hashes one block. parent NULL = the seed; extra NULL = no extra keys.
 * Returns 0 or -EINVAL (unknown algo). */
int kvc_hash_block(enum kvc_hash_algo algo, const kvc_hash *parent, const uint32_t *tokens,
		   size_t ntokens, const struct kvc_hash_extra *extra, kvc_hash *out);

/* Hashes the full blocks of a token sequence as a chain: block i covers
 * tokens [i*block_tokens, (i+1)*block_tokens). Writes at most max hashes and
 * returns how many (the partial last block is not hashed), or -EINVAL. */
int kvc_hash_chain(enum kvc_hash_algo algo, const uint32_t *tokens, size_t ntokens,
		   uint32_t block_tokens, const struct kvc_hash_extra *extra, kvc_hash *out,
		   size_t max);

/* --- vLLM-compatible block hashes -----------------------------------------
 * Opt-in: the hashes vLLM computes with prefix_caching_hash_algo =
 * "sha256_cbor" (vllm/v1/core/kv_cache_utils.py hash_block_tokens,
 * vllm/utils/hashing.py sha256_cbor), so that KV events (docs/events.md) name
 * blocks as a vLLM engine's would and a router that indexes vLLM engines
 * understands kvcached's workers too. Checked against vLLM 0.33.0's own code
 * (tests/test_vllm_interop.py):
 *   h_i = SHA-256(canonical CBOR of [h_{i-1}, [token_0, ...], extra_keys])
 *   h_{-1} = NONE_HASH = SHA-256(canonical CBOR of the text seed)
 *   extra_keys = null, or an array of tagged keys, in vLLM's order:
 *     ["lora", lora_name, lora_path]
 *     ["mm", identifier, item offset - block start] per multimodal item
 *         the block overlaps
 *     ["cache_salt", salt]                    first block only
 *     ["prompt_embeds", SHA-256 of the block's embeddings]
 * The seed: vLLM >= 0.29 uses PYTHONHASHSEED when it is set, else the fixed
 * text "vllm-none-hash" (KVC_VLLM_DEFAULT_SEED; what a NULL seed means here);
 * vLLM <= 0.28 drew it at random per process unless PYTHONHASHSEED was set.
 * These hashes are SHA-256, as collision-resistant as KVC_HASH_SHA256; pass
 * them to kvc_seal()/kvc_lookup() like any other. Strings are UTF-8. */
#define KVC_VLLM_DEFAULT_SEED "vllm-none-hash"

/* One multimodal item of the request (vLLM's mm_feature): its identifier
 * and where its placeholder tokens are (mm_position). */
struct kvc_vllm_mm {
	const char *identifier;
	uint64_t offset;              /* its first token in the sequence */
	uint64_t length;              /* its number of tokens */
};

/* What vLLM >= 0.31 hashes besides the tokens; all may be NULL/0. The
 * pointers are read during the call only. */
struct kvc_vllm_extra {
	const char *lora_name;        /* the LoRA adapter's name, NULL = none */
	const char *lora_path;        /* its path; required with lora_name */
	const char *cache_salt;       /* NULL or "" = none; first block only */
	const struct kvc_vllm_mm *mm; /* sorted by offset, as vLLM keeps them */
	size_t nmm;
	/* Per block, the SHA-256 of its prompt embeddings (vLLM hashes the
	 * tensor's bytes); NULL = the request has none. */
	const kvc_hash *prompt_embeds;
	size_t nprompt_embeds;
};

/* NONE_HASH for a seed: PYTHONHASHSEED's value, or NULL for vLLM's default
 * (KVC_VLLM_DEFAULT_SEED). Returns 0, -EINVAL or -ENOMEM. */
int kvc_hash_vllm_seed(const char *pythonhashseed, kvc_hash *out);

/* One block, tokens [start, start + ntokens) of the request: parent is the
 * previous block's hash, or NONE_HASH for the first (start 0, the block that
 * carries the cache salt). With prompt_embeds, start is a multiple of
 * ntokens and the block's digest is prompt_embeds[start / ntokens]. extra
 * may be NULL. Returns 0, -EINVAL or -ENOMEM. */
int kvc_hash_vllm_block_extra(const kvc_hash *parent, const uint32_t *tokens, size_t ntokens,
			      size_t start, const struct kvc_vllm_extra *extra, kvc_hash *out);

/* The full blocks of a token sequence as a chain, as kvc_hash_chain() does
 * (pythonhashseed as for kvc_hash_vllm_seed): writes at most max hashes and
 * returns how many, or -EINVAL (also: fewer prompt_embeds digests than
 * blocks) or -ENOMEM. */
int kvc_hash_vllm_chain_extra(const char *pythonhashseed, const uint32_t *tokens,
			      size_t ntokens, uint32_t block_tokens,
			      const struct kvc_vllm_extra *extra, kvc_hash *out, size_t max);

/* Compatibility with vLLM 0.30 and earlier, which hashed the extra keys
 * untagged: extra_keys = null, or [lora_name?, cache_salt? (first block
 * only)]. Without keys (keys NULL) the hashes are the same as the _extra
 * functions'. A NULL seed is KVC_VLLM_DEFAULT_SEED, as above. */
struct kvc_vllm_keys {
	const char *lora_name;    /* the LoRA adapter's name, NULL = none */
	const char *cache_salt;   /* NULL or "" = none; hashed into the first block */
};

/* One block; first says whether it carries the cache salt. keys may be
 * NULL. Returns 0, -EINVAL or -ENOMEM. */
int kvc_hash_vllm_block(const kvc_hash *parent, const uint32_t *tokens, size_t ntokens,
			const struct kvc_vllm_keys *keys, int first, kvc_hash *out);

/* A chain, as kvc_hash_vllm_chain_extra(). */
int kvc_hash_vllm_chain(const char *pythonhashseed, const uint32_t *tokens, size_t ntokens,
			uint32_t block_tokens, const struct kvc_vllm_keys *keys, kvc_hash *out,
			size_t max);

#ifdef __cplusplus
}
#endif
#endif
