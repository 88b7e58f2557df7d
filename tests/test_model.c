// test_model.c — src/model.c on the CPU backend (the executable spec): the whole model's gradient
// by finite differences, gradient accumulation over micro-batches, fresh gradients, the MoE
// exchange path at EP = 1 (failpoint moe.force_exchange) and keeping the SwiGLU output, each
// against the plain path; packed documents against each document run alone. (precision.fp8:
// tests/test_model_fp8.c; each op's own checks: tests/test_cpu_<source>.c.)
//
// Method: for the loss L(w) and a random direction u, the analytic directional derivative
// ⟨∇L, u⟩ is compared with the central difference (L(w + εu) − L(w − εu)) / 2ε.
//
// Tolerance (relative error of the directional derivative), and why:
//   TOL_MODEL 2e-2  the whole model: many fp32 ops; ε kept small (1e-3) so no top-k choice flips
//   TOL_DOCS  2e-6  packed documents vs each run alone (relative L2 of a gradient arena, relative
//                   loss): the same math, fp32 sums in another order (the weight-gradient GEMMs sum
//                   over 48 tokens or over one document's); seen 1.0e-7 (gradients), 1e-8 (loss)
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "comm.h"
#include "data.h"
#include "model.h"
#include "optim.h"
#include "plan.h"
#include "test.h"

#define TOL_MODEL 2e-2
#define TOL_DOCS 2e-6

static Backend* be;
static Rng rng;

static float* randv(size_t n, float s) {
    float* p = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) p[i] = s * rng_normal(&rng);
    return p;
}
static double dotd(const float* a, const float* b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}
static double relerr(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-6); }

// ---- the whole model ---------------------------------------------------------------------------

static Comm* g_comm;

static void test_model_grad(void) {
    ModelConfig c = {.vocab_size = 32, .hidden = 16, .ffn = 24, .layers = 2, .heads = 4, .kv_heads = 2, .experts = 4,
                     .top_k = 2, .max_seq = 64, .rope_theta = 10000, .rms_eps = 1e-5f, .init_std = 0.3f,
                     .aux_coef = 0.02f, .z_coef = 0.01f};
    enum { B = 2, T = 8, N = B * T };
    Model m;
    model_create(&m, &c, B, T, be, g_comm);
    rng_seed(&rng, 4242);  // its own draw: the tests before it may use any number of values
    // The finite difference is the derivative only where no token changes experts within ±eps
    // (top-k is a step function of the weights): random weights are drawn until every token's
    // k-th router logit leads the next one by at least MIN_GAP, and the ±eps forwards are then
    // checked to route as the base one does.
    const float MIN_GAP = 0.01f;
    const size_t n0 = m.padded[0], n1 = m.padded[1];
    float* w0 = m.w[0];
    float* w1 = m.w[1];
    int32_t tok[N], tgt[N];
    const float ce_scale = 1.0f / (float)(N - B);
    MicroArgs a = {.tokens = tok, .targets = tgt, .ce_scale = ce_scale, .aux_scale = c.aux_coef, .z_scale = c.z_coef};
    float gap = 0;
    for (int draw = 0; draw < 8 && gap < MIN_GAP; draw++) {
        for (size_t i = 0; i < m.numel[0]; i++) w0[i] = 0.3f * rng_normal(&rng);
        for (size_t i = 0; i < m.numel[1]; i++) w1[i] = 0.3f * rng_normal(&rng);
        for (int i = 0; i < m.pl.n; i++)
            if (m.pl.p[i].no_decay)
                for (size_t j = 0; j < m.pl.p[i].numel; j++) w0[m.pl.p[i].offset + j] = 1.0f + 0.2f * rng_normal(&rng);
        for (int i = 0; i < N; i++)
            tok[i] = (int32_t)(rng_u64(&rng) % 32), tgt[i] = i % T == T - 1 ? -1 : (int32_t)(rng_u64(&rng) % 32);
        model_step(&m, &a);  // forward only
        gap = INFINITY;
        for (int l = 0; l < c.layers; l++)
            for (int n = 0; n < N; n++) {  // k-th largest logit minus the (k+1)-th, k = 2 of 4
                float v[4];
                memcpy(v, m.ls[l].moe.logits + n * 4, sizeof v);
                for (int i = 0; i < 4; i++)
                    for (int j = i + 1; j < 4; j++)
                        if (v[j] > v[i]) { const float t = v[i]; v[i] = v[j], v[j] = t; }
                gap = fminf(gap, v[1] - v[2]);
            }
    }
    EXPECT(gap >= MIN_GAP, "random weights with every routing decision %g clear (got %g)", MIN_GAP, gap);
    a.backward = 1, a.fresh = 1;
    StepLoss l0 = model_step(&m, &a);
    EXPECT(isfinite(l0.ce_sum) && l0.ntok == N - B, "forward ok");
    int32_t route0[2][N * 2];
    for (int l = 0; l < c.layers; l++) memcpy(route0[l], m.ls[l].moe.topk, sizeof route0[l]);
    float *u0 = randv(n0, 1), *u1 = randv(n1, 1);
    const double an = dotd(m.grad[0], u0, m.numel[0]) + dotd(m.grad[1], u1, m.numel[1]);
    float* b0 = xmalloc(sizeof(float) * n0);
    float* b1 = xmalloc(sizeof(float) * n1);
    memcpy(b0, w0, sizeof(float) * n0);
    memcpy(b1, w1, sizeof(float) * n1);
    const float eps = 1e-4f;  // moves the router logits by ~5e-3 here, less than MIN_GAP
    double L[2];
    a.backward = 0, a.fresh = 0;
    for (int s = 0; s < 2; s++) {
        for (size_t i = 0; i < m.numel[0]; i++) w0[i] = b0[i] + (s ? -eps : eps) * u0[i];
        for (size_t i = 0; i < m.numel[1]; i++) w1[i] = b1[i] + (s ? -eps : eps) * u1[i];
        StepLoss l = model_step(&m, &a);
        L[s] = l.ce_sum * ce_scale + c.aux_coef * l.aux + c.z_coef * l.z;
        for (int k = 0; k < c.layers; k++)
            EXPECT(!memcmp(route0[k], m.ls[k].moe.topk, sizeof route0[k]), "layer %d routes as the base forward at %+g",
                   k, s ? -eps : eps);
    }
    const double fd = (L[0] - L[1]) / (2 * eps);
    EXPECT(relerr(an, fd) < TOL_MODEL, "whole model: analytic %g vs finite difference %g", an, fd);
    free(u0), free(u1), free(b0), free(b1);
    model_free(&m);
}

