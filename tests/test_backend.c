/* The backend interface, the same program for both backends: host by
 * default (suite 'unit'), cuda with KVT_BACKEND=cuda (suite 'gpu'; exits 77
 * without a GPU). Batches of asynchronous copies H2D, D2D and D2H through
 * the G2 arena with completions on completion_fd, many in flight and reaped
 * in any order; the synchronous copy; a host segment's sealed size; a
 * recreated segment (new epoch, zeroed memory); bad offsets; quantized
 * copies (compress on demote: the host backend's C reference, the cuda
 * backend's device kernels; the same bytes either way), alone and mixed
 * with raw ones and other formats in one batch; the copy fault point; the
 * host backend's plug (batches held until unplugged or 4 MiB held, each
 * completing on its own). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "check.h"
#include "fault.h"
#include "fp8.h"
#include "quant.h"

#define SEG (2u << 20)
#define NSEG 4
#define BLK 65536u
#define NB 24

static struct kv_backend *be, *be2;

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(seed * 31 + i * 7 + (i >> 9));
}

/* Waits for and reaps batches until every tag in [first, first + n) has
 * completed; returns how many had a result other than 0 (res of the last in
 * *res). */
static int wait_tags(uint64_t first, int n, int *res)
{
	int seen[256] = { 0 }, got = 0, bad = 0;

	CHECK(n <= 256);
	while (got < n) {
		struct pollfd p = { .fd = be->completion_fd, .events = POLLIN };
		struct kv_copy_done d[16];
		int k, i;

		CHECK(poll(&p, 1, 10000) == 1);
		k = be->ops->reap(be, d, 16);
		for (i = 0; i < k; i++) {
			CHECK(d[i].tag >= first && d[i].tag < first + (uint64_t)n);
			CHECK(!seen[d[i].tag - first]);
			seen[d[i].tag - first] = 1;
			got++;
			if (d[i].res) {
				bad++;
				*res = d[i].res;
			}
		}
	}
	/* Everything reaped: no readiness left. */
	{
		struct pollfd p = { .fd = be->completion_fd, .events = POLLIN };
		struct kv_copy_done d;

		CHECK_EQ(poll(&p, 1, 0), 0);
		CHECK_EQ(be->ops->reap(be, &d, 1), 0);
	}
	return bad;
}

static void one(enum kv_copy_dir dir, uint64_t dev_off, uint64_t src_off, void *host,
		uint64_t len, uint64_t tag)
{
	struct kv_copy c = { .dev_off = dev_off, .src_off = src_off, .host = host, .len = len };
	int res = 0;

	CHECK_EQ(be->ops->copy_async(be, 0, dir, &c, 1, tag), 0);
	CHECK_EQ(wait_tags(tag, 1, &res), 0);
}

/* In segment 1 (recreated later, so what the rest checks is not touched):
 * one batch of raw and quantized copies of several formats, dtypes and
 * lengths (the cuda backend groups them into a launch per (format, dtype,
 * length), beside one cuMemcpyBatchAsync for the raw ones), D2H and back:
 * every slot holds kv_qfmt_quant's bytes, every block comes back as
 * kv_qfmt_dequant makes it (raw ones bit for bit). Then the alignment the
 * cuda kernels need. */
