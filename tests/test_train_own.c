// test_train_own.c — a run owns its checkpoint directory (train_own.c), with the real binary: a
// used checkpoint.dir refused or overwritten, log.dir's metrics rotated, the lock (a live holder,
// a stale one, one from another host judged by its age, refreshed while the run holds it, taken
// over), and resume=auto and saves touching only this run's checkpoints.
#define _GNU_SOURCE
#include <sys/stat.h>
#include <time.h>

#include "run_util.h"

// A fresh run into a used checkpoint.dir is refused with the choices; overwrite=true replaces the
// checkpoints; a fresh run into a used log.dir rotates the old metrics.jsonl aside.
static void test_used_checkpoint_dir(void) {
    char out[65536], ck[400], lg[400], p[600], own[256], st[65536];
    snprintf(ck, sizeof ck, "%s/used_ck", g_dir);
    snprintf(lg, sizeof lg, "%s/used_log", g_dir);
    int rc = run(out, sizeof out, NULL, "%s " TINY " train.steps=2 checkpoint.dir=%s log.dir=%s", g_bin, ck, lg);
    EXPECT(rc == 0, "run A (rc %d): %s", rc, out);
    snprintf(p, sizeof p, "%s/owner", ck);
    t_read_text(p, own, sizeof own);
    EXPECT(!strncmp(own, "run_id ", 7), "owner file: '%s'", own);
    // the key's default (L0_sanity, a demo, sets checkpoint.overwrite: true)
    rc = run(out, sizeof out, NULL, "%s " TINY " train.steps=3 checkpoint.dir=%s log.dir=%s checkpoint.overwrite=false",
             g_bin, ck, lg);
    // step_00000002 and best/step_00000002 (L0_sanity keeps the best)
    EXPECT(rc == 2 && strstr(out, "already holds 2 checkpoint(s)") && strstr(out, "checkpoint.resume=auto") &&
               strstr(out, "another checkpoint.dir") && strstr(out, "checkpoint.overwrite=true"),
           "a fresh run into a used dir is refused with the choices: rc %d, %s", rc, out);
    snprintf(p, sizeof p, "%s/step_00000002", ck);
    EXPECT(access(p, F_OK) == 0, "run A's checkpoint is untouched");
    snprintf(p, sizeof p, "%s/.lock", ck);
    EXPECT(access(p, F_OK) != 0, "the refused run released the lock it had taken");
    snprintf(p, sizeof p, "%s/.heartbeat", ck);
    EXPECT(access(p, F_OK) != 0, "and left no heartbeat files");
    snprintf(p, sizeof p, "%s/step_00000002", ck);
    rc = run(out, sizeof out, NULL, "%s " TINY " train.steps=3 checkpoint.dir=%s log.dir=%s checkpoint.overwrite=true",
             g_bin, ck, lg);
    EXPECT(rc == 0 && strstr(out, "removed 1 earlier checkpoint(s) and best/"), "overwrite=true (rc %d): %s", rc, out);
    EXPECT(access(p, F_OK) != 0, "run A's checkpoint is gone");
    snprintf(p, sizeof p, "%s/best/step_00000002", ck);
    EXPECT(access(p, F_OK) != 0, "run A's best checkpoint is gone");
    snprintf(p, sizeof p, "%s/best/step_00000003", ck);
    EXPECT(access(p, F_OK) == 0, "the new run's best checkpoint is there");
    char own2[256];
    snprintf(p, sizeof p, "%s/owner", ck);
    t_read_text(p, own2, sizeof own2);
    EXPECT(own2[0] && strcmp(own, own2), "a new owner ('%s' after '%s')", own2, own);
    snprintf(p, sizeof p, "%s/step_00000003/trainer_state.yaml", ck);
    t_read_text(p, st, sizeof st);
    EXPECT(strstr(st, own2 + 7) != NULL, "the checkpoint records the owner's run id");
    snprintf(p, sizeof p, "%s/metrics.jsonl.1", lg);
    EXPECT(count_lines(p) == 2, "the first run's metrics rotated to metrics.jsonl.1 (%d lines)", count_lines(p));
    snprintf(p, sizeof p, "%s/metrics.jsonl", lg);
    t_read_text(p, st, sizeof st);
    char want[64];
    snprintf(want, sizeof want, "{\"run_id\": \"%.16s\", \"step\": 1,", own2 + 7);
    EXPECT(count_lines(p) == 3 && strstr(st, want), "metrics.jsonl holds the new run's 3 lines with its id: %s", st);
    snprintf(p, sizeof p, "%s/.lock", ck);
    EXPECT(access(p, F_OK) != 0, "the lock is gone after the run");
}

