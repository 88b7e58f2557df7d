// watchdog.c — see watchdog.h.
#define _GNU_SOURCE
#include "watchdog.h"

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
    char dir[4096];    // the .heartbeat directory
    char token[40];
    double timeout;    // of the current stage
    double next_timeout;
    int step;
    const char* stage;
    double entered;    // wall clock (seconds since the epoch): comparable across nodes
    double interval;   // between heartbeat writes
} W = {.mu = PTHREAD_MUTEX_INITIALIZER};

static double wall(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void rank_path(char* out, size_t n, int r) { snprintf(out, n, "%s/rank_%05d", W.dir, r); }

static void publish(int step, const char* stage, double entered) {
    char p[4200], rec[REC];
    rank_path(p, sizeof p, W.rank);
    memset(rec, 0, sizeof rec);
    snprintf(rec, sizeof rec, "%s %d %.3f %.3f %.60s\n", W.token, step, entered, wall(), stage);
    int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    ssize_t k = pwrite(fd, rec, sizeof rec, 0);
    (void)k;
    close(fd);
}

typedef struct Beat {
    int ok, step;
    double entered, seen;
    char stage[64];
} Beat;

static Beat read_beat(int r) {
    Beat b = {0};
    char p[4200], rec[REC + 1], tok[40];
    rank_path(p, sizeof p, r);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return b;
    ssize_t k = pread(fd, rec, REC, 0);
    close(fd);
    if (k <= 0) return b;
    rec[k] = 0;
    char* nl = strchr(rec, '\n');
    if (nl) *nl = 0;
    int used = 0;
    if (sscanf(rec, "%39s %d %lf %lf %n", tok, &b.step, &b.entered, &b.seen, &used) >= 4 && !strcmp(tok, W.token)) {
        snprintf(b.stage, sizeof b.stage, "%s", rec + used);
        b.ok = 1;
    }
    return b;
}

// This rank waited too long: name the ranks that did not arrive, and end the process.
static void fire(int step, const char* stage, double waited, double timeout) {
    char list[2048] = "";
    size_t o = 0;
    int n = 0;
    const double now = wall(), stale = 2 * W.interval + 1;
    for (int r = 0; r < W.world && o + 200 < sizeof list; r++) {
        if (r == W.rank) continue;
        Beat b = read_beat(r);
        const char* sep = n ? "; " : "";
        if (!b.ok) {
            o += (size_t)snprintf(list + o, sizeof list - o, "%srank %d (no heartbeat file: never started watching, or "
                                  "another directory)", sep, r);
            n++;
        } else if (now - b.seen > stale) {
            o += (size_t)snprintf(list + o, sizeof list - o, "%srank %d (no heartbeat for %.0f s: stopped or gone; last "
                                  "in '%s' of step %d)", sep, r, now - b.seen, b.stage, b.step);
            n++;
        } else if (b.step < step || (b.step == step && strcmp(b.stage, stage))) {
            o += (size_t)snprintf(list + o, sizeof list - o, "%srank %d (in '%s' of step %d for %.0f s)", sep, r, b.stage,
                                  b.step, now - b.entered);
            n++;
        }
    }
    fprintf(stderr,
            "moetrain: rank %d: watchdog: waited %.0f s in '%s' of step %d (the timeout of this stage: %.0f s, from "
            "train.timeout_s and the slowest step); ranks that did not arrive: %s; ending the job (exit 1)\n",
            W.rank, waited, stage, step, timeout,
            n ? list : "none to tell (every heartbeat is current: a deadlock, a network or device failure)");
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
        const char* stage = W.stage;
        const double entered = W.entered, timeout = W.timeout;
        pthread_mutex_unlock(&W.mu);
        if (quit) break;
        const double now = wall();
        if (stage && now - last_pub >= W.interval) {
            publish(step, stage, entered);
            last_pub = now;
        }
        if (stage && timeout > 0 && now - entered > timeout) fire(step, stage, now - entered, timeout);
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void mkdirs(const char* path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char* p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(buf, 0755);
            *p = '/';
        }
    mkdir(buf, 0755);
}

void watchdog_start(int rank, int world, const char* dir, const char* token, double timeout_s) {
    if (W.running || timeout_s <= 0) return;
    W.rank = rank;
    W.world = world;
    snprintf(W.token, sizeof W.token, "%s", token);
    if (dir && dir[0]) snprintf(W.dir, sizeof W.dir, "%.4000s/.heartbeat", dir);
    else snprintf(W.dir, sizeof W.dir, "/tmp/moetrain_heartbeat_%.39s", token);
    mkdirs(W.dir);
    W.timeout = W.next_timeout = timeout_s;
    W.interval = timeout_s / 20 < 1 ? 1 : timeout_s / 20 > 10 ? 10 : timeout_s / 20;
    W.stage = NULL;
    W.quit = 0;
    if (pthread_create(&W.th, NULL, loop, NULL) == 0) W.running = 1;
    else fprintf(stderr, "moetrain: warning: could not start the watchdog thread (%s); train.timeout_s is not enforced\n",
                 strerror(errno));
}

void watchdog_stage(int step, const char* stage) {
    if (!W.running) return;
    pthread_mutex_lock(&W.mu);
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
    char p[4200];
    rank_path(p, sizeof p, W.rank);
    unlink(p);
    rmdir(W.dir);  // the last rank out removes it (fails harmlessly while others remain)
}
