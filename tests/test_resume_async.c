// test_resume_async.c — checkpoint.async=true against synchronous saves (world 1, CPU, the tiny
// model of test_resume.c, checkpoint.every=2):
//   same bits      an async run writes checkpoints with the same tensors, bit for bit, at the
//                  same steps as a sync run, and the same metrics trace
//   exact resume   async, stopped after step 3 (as on SIGTERM: the save in flight and the
//                  signal's save are complete at exit), resume=auto, on to step 6: the final
//                  checkpoint and state equal the uninterrupted sync run's bit for bit
//   kill mid-write the real binary, killed (SIGKILL) inside the background writer of the
//                  step-4 save: `latest` still names step 2, which verifies; step 4 never
//                  appears complete; resume=auto continues from step 2 and ends equal to the
//                  uninterrupted run
#define _GNU_SOURCE
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>

#include "comm.h"
#include "test_resume_util.h"
#include "train.h"

static char g_dir[256];
static char g_bin[PATH_MAX];

static void opt(char* out, size_t n, const char* key, const char* sub) { snprintf(out, n, "%s=%s/%s", key, g_dir, sub); }

static void latest_of(const char* root, char* out, size_t n) {
    char p[600];
    snprintf(p, sizeof p, "%s/latest", root);
    FILE* f = fopen(p, "r");
    out[0] = 0;
    if (f) {
        if (!fgets(out, (int)n, f)) out[0] = 0;
        fclose(f);
    }
    out[strcspn(out, "\n")] = 0;
}

static Trainer g_sync;  // the uninterrupted sync run (kept for the later tests)

static void test_async_equals_sync(void) {
    char d1[300], l1[300], d2[300], l2[300];
    opt(d1, sizeof d1, "checkpoint.dir", "sync");
    opt(l1, sizeof l1, "log.dir", "lsync");
    opt(d2, sizeof d2, "checkpoint.dir", "async");
    opt(l2, sizeof l2, "log.dir", "lasync");
    Err e = {{0}};
    const char* ea[] = {d1, l1, "checkpoint.every=2"};
    EXPECT(tiny_trainer(&g_sync, ea, 3, &e) == 0, "init sync: %s", e.msg);
    EXPECT(trainer_run(&g_sync) == EXIT_OK && g_sync.step == 6, "sync run");
    Trainer B;
    const char* eb[] = {d2, l2, "checkpoint.every=2", "checkpoint.async=true"};
    EXPECT(tiny_trainer(&B, eb, 4, &e) == 0, "init async: %s", e.msg);
    EXPECT(trainer_run(&B) == EXIT_OK && B.step == 6, "async run");
    EXPECT(!trainer_save_in_flight(&B), "nothing in flight after the run");
    const char* what = "";
    EXPECT(trainer_state_eq(&g_sync, &B, 0, &what), "final %s differ", what);
    for (int s = 2; s <= 6; s += 2) {
        char a[400], b[400], msg[1100];
        snprintf(a, sizeof a, "%s/sync/step_%08d", g_dir, s);
        snprintf(b, sizeof b, "%s/async/step_%08d", g_dir, s);
        int d = ckpt_diff(a, b, msg, sizeof msg);
        EXPECT(d == 0, "step %d: async checkpoint differs from sync: %d (%s)", s, d, msg);
    }
    char lat[64], root[400];
    snprintf(root, sizeof root, "%s/async", g_dir);
    latest_of(root, lat, sizeof lat);
    EXPECT(strcmp(lat, "step_00000006") == 0, "latest after the async run: '%s'", lat);
    char *ta[16], *tb[16], p[400];
    snprintf(p, sizeof p, "%s/lsync/metrics.jsonl", g_dir);
    int na = read_trace(p, ta, 16);
    snprintf(p, sizeof p, "%s/lasync/metrics.jsonl", g_dir);
    int nb = read_trace(p, tb, 16);
    EXPECT(na == 6 && nb == 6, "6 lines each (%d, %d)", na, nb);
    for (int i = 0; i < na && i < nb; i++) EXPECT(strcmp(ta[i], tb[i]) == 0, "trace line %d:\n%s%s", i + 1, ta[i], tb[i]);
    free_trace(ta, na > 0 ? na : 0);
    free_trace(tb, nb > 0 ? nb : 0);
    trainer_free(&B);
}

static void test_async_exact_resume(void) {
    char d[300], l[300];
    opt(d, sizeof d, "checkpoint.dir", "astop");
    opt(l, sizeof l, "log.dir", "lastop");
    Err e = {{0}};
    Trainer B, C;
    const char* eb[] = {d, l, "checkpoint.every=2", "checkpoint.async=true"};
    EXPECT(tiny_trainer(&B, eb, 4, &e) == 0, "init: %s", e.msg);
    B.stop_at = 3;
    int rc = trainer_run(&B);
    EXPECT(rc == EXIT_PREEMPTED && B.step == 3, "stops after step 3 (exit %d, step %d)", rc, B.step);
    trainer_free(&B);
    char p[400], lat[64];
    snprintf(p, sizeof p, "%s/astop", g_dir);
    latest_of(p, lat, sizeof lat);
    EXPECT(strcmp(lat, "step_00000003") == 0, "the signal's save is complete at exit: latest '%s'", lat);
    snprintf(p, sizeof p, "%s/astop/step_00000002/manifest.txt", g_dir);
    EXPECT(access(p, F_OK) == 0, "the save of step 2 (in flight at the signal) is complete");
    const char* ec[] = {d, l, "checkpoint.every=2", "checkpoint.async=true", "checkpoint.resume=auto"};
    EXPECT(tiny_trainer(&C, ec, 5, &e) == 0, "init resume: %s", e.msg);
    EXPECT(C.step == 3, "resumes at step 3 (%d)", C.step);
    EXPECT(trainer_run(&C) == EXIT_OK && C.step == 6, "finishes");
    const char* what = "";
    EXPECT(trainer_state_eq(&g_sync, &C, 0, &what), "final %s differ from the uninterrupted sync run", what);
    EXPECT(memcmp(&g_sync.last_loss, &C.last_loss, sizeof(double)) == 0, "last loss %.17g vs %.17g", C.last_loss,
           g_sync.last_loss);
    char a[400], b[400], msg[1100];
    snprintf(a, sizeof a, "%s/sync/step_00000006", g_dir);
    snprintf(b, sizeof b, "%s/astop/step_00000006", g_dir);
    int dd = ckpt_diff(a, b, msg, sizeof msg);
    EXPECT(dd == 0, "final checkpoints differ: %d (%s)", dd, msg);
    trainer_free(&C);
}

