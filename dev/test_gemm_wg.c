// test_gemm_wg.c — the grouped expert GEMM of our own (dev/cuda/cuda_gemm_wg.cu, Hopper, bf16):
// the plain kernel and the w13 GEMM with the SwiGLU in its epilogue (gemm_grouped_swiglu), each
// against the CPU backend, with empty groups, ragged row tiles, more tiles than SMs and nothing
// written past the last group. On a GPU that is not compute capability 9.0, or a build for another
// SM, the kernel is unavailable and the tests say so (the cuBLASLt path of gemm_grouped_swiglu is
// still checked). `test_gemm_wg bench` times it against cuBLASLt at bench_8x7B_L2's shapes
// instead of testing. Tolerances: tests/gpu/gpu_check.h. Built by `make dev` (not part of
// moetrain: cuBLASLt's one call per expert won the race; this kernel is the base of a grouped
// FP8 kernel).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dev_bench.h"

// The grouped expert GEMM of our own (cuda_gemm_wg.cu; bf16): the forward's x·w13ᵀ / h·w2ᵀ
// (K-major weights, trans_b) and the backward's dy·w2 / d(gate|up)·w13 (MN-major weights) in
// small, against the CPU. The kernel is called directly, so a shape it turns down fails here.
int cuda_gemm_grouped_wg(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* A, const void* B, void* C);
int cuda_gemm_wg_available(Backend* be);
int cuda_gemm_wg_stalled(void);

static void test_gemm_grouped_wg(void) {
    const Mode* m = &g_modes[1];
    Backend* be = m->gpu;
    if (!cuda_gemm_wg_available(be)) {
        printf("  (the wgmma grouped GEMM is unavailable here: nothing to check)\n");
        return;
    }
    const struct { int G, N, K, tb, off[6]; } cs[] = {
        {5, 512, 448, 1, {0, 0, 130, 130, 387, 400}},  // empty groups, ragged row tiles, 7 K slices (the stage ring wraps)
        {4, 2304, 128, 1, {0, 300, 600, 1100, 1800}},  // 144 tiles, more than SMs: the persistent loop; a one-tile last band
        {5, 512, 448, 0, {0, 0, 130, 130, 387, 400}},  // the same with B_g [K, N] (the backward's data gradients)
        {4, 2304, 128, 0, {0, 300, 600, 1100, 1800}},
    };
    for (int c = 0; c < 4; c++) {
        const int G = cs[c].G, N = cs[c].N, K = cs[c].K, tb = cs[c].tb, *off = cs[c].off, R = off[G];
        const char* lay = tb ? "A·Bᵀ" : "A·B";
        const size_t na = (size_t)R * K, nb = (size_t)G * N * K, ncc = (size_t)R * N;
        float* A = act_in(m, randn(na, 1.f), na);
        float* B = act_in(m, randn(nb, 1.f), nb);
        float* C = xmalloc(4 * ncc);
        GemmDesc d = {.N = N, .K = K, .trans_b = tb, .alpha = 1};
        GroupDesc gd = {.groups = G, .host_off = off, .b_stride = (size_t)N * K};
        g_cpu->gemm_grouped(g_cpu, &d, &gd, A, B, C);
        void *dA = up_act(be, A, na), *dB = up_act(be, B, nb);
        {
            void* dC = poison_act(be, ncc + N);  // one row past the last group: must stay poisoned
            EXPECT(cuda_gemm_grouped_wg(be, &d, &gd, dA, dB, dC), "gemm_grouped_wg %s G=%d N=%d K=%d: shape refused",
                   lay, G, N, K);
            float* got = down_act(be, dC, ncc + N);
            EXPECT(!cuda_gemm_wg_stalled(), "gemm_grouped_wg %s G=%d N=%d K=%d: an mbarrier wait gave up", lay, G, N, K);
            int written = 0;
            for (int j = 0; j < N; j++) written += !isnan(got[ncc + j]);
            EXPECT(written == 0, "gemm_grouped_wg %s G=%d N=%d K=%d: %d values written past the last row", lay, G, N, K,
                   written);
            char lab[96];
            snprintf(lab, sizeof lab, "gemm_grouped_wg %s", lay);
            cmp(m, lab, got, C, ncc, TOL_BF16_SUM);  // frees got
        }
        free(A), free(B), free(C);
        dev_free_all();
    }
}

// gemm_grouped_swiglu (the w13 GEMM with the SwiGLU and routing scale in the grouped kernel's
// epilogue, gate rows [0, F) and up rows [F, 2F) of each expert's w13): gu against the CPU's GEMM,
// h bit for bit against swiglu_fwd on that gu, and both against the CPU's composition; through
// the kernel directly and be->gemm_grouped_swiglu (cuBLASLt + swiglu_fwd).
int cuda_gemm_grouped_swiglu_wg(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* A, const void* B,
                                void* gu, void* h, const float* scale);

