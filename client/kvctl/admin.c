/* kvctl check, evict, flush, drain and reload: the admin operations. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kvctl.h"

int cmd_check(kvc_conn *c, const struct args *a)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Check ck = KVCACHED__CHECK__INIT;
	Kvcached__Response *resp;
	const Kvcached__CheckReply *cr;
	size_t i;
	int ret;

	req.op_case = KVCACHED__REQUEST__OP_CHECK;
	req.check = &ck;
	resp = call(c, &req, KVCACHED__RESPONSE__RESULT_CHECK, "check");
	if (!resp)
		return 1;
	cr = resp->check;
	if (a->fmt == FMT_JSON) {
		struct json j = { 0 };

		json_open(&j, '{');
		json_bool(&j, "ok", cr->ok);
		json_u64(&j, "blocks_checked", cr->blocks_checked);
		json_key(&j, "problems");
		json_open(&j, '[');
		for (i = 0; i < cr->n_problems; i++)
			json_str(&j, NULL, cr->problems[i]);
		json_close(&j, ']');
		json_close(&j, '}');
	} else if (cr->ok) {
		printf("ok: %" PRIu64 " blocks checked\n", cr->blocks_checked);
	} else {
		printf("FAILED: %zu problem%s in %" PRIu64 " blocks checked\n", cr->n_problems,
		       cr->n_problems == 1 ? "" : "s", cr->blocks_checked);
		for (i = 0; i < cr->n_problems; i++) {
			char *p = sanitize(cr->problems[i]);

			printf("  %s\n", p);
			free(p);
		}
	}
	ret = cr->ok ? 0 : 1;
	kvcached__response__free_unpacked(resp, NULL);
	return ret;
}

int cmd_evict(kvc_conn *c, const struct args *a)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Evict ev = KVCACHED__EVICT__INIT;
	Kvcached__Response *resp;

	/* Without --pool: every pool. */
	ev.all_pools = !(a->used & O_POOL);
	ev.pool_id = a->pool;
	ev.tier = (Kvcached__Tier)a->tier;
	req.op_case = KVCACHED__REQUEST__OP_EVICT;
	req.evict = &ev;
	resp = call(c, &req, KVCACHED__RESPONSE__RESULT_EVICT, "evict");
	if (!resp)
		return 1;
	if (a->fmt == FMT_JSON) {
		struct json j = { 0 };

		json_open(&j, '{');
		json_str(&j, "tier", tier_names[a->tier]);
		json_u64(&j, "blocks", resp->evict->blocks);
		json_close(&j, '}');
	} else if (ev.all_pools) {
		printf("%s: %" PRIu64 " blocks evicted from every pool\n", tier_names[a->tier],
		       resp->evict->blocks);
	} else {
		printf("%s: %" PRIu64 " blocks evicted from pool %" PRIu32 "\n", tier_names[a->tier],
		       resp->evict->blocks, a->pool);
	}
	kvcached__response__free_unpacked(resp, NULL);
	return 0;
}

int cmd_flush(kvc_conn *c, const struct args *a)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Flush fl = KVCACHED__FLUSH__INIT;
	Kvcached__Response *resp;
	uint64_t started;
	int waited_ms = 0, clean;

	req.op_case = KVCACHED__REQUEST__OP_FLUSH;
	req.flush = &fl;
	resp = call(c, &req, KVCACHED__RESPONSE__RESULT_FLUSH, "flush");
	if (!resp)
		return 1;
	started = resp->flush->started;
	clean = resp->flush->clean;
	kvcached__response__free_unpacked(resp, NULL);
	/* Wait until the daemon says everything demoted or written before is
	 * durable: Flush again (it is the barrier, and it writes back what
	 * demotions in flight have landed since; the stats alone would say
	 * clean before those land). */
	while (!clean && waited_ms < 60000) {
		struct timespec ts = { 0, 10 * 1000 * 1000 };

		nanosleep(&ts, NULL);
		waited_ms += 10;
		resp = call(c, &req, KVCACHED__RESPONSE__RESULT_FLUSH, "flush");
		if (!resp)
			return 1;
		started += resp->flush->started;
		clean = resp->flush->clean;
		kvcached__response__free_unpacked(resp, NULL);
	}
	if (a->fmt == FMT_JSON) {
		struct json j = { 0 };

		json_open(&j, '{');
		json_u64(&j, "started", started);
		json_bool(&j, "clean", clean);
		json_close(&j, '}');
	} else {
		printf("%" PRIu64 " blocks written back; %s\n", started,
		       clean ? "nothing dirty is left" : "still writing after 60 s");
	}
	return clean ? 0 : 1;
}

