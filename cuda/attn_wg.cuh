// attn_wg.cuh — pieces shared by the wgmma attention kernels, one-warpgroup (cuda_attn_fwd_wg.cu,
// cuda_attn_bwd_wg.cu) and warp-specialised (cuda_attn_fwd_ws.cu, cuda_attn_bwd_ws.cu): the
// accumulator row store, and the dk/dv kernels' Pᵀ / dSᵀ step with its shared dSᵀ image.
// Fragment layout: wgmma.cuh (rows g and g + 8 of the warp's 16, columns 8j + 2c, + 1).
#pragma once
#include "cuda_attn.cuh"
#include "wgmma.cuh"

// Row r (0: the thread's row g, 1: g + 8) of an accumulator of N columns, times scale, as bf16 into
// dst[0..N) (this thread's pairs of columns: 8j + 2c, 8j + 2c + 1).
template <int N>
__device__ __forceinline__ void wg_store_row(bf16* dst, const float* acc, int r, int c4, float scale) {
#pragma unroll
    for (int j = 0; j < N / 8; j++)
        *(uint32_t*)(dst + j * 8 + 2 * c4) = pack_bf16(acc[4 * j + 2 * r] * scale, acc[4 * j + 2 * r + 1] * scale);
}

// One 64 × 64 tile of the dk/dv kernels (rows = keys, columns = queries), in place:
//   sT  ← Pᵀ  = exp2(Sᵀ·sl2 − lse·log2 e), 0 where query < key or query ≥ T (when need_mask)
//   dpT ← dSᵀ = Pᵀ ∘ (dPᵀ − Δ)
// ls: the tile's lse[64] then Δ[64] (shared memory); q0 the tile's first query, key0 this
// thread's first key (its others: key0 + 8). dst (packed documents, or NULL): the tile's 64
// queries' document starts; Pᵀ is 0 also where the key is before its query's start (need_mask).
__device__ __forceinline__ void attn_pds_tile(float* sT, float* dpT, const float* ls, int q0, int key0, int c4, int T,
                                              float sl2, bool need_mask, const int* dst = nullptr) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int qi = 8 * j + 2 * c4;  // this thread's query columns: qi, qi + 1
        const float2 l2 = *(const float2*)(ls + qi), d2 = *(const float2*)(ls + 64 + qi);
        const float lx = l2.x * LOG2E, ly = l2.y * LOG2E;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = 4 * j + e;
            float p = fast_exp2(sT[i] * sl2 - (e & 1 ? ly : lx));
            if (need_mask) {
                const int qry = q0 + qi + (e & 1);
                if (qry < key0 + (e >> 1) * 8 || qry >= T || (dst && key0 + (e >> 1) * 8 < dst[qi + (e & 1)])) p = 0.f;
            }
            sT[i] = p;
            dpT[i] = p * (dpT[i] - (e & 1 ? d2.y : d2.x));
        }
    }
}

// The bf16 dSᵀ A fragments as[4][4] of one thread (its rows r, r + 8 of the 64 keys) into the
// 64 × 64 SW128 image at Sd (shared address): the tile k_attn_dq_ds / k_attn_dq_ws read back.
__device__ __forceinline__ void attn_ds_image_store(uint32_t Sd, const uint32_t (*as)[4], int r, int c4) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        const int cq = 16 * kk + 2 * c4;
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(Sd + sw128_off(64, r, cq)), "r"(as[kk][0]) : "memory");
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(Sd + sw128_off(64, r + 8, cq)), "r"(as[kk][1]) : "memory");
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(Sd + sw128_off(64, r, cq + 8)), "r"(as[kk][2]) : "memory");
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(Sd + sw128_off(64, r + 8, cq + 8)), "r"(as[kk][3]) : "memory");
    }
}
