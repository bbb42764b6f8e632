/* Cross-process sharing on a GPU, with kernels on both sides: a writer
 * process fills blocks with a kernel through its own mapping and seals them;
 * a reader process finds them by lookup and reads them with kernels (CRC32C
 * and a gather to host memory) through its mapping. Once with a CUDA context
 * current in both before they connect (an engine), once with none at connect
 * and mapping time (a PyTorch thread that has not touched CUDA yet: the
 * client maps for each segment's own GPU, found by UUID). Then the wrong
 * device: a worker that names a CUDA device it does not have, and one that
 * sees none of the daemon's GPUs, get a clear error from the call, never an
 * illegal address. Last, a sticky device error makes the daemon exit with
 * status 3. Suite 'gpu' (exits 77 without a usable GPU). */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "crc32c.h"
#include "harness.h"
#include "check_cuda.h"
#include "kernels_cuda.h"

#define BB 65536
#define NB 24

struct gpu {
	CUdevice dev;
	CUcontext ctx;
	CUstream s;
	struct kv_cuda_kernels *k;
	struct kv_gather_desc *desc;  /* pinned, device-mapped */
	CUdeviceptr ddesc;
	uint8_t *host;                /* NB blocks, pinned, device-mapped */
	CUdeviceptr dhost;
	uint32_t *crc;                /* NB, pinned, device-mapped */
	CUdeviceptr dcrc;
};

