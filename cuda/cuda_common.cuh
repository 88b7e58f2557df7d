// cuda_common.cuh — internals shared by the CUDA backend's .cu files: the check macros, the
// backend's private state (CudaImpl), dtype helpers and the launchers each file defines.
//
// Conventions: every op runs on impl->stream (one cudaStreamNonBlocking stream per backend),
// never allocates (workspace is made once in cuda_backend_create), and checks every launch
// with LAUNCH_CK (cudaGetLastError; with MOETRAIN_CUDA_SYNC=1 also a stream sync, so an
// asynchronous fault is reported at the op that caused it).
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "backend.h"
#include "util.h"
}

typedef __nv_bfloat16 bf16;

// ---- checks ----------------------------------------------------------------------------------
// Fatal: "moetrain: rank R: file:line: CUDA error: <statement>: <message> (device D)".
void cuda_fail(const char* what, const char* lib, const char* msg, const char* file, int line)
    __attribute__((noreturn));
#define CUDA_CK(call)                                                                         \
    do {                                                                                      \
        cudaError_t ck_e_ = (call);                                                           \
        if (ck_e_ != cudaSuccess) cuda_fail(#call, "CUDA", cudaGetErrorString(ck_e_), __FILE__, __LINE__); \
    } while (0)
#define CUBLAS_CK(call)                                                                       \
    do {                                                                                      \
        cublasStatus_t ck_s_ = (call);                                                        \
        if (ck_s_ != CUBLAS_STATUS_SUCCESS)                                                   \
            cuda_fail(#call, "cuBLASLt", cublasLt_status_name(ck_s_), __FILE__, __LINE__);    \
    } while (0)
const char* cublasLt_status_name(cublasStatus_t s);
// After every kernel launch.
#define LAUNCH_CK(impl) cuda_launch_check((impl), __FILE__, __LINE__)
// A launch of kern (no dynamic shared memory) on a stream. tests/host_cuda (stand-ins for CUDA's
// headers) defines its own, which runs the kernel's source on the CPU (tests/host_cuda/cuda_host.h).
#ifndef KLAUNCH
#define KLAUNCH(grid, threads, stream, kern, ...) kern<<<grid, threads, 0, stream>>>(__VA_ARGS__)
#endif

// ---- the backend's private state -------------------------------------------------------------
struct GemmCache;  // cuda_gemm.cu
struct Fp8Cache;   // cuda_fp8.cu
enum { FP8_ROW_CHUNK = 4096 };  // cuda_fp8.cu: rows quantised and multiplied at a time (bounds its ws)
// cuda_fp8.cu: the fp32 sums of a bf16 weight gradient over several row chunks (bounds its ws)
#define FP8_WGRAD_ACC_BYTES ((size_t)256 << 20)
// cuda_fp8.cu: the fp32 product rows staged for the epilogue of a bf16 C with beta (bounds its ws)
#define FP8_EPI_BYTES ((size_t)32 << 20)

// Pointer → size of live allocations (host-side open-addressing table), for peak_bytes.
typedef struct AllocMap {
    uintptr_t* key;  // [cap], 0 = empty, 1 = deleted
    size_t* val;     // [cap]
    size_t cap, used;
} AllocMap;

typedef struct CudaImpl {
    int device;
    int sms;                 // multiprocessor count
    int cc_major;            // compute capability (9 on Hopper)
    int cc_minor;
    int debug_sync;          // MOETRAIN_CUDA_SYNC=1: synchronize after every launch
    int attn_ds_force;       // tests: the stored-dS attention backward whenever one pair fits
    GpuConfig opt;           // config section gpu (attention kernels, GEMM tiles, plan log)
    cudaStream_t stream;     // the one stream every op runs on
    cublasLtHandle_t lt;
    void* lt_ws;             // cuBLASLt workspace [lt_ws_bytes]
    size_t lt_ws_bytes;
    void* scratch;           // op workspace [scratch_bytes]: reduction partials, index tiles
    size_t scratch_bytes;
    struct GemmCache* gemm;  // cuBLASLt plans by shape
    struct Fp8Cache* fp8;    // cuBLASLt's block-scaled FP8 plans (cuda_fp8.cu; made on first use)
    int fp8_path;            // tests: 0 = cuBLASLt where it can, 2 = the FP8 fallback kernel only
    int fp8_row_chunk;       // rows an FP8 product takes at a time (FP8_ROW_CHUNK; tests set others)
    size_t fp8_wgrad_acc;    // bytes of fp32 sums a chunked bf16 FP8 weight gradient keeps (FP8_WGRAD_ACC_BYTES)
    size_t fp8_epi_bytes;    // bytes of fp32 product rows the FP8 epilogue path stages at a time (FP8_EPI_BYTES)
    size_t fp8_lt_calls, fp8_fb_calls;  // FP8 products issued through cuBLASLt / the fallback
    size_t fp8_w13_groups;   // groups gemm_grouped_swiglu_bwd took on its own path (cuda_fp8.cu)
    size_t fp8_ffn_groups;   // groups gemm_grouped_ffn took on its own path (cuda_fp8.cu)
    size_t fp8_wgrad_split;  // FP8 weight-gradient groups too large for ws, taken in row chunks
    size_t live, peak;       // bytes allocated through be->alloc
    char name[256];          // cudaDeviceProp.name
    AllocMap allocs;
} CudaImpl;

static inline CudaImpl* CI(Backend* be) { return (CudaImpl*)be->impl; }
static inline cudaStream_t ST(Backend* be) { return CI(be)->stream; }
static inline int is_bf16(Backend* be) { return be->act_dtype == DTYPE_BF16; }

void cuda_launch_check(CudaImpl* c, const char* file, int line);

// Grid size for a grid-stride loop over n items with `threads` per block.
static inline unsigned grid_for(const CudaImpl* c, size_t n, int threads) {
    size_t b = (n + threads - 1) / threads;
    const size_t cap = (size_t)c->sms * 32;
    if (b > cap) b = cap;
    return b ? (unsigned)b : 1u;
}

// The largest power of two ≤ 16 that divides address p (the alignment cuBLASLt is told of).
static inline int ptr_align16(const void* p) {
    const uintptr_t a = (uintptr_t)p;
    int al = 16;
    while (al > 1 && (a % al)) al >>= 1;
    return al;
}

// ---- dtype helpers (device) ------------------------------------------------------------------
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }
// Two floats → a bf16x2 (lo in the low half); 8 bf16 of a 16-byte chunk ↔ 8 floats.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t*)&h;
}
__device__ __forceinline__ void unpack8(float* f, uint4 u) {
    const uint32_t p[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(p[i] << 16);
        f[2 * i + 1] = __uint_as_float(p[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ uint4 pack8(const float* f) {
    return make_uint4(pack_bf16(f[0], f[1]), pack_bf16(f[2], f[3]), pack_bf16(f[4], f[5]), pack_bf16(f[6], f[7]));
}

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

// fast_exp2: 2^x in one MUFU.EX2 (ex2.approx.ftz: exp2f's ex2.approx without ftz adds a denormal
// fix-up of three instructions around it). Flushing results below 2^-126 to 0 changes no softmax
// weight that bf16 or the fp32 row sums can hold; 2^-inf = 0 as before.
// fast_rcp: 1/x in one MUFU.RCP (rcp.approx.ftz: within 1 ulp; 1/±inf = ±0, results below 2^-126
// flushed). (The host stand-in, tests/host_cuda, brings its own of both.)
#ifndef CUDA_HOST_RUN
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float fast_rcp(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
#endif

// σ(g) = 1 / (1 + e^−g) and silu(g) = g·σ(g), as the SwiGLU kernels (forward, backward, the FP8
// forward's and backward's fused kernels) compute them: e^−g as 2^(−g·log2 e) and the reciprocal,
// one MUFU each, in place of expf's range reduction and an IEEE division with its slow-path check
// (k_swiglu_fwd_tiles compiles to a third fewer instructions, k_swiglu_bwd_rows to 29% fewer).
// σ is within a few fp32 ulp of the correctly rounded value (relative error ~2^-22 + |g|·2^-24),
// far below the bf16 rounding of h and of the gradients; σ(g) = 0 once 1 + e^−g passes 2^126
// (g < −87.3, where σ < 2^-126).
__device__ __forceinline__ float sigmoid_f(float g) { return fast_rcp(1.0f + fast_exp2(-g * LOG2E)); }
__device__ __forceinline__ float silu_f(float g) { return g * sigmoid_f(g); }

// The SwiGLU of eight (gate, up) pairs from 16-byte words of bf16: h = bf16(silu(g)·u·s), s applied
// where scaled (k_swiglu_fwd_v8 and the FP8 forward's row-codes kernel: one arithmetic, one set of bits).
__device__ __forceinline__ uint4 swiglu_fwd8(uint4 gv, uint4 uv, float s, bool scaled) {
    float g[8], u[8], h[8];
    unpack8(g, gv), unpack8(u, uv);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        h[i] = silu_f(g[i]) * u[i];
        if (scaled) h[i] *= s;
    }
    return pack8(h);
}

// The SwiGLU backward of one element (gate g, up u, incoming gradient d, routing scale s): the
// gate's gradient d·s·u·silu'(g), silu'(g) = σ(g)(1 + g(1 − σ(g))), the up's d·s·silu(g), and
// this element's term d·silu(g)·u of the scale's gradient (cuda_moe.cu's SwiGLU backward kernels).
__device__ __forceinline__ void swiglu_bwd_elem(float g, float u, float d, float s, float* dg, float* du, float* ds) {
    const float sg = sigmoid_f(g), si = g * sg;
    *ds = d * (si * u);
    const float da = d * s;
    *du = da * si;
    *dg = da * u * (sg * (1.0f + g * (1.0f - sg)));
}
// Eight elements of it from 16-byte words of bf16 (gate gv, up uv, incoming dv): the gate's and
// the up's gradients as bf16 words (og, ou), their scale-gradient terms added to *ds in order.
__device__ __forceinline__ void swiglu_bwd8(uint4 gv, uint4 uv, uint4 dv, float s, uint4* og, uint4* ou, float* ds) {
    float g[8], u[8], d[8], dg[8], du[8];
    unpack8(g, gv), unpack8(u, uv), unpack8(d, dv);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float t;
        swiglu_bwd_elem(g[i], u[i], d[i], s, &dg[i], &du[i], &t);
        *ds += t;
    }
    *og = pack8(dg), *ou = pack8(du);
}

#include "cuda_reduce.cuh"

// ---- launchers (one op family per file) ------------------------------------------------------
// cuda_gemm.cu
struct GemmCache* gemm_cache_create(void);
void gemm_cache_destroy(struct GemmCache*);
void cuda_gemm(Backend*, const GemmDesc*, const void* A, const void* B, void* C);
void cuda_gemm_grouped(Backend*, const GemmDesc*, const GroupDesc*, const void* A, const void* B, void* C);
void cuda_gemm_grouped_swiglu(Backend*, const GemmDesc*, const GroupDesc*, const void* A, const void* B, void* gu,
                              void* h, const float* scale);
void cuda_gemm_grouped_wgrad(Backend*, const GroupDesc*, int N, int K, const void* dY, const void* X, void* dB,
                             float beta);
// cuda_fp8.cu: the FP8 forms of the three GEMM ops (GemmDesc.fp8 / GroupDesc.fp8) and their workspace
extern "C" void cuda_gemm_fp8(Backend*, const GemmDesc*, const void* A, const void* B, void* C);
extern "C" void cuda_gemm_grouped_fp8(Backend*, const GemmDesc*, const GroupDesc*, const void* A, const void* B,
                                      void* C);
extern "C" void cuda_gemm_grouped_wgrad_fp8(Backend*, const GroupDesc*, int N, int K, const void* dY, const void* X,
                                            void* dB, float beta);
extern "C" void cuda_gemm_grouped_ffn(Backend*, const GemmDesc* d, const GroupDesc* g, const void* A, const void* B,
                                      void* gu, void* h, void* hq, const float* scale, const GemmDesc* d2,
                                      const GroupDesc* g2, const void* B2, void* Y);
extern "C" void cuda_gemm_grouped_swiglu_bwd(Backend*, const GemmDesc*, const GroupDesc*, const void* dh, void* gu,
                                              const float* scale, float* dscale, const void* X, const void* W, void* dW,
                                              float beta, void* dX);
extern "C" size_t cuda_fp8_ws_bytes(Backend*, Fp8Op op, Fp8Gemm fp8, int M, int N, int K, int groups);
extern "C" size_t cuda_fp8_wcodes_bytes(Backend*, int R, int C, int groups);
extern "C" void cuda_fp8_wcodes_make(Backend*, const void* W, int R, int C, int groups, size_t b_stride, void* codes);
extern "C" size_t cuda_fp8_xcodes_bytes(Backend*, int R, int groups, int K);
extern "C" void cuda_fp8_xcodes_make(Backend*, const GroupDesc* g, const void* X, int K, void* xq);
extern "C" int cuda_fp8_kernels_built(void);
void fp8_cache_destroy(struct Fp8Cache*);
// cuda_norm.cu: embedding and RMSNorm
void cuda_embed_fwd(Backend*, void* out, const void* table, const int32_t* tok, int N, int H);
void cuda_embed_bwd(Backend*, float* dtable, const void* dout, const int32_t* tok, int N, int H, int V);
void cuda_rmsnorm_fwd(Backend*, void* y, float* rstd, const void* x, const void* w, int N, int H, float eps);
void cuda_rmsnorm_bwd(Backend*, void* dx, float* dw, const void* dy, const void* x, const void* w,
                      const float* rstd, int N, int H, int accumulate);
// cuda_rope.cu
void cuda_rope_qkv(Backend*, void* qkv, void* q, void* k, void* v, int B, int T, int Hq, int Hkv, int D, float theta,
                   int inverse, const int32_t* pos);
// cuda_decode.cu
void cuda_rope_qkv_at(Backend*, void* qkv, void* q, void* k, void* v, const int32_t* pos, int B, int n, int Hq,
                      int Hkv, int D, float theta);
void cuda_kv_append(Backend*, void* kc, void* vc, const void* k, const void* v, const int32_t* pos, int B, int n,
                    int Hkv, int D, int Tmax);
void cuda_attn_decode(Backend*, void* out, const void* q, const void* kc, const void* vc, const int32_t* pos, int B,
                      int n, int Hq, int Hkv, int D, int Tmax);
// cuda_attn.cu, cuda_attn_bwd.cu
void cuda_attn_fwd(Backend*, void* out, float* lse, const void* q, const void* k, const void* v, int B, int T,
                   int Hq, int Hkv, int D, const int32_t* doc);
void cuda_attn_bwd(Backend*, void* dq, void* dk, void* dv, const void* dout, const void* out, const float* lse,
                   const void* q, const void* k, const void* v, int B, int T, int Hq, int Hkv, int D, void* ws,
                   size_t ws_bytes, const int32_t* doc);
// cuda_router.cu
void cuda_router_fwd(Backend*, float* probs, int32_t* topk_idx, float* topk_w, float* stats, float* zsum,
                     const float* logits, int N, int E, int k);
void cuda_router_bwd(Backend*, float* dlogits, const float* dtopk_w, const float* aux_dprob, float z_grad,
                     const float* probs, const int32_t* topk_idx, const float* topk_w, const float* logits,
                     int N, int E, int k);
// cuda_moe.cu: index, permutes, SwiGLU
void cuda_moe_index(Backend*, int32_t* counts, int32_t* dest, const int32_t* topk_idx, int N, int k, int E);
void cuda_permute_fwd(Backend*, void* xp, const void* x, const int32_t* dest, int N, int k, int H);
void cuda_permute_bwd(Backend*, void* dx, const void* dxp, const int32_t* dest, int N, int k, int H);
void cuda_gather_rows_f32(Backend*, float* outp, const float* in, const int32_t* dest, int n);
void cuda_scatter_rows_f32(Backend*, float* out, const float* inp, const int32_t* dest, int n);
void cuda_unpermute_fwd(Backend*, void* out, const void* yp, const int32_t* dest, int N, int k, int H,
                        const void* add);
void cuda_unpermute_bwd(Backend*, void* dyp, const void* dout, const int32_t* dest, int N, int k, int H);
void cuda_swiglu_fwd(Backend*, void* h, const void* gu, const float* scale, int n, int F);
void cuda_swiglu_bwd(Backend*, void* dgu, float* dscale, const void* dh, const void* gu, const float* scale,
                     int n, int F);
// cuda_loss.cu
void cuda_cross_entropy(Backend*, void* logits, float* loss, const int32_t* targets, int n, int V,
                        float grad_scale);
// cuda_optim.cu
void cuda_adamw(Backend*, const AdamWDesc* d, float* master, void* param, float* m, float* v, const void* grad, size_t n);
void cuda_adamw_split(Backend*, const AdamWDesc* d, uint16_t* w, int16_t* rem, float* m, float* v, const void* grad,
                      size_t n);
void cuda_split_pack(Backend*, uint16_t* w, int16_t* rem, const float* x, size_t n);
void cuda_split_unpack(Backend*, float* x, const uint16_t* w, const int16_t* rem, size_t n);
// cuda_backend.cu: C = beta·C on a [M, N] matrix with row stride ldc (the K = 0 / alpha = 0 GEMM)
void cuda_scale_matrix(Backend*, void* C, int c_f32, int M, int N, int ldc, float beta);
