// train_own.c — a run owns its checkpoint directory (see train.h: trainer_own, trainer_own_after,
// trainer_release).
//
//   checkpoint.dir/.lock   "host H / pid P / run_id R / slurm_job J / started T", created with
//                          O_EXCL by rank 0 before anything is read or written there, removed
//                          at the end (and by a start-up signal). While held, a thread touches
//                          it (its modification time) every LOCK_REFRESH_S seconds. A lock whose
//                          pid is gone on this host, that the same Slurm job left (a requeue),
//                          or that comes from another host and was not touched for LOCK_STALE_S
//                          (by the file system's clock) is stale and replaced (logged); any other
//                          lock stops the run with the holder named. Before each save, rank 0
//                          checks that the lock is still this run's (trainer_lock_check).
//   checkpoint.dir/owner   "run_id R": the run whose checkpoints these are; resume=auto and
//                          pruning consider only checkpoints of that run (ckpt_set_run_id).
//
// A fresh run (checkpoint.resume=none) into a directory that holds complete checkpoints is refused
// with the choices (resume=auto, another directory, checkpoint.overwrite=true, which removes
// them first).
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_internal.h"
#include "failpoint.h"
#include "stop.h"
#include "train.h"

static void field(const char* text, const char* key, char* out, size_t n) {
    out[0] = 0;
    size_t k = strlen(key);
    for (const char* l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, key, k) && l[k] == ' ') {
            const char* v = l + k + 1;
            size_t m = strcspn(v, "\n");
            snprintf(out, n, "%.*s", (int)(m < n ? m : n - 1), v);
            return;
        }
}

// The fields of a lock's text ("" where absent, every one with text NULL).
typedef struct LockOwner {
    char host[256], pid[32], run[64], slurm_job[64], started[64];
} LockOwner;
static void owner_parse(const char* text, LockOwner* o) {
    memset(o, 0, sizeof *o);
    if (!text) return;
    field(text, "host", o->host, sizeof o->host);
    field(text, "pid", o->pid, sizeof o->pid);
    field(text, "run_id", o->run, sizeof o->run);
    field(text, "slurm_job", o->slurm_job, sizeof o->slurm_job);
    field(text, "started", o->started, sizeof o->started);
}

enum { LOCK_REFRESH_S = 60, LOCK_STALE_S = 600 };

// ---- the refresher: one thread touches every lock this process holds ----------------------------

enum { MAX_HELD = 8 };
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    int running, n;
    char path[MAX_HELD][4200];
    char text[MAX_HELD][1200];
} R = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

// Touches path (its modification time: now, by the file system's clock) while it still holds text.
static void touch_if_ours(const char* path, const char* text) {
    Err le = {{0}};
    char* now = ckpt_read_text(path, 4096, NULL, &le);
    if (now && !strcmp(now, text)) utimensat(AT_FDCWD, path, NULL, 0);
    free(now);
}

static void* refresher(void* arg) {
    (void)arg;
    const long every = failpoint_int("ckpt.lock_refresh_s", LOCK_REFRESH_S);  // tests: faster
    pthread_mutex_lock(&R.mu);
    while (R.n > 0) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += every > 0 ? every : LOCK_REFRESH_S;
        while (R.n > 0 && pthread_cond_timedwait(&R.cv, &R.mu, &until) == 0) {}
        for (int i = 0; i < R.n; i++) touch_if_ours(R.path[i], R.text[i]);
    }
    pthread_mutex_unlock(&R.mu);
    return NULL;
}

static void refresh_add(const char* path, const char* text) {
    pthread_mutex_lock(&R.mu);
    if (R.n < MAX_HELD) {
        snprintf(R.path[R.n], sizeof R.path[0], "%s", path);
        snprintf(R.text[R.n], sizeof R.text[0], "%s", text);
        R.n++;
    }
    int start = !R.running && R.n > 0;
    if (start) R.running = pthread_create(&R.th, NULL, refresher, NULL) == 0;
    pthread_mutex_unlock(&R.mu);
    if (start && !R.running)
        log_info("checkpoint: warning: could not start the thread that refreshes %s; another host may take it over "
                 "after %d min\n", path, LOCK_STALE_S / 60);
}

