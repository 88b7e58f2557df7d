// nocuda.c — linked instead of cuda/*.cu when the build has no nvcc.
#include <stddef.h>

#include "backend.h"
#include "comm.h"

Backend* cuda_backend_create(DType act_dtype, int device, const GpuConfig* gpu, Err* e) {
    (void)act_dtype; (void)device; (void)gpu;
    err_set(e, "this moetrain was built without CUDA (no nvcc at build time); rebuild on a "
               "machine with the CUDA toolkit, or set train.device=cpu");
    return NULL;
}

Comm* comm_nccl_create(int ep, void* stream) { (void)ep; (void)stream; return NULL; }

int cuda_device_count(void) { return 0; }
