/* CK(call): a CUDA driver call that must succeed, for the GPU tests (the
 * driver's name of the error, then exit 1). */
#ifndef KV_TEST_CHECK_CUDA_H
#define KV_TEST_CHECK_CUDA_H

#include <stdio.h>
#include <stdlib.h>

#include "cudrv.h"

#define CK(call) do { \
	CUresult r_ = (call); \
	if (r_ != CUDA_SUCCESS) { \
		fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, kv_cu_name(r_)); \
		exit(1); \
	} \
} while (0)

#endif
