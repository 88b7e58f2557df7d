// cuda_attn.cu — causal GQA attention forward: out[b,t,h,:] = Σ_{s≤t} softmax_s(q·k_s/√D) v_s
// with kv head h / (Hq/Hkv), and lse[b,h,t] = log Σ_{s≤t} exp(q·k_s/√D). No T×T buffer.
//
// bf16, D ∈ {16, 32, 64, 128}: a flash-attention-2 kernel on tensor cores. A block takes 64
// query rows of one (b, h) (4 warps × 16 rows; the Q fragments stay in registers) and walks the
// 64-key tiles up to the diagonal: S = Q·Kᵀ (mma.sync m16n8k16, fp32 accumulate), online softmax
// in the log2 domain in registers, P packed to bf16 straight into the A fragments of O += P·V.
// Heavy (late) query tiles are scheduled first. Packed documents (doc): a query tile starts at
// the key tile holding its first row's document start, and keys before a row's start are masked
// too (a row may see nothing of a tile: its max stays −inf, its exponentials go against 0). On
// Hopper (sm_90a build) D = 64 and 128 take the wgmma kernels instead (cuda_attn_fwd_wg.cu;
// gpu.attention = mma keeps this one). fp32 act, or other head dims: a simple kernel,
// one warp per query row, fp32 math, same online softmax — correct, not fast.
#include "cuda_attn.cuh"

enum { FA_BR = 64, FA_BC = 64, FA_WARPS = 4, FA_THREADS = 32 * FA_WARPS };

