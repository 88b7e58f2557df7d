// run_util.h — helpers for the tests that run the real moetrain binary as a user or a batch
// script does (test_logfile.c, test_train_own.c, test_train_preflight.c, test_messages.c,
// test_stop.c, test_watchdog.c): the binary and a scratch directory, tiny configs, a command run
// for its output and exit code, a job started in its own process group and reaped, waiting for a
// line in a log, and `test_x [WORD ...]` running only the tests whose names hold one of the words.
#pragma once
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>

#include "test_resume_util.h"

static char g_dir[256], g_bin[4096];  // the scratch directory (run_begin), the binary

// A tiny model on random tokens, one rank.
#define TINY                                                                                                   \
    "--config L0_sanity parallel.ep=1 train.device=cpu data.format=random model.hidden=32 model.ffn=48 "       \
    "model.vocab_size=64 train.seq_len=16 train.micro_batch=2 train.global_batch=2 optim.warmup=1 "            \
    "train.eval_batches=1 log.every=1 log.dir="

// The same for scripts/mpirun.sh -np 2 (L0_sanity's expert parallelism over the two ranks).
#define TINY2                                                                                                  \
    "--config L0_sanity train.device=cpu data.format=random model.hidden=32 model.ffn=48 model.vocab_size=64 " \
    "train.seq_len=16 train.micro_batch=2 train.global_batch=4 optim.warmup=1 train.eval_batches=1 log.every=1"

// Runs `cmd` (printf-style) through the shell with stdout+stderr into out[n]; returns the exit
// code (-1 when killed by a signal).
static inline int run(char* out, size_t n, double* secs, const char* fmt, ...) __attribute__((format(printf, 4, 5)));
static inline int run(char* out, size_t n, double* secs, const char* fmt, ...) {
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

// Starts `cmd` through sh in its own process group (stdin /dev/null, output to log), with the
// signals a test may send at their default disposition. Returns the pid (= the group).
static inline pid_t spawn(const char* log, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static inline pid_t spawn(const char* log, const char* fmt, ...) {
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
static inline int reap(pid_t pid, double limit, double* secs) {
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
static inline int wait_for(const char* path, const char* needle, double limit) {
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

// `test_x [WORD ...]`: only the tests whose names hold one of the words.
static int g_argc;
static char** g_argv;
static inline int wanted(const char* name) {
    for (int i = 1; i < g_argc; i++)
        if (strstr(name, g_argv[i])) return 1;
    return g_argc < 2;
}
#define RUN_IF(fn)                  \
    do {                            \
        if (wanted(#fn)) RUN(fn);   \
    } while (0)

// The start of main: finds the binary and makes the scratch directory /tmp/moetrain_NAME_XXXXXX.
static inline int run_begin(int argc, char** argv, const char* name) {
    g_argc = argc;
    g_argv = argv;
    if (find_moetrain(argv[0], g_bin, sizeof g_bin)) return 1;
    snprintf(g_dir, sizeof g_dir, "/tmp/moetrain_%s_XXXXXX", name);
    if (!mkdtemp(g_dir)) return 1;
    return 0;
}
