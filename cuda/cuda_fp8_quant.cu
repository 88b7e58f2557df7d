// cuda_fp8_quant.cu — the FP8 quantiser kernels (1×128 tiles along rows or, cast-transposed, along
// columns; 128×128 blocks), bit for bit what src/fp8.h specifies; cuda_fp8.cu says how the GEMMs
// use them and tests/gpu/test_cuda_fp8_quant.c checks them against the spec on the GPU.
// `make test` also runs this file and that test on the CPU (tests/host_cuda: stand-ins for CUDA's
// headers, threads, barriers, shuffles and intrinsics), so that the kernels' indexing is checked
// against the spec without a GPU too.
#include <cuda_fp8.h>

#include "cuda_fp8.cuh"
#define QLAUNCH(grid, kern, ...) KLAUNCH(grid, Q_THREADS, ST(be), kern, __VA_ARGS__)

// ---- element rules (fp8.h) ------------------------------------------------------------------------

__device__ __forceinline__ float fin_abs(float x) { return isfinite(x) ? fabsf(x) : 0.f; }
// fl(amax / 448) as q = fl(amax · fl(1/448)) and one correction with the exact residual: a product
// and two FMAs instead of a division. Equal to the division for every positive finite amax once
// the FLT_MIN floor applies (checked over all 2^31 of them; below the floor the two may differ).
__device__ __forceinline__ float scale_of_amax(float amax) {
    if (!(amax > 0.f)) return 1.f;
    const float r = 1.0f / 448.f, q = __fmul_rn(amax, r);
    const float s = __fmaf_rn(__fmaf_rn(-q, 448.f, amax), r, q);
    return s < FLT_MIN ? FLT_MIN : s;
}

// A tile of scale s codes its elements as e4m3(fl(x · y)) with y = fl(1/s), the reciprocal rounded
// once a tile (fp8.h): one multiply and half a conversion an element, so the kernels run at memory
// speed. SAFE: the tile holds a non-finite element, which codes to 0x7F (the tile's amax is then
// taken over its finite elements: fin_abs); otherwise every element is finite and needs no test.
template <bool SAFE> __device__ __forceinline__ uint32_t codes2(float a, float b, float y) {
    uint32_t c = __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(a, y), __fmul_rn(b, y)), __NV_SATFINITE, __NV_E4M3);
    if (SAFE) {
        if (!isfinite(a)) c = (c & 0xff00u) | 0x7fu;
        if (!isfinite(b)) c = (c & 0x00ffu) | 0x7f00u;
    }
    return c;
}
// Eight elements' codes, element j in byte j.
template <bool SAFE> __device__ __forceinline__ uint2 codes8(const float* v, float y) {
    return make_uint2(codes2<SAFE>(v[0], v[1], y) | codes2<SAFE>(v[2], v[3], y) << 16,
                      codes2<SAFE>(v[4], v[5], y) | codes2<SAFE>(v[6], v[7], y) << 16);
}
__device__ __forceinline__ uint2 codes8(const float* v, float y, bool safe) {
    return safe ? codes8<true>(v, y) : codes8<false>(v, y);
}

// ---- a thread's elements, kept as loaded ---------------------------------------------------------
// Tile<T, N>: N rows of 8 consecutive elements. fp32 as floats; bf16 as the 16-byte words loaded,
// half the registers, each element widened to fp32 (exactly: its bits shifted) only where it is
// coded. The maxima of bf16 magnitudes are taken on the bits, two at a time: x & 0x7fff orders as
// |x| for every finite value and ±inf (0x7f80), and every NaN's bits are above inf's, so a maximum
// ≥ 0x7f80 says the elements hold a non-finite one (`bad`), and below it is the finite amax exactly.
// fp32 magnitudes: m = max(m, |x|) (fmaxf passes NaN over, so m alone misses it) and nf = x·0 +
// nf, which stays 0 while every x is finite and is NaN from the first ±inf or NaN on. A tile with
// a non-finite element takes its amax again over its finite elements (fin_abs) and codes SAFE.
template <typename T, int N> struct Tile;
template <int N> struct Tile<float, N> {
    float v[N][8];
    __device__ __forceinline__ float at(int i, int j) const { return v[i][j]; }
};
template <int N> struct Tile<bf16, N> {
    uint32_t w[N][4];  // row i, elements 2p (low half) and 2p + 1 (high half) in w[i][p]
    __device__ __forceinline__ float at(int i, int j) const {
        const uint32_t x = w[i][j >> 1];
        return __uint_as_float((j & 1) ? x & 0xffff0000u : x << 16);
    }
};

