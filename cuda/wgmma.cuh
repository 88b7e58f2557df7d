// wgmma.cuh — Hopper warpgroup matrix multiply (wgmma, sm_90a only) for the attention kernels:
// the shared-memory tile layout it reads, its matrix descriptors, the m64nNk16 bf16 → fp32
// instructions with A from shared memory ("SS") or from registers ("RS"), and the fences.
//
// A warpgroup is 4 consecutive warps (128 threads, the first warp index a multiple of 4). One
// wgmma computes D[64 × N] (+)= A[64 × 16] · B[16 × N]; warp w of the group owns rows 16w..16w+15.
//
// Register fragments (g = lane / 4, c = lane % 4, rows relative to the warp's 16):
//   accumulator D, N/2 floats per thread: d[4j + 0..1] = (row g,     cols 8j + 2c, 8j + 2c + 1)
//                                         d[4j + 2..3] = (row g + 8, same cols),   j < N / 8
//   A from registers (one k-step of 16), 4 × bf16x2: a0 (g, 2c..) a1 (g+8, 2c..) a2 (g, 2c+8..)
//   a3 (g+8, 2c+8..) — the mma.sync m16n8k16 A fragment, so accumulator columns 16k..16k+15 pack
//   straight into the A fragment of k-step k (wg_pack_a): P and dS never touch shared memory.
//
// Shared tiles ("SW128 tiles"): R rows × C bf16 columns, C a multiple of 64, stored as C/64 slabs
// of R × 128 bytes; in a slab, row r's 16-byte chunk j (columns 8j..8j+7 of the slab) sits at chunk
// position j ^ (r % 8). The tile base is 1024-byte aligned. This is the 128-byte-swizzle layout of
// both the K-major and the MN-major wgmma operand:
//   K-major (the operand's K runs along the tile's columns: Q, K, dO as [rows][D]): the 64 (or N)
//     rows r0.. and k-step kk start at  slab kk/4, row r0, byte (kk % 4) · 32; SBO = 1024 (8 rows),
//     LBO unused.
//   MN-major (the operand's N runs along the tile's columns: V, K, Q, dO as B[k = row][n = col]):
//     k-step kk starts at row 16·kk of slab 0; LBO = the slab stride (the next 64 columns of N),
//     SBO = 1024 (the next 8 rows of K). Used with the instruction's transpose-B flag. The same
//     descriptor serves an MN-major A (A[m = col][k = row], M = 64: one slab) with transpose-A:
//     the backward's dS tile, stored as dSᵀ [keys][queries], is the A of dQ = dS·K.
// dev/test_wgmma_probe.c checks each form against a host product (dev/cuda/wgmma_probe.cu).
#pragma once
#include "cuda_common.cuh"

// The wgmma path exists only in an sm_90a device pass; elsewhere these compile to traps and the
// host never selects it (cuda_wgmma_ok).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_DEVICE 1
#else
#define WG_DEVICE 0
#endif

// Byte offset of element (r, c) in an SW128 tile of R rows.
__device__ __forceinline__ uint32_t sw128_off(int R, int r, int c) {
    return (uint32_t)((c >> 6) * R * 128 + r * 128 + ((((c >> 3) & 7) ^ (r & 7)) << 4) + ((c & 7) << 1));
}

// Rows [r0, r0 + R) of a [T, stride] bf16 matrix (C columns at src) into the SW128 tile at dst
// (shared address), asynchronously (cp.async, 16 bytes per thread and step; rows ≥ T are zero).
// Commit and wait as with load_tile_async; then wg_fence_smem + __syncthreads before a wgmma.
template <int R, int C, int NT>
__device__ __forceinline__ void wg_load_tile(uint32_t dst, const bf16* src, size_t stride, int r0, int T, int tid) {
    constexpr int CPR = C / 8;  // 16-byte chunks per row
#pragma unroll 4
    for (int i = tid; i < R * CPR; i += NT) {
        const int r = i / CPR, j = i % CPR;
        const bool ok = r0 + r < T;
        const bf16* s = src + (size_t)(ok ? r0 + r : 0) * stride + j * 8;
        const uint32_t d = dst + (uint32_t)((j >> 3) * R * 128 + r * 128 + (((j & 7) ^ (r & 7)) << 4));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(s), "r"(ok ? 16 : 0));
    }
}

