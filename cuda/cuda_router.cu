// cuda_router.cu — the MoE router: softmax over experts (fp32), top-k (descending, ties → lower
// index), renormalised top-k weights, the load-balancing statistics and the z-loss sum; and the
// backward through all three. One warp per token row; lane l holds experts l, l+32, ... (EPL per
// lane, E ≤ 32·EPL ≤ 256). Statistics are summed per block in shared memory, then one atomicAdd
// per block and expert (the counts are integers, so they are exact in any order).
#include <math.h>

#include "cuda_common.cuh"

enum { ROUTER_MAX_E = 256, ROUTER_MAX_K = 16, ROUTER_WARPS = 8 };

// a beats b: larger value, or equal value and lower index. NaN ranks below every number.
__device__ __forceinline__ bool beats(float av, int ai, float bv, int bi) {
    return av > bv || (av == bv && ai < bi);
}

template <int EPL>
__global__ void k_router_fwd(float* probs, int32_t* topk, float* topk_w, float* stats, float* zsum,
                             const float* logits, int N, int E, int k) {
    __shared__ float s_cnt[ROUTER_MAX_E], s_ps[ROUTER_MAX_E], s_z[ROUTER_WARPS];
    for (int e = threadIdx.x; e < E; e += blockDim.x) s_cnt[e] = s_ps[e] = 0.f;
    __syncthreads();
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int n = blockIdx.x * ROUTER_WARPS + w;
    float z = 0.f;
    if (n < N) {
        const float* l = logits + (size_t)n * E;
        float p[EPL];
        float mx = -INFINITY;
#pragma unroll
        for (int q = 0; q < EPL; q++) {
            const int e = lane + 32 * q;
            p[q] = e < E ? l[e] : -INFINITY;
            mx = fmaxf(mx, p[q]);
        }
        mx = warp_max(mx);
        float s = 0.f;
#pragma unroll
        for (int q = 0; q < EPL; q++) s += lane + 32 * q < E ? expf(p[q] - mx) : 0.f;
        s = warp_sum(s);
        const float lse = mx + logf(s);
        z = lse * lse;
#pragma unroll
        for (int q = 0; q < EPL; q++) {
            const int e = lane + 32 * q;
            p[q] = expf(p[q] - lse);
            if (e < E) {
                probs[(size_t)n * E + e] = p[q];
                atomicAdd(&s_ps[e], p[q]);
            }
        }
        // top-k by k rounds of a warp arg-max over the experts not yet taken
        unsigned taken = 0;  // bit q: lane's expert lane + 32q is selected
        float sel_v[ROUTER_MAX_K];
        int sel_i[ROUTER_MAX_K];
        float S = 0.f;
        for (int j = 0; j < k; j++) {
            float bv = -INFINITY;
            int bi = 0x7fffffff;
#pragma unroll
            for (int q = 0; q < EPL; q++) {
                const int e = lane + 32 * q;
                const float v = isnan(p[q]) ? -INFINITY : p[q];
                if (e < E && !(taken >> q & 1) && beats(v, e, bv, bi)) bv = v, bi = e;
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
                const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
                if (beats(ov, oi, bv, bi)) bv = ov, bi = oi;
            }
            if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
            // the selected probability (not the NaN-masked key) from its owner
            float pv = 0.f;
#pragma unroll
            for (int q = 0; q < EPL; q++)
                if (lane + 32 * q == bi) pv = p[q];
            pv = __shfl_sync(0xffffffffu, pv, bi & 31);
            sel_v[j] = pv;
            sel_i[j] = bi;
            S += pv;
        }
        if (lane == 0) {
            for (int j = 0; j < k; j++) {
                topk[(size_t)n * k + j] = sel_i[j];
                topk_w[(size_t)n * k + j] = sel_v[j] / S;
                atomicAdd(&s_cnt[sel_i[j]], 1.f);
            }
        }
    }
    if (lane == 0) s_z[w] = z;
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        if (s_cnt[e] != 0.f) atomicAdd(&stats[e], s_cnt[e]);
        atomicAdd(&stats[E + e], s_ps[e]);
    }
    if (threadIdx.x == 0) {
        float t = 0.f;
        for (int i = 0; i < ROUTER_WARPS; i++) t += s_z[i];
        atomicAdd(zsum, t);
    }
}

