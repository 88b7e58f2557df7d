// test_cuda_backend_ops.c — cuda/cuda_backend.cu's memory and elementwise ops against the CPU
// backend (the spec), in fp32 and bf16 modes: alloc, copy, zero, peak_bytes, mem_info and the
// device name, the casts, add, scale, sumsq, nonfinite, row gathers and scatters.
// Outputs are poisoned (0xFF bytes) first; errors are relative L2 (test.h rel_l2). The table of
// the worst error per check is printed at the end. Needs a GPU: without one it fails.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"

// ---- memory, casts, elementwise, reductions ----------------------------------------------------

static void test_memory(void) {
    FOR_MODES {
        Backend* be = m->gpu;
        const size_t n = 1003;
        float* z = down_f32(be, dev_alloc(be, n * 4), n);
        int nz = 0;
        for (size_t i = 0; i < n; i++) nz += z[i] != 0.f;
        EXPECT(nz == 0, "alloc [%s]: %d of %zu elements not zeroed", m->name, nz, n);
        free(z);
        float* x = randn(n, 1.f);
        float* a = up_f32(be, x, n);
        float* b = poison(be, n * 4);
        be->copy(be, b, a, n * 4);
        cmp(m, "copy", down_f32(be, b, n), x, n, 0);
        be->zero(be, b, n * 4);
        z = down_f32(be, b, n);
        nz = 0;
        for (size_t i = 0; i < n; i++) nz += z[i] != 0.f;
        EXPECT(nz == 0, "zero [%s]: %d elements not zeroed", m->name, nz);
        free(z);
        EXPECT(be->peak_bytes && be->peak_bytes(be) >= 2 * n * 4, "peak_bytes [%s] below what was allocated",
               m->name);
        BackendMem mem = {0};
        if (be->mem_info) be->mem_info(be, &mem);
        EXPECT(be->mem_info && mem.live >= 2 * n * 4 && mem.peak >= mem.live && mem.device_total > 0 &&
                   mem.device_used >= mem.live && mem.device_used <= mem.device_total,
               "mem_info [%s]: live %zu, peak %zu, device %zu of %zu bytes", m->name, mem.live, mem.peak, mem.device_used,
               mem.device_total);
        EXPECT(be->device && be->device[0], "the device's name [%s]", m->name);
        free(x);
        dev_free_all();
    }
}

static void test_casts(void) {
    FOR_MODES {
        Backend* be = m->gpu;
        const size_t n = 10007;
        float* x = randn(n, 3.f);
        float* xr = act_in(m, x, n);  // what the act dtype holds
        void* act = poison_act(be, n);
        be->f32_to_act(be, act, up_f32(be, x, n), n);
        cmp(m, "f32_to_act", down_act(be, act, n), xr, n, 0);
        float* back = poison(be, n * 4);
        be->act_to_f32(be, back, up_act(be, xr, n), n);
        cmp(m, "act_to_f32", down_f32(be, back, n), xr, n, 0);

        float* y = randn_act(m, n, 1.f);
        void* dy = up_act(be, y, n);
        be->add_act(be, dy, up_act(be, xr, n), n);
        for (size_t i = 0; i < n; i++) y[i] += xr[i];
        cmp(m, "add_act", down_act(be, dy, n), y, n, TOL(TOL_F32, TOL_BF16_OUT));

        float* s = dupf(x, n);
        float* ds = up_f32(be, s, n);
        be->scale_f32(be, ds, -0.37f, n);
        g_cpu->scale_f32(g_cpu, s, -0.37f, n);
        cmp(m, "scale_f32", down_f32(be, ds, n), s, n, TOL_F32);

        const size_t big = 300007;  // several blocks' worth per partial
        float* v = randn(big, 2.f);
        float ref = 1.5f;
        g_cpu->sumsq_f32(g_cpu, &ref, v, big);
        float* dv = up_f32(be, v, big);
        float init = 1.5f;
        float* out1 = up_f32(be, &init, 1);
        float* out2 = up_f32(be, &init, 1);
        be->sumsq_f32(be, out1, dv, big);
        be->sumsq_f32(be, out2, dv, big);
        cmp(m, "sumsq_f32", down_f32(be, out1, 1), &ref, 1, TOL_F32);
        cmp_bits(m, "sumsq_f32 deterministic", down_f32(be, out1, 1), down_f32(be, out2, 1), 1);
        {  // sumsq_act (act-dtype gradients) on act values, from a 16-byte boundary and after a scalar head
            float* va = act_in(m, v, big);
            char* dva = up_act(be, va, big);
            for (int off = 0; off < 4; off += 3) {
                float ra = 1.5f;
                g_cpu->sumsq_f32(g_cpu, &ra, va + off, big - off);
                float* o = up_f32(be, &init, 1);
                be->sumsq_act(be, o, dva + off * dtype_size(be->act_dtype), big - off);
                cmp(m, off ? "sumsq_act (unaligned)" : "sumsq_act", down_f32(be, o, 1), &ra, 1, TOL_F32);
            }
            free(va);
        }

        const float q = 0.25f, one = 1.f;
        float* flag = up_f32(be, &q, 1);
        be->nonfinite_f32(be, flag, dv, big);
        cmp(m, "nonfinite_f32 clean", down_f32(be, flag, 1), &q, 1, 0);
        v[77777] = NAN;
        be->to_device(be, dv, v, big * 4);
        be->nonfinite_f32(be, flag, dv, big);
        cmp(m, "nonfinite_f32 nan", down_f32(be, flag, 1), &one, 1, 0);
        v[77777] = 1.f;
        v[big - 1] = -INFINITY;
        be->to_device(be, dv, v, big * 4);
        be->to_device(be, flag, &q, 4);
        be->nonfinite_f32(be, flag, dv, big);
        cmp(m, "nonfinite_f32 inf", down_f32(be, flag, 1), &one, 1, 0);
        free(x), free(xr), free(y), free(s), free(v);
        dev_free_all();
    }
}

int main(void) {
    if (gpu_setup("test_cuda_backend_ops")) return 1;
    RUN(test_memory);
    RUN(test_casts);
    gpu_teardown();
    TEST_END();
}
