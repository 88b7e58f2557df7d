// cuda_loss.cu — cross-entropy over rows of logits [n, V] (act dtype) with targets (< 0 =
// ignored): loss[0] += Σ_rows −log softmax(row)[target]; if grad_scale != 0 the logits are
// overwritten by (softmax − onehot) · grad_scale (ignored rows → 0).
//
// One block per row: each thread keeps an online (max, sum) over its strided elements, the block
// combines them (fp32, fixed order), a second pass writes the gradient in place. In bf16 with
// V % 8 == 0 (and V ≤ 32768) the row is instead read once into registers (k_ce_rows_v; at 8
// chunks per thread, V > 28,672 such as Mixtral's 32,000, kept packed: k_ce_rows_p). Row losses go to
// scratch and one block adds them in row order (double), so the loss is the same on every run.
#include <stdio.h>

#include "cuda_common.cuh"

enum { CE_THREADS = 512 };

template <typename T>
__global__ void __launch_bounds__(CE_THREADS) k_ce_rows(T* logits, float* rowloss, const int32_t* tgt, int V,
                                                        float gs) {
    __shared__ float sh[32];
    const size_t r = blockIdx.x;
    T* x = logits + r * V;
    const int t = tgt[r];
    if (t < 0) {  // ignored row
        if (gs != 0.f)
            for (int j = threadIdx.x; j < V; j += blockDim.x) x[j] = from_f<T>(0.f);
        if (threadIdx.x == 0) rowloss[r] = 0.f;
        return;
    }
    if (t >= V) {
        if (threadIdx.x == 0) printf("cross_entropy: target %d at row %d is outside the vocabulary [0, %d)\n", t, (int)r, V);
        __trap();
    }
    float m = -INFINITY, s = 0.f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        const float v = to_f(x[j]);
        if (v > m) {
            s = s * expf(m - v) + 1.f;  // expf(−inf) = 0 on the first element
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    const float M = block_max(m, sh);
    s = m == -INFINITY ? 0.f : s * expf(m - M);
    const float S = block_sum(s, sh);
    const float lse = M + logf(S);
    if (threadIdx.x == 0) rowloss[r] = lse - to_f(x[t]);
    __syncthreads();  // x[t] is read before any thread overwrites it
    if (gs != 0.f)
        for (int j = threadIdx.x; j < V; j += blockDim.x)
            x[j] = from_f<T>((expf(to_f(x[j]) - lse) - (j == t ? 1.f : 0.f)) * gs);
}

// The 16-byte-chunk kernels' row prologue: an ignored row (t < 0) gets a zero gradient and loss
// and returns 1; a target outside [0, V) traps (a caller error, as the CPU backend aborts).
__device__ __forceinline__ bool ce_row_skip(uint4* x, float* rowloss, size_t r, int t, int V, float gs) {
    if (t < 0) {
        if (gs != 0.f)
            for (int j = threadIdx.x; j < V / 8; j += blockDim.x) x[j] = make_uint4(0, 0, 0, 0);
        if (threadIdx.x == 0) rowloss[r] = 0.f;
        return true;
    }
    if (t >= V) {
        if (threadIdx.x == 0) printf("cross_entropy: target %d at row %d is outside the vocabulary [0, %d)\n", t, (int)r, V);
        __trap();
    }
    return false;
}

// bf16, V % 8 == 0, 16-byte aligned rows of at most 8·CE_THREADS·NV values: the row is read once,
// in 16-byte chunks (thread t owns chunks t, t + CE_THREADS, ...), and stays in registers between
// the reductions and the gradient write. p = e^(x − max) is computed once and serves both the sum
// and the gradient (p / S − onehot) · gs.
template <int NV>
__global__ void __launch_bounds__(CE_THREADS) k_ce_rows_v(bf16* logits, float* rowloss, const int32_t* tgt, int V,
                                                          float gs) {
    __shared__ float sh[32];
    const size_t r = blockIdx.x;
    uint4* x = (uint4*)(logits + r * V);
    const int t = tgt[r], C = V / 8;
    if (ce_row_skip(x, rowloss, r, t, V, gs)) return;
    const float xt = threadIdx.x == 0 ? __bfloat162float(logits[r * V + t]) : 0.f;  // before any write
    float v[NV][8];
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int c = threadIdx.x + i * CE_THREADS;
        if (c < C) {
            unpack8(v[i], x[c]);
#pragma unroll
            for (int e = 0; e < 8; e++) m = fmaxf(m, v[i][e]);
        }
    }
    const float M = block_max(m, sh);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int c = threadIdx.x + i * CE_THREADS;
        if (c < C) {
#pragma unroll
            for (int e = 0; e < 8; e++) {
                v[i][e] = expf(v[i][e] - M);
                s += v[i][e];
            }
        }
    }
    const float S = block_sum(s, sh);
    if (threadIdx.x == 0) rowloss[r] = M + logf(S) - xt;
    if (gs == 0.f) return;
    const float inv = gs / S;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int c = threadIdx.x + i * CE_THREADS;
        if (c >= C) continue;
        float g[8];
