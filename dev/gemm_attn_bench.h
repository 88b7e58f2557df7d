// gemm_attn_bench.h — kernel timings (gpu_bench all, or attn for the attention kernels alone) and
// cuBLASLt's candidates and variants per GEMM shape (gpu_bench survey cool, hot, hotdense,
// hotskew, hotvar, fp8; dev/cuda/cuda_gemm_survey.cu). Included once, by dev/gpu_bench.c, after
// gpu_check.h; nothing here asserts.
#pragma once
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/survey.h"
#include "dev_bench.h"

// ---- timings (a measurement, not a test) --------------------------------

typedef struct BenchCtx {
    Backend* be;
    int B, T, Hq, Hkv, D, M, N, K, G;
    void *q, *k, *v, *o, *dq, *dk, *dv, *g, *A, *Bm, *C, *x, *y, *w, *ws;
    size_t ws_bytes;
    float *lse, *rstd, *f0, *f1, *f2, *f3;
    int32_t* tgt;
    int off[9];
} BenchCtx;

static void b_attn_fwd(void* c_) {
    BenchCtx* c = c_;
    c->be->attn_fwd(c->be, c->o, c->lse, c->q, c->k, c->v, c->B, c->T, c->Hq, c->Hkv, c->D, NULL);
}
static void b_attn_bwd(void* c_) {
    BenchCtx* c = c_;
    c->be->attn_bwd(c->be, c->dq, c->dk, c->dv, c->g, c->o, c->lse, c->q, c->k, c->v, c->B, c->T, c->Hq, c->Hkv,
                    c->D, c->ws, c->ws_bytes, NULL);
}
static void b_gemm(void* c_) {
    BenchCtx* c = c_;
    GemmDesc d = {.M = c->M, .N = c->N, .K = c->K, .trans_b = 1, .alpha = 1};
    c->be->gemm(c->be, &d, c->A, c->Bm, c->C);
}
static void b_grouped(void* c_) {
    BenchCtx* c = c_;
    GemmDesc d = {.N = c->N, .K = c->K, .trans_b = 1, .alpha = 1};
    GroupDesc g = {.groups = c->G, .host_off = c->off, .b_stride = (size_t)c->N * c->K};
    c->be->gemm_grouped(c->be, &d, &g, c->A, c->Bm, c->C);
}
static void b_rms(void* c_) {
    BenchCtx* c = c_;
    c->be->rmsnorm_fwd(c->be, c->y, c->rstd, c->x, c->w, c->M, c->K, 1e-5f);
}
static void b_ce(void* c_) {
    BenchCtx* c = c_;
    c->be->cross_entropy(c->be, c->C, c->f0, c->tgt, c->M, c->N, 0.f);
}
static void b_embed_bwd(void* c_) {
    BenchCtx* c = c_;
    c->be->embed_bwd(c->be, c->f0, c->x, c->tgt, c->M, c->K, c->N);
}
static void b_adam(void* c_) {
    BenchCtx* c = c_;
    const AdamWDesc d = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .wd = 0.1f, .grad_scale = 1.f, .step = 1};
    c->be->adamw(c->be, &d, c->f1, c->y, c->f2, c->f3, c->f0, (size_t)c->M * c->K);
}

int cuda_attn_ds_force(Backend* be, int on);  // cuda_attn_bwd_wg.cu (test hook)
void cuda_gemm_survey(Backend* be, const GemmDesc* d, const void* A, const void* B, void* C, int max_algos,
                      const char* label, float hot_ms);

