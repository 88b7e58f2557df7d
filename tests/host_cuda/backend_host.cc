// backend_host.cc — backend_host.h's backend, and the pieces of the CUDA backend that cuda_fp8*.cu
// call from other files (cuda_backend.cu's checks, cuda_gemm.cu's GEMMs for the no-product case).
#include "backend_host.h"

#include <stdio.h>
#include <stdlib.h>

#include "../../cuda/cuda_common.cuh"

void cuda_fail(const char* what, const char* lib, const char* msg, const char* file, int line) {
    fprintf(stderr, "%s:%d: %s error: %s: %s\n", file, line, lib, what, msg);
    abort();
}
const char* cublasLt_status_name(cublasStatus_t s) {
    return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : s == CUBLAS_STATUS_NOT_SUPPORTED ? "CUBLAS_STATUS_NOT_SUPPORTED"
                                                                                                    : "CUBLAS_STATUS_(other)";
}
const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "error"; }
void cuda_launch_check(CudaImpl*, const char*, int) {}

// The GEMMs without a product (K = 0 or alpha = 0): C = beta · addend, the only form cuda_fp8.cu
// hands to cuda_gemm.cu. Any other call is not this stand-in's to make.
static void scale_rows(Backend* be, int M, int N, int ldc, int c_f32, float beta, const void* addend, void* C) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            const size_t at = (size_t)i * ldc + j;
            if (c_f32) {
                ((float*)C)[at] = beta == 0.f ? 0.f : beta * ((const float*)addend)[at];
            } else {
                const float a = beta == 0.f ? 0.f : beta * __bfloat162float(((const bf16*)addend)[at]);
                ((bf16*)C)[at] = __float2bfloat16_rn(a);
            }
        }
}
void cuda_gemm(Backend* be, const GemmDesc* d, const void*, const void*, void* C) {
    if (d->K != 0 && d->alpha != 0.f) {
        fprintf(stderr, "host stand-in: cuda_gemm with a product (K %d, alpha %g)\n", d->K, d->alpha);
        abort();
    }
    scale_rows(be, d->M, d->N, d->ldc ? d->ldc : d->N, d->c_f32 || !is_bf16(be), d->beta, d->c_in ? d->c_in : C, C);
}
void cuda_gemm_grouped(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* A, const void* B, void* C) {
    GemmDesc x = *d;
    x.M = g->host_off[g->groups];
    cuda_gemm(be, &x, A, B, C);
}

static void host_zero(Backend*, void* p, size_t bytes) { memset(p, 0, bytes); }

Backend* host_cuda_backend(DType act) {
    Backend* be = (Backend*)calloc(1, sizeof(Backend));
    CudaImpl* c = (CudaImpl*)calloc(1, sizeof(CudaImpl));
    be->name = "cuda (host stand-in)";
    be->act_dtype = act;
    be->impl = c;
    be->zero = host_zero;
    be->fp8_ws_bytes = cuda_fp8_ws_bytes;
    c->sms = 132, c->cc_major = 9, c->cc_minor = 0;
    c->fp8_row_chunk = FP8_ROW_CHUNK;
    c->fp8_wgrad_acc = FP8_WGRAD_ACC_BYTES;
    c->fp8_epi_bytes = FP8_EPI_BYTES;
    c->lt_ws_bytes = 1 << 20;
    c->lt_ws = malloc(c->lt_ws_bytes);
    c->scratch_bytes = 1 << 20;
    c->scratch = malloc(c->scratch_bytes);
    return be;
}
void host_cuda_backend_free(Backend* be) {
    CudaImpl* c = CI(be);
    fp8_cache_destroy(c->fp8);
    free(c->lt_ws), free(c->scratch), free(c), free(be);
}
