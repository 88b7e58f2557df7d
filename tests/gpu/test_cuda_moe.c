// test_cuda_moe.c — cuda/cuda_moe.cu against the CPU backend (the spec), in fp32 and bf16
// modes: the SwiGLU forward and backward, moe_index (the expert-major order, an expert with no
// rows), the permutations and their gradients.
// Outputs are poisoned (0xFF bytes) first; errors are relative L2 (test.h rel_l2). The table of
// the worst error per check is printed at the end. Needs a GPU: without one it fails (`make test`
// also runs it on the CPU, built against tests/host_cuda).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"
#include "op_cases.h"  // SWIGLU_CASES, MOE_INDEX_CASES, PERMUTE_CASES: the GPU rows run here

// ---- SwiGLU --------------------------------------------------------------------------------

static void test_swiglu(void) {
    // the GPU rows of SWIGLU_CASES; F % 8 == 0 takes the vectorised bf16 forward kernel
    FOR_MODES for (int c = 0; c < N_CASES(SWIGLU_CASES); c++) {
        Backend* be = m->gpu;
        if (!(SWIGLU_CASES[c].where & CASE_GPU)) continue;
        const int n = SWIGLU_CASES[c].n, F = SWIGLU_CASES[c].F;
        const size_t nf = (size_t)n * F;
        float* gu = randn_act(m, 2 * nf, 2.f);
        float* sc = randu(n, 0.1f, 1.f);
        void* dgu = up_act(be, gu, 2 * nf);
        float* dsc = up_f32(be, sc, n);
        for (int use = 0; use < 2; use++) {
            float* h = xmalloc(4 * nf);
            g_cpu->swiglu_fwd(g_cpu, h, gu, use ? sc : NULL, n, F);
            void* dh = poison_act(be, nf);
            be->swiglu_fwd(be, dh, dgu, use ? dsc : NULL, n, F);
            cmp(m, use ? "swiglu_fwd scaled" : "swiglu_fwd", down_act(be, dh, nf), h, nf, TOL(TOL_F32, TOL_BF16_OUT));
            free(h);
        }
        float* g = randn_act(m, nf, 1.f);
        void* dg = up_act(be, g, nf);
        float *rgu = xmalloc(8 * nf), *rds = xmalloc(4 * n);
        g_cpu->swiglu_bwd(g_cpu, rgu, rds, g, gu, sc, n, F);
        void* out = poison_act(be, 2 * nf);
        float* ods = poison(be, 4 * n);
        be->swiglu_bwd(be, out, ods, dg, dgu, dsc, n, F);
        cmp(m, "swiglu_bwd dgu", down_act(be, out, 2 * nf), rgu, 2 * nf, TOL(TOL_F32, TOL_BF16_OUT));
        cmp(m, "swiglu_bwd dscale", down_f32(be, ods, n), rds, n, TOL(TOL_F32, TOL_FP32_OUT));
        // no scale, no dscale, dgu aliasing gu
        g_cpu->swiglu_bwd(g_cpu, rgu, NULL, g, gu, NULL, n, F);
        void* alias = up_act(be, gu, 2 * nf);
        be->swiglu_bwd(be, alias, NULL, dg, alias, NULL, n, F);
        cmp(m, "swiglu_bwd in place, unscaled", down_act(be, alias, 2 * nf), rgu, 2 * nf, TOL(TOL_F32, TOL_BF16_OUT));
        free(gu), free(sc), free(g), free(rgu), free(rds);
        dev_free_all();
    }
}

// ---- expert-major index and permutations -----------------------------------------------------

// Random top-k rows: k distinct experts per token, never `skip` (an expert with no rows).
static int32_t* random_topk(int N, int k, int E, int skip) {
    int32_t* t = xmalloc(sizeof(int32_t) * (size_t)N * k);
    for (int n = 0; n < N; n++)
        for (int s = 0; s < k; s++) {
            int e, dup;
            do {
                e = (int)(rng_u64(&g_rng) % E);
                dup = e == skip;
                for (int j = 0; j < s; j++) dup |= t[(size_t)n * k + j] == e;
            } while (dup);
            t[(size_t)n * k + s] = e;
        }
    return t;
}

