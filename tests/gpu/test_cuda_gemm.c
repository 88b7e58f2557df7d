// test_cuda_gemm.c — the CUDA backend's GEMMs (cuda/cuda_gemm.cu: cuBLASLt) against the CPU
// backend, in fp32 and bf16 modes: every transpose, strides, beta, fp32 outputs, a separate
// addend (c_in), grouped with empty groups, grouped weight gradients, the row keying of the
// expert GEMMs' plans, and the Hopper tile table. Tolerances: gpu_check.h.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"
#include "op_cases.h"  // GEMM_CASES: the GPU rows run here

// The [rows, cols] block of a matrix with row stride ld.
static float* block_of(const float* x, int rows, int cols, int ld) {
    float* y = xmalloc(sizeof(float) * ((size_t)rows * cols + 1));
    for (int r = 0; r < rows; r++) memcpy(y + (size_t)r * cols, x + (size_t)r * ld, sizeof(float) * cols);
    return y;
}

int cuda_gemm_plan_tile(Backend* be, const GemmDesc* d, int dyn);
int cuda_compute_capability(Backend* be);  // cuda_backend.cu: the major version

// C [M, N] = A [M, K] · B (Bᵀ with trans_b) on random bf16 operands, through be->gemm_grouped with
// one group (grouped) or be->gemm; its first 16 rows against the CPU.
static void pref_product(const Mode* m, const char* label, const GemmDesc* d, int grouped) {
    Backend* be = m->gpu;
    const size_t na = (size_t)d->M * d->K, nb = (size_t)d->N * d->K, nr = (size_t)1 << 20;
    float* r = randn(nr, 1.f);
    void *A = rand_act(be, r, nr, na), *B = rand_act(be, r + 3, nr - 3, nb), *C = poison_act(be, (size_t)d->M * d->N);
    if (grouped) {
        int off[2] = {0, d->M};
        GroupDesc g1 = {.groups = 1, .host_off = off};
        be->gemm_grouped(be, d, &g1, A, B, C);
    } else {
        be->gemm(be, d, A, B, C);
    }
    float *Ah = down_act(be, A, (size_t)16 * d->K), *Bh = down_act(be, B, nb), *ref = xmalloc(4 * (size_t)16 * d->N);
    GemmDesc sub = *d;
    sub.M = 16;
    g_cpu->gemm(g_cpu, &sub, Ah, Bh, ref);
    cmp(m, label, down_act(be, C, (size_t)16 * d->N), ref, (size_t)16 * d->N, TOL_BF16_OUT);
    free(Ah), free(Bh), free(ref), free(r);
}

// The tile preferences of cuda_gemm.cu (bf16 on compute capability 9.0): Mixtral-8x7B's expert
// plans at 8,192 and 9,192 rows per expert (keyed at 8,192 and 9,216, as the grouped GEMMs key them) and its
// attention projections at 32,768 rows use the table's tiles, and two such GEMMs are right (the
// forward layout, and the data-gradient layout with B as stored): their first 16 rows against the
// CPU. A cuBLASLt whose candidates no longer hold the table's tiles fails here: the table is then
// stale. (gpu.gemm_tiles = tuned, the default.)
static void test_gemm_tile_pref(void) {
    const Mode* m = &g_modes[1];
    Backend* be = m->gpu;
    if (cuda_compute_capability(be) != 9) {  // the table applies on Hopper
        printf("skip test_gemm_tile_pref: not Hopper\n");
        return;
    }
    const int F2 = 28672, H = 4096, R = 8192;
    GemmDesc fwd = {.M = R, .N = F2, .K = H, .trans_b = 1, .alpha = 1};
    GemmDesc wgr = {.M = F2, .N = H, .K = R, .trans_a = 1, .alpha = 1};
    const struct { const char* name; GemmDesc d; int dyn, tile; } plans[] = {
        {"w13 forward", fwd, 1, 201},
        {"w13 weight gradient", wgr, 2, 29},
        {"o forward", {.M = 4 * R, .N = H, .K = H, .trans_b = 1, .alpha = 1}, 0, 29},
        {"o data gradient", {.M = 4 * R, .N = H, .K = H, .alpha = 1}, 0, 29},
    };
    for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++)
        for (int twice = 0; twice < 1 + (plans[i].dyn != 0); twice++) {  // a dynamic dim: 8,192 and 9,192
            GemmDesc d = plans[i].d;
            if (twice && plans[i].dyn == 1) d.M = R + 1000;
            if (twice && plans[i].dyn == 2) d.K = R + 1000;
            const int t = cuda_gemm_plan_tile(be, &d, plans[i].dyn);
            EXPECT(t == plans[i].tile, "%s plan (M %d N %d K %d): tile %d, the table's is %d", plans[i].name, d.M, d.N, d.K,
                   t, plans[i].tile);
        }
    // a product through a preferred plan of each layout: the w13 forward as an expert GEMM (one
    // group, the plan keyed by rounded rows) and the o data gradient (B as stored)
    pref_product(m, "gemm w13 forward, preferred tile (16 rows)", &fwd, 1);
    const GemmDesc qo = {.M = 4 * R, .N = H, .K = H, .alpha = 1};
    pref_product(m, "gemm o data gradient, preferred tile (16 rows)", &qo, 0);
    dev_free_all();
}

