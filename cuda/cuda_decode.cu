// cuda_decode.cu — the decode ops of backend.h (generate): RoPE at explicit positions, the KV-cache
// append, and attention of a few new rows per sequence against the cache.
//
// rope_qkv_at: one block per new row (b, i) at position pos[b] + i; its D/2 cos/sin computed in
// double and rounded once (cuda_rope.cu's rope_table arithmetic), then every head of the row.
// kv_append: a grid-stride copy into the cache [B, Hkv, Tmax, D].
// attn_decode (flash-decoding within a block): one block of DEC_WARPS warps per query row
// (b, i, h); warp w takes cache positions s ≡ w (mod DEC_WARPS) up to the row's position and keeps
// its own running max, sum and output (lane j holds dims j, j + 32, ...: D ≤ 256 → 8 per lane);
// the warps' partial results are then merged in warp order. A batch-1 step over a long cache
// thus spreads each head's keys over DEC_WARPS warps. Scores and sums in fp32.
#include "cuda_common.cuh"

enum { DEC_MAX_D = 256, DEC_WARPS = 8, DEC_PER_LANE = DEC_MAX_D / 32 };

template <typename T>
__global__ void k_rope_qkv_at(const T* qkv, T* q, T* k, T* v, const int32_t* pos, int n, int Hq, int Hkv, int D,
                              double log_theta) {
    __shared__ float cs[DEC_MAX_D * 2], sn[DEC_MAX_D * 2];
    const size_t r = blockIdx.x;
    const int b = (int)(r / (size_t)n), i = (int)(r % (size_t)n), t = pos[b] + i, half = D / 2;
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        const double inv_freq = exp(-2.0 * j / D * log_theta);
        double s, c;
        sincos((double)t * inv_freq, &s, &c);
        cs[j] = (float)c;
        sn[j] = (float)s;
    }
    __syncthreads();
    const T* src = qkv + r * (size_t)(Hq + 2 * Hkv) * D;
    const int nh = Hq + Hkv;
    for (int p = threadIdx.x; p < nh * half; p += blockDim.x) {
        const int h = p / half, j = p % half;
        const T* x = src + (size_t)h * D;
        T* y = h < Hq ? q + (r * Hq + h) * D : k + (r * Hkv + (h - Hq)) * D;
        const float x1 = to_f(x[j]), x2 = to_f(x[j + half]);
        y[j] = from_f<T>(x1 * cs[j] - x2 * sn[j]);
        y[j + half] = from_f<T>(x2 * cs[j] + x1 * sn[j]);
    }
    for (int p = threadIdx.x; p < Hkv * D; p += blockDim.x) v[r * Hkv * D + p] = src[(size_t)(Hq + Hkv) * D + p];
}

template <typename T>
__global__ void k_kv_append(T* kc, T* vc, const T* k, const T* v, const int32_t* pos, int B, int n, int Hkv, int D,
                            int Tmax) {
    const size_t total = (size_t)B * n * Hkv * D;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const int d = (int)(e % D);
        const size_t rh = e / D;
        const int h = (int)(rh % Hkv);
        const size_t r = rh / Hkv;
        const int b = (int)(r / n), i = (int)(r % n), p = pos[b] + i;
        if (p >= Tmax) continue;
        const size_t dst = (((size_t)b * Hkv + h) * Tmax + p) * D + d;
        kc[dst] = k[e];
        vc[dst] = v[e];
    }
}

template <typename T>
__global__ void __launch_bounds__(DEC_WARPS * 32)
    k_attn_decode(T* out, const T* q, const T* kc, const T* vc, const int32_t* pos, int n, int Hq, int Hkv, int D,
                  int Tmax, float scale) {
    __shared__ float s_m[DEC_WARPS], s_l[DEC_WARPS], s_acc[DEC_WARPS][DEC_MAX_D];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const size_t row = blockIdx.x;  // (b·n + i)·Hq + h
    const int h = (int)(row % Hq);
    const size_t bi = row / Hq;
    const int b = (int)(bi / n), i = (int)(bi % n), t = pos[b] + i, kh = h / (Hq / Hkv);
    const T* qr = q + row * D;
    const T* kb = kc + ((size_t)b * Hkv + kh) * Tmax * D;
    const T* vb = vc + ((size_t)b * Hkv + kh) * Tmax * D;
    float qv[DEC_PER_LANE], acc[DEC_PER_LANE];
#pragma unroll
    for (int j = 0; j < DEC_PER_LANE; j++) {
        const int d = lane + 32 * j;
        qv[j] = d < D ? to_f(qr[d]) * scale : 0.f;
        acc[j] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int s = w; s <= t; s += DEC_WARPS) {
        const T* kr = kb + (size_t)s * D;
        float part = 0.f;
#pragma unroll
        for (int j = 0; j < DEC_PER_LANE; j++) {
            const int d = lane + 32 * j;
            if (d < D) part += qv[j] * to_f(kr[d]);
        }
        const float sc = warp_sum(part);
        const float mn = fmaxf(m, sc);
        const float corr = expf(m - mn), p = expf(sc - mn);  // m = −inf at first: corr = 0
        l = l * corr + p;
        const T* vr = vb + (size_t)s * D;
#pragma unroll
        for (int j = 0; j < DEC_PER_LANE; j++) {
            const int d = lane + 32 * j;
            if (d < D) acc[j] = acc[j] * corr + p * to_f(vr[d]);
        }
        m = mn;
    }
    if (lane == 0) s_m[w] = m, s_l[w] = l;
#pragma unroll
    for (int j = 0; j < DEC_PER_LANE; j++) {
        const int d = lane + 32 * j;
        if (d < D) s_acc[w][d] = acc[j];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int x = 0; x < DEC_WARPS; x++) M = fmaxf(M, s_m[x]);
    float L = 0.f;
    for (int x = 0; x < DEC_WARPS; x++) L += s_m[x] == -INFINITY ? 0.f : s_l[x] * expf(s_m[x] - M);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float o = 0.f;
        for (int x = 0; x < DEC_WARPS; x++)
            if (s_m[x] != -INFINITY) o += s_acc[x][d] * expf(s_m[x] - M);
        out[row * D + d] = from_f<T>(o / L);
    }
}

