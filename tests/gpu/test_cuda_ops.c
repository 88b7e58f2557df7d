// test_cuda_ops.c — every op of the CUDA backend against the CPU backend (the spec), on random
// inputs (never zeros) and awkward shapes (an empty expert group, T not a multiple of the
// attention tile, widths that are not multiples of the block sizes), in fp32 and bf16 modes.
// The optimizer ops (adamw, the split-master ops) are in test_cuda_optim.c.
// Outputs are poisoned (0xFF bytes) first; errors are relative L2 (test.h rel_l2). The table of
// the worst error per check is printed at the end. Needs a GPU: without one it fails.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"

// ---- memory, casts, elementwise, reductions ----------------------------------------------------

static void test_memory(void) {
    FOR_MODES {
        Backend* be = m->gpu;
        const size_t n = 1003;
        float* z = down_f32(be, dev_alloc(be, n * 4), n);
        int nz = 0;
        for (size_t i = 0; i < n; i++) nz += z[i] != 0.f;
        EXPECT(nz == 0, "alloc [%s]: %d of %zu elements not zeroed", m->name, nz, n);
        free(z);
        float* x = randn(n, 1.f);
        float* a = up_f32(be, x, n);
        float* b = poison(be, n * 4);
        be->copy(be, b, a, n * 4);
        cmp(m, "copy", down_f32(be, b, n), x, n, 0);
        be->zero(be, b, n * 4);
        z = down_f32(be, b, n);
        nz = 0;
        for (size_t i = 0; i < n; i++) nz += z[i] != 0.f;
        EXPECT(nz == 0, "zero [%s]: %d elements not zeroed", m->name, nz);
        free(z);
        EXPECT(be->peak_bytes && be->peak_bytes(be) >= 2 * n * 4, "peak_bytes [%s] below what was allocated",
               m->name);
        free(x);
        dev_free_all();
    }
}

static void test_casts(void) {
    FOR_MODES {
        Backend* be = m->gpu;
        const size_t n = 10007;
        float* x = randn(n, 3.f);
        float* xr = act_in(m, x, n);  // what the act dtype holds
        void* act = poison_act(be, n);
        be->f32_to_act(be, act, up_f32(be, x, n), n);
        cmp(m, "f32_to_act", down_act(be, act, n), xr, n, 0);
        float* back = poison(be, n * 4);
        be->act_to_f32(be, back, up_act(be, xr, n), n);
        cmp(m, "act_to_f32", down_f32(be, back, n), xr, n, 0);

        float* y = act_in(m, randn(n, 1.f), n);
        void* dy = up_act(be, y, n);
        be->add_act(be, dy, up_act(be, xr, n), n);
        for (size_t i = 0; i < n; i++) y[i] += xr[i];
        cmp(m, "add_act", down_act(be, dy, n), y, n, TOL(TOL_F32, TOL_BF16_OUT));

        float* s = dupf(x, n);
        float* ds = up_f32(be, s, n);
        be->scale_f32(be, ds, -0.37f, n);
        g_cpu->scale_f32(g_cpu, s, -0.37f, n);
        cmp(m, "scale_f32", down_f32(be, ds, n), s, n, TOL_F32);

        const size_t big = 300007;  // several blocks' worth per partial
        float* v = randn(big, 2.f);
        float ref = 1.5f;
        g_cpu->sumsq_f32(g_cpu, &ref, v, big);
        float* dv = up_f32(be, v, big);
        float init = 1.5f;
        float* out1 = up_f32(be, &init, 1);
        float* out2 = up_f32(be, &init, 1);
        be->sumsq_f32(be, out1, dv, big);
        be->sumsq_f32(be, out2, dv, big);
        cmp(m, "sumsq_f32", down_f32(be, out1, 1), &ref, 1, TOL_F32);
        cmp_bits(m, "sumsq_f32 deterministic", down_f32(be, out1, 1), down_f32(be, out2, 1), 1);
        {  // sumsq_act (act-dtype gradients) on act values, from a 16-byte boundary and after a scalar head
            float* va = act_in(m, v, big);
            char* dva = up_act(be, va, big);
            for (int off = 0; off < 4; off += 3) {
                float ra = 1.5f;
                g_cpu->sumsq_f32(g_cpu, &ra, va + off, big - off);
                float* o = up_f32(be, &init, 1);
                be->sumsq_act(be, o, dva + off * dtype_size(be->act_dtype), big - off);
                cmp(m, off ? "sumsq_act (unaligned)" : "sumsq_act", down_f32(be, o, 1), &ra, 1, TOL_F32);
            }
            free(va);
        }

        const float q = 0.25f, one = 1.f;
        float* flag = up_f32(be, &q, 1);
        be->nonfinite_f32(be, flag, dv, big);
        cmp(m, "nonfinite_f32 clean", down_f32(be, flag, 1), &q, 1, 0);
        v[77777] = NAN;
        be->to_device(be, dv, v, big * 4);
        be->nonfinite_f32(be, flag, dv, big);
        cmp(m, "nonfinite_f32 nan", down_f32(be, flag, 1), &one, 1, 0);
        v[77777] = 1.f;
        v[big - 1] = -INFINITY;
        be->to_device(be, dv, v, big * 4);
        be->to_device(be, flag, &q, 4);
        be->nonfinite_f32(be, flag, dv, big);
        cmp(m, "nonfinite_f32 inf", down_f32(be, flag, 1), &one, 1, 0);
        free(x), free(xr), free(y), free(s), free(v);
        dev_free_all();
    }
}

