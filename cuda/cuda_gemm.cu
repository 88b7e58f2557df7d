// cuda_gemm.cu — the GEMMs through cuBLASLt: C = alpha · op(A) · op(B) + beta · C (GemmDesc in
// backend.h), the grouped expert GEMM and the grouped weight gradient.
//
// Row-major ↔ column-major: a row-major [r, c] matrix with row stride ld is a column-major
// [c, r] matrix with leading dimension ld, so C = op(A) op(B) row-major is Cᵀ = op(B)ᵀ op(A)ᵀ
// column-major: cuBLASLt's "A" is our B, its "B" our A, and m = N, n = M, k = K.
//
// Types: bf16 act → A/B CUDA_R_16BF, C bf16 or fp32 (c_f32); fp32 act → everything CUDA_R_32F.
// Compute is CUBLAS_COMPUTE_32F always (no TF32), scale type fp32, alpha/beta on the host.
//
// Plans (matmul descriptor, three layouts, the heuristic's algorithm) are cached by shape in a
// small open-addressing table and built once per shape. The expert GEMMs have a row count that
// changes every step, so their plans are keyed by that dimension rounded up (the heuristic runs at
// the rounded size; each call sets the exact rows/cols on the cached layouts, which is a
// host-side attribute write). Should cuBLASLt refuse the cached algorithm at the exact size, an
// exact-size plan is built and cached instead. The rounding: above 1,024 rows up to a multiple of
// 1/32 of the power of two below (8,193..16,384 → multiples of 256, 4,097..8,192 → of 128), so the
// heuristic sees the real size within 3% and offers tiles sized to the rows there; at most 32 plans
// per octave and shape, the same plan for a row count in every run. Up to 1,024 rows, and once half
// the plan cache is used, up to a power of two (which bounds the count).
//
// Each plan runs on the heuristic's first pick, or on the tile table's tile (below; gpu.gemm_tiles).
// gpu.gemm_log prints every plan as it is built. The surveys of cuBLASLt's candidates are in
// dev/cuda/cuda_gemm_survey.cu (`make dev`); gemm_shape_plan (at the end) builds their plans.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_gemm.cuh"

enum { CACHE_CAP = 2048 };  // plans; a run uses a few dozen to a few hundred (the expert GEMMs' row counts)
enum { GEMM_CANDIDATES = 8 };  // candidates asked of the heuristic when a tile is preferred

typedef struct GemmKey {
    int M, N, K;          // the plan's dims (a dynamic one rounded up)
    int ta, tb;
    int lda, ldb, ldc;
    int c_f32, bf16;      // output fp32; inputs bf16
    int align;            // min pointer alignment of A, B, C in bytes (≤ 16)
    int dyn;              // 0 exact, 1 = M rounded, 2 = K rounded
} GemmKey;

typedef struct GemmPlan {
    GemmKey key;
    int used;
    int cur_M, cur_K;     // dims the layouts currently describe
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;  // cuBLASLt's A (our B), B (our A), C/D
    cublasLtMatmulAlgo_t algo;          // the one in use
} GemmPlan;

// Tile preferences: a plan with trans_a ta and trans_b tb whose fixed dims (X, Y) — (N, K) for
// ta = 0, (M, N) for ta = 1: the dims an expert GEMM does not vary — match takes the heuristic's
// first candidate with that cuBLASLt tile id (cublasLtMatmulTile_t), where there is one; else
// the first pick. The table (bf16 on compute capability 9.0; gpu.gemm_tiles = heuristic turns it
// off) holds what the hot survey (dev/gpu_bench survey hot / hotdense: each candidate back to back
// at the card's power limit) found and the training step confirmed for Mixtral-8x7B on the H200
// (docs/performance.md):
//   - the w13 forward on 176 × 128 tiles (697 against the first pick's 674 TFLOP/s at 8,192 rows),
//     its weight gradient on 128 × 160 (688 against 678);
//   - the o projection's forward and data gradient on 128 × 160 (the hot survey: +4 to +13%).
// The fused q/k/v GEMM and the lm_head take the heuristic's first pick: the survey's better tiles
// for them changed nothing in the step.
typedef struct TilePref { int ta, tb, x, y, tile; } TilePref;
static const TilePref k_tile_pref_sm90[] = {
    {0, 1, 28672, 4096, 201},  // w13 forward x·w13ᵀ, 2F = 28,672, H = 4,096: CUBLASLT_MATMUL_TILE_176x128
    {1, 0, 28672, 4096, 29},   // w13 weight gradient d(gate|up)ᵀ·x: CUBLASLT_MATMUL_TILE_128x160
    {0, 1, 4096, 4096, 29},    // o forward (the survey's q/o shape): 128x160
    {0, 0, 4096, 4096, 29},    // o data gradient: 128x160
};

