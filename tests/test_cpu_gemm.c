// test_cpu_gemm.c — the CPU GEMMs against double-precision triple loops and finite
// differences: gemm with every trans combination, padded strides, alpha/beta (beta = 0 ignores a
// NaN-filled C), K = 0, sizes that cross every blocking boundary; grouped GEMM and grouped
// weight gradient with an empty group; the descriptor checks (src/backend_check.c) refusing bad
// descriptors. Shapes: tests/op_cases.h. Method and tolerances: tests/cpu_fd.h.
#include <sys/wait.h>

#include "cpu_fd.h"
#include "op_cases.h"

pid_t fork(void);  // (unistd.h would declare dup(), which cpu_fd.h defines for floats)

// op(X)(i, j) of a row-major matrix with row stride ld
static inline double opx(const float* X, int ld, int trans, int i, int j) {
    return trans ? X[(size_t)j * ld + i] : X[(size_t)i * ld + j];
}

// C[M, N] (stride ldc) = alpha · op(A) op(B) + beta · C, in double
static void gemm_ref(const GemmDesc* d, const float* A, int lda, const float* B, int ldb, const float* C, int ldc,
                     double* R) {
    for (int i = 0; i < d->M; i++)
        for (int j = 0; j < d->N; j++) {
            double s = 0;
            for (int k = 0; k < d->K; k++) s += opx(A, lda, d->trans_a, i, k) * opx(B, ldb, d->trans_b, k, j);
            R[(size_t)i * d->N + j] = d->alpha * s + (d->beta == 0 ? 0.0 : d->beta * C[(size_t)i * ldc + j]);
        }
}

// One gemm against the reference; C has padding columns that must stay untouched. cin: the
// addend comes from a separate buffer (GemmDesc.c_in) and C's old values (NaN) are never read.
static void gemm_case(int M, int N, int K, int ta, int tb, int pad, float alpha, float beta, int cin) {
    const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb, nc = (size_t)M * ldc;
    float *A = rnd(na, 1), *B = rnd(nb, 1), *C = rnd(nc, 1), *Cin = cin ? rnd(nc, 1) : NULL;
    if (beta == 0 || cin)
        for (size_t i = 0; i < nc; i++) C[i] = NAN;  // must be ignored
    for (int i = 0; i < M; i++)
        for (int j = N; j < ldc; j++) C[(size_t)i * ldc + j] = 12345.0f;  // padding sentinel
    double* R = xmalloc(sizeof(double) * ((size_t)M * N + 1));
    GemmDesc d = {.M = M, .N = N, .K = K, .trans_a = ta, .trans_b = tb, .alpha = alpha, .beta = beta,
                  .lda = pad ? lda : 0, .ldb = pad ? ldb : 0, .ldc = pad ? ldc : 0, .c_in = Cin};
    gemm_ref(&d, A, lda, B, ldb, cin ? Cin : C, ldc, R);
    be->gemm(be, &d, A, B, C);
    double num = 0, den = 0;
    int pad_ok = 1;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            const double c = C[(size_t)i * ldc + j], r = R[(size_t)i * N + j];
            num += isfinite(c) ? (c - r) * (c - r) : INFINITY;
            den += r * r;
        }
        for (int j = N; j < ldc; j++) pad_ok &= C[(size_t)i * ldc + j] == 12345.0f;
    }
    const double e = den > 0 ? sqrt(num / den) : sqrt(num);
    EXPECT(e < TOL_FWD, "gemm M=%d N=%d K=%d ta=%d tb=%d pad=%d alpha=%g beta=%g c_in=%d: rel L2 %.3g", M, N, K, ta,
           tb, pad, alpha, beta, cin, e);
    EXPECT(pad_ok, "gemm M=%d N=%d K=%d: columns past N (ldc padding) untouched", M, N, K);
    free(A), free(B), free(C), free(Cin), free(R);
}

