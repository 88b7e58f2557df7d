// cpu_gemm_fp8.c — the CPU GEMMs with GemmDesc.fp8 / GroupDesc.fp8 set: the block-scaled FP8
// product of backend.h's contract, composed from the spec functions of src/fp8.h.
//
// Every call: quantise op(A) [M,K] in 1×128 tiles along K, op(B)ᵀ [N,K] along K (128×128 blocks for
// FP8_WEIGHT, 1×128 tiles for FP8_ACT), r = fp8_gemm_tn (fp32), then C = alpha·r + beta·addend in
// fp32 (the act dtype here: nothing more to round). A transposed operand is quantised through the
// quantisers' column-wise (transposed) outputs, which equal the row-wise quantisation of the explicit
// transpose bit for bit (fp8.h). The caller's ws holds the codes, the scales and r: no allocation.
#include <string.h>

#include "cpu.h"
#include "fp8.h"

static size_t al256(size_t x) { return (x + 255) & ~(size_t)255; }

// Codes and scales of an [R, C] operand quantised along C: 1×128 tiles, or 128×128 blocks (blk).
static size_t quant_bytes(size_t R, size_t C, int blk) {
    return al256(R * C) + al256(sizeof(float) * (blk ? fp8_tiles(R) : R) * fp8_tiles(C));
}

size_t cpu_fp8_ws_bytes(Backend* be, Fp8Op op, Fp8Gemm fp8, int M, int N, int K, int groups) {
    (void)be, (void)groups;
    if (fp8 == FP8_OFF) return 0;
    CHECK(M >= 0 && N >= 0 && K >= 0, "fp8_ws_bytes: negative size M=%d N=%d K=%d", M, N, K);
    const size_t m = (size_t)M, n = (size_t)N, k = (size_t)K;
    switch (op) {
    case FP8_OP_GEMM:
    case FP8_OP_GROUPED:  // all of A at once (row-wise tiles do not cross rows), one B_g at a time, r for every row
        return quant_bytes(m, k, 0) + quant_bytes(n, k, fp8 == FP8_WEIGHT) + al256(sizeof(float) * m * n);
    case FP8_OP_WGRAD:  // one group at a time: dY_gᵀ [N, rows] and X_gᵀ [K, rows] with rows ≤ M, r [N, K]
        CHECK(fp8 == FP8_ACT, "fp8_ws_bytes: gemm_grouped_wgrad takes FP8_ACT only (got %d)", (int)fp8);
        return quant_bytes(n, m, 0) + quant_bytes(k, m, 0) + al256(sizeof(float) * n * k);
    }
    FATAL("fp8_ws_bytes: unknown op %d", (int)op);
    return 0;
}

// Hands out consecutive 256-byte-aligned pieces of the caller's ws.
typedef struct Carve {
    char* p;
    size_t left;
} Carve;
static void* carve(Carve* c, size_t bytes) {
    bytes = al256(bytes);
    void* p = c->p;  // the sizes were checked against fp8_ws_bytes: never short here
    c->p += bytes;
    c->left -= bytes;
    return p;
}

static Carve ws_take(Backend* be, const char* op, Fp8Op kind, Fp8Gemm fp8, int M, int N, int K, int groups, void* ws,
                     size_t ws_bytes) {
    const size_t need = cpu_fp8_ws_bytes(be, kind, fp8, M, N, K, groups);
    CHECK(need == 0 || ws, "%s (fp8): no workspace given (ws NULL; %zu bytes needed, Backend.fp8_ws_bytes)", op, need);
    CHECK(ws_bytes >= need, "%s (fp8): workspace of %zu bytes, %zu needed (Backend.fp8_ws_bytes M=%d N=%d K=%d)", op,
          ws_bytes, need, M, N, K);
    return (Carve){.p = ws, .left = ws_bytes};
}