// A lock held by a live process refuses the run and names it; one whose process is gone is
// replaced.
static void test_lock(void) {
    char out[65536], ck[400], p[600], host[256] = "";
    snprintf(ck, sizeof ck, "%s/lock_ck", g_dir);
    mkdir(ck, 0755);
    gethostname(host, sizeof host - 1);
    snprintf(p, sizeof p, "%s/.lock", ck);
    FILE* f = fopen(p, "w");
    fprintf(f, "host %s\npid %d\nrun_id 0123456789abcdef\nslurm_job -\nstarted 2026-01-01 00:00:00\n", host, (int)getppid());
    fclose(f);
    int rc = run(out, sizeof out, NULL, "%s " TINY " train.steps=2 checkpoint.dir=%s", g_bin, ck);
    char want[128];
    snprintf(want, sizeof want, "in use by another run (run 0123456789abcdef, pid %d on host %s", (int)getppid(), host);
    EXPECT(rc == 2 && strstr(out, want), "a live holder is named: rc %d, %s", rc, out);
    snprintf(want, sizeof want, "Wait for process %d on this host to end", (int)getppid());
    EXPECT(strstr(out, want) && !strstr(out, "Slurm job -") && !strstr(out, "remove "),
           "on this host: wait for its live process, no Slurm job when there is none, no removal advised: %s", out);
    snprintf(p, sizeof p, "%s/.heartbeat", ck);
    EXPECT(access(p, F_OK) != 0, "the refused run leaves no heartbeat files in the other run's directory");
    snprintf(p, sizeof p, "%s/.lock", ck);
    pid_t gone = fork();
    if (gone == 0) _exit(0);
    waitpid(gone, NULL, 0);
    f = fopen(p, "w");
    fprintf(f, "host %s\npid %d\nrun_id 0123456789abcdef\nslurm_job -\nstarted 2026-01-01 00:00:00\n", host, (int)gone);
    fclose(f);
    rc = run(out, sizeof out, NULL, "%s " TINY " train.steps=2 checkpoint.dir=%s", g_bin, ck);
    EXPECT(rc == 0 && strstr(out, "a stale lock") && strstr(out, "its process is gone"), "a stale lock is replaced: rc %d, %s",
           rc, out);
    EXPECT(access(p, F_OK) != 0, "and removed at the end");
}

#define FAR_LOCK "host far-away.example\npid 4242\nrun_id fedcba9876543210\nslurm_job 777\nstarted 2026-01-01 00:00:00\n"

// Writes `text` to path through a temporary and rename (as atomic as a real holder's lock), with
// the modification time `age` seconds ago.
static void put_lock(const char* path, const char* text, double age) {
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.test", path);
    FILE* f = fopen(tmp, "w");
    fputs(text, f);
    fclose(f);
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= (time_t)age;
    ts[1] = ts[0];
    EXPECT(utimensat(AT_FDCWD, tmp, ts, 0) == 0 && rename(tmp, path) == 0, "lock %s written", path);
}

static double age_of(const char* path) {
    struct stat st;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return stat(path, &st) ? -1 : (double)(now.tv_sec - st.st_mtim.tv_sec);
}

