// test_cpu_ops.c — the CPU backend's dense-path ops against direct double-precision formulas
// and fp64 finite-difference gradients: memory, casts and elementwise ops, sumsq, nonfinite,
// embedding, RMSNorm, RoPE, causal GQA attention, cross-entropy, AdamW, split fp32 masters
// (pack / unpack, adamw_split against adamw bit for bit), and thread-count independence.
// Method and the tolerance table: tests/cpu_fd.h. (GEMMs: test_cpu_gemm.c;
// router, permutes, SwiGLU: test_cpu_moe.c.)
#include <omp.h>

#include "cpu_fd.h"

// ---- memory, casts, elementwise ----------------------------------------------------------------

static void test_memory(void) {
    const size_t n = 1000;
    const size_t peak0 = be->peak_bytes(be);
    float* p = be->alloc(be, n * sizeof(float));
    float* q = be->alloc(be, n * sizeof(float));
    EXPECT(be->peak_bytes(be) >= peak0 + 2 * n * sizeof(float), "peak_bytes counts live blocks");
    int zero = 1;
    for (size_t i = 0; i < n; i++) zero &= p[i] == 0 && q[i] == 0;
    EXPECT(zero, "alloc returns zeroed memory");
    float* h = rnd(n, 1);
    float* back = fill(n, -1);
    be->to_device(be, p, h, n * sizeof(float));
    be->copy(be, q, p, n * sizeof(float));
    be->to_host(be, back, q, n * sizeof(float));
    EXPECT(memcmp(back, h, n * sizeof(float)) == 0, "to_device → copy → to_host round trip is exact");
    be->zero(be, q, n * sizeof(float));
    zero = 1;
    for (size_t i = 0; i < n; i++) zero &= q[i] == 0;
    EXPECT(zero, "zero clears");
    be->free(be, p);
    be->free(be, q);
    be->free(be, NULL);  // allowed, no-op
    float* r = be->alloc(be, n * sizeof(float));
    EXPECT(be->peak_bytes(be) < peak0 + 3 * n * sizeof(float), "freed blocks leave the live count");
    be->free(be, r);
    free(h), free(back);
}

static void test_elementwise(void) {
    const size_t n = 70001;  // several parallel chunks, odd length
    float *x = rnd(n, 1), *y = rnd(n, 1), *y0 = dup(y, n), *a = fill(n, 0);
    be->add_act(be, y, x, n);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= y[i] == y0[i] + x[i];
    EXPECT(ok, "add_act: y += x exactly");
    memcpy(y, y0, n * sizeof(float));
    be->scale_f32(be, y, -0.37f, n);
    ok = 1;
    for (size_t i = 0; i < n; i++) ok &= y[i] == y0[i] * -0.37f;
    EXPECT(ok, "scale_f32: x *= s exactly");
    be->f32_to_act(be, a, x, n);
    be->act_to_f32(be, y, a, n);
    EXPECT(memcmp(y, x, n * sizeof(float)) == 0, "f32 → act → f32 is the identity on the CPU");

    double ref = 0.5;
    for (size_t i = 0; i < n; i++) ref += (double)x[i] * x[i];
    float out = 0.5f;
    be->sumsq_f32(be, &out, x, n);
    EXPECT(relerr(out, ref) < TOL_FWD, "sumsq_f32: %.9g vs %.9g (accumulates onto out)", out, ref);

    float bad = 0;
    be->nonfinite_f32(be, &bad, x, n);
    EXPECT(bad == 0, "nonfinite: finite input leaves out at 0");
    bad = 1;
    be->nonfinite_f32(be, &bad, x, n);
    EXPECT(bad == 1, "nonfinite: finite input leaves out as is (1)");
    const float specials[3] = {NAN, INFINITY, -INFINITY};
    for (int s = 0; s < 3; s++) {
        float* z = dup(x, n);
        z[n - 1 - 1000 * s] = specials[s];
        bad = 0;
        be->nonfinite_f32(be, &bad, z, n);
        EXPECT(bad == 1, "nonfinite detects %g", specials[s]);
        free(z);
    }
    free(x), free(y), free(y0), free(a);
}

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