struct GemmCache {
    GemmPlan slot[CACHE_CAP];
    int used;
};

struct GemmCache* gemm_cache_create(void) { return (struct GemmCache*)xcalloc(1, sizeof(struct GemmCache)); }

void gemm_cache_destroy(struct GemmCache* g) {
    if (!g) return;
    for (int i = 0; i < CACHE_CAP; i++) {
        GemmPlan* p = &g->slot[i];
        if (!p->used) continue;
        cublasLtMatrixLayoutDestroy(p->la);
        cublasLtMatrixLayoutDestroy(p->lb);
        cublasLtMatrixLayoutDestroy(p->lc);
        cublasLtMatmulDescDestroy(p->op);
    }
    free(g);
}

static uint64_t key_hash(const GemmKey* k) {
    const unsigned char* p = (const unsigned char*)k;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static int round_pow2(int x) {
    int r = 1;
    while (r < x) r <<= 1;
    return r;
}

// Layout dims for the current M, K (N never changes within a plan).
static void set_dims(GemmPlan* p, int M, int K) {
    const GemmKey* k = &p->key;
    uint64_t ar = k->tb ? K : k->N, ac = k->tb ? k->N : K;  // our B as cuBLASLt's A
    uint64_t br = k->ta ? M : K, bc = k->ta ? K : M;        // our A as cuBLASLt's B
    uint64_t cr = k->N, cc = M;
    CUBLAS_CK(cublasLtMatrixLayoutSetAttribute(p->la, CUBLASLT_MATRIX_LAYOUT_ROWS, &ar, sizeof ar));
    CUBLAS_CK(cublasLtMatrixLayoutSetAttribute(p->la, CUBLASLT_MATRIX_LAYOUT_COLS, &ac, sizeof ac));
    CUBLAS_CK(cublasLtMatrixLayoutSetAttribute(p->lb, CUBLASLT_MATRIX_LAYOUT_ROWS, &br, sizeof br));
    CUBLAS_CK(cublasLtMatrixLayoutSetAttribute(p->lb, CUBLASLT_MATRIX_LAYOUT_COLS, &bc, sizeof bc));
    CUBLAS_CK(cublasLtMatrixLayoutSetAttribute(p->lc, CUBLASLT_MATRIX_LAYOUT_ROWS, &cr, sizeof cr));
    CUBLAS_CK(cublasLtMatrixLayoutSetAttribute(p->lc, CUBLASLT_MATRIX_LAYOUT_COLS, &cc, sizeof cc));
    p->cur_M = M;
    p->cur_K = K;
}

// The preferred tile for the plan's key, or -1 (the table: bf16 on compute capability 9.0, unless
// gpu.gemm_tiles = heuristic).
static int tile_pref(const CudaImpl* c, const GemmKey* k) {
    if (c->opt.gemm_tiles != GPU_TILES_TUNED || !(k->bf16 && c->cc_major == 9)) return -1;
    for (size_t i = 0; i < sizeof k_tile_pref_sm90 / sizeof k_tile_pref_sm90[0]; i++) {
        const TilePref* t = &k_tile_pref_sm90[i];
        if (t->ta == k->ta && t->tb == k->tb && t->x == (k->ta ? k->M : k->N) && t->y == (k->ta ? k->N : k->K))
            return t->tile;
    }
    return -1;
}

static void plan_build(CudaImpl* c, GemmPlan* p, const GemmKey* k) {
    memset(p, 0, sizeof *p);
    p->key = *k;
    p->used = 1;
    const cudaDataType_t ab = k->bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cudaDataType_t ct = (k->bf16 && !k->c_f32) ? CUDA_R_16BF : CUDA_R_32F;
    CUBLAS_CK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t opa = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A = our B
    const cublasOperation_t opb = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B = our A
    CUBLAS_CK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CUBLAS_CK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    const int M = k->M, N = k->N, K = k->K;
    CUBLAS_CK(cublasLtMatrixLayoutCreate(&p->la, ab, k->tb ? K : N, k->tb ? N : K, k->ldb));
    CUBLAS_CK(cublasLtMatrixLayoutCreate(&p->lb, ab, k->ta ? M : K, k->ta ? K : M, k->lda));
    CUBLAS_CK(cublasLtMatrixLayoutCreate(&p->lc, ct, N, M, k->ldc));
    p->cur_M = M;
    p->cur_K = K;

    cublasLtMatmulPreference_t pref;
    CUBLAS_CK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = c->lt_ws_bytes;
    const uint32_t al = (uint32_t)k->align;
    CUBLAS_CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    CUBLAS_CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al));
    CUBLAS_CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al));
    CUBLAS_CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al));
    CUBLAS_CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al));
    cublasLtMatmulHeuristicResult_t res[GEMM_CANDIDATES];
    int nres = 0;
    const int want = tile_pref(c, k);
    struct timespec h0, h1;  // the heuristic's host time, for the plan log
    clock_gettime(CLOCK_MONOTONIC, &h0);
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->la, p->lb, p->lc, p->lc, pref,
                                                      want >= 0 ? GEMM_CANDIDATES : 1, res, &nres);
    clock_gettime(CLOCK_MONOTONIC, &h1);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS || nres == 0)
        FATAL("cuBLASLt has no algorithm for the GEMM M=%d N=%d K=%d trans_a=%d trans_b=%d lda=%d ldb=%d ldc=%d "
              "(%s inputs, %s output, %d-byte aligned): %s; check the model dimensions (multiples of 8 are safest)",
              M, N, K, k->ta, k->tb, k->lda, k->ldb, k->ldc, k->bf16 ? "bf16" : "fp32",
              ct == CUDA_R_16BF ? "bf16" : "fp32", k->align, cublasLt_status_name(s));
    p->algo = res[0].algo;
    for (int i = 0; want >= 0 && i < nres; i++) {
        int tile = -1;
        size_t w;
        cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
        if (tile == want && res[i].state == CUBLAS_STATUS_SUCCESS) {
            p->algo = res[i].algo;
            break;
        }
    }
    if (c->opt.gemm_log) {  // every plan: the tile it runs on, and the heuristic's first pick
        int t0 = -1, t = -1;
        size_t w;
        cublasLtMatmulAlgoConfigGetAttribute(&res[0].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &t0, sizeof t0, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &t, sizeof t, &w);
        const double us = (h1.tv_sec - h0.tv_sec) * 1e6 + (h1.tv_nsec - h0.tv_nsec) * 1e-3;
        fprintf(stderr, "gemm plan M=%d N=%d K=%d ta=%d tb=%d dyn=%d: tile %d (first pick %d), heuristic %.0f us\n", k->M,
                k->N, k->K, k->ta, k->tb, k->dyn, t, t0, us);
    }
}

