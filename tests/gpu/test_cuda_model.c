// test_cuda_model.c — the whole model on the CUDA backend against the CPU backend (the spec):
// the same parameters and tokens through both, then the loss, every gradient and three AdamW
// steps compared. fp32 mode (TF32 off) is held tight; bf16 loose. The CUDA side runs over the
// NCCL communicator with one rank (the same dispatcher code path as EP > 1: all_to_all_v of
// size 1), so this is also the NCCL Comm's one-GPU check.
//
// The shapes are deliberately awkward: T = 77 (not a multiple of the 64-query attention tile),
// vocab 300, head dim 32. The router weights are drawn 50x wider than the other weights so that
// each token's top-2 experts are decided by clear margins: otherwise bf16 rounding flips
// near-ties in the routing and the expert gradients differ for reasons that are not errors.
//
// Tolerances (relative, and why):
//   fp32 loss 1e-5, gradients (rel L2 per tensor) 1e-5, masters after 3 steps 1e-5: only the
//        summation order and expf/logf ulps differ (the op tests see ≤ 5e-7 per op).
//   bf16 loss 1e-2: weights and activations are rounded to bf16 (2^-9 relative) at every op
//        boundary, ~25 of them between the input and the loss.
//   bf16 gradients 5e-2 rel L2 over each arena (dense, experts), with the worst tensor printed:
//        backward roundings compound through two layers; ~1-2e-2 is expected.
// GPU against GPU where two settings must give the same values (kept FP8 weight codes): bit for bit.
#define _DEFAULT_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "comm.h"
#include "model.h"
#include "optim.h"
#include "test.h"
#include "util.h"

enum { B = 2, T = 77, STEPS = 3 };
#define SEED 4242

typedef struct Side {
    Backend* be;
    Comm* comm;
    MasterMode master;  // precision.master (0 = split, the default; bf16 sides only)
    int egrad_act;      // ModelOpts.expert_grad_act: bf16 expert gradients
    Fp8Mode fp8;        // ModelOpts.fp8
    int wcodes;         // ModelOpts.fp8_wcodes: the expert weights' FP8 codes kept across a step
    Model m;
    Optim o;
} Side;

static ModelConfig mc;
static OptimConfig oc;
static int32_t tok[B * T], tgt[B * T];

static void side_init(Side* s) {
    const ModelOpts mo = {.expert_grad_act = s->egrad_act, .fp8 = s->fp8, .fp8_wcodes = s->wcodes};
    model_create_opts(&s->m, &mc, B, T, &mo, s->be, s->comm);
    optim_create(&s->o, &oc, 1, s->master, 10, &s->m);
    size_t max = 0;
    for (int i = 0; i < s->m.pl.n; i++) max = s->m.pl.p[i].numel > max ? s->m.pl.p[i].numel : max;
    float* h = xmalloc(sizeof(float) * max);
    for (int i = 0; i < s->m.pl.n; i++) {
        const ParamInfo* p = &s->m.pl.p[i];
        model_init_tensor(&mc, p, SEED, h);
        if (strstr(p->name, "mlp.gate.weight"))
            for (size_t j = 0; j < p->numel; j++) h[j] *= 50.f;
        s->be->to_device(s->be, s->m.grad[p->arena] + p->offset, h, sizeof(float) * p->numel);
    }
    free(h);
    optim_load_from_staging(&s->o, &s->m);
}

static void side_free(Side* s) {
    optim_free(&s->o, &s->m);
    model_free(&s->m);
}

static double step_loss(Side* s, int backward, int fresh) {
    MicroArgs a = {.tokens = tok, .targets = tgt, .backward = backward, .ce_scale = 1.0f / (B * T),
                   .aux_scale = mc.aux_coef, .z_scale = mc.z_coef, .fresh = fresh};
    StepLoss l = model_step(&s->m, &a);
    return l.ce_sum / (B * T) + mc.aux_coef * l.aux + mc.z_coef * l.z;
}

static float* arena_host(Side* s, int a) {
    float* h = xmalloc(sizeof(float) * s->m.numel[a]);
    s->be->to_host(s->be, h, s->m.grad[a], sizeof(float) * s->m.numel[a]);
    return h;
}

static Side cpu;
static Backend* g_gpu[2];  // fp32, bf16
static Comm* g_nccl[2];

