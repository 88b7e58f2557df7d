// test_cuda_fp8_quant.c — the CUDA backend's FP8 quantisers (cuda/cuda_fp8_quant.cu) against the
// CPU spec (src/fp8.h), bit for bit (codes and scales), for bf16 and fp32 inputs: 1×128 row-wise,
// the cast-transpose (both layouts from one read), 128×128 blocks as stored and transposed; partial
// tiles, padded strides, codes with row strides of only 4 bytes, an input one element off 16 bytes,
// NaN and ±inf, saturation at the tile maximum, all-zero tiles, fp32 subnormals, values near FLT_MAX
// and scaled values x·fl(1/s) at and beside e4m3 rounding boundaries. The FP8 GEMMs that use them:
// test_cuda_fp8.c. Also the SwiGLU forward and backward that write their outputs' row-wise codes:
// h, or d(gate|up) and dscale, the plain SwiGLU kernels' bits, the codes and scales the spec's of
// those values.
// `make test` also runs this test on the CPU (tests/host_cuda).
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fp8.h"
#include "gpu_check.h"

void cuda_fp8_quant_rows(Backend* be, const void* x, int R, int C, int ldx, uint8_t* q, int ldq, float* s0, float* s1,
                         int split, int chunk);
void cuda_fp8_quant_cols(Backend* be, const void* x, int n, int C, int ldx, uint8_t* qt, int ldk, float* st, uint8_t* q,
                         int ldq, float* s);
void cuda_fp8_quant_blocks(Backend* be, const void* w, int R, int C, int ldw, int trans, uint8_t* q, int ldq, float* s);
void cuda_fp8_quant_blocks_both(Backend* be, const void* w, int R, int C, int ldw, uint8_t* q, int ldq, float* s,
                                uint8_t* qt, int ldqt, float* st);
int cuda_fp8_swiglu_bwd_rows(Backend* be, void* dgu, float* dscale, const void* dh, const void* gu, const float* scale,
                             int n, int F, uint8_t* q, int ldq, float* s);
int cuda_fp8_swiglu_fwd_rows(Backend* be, void* h, const void* gu, const float* scale, int n, int F, uint8_t* q, int ldq,
                             float* s);
int cuda_compute_capability(Backend* be);

static size_t pad(size_t x, size_t a) { return (x + a - 1) / a * a; }
static int tiles(int n) { return (n + FP8_TILE - 1) / FP8_TILE; }