/* Waits until the daemon closes c (it exits) or until deadline_ms (wall
 * clock) plus a grace of 10 s. Returns 0 or 1 (error printed). */
static int wait_exit(kvc_conn *c, uint64_t deadline_ms)
{
	struct pollfd pfd = { .fd = kvc_conn_fd(c), .events = POLLIN };
	struct timespec ts;
	uint64_t now;
	char b;

	for (;;) {
		int r;

		clock_gettime(CLOCK_REALTIME, &ts);
		now = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
		if (now > deadline_ms + 10000) {
			fputs("kvctl: drain: the daemon is still running 10 s after its deadline\n",
			      stderr);
			return 1;
		}
		r = poll(&pfd, 1, (int)(deadline_ms + 10000 - now));
		if (r < 0 && errno != EINTR) {
			fprintf(stderr, "kvctl: drain: poll: %s\n", strerror(errno));
			return 1;
		}
		/* Nothing is in flight, so readable means EOF. */
		if (r > 0 && recv(pfd.fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) <= 0)
			return 0;
	}
}

int cmd_drain(kvc_conn *c, const struct args *a)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Drain dr = KVCACHED__DRAIN__INIT;
	Kvcached__Response *resp;
	const Kvcached__DrainReply *d;
	int ret = 0;
	char *x;

	dr.timeout_ms = a->used & O_TIMEOUT ? a->timeout_ms : 0;
	if ((a->used & O_TIMEOUT) && !dr.timeout_ms)
		dr.timeout_ms = 1;   /* 0 means "the configured one" on the wire */
	req.op_case = KVCACHED__REQUEST__OP_DRAIN;
	req.drain = &dr;
	resp = call(c, &req, KVCACHED__RESPONSE__RESULT_DRAIN, "drain");
	if (!resp)
		return 1;
	d = resp->drain;
	if (a->fmt == FMT_JSON) {
		struct json j = { 0 };

		json_open(&j, '{');
		json_bool(&j, "already", d->already);
		json_u64(&j, "clients", d->clients);
		json_u64(&j, "deadline_ms", d->deadline_ms);
		json_close(&j, '}');
	} else {
		printf("%s: %" PRIu32 " client%s left; kvcached exits when they are gone, within "
		       "%s at the latest\n", d->already ? "draining already" : "draining", d->clients,
		       d->clients == 1 ? "" : "s", x = fmt_deadline(d->deadline_ms));
		free(x);
	}
	fflush(stdout);
	if (a->used & O_WAIT) {
		ret = wait_exit(c, d->deadline_ms);
		if (ret == 0 && a->fmt == FMT_HUMAN)
			puts("kvcached has exited");
	}
	kvcached__response__free_unpacked(resp, NULL);
	return ret;
}

int cmd_reload(kvc_conn *c, const struct args *a)
{
	Kvcached__Request req = KVCACHED__REQUEST__INIT;
	Kvcached__Reload rl = KVCACHED__RELOAD__INIT;
	Kvcached__Response *resp;
	const Kvcached__ReloadReply *r;
	size_t i;

	req.op_case = KVCACHED__REQUEST__OP_RELOAD;
	req.reload = &rl;
	resp = call(c, &req, KVCACHED__RESPONSE__RESULT_RELOAD, "reload");
	if (!resp)
		return 1;
	r = resp->reload;
	if (a->fmt == FMT_JSON) {
		struct json j = { 0 };

		json_open(&j, '{');
		json_str(&j, "config_path", r->config_path);
		json_key(&j, "applied");
		json_open(&j, '[');
		for (i = 0; i < r->n_applied; i++)
			json_str(&j, NULL, r->applied[i]);
		json_close(&j, ']');
		json_key(&j, "not_applied");
		json_open(&j, '[');
		for (i = 0; i < r->n_not_applied; i++)
			json_str(&j, NULL, r->not_applied[i]);
		json_close(&j, ']');
		json_close(&j, '}');
	} else {
		kv_line("reloaded", "%s", r->config_path[0] ? r->config_path : "(no file)");
		if (!r->n_applied && !r->n_not_applied)
			kv_line("changes", "none");
		for (i = 0; i < r->n_applied; i++)
			kv_line("applied", "%s", r->applied[i]);
		for (i = 0; i < r->n_not_applied; i++)
			kv_line("restart", "%s (not applied: needs a restart)", r->not_applied[i]);
	}
	kvcached__response__free_unpacked(resp, NULL);
	return 0;
}
