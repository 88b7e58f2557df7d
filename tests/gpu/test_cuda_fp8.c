// test_cuda_fp8.c — the CUDA backend's FP8 block-scaled GEMMs (cuda/cuda_fp8.cu) against the CPU
// spec (src/fp8.h), in fp32 and bf16 modes (the quantisers, bit for bit: test_cuda_fp8_quant.c):
//   - every FP8 op (gemm with FP8_WEIGHT and FP8_ACT in each transpose form, alpha, beta, c_in,
//     fp32 outputs; gemm_grouped and gemm_grouped_swiglu with empty groups and rows that are not a
//     multiple of 8; gemm_grouped_wgrad with beta 0 and 1, db_act, empty groups) against
//     fp8_gemm_tn on the spec's quantisation of the same operands, element by element within a
//     bound computed from the operands (below), through cuBLASLt (sm_90) and through the fallback
//     kernel, and at Mixtral-8x7B's expert shapes (H 4,096, F 14,336);
//   - gemm_grouped_swiglu_bwd (the SwiGLU backward with w13's products on one quantising read)
//     against the three ops that define it, bit for bit, at small and Mixtral shapes.
//
// The bound (docs/fp8.md, "Error bounds"). For output element (i, j) with K tiles t = 0..T−1,
// w_t = sa·sb and p_k = e4m3(qa_k)·e4m3(qb_k) (exact):
//   |r_gpu − r_spec| ≤ 2·γ_{T+2}·S + Σ_t |w_t|·E_t,   S = Σ_k |w_{t(k)}·p_k|
// where both r are within γ_{T+2}·S of the exact dequantised product (the fp32 roundings of the
// promotion: docs/fp8.md), and E_t bounds the tensor core's inner product of tile t, the one term
// widened: Hopper's FP8 MMA adds a k = 32 step's products to its accumulator with a limited
// significand (DeepSeek-V3 §3.3.2 measured about 14 bits) and truncates, and the accumulator is
// promoted to fp32 once per 128 (cuBLASLt: every 4 steps; the fallback kernel likewise). Whether a
// step adds its 32 products at once (33 addends) or in four parts of 8 (4 × 9 addends), each
// addend loses less than one unit of 2^-12 (13 bits, one bit of margin) of the largest magnitude
// it is aligned to, which is at most M_s = max(the largest |running sum| of the tile at the step's
// start and after every 8 products + E so far, the largest |p_k| of the step):
//   E_t = Σ_steps 36 · 2^-12 · M_s.
// Then the epilogue (alpha·r + beta·addend: two fp32 roundings) and, for a bf16 C, half a bf16 ulp.
// A failing element prints its error and bound; the worst error / bound per check is in the table
// at the end (≤ 1 passes). A control run shows the check catches a product whose scales are off.
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fp8.h"
#include "fp8_bound.h"
#include "gpu_check.h"

void cuda_fp8_set_path(Backend* be, int path);
int cuda_fp8_kernels_built(void);
void cuda_fp8_set_row_chunk(Backend* be, int rows);
void cuda_fp8_set_wgrad_acc(Backend* be, size_t bytes);
void cuda_fp8_set_epi_bytes(Backend* be, size_t bytes);
void cuda_fp8_counts(Backend* be, size_t* lt, size_t* fb);
size_t cuda_fp8_wgrad_splits(Backend* be);
size_t cuda_fp8_swiglu_bwd_ws(Backend* be, int rows, int F, int K);
size_t cuda_fp8_w13_groups(Backend* be);
int cuda_compute_capability(Backend* be);

static int g_hopper;         // cuBLASLt's block-scaled modes available (compute capability 9.0)
static const char* g_tag = "";  // appended to the gemm labels (the chunked runs)

static int tiles(int n) { return (n + FP8_TILE - 1) / FP8_TILE; }

// ---- data ---------------------------------------------------------------------------------------

// [R, C] (stride ld) of N(0, 1) values scaled per row by 2^u, u in [-2, 2]: realistic activations
static float* act_data(int R, int C, int ld, float scale) {
    float* x = xmalloc(sizeof(float) * ((size_t)R * ld + 1));
    for (int r = 0; r < R; r++) {
        const float s = scale * exp2f(4.f * rng_uniform(&g_rng) - 2.f);
        for (int c = 0; c < ld; c++) {
            float v = rng_normal(&g_rng) * s;
            x[(size_t)r * ld + c] = v == 0.f ? s : v;
        }
    }
    return x;
}

// ---- the GEMM reference and its bound ------------------------------------------------------------

// A quantised TN product for the reference: qa [M, K] with sa [M, Kt], qb [N, K] with sb
// ([N, Kt], or [⌈N/128⌉, Kt] when blk): the spec's layouts.
typedef struct QTN {
    int M, N, K, blk;
    uint8_t *qa, *qb;
    float *sa, *sb;
} QTN;

static void qtn_free(QTN* q) { free(q->qa), free(q->qb), free(q->sa), free(q->sb); }

// opA [M, K] and opBt [N, K] (fp32 values the act dtype holds) quantised as the contract says
static QTN qtn_make(const float* opA, const float* opBt, int M, int N, int K, int blk) {
    QTN q = {M, N, K, blk, xmalloc((size_t)M * K + 1), xmalloc((size_t)N * K + 1), NULL, NULL};
    q.sa = xmalloc(4 * ((size_t)M * tiles(K) + 1));
    q.sb = xmalloc(4 * ((size_t)(blk ? tiles(N) : N) * tiles(K) + 1));
    fp8_quant_1x128(opA, M, K, (size_t)K, q.qa, q.sa, NULL, NULL);
    if (blk) fp8_quant_128x128(opBt, N, K, (size_t)K, q.qb, q.sb, NULL, NULL);
    else fp8_quant_1x128(opBt, N, K, (size_t)K, q.qb, q.sb, NULL, NULL);
    return q;
}