static void test_gemm_reference(void) {
    // the CPU rows of GEMM_CASES (tests/op_cases.h), each with every transpose, padding,
    // alpha/beta pair and c_in choice
    const float ab[][2] = {{1, 0}, {0.7f, 1}, {-0.5f, 0.3f}};
    for (int s = 0; s < N_CASES(GEMM_CASES); s++) {
        const GemmOpCase* c = &GEMM_CASES[s];
        if (!(c->where & CASE_CPU)) continue;
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int pad = 0; pad < 2; pad++)
                    for (int a = 0; a < 3; a++)
                        for (int cin = 0; cin < 2; cin++)
                            gemm_case(c->M, c->N, c->K, ta, tb, pad * 3, ab[a][0], ab[a][1], cin);
    }
}

static void test_gemm_edges(void) {
    enum { M = 6, N = 5 };
    float C[M * N], C0[M * N];
    for (int i = 0; i < M * N; i++) C0[i] = C[i] = rng_normal(&rng);
    const float dummy = NAN;
    GemmDesc d = {.M = M, .N = N, .K = 0, .alpha = 1, .beta = 0.5f};
    be->gemm(be, &d, &dummy, &dummy, C);
    int ok = 1;
    for (int i = 0; i < M * N; i++) ok &= C[i] == 0.5f * C0[i];
    EXPECT(ok, "K = 0: C = beta · C");
    for (int i = 0; i < M * N; i++) C[i] = NAN;
    d.beta = 0;
    be->gemm(be, &d, &dummy, &dummy, C);
    ok = 1;
    for (int i = 0; i < M * N; i++) ok &= C[i] == 0;
    EXPECT(ok, "K = 0, beta = 0: C = 0 (old NaN ignored)");
    memcpy(C, C0, sizeof C);
    GemmDesc e = {.M = 0, .N = N, .K = 3, .alpha = 1, .beta = 0};
    be->gemm(be, &e, &dummy, &dummy, C);
    e.M = M, e.N = 0;
    be->gemm(be, &e, &dummy, &dummy, C);
    EXPECT(memcmp(C, C0, sizeof C) == 0, "M = 0 or N = 0: nothing written");
}

// ---- gemm gradients: the backward GEMMs (as the model writes them) against finite differences

typedef struct GemmCtx {
    GemmDesc d;
    float *A, *B, *C, *R;
} GemmCtx;
static double gemm_loss(void* c_) {
    GemmCtx* c = c_;
    be->gemm(be, &c->d, c->A, c->B, c->C);
    return dotd(c->R, c->C, (size_t)c->d.M * c->d.N);
}

static void test_gemm_grad(void) {
    enum { M = 19, N = 23, K = 29 };
    const float alpha = 0.8f;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            float *A = rnd(M * K, 1), *B = rnd(K * N, 1), *C = fill(M * N, 0), *R = rnd(M * N, 1);
            float *dA = fill(M * K, NAN), *dB = fill(K * N, NAN);
            // d op(A) = alpha R op(B)ᵀ [M, K];  d op(B) = alpha op(A)ᵀ R [K, N]
            if (!ta) {  // dA [M, K] = alpha R · op(B)ᵀ
                GemmDesc g = {.M = M, .N = K, .K = N, .trans_a = 0, .trans_b = !tb, .alpha = alpha};
                be->gemm(be, &g, R, B, dA);
            } else {  // dA [K, M] = alpha op(B) · Rᵀ
                GemmDesc g = {.M = K, .N = M, .K = N, .trans_a = tb, .trans_b = 1, .alpha = alpha};
                be->gemm(be, &g, B, R, dA);
            }
            if (!tb) {  // dB [K, N] = alpha op(A)ᵀ · R
                GemmDesc g = {.M = K, .N = N, .K = M, .trans_a = !ta, .trans_b = 0, .alpha = alpha};
                be->gemm(be, &g, A, R, dB);
            } else {  // dB [N, K] = alpha Rᵀ · op(A)
                GemmDesc g = {.M = N, .N = K, .K = M, .trans_a = 1, .trans_b = ta, .alpha = alpha};
                be->gemm(be, &g, R, A, dB);
            }
            GemmCtx c = {{.M = M, .N = N, .K = K, .trans_a = ta, .trans_b = tb, .alpha = alpha}, A, B, C, R};
            FdVar va = {ta ? "A (trans_a)" : "A", A, dA, M * K}, vb = {tb ? "B (trans_b)" : "B", B, dB, K * N};
            FD_EXPECT("gemm", &va, gemm_loss, &c, EPS_LINEAR, TOL_LINEAR);
            FD_EXPECT("gemm", &vb, gemm_loss, &c, EPS_LINEAR, TOL_LINEAR);
            free(A), free(B), free(C), free(R), free(dA), free(dB);
        }
}