void cuda_rope_qkv_at(Backend* be, void* qkv, void* q, void* k, void* v, const int32_t* pos, int B, int n, int Hq,
                      int Hkv, int D, float theta) {
    CHECK(D % 2 == 0 && D <= 2 * DEC_MAX_D, "rope_qkv_at: head dim %d must be even and at most %d", D, 2 * DEC_MAX_D);
    CHECK(Hq > 0 && Hkv >= 0, "rope_qkv_at: %d query heads, %d kv heads", Hq, Hkv);
    if (B == 0 || n == 0) return;
    CudaImpl* c = CI(be);
    const double lt = log((double)theta);
    if (is_bf16(be))
        k_rope_qkv_at<bf16><<<B * n, 256, 0, c->stream>>>((const bf16*)qkv, (bf16*)q, (bf16*)k, (bf16*)v, pos, n, Hq,
                                                          Hkv, D, lt);
    else
        k_rope_qkv_at<float><<<B * n, 256, 0, c->stream>>>((const float*)qkv, (float*)q, (float*)k, (float*)v, pos, n,
                                                           Hq, Hkv, D, lt);
    LAUNCH_CK(c);
}

void cuda_kv_append(Backend* be, void* kc, void* vc, const void* k, const void* v, const int32_t* pos, int B, int n,
                    int Hkv, int D, int Tmax) {
    if (B == 0 || n == 0 || Hkv == 0) return;
    CudaImpl* c = CI(be);
    const unsigned g = grid_for(c, (size_t)B * n * Hkv * D, 256);
    if (is_bf16(be))
        k_kv_append<bf16><<<g, 256, 0, c->stream>>>((bf16*)kc, (bf16*)vc, (const bf16*)k, (const bf16*)v, pos, B, n, Hkv,
                                                    D, Tmax);
    else
        k_kv_append<float><<<g, 256, 0, c->stream>>>((float*)kc, (float*)vc, (const float*)k, (const float*)v, pos, B, n,
                                                     Hkv, D, Tmax);
    LAUNCH_CK(c);
}

// Positions are device data here: the caller guarantees pos[b] + n ≤ Tmax (generate.c checks it
// on the host lengths it copies).
void cuda_attn_decode(Backend* be, void* out, const void* q, const void* kc, const void* vc, const int32_t* pos, int B,
                      int n, int Hq, int Hkv, int D, int Tmax) {
    CHECK(Hkv > 0 && Hq % Hkv == 0, "attn_decode: query heads %d must be a multiple of kv heads %d", Hq, Hkv);
    CHECK(D > 0 && D <= DEC_MAX_D, "attn_decode: head dim %d must be in [1, %d]", D, DEC_MAX_D);
    if (B == 0 || n == 0) return;
    CudaImpl* c = CI(be);
    const float scale = 1.0f / sqrtf((float)D);
    const unsigned rows = (unsigned)((size_t)B * n * Hq);
    if (is_bf16(be))
        k_attn_decode<bf16><<<rows, DEC_WARPS * 32, 0, c->stream>>>((bf16*)out, (const bf16*)q, (const bf16*)kc,
                                                                    (const bf16*)vc, pos, n, Hq, Hkv, D, Tmax, scale);
    else
        k_attn_decode<float><<<rows, DEC_WARPS * 32, 0, c->stream>>>((float*)out, (const float*)q, (const float*)kc,
                                                                     (const float*)vc, pos, n, Hq, Hkv, D, Tmax, scale);
    LAUNCH_CK(c);
}