// For output row i (of q) and every column j: the bound on |r_gpu − r_spec| (header) into bnd[N].
static void bound_row(const QTN* q, int i, double* bnd) {
    const int N = q->N, K = q->K, Kt = tiles(K);
    const uint8_t* a = q->qa + (size_t)i * K;
#pragma omp parallel for schedule(static)
    for (int j = 0; j < N; j++)
        bnd[j] = fp8_bound_elem(a, q->sa + (size_t)i * Kt, q->qb + (size_t)j * K,
                                q->sb + (size_t)(q->blk ? j / FP8_TILE : j) * Kt, K);
}

// Checks the GPU's C rows against the spec: C_ref = alpha·r + beta·addend (fp32), |C − C_ref| ≤
// |alpha|·bnd + the epilogue's roundings (+ half a bf16 ulp for a bf16 C). rows: which rows of q
// are checked (their C rows are got[k·ldg ..], addend[k·ldg ..]). Returns the number of elements
// out of bound; records the worst error / bound.
static size_t check_rows(const Mode* m, const char* label, const QTN* q, const int* rows, int nrows, const float* got,
                         size_t ldg, const float* addend, float alpha, float beta, int c_bf16, int quiet) {
    const int N = q->N, K = q->K, Kt = tiles(K);
    // the spec's r for the checked rows: fp8_gemm_tn on those rows of qa (one call, parallel)
    uint8_t* qa = xmalloc((size_t)nrows * K + 1);
    float* sa = xmalloc(sizeof(float) * ((size_t)nrows * Kt + 1));
    for (int k = 0; k < nrows; k++) {
        memcpy(qa + (size_t)k * K, q->qa + (size_t)rows[k] * K, (size_t)K);
        memcpy(sa + (size_t)k * Kt, q->sa + (size_t)rows[k] * Kt, sizeof(float) * Kt);
    }
    float* rr = xmalloc(sizeof(float) * ((size_t)nrows * N + 1));
    fp8_gemm_tn(nrows, N, K, qa, sa, q->qb, q->sb, q->blk, rr, (size_t)N, 0);
    double* bnd = xmalloc(sizeof(double) * N);
    size_t bad = 0;
    double worst = 0;
    for (int k = 0; k < nrows; k++) {
        const float* r = rr + (size_t)k * N;
        bound_row(q, rows[k], bnd);
        for (int j = 0; j < N; j++) {
            const double a = beta != 0.f ? (double)addend[(size_t)k * ldg + j] : 0;
            const double ar = (double)alpha * r[j], ba = (double)beta * a, cref = ar + ba;
            double b = fabs((double)alpha) * bnd[j] + ldexp(1, -23) * (fabs(ar) + fabs(ba));
            if (c_bf16) b += ldexp(1, -8) * (fabs(cref) + b);
            const double gv = got[(size_t)k * ldg + j], err = fabs(gv - cref);
            const double ratio = isfinite(gv) ? (b > 0 ? err / b : (err > 0 ? INFINITY : 0)) : INFINITY;
            if (ratio > worst) worst = ratio;
            if (!(ratio <= 1)) {
                if (!bad && !quiet)
                    fprintf(stderr, "  %s [%s]: row %d col %d: got %.9g, spec %.9g, error %.3g > bound %.3g\n", label,
                            m->name, rows[k], j, gv, cref, err, b);
                bad++;
            }
        }
    }
    if (!quiet) {
        record(label, m->bf16, worst, 1);
        EXPECT(bad == 0, "%s [%s]: %zu elements outside the bound (worst error / bound %.3g)", label, m->name, bad, worst);
    }
    free(qa), free(sa), free(rr), free(bnd);
    return bad;
}

// rows to check of an M-row output: all up to 2·(spread + tail), else `spread` spread ones and the
// last `tail` (the Mixtral shapes check fewer: their reference rows are long)
static int g_spread = 48, g_tail = 8;
static int pick_rows(int M, int* rows) {
    if (M <= 2 * (g_spread + g_tail)) {
        for (int i = 0; i < M; i++) rows[i] = i;
        return M;
    }
    int n = 0;
    for (int k = 0; k < g_spread; k++) rows[n++] = (int)((long)k * (M - g_tail) / g_spread);
    for (int i = M - g_tail; i < M; i++) rows[n++] = i;
    return n;
}

// the control: the spec's product with every scale of row 0 doubled must fail the check (the
// bound is tight enough to see a wrong scale), the true product must pass
static void test_bound_control(void) {
    const Mode* m = &g_modes[1];
    const int M = 4, N = 64, K = 4096;
    float *A = act_data(M, K, K, 1.f), *B = act_data(N, K, K, 0.02f);
    round_act(m, A, (size_t)M * K);
    round_act(m, B, (size_t)N * K);
    QTN q = qtn_make(A, B, M, N, K, 1);
    float* r = xmalloc(sizeof(float) * N);
    fp8_gemm_tn(1, N, K, q.qa, q.sa, q.qb, q.sb, 1, r, (size_t)N, 0);
    const int row0 = 0;
    size_t bad = check_rows(m, "control", &q, &row0, 1, r, (size_t)N, NULL, 1.f, 0.f, 0, 1);
    EXPECT(bad == 0, "control: the spec's own product fails its bound (%zu elements)", bad);
    for (int t = 0; t < tiles(K); t++) q.sa[t] *= 2.f;
    QTN q2 = q;  // r from doubled scales, checked against the true ones
    float* r2 = xmalloc(sizeof(float) * N);
    fp8_gemm_tn(1, N, K, q2.qa, q2.sa, q2.qb, q2.sb, 1, r2, (size_t)N, 0);
    for (int t = 0; t < tiles(K); t++) q.sa[t] *= 0.5f;
    bad = check_rows(m, "control", &q, &row0, 1, r2, (size_t)N, NULL, 1.f, 0.f, 0, 1);
    EXPECT(bad >= (size_t)N * 3 / 4, "control: only %zu of %d elements of a product with doubled scales fail", bad, N);
    qtn_free(&q);
    free(A), free(B), free(r), free(r2);
}

// ---- the ops ---------------------------------------------------------------------------------------