// ---- embedding, RMSNorm, RoPE ------------------------------------------------------------------

static void test_embed(void) {
    const int shapes[][3] = {{50, 72, 61}, {13, 37, 40}};  // V, H, N (H = 37: rows not 16-byte multiples)
    FOR_MODES for (int c = 0; c < 2; c++) {
        Backend* be = m->gpu;
        const int V = shapes[c][0], H = shapes[c][1], N = shapes[c][2];
        int32_t* tok = xmalloc(sizeof(int32_t) * N);
        for (int n = 0; n < N; n++) tok[n] = (int)(rng_u64(&g_rng) % V);
        tok[N - 1] = tok[0];  // a repeat for the backward
        float* table = act_in(m, randn((size_t)V * H, 1.f), (size_t)V * H);
        float* ref = xmalloc(sizeof(float) * N * H);
        g_cpu->embed_fwd(g_cpu, ref, table, tok, N, H);
        int32_t* dtok = up_i32(be, tok, N);
        void* out = poison_act(be, (size_t)N * H);
        be->embed_fwd(be, out, up_act(be, table, (size_t)V * H), dtok, N, H);
        cmp(m, "embed_fwd", down_act(be, out, (size_t)N * H), ref, (size_t)N * H, 0);

        free(tok), free(table), free(ref);
        dev_free_all();
    }
}


// Token patterns for embed_bwd (the runs of equal tokens are what its kernel is organized by).
enum { TOK_UNIFORM, TOK_ZIPF, TOK_SAME, TOK_RUNS };

// RUNS: run lengths at the kernel's edges, token v taking cnt[v] positions (then shuffled): the
// longest short run (31) at sorted position 0, a long one (32) starting at lane 31 of the first
// 32-position group, a 31 starting at lane 31 of the next, 33 / 63 / 64 / 65 (batches of 64), a
// one-token run at the last position of the first 1024-position range (1023), a long run at the
// first position of the next (1024), and one of 2000 across the next range boundary.
static int runs_tokens(int32_t* tok, int V) {
    CHECK(V >= 20, "runs_tokens: V %d < 20", V);
    int cnt[64] = {31, 32, 31, 1, 40, 31, 32, 33, 63, 64, 65, 1, 2, 3}, nc = 14, s = 0;
    for (int i = 0; i < nc; i++) s += cnt[i];
    cnt[nc++] = 1023 - s;  // ends at sorted position 1022
    cnt[nc++] = 1;         // 1023
    cnt[nc++] = 40;        // 1024 .. 1063
    cnt[nc++] = 2000;      // 1064 .. 3063
    cnt[nc++] = 5;
    cnt[nc++] = 128;
    while (nc < V && nc < 64) cnt[nc++] = (int)(rng_u64(&g_rng) % 40);
    int N = 0;
    for (int v = 0; v < nc; v++)
        for (int j = 0; j < cnt[v] && N < 4096; j++) tok[N++] = v;
    for (int i = N - 1; i > 0; i--) {  // shuffle the positions
        const int j = (int)(rng_u64(&g_rng) % (uint64_t)(i + 1)), t = tok[i];
        tok[i] = tok[j], tok[j] = t;
    }
    return N;
}

