// test_cuda_rope.c — cuda/cuda_rope.cu (rope_qkv, both directions) against the CPU backend
// (the spec), in fp32 and bf16 modes.
// Outputs are poisoned (0xFF bytes) first; errors are relative L2 (test.h rel_l2). The table of
// the worst error per check is printed at the end. Needs a GPU: without one it fails (`make test`
// also runs it on the CPU, built against tests/host_cuda).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"
#include "op_cases.h"  // ROPE_CASES: the GPU rows run here

static void test_rope(void) {
    // the fused projection's rows (Hq + 2·Hkv heads) against planar q, k, v, both directions;
    // bf16: D = 16, 128, 64 take the 8-pair kernel, D = 12 the scalar one; Hkv = 0: q alone
    FOR_MODES for (int c = 0; c < N_CASES(ROPE_CASES); c++) {
        Backend* be = m->gpu;
        const RopeCase* rc = &ROPE_CASES[c];
        if (!(rc->where & CASE_GPU)) continue;
        const int B = rc->B, T = rc->T, Hq = rc->Hq, Hkv = rc->Hkv, D = rc->D;
        const size_t rows = (size_t)B * T, nq = rows * Hq * D, nk = rows * Hkv * D, n = nq + 2 * nk;
        for (int inv = 0; inv < 2; inv++) {
            // the side read, rounded to the act dtype; the side written poisoned on the device
            float* pk = randn_act(m, n, 1.f);
            float *q = randn_act(m, nq, 1.f), *k = nk ? randn_act(m, nk, 1.f) : NULL;
            float* v = nk ? randn_act(m, nk, 1.f) : NULL;
            void* dpk = inv ? poison_act(be, n) : up_act(be, pk, n);
            void* dq = inv ? up_act(be, q, nq) : poison_act(be, nq);
            void* dk = nk ? (inv ? up_act(be, k, nk) : poison_act(be, nk)) : NULL;
            void* dv = nk ? (inv ? up_act(be, v, nk) : poison_act(be, nk)) : NULL;
            g_cpu->rope_qkv(g_cpu, pk, q, k, v, B, T, Hq, Hkv, D, rc->theta, inv, NULL);
            be->rope_qkv(be, dpk, dq, dk, dv, B, T, Hq, Hkv, D, rc->theta, inv, NULL);
            if (inv) {
                cmp(m, "rope_qkv inverse (packed rows)", down_act(be, dpk, n), pk, n, TOL(TOL_F32, TOL_BF16_OUT));
            } else {
                cmp(m, "rope_qkv q", down_act(be, dq, nq), q, nq, TOL(TOL_F32, TOL_BF16_OUT));
                if (nk) cmp(m, "rope_qkv k", down_act(be, dk, nk), k, nk, TOL(TOL_F32, TOL_BF16_OUT));
                if (nk) cmp(m, "rope_qkv v (copied)", down_act(be, dv, nk), v, nk, 0);
            }
            free(pk), free(q), free(k), free(v);
        }
        dev_free_all();
    }
}

int main(void) {
    if (gpu_setup("test_cuda_rope")) return 1;
    RUN(test_rope);
    gpu_teardown();
    TEST_END();
}