// A lock from another host (whose pid cannot be checked) is judged by its age: refreshed within
// the last 10 minutes, it stops the run with the holder named (host, pid, Slurm job); older, it is
// taken over with a warning.
static void test_lock_other_host(void) {
    char out[65536], ck[400], p[600];
    snprintf(ck, sizeof ck, "%s/far_ck", g_dir);
    mkdir(ck, 0755);
    snprintf(p, sizeof p, "%s/.lock", ck);
    const double ages[] = {0, 9 * 60};
    for (int i = 0; i < 2; i++) {
        put_lock(p, FAR_LOCK, ages[i]);
        int rc = run(out, sizeof out, NULL, "%s " TINY " train.steps=2 checkpoint.dir=%s", g_bin, ck);
        EXPECT(rc == 2 && strstr(out, "in use by another run (run fedcba9876543210, pid 4242 on host far-away.example, "
                                      "Slurm job 777, since 2026-01-01 00:00:00, lock refreshed ") &&
                   strstr(out, "not refreshed for 10 min is taken over"),
               "a lock refreshed %.0f s ago is refused, the holder named: rc %d, %s", ages[i], rc, out);
    }
    // the lock comes before the data and the model: a run whose data directory holds no data (which
    // opening the data would refuse) is refused for the lock
    char empty[500];
    snprintf(empty, sizeof empty, "%s/empty_data", g_dir);
    mkdir(empty, 0755);
    int rc0 = run(out, sizeof out, NULL, "%s " TINY " train.steps=2 checkpoint.dir=%s data.format=auto data.path=%s", g_bin, ck, empty);
    EXPECT(rc0 == 2 && strstr(out, "in use by another run") && !strstr(out, "error: data"),
           "the lock is checked before the data is opened: rc %d, %s", rc0, out);
    put_lock(p, FAR_LOCK, 11 * 60 + 5);
    int rc = run(out, sizeof out, NULL, "%s " TINY " train.steps=2 checkpoint.dir=%s", g_bin, ck);
    EXPECT(rc == 0 && strstr(out, "checkpoint: warning: a stale lock ") &&
               strstr(out, "(run fedcba9876543210, pid 4242 on far-away.example, Slurm job 777, not refreshed for 11 min"),
           "one not refreshed for 11 min is taken over with a warning: rc %d, %s", rc, out);
    EXPECT(access(p, F_OK) != 0, "and removed at the end");
}

// The holder refreshes its lock while it runs (every second here: failpoint ckpt.lock_refresh_s);
// a lock removed by hand is taken again at the next save; a lock taken over by another run (as
// after this run was stopped for long) stops it at its next save with exit 2, the other run
// named, its lock left in place.
static void test_lock_refresh(void) {
    char ck[400], lg[400], log[400], metrics[500], p[600];
    snprintf(ck, sizeof ck, "%s/refresh_ck", g_dir);
    snprintf(lg, sizeof lg, "%s/refresh_log", g_dir);
    snprintf(log, sizeof log, "%s/refresh.out", g_dir);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", lg);
    snprintf(p, sizeof p, "%s/.lock", ck);
    pid_t pid = spawn(log, "MOETRAIN_LOCK_REFRESH_S=1 exec %s " TINY " train.steps=1000000 checkpoint.every=20 "
                      "checkpoint.keep=1 checkpoint.keep_best=false log.every=1000000 log.dir=%s checkpoint.dir=%s", g_bin, lg, ck);
    double t0 = now_sec();
    while (count_lines(metrics) < 2 && now_sec() - t0 < 60) usleep(20000);
    char mine[1200] = "";
    t_read_text(p, mine, sizeof mine);
    EXPECT(strstr(mine, "run_id "), "the run holds the lock: '%s'", mine);
    put_lock(p, mine, 3600);
    EXPECT(age_of(p) >= 3590, "the lock made an hour old (%.0f s)", age_of(p));
    t0 = now_sec();
    while (age_of(p) > 60 && now_sec() - t0 < 15) usleep(50000);
    EXPECT(age_of(p) >= 0 && age_of(p) <= 60, "the holder refreshed it (%.0f s old after %.1f s)", age_of(p), now_sec() - t0);
    EXPECT(unlink(p) == 0, "the lock removed by hand");
    EXPECT(wait_for(log, "was removed while this run held it; taken again", 30), "taken again at the next save");
    char again[1200] = "";
    t_read_text(p, again, sizeof again);
    EXPECT(!strcmp(again, mine), "the same lock: '%s'", again);
    put_lock(p, FAR_LOCK, 0);
    double secs;
    int rc = reap(pid, 60, &secs);
    static char buf[4 << 20];
    t_read_text(log, buf, sizeof buf);
    EXPECT(rc == 2 && strstr(buf, "was taken over by another run (run fedcba9876543210, pid 4242 on host far-away.example)") &&
               strstr(buf, "not saving"),
           "stopped at the next save (rc %d, %.1f s): %s", rc, secs, buf + (strlen(buf) > 3000 ? strlen(buf) - 3000 : 0));
    char now[1200] = "";
    t_read_text(p, now, sizeof now);
    EXPECT(!strcmp(now, FAR_LOCK), "the other run's lock is left in place: '%s'", now);
}

