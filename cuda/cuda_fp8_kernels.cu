// cuda_fp8_kernels.cu — the FP8 GEMMs' own kernels (cuda_fp8.cu decides when they run): the
// fallback GEMM where cuBLASLt's block-scaled FP8 does not run, the fp32 epilogue that rounds
// C = alpha · r + beta · addend once, and the gather of 8 rows' scales for a product's tail.
//
// k_fp8_gemm (mma.sync m16n8k32 e4m3 → fp32, sm_89+): per K tile the tensor-core partial P_t, then
// acc = fl(acc + fl(fl(sa · sb) · P_t)) in the spec's order, then the epilogue. It runs where the
// shape is not cuBLASLt's (N % 8 ≠ 0, or fewer than 8 rows), on GPUs other than sm_90, where
// cuBLASLt has no algorithm, and whenever the path is forced (tests: cuda_fp8_set_path).
#include <cuda_fp8.h>

#include "cuda_fp8.cuh"

// ---- the fallback GEMM: mma.sync m16n8k32 e4m3 ----------------------------------------------------
// C[r, j] for r in [row0, M), j in [0, N) = alpha · Σ_t fl(fl(sa·sb) · P_t) (+ beta · addend), from
// qa [M, ldq] and qb [N, ldq] (zero codes from K up to ldq). A block: 4 warps, 16 rows × 128
// columns; a warp 16 × 32 (four n8 tiles). Operands straight from global memory (L1/L2): the tails
// and the odd shapes it serves are small, and the tests use it as a second opinion.
enum { FB_WARPS = 4, FB_BM = 16, FB_BN = 32 * FB_WARPS };

// One m16n8k32 e4m3 tensor-core step of a warp, d += a·b, in the PTX ISA's fragment layout (a0..a3:
// rows g and g + 8, k 4·tg.. and 16 + 4·tg..; b0, b1: column g, the same k; d: rows g, g + 8,
// columns 2·tg, 2·tg + 1; g = lane / 4, tg = lane % 4). A tile's partial P_t is summed in mma_acc:
// the tensor core's fp32 here; tests/host_cuda/cuda_host.h brings its own step, whose double keeps P_t exact.
#if defined(CUDA_HOST_RUN) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890)
#define FP8_MMA_OK 1  // the device code has FP8 tensor cores to run on (or the host stand-in runs it)
#else
#define FP8_MMA_OK 0
#endif
#ifndef CUDA_HOST_RUN
typedef float mma_acc;
__device__ __forceinline__ void mma_e4m3(mma_acc (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
#if FP8_MMA_OK
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}
#endif

__device__ __forceinline__ uint32_t ld_code4(const uint8_t* p, int row, int rows, int k, int K, size_t ld) {
    return (row < rows && k < K) ? __ldg((const uint32_t*)(p + (size_t)row * ld + k)) : 0u;
}

template <typename TC>
__global__ void __launch_bounds__(32 * FB_WARPS) k_fp8_gemm(int row0, int M, int N, int K, const uint8_t* __restrict__ qa,
                                                            SMap sa, const uint8_t* __restrict__ qb, SMap sb, size_t ldq,
                                                            float alpha, float beta, const TC* addend, TC* C, size_t ldc) {
#if FP8_MMA_OK
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tg = lane & 3;
    const int rb = row0 + blockIdx.y * FB_BM, nb = blockIdx.x * FB_BN + warp * 32;
    const int Kt = (K + TILE - 1) / TILE;
    float acc[4][4];
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0.f;
    const int ra = rb + g, rb8 = rb + g + 8;
    for (int t = 0; t < Kt; t++) {
        mma_acc p[4][4];
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) p[j][e] = 0.f;
#pragma unroll
        for (int ks = 0; ks < TILE / 32; ks++) {  // unrolled: the four steps' loads in flight together
            const int k = t * TILE + ks * 32;
            if (k >= K) continue;
            const int ka = k + tg * 4, kb = k + 16 + tg * 4;
            const uint32_t a0 = ld_code4(qa, ra, M, ka, K, ldq), a1 = ld_code4(qa, rb8, M, ka, K, ldq);
            const uint32_t a2 = ld_code4(qa, ra, M, kb, K, ldq), a3 = ld_code4(qa, rb8, M, kb, K, ldq);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int col = nb + j * 8 + g;
                mma_e4m3(p[j], a0, a1, a2, a3, ld_code4(qb, col, N, ka, K, ldq), ld_code4(qb, col, N, kb, K, ldq));
            }
        }
        // promotion: the spec's order, no fused multiply-add
        const float s0 = ra < M ? smap_get(sa, ra, t) : 0.f, s1 = rb8 < M ? smap_get(sa, rb8, t) : 0.f;
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = nb + j * 8 + tg * 2 + (e & 1);
                if (col >= N) continue;
                const float w = __fmul_rn(e < 2 ? s0 : s1, smap_get(sb, col, t));
                acc[j][e] = __fadd_rn(acc[j][e], __fmul_rn(w, (float)p[j][e]));
            }
    }
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int row = e < 2 ? ra : rb8, col = nb + j * 8 + tg * 2 + (e & 1);
            if (row >= M || col >= N) continue;
            float v = alpha == 1.f ? acc[j][e] : __fmul_rn(alpha, acc[j][e]);
            if (beta != 0.f) v = __fadd_rn(v, __fmul_rn(beta, to_f(addend[(size_t)row * ldc + col])));
            C[(size_t)row * ldc + col] = from_f<TC>(v);
        }