static void test_embedding(void) {
    enum { V = 11, H = 70, N = 40 };
    int32_t tok[N];
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
    free(table), free(out), free(r), free(d0), free(d), free(g);
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

static void test_rmsnorm(void) {
    enum { N = 9, H = 37 };
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

// ---- RoPE -------------------------------------------------------------------------------------

// One tensor x [B, T, nh, D] rotated into y (rope_qkv with no kv heads): forward reads the
// packed side and writes q; the inverse reads q and writes the packed side.
static void rope1(float* y, const float* x, int B, int T, int nh, int D, float theta, int inverse) {
    if (!inverse) be->rope_qkv(be, (void*)x, y, NULL, NULL, B, T, nh, 0, D, theta, 0);
    else be->rope_qkv(be, y, (void*)x, NULL, NULL, B, T, nh, 0, D, theta, 1);
}

typedef struct RopeCtx {
    float *x, *y, *r;
    int B, T, nh, D;
    float theta;
} RopeCtx;
static double rope_loss(void* c_) {
    RopeCtx* c = c_;
    rope1(c->y, c->x, c->B, c->T, c->nh, c->D, c->theta, 0);
    return dotd(c->r, c->y, (size_t)c->B * c->T * c->nh * c->D);
}

// x [B, T, nh, D] rotated by the HF rotate_half formula, in double
static void rope_ref(const float* x, double* y, int B, int T, int nh, int D, double theta, int sign) {
    const int half = D / 2;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < nh; h++) {
                const size_t o = (((size_t)b * T + t) * nh + h) * D;
                for (int i = 0; i < half; i++) {
                    const double ang = sign * t * pow(theta, -2.0 * i / D);
                    const double x1 = x[o + i], x2 = x[o + i + half];
                    y[o + i] = x1 * cos(ang) - x2 * sin(ang);
                    y[o + i + half] = x2 * cos(ang) + x1 * sin(ang);
                }
            }
}

static void test_rope(void) {
    {  // small case, theta 1e4: formula, t = 0 identity, inverse, gradient
        enum { B = 2, T = 13, nh = 3, D = 10 };
        const size_t n = (size_t)B * T * nh * D;
        float *x = rnd(n, 1), *y = rnd(n, 1), *r = rnd(n, 1), *z = rnd(n, 1), *g = rnd(n, 1);
        double* ref = xmalloc(sizeof(double) * n);
        rope1(y, x, B, T, nh, D, 1e4f, 0);
        rope_ref(x, ref, B, T, nh, D, 1e4, 1);
        EXPECT(rel_l2d(y, ref, n) < TOL_FWD, "rope vs rotate_half formula: %.3g", rel_l2d(y, ref, n));
        EXPECT(memcmp(y, x, sizeof(float) * nh * D) == 0, "rope at t = 0 is the identity");
        rope1(z, y, B, T, nh, D, 1e4f, 1);
        EXPECT(rel_l2(z, x, n) < TOL_FWD, "rope inverse undoes rope: %.3g", rel_l2(z, x, n));
        rope_ref(y, ref, B, T, nh, D, 1e4, -1);
        EXPECT(rel_l2d(z, ref, n) < TOL_FWD, "rope inverse rotates by −angle: %.3g", rel_l2d(z, ref, n));
        // the backward of rope is the inverse rotation: dL/dx = R⁻¹ r
        rope1(g, r, B, T, nh, D, 1e4f, 1);
        RopeCtx c = {x, y, r, B, T, nh, D, 1e4f};
        FdVar v = {"x", x, g, n};
        FD_EXPECT("rope", &v, rope_loss, &c, EPS_LINEAR, TOL_LINEAR);
        free(x), free(y), free(r), free(ref), free(z), free(g);
    }
    {  // the fused projection's rows: q and k parts rotated as single tensors, v copied, and back
        enum { B = 2, T = 9, Hq = 4, Hkv = 2, D = 6, W = (Hq + 2 * Hkv) * D };
        const size_t rows = (size_t)B * T, n = rows * W, nq = rows * Hq * D, nk = rows * Hkv * D;
        float *qkv = rnd(n, 1), *q = rnd(nq, 1), *k = rnd(nk, 1), *v = rnd(nk, 1), *back = rnd(n, 1);
        float *xq = rnd(nq, 1), *xk = rnd(nk, 1), *yq = rnd(nq, 1), *yk = rnd(nk, 1);
        for (size_t i = 0; i < rows; i++) {  // the parts as planar tensors
            memcpy(xq + i * Hq * D, qkv + i * W, sizeof(float) * Hq * D);
            memcpy(xk + i * Hkv * D, qkv + i * W + Hq * D, sizeof(float) * Hkv * D);
        }
        be->rope_qkv(be, qkv, q, k, v, B, T, Hq, Hkv, D, 1e4f, 0);
        rope1(yq, xq, B, T, Hq, D, 1e4f, 0);
        rope1(yk, xk, B, T, Hkv, D, 1e4f, 0);
        int v_ok = 1;
        for (size_t i = 0; i < rows; i++)
            v_ok &= !memcmp(v + i * Hkv * D, qkv + i * W + (Hq + Hkv) * D, sizeof(float) * Hkv * D);
        EXPECT(!memcmp(q, yq, sizeof(float) * nq) && !memcmp(k, yk, sizeof(float) * nk) && v_ok,
               "rope_qkv: q, k as single tensors, v copied");
        be->rope_qkv(be, back, q, k, v, B, T, Hq, Hkv, D, 1e4f, 1);
        EXPECT(rel_l2(back, qkv, n) < TOL_FWD, "rope_qkv inverse gives back the packed rows: %.3g",
               rel_l2(back, qkv, n));
        free(qkv), free(q), free(k), free(v), free(back), free(xq), free(xk), free(yq), free(yk);
    }
    {  // long positions, theta 1e6: angles must be accurate to ~1e-7 rad at t = 32767
        enum { T = 32768, D = 8 };
        float* x = rnd((size_t)T * D, 1);
        float* y = rnd((size_t)T * D, 1);
        rope1(y, x, 1, T, 1, D, 1e6f, 0);
        const int ts[] = {0, 1, 4095, 20000, 32767};
        double worst = 0, ref[D];
        for (int a = 0; a < 5; a++) {
            const float* xr = x + (size_t)ts[a] * D;
            for (int i = 0; i < D / 2; i++) {
                const double ang = ts[a] * pow(1e6, -2.0 * i / D);
                ref[i] = xr[i] * cos(ang) - xr[i + D / 2] * sin(ang);
                ref[i + D / 2] = xr[i + D / 2] * cos(ang) + xr[i] * sin(ang);
            }
            for (int i = 0; i < D; i++) worst = fmax(worst, fabs(y[(size_t)ts[a] * D + i] - ref[i]));
        }
        EXPECT(worst < 1e-6, "rope at positions up to 32767 (theta 1e6): max error %.3g", worst);
        free(x), free(y);
    }
}

// ---- attention --------------------------------------------------------------------------------

typedef struct AttnCtx {
    float *q, *k, *v, *out, *lse, *r;
    int B, T, Hq, Hkv, D;
} AttnCtx;
static double attn_loss(void* c_) {
    AttnCtx* c = c_;
    be->attn_fwd(be, c->out, c->lse, c->q, c->k, c->v, c->B, c->T, c->Hq, c->Hkv, c->D);
    return dotd(c->r, c->out, (size_t)c->B * c->T * c->Hq * c->D);
}

// Naive causal GQA attention in double: out [B,T,Hq,D], lse [B,Hq,T].
static void attn_ref(const float* q, const float* k, const float* v, double* out, double* lse, int B, int T, int Hq,
                     int Hkv, int D) {
    double* sc = xmalloc(sizeof(double) * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++) {
            const int kh = h / (Hq / Hkv);
            for (int t = 0; t < T; t++) {
                const float* qr = q + (((size_t)b * T + t) * Hq + h) * D;
                double mx = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    double d = 0;
                    for (int i = 0; i < D; i++) d += (double)qr[i] * k[(((size_t)b * T + s) * Hkv + kh) * D + i];
                    sc[s] = d / sqrt((double)D);
                    mx = fmax(mx, sc[s]);
                }
                double sum = 0;
                for (int s = 0; s <= t; s++) sum += exp(sc[s] - mx);
                lse[((size_t)b * Hq + h) * T + t] = mx + log(sum);
                double* o = out + (((size_t)b * T + t) * Hq + h) * D;
                for (int i = 0; i < D; i++) o[i] = 0;
                for (int s = 0; s <= t; s++)
                    for (int i = 0; i < D; i++)
                        o[i] += exp(sc[s] - mx) / sum * v[(((size_t)b * T + s) * Hkv + kh) * D + i];
            }
        }
    free(sc);
}

