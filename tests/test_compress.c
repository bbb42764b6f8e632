/* Compress on demote (compress = fp8_e4m3 | fp8_e5m2), with a real daemon
 * on the host backend, a real disk file and io_uring:
 *   - FP16 and BF16 pools of a compressing namespace: blocks of known values
 *     sealed, demoted to G2 (then written to G3 and dropped from G2), looked
 *     up by their original hashes and promoted: every element is what the C
 *     reference's quantize + dequantize gives (so within docs/kernels.md's
 *     error), which the test checks too; stats show the bytes stored and
 *     saved, the slots on disk carry the format in their flags;
 *   - a pool of another dtype in that namespace, and a pool of a namespace
 *     without compress, stay raw: bytes identical, flags 0, nothing counted;
 *   - kill -9 and a restart: the compressed G3 slots and the raw ones are
 *     found and read again (warm restart);
 *   - a byte flipped in a compressed slot's payload: a checksum failure and
 *     a miss, never garbage;
 *   - the same trips with fp8_e5m2: its round trip, its bound;
 *   - a demotion copy that fails on the compressed path: the blocks stay in
 *     G1, untouched; a compressed slot's read that fails: a miss, counted.
 * In the gpu suite (KVT_BACKEND=cuda) the same cases run on the cuda
 * backend, where the device kernels quantize during the D2H copy and
 * dequantize during the H2D copy (backend_cuda_quant.h): every element must
 * be the C reference's round trip, so the kernels' bytes are checked
 * through the whole daemon path; each case in a child process (as
 * test_tiers does), and the sizes cuda allows (2 MiB segments, 128 KiB
 * pages). */
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"
#include "fp8.h"
#include "harness.h"
#include "quant.h"

#define BB 16384u          /* block bytes: 8192 two-byte elements */
#define NEL (BB / 2)
#define N 4                /* blocks per chain */

static char dir[64], disk[128], conf_arg[200];

static void start(struct kvt_daemon *d, int restart)
{
	/* cuda: its segments are at least 2 MiB; the same blocks and chains. */
	const char *pool = kvt_cuda() ? "2MiB" : "1MiB", *page = kvt_cuda() ? "128KiB" : "64KiB";
	const char *g2 = kvt_cuda() ? "2MiB" : "1MiB", *g3 = kvt_cuda() ? "8MiB" : "4MiB";

	if (restart)
		kvt_restart(d, "--pool-size", pool, "--page-size", page, "--host-tier-size", g2,
			    "--disk-path", disk, "--disk-size", g3, conf_arg, NULL);
	else
		kvt_start(d, "--pool-size", pool, "--page-size", page, "--host-tier-size", g2,
			  "--disk-path", disk, "--disk-size", g3, conf_arg, NULL);
}

/* Block contents: values of typical magnitude 1 with a few outliers (as
 * key caches have), some zeros and tiny ones, in FP16 or BF16. */
static void values(enum kv_dtype t, uint64_t seed, uint16_t *out)
{
	uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;

	for (uint32_t i = 0; i < NEL; i++) {
		float x;

		s = s * 6364136223846793005ull + 1442695040888963407ull;
		x = (float)((int32_t)(s >> 33) % 20000) / 10000.0f;  /* [-2, 2] */
		if (i % 128 == 7)
			x *= 40.0f;           /* an outlier channel */
		else if (i % 97 == 3)
			x = 0.0f;
		else if (i % 89 == 5)
			x *= 1e-6f;
		out[i] = t == KV_DTYPE_F16 ? kv_f32_to_f16(x) : kv_f32_to_bf16(x);
	}
}

static float to_f32(enum kv_dtype t, uint16_t v)
{
	return t == KV_DTYPE_F16 ? kv_f16_to_f32(v) : kv_bf16_to_f32(v);
}

/* What a block of these values is after a trip through a compressed tier:
 * the reference quantizer's round trip, with a group per KV_QUANT_GROUP. */
