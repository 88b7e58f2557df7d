// cuda_attn_bwd_ws.cu — the stored-dS attention backward's two kernels, warp-specialised (sm_90a,
// D = 128): dK/dV with the same math, outputs and stored dSᵀ tiles as k_attn_dkdv_wg<128, true>
// (cuda_attn_bwd_wg.cu: read its header), and dQ from those tiles as k_attn_dq_ds. The default
// stored-dS backward at Mixtral's head dim on Hopper; without TMA (no tensor-map encoder in the
// driver) the backward recomputes S and dP in the one-warpgroup kernels instead.
//
// A CTA owns 128 keys of one (batch row, kv head) pair: three warpgroups, two consumers (warps
// 0-3: keys 0-63, warps 4-7: keys 64-127) and a producer (warp 8; the group's registers go to the
// consumers: setmaxnreg 24 / 240).
//   producer  K and V once ([128][128] tiles, TMA); then per item — query head h of the group ×
//             64-query tile, from the CTA's diagonal tile on — Q and dO ([64][128], TMA) and the
//             tile's 64 lse and 64 Δ (its 32 lanes, plain loads into shared memory) into stage
//             it % WK_NS; "full" counts the 32 lanes and the TMA bytes, "empty" the 256 consumer
//             threads.
//   consumers per item, each on its own 64 keys (the query tile before a warpgroup's keys is all
//             masked: that warpgroup skips it):
//               Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ      2 × 8 wgmma m64n64k16 (SS)
//               Pᵀ, dSᵀ = Pᵀ ∘ (dPᵀ − Δ)     registers
//               dV += Pᵀ·dO, dK += dSᵀ·Q     2 × 4 wgmma m64n128k16 (RS; dO, Q MN-major)
//               the bf16 dSᵀ tile → shared (SW128 image, two buffers per warpgroup) → the
//               workspace (16-byte stores), while dV and dK run; then the stage is released.
//             The two warpgroups share every load and take turns issuing their products (named
//             barriers 3 and 4, as the forward's ping-pong), so one's elementwise part runs under
//             the other's products. A warpgroup that skips an item still takes its two turns.
// Packed documents (doc, backend.h attn_fwd): a CTA's items end at the query tile holding the end
// of the document of its last key (no later query sees any of its keys), a warpgroup skips the
// items none of whose queries reach its keys' documents, and Pᵀ is also masked where the key is
// before the query's document start (the stage holds the tile's 64 starts after lse and Δ). The
// dSᵀ tiles written are exactly those dq reads (k_attn_dq_ws starts at the key tile holding its
// first row's document start); the others are never read.
// Shared memory: K, V 64 KB, WK_NS stages of Q, dO (32 KB) and lse, Δ (512 B; 768 B with the
// document starts), 4 dSᵀ buffers (32 KB), mbarriers: 162 KB at WK_NS = 2.
//
// dq (k_attn_dq_ws): k_attn_dq_ds's work — a CTA owns 64 query rows of one query head and adds
// dS·K over the key tiles up to the diagonal, in key order (deterministic) — with a producer warp
// feeding WQ_NS stages: the 8 KB dSᵀ image by one bulk copy, the K tile by TMA. The kernel is
// bound by reading dS (4.4 GB per layer at micro-batch 8): deeper prefetch than cp.async's.
#include "attn_wg.cuh"
#include "tma.cuh"

enum { WK_THREADS = 384, WK_NS = 2, WK_R = 64, WK_DS = 64 * 64 };
#define WK_KV (128u * 128u * 2u)   // bytes of the [128][128] K (or V) tile
#define WK_QT (64u * 128u * 2u)    // bytes of a [64][128] Q (or dO) tile
// bytes of a stage's lse[64], Δ[64], then (with documents) the document starts [64]
#define WK_L(DOCS) ((DOCS ? 3u : 2u) * 64u * 4u)
#define WK_SD (64u * 64u * 2u)     // bytes of a dSᵀ image