// Row i of the tile: eight consecutive elements x[0..8), one 16-byte load (bf16) or two (fp32) when
// vec and all eight exist (n ≥ 8), else element by element with zeros past n.
template <int N>
__device__ __forceinline__ void load_row(Tile<float, N>& t, int i, const float* __restrict__ x, int n, bool vec) {
    if (vec && n >= 8) {
        const float4 a = __ldg((const float4*)x), b = __ldg((const float4*)x + 1);
        float* f = t.v[i];
        f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++) t.v[i][j] = j < n ? x[j] : 0.f;
}
template <int N>
__device__ __forceinline__ void load_row(Tile<bf16, N>& t, int i, const bf16* __restrict__ x, int n, bool vec) {
    if (vec && n >= 8) {
        const uint4 u = __ldg((const uint4*)x);
        t.w[i][0] = u.x, t.w[i][1] = u.y, t.w[i][2] = u.z, t.w[i][3] = u.w;
        return;
    }
    const unsigned short* b = (const unsigned short*)x;
#pragma unroll
    for (int p = 0; p < 4; p++)
        t.w[i][p] = (2 * p < n ? (uint32_t)b[2 * p] : 0u) | (2 * p + 1 < n ? (uint32_t)b[2 * p + 1] << 16 : 0u);
}

__device__ __forceinline__ void amax_step(float& m, float& nf, float x) {
    m = fmaxf(m, fabsf(x));
    nf = __fmaf_rn(x, 0.f, nf);
}
// the larger of each pair of 16-bit halves, unsigned
__device__ __forceinline__ uint32_t vmax_u16x2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint32_t d;
    asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
#else
    return __vmaxu2(a, b);
#endif
}
__device__ __forceinline__ uint32_t mag2(uint32_t x) { return x & 0x7fff7fffu; }
// A bf16 magnitude's bits (< 2^16) as the float amax; bad when non-finite.
__device__ __forceinline__ float mag_f(uint32_t h, bool& bad) {
    bad = bad || h >= 0x7f80u;
    return __uint_as_float(h << 16);
}
__device__ __forceinline__ uint32_t hmax_halves(uint32_t a) {
    const uint32_t lo = a & 0xffffu, hi = a >> 16;
    return lo > hi ? lo : hi;
}

// max |x| over row i; bad: it holds a non-finite element
template <int N> __device__ __forceinline__ float row_max(const Tile<float, N>& t, int i, bool& bad) {
    float m = 0.f, nf = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) amax_step(m, nf, t.v[i][j]);
    bad = bad || nf != 0.f;
    return m;
}
template <int N> __device__ __forceinline__ float row_max(const Tile<bf16, N>& t, int i, bool& bad) {
    const uint32_t a = vmax_u16x2(vmax_u16x2(mag2(t.w[i][0]), mag2(t.w[i][1])), vmax_u16x2(mag2(t.w[i][2]), mag2(t.w[i][3])));
    return mag_f(hmax_halves(a), bad);
}
// max |x| over all the tile's elements
template <int N> __device__ __forceinline__ float all_max(const Tile<float, N>& t, bool& bad) {
    float m = 0.f, nf = 0.f;
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) amax_step(m, nf, t.v[i][j]);
    bad = bad || nf != 0.f;
    return m;
}
template <int N> __device__ __forceinline__ float all_max(const Tile<bf16, N>& t, bool& bad) {
    uint32_t a = 0;
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int p = 0; p < 4; p++) a = vmax_u16x2(a, mag2(t.w[i][p]));
    return mag_f(hmax_halves(a), bad);
}
// m[j] = max |x| over column j's N elements
template <int N> __device__ __forceinline__ void col_max(const Tile<float, N>& t, float* m, bool& bad) {
    float nf = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        m[j] = 0.f;
#pragma unroll
        for (int i = 0; i < N; i++) amax_step(m[j], nf, t.v[i][j]);
    }
    bad = bad || nf != 0.f;
}
template <int N> __device__ __forceinline__ void col_max(const Tile<bf16, N>& t, float* m, bool& bad) {
#pragma unroll
    for (int p = 0; p < 4; p++) {
        uint32_t a = mag2(t.w[0][p]);
#pragma unroll
        for (int i = 1; i < N; i++) a = vmax_u16x2(a, mag2(t.w[i][p]));
        m[2 * p] = mag_f(a & 0xffffu, bad);
        m[2 * p + 1] = mag_f(a >> 16, bad);
    }
}
// The SAFE tiles' maxima: over the finite elements only (element by element; rare).
template <typename T, int N> __device__ __forceinline__ float fin_row_max(const Tile<T, N>& t, int i) {
    float m = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) m = fmaxf(m, fin_abs(t.at(i, j)));
    return m;
}
template <typename T, int N> __device__ __forceinline__ float fin_col_max(const Tile<T, N>& t, int j) {
    float m = 0.f;
#pragma unroll
    for (int i = 0; i < N; i++) m = fmaxf(m, fin_abs(t.at(i, j)));
    return m;
}
// Codes of row i, or of column j (N = 8), with reciprocal scale y.
template <typename T, int N> __device__ __forceinline__ uint2 row_codes(const Tile<T, N>& t, int i, float y, bool safe) {
    float f[8];
#pragma unroll
    for (int j = 0; j < 8; j++) f[j] = t.at(i, j);
    return codes8(f, y, safe);
}
template <typename T> __device__ __forceinline__ uint2 col_codes(const Tile<T, 8>& t, int j, float y, bool safe) {
    float f[8];
#pragma unroll
    for (int i = 0; i < 8; i++) f[i] = t.at(i, j);
    return codes8(f, y, safe);
}