static void refresh_remove(const char* path) {
    pthread_mutex_lock(&R.mu);
    for (int i = 0; i < R.n; i++)
        if (!strcmp(R.path[i], path)) {
            R.n--;
            memmove(R.path[i], R.path[R.n], sizeof R.path[0]);
            memmove(R.text[i], R.text[R.n], sizeof R.text[0]);
            break;
        }
    const int join = R.running && R.n == 0;
    pthread_cond_broadcast(&R.cv);
    pthread_mutex_unlock(&R.mu);
    if (join) {
        pthread_join(R.th, NULL);
        R.running = 0;
    }
}

// Seconds since `ls` (a lock's stat) was last touched, by the clock of the file system that
// holds it (a file created beside it gives "now"; hosts' clocks may differ), else this host's.
static double lock_age(const char* path, const struct stat* ls) {
    char probe[4300];
    snprintf(probe, sizeof probe, "%s.clock.%d", path, (int)getpid());
    double now = (double)time(NULL);
    int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    struct stat ps;
    if (fd >= 0) {
        if (write(fd, "t", 1) == 1 && fstat(fd, &ps) == 0) now = (double)ps.st_mtim.tv_sec + 1e-9 * ps.st_mtim.tv_nsec;
        close(fd);
        unlink(probe);
    }
    return now - ((double)ls->st_mtim.tv_sec + 1e-9 * ls->st_mtim.tv_nsec);
}

// The lock at path exists: 0 when its holder is gone (the reason logged; the caller replaces it),
// else -1 with the holder named in e. host: this host's name; job: $SLURM_JOB_ID (or NULL).
static int check_holder(const Trainer* t, const char* path, const char* host, const char* job, Err* e) {
    Err le = {{0}};
    struct stat ls;
    const int have_stat = stat(path, &ls) == 0;
    const double age = have_stat ? lock_age(path, &ls) : 0;
    char* text = ckpt_read_text(path, 4096, NULL, &le);
    const int readable = text != NULL;
    LockOwner o;
    owner_parse(text, &o);
    free(text);
    const char *h = o.host, *p = o.pid, *run = o.run, *sj = o.slurm_job, *st = o.started;
    const int pid = atoi(p);
    const char* why = NULL;
    if (!readable) why = "unreadable";
    else if (!strcmp(h, host) && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) why = "its process is gone";
    else if (!strcmp(h, host) && pid == (int)getpid()) why = "this process's own";
    else if (job && *job && !strcmp(sj, job)) why = "left by this Slurm job before a requeue";
    char aged[96] = "";
    if (!why && readable && strcmp(h, host) && have_stat && age > LOCK_STALE_S) {  // another host: its pid cannot be checked
        snprintf(aged, sizeof aged, "not refreshed for %.0f min: its run is gone", age / 60);
        why = aged;
    }
    char job_s[96] = "";  // ", Slurm job N" when the holder ran under Slurm
    if (sj[0] && strcmp(sj, "-")) snprintf(job_s, sizeof job_s, ", Slurm job %.64s", sj);
    if (!why && !strcmp(h, host))  // this host, its process alive
        return err_set(e, "checkpoint.dir %s is in use by another run (run %s, pid %s on host %s%s, since %s, lock "
                       "refreshed %.0f s ago; lock %s): two runs must not share a checkpoint directory. Wait for "
                       "process %s on this host to end (or stop it), or give another checkpoint.dir",
                       t->cfg.checkpoint.dir, run[0] ? run : "?", p[0] ? p : "?", h, job_s, st[0] ? st : "?",
                       age > 0 ? age : 0, path, p[0] ? p : "?");
    if (!why)
        return err_set(e, "checkpoint.dir %s is in use by another run (run %s, pid %s on host %s%s, since %s, lock "
                       "refreshed %.0f s ago; lock %s): two runs must not share a checkpoint directory. Wait for it "
                       "to end, or give another checkpoint.dir. A live run refreshes its lock every %d s; a lock "
                       "%s not refreshed for %d min is taken over automatically; if you know that run is gone, "
                       "remove %s",
                       t->cfg.checkpoint.dir, run[0] ? run : "?", p[0] ? p : "?", h[0] ? h : "?", job_s,
                       st[0] ? st : "?", age > 0 ? age : 0, path, LOCK_REFRESH_S,
                       readable && h[0] ? "from another host" : "that names no holder", LOCK_STALE_S / 60, path);
    log_info("checkpoint: %sa stale lock %s (run %s, pid %s on %s%s, %s) replaced\n", aged[0] ? "warning: " : "",
             path, run[0] ? run : "?", p[0] ? p : "?", h[0] ? h : "?", job_s, why);
    return 0;
}

