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

#include "hf.h"
#include "infer_util.h"

static char g_dir[256];

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
        EXPECT(eval_config(&c, path, 0, NULL, 0, &e) == 0, "config: %s", e.msg);
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
        EXPECT(eval_config(&c, hf[k], 1, NULL, 0, &e) == 0, "config: %s", e.msg);
        compare(k ? "bf16 export" : "fp32 export", &c);
    }
    ckpt_close(ck);
}

// Random weights (generate --ckpt none) are the training set-up's too; and with the FP8 GEMMs
// (precision.fp8: the inference set-up plans only the forward's workspace).
static void test_random_init(void) {
    static const char* const fp8[] = {"precision.fp8=none", "precision.fp8=experts", "precision.fp8=linear"};
    for (int k = 0; k < 3; k++) {
        Config c;
        Err e = {{0}};
        const char* ex[] = {"checkpoint.dir=", "checkpoint.resume=none", fp8[k]};
        EXPECT(tiny_config(&c, ex, 3, &e) == 0, "config: %s", e.msg);
        compare(k ? fp8[k] : "random init", &c);
    }
}

// Refused: a checkpoint of another model (named), and one whose weights were damaged (checksum).
static void test_refusals(void) {
    char step6[400], copy[400], rank0[500];
    snprintf(step6, sizeof step6, "%s/full/step_00000006", g_dir);
    Config c;
    Err e = {{0}};
    EXPECT(eval_config(&c, step6, 0, (const char*[]){"model.ffn=64"}, 1, &e) == 0, "config: %s", e.msg);
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
    EXPECT(eval_config(&c, copy, 0, NULL, 0, &e) == 0, "config: %s", e.msg);
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
