/* kvdemo: cross-process prefix reuse through kvcached, played by two worker
 * processes of a pretend Llama-3-8B engine.
 *
 *   writer  hashes a 512-token system prompt, finds it missing, allocates
 *           its KV blocks, writes them, seals them under their hashes,
 *           releases them (they stay cached in the daemon) and exits.
 *   reader  a new process with the same system prompt and its own user
 *           suffix: looks the chain up, gets exactly the shared blocks,
 *           checks every byte through its own mapping (zero copies), and
 *           allocates and seals blocks for the part where it diverges.
 *
 * The KV layout: one block per layer per 16 tokens, so a 16-token slice of
 * the prompt is 32 blocks of 16 tokens * 2 (K,V) * 8 kv heads * 128 dims *
 * 2 bytes = 64 KiB. Each layer's blocks form their own hash chain: the layer
 * enters the hash as an extra key (the cache salt "layer=NN"), as anything
 * that changes the KV contents must. The chain sent to the daemon is
 * slice-major: [slice 0 layer 0..31, slice 1 layer 0..31, ...], so the
 * longest cached prefix is always a whole number of slices when the writer
 * finished.
 *
 * Block contents are a splitmix64 stream seeded from the block's hash and
 * layer, so any process can recompute (and check) what a block must hold.
 *
 * Exit status: 0 when the reader found and verified every shared block, 1
 * otherwise. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvcache.h"

#define LAYERS 32u
#define KV_HEADS 8u
#define HEAD_DIM 128u
#define BLOCK_TOKENS 16u
#define BLOCK_BYTES ((uint64_t)BLOCK_TOKENS * 2 * KV_HEADS * HEAD_DIM * 2)  /* 65536 */
#define SYS_SLICES 32u                     /* system prompt: 32 x 16 = 512 tokens */
#define SYS_TOKENS (SYS_SLICES * BLOCK_TOKENS)
#define USER_TOKENS 87u                    /* 5 full slices and 7 tokens */
#define VOCAB 128256u                      /* Llama 3 */
#define BATCH 512u                         /* blocks per request */

/* Writer exit codes, for the parent. */
#define WRITER_WROTE 0
#define WRITER_CACHED 2
#define WRITER_FAILED 1

static const char pool_name[] = "llama-3-8b";
static const char layout[] = "layers=32 kv_heads=8 head_dim=128";

