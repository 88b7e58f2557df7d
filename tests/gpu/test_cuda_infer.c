// test_cuda_infer.c — the inference set-up of `eval` and `generate` (trainer_init_infer) on the
// CUDA backend against the training set-up (trainer_init), tests/infer_util.h: a tiny model
// trained 6 steps on the GPU, then loaded both ways in bf16 (split masters: the weights rounded by
// split_pack, in chunks) and in fp32 (and bf16 with precision.master=fp32), from the checkpoint
// and from an fp32 export: the same compute weights, eval loss and decoder logits, bit for bit,
// and a device peak lower by at least the plan's masters + gradients + Adam. Needs a GPU.
#define _GNU_SOURCE
#include <fcntl.h>
#include <unistd.h>

#include "hf.h"
#include "infer_util.h"

static char g_dir[256];

static void test_checkpoint_and_export(void) {
    char d[300], step6[400], hf[400];
    snprintf(d, sizeof d, "checkpoint.dir=%s/ck", g_dir);
    snprintf(step6, sizeof step6, "%s/ck/step_00000006", g_dir);
    snprintf(hf, sizeof hf, "%s/hf32", g_dir);
    Err e = {{0}};
    Trainer t;
    const char* ex[] = {d, "train.device=cuda", "precision.dtype=bf16"};
    const int rc = tiny_trainer(&t, ex, 3, &e);
    EXPECT(rc == 0, "init: %s", e.msg);
    if (rc) return;  // (a message with rc 0 is no failure: go on)
    EXPECT(trainer_run(&t) == EXIT_OK && t.step == 6, "train 6 steps on the GPU");
    trainer_free(&t);
    Ckpt* ck = NULL;
    EXPECT(ckpt_open(&ck, step6, &e) == 0, "open: %s", e.msg);
    if (!ck) return;
    Config c;
    tiny_config(&c, NULL, 0, &e);
    EXPECT(hf_export(ck, &c.model, hf, DTYPE_F32, &e) == 0, "export: %s", e.msg);
    ckpt_close(ck);
    static const char* const modes[3][3] = {
        {"train.device=cuda", "precision.dtype=bf16", "precision.master=split"},
        {"train.device=cuda", "precision.dtype=bf16", "precision.master=fp32"},
        {"train.device=cuda", "precision.dtype=fp32", "precision.master=split"},
    };
    static const char* const names[3] = {"bf16, split masters", "bf16, fp32 masters", "fp32"};
    for (int k = 0; k < 3; k++)
        for (int src = 0; src < 2; src++) {
            char what[96];
            snprintf(what, sizeof what, "%s, %s", names[k], src ? "fp32 export" : "checkpoint");
            EXPECT(eval_config(&c, src ? hf : step6, src, modes[k], 3, &e) == 0, "config: %s", e.msg);
            compare(what, &c);
        }
}

int main(int argc, char** argv) {
    int world;
    dist_init(&argc, &argv, &world);
    Err e = {{0}};
    Backend* probe = cuda_backend_create(DTYPE_F32, 0, NULL, &e);
    if (!probe) {
        fprintf(stderr, "test_cuda_infer needs a GPU: %s\n", e.msg);
        printf("0 passed, 1 failed\n");
        dist_finalize();
        return 1;
    }
    probe->destroy(probe);
    scratch_dir(g_dir, sizeof g_dir, "test_cuda_infer");
    if (fcntl(0, F_GETFD) == -1 && open("/dev/null", O_RDONLY) != 0) return 1;  // a stdin to keep open
    RUN(test_checkpoint_and_export);
    scratch_done(g_dir, "test_cuda_infer", t_failed);
    dist_finalize();
    TEST_END();
}
