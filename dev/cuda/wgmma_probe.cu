// wgmma_probe.cu — checks each wgmma form the attention kernels use (wgmma.cuh) against a
// host product on one small problem: D[64 × N] = A[64 × 64] · B[64 × N] in bf16 → fp32, through
//   ss_k   A and B from SW128 tiles, both K-major (B stored as [N][64]: S = Q·Kᵀ)
//   rs_k   A from registers (the accumulator → A-fragment packing), B K-major
//   rs_mn  A from registers, B MN-major (B stored as [64][N]: O = P·V), the layout the kernels use
//   ss_mn  A and B from SW128 tiles, both MN-major (A stored as [64 k][64 m], B as [64][N]:
//          dQ = dS·K with dS stored transposed)
// for N = 64 and 128. Also whether acc = 0 overwrites (the output starts as NaN). Each form's line
// is printed as soon as it ran: a form that faults ends the process (the error is sticky).
// Not part of moetrain: built by `make dev` into dev/test_wgmma_probe, for bringing up wgmma forms
// (a new operand layout, a new GPU) before a kernel uses them.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wgmma.cuh"

enum { PK = 64 };  // the probe's K

// mode 0 ss_k, 1 rs_k, 2 rs_mn, 3 ss_mn (At = A transposed, [K][64])
template <int N>
__global__ void __launch_bounds__(128) k_wg_probe(float* out, const bf16* A, const bf16* At, const bf16* Bkn,
                                                  const bf16* Bnk, int mode) {
    __shared__ __align__(1024) unsigned char sm[64 * PK * 2 + PK * N * 2];
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, c4 = lane & 3;
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(sm), sb = sa + 64 * PK * 2;
    if (mode == 3) wg_load_tile<PK, 64, 128>(sa, At, 64, 0, PK, tid);  // [K][M]
    else wg_load_tile<64, PK, 128>(sa, A, PK, 0, 64, tid);
    if (mode == 0 || mode == 1) wg_load_tile<N, PK, 128>(sb, Bnk, PK, 0, N, tid);  // [N][K]
    else wg_load_tile<PK, N, 128>(sb, Bkn, N, 0, PK, tid);                         // [K][N]
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
    wg_fence_smem();
    __syncthreads();
    float d[N / 2];
    for (int i = 0; i < N / 2; i++) d[i] = __int_as_float(0x7fc00000);  // NaN: acc = 0 must overwrite
    wg_arrive();
    for (int kk = 0; kk < PK / 16; kk++) {
        if (mode == 0) {
            wg_ss<N>(d, wg_desc_k(sa, 64, 0, kk), wg_desc_k(sb, N, 0, kk), kk > 0);
        } else if (mode == 3) {
            wg_ss<N, 1, 1>(d, wg_desc_mn(sa, PK, kk), wg_desc_mn(sb, PK, kk), kk > 0);
        } else {
            // A fragment straight from global memory (rows 16w + g, + 8; cols 16kk + 2c, + 8)
            uint32_t a[4];
            const int r = 16 * w + g, c0 = 16 * kk + 2 * c4;
            a[0] = *(const uint32_t*)(A + r * PK + c0);
            a[1] = *(const uint32_t*)(A + (r + 8) * PK + c0);
            a[2] = *(const uint32_t*)(A + r * PK + c0 + 8);
            a[3] = *(const uint32_t*)(A + (r + 8) * PK + c0 + 8);
            uint64_t db;
            if (mode == 1) db = wg_desc_k(sb, N, 0, kk);
            else db = wg_desc_mn(sb, PK, kk);
            if (mode == 1) wg_rs<N, 0>(d, a, db, kk > 0);
            else wg_rs<N, 1>(d, a, db, kk > 0);
        }
    }
    wg_commit();
    wg_wait<0>();
    wg_reg_fence<N / 2>(d);
    for (int j = 0; j < N / 8; j++) {
        const int r = 16 * w + g, c = 8 * j + 2 * c4;
        out[r * N + c] = d[4 * j], out[r * N + c + 1] = d[4 * j + 1];
        out[(r + 8) * N + c] = d[4 * j + 2], out[(r + 8) * N + c + 1] = d[4 * j + 3];
    }
}

static float bf_round(float x) { return __bfloat162float(__float2bfloat16(x)); }

