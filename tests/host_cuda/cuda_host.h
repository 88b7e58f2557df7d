// cuda_host.h — just enough of CUDA to run kernels' own source on the CPU (C++20), so that `make
// test` checks CUDA source without a GPU (tests/*_host.cc, and the GPU tests built against it: the
// Makefile's HOST_GPU_TESTS). The other headers of this directory stand in for CUDA's own
// (cuda_runtime.h, cuda_bf16.h, cuda_fp8.h, cublasLt.h) and include this one, so that cuda/*.cu
// compiles unchanged with -Itests/host_cuda first on the include path.
//
// A launch (KLAUNCH) runs the grid's blocks one after another, each as blockDim OS threads;
// __syncthreads (and __syncthreads_or) and the warp-collective operations (shuffles, ballots and
// votes, match, the mma step) are barriers, so the threads of a block meet where the GPU's would.
// __shared__ arrays are function statics (one block at a time uses them). The intrinsics are their IEEE host forms. Compile with
// -ffp-contract=off: device code without fast math keeps each rounding too.
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

extern "C" {
#include "fp8.h"
}

#define CUDA_HOST_RUN 1  // cuda/*.cu: the source is being run on the CPU
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
// (inline variables: one of each in the program, since an inline function such as block_sum is
// one function whichever object's launch runs it)
inline thread_local HostIdx threadIdx, blockIdx;
inline HostIdx gridDim, blockDim;

struct uint4 { uint32_t x, y, z, w; };
struct uint2 { uint32_t x, y; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
static inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
static inline uint2 make_uint2(uint32_t a, uint32_t b) { return {a, b}; }
static inline float2 make_float2(float a, float b) { return {a, b}; }
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
template <typename T> static inline T __ldg(const T* p) { return *p; }

// the larger of each pair of 16-bit halves, unsigned
static inline uint32_t __vmaxu2(uint32_t a, uint32_t b) {
    const uint32_t lo = (a & 0xffffu) > (b & 0xffffu) ? a & 0xffffu : b & 0xffffu;
    const uint32_t hi = (a >> 16) > (b >> 16) ? a >> 16 : b >> 16;
    return lo | hi << 16;
}
static inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fsqrt_rn(float a) { return std::sqrt(a); }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
[[noreturn]] static inline void __trap() { abort(); }
// cuda_common.cuh's ex2.approx.ftz: 2^x, results below 2^-126 flushed to zero (the device's is
// approximate, within 2 ulp; the GPU tests' tolerances allow for it)
static inline float fast_exp2(float x) {
    const float y = std::exp2(x);
    return y < 0x1p-126f ? 0.f : y;
}
// and its rcp.approx.ftz: 1/x with denormal inputs and results flushed to signed zero (the
// device's is within 1 ulp)
static inline float fast_rcp(float x) {
    if (std::fabs(x) < 0x1p-126f) return std::copysign(INFINITY, x);
    const float y = 1.0f / x;
    return std::fabs(y) < 0x1p-126f ? std::copysign(0.f, y) : y;
}
using std::isfinite;
// CUDA's min and max over two values of one type
template <typename T> static inline T min(T a, T b) { return b < a ? b : a; }
template <typename T> static inline T max(T a, T b) { return a < b ? b : a; }

// ---- barriers: the block and its warps ----
// A warp-collective operation is one barrier: each lane writes its value into one of two buffers,
// meets the warp, reads, and uses the other buffer next time (a lane cannot reach the next
// operation's barrier before every lane has read this one's buffer).
enum { HOST_MAX_THREADS = 1024 };
inline std::barrier<>* host_block;
inline std::barrier<>* host_warp[HOST_MAX_THREADS / 32];
inline thread_local unsigned host_par;  // which buffer this lane's next warp operation uses
inline float host_xch[2][HOST_MAX_THREADS / 32][32];
static inline void __syncthreads() { host_block->arrive_and_wait(); }
static inline float __shfl_xor_sync(unsigned, float v, int o) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, p = host_par ^= 1;
    host_xch[p][w][l] = v;
    host_warp[w]->arrive_and_wait();
    return host_xch[p][w][l ^ o];
}
inline int host_xchi[2][HOST_MAX_THREADS / 32][32];
// the mask of the lanes whose v equals this lane's (every lane of the warp takes part)
static inline unsigned __match_any_sync(unsigned, int v) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, p = host_par ^= 1;
    host_xchi[p][w][l] = v;
    host_warp[w]->arrive_and_wait();
    unsigned m = 0;
    for (int j = 0; j < 32; j++) m |= (unsigned)(host_xchi[p][w][j] == v) << j;
    return m;
}
// lane src's v (a lane outside the warp's 32 reads its own)
template <typename T> static inline T __shfl_sync(unsigned, T v, int src) {
    static_assert(sizeof(T) == 4, "32-bit shuffles only");
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, p = host_par ^= 1;
    memcpy(&host_xchi[p][w][l], &v, 4);
    host_warp[w]->arrive_and_wait();
    T r;
    memcpy(&r, &host_xchi[p][w][src >= 0 && src < 32 ? src : l], 4);
    return r;
}
// lane l − delta's v (lanes below delta read their own)
template <typename T> static inline T __shfl_up_sync(unsigned m, T v, unsigned delta) {
    const int l = threadIdx.x & 31;
    return __shfl_sync(m, v, l >= (int)delta ? l - (int)delta : l);
}
// bit l set where lane l's pred is true
static inline unsigned __ballot_sync(unsigned, int pred) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, p = host_par ^= 1;
    host_xchi[p][w][l] = pred != 0;
    host_warp[w]->arrive_and_wait();
    unsigned r = 0;
    for (int j = 0; j < 32; j++) r |= (unsigned)host_xchi[p][w][j] << j;
    return r;
}
static inline int __any_sync(unsigned m, int pred) { return __ballot_sync(m, pred) != 0; }
// whether any thread of the block has pred ≠ 0: contributions, a barrier, the reads, a barrier, the
// reset, a barrier (no thread can contribute to the next call before the reset)
inline std::atomic<int> host_any;
static inline int __syncthreads_or(int pred) {
    if (pred) host_any.store(1);
    __syncthreads();
    const int r = host_any.load();
    __syncthreads();
    if (threadIdx.x == 0) host_any.store(0);
    __syncthreads();
    return r;
}
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
template <typename T> static inline T atomicAdd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_add(v); }

