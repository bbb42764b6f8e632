/* Fuzzing the replay endpoint of KV events (issue 29): whatever multipart
 * message a peer sends on the ROUTER socket (libFuzzer; replayed by the
 * normal suite).
 *
 * Once per process: fuzzd.h's tiny daemon with events_endpoint and
 * events_replay_endpoint on ipc sockets in its directory, and one DEALER
 * peer. Input: a frame count (byte 0, at most 8), then per frame a length
 * byte and that many bytes (the ROUTER sees the peer's identity before
 * them). The message is sent, the daemon's loop turned until it has
 * counted the request, and whatever came back read.
 * Findings: a crash or sanitizer report; a request not counted exactly once
 * (well-formed: ["", 8-byte seq] or ["", seq, topic]; anything else is
 * bad); a well-formed request without its end marker (an empty topic, seq
 * -1), or a malformed one answered. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "events.h"
#include "fuzzd.h"
#include "kvconfig.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#if KV_HAVE_EVENTS
#include <zmq.h>

static void *zctx, *peer;

static void set(struct kv_config *c, const char *k, const char *v)
{
	char err[256];

	if (kv_config_set(c, kv_config_key(k), v, err, sizeof(err)) < 0) {
		fprintf(stderr, "fuzz_replay: %s\n", err);
		exit(1);
	}
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	static char dir[] = "/tmp/kvfuzz-replay.XXXXXX";
	static struct kv_config cfg;
	char ep[128], err[256] = "";
	int hwm = 1000, linger = 0;

	(void)argc;
	(void)argv;
	fz_tmpdir(dir);
	fz_config(&cfg, dir, 0);
	snprintf(ep, sizeof(ep), "ipc://%s/ev", dir);
	set(&cfg, "events_endpoint", ep);
	snprintf(ep, sizeof(ep), "ipc://%s/rp", dir);
	set(&cfg, "events_replay_endpoint", ep);
	if (kv_config_finish(&cfg, err, sizeof(err)) < 0 || kv_daemon_init(&fz_d, &cfg) < 0) {
		fprintf(stderr, "fuzz_replay: cannot start the daemon: %s\n", err);
		exit(1);
	}
	zctx = zmq_ctx_new();
	peer = zmq_socket(zctx, ZMQ_DEALER);
	zmq_setsockopt(peer, ZMQ_RCVHWM, &hwm, sizeof(hwm));
	zmq_setsockopt(peer, ZMQ_LINGER, &linger, sizeof(linger));
	if (zmq_connect(peer, ep) < 0) {
		fprintf(stderr, "fuzz_replay: connect: %s\n", zmq_strerror(zmq_errno()));
		exit(1);
	}
	return 0;
}

/* Reads what has come back; returns whether it ended with the end marker. */
static int drain(int *got)
{
	unsigned char b[4096];
	int end = 0, n;

	for (;;) {
		int more = 1, frames = 0, len[4] = { -1, -1, -1, -1 };
		unsigned char seq[8] = { 0 };
		size_t msz = sizeof(more);

		n = zmq_recv(peer, b, sizeof(b), ZMQ_DONTWAIT);
		if (n < 0)
			return end;
		(*got)++;
		len[frames++] = n;
		while (zmq_getsockopt(peer, ZMQ_RCVMORE, &more, &msz) == 0 && more) {
			n = zmq_recv(peer, b, sizeof(b), 0);
			if (frames == 2 && n == 8)
				memcpy(seq, b, 8);
			if (frames < 4)
				len[frames] = n;
			frames++;
		}
		/* DEALER: ["", topic, seq, payload]; the end: ["", "", -1, ""] */
		end = frames == 4 && len[1] == 0 && len[3] == 0 &&
		      !memcmp(seq, "\xff\xff\xff\xff\xff\xff\xff\xff", 8);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kv_events_stats before, after;
	const uint8_t *p = data, *end = data + size;
	int nf, lens[8], ok, got = 0, ended = 0;
	const uint8_t *fr[8];

	if (!size)
		return 0;
	nf = p[0] % 9;
	p++;
	for (int i = 0; i < nf; i++) {
		size_t l = p < end ? *p++ : 0;

		if (l > (size_t)(end - p))
			l = (size_t)(end - p);
		fr[i] = p;
		lens[i] = (int)l;
		p += l;
	}
	if (!nf)
		return 0;   /* an empty message: nothing is sent */
	/* As vLLM's _service_replay (issue 35): [any, start of any length],
	 * and kvcached's third frame naming a topic (here at most 255 bytes,
	 * within the daemon's 320). */
	ok = nf == 2 || nf == 3;
	kv_events_stats(fz_d.events, &before);
	for (int i = 0; i < nf; i++)
		if (zmq_send(peer, fr[i], (size_t)lens[i], i + 1 < nf ? ZMQ_SNDMORE : 0) < 0)
			fz_finding("zmq_send failed");
	for (int n = 0; n < 20000; n++) {
		kv_loop_run_once(&fz_d.loop, 1);
		kv_events_stats(fz_d.events, &after);
		if (after.replay_requests + after.replay_bad > before.replay_requests + before.replay_bad)
			break;
	}
	if (after.replay_requests + after.replay_bad != before.replay_requests + before.replay_bad + 1)
		fz_finding("the request was not counted once");
	if (ok != (after.replay_requests == before.replay_requests + 1))
		fz_finding(ok ? "a well-formed request counted bad" : "a malformed request served");
	/* The answer: the end marker for a well-formed request, nothing else. */
	for (int n = 0; n < (ok ? 20000 : 3); n++) {
		kv_loop_run_once(&fz_d.loop, 0);
		if ((ended = drain(&got)))
			break;
		zmq_poll(&(zmq_pollitem_t){ .socket = peer, .events = ZMQ_POLLIN }, 1, ok ? 1 : 0);
	}
	if (ok && !ended)
		fz_finding("a well-formed request without its end marker");
	if (!ok && got)
		fz_finding("a malformed request answered");
	return 0;
}
#else
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	(void)data;
	(void)size;
	return 0;   /* no events in this build */
}
#endif
