// test_cuda_fp8_ffn.c — the experts' forward as one op (gemm_grouped_ffn: w13's product, the
// SwiGLU writing h's row-wise codes from its registers, w2's product, a group at a time; cuda/cuda_fp8.cu)
// against the two ops that define it (gemm_grouped_ffn_seq), run on the GPU on the same inputs: gu,
// h and Y bit for bit (the same kernels' arithmetic, each product the same cuBLASLt call on the
// same codes; the two ops are checked against the spec in test_cuda_fp8.c, the kernel in
// test_cuda_fp8_quant.c). ws holds every group, so each must take the op's own path (counted);
// also on kept weight codes (W13 and W2 themselves poisoned) and through the fallback kernel. With
// hq (h's codes for w2's weight gradient, written by the SwiGLU instead of h): gu and Y as before,
// hq byte for byte what fp8_xcodes_make makes of the two ops' h, and w2's weight gradient on hq
// bit for bit the one on that h.
// The same op's layouts and its other paths run on the CPU in tests/test_fp8_gemm_host.cc.
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"

void cuda_fp8_set_path(Backend* be, int path);
size_t cuda_fp8_ffn_groups(Backend* be);
size_t cuda_fp8_ffn_ws(Backend* be, int rows, int F, int H);

static size_t differ(Backend* be, const void* a, const void* b, size_t n, size_t es) {
    unsigned char *x = xmalloc(n * es), *y = xmalloc(n * es);
    be->to_host(be, x, a, n * es), be->to_host(be, y, b, n * es);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp(x + i * es, y + i * es, es) != 0;
    free(x), free(y);
    return bad;
}

