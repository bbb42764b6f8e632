/* Tiny test helpers: a test program exits 0 (pass), 1 (fail) or 77 (skip). */
#ifndef KV_TEST_CHECK_H
#define KV_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

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

#endif
