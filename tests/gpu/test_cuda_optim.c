// test_cuda_optim.c — the CUDA optimizer ops against the CPU spec: adamw (fp32 masters, the act
// copy, unaligned pointers), and the split fp32 masters: split_pack / split_unpack on every low
// half, adamw_split bit for bit against the CUDA adamw (the same arithmetic), the compute weight
// the tie-away rounding of the master.
// Needs a GPU: without one it fails (`make test` also runs it on the CPU, built against
// tests/host_cuda).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"
#include "op_cases.h"  // ADAMW_CASES, ADAMW_SPLIT_CASES: the GPU rows run here

static void test_adamw(void) {
    const AdamWDesc d = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .wd = 0.1f, .grad_scale = 0.5f,
                         .step = 3};
    int alias_row = 0;  // fp32, the first GPU row: param aliases master
    while (!(ADAMW_CASES[alias_row].where & CASE_GPU)) alias_row++;
    FOR_MODES for (int c = 0; c < N_CASES(ADAMW_CASES); c++) for (int off = 0; off < 2; off++) {  // off = 1: unaligned pointers
        Backend* be = m->gpu;
        if (!(ADAMW_CASES[c].where & CASE_GPU)) continue;
        const size_t n = ADAMW_CASES[c].n - off;
        float *p0 = randn(n, 1.f), *m0 = randn(n, 0.01f), *v0 = randu(n, 1e-6f, 1e-4f), *g = randn(n, 0.01f);
        float *p = dupf(p0, n), *mm = dupf(m0, n), *vv = dupf(v0, n);
        g_cpu->adamw(g_cpu, &d, p, p, mm, vv, g, n);
        // device copies at an offset of `off` floats (off = 1 defeats the 16-byte vector path)
        float *dp = (float*)dev_alloc(be, 4 * (n + 1)) + off, *dm = (float*)dev_alloc(be, 4 * (n + 1)) + off;
        float *dv = (float*)dev_alloc(be, 4 * (n + 1)) + off, *dg = (float*)dev_alloc(be, 4 * (n + 1)) + off;
        be->to_device(be, dp, p0, 4 * n), be->to_device(be, dm, m0, 4 * n);
        be->to_device(be, dv, v0, 4 * n), be->to_device(be, dg, g, 4 * n);
        void* param = m->bf16 || c != alias_row ? poison_act(be, n) : dp;
        be->adamw(be, &d, dp, param, dm, dv, dg, n);
        float* gp = down_f32(be, dp, n);
        float *d_ref = xmalloc(4 * n), *d_got = xmalloc(4 * n);
        for (size_t i = 0; i < n; i++) d_ref[i] = p[i] - p0[i], d_got[i] = gp[i] - p0[i];
        cmp(m, "adamw step (master_new - master)", d_got, d_ref, n, TOL_ADAM_STEP);  // frees d_got
        free(d_ref);
        cmp(m, "adamw m", down_f32(be, dm, n), mm, n, TOL_F32);
        cmp(m, "adamw v", down_f32(be, dv, n), vv, n, TOL_F32);
        if (param != dp) {  // the act copy is the new master in the act dtype
            float* pr = act_in(m, gp, n);
            cmp(m, "adamw param copy", down_act(be, param, n), pr, n, 0);
            free(pr);
        }
        free(gp), free(p0), free(m0), free(v0), free(g), free(p), free(mm), free(vv);
        dev_free_all();
    }
}

// ---- split fp32 masters ------------------------------------------------------------------------


