/* The configuration table and its parsers (daemon/config.c): every row is
 * well formed and its default parses, every value formats back to itself,
 * each type takes what kvcached.conf(5) says and refuses the rest with a
 * message naming the key, the value and what is allowed, and a reload copies
 * only reloadable keys. */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "config.h"

static struct kv_config c;
static char err[512];

static const struct kv_cfg_key *key(const char *name)
{
	const struct kv_cfg_key *k = kv_config_key(name);

	if (!k) {
		fprintf(stderr, "no key %s\n", name);
		exit(1);
	}
	return k;
}

static int set(const char *name, const char *v)
{
	err[0] = 0;
	return kv_config_set(&c, key(name), v, err, sizeof(err));
}

static void bad(const char *name, const char *v)
{
	struct kv_config before = c;

	if (set(name, v) != -EINVAL) {
		fprintf(stderr, "%s = '%s' was accepted\n", name, v);
		exit(1);
	}
	/* The message names the key, the value and what is allowed. */
	if (!strstr(err, name) || !strstr(err, v) || !strstr(err, "allowed")) {
		fprintf(stderr, "message for %s = '%s': %s\n", name, v, err);
		exit(1);
	}
	CHECK(!memcmp(&before, &c, sizeof(c)));
}

static int reported, applied;

static void report(void *ctx, const struct kv_cfg_key *k, const char *old, const char *now,
		   int app)
{
	(void)ctx;
	(void)old;
	(void)now;
	reported++;
	applied += app;
	CHECK(app == !!(k->flags & KV_CFG_RELOAD));
}

