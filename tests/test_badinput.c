/* Bad input on the socket: garbage, a truncated frame, an oversize length, an
 * undecodable payload, an unknown op, a request before Hello, fds attached.
 * Each gets an EPROTO reply where one can be sent and that connection is
 * closed; the daemon and a bystander holding blocks carry on. Client names
 * that are too long, invalid UTF-8 or full of control characters are shown
 * cut between characters and with '?' in place of what is not text; pool
 * names and dtypes that are not text are refused. A Seal's KV-event fields
 * past their bounds are EINVAL for that Seal alone. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "frame.h"
#include "harness.h"

static int raw_connect(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct timeval tv = { 5, 0 };

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", getenv("KVCACHED_SOCKET"));
	CHECK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

static void send_all(int fd, const void *p, size_t n)
{
	CHECK(send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n);
}

static size_t frame(uint8_t *out, const Kvcached__Request *rq)
{
	size_t len = kvcached__request__get_packed_size(rq);

	kv_frame_hdr_encode(out, (uint32_t)len, 0);
	kvcached__request__pack(rq, out + KV_FRAME_HDR);
	return KV_FRAME_HDR + len;
}

static size_t hello(uint8_t *out, uint32_t minv, uint32_t maxv)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Hello h = KVCACHED__HELLO__INIT;

	h.min_version = minv;
	h.max_version = maxv;
	rq.id = 1;
	rq.op_case = KVCACHED__REQUEST__OP_HELLO;
	rq.hello = &h;
	return frame(out, &rq);
}

/* Reads one response; returns it, or NULL at EOF. */
static Kvcached__Response *recv_resp(int fd)
{
	uint8_t hdr[KV_FRAME_HDR], buf[65536];
	uint32_t len;
	size_t got = 0;
	ssize_t n;

	while (got < KV_FRAME_HDR) {
		n = recv(fd, hdr + got, KV_FRAME_HDR - got, 0);
		CHECK(n >= 0);
		if (n == 0)
			return NULL;
		got += (size_t)n;
	}
	CHECK(kv_frame_hdr_decode(hdr, sizeof(buf), &len) == 0);
	for (got = 0; got < len; got += (size_t)n) {
		n = recv(fd, buf + got, len - got, 0);
		CHECK(n > 0);
	}
	return kvcached__response__unpack(NULL, len, buf);
}

/* Expects an error reply with code (when reply is set), then EOF. */
static void expect(int fd, int reply, Kvcached__ErrorCode code, const char *what)
{
	if (reply) {
		Kvcached__Response *rs = recv_resp(fd);

		CHECK(rs != NULL);
		CHECK(rs->error != NULL);
		fprintf(stderr, "%-22s -> code %d: %s\n", what, rs->error->code, rs->error->message);
		CHECK_EQ(rs->error->code, code);
		kvcached__response__free_unpacked(rs, NULL);
	}
	if (code == KVCACHED__ERROR_CODE__EPROTO || !reply) {
		uint8_t b;

		CHECK(recv(fd, &b, 1, 0) == 0);  /* closed */
	}
	close(fd);
}

static void bystander_ok(kvc_conn *c, int pool, kvc_block *held)
{
	kvc_block b;

	CHECK(kvt_mem_all(c, kvc_block_ptr(c, *held), 0x42, 1));
	CHECK_EQ(kvc_alloc(c, pool, 1, &b), 1);
	CHECK_EQ(kvc_release(c, &b, 1), 0);
}

/* Hello and n Stats requests, pipelined in one buffer (malloc'd). */
static uint8_t *hello_and_stats(size_t nstats, size_t *len)
{
	uint8_t *buf = malloc(256 * (nstats + 1));
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Stats st = KVCACHED__STATS__INIT;

	CHECK(buf != NULL);
	*len = hello(buf, 1, 1);
	rq.op_case = KVCACHED__REQUEST__OP_STATS;
	rq.stats = &st;
	for (size_t i = 0; i < nstats; i++) {
		rq.id = 100 + i;
		*len += frame(buf + *len, &rq);
	}
	return buf;
}