// split_pack / split_unpack on the GPU against the CPU spec, bit for bit: every low half under
// high halves of every kind (±0, denormals, odd and even truncations, the largest finite whose
// upper half rounds to the inf pattern, inf and NaN patterns), at element offsets 0 (16-byte
// vectors from the start), 3 (a scalar head of 5) and 1 with fp32 misaligned against w (scalar
// only); rem = NULL writes w alone. Outputs poisoned.
static void test_split_pack(void) {
    static const uint16_t his[] = {0x0000, 0x0001, 0x007f, 0x0080, 0x3f80, 0x3f81, 0x4049, 0x7f7e, 0x7f7f, 0x8000,
                                   0x8001, 0x807f, 0xbf80, 0xbf81, 0xc2f7, 0xff7e, 0xff7f, 0x7f80, 0x7fc0, 0xffff};
    enum { NH = sizeof his / sizeof his[0], L = 65536 };
    const size_t n = (size_t)NH * L - 3;  // not a multiple of 8
    float* x = xmalloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) x[i] = float_of((uint32_t)his[i / L] << 16 | (uint32_t)(i % L));
    uint16_t* w = xmalloc(2 * n);
    int16_t* rem = xmalloc(2 * n);
    g_cpu->split_pack(g_cpu, w, rem, x, n);
    const int offs[][2] = {{0, 0}, {3, 3}, {0, 1}};  // element offsets of (w, rem) and of x
    FOR_MODES for (int c = 0; c < 3; c++) {
        Backend* be = m->gpu;
        const int o16 = offs[c][0], o32 = offs[c][1];
        float* dx = (float*)dev_alloc(be, 4 * (n + 8)) + o32;
        be->to_device(be, dx, x, 4 * n);
        uint16_t* dw = (uint16_t*)poison(be, 2 * (n + 8)) + o16;
        int16_t* dr = (int16_t*)poison(be, 2 * (n + 8)) + o16;
        be->split_pack(be, dw, dr, dx, n);
        cmp_u16(m, "split_pack w", down_u16(be, dw, n), w, n);
        cmp_u16(m, "split_pack rem", down_u16(be, dr, n), (const uint16_t*)rem, n);
        uint16_t* dw2 = (uint16_t*)poison(be, 2 * (n + 8)) + o16;
        be->split_pack(be, dw2, NULL, dx, n);
        cmp_u16(m, "split_pack w (rem NULL)", down_u16(be, dw2, n), w, n);
        float* back = (float*)poison(be, 4 * (n + 8)) + o32;
        be->split_unpack(be, back, dw, dr, n);
        cmp_exact(m, "split_unpack (round trip)", "bits", down_f32(be, back, n), x, n);
        dev_free_all();
    }
    free(x), free(w), free(rem);
}

