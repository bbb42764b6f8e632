/* Tiny test helpers: a test program exits 0 (pass), 1 (fail) or 77 (skip). */
#ifndef KV_TEST_CHECK_H
#define KV_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond) do { \
	if (!(cond)) { \
		fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
		exit(1); \
	} \
} while (0)

#define CHECK_EQ(a, b) do { \
	long long a_ = (long long)(a), b_ = (long long)(b); \
	if (a_ != b_) { \
		fprintf(stderr, "%s:%d: check failed: %s == %s (%lld != %lld)\n", __FILE__, \
			__LINE__, #a, #b, a_, b_); \
		exit(1); \
	} \
} while (0)

#define SKIP(why) do { fprintf(stderr, "skip: %s\n", why); exit(77); } while (0)

/* The exit status of a test that needs a GPU and found none: 77 (skip), or
 * 1 (fail) under KVT_REQUIRE_GPU=1, which runs on GPU machines set so that
 * a broken driver or a missing device cannot pass as a skip. */
static inline int kvt_no_gpu_status(void)
{
	const char *r = getenv("KVT_REQUIRE_GPU");

	return r && !strcmp(r, "1") ? 1 : 77;
}

#define GPU_SKIP(why) do { \
	fprintf(stderr, "%s: no usable GPU: %s\n", \
		kvt_no_gpu_status() == 77 ? "skip" : "KVT_REQUIRE_GPU=1, fail", why); \
	exit(kvt_no_gpu_status()); \
} while (0)

#endif