// Eight codes at q[0..8), of which the first n ≤ 8 exist (n ≥ 8 and w8: one 8-byte store; else
// 4-byte words, n a multiple of 4: ldq % 4 = 0).
__device__ __forceinline__ void store8(uint8_t* q, uint2 c, int n, bool w8) {
    if (n >= 8 && w8) {
        *(uint2*)q = c;
        return;
    }
    if (n >= 4) *(uint32_t*)q = c.x;
    if (n >= 8) *(uint32_t*)(q + 4) = c.y;
}

// ---- k_quant_rows: 1×128 tiles along the contiguous dimension ----------------------------------
// X [R, C] (row stride ldx) → q [R, ldq] (ldq % 4 = 0, ≥ C; zero codes in [C, ldq)), scales via sm.
// Sixteen threads a tile, eight consecutive elements a thread; a block is 16 tiles of a row wide
// (grid.x over tiles) and ROWS_Q rows high (grid.y), so each thread keeps ROWS_Q loads in flight.
enum { ROWS_Q = 4 };
template <typename T>
__global__ void __launch_bounds__(Q_THREADS) k_quant_rows(const T* __restrict__ x, int R, int C, size_t ldx,
                                                          uint8_t* __restrict__ q, size_t ldq, SMap sm, int vec,
                                                          int w8) {
    const int sub = threadIdx.x & 15, t = blockIdx.x * (Q_THREADS / 16) + (threadIdx.x >> 4);
    const int c0 = t * TILE + sub * 8;
    for (int rb = blockIdx.y * ROWS_Q; rb < R; rb += gridDim.y * ROWS_Q) {
        Tile<T, ROWS_Q> v;
#pragma unroll
        for (int j = 0; j < ROWS_Q; j++) {
            const int r = rb + j, n = (r < R && t < sm.Kt) ? C - c0 : 0;
            load_row(v, j, x + (size_t)(r < R ? r : 0) * ldx + (n > 0 ? c0 : 0), n, vec);
        }
#pragma unroll
        for (int j = 0; j < ROWS_Q; j++) {
            const int r = rb + j;
            bool bad = false;
            float m = row_max(v, j, bad);
            const bool safe = __any_sync(0xffffffffu, bad);  // both tiles of the warp, if either
            if (safe) m = fin_row_max(v, j);
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));  // the 16 lanes of a tile
            const float s = scale_of_amax(m);
            if (r >= R || t >= sm.Kt) continue;
            if (sub == 0) smap_put(sm, r, t, s);
            if ((size_t)c0 < ldq)
                store8(q + (size_t)r * ldq + c0, row_codes(v, j, __frcp_rn(s), safe), (int)(ldq - c0), w8);
        }
    }
}

// Blocks an SM the 128×128 kernels are bounded to: bf16 tiles (32 registers of elements) leave room
// for four, fp32 tiles (64) for three.
#define Q_BLOCKS_SM(T) (sizeof(T) == 2 ? 4 : 3)

// ---- the 128×128 tile kernels ----------------------------------------------------------------------
// A block takes a 128×128 tile of X: thread (ty, tx) = (tid / 16, tid % 16) holds the 8×8
// elements at rows 8·ty + i, columns 8·tx + j, in registers. Transposed codes go out through
// shared memory: column c's 16 chunks of 8 codes (8 rows each) at tq[16·c + (k ^ (c/8 % 16))], the
// XOR keeping the writes of a half-warp on distinct banks; each output row of 128 codes is then
// stored 16 bytes at a time.

// The tile rows [r0, r0+128) ∩ [0, R), columns [c0, c0+128) ∩ [0, C) of x (row stride ld) into v,
// zeros outside.
template <typename T>
__device__ __forceinline__ void load_tile8x8(Tile<T, 8>& v, const T* __restrict__ x, int R, int C, size_t ld, int r0,
                                             int c0, bool vec) {
    const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15, cc = c0 + tx * 8;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int r = r0 + ty * 8 + i, n = (r < R && cc < C) ? C - cc : 0;
        load_row(v, i, x + (n > 0 ? (size_t)r * ld + cc : 0), n, vec);
    }
}

