// fp8_smap.cuh — the FP8 tile constants and the scale map of a quantised operand: what the
// quantiser kernels (cuda_fp8_quant.cu) and the GEMMs (cuda_fp8.cu) share. No CUDA runtime here,
// so that the quantisers' own source also runs on the CPU (tests/host_cuda).
#pragma once
#include <float.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum { TILE = 128, Q_THREADS = 256 };
static inline size_t up(size_t x, size_t a) { return (x + a - 1) / a * a; }
static inline int cdiv(int a, int b) { return (a + b - 1) / b; }

// Where the scale of (row r, K tile t) of a quantised operand lives. Rows [0, split) are cut in
// chunks of `chunk` rows (the last one shorter), chunk c at p0 + c·chunk·Kt with layout [Kt, rows
// of the chunk] (cuBLASLt's VEC128 layout for that chunk); rows [split, R) at p1 as [Kt, R − split].
// blk: a BLK128x128 operand instead, scale at p0[(r / 128) · lds + t].
struct SMap {
    float* p0;
    float* p1;
    int split, chunk, R, Kt;
    int blk, lds;
};
__host__ __device__ __forceinline__ size_t smap_idx(const SMap& m, int r, int t, float** base) {
    if (m.blk) {
        *base = m.p0;
        return (size_t)(r >> 7) * m.lds + t;
    }
    if (r < m.split) {
        if (m.chunk >= m.split) {  // one chunk (the usual map): no division
            *base = m.p0;
            return (size_t)t * m.split + r;
        }
        const int c = r / m.chunk, r0 = c * m.chunk, n = m.split - r0 < m.chunk ? m.split - r0 : m.chunk;
        *base = m.p0;
        return (size_t)r0 * m.Kt + (size_t)t * n + (r - r0);
    }
    *base = m.p1;
    return (size_t)t * (m.R - m.split) + (r - m.split);
}
__device__ __forceinline__ void smap_put(const SMap& m, int r, int t, float v) {
    float* b;
    const size_t i = smap_idx(m, r, t, &b);
    b[i] = v;
}
__device__ __forceinline__ float smap_get(const SMap& m, int r, int t) {
    float* b;
    const size_t i = smap_idx(m, r, t, &b);
    return __ldg(b + i);
}
static inline SMap smap_vec(float* p0, float* p1, int split, int chunk, int R, int Kt) {
    SMap m;
    m.p0 = p0, m.p1 = p1, m.split = split, m.chunk = chunk > 0 ? chunk : (split > 0 ? split : 1), m.R = R, m.Kt = Kt;
    m.blk = 0, m.lds = 0;
    return m;
}
static inline SMap smap_blk(float* p, int Kt) {
    SMap m;
    memset(&m, 0, sizeof m);
    m.p0 = p, m.Kt = Kt, m.blk = 1, m.lds = (int)up((size_t)Kt, 4);
    return m;
}
