// cuda_fp8_quant.cu — the FP8 quantiser kernels (1×128 tiles along rows or, cast-transposed, along
// columns; 128×128 blocks), bit for bit what src/fp8.h specifies; cuda_fp8.cu says how the GEMMs
// use them and tests/gpu/test_cuda_fp8.c checks them against the spec.
#include <cuda_fp8.h>

#include "cuda_fp8.cuh"

// ---- element rules (fp8.h) ------------------------------------------------------------------------

__device__ __forceinline__ float fin_abs(float x) { return isfinite(x) ? fabsf(x) : 0.f; }
__device__ __forceinline__ float scale_of_amax(float amax) {
    if (!(amax > 0.f)) return 1.f;
    const float s = __fdiv_rn(amax, 448.f);
    return s < FLT_MIN ? FLT_MIN : s;
}
__device__ __forceinline__ uint32_t quant_elem(float x, float s) {
    if (!isfinite(x)) return 0x7Fu;
    return (uint32_t)__nv_cvt_float_to_fp8(__fdiv_rn(x, s), __NV_SATFINITE, __NV_E4M3);
}

// ---- k_quant_rows: 1×128 tiles along the contiguous dimension ----------------------------------
// X [R, C] (row stride ldx) → q [R, ldq] (ldq % 4 = 0, ≥ C; zero codes in [C, ldq)), scales via sm.
// One warp per (row, tile), four consecutive elements a lane.
template <typename T>
__global__ void __launch_bounds__(Q_THREADS) k_quant_rows(const T* __restrict__ x, int R, int C, size_t ldx,
                                                          uint8_t* __restrict__ q, size_t ldq, SMap sm) {
    const int Kt = sm.Kt;
    const size_t w = ((size_t)blockIdx.x * Q_THREADS + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= (size_t)R * Kt) return;  // whole warps leave together
    const int r = (int)(w / Kt), t = (int)(w % Kt), c0 = t * TILE + 4 * lane;
    float v[4], m = 0.f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        v[j] = c0 + j < C ? to_f(x[(size_t)r * ldx + c0 + j]) : 0.f;
        m = fmaxf(m, fin_abs(v[j]));
    }
    m = warp_max(m);
    const float s = scale_of_amax(m);
    if (lane == 0) smap_put(sm, r, t, s);
    if ((size_t)c0 < ldq) {
        uint32_t word = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) word |= (c0 + j < C ? quant_elem(v[j], s) : 0u) << (8 * j);
        *(uint32_t*)(q + (size_t)r * ldq + c0) = word;
    }
}

// A 128×128 tile of X (rows [r0, r0+128) ∩ [0, R), columns [c0, c0+128) ∩ [0, C), row stride ld)
// into shared memory as fp32, zeros outside. bf16 rows that start on 16 bytes (vec) are read 8
// values at a time.
template <typename T>
__device__ __forceinline__ void load_tile(float* tile, const T* __restrict__ x, int R, int C, size_t ld, int r0, int c0,
                                          int vec) {
    if (sizeof(T) == 2 && vec) {
        for (int e = threadIdx.x; e < TILE * (TILE / 8); e += Q_THREADS) {
            const int i = e / (TILE / 8), c = (e % (TILE / 8)) * 8;
            float f[8];
            if (r0 + i < R && c0 + c + 8 <= C) {
                unpack8(f, __ldg((const uint4*)(x + (size_t)(r0 + i) * ld + c0 + c)));
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) f[j] = (r0 + i < R && c0 + c + j < C) ? to_f(x[(size_t)(r0 + i) * ld + c0 + c + j]) : 0.f;
            }
#pragma unroll
            for (int j = 0; j < 8; j++) tile[i * TSTRIDE + c + j] = f[j];
        }
        return;
    }
    for (int e = threadIdx.x; e < TILE * TILE; e += Q_THREADS) {
        const int i = e / TILE, c = e % TILE;
        tile[i * TSTRIDE + c] = (r0 + i < R && c0 + c < C) ? to_f(x[(size_t)(r0 + i) * ld + c0 + c]) : 0.f;
    }
}