// DOCS: doc is given (packed documents); DOCS = false compiles to plain causal attention's code.
template <bool DOCS>
__global__ void __launch_bounds__(WK_THREADS, 1)
    k_attn_dkdv_ws(bf16* dk, bf16* dv, bf16* ds, const float* lse, const float* delta,
                   const __grid_constant__ CUtensorMap mq, const __grid_constant__ CUtensorMap mo,
                   const __grid_constant__ CUtensorMap mk, const __grid_constant__ CUtensorMap mv, int T, int Hq,
                   int Hkv, int p0, float sl2, float scale, const int32_t* doc) {
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw), base = (raw + 1023u) & ~1023u;
    const uint32_t Ks = base, Vs = base + WK_KV, Qb = base + 2 * WK_KV;  // Q stage s: Qb + s·WK_QT
    const uint32_t Ob = Qb + WK_NS * WK_QT, Sdb = Ob + WK_NS * WK_QT;     // dO stage s; dSᵀ buffer i: Sdb + i·WK_SD
    const uint32_t Lb = Sdb + 4 * WK_SD, bars = Lb + WK_NS * WK_L(DOCS);  // lse/Δ stage s: Lb + s·WK_L
    const float* lsh = (const float*)(smem_raw + (Lb - raw));
    // mbarriers: K+V once; full[s], empty[s]
    const uint32_t fullKV = bars, full0 = bars + 8, empty0 = bars + 8 + 8 * WK_NS;
    const int tid = threadIdx.x, lane = tid & 31;
    const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
    const int kb = blockIdx.x, pair = p0 + blockIdx.y, kh = pair % Hkv, b = pair / Hkv, grp = Hq / Hkv;
    const int32_t* docb = DOCS ? doc + (size_t)b * T : nullptr;
    // query tiles 2kb..qlast: up to the end of the document holding the CTA's last key
    const int nqt = (T + WK_R - 1) / WK_R;
    const int qlast = DOCS ? (attn_doc_end(docb, T, min(kb * 128 + 127, T - 1)) - 1) / WK_R : nqt - 1;
    const int per_h = qlast + 1 - 2 * kb, n_it = grp * per_h;

    if (tid == 0) {
        mbar_init(fullKV, 1);
        for (int s = 0; s < WK_NS; s++) mbar_init(full0 + 8 * s, 32), mbar_init(empty0 + 8 * s, 256);
        mbar_init_fence();
    }
    __syncthreads();

    if (warp >= 8) {  // ---- producer warpgroup
        reg_dealloc<24>();
        if (warp == 8) {
            if (lane == 0) {
                mbar_expect_tx(fullKV, 2 * WK_KV);
                tma_load4(Ks, &mk, 0, kh, kb * 128, b, fullKV);
                tma_load4(Ks + WK_KV / 2, &mk, 64, kh, kb * 128, b, fullKV);
                tma_load4(Vs, &mv, 0, kh, kb * 128, b, fullKV);
                tma_load4(Vs + WK_KV / 2, &mv, 64, kh, kb * 128, b, fullKV);
            }
            for (int it = 0; it < n_it; it++) {
                const int s = it % WK_NS, u = it / WK_NS;
                if (it >= WK_NS) mbar_wait(empty0 + 8 * s, (u + 1) & 1);  // use u − 1 released
                const int h = kh * grp + it / per_h, q0 = (2 * kb + it % per_h) * WK_R, t = q0 + 2 * lane;
                const size_t li = ((size_t)b * Hq + h) * T + t;
                float* ls = (float*)lsh + s * (WK_L(DOCS) / 4);
                ls[2 * lane] = t < T ? lse[li] : 0.f;
                ls[2 * lane + 1] = t + 1 < T ? lse[li + 1] : 0.f;
                ls[64 + 2 * lane] = t < T ? delta[li] : 0.f;
                ls[64 + 2 * lane + 1] = t + 1 < T ? delta[li + 1] : 0.f;
                if (DOCS) {
                    int* dst = (int*)ls + 128;  // document starts (rows ≥ T: T, masked anyway)
                    dst[2 * lane] = t < T ? (int)docb[t] : T;
                    dst[2 * lane + 1] = t + 1 < T ? (int)docb[t + 1] : T;
                }
                const uint32_t full = full0 + 8 * s;
                if (lane == 0) {
                    mbar_expect_tx(full, 2 * WK_QT);
                    tma_load4(Qb + s * WK_QT, &mq, 0, h, q0, b, full);
                    tma_load4(Qb + s * WK_QT + WK_QT / 2, &mq, 64, h, q0, b, full);
                    tma_load4(Ob + s * WK_QT, &mo, 0, h, q0, b, full);
                    tma_load4(Ob + s * WK_QT + WK_QT / 2, &mo, 64, h, q0, b, full);
                } else {
                    mbar_arrive(full);
                }
            }
        }
    } else {
        // ---- consumers: warpgroup wg owns keys 64wg..64wg+63 of the CTA's 128, warp w 16 of them
        reg_alloc<240>();
        const int wg = warp >> 2, w = warp & 3, g = lane >> 2, c4 = lane & 3, tw = tid & 127;
        const int ktw = 2 * kb + wg, kw0 = ktw * WK_R;  // this warpgroup's 64-key tile
        const int key0 = kw0 + w * 16 + g;              // this thread's keys: key0, key0 + 8
        const size_t ntri = (size_t)nqt * (nqt + 1) / 2;
        // (warpgroup-uniform) the first query past the document of this warpgroup's last key
        const int qend_w = DOCS ? attn_doc_end(docb, T, min(kw0 + WK_R - 1, T - 1)) : T;
        float dka[64], dva[64];  // dK / scale, dV; the first products overwrite them
        int started = 0, par = 0;
        mbar_wait(fullKV, 0);

        if (wg == 1) nbar_arrive<256>(3);  // warpgroup 0 takes the first turn
        for (int it = 0; it < n_it; it++) {
            const int s = it % WK_NS, u = it / WK_NS;
            const int hh = it / per_h, qt = 2 * kb + it % per_h, qq0 = qt * WK_R;
            // (warpgroup-uniform) some query of the tile sees some key of ours; a warpgroup that
            // skips the item still takes its turns
            const bool act = qt >= ktw && (!DOCS || qq0 < qend_w);
            mbar_wait(full0 + 8 * s, u & 1);
            const uint32_t Qs = Qb + s * WK_QT, Os = Ob + s * WK_QT;
            uint32_t ap[4][4], as[4][4];  // Pᵀ and dSᵀ as bf16 A fragments
            nbar_sync<256>(3 + wg);  // my turn: Sᵀ and dPᵀ
            if (act) {
                float sT[32], dpT[32];  // Sᵀ and dPᵀ: rows = keys, columns = queries
                wg_arrive();
#pragma unroll
                for (int kk = 0; kk < 8; kk++)
                    wg_ss<64>(sT, wg_desc_k(Ks, 128, 64 * wg, kk), wg_desc_k(Qs, WK_R, 0, kk), kk > 0);
#pragma unroll
                for (int kk = 0; kk < 8; kk++)
                    wg_ss<64>(dpT, wg_desc_k(Vs, 128, 64 * wg, kk), wg_desc_k(Os, WK_R, 0, kk), kk > 0);
                wg_commit();
                nbar_arrive<256>(4 - wg);  // the other warpgroup's turn
                wg_reg_fence<32>(sT);
                wg_reg_fence<32>(dpT);
                wg_wait<0>();
                wg_reg_fence<32>(sT);
                wg_reg_fence<32>(dpT);

                // Pᵀ (query < key and query ≥ T masked), dSᵀ = Pᵀ ∘ (dPᵀ − Δ)
                const float* ls = lsh + s * (WK_L(DOCS) / 4);
                const bool need_mask =
                    qq0 < kw0 + WK_R || qq0 + WK_R > T || (DOCS && ((const int*)ls)[128 + 63] > kw0);
                attn_pds_tile(sT, dpT, ls, qq0, key0, c4, T, sl2, need_mask, DOCS ? (const int*)ls + 128 : nullptr);
#pragma unroll
                for (int kk = 0; kk < 4; kk++) {
                    wg_pack_a(ap[kk], sT, kk);
                    wg_pack_a(as[kk], dpT, kk);
                }
            } else {
                nbar_arrive<256>(4 - wg);
            }
            nbar_sync<256>(3 + wg);  // my turn: dV and dK
            if (act) {
                wg_reg_fence<64>(dka);
                wg_reg_fence<64>(dva);
                wg_reg_fence_u<16>(&ap[0][0]);
                wg_reg_fence_u<16>(&as[0][0]);
                wg_arrive();
#pragma unroll
                for (int kk = 0; kk < 4; kk++) {
                    wg_rs<128, 1>(dva, ap[kk], wg_desc_mn(Os, WK_R, kk), kk > 0 || started);
                    wg_rs<128, 1>(dka, as[kk], wg_desc_mn(Qs, WK_R, kk), kk > 0 || started);
                }
                wg_commit();
                nbar_arrive<256>(4 - wg);  // the other warpgroup's turn
                wg_reg_fence<64>(dka);
                wg_reg_fence<64>(dva);
                started = 1;

                // the bf16 dSᵀ (the A of dK) → this warpgroup's shared image (buffer par) → global
                const uint32_t Sd = Sdb + (uint32_t)(2 * wg + par) * WK_SD;
                attn_ds_image_store(Sd, as, w * 16 + g, c4);
                nbar_sync<128>(1 + wg);  // the warpgroup's image is complete (the other buffer is
                                         // rewritten only after the next item's barrier: two buffers)
                bf16* dst = ds + (((size_t)blockIdx.y * grp + hh) * ntri + (size_t)qt * (qt + 1) / 2 + ktw) * WK_DS;
#pragma unroll
                for (int i = 0; i < (int)(WK_SD / 16 / 128); i++) {
                    const int ch = i * 128 + tw;
                    uint4 x;
                    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                                 : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w)
                                 : "r"(Sd + ch * 16)
                                 : "memory");
                    *(uint4*)(dst + ch * 8) = x;
                }
                par ^= 1;
                wg_wait<0>();  // dV, dK done: the stage's Q and dO are no longer read
                wg_reg_fence<64>(dka);
                wg_reg_fence<64>(dva);
            } else {
                nbar_arrive<256>(4 - wg);
            }
            // every consumer thread releases the stage itself (256 arrivals): its lse/Δ were
            // written with plain stores by the producer's lanes, and compute-sanitizer's racecheck
            // does not follow a release by lane 0 after __syncwarp (dev/racecheck_probe.cu)
            mbar_arrive(empty0 + 8 * s);
        }
        if (wg == 0) nbar_sync<256>(3);  // warpgroup 1's last hand-over (one more arrival on barrier 3)

        const size_t ks = (size_t)Hkv * 128, koff = (size_t)b * T * ks + (size_t)kh * 128;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int key = key0 + r * 8;
            if (key >= T || !started) continue;  // (a warpgroup with no item has only keys ≥ T)
            wg_store_row<128>(dk + koff + (size_t)key * ks, dka, r, c4, scale);
            wg_store_row<128>(dv + koff + (size_t)key * ks, dva, r, c4, 1.f);
        }
    }
}