// Fills tok (room for max(N, 4096) entries) and returns the number of tokens.
static int make_tokens(int32_t* tok, int pattern, int V, int N) {
    if (pattern == TOK_RUNS) return runs_tokens(tok, V);
    if (pattern == TOK_SAME) {
        for (int n = 0; n < N; n++) tok[n] = V - 1;
        return N;
    }
    if (pattern == TOK_UNIFORM) {
        for (int n = 0; n < N; n++) tok[n] = (int)(rng_u64(&g_rng) % V);
        if (N > 1) tok[N - 1] = tok[0];  // at least one repeat
        return N;
    }
    // ZIPF: P(rank k) ∝ 1 / (k + 1), ranks scattered over the ids (runs of every length)
    double* cdf = xmalloc(sizeof(double) * V);
    double z = 0;
    for (int k = 0; k < V; k++) cdf[k] = z += 1.0 / (k + 1);
    for (int n = 0; n < N; n++) {
        const double u = rng_uniform(&g_rng) * z;
        int lo = 0, hi = V - 1;
        while (lo < hi) {
            const int mid = (lo + hi) / 2;
            if (cdf[mid] > u) hi = mid;
            else lo = mid + 1;
        }
        tok[n] = (int)(((long long)lo * 7919 + 13) % V);
    }
    free(cdf);
    return N;
}

// embed_bwd against the CPU, bit for bit (the same fp32 additions in the same order: n ascending
// per element, from the existing dtable value), in fp32 and bf16, for every vector width the
// kernel picks (bf16: 8 / 4 / 2 / 1 columns per thread by H % 8, 4, 2 and pointer alignment; fp32:
// 4 / 2 / 1), N not a multiple of 32 or 256, and runs of repeated tokens of every length the
// kernel treats differently (short < 32 ≤ long, batches of 64, 32-position groups, 1024-position
// ranges), including all tokens equal.
static void test_embed_bwd(void) {
    static const struct { int V, H, N, pattern, dout_off, dt_off; const char* what; } cs[] = {
        {50, 72, 61, TOK_UNIFORM, 0, 0, "uniform, H 72"},
        {13, 37, 40, TOK_UNIFORM, 0, 0, "uniform, H 37 (scalar)"},
        {5, 72, 1, TOK_UNIFORM, 0, 0, "one token"},
        {1000, 4096, 300, TOK_ZIPF, 0, 0, "zipf, H 4096"},
        {1000, 4096, 777, TOK_SAME, 0, 0, "all equal, H 4096"},
        {7, 38, 1000, TOK_SAME, 0, 0, "all equal, H 38 (2 per thread)"},
        {3000, 200, 5003, TOK_ZIPF, 0, 0, "zipf, H 200, 5 ranges"},
        {40, 36, 0, TOK_RUNS, 0, 0, "edge runs, H 36 (4 per thread)"},
        {40, 37, 0, TOK_RUNS, 0, 0, "edge runs, H 37 (scalar)"},
        {40, 72, 0, TOK_RUNS, 0, 0, "edge runs, H 72"},
        {40, 72, 0, TOK_RUNS, 1, 0, "edge runs, dout misaligned (scalar)"},
        {64, 72, 300, TOK_ZIPF, 0, 1, "zipf, dtable misaligned (scalar)"},
        {1000, 4096, 300, TOK_ZIPF, 1, 0, "zipf, H 4096, dout misaligned (scalar)"},
    };
    FOR_MODES for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        Backend* be = m->gpu;
        const int V = cs[c].V, H = cs[c].H;
        int32_t* tok = xmalloc(sizeof(int32_t) * (cs[c].N > 4096 ? cs[c].N : 4096));
        const int N = make_tokens(tok, cs[c].pattern, V, cs[c].N);
        const size_t nd = (size_t)N * H, nt = (size_t)V * H;
        const int od = cs[c].dout_off, ot = cs[c].dt_off;  // element offsets of the device pointers
        float* dout = act_in(m, randn(nd + od, 1.f), nd + od);
        float* dt = randn(nt + ot, 0.1f);
        char* ddout = (char*)up_act(be, dout, nd + od) + (size_t)od * dtype_size(be->act_dtype);
        float* ddt = up_f32(be, dt, nt + ot) + ot;
        g_cpu->embed_bwd(g_cpu, dt + ot, dout + od, tok, N, H, V);
        be->embed_bwd(be, ddt, ddout, up_i32(be, tok, N), N, H, V);
        cmp_exact(m, "embed_bwd (bits)", cs[c].what, down_f32(be, ddt, nt), dt + ot, nt);
        free(tok), free(dout), free(dt);
        dev_free_all();
    }
}