// op(A) [M, K] and op(B)ᵀ [N, K] from stored A, B
static float* op_a(const float* A, int M, int K, int ta, int lda) {
    float* o = xmalloc(sizeof(float) * ((size_t)M * K + 1));
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++) o[(size_t)i * K + k] = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
    return o;
}
static float* op_bt(const float* B, int N, int K, int tb, int ldb) {
    float* o = xmalloc(sizeof(float) * ((size_t)N * K + 1));
    for (int j = 0; j < N; j++)
        for (int k = 0; k < K; k++) o[(size_t)j * K + k] = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
    return o;
}

static void* ws_for(Backend* be, Fp8Op op, Fp8Gemm f, int M, int N, int K, int G, size_t* bytes) {
    *bytes = be->fp8_ws_bytes(be, op, f, M, N, K, G);
    return poison(be, *bytes);  // 0xFF bytes: NaN codes and scales where a kernel reads what nobody wrote
}

typedef struct GCase {
    const char* name;
    int M, N, K, ta, tb, lda, ldb, ldc;
    float alpha, beta;
    int c_f32, cin;
    Fp8Gemm fp8;
} GCase;

static const GCase GCASES[] = {
    {"fwd W 256x384x1088", 256, 384, 1088, 0, 1, 0, 0, 0, 1, 0, 0, 0, FP8_WEIGHT},
    {"dgrad W 200x256x640", 200, 256, 640, 0, 0, 0, 0, 0, 1, 0, 0, 0, FP8_WEIGHT},
    {"wgrad A 256x192x300 t10 c_f32", 256, 192, 300, 1, 0, 0, 0, 0, 1, 0, 1, 0, FP8_ACT},
    {"act A 64x128x256 t01", 64, 128, 256, 0, 1, 0, 0, 0, 1, 0, 0, 0, FP8_ACT},
    {"act A 64x128x256 t11 beta", 64, 128, 256, 1, 1, 0, 0, 0, 1, 1, 0, 0, FP8_ACT},
    {"fwd W c_in alpha 0.5", 128, 256, 512, 0, 1, 0, 0, 0, 0.5f, 1, 0, 1, FP8_WEIGHT},
    {"fwd W beta 0.5 c_f32", 96, 128, 384, 0, 1, 0, 0, 0, 1, 0.5f, 1, 0, FP8_WEIGHT},
    {"tail 37x96x200 strides", 37, 96, 200, 0, 1, 208, 216, 104, 1, 0, 0, 0, FP8_WEIGHT},
    {"tail 37x96x200 beta", 37, 96, 200, 0, 0, 0, 0, 0, 1, 1, 0, 0, FP8_WEIGHT},
    {"N%8 64x100x256", 64, 100, 256, 0, 1, 0, 0, 0, 1, 0, 0, 0, FP8_WEIGHT},
    {"few rows 5x96x200 beta", 5, 96, 200, 0, 1, 0, 0, 0, 0.5f, 1, 0, 0, FP8_WEIGHT},
};

// One gemm case through path (0 auto, 2 fallback); checks C within the bound, and which path ran.
static void run_gemm_case(const Mode* m, const GCase* g, int path) {
    Backend* be = m->gpu;
    const int M = g->M, N = g->N, K = g->K;
    const int ar = g->ta ? K : M, ac = g->ta ? M : K, br = g->tb ? N : K, bc = g->tb ? K : N;
    const int lda = g->lda ? g->lda : ac, ldb = g->ldb ? g->ldb : bc, ldc = g->ldc ? g->ldc : N;
    const int cf = g->c_f32 || !m->bf16;
    float* A = act_data(ar, ac, lda, 1.f);
    float* B = act_data(br, bc, ldb, g->fp8 == FP8_WEIGHT ? 0.02f : 1.f);
    float* C0 = act_data(M, N, ldc, 3.f);
    round_act(m, A, (size_t)ar * lda);
    round_act(m, B, (size_t)br * ldb);
    if (!cf) round_act(m, C0, (size_t)M * ldc);
    const size_t nc = (size_t)M * ldc;
    void* dC = g->beta != 0.f && !g->cin ? (cf ? (void*)up_f32(be, C0, nc) : up_act(be, C0, nc))
                                         : (cf ? poison(be, 4 * nc) : poison_act(be, nc));
    size_t wsb;
    void* ws = ws_for(be, FP8_OP_GEMM, g->fp8, M, N, K, 1, &wsb);
    GemmDesc d = {M, N, K, g->ta, g->tb, g->lda, g->ldb, g->ldc, g->alpha, g->beta, g->c_f32, NULL, g->fp8, ws, wsb, NULL};
    if (g->cin) d.c_in = cf ? (void*)up_f32(be, C0, nc) : up_act(be, C0, nc);
    cuda_fp8_set_path(be, path);
    size_t lt0, fb0, lt1, fb1;
    cuda_fp8_counts(be, &lt0, &fb0);
    be->gemm(be, &d, up_act(be, A, (size_t)ar * lda), up_act(be, B, (size_t)br * ldb), dC);
    cuda_fp8_counts(be, &lt1, &fb1);
    cuda_fp8_set_path(be, 0);
    float* got = cf ? down_f32(be, dC, nc) : down_act(be, dC, nc);
    float *oa = op_a(A, M, K, g->ta, lda), *ob = op_bt(B, N, K, g->tb, ldb);
    QTN q = qtn_make(oa, ob, M, N, K, g->fp8 == FP8_WEIGHT);
    int* rows = xmalloc(sizeof(int) * (M + 64));
    const int nr = pick_rows(M, rows);
    float *gr = xmalloc(sizeof(float) * (size_t)nr * N), *ad = xmalloc(sizeof(float) * (size_t)nr * N);
    for (int k = 0; k < nr; k++)
        for (int j = 0; j < N; j++) {
            gr[(size_t)k * N + j] = got[(size_t)rows[k] * ldc + j];
            ad[(size_t)k * N + j] = C0[(size_t)rows[k] * ldc + j];
        }
    char label[64];
    snprintf(label, sizeof label, "gemm %s%s%s", g->name, path == 2 ? " (fallback)" : "", g_tag);
    check_rows(m, label, &q, rows, nr, gr, (size_t)N, ad, g->alpha, g->beta, !cf, 0);
    // untouched: the columns past N of a padded C
    if (ldc > N && g->beta == 0.f) {
        size_t touched = 0;
        for (int i = 0; i < M; i++)
            for (int j = N; j < ldc; j++) touched += !isnan(got[(size_t)i * ldc + j]);
        EXPECT(touched == 0, "%s [%s]: %zu elements past N written", label, m->name, touched);
    }
    // the path: forced fallback never calls cuBLASLt; on Hopper the auto path runs cuBLASLt when N % 8 = 0
    // and M ≥ 8 (M % 8 rows again on the last 8: fp8_lt_tail), the fallback exactly when N % 8 ≠ 0 or M < 8
    if (path == 2) {
        EXPECT(lt1 == lt0 && fb1 > fb0, "%s [%s]: the forced fallback ran cuBLASLt %zu times", label, m->name, lt1 - lt0);
    } else if (g_hopper) {
        const int lt_shape = N % 8 == 0 && M >= 8;
        EXPECT(lt_shape ? lt1 > lt0 : lt1 == lt0, "%s [%s]: cuBLASLt calls %zu", label, m->name, lt1 - lt0);
        EXPECT((M < 8 || N % 8 != 0) ? fb1 > fb0 : fb1 == fb0, "%s [%s]: fallback launches %zu (cuBLASLt refused?)",
               label, m->name, fb1 - fb0);
    }
    qtn_free(&q);
    free(A), free(B), free(C0), free(got), free(oa), free(ob), free(rows), free(gr), free(ad);
    dev_free_all();
}