static void test_grad_accumulation(void) {
    // one micro-batch of 4 sequences == two of 2 (same global batch): same gradient
    ModelConfig c = {.vocab_size = 32, .hidden = 16, .ffn = 24, .layers = 1, .heads = 4, .kv_heads = 2, .experts = 4,
                     .top_k = 2, .max_seq = 64, .rope_theta = 10000, .rms_eps = 1e-5f, .init_std = 0.3f,
                     .aux_coef = 0.0f, .z_coef = 0.0f};
    enum { T = 8 };
    int32_t tok[4 * T], tgt[4 * T];
    for (int i = 0; i < 4 * T; i++) tok[i] = (int32_t)(rng_u64(&rng) % 32), tgt[i] = (int32_t)(rng_u64(&rng) % 32);
    float* g[2];
    for (int v = 0; v < 2; v++) {
        const int B = v == 0 ? 4 : 2;
        Model m;
        model_create(&m, &c, B, T, be, g_comm);
        for (int i = 0; i < m.pl.n; i++) {
            const ParamInfo* p = &m.pl.p[i];
            model_init_tensor(&c, p, 7, (float*)m.w[p->arena] + p->offset);
        }
        for (int j = 0; j < 4 / B; j++) {
            MicroArgs a = {.tokens = tok + j * B * T, .targets = tgt + j * B * T, .backward = 1, .ce_scale = 1.0f / (4 * T)};
            model_step(&m, &a);
        }
        g[v] = xmalloc(sizeof(float) * m.numel[0]);
        memcpy(g[v], m.grad[0], sizeof(float) * m.numel[0]);
        if (v == 1) EXPECT(rel_l2(g[1], g[0], m.numel[0]) < 1e-5, "accumulated gradient: %g", rel_l2(g[1], g[0], m.numel[0]));
        model_free(&m);
    }
    free(g[0]), free(g[1]);
}

