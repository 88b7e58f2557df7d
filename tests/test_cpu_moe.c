// test_cpu_moe.c — the CPU MoE ops: router forward against a double softmax / top-k (ordering,
// ties, NaN rows, statistics, z sum), router backward by finite differences through the
// renormalised top-k, the aux and the z terms; the expert-major index; permute / unpermute
// adjointness; SwiGLU with and without the routing scale, and the fused w13 + SwiGLU op's contract. Method and tolerances: tests/cpu_fd.h.
#include "cpu_fd.h"
#include "op_cases.h"

// ---- router forward ---------------------------------------------------------------------------

static void test_router_fwd(void) {
    enum { N = 50, E = 8, k = 2 };
    float *lg = rnd(N * E, 2), *probs = fill(N * E, NAN), *tw = fill(N * k, NAN);
    int32_t idx[N * k];
    float stats[2 * E], st0[2 * E], z = 0.75f;
    for (int e = 0; e < 2 * E; e++) st0[e] = stats[e] = 3.0f + e;  // accumulates (+=)
    be->router_fwd(be, probs, idx, tw, stats, &z, lg, N, E, k);
    double perr = 0, sum_err = 0, zref = 0.75, cnt[E] = {0}, psum[E] = {0};
    int order = 1, topset = 1, renorm = 1;
    for (int n = 0; n < N; n++) {
        const float* l = lg + n * E;
        const float* p = probs + n * E;
        double mx = -INFINITY, s = 0, ps = 0;
        for (int e = 0; e < E; e++) mx = fmax(mx, l[e]);
        for (int e = 0; e < E; e++) s += exp(l[e] - mx);
        zref += (mx + log(s)) * (mx + log(s));
        for (int e = 0; e < E; e++) {
            perr = fmax(perr, relerr(p[e], exp(l[e] - mx) / s));
            ps += p[e];
            psum[e] += p[e];
        }
        sum_err = fmax(sum_err, fabs(ps - 1));
        const int32_t* id = idx + n * k;
        order &= p[id[0]] >= p[id[1]] && id[0] != id[1];
        for (int e = 0; e < E; e++)
            if (e != id[0] && e != id[1]) topset &= p[e] <= p[id[1]];
        const double S = (double)p[id[0]] + p[id[1]];
        for (int j = 0; j < k; j++) {
            renorm &= relerr(tw[n * k + j], p[id[j]] / S) < TOL_FWD;
            cnt[id[j]] += 1;
        }
        renorm &= fabs((double)tw[n * k] + tw[n * k + 1] - 1) < TOL_FWD;
    }
    EXPECT(perr < TOL_FWD, "router probs vs double softmax: max rel error %.3g", perr);
    EXPECT(sum_err < TOL_FWD, "softmax rows sum to 1: max |Σ − 1| %.3g", sum_err);
    EXPECT(order, "top-k is descending and distinct");
    EXPECT(topset, "top-k holds the k largest probabilities");
    EXPECT(renorm, "topk_w = p / Σ_topk p, summing to 1");
    double total = 0;
    int counts_ok = 1, psum_ok = 1;
    for (int e = 0; e < E; e++) {
        counts_ok &= stats[e] - st0[e] == cnt[e];
        total += stats[e] - st0[e];
        psum_ok &= fabs(stats[E + e] - st0[E + e] - psum[e]) < 1e-5;
    }
    EXPECT(counts_ok && total == N * k, "stats[0,E) += routed counts, summing to N·k (%g)", total);
    EXPECT(psum_ok, "stats[E,2E) += Σ_n probs");
    EXPECT(relerr(z, zref) < TOL_FWD, "zsum += Σ lse²: %.9g vs %.9g", z, zref);
    free(lg), free(probs), free(tw);
}