static void attn_case(int B, int T, int Hq, int Hkv, int D, float in_scale, int grads) {
    const size_t nq = (size_t)B * T * Hq * D, nk = (size_t)B * T * Hkv * D, nl = (size_t)B * Hq * T;
    float *q = rnd(nq, in_scale), *k = rnd(nk, in_scale), *v = rnd(nk, 1), *r = rnd(nq, 1);
    float *out = fill(nq, NAN), *lse = fill(nl, NAN);
    double *ro = xmalloc(sizeof(double) * nq), *rl = xmalloc(sizeof(double) * nl);
    be->attn_fwd(be, out, lse, q, k, v, B, T, Hq, Hkv, D);
    attn_ref(q, k, v, ro, rl, B, T, Hq, Hkv, D);
    double le = 0;
    for (size_t i = 0; i < nl; i++) le = fmax(le, isfinite(lse[i]) ? fabs(lse[i] - rl[i]) / fmax(1, fabs(rl[i])) : INFINITY);
    const double tol = in_scale > 1 ? TOL_ATTN_BIG : TOL_FWD;
    EXPECT(rel_l2d(out, ro, nq) < tol, "attn_fwd B=%d T=%d Hq=%d Hkv=%d D=%d scale %g vs naive: %.3g", B, T,
           Hq, Hkv, D, in_scale, rel_l2d(out, ro, nq));
    EXPECT(le < tol, "attn lse vs naive: max rel error %.3g", le);
    if (grads) {
        float *dq = fill(nq, NAN), *dk = fill(nk, NAN), *dv = fill(nk, NAN);
        be->attn_bwd(be, dq, dk, dv, r, out, lse, q, k, v, B, T, Hq, Hkv, D, NULL, 0);
        AttnCtx c = {q, k, v, out, lse, r, B, T, Hq, Hkv, D};
        FdVar vq = {"q", q, dq, nq}, vk = {"k", k, dk, nk}, vv = {"v", v, dv, nk};
        FD_EXPECT("attention", &vq, attn_loss, &c, EPS_SMOOTH, TOL_SMOOTH);
        FD_EXPECT("attention", &vk, attn_loss, &c, EPS_SMOOTH, TOL_SMOOTH);
        FD_EXPECT("attention", &vv, attn_loss, &c, EPS_SMOOTH, TOL_SMOOTH);
        free(dq), free(dk), free(dv);
    }
    free(q), free(k), free(v), free(r), free(out), free(lse), free(ro), free(rl);
}