// survey cool: every candidate of cuBLASLt's heuristic for the GEMMs of a bench_8x7B_L2
// step (expert GEMMs at 4096 and 8192 rows per expert: micro-batch 4 and 8, the weight gradients
// in bf16 as precision.expert_grad=auto writes them, and the dgrad/forward products with the weight
// stored transposed, "Wt"; the lm_head GEMMs of a 16,384-token chunk), each timed over 5 calls (a
// cool card). survey hot (hot_ms 600): micro-batch 8 only, each candidate back to
// back for 600 ms at the card's power limit, where the step runs .
// survey hotdense: the same for the attention projections at micro-batch 8 (32,768
// tokens: o_proj, and q/k/v as the one GEMM of 6,144 columns; weight gradients in fp32).
// survey hotskew: the same for the expert GEMMs whose rows vary, at 7,300 and 9,500
// rows: an expert's share under the step's skewed routing (load max/mean ~1.16), where the
// heuristic is asked at the exact size, unlike the step's plans (rounded to 8,192 or 16,384).
// survey hotvar (hot_ms 300): the step's own pick for each expert GEMM at 8,192 rows
// and each lm_head GEMM of a 16,384-token chunk against the same algorithm with another cluster
// shape, CTA swizzling or custom option (cuda_gemm_survey_variants).
void cuda_gemm_survey_variants(Backend* be, const GemmDesc* d, const void* A, const void* B, void* C, const char* label,
                               float hot_ms);
// survey fp8 (hot_ms 600): the six expert GEMM shapes at 8,192 rows as
// Y[M,N] = X[M,K]·W[N,K]ᵀ, in bf16 (the heuristic's first pick) and then in FP8 (e4m3 operands,
// bf16 output, cuBLASLt's first 4 candidates), each back to back at the card's power limit: what
// FP8 expert GEMMs would run at where the step runs (docs/performance.md, "Where the rest is").
// survey fp8blk (hot_ms 600): the same six products with the step's block scales (the forward and
// data gradients W 128×128 × X 1×128, the weight gradients 1×128 × 1×128 along 8,192 rows: the
// step's own orientation, cuBLASLt's m = the gradient's columns), the first 8 candidates each: whether
// a candidate other than the first pick runs the step's FP8 products faster.
void cuda_gemm_survey_fp8(Backend* be, int M, int N, int K, const void* A, const void* B, void* C, int scale,
                          int max_algos, const char* label, float hot_ms);

// The six expert GEMMs of a step at `rows` rows per expert, in the step's layouts (Mixtral-8x7B:
// H 4,096, F 14,336; the weight gradients written in the act dtype, as precision.expert_grad=auto).
typedef struct NamedGemm { const char* name; GemmDesc d; } NamedGemm;
static void expert_gemms(int rows, NamedGemm g[6]) {
    const int H = 4096, F = 14336;
    const NamedGemm e[6] = {
        {"w13 fwd", {.M = rows, .N = 2 * F, .K = H, .trans_b = 1, .alpha = 1}},
        {"w13 dgrad", {.M = rows, .N = H, .K = 2 * F, .alpha = 1}},
        {"w13 wgrad", {.M = 2 * F, .N = H, .K = rows, .trans_a = 1, .alpha = 1}},
        {"w2 fwd", {.M = rows, .N = H, .K = F, .trans_b = 1, .alpha = 1}},
        {"w2 dgrad", {.M = rows, .N = F, .K = H, .alpha = 1}},
        {"w2 wgrad", {.M = H, .N = F, .K = rows, .trans_a = 1, .alpha = 1}},
    };
    memcpy(g, e, sizeof e);
}