static void test_router_ties(void) {
    // exact ties go to the lower index; NaN rows still give k distinct valid experts
    const float lg[4][5] = {{0, 2, 2, 1, 2}, {1, 1, 1, 1, 1}, {-3, 5, 0.5f, 5, 9}, {NAN, 1, NAN, 0, 2}};
    const int32_t want[4][3] = {{1, 2, 4}, {0, 1, 2}, {4, 1, 3}, {4, 1, 3}};
    float probs[4 * 5], tw[4 * 3], st[10] = {0}, z = 0;
    int32_t idx[4 * 3];
    be->router_fwd(be, probs, idx, tw, st, &z, lg[0], 3, 5, 3);
    for (int n = 0; n < 3; n++)
        for (int j = 0; j < 3; j++)
            EXPECT(idx[n * 3 + j] == want[n][j], "row %d slot %d: expert %d, want %d (ties → lower index)", n, j,
                   idx[n * 3 + j], want[n][j]);
    be->router_fwd(be, probs, idx, tw, st, &z, lg[3], 1, 5, 3);
    int valid = 1;
    for (int j = 0; j < 3; j++) valid &= idx[j] >= 0 && idx[j] < 5;
    valid &= idx[0] != idx[1] && idx[1] != idx[2] && idx[0] != idx[2];
    EXPECT(valid, "NaN logits: top-k still k distinct experts in range (%d %d %d)", idx[0], idx[1], idx[2]);
    // k = E: a full descending sort
    float l2[6] = {0.3f, -1, 2, 0.3f, 5, -7}, p2[6], w2[6], s2[12] = {0}, z2 = 0;
    int32_t i2[6];
    const int32_t w[6] = {4, 2, 0, 3, 1, 5};
    be->router_fwd(be, p2, i2, w2, s2, &z2, l2, 1, 6, 6);
    EXPECT(memcmp(i2, w, sizeof w) == 0, "k = E sorts all experts descending, ties by index");
    // large logits: max subtraction
    float l3[4] = {1e4f, 1e4f - 1, 1e4f - 2, -1e4f}, p3[4], w3[2], s3[8] = {0}, z3 = 0;
    int32_t i3[2];
    be->router_fwd(be, p3, i3, w3, s3, &z3, l3, 1, 4, 2);
    EXPECT(isfinite(p3[0]) && isfinite(z3) && i3[0] == 0 && i3[1] == 1 && fabsf(w3[0] - 0.7310586f) < 1e-6f,
           "logits ~1e4 stay finite (w0 %.7g, want 0.7310586)", w3[0]);
}

// ---- router backward --------------------------------------------------------------------------

typedef struct RouterCtx {
    float *lg, *probs, *tw, *stats;
    int32_t *idx, *idx0;
    const float *rw, *aux;
    double zg;
    int N, E, k, flipped;
} RouterCtx;

// L = Σ rw ∘ topk_w + Σ_n Σ_e aux_e p_ne + zg Σ_n lse(n)², the z part in double from the logits
// (zsum's forward is checked in test_router_fwd).
static double router_loss(void* c_) {
    RouterCtx* c = c_;
    float z = 0;
    memset(c->stats, 0, sizeof(float) * 2 * c->E);
    be->router_fwd(be, c->probs, c->idx, c->tw, c->stats, &z, c->lg, c->N, c->E, c->k);
    c->flipped |= memcmp(c->idx, c->idx0, sizeof(int32_t) * c->N * c->k) != 0;
    double L = c->rw ? dotd(c->rw, c->tw, (size_t)c->N * c->k) : 0;
    for (int n = 0; n < c->N; n++) {
        if (c->aux) L += dotd(c->aux, c->probs + (size_t)n * c->E, c->E);
        if (c->zg != 0) {
            const float* l = c->lg + (size_t)n * c->E;
            double mx = -INFINITY, s = 0;
            for (int e = 0; e < c->E; e++) mx = fmax(mx, l[e]);
            for (int e = 0; e < c->E; e++) s += exp(l[e] - mx);
            L += c->zg * (mx + log(s)) * (mx + log(s));
        }
    }
    return L;
}