static void test_gemm_fp8(void) {
    FOR_MODES for (size_t i = 0; i < sizeof GCASES / sizeof GCASES[0]; i++) {
        run_gemm_case(m, &GCASES[i], 0);
        run_gemm_case(m, &GCASES[i], 2);
    }
}

// gemm_grouped (and its SwiGLU form): per group, rows of A against B_g
static void run_grouped(const Mode* m, const int* off, int G, int N, int K, int tb, Fp8Gemm f, int swiglu, int path,
                        const char* name, float bscale) {
    Backend* be = m->gpu;
    const int R = off[G];
    const size_t na = (size_t)R * K, nb = (size_t)G * N * K, nc = (size_t)R * N;
    float* A = act_data(R > 0 ? R : 1, K, K, 1.f);
    float* B = act_data(G * (tb ? N : K), tb ? K : N, tb ? K : N, bscale);
    round_act(m, A, na);
    round_act(m, B, nb);
    size_t wsb;
    void* ws = ws_for(be, FP8_OP_GROUPED, f, R, N, K, G, &wsb);
    GemmDesc d = {.N = N, .K = K, .trans_b = tb, .alpha = 1, .fp8 = f, .ws = ws, .ws_bytes = wsb};
    GroupDesc gd = {.groups = G, .host_off = off, .b_stride = (size_t)N * K};
    void *dA = up_act(be, A, na), *dB = up_act(be, B, nb), *dC = poison_act(be, nc);
    const int F = N / 2;
    float* sc = randu(R > 0 ? R : 1, 0.2f, 1.f);
    void* dh = swiglu ? poison_act(be, (size_t)R * F) : NULL;
    cuda_fp8_set_path(be, path);
    if (swiglu) be->gemm_grouped_swiglu(be, &d, &gd, dA, dB, dC, dh, up_f32(be, sc, R));
    else be->gemm_grouped(be, &d, &gd, dA, dB, dC);
    float* got = down_act(be, dC, nc);
    char label[64];
    snprintf(label, sizeof label, "%s%s", name, path == 2 ? " (fallback)" : "");
    if (!swiglu) {  // deterministic: the same inputs give the same bits
        void* dC2 = poison_act(be, nc);
        be->gemm_grouped(be, &d, &gd, dA, dB, dC2);
        char l2[64];
        snprintf(l2, sizeof l2, "%.56s twice", label);
        cmp_bits(m, l2, down_act(be, dC, nc), down_act(be, dC2, nc), nc);
    }
    cuda_fp8_set_path(be, 0);
    for (int g = 0; g < G; g++) {
        const int r0 = off[g], rows = off[g + 1] - r0;
        if (!rows) continue;
        float* ob = op_bt(B + (size_t)g * N * K, N, K, tb, tb ? K : N);
        QTN q = qtn_make(A + (size_t)r0 * K, ob, rows, N, K, f == FP8_WEIGHT);
        int* rs = xmalloc(sizeof(int) * (rows + 64));
        const int nr = pick_rows(rows, rs);
        float* gr = xmalloc(sizeof(float) * (size_t)nr * N);
        for (int k = 0; k < nr; k++) memcpy(gr + (size_t)k * N, got + (size_t)(r0 + rs[k]) * N, sizeof(float) * N);
        check_rows(m, label, &q, rs, nr, gr, (size_t)N, NULL, 1.f, 0.f, m->bf16, 0);
        qtn_free(&q);
        free(ob), free(rs), free(gr);
    }
    if (swiglu) {  // h from the GPU's own gu, as swiglu_fwd computes it
        float* h = xmalloc(sizeof(float) * ((size_t)R * F + 1));
        g_cpu->swiglu_fwd(g_cpu, h, got, sc, R, F);
        snprintf(label, sizeof label, "%s h%s", name, path == 2 ? " (fallback)" : "");
        cmp(m, label, down_act(be, dh, (size_t)R * F), h, (size_t)R * F, TOL(TOL_F32, TOL_BF16_OUT));
        free(h);
    }
    free(A), free(B), free(got), free(sc);
    dev_free_all();
}

