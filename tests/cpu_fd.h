// cpu_fd.h — shared by the CPU op tests (tests/test_cpu_<source>.c): random tensors,
// double-precision dot products, and the finite-difference gradient check.
//
// FD method. For an op out = f(x) and a fixed random cotangent r, the objective is
// L(x) = Σ r ∘ out, summed in double. The op's backward with dout = r gives the analytic g =
// dL/dx. For a random direction u, x± = fl32(x ± εu) are written into the input and the op is
// re-run; the central difference (L(x+) − L(x−)) / 2ε is compared with Σ g ∘ (x+ − x−) / 2ε —
// the direction actually taken after rounding x± to fp32, so input rounding is no error source.
// Each variable is checked on its own (the message names it), along g itself (scaled to rms 1:
// the direction most sensitive to a wrongly scaled g) and along FD_DIRS random directions; the
// worst error |an − fd| / max(|an|, |fd|, ‖g‖·rms(du)) counts. The last term is the typical
// size of an = Σ g·du: without it a direction nearly orthogonal to g (an ≈ 0 by chance, about
// one draw in a hundred is 1% of typical) would turn plain rounding noise into a failure. A
// gradient off by a relative δ still scores ≈ δ.
//
// Tolerances (one table for every CPU op test), and why. "seen" is the worst over 80 seeds.
//
//   name          value   used for                     why (seen)
//   EPS_SMOOTH    3e-3    FD step, smooth ops          inputs are O(1): truncation O(ε²·f''') ≈ 1e-5 and
//                                                      fp32 output rounding ≈ 6e-8·‖r∘out‖/ε ≈ 5e-5;
//                                                      1e-2 gave 2e-3 along g for attention
//   TOL_SMOOTH    1e-3    rmsnorm, attention, swiglu,  ~4× the worst seen (CE 2.4e-4, attention dk
//                         cross-entropy                1.7e-4, rmsnorm 7e-5, swiglu 6e-5); a gradient
//                                                      1% off scores ≈ 1e-2 (test_fd_checker_…)
//   EPS_LINEAR    0.5     FD step, linear ops          the central difference is exact for a linear
//                                                      map: only fp32 rounding of out remains
//   TOL_LINEAR    1e-5    embedding, gemm, grouped,    fp32 sums of ≤ 300 terms ≈ 6e-8·√K (6e-7)
//                         wgrad, rope (linear in x)
//   EPS_ROUTER    1e-3    FD step, router              no top-k choice may flip: rows are drawn with
//                                                      the top k+1 logits ≥ 0.05 apart (≫ ε·|u|)
//   TOL_ROUTER    1e-3    router_bwd                   fp32 softmax rounding / ε ≈ 1e-4 (1.1e-4)
//   TOL_FWD       2e-6    forward vs double reference  rel L2 (or rel): fp32 ops and sums of ≤ 300
//                                                      terms, a few ulp (worst 5.5e-7, gemm K = 257)
//   TOL_ATTN_BIG  2e-5    attention, scores ~±100      an fp32 q·k of size 100 is off by ~1e-5
//                                                      absolute; lse and out inherit it (3e-6)
//   TOL_ADJ       1e-6    <Px, y> = <x, Pᵀy>           |difference| / (‖Px‖·‖y‖): one fp32 rounding per
//                                                      summed row, k ≤ 3 (seen 7e-9)
//   TOL_OP        2e-3    the one-direction checks     one random direction, ε = 1e-2, fp32 on O(1)
//                         (test_*_grad, relerr_ref)    inputs: rounding ~1e-7/ε plus O(ε²) curvature
//   TOL_ADAM      6.5e-8  adamw vs a double step       the op must be the double step rounded once
//                                                      to fp32: ≤ 2⁻²⁴ = 5.96e-8 relative
//   (exact)       0       copies, index, permutation,  these ops move or count values, or must not
//                         ties, accumulate, in-place,  depend on the thread count: any difference
//                         thread-count independence    is a bug
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "test.h"
#include "util.h"

#define EPS_SMOOTH 3e-3
#define TOL_SMOOTH 1e-3
#define EPS_LINEAR 0.5
#define TOL_LINEAR 1e-5
#define EPS_ROUTER 1e-3
#define TOL_ROUTER 1e-3
#define TOL_FWD 2e-6
#define TOL_ATTN_BIG 2e-5
#define TOL_ADJ 1e-6
#define TOL_ADAM 6.5e-8
#define TOL_OP 2e-3
#define FD_DIRS 2

