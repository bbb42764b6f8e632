/* kvctl events (follows the KV-event stream, docs/events.md) and kvctl dump
 * (what the stream should add up to: every hash of the prefix index with its
 * tiers). */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvconfig.h"
#include "kvctl.h"
#include "kvtext.h"

static void hex(char *out, const uint8_t *h, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", h[i]);
}

/* ---- dump ---- */

int cmd_dump(kvc_conn *c, const struct args *a)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Dump m = KVCACHED__DUMP__INIT;
	struct json j = { 0 };
	uint64_t total = 0;

	req.op_case = KVCACHED__REQUEST__OP_DUMP;
	req.dump = &m;
	if (a->fmt == FMT_JSON)
		json_open(&j, '[');
	for (;;) {
		Kvcached__Response *resp = call(c, &req, KVCACHED__RESPONSE__RESULT_DUMP, "dump");
		const Kvcached__DumpReply *r;
		size_t i;

		if (!resp)
			return 1;
		r = resp->dump;
		for (i = 0; i < r->n_entries; i++) {
			const Kvcached__DumpEntry *e = r->entries[i];
			const char *tier = (unsigned)e->tier < 3 ? tier_names[e->tier] : "?";
			char h[65] = "";

			if (e->hash.len == 32)
				hex(h, e->hash.data, 32);
			if (a->fmt == FMT_JSON) {
				json_open(&j, '{');
				json_u64(&j, "pool", e->pool_id);
				json_str(&j, "tier", tier);
				json_str(&j, "hash", h);
				json_close(&j, '}');
			} else {
				printf("%" PRIu32 " %s %s\n", e->pool_id, tier, h);
			}
			total++;
		}
		m.first = r->next;
		if (!r->more) {
			kvcached__response__free_unpacked(resp, NULL);
			break;
		}
		kvcached__response__free_unpacked(resp, NULL);
	}
	if (a->fmt == FMT_JSON)
		json_close(&j, ']');
	return 0;
}

#if !KV_HAVE_EVENTS

int cmd_events(kvc_conn *c, const struct args *a)
{
	(void)c;
	(void)a;
	fputs("kvctl: events: this kvctl was built without KV events (libzmq, msgpack-c)\n",
	      stderr);
	return 1;
}

#else

#include <msgpack.h>
#include <zmq.h>

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

/* The value under key in map o, or NULL. */
static const msgpack_object *field(const msgpack_object *o, const char *key)
{
	uint32_t i;
	size_t n = strlen(key);

	if (o->type != MSGPACK_OBJECT_MAP)
		return NULL;
	for (i = 0; i < o->via.map.size; i++) {
		const msgpack_object_kv *kv = &o->via.map.ptr[i];

		if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == n &&
		    !memcmp(kv->key.via.str.ptr, key, n))
			return &kv->val;
	}
	return NULL;
}

static void str_of(const msgpack_object *o, char *out, size_t len)
{
	if (o && o->type == MSGPACK_OBJECT_STR)
		snprintf(out, len, "%.*s", (int)o->via.str.size, o->via.str.ptr);
	else
		snprintf(out, len, "-");
}

/* A hash as text: 12 hex digits of bytes (the first 6) or the integer. */
static void hash_of(const msgpack_object *o, char *out, size_t len, int full)
{
	if (o->type == MSGPACK_OBJECT_BIN) {
		size_t n = o->via.bin.size < 32 ? o->via.bin.size : 32;
		char h[65];

		hex(h, (const uint8_t *)o->via.bin.ptr, full ? n : (n < 6 ? n : 6));
		snprintf(out, len, "%s", h);
	} else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
		snprintf(out, len, "%" PRIu64, o->via.u64);
	} else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
		snprintf(out, len, "%" PRId64, o->via.i64);
	} else {
		snprintf(out, len, "null");
	}
}

