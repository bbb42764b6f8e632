/* kvcached: the node's KV-cache memory daemon. Parses the command line and
 * runs the server; see docs/operations.md. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frame.h"
#include "log.h"
#include "fault.h"
#include "server.h"

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: kvcached [OPTION]...\n"
		"The KV-cache memory daemon: owns the node's KV memory as a page pool and\n"
		"serves it to inference workers over a Unix socket.\n\n"
		"  -s, --socket PATH        socket to listen on (default: $KVCACHED_SOCKET, else\n"
		"                           /run/kvcached/kvcached.sock for root, else\n"
		"                           $XDG_RUNTIME_DIR/kvcached.sock)\n"
		"      --socket-mode MODE   octal permissions of the socket (default 0660)\n"
		"  -b, --backend NAME       memory backend: host (default) or cuda (every\n"
		"                           visible GPU, --pool-size on each)\n"
		"  -p, --pool-size SIZE     KV memory per device (default 1GiB)\n"
		"      --segment-size SIZE  unit of export to clients (default 1GiB, at most the pool)\n"
		"      --page-size SIZE     unit of assignment to pools (default 2MiB)\n"
		"      --max-frame SIZE     largest protocol frame (default 4MiB)\n"
		"      --max-batch N        most blocks or hashes per request (default 65536)\n"
		"  -l, --log-level LEVEL    err, warn, info (default) or debug\n"
		"      --host-tier-size SIZE   G2: host DRAM for demoted blocks (default 0: none)\n"
		"      --disk-path PATH     G3: file or block device for demoted blocks (default\n"
		"                           none; needs a host tier)\n"
		"      --disk-size SIZE     G3 size (a file is preallocated to it)\n"
		"      --disk-index PATH    G3 index journal (default DISK-PATH.idx)\n"
		"      --disk-queue-depth N G3 I/Os in flight (default 64)\n"
		"      --demote-low PCT     demote G1 blocks when less than PCT%% of a device is\n"
		"                           free (default 10)...\n"
		"      --demote-high PCT    ...until PCT%% is free (default 20)\n"
		"      --writeback-low PCT  write G2 blocks to G3 when less than PCT%% of G2 is\n"
		"                           clean or free (default 10)...\n"
		"      --writeback-high PCT ...until PCT%% is (default 25)\n"
		"  -h, --help               this text\n"
		"  -V, --version            the version\n\n"
		"SIZE takes a unit: 4096, 64KiB, 2MiB, 1GiB (K, M, G, T and KB, MB... are\n"
		"binary too). The pool size must be a multiple of the segment size, the\n"
		"segment size a multiple of the page size, the page size of 4KiB.\n");
}

/* Parses "64GiB", "2M", "4096". Returns 0 or -EINVAL. */
static int parse_size(const char *s, uint64_t *out)
{
	static const char *units[] = { "K", "M", "G", "T" };
	char *end;
	unsigned long long v;
	uint64_t mul = 1;
	size_t i;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || s[0] == '-')
		return -EINVAL;
	if (*end) {
		for (i = 0; i < 4; i++) {
			if (!strncasecmp(end, units[i], 1) &&
			    (!end[1] || !strcasecmp(end + 1, "iB") || !strcasecmp(end + 1, "B"))) {
				mul = 1ull << (10 * (i + 1));
				break;
			}
		}
		if (i == 4)
			return -EINVAL;
	}
	if (v > UINT64_MAX / mul)
		return -EINVAL;
	*out = v * mul;
	return 0;
}

