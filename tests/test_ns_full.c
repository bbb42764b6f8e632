/* Hello with the namespace table full (issue 29, docs vs code): with 256
 * namespaces open (KV_MAX_NS, each held by a session), a Hello that names
 * a 257th is refused with ENOSPC (protocol.md sections 4 and 9); a Hello
 * naming one of the open namespaces still works; once a namespace is freed, the same Hello
 * that failed succeeds. A name of 64 bytes is EINVAL, not ENOSPC. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "harness.h"

#define NS 256

static int try_connect(const char *ns, kvc_conn **c)
{
	struct kvc_options o = { .ns = ns, .client_name = "ns_full" };

	*c = NULL;
	return kvc_connect(NULL, &o, c);
}

int main(void)
{
	static kvc_conn *held[NS];
	struct kvt_daemon d;
	struct rlimit rl;
	char name[80];
	kvc_conn *c;
	int r, opened = 0;

	/* 256 connections and their daemon: room for the fds. */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 2048 && rl.rlim_max >= 2048) {
		rl.rlim_cur = 2048;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 600)
		SKIP("RLIMIT_NOFILE below 600: cannot hold 256 connections");
	kvt_start(&d, "--max-connections-per-uid", "1024", "--max-connections", "1024", NULL);
	/* This test's uid is the daemon's: it may open any namespace. */
	for (int i = 0; i < NS; i++) {
		snprintf(name, sizeof(name), "ns-%03d", i);
		r = try_connect(name, &held[i]);
		if (r < 0) {
			fprintf(stderr, "namespace %d: %s\n", i, kvc_strerror(r));
			break;
		}
		opened++;
	}
	CHECK_EQ(opened, NS);
	r = try_connect("one-too-many", &c);
	fprintf(stderr, "257th namespace: %s\n", kvc_strerror(r));
	CHECK_EQ(r, KVC_ENOSPC);
	/* An open one is still fine. */
	CHECK_EQ(try_connect("ns-007", &c), 0);
	kvc_close(c);
	/* 64 bytes: EINVAL, whatever the table. */
	memset(name, 'a', 64);
	name[64] = '\0';
	CHECK_EQ(try_connect(name, &c), KVC_EINVAL);
	/* One freed: the 257th fits. */
	kvc_close(held[0]);
	held[0] = NULL;
	for (int tries = 0;; tries++) {
		r = try_connect("one-too-many", &c);
		if (r == 0)
			break;
		CHECK_EQ(r, KVC_ENOSPC);   /* the close not seen yet */
		CHECK(tries < 10000);
		usleep(1000);
	}
	kvc_close(c);
	for (int i = 1; i < NS; i++)
		kvc_close(held[i]);
	kvt_stop(&d);
	fprintf(stderr, "ok\n");
	return 0;
}
