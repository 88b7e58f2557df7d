// gpu_check.h — helpers of the CUDA-vs-CPU op tests: random inputs, uploads in the act dtype,
// poisoned outputs, downloads as fp32, and the comparison that records every measured error.
//
// Every device output is filled with 0xFF bytes first (NaN in fp32 and bf16, −1 in int32), so
// an element the kernel did not write fails the comparison (rel_l2 treats NaN as +inf).
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "test.h"
#include "util.h"

static Rng g_rng;

// ---- tolerances (relative L2, GPU vs CPU on identical inputs) ---------------------------------
// fp32 mode: no TF32 anywhere (cuBLASLt runs CUBLAS_COMPUTE_32F); what differs is summation
// order, FMA contraction and the ulps of expf/logf — all around 1e-7..1e-6.
#define TOL_F32 1e-5
// bf16 mode, outputs that are fp32 and computed in fp32 from the same bf16 inputs (rstd, lse,
// dw, dtable, dscale, loss, probs, GEMMs with c_f32): only the summation order differs.
#define TOL_FP32_OUT 1e-5
// bf16 mode, outputs stored as bf16: one rounding, ≤ 2^-9 relative per element (~1.1e-3 rms).
#define TOL_BF16_OUT 5e-3
// bf16 mode, fp32 sums of bf16 terms rounded once to bf16 (GEMM with bf16 C, permute_bwd, ...).
#define TOL_BF16_SUM 5e-3
// bf16 attention forward: P is rounded to bf16 before P·V on the tensor cores (FlashAttention
// does the same), then the output rounding. Measured on an H200: ≤ 2.0e-3.
#define TOL_ATTN_FWD 1e-2
// bf16 attention backward: P and dS are rounded to bf16 for the four tensor-core products and
// dq/dk/dv sum many of them; then the output rounding. Measured on an H200: ≤ 2.4e-3.
#define TOL_ATTN_BWD 1e-2
// AdamW's update read back as master_new − master_old: one fp32 ulp of |master| (~1e-7 for
// |master| ~ 1) against a step of ~lr = 1e-2 gives ~1e-5 per element where the two roundings
// of master_new differ (the GPU computes in fp32, the CPU spec in double). Measured: 1.3e-6.
#define TOL_ADAM_STEP 2e-5

static Backend* g_cpu;

// The two modes every op runs in. In bf16 mode the act inputs are rounded to bf16 on the host
// first and both backends get the rounded values (the CPU as fp32, the GPU as bf16).
typedef struct Mode {
    Backend* gpu;
    int bf16;
    const char* name;
} Mode;

static Mode g_modes[2];
#define FOR_MODES for (const Mode* m = g_modes; m < g_modes + 2; m++)
#define TOL(f32, bf) (m->bf16 ? (bf) : (f32))

static inline float* randn(size_t n, float scale) {  // N(0, scale²); never zero in practice
    float* x = xmalloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        float v = rng_normal(&g_rng) * scale;
        x[i] = v == 0.f ? scale : v;
    }
    return x;
}

static inline float* randu(size_t n, float lo, float hi) {
    float* x = xmalloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * rng_uniform(&g_rng);
    return x;
}

static inline float* dupf(const float* x, size_t n) {
    float* y = xmalloc(sizeof(float) * (n ? n : 1));
    if (n) memcpy(y, x, sizeof(float) * n);
    return y;
}

// x rounded to bf16 when the mode is bf16 (a copy either way)
static inline float* act_in(const Mode* m, const float* x, size_t n) {
    float* y = dupf(x, n);
    if (m->bf16)
        for (size_t i = 0; i < n; i++) y[i] = bf16_to_f32(f32_to_bf16(y[i]));
    return y;
}

// n draws of randn / randu, rounded to bf16 in place when the mode is bf16 (act_in without the copy)
static inline float* round_act(const Mode* m, float* x, size_t n) {
    if (m->bf16)
        for (size_t i = 0; i < n; i++) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
    return x;
}
static inline float* randn_act(const Mode* m, size_t n, float scale) { return round_act(m, randn(n, scale), n); }
static inline float* randu_act(const Mode* m, size_t n, float lo, float hi) { return round_act(m, randu(n, lo, hi), n); }

// ---- device buffers ------------------------------------------------------------------------

// Every device buffer a test makes is listed here and freed by dev_free_all() at its end.
enum { MAX_DEV = 1024 };
static struct { Backend* be; void* p; } g_dev[MAX_DEV];
static int g_ndev = 0;

static inline void* dev_alloc(Backend* be, size_t bytes) {
    CHECK(g_ndev < MAX_DEV, "test: too many device buffers");
    void* d = be->alloc(be, bytes);
    g_dev[g_ndev].be = be;
    g_dev[g_ndev++].p = d;
    return d;
}

static inline void dev_free_all(void) {
    for (int i = g_ndev - 1; i >= 0; i--) g_dev[i].be->free(g_dev[i].be, g_dev[i].p);
    g_ndev = 0;
}

