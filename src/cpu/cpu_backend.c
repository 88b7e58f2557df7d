// cpu_backend.c — the CPU backend's ops table: memory, casts, elementwise ops, reductions.
// The numeric ops live in cpu_gemm.c (cpu_gemm_fp8.c with fp8 set), cpu_norm.c, cpu_attn.c,
// cpu_moe.c, cpu_loss.c and cpu_optim.c; this file wires them into the Backend table.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "cpu.h"

// Elementwise loops smaller than this run on one thread (a parallel region costs ~µs).
#define PAR_MIN 32768

// ---- deterministic reductions ----------------------------------------------------------------

#define CHUNKS_MAX 64

double cpu_sum_chunks(size_t n, size_t min_chunk, double (*f)(const void*, size_t, size_t), const void* ctx) {
    if (n == 0) return 0;
    if (min_chunk < 1) min_chunk = 1;
    size_t chunks = (n + min_chunk - 1) / min_chunk;
    if (chunks > CHUNKS_MAX) chunks = CHUNKS_MAX;
    const size_t per = (n + chunks - 1) / chunks;
    double part[CHUNKS_MAX];
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (size_t c = 0; c < chunks; c++) {
        const size_t lo = c * per, hi = lo + per < n ? lo + per : n;
        part[c] = lo < hi ? f(ctx, lo, hi) : 0.0;
    }
    double s = 0;
    for (size_t c = 0; c < chunks; c++) s += part[c];
    return s;
}

// ---- memory ----------------------------------------------------------------------------------

// Each block carries a 64-byte header holding its size (so peak_bytes can be reported); the
// pointer handed out stays 16-byte aligned (calloc's alignment).
#define HDR 64

static void* cpu_alloc(Backend* be, size_t bytes) {
    char* p = calloc(1, bytes + HDR);
    if (!p) FATAL("cpu backend: out of host memory allocating %zu bytes; reduce the batch or the model", bytes);
    memcpy(p, &bytes, sizeof bytes);
    CpuImpl* c = be->impl;
    c->live += bytes;
    if (c->live > c->peak) c->peak = c->live;
    return p + HDR;
}

static void cpu_free(Backend* be, void* q) {
    if (!q) return;
    char* p = (char*)q - HDR;
    size_t bytes;
    memcpy(&bytes, p, sizeof bytes);
    ((CpuImpl*)be->impl)->live -= bytes;
    free(p);
}

static size_t cpu_peak_bytes(Backend* be) { return ((CpuImpl*)be->impl)->peak; }
// memmove, not memcpy: harmless when the regions do not overlap, defined when they do.
static void cpu_to_host(Backend* be, void* dst, const void* src, size_t n) { if (n) memmove(dst, src, n); }
static void cpu_to_device(Backend* be, void* dst, const void* src, size_t n) { if (n) memmove(dst, src, n); }
static void cpu_copy(Backend* be, void* dst, const void* src, size_t n) { if (n) memmove(dst, src, n); }
static void cpu_zero(Backend* be, void* p, size_t n) { if (n) memset(p, 0, n); }
static void cpu_sync(Backend* be) {}

// ---- casts and elementwise -------------------------------------------------------------------

static void cpu_f32_to_act(Backend* be, void* dst, const float* src, size_t n) {
    if (n && dst != src) memmove(dst, src, n * sizeof(float));
}
static void cpu_act_to_f32(Backend* be, float* dst, const void* src, size_t n) {
    if (n && dst != src) memmove(dst, src, n * sizeof(float));
}