static void mixed_batch(uint8_t *arena, uint64_t *tag, int cuda)
{
	enum { M = 6 };
	static const struct {
		uint8_t fmt, dtype;
		uint32_t len;
	} spec[M] = {
		{ 0, 0, BLK },
		{ KV_QFMT_E4M3, KV_DTYPE_BF16, BLK },
		{ KV_QFMT_E5M2, KV_DTYPE_F16, BLK },
		{ KV_QFMT_E4M3, KV_DTYPE_BF16, BLK / 2 },
		{ KV_QFMT_E4M3, KV_DTYPE_BF16, BLK },
		{ KV_QFMT_E5M2, KV_DTYPE_F16, BLK },
	};
	uint8_t *in = arena, *slots = arena + 8 * BLK, *out = arena + 16 * BLK;
	uint8_t *ref = malloc(BLK), *back = malloc(BLK);
	struct kv_copy c[M];
	int res = 0;

	CHECK(ref && back);
	for (int k = 0; k < M; k++) {
		for (uint32_t i = 0; i < BLK / 2; i++) {
			float x = (float)((int)((i + 131u * (uint32_t)k) * 7919u % 2001u) - 1000) /
				  (k == 2 ? 3.0f : 37.0f);
			uint16_t v = spec[k].dtype == KV_DTYPE_F16 ? kv_f32_to_f16(x) : kv_f32_to_bf16(x);

			memcpy(in + (size_t)k * BLK + 2 * i, &v, 2);
		}
		one(KV_COPY_H2D, SEG + (uint64_t)k * BLK, 0, in + (size_t)k * BLK, BLK, (*tag)++);
	}
	memset(slots, 0xEE, 8 * BLK);
	for (int k = 0; k < M; k++)
		c[k] = (struct kv_copy){ .dev_off = SEG + (uint64_t)k * BLK,
					 .host = slots + (size_t)k * BLK,
					 .len = spec[k].len, .qfmt = spec[k].fmt,
					 .qdtype = spec[k].dtype };
	CHECK_EQ(be->ops->copy_async(be, 0, KV_COPY_D2H, c, M, *tag), 0);
	CHECK_EQ(wait_tags((*tag)++, 1, &res), 0);
	for (int k = 0; k < M; k++) {
		size_t n = spec[k].len / 2, qn = kv_quant_bytes(n, KV_QUANT_GROUP);

		if (!spec[k].fmt) {
			CHECK(memcmp(slots + (size_t)k * BLK, in + (size_t)k * BLK, spec[k].len) == 0);
			continue;
		}
		CHECK_EQ(kv_qfmt_quant_ref((enum kv_qfmt)spec[k].fmt, (enum kv_dtype)spec[k].dtype,
					   in + (size_t)k * BLK, n, KV_QUANT_GROUP, ref, qn), 0);
		if (memcmp(slots + (size_t)k * BLK, ref, qn) != 0)
			fprintf(stderr, "mixed batch: copy %d (format %d, dtype %d, %u bytes): the "
				"slot is not the reference's\n", k, spec[k].fmt, spec[k].dtype,
				spec[k].len);
		CHECK(memcmp(slots + (size_t)k * BLK, ref, qn) == 0);
		CHECK(slots[(size_t)k * BLK + qn] == 0xEE);  /* not a byte more */
	}
	/* Back into blocks 8.. (zeroed first), then read raw. */
	for (int k = 0; k < M; k++) {
		memset(out + (size_t)k * BLK, 0, BLK);
		one(KV_COPY_H2D, SEG + (uint64_t)(8 + k) * BLK, 0, out + (size_t)k * BLK, BLK,
		    (*tag)++);
		c[k].dev_off = SEG + (uint64_t)(8 + k) * BLK;
	}
	CHECK_EQ(be->ops->copy_async(be, 0, KV_COPY_H2D, c, M, *tag), 0);
	CHECK_EQ(wait_tags((*tag)++, 1, &res), 0);
	for (int k = 0; k < M; k++) {
		size_t n = spec[k].len / 2, qn = kv_quant_bytes(n, KV_QUANT_GROUP);

		one(KV_COPY_D2H, SEG + (uint64_t)(8 + k) * BLK, 0, out + (size_t)k * BLK, BLK,
		    (*tag)++);
		if (!spec[k].fmt) {
			CHECK(memcmp(out + (size_t)k * BLK, in + (size_t)k * BLK, spec[k].len) == 0);
			continue;
		}
		CHECK_EQ(kv_qfmt_dequant_ref((enum kv_qfmt)spec[k].fmt, (enum kv_dtype)spec[k].dtype,
					     slots + (size_t)k * BLK, qn, n, KV_QUANT_GROUP, back), 0);
		CHECK(memcmp(out + (size_t)k * BLK, back, spec[k].len) == 0);
		/* The rest of the block is untouched (zero). */
		for (size_t i = spec[k].len; i < BLK; i++)
			CHECK(out[(size_t)k * BLK + i] == 0);
	}
	if (cuda) {
		/* The kernels read 2-byte elements and 4-byte scales: a slot off
		 * 4-byte alignment or an odd device offset is refused. */
		struct kv_copy q = { .dev_off = 0, .host = slots + 2, .len = BLK,
				     .qfmt = KV_QFMT_E4M3, .qdtype = KV_DTYPE_BF16 };

		CHECK_EQ(be->ops->copy_async(be, 0, KV_COPY_D2H, &q, 1, *tag), -EINVAL);
		q.host = slots;
		q.dev_off = 1;
		CHECK_EQ(be->ops->copy_async(be, 0, KV_COPY_H2D, &q, 1, *tag), -EINVAL);
	}
	free(ref);
	free(back);
}

