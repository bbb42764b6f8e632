/* G4 written at demotion from the G2 slot, held (issue 38): the tier's
 * worker copies each demoted block's payload out of its G2 slot into the G4
 * value and sums it while the slot is held (BUSY_G4), where before the loop
 * copied it. A real Redis Cluster (3 masters, no replica) and kvcached
 * daemons standing for nodes, namespaces that write to G4 at demotion
 * (remote_write = demote), no disk tier. Node A has G2 room for about one
 * chain:
 *
 *   evict:  ROUNDS times: a chain sealed, Evict G1 (its blocks come down
 *           into G2 and their values are copied out of their slots on the
 *           worker) and at once Evict G2 and the next chain. A slot held
 *           while its value is copied is neither dropped nor reused; were the
 *           hold broken, the next chain's demotion would take the slots Evict
 *           G2 freed, and a value would carry its bytes under this chain's
 *           key with a CRC32C of them that checks out. Node B reads every
 *           chain, and every block it finds must be byte for byte the one
 *           sealed under its hash; the first chain is whole (a later chain's
 *           demotion may find G2's only room held, and that Evict G1 drops
 *           what G2 could not take, unwritten: the counts are printed). Then,
 *           settled, Evict G2 empties G2 (a hold never released would keep
 *           its block there, off the LRUs) and the daemon's Check finds
 *           nothing wrong;
 *   reload: a chain of namespace "gone" demoted, and at once a reload that
 *           takes "gone" out of the configuration: G2 empties, Check is
 *           clean;
 *   stop:   a chain demoted and SIGTERM at once: the daemon exits 0 (under
 *           ASan: nothing used after it was freed, nothing leaked), and B
 *           reads what it wrote byte for byte.
 * Exits 77 without redis-server/redis-cli or without hiredis. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "kvconfig.h"

#if !KV_HAVE_HIREDIS
int main(void)
{
	SKIP("built without hiredis: no G4");
}
#else
#include "rcluster_harness.h"

#define BB 65536u
#define N 8
#define ROUNDS 12

static struct kvt_rc rc;
static char tmp[64], conf_arg[200];

static void write_conf(int with_gone)
{
	char path[160];
	FILE *f;
	unsigned uid = (unsigned)getuid();

	snprintf(path, sizeof(path), "%s/kvcached.conf", tmp);
	CHECK((f = fopen(path, "w")) != NULL);
	fprintf(f, "remote_seeds = %s\nremote_timeout = 2s\nremote_auth = off\n"
		"remote_fetch_timeout = 30s\nremote_write = demote\n\n", kvt_rc_seeds(&rc));
	fprintf(f, "[namespace dm]\nusers = %u\nremote = yes\n\n", uid);
	if (with_gone)
		fprintf(f, "[namespace gone]\nusers = %u\nremote = yes\n\n", uid);
	fclose(f);
	snprintf(conf_arg, sizeof(conf_arg), "--config=%s", path);
}

static void node_start(struct kvt_daemon *d)
{
	/* G2 of 640 KiB: slots of 68 KiB, about one chain of 8 */
	kvt_start(d, conf_arg, "--pool-size", "4MiB", "--segment-size", "1MiB", "--page-size",
		  "64KiB", "--host-tier-size", "640KiB", NULL);
	setenv("KVCACHED_SOCKET", d->sock, 1);
}

/* G4 writes once nothing is in flight (none may fail). */
static uint64_t writes_settled(const char *ns)
{
	for (int tries = 0;; tries++) {
		Kvcached__Response *rs = kvt_g4_stats(ns);
		uint64_t in = rs->stats->remote->inflight_bytes, w = rs->stats->remote->writes;

		CHECK_EQ(rs->stats->remote->write_errors, 0);
		kvcached__response__free_unpacked(rs, NULL);
		if (!in)
			return w;
		CHECK(tries < 60000);
		usleep(1000);
	}
}