// One forward+backward on both; loss and gradients compared. xchg: the GPU side's MoE layers go
// through the dispatcher's exchange path (NCCL all_to_all_v over a group of one).
static void compare_grads(int bf16, int xchg) {
    Side g = {.be = g_gpu[bf16], .comm = g_nccl[bf16]};
    side_init(&cpu);
    side_init(&g);
    g.m.force_exchange = xchg;
    const double lc = step_loss(&cpu, 1, 0), lg = step_loss(&g, 1, 0);
    const double tol_loss = bf16 ? 1e-2 : 1e-5;
    EXPECT(isfinite(lg) && fabs(lg - lc) <= tol_loss * fabs(lc), "loss cuda %.7f vs cpu %.7f", lg, lc);
    printf("     %s: loss cuda %.7f cpu %.7f (rel %.2g)\n", bf16 ? "bf16" : "fp32", lg, lc, fabs(lg - lc) / fabs(lc));
    double worst = 0;
    const char* wn = "";
    for (int a = 0; a < 2; a++) {
        float* hc = arena_host(&cpu, a);
        float* hg = arena_host(&g, a);
        const double ea = rel_l2(hg, hc, cpu.m.numel[a]);
        if (bf16) EXPECT(ea < 5e-2, "arena %d gradient rel L2 %.3g", a, ea);
        printf("     %s: %s-arena gradient rel L2 %.3g\n", bf16 ? "bf16" : "fp32", a ? "expert" : "dense", ea);
        for (int i = 0; i < cpu.m.pl.n; i++) {
            const ParamInfo* p = &cpu.m.pl.p[i];
            if ((int)p->arena != a) continue;
            const double e = rel_l2(hg + p->offset, hc + p->offset, p->numel);
            if (!bf16) EXPECT(e < 1e-5, "%s: gradient rel L2 %.3g", p->name, e);
            if (!(e <= worst)) worst = e, wn = p->name;
        }
        free(hc);
        free(hg);
    }
    printf("     %s: worst tensor gradient rel L2 %.3g (%s)\n", bf16 ? "bf16" : "fp32", worst, wn);
    side_free(&g);
    side_free(&cpu);
}

// STEPS AdamW steps on both: the loss trace, and (fp32) the masters afterwards. The GPU side
// runs as the trainer does: gradients never zeroed (poisoned with NaN before the first step),
// each step's micro-batch overwrites them (MicroArgs.fresh); the CPU side zeroes and adds.
static void compare_steps(int bf16) {
    Side g = {.be = g_gpu[bf16], .comm = g_nccl[bf16]};
    side_init(&cpu);
    side_init(&g);
    g.o.zero_grads = 0;
    for (int a = 0; a < 2; a++) {
        unsigned char* nan = xmalloc(sizeof(float) * g.m.numel[a]);
        memset(nan, 0xFF, sizeof(float) * g.m.numel[a]);
        g.be->to_device(g.be, g.m.grad[a], nan, sizeof(float) * g.m.numel[a]);
        free(nan);
    }
    const double tol = bf16 ? 2e-2 : 1e-5;
    double first = 0, last = 0;
    for (int s = 0; s < STEPS; s++) {
        const double lc = step_loss(&cpu, 1, 0), lg = step_loss(&g, 1, 1);
        EXPECT(isfinite(lg) && fabs(lg - lc) <= tol * fabs(lc), "step %d loss cuda %.7f vs cpu %.7f", s, lg, lc);
        printf("     %s step %d: loss cuda %.7f cpu %.7f\n", bf16 ? "bf16" : "fp32", s, lg, lc);
        if (s == 0) first = lg;
        last = lg;
        StepStats sc = optim_step(&cpu.o, &cpu.m, s, s + 1), sg = optim_step(&g.o, &g.m, s, s + 1);
        EXPECT(!sg.skipped && fabs(sg.grad_norm - sc.grad_norm) <= (bf16 ? 5e-2 : 1e-5) * sc.grad_norm,
               "step %d grad norm cuda %.6g vs cpu %.6g", s, sg.grad_norm, sc.grad_norm);
    }
    EXPECT(last < first, "the loss falls on the GPU: %.5f -> %.5f", first, last);
    if (!bf16)
        for (int a = 0; a < 2; a++) {
            optim_gather(&cpu.o, &cpu.m, a, 0);
            optim_gather(&g.o, &g.m, a, 0);
            float* hc = arena_host(&cpu, a);
            float* hg = arena_host(&g, a);
            const double e = rel_l2(hg, hc, cpu.m.numel[a]);
            EXPECT(e < 1e-5, "arena %d masters after %d steps rel L2 %.3g", a, STEPS, e);
            printf("     fp32: %s masters after %d steps rel L2 %.3g\n", a ? "expert" : "dense", STEPS, e);
            free(hc);
            free(hg);
        }
    side_free(&g);
    side_free(&cpu);
}