// [R, C] (stride ld) with everything a quantiser must get right: rows over 60 binades and rows of
// scales near 2^-120, an all-zero row tile and column tile, NaN and ±inf, fp32 subnormals, values
// near FLT_MAX, a row of one value repeated (every element at the tile maximum: saturation at 448
// after the scaling), rows whose scaled values x/s sit at e4m3 rounding boundaries (ties) and up to
// 3 ulp beside them, where the rounding of fl(1/s) and of the product decides the code (what a
// quantiser that divided by s instead would get wrong), at three scales; and 128×128 tiles without
// a non-finite element whose column maxima sit at random rows.
static float* quant_data(int R, int C, int ld) {
    float* x = xmalloc(sizeof(float) * ((size_t)R * ld + 1));
    for (int r = 0; r < R; r++) {
        // rows 10-25: scales near 2^-120 (reciprocals near 2^120); their values spread over 12
        // binades, down into the fp32 subnormals
        const int tiny = r >= 10 && r < 26, e = tiny ? -104 - r / 2 : (int)(rng_u64(&g_rng) % 61) - 30;
        const float s = exp2f((float)e);
        for (int c = 0; c < ld; c++) {
            if (!tiny) {
                x[(size_t)r * ld + c] = rng_normal(&g_rng) * s;
                continue;
            }
            const uint64_t u = rng_u64(&g_rng);
            const float v = ldexpf((float)((u >> 11) & 0xffffff) / 16777216.f, e - (int)((u >> 40) % 12));
            x[(size_t)r * ld + c] = (u >> 63) ? -v : v;
        }
    }
    if (R > 1)
        for (int c = 0; c < C && c < FP8_TILE; c++) x[(size_t)1 * ld + c] = 0.f;  // all-zero row tile
    if (C > 3)
        for (int r = 0; r < R && r < FP8_TILE; r++) x[(size_t)r * ld + 3] = 0.f;  // all-zero column tile
    if (R > 2)
        for (int c = 0; c < C; c++) x[(size_t)2 * ld + c] = 1e-39f * (c % 7 - 3);  // fp32 subnormals
    if (R > 4)
        for (int c = 0; c < C; c++) x[(size_t)4 * ld + c] = 3e38f * (rng_uniform(&g_rng) - 0.5f);
    if (R > 5)
        for (int c = 0; c < C; c++) x[(size_t)5 * ld + c] = (c & 1) ? -0.3f : 0.3f;  // all at the maximum
    // values x/s at and within 3 ulp of e4m3 rounding boundaries (ties included), with scales 3
    // (row 6), 3·2^-60 (row 8) and 3·2^-115 (row 9); 1/3 is inexact, so fl(1/s) is rounded
    const struct { int row; float mul; } brow[] = {{6, 1.f}, {8, 0x1p-60f}, {9, 0x1p-115f}};
    for (int b = 0; b < 3; b++) {
        if (R <= brow[b].row) continue;
        float* xr = x + (size_t)brow[b].row * ld;
        for (int c = 0; c < C; c++) {
            const int j = c % FP8_TILE, t = c / FP8_TILE;
            if (j == 0) {
                xr[c] = 1344.f * brow[b].mul;  // each tile's maximum: scale 1344 / 448 = 3 (·mul), 1/3 inexact
                continue;
            }
            // 3 × the midpoint of e4m3 codes v and v + 1 (v in 0 .. 0x7D), moved d ulp (−3 .. 3)
            const uint8_t v = (uint8_t)((j * 5 + t * 11) % 126);
            float y = 3.f * brow[b].mul * 0.5f * (fp8_e4m3_to_f32(v) + fp8_e4m3_to_f32((uint8_t)(v + 1)));
            for (int d = j % 7 - 3; d != 0; d += d > 0 ? -1 : 1) y = nextafterf(y, d > 0 ? INFINITY : 0.f);
            xr[c] = (c & 1) ? -y : y;
        }
    }
    // The 128×128 tiles of odd (row tile + column tile) hold no non-finite element (the kernels' fast
    // path) and, from row 26 on, one element of each column 2^40 times larger: each column's maximum
    // at a random row, not where the rows' own scales put it.
    for (int c = 0; c < C; c++)
        for (int r0 = 0; r0 < R; r0 += FP8_TILE) {
            const int lo = r0 < 26 ? 26 : r0, hi = r0 + FP8_TILE < R ? r0 + FP8_TILE : R;
            if ((r0 / FP8_TILE + c / FP8_TILE) % 2 == 0 || lo >= hi) continue;
            x[(size_t)(lo + (int)(rng_u64(&g_rng) % (uint64_t)(hi - lo))) * ld + c] *= 0x1p40f;
        }
    for (int k = 0; k < R * C / 500 + 3; k++) {  // non-finite elements, in the tiles of even (row + column tile)
        int r = (int)(rng_u64(&g_rng) % R), c = (int)(rng_u64(&g_rng) % C);
        if ((r / FP8_TILE + c / FP8_TILE) % 2) {  // into the tile to the left, or else above: even
            if (c >= FP8_TILE) c -= FP8_TILE;
            else r -= FP8_TILE;
        }
        x[(size_t)r * ld + c] = k % 3 == 0 ? NAN : (k % 3 == 1 ? INFINITY : -INFINITY);
    }
    return x;
}

static uint8_t* down_u8(Backend* be, const void* d, size_t n) {
    uint8_t* h = xmalloc(n ? n : 1);
    be->to_host(be, h, d, n);
    return h;
}

// ---- quantisers, bit for bit ---------------------------------------------------------------------

// The scale index of (row r, tile t) in the GEMMs' layout (cuda_fp8.cu SMap): rows [0, split) in
// chunks of `chunk` ([Kt, chunk rows] each), the rest [Kt, R − split] at s1.
static const float* smap_at(const float* s0, const float* s1, int split, int chunk, int R, int Kt, int r, int t) {
    if (r < split) {
        const int c = r / chunk, r0 = c * chunk, n = split - r0 < chunk ? split - r0 : chunk;
        return s0 + (size_t)r0 * Kt + (size_t)t * n + (r - r0);
    }
    return s1 + (size_t)t * (R - split) + (r - split);
}

