// cuda_attn.cuh — shared pieces of the attention kernels (cuda_attn.cu, cuda_attn_bwd.cu):
// tensor-core fragments (mma.sync m16n8k16 bf16 → fp32, ldmatrix), tile loads, and the layout
// conventions.
//
// Fragments of mma.m16n8k16 (g = lane / 4, c = lane % 4):
//   A 16×16 (row): a0 (g, 2c..2c+1)  a1 (g+8, 2c..)  a2 (g, 2c+8..)  a3 (g+8, 2c+8..)
//   B 16×8  (col): b0 (k 2c..2c+1, n g)  b1 (k 2c+8.., n g)
//   C 16×8       : c0 c1 (g, 2c..2c+1)  c2 c3 (g+8, 2c..2c+1)
// A C fragment pair (two n-tiles of 8) is an A fragment of one 16-wide k-step after packing to
// bf16: this is how P (and dS) go from one product into the next without shared memory.
//
// Shared tiles are row-major [rows][D + PAD] bf16; PAD = 8 (16 bytes) keeps rows 16-byte aligned
// and puts the 8 rows an ldmatrix phase reads in distinct banks.
#pragma once
#include "cuda_common.cuh"

#define ATTN_PAD 8

__device__ __forceinline__ void mma_bf16(float* c, const uint32_t* a, const uint32_t* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void ldsm_x4(uint32_t* r, const bf16* p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t* r, const bf16* p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}


// A fragment of the 16×16 block at (r0, k0) of a row-major shared tile X (row stride ld).
__device__ __forceinline__ void frag_a(uint32_t* a, const bf16* X, int ld, int r0, int k0, int lane) {
    ldsm_x4(a, X + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + k0 + (lane >> 4) * 8);
}

// B fragments for two n-tiles (n0, n0+8) of one k-step k0, where B[k][n] = Y[n][k] (Y row-major,
// e.g. K for S = Q·Kᵀ): b[0..1] for n-tile n0, b[2..3] for n0 + 8.
__device__ __forceinline__ void frag_b_nk(uint32_t* b, const bf16* Y, int ld, int n0, int k0, int lane) {
    ldsm_x4(b, Y + (n0 + (lane & 7) + (lane >> 4) * 8) * ld + k0 + ((lane >> 3) & 1) * 8);
}

// Same, where B[k][n] = Y[k][n] (Y row-major, e.g. V for O = P·V).
__device__ __forceinline__ void frag_b_kn(uint32_t* b, const bf16* Y, int ld, int k0, int n0, int lane) {
    ldsm_x4_t(b, Y + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8);
}

// Loads rows [r0, r0 + R) of a [T, stride] bf16 matrix (the D columns at `src`) into the shared
// tile dst [R][D + PAD]; rows ≥ T are zero. 16-byte accesses (D % 8 == 0, 16-byte aligned rows).
template <int R, int D, int NT>
__device__ __forceinline__ void load_tile(bf16* dst, const bf16* src, size_t stride, int r0, int T) {
    constexpr int CPR = D / 8;  // 16-byte chunks per row
    for (int i = threadIdx.x; i < R * CPR; i += NT) {
        const int r = i / CPR, cc = i % CPR;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r0 + r < T) v = *(const uint4*)(src + (size_t)(r0 + r) * stride + cc * 8);
        *(uint4*)(dst + r * (D + ATTN_PAD) + cc * 8) = v;
    }
}

// The same tile load as load_tile, asynchronous (cp.async, 16 bytes per thread and step; rows
// ≥ T are zero-filled by a source size of 0). The caller commits the group (cp_async_commit)
// and waits for it (cp_async_wait<n>) and a __syncthreads before reading the tile.
template <int R, int D, int NT>
__device__ __forceinline__ void load_tile_async(bf16* dst, const bf16* src, size_t stride, int r0, int T) {
    constexpr int CPR = D / 8;
    for (int i = threadIdx.x; i < R * CPR; i += NT) {
        const int r = i / CPR, cc = i % CPR;
        const bool ok = r0 + r < T;
        const bf16* s = src + (size_t)(ok ? r0 + r : 0) * stride + cc * 8;  // a valid address either way
        const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst + r * (D + ATTN_PAD) + cc * 8);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(s), "r"(ok ? 16 : 0));
    }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N committed groups of this thread are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Packed documents: the end (exclusive) of the document holding token x of a window's starts d
// [T] (backend.h attn_fwd), i.e. the first i > x whose document starts after x (T when none does).
__device__ __forceinline__ int attn_doc_end(const int32_t* d, int T, int x) {
    int lo = x + 1, hi = T;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (d[mid] > x) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

// Argument checks (FATAL on bad head counts / dims).
void attn_check(const char* op, int Hq, int Hkv, int D);
// The tensor-core path applies: bf16, D ∈ {16, 32, 64, 128}, 16-byte aligned buffers.
int attn_tc_ok(Backend* be, int D, const void* const* ptrs, int np);

// Row sums Σ_d dO·O per (b, h, t) into delta [B, Hq, T] (the backward's D_t).
void attn_delta(Backend* be, float* delta, const void* dout, const void* out, int B, int T, int Hq, int D);