static void expected(enum kv_qfmt f, enum kv_dtype t, const uint16_t *in, uint16_t *out)
{
	size_t qn = kv_quant_bytes(NEL, KV_QUANT_GROUP);
	uint8_t *q = malloc(qn);

	CHECK(q != NULL);
	CHECK_EQ(kv_qfmt_quant_ref(f, t, in, NEL, KV_QUANT_GROUP, q, qn), 0);
	CHECK_EQ(kv_qfmt_dequant_ref(f, t, q, qn, NEL, KV_QUANT_GROUP, out), 0);
	free(q);
}

/* docs/kernels.md's bound: E4M3 keeps 3 mantissa bits, so a value in its
 * normal range (|x| >= 2^-6 * scale) comes back within 2^-4 of itself, plus
 * the element type's own rounding (2^-8 for BF16); E5M2 keeps 2: 2^-3, from
 * 2^-14 * scale up (scale = amax / 57344). */
static void check_error(enum kv_qfmt f, enum kv_dtype t, const uint16_t *in, const uint16_t *got)
{
	float max = f == KV_QFMT_E4M3 ? 448.0f : 57344.0f, rel = f == KV_QFMT_E4M3 ? 0x1p-4f : 0x1p-3f;
	float norm = f == KV_QFMT_E4M3 ? 0x1p-6f : 0x1p-14f, sub = f == KV_QFMT_E4M3 ? 0x1p-9f : 0x1p-16f;

	for (uint32_t g = 0; g < NEL; g += KV_QUANT_GROUP) {
		float amax = 0;

		for (uint32_t i = g; i < g + KV_QUANT_GROUP; i++)
			if (fabsf(to_f32(t, in[i])) > amax)
				amax = fabsf(to_f32(t, in[i]));
		for (uint32_t i = g; i < g + KV_QUANT_GROUP; i++) {
			float x = to_f32(t, in[i]), y = to_f32(t, got[i]);

			if (fabsf(x) >= amax / max * norm)
				CHECK(fabsf(y - x) <=
				      fabsf(x) * (rel + 0x1p-8f) * 1.01f + 0x1p-25f);  /* FP16 subnormals */
			else  /* subnormals: half a step of the smallest times the scale */
				CHECK(fabsf(y - x) <= amax / max * sub * 1.01f + 0x1p-25f);
		}
	}
}

static const char *const pool_names[] = { "f16", "bf16", "i8" };
static const char *const dtypes[] = { "fp16", "bf16", "int8" };

static int reg(kvc_conn *c, int which)
{
	struct kvc_pool_desc d = { .name = pool_names[which], .block_bytes = BB, .block_tokens = 16,
				   .dtype = dtypes[which], .layout = "test", .layout_len = 4 };
	int id = kvc_register_pool(c, &d);

	if (id < 0)
		fprintf(stderr, "register %s: %s: %s\n", pool_names[which], kvc_strerror(id),
			kvc_last_error(c));
	CHECK(id >= 0);
	return id;
}

static enum kv_dtype dtype_of(int which)
{
	return which == 0 ? KV_DTYPE_F16 : KV_DTYPE_BF16;
}

/* Seals chain base (block i: the values of seed base + i) in pool which. */
static void put_chain(kvc_conn *c, int which, uint64_t base)
{
	int pool = reg(c, which);
	uint16_t v[NEL];
	kvc_block b[N];
	kvc_hash h[N];

	CHECK_EQ(kvc_alloc(c, pool, N, b), N);
	for (int i = 0; i < N; i++) {
		if (which == 2)
			kvt_mem_fill(c, kvc_block_ptr(c, b[i]), BB, base + (uint64_t)i);
		else {
			values(dtype_of(which), base + (uint64_t)i, v);
			kvt_mem_write(c, kvc_block_ptr(c, b[i]), v, BB);
		}
		h[i] = kvt_hash(base + (uint64_t)i);
	}
	CHECK_EQ(kvc_seal(c, pool, b, h, N, b), N);
	CHECK_EQ(kvc_release(c, b, N), 0);
}