// Rank 0: takes checkpoint.dir/.lock. 0, or -1 with the holder named.
static int take_lock(Trainer* t, const char* path, Err* e) {
    char host[256] = "?", me[1024];
    gethostname(host, sizeof host - 1);
    const char* job = getenv("SLURM_JOB_ID");
    time_t now = time(NULL);
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&now));
    int n = snprintf(me, sizeof me, "host %s\npid %d\nrun_id %s\nslurm_job %s\nstarted %s\n", host, (int)getpid(),
                     t->run_id, job && *job ? job : "-", when);
    for (int attempt = 0; attempt < 2; attempt++) {
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) {
            int ok = write(fd, me, (size_t)n) == n && fsync(fd) == 0;
            close(fd);
            if (!ok) {
                unlink(path);
                return err_set(e, "checkpoint.dir: cannot write the lock %s (%s)", path, strerror(errno));
            }
            snprintf(t->lock_text, sizeof t->lock_text, "%s", me);
            stop_cleanup_path(path);
            refresh_add(path, me);
            return 0;
        }
        if (errno != EEXIST) return err_set(e, "checkpoint.dir: cannot create the lock %s (%s)", path, strerror(errno));
        if (check_holder(t, path, host, job, e)) return -1;
        unlink(path);
    }
    return err_set(e, "checkpoint.dir: the lock %s keeps coming back (another run starting at the same time?)", path);
}

static int read_owner(const char* dir, char* out, size_t n) {
    char p[CKPT_PATH];
    ckpt_join(p, dir, "owner");
    Err le = {{0}};
    char* text = ckpt_read_text(p, 4096, NULL, &le);
    out[0] = 0;
    if (!text) return 0;
    field(text, "run_id", out, n);
    free(text);
    return out[0] != 0;
}

static int write_owner(const char* dir, const char* run, Err* e) {
    char p[CKPT_PATH], q[CKPT_PATH], line[128];
    ckpt_join(p, dir, "owner.tmp");
    ckpt_join(q, dir, "owner");
    int n = snprintf(line, sizeof line, "run_id %s\n", run);
    if (ckpt_write_file(p, line, (size_t)n, NULL, e)) return -1;
    if (rename(p, q)) return err_set(e, "rename %s -> %s: %s", p, q, strerror(errno));
    return ckpt_fsync_dir(dir, e);
}