static void test_moe_index(void) {
    FOR_MODES for (int c = 0; c < N_CASES(MOE_INDEX_CASES); c++) {
        Backend* be = m->gpu;
        const MoeIndexCase* mc = &MOE_INDEX_CASES[c];
        if (!(mc->where & CASE_GPU)) continue;
        const int N = mc->N, k = mc->k, E = mc->E;
        const size_t nk = (size_t)N * k;
        int32_t* t = random_topk(N, k, E, mc->skip);
        int32_t *cnt = xmalloc(4 * E), *dest = xmalloc(4 * nk);
        g_cpu->moe_index(g_cpu, cnt, dest, t, N, k, E);
        int32_t *dc = poison(be, 4 * E), *dd = poison(be, 4 * nk);
        be->moe_index(be, dc, dd, up_i32(be, t, nk), N, k, E);
        cmp_i32(m, "moe_index counts", down_i32(be, dc, E), cnt, E);
        cmp_i32(m, "moe_index dest", down_i32(be, dd, nk), dest, nk);
        free(t), free(cnt), free(dest);
        dev_free_all();
    }
}

static void test_permute(void) {
    FOR_MODES for (int c = 0; c < N_CASES(PERMUTE_CASES); c++) {
        Backend* be = m->gpu;
        const PermuteCase* pc = &PERMUTE_CASES[c];
        if (!(pc->where & CASE_GPU)) continue;
        const int N = pc->N, k = pc->k, E = pc->E, H = pc->H;
        const size_t nk = (size_t)N * k, nh = (size_t)N * H, nkh = nk * H;
        int32_t* t = random_topk(N, k, E, 1);
        int32_t *cnt = xmalloc(4 * E), *dest = xmalloc(4 * nk);
        g_cpu->moe_index(g_cpu, cnt, dest, t, N, k, E);
        int32_t* dd = up_i32(be, dest, nk);
        float* x = randn_act(m, nh, 1.f);
        float* xp = randn_act(m, nkh, 1.f);
        void *d_x = up_act(be, x, nh), *d_xp = up_act(be, xp, nkh);
        float *r_nkh = xmalloc(4 * nkh), *r_nh = xmalloc(4 * nh);

        g_cpu->permute_fwd(g_cpu, r_nkh, x, dest, N, k, H);
        void* o = poison_act(be, nkh);
        be->permute_fwd(be, o, d_x, dd, N, k, H);
        cmp(m, "permute_fwd", down_act(be, o, nkh), r_nkh, nkh, 0);

        g_cpu->permute_bwd(g_cpu, r_nh, xp, dest, N, k, H);
        o = poison_act(be, nh);
        be->permute_bwd(be, o, d_xp, dd, N, k, H);
        cmp(m, "permute_bwd", down_act(be, o, nh), r_nh, nh, TOL(TOL_F32, TOL_BF16_SUM));

        for (int acc = 0; acc < 3; acc++) {  // no add, add = out (+=), a separate add (the residual)
            float* base = randn_act(m, nh, 1.f);
            memcpy(r_nh, base, 4 * nh);
            g_cpu->unpermute_fwd(g_cpu, r_nh, xp, dest, N, k, H, acc ? r_nh : NULL);
            o = acc == 1 ? up_act(be, base, nh) : poison_act(be, nh);
            be->unpermute_fwd(be, o, d_xp, dd, N, k, H, acc == 0 ? NULL : acc == 1 ? o : up_act(be, base, nh));
            cmp(m, acc == 0 ? "unpermute_fwd" : acc == 1 ? "unpermute_fwd (add = out)" : "unpermute_fwd (add)",
                down_act(be, o, nh), r_nh, nh, TOL(TOL_F32, TOL_BF16_SUM));
            free(base);
        }

        g_cpu->unpermute_bwd(g_cpu, r_nkh, x, dest, N, k, H);
        o = poison_act(be, nkh);
        be->unpermute_bwd(be, o, d_x, dd, N, k, H);
        cmp(m, "unpermute_bwd", down_act(be, o, nkh), r_nkh, nkh, 0);

        float* wv = randn(nk, 1.f);
        float* rw = xmalloc(4 * nk);
        float* dwv = up_f32(be, wv, nk);
        g_cpu->gather_rows_f32(g_cpu, rw, wv, dest, (int)nk);
        float* ow = poison(be, 4 * nk);
        be->gather_rows_f32(be, ow, dwv, dd, (int)nk);
        cmp(m, "gather_rows_f32", down_f32(be, ow, nk), rw, nk, 0);
        g_cpu->scatter_rows_f32(g_cpu, rw, wv, dest, (int)nk);
        ow = poison(be, 4 * nk);
        be->scatter_rows_f32(be, ow, dwv, dd, (int)nk);
        cmp(m, "scatter_rows_f32", down_f32(be, ow, nk), rw, nk, 0);
        free(t), free(cnt), free(dest), free(x), free(xp), free(r_nkh), free(r_nh), free(wv), free(rw);
        dev_free_all();
    }
}

int main(void) {
    if (gpu_setup("test_cuda_moe")) return 1;
    RUN(test_swiglu);
    RUN(test_moe_index);
    RUN(test_permute);
    gpu_teardown();
    TEST_END();
}