// Thread's column j codes (its 8 rows, reciprocal scale y[j]) into tq.
template <typename T> __device__ __forceinline__ void put_cols(uint2* tq, const Tile<T, 8>& v, const float* y, bool safe) {
    const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
#pragma unroll
    for (int j = 0; j < 8; j++) tq[16 * (tx * 8 + j) + (ty ^ tx)] = col_codes(v, j, y[j], safe);
}
// tq's 128 output rows (output row or0 + c, of out_rows) of 128 codes at output column ok0 .. into
// qt [out_rows, ldk]; codes up to ldk (the zero padding included).
__device__ __forceinline__ void store_cols(uint8_t* __restrict__ qt, size_t ldk, const uint2* tq, int or0, int out_rows,
                                           int ok0, bool w16) {
    for (int e = threadIdx.x; e < TILE * 8; e += Q_THREADS) {
        const int c = e >> 3, p = e & 7, sw = (c >> 3) & 15, k = ok0 + 16 * p;
        if (or0 + c >= out_rows || (size_t)k >= ldk) continue;
        const uint2 a = tq[16 * c + ((2 * p) ^ sw)], b = tq[16 * c + ((2 * p + 1) ^ sw)];
        uint8_t* dst = qt + (size_t)(or0 + c) * ldk + k;
        const size_t n = ldk - (size_t)k;
        if (n >= 16 && w16) {
            *(uint4*)dst = make_uint4(a.x, a.y, b.x, b.y);
        } else {  // 4-byte words (ldk % 4 = 0)
            const uint32_t w[4] = {a.x, a.y, b.x, b.y};
#pragma unroll
            for (int u = 0; u < 4; u++)
                if ((size_t)(4 * u) < n) *(uint32_t*)(dst + 4 * u) = w[u];
        }
    }
}

// ---- k_quant_cols: the cast-transpose ------------------------------------------------------------
// What the cast-transpose makes of a 128×128 tile held in v: rows [i0, i0 + 128) ∩ [0, n) of X,
// columns [c0, c0 + 128) ∩ [0, C). qt [C, ldk] (ldk % 4 = 0, ≥ n; zero codes in [n, ldk)) with
// column c's tile i0 / 128 scaled from X[i0 .. i0+128, c] (stm: row c); optionally q [n, ldq] /
// srm: the row-wise codes of the same values. The block is tile (blockIdx.x, blockIdx.y) = (c0, i0)
// / 128; shared memory from the kernel: tq, cmax, csc.
template <typename T>
__device__ __forceinline__ void cols_tile(const Tile<T, 8>& v, int n, int C, int i0, int c0, uint8_t* __restrict__ qt,
                                          size_t ldk, const SMap& stm, uint8_t* __restrict__ q, size_t ldq,
                                          const SMap& srm, int w16, int w8, uint2* tq, float (*cmax)[TILE], float* csc) {
    const int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15, warp = tid >> 5;
    // column maxima: the thread's 8 rows, the other half-warp's, then the 8 warps through smem;
    // safe: the tile holds a non-finite element (then every column and row of it is coded SAFE)
    bool safe;
    {
        float m[8];
        bool bad = false;
        col_max(v, m, bad);
        safe = __syncthreads_or(bad);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (safe) m[j] = fin_col_max(v, j);
            m[j] = fmaxf(m[j], __shfl_xor_sync(0xffffffffu, m[j], 16));
        }
        if ((tid & 16) == 0)
#pragma unroll
            for (int j = 0; j < 8; j++) cmax[warp][tx * 8 + j] = m[j];
    }
    __syncthreads();
    if (tid < TILE) {
        float m = 0.f;
#pragma unroll
        for (int w = 0; w < Q_THREADS / 32; w++) m = fmaxf(m, cmax[w][tid]);
        csc[tid] = scale_of_amax(m);
        if (i0 < n && c0 + tid < C) smap_put(stm, c0 + tid, blockIdx.y, csc[tid]);
    }
    __syncthreads();
    {
        float y[8];
#pragma unroll
        for (int j = 0; j < 8; j++) y[j] = __frcp_rn(csc[tx * 8 + j]);
        put_cols(tq, v, y, safe);
    }
    if (q) {  // row-wise: row maxima over the 16 threads of a row
#pragma unroll
        for (int i = 0; i < 8; i++) {
            bool bad = false;
            float m = safe ? fin_row_max(v, i) : row_max(v, i, bad);
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            const float s = scale_of_amax(m);
            const int r = i0 + ty * 8 + i, cc = c0 + tx * 8;
            if (r >= n || c0 >= C) continue;
            if (tx == 0) smap_put(srm, r, blockIdx.x, s);
            if ((size_t)cc < ldq) store8(q + (size_t)r * ldq + cc, row_codes(v, i, __frcp_rn(s), safe), (int)(ldq - cc), w8);
        }
    }
    __syncthreads();
    store_cols(qt, ldk, tq, c0, C, i0, w16);
}