static void test_attention(void) {
    attn_case(2, 70, 6, 2, 8, 1.0f, 1);   // GQA (3 query heads per kv head), T > one key block, not 2^n
    attn_case(1, 23, 4, 4, 5, 1.0f, 1);   // MHA, odd head dim
    attn_case(1, 19, 3, 1, 16, 1.0f, 1);  // MQA
    attn_case(1, 150, 2, 1, 8, 6.0f, 0);  // scores in the hundreds: online softmax rescaling, 3 blocks
}

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

static void test_cross_entropy(void) {
    enum { n = 7, V = 300 };
    const int32_t tgt[n] = {3, -1, 0, V - 1, -100, 17, 3};
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
    free(x), free(g), free(tmp);
}

// ---- AdamW ------------------------------------------------------------------------------------

// Each step against the same step written out in double from the fp32 state before it (the
// state AdamW actually keeps): master, m and v must be that step rounded once to fp32.
static void test_adamw(void) {
    enum { n = 257 };
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
    for (int variant = 0; variant < 3; variant++) {
        const float wd = variant == 1 ? 0.0f : 0.1f, gs = variant == 2 ? 0.37f : 1.0f;
        float *master = rnd(n, 1), *m = rnd(n, 0.01f), *v = rnd(n, 0.01f), *param = fill(n, NAN);
        for (int i = 0; i < n; i++) v[i] = v[i] * v[i];
        double worst = 0;
        for (int step = 1; step <= 4; step++) {  // consecutive steps: bias correction per step
            float* grad = rnd(n, 0.1f);
            float *p0 = dup(master, n), *m0 = dup(m, n), *v0 = dup(v, n);
            const int alias = variant == 0 && step % 2 == 0;  // param == master on some steps
            const AdamWDesc d = {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .wd = wd, .grad_scale = gs, .step = step};
            be->adamw(be, &d, master, alias ? (void*)master : (void*)param, m, v, grad, n);
            const double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
            for (int i = 0; i < n; i++) {
                const double g = (float)(grad[i] * gs);  // the clipped gradient, as torch stores it
                const double M = (double)b1 * m0[i] + (1.0 - b1) * g;
                const double Vv = (double)b2 * v0[i] + (1.0 - b2) * g * g;
                const double mh = (float)M / bc1, vh = (float)Vv / bc2;  // from the stored fp32 m, v
                // decoupled decay applied to the old weight, first; then the Adam step
                const double P = p0[i] * (1.0 - (double)lr * wd) - lr * mh / (sqrt(vh) + eps);
                worst = fmax(worst, fabs(master[i] - P) / fabs(P));
                worst = fmax(worst, fabs(m[i] - M) / fabs(M));
                worst = fmax(worst, fabs(v[i] - Vv) / fabs(Vv));
            }
            if (!alias) EXPECT(memcmp(param, master, sizeof(float) * n) == 0, "adamw: param = master copy");
            free(grad), free(p0), free(m0), free(v0);
        }
        EXPECT(worst < TOL_ADAM, "adamw (wd %g, grad_scale %g) vs double steps: rel error %.3g", wd, gs, worst);
        free(master), free(m), free(v), free(param);
    }
    // one hand-checked element: step 1 from zero state moves by lr·sign(g) (bias correction)
    float p = 1.0f, m = 0, v = 0, g = -0.2f, pa;
    const AdamWDesc d1 = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .wd = 0.0f, .grad_scale = 1.0f, .step = 1};
    be->adamw(be, &d1, &p, &pa, &m, &v, &g, 1);
    EXPECT(fabs(p - 1.01) < 1e-6 && pa == p, "adamw step 1: p = 1 − lr·sign(g) = %.7g", p);
}