static void test_grouped_fp8(void) {
    const int offs[][5] = {{0, 13, 13, 120, 203}, {0, 0, 64, 64, 136}};  // empty groups; rows % 8 ≠ 0, the last too
    FOR_MODES for (int c = 0; c < 2; c++) for (int tb = 0; tb < 2; tb++) for (int path = 0; path <= 2; path += 2) {
        run_grouped(m, offs[c], 4, 256, 640, tb, FP8_WEIGHT, 0, path, tb ? "gemm_grouped W fwd" : "gemm_grouped W dgrad",
                    0.02f);
    }
    FOR_MODES for (int path = 0; path <= 2; path += 2) {
        run_grouped(m, offs[0], 4, 192, 256, 1, FP8_ACT, 0, path, "gemm_grouped A", 1.f);
        run_grouped(m, offs[0], 4, 256, 384, 1, FP8_WEIGHT, 1, path, "gemm_grouped_swiglu W", 0.02f);
    }
}

// gemm_grouped_wgrad: dB_g [N, K] = dY_gᵀ X_g (+ dB_g)
static void run_wgrad(const Mode* m, const int* off, int G, int N, int K, float beta, int db_act, int path,
                      const char* name) {
    Backend* be = m->gpu;
    const int R = off[G];
    const size_t ny = (size_t)R * N, nx = (size_t)R * K, nb = (size_t)G * N * K;
    float *dY = act_data(R, N, N, 1e-3f), *X = act_data(R, K, K, 1.f), *B0 = act_data(G * N, K, K, 0.05f);
    round_act(m, dY, ny);
    round_act(m, X, nx);
    const int bf = db_act && m->bf16;  // dB is bf16
    if (bf) round_act(m, B0, nb);
    size_t wsb;
    void* ws = ws_for(be, FP8_OP_WGRAD, FP8_ACT, R, N, K, G, &wsb);
    GroupDesc gd = {.groups = G, .host_off = off, .b_stride = (size_t)N * K, .db_act = db_act, .fp8 = FP8_ACT,
                    .ws = ws, .ws_bytes = wsb};
    void* dB = beta != 0.f ? (db_act ? up_act(be, B0, nb) : (void*)up_f32(be, B0, nb))
                           : (db_act ? poison_act(be, nb) : poison(be, 4 * nb));
    cuda_fp8_set_path(be, path);
    be->gemm_grouped_wgrad(be, &gd, N, K, up_act(be, dY, ny), up_act(be, X, nx), dB, beta);
    cuda_fp8_set_path(be, 0);
    float* got = db_act ? down_act(be, dB, nb) : down_f32(be, dB, nb);
    char label[64];
    snprintf(label, sizeof label, "%s%s", name, path == 2 ? " (fallback)" : "");
    for (int g = 0; g < G; g++) {
        const int r0 = off[g], rows = off[g + 1] - r0;
        float *gotg = got + (size_t)g * N * K, *b0 = B0 + (size_t)g * N * K;
        if (!rows) {  // beta 0: zeros; beta 1: unchanged
            size_t bad = 0;
            for (size_t i = 0; i < (size_t)N * K; i++) bad += beta == 0.f ? gotg[i] != 0.f : memcmp(&gotg[i], &b0[i], 4) != 0;
            EXPECT(bad == 0, "%s [%s]: empty group %d: %zu elements not %s", label, m->name, g, bad,
                   beta == 0.f ? "zero" : "unchanged");
            continue;
        }
        // opA = dY_gᵀ [N, rows], opBt = X_gᵀ [K, rows]
        float *ta = xmalloc(sizeof(float) * (size_t)N * rows), *tx = xmalloc(sizeof(float) * (size_t)K * rows);
        for (int i = 0; i < rows; i++) {
            for (int n = 0; n < N; n++) ta[(size_t)n * rows + i] = dY[(size_t)(r0 + i) * N + n];
            for (int k = 0; k < K; k++) tx[(size_t)k * rows + i] = X[(size_t)(r0 + i) * K + k];
        }
        QTN q = qtn_make(ta, tx, N, K, rows, 0);
        int* rs = xmalloc(sizeof(int) * (N + 64));
        const int nr = pick_rows(N, rs);
        float *gr = xmalloc(sizeof(float) * (size_t)nr * K), *ad = xmalloc(sizeof(float) * (size_t)nr * K);
        for (int k = 0; k < nr; k++) {
            memcpy(gr + (size_t)k * K, gotg + (size_t)rs[k] * K, sizeof(float) * K);
            memcpy(ad + (size_t)k * K, b0 + (size_t)rs[k] * K, sizeof(float) * K);
        }
        check_rows(m, label, &q, rs, nr, gr, (size_t)K, ad, 1.f, beta, bf, 0);
        qtn_free(&q);
        free(ta), free(tx), free(rs), free(gr), free(ad);
    }
    free(dY), free(X), free(B0), free(got);
    dev_free_all();
}

// Every group fits in ws here, so each is one product (no row chunks: checked).
static void test_wgrad_fp8(void) {
    const int off[] = {0, 50, 50, 180, 300};  // an empty group; rows not a multiple of 16 or 128
    FOR_MODES {
        const size_t s0 = cuda_fp8_wgrad_splits(m->gpu);
        for (int path = 0; path <= 2; path += 2) {
            run_wgrad(m, off, 4, 192, 256, 0.f, 0, path, "wgrad A beta 0");
            run_wgrad(m, off, 4, 192, 256, 1.f, 0, path, "wgrad A beta 1");
            run_wgrad(m, off, 4, 192, 256, 1.f, 1, path, "wgrad A db_act beta 1");
            run_wgrad(m, off, 4, 192, 256, 0.f, 1, path, "wgrad A db_act beta 0");
        }
        const size_t split = cuda_fp8_wgrad_splits(m->gpu) - s0;
        EXPECT(split == 0, "wgrad [%s]: %zu groups were taken in row chunks, want each in one product", m->name, split);
    }
}