// X rows [0, n) (row stride ldx), C columns, one 128×128 tile a block: cols_tile of what it loads.
template <typename T>
__global__ void __launch_bounds__(Q_THREADS, Q_BLOCKS_SM(T)) k_quant_cols(const T* __restrict__ x, int n, int C, size_t ldx,
                                                             uint8_t* __restrict__ qt, size_t ldk, SMap stm,
                                                             uint8_t* __restrict__ q, size_t ldq, SMap srm, int vec,
                                                             int w16, int w8) {
    __shared__ uint2 tq[TILE * 16];
    __shared__ float cmax[Q_THREADS / 32][TILE];
    __shared__ __align__(16) float csc[TILE];
    const int c0 = blockIdx.x * TILE, i0 = blockIdx.y * TILE;
    Tile<T, 8> v;
    load_tile8x8(v, x, n, C, ldx, i0, c0, vec);
    cols_tile(v, n, C, i0, c0, qt, ldk, stm, q, ldq, srm, w16, w8, tq, cmax, csc);
}

// ---- k_quant_blocks: 128×128 blocks --------------------------------------------------------------
// W [R, C] (row stride ldw). trans = 0: q [R, ldq] (ldq ≥ C), block (rb, cb) scale at s[rb·lds + cb];
// trans = 1: q [C, ldq] = the transpose (ldq ≥ R), scale at s[cb·lds + rb]. Zero codes fill each
// output row to ldq. trans = 2: both from one read, as stored into q / s and transposed into qt
// [C, ldqt] / st (ldst), the grid that of trans = 0 (ldqt, like ldq, within the last block).
template <typename T>
__global__ void __launch_bounds__(Q_THREADS, Q_BLOCKS_SM(T)) k_quant_blocks(const T* __restrict__ w, int R, int C, size_t ldw,
                                                               int trans, uint8_t* __restrict__ q, size_t ldq,
                                                               float* __restrict__ s, int lds, uint8_t* __restrict__ qt,
                                                               size_t ldqt, float* __restrict__ st, int ldst, int vec,
                                                               int w16, int w8) {
    __shared__ uint2 tq[TILE * 16];
    __shared__ float red[32];
    // grid: x over the output's K (C, or R transposed, up to ldq), y over the output's rows
    const int ok0 = blockIdx.x * TILE, or0 = blockIdx.y * TILE, tid = threadIdx.x;
    const int r0 = trans == 1 ? ok0 : or0, cc0 = trans == 1 ? or0 : ok0;  // the block in W
    Tile<T, 8> v;
    load_tile8x8(v, w, R, C, ldw, r0, cc0, vec);
    bool bad = false;
    float m = all_max(v, bad);
    const bool safe = __syncthreads_or(bad);  // a non-finite element in the block
    if (safe) {
        m = 0.f;
#pragma unroll
        for (int i = 0; i < 8; i++) m = fmaxf(m, fin_row_max(v, i));
    }
    m = block_max(m, red);
    const float sc = scale_of_amax(m), y = __frcp_rn(sc);
    if (tid == 0 && r0 < R && cc0 < C) {
        if (trans != 1) s[(size_t)(r0 / TILE) * lds + cc0 / TILE] = sc;
        if (trans == 1) s[(size_t)(cc0 / TILE) * lds + r0 / TILE] = sc;
        if (trans == 2) st[(size_t)(cc0 / TILE) * ldst + r0 / TILE] = sc;
    }
    if (trans != 1) {
        const int tx = tid & 15, cc = ok0 + tx * 8;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int r = or0 + (tid >> 4) * 8 + i;
            if (r < R && (size_t)cc < ldq) store8(q + (size_t)r * ldq + cc, row_codes(v, i, y, safe), (int)(ldq - cc), w8);
        }
        if (trans == 0) return;
    }
    float yy[8];
#pragma unroll
    for (int j = 0; j < 8; j++) yy[j] = y;
    put_cols(tq, v, yy, safe);
    __syncthreads();
    if (trans == 1) store_cols(q, ldq, tq, or0, C, ok0, w16);
    else store_cols(qt, ldqt, tq, cc0, C, r0, w16);
}

// ---- the SwiGLU forward and backward with their outputs' row-wise codes ----------------------------
// One 1×128 tile of row r held by 16 consecutive lanes, 8 bf16 of it each (wd; lanes past the row
// hold zeros, on false, and store nothing). Every lane of the warp calls it (the shuffles). Writes
// the tile's codes at q + r·ldq + c (c: this lane's first column) and its scale through srm (from
// the tile's first lane): what k_quant_rows makes of those values, SAFE where a tile of the warp
// holds a non-finite one.
__device__ __forceinline__ void tile16_codes(uint4 wd, bool on, int r, int c, uint8_t* __restrict__ q, size_t ldq,
                                             const SMap& srm, int w8) {
    Tile<bf16, 1> v;
    v.w[0][0] = wd.x, v.w[0][1] = wd.y, v.w[0][2] = wd.z, v.w[0][3] = wd.w;
    bool bad = false;
    float m = row_max(v, 0, bad);
    const bool safe = __any_sync(0xffffffffu, bad);
    if (safe) m = fin_row_max(v, 0);
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float sc = scale_of_amax(m);
    if (!on) return;
    if (c % TILE == 0) smap_put(srm, r, c / TILE, sc);
    store8(q + (size_t)r * ldq + c, row_codes(v, 0, __frcp_rn(sc), safe), 8, w8);
}

