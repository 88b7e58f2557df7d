// test_cuda_attn_docs.c — packed documents (data.documents) on the CUDA backend against the CPU spec:
// block-diagonal causal attention, forward and backward, for several document layouts on every
// kernel path that takes them, and RoPE with per-token positions. (Cross-entropy with ignored
// targets, the boundary mask, is test_cuda_loss's test_cross_entropy.)
//
// Which kernels run with documents (cuda_attn.cu, cuda_attn_bwd.cu), each skipping the tiles no
// row of a tile sees: bf16 at D = 128 on Hopper the warp-specialised kernels ("ws": k_attn_fwd_ws;
// with room for dS in the workspace k_attn_dkdv_ws then k_attn_dq_ws); other bf16 tensor-core head
// dims (16, 32, 64), the D = 128 backward without room for dS, and other GPUs the mma.sync kernels
// ("mma": k_attn_fwd_tc, k_attn_dq_tc, k_attn_dkdv_tc; every case runs again with
// gpu.attention = mma to cover them at D = 128); fp32 and other head dims the simple warp-per-row
// kernels ("simple"), which walk only the visible keys. Each label names the path it expects.
//
// Layouts (document lengths per window row; the last one runs to T): one document (starts all 0,
// which must give plain causal attention's bits), many short documents, lengths that are not
// multiples of any tile, boundaries exactly at the 64- and 128-row tile edges, one-token
// documents, a long document after short ones.
//
// The timing (documents against the same windows unmasked) is dev/attn_docs_bench.c.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"

int cuda_attn_ds_force(Backend* be, int on);  // cuda_attn_bwd_wg.cu (test hook)
int cuda_attn_fwd_ws_stalled(void);
int cuda_attn_bwd_ws_stalled(void);

// Window row b of doc [B·T] cut into documents of lens[0], lens[1], ... (0-terminated; the last
// runs to T).
static void docs_of(int32_t* doc, int T, const int* lens) {
    int s = 0, n = 0;
    for (int t = 0; t < T; t++) {
        if (lens[n] && t == s + lens[n]) s = t, n++;
        doc[t] = s;
    }
}

// Documents of random lengths in [lo, hi].
static void docs_random(int32_t* doc, int T, int lo, int hi) {
    int s = 0, len = lo + (int)(rng_u64(&g_rng) % (uint64_t)(hi - lo + 1));
    for (int t = 0; t < T; t++) {
        if (t == s + len) s = t, len = lo + (int)(rng_u64(&g_rng) % (uint64_t)(hi - lo + 1));
        doc[t] = s;
    }
}

// dq and dk of one-token documents are exactly 0 (a token attends to itself alone: P = 1, so
// dS = P·(dP − D) = 0, as the CPU computes it). A kernel's are what is left of dP − D after its
// own rounding (dP and D = rowsum(dO∘O) summed in other orders), so a relative error against 0 says
// nothing: got's RMS is judged against the RMS of the call's nonzero gradient dv (= dO here), the
// size a gradient that leaked across documents would have. Frees got.
static void cmp_zero(const Mode* m, const char* label, float* got, size_t n, const float* scale, size_t ns, double tol) {
    double g2 = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) g2 += isfinite(got[i]) ? (double)got[i] * got[i] : INFINITY;
    for (size_t i = 0; i < ns; i++) s2 += (double)scale[i] * scale[i];
    const double e = s2 > 0 ? sqrt((g2 / (double)n) / (s2 / (double)ns)) : INFINITY;
    record(label, m->bf16, e, tol);
    EXPECT(e <= tol, "%s [%s]: RMS %.3g of dv's where 0 is exact (> %.3g)", label, m->name, e, tol);
    free(got);
}

enum { L_ONE, L_SHORT, L_RAGGED, L_EDGES, L_SINGLE, L_LONG_LAST, L_N };
static const char* const LNAME[L_N] = {"one document", "many short", "ragged lengths", "tile edges", "one-token docs",
                                       "short then long"};