// The split masters at the trainer level, on the GPU in bf16: a side with split masters (S) and
// one with fp32 masters (F) from the same init; each step S runs the model (forward, backward),
// F receives S's gradients, and both run optim_step (norm, clipping, AdamW per tensor segment
// with its weight decay). Gradients are copied, not recomputed, so the GPU's run-to-run noise
// cannot enter: the optimizers must agree bit for bit.
//   - masters, m, v (optim_gather) bitwise equal after load and after every step;
//   - S's compute weights = the tie-away rounding of the master, F's = round-to-nearest-even
//     (adamw's copy), so they differ only at ties with an even truncation;
//   - a resume as trainer_restore does it (S's gathered masters staged into a fresh split side,
//     load, m and v scattered) gives S's compute weights and remainders bit for bit.
static uint16_t bf16_away(float x) {  // nearest, ties away from zero, by value (test_cpu_optim.c)
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint32_t hi = u >> 16, up_bits = (hi + 1) & 0xffffu;
    const double ax = fabs((double)x), t = fabs((double)bf16_to_f32((uint16_t)hi));
    const double up = (up_bits & 0x7fffu) == 0x7f80u ? ldexp(1, 128) : fabs((double)bf16_to_f32((uint16_t)up_bits));
    return (uint16_t)(up - ax <= ax - t ? hi + 1 : hi);
}

static float* gathered(Side* s, int a, int which) {  // optim_gather → host [padded]
    optim_gather(&s->o, &s->m, a, which);
    float* h = xmalloc(sizeof(float) * s->m.padded[a]);
    s->be->to_host(s->be, h, s->m.grad[a], sizeof(float) * s->m.padded[a]);
    return h;
}

static uint16_t* weights16(Side* s, int a) {  // the bf16 compute weights [padded]
    uint16_t* h = xmalloc(2 * s->m.padded[a]);
    s->be->to_host(s->be, h, s->m.w[a], 2 * s->m.padded[a]);
    return h;
}

// Masters, m, v of S and F bitwise; S's / F's weights the tie-away / nearest-even rounding.
static void check_split(Side* S, Side* F, const char* when) {
    for (int a = 0; a < 2; a++) {
        const size_t n = S->m.padded[a];
        size_t bad[3] = {0, 0, 0}, ws = 0, wf = 0, ties = 0;
        float* master = NULL;
        for (int which = 0; which < 3; which++) {
            float *x = gathered(S, a, which), *y = gathered(F, a, which);
            bad[which] = 0;
            for (size_t i = 0; i < n; i++) bad[which] += memcmp(&x[i], &y[i], 4) != 0;
            free(x);
            if (which == 0) master = y;
            else free(y);
        }
        uint16_t *w_s = weights16(S, a), *w_f = weights16(F, a);
        for (size_t i = 0; i < n; i++) {
            ws += w_s[i] != bf16_away(master[i]);
            wf += w_f[i] != f32_to_bf16(master[i]);
            ties += w_s[i] != w_f[i];
        }
        EXPECT(bad[0] + bad[1] + bad[2] == 0, "%s, arena %d: masters %zu, m %zu, v %zu of %zu differ (split vs fp32)",
               when, a, bad[0], bad[1], bad[2], n);
        EXPECT(ws == 0 && wf == 0, "%s, arena %d: %zu split weights not tie-away, %zu fp32-master weights not RNE", when,
               a, ws, wf);
        printf("     %s, %s arena: masters, m, v bitwise equal; %zu weights differ at ties\n", when,
               a ? "expert" : "dense", ties);
        free(master), free(w_s), free(w_f);
        S->be->zero(S->be, S->m.grad[a], sizeof(float) * n);  // the staging held state
        F->be->zero(F->be, F->m.grad[a], sizeof(float) * n);
    }
}