static void test_rmsnorm(void) {
    // N, H: 300 rows give several dw partials; 4099 takes the scalar kernels; in bf16, 200, 4096
    // (Mixtral's hidden) and 6144 take the vectorized ones with 1, 2 and 4 chunks per thread
    const int shapes[][2] = {{300, 200}, {7, 4099}, {130, 4096}, {9, 6144}};
    FOR_MODES for (int c = 0; c < 4; c++) {
        Backend* be = m->gpu;
        const int N = shapes[c][0], H = shapes[c][1];
        const size_t nh = (size_t)N * H;
        const float eps = 1e-5f;
        float* x = act_in(m, randn(nh, 2.f), nh);
        float* w = act_in(m, randu(H, 0.5f, 1.5f), H);
        float *y = xmalloc(4 * nh), *rs = xmalloc(4 * N);
        g_cpu->rmsnorm_fwd(g_cpu, y, rs, x, w, N, H, eps);
        void *dx_ = up_act(be, x, nh), *dw_ = up_act(be, w, H);
        void* dy_ = poison_act(be, nh);
        float* drs = poison(be, 4 * N);
        be->rmsnorm_fwd(be, dy_, drs, dx_, dw_, N, H, eps);
        cmp(m, "rmsnorm_fwd y", down_act(be, dy_, nh), y, nh, TOL(TOL_F32, TOL_BF16_OUT));
        cmp(m, "rmsnorm_fwd rstd", down_f32(be, drs, N), rs, N, TOL(TOL_F32, TOL_FP32_OUT));

        // backward from the CPU's rstd (fp32 on both sides)
        float* g = act_in(m, randn(nh, 1.f), nh);
        void* dg = up_act(be, g, nh);
        float* drs_ref = up_f32(be, rs, N);
        for (int acc = 0; acc < 2; acc++) {
            float* dxr = acc ? act_in(m, randn(nh, 1.f), nh) : xmalloc(4 * nh);
            float* dwr = randn(H, 0.5f);
            void* ddx = acc ? up_act(be, dxr, nh) : poison_act(be, nh);
            float* ddw = up_f32(be, dwr, H);
            float* ddw2 = up_f32(be, dwr, H);
            g_cpu->rmsnorm_bwd(g_cpu, dxr, dwr, g, x, w, rs, N, H, acc);
            be->rmsnorm_bwd(be, ddx, ddw, dg, dx_, dw_, drs_ref, N, H, acc);
            cmp(m, acc ? "rmsnorm_bwd dx (+=)" : "rmsnorm_bwd dx", down_act(be, ddx, nh), dxr, nh,
                TOL(TOL_F32, TOL_BF16_OUT));
            cmp(m, "rmsnorm_bwd dw", down_f32(be, ddw, H), dwr, H, TOL(TOL_F32, TOL_FP32_OUT));
            // the same call again from the same dw: bit-identical (no atomics)
            be->rmsnorm_bwd(be, poison_act(be, nh), ddw2, dg, dx_, dw_, drs_ref, N, H, 0);
            cmp_bits(m, "rmsnorm_bwd dw deterministic", down_f32(be, ddw, H), down_f32(be, ddw2, H), H);
            free(dxr), free(dwr);
        }
        // dx may alias dy
        float* dxr = xmalloc(4 * nh);
        float* dwr = randn(H, 0.5f);
        g_cpu->rmsnorm_bwd(g_cpu, dxr, dwr, g, x, w, rs, N, H, 0);
        void* alias = up_act(be, g, nh);
        be->rmsnorm_bwd(be, alias, up_f32(be, dwr, H), alias, dx_, dw_, drs_ref, N, H, 0);
        cmp(m, "rmsnorm_bwd dx aliasing dy", down_act(be, alias, nh), dxr, nh, TOL(TOL_F32, TOL_BF16_OUT));
        free(x), free(w), free(y), free(rs), free(g), free(dxr), free(dwr);
        dev_free_all();
    }
}