static void layout(int32_t* doc, int T, int which, int b) {
    static const int ragged[] = {100, 37, 129, 1, 200, 63, 65, 0}, edges[] = {64, 64, 128, 128, 256, 64, 0},
                     lng[] = {5, 3, 70, 0};
    switch (which) {
        case L_ONE: memset(doc, 0, sizeof(int32_t) * (size_t)T); break;
        case L_SHORT: docs_random(doc, T, 1 + 3 * b, 40); break;
        case L_RAGGED: docs_of(doc, T, ragged + b); break;
        case L_EDGES: docs_of(doc, T, edges + b); break;
        case L_SINGLE: for (int t = 0; t < T; t++) doc[t] = t; break;
        default: docs_of(doc, T, lng); break;
    }
}

// The forward's and backward's kernels for a case (see the header); wg: the wgmma kernels are on.
static const char* fwd_path(const Mode* m, int D, int wg, int docs) {
    if (!m->bf16 || !(D == 16 || D == 32 || D == 64 || D == 128)) return "simple";
    if (wg && D == 128) return "ws";
    return wg && D == 64 && !docs ? "wg" : "mma";
}
static const char* bwd_path(const Mode* m, int D, int wg, size_t ws_bytes) {
    if (!m->bf16 || !(D == 16 || D == 32 || D == 64 || D == 128)) return "simple";
    return wg && D == 128 && ws_bytes ? "ws" : "mma";
}