#pragma unroll
        for (int e = 0; e < 8; e++) g[e] = v[i][e] * inv - (8 * c + e == t ? gs : 0.f);
        x[c] = pack8(g);
    }
}

// The same row at 8 chunks per thread (V > 28,672, e.g. Mixtral's 32,000), lighter on registers
// so that two blocks share an SM: the chunks stay packed bf16 (4 registers each, 56 in all) and
// e^(x − max) is taken twice — for the sum, then for the gradient — as 2^(x·log2e − max·log2e) in
// one FFMA and one MUFU.EX2 (fast_exp2) each. k_ce_rows_v<8> held 8 fp32 per chunk (100
// registers, one 512-thread block per SM: 2 TB/s on the H200); this form was faster in the step.
template <int NV>
__global__ void __launch_bounds__(CE_THREADS, 2) k_ce_rows_p(bf16* logits, float* rowloss, const int32_t* tgt, int V,
                                                             float gs) {
    __shared__ float sh[32];
    const size_t r = blockIdx.x;
    uint4* x = (uint4*)(logits + r * V);
    const int t = tgt[r], C = V / 8;
    if (ce_row_skip(x, rowloss, r, t, V, gs)) return;
    const float xt = threadIdx.x == 0 ? __bfloat162float(logits[r * V + t]) : 0.f;  // before any write
    uint4 raw[NV];
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int c = threadIdx.x + i * CE_THREADS;
        if (c < C) {
            raw[i] = x[c];
            float v[8];
            unpack8(v, raw[i]);
#pragma unroll
            for (int e = 0; e < 8; e++) m = fmaxf(m, v[e]);
        }
    }
    const float M = block_max(m, sh), ML = M * LOG2E;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int c = threadIdx.x + i * CE_THREADS;
        if (c < C) {
            float v[8];
            unpack8(v, raw[i]);
#pragma unroll
            for (int e = 0; e < 8; e++) s += fast_exp2(fmaf(v[e], LOG2E, -ML));
        }
    }
    const float S = block_sum(s, sh);
    if (threadIdx.x == 0) rowloss[r] = M + logf(S) - xt;
    if (gs == 0.f) return;
    const float inv = gs / S;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int c = threadIdx.x + i * CE_THREADS;
        if (c >= C) continue;
        float v[8];
        unpack8(v, raw[i]);
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = fast_exp2(fmaf(v[e], LOG2E, -ML)) * inv - (8 * c + e == t ? gs : 0.f);
        x[c] = pack8(v);
    }
}

__global__ void k_ce_sum(float* loss, const float* rowloss, int n) {
    __shared__ double sh[256];
    double s = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += rowloss[i];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) loss[0] = (float)((double)loss[0] + sh[0]);
}

void cuda_cross_entropy(Backend* be, void* logits, float* loss, const int32_t* targets, int n, int V,
                        float grad_scale) {
    // logits [n, V] act (overwritten by the gradient when grad_scale != 0); targets [n]; loss [1] (+=)
    if (n == 0) return;
    CudaImpl* c = CI(be);
    CHECK((size_t)n * sizeof(float) <= c->scratch_bytes, "cross_entropy: %d rows exceed the scratch buffer", n);
    float* rowloss = (float*)c->scratch;  // [n]
    const int chunks = (V / 8 + CE_THREADS - 1) / CE_THREADS;  // per thread, in the vectorized kernel
    const int nv = !is_bf16(be) || V % 8 || (uintptr_t)logits % 16 ? 0 : chunks <= 1 ? 1 : chunks <= 2 ? 2
                 : chunks <= 4 ? 4 : chunks <= 8 ? 8 : 0;
    if (nv == 1) KLAUNCH(n, CE_THREADS, c->stream, k_ce_rows_v<1>, (bf16*)logits, rowloss, targets, V, grad_scale);
    else if (nv == 2) KLAUNCH(n, CE_THREADS, c->stream, k_ce_rows_v<2>, (bf16*)logits, rowloss, targets, V, grad_scale);
    else if (nv == 4) KLAUNCH(n, CE_THREADS, c->stream, k_ce_rows_v<4>, (bf16*)logits, rowloss, targets, V, grad_scale);
    else if (nv == 8) KLAUNCH(n, CE_THREADS, c->stream, k_ce_rows_p<8>, (bf16*)logits, rowloss, targets, V, grad_scale);
    else if (is_bf16(be))
        KLAUNCH(n, CE_THREADS, c->stream, k_ce_rows<bf16>, (bf16*)logits, rowloss, targets, V, grad_scale);
    else
        KLAUNCH(n, CE_THREADS, c->stream, k_ce_rows<float>, (float*)logits, rowloss, targets, V, grad_scale);
    LAUNCH_CK(c);
    KLAUNCH(1, 256, c->stream, k_ce_sum, loss, rowloss, n);
    LAUNCH_CK(c);
}
