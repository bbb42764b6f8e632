/* The CUDA driver API, loaded at run time; see cudrv.h. */
#include "cudrv.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KV_STR_(x) #x
#define KV_STR(x) KV_STR_(x)

struct kv_cu_api kv_cu;
unsigned kv_cu_ready_wait_s;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int load_rc = -ENODEV;
static pid_t load_pid;
static void *lib;
static char load_err[256];

static const struct {
	CUresult r;
	const char *name;
} names[] = {
	{ CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE" },
	{ CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY" },
	{ CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED" },
	{ CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED" },
	{ CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY" },
	{ CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE" },
	{ CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE" },
	{ CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH" },
	{ CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED" },
	{ CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED" },
	{ CUDA_ERROR_SYSTEM_NOT_READY, "CUDA_ERROR_SYSTEM_NOT_READY" },
	{ CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN" },
};

const char *kv_cu_name(CUresult r)
{
	static __thread char buf[32];
	const char *s = NULL;
	size_t i;

	if (kv_cu.cuGetErrorName && kv_cu.cuGetErrorName(r, &s) == CUDA_SUCCESS && s)
		return s;
	for (i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (names[i].r == r)
			return names[i].name;
	snprintf(buf, sizeof(buf), "CUDA error %d", (int)r);
	return buf;
}

bool kv_cu_sticky(CUresult r)
{
	switch (r) {
	case CUDA_ERROR_ILLEGAL_ADDRESS:
	case CUDA_ERROR_MISALIGNED_ADDRESS:
	case CUDA_ERROR_INVALID_ADDRESS_SPACE:
	case CUDA_ERROR_INVALID_PC:
	case CUDA_ERROR_ILLEGAL_INSTRUCTION:
	case CUDA_ERROR_HARDWARE_STACK_ERROR:
	case CUDA_ERROR_LAUNCH_FAILED:
	case CUDA_ERROR_ECC_UNCORRECTABLE:
	case CUDA_ERROR_CONTEXT_IS_DESTROYED:
	case CUDA_ERROR_ASSERT:
		return true;
	default:
		return false;
	}
}

void kv_cu_uuid_str(const unsigned char u[16], char *out)
{
	static const char hex[] = "0123456789abcdef";
	char *o = out + 4;

	memcpy(out, "GPU-", 4);
	for (int i = 0; i < 16; i++) {
		if (i == 4 || i == 6 || i == 8 || i == 10)
			*o++ = '-';
		*o++ = hex[u[i] >> 4];
		*o++ = hex[u[i] & 15];
	}
	*o = 0;
}

int kv_cu_errno(CUresult r)
{
	switch (r) {
	case CUDA_SUCCESS:
		return 0;
	case CUDA_ERROR_OUT_OF_MEMORY:
		return -ENOMEM;
	case CUDA_ERROR_INVALID_VALUE:
		return -EINVAL;
	case CUDA_ERROR_NO_DEVICE:
	case CUDA_ERROR_INVALID_DEVICE:
	case CUDA_ERROR_STUB_LIBRARY:
	case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
	case CUDA_ERROR_NOT_INITIALIZED:
	case CUDA_ERROR_DEINITIALIZED:
		return -ENODEV;
	case CUDA_ERROR_NOT_SUPPORTED:
		return -ENOTSUP;
	case CUDA_ERROR_NOT_PERMITTED:
		return -EPERM;
	case CUDA_ERROR_ALREADY_MAPPED:
		return -EEXIST;
	default:
		return -EIO;
	}
}

static void load(void)
{
	const char *path = getenv("KVCACHED_LIBCUDA");
	CUresult r;

	load_pid = getpid();
	if (!path || !*path)
		path = "libcuda.so.1";
	lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		snprintf(load_err, sizeof(load_err), "cannot load the CUDA driver (%s): %s", path,
			 dlerror());
		load_rc = -ENODEV;
		return;
	}
#define KV_CU_LOAD_(f)                                                                       \
	*(void **)&kv_cu.f = dlsym(lib, KV_STR(f));                                          \
	if (!kv_cu.f) {                                                                      \
		snprintf(load_err, sizeof(load_err), "the CUDA driver %s has no %s (too old?)", \
			 path, KV_STR(f));                                                   \
		load_rc = -ENOSYS;                                                           \
		return;                                                                      \
	}
	KV_CU_FUNCS(KV_CU_LOAD_)
#undef KV_CU_LOAD_
#define KV_CU_LOAD_OPT_(f) *(void **)&kv_cu.f = dlsym(lib, KV_STR(f));
	KV_CU_OPTIONAL(KV_CU_LOAD_OPT_)
#undef KV_CU_LOAD_OPT_
	r = kv_cu.cuInit(0);
	for (unsigned waited = 0; r == CUDA_ERROR_SYSTEM_NOT_READY && waited < kv_cu_ready_wait_s;
	     waited++) {
		if (!waited)
			fprintf(stderr, "cuInit: CUDA_ERROR_SYSTEM_NOT_READY (is the Fabric Manager "
				"up?): trying again each second for %u s\n", kv_cu_ready_wait_s);
		sleep(1);
		r = kv_cu.cuInit(0);
	}
	if (r != CUDA_SUCCESS) {
		const char *s = NULL;

		if (kv_cu.cuGetErrorString(r, &s) != CUDA_SUCCESS)
			s = NULL;
		snprintf(load_err, sizeof(load_err), "cuInit: %s%s%s", kv_cu_name(r), s ? ": " : "",
			 s ? s : "");
		load_rc = kv_cu_errno(r);
		return;
	}
	if (kv_cu.cuDriverGetVersion(&kv_cu.driver_version) != CUDA_SUCCESS)
		kv_cu.driver_version = 0;
	load_rc = 0;
}

int kv_cu_load(void)
{
	pthread_once(&once, load);
	if (load_pid != getpid()) {
		snprintf(load_err, sizeof(load_err),
			 "CUDA was initialized before this process was forked; a forked child "
			 "cannot use it");
		return -ECHILD;
	}
	return load_rc;
}

const char *kv_cu_error(void)
{
	return load_err;
}

bool kv_cu_loaded(void)
{
	return lib != NULL;
}