static GemmPlan* plan_get(CudaImpl* c, const GemmKey* k) {
    struct GemmCache* g = c->gemm;
    uint64_t h = key_hash(k);
    for (int probe = 0; probe < CACHE_CAP; probe++) {
        GemmPlan* p = &g->slot[(h + probe) % CACHE_CAP];
        if (!p->used) {
            CHECK(g->used < CACHE_CAP * 3 / 4, "cuda gemm: more than %d distinct GEMM shapes", CACHE_CAP * 3 / 4);
            plan_build(c, p, k);
            g->used++;
            return p;
        }
        if (!memcmp(&p->key, k, sizeof *k)) return p;
    }
    FATAL("cuda gemm: plan cache full");
}

// A dynamic dim's plan size (the header): while the cache is less than half full, up to a multiple
// of 1/32 of the power of two below x (powers of two up to 1,024 rows); else up to a power of two.
static int round_dyn(const struct GemmCache* g, int x) {
    if (!g || x <= 1024 || g->used >= CACHE_CAP / 2) return round_pow2(x);
    const int step = round_pow2(x) / 64;  // (the power of two at or above x) / 64 = (the one below) / 32
    return (x + step - 1) / step * step;
}

// A GEMM's plan key: strides already defaulted, al the operands' common alignment, dyn the dim
// rounded up (round_dyn: 1 M, 2 K, 0 none).
static GemmKey key_of(Backend* be, const GemmDesc* d, int lda, int ldb, int ldc, int al, int dyn) {
    GemmKey k;
    memset(&k, 0, sizeof k);  // padding bytes take part in the hash
    const struct GemmCache* g = CI(be)->gemm;
    k.M = dyn == 1 ? round_dyn(g, d->M) : d->M;
    k.N = d->N;
    k.K = dyn == 2 ? round_dyn(g, d->K) : d->K;
    k.ta = d->trans_a != 0;
    k.tb = d->trans_b != 0;
    k.lda = lda;
    k.ldb = ldb;
    k.ldc = ldc;
    k.bf16 = is_bf16(be);
    k.c_f32 = k.bf16 ? d->c_f32 != 0 : 1;
    k.align = al;
    k.dyn = dyn;
    return k;
}

