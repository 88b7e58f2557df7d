// cpu_fp8.c — the CPU spec of e4m3 conversion, the block-scaled quantisers and the FP8 GEMM
// (src/fp8.h states the contract; docs/fp8.md the numerics).
#include <float.h>
#include <math.h>
#include <string.h>

#include "fp8.h"
#include "util.h"

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

// fp32 bits of 448 and of 2^-6 (the smallest normal e4m3)
enum { BITS_448 = 0x43E00000u, BITS_MIN_NORMAL = 0x3C800000u };

uint8_t fp8_e4m3_from_f32(float x) {
    const uint32_t u = f32_bits(x);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    const uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return 0x7Fu;         // NaN of either sign: 0x7F, as the CUDA conversion gives
    if (a >= BITS_448) return sign | 0x7Eu;    // ≥ 448 and inf: saturate (464 would be a tie to 448 anyway)
    if (a >= BITS_MIN_NORMAL) {
        // normal e4m3: round the 23-bit fp32 mantissa to 3 bits, nearest even; a carry moves into
        // the exponent field, which is what rounding across a binade means
        const uint32_t r = (a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;  // (E << 3) | m, E biased by 127
        return sign | (uint8_t)(r - (120u << 3));                    // rebias 127 → 7
    }
    // subnormal e4m3 (and the round up to 2^-6): the result is k · 2^-9, k in 0..8, and the code of
    // k · 2^-9 is k itself (k = 8 is exponent field 1, mantissa 0)
    const uint32_t E = a >> 23;
    if (E == 0) return sign;  // fp32 subnormal: far below 2^-10
    const uint32_t M = (a & 0x7FFFFFu) | 0x800000u;  // value = M · 2^(E-150); k = round(M · 2^(E-141))
    const uint32_t sh = 141u - E;                    // ≥ 21 since E ≤ 120
    if (sh > 24u) return sign;                       // value < 2^-10: rounds to 0
    uint32_t k = M >> sh;
    const uint32_t rem = M & ((1u << sh) - 1u), half = 1u << (sh - 1u);
    if (rem > half || (rem == half && (k & 1u))) k++;
    return sign | (uint8_t)k;
}

float fp8_e4m3_to_f32(uint8_t v) {
    const uint32_t e = (v >> 3) & 0xFu, m = v & 7u;
    float r;
    if (e == 0xFu && m == 7u) r = NAN;
    else if (e == 0) r = ldexpf((float)m, -9);
    else r = ldexpf((float)(8u + m), (int)e - 10);
    return (v & 0x80u) ? -r : r;
}

float fp8_scale_of_amax(float amax) {
    if (!(amax > 0)) return 1.0f;
    const float s = amax / (float)FP8_E4M3_MAX;
    return s < FLT_MIN ? FLT_MIN : s;
}

uint8_t fp8_quant_elem(float x, float s) {
    if (!isfinite(x)) return 0x7Fu;
    const float y = 1.0f / s;  // fl(1/s): the tile's reciprocal
    return fp8_e4m3_from_f32(x * y);
}

static inline float fabs_finite(float x) { return isfinite(x) ? fabsf(x) : 0.0f; }

// One 128×128 block of X at (r0, c0), h × w elements, read once: the row-wise tiles (one per row,
// this block's column tile) and the column-wise tiles (one per column, this block's row tile).
static void quant_block_1x128(const float* x, size_t ldx, int r0, int c0, int h, int w, int R, int C, uint8_t* q,
                              float* s, uint8_t* qt, float* st) {
    float ramax[FP8_TILE] = {0}, camax[FP8_TILE] = {0}, rs[FP8_TILE], cs[FP8_TILE];
    for (int i = 0; i < h; i++)
        for (int j = 0; j < w; j++) {
            const float a = fabs_finite(x[(size_t)(r0 + i) * ldx + c0 + j]);
            if (a > ramax[i]) ramax[i] = a;
            if (a > camax[j]) camax[j] = a;
        }
    const size_t ct = (size_t)c0 / FP8_TILE, rt = (size_t)r0 / FP8_TILE;
    for (int i = 0; i < h; i++) {
        rs[i] = fp8_scale_of_amax(ramax[i]);
        if (s) s[(size_t)(r0 + i) * fp8_tiles((size_t)C) + ct] = rs[i];
    }
    for (int j = 0; j < w; j++) {
        cs[j] = fp8_scale_of_amax(camax[j]);
        if (st) st[(size_t)(c0 + j) * fp8_tiles((size_t)R) + rt] = cs[j];
    }
    for (int i = 0; i < h; i++)
        for (int j = 0; j < w; j++) {
            const float v = x[(size_t)(r0 + i) * ldx + c0 + j];
            if (q) q[(size_t)(r0 + i) * C + c0 + j] = fp8_quant_elem(v, rs[i]);
            if (qt) qt[(size_t)(c0 + j) * R + r0 + i] = fp8_quant_elem(v, cs[j]);
        }
}

void fp8_quant_1x128(const float* x, int R, int C, size_t ldx, uint8_t* q, float* s, uint8_t* qt, float* st) {
#pragma omp parallel for schedule(static)
    for (int r0 = 0; r0 < R; r0 += FP8_TILE)
        for (int c0 = 0; c0 < C; c0 += FP8_TILE) {
            const int h = R - r0 < FP8_TILE ? R - r0 : FP8_TILE, w = C - c0 < FP8_TILE ? C - c0 : FP8_TILE;
            quant_block_1x128(x, ldx, r0, c0, h, w, R, C, q, s, qt, st);
        }
}

void fp8_quant_128x128(const float* w, int R, int C, size_t ldw, uint8_t* q, float* s, uint8_t* qt, float* st) {
    const size_t tr = fp8_tiles((size_t)R), tc = fp8_tiles((size_t)C);
#pragma omp parallel for schedule(static)
    for (int r0 = 0; r0 < R; r0 += FP8_TILE)
        for (int c0 = 0; c0 < C; c0 += FP8_TILE) {
            const int h = R - r0 < FP8_TILE ? R - r0 : FP8_TILE, bw = C - c0 < FP8_TILE ? C - c0 : FP8_TILE;
            float amax = 0;
            for (int i = 0; i < h; i++)
                for (int j = 0; j < bw; j++) {
                    const float a = fabs_finite(w[(size_t)(r0 + i) * ldw + c0 + j]);
                    if (a > amax) amax = a;
                }
            const float sc = fp8_scale_of_amax(amax);
            const size_t br = (size_t)r0 / FP8_TILE, bc = (size_t)c0 / FP8_TILE;
            if (s) s[br * tc + bc] = sc;
            if (st) st[bc * tr + br] = sc;
            for (int i = 0; i < h; i++)
                for (int j = 0; j < bw; j++) {
                    const uint8_t v = fp8_quant_elem(w[(size_t)(r0 + i) * ldw + c0 + j], sc);
                    if (q) q[(size_t)(r0 + i) * C + c0 + j] = v;
                    if (qt) qt[(size_t)(c0 + j) * R + r0 + i] = v;
                }
        }
}

void fp8_dequant_1x128(const uint8_t* q, const float* s, int R, int C, float* x) {
    const size_t tc = fp8_tiles((size_t)C);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            x[(size_t)r * C + c] = fp8_e4m3_to_f32(q[(size_t)r * C + c]) * s[(size_t)r * tc + c / FP8_TILE];
}

void fp8_gemm_tn(int M, int N, int K, const uint8_t* qa, const float* sa, const uint8_t* qb, const float* sb,
                 int b_blk, void* C, size_t ldc, int c_bf16) {
    // decode table: e4m3 → fp64 (exact)
    double dec[256];
    for (int v = 0; v < 256; v++) dec[v] = (double)fp8_e4m3_to_f32((uint8_t)v);
    const int nt = (int)fp8_tiles((size_t)K);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            const uint8_t *a = qa + (size_t)i * K, *b = qb + (size_t)j * K;
            const float* sbr = sb + (size_t)(b_blk ? j / FP8_TILE : j) * nt;
            float acc = 0.0f;
            for (int t = 0; t < nt; t++) {
                const int k0 = t * FP8_TILE, k1 = k0 + FP8_TILE < K ? k0 + FP8_TILE : K;
                double p = 0;  // exact: products are multiples of 2^-18 below 2^18, ≤ 128 of them
                for (int k = k0; k < k1; k++) p += dec[a[k]] * dec[b[k]];
                const float pt = (float)p;
                const float wt = sa[(size_t)i * nt + t] * sbr[t];
                const float term = wt * pt;
                acc = acc + term;
            }
            if (c_bf16) ((uint16_t*)C)[(size_t)i * ldc + j] = f32_to_bf16(acc);
            else ((float*)C)[(size_t)i * ldc + j] = acc;
        }
}
