// cuda_attn_bwd_wg.cu — causal GQA attention backward on Hopper warpgroup MMA (wgmma, sm_90a):
// the same math and contract as the mma.sync kernels in cuda_attn_bwd.cu (read its header; bf16,
// D ∈ {64, 128}), which it replaces when cuda_wgmma_ok. Δ is in scratch already (attn_delta).
//
// Which kernels run (attn_ds_pairs decides whether dS is stored, by the caller's workspace):
//   D = 128, dS stored   cuda_attn_bwd_ws.cu's warp-specialised dk/dv and dq-from-dS kernels
//   D = 64,  dS stored   k_attn_dkdv_wg<64, true>, then k_attn_dq_ds<64>
//   otherwise            k_attn_dq_wg and k_attn_dkdv_wg<D, false> (dq recomputes S and dP), also
//                        at D = 128 when the driver cannot make the tensor maps
//
// Both kernels are one warpgroup (4 warps, 128 threads) per CTA; warp w owns rows 16w..16w+15 of
// every 64-row product, as in the wgmma accumulator layout (wgmma.cuh). Every tile is a [64][D]
// SW128 tile loaded with cp.async; nothing is transposed anywhere (K-major or MN-major descriptors).
//   dq:    a CTA owns 64 query rows of one (b, h) and walks the 64-key tiles up to the diagonal.
//          Q and dO stay in shared memory, K and V stream through two stages. Per key tile:
//            S = Q·Kᵀ, dP = dO·Vᵀ    2·D/16 wgmma m64n64k16, A and B from shared memory (K-major)
//            P = exp2(S·scale·log2 e − lse·log2 e), masked; dS = P ∘ (dP − Δ)   in registers
//            dQ += dS·K              4 wgmma m64nDk16, A = dS packed to bf16 from the S registers,
//                                    B = the K tile read MN-major
//          Heavy (late) query tiles are scheduled first.
//   dk/dv: a CTA owns 64 keys of one (b, kv head) and walks, for every query head of the group,
//          the 64-query tiles from the diagonal one to the last. K and V stay in shared memory;
//          Q, dO and the tile's 64 lse and 64 Δ values stream through two stages. Per query tile:
//            Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ   2·D/16 wgmma m64n64k16 (rows = keys, columns = queries)
//            Pᵀ, dSᵀ = Pᵀ ∘ (dPᵀ − Δ)  in registers; lse and Δ are per column here
//            dV += Pᵀ·dO, dK += dSᵀ·Q  2 × 4 wgmma m64nDk16, A from the Pᵀ / dSᵀ registers,
//                                     B = the dO / Q tile read MN-major
// Each output row is owned by one thread quad and written once (no atomics: deterministic).
// Shared memory: six tiles (+ 1 KB of lse and Δ for dk/dv), 97-98 KB at D = 128: two CTAs per SM.
//
// Synchronization per iteration (both kernels; "stage" = the double-buffered tiles):
//   1. cp_async_wait<0>, fence.proxy.async, __syncthreads: this iteration's stage has landed and
//      is visible to wgmma (the async proxy).
//   2. the two score products; commit; wg_wait<0> — which also retires the previous iteration's
//      dQ (or dK/dV) wgmmas, the last readers of the other stage; __syncthreads: every warp has.
//   3. the other stage is refilled for the next iteration (cp.async), in flight during 4 and 5.
//   4. the softmax part in registers; 5. the accumulating products, committed and left running
//      into the next iteration's step 2. The packed A registers are produced after step 2's wait,
//      so they are never rewritten while a wgmma that reads them is in flight.
// Accumulator registers are fenced (wg_reg_fence) around every commit and wait, and wg_arrive
// precedes every batch of wgmmas, so the compiler keeps them in place. The dQ (dK, dV)
// accumulators are never written by ordinary instructions: the first product overwrites them
// (acc = 0) instead of a zero fill, which would make ptxas serialize the wgmmas (C7515).
#include "attn_wg.cuh"

enum { WB_ROWS = 64, WB_THREADS = 128, WB_DS_ELEMS = WB_ROWS * WB_ROWS };

// 4 bytes global → shared, asynchronously; zero-filled when !ok (src must still be valid).
__device__ __forceinline__ void cp_async_4(uint32_t dst, const float* src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 4 : 0));
}