// MicroArgs.fresh: the first micro-batch of a step overwrites the gradients (the trainer does not
// zero them between steps). Grad arenas full of NaN + fresh, then a second micro-batch with
// accumulation, must equal zeroed arenas + two accumulating micro-batches, element for element,
// in both arenas (every gradient element written by the first micro-batch).
static void test_fresh_gradients(void) {
    ModelConfig c = {.vocab_size = 32, .hidden = 16, .ffn = 24, .layers = 2, .heads = 4, .kv_heads = 2, .experts = 4,
                     .top_k = 2, .max_seq = 64, .rope_theta = 10000, .rms_eps = 1e-5f, .init_std = 0.3f,
                     .aux_coef = 0.02f, .z_coef = 1e-3f};
    enum { B = 2, T = 8 };
    int32_t tok[2 * B * T], tgt[2 * B * T];
    for (int i = 0; i < 2 * B * T; i++) tok[i] = (int32_t)(rng_u64(&rng) % 32), tgt[i] = (int32_t)(rng_u64(&rng) % 32);
    float* g[2][2];
    for (int v = 0; v < 2; v++) {
        Model m;
        model_create(&m, &c, B, T, be, g_comm);
        for (int i = 0; i < m.pl.n; i++) {
            const ParamInfo* p = &m.pl.p[i];
            model_init_tensor(&c, p, 11, (float*)m.w[p->arena] + p->offset);
        }
        for (int a = 0; a < 2; a++)
            for (size_t i = 0; i < m.numel[a]; i++) m.grad[a][i] = v ? NAN : 0.f;
        for (int j = 0; j < 2; j++) {
            MicroArgs a = {.tokens = tok + j * B * T, .targets = tgt + j * B * T, .backward = 1, .ce_scale = 1.0f / (2 * B * T),
                           .aux_scale = c.aux_coef / 2, .z_scale = c.z_coef / 2, .fresh = v && j == 0};
            model_step(&m, &a);
        }
        for (int a = 0; a < 2; a++) {
            g[v][a] = xmalloc(sizeof(float) * m.numel[a]);
            memcpy(g[v][a], m.grad[a], sizeof(float) * m.numel[a]);
        }
        if (v == 1)
            for (int a = 0; a < 2; a++) {
                size_t diff = 0, nz = 0;
                for (size_t i = 0; i < m.numel[a]; i++) diff += !(g[1][a][i] == g[0][a][i]), nz += g[0][a][i] != 0.f;
                EXPECT(diff == 0, "arena %d: %zu of %zu gradient elements differ (fresh vs zeroed)", a, diff, m.numel[a]);
                EXPECT(nz > m.numel[a] / 2, "arena %d: gradients are mostly non-zero (%zu of %zu)", a, nz, m.numel[a]);
            }
        model_free(&m);
    }
    for (int v = 0; v < 2; v++) free(g[v][0]), free(g[v][1]);
}

// MOETRAIN_FORCE_EXCHANGE (Model.force_exchange): at EP = 1 the dispatcher's exchange path
// (all_to_all_v over a group of one, block reorders) must give exactly the direct path's loss and
// gradients: the same rows in the same order.
static void forced_exchange_case(Fp8Mode f) {
    ModelConfig c = {.vocab_size = 32, .hidden = 16, .ffn = 24, .layers = 2, .heads = 4, .kv_heads = 2, .experts = 4,
                     .top_k = 2, .max_seq = 64, .rope_theta = 10000, .rms_eps = 1e-5f, .init_std = 0.3f,
                     .aux_coef = 0.02f, .z_coef = 1e-3f};
    enum { B = 2, T = 8 };
    int32_t tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)(rng_u64(&rng) % 32), tgt[i] = (int32_t)(rng_u64(&rng) % 32);
    float* g[2][2];
    double loss[2];
    for (int v = 0; v < 2; v++) {
        Model m;
        const ModelOpts o = {.fp8 = f};
        model_create_opts(&m, &c, B, T, &o, be, g_comm);
        m.force_exchange = v;
        for (int i = 0; i < m.pl.n; i++) {
            const ParamInfo* p = &m.pl.p[i];
            model_init_tensor(&c, p, 5, (float*)m.w[p->arena] + p->offset);
        }
        MicroArgs a = {.tokens = tok, .targets = tgt, .backward = 1, .ce_scale = 1.0f / (B * T), .aux_scale = c.aux_coef,
                       .z_scale = c.z_coef};
        StepLoss l = model_step(&m, &a);
        loss[v] = l.ce_sum + l.aux + l.z;
        if (v == 0)  // at EP = 1 the MoE arenas are planned exactly (N·k rows, no slack): no growth
            EXPECT(m.bump.grown == 0 && m.tmp.grown == 0, "MoE arenas grew at EP = 1 (saved %zu, scratch %zu chunks)",
                   m.bump.grown, m.tmp.grown);
        for (int ar = 0; ar < 2; ar++) {
            g[v][ar] = xmalloc(sizeof(float) * m.numel[ar]);
            memcpy(g[v][ar], m.grad[ar], sizeof(float) * m.numel[ar]);
        }
        if (v == 1) {
            EXPECT(loss[1] == loss[0], "fp8=%s: loss %.9g (exchange path) vs %.9g (direct)", fp8_mode_name(f), loss[1],
                   loss[0]);
            for (int ar = 0; ar < 2; ar++)
                EXPECT(memcmp(g[1][ar], g[0][ar], sizeof(float) * m.numel[ar]) == 0,
                       "fp8=%s: arena %d gradients equal bit for bit", fp8_mode_name(f), ar);
        }
        model_free(&m);
    }
    for (int v = 0; v < 2; v++) free(g[v][0]), free(g[v][1]);
}
// and with the FP8 GEMMs, whose workspace sits beside the exchange path's buffers in the scratch
static void test_forced_exchange(void) {
    forced_exchange_case(FP8_NONE);
    forced_exchange_case(FP8_LINEAR);
}

