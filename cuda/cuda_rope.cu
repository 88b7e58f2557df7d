// cuda_rope.cu — rotary position embedding on the fused q/k/v projection (backend.h rope_qkv),
// Hugging Face rotate_half convention: the pair (i, i + D/2) at position t rotates by angle
// t · theta^(−2i/D):  x1' = x1 cos − x2 sin,  x2' = x2 cos + x1 sin  (inverse = 1: by −angle).
// The packed rows qkv [B·T, (Hq + 2·Hkv)·D] against planar q, k, v: the forward reads the packed
// rows and writes q, k rotated and v copied; the backward the reverse. One launch, one block per
// window index t (and per batch row b when positions are given per token, pos: packed documents
// restart at 0): the block computes cos/sin of its D/2 angles once in double (as the CPU does:
// accurate at positions ~32k with theta 1e6), rounds them to fp32 and applies them to every batch
// row (or its one row) and head (v's heads are copied); the rotation is fp32. In bf16 with D/2 a multiple of 8,
// 8 pairs per thread and 16-byte accesses (k_rope_qkv_v).
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

// The packed row's head h of row r = b·T + t, and the same head in its planar tensor.
template <typename T>
struct QkvRows {
    T *pk, *q, *k, *v;
    int Hq, Hkv, D;
    __device__ __forceinline__ T* packed(size_t r, int h) const { return pk + (r * (Hq + 2 * Hkv) + h) * D; }
    __device__ __forceinline__ T* planar(size_t r, int h) const {
        if (h < Hq) return q + (r * Hq + h) * D;
        if (h < Hq + Hkv) return k + (r * Hkv + h - Hq) * D;
        return v + (r * Hkv + h - Hq - Hkv) * D;
    }
};

// The block's rows: window index t = blockIdx.x; every batch row (pos NULL: position t), or row
// blockIdx.y alone at its position pos[b·T + t].
struct RopeRows {
    int t, b0, nb, p;
    __device__ __forceinline__ RopeRows(const int32_t* pos, int B, int T_) {
        t = blockIdx.x;
        b0 = pos ? blockIdx.y : 0;
        nb = pos ? 1 : B;
        p = pos ? pos[(size_t)b0 * T_ + t] : t;
    }
};

template <typename T>
__global__ void k_rope_qkv(QkvRows<T> x, int B, int T_, double log_theta, int inverse, const int32_t* pos) {
    __shared__ float cs[ROPE_MAX_D / 2], sn[ROPE_MAX_D / 2];
    const RopeRows rr(pos, B, T_);
    const int t = rr.t, half = x.D / 2, nh = x.Hq + 2 * x.Hkv;
    rope_table(cs, sn, rr.p, x.D, log_theta, inverse);
    const int pairs = rr.nb * nh * half;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        const int i = p % half, bh = p / half, h = bh % nh, b = rr.b0 + bh / nh;
        const size_t r = (size_t)b * T_ + t;
        const T* s = inverse ? x.planar(r, h) : x.packed(r, h);
        T* d = inverse ? x.packed(r, h) : x.planar(r, h);
        if (h >= x.Hq + x.Hkv) {  // v: copied
            d[i] = s[i], d[i + half] = s[i + half];
            continue;
        }
        const float x1 = to_f(s[i]), x2 = to_f(s[i + half]);
        d[i] = from_f<T>(x1 * cs[i] - x2 * sn[i]);
        d[i + half] = from_f<T>(x2 * cs[i] + x1 * sn[i]);
    }
}

// bf16 with D/2 a multiple of 8: the same, 8 pairs per thread (16-byte accesses to both halves).
__global__ void k_rope_qkv_v(QkvRows<bf16> x, int B, int T_, double log_theta, int inverse, const int32_t* pos) {
    __shared__ float cs[ROPE_MAX_D / 2], sn[ROPE_MAX_D / 2];
    const RopeRows rr(pos, B, T_);
    const int t = rr.t, half = x.D / 2, hc = half / 8, nh = x.Hq + 2 * x.Hkv;
    rope_table(cs, sn, rr.p, x.D, log_theta, inverse);
    const int items = rr.nb * nh * hc;
    for (int p = threadIdx.x; p < items; p += blockDim.x) {
        const int j = p % hc, bh = p / hc, h = bh % nh, b = rr.b0 + bh / nh, i0 = 8 * j;
        const size_t r = (size_t)b * T_ + t;
        const bf16* s = inverse ? x.planar(r, h) : x.packed(r, h);
        bf16* d = inverse ? x.packed(r, h) : x.planar(r, h);
        const uint4 u1 = *(const uint4*)(s + i0), u2 = *(const uint4*)(s + half + i0);
        if (h >= x.Hq + x.Hkv) {  // v: copied
            *(uint4*)(d + i0) = u1;
            *(uint4*)(d + half + i0) = u2;
            continue;
        }
        float x1[8], x2[8], y1[8], y2[8];
        unpack8(x1, u1);
        unpack8(x2, u2);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            y1[e] = x1[e] * cs[i0 + e] - x2[e] * sn[i0 + e];
            y2[e] = x2[e] * cs[i0 + e] + x1[e] * sn[i0 + e];
        }
        *(uint4*)(d + i0) = pack8(y1);
        *(uint4*)(d + half + i0) = pack8(y2);
    }
}

void cuda_rope_qkv(Backend* be, void* qkv, void* q, void* k, void* v, int B, int T, int Hq, int Hkv, int D,
                   float theta, int inverse, const int32_t* pos) {
    // qkv [B·T, (Hq + 2·Hkv)·D]; q [B·T, Hq·D]; k, v [B·T, Hkv·D] (unused when Hkv = 0);
    // pos [B·T] int32 or NULL
    CHECK(D % 2 == 0 && D <= ROPE_MAX_D, "rope: head dim %d must be even and at most %d", D, ROPE_MAX_D);
    CHECK(Hq > 0 && Hkv >= 0, "rope_qkv: %d query heads, %d kv heads", Hq, Hkv);
    if (B == 0 || T == 0) return;
    CudaImpl* c = CI(be);
    const double lt = log((double)theta);
    const dim3 grid(T, pos ? B : 1);  // pos: one block per row (its own position)
    const bool al = ((uintptr_t)qkv | (uintptr_t)q | (Hkv ? (uintptr_t)k | (uintptr_t)v : 0)) % 16 == 0;
    if (is_bf16(be) && (D / 2) % 8 == 0 && al) {
        const QkvRows<bf16> x = {(bf16*)qkv, (bf16*)q, (bf16*)k, (bf16*)v, Hq, Hkv, D};
        KLAUNCH(grid, 256, c->stream, k_rope_qkv_v, x, B, T, lt, inverse, pos);
    } else if (is_bf16(be)) {
        const QkvRows<bf16> x = {(bf16*)qkv, (bf16*)q, (bf16*)k, (bf16*)v, Hq, Hkv, D};
        KLAUNCH(grid, 256, c->stream, k_rope_qkv<bf16>, x, B, T, lt, inverse, pos);
    } else {
        const QkvRows<float> x = {(float*)qkv, (float*)q, (float*)k, (float*)v, Hq, Hkv, D};
        KLAUNCH(grid, 256, c->stream, k_rope_qkv<float>, x, B, T, lt, inverse, pos);
    }
    LAUNCH_CK(c);
}