static void test_gemm_grouped_swiglu(void) {
    const Mode* m = &g_modes[1];
    Backend* be = m->gpu;
    const int wg_ok = cuda_gemm_wg_available(be);
    if (!wg_ok) printf("  (the wgmma grouped GEMM is unavailable here: the cuBLASLt path only)\n");
    const struct { int G, F, K, scaled, off[6]; } cs[] = {
        {5, 256, 448, 1, {0, 0, 130, 130, 387, 400}},  // empty groups, ragged row tiles, the stage ring wraps
        {4, 1152, 128, 0, {0, 300, 600, 1100, 1800}},  // 144 tiles: the persistent loop; no scale
    };
    for (int c = 0; c < 2; c++) {
        const int G = cs[c].G, F = cs[c].F, N = 2 * F, K = cs[c].K, *off = cs[c].off, R = off[G];
        const size_t na = (size_t)R * K, nb = (size_t)G * N * K, ng = (size_t)R * N, nh = (size_t)R * F;
        float* A = act_in(m, randn(na, 1.f), na);
        float* B = act_in(m, randn(nb, 1.f), nb);
        float* sc = xmalloc(sizeof(float) * (R + 1));
        for (int i = 0; i < R; i++) sc[i] = 0.1f + 0.9f * (float)i / R;
        const float* scale = cs[c].scaled ? sc : NULL;
        float* gu = xmalloc(4 * ng);
        float* h = xmalloc(4 * nh);
        GemmDesc d = {.N = N, .K = K, .trans_b = 1, .alpha = 1};
        GroupDesc gd = {.groups = G, .host_off = off, .b_stride = (size_t)N * K};
        g_cpu->gemm_grouped_swiglu(g_cpu, &d, &gd, A, B, gu, h, scale);
        void *dA = up_act(be, A, na), *dB = up_act(be, B, nb);
        float* dsc = scale ? up_f32(be, sc, R) : NULL;
        for (int via = wg_ok ? 0 : 1; via < 2; via++) {
            void* dgu = poison_act(be, ng + N);  // one row past the last group: must stay poisoned
            void* dh = poison_act(be, nh + F);
            const char* path = via == 0 ? "kernel" : "cublas";
            if (via == 0) {
                EXPECT(cuda_gemm_grouped_swiglu_wg(be, &d, &gd, dA, dB, dgu, dh, dsc),
                       "gemm_grouped_swiglu_wg G=%d F=%d K=%d: shape refused", G, F, K);
            } else {
                be->gemm_grouped_swiglu(be, &d, &gd, dA, dB, dgu, dh, dsc);
            }
            void* dh2 = poison_act(be, nh);  // swiglu_fwd on the same gu
            be->swiglu_fwd(be, dh2, dgu, dsc, R, F);
            float* ggu = down_act(be, dgu, ng + N);
            float* gh = down_act(be, dh, nh + F);
            EXPECT(!cuda_gemm_wg_stalled(), "gemm_grouped_swiglu %s G=%d F=%d: an mbarrier wait gave up", path, G, F);
            int written = 0;
            for (int j = 0; j < N; j++) written += !isnan(ggu[ng + j]);
            for (int j = 0; j < F; j++) written += !isnan(gh[nh + j]);
            EXPECT(written == 0, "gemm_grouped_swiglu %s G=%d F=%d: %d values written past the last row", path, G, F,
                   written);
            char lab[64];
            snprintf(lab, sizeof lab, "gemm_grouped_swiglu %s h = swiglu_fwd(gu)", path);
            cmp_bits(m, lab, down_act(be, dh2, nh), gh, nh);  // frees both
            gh = down_act(be, dh, nh);
            snprintf(lab, sizeof lab, "gemm_grouped_swiglu %s gu", path);
            cmp(m, lab, ggu, gu, ng, TOL_BF16_SUM);
            snprintf(lab, sizeof lab, "gemm_grouped_swiglu %s h", path);
            cmp(m, lab, gh, h, nh, TOL_BF16_SUM);
        }
        free(A), free(B), free(sc), free(gu), free(h);
        dev_free_all();
    }
}

// ---- timings (`test_gemm_wg bench`; a measurement, not a test) ------------------------------

typedef struct GgCtx {
    Backend* be;
    int N, K, G, tb;
    void *A, *W, *C, *H;  // A [R, K], W [G, N, K], C [R, N]; H [R, N / 2] (SwiGLU)
    float* scale;
    int off[9];
    int wg;  // our kernel (else cuBLASLt)
} GgCtx;

static void b_grouped(void* c_) {
    GgCtx* c = c_;
    GemmDesc d = {.N = c->N, .K = c->K, .trans_b = c->tb, .alpha = 1};
    GroupDesc g = {.groups = c->G, .host_off = c->off, .b_stride = (size_t)c->N * c->K};
    if (!c->wg) c->be->gemm_grouped(c->be, &d, &g, c->A, c->W, c->C);
    else if (!cuda_gemm_grouped_wg(c->be, &d, &g, c->A, c->W, c->C)) FATAL("gemm_grouped_wg: shape refused");
}
static void b_grouped_swiglu(void* c_) {
    GgCtx* c = c_;
    GemmDesc d = {.N = c->N, .K = c->K, .trans_b = 1, .alpha = 1};
    GroupDesc g = {.groups = c->G, .host_off = c->off, .b_stride = (size_t)c->N * c->K};
    if (!c->wg) c->be->gemm_grouped_swiglu(c->be, &d, &g, c->A, c->W, c->C, c->H, c->scale);
    else if (!cuda_gemm_grouped_swiglu_wg(c->be, &d, &g, c->A, c->W, c->C, c->H, c->scale))
        FATAL("gemm_grouped_swiglu_wg: shape refused");
}

