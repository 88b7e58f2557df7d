// cuda_attn_fwd_wg.cu — causal GQA attention forward on Hopper warpgroup MMA (wgmma, sm_90a):
// the same contract as the mma.sync kernel in cuda_attn.cu (out[b,t,h,:], lse[b,h,t]; bf16,
// D ∈ {64, 128}), which it replaces when cuda_wgmma_ok.
//
// A CTA is one warpgroup (4 warps, 128 threads) and owns 64 query rows of one (b, h); warp w owns
// rows 16w..16w+15, as in the wgmma accumulator layout. Q stays in shared memory (SW128 tile); K and
// V stream through two stages of 64-key SW128 tiles loaded with cp.async. Per key tile:
//   S = Q·Kᵀ        8 (D/16) wgmma m64n64k16, A and B from shared memory, fp32 in registers
//   softmax         online, in the log2 domain, in registers (as cuda_attn.cu)
//   O += P·V        4 wgmma m64nDk16, A = P packed to bf16 straight from the S registers, B = the V
//                   tile read MN-major (no transpose anywhere)
// The P·V of tile j runs asynchronously while tile j + 1's loads land and its S is issued; the
// stage a P·V reads is refilled only after every warp waited for that P·V (wg_wait, then the block
// barrier). Two CTAs fit an SM (81 KB of shared memory each at D = 128), so one CTA's softmax
// overlaps the other's matrix work. Heavy (late) query tiles are scheduled first.
#include <string.h>

#include "cuda_attn.cuh"
#include "wgmma.cuh"

enum { FW_BR = 64, FW_BC = 64, FW_THREADS = 128 };

template <int D>
__global__ void __launch_bounds__(FW_THREADS) k_attn_fwd_wg(bf16* out, float* lse, const bf16* q, const bf16* k,
                                                             const bf16* v, int T, int Hq, int Hkv, float sl2) {
    constexpr uint32_t TILE = FW_BR * D * 2;  // bytes of one [64][D] bf16 tile
    constexpr int KS = D / 16;
    extern __shared__ unsigned char smem_raw[];
    const uint32_t base = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
    const uint32_t Qs = base, Kb = base + TILE, Vb = base + 3 * TILE;  // K, V: stage s at + s·TILE
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, c4 = lane & 3;
    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, kh = h / (Hq / Hkv);
    const int q0 = qt * FW_BR;
    const size_t qs = (size_t)Hq * D, ks = (size_t)Hkv * D;
    const bf16* qb = q + (size_t)b * T * qs + (size_t)h * D;
    const bf16* kb = k + (size_t)b * T * ks + (size_t)kh * D;
    const bf16* vb = v + (size_t)b * T * ks + (size_t)kh * D;
    const int kt_end = (min(q0 + FW_BR, T) + FW_BC - 1) / FW_BC;

    wg_load_tile<FW_BR, D, FW_THREADS>(Qs, qb, qs, q0, T, tid);
    wg_load_tile<FW_BC, D, FW_THREADS>(Kb, kb, ks, 0, T, tid);
    wg_load_tile<FW_BC, D, FW_THREADS>(Vb, vb, ks, 0, T, tid);
    cp_async_commit();

    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.f;
    wg_reg_fence<D / 2>(o);  // (and the first P·V overwrites: no non-wgmma write of o inside the pipeline)
    float mr[2] = {-INFINITY, -INFINITY}, lr[2] = {0.f, 0.f};
    const int row0 = q0 + w * 16 + g;  // this thread's rows: row0, row0 + 8

    for (int kt = 0; kt < kt_end; kt++) {
        const int k0 = kt * FW_BC, st = kt & 1;
        const uint32_t Ks = Kb + st * TILE, Vs = Vb + st * TILE;
        cp_async_wait<0>();  // tile kt (and Q) landed for this thread's copies
        wg_fence_smem();
        __syncthreads();     // ... and for everyone's

        float s[32];
        wg_arrive();
#pragma unroll
        for (int kk = 0; kk < KS; kk++) wg_ss<64>(s, wg_desc_k(Qs, FW_BR, 0, kk), wg_desc_k(Ks, FW_BC, 0, kk), kk > 0);
        wg_commit();
        wg_reg_fence<32>(s);
        wg_wait<0>();  // S of tile kt, and the P·V of tile kt − 1
        wg_reg_fence<32>(s);
        wg_reg_fence<D / 2>(o);
        __syncthreads();  // every warp's P·V of tile kt − 1 is done: its stage may be refilled
        if (kt + 1 < kt_end) {
            wg_load_tile<FW_BC, D, FW_THREADS>(Kb + (st ^ 1) * TILE, kb, ks, k0 + FW_BC, T, tid);
            wg_load_tile<FW_BC, D, FW_THREADS>(Vb + (st ^ 1) * TILE, vb, ks, k0 + FW_BC, T, tid);
            cp_async_commit();
        }

        // softmax in the log2 domain. The S registers are only read (the next tile's S wgmma reuses
        // them; writing them here would serialize the wgmma pipeline): pass 1 the masked row max,
        // pass 2 P = exp2(x − max), packed to bf16 straight into the A fragments of P·V.
        const bool need_mask = k0 + FW_BC - 1 > q0 + w * 16 || k0 + FW_BC > T;
        float mx[2] = {mr[0], mr[1]};
#pragma unroll
        for (int i = 0; i < 32; i++) {
            float x = s[i] * sl2;
            if (need_mask) {
                const int key = k0 + (i >> 2) * 8 + 2 * c4 + (i & 1), row = row0 + ((i >> 1) & 1) * 8;
                if (key > row || key >= T) x = -INFINITY;
            }
            mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], x);
        }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            corr[r] = fast_exp2(mr[r] - mx[r]);  // key 0 is always visible: mx is finite
            mr[r] = mx[r];
            lr[r] *= corr[r];
        }
        uint32_t a[4][4];  // a[kk]: the A fragment of P's k-step kk (keys 16kk..16kk+15)
