// test_cuda_loss.c — cuda/cuda_loss.cu (cross_entropy: the loss and the gradient written in
// place) against the CPU backend (the spec), in fp32 and bf16 modes.
// Outputs are poisoned (0xFF bytes) first; errors are relative L2 (test.h rel_l2). The table of
// the worst error per check is printed at the end. Needs a GPU: without one it fails (`make test`
// also runs it on the CPU, built against tests/host_cuda).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"
#include "op_cases.h"  // CE_CASES: the GPU rows run here

// ---- cross-entropy ---------------------------------------------------------------------------

static void test_cross_entropy(void) {
    // the GPU rows of CE_CASES: in bf16, V = 32000 (Mixtral) takes the packed kernel (8 chunks
    // per thread, two exponentials each; 301 rows: more rows than SMs, ignored rows inside), 64 (a
    // DNA-sized vocabulary) the register-resident one with 1 chunk, 997 the scalar one
    FOR_MODES for (int c = 0; c < N_CASES(CE_CASES); c++) {
        Backend* be = m->gpu;
        if (!(CE_CASES[c].where & CASE_GPU)) continue;
        const int n = CE_CASES[c].n, V = CE_CASES[c].V;
        const size_t nv = (size_t)n * V;
        int32_t* tg = xmalloc(4 * n);
        for (int i = 0; i < n; i++) tg[i] = (int)(rng_u64(&g_rng) % V);
        tg[1] = -1;
        tg[n - 1] = -1;  // ignored rows
        if (n > 200) tg[133] = tg[200] = -1;
        float* lg = randn_act(m, nv, 3.f);
        int32_t* dt = up_i32(be, tg, n);
        for (int grad = 0; grad < 2; grad++) {
            const float gs = grad ? 1.0f / (n - 2) : 0.f;
            float* r = dupf(lg, nv);
            float loss = 0.5f;
            g_cpu->cross_entropy(g_cpu, r, &loss, tg, n, V, gs);
            void* d = up_act(be, lg, nv);
            const float init = 0.5f;
            float* dl = up_f32(be, &init, 1);
            be->cross_entropy(be, d, dl, dt, n, V, gs);
            cmp(m, grad ? "cross_entropy loss" : "cross_entropy loss (no grad)", down_f32(be, dl, 1), &loss, 1,
                TOL(TOL_F32, TOL_FP32_OUT));
            if (grad) cmp(m, "cross_entropy dlogits", down_act(be, d, nv), r, nv, TOL(TOL_F32, TOL_BF16_OUT));
            else cmp(m, "cross_entropy logits untouched", down_act(be, d, nv), lg, nv, 0);
            free(r);
        }
        free(tg), free(lg);
        dev_free_all();
    }
}

int main(void) {
    if (gpu_setup("test_cuda_loss")) return 1;
    RUN(test_cross_entropy);
    gpu_teardown();
    TEST_END();
}