// Tests: the size a plan's dynamic dim of x (an expert's rows: M, or K of a weight gradient) is
// keyed at.
extern "C" int cuda_gemm_plan_dim(Backend* be, int x) { return round_dyn(CI(be)->gemm, x); }

// The cuBLASLt tile id (cublasLtMatmulTile_t) of the algorithm the plan for d uses (16-byte
// aligned operands, default strides; dyn as gemm_run's): for the tile-preference test.
extern "C" int cuda_gemm_plan_tile(Backend* be, const GemmDesc* d, int dyn) {
    const int lda = d->lda ? d->lda : (d->trans_a ? d->M : d->K), ldb = d->ldb ? d->ldb : (d->trans_b ? d->K : d->N);
    const GemmKey k = key_of(be, d, lda, ldb, d->ldc ? d->ldc : d->N, 16, dyn);
    const GemmPlan* p = plan_get(CI(be), &k);
    int tile = -1;
    size_t w;
    cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
    return tile;
}

// One GEMM with explicit strides (already defaulted). dyn: which dim to round for the plan.
static void gemm_run(Backend* be, const GemmDesc* d, int lda, int ldb, int ldc, const void* A, const void* B,
                     void* C, int dyn) {
    CudaImpl* c = CI(be);
    const int M = d->M, N = d->N, K = d->K;
    if (M == 0 || N == 0) return;
    const void* Cin = d->c_in ? d->c_in : C;  // the addend (beta · Cin)
    if (K == 0 || d->alpha == 0.f) {
        const size_t es = (d->c_f32 || !is_bf16(be)) ? 4 : 2;
        if (Cin != C && d->beta != 0.f)
            CUDA_CK(cudaMemcpy2DAsync(C, (size_t)ldc * es, Cin, (size_t)ldc * es, (size_t)N * es, (size_t)M,
                                      cudaMemcpyDeviceToDevice, c->stream));
        cuda_scale_matrix(be, C, d->c_f32, M, N, ldc, d->beta);
        return;
    }
    int al = ptr_align16(A), t;
    if ((t = ptr_align16(B)) < al) al = t;
    if ((t = ptr_align16(C)) < al) al = t;
    if ((t = ptr_align16(Cin)) < al) al = t;
    GemmKey k = key_of(be, d, lda, ldb, ldc, al, dyn);
    GemmPlan* p = plan_get(c, &k);
    if (p->cur_M != M || p->cur_K != K) set_dims(p, M, K);
    const float alpha = d->alpha, beta = d->beta;
    cublasStatus_t s = cublasLtMatmul(c->lt, p->op, &alpha, B, p->la, A, p->lb, &beta, Cin, p->lc, C, p->lc, &p->algo,
                                      c->lt_ws, c->lt_ws_bytes, c->stream);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED && dyn) {  // the rounded plan's algorithm refused this size
        k.M = M;
        k.K = K;
        k.dyn = 0;
        p = plan_get(c, &k);
        s = cublasLtMatmul(c->lt, p->op, &alpha, B, p->la, A, p->lb, &beta, Cin, p->lc, C, p->lc, &p->algo,
                           c->lt_ws, c->lt_ws_bytes, c->stream);
    }
    if (s != CUBLAS_STATUS_SUCCESS)
        FATAL("cuBLASLt matmul failed (M=%d N=%d K=%d trans_a=%d trans_b=%d lda=%d ldb=%d ldc=%d): %s", M, N, K,
              d->trans_a, d->trans_b, lda, ldb, ldc, cublasLt_status_name(s));
    LAUNCH_CK(c);
}

void cuda_gemm(Backend* be, const GemmDesc* d, const void* A, const void* B, void* C) {
    if (d->fp8 != FP8_OFF) return cuda_gemm_fp8(be, d, A, B, C);  // cuda_fp8.cu
    int lda, ldb, ldc;
    gemm_desc_check(d, &lda, &ldb, &ldc);
    // cuBLASLt needs leading dimensions ≥ 1 even for empty dims
    gemm_run(be, d, lda > 0 ? lda : 1, ldb > 0 ? ldb : 1, ldc > 0 ? ldc : 1, A, B, C, 0);
}

