// cuda_attn_bwd.cu — causal GQA attention backward. With P_ts = exp(q_t·k_s·scale − lse_t),
// dP = dO·vᵀ, Δ_t = dO_t·O_t, dS = P ∘ (dP − Δ):
//   dq_t = scale Σ_s dS_ts k_s,  dk_s = scale Σ_{h in group, t≥s} dS_ts q_t,  dv_s = Σ P_ts dO_t.
// P is recomputed from lse; nothing T×T is stored (except, on Hopper with a workspace, dS: see
// cuda_attn_bwd_wg.cu). Two kernels, each output row owned by one
// warp (no atomics, deterministic): dq by 64-query tiles walking the keys up to the diagonal,
// dk/dv by 64-key tiles walking the query tiles (of 32) of every query head of the kv group.
// Δ is computed first into scratch ([B, Hq, T] fp32, in batch chunks when it does not fit).
// Packed documents (doc): dq starts at the key tile holding its first row's document start, dk/dv
// ends at the query tile holding the end of the document of its last key, and P is also 0 where
// the key is before the query's document start.
//
// bf16, D ∈ {16, 32, 64, 128}: tensor cores (mma.sync m16n8k16), as in cuda_attn.cu; the dS and
// P fragments are packed to bf16 and fed to the next product from registers. On Hopper (sm_90a
// build) D = 64 and 128 take the wgmma kernels in cuda_attn_bwd_wg.cu instead (gpu.attention =
// mma keeps these). Otherwise simple warp-per-row kernels in fp32.
#include "cuda_attn.cuh"

enum { BW_THREADS = 128, DQ_BR = 64, DQ_BC = 64, KV_BC = 64, KV_BQ = 32 };

// ---- Δ = rowsum(dO ∘ O) ----------------------------------------------------------------------

template <typename T>
__global__ void k_attn_delta(float* delta, const T* dout, const T* out, int B, int T_, int Hq, int D) {
    const int lane = threadIdx.x & 31;
    const size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;  // over (b, h, t)
    if (row >= (size_t)B * Hq * T_) return;
    const int t = (int)(row % T_), h = (int)(row / T_ % Hq), b = (int)(row / T_ / Hq);
    const size_t base = (((size_t)b * T_ + t) * Hq + h) * D;
    float s = 0.f;
    for (int d = lane; d < D; d += 32) s += to_f(dout[base + d]) * to_f(out[base + d]);
    s = warp_sum(s);
    if (lane == 0) delta[row] = s;
}

void attn_delta(Backend* be, float* delta, const void* dout, const void* out, int B, int T, int Hq, int D) {
    CudaImpl* c = CI(be);
    const unsigned grid = (unsigned)(((size_t)B * Hq * T * 32 + 127) / 128);
    if (is_bf16(be)) k_attn_delta<bf16><<<grid, 128, 0, c->stream>>>(delta, (const bf16*)dout, (const bf16*)out, B, T, Hq, D);
    else k_attn_delta<float><<<grid, 128, 0, c->stream>>>(delta, (const float*)dout, (const float*)out, B, T, Hq, D);
    LAUNCH_CK(c);
}

// ---- tensor-core dq --------------------------------------------------------------------------