/* Looks chain base up by its original hashes; checks every block found:
 * comp (a KV_QFMT_*): as that format's round trip leaves it (and within the
 * documented error); 0: identical. Returns how many hit. */
static int get_chain(kvc_conn *c, int which, uint64_t base, int comp)
{
	int pool = reg(c, which), k;
	uint16_t v[NEL], want[NEL], got[NEL];
	kvc_block b[N];
	kvc_hash h[N];

	for (int i = 0; i < N; i++)
		h[i] = kvt_hash(base + (uint64_t)i);
	k = kvc_lookup(c, pool, h, N, b);
	CHECK(k >= 0);
	for (int i = 0; i < k; i++) {
		if (which == 2) {
			CHECK(kvt_mem_verify(c, kvc_block_ptr(c, b[i]), BB, base + (uint64_t)i));
			continue;
		}
		values(dtype_of(which), base + (uint64_t)i, v);
		kvt_mem_read(c, got, kvc_block_ptr(c, b[i]), BB);
		if (comp) {
			expected((enum kv_qfmt)comp, dtype_of(which), v, want);
			CHECK(memcmp(got, want, BB) == 0);
			CHECK(memcmp(got, v, BB) != 0);  /* it did go through FP8 */
			check_error((enum kv_qfmt)comp, dtype_of(which), v, got);
		} else {
			CHECK(memcmp(got, v, BB) == 0);
		}
	}
	if (k)
		CHECK_EQ(kvc_release(c, b, (size_t)k), 0);
	return k;
}

/* Every cached block to G2, then written to G3 and dropped from G2. */
static void all_to_g3(kvc_conn *a)
{
	struct kvt_tier t2;

	kvt_evict(a, KVCACHED__TIER__TIER_G1);
	kvt_flush(a);
	kvt_evict(a, KVCACHED__TIER__TIER_G2);
	kvt_tier(1, &t2);
	CHECK_EQ(t2.blocks, 0);
}

static void write_conf(void)
{
	char path[160];
	FILE *f;
	unsigned uid = (unsigned)getuid();

	snprintf(path, sizeof(path), "%s/kvcached.conf", dir);
	CHECK((f = fopen(path, "w")) != NULL);
	fprintf(f, "[namespace cz]\nusers = %u\ncompress = fp8_e4m3\n\n", uid);
	fprintf(f, "[namespace raw]\nusers = %u\ncompress = off\n\n", uid);
	fprintf(f, "[namespace c5]\nusers = %u\ncompress = fp8_e5m2\n", uid);
	fclose(f);
	snprintf(conf_arg, sizeof(conf_arg), "--config=%s", path);
}

static void rm_disk(void)
{
	char idx[160];

	unlink(disk);
	snprintf(idx, sizeof(idx), "%s.idx", disk);
	unlink(idx);
}

/* A compressed G3 slot whose scale is one the quantizer never writes (NaN,
 * infinity, zero, negative), its checksums recomputed as any writer other
 * than the daemon could: a miss and a checksum failure, never served (main
 * before issue 36 dequantized a block of NaN). The head of each chain is
 * spoilt, so the whole chain misses. */