// ---- dq from the stored dSᵀ tiles -----------------------------------------------------------
enum { WQ_NS = 4, WQ_THREADS = 160 };  // one consumer warpgroup + the producer warp
#define WQ_ST (WK_SD + WK_QT)          // bytes of a stage: the dSᵀ image, then the K tile

template <bool DOCS>
__global__ void __launch_bounds__(WQ_THREADS) k_attn_dq_ws(bf16* dq, const bf16* ds, const __grid_constant__ CUtensorMap mk,
                                                          int T, int Hq, int Hkv, int p0, float scale,
                                                          const int32_t* doc) {
    extern __shared__ unsigned char smem_raw[];
    const uint32_t base = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
    const uint32_t full0 = base + WQ_NS * WQ_ST, empty0 = full0 + 8 * WQ_NS;
    const int tid = threadIdx.x, lane = tid & 31;
    const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
    const int nqt = gridDim.x, qt = nqt - 1 - blockIdx.x, grp = Hq / Hkv;  // heavy (late) query tiles first
    const int pair = p0 + blockIdx.y / grp, kh = pair % Hkv, b = pair / Hkv, h = kh * grp + blockIdx.y % grp;
    // key tiles k0t..qt: from the one holding the first row's document start (the tiles dk/dv wrote)
    const int k0t = DOCS ? doc[(size_t)b * T + qt * WK_R] / WK_R : 0, n_kt = qt + 1 - k0t;
    const bf16* dsr = ds + ((size_t)blockIdx.y * ((size_t)nqt * (nqt + 1) / 2) + (size_t)qt * (qt + 1) / 2) * WK_DS;

    if (tid == 0) {
        for (int s = 0; s < WQ_NS; s++) mbar_init(full0 + 8 * s, 1), mbar_init(empty0 + 8 * s, 4);
        mbar_init_fence();
    }
    __syncthreads();
    if (warp == 4) {  // ---- producer
        if (lane == 0)
            for (int kt = 0; kt < n_kt; kt++) {
                const int s = kt % WQ_NS;
                const uint32_t st = base + (uint32_t)s * WQ_ST, full = full0 + 8 * s;
                if (kt >= WQ_NS) mbar_wait(empty0 + 8 * s, ((kt / WQ_NS) + 1) & 1);
                mbar_expect_tx(full, WQ_ST);
                bulk_load(st, dsr + (size_t)(k0t + kt) * WK_DS, WK_SD, full);
                tma_load4(st + WK_SD, &mk, 0, kh, (k0t + kt) * WK_R, b, full);
                tma_load4(st + WK_SD + WK_QT / 2, &mk, 64, kh, (k0t + kt) * WK_R, b, full);
            }
        return;
    }
    // ---- the consumer warpgroup: warp w owns query rows 16w..16w+15 of the tile
    const int w = warp, g = lane >> 2, c4 = lane & 3;
    float acc[64];  // dQ / scale; the first product overwrites it
    for (int kt = 0; kt < n_kt; kt++) {
        const int s = kt % WQ_NS;
        const uint32_t st = base + (uint32_t)s * WQ_ST;
        mbar_wait(full0 + 8 * s, (kt / WQ_NS) & 1);
        wg_reg_fence<64>(acc);
        wg_arrive();
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            wg_ss<128, 1, 1>(acc, wg_desc_mn(st, WK_R, kk), wg_desc_mn(st + WK_SD, WK_R, kk), kk > 0 || kt > 0);
        wg_commit();
        wg_reg_fence<64>(acc);
        wg_wait<1>();  // the products of tile kt − 1 retired: its stage may be refilled
        wg_reg_fence<64>(acc);
        if (kt > 0) {
            __syncwarp();
            if (lane == 0) mbar_arrive(empty0 + 8 * ((kt - 1) % WQ_NS));
        }
    }
    wg_wait<0>();
    wg_reg_fence<64>(acc);
    const int row0 = qt * WK_R + w * 16 + g;
    const size_t qs = (size_t)Hq * 128, qoff = (size_t)b * T * qs + (size_t)h * 128;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + r * 8;
        if (row >= T) continue;
        wg_store_row<128>(dq + qoff + (size_t)row * qs, acc, r, c4, scale);
    }
}