/* Reads replies until EOF: how many answered without an error; *eproto is
 * set when the last one is an EPROTO error. */
static size_t replies_until_eof(int fd, int *eproto)
{
	Kvcached__Response *rs;
	size_t ok = 0;

	*eproto = 0;
	while ((rs = recv_resp(fd)) != NULL) {
		CHECK(!*eproto);   /* nothing after the EPROTO */
		if (rs->error)
			*eproto = rs->error->code == KVCACHED__ERROR_CODE__EPROTO;
		else
			ok++;
		CHECK(!rs->error || *eproto);
		kvcached__response__free_unpacked(rs, NULL);
	}
	return ok;
}

/* test_half_close: a peer that sends whole requests and then shuts its
 * side (shutdown(SHUT_WR)) gets every reply before the daemon closes (it
 * used to drop them: 15 of 40 runs, 40 of 40 under ASan). */
static void half_close(void)
{
	for (int run = 0; run < 40; run++) {
		size_t len;
		uint8_t *buf = hello_and_stats(40, &len);
		int fd = raw_connect(), eproto;

		send_all(fd, buf, len);
		CHECK(shutdown(fd, SHUT_WR) == 0);
		CHECK_EQ(replies_until_eof(fd, &eproto), 41);
		CHECK(!eproto);
		close(fd);
		free(buf);
	}
}

/* test_replies_before_bad_frame: 200 pipelined Stats, then a bad header:
 * all 200 are answered (more than a socket buffer holds), then EPROTO, then
 * EOF (the replies the socket could not take at once used to be lost). */
static void replies_before_bad_frame(void)
{
	for (int run = 0; run < 5; run++) {
		size_t len;
		uint8_t *buf = hello_and_stats(200, &len);
		int fd = raw_connect(), eproto;

		memcpy(buf + len, "\xff\xff\xff\x7f\x00\x00\x00\x00", KV_FRAME_HDR);
		send_all(fd, buf, len + KV_FRAME_HDR);
		CHECK_EQ(replies_until_eof(fd, &eproto), 201);
		CHECK(eproto);
		close(fd);
		free(buf);
	}
}

/* Sends rq with the first 'X' of its packed bytes replaced by b. */
static void send_patched(int fd, const Kvcached__Request *rq, uint8_t b)
{
	uint8_t buf[512];
	size_t n = frame(buf, rq);
	uint8_t *x = memchr(buf + KV_FRAME_HDR, 'X', n - KV_FRAME_HDR);

	CHECK(x != NULL);
	*x = b;
	send_all(fd, buf, n);
}

/* test_strings_at_the_door: a string with a NUL inside ("pool\0zzz" used to
 * join pool "pool", "\0abc" to be namespace "default") or that is not UTF-8
 * (echoed back, strict proto3 parsers then could not read Stats or
 * ListClients for anyone) is a protocol error: EPROTO naming the field. The C
 * client sends neither: EINVAL for a namespace or pool name, '?' in a
 * client name. */