void cuda_router_fwd(Backend* be, float* probs, int32_t* topk, float* topk_w, float* stats, float* zsum,
                     const float* logits, int N, int E, int k) {
    // logits, probs [N, E]; topk, topk_w [N, k]; stats [2E] (+=); zsum [1] (+=)
    CHECK(k >= 1 && k <= E, "router_fwd: top_k %d must be in [1, experts %d]", k, E);
    CHECK(E <= ROUTER_MAX_E && k <= ROUTER_MAX_K, "router_fwd: the CUDA router supports up to %d experts and "
          "top_k %d (got %d, %d)", ROUTER_MAX_E, ROUTER_MAX_K, E, k);
    if (N == 0) return;
    CudaImpl* c = CI(be);
    const unsigned g = (unsigned)((N + ROUTER_WARPS - 1) / ROUTER_WARPS);
    const int T = 32 * ROUTER_WARPS;
    if (E <= 32) KLAUNCH(g, T, c->stream, k_router_fwd<1>, probs, topk, topk_w, stats, zsum, logits, N, E, k);
    else if (E <= 64) KLAUNCH(g, T, c->stream, k_router_fwd<2>, probs, topk, topk_w, stats, zsum, logits, N, E, k);
    else if (E <= 128) KLAUNCH(g, T, c->stream, k_router_fwd<4>, probs, topk, topk_w, stats, zsum, logits, N, E, k);
    else KLAUNCH(g, T, c->stream, k_router_fwd<8>, probs, topk, topk_w, stats, zsum, logits, N, E, k);
    LAUNCH_CK(c);
}

// Per row, dL/dlogits from: the top-k weights w_j = softmax over the selected logits,
// dl_{i_j} = w_j (dw_j − Σ_l w_l dw_l); the aux loss dL/dp_e = a_e through the full softmax,
// dl_e = p_e (a_e − Σ_f p_f a_f); the z-loss z_grad · 2 lse · p_e.
template <int EPL>
__global__ void k_router_bwd(float* dlogits, const float* dtopk_w, const float* aux, float z_grad, const float* probs,
                             const int32_t* topk, const float* topk_w, const float* logits, int N, int E, int k) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * ROUTER_WARPS + (threadIdx.x >> 5);
    if (n >= N) return;
    float p[EPL], g[EPL];
    float pa = 0.f;
#pragma unroll
    for (int q = 0; q < EPL; q++) {
        const int e = lane + 32 * q;
        p[q] = e < E ? probs[(size_t)n * E + e] : 0.f;
        if (aux && e < E) pa += p[q] * aux[e];
    }
    if (aux) pa = warp_sum(pa);
    float zc = 0.f;
    if (z_grad != 0.f) {
        const float* l = logits + (size_t)n * E;
        float mx = -INFINITY, s = 0.f;
#pragma unroll
        for (int q = 0; q < EPL; q++)
            if (lane + 32 * q < E) mx = fmaxf(mx, l[lane + 32 * q]);
        mx = warp_max(mx);
#pragma unroll
        for (int q = 0; q < EPL; q++)
            if (lane + 32 * q < E) s += expf(l[lane + 32 * q] - mx);
        s = warp_sum(s);
        zc = 2.f * z_grad * (mx + logf(s));
    }
#pragma unroll
    for (int q = 0; q < EPL; q++) {
        const int e = lane + 32 * q;
        g[q] = zc * p[q];
        if (aux && e < E) g[q] += p[q] * (aux[e] - pa);
    }
    if (dtopk_w) {
        const float* dw = dtopk_w + (size_t)n * k;
        const float* w = topk_w + (size_t)n * k;
        const int32_t* idx = topk + (size_t)n * k;
        float wd = 0.f;
        for (int j = 0; j < k; j++) wd += w[j] * dw[j];
        for (int j = 0; j < k; j++) {
            const int e = idx[j];
            const float add = w[j] * (dw[j] - wd);
#pragma unroll
            for (int q = 0; q < EPL; q++)
                if (lane + 32 * q == e) g[q] += add;
        }
    }
#pragma unroll
    for (int q = 0; q < EPL; q++)
        if (lane + 32 * q < E) dlogits[(size_t)n * E + lane + 32 * q] = g[q];
}

void cuda_router_bwd(Backend* be, float* dlogits, const float* dtopk_w, const float* aux_dprob, float z_grad,
                     const float* probs, const int32_t* topk, const float* topk_w, const float* logits, int N, int E,
                     int k) {
    // dlogits, probs, logits [N, E]; dtopk_w, topk, topk_w [N, k]; aux_dprob [E]
    CHECK(E <= ROUTER_MAX_E, "router_bwd: the CUDA router supports up to %d experts (got %d)", ROUTER_MAX_E, E);
    if (N == 0) return;
    CudaImpl* c = CI(be);
    const unsigned g = (unsigned)((N + ROUTER_WARPS - 1) / ROUTER_WARPS);
    const int T = 32 * ROUTER_WARPS;
#define RB(EPL)                                                                                              \
    KLAUNCH(g, T, c->stream, k_router_bwd<EPL>, dlogits, dtopk_w, aux_dprob, z_grad, probs, topk, topk_w, logits, N, \
            E, k)
    if (E <= 32) RB(1);
    else if (E <= 64) RB(2);
    else if (E <= 128) RB(4);
    else RB(8);
#undef RB
    LAUNCH_CK(c);
}