template <int N>
static int probe_n(cudaStream_t st, char* rep, size_t cap, size_t* used) {
    const int na = 64 * PK, nb = PK * N;
    float *hA = (float*)malloc(4 * na), *hB = (float*)malloc(4 * nb), *hD = (float*)malloc(4 * 64 * N);
    bf16 *bA = (bf16*)malloc(2 * na), *bAT = (bf16*)malloc(2 * na), *bKN = (bf16*)malloc(2 * nb), *bNK = (bf16*)malloc(2 * nb);
    unsigned s = 12345u + N;
    for (int i = 0; i < na; i++) {
        s = s * 1664525u + 1013904223u;
        hA[i] = bf_round(((s >> 8) & 0xFFFF) / 32768.f - 1.f);
        bA[i] = __float2bfloat16(hA[i]);
        bAT[(i % PK) * 64 + i / PK] = bA[i];  // A is [64][PK]
    }
    for (int k = 0; k < PK; k++)
        for (int n = 0; n < N; n++) {
            s = s * 1664525u + 1013904223u;
            const float v = bf_round(((s >> 8) & 0xFFFF) / 32768.f - 1.f);
            hB[k * N + n] = v;
            bKN[k * N + n] = __float2bfloat16(v);
            bNK[n * PK + k] = __float2bfloat16(v);
        }
    bf16 *dA, *dAT, *dKN, *dNK;
    float* dD;
    CUDA_CK(cudaMalloc(&dA, 2 * na));
    CUDA_CK(cudaMalloc(&dAT, 2 * na));
    CUDA_CK(cudaMalloc(&dKN, 2 * nb));
    CUDA_CK(cudaMalloc(&dNK, 2 * nb));
    CUDA_CK(cudaMalloc(&dD, 4 * 64 * N));
    CUDA_CK(cudaMemcpy(dA, bA, 2 * na, cudaMemcpyHostToDevice));
    CUDA_CK(cudaMemcpy(dAT, bAT, 2 * na, cudaMemcpyHostToDevice));
    CUDA_CK(cudaMemcpy(dKN, bKN, 2 * nb, cudaMemcpyHostToDevice));
    CUDA_CK(cudaMemcpy(dNK, bNK, 2 * nb, cudaMemcpyHostToDevice));
    static const char* names[4] = {"ss_k", "rs_k", "rs_mn", "ss_mn"};
    int fails = 0;
    for (int mode = 0; mode < 4; mode++) {
        CUDA_CK(cudaMemsetAsync(dD, 0xFF, 4 * 64 * N, st));
        k_wg_probe<N><<<1, 128, 0, st>>>(dD, dA, dAT, dKN, dNK, mode);
        cudaError_t e = cudaStreamSynchronize(st);
        double num = 0, den = 0;
        if (e == cudaSuccess) {
            CUDA_CK(cudaMemcpy(hD, dD, 4 * 64 * N, cudaMemcpyDeviceToHost));
            for (int m = 0; m < 64; m++)
                for (int n = 0; n < N; n++) {
                    double ref = 0;
                    for (int k = 0; k < PK; k++) ref += (double)hA[m * PK + k] * hB[k * N + n];
                    const double x = hD[m * N + n];
                    num += isfinite(x) ? (x - ref) * (x - ref) : INFINITY;
                    den += ref * ref;
                }
        }
        const double rel = e == cudaSuccess ? sqrt(num / den) : INFINITY;
        const int ok = rel < 1e-5;
        if (!ok) fails++;
        const int n = snprintf(rep + *used, *used < cap ? cap - *used : 0, "wgmma %-6s n%-3d rel %.2e %s%s%s\n",
                               names[mode], N, rel, ok ? "ok" : "WRONG", e != cudaSuccess ? " " : "",
                               e != cudaSuccess ? cudaGetErrorString(e) : "");
        fputs(rep + *used, stdout);
        fflush(stdout);
        *used += (size_t)n;
        if (e != cudaSuccess) {  // a fault is sticky: nothing after it can run
            fprintf(stderr, "wgmma probe: %s faulted; stopping\n", names[mode]);
            exit(1);
        }
    }
    cudaFree(dA), cudaFree(dAT), cudaFree(dKN), cudaFree(dNK), cudaFree(dD);
    free(hA), free(hB), free(hD), free(bA), free(bAT), free(bKN), free(bNK);
    return fails;
}

// Returns the number of failed forms (-1: not an sm_90a build or not a Hopper GPU); report gets
// one line per form.
extern "C" int cuda_wgmma_selftest(Backend* be, char* report, size_t cap) {
    CudaImpl* c = CI(be);
    size_t used = 0;
    report[0] = 0;
#if defined(MOETRAIN_SM90A)
    if (c->cc_major != 9) {
        snprintf(report, cap, "wgmma: not a compute-capability-9.0 GPU\n");
        return -1;
    }
    int f = probe_n<64>(c->stream, report, cap, &used);
    f += probe_n<128>(c->stream, report, cap, &used);
    return f;
#else
    (void)c, (void)used;
    snprintf(report, cap, "wgmma: not built for sm_90a\n");
    return -1;
#endif
}