// ---- grouped GEMM and weight gradient -------------------------------------------------------

enum { G = 4, ROWS = 40 };
static const int OFF[G + 1] = {0, 5, 5, 23, 40};  // group 1 is empty

static void test_grouped_reference(void) {
    const int N = 19, K = 21, lda = K + 2, ldc = N + 3;
    for (int tb = 0; tb < 2; tb++)
        for (int bi = 0; bi < 2; bi++) {
            const float beta = bi ? 1.0f : 0.0f;
            const size_t bstride = (size_t)N * K + 7;  // padding between the B_g
            float *A = rnd((size_t)ROWS * lda, 1), *B = rnd(G * bstride, 1), *C = rnd((size_t)ROWS * ldc, 1);
            float* C0 = dup(C, (size_t)ROWS * ldc);
            if (!bi)
                for (int i = 0; i < ROWS; i++)
                    for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = NAN;
            GemmDesc d = {.N = N, .K = K, .trans_b = tb, .lda = lda, .ldc = ldc, .alpha = 1, .beta = beta};
            GroupDesc gd = {.groups = G, .host_off = OFF, .b_stride = bstride};
            be->gemm_grouped(be, &d, &gd, A, B, C);
            double num = 0, den = 0;
            int pad_ok = 1;
            for (int g = 0; g < G; g++)
                for (int i = OFF[g]; i < OFF[g + 1]; i++) {
                    for (int j = 0; j < N; j++) {
                        double s = 0;
                        for (int k = 0; k < K; k++)
                            s += (double)A[(size_t)i * lda + k] * opx(B + g * bstride, tb ? K : N, tb, k, j);
                        s += beta * C0[(size_t)i * ldc + j];
                        const float c = C[(size_t)i * ldc + j];
                        num += isfinite(c) ? (c - s) * (c - s) : INFINITY;
                        den += s * s;
                    }
                    for (int j = N; j < ldc; j++) pad_ok &= C[(size_t)i * ldc + j] == C0[(size_t)i * ldc + j];
                }
            const double e = sqrt(num / den);
            EXPECT(e < TOL_FWD, "gemm_grouped trans_b=%d beta=%g vs per-group reference: rel L2 %.3g", tb, beta, e);
            EXPECT(pad_ok, "gemm_grouped leaves ldc padding untouched");
            free(A), free(B), free(C), free(C0);
        }
}

typedef struct GroupCtx {
    GemmDesc d;
    GroupDesc g;
    float *A, *B, *C, *R;
} GroupCtx;
static double group_loss(void* c_) {
    GroupCtx* c = c_;
    be->gemm_grouped(be, &c->d, &c->g, c->A, c->B, c->C);
    return dotd(c->R, c->C, (size_t)ROWS * c->d.N);
}

