// cuda_optim.cu — AdamW (torch.optim.AdamW semantics, decoupled weight decay) on fp32 masters
// and moments, writing the act-dtype parameter copy:
//   g = grad · grad_scale;  m ← β1 m + (1 − β1) g;  v ← β2 v + (1 − β2) g²
//   p ← p · (1 − lr·wd) − lr · (m / bc1) / (sqrt(v / bc2) + eps),  bc_i = 1 − β_i^step
// fp32 math (the CPU spec uses double; the difference is ~1 ulp of the update). 4 elements per
// thread with 16-byte loads when every pointer allows it.
// Split masters (backend.h split_pack; the identity and its proof: src/cpu/cpu_optim.c): the
// master is the bf16 weight w plus an int16 remainder; adamw_split joins them into the fp32
// master, runs the same adam1 as k_adamw, and splits the result: 28 bytes per element (w, rem,
// m, v, grad in; w, rem, m, v out) instead of k_adamw's 30 with a bf16 copy. 8 elements per
// iteration with 16-byte accesses (w, rem: one uint4 each; m, v, grad: two float4) from the
// first element where w is 16-byte aligned (a scalar head before it, a scalar tail after).
// Gradients are fp32 or, with grad_act in a bf16 run, bf16 (G below): the same update on the same
// values widened to fp32, for 2 bytes less traffic per element.
#include <math.h>

#include "cuda_common.cuh"

struct AdamArgs {
    float lr, b1, b2, eps, decay, gs, bc1, bc2;
};

static AdamArgs adam_args(const AdamWDesc* d, const char* op) {
    CHECK(d->step >= 1, "%s: step is 1-based, got %d", op, d->step);
    AdamArgs a;
    a.lr = d->lr;
    a.b1 = d->beta1;
    a.b2 = d->beta2;
    a.eps = d->eps;
    a.decay = (float)(1.0 - (double)d->lr * d->wd);
    a.gs = d->grad_scale;
    a.bc1 = (float)(1.0 - pow((double)d->beta1, d->step));
    a.bc2 = (float)(1.0 - pow((double)d->beta2, d->step));
    return a;
}

// Every operation written out with its rounding (__fmul_rn, ...): the compiler may not contract
// a·b + c into an FMA, which it otherwise does differently in k_adamw and k_adamw_split (measured
// on the H200: v differed in ~40% of the elements), and the split path must give adamw's bits.
__device__ __forceinline__ float adam1(float& p, float& m, float& v, float g, const AdamArgs& a) {
    g = __fmul_rn(g, a.gs);
    m = __fadd_rn(__fmul_rn(a.b1, m), __fmul_rn(__fsub_rn(1.f, a.b1), g));
    v = __fadd_rn(__fmul_rn(a.b2, v), __fmul_rn(__fmul_rn(__fsub_rn(1.f, a.b2), g), g));
    const float mh = __fdiv_rn(m, a.bc1), vh = __fdiv_rn(v, a.bc2);
    p = __fsub_rn(__fmul_rn(p, a.decay), __fdiv_rn(__fmul_rn(a.lr, mh), __fadd_rn(__fsqrt_rn(vh), a.eps)));
    return p;
}

// Gradient loads: 4 values at [4i, 4i + 4) and 8 at [8i, 8i + 8) (aligned), fp32 or bf16.
__device__ __forceinline__ float bf_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ float4 load_g4(const float* g, size_t i) { return ((const float4*)g)[i]; }
__device__ __forceinline__ float4 load_g4(const bf16* g, size_t i) {
    const uint2 u = ((const uint2*)g)[i];
    return make_float4(bf_lo(u.x), bf_hi(u.x), bf_lo(u.y), bf_hi(u.y));
}
__device__ __forceinline__ void load_g8(const float* g, size_t i, float o[8]) {
    const float4 a = ((const float4*)g)[2 * i], b = ((const float4*)g)[2 * i + 1];
    o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
}
__device__ __forceinline__ void load_g8(const bf16* g, size_t i, float o[8]) {
    const uint4 u = ((const uint4*)g)[i];
    const uint32_t q[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; j++) o[2 * j] = bf_lo(q[j]), o[2 * j + 1] = bf_hi(q[j]);
}

__device__ __forceinline__ void store_param(float* q, size_t i, float p) { q[i] = p; }
__device__ __forceinline__ void store_param(bf16* q, size_t i, float p) { q[i] = __float2bfloat16_rn(p); }