static void test_rope(void) {
    // the fused projection's rows (Hq + 2·Hkv heads) against planar q, k, v, both directions;
    // bf16: D = 16, 128, 64 take the 8-pair kernel, D = 12 the scalar one; Hkv = 0: q alone
    const struct { int B, T, Hq, Hkv, D; float theta; } cs[] = {
        {2, 300, 3, 1, 16, 1e6f}, {1, 70, 4, 2, 128, 1e4f}, {1, 2000, 1, 0, 64, 1e6f}, {2, 50, 2, 1, 12, 1e4f}};
    FOR_MODES for (int c = 0; c < 4; c++) {
        Backend* be = m->gpu;
        const int B = cs[c].B, T = cs[c].T, Hq = cs[c].Hq, Hkv = cs[c].Hkv, D = cs[c].D;
        const size_t rows = (size_t)B * T, nq = rows * Hq * D, nk = rows * Hkv * D, n = nq + 2 * nk;
        for (int inv = 0; inv < 2; inv++) {
            // the side read, rounded to the act dtype; the side written poisoned on the device
            float* pk = act_in(m, randn(n, 1.f), n);
            float *q = act_in(m, randn(nq, 1.f), nq), *k = nk ? act_in(m, randn(nk, 1.f), nk) : NULL;
            float* v = nk ? act_in(m, randn(nk, 1.f), nk) : NULL;
            void* dpk = inv ? poison_act(be, n) : up_act(be, pk, n);
            void* dq = inv ? up_act(be, q, nq) : poison_act(be, nq);
            void* dk = nk ? (inv ? up_act(be, k, nk) : poison_act(be, nk)) : NULL;
            void* dv = nk ? (inv ? up_act(be, v, nk) : poison_act(be, nk)) : NULL;
            g_cpu->rope_qkv(g_cpu, pk, q, k, v, B, T, Hq, Hkv, D, cs[c].theta, inv);
            be->rope_qkv(be, dpk, dq, dk, dv, B, T, Hq, Hkv, D, cs[c].theta, inv);
            if (inv) {
                cmp(m, "rope_qkv inverse (packed rows)", down_act(be, dpk, n), pk, n, TOL(TOL_F32, TOL_BF16_OUT));
            } else {
                cmp(m, "rope_qkv q", down_act(be, dq, nq), q, nq, TOL(TOL_F32, TOL_BF16_OUT));
                if (nk) cmp(m, "rope_qkv k", down_act(be, dk, nk), k, nk, TOL(TOL_F32, TOL_BF16_OUT));
                if (nk) cmp(m, "rope_qkv v (copied)", down_act(be, dv, nk), v, nk, 0);
            }
            free(pk), free(q), free(k), free(v);
        }
        dev_free_all();
    }
}

// ---- SwiGLU --------------------------------------------------------------------------------

static void test_swiglu(void) {
    // n, F; F % 8 == 0 takes the vectorised bf16 forward kernel
    const int shapes[][2] = {{33, 100}, {5, 1031}, {70, 256}, {9, 4800}};  // 4800: 600 chunks, 2.3 rounds of 256
    FOR_MODES for (int c = 0; c < 4; c++) {
        Backend* be = m->gpu;
        const int n = shapes[c][0], F = shapes[c][1];
        const size_t nf = (size_t)n * F;
        float* gu = act_in(m, randn(2 * nf, 2.f), 2 * nf);
        float* sc = randu(n, 0.1f, 1.f);
        void* dgu = up_act(be, gu, 2 * nf);
        float* dsc = up_f32(be, sc, n);
        for (int use = 0; use < 2; use++) {
            float* h = xmalloc(4 * nf);
            g_cpu->swiglu_fwd(g_cpu, h, gu, use ? sc : NULL, n, F);
            void* dh = poison_act(be, nf);
            be->swiglu_fwd(be, dh, dgu, use ? dsc : NULL, n, F);
            cmp(m, use ? "swiglu_fwd scaled" : "swiglu_fwd", down_act(be, dh, nf), h, nf, TOL(TOL_F32, TOL_BF16_OUT));
            free(h);
        }
        float* g = act_in(m, randn(nf, 1.f), nf);
        void* dg = up_act(be, g, nf);
        float *rgu = xmalloc(8 * nf), *rds = xmalloc(4 * n);
        g_cpu->swiglu_bwd(g_cpu, rgu, rds, g, gu, sc, n, F);
        void* out = poison_act(be, 2 * nf);
        float* ods = poison(be, 4 * n);
        be->swiglu_bwd(be, out, ods, dg, dgu, dsc, n, F);
        cmp(m, "swiglu_bwd dgu", down_act(be, out, 2 * nf), rgu, 2 * nf, TOL(TOL_F32, TOL_BF16_OUT));
        cmp(m, "swiglu_bwd dscale", down_f32(be, ods, n), rds, n, TOL(TOL_F32, TOL_FP32_OUT));
        // no scale, no dscale, dgu aliasing gu
        g_cpu->swiglu_bwd(g_cpu, rgu, NULL, g, gu, NULL, n, F);
        void* alias = up_act(be, gu, 2 * nf);
        be->swiglu_bwd(be, alias, NULL, dg, alias, NULL, n, F);
        cmp(m, "swiglu_bwd in place, unscaled", down_act(be, alias, 2 * nf), rgu, 2 * nf, TOL(TOL_F32, TOL_BF16_OUT));
        free(gu), free(sc), free(g), free(rgu), free(rds);
        dev_free_all();
    }
}

