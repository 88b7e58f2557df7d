// test_cuda_norm.c — cuda/cuda_norm.cu against the CPU backend (the spec), in fp32 and bf16
// modes: embed_fwd, embed_bwd (bit for bit, every run length and vector width), RMSNorm forward
// and backward.
// Outputs are poisoned (0xFF bytes) first; errors are relative L2 (test.h rel_l2). The table of
// the worst error per check is printed at the end. Needs a GPU: without one it fails (`make test`
// also runs it on the CPU, built against tests/host_cuda).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"
#include "op_cases.h"  // EMBED_CASES, RMSNORM_CASES: the GPU rows run here

// ---- embedding, RMSNorm -----------------------------------------------------------------------

static void test_embed(void) {
    FOR_MODES for (int c = 0; c < N_CASES(EMBED_CASES); c++) {
        Backend* be = m->gpu;
        const EmbedCase* ec = &EMBED_CASES[c];
        if (!(ec->where & CASE_GPU)) continue;
        const int V = ec->V, H = ec->H, N = ec->N;
        int32_t* tok = xmalloc(sizeof(int32_t) * N);
        for (int n = 0; n < N; n++) tok[n] = (int)(rng_u64(&g_rng) % V);
        tok[N - 1] = tok[0];  // a repeat for the backward
        float* table = randn_act(m, (size_t)V * H, 1.f);
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
        float* dout = randn_act(m, nd + od, 1.f);
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
    // the GPU rows of RMSNORM_CASES: 300 rows give several dw partials; H = 4099 takes the scalar
    // kernels; in bf16, 200, 4096 (Mixtral's hidden) and 6144 take the vectorized ones with 1, 2
    // and 4 chunks per thread
    FOR_MODES for (int c = 0; c < N_CASES(RMSNORM_CASES); c++) {
        Backend* be = m->gpu;
        if (!(RMSNORM_CASES[c].where & CASE_GPU)) continue;
        const int N = RMSNORM_CASES[c].N, H = RMSNORM_CASES[c].H;
        const size_t nh = (size_t)N * H;
        const float eps = 1e-5f;
        float* x = randn_act(m, nh, 2.f);
        float* w = randu_act(m, H, 0.5f, 1.5f);
        float *y = xmalloc(4 * nh), *rs = xmalloc(4 * N);
        g_cpu->rmsnorm_fwd(g_cpu, y, rs, x, w, N, H, eps);
        void *dx_ = up_act(be, x, nh), *dw_ = up_act(be, w, H);
        void* dy_ = poison_act(be, nh);
        float* drs = poison(be, 4 * N);
        be->rmsnorm_fwd(be, dy_, drs, dx_, dw_, N, H, eps);
        cmp(m, "rmsnorm_fwd y", down_act(be, dy_, nh), y, nh, TOL(TOL_F32, TOL_BF16_OUT));
        cmp(m, "rmsnorm_fwd rstd", down_f32(be, drs, N), rs, N, TOL(TOL_F32, TOL_FP32_OUT));

        // backward from the CPU's rstd (fp32 on both sides)
        float* g = randn_act(m, nh, 1.f);
        void* dg = up_act(be, g, nh);
        float* drs_ref = up_f32(be, rs, N);
        for (int acc = 0; acc < 2; acc++) {
            float* dxr = acc ? randn_act(m, nh, 1.f) : xmalloc(4 * nh);
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

int main(void) {
    if (gpu_setup("test_cuda_norm")) return 1;
    RUN(test_embed);
    RUN(test_embed_bwd);
    RUN(test_rmsnorm);
    gpu_teardown();
    TEST_END();
}