// gemm_grouped_swiglu_bwd (the SwiGLU backward with w13's two products, per group on one read of
// d(gate|up) for both quantisations) against the three ops it is defined by, run on the GPU on
// the same inputs: dW, dX and dscale bit for bit (the same kernels on the same values, each
// product the same cuBLASLt call; the three ops are checked against the spec above). ws holds
// every group, so each must take the op's own path (counted).
static void run_swiglu_bwd(const Mode* m, const int* off, int G, int F, int K, float beta, int db_act, int path,
                           const char* name) {
    Backend* be = m->gpu;
    const int R = off[G], F2 = 2 * F;
    const size_t nh = (size_t)R * F, ng = (size_t)R * F2, nx = (size_t)R * K, nw = (size_t)G * F2 * K;
    float *dh = act_data(R, F, F, 1e-3f), *gu = act_data(R, F2, F2, 1.f), *X = act_data(R, K, K, 1.f);
    float *W = act_data(G * F2, K, K, 0.02f), *W0 = act_data(G * F2, K, K, 0.05f), *sc = xmalloc(sizeof(float) * R);
    for (int r = 0; r < R; r++) sc[r] = 0.25f + 0.5f * rng_uniform(&g_rng);
    round_act(m, dh, nh), round_act(m, gu, ng), round_act(m, X, nx), round_act(m, W, nw);
    const int bf = db_act && m->bf16;
    if (bf) round_act(m, W0, nw);
    size_t wsb = be->fp8_ws_bytes(be, FP8_OP_WGRAD, FP8_ACT, R, F2, K, G);
    const size_t w2 = be->fp8_ws_bytes(be, FP8_OP_GROUPED, FP8_WEIGHT, R, K, F2, G), w3 = cuda_fp8_swiglu_bwd_ws(be, R, F, K);
    wsb = wsb > w2 ? wsb : w2;
    wsb = wsb > w3 ? wsb : w3;
    void* ws = poison(be, wsb);
    GemmDesc d = {.N = K, .K = F2, .alpha = 1, .beta = 0, .fp8 = FP8_WEIGHT, .ws = ws, .ws_bytes = wsb};
    GroupDesc gd = {.groups = G, .host_off = off, .b_stride = (size_t)F2 * K, .db_act = db_act, .fp8 = FP8_ACT,
                    .ws = ws, .ws_bytes = wsb};
    void *ddh = up_act(be, dh, nh), *dx_ = up_act(be, X, nx), *dw_ = up_act(be, W, nw);
    float* dsc = up_f32(be, sc, R);
    void* out[3][2];  // [fused, three ops, fused on kept weight codes][dW, dX]
    float* ods[3];
    void* codes = dev_alloc(be, be->fp8_wcodes_bytes(be, F2, K, G));
    be->fp8_wcodes_make(be, dw_, F2, K, G, (size_t)F2 * K, codes);
    const Fp8WCodes wq = {.codes = codes, .R = F2, .C = K, .groups = G};
    cuda_fp8_set_path(be, path);
    for (int k = 0; k < 3; k++) {
        void* dgu = up_act(be, gu, ng);
        out[k][0] = beta != 0.f ? (db_act ? up_act(be, W0, nw) : (void*)up_f32(be, W0, nw))
                                : (db_act ? poison_act(be, nw) : poison(be, 4 * nw));
        out[k][1] = poison_act(be, nx);
        ods[k] = poison(be, 4 * (size_t)R);
        const size_t f0 = cuda_fp8_w13_groups(be);
        if (k == 0) {
            be->gemm_grouped_swiglu_bwd(be, &d, &gd, ddh, dgu, dsc, ods[k], dx_, dw_, out[k][0], beta, out[k][1]);
        } else if (k == 1) {
            gemm_grouped_swiglu_bwd_seq(be, &d, &gd, ddh, dgu, dsc, ods[k], dx_, dw_, out[k][0], beta, out[k][1]);
        } else {  // W itself poisoned: the op must read the codes
            GemmDesc dk = d;
            dk.wq = &wq;
            be->gemm_grouped_swiglu_bwd(be, &dk, &gd, ddh, dgu, dsc, ods[k], dx_, poison_act(be, nw), out[k][0], beta,
                                        out[k][1]);
        }
        const size_t fused = cuda_fp8_w13_groups(be) - f0;
        size_t want = 0;
        for (int g = 0; g < G; g++) want += k != 1 && off[g + 1] > off[g];
        EXPECT(fused == want, "%s [%s]: %zu groups on the op's own path, want %zu", name, m->name, fused, want);
    }
    cuda_fp8_set_path(be, 0);
    const size_t ew = db_act ? dtype_size(be->act_dtype) : 4, ea = dtype_size(be->act_dtype);
    unsigned char *a = xmalloc(ew * nw), *b = xmalloc(ew * nw);
    be->to_host(be, a, out[0][0], ew * nw), be->to_host(be, b, out[1][0], ew * nw);
    size_t bad = 0;
    for (size_t i = 0; i < nw; i++) bad += memcmp(a + i * ew, b + i * ew, ew) != 0;
    EXPECT(bad == 0, "%s%s [%s]: %zu of %zu dW elements differ from the three ops'", name, path ? " (fallback)" : "",
           m->name, bad, nw);
    free(a), free(b);
    a = xmalloc(ea * nx), b = xmalloc(ea * nx);
    be->to_host(be, a, out[0][1], ea * nx), be->to_host(be, b, out[1][1], ea * nx);
    bad = 0;
    for (size_t i = 0; i < nx; i++) bad += memcmp(a + i * ea, b + i * ea, ea) != 0;
    EXPECT(bad == 0, "%s%s [%s]: %zu of %zu dX elements differ from the three ops'", name, path ? " (fallback)" : "",
           m->name, bad, nx);
    be->to_host(be, a, out[2][1], ea * nx);
    bad = 0;
    for (size_t i = 0; i < nx; i++) bad += memcmp(a + i * ea, b + i * ea, ea) != 0;
    EXPECT(bad == 0, "%s%s [%s]: on kept weight codes, %zu of %zu dX elements differ", name, path ? " (fallback)" : "",
           m->name, bad, nx);
    free(a), free(b);
    float *s0 = down_f32(be, ods[0], R), *s1 = down_f32(be, ods[1], R);
    bad = 0;
    for (int r = 0; r < R; r++) bad += memcmp(&s0[r], &s1[r], 4) != 0;
    EXPECT(bad == 0, "%s [%s]: %zu of %d dscale rows differ from the three ops'", name, m->name, bad, R);
    free(dh), free(gu), free(X), free(W), free(W0), free(sc), free(s0), free(s1);
    dev_free_all();
}