static void test_gemm(void) {
    FOR_MODES for (int c = 0; c < N_CASES(GEMM_CASES); c++) {
        Backend* be = m->gpu;
        const GemmOpCase g = GEMM_CASES[c];
        if (!(g.where & CASE_GPU)) continue;
        const int ar = g.ta ? g.K : g.M, ac = g.ta ? g.M : g.K, br = g.tb ? g.N : g.K, bc = g.tb ? g.K : g.N;
        const int lda = g.lda ? g.lda : ac, ldb = g.ldb ? g.ldb : bc, ldc = g.ldc ? g.ldc : g.N;
        const size_t na = (size_t)ar * lda, nb = (size_t)br * ldb, ncc = (size_t)g.M * ldc;
        const int cf = g.c_f32 || !m->bf16;  // C is fp32
        float* A = randn_act(m, na, 1.f);
        float* B = randn_act(m, nb, 1.f);
        float* C0 = randn(ncc, 1.f);
        if (!cf) {
            float* t = act_in(m, C0, ncc);
            free(C0);
            C0 = t;
        }
        float* C = dupf(C0, ncc);
        GemmDesc d = {.M = g.M, .N = g.N, .K = g.K, .trans_a = g.ta, .trans_b = g.tb, .lda = g.lda, .ldb = g.ldb,
                      .ldc = g.ldc, .alpha = g.alpha, .beta = g.beta, .c_f32 = g.c_f32};
        g_cpu->gemm(g_cpu, &d, A, B, C);
        void* dC;
        if (g.beta == 0.f || g.cin) dC = cf ? poison(be, 4 * ncc) : poison_act(be, ncc);  // not read
        else dC = cf ? (void*)up_f32(be, C0, ncc) : up_act(be, C0, ncc);
        if (g.cin) d.c_in = cf ? (void*)up_f32(be, C0, ncc) : up_act(be, C0, ncc);
        be->gemm(be, &d, up_act(be, A, na), up_act(be, B, nb), dC);
        float* got = cf ? down_f32(be, dC, ncc) : down_act(be, dC, ncc);
        char label[64];
        snprintf(label, sizeof label, "gemm %dx%dx%d t%d%d%s%s%s", g.M, g.N, g.K, g.ta, g.tb, g.beta != 0 ? " beta" : "",
                 g.c_f32 ? " c_f32" : "", g.cin ? " c_in" : "");
        float *gb = block_of(got, g.M, g.N, ldc), *rb = block_of(C, g.M, g.N, ldc);
        cmp(m, label, gb, rb, (size_t)g.M * g.N, m->bf16 ? (g.c_f32 ? TOL_FP32_OUT : TOL_BF16_SUM) : TOL_F32);
        free(rb), free(got), free(A), free(B), free(C0), free(C);
        dev_free_all();
    }
}

static void test_gemm_grouped(void) {
    const int offs[][5] = {{0, 13, 13, 40, 57}, {0, 0, 21, 33, 33}};  // empty groups inside and at the ends
    const int G = 4, N = 48, K = 40;
    FOR_MODES for (int c = 0; c < 2; c++) for (int tb = 0; tb < 2; tb++) {
        Backend* be = m->gpu;
        const int* off = offs[c];
        const int R = off[G];
        const size_t na = (size_t)R * K, nb = (size_t)G * N * K, ncc = (size_t)R * N;
        float* A = randn_act(m, na, 1.f);
        float* B = randn_act(m, nb, 1.f);
        float* C = xmalloc(4 * ncc);
        GemmDesc d = {.N = N, .K = K, .trans_b = tb, .alpha = 1, .beta = 0};
        GroupDesc gd = {.groups = G, .host_off = off, .b_stride = (size_t)N * K};
        g_cpu->gemm_grouped(g_cpu, &d, &gd, A, B, C);
        void* dC = poison_act(be, ncc);
        be->gemm_grouped(be, &d, &gd, up_act(be, A, na), up_act(be, B, nb), dC);
        cmp(m, tb ? "gemm_grouped trans_b" : "gemm_grouped", down_act(be, dC, ncc), C, ncc,
            TOL(TOL_F32, TOL_BF16_SUM));

        // weight gradient: dB_g[N, K] += dY_gᵀ X_g
        float* dY = randn_act(m, ncc, 1.f);
        float* dB = randn(nb, 1.f);
        float* ddB = up_f32(be, dB, nb);
        g_cpu->gemm_grouped_wgrad(g_cpu, &gd, N, K, dY, A, dB, 1.f);
        be->gemm_grouped_wgrad(be, &gd, N, K, up_act(be, dY, ncc), up_act(be, A, na), ddB, 1.f);
        cmp(m, "gemm_grouped_wgrad", down_f32(be, ddB, nb), dB, nb, TOL(TOL_F32, TOL_FP32_OUT));

        // act-dtype dB (precision.expert_grad=bf16): overwrite (empty groups get zeros: the buffer
        // is poisoned), then accumulate; each call's fp32 sum rounded once
        GroupDesc ga = gd;
        ga.db_act = 1;
        void* daB = poison_act(be, nb);
        g_cpu->gemm_grouped_wgrad(g_cpu, &gd, N, K, dY, A, dB, 0.f);
        be->gemm_grouped_wgrad(be, &ga, N, K, up_act(be, dY, ncc), up_act(be, A, na), daB, 0.f);
        cmp(m, "gemm_grouped_wgrad act dB", down_act(be, daB, nb), dB, nb, TOL(TOL_F32, TOL_BF16_OUT));
        float* prev = down_act(be, daB, nb);  // the act values the accumulation starts from
        g_cpu->gemm_grouped_wgrad(g_cpu, &gd, N, K, dY, A, prev, 1.f);
        be->gemm_grouped_wgrad(be, &ga, N, K, up_act(be, dY, ncc), up_act(be, A, na), daB, 1.f);
        cmp(m, "gemm_grouped_wgrad act dB +=", down_act(be, daB, nb), prev, nb, TOL(TOL_F32, TOL_BF16_OUT));
        free(prev);
        free(A), free(B), free(C), free(dY), free(dB);
        dev_free_all();
    }
}