// ---- dq --------------------------------------------------------------------------------------

template <int D>
__global__ void __launch_bounds__(WB_THREADS) k_attn_dq_wg(bf16* dq, const bf16* dout, const float* lse,
                                                           const float* delta, const bf16* q, const bf16* k,
                                                           const bf16* v, int T, int Hq, int Hkv, float sl2,
                                                           float scale) {
    constexpr uint32_t TILE = WB_ROWS * D * 2;  // bytes of one [64][D] bf16 tile
    constexpr int KS = D / 16;
    extern __shared__ unsigned char smem_raw[];
    const uint32_t base = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
    const uint32_t Qs = base, Os = base + TILE, Kb = base + 2 * TILE, Vb = base + 4 * TILE;  // stage s: + s·TILE
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, c4 = lane & 3;
    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, kh = h / (Hq / Hkv);
    const int q0 = qt * WB_ROWS;
    const size_t qs = (size_t)Hq * D, ks = (size_t)Hkv * D;
    const size_t qoff = (size_t)b * T * qs + (size_t)h * D;
    const bf16* kb = k + (size_t)b * T * ks + (size_t)kh * D;
    const bf16* vb = v + (size_t)b * T * ks + (size_t)kh * D;
    const int kt_end = (min(q0 + WB_ROWS, T) + WB_ROWS - 1) / WB_ROWS;

    wg_load_tile<WB_ROWS, D, WB_THREADS>(Qs, q + qoff, qs, q0, T, tid);
    wg_load_tile<WB_ROWS, D, WB_THREADS>(Os, dout + qoff, qs, q0, T, tid);
    wg_load_tile<WB_ROWS, D, WB_THREADS>(Kb, kb, ks, 0, T, tid);
    wg_load_tile<WB_ROWS, D, WB_THREADS>(Vb, vb, ks, 0, T, tid);
    cp_async_commit();

    const int row0 = q0 + w * 16 + g;  // this thread's rows: row0, row0 + 8
    float ll[2], dl[2];                // lse · log2 e and Δ of those rows
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + r * 8;
        const size_t li = ((size_t)b * Hq + h) * T + row;
        ll[r] = row < T ? lse[li] * LOG2E : 0.f;
        dl[r] = row < T ? delta[li] : 0.f;
    }
    float acc[D / 2];  // dQ / scale; the first product overwrites it

    for (int kt = 0; kt < kt_end; kt++) {
        const int k0 = kt * WB_ROWS, st = kt & 1;
        const uint32_t Ks = Kb + st * TILE, Vs = Vb + st * TILE;
        cp_async_wait<0>();  // tile kt (and Q, dO) landed for this thread's copies
        wg_fence_smem();
        __syncthreads();     // ... and for everyone's

        float s[32], dp[32];
        wg_arrive();
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
            wg_ss<64>(s, wg_desc_k(Qs, WB_ROWS, 0, kk), wg_desc_k(Ks, WB_ROWS, 0, kk), kk > 0);
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
            wg_ss<64>(dp, wg_desc_k(Os, WB_ROWS, 0, kk), wg_desc_k(Vs, WB_ROWS, 0, kk), kk > 0);
        wg_commit();
        wg_reg_fence<32>(s);
        wg_reg_fence<32>(dp);
        wg_wait<0>();  // S, dP of tile kt, and the dQ of tile kt − 1
        wg_reg_fence<32>(s);
        wg_reg_fence<32>(dp);
        wg_reg_fence<D / 2>(acc);
        __syncthreads();  // every warp's dQ of tile kt − 1 is done: its stage may be refilled
        if (kt + 1 < kt_end) {
            wg_load_tile<WB_ROWS, D, WB_THREADS>(Kb + (st ^ 1) * TILE, kb, ks, k0 + WB_ROWS, T, tid);
            wg_load_tile<WB_ROWS, D, WB_THREADS>(Vb + (st ^ 1) * TILE, vb, ks, k0 + WB_ROWS, T, tid);
            cp_async_commit();
        }

        // P (causal mask and the tail past T), dS = P ∘ (dP − Δ) into s
        const bool need_mask = k0 + WB_ROWS - 1 > q0 + w * 16 || k0 + WB_ROWS > T;
#pragma unroll
        for (int i = 0; i < 32; i++) {
            const int r = (i >> 1) & 1;
            float p = fast_exp2(s[i] * sl2 - ll[r]);
            if (need_mask) {
                const int key = k0 + (i >> 2) * 8 + 2 * c4 + (i & 1);
                if (key > row0 + r * 8 || key >= T) p = 0.f;
            }
            s[i] = p * (dp[i] - dl[r]);
        }

        // dQ += dS·K: dS from the S registers, K read MN-major from its stage
        uint32_t a[4][4];
#pragma unroll
        for (int kk = 0; kk < WB_ROWS / 16; kk++) wg_pack_a(a[kk], s, kk);
        wg_reg_fence<D / 2>(acc);
        wg_reg_fence_u<16>(&a[0][0]);
        wg_arrive();
#pragma unroll
        for (int kk = 0; kk < WB_ROWS / 16; kk++)
            wg_rs<D, 1>(acc, a[kk], wg_desc_mn(Ks, WB_ROWS, kk), kk > 0 || kt > 0);
        wg_commit();
        wg_reg_fence<D / 2>(acc);
    }
    wg_wait<0>();
    wg_reg_fence<D / 2>(acc);