__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);  // 1 << 62: 128-byte swizzle
}
// K-major operand of an SW128 tile with R rows: rows r0.. (a multiple of 8), k-step kk.
__device__ __forceinline__ uint64_t wg_desc_k(uint32_t tile, int R, int r0, int kk) {
    return wg_desc(tile + (uint32_t)((kk >> 2) * R * 128 + r0 * 128 + (kk & 3) * 32), 16, 1024);
}
// MN-major operand (B[k][n] = tile[row k][col n]) of an SW128 tile with R rows: k-step kk, all columns.
__device__ __forceinline__ uint64_t wg_desc_mn(uint32_t tile, int R, int kk) {
    return wg_desc(tile + (uint32_t)(kk * 16 * 128), (uint32_t)(R * 128), 1024);
}

// Generic-proxy shared writes (st.shared, cp.async) → visible to wgmma (the async proxy).
// Every writing thread runs it after its writes, then the block syncs.
__device__ __forceinline__ void wg_fence_smem() {
#if WG_DEVICE
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_arrive() {  // before the first wgmma reading registers just written
#if WG_DEVICE
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#if WG_DEVICE
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wg_wait() {  // at most N committed groups still in flight
#if WG_DEVICE
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Keeps the compiler from moving accumulator reads/writes across the asynchronous wgmma.
template <int N>
__device__ __forceinline__ void wg_reg_fence(float* d) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
__device__ __forceinline__ void wg_reg_fence_u(uint32_t* d) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(d[i])::"memory");
}

// Accumulator columns 16k..16k+15 (n-chunks 2k, 2k+1) of d as the A fragment of k-step k.
__device__ __forceinline__ void wg_pack_a(uint32_t* a, const float* d, int k) {
    const float* x = d + 8 * k;
    __nv_bfloat162 h0 = __floats2bfloat162_rn(x[0], x[1]), h1 = __floats2bfloat162_rn(x[2], x[3]);
    __nv_bfloat162 h2 = __floats2bfloat162_rn(x[4], x[5]), h3 = __floats2bfloat162_rn(x[6], x[7]);
    a[0] = *(uint32_t*)&h0, a[1] = *(uint32_t*)&h1, a[2] = *(uint32_t*)&h2, a[3] = *(uint32_t*)&h3;
}

// ---- the instructions ------------------------------------------------------------------------
// wg_ss<N, TA, TB>(d, da, db, acc): d (+)= A·B, A and B by descriptor; acc = 0 overwrites d.
//   TA = 1: A is MN-major (A[m][k] = tile[row k][col m]); TB = 1: B is MN-major. Both 0 by default.
// wg_rs<N, TB>(d, a, db, acc): A from registers (4 × bf16x2); TB = 1: B is MN-major.
// N ∈ {64, 128}; wg_ss also 256 (the grouped GEMM, dev/cuda/cuda_gemm_wg.cu: 128 accumulator floats).

#define WG_R8(i) "+f"(d[i + 0]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                 "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_S8(a, b, c, e, f, g, h, k) "%" #a ",%" #b ",%" #c ",%" #e ",%" #f ",%" #g ",%" #h ",%" #k

template <int N, int TA = 0, int TB = 0>
__device__ __forceinline__ void wg_ss(float* d, uint64_t da, uint64_t db, int acc);
template <int N, int TB>
__device__ __forceinline__ void wg_rs(float* d, const uint32_t* a, uint64_t db, int acc);

#define WG_D32                                                                                            \
    "{" WG_S8(0, 1, 2, 3, 4, 5, 6, 7) "," WG_S8(8, 9, 10, 11, 12, 13, 14, 15) "," WG_S8(                    \
        16, 17, 18, 19, 20, 21, 22, 23) "," WG_S8(24, 25, 26, 27, 28, 29, 30, 31) "}"
#define WG_D64                                                                                            \
    "{" WG_S8(0, 1, 2, 3, 4, 5, 6, 7) "," WG_S8(8, 9, 10, 11, 12, 13, 14, 15) "," WG_S8(                    \
        16, 17, 18, 19, 20, 21, 22, 23) "," WG_S8(24, 25, 26, 27, 28, 29, 30, 31) "," WG_S8(32, 33, 34, 35,  \
        36, 37, 38, 39) "," WG_S8(40, 41, 42, 43, 44, 45, 46, 47) "," WG_S8(48, 49, 50, 51, 52, 53, 54,      \
        55) "," WG_S8(56, 57, 58, 59, 60, 61, 62, 63) "}"

#define WG_D128 "{" WG_S8(0, 1, 2, 3, 4, 5, 6, 7) "," \
    WG_S8(8, 9, 10, 11, 12, 13, 14, 15) "," \
    WG_S8(16, 17, 18, 19, 20, 21, 22, 23) "," \
    WG_S8(24, 25, 26, 27, 28, 29, 30, 31) "," \
    WG_S8(32, 33, 34, 35, 36, 37, 38, 39) "," \
    WG_S8(40, 41, 42, 43, 44, 45, 46, 47) "," \
    WG_S8(48, 49, 50, 51, 52, 53, 54, 55) "," \
    WG_S8(56, 57, 58, 59, 60, 61, 62, 63) "," \
    WG_S8(64, 65, 66, 67, 68, 69, 70, 71) "," \
    WG_S8(72, 73, 74, 75, 76, 77, 78, 79) "," \
    WG_S8(80, 81, 82, 83, 84, 85, 86, 87) "," \
    WG_S8(88, 89, 90, 91, 92, 93, 94, 95) "," \
    WG_S8(96, 97, 98, 99, 100, 101, 102, 103) "," \
    WG_S8(104, 105, 106, 107, 108, 109, 110, 111) "," \
    WG_S8(112, 113, 114, 115, 116, 117, 118, 119) "," \
    WG_S8(120, 121, 122, 123, 124, 125, 126, 127) "}"

template <int N, int TA, int TB>
__device__ __forceinline__ void wg_ss(float* d, uint64_t da, uint64_t db, int acc) {
    static_assert(N == 64 || N == 128 || N == 256, "wg_ss: N is 64, 128 or 256");
#if WG_DEVICE
    if constexpr (N == 64) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_D32 ", %32, %33, p, 1, 1, %35, %36;\n}\n"
            : WG_R8(0), WG_R8(8), WG_R8(16), WG_R8(24)
            : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    } else if constexpr (N == 128) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_D64 ", %64, %65, p, 1, 1, %67, %68;\n}\n"
            : WG_R8(0), WG_R8(8), WG_R8(16), WG_R8(24), WG_R8(32), WG_R8(40), WG_R8(48), WG_R8(56)
            : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    } else {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " WG_D128 ", %128, %129, p, 1, 1, %131, %132;\n}\n"
            : WG_R8(0), WG_R8(8), WG_R8(16), WG_R8(24), WG_R8(32), WG_R8(40), WG_R8(48), WG_R8(56), WG_R8(64),
              WG_R8(72), WG_R8(80), WG_R8(88), WG_R8(96), WG_R8(104), WG_R8(112), WG_R8(120)
            : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
    }