// ---- router ----------------------------------------------------------------------------------

static void test_router(void) {
    const int shapes[][3] = {{300, 8, 2}, {129, 40, 3}, {64, 200, 8}};  // N, E, k
    FOR_MODES for (int c = 0; c < 3; c++) {
        Backend* be = m->gpu;
        const int N = shapes[c][0], E = shapes[c][1], k = shapes[c][2];
        const size_t ne = (size_t)N * E, nk = (size_t)N * k;
        float* lg = randn(ne, 2.f);
        float *p = xmalloc(4 * ne), *w = xmalloc(4 * nk);
        int32_t* idx = xmalloc(4 * nk);
        float* st = randu(2 * E, 1.f, 3.f);
        for (int e = 0; e < E; e++) st[e] = (float)(e % 5);  // counts part: integers
        float z = 2.f;
        float* dst = up_f32(be, st, 2 * E);
        float* dz = up_f32(be, &z, 1);
        g_cpu->router_fwd(g_cpu, p, idx, w, st, &z, lg, N, E, k);
        float* dl = up_f32(be, lg, ne);
        float *dp = poison(be, 4 * ne), *dw = poison(be, 4 * nk);
        int32_t* di = poison(be, 4 * nk);
        be->router_fwd(be, dp, di, dw, dst, dz, dl, N, E, k);
        cmp(m, "router_fwd probs", down_f32(be, dp, ne), p, ne, TOL_F32);
        cmp_i32(m, "router_fwd topk_idx", down_i32(be, di, nk), idx, nk);
        cmp(m, "router_fwd topk_w", down_f32(be, dw, nk), w, nk, TOL_F32);
        cmp(m, "router_fwd stats", down_f32(be, dst, 2 * E), st, 2 * E, TOL_F32);
        cmp(m, "router_fwd zsum", down_f32(be, dz, 1), &z, 1, TOL_F32);

        // backward from the CPU's forward outputs
        float* dtw = randn(nk, 1.f);
        float* aux = randn(E, 0.1f);
        float* rdl = xmalloc(4 * ne);
        float *d_p = up_f32(be, p, ne), *d_w = up_f32(be, w, nk), *d_dtw = up_f32(be, dtw, nk);
        float* d_aux = up_f32(be, aux, E);
        int32_t* d_i = up_i32(be, idx, nk);
        const struct { int tw, ax; float zg; const char* label; } v[] = {
            {1, 1, 0.01f, "router_bwd all"}, {0, 1, 0.01f, "router_bwd aux+z"}, {1, 0, 0.f, "router_bwd topk only"}};
        for (int j = 0; j < 3; j++) {
            g_cpu->router_bwd(g_cpu, rdl, v[j].tw ? dtw : NULL, v[j].ax ? aux : NULL, v[j].zg, p, idx, w, lg, N, E, k);
            float* out = poison(be, 4 * ne);
            be->router_bwd(be, out, v[j].tw ? d_dtw : NULL, v[j].ax ? d_aux : NULL, v[j].zg, d_p, d_i, d_w, dl, N, E,
                           k);
            cmp(m, v[j].label, down_f32(be, out, ne), rdl, ne, TOL_F32);
        }
        free(lg), free(p), free(w), free(idx), free(st), free(dtw), free(aux), free(rdl);
        dev_free_all();
    }
}

