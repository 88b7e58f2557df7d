// test_resume_weights.c — weight-only checkpoints (checkpoint.save_optimizer=false) across
// layouts, with the real binary under mpirun (CPU, L0_sanity for 6 steps on the shipped data).
// The reference run is EP=2 at world 2, saving weight-only at step 3 and step 6: the files hold
// the 41 masters and nothing else, spread over the rank files. Step 3 is resumed at EP=2 (the
// reference continuation) and then at EP=4 (world 4), EP=2 × EDP=2 (world 4, ZeRO-1) and world
// 1; each logs the no-optimizer-state line, continues at step 3 with Adam restarted, and
// repeats the reference continuation's losses (micro_batch × world = 16 everywhere) to fp32
// reduction order, 1e-5 relative, as tests/test_reshard.c does for full checkpoints. The
// resumed runs save with the default (full state): their checkpoints hold the moments again,
// and `updates` counts from the restart.
#define _GNU_SOURCE
#include <math.h>

#include "test_resume_util.h"

#define TOL 1e-5

static char g_dir[256], g_bin[4096];

static const char* COMMON =
    "--config L0_sanity train.steps=6 optim.warmup=2 train.eval_every=0 train.eval_batches=1 log.every=1";

static int run(const char* name, int np, const char* args) {
    int rc = sh("scripts/mpirun.sh -np %d %s %s log.dir=%s/log_%s %s > %s/%s.log 2>&1", np, g_bin, COMMON, g_dir, name, args,
                g_dir, name);
    if (rc) fprintf(stderr, "  run %s exited %d: see %s/%s.log\n", name, rc, g_dir, name);
    return rc;
}

static double cont[8];  // the reference continuation's losses, steps 4..6

static void test_reference(void) {
    char a[800], p[400];
    snprintf(a, sizeof a, "parallel.ep=2 train.micro_batch=8 checkpoint.dir=%s/ref checkpoint.every=3 "
             "checkpoint.save_optimizer=false", g_dir);
    EXPECT(run("ref", 2, a) == 0, "reference run");
    for (int s = 3; s <= 6; s += 3) {
        snprintf(p, sizeof p, "%s/ref/step_%08d", g_dir, s);
        Ckpt* ck = NULL;
        Err e = {{0}};
        EXPECT(ckpt_open(&ck, p, &e) == 0, "open %s: %s", p, e.msg);
        if (!ck) continue;
        int opt = 0;
        for (int i = 0; i < ckpt_num_tensors(ck); i++) opt += strncmp(ckpt_tensor_name(ck, i), "optim.", 6) == 0;
        EXPECT(ckpt_world(ck) == 2 && ckpt_num_tensors(ck) == 41 && opt == 0 && ckpt_has(ck, "lm_head.weight") &&
                   ckpt_has(ck, "model.layers.1.block_sparse_moe.experts.3.w2.weight"),
               "step %d: 2 rank files, the 41 masters (%d tensors, %d optim.*)", s, ckpt_num_tensors(ck), opt);
        EXPECT(strstr(ckpt_trainer_state(ck), "\noptimizer_state: false\n") != NULL, "step %d: optimizer_state: false", s);
        ckpt_close(ck);
    }
    snprintf(p, sizeof p, "%s/ref.log", g_dir);
    EXPECT(sh("grep -q 'weights only: checkpoint.save_optimizer=false' %s", p) == 0, "the save says weights only");

    snprintf(a, sizeof a, "parallel.ep=2 train.micro_batch=8 checkpoint.resume=%s/ref/step_00000003 checkpoint.dir=%s/ck_cont",
             g_dir, g_dir);
    EXPECT(run("cont", 2, a) == 0, "reference continuation from the weight-only step 3");
    snprintf(p, sizeof p, "%s/log_cont/metrics.jsonl", g_dir);
    EXPECT(read_losses(p, cont, 8) == 3, "3 continuation losses");
    EXPECT(isfinite(cont[0]) && cont[0] > 0, "finite: %.6f", cont[0]);
}

static void resumed(const char* name, int np, const char* layout) {
    char a[800], p[400];
    snprintf(a, sizeof a, "%s checkpoint.resume=%s/ref/step_00000003 checkpoint.dir=%s/ck_%s", layout, g_dir, g_dir, name);
    EXPECT(run(name, np, a) == 0, "%s: run", name);
    snprintf(p, sizeof p, "%s/%s.log", g_dir, name);
    EXPECT(sh("grep -q 'resumed from .*step_00000003: step 3' %s", p) == 0, "%s: resumed at step 3 (see %s)", name, p);
    EXPECT(sh("grep -c 'has no optimizer state (saved with checkpoint.save_optimizer=false): Adam moments restart from "
              "zero; the run is not an exact continuation' %s | grep -qx 1", p) == 0,
           "%s: the no-optimizer-state line, once (rank 0)", name);
    double l[8];
    snprintf(p, sizeof p, "%s/log_%s/metrics.jsonl", g_dir, name);
    int n = read_losses(p, l, 8);
    EXPECT(n == 3, "%s: 3 steps logged (%d)", name, n);
    for (int i = 0; i < n && i < 3; i++) {
        double r = fabs(l[i] - cont[i]) / fabs(cont[i]);
        printf("  %s step %d: loss %.6f, reference %.6f, rel diff %.1e\n", name, 4 + i, l[i], cont[i], r);
        EXPECT(r <= TOL, "%s step %d: loss %.6f vs %.6f (EP=2 continuation)", name, 4 + i, l[i], cont[i]);
    }
    // its own final save is full again, with the Adam step count since the restart
    snprintf(p, sizeof p, "%s/ck_%s", g_dir, name);
    Ckpt* ck = NULL;
    Err e = {{0}};
    EXPECT(ckpt_open(&ck, p, &e) == 0, "%s: open its checkpoint: %s", name, e.msg);
    if (ck) {
        char v[32] = "";
        trainer_state_get(ckpt_trainer_state(ck), "updates", v, sizeof v, &e);
        EXPECT(ckpt_step(ck) == 6 && ckpt_num_tensors(ck) == 123 && !strcmp(v, "3") &&
                   strstr(ckpt_trainer_state(ck), "\noptimizer_state: true\n"),
               "%s: step 6, full state (%d tensors), updates: %s", name, ckpt_num_tensors(ck), v);
        ckpt_close(ck);
    }
}

static void test_world1(void) { resumed("w1", 1, "parallel.ep=1 train.micro_batch=16"); }
static void test_ep4(void) { resumed("ep4", 4, "parallel.ep=4 train.micro_batch=4"); }
static void test_ep2_edp2(void) { resumed("ep2edp2", 4, "parallel.ep=2 train.micro_batch=4"); }

int main(int argc, char** argv) {
    if (find_moetrain(argv[0], g_bin, sizeof g_bin)) return 1;
    scratch_dir(g_dir, sizeof g_dir, "test_resume_weights");
    RUN(test_reference);
    RUN(test_world1);
    RUN(test_ep4);
    RUN(test_ep2_edp2);
    scratch_done(g_dir, "test_resume_weights", t_failed);
    TEST_END();
}