static const char *sock_path;
static char sock_buf[108];
static char role[32];

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void say(const char *fmt, ...)
{
	va_list ap;

	printf("%s ", role);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

static int fail(kvc_conn *c, const char *what, int err)
{
	const char *msg = c ? kvc_last_error(c) : "";

	say("error: %s: %s%s%s", what, kvc_strerror(err), msg[0] ? ": " : "", msg);
	return -1;
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t block_seed(const kvc_hash *h, uint32_t layer)
{
	uint64_t s;

	memcpy(&s, h->b, sizeof(s));
	return s ^ ((uint64_t)layer << 56 | layer);
}

static void fill_block(void *p, const kvc_hash *h, uint32_t layer)
{
	uint64_t s = block_seed(h, layer), *w = p;
	size_t i;

	for (i = 0; i < BLOCK_BYTES / 8; i++)
		w[i] = splitmix64(&s);
}

/* Returns the offset of the first wrong byte, or BLOCK_BYTES when all match. */
static size_t check_block(const void *p, const kvc_hash *h, uint32_t layer)
{
	uint64_t s = block_seed(h, layer);
	const uint64_t *w = p;
	size_t i;

	for (i = 0; i < BLOCK_BYTES / 8; i++)
		if (w[i] != splitmix64(&s))
			return i * 8;
	return BLOCK_BYTES;
}

/* The prompt: the shared system prompt, then n_user tokens of this user's
 * question drawn from user_seed. Returns a malloc'ed array. */
static uint32_t *make_prompt(size_t n_user, uint64_t user_seed)
{
	uint32_t *t = malloc((SYS_TOKENS + n_user + 1) * sizeof(*t));
	uint64_t s = 0x5eed5eedull;
	size_t i;

	if (!t)
		return NULL;
	for (i = 0; i < SYS_TOKENS; i++)
		t[i] = (uint32_t)(splitmix64(&s) % VOCAB);
	for (i = 0; i < n_user; i++)
		t[SYS_TOKENS + i] = (uint32_t)(splitmix64(&user_seed) % VOCAB);
	return t;
}

/* Hashes the prompt's full slices, one chain per layer, into out (slice-major:
 * out[slice * LAYERS + layer]). Returns the number of full slices or -1. */
static int hash_prompt(const uint32_t *tokens, size_t ntokens, kvc_hash *out)
{
	size_t slices = ntokens / BLOCK_TOKENS, s;
	kvc_hash *chain = calloc(slices ? slices : 1, sizeof(*chain));
	uint32_t l;
	int n = -1;

	if (!chain)
		return -1;
	for (l = 0; l < LAYERS; l++) {
		char salt[16];
		struct kvc_hash_extra ex = { .salt = salt };

		ex.salt_len = (size_t)snprintf(salt, sizeof(salt), "layer=%02u", l);
		n = kvc_hash_chain(KVC_HASH_SHA256, tokens, ntokens, BLOCK_TOKENS, &ex, chain,
				   slices);
		if (n < 0) {
			fail(NULL, "hashing the prompt", n);
			break;
		}
		for (s = 0; s < (size_t)n; s++)
			out[s * LAYERS + l] = chain[s];
	}
	free(chain);
	return n;
}

static int connect_pool(kvc_conn **c, int *pool)
{
	struct kvc_options opt = { .client_name = role };
	struct kvc_pool_desc d = {
		.name = pool_name,
		.device = 0,
		.block_bytes = BLOCK_BYTES,
		.block_tokens = BLOCK_TOKENS,
		.dtype = "fp16",
		.layout = layout,
		.layout_len = sizeof(layout) - 1,
	};
	int r = kvc_connect(sock_path, &opt, c);

	if (r < 0) {
		*c = NULL;
		fail(NULL, "connecting to kvcached", r);
		if (r == -ENOENT || r == -ECONNREFUSED)
			say("is kvcached running on %s? (scripts/demo starts one)", sock_path);
		return -1;
	}
	r = kvc_register_pool(*c, &d);
	if (r < 0)
		return fail(*c, "registering the pool", r);
	*pool = r;
	return 0;
}

/* The batched calls, cut to BATCH blocks per request so that any daemon's
 * max_batch does. Each returns 0 or -1 (reported). */
static int lookup(kvc_conn *c, int pool, const kvc_hash *h, size_t n, kvc_block *out,
		  size_t *found)
{
	size_t k = 0;

	while (k < n) {
		size_t m = n - k < BATCH ? n - k : BATCH;
		int r = kvc_lookup(c, pool, h + k, m, out + k);

		if (r < 0)
			return fail(c, "lookup", r);
		k += (size_t)r;
		if ((size_t)r < m)
			break;
	}
	*found = k;
	return 0;
}

static int alloc(kvc_conn *c, int pool, size_t n, kvc_block *out)
{
	size_t k;

	for (k = 0; k < n; k += BATCH) {
		uint32_t m = (uint32_t)(n - k < BATCH ? n - k : BATCH);
		int r = kvc_alloc(c, pool, m, out + k);

		if (r < 0) {
			if (k)
				kvc_release(c, out, k);
			return fail(c, "alloc", r);
		}
	}
	return 0;
}

/* Seals n blocks; *dedup counts those the daemon swapped for an existing one. */
static int seal(kvc_conn *c, int pool, kvc_block *b, const kvc_hash *h, size_t n,
		size_t *dedup)
{
	size_t k, i;

	*dedup = 0;
	for (k = 0; k < n; k += BATCH) {
		size_t m = n - k < BATCH ? n - k : BATCH;
		kvc_block out[BATCH];
		int r = kvc_seal(c, pool, b + k, h + k, m, out);

		if (r < 0)
			return fail(c, "seal", r);
		for (i = 0; i < m; i++) {
			*dedup += out[i] != b[k + i];
			b[k + i] = out[i];
		}
	}
	return 0;
}

static int release(kvc_conn *c, const kvc_block *b, size_t n)
{
	size_t k;

	for (k = 0; k < n; k += BATCH) {
		int r = kvc_release(c, b + k, n - k < BATCH ? n - k : BATCH);

		if (r < 0)
			return fail(c, "release", r);
	}
	return 0;
}

/* Writes blocks [from, n) of the chain (b[i] holds hash h[i]). */
static int write_blocks(kvc_conn *c, const kvc_block *b, const kvc_hash *h, size_t from,
			size_t n)
{
	size_t i;

	for (i = from; i < n; i++) {
		void *p = kvc_block_ptr(c, b[i]);

		if (!p) {
			say("error: block %#" PRIx64 " has no address in this process", b[i]);
			return -1;
		}
		fill_block(p, &h[i], (uint32_t)(i % LAYERS));
	}
	return 0;
}

static const char *mib(uint64_t bytes, char *buf, size_t len)
{
	snprintf(buf, len, "%.0f MiB", bytes / 1048576.0);
	return buf;
}

static int writer(void)
{
	size_t n = (size_t)SYS_SLICES * LAYERS, found = 0, dedup = 0;
	kvc_hash *h = calloc(n, sizeof(*h));
	kvc_block *b = calloc(n, sizeof(*b));
	uint32_t *tokens = make_prompt(0, 0);
	kvc_conn *c = NULL;
	int pool, rc = WRITER_FAILED;
	char m1[32];
	double t0;

	snprintf(role, sizeof(role), "[writer %d]", (int)getpid());
	if (!h || !b || !tokens || connect_pool(&c, &pool) < 0 ||
	    hash_prompt(tokens, SYS_TOKENS, h) != (int)SYS_SLICES)
		goto out;
	say("system prompt: %u tokens = %u slices x %u layers = %zu blocks (%s)", SYS_TOKENS,
	    SYS_SLICES, LAYERS, n, mib(n * BLOCK_BYTES, m1, sizeof(m1)));
	if (lookup(c, pool, h, n, b, &found) < 0)
		goto out;
	if (found == n) {
		say("lookup: all %zu blocks already cached by an earlier run: nothing to write",
		    n);
		rc = release(c, b, n) < 0 ? WRITER_FAILED : WRITER_CACHED;
		goto out;
	}
	if (found)
		say("lookup: %zu of %zu blocks cached; computing the other %zu", found, n,
		    n - found);
	else
		say("lookup: 0 of %zu blocks cached (a miss: nobody computed it yet)", n);
	if (alloc(c, pool, n - found, b + found) < 0)
		goto out_release_found;
	t0 = now_ms();
	if (write_blocks(c, b, h, found, n) < 0)
		goto out_release_all;
	say("allocated %zu blocks, wrote %s of KV into them in %.1f ms", n - found,
	    mib((n - found) * BLOCK_BYTES, m1, sizeof(m1)), now_ms() - t0);
	if (seal(c, pool, b + found, h + found, n - found, &dedup) < 0)
		goto out_release_all;
	say("sealed %zu blocks under their SHA-256 chain hashes (%zu deduplicated)", n - found,
	    dedup);
	if (release(c, b, n) < 0)
		goto out;
	say("released them; exiting (the blocks stay cached in the daemon)");
	rc = WRITER_WROTE;
	goto out;
out_release_all:
	release(c, b + found, n - found);
out_release_found:
	release(c, b, found);
out:
	kvc_close(c);
	free(h);
	free(b);
	free(tokens);
	return rc;
}

static int reader(pid_t writer_pid, int writer_rc)
{
	size_t ntok = SYS_TOKENS + USER_TOKENS;
	size_t slices = ntok / BLOCK_TOKENS, tail = ntok % BLOCK_TOKENS;
	size_t n = slices * LAYERS, shared = (size_t)SYS_SLICES * LAYERS;
	size_t n_new = (slices - SYS_SLICES + (tail ? 1 : 0)) * LAYERS, n_seal;
	size_t found = 0, dedup = 0, i, bad = 0;
	kvc_hash *h = calloc(n, sizeof(*h));
	kvc_block *b = calloc(n + LAYERS, sizeof(*b));
	uint32_t *tokens = make_prompt(USER_TOKENS, (uint64_t)getpid() << 32 ^ (uint64_t)time(NULL));
	kvc_conn *c = NULL;
	int pool, rc = 1;
	char m1[32];
	double t0;

	snprintf(role, sizeof(role), "[reader %d]", (int)getpid());
	if (!h || !b || !tokens || connect_pool(&c, &pool) < 0 ||
	    hash_prompt(tokens, ntok, h) != (int)slices)
		goto out;
	say("prompt: the same %u-token system prompt + its own %u-token question", SYS_TOKENS,
	    USER_TOKENS);
	say("%zu full slices (+%zu tokens) x %u layers = %zu blocks to look up", slices, tail,
	    LAYERS, n);
	if (lookup(c, pool, h, n, b, &found) < 0)
		goto out;
	say("lookup: %zu hits, %zu misses (%zu of %zu slices cached)", found, n - found,
	    found / LAYERS, slices);
	if (found != shared) {
		say("error: expected exactly the %zu shared blocks of the system prompt", shared);
		release(c, b, found);
		goto out;
	}

	t0 = now_ms();
	for (i = 0; i < found; i++) {
		const void *p = kvc_block_ptr(c, b[i]);
		size_t off;

		if (!p) {
			say("error: block %#" PRIx64 " has no address in this process", b[i]);
			bad++;
			continue;
		}
		off = check_block(p, &h[i], (uint32_t)(i % LAYERS));
		if (off != BLOCK_BYTES && bad++ < 3)
			say("error: block %zu (slice %zu layer %zu) differs at byte %zu", i,
			    i / LAYERS, i % LAYERS, off);
	}
	if (bad) {
		say("error: %zu of %zu blocks hold the wrong bytes", bad, found);
		release(c, b, found);
		goto out;
	}
	if (writer_rc == WRITER_WROTE)
		say("verified %" PRIu64 " bytes written by pid %d (own mapping, no copy, %.1f ms)",
		    (uint64_t)found * BLOCK_BYTES, (int)writer_pid, now_ms() - t0);
	else
		say("verified %" PRIu64 " bytes written by an earlier run (own mapping, no copy, "
		    "%.1f ms)", (uint64_t)found * BLOCK_BYTES, now_ms() - t0);

	/* Prefill of the diverging part: its full slices get sealed, the
	 * partial last slice stays writable until it fills up. */
	if (alloc(c, pool, n_new, b + found) < 0) {
		release(c, b, found);
		goto out;
	}
	n_seal = n - found;
	if (write_blocks(c, b, h, found, n) < 0 ||
	    seal(c, pool, b + found, h + found, n_seal, &dedup) < 0) {
		release(c, b, found + n_new);
		goto out;
	}
	say("its own part: allocated %zu blocks (%s), wrote and sealed the %zu full ones", n_new,
	    mib(n_new * BLOCK_BYTES, m1, sizeof(m1)), n_seal);
	if (release(c, b, found + n_new) < 0)
		goto out;
	say("released %zu blocks; exiting", found + n_new);
	rc = 0;
out:
	kvc_close(c);
	free(h);
	free(b);
	free(tokens);
	return rc;
}

/* Forks fn's process and waits for it. Returns its exit status or -1. */
static int run_child(int (*fn)(pid_t, int), pid_t arg_pid, int arg_rc, pid_t *pid)
{
	int st;

	fflush(stdout);
	*pid = fork();
	if (*pid < 0) {
		perror("kvdemo: fork");
		return -1;
	}
	if (*pid == 0)
		_exit(fn(arg_pid, arg_rc));
	while (waitpid(*pid, &st, 0) < 0)
		if (errno != EINTR) {
			perror("kvdemo: waitpid");
			return -1;
		}
	if (WIFSIGNALED(st)) {
		fprintf(stderr, "kvdemo: process %d killed by signal %d\n", (int)*pid,
			WTERMSIG(st));
		return -1;
	}
	return WEXITSTATUS(st);
}

static int writer_main(pid_t p, int r)
{
	(void)p;
	(void)r;
	return writer();
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: kvdemo [--socket PATH]\n"
		"Shows cross-process prefix reuse through a running kvcached: a writer\n"
		"process computes and seals the KV blocks of a system prompt, then a\n"
		"reader process with the same prompt finds and verifies them.\n\n"
		"  -s, --socket PATH  the daemon's socket (default: $KVCACHED_SOCKET, else\n"
		"                     /run/kvcached/kvcached.sock for root, else\n"
		"                     $XDG_RUNTIME_DIR/kvcached.sock)\n"
		"  -h, --help         this text\n\n"
		"Exit status: 0 when the reader verified every shared block, 1 otherwise.\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	pid_t wpid, rpid;
	kvc_conn *c;
	int o, pool, wrc, rrc;

	while ((o = getopt_long(argc, argv, "s:h", opts, NULL)) != -1) {
		switch (o) {
		case 's':
			sock_path = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvdemo: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	if (!sock_path) {
		if (kvc_default_socket(sock_buf, sizeof(sock_buf)) < 0) {
			fprintf(stderr, "kvdemo: the default socket path is too long\n");
			return 1;
		}
		sock_path = sock_buf;
	}
	snprintf(role, sizeof(role), "[kvdemo %d]", (int)getpid());
	say("daemon socket %s", sock_path);
	if (connect_pool(&c, &pool) < 0) {
		kvc_close(c);
		return 1;
	}
	kvc_close(c);
	say("pool \"%s\" (id %d): fp16, %u tokens per block, one block per layer: %" PRIu64
	    " bytes", pool_name, pool, BLOCK_TOKENS, BLOCK_BYTES);
	say("layout \"%s\"", layout);

	wrc = run_child(writer_main, 0, 0, &wpid);
	if (wrc != WRITER_WROTE && wrc != WRITER_CACHED) {
		say("FAILED: the writer (pid %d) failed", (int)wpid);
		return 1;
	}
	rrc = run_child(reader, wpid, wrc, &rpid);
	if (rrc != 0) {
		say("FAILED: the reader (pid %d) did not get the shared prefix intact", (int)rpid);
		return 1;
	}
	if (wrc == WRITER_WROTE)
		say("OK: reader pid %d reused the %u x %u blocks (%" PRIu64 " MiB) that writer pid %d "
		    "computed, with zero copies", (int)rpid, SYS_SLICES, LAYERS,
		    (uint64_t)SYS_SLICES * LAYERS * BLOCK_BYTES >> 20, (int)wpid);
	else
		say("OK: reader pid %d reused the %u x %u blocks (%" PRIu64 " MiB) cached by an "
		    "earlier run, with zero copies", (int)rpid, SYS_SLICES, LAYERS,
		    (uint64_t)SYS_SLICES * LAYERS * BLOCK_BYTES >> 20);
	return 0;
}
