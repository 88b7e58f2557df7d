// cuda_gemm_survey.cu — measurement tools for the bench, not ops: what cuBLASLt's heuristic
// candidates for one GEMM shape cost against each other (cuda_gemm_survey), and what the
// algorithm the step runs costs against its cluster-shape, swizzle and custom-option variants
// (cuda_gemm_survey_variants), and cuBLASLt's FP8 candidates at a shape, or its first pick's
// variants (cuda_gemm_survey_fp8).
// They time on the card's power limit when hot_ms > 0 and print one line per candidate;
// `gpu_bench survey KIND` (dev/gpu_bench.c) drives them. The plan comes from cuda_gemm.cu
// (gemm_shape_plan: the same descriptor, layouts and first pick as the step, tile table included).
#include <cuda_fp8.h>
#include <stdio.h>
#include <string.h>

#include "cuda_gemm.cuh"
#include "survey.h"

// ---- the heuristic's candidates for one plan, each timed ----------------------------------------
// pl: the descriptor and layouts (its algo unused); the products are C = alpha · (B as la)·(A as
// lb) + beta · C, as gemm_run issues them; M, N, K only label the line and count the FLOPs.
static void survey_plan(CudaImpl* c, const GemmShapePlan* pl, const void* A, const void* B, void* C, float alpha,
                        float beta, int M, int N, int K, int max_algos, const char* label, float hot_ms) {
    const GemmShapePlan p = *pl;
    cublasLtMatmulPreference_t pref;
    CUBLAS_CK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = c->lt_ws_bytes;
    CUBLAS_CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t res[16];
    int nres = 0;
    if (max_algos > 16) max_algos = 16;
    CUBLAS_CK(cublasLtMatmulAlgoGetHeuristic(c->lt, p.op, p.la, p.lb, p.lc, p.lc, pref, max_algos, res, &nres));
    cublasLtMatmulPreferenceDestroy(pref);
    cudaEvent_t e0, e1;
    CUDA_CK(cudaEventCreate(&e0));
    CUDA_CK(cudaEventCreate(&e1));
    // hot_ms > 0: the card at its power limit first (hot_ms · 3 of the first pick), then each
    // candidate back to back for hot_ms, timed over its second half, and the first pick once more
    // at the end (the drift of the card's state over the survey)
    auto run = [&](int i, int reps) {
        cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
        for (int r = 0; r < reps && s == CUBLAS_STATUS_SUCCESS; r++)
            s = cublasLtMatmul(c->lt, p.op, &alpha, B, p.la, A, p.lb, &beta, C, p.lc, C, p.lc, &res[i].algo, c->lt_ws,
                               c->lt_ws_bytes, c->stream);
        return s;
    };
    int per = 5;  // calls in hot_ms, from one timed call of the first pick
    if (hot_ms > 0 && nres > 0) {
        float one = 0;
        run(0, 1);
        CUDA_CK(cudaEventRecord(e0, c->stream));
        run(0, 1);
        CUDA_CK(cudaEventRecord(e1, c->stream));
        CUDA_CK(cudaEventSynchronize(e1));
        CUDA_CK(cudaEventElapsedTime(&one, e0, e1));
        per = (int)(hot_ms / (one > 0.01f ? one : 0.01f));
        if (per < 4) per = 4;
        run(0, 3 * per);
    }
    for (int j = 0; j <= nres; j++) {
        const int i = j == nres ? 0 : j;
        if (j == nres && hot_ms <= 0) break;
        int tile = 0, stages = 0, splitk = 0, swz = 0;
        uint16_t cluster = 0;  // cublasLtClusterShape_t, stored in 16 bits (a 4-byte read is refused)
        size_t w;
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                             sizeof cluster, &w);
        float ms = 0;
        const int reps = hot_ms > 0 ? per - per / 2 : 5;
        cublasStatus_t s = run(i, hot_ms > 0 ? per / 2 : 1);  // warm-up (hot: the first half)
        if (s == CUBLAS_STATUS_SUCCESS) {
            CUDA_CK(cudaEventRecord(e0, c->stream));
            s = run(i, reps);
        }
        CUDA_CK(cudaEventRecord(e1, c->stream));
        CUDA_CK(cudaEventSynchronize(e1));
        if (s == CUBLAS_STATUS_SUCCESS) CUDA_CK(cudaEventElapsedTime(&ms, e0, e1));
        ms /= reps;
        printf("survey%s %-22s M%-6d N%-6d K%-6d #%-2d tile %3d stages %3d splitk %2d swz %d cluster %2u  %8.3f ms %6.1f "
               "TFLOP/s%s%s\n",
               hot_ms > 0 ? " hot" : "", label, M, N, K, i, tile, stages, splitk, swz, (unsigned)cluster, ms,
               s ? 0.0 : 2.0 * M * N * K / ms / 1e9, s ? " (refused)" : "", j == nres ? " (first pick again)" : "");
    }
    fflush(stdout);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

