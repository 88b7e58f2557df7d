// test_resume_util.h — helpers shared by the resume / reshard tests (test_resume.c,
// mpi_resume.c, test_reshard.c): a tiny config in code, metrics.jsonl traces without the
// timing fields, bitwise comparison of two checkpoints, damaging files.
#pragma once
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "config.h"
#include "test.h"
#include "train.h"
#include "util.h"

// A tiny model on random tokens (fast, no data file), then `extra` overrides.
static inline int tiny_config(Config* c, const char* const* extra, int n, Err* e) {
    static const char* const base[] = {
        "train.device=cpu", "data.format=random", "train.steps=6", "optim.warmup=2", "train.seq_len=16",
        "train.micro_batch=4", "train.global_batch=8", "train.eval_batches=2", "train.eval_every=3", "log.every=1",
        "model.hidden=32", "model.ffn=48", "model.heads=4", "model.kv_heads=2", "model.experts=4", "model.top_k=2",
        "model.vocab_size=64", "train.seed=77", "log.dir=", "checkpoint.keep=0"};
    config_defaults(c);
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        if (config_override(c, base[i], e)) return -1;
    for (int i = 0; i < n; i++)
        if (extra[i] && config_override(c, extra[i], e)) return -1;
    return 0;
}

// trainer_init on tiny_config(extra).
static inline int tiny_trainer(Trainer* t, const char* const* extra, int n, Err* e) {
    Config c;
    if (tiny_config(&c, extra, n, e)) return -1;
    return trainer_init(t, &c, e);
}

// Whether two trainers hold the same optimizer shards (fp32 masters, Adam m and v) and, with
// weights, the same compute weights; *what names the first difference.
static inline int trainer_state_eq(const Trainer* a, const Trainer* b, int weights, const char** what) {
    for (int r = 0; r < 2; r++) {
        const OptShard *x = &a->opt.sh[r], *y = &b->opt.sh[r];
        if (x->n != y->n) return *what = "shard size", 0;
        if (memcmp(x->master, y->master, sizeof(float) * x->n)) return *what = "fp32 masters", 0;
        if (memcmp(x->m, y->m, sizeof(float) * x->n)) return *what = "Adam m", 0;
        if (memcmp(x->v, y->v, sizeof(float) * x->n)) return *what = "Adam v", 0;
        if (weights && memcmp(a->model.w[r], b->model.w[r], sizeof(float) * a->model.padded[r]))
            return *what = "compute weights", 0;
    }
    return 1;
}

static inline void strip_field(char* buf, const char* key) {
    char* s = strstr(buf, key);
    char* end = s ? strstr(s, ", ") : NULL;
    if (end) memmove(s, end + 2, strlen(end + 2) + 1);
}

// The lines of metrics.jsonl without the fields that depend on the clock (speed, times, ETA).
// Returns the number of lines (at most max, -1 when the file is missing); each is malloc'd.
static inline int read_trace(const char* path, char** lines, int max) {
    FILE* f = fopen(path, "r");
    if (!f) return -1;
    char buf[4096];
    int n = 0;
    static const char* const clock_fields[] = {"\"tokens_per_s\": ", "\"step_ms\": ", "\"model_tflops\": ",
                                               "\"mfu_pct\": ", "\"elapsed_s\": ", "\"eta_s\": "};
    while (n < max && fgets(buf, sizeof buf, f)) {
        strip_field(buf, "\"run_id\": ");  // differs between runs (or by design, a resumed run keeps it)
        for (size_t k = 0; k < sizeof clock_fields / sizeof clock_fields[0]; k++) strip_field(buf, clock_fields[k]);
        lines[n++] = xstrdup(buf);
    }
    fclose(f);
    return n;
}

static inline void free_trace(char** lines, int n) {
    for (int i = 0; i < n; i++) free(lines[i]);
}

// Every tensor of checkpoint a is in b with the same shape and the same bits, and the counts
// match. Returns the number of differences (-1 when one cannot be opened); msg says the first.
static inline int ckpt_diff(const char* a, const char* b, char* msg, size_t mn) {
    Ckpt *ca = NULL, *cb = NULL;
    Err e = {{0}};
    msg[0] = 0;
    if (ckpt_open(&ca, a, &e) || ckpt_open(&cb, b, &e)) {
        snprintf(msg, mn, "open: %s", e.msg);
        if (ca) ckpt_close(ca);
        return -1;
    }
    int bad = 0;
    if (ckpt_num_tensors(ca) != ckpt_num_tensors(cb)) {
        snprintf(msg, mn, "%d vs %d tensors", ckpt_num_tensors(ca), ckpt_num_tensors(cb));
        bad++;
    }
    for (int i = 0; i < ckpt_num_tensors(ca); i++) {
        const char* nm = ckpt_tensor_name(ca, i);
        int nd = 0;
        int64_t sh[8];
        ckpt_tensor_shape(ca, nm, &nd, sh);
        size_t numel = 1;
        for (int d = 0; d < nd; d++) numel *= (size_t)sh[d];
        float* x = xmalloc(sizeof(float) * numel);
        float* y = xmalloc(sizeof(float) * numel);
        if (ckpt_read(ca, nm, x, nd, sh, &e) || ckpt_read(cb, nm, y, nd, sh, &e)) {
            if (!bad) snprintf(msg, mn, "%s", e.msg);
            bad++;
        } else if (memcmp(x, y, sizeof(float) * numel)) {
            if (!bad) snprintf(msg, mn, "%s differs", nm);
            bad++;
        }
        free(x);
        free(y);
    }
    ckpt_close(ca);
    ckpt_close(cb);
    return bad;
}