// DOCS (both kernels): doc is given (packed documents); DOCS = false compiles to plain causal
// attention's code.
template <int D, bool DOCS>
__global__ void __launch_bounds__(BW_THREADS) k_attn_dq_tc(bf16* dq, const bf16* dout, const float* lse,
                                                            const float* delta, const bf16* q, const bf16* k,
                                                            const bf16* v, int T, int Hq, int Hkv, float sl2,
                                                            float scale, const int32_t* doc) {
    constexpr int LD = D + ATTN_PAD, KS = D / 16, NT = DQ_BC / 8, DT = D / 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* Qs = (bf16*)smem_raw;   // [DQ_BR][LD]
    bf16* Os = Qs + DQ_BR * LD;   // dO [DQ_BR][LD]
    bf16* Kb = Os + DQ_BR * LD;      // 2 × [DQ_BC][LD]: tile kt in buffer kt & 1
    bf16* Vb = Kb + 2 * DQ_BC * LD;  // 2 × [DQ_BC][LD]
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, c4 = lane & 3;
    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, kh = h / (Hq / Hkv);
    const int q0 = qt * DQ_BR;
    const size_t qs = (size_t)Hq * D, ks = (size_t)Hkv * D;
    const size_t qoff = (size_t)b * T * qs + (size_t)h * D;
    const bf16* kb = k + (size_t)b * T * ks + (size_t)kh * D;
    const bf16* vb = v + (size_t)b * T * ks + (size_t)kh * D;
    load_tile<DQ_BR, D, BW_THREADS>(Qs, q + qoff, qs, q0, T);
    load_tile<DQ_BR, D, BW_THREADS>(Os, dout + qoff, qs, q0, T);
    const int row0 = q0 + w * 16 + g;
    float ll[2], dl[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + r * 8;
        const size_t li = ((size_t)b * Hq + h) * T + row;
        ll[r] = row < T ? lse[li] * LOG2E : 0.f;
        dl[r] = row < T ? delta[li] : 0.f;
    }
    float acc[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    const int kt_end = (min(q0 + DQ_BR, T) + DQ_BC - 1) / DQ_BC;
    const int32_t* docb = DOCS ? doc + (size_t)b * T : nullptr;
    const int dsr[2] = {DOCS ? (int)docb[min(row0, T - 1)] : 0, DOCS ? (int)docb[min(row0 + 8, T - 1)] : 0};
    const int dlast = DOCS ? (int)docb[min(q0 + w * 16 + 15, T - 1)] : 0;
    const int kt0 = DOCS ? (int)docb[q0] / DQ_BC : 0;

    load_tile_async<DQ_BC, D, BW_THREADS>(Kb, kb, ks, kt0 * DQ_BC, T);
    load_tile_async<DQ_BC, D, BW_THREADS>(Vb, vb, ks, kt0 * DQ_BC, T);
    cp_async_commit();
    for (int kt = kt0; kt < kt_end; kt++) {  // tile kt in buffer (kt − kt0) & 1
        const int k0 = kt * DQ_BC;
        if (kt + 1 < kt_end) {  // prefetch tile kt + 1 while tile kt computes
            const int nb = (kt + 1 - kt0) & 1;
            load_tile_async<DQ_BC, D, BW_THREADS>(Kb + nb * DQ_BC * LD, kb, ks, k0 + DQ_BC, T);
            load_tile_async<DQ_BC, D, BW_THREADS>(Vb + nb * DQ_BC * LD, vb, ks, k0 + DQ_BC, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // tile kt (and, the first time, Q and dO) visible to every thread
        const bf16* Ks = Kb + ((kt - kt0) & 1) * DQ_BC * LD;
        const bf16* Vs = Vb + ((kt - kt0) & 1) * DQ_BC * LD;
        float s[NT][4], dp[NT][4];
#pragma unroll
        for (int i = 0; i < NT; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            uint32_t a[4], ao[4];
            frag_a(a, Qs, LD, w * 16, kk * 16, lane);
            frag_a(ao, Os, LD, w * 16, kk * 16, lane);
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t bf[4];
                frag_b_nk(bf, Ks, LD, np * 16, kk * 16, lane);
                mma_bf16(s[2 * np], a, bf);
                mma_bf16(s[2 * np + 1], a, bf + 2);
                frag_b_nk(bf, Vs, LD, np * 16, kk * 16, lane);
                mma_bf16(dp[2 * np], ao, bf);
                mma_bf16(dp[2 * np + 1], ao, bf + 2);
            }
        }
        const bool need_mask = k0 + DQ_BC - 1 > q0 + w * 16 || k0 + DQ_BC > T || (DOCS && k0 < dlast);
#pragma unroll
        for (int i = 0; i < NT; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1;
                float p = fast_exp2(s[i][e] * sl2 - ll[r]);
                if (need_mask) {
                    const int key = k0 + i * 8 + 2 * c4 + (e & 1);
                    if (key > row0 + r * 8 || key >= T || (DOCS && key < dsr[r])) p = 0.f;
                }
                s[i][e] = p * (dp[i][e] - dl[r]);  // dS
            }
        // dQ += dS·K
#pragma unroll
        for (int kk = 0; kk < DQ_BC / 16; kk++) {
            uint32_t a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                             pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dd = 0; dd < DT / 2; dd++) {
                uint32_t bf[4];
                frag_b_kn(bf, Ks, LD, kk * 16, dd * 16, lane);
                mma_bf16(acc[2 * dd], a, bf);
                mma_bf16(acc[2 * dd + 1], a, bf + 2);
            }
        }
        __syncthreads();  // buffer kt & 1 is refilled by iteration kt + 1
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + r * 8;
        if (row >= T) continue;
        bf16* o = dq + qoff + (size_t)row * qs;
#pragma unroll
        for (int i = 0; i < DT; i++)
            *(uint32_t*)(o + i * 8 + 2 * c4) = pack_bf16(acc[i][2 * r] * scale, acc[i][2 * r + 1] * scale);
    }
}

// ---- tensor-core dk, dv ----------------------------------------------------------------------

template <int D, bool DOCS>
__global__ void __launch_bounds__(BW_THREADS) k_attn_dkdv_tc(bf16* dk, bf16* dv, const bf16* dout, const float* lse,
                                                              const float* delta, const bf16* q, const bf16* k,
                                                              const bf16* v, int T, int Hq, int Hkv, float sl2,
                                                              float scale, const int32_t* doc) {
    constexpr int LD = D + ATTN_PAD, KS = D / 16, NQ = KV_BQ / 8, DT = D / 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* Ks = (bf16*)smem_raw;   // [KV_BC][LD]
    bf16* Vs = Ks + KV_BC * LD;   // [KV_BC][LD]
    bf16* Qb = Vs + KV_BC * LD;      // 2 × [KV_BQ][LD]: iteration it in buffer it & 1
    bf16* Ob = Qb + 2 * KV_BQ * LD;  // dO, 2 × [KV_BQ][LD]
    float* lb = (float*)(Ob + 2 * KV_BQ * LD);  // 2 × [KV_BQ] lse · log2 e (+inf past T)
    float* db = lb + 2 * KV_BQ;                 // 2 × [KV_BQ] Δ
    int* sb = (int*)(db + 2 * KV_BQ);           // 2 × [KV_BQ] document starts (packed documents)
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, c4 = lane & 3;
    const int kt = blockIdx.x, kh = blockIdx.y, b = blockIdx.z, grp = Hq / Hkv;
    const int k0 = kt * KV_BC;
    const size_t qs = (size_t)Hq * D, ks = (size_t)Hkv * D;
    const size_t koff = (size_t)b * T * ks + (size_t)kh * D;
    load_tile<KV_BC, D, BW_THREADS>(Ks, k + koff, ks, k0, T);
    load_tile<KV_BC, D, BW_THREADS>(Vs, v + koff, ks, k0, T);
    const int key0 = k0 + w * 16 + g;  // this thread's keys: key0, key0 + 8
    float dka[DT][4], dva[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[i][e] = dva[i][e] = 0.f;
    const int32_t* docb = DOCS ? doc + (size_t)b * T : nullptr;
    // query tiles qt0..: up to the one holding the end of the document of the tile's last key
    const int nqt = DOCS ? (attn_doc_end(docb, T, min(k0 + KV_BC - 1, T - 1)) + KV_BQ - 1) / KV_BQ
                         : (T + KV_BQ - 1) / KV_BQ;
    const int qt0 = k0 / KV_BQ, per_h = nqt - qt0, n_it = grp * per_h;

    // Iteration it covers query head kh·grp + it / per_h, query tile qt0 + it % per_h. Its Q, dO,
    // lse and Δ go to buffer it & 1; iteration it + 1's are in flight while it computes.
    auto issue = [&](int it) {
        const int h = kh * grp + it / per_h, qq0 = (qt0 + it % per_h) * KV_BQ, nb = it & 1;
        const size_t qoff = (size_t)b * T * qs + (size_t)h * D, lrow = ((size_t)b * Hq + h) * T;
        load_tile_async<KV_BQ, D, BW_THREADS>(Qb + nb * KV_BQ * LD, q + qoff, qs, qq0, T);
        load_tile_async<KV_BQ, D, BW_THREADS>(Ob + nb * KV_BQ * LD, dout + qoff, qs, qq0, T);
        cp_async_commit();
        for (int i = threadIdx.x; i < KV_BQ; i += BW_THREADS) {
            const int t = qq0 + i;
            lb[nb * KV_BQ + i] = t < T ? lse[lrow + t] * LOG2E : INFINITY;
            db[nb * KV_BQ + i] = t < T ? delta[lrow + t] : 0.f;
            if (DOCS) sb[nb * KV_BQ + i] = t < T ? (int)docb[t] : T;
        }
    };
    issue(0);
    for (int it = 0; it < n_it; it++) {
        {
            const int qq0 = (qt0 + it % per_h) * KV_BQ;
            if (it + 1 < n_it) {
                issue(it + 1);
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();  // iteration it's tiles (and, the first time, K and V) visible
            const bf16* Qs = Qb + (it & 1) * KV_BQ * LD;
            const bf16* Os = Ob + (it & 1) * KV_BQ * LD;
            const float* ls = lb + (it & 1) * KV_BQ;
            const float* ds_ = db + (it & 1) * KV_BQ;
            const int* qs_ = sb + (it & 1) * KV_BQ;
            float st[NQ][4], dpt[NQ][4];  // Sᵀ and dPᵀ: rows = keys, cols = queries
#pragma unroll
            for (int i = 0; i < NQ; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) st[i][e] = dpt[i][e] = 0.f;
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                uint32_t a[4], av[4];
                frag_a(a, Ks, LD, w * 16, kk * 16, lane);
                frag_a(av, Vs, LD, w * 16, kk * 16, lane);
#pragma unroll
                for (int np = 0; np < NQ / 2; np++) {
                    uint32_t bf[4];
                    frag_b_nk(bf, Qs, LD, np * 16, kk * 16, lane);
                    mma_bf16(st[2 * np], a, bf);
                    mma_bf16(st[2 * np + 1], a, bf + 2);
                    frag_b_nk(bf, Os, LD, np * 16, kk * 16, lane);
                    mma_bf16(dpt[2 * np], av, bf);
                    mma_bf16(dpt[2 * np + 1], av, bf + 2);
                }
            }
            const bool need_mask = qq0 < k0 + KV_BC || qq0 + KV_BQ > T || (DOCS && qs_[KV_BQ - 1] > k0);
#pragma unroll
            for (int i = 0; i < NQ; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int qi = i * 8 + 2 * c4 + (e & 1);
                    float p = fast_exp2(st[i][e] * sl2 - ls[qi]);  // 0 past T (ls = +inf)
                    if (need_mask && (qq0 + qi < key0 + (e >> 1) * 8 || (DOCS && key0 + (e >> 1) * 8 < qs_[qi]))) p = 0.f;
                    st[i][e] = p;
                    dpt[i][e] = p * (dpt[i][e] - ds_[qi]);  // dSᵀ
                }
            // dV += Pᵀ·dO, dK += dSᵀ·Q
#pragma unroll
            for (int kk = 0; kk < KV_BQ / 16; kk++) {
                uint32_t ap[4] = {pack_bf16(st[2 * kk][0], st[2 * kk][1]), pack_bf16(st[2 * kk][2], st[2 * kk][3]),
                                  pack_bf16(st[2 * kk + 1][0], st[2 * kk + 1][1]),
                                  pack_bf16(st[2 * kk + 1][2], st[2 * kk + 1][3])};
                uint32_t as[4] = {pack_bf16(dpt[2 * kk][0], dpt[2 * kk][1]),
                                  pack_bf16(dpt[2 * kk][2], dpt[2 * kk][3]),
                                  pack_bf16(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]),
                                  pack_bf16(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3])};
#pragma unroll
                for (int dd = 0; dd < DT / 2; dd++) {
                    uint32_t bf[4];
                    frag_b_kn(bf, Os, LD, kk * 16, dd * 16, lane);
                    mma_bf16(dva[2 * dd], ap, bf);
                    mma_bf16(dva[2 * dd + 1], ap, bf + 2);
                    frag_b_kn(bf, Qs, LD, kk * 16, dd * 16, lane);
                    mma_bf16(dka[2 * dd], as, bf);
                    mma_bf16(dka[2 * dd + 1], as, bf + 2);
                }
            }
        }
        __syncthreads();  // buffer it & 1 is refilled by iteration it + 1's issue
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key0 + r * 8;
        if (key >= T) continue;
        bf16* okk = dk + koff + (size_t)key * ks;
        bf16* ovv = dv + koff + (size_t)key * ks;
#pragma unroll
        for (int i = 0; i < DT; i++) {
            *(uint32_t*)(okk + i * 8 + 2 * c4) = pack_bf16(dka[i][2 * r] * scale, dka[i][2 * r + 1] * scale);
            *(uint32_t*)(ovv + i * 8 + 2 * c4) = pack_bf16(dva[i][2 * r], dva[i][2 * r + 1]);
        }
    }
}

