// test_model_fp8.c — src/model.c with precision.fp8 on the CPU backend (the executable spec): the
// experts and linear modes close to fp8 none, each GEMM in its mode (test_fp8_wiring), the FP8
// workspace planned as `plan` counts it, refused on a backend without FP8 GEMMs; kept FP8 weight
// codes (precision.fp8_weights=per_step) refused before a fresh micro-batch made them, and placed
// in the gradient arena past its gradients.
// (tests/test_model.c: the model without FP8; each op's own checks: tests/test_cpu_gemm_fp8.c.)
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "comm.h"
#include "model.h"
#include "plan.h"
#include "test.h"

static Backend* be;
static Rng rng;
static Comm* g_comm;

static float* dup_f(const float* x, size_t n) {
    float* p = xmalloc(sizeof(float) * n);
    memcpy(p, x, sizeof(float) * n);
    return p;
}

// The model of test_fp8_modes and test_fp8_keep_swiglu, and one fresh step of it (forward and
// backward) from the same initial weights.
static ModelConfig small_model(void) {
    return (ModelConfig){.vocab_size = 32, .hidden = 160, .ffn = 136, .layers = 2, .heads = 4, .kv_heads = 2,
                         .experts = 4, .top_k = 2, .max_seq = 64, .rope_theta = 10000, .rms_eps = 1e-5f,
                         .init_std = 0.02f, .aux_coef = 0.02f, .z_coef = 1e-3f};
}
static StepLoss small_step(Model* m, const ModelConfig* c, const int32_t* tok, const int32_t* tgt, int N) {
    for (int i = 0; i < m->pl.n; i++) {
        const ParamInfo* p = &m->pl.p[i];
        model_init_tensor(c, p, 21, (float*)m->w[p->arena] + p->offset);
    }
    MicroArgs a = {.tokens = tok, .targets = tgt, .backward = 1, .ce_scale = 1.0f / N, .aux_scale = c->aux_coef,
                   .z_scale = c->z_coef, .fresh = 1};
    return model_step(m, &a);
}