// P = float or bf16; param may be NULL (it is the master itself). G = float or bf16.
template <typename P, typename G, bool VEC>
__global__ void k_adamw(float* master, P* param, float* m, float* v, const G* grad, size_t n, AdamArgs a) {
    const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, step = (size_t)gridDim.x * blockDim.x;
    size_t done = 0;
    if (VEC) {
        const size_t n4 = n / 4;
        for (size_t i = tid; i < n4; i += step) {
            float4 p = ((float4*)master)[i], mm = ((float4*)m)[i], vv = ((float4*)v)[i];
            const float4 g = load_g4(grad, i);
            adam1(p.x, mm.x, vv.x, g.x, a);
            adam1(p.y, mm.y, vv.y, g.y, a);
            adam1(p.z, mm.z, vv.z, g.z, a);
            adam1(p.w, mm.w, vv.w, g.w, a);
            ((float4*)master)[i] = p;
            ((float4*)m)[i] = mm;
            ((float4*)v)[i] = vv;
            if (param) {
                store_param(param, 4 * i, p.x);
                store_param(param, 4 * i + 1, p.y);
                store_param(param, 4 * i + 2, p.z);
                store_param(param, 4 * i + 3, p.w);
            }
        }
        done = n4 * 4;
    }
    for (size_t i = done + tid; i < n; i += step) {
        float p = master[i], mm = m[i], vv = v[i];
        adam1(p, mm, vv, to_f(grad[i]), a);
        master[i] = p;
        m[i] = mm;
        v[i] = vv;
        if (param) store_param(param, i, p);
    }
}

// The AdamW kernels' grid: one item (4 or 8 elements) per thread, no grid-stride loop. A grid
// capped at 32 blocks per SM (grid_for) moved 3.95 TB/s at one layer's w13 (26 B per parameter) on
// the H200, this one 4.12–4.16: blocks that end and are replaced
// keep more loads in flight than threads that loop.
static unsigned grid_flat(size_t items, int threads) {
    const size_t b = (items + threads - 1) / threads;
    CHECK(b <= 0x7fffffffu, "adamw: %zu items exceed one launch", items);
    return b ? (unsigned)b : 1u;
}

template <typename P, typename G>
static void launch_adamw(CudaImpl* c, float* master, P* param, float* m, float* v, const G* grad, size_t n,
                         const AdamArgs& a) {
    const bool vec = ((uintptr_t)master | (uintptr_t)m | (uintptr_t)v | (uintptr_t)grad) % 16 == 0;
    const unsigned g = grid_flat(vec ? (n + 3) / 4 : n, 256);
    const auto kern = vec ? k_adamw<P, G, true> : k_adamw<P, G, false>;
    KLAUNCH(g, 256, c->stream, kern, master, param, m, v, grad, n, a);
    LAUNCH_CK(c);
}

void cuda_adamw(Backend* be, const AdamWDesc* d, float* master, void* param, float* m, float* v, const void* grad, size_t n) {
    // master, m, v [n] fp32; grad [n] fp32, or act with grad_act; param [n] act (may be master when act is fp32)
    const AdamArgs a = adam_args(d, "adamw");
    if (n == 0) return;
    CudaImpl* c = CI(be);
    if (is_bf16(be) && d->grad_act) launch_adamw(c, master, (bf16*)param, m, v, (const bf16*)grad, n, a);
    else if (is_bf16(be)) launch_adamw(c, master, (bf16*)param, m, v, (const float*)grad, n, a);
    else launch_adamw(c, master, param == (void*)master ? NULL : (float*)param, m, v, (const float*)grad, n, a);
}

// ---- split masters ----------------------------------------------------------------------------

// fp32 bits from the bf16 bits w and the remainder bits r (each in the low 16 bits): w·2^16 + r
// with r sign-extended, mod 2^32.
__device__ __forceinline__ float split_join(uint32_t w, uint32_t r) {
    return __uint_as_float((w << 16) + (uint32_t)(int32_t)(int16_t)(uint16_t)r);
}
// x → (w, r): w = high half + the top bit of the low half (ties away from zero), r = low half.
__device__ __forceinline__ void split_part(float x, uint32_t& w, uint32_t& r) {
    const uint32_t u = __float_as_uint(x);
    w = ((u >> 16) + ((u >> 15) & 1u)) & 0xffffu;
    r = u & 0xffffu;
}
// Half j (0..7) of four 32-bit words holding eight 16-bit values (little endian: even j low).
__device__ __forceinline__ uint32_t half_of(const uint32_t q[4], int j) { return j & 1 ? q[j >> 1] >> 16 : q[j >> 1] & 0xffffu; }