static void bad_scales(kvc_conn *cz, kvc_conn *a)
{
	static const uint32_t bad[] = { 0x7fc00000u, 0x7f800000u, 0, 0xbf800000u, 1 };
	const size_t nb = sizeof(bad) / sizeof(bad[0]);

	for (size_t i = 0; i < nb; i++)
		put_chain(cz, 0, 900 + 10 * (uint64_t)i);
	all_to_g3(a);
	for (size_t i = 0; i < nb; i++) {
		kvc_hash h = kvt_hash(900 + 10 * (uint64_t)i);
		uint8_t hdr[80], *pl;
		uint64_t plen;
		uint32_t flags, crc;
		off_t off = kvt_find_slot(disk, &h, &flags);
		int fd = open(disk, O_RDWR);

		CHECK(off >= 0 && fd >= 0);
		CHECK_EQ(flags, KV_QFMT_E4M3);
		CHECK(pread(fd, hdr, sizeof(hdr), off) == (ssize_t)sizeof(hdr));
		memcpy(&plen, hdr + 64, 8);              /* struct slot_hdr's payload_len */
		CHECK(plen == kv_quant_bytes(NEL, KV_QUANT_GROUP));
		pl = malloc(plen);
		CHECK(pl != NULL);
		CHECK(pread(fd, pl, plen, off + 4096) == (ssize_t)plen);
		memcpy(pl + 4 * 5, &bad[i], 4);          /* group 5's scale */
		crc = kv_crc32c(0, pl, plen);
		memcpy(hdr + 72, &crc, 4);               /* payload_crc */
		memset(hdr + 12, 0, 4);                  /* hdr_crc over the header with it 0 */
		crc = kv_crc32c(0, hdr, sizeof(hdr));
		memcpy(hdr + 12, &crc, 4);
		CHECK(pwrite(fd, pl, plen, off + 4096) == (ssize_t)plen);
		CHECK(pwrite(fd, hdr, sizeof(hdr), off) == (ssize_t)sizeof(hdr));
		close(fd);
		free(pl);
	}
	for (size_t i = 0; i < nb; i++) {
		struct kvt_tier t2, t3;
		uint64_t before;

		kvt_tier(1, &t2);
		kvt_tier(2, &t3);
		before = t2.checksum_failures + t3.checksum_failures;
		CHECK_EQ(get_chain(cz, 0, 900 + 10 * (uint64_t)i, 1), 0);
		kvt_tiers_settle();
		kvt_tier(1, &t2);
		kvt_tier(2, &t3);
		CHECK_EQ(t2.checksum_failures + t3.checksum_failures, before + 1);
		/* Gone: a second lookup misses without another failure. */
		CHECK_EQ(get_chain(cz, 0, 900 + 10 * (uint64_t)i, 1), 0);
		kvt_tier(1, &t2);
		kvt_tier(2, &t3);
		CHECK_EQ(t2.checksum_failures + t3.checksum_failures, before + 1);
	}
	CHECK_EQ(kvt_check(), 0);
}