// adamw_split against the CUDA adamw with an fp32 master (param: a bf16 copy in bf16 mode, the
// master itself in fp32 mode) on the same inputs over 4 consecutive steps: the unpacked master,
// m and v bit for bit (the same adam1 arithmetic in both kernels); w the tie-away rounding of the
// master, and adamw's bf16 copy (round-to-nearest-even) equal to w except at ties with even hi.
// The masters start with ties, denormals, ±0 and values whose w is the inf pattern; lr = 0 in
// the last variant keeps the ties through the steps (p·1 − 0 = p). Sizes: ADAMW_SPLIT_CASES (tails);
// element offsets of (w, rem) and of the fp32 arrays: (0, 0) vectors from the start, (3, 3) and
// (1, 1) scalar heads of 5 and 7 before them, (0, 1) fp32 misaligned against w: the scalar
// kernel. Outputs poisoned.
static void test_adamw_split(void) {
    const int offs[][2] = {{0, 0}, {3, 3}, {1, 1}, {0, 1}};  // element offsets of (w, rem) and of fp32
    FOR_MODES for (int c = 0; c < N_CASES(ADAMW_SPLIT_CASES); c++) for (int oc = 0; oc < 4; oc++) for (int variant = 0; variant < 2; variant++) {
        Backend* be = m->gpu;
        if (!(ADAMW_SPLIT_CASES[c].where & CASE_GPU)) continue;
        const size_t n = ADAMW_SPLIT_CASES[c].n;
        const int off = offs[oc][1], o16 = offs[oc][0];
        AdamWDesc d = {.lr = variant ? 0.0f : 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .wd = 0.1f,
                       .grad_scale = 0.5f};
        float *p0 = randn(n, 1.f), *m0 = randn(n, 0.01f), *v0 = randu(n, 1e-6f, 1e-4f);
        for (size_t i = 0; i < n; i += 7) p0[i] = float_of((bits_of(p0[i]) & 0xffff0000u) | 0x8000u);  // ties
        for (size_t i = 1; i < n; i += 50)  // denormals of both signs
            p0[i] = float_of((i % 100 == 1 ? 0x80000000u : 0) | (uint32_t)(i * 977 % 0x7fffff));
        p0[2] = 0.f, p0[3] = -0.f, p0[4] = float_of(0x7f7fc123u), p0[5] = float_of(0xff7f8000u);
        float *dp = (float*)dev_alloc(be, 4 * (n + 8)) + off, *dm = (float*)dev_alloc(be, 4 * (n + 8)) + off;
        float *dv = (float*)dev_alloc(be, 4 * (n + 8)) + off, *dg = (float*)dev_alloc(be, 4 * (n + 8)) + off;
        float *dm2 = (float*)dev_alloc(be, 4 * (n + 8)) + off, *dv2 = (float*)dev_alloc(be, 4 * (n + 8)) + off;
        uint16_t* dw = (uint16_t*)poison(be, 2 * (n + 8)) + o16;
        int16_t* dr = (int16_t*)poison(be, 2 * (n + 8)) + o16;
        be->to_device(be, dp, p0, 4 * n), be->to_device(be, dm, m0, 4 * n), be->to_device(be, dv, v0, 4 * n);
        be->to_device(be, dm2, m0, 4 * n), be->to_device(be, dv2, v0, 4 * n);
        be->split_pack(be, dw, dr, dp, n);
        void* param = m->bf16 ? poison_act(be, n) : dp;
        float* back = (float*)dev_alloc(be, 4 * (n + 8)) + off;
        int ties0 = 0, ties = 0;
        for (size_t i = 0; i < n; i++) ties0 += (bits_of(p0[i]) & 0xffffu) == 0x8000u;
        for (int step = 1; step <= 4; step++) {
            float* g = randn(n, 0.01f);
            be->to_device(be, dg, g, 4 * n);
            d.step = step;
            be->adamw(be, &d, dp, param, dm, dv, dg, n);
            be->adamw_split(be, &d, dw, dr, dm2, dv2, dg, n);
            be->to_device(be, back, g, 4 * n);  // overwritten below: a stale value cannot pass
            be->split_unpack(be, back, dw, dr, n);
            float* master = down_f32(be, dp, n);
            cmp_exact(m, "adamw_split master vs adamw", "bits", down_f32(be, back, n), master, n);
            float *mr = down_f32(be, dm, n), *vr = down_f32(be, dv, n);
            cmp_exact(m, "adamw_split m vs adamw", "bits", down_f32(be, dm2, n), mr, n);
            cmp_exact(m, "adamw_split v vs adamw", "bits", down_f32(be, dv2, n), vr, n);
            free(mr), free(vr);
            uint16_t* want = xmalloc(2 * n);
            for (size_t i = 0; i < n; i++) {
                want[i] = bf16_away(master[i]);
                ties += (bits_of(master[i]) & 0xffffu) == 0x8000u;
            }
            uint16_t* w = down_u16(be, dw, n);
            if (m->bf16) {  // adamw's copy rounds to nearest even: the same but at ties with even hi
                uint16_t* cp = down_u16(be, param, n);
                size_t other = 0;
                for (size_t i = 0; i < n; i++) {
                    const uint32_t u = bits_of(master[i]);
                    const int even_tie = (u & 0xffffu) == 0x8000u && !((u >> 16) & 1);
                    other += !even_tie && cp[i] != w[i];
                    if (even_tie) cp[i] = w[i];
                }
                record("adamw_split w vs adamw's bf16 copy", 1, (double)other, 0);
                EXPECT(other == 0, "adamw_split [%s]: w differs from adamw's bf16 copy in %zu non-tie elements", m->name,
                       other);
                free(cp);
            }
            cmp_u16(m, "adamw_split w (tie-away rounding)", w, want, n);
            free(want), free(master), free(g);
        }
        if (variant)
            EXPECT(ties0 > 100 && ties == 4 * ties0, "lr = 0 [%s]: the %d ties kept: %d over 4 steps", m->name, ties0, ties);
        free(p0), free(m0), free(v0);
        dev_free_all();
    }
}

