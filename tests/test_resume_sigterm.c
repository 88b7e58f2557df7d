// test_resume_sigterm.c — preemption end to end with the real binary under mpirun -np 2 (EP=2,
// CPU, L0_sanity for 24 steps on the shipped data, validation every 8 steps):
//   1. the uninterrupted run (final checkpoint at step 24, metrics.jsonl)
//   2. the same run, SIGTERM sent to every rank process (as Slurm signals each task) once 6
//      steps are logged: exit code 3, a complete checkpoint at the step it stopped after
//   3. rerun with checkpoint.resume=auto: it continues from there, appends to metrics.jsonl
// The joined trace equals the uninterrupted one line for line (every field but tokens_per_s and
// step_ms, at the printed precision), and the two final checkpoints are bit for bit equal: the
// CPU backend's results do not depend on timing or thread count, so nothing is tolerated.
// Then `moetrain eval --ckpt` on the final checkpoint prints the training run's final
// validation loss (same world: the same digits; world 1: within 1e-5 relative, the reduction
// order of the validation sums differs).
#define _GNU_SOURCE
#include <signal.h>
#include <time.h>

#include "test_resume_util.h"

#define STEPS 24

static char g_dir[256], g_bin[4096];

static const char* ARGS = "--config L0_sanity train.steps=24 optim.warmup=4 train.eval_every=8 train.eval_batches=2 "
                          "log.every=1 parallel.ep=2 train.micro_batch=8";

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_sigterm_resume(void) {
    // 1. uninterrupted
    int rc = sh("scripts/mpirun.sh -np 2 %s %s checkpoint.dir=%s/u log.dir=%s/lu > %s/u.log 2>&1", g_bin, ARGS, g_dir, g_dir, g_dir);
    EXPECT(rc == 0, "uninterrupted run exited %d (see %s/u.log)", rc, g_dir);

    // 2. interrupted: started in the background, signalled after 6 logged steps
    char cmd[6000], metrics[400];
    snprintf(cmd, sizeof cmd, "exec scripts/mpirun.sh -np 2 %s %s checkpoint.dir=%s/i log.dir=%s/li > %s/i1.log 2>&1", g_bin,
             ARGS, g_dir, g_dir, g_dir);
    snprintf(metrics, sizeof metrics, "%s/li/metrics.jsonl", g_dir);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char*)NULL);
        _exit(127);
    }
    int waited = 0;
    while (count_lines(metrics) < 6 && waited < 60000) sleep_ms(20), waited += 20;
    pid_t ranks[8];
    int nr = find_ranks(pid, ranks, 8);
    EXPECT(nr == 2, "found %d rank processes under mpirun %d", nr, (int)pid);
    for (int i = 0; i < nr; i++) kill(ranks[i], SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    EXPECT(code == 3, "the signalled run exits with code 3 (got %d; see %s/i1.log)", code, g_dir);
    int stopped = count_lines(metrics);
    char p[400], latest[64] = "";
    snprintf(p, sizeof p, "%s/i/latest", g_dir);
    FILE* f = fopen(p, "r");
    if (f) {
        if (!fgets(latest, sizeof latest, f)) latest[0] = 0;
        fclose(f);
    }
    char want[64];
    snprintf(want, sizeof want, "step_%08d\n", stopped);
    EXPECT(stopped >= 6 && stopped < STEPS && !strcmp(latest, want), "stopped after step %d, latest '%s'", stopped, latest);
    snprintf(p, sizeof p, "%s/i1.log", g_dir);
    EXPECT(sh("grep -q 'signal 15: checkpoint written at step %d' %s", stopped, p) == 0, "the log says where it stopped");
    printf("  stopped after step %d of %d\n", stopped, STEPS);

    // 3. resume
    rc = sh("scripts/mpirun.sh -np 2 %s %s checkpoint.dir=%s/i log.dir=%s/li checkpoint.resume=auto > %s/i2.log 2>&1", g_bin,
            ARGS, g_dir, g_dir, g_dir);
    EXPECT(rc == 0, "the resumed run exited %d (see %s/i2.log)", rc, g_dir);
    snprintf(p, sizeof p, "%s/i2.log", g_dir);
    EXPECT(sh("grep -q 'resumed from .*step_%08d: step %d' %s", stopped, stopped, p) == 0, "resumed at step %d", stopped);

    char *tu[64], *ti[64];
    snprintf(p, sizeof p, "%s/lu/metrics.jsonl", g_dir);
    int nu = read_trace(p, tu, 64);
    int ni = read_trace(metrics, ti, 64);
    EXPECT(nu == STEPS && ni == STEPS, "%d steps in each trace (%d, %d)", STEPS, nu, ni);
    int diff = 0;
    for (int i = 0; i < nu && i < ni; i++)
        if (strcmp(tu[i], ti[i])) {
            if (!diff) EXPECT(0, "line %d differs:\n%s%s", i + 1, tu[i], ti[i]);
            diff++;
        }
    EXPECT(diff == 0, "%d lines differ", diff);
    int vals = 0;
    for (int i = 0; i < ni; i++) vals += strstr(ti[i], "\"val_loss\"") != NULL;
    EXPECT(vals == 3, "validation at steps 8, 16, 24 (%d)", vals);
    free_trace(tu, nu > 0 ? nu : 0);
    free_trace(ti, ni > 0 ? ni : 0);
    char da[400], db[400], msg[1100];
    snprintf(da, sizeof da, "%s/u/step_%08d", g_dir, STEPS);
    snprintf(db, sizeof db, "%s/i/step_%08d", g_dir, STEPS);
    int d = ckpt_diff(da, db, msg, sizeof msg);
    EXPECT(d == 0, "final checkpoints differ in %d tensors (%s)", d, msg);
}