#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + r * 8;
        if (row >= T) continue;
        wg_store_row<D>(dq + qoff + (size_t)row * qs, acc, r, c4, scale);
    }
}

// ---- dk, dv ----------------------------------------------------------------------------------

template <int D, bool DS>
__global__ void __launch_bounds__(WB_THREADS) k_attn_dkdv_wg(bf16* dk, bf16* dv, bf16* ds, const bf16* dout,
                                                             const float* lse, const float* delta, const bf16* q,
                                                             const bf16* k, const bf16* v, int T, int Hq, int Hkv,
                                                             int p0, float sl2, float scale) {
    constexpr uint32_t TILE = WB_ROWS * D * 2;
    constexpr uint32_t LDS = 2 * WB_ROWS * 4;  // bytes of one stage of lse (64 floats) then Δ (64)
    constexpr int KS = D / 16;
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw), base = (raw + 1023u) & ~1023u;
    const uint32_t Ks = base, Vs = base + TILE, Qb = base + 2 * TILE, Ob = base + 4 * TILE;  // stage s: + s·TILE
    const uint32_t Lb = base + 6 * TILE;                                                    // stage s: + s·LDS
    const float* lsh = (const float*)(smem_raw + (base - raw) + 6 * TILE);  // Lb, as a generic pointer
    const uint32_t Sd = Lb + 2 * LDS;  // DS: the dSᵀ tile on its way to global memory
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, c4 = lane & 3;
    const int kt = blockIdx.x, pair = p0 + blockIdx.y, kh = pair % Hkv, b = pair / Hkv, grp = Hq / Hkv;
    const int k0 = kt * WB_ROWS;
    const size_t qs = (size_t)Hq * D, ks = (size_t)Hkv * D;
    const size_t koff = (size_t)b * T * ks + (size_t)kh * D;
    const int nqt = (T + WB_ROWS - 1) / WB_ROWS, per_h = nqt - kt, n_it = grp * per_h;
    // DS: the dSᵀ tile of iteration it goes to ds at ds_tile(it) (see attn_ds_index); the copy
    // out of shared memory runs one iteration later, while that iteration's score products run.
    const size_t ntri = (size_t)nqt * (nqt + 1) / 2;
    auto ds_tile = [&](int it) {
        const int qt = kt + it % per_h;
        return ds + (((size_t)blockIdx.y * grp + it / per_h) * ntri + (size_t)qt * (qt + 1) / 2 + kt) * WB_DS_ELEMS;
    };
    auto ds_copy_out = [&](int it) {  // shared image → global, 16 bytes per thread and step
        bf16* dst = ds_tile(it);
#pragma unroll
        for (int i = 0; i < WB_DS_ELEMS * 2 / 16 / WB_THREADS; i++) {
            const int ch = i * WB_THREADS + tid;
            uint4 x;
            asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                         : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w)
                         : "r"(Sd + ch * 16) : "memory");
            *(uint4*)(dst + ch * 8) = x;
        }
    };

    // Iteration it covers query head kh·grp + it / per_h, query tile kt + it % per_h; its Q, dO,
    // lse and Δ go to stage it & 1 (lse and Δ zero past T; those queries are masked).
    auto issue = [&](int it) {
        const int h = kh * grp + it / per_h, qq0 = (kt + it % per_h) * WB_ROWS, st = it & 1;
        const size_t qoff = (size_t)b * T * qs + (size_t)h * D;
        wg_load_tile<WB_ROWS, D, WB_THREADS>(Qb + st * TILE, q + qoff, qs, qq0, T, tid);
        wg_load_tile<WB_ROWS, D, WB_THREADS>(Ob + st * TILE, dout + qoff, qs, qq0, T, tid);
        const int t = qq0 + (tid & (WB_ROWS - 1));  // threads 0..63: lse, 64..127: Δ
        const float* src = (tid < WB_ROWS ? lse : delta) + ((size_t)b * Hq + h) * T;
        cp_async_4(Lb + st * LDS + tid * 4, src + (t < T ? t : 0), t < T);
        cp_async_commit();
    };
    wg_load_tile<WB_ROWS, D, WB_THREADS>(Ks, k + koff, ks, k0, T, tid);
    wg_load_tile<WB_ROWS, D, WB_THREADS>(Vs, v + koff, ks, k0, T, tid);
    issue(0);  // one group with K and V

    const int key0 = k0 + w * 16 + g;  // this thread's keys: key0, key0 + 8
    float dka[D / 2], dva[D / 2];      // dK / scale, dV; the first products overwrite them

    for (int it = 0; it < n_it; it++) {
        const int qq0 = (kt + it % per_h) * WB_ROWS, st = it & 1;
        const uint32_t Qs = Qb + st * TILE, Os = Ob + st * TILE;
        const float* ls = lsh + st * (LDS / 4);  // [64] lse, then [64] Δ
        cp_async_wait<0>();  // this iteration's stage (and K, V) landed for this thread's copies
        wg_fence_smem();
        __syncthreads();     // ... and for everyone's

        float sT[32], dpT[32];  // Sᵀ and dPᵀ: rows = keys, columns = queries
        wg_arrive();
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
            wg_ss<64>(sT, wg_desc_k(Ks, WB_ROWS, 0, kk), wg_desc_k(Qs, WB_ROWS, 0, kk), kk > 0);
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
            wg_ss<64>(dpT, wg_desc_k(Vs, WB_ROWS, 0, kk), wg_desc_k(Os, WB_ROWS, 0, kk), kk > 0);
        wg_commit();
        wg_reg_fence<32>(sT);
        wg_reg_fence<32>(dpT);
        if (DS && it > 0) ds_copy_out(it - 1);  // written before the barrier above
        wg_wait<0>();  // Sᵀ, dPᵀ of iteration it, and the dK, dV of iteration it − 1
        wg_reg_fence<32>(sT);
        wg_reg_fence<32>(dpT);
        wg_reg_fence<D / 2>(dka);
        wg_reg_fence<D / 2>(dva);
        __syncthreads();  // every warp's dK, dV of iteration it − 1 are done: its stage may be
                          // refilled; DS: every thread has copied the dSᵀ tile out
        if (it + 1 < n_it) issue(it + 1);

        // Pᵀ (query < key and query ≥ T masked) into sT, dSᵀ = Pᵀ ∘ (dPᵀ − Δ) into dpT
        const bool need_mask = qq0 < k0 + WB_ROWS || qq0 + WB_ROWS > T;
        attn_pds_tile(sT, dpT, ls, qq0, key0, c4, T, sl2, need_mask);

        // dV += Pᵀ·dO, dK += dSᵀ·Q: A from the registers, dO and Q read MN-major from the stage
        uint32_t ap[4][4], as[4][4];
#pragma unroll
        for (int kk = 0; kk < WB_ROWS / 16; kk++) {
            wg_pack_a(ap[kk], sT, kk);
            wg_pack_a(as[kk], dpT, kk);
        }
        wg_reg_fence<D / 2>(dka);
        wg_reg_fence<D / 2>(dva);
        wg_reg_fence_u<16>(&ap[0][0]);
        wg_reg_fence_u<16>(&as[0][0]);
        wg_arrive();
#pragma unroll
        for (int kk = 0; kk < WB_ROWS / 16; kk++) {
            wg_rs<D, 1>(dva, ap[kk], wg_desc_mn(Os, WB_ROWS, kk), kk > 0 || it > 0);
            wg_rs<D, 1>(dka, as[kk], wg_desc_mn(Qs, WB_ROWS, kk), kk > 0 || it > 0);
        }
        wg_commit();
        wg_reg_fence<D / 2>(dka);
        wg_reg_fence<D / 2>(dva);
        if (DS) attn_ds_image_store(Sd, as, w * 16 + g, c4);  // the bf16 dSᵀ (the very A of dK): rows = keys
    }
    if (DS) {
        __syncthreads();
        ds_copy_out(n_it - 1);
    }
    wg_wait<0>();
    wg_reg_fence<D / 2>(dka);
    wg_reg_fence<D / 2>(dva);