static void test_bf16_split_master(void) {
    Side S = {.be = g_gpu[1], .comm = g_nccl[1], .master = MASTER_SPLIT};
    Side F = {.be = g_gpu[1], .comm = g_nccl[1], .master = MASTER_FP32};
    side_init(&S);
    side_init(&F);
    EXPECT(S.o.split && !F.o.split && S.o.sh[0].rem && !S.o.sh[0].master, "split masters in S only");
    check_split(&S, &F, "after load");
    S.o.zero_grads = 0;  // as the trainer: each step's micro-batch overwrites the gradients
    double first = 0, last = 0;
    for (int s = 0; s < STEPS; s++) {
        const double l = step_loss(&S, 1, 1);
        if (s == 0) first = l;
        last = l;
        for (int a = 0; a < 2; a++) S.be->copy(S.be, F.m.grad[a], S.m.grad[a], sizeof(float) * S.m.padded[a]);
        StepStats ss = optim_step(&S.o, &S.m, s, s + 1), sf = optim_step(&F.o, &F.m, s, s + 1);
        EXPECT(!ss.skipped && ss.grad_norm == sf.grad_norm, "step %d: grad norm %.9g vs %.9g", s, ss.grad_norm,
               sf.grad_norm);
        char when[32];
        snprintf(when, sizeof when, "step %d", s);
        check_split(&S, &F, when);
    }
    EXPECT(isfinite(last) && last < first, "the loss falls with split masters: %.5f -> %.5f", first, last);
    Side R = {.be = g_gpu[1], .comm = g_nccl[1], .master = MASTER_SPLIT};
    side_init(&R);
    for (int a = 0; a < 2; a++) {
        optim_gather(&S.o, &S.m, a, 0);
        R.be->copy(R.be, R.m.grad[a], S.m.grad[a], sizeof(float) * S.m.padded[a]);
    }
    optim_load_from_staging(&R.o, &R.m);
    for (int which = 1; which < 3; which++)
        for (int a = 0; a < 2; a++) {
            optim_gather(&S.o, &S.m, a, which);
            R.be->copy(R.be, R.m.grad[a], S.m.grad[a], sizeof(float) * S.m.padded[a]);
            optim_scatter(&R.o, &R.m, a, which);
        }
    for (int a = 0; a < 2; a++) {
        const size_t n = S.m.padded[a];
        uint16_t *ws = weights16(&S, a), *wr = weights16(&R, a);
        int16_t *rs = xmalloc(2 * n), *rr = xmalloc(2 * n);
        S.be->to_host(S.be, rs, S.o.sh[a].rem, 2 * n);
        R.be->to_host(R.be, rr, R.o.sh[a].rem, 2 * n);
        EXPECT(!memcmp(ws, wr, 2 * n) && !memcmp(rs, rr, 2 * n), "arena %d: resumed split masters differ", a);
        float *ms = gathered(&S, a, 1), *mr = gathered(&R, a, 1);
        EXPECT(!memcmp(ms, mr, sizeof(float) * n), "arena %d: resumed m differs", a);
        free(ws), free(wr), free(rs), free(rr), free(ms), free(mr);
    }
    side_free(&R);
    side_free(&F);
    side_free(&S);
}

