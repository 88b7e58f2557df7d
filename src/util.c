// util.c — see util.h.
#define _POSIX_C_SOURCE 200809L
#include "util.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int g_rank = 0, g_device = -1;
static void (*g_abort_hook)(int) = NULL;

int err_set(Err* e, const char* fmt, ...) {
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

void util_set_rank(int rank, int device) { g_rank = rank; g_device = device; }
int util_rank(void) { return g_rank; }
void util_set_abort_hook(void (*hook)(int)) { g_abort_hook = hook; }

void util_abort(int code) {
    fflush(stdout);
    fflush(stderr);
    if (g_abort_hook) g_abort_hook(code);
    exit(code);
}

void fatal_at(const char* file, int line, const char* fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (g_device >= 0)
        fprintf(stderr, "moetrain: rank %d (device %d): %s:%d: %s\n", g_rank, g_device, file, line, buf);
    else
        fprintf(stderr, "moetrain: rank %d: %s:%d: %s\n", g_rank, file, line, buf);
    util_abort(1);
}

static FILE* g_log_stream;  // NULL until log_set_stream: stdout
static int g_log_off;

void log_set_stream(FILE* f) {
    g_log_stream = f;
    g_log_off = f == NULL;
}

void log_info(const char* fmt, ...) {
    if (g_rank != 0 || g_log_off) return;
    FILE* f = g_log_stream ? g_log_stream : stdout;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fflush(f);
}

void* xmalloc(size_t n) {
    void* p = malloc(n ? n : 1);
    if (!p) FATAL("out of host memory allocating %zu bytes", n);
    return p;
}

void* xcalloc(size_t n, size_t sz) {
    void* p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) FATAL("out of host memory allocating %zu x %zu bytes", n, sz);
    return p;
}

char* xstrdup(const char* s) {
    size_t n = strlen(s) + 1;
    char* p = xmalloc(n);
    memcpy(p, s, n);
    return p;
}

double now_sec(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void random_id(char* out, size_t n) {
    uint64_t r = ((uint64_t)getpid() << 32) ^ (uint64_t)(now_sec() * 1e9);
    FILE* f = fopen("/dev/urandom", "rb");
    if (f) {
        if (fread(&r, sizeof r, 1, f) != 1) r ^= 0x9E3779B97F4A7C15ull;
        fclose(f);
    }
    snprintf(out, n, "%016llx", (unsigned long long)r);
}

static uint64_t splitmix64(uint64_t* x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void rng_seed(Rng* r, uint64_t seed) {
    uint64_t x = seed;
    r->s = splitmix64(&x);
    if (r->s == 0) r->s = 1;
}

uint64_t rng_u64(Rng* r) {  // xorshift64*
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

float rng_uniform(Rng* r) { return (float)(rng_u64(r) >> 40) * (1.0f / 16777216.0f); }

float rng_normal(Rng* r) {  // Box-Muller, one value per call (simple and deterministic)
    float u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-12f) u1 = 1e-12f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
}

uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

int edit_distance(const char* a, const char* b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 128 || m > 128) return 1000;
    int prev[129], cur[129];
    for (size_t j = 0; j <= m; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= m; j++) {
            int c = prev[j - 1] + (a[i - 1] != b[j - 1]);
            int d = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = c < d ? (c < ins ? c : ins) : (d < ins ? d : ins);
        }
        memcpy(prev, cur, sizeof(int) * (m + 1));
    }
    return prev[m];
}

int split_list_inplace(char* buf, char** items, int max) {
    int n = 0;
    char* save = NULL;
    for (char* it = strtok_r(buf, ",", &save); it; it = strtok_r(NULL, ",", &save)) {
        while (*it == ' ' || *it == '\t') it++;
        char* end = it + strlen(it);
        while (end > it && (end[-1] == ' ' || end[-1] == '\t')) *--end = 0;
        if (*it && n < max) items[n++] = it;
    }
    return n;
}
