// test_watchdog.c — a stuck rank (watchdog.c), with the real binary under scripts/mpirun.sh -np 2:
// a rank stopped during training or never arriving in a start-up stage ends the job with exit 1
// within the stage's timeout, the stage and the missing rank named.
#define _GNU_SOURCE

#include "run_util.h"

// The pid of the moetrain process below `root` (any depth up to 4) whose OMPI_COMM_WORLD_RANK is
// `rank`; 0 when none.
static pid_t find_rank(pid_t root, int rank) {
    pid_t ranks[64];
    const int n = find_ranks(root, ranks, 64);
    char want[64];
    const int wl = snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", rank);
    for (int r = 0; r < n; r++) {
        char p[64], env[65536];
        snprintf(p, sizeof p, "/proc/%d/environ", (int)ranks[r]);
        FILE* f = fopen(p, "r");
        size_t m = f ? fread(env, 1, sizeof env - 1, f) : 0;
        if (f) fclose(f);
        env[m] = 0;
        for (size_t o = 0; o < m; o += strlen(env + o) + 1)
            if (!strncmp(env + o, want, (size_t)wl) && env[o + (size_t)wl] == 0) return ranks[r];
    }
    return 0;
}

// SIGSTOP on rank 1 of `mpirun -np 2`: rank 0's watchdog ends the job with exit 1 within the
// stage's timeout (train.timeout_s=6, raised to 10 x the slowest step), naming the stage it
// waited in and rank 1.
static void test_watchdog_stopped_rank(void) {
    char lg[400], log[400], metrics[500];
    snprintf(lg, sizeof lg, "%s/wd_log", g_dir);
    snprintf(log, sizeof log, "%s/wd.out", g_dir);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", lg);
    pid_t pid = spawn(log, "exec scripts/mpirun.sh -np 2 %s " TINY2 " train.steps=100000 train.timeout_s=6 log.dir=%s",
                      g_bin, lg);
    double t0 = now_sec();
    while (count_lines(metrics) < 4 && now_sec() - t0 < 60) usleep(20000);
    pid_t r1 = find_rank(pid, 1);
    EXPECT(r1 > 0, "found rank 1 under %d", (int)pid);
    if (r1 > 0) kill(r1, SIGSTOP);
    double secs;
    int rc = reap(pid, 120, &secs);
    EXPECT(rc == 1, "exit code 1 (got %d; see %s)", rc, log);
    char buf[65536] = "";
    FILE* f = fopen(log, "r");
    size_t k = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[k] = 0;
    const char* m = strstr(buf, "moetrain: rank 0: watchdog: waited ");
    double to = -1;
    const char* tt = m ? strstr(m, "the timeout of this stage: ") : NULL;
    if (tt) to = atof(tt + 27);
    EXPECT(m && strstr(m, "ranks that did not arrive: rank 1 (") && to > 0,
           "rank 0 names the stage and rank 1: %.600s", m ? m : buf);
    EXPECT(to > 0 && secs < to + 15, "ended within the stage's timeout (%.1f s after the stop; timeout %.0f s)", secs, to);
}

// A rank that never arrives during start-up (the failpoint train.startup_stall stops rank 1 for
// good in a start-up stage): rank 0's watchdog ends the job with exit 1 within
// train.timeout_s=2, naming the start-up stage it waited in and rank 1 with where it is. At the
// end of "device" rank 1 stops before the communicator exists (the heartbeat token from the
// launcher's job id); at the end of "restore" after the checkpoint restore; at the beginning of
// the lock stage within the stage rank 0 waits in, a collective call behind it.
typedef struct Stall {
    const char *stall, *waits_in, *rank1;
    char log[400];
    pid_t pid;
    double t0;
} Stall;

static void stall_start(Stall* x) {
    char ck[400], name[64];
    snprintf(name, sizeof name, "%s", x->stall);
    for (char* c = name; *c; c++)
        if (*c == ':') *c = '_';
    snprintf(ck, sizeof ck, "%s/stall_%s_ck", g_dir, name);
    snprintf(x->log, sizeof x->log, "%s/stall_%s.out", g_dir, name);
    x->t0 = now_sec();
    x->pid = spawn(x->log, "MOETRAIN_STARTUP_STALL=1:%s exec scripts/mpirun.sh -np 2 -x MOETRAIN_STARTUP_STALL %s " TINY2
                   " train.steps=5 train.timeout_s=2 checkpoint.dir=%s log.dir=", x->stall, g_bin, ck);
}

static void stall_check(Stall* x) {
    int rc = reap(x->pid, 60, NULL);
    const double secs = now_sec() - x->t0;
    char buf[65536] = "", want[300];
    t_read_text(x->log, buf, sizeof buf);
    const char* m = strstr(buf, "moetrain: rank 0: watchdog: waited ");
    snprintf(want, sizeof want, "s in '%s' during start-up (the timeout of this stage: 2 s", x->waits_in);
    EXPECT(rc == 1 && m && strstr(m, want), "%s: exit 1 and the stage rank 0 waited in (rc %d, %.1f s): %.3000s", x->stall,
           rc, secs, m ? m : buf);
    snprintf(want, sizeof want, "ranks that did not arrive: rank 1 (in '%s", x->rank1);
    EXPECT(m && strstr(m, want), "%s: rank 1 named with where it is: %.1000s", x->stall, m ? m : buf);
    EXPECT(!strstr(buf, "did not arrive: rank 0"), "%s: rank 0 (further) is never named: %.3000s", x->stall, buf);
    EXPECT(secs < 2 + 20, "%s: ended within seconds of the timeout (%.1f s)", x->stall, secs);
    EXPECT(!strstr(buf, "step     1/"), "%s: no step ran", x->stall);
}

// The three jobs run at the same time (each mostly waits).
static void test_watchdog_startup(void) {
    Stall x[] = {
        {.stall = "device", .waits_in = "start-up: communicator", .rank1 = "start-up: device' during start-up for "},
        {.stall = "restore", .waits_in = "start-up: run id, log.dir",
         .rank1 = "start-up: checkpoint restore' during start-up for "},
        {.stall = "lock:begin", .waits_in = "start-up: checkpoint.dir lock",
         .rank1 = "start-up: checkpoint.dir lock' too, 1 collective call behind: still in its own work"},
    };
    for (int i = 0; i < 3; i++) stall_start(&x[i]);
    for (int i = 0; i < 3; i++) stall_check(&x[i]);
}

int main(int argc, char** argv) {
    if (run_begin(argc, argv, "watchdog")) return 1;
    RUN_IF(test_watchdog_stopped_rank);
    RUN_IF(test_watchdog_startup);
    if (!t_failed) sh("rm -rf %s", g_dir);
    TEST_END();
}
