// cpu_backend.c — the CPU backend's table: memory, casts, elementwise, reductions.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

typedef struct CpuImpl {
    size_t live, peak;  // bytes
} CpuImpl;

// Each block remembers its size so peak_bytes can be reported.
static void* alloc(Backend* be, size_t bytes) {
    size_t* p = calloc(1, bytes + 16);
    if (!p) FATAL("cpu backend: out of host memory allocating %zu bytes", bytes);
    p[0] = bytes;
    CpuImpl* c = be->impl;
    c->live += bytes;
    if (c->live > c->peak) c->peak = c->live;
    return (char*)p + 16;
}
static void release(Backend* be, void* q) {
    if (!q) return;
    size_t* p = (size_t*)((char*)q - 16);
    ((CpuImpl*)be->impl)->live -= p[0];
    free(p);
}
static size_t peak_bytes(Backend* be) { return ((CpuImpl*)be->impl)->peak; }
static void to_host(Backend* be, void* dst, const void* src, size_t n) { memcpy(dst, src, n); }
static void to_device(Backend* be, void* dst, const void* src, size_t n) { memcpy(dst, src, n); }
static void copy(Backend* be, void* dst, const void* src, size_t n) { memmove(dst, src, n); }
static void zero(Backend* be, void* p, size_t n) { memset(p, 0, n); }
static void sync(Backend* be) {}
static void f32_to_act(Backend* be, void* dst, const float* src, size_t n) { memmove(dst, src, n * sizeof(float)); }
static void act_to_f32(Backend* be, float* dst, const void* src, size_t n) { memmove(dst, src, n * sizeof(float)); }

static void add_act(Backend* be, void* y_, const void* x_, size_t n) {
    float* y = y_;
    const float* x = x_;
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

static void scale_f32(Backend* be, float* x, float s, size_t n) {
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

static void sumsq_f32(Backend* be, float* out, const float* x, size_t n) {
    double s = 0;
#pragma omp parallel for reduction(+ : s)
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    out[0] += (float)s;
}

static void nonfinite_f32(Backend* be, float* out, const float* x, size_t n) {
    int bad = 0;
#pragma omp parallel for reduction(| : bad)
    for (size_t i = 0; i < n; i++) bad |= !isfinite(x[i]);
    if (bad) out[0] = 1;
}

static void destroy(Backend* be) {
    free(be->impl);
    free(be);
}

Backend* cpu_backend_create(void) {
    Backend* be = xcalloc(1, sizeof *be);
    be->name = "cpu";
    be->act_dtype = DTYPE_F32;
    be->impl = xcalloc(1, sizeof(CpuImpl));
    be->alloc = alloc;
    be->free = release;
    be->to_host = to_host;
    be->to_device = to_device;
    be->copy = copy;
    be->zero = zero;
    be->sync = sync;
    be->f32_to_act = f32_to_act;
    be->act_to_f32 = act_to_f32;
    be->add_act = add_act;
    be->scale_f32 = scale_f32;
    be->sumsq_f32 = sumsq_f32;
    be->nonfinite_f32 = nonfinite_f32;
    be->peak_bytes = peak_bytes;
    be->destroy = destroy;
    cpu_register_gemm(be);
    cpu_register_nn(be);
    cpu_register_moe(be);
    return be;
}