// Elements before w reaches a 16-byte boundary; the vector path starts there when every other
// pointer is 16-byte aligned at that element too and at least 8 elements remain.
static size_t split_head(const void* w) { return ((16 - (uintptr_t)w % 16) % 16) / 2; }
static bool al16(const void* p) { return (uintptr_t)p % 16 == 0; }

template <typename G, bool VEC>
__global__ void k_adamw_split(uint16_t* w, int16_t* rem, float* m, float* v, const G* grad, size_t n, size_t head,
                              AdamArgs a) {
    const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, step = (size_t)gridDim.x * blockDim.x;
    size_t done = 0, i0 = 0;
    if (VEC) {
        const size_t n8 = (n - head) / 8;
        uint4 *w8 = (uint4*)(w + head), *r8 = (uint4*)(rem + head);
        float4 *m4 = (float4*)(m + head), *v4 = (float4*)(v + head);
        const G* g8 = grad + head;
        for (size_t i = tid; i < n8; i += step) {
            const uint4 wv = w8[i], rv = r8[i];
            const float4 m0 = m4[2 * i], m1 = m4[2 * i + 1], v0 = v4[2 * i], v1 = v4[2 * i + 1];
            const uint32_t wq[4] = {wv.x, wv.y, wv.z, wv.w}, rq[4] = {rv.x, rv.y, rv.z, rv.w};
            float mm[8] = {m0.x, m0.y, m0.z, m0.w, m1.x, m1.y, m1.z, m1.w};
            float vv[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
            float gg[8];
            load_g8(g8, i, gg);
            uint32_t wo[4] = {0, 0, 0, 0}, ro[4] = {0, 0, 0, 0};
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float p = split_join(half_of(wq, j), half_of(rq, j));
                adam1(p, mm[j], vv[j], gg[j], a);
                uint32_t pw, pr;
                split_part(p, pw, pr);
                wo[j >> 1] |= pw << (16 * (j & 1));
                ro[j >> 1] |= pr << (16 * (j & 1));
            }
            w8[i] = make_uint4(wo[0], wo[1], wo[2], wo[3]);
            r8[i] = make_uint4(ro[0], ro[1], ro[2], ro[3]);
            m4[2 * i] = make_float4(mm[0], mm[1], mm[2], mm[3]);
            m4[2 * i + 1] = make_float4(mm[4], mm[5], mm[6], mm[7]);
            v4[2 * i] = make_float4(vv[0], vv[1], vv[2], vv[3]);
            v4[2 * i + 1] = make_float4(vv[4], vv[5], vv[6], vv[7]);
        }
        done = head + 8 * n8;
        i0 = head;  // the scalar loops below: [0, head) and [done, n)
    }
    for (size_t k = tid; k < i0 + (n - done); k += step) {
        const size_t i = k < i0 ? k : done + (k - i0);
        float p = split_join(w[i], (uint16_t)rem[i]), mm = m[i], vv = v[i];
        adam1(p, mm, vv, to_f(grad[i]), a);
        uint32_t pw, pr;
        split_part(p, pw, pr);
        w[i] = (uint16_t)pw;
        rem[i] = (int16_t)(uint16_t)pr;
        m[i] = mm;
        v[i] = vv;
    }
}