enum { SURVEY_EXPERT = 0, SURVEY_DENSE = 1, SURVEY_SKEW = 2, SURVEY_VARIANTS = 3, SURVEY_FP8 = 4, SURVEY_FP8BLK = 5, SURVEY_FP8VAR = 6 };
static void gemm_survey(float hot_ms, int which) {
    Backend* be = g_modes[1].gpu;  // bf16
    const size_t nr = (size_t)1 << 24;
    float* r = randn(nr, 1.f);
    const size_t big = (size_t)16384 * 32000;  // the largest operand (logits), and C in fp32
    void *A = rand_act(be, r, nr, big), *B = rand_act(be, r, nr, big), *C = dev_alloc(be, 4 * big);
    const int H = 4096, F = 14336, V = 32000, KV = 1024, T = 32768;
    if (which == SURVEY_DENSE) {
        const struct { const char* name; GemmDesc d; } q[] = {
            {"o fwd", {.M = T, .N = H, .K = H, .trans_b = 1, .alpha = 1}},
            {"qkv fwd", {.M = T, .N = H + 2 * KV, .K = H, .trans_b = 1, .alpha = 1}},
            {"o dgrad", {.M = T, .N = H, .K = H, .alpha = 1}},
            {"qkv dgrad", {.M = T, .N = H, .K = H + 2 * KV, .alpha = 1}},
            {"o wgrad", {.M = H, .N = H, .K = T, .trans_a = 1, .alpha = 1, .c_f32 = 1}},
            {"qkv wgrad", {.M = H + 2 * KV, .N = H, .K = T, .trans_a = 1, .alpha = 1, .c_f32 = 1}},
        };
        for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) cuda_gemm_survey(be, &q[i].d, A, B, C, 8, q[i].name, hot_ms);
        free(r);
        dev_free_all();
        return;
    }
    if (which == SURVEY_FP8) {  // the expert GEMMs at 8,192 rows, each as X·Wᵀ (FP8's one layout)
        NamedGemm g[6];
        expert_gemms(8192, g);
        for (int i = 0; i < 6; i++) {
            const GemmDesc d = {.M = g[i].d.M, .N = g[i].d.N, .K = g[i].d.K, .trans_b = 1, .alpha = 1};
            char nm[40];
            snprintf(nm, sizeof nm, "%s bf16", g[i].name);
            cuda_gemm_survey(be, &d, A, B, C, 1, nm, hot_ms);
            snprintf(nm, sizeof nm, "%s fp8", g[i].name);
            cuda_gemm_survey_fp8(be, d.M, d.N, d.K, A, B, C, FP8_SURVEY_TENSOR, 4, nm, hot_ms);
        }
        free(r);
        dev_free_all();
        return;
    }
    if (which == SURVEY_FP8BLK || which == SURVEY_FP8VAR) {  // the step's FP8 products: X·Wᵀ for the
        NamedGemm g[6];  // forward and data gradients, dYᵀ·X (dB [M, N], K = rows) for the weight gradients;
                         // FP8VAR: the first pick's cluster, swizzle and custom-option variants
        expert_gemms(8192, g);
        for (int i = 0; i < 6; i++) {
            const int wgrad = g[i].d.trans_a;
            char nm[40];
            snprintf(nm, sizeof nm, "%s fp8 %s", g[i].name, wgrad ? "vec" : "blk");
            cuda_gemm_survey_fp8(be, g[i].d.M, g[i].d.N, g[i].d.K, A, B, C, wgrad ? FP8_SURVEY_VEC : FP8_SURVEY_BLK,
                                 which == SURVEY_FP8VAR ? 0 : 8, nm, hot_ms);
        }
        free(r);
        dev_free_all();
        return;
    }
    if (which == SURVEY_VARIANTS) {  // expert GEMMs at 8,192 rows, a 16,384-token lm_head chunk
        const int Th = 16384;
        NamedGemm g[9] = {
            [6] = {"head fwd", {.M = Th, .N = V, .K = H, .trans_b = 1, .alpha = 1}},
            [7] = {"head dgrad", {.M = Th, .N = H, .K = V, .alpha = 1}},
            [8] = {"head wgrad", {.M = V, .N = H, .K = Th, .trans_a = 1, .alpha = 1, .beta = 1, .c_f32 = 1}},
        };
        expert_gemms(8192, g);
        for (int i = 0; i < 9; i++) cuda_gemm_survey_variants(be, &g[i].d, A, B, C, g[i].name, hot_ms);
        free(r);
        dev_free_all();
        return;
    }
    if (which == SURVEY_SKEW) {
        for (int rows = 7300; rows <= 9500; rows += 2200) {
            const struct { const char* name; GemmDesc d; } g[] = {
                {"w13 dgrad", {.M = rows, .N = H, .K = 2 * F, .alpha = 1}},
                {"w2 fwd", {.M = rows, .N = H, .K = F, .trans_b = 1, .alpha = 1}},
                {"w2 dgrad", {.M = rows, .N = F, .K = H, .alpha = 1}},
                {"w13 fwd", {.M = rows, .N = 2 * F, .K = H, .trans_b = 1, .alpha = 1}},
            };
            for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) cuda_gemm_survey(be, &g[i].d, A, B, C, 8, g[i].name, hot_ms);
        }
        free(r);
        dev_free_all();
        return;
    }
    for (int rows = hot_ms > 0 ? 8192 : 4096; rows <= 8192; rows *= 2) {
        NamedGemm g[10] = {
            [6] = {"w13 fwd Wt", {.M = rows, .N = 2 * F, .K = H, .alpha = 1}},
            [7] = {"w13 dgrad Wt", {.M = rows, .N = H, .K = 2 * F, .trans_b = 1, .alpha = 1}},
            [8] = {"w2 fwd Wt", {.M = rows, .N = H, .K = F, .alpha = 1}},
            [9] = {"w2 dgrad Wt", {.M = rows, .N = F, .K = H, .trans_b = 1, .alpha = 1}},
        };
        expert_gemms(rows, g);
        const int ng = hot_ms > 0 ? 6 : 10;  // hot: not the transposed-weight rows
        for (int i = 0; i < ng; i++) cuda_gemm_survey(be, &g[i].d, A, B, C, 8, g[i].name, hot_ms);
    }
    const struct { const char* name; GemmDesc d; } h[] = {
        {"head fwd", {.M = 16384, .N = V, .K = H, .trans_b = 1, .alpha = 1}},
        {"head dgrad", {.M = 16384, .N = H, .K = V, .alpha = 1}},
        {"head wgrad", {.M = V, .N = H, .K = 16384, .trans_a = 1, .alpha = 1, .beta = 1, .c_f32 = 1}},
    };
    for (size_t i = 0; i < sizeof h / sizeof h[0]; i++) cuda_gemm_survey(be, &h[i].d, A, B, C, 8, h[i].name, hot_ms);
    free(r);
    dev_free_all();
}