// Logits whose top k+1 entries per row are ≥ 0.05 apart, so ±EPS_ROUTER·u never reorders them.
static float* separated_logits(int N, int E, int k) {
    float* lg = xmalloc(sizeof(float) * N * E);
    for (int n = 0; n < N; n++) {
        int ok = 0;
        while (!ok) {
            float* l = lg + n * E;
            for (int e = 0; e < E; e++) l[e] = 1.5f * rng_normal(&rng);
            ok = 1;
            for (int a = 0; a < E; a++)
                for (int b = 0; b < E; b++) {
                    if (a == b || fabsf(l[a] - l[b]) >= 0.05f) continue;
                    int above = 0;  // rank of the larger one
                    for (int e = 0; e < E; e++) above += l[e] > fmaxf(l[a], l[b]);
                    if (above <= k) ok = 0;
                }
        }
    }
    return lg;
}

static void router_bwd_case(const char* what, int use_w, int use_aux, float zg) {
    enum { N = 12, E = 6, k = 3 };
    float* lg = separated_logits(N, E, k);
    float *probs = fill(N * E, 0), *tw = fill(N * k, 0), stats[2 * E] = {0}, z = 0;
    int32_t idx[N * k], idx0[N * k];
    float *rw = rnd(N * k, 1), *aux = rnd(E, 0.5f), *dl = fill(N * E, NAN);
    be->router_fwd(be, probs, idx0, tw, stats, &z, lg, N, E, k);
    be->router_bwd(be, dl, use_w ? rw : NULL, use_aux ? aux : NULL, zg, probs, idx0, tw, lg, N, E, k);
    if (use_w && !use_aux && zg == 0) {
        int zero = 1;
        for (int n = 0; n < N; n++)
            for (int e = 0; e < E; e++) {
                int sel = 0;
                for (int j = 0; j < k; j++) sel |= idx0[n * k + j] == e;
                if (!sel) zero &= dl[n * E + e] == 0;
            }
        EXPECT(zero, "router_bwd: the top-k path gives exactly 0 to unselected experts");
    }
    RouterCtx c = {lg, probs, tw, stats, idx, idx0, use_w ? rw : NULL, use_aux ? aux : NULL, zg, N, E, k, 0};
    FdVar v = {"logits", lg, dl, (size_t)N * E};
    FD_EXPECT(what, &v, router_loss, &c, EPS_ROUTER, TOL_ROUTER);
    EXPECT(!c.flipped, "%s: no top-k choice flipped under ±ε", what);
    free(lg), free(probs), free(tw), free(rw), free(aux), free(dl);
}

static void test_router_bwd(void) {
    router_bwd_case("router_bwd (renormalised top-k)", 1, 0, 0.0f);
    router_bwd_case("router_bwd (aux)", 0, 1, 0.0f);
    router_bwd_case("router_bwd (z)", 0, 0, 0.05f);
    router_bwd_case("router_bwd (all three)", 1, 1, 0.05f);
}

// ---- expert-major index and permutations ------------------------------------------------------

// k distinct experts per token, never `skip` (an empty group; -1: none)
static int32_t* random_topk(int N, int k, int E, int skip) {
    int32_t* topk = xmalloc(sizeof(int32_t) * (size_t)N * k);
    for (int n = 0; n < N; n++)
        for (int s = 0; s < k; s++) {
            int e, dupl;
            do {
                e = (int)(rng_u64(&rng) % (uint64_t)(skip >= 0 ? E - 1 : E));
                if (skip >= 0 && e >= skip) e++;
                dupl = 0;
                for (int j = 0; j < s; j++) dupl |= topk[n * k + j] == e;
            } while (dupl);
            topk[n * k + s] = e;
        }
    return topk;
}