// ---- split fp32 masters ---------------------------------------------------------------------------

static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static float float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
// The value of bf16 bits h, with the exponent unbounded: 0x7f80 (inf) counts as 2^128, the next
// value after the largest finite bf16 (what rounding away from it produces).
static double bf16_ext(uint32_t h) {
    h &= 0xffffu;
    if ((h & 0x7fffu) == 0x7f80u) return (h & 0x8000u ? -1 : 1) * ldexp(1, 128);
    return bf16_to_f32((uint16_t)h);
}
// Finite x rounded to bf16 to nearest with ties away from zero, by value (the test's own
// definition): the truncation toward zero (bits hi) or the next bf16 away from zero (hi + 1).
static uint16_t bf16_away(float x) {
    const uint32_t hi = bits_of(x) >> 16;
    const double ax = fabs((double)x), t = fabs(bf16_ext(hi)), up = fabs(bf16_ext(hi + 1));
    return (uint16_t)(up - ax <= ax - t ? hi + 1 : hi);
}

// pack / unpack on every low half (65,536 patterns) under high halves of every kind: ±0,
// denormals, the smallest normal, ordinary values with even and odd truncations, the largest
// finite (whose ties and above round to the inf pattern), and inf / NaN patterns (which must
// round-trip too, although masters never hold them). The round trip is bitwise; w is the
// value-defined rounding, differs from round-to-nearest-even exactly at ties with an even hi,
// and rem is the low half's bits.
static void test_split_pack(void) {
    static const uint16_t his[] = {0x0000, 0x0001, 0x007f, 0x0080, 0x3f80, 0x3f81, 0x4049, 0x7f7e, 0x7f7f, 0x8000,
                                   0x8001, 0x807f, 0xbf80, 0xbf81, 0xc2f7, 0xff7e, 0xff7f, 0x7f80, 0x7fc0, 0xffff};
    enum { NH = sizeof his / sizeof his[0], L = 65536 };
    const size_t n = (size_t)NH * L;
    float* x = xmalloc(sizeof(float) * n);
    for (size_t h = 0; h < NH; h++)
        for (size_t lo = 0; lo < L; lo++) x[h * L + lo] = float_of((uint32_t)his[h] << 16 | (uint32_t)lo);
    uint16_t *w = xmalloc(2 * n), *w2 = xmalloc(2 * n);
    int16_t* rem = xmalloc(2 * n);
    float* back = fill(n, NAN);
    memset(w2, 0xab, 2 * n);
    be->split_pack(be, w, rem, x, n);
    be->split_pack(be, w2, NULL, x, n);  // w only
    be->split_unpack(be, back, w, rem, n);
    size_t bad_trip = 0, bad_w = 0, bad_rem = 0, ties_differ = 0, other_differ = 0, even_ties = 0, inf_w = 0;
    for (size_t h = 0; h < NH; h++) {
        const int finite = (his[h] & 0x7f80u) != 0x7f80u;
        even_ties += finite && !(his[h] & 1);
        for (size_t lo = 0; lo < L; lo++) {
            const size_t i = h * L + lo;
            bad_trip += bits_of(back[i]) != bits_of(x[i]);
            bad_rem += (uint16_t)rem[i] != lo;
            if (!finite) continue;
            bad_w += w[i] != bf16_away(x[i]);
            inf_w += (w[i] & 0x7fffu) == 0x7f80u;
            if (w[i] != f32_to_bf16(x[i])) *(lo == 0x8000 && !(his[h] & 1) ? &ties_differ : &other_differ) += 1;
        }
    }
    EXPECT(bad_trip == 0, "split_pack → split_unpack: %zu of %zu patterns not bit for bit", bad_trip, n);
    EXPECT(bad_rem == 0, "rem is the low half's bits: %zu wrong", bad_rem);
    EXPECT(bad_w == 0, "w is x rounded to nearest, ties away from zero: %zu wrong", bad_w);
    EXPECT(ties_differ == even_ties && other_differ == 0,
           "w differs from round-to-nearest-even at the %zu ties with even hi only: %zu there, %zu elsewhere", even_ties,
           ties_differ, other_differ);
    EXPECT(inf_w == 2 * 32768, "the largest finite hi (±0x7f7f) rounds to the inf pattern from lo = 0x8000: %zu", inf_w);
    EXPECT(memcmp(w, w2, 2 * n) == 0, "split_pack with rem = NULL writes the same w");
    free(x), free(w), free(w2), free(rem), free(back);
}