// Kept weight codes (Fp8WCodes: precision.fp8_weights=per_step) in gemm_grouped, forward (trans_b)
// and data gradient: the bits of quantising the weight in the op, with the weight handed over
// poisoned (the op must read the codes).
static void run_wcodes(const Mode* m, const int* off, int G, int R, int C, const char* name) {
    Backend* be = m->gpu;
    const int M = off[G];
    for (int tb = 0; tb < 2; tb++) {
        const int N = tb ? R : C, K = tb ? C : R;
        const size_t nw = (size_t)G * R * C, nc = (size_t)M * N;
        float *A = act_data(M, K, K, 1.f), *W = act_data(G * R, C, C, 0.02f);
        round_act(m, A, (size_t)M * K), round_act(m, W, nw);
        void *da = up_act(be, A, (size_t)M * K), *dw = up_act(be, W, nw);
        void* codes = dev_alloc(be, be->fp8_wcodes_bytes(be, R, C, G));
        be->fp8_wcodes_make(be, dw, R, C, G, (size_t)R * C, codes);
        const Fp8WCodes wq = {.codes = codes, .R = R, .C = C, .groups = G};
        size_t wsb;
        void* ws = ws_for(be, FP8_OP_GROUPED, FP8_WEIGHT, M, N, K, G, &wsb);
        GemmDesc d = {.N = N, .K = K, .trans_b = tb, .alpha = 1, .fp8 = FP8_WEIGHT, .ws = ws, .ws_bytes = wsb};
        GroupDesc gd = {.groups = G, .host_off = off, .b_stride = (size_t)R * C};
        void *c0 = poison_act(be, nc), *c1 = poison_act(be, nc);
        be->gemm_grouped(be, &d, &gd, da, dw, c0);
        d.wq = &wq;
        be->gemm_grouped(be, &d, &gd, da, poison_act(be, nw), c1);
        const size_t ea = dtype_size(be->act_dtype);
        unsigned char *a = xmalloc(ea * nc), *b = xmalloc(ea * nc);
        be->to_host(be, a, c0, ea * nc), be->to_host(be, b, c1, ea * nc);
        size_t bad = 0;
        for (size_t i = 0; i < nc; i++) bad += memcmp(a + i * ea, b + i * ea, ea) != 0;
        EXPECT(bad == 0, "%s tb %d [%s]: on kept weight codes, %zu of %zu elements differ", name, tb, m->name, bad, nc);
        free(a), free(b), free(A), free(W);
        dev_free_all();
    }
}

static void test_wcodes_fp8(void) {
    const int off[] = {0, 0, 37, 165, 181, 481};
    FOR_MODES run_wcodes(m, off, 5, 2 * 256, 192, "kept codes w13");
    FOR_MODES run_wcodes(m, off, 5, 136, 200, "kept codes, partial blocks");
}

static void test_swiglu_bwd_fp8(void) {
    const int off[] = {0, 0, 37, 165, 181, 481};  // an empty group; runs on into the next group's rows
    FOR_MODES for (int path = 0; path <= 2; path += 2) {
        run_swiglu_bwd(m, off, 5, 256, 192, 0.f, 0, path, "swiglu_bwd w13 beta 0");
        run_swiglu_bwd(m, off, 5, 256, 192, 1.f, 1, path, "swiglu_bwd w13 db_act beta 1");
    }
    FOR_MODES run_swiglu_bwd(m, off, 5, 100, 136, 1.f, 1, 0, "swiglu_bwd w13 2F=200");
}

// The rows taken 128 at a time instead of 4,096 (the ops' row chunks: several per GEMM and group,
// the weight gradient's chunks summed in fp32, a bf16 dB rounded once at the end)
static void test_chunked(void) {
    FOR_MODES cuda_fp8_set_row_chunk(m->gpu, 128);
    g_tag = " ch128";
    // 300 rows: the GEMMs' chunks 104, 104 and 92 (one size), the weight gradient's 128, 128 and 44
    const int off[] = {0, 300, 300, 420, 700};
    FOR_MODES {
        const size_t s0 = cuda_fp8_wgrad_splits(m->gpu);
        for (size_t i = 0; i < sizeof GCASES / sizeof GCASES[0]; i++) run_gemm_case(m, &GCASES[i], 0);
        // a bf16 C with beta: the fp32 product through the epilogue 16 KiB of rows at a time
        cuda_fp8_set_epi_bytes(m->gpu, 16 << 10);
        g_tag = " ch128 epi16k";
        for (size_t i = 0; i < sizeof GCASES / sizeof GCASES[0]; i++) run_gemm_case(m, &GCASES[i], 0);
        cuda_fp8_set_epi_bytes(m->gpu, (size_t)32 << 20);
        g_tag = " ch128";
        run_grouped(m, off, 4, 256, 384, 1, FP8_WEIGHT, 0, 0, "gemm_grouped W ch128", 0.02f);
        run_grouped(m, off, 4, 256, 384, 0, FP8_WEIGHT, 0, 2, "gemm_grouped W dgrad ch128", 0.02f);
        run_wgrad(m, off, 4, 192, 256, 0.f, 0, 0, "wgrad A beta 0 ch128");
        run_wgrad(m, off, 4, 192, 256, 1.f, 0, 0, "wgrad A beta 1 ch128");
        run_wgrad(m, off, 4, 192, 256, 1.f, 1, 0, "wgrad A db_act beta 1 ch128");
        run_wgrad(m, off, 4, 192, 256, 0.f, 1, 2, "wgrad A db_act beta 0 ch128");
        // a bf16 dB's fp32 sums 64 rows at a time: three blocks of dB, each over every chunk (groups
        // 0 and 3); group 2 (one chunk) takes the epilogue path, whose rows need more ws than the sums
        cuda_fp8_set_wgrad_acc(m->gpu, 4 * 256 * 64);
        run_wgrad(m, off, 4, 192, 256, 1.f, 1, 0, "wgrad A db_act beta 1 ch128 acc64");
        run_wgrad(m, off, 4, 192, 256, 0.f, 1, 0, "wgrad A db_act beta 0 ch128 acc64");
        cuda_fp8_set_wgrad_acc(m->gpu, (size_t)256 << 20);
        // ws sized for 128-row chunks holds neither group 0 (300 rows) nor group 3 (280) whole: 6
        // runs × 2 groups
        const size_t split = cuda_fp8_wgrad_splits(m->gpu) - s0;
        EXPECT(split == 12, "wgrad ch128 [%s]: %zu groups taken in row chunks, want 12", m->name, split);
    }
    g_tag = "";
    FOR_MODES cuda_fp8_set_row_chunk(m->gpu, 4096);
}

