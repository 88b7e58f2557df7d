// cuda_host.h — just enough of CUDA to run a kernel's own source on the CPU (C++20): a block is 256
// OS threads in lockstep where it matters (__syncthreads and the warp shuffles are barriers),
// blocks run one after another, __shared__ arrays are statics, and the intrinsics are their IEEE
// host equivalents (__nv_cvt_float2_to_fp8x2 is the spec's fp8_e4m3_from_f32, which the GPU tests
// find equal to the device conversion). Compile with -ffp-contract=off, as device code without
// fast math keeps each rounding. Used by test_fp8_quant_host.cc for cuda/cuda_fp8_quant.cu.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

extern "C" {
#include "fp8.h"
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
#define __shared__ static
#define __align__(n)

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct HostIdx {
    unsigned x, y, z;
};
enum { HOST_THREADS = 256 };  // the block size the emulated kernels are launched with
static thread_local HostIdx threadIdx, blockIdx;
static HostIdx gridDim, blockDim = {HOST_THREADS, 1, 1};

struct uint4 { uint32_t x, y, z, w; };
struct uint2 { uint32_t x, y; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
static inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
static inline uint2 make_uint2(uint32_t a, uint32_t b) { return {a, b}; }
static inline float2 make_float2(float a, float b) { return {a, b}; }
template <typename T> static inline T __ldg(const T* p) { return *p; }

struct bf16 {
    uint16_t bits;
};
static inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline float to_f(float x) { return x; }
static inline float to_f(bf16 x) { return __uint_as_float((uint32_t)x.bits << 16); }
static inline void unpack8(float* f, uint4 u) {
    const uint32_t p[4] = {u.x, u.y, u.z, u.w};
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(p[i] << 16);
        f[2 * i + 1] = __uint_as_float(p[i] & 0xffff0000u);
    }
}
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
using std::isfinite;
enum { __NV_SATFINITE = 1, __NV_E4M3 = 2 };
static inline unsigned short __nv_cvt_float2_to_fp8x2(float2 v, int, int) {
    return (unsigned short)(fp8_e4m3_from_f32(v.x) | fp8_e4m3_from_f32(v.y) << 8);
}

// ---- barriers: the block and its warps ----
static std::barrier<>* host_block;
static std::barrier<>* host_warp[HOST_THREADS / 32];
static float host_xch[HOST_THREADS / 32][32];
static inline void __syncthreads() { host_block->arrive_and_wait(); }
static inline float __shfl_xor_sync(unsigned, float v, int o) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    host_xch[w][l] = v;
    host_warp[w]->arrive_and_wait();
    const float r = host_xch[w][l ^ o];
    host_warp[w]->arrive_and_wait();
    return r;
}
// the real warp and block reductions over these
#include "../cuda/cuda_reduce.cuh"

// Runs kern over grid g (x fastest), HOST_THREADS threads a block.
static inline void host_grid(dim3 g, const std::function<void()>& kern) {
    gridDim = {g.x, g.y, 1};
    std::barrier<> blk(HOST_THREADS);
    for (int i = 0; i < HOST_THREADS / 32; i++) host_warp[i] = new std::barrier<>(32);
    host_block = &blk;
    std::vector<std::thread> th;
    for (unsigned t = 0; t < HOST_THREADS; t++)
        th.emplace_back([&, t] {
            threadIdx = {t, 0, 0};
            for (unsigned by = 0; by < g.y; by++)
                for (unsigned bx = 0; bx < g.x; bx++) {
                    blockIdx = {bx, by, 0};
                    kern();
                    blk.arrive_and_wait();  // the block's statics are the next block's
                }
        });
    for (auto& t : th) t.join();
    for (int i = 0; i < HOST_THREADS / 32; i++) delete host_warp[i];
}
#define QLAUNCH(grid, kern, ...) host_grid(grid, [&] { kern(__VA_ARGS__); })
