// train_preflight.c — trainer_preflight (see train.h): before the first step, every rank writes
// in checkpoint.dir; rank 0 checks the free space against the checkpoint size × (keep + 1), times a
// test write against checkpoint.grace_s, and says what to change when either falls short.
#define _DEFAULT_SOURCE
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "ckpt_internal.h"
#include "failpoint.h"
#include "train.h"
#include "util.h"

// ---- preflight --------------------------------------------------------------------------------

static void human_bytes(char* out, size_t n, double b) {
    if (b >= 1e9) snprintf(out, n, "%.1f GB", b / 1e9);
    else if (b >= 1e6) snprintf(out, n, "%.1f MB", b / 1e6);
    else snprintf(out, n, "%.1f kB", b / 1e3);
}

// This rank creates, writes and removes a file in dir; rank 0 writes `probe` bytes with fsync and
// times it (*rate, bytes/s).
static int probe_dir(const char* dir, int rank, size_t probe, double* rate, Err* e) {
    char p[CFG_STR + 64];
    snprintf(p, sizeof p, "%s/.probe_rank_%05d", dir, rank);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return err_set(e, "checkpoint.dir %s: cannot create a file there (%s)", dir, strerror(errno));
    char* buf = xcalloc(1, probe ? probe : 1);
    double t0 = now_sec();
    size_t done = 0;
    int rc = 0;
    while (done < probe && !rc) {
        ssize_t k = write(fd, buf + done, probe - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) rc = err_set(e, "checkpoint.dir %s: writing a test file failed (%s)", dir, k < 0 ? strerror(errno) : "no progress");
        else done += (size_t)k;
    }
    if (!rc && fsync(fd) && errno != EINVAL)
        rc = err_set(e, "checkpoint.dir %s: fsync of a test file failed (%s)", dir, strerror(errno));
    double dt = now_sec() - t0;
    close(fd);
    unlink(p);
    free(buf);
    if (rate) *rate = probe && dt > 0 ? (double)probe / dt : 0;
    return rc;
}

// The checkpoint's size: t->ckpt_bytes (all ranks) and t->ckpt_rank_bytes (the largest rank's).
static void ckpt_sizes(Trainer* t) {
    const Model* m = &t->model;
    const int nwhich = t->cfg.checkpoint.save_optimizer ? 3 : 1;
    double mine = 4096;  // header
    for (int i = 0; i < m->pl.n; i++)
        if (trainer_owns(t, &m->pl.p[i])) mine += (double)m->pl.p[i].numel * 4 * nwhich + 3 * 160;
    double sums[1] = {mine};
    t->comm->host_all_reduce_f64(t->comm, GROUP_WORLD, sums, 1);
    int32_t mb = (int32_t)(mine / 1e6) + 1;
    t->comm->host_all_reduce_max_i32(t->comm, GROUP_WORLD, &mb, 1);
    t->ckpt_bytes = sums[0];
    t->ckpt_rank_bytes = mine > mb * 1e6 ? mine : mb * 1e6;
}

// mkdir -p dir: 0, or -1 with the reason in e.
static int make_root(const char* dir, Err* e) {
    char cmd_dir[CFG_STR];
    snprintf(cmd_dir, sizeof cmd_dir, "%s", dir);
    for (char* q = cmd_dir + 1; *q; q++)
        if (*q == '/') {
            *q = 0;
            mkdir(cmd_dir, 0755);
            *q = '/';
        }
    if (mkdir(cmd_dir, 0755) && errno != EEXIST)
        return err_set(e, "checkpoint.dir %s: cannot create it (%s)", dir, strerror(errno));
    return 0;
}

