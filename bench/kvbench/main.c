/* kvbench: latency and throughput figures of a running kvcached.
 *
 * Figures, never assertions: kvbench prints what it measured next to the
 * targets and exits 0 whatever the figures are (1 only when it could not
 * measure, e.g. no daemon). See docs/benchmarks.md for what each figure
 * means; scripts/bench starts the daemons and runs every section.
 *
 * Sections (--only picks some; default abcde, or f alone with --fill; g and
 * h only when asked for):
 *   a  the floor: a raw ping-pong over an AF_UNIX socketpair between two
 *      processes, with the request and response frame sizes of each op
 *      measured below (real protobuf frames, built with the generated code)
 *   b  alloc, seal and release of 1 block, three round trips, each timed
 *   c  the same with 16 and 256 blocks per request
 *   d  lookup of a 1,000-block chain sealed and cached beforehand
 *   e  1, 4 and 16 client processes, each its own connection, looping
 *      alloc+seal+release of 1 block for a fixed time
 *   f  --fill N: fill the pool with N cached 4 KiB blocks first, so that
 *      every alloc must evict; then alloc+seal+release of 1 block
 *   g  tier throughput (a daemon with --host-tier-size and --disk-path):
 *      per block size (256 KiB, 2 MiB, 8 MiB) a volume of written blocks
 *      moved G1 -> G2 (evict), G2 -> G3 (flush), G3 -> G1 (lookup), G1 ->
 *      G2 -> G1, in GB/s beside a memcpy floor and an fio floor on the file
 *      system of the daemon's disk (--disk-dir)
 *   h  the GPU data paths, in this process without a daemon (gpu.c):
 *      first-touch import+map, G1<->G2 copies beside a cuMemcpyAsync floor,
 *      the gather kernel against per-block copies
 *
 * Hashes are synthetic (a per-process random stream): distinct for every
 * seal, so the daemon never dedups. In a-f blocks are 4 KiB and never
 * written; in g every block is written with a pattern and checked after
 * each promotion.
 *
 * This file: the options and which sections run; kvbench.h says which file
 * holds each section. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "gpu.h"
#include "kvbench.h"
#include "units.h"

/* --- options -------------------------------------------------------------- */

const char *sock_path;
bool quick, json;
static char only[8] = "";
uint64_t fill_n;
int server_cpu = -1;
const char *disk_dir;
uint64_t tier_volume;
unsigned disk_depth = 64;

static const struct durations dur_default = { 0.5, 5.0, 4.0, 4.0, 4.0, 5.0 };
static const struct durations dur_quick = { 0.1, 1.0, 0.7, 0.7, 0.8, 1.5 };
struct durations D;

static bool want(char s)
{
	return strchr(only, s) != NULL;
}

/* --- output --------------------------------------------------------------- */

static void print_json(const struct utsname *u, long ncpu)
{
	size_t i;

	printf("{\"kvbench\": ");
	json_str(KV_VERSION);
	printf(", \"socket\": ");
	json_str(sock_path);
	printf(", \"quick\": %s, \"fill\": %" PRIu64 ", \"cpus\": %ld, \"kernel\": ",
	       quick ? "true" : "false", fill_n, ncpu);
	json_str(u->release);
	printf(",\n \"results\": [\n");
	for (i = 0; i < nrows; i++) {
		const struct row *r = &rows[i];
		char sec[2] = { r->section, 0 };
		double ratio = r->floor_p50 > 0 ? r->p50 / r->floor_p50 : NAN;

		printf("  {\"section\": ");
		json_str(sec);
		printf(", \"name\": ");
		json_str(r->name[0] == ' ' ? r->name + 2 : r->name);
		printf(", \"req_bytes\": %u, \"resp_bytes\": %u, \"samples\": %" PRIu64, r->req,
		       r->resp, r->n);
		json_num("p50_us", r->p50);
		json_num("p99_us", r->p99);
		if (r->p10 > 0)
			json_num("p10_us", r->p10);
		json_num("rate", r->ops);
		printf(", \"rate_unit\": ");
		json_str(r->ops_unit);
		json_num("floor_p50_us", r->floor_p50 > 0 ? r->floor_p50 : NAN);
		json_num("ratio", ratio);
		json_num("target_ratio", r->target > 0 ? r->target : NAN);
		if (r->target > 0)
			printf(", \"target_met\": %s", ratio <= r->target ? "true" : "false");
		json_num("evicted_pct", r->evicted);
		printf("}%s\n", i + 1 < nrows ? "," : "");
	}
	printf(" ]");
	tiers_print_json();
	printf("}\n");
}