// bf16 expert gradients (precision.expert_grad=bf16) against fp32 ones, two bf16 GPU sides from
// the same init (A: act-dtype expert gradients, G: fp32): after one backward the dense gradients
// are the same bits (nothing else changes), the expert ones agree to bf16 rounding (each GEMM sum
// rounded once: rel L2 ~1e-3 expected), and over STEPS steps (the trainer's way: fresh gradients,
// never zeroed) the loss and gradient norm traces agree and the loss falls.
static void test_bf16_expert_grad_act(void) {
    Side G = {.be = g_gpu[1], .comm = g_nccl[1]}, A = {.be = g_gpu[1], .comm = g_nccl[1], .egrad_act = 1};
    side_init(&G);
    side_init(&A);
    G.o.zero_grads = A.o.zero_grads = 0;
    EXPECT(A.m.grad_act[ARENA_EXPERT] && A.o.sh[ARENA_EXPERT].gact && !A.o.sh[ARENA_DENSE].gact && !G.m.grad_act[1],
           "the expert arena (only) of A has act-dtype gradients");
    double first = 0, last = 0;
    for (int s = 0; s < STEPS; s++) {
        const double lg = step_loss(&G, 1, 1), la = step_loss(&A, 1, 1);
        // step 0: the same weights; the router's load-balancing and z statistics are float atomic
        // sums (cuda_router.cu), so the loss may differ in its last bits
        EXPECT(isfinite(la) && fabs(la - lg) <= (s ? 1e-2 : 1e-6) * fabs(lg), "step %d loss bf16 grads %.7f vs fp32 %.7f",
               s, la, lg);
        printf("     step %d: loss with bf16 expert grads %.7f, fp32 %.7f\n", s, la, lg);
        if (s == 0) {
            float *dg = arena_host(&G, ARENA_DENSE), *da = arena_host(&A, ARENA_DENSE);
            EXPECT(!memcmp(dg, da, sizeof(float) * G.m.numel[0]), "the dense gradients are the same bits");
            const size_t n = G.m.numel[ARENA_EXPERT];
            float* eg = arena_host(&G, ARENA_EXPERT);
            uint16_t* raw = xmalloc(2 * n);
            A.be->to_host(A.be, raw, A.m.grad[ARENA_EXPERT], 2 * n);
            float* ea = xmalloc(sizeof(float) * n);
            size_t same = 0;
            for (size_t i = 0; i < n; i++) {
                ea[i] = bf16_to_f32(raw[i]);
                same += raw[i] == f32_to_bf16(eg[i]);
            }
            const double e = rel_l2(ea, eg, n);
            EXPECT(e < 4e-3, "bf16 expert gradients against fp32: rel L2 %.3g", e);
            printf("     expert gradients bf16 vs fp32: rel L2 %.3g, %.2f%% the fp32 value rounded to nearest even\n", e,
                   100.0 * same / n);
            free(dg), free(da), free(eg), free(raw), free(ea);
        }
        if (s == 0) first = la;
        last = la;
        StepStats sg = optim_step(&G.o, &G.m, s, s + 1), sa = optim_step(&A.o, &A.m, s, s + 1);
        EXPECT(!sa.skipped && fabs(sa.grad_norm - sg.grad_norm) <= (s ? 1e-2 : 2e-3) * sg.grad_norm,
               "step %d grad norm bf16 grads %.6g vs fp32 %.6g", s, sa.grad_norm, sg.grad_norm);
    }
    EXPECT(isfinite(last) && last < first, "the loss falls with bf16 expert gradients: %.5f -> %.5f", first, last);
    side_free(&A);
    side_free(&G);
}

// Kept FP8 weight codes with bf16 expert gradients (precision.fp8_weights=auto's case): they lie in
// the fp32-sized expert gradient arena's unused half and each step's fresh backward remakes them.
// Against per_gemm (codes made in each GEMM), three steps give the same expert and dense gradients
// and updated weights bit for bit, with that half overwritten by NaN codes after every step (as the
// checkpoint's fp32 staging may); the losses within 1e-6 (float atomic sums). Clipping off and no
// aux or z loss, whose float atomic sums could otherwise change the updates' last bits. F = 256: the
// FP8 ops' own paths (F % 128 = 0).
static void test_fp8_wcodes_in_grads(void) {
    const ModelConfig keep_mc = mc;
    const OptimConfig keep_oc = oc;
    mc.ffn = 256, mc.aux_coef = 0, mc.z_coef = 0, oc.clip = 0;
    Side P = {.be = g_gpu[1], .comm = g_nccl[1], .egrad_act = 1, .fp8 = FP8_EXPERTS}, K = P;
    K.wcodes = 1;
    side_init(&P);
    side_init(&K);
    P.o.zero_grads = K.o.zero_grads = 0;
    const size_t n = K.m.numel[ARENA_EXPERT], nd = K.m.numel[ARENA_DENSE], half = 2 * K.m.padded[ARENA_EXPERT];
    const char* g = (const char*)K.m.grad[ARENA_EXPERT];
    int inside = K.m.wq && !P.m.wq && K.m.wq_off >= half && K.m.wq_off < 2 * half;
    for (int i = 0; inside && i < 2 * mc.layers; i++)
        inside = (const char*)K.m.wq[i].codes >= g + half && (const char*)K.m.wq[i].codes < g + 2 * half;
    EXPECT(inside, "the codes lie in the bf16 gradients' unused half (from byte %zu of %zu)", K.m.wq_off, 2 * half);
    uint8_t* nan_codes = xmalloc(half);
    memset(nan_codes, 0x7f, half);
    uint16_t *gp = xmalloc(2 * n), *gk = xmalloc(2 * n);
    for (int s = 0; s < STEPS; s++) {
        const double lp = step_loss(&P, 1, 1), lk = step_loss(&K, 1, 1);
        P.be->to_host(P.be, gp, P.m.grad[ARENA_EXPERT], 2 * n);
        K.be->to_host(K.be, gk, K.m.grad[ARENA_EXPERT], 2 * n);
        float *dp = arena_host(&P, ARENA_DENSE), *dk = arena_host(&K, ARENA_DENSE);
        EXPECT(isfinite(lk) && fabs(lk - lp) <= 1e-6 * fabs(lp), "step %d: loss with kept codes %.9g, per GEMM %.9g", s,
               lk, lp);
        EXPECT(!memcmp(gp, gk, 2 * n) && !memcmp(dp, dk, sizeof(float) * nd),
               "step %d: expert and dense gradients the same bits", s);
        free(dp), free(dk);
        optim_step(&P.o, &P.m, s, s + 1);
        optim_step(&K.o, &K.m, s, s + 1);
        K.be->to_device(K.be, (char*)K.m.grad[ARENA_EXPERT] + half, nan_codes, half);
    }
    P.be->to_host(P.be, gp, P.m.w[ARENA_EXPERT], 2 * n);
    K.be->to_host(K.be, gk, K.m.w[ARENA_EXPERT], 2 * n);
    EXPECT(!memcmp(gp, gk, 2 * n), "the expert weights after %d steps the same bits", STEPS);
    free(nan_codes), free(gp), free(gk);
    side_free(&K);
    side_free(&P);
    mc = keep_mc, oc = keep_oc;
}