// precision.fp8 (ModelOpts.fp8): forward and backward with the expert GEMMs (experts) and the
// attention projections too (linear) in block-scaled FP8, against fp8 none on the same weights and
// tokens (HF's init_std 0.02). Dimensions cross the 128-tiles (hidden 160, ffn 136, 160 expert rows,
// 80 tokens), so the quantisers see full and partial tiles. FP8 must really be on: the loss and
// every gradient arena differ from fp8 none, and linear differs from experts. And stay close: one
// FP8 GEMM's output carries the e4m3 rounding of its operands, 3.6% relative L2 on random data
// (test_cpu_gemm_fp8). A gradient of this 2-layer model depends on up to 8 FP8 GEMMs with experts
// (2 a layer forward, 2 a layer backward on the data path) and 16 with linear; independent
// roundings add in quadrature (√8 × 0.036 = 0.10, √16 × 0.036 = 0.14: about what is seen), at
// worst linearly (0.29, 0.58). Bounds on each arena's relative L2: 0.25 (experts) and 0.40 (linear),
// over twice what is seen (up to 0.02 / 0.10 dense / experts with experts, 0.07 / 0.17 with
// linear); 2e-3 on the relative loss (seen 1e-4). A misplaced scale or a transposed operand gives
// O(1); which GEMM runs in which mode is checked exactly by test_fp8_wiring. The workspace is
// planned (no arena growth) and equals what `plan` counts.
static const double TOL_FP8_GRAD[3] = {0, 0.25, 0.40};
#define TOL_FP8_LOSS 2e-3
static void test_fp8_modes(void) {
    const ModelConfig c = small_model();
    enum { B = 2, T = 40, N = B * T };
    int32_t tok[N], tgt[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(rng_u64(&rng) % 32), tgt[i] = (int32_t)(rng_u64(&rng) % 32);
    Config cfg;
    config_defaults(&cfg);
    cfg.model = c;
    cfg.train.micro_batch = B, cfg.train.global_batch = B, cfg.train.seq_len = T, cfg.train.device = DEVICE_CPU;
    float* g[3][2];
    double loss[3];
    for (int mode = FP8_NONE; mode <= FP8_LINEAR; mode++) {
        Model m;
        const ModelOpts o = {.fp8 = (Fp8Mode)mode};
        model_create_opts(&m, &c, B, T, &o, be, g_comm);
        StepLoss l = small_step(&m, &c, tok, tgt, N);
        loss[mode] = l.ce_sum / N + c.aux_coef * l.aux + c.z_coef * l.z;
        EXPECT(m.bump.grown == 0 && m.tmp.grown == 0, "fp8=%s: the arenas are planned large enough (grew %zu, %zu)",
               fp8_mode_name(mode), m.bump.grown, m.tmp.grown);
        cfg.precision.fp8 = (Fp8Mode)mode;
        PlanMemory pm;
        Err e = {{0}};
        EXPECT(plan_memory(&cfg, 1, &pm, &e) == 0 && pm.fp8_ws == (double)m.fp8_ws,
               "fp8=%s: plan counts %.0f bytes of FP8 workspace, the model plans %zu", fp8_mode_name(mode), pm.fp8_ws,
               m.fp8_ws);
        EXPECT((m.fp8_ws > 0) == (mode != FP8_NONE), "fp8=%s: workspace %zu", fp8_mode_name(mode), m.fp8_ws);
        for (int ar = 0; ar < 2; ar++) g[mode][ar] = dup_f(m.grad[ar], m.numel[ar]);
        const size_t n0 = m.numel[0], n1 = m.numel[1];
        if (mode != FP8_NONE) {
            const double dl = fabs(loss[mode] - loss[0]) / fabs(loss[0]);
            const double e0 = rel_l2(g[mode][0], g[0][0], n0), e1 = rel_l2(g[mode][1], g[0][1], n1);
            printf("  fp8=%s: loss %.7f vs %.7f (rel %.2e); gradients rel L2 dense %.4f, experts %.4f\n",
                   fp8_mode_name(mode), loss[mode], loss[0], dl, e0, e1);
            EXPECT(dl > 0 && dl < TOL_FP8_LOSS, "fp8=%s: relative loss difference %.3g", fp8_mode_name(mode), dl);
            EXPECT(e0 > 0 && e0 < TOL_FP8_GRAD[mode], "fp8=%s: dense gradients rel L2 %.3g", fp8_mode_name(mode), e0);
            EXPECT(e1 > 0 && e1 < TOL_FP8_GRAD[mode], "fp8=%s: expert gradients rel L2 %.3g", fp8_mode_name(mode), e1);
        }
        if (mode == FP8_LINEAR) {
            // the attention projections' own gradients are FP8 GEMMs only here: further from fp8
            // none than with experts (where they see the experts' errors through the residual only)
            const LayerOffsets* lo = &m.pl.layer[0];
            const size_t nq = (size_t)(c.heads + 2 * c.kv_heads) * (c.hidden / c.heads) * c.hidden;
            const double ex = rel_l2(g[1][0] + lo->qkv, g[0][0] + lo->qkv, nq);
            const double li = rel_l2(g[2][0] + lo->qkv, g[0][0] + lo->qkv, nq);
            printf("  layer 0 qkv gradient rel L2 to fp8 none: experts %.4f, linear %.4f\n", ex, li);
            EXPECT(li > ex && li < TOL_FP8_GRAD[2], "qkv gradient: linear %.3g vs experts %.3g", li, ex);
            EXPECT(loss[2] != loss[1], "linear and experts differ");
        }
        model_free(&m);
    }
    for (int v = 0; v < 3; v++) free(g[v][0]), free(g[v][1]);
}

// Which GEMM runs in which FP8 mode: a backend that forwards to the CPU one and records every GEMM
// call's fp8 mode by its shape. experts: the grouped forward GEMMs (w13 through the fused SwiGLU op,
// w2) and data gradients FP8_WEIGHT, the grouped weight gradients FP8_ACT, every plain gemm off;
// linear: also the attention projections (qkv, o: forward and data gradient FP8_WEIGHT, weight
// gradient FP8_ACT), while the router and lm_head GEMMs stay off. Each FP8 call brings a workspace.
typedef struct GemmLog {
    int n;
    struct { char what; int M, N, K, ta, fp8, ws_ok; } c[256];
} GemmLog;
static GemmLog g_log;
static Backend* g_real;
static void log_call(char what, int M, int N, int K, int ta, Fp8Gemm f, const void* ws, size_t wsb, size_t need) {
    if (g_log.n < 256) g_log.c[g_log.n++] = (__typeof__(g_log.c[0])){what, M, N, K, ta, f, !f || (ws && wsb >= need)};
}
static void rec_gemm(Backend* b, const GemmDesc* d, const void* A, const void* B, void* C) {
    log_call('g', d->M, d->N, d->K, d->trans_a, d->fp8, d->ws, d->ws_bytes,
             g_real->fp8_ws_bytes(g_real, FP8_OP_GEMM, d->fp8, d->M, d->N, d->K, 1));
    g_real->gemm(g_real, d, A, B, C);
}
static void rec_grouped(Backend* b, const GemmDesc* d, const GroupDesc* g, const void* A, const void* B, void* C) {
    const int M = g->host_off[g->groups];
    log_call('G', M, d->N, d->K, 0, d->fp8, d->ws, d->ws_bytes,
             g_real->fp8_ws_bytes(g_real, FP8_OP_GROUPED, d->fp8, M, d->N, d->K, g->groups));
    g_real->gemm_grouped(g_real, d, g, A, B, C);
}
static void rec_swiglu(Backend* b, const GemmDesc* d, const GroupDesc* g, const void* A, const void* B, void* gu,
                       void* h, const float* sc) {
    const int M = g->host_off[g->groups];
    log_call('S', M, d->N, d->K, 0, d->fp8, d->ws, d->ws_bytes,
             g_real->fp8_ws_bytes(g_real, FP8_OP_GROUPED, d->fp8, M, d->N, d->K, g->groups));
    g_real->gemm_grouped_swiglu(g_real, d, g, A, B, gu, h, sc);
}
static void rec_wgrad(Backend* b, const GroupDesc* g, int N, int K, const void* dY, const void* X, void* dB, float beta) {
    const int M = g->host_off[g->groups];
    log_call('W', M, N, K, 1, g->fp8, g->ws, g->ws_bytes,
             g_real->fp8_ws_bytes(g_real, FP8_OP_WGRAD, g->fp8, M, N, K, g->groups));
    g_real->gemm_grouped_wgrad(g_real, g, N, K, dY, X, dB, beta);
}

static void test_fp8_wiring(void) {
    ModelConfig c = {.vocab_size = 48, .hidden = 32, .ffn = 40, .layers = 2, .heads = 4, .kv_heads = 2, .experts = 4,
                     .top_k = 2, .max_seq = 64, .rope_theta = 10000, .rms_eps = 1e-5f, .init_std = 0.02f,
                     .aux_coef = 0.02f};
    enum { B = 2, T = 8, N = B * T };
    const int H = 32, QKV = (4 + 2 * 2) * 8, QD = 32, V = 48, E = 4;
    int32_t tok[N], tgt[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(rng_u64(&rng) % V), tgt[i] = (int32_t)(rng_u64(&rng) % V);
    Backend rec = *be;
    g_real = be;
    rec.gemm = rec_gemm, rec.gemm_grouped = rec_grouped, rec.gemm_grouped_swiglu = rec_swiglu;
    rec.gemm_grouped_wgrad = rec_wgrad;
    for (int mode = FP8_NONE; mode <= FP8_LINEAR; mode++) {
        Model m;
        const ModelOpts o = {.fp8 = (Fp8Mode)mode};
        model_create_opts(&m, &c, B, T, &o, &rec, g_comm);
        for (int i = 0; i < m.pl.n; i++) {
            const ParamInfo* p = &m.pl.p[i];
            model_init_tensor(&c, p, 5, (float*)m.w[p->arena] + p->offset);
        }
        g_log.n = 0;
        MicroArgs a = {.tokens = tok, .targets = tgt, .backward = 1, .ce_scale = 1.0f / N, .aux_scale = c.aux_coef,
                       .fresh = 1};
        model_step(&m, &a);
        const int proj = mode == FP8_LINEAR, ex = mode != FP8_NONE;
        int counts[4] = {0}, bad = 0;
        for (int i = 0; i < g_log.n; i++) {
            const __typeof__(g_log.c[0])* k = &g_log.c[i];
            int want = -1;
            if (k->what == 'S' || k->what == 'G') want = ex ? FP8_WEIGHT : FP8_OFF, counts[k->what == 'S']++;
            else if (k->what == 'W') want = ex ? FP8_ACT : FP8_OFF, counts[2]++;
            else if (k->N == E || k->M == E || k->K == E || k->N == V || k->M == V || k->K == V) want = FP8_OFF;  // router, lm_head
            else if ((k->N == QKV && k->K == H) || (k->N == H && k->K == QD) || (k->N == QD && k->K == H && !k->ta) ||
                     (k->N == H && k->K == QKV))
                want = proj ? FP8_WEIGHT : FP8_OFF, counts[3]++;  // projections: forward, data gradient
            else if (k->ta && (k->M == QD || k->M == QKV) && k->K == N)
                want = proj ? FP8_ACT : FP8_OFF, counts[3]++;  // projections: weight gradient
            if (k->fp8 != want || !k->ws_ok) {
                if (!bad++)
                    printf("  fp8=%s: call %d '%c' M=%d N=%d K=%d ta=%d: fp8 %d (want %d), workspace %s\n",
                           fp8_mode_name(mode), i, k->what, k->M, k->N, k->K, k->ta, k->fp8, want,
                           k->ws_ok ? "ok" : "missing or short");
            }
        }
        EXPECT(bad == 0, "fp8=%s: %d GEMM call(s) in the wrong mode or without a workspace", fp8_mode_name(mode), bad);
        // per layer: w13 (fused) once, w2 forward and both data gradients, both weight gradients; 6 projection GEMMs
        EXPECT(counts[1] == 2 && counts[0] == 6 && counts[2] == 4 && counts[3] == 12,
               "fp8=%s: %d fused, %d grouped, %d wgrad, %d projection GEMMs", fp8_mode_name(mode), counts[1], counts[0],
               counts[2], counts[3]);
        model_free(&m);
    }
}

// A stand-in for a GPU backend's fp8_ws_bytes: any size function serves the arena planning
static size_t g_fake_ws_div;
static size_t fake_fp8_ws(Backend* b, Fp8Op op, Fp8Gemm f, int M, int N, int K, int groups) {
    (void)b, (void)op, (void)groups;
    return f == FP8_OFF ? 0 : (size_t)(M + N) * (size_t)K * 8 / g_fake_ws_div;
}

// The FP8 workspace in the MoE's per-layer arena (moe_plan_bumps), planned as a bf16 GPU run plans
// it: with the attention backward's dS room (here 327,680 bytes against 202,752 of rows: B 1 × T 256,
// 4 heads, R = 512 rows of F + H = 192 bf16) a workspace that fits beside the rows adds nothing; a
// larger one grows the arena to rows + workspace; in fp32 (no dS room) it always adds. The plan agrees.
static void test_fp8_arena(void) {
    ModelConfig c = {.vocab_size = 32, .hidden = 64, .ffn = 128, .layers = 1, .heads = 4, .kv_heads = 2, .experts = 4,
                     .top_k = 2, .max_seq = 256, .rope_theta = 10000, .rms_eps = 1e-5f, .init_std = 0.02f};
    Backend gpu = *be;
    gpu.act_dtype = DTYPE_BF16;
    gpu.fp8_ws_bytes = fake_fp8_ws;
    const size_t room = 512 * (192 * 2 + 8) + 8 * 256, ds = 4 * 10 * 64 * 64 * 2;
    const struct { DType dt; size_t div; } cases[] = {{DTYPE_BF16, 32}, {DTYPE_BF16, 1}, {DTYPE_F32, 32}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gpu.act_dtype = cases[i].dt;
        g_fake_ws_div = cases[i].div;
        const size_t rows = cases[i].dt == DTYPE_BF16 ? room : 512 * (192 * 4 + 8) + 8 * 256;
        size_t planned[2];
        Model m[2];
        for (int f = 0; f < 2; f++) {
            const ModelOpts o = {.fp8 = f ? FP8_EXPERTS : FP8_NONE};
            model_create_opts(&m[f], &c, 1, 256, &o, &gpu, g_comm);
            planned[f] = bump_planned(&m[f].tmp);
        }
        const size_t ws = m[1].fp8_ws, want_none = cases[i].dt == DTYPE_BF16 ? ds : rows;
        const size_t want = rows + ws > want_none ? rows + ws : want_none;
        EXPECT(planned[0] == want_none && planned[1] == want && ws > 0,
               "%s, workspace %zu: arena %zu without FP8 (want %zu), %zu with (want %zu)",
               cases[i].dt == DTYPE_BF16 ? "bf16" : "fp32", ws, planned[0], want_none, planned[1], want);
        if (i == 0) EXPECT(planned[1] == planned[0], "bf16: the small workspace fits in the dS room");
        if (i > 0) EXPECT(planned[1] > planned[0], "the arena grows for a workspace that does not fit");
        for (int f = 0; f < 2; f++) model_free(&m[f]);
    }
}

// train.keep_swiglu with FP8: the forward keeps h's codes for w2's weight gradient (MoeSaved.hq,
// Backend.fp8_xcodes_make) instead of h, and the backward reads them instead of recomputing h and
// quantising it: the same codes, so the loss and every gradient are the bits of keep_swiglu off. The
// arenas hold them as planned, and `plan` counts at least their bytes, fewer than h's.
static void test_fp8_keep_swiglu(void) {
    const ModelConfig c = small_model();
    enum { B = 2, T = 40, N = B * T };
    int32_t tok[N], tgt[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(rng_u64(&rng) % 32), tgt[i] = (int32_t)(rng_u64(&rng) % 32);
    for (int mode = FP8_EXPERTS; mode <= FP8_LINEAR; mode++) {
        float* g[2][2];
        StepLoss l[2];
        for (int keep = 0; keep < 2; keep++) {
            Model m;
            const ModelOpts o = {.fp8 = (Fp8Mode)mode, .keep_swiglu = keep};
            model_create_opts(&m, &c, B, T, &o, be, g_comm);
            l[keep] = small_step(&m, &c, tok, tgt, N);
            const MoeSaved* s = &m.ls[1].moe;
            EXPECT(keep ? s->hq && !s->h : !s->hq && !s->h, "fp8=%s keep_swiglu=%d: the layer kept h %p, its codes %p",
                   fp8_mode_name(mode), keep, s->h, s->hq);
            EXPECT(m.bump.grown == 0 && m.tmp.grown == 0, "fp8=%s keep_swiglu=%d: arenas grew (%zu, %zu)",
                   fp8_mode_name(mode), keep, m.bump.grown, m.tmp.grown);
            for (int ar = 0; ar < 2; ar++) g[keep][ar] = dup_f(m.grad[ar], m.numel[ar]);
            if (keep) {
                Config cfg;
                config_defaults(&cfg);
                cfg.model = c;
                cfg.train.micro_batch = B, cfg.train.global_batch = B, cfg.train.seq_len = T;
                cfg.train.device = DEVICE_CPU, cfg.train.keep_swiglu = 1, cfg.precision.fp8 = (Fp8Mode)mode;
                PlanMemory pm;
                Err e = {{0}};
                const double codes = (double)c.layers * be->fp8_xcodes_bytes(be, N * c.top_k, c.experts, c.ffn);
                const double h = (double)c.layers * N * c.top_k * c.ffn * sizeof(float);
                EXPECT(plan_memory(&cfg, 1, &pm, &e) == 0 && pm.kept_swiglu >= codes && pm.kept_swiglu < h,
                       "fp8=%s: plan counts %.0f bytes of kept h, the codes take %.0f, h %.0f", fp8_mode_name(mode),
                       pm.kept_swiglu, codes, h);
            }
            for (int ar = 0; ar < 2; ar++)
                EXPECT(!memcmp(g[keep][ar], g[0][ar], sizeof(float) * m.numel[ar]),
                       "fp8=%s: arena %d's gradients differ with h's codes kept", fp8_mode_name(mode), ar);
            model_free(&m);
        }
        EXPECT(l[1].ce_sum == l[0].ce_sum && l[1].aux == l[0].aux, "fp8=%s: loss %.9g with h's codes kept, %.9g without",
               fp8_mode_name(mode), l[1].ce_sum, l[0].ce_sum);
        for (int k = 0; k < 2; k++) free(g[k][0]), free(g[k][1]);
    }
}

// Kept weight codes (ModelOpts.fp8_wcodes) lie in the expert gradient arena past its gradients, one
// layer's w13 and w2 after another on 256 bytes (fp32 gradients here, so past all of the arena's
// fp32 room; with bf16 gradients in its unused half: the GPU's test_cuda_model), and a fresh
// backward on them gives per_gemm's loss and gradients bit for bit. That the GEMMs read the codes,
// not the weights, the op tests show with the weights poisoned (test_cpu_gemm_fp8).
static void test_fp8_wcodes_place(void) {
    rng_seed(&rng, 33);
    const ModelConfig c = small_model();
    enum { B = 2, T = 40, N = B * T };
    int32_t tok[N], tgt[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(rng_u64(&rng) % 32), tgt[i] = (int32_t)(rng_u64(&rng) % 32);
    float* g[2][2];
    StepLoss l[2];
    for (int kept = 0; kept < 2; kept++) {
        Model m;
        const ModelOpts o = {.fp8 = FP8_EXPERTS, .fp8_wcodes = kept};
        model_create_opts(&m, &c, B, T, &o, be, g_comm);
        if (kept) {
            const char* ga = (const char*)m.grad[ARENA_EXPERT];
            const size_t past = sizeof(float) * m.padded[ARENA_EXPERT];
            int ok = m.wq && m.wq_off >= past && m.wq_off % 256 == 0 && m.wq_bytes > 0;
            size_t want = 0;
            for (int i = 0; ok && i < 2 * c.layers; i++) {
                const Fp8WCodes* w = &m.wq[i];
                ok = (const char*)w->codes == ga + m.wq_off + want;
                want += (be->fp8_wcodes_bytes(be, w->R, w->C, w->groups) + 255) / 256 * 256;
            }
            EXPECT(ok && want == m.wq_bytes, "the codes follow one another from byte %zu of the gradient arena (%zu)",
                   m.wq_off, past);
        } else {
            EXPECT(!m.wq && m.wq_bytes == 0, "per_gemm keeps no codes");
        }
        l[kept] = small_step(&m, &c, tok, tgt, N);
        for (int ar = 0; ar < 2; ar++) g[kept][ar] = dup_f(m.grad[ar], m.numel[ar]);
        if (kept)
            for (int ar = 0; ar < 2; ar++)
                EXPECT(!memcmp(g[1][ar], g[0][ar], sizeof(float) * m.numel[ar]),
                       "arena %d's gradients differ with the codes kept", ar);
        model_free(&m);
    }
    EXPECT(l[1].ce_sum == l[0].ce_sum && l[1].aux == l[0].aux, "loss %.9g with the codes kept, %.9g without",
           l[1].ce_sum, l[0].ce_sum);
    for (int k = 0; k < 2; k++) free(g[k][0]), free(g[k][1]);
}

// A backend without FP8 GEMMs (fp8_ws_bytes NULL: CUDA below compute capability 9.0) is refused
// for fp8 experts and linear with a message naming the key, the backend and the way out.
static void test_fp8_refused(void) {
    Backend nofp8 = *be;
    nofp8.fp8_ws_bytes = NULL;
    nofp8.name = "cuda";
    nofp8.device = "Tesla V100";
    Err e = {{0}};
    EXPECT(model_fp8_check(&nofp8, FP8_NONE, &e) == 0, "fp8 none needs nothing");
    EXPECT(model_fp8_check(be, FP8_LINEAR, &e) == 0, "the CPU backend has FP8 GEMMs");
    EXPECT(model_fp8_check(&nofp8, FP8_EXPERTS, &e) == -1 && strstr(e.msg, "precision.fp8=experts") &&
               strstr(e.msg, "Tesla V100") && strstr(e.msg, "precision.fp8=none"),
           "refused: %s", e.msg);
}

// precision.fp8_weights=per_step (ModelOpts.fp8_wcodes): a step's first micro-batch (MicroArgs.fresh)
// makes the kept weight codes, so a backward that is not fresh before any fresh one would read
// codes never made: model_step ends the process (FATAL) naming the key. Each case runs in a child
// forked before this process starts MPI (the child starts its own), stderr to a file: not fresh
// first must die with the message; fresh then not fresh (the control) must exit 0.
static int wq_child(int fresh_first) {
    int argc = 1;
    char arg0[] = "test_model", *args[] = {arg0, NULL}, **argv = args;
    int world;
    dist_init(&argc, &argv, &world);
    Backend* b = cpu_backend_create();
    Comm* comm = comm_mpi_create(1);
    ModelConfig c = {.vocab_size = 32, .hidden = 16, .ffn = 24, .layers = 2, .heads = 4, .kv_heads = 2, .experts = 4,
                     .top_k = 2, .max_seq = 64, .rope_theta = 10000, .rms_eps = 1e-5f, .init_std = 0.3f,
                     .aux_coef = 0.02f, .z_coef = 1e-3f};
    enum { B = 2, T = 8 };
    int32_t tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) tok[i] = i % 32, tgt[i] = (3 * i + 1) % 32;
    Model m;
    const ModelOpts o = {.fp8 = FP8_EXPERTS, .fp8_wcodes = 1};
    model_create_opts(&m, &c, B, T, &o, b, comm);
    for (int i = 0; i < m.pl.n; i++) model_init_tensor(&c, &m.pl.p[i], 7, (float*)m.w[m.pl.p[i].arena] + m.pl.p[i].offset);
    for (int j = fresh_first ? 0 : 1; j < 2; j++) {
        MicroArgs a = {.tokens = tok, .targets = tgt, .backward = 1, .ce_scale = 1.0f / (B * T), .fresh = j == 0};
        model_step(&m, &a);
    }
    model_free(&m);
    comm->destroy(comm);
    b->destroy(b);
    dist_finalize();
    return 0;
}
static int wq_case(int fresh_first, char* err, size_t n) {
    char path[] = "/tmp/moetrain_test_wq_XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 2);
        _exit(wq_child(fresh_first));
    }
    int st = 0;
    waitpid(pid, &st, 0);
    const ssize_t got = pread(fd, err, n - 1, 0);
    err[got > 0 ? got : 0] = 0;
    close(fd);
    unlink(path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
static void test_fp8_wcodes_refused(void) {
    char err[4096];
    int rc = wq_case(0, err, sizeof err);
    EXPECT(rc != 0 && strstr(err, "precision.fp8_weights=per_step") && strstr(err, "not fresh"),
           "a backward that is not fresh first: exit %d, stderr: %s", rc, err);
    rc = wq_case(1, err, sizeof err);
    EXPECT(rc == 0, "fresh, then not fresh (the control): exit %d, stderr: %s", rc, err);
}

int main(int argc, char** argv) {
    RUN(test_fp8_wcodes_refused);  // first: its children start MPI themselves
    int world;
    dist_init(&argc, &argv, &world);
    be = cpu_backend_create();
    g_comm = comm_mpi_create(1);
    rng_seed(&rng, 42);
    RUN(test_fp8_modes);
    RUN(test_fp8_wiring);
    RUN(test_fp8_arena);
    RUN(test_fp8_keep_swiglu);
    RUN(test_fp8_wcodes_place);
    RUN(test_fp8_refused);
    g_comm->destroy(g_comm);
    be->destroy(be);
    dist_finalize();
    TEST_END();
}