// One cuBLASLt call per non-empty group: C = A·B_gᵀ (trans_b, the forward) or C = A·B_g (the
// backward's data gradients).
void cuda_gemm_grouped(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* A, const void* B, void* C) {
    if (d->fp8 != FP8_OFF) return cuda_gemm_grouped_fp8(be, d, g, A, B, C);
    gemm_grouped_check("gemm_grouped", d, g);
    const int lda = d->lda ? d->lda : d->K, ldc = d->ldc ? d->ldc : d->N;
    const int ldb = d->ldb ? d->ldb : (d->trans_b ? d->K : d->N);
    const size_t ea = dtype_size(be->act_dtype), ec = d->c_f32 ? 4 : ea;
    for (int i = 0; i < g->groups; i++) {
        const int r0 = g->host_off[i], rows = g->host_off[i + 1] - r0;
        if (rows == 0) continue;
        GemmDesc x = *d;
        x.M = rows;
        gemm_run(be, &x, lda, ldb, ldc, (const char*)A + (size_t)r0 * lda * ea,
                 (const char*)B + g->b_stride * i * ea, (char*)C + (size_t)r0 * ldc * ec, 1);
    }
}

// The w13 GEMM and the SwiGLU: cuBLASLt's GEMMs, then swiglu_fwd.
void cuda_gemm_grouped_swiglu(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* A, const void* B,
                              void* gu, void* h, const float* scale) {
    CHECK(d->N % 2 == 0, "gemm_grouped_swiglu: N = %d is not 2F", d->N);
    cuda_gemm_grouped(be, d, g, A, B, gu);
    cuda_swiglu_fwd(be, h, gu, scale, g->host_off[g->groups], d->N / 2);
}

// Per group g: dB_g[N, K] = dY[rows g]ᵀ · X[rows g] + beta · dB_g, dY packed [rows, N], X packed [rows, K];
// dB fp32, or act dtype with g->db_act (cuBLASLt rounds its fp32 sum once on output).
void cuda_gemm_grouped_wgrad(Backend* be, const GroupDesc* g, int N, int K, const void* dY, const void* X,
                             void* dB, float beta) {
    if (g->fp8 != FP8_OFF) return cuda_gemm_grouped_wgrad_fp8(be, g, N, K, dY, X, dB, beta);
    gemm_grouped_wgrad_check(g, beta);
    const size_t ea = dtype_size(be->act_dtype), eb = g->db_act ? ea : sizeof(float);
    char* db = (char*)dB;
    for (int i = 0; i < g->groups; i++) {
        const int r0 = g->host_off[i], rows = g->host_off[i + 1] - r0;
        if (rows == 0) {  // += 0, or = 0
            if (beta == 0.f) be->zero(be, db + g->b_stride * i * eb, eb * N * K);
            continue;
        }
        GemmDesc x = {};
        x.M = N;
        x.N = K;
        x.K = rows;
        x.trans_a = 1;
        x.alpha = 1;
        x.beta = beta;
        x.c_f32 = !g->db_act;
        gemm_run(be, &x, N, K, K, (const char*)dY + (size_t)r0 * N * ea, (const char*)X + (size_t)r0 * K * ea,
                 db + g->b_stride * i * eb, 2);
    }
}

// ---- one exact-shape plan outside the cache, for the surveys (dev/cuda/cuda_gemm_survey.cu) -----

void gemm_shape_plan(Backend* be, const GemmDesc* d, GemmShapePlan* sp) {
    GemmKey k;
    memset(&k, 0, sizeof k);
    k.M = d->M, k.N = d->N, k.K = d->K, k.ta = d->trans_a != 0, k.tb = d->trans_b != 0;
    k.lda = d->lda ? d->lda : (d->trans_a ? d->M : d->K);
    k.ldb = d->ldb ? d->ldb : (d->trans_b ? d->K : d->N);
    k.ldc = d->ldc ? d->ldc : d->N;
    k.bf16 = is_bf16(be), k.c_f32 = k.bf16 ? d->c_f32 != 0 : 1, k.align = 16;
    GemmPlan p;
    plan_build(CI(be), &p, &k);
    sp->op = p.op, sp->la = p.la, sp->lb = p.lb, sp->lc = p.lc, sp->algo = p.algo;
}

void gemm_shape_plan_release(GemmShapePlan* p) {
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->lc);
    cublasLtMatmulDescDestroy(p->op);
}