#pragma unroll
        for (int i = 0; i < 32; i += 2) {
            float p[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int ii = i + e, r = (ii >> 1) & 1;
                float x = s[ii] * sl2;
                if (need_mask) {
                    const int key = k0 + (ii >> 2) * 8 + 2 * c4 + (ii & 1), row = row0 + r * 8;
                    if (key > row || key >= T) x = -INFINITY;
                }
                p[e] = fast_exp2(x - mr[r]);
                lr[r] += p[e];
            }
            // s[i], s[i+1] (pair i/2 of the accumulator) → register (i/2) % 4 of the fragment of k-step i/8
            a[i >> 3][(i >> 1) & 3] = pack_bf16(p[0], p[1]);
        }
#pragma unroll
        for (int i = 0; i < D / 2; i++) o[i] *= corr[(i >> 1) & 1];

        // O += P·V: V read MN-major from its stage
        wg_reg_fence<D / 2>(o);
        wg_reg_fence_u<16>(&a[0][0]);
        wg_arrive();
#pragma unroll
        for (int kk = 0; kk < FW_BC / 16; kk++) wg_rs<D, 1>(o, a[kk], wg_desc_mn(Vs, FW_BC, kk), kk > 0 || kt > 0);
        wg_commit();
        wg_reg_fence<D / 2>(o);
    }
    wg_wait<0>();
    wg_reg_fence<D / 2>(o);

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
        for (int j = 0; j < D / 8; j++)
            *(uint32_t*)(ob + j * 8 + 2 * c4) = pack_bf16(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
        if (c4 == 0) lse[((size_t)b * Hq + h) * T + row] = (mr[r] + log2f(lr[r])) * LN2;
    }
}