static void cpu_add_act(Backend* be, void* y_, const void* x_, size_t n) {
    float* y = y_;        // [n]
    const float* x = x_;  // [n]
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

static void cpu_scale_f32(Backend* be, float* x, float s, size_t n) {
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

static double sumsq_range(const void* ctx, size_t lo, size_t hi) {
    const float* x = ctx;
    double s = 0;
    for (size_t i = lo; i < hi; i++) s += (double)x[i] * x[i];
    return s;
}

static void cpu_sumsq_f32(Backend* be, float* out, const float* x, size_t n) {
    out[0] = (float)((double)out[0] + cpu_sum_chunks(n, 8192, sumsq_range, x));
}

static void cpu_sumsq_act(Backend* be, float* out, const void* x, size_t n) { cpu_sumsq_f32(be, out, x, n); }

static void cpu_nonfinite_f32(Backend* be, float* out, const float* x, size_t n) {
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) bad |= !isfinite(x[i]);
    if (bad) out[0] = 1;
}

// ---- events: the ops have run when they return, so an event is the clock at its record --------

struct BackendEvent {
    double t;
};
static BackendEvent* cpu_event_create(Backend* be) { return xcalloc(1, sizeof(BackendEvent)); }
static void cpu_event_record(Backend* be, BackendEvent* ev) { ev->t = now_sec(); }
static double cpu_event_elapsed(Backend* be, BackendEvent* a, BackendEvent* b) { return b->t - a->t; }
static void cpu_event_destroy(Backend* be, BackendEvent* ev) { free(ev); }

// MPI on host memory; staged (parallel.comm=mpi): the same through a host copy, the path GPU
// ranks without NCCL take, so the CPU tests run it.
static Comm* cpu_comm_create(Backend* be, const CommOpts* o, Err* e) {
    return o->staged ? comm_staged_create(o->ep, be) : comm_mpi_create(o->ep);
}

// ---- the table -------------------------------------------------------------------------------

static void cpu_destroy(Backend* be) {
    CpuImpl* c = be->impl;
    free(c->bpack);
    free(c);
    free(be);
}

Backend* cpu_backend_create(void) {
    Backend* be = xcalloc(1, sizeof *be);
    CpuImpl* c = xcalloc(1, sizeof *c);
    c->bpack = xmalloc(sizeof(float) * CPU_KC * CPU_NC);
    be->name = "cpu";
    be->act_dtype = DTYPE_F32;
    be->impl = c;

    be->alloc = cpu_alloc;
    be->free = cpu_free;
    be->to_host = cpu_to_host;
    be->to_device = cpu_to_device;
    be->copy = cpu_copy;
    be->zero = cpu_zero;
    be->sync = cpu_sync;

    be->f32_to_act = cpu_f32_to_act;
    be->act_to_f32 = cpu_act_to_f32;
    be->add_act = cpu_add_act;
    be->scale_f32 = cpu_scale_f32;
    be->sumsq_f32 = cpu_sumsq_f32;
    be->sumsq_act = cpu_sumsq_act;  // act is fp32 here
    be->nonfinite_f32 = cpu_nonfinite_f32;

    be->embed_fwd = cpu_embed_fwd;
    be->embed_bwd = cpu_embed_bwd;
    be->rmsnorm_fwd = cpu_rmsnorm_fwd;
    be->rmsnorm_bwd = cpu_rmsnorm_bwd;
    be->rope_qkv = cpu_rope_qkv;
    be->attn_fwd = cpu_attn_fwd;
    be->attn_bwd = cpu_attn_bwd;
    be->rope_qkv_at = cpu_rope_qkv_at;
    be->kv_append = cpu_kv_append;
    be->attn_decode = cpu_attn_decode;

    be->gemm = cpu_gemm;
    be->gemm_grouped = cpu_gemm_grouped;
    be->gemm_grouped_wgrad = cpu_gemm_grouped_wgrad;
    be->fp8_ws_bytes = cpu_fp8_ws_bytes;
    be->fp8_wcodes_bytes = cpu_fp8_wcodes_bytes;
    be->fp8_wcodes_make = cpu_fp8_wcodes_make;
    be->fp8_xcodes_bytes = cpu_fp8_xcodes_bytes;
    be->fp8_xcodes_make = cpu_fp8_xcodes_make;

    be->swiglu_fwd = cpu_swiglu_fwd;
    be->gemm_grouped_swiglu = cpu_gemm_grouped_swiglu;
    be->gemm_grouped_swiglu_bwd = gemm_grouped_swiglu_bwd_seq;
    be->gemm_grouped_ffn = gemm_grouped_ffn_seq;
    be->swiglu_bwd = cpu_swiglu_bwd;
    be->router_fwd = cpu_router_fwd;
    be->router_bwd = cpu_router_bwd;
    be->moe_index = cpu_moe_index;
    be->permute_fwd = cpu_permute_fwd;
    be->permute_bwd = cpu_permute_bwd;
    be->gather_rows_f32 = cpu_gather_rows_f32;
    be->scatter_rows_f32 = cpu_scatter_rows_f32;
    be->unpermute_fwd = cpu_unpermute_fwd;
    be->unpermute_bwd = cpu_unpermute_bwd;

    be->cross_entropy = cpu_cross_entropy;
    be->adamw = cpu_adamw;
    be->split_pack = cpu_split_pack;
    be->split_unpack = cpu_split_unpack;
    be->adamw_split = cpu_adamw_split;

    be->peak_bytes = cpu_peak_bytes;
    be->event_create = cpu_event_create;
    be->event_record = cpu_event_record;
    be->event_elapsed = cpu_event_elapsed;
    be->event_destroy = cpu_event_destroy;
    be->comm_create = cpu_comm_create;
    be->device = "cpu";  // no mem_info: host memory is not device memory
    be->destroy = cpu_destroy;
    return be;
}
