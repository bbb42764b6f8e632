/* The CUDA driver API, loaded at run time.
 *
 * Nothing in kvcached links libcuda: kv_cu_load() dlopen()s libcuda.so.1 the
 * first time CUDA is needed, so the daemon (host backend), kvctl and
 * libkvcache run on machines without the NVIDIA driver, and libkvcache needs
 * only libcuda (no CUDA runtime) on those with it.
 *
 * Call a driver function through the table: kv_cu.cuMemCreate(...). The
 * member names are cuda.h's own, so they expand to the same versioned
 * symbols (cuMemGetInfo -> cuMemGetInfo_v2) that a program linked against
 * libcuda would bind, with cuda.h's prototypes.
 *
 * Fork: CUDA does not survive fork(). A process that loaded the driver and
 * forks has a child that must not use it; kv_cu_load() there fails with
 * -ECHILD rather than crashing in the driver.
 *
 * $KVCACHED_LIBCUDA names another library to load instead (tests load the
 * toolkit's stub libcuda.so, whose every call fails, to check that all
 * symbols resolve and that failures are clean). */
#ifndef KV_CUDRV_H
#define KV_CUDRV_H

#include <cuda.h>
#include <stdbool.h>

/* Required entry points. */
#define KV_CU_FUNCS(X)                                                                     \
	X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)              \
	X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetAttribute) X(cuDeviceGetName)      \
	X(cuDeviceTotalMem) X(cuDeviceCanAccessPeer) X(cuDeviceGetUuid)                     \
	X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)                            \
	X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxGetDevice) X(cuCtxPushCurrent)         \
	X(cuCtxPopCurrent) X(cuCtxSynchronize)                                              \
	X(cuMemGetInfo) X(cuMemGetAllocationGranularity) X(cuMemCreate) X(cuMemRelease)    \
	X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle)                   \
	X(cuMemGetAllocationPropertiesFromHandle) X(cuMemAddressReserve)                    \
	X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess)                     \
	X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemHostRegister) X(cuMemHostUnregister)      \
	X(cuMemHostGetDevicePointer) X(cuMemAlloc) X(cuMemFree)                             \
	X(cuMemcpyAsync) X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyHtoDAsync)               \
	X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync) X(cuMemsetD8) X(cuMemsetD8Async)          \
	X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamQuery)        \
	X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize)           \
	X(cuEventQuery)                                                                     \
	X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) X(cuLaunchKernel)

/* Entry points used when the driver has them (NULL otherwise):
 * cuMemcpyBatchAsync_v2 came with CUDA 13. */
#define KV_CU_OPTIONAL(X) X(cuMemcpyBatchAsync)

#define KV_CU_MEMBER_(f) __typeof__(f) *f;
struct kv_cu_api {
	KV_CU_FUNCS(KV_CU_MEMBER_)
	KV_CU_OPTIONAL(KV_CU_MEMBER_)
	int driver_version;  /* cuDriverGetVersion: 1000 * major + 10 * minor */
};
#undef KV_CU_MEMBER_

/* How long kv_cu_load() keeps calling cuInit while it says
 * CUDA_ERROR_SYSTEM_NOT_READY (an NVSwitch machine whose Fabric Manager is
 * not up yet), once a second; 0 (the default) gives up at once. Set before
 * the first kv_cu_load(): the daemon waits, a worker does not. */
extern unsigned kv_cu_ready_wait_s;

/* Filled by kv_cu_load(); use only after it returned 0. */
extern struct kv_cu_api kv_cu;

/* Loads the driver and calls cuInit(0), once per process (thread-safe;
 * later calls return the first one's result). Returns 0, or -ENODEV (no
 * driver, no device, a stub library), -ENOSYS (a driver without an entry
 * point kvcached needs), -ECHILD (loaded before this process was forked) or
 * another -errno; kv_cu_error() then says what happened. */
int kv_cu_load(void);

/* Why kv_cu_load() failed ("" when it did not). Static storage. */
const char *kv_cu_error(void);

/* Whether this process has loaded the driver (whatever the outcome of
 * cuInit). Lets a test know it must not fork and use CUDA in the child. */
bool kv_cu_loaded(void);

/* The name of a CUDA result ("CUDA_ERROR_OUT_OF_MEMORY"), or "CUDA error N". */
const char *kv_cu_name(CUresult r);

/* Whether r is a sticky error: the context that got it is unusable for
 * good (an illegal address, an uncorrectable ECC error, a failed launch):
 * only a new process gets a working one. */
bool kv_cu_sticky(CUresult r);

/* A device UUID as nvidia-smi prints it, "GPU-" and 36 characters, into out
 * (at least KV_CU_UUID_STR bytes). */
#define KV_CU_UUID_STR 41
void kv_cu_uuid_str(const unsigned char uuid[16], char *out);

/* A CUDA result as -errno: -ENOMEM, -EINVAL, -ENODEV, -ENOTSUP, -EPERM,
 * -EEXIST, else -EIO. 0 for CUDA_SUCCESS. */
int kv_cu_errno(CUresult r);

#endif
