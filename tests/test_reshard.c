// test_reshard.c — a checkpoint saved at one layout resumes at another (mpirun, CPU, L0_sanity
// for 6 steps on the shipped data). The reference run is EP=2 at world 2, saving at step 3 and
// step 6. Step 3 is resumed at EP=4 (world 4), EP=2 × EDP=2 (world 4, ZeRO-1 on and off) and
// world 1; every layout keeps micro_batch × world = 16, so the global batch is the same and
// steps 4..6 must repeat the reference's losses. Then the world-4 run's own final checkpoint is
// resumed back at world 2 for one more step, against the reference extended by one step.
//
// Tolerance: 1e-5 relative per step. Loading is exact (every tensor by name, bit for bit); what
// differs is the layout's reduction order (sums of per-rank partial gradients, as in
// test_layout), which moves fp32 results by a few ulps per step.
#define _GNU_SOURCE
#include "test_resume_util.h"

#define TOL 1e-5

static char g_dir[256], g_bin[4096];

static const char* COMMON = "--config L0_sanity train.steps=6 optim.warmup=2 train.eval_every=0 train.eval_batches=1 log.every=1";

static int run(const char* name, int np, const char* args) {
    int rc = sh("scripts/mpirun.sh -np %d %s %s log.dir=%s/log_%s %s > %s/%s.log 2>&1", np, g_bin, COMMON, g_dir, name, args,
                g_dir, name);
    if (rc) fprintf(stderr, "  run %s exited %d: see %s/%s.log\n", name, rc, g_dir, name);
    return rc;
}

static double ref[8];

static void test_reference(void) {
    char a[600];
    snprintf(a, sizeof a, "parallel.ep=2 train.micro_batch=8 checkpoint.dir=%s/ref checkpoint.every=3", g_dir);
    EXPECT(run("ref", 2, a) == 0, "reference run");
    char p[400];
    snprintf(p, sizeof p, "%s/log_ref/metrics.jsonl", g_dir);
    EXPECT(read_losses(p, ref, 8) == 6, "6 reference losses");
    EXPECT(ref[5] < ref[0] && ref[0] > 0, "loss falls: %.4f -> %.4f", ref[0], ref[5]);
    snprintf(p, sizeof p, "%s/ref/step_00000003/manifest.txt", g_dir);
    EXPECT(access(p, F_OK) == 0, "step 3 saved");
}

static void resumed(const char* name, int np, const char* layout) {
    char a[800], p[400];
    snprintf(a, sizeof a, "%s checkpoint.resume=%s/ref/step_00000003 checkpoint.dir=%s/ck_%s", layout, g_dir, g_dir, name);
    EXPECT(run(name, np, a) == 0, "%s: run", name);
    snprintf(p, sizeof p, "%s/%s.log", g_dir, name);
    EXPECT(sh("grep -q 'resumed from .*step_00000003: step 3' %s", p) == 0, "%s: resumed at step 3 (see %s)", name, p);
    double l[8];
    snprintf(p, sizeof p, "%s/log_%s/metrics.jsonl", g_dir, name);
    int n = read_losses(p, l, 8);
    EXPECT(n == 3, "%s: 3 steps logged (%d)", name, n);
    for (int i = 0; i < n && i < 3; i++) {
        double r = fabs(l[i] - ref[3 + i]) / fabs(ref[3 + i]);
        printf("  %s step %d: loss %.6f, reference %.6f, rel diff %.1e\n", name, 4 + i, l[i], ref[3 + i], r);
        EXPECT(r <= TOL, "%s step %d: loss %.6f vs %.6f (EP=2 reference)", name, 4 + i, l[i], ref[3 + i]);
    }
}

static void test_ep4(void) { resumed("ep4", 4, "parallel.ep=4 train.micro_batch=4"); }
static void test_ep2_edp2(void) { resumed("ep2edp2", 4, "parallel.ep=2 train.micro_batch=4"); }
static void test_ep2_edp2_nozero(void) { resumed("nozero", 4, "parallel.ep=2 train.micro_batch=4 parallel.zero1=false"); }
static void test_world1(void) { resumed("w1", 1, "parallel.ep=1 train.micro_batch=16"); }

// world 4 → world 2: the EP=4 run's step-6 checkpoint, one more step, against the reference
// extended by one step from its own step 6.
static void test_back_to_ep2(void) {
    char a[800], p[400];
    double l7[8], r7[8];
    snprintf(a, sizeof a, "train.steps=7 parallel.ep=2 train.micro_batch=8 checkpoint.resume=%s/ref/step_00000006", g_dir);
    EXPECT(run("ref7", 2, a) == 0, "reference step 7");
    snprintf(a, sizeof a, "train.steps=7 parallel.ep=2 train.micro_batch=8 checkpoint.resume=%s/ck_ep4", g_dir);
    EXPECT(run("back", 2, a) == 0, "from EP=4 back to EP=2");
    snprintf(p, sizeof p, "%s/log_ref7/metrics.jsonl", g_dir);
    int nr = read_losses(p, r7, 8);
    snprintf(p, sizeof p, "%s/log_back/metrics.jsonl", g_dir);
    int nb = read_losses(p, l7, 8);
    EXPECT(nr == 1 && nb == 1, "one step each (%d, %d)", nr, nb);
    if (nr == 1 && nb == 1) {
        double r = fabs(l7[0] - r7[0]) / fabs(r7[0]);
        printf("  back step 7: loss %.6f, reference %.6f, rel diff %.1e\n", l7[0], r7[0], r);
        EXPECT(r <= TOL, "step 7: %.6f vs %.6f", l7[0], r7[0]);
    }
}

int main(int argc, char** argv) {
    if (find_moetrain(argv[0], g_bin, sizeof g_bin)) return 1;
    scratch_dir(g_dir, sizeof g_dir, "test_reshard");
    RUN(test_reference);
    RUN(test_ep4);
    RUN(test_ep2_edp2);
    RUN(test_ep2_edp2_nozero);
    RUN(test_world1);
    RUN(test_back_to_ep2);
    scratch_done(g_dir, "test_reshard", t_failed);
    TEST_END();
}