// resume=auto after a corrupt newest save falls back only to this run's checkpoints (another
// run's checkpoint in the directory is skipped); a save removes only this run's temporaries.
static void test_resume_own_only(void) {
    char out[65536], a[400], b[400], p[800];
    snprintf(a, sizeof a, "%s/own_a", g_dir);
    snprintf(b, sizeof b, "%s/own_b", g_dir);
    int rc = run(out, sizeof out, NULL, "%s " TINY " train.steps=3 checkpoint.every=1 checkpoint.keep=0 checkpoint.dir=%s && "
                 "%s " TINY " train.steps=5 checkpoint.every=1 checkpoint.keep=0 checkpoint.dir=%s", g_bin, a, g_bin, b);
    EXPECT(rc == 0, "runs A and B (rc %d): %s", rc, out);
    rc = sh("cp -r %s/step_00000004 %s/ && truncate -s 100 %s/step_00000003/rank_00000.safetensors && "
            "mkdir %s/.tmp_step_00000009.feedfeedfeedfeed %s/.tmp_step_00000008", b, a, a, a, a);
    EXPECT(rc == 0, "B's step 4 copied into A's directory, A's step 3 damaged");
    rc = run(out, sizeof out, NULL, "%s " TINY " train.steps=4 checkpoint.every=1 checkpoint.keep=0 checkpoint.dir=%s "
             "checkpoint.resume=auto", g_bin, a);
    EXPECT(rc == 0 && strstr(out, "step_00000004: it belongs to another run") && strstr(out, "resumed from") &&
               strstr(out, "step_00000002: step 2"),
           "resumed from A's step 2, not B's step 4: rc %d, %s", rc, out);
    snprintf(p, sizeof p, "%s/.tmp_step_00000009.feedfeedfeedfeed", a);
    EXPECT(access(p, F_OK) == 0, "another run's save in progress is left alone");
    snprintf(p, sizeof p, "%s/.tmp_step_00000008", a);
    EXPECT(access(p, F_OK) != 0, "an unnamed stale temporary is removed");
}

int main(int argc, char** argv) {
    if (run_begin(argc, argv, "own")) return 1;
    RUN_IF(test_used_checkpoint_dir);
    RUN_IF(test_lock);
    RUN_IF(test_lock_other_host);
    RUN_IF(test_resume_own_only);
    RUN_IF(test_lock_refresh);
    if (!t_failed) sh("rm -rf %s", g_dir);
    TEST_END();
}