// adamw_split against adamw (fp32 master, param aliased) on the same inputs over consecutive
// steps: the unpacked masters, m and v bit for bit, and w the tie-away rounding of the master.
// The masters start with ties (low half 0x8000), denormals, ±0 and values whose w is the inf
// pattern; variant 2 has lr = 0 (p·1 − 0 = p exactly), so the ties survive every step and the
// packing inside adamw_split is seen rounding them away from zero.
static void test_adamw_split(void) {
    enum { n = 1003 };
    const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
    for (int variant = 0; variant < 3; variant++) {
        const float lr = variant == 2 ? 0.0f : 3e-3f, wd = variant == 1 ? 0.0f : 0.1f, gs = variant == 1 ? 0.37f : 1.0f;
        float *master = rnd(n, 1), *m = rnd(n, 0.01f), *v = rnd(n, 0.01f);
        for (int i = 0; i < n; i++) {
            v[i] = v[i] * v[i];
            if (i % 7 == 0) master[i] = float_of((bits_of(master[i]) & 0xffff0000u) | 0x8000u);  // ties
            if (i % 50 == 1) master[i] = float_of((i % 100 == 1 ? 0x80000000u : 0) | (uint32_t)(i * 977u % 0x7fffffu));
        }
        master[2] = 0.0f, master[3] = -0.0f;
        master[4] = float_of(0x7f7fc123u), master[5] = float_of(0xff7f8000u);  // w = ±inf pattern
        float *ms = dup(m, n), *vs = dup(v, n), *back = fill(n, NAN);
        uint16_t* w = xmalloc(2 * n);
        int16_t* rem = xmalloc(2 * n);
        be->split_pack(be, w, rem, master, n);
        int ties = 0, ties0 = 0;
        for (int i = 0; i < n; i++) ties0 += (bits_of(master[i]) & 0xffffu) == 0x8000u;
        for (int step = 1; step <= 4; step++) {
            float* grad = rnd(n, 0.1f);
            const AdamWDesc d = {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .wd = wd, .grad_scale = gs, .step = step};
            be->adamw(be, &d, master, master, m, v, grad, n);
            be->adamw_split(be, &d, w, rem, ms, vs, grad, n);
            be->split_unpack(be, back, w, rem, n);
            size_t dm = 0, dmv = 0, dw = 0;
            for (int i = 0; i < n; i++) {
                dm += bits_of(back[i]) != bits_of(master[i]);
                dmv += bits_of(ms[i]) != bits_of(m[i]) || bits_of(vs[i]) != bits_of(v[i]);
                dw += w[i] != bf16_away(master[i]);
                ties += (bits_of(master[i]) & 0xffffu) == 0x8000u;
            }
            EXPECT(dm == 0 && dmv == 0 && dw == 0,
                   "variant %d step %d: masters %zu, m/v %zu, w %zu of %d differ from adamw's / the tie-away rounding",
                   variant, step, dm, dmv, dw, n);
            free(grad);
        }
        if (variant == 2)
            EXPECT(ties0 >= 100 && ties == 4 * ties0, "lr = 0 keeps the %d ties: %d seen over 4 steps", ties0, ties);
        free(master), free(m), free(v), free(ms), free(vs), free(back), free(w), free(rem);
    }
}

