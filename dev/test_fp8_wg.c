// test_fp8_wg.c — the FP8 weight-gradient kernel of our own (dev/cuda/cuda_fp8_wg.cu, Hopper)
// against the CPU spec (fp8_gemm_tn on fp8_quant_1x128's codes of the same operands), element by
// element within tests/gpu/test_cuda_fp8.c's bound (restated below): fp32 and bf16 C, beta 0 and 1,
// K tiles partial and several, more tiles than SMs (the persistent loop, the stage ring running on
// across tiles), nothing written past C. `test_fp8_wg bench` times it against cuBLASLt's
// VEC128 × VEC128 product (what moetrain's weight gradients run) at Mixtral-8x7B's two weight
// gradients instead of testing. Built by `make dev`; not part of moetrain (cuBLASLt is faster).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dev_bench.h"
#include "fp8.h"
#include "fp8_bound.h"

int cuda_fp8_wg_available(Backend* be);
int cuda_fp8_wg_stalled(void);
int cuda_fp8_wg_wgrad(Backend* be, int M, int N, int K, int ldk, const uint8_t* qa, const float* sa, const uint8_t* qb,
                      const float* sb, float beta, void* C, int ldc, int c_f32);
int cuda_fp8_wg_lt(Backend* be, int M, int N, int K, int ldk, const uint8_t* qa, const float* sa, const uint8_t* qb,
                   const float* sb, float beta, void* C, int ldc, int c_f32);

static int tiles(int n) { return (n + FP8_TILE - 1) / FP8_TILE; }

// An operand quantised by the spec, [R, K] along K: codes and scales in the spec's layouts (q [R, K],
// s [R, Kt]) and in the kernel's (codes [R, ldk] with zero codes past K, scales [Kt, R]) on the GPU.
typedef struct Op {
    int R, K, ldk;
    uint8_t* q;
    float* s;
    uint8_t* dq;
    float* ds;
} Op;

// [R, K] of N(0, 1) values scaled per row by scale · 2^u, u in [-2, 2] (activations and gradients)
static Op op_make(Backend* be, int R, int K, float scale) {
    Op o = {R, K, (K + 15) / 16 * 16, xmalloc((size_t)R * K + 1), xmalloc(4 * ((size_t)R * tiles(K) + 1)), NULL, NULL};
    float* x = xmalloc(sizeof(float) * ((size_t)R * K + 1));
    for (int r = 0; r < R; r++) {
        const float s = scale * exp2f(4.f * rng_uniform(&g_rng) - 2.f);
        for (int k = 0; k < K; k++) x[(size_t)r * K + k] = rng_normal(&g_rng) * s;
    }
    fp8_quant_1x128(x, R, K, (size_t)K, o.q, o.s, NULL, NULL);
    free(x);
    const int Kt = tiles(K);
    uint8_t* c = calloc((size_t)R * o.ldk, 1);
    float* st = xmalloc(4 * (size_t)Kt * R);
    for (int r = 0; r < R; r++) {
        memcpy(c + (size_t)r * o.ldk, o.q + (size_t)r * K, (size_t)K);
        for (int t = 0; t < Kt; t++) st[(size_t)t * R + r] = o.s[(size_t)r * Kt + t];
    }
    o.dq = up_bytes(be, c, (size_t)R * o.ldk);
    o.ds = up_f32(be, st, (size_t)Kt * R);
    free(c), free(st);
    return o;
}
static void op_free(Op* o) { free(o->q), free(o->s); }

// The bound on |r_gpu − r_spec| for output (i, j): fp8_bound.h's.
static double bound_at(const Op* a, const Op* b, int i, int j) {
    const int K = a->K, Kt = tiles(K);
    return fp8_bound_elem(a->q + (size_t)i * K, a->s + (size_t)i * Kt, b->q + (size_t)j * K, b->s + (size_t)j * Kt, K);
}

