// cuda_optim.cu — AdamW (torch.optim.AdamW semantics, decoupled weight decay) on fp32 masters
// and moments, writing the act-dtype parameter copy:
//   g = grad · grad_scale;  m ← β1 m + (1 − β1) g;  v ← β2 v + (1 − β2) g²
//   p ← p · (1 − lr·wd) − lr · (m / bc1) / (sqrt(v / bc2) + eps),  bc_i = 1 − β_i^step
// fp32 math (the CPU spec uses double; the difference is ~1 ulp of the update). 4 elements per
// thread with 16-byte loads when every pointer allows it.
#include <math.h>

#include "cuda_common.cuh"

struct AdamArgs {
    float lr, b1, b2, eps, decay, gs, bc1, bc2;
};

__device__ __forceinline__ float adam1(float& p, float& m, float& v, float g, const AdamArgs& a) {
    g *= a.gs;
    m = a.b1 * m + (1.f - a.b1) * g;
    v = a.b2 * v + (1.f - a.b2) * g * g;
    const float mh = m / a.bc1, vh = v / a.bc2;
    p = p * a.decay - a.lr * mh / (sqrtf(vh) + a.eps);
    return p;
}

__device__ __forceinline__ void store_param(float* q, size_t i, float p) { q[i] = p; }
__device__ __forceinline__ void store_param(bf16* q, size_t i, float p) { q[i] = __float2bfloat16_rn(p); }

// P = float or bf16; param may be NULL (it is the master itself).
template <typename P, bool VEC>
__global__ void k_adamw(float* master, P* param, float* m, float* v, const float* grad, size_t n, AdamArgs a) {
    const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, step = (size_t)gridDim.x * blockDim.x;
    size_t done = 0;
    if (VEC) {
        const size_t n4 = n / 4;
        for (size_t i = tid; i < n4; i += step) {
            float4 p = ((float4*)master)[i], mm = ((float4*)m)[i], vv = ((float4*)v)[i];
            const float4 g = ((const float4*)grad)[i];
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
        adam1(p, mm, vv, grad[i], a);
        master[i] = p;
        m[i] = mm;
        v[i] = vv;
        if (param) store_param(param, i, p);
    }
}

template <typename P>
static void launch_adamw(CudaImpl* c, float* master, P* param, float* m, float* v, const float* grad, size_t n,
                         const AdamArgs& a) {
    const bool vec = ((uintptr_t)master | (uintptr_t)m | (uintptr_t)v | (uintptr_t)grad) % 16 == 0;
    const unsigned g = grid_for(c, vec ? (n + 3) / 4 : n, 256);
    if (vec) k_adamw<P, true><<<g, 256, 0, c->stream>>>(master, param, m, v, grad, n, a);
    else k_adamw<P, false><<<g, 256, 0, c->stream>>>(master, param, m, v, grad, n, a);
    LAUNCH_CK(c);
}

void cuda_adamw(Backend* be, float* master, void* param, float* m, float* v, const float* grad, size_t n, float lr,
                float b1, float b2, float eps, float wd, float grad_scale, int step) {
    // master, m, v, grad [n] fp32; param [n] act (may be master when act is fp32)
    CHECK(step >= 1, "adamw: step is 1-based, got %d", step);
    if (n == 0) return;
    AdamArgs a;
    a.lr = lr;
    a.b1 = b1;
    a.b2 = b2;
    a.eps = eps;
    a.decay = (float)(1.0 - (double)lr * wd);
    a.gs = grad_scale;
    a.bc1 = (float)(1.0 - pow((double)b1, step));
    a.bc2 = (float)(1.0 - pow((double)b2, step));
    CudaImpl* c = CI(be);
    if (is_bf16(be)) launch_adamw<bf16>(c, master, (bf16*)param, m, v, grad, n, a);
    else launch_adamw<float>(c, master, param == (void*)master ? NULL : (float*)param, m, v, grad, n, a);
}
