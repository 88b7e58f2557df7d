// test_dist_fail.c — the process layer under failure: runs tests/helper_fail.c under
// `scripts/mpirun.sh -np 2` and checks that a FATAL on one rank ends the whole job within
// seconds (whether the other rank waits in a collective or computes), that a user error on one
// rank makes every rank exit 2 with that rank's message on rank 0, and that an MPI error is
// named by MPI_CHECK. Each job runs under timeout(1), so a hang fails instead of blocking.
#define _DEFAULT_SOURCE
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util.h"
#include "test.h"

static char g_helper[PATH_MAX], g_mpirun[PATH_MAX];
enum { HANG_LIMIT = 20 };     // timeout(1) for one job: a hang shows as exit 124
static const double FAST = 10; // seconds a failing job may take to end (mpirun start ~1 s)

static int run(const char* mode, char* out, size_t n, double* secs) {
    char cmd[3 * PATH_MAX];
    snprintf(cmd, sizeof cmd, "timeout %d %s -np 2 %s %s 2>&1", HANG_LIMIT, g_mpirun, g_helper, mode);
    double t0 = now_sec();
    FILE* p = popen(cmd, "r");
    size_t got = 0, k;
    while (p && got < n - 1 && (k = fread(out + got, 1, n - 1 - got, p)) > 0) got += k;
    out[got] = 0;
    int st = p ? pclose(p) : -1;
    *secs = now_sec() - t0;
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_ok_control(void) {
    char out[65536];
    double s;
    int rc = run("ok", out, sizeof out, &s);
    EXPECT(rc == 0, "exit 0 (rc %d): %s", rc, out);
    EXPECT(strstr(out, "helper: rank 0 ok") && strstr(out, "helper: rank 1 ok"), "both ranks ran: %s", out);
}

static void check_fatal(const char* mode) {
    char out[65536];
    double s;
    int rc = run(mode, out, sizeof out, &s);
    EXPECT(rc != 0 && rc != 124, "%s: the job exits non-zero, not by timeout (rc %d)", mode, rc);
    EXPECT(s < FAST, "%s: every rank ended within %.0f s (took %.1f s)", mode, FAST, s);
    EXPECT(strstr(out, "moetrain: rank 1: ") && strstr(out, "deliberate fatal on rank 1"),
           "%s: rank 1's message is printed: %s", mode, out);
    EXPECT(!strstr(out, "was not stopped"), "%s: rank 0 went on: %s", mode, out);
}

static void test_fatal_in_collective(void) { check_fatal("fatal"); }
static void test_fatal_while_computing(void) { check_fatal("fatal_busy"); }

static void test_user_error(void) {
    char out[65536];
    double s;
    int rc = run("usererr", out, sizeof out, &s);
    EXPECT(rc == 2, "exit code 2 (rc %d): %s", rc, out);
    EXPECT(strstr(out, "helper: rank 0 exits 2") && strstr(out, "helper: rank 1 exits 2"), "both ranks exit 2: %s", out);
    EXPECT(strstr(out, "moetrain: error: rank 1: bad value for key x"), "rank 0 prints rank 1's message: %s", out);
    EXPECT(s < FAST, "no hang (%.1f s)", s);
}

static void test_mpi_error_named(void) {
    char out[65536];
    double s;
    int rc = run("mpierr", out, sizeof out, &s);
    EXPECT(rc != 0 && rc != 124, "exits non-zero (rc %d)", rc);
    EXPECT(strstr(out, "MPI error in `MPI_Bcast(") && strstr(out, "comm_mpi.c:"), "MPI_CHECK names the call: %s", out);
    EXPECT(!strstr(out, "was not stopped"), "nobody went on: %s", out);
    EXPECT(s < FAST, "no hang (%.1f s)", s);
}

int main(void) {
    // The helper sits next to this binary; the repository root is two levels above build/tests.
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    CHECK(n > 0, "readlink /proc/self/exe failed");
    exe[n] = 0;
    char* dir = dirname(exe);
    snprintf(g_helper, sizeof g_helper, "%s/helper_fail", dir);
    snprintf(g_mpirun, sizeof g_mpirun, "%s/../../scripts/mpirun.sh", dir);
    CHECK(access(g_helper, X_OK) == 0, "%s is missing: build it with make %s", g_helper, "build/tests/helper_fail");
    CHECK(access(g_mpirun, X_OK) == 0, "%s is missing", g_mpirun);
    RUN(test_ok_control);
    RUN(test_fatal_in_collective);
    RUN(test_fatal_while_computing);
    RUN(test_user_error);
    RUN(test_mpi_error_named);
    TEST_END();
}