#else
    __trap();
#endif
}

template <>
__device__ __forceinline__ void wg_rs<64, 0>(float* d, const uint32_t* a, uint64_t db, int acc) {
#if WG_DEVICE
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_D32 ", {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
        : WG_R8(0), WG_R8(8), WG_R8(16), WG_R8(24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
#else
    __trap();
#endif
}
template <>
__device__ __forceinline__ void wg_rs<64, 1>(float* d, const uint32_t* a, uint64_t db, int acc) {
#if WG_DEVICE
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_D32 ", {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
        : WG_R8(0), WG_R8(8), WG_R8(16), WG_R8(24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
#else
    __trap();
#endif
}
template <>
__device__ __forceinline__ void wg_rs<128, 0>(float* d, const uint32_t* a, uint64_t db, int acc) {
#if WG_DEVICE
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_D64 ", {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
        : WG_R8(0), WG_R8(8), WG_R8(16), WG_R8(24), WG_R8(32), WG_R8(40), WG_R8(48), WG_R8(56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
#else
    __trap();
#endif
}
template <>
__device__ __forceinline__ void wg_rs<128, 1>(float* d, const uint32_t* a, uint64_t db, int acc) {
#if WG_DEVICE
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_D64 ", {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
        : WG_R8(0), WG_R8(8), WG_R8(16), WG_R8(24), WG_R8(32), WG_R8(40), WG_R8(48), WG_R8(56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
#else
    __trap();
#endif
}

// Host (cuda_attn.cu): whether the wgmma kernels can run here (an sm_90a build and a
// compute-capability-9.0 device) and are wanted (gpu.attention = mma forces the mma.sync kernels).
int cuda_wgmma_ok(CudaImpl* c);