// ---- k_quant_cols: the cast-transpose ------------------------------------------------------------
// X rows [0, n) (row stride ldx), C columns, one 128×128 tile a block through shared memory:
// qt [C, ldk] (ldk % 4 = 0, ≥ n; zero codes in [n, ldk)) with column c's tile t scaled from
// X[128t .. 128t+128, c] (stm: row c, tile t); optionally q [n, ldq] / srm: the row-wise codes.
template <typename T>
__global__ void __launch_bounds__(Q_THREADS) k_quant_cols(const T* __restrict__ x, int n, int C, size_t ldx,
                                                          uint8_t* __restrict__ qt, size_t ldk, SMap stm,
                                                          uint8_t* __restrict__ q, size_t ldq, SMap srm, int vec) {
    extern __shared__ float tile[];  // [TILE][TSTRIDE]
    __shared__ float cmax[2][TILE], rmax[2][TILE], csc[TILE], rsc[TILE];
    const int c0 = blockIdx.x * TILE, i0 = blockIdx.y * TILE, tid = threadIdx.x;
    load_tile(tile, x, n, C, ldx, i0, c0, vec);
    __syncthreads();
    {
        const int k = tid & (TILE - 1), h = tid >> 7;
        float mc = 0.f, mr = 0.f;
        for (int j = h * 64; j < h * 64 + 64; j++) {
            mc = fmaxf(mc, fin_abs(tile[j * TSTRIDE + k]));  // column k
            mr = fmaxf(mr, fin_abs(tile[k * TSTRIDE + j]));  // row k
        }
        cmax[h][k] = mc;
        rmax[h][k] = mr;
    }
    __syncthreads();
    if (tid < TILE) {
        const int c = tid, i = tid;
        csc[c] = scale_of_amax(fmaxf(cmax[0][c], cmax[1][c]));
        rsc[i] = scale_of_amax(fmaxf(rmax[0][i], rmax[1][i]));
        if (i0 < n && c0 + c < C) smap_put(stm, c0 + c, blockIdx.y, csc[c]);
        if (q && i0 + i < n && c0 < C) smap_put(srm, i0 + i, blockIdx.x, rsc[i]);
    }
    __syncthreads();
    // transposed codes: column c's 128 codes as 32 words
    for (int e = tid; e < TILE * 32; e += Q_THREADS) {
        const int c = e >> 5, iw = (e & 31) * 4;
        if (c0 + c >= C || (size_t)(i0 + iw) >= ldk) continue;
        uint32_t word = 0;
#pragma unroll
        for (int j = 0; j < 4; j++)
            word |= (i0 + iw + j < n ? quant_elem(tile[(iw + j) * TSTRIDE + c], csc[c]) : 0u) << (8 * j);
        *(uint32_t*)(qt + (size_t)(c0 + c) * ldk + i0 + iw) = word;
    }
    if (!q) return;
    for (int e = tid; e < TILE * 32; e += Q_THREADS) {
        const int i = e >> 5, cw = (e & 31) * 4;
        if (i0 + i >= n || (size_t)(c0 + cw) >= ldq) continue;
        uint32_t word = 0;
#pragma unroll
        for (int j = 0; j < 4; j++)
            word |= (c0 + cw + j < C ? quant_elem(tile[i * TSTRIDE + cw + j], rsc[i]) : 0u) << (8 * j);
        *(uint32_t*)(q + (size_t)(i0 + i) * ldq + c0 + cw) = word;
    }
}