static void moe_index_case(const MoeIndexCase* c) {
    const int N = c->N, k = c->k, E = c->E, R = N * k;
    int32_t* topk = random_topk(N, k, E, c->skip);
    int32_t *dest = xmalloc(sizeof(int32_t) * R), *counts = xmalloc(sizeof(int32_t) * E);
    for (int e = 0; e < E; e++) counts[e] = -5;  // overwritten
    be->moe_index(be, counts, dest, topk, N, k, E);
    int *hist = xcalloc((size_t)E, sizeof(int)), *seen = xcalloc((size_t)R, sizeof(int)), total = 0;
    for (int i = 0; i < R; i++) hist[topk[i]]++;
    int match = 1;
    for (int e = 0; e < E; e++) match &= counts[e] == hist[e], total += counts[e];
    EXPECT(match && total == R && (c->skip < 0 || counts[c->skip] == 0), "counts are the histogram, summing to N·k");
    int perm = 1;
    for (int i = 0; i < R; i++) perm &= dest[i] >= 0 && dest[i] < R && !seen[dest[i]]++;
    EXPECT(perm, "dest is a permutation of [0, N·k)");
    int major = 1, stable = 1, *off = xcalloc((size_t)E + 1, sizeof(int));
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + hist[e];
    for (int i = 0; i < R; i++) {
        major &= dest[i] >= off[topk[i]] && dest[i] < off[topk[i] + 1];
        for (int j = 0; j < i; j++)
            if (topk[j] == topk[i]) stable &= dest[j] < dest[i];
    }
    EXPECT(major, "rows of expert e lie in [off_e, off_e + counts_e): experts ascending");
    EXPECT(stable, "within an expert, rows follow token n then slot");
    free(topk), free(dest), free(counts), free(hist), free(seen), free(off);
}

static void test_moe_index(void) {
    for (int i = 0; i < N_CASES(MOE_INDEX_CASES); i++)
        if (MOE_INDEX_CASES[i].where & CASE_CPU) moe_index_case(&MOE_INDEX_CASES[i]);
}

// |<Px, y> − <x, Pᵀy>| relative to the Cauchy–Schwarz bound ‖Px‖·‖y‖
static double adj_err(double a, double b, const float* px, size_t npx, const float* y, size_t ny) {
    return fabs(a - b) / sqrt(dotd(px, px, npx) * dotd(y, y, ny));
}

static void permute_case(const PermuteCase* c) {
    const int PN = c->N, PK = c->k, PE = c->E, PH = c->H;
    int32_t* topk = random_topk(PN, PK, PE, PE - 1);
    int32_t *dest = xmalloc(sizeof(int32_t) * PN * PK), *counts = xmalloc(sizeof(int32_t) * PE);
    be->moe_index(be, counts, dest, topk, PN, PK, PE);
    const size_t R = (size_t)PN * PK;
    float *x = rnd(PN * PH, 1), *y = rnd(R * PH, 1), *xp = fill(R * PH, NAN), *pty = fill(PN * PH, NAN);
    be->permute_fwd(be, xp, x, dest, PN, PK, PH);
    int exact = 1;
    for (size_t i = 0; i < R; i++) exact &= memcmp(xp + dest[i] * PH, x + (i / PK) * PH, sizeof(float) * PH) == 0;
    EXPECT(exact, "permute_fwd copies token rows to their expert-major rows exactly");
    be->permute_bwd(be, pty, y, dest, PN, PK, PH);
    const double ea = adj_err(dotd(xp, y, R * PH), dotd(x, pty, PN * PH), xp, R * PH, y, R * PH);
    EXPECT(ea < TOL_ADJ, "permute: <P x, y> = <x, Pᵀ y> (%.3g)", ea);

    float *u = fill(PN * PH, NAN), *ut = fill(R * PH, NAN);
    be->unpermute_fwd(be, u, y, dest, PN, PK, PH, NULL);
    be->unpermute_bwd(be, ut, x, dest, PN, PK, PH);
    const double eu = adj_err(dotd(u, x, PN * PH), dotd(y, ut, R * PH), u, PN * PH, x, PN * PH);
    EXPECT(eu < TOL_ADJ, "unpermute: <U y, x> = <y, Uᵀ x> (%.3g)", eu);
    EXPECT(memcmp(u, pty, sizeof(float) * PN * PH) == 0, "unpermute_fwd = permute_bwd (both sum a token's slots)");
    float* acc = dup(x, PN * PH);
    be->unpermute_fwd(be, acc, y, dest, PN, PK, PH, acc);
    double e = 0;
    for (int i = 0; i < PN * PH; i++) e = fmax(e, fabs(acc[i] - ((double)x[i] + u[i])));
    EXPECT(e < 1e-5, "unpermute_fwd with add = out adds onto out (max error %.3g)", e);
    float* sep = fill(PN * PH, NAN);
    be->unpermute_fwd(be, sep, y, dest, PN, PK, PH, x);
    EXPECT(memcmp(sep, acc, sizeof(float) * PN * PH) == 0, "unpermute_fwd with a separate add = in place, bit for bit");
    free(sep);

    float *w = rnd(R, 1), *wp = fill(R, NAN), *wb = fill(R, NAN);
    be->gather_rows_f32(be, wp, w, dest, (int)R);
    be->scatter_rows_f32(be, wb, wp, dest, (int)R);
    int g_ok = 1;
    for (size_t i = 0; i < R; i++) g_ok &= wp[dest[i]] == w[i];
    EXPECT(g_ok && memcmp(wb, w, sizeof(float) * R) == 0, "gather_rows_f32 then scatter_rows_f32 is the identity");
    free(x), free(y), free(xp), free(pty), free(u), free(ut), free(acc), free(w), free(wp), free(wb);
    free(topk), free(dest), free(counts);
}