int main(void)
{
	const char *b = getenv("KVT_BACKEND");
	int cuda = b && !strcmp(b, "cuda"), r, res = 0;
	uint64_t arena_bytes = 2 * NB * BLK, i, tag = 100;
	uint8_t *arena, *want;
	struct kv_copy c[NB];
	char err[256] = "";
	uint32_t ep;
	int fd;

	if (cuda) {
		int dev0 = 0;

		r = kv_backend_cuda_create(&dev0, 1, NSEG * SEG, SEG, err, sizeof(err), &be);
		if (r == -ENODEV || r == -ENOTSUP)
			GPU_SKIP(err);
		if (r < 0)
			fprintf(stderr, "cuda backend: %s\n", err);
		CHECK_EQ(r, 0);
		CHECK(!strcmp(be->name, "cuda"));
	} else {
		uint64_t fr, to;

		CHECK_EQ(kv_backend_host_create(SEG, NSEG, &be), 0);
		/* The cuda helpers where CUDA cannot run: clean errors. */
		setenv("KVCACHED_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
		r = kv_backend_cuda_mem_info(0, &fr, &to);
		CHECK(r == -ENODEV || r == -ENOTSUP);
		CHECK(*kv_backend_cuda_error() != 0);
		CHECK(kv_backend_cuda_device_count() == r);
		r = kv_backend_cuda_create(NULL, 0, 8 << 20, 2 << 20, err, sizeof(err), &be2);
		CHECK(r == -ENODEV || r == -ENOTSUP);
		fprintf(stderr, "without a driver: %s\n", err);
	}
	want = malloc(NB * BLK);
	CHECK(want != NULL);
	CHECK_EQ(be->devices, 1);
	CHECK_EQ(be->segments[0], NSEG);
	CHECK(be->completion_fd >= 0);
	for (i = 0; i < NSEG; i++) {
		CHECK(be->ops->segment_fd(be, 0, (uint32_t)i) >= 0);
		CHECK_EQ(be->epoch[0][i], 1);
	}
	CHECK_EQ(be->ops->segment_fd(be, 0, NSEG), -EINVAL);
	CHECK_EQ(be->ops->segment_fd(be, 1, 0), -EINVAL);
	if (!cuda) {
		/* Each page populated once per mapping (issue 38): a range handed
		 * to a pool again asks the kernel for nothing; a recreated
		 * segment (a new mapping) is populated again. */
		be->ops->populate(be, 0, 0, SEG);
		CHECK_EQ(be->populated, SEG);
		be->ops->populate(be, 0, 0, SEG);
		be->ops->populate(be, 0, 4096, SEG / 2);
		CHECK_EQ(be->populated, SEG);
		be->ops->populate(be, 0, SEG - 4096, 8192);  /* past segment 0: refused */
		CHECK_EQ(be->populated, SEG);
		be->ops->populate(be, 0, SEG + 4096, 8192);  /* pages 1 and 2 of segment 1 */
		CHECK_EQ(be->populated, SEG + 8192);
		be->ops->populate(be, 0, SEG, 4 * 4096);     /* of pages 0-3, 0 and 3 are new */
		CHECK_EQ(be->populated, SEG + 8192 + 4 * 4096);
		CHECK_EQ(be->ops->segment_create(be, 0, 0), 0);
		be->ops->populate(be, 0, 0, SEG);
		CHECK_EQ(be->populated, 2 * SEG + 8192 + 4 * 4096);
		CHECK_EQ(be->epoch[0][0], 2);
	}

	arena = be->ops->host_alloc(be, arena_bytes);
	CHECK(arena != NULL);
	CHECK(((uintptr_t)arena & 4095) == 0);
	for (i = 0; i < arena_bytes; i++)
		CHECK(arena[i] == 0);

	/* H2D: NB blocks into segments 0 and 1 (the arena's first half). */
	fill(want, NB * BLK, 1);
	memcpy(arena, want, NB * BLK);
	for (i = 0; i < NB; i++)
		c[i] = (struct kv_copy){ .dev_off = i * BLK, .host = arena + i * BLK, .len = BLK };
	CHECK_EQ(be->ops->copy_async(be, 0, KV_COPY_H2D, c, NB, tag), 0);
	CHECK_EQ(wait_tags(tag, 1, &res), 0);
	tag++;

	/* D2D, one block at a time, many batches in flight: block i of segment
	 * 0/1 to segment 2/3. */
	for (i = 0; i < NB; i++) {
		struct kv_copy d = { .dev_off = 2 * SEG + i * BLK, .src_off = i * BLK, .len = BLK };

		CHECK_EQ(be->ops->copy_async(be, 0, KV_COPY_D2D, &d, 1, tag + i), 0);
	}
	CHECK_EQ(wait_tags(tag, NB, &res), 0);
	tag += NB;

	/* D2H of the copies into the arena's second half. */
	for (i = 0; i < NB; i++)
		c[i] = (struct kv_copy){ .dev_off = 2 * SEG + i * BLK,
					 .host = arena + NB * BLK + i * BLK, .len = BLK };
	CHECK_EQ(be->ops->copy_async(be, 0, KV_COPY_D2H, c, NB, tag), 0);
	CHECK_EQ(wait_tags(tag, 1, &res), 0);
	tag++;
	CHECK(memcmp(arena + NB * BLK, want, NB * BLK) == 0);

	/* The synchronous copy (copy-on-write). */
	CHECK_EQ(be->ops->copy(be, 0, 3 * SEG + SEG - BLK, 5 * BLK, BLK), 0);
	one(KV_COPY_D2H, 3 * SEG + SEG - BLK, 0, arena, BLK, tag++);
	CHECK(memcmp(arena, want + 5 * BLK, BLK) == 0);

	/* Copies that leave a segment or the device: refused up front, or a
	 * failed completion. */
	{
		struct kv_copy bad[] = {
			{ .dev_off = SEG - 4096, .host = arena, .len = 8192 },     /* crosses */
			{ .dev_off = NSEG * SEG, .host = arena, .len = 4096 },     /* beyond */
		};

		for (i = 0; i < 2; i++) {
			r = be->ops->copy_async(be, 0, KV_COPY_H2D, &bad[i], 1, tag);
			if (r == 0)
				CHECK_EQ(wait_tags(tag, 1, &res), 1);
			else
				CHECK_EQ(r, -EINVAL);
			tag++;
		}
		CHECK(be->ops->copy(be, 0, 0, NSEG * SEG, 4096) == -EINVAL);
		CHECK(be->ops->copy_async(be, 1, KV_COPY_H2D, c, 1, tag) == -EINVAL);
		if (cuda) {
			/* Host memory that is not the arena's. */
			struct kv_copy h = { .dev_off = 0, .host = want, .len = 4096 };

			CHECK_EQ(be->ops->copy_async(be, 0, KV_COPY_H2D, &h, 1, tag), -EINVAL);
		}
	}

	/* Quantized copies (compress on demote): D2H writes the reference
	 * quantizer's bytes, H2D its dequantization; an unknown format or
	 * dtype, or a D2D copy asking for one, fails. The cuda backend
	 * compresses unless its kernels did not load (its log said why). */
	if (cuda && !be->quant)
		fprintf(stderr, "cuda backend without its quantizing kernels: quantized copies "
			"not checked\n");
	if (be->quant) {
		size_t n = BLK / 2, qn = kv_quant_bytes(n, KV_QUANT_GROUP);
		uint8_t *ref = malloc(qn), *back = malloc(BLK);
		uint16_t v;
		static const struct {
			enum kv_copy_dir dir;
			uint8_t fmt, dtype;
		} badq[] = {
			{ KV_COPY_D2H, 3, KV_DTYPE_F16 },
			{ KV_COPY_H2D, KV_QFMT_E4M3, KV_DTYPE_NONE },
			{ KV_COPY_D2D, KV_QFMT_E4M3, KV_DTYPE_F16 },
		};

		CHECK(ref && back);
		for (int f = KV_QFMT_E4M3; f <= KV_QFMT_E5M2; f++) {
			struct kv_copy q = { .dev_off = 0, .host = arena + BLK, .len = BLK,
					     .qfmt = (uint8_t)f, .qdtype = KV_DTYPE_BF16 };

			for (i = 0; i < n; i++) {
				v = kv_f32_to_bf16((float)((int)(i * 7919 % 2001) - 1000) / 37.0f);
				memcpy(arena + 2 * i, &v, 2);
			}
			one(KV_COPY_H2D, 0, 0, arena, BLK, tag++);
			CHECK_EQ(be->ops->copy_async(be, 0, KV_COPY_D2H, &q, 1, tag), 0);
			CHECK_EQ(wait_tags(tag++, 1, &res), 0);
			CHECK_EQ(kv_qfmt_quant_ref((enum kv_qfmt)f, KV_DTYPE_BF16, arena, n,
						   KV_QUANT_GROUP, ref, qn), 0);
			CHECK(memcmp(arena + BLK, ref, qn) == 0);
			q.dev_off = BLK;
			CHECK_EQ(be->ops->copy_async(be, 0, KV_COPY_H2D, &q, 1, tag), 0);
			CHECK_EQ(wait_tags(tag++, 1, &res), 0);
			one(KV_COPY_D2H, BLK, 0, arena + 2 * BLK, BLK, tag++);
			CHECK_EQ(kv_qfmt_dequant_ref((enum kv_qfmt)f, KV_DTYPE_BF16, ref, qn, n,
						     KV_QUANT_GROUP, back), 0);
			CHECK(memcmp(arena + 2 * BLK, back, BLK) == 0);
		}
		for (i = 0; i < sizeof(badq) / sizeof(badq[0]); i++) {
			struct kv_copy q = { .dev_off = 0, .src_off = BLK, .host = arena + BLK,
					     .len = BLK, .qfmt = badq[i].fmt, .qdtype = badq[i].dtype };

			r = be->ops->copy_async(be, 0, badq[i].dir, &q, 1, tag);
			if (r == 0)
				CHECK_EQ(wait_tags(tag, 1, &res), 1);
			else
				CHECK_EQ(r, -EINVAL);
			tag++;
		}
		free(ref);
		free(back);
		mixed_batch(arena, &tag, cuda);
	}

	/* A host segment's size is sealed: a client that was sent its fd can
	 * neither shrink nor grow it (the daemon's copies would fault), nor
	 * lift the seals. */
	if (!cuda) {
		fd = be->ops->segment_fd(be, 0, 0);
		CHECK(ftruncate(fd, 0) < 0 && errno == EPERM);
		CHECK(ftruncate(fd, 2 * SEG) < 0 && errno == EPERM);
		CHECK(fcntl(fd, F_GET_SEALS) == (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
		CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) < 0 && errno == EPERM);
	}

	/* A recreated segment: new epoch, fresh zeroed memory. */
	fd = be->ops->segment_fd(be, 0, 1);
	ep = be->epoch[0][1];
	CHECK_EQ(be->ops->segment_create(be, 0, 1), 0);
	CHECK(be->epoch[0][1] != ep);
	CHECK(be->ops->segment_fd(be, 0, 1) >= 0);
	(void)fd;
	memset(arena, 0xee, BLK);
	one(KV_COPY_D2H, SEG + 3 * BLK, 0, arena, BLK, tag++);
	for (i = 0; i < BLK; i++)
		CHECK(arena[i] == 0);
	/* Segment 0 kept its bytes. */
	one(KV_COPY_D2H, 2 * BLK, 0, arena, BLK, tag++);
	CHECK(memcmp(arena, want + 2 * BLK, BLK) == 0);

	/* Plugged (issue 38): batches are checked and accepted at once, held
	 * (none completes, however long it waits) until the outer plug(0),
	 * then each completes with its own tag and result; a fault fails the
	 * batch it hits alone. With KV_HOST_PLUG_BYTES held they go without
	 * waiting for plug(0). */
	if (be->ops->plug) {
		struct pollfd p = { .fd = be->completion_fd, .events = POLLIN };
		int m = (int)(KV_HOST_PLUG_BYTES / BLK);

		/* Segment 0 holds want again; the arena's second half zeroes. */
		memcpy(arena, want, NB * BLK);
		for (i = 0; i < NB; i++)
			c[i] = (struct kv_copy){ .dev_off = i * BLK, .host = arena + i * BLK, .len = BLK };
		CHECK_EQ(be->ops->copy_async(be, 0, KV_COPY_H2D, c, NB, tag), 0);
		CHECK_EQ(wait_tags(tag, 1, &res), 0);
		tag++;
		memset(arena + NB * BLK, 0, NB * BLK);
		CHECK_EQ(kv_fault_parse("copy=EIO:skip=5", err, sizeof(err)), 0);
		be->ops->plug(be, 1);
		be->ops->plug(be, 1);  /* nested */
		for (i = 0; i < NB; i++) {
			c[0] = (struct kv_copy){ .dev_off = i * BLK, .host = arena + NB * BLK + i * BLK,
						 .len = BLK };
			CHECK_EQ(be->ops->copy_async(be, 0, KV_COPY_D2H, c, 1, tag + i), 0);
		}
		be->ops->plug(be, 0);
		CHECK_EQ(poll(&p, 1, 200), 0);
		for (i = 0; i < NB; i++)
			CHECK(arena[NB * BLK + i * BLK] == 0 || want[i * BLK] == 0);
		be->ops->plug(be, 0);
		CHECK_EQ(wait_tags(tag, NB, &res), 1);
		CHECK_EQ(res, -EIO);
		for (i = 0; i < NB; i++)
			if (i != 5)
				CHECK(memcmp(arena + NB * BLK + i * BLK, want + i * BLK, BLK) == 0);
		tag += NB;
		CHECK_EQ(kv_fault_fired(KV_FAULT_COPY), 1);

		/* m copies of BLK: KV_HOST_PLUG_BYTES, handed over while plugged. */
		be->ops->plug(be, 1);
		for (i = 0; i < (uint64_t)m; i++) {
			c[0] = (struct kv_copy){ .dev_off = (i % NB) * BLK,
						 .host = arena + NB * BLK + (i % NB) * BLK, .len = BLK };
			CHECK_EQ(be->ops->copy_async(be, 0, KV_COPY_D2H, c, 1, tag + i), 0);
		}
		CHECK_EQ(wait_tags(tag, m, &res), 0);
		be->ops->plug(be, 0);
		tag += (uint64_t)m;
		CHECK_EQ(poll(&p, 1, 0), 0);
		CHECK(memcmp(arena + NB * BLK, want, NB * BLK) == 0);
	}

	/* The fault point fails the batch it hits. */
	CHECK_EQ(kv_fault_parse("copy=EIO:skip=1", err, sizeof(err)), 0);
	for (i = 0; i < 2; i++)
		c[i] = (struct kv_copy){ .dev_off = i * BLK, .host = arena + i * BLK, .len = BLK };
	CHECK_EQ(be->ops->copy_async(be, 0, KV_COPY_D2H, c, 2, tag), 0);
	CHECK_EQ(wait_tags(tag, 1, &res), 1);
	CHECK_EQ(res, -EIO);
	tag++;
	CHECK_EQ(kv_fault_fired(KV_FAULT_COPY), 1);
	one(KV_COPY_D2H, 0, 0, arena, BLK, tag++);
	/* A short copy fails as well: copies have no partial success. */
	CHECK_EQ(kv_fault_parse("copy=short", err, sizeof(err)), 0);
	CHECK_EQ(be->ops->copy_async(be, 0, KV_COPY_D2H, c, 1, tag), 0);
	CHECK_EQ(wait_tags(tag, 1, &res), 1);
	CHECK_EQ(res, -EIO);
	tag++;
	one(KV_COPY_D2H, 0, 0, arena, BLK, tag++);

	be->ops->host_free(be, arena, arena_bytes);
	kv_backend_destroy(be);
	free(want);
	return 0;
}