template <int D>
static void launch_bwd_tc(CudaImpl* c, bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const float* lse,
                          const float* delta, const bf16* q, const bf16* k, const bf16* v, int B, int T, int Hq,
                          int Hkv, const int32_t* doc) {
    const size_t sm_dq = (size_t)(2 * DQ_BR + 4 * DQ_BC) * (D + ATTN_PAD) * sizeof(bf16);
    // dk/dv: K, V, two stages of Q and dO, two of lse and Δ (and with documents their starts)
    const size_t sm_kv_max =
        (size_t)(2 * KV_BC + 4 * KV_BQ) * (D + ATTN_PAD) * sizeof(bf16) + 6 * KV_BQ * sizeof(float);
    const size_t sm_kv = sm_kv_max - (doc ? 0 : 2 * KV_BQ * sizeof(float));
    static bool attr = false;  // per instantiation
    if (!attr) {
        CUDA_CK(cudaFuncSetAttribute(k_attn_dq_tc<D, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm_dq));
        CUDA_CK(cudaFuncSetAttribute(k_attn_dq_tc<D, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm_dq));
        CUDA_CK(cudaFuncSetAttribute(k_attn_dkdv_tc<D, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)sm_kv_max));
        CUDA_CK(cudaFuncSetAttribute(k_attn_dkdv_tc<D, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)sm_kv_max));
        attr = true;
    }
    const float scale = 1.0f / sqrtf((float)D), sl2 = scale * LOG2E;
    const dim3 gq((T + DQ_BR - 1) / DQ_BR, Hq, B), gk((T + KV_BC - 1) / KV_BC, Hkv, B);
    if (doc)
        k_attn_dq_tc<D, true><<<gq, BW_THREADS, sm_dq, c->stream>>>(dq, dout, lse, delta, q, k, v, T, Hq, Hkv, sl2,
                                                                    scale, doc);
    else
        k_attn_dq_tc<D, false><<<gq, BW_THREADS, sm_dq, c->stream>>>(dq, dout, lse, delta, q, k, v, T, Hq, Hkv, sl2,
                                                                     scale, doc);
    LAUNCH_CK(c);
    if (doc)
        k_attn_dkdv_tc<D, true><<<gk, BW_THREADS, sm_kv, c->stream>>>(dk, dv, dout, lse, delta, q, k, v, T, Hq, Hkv,
                                                                      sl2, scale, doc);
    else
        k_attn_dkdv_tc<D, false><<<gk, BW_THREADS, sm_kv, c->stream>>>(dk, dv, dout, lse, delta, q, k, v, T, Hq, Hkv,
                                                                       sl2, scale, doc);
    LAUNCH_CK(c);
}