static void strings_at_the_door(kvc_conn *bystander)
{
	static const struct {
		const char *name;
		uint8_t b;
		int in_hello;    /* the namespace (1), the client name (2), a pool name (0) */
	} cases[] = {
		{ "NUL in a pool name", 0, 0 },
		{ "invalid UTF-8 in a pool name", 0xff, 0 },
		{ "NUL in a namespace", 0, 1 },
		{ "invalid UTF-8 in a namespace", 0xc0, 1 },
		{ "NUL in a client name", 0, 2 },
		{ "invalid UTF-8 in a client name", 0x80, 2 },
	};
	struct kvc_options o = { .ns = "bad\xff" };
	kvc_conn *c;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		Kvcached__Request rq = KVCACHED__REQUEST__INIT;
		Kvcached__Hello h = KVCACHED__HELLO__INIT;
		Kvcached__RegisterPool rp = KVCACHED__REGISTER_POOL__INIT;
		uint8_t buf[256];
		int fd = raw_connect();

		h.min_version = h.max_version = 1;
		rq.id = 7;
		rq.op_case = KVCACHED__REQUEST__OP_HELLO;
		rq.hello = &h;
		if (cases[i].in_hello) {
			if (cases[i].in_hello == 1)
				h.namespace_ = "Xabc";
			else
				h.client_name = "nameXzzz";
			send_patched(fd, &rq, cases[i].b);
			expect(fd, 1, KVCACHED__ERROR_CODE__EPROTO, cases[i].name);
			continue;
		}
		send_all(fd, buf, hello(buf, 1, 1));
		{
			Kvcached__Response *rs = recv_resp(fd);

			CHECK(rs && !rs->error);
			kvcached__response__free_unpacked(rs, NULL);
		}
		rp.name = "poolXzzz";
		rp.block_bytes = 8192;
		rp.block_tokens = 16;
		rp.dtype = "fp16";
		rq.op_case = KVCACHED__REQUEST__OP_REGISTER_POOL;
		rq.register_pool = &rp;
		send_patched(fd, &rq, cases[i].b);
		expect(fd, 1, KVCACHED__ERROR_CODE__EPROTO, cases[i].name);
	}
	/* No pool "pool" (of 8 KiB blocks) came of it: one of 4 KiB is new. */
	{
		struct kvc_pool_desc d = { .name = "pool", .block_bytes = 4096,
					   .block_tokens = 16, .dtype = "fp16" };

		CHECK(kvc_register_pool(bystander, &d) >= 0);
	}
	CHECK_EQ(kvc_connect(NULL, &o, &c), KVC_EINVAL);
}

/* One request on a raw connection and its reply (freed by the caller). */
static Kvcached__Response *raw_call(int fd, Kvcached__Request *rq)
{
	size_t len = kvcached__request__get_packed_size(rq);
	uint8_t *buf = malloc(KV_FRAME_HDR + len);
	Kvcached__Response *rs;

	CHECK(buf != NULL);
	send_all(fd, buf, frame(buf, rq));
	free(buf);
	rs = recv_resp(fd);
	CHECK(rs != NULL);
	return rs;
}

/* test_seal_event_fields: what a Seal says for the KV events (lora_name,
 * lora_id, extra_keys, kvcached.proto) is bounded: a count or length past a
 * bound, a key with nothing in it, extra_keys for some of the blocks, is
 * EINVAL for that Seal alone (nothing sealed, the connection goes on); a
 * string that is not UTF-8 deep inside a key is EPROTO at the door (the
 * connection closes). Then the same blocks seal, at the bounds exactly. */
