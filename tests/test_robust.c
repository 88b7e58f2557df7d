// test_robust.c — a run on shared disks, under preemption and with a stuck rank, with the real
// binary: every log write checked (a full disk, real through /dev/full and injected), the
// messages of the start-up checks (empty config, a directory as --config, limits the kernels
// have, nested YAML refused fast, inspect on an unreadable rank file, NaN weights from
// init_from, resume on other data).
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>

#include "safetensors.h"
#include "test_resume_util.h"

static char g_dir[256], g_bin[4096];
static pid_t spawn(const char* log, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static int reap(pid_t pid, double limit, double* secs);
static int wait_for(const char* path, const char* needle, double limit);

// A tiny model on random tokens, one rank.
#define TINY                                                                                                   \
    "--config L0_sanity parallel.ep=1 train.device=cpu data.format=random model.hidden=32 model.ffn=48 "       \
    "model.vocab_size=64 train.seq_len=16 train.micro_batch=2 train.global_batch=2 optim.warmup=1 "            \
    "train.eval_batches=1 log.every=1 log.dir="

// Runs `cmd` (printf-style) through the shell with stdout+stderr into out[n]; returns the exit
// code (-1 when killed by a signal).
static int run(char* out, size_t n, double* secs, const char* fmt, ...) __attribute__((format(printf, 4, 5)));
static int run(char* out, size_t n, double* secs, const char* fmt, ...) {
    char cmd[8192], full[8400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "( %s ) 2>&1", cmd);
    double t0 = now_sec();
    FILE* p = popen(full, "r");
    size_t got = 0;
    if (p)
        for (size_t k; got < n - 1 && (k = fread(out + got, 1, n - 1 - got, p)) > 0;) got += k;
    out[got] = 0;
    if (p) {  // drain what did not fit
        char sink[4096];
        while (fread(sink, 1, sizeof sink, p) > 0) {}
    }
    int st = p ? pclose(p) : -1;
    if (secs) *secs = now_sec() - t0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static long file_size(const char* path) {
    struct stat st;
    return stat(path, &st) ? -1 : (long)st.st_size;
}

// ---- 1. every write checked -------------------------------------------------------------------

// log.dir on a full disk: metrics.jsonl is /dev/full (every write fails with ENOSPC).
static void test_metrics_disk_full(void) {
    char out[65536], d[400], p[500];
    snprintf(d, sizeof d, "%s/full", g_dir);
    mkdir(d, 0755);
    snprintf(p, sizeof p, "%s/metrics.jsonl", d);
    EXPECT(symlink("/dev/full", p) == 0, "symlink %s", p);
    int rc = run(out, sizeof out, NULL, "%s " TINY " train.steps=6 log.dir=%s", g_bin, d);
    EXPECT(rc == 2, "exit code 2 on a full disk (rc %d): %s", rc, out);
    EXPECT(strstr(out, "metrics.jsonl: write failed after 0 bytes: No space left on device") &&
               strstr(out, "stopping at step 1"),
           "the message names the file, the reason and the step: %s", out);
}

// The injected failure: writes fail after 900 bytes (two lines of ~370 bytes and a part of the third); the
// run stops at that step with exit 2; a resume trims the torn line and the trace joins.
static void test_metrics_injected_failure(void) {
    char out[65536], d[400], ck[400], p[500];
    snprintf(d, sizeof d, "%s/inj", g_dir);
    snprintf(ck, sizeof ck, "%s/inj_ck", g_dir);
    int rc = run(out, sizeof out, NULL, "MOETRAIN_METRICS_FAIL_AFTER=900 %s " TINY " train.steps=6 checkpoint.every=1 "
                 "checkpoint.dir=%s log.dir=%s", g_bin, ck, d);
    EXPECT(rc == 2, "exit code 2 (rc %d): %s", rc, out);
    EXPECT(strstr(out, "write failed after 900 bytes: No space left on device") && strstr(out, "stopping at step 3"),
           "the message: %s", out);
    snprintf(p, sizeof p, "%s/metrics.jsonl", d);
    EXPECT(file_size(p) == 900, "900 bytes written (%ld)", file_size(p));
    rc = run(out, sizeof out, NULL, "%s " TINY " train.steps=6 checkpoint.every=1 checkpoint.dir=%s log.dir=%s "
             "checkpoint.resume=auto", g_bin, ck, d);
    EXPECT(rc == 0, "the resumed run (rc %d): %s", rc, out);
    double loss[16];
    int n = read_losses(p, loss, 16);
    EXPECT(n == 6, "6 whole lines after the resume (%d)", n);
    char* tr[16];
    int m = read_trace(p, tr, 16);
    for (int i = 0; i < m; i++) {
        char want[32];
        snprintf(want, sizeof want, "\"step\": %d,", i + 1);
        EXPECT(strstr(tr[i], want) && tr[i][strlen(tr[i]) - 1] == '\n', "line %d: %s", i + 1, tr[i]);
    }
    free_trace(tr, m > 0 ? m : 0);
}

// ---- 2, 3. run ownership -----------------------------------------------------------------------

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

// ---- 6. messages ------------------------------------------------------------------------------

static void test_config_messages(void) {
    char out[65536], p[400];
    snprintf(p, sizeof p, "%s/empty.yaml", g_dir);
    FILE* f = fopen(p, "w");
    fputs("# nothing here\n", f);
    fclose(f);
    int rc = run(out, sizeof out, NULL, "%s --config %s", g_bin, p);
    EXPECT(rc == 2 && strstr(out, "the config is empty (no sections)"), "empty config: rc %d, %s", rc, out);
    rc = run(out, sizeof out, NULL, "%s --config %s", g_bin, g_dir);
    EXPECT(rc == 2 && strstr(out, "is a directory; give a file in it"), "--config DIR: rc %d, %s", rc, out);
    rc = run(out, sizeof out, NULL, "%s plan --config L0_sanity model.experts=128", g_bin);
    EXPECT(rc == 2 && strstr(out, "model.experts: 128 is out of range (expected 1 to 64)"), "experts: rc %d, %s", rc, out);
    rc = run(out, sizeof out, NULL, "%s plan --config L0_sanity model.top_k=17", g_bin);
    EXPECT(rc == 2 && strstr(out, "model.top_k: 17 is out of range (expected 1 to 16)"), "top_k: rc %d, %s", rc, out);
    rc = run(out, sizeof out, NULL, "%s plan --config L0_sanity parallel.ep=128", g_bin);
    EXPECT(rc == 2 && strstr(out, "parallel.ep: 128 is out of range (expected 1 to 64)"), "ep: rc %d, %s", rc, out);
    rc = run(out, sizeof out, NULL, "%s plan --config L0_sanity model.hidden=4096 model.heads=2 model.kv_heads=1", g_bin);
    EXPECT(rc == 2 && strstr(out, "exceeds 1024"), "head dim: rc %d, %s", rc, out);
    // 200 KB of nested brackets: refused at once (libyaml alone takes minutes over it)
    snprintf(p, sizeof p, "%s/nested.yaml", g_dir);
    f = fopen(p, "w");
    for (int i = 0; i < 100000; i++) fputc('[', f);
    for (int i = 0; i < 100000; i++) fputc(']', f);
    fclose(f);
    double secs;
    rc = run(out, sizeof out, &secs, "timeout 60 %s --config %s", g_bin, p);
    EXPECT(rc == 2 && strstr(out, "nested more than 32 levels deep"), "nested YAML: rc %d, %s", rc, out);
    EXPECT(secs < 10, "refused within seconds (%.1f s)", secs);
}

// A rank file whose header cannot be read, listed in a manifest that agrees with it (sizes and
// checksums hold): inspect says BAD and exits 1.
static void test_inspect_unreadable_header(void) {
    char out[65536], ck[400], p[600];
    snprintf(ck, sizeof ck, "%s/insp", g_dir);
    int rc = run(out, sizeof out, NULL, "%s " TINY " train.steps=2 checkpoint.dir=%s", g_bin, ck);
    EXPECT(rc == 0, "train (rc %d): %s", rc, out);
    rc = run(out, sizeof out, NULL, "%s inspect %s", g_bin, ck);
    EXPECT(rc == 0 && strstr(out, "result: OK"), "intact: rc %d, %s", rc, out);
    // garble the header length, then rewrite the manifest with the file's new crc
    snprintf(p, sizeof p, "%s/step_00000002/rank_00000.safetensors", ck);
    int fd = open(p, O_WRONLY);
    uint64_t huge = (uint64_t)1 << 62;
    EXPECT(fd >= 0 && pwrite(fd, &huge, 8, 0) == 8, "garble %s", p);
    close(fd);
    rc = sh("cd %s/step_00000002 && crc=$(python3 -c \"import zlib;print('%%08x'%%(zlib.crc32(open('rank_00000.safetensors','rb').read())))\") && "
            "awk -v c=$crc '/^file rank_00000/{$4=c} !/^crc32/{print}' manifest.txt > m && "
            "python3 -c \"import zlib;t=open('m','rb').read();open('manifest.txt','wb').write(t+b'crc32 %%08x\\n'%%zlib.crc32(t))\" && rm m", ck);
    EXPECT(rc == 0, "manifest rewritten");
    rc = run(out, sizeof out, NULL, "%s inspect %s", g_bin, ck);
    EXPECT(rc == 1 && strstr(out, "rank_00000.safetensors: BAD: header unreadable") && strstr(out, "result: BAD"),
           "inspect fails on the unreadable file: rc %d, %s", rc, out);
}

// init_from a Hugging Face directory with a NaN in one tensor: the message says the weights are
// damaged (not "lower the learning rate").
static void test_init_from_nan(void) {
    char out[65536], ck[400], hf[400];
    snprintf(ck, sizeof ck, "%s/nan_ck", g_dir);
    snprintf(hf, sizeof hf, "%s/nan_hf", g_dir);
    int rc = run(out, sizeof out, NULL, "%s " TINY " train.steps=1 checkpoint.dir=%s && %s export --ckpt %s --out %s --dtype fp32",
                 g_bin, ck, g_bin, ck, hf);
    EXPECT(rc == 0, "train + export (rc %d): %s", rc, out);
    int hit = 0;
    DIR* d = opendir(hf);
    for (struct dirent* de; d && (de = readdir(d));) {
        if (!strstr(de->d_name, ".safetensors") || strstr(de->d_name, ".json")) continue;
        char p[700];
        snprintf(p, sizeof p, "%s/%s", hf, de->d_name);
        StFile* f;
        Err e;
        if (st_open(&f, p, &e)) continue;
        const StTensor* t = st_find(f, "model.norm.weight");
        if (t) {
            float nan = NAN;
            int fd = open(p, O_WRONLY);
            hit = fd >= 0 && pwrite(fd, &nan, 4, (off_t)(f->data_start + t->begin + 4)) == 4;
            close(fd);
        }
        st_close(f);
    }
    if (d) closedir(d);
    EXPECT(hit, "a NaN written into model.norm.weight");
    rc = run(out, sizeof out, NULL, "%s " TINY " train.steps=2 checkpoint.init_from=%s", g_bin, hf);
    EXPECT(rc == 2 && strstr(out, "model.norm.weight holds 1 non-finite value") && strstr(out, "damaged") &&
               !strstr(out, "lower optim.lr"),
           "the message says what is true: rc %d, %s", rc, out);
}

// resume=auto with another data.path: a warning names both; another precision.fp8: a note.
static void test_resume_other_data(void) {
    char out[65536], ck[400], a[400], b[400];
    snprintf(ck, sizeof ck, "%s/data_ck", g_dir);
    snprintf(a, sizeof a, "%s/a.txt", g_dir);
    snprintf(b, sizeof b, "%s/b.txt", g_dir);
    for (int k = 0; k < 2; k++) {
        FILE* f = fopen(k ? b : a, "w");
        for (int i = 0; i < 400; i++) fprintf(f, "line %d of file %c: some text to train on\n", i, 'a' + k);
        fclose(f);
    }
    const char* cfg = "--config L0_sanity parallel.ep=1 train.device=cpu model.hidden=32 model.ffn=48 train.seq_len=16 "
                      "train.micro_batch=2 train.global_batch=2 optim.warmup=1 train.eval_batches=1 data.format=text log.dir=";
    int rc = run(out, sizeof out, NULL, "%s %s train.steps=2 checkpoint.dir=%s data.path=%s", g_bin, cfg, ck, a);
    EXPECT(rc == 0, "train on a (rc %d): %s", rc, out);
    rc = run(out, sizeof out, NULL, "%s %s train.steps=3 checkpoint.dir=%s data.path=%s checkpoint.resume=auto", g_bin, cfg,
             ck, b);
    EXPECT(rc == 0 && strstr(out, "warning: saved with data.path=") && strstr(out, "a.txt") && strstr(out, "b.txt"),
           "the warning: rc %d, %s", rc, out);
    rc = run(out, sizeof out, NULL, "%s %s train.steps=4 checkpoint.dir=%s data.path=%s checkpoint.resume=auto", g_bin, cfg,
             ck, b);
    EXPECT(rc == 0 && !strstr(out, "warning: saved with data.path="), "no warning on the same data: rc %d, %s", rc, out);
    rc = run(out, sizeof out, NULL, "%s %s train.steps=5 checkpoint.dir=%s data.path=%s checkpoint.resume=auto "
             "precision.fp8=experts", g_bin, cfg, ck, b);
    EXPECT(rc == 0 && strstr(out, "note: saved with precision.fp8=none; this run uses experts"),
           "a note on another precision.fp8: rc %d, %s", rc, out);
    rc = run(out, sizeof out, NULL, "%s %s train.steps=6 checkpoint.dir=%s data.path=%s checkpoint.resume=auto "
             "precision.fp8=experts", g_bin, cfg, ck, b);
    EXPECT(rc == 0 && !strstr(out, "saved with precision.fp8"), "none on the same: rc %d, %s", rc, out);
}


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

// ---- 4. signals -------------------------------------------------------------------------------

// Starts `cmd` through sh in its own process group (stdin /dev/null, output to log), with the
// signals a test may send at their default disposition. Returns the pid (= the group).
static pid_t spawn(const char* log, const char* fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        int in = open("/dev/null", O_RDONLY), out = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (in < 0 || out < 0 || dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0) _exit(126);
        execl("/bin/sh", "sh", "-c", cmd, (char*)NULL);
        _exit(127);
    }
    setpgid(pid, pid);
    return pid;
}

// Waits for pid at most `limit` seconds; past that, kills its whole process group. Returns the
// exit code (128 + signal when killed; -1 on timeout); *secs the time waited.
static int reap(pid_t pid, double limit, double* secs) {
    double t0 = now_sec();
    int st = 0;
    pid_t r;
    while ((r = waitpid(pid, &st, WNOHANG)) == 0 && now_sec() - t0 < limit) usleep(20000);
    if (secs) *secs = now_sec() - t0;
    if (r == 0) {
        kill(-pid, SIGKILL);
        waitpid(pid, &st, 0);
        usleep(200000);
        kill(-pid, SIGKILL);  // anything of the group still there
        return -1;
    }
    kill(-pid, SIGKILL);  // nothing of the job may outlive the test
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// Waits until `path` holds `needle` (at most limit seconds).
static int wait_for(const char* path, const char* needle, double limit) {
    double t0 = now_sec();
    char buf[65536];
    while (now_sec() - t0 < limit) {
        FILE* f = fopen(path, "r");
        size_t k = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        buf[k] = 0;
        if (strstr(buf, needle)) return 1;
        usleep(20000);
    }
    return 0;
}

#define TINY2                                                                                                  \
    "--config L0_sanity train.device=cpu data.format=random model.hidden=32 model.ffn=48 model.vocab_size=64 " \
    "train.seq_len=16 train.micro_batch=2 train.global_batch=4 optim.warmup=1 train.eval_batches=1 log.every=1"

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

// ---- 5. a stopped rank ------------------------------------------------------------------------

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

// `test_robust [WORD ...]`: only the tests whose names hold one of the words.
static int g_argc;
static char** g_argv;
static int wanted(const char* name) {
    for (int i = 1; i < g_argc; i++)
        if (strstr(name, g_argv[i])) return 1;
    return g_argc < 2;
}
#define RUN_IF(fn)                  \
    do {                            \
        if (wanted(#fn)) RUN(fn);   \
    } while (0)

int main(int argc, char** argv) {
    g_argc = argc;
    g_argv = argv;
    if (find_moetrain(argv[0], g_bin, sizeof g_bin)) return 1;
    snprintf(g_dir, sizeof g_dir, "/tmp/moetrain_robust_XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    RUN_IF(test_metrics_disk_full);
    RUN_IF(test_metrics_injected_failure);
    RUN_IF(test_config_messages);
    RUN_IF(test_inspect_unreadable_header);
    RUN_IF(test_init_from_nan);
    RUN_IF(test_resume_other_data);
    RUN_IF(test_preflight_checkpoint_dir);
    RUN_IF(test_preflight_free_space);
    RUN_IF(test_preflight_grace);
    RUN_IF(test_used_checkpoint_dir);
    RUN_IF(test_lock);
    RUN_IF(test_lock_other_host);
    RUN_IF(test_resume_own_only);
    RUN_IF(test_sigterm_to_mpirun);
    RUN_IF(test_sigint_to_mpirun);
    RUN_IF(test_signal_during_startup);
    RUN_IF(test_lock_refresh);
    RUN_IF(test_watchdog_stopped_rank);
    RUN_IF(test_watchdog_startup);
    if (!t_failed) sh("rm -rf %s", g_dir);
    TEST_END();
}