// The pieces of ws for C = op(A) · op(B) in FP8 (FP8_OP_GEMM / FP8_OP_GROUPED in cpu_fp8_ws_bytes):
// codes and scales of op(A) [M, K] (1×128 tiles, tk along K) and of op(B)ᵀ [N, K] (128×128 blocks
// when blk, FP8_WEIGHT; else 1×128 tiles), and the fp32 product r [M, N].
typedef struct Tn {
    uint8_t *qa, *qb;
    float *sa, *sb, *r;
    size_t tk;
    int blk;
} Tn;
static Tn tn_carve(Carve* w, Fp8Gemm fp8, int M, int N, int K) {
    Tn t = {.blk = fp8 == FP8_WEIGHT, .tk = fp8_tiles((size_t)K)};
    t.qa = carve(w, (size_t)M * K);
    t.sa = carve(w, sizeof(float) * M * t.tk);
    t.qb = carve(w, (size_t)N * K);
    t.sb = carve(w, sizeof(float) * (t.blk ? fp8_tiles((size_t)N) : (size_t)N) * t.tk);
    t.r = carve(w, sizeof(float) * (size_t)M * N);
    return t;
}

// ---- Fp8WCodes (backend.h): a group's codes as [q R×C][s][qt C×R][st], fp8_quant_128x128's layouts ---
static size_t wc_part(size_t R, size_t C) { return al256(R * C) + al256(sizeof(float) * fp8_tiles(R) * fp8_tiles(C)); }
static size_t wc_group(int R, int C) { return 2 * wc_part((size_t)R, (size_t)C); }

size_t cpu_fp8_wcodes_bytes(Backend* be, int R, int C, int groups) {
    (void)be;
    CHECK(R >= 0 && C >= 0 && groups >= 0, "fp8_wcodes_bytes: negative size R=%d C=%d groups=%d", R, C, groups);
    return (size_t)groups * wc_group(R, C);
}

void cpu_fp8_wcodes_make(Backend* be, const void* W_, int R, int C, int groups, size_t b_stride, void* codes) {
    (void)be;
    const float* W = W_;
    for (int g = 0; g < groups; g++) {
        char* p = (char*)codes + (size_t)g * wc_group(R, C);
        uint8_t* q = (uint8_t*)p;
        float* sc = (float*)(p + al256((size_t)R * C));
        uint8_t* qt = (uint8_t*)(p + wc_part((size_t)R, (size_t)C));
        float* st = (float*)(p + wc_part((size_t)R, (size_t)C) + al256((size_t)R * C));
        fp8_quant_128x128(W + (size_t)g * b_stride, R, C, (size_t)C, q, sc, qt, st);
    }
}

// ---- X's codes along its groups' rows (backend.h: fp8_xcodes_*): per group of r rows, Xᵀ's codes
// [K, r] and scales [K, tiles(r)], fp8_quant_1x128's column-wise outputs, the groups one after another
static size_t xc_group(size_t rows, size_t K) { return rows ? al256(K * rows) + al256(sizeof(float) * K * fp8_tiles(rows)) : 0; }

size_t cpu_fp8_xcodes_bytes(Backend* be, int R, int groups, int K) {
    (void)be;
    CHECK(R >= 0 && groups >= 0 && K >= 0, "fp8_xcodes_bytes: negative size R=%d groups=%d K=%d", R, groups, K);
    // Σ tiles(r_g) ≤ R/128 + groups, and each part rounds up by less than 256 bytes
    const size_t k = (size_t)K, g = (size_t)groups;
    return k * R + sizeof(float) * k * ((size_t)R / 128 + g) + 2 * 256 * g;
}

void cpu_fp8_xcodes_make(Backend* be, const GroupDesc* g, const void* X_, int K, void* xq) {
    (void)be;
    fp8_xcodes_check(g, K);
    const float* X = X_;
    char* p = xq;
    for (int i = 0; i < g->groups; i++) {
        const size_t r0 = (size_t)g->host_off[i], rows = (size_t)g->host_off[i + 1] - r0;
        if (!rows) continue;
        fp8_quant_1x128(X + r0 * K, rows, (size_t)K, (size_t)K, NULL, NULL, (uint8_t*)p,
                        (float*)(p + al256((size_t)K * rows)));
        p += xc_group(rows, (size_t)K);
    }
}