static void test_permute(void) {
    for (int i = 0; i < N_CASES(PERMUTE_CASES); i++)
        if (PERMUTE_CASES[i].where & CASE_CPU) permute_case(&PERMUTE_CASES[i]);
}

// ---- SwiGLU -----------------------------------------------------------------------------------

typedef struct SwiCtx {
    float *gu, *h, *r;
    const float* scale;
    int n, F;
} SwiCtx;
static double swi_loss(void* c_) {
    SwiCtx* c = c_;
    be->swiglu_fwd(be, c->h, c->gu, c->scale, c->n, c->F);
    return dotd(c->r, c->h, (size_t)c->n * c->F);
}

static void swiglu_case(int n, int F) {
    float *gu = rnd(n * 2 * F, 2), *sc = rnd(n, 1), *r = rnd(n * F, 1), *h = fill(n * F, NAN);
    gu[0] = 60, gu[1] = -60;  // saturated sigmoid
    for (int with = 0; with < 2; with++) {
        const float* scale = with ? sc : NULL;
        be->swiglu_fwd(be, h, gu, scale, n, F);
        double* ref = xmalloc(sizeof(double) * n * F);
        for (int i = 0; i < n; i++)
            for (int f = 0; f < F; f++) {
                const double g = gu[i * 2 * F + f], u = gu[i * 2 * F + F + f];
                ref[i * F + f] = g / (1 + exp(-g)) * u * (with ? sc[i] : 1.0);
            }
        EXPECT(rel_l2d(h, ref, n * F) < TOL_FWD, "swiglu_fwd (scale %s) vs formula: %.3g", with ? "on" : "off",
               rel_l2d(h, ref, n * F));
        float *dgu = fill(n * 2 * F, NAN), *ds = fill(n, NAN), *dgu2 = fill(n * 2 * F, NAN);
        be->swiglu_bwd(be, dgu, ds, r, gu, scale, n, F);
        be->swiglu_bwd(be, dgu2, NULL, r, gu, scale, n, F);
        EXPECT(memcmp(dgu, dgu2, sizeof(float) * n * 2 * F) == 0, "dscale = NULL gives the same dgu");
        float* inpl = dup(gu, n * 2 * F);
        be->swiglu_bwd(be, inpl, NULL, r, inpl, scale, n, F);
        EXPECT(memcmp(inpl, dgu, sizeof(float) * n * 2 * F) == 0, "swiglu_bwd in place (dgu = gu)");
        SwiCtx c = {gu, h, r, scale, n, F};
        FdVar v = {"gu", gu, dgu, (size_t)n * 2 * F};
        FD_EXPECT(with ? "swiglu (scale)" : "swiglu", &v, swi_loss, &c, EPS_SMOOTH, TOL_SMOOTH);
        // dscale: the gradient w.r.t. the scale (at scale = 1 when there is none)
        float* s1 = with ? sc : fill(n, 1.0f);
        SwiCtx cs = {gu, h, r, s1, n, F};
        FdVar vs = {"scale", s1, ds, n};
        FD_EXPECT(with ? "swiglu (scale)" : "swiglu (dscale at scale 1)", &vs, swi_loss, &cs, EPS_SMOOTH, TOL_SMOOTH);
        if (!with) free(s1);
        free(ref), free(dgu), free(ds), free(dgu2), free(inpl);
    }
    free(gu), free(sc), free(r), free(h);
}

