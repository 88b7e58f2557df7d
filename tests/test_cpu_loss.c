// test_cpu_loss.c — src/cpu/cpu_loss.c: cross-entropy (loss against a double reference, the
// gradient by finite differences, ignored targets, grad_scale 0, large logits) at the shapes of
// tests/op_cases.h. Method and the tolerance table: tests/cpu_fd.h.

#include "cpu_fd.h"
#include "op_cases.h"

// ---- cross-entropy ----------------------------------------------------------------------------

typedef struct CeCtx {
    const float* x;
    float* tmp;
    const int32_t* tgt;
    int n, V;
} CeCtx;
static double ce_loss(void* c_) {
    CeCtx* c = c_;
    memcpy(c->tmp, c->x, sizeof(float) * c->n * c->V);
    float l = 0;
    be->cross_entropy(be, c->tmp, &l, c->tgt, c->n, c->V, 0.0f);
    return l;
}

// n ≥ 7 rows; rows 1 and 4 (mod 7) are ignored (targets −1 and −100), row 3 targets the last class.
static void ce_case(int n, int V) {
    const int32_t pat[7] = {3, -1, 0, V - 1, -100, 17 % V, 3};
    int32_t* tgt = xmalloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) tgt[i] = pat[i % 7];
    float *x = rnd(n * V, 2), *g = dup(x, n * V), *tmp = fill(n * V, 0);
    double ref = 0;
    for (int r = 0; r < n; r++) {
        if (tgt[r] < 0) continue;
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < V; j++) mx = fmax(mx, x[r * V + j]);
        for (int j = 0; j < V; j++) s += exp(x[r * V + j] - mx);
        ref += mx + log(s) - x[r * V + tgt[r]];
    }
    float loss = 0.25f;
    const float gs = 0.37f;
    be->cross_entropy(be, g, &loss, tgt, n, V, gs);
    EXPECT(relerr(loss, ref + 0.25) < TOL_FWD, "cross_entropy loss (+=) %.9g vs %.9g", loss, ref + 0.25);
    int zero = 1;
    for (int j = 0; j < V; j++) zero &= g[1 * V + j] == 0 && g[4 * V + j] == 0;
    EXPECT(zero, "ignored targets (< 0) have zero gradient");
    double rowsum = 0;
    for (int j = 0; j < V; j++) rowsum += g[j];
    EXPECT(fabs(rowsum) < 1e-6, "gradient row sums to 0 (softmax − onehot): %.3g", rowsum);
    for (int i = 0; i < n * V; i++) g[i] /= gs;  // the gradient of L = Σ loss
    CeCtx c = {x, tmp, tgt, n, V};
    FdVar v = {"logits", x, g, (size_t)n * V};
    FD_EXPECT("cross_entropy", &v, ce_loss, &c, EPS_SMOOTH, TOL_SMOOTH);

    memcpy(tmp, x, sizeof(float) * n * V);
    loss = 0;
    be->cross_entropy(be, tmp, &loss, tgt, n, V, 0.0f);
    EXPECT(memcmp(tmp, x, sizeof(float) * n * V) == 0, "grad_scale 0 leaves logits untouched");
    for (int i = 0; i < n * V; i++) tmp[i] = x[i] + 1000.0f;  // max subtraction keeps it finite
    float big = 0;
    be->cross_entropy(be, tmp, &big, tgt, n, V, 1.0f);
    EXPECT(isfinite(big) && fabs(big - ref) < 1e-3 * n, "logits + 1000: loss %.7g vs %.7g", big, ref);
    free(x), free(g), free(tmp), free(tgt);
}

static void test_cross_entropy(void) {
    for (int i = 0; i < N_CASES(CE_CASES); i++)
        if (CE_CASES[i].where & CASE_CPU) ce_case(CE_CASES[i].n, CE_CASES[i].V);
}

static void test_cross_entropy_grad(void) {
    enum { n = 4, V = 9 };
    float *lg = rnd(n * V, 2), *u = rnd(n * V, 1);
    int32_t tgt[n] = {3, -1, 0, 8};
    float g[n * V], loss = 0;
    memcpy(g, lg, sizeof g);
    be->cross_entropy(be, g, &loss, tgt, n, V, 1.0f);
    for (int j = 0; j < V; j++) EXPECT(g[V + j] == 0, "ignored row has zero gradient");
    const double an = dotd(g, u, n * V);
    const float eps = 1e-2f;
    double L[2];
    for (int s = 0; s < 2; s++) {
        float lp[n * V], l = 0;
        for (int i = 0; i < n * V; i++) lp[i] = lg[i] + (s ? -eps : eps) * u[i];
        be->cross_entropy(be, lp, &l, tgt, n, V, 0.0f);
        L[s] = l;
    }
    EXPECT(relerr_ref(an, (L[0] - L[1]) / (2 * eps)) < TOL_OP, "cross-entropy: %g vs %g", an, (L[0] - L[1]) / (2 * eps));
    free(lg), free(u);
}

int main(void) {
    cpu_test_begin(20240917);
    RUN(test_cross_entropy);
    RUN(test_cross_entropy_grad);
    CPU_TEST_END();
}