// The size a plan's dynamic dim is keyed at (cuda_gemm.cu: 1/32 of an octave above 1,024 rows,
// powers of two up to there); then the grouped GEMMs and weight gradients on plans built at sizes
// other than the call's own (rows 300 and 1,100: plans at 512 and 1,120, the latter not a power of
// two), against the CPU.
int cuda_gemm_plan_dim(Backend* be, int x);

static void test_gemm_rows_round(void) {
    const int off[3] = {0, 300, 1400};
    const int G = 2, N = 256, K = 320, R = off[G];
    FOR_MODES {
        Backend* be = m->gpu;
        const int x[] = {1, 1000, 1025, 5000, 8192, 8193, 9500, 16384, 20000};
        const int want[] = {1, 1024, 1056, 5120, 8192, 8448, 9728, 16384, 20480};
        for (int i = 0; i < (int)(sizeof x / sizeof x[0]); i++)
            EXPECT(cuda_gemm_plan_dim(be, x[i]) == want[i], "%d rows keyed at %d, want %d", x[i],
                   cuda_gemm_plan_dim(be, x[i]), want[i]);
        EXPECT(cuda_gemm_plan_dim(be, 300) == 512 && cuda_gemm_plan_dim(be, 1100) == 1120,
               "the case's groups keyed at %d and %d, want 512 and 1120", cuda_gemm_plan_dim(be, 300),
               cuda_gemm_plan_dim(be, 1100));
        const size_t na = (size_t)R * K, nb = (size_t)G * N * K, ncc = (size_t)R * N;
        float* A = randn_act(m, na, 1.f);
        float* B = randn_act(m, nb, 1.f);
        float* dY = randn_act(m, ncc, 1.f);
        GroupDesc gd = {.groups = G, .host_off = off, .b_stride = (size_t)N * K};
        void *dA = up_act(be, A, na), *dB = up_act(be, B, nb), *ddY = up_act(be, dY, ncc);
        for (int tb = 0; tb < 2; tb++) {  // C [R, N] = A · B_gᵀ; or dX [R, K] = dY · B_g
            GemmDesc d = {.N = tb ? N : K, .K = tb ? K : N, .trans_b = tb, .alpha = 1};
            const size_t nc = (size_t)R * d.N;
            float* ref = xmalloc(sizeof(float) * nc);
            g_cpu->gemm_grouped(g_cpu, &d, &gd, tb ? A : dY, B, ref);
            void* c = poison_act(be, nc);
            be->gemm_grouped(be, &d, &gd, tb ? dA : ddY, dB, c);
            cmp(m, tb ? "gemm_grouped, rows rounded up" : "gemm_grouped dgrad, rows rounded up", down_act(be, c, nc),
                ref, nc, TOL(TOL_F32, TOL_BF16_SUM));
            free(ref);
        }
        float* ref = xmalloc(sizeof(float) * nb);  // dB_g [N, K] = dY_gᵀ X_g: K of the plan is the rows
        g_cpu->gemm_grouped_wgrad(g_cpu, &gd, N, K, dY, A, ref, 0.f);
        float* ddB = poison(be, sizeof(float) * nb);
        be->gemm_grouped_wgrad(be, &gd, N, K, ddY, dA, ddB, 0.f);
        cmp(m, "gemm_grouped_wgrad, rows rounded up", down_f32(be, ddB, nb), ref, nb, TOL(TOL_F32, TOL_FP32_OUT));
        free(ref), free(A), free(B), free(dY);
        dev_free_all();
    }
}

int main(void) {
    if (gpu_setup("test_cuda_gemm")) return 1;
    RUN(test_gemm);
    RUN(test_gemm_tile_pref);
    RUN(test_gemm_rows_round);
    RUN(test_gemm_grouped);
    gpu_teardown();
    TEST_END();
}
