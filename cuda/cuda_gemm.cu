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
// exact-size plan is built and cached instead. The rounding (MOETRAIN_GEMM_ROWS):
//   oct (default)  above 1,024 rows up to a multiple of 1/32 of the power of two below (8,193..16,384
//                  → multiples of 256, 4,097..8,192 → of 128): the heuristic sees the real size within
//                  3%, and offers tiles sized to the rows there (docs/performance.md, change 55); at
//                  most 32 plans per octave and shape, the same plan for a row count in every run
//   pow2           up to a power of two (sessions 1-12)
//   R              up to a multiple of R (a multiple of 8; experiments)
// Once half the plan cache is used, new plans go back to powers of two, which bounds the count.
//
// Autotuning (MOETRAIN_GEMM_TUNE=1; off by default): cuBLASLt's heuristic ranks up to
// GEMM_TUNE_MAX algorithms per plan, and its first pick is not always the fastest when each
// candidate is timed alone (the bench_8x7B_L2 survey on an H200 at 8,192 rows per expert: the
// w13 dgrad 689 → 745 TFLOP/s, the w2 forward 626 → 686 with another candidate). Timed inside
// the training step, though, the first pick was the fastest or within 3% for nearly every plan,
// and the step did not get faster (docs/performance.md, change 21), so it is a tool for other
// GPUs and shapes, not the default.
// A plan's first calls each run the next candidate — real work on real data, every candidate
// computes the same product — between two events; the elapsed times are read without blocking
// (cudaEventQuery) on later calls of the plan, normalized by the call's FLOPs (the dynamic
// dimension varies), and once every candidate has a time the plan keeps the fastest, unless it
// beats the heuristic's first pick by less than GEMM_TUNE_MARGIN (timing noise must not flip the
// choice). No host synchronization and no extra GEMM. The pick can differ between runs (timing),
// so runs compared bit for bit (the resume checks) keep it off.
// MOETRAIN_GEMM_TUNE_LOG=1 prints each plan's candidates and pick.
// The surveys of cuBLASLt's candidates are in dev/cuda/cuda_gemm_survey.cu (`make dev`);
// gemm_shape_plan (at the end) builds their plans.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_gemm.cuh"

enum { CACHE_CAP = 2048 };  // plans; a run uses a few dozen to a few hundred (the expert GEMMs' row counts)
enum { GEMM_TUNE_MAX = 8 };   // candidates timed per plan
enum { GEMM_TUNE_ROUNDS = 2 };  // timings per candidate (the least counts: a first call may include a module load)
static const double GEMM_TUNE_MARGIN = 0.97;  // a candidate replaces the first pick below 97% of its time

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
    // autotuning: the heuristic's candidates [n_cand]; timed calls so far (call j times candidate
    // j % n_cand); per timed call its events, GFLOPs and ms per GFLOP (< 0 pending, inf refused)
    int tuned, n_cand, next;
    cublasLtMatmulAlgo_t cand[GEMM_TUNE_MAX];
    cudaEvent_t ev[GEMM_TUNE_MAX * GEMM_TUNE_ROUNDS][2];
    double gflop[GEMM_TUNE_MAX * GEMM_TUNE_ROUNDS], rate[GEMM_TUNE_MAX * GEMM_TUNE_ROUNDS];
} GemmPlan;

// Tile preferences: a plan with trans_a ta and trans_b tb whose fixed dims (X, Y) — (N, K) for
// ta = 0, (M, N) for ta = 1: the dims an expert GEMM does not vary — match takes the heuristic's
// first candidate with that cuBLASLt tile id (cublasLtMatmulTile_t), where there is one; else
// the first pick. The built-in table (bf16 on compute capability 9.0) holds what the hot survey
// (MOETRAIN_GEMM_SURVEY=hot / hotdense: each candidate back to back at the card's power limit)
// found and the step confirmed for Mixtral-8x7B on the H200 (docs/performance.md):
//   - change 48: the w13 forward on 176 × 128 tiles (697 against the first pick's 674 TFLOP/s at
//     8,192 rows), its weight gradient on 128 × 160 (688 against 678); the step −1.3 ms.
//   - change 54: the q/o forward and data gradient and k/v's data gradient take 128 × 160 (the
//     hot survey: +4 to +13%). The step −2.2 ms at micro-batch 8, with two entries for the w13
//     data gradient and the w2 forward (256 × 128) that change 55 made unnecessary: plans keyed by
//     rows near the real count, where the heuristic's own pick is the better one. Since change 63
//     q, k and v are one GEMM; o keeps its entries, and the fused shapes take the heuristic's
//     first pick (the survey's better tiles for them changed nothing in the step).
// The lm_head's better candidates in the survey did not carry over to the step, and are left out.
// MOETRAIN_GEMM_TILE replaces the table: "ta,tb,X,Y=tile;..." or "none"; MOETRAIN_GEMM_TUNE_LOG=1
// prints every plan's tile and first pick.
enum { TILE_PREF_MAX = 16 };
enum { ROWS_OCT = 0, ROWS_POW2 = -1 };  // GemmCache.rows_round besides a multiple R
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
    TilePref pref[TILE_PREF_MAX];  // the tile preferences in force (the table or MOETRAIN_GEMM_TILE)
    int n_pref;
    int pref_env;                  // MOETRAIN_GEMM_TILE was given (it applies on any GPU)
    int tune, tune_log;  // MOETRAIN_GEMM_TUNE (default 0), MOETRAIN_GEMM_TUNE_LOG
    int rows_round;      // MOETRAIN_GEMM_ROWS: dynamic dims round up to a multiple of this; ROWS_OCT, ROWS_POW2
};