#else
    __trap();  // built without FP8 tensor-core code (cuda_fp8_kernels_built keeps it from being launched)
#endif
}

// 1 when the fallback kernel was compiled with its FP8 code for the current device: a build for
// sm_80 or sm_86 also runs on a compute-capability-8.9 GPU, but its k_fp8_gemm is empty there.
extern "C" int cuda_fp8_kernels_built(void) {
    cudaFuncAttributes a;
    return cudaFuncGetAttributes(&a, k_fp8_gemm<float>) == cudaSuccess && a.binaryVersion >= 89;
}

// ---- epilogue: C = alpha · r + beta · addend, r fp32 [rows, N] packed -----------------------------
// A block row of threads walks the columns of rows blockIdx.y, blockIdx.y + gridDim.y, ...
template <typename TC>
__global__ void k_epilogue(const float* __restrict__ r, int rows, int N, float alpha, float beta, const TC* addend,
                           TC* C, size_t ldc) {
    for (int row = blockIdx.y; row < rows; row += gridDim.y) {
        const float* rr = r + (size_t)row * N;
        const TC* ar = addend + (size_t)row * ldc;
        TC* cr = C + (size_t)row * ldc;
        for (int col = blockIdx.x * blockDim.x + threadIdx.x; col < N; col += gridDim.x * blockDim.x) {
            float v = alpha == 1.f ? rr[col] : __fmul_rn(alpha, rr[col]);
            if (beta != 0.f) v = __fadd_rn(v, __fmul_rn(beta, to_f(ar[col])));
            cr[col] = from_f<TC>(v);
        }
    }
}
void fp8_epilogue(Backend* be, const float* r, int rows, int N, float alpha, float beta, const void* addend, void* C,
                  size_t ldc, int c_f32) {
    if (rows == 0 || N == 0) return;
    const dim3 grid((unsigned)cdiv(N, 256 * 4), (unsigned)(rows < 65535 ? rows : 65535));  // four columns a thread
    if (c_f32)
        KLAUNCH(grid, 256, ST(be), k_epilogue<float>, r, rows, N, alpha, beta, (const float*)addend, (float*)C, ldc);
    else
        KLAUNCH(grid, 256, ST(be), k_epilogue<bf16>, r, rows, N, alpha, beta, (const bf16*)addend, (bf16*)C, ldc);
    LAUNCH_CK(CI(be));
}

// ---- the tail product's scales: rows r0 .. r0 + 7 of a VEC128 map as [Kt, 8] ---------------------
__global__ void k_gather_scales(SMap sm, int r0, float* __restrict__ out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;  // t · 8 + row
    if (i < sm.Kt * 8) out[i] = smap_get(sm, r0 + (i & 7), i >> 3);
}
void fp8_gather_scales(Backend* be, SMap sm, int r0, float* out) {
    KLAUNCH(cdiv(sm.Kt * 8, 256), 256, ST(be), k_gather_scales, sm, r0, out);
    LAUNCH_CK(CI(be));
}

void fp8_fallback_gemm(Backend* be, int row0, int M, int N, int K, const uint8_t* qa, SMap sa, const uint8_t* qb, SMap sb,
                       size_t ldq, float alpha, float beta, const void* addend, void* C, size_t ldc, int c_f32) {
    CudaImpl* c = CI(be);
    const dim3 grid((unsigned)cdiv(N, FB_BN), (unsigned)cdiv(M - row0, FB_BM));
    if (c_f32)
        KLAUNCH(grid, 32 * FB_WARPS, c->stream, k_fp8_gemm<float>, row0, M, N, K, qa, sa, qb, sb, ldq, alpha, beta,
                (const float*)addend, (float*)C, ldc);
    else
        KLAUNCH(grid, 32 * FB_WARPS, c->stream, k_fp8_gemm<bf16>, row0, M, N, K, qa, sa, qb, sb, ldq, alpha, beta,
                (const bf16*)addend, (bf16*)C, ldc);
    LAUNCH_CK(c);
    c->fp8_fb_calls++;
}
