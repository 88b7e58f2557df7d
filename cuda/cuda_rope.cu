// cuda_rope.cu — rotary position embedding, Hugging Face rotate_half convention: the pair
// (i, i + D/2) at position t rotates by angle t · theta^(−2i/D):
//   x1' = x1 cos − x2 sin,  x2' = x2 cos + x1 sin   (inverse = 1: by −angle, the backward).
// In place on x [B, T, nh, D]. One block per position t: the block computes cos/sin of its
// D/2 angles once in double (as the CPU does: accurate at positions ~32k with theta 1e6),
// rounds them to fp32 and applies them to every batch row and head; the rotation is fp32 (in bf16
// with D/2 a multiple of 8, 8 pairs per thread and 16-byte loads: k_rope_v).
#include "cuda_common.cuh"

enum { ROPE_MAX_D = 1024 };

// cos / sin of position t's D/2 angles into shared memory (the whole block; ends with a barrier).
__device__ __forceinline__ void rope_table(float* cs, float* sn, int t, int D, double log_theta, int inverse) {
    for (int i = threadIdx.x; i < D / 2; i += blockDim.x) {
        const double inv_freq = exp(-2.0 * i / D * log_theta);  // theta^(−2i/D)
        double s, c;
        sincos((double)t * inv_freq, &s, &c);
        cs[i] = (float)c;
        sn[i] = (float)(inverse ? -s : s);
    }
    __syncthreads();
}

template <typename T>
__global__ void k_rope(T* x, int B, int T_, int nh, int D, double log_theta, int inverse) {
    __shared__ float cs[ROPE_MAX_D / 2], sn[ROPE_MAX_D / 2];
    const int t = blockIdx.x, half = D / 2;
    rope_table(cs, sn, t, D, log_theta, inverse);
    const int pairs = B * nh * half;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        const int i = p % half, bh = p / half, h = bh % nh, b = bh / nh;
        T* v = x + (((size_t)b * T_ + t) * nh + h) * D;
        const float x1 = to_f(v[i]), x2 = to_f(v[i + half]);
        v[i] = from_f<T>(x1 * cs[i] - x2 * sn[i]);
        v[i + half] = from_f<T>(x2 * cs[i] + x1 * sn[i]);
    }
}

// bf16 with D/2 a multiple of 8: the same rotation, 8 pairs per thread (16-byte loads of both
// halves).
__global__ void k_rope_v(bf16* x, int B, int T_, int nh, int D, double log_theta, int inverse) {
    __shared__ float cs[ROPE_MAX_D / 2], sn[ROPE_MAX_D / 2];
    const int t = blockIdx.x, half = D / 2, hc = half / 8;
    rope_table(cs, sn, t, D, log_theta, inverse);
    const int items = B * nh * hc;
    for (int p = threadIdx.x; p < items; p += blockDim.x) {
        const int j = p % hc, bh = p / hc, h = bh % nh, b = bh / nh, i0 = 8 * j;
        bf16* v = x + (((size_t)b * T_ + t) * nh + h) * D;
        float x1[8], x2[8], y1[8], y2[8];
        unpack8(x1, *(const uint4*)(v + i0));
        unpack8(x2, *(const uint4*)(v + half + i0));
#pragma unroll
        for (int e = 0; e < 8; e++) {
            y1[e] = x1[e] * cs[i0 + e] - x2[e] * sn[i0 + e];
            y2[e] = x2[e] * cs[i0 + e] + x1[e] * sn[i0 + e];
        }
        *(uint4*)(v + i0) = pack8(y1);
        *(uint4*)(v + half + i0) = pack8(y2);
    }
}

void cuda_rope(Backend* be, void* x, int B, int T, int nh, int D, float theta, int inverse) {
    CHECK(D % 2 == 0 && D <= ROPE_MAX_D, "rope: head dim %d must be even and at most %d", D, ROPE_MAX_D);
    if (B == 0 || T == 0 || nh == 0) return;
    CudaImpl* c = CI(be);
    const double lt = log((double)theta);
    if (is_bf16(be) && (D / 2) % 8 == 0 && (uintptr_t)x % 16 == 0)
        k_rope_v<<<T, 256, 0, c->stream>>>((bf16*)x, B, T, nh, D, lt, inverse);
    else if (is_bf16(be)) k_rope<bf16><<<T, 256, 0, c->stream>>>((bf16*)x, B, T, nh, D, lt, inverse);
    else k_rope<float><<<T, 256, 0, c->stream>>>((float*)x, B, T, nh, D, lt, inverse);
    LAUNCH_CK(c);
}