// ---- expert-major index and permutations -----------------------------------------------------

// Random top-k rows: k distinct experts per token, never `skip` (an expert with no rows).
static int32_t* random_topk(int N, int k, int E, int skip) {
    int32_t* t = xmalloc(sizeof(int32_t) * (size_t)N * k);
    for (int n = 0; n < N; n++)
        for (int s = 0; s < k; s++) {
            int e, dup;
            do {
                e = (int)(rng_u64(&g_rng) % E);
                dup = e == skip;
                for (int j = 0; j < s; j++) dup |= t[(size_t)n * k + j] == e;
            } while (dup);
            t[(size_t)n * k + s] = e;
        }
    return t;
}

static void test_moe_index(void) {
    const int shapes[][4] = {{1000, 2, 8, 5}, {3000, 2, 8, -1}, {77, 1, 3, 0}, {700, 4, 64, 63}};  // N, k, E, skip
    FOR_MODES for (int c = 0; c < 4; c++) {
        Backend* be = m->gpu;
        const int N = shapes[c][0], k = shapes[c][1], E = shapes[c][2];
        const size_t nk = (size_t)N * k;
        int32_t* t = random_topk(N, k, E, shapes[c][3]);
        int32_t *cnt = xmalloc(4 * E), *dest = xmalloc(4 * nk);
        g_cpu->moe_index(g_cpu, cnt, dest, t, N, k, E);
        int32_t *dc = poison(be, 4 * E), *dd = poison(be, 4 * nk);
        be->moe_index(be, dc, dd, up_i32(be, t, nk), N, k, E);
        cmp_i32(m, "moe_index counts", down_i32(be, dc, E), cnt, E);
        cmp_i32(m, "moe_index dest", down_i32(be, dd, nk), dest, nk);
        free(t), free(cnt), free(dest);
        dev_free_all();
    }
}

static void test_permute(void) {
    const int shapes[][4] = {{57, 2, 4, 72}, {31, 3, 5, 37}};  // N, k, E, H
    FOR_MODES for (int c = 0; c < 2; c++) {
        Backend* be = m->gpu;
        const int N = shapes[c][0], k = shapes[c][1], E = shapes[c][2], H = shapes[c][3];
        const size_t nk = (size_t)N * k, nh = (size_t)N * H, nkh = nk * H;
        int32_t* t = random_topk(N, k, E, 1);
        int32_t *cnt = xmalloc(4 * E), *dest = xmalloc(4 * nk);
        g_cpu->moe_index(g_cpu, cnt, dest, t, N, k, E);
        int32_t* dd = up_i32(be, dest, nk);
        float* x = act_in(m, randn(nh, 1.f), nh);
        float* xp = act_in(m, randn(nkh, 1.f), nkh);
        void *d_x = up_act(be, x, nh), *d_xp = up_act(be, xp, nkh);
        float *r_nkh = xmalloc(4 * nkh), *r_nh = xmalloc(4 * nh);

        g_cpu->permute_fwd(g_cpu, r_nkh, x, dest, N, k, H);
        void* o = poison_act(be, nkh);
        be->permute_fwd(be, o, d_x, dd, N, k, H);
        cmp(m, "permute_fwd", down_act(be, o, nkh), r_nkh, nkh, 0);

        g_cpu->permute_bwd(g_cpu, r_nh, xp, dest, N, k, H);
        o = poison_act(be, nh);
        be->permute_bwd(be, o, d_xp, dd, N, k, H);
        cmp(m, "permute_bwd", down_act(be, o, nh), r_nh, nh, TOL(TOL_F32, TOL_BF16_SUM));

        for (int acc = 0; acc < 3; acc++) {  // no add, add = out (+=), a separate add (the residual)
            float* base = act_in(m, randn(nh, 1.f), nh);
            memcpy(r_nh, base, 4 * nh);
            g_cpu->unpermute_fwd(g_cpu, r_nh, xp, dest, N, k, H, acc ? r_nh : NULL);
            o = acc == 1 ? up_act(be, base, nh) : poison_act(be, nh);
            be->unpermute_fwd(be, o, d_xp, dd, N, k, H, acc == 0 ? NULL : acc == 1 ? o : up_act(be, base, nh));
            cmp(m, acc == 0 ? "unpermute_fwd" : acc == 1 ? "unpermute_fwd (add = out)" : "unpermute_fwd (add)",
                down_act(be, o, nh), r_nh, nh, TOL(TOL_F32, TOL_BF16_SUM));
            free(base);
        }

        g_cpu->unpermute_bwd(g_cpu, r_nkh, x, dest, N, k, H);
        o = poison_act(be, nkh);
        be->unpermute_bwd(be, o, d_x, dd, N, k, H);
        cmp(m, "unpermute_bwd", down_act(be, o, nkh), r_nkh, nkh, 0);

        float* wv = randn(nk, 1.f);
        float* rw = xmalloc(4 * nk);
        float* dwv = up_f32(be, wv, nk);
        g_cpu->gather_rows_f32(g_cpu, rw, wv, dest, (int)nk);
        float* ow = poison(be, 4 * nk);
        be->gather_rows_f32(be, ow, dwv, dd, (int)nk);
        cmp(m, "gather_rows_f32", down_f32(be, ow, nk), rw, nk, 0);
        g_cpu->scatter_rows_f32(g_cpu, rw, wv, dest, (int)nk);
        ow = poison(be, 4 * nk);
        be->scatter_rows_f32(be, ow, dwv, dd, (int)nk);
        cmp(m, "scatter_rows_f32", down_f32(be, ow, nk), rw, nk, 0);
        free(t), free(cnt), free(dest), free(x), free(xp), free(r_nkh), free(r_nh), free(wv), free(rw);
        dev_free_all();
    }
}