// Flips one byte at offset (from the end when negative) of a file.
static inline int flip_byte(const char* path, long off) {
    FILE* f = fopen(path, "r+b");
    if (!f) return -1;
    if (fseek(f, off, off < 0 ? SEEK_END : SEEK_SET)) return fclose(f), -1;
    int c = fgetc(f);
    fseek(f, -1, SEEK_CUR);
    fputc(c ^ 0x5A, f);
    return fclose(f);
}

// The "loss" of each line of metrics.jsonl (at most max). Returns the count, -1 without a file.
static inline int read_losses(const char* path, double* loss, int max) {
    FILE* f = fopen(path, "r");
    if (!f) return -1;
    char line[4096];
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        char* s = strstr(line, "\"loss\": ");
        if (s) loss[n++] = atof(s + 8);
    }
    fclose(f);
    return n;
}

// BUILD/moetrain next to the directory of this test binary (BUILD/tests/NAME).
static inline void moetrain_path(const char* argv0, char* out, size_t n) {
    char self[4096];
    if (!realpath(argv0, self)) {
        snprintf(out, n, "build/moetrain");
        return;
    }
    char* slash = strrchr(self, '/');
    if (slash) *slash = 0;
    slash = strrchr(self, '/');
    if (slash) *slash = 0;
    snprintf(out, n, "%.4000s/moetrain", self);
}

// Goes to the repository root (two levels above BUILD/tests/NAME), where scripts/ and configs/ are.
static inline int chdir_repo(const char* bin) {
    char d[4096];
    snprintf(d, sizeof d, "%s", bin);
    char* slash = strrchr(d, '/');
    if (slash) *slash = 0;  // BUILD
    slash = strrchr(d, '/');
    if (slash) *slash = 0;  // repository
    return chdir(d);
}

// A scratch directory TMPDIR/NAME_XXXXXX (or /tmp) into dir[n]; aborts when it cannot be made.
static inline void scratch_dir(char* dir, size_t n, const char* name) {
    const char* tmp = getenv("TMPDIR");
    snprintf(dir, n, "%s/%s_XXXXXX", tmp && tmp[0] ? tmp : "/tmp", name);
    CHECK(mkdtemp(dir), "mkdtemp %s failed", dir);
}

// Removes the scratch directory when every test passed, else says where its files are.
static inline void scratch_done(const char* dir, const char* name, int failed) {
    if (!failed) sh("rm -rf '%s'", dir);
    else fprintf(stderr, "%s: files kept in %s\n", name, dir);
}

// For tests that run the binary: finds BUILD/moetrain (moetrain_path) and goes to the repository
// root. Returns 0, or prints the failure summary line and returns 1.
static inline int find_moetrain(const char* argv0, char* bin, size_t n) {
    moetrain_path(argv0, bin, n);
    if (chdir_repo(bin) || access(bin, X_OK)) {
        printf("FAIL: %s is not built\n0 passed, 1 failed\n", bin);
        return 1;
    }
    return 0;
}

// Processes below root (children, grandchildren, ... to depth 4) named "moetrain": at most max
// into out; returns how many.
static inline int find_ranks(pid_t root, pid_t* out, int max) {
    pid_t level[64];
    int nl = 1, n = 0;
    level[0] = root;
    for (int depth = 0; depth < 4 && nl > 0; depth++) {
        pid_t next[64];
        int nn = 0;
        DIR* d = opendir("/proc");
        if (!d) return n;
        struct dirent* de;
        while ((de = readdir(d))) {
            pid_t pid = (pid_t)atoi(de->d_name);
            if (pid <= 0) continue;
            char p[64], buf[512];
            snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
            FILE* f = fopen(p, "r");
            if (!f) continue;
            size_t k = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[k] = 0;
            char* rp = strrchr(buf, ')');  // "pid (comm) state ppid ..."
            char* lp = strchr(buf, '(');
            if (!rp || !lp) continue;
            int ppid = 0;
            char st;
            if (sscanf(rp + 1, " %c %d", &st, &ppid) != 2) continue;
            for (int i = 0; i < nl; i++)
                if (ppid == level[i]) {
                    if (nn < 64) next[nn++] = pid;
                    if (rp - lp - 1 == 8 && !strncmp(lp + 1, "moetrain", 8) && n < max) out[n++] = pid;
                }
        }
        closedir(d);
        memcpy(level, next, sizeof(pid_t) * (size_t)nn);
        nl = nn;
    }
    return n;
}

// The last val_loss value of a metrics.jsonl, as text ("" when none).
static inline void last_val_loss(const char* path, char* out, size_t n) {
    out[0] = 0;
    FILE* f = fopen(path, "r");
    if (!f) return;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        char* s = strstr(line, "\"val_loss\": ");
        if (s) snprintf(out, n, "%.*s", (int)strcspn(s + 12, ",}"), s + 12);
    }
    fclose(f);
}

// Lines of a file (0 when it cannot be read).
static inline int count_lines(const char* path) {
    FILE* f = fopen(path, "r");
    if (!f) return 0;
    int n = 0, c;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}