// cuda_attn_bwd_wg.cu: the wgmma kernels (sm_90a), or 0 when they do not apply.
int attn_bwd_wg(CudaImpl* c, bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const float* lse, const float* delta,
                const bf16* q, const bf16* k, const bf16* v, int B, int T, int Hq, int Hkv, int D, void* ws,
                size_t ws_bytes, const int32_t* doc);

// ---- simple kernels: one warp per output row -------------------------------------------------

template <typename T, int DPL>
__global__ void k_attn_dq_simple(T* dq, const T* dout, const float* lse, const float* delta, const T* q, const T* k,
                                 const T* v, int B, int T_, int Hq, int Hkv, int D, float scale, const int32_t* doc) {
    const int lane = threadIdx.x & 31;
    const size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;  // over (b, h, t)
    if (row >= (size_t)B * Hq * T_) return;
    const int t = (int)(row % T_), h = (int)(row / T_ % Hq), b = (int)(row / T_ / Hq), kh = h / (Hq / Hkv);
    const size_t qi = (((size_t)b * T_ + t) * Hq + h) * D;
    float qv[DPL], gv[DPL], acc[DPL];
#pragma unroll
    for (int j = 0; j < DPL; j++) {
        const int d = lane + 32 * j;
        qv[j] = d < D ? to_f(q[qi + d]) : 0.f;
        gv[j] = d < D ? to_f(dout[qi + d]) : 0.f;
        acc[j] = 0.f;
    }
    const float l = lse[row], Di = delta[row];
    for (int s = doc ? doc[(size_t)b * T_ + t] : 0; s <= t; s++) {
        const size_t kv = (((size_t)b * T_ + s) * Hkv + kh) * D;
        float a = 0.f, c = 0.f;
#pragma unroll
        for (int j = 0; j < DPL; j++)
            if (lane + 32 * j < D) a += qv[j] * to_f(k[kv + lane + 32 * j]), c += gv[j] * to_f(v[kv + lane + 32 * j]);
        a = warp_sum(a);
        c = warp_sum(c);
        const float ds = expf(a * scale - l) * (c - Di);
#pragma unroll
        for (int j = 0; j < DPL; j++)
            if (lane + 32 * j < D) acc[j] += ds * to_f(k[kv + lane + 32 * j]);
    }
#pragma unroll
    for (int j = 0; j < DPL; j++)
        if (lane + 32 * j < D) dq[qi + lane + 32 * j] = from_f<T>(acc[j] * scale);
}