static void test_fp32_grads(void) { compare_grads(0, 0); }
static void test_bf16_grads(void) { compare_grads(1, 0); }
static void test_fp32_grads_nccl_exchange(void) { compare_grads(0, 1); }
static void test_fp32_steps(void) { compare_steps(0); }
static void test_bf16_steps(void) { compare_steps(1); }

int main(int argc, char** argv) {
    int world;
    dist_init(&argc, &argv, &world);
    mc = (ModelConfig){.vocab_size = 300, .hidden = 128, .ffn = 160, .layers = 2, .heads = 4, .kv_heads = 2,
                       .experts = 4, .top_k = 2, .max_seq = 128, .rope_theta = 10000, .rms_eps = 1e-5f,
                       .init_std = 0.02f, .aux_coef = 0.02f, .z_coef = 1e-3f};
    oc = (OptimConfig){.lr = 1e-3f, .min_lr_ratio = 1.0f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                       .weight_decay = 0.1f, .clip = 1.0f, .schedule = SCHED_CONSTANT};
    Rng r;
    rng_seed(&r, 99);
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)(rng_u64(&r) % (uint64_t)mc.vocab_size);
    for (int i = 0; i < B * T; i++) tgt[i] = (int32_t)(rng_u64(&r) % (uint64_t)mc.vocab_size);
    cpu.be = cpu_backend_create();
    cpu.comm = comm_mpi_create(1);
    for (int d = 0; d < 2; d++) {
        Err e = {{0}};
        g_gpu[d] = cuda_backend_create(d ? DTYPE_BF16 : DTYPE_F32, 0, NULL, &e);
        if (!g_gpu[d]) {
            printf("no CUDA backend: %s\n0 passed, 1 failed\n", e.msg);
            return 1;
        }
        g_nccl[d] = g_gpu[d]->comm_create(g_gpu[d], &(CommOpts){.ep = 1}, &e);
        if (!g_nccl[d]) {
            printf("%s\n0 passed, 1 failed\n", e.msg);
            return 1;
        }
    }
    RUN(test_fp32_grads);
    RUN(test_bf16_grads);
    RUN(test_fp32_grads_nccl_exchange);
    RUN(test_fp32_steps);
    RUN(test_bf16_steps);
    RUN(test_bf16_split_master);
    RUN(test_bf16_expert_grad_act);
    RUN(test_fp8_wcodes_in_grads);
    for (int d = 0; d < 2; d++) g_nccl[d]->destroy(g_nccl[d]), g_gpu[d]->destroy(g_gpu[d]);
    cpu.comm->destroy(cpu.comm);
    cpu.be->destroy(cpu.be);
    dist_finalize();
    TEST_END();
}