static int env_flag(const char* name, int dflt) {
    const char* e = getenv(name);
    if (!e || !e[0]) return dflt;
    CHECK(!strcmp(e, "0") || !strcmp(e, "1"), "%s=%s: expected 0 or 1", name, e);
    return e[0] == '1';
}

struct GemmCache* gemm_cache_create(void) {
    struct GemmCache* g = (struct GemmCache*)xcalloc(1, sizeof(struct GemmCache));
    g->tune = env_flag("MOETRAIN_GEMM_TUNE", 0);
    g->tune_log = env_flag("MOETRAIN_GEMM_TUNE_LOG", 0);
    const char* rows = getenv("MOETRAIN_GEMM_ROWS");
    g->rows_round = ROWS_OCT;
    if (rows && rows[0] && strcmp(rows, "oct") != 0) {
        char* end = NULL;
        const long r = strtol(rows, &end, 10);
        CHECK(!strcmp(rows, "pow2") || (end && !*end && r >= 8 && r <= 65536 && r % 8 == 0),
              "MOETRAIN_GEMM_ROWS=%s: expected oct, pow2 or a multiple of 8 from 8 to 65536", rows);
        g->rows_round = strcmp(rows, "pow2") ? (int)r : ROWS_POW2;
    }
    const char* e = getenv("MOETRAIN_GEMM_TILE");
    g->pref_env = e && e[0];
    if (!g->pref_env) {
        g->n_pref = (int)(sizeof k_tile_pref_sm90 / sizeof k_tile_pref_sm90[0]);
        memcpy(g->pref, k_tile_pref_sm90, sizeof k_tile_pref_sm90);
    } else if (strcmp(e, "none") != 0) {
        for (const char* q = e; *q;) {
            CHECK(g->n_pref < TILE_PREF_MAX, "MOETRAIN_GEMM_TILE=%s: more than %d entries", e, TILE_PREF_MAX);
            TilePref* t = &g->pref[g->n_pref];
            int used = 0;
            CHECK(sscanf(q, "%d,%d,%d,%d=%d%n", &t->ta, &t->tb, &t->x, &t->y, &t->tile, &used) == 5 && used > 0,
                  "MOETRAIN_GEMM_TILE=%s: expected none or ta,tb,X,Y=tile;... (docs/gpu.md)", e);
            g->n_pref++;
            q += used;
            CHECK(*q == ';' || !*q, "MOETRAIN_GEMM_TILE=%s: expected ';' between entries", e);
            while (*q == ';') q++;
        }
    }
    return g;
}

static void tune_release(GemmPlan* p) {  // the events of the candidates that got them
    for (int i = 0; i < p->next; i++)
        for (int e = 0; e < 2; e++)
            if (p->ev[i][e]) cudaEventDestroy(p->ev[i][e]), p->ev[i][e] = NULL;
}

