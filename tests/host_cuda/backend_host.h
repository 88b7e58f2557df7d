// backend_host.h — the CUDA backend as the host stand-in makes it (cuda_host.h says what this
// directory is): cuda_backend_create gives a Backend whose ops are the CUDA source the stand-in
// compiles (Makefile: HOST_OBJ) run on the CPU, and whose "device" memory is host memory; the other
// ops are NULL. tests/gpu's tests of those ops run on it too (HOST_GPU_TESTS).
#pragma once
extern "C" {
#include "backend.h"
}

Backend* host_cuda_backend(DType act);
void host_cuda_backend_free(Backend* be);
// cuda_fp8.cu's ops (cuda_common.cuh declares them for the CUDA backend) and its test hooks (as
// tests/gpu/test_cuda_fp8.c declares them)
extern "C" void cuda_gemm_fp8(Backend*, const GemmDesc*, const void* A, const void* B, void* C);
extern "C" void cuda_gemm_grouped_fp8(Backend*, const GemmDesc*, const GroupDesc*, const void* A, const void* B,
                                      void* C);
extern "C" void cuda_gemm_grouped_wgrad_fp8(Backend*, const GroupDesc*, int N, int K, const void* dY, const void* X,
                                            void* dB, float beta);
extern "C" size_t cuda_fp8_ws_bytes(Backend*, Fp8Op op, Fp8Gemm fp8, int M, int N, int K, int groups);
extern "C" void cuda_fp8_set_path(Backend* be, int path);
extern "C" void cuda_fp8_set_row_chunk(Backend* be, int rows);
extern "C" void cuda_fp8_set_wgrad_acc(Backend* be, size_t bytes);
extern "C" void cuda_fp8_set_epi_bytes(Backend* be, size_t bytes);
extern "C" void cuda_fp8_counts(Backend* be, size_t* lt, size_t* fb);
extern "C" size_t cuda_fp8_wgrad_splits(Backend* be);
