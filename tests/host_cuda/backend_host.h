// backend_host.h — the CUDA backend as the host stand-in makes it (cuda_host.h says what this
// directory is): cuda_backend_create gives a Backend whose ops are the CUDA source the stand-in
// compiles (Makefile: HOST_OBJ) run on the CPU, and whose "device" memory is host memory; the other
// ops are NULL. tests/gpu's tests of those ops run on it too (HOST_GPU_TESTS).
#pragma once
#include "../../cuda/cuda_common.cuh"  // the backend's private state and its ops, through this directory's headers

Backend* host_cuda_backend(DType act);
void host_cuda_backend_free(Backend* be);
// cuda_fp8.cu's test hooks (as tests/gpu/test_cuda_fp8.c declares them)
extern "C" void cuda_fp8_set_path(Backend* be, int path);
extern "C" void cuda_fp8_set_row_chunk(Backend* be, int rows);
extern "C" void cuda_fp8_set_wgrad_acc(Backend* be, size_t bytes);
extern "C" void cuda_fp8_set_epi_bytes(Backend* be, size_t bytes);
extern "C" void cuda_fp8_counts(Backend* be, size_t* lt, size_t* fb);
extern "C" size_t cuda_fp8_wgrad_splits(Backend* be);
extern "C" size_t cuda_fp8_swiglu_bwd_ws(Backend* be, int rows, int F, int K);
extern "C" size_t cuda_fp8_w13_groups(Backend* be);
extern "C" size_t cuda_fp8_ffn_groups(Backend* be);
extern "C" size_t cuda_fp8_ffn_ws(Backend* be, int rows, int F, int H);
