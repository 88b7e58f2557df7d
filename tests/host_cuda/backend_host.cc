// backend_host.cc — backend_host.h's backend (cuda_backend_create), and the pieces of the CUDA
// backend that the compiled files call from the others (cuda_backend.cu's checks; cuda_gemm.cu's
// GEMMs as far as FP8 and the no-product case go).
#include "backend_host.h"

#include <stdio.h>
#include <stdlib.h>

void cuda_fail(const char* what, const char* lib, const char* msg, const char* file, int line) {
    fprintf(stderr, "%s:%d: %s error: %s: %s\n", file, line, lib, what, msg);
    abort();
}
const char* cublasLt_status_name(cublasStatus_t s) {
    if (s == CUBLAS_STATUS_SUCCESS) return "CUBLAS_STATUS_SUCCESS";
    return s == CUBLAS_STATUS_NOT_SUPPORTED ? "CUBLAS_STATUS_NOT_SUPPORTED" : "CUBLAS_STATUS_(other)";
}
const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "error"; }
void cuda_launch_check(CudaImpl*, const char*, int) {}

// cuda_gemm.cu's ops as far as the stand-in goes: the FP8 forms (cuda_fp8.cu), and the GEMMs
// without a product (K = 0 or alpha = 0: C = beta · addend, which cuda_fp8.cu hands back). A bf16
// or fp32 product would need cuBLASLt's plain matmul, which the stand-in does not have: abort.
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
[[noreturn]] static void no_product(const char* op) {
    fprintf(stderr, "host stand-in: %s without fp8 needs cuBLASLt's plain matmul, which it does not have\n", op);
    abort();
}
void cuda_gemm(Backend* be, const GemmDesc* d, const void* A, const void* B, void* C) {
    if (d->fp8 != FP8_OFF) return cuda_gemm_fp8(be, d, A, B, C);
    if (d->K != 0 && d->alpha != 0.f) no_product("gemm");
    scale_rows(be, d->M, d->N, d->ldc ? d->ldc : d->N, d->c_f32 || !is_bf16(be), d->beta, d->c_in ? d->c_in : C, C);
}
void cuda_gemm_grouped(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* A, const void* B, void* C) {
    if (d->fp8 != FP8_OFF) return cuda_gemm_grouped_fp8(be, d, g, A, B, C);
    GemmDesc x = *d;
    x.M = g->host_off[g->groups];
    cuda_gemm(be, &x, A, B, C);
}
void cuda_gemm_grouped_swiglu(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* A, const void* B,
                              void* gu, void* h, const float* scale) {
    cuda_gemm_grouped(be, d, g, A, B, gu);
    cuda_swiglu_fwd(be, h, gu, scale, g->host_off[g->groups], d->N / 2);
}
void cuda_gemm_grouped_wgrad(Backend* be, const GroupDesc* g, int N, int K, const void* dY, const void* X, void* dB,
                             float beta) {
    if (g->fp8 != FP8_OFF) return cuda_gemm_grouped_wgrad_fp8(be, g, N, K, dY, X, dB, beta);
    no_product("gemm_grouped_wgrad");
}

// ---- the backend: host memory, and the ops whose CUDA source the stand-in compiles ----------------

static void* h_alloc(Backend*, size_t bytes) { return calloc(1, bytes ? bytes : 1); }
static void h_free(Backend*, void* p) { free(p); }
static void h_copy(Backend*, void* dst, const void* src, size_t bytes) { memmove(dst, src, bytes); }
static void h_to_host(Backend*, void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }
static void h_to_device(Backend*, void* dst, const void* src, size_t bytes) { memcpy(dst, src, bytes); }
static void h_zero(Backend*, void* p, size_t bytes) { memset(p, 0, bytes); }
static void h_sync(Backend*) {}
static void h_destroy(Backend* be) {
    CudaImpl* c = CI(be);
    fp8_cache_destroy(c->fp8);
    free(c->lt_ws), free(c->scratch), free(c), free(be);
}