// The mma.sync.m16n8k32.row.col.f32.e4m3.e4m3.f32 step of cuda_fp8_kernels.cu (its comment gives
// the fragments' layout, from the PTX ISA): each lane's d += its elements of A·B. mma_acc is
// double here, so a 128-K tile's partial stays exact (products of two e4m3 values are multiples
// of 2^-18 below 2^18: a tile's sum needs at most 43 bits) and the kernel's one rounding of it to
// fp32 gives the spec's P_t. (The GPU's tensor core keeps fewer bits; tests/gpu bounds that.)
typedef double mma_acc;
inline uint32_t host_frag[2][HOST_MAX_THREADS / 32][32][6];
static inline void mma_e4m3(mma_acc (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                            uint32_t b1) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, g = l >> 2, tg = l & 3, p = host_par ^= 1;
    const uint32_t mine[6] = {a0, a1, a2, a3, b0, b1};
    memcpy(host_frag[p][w][l], mine, sizeof mine);
    host_warp[w]->arrive_and_wait();
    // A (row r, k): lane 4·(r % 8) + (k % 16) / 4; register a0 / a1 (k < 16; rows r < 8 / ≥ 8) or
    // a2 / a3 (k ≥ 16); byte k % 4.
    auto a = [&](int r, int k) {
        const int reg = (r >= 8) + 2 * (k >= 16), lane = 4 * (r & 7) + (k & 15) / 4;
        return fp8_e4m3_to_f32((uint8_t)(host_frag[p][w][lane][reg] >> (8 * (k & 3))));
    };
    // B (k, column n): lane 4·n + (k % 16) / 4, register b0 (k < 16) or b1; byte k % 4.
    auto b = [&](int k, int n) {
        const int reg = 4 + (k >= 16), lane = 4 * n + (k & 15) / 4;
        return fp8_e4m3_to_f32((uint8_t)(host_frag[p][w][lane][reg] >> (8 * (k & 3))));
    };
    for (int e = 0; e < 4; e++) {
        const int r = g + 8 * (e >> 1), n = 2 * tg + (e & 1);
        double s = 0;
        for (int k = 0; k < 32; k++) s += (double)a(r, k) * (double)b(k, n);  // exact (41 bits at most)
        d[e] += s;
    }
}

// Runs f(0), ..., f(n − 1) on n threads of a pool kept across launches (host_pool.cc), and returns
// when all have returned.
void host_pool_run(unsigned n, const std::function<void(unsigned)>& f);

// Runs kern over grid g (x fastest) with `threads` threads a block (a multiple of 32).
static inline void host_grid(dim3 g, unsigned threads, const std::function<void()>& kern) {
    if (threads == 0 || threads % 32 || threads > HOST_MAX_THREADS) abort();
    gridDim = {g.x, g.y, 1};
    blockDim = {threads, 1, 1};
    std::barrier<> blk(threads);
    for (unsigned i = 0; i < threads / 32; i++) host_warp[i] = new std::barrier<>(32);
    host_block = &blk;
    host_pool_run(threads, [&](unsigned t) {
        threadIdx = {t, 0, 0};
        host_par = 0;
        for (unsigned by = 0; by < g.y; by++)
            for (unsigned bx = 0; bx < g.x; bx++) {
                blockIdx = {bx, by, 0};
                kern();
                blk.arrive_and_wait();  // the block's statics are the next block's
            }
    });
    for (unsigned i = 0; i < threads / 32; i++) delete host_warp[i];
}
// cuda_common.cuh's launch, run here (the stream is ignored: one launch after another is its order)
#define KLAUNCH(grid, threads, stream, kern, ...) host_grid(grid, threads, [&] { kern(__VA_ARGS__); })
