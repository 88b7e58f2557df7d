// cuda_attn_fwd_wg.cu — causal GQA attention forward on Hopper warpgroup MMA (wgmma, sm_90a):
// the same contract as the mma.sync kernel in cuda_attn.cu (out[b,t,h,:], lse[b,h,t]; bf16), which
// it replaces at D = 64 when cuda_wgmma_ok. At D = 128 the warp-specialised kernel of
// cuda_attn_fwd_ws.cu runs instead (this kernel is written for D ∈ {64, 128}).
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
#include "attn_wg.cuh"

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
        wg_store_row<D>(out + ((size_t)b * T + row) * qs + (size_t)h * D, o, r, c4, inv);
        if (c4 == 0) lse[((size_t)b * Hq + h) * T + row] = (mr[r] + log2f(lr[r])) * LN2;
    }
}

template <int D>
static void launch_fwd_wg(CudaImpl* c, bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B,
                          int T, int Hq, int Hkv) {
    const size_t smem = (size_t)5 * FW_BR * D * 2 + 1024;  // Q + 2 × (K, V), + room to align to 1024
    static bool attr = false;                             // per instantiation
    if (!attr) {
        CUDA_CK(cudaFuncSetAttribute(k_attn_fwd_wg<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr = true;
    }
    const dim3 grid((T + FW_BR - 1) / FW_BR, Hq, B);
    k_attn_fwd_wg<D><<<grid, FW_THREADS, smem, c->stream>>>(out, lse, q, k, v, T, Hq, Hkv, LOG2E / sqrtf((float)D));
    LAUNCH_CK(c);
}

// cuda_attn_fwd_ws.cu: the warp-specialised kernel (D = 128), or 0 when it does not apply.
int attn_fwd_ws(CudaImpl* c, bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T,
                int Hq, int Hkv, int D, const int32_t* doc);

// Runs a wgmma forward when one applies (cuda_wgmma_ok; the caller checked bf16 and alignment): the
// warp-specialised kernel at D = 128, this one at D = 64; returns 0 otherwise (then the caller runs
// the mma.sync kernel). With packed documents (doc) only the warp-specialised kernel applies.
int attn_fwd_wg(CudaImpl* c, bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T,
                int Hq, int Hkv, int D, const int32_t* doc) {
    if (!cuda_wgmma_ok(c)) return 0;
    if (D == 128) return attn_fwd_ws(c, out, lse, q, k, v, B, T, Hq, Hkv, D, doc);
    if (D != 64 || doc) return 0;
    launch_fwd_wg<64>(c, out, lse, q, k, v, B, T, Hq, Hkv);
    return 1;
}