// ---- the pipelined variant (MOETRAIN_ATTN_FWD=pipe) -------------------------------------------
// The same contract and tiles, with the softmax of key tile j overlapped with the P·V of tile
// j − 1 inside the warpgroup (FlashAttention-3's intra-warpgroup pipelining). Iteration j:
//   1. cp.async wait (all but the newest group: K_j and V_{j−1} have landed), fence, block barrier
//   2. issue S_j = Q·K_jᵀ, commit; issue O += P_{j−1}·V_{j−1} (A = the packed P registers of
//      buffer (j − 1) & 1), commit
//   3. start K_{j+1}'s loads into K stage (j + 1) % 3 (last read by S_{j−2}, long retired)
//   4. wait until one group is in flight (S_j has landed; P·V may still run); softmax of S_j into
//      the P registers of buffer j & 1 (never the buffer the running P·V reads)
//   5. wait for the P·V; rescale O by the new max (no wgmma in flight: ordinary writes are safe);
//      block barrier (every warp's P·V is done: V stage (j − 1) & 1 is free); start V_{j+1}'s
//      loads into it
// K has three stages, V two: 16 + 48 + 32 KB at D = 128, two CTAs per SM. Every iteration
// commits exactly two cp.async groups (empty past the last tile), so "all but the newest" is
// always "K_j and everything older". The loop body is a template on the P buffer so that the two
// buffers are distinct registers (ptxas then never sees a wgmma operand rewritten in flight).
template <int D>
struct FwdPipe {
    static constexpr uint32_t TILE = FW_BR * D * 2;
    static constexpr int KS = D / 16;
    uint32_t Qs, Kb, Vb;
    const bf16 *kb, *vb;
    size_t ks;
    int T, tid, q0, row0, w, c4, kt_end;
    float sl2;
    float o[D / 2];
    float mr[2], lr[2];
    uint32_t pa[2][4][4];

    __device__ __forceinline__ void load_k(int j) {
        if (j < kt_end) wg_load_tile<FW_BC, D, FW_THREADS>(Kb + (j % 3) * TILE, kb, ks, j * FW_BC, T, tid);
        cp_async_commit();
    }
    __device__ __forceinline__ void load_v(int j) {
        if (j < kt_end) wg_load_tile<FW_BC, D, FW_THREADS>(Vb + (j & 1) * TILE, vb, ks, j * FW_BC, T, tid);
        cp_async_commit();
    }
    // softmax of S (tile j) into P buffer PB; returns the rescale factors of O in corr
    template <int PB>
    __device__ __forceinline__ void softmax(const float* s, int j, float* corr) {
        const int k0 = j * FW_BC;
        const bool need_mask = k0 + FW_BC - 1 > q0 + w * 16 || k0 + FW_BC > T;
        float mx[2] = {mr[0], mr[1]};
#pragma unroll
        for (int i = 0; i < 32; i++) {
            float x = s[i] * sl2;
            if (need_mask) {
                const int key = k0 + (i >> 2) * 8 + 2 * c4 + (i & 1), row = row0 + ((i >> 1) & 1) * 8;
                if (key > row || key >= T) x = -INFINITY;
            }
            mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], x);
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            corr[r] = fast_exp2(mr[r] - mx[r]);  // key 0 is always visible: mx is finite
            mr[r] = mx[r];
            lr[r] *= corr[r];
        }