// bench: the grouped expert GEMM, cuBLASLt's one call per expert against ours
// (cuda_gemm_wg.cu), at the forward and data-gradient shapes of bench_8x7B_L2 at micro-batch 8
// (65,536 routed rows
// over 8 experts: even, and skewed as a router early in training leaves them), back to back so that
// the card runs at its power limit as it does in the step; the two alternate, twice. Then the two
// outputs against each other (rel. L2: summation order and one bf16 rounding apart).
static void bench_gg(void) {
    Backend* be = g_modes[1].gpu;
    if (!cuda_gemm_wg_available(be)) {
        printf("gg: the wgmma grouped GEMM is unavailable here\n");
        return;
    }
    const size_t nr = (size_t)1 << 24;
    float* r = randn(nr, 1.f);
    const int H = 4096, F = 14336, G = 8, R = 65536;
    void* A = rand_act(be, r, nr, (size_t)R * 2 * F);
    void* W = rand_act(be, r, nr, (size_t)G * 2 * F * H);
    void* C = dev_alloc(be, 2 * (size_t)R * 2 * F);
    void* C2 = dev_alloc(be, 2 * (size_t)R * 2 * F);
    const struct { const char* name; int N, K, tb; } sh[] = {
        {"w13 fwd", 2 * F, H, 1}, {"w2 fwd", H, F, 1}, {"w2 dgrad", F, H, 0}, {"w13 dgrad", H, 2 * F, 0}};
    const int even[8] = {8192, 8192, 8192, 8192, 8192, 8192, 8192, 8192};
    const int skew[8] = {13000, 4100, 9000, 6900, 10100, 5300, 7700, 9436};  // sums to 65,536
    for (int s = 0; s < 4; s++)
        for (int k = 0; k < 2; k++) {
            GgCtx c = {.be = be, .N = sh[s].N, .K = sh[s].K, .G = G, .tb = sh[s].tb, .A = A, .W = W, .C = C};
            for (int i = 0; i < G; i++) c.off[i + 1] = c.off[i] + (k ? skew : even)[i];
            const double tf = 2.0 * R * (double)c.N * c.K / 1e12;
            for (int round = 0; round < 2; round++)
                for (int wg = 0; wg < 2; wg++) {
                    c.wg = wg;
                    const double ms = time_ms(be, b_grouped, &c, 10);
                    printf("gg %-9s %-5s rows %s  %-7s %8.3f ms %6.1f TFLOP/s\n", sh[s].name, k ? "skew" : "even",
                           "65536", wg ? "wg" : "cublas", ms, tf / ms * 1e3);
                }
            c.wg = 0;
            b_grouped(&c);
            c.C = C2;
            c.wg = 1;
            b_grouped(&c);
            const size_t n = (size_t)1 << 22, last = (size_t)R * c.N - n;  // the first and last 4M values
            double e = 0;
            for (int part = 0; part < 2; part++) {
                const size_t o = part ? last : 0;
                float* x = down_act(be, (char*)C + 2 * o, n);
                float* y = down_act(be, (char*)C2 + 2 * o, n);
                const double ep = rel_l2(y, x, n);
                if (ep > e) e = ep;
                free(x), free(y);
            }
            printf("gg %-9s %-5s wg vs cublas: rel L2 %.2e\n", sh[s].name, k ? "skew" : "even", e);
            fflush(stdout);
        }
    // the w13 GEMM with the SwiGLU: cuBLASLt + swiglu_fwd against the fused epilogue
    float* sc = xmalloc(sizeof(float) * R);
    for (int i = 0; i < R; i++) sc[i] = 0.25f + 0.5f * (float)(i % 7) / 7;
    GgCtx c = {.be = be, .N = 2 * F, .K = H, .G = G, .A = A, .W = W, .C = C, .H = C2, .scale = up_f32(be, sc, R)};
    for (int i = 0; i < G; i++) c.off[i + 1] = c.off[i] + skew[i];
    for (int round = 0; round < 2; round++)
        for (int wg = 0; wg < 2; wg++) {
            c.wg = wg;
            const double ms = time_ms(be, b_grouped_swiglu, &c, 10);
            printf("gg w13+swiglu skew  %-13s %8.3f ms\n", wg ? "wg (fused)" : "cublas+swiglu", ms);
        }
    fflush(stdout);
    free(sc);
    free(r);
    dev_free_all();
}

int main(int argc, char** argv) {
    if (gpu_setup("test_gemm_wg")) return 1;
    if (argc > 1 && !strcmp(argv[1], "bench")) {  // the timings alone (no tests)
        bench_gg();
        gpu_teardown();
        return 0;
    }
    RUN(test_gemm_grouped_wg);
    RUN(test_gemm_grouped_swiglu);
    gpu_teardown();
    TEST_END();
}