// ---- k_quant_blocks: 128×128 blocks --------------------------------------------------------------
// W [R, C] (row stride ldw). trans = 0: q [R, ldq] (ldq ≥ C), block (rb, cb) scale at s[rb·lds + cb];
// trans = 1: q [C, ldq] = the transpose (ldq ≥ R), scale at s[cb·lds + rb]. Zero codes fill each
// output row to ldq.
template <typename T>
__global__ void __launch_bounds__(Q_THREADS) k_quant_blocks(const T* __restrict__ w, int R, int C, size_t ldw,
                                                            int trans, uint8_t* __restrict__ q, size_t ldq,
                                                            float* __restrict__ s, int lds, int vec) {
    extern __shared__ float tile[];
    __shared__ float red[32];
    // grid: x over the output's K (C, or R transposed, up to ldq), y over the output's rows
    const int ok0 = blockIdx.x * TILE, or0 = blockIdx.y * TILE, tid = threadIdx.x;
    const int r0 = trans ? ok0 : or0, cc0 = trans ? or0 : ok0;  // the block in W
    load_tile(tile, w, R, C, ldw, r0, cc0, vec);
    __syncthreads();
    float m = 0.f;
    for (int e = tid; e < TILE * TILE; e += Q_THREADS) m = fmaxf(m, fin_abs(tile[(e / TILE) * TSTRIDE + e % TILE]));
    m = block_max(m, red);
    const float sc = scale_of_amax(m);
    const int out_rows = trans ? C : R, out_k = trans ? R : C;
    if (tid == 0 && r0 < R && cc0 < C) s[(size_t)(trans ? cc0 / TILE : r0 / TILE) * lds + (trans ? r0 : cc0) / TILE] = sc;
    for (int e = tid; e < TILE * 32; e += Q_THREADS) {
        const int orow = e >> 5, kw = (e & 31) * 4;  // output row or0 + orow, output K ok0 + kw ..
        if (or0 + orow >= out_rows || (size_t)(ok0 + kw) >= ldq) continue;
        uint32_t word = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int k = kw + j;
            const float v = trans ? tile[k * TSTRIDE + orow] : tile[orow * TSTRIDE + k];
            word |= (ok0 + k < out_k ? quant_elem(v, sc) : 0u) << (8 * j);
        }
        *(uint32_t*)(q + (size_t)(or0 + orow) * ldq + ok0 + kw) = word;
    }
}

static const size_t TILE_SMEM = sizeof(float) * TILE * TSTRIDE;

template <typename F> static void smem_opt_in(F* f) {
    static int done = 0;  // per kernel instantiation; the attribute is per device function
    if (!done) {
        CUDA_CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)TILE_SMEM));
        done = 1;
    }
}

// ---- launchers (act dtype from the backend) -------------------------------------------------------

// bf16 rows that start on 16 bytes: the tile loads read 8 values at a time
static int vec_ok(const void* x, size_t ld) { return (uintptr_t)x % 16 == 0 && ld % 8 == 0; }

void quant_rows(Backend* be, const void* x, int R, int C, size_t ldx, uint8_t* q, size_t ldq, SMap sm) {
    if (R == 0 || C == 0) return;
    const size_t warps = (size_t)R * sm.Kt;
    const unsigned blocks = (unsigned)((warps * 32 + Q_THREADS - 1) / Q_THREADS);
    if (is_bf16(be)) k_quant_rows<bf16><<<blocks, Q_THREADS, 0, ST(be)>>>((const bf16*)x, R, C, ldx, q, ldq, sm);
    else k_quant_rows<float><<<blocks, Q_THREADS, 0, ST(be)>>>((const float*)x, R, C, ldx, q, ldq, sm);
    LAUNCH_CK(CI(be));
}

void quant_cols(Backend* be, const void* x, int n, int C, size_t ldx, uint8_t* qt, size_t ldk, SMap stm,
                       uint8_t* q, size_t ldq, SMap srm) {
    if (C == 0 || ldk == 0) return;
    const dim3 grid((unsigned)cdiv(C, TILE), (unsigned)cdiv((int)(ldk > (size_t)n ? ldk : (size_t)n), TILE));
    if (is_bf16(be)) {
        smem_opt_in(k_quant_cols<bf16>);
        k_quant_cols<bf16><<<grid, Q_THREADS, TILE_SMEM, ST(be)>>>((const bf16*)x, n, C, ldx, qt, ldk, stm, q, ldq, srm,
                                                                   vec_ok(x, ldx));
    } else {
        smem_opt_in(k_quant_cols<float>);
        k_quant_cols<float><<<grid, Q_THREADS, TILE_SMEM, ST(be)>>>((const float*)x, n, C, ldx, qt, ldk, stm, q, ldq, srm, 0);
    }
    LAUNCH_CK(CI(be));
}

