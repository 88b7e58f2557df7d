// test_cpu_norm.c — src/cpu/cpu_norm.c: embedding and RMSNorm against direct formulas and
// finite differences at the shapes of tests/op_cases.h; and the finite-difference checker itself
// (a gradient 1% off must fail it). Method and the tolerance table: tests/cpu_fd.h.

#include "cpu_fd.h"
#include "op_cases.h"

// ---- embedding --------------------------------------------------------------------------------

typedef struct EmbCtx {
    float *table, *out, *r;
    const int32_t* tok;
    int N, H;
} EmbCtx;
static double emb_loss(void* c_) {
    EmbCtx* c = c_;
    be->embed_fwd(be, c->out, c->table, c->tok, c->N, c->H);
    return dotd(c->r, c->out, (size_t)c->N * c->H);
}

static void embed_case(int V, int H, int N) {
    int32_t* tok = xmalloc(sizeof(int32_t) * N);
    for (int n = 0; n < N; n++) tok[n] = (int32_t)(rng_u64(&rng) % 5) * 2;  // repeats; odd rows unused
    float *table = rnd(V * H, 1), *out = fill(N * H, NAN), *r = rnd(N * H, 1);
    be->embed_fwd(be, out, table, tok, N, H);
    int ok = 1;
    for (int n = 0; n < N; n++) ok &= memcmp(out + n * H, table + tok[n] * H, sizeof(float) * H) == 0;
    EXPECT(ok, "embed_fwd copies rows exactly");

    float *d0 = rnd(V * H, 1), *d = dup(d0, V * H), *g = fill(V * H, 0);
    be->embed_bwd(be, d, r, tok, N, H, V);
    be->embed_bwd(be, g, r, tok, N, H, V);
    double worst = 0;
    for (int v = 0; v < V; v++)
        for (int h = 0; h < H; h++) {
            double s = d0[v * H + h];
            for (int n = 0; n < N; n++)
                if (tok[n] == v) s += r[n * H + h];
            worst = fmax(worst, fabs(d[v * H + h] - s));
        }
    EXPECT(worst < 1e-5, "embed_bwd accumulates Σ dout into dtable (+=): max error %.3g", worst);
    EXPECT(memcmp(d + 1 * H, d0 + 1 * H, sizeof(float) * H) == 0, "unused rows of dtable untouched");
    EmbCtx c = {table, out, r, tok, N, H};
    FdVar v = {"table", table, g, (size_t)V * H};
    FD_EXPECT("embedding", &v, emb_loss, &c, EPS_LINEAR, TOL_LINEAR);
    free(table), free(out), free(r), free(d0), free(d), free(g), free(tok);
}

static void test_embedding(void) {
    for (int i = 0; i < N_CASES(EMBED_CASES); i++)
        if (EMBED_CASES[i].where & CASE_CPU) embed_case(EMBED_CASES[i].V, EMBED_CASES[i].H, EMBED_CASES[i].N);
}

// ---- RMSNorm ----------------------------------------------------------------------------------

typedef struct NormCtx {
    float *x, *w, *y, *rstd, *r;
    int N, H;
    float eps;
} NormCtx;
static double norm_loss(void* c_) {
    NormCtx* c = c_;
    be->rmsnorm_fwd(be, c->y, c->rstd, c->x, c->w, c->N, c->H, c->eps);
    return dotd(c->r, c->y, (size_t)c->N * c->H);
}

