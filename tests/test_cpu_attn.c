// test_cpu_attn.c — src/cpu/cpu_attn.c: RoPE (the HF rotate_half formula, its inverse, the fused
// q/k/v rows, long positions, per-token positions of packed documents) and causal GQA attention
// (a naive double reference, finite differences) at the shapes of tests/op_cases.h, and with
// packed documents (block-diagonal: the reference, finite differences, each document alone). Method and the tolerance table: tests/cpu_fd.h.

#include "cpu_fd.h"
#include "op_cases.h"

// ---- RoPE -------------------------------------------------------------------------------------

// One tensor x [B, T, nh, D] rotated into y (rope_qkv with no kv heads): forward reads the
// packed side and writes q; the inverse reads q and writes the packed side.
static void rope1(float* y, const float* x, int B, int T, int nh, int D, float theta, int inverse) {
    if (!inverse) be->rope_qkv(be, (void*)x, y, NULL, NULL, B, T, nh, 0, D, theta, 0, NULL);
    else be->rope_qkv(be, y, (void*)x, NULL, NULL, B, T, nh, 0, D, theta, 1, NULL);
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

// One tensor (q alone): the formula, t = 0 the identity, the inverse, the gradient.
static void rope_single_case(int B, int T, int nh, int D, float theta) {
    const size_t n = (size_t)B * T * nh * D;
    float *x = rnd(n, 1), *y = rnd(n, 1), *r = rnd(n, 1), *z = rnd(n, 1), *g = rnd(n, 1);
    double* ref = xmalloc(sizeof(double) * n);
    rope1(y, x, B, T, nh, D, theta, 0);
    rope_ref(x, ref, B, T, nh, D, theta, 1);
    EXPECT(rel_l2d(y, ref, n) < TOL_FWD, "rope vs rotate_half formula: %.3g", rel_l2d(y, ref, n));
    EXPECT(memcmp(y, x, sizeof(float) * nh * D) == 0, "rope at t = 0 is the identity");
    rope1(z, y, B, T, nh, D, theta, 1);
    EXPECT(rel_l2(z, x, n) < TOL_FWD, "rope inverse undoes rope: %.3g", rel_l2(z, x, n));
    rope_ref(y, ref, B, T, nh, D, theta, -1);
    EXPECT(rel_l2d(z, ref, n) < TOL_FWD, "rope inverse rotates by −angle: %.3g", rel_l2d(z, ref, n));
    // the backward of rope is the inverse rotation: dL/dx = R⁻¹ r
    rope1(g, r, B, T, nh, D, theta, 1);
    RopeCtx c = {x, y, r, B, T, nh, D, theta};
    FdVar v = {"x", x, g, n};
    FD_EXPECT("rope", &v, rope_loss, &c, EPS_LINEAR, TOL_LINEAR);
    free(x), free(y), free(r), free(ref), free(z), free(g);
}

// The fused projection's rows: q and k parts rotated as single tensors, v copied, and back.
static void rope_fused_case(int B, int T, int Hq, int Hkv, int D, float theta) {
    const int W = (Hq + 2 * Hkv) * D;
    const size_t rows = (size_t)B * T, n = rows * W, nq = rows * Hq * D, nk = rows * Hkv * D;
    float *qkv = rnd(n, 1), *q = rnd(nq, 1), *k = rnd(nk, 1), *v = rnd(nk, 1), *back = rnd(n, 1);
    float *xq = rnd(nq, 1), *xk = rnd(nk, 1), *yq = rnd(nq, 1), *yk = rnd(nk, 1);
    for (size_t i = 0; i < rows; i++) {  // the parts as planar tensors
        memcpy(xq + i * Hq * D, qkv + i * W, sizeof(float) * Hq * D);
        memcpy(xk + i * Hkv * D, qkv + i * W + Hq * D, sizeof(float) * Hkv * D);
    }
    be->rope_qkv(be, qkv, q, k, v, B, T, Hq, Hkv, D, theta, 0, NULL);
    rope1(yq, xq, B, T, Hq, D, theta, 0);
    rope1(yk, xk, B, T, Hkv, D, theta, 0);
    int v_ok = 1;
    for (size_t i = 0; i < rows; i++)
        v_ok &= !memcmp(v + i * Hkv * D, qkv + i * W + (Hq + Hkv) * D, sizeof(float) * Hkv * D);
    EXPECT(!memcmp(q, yq, sizeof(float) * nq) && !memcmp(k, yk, sizeof(float) * nk) && v_ok,
           "rope_qkv: q, k as single tensors, v copied");
    be->rope_qkv(be, back, q, k, v, B, T, Hq, Hkv, D, theta, 1, NULL);
    EXPECT(rel_l2(back, qkv, n) < TOL_FWD, "rope_qkv inverse gives back the packed rows: %.3g",
           rel_l2(back, qkv, n));
    free(qkv), free(q), free(k), free(v), free(back), free(xq), free(xk), free(yq), free(yk);
}

static void test_rope(void) {
    for (int i = 0; i < N_CASES(ROPE_CASES); i++) {
        const RopeCase* c = &ROPE_CASES[i];
        if (!(c->where & CASE_CPU)) continue;
        if (c->Hkv == 0) rope_single_case(c->B, c->T, c->Hq, c->D, c->theta);
        else rope_fused_case(c->B, c->T, c->Hq, c->Hkv, c->D, c->theta);
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
    const int32_t* doc;
} AttnCtx;
static double attn_loss(void* c_) {
    AttnCtx* c = c_;
    be->attn_fwd(be, c->out, c->lse, c->q, c->k, c->v, c->B, c->T, c->Hq, c->Hkv, c->D, c->doc);
    return dotd(c->r, c->out, (size_t)c->B * c->T * c->Hq * c->D);
}

// Naive causal GQA attention in double: out [B,T,Hq,D], lse [B,Hq,T]; query t sees keys
// s0 ≤ s ≤ t with s0 = doc[b·T + t] (0 when doc is NULL).
static void attn_ref(const float* q, const float* k, const float* v, double* out, double* lse, int B, int T, int Hq,
                     int Hkv, int D, const int32_t* doc) {
    double* sc = xmalloc(sizeof(double) * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++) {
            const int kh = h / (Hq / Hkv);
            for (int t = 0; t < T; t++) {
                const float* qr = q + (((size_t)b * T + t) * Hq + h) * D;
                double mx = -INFINITY;
                const int s0 = doc ? doc[(size_t)b * T + t] : 0;
                for (int s = s0; s <= t; s++) {
                    double d = 0;
                    for (int i = 0; i < D; i++) d += (double)qr[i] * k[(((size_t)b * T + s) * Hkv + kh) * D + i];
                    sc[s] = d / sqrt((double)D);
                    mx = fmax(mx, sc[s]);
                }
                double sum = 0;
                for (int s = s0; s <= t; s++) sum += exp(sc[s] - mx);
                lse[((size_t)b * Hq + h) * T + t] = mx + log(sum);
                double* o = out + (((size_t)b * T + t) * Hq + h) * D;
                for (int i = 0; i < D; i++) o[i] = 0;
                for (int s = s0; s <= t; s++)
                    for (int i = 0; i < D; i++)
                        o[i] += exp(sc[s] - mx) / sum * v[(((size_t)b * T + s) * Hkv + kh) * D + i];
            }
        }
    free(sc);
}

static void attn_case_doc(int B, int T, int Hq, int Hkv, int D, float in_scale, int grads, const int32_t* doc) {
    const size_t nq = (size_t)B * T * Hq * D, nk = (size_t)B * T * Hkv * D, nl = (size_t)B * Hq * T;
    float *q = rnd(nq, in_scale), *k = rnd(nk, in_scale), *v = rnd(nk, 1), *r = rnd(nq, 1);
    float *out = fill(nq, NAN), *lse = fill(nl, NAN);
    double *ro = xmalloc(sizeof(double) * nq), *rl = xmalloc(sizeof(double) * nl);
    be->attn_fwd(be, out, lse, q, k, v, B, T, Hq, Hkv, D, doc);
    attn_ref(q, k, v, ro, rl, B, T, Hq, Hkv, D, doc);
    double le = 0;
    for (size_t i = 0; i < nl; i++) le = fmax(le, isfinite(lse[i]) ? fabs(lse[i] - rl[i]) / fmax(1, fabs(rl[i])) : INFINITY);
    const double tol = in_scale > 1 ? TOL_ATTN_BIG : TOL_FWD;
    EXPECT(rel_l2d(out, ro, nq) < tol, "attn_fwd B=%d T=%d Hq=%d Hkv=%d D=%d scale %g%s vs naive: %.3g", B, T,
           Hq, Hkv, D, in_scale, doc ? " (documents)" : "", rel_l2d(out, ro, nq));
    EXPECT(le < tol, "attn lse vs naive: max rel error %.3g", le);
    if (grads) {
        float *dq = fill(nq, NAN), *dk = fill(nk, NAN), *dv = fill(nk, NAN);
        be->attn_bwd(be, dq, dk, dv, r, out, lse, q, k, v, B, T, Hq, Hkv, D, NULL, 0, doc);
        AttnCtx c = {q, k, v, out, lse, r, B, T, Hq, Hkv, D, doc};
        FdVar vq = {"q", q, dq, nq}, vk = {"k", k, dk, nk}, vv = {"v", v, dv, nk};
        FD_EXPECT("attention", &vq, attn_loss, &c, EPS_SMOOTH, TOL_SMOOTH);
        FD_EXPECT("attention", &vk, attn_loss, &c, EPS_SMOOTH, TOL_SMOOTH);
        FD_EXPECT("attention", &vv, attn_loss, &c, EPS_SMOOTH, TOL_SMOOTH);
        free(dq), free(dk), free(dv);
    }
    free(q), free(k), free(v), free(r), free(out), free(lse), free(ro), free(rl);
}
static void attn_case(int B, int T, int Hq, int Hkv, int D, float in_scale, int grads) {
    attn_case_doc(B, T, Hq, Hkv, D, in_scale, grads, NULL);
}

static void test_attention(void) {
    for (int i = 0; i < N_CASES(ATTN_CASES); i++) {
        const AttnCase* c = &ATTN_CASES[i];
        if (c->where & CASE_CPU) attn_case(c->B, c->T, c->Hq, c->Hkv, c->D, c->scale, c->scale <= 1.f);
    }
}

// ---- packed documents -------------------------------------------------------------------------

// Document starts of one window of T tokens cut into documents of lens[0], lens[1], ... tokens
// (0-terminated; the last document runs to T).
static void docs_of(int32_t* doc, int T, const int* lens) {
    int s = 0, n = 0;
    for (int t = 0; t < T; t++) {
        if (lens[n] && t == s + lens[n]) s = t, n++;
        doc[t] = s;
    }
}

// Rows [t0, t0 + n) of window b of x [B, T, w] into y [n, w] (get) or back (put).
static void rows_get(float* y, const float* x, int b, int T, int t0, int n, int w) {
    memcpy(y, x + ((size_t)b * T + t0) * w, sizeof(float) * (size_t)n * w);
}
static int rows_same(const float* y, const float* x, int b, int T, int t0, int n, int w) {
    return !memcmp(y, x + ((size_t)b * T + t0) * w, sizeof(float) * (size_t)n * w);
}

// Attention over packed documents: against the double reference and by finite differences
// (attn_case_doc), one document = no documents, documents of one token attend to themselves only,
// and every document of a packed window gives the same bits run alone.
static void test_attention_documents(void) {
    enum { T = 150, B = 2, Hq = 4, Hkv = 2, D = 8 };
    // window 0 crosses the forward's 64-key blocks and the backward's 16-key blocks at odd places;
    // window 1 is one document
    static const int lens0[] = {1, 63, 2, 17, 40, 1, 0}, lens1[] = {0};
    int32_t doc[B * T];
    docs_of(doc, T, lens0);
    docs_of(doc + T, T, lens1);
    attn_case_doc(B, T, Hq, Hkv, D, 1.0f, 0, doc);
    attn_case_doc(B, T, Hq, Hkv, D, 6.0f, 0, doc);  // online softmax rescaling within a document
    {
        enum { Ts = 40 };
        static const int la[] = {7, 1, 20, 0}, lb[] = {16, 16, 0};
        int32_t ds[2 * Ts];
        docs_of(ds, Ts, la);
        docs_of(ds + Ts, Ts, lb);
        attn_case_doc(2, Ts, 6, 2, 8, 1.0f, 1, ds);  // gradients by finite differences, GQA
    }

    const size_t nq = (size_t)B * T * Hq * D, nk = (size_t)B * T * Hkv * D, nl = (size_t)B * Hq * T;
    float *q = rnd(nq, 1), *k = rnd(nk, 1), *v = rnd(nk, 1), *r = rnd(nq, 1);
    float *out = fill(nq, NAN), *lse = fill(nl, NAN), *dq = fill(nq, NAN), *dk = fill(nk, NAN), *dv = fill(nk, NAN);
    float *o2 = fill(nq, NAN), *l2 = fill(nl, NAN), *dq2 = fill(nq, NAN), *dk2 = fill(nk, NAN), *dv2 = fill(nk, NAN);
    {  // every token its own document start 0 = no documents (NULL), bit for bit
        int32_t zero[B * T] = {0};
        be->attn_fwd(be, out, lse, q, k, v, B, T, Hq, Hkv, D, NULL);
        be->attn_bwd(be, dq, dk, dv, r, out, lse, q, k, v, B, T, Hq, Hkv, D, NULL, 0, NULL);
        be->attn_fwd(be, o2, l2, q, k, v, B, T, Hq, Hkv, D, zero);
        be->attn_bwd(be, dq2, dk2, dv2, r, o2, l2, q, k, v, B, T, Hq, Hkv, D, NULL, 0, zero);
        EXPECT(!memcmp(out, o2, sizeof(float) * nq) && !memcmp(lse, l2, sizeof(float) * nl) &&
                   !memcmp(dq, dq2, sizeof(float) * nq) && !memcmp(dk, dk2, sizeof(float) * nk) &&
                   !memcmp(dv, dv2, sizeof(float) * nk),
               "one document per window = plain causal attention, bit for bit");
    }
    {  // documents of one token: out = v, lse = q·k / √D
        int32_t self[B * T];
        for (int i = 0; i < B * T; i++) self[i] = i % T;
        be->attn_fwd(be, o2, l2, q, k, v, B, T, Hq, Hkv, D, self);
        double worst = 0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int h = 0; h < Hq; h++) {
                    const float* qr = q + (((size_t)b * T + t) * Hq + h) * D;
                    const float* kr = k + (((size_t)b * T + t) * Hkv + h / (Hq / Hkv)) * D;
                    const float* vr = v + (((size_t)b * T + t) * Hkv + h / (Hq / Hkv)) * D;
                    worst = fmax(worst, fabs(l2[((size_t)b * Hq + h) * T + t] - dotd(qr, kr, D) / sqrt((double)D)));
                    for (int i = 0; i < D; i++) worst = fmax(worst, fabs(o2[(((size_t)b * T + t) * Hq + h) * D + i] - vr[i]));
                }
        EXPECT(worst < 1e-6, "documents of one token see only themselves: max error %.3g", worst);
    }
    {  // packed = each document alone
        be->attn_fwd(be, out, lse, q, k, v, B, T, Hq, Hkv, D, doc);
        be->attn_bwd(be, dq, dk, dv, r, out, lse, q, k, v, B, T, Hq, Hkv, D, NULL, 0, doc);
        int same = 1, ndocs = 0;
        for (int b = 0; b < B; b++)
            for (int t0 = 0; t0 < T;) {
                int n = 1;
                while (t0 + n < T && doc[b * T + t0 + n] == t0) n++;
                ndocs++;
                float *sq = rnd((size_t)n * Hq * D, 1), *sk = rnd((size_t)n * Hkv * D, 1), *sv = rnd((size_t)n * Hkv * D, 1);
                float *sr = rnd((size_t)n * Hq * D, 1), *so = rnd((size_t)n * Hq * D, 1), *sl = rnd((size_t)Hq * n, 1);
                float *sdq = rnd((size_t)n * Hq * D, 1), *sdk = rnd((size_t)n * Hkv * D, 1), *sdv = rnd((size_t)n * Hkv * D, 1);
                rows_get(sq, q, b, T, t0, n, Hq * D);
                rows_get(sk, k, b, T, t0, n, Hkv * D);
                rows_get(sv, v, b, T, t0, n, Hkv * D);
                rows_get(sr, r, b, T, t0, n, Hq * D);
                be->attn_fwd(be, so, sl, sq, sk, sv, 1, n, Hq, Hkv, D, NULL);
                be->attn_bwd(be, sdq, sdk, sdv, sr, so, sl, sq, sk, sv, 1, n, Hq, Hkv, D, NULL, 0, NULL);
                same &= rows_same(so, out, b, T, t0, n, Hq * D) && rows_same(sdq, dq, b, T, t0, n, Hq * D) &&
                        rows_same(sdk, dk, b, T, t0, n, Hkv * D) && rows_same(sdv, dv, b, T, t0, n, Hkv * D);
                for (int h = 0; h < Hq; h++)
                    same &= !memcmp(sl + (size_t)h * n, lse + ((size_t)b * Hq + h) * T + t0, sizeof(float) * n);
                free(sq), free(sk), free(sv), free(sr), free(so), free(sl), free(sdq), free(sdk), free(sdv);
                t0 += n;
            }
        EXPECT(same && ndocs == 8, "%d packed documents = each run alone (out, lse, dq, dk, dv bit for bit)", ndocs);
    }
    free(q), free(k), free(v), free(r), free(out), free(lse), free(dq), free(dk), free(dv);
    free(o2), free(l2), free(dq2), free(dk2), free(dv2);
}

// RoPE with per-token positions: positions 0..T-1 given = none given; positions restarting per
// document = each document rotated alone; the inverse likewise.
static void test_rope_positions(void) {
    enum { B = 2, T = 29, Hq = 3, Hkv = 1, D = 12, W = (Hq + 2 * Hkv) * D };
    static const int la[] = {5, 1, 11, 0}, lb[] = {0};
    int32_t doc[B * T], pos[B * T], ident[B * T];
    docs_of(doc, T, la);
    docs_of(doc + T, T, lb);
    for (int i = 0; i < B * T; i++) pos[i] = i % T - doc[i], ident[i] = i % T;
    const size_t rows = (size_t)B * T, n = rows * W, nq = rows * Hq * D, nk = rows * Hkv * D;
    float *qkv = rnd(n, 1), *q = rnd(nq, 1), *k = rnd(nk, 1), *v = rnd(nk, 1);
    float *q2 = rnd(nq, 1), *k2 = rnd(nk, 1), *v2 = rnd(nk, 1), *back = rnd(n, 1), *back2 = rnd(n, 1);
    be->rope_qkv(be, qkv, q, k, v, B, T, Hq, Hkv, D, 1e4f, 0, NULL);
    be->rope_qkv(be, qkv, q2, k2, v2, B, T, Hq, Hkv, D, 1e4f, 0, ident);
    be->rope_qkv(be, back, q, k, v, B, T, Hq, Hkv, D, 1e4f, 1, NULL);
    be->rope_qkv(be, back2, q, k, v, B, T, Hq, Hkv, D, 1e4f, 1, ident);
    EXPECT(!memcmp(q, q2, sizeof(float) * nq) && !memcmp(k, k2, sizeof(float) * nk) && !memcmp(v, v2, sizeof(float) * nk) &&
               !memcmp(back, back2, sizeof(float) * n),
           "rope_qkv: positions 0..T-1 = no positions, bit for bit");
    be->rope_qkv(be, qkv, q, k, v, B, T, Hq, Hkv, D, 1e4f, 0, pos);
    be->rope_qkv(be, back, q, k, v, B, T, Hq, Hkv, D, 1e4f, 1, pos);
    EXPECT(rel_l2(back, qkv, n) < TOL_FWD, "rope_qkv with positions: inverse gives back the rows: %.3g", rel_l2(back, qkv, n));
    int same = 1;
    for (int b = 0; b < B; b++)
        for (int t0 = 0; t0 < T;) {
            int len = 1;
            while (t0 + len < T && doc[b * T + t0 + len] == t0) len++;
            float *sx = rnd((size_t)len * W, 1), *sq = rnd((size_t)len * Hq * D, 1), *sk = rnd((size_t)len * Hkv * D, 1);
            float *sv = rnd((size_t)len * Hkv * D, 1), *sb = rnd((size_t)len * W, 1);
            rows_get(sx, qkv, b, T, t0, len, W);
            be->rope_qkv(be, sx, sq, sk, sv, 1, len, Hq, Hkv, D, 1e4f, 0, NULL);
            be->rope_qkv(be, sb, sq, sk, sv, 1, len, Hq, Hkv, D, 1e4f, 1, NULL);
            same &= rows_same(sq, q, b, T, t0, len, Hq * D) && rows_same(sk, k, b, T, t0, len, Hkv * D) &&
                    rows_same(sv, v, b, T, t0, len, Hkv * D) && rows_same(sb, back, b, T, t0, len, W);
            free(sx), free(sq), free(sk), free(sv), free(sb);
            t0 += len;
        }
    EXPECT(same, "rope_qkv: positions restarting per document = each document alone, bit for bit");
    EXPECT(memcmp(q + 5 * Hq * D, q2 + 5 * Hq * D, sizeof(float) * Hq * D) != 0, "positions change the rotation");
    free(qkv), free(q), free(k), free(v), free(q2), free(k2), free(v2), free(back), free(back2);
}

static void test_rope_inverse(void) {
    const int B = 2, T = 7, nh = 3, D = 8;
    const size_t n = (size_t)B * T * nh * D;
    float *x = rnd(n, 1), *y = rnd(n, 1), *z = rnd(n, 1);
    be->rope_qkv(be, x, y, NULL, NULL, B, T, nh, 0, D, 10000.0f, 0, NULL);  // y = rope(x)
    double diff = 0;
    for (size_t i = 0; i < n; i++) diff += fabs(y[i] - x[i]);
    EXPECT(diff > 1e-3, "rope changes the input");
    // position 0 is not rotated
    EXPECT(fabsf(y[0] - x[0]) < 1e-7f, "rope at t=0 is the identity");
    be->rope_qkv(be, z, y, NULL, NULL, B, T, nh, 0, D, 10000.0f, 1, NULL);  // z = rope⁻¹(y)
    EXPECT(rel_l2(z, x, n) < 1e-6, "rope inverse: %g", rel_l2(z, x, n));
    free(x), free(y), free(z);
}

static void test_attention_grad(void) {
    enum { B = 2, T = 7, Hq = 4, Hkv = 2, D = 8 };
    const size_t nq = (size_t)B * T * Hq * D, nk = (size_t)B * T * Hkv * D;
    float *q = rnd(nq, 1), *k = rnd(nk, 1), *v = rnd(nk, 1), *r = rnd(nq, 1);
    float *uq = rnd(nq, 1), *uk = rnd(nk, 1), *uv = rnd(nk, 1);
    float* o = xmalloc(sizeof(float) * nq);
    float *dq = xmalloc(sizeof(float) * nq), *dk = xmalloc(sizeof(float) * nk), *dv = xmalloc(sizeof(float) * nk);
    float lse[B * Hq * T];
    be->attn_fwd(be, o, lse, q, k, v, B, T, Hq, Hkv, D, NULL);
    // causality: output at t = 0 is v at t = 0 (its kv head)
    EXPECT(fabsf(o[0] - v[0]) < 1e-6f, "attention at t=0 copies v");
    be->attn_bwd(be, dq, dk, dv, r, o, lse, q, k, v, B, T, Hq, Hkv, D, NULL, 0, NULL);
    const double an = dotd(dq, uq, nq) + dotd(dk, uk, nk) + dotd(dv, uv, nk);
    const float eps = 1e-2f;
    double L[2];
    float *qp = xmalloc(sizeof(float) * nq), *kp = xmalloc(sizeof(float) * nk), *vp = xmalloc(sizeof(float) * nk);
    for (int s = 0; s < 2; s++) {
        float e = s ? -eps : eps;
        for (size_t i = 0; i < nq; i++) qp[i] = q[i] + e * uq[i];
        for (size_t i = 0; i < nk; i++) kp[i] = k[i] + e * uk[i], vp[i] = v[i] + e * uv[i];
        be->attn_fwd(be, o, lse, qp, kp, vp, B, T, Hq, Hkv, D, NULL);
        L[s] = dotd(o, r, nq);
    }
    EXPECT(relerr_ref(an, (L[0] - L[1]) / (2 * eps)) < TOL_OP, "attention: %g vs %g", an, (L[0] - L[1]) / (2 * eps));
    free(q), free(k), free(v), free(r), free(uq), free(uk), free(uv), free(o), free(dq), free(dk), free(dv);
    free(qp), free(kp), free(vp);
}

int main(void) {
    cpu_test_begin(20240917);
    RUN(test_rope);
    RUN(test_rope_inverse);
    RUN(test_attention);
    RUN(test_attention_documents);
    RUN(test_rope_positions);
    RUN(test_attention_grad);
    CPU_TEST_END();
}