// DOCS: doc is given (packed documents); DOCS = false compiles to plain causal attention's code.
template <int D, bool DOCS>
__global__ void __launch_bounds__(FA_THREADS) k_attn_fwd_tc(bf16* out, float* lse, const bf16* q, const bf16* k,
                                                             const bf16* v, int T, int Hq, int Hkv, float sl2,
                                                             const int32_t* doc) {
    constexpr int LD = D + ATTN_PAD, KS = D / 16, NT = FA_BC / 8, DT = D / 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* Qs = (bf16*)smem_raw;      // [FA_BR][LD]
    bf16* Kb = Qs + FA_BR * LD;      // 2 × [FA_BC][LD]: tile kt in buffer kt & 1
    bf16* Vb = Kb + 2 * FA_BC * LD;  // 2 × [FA_BC][LD]
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, c4 = lane & 3;
    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, kh = h / (Hq / Hkv);
    const int q0 = qt * FA_BR;
    const size_t qs = (size_t)Hq * D, ks = (size_t)Hkv * D;
    const bf16* qb = q + (size_t)b * T * qs + (size_t)h * D;
    const bf16* kb = k + (size_t)b * T * ks + (size_t)kh * D;
    const bf16* vb = v + (size_t)b * T * ks + (size_t)kh * D;

    load_tile<FA_BR, D, FA_THREADS>(Qs, qb, qs, q0, T);
    __syncthreads();
    uint32_t qf[KS][4];
#pragma unroll
    for (int kk = 0; kk < KS; kk++) frag_a(qf[kk], Qs, LD, w * 16, kk * 16, lane);

    float o[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float mr[2] = {-INFINITY, -INFINITY}, lr[2] = {0.f, 0.f};
    const int row0 = q0 + w * 16 + g;  // this thread's rows: row0, row0 + 8
    const int kt_end = (min(q0 + FA_BR, T) + FA_BC - 1) / FA_BC;
    // packed documents: the rows' starts (0 without), the warp's last row's, the first key tile
    const int32_t* docb = DOCS ? doc + (size_t)b * T : nullptr;
    const int dsr[2] = {DOCS ? (int)docb[min(row0, T - 1)] : 0, DOCS ? (int)docb[min(row0 + 8, T - 1)] : 0};
    const int dlast = DOCS ? (int)docb[min(q0 + w * 16 + 15, T - 1)] : 0;
    const int kt0 = DOCS ? (int)docb[q0] / FA_BC : 0;

    // K/V tiles are double-buffered: tile kt + 1 is in flight (cp.async) while tile kt computes
    // (buffer (kt − kt0) & 1).
    load_tile_async<FA_BC, D, FA_THREADS>(Kb, kb, ks, kt0 * FA_BC, T);
    load_tile_async<FA_BC, D, FA_THREADS>(Vb, vb, ks, kt0 * FA_BC, T);
    cp_async_commit();
    for (int kt = kt0; kt < kt_end; kt++) {
        const int k0 = kt * FA_BC;
        if (kt + 1 < kt_end) {
            const int nb = (kt + 1 - kt0) & 1;
            load_tile_async<FA_BC, D, FA_THREADS>(Kb + nb * FA_BC * LD, kb, ks, k0 + FA_BC, T);
            load_tile_async<FA_BC, D, FA_THREADS>(Vb + nb * FA_BC * LD, vb, ks, k0 + FA_BC, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // tile kt has landed for every thread
        const bf16* Ks = Kb + ((kt - kt0) & 1) * FA_BC * LD;
        const bf16* Vs = Vb + ((kt - kt0) & 1) * FA_BC * LD;

        float s[NT][4];
#pragma unroll
        for (int i = 0; i < NT; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t bf[4];
                frag_b_nk(bf, Ks, LD, np * 16, kk * 16, lane);
                mma_bf16(s[2 * np], qf[kk], bf);
                mma_bf16(s[2 * np + 1], qf[kk], bf + 2);
            }

        // scale to log2 units, mask (causal and the tail past T), row max
        const bool need_mask = k0 + FA_BC - 1 > q0 + w * 16 || k0 + FA_BC > T || (DOCS && k0 < dlast);
        float mx[2] = {mr[0], mr[1]};
#pragma unroll
        for (int i = 0; i < NT; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = s[i][e] * sl2;
                if (need_mask) {
                    const int key = k0 + i * 8 + 2 * c4 + (e & 1), row = row0 + (e >> 1) * 8;
                    if (key > row || key >= T || (DOCS && key < dsr[e >> 1])) x = -INFINITY;
                }
                s[i][e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
        float corr[2], mu[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            // mu: what the exponentials go against, 0 while the row has seen only keys before its
            // document (mx = −inf); without documents mx itself, spelt as plain causal attention has it
            mu[r] = DOCS && mx[r] == -INFINITY ? 0.f : mx[r];
            corr[r] = fast_exp2(mr[r] - (DOCS ? mu[r] : mx[r]));
            mr[r] = mx[r];
            lr[r] *= corr[r];
        }
#pragma unroll
        for (int i = 0; i < NT; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = fast_exp2(s[i][e] - (DOCS ? mu[e >> 1] : mr[e >> 1]));
                s[i][e] = p;
                lr[e >> 1] += p;
            }
#pragma unroll
        for (int i = 0; i < DT; i++) {
            o[i][0] *= corr[0];
            o[i][1] *= corr[0];
            o[i][2] *= corr[1];
            o[i][3] *= corr[1];
        }
        // O += P·V
#pragma unroll
        for (int kk = 0; kk < FA_BC / 16; kk++) {
            uint32_t a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                             pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dp = 0; dp < DT / 2; dp++) {
                uint32_t bf[4];
                frag_b_kn(bf, Vs, LD, kk * 16, dp * 16, lane);
                mma_bf16(o[2 * dp], a, bf);
                mma_bf16(o[2 * dp + 1], a, bf + 2);
            }
        }
        __syncthreads();  // every warp is done with buffer kt & 1 before iteration kt + 1 refills it
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        lr[r] += __shfl_xor_sync(0xffffffffu, lr[r], 1);
        lr[r] += __shfl_xor_sync(0xffffffffu, lr[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + r * 8;
        if (row >= T) continue;
        const float inv = 1.f / lr[r];
        bf16* ob = out + ((size_t)b * T + row) * qs + (size_t)h * D;
#pragma unroll
        for (int i = 0; i < DT; i++)
            *(uint32_t*)(ob + i * 8 + 2 * c4) = pack_bf16(o[i][2 * r] * inv, o[i][2 * r + 1] * inv);
        if (c4 == 0) lse[((size_t)b * Hq + h) * T + row] = (mr[r] + log2f(lr[r])) * LN2;
    }
}

template <int D>
static void launch_fwd_tc(CudaImpl* c, bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B,
                          int T, int Hq, int Hkv, const int32_t* doc) {
    const size_t smem = (size_t)(FA_BR + 4 * FA_BC) * (D + ATTN_PAD) * sizeof(bf16);
    static bool attr = false;  // per instantiation
    if (!attr) {
        CUDA_CK(cudaFuncSetAttribute(k_attn_fwd_tc<D, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)smem));
        CUDA_CK(cudaFuncSetAttribute(k_attn_fwd_tc<D, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr = true;
    }
    const dim3 grid((T + FA_BR - 1) / FA_BR, Hq, B);
    const float sl2 = LOG2E / sqrtf((float)D);
    if (doc) k_attn_fwd_tc<D, true><<<grid, FA_THREADS, smem, c->stream>>>(out, lse, q, k, v, T, Hq, Hkv, sl2, doc);
    else k_attn_fwd_tc<D, false><<<grid, FA_THREADS, smem, c->stream>>>(out, lse, q, k, v, T, Hq, Hkv, sl2, doc);
    LAUNCH_CK(c);
}

// cuda_attn_fwd_wg.cu: the wgmma kernel (sm_90a), or 0 when it does not apply.
int attn_fwd_wg(CudaImpl* c, bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T,
                int Hq, int Hkv, int D, const int32_t* doc);

// ---- simple kernel: one warp per query row ---------------------------------------------------

// Lane l holds dims l, l+32, ... (DPL per lane, D ≤ 32·DPL).
template <typename T, int DPL>
__global__ void k_attn_fwd_simple(T* out, float* lse, const T* q, const T* k, const T* v, int B, int T_, int Hq,
                                  int Hkv, int D, float scale, const int32_t* doc) {
    const int lane = threadIdx.x & 31;
    const size_t row = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;  // over (b, h, t)
    if (row >= (size_t)B * Hq * T_) return;
    const int t = (int)(row % T_), h = (int)(row / T_ % Hq), b = (int)(row / T_ / Hq), kh = h / (Hq / Hkv);
    const T* qr = q + (((size_t)b * T_ + t) * Hq + h) * D;
    float qv[DPL], acc[DPL];
#pragma unroll
    for (int j = 0; j < DPL; j++) {
        const int d = lane + 32 * j;
        qv[j] = d < D ? to_f(qr[d]) : 0.f;
        acc[j] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int s = doc ? doc[(size_t)b * T_ + t] : 0; s <= t; s++) {
        const size_t kv = (((size_t)b * T_ + s) * Hkv + kh) * D;
        float dot = 0.f;
#pragma unroll
        for (int j = 0; j < DPL; j++)
            if (lane + 32 * j < D) dot += qv[j] * to_f(k[kv + lane + 32 * j]);
        const float x = warp_sum(dot) * scale;
        const float mn = fmaxf(m, x), corr = expf(m - mn), p = expf(x - mn);
        l = l * corr + p;
#pragma unroll
        for (int j = 0; j < DPL; j++)
            acc[j] = acc[j] * corr + (lane + 32 * j < D ? p * to_f(v[kv + lane + 32 * j]) : 0.f);
        m = mn;
    }
    T* o = out + (((size_t)b * T_ + t) * Hq + h) * D;
#pragma unroll
    for (int j = 0; j < DPL; j++)
        if (lane + 32 * j < D) o[lane + 32 * j] = from_f<T>(acc[j] / l);
    if (lane == 0) lse[((size_t)b * Hq + h) * T_ + t] = m + logf(l);
}

template <typename T>
static void launch_fwd_simple(CudaImpl* c, T* out, float* lse, const T* q, const T* k, const T* v, int B, int T_,
                              int Hq, int Hkv, int D, const int32_t* doc) {
    const size_t rows = (size_t)B * Hq * T_;
    const unsigned grid = (unsigned)((rows * 32 + 127) / 128);
    const float sc = 1.0f / sqrtf((float)D);
#define SF(DPL) k_attn_fwd_simple<T, DPL><<<grid, 128, 0, c->stream>>>(out, lse, q, k, v, B, T_, Hq, Hkv, D, sc, doc)
    if (D <= 32) SF(1);
    else if (D <= 64) SF(2);
    else if (D <= 128) SF(4);
    else SF(8);
#undef SF
    LAUNCH_CK(c);
}

void attn_check(const char* op, int Hq, int Hkv, int D) {
    CHECK(Hkv > 0 && Hq % Hkv == 0, "%s: query heads %d must be a multiple of kv heads %d", op, Hq, Hkv);
    CHECK(D > 0 && D <= 256, "%s: the CUDA backend supports head dims 1..256 (got %d)", op, D);
}

// The wgmma kernels run where they can (an sm_90a build on compute capability 9) unless
// gpu.attention = mma.
int cuda_wgmma_ok(CudaImpl* c) {
#if defined(MOETRAIN_SM90A)
    return c->opt.attention == GPU_ATTN_AUTO && c->cc_major == 9;
#else
    (void)c;
    return 0;
#endif
}

int attn_tc_ok(Backend* be, int D, const void* const* ptrs, int np) {
    if (!is_bf16(be) || !(D == 16 || D == 32 || D == 64 || D == 128)) return 0;
    for (int i = 0; i < np; i++)
        if ((uintptr_t)ptrs[i] % 16) return 0;
    return 1;
}

void cuda_attn_fwd(Backend* be, void* out, float* lse, const void* q, const void* k, const void* v, int B, int T,
                   int Hq, int Hkv, int D, const int32_t* doc) {
    // q, out [B, T, Hq, D]; k, v [B, T, Hkv, D]; lse [B, Hq, T]; doc [B·T] or NULL
    attn_check("attn_fwd", Hq, Hkv, D);
    if (B == 0 || T == 0) return;
    CudaImpl* c = CI(be);
    const void* ptrs[4] = {out, q, k, v};
    // packed documents (doc): the tensor-core kernels skip the key tiles no row of a query tile sees
    // (at D = 64 on Hopper the mma.sync kernel runs: the one-warpgroup kernel takes no documents);
    // the simple kernel walks the visible keys
    const int tc = attn_tc_ok(be, D, ptrs, 4);
    if (tc && attn_fwd_wg(c, (bf16*)out, lse, (const bf16*)q, (const bf16*)k, (const bf16*)v, B, T, Hq, Hkv, D, doc))
        return;  // Hopper: cuda_attn_fwd_wg.cu
    if (tc) {
        bf16 *o = (bf16*)out;
        const bf16 *qq = (const bf16*)q, *kk = (const bf16*)k, *vv = (const bf16*)v;
        switch (D) {
            case 16: launch_fwd_tc<16>(c, o, lse, qq, kk, vv, B, T, Hq, Hkv, doc); break;
            case 32: launch_fwd_tc<32>(c, o, lse, qq, kk, vv, B, T, Hq, Hkv, doc); break;
            case 64: launch_fwd_tc<64>(c, o, lse, qq, kk, vv, B, T, Hq, Hkv, doc); break;
            default: launch_fwd_tc<128>(c, o, lse, qq, kk, vv, B, T, Hq, Hkv, doc); break;
        }
    } else if (is_bf16(be)) {
        launch_fwd_simple<bf16>(c, (bf16*)out, lse, (const bf16*)q, (const bf16*)k, (const bf16*)v, B, T, Hq, Hkv, D, doc);
    } else {
        launch_fwd_simple<float>(c, (float*)out, lse, (const float*)q, (const float*)k, (const float*)v, B, T, Hq,
                                 Hkv, D, doc);
    }
}
