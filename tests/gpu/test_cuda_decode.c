// test_cuda_decode.c — cuda/cuda_decode.cu (rope_qkv_at, kv_append, attn_decode: the KV-cache ops
// of `moetrain generate`) against the CPU backend (the spec), in fp32 and bf16 modes: batch 1 over
// a long cache (the split over cache positions), several sequences at different positions with
// blocks of new rows (prefill-like, causal within the block), GQA and plain MHA, D from 16 to 128.
// Outputs are poisoned (0xFF bytes) first; errors are relative L2. Needs a GPU.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"
#include "op_cases.h"  // DECODE_CASES: the GPU rows run here

static void test_decode_ops(void) {
    FOR_MODES for (int c = 0; c < N_CASES(DECODE_CASES); c++) {
        Backend* be = m->gpu;
        const DecodeCase* k = &DECODE_CASES[c];
        if (!(k->where & CASE_GPU)) continue;
        const int B = k->B, n = k->n, Hq = k->Hq, Hkv = k->Hkv, D = k->D, Tmax = k->Tmax;
        const size_t rows = (size_t)B * n, nqkv = rows * (Hq + 2 * Hkv) * D, nq = rows * Hq * D,
                     nk = rows * Hkv * D, ncache = (size_t)B * Hkv * Tmax * D;
        int32_t* dpos = up_i32(be, k->pos, B);
        // rope_qkv_at
        float* qkv = randn_act(m, nqkv, 1.f);
        float *q = xmalloc(sizeof(float) * nq), *kk = xmalloc(sizeof(float) * nk), *v = xmalloc(sizeof(float) * nk);
        void *dq = poison_act(be, nq), *dk = poison_act(be, nk), *dv = poison_act(be, nk);
        g_cpu->rope_qkv_at(g_cpu, qkv, q, kk, v, k->pos, B, n, Hq, Hkv, D, 1e6f);
        be->rope_qkv_at(be, up_act(be, qkv, nqkv), dq, dk, dv, dpos, B, n, Hq, Hkv, D, 1e6f);
        cmp(m, "rope_qkv_at q", down_act(be, dq, nq), q, nq, TOL(TOL_F32, TOL_BF16_OUT));
        cmp(m, "rope_qkv_at k", down_act(be, dk, nk), kk, nk, TOL(TOL_F32, TOL_BF16_OUT));
        cmp(m, "rope_qkv_at v (copied)", down_act(be, dv, nk), v, nk, 0);
        // kv_append over random caches (rows past Tmax dropped)
        float* kc = randn_act(m, ncache, 1.f);
        float* vc = randn_act(m, ncache, 1.f);
        float* knew = randn_act(m, nk, 1.f);
        float* vnew = randn_act(m, nk, 1.f);
        void *dkc = up_act(be, kc, ncache), *dvc = up_act(be, vc, ncache);
        g_cpu->kv_append(g_cpu, kc, vc, knew, vnew, k->pos, B, n, Hkv, D, Tmax);
        be->kv_append(be, dkc, dvc, up_act(be, knew, nk), up_act(be, vnew, nk), dpos, B, n, Hkv, D, Tmax);
        cmp(m, "kv_append k cache", down_act(be, dkc, ncache), kc, ncache, 0);
        cmp(m, "kv_append v cache", down_act(be, dvc, ncache), vc, ncache, 0);
        // attn_decode over those caches (positions with pos + n ≤ Tmax)
        int32_t pos2[3];
        for (int b = 0; b < B; b++) pos2[b] = k->pos[b] + n <= Tmax ? k->pos[b] : Tmax - n;
        int32_t* dpos2 = up_i32(be, pos2, B);
        float* qq = randn_act(m, nq, 1.f);
        float* out = xmalloc(sizeof(float) * nq);
        void* dout = poison_act(be, nq);
        g_cpu->attn_decode(g_cpu, out, qq, kc, vc, pos2, B, n, Hq, Hkv, D, Tmax);
        be->attn_decode(be, dout, up_act(be, qq, nq), dkc, dvc, dpos2, B, n, Hq, Hkv, D, Tmax);
        cmp(m, "attn_decode", down_act(be, dout, nq), out, nq, TOL(TOL_F32, TOL_BF16_OUT));
        free(qkv), free(q), free(kk), free(v), free(kc), free(vc), free(knew), free(vnew), free(qq), free(out);
        dev_free_all();
    }
}

int main(void) {
    if (gpu_setup("test_cuda_decode")) return 1;
    RUN(test_decode_ops);
    gpu_teardown();
    TEST_END();
}