// Mixtral-8x7B's six expert GEMMs (H 4,096, F 14,336) on two experts of 1,000 and 1,037 rows, in
// bf16, through the auto path (cuBLASLt on Hopper; the fallback for the 5 rows past a multiple of 8);
// 4 spread and the last 4 rows of each output checked
// On Hopper these must run on cuBLASLt (the fallback kernel taking them all would pass the checks).
static void expect_lt(const Mode* m, const char* what, size_t lt0) {
    size_t lt, fb;
    cuda_fp8_counts(m->gpu, &lt, &fb);
    EXPECT(!g_hopper || lt > lt0, "%s [%s]: cuBLASLt never ran (the fallback kernel took every product)", what, m->name);
}

static void test_mixtral_shapes(void) {
    const Mode* m = &g_modes[1];
    const int H = 4096, F = 14336, off[] = {0, 1000, 2037};
    size_t lt, fb;
    g_spread = 4, g_tail = 4;
#define MIXTRAL(what, call) (cuda_fp8_counts(m->gpu, &lt, &fb), call, expect_lt(m, what, lt))
    MIXTRAL("w13 fwd", run_grouped(m, off, 2, 2 * F, H, 1, FP8_WEIGHT, 1, 0, "w13 fwd (swiglu) 8x7B", 0.02f));
    MIXTRAL("w2 fwd", run_grouped(m, off, 2, H, F, 1, FP8_WEIGHT, 0, 0, "w2 fwd 8x7B", 0.02f));
    MIXTRAL("w13 dgrad", run_grouped(m, off, 2, H, 2 * F, 0, FP8_WEIGHT, 0, 0, "w13 dgrad 8x7B", 0.02f));
    MIXTRAL("w2 dgrad", run_grouped(m, off, 2, F, H, 0, FP8_WEIGHT, 0, 0, "w2 dgrad 8x7B", 0.02f));
    MIXTRAL("w13 wgrad", run_wgrad(m, off, 2, 2 * F, H, 1.f, 0, 0, "w13 wgrad 8x7B"));
    MIXTRAL("w2 wgrad", run_wgrad(m, off, 2, H, F, 1.f, 0, 0, "w2 wgrad 8x7B"));
    MIXTRAL("w13 swiglu bwd", run_swiglu_bwd(m, off, 2, F, H, 1.f, 1, 0, "swiglu_bwd w13 8x7B"));
#undef MIXTRAL
    g_spread = 48, g_tail = 8;
}

// fp8_ws_bytes depends only on its arguments, grows with them, and is 0 with fp8 off
static void test_ws_bytes(void) {
    FOR_MODES {
        Backend* be = m->gpu;
        EXPECT(be->fp8_ws_bytes(be, FP8_OP_GEMM, FP8_OFF, 64, 64, 64, 1) == 0, "ws with fp8 off is not 0");
        const size_t a = be->fp8_ws_bytes(be, FP8_OP_GROUPED, FP8_WEIGHT, 1000, 256, 512, 8);
        EXPECT(a == be->fp8_ws_bytes(be, FP8_OP_GROUPED, FP8_WEIGHT, 1000, 256, 512, 8), "ws not deterministic");
        EXPECT(be->fp8_ws_bytes(be, FP8_OP_GROUPED, FP8_WEIGHT, 2000, 256, 512, 8) > a, "ws does not grow with rows");
        EXPECT(be->fp8_ws_bytes(be, FP8_OP_WGRAD, FP8_ACT, 1000, 256, 512, 8) >= (size_t)(256 + 512) * 1000,
               "wgrad ws smaller than its codes");
    }
}

// Hopper with this build (sm_90a) has FP8 GEMMs: a refusal there is a bug, not a skip. (A check
// outside RUN would not count: RUN turns a test's failed EXPECTs into its verdict.)
static void test_fp8_available(void) {
    Backend* be = g_modes[0].gpu;
    EXPECT(be->fp8_ws_bytes || cuda_compute_capability(be) < 9,
           "FP8 GEMMs refused on a compute-capability-9 GPU (cuda_fp8_kernels_built: %d)", cuda_fp8_kernels_built());
    EXPECT(!be->fp8_ws_bytes || cuda_fp8_kernels_built() == 1, "the fallback kernel holds no FP8 code for this GPU");
}

// --small: without the Mixtral-sized shapes (compute-sanitizer's memcheck: scripts/gpu_check.sh san)
int main(int argc, char** argv) {
    const int small = argc > 1 && !strcmp(argv[1], "--small");
    if (gpu_setup("test_cuda_fp8")) return 1;
    RUN(test_fp8_available);
    if (!g_modes[0].gpu->fp8_ws_bytes) {
        printf("skip: no FP8 GEMMs here (compute capability below 8.9, or a build without code for it)\n");
        gpu_teardown();
        TEST_END();
    }
    g_hopper = cuda_compute_capability(g_modes[0].gpu) == 9;
    fp8_bound_init();
    RUN(test_bound_control);
    RUN(test_ws_bytes);
    RUN(test_gemm_fp8);
    RUN(test_grouped_fp8);
    RUN(test_wgrad_fp8);
    RUN(test_swiglu_bwd_fp8);
    RUN(test_wcodes_fp8);
    RUN(test_chunked);
    if (!small) RUN(test_mixtral_shapes);
    gpu_teardown();
    TEST_END();
}