// The heuristic's candidates for one GEMM of the step (bf16 or fp32, the step's descriptor).
extern "C" void cuda_gemm_survey(Backend* be, const GemmDesc* d, const void* A, const void* B, void* C, int max_algos,
                                 const char* label, float hot_ms) {
    GemmShapePlan p;
    gemm_shape_plan(be, d, &p);  // the layouts and descriptor as the step builds them
    survey_plan(CI(be), &p, A, B, C, d->alpha, d->beta, d->M, d->N, d->K, max_algos, label, hot_ms);
    gemm_shape_plan_release(&p);
}

// FP8: Y[M,N] = X[M,K]·W[N,K]ᵀ with X and W in e4m3, fp32 accumulation, Y in bf16: cuBLASLt's FP8
// on Hopper, which takes only this layout (both operands K-major). scale: FP8_SURVEY_TENSOR, one
// scale of 1 an operand; FP8_SURVEY_BLK, W in 128×128 blocks and X in 1×128 tiles (the step's
// forward and data gradients, cuda_fp8.cu); FP8_SURVEY_VEC, both in 1×128 tiles (the step's weight
// gradients, K being a group's rows). Block scales are 1 too: their layout, not their values, is
// what the kernels read differently. A [M,K] and B [N,K] are bf16 (random), cast to e4m3 here;
// C [M,N] bf16.
__global__ void k_bf16_to_e4m3(__nv_fp8_e4m3* y, const bf16* x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __nv_fp8_e4m3(__bfloat162float(x[i]));
}

__global__ void k_fill_f32(float* y, float v, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) y[i] = v;
}

static void survey_variants_plan(CudaImpl* c, GemmShapePlan& p, const void* A, const void* B, void* C, float alpha,
                                 float beta, int M, int N, int K, const char* label, float hot_ms);

// max_algos 0: the variants of the heuristic's first pick (cuda_gemm_survey_variants, below) instead.
extern "C" void cuda_gemm_survey_fp8(Backend* be, int M, int N, int K, const void* A, const void* B, void* C,
                                     int scale, int max_algos, const char* label, float hot_ms) {
    CudaImpl* c = CI(be);
    const size_t na = (size_t)M * K, nb = (size_t)N * K;
    const size_t kt = (size_t)(K + 127) / 128, ns = scale == FP8_SURVEY_TENSOR ? 1 : kt * (M > N ? M : N) + 4 * kt * N;
    __nv_fp8_e4m3 *a8, *b8;
    float* one;  // every scale 1 (ns of them: enough for either block layout)
    CUDA_CK(cudaMalloc(&a8, na));
    CUDA_CK(cudaMalloc(&b8, nb));
    CUDA_CK(cudaMalloc(&one, ns * sizeof(float)));
    k_fill_f32<<<256, 256, 0, c->stream>>>(one, 1.0f, ns);
    k_bf16_to_e4m3<<<1024, 256, 0, c->stream>>>(a8, (const bf16*)A, na);
    k_bf16_to_e4m3<<<1024, 256, 0, c->stream>>>(b8, (const bf16*)B, nb);
    GemmShapePlan p;
    const cublasOperation_t tr = CUBLAS_OP_T, nt = CUBLAS_OP_N;
    CUBLAS_CK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof tr));
    CUBLAS_CK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt));
    CUBLAS_CK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &one, sizeof one));
    CUBLAS_CK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &one, sizeof one));
    if (scale != FP8_SURVEY_TENSOR) {  // cuBLASLt's A is W, its B is X
        const int32_t ma = scale == FP8_SURVEY_BLK ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                                   : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
                      mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        CUBLAS_CK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma));
        CUBLAS_CK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb));
    }
    CUBLAS_CK(cublasLtMatrixLayoutCreate(&p.la, CUDA_R_8F_E4M3, K, N, K));  // W: column-major K × N, op T
    CUBLAS_CK(cublasLtMatrixLayoutCreate(&p.lb, CUDA_R_8F_E4M3, K, M, K));  // X: column-major K × M
    CUBLAS_CK(cublasLtMatrixLayoutCreate(&p.lc, CUDA_R_16BF, N, M, N));     // Y: column-major N × M
    if (max_algos > 0) {
        survey_plan(c, &p, a8, b8, C, 1.0f, 0.0f, M, N, K, max_algos, label, hot_ms);
    } else {
        cublasLtMatmulPreference_t pref;
        CUBLAS_CK(cublasLtMatmulPreferenceCreate(&pref));
        const uint64_t ws = c->lt_ws_bytes;
        CUBLAS_CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
        cublasLtMatmulHeuristicResult_t res;
        int nres = 0;
        CUBLAS_CK(cublasLtMatmulAlgoGetHeuristic(c->lt, p.op, p.la, p.lb, p.lc, p.lc, pref, 1, &res, &nres));
        cublasLtMatmulPreferenceDestroy(pref);
        if (nres > 0) {
            p.algo = res.algo;
            survey_variants_plan(c, p, a8, b8, C, 1.0f, 0.0f, M, N, K, label, hot_ms);
        }
    }
    gemm_shape_plan_release(&p);
    CUDA_CK(cudaStreamSynchronize(c->stream));
    cudaFree(a8), cudaFree(b8), cudaFree(one);
}