/* Makes device 0's primary context current and loads the kernels. */
static void gpu_open(struct gpu *g)
{
	char err[256];
	void *p;

	CHECK_EQ(kv_cu_load(), 0);
	CK(kv_cu.cuDeviceGet(&g->dev, 0));
	CK(kv_cu.cuDevicePrimaryCtxRetain(&g->ctx, g->dev));
	CK(kv_cu.cuCtxSetCurrent(g->ctx));
	if (kv_cuda_kernels_load(&g->k, err, sizeof(err)) < 0) {
		fprintf(stderr, "kernels: %s\n", err);
		exit(1);
	}
	CK(kv_cu.cuStreamCreate(&g->s, CU_STREAM_NON_BLOCKING));
	CK(kv_cu.cuMemHostAlloc(&p, NB * sizeof(*g->desc),
				CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
	g->desc = p;
	CK(kv_cu.cuMemHostGetDevicePointer(&g->ddesc, p, 0));
	CK(kv_cu.cuMemHostAlloc(&p, (size_t)NB * BB,
				CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
	g->host = p;
	CK(kv_cu.cuMemHostGetDevicePointer(&g->dhost, p, 0));
	CK(kv_cu.cuMemHostAlloc(&p, NB * sizeof(uint32_t),
				CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
	g->crc = p;
	CK(kv_cu.cuMemHostGetDevicePointer(&g->dcrc, p, 0));
}

static uint64_t seed(int mode, int i)
{
	return 1000u * (uint64_t)mode + (uint64_t)i;
}

static kvc_hash hash(int mode, int i)
{
	return kvt_hash(seed(mode, i));
}

/* mode 1: a context current before connecting; mode 2: none until the
 * blocks are mapped (the kernels come after). */
static int writer(void *arg)
{
	int mode = (int)(intptr_t)arg, i, pool;
	struct gpu g = { 0 };
	kvc_hash h[NB];
	kvc_block b[NB];
	kvc_conn *c;

	if (mode == 1)
		gpu_open(&g);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "model", BB);
	CHECK_EQ(kvc_alloc(c, pool, NB, b), NB);
	if (mode == 2) {
		CUcontext cur = NULL;

		/* The client mapped the blocks without one, and made none current. */
		CHECK(kv_cu_loaded());
		CK(kv_cu.cuCtxGetCurrent(&cur));
		CHECK(cur == NULL);
		gpu_open(&g);
	}
	for (i = 0; i < NB; i++) {
		void *p = kvc_block_ptr(c, b[i]);

		CHECK(p != NULL);
		kvt_fill(g.host + (size_t)i * BB, BB, seed(mode, i));
		g.desc[i] = (struct kv_gather_desc){ .dst = (uint64_t)(uintptr_t)p,
						     .src = g.dhost + (uint64_t)i * BB, .len = BB };
		h[i] = hash(mode, i);
	}
	/* The kernel writes every block through this process's mapping. */
	CHECK_EQ(kv_cuda_copy_batch(g.k, g.ddesc, NB, BB, g.s), 0);
	CK(kv_cu.cuStreamSynchronize(g.s));
	CHECK_EQ(kvc_seal(c, pool, b, h, NB, b), NB);
	CHECK_EQ(kvc_release(c, b, NB), 0);
	kvc_close(c);
	return 0;
}

static int reader(void *arg)
{
	int mode = (int)(intptr_t)arg, i, pool;
	struct gpu g = { 0 };
	kvc_hash h[NB];
	kvc_block b[NB];
	kvc_conn *c;

	if (mode == 1)
		gpu_open(&g);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "model", BB);
	for (i = 0; i < NB; i++)
		h[i] = hash(mode, i);
	CHECK_EQ(kvc_lookup(c, pool, h, NB, b), NB);
	if (mode == 2)
		gpu_open(&g);
	/* CRC32C of each block by a kernel reading this process's mapping. */
	for (i = 0; i < NB; i++)
		g.desc[i] = (struct kv_gather_desc){ .dst = g.dcrc + 4u * (uint64_t)i,
						     .src = (uint64_t)(uintptr_t)kvc_block_ptr(c, b[i]),
						     .len = BB };
	CHECK_EQ(kv_cuda_crc32c(g.k, g.ddesc, NB, g.s), 0);
	CK(kv_cu.cuStreamSynchronize(g.s));
	/* And the bytes, gathered to host memory by the copy kernel. */
	for (i = 0; i < NB; i++)
		g.desc[i] = (struct kv_gather_desc){ .dst = g.dhost + (uint64_t)i * BB,
						     .src = (uint64_t)(uintptr_t)kvc_block_ptr(c, b[i]),
						     .len = BB };
	memset(g.host, 0, (size_t)NB * BB);
	CHECK_EQ(kv_cuda_copy_batch(g.k, g.ddesc, NB, BB, g.s), 0);
	CK(kv_cu.cuStreamSynchronize(g.s));
	for (i = 0; i < NB; i++) {
		CHECK(kvt_verify(g.host + (size_t)i * BB, BB, seed(mode, i)));
		CHECK_EQ(g.crc[i], kv_crc32c(0, g.host + (size_t)i * BB, BB));
	}
	CHECK_EQ(kvc_release(c, b, NB), 0);
	kvc_close(c);
	return 0;
}

/* A worker naming a CUDA device it does not have: the lookup that would
 * map the blocks fails with -ENODEV, and the error says why. */
static int wrong_device(void *arg)
{
	struct kvc_options o = { .cuda_device = KVC_CUDA_DEVICE(63) };
	kvc_hash h = hash(1, 0);
	kvc_block b;
	kvc_conn *c;
	int pool;

	(void)arg;
	CHECK_EQ(kvc_connect(NULL, &o, &c), 0);
	pool = kvt_pool(c, "model", BB);
	CHECK_EQ(kvc_lookup(c, pool, &h, 1, &b), -ENODEV);
	fprintf(stderr, "wrong device: %s\n", kvc_last_error(c));
	CHECK(strstr(kvc_last_error(c), "cuda_device names CUDA device 63") != NULL);
	kvc_close(c);
	return 0;
}

/* A worker that sees none of the daemon's GPUs (CUDA_VISIBLE_DEVICES names a
 * GPU that is not there): the same, and the error says CUDA is unusable. */
static int no_device(void *arg)
{
	kvc_hash h = hash(1, 0);
	kvc_block b;
	kvc_conn *c;
	int pool, r;

	(void)arg;
	setenv("CUDA_VISIBLE_DEVICES", "GPU-00000000-0000-0000-0000-000000000000", 1);
	c = kvt_connect(NULL);
	pool = kvt_pool(c, "model", BB);
	r = kvc_lookup(c, pool, &h, 1, &b);
	fprintf(stderr, "no device: %d %s\n", r, kvc_last_error(c));
	CHECK(r == -ENODEV);
	CHECK(strstr(kvc_last_error(c), "CUDA") != NULL);
	kvc_close(c);
	return 0;
}

/* Swaps blocks out, which the 'device' fault point ends in a sticky error. */
static int swap_out(void *arg)
{
	kvc_conn *c = kvt_connect(NULL);
	int pool = kvt_pool(c, "model", BB);
	kvc_block b[4];
	uint64_t swap;

	(void)arg;
	CHECK_EQ(kvc_alloc(c, pool, 4, b), 4);
	CHECK_EQ(kvc_swap_out(c, b, 4, &swap), 0);
	kvc_close(c);
	return 0;
}

/* Holds a block in every segment of a 64MiB-page pool, says so on fds[1],
 * and lets go when the parent closes the write end of fds[2] (fds[3], whose
 * copy here goes first). */
static int holder(void *arg)
{
	int *fds = arg, pool, n = 0, k;
	kvc_block *b = calloc(4096, sizeof(*b));
	kvc_conn *c = kvt_connect(NULL);
	char x;

	close(fds[0]);
	close(fds[3]);

	CHECK(b != NULL);
	pool = kvt_pool(c, "big", 64u << 20);
	while (n < 4096 && (k = kvc_alloc(c, pool, 64, b + n)) > 0)
		n += k;
	CHECK(n > 0);
	for (k = 0; k < n; k++)
		CHECK(kvc_block_ptr(c, b[k]) != NULL);
	CHECK_EQ(write(fds[1], "h", 1), 1);
	CHECK_EQ(read(fds[2], &x, 1), 0);
	kvc_close(c);
	free(b);
	return 0;
}

int main(void)
{
	struct kvt_daemon d;

	if (!kvt_cuda()) {
		fprintf(stderr, "skip: KVT_BACKEND=cuda only\n");
		return 77;
	}
	kvt_start(&d, "--pool-size", "64MiB", NULL);
	for (int mode = 1; mode <= 2; mode++) {
		CHECK_EQ(kvt_wait(kvt_spawn(writer, (void *)(intptr_t)mode)), 0);
		CHECK_EQ(kvt_wait(kvt_spawn(reader, (void *)(intptr_t)mode)), 0);
	}
	CHECK_EQ(kvt_wait(kvt_spawn(wrong_device, NULL)), 0);
	CHECK_EQ(kvt_wait(kvt_spawn(no_device, NULL)), 0);
	kvt_wait_sessions(0);
	CHECK(kvt_alive(&d));
	kvt_stop(&d);

	/* A daemon killed while a worker maps all of its memory: the new one
	 * finds that memory not free yet, and starts with what is (fewer
	 * segments, a warning) instead of failing and restarting in a loop. */
	{
		int p1[2], p2[2], fds[4];
		struct kvt_tier t0, t1;
		pid_t w;
		char x;

		/* Close-on-exec: the daemons started below must not hold them. */
		CHECK(pipe2(p1, O_CLOEXEC) == 0 && pipe2(p2, O_CLOEXEC) == 0);
		kvt_start(&d, "--pool-size", "60%", "--segment-size", "1GiB", "--page-size",
			  "64MiB", NULL);
		kvt_tier(0, &t0);
		fds[0] = p1[0], fds[1] = p1[1], fds[2] = p2[0], fds[3] = p2[1];
		w = kvt_spawn(holder, fds);
		close(p1[1]);
		close(p2[0]);
		CHECK_EQ(read(p1[0], &x, 1), 1);
		kvt_restart(&d, "--pool-size", "60%", "--segment-size", "1GiB", "--page-size",
			    "64MiB", NULL);
		kvt_tier(0, &t1);
		fprintf(stderr, "G1: %llu MiB, then %llu MiB while a worker maps the first\n",
			(unsigned long long)(t0.capacity >> 20),
			(unsigned long long)(t1.capacity >> 20));
		CHECK(t1.capacity > 0 && t1.capacity < t0.capacity);
		close(p2[1]);
		CHECK_EQ(kvt_wait(w), 0);
		close(p1[0]);
		kvt_stop(&d);
	}

	/* A sticky error on the device (here the 'device' fault point on a
	 * G1 -> G2 copy): the daemon exits with status 3 for systemd to start
	 * a new one, rather than serve on with a dead context. */
	setenv("KVCACHED_FAULTS", "device=EIO", 1);
	kvt_start(&d, "--pool-size", "64MiB", "--host-tier-size", "64MiB", NULL);
	unsetenv("KVCACHED_FAULTS");
	CHECK_EQ(kvt_wait(kvt_spawn(swap_out, NULL)), 0);
	CHECK_EQ(kvt_wait(d.pid), 3);
	printf("ok\n");
	return 0;
}
