// infer_util.h — the inference set-up (trainer_init_infer) against the training set-up
// (trainer_init) on the same weights, on any backend (tests/test_infer.c on the CPU,
// tests/gpu/test_cuda_infer.c on CUDA): the same compute weights (bits), eval loss (the same
// double) and decoder logits (bits); a backend peak lower by at least the plan's masters +
// gradients + Adam, and within 10% of the plan's inference line; no gradient arenas.
#pragma once
#include "generate.h"
#include "plan.h"
#include "test_resume_util.h"

// The eval command's layout on tiny_config: weights from `src` (resume=PATH, or init_from=DIR
// when hf), nothing written.
// extra: n more overrides (after these).
static int eval_config(Config* c, const char* src, int hf, const char* const* extra, int n, Err* e) {
    char a[600], b[64] = "checkpoint.resume=none";
    snprintf(a, sizeof a, "%s=%s", hf ? "checkpoint.init_from" : "checkpoint.resume", src);
    const char* ex[16] = {a, hf ? b : NULL, "checkpoint.dir=", "log.dir="};
    for (int i = 0; i < n && i < 12; i++) ex[4 + i] = extra[i];
    return tiny_config(c, ex, 4 + (n < 12 ? n : 12), e);
}

typedef struct Run {
    int ok;
    double loss;
    int64_t tokens;
    size_t peak_eval, peak_gen;  // the backend's peak bytes after the eval, after the decoding
    float* logits;               // host [steps × B × V]: the decoder's logits at every step
    int has_grad;
    void* w[2];                  // host copies of the compute weights (both arenas)
    size_t wbytes[2];
} Run;

enum { GEN_STEPS = 6 };

// Sets up (training or inference), evaluates, then decodes GEN_STEPS greedy tokens for two
// prompts with a KV cache; frees everything.
static Run run_one(const Config* c, int infer) {
    Run r = {0};
    Trainer t;
    Err e = {{0}};
    int rc = infer ? trainer_init_infer(&t, c, &e) : trainer_init(&t, c, &e);
    EXPECT(rc == 0, "%s set-up: %s", infer ? "inference" : "training", e.msg);
    if (rc) {
        trainer_free(&t);
        return r;
    }
    r.has_grad = t.model.grad[0] != NULL || t.model.grad[1] != NULL;
    for (int a = 0; a < 2; a++) {
        r.wbytes[a] = t.model.padded[a] * dtype_size(t.be->act_dtype);
        r.w[a] = xmalloc(r.wbytes[a]);
        t.be->to_host(t.be, r.w[a], t.model.w[a], r.wbytes[a]);
    }
    EvalResult ev = trainer_eval(&t, c->train.eval_batches);
    r.loss = ev.loss;
    r.tokens = ev.tokens;
    r.peak_eval = t.be->peak_bytes(t.be);
    const int B = 2, V = c->model.vocab_size, plen = 5;
    Gen g;
    gen_create_batch(&g, &t.model, B, plen + GEN_STEPS);
    int32_t tok[2 * 5];
    for (int i = 0; i < B * plen; i++) tok[i] = (int32_t)((7 * i + 3) % V);
    r.logits = xmalloc(sizeof(float) * GEN_STEPS * B * V);
    gen_forward(&g, tok, plen, NULL, NULL);
    for (int s = 0; s < GEN_STEPS; s++) {
        memcpy(r.logits + (size_t)s * B * V, g.h_logits, sizeof(float) * B * V);
        for (int b = 0; b < B; b++) tok[b] = gen_sample(g.h_logits + (size_t)b * V, V, 0, 0, 1, NULL, NULL);
        if (s + 1 < GEN_STEPS) gen_forward(&g, tok, 1, NULL, NULL);
    }
    r.peak_gen = t.be->peak_bytes(t.be);
    gen_free(&g);
    trainer_free(&t);
    r.ok = 1;
    return r;
}

// Inference against training on the same weights: identical numbers, less memory by at least
// the optimizer and gradient bytes of the plan.
static void run_free(Run* r) {
    free(r->logits);
    free(r->w[0]);
    free(r->w[1]);
}

static void compare(const char* what, const Config* c) {
    Run tr = run_one(c, 0), in = run_one(c, 1);
    if (!tr.ok || !in.ok) {
        run_free(&tr), run_free(&in);
        return;
    }
    for (int a = 0; a < 2; a++)
        EXPECT(tr.wbytes[a] == in.wbytes[a] && memcmp(tr.w[a], in.w[a], tr.wbytes[a]) == 0,
               "%s: the compute weights of arena %d differ between the set-ups", what, a);
    PlanMemory pm;
    Err e = {{0}};
    EXPECT(plan_memory(c, dist_world_size(), &pm, &e) == 0, "plan: %s", e.msg);
    const double train_only = pm.master + pm.grads + pm.adam;
    const int V = c->model.vocab_size;
    EXPECT(tr.tokens > 0 && isfinite(tr.loss), "%s: eval over %lld tokens, loss %g", what, (long long)tr.tokens, tr.loss);
    EXPECT(memcmp(&tr.loss, &in.loss, sizeof(double)) == 0 && tr.tokens == in.tokens,
           "%s: eval loss %.17g over %lld tokens (training set-up) vs %.17g over %lld (inference)", what, tr.loss,
           (long long)tr.tokens, in.loss, (long long)in.tokens);
    EXPECT(memcmp(tr.logits, in.logits, sizeof(float) * GEN_STEPS * 2 * V) == 0,
           "%s: the decoder's logits differ between the set-ups", what);
    EXPECT(tr.has_grad && !in.has_grad, "%s: gradient arenas: training %d, inference %d", what, tr.has_grad, in.has_grad);
    EXPECT((double)tr.peak_eval - (double)in.peak_eval >= train_only,
           "%s: eval peak %zu bytes (training set-up) vs %zu (inference): saves %.0f, want at least the plan's "
           "masters + gradients + Adam = %.0f", what, tr.peak_eval, in.peak_eval,
           (double)tr.peak_eval - (double)in.peak_eval, train_only);
    EXPECT((double)tr.peak_gen - (double)in.peak_gen >= train_only,
           "%s: generate peak %zu bytes (training set-up) vs %zu (inference), want a saving of at least %.0f", what,
           tr.peak_gen, in.peak_gen, train_only);
    // plan's inference line models what the inference set-up allocates through the backend (less
    // the runtime's rows on GPUs)
    const double model_infer = pm.infer_total - pm.cuda_context - pm.lib_workspace - pm.nccl;
    EXPECT(in.peak_eval >= 0.9 * model_infer && in.peak_eval <= 1.1 * model_infer,
           "%s: inference peak %zu bytes, plan's inference (eval/generate) %.0f", what, in.peak_eval, model_infer);
    if (util_rank() == 0)
        printf("  %s: peak bytes eval %zu -> %zu, generate %zu -> %zu (plan: masters + gradients + Adam %.0f; "
               "inference %.0f)\n", what, tr.peak_eval, in.peak_eval, tr.peak_gen, in.peak_gen, train_only, model_infer);
    run_free(&tr), run_free(&in);
}