// train.keep_swiglu (ModelOpts.keep_swiglu): the backward reads the SwiGLU output h the forward
// saved instead of recomputing it. Same rows, same op, so the loss and every gradient must be
// bit for bit the ones of the recompute, on the direct and the exchange path; with a forward-only
// pass (eval) between two accumulating micro-batches, which must not keep h. The saved arena
// grows by exactly what `plan` predicts (R·F fp32 per layer) and is planned large enough.
static void test_keep_swiglu(void) {
    ModelConfig c = {.vocab_size = 32, .hidden = 16, .ffn = 24, .layers = 2, .heads = 4, .kv_heads = 2, .experts = 4,
                     .top_k = 2, .max_seq = 64, .rope_theta = 10000, .rms_eps = 1e-5f, .init_std = 0.3f,
                     .aux_coef = 0.02f, .z_coef = 1e-3f};
    enum { B = 2, T = 8, N = B * T };
    int32_t tok[3 * N], tgt[3 * N];
    for (int i = 0; i < 3 * N; i++) tok[i] = (int32_t)(rng_u64(&rng) % 32), tgt[i] = (int32_t)(rng_u64(&rng) % 32);
    // what plan.c predicts for the kept h: the same model on the CPU (fp32), EP = 1
    Config cfg;
    config_defaults(&cfg);
    cfg.model = c;
    cfg.train.micro_batch = B, cfg.train.global_batch = B, cfg.train.seq_len = T, cfg.train.device = DEVICE_CPU;
    PlanMemory pm[2];
    Err e = {{0}};
    for (int keep = 0; keep < 2; keep++) {
        cfg.train.keep_swiglu = keep;
        EXPECT(plan_memory(&cfg, 1, &pm[keep], &e) == 0, "plan: %s", e.msg);
    }
    const double want_h = (double)c.layers * N * c.top_k * c.ffn * sizeof(float);
    EXPECT(pm[1].kept_swiglu == want_h && pm[0].kept_swiglu == 0, "plan: kept h %.0f bytes, want %.0f", pm[1].kept_swiglu,
           want_h);
    EXPECT(pm[1].act_saved - pm[0].act_saved == want_h && pm[1].act_scratch == pm[0].act_scratch &&
               pm[1].total - pm[0].total == want_h,
           "plan: keep_swiglu adds R·F·4 per layer to the saved activations only");
    for (int xchg = 0; xchg < 2; xchg++) {
        float* g[2][2];
        double loss[2][3];
        size_t arena[2] = {0, 0};
        for (int keep = 0; keep < 2; keep++) {
            Model m;
            const ModelOpts o = {.keep_swiglu = keep};
            model_create_opts(&m, &c, B, T, &o, be, g_comm);
            m.force_exchange = xchg;
            for (int i = 0; i < m.pl.n; i++) {
                const ParamInfo* p = &m.pl.p[i];
                model_init_tensor(&c, p, 13, (float*)m.w[p->arena] + p->offset);
            }
            bump_all(&m.bump, &arena[keep]);  // the planned saved arena, bytes
            for (int j = 0; j < 3; j++) {  // train, eval (forward only), train (accumulates)
                MicroArgs a = {.tokens = tok + j * N, .targets = tgt + j * N, .backward = j != 1,
                               .ce_scale = 1.0f / (2 * N), .aux_scale = c.aux_coef / 2, .z_scale = c.z_coef / 2,
                               .fresh = j == 0};
                StepLoss l = model_step(&m, &a);
                loss[keep][j] = l.ce_sum + l.aux + l.z;
                for (int ly = 0; ly < c.layers; ly++)
                    EXPECT((m.ls[ly].moe.h != NULL) == (keep && j != 1), "layer %d micro-batch %d: h %s", ly, j,
                           m.ls[ly].moe.h ? "kept" : "not kept");
            }
            if (!xchg)  // EP = 1: planned exactly, no growth with the kept h either
                EXPECT(m.bump.grown == 0 && m.tmp.grown == 0, "keep %d: MoE arenas grew (saved %zu, scratch %zu chunks)",
                       keep, m.bump.grown, m.tmp.grown);
            for (int ar = 0; ar < 2; ar++) {
                g[keep][ar] = xmalloc(sizeof(float) * m.numel[ar]);
                memcpy(g[keep][ar], m.grad[ar], sizeof(float) * m.numel[ar]);
            }
            if (keep) {
                for (int j = 0; j < 3; j++)
                    EXPECT(loss[1][j] == loss[0][j], "exchange %d micro-batch %d: loss %.9g (kept h) vs %.9g (recomputed)",
                           xchg, j, loss[1][j], loss[0][j]);
                for (int ar = 0; ar < 2; ar++) {
                    size_t diff = 0;
                    for (size_t i = 0; i < m.numel[ar]; i++) diff += memcmp(&g[1][ar][i], &g[0][ar][i], sizeof(float)) != 0;
                    EXPECT(diff == 0, "exchange %d arena %d: %zu of %zu gradient elements differ (kept h vs recomputed)",
                           xchg, ar, diff, m.numel[ar]);
                }
            }
            model_free(&m);
        }
        // the planned saved arena: R·F fp32 and one 256-byte alignment more per layer
        const size_t want = (size_t)want_h + 256 * (size_t)c.layers;
        EXPECT(arena[1] - arena[0] == want, "saved arena %zu → %zu bytes, want +%zu", arena[0], arena[1], want);
        for (int v = 0; v < 2; v++) free(g[v][0]), free(g[v][1]);
    }
}