static void run_ffn(const Mode* m, const int* off, int G, int F, int K, int H, int path, const char* name) {
    Backend* be = m->gpu;
    const int R = off[G], F2 = 2 * F;
    const size_t nx = (size_t)R * K, n13 = (size_t)G * F2 * K, n2 = (size_t)G * H * F, ea = dtype_size(be->act_dtype);
    float *X = randn_act(m, nx, 1.f), *W13 = randn_act(m, n13, 0.05f), *W2 = randn_act(m, n2, 0.05f);
    float* sc = randu(R, 0.25f, 0.75f);
    size_t wsb = be->fp8_ws_bytes(be, FP8_OP_GROUPED, FP8_WEIGHT, R, F2, K, G);
    const size_t w2 = be->fp8_ws_bytes(be, FP8_OP_GROUPED, FP8_WEIGHT, R, H, F, G), w3 = cuda_fp8_ffn_ws(be, R, F, H);
    wsb = wsb > w2 ? wsb : w2;
    wsb = wsb > w3 ? wsb : w3;
    void* ws = poison(be, wsb);
    GemmDesc d = {.N = F2, .K = K, .trans_b = 1, .alpha = 1, .fp8 = FP8_WEIGHT, .ws = ws, .ws_bytes = wsb};
    GemmDesc d2 = d;
    d2.N = H, d2.K = F;
    GroupDesc g = {.groups = G, .host_off = off, .b_stride = (size_t)F2 * K};
    GroupDesc g2 = {.groups = G, .host_off = off, .b_stride = (size_t)H * F};
    void *dx = up_act(be, X, nx), *dw13 = up_act(be, W13, n13), *dw2 = up_act(be, W2, n2);
    float* dsc = up_f32(be, sc, R);
    void* c13 = dev_alloc(be, be->fp8_wcodes_bytes(be, F2, K, G));
    void* c2 = dev_alloc(be, be->fp8_wcodes_bytes(be, H, F, G));
    be->fp8_wcodes_make(be, dw13, F2, K, G, (size_t)F2 * K, c13);
    be->fp8_wcodes_make(be, dw2, H, F, G, (size_t)H * F, c2);
    const Fp8WCodes q13 = {.codes = c13, .R = F2, .C = K, .groups = G}, q2 = {.codes = c2, .R = H, .C = F, .groups = G};
    void* out[4][3];  // [the op, the two ops, the op on kept weight codes, the op with hq][gu, h, Y]
    const size_t xqb = be->fp8_xcodes_bytes(be, R, G, F);
    void *hq = dev_alloc(be, xqb), *hq1 = dev_alloc(be, xqb);
    be->zero(be, hq, xqb), be->zero(be, hq1, xqb);  // the alignment gaps stay zero in both
    cuda_fp8_set_path(be, path);
    for (int k = 0; k < 4; k++) {
        out[k][0] = poison_act(be, (size_t)R * F2), out[k][1] = poison_act(be, (size_t)R * F);
        out[k][2] = poison_act(be, (size_t)R * H);
        const size_t f0 = cuda_fp8_ffn_groups(be);
        if (k == 1) {
            gemm_grouped_ffn_seq(be, &d, &g, dx, dw13, out[k][0], out[k][1], NULL, dsc, &d2, &g2, dw2, out[k][2]);
        } else {
            GemmDesc a = d, b = d2;
            if (k == 2) a.wq = &q13, b.wq = &q2;
            be->gemm_grouped_ffn(be, &a, &g, dx, k == 2 ? poison_act(be, n13) : dw13, out[k][0], out[k][1],
                                 k == 3 ? hq : NULL, dsc, &b, &g2, k == 2 ? poison_act(be, n2) : dw2, out[k][2]);
        }
        const size_t fused = cuda_fp8_ffn_groups(be) - f0;
        size_t want = 0;
        for (int i = 0; i < G; i++) want += k != 1 && m->bf16 && off[i + 1] > off[i];
        EXPECT(fused == want, "%s [%s]: %zu groups on the op's own path, want %zu", name, m->name, fused, want);
    }
    // w2's weight gradient on hq, and on the two ops' h (X) with its codes made here
    be->fp8_xcodes_make(be, &g, out[1][1], F, hq1);
    size_t wgb = be->fp8_ws_bytes(be, FP8_OP_WGRAD, FP8_ACT, R, H, F, G);
    GroupDesc gw = {.groups = G, .host_off = off, .b_stride = (size_t)H * F, .db_act = m->bf16, .fp8 = FP8_ACT,
                    .ws = poison(be, wgb), .ws_bytes = wgb};
    void* dw[2] = {poison_act(be, n2), poison_act(be, n2)};
    float* DY = randn_act(m, (size_t)R * H, 1.f);
    void* dye = up_act(be, DY, (size_t)R * H);
    be->gemm_grouped_wgrad(be, &gw, H, F, dye, out[1][1], dw[0], 0.f);
    gw.xq = hq;
    be->gemm_grouped_wgrad(be, &gw, H, F, dye, NULL, dw[1], 0.f);
    cuda_fp8_set_path(be, 0);
    static const char* what[3] = {"gu", "h", "Y"};
    const size_t n[3] = {(size_t)R * F2, (size_t)R * F, (size_t)R * H};
    for (int k = 0; k < 4; k++)
        for (int o = 0; o < 3; o++) {
            if (k == 1 || (k == 3 && o == 1)) continue;  // with hq, h is scratch
            const size_t bad = differ(be, out[k][o], out[1][o], n[o], ea);
            char lab[64];
            snprintf(lab, sizeof lab, "%s%s%s %s", name, path ? " fallback" : "", k == 2 ? " kept codes" : k == 3 ? " hq" : "",
                     what[o]);
            record(lab, m->bf16, bad != 0, 0);
            EXPECT(bad == 0, "%s [%s]: %zu of %zu elements differ from the two ops'", lab, m->name, bad, n[o]);
        }
    const size_t badq = differ(be, hq, hq1, xqb, 1), badw = differ(be, dw[1], dw[0], n2, m->bf16 ? 2 : 4);
    EXPECT(badq == 0, "%s%s [%s]: %zu of %zu bytes of hq differ from fp8_xcodes_make's", name, path ? " fallback" : "",
           m->name, badq, xqb);
    EXPECT(badw == 0, "%s%s [%s]: w2's weight gradient on hq: %zu of %zu elements differ from the one on h", name,
           path ? " fallback" : "", m->name, badw, n2);
    free(X), free(W13), free(W2), free(sc), free(DY);
    dev_free_all();
}

static int g_small;  // --small: the small shapes only (memcheck; the host stand-in)

static void test_ffn(void) {
    const int off[] = {0, 37, 37, 165, 181, 481};  // an empty group; runs on to a multiple of 8; a tail
    const int big[] = {0, 1000, 3100, 4096};
    FOR_MODES {
        for (int path = 0; path <= 2; path += 2) run_ffn(m, off, 5, 256, 136, 72, path, "ffn small");
        if (!g_small) run_ffn(m, big, 3, 1024, 512, 512, 0, "ffn 1024");
    }
}

int main(int argc, char** argv) {
    g_small = argc > 1 && !strcmp(argv[1], "--small");
    if (gpu_setup("test_cuda_fp8_ffn")) return 1;
    if (!g_modes[0].gpu->fp8_ws_bytes) {  // test_cuda_fp8 fails this case on a GPU that should have FP8
        printf("skip: no FP8 GEMMs here (compute capability below 8.9, or a build without code for it)\n");
        gpu_teardown();
        TEST_END();
    }
    RUN(test_ffn);
    gpu_teardown();
    TEST_END();
}