static void seal_event_fields(void)
{
	static char lora[258], text[1026];
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__RegisterPool rp = KVCACHED__REGISTER_POOL__INIT;
	Kvcached__Alloc al = KVCACHED__ALLOC__INIT;
	Kvcached__Seal sl = KVCACHED__SEAL__INIT;
	Kvcached__BlockKeys bk[2] = { KVCACHED__BLOCK_KEYS__INIT, KVCACHED__BLOCK_KEYS__INIT };
	Kvcached__BlockKeys *bkp[2] = { &bk[0], &bk[1] };
	Kvcached__EventKey ek[65], *ekp[65];
	Kvcached__MmKey mm = KVCACHED__MM_KEY__INIT;
	Kvcached__Response *rs;
	uint8_t hashes[64], buf[256];
	uint64_t blocks[2];
	int fd = raw_connect();

	send_all(fd, buf, hello(buf, 1, 1));
	rs = recv_resp(fd);
	CHECK(rs && !rs->error);
	kvcached__response__free_unpacked(rs, NULL);
	rp.name = "evp";
	rp.block_bytes = 8192;
	rp.block_tokens = 16;
	rp.dtype = "fp16";
	rq.op_case = KVCACHED__REQUEST__OP_REGISTER_POOL;
	rq.register_pool = &rp;
	rs = raw_call(fd, &rq);
	CHECK(rs->register_pool != NULL);
	al.pool_id = sl.pool_id = rs->register_pool->pool_id;
	kvcached__response__free_unpacked(rs, NULL);
	al.count = 2;
	rq.op_case = KVCACHED__REQUEST__OP_ALLOC;
	rq.alloc = &al;
	rs = raw_call(fd, &rq);
	CHECK(rs->blocks != NULL && rs->blocks->n_blocks == 2);
	memcpy(blocks, rs->blocks->blocks, sizeof(blocks));
	kvcached__response__free_unpacked(rs, NULL);

	for (int i = 0; i < 65; i++) {
		kvcached__event_key__init(&ek[i]);
		ek[i].key_case = KVCACHED__EVENT_KEY__KEY_TEXT;
		ek[i].text = "k";
		ekp[i] = &ek[i];
	}
	memset(lora, 'l', sizeof(lora) - 1);
	memset(text, 't', sizeof(text) - 1);
	memset(hashes, 0x5e, sizeof(hashes));
	hashes[32] = 0x5f;
	sl.n_blocks = 2;
	sl.blocks = blocks;
	sl.hashes.data = hashes;
	sl.hashes.len = sizeof(hashes);
	rq.op_case = KVCACHED__REQUEST__OP_SEAL;
	rq.seal = &sl;
	for (int c = 0; c < 7; c++) {
		const char *what = "";

		sl.lora_name = "";
		sl.n_extra_keys = 2;
		sl.extra_keys = bkp;
		bk[0].n_keys = 1;
		bk[0].keys = ekp;
		bk[1].n_keys = 0;
		ek[0].key_case = KVCACHED__EVENT_KEY__KEY_TEXT;
		ek[0].text = "k";
		switch (c) {
		case 0:
			what = "lora_name of 257 B";
			sl.lora_name = lora;
			break;
		case 1:
			what = "extra_keys for 1 of 2";
			sl.n_extra_keys = 1;
			break;
		case 2:
			what = "65 keys in a block";
			bk[1].n_keys = 65;
			bk[1].keys = ekp;
			break;
		case 3:
			what = "a key of 1025 B";
			ek[0].text = text;
			break;
		case 4:
			what = "an empty key";
			ek[0].key_case = KVCACHED__EVENT_KEY__KEY__NOT_SET;
			break;
		case 5:
			what = "an mm id of 1025 B";
			ek[0].key_case = KVCACHED__EVENT_KEY__KEY_MM;
			ek[0].mm = &mm;
			mm.identifier = text;
			break;
		case 6:
			what = "a digest of 1025 B";
			ek[0].key_case = KVCACHED__EVENT_KEY__KEY_DIGEST;
			ek[0].digest.data = (uint8_t *)text;
			ek[0].digest.len = 1025;
			break;
		}
		rs = raw_call(fd, &rq);
		CHECK(rs->error != NULL);
		fprintf(stderr, "%-22s -> code %d: %s\n", what, rs->error->code, rs->error->message);
		CHECK_EQ(rs->error->code, KVCACHED__ERROR_CODE__EINVAL);
		kvcached__response__free_unpacked(rs, NULL);
	}
	/* At the bounds: sealed. */
	ek[0].key_case = KVCACHED__EVENT_KEY__KEY_TEXT;
	ek[0].text = text;
	lora[256] = 0;
	text[1024] = 0;
	sl.lora_name = lora;
	sl.lora_id = UINT64_MAX;
	bk[0].n_keys = 64;
	bk[0].keys = ekp;
	bk[1].n_keys = 1;
	bk[1].keys = ekp + 64;
	ek[64].key_case = KVCACHED__EVENT_KEY__KEY_MM;
	ek[64].mm = &mm;
	mm.identifier = text;
	mm.offset = INT64_MIN;
	rs = raw_call(fd, &rq);
	if (rs->error)
		fprintf(stderr, "at the bounds: %s\n", rs->error->message);
	CHECK(rs->error == NULL && rs->blocks && rs->blocks->n_blocks == 2);
	kvcached__response__free_unpacked(rs, NULL);
	/* Not UTF-8 in a key: at the door. */
	mm.identifier = "img\xff";
	bk[0].n_keys = 0;
	{
		size_t len = kvcached__request__get_packed_size(&rq);
		uint8_t *b = malloc(KV_FRAME_HDR + len);

		CHECK(b != NULL);
		send_all(fd, b, frame(b, &rq));
		free(b);
	}
	expect(fd, 1, KVCACHED__ERROR_CODE__EPROTO, "not UTF-8 in an mm id");
}