// Rank 0: complete checkpoints under dir and under dir/best (checkpoint.keep_best): their count;
// the newest name (dir's first) and its run.
static int complete_steps(const char* dir, char* newest, size_t n, char* run, size_t rn) {
    int c = 0;
    newest[0] = run[0] = 0;
    for (int b = 0; b < 2; b++) {
        char root[CKPT_PATH];
        if (b) ckpt_join(root, dir, "best");
        else ckpt_copy(root, sizeof root, dir);
        StepDir* sd = NULL;
        int ns = 0;
        Err le = {{0}};
        if (ckpt_list_steps(root, &sd, &ns, &le)) continue;
        for (int i = 0; i < ns; i++)
            if (sd[i].complete) {
                if (!c++) {
                    snprintf(newest, n, "%s%s", b ? "best/" : "", sd[i].name);
                    ckpt_step_run_id(root, sd[i].name, run, rn);
                }
            }
        free(sd);
    }
    return c;
}

// Rank 0, checkpoint.overwrite=true: moves every step_*, best/ and latest aside and removes them.
static int remove_all(const char* dir, Err* e) {
    StepDir* sd = NULL;
    int ns = 0;
    if (ckpt_list_steps(dir, &sd, &ns, e)) return -1;
    char p[CKPT_PATH], q[CKPT_PATH], tn[96];
    for (int i = 0; i < ns; i++) {
        ckpt_join(p, dir, sd[i].name);
        snprintf(tn, sizeof tn, ".trash_%s", sd[i].name);
        ckpt_join(q, dir, tn);
        if (rename(p, q) || ckpt_rm_rf(q)) {
            free(sd);
            return err_set(e, "checkpoint.overwrite: cannot remove %s: %s", p, strerror(errno));
        }
    }
    free(sd);
    ckpt_join(p, dir, "best");  // checkpoint.keep_best's root, whole
    struct stat bs;
    const int best = stat(p, &bs) == 0;
    ckpt_join(q, dir, ".trash_best");
    if (best && (rename(p, q) || ckpt_rm_rf(q)))
        return err_set(e, "checkpoint.overwrite: cannot remove %s: %s", p, strerror(errno));
    ckpt_join(p, dir, CKPT_LATEST);
    unlink(p);
    ckpt_join(p, dir, "owner");
    unlink(p);
    log_info("checkpoint: checkpoint.overwrite=true: removed %d earlier checkpoint(s)%s under %s\n", ns,
             best ? " and best/" : "", dir);
    return ckpt_fsync_dir(dir, e);
}

static int agree(Trainer* t, int st, Err* le, Err* e) {
    if (dist_agree_error(st, le)) {
        *e = *le;
        return -1;
    }
    return 0;
}

int trainer_own(Trainer* t, Err* e) {
    const CheckpointConfig* cc = &t->cfg.checkpoint;
    char owner[64] = "";
    if (t->rank == 0) random_id(t->run_id, sizeof t->run_id);
    t->comm->host_broadcast(t->comm, GROUP_WORLD, t->run_id, sizeof t->run_id, 0);
    if (!cc->dir[0]) return 0;
    Err le = {{0}};
    int st = 0;
    if (t->rank == 0) {
        ckpt_join(t->lock_path, cc->dir, ".lock");
        st = take_lock(t, t->lock_path, &le) ? 2 : 0;
        if (st) t->lock_path[0] = 0;
        char newest[96], run[64];
        int have = st ? 0 : complete_steps(cc->dir, newest, sizeof newest, run, sizeof run);
        if (!st && have && !strcmp(cc->resume, "none")) {
            if (!cc->overwrite)
                st = err_set(&le, "checkpoint.dir %s already holds %d checkpoint(s)%s%s%s (the newest %s): a fresh run "
                             "(checkpoint.resume=none) there would mix its checkpoints with them. Continue that run with "
                             "checkpoint.resume=auto, give another checkpoint.dir, or set checkpoint.overwrite=true to "
                             "remove them and start over", cc->dir, have, run[0] ? " of run " : "", run[0] ? run : "",
                             run[0] ? "" : "", newest) ? 2 : 0;
            else
                st = remove_all(cc->dir, &le) ? 2 : 0;
        }
        if (!st) read_owner(cc->dir, owner, sizeof owner);
    }
    if (agree(t, st, &le, e)) return -1;
    t->comm->host_broadcast(t->comm, GROUP_WORLD, owner, sizeof owner, 0);
    ckpt_set_run_id(owner);  // resume=auto falls back only to the owner's checkpoints
    return 0;
}