static void test_swiglu(void) {
    for (int i = 0; i < N_CASES(SWIGLU_CASES); i++)
        if (SWIGLU_CASES[i].where & CASE_CPU) swiglu_case(SWIGLU_CASES[i].n, SWIGLU_CASES[i].F);
}

// gemm_grouped_swiglu is, by its contract, gemm_grouped then swiglu_fwd over every group's rows
// (N = 2F): the same bits as the two ops called apart, an empty group included.
static void test_gemm_grouped_swiglu(void) {
    enum { G = 3, F = 6, N = 2 * F, K = 5 };
    const int off[G + 1] = {0, 4, 4, 9};
    const int R = off[G];
    float *A = rnd(R * K, 1), *B = rnd(G * N * K, 1), *sc = rnd(R, 1);
    float *gu = fill(R * N, NAN), *h = fill(R * F, NAN), *gu2 = fill(R * N, NAN), *h2 = fill(R * F, NAN);
    GemmDesc d = {.N = N, .K = K, .trans_b = 1, .alpha = 1};
    GroupDesc g = {.groups = G, .host_off = off, .b_stride = (size_t)N * K};
    be->gemm_grouped_swiglu(be, &d, &g, A, B, gu, h, sc);
    be->gemm_grouped(be, &d, &g, A, B, gu2);
    be->swiglu_fwd(be, h2, gu2, sc, R, F);
    EXPECT(memcmp(gu, gu2, sizeof(float) * R * N) == 0, "gemm_grouped_swiglu: gu differs from gemm_grouped's");
    EXPECT(memcmp(h, h2, sizeof(float) * R * F) == 0, "gemm_grouped_swiglu: h differs from swiglu_fwd's");
    free(A), free(B), free(sc), free(gu), free(h), free(gu2), free(h2);
}

static void test_swiglu_grad(void) {
    enum { n = 6, F = 5 };
    float *gu = rnd(n * 2 * F, 1), *sc = rnd(n, 1), *r = rnd(n * F, 1), *u = rnd(n * 2 * F, 1), *us = rnd(n, 1);
    float h[n * F], dgu[n * 2 * F], dsc[n];
    be->swiglu_bwd(be, dgu, dsc, r, gu, sc, n, F);
    const double an = dotd(dgu, u, n * 2 * F) + dotd(dsc, us, n);
    const float eps = 1e-2f;
    double L[2];
    for (int s = 0; s < 2; s++) {
        float gp[n * 2 * F], sp[n], e = s ? -eps : eps;
        for (int i = 0; i < n * 2 * F; i++) gp[i] = gu[i] + e * u[i];
        for (int i = 0; i < n; i++) sp[i] = sc[i] + e * us[i];
        be->swiglu_fwd(be, h, gp, sp, n, F);
        L[s] = dotd(h, r, n * F);
    }
    EXPECT(relerr_ref(an, (L[0] - L[1]) / (2 * eps)) < TOL_OP, "swiglu: %g vs %g", an, (L[0] - L[1]) / (2 * eps));
    free(gu), free(sc), free(r), free(u), free(us);
}

