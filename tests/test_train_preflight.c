// test_train_preflight.c — the checks before the first step (train_preflight.c), with the real
// binary: a checkpoint.dir that cannot be created, too little free space for the checkpoints
// checkpoint.keep asks for (given by a failpoint), and a save slower than checkpoint.grace_s.
#define _GNU_SOURCE

#include "run_util.h"

// A checkpoint.dir that cannot be created (here under a regular file) is refused at start-up,
// before the first step, not at the first save.
static void test_preflight_checkpoint_dir(void) {
    char out[65536], f[400];
    snprintf(f, sizeof f, "%s/plainfile", g_dir);
    FILE* fp = fopen(f, "w");
    fclose(fp);
    int rc = run(out, sizeof out, NULL, "%s " TINY " train.steps=3 checkpoint.dir=%s/ck", g_bin, f);
    EXPECT(rc == 2 && strstr(out, "checkpoint.dir") && strstr(out, "cannot create it (Not a directory)") &&
               !strstr(out, "step     1/"),
           "refused before the first step: rc %d, %s", rc, out);
}

// The size in bytes of "a checkpoint is N kB" (or MB) in out; -1 when absent.
static double ckpt_size_said(const char* out) {
    const char* m = strstr(out, "a checkpoint is ");
    if (!m) return -1;
    char* end;
    const double v = strtod(m + 16, &end);
    return !strncmp(end, " kB", 3) ? v * 1e3 : !strncmp(end, " MB", 3) ? v * 1e6 : -1;
}

// Preflight's free-space check, the free space given by the failpoint preflight.free_bytes:
// with checkpoint.keep=2 and keep_best (L0_sanity's), a fresh directory needs room for 4
// checkpoints (2 kept + the one being written + the best), one that holds 2 complete ones for 2.
// Refused with exit 2 before the first step, the sizes and the choices named.
static void test_preflight_free_space(void) {
    char out[65536], ck[400];
    snprintf(ck, sizeof ck, "%s/free_ck", g_dir);
#define FREE_RUN(free, steps, resume)                                                                          \
    run(out, sizeof out, NULL, "MOETRAIN_FREE_BYTES=%.0f %s " TINY " train.steps=%d checkpoint.every=1 "       \
        "checkpoint.keep=2 checkpoint.keep_best=true checkpoint.dir=%s checkpoint.resume=%s", (double)(free),  \
        g_bin, steps, ck, resume)
    int rc = FREE_RUN(1000, 2, "none");
    const double size = ckpt_size_said(out);
    EXPECT(rc == 2 && size > 1e5 && strstr(out, "checkpoint.dir") && strstr(out, "1.0 kB free") &&
               strstr(out, "checkpoint.keep=2 needs room for 4 more") && strstr(out, "lower checkpoint.keep") &&
               strstr(out, "checkpoint.save_optimizer=false") && !strstr(out, "step     1/"),
           "1 kB free: refused before the first step, sizes named: rc %d, %s", rc, out);
    if (size <= 0) return;
    rc = FREE_RUN(3.95 * size, 2, "none");
    EXPECT(rc == 2 && strstr(out, "needs room for 4 more"), "room for 3.95 checkpoints is not enough: rc %d, %s", rc, out);
    rc = FREE_RUN(4.05 * size, 2, "none");
    EXPECT(rc == 0, "room for 4.05 checkpoints is (rc %d): %s", rc, out);
    rc = FREE_RUN(1.95 * size, 3, "auto");
    EXPECT(rc == 2 && strstr(out, "needs room for 2 more"), "resumed, 2 kept: 1.95 is not enough: rc %d, %s", rc, out);
    rc = FREE_RUN(2.05 * size, 3, "auto");
    EXPECT(rc == 0 && strstr(out, "resumed from"), "resumed, 2 kept: room for 2.05 is (rc %d): %s", rc, out);
#undef FREE_RUN
}

// checkpoint.grace_s: a save that would not finish within it is named in the log before the
// first step (the write rate given by the failpoint preflight.write_rate: 100 kB/s, so the 1 MB
// rank file takes about 10 s); within it, nothing is said.
static void test_preflight_grace(void) {
    char out[65536], ck[400];
    snprintf(ck, sizeof ck, "%s/grace_ck", g_dir);
    int rc = run(out, sizeof out, NULL, "MOETRAIN_WRITE_RATE=100000 %s " TINY " train.steps=1 checkpoint.dir=%s "
                 "checkpoint.grace_s=5", g_bin, ck);
    const char* w = strstr(out, "checkpoint: warning: a save of 1.0 MB per rank would take about 10 s at the 100.0 kB/s "
                                "measured in ");
    const char* step1 = strstr(out, "step     1/");
    EXPECT(rc == 0 && w && strstr(w, "more than checkpoint.grace_s=5") && strstr(w, "--signal=B:USR1@75") && step1 &&
               w < step1,
           "the warning, up front: rc %d, %s", rc, out);
    rc = run(out, sizeof out, NULL, "MOETRAIN_WRITE_RATE=100000 %s " TINY " train.steps=1 checkpoint.dir=%s "
             "checkpoint.grace_s=12 checkpoint.overwrite=true", g_bin, ck);
    EXPECT(rc == 0 && !strstr(out, "would take about"), "no warning when the save fits (rc %d): %s", rc, out);
}

int main(int argc, char** argv) {
    if (run_begin(argc, argv, "preflight")) return 1;
    RUN_IF(test_preflight_checkpoint_dir);
    RUN_IF(test_preflight_free_space);
    RUN_IF(test_preflight_grace);
    if (!t_failed) sh("rm -rf %s", g_dir);
    TEST_END();
}