// The SwiGLU forward (k_swiglu_fwd_v8's bits through swiglu_fwd8) that also writes h's 1×128 codes
// along F: q [n, ldq], scales through srm. One block a row; F % 128 = 0, so a tile is 16
// consecutive words; a warp's iterations stay uniform for the shuffles.
__global__ void __launch_bounds__(Q_THREADS) k_swiglu_fwd_rows(bf16* h, const bf16* gu, const float* scale, int F,
                                                               uint8_t* __restrict__ q, size_t ldq, SMap srm, int w8) {
    const int r = blockIdx.x, lane = threadIdx.x & 31, W = F / 8;
    const float s = scale ? scale[r] : 1.0f;
    const uint4* g4 = (const uint4*)(gu + (size_t)r * 2 * F);
    const uint4* u4 = (const uint4*)(gu + (size_t)r * 2 * F + F);
    uint4* h4 = (uint4*)(h + (size_t)r * F);
    for (int w = threadIdx.x; w - lane < W; w += blockDim.x) {
        const bool on = w < W;
        uint4 hw = make_uint4(0, 0, 0, 0);
        if (on) {
            hw = swiglu_fwd8(g4[w], u4[w], s, scale != nullptr);
            h4[w] = hw;
        }
        tile16_codes(hw, on, r, w * 8, q, ldq, srm, w8);
    }
}

// The SwiGLU forward (swiglu_fwd8's bits) of one 128×128 tile of h [n, F] a block, h kept in
// registers as k_quant_cols keeps a loaded bf16 tile, and cols_tile of it: h's codes along the
// rows (qt [F, ldk], stm) for w2's weight gradient and along F (q [n, ldq], srm) for w2's product,
// what k_quant_cols makes of the written h. h itself is not stored. F % 128 = 0,
// gu's rows on 16 bytes. Four blocks an SM measured faster than three (more warps to hide the
// SwiGLU's latency) and than two with every load issued first.
__global__ void __launch_bounds__(Q_THREADS, Q_BLOCKS_SM(bf16))
    k_swiglu_fwd_tiles(const bf16* __restrict__ gu, const float* __restrict__ scale, int n, int F,
                       uint8_t* __restrict__ qt, size_t ldk, SMap stm, uint8_t* __restrict__ q, size_t ldq, SMap srm,
                       int w16, int w8) {
    __shared__ uint2 tq[TILE * 16];
    __shared__ float cmax[Q_THREADS / 32][TILE];
    __shared__ __align__(16) float csc[TILE];
    const int c0 = blockIdx.x * TILE, i0 = blockIdx.y * TILE, cc = c0 + (threadIdx.x & 15) * 8;
    Tile<bf16, 8> v;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int r = i0 + (threadIdx.x >> 4) * 8 + i;
        uint4 hw = make_uint4(0, 0, 0, 0);
        if (r < n) {
            const bf16* g = gu + (size_t)r * 2 * F + cc;
            hw = swiglu_fwd8(__ldg((const uint4*)g), __ldg((const uint4*)(g + F)), scale ? scale[r] : 1.0f,
                             scale != nullptr);
        }
        v.w[i][0] = hw.x, v.w[i][1] = hw.y, v.w[i][2] = hw.z, v.w[i][3] = hw.w;
    }
    cols_tile(v, n, F, i0, c0, qt, ldk, stm, q, ldq, srm, w16, w8, tq, cmax, csc);
}

// k_swiglu_bwd_v8's arithmetic (cuda_moe.cu; both through swiglu_bwd8), so d(gate|up) and dscale are
// its bits, and from the bf16 words it writes, d(gate|up)'s 1×128 codes along 2F: q [n, ldq], scales
// through srm, what k_quant_rows makes of the written rows. One block a row. F % 128 = 0: a tile is
// 16 consecutive words of one half, held by 16 consecutive lanes, and its maximum is 4 shuffles. A
// warp's iterations stay uniform (lanes past the row hold zeros and store nothing) for the shuffles.
__global__ void __launch_bounds__(Q_THREADS) k_swiglu_bwd_rows(bf16* dgu, float* dscale, const bf16* dh, const bf16* gu,
                                                               const float* scale, int F, uint8_t* __restrict__ q,
                                                               size_t ldq, SMap srm, int w8) {
    __shared__ float sh[32];
    const int r = blockIdx.x, lane = threadIdx.x & 31, W = F / 8;
    const float s = scale ? scale[r] : 1.0f;
    const uint4* g4 = (const uint4*)(gu + (size_t)r * 2 * F);
    const uint4* u4 = (const uint4*)(gu + (size_t)r * 2 * F + F);
    const uint4* d4 = (const uint4*)(dh + (size_t)r * F);
    uint4* dgu4 = (uint4*)(dgu + (size_t)r * 2 * F);
    float ds = 0.f;
    for (int w = threadIdx.x; w - lane < W; w += blockDim.x) {
        const bool on = w < W;
        uint4 dw[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};  // d(gate), d(up) words
        if (on) {
            swiglu_bwd8(g4[w], u4[w], d4[w], s, &dw[0], &dw[1], &ds);
            dgu4[W + w] = dw[1];
            dgu4[w] = dw[0];
        }
#pragma unroll
        for (int h = 0; h < 2; h++) tile16_codes(dw[h], on, r, h * F + w * 8, q, ldq, srm, w8);  // d(gate), d(up)
    }
    if (dscale) {
        ds = block_sum(ds, sh);
        if (threadIdx.x == 0) dscale[r] = ds;
    }
}