// One product C[M, N] (+ beta · C0) through the kernel, checked on `nr` rows spread over M (all when
// nr ≥ M) against the spec; c_f32 or a bf16 C; one row of C past M must stay poisoned.
static void run_case(int M, int N, int K, float beta, int c_f32, int nr) {
    Backend* be = g_modes[1].gpu;
    Op a = op_make(be, M, K, 1e-3f), b = op_make(be, N, K, 1.f);
    const size_t nc = (size_t)M * N;
    float* c0 = randn(nc, 0.05f);
    if (!c_f32) round_act(&g_modes[1], c0, nc);  // bf16 C: its values as stored
    void* dC;
    if (c_f32) {
        dC = poison(be, 4 * (nc + N));
        if (beta != 0.f) be->to_device(be, dC, c0, 4 * nc);
    } else {
        dC = poison(be, 2 * (nc + N));
        if (beta != 0.f) {
            uint16_t* h = xmalloc(2 * nc);
            for (size_t i = 0; i < nc; i++) h[i] = f32_to_bf16(c0[i]);
            be->to_device(be, dC, h, 2 * nc);
            free(h);
        }
    }
    char lab[64];
    snprintf(lab, sizeof lab, "wg %dx%d K=%d %s beta %g", M, N, K, c_f32 ? "fp32" : "bf16", beta);
    EXPECT(cuda_fp8_wg_wgrad(be, M, N, K, a.ldk, a.dq, a.ds, b.dq, b.ds, beta, dC, N, c_f32), "%s: shape refused", lab);
    float* got;
    if (c_f32) {
        got = down_f32(be, dC, nc + N);
    } else {
        uint16_t* h = down_u16(be, dC, nc + N);
        got = xmalloc(sizeof(float) * (nc + N));
        for (size_t i = 0; i < nc + N; i++) got[i] = bf16_to_f32(h[i]);
        free(h);
    }
    EXPECT(!cuda_fp8_wg_stalled(), "%s: an mbarrier wait gave up", lab);
    int past = 0;
    for (int j = 0; j < N; j++) past += !isnan(got[nc + j]);
    EXPECT(past == 0, "%s: %d values written past C", lab, past);
    const int rows = nr < M ? nr : M;
    float* r = xmalloc(sizeof(float) * N);
    size_t bad = 0;
    double worst = 0;
    for (int k = 0; k < rows; k++) {
        const int i = rows == M ? k : (int)((long)k * (M - 1) / (rows - 1));
        fp8_gemm_tn(1, N, K, a.q + (size_t)i * K, a.s + (size_t)i * tiles(K), b.q, b.s, 0, r, (size_t)N, 0);
        for (int j = 0; j < N; j++) {
            const double ar = r[j], ba = (double)beta * c0[(size_t)i * N + j], cref = ar + ba;
            double bd = bound_at(&a, &b, i, j) + ldexp(1, -23) * (fabs(ar) + fabs(ba));
            if (!c_f32) bd += ldexp(1, -8) * (fabs(cref) + bd);
            const double gv = got[(size_t)i * N + j], err = fabs(gv - cref);
            const double ratio = isfinite(gv) ? (bd > 0 ? err / bd : (err > 0 ? INFINITY : 0)) : INFINITY;
            if (ratio > worst) worst = ratio;
            if (!(ratio <= 1)) {
                if (!bad) fprintf(stderr, "  %s: row %d col %d: got %.9g, spec %.9g, error %.3g > bound %.3g\n", lab, i, j,
                                  gv, cref, err, bd);
                bad++;
            }
        }
    }
    record(lab, !c_f32, worst, 1);
    EXPECT(bad == 0, "%s: %zu elements outside the bound (worst error / bound %.3g)", lab, bad, worst);
    op_free(&a), op_free(&b);
    free(c0), free(got), free(r);
    dev_free_all();
}