#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key0 + r * 8;
        if (key >= T) continue;
        wg_store_row<D>(dk + koff + (size_t)key * ks, dka, r, c4, scale);
        wg_store_row<D>(dv + koff + (size_t)key * ks, dva, r, c4, 1.f);
    }
}

// ---- dq from the stored dS -------------------------------------------------------------------
// dQ[q tile] = scale · Σ_{kt ≤ qt} dS[q tile, kt] · K[kt], dS read back from ds (written by
// k_attn_dkdv_wg<D, true>). A CTA owns 64 query rows of one query head of the chunk (blockIdx.y =
// slot: pair · grp + head in group) and walks the key tiles up to the diagonal. Per key tile, one
// stage holds the 8 KB dSᵀ image (copied as is: it is already the SW128 tile) and the K tile;
// three stages, two tiles in flight. 4 wgmma m64nDk16 per tile, A = dS MN-major (transpose-A),
// B = K MN-major. Heavy (late) query tiles first. Deterministic: every sum in key-tile order.
enum { DQ_STAGES = 3 };
template <int D>
__global__ void __launch_bounds__(WB_THREADS) k_attn_dq_ds(bf16* dq, const bf16* ds, const bf16* k, int T, int Hq,
                                                           int Hkv, int p0, float scale) {
    constexpr uint32_t KT = WB_ROWS * D * 2, ST = WB_DS_ELEMS * 2 + KT;  // bytes: K tile, stage
    extern __shared__ unsigned char smem_raw[];
    const uint32_t base = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, c4 = lane & 3;
    const int nqt = gridDim.x, qt = nqt - 1 - blockIdx.x, grp = Hq / Hkv;
    const int pair = p0 + blockIdx.y / grp, kh = pair % Hkv, b = pair / Hkv, h = kh * grp + blockIdx.y % grp;
    const int q0 = qt * WB_ROWS, n_kt = qt + 1;
    const size_t qs = (size_t)Hq * D, ks = (size_t)Hkv * D;
    const bf16* kb = k + (size_t)b * T * ks + (size_t)kh * D;
    const bf16* dsr = ds + ((size_t)blockIdx.y * ((size_t)nqt * (nqt + 1) / 2) + (size_t)qt * (qt + 1) / 2) * WB_DS_ELEMS;

    auto issue = [&](int kt) {  // tile kt into stage kt % DQ_STAGES; always one commit group
        if (kt < n_kt) {
            const uint32_t st = base + (uint32_t)(kt % DQ_STAGES) * ST;
            const bf16* src = dsr + (size_t)kt * WB_DS_ELEMS;
#pragma unroll
            for (int i = 0; i < WB_DS_ELEMS * 2 / 16 / WB_THREADS; i++) {
                const int ch = i * WB_THREADS + tid;
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(st + ch * 16), "l"(src + ch * 8));
            }
            wg_load_tile<WB_ROWS, D, WB_THREADS>(st + WB_DS_ELEMS * 2, kb, ks, kt * WB_ROWS, T, tid);
        }
        cp_async_commit();
    };
    issue(0);
    issue(1);
    float acc[D / 2];  // dQ / scale; the first product overwrites it
    for (int kt = 0; kt < n_kt; kt++) {
        const uint32_t st = base + (uint32_t)(kt % DQ_STAGES) * ST, Ks = st + WB_DS_ELEMS * 2;
        cp_async_wait<1>();  // tile kt landed (only tile kt + 1's group may still be in flight)
        wg_fence_smem();
        __syncthreads();
        wg_reg_fence<D / 2>(acc);
        wg_arrive();
#pragma unroll
        for (int kk = 0; kk < WB_ROWS / 16; kk++)
            wg_ss<D, 1, 1>(acc, wg_desc_mn(st, WB_ROWS, kk), wg_desc_mn(Ks, WB_ROWS, kk), kk > 0 || kt > 0);
        wg_commit();
        wg_reg_fence<D / 2>(acc);
        wg_wait<1>();  // the products of tile kt − 1, the last readers of stage (kt + 2) % 3, retired
        wg_reg_fence<D / 2>(acc);
        __syncthreads();  // ... in every warp
        issue(kt + 2);
    }
    wg_wait<0>();
    wg_reg_fence<D / 2>(acc);
    const int row0 = q0 + w * 16 + g;
    const size_t qoff = (size_t)b * T * qs + (size_t)h * D;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + r * 8;
        if (row >= T) continue;
        wg_store_row<D>(dq + qoff + (size_t)row * qs, acc, r, c4, scale);
    }
}