static int bad(const char *opt, const char *val, const char *allowed)
{
	fprintf(stderr, "kvcached: bad value '%s' for %s: %s\n", val, opt, allowed);
	return 2;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "socket-mode", required_argument, NULL, 'm' },
		{ "backend", required_argument, NULL, 'b' },
		{ "pool-size", required_argument, NULL, 'p' },
		{ "segment-size", required_argument, NULL, 'S' },
		{ "page-size", required_argument, NULL, 'P' },
		{ "max-frame", required_argument, NULL, 'F' },
		{ "max-batch", required_argument, NULL, 'B' },
		{ "log-level", required_argument, NULL, 'l' },
		{ "host-tier-size", required_argument, NULL, 1000 },
		{ "disk-path", required_argument, NULL, 1001 },
		{ "disk-size", required_argument, NULL, 1002 },
		{ "disk-index", required_argument, NULL, 1003 },
		{ "disk-queue-depth", required_argument, NULL, 1004 },
		{ "demote-low", required_argument, NULL, 1005 },
		{ "demote-high", required_argument, NULL, 1006 },
		{ "writeback-low", required_argument, NULL, 1007 },
		{ "writeback-high", required_argument, NULL, 1008 },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 },
	};
	struct kv_config cfg;
	struct kv_server srv;
	int c, r, seg_set = 0;
	uint64_t v;
	char *end;

	kv_config_defaults(&cfg);
	if (kv_socket_default(cfg.socket_path, sizeof(cfg.socket_path)) < 0)
		return bad("KVCACHED_SOCKET", getenv("KVCACHED_SOCKET"), "path too long");
	while ((c = getopt_long(argc, argv, "s:b:p:l:hV", opts, NULL)) != -1) {
		switch (c) {
		case 's':
			if (strlen(optarg) >= sizeof(cfg.socket_path) || !optarg[0])
				return bad("--socket", optarg, "a path of 1..107 bytes");
			snprintf(cfg.socket_path, sizeof(cfg.socket_path), "%s", optarg);
			break;
		case 'm':
			cfg.socket_mode = (unsigned)strtoul(optarg, &end, 8);
			if (*end || !optarg[0] || cfg.socket_mode > 0777)
				return bad("--socket-mode", optarg, "an octal mode like 0660");
			break;
		case 'b':
			if (strcmp(optarg, "host") && strcmp(optarg, "cuda"))
				return bad("--backend", optarg, "host or cuda");
			snprintf(cfg.backend, sizeof(cfg.backend), "%s", optarg);
			break;
		case 'p':
			if (parse_size(optarg, &cfg.pool_bytes) < 0 || !cfg.pool_bytes)
				return bad("--pool-size", optarg, "a size like 8GiB");
			break;
		case 'S':
			if (parse_size(optarg, &cfg.segment_bytes) < 0 || !cfg.segment_bytes)
				return bad("--segment-size", optarg, "a size like 1GiB");
			seg_set = 1;
			break;
		case 'P':
			if (parse_size(optarg, &cfg.page_bytes) < 0 || !cfg.page_bytes ||
			    cfg.page_bytes % 4096)
				return bad("--page-size", optarg, "a multiple of 4KiB like 2MiB");
			break;
		case 'F':
			if (parse_size(optarg, &v) < 0 || v < 4096 || v > (1u << 30))
				return bad("--max-frame", optarg, "4KiB..1GiB");
			cfg.max_frame = (uint32_t)v;
			break;
		case 'B':
			v = strtoull(optarg, &end, 10);
			if (*end || !optarg[0] || v < 1 || v > (1u << 20))
				return bad("--max-batch", optarg, "1..1048576");
			cfg.max_batch = (uint32_t)v;
			break;
		case 'l':
			cfg.log_level = kv_log_parse_level(optarg);
			if (cfg.log_level < 0)
				return bad("--log-level", optarg, "err, warn, info or debug");
			break;
		case 1000:
			if (parse_size(optarg, &cfg.tiers.host_bytes) < 0)
				return bad("--host-tier-size", optarg, "a size like 16GiB, or 0");
			break;
		case 1001:
		case 1003: {
			char *dst = c == 1001 ? cfg.tiers.disk_path : cfg.tiers.disk_index;

			if (strlen(optarg) >= sizeof(cfg.tiers.disk_path))
				return bad(c == 1001 ? "--disk-path" : "--disk-index", optarg,
					   "a path of at most 255 bytes");
			snprintf(dst, sizeof(cfg.tiers.disk_path), "%s", optarg);
			break;
		}
		case 1002:
			if (parse_size(optarg, &cfg.tiers.disk_bytes) < 0)
				return bad("--disk-size", optarg, "a size like 512GiB");
			break;
		case 1004:
			v = strtoull(optarg, &end, 10);
			if (*end || !optarg[0] || v < 1 || v > 4096)
				return bad("--disk-queue-depth", optarg, "1..4096");
			cfg.tiers.queue_depth = (unsigned)v;
			break;
		case 1005: case 1006: case 1007: case 1008: {
			static const char *names[] = { "--demote-low", "--demote-high", "--writeback-low",
						       "--writeback-high" };
			unsigned *dst[] = { &cfg.tiers.g1_low, &cfg.tiers.g1_high, &cfg.tiers.g2_low,
					    &cfg.tiers.g2_high };

			v = strtoull(optarg, &end, 10);
			if (*end == '%')
				end++;
			if (*end || !optarg[0] || v > 100)
				return bad(names[c - 1005], optarg, "a percentage 0..100");
			*dst[c - 1005] = (unsigned)v;
			break;
		}
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("kvcached %s\n", KV_VERSION);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvcached: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	/* A pool smaller than the default segment is one segment. */
	if (!seg_set && cfg.segment_bytes > cfg.pool_bytes)
		cfg.segment_bytes = cfg.pool_bytes;
	if (cfg.segment_bytes % cfg.page_bytes || cfg.pool_bytes % cfg.segment_bytes) {
		fprintf(stderr, "kvcached: the pool size (%llu) must be a multiple of the segment "
				"size (%llu), and that of the page size (%llu)\n",
			(unsigned long long)cfg.pool_bytes, (unsigned long long)cfg.segment_bytes,
			(unsigned long long)cfg.page_bytes);
		return 2;
	}
	if (cfg.pool_bytes / cfg.page_bytes > (1u << 20)) {
		fprintf(stderr, "kvcached: %llu pages: at most 1048576 pages per device; use a "
				"larger --page-size\n",
			(unsigned long long)(cfg.pool_bytes / cfg.page_bytes));
		return 2;
	}
	if ((uint64_t)cfg.max_batch * 40 + 4096 > cfg.max_frame) {
		fprintf(stderr, "kvcached: --max-frame %u is too small for --max-batch %u "
				"(needs %llu)\n", cfg.max_frame, cfg.max_batch,
			(unsigned long long)cfg.max_batch * 40 + 4096);
		return 2;
	}
	if (cfg.tiers.disk_path[0] && !cfg.tiers.disk_bytes) {
		fprintf(stderr, "kvcached: --disk-path needs --disk-size\n");
		return 2;
	}
	if (getenv("KVCACHED_FAULTS")) {
		char err[200];

		if (kv_fault_parse(getenv("KVCACHED_FAULTS"), err, sizeof(err)) < 0)
			return bad("KVCACHED_FAULTS", getenv("KVCACHED_FAULTS"), err);
	}
	kv_log_level = cfg.log_level;
	r = kv_server_init(&srv, &cfg);
	if (r == 0)
		r = kv_server_run(&srv);
	kv_server_fini(&srv);
	if (r < 0) {
		kv_err("exiting: %s", strerror(-r));
		return 1;
	}
	kv_info("stopped");
	return 0;
}