void gemm_cache_destroy(struct GemmCache* g) {
    if (!g) return;
    for (int i = 0; i < CACHE_CAP; i++) {
        GemmPlan* p = &g->slot[i];
        if (!p->used) continue;
        tune_release(p);
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

static int ptr_align(const void* p) {
    const uintptr_t a = (uintptr_t)p;
    int al = 16;
    while (al > 1 && (a % al)) al >>= 1;
    return al;
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

// The preferred tile for the plan's key, or -1 (the built-in table: bf16 on compute capability 9.0).
static int tile_pref(const CudaImpl* c, const GemmKey* k) {
    const struct GemmCache* g = c->gemm;
    if (!g || (!g->pref_env && !(k->bf16 && c->cc_major == 9))) return -1;
    for (int i = 0; i < g->n_pref; i++) {
        const TilePref* t = &g->pref[i];
        if (t->ta == k->ta && t->tb == k->tb && t->x == (k->ta ? k->M : k->N) && t->y == (k->ta ? k->N : k->K))
            return t->tile;
    }
    return -1;
}

static void plan_build(CudaImpl* c, GemmPlan* p, const GemmKey* k, int tune) {
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
    cublasLtMatmulHeuristicResult_t res[GEMM_TUNE_MAX];
    int nres = 0;
    const int want = tile_pref(c, k);
    struct timespec h0, h1;  // the heuristic's host time, for the plan log
    clock_gettime(CLOCK_MONOTONIC, &h0);
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->la, p->lb, p->lc, p->lc, pref,
                                                      tune || want >= 0 ? GEMM_TUNE_MAX : 1, res, &nres);
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
    if (c->gemm && c->gemm->tune_log) {  // every plan: the tile it runs on, and the heuristic's first pick
        int t0 = -1, t = -1;
        size_t w;
        cublasLtMatmulAlgoConfigGetAttribute(&res[0].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &t0, sizeof t0, &w);
        cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &t, sizeof t, &w);
        const double us = (h1.tv_sec - h0.tv_sec) * 1e6 + (h1.tv_nsec - h0.tv_nsec) * 1e-3;
        fprintf(stderr, "gemm plan M=%d N=%d K=%d ta=%d tb=%d dyn=%d: tile %d (first pick %d), heuristic %.0f us\n", k->M,
                k->N, k->K, k->ta, k->tb, k->dyn, t, t0, us);
    }
    if (!tune) nres = 1;  // the preference asked for more candidates than the first pick
    p->n_cand = 0;
    for (int i = 0; i < nres; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS) p->cand[p->n_cand++] = res[i].algo;
    p->tuned = p->n_cand <= 1;  // nothing to choose from
}

// Reads the finished timings without blocking; once every candidate has one, keeps the fastest
// (GEMM_TUNE_MARGIN against the first pick) and releases the events.
static void tune_poll(struct GemmCache* g, GemmPlan* p) {
    const int calls = p->n_cand * GEMM_TUNE_ROUNDS;
    int pending = p->next < calls;
    for (int i = 0; i < p->next; i++) {
        if (p->rate[i] >= 0) continue;
        const cudaError_t e = cudaEventQuery(p->ev[i][1]);
        if (e == cudaErrorNotReady) {
            if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();  // a status, not an error
            pending = 1;
            continue;
        }
        CUDA_CK(e);
        float ms = 0;
        CUDA_CK(cudaEventElapsedTime(&ms, p->ev[i][0], p->ev[i][1]));
        p->rate[i] = ms / p->gflop[i];
    }
    if (pending) return;
    double r[GEMM_TUNE_MAX];  // per candidate, its best timing
    for (int i = 0; i < p->n_cand; i++) r[i] = INFINITY;
    for (int j = 0; j < calls; j++) r[j % p->n_cand] = fmin(r[j % p->n_cand], p->rate[j]);
    int best = 0;
    for (int i = 1; i < p->n_cand; i++)
        if (r[i] < r[best]) best = i;
    if (best != 0 && !(r[best] < GEMM_TUNE_MARGIN * r[0])) best = 0;
    p->algo = p->cand[best];
    p->tuned = 1;
    tune_release(p);
    if (g->tune_log) {
        const GemmKey* k = &p->key;
        printf("gemm_tune M%d N%d K%d ta%d tb%d c_f32 %d dyn %d: pick #%d of %d;", k->M, k->N, k->K, k->ta, k->tb,
               k->c_f32, k->dyn, best, p->n_cand);
        for (int i = 0; i < p->n_cand; i++) printf(" %.0f", isfinite(r[i]) && r[i] > 0 ? 1e3 / r[i] : 0.0);  // TFLOP/s
        printf(" TFLOP/s\n");
        fflush(stdout);
    }
}

static GemmPlan* plan_get(CudaImpl* c, const GemmKey* k) {
    struct GemmCache* g = c->gemm;
    uint64_t h = key_hash(k);
    for (int probe = 0; probe < CACHE_CAP; probe++) {
        GemmPlan* p = &g->slot[(h + probe) % CACHE_CAP];
        if (!p->used) {
            CHECK(g->used < CACHE_CAP * 3 / 4, "cuda gemm: more than %d distinct GEMM shapes", CACHE_CAP * 3 / 4);
            plan_build(c, p, k, g->tune);
            g->used++;
            return p;
        }
        if (!memcmp(&p->key, k, sizeof *k)) return p;
    }
    FATAL("cuda gemm: plan cache full");
}

// A dynamic dim's plan size (MOETRAIN_GEMM_ROWS: the header): while the cache is less than half
// full, up to a multiple of 1/32 of the power of two below x (oct; powers of two up to 1,024) or of
// R; else, and for pow2, up to a power of two.
static int round_dyn(const struct GemmCache* g, int x) {
    if (!g || x <= 0 || g->rows_round == ROWS_POW2 || g->used >= CACHE_CAP / 2) return round_pow2(x);
    int step = g->rows_round;
    if (step == ROWS_OCT) {
        if (x <= 1024) return round_pow2(x);
        step = round_pow2(x) / 64;  // (the power of two at or above x) / 64 = (the one below) / 32
    }
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

// Tests: MOETRAIN_GEMM_ROWS from now (ROWS_OCT = 0, ROWS_POW2 = -1, or R); returns the previous
// value. And the size a plan's dynamic dim of x (an expert's rows: M, or K of a weight gradient)
// is keyed at.
extern "C" int cuda_gemm_rows_round(Backend* be, int r) {
    struct GemmCache* g = CI(be)->gemm;
    const int was = g->rows_round;
    CHECK(r == ROWS_OCT || r == ROWS_POW2 || (r >= 8 && r % 8 == 0), "cuda_gemm_rows_round: %d", r);
    g->rows_round = r;
    return was;
}
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
    int al = ptr_align(A), t;
    if ((t = ptr_align(B)) < al) al = t;
    if ((t = ptr_align(C)) < al) al = t;
    if ((t = ptr_align(Cin)) < al) al = t;
    GemmKey k = key_of(be, d, lda, ldb, ldc, al, dyn);
    GemmPlan* p = plan_get(c, &k);
    if (p->cur_M != M || p->cur_K != K) set_dims(p, M, K);
    const float alpha = d->alpha, beta = d->beta;
    cublasStatus_t s = CUBLAS_STATUS_NOT_SUPPORTED;
    if (!p->tuned) tune_poll(c->gemm, p);
    if (!p->tuned && p->next < p->n_cand * GEMM_TUNE_ROUNDS) {  // time a candidate on this call
        const int j = p->next++;
        for (int e = 0; e < 2; e++) CUDA_CK(cudaEventCreate(&p->ev[j][e]));
        CUDA_CK(cudaEventRecord(p->ev[j][0], c->stream));
        s = cublasLtMatmul(c->lt, p->op, &alpha, B, p->la, A, p->lb, &beta, Cin, p->lc, C, p->lc,
                           &p->cand[j % p->n_cand], c->lt_ws, c->lt_ws_bytes, c->stream);
        CUDA_CK(cudaEventRecord(p->ev[j][1], c->stream));
        p->gflop[j] = 2e-9 * M * N * (double)K;
        p->rate[j] = s == CUBLAS_STATUS_SUCCESS ? -1.0 : INFINITY;  // refused at this size: never picked
    }
    if (s != CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmul(c->lt, p->op, &alpha, B, p->la, A, p->lb, &beta, Cin, p->lc, C, p->lc, &p->algo, c->lt_ws,
                           c->lt_ws_bytes, c->stream);
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
    int lda, ldb, ldc;
    gemm_desc_check(d, &lda, &ldb, &ldc);
    // cuBLASLt needs leading dimensions ≥ 1 even for empty dims
    gemm_run(be, d, lda > 0 ? lda : 1, ldb > 0 ? ldb : 1, ldc > 0 ? ldc : 1, A, B, C, 0);
}

// One cuBLASLt call per non-empty group: C = A·B_gᵀ (trans_b, the forward) or C = A·B_g (the
// backward's data gradients).
void cuda_gemm_grouped(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* A, const void* B, void* C) {
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
    plan_build(CI(be), &p, &k, 0);  // no tuning: no events to release
    sp->op = p.op, sp->la = p.la, sp->lb = p.lb, sp->lc = p.lc, sp->algo = p.algo;
}

void gemm_shape_plan_release(GemmShapePlan* p) {
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->lc);
    cublasLtMatmulDescDestroy(p->op);
}