/* The round trips, the stats, the restart, a corrupt slot. */
static void test_round_trips(void)
{
	struct kvt_daemon d;
	struct kvt_tier t2, t3;
	kvc_conn *cz, *raw, *a;
	uint32_t flags;
	uint64_t q = kv_quant_bytes(NEL, KV_QUANT_GROUP);
	kvc_hash h;
	int fd;
	off_t off;
	uint8_t byte;

	rm_disk();
	start(&d, 0);
	cz = kvt_connect("cz");
	raw = kvt_connect("raw");
	a = kvt_connect(NULL);

	/* G1 -> G2 -> G1 */
	for (int w = 0; w < 3; w++)
		put_chain(cz, w, 100 + 10 * (uint64_t)w);
	put_chain(raw, 0, 200);
	kvt_evict(a, KVCACHED__TIER__TIER_G1);
	kvt_tier(1, &t2);
	CHECK_EQ(t2.blocks, 4 * N);
	/* The FP16 and BF16 pools' copies only; int8 and the raw namespace's stay raw. */
	CHECK_EQ(t2.comp_bytes, 2 * N * q);
	CHECK_EQ(t2.comp_saved, 2 * N * (BB - q));
	for (int w = 0; w < 3; w++)
		CHECK_EQ(get_chain(cz, w, 100 + 10 * (uint64_t)w, w < 2), N);
	CHECK_EQ(get_chain(raw, 0, 200, 0), N);
	kvt_tier(1, &t2);
	CHECK_EQ(t2.blocks, 0);
	CHECK_EQ(t2.comp_bytes, 0);

	/* G1 -> G2 -> G3 (G2 dropped) -> G2 -> G1, new chains */
	for (int w = 0; w < 3; w++)
		put_chain(cz, w, 300 + 10 * (uint64_t)w);
	put_chain(raw, 0, 400);
	all_to_g3(a);
	/* The first chains too (back in G1 after their lookups). */
	kvt_tier(2, &t3);
	CHECK_EQ(t3.blocks, 8 * N);
	CHECK_EQ(t3.comp_bytes, 4 * N * q);
	CHECK_EQ(t3.comp_saved, 4 * N * (BB - q));
	h = kvt_hash(300);
	CHECK(kvt_find_slot(disk, &h, &flags) >= 0);
	CHECK_EQ(flags, KV_QFMT_E4M3);
	h = kvt_hash(320);
	CHECK(kvt_find_slot(disk, &h, &flags) >= 0);
	CHECK_EQ(flags, 0);
	h = kvt_hash(400);
	CHECK(kvt_find_slot(disk, &h, &flags) >= 0);
	CHECK_EQ(flags, 0);
	for (int w = 0; w < 3; w++)
		CHECK_EQ(get_chain(cz, w, 300 + 10 * (uint64_t)w, w < 2), N);
	CHECK_EQ(get_chain(raw, 0, 400, 0), N);
	kvt_tier(2, &t3);
	CHECK_EQ(t3.hits, 4 * N);
	CHECK_EQ(t3.checksum_failures, 0);
	CHECK_EQ(kvt_check(), 0);

	/* Warm restart: compressed and raw G3 slots found and read again. */
	for (int w = 0; w < 3; w++)
		put_chain(cz, w, 500 + 10 * (uint64_t)w);
	put_chain(raw, 0, 600);
	all_to_g3(a);
	kvc_close(cz);
	kvc_close(raw);
	kvc_close(a);
	start(&d, 1);
	cz = kvt_connect("cz");
	raw = kvt_connect("raw");
	a = kvt_connect(NULL);
	for (int w = 0; w < 3; w++)
		reg(cz, w);   /* the pools claim their runs of G3 */
	reg(raw, 0);
	kvt_tier(2, &t3);
	CHECK(t3.blocks >= 4 * N);
	for (int w = 0; w < 3; w++)
		CHECK_EQ(get_chain(cz, w, 500 + 10 * (uint64_t)w, w < 2), N);
	CHECK_EQ(get_chain(raw, 0, 600, 0), N);

	/* A corrupt compressed slot: a miss from there on, counted. */
	put_chain(cz, 0, 700);
	all_to_g3(a);
	h = kvt_hash(702);
	off = kvt_find_slot(disk, &h, &flags);
	CHECK(off >= 0);
	CHECK_EQ(flags, KV_QFMT_E4M3);
	fd = open(disk, O_RDWR);
	CHECK(fd >= 0);
	CHECK(pread(fd, &byte, 1, off + 4096 + 777) == 1);
	byte ^= 0x10;
	CHECK(pwrite(fd, &byte, 1, off + 4096 + 777) == 1);
	close(fd);
	kvt_tier(2, &t3);
	{
		uint64_t before = t3.checksum_failures;

		CHECK_EQ(get_chain(cz, 0, 700, 1), 2);
		kvt_tier(2, &t3);
		CHECK_EQ(t3.checksum_failures, before + 1);
	}
	kvt_tiers_settle();
	bad_scales(cz, a);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(cz);
	kvc_close(raw);
	kvc_close(a);
	kvt_stop(&d);
}

/* compress = fp8_e5m2: the same trips, E5M2's round trip and bound. */
static void test_e5m2(void)
{
	struct kvt_daemon d;
	struct kvt_tier t2, t3;
	kvc_conn *c5, *a;
	uint64_t q = kv_quant_bytes(NEL, KV_QUANT_GROUP);
	kvc_hash h;
	uint32_t flags;

	rm_disk();
	start(&d, 0);
	c5 = kvt_connect("c5");
	a = kvt_connect(NULL);
	put_chain(c5, 0, 900);
	put_chain(c5, 1, 910);
	kvt_evict(a, KVCACHED__TIER__TIER_G1);
	kvt_tier(1, &t2);
	CHECK_EQ(t2.comp_bytes, 2 * N * q);
	CHECK_EQ(get_chain(c5, 0, 900, KV_QFMT_E5M2), N);
	CHECK_EQ(get_chain(c5, 1, 910, KV_QFMT_E5M2), N);
	all_to_g3(a);
	kvt_tier(2, &t3);
	CHECK_EQ(t3.comp_saved, 2 * N * (BB - q));
	h = kvt_hash(910);
	CHECK(kvt_find_slot(disk, &h, &flags) >= 0);
	CHECK_EQ(flags, KV_QFMT_E5M2);
	CHECK_EQ(get_chain(c5, 0, 900, KV_QFMT_E5M2), N);
	CHECK_EQ(get_chain(c5, 1, 910, KV_QFMT_E5M2), N);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(c5);
	kvc_close(a);
	kvt_stop(&d);
}