// The attention kernels at Mixtral's shape (T 4096, 32 query heads, 8 kv heads, D 128) and B
// batch rows: forward, the recompute backward, the stored-dS backward (wgmma), then mma.sync.
static void bench_attn(Backend* be, int B) {
    BenchCtx c = {.be = be, .B = B, .T = 4096, .Hq = 32, .Hkv = 8, .D = 128};
    const size_t nq = (size_t)c.B * c.T * c.Hq * c.D, nk = (size_t)c.B * c.T * c.Hkv * c.D;
    float* r = randn(nq, 1.f);
    c.q = up_act(be, r, nq), c.k = up_act(be, r, nk), c.v = up_act(be, r + nk, nk), c.g = up_act(be, r, nq);
    c.o = dev_alloc(be, 2 * nq), c.dq = dev_alloc(be, 2 * nq), c.dk = dev_alloc(be, 2 * nk);
    c.dv = dev_alloc(be, 2 * nk), c.lse = dev_alloc(be, 4 * (size_t)c.B * c.Hq * c.T);
    const double fl_attn = 4.0 * c.B * c.Hq * (double)c.T * c.T * c.D / 2;  // causal: half the square
    printf("\nbench (bf16)                                      ms     TFLOP/s or GB/s\n");
    double t = 0;
    // the stored-dS backward's workspace: every (batch row, kv head) pair's causal 64 × 64 tiles
    const size_t nt = (size_t)c.T / 64, ds_bytes = (size_t)c.B * c.Hq * (nt * (nt + 1) / 2) * 64 * 64 * 2;
    void* ds = dev_alloc(be, ds_bytes);
    const GpuConfig mma = {.attention = GPU_ATTN_MMA};
    Err err = {{0}};
    Backend* be_mma = cuda_backend_create(DTYPE_BF16, 0, &mma, &err);
    CHECK(be_mma, "cuda_backend_create: %s", err.msg);
    for (int path = 0; path < 2; path++) {  // the default kernels (wgmma on an H200), then mma.sync
        c.be = path ? be_mma : be;
        const char* pn = path ? "mma  " : "wgmma";
        t = time_ms(c.be, b_attn_fwd, &c, 10);
        printf("attn_fwd %s B%d T4096 Hq32 Hkv8 D128    %9.3f   %7.1f TFLOP/s\n", pn, B, t, fl_attn / t / 1e9);
        c.ws = NULL, c.ws_bytes = 0;
        t = time_ms(c.be, b_attn_bwd, &c, 5);
        printf("attn_bwd %s (same)                     %9.3f   %7.1f TFLOP/s (2.5x fwd flops)\n", pn, t,
               2.5 * fl_attn / t / 1e9);
        if (path == 0) {
            c.ws = ds, c.ws_bytes = ds_bytes;
            t = time_ms(c.be, b_attn_bwd, &c, 5);
            printf("attn_bwd wgmma stored dS (%4.0f MB)         %9.3f   %7.1f TFLOP/s (2.5x fwd flops)\n",
                   ds_bytes / 1e6, t, 2.5 * fl_attn / t / 1e9);
            if (B > 1) {  // a workspace for half the pairs: two chunks, as in the step at micro-batch 8
                const int was = cuda_attn_ds_force(be, 1);
                c.ws_bytes = ds_bytes / 2;
                t = time_ms(c.be, b_attn_bwd, &c, 5);
                printf("attn_bwd wgmma stored dS, 2 chunks          %9.3f   %7.1f TFLOP/s (2.5x fwd flops)\n", t,
                       2.5 * fl_attn / t / 1e9);
                cuda_attn_ds_force(be, was);
            }
            c.ws = NULL, c.ws_bytes = 0;
        }
    }
    be_mma->destroy(be_mma);
    free(r);
    dev_free_all();
}