int attn_ds_pairs(CudaImpl* c, int B, int T, int Hq, int Hkv, size_t ws_bytes);
// cuda_attn_bwd_ws.cu: the stored-dS backward at D = 128, or 0 when it does not apply.
int attn_bwd_ws(CudaImpl* c, bf16* dq, bf16* dk, bf16* dv, bf16* ds, const bf16* dout, const float* lse,
                const float* delta, const bf16* q, const bf16* k, const bf16* v, int B, int T, int Hq, int Hkv,
                int chunk, const int32_t* doc);

// Bytes of dS one (batch row, kv head) pair stores: grp heads × the causal 64 × 64 tiles.
static size_t ds_pair_bytes(int T, int Hq, int Hkv) {
    const size_t nt = (size_t)(T + WB_ROWS - 1) / WB_ROWS;
    return (size_t)(Hq / Hkv) * (nt * (nt + 1) / 2) * WB_DS_ELEMS * sizeof(bf16);
}

template <int D>
static void launch_bwd_wg(CudaImpl* c, bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const float* lse,
                          const float* delta, const bf16* q, const bf16* k, const bf16* v, int B, int T, int Hq,
                          int Hkv, void* ws, size_t ws_bytes) {
    const size_t tile = (size_t)WB_ROWS * D * sizeof(bf16);
    const size_t sm_dq = 6 * tile + 1024;                                 // Q, dO, 2 × (K, V), + room to align
    const size_t sm_kv = 6 * tile + 2 * 2 * WB_ROWS * sizeof(float) + 1024;  // K, V, 2 × (Q, dO, lse, Δ)
    const size_t sm_kv_ds = sm_kv + WB_DS_ELEMS * sizeof(bf16);            // + the dSᵀ tile
    const size_t sm_dq_ds = DQ_STAGES * (WB_DS_ELEMS * sizeof(bf16) + tile) + 1024;
    static bool attr = false;  // per instantiation
    if (!attr) {
        CUDA_CK(cudaFuncSetAttribute(k_attn_dq_wg<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm_dq));
        CUDA_CK(cudaFuncSetAttribute(k_attn_dkdv_wg<D, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm_kv));
        if constexpr (D == 64) {
            CUDA_CK(cudaFuncSetAttribute(k_attn_dkdv_wg<D, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)sm_kv_ds));
            CUDA_CK(cudaFuncSetAttribute(k_attn_dq_ds<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm_dq_ds));
        }
        attr = true;
    }
    const float scale = 1.0f / sqrtf((float)D), sl2 = scale * LOG2E;
    const unsigned nt = (unsigned)((T + WB_ROWS - 1) / WB_ROWS);
    const int pairs = B * Hkv;
    const int chunk = attn_ds_pairs(c, B, T, Hq, Hkv, ws_bytes);
    if (chunk > 0) {  // dk, dv and dS per chunk of pairs, then dq from dS (5 products per tile pair)
        if constexpr (D == 128) {
            if (attn_bwd_ws(c, dq, dk, dv, (bf16*)ws, dout, lse, delta, q, k, v, B, T, Hq, Hkv, chunk, nullptr)) return;
        } else {
            const int grp = Hq / Hkv;
            for (int p0 = 0; p0 < pairs; p0 += chunk) {
                const int np = pairs - p0 < chunk ? pairs - p0 : chunk;
                k_attn_dkdv_wg<D, true><<<dim3(nt, (unsigned)np), WB_THREADS, sm_kv_ds, c->stream>>>(
                    dk, dv, (bf16*)ws, dout, lse, delta, q, k, v, T, Hq, Hkv, p0, sl2, scale);
                LAUNCH_CK(c);
                k_attn_dq_ds<D><<<dim3(nt, (unsigned)(np * grp)), WB_THREADS, sm_dq_ds, c->stream>>>(
                    dq, (const bf16*)ws, k, T, Hq, Hkv, p0, scale);
                LAUNCH_CK(c);
            }
            return;
        }
    }
    // no room for dS: dq recomputes S and dP (7 products per tile pair)
    k_attn_dq_wg<D><<<dim3(nt, Hq, B), WB_THREADS, sm_dq, c->stream>>>(dq, dout, lse, delta, q, k, v, T, Hq, Hkv,
                                                                       sl2, scale);
    LAUNCH_CK(c);
    k_attn_dkdv_wg<D, false><<<dim3(nt, (unsigned)pairs), WB_THREADS, sm_kv, c->stream>>>(
        dk, dv, nullptr, dout, lse, delta, q, k, v, T, Hq, Hkv, 0, sl2, scale);
    LAUNCH_CK(c);
}
// Pairs of (batch row, kv head) per chunk for the stored-dS backward, or 0 for the recompute
// path: dS when a chunk fills the GPU (≥ 4 CTAs per SM of dk/dv) or holds the whole call (tests
// may ask for it whenever one pair fits: cuda_attn_ds_force). Chunks are balanced (the last one
// is not a remainder).
int attn_ds_pairs(CudaImpl* c, int B, int T, int Hq, int Hkv, size_t ws_bytes) {
    const size_t per = ds_pair_bytes(T, Hq, Hkv);
    const size_t pairs = (size_t)B * Hkv, nt = (size_t)(T + WB_ROWS - 1) / WB_ROWS;
    size_t cap = per ? ws_bytes / per : 0;
    if (cap == 0) return 0;
    if (cap >= pairs) return (int)pairs;
    if (!c->attn_ds_force && cap * nt < 4 * (size_t)c->sms) return 0;
    const size_t chunks = (pairs + cap - 1) / cap;
    return (int)((pairs + chunks - 1) / chunks);
}

