// dev_bench.h — the timing helper of the dev/ drivers (gpu_bench.c, test_gemm_wg.c), after
// tests/gpu/gpu_check.h.
#pragma once
#include "gpu_check.h"

// Milliseconds per call of fn(ctx) over reps calls, after one warm-up call (plans, attributes, caches).
static inline double time_ms(Backend* be, void (*fn)(void*), void* ctx, int reps) {
    fn(ctx);
    be->sync(be);
    const double t0 = now_sec();
    for (int i = 0; i < reps; i++) fn(ctx);
    be->sync(be);
    return (now_sec() - t0) * 1e3 / reps;
}