// ---- loss and optimizer ------------------------------------------------------------------------

static void test_cross_entropy(void) {
    // n, V: in bf16, 32000 (Mixtral) takes the packed kernel (8 chunks per thread, two exponentials
    // each; 301 rows: more rows than SMs, ignored rows inside), 64 (a DNA-sized vocabulary) the
    // register-resident one with 1 chunk, 997 the scalar one
    const int shapes[][2] = {{20, 32000}, {301, 32000}, {7, 997}, {6, 64}};
    FOR_MODES for (int c = 0; c < 4; c++) {
        Backend* be = m->gpu;
        const int n = shapes[c][0], V = shapes[c][1];
        const size_t nv = (size_t)n * V;
        int32_t* tg = xmalloc(4 * n);
        for (int i = 0; i < n; i++) tg[i] = (int)(rng_u64(&g_rng) % V);
        tg[1] = -1;
        tg[n - 1] = -1;  // ignored rows
        if (n > 200) tg[133] = tg[200] = -1;
        float* lg = act_in(m, randn(nv, 3.f), nv);
        int32_t* dt = up_i32(be, tg, n);
        for (int grad = 0; grad < 2; grad++) {
            const float gs = grad ? 1.0f / (n - 2) : 0.f;
            float* r = dupf(lg, nv);
            float loss = 0.5f;
            g_cpu->cross_entropy(g_cpu, r, &loss, tg, n, V, gs);
            void* d = up_act(be, lg, nv);
            const float init = 0.5f;
            float* dl = up_f32(be, &init, 1);
            be->cross_entropy(be, d, dl, dt, n, V, gs);
            cmp(m, grad ? "cross_entropy loss" : "cross_entropy loss (no grad)", down_f32(be, dl, 1), &loss, 1,
                TOL(TOL_F32, TOL_FP32_OUT));
            if (grad) cmp(m, "cross_entropy dlogits", down_act(be, d, nv), r, nv, TOL(TOL_F32, TOL_BF16_OUT));
            else cmp(m, "cross_entropy logits untouched", down_act(be, d, nv), lg, nv, 0);
            free(r);
        }
        free(tg), free(lg);
        dev_free_all();
    }
}

int main(void) {
    if (gpu_setup("test_cuda_ops")) return 1;
    RUN(test_memory);
    RUN(test_casts);
    RUN(test_embed);
    RUN(test_embed_bwd);
    RUN(test_rmsnorm);
    RUN(test_rope);
    RUN(test_swiglu);
    RUN(test_router);
    RUN(test_moe_index);
    RUN(test_permute);
    RUN(test_cross_entropy);
    gpu_teardown();
    TEST_END();
}
