// test_nonfinite.c — a non-finite loss skips the update (nothing applied, counted), and
// train.max_bad_steps in a row stop the run with EXIT_DIVERGED.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "test.h"
#include "train.h"

static void test_skip_and_stop(void) {
    Config c;
    Err e = {{0}};
    config_defaults(&c);
    const char* kv[] = {"train.device=cpu", "data.format=random", "train.steps=20", "optim.warmup=1",
                        "train.max_bad_steps=3", "train.seq_len=16", "train.micro_batch=2", "train.global_batch=2",
                        "train.eval_batches=1", "log.dir="};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) EXPECT(config_override(&c, kv[i], &e) == 0, "%s", e.msg);
    Trainer t;
    EXPECT(trainer_init(&t, &c, &e) == 0, "init: %s", e.msg);
    // poison the final norm weight in the compute copy: every logit becomes NaN
    Model* m = &t.model;
    float* w = (float*)m->w[0] + m->pl.final_norm;
    w[0] = NAN;
    float before[8];
    memcpy(before, t.opt.sh[0].master, sizeof before);
    int rc = trainer_run(&t);
    EXPECT(rc == EXIT_DIVERGED, "exit code %d, want %d", rc, EXIT_DIVERGED);
    EXPECT(t.skipped == 3 && t.updates == 0, "skipped %lld, updates %lld", (long long)t.skipped, (long long)t.updates);
    EXPECT(memcmp(before, t.opt.sh[0].master, sizeof before) == 0, "no update was applied");
    EXPECT(t.step == 3, "stopped after 3 steps (step %d)", t.step);
    trainer_free(&t);
}

int main(int argc, char** argv) {
    int world;
    dist_init(&argc, &argv, &world);
    RUN(test_skip_and_stop);
    dist_finalize();
    TEST_END();
}