// ---- launchers (act dtype from the backend) -------------------------------------------------------

// rows of 8 elements that start on 16 bytes: one or two vector loads each
static int vec_ok(const void* x, size_t ld, size_t esz) { return (uintptr_t)x % 16 == 0 && (ld * esz) % 16 == 0; }
// codes stored 8 (w8) or 16 (w16) bytes at a time
static int store_ok(const void* q, size_t ld, size_t w) { return (uintptr_t)q % w == 0 && ld % w == 0; }

void quant_rows(Backend* be, const void* x, int R, int C, size_t ldx, uint8_t* q, size_t ldq, SMap sm) {
    if (R == 0 || C == 0) return;
    const size_t es = is_bf16(be) ? 2 : 4;
    const unsigned gy = (unsigned)((R + ROWS_Q - 1) / ROWS_Q);
    const dim3 grid((unsigned)cdiv(sm.Kt, Q_THREADS / 16), gy < 65535u ? gy : 65535u);
    const int vec = vec_ok(x, ldx, es), w8 = store_ok(q, ldq, 8);
    if (is_bf16(be)) QLAUNCH(grid, k_quant_rows<bf16>, (const bf16*)x, R, C, ldx, q, ldq, sm, vec, w8);
    else QLAUNCH(grid, k_quant_rows<float>, (const float*)x, R, C, ldx, q, ldq, sm, vec, w8);
    LAUNCH_CK(CI(be));
}

void quant_cols(Backend* be, const void* x, int n, int C, size_t ldx, uint8_t* qt, size_t ldk, SMap stm,
                       uint8_t* q, size_t ldq, SMap srm) {
    if (C == 0 || ldk == 0) return;
    const dim3 grid((unsigned)cdiv(C, TILE), (unsigned)cdiv((int)(ldk > (size_t)n ? ldk : (size_t)n), TILE));
    const int vec = vec_ok(x, ldx, is_bf16(be) ? 2 : 4), w16 = store_ok(qt, ldk, 16), w8 = q ? store_ok(q, ldq, 8) : 0;
    if (is_bf16(be))
        QLAUNCH(grid, k_quant_cols<bf16>, (const bf16*)x, n, C, ldx, qt, ldk, stm, q, ldq, srm, vec,
                                                           w16, w8);
    else
        QLAUNCH(grid, k_quant_cols<float>, (const float*)x, n, C, ldx, qt, ldk, stm, q, ldq, srm, vec,
                                                            w16, w8);
    LAUNCH_CK(CI(be));
}

// quant_cols with the column-wise output alone (no row-wise codes).
void quant_cols_t(Backend* be, const void* x, int n, int C, size_t ldx, uint8_t* qt, size_t ldk, SMap stm) {
    SMap none;
    memset(&none, 0, sizeof none);
    quant_cols(be, x, n, C, ldx, qt, ldk, stm, NULL, 0, none);
}

int swiglu_fwd_rows(Backend* be, void* h, const void* gu, const float* scale, int n, int F, uint8_t* q, size_t ldq,
                    SMap srm) {
    const int aligned = (uintptr_t)h % 16 == 0 && (uintptr_t)gu % 16 == 0;
    if (!is_bf16(be) || F % TILE != 0 || !aligned || ldq < (size_t)F) return 0;
    if (n == 0) return 1;
    QLAUNCH(n, k_swiglu_fwd_rows, (bf16*)h, (const bf16*)gu, scale, F, q, ldq, srm, store_ok(q, ldq, 8));
    LAUNCH_CK(CI(be));
    return 1;
}

int swiglu_fwd_tiles(Backend* be, const void* gu, const float* scale, int n, int F, uint8_t* qt, size_t ldk, SMap stm,
                     uint8_t* q, size_t ldq, SMap srm) {
    const int aligned = (uintptr_t)gu % 16 == 0;
    if (!is_bf16(be) || F % TILE != 0 || !aligned || ldq < (size_t)F || ldk < (size_t)n || ldk % 4 != 0) return 0;
    if (n == 0) return 1;
    const dim3 grid((unsigned)(F / TILE), (unsigned)cdiv((int)ldk, TILE));
    QLAUNCH(grid, k_swiglu_fwd_tiles, (const bf16*)gu, scale, n, F, qt, ldk, stm, q, ldq, srm,
            store_ok(qt, ldk, 16), store_ok(q, ldq, 8));
    LAUNCH_CK(CI(be));
    return 1;
}

