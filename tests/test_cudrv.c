/* The driver loader: with the toolkit's stub libcuda every entry point
 * kvcached needs resolves (so a real driver of this CUDA version has them
 * all) and cuInit fails cleanly; a missing library fails cleanly too; a
 * child forked after loading is refused. Each case in its own process,
 * since loading happens once per process. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "cudrv.h"

static int run(const char *lib, int (*fn)(void))
{
	pid_t pid = fork();
	int st;

	CHECK(pid >= 0);
	if (pid == 0) {
		setenv("KVCACHED_LIBCUDA", lib, 1);
		_exit(fn());
	}
	CHECK(waitpid(pid, &st, 0) == pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int stub(void)
{
	int r = kv_cu_load();

	fprintf(stderr, "stub: %d: %s\n", r, kv_cu_error());
	CHECK_EQ(r, -ENODEV);
	CHECK(strstr(kv_cu_error(), "cuInit") != NULL);  /* every dlsym worked */
	CHECK(kv_cu_loaded());
	CHECK_EQ(kv_cu_load(), -ENODEV);                  /* same answer again */
	/* A child of a process that loaded the driver must not use it. */
	{
		pid_t pid = fork();
		int st;

		if (pid == 0)
			_exit(kv_cu_load() == -ECHILD ? 0 : 1);
		CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	return 0;
}

static int missing(void)
{
	int r = kv_cu_load();

	fprintf(stderr, "missing: %d: %s\n", r, kv_cu_error());
	CHECK_EQ(r, -ENODEV);
	CHECK(strstr(kv_cu_error(), "cannot load") != NULL);
	CHECK(!kv_cu_loaded());
	return 0;
}

int main(void)
{
	const char *lib = getenv("KV_CUDA_STUB");

	if (!lib)
		SKIP("KV_CUDA_STUB not set");
	CHECK_EQ(kv_cu_errno(CUDA_ERROR_OUT_OF_MEMORY), -ENOMEM);
	CHECK_EQ(kv_cu_errno(CUDA_SUCCESS), 0);
	CHECK(strcmp(kv_cu_name(CUDA_ERROR_NO_DEVICE), "CUDA_ERROR_NO_DEVICE") == 0);
	CHECK_EQ(run(lib, stub), 0);
	CHECK_EQ(run("/nonexistent/libcuda.so.1", missing), 0);
	return 0;
}
