// test.h — the tiny test harness. Each test binary ends with `N passed, N failed` and exits
// non-zero when anything failed. EXPECT records a failure and continues; tests are functions
// registered in main with RUN(fn).
#pragma once
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static int t_passed = 0, t_failed = 0, t_cur_failed = 0;

// DIR/NAME in one of 8 rotating buffers: valid until the eighth call after it.
static inline const char* t_join(const char* dir, const char* name) {
    static char p[8][512];
    static int k = 0;
    k = (k + 1) % 8;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

// Runs a shell command (printf-style); returns its exit status, 128 + the signal when a signal
// ended it, -1 when it could not run.
static inline int sh(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static inline int sh(const char* fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    if (st == -1) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// A file's text (at most n - 1 bytes) into out; "" when it cannot be read.
static inline void t_read_text(const char* path, char* out, size_t n) {
    out[0] = 0;
    FILE* f = fopen(path, "r");
    if (!f) return;
    size_t k = fread(out, 1, n - 1, f);
    out[k] = 0;
    fclose(f);
}

// A whole file, NUL-terminated (free it); its length in *n when n is not NULL. NULL when the file
// cannot be opened or read in full.
static inline char* t_slurp(const char* path, size_t* n) {
    FILE* f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long k = ftell(f);
    fseek(f, 0, SEEK_SET);
    char* b = k >= 0 ? (char*)malloc((size_t)k + 1) : NULL;
    size_t got = b ? fread(b, 1, (size_t)k, f) : 0;
    fclose(f);
    if (!b || got != (size_t)k) return free(b), (char*)NULL;
    b[got] = 0;
    if (n) *n = got;
    return b;
}
static const char* t_cur = "";

#define EXPECT(cond, ...)                                                       \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "  FAIL %s (%s:%d): ", t_cur, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, "\n");                                              \
            t_cur_failed++;                                                     \
        }                                                                       \
    } while (0)

// Relative L2 error ‖a − b‖ / ‖b‖ (NaN in either never passes: returns +inf).
static inline double rel_l2(const float* a, const float* b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    if (den == 0) return num == 0 ? 0 : INFINITY;
    return sqrt(num / den);
}

#define RUN(fn)                                                         \
    do {                                                                \
        t_cur = #fn;                                                    \
        t_cur_failed = 0;                                               \
        fn();                                                           \
        if (t_cur_failed) { t_failed++; printf("FAIL %s\n", #fn); }     \
        else { t_passed++; printf("ok   %s\n", #fn); }                  \
        fflush(stdout);                                                 \
    } while (0)

#define TEST_END()                                              \
    do {                                                        \
        printf("%d passed, %d failed\n", t_passed, t_failed);   \
        return t_failed ? 1 : 0;                                \
    } while (0)