static Backend* be;
static Rng rng;

// A CPU op test's main: cpu_test_begin(seed); RUN(...); ... CPU_TEST_END();
static inline void cpu_test_begin(uint64_t seed) {
    be = cpu_backend_create();
    rng_seed(&rng, seed);
}
#define CPU_TEST_END()       \
    do {                     \
        be->destroy(be);     \
        TEST_END();          \
    } while (0)

// normal(0, s) values; never all zero
static inline float* rnd(size_t n, float s) {
    float* p = xmalloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) p[i] = s * rng_normal(&rng);
    return p;
}
static inline float* fill(size_t n, float v) {
    float* p = xmalloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) p[i] = v;
    return p;
}
static inline float* dup(const float* a, size_t n) {
    float* p = xmalloc(sizeof(float) * (n ? n : 1));
    memcpy(p, a, sizeof(float) * n);
    return p;
}
static inline double dotd(const float* a, const float* b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}
static inline double relerr(double a, double b) {
    const double d = fmax(fabs(a), fabs(b));
    return d == 0 ? 0 : fabs(a - b) / d;
}
// |a − b| relative to the reference b (the one-direction checks; 1e-6 keeps b = 0 finite)
static inline double relerr_ref(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-6); }
static inline double max_abs_diff(const float* a, const float* b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        m = fmax(m, fabs((double)a[i] - b[i]));
    }
    return m;
}
// rel L2 of fp32 a against a double reference
static inline double rel_l2d(const float* a, const double* ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den == 0 ? (num == 0 ? 0 : INFINITY) : sqrt(num / den);
}

// A variable of the objective: its fp32 input buffer x[n] and the analytic gradient g[n] at x.
typedef struct FdVar {
    const char* name;
    float* x;
    const float* g;
    size_t n;
} FdVar;

// L(ctx) re-runs the forward on the current inputs and returns Σ r ∘ out in double.
typedef double (*FdLoss)(void* ctx);

// Worst error over g and FD_DIRS random directions for one variable (x restored afterwards).
static inline double fd_err(const FdVar* v, FdLoss L, void* ctx, double eps) {
    float* x0 = dup(v->x, v->n);
    float* xp = xmalloc(sizeof(float) * v->n);
    float* xm = xmalloc(sizeof(float) * v->n);
    double worst = 0;
    double g2 = 0;
    for (size_t i = 0; i < v->n; i++) g2 += (double)v->g[i] * v->g[i];
    const double grms = sqrt(g2 / (double)(v->n ? v->n : 1));
    for (int d = 0; d <= FD_DIRS; d++) {
        if (d == 0 && grms == 0) continue;
        for (size_t i = 0; i < v->n; i++) {
            // direction 0 is g itself (scaled to rms 1): most sensitive to a wrongly scaled g
            const double u = d == 0 ? v->g[i] / grms : rng_normal(&rng);
            xp[i] = (float)(x0[i] + eps * u);
            xm[i] = (float)(x0[i] - eps * u);
        }
        double an = 0, gg = 0, uu = 0;
        for (size_t i = 0; i < v->n; i++) {
            const double du = ((double)xp[i] - xm[i]) / (2 * eps);
            an += (double)v->g[i] * du;
            gg += (double)v->g[i] * v->g[i];
            uu += du * du;
        }
        const double typical = sqrt(gg * uu / (double)v->n);  // E|an| scale: ‖g‖ · rms(du)
        memcpy(v->x, xp, sizeof(float) * v->n);
        const double lp = L(ctx);
        memcpy(v->x, xm, sizeof(float) * v->n);
        const double lm = L(ctx);
        memcpy(v->x, x0, sizeof(float) * v->n);
        const double fd = (lp - lm) / (2 * eps);
        const double den = fmax(fmax(fabs(an), fabs(fd)), typical);
        const double e = !isfinite(an) || !isfinite(fd) ? INFINITY : den == 0 ? 0 : fabs(an - fd) / den;
        if (e > worst) worst = e;
    }
    free(x0), free(xp), free(xm);
    return worst;
}

#define FD_EXPECT(what, var, L, ctx, eps, tol)                                                      \
    do {                                                                                            \
        const FdVar* v_ = (var);                                                                    \
        const double e_ = fd_err(v_, (L), (ctx), (eps));                                            \
        EXPECT(e_ < (tol), "%s: d/d%s finite-difference rel error %.3g > %.3g", (what), v_->name,   \
               e_, (double)(tol));                                                                  \
    } while (0)