/* Node A settled: Evict G2 leaves no block there, and Check is clean. */
static void g2_empties(const char *ns, const char *what)
{
	kvc_conn *c = kvt_connect(ns);
	struct kvt_tier t2;

	kvt_tiers_settle();
	writes_settled(ns);
	kvt_evict(c, KVCACHED__TIER__TIER_G2);
	kvt_tier(1, &t2);
	fprintf(stderr, "%s: G2 after Evict G2: %llu blocks, %llu bytes used\n", what,
		(unsigned long long)t2.blocks, (unsigned long long)t2.used);
	CHECK_EQ(t2.blocks, 0);
	CHECK_EQ(t2.used, 0);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c);
}

int main(void)
{
	struct kvt_daemon a, b;
	kvc_conn *c;
	uint64_t w0, w;
	int st;

	snprintf(tmp, sizeof(tmp), "/tmp/kvt-g4seal.XXXXXX");
	CHECK(mkdtemp(tmp) != NULL);
	kvt_rc_start(&rc, 3, 0, NULL);
	write_conf(1);
	node_start(&a);

	/* evict */
	w0 = writes_settled("dm");
	c = kvt_connect("dm");
	for (int r = 0; r < ROUNDS; r++) {
		kvt_seal_chain(c, kvt_pool(c, "p", BB), BB, N, 1000 * (uint64_t)(r + 1));
		kvt_evict_nowait(c, KVCACHED__TIER__TIER_G1);
		kvt_evict_nowait(c, KVCACHED__TIER__TIER_G2);
	}
	kvc_close(c);
	w = writes_settled("dm");
	fprintf(stderr, "evict: %d chains of %d, %llu G4 writes\n", ROUNDS, N,
		(unsigned long long)(w - w0));
	g2_empties("dm", "evict");
	node_start(&b);
	fprintf(stderr, "evict: node B finds, per chain:");
	for (int r = 0; r < ROUNDS; r++) {
		/* every block found checked byte for byte (kvt_lookup_held) */
		int k = kvt_lookup_chain("dm", "p", BB, N, 1000 * (uint64_t)(r + 1));

		fprintf(stderr, " %d", k);
		if (!r)
			CHECK_EQ(k, N);
	}
	fprintf(stderr, " of %d, each block right\n", N);
	kvt_stop(&b);

	/* reload */
	setenv("KVCACHED_SOCKET", a.sock, 1);
	c = kvt_connect("gone");
	kvt_seal_chain(c, kvt_pool(c, "p", BB), BB, N, 50000);
	kvt_evict_nowait(c, KVCACHED__TIER__TIER_G1);
	write_conf(0);
	CHECK(kill(a.pid, SIGHUP) == 0);
	kvc_close(c);
	g2_empties("dm", "reload");

	/* stop */
	c = kvt_connect("dm");
	kvt_seal_chain(c, kvt_pool(c, "p", BB), BB, N, 60000);
	kvt_evict_nowait(c, KVCACHED__TIER__TIER_G1);
	kvc_close(c);   /* else the drain waits drain_timeout for it */
	CHECK(kill(a.pid, SIGTERM) == 0);
	st = kvt_wait(a.pid);
	fprintf(stderr, "stop: SIGTERM under the demotion's G4 writes: exit status %d\n", st);
	CHECK_EQ(st, 0);
	node_start(&b);
	c = kvt_connect("dm");
	{
		int pool = kvt_pool(c, "p", BB);
		kvc_block blk[N];
		int k = kvt_lookup_held(c, pool, BB, N, 60000, blk);   /* bytes checked */

		fprintf(stderr, "stop: node B found %d of %d blocks written, each right\n", k, N);
		if (k)
			CHECK_EQ(kvc_release(c, blk, (size_t)k), 0);
	}
	kvc_close(c);
	kvt_stop(&b);
	kvt_rc_stop(&rc);
	rmdir(tmp);
	fprintf(stderr, "ok\n");
	return 0;
}
#endif