static void rmsnorm_case(int N, int H) {
    const float eps = 1e-5f;
    float *x = rnd(N * H, 2), *w = rnd(H, 1), *y = fill(N * H, NAN), *rstd = fill(N, NAN), *r = rnd(N * H, 1);
    for (int h = 0; h < H; h++) w[h] += 1.0f;
    be->rmsnorm_fwd(be, y, rstd, x, w, N, H, eps);
    double* ref = xmalloc(sizeof(double) * N * H);
    double rs_err = 0;
    for (int n = 0; n < N; n++) {
        double ms = 0;
        for (int h = 0; h < H; h++) ms += (double)x[n * H + h] * x[n * H + h];
        const double rs = 1 / sqrt(ms / H + eps);
        rs_err = fmax(rs_err, relerr(rstd[n], rs));
        for (int h = 0; h < H; h++) ref[n * H + h] = w[h] * (x[n * H + h] * rs);
    }
    EXPECT(rel_l2d(y, ref, N * H) < TOL_FWD, "rmsnorm_fwd vs formula: %.3g", rel_l2d(y, ref, N * H));
    EXPECT(rs_err < TOL_FWD, "rstd vs formula: %.3g", rs_err);

    float *dx = fill(N * H, NAN), *dw = fill(H, 0);
    be->rmsnorm_bwd(be, dx, dw, r, x, w, rstd, N, H, 0);
    NormCtx c = {x, w, y, rstd, r, N, H, eps};
    FdVar vx = {"x", x, dx, (size_t)N * H}, vw = {"w", w, dw, H};
    FD_EXPECT("rmsnorm", &vx, norm_loss, &c, EPS_SMOOTH, TOL_SMOOTH);
    FD_EXPECT("rmsnorm", &vw, norm_loss, &c, EPS_SMOOTH, TOL_SMOOTH);

    // accumulate: dx += grad, dw += grad
    be->rmsnorm_fwd(be, y, rstd, x, w, N, H, eps);
    float *dx0 = rnd(N * H, 1), *dxa = dup(dx0, N * H), *dw0 = rnd(H, 1), *dwa = dup(dw0, H);
    be->rmsnorm_bwd(be, dxa, dwa, r, x, w, rstd, N, H, 1);
    int ok = 1;
    for (int i = 0; i < N * H; i++) ok &= dxa[i] == dx0[i] + dx[i];
    EXPECT(ok, "rmsnorm_bwd accumulate: dx = old dx + ∂L/∂x exactly");
    double e = 0;
    for (int h = 0; h < H; h++) e = fmax(e, fabs(dwa[h] - ((double)dw0[h] + dw[h])));
    EXPECT(e < 1e-5, "rmsnorm_bwd: dw += ∂L/∂w (max error %.3g)", e);
    // dx may alias dy
    float* al = dup(r, N * H);
    float* dwb = fill(H, 0);
    be->rmsnorm_bwd(be, al, dwb, al, x, w, rstd, N, H, 0);
    EXPECT(memcmp(al, dx, sizeof(float) * N * H) == 0 && memcmp(dwb, dw, sizeof(float) * H) == 0,
           "rmsnorm_bwd in place (dx = dy) gives the same dx and dw");
    free(x), free(w), free(y), free(rstd), free(r), free(ref), free(dx), free(dw), free(dx0), free(dxa), free(dw0);
    free(dwa), free(al), free(dwb);
}

static void test_rmsnorm(void) {
    for (int i = 0; i < N_CASES(RMSNORM_CASES); i++)
        if (RMSNORM_CASES[i].where & CASE_CPU) rmsnorm_case(RMSNORM_CASES[i].N, RMSNORM_CASES[i].H);
}

static void test_rmsnorm_grad(void) {
    enum { N = 5, H = 12 };
    float *x = rnd(N * H, 1), *w = rnd(H, 1), *r = rnd(N * H, 1), *u = rnd(N * H, 1), *uw = rnd(H, 1);
    float y[N * H], rstd[N], dx[N * H], dw[H] = {0};
    be->rmsnorm_fwd(be, y, rstd, x, w, N, H, 1e-5f);
    be->rmsnorm_bwd(be, dx, dw, r, x, w, rstd, N, H, 0);
    const double an = dotd(dx, u, N * H) + dotd(dw, uw, H);
    const float eps = 1e-2f;
    double L[2];
    for (int s = 0; s < 2; s++) {
        float xp[N * H], wp[H];
        for (int i = 0; i < N * H; i++) xp[i] = x[i] + (s ? -eps : eps) * u[i];
        for (int i = 0; i < H; i++) wp[i] = w[i] + (s ? -eps : eps) * uw[i];
        be->rmsnorm_fwd(be, y, rstd, xp, wp, N, H, 1e-5f);
        L[s] = dotd(y, r, N * H);
    }
    EXPECT(relerr_ref(an, (L[0] - L[1]) / (2 * eps)) < TOL_OP, "rmsnorm: %g vs %g", an, (L[0] - L[1]) / (2 * eps));
    free(x), free(w), free(r), free(u), free(uw);
}

// ---- the checker itself -------------------------------------------------------------------------

static void test_fd_checker_fails_on_wrong_gradient(void) {
    enum { N = 6, H = 16 };
    float *x = rnd(N * H, 1), *w = rnd(H, 1), *y = fill(N * H, 0), *rstd = fill(N, 0), *r = rnd(N * H, 1);
    float *dx = fill(N * H, 0), *dw = fill(H, 0);
    be->rmsnorm_fwd(be, y, rstd, x, w, N, H, 1e-5f);
    be->rmsnorm_bwd(be, dx, dw, r, x, w, rstd, N, H, 0);
    for (int i = 0; i < N * H; i++) dx[i] *= 1.0f + 10 * (float)TOL_SMOOTH;  // 1% wrong
    NormCtx c = {x, w, y, rstd, r, N, H, 1e-5f};
    FdVar v = {"x", x, dx, (size_t)N * H};
    const double e = fd_err(&v, norm_loss, &c, EPS_SMOOTH);
    EXPECT(e > TOL_SMOOTH, "a gradient 1%% off must fail the check (error %.3g)", e);
    free(x), free(w), free(y), free(rstd), free(r), free(dx), free(dw);
}

int main(void) {
    cpu_test_begin(20240917);
    RUN(test_embedding);
    RUN(test_rmsnorm);
    RUN(test_rmsnorm_grad);
    RUN(test_fd_checker_fails_on_wrong_gradient);
    CPU_TEST_END();
}