static void bench(void) {
    Backend* be = g_modes[1].gpu;  // bf16
    BenchCtx c = {.be = be};
    double t = 0;
    float* r;
    bench_attn(be, 1);

    c.M = 4096, c.N = 14336, c.K = 4096;
    r = randn((size_t)c.N * c.K, 1.f);
    c.A = up_act(be, r, (size_t)c.M * c.K), c.Bm = up_act(be, r, (size_t)c.N * c.K);
    c.C = dev_alloc(be, 2 * (size_t)c.M * c.N);
    t = time_ms(be, b_gemm, &c, 10);
    printf("gemm 4096x14336x4096 (x·Wᵀ)                %9.3f   %7.1f TFLOP/s\n", t, 2.0 * c.M * c.N * c.K / t / 1e9);
    c.G = 8, c.N = 2 * 1792, c.M = 8192;  // 8 experts, uneven rows, one empty
    const int rows[8] = {1500, 700, 0, 1200, 1300, 900, 1400, 1192};
    c.off[0] = 0;
    for (int i = 0; i < 8; i++) c.off[i + 1] = c.off[i] + rows[i];
    free(r);
    dev_free_all();
    r = randn((size_t)c.G * c.N * c.K, 1.f);
    c.A = up_act(be, r, (size_t)c.M * c.K), c.Bm = up_act(be, r, (size_t)c.G * c.N * c.K);
    c.C = dev_alloc(be, 2 * (size_t)c.M * c.N);
    t = time_ms(be, b_grouped, &c, 10);
    printf("gemm_grouped 8 groups 8192x3584x4096       %9.3f   %7.1f TFLOP/s\n", t, 2.0 * c.M * c.N * c.K / t / 1e9);
    free(r);
    dev_free_all();

    c.M = 16384, c.K = 4096;
    r = randn((size_t)c.M * c.K, 1.f);
    c.x = up_act(be, r, (size_t)c.M * c.K), c.w = up_act(be, r, c.K), c.y = dev_alloc(be, 2 * (size_t)c.M * c.K);
    c.rstd = dev_alloc(be, 4 * (size_t)c.M);
    t = time_ms(be, b_rms, &c, 20);
    printf("rmsnorm_fwd 16384x4096                    %9.3f   %7.1f GB/s\n", t, 4.0 * c.M * c.K / t / 1e6);
    c.f0 = up_f32(be, r, (size_t)c.M * c.K), c.f1 = up_f32(be, r, (size_t)c.M * c.K);
    c.f2 = up_f32(be, r, (size_t)c.M * c.K), c.f3 = dev_alloc(be, 4 * (size_t)c.M * c.K);
    t = time_ms(be, b_adam, &c, 20);
    printf("adamw 67M params (bf16 copy)              %9.3f   %7.1f GB/s\n", t, 30.0 * c.M * c.K / t / 1e6);
    dev_free_all();
    c.M = 2048, c.N = 32000;  // 65.5M logits: fits in r (16384 × 4096)
    c.C = up_act(be, r, (size_t)c.M * c.N);
    int32_t* tg = xmalloc(4 * (size_t)c.M);
    for (int i = 0; i < c.M; i++) tg[i] = i % c.N;
    c.tgt = up_i32(be, tg, c.M);
    c.f0 = dev_alloc(be, 4);
    t = time_ms(be, b_ce, &c, 20);
    printf("cross_entropy 2048x32000 (loss only)      %9.3f   %7.1f GB/s\n", t, 2.0 * c.M * c.N / t / 1e6);
    free(tg), free(r);
    dev_free_all();

    // embed_bwd, 32768 tokens, H 4096, V 32000: uniform tokens; Zipf (P(rank k) ∝ 1/k, ranks
    // scattered over the ids: runs up to ~3000); all tokens equal (one run: the worst case). GB/s
    // counts dout once and each touched fp32 row of dtable read and written.
    c.M = 32768, c.K = 4096, c.N = 32000;
    const size_t nr = (size_t)1 << 24;
    r = randn(nr, 1.f);
    c.x = rand_act(be, r, nr, (size_t)c.M * c.K);
    c.f0 = dev_alloc(be, 4 * (size_t)c.N * c.K);
    tg = xmalloc(4 * (size_t)c.M);
    double* cdf = xmalloc(sizeof(double) * c.N);
    char* seen = xmalloc(c.N);
    double z = 0;
    for (int k = 0; k < c.N; k++) cdf[k] = z += 1.0 / (k + 1);
    for (int pat = 0; pat < 3; pat++) {
        for (int i = 0; i < c.M; i++) {
            if (pat == 0) tg[i] = (int)(rng_u64(&g_rng) % c.N);
            else if (pat == 2) tg[i] = 12345;
            else {
                const double u = rng_uniform(&g_rng) * z;
                int lo = 0, hi = c.N - 1;
                while (lo < hi) {
                    const int mid = (lo + hi) / 2;
                    if (cdf[mid] > u) hi = mid;
                    else lo = mid + 1;
                }
                tg[i] = (int)(((long long)lo * 7919 + 13) % c.N);
            }
        }
        memset(seen, 0, c.N);
        int distinct = 0;
        for (int i = 0; i < c.M; i++) distinct += !seen[tg[i]], seen[tg[i]] = 1;
        c.tgt = up_i32(be, tg, c.M);
        t = time_ms(be, b_embed_bwd, &c, 20);
        const double bytes = 2.0 * c.M * c.K + 8.0 * distinct * c.K;
        printf("embed_bwd 32768x4096 V32000 %-8s (%5d rows) %9.3f   %7.1f GB/s\n",
               pat == 0 ? "uniform" : pat == 1 ? "zipf" : "same", distinct, t, bytes / t / 1e6);
    }
    free(tg), free(r), free(cdf), free(seen);
    dev_free_all();
}