#pragma unroll
        for (int i = 0; i < 32; i += 2) {
            float p[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int ii = i + e, r = (ii >> 1) & 1;
                float x = s[ii] * sl2;
                if (need_mask) {
                    const int key = k0 + (ii >> 2) * 8 + 2 * c4 + (ii & 1), row = row0 + r * 8;
                    if (key > row || key >= T) x = -INFINITY;
                }
                p[e] = fast_exp2(x - mr[r]);
                lr[r] += p[e];
            }
            pa[PB][i >> 3][(i >> 1) & 3] = pack_bf16(p[0], p[1]);
        }
    }
    // O += P(buffer PB)·V_j; acc = 0 on the first
    template <int PB>
    __device__ __forceinline__ void pv(int j) {
        const uint32_t Vs = Vb + (j & 1) * TILE;
        wg_reg_fence<D / 2>(o);
        wg_reg_fence_u<16>(&pa[PB][0][0]);
        wg_arrive();
#pragma unroll
        for (int kk = 0; kk < FW_BC / 16; kk++) wg_rs<D, 1>(o, pa[PB][kk], wg_desc_mn(Vs, FW_BC, kk), kk > 0 || j > 0);
        wg_commit();
        wg_reg_fence<D / 2>(o);
    }
    // iteration j ≥ 1: P_{j−1} is in buffer PB ^ 1, S_j's softmax goes to buffer PB
    template <int PB>
    __device__ __forceinline__ void step(int j) {
        cp_async_wait<1>();
        wg_fence_smem();
        __syncthreads();
        float s[32];
        const uint32_t Ks = Kb + (j % 3) * TILE;
        wg_arrive();
#pragma unroll
        for (int kk = 0; kk < KS; kk++) wg_ss<64>(s, wg_desc_k(Qs, FW_BR, 0, kk), wg_desc_k(Ks, FW_BC, 0, kk), kk > 0);
        wg_commit();
        wg_reg_fence<32>(s);
        pv<PB ^ 1>(j - 1);
        load_k(j + 1);
        wg_wait<1>();  // S_j
        wg_reg_fence<32>(s);
        float corr[2];
        softmax<PB>(s, j, corr);
        wg_wait<0>();  // P_{j−1}·V_{j−1}
        wg_reg_fence<D / 2>(o);
#pragma unroll
        for (int i = 0; i < D / 2; i++) o[i] *= corr[(i >> 1) & 1];
        __syncthreads();
        load_v(j + 1);
    }
};