// Rank 0: room in checkpoint.dir for the saves still to come (keep + 1 less the complete ones
// there, at least 1; the best one too). 0, or -1 with what to change in e.
static int check_space(const Trainer* t, Err* e) {
    const CheckpointConfig* cc = &t->cfg.checkpoint;
    struct statvfs vf;
    StepDir* sd = NULL;
    int n = 0, have = 0;
    Err se = {{0}};
    if (ckpt_list_steps(cc->dir, &sd, &n, &se) == 0)
        for (int i = 0; i < n; i++) have += sd[i].complete;
    free(sd);
    const int copies = (cc->keep > 0 ? (cc->keep + 1 - have > 1 ? cc->keep + 1 - have : 1) : 1) + (cc->keep_best ? 1 : 0);
    const double need = t->ckpt_bytes * copies;
    const long fake_free = failpoint_int("preflight.free_bytes", -1);  // tests: a nearly full disk
    if (fake_free < 0 && statvfs(cc->dir, &vf) != 0) return 0;
    const double avail = fake_free >= 0 ? (double)fake_free : (double)vf.f_bavail * (double)vf.f_frsize;
    char a[32], b[32], c1[32];
    human_bytes(a, sizeof a, need);
    human_bytes(b, sizeof b, avail);
    human_bytes(c1, sizeof c1, t->ckpt_bytes);
    if (avail < need)
        return err_set(e, "checkpoint.dir %s: %s free, but a checkpoint is %s and checkpoint.keep=%d needs room "
                       "for %d more (%s; older ones are pruned only after a newer save succeeds): free space there, "
                       "use another checkpoint.dir, lower checkpoint.keep, or checkpoint.save_optimizer=false "
                       "(a third of the size)", cc->dir, b, c1, cc->keep, copies, a);
    return 0;
}

// A warning when one rank's save at the measured rate would outlast checkpoint.grace_s.
static void warn_slow(const Trainer* t, double rate) {
    const CheckpointConfig* cc = &t->cfg.checkpoint;
    if (cc->grace_s <= 0 || rate <= 0) return;
    const double est = t->ckpt_rank_bytes / rate;
    char b[32], r[32];
    human_bytes(b, sizeof b, t->ckpt_rank_bytes);
    human_bytes(r, sizeof r, rate);
    if (est > cc->grace_s)
        log_info("checkpoint: warning: a save of %s per rank would take about %.0f s at the %s/s measured in %s, "
                 "more than checkpoint.grace_s=%d: a preemption signal may not leave time to save (give the job "
                 "a longer signal lead, e.g. --signal=B:USR1@%d, or faster storage)\n",
                 b, est, r, cc->dir, cc->grace_s, (int)(est * 1.5) + 60);
}

int trainer_preflight_dir(Trainer* t, Err* e) {
    const CheckpointConfig* cc = &t->cfg.checkpoint;
    if (!cc->dir[0]) return 0;
    int st = 0;
    Err le = {{0}};
    if (t->rank == 0) st = make_root(cc->dir, &le);  // the root exists (the other ranks probe it next)
    if (dist_agree_error(st, &le)) {
        *e = le;
        return -1;
    }
    double rate = 0;
    st = probe_dir(cc->dir, t->rank, t->rank == 0 ? (size_t)4 << 20 : 0, &rate, &le) ? 2 : 0;
    const long fake_rate = failpoint_int("preflight.write_rate", 0);  // tests: slow storage
    if (fake_rate > 0) rate = (double)fake_rate;
    t->comm->host_broadcast(t->comm, GROUP_WORLD, &rate, sizeof rate, 0);
    if (dist_agree_error(st, &le)) {
        *e = le;
        return -1;
    }
    t->write_rate = rate;
    return 0;
}

int trainer_preflight_space(Trainer* t, Err* e) {
    const CheckpointConfig* cc = &t->cfg.checkpoint;
    ckpt_sizes(t);
    if (!cc->dir[0]) return 0;
    Err le = {{0}};
    const int st = t->rank == 0 ? check_space(t, &le) : 0;
    if (dist_agree_error(st, &le)) {
        *e = le;
        return -1;
    }
    warn_slow(t, t->write_rate);
    return 0;
}
