/* Fuzzing a warm start: the G3 index journal and the disk tier's slots as
 * a restarted daemon finds them (libFuzzer; replayed by the normal suite).
 *
 * Once per process a real daemon (fuzzd.h's tiny one, with a disk tier)
 * writes eight blocks of pool "p4" with known bytes, seals them, moves them
 * down to G3 and stops: its journal (g3.idx) and disk file (g3) are the
 * template. Each input damages a copy of them: the input's bytes are XORed
 * onto the journal's records followed by the disk file, from an offset the
 * input gives; with flag bit 0 every journal record's CRC is made right
 * again, so that the replay takes damaged records for real ones. Then a new
 * daemon starts on the damaged files (journal replay, runs waiting for
 * their pool), the pool registers again (runs adopted), and each of the
 * eight hashes is looked up (G3 read, slot header and CRC checks, promotion).
 * Findings: a crash or sanitizer report, a served block whose bytes are not
 * the ones written (the checks let damage through), an invariant check that
 * fails, blocks left held. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "crc32c.h"
#include "fuzzd.h"
#include "journal.h"
#include "pool.h"

#define NBLK 8
#define BB 4096

static char dir[64], jpath[96], dpath[96];
static uint8_t *jt, *dt;      /* the templates */
static size_t jlen, dlen;
static struct kv_config cfg;

static void pattern(unsigned k, uint8_t *p)
{
	for (unsigned i = 0; i < BB; i++)
		p[i] = (uint8_t)(k * 31 + i * 7 + (i >> 8));
}

static void hash_of(unsigned k, uint8_t out[32])
{
	memset(out, 0, 32);
	out[0] = (uint8_t)k;
	out[1] = 0xa5;
}

/* The bytes of block h through the daemon's own segment memory. */
static uint8_t *block_bytes(uint64_t h, void **map, size_t *maplen)
{
	struct kv_block *b = kv_block_lookup(fz_d.pools, h);
	uint64_t off, seg = fz_d.cfg.segment_bytes;
	int fd;

	if (!b)
		fz_finding("a handle from a reply names no block");
	off = kv_block_offset(b);
	fd = fz_d.be->ops->segment_fd(fz_d.be, 0, (uint32_t)(off / seg));
	*maplen = (size_t)seg;
	*map = mmap(NULL, *maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (*map == MAP_FAILED)
		fz_finding("cannot map a segment");
	return (uint8_t *)*map + off % seg;
}

static uint32_t register_pool(void)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__RegisterPool m = KVCACHED__REGISTER_POOL__INIT;
	Kvcached__Response *rs;
	uint32_t id;

	m.name = "p4";
	m.block_bytes = BB;
	m.block_tokens = 16;
	m.dtype = "fp16";
	rq.op_case = KVCACHED__REQUEST__OP_REGISTER_POOL;
	rq.register_pool = &m;
	rs = fz_run(0, &rq);
	if (!rs || rs->result_case != KVCACHED__RESPONSE__RESULT_REGISTER_POOL)
		fz_finding("the pool does not register");
	id = rs->register_pool->pool_id;
	kv_arena_reset(&fz_d.arena);
	return id;
}

static void start(void)
{
	char err[256] = "";

	memset(&fz_d, 0, sizeof(fz_d));
	if (kv_daemon_init(&fz_d, &cfg) < 0) {
		fprintf(stderr, "fuzz_journal: %s\n", err);
		exit(1);
	}
	for (int i = 0; i <= FZ_NSESS; i++)
		fz_open(i, "");
}

static void stop(void)
{
	for (int i = 0; i <= FZ_NSESS; i++)
		kv_session_release(&fz_s[i]);
	kv_daemon_collect(&fz_d);
	kv_daemon_fini(&fz_d);
}

static uint8_t *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *p;
	long n;

	if (!f || fseek(f, 0, SEEK_END) < 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) < 0 ||
	    !(p = malloc((size_t)n + 1)) || fread(p, 1, (size_t)n, f) != (size_t)n) {
		perror(path);
		exit(1);
	}
	fclose(f);
	*len = (size_t)n;
	return p;
}

static void spill(const char *path, const uint8_t *p, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	if (fd < 0 || write(fd, p, len) != (ssize_t)len || close(fd) < 0) {
		perror(path);
		exit(1);
	}
}