int swiglu_bwd_rows(Backend* be, void* dgu, float* dscale, const void* dh, const void* gu, const float* scale, int n,
                    int F, uint8_t* q, size_t ldq, SMap srm) {
    const int aligned = (uintptr_t)dgu % 16 == 0 && (uintptr_t)gu % 16 == 0 && (uintptr_t)dh % 16 == 0;
    if (!is_bf16(be) || F % TILE != 0 || !aligned || ldq < 2 * (size_t)F) return 0;
    if (n == 0) return 1;
    QLAUNCH(n, k_swiglu_bwd_rows, (bf16*)dgu, dscale, (const bf16*)dh, (const bf16*)gu, scale, F, q, ldq, srm,
            store_ok(q, ldq, 8));
    LAUNCH_CK(CI(be));
    return 1;
}

// trans 0 / 1 (quant_blocks) or 2 (quant_blocks_both): the launch over W's blocks (the output's for trans 1)
static void blocks_launch(Backend* be, const void* w, int R, int C, size_t ldw, int trans, uint8_t* q, size_t ldq,
                          float* s, int lds, uint8_t* qt, size_t ldqt, float* st, int ldst) {
    if (R == 0 || C == 0) return;
    const int out_rows = trans == 1 ? C : R;
    const dim3 grid((unsigned)cdiv((int)ldq, TILE), (unsigned)cdiv(out_rows, TILE));
    // the 16-byte stores are the transposed output's: q's for trans 1, qt's for trans 2
    const int vec = vec_ok(w, ldw, is_bf16(be) ? 2 : 4), w8 = store_ok(q, ldq, 8);
    const int w16 = trans == 2 ? store_ok(qt, ldqt, 16) : store_ok(q, ldq, 16);
    if (is_bf16(be))
        QLAUNCH(grid, k_quant_blocks<bf16>, (const bf16*)w, R, C, ldw, trans, q, ldq, s, lds, qt, ldqt, st, ldst, vec,
                w16, w8);
    else
        QLAUNCH(grid, k_quant_blocks<float>, (const float*)w, R, C, ldw, trans, q, ldq, s, lds, qt, ldqt, st, ldst, vec,
                w16, w8);
    LAUNCH_CK(CI(be));
}

void quant_blocks(Backend* be, const void* w, int R, int C, size_t ldw, int trans, uint8_t* q, size_t ldq,
                         float* s, int lds) {
    blocks_launch(be, w, R, C, ldw, trans, q, ldq, s, lds, NULL, 0, NULL, 0);
}

void quant_blocks_both(Backend* be, const void* w, int R, int C, size_t ldw, uint8_t* q, size_t ldq, float* s, int lds,
                       uint8_t* qt, size_t ldqt, float* st, int ldst) {
    CHECK(cdiv((int)ldq, TILE) == cdiv(C, TILE) && cdiv((int)ldqt, TILE) == cdiv(R, TILE),
          "quant_blocks_both: the codes' rows must end within W's last block (ldq %zu, C %d, ldqt %zu, R %d)", ldq, C,
          ldqt, R);
    blocks_launch(be, w, R, C, ldw, 2, q, ldq, s, lds, qt, ldqt, st, ldst);
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
// swiglu_bwd_rows with the row-wise scales in the VEC128 layout [⌈2F/128⌉, n]; 0 where it does not
// apply (nothing run).
extern "C" int cuda_fp8_swiglu_bwd_rows(Backend* be, void* dgu, float* dscale, const void* dh, const void* gu,
                                        const float* scale, int n, int F, uint8_t* q, int ldq, float* s) {
    return swiglu_bwd_rows(be, dgu, dscale, dh, gu, scale, n, F, q, (size_t)ldq, smap_vec(s, s, n, n, n, cdiv(2 * F, TILE)));
}
// swiglu_fwd_rows with the row-wise scales in the VEC128 layout [⌈F/128⌉, n]; 0 where it does not
// apply (nothing run).
extern "C" int cuda_fp8_swiglu_fwd_rows(Backend* be, void* h, const void* gu, const float* scale, int n, int F,
                                        uint8_t* q, int ldq, float* s) {
    return swiglu_fwd_rows(be, h, gu, scale, n, F, q, (size_t)ldq, smap_vec(s, s, n, n, n, cdiv(F, TILE)));
}
// Both: q [R, ldq] / s as trans 0 and qt [C, ldqt] / st as trans 1 above, from one read.
extern "C" void cuda_fp8_quant_blocks_both(Backend* be, const void* w, int R, int C, int ldw, uint8_t* q, int ldq,
                                           float* s, uint8_t* qt, int ldqt, float* st) {
    quant_blocks_both(be, w, R, C, (size_t)ldw, q, (size_t)ldq, s, (int)up((size_t)cdiv(C, TILE), 4), qt, (size_t)ldqt,
                      st, (int)up((size_t)cdiv(R, TILE), 4));
}
