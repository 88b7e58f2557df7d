// test_cuda_attn.c — the CUDA backend's causal GQA attention (cuda/cuda_attn*.cu) against the CPU
// backend, in fp32 and bf16 modes: forward (out, lse) and backward (dq, dk, dv) on the default
// kernels and on the mma.sync ones, the backward without a workspace, with one for every pair's dS
// and chunked, and rerun for the same bits. `test_cuda_attn --long` adds a T = 2,048 case.
// Tolerances: gpu_check.h.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"
#include "op_cases.h"  // ATTN_CASES: the GPU rows run here, CASE_GPU_LONG ones with --long

// cuda_attn_fwd_ws.cu, cuda_attn_bwd_ws.cu: a wait of the kernel gave up (and clears the flag)
int cuda_attn_fwd_ws_stalled(void);
int cuda_attn_bwd_ws_stalled(void);
// cuda_attn_bwd_wg.cu: the stored-dS backward whenever one pair fits (returns the previous setting)
int cuda_attn_ds_force(Backend* be, int on);

static int g_long;  // --long: the CASE_GPU_LONG rows too

// Each case runs on the default kernels (gpu.attention = auto: the wgmma ones on an H200 with the
// sm_90a build; elsewhere the op falls back to mma.sync and the case runs there) and on the
// mma.sync kernels (gpu.attention = mma); the labels say which.
static void attention_cases(const char* path) {
    FOR_MODES for (int c = 0; c < N_CASES(ATTN_CASES); c++) {
        Backend* be = m->gpu;
        const AttnCase* ac = &ATTN_CASES[c];
        if (!(ac->where & CASE_GPU) && !(g_long && (ac->where & CASE_GPU_LONG))) continue;
        const int B = ac->B, T = ac->T, Hq = ac->Hq, Hkv = ac->Hkv, D = ac->D;
        const size_t nq = (size_t)B * T * Hq * D, nk = (size_t)B * T * Hkv * D, nl = (size_t)B * Hq * T;
        float* q = randn_act(m, nq, ac->scale);  // the scale on q alone (k stays N(0, 1))
        float* k = randn_act(m, nk, 1.f);
        float* v = randn_act(m, nk, 1.f);
        float *o = xmalloc(4 * nq), *l = xmalloc(4 * nl);
        g_cpu->attn_fwd(g_cpu, o, l, q, k, v, B, T, Hq, Hkv, D, NULL);
        void *dq_ = up_act(be, q, nq), *dk_ = up_act(be, k, nk), *dv_ = up_act(be, v, nk);
        void* dO = poison_act(be, nq);
        float* dL = poison(be, 4 * nl);
        be->attn_fwd(be, dO, dL, dq_, dk_, dv_, B, T, Hq, Hkv, D, NULL);
        char lab[64];
        EXPECT(!cuda_attn_fwd_ws_stalled(), "%s attn_fwd D=%d T=%d: an mbarrier wait gave up", path, D, T);
        float* got_o = down_act(be, dO, nq);
        float* got_l = down_f32(be, dL, nl);
        snprintf(lab, sizeof lab, "%s attn_fwd out D=%d T=%d", path, D, T);
        cmp(m, lab, got_o, o, nq, TOL(TOL_F32, TOL_ATTN_FWD));
        snprintf(lab, sizeof lab, "%s attn_fwd lse D=%d T=%d", path, D, T);
        cmp(m, lab, got_l, l, nl, TOL(TOL_F32, TOL_FP32_OUT));
        // backward from the CPU's forward (out rounded to the act dtype: both sides see it)
        float* orr = act_in(m, o, nq);
        float* g = randn_act(m, nq, 1.f);
        float *rq = xmalloc(4 * nq), *rk = xmalloc(4 * nk), *rv = xmalloc(4 * nk);
        g_cpu->attn_bwd(g_cpu, rq, rk, rv, g, orr, l, q, k, v, B, T, Hq, Hkv, D, NULL, 0, NULL);
        void *gq = poison_act(be, nq), *gk = poison_act(be, nk), *gv = poison_act(be, nk);
        void *d_g = up_act(be, g, nq), *d_o = up_act(be, orr, nq);
        float* d_l = up_f32(be, l, nl);
        // Three ways, each against the CPU and rerun for the same bits: no workspace (dq
        // recomputes S and dP), a workspace for every pair's dS (one chunk), and one for 1.5
        // pairs with the stored-dS path forced (cuda_attn_ds_force: one pair per chunk, the chunk
        // offsets). The stored-dS kernels run only on the wgmma path; elsewhere the workspace is
        // ignored.
        const size_t nt = (size_t)(T + 63) / 64, pair = (size_t)(Hq / Hkv) * (nt * (nt + 1) / 2) * 64 * 64 * 2;
        const struct { const char* name; size_t bytes; int force; } wv[] = {
            {"recompute", 0, 0}, {"ds", pair * B * Hkv, 0}, {"ds-chunked", pair + pair / 2, 1}};
        for (int w = 0; w < 3; w++) {
            void* ws = wv[w].bytes ? dev_alloc(be, wv[w].bytes) : NULL;
            const int was_forced = cuda_attn_ds_force(be, wv[w].force);
            be->attn_bwd(be, gq, gk, gv, d_g, d_o, d_l, dq_, dk_, dv_, B, T, Hq, Hkv, D, ws, wv[w].bytes, NULL);
            EXPECT(!cuda_attn_bwd_ws_stalled(), "%s/%s attn_bwd D=%d T=%d: an mbarrier wait gave up", path,
                   wv[w].name, D, T);
            snprintf(lab, sizeof lab, "%s/%s attn_bwd dq D=%d T=%d", path, wv[w].name, D, T);
            float* got_q = down_act(be, gq, nq);
            float* got_q_copy = dupf(got_q, nq);
            cmp(m, lab, got_q, rq, nq, TOL(TOL_F32, TOL_ATTN_BWD));
            snprintf(lab, sizeof lab, "%s/%s attn_bwd dk D=%d T=%d", path, wv[w].name, D, T);
            float* got_k = down_act(be, gk, nk);
            float* got_k_copy = dupf(got_k, nk);
            cmp(m, lab, got_k, rk, nk, TOL(TOL_F32, TOL_ATTN_BWD));
            snprintf(lab, sizeof lab, "%s/%s attn_bwd dv D=%d T=%d", path, wv[w].name, D, T);
            float* got_v = down_act(be, gv, nk);
            float* got_v_copy = dupf(got_v, nk);
            cmp(m, lab, got_v, rv, nk, TOL(TOL_F32, TOL_ATTN_BWD));
            // again, over poisoned outputs: bit-identical (no atomics anywhere)
            gq = poison_act(be, nq), gk = poison_act(be, nk);
            be->attn_bwd(be, gq, gk, gv, d_g, d_o, d_l, dq_, dk_, dv_, B, T, Hq, Hkv, D, ws, wv[w].bytes, NULL);
            snprintf(lab, sizeof lab, "%s/%s attn_bwd deterministic dq", path, wv[w].name);
            cmp_bits(m, lab, got_q_copy, down_act(be, gq, nq), nq);
            snprintf(lab, sizeof lab, "%s/%s attn_bwd deterministic dk", path, wv[w].name);
            cmp_bits(m, lab, got_k_copy, down_act(be, gk, nk), nk);
            cuda_attn_ds_force(be, was_forced);
            free(got_v_copy);
        }
        free(q), free(k), free(v), free(o), free(l), free(orr), free(g), free(rq), free(rk), free(rv);
        dev_free_all();
    }
}

static void test_attention(void) { attention_cases("wgmma"); }

static void test_attention_mma(void) {
    const GpuConfig mma = {.attention = GPU_ATTN_MMA};
    Mode saved[2];
    gpu_modes_with(&mma, saved);
    attention_cases("mma");
    gpu_modes_restore(saved);
}

int main(int argc, char** argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--long")) {
            g_long = 1;
        } else {
            fprintf(stderr, "usage: test_cuda_attn [--long]\n");
            return 2;
        }
    }
    if (gpu_setup("test_cuda_attn")) return 1;
    RUN(test_attention);
    RUN(test_attention_mma);
    gpu_teardown();
    TEST_END();
}