static void test_eval(void) {
    char want[64], got[64], p[400];
    snprintf(p, sizeof p, "%s/lu/metrics.jsonl", g_dir);
    last_val_loss(p, want, sizeof want);
    EXPECT(want[0] && atof(want) > 0, "the run logged a final validation loss");
    int rc = sh("scripts/mpirun.sh -np 2 %s eval --ckpt %s/u > %s/e2.log 2>&1", g_bin, g_dir, g_dir);
    snprintf(p, sizeof p, "%s/e2.log", g_dir);
    last_val_loss(p, got, sizeof got);
    EXPECT(rc == 0 && !strcmp(got, want), "eval at world 2: '%s', training: '%s' (exit %d)", got, want, rc);
    rc = sh("%s eval --ckpt %s/u/step_%08d > %s/e1.log 2>&1", g_bin, g_dir, STEPS, g_dir);
    snprintf(p, sizeof p, "%s/e1.log", g_dir);
    last_val_loss(p, got, sizeof got);
    EXPECT(rc == 0 && got[0] && fabs(atof(got) - atof(want)) <= 1e-5 * atof(want), "eval at world 1: '%s', training: '%s'",
           got, want);
    // an override of the data: the held-out part of another file gives another number
    rc = sh("%s eval --ckpt %s/u data.path=data/lambda_virus.fa.gz > %s/e3.log 2>&1", g_bin, g_dir, g_dir);
    snprintf(p, sizeof p, "%s/e3.log", g_dir);
    last_val_loss(p, got, sizeof got);
    EXPECT(rc == 0 && got[0] && strcmp(got, want), "eval on another data.path: '%s' (exit %d)", got, rc);
}

int main(int argc, char** argv) {
    if (find_moetrain(argv[0], g_bin, sizeof g_bin)) return 1;
    scratch_dir(g_dir, sizeof g_dir, "test_sigterm");
    RUN(test_sigterm_resume);
    RUN(test_eval);
    scratch_done(g_dir, "test_resume_sigterm", t_failed);
    TEST_END();
}