/* The name the daemon shows for a client that called itself name. */
static void shown_name(const char *name, char *out, size_t len)
{
	struct kvc_options o = { .client_name = name };
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__ListClients lc = KVCACHED__LIST_CLIENTS__INIT;
	Kvcached__Response *rs = NULL;
	kvc_conn *c;
	uint64_t id;

	CHECK_EQ(kvc_connect(NULL, &o, &c), 0);
	id = kvc_conn_hello(c)->session_id;
	rq.op_case = KVCACHED__REQUEST__OP_LIST_CLIENTS;
	rq.list_clients = &lc;
	CHECK_EQ(kvc_call(c, &rq, &rs), 0);
	CHECK(rs->result_case == KVCACHED__RESPONSE__RESULT_CLIENTS);
	out[0] = 0;
	for (size_t i = 0; i < rs->clients->n_clients; i++)
		if (rs->clients->clients[i]->session_id == id)
			snprintf(out, len, "%s", rs->clients->clients[i]->name);
	kvcached__response__free_unpacked(rs, NULL);
	kvc_close(c);
}

/* Client names reach logs, kvctl's JSON and Prometheus labels: cut between
 * characters at 63 bytes, control characters and invalid UTF-8 as '?'. */
static void client_names(void)
{
	char name[200], got[128];

	/* 62 ASCII bytes, then a 3-byte character across the 63rd. */
	memset(name, 'a', 62);
	strcpy(name + 62, "\xe2\x82\xac");
	shown_name(name, got, sizeof(got));
	CHECK_EQ(strlen(got), 62);
	/* 60 + the same character: it fits whole. */
	strcpy(name + 60, "\xe2\x82\xac");
	shown_name(name, got, sizeof(got));
	CHECK(strlen(got) == 63 && !strcmp(got + 60, "\xe2\x82\xac"));
	shown_name("evil\nkvcached info: forged line\x1b[2J", got, sizeof(got));
	CHECK_EQ(strcmp(got, "evil?kvcached info: forged line?[2J"), 0);
	/* A lone continuation byte, an overlong '/', a surrogate, a 4-byte
	 * character that is fine. */
	shown_name("x\x80y\xc0\xafz\xed\xa0\x80w\xf0\x9f\x98\x80", got, sizeof(got));
	fprintf(stderr, "client name shown: '%s'\n", got);
	CHECK_EQ(strcmp(got, "x?y??z???w\xf0\x9f\x98\x80"), 0);
}

/* Pool names and dtypes must be text: refused with EINVAL otherwise. */
static void pool_names(kvc_conn *c)
{
	struct kvc_pool_desc d = { .name = "ok-\xc3\xa9", .block_bytes = 4096, .block_tokens = 16,
				   .dtype = "fp16" };

	CHECK(kvc_register_pool(c, &d) >= 0);
	d.name = "bad\nname";
	CHECK_EQ(kvc_register_pool(c, &d), KVC_EINVAL);
	fprintf(stderr, "pool name with a newline: %s\n", kvc_last_error(c));
	d.name = "bad\xff";
	CHECK_EQ(kvc_register_pool(c, &d), KVC_EINVAL);
	d.name = "p2";
	d.dtype = "fp\x1b[0m";
	CHECK_EQ(kvc_register_pool(c, &d), KVC_EINVAL);
}