static const char* BIN_ARGS =
    "train.device=cpu data.format=random optim.warmup=2 train.seq_len=16 train.micro_batch=4 train.global_batch=8 "
    "train.eval_batches=2 train.eval_every=3 model.hidden=32 model.ffn=48 model.heads=4 model.kv_heads=2 "
    "model.experts=4 model.top_k=2 model.vocab_size=64 train.seed=77 checkpoint.keep=0 checkpoint.every=2 "
    "checkpoint.async=true log.every=1";

static void test_async_kill(void) {
    if (access(g_bin, X_OK)) {
        EXPECT(0, "%s is not built", g_bin);
        return;
    }
    char root[400], out[400], lat[64], p[600], cfg[400];
    snprintf(root, sizeof root, "%s/akill", g_dir);
    snprintf(cfg, sizeof cfg, "%s/tiny.yaml", g_dir);  // the rest of tiny_config's keys are overrides
    FILE* f = fopen(cfg, "w");
    if (f) fputs("train:\n  steps: 6\n", f), fclose(f);
    snprintf(out, sizeof out, "%s/akill.out", g_dir);
    // steps 1-2, saved (the final save waits for its writer)
    int rc = sh("%s --config %s %s train.steps=2 checkpoint.dir=%s > %s 2>&1", g_bin, cfg, BIN_ARGS, root, out);
    EXPECT(rc == 0, "first run exit %d", rc);
    if (rc) sh("cat %s >&2", out);
    // on to 6, killed inside the background writer of the step-4 save (after its second tensor)
    rc = sh("MOETRAIN_CKPT_CRASH_AT=append %s --config %s %s train.steps=6 checkpoint.resume=auto "
            "checkpoint.dir=%s > %s 2>&1", g_bin, cfg, BIN_ARGS, root, out);
    EXPECT(rc != 0, "the killed run exits %d", rc);
    latest_of(root, lat, sizeof lat);
    EXPECT(strcmp(lat, "step_00000002") == 0, "latest after the kill: '%s'", lat);
    snprintf(p, sizeof p, "%s/step_00000004", root);
    struct stat st;
    EXPECT(stat(p, &st) != 0, "no step_00000004 after the kill");
    // .tmp_step_00000004.<run id> (ckpt.h: a save's temporary carries its run's id)
    EXPECT(sh("ls -d %s/.tmp_step_00000004* > /dev/null 2>&1", root) == 0,
           "the killed save's temporary is there (the kill landed in the step-4 save)");
    Ckpt* ck = NULL;
    Err e = {{0}};
    EXPECT(ckpt_open(&ck, root, &e) == 0 && ck && ckpt_step(ck) == 2, "latest verifies: %s", e.msg);
    if (ck) ckpt_close(ck);
    // resume=auto continues from step 2 to the same end as the uninterrupted run
    rc = sh("%s --config %s %s train.steps=6 checkpoint.resume=auto checkpoint.dir=%s > %s 2>&1", g_bin, cfg,
            BIN_ARGS, root, out);
    EXPECT(rc == 0, "resumed run exit %d", rc);
    if (rc) sh("cat %s >&2", out);
    EXPECT(sh("grep -q 'resumed from .*step_00000002' %s", out) == 0, "resumed from step 2");
    EXPECT(sh("ls -d %s/.tmp_step_00000004* > /dev/null 2>&1", root) != 0, "the next save cleared the stale temporary");
    char a[400], b[600], msg[1100];
    snprintf(a, sizeof a, "%s/sync/step_00000006", g_dir);
    snprintf(b, sizeof b, "%s/step_00000006", root);
    int d = ckpt_diff(a, b, msg, sizeof msg);
    EXPECT(d == 0, "final checkpoint after kill + resume differs: %d (%s)", d, msg);
}

int main(int argc, char** argv) {
    moetrain_path(argv[0], g_bin, sizeof g_bin);
    int world;
    dist_init(&argc, &argv, &world);
    scratch_dir(g_dir, sizeof g_dir, "test_resume_async");
    RUN(test_async_equals_sync);
    RUN(test_async_exact_resume);
    chdir_repo(g_bin);  // configs/ for the binary
    RUN(test_async_kill);
    trainer_free(&g_sync);
    scratch_done(g_dir, "test_resume_async", t_failed);
    dist_finalize();
    TEST_END();
}