// Group i of an op's B from its Fp8WCodes into qb, sb (op(B)ᵀ [N, K]: q for trans_b, qt without).
static void wcodes_b(const Fp8WCodes* wq, int i, int trans_b, uint8_t* qb, float* sb) {
    const int R = wq->R, C = wq->C;
    const char* p = (const char*)wq->codes + (size_t)(wq->g0 + i) * wc_group(R, C);
    if (!trans_b) p += wc_part((size_t)R, (size_t)C);
    memcpy(qb, p, (size_t)R * C);
    memcpy(sb, p + al256((size_t)R * C), sizeof(float) * fp8_tiles((size_t)R) * fp8_tiles((size_t)C));
}

// qb, sb = op(B)ᵀ [N, K] quantised along K; B is [N, K] (trans_b) or [K, N], row stride ldb.
static void quant_b(const float* B, int ldb, int trans_b, int N, int K, Fp8Gemm fp8, uint8_t* qb, float* sb) {
    if (fp8 == FP8_WEIGHT) {
        if (trans_b) fp8_quant_128x128(B, N, K, (size_t)ldb, qb, sb, NULL, NULL);
        else fp8_quant_128x128(B, K, N, (size_t)ldb, NULL, NULL, qb, sb);
    } else {
        if (trans_b) fp8_quant_1x128(B, N, K, (size_t)ldb, qb, sb, NULL, NULL);
        else fp8_quant_1x128(B, K, N, (size_t)ldb, NULL, NULL, qb, sb);
    }
}

// C[M, N] (row stride ldc) = alpha · r + beta · addend (addend stride ldc; beta = 0 reads nothing).
static void combine(float* C, int ldc, const float* r, int M, int N, float alpha, float beta, const float* addend) {
#pragma omp parallel for schedule(static) if ((size_t)M * N >= 32768)
    for (int i = 0; i < M; i++) {
        float* c = C + (size_t)i * ldc;
        const float* ri = r + (size_t)i * N;
        if (beta == 0) {
            for (int j = 0; j < N; j++) c[j] = alpha * ri[j];
        } else {
            const float* a = addend + (size_t)i * ldc;
            for (int j = 0; j < N; j++) c[j] = alpha * ri[j] + beta * a[j];
        }
    }
}

static void check_mode(const char* op, Fp8Gemm fp8) {
    CHECK(fp8 == FP8_WEIGHT || fp8 == FP8_ACT, "%s: unknown fp8 mode %d", op, (int)fp8);
}

void cpu_gemm_fp8(Backend* be, const GemmDesc* d, const void* A_, const void* B_, void* C_) {
    const float *A = A_, *B = B_;
    float* C = C_;
    int lda, ldb, ldc;
    gemm_desc_check(d, &lda, &ldb, &ldc);
    check_mode("gemm", d->fp8);
    const int M = d->M, N = d->N, K = d->K;
    Carve w = ws_take(be, "gemm", FP8_OP_GEMM, d->fp8, M, N, K, 1, d->ws, d->ws_bytes);
    if (M == 0 || N == 0) return;
    const Tn t = tn_carve(&w, d->fp8, M, N, K);
    if (d->trans_a) fp8_quant_1x128(A, K, M, (size_t)lda, NULL, NULL, t.qa, t.sa);  // A [K, M]: its column-wise tiles
    else fp8_quant_1x128(A, M, K, (size_t)lda, t.qa, t.sa, NULL, NULL);
    quant_b(B, ldb, d->trans_b, N, K, d->fp8, t.qb, t.sb);
    fp8_gemm_tn(M, N, K, t.qa, t.sa, t.qb, t.sb, t.blk, t.r, (size_t)N, 0);
    combine(C, ldc, t.r, M, N, d->alpha, d->beta, d->c_in ? (const float*)d->c_in : C);
}