// Test hook: with on, the stored-dS backward runs whenever one pair fits the workspace (to cover
// the chunk offsets on small shapes). Returns the previous setting.
extern "C" int cuda_attn_ds_force(Backend* be, int on) {
    const int was = CI(be)->attn_ds_force;
    CI(be)->attn_ds_force = on;
    return was;
}

// Runs the wgmma backward when it applies (cuda_wgmma_ok, D ∈ {64, 128}; the caller checked bf16
// and alignment, and computed Δ into delta); returns 0 otherwise. ws (ws_bytes) is the caller's
// workspace for dS (attn_ds_pairs). With packed documents (doc) only the stored-dS
// warp-specialised kernels apply (D = 128, room for dS, tensor maps); else 0.
int attn_bwd_wg(CudaImpl* c, bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const float* lse, const float* delta,
                const bf16* q, const bf16* k, const bf16* v, int B, int T, int Hq, int Hkv, int D, void* ws,
                size_t ws_bytes, const int32_t* doc) {
    if (!cuda_wgmma_ok(c)) return 0;
    if (doc) {
        const int chunk = D == 128 ? attn_ds_pairs(c, B, T, Hq, Hkv, ws_bytes) : 0;
        return chunk > 0 && attn_bwd_ws(c, dq, dk, dv, (bf16*)ws, dout, lse, delta, q, k, v, B, T, Hq, Hkv, chunk, doc);
    }
    if (D == 128) launch_bwd_wg<128>(c, dq, dk, dv, dout, lse, delta, q, k, v, B, T, Hq, Hkv, ws, ws_bytes);
    else if (D == 64) launch_bwd_wg<64>(c, dq, dk, dv, dout, lse, delta, q, k, v, B, T, Hq, Hkv, ws, ws_bytes);
    else return 0;
    return 1;
}