static void attention_docs(int wg) {
    const struct { int B, T, Hq, Hkv, D; float qs; } cs[] = {
        {2, 520, 4, 2, 128, 1.f},  // Mixtral's head dim: the warp-specialised kernels in bf16; 520 = 4·128 + 8
        {1, 460, 8, 2, 128, 2.f},  // GQA 4:1, sharp softmax, a ragged last tile (460 = 3·128 + 76)
        {2, 300, 4, 1, 64, 1.f},   // D = 64: mma.sync with documents (the one-warpgroup kernel takes none)
        {1, 150, 2, 2, 16, 1.f},   // L0_sanity's head dim
        {1, 90, 3, 1, 40, 1.f},    // a head dim without a tensor-core kernel: simple
    };
    FOR_MODES for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) for (int lay = 0; lay < L_N; lay++) {
        Backend* be = m->gpu;
        const int B = cs[c].B, T = cs[c].T, Hq = cs[c].Hq, Hkv = cs[c].Hkv, D = cs[c].D;
        const size_t nq = (size_t)B * T * Hq * D, nk = (size_t)B * T * Hkv * D, nl = (size_t)B * Hq * T;
        const char* path = fwd_path(m, D, wg, 1);
        int32_t* doc = xmalloc(sizeof(int32_t) * (size_t)B * T);
        for (int b = 0; b < B; b++) layout(doc + (size_t)b * T, T, lay, b);
        float* q = randn_act(m, nq, cs[c].qs);
        float* k = randn_act(m, nk, 1.f);
        float* v = randn_act(m, nk, 1.f);
        float *o = xmalloc(4 * nq), *l = xmalloc(4 * nl);
        g_cpu->attn_fwd(g_cpu, o, l, q, k, v, B, T, Hq, Hkv, D, doc);
        void *dq_ = up_act(be, q, nq), *dk_ = up_act(be, k, nk), *dv_ = up_act(be, v, nk);
        int32_t* ddoc = up_i32(be, doc, (size_t)B * T);
        void* dO = poison_act(be, nq);
        float* dL = poison(be, 4 * nl);
        be->attn_fwd(be, dO, dL, dq_, dk_, dv_, B, T, Hq, Hkv, D, ddoc);
        EXPECT(!cuda_attn_fwd_ws_stalled(), "%s attn_fwd D=%d T=%d %s: an mbarrier wait gave up", path, D, T,
               LNAME[lay]);
        char lab[64];
        snprintf(lab, sizeof lab, "docs %s fwd out D=%d %s", path, D, LNAME[lay]);
        float* got_o = down_act(be, dO, nq);
        float* got_o_copy = dupf(got_o, nq);
        cmp(m, lab, got_o, o, nq, TOL(TOL_F32, TOL_ATTN_FWD));
        snprintf(lab, sizeof lab, "docs %s fwd lse D=%d %s", path, D, LNAME[lay]);
        cmp(m, lab, down_f32(be, dL, nl), l, nl, TOL(TOL_F32, TOL_FP32_OUT));
        if (lay == L_ONE) {  // starts all 0 = no documents
            void* dO2 = poison_act(be, nq);
            float* dL2 = poison(be, 4 * nl);
            be->attn_fwd(be, dO2, dL2, dq_, dk_, dv_, B, T, Hq, Hkv, D, NULL);
            if (!strcmp(path, fwd_path(m, D, wg, 0))) {  // the same kernel, the same tiles: the same bits
                snprintf(lab, sizeof lab, "docs %s fwd, one document = none, D=%d", path, D);
                cmp_bits(m, lab, dupf(got_o_copy, nq), down_act(be, dO2, nq), nq);
            } else {  // without documents another kernel runs: within tolerance of each other
                snprintf(lab, sizeof lab, "docs %s fwd, one document vs none, D=%d", path, D);
                cmp(m, lab, down_act(be, dO2, nq), got_o_copy, nq, TOL(TOL_F32, TOL_ATTN_FWD));
            }
        }
        free(got_o_copy);

        // backward from the CPU's forward (out rounded to the act dtype: both sides see it); with a
        // workspace for every pair's dS, for 1.5 pairs (forced: chunks of one pair), and none
        float* orr = act_in(m, o, nq);
        float* g = randn_act(m, nq, 1.f);
        float *rq = xmalloc(4 * nq), *rk = xmalloc(4 * nk), *rv = xmalloc(4 * nk);
        g_cpu->attn_bwd(g_cpu, rq, rk, rv, g, orr, l, q, k, v, B, T, Hq, Hkv, D, NULL, 0, doc);
        void *d_g = up_act(be, g, nq), *d_o = up_act(be, orr, nq);
        float* d_l = up_f32(be, l, nl);
        const size_t nt = (size_t)(T + 63) / 64, pair = (size_t)(Hq / Hkv) * (nt * (nt + 1) / 2) * 64 * 64 * 2;
        const struct { const char* name; size_t bytes; int force; } wv[] = {
            {"ds", pair * B * Hkv, 0}, {"ds-chunked", pair + pair / 2, 1}, {"no-ws", 0, 0}};
        for (int w = 0; w < 3; w++) {
            const char* bp = bwd_path(m, D, wg, wv[w].bytes);
            void* ws = wv[w].bytes ? poison(be, wv[w].bytes) : NULL;
            const int was = cuda_attn_ds_force(be, wv[w].force);
            void *gq = poison_act(be, nq), *gk = poison_act(be, nk), *gv = poison_act(be, nk);
            be->attn_bwd(be, gq, gk, gv, d_g, d_o, d_l, dq_, dk_, dv_, B, T, Hq, Hkv, D, ws, wv[w].bytes, ddoc);
            cuda_attn_ds_force(be, was);
            EXPECT(!cuda_attn_bwd_ws_stalled(), "%s/%s attn_bwd D=%d T=%d %s: an mbarrier wait gave up", bp,
                   wv[w].name, D, T, LNAME[lay]);
            snprintf(lab, sizeof lab, "docs %s/%s bwd dq D=%d %s", bp, wv[w].name, D, LNAME[lay]);
            if (lay == L_SINGLE) cmp_zero(m, lab, down_act(be, gq, nq), nq, rv, nk, TOL(TOL_F32, TOL_ATTN_BWD));
            else cmp(m, lab, down_act(be, gq, nq), rq, nq, TOL(TOL_F32, TOL_ATTN_BWD));
            snprintf(lab, sizeof lab, "docs %s/%s bwd dk D=%d %s", bp, wv[w].name, D, LNAME[lay]);
            if (lay == L_SINGLE) cmp_zero(m, lab, down_act(be, gk, nk), nk, rv, nk, TOL(TOL_F32, TOL_ATTN_BWD));
            else cmp(m, lab, down_act(be, gk, nk), rk, nk, TOL(TOL_F32, TOL_ATTN_BWD));
            snprintf(lab, sizeof lab, "docs %s/%s bwd dv D=%d %s", bp, wv[w].name, D, LNAME[lay]);
            cmp(m, lab, down_act(be, gv, nk), rv, nk, TOL(TOL_F32, TOL_ATTN_BWD));
        }
        free(doc), free(q), free(k), free(v), free(o), free(l), free(orr), free(g), free(rq), free(rk), free(rv);
        dev_free_all();
    }
}