static void print_event(const struct args *a, struct json *j, uint64_t seq, double ts,
			const char *topic, const msgpack_object *ev)
{
	const msgpack_object *hs = field(ev, "block_hashes"), *tok = field(ev, "token_ids");
	const msgpack_object *parent = field(ev, "parent_block_hash"), *bs = field(ev, "block_size");
	const msgpack_object *lora = field(ev, "lora_name"), *lid = field(ev, "lora_id");
	char type[32], medium[16], h[80], lname[257], shown[257];
	uint32_t i, nh = hs && hs->type == MSGPACK_OBJECT_ARRAY ? hs->via.array.size : 0;
	uint32_t nt = tok && tok->type == MSGPACK_OBJECT_ARRAY ? tok->via.array.size : 0;

	str_of(field(ev, "type"), type, sizeof(type));
	str_of(field(ev, "medium"), medium, sizeof(medium));
	if (lora && lora->type != MSGPACK_OBJECT_STR)
		lora = NULL;
	str_of(lora, lname, sizeof(lname));
	if (a->fmt == FMT_JSON) {
		j->compact = true;
		json_open(j, '{');
		json_u64(j, "seq", seq);
		json_u64(j, "ts_ms", (uint64_t)(ts * 1000));
		json_str(j, "topic", topic);
		json_str(j, "type", type);
		if (field(ev, "medium"))
			json_str(j, "medium", medium);
		if (hs) {
			json_key(j, "block_hashes");
			json_open(j, '[');
			for (i = 0; i < nh; i++) {
				hash_of(&hs->via.array.ptr[i], h, sizeof(h), 1);
				json_str(j, NULL, h);
			}
			json_close(j, ']');
		}
		if (parent && parent->type != MSGPACK_OBJECT_NIL) {
			hash_of(parent, h, sizeof(h), 1);
			json_str(j, "parent_block_hash", h);
		}
		if (tok)
			json_u64(j, "tokens", nt);
		if (bs && bs->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
			json_u64(j, "block_size", bs->via.u64);
		if (lid && lid->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
			json_u64(j, "lora_id", lid->via.u64);
		if (lora)
			json_str(j, "lora_name", lname);
		json_close(j, '}');
		return;
	}
	{
		time_t t = (time_t)ts;
		struct tm tm;
		char when[32];

		localtime_r(&t, &tm);
		strftime(when, sizeof(when), "%H:%M:%S", &tm);
		printf("%" PRIu64 " %s.%03d %s %s", seq, when, (int)((ts - (double)t) * 1000), topic,
		       type);
	}
	if (field(ev, "medium"))
		printf(" %s", medium);
	if (hs) {
		printf(" %" PRIu32 " block%s", nh, nh == 1 ? "" : "s");
		for (i = 0; i < nh && i < 4; i++) {
			hash_of(&hs->via.array.ptr[i], h, sizeof(h), 0);
			printf("%s%s", i ? "," : " ", h);
		}
		if (nh > 4)
			printf(",...");
	}
	if (parent && parent->type != MSGPACK_OBJECT_NIL) {
		hash_of(parent, h, sizeof(h), 0);
		printf(" parent %s", h);
	}
	if (tok)
		printf(" %" PRIu32 " tokens", nt);
	if (lora) {
		/* The sealer's text: shown cut and without control characters. */
		kv_text_clean(shown, 64, lname);
		printf(" lora %s", shown);
	}
	putchar('\n');
}

/* Prints one batch; returns -1 when it is not a batch. */
static int print_batch(const struct args *a, uint64_t seq, const char *topic, const void *p,
		       size_t len)
{
	msgpack_unpacked u;
	const msgpack_object *ev;
	struct json j = { 0 };
	double ts = 0;
	uint32_t i;
	int r = -1;

	msgpack_unpacked_init(&u);
	if (msgpack_unpack_next(&u, p, len, NULL) != MSGPACK_UNPACK_SUCCESS ||
	    u.data.type != MSGPACK_OBJECT_ARRAY || u.data.via.array.size < 2 ||
	    u.data.via.array.ptr[1].type != MSGPACK_OBJECT_ARRAY)
		goto out;
	if (u.data.via.array.ptr[0].type == MSGPACK_OBJECT_FLOAT64 ||
	    u.data.via.array.ptr[0].type == MSGPACK_OBJECT_FLOAT32)
		ts = u.data.via.array.ptr[0].via.f64;
	ev = u.data.via.array.ptr[1].via.array.ptr;
	for (i = 0; i < u.data.via.array.ptr[1].via.array.size; i++)
		print_event(a, &j, seq, ts, topic, &ev[i]);
	r = 0;
out:
	msgpack_unpacked_destroy(&u);
	fflush(stdout);
	return r;
}

static uint64_t be64(const unsigned char *b)
{
	uint64_t v = 0;
	int i;

	for (i = 0; i < 8; i++)
		v = v << 8 | b[i];
	return v;
}

/* Receives one multipart message into frames (at most n; their sizes in
 * len); returns how many frames it had, or -1. */
static int recv_parts(void *s, zmq_msg_t *fr, int n)
{
	int k = 0, more = 1;
	size_t sz = sizeof(more);

	while (more) {
		zmq_msg_t m;

		zmq_msg_init(&m);
		if (zmq_msg_recv(&m, s, 0) < 0) {
			zmq_msg_close(&m);
			while (k > 0 && k <= n)
				zmq_msg_close(&fr[--k]);
			return -1;
		}
		zmq_getsockopt(s, ZMQ_RCVMORE, &more, &sz);
		if (k < n)
			fr[k] = m;
		else
			zmq_msg_close(&m);
		k++;
	}
	return k;
}

static void close_parts(zmq_msg_t *fr, int k, int n)
{
	while (k > 0) {
		if (k <= n)
			zmq_msg_close(&fr[k - 1]);
		k--;
	}
}

/* Replays the batches from a->from on (vLLM >= 0.26's protocol: [b"", seq]
 * to a ROUTER; [b"", topic, seq, payload] back until seq -1). Returns the
 * last seq seen + 1, or from on error. */
static uint64_t replay(void *ctx, const struct args *a, const char *topic)
{
	void *s = zmq_socket(ctx, ZMQ_DEALER);
	unsigned char seq[8];
	uint64_t next = a->from;
	int i, timeout = 10000;

	if (!s)
		return next;
	zmq_setsockopt(s, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
	if (zmq_connect(s, a->replay_endpoint) < 0) {
		fprintf(stderr, "kvctl: events: %s: %s\n", a->replay_endpoint,
			zmq_strerror(zmq_errno()));
		zmq_close(s);
		return next;
	}
	for (i = 7; i >= 0; i--)
		seq[i] = (unsigned char)(a->from >> (8 * (7 - i)));
	zmq_send(s, "", 0, ZMQ_SNDMORE);
	zmq_send(s, seq, 8, a->topic_filter ? ZMQ_SNDMORE : 0);
	if (a->topic_filter)
		zmq_send(s, a->topic_filter, strlen(a->topic_filter), 0);
	while (!stop) {
		zmq_msg_t fr[4];
		char tn[330];
		int k = recv_parts(s, fr, 4);
		uint64_t sq;

		if (k < 0) {
			fprintf(stderr, "kvctl: events: replay: %s\n", zmq_strerror(zmq_errno()));
			break;
		}
		if (k != 4 || zmq_msg_size(&fr[2]) != 8) {
			close_parts(fr, k, 4);
			continue;
		}
		sq = be64(zmq_msg_data(&fr[2]));
		if (sq == UINT64_MAX) {
			close_parts(fr, k, 4);
			break;
		}
		snprintf(tn, sizeof(tn), "%.*s", (int)zmq_msg_size(&fr[1]),
			 (const char *)zmq_msg_data(&fr[1]));
		print_batch(a, sq, tn[0] ? tn : topic, zmq_msg_data(&fr[3]), zmq_msg_size(&fr[3]));
		next = sq + 1;
		close_parts(fr, k, 4);
	}
	zmq_close(s);
	return next;
}

int cmd_events(kvc_conn *c, const struct args *a)
{
	const char *prefix = a->topic_filter ? a->topic_filter : "";
	void *ctx = zmq_ctx_new(), *sub = NULL;
	int ret = 1, timeout = 200;
	long n = 0;

	(void)c;
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	if (!ctx)
		return 1;
	sub = zmq_socket(ctx, ZMQ_SUB);
	if (!sub || zmq_setsockopt(sub, ZMQ_SUBSCRIBE, prefix, strlen(prefix)) < 0 ||
	    zmq_setsockopt(sub, ZMQ_RCVTIMEO, &timeout, sizeof(timeout)) < 0 ||
	    zmq_connect(sub, a->endpoint) < 0) {
		fprintf(stderr, "kvctl: events: %s: %s\n", a->endpoint, zmq_strerror(zmq_errno()));
		goto out;
	}
	/* Subscribed first, then the replay: what is published meanwhile
	 * comes on sub too, and batches already printed are skipped. */
	/* A replay names no topic: the one asked for, else "-". */
	uint64_t next = a->replay_endpoint ? replay(ctx, a, a->topic_filter ? a->topic_filter : "-")
					   : 0;
	int have_next = a->replay_endpoint != NULL;

	while (!stop && (!a->count || n < a->count)) {
		zmq_msg_t fr[3];
		char topic[330];
		int k = recv_parts(sub, fr, 3);
		uint64_t sq;

		if (k < 0) {
			if (zmq_errno() == EAGAIN || zmq_errno() == EINTR)
				continue;
			fprintf(stderr, "kvctl: events: %s\n", zmq_strerror(zmq_errno()));
			goto out;
		}
		if (k != 3 || zmq_msg_size(&fr[1]) != 8) {
			close_parts(fr, k, 3);
			continue;
		}
		sq = be64(zmq_msg_data(&fr[1]));
		snprintf(topic, sizeof(topic), "%.*s", (int)zmq_msg_size(&fr[0]),
			 (const char *)zmq_msg_data(&fr[0]));
		if (!have_next || sq >= next) {
			print_batch(a, sq, topic, zmq_msg_data(&fr[2]), zmq_msg_size(&fr[2]));
			n++;
		}
		close_parts(fr, k, 3);
	}
	ret = 0;
out:
	if (sub)
		zmq_close(sub);
	zmq_ctx_term(ctx);
	return ret;
}

#endif