static void check_codes(const Mode* m, const char* label, const uint8_t* got, size_t ldg, const uint8_t* want, int R,
                        int C) {
    size_t bad = 0, first = (size_t)-1;
    for (int r = 0; r < R; r++)
        for (size_t c = 0; c < ldg; c++) {
            const uint8_t w = c < (size_t)C ? want[(size_t)r * C + c] : 0;  // zero codes pad each row
            if (got[(size_t)r * ldg + c] != w) {
                if (!bad) first = (size_t)r * ldg + c;
                bad++;
            }
        }
    record(label, m->bf16, (double)bad, 0);
    EXPECT(bad == 0, "%s [%s]: %zu codes differ (first at row %zu col %zu: got 0x%02x)", label, m->name, bad,
           bad ? first / ldg : 0, bad ? first % ldg : 0, bad ? got[first] : 0);
}

static void check_scales(const Mode* m, const char* label, const float* got_at_rt[], const float* want, size_t n) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(got_at_rt[i], &want[i], 4)) {
            if (!bad) first = i;
            bad++;
        }
    record(label, m->bf16, (double)bad, 0);
    EXPECT(bad == 0, "%s [%s]: %zu of %zu scales differ (first #%zu: got %.9g, want %.9g)", label, m->name, bad, n,
           first, bad ? *got_at_rt[first] : 0.f, bad ? want[first] : 0.f);
}