int trainer_own_after(Trainer* t, Err* e) {
    const CheckpointConfig* cc = &t->cfg.checkpoint;
    // t->run_id: the resumed checkpoint's (load_ckpt), else the new one from trainer_own
    Err le = {{0}};
    int st = 0;
    if (cc->dir[0] && t->rank == 0) {
        char owner[64] = "";
        read_owner(cc->dir, owner, sizeof owner);
        if (owner[0] && strcmp(owner, t->run_id) && strcmp(cc->resume, "none")) {
            char newest[96], run[64];
            int have = complete_steps(cc->dir, newest, sizeof newest, run, sizeof run);
            if (have && !cc->overwrite)
                st = err_set(&le, "checkpoint.dir %s holds checkpoints of run %s, but this run (%s, resumed from %s) is "
                             "another: its saves would mix with them. Give another checkpoint.dir, or set "
                             "checkpoint.overwrite=true to remove them", cc->dir, owner, t->run_id,
                             t->resumed_from[0] ? t->resumed_from : "nothing") ? 2 : 0;
            else if (have)
                st = remove_all(cc->dir, &le) ? 2 : 0;
        }
        if (!st && strcmp(owner, t->run_id)) st = write_owner(cc->dir, t->run_id, &le) ? 2 : 0;
    }
    if (agree(t, st, &le, e)) return -1;
    ckpt_set_run_id(t->run_id);
    log_info("run: id %s%s%s\n", t->run_id, cc->dir[0] ? ", checkpoint.dir " : "", cc->dir);
    return 0;
}

int trainer_lock_check(Trainer* t, Err* e) {
    Err le = {{0}};
    int st = 0;
    if (t->rank == 0 && t->lock_path[0]) {
        char* text = ckpt_read_text(t->lock_path, 4096, NULL, &le);
        if (!text) {  // removed by hand while this run held it: taken again unless another run was faster
            const int fd = open(t->lock_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
            const size_t n = strlen(t->lock_text);
            const int ok = fd >= 0 && write(fd, t->lock_text, n) == (ssize_t)n && fsync(fd) == 0;
            if (fd >= 0) close(fd);
            if (ok) log_info("checkpoint: warning: the lock %s was removed while this run held it; taken again\n",
                             t->lock_path);
            else if (fd >= 0) unlink(t->lock_path);
            text = ckpt_read_text(t->lock_path, 4096, NULL, &le);
        }
        if (!text || strcmp(text, t->lock_text)) {
            LockOwner o;
            owner_parse(text, &o);
            st = err_set(&le, "checkpoint.dir %s: this run's lock %s %s%s%s%s%s%s%s (was this run stopped for more than %d "
                         "min?): not saving, so as not to mix with that run. Resume with checkpoint.resume=auto once "
                         "the other run ends, or give another checkpoint.dir", t->cfg.checkpoint.dir, t->lock_path,
                         text ? "was taken over by another run (run " : "is gone", o.run, text ? ", pid " : "",
                         o.pid, text ? " on host " : "", o.host, text ? ")" : "", LOCK_STALE_S / 60) ? 2 : 0;
        }
        free(text);
    }
    return agree(t, st, &le, e);
}

void trainer_release(Trainer* t) {
    if (!t->lock_path[0]) return;
    refresh_remove(t->lock_path);
    Err le = {{0}};
    char* text = ckpt_read_text(t->lock_path, 4096, NULL, &le);
    if (text && !strcmp(text, t->lock_text)) unlink(t->lock_path);  // still ours
    free(text);
    stop_cleanup_path(NULL);
    t->lock_path[0] = 0;
}