void cpu_gemm_grouped_fp8(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* A_, const void* B_,
                          void* C_) {
    const float *A = A_, *B = B_;
    float* C = C_;
    gemm_grouped_check("gemm_grouped", d, g);
    check_mode("gemm_grouped", d->fp8);
    const int M = g->host_off[g->groups], N = d->N, K = d->K;
    GemmDesc x = *d;  // the strides with 0 (packed) resolved, checked for the whole A and C
    x.M = M, x.wq = NULL;
    int lda, ldb, ldc;
    gemm_desc_check(&x, &lda, &ldb, &ldc);
    Carve w = ws_take(be, "gemm_grouped", FP8_OP_GROUPED, d->fp8, M, N, K, g->groups, d->ws, d->ws_bytes);
    if (M == 0 || N == 0) return;
    const Tn t = tn_carve(&w, d->fp8, M, N, K);
    // A's rows of every group at once: a 1×128 tile along K lies within one row, hence one group
    fp8_quant_1x128(A, M, K, (size_t)lda, t.qa, t.sa, NULL, NULL);
    for (int i = 0; i < g->groups; i++) {
        const int r0 = g->host_off[i], rows = g->host_off[i + 1] - r0;
        if (rows == 0) continue;
        if (d->wq) wcodes_b(d->wq, i, d->trans_b, t.qb, t.sb);
        else quant_b(B + (size_t)i * g->b_stride, ldb, d->trans_b, N, K, d->fp8, t.qb, t.sb);
        fp8_gemm_tn(rows, N, K, t.qa + (size_t)r0 * K, t.sa + (size_t)r0 * t.tk, t.qb, t.sb, t.blk,
                    t.r + (size_t)r0 * N, (size_t)N, 0);
        combine(C + (size_t)r0 * ldc, ldc, t.r + (size_t)r0 * N, rows, N, d->alpha, d->beta, C + (size_t)r0 * ldc);
    }
}

void cpu_gemm_grouped_wgrad_fp8(Backend* be, const GroupDesc* g, int N, int K, const void* dY_, const void* X_,
                                void* dB_, float beta) {
    const float *dY = dY_, *X = X_;
    float* dB = dB_;  // fp32 whether or not g->db_act: the act dtype here is fp32
    gemm_grouped_wgrad_check(g, beta);
    CHECK(g->fp8 == FP8_ACT, "gemm_grouped_wgrad: fp8 must be FP8_OFF or FP8_ACT (got %d)", (int)g->fp8);
    CHECK(N >= 0 && K >= 0, "gemm_grouped_wgrad: negative size N=%d K=%d", N, K);
    const int M = g->host_off[g->groups];
    Carve w = ws_take(be, "gemm_grouped_wgrad", FP8_OP_WGRAD, g->fp8, M, N, K, g->groups, g->ws, g->ws_bytes);
    const size_t tm = fp8_tiles((size_t)M);
    uint8_t* qa = carve(&w, (size_t)N * M);
    float* sa = carve(&w, sizeof(float) * N * tm);
    uint8_t* qb = carve(&w, (size_t)K * M);
    float* sb = carve(&w, sizeof(float) * K * tm);
    float* r = carve(&w, sizeof(float) * (size_t)N * K);
    const char* xq = g->xq;
    for (int i = 0; i < g->groups; i++) {
        const int r0 = g->host_off[i], rows = g->host_off[i + 1] - r0;
        float* dBg = dB + (size_t)i * g->b_stride;
        if (rows == 0) {  // += 0, or = 0
            if (beta == 0.f) memset(dBg, 0, sizeof(float) * (size_t)N * K);
            continue;
        }
        // the group's tiles along tokens start at its first row: dY_gᵀ [N, rows] and X_gᵀ [K, rows]
        // (X_g's from xq when given: the same codes)
        fp8_quant_1x128(dY + (size_t)r0 * N, rows, N, (size_t)N, NULL, NULL, qa, sa);
        const uint8_t* qx = qb;
        const float* sx = sb;
        if (xq) {
            qx = (const uint8_t*)xq, sx = (const float*)(xq + al256((size_t)K * rows));
            xq += xc_group((size_t)rows, (size_t)K);
        } else {
            fp8_quant_1x128(X + (size_t)r0 * K, rows, K, (size_t)K, NULL, NULL, qb, sb);
        }
        fp8_gemm_tn(N, K, rows, qa, sa, qx, sx, 0, r, (size_t)K, 0);
        combine(dBg, K, r, N, K, 1.0f, beta, dBg);
    }
}