template <bool VEC>
__global__ void k_split_pack(uint16_t* w, int16_t* rem, const float* x, size_t n, size_t head) {
    const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, step = (size_t)gridDim.x * blockDim.x;
    size_t done = 0, i0 = 0;
    if (VEC) {
        const size_t n8 = (n - head) / 8;
        uint4* w8 = (uint4*)(w + head);
        uint4* r8 = rem ? (uint4*)(rem + head) : nullptr;
        const float4* x4 = (const float4*)(x + head);
        for (size_t i = tid; i < n8; i += step) {
            const float4 x0 = x4[2 * i], x1 = x4[2 * i + 1];
            const float xx[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
            uint32_t wo[4] = {0, 0, 0, 0}, ro[4] = {0, 0, 0, 0};
#pragma unroll
            for (int j = 0; j < 8; j++) {
                uint32_t pw, pr;
                split_part(xx[j], pw, pr);
                wo[j >> 1] |= pw << (16 * (j & 1));
                ro[j >> 1] |= pr << (16 * (j & 1));
            }
            w8[i] = make_uint4(wo[0], wo[1], wo[2], wo[3]);
            if (rem) r8[i] = make_uint4(ro[0], ro[1], ro[2], ro[3]);
        }
        done = head + 8 * n8;
        i0 = head;
    }
    for (size_t k = tid; k < i0 + (n - done); k += step) {
        const size_t i = k < i0 ? k : done + (k - i0);
        uint32_t pw, pr;
        split_part(x[i], pw, pr);
        w[i] = (uint16_t)pw;
        if (rem) rem[i] = (int16_t)(uint16_t)pr;
    }
}

template <bool VEC>
__global__ void k_split_unpack(float* x, const uint16_t* w, const int16_t* rem, size_t n, size_t head) {
    const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, step = (size_t)gridDim.x * blockDim.x;
    size_t done = 0, i0 = 0;
    if (VEC) {
        const size_t n8 = (n - head) / 8;
        const uint4 *w8 = (const uint4*)(w + head), *r8 = (const uint4*)(rem + head);
        float4* x4 = (float4*)(x + head);
        for (size_t i = tid; i < n8; i += step) {
            const uint4 wv = w8[i], rv = r8[i];
            const uint32_t wq[4] = {wv.x, wv.y, wv.z, wv.w}, rq[4] = {rv.x, rv.y, rv.z, rv.w};
            float xx[8];
#pragma unroll
            for (int j = 0; j < 8; j++) xx[j] = split_join(half_of(wq, j), half_of(rq, j));
            x4[2 * i] = make_float4(xx[0], xx[1], xx[2], xx[3]);
            x4[2 * i + 1] = make_float4(xx[4], xx[5], xx[6], xx[7]);
        }
        done = head + 8 * n8;
        i0 = head;
    }
    for (size_t k = tid; k < i0 + (n - done); k += step) {
        const size_t i = k < i0 ? k : done + (k - i0);
        x[i] = split_join(w[i], (uint16_t)rem[i]);
    }
}

template <typename G>
static void launch_adamw_split(CudaImpl* c, uint16_t* w, int16_t* rem, float* m, float* v, const G* grad, size_t n,
                               const AdamArgs& a) {
    const size_t h = split_head(w);
    const bool vec = n >= h + 8 && al16(w + h) && al16(rem + h) && al16(m + h) && al16(v + h) && al16(grad + h);
    const unsigned g = grid_flat(vec ? (n - h) / 8 + 1 : n, 256);
    const auto kern = vec ? k_adamw_split<G, true> : k_adamw_split<G, false>;
    KLAUNCH(g, 256, c->stream, kern, w, rem, m, v, grad, n, vec ? h : 0, a);
    LAUNCH_CK(c);
}

void cuda_adamw_split(Backend* be, const AdamWDesc* d, uint16_t* w, int16_t* rem, float* m, float* v, const void* grad,
                      size_t n) {
    // w, rem [n] split masters (bf16 bits whatever the act dtype); m, v [n] fp32; grad [n] fp32, or act with grad_act
    const AdamArgs a = adam_args(d, "adamw_split");  // exactly cuda_adamw's
    if (n == 0) return;
    CudaImpl* c = CI(be);
    if (is_bf16(be) && d->grad_act) launch_adamw_split(c, w, rem, m, v, (const bf16*)grad, n, a);
    else launch_adamw_split(c, w, rem, m, v, (const float*)grad, n, a);
}

void cuda_split_pack(Backend* be, uint16_t* w, int16_t* rem, const float* x, size_t n) {
    // w, rem [n] (rem may be NULL: w only); x [n] fp32
    if (n == 0) return;
    CudaImpl* c = CI(be);
    const size_t h = split_head(w);
    const bool vec = n >= h + 8 && al16(w + h) && (!rem || al16(rem + h)) && al16(x + h);
    const unsigned g = grid_for(c, vec ? (n - h) / 8 + 1 : n, 256);
    const auto kern = vec ? k_split_pack<true> : k_split_pack<false>;
    KLAUNCH(g, 256, c->stream, kern, w, rem, x, n, vec ? h : 0);
    LAUNCH_CK(c);
}

void cuda_split_unpack(Backend* be, float* x, const uint16_t* w, const int16_t* rem, size_t n) {
    // x [n] fp32; w, rem [n]
    if (n == 0) return;
    CudaImpl* c = CI(be);
    const size_t h = split_head(w);
    const bool vec = n >= h + 8 && al16(w + h) && al16(rem + h) && al16(x + h);
    const unsigned g = grid_for(c, vec ? (n - h) / 8 + 1 : n, 256);
    const auto kern = vec ? k_split_unpack<true> : k_split_unpack<false>;
    KLAUNCH(g, 256, c->stream, kern, x, w, rem, n, vec ? h : 0);
    LAUNCH_CK(c);
}