// Shapes: partial tiles, padded strides, a whole 128×128 tile, one row of 8; al: ldq / ldk rounded to
// 16 (the GEMMs' layout: 16-byte stores) or only to 4 (the kernels' narrower stores); off: the input
// starts one element past 16 bytes (the kernels' element-wise loads).
static void test_quant(void) {
    const struct { int R, C, ld, al, off; } sh[] = {
        {37, 300, 300, 16, 0}, {130, 256, 264, 16, 0}, {256, 1024, 1024, 16, 0}, {5, 129, 131, 16, 0},
        {300, 520, 520, 16, 0}, {129, 384, 392, 4, 0}, {200, 136, 136, 4, 1}, {128, 128, 128, 16, 0}, {1, 8, 8, 16, 0}};
    FOR_MODES for (size_t si = 0; si < sizeof sh / sizeof sh[0]; si++) {
        Backend* be = m->gpu;
        const int R = sh[si].R, C = sh[si].C, ld = sh[si].ld, al = sh[si].al, KtC = tiles(C), KtR = tiles(R);
        float* x = quant_data(R, C, ld);
        round_act(m, x, (size_t)R * ld);
        float* xs = xmalloc(sizeof(float) * ((size_t)R * ld + 1));  // x one element in, for off
        xs[0] = 0.f;
        memcpy(xs + 1, x, sizeof(float) * (size_t)R * ld);
        void* dx = sh[si].off ? (char*)up_act(be, xs, (size_t)R * ld + 1) + dtype_size(be->act_dtype)
                              : up_act(be, x, (size_t)R * ld);
        free(xs);
        uint8_t *q = xmalloc((size_t)R * C), *qt = xmalloc((size_t)R * C);
        float *s = xmalloc(4 * (size_t)R * KtC), *st = xmalloc(4 * (size_t)C * KtR);
        fp8_quant_1x128(x, R, C, (size_t)ld, q, s, qt, st);
        char lab[64];

        // 1×128 row-wise, with the GEMMs' split/chunk scale map (rows past the split at s1)
        {
            const int ldq = (int)pad((size_t)C, al), split = R / 8 * 8, chunk = 16;
            uint8_t* dq = poison(be, (size_t)R * ldq);
            float *ds0 = poison(be, 4 * (size_t)R * KtC), *ds1 = poison(be, 4 * (size_t)8 * KtC);
            cuda_fp8_quant_rows(be, dx, R, C, ld, dq, ldq, ds0, ds1, split, chunk);
            uint8_t* gq = down_u8(be, dq, (size_t)R * ldq);
            float *g0 = down_f32(be, ds0, (size_t)R * KtC), *g1 = down_f32(be, ds1, (size_t)8 * KtC);
            snprintf(lab, sizeof lab, "quant rows %dx%d codes", R, C);
            check_codes(m, lab, gq, ldq, q, R, C);
            const float** at = xmalloc(sizeof(float*) * (size_t)R * KtC);
            for (int r = 0; r < R; r++)
                for (int t = 0; t < KtC; t++) at[(size_t)r * KtC + t] = smap_at(g0, g1, split, chunk, R, KtC, r, t);
            snprintf(lab, sizeof lab, "quant rows %dx%d scales", R, C);
            check_scales(m, lab, at, s, (size_t)R * KtC);
            free(at), free(gq), free(g0), free(g1);
        }
        // the cast-transpose, both layouts from one read
        {
            const int ldk = (int)pad((size_t)R, al), ldq = (int)pad((size_t)C, al);
            uint8_t *dqt = poison(be, (size_t)C * ldk), *dq = poison(be, (size_t)R * ldq);
            float *dst = poison(be, 4 * (size_t)KtR * C), *ds = poison(be, 4 * (size_t)KtC * R);
            cuda_fp8_quant_cols(be, dx, R, C, ld, dqt, ldk, dst, dq, ldq, ds);
            uint8_t *gqt = down_u8(be, dqt, (size_t)C * ldk), *gq = down_u8(be, dq, (size_t)R * ldq);
            float *gst = down_f32(be, dst, (size_t)KtR * C), *gs = down_f32(be, ds, (size_t)KtC * R);
            snprintf(lab, sizeof lab, "cast-transpose %dx%d qt", R, C);
            check_codes(m, lab, gqt, ldk, qt, C, R);
            snprintf(lab, sizeof lab, "cast-transpose %dx%d q", R, C);
            check_codes(m, lab, gq, ldq, q, R, C);
            const float** at = xmalloc(sizeof(float*) * ((size_t)C * KtR + (size_t)R * KtC));
            for (int c = 0; c < C; c++)
                for (int t = 0; t < KtR; t++) at[(size_t)c * KtR + t] = gst + (size_t)t * C + c;
            snprintf(lab, sizeof lab, "cast-transpose %dx%d st", R, C);
            check_scales(m, lab, at, st, (size_t)C * KtR);
            for (int r = 0; r < R; r++)
                for (int t = 0; t < KtC; t++) at[(size_t)r * KtC + t] = gs + (size_t)t * R + r;
            snprintf(lab, sizeof lab, "cast-transpose %dx%d s", R, C);
            check_scales(m, lab, at, s, (size_t)R * KtC);
            free(at), free(gqt), free(gq), free(gst), free(gs);
        }
        // 128×128 blocks, as stored and transposed
        {
            uint8_t *bq = xmalloc((size_t)R * C), *bqt = xmalloc((size_t)R * C);
            float *bs = xmalloc(4 * (size_t)KtR * KtC), *bst = xmalloc(4 * (size_t)KtR * KtC);
            fp8_quant_128x128(x, R, C, (size_t)ld, bq, bs, bqt, bst);
            // form 0: as stored, 1: transposed, 2: both layouts from one read (quant_blocks_both)
            for (int form = 0; form < 3; form++) {
                uint8_t* dq[2];
                float* ds[2];
                int ldq[2], lds[2];
                for (int tr = 0; tr < 2; tr++) {
                    const int orows = tr ? C : R, ok = tr ? R : C;
                    ldq[tr] = (int)pad((size_t)ok, al), lds[tr] = (int)pad((size_t)tiles(ok), 4);
                    dq[tr] = poison(be, (size_t)orows * ldq[tr]);
                    ds[tr] = poison(be, 4 * (size_t)tiles(orows) * lds[tr]);
                }
                if (form < 2) cuda_fp8_quant_blocks(be, dx, R, C, ld, form, dq[form], ldq[form], ds[form]);
                else cuda_fp8_quant_blocks_both(be, dx, R, C, ld, dq[0], ldq[0], ds[0], dq[1], ldq[1], ds[1]);
                for (int tr = 0; tr < 2; tr++) {
                    if (form < 2 && tr != form) continue;
                    const int orows = tr ? C : R, ok = tr ? R : C, okt = tiles(ok), orb = tiles(orows);
                    uint8_t* gq = down_u8(be, dq[tr], (size_t)orows * ldq[tr]);
                    float* gs = down_f32(be, ds[tr], (size_t)orb * lds[tr]);
                    const char* how = form == 2 ? " (both)" : "";
                    snprintf(lab, sizeof lab, "quant 128x128%s%s %dx%d codes", tr ? "ᵀ" : "", how, R, C);
                    check_codes(m, lab, gq, ldq[tr], tr ? bqt : bq, orows, ok);
                    const float** at = xmalloc(sizeof(float*) * (size_t)orb * okt);
                    for (int b = 0; b < orb; b++)
                        for (int t = 0; t < okt; t++) at[(size_t)b * okt + t] = gs + (size_t)b * lds[tr] + t;
                    snprintf(lab, sizeof lab, "quant 128x128%s%s %dx%d scales", tr ? "ᵀ" : "", how, R, C);
                    check_scales(m, lab, at, tr ? bst : bs, (size_t)orb * okt);
                    free(at), free(gq), free(gs);
                }
            }
            free(bq), free(bqt), free(bs), free(bst);
        }
        free(x), free(q), free(qt), free(s), free(st);
        dev_free_all();
    }
}