template <typename T, int DPL>
__global__ void k_attn_dkdv_simple(T* dk, T* dv, const T* dout, const float* lse, const float* delta, const T* q,
                                   const T* k, const T* v, int B, int T_, int Hq, int Hkv, int D, float scale,
                                   const int32_t* doc) {
    const int lane = threadIdx.x & 31;
    const size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;  // over (b, kh, s)
    if (row >= (size_t)B * Hkv * T_) return;
    const int s = (int)(row % T_), kh = (int)(row / T_ % Hkv), b = (int)(row / T_ / Hkv), grp = Hq / Hkv;
    const size_t kv = (((size_t)b * T_ + s) * Hkv + kh) * D;
    float kr[DPL], vr[DPL], ak[DPL], av[DPL];
#pragma unroll
    for (int j = 0; j < DPL; j++) {
        const int d = lane + 32 * j;
        kr[j] = d < D ? to_f(k[kv + d]) : 0.f;
        vr[j] = d < D ? to_f(v[kv + d]) : 0.f;
        ak[j] = av[j] = 0.f;
    }
    for (int h = kh * grp; h < (kh + 1) * grp; h++)
        for (int t = s; t < T_; t++) {
            if (doc && doc[(size_t)b * T_ + t] > s) break;  // t and every later query are past s's document
            const size_t qi = (((size_t)b * T_ + t) * Hq + h) * D, li = ((size_t)b * Hq + h) * T_ + t;
            float a = 0.f, c = 0.f;
#pragma unroll
            for (int j = 0; j < DPL; j++)
                if (lane + 32 * j < D) a += kr[j] * to_f(q[qi + lane + 32 * j]), c += vr[j] * to_f(dout[qi + lane + 32 * j]);
            a = warp_sum(a);
            c = warp_sum(c);
            const float p = expf(a * scale - lse[li]), ds = p * (c - delta[li]);
#pragma unroll
            for (int j = 0; j < DPL; j++)
                if (lane + 32 * j < D) {
                    av[j] += p * to_f(dout[qi + lane + 32 * j]);
                    ak[j] += ds * to_f(q[qi + lane + 32 * j]);
                }
        }
#pragma unroll
    for (int j = 0; j < DPL; j++)
        if (lane + 32 * j < D) {
            dk[kv + lane + 32 * j] = from_f<T>(ak[j] * scale);
            dv[kv + lane + 32 * j] = from_f<T>(av[j]);
        }
}