// Variants of the plan's own pick (the algorithm gemm_run uses, tile table included): the same
// algorithm with another thread-block cluster shape, CTA swizzling or custom option, where
// cublasLtMatmulAlgoCheck accepts it; each timed back to back for hot_ms at the card's power limit
// (after 3·hot_ms of the pick), the pick itself first and last. One line per variant. The heuristic
// returns each candidate with these fields set one way (on the H200 the picks run on clusters of
// 1 × 2 or 2 × 1), so the survey above never times the other settings.
static void survey_variants_plan(CudaImpl* c, GemmShapePlan& p, const void* A, const void* B, void* C, float alpha,
                                 float beta, int M, int N, int K, const char* label, float hot_ms) {
    enum { VMAX = 24 };
    cublasLtMatmulAlgo_t v[VMAX];
    char vname[VMAX][40];
    int nv = 0;
    v[nv] = p.algo;
    snprintf(vname[nv++], sizeof vname[0], "the pick");
    uint32_t swz_ok = 0, cmax = 0;
    size_t w;
    cublasLtMatmulAlgoCapGetAttribute(&p.algo, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swz_ok, sizeof swz_ok, &w);
    cublasLtMatmulAlgoCapGetAttribute(&p.algo, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &cmax, sizeof cmax, &w);
    int tile = -1, algo_id = -1;
    uint16_t cl0 = 0;
    uint32_t swz0 = 0, cust0 = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&p.algo, CUBLASLT_ALGO_CONFIG_ID, &algo_id, sizeof algo_id, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&p.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&p.algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cl0, sizeof cl0, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&p.algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz0, sizeof swz0, &w);
    cublasLtMatmulAlgoConfigGetAttribute(&p.algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &cust0, sizeof cust0, &w);
    printf("variants %-14s M%-6d N%-6d K%-6d algo %d tile %d cluster %u swizzle %u (supported %u) custom %u (max %u)\n",
           label, M, N, K, algo_id, tile, cl0, swz0, swz_ok, cust0, cmax);
    auto try_add = [&](cublasLtMatmulAlgo_t a, const char* name) {
        cublasLtMatmulHeuristicResult_t r;
        if (nv < VMAX && cublasLtMatmulAlgoCheck(c->lt, p.op, p.la, p.lb, p.lc, p.lc, &a, &r) == CUBLAS_STATUS_SUCCESS &&
            r.workspaceSize <= c->lt_ws_bytes) {
            v[nv] = a;
            snprintf(vname[nv++], sizeof vname[0], "%s", name);
        }
    };
    const struct { uint16_t id; const char* name; } cl[] = {
        {CUBLASLT_CLUSTER_SHAPE_1x1x1, "cluster 1x1"}, {CUBLASLT_CLUSTER_SHAPE_2x1x1, "cluster 2x1"},
        {CUBLASLT_CLUSTER_SHAPE_1x2x1, "cluster 1x2"}, {CUBLASLT_CLUSTER_SHAPE_2x2x1, "cluster 2x2"},
        {CUBLASLT_CLUSTER_SHAPE_4x1x1, "cluster 4x1"}, {CUBLASLT_CLUSTER_SHAPE_1x4x1, "cluster 1x4"},
    };
    for (size_t i = 0; i < sizeof cl / sizeof cl[0]; i++) {
        if (cl[i].id == cl0) continue;
        cublasLtMatmulAlgo_t a = p.algo;
        if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cl[i].id, sizeof cl[i].id) ==
            CUBLAS_STATUS_SUCCESS)
            try_add(a, cl[i].name);
    }
    if (swz_ok) {
        cublasLtMatmulAlgo_t a = p.algo;
        const uint32_t s1 = !swz0;
        if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &s1, sizeof s1) ==
            CUBLAS_STATUS_SUCCESS)
            try_add(a, s1 ? "swizzle 1" : "swizzle 0");
    }
    for (uint32_t o = 0; o <= cmax && o < 8; o++) {
        if (o == cust0) continue;
        cublasLtMatmulAlgo_t a = p.algo;
        char nm[40];
        snprintf(nm, sizeof nm, "custom %u", o);
        if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &o, sizeof o) ==
            CUBLAS_STATUS_SUCCESS)
            try_add(a, nm);
    }
    cudaEvent_t e0, e1;
    CUDA_CK(cudaEventCreate(&e0));
    CUDA_CK(cudaEventCreate(&e1));
    auto run = [&](const cublasLtMatmulAlgo_t* a, int reps) {
        cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
        for (int r = 0; r < reps && s == CUBLAS_STATUS_SUCCESS; r++)
            s = cublasLtMatmul(c->lt, p.op, &alpha, B, p.la, A, p.lb, &beta, C, p.lc, C, p.lc, a, c->lt_ws,
                               c->lt_ws_bytes, c->stream);
        return s;
    };
    float one = 0;
    run(&v[0], 1);
    CUDA_CK(cudaEventRecord(e0, c->stream));
    run(&v[0], 1);
    CUDA_CK(cudaEventRecord(e1, c->stream));
    CUDA_CK(cudaEventSynchronize(e1));
    CUDA_CK(cudaEventElapsedTime(&one, e0, e1));
    int per = (int)(hot_ms / (one > 0.01f ? one : 0.01f));
    if (per < 4) per = 4;
    run(&v[0], 3 * per);
    for (int j = 0; j <= nv; j++) {
        const int i = j == nv ? 0 : j;
        const int reps = per - per / 2;
        float ms = 0;
        cublasStatus_t s = run(&v[i], per / 2);
        if (s == CUBLAS_STATUS_SUCCESS) {
            CUDA_CK(cudaEventRecord(e0, c->stream));
            s = run(&v[i], reps);
        }
        CUDA_CK(cudaEventRecord(e1, c->stream));
        CUDA_CK(cudaEventSynchronize(e1));
        if (s == CUBLAS_STATUS_SUCCESS) CUDA_CK(cudaEventElapsedTime(&ms, e0, e1));
        ms /= reps;
        printf("variant hot %-14s M%-6d N%-6d K%-6d %-14s %8.3f ms %6.1f TFLOP/s%s%s\n", label, M, N, K, vname[i], ms,
               s ? 0.0 : 2.0 * M * N * K / ms / 1e9, s ? " (refused)" : "", j == nv ? " (again)" : "");
    }
    fflush(stdout);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

extern "C" void cuda_gemm_survey_variants(Backend* be, const GemmDesc* d, const void* A, const void* B, void* C,
                                          const char* label, float hot_ms) {
    GemmShapePlan p;
    gemm_shape_plan(be, d, &p);
    survey_variants_plan(CI(be), p, A, B, C, d->alpha, d->beta, d->M, d->N, d->K, label, hot_ms);
    gemm_shape_plan_release(&p);
}
