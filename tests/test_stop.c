// test_stop.c — preemption signals (stop.c), with the real binary under scripts/mpirun.sh -np 2:
// SIGTERM or SIGINT to the launcher saves at the step it stopped after and exits 3; a signal
// during start-up exits 3 at once with nothing saved.
#define _GNU_SOURCE

#include "run_util.h"

// SIGTERM or SIGINT to the launcher (scripts/mpirun.sh -np 2, as a user or a batch script sends
// it): the ranks finish the step, save, and the job exits 3 with `latest` at the step it stopped.
static void signal_to_launcher(int sig) {
    char ck[400], lg[400], log[400], metrics[500];
    snprintf(ck, sizeof ck, "%s/sig%d_ck", g_dir, sig);
    snprintf(lg, sizeof lg, "%s/sig%d_log", g_dir, sig);
    snprintf(log, sizeof log, "%s/sig%d.out", g_dir, sig);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", lg);
    pid_t pid = spawn(log, "exec scripts/mpirun.sh -np 2 %s " TINY2 " train.steps=100000 checkpoint.dir=%s log.dir=%s",
                      g_bin, ck, lg);
    double t0 = now_sec();
    while (count_lines(metrics) < 3 && now_sec() - t0 < 60) usleep(20000);
    kill(pid, sig);
    double secs;
    int rc = reap(pid, 60, &secs);
    EXPECT(rc == 3, "signal %d to mpirun.sh: exit code 3 (got %d; see %s)", sig, rc, log);
    EXPECT(secs < 30, "it stopped within seconds (%.1f s)", secs);
    int stopped = count_lines(metrics);
    char p[600], latest[64] = "", want[64];
    snprintf(p, sizeof p, "%s/latest", ck);
    FILE* f = fopen(p, "r");
    if (f) {
        if (!fgets(latest, sizeof latest, f)) latest[0] = 0;
        fclose(f);
    }
    snprintf(want, sizeof want, "step_%08d\n", stopped);
    EXPECT(stopped >= 3 && !strcmp(latest, want), "a checkpoint at the step it stopped after (%d, latest '%s')", stopped,
           latest);
    EXPECT(wait_for(log, "checkpoint written at step", 1), "the log says so (%s)", log);
}

static void test_sigterm_to_mpirun(void) { signal_to_launcher(SIGTERM); }
static void test_sigint_to_mpirun(void) { signal_to_launcher(SIGINT); }

// A signal during start-up (here: while the data loads, made slow by a failpoint): nothing to
// save, exit 3 at once, nothing written under checkpoint.dir.
static void test_signal_during_startup(void) {
    char ck[400], log[400];
    snprintf(ck, sizeof ck, "%s/start_ck", g_dir);
    snprintf(log, sizeof log, "%s/start.out", g_dir);
    pid_t pid = spawn(log, "MOETRAIN_STARTUP_SLEEP=60 exec scripts/mpirun.sh -np 2 -x MOETRAIN_STARTUP_SLEEP %s " TINY2
                      " train.steps=5 checkpoint.dir=%s log.dir=", g_bin, ck);
    EXPECT(wait_for(log, "data: random tokens", 60), "start-up reached the data (%s)", log);
    usleep(300000);
    kill(pid, SIGTERM);
    double secs;
    int rc = reap(pid, 60, &secs);
    EXPECT(rc == 3, "exit code 3 (got %d; see %s)", rc, log);
    EXPECT(secs < 15, "at once, not after the slow start-up (%.1f s)", secs);
    EXPECT(wait_for(log, "during start-up: nothing to save; exiting with code 3", 1), "the message (%s)", log);
    char p[600];
    snprintf(p, sizeof p, "%s/latest", ck);
    EXPECT(access(p, F_OK) != 0, "nothing saved");
}

int main(int argc, char** argv) {
    if (run_begin(argc, argv, "stop")) return 1;
    RUN_IF(test_sigterm_to_mpirun);
    RUN_IF(test_sigint_to_mpirun);
    RUN_IF(test_signal_during_startup);
    if (!t_failed) sh("rm -rf %s", g_dir);
    TEST_END();
}