template <int D>
__global__ void __launch_bounds__(FW_THREADS) k_attn_fwd_wgp(bf16* out, float* lse, const bf16* q, const bf16* k,
                                                              const bf16* v, int T, int Hq, int Hkv, float sl2) {
    extern __shared__ unsigned char smem_raw[];
    FwdPipe<D> P;
    constexpr uint32_t TILE = FwdPipe<D>::TILE;
    constexpr int KS = FwdPipe<D>::KS;
    const uint32_t base = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
    P.Qs = base, P.Kb = base + TILE, P.Vb = base + 4 * TILE;  // K: 3 stages, V: 2 stages
    P.tid = threadIdx.x;
    const int lane = P.tid & 31, g = lane >> 2;
    P.w = P.tid >> 5, P.c4 = lane & 3;
    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, kh = h / (Hq / Hkv);
    P.q0 = qt * FW_BR;
    P.T = T, P.sl2 = sl2;
    const size_t qs = (size_t)Hq * D;
    P.ks = (size_t)Hkv * D;
    const bf16* qb = q + (size_t)b * T * qs + (size_t)h * D;
    P.kb = k + (size_t)b * T * P.ks + (size_t)kh * D;
    P.vb = v + (size_t)b * T * P.ks + (size_t)kh * D;
    P.kt_end = (min(P.q0 + FW_BR, T) + FW_BC - 1) / FW_BC;
    P.row0 = P.q0 + P.w * 16 + g;
    P.mr[0] = P.mr[1] = -INFINITY;
    P.lr[0] = P.lr[1] = 0.f;

    wg_load_tile<FW_BR, D, FW_THREADS>(P.Qs, qb, qs, P.q0, T, P.tid);
    P.load_k(0);  // group: Q, K_0
    P.load_v(0);  // group: V_0

    // iteration 0: S_0 and its softmax; no P·V yet (O is first written by P_0·V_0, acc = 0)
    {
        cp_async_wait<1>();
        wg_fence_smem();
        __syncthreads();
        float s[32];
        wg_arrive();
#pragma unroll
        for (int kk = 0; kk < KS; kk++) wg_ss<64>(s, wg_desc_k(P.Qs, FW_BR, 0, kk), wg_desc_k(P.Kb, FW_BC, 0, kk), kk > 0);
        wg_commit();
        wg_reg_fence<32>(s);
        P.load_k(1);
        wg_wait<0>();
        wg_reg_fence<32>(s);
        float corr[2];
        P.template softmax<0>(s, 0, corr);  // corr unused: O holds nothing yet
        P.load_v(1);                        // V stage 1 is untouched so far
    }
    int j = 1;
    for (; j + 1 < P.kt_end; j += 2) {
        P.template step<1>(j);
        P.template step<0>(j + 1);
    }
    if (j < P.kt_end) {
        P.template step<1>(j);
        j++;
    }
    // the last P·V: P_{kt_end−1} is in buffer (kt_end − 1) & 1
    cp_async_wait<0>();
    wg_fence_smem();
    __syncthreads();
    if ((P.kt_end - 1) & 1) P.template pv<1>(P.kt_end - 1);
    else P.template pv<0>(P.kt_end - 1);
    wg_wait<0>();
    wg_reg_fence<D / 2>(P.o);

    const int c4 = P.c4;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        P.lr[r] += __shfl_xor_sync(0xffffffffu, P.lr[r], 1);
        P.lr[r] += __shfl_xor_sync(0xffffffffu, P.lr[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = P.row0 + r * 8;
        if (row >= T) continue;
        const float inv = 1.f / P.lr[r];
        bf16* ob = out + ((size_t)b * T + row) * qs + (size_t)h * D;
#pragma unroll
        for (int jj = 0; jj < D / 8; jj++)
            *(uint32_t*)(ob + jj * 8 + 2 * c4) = pack_bf16(P.o[4 * jj + 2 * r] * inv, P.o[4 * jj + 2 * r + 1] * inv);
        if (c4 == 0) lse[((size_t)b * Hq + h) * T + row] = (P.mr[r] + log2f(P.lr[r])) * LN2;
    }
}

// MOETRAIN_ATTN_FWD=plain|pipe: which wgmma forward (default plain); other values are an error.
static int fwd_pipe(void) {
    static int v = -1;
    if (v < 0) {
        const char* e = getenv("MOETRAIN_ATTN_FWD");
        if (!e || !e[0] || !strcmp(e, "plain")) v = 0;
        else if (!strcmp(e, "pipe")) v = 1;
        else FATAL("MOETRAIN_ATTN_FWD=%s: expected plain or pipe", e);
    }
    return v;
}

template <int D>
static void launch_fwd_wg(CudaImpl* c, bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B,
                          int T, int Hq, int Hkv) {
    const size_t smem = (size_t)5 * FW_BR * D * 2 + 1024;   // Q + 2 × (K, V), + room to align to 1024
    const size_t smem_p = (size_t)6 * FW_BR * D * 2 + 1024;  // Q + 3 × K + 2 × V
    static bool attr = false;                              // per instantiation
    if (!attr) {
        CUDA_CK(cudaFuncSetAttribute(k_attn_fwd_wg<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CUDA_CK(cudaFuncSetAttribute(k_attn_fwd_wgp<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_p));
        attr = true;
    }
    const dim3 grid((T + FW_BR - 1) / FW_BR, Hq, B);
    if (fwd_pipe())
        k_attn_fwd_wgp<D><<<grid, FW_THREADS, smem_p, c->stream>>>(out, lse, q, k, v, T, Hq, Hkv,
                                                                   LOG2E / sqrtf((float)D));
    else
        k_attn_fwd_wg<D><<<grid, FW_THREADS, smem, c->stream>>>(out, lse, q, k, v, T, Hq, Hkv, LOG2E / sqrtf((float)D));
    LAUNCH_CK(c);
}

// Runs the wgmma forward when it applies (cuda_wgmma_ok, D ∈ {64, 128}; the caller checked bf16 and
// alignment); returns 0 otherwise.
int attn_fwd_wg(CudaImpl* c, bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T,
                int Hq, int Hkv, int D) {
    if (!cuda_wgmma_ok(c)) return 0;
    if (D == 128) launch_fwd_wg<128>(c, out, lse, q, k, v, B, T, Hq, Hkv);
    else if (D == 64) launch_fwd_wg<64>(c, out, lse, q, k, v, B, T, Hq, Hkv);
    else return 0;
    return 1;
}