// C_g = A_g · op(B_g): dA_g = R_g · op(B_g)ᵀ (grouped GEMM with trans_b flipped, the backward-data
// GEMM of the experts); dB_g = wgrad (R_gᵀ A_g when B_g is [N, K], A_gᵀ R_g when it is [K, N]).
static void test_grouped_grad(void) {
    const int N = 13, K = 11;
    for (int tb = 0; tb < 2; tb++) {
        const size_t bstride = (size_t)N * K;
        float *A = rnd((size_t)ROWS * K, 1), *B = rnd(G * bstride, 1), *C = fill((size_t)ROWS * N, 0);
        float* R = rnd((size_t)ROWS * N, 1);
        float *dA = fill((size_t)ROWS * K, NAN), *dB0 = rnd(G * bstride, 1), *dB = dup(dB0, G * bstride);
        GroupDesc gd = {.groups = G, .host_off = OFF, .b_stride = bstride};
        GemmDesc bd = {.N = K, .K = N, .trans_b = !tb, .alpha = 1, .beta = 0};
        be->gemm_grouped(be, &bd, &gd, R, B, dA);
        if (tb) be->gemm_grouped_wgrad(be, &gd, N, K, R, A, dB, 1.f);  // dB_g [N, K] += R_gᵀ A_g
        else be->gemm_grouped_wgrad(be, &gd, K, N, A, R, dB, 1.f);     // dB_g [K, N] += A_gᵀ R_g
        EXPECT(memcmp(dB + 1 * bstride, dB0 + 1 * bstride, sizeof(float) * bstride) == 0,
               "wgrad leaves the empty group's dB unchanged");
        // beta = 0 overwrites: NaN in dB is ignored, the empty group gets zeros, and the other
        // groups get the product alone (the same bits as adding it to zeros)
        float *dBo = fill(G * bstride, NAN), *dBz = fill(G * bstride, 0);
        if (tb) be->gemm_grouped_wgrad(be, &gd, N, K, R, A, dBo, 0.f), be->gemm_grouped_wgrad(be, &gd, N, K, R, A, dBz, 1.f);
        else be->gemm_grouped_wgrad(be, &gd, K, N, A, R, dBo, 0.f), be->gemm_grouped_wgrad(be, &gd, K, N, A, R, dBz, 1.f);
        int same = 1, zero = 1;
        for (size_t i = 0; i < G * bstride; i++) same &= dBo[i] == dBz[i];
        for (size_t i = 0; i < bstride; i++) zero &= dBo[bstride + i] == 0.f;
        EXPECT(same && zero, "wgrad beta = 0 overwrites (NaN ignored, empty group zeroed): same %d, zero %d", same, zero);
        free(dBo), free(dBz);
        float* g = xmalloc(sizeof(float) * G * bstride);
        for (size_t i = 0; i < G * bstride; i++) g[i] = dB[i] - dB0[i];  // the += part
        GroupCtx c = {{.N = N, .K = K, .trans_b = tb, .alpha = 1, .beta = 0}, gd, A, B, C, R};
        FdVar va = {"A", A, dA, (size_t)ROWS * K}, vb = {tb ? "B (trans_b, wgrad)" : "B (wgrad)", B, g, G * bstride};
        FD_EXPECT("gemm_grouped", &va, group_loss, &c, EPS_LINEAR, TOL_LINEAR);
        FD_EXPECT("gemm_grouped", &vb, group_loss, &c, EPS_LINEAR, TOL_LINEAR);
        free(A), free(B), free(C), free(R), free(dA), free(dB0), free(dB), free(g);
    }
}

static void test_gemm_trans(void) {
    // every trans combination against a direct triple loop, with beta accumulation
    const int M = 5, N = 7, K = 6;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            float *A = rnd(M * K, 1), *B = rnd(K * N, 1), *C = rnd(M * N, 1), *R = xmalloc(sizeof(float) * M * N);
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double s = 0;
                    for (int kk = 0; kk < K; kk++)
                        s += (double)(ta ? A[kk * M + i] : A[i * K + kk]) * (tb ? B[j * K + kk] : B[kk * N + j]);
                    R[i * N + j] = (float)(0.5 * s + 2.0 * C[i * N + j]);
                }
            GemmDesc d = {.M = M, .N = N, .K = K, .trans_a = ta, .trans_b = tb, .alpha = 0.5f, .beta = 2.0f};
            be->gemm(be, &d, A, B, C);
            EXPECT(rel_l2(C, R, M * N) < 1e-6, "gemm ta=%d tb=%d: %g", ta, tb, rel_l2(C, R, M * N));
            free(A), free(B), free(C), free(R);
        }
}