int main(void)
{
	struct kv_config a, b;
	char v[512];
	size_t i, j;

	/* The table: unique, well-formed names, a doc, defaults that parse. */
	for (i = 0; i < kv_cfg_nkeys; i++) {
		const struct kv_cfg_key *k = &kv_cfg_keys[i];

		CHECK(k->name[0] && k->doc[0] && k->def);
		for (j = 0; k->name[j]; j++)
			CHECK((k->name[j] >= 'a' && k->name[j] <= 'z') || k->name[j] == '_');
		for (j = i + 1; j < kv_cfg_nkeys; j++)
			CHECK(strcmp(k->name, kv_cfg_keys[j].name));
		CHECK(k->offset + k->size <= sizeof(struct kv_config));
		CHECK(k->type != KV_CFG_CHOICE || k->choices);
		CHECK(kv_config_key(k->name) == k);
	}
	CHECK(kv_config_key("pool-size") == kv_config_key("pool_size"));
	CHECK(kv_config_key("pool") == NULL && kv_config_key("pool_size_x") == NULL);

	/* Every value formats to what parses back to the same value. */
	kv_config_defaults(&c);
	CHECK(kv_config_finish(&c, err, sizeof(err)) == 0);
	for (i = 0; i < kv_cfg_nkeys; i++) {
		const struct kv_cfg_key *k = &kv_cfg_keys[i];

		a = c;
		kv_config_format(&c, k, v, sizeof(v));
		CHECK(kv_config_set(&a, k, v, err, sizeof(err)) == 0);
		CHECK(!memcmp((char *)&a + k->offset, (char *)&c + k->offset, k->size) ||
		      k->type == KV_CFG_STRING || k->type == KV_CFG_GROUP ||
		      k->type == KV_CFG_CHOICE);
	}

	/* Sizes. */
	kv_config_defaults(&c);
	CHECK(set("page_size", "4096") == 0 && c.page_bytes == 4096);
	CHECK(set("page_size", "64k") == 0 && c.page_bytes == 65536);
	CHECK(set("page_size", "2MiB") == 0 && c.page_bytes == 2u << 20);
	CHECK(set("page_size", "1GB") == 0 && c.page_bytes == 1u << 30);
	CHECK(set("max_frame", "1GiB") == 0 && c.max_frame == 1u << 30);
	bad("page_size", "12XB");
	bad("page_size", "-4096");
	bad("page_size", "2 MiB");
	bad("page_size", "1024");          /* under 4KiB */
	bad("max_frame", "2GiB");          /* over 1GiB */
	bad("pool_size", "99999999999T");  /* overflows */
	/* Percentages: of RAM for the host backend. */
	kv_config_defaults(&c);
	CHECK(set("pool_size", "12.5%") == 0 && set("segment_size", "64MiB") == 0);
	CHECK(kv_config_finish(&c, err, sizeof(err)) == 0);
	CHECK(c.pool_bytes > 0 && c.pool_bytes % (64u << 20) == 0);
	bad("pool_size", "150%");
	bad("pool_size", "0%");
	bad("pool_size", "1.234%");
	bad("pool_size", "%");
	/* Numbers, strings, choices, modes, groups, booleans, durations, levels. */
	kv_config_defaults(&c);
	CHECK(set("max_batch", "1") == 0 && c.max_batch == 1);
	bad("max_batch", "0");
	bad("max_batch", "1048577");
	bad("max_batch", "12abc");
	CHECK(c.max_block_refs == 1u << 30);
	CHECK(set("max_block_refs", "2147483647") == 0 && c.max_block_refs == 0x7fffffffu);
	bad("max_block_refs", "2147483648");
	bad("max_block_refs", "0");
	memset(v, 'x', 200);
	v[200] = 0;
	bad("socket", v);
	CHECK(set("socket", "") == 0 && c.socket_path[0] == 0);
	CHECK(set("backend", "host") == 0);
	bad("backend", "gpu");
	bad("log_target", "syslog");
	CHECK(set("log_target", "journal") == 0 && !strcmp(c.log_target, "journal"));
	CHECK(set("socket_mode", "0640") == 0 && c.socket_mode == 0640);
	CHECK(set("socket_mode", "600") == 0 && c.socket_mode == 0600);
	bad("socket_mode", "0999");
	bad("socket_mode", "01777");
	CHECK(set("socket_group", "0") == 0 && set("socket_group", "root") == 0);
	bad("socket_group", "no-such-group-kvt");
	CHECK(set("worker_socket_admin", "no") == 0 && c.worker_socket_admin == 0);
	CHECK(set("worker_socket_admin", "On") == 0 && c.worker_socket_admin == 1);
	bad("worker_socket_admin", "maybe");
	CHECK(set("drain_timeout", "1.5s") == 0 && c.drain_timeout_ms == 1500);
	CHECK(set("drain_timeout", "500ms") == 0 && c.drain_timeout_ms == 500);
	CHECK(set("drain_timeout", "2m") == 0 && c.drain_timeout_ms == 120000);
	CHECK(set("drain_timeout", "1h") == 0 && c.drain_timeout_ms == 3600000);
	CHECK(set("drain_timeout", "3") == 0 && c.drain_timeout_ms == 3000);
	CHECK(set("drain_timeout", "0") == 0 && c.drain_timeout_ms == 0);
	bad("drain_timeout", "5 parsecs");
	bad("drain_timeout", "48h");
	bad("drain_timeout", "-1s");
	CHECK(set("log_level", "debug") == 0 && c.log_level == 7);
	CHECK(set("log_level", "4") == 0 && c.log_level == 4);
	bad("log_level", "loud");

	/* Rules between keys. */
	kv_config_defaults(&c);
	CHECK(set("pool_size", "64MiB") == 0 && set("segment_size", "48MiB") == 0);
	CHECK(kv_config_finish(&c, err, sizeof(err)) == -EINVAL && strstr(err, "multiple"));
	kv_config_defaults(&c);
	CHECK(set("max_batch", "1000000") == 0 && set("max_frame", "4MiB") == 0);
	CHECK(kv_config_finish(&c, err, sizeof(err)) == -EINVAL && strstr(err, "max_frame"));
	kv_config_defaults(&c);
	CHECK(set("socket", "/tmp/x.sock") == 0 && set("admin_socket", "/tmp/x.sock") == 0);
	CHECK(kv_config_finish(&c, err, sizeof(err)) == -EINVAL && strstr(err, "admin_socket"));
	kv_config_defaults(&c);
	CHECK(set("socket", "/tmp/x.sock") == 0);
	unsetenv("KVCACHED_ADMIN_SOCKET");
	CHECK(kv_config_finish(&c, err, sizeof(err)) == 0);
	CHECK(!strcmp(c.admin_socket_path, "/tmp/x-admin.sock"));
	/* The default segment: the pool / 64 (1GiB / 64 = 16MiB), whole pages,
	 * dividing the pool; at most 1GiB; at least a page. */
	CHECK(c.segment_bytes == 16u << 20);
	kv_config_defaults(&c);
	CHECK(set("pool_size", "96GiB") == 0 && kv_config_finish(&c, err, sizeof(err)) == 0);
	CHECK(c.segment_bytes == 1u << 30);
	kv_config_defaults(&c);
	CHECK(set("pool_size", "6MiB") == 0 && kv_config_finish(&c, err, sizeof(err)) == 0);
	CHECK(c.segment_bytes == 2u << 20);
	kv_config_defaults(&c);
	CHECK(set("pool_size", "1000MiB") == 0 && kv_config_finish(&c, err, sizeof(err)) == 0);
	CHECK(c.segment_bytes == 10u << 20 && c.pool_bytes % c.segment_bytes == 0);
	/* On the cuda backend, whole 2MiB (the VMM granularity) as well: a 64th
	 * of 64MiB would be 1MiB, and a 2MiB pool of 128KiB pages one page. */
	kv_config_defaults(&c);
	CHECK(set("backend", "cuda") == 0 && set("pool_size", "64MiB") == 0 &&
	      kv_config_finish(&c, err, sizeof(err)) == 0);
	CHECK(c.segment_bytes == 2u << 20);
	kv_config_defaults(&c);
	CHECK(set("backend", "cuda") == 0 && set("pool_size", "2MiB") == 0 &&
	      set("page_size", "128KiB") == 0 && kv_config_finish(&c, err, sizeof(err)) == 0);
	CHECK(c.segment_bytes == 2u << 20);
	kv_config_defaults(&c);
	CHECK(set("backend", "cuda") == 0 && set("pool_size", "1000MiB") == 0 &&
	      set("page_size", "3MiB") == 0 && kv_config_finish(&c, err, sizeof(err)) != 0);
	kv_config_defaults(&c);
	CHECK(set("backend", "cuda") == 0 && set("pool_size", "960MiB") == 0 &&
	      set("page_size", "3MiB") == 0 && kv_config_finish(&c, err, sizeof(err)) == 0);
	CHECK(c.segment_bytes == 12u << 20);

	/* A reload copies the reloadable keys and reports the others. */
	kv_config_defaults(&a);
	CHECK(kv_config_finish(&a, err, sizeof(err)) == 0);
	b = a;
	b.log_level = 7;
	b.drain_timeout_ms = 1;
	b.pool_bytes *= 2;
	snprintf(b.log_target, sizeof(b.log_target), "stderr");
	CHECK(kv_config_reload(&a, &b, report, NULL) == 4);
	CHECK(reported == 4 && applied == 3);
	CHECK(a.log_level == 7 && a.drain_timeout_ms == 1 && !strcmp(a.log_target, "stderr"));
	CHECK(a.pool_bytes == b.pool_bytes / 2);
	CHECK(kv_config_reload(&a, &a, report, NULL) == 0);
	return 0;
}