int main(void)
{
	struct kvt_daemon d;
	uint8_t buf[256];
	kvc_conn *c;
	kvc_block held;
	size_t n;
	int fd, pool;

	kvt_start(&d, "--pool-size", "8MiB", "--segment-size", "2MiB", "--max-frame", "64KiB",
		  "--max-batch", "1000", NULL);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "p", 8192);
	CHECK_EQ(kvc_alloc(c, pool, 1, &held), 1);
	kvt_mem_set(c, kvc_block_ptr(c, held), 0x42, 8192);

	/* Garbage bytes: a bad header. */
	fd = raw_connect();
	send_all(fd, "GARBAGE!GARBAGE!", 16);
	expect(fd, 1, KVCACHED__ERROR_CODE__EPROTO, "garbage");
	bystander_ok(c, pool, &held);

	/* A truncated frame then EOF: nobody to answer. */
	fd = raw_connect();
	n = hello(buf, 1, 1);
	send_all(fd, buf, n - 3);
	shutdown(fd, SHUT_WR);
	expect(fd, 0, 0, "truncated");
	bystander_ok(c, pool, &held);

	/* An oversize length. */
	fd = raw_connect();
	kv_frame_hdr_encode(buf, 0x7fffffff, 0);
	send_all(fd, buf, KV_FRAME_HDR);
	expect(fd, 1, KVCACHED__ERROR_CODE__EPROTO, "oversize");
	bystander_ok(c, pool, &held);

	/* A frame whose payload is not a Request. */
	fd = raw_connect();
	kv_frame_hdr_encode(buf, 6, 0);
	memcpy(buf + KV_FRAME_HDR, "\xff\xff\xff\xff\xff\xff", 6);
	send_all(fd, buf, KV_FRAME_HDR + 6);
	expect(fd, 1, KVCACHED__ERROR_CODE__EPROTO, "undecodable");
	bystander_ok(c, pool, &held);

	/* Anything before Hello. */
	fd = raw_connect();
	{
		Kvcached__Request rq = KVCACHED__REQUEST__INIT;
		Kvcached__Stats st = KVCACHED__STATS__INIT;

		rq.id = 9;
		rq.op_case = KVCACHED__REQUEST__OP_STATS;
		rq.stats = &st;
		send_all(fd, buf, frame(buf, &rq));
	}
	expect(fd, 1, KVCACHED__ERROR_CODE__EPROTO, "before hello");

	/* A version nobody speaks: an error, the connection stays. */
	fd = raw_connect();
	send_all(fd, buf, hello(buf, 7, 9));
	{
		Kvcached__Response *rs = recv_resp(fd);

		CHECK(rs && rs->error && rs->error->code == KVCACHED__ERROR_CODE__EVERSION);
		kvcached__response__free_unpacked(rs, NULL);
	}
	/* Then a valid Hello, then an unknown op (field 99, a varint). */
	send_all(fd, buf, hello(buf, 1, 1));
	{
		Kvcached__Response *rs = recv_resp(fd);

		CHECK(rs && !rs->error && rs->result_case == KVCACHED__RESPONSE__RESULT_HELLO);
		kvcached__response__free_unpacked(rs, NULL);
	}
	kv_frame_hdr_encode(buf, 5, 0);
	memcpy(buf + KV_FRAME_HDR, "\x08\x05\x98\x06\x01", 5); /* id=5, field 99 = 1 */
	send_all(fd, buf, KV_FRAME_HDR + 5);
	expect(fd, 1, KVCACHED__ERROR_CODE__EPROTO, "unknown op");
	bystander_ok(c, pool, &held);

	/* A valid Hello with an fd attached. */
	fd = raw_connect();
	{
		int nul = open("/dev/null", O_RDONLY);
		struct iovec iov = { buf, hello(buf, 1, 1) };

		CHECK(kv_sendmsg_fds(fd, &iov, 1, &nul, 1, 0) == (ssize_t)iov.iov_len);
		close(nul);
	}
	expect(fd, 1, KVCACHED__ERROR_CODE__EPROTO, "fds attached");
	bystander_ok(c, pool, &held);

	/* Many at once, interleaved with the bystander. */
	for (int i = 0; i < 50; i++) {
		fd = raw_connect();
		send_all(fd, "\x01\x00\x00\x00\x00\x00\x56\x4b\x00", 9);
		expect(fd, 1, KVCACHED__ERROR_CODE__EPROTO, "bad payload");
		bystander_ok(c, pool, &held);
	}

	half_close();
	replies_before_bad_frame();
	strings_at_the_door(c);
	bystander_ok(c, pool, &held);
	client_names();
	pool_names(c);
	seal_event_fields();
	bystander_ok(c, pool, &held);

	CHECK(kvt_alive(&d));
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
	kvt_stop(&d);
	return 0;
}