/* The compressed demotion's copy fails: the blocks stay in G1, untouched;
 * the next demotion works. */
static void test_copy_fault(void)
{
	struct kvt_daemon d;
	struct kvt_tier t2;
	kvc_conn *cz, *a;

	rm_disk();
	setenv("KVCACHED_FAULTS", "copy=EIO:count=1", 1);
	start(&d, 0);
	unsetenv("KVCACHED_FAULTS");
	cz = kvt_connect("cz");
	a = kvt_connect(NULL);
	put_chain(cz, 0, 800);
	kvt_evict(a, KVCACHED__TIER__TIER_G1);
	kvt_tier(1, &t2);
	CHECK(t2.io_errors >= 1);
	CHECK_EQ(t2.comp_bytes, 0);
	CHECK_EQ(get_chain(cz, 0, 800, 0), N);   /* never left G1: identical */
	kvt_evict(a, KVCACHED__TIER__TIER_G1);
	kvt_tier(1, &t2);
	CHECK_EQ(t2.blocks, N);
	CHECK_EQ(get_chain(cz, 0, 800, 1), N);
	CHECK_EQ(kvt_check(), 0);
	kvc_close(cz);
	kvc_close(a);
	kvt_stop(&d);
}

/* A compressed slot's read fails: that block and the rest of its chain are
 * misses, counted; the blocks before it come back right. */
static void test_read_fault(void)
{
	struct kvt_daemon d;
	struct kvt_tier t3;
	kvc_conn *cz, *a;
	int k;

	rm_disk();
	setenv("KVCACHED_FAULTS", "g3_read=EIO:skip=1:count=1", 1);
	start(&d, 0);
	unsetenv("KVCACHED_FAULTS");
	cz = kvt_connect("cz");
	a = kvt_connect(NULL);
	put_chain(cz, 1, 850);
	all_to_g3(a);
	k = get_chain(cz, 1, 850, KV_QFMT_E4M3);
	CHECK_EQ(k, 1);
	kvt_tier(2, &t3);
	CHECK(t3.io_errors >= 1);
	kvt_tiers_settle();
	CHECK_EQ(kvt_check(), 0);
	kvc_close(cz);
	kvc_close(a);
	kvt_stop(&d);
}

static void cleanup(void)
{
	char path[200];

	rm_disk();
	snprintf(path, sizeof(path), "%s/kvcached.conf", dir);
	unlink(path);
	rmdir(dir);
}

/* Runs one case; on cuda in a child process, so that this one never loads
 * CUDA (which does not survive fork()) and each case starts clean. A child
 * that found no GPU (77) skips the whole test. */
static void run(void (*fn)(void))
{
	pid_t pid;
	int st;

	if (!kvt_cuda()) {
		fn();
		return;
	}
	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		fn();
		exit(0);
	}
	st = kvt_wait(pid);
	if (st != 0)
		cleanup();
	if (st == 77)
		GPU_SKIP("a case's child found none");
	CHECK_EQ(st, 0);
}

int main(void)
{
	snprintf(dir, sizeof(dir), "/var/tmp/kvt-compress-XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	snprintf(disk, sizeof(disk), "%s/g3", dir);
	write_conf();
	run(test_round_trips);
	run(test_e5m2);
	run(test_copy_fault);
	run(test_read_fault);
	cleanup();
	return 0;
}