static void test_router_grad(void) {
    enum { N = 6, E = 5, k = 2 };
    float *lg = rnd(N * E, 1.5f), *rw = rnd(N * k, 1), *aux = rnd(E, 0.3f), *u = rnd(N * E, 1);
    float probs[N * E], tw[N * k], st[2 * E] = {0}, z = 0, dl[N * E];
    int32_t idx[N * k];
    const float zg = 0.05f;
    be->router_fwd(be, probs, idx, tw, st, &z, lg, N, E, k);
    double ps = 0;
    for (int e = 0; e < E; e++) ps += probs[e];
    EXPECT(fabs(ps - 1) < 1e-6, "softmax sums to 1");
    EXPECT(probs[idx[0]] >= probs[idx[1]], "top-k is descending");
    EXPECT(fabsf(tw[0] + tw[1] - 1) < 1e-6f, "top-k weights renormalised");
    double cnt = 0;
    for (int e = 0; e < E; e++) cnt += st[e];
    EXPECT(cnt == N * k, "stats count N*k routed rows");
    be->router_bwd(be, dl, rw, aux, zg, probs, idx, tw, lg, N, E, k);
    const double an = dotd(dl, u, N * E);
    // L = Σ rw·topk_w + Σ_n Σ_e aux_e p_ne + zg Σ lse²  (top-k set held fixed: small ε)
    const float eps = 1e-3f;
    double L[2];
    for (int s = 0; s < 2; s++) {
        float lp[N * E], p2[N * E], tw2[N * k], st2[2 * E] = {0}, z2 = 0, e = s ? -eps : eps;
        int32_t idx2[N * k];
        for (int i = 0; i < N * E; i++) lp[i] = lg[i] + e * u[i];
        be->router_fwd(be, p2, idx2, tw2, st2, &z2, lp, N, E, k);
        EXPECT(memcmp(idx, idx2, sizeof idx) == 0, "top-k set unchanged under ε");
        double l = dotd(tw2, rw, N * k) + zg * (double)z2;
        for (int n = 0; n < N; n++) l += dotd(p2 + n * E, aux, E);
        L[s] = l;
    }
    EXPECT(relerr_ref(an, (L[0] - L[1]) / (2 * eps)) < 1e-2, "router: %g vs %g", an, (L[0] - L[1]) / (2 * eps));
    free(lg), free(rw), free(aux), free(u);
}

static void test_permute_adjoint(void) {
    enum { N = 7, k = 2, E = 3, H = 4 };
    int32_t topk[N * k], dest[N * k], counts[E];
    for (int n = 0; n < N; n++) {
        topk[n * k] = n % E;
        topk[n * k + 1] = (n + 1 + n / 3) % E == n % E ? (n + 2) % E : (n + 1 + n / 3) % E;
    }
    be->moe_index(be, counts, dest, topk, N, k, E);
    int seen[N * k];
    memset(seen, 0, sizeof seen);
    int total = 0;
    for (int e = 0; e < E; e++) total += counts[e];
    EXPECT(total == N * k, "counts sum to N*k");
    for (int i = 0; i < N * k; i++) seen[dest[i]]++;
    int perm = 1;
    for (int i = 0; i < N * k; i++) perm &= seen[i] == 1;
    EXPECT(perm, "dest is a permutation");
    for (int i = 1; i < N * k; i++)
        for (int j = 0; j < i; j++)
            if (topk[j] == topk[i]) EXPECT(dest[j] < dest[i], "stable within an expert");
    float *x = rnd(N * H, 1), *y = rnd(N * k * H, 1), xp[N * k * H], pty[N * H];
    be->permute_fwd(be, xp, x, dest, N, k, H);
    be->permute_bwd(be, pty, y, dest, N, k, H);
    EXPECT(relerr_ref(dotd(xp, y, N * k * H), dotd(x, pty, N * H)) < 1e-5, "<Px, y> = <x, Pᵀy>");
    float up[N * H], upt[N * k * H];
    be->unpermute_fwd(be, up, y, dest, N, k, H, NULL);
    be->unpermute_bwd(be, upt, x, dest, N, k, H);
    EXPECT(relerr_ref(dotd(up, x, N * H), dotd(y, upt, N * k * H)) < 1e-5, "unpermute adjoint");
    free(x), free(y);
}

int main(void) {
    cpu_test_begin(4242);
    RUN(test_router_fwd);
    RUN(test_router_ties);
    RUN(test_router_bwd);
    RUN(test_moe_index);
    RUN(test_permute);
    RUN(test_swiglu);
    RUN(test_gemm_grouped_swiglu);
    RUN(test_swiglu_grad);
    RUN(test_router_grad);
    RUN(test_permute_adjoint);
    CPU_TEST_END();
}