// The descriptor checks (src/backend_check.c): a caller error ends the process (FATAL) before
// the op writes anything; a valid descriptor passes. Each bad call runs in a child.
static int dies(void (*call)(void)) {
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) exit(99);
        call();
        exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}
static float g_buf[64];
static int g_off_bad[3] = {0, 5, 3}, g_off_ok[3] = {0, 3, 3};
static void bad_stride(void) {
    GemmDesc d = {.M = 2, .N = 4, .K = 3, .ldc = 3, .alpha = 1};
    be->gemm(be, &d, g_buf, g_buf, g_buf + 32);
}
static void bad_size(void) {
    GemmDesc d = {.M = -1, .N = 4, .K = 3, .alpha = 1};
    be->gemm(be, &d, g_buf, g_buf, g_buf + 32);
}
static void bad_offsets(void) {
    GemmDesc d = {.N = 2, .K = 2, .trans_b = 1, .alpha = 1};
    GroupDesc g = {.groups = 2, .host_off = g_off_bad, .b_stride = 4};
    be->gemm_grouped(be, &d, &g, g_buf, g_buf, g_buf + 32);
}
static void bad_trans_a(void) {
    GemmDesc d = {.N = 2, .K = 2, .trans_a = 1, .alpha = 1};
    GroupDesc g = {.groups = 2, .host_off = g_off_ok, .b_stride = 4};
    be->gemm_grouped(be, &d, &g, g_buf, g_buf, g_buf + 32);
}
static void bad_wgrad_beta(void) {
    GroupDesc g = {.groups = 2, .host_off = g_off_ok, .b_stride = 4};
    be->gemm_grouped_wgrad(be, &g, 2, 2, g_buf, g_buf, g_buf + 32, 0.5f);
}
static void good_calls(void) {
    GemmDesc d = {.M = 2, .N = 4, .K = 3, .ldc = 5, .alpha = 1};
    be->gemm(be, &d, g_buf, g_buf, g_buf + 32);
    GemmDesc dg = {.N = 2, .K = 2, .trans_b = 1, .alpha = 1};
    GroupDesc g = {.groups = 2, .host_off = g_off_ok, .b_stride = 4};
    be->gemm_grouped(be, &dg, &g, g_buf, g_buf, g_buf + 32);
    be->gemm_grouped_wgrad(be, &g, 2, 2, g_buf, g_buf, g_buf + 32, 1.0f);
}

static void test_desc_checks(void) {
    for (int i = 0; i < 64; i++) g_buf[i] = rng_normal(&rng);
    EXPECT(dies(bad_stride), "gemm: ldc < N is refused");
    EXPECT(dies(bad_size), "gemm: a negative size is refused");
    EXPECT(dies(bad_offsets), "gemm_grouped: decreasing offsets are refused");
    EXPECT(dies(bad_trans_a), "gemm_grouped: trans_a is refused");
    EXPECT(dies(bad_wgrad_beta), "gemm_grouped_wgrad: beta 0.5 is refused");
    EXPECT(!dies(good_calls), "valid descriptors pass");
}

int main(void) {
    cpu_test_begin(77);
    RUN(test_gemm_reference);
    RUN(test_gemm_edges);
    RUN(test_gemm_grad);
    RUN(test_grouped_reference);
    RUN(test_grouped_grad);
    RUN(test_gemm_trans);
    RUN(test_desc_checks);
    CPU_TEST_END();
}