template <typename T>
static void launch_bwd_simple(CudaImpl* c, T* dq, T* dk, T* dv, const T* dout, const float* lse, const float* delta,
                              const T* q, const T* k, const T* v, int B, int T_, int Hq, int Hkv, int D,
                              const int32_t* doc) {
    const float sc = 1.0f / sqrtf((float)D);
    const unsigned gq = (unsigned)(((size_t)B * Hq * T_ * 32 + 127) / 128);
    const unsigned gk = (unsigned)(((size_t)B * Hkv * T_ * 32 + 127) / 128);
#define SB(DPL)                                                                                              \
    do {                                                                                                     \
        k_attn_dq_simple<T, DPL><<<gq, 128, 0, c->stream>>>(dq, dout, lse, delta, q, k, v, B, T_, Hq, Hkv, D, sc, doc); \
        LAUNCH_CK(c);                                                                                        \
        k_attn_dkdv_simple<T, DPL><<<gk, 128, 0, c->stream>>>(dk, dv, dout, lse, delta, q, k, v, B, T_, Hq, Hkv, D, \
                                                              sc, doc);                                      \
        LAUNCH_CK(c);                                                                                        \
    } while (0)
    if (D <= 32) SB(1);
    else if (D <= 64) SB(2);
    else if (D <= 128) SB(4);
    else SB(8);
#undef SB
}

