/* kvbench section h: the GPU data paths, measured in this process without a
 * daemon (gpu.c). */
#ifndef KVBENCH_GPU_H
#define KVBENCH_GPU_H

#include <stdbool.h>

/* Prints section h (or "skipped: no GPU" and why). */
void kvbench_gpu(bool quick);

#endif