// ---- thread-count independence ------------------------------------------------------------------

// Runs a mix of ops with `threads` OpenMP threads; returns the concatenated outputs.
static float* run_mix(int threads, size_t* len) {
    omp_set_num_threads(threads);
    Rng save = rng;
    rng_seed(&rng, 1234);
    enum { M = 200, N = 300, K = 290, B = 2, T = 50, Hq = 4, Hkv = 2, D = 8, V = 500, R = 3000 };
    const size_t nq = (size_t)B * T * Hq * D, nk = (size_t)B * T * Hkv * D;
    const size_t total = M * N + 2 * nq + 2 * nk + B * Hq * T + 64 * 33 + 33 + (size_t)R * V + 2 +
                         5000 * 8 + 2 * 5000 * 2 + 2 * 8 + 1 + 7 * 40;
    float* o = fill(total, 0);
    float* p = o;
    float *A = rnd(M * K, 1), *Bm = rnd(N * K, 1);
    GemmDesc gd = {.M = M, .N = N, .K = K, .trans_b = 1, .alpha = 1, .beta = 0};
    be->gemm(be, &gd, A, Bm, p);
    p += M * N;
    float *q = rnd(nq, 1), *k = rnd(nk, 1), *v = rnd(nk, 1), *r = rnd(nq, 1);
    float *out = p, *dq = p + nq, *lse = p + 2 * nq;
    p += 2 * nq + B * Hq * T;
    be->attn_fwd(be, out, lse, q, k, v, B, T, Hq, Hkv, D);
    be->attn_bwd(be, dq, p, p + nk, r, out, lse, q, k, v, B, T, Hq, Hkv, D, NULL, 0);
    p += 2 * nk;
    float *x = rnd(64 * 33, 1), *w = rnd(33, 1), *y = rnd(64 * 33, 1), rs[64];
    be->rmsnorm_fwd(be, y, rs, x, w, 64, 33, 1e-5f);
    be->rmsnorm_bwd(be, p, p + 64 * 33, y, x, w, rs, 64, 33, 0);
    p += 64 * 33 + 33;
    float* lg = rnd((size_t)R * V, 3);
    int32_t* tg = xmalloc(sizeof(int32_t) * R);
    for (int i = 0; i < R; i++) tg[i] = (int32_t)(rng_u64(&rng) % V);
    memcpy(p, lg, sizeof(float) * R * V);
    be->cross_entropy(be, p, p + (size_t)R * V, tg, R, V, 0.5f);
    be->sumsq_f32(be, p + (size_t)R * V + 1, lg, (size_t)R * V);
    p += (size_t)R * V + 2;
    enum { RN = 5000, RE = 8, RK = 2 };  // router: rows in several fixed chunks
    float* rl = rnd(RN * RE, 2);
    int32_t* ri = xmalloc(sizeof(int32_t) * RN * RK);
    be->router_fwd(be, p, ri, p + RN * RE, p + RN * RE + RN * RK, p + RN * RE + RN * RK + 2 * RE, rl, RN, RE, RK);
    p += RN * RE + RN * RK + 2 * RE + 1;
    memcpy(p, ri, sizeof(int32_t) * RN * RK);
    p += RN * RK;
    int32_t et[4000];  // embedding backward with many repeated tokens
    for (int i = 0; i < 4000; i++) et[i] = (int32_t)(rng_u64(&rng) % 7);
    float* ed = rnd(4000 * 40, 1);
    be->embed_bwd(be, p, ed, et, 4000, 40, 7);
    p += 7 * 40;
    CHECK((size_t)(p - o) == total, "run_mix layout");
    free(rl), free(ri), free(ed);
    free(A), free(Bm), free(q), free(k), free(v), free(r), free(x), free(w), free(y), free(lg), free(tg);
    rng = save;
    *len = total;
    return o;
}

static void test_thread_independence(void) {
    const int nt = omp_get_max_threads();
    size_t n1, n3;
    float* a = run_mix(1, &n1);
    float* b = run_mix(3, &n3);
    omp_set_num_threads(nt);
    EXPECT(n1 == n3 && memcmp(a, b, sizeof(float) * n1) == 0,
           "gemm, attention, rmsnorm, cross-entropy, sumsq, router, embedding: 1 and 3 threads give identical bits");
    free(a), free(b);
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
    be = cpu_backend_create();
    rng_seed(&rng, 20240917);
    RUN(test_memory);
    RUN(test_elementwise);
    RUN(test_embedding);
    RUN(test_rmsnorm);
    RUN(test_rope);
    RUN(test_attention);
    RUN(test_cross_entropy);
    RUN(test_adamw);
    RUN(test_split_pack);
    RUN(test_adamw_split);
    RUN(test_thread_independence);
    RUN(test_fd_checker_fails_on_wrong_gradient);
    be->destroy(be);
    TEST_END();
}
