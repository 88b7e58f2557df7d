// cpu.h — internals of the CPU backend (fp32 everywhere; act buffers are float).
#pragma once
#include "backend.h"
#include "util.h"

void cpu_gemm_f32(const GemmDesc* d, const float* A, const float* B, float* C);
void cpu_register_gemm(Backend* be);
void cpu_register_nn(Backend* be);    // embedding, rmsnorm, rope, attention, loss, adamw
void cpu_register_moe(Backend* be);   // router, index, permutes, swiglu
