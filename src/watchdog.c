// watchdog.c — see watchdog.h.
#define _GNU_SOURCE
#include "watchdog.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

enum { REC = 160 };  // bytes of one heartbeat record (text, NUL-padded)

static struct {
    pthread_t th;
    pthread_mutex_t mu;
    int running, quit;
    int rank, world;
    char root[4096];   // <dir>/.heartbeat
    char dir[4200];    // root/<token>: this job's files
    char token[40];
    double timeout;    // of the current stage
    double next_timeout;
    int step;
    long seq;          // stages entered so far (every rank enters the same ones in the same order)
    const char* stage;
    double entered;    // wall clock (seconds since the epoch): comparable across nodes
    double interval;   // between heartbeat writes
    int moved;         // the token changed (watchdog_token): prev is the directory left
    char prev[4200];
} W = {.mu = PTHREAD_MUTEX_INITIALIZER};

static double wall(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void rank_path(char* out, size_t n, const char* dir, int r) { snprintf(out, n, "%.4200s/rank_%05d", dir, r); }

static long g_ncoll;  // collective calls entered (atomic: the training thread adds, the watchdog reads)

void watchdog_collective(void) { __atomic_fetch_add(&g_ncoll, 1, __ATOMIC_RELAXED); }

static void publish(const char* dir, const char* token, int step, long seq, long ncoll, const char* stage,
                    double entered) {
    char p[4300], rec[REC];
    rank_path(p, sizeof p, dir, W.rank);
    memset(rec, 0, sizeof rec);
    snprintf(rec, sizeof rec, "%s %d %ld %ld %.3f %.3f %.60s\n", token, step, seq, ncoll, entered, wall(), stage);
    int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    ssize_t k = pwrite(fd, rec, sizeof rec, 0);
    (void)k;
    close(fd);
}

typedef struct Beat {
    int ok, step;
    long seq, ncoll;
    double entered, seen;
    char stage[64];
} Beat;

static Beat read_beat(const char* dir, const char* token, int r) {
    Beat b = {0};
    char p[4300], rec[REC + 1], tok[40];
    rank_path(p, sizeof p, dir, r);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return b;
    ssize_t k = pread(fd, rec, REC, 0);
    close(fd);
    if (k <= 0) return b;
    rec[k] = 0;
    char* nl = strchr(rec, '\n');
    if (nl) *nl = 0;
    int used = 0;
    if (sscanf(rec, "%39s %d %ld %ld %lf %lf %n", tok, &b.step, &b.seq, &b.ncoll, &b.entered, &b.seen, &used) >= 6 &&
        !strcmp(tok, token)) {
        snprintf(b.stage, sizeof b.stage, "%s", rec + used);
        b.ok = 1;
    }
    return b;
}

// " of step N", or " during start-up" for step 0.
static const char* of_step(char* buf, size_t n, int step) {
    if (step > 0) snprintf(buf, n, " of step %d", step);
    else snprintf(buf, n, " during start-up");
    return buf;
}

// This rank waited too long: name the ranks that did not arrive, and end the process.
static void fire(const char* dir, const char* token, int step, long seq, long ncoll, const char* stage, double waited,
                 double timeout) {
    char list[2048] = "", os[32], ob[32], past[512] = "";
    size_t o = 0, po = 0;
    int n = 0, np = 0;
    const double now = wall(), stale = 2 * W.interval + 1;
    for (int r = 0; r < W.world && o + 200 < sizeof list; r++) {
        if (r == W.rank) continue;
        Beat b = read_beat(dir, token, r);
        const char* sep = n ? "; " : "";
        if (!b.ok) {
            o += (size_t)snprintf(list + o, sizeof list - o, "%srank %d (no heartbeat file: never started watching, or "
                                  "another directory)", sep, r);
            n++;
        } else if (now - b.seen > stale) {
            o += (size_t)snprintf(list + o, sizeof list - o, "%srank %d (no heartbeat for %.0f s: stopped or gone; last "
                                  "in '%s'%s)", sep, r, now - b.seen, b.stage, of_step(ob, sizeof ob, b.step));
            n++;
        } else if (b.seq < seq) {  // every rank goes through the same stages: an earlier one
            o += (size_t)snprintf(list + o, sizeof list - o, "%srank %d (in '%s'%s for %.0f s)", sep, r, b.stage,
                                  of_step(ob, sizeof ob, b.step), now - b.entered);
            n++;
        } else if (b.seq == seq && b.ncoll < ncoll) {  // the same stage, and the same collectives in it
            o += (size_t)snprintf(list + o, sizeof list - o, "%srank %d (in '%s' too, %ld collective call%s behind: "
                                  "still in its own work before the one this rank waits in)", sep, r, b.stage,
                                  ncoll - b.ncoll, ncoll - b.ncoll > 1 ? "s" : "");
            n++;
        } else if ((b.seq > seq || b.ncoll > ncoll) && po + 100 < sizeof past) {
            po += (size_t)snprintf(past + po, sizeof past - po, "%s%d", np ? ", " : "", r);
            if (!np++) po += (size_t)snprintf(past + po, sizeof past - po, " (in '%.60s'%s)", b.stage, of_step(ob, sizeof ob, b.step));
        }
    }
    char none[700];
    snprintf(none, sizeof none, np ? "none: rank%s %s got further, so this rank is the one that did not arrive (stuck in its "
                                     "own work: a device, a file system, a hang)"
                                   : "none to tell (every heartbeat is current: a deadlock, a network or device failure)",
             np > 1 ? "s" : "", past);
    fprintf(stderr,
            "moetrain: rank %d: watchdog: waited %.0f s in '%s'%s (the timeout of this stage: %.0f s, from "
            "%s); ranks that did not arrive: %s; ending the job (exit 1)\n",
            W.rank, waited, stage, of_step(os, sizeof os, step), timeout,
            step > 0 ? "train.timeout_s and the slowest step" : "train.timeout_s; for a restore, the checkpoint's size",
            n ? list : none);
    fflush(stderr);
    fflush(stdout);
    _exit(1);
}

static void* loop(void* arg) {
    (void)arg;
    double last_pub = 0, last_tick = wall();
    for (;;) {
        const double tick = wall();
        pthread_mutex_lock(&W.mu);
        // A gap between ticks means this process was stopped (SIGSTOP, a frozen node): that time
        // did not pass for this rank's stage, so it does not count against it.
        if (tick - last_tick > 3) W.entered += tick - last_tick;
        last_tick = tick;
        const int quit = W.quit, step = W.step;
        const long seq = W.seq, ncoll = __atomic_load_n(&g_ncoll, __ATOMIC_RELAXED);
        const char* stage = W.stage;
        const double entered = W.entered, timeout = W.timeout;
        char dir[sizeof W.dir], token[sizeof W.token];
        memcpy(dir, W.dir, sizeof dir);
        memcpy(token, W.token, sizeof token);
        char prev[sizeof W.prev] = "";
        if (W.moved) {  // a new token: publish at once; a write in flight may have recreated the old file
            last_pub = 0;
            W.moved = 0;
            memcpy(prev, W.prev, sizeof prev);
        }
        pthread_mutex_unlock(&W.mu);
        if (prev[0]) {
            char p[4300];
            rank_path(p, sizeof p, prev, W.rank);
            unlink(p);
            rmdir(prev);
        }
        if (quit) break;
        const double now = wall();
        if (stage && now - last_pub >= W.interval) {
            publish(dir, token, step, seq, ncoll, stage, entered);
            last_pub = now;
        }
        if (stage && timeout > 0 && now - entered > timeout) fire(dir, token, step, seq, ncoll, stage, now - entered, timeout);
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void mkdirs(const char* path) {
    char buf[4400];
    snprintf(buf, sizeof buf, "%s", path);
    for (char* p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(buf, 0755);
            *p = '/';
        }
    mkdir(buf, 0755);
}

// Rank 0: removes what other jobs left under root (killed jobs leave their files): job
// directories, and files of the flat layout, untouched for a day.
static void sweep(const char* root, const char* mine) {
    DIR* d = opendir(root);
    if (!d) return;
    const time_t old = time(NULL) - 86400;
    char p[4400], q[4700];
    for (struct dirent* de; (de = readdir(d));) {
        if (de->d_name[0] == '.' || !strcmp(de->d_name, mine)) continue;
        snprintf(p, sizeof p, "%.4000s/%.255s", root, de->d_name);
        struct stat st;
        if (lstat(p, &st)) continue;
        if (S_ISREG(st.st_mode)) {
            if (st.st_mtime < old) unlink(p);
            continue;
        }
        if (!S_ISDIR(st.st_mode)) continue;
        DIR* j = opendir(p);
        int fresh = st.st_mtime >= old;
        for (struct dirent* fe; j && !fresh && (fe = readdir(j));)
            if (fe->d_name[0] != '.') {
                snprintf(q, sizeof q, "%s/%.255s", p, fe->d_name);
                fresh = lstat(q, &st) || st.st_mtime >= old;
            }
        if (j) rewinddir(j);
        for (struct dirent* fe; j && !fresh && (fe = readdir(j));)
            if (fe->d_name[0] != '.') {
                snprintf(q, sizeof q, "%s/%.255s", p, fe->d_name);
                unlink(q);
            }
        if (j) closedir(j);
        if (!fresh) rmdir(p);
    }
    closedir(d);
}

void watchdog_start(int rank, int world, const char* dir, const char* token, double timeout_s) {
    if (W.running || timeout_s <= 0) return;
    W.rank = rank;
    W.world = world;
    snprintf(W.token, sizeof W.token, "%s", token);
    if (dir && dir[0]) snprintf(W.root, sizeof W.root, "%.4000s/.heartbeat", dir);
    else snprintf(W.root, sizeof W.root, "/tmp/moetrain_heartbeat");
    snprintf(W.dir, sizeof W.dir, "%s/%s", W.root, W.token);
    mkdirs(W.dir);
    if (rank == 0) sweep(W.root, W.token);
    W.timeout = W.next_timeout = timeout_s;
    W.interval = timeout_s / 20 < 1 ? 1 : timeout_s / 20 > 10 ? 10 : timeout_s / 20;
    W.stage = NULL;
    W.quit = 0;
    if (pthread_create(&W.th, NULL, loop, NULL) == 0) W.running = 1;
    else fprintf(stderr, "moetrain: warning: could not start the watchdog thread (%s); train.timeout_s is not enforced\n",
                 strerror(errno));
}

// Removes this rank's file from W.dir, and the directories once empty (W.mu held or the thread stopped).
static void leave(void) {
    char p[4300];
    rank_path(p, sizeof p, W.dir, W.rank);
    unlink(p);
    rmdir(W.dir);   // the last rank out removes them (fails harmlessly while others remain)
    rmdir(W.root);
}

void watchdog_token(const char* token) {
    if (!W.running) return;
    pthread_mutex_lock(&W.mu);
    if (strcmp(token, W.token)) {
        leave();
        memcpy(W.prev, W.dir, sizeof W.prev);
        snprintf(W.token, sizeof W.token, "%s", token);
        snprintf(W.dir, sizeof W.dir, "%s/%s", W.root, W.token);
        mkdirs(W.dir);
        W.moved = 1;
    }
    pthread_mutex_unlock(&W.mu);
}

void watchdog_stage(int step, const char* stage) {
    pthread_mutex_lock(&W.mu);
    W.seq++;  // counted while not running too, so that every rank's count agrees
    if (!W.running) {
        pthread_mutex_unlock(&W.mu);
        return;
    }
    W.step = step;
    W.stage = stage;
    W.entered = wall();
    W.timeout = W.next_timeout;
    pthread_mutex_unlock(&W.mu);
}

void watchdog_timeout(double timeout_s) {
    pthread_mutex_lock(&W.mu);
    W.next_timeout = timeout_s;
    pthread_mutex_unlock(&W.mu);
}

void watchdog_stop(void) {
    if (!W.running) return;
    pthread_mutex_lock(&W.mu);
    W.quit = 1;
    pthread_mutex_unlock(&W.mu);
    pthread_join(W.th, NULL);
    W.running = 0;
    leave();
}