int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Alloc a = KVCACHED__ALLOC__INIT;
	Kvcached__Seal s = KVCACHED__SEAL__INIT;
	Kvcached__Release rel = KVCACHED__RELEASE__INIT;
	Kvcached__Flush fl = KVCACHED__FLUSH__INIT;
	Kvcached__Response *rs;
	uint64_t h[NBLK];
	uint8_t hashes[NBLK * 32];
	char err[256] = "";

	(void)argc;
	(void)argv;
	snprintf(dir, sizeof(dir), "/tmp/kvfuzzj-XXXXXX");
	fz_tmpdir(dir);
	snprintf(jpath, sizeof(jpath), "%s/g3.idx", dir);
	snprintf(dpath, sizeof(dpath), "%s/g3", dir);
	fz_config(&cfg, dir, 1);
	if (kv_config_finish(&cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "fuzz_journal: %s\n", err);
		exit(1);
	}
	start();
	a.pool_id = register_pool();
	a.count = NBLK;
	rq.op_case = KVCACHED__REQUEST__OP_ALLOC;
	rq.alloc = &a;
	if (!(rs = fz_run(0, &rq)) || rs->result_case != KVCACHED__RESPONSE__RESULT_BLOCKS)
		fz_finding("the template's alloc failed");
	memcpy(h, rs->blocks->blocks, sizeof(h));
	kv_arena_reset(&fz_d.arena);
	for (unsigned k = 0; k < NBLK; k++) {
		void *map;
		size_t len;

		pattern(k, block_bytes(h[k], &map, &len));
		munmap(map, len);
		hash_of(k, hashes + 32 * k);
	}
	s.pool_id = a.pool_id;
	s.n_blocks = NBLK;
	s.blocks = h;
	s.hashes.data = hashes;
	s.hashes.len = sizeof(hashes);
	rq.op_case = KVCACHED__REQUEST__OP_SEAL;
	rq.seal = &s;
	fz_run(0, &rq);
	kv_arena_reset(&fz_d.arena);
	rel.n_blocks = NBLK;
	rel.blocks = h;
	rq.op_case = KVCACHED__REQUEST__OP_RELEASE;
	rq.release = &rel;
	fz_run(0, &rq);
	kv_arena_reset(&fz_d.arena);
	/* All eight on disk only. */
	fz_evict(KVCACHED__TIER__TIER_G1);
	rq.op_case = KVCACHED__REQUEST__OP_FLUSH;
	rq.flush = &fl;
	fz_run(FZ_ADMIN, &rq);
	kv_arena_reset(&fz_d.arena);
	fz_pump();
	fz_evict(KVCACHED__TIER__TIER_G2);
	stop();
	jt = slurp(jpath, &jlen);
	dt = slurp(dpath, &dlen);
	if (jlen <= 64)
		fz_finding("the template journal holds no record");
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t total = (jlen - 64) + dlen, at;
	uint8_t *j = malloc(jlen), *d = malloc(dlen);
	Kvcached__Request rq = KVCACHED__REQUEST__INIT;
	Kvcached__Lookup l = KVCACHED__LOOKUP__INIT;
	Kvcached__Release rel = KVCACHED__RELEASE__INIT;
	uint8_t hash[32], want[BB];
	int flags = size ? data[0] : 0;
	uint32_t pool;

	if (!j || !d)
		exit(1);
	memcpy(j, jt, jlen);
	memcpy(d, dt, dlen);
	at = size >= 4 ? ((size_t)data[1] << 16 | (size_t)data[2] << 8 | data[3]) % total : 0;
	for (size_t i = 4; i < size; i++, at = (at + 1) % total) {
		if (at < jlen - 64)
			j[64 + at] ^= data[i];
		else
			d[at - (jlen - 64)] ^= data[i];
	}
	if (flags & 1)
		for (size_t r = 64; r + sizeof(struct kv_jrec) <= jlen; r += sizeof(struct kv_jrec)) {
			uint32_t crc = kv_crc32c(0, j + r + 4, sizeof(struct kv_jrec) - 4);

			memcpy(j + r, &crc, 4);
		}
	spill(jpath, j, jlen);
	spill(dpath, d, dlen);
	free(j);
	free(d);

	start();
	pool = register_pool();
	for (unsigned k = 0; k < NBLK; k++) {
		Kvcached__Response *rs;
		uint64_t got;

		hash_of(k, hash);
		l.pool_id = pool;
		l.hashes.data = hash;
		l.hashes.len = 32;
		rq.op_case = KVCACHED__REQUEST__OP_LOOKUP;
		rq.lookup = &l;
		rs = fz_run(0, &rq);
		if (!rs || rs->result_case != KVCACHED__RESPONSE__RESULT_BLOCKS ||
		    rs->blocks->n_blocks == 0) {
			kv_arena_reset(&fz_d.arena);
			continue;
		}
		got = rs->blocks->blocks[0];
		kv_arena_reset(&fz_d.arena);
		{
			void *map;
			size_t len;
			const uint8_t *p = block_bytes(got, &map, &len);

			pattern(k, want);
			if (memcmp(p, want, BB))
				fz_finding("a block served from damaged files has the wrong bytes");
			munmap(map, len);
		}
		rel.n_blocks = 1;
		rel.blocks = &got;
		rq.op_case = KVCACHED__REQUEST__OP_RELEASE;
		rq.release = &rel;
		fz_run(0, &rq);
		kv_arena_reset(&fz_d.arena);
	}
	fz_pump();
	if (!fz_check())
		fz_finding("the invariant check failed after a start on damaged files");
	if (fz_held_blocks())
		fz_finding("blocks held after every lookup was released");
	stop();
	return 0;
}
