// test_infer.c — the inference set-up of `eval` and `generate` (trainer_init_infer) on the CPU:
// against the training set-up (trainer_init) on the same checkpoint, the validation loss is the
// same double and the decoder's logits the same bits, while the backend's peak memory is lower by
// at least what `plan` counts for the fp32 masters, the gradients and Adam's moments; the model
// holds no gradient arenas. A weight-only checkpoint and a Hugging Face export load the same way;
// a checkpoint of another model and a damaged one are refused.
#define _GNU_SOURCE
#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include "generate.h"
#include "hf.h"
#include "plan.h"
#include "test_resume_util.h"

static char g_dir[256];

// The eval command's layout on tiny_config: weights from `src` (resume=PATH, or init_from=DIR
// when hf), nothing written.
static int eval_config(Config* c, const char* src, int hf, const char* extra, Err* e) {
    char a[600], b[64] = "checkpoint.resume=none";
    snprintf(a, sizeof a, "%s=%s", hf ? "checkpoint.init_from" : "checkpoint.resume", src);
    const char* ex[] = {a, hf ? b : NULL, "checkpoint.dir=", "log.dir=", extra};
    return tiny_config(c, ex, 5, e);
}

typedef struct Run {
    int ok;
    double loss;
    int64_t tokens;
    size_t peak_eval, peak_gen;  // the backend's peak bytes after the eval, after the decoding
    float* logits;               // host [steps × B × V]: the decoder's logits at every step
    int has_grad;
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
static void compare(const char* what, const Config* c) {
    Run tr = run_one(c, 0), in = run_one(c, 1);
    if (!tr.ok || !in.ok) {
        free(tr.logits), free(in.logits);
        return;
    }
    PlanMemory pm;
    Err e = {{0}};
    EXPECT(plan_memory(c, 1, &pm, &e) == 0, "plan: %s", e.msg);
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
    // plan's inference line models what the inference set-up allocates (the CPU: no runtime rows)
    EXPECT(in.peak_eval >= 0.9 * pm.infer_total && in.peak_eval <= 1.1 * pm.infer_total,
           "%s: inference peak %zu bytes, plan's inference (eval/generate) %.0f", what, in.peak_eval, pm.infer_total);
    printf("  %s: peak bytes eval %zu -> %zu, generate %zu -> %zu (plan: masters + gradients + Adam %.0f; "
           "inference %.0f)\n", what, tr.peak_eval, in.peak_eval, tr.peak_gen, in.peak_gen, train_only, pm.infer_total);
    free(tr.logits), free(in.logits);
}

// A checkpoint written by training (with, then without optimizer state), loaded both ways.
static void test_checkpoint(void) {
    char d1[300], d2[300], path[400];
    snprintf(d1, sizeof d1, "checkpoint.dir=%s/full", g_dir);
    snprintf(d2, sizeof d2, "checkpoint.dir=%s/wonly", g_dir);
    Err e = {{0}};
    for (int pass = 0; pass < 2; pass++) {
        const char* ex[] = {pass ? d2 : d1, pass ? "checkpoint.save_optimizer=false" : NULL};
        Trainer t;
        EXPECT(tiny_trainer(&t, ex, 2, &e) == 0, "init: %s", e.msg);
        EXPECT(trainer_run(&t) == EXIT_OK && t.step == 6, "train 6 steps");
        trainer_free(&t);
        snprintf(path, sizeof path, "%s/%s/step_00000006", g_dir, pass ? "wonly" : "full");
        Config c;
        EXPECT(eval_config(&c, path, 0, NULL, &e) == 0, "config: %s", e.msg);
        compare(pass ? "weight-only checkpoint" : "checkpoint", &c);
    }
}

// A Hugging Face export (fp32 and bf16) through checkpoint.init_from, loaded both ways.
static void test_hf_export(void) {
    char step6[400], hf[2][400];
    snprintf(step6, sizeof step6, "%s/full/step_00000006", g_dir);
    Err e = {{0}};
    Ckpt* ck = NULL;
    EXPECT(ckpt_open(&ck, step6, &e) == 0, "open: %s", e.msg);
    if (!ck) return;
    Config c;
    tiny_config(&c, NULL, 0, &e);
    for (int k = 0; k < 2; k++) {
        snprintf(hf[k], sizeof hf[k], "%s/hf%d", g_dir, k ? 16 : 32);
        EXPECT(hf_export(ck, &c.model, hf[k], k ? DTYPE_BF16 : DTYPE_F32, &e) == 0, "export: %s", e.msg);
        EXPECT(eval_config(&c, hf[k], 1, NULL, &e) == 0, "config: %s", e.msg);
        compare(k ? "bf16 export" : "fp32 export", &c);
    }
    ckpt_close(ck);
}

// Random weights (generate --ckpt none) are the training set-up's too.
static void test_random_init(void) {
    Config c;
    Err e = {{0}};
    const char* ex[] = {"checkpoint.dir=", "checkpoint.resume=none"};
    EXPECT(tiny_config(&c, ex, 2, &e) == 0, "config: %s", e.msg);
    compare("random init", &c);
}

// Refused: a checkpoint of another model (named), and one whose weights were damaged (checksum).
static void test_refusals(void) {
    char step6[400], copy[400], rank0[500];
    snprintf(step6, sizeof step6, "%s/full/step_00000006", g_dir);
    Config c;
    Err e = {{0}};
    EXPECT(eval_config(&c, step6, 0, "model.ffn=64", &e) == 0, "config: %s", e.msg);
    Trainer t;
    int rc = trainer_init_infer(&t, &c, &e);
    EXPECT(rc != 0 && strstr(e.msg, "different model") && strstr(e.msg, "model.ffn"),
           "another model's checkpoint: rc %d, %s", rc, e.msg);
    trainer_free(&t);
    snprintf(copy, sizeof copy, "%s/damaged", g_dir);
    sh("rm -rf '%s' && cp -r '%s' '%s'", copy, step6, copy);
    snprintf(rank0, sizeof rank0, "%s/rank_00000.safetensors", copy);
    EXPECT(flip_byte(rank0, -16) == 0, "damage %s", rank0);  // in the last tensor's values
    e.msg[0] = 0;
    EXPECT(eval_config(&c, copy, 0, NULL, &e) == 0, "config: %s", e.msg);
    rc = trainer_init_infer(&t, &c, &e);
    EXPECT(rc != 0 && strstr(e.msg, "rank_00000.safetensors"), "a damaged checkpoint: rc %d, %s", rc, e.msg);
    trainer_free(&t);
}

int main(int argc, char** argv) {
    int world;
    dist_init(&argc, &argv, &world);
    scratch_dir(g_dir, sizeof g_dir, "test_infer");
    if (fcntl(0, F_GETFD) == -1 && open("/dev/null", O_RDONLY) != 0) return 1;  // a stdin to keep open
    RUN(test_checkpoint);
    RUN(test_hf_export);
    RUN(test_random_init);
    RUN(test_refusals);
    scratch_done(g_dir, "test_infer", t_failed);
    dist_finalize();
    TEST_END();
}