static void test_fp8_wg(void) {
    if (!cuda_fp8_wg_available(g_modes[1].gpu)) {
        printf("  (the wgmma FP8 weight-gradient kernel is unavailable here: nothing to check)\n");
        return;
    }
    const float betas[2] = {0.f, 1.f};
    for (int c = 0; c < 2; c++)
        for (int bi = 0; bi < 2; bi++) {
            run_case(128, 256, 50, betas[bi], c, 1 << 30);    // one partial K tile
            run_case(256, 512, 300, betas[bi], c, 1 << 30);   // three K tiles, the last partial
            run_case(384, 768, 1024, betas[bi], c, 96);       // 8 K tiles: the 4-stage ring wraps
        }
    run_case(2048, 4096, 300, 0.f, 0, 64);  // 256 tiles: more than the SMs
    run_case(2048, 4096, 300, 1.f, 1, 64);
    // shapes it must refuse (the caller keeps cuBLASLt): M % 128, N % 256, ldk % 16
    Backend* be = g_modes[1].gpu;
    void* z = dev_alloc(be, 1 << 20);
    EXPECT(!cuda_fp8_wg_wgrad(be, 192, 256, 64, 64, z, z, z, z, 0.f, z, 256, 1), "M = 192 taken");
    EXPECT(!cuda_fp8_wg_wgrad(be, 128, 192, 64, 64, z, z, z, z, 0.f, z, 192, 1), "N = 192 taken");
    EXPECT(!cuda_fp8_wg_wgrad(be, 128, 256, 60, 60, z, z, z, z, 0.f, z, 256, 1), "ldk = 60 taken");
    dev_free_all();
}

// ---- bench: Mixtral-8x7B's weight gradients, one expert of `rows` rows, ours against cuBLASLt ----
typedef struct WgCtx {
    Backend* be;
    int M, N, K, lt;
    Op *a, *b;
    void* C;
} WgCtx;
static void b_wg(void* p) {
    WgCtx* c = p;
    int ok = (c->lt ? cuda_fp8_wg_lt : cuda_fp8_wg_wgrad)(c->be, c->M, c->N, c->K, c->a->ldk, c->a->dq, c->a->ds,
                                                       c->b->dq, c->b->ds, 0.f, c->C, c->N, 0);
    if (!ok) FATAL("test_fp8_wg bench: %s refused %dx%d K=%d", c->lt ? "cuBLASLt" : "the kernel", c->M, c->N, c->K);
}

static void bench_wg(int rows) {
    Backend* be = g_modes[1].gpu;
    if (!cuda_fp8_wg_available(be)) {
        printf("the wgmma FP8 weight-gradient kernel is unavailable here\n");
        return;
    }
    const int H = 4096, F = 14336;
    const struct { const char* name; int M, N; } sh[2] = {{"w13 wgrad", 2 * F, H}, {"w2 wgrad", H, F}};
    for (int s = 0; s < 2; s++) {
        Op a = op_make(be, sh[s].M, rows, 1e-3f), b = op_make(be, sh[s].N, rows, 1.f);
        WgCtx c = {be, sh[s].M, sh[s].N, rows, 0, &a, &b, dev_alloc(be, (size_t)2 * sh[s].M * sh[s].N)};
        const double tf = 2.0 * sh[s].M * sh[s].N * (double)rows / 1e12;
        for (int round = 0; round < 2; round++)
            for (int lt = 0; lt < 2; lt++) {
                c.lt = lt;
                const double ms = time_ms(be, b_wg, &c, 10);
                printf("%-9s rows %d  %-8s %8.3f ms %6.0f TFLOP/s\n", sh[s].name, rows, lt ? "cuBLASLt" : "ours", ms,
                       tf / ms * 1e3);
            }
        fflush(stdout);
        op_free(&a), op_free(&b);
        dev_free_all();
    }
}

int main(int argc, char** argv) {
    if (gpu_setup("test_fp8_wg")) return 1;
    fp8_bound_init();
    if (argc > 1 && !strcmp(argv[1], "bench")) {  // the timings alone (no tests)
        bench_wg(argc > 2 ? atoi(argv[2]) : 8192);
        gpu_teardown();
        return 0;
    }
    RUN(test_fp8_wg);
    gpu_teardown();
    TEST_END();
}
