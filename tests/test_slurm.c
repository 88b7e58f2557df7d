// test_slurm.c — scripts/slurm/moetrain.sbatch under a fake Slurm: srun, scontrol and the
// trainer are small shell scripts in a temporary PATH directory that record their arguments.
// Checks the launch line (one rank per GPU, CPU binding, every GPU visible, checkpoint.resume=
// auto with the checkpoint dir, the user's overrides), that exit code 3 requeues the job and
// other codes do not, that SIGUSR1 to the batch shell reaches the trainer, and MAX_REQUEUES.
#define _DEFAULT_SOURCE
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util.h"
#include "test.h"

static char g_dir[64], g_script[PATH_MAX];

static void write_exe(const char* name, const char* body) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE* f = fopen(p, "w");
    CHECK(f, "cannot write %s", p);
    fprintf(f, "#!/usr/bin/env bash\n%s", body);
    fclose(f);
    chmod(p, 0755);
}

static void slurp(const char* name, char* out, size_t n) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    t_read_text(p, out, n);
}

static void clear_logs(void) {
    const char* logs[] = {"srun.log", "scontrol.log", "trainer.log", "ready", "out.log"};
    char p[PATH_MAX];
    for (size_t i = 0; i < sizeof logs / sizeof logs[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", g_dir, logs[i]);
        unlink(p);
    }
}

// Starts the batch script as sbatch would (environment of the job), returns its pid.
static pid_t start(const char* mode, const char* restarts, const char* max_requeues) {
    clear_logs();
    pid_t pid = fork();
    CHECK(pid >= 0, "fork failed");
    if (pid == 0) {
        char path[PATH_MAX + 64], out[PATH_MAX], ck[PATH_MAX], lg[PATH_MAX], tr[PATH_MAX];
        snprintf(path, sizeof path, "%s:%s", g_dir, getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
        snprintf(ck, sizeof ck, "%s/ckpt", g_dir);
        snprintf(lg, sizeof lg, "%s/logs", g_dir);
        snprintf(tr, sizeof tr, "%s/fake_moetrain", g_dir);
        snprintf(out, sizeof out, "%s/out.log", g_dir);
        setenv("PATH", path, 1);
        setenv("FAKE_DIR", g_dir, 1);
        setenv("FAKE_MODE", mode, 1);
        setenv("MOETRAIN", tr, 1);
        setenv("CKPT", ck, 1);
        setenv("LOG_DIR", lg, 1);
        setenv("SLURM_JOB_ID", "4242", 1);
        setenv("SLURM_NTASKS", "16", 1);
        setenv("SLURM_NTASKS_PER_NODE", "8(x2)", 1);
        setenv("SLURM_CPUS_PER_TASK", "12", 1);
        setenv("SLURM_RESTART_COUNT", restarts, 1);
        if (max_requeues) setenv("MAX_REQUEUES", max_requeues, 1);
        unsetenv("LAUNCHER");
        if (!freopen(out, "w", stdout) || dup2(fileno(stdout), 2) < 0) _exit(126);
        execl("/bin/bash", "bash", g_script, "L1_8x7B_ep", "train.steps=5", "optim.lr=1e-4", (char*)NULL);
        _exit(127);
    }
    return pid;
}

static int finish(pid_t pid, double limit) {
    double t0 = now_sec();
    int st = 0;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (now_sec() - t0 > limit) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        usleep(20000);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_launch_line_and_done(void) {
    int rc = finish(start("exit0", "0", NULL), 10);
    char srun[4096], tr[4096], sc[256];
    slurp("srun.log", srun, sizeof srun);
    slurp("trainer.log", tr, sizeof tr);
    slurp("scontrol.log", sc, sizeof sc);
    EXPECT(rc == 0, "exit 0 passes through (rc %d)", rc);
    EXPECT(strstr(srun, "--ntasks=16") && strstr(srun, "--ntasks-per-node=8 ") && strstr(srun, "--cpu-bind=cores") &&
           strstr(srun, "--gpu-bind=none") && strstr(srun, "--cpus-per-task=12"), "srun line: %s", srun);
    char want[PATH_MAX + 64];
    snprintf(want, sizeof want, "checkpoint.dir=%s/ckpt", g_dir);
    EXPECT(strstr(tr, "--config L1_8x7B_ep") && strstr(tr, want) && strstr(tr, "checkpoint.resume=auto") &&
           strstr(tr, "train.steps=5 optim.lr=1e-4"), "trainer args: %s", tr);
    EXPECT(sc[0] == 0, "no requeue after a finished run: %s", sc);
}

static void test_exit3_requeues(void) {
    int rc = finish(start("exit3", "0", NULL), 10);
    char sc[256];
    slurp("scontrol.log", sc, sizeof sc);
    EXPECT(rc == 3, "exit 3 passes through (rc %d)", rc);
    EXPECT(strcmp(sc, "requeue 4242\n") == 0, "scontrol requeue 4242, got '%s'", sc);
}

static void test_user_error_no_requeue(void) {
    int rc = finish(start("exit2", "0", NULL), 10);
    char sc[256];
    slurp("scontrol.log", sc, sizeof sc);
    EXPECT(rc == 2 && sc[0] == 0, "exit 2 without requeue (rc %d, scontrol '%s')", rc, sc);
}

static void test_usr1_reaches_trainer(void) {
    pid_t pid = start("wait", "0", NULL);
    char ready[PATH_MAX];
    snprintf(ready, sizeof ready, "%s/ready", g_dir);
    double t0 = now_sec();
    while (access(ready, F_OK) != 0 && now_sec() - t0 < 10) usleep(20000);
    EXPECT(access(ready, F_OK) == 0, "the fake trainer started");
    kill(pid, SIGUSR1);  // what --signal=B:USR1@300 does
    int rc = finish(pid, 10);
    char sc[256], tr[4096];
    slurp("scontrol.log", sc, sizeof sc);
    slurp("trainer.log", tr, sizeof tr);
    EXPECT(strstr(tr, "got USR1"), "the trainer received SIGUSR1: %s", tr);
    EXPECT(rc == 3 && strcmp(sc, "requeue 4242\n") == 0, "requeued after the signal (rc %d, scontrol '%s')", rc, sc);
}

static void test_max_requeues(void) {
    int rc = finish(start("exit3", "5", "5"), 10);
    char sc[256], out[8192];
    slurp("scontrol.log", sc, sizeof sc);
    slurp("out.log", out, sizeof out);
    EXPECT(rc == 3 && sc[0] == 0, "no requeue past MAX_REQUEUES (rc %d, scontrol '%s')", rc, sc);
    EXPECT(strstr(out, "MAX_REQUEUES=5"), "says why: %s", out);
}

int main(void) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    CHECK(n > 0, "readlink /proc/self/exe failed");
    exe[n] = 0;
    snprintf(g_script, sizeof g_script, "%s/../../scripts/slurm/moetrain.sbatch", dirname(exe));
    CHECK(access(g_script, R_OK) == 0, "%s is missing", g_script);
    snprintf(g_dir, sizeof g_dir, "/tmp/moetrain_slurm_XXXXXX");
    CHECK(mkdtemp(g_dir), "mkdtemp failed");
    // srun: log the options, run the program in place (exec, so signals hit it directly).
    write_exe("srun", "opts=()\nwhile [ $# -gt 0 ] && [ \"${1#--}\" != \"$1\" ]; do opts+=(\"$1\"); shift; done\n"
                      "echo \"${opts[*]} \" >> \"$FAKE_DIR/srun.log\"\nexec \"$@\"\n");
    write_exe("scontrol", "echo \"$*\" >> \"$FAKE_DIR/scontrol.log\"\n");
    write_exe("fake_moetrain",
              "echo \"$*\" >> \"$FAKE_DIR/trainer.log\"\n"
              "case \"$FAKE_MODE\" in\n"
              "  exit0) exit 0 ;; exit2) exit 2 ;; exit3) exit 3 ;;\n"
              "  wait) trap 'echo got USR1 >> \"$FAKE_DIR/trainer.log\"; exit 3' USR1\n"
              "        touch \"$FAKE_DIR/ready\"; for i in $(seq 100); do sleep 0.1; done; exit 9 ;;\n"
              "esac\n");
    RUN(test_launch_line_and_done);
    RUN(test_exit3_requeues);
    RUN(test_user_error_no_requeue);
    RUN(test_usr1_reaches_trainer);
    RUN(test_max_requeues);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    TEST_END();
}