static inline void* up_bytes(Backend* be, const void* h, size_t bytes) {
    void* d = dev_alloc(be, bytes);
    be->to_device(be, d, h, bytes);
    return d;
}

static inline float* up_f32(Backend* be, const float* h, size_t n) { return up_bytes(be, h, sizeof(float) * n); }
static inline int32_t* up_i32(Backend* be, const int32_t* h, size_t n) { return up_bytes(be, h, sizeof(int32_t) * n); }

// Uploads fp32 host values as the backend's act dtype (converted on the host).
static inline void* up_act(Backend* be, const float* h, size_t n) {
    if (be->act_dtype == DTYPE_F32) return up_f32(be, h, n);
    uint16_t* t = xmalloc(2 * (n ? n : 1));
    for (size_t i = 0; i < n; i++) t[i] = f32_to_bf16(h[i]);
    void* d = up_bytes(be, t, 2 * n);
    free(t);
    return d;
}

// A buffer of `bytes` filled with 0xFF (NaN / −1): outputs must be written to pass.
static inline void* poison(Backend* be, size_t bytes) {
    void* d = dev_alloc(be, bytes);
    unsigned char* t = xmalloc(bytes ? bytes : 1);
    memset(t, 0xFF, bytes);
    be->to_device(be, d, t, bytes);
    free(t);
    return d;
}
static inline void* poison_act(Backend* be, size_t n) { return poison(be, n * dtype_size(be->act_dtype)); }

static inline float* down_f32(Backend* be, const float* d, size_t n) {
    float* h = xmalloc(sizeof(float) * (n ? n : 1));
    be->to_host(be, h, d, sizeof(float) * n);
    return h;
}

static inline int32_t* down_i32(Backend* be, const int32_t* d, size_t n) {
    int32_t* h = xmalloc(sizeof(int32_t) * (n ? n : 1));
    be->to_host(be, h, d, sizeof(int32_t) * n);
    return h;
}

static inline float* down_act(Backend* be, const void* d, size_t n) {
    if (be->act_dtype == DTYPE_F32) return down_f32(be, d, n);
    uint16_t* t = xmalloc(2 * (n ? n : 1));
    be->to_host(be, t, d, 2 * n);
    float* h = xmalloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) h[i] = bf16_to_f32(t[i]);
    free(t);
    return h;
}

// ---- comparisons ---------------------------------------------------------------------------

// The worst error seen per (label, mode), printed at the end (docs/gpu.md quotes it).
enum { MAX_REC = 2048 };
static struct { char label[64]; double err[2], tol[2]; int seen[2]; } g_rec[MAX_REC];
static int g_nrec = 0, g_rec_dropped = 0;  // labels past MAX_REC: checked, not tabulated

static inline void record(const char* label, int bf16, double err, double tol) {
    int i = 0;
    while (i < g_nrec && strcmp(g_rec[i].label, label)) i++;
    if (i == g_nrec) {
        if (g_nrec == MAX_REC) {
            g_rec_dropped++;
            return;
        }
        snprintf(g_rec[g_nrec++].label, sizeof g_rec[0].label, "%s", label);
    }
    if (!g_rec[i].seen[bf16] || err > g_rec[i].err[bf16]) g_rec[i].err[bf16] = err;
    g_rec[i].tol[bf16] = tol;
    g_rec[i].seen[bf16] = 1;
}

// A device buffer of n act (bf16) elements filled with random values: the nr values of r tiled.
static inline void* rand_act(Backend* be, const float* r, size_t nr, size_t n) {
    void* d = dev_alloc(be, 2 * n);
    void* blk = up_act(be, r, nr);
    for (size_t i = 0; i < n; i += nr) be->copy(be, (char*)d + 2 * i, blk, 2 * (n - i < nr ? n - i : nr));
    return d;
}

// rel_l2(got, ref) ≤ tol; frees got.
static inline void cmp(const Mode* m, const char* label, float* got, const float* ref, size_t n, double tol) {
    const double e = rel_l2(got, ref, n);
    record(label, m->bf16, e, tol);
    EXPECT(e <= tol, "%s [%s]: rel L2 error %.3g > %.3g", label, m->name, e, tol);
    free(got);
}

static inline void cmp_i32(const Mode* m, const char* label, int32_t* got, const int32_t* ref, size_t n) {
    size_t bad = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (got[i] != ref[i]) {
            if (first == n) first = i;
            bad++;
        }
    record(label, m->bf16, (double)bad, 0);
    EXPECT(bad == 0, "%s [%s]: %zu of %zu differ (first at %zu: got %d, want %d)", label, m->name, bad, n, first,
           bad ? got[first] : 0, bad ? ref[first] : 0);
    free(got);
}

// Bitwise equality of two downloads (determinism); frees both.
static inline void cmp_bits(const Mode* m, const char* label, float* a, float* b, size_t n) {
    const int same = memcmp(a, b, sizeof(float) * n) == 0;
    record(label, m->bf16, same ? 0 : 1, 0);
    EXPECT(same, "%s [%s]: two runs on the same inputs differ", label, m->name);
    free(a);
    free(b);
}

