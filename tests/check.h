/* Tiny test helpers: a test program exits 0 (pass), 1 (fail) or 77 (skip). */
#ifndef KV_TEST_CHECK_H
#define KV_TEST_CHECK_H

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* Checks that stmt fails a kv_assert() (aborts), running it in a child
 * process whose stderr goes to /dev/null. Where assertions are compiled out
 * (NDEBUG) there is nothing to check, and stmt does not run. */
#ifdef NDEBUG
#define CHECK_ABORTS(stmt) do { } while (0)
#else
#define CHECK_ABORTS(stmt) do { \
	pid_t pid_; \
	int st_; \
	fflush(NULL); \
	pid_ = fork(); \
	CHECK(pid_ >= 0); \
	if (pid_ == 0) { \
		int fd_ = open("/dev/null", O_WRONLY); \
		if (fd_ >= 0) \
			dup2(fd_, 2); \
		stmt; \
		_exit(0); \
	} \
	CHECK(waitpid(pid_, &st_, 0) == pid_); \
	if (!WIFSIGNALED(st_) || WTERMSIG(st_) != SIGABRT) { \
		fprintf(stderr, "%s:%d: check failed: %s did not abort\n", __FILE__, __LINE__, \
			#stmt); \
		exit(1); \
	} \
} while (0)
#endif

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