void cuda_attn_bwd(Backend* be, void* dq, void* dk, void* dv, const void* dout, const void* out, const float* lse,
                   const void* q, const void* k, const void* v, int B, int T, int Hq, int Hkv, int D, void* ws,
                   size_t ws_bytes, const int32_t* doc) {
    // dq, dout, out, q [B, T, Hq, D]; dk, dv, k, v [B, T, Hkv, D]; lse [B, Hq, T]
    attn_check("attn_bwd", Hq, Hkv, D);
    if (B == 0 || T == 0) return;
    CudaImpl* c = CI(be);
    const size_t per_b = (size_t)Hq * T * sizeof(float);  // Δ of one batch row
    CHECK(per_b <= c->scratch_bytes, "attn_bwd: %d heads × %d positions exceed the scratch buffer", Hq, T);
    const int bc = (int)(c->scratch_bytes / per_b < (size_t)B ? c->scratch_bytes / per_b : (size_t)B);
    float* delta = (float*)c->scratch;  // [bc, Hq, T]
    const void* ptrs[7] = {dq, dk, dv, dout, q, k, v};
    // packed documents (doc): the tensor-core kernels skip the masked tiles (on Hopper the
    // stored-dS warp-specialised kernels at D = 128, else the mma.sync ones); the simple kernels
    // walk the visible pairs
    const int tc = attn_tc_ok(be, D, ptrs, 7);
    const size_t es = dtype_size(be->act_dtype), qb = (size_t)T * Hq * D * es, kb = (size_t)T * Hkv * D * es;
    for (int b0 = 0; b0 < B; b0 += bc) {
        const int nb = B - b0 < bc ? B - b0 : bc;
        const size_t oq = b0 * qb, ok = b0 * kb;
        const float* l = lse + (size_t)b0 * Hq * T;
        const int32_t* dc = doc ? doc + (size_t)b0 * T : NULL;
        char *q_ = (char*)q + oq, *k_ = (char*)k + ok, *v_ = (char*)v + ok, *o_ = (char*)out + oq;
        char *g_ = (char*)dout + oq, *dq_ = (char*)dq + oq, *dk_ = (char*)dk + ok, *dv_ = (char*)dv + ok;
        attn_delta(be, delta, g_, o_, nb, T, Hq, D);
        if (tc && attn_bwd_wg(c, (bf16*)dq_, (bf16*)dk_, (bf16*)dv_, (const bf16*)g_, l, delta, (const bf16*)q_,
                              (const bf16*)k_, (const bf16*)v_, nb, T, Hq, Hkv, D, ws, ws_bytes, dc))
            continue;  // Hopper: cuda_attn_bwd_wg.cu
        if (tc) {
#define TC(DD) launch_bwd_tc<DD>(c, (bf16*)dq_, (bf16*)dk_, (bf16*)dv_, (const bf16*)g_, l, delta, (const bf16*)q_, \
                                 (const bf16*)k_, (const bf16*)v_, nb, T, Hq, Hkv, dc)
            switch (D) {
                case 16: TC(16); break;
                case 32: TC(32); break;
                case 64: TC(64); break;
                default: TC(128); break;
            }
#undef TC
        } else if (is_bf16(be)) {
            launch_bwd_simple<bf16>(c, (bf16*)dq_, (bf16*)dk_, (bf16*)dv_, (const bf16*)g_, l, delta, (const bf16*)q_,
                                    (const bf16*)k_, (const bf16*)v_, nb, T, Hq, Hkv, D, dc);
        } else {
            launch_bwd_simple<float>(c, (float*)dq_, (float*)dk_, (float*)dv_, (const float*)g_, l, delta,
                                     (const float*)q_, (const float*)k_, (const float*)v_, nb, T, Hq, Hkv, D, dc);
        }
    }
}