// quant_cols with the column-wise output alone (no row-wise codes).
void quant_cols_t(Backend* be, const void* x, int n, int C, size_t ldx, uint8_t* qt, size_t ldk, SMap stm) {
    SMap none;
    memset(&none, 0, sizeof none);
    quant_cols(be, x, n, C, ldx, qt, ldk, stm, NULL, 0, none);
}

void quant_blocks(Backend* be, const void* w, int R, int C, size_t ldw, int trans, uint8_t* q, size_t ldq,
                         float* s, int lds) {
    if (R == 0 || C == 0) return;
    const int out_rows = trans ? C : R;
    const dim3 grid((unsigned)cdiv((int)ldq, TILE), (unsigned)cdiv(out_rows, TILE));
    if (is_bf16(be)) {
        smem_opt_in(k_quant_blocks<bf16>);
        k_quant_blocks<bf16><<<grid, Q_THREADS, TILE_SMEM, ST(be)>>>((const bf16*)w, R, C, ldw, trans, q, ldq, s, lds,
                                                                     vec_ok(w, ldw));
    } else {
        smem_opt_in(k_quant_blocks<float>);
        k_quant_blocks<float><<<grid, Q_THREADS, TILE_SMEM, ST(be)>>>((const float*)w, R, C, ldw, trans, q, ldq, s, lds, 0);
    }
    LAUNCH_CK(CI(be));
}

// ---- hooks for the tests ---------------------------------------------------------------------------
// The quantisers alone. Their scales come out in the GEMMs' (cuBLASLt's) layouts, not in fp8.h's
// plain [R, ⌈C/128⌉]: the tests map each (row, tile) to its place in these layouts.

// x [R, C] act (row stride ldx) → q [R, ldq], s in the VEC128 layout [Kt, R] (rows [0, split) of
// chunk rows, the rest at s1: the same map the GEMMs use).
extern "C" void cuda_fp8_quant_rows(Backend* be, const void* x, int R, int C, int ldx, uint8_t* q, int ldq, float* s0,
                                    float* s1, int split, int chunk) {
    quant_rows(be, x, R, C, (size_t)ldx, q, (size_t)ldq, smap_vec(s0, s1, split, chunk, R, cdiv(C, TILE)));
}
// x rows [0, n) × C (row stride ldx) → qt [C, ldk], st in the VEC128 layout [⌈n/128⌉, C]; with q
// non-NULL also q [n, ldq] and s [⌈C/128⌉, n] (the row-wise pair) from the same read.
extern "C" void cuda_fp8_quant_cols(Backend* be, const void* x, int n, int C, int ldx, uint8_t* qt, int ldk, float* st,
                                    uint8_t* q, int ldq, float* s) {
    const SMap stm = smap_vec(st, st, C, C, C, cdiv(n, TILE));
    SMap srm = smap_vec(s, s, n, n, n, cdiv(C, TILE));
    quant_cols(be, x, n, C, (size_t)ldx, qt, (size_t)ldk, stm, q, (size_t)ldq, srm);
}
// w [R, C] (row stride ldw) → 128×128 blocks: trans 0: q [R, ldq], s [⌈R/128⌉, pad4(⌈C/128⌉)];
// trans 1: q [C, ldq] = the transpose, s [⌈C/128⌉, pad4(⌈R/128⌉)].
extern "C" void cuda_fp8_quant_blocks(Backend* be, const void* w, int R, int C, int ldw, int trans, uint8_t* q, int ldq,
                                      float* s) {
    const int kt = cdiv(trans ? R : C, TILE);
    quant_blocks(be, w, R, C, (size_t)ldw, trans, q, (size_t)ldq, s, (int)up((size_t)kt, 4));
}
