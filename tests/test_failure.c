// test_failure.c — a failure on one rank ends every rank, with its message, within seconds;
// a user error on every rank exits 2 with the message, nothing hangs.
#define _DEFAULT_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util.h"
#include "test.h"
#include "test_resume_util.h"

static char g_bin[4096];  // BUILD/moetrain of this test binary's BUILD (find_moetrain)

// Runs fmt (one %s: the moetrain binary) through the shell.
static int run(const char* fmt, char* out, size_t n, double* secs) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, fmt, g_bin);
    double t0 = now_sec();
    FILE* p = popen(cmd, "r");
    size_t got = p ? fread(out, 1, n - 1, p) : 0;
    out[got] = 0;
    int st = p ? pclose(p) : -1;
    *secs = now_sec() - t0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_fatal_on_one_rank(void) {
    char out[65536];
    double secs;
    int rc = run("MOETRAIN_FAIL_RANK=1 timeout 60 scripts/mpirun.sh -np 2 -x MOETRAIN_FAIL_RANK %s "
                 "--config L0_sanity train.steps=50 optim.warmup=2 log.dir= 2>&1", out, sizeof out, &secs);
    EXPECT(rc != 0 && rc != 124, "job exits non-zero (rc %d)", rc);
    EXPECT(strstr(out, "rank 1") && strstr(out, "injected failure"), "the failing rank's message: %s", out);
    EXPECT(secs < 30, "every rank ended within seconds (%.1f s)", secs);
}

// train.device=cuda where the backend cannot start (the CI machine has no GPU): every rank exits
// 2 with the reason, before any communicator is built (nothing waits in a collective).
static void test_no_gpu_all_ranks(void) {
    if (system("nvidia-smi -L > /dev/null 2>&1") == 0) {
        printf("     skipped: this machine has a GPU (the case needs one without)\n");
        return;
    }
    char out[65536];
    double secs;
    int rc = run("timeout 60 scripts/mpirun.sh -np 2 %s --config L0_sanity train.device=cuda log.dir= 2>&1",
                 out, sizeof out, &secs);
    EXPECT(rc == 2, "exit code 2 (rc %d)", rc);
    EXPECT(strstr(out, "train.device=cuda, but no CUDA backend"), "the reason: %s", out);
    EXPECT(secs < 30, "no hang (%.1f s)", secs);
}

static void test_user_error_all_ranks(void) {
    char out[65536];
    double secs;
    int rc = run("timeout 60 scripts/mpirun.sh -np 2 %s --config L0_sanity data.path=/no/such.fa 2>&1", out,
                 sizeof out, &secs);
    EXPECT(rc == 2, "exit code 2 (rc %d)", rc);
    EXPECT(strstr(out, "/no/such.fa"), "message names the file: %s", out);
    EXPECT(secs < 30, "no hang (%.1f s)", secs);
}

int main(int argc, char** argv) {
    if (find_moetrain(argv[0], g_bin, sizeof g_bin)) return 1;
    RUN(test_fatal_on_one_rank);
    RUN(test_no_gpu_all_ranks);
    RUN(test_user_error_all_ranks);
    TEST_END();
}