// Act-dtype gradients (precision.expert_grad=bf16, grad_act = 1): adamw and adamw_split reading
// the gradient in the act dtype give exactly the bits they give on the same values in fp32 (the
// gradients are drawn as act values, so the fp32 copy holds what the act buffer holds). n = 4101
// (a tail); element offsets 0 (vectors), 1 (adamw: the scalar kernel; adamw_split: a head) and 3.
static void test_adamw_act_grad(void) {
    const size_t n = 4101, pad = n + 8;
    const int offs[] = {0, 1, 3};
    FOR_MODES for (int oc = 0; oc < 3; oc++) for (int split = 0; split < 2; split++) {
        Backend* be = m->gpu;
        const int off = offs[oc];
        float *p0 = randn(pad, 1.f), *m0 = randn(pad, 0.01f), *v0 = randu(pad, 1e-6f, 1e-4f), *g0 = randn(pad, 0.01f);
        float* g = act_in(m, g0, pad);
        float *out[2][4] = {{0}};  // [fp32 grad, act grad][master, m, v, act copy]
        for (int k = 0; k < 2; k++) {
            const AdamWDesc d = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .wd = 0.1f, .grad_scale = 0.5f,
                                 .step = 3, .grad_act = k};
            float *dp = up_f32(be, p0, pad) + off, *dm = up_f32(be, m0, pad) + off, *dv = up_f32(be, v0, pad) + off;
            const void* dg = k ? (const void*)((char*)up_act(be, g, pad) + off * dtype_size(be->act_dtype))
                               : (const void*)(up_f32(be, g, pad) + off);
            if (split) {
                uint16_t* dw = (uint16_t*)poison(be, 2 * pad) + off;
                int16_t* dr = (int16_t*)poison(be, 2 * pad) + off;
                be->split_pack(be, dw, dr, dp, n);
                be->adamw_split(be, &d, dw, dr, dm, dv, dg, n);
                be->split_unpack(be, dp, dw, dr, n);  // the master (w is its high half)
            } else {
                void* param = poison_act(be, n);
                be->adamw(be, &d, dp, param, dm, dv, dg, n);
                out[k][3] = down_act(be, param, n);
            }
            out[k][0] = down_f32(be, dp, n), out[k][1] = down_f32(be, dm, n), out[k][2] = down_f32(be, dv, n);
        }
        const char* what = split ? "adamw_split, act grad vs fp32 grad" : "adamw, act grad vs fp32 grad";
        float* moved = out[1][0];
        size_t changed = 0;
        for (size_t i = 0; i < n; i++) changed += moved[i] != p0[off + i];
        EXPECT(changed > n / 2, "%s [%s]: the step moved only %zu of %zu masters", what, m->name, changed, n);
        static const char* const names[4] = {"master", "m", "v", "act copy"};
        for (int j = 0; j < (split ? 3 : 4); j++) {
            cmp_exact(m, what, names[j], out[1][j], out[0][j], n);  // frees out[1][j]
            free(out[0][j]);
        }
        free(p0), free(m0), free(v0), free(g0), free(g);
        dev_free_all();
    }
}

int main(void) {
    if (gpu_setup("test_cuda_optim")) return 1;
    RUN(test_adamw);
    RUN(test_split_pack);
    RUN(test_adamw_split);
    RUN(test_adamw_act_grad);
    gpu_teardown();
    TEST_END();
}