// ---- the SwiGLU forward and backward with their outputs' row-wise codes ---------------------------
// bf16 (the only dtype they take; fp32 and F % 128 ≠ 0 must decline). Gates and ups of a few units,
// incoming gradients over 40 binades, non-finite elements in gu and in dh (whole tiles of the output
// then code SAFE), with and without the routing scales. The output (h, or d(gate|up) and dscale)
// must be the plain kernel's bits, its codes and scales the spec's of those values.
static void swiglu_rows_case(const Mode* m, int n, int F, int scaled, int fwd) {
    Backend* be = m->gpu;
    const int F2 = 2 * F, C = fwd ? F : F2, Kt = tiles(C), ldq = (int)pad((size_t)C, 16);
    const char* dir = fwd ? "fwd" : "bwd";
    float* gu = randn(n * (size_t)F2, 2.f);
    float* dh = randn(n * (size_t)F, 1.f);
    for (size_t i = 0; i < (size_t)n * F; i++) dh[i] *= exp2f((float)(int)(rng_u64(&g_rng) % 41) - 20);
    for (int k = 0; k < n / 8 + 2; k++) {
        const int r = (int)(rng_u64(&g_rng) % n);
        const float bad = k % 3 == 0 ? NAN : (k % 3 == 1 ? INFINITY : -INFINITY);
        if (k % 2 || fwd) gu[(size_t)r * F2 + rng_u64(&g_rng) % F2] = bad;
        else dh[(size_t)r * F + rng_u64(&g_rng) % F] = bad;
    }
    round_act(m, gu, n * (size_t)F2), round_act(m, dh, n * (size_t)F);
    float* sc = randu(n, 0.25f, 0.75f);
    const float* dsc = scaled ? up_f32(be, sc, n) : NULL;
    // the kernel's output in out_a, the plain kernel's in out_b (the backward: in place of gu)
    void *out_a = fwd ? poison(be, 2 * (size_t)n * F) : up_act(be, gu, n * (size_t)F2);
    void *out_b = fwd ? poison(be, 2 * (size_t)n * F) : up_act(be, gu, n * (size_t)F2);
    void *dgu = fwd ? up_act(be, gu, n * (size_t)F2) : NULL, *ddh = up_act(be, dh, n * (size_t)F);
    float *ds_a = poison(be, 4 * (size_t)n), *ds_b = poison(be, 4 * (size_t)n);
    uint8_t* dq = poison(be, (size_t)n * ldq);
    float* dsq = poison(be, 4 * (size_t)n * Kt);
    char lab[64];
    const int ran = fwd ? cuda_fp8_swiglu_fwd_rows(be, out_a, dgu, dsc, n, F, dq, ldq, dsq)
                        : cuda_fp8_swiglu_bwd_rows(be, out_a, dsc ? ds_a : NULL, ddh, out_a, dsc, n, F, dq, ldq, dsq);
    snprintf(lab, sizeof lab, "swiglu %s rows %dx%d ran", dir, n, F);
    record(lab, m->bf16, ran != m->bf16, 0);
    EXPECT(ran == m->bf16, "%s [%s]: returned %d", lab, m->name, ran);
    if (m->bf16) {
        const int off = fwd ? cuda_fp8_swiglu_fwd_rows(be, out_b, dgu, NULL, n, F - 8, dq, ldq, dsq)
                            : cuda_fp8_swiglu_bwd_rows(be, out_b, NULL, ddh, out_b, NULL, n, F - 8, dq, ldq, dsq);
        EXPECT(!off, "swiglu %s rows F %d: ran where F %% 128 != 0", dir, F - 8);
        if (fwd) be->swiglu_fwd(be, out_b, dgu, dsc, n, F);  // the plain kernels: the reference
        else be->swiglu_bwd(be, out_b, dsc ? ds_b : NULL, ddh, out_b, dsc, n, F);
        uint16_t *ga = xmalloc(2 * (size_t)n * C), *gb = xmalloc(2 * (size_t)n * C);
        be->to_host(be, ga, out_a, 2 * (size_t)n * C);
        be->to_host(be, gb, out_b, 2 * (size_t)n * C);
        snprintf(lab, sizeof lab, "swiglu %s rows %dx%d %s", dir, n, F, fwd ? "h" : "dgu");
        const int same = !memcmp(ga, gb, 2 * (size_t)n * C);
        record(lab, 1, !same, 0);
        EXPECT(same, "%s: differs from the plain SwiGLU kernel's", lab);
        if (dsc && !fwd) {
            snprintf(lab, sizeof lab, "swiglu %s rows %dx%d dscale", dir, n, F);
            cmp_bits(m, lab, down_f32(be, ds_a, n), down_f32(be, ds_b, n), n);
        }
        float* want = down_act(be, out_b, n * (size_t)C);
        uint8_t* q = xmalloc((size_t)n * C);
        float* s = xmalloc(4 * (size_t)n * Kt);
        fp8_quant_1x128(want, n, C, (size_t)C, q, s, NULL, NULL);
        uint8_t* gq = down_u8(be, dq, (size_t)n * ldq);
        float* gs = down_f32(be, dsq, (size_t)n * Kt);
        snprintf(lab, sizeof lab, "swiglu %s rows %dx%d codes", dir, n, F);
        check_codes(m, lab, gq, ldq, q, n, C);
        const float** at = xmalloc(sizeof(float*) * (size_t)n * Kt);
        for (int r = 0; r < n; r++)
            for (int t = 0; t < Kt; t++) at[(size_t)r * Kt + t] = gs + (size_t)t * n + r;
        snprintf(lab, sizeof lab, "swiglu %s rows %dx%d scales", dir, n, F);
        check_scales(m, lab, at, s, (size_t)n * Kt);
        free(at), free(gq), free(gs), free(q), free(s), free(want), free(ga), free(gb);
    }
    free(gu), free(dh), free(sc);
    dev_free_all();
}

static void test_swiglu_rows(void) {
    const struct { int n, F, scaled; } sh[] = {{37, 256, 1}, {130, 384, 1}, {5, 128, 0}, {64, 1152, 1}};
    FOR_MODES for (size_t si = 0; si < sizeof sh / sizeof sh[0]; si++)
        for (int fwd = 0; fwd < 2; fwd++) swiglu_rows_case(m, sh[si].n, sh[si].F, sh[si].scaled, fwd);
}

int main(void) {
    if (gpu_setup("test_cuda_fp8_quant")) return 1;
    if (!g_modes[0].gpu->fp8_ws_bytes) {  // test_cuda_fp8 fails this case on a GPU that should have FP8
        printf("skip: no FP8 GEMMs here (compute capability below 8.9, or a build without code for it)\n");
        gpu_teardown();
        TEST_END();
    }
    RUN(test_quant);
    RUN(test_swiglu_rows);
    gpu_teardown();
    TEST_END();
}