extern "C" int cuda_compute_capability(Backend* be) { return CI(be)->cc_major; }

// As cuda_backend.cu's, on a "device" of compute capability 9.0 with 8 multiprocessors: grids sized
// by the multiprocessor count stay small here (each block is a round of OS threads), and the kernels'
// grid-stride loops take more turns.
extern "C" Backend* cuda_backend_create(DType act_dtype, int, const GpuConfig* gpu, Err*) {
    Backend* be = (Backend*)calloc(1, sizeof(Backend));
    CudaImpl* c = (CudaImpl*)calloc(1, sizeof(CudaImpl));
    be->name = "cuda";
    be->device = "host stand-in";
    be->act_dtype = act_dtype;
    be->impl = c;
    if (gpu) c->opt = *gpu;
    snprintf(c->name, sizeof c->name, "host stand-in");
    c->sms = 8, c->cc_major = 9, c->cc_minor = 0;
    c->fp8_row_chunk = FP8_ROW_CHUNK;
    c->fp8_wgrad_acc = FP8_WGRAD_ACC_BYTES;
    c->fp8_epi_bytes = FP8_EPI_BYTES;
    c->lt_ws_bytes = 1 << 20;
    c->lt_ws = malloc(c->lt_ws_bytes);
    c->scratch_bytes = 1 << 20;
    c->scratch = malloc(c->scratch_bytes);
    be->alloc = h_alloc, be->free = h_free, be->copy = h_copy, be->to_host = h_to_host, be->to_device = h_to_device;
    be->zero = h_zero, be->sync = h_sync, be->destroy = h_destroy;
    be->gemm = cuda_gemm, be->gemm_grouped = cuda_gemm_grouped, be->gemm_grouped_wgrad = cuda_gemm_grouped_wgrad;
    be->gemm_grouped_swiglu = cuda_gemm_grouped_swiglu, be->fp8_ws_bytes = cuda_fp8_ws_bytes;
    be->fp8_wcodes_bytes = cuda_fp8_wcodes_bytes, be->fp8_wcodes_make = cuda_fp8_wcodes_make;
    be->fp8_xcodes_bytes = cuda_fp8_xcodes_bytes, be->fp8_xcodes_make = cuda_fp8_xcodes_make;
    be->gemm_grouped_swiglu_bwd = cuda_gemm_grouped_swiglu_bwd;
    be->gemm_grouped_ffn = cuda_gemm_grouped_ffn;
    be->swiglu_fwd = cuda_swiglu_fwd, be->swiglu_bwd = cuda_swiglu_bwd, be->moe_index = cuda_moe_index;
    be->permute_fwd = cuda_permute_fwd, be->permute_bwd = cuda_permute_bwd;
    be->unpermute_fwd = cuda_unpermute_fwd, be->unpermute_bwd = cuda_unpermute_bwd;
    be->gather_rows_f32 = cuda_gather_rows_f32, be->scatter_rows_f32 = cuda_scatter_rows_f32;
    be->adamw = cuda_adamw, be->adamw_split = cuda_adamw_split;
    be->split_pack = cuda_split_pack, be->split_unpack = cuda_split_unpack;
    be->rope_qkv = cuda_rope_qkv, be->cross_entropy = cuda_cross_entropy;
    be->router_fwd = cuda_router_fwd, be->router_bwd = cuda_router_bwd;
    be->embed_fwd = cuda_embed_fwd, be->embed_bwd = cuda_embed_bwd;
    be->rmsnorm_fwd = cuda_rmsnorm_fwd, be->rmsnorm_bwd = cuda_rmsnorm_bwd;
    return be;
}

Backend* host_cuda_backend(DType act) {
    Err e = {{0}};
    return cuda_backend_create(act, 0, NULL, &e);
}
void host_cuda_backend_free(Backend* be) { be->destroy(be); }