// Packed documents (data.documents): a micro-batch of windows holding several documents gives the
// loss and every gradient of its documents run one by one, each as a window of its own length
// (block-diagonal attention, positions restarting at 0, the separator's prediction of the next
// document not scored). The reference sums the separate runs' losses and gradients in double.
static void test_model_documents(void) {
    ModelConfig c = {.vocab_size = 32, .hidden = 16, .ffn = 24, .layers = 2, .heads = 4, .kv_heads = 2, .experts = 4,
                     .top_k = 2, .max_seq = 64, .rope_theta = 10000, .rms_eps = 1e-5f, .init_std = 0.3f,
                     .aux_coef = 0.0f, .z_coef = 0.0f};  // the router losses are per micro-batch, not per document
    enum { B = 2, T = 24, N = B * T, SEP = 3 };
    int32_t win[B][T + 1], tok[N], tgt[N], doc[N], pos[N];
    for (int b = 0; b < B; b++)
        for (int t = 0; t <= T; t++) win[b][t] = 4 + (int32_t)(rng_u64(&rng) % 28);
    // window 0: documents of 5, 1 (the separator alone), 10 and 8 tokens (the last one runs on past
    // the window); window 1: 11 and 13
    win[0][4] = win[0][5] = win[0][15] = SEP;
    win[1][10] = SEP;
    int scored = 0;
    for (int b = 0; b < B; b++) {
        data_doc_starts(win[b], T, SEP, doc + b * T);
        for (int t = 0; t < T; t++) {
            tok[b * T + t] = win[b][t];
            tgt[b * T + t] = win[b][t] == SEP ? -1 : win[b][t + 1];
            pos[b * T + t] = t - doc[b * T + t];
            scored += tgt[b * T + t] >= 0;
        }
    }
    EXPECT(doc[5] == 5 && doc[6] == 6 && doc[15] == 6 && doc[16] == 16 && doc[T + 10] == 0 && doc[T + 11] == 11,
           "document starts from the separators");
    const float ce_scale = 1.0f / (float)scored;
    Model m;
    model_create(&m, &c, B, T, be, g_comm);
    for (int i = 0; i < m.pl.n; i++) model_init_tensor(&c, &m.pl.p[i], 21, (float*)m.w[m.pl.p[i].arena] + m.pl.p[i].offset);
    MicroArgs a = {.tokens = tok, .targets = tgt, .doc = doc, .pos = pos, .backward = 1, .fresh = 1, .ce_scale = ce_scale};
    StepLoss lp = model_step(&m, &a);
    EXPECT(lp.ntok == scored && scored == N - 4, "scored targets %lld of %d", (long long)lp.ntok, N);
    double* ref[2];
    for (int ar = 0; ar < 2; ar++) ref[ar] = xcalloc(m.numel[ar], sizeof(double));
    double ce_ref = 0;
    int ndocs = 0;
    for (int b = 0; b < B; b++)
        for (int t0 = 0; t0 < T;) {
            int n = 1;
            while (t0 + n < T && doc[b * T + t0 + n] == t0) n++;
            Model s;
            model_create(&s, &c, 1, n, be, g_comm);
            for (int i = 0; i < s.pl.n; i++)
                model_init_tensor(&c, &s.pl.p[i], 21, (float*)s.w[s.pl.p[i].arena] + s.pl.p[i].offset);
            MicroArgs sa = {.tokens = tok + b * T + t0, .targets = tgt + b * T + t0, .backward = 1, .fresh = 1,
                            .ce_scale = ce_scale};
            ce_ref += model_step(&s, &sa).ce_sum;
            for (int ar = 0; ar < 2; ar++)
                for (size_t i = 0; i < s.numel[ar]; i++) ref[ar][i] += s.grad[ar][i];
            model_free(&s);
            ndocs++;
            t0 += n;
        }
    EXPECT(ndocs == 6, "%d documents", ndocs);
    EXPECT(fabs(lp.ce_sum - ce_ref) <= TOL_DOCS * fabs(ce_ref), "CE sum packed %.9g vs documents alone %.9g", lp.ce_sum,
           ce_ref);
    for (int ar = 0; ar < 2; ar++) {
        double num = 0, den = 0;
        for (size_t i = 0; i < m.numel[ar]; i++) {
            const double d = m.grad[ar][i] - ref[ar][i];
            num += d * d, den += ref[ar][i] * ref[ar][i];
        }
        EXPECT(den > 0 && sqrt(num / den) < TOL_DOCS, "arena %d gradients: packed vs documents alone, rel L2 %.3g", ar,
               sqrt(num / den));
    }
    // the same window without documents is a different computation (the check above can fail)
    MicroArgs na = a;
    na.doc = NULL, na.pos = NULL;
    StepLoss ln = model_step(&m, &na);
    EXPECT(fabs(ln.ce_sum - ce_ref) > 1e-3 * fabs(ce_ref), "without documents the loss differs (%.6g vs %.6g)", ln.ce_sum,
           ce_ref);
    // RoPE scores depend on t − s only: within a document, positions counted from the window's
    // start give the same loss up to rounding (data.reset_positions changes rounding, not the math)
    na.doc = doc;
    StepLoss lm = model_step(&m, &na);
    EXPECT(fabs(lm.ce_sum - ce_ref) <= TOL_DOCS * fabs(ce_ref), "positions per window: CE %.9g vs %.9g", lm.ce_sum,
           ce_ref);
    for (int ar = 0; ar < 2; ar++) free(ref[ar]);
    model_free(&m);
}

int main(int argc, char** argv) {
    int world;
    dist_init(&argc, &argv, &world);
    be = cpu_backend_create();
    g_comm = comm_mpi_create(1);
    rng_seed(&rng, 42);
    RUN(test_model_grad);
    RUN(test_model_documents);
    RUN(test_grad_accumulation);
    RUN(test_fresh_gradients);
    RUN(test_forced_exchange);
    RUN(test_keep_swiglu);
    g_comm->destroy(g_comm);
    be->destroy(be);
    dist_finalize();
    TEST_END();
}
