// backend_check.c — the descriptor checks every backend runs (backend.h), written once, and the
// composed ops gemm_grouped_ffn and gemm_grouped_swiglu_bwd as the ops that define them.
#include "backend.h"
#include "util.h"

void gemm_desc_check(const GemmDesc* d, int* lda, int* ldb, int* ldc) {
    const int M = d->M, N = d->N, K = d->K;
    CHECK(!d->wq, "gemm: wq (weight codes) is for the grouped ops");
    CHECK(M >= 0 && N >= 0 && K >= 0, "gemm: negative size M=%d N=%d K=%d", M, N, K);
    *lda = d->lda ? d->lda : (d->trans_a ? M : K);
    *ldb = d->ldb ? d->ldb : (d->trans_b ? K : N);
    *ldc = d->ldc ? d->ldc : N;
    CHECK(*lda >= (d->trans_a ? M : K) && *ldb >= (d->trans_b ? K : N) && *ldc >= N,
          "gemm: row stride smaller than the row (lda=%d ldb=%d ldc=%d, M=%d N=%d K=%d)", *lda, *ldb, *ldc, M, N, K);
}

static void offsets_check(const char* op, const GroupDesc* g) {
    CHECK(g->host_off[0] == 0, "%s: host_off[0] must be 0, got %d", op, g->host_off[0]);
    for (int i = 0; i < g->groups; i++)
        CHECK(g->host_off[i + 1] >= g->host_off[i], "%s: offsets decrease at group %d (%d > %d)", op, i, g->host_off[i],
              g->host_off[i + 1]);
}

void gemm_grouped_check(const char* op, const GemmDesc* d, const GroupDesc* g) {
    CHECK(!d->trans_a, "%s: trans_a is not supported (weight gradients use gemm_grouped_wgrad)", op);
    CHECK(!d->c_in, "%s: c_in is not supported (gemm only)", op);
    offsets_check(op, g);
    const Fp8WCodes* w = d->wq;
    if (!w) return;
    CHECK(d->fp8 == FP8_WEIGHT, "%s: wq (weight codes) wants fp8 FP8_WEIGHT (got %d)", op, (int)d->fp8);
    const int R = d->trans_b ? d->N : d->K, C = d->trans_b ? d->K : d->N;
    CHECK(w->R == R && w->C == C, "%s: wq holds codes of [%d, %d] weights, B_g is [%d, %d]", op, w->R, w->C, R, C);
    CHECK(!d->ldb || d->ldb == C, "%s: wq wants B packed (ldb %d, C %d)", op, d->ldb, C);
    CHECK(w->g0 >= 0 && w->g0 + g->groups <= w->groups, "%s: groups [%d, %d) of wq's %d", op, w->g0, w->g0 + g->groups,
          w->groups);
}

void gemm_grouped_wgrad_check(const GroupDesc* g, float beta) {
    CHECK(beta == 0.f || beta == 1.f, "gemm_grouped_wgrad: beta must be 0 or 1 (got %g)", beta);
    CHECK(!g->xq || g->fp8 == FP8_ACT, "gemm_grouped_wgrad: xq (X's codes) wants fp8 FP8_ACT (got %d)", (int)g->fp8);
    offsets_check("gemm_grouped_wgrad", g);
}

void fp8_xcodes_check(const GroupDesc* g, int K) {
    CHECK(K >= 0, "fp8_xcodes_make: negative K=%d", K);
    offsets_check("fp8_xcodes_make", g);
}

void gemm_grouped_ffn_check(const GemmDesc* d, const GroupDesc* g, const GemmDesc* d2, const GroupDesc* g2,
                            const void* hq) {
    CHECK(!hq || (d->fp8 != FP8_OFF && d2->fp8 != FP8_OFF), "gemm_grouped_ffn: hq (h's codes) wants FP8 products");
    CHECK(d->N % 2 == 0 && d2->K == d->N / 2, "gemm_grouped_ffn: wants d->N = 2F and d2->K = F (N %d, K %d)", d->N,
          d2->K);
    CHECK(g2->groups == g->groups, "gemm_grouped_ffn: %d groups, then %d", g->groups, g2->groups);
    for (int i = 0; i <= g->groups; i++)
        CHECK(g2->host_off[i] == g->host_off[i], "gemm_grouped_ffn: the second product's rows differ at group %d", i);
    gemm_grouped_check("gemm_grouped_ffn", d, g);
    gemm_grouped_check("gemm_grouped_ffn", d2, g2);
}

void gemm_grouped_ffn_seq(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* A, const void* B, void* gu,
                          void* h, void* hq, const float* scale, const GemmDesc* d2, const GroupDesc* g2, const void* B2,
                          void* Y) {
    gemm_grouped_ffn_check(d, g, d2, g2, hq);
    be->gemm_grouped_swiglu(be, d, g, A, B, gu, h, scale);
    be->gemm_grouped(be, d2, g2, h, B2, Y);
    if (hq) be->fp8_xcodes_make(be, g, h, d2->K, hq);
}

void gemm_grouped_swiglu_bwd_check(const GemmDesc* d, const GroupDesc* g) {
    CHECK(!d->trans_b && d->K % 2 == 0, "gemm_grouped_swiglu_bwd: wants trans_b 0 and K = 2F (trans_b %d, K %d)",
          d->trans_b, d->K);
    CHECK(!g->xq, "gemm_grouped_swiglu_bwd: xq is not supported (its weight gradient quantises X itself)");
    gemm_grouped_check("gemm_grouped_swiglu_bwd", d, g);
}

void gemm_grouped_swiglu_bwd_seq(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* dh, void* gu,
                                 const float* scale, float* dscale, const void* X, const void* W, void* dW, float beta,
                                 void* dX) {
    gemm_grouped_swiglu_bwd_check(d, g);
    const int rows = g->host_off[g->groups], F = d->K / 2;
    be->swiglu_bwd(be, gu, dscale, dh, gu, scale, rows, F);
    be->gemm_grouped_wgrad(be, g, 2 * F, d->N, gu, X, dW, beta);
    be->gemm_grouped(be, d, g, gu, W, dX);
}