static inline void print_records(void) {
    printf("\n%-38s %12s %9s %12s %9s\n", "check", "fp32 err", "tol", "bf16 err", "tol");
    for (int i = 0; i < g_nrec; i++) {
        printf("%-38s", g_rec[i].label);
        for (int b = 0; b < 2; b++) {
            if (g_rec[i].seen[b]) printf(" %12.3g %9.2g", g_rec[i].err[b], g_rec[i].tol[b]);
            else printf(" %12s %9s", "-", "-");
        }
        printf("\n");
    }
    if (g_rec_dropped) printf("(%d more checks not tabulated: raise MAX_REC)\n", g_rec_dropped);
    printf("\n");
}

// The CPU backend and both CUDA modes; returns 0, or prints why there is no GPU and returns 1.
static inline int gpu_setup(const char* prog) {
    rng_seed(&g_rng, 20240611);
    g_cpu = cpu_backend_create();
    Err e32 = {{0}}, e16 = {{0}};
    g_modes[0] = (Mode){cuda_backend_create(DTYPE_F32, 0, NULL, &e32), 0, "fp32"};
    g_modes[1] = (Mode){cuda_backend_create(DTYPE_BF16, 0, NULL, &e16), 1, "bf16"};
    if (!g_modes[0].gpu || !g_modes[1].gpu) {
        fprintf(stderr, "%s needs a GPU: %s\n", prog, e32.msg[0] ? e32.msg : e16.msg);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    return 0;
}

// Both CUDA modes on new backends made with the gpu.* options o (tests of an option's path); the
// current ones go to saved, for gpu_modes_restore. Call dev_free_all before either.
static inline void gpu_modes_with(const GpuConfig* o, Mode saved[2]) {
    for (int i = 0; i < 2; i++) {
        saved[i] = g_modes[i];
        Err e = {{0}};
        g_modes[i].gpu = cuda_backend_create(i ? DTYPE_BF16 : DTYPE_F32, 0, o, &e);
        CHECK(g_modes[i].gpu, "cuda_backend_create: %s", e.msg);
    }
}
static inline void gpu_modes_restore(Mode saved[2]) {
    for (int i = 0; i < 2; i++) {
        g_modes[i].gpu->destroy(g_modes[i].gpu);
        g_modes[i] = saved[i];
    }
}

static inline void gpu_teardown(void) {
    print_records();
    for (int i = 0; i < 2; i++) g_modes[i].gpu->destroy(g_modes[i].gpu);
    g_cpu->destroy(g_cpu);
}

// ---- bitwise comparisons (embed_bwd, the split masters) ------------------------------------

// Bitwise equality with the reference (frees got): the count of differing elements is recorded.
static inline void cmp_exact(const Mode* m, const char* label, const char* what, float* got, const float* ref, size_t n) {
    size_t bad = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &ref[i], sizeof(float))) {
            if (first == n) first = i;
            bad++;
        }
    record(label, m->bf16, (double)bad, 0);
    EXPECT(bad == 0, "%s [%s] %s: %zu of %zu elements differ in bits (first at %zu: got %.9g, want %.9g)", label,
           m->name, what, bad, n, first, bad ? got[first] : 0.f, bad ? ref[first] : 0.f);
    free(got);
}

static inline uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static inline float float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
// Finite x to bf16 bits, nearest, ties away from zero, by value (as tests/test_cpu_optim.c; test_cuda_optim, test_cuda_model): the
// truncation (bits hi) or the next bf16 away from zero (hi + 1; 0x7f80 counts as 2^128).
static inline uint16_t bf16_away(float x) {
    const uint32_t hi = bits_of(x) >> 16, up_bits = (hi + 1) & 0xffffu;
    const double ax = fabs((double)x), t = fabs((double)bf16_to_f32((uint16_t)hi));
    const double up = (up_bits & 0x7fffu) == 0x7f80u ? ldexp(1, 128) : fabs((double)bf16_to_f32((uint16_t)up_bits));
    return (uint16_t)(up - ax <= ax - t ? hi + 1 : hi);
}

// 16-bit downloads compared element for element (frees got); the count is recorded.
static inline void cmp_u16(const Mode* m, const char* label, uint16_t* got, const uint16_t* ref, size_t n) {
    size_t bad = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (got[i] != ref[i]) {
            if (first == n) first = i;
            bad++;
        }
    record(label, m->bf16, (double)bad, 0);
    EXPECT(bad == 0, "%s [%s]: %zu of %zu differ (first at %zu: got 0x%04x, want 0x%04x)", label, m->name, bad, n, first,
           bad ? got[first] : 0, bad ? ref[first] : 0);
    free(got);
}
static inline uint16_t* down_u16(Backend* be, const void* d, size_t n) {
    uint16_t* h = xmalloc(2 * (n ? n : 1));
    be->to_host(be, h, d, 2 * n);
    return h;
}