// 1 when a wait of the kernel gave up since the last call (then clears the flag); synchronizes.
extern "C" int cuda_attn_bwd_ws_stalled(void) {
    return tma_stalled_take();
}

// The stored-dS backward at D = 128 with the warp-specialised kernels (the caller checked wgmma,
// bf16 and alignment, and computed Δ into delta): per chunk of `chunk` (batch row, kv head) pairs,
// dK, dV and the dSᵀ tiles into ds, then dQ from them. 0 (nothing launched) when the driver cannot
// make the tensor maps. doc: packed documents or NULL.
int attn_bwd_ws(CudaImpl* c, bf16* dq, bf16* dk, bf16* dv, bf16* ds, const bf16* dout, const float* lse,
                const float* delta, const bf16* q, const bf16* k, const bf16* v, int B, int T, int Hq, int Hkv,
                int chunk, const int32_t* doc) {
    CUtensorMap mq, mo, mk, mv, mk64;
    if (!tma_map_bthd(&mq, q, B, T, Hq, WK_R) || !tma_map_bthd(&mo, dout, B, T, Hq, WK_R) ||
        !tma_map_bthd(&mk, k, B, T, Hkv, 128) || !tma_map_bthd(&mv, v, B, T, Hkv, 128) ||
        !tma_map_bthd(&mk64, k, B, T, Hkv, WK_R))
        return 0;
    const size_t sm_kv_max = 2 * WK_KV + WK_NS * (2 * WK_QT + WK_L(true)) + 4 * WK_SD + 8 * (1 + 2 * WK_NS) + 1024;
    const size_t sm_kv = sm_kv_max - (doc ? 0 : WK_NS * (WK_L(true) - WK_L(false)));
    const size_t sm_dq = WQ_NS * (size_t)WQ_ST + 16 * WQ_NS + 1024;
    static bool attr = false;
    if (!attr) {
        CUDA_CK(cudaFuncSetAttribute(k_attn_dkdv_ws<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)sm_kv_max));
        CUDA_CK(cudaFuncSetAttribute(k_attn_dkdv_ws<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)sm_kv_max));
        CUDA_CK(cudaFuncSetAttribute(k_attn_dq_ws<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm_dq));
        CUDA_CK(cudaFuncSetAttribute(k_attn_dq_ws<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm_dq));
        attr = true;
    }
    const float scale = 1.0f / sqrtf(128.f), sl2 = scale * LOG2E;
    const int pairs = B * Hkv;
    for (int p0 = 0; p0 < pairs; p0 += chunk) {
        const int np = pairs - p0 < chunk ? pairs - p0 : chunk;
        const dim3 gkn((unsigned)((T + 127) / 128), (unsigned)np);
        const dim3 gqn((unsigned)((T + WK_R - 1) / WK_R), (unsigned)(np * (Hq / Hkv)));
        if (doc)
            k_attn_dkdv_ws<true><<<gkn, WK_THREADS, sm_kv, c->stream>>>(dk, dv, ds, lse, delta, mq, mo, mk, mv, T, Hq,
                                                                        Hkv, p0, sl2, scale, doc);
        else
            k_attn_dkdv_ws<false><<<gkn, WK_THREADS, sm_kv, c->stream>>>(dk, dv, ds, lse, delta, mq, mo, mk, mv, T, Hq,
                                                                         Hkv, p0, sl2, scale, doc);
        LAUNCH_CK(c);
        if (doc)
            k_attn_dq_ws<true><<<gqn, WQ_THREADS, sm_dq, c->stream>>>(dq, ds, mk64, T, Hq, Hkv, p0, scale, doc);
        else
            k_attn_dq_ws<false><<<gqn, WQ_THREADS, sm_dq, c->stream>>>(dq, ds, mk64, T, Hq, Hkv, p0, scale, doc);
        LAUNCH_CK(c);
    }
    return 1;
}
