// test_cuda_router.c — cuda/cuda_router.cu (router forward and backward: probabilities, top-k,
// statistics, z-loss) against the CPU backend (the spec), in fp32 and bf16 modes.
// Outputs are poisoned (0xFF bytes) first; errors are relative L2 (test.h rel_l2). The table of
// the worst error per check is printed at the end. Needs a GPU: without one it fails (`make test`
// also runs it on the CPU, built against tests/host_cuda).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"
#include "op_cases.h"  // ROUTER_CASES: the GPU rows run here

// ---- router ----------------------------------------------------------------------------------

static void test_router(void) {
    FOR_MODES for (int c = 0; c < N_CASES(ROUTER_CASES); c++) {
        Backend* be = m->gpu;
        if (!(ROUTER_CASES[c].where & CASE_GPU)) continue;
        const int N = ROUTER_CASES[c].N, E = ROUTER_CASES[c].E, k = ROUTER_CASES[c].k;
        const size_t ne = (size_t)N * E, nk = (size_t)N * k;
        float* lg = randn(ne, 2.f);
        float *p = xmalloc(4 * ne), *w = xmalloc(4 * nk);
        int32_t* idx = xmalloc(4 * nk);
        float* st = randu(2 * E, 1.f, 3.f);
        for (int e = 0; e < E; e++) st[e] = (float)(e % 5);  // counts part: integers
        float z = 2.f;
        float* dst = up_f32(be, st, 2 * E);
        float* dz = up_f32(be, &z, 1);
        g_cpu->router_fwd(g_cpu, p, idx, w, st, &z, lg, N, E, k);
        float* dl = up_f32(be, lg, ne);
        float *dp = poison(be, 4 * ne), *dw = poison(be, 4 * nk);
        int32_t* di = poison(be, 4 * nk);
        be->router_fwd(be, dp, di, dw, dst, dz, dl, N, E, k);
        cmp(m, "router_fwd probs", down_f32(be, dp, ne), p, ne, TOL_F32);
        cmp_i32(m, "router_fwd topk_idx", down_i32(be, di, nk), idx, nk);
        cmp(m, "router_fwd topk_w", down_f32(be, dw, nk), w, nk, TOL_F32);
        cmp(m, "router_fwd stats", down_f32(be, dst, 2 * E), st, 2 * E, TOL_F32);
        cmp(m, "router_fwd zsum", down_f32(be, dz, 1), &z, 1, TOL_F32);

        // backward from the CPU's forward outputs
        float* dtw = randn(nk, 1.f);
        float* aux = randn(E, 0.1f);
        float* rdl = xmalloc(4 * ne);
        float *d_p = up_f32(be, p, ne), *d_w = up_f32(be, w, nk), *d_dtw = up_f32(be, dtw, nk);
        float* d_aux = up_f32(be, aux, E);
        int32_t* d_i = up_i32(be, idx, nk);
        const struct { int tw, ax; float zg; const char* label; } v[] = {
            {1, 1, 0.01f, "router_bwd all"}, {0, 1, 0.01f, "router_bwd aux+z"}, {1, 0, 0.f, "router_bwd topk only"}};
        for (int j = 0; j < 3; j++) {
            g_cpu->router_bwd(g_cpu, rdl, v[j].tw ? dtw : NULL, v[j].ax ? aux : NULL, v[j].zg, p, idx, w, lg, N, E, k);
            float* out = poison(be, 4 * ne);
            be->router_bwd(be, out, v[j].tw ? d_dtw : NULL, v[j].ax ? d_aux : NULL, v[j].zg, d_p, d_i, d_w, dl, N, E,
                           k);
            cmp(m, v[j].label, down_f32(be, out, ne), rdl, ne, TOL_F32);
        }
        free(lg), free(p), free(w), free(idx), free(st), free(dtw), free(aux), free(rdl);
        dev_free_all();
    }
}

int main(void) {
    if (gpu_setup("test_cuda_router")) return 1;
    RUN(test_router);
    gpu_teardown();
    TEST_END();
}