static void test_attention_docs(void) { attention_docs(1); }

static void test_attention_docs_mma(void) {
    const GpuConfig mma = {.attention = GPU_ATTN_MMA};
    Mode saved[2];
    gpu_modes_with(&mma, saved);
    attention_docs(0);
    gpu_modes_restore(saved);
}

// rope_qkv with positions restarting per document against the CPU spec, forward and inverse.
static void test_rope_positions(void) {
    const struct { int B, T, Hq, Hkv, D; } cs[] = {{2, 77, 4, 2, 128}, {3, 50, 3, 1, 10}, {1, 300, 8, 2, 64}};
    FOR_MODES for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        Backend* be = m->gpu;
        const int B = cs[c].B, T = cs[c].T, Hq = cs[c].Hq, Hkv = cs[c].Hkv, D = cs[c].D;
        const size_t rows = (size_t)B * T, n = rows * (Hq + 2 * Hkv) * D, nq = rows * Hq * D, nk = rows * Hkv * D;
        int32_t* doc = xmalloc(sizeof(int32_t) * rows);
        int32_t* pos = xmalloc(sizeof(int32_t) * rows);
        for (int b = 0; b < B; b++) docs_random(doc + (size_t)b * T, T, 1, 30);
        for (size_t r = 0; r < rows; r++) pos[r] = (int32_t)(r % T) - doc[r];
        int32_t* dpos = up_i32(be, pos, rows);
        for (int inv = 0; inv < 2; inv++) {
            float* pk = randn_act(m, n, 1.f);
            float *q = randn_act(m, nq, 1.f), *k = randn_act(m, nk, 1.f), *v = randn_act(m, nk, 1.f);
            void *dpk = up_act(be, pk, n), *dq = up_act(be, q, nq), *dk = up_act(be, k, nk), *dv = up_act(be, v, nk);
            if (inv) dpk = poison_act(be, n);
            else dq = poison_act(be, nq), dk = poison_act(be, nk), dv = poison_act(be, nk);
            g_cpu->rope_qkv(g_cpu, pk, q, k, v, B, T, Hq, Hkv, D, 1e4f, inv, pos);
            be->rope_qkv(be, dpk, dq, dk, dv, B, T, Hq, Hkv, D, 1e4f, inv, dpos);
            if (inv) {
                cmp(m, "rope_qkv positions, inverse (packed rows)", down_act(be, dpk, n), pk, n, TOL(TOL_F32, TOL_BF16_OUT));
            } else {
                cmp(m, "rope_qkv positions q", down_act(be, dq, nq), q, nq, TOL(TOL_F32, TOL_BF16_OUT));
                cmp(m, "rope_qkv positions k", down_act(be, dk, nk), k, nk, TOL(TOL_F32, TOL_BF16_OUT));
                cmp(m, "rope_qkv positions v (copied)", down_act(be, dv, nk), v, nk, 0);
            }
            free(pk), free(q), free(k), free(v);
        }
        free(doc), free(pos);
        dev_free_all();
    }
}

int main(void) {
    if (gpu_setup("test_cuda_attn_docs")) return 1;
    RUN(test_attention_docs);
    RUN(test_attention_docs_mma);
    RUN(test_rope_positions);
    gpu_teardown();
    TEST_END();
}