/* This process's allowed CPUs as "0,2-3". */
static void cpus_str(char *buf, size_t len)
{
	cpu_set_t set;
	size_t used = 0;
	int c, start = -1;

	buf[0] = '\0';
	if (sched_getaffinity(0, sizeof(set), &set) < 0) {
		snprintf(buf, len, "?");
		return;
	}
	for (c = 0; c <= CPU_SETSIZE; c++) {
		bool in = c < CPU_SETSIZE && CPU_ISSET(c, &set);

		if (in && start < 0)
			start = c;
		if (!in && start >= 0 && used < len) {
			used += (size_t)snprintf(buf + used, len - used, "%s%d", used ? "," : "", start);
			if (c - 1 > start && used < len)
				used += (size_t)snprintf(buf + used, len - used, "-%d", c - 1);
			start = -1;
		}
	}
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: kvbench [OPTION]...\n"
		"Latency and throughput of a running kvcached, next to the floor of a raw\n"
		"AF_UNIX ping-pong with the same frame sizes. Prints figures, asserts nothing.\n\n"
		"  -s, --socket PATH  the daemon's socket (default: $KVCACHED_SOCKET, else\n"
		"                     /run/kvcached/kvcached.sock for root, else\n"
		"                     $XDG_RUNTIME_DIR/kvcached.sock)\n"
		"  -q, --quick        short runs (~10 s instead of ~60 s)\n"
		"  -j, --json         results as JSON on stdout (notes go to stderr)\n"
		"  -f, --fill N       fill the pool with N cached 4 KiB blocks first and\n"
		"                     measure alloc+seal+release on the full pool (section f)\n"
		"  -o, --only LIST    sections to run, e.g. 'abd' (default: abcde, or f\n"
		"                     with --fill; g and h only when listed):\n"
		"                       a floor  b single ops  c batches of 16, 256\n"
		"                       d lookup of 1,000  e 1/4/16 clients  f full pool\n"
		"                       g tier throughput (needs a daemon with G2 and G3)\n"
		"                       h GPU data paths (no daemon; text output only)\n"
		"  -c, --server-cpu N pin the floor's echo process to CPU N: give the CPU the\n"
		"                     daemon is pinned to, so that the floor and the daemon\n"
		"                     see the same placement (default: not pinned)\n"
		"  -d, --disk-dir DIR section g: a directory on the file system of the\n"
		"                     daemon's --disk-path, for the fio floor (fio writes and\n"
		"                     reads DIR/fio.tmp, then deletes it); without it, no\n"
		"                     floor for the disk rows\n"
		"  -V, --volume SIZE  section g: bytes moved per block size (default 1GiB,\n"
		"                     --quick 256MiB; capped to what the tiers can hold)\n"
		"  -D, --disk-queue-depth N  section g: fio's iodepth; give the daemon's\n"
		"                     --disk-queue-depth (default 64)\n"
		"  -h, --help         this text\n\n"
		"The daemon's pool needs room for a few thousand 4 KiB blocks (it evicts\n"
		"beyond that); section g wants a daemon of its own (it reads the tiers'\n"
		"global counters) with e.g. --pool-size 2GiB --host-tier-size 2GiB\n"
		"--disk-path DIR/g3 --disk-size 4GiB. scripts/bench starts daemons and runs\n"
		"every section.\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "quick", no_argument, NULL, 'q' },
		{ "json", no_argument, NULL, 'j' },
		{ "fill", required_argument, NULL, 'f' },
		{ "only", required_argument, NULL, 'o' },
		{ "server-cpu", required_argument, NULL, 'c' },
		{ "disk-dir", required_argument, NULL, 'd' },
		{ "volume", required_argument, NULL, 'V' },
		{ "disk-queue-depth", required_argument, NULL, 'D' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	static char sock_buf[108];
	char cpus[64], echo[32] = "the same CPUs";
	bool classic;
	struct bench_conn bc;
	struct utsname u;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	char *end;
	int o;

	while ((o = getopt_long(argc, argv, "s:qjf:o:c:d:V:D:h", opts, NULL)) != -1) {
		switch (o) {
		case 's':
			sock_path = optarg;
			break;
		case 'q':
			quick = true;
			break;
		case 'j':
			json = true;
			break;
		case 'f':
			errno = 0;
			fill_n = strtoull(optarg, &end, 10);
			if (errno || *end || !optarg[0] || optarg[0] == '-' || !fill_n)
				die("--fill: '%s' is not a positive count of blocks", optarg);
			break;
		case 'o':
			if (strlen(optarg) >= sizeof(only) || strspn(optarg, "abcdefgh") != strlen(optarg))
				die("--only: '%s': letters among a, b, c, d, e, f, g, h", optarg);
			snprintf(only, sizeof(only), "%s", optarg);
			break;
		case 'c':
			errno = 0;
			server_cpu = (int)strtol(optarg, &end, 10);
			if (errno || *end || !optarg[0] || server_cpu < 0 || server_cpu >= CPU_SETSIZE)
				die("--server-cpu: '%s' is not a CPU number", optarg);
			break;
		case 'd': {
			struct stat st;

			if (stat(optarg, &st) < 0 || !S_ISDIR(st.st_mode))
				die("--disk-dir: '%s' is not a directory", optarg);
			disk_dir = optarg;
			break;
		}
		case 'V':
			if (kv_parse_size(optarg, &tier_volume) < 0 || !tier_volume)
				die("--volume: '%s' is not a size like 256MiB or 1GiB", optarg);
			break;
		case 'D': {
			long v;

			errno = 0;
			v = strtol(optarg, &end, 10);
			if (errno || *end || !optarg[0] || v < 1 || v > 4096)
				die("--disk-queue-depth: '%s' is not a depth in 1..4096", optarg);
			disk_depth = (unsigned)v;
			break;
		}
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		usage(stderr);
		return 2;
	}
	if (!only[0])
		snprintf(only, sizeof(only), "%s", fill_n ? "f" : "abcde");
	if (want('f') && !fill_n)
		die("section f needs --fill N");
	if (!sock_path) {
		if (kvc_default_socket(sock_buf, sizeof(sock_buf)) < 0)
			die("the default socket path is too long");
		sock_path = sock_buf;
	}
	D = quick ? dur_quick : dur_default;
	signal(SIGPIPE, SIG_IGN);
	rng_seed();
	uname(&u);

	if (!strpbrk(only, "abcdefg")) {  /* h alone: no daemon */
		kvbench_gpu(quick);
		return 0;
	}
	classic = strpbrk(only, "abcdef") != NULL;
	bc_open(&bc, fill_n ? FILL_BATCH : CHAIN_LEN, "kvbench", classic);
	note("kvbench %s: %s, %ld CPUs, Linux %s, daemon backend %s, %s run", KV_VERSION,
	     sock_path, ncpu, u.release, kvc_conn_hello(bc.c)->backend, quick ? "quick" : "full");
	cpus_str(cpus, sizeof(cpus));
	if (server_cpu >= 0)
		snprintf(echo, sizeof(echo), "CPU %d", server_cpu);
	if (classic) {
		note("kvbench on CPU %s, the floor's echo process on %s", cpus, echo);
		note("pool \"%s\" of 4 KiB blocks (id %d); frames in bytes with the 8-byte header; "
		     "rates are serial (1 / mean) except in (e)", POOL_NAME, bc.pool);
		print_header();
		rep_init(&bc);
	} else {
		note("kvbench on CPU %s", cpus);
	}
	if (want('a')) {
		static const uint32_t ns[] = { 1, 16, 256 };
		bool alone = !strpbrk(only, "bcdef");  /* --only a: every floor */

		print_section("(a) floor: AF_UNIX socketpair ping-pong between two processes");
		for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++) {
			if (!alone && (ns[i] == 1 ? !strpbrk(only, "bef") : !want('c')))
				continue;
			floor_op(OP_ALLOC, ns[i]);
			floor_op(OP_SEAL, ns[i]);
			floor_op(OP_RELEASE, ns[i]);
			floor_cycle(ns[i]);
		}
		if (alone || want('d')) {
			floor_op(OP_LOOKUP, CHAIN_LEN);
			floor_op(OP_RELEASE, CHAIN_LEN);
		}
	}
	if (want('b')) {
		print_section("(b) 1 block: alloc, seal, release (three round trips)");
		section_cycles(&bc, 'b', 1, 1.5);
	}
	if (want('c')) {
		print_section("(c) batches: alloc, seal, release of 16 and 256 blocks per request");
		section_cycles(&bc, 'c', 16, 0);
		section_cycles(&bc, 'c', 256, 3.0);
	}
	if (want('d')) {
		print_section("(d) lookup of a cached 1,000-block chain");
		section_lookup(&bc);
		raw_lookup_rows(&bc);
	}
	if (want('e')) {
		static const int n[] = { 1, 4, 16 };

		print_section("(e) client processes, each its own connection (aggregate rate)");
		for (size_t i = 0; i < sizeof(n) / sizeof(n[0]); i++)
			section_clients(&bc, n[i]);
	}
	if (want('f')) {
		print_section("(f) alloc+seal+release with the pool full of cached blocks");
		section_fill(&bc);
	}
	if (want('g'))
		section_tiers(bc.c);
	bc_close(&bc);
	if (json)
		print_json(&u, ncpu);
	else if (want('h'))
		kvbench_gpu(quick);
	return 0;
}
