// test_cpu_fp8.c — the FP8 spec (src/fp8.h): e4m3 rounding against a hand-checked table and
// against a brute-force nearest-on-the-grid search, decoding of all 256 codes, saturation, the
// block-scaled quantisers (round trip within half an ulp of the tile's scaled grid, exactness on
// the grid, partial tiles, both layouts equal to quantising the transpose bit for bit), and the
// emulated GEMM against fp64 GEMMs of the dequantised and of the original operands, each within a
// bound derived in docs/fp8.md.
#include <float.h>
#include <stdint.h>

#include "fp8.h"
#include "test.h"
#include "util.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void) {
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double uni(void) { return (double)(next_u64() >> 11) * 0x1p-53; }  // [0, 1)
static float sym(void) { return (float)(2 * uni() - 1); }                  // (-1, 1)
static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

// ---- e4m3 conversion ------------------------------------------------------------------------

// Every case below was checked by hand: the binade, the two grid neighbours and which is even.
static void e4m3_table(void) {
    static const struct {
        float x;
        uint8_t code;
        const char* why;
    } T[] = {
        {0.0f, 0x00, "zero"},
        {-0.0f, 0x80, "negative zero keeps its sign"},
        {0x1p-9f, 0x01, "min subnormal 2^-9"},
        {-0x1p-9f, 0x81, "negative min subnormal"},
        {0x1p-10f, 0x00, "2^-10: tie between 0 and 2^-9, to even 0"},
        {0x1.000002p-10f, 0x01, "just above 2^-10 rounds up to 2^-9"},
        {0x1.8p-10f, 0x01, "0.75·2^-9 → 2^-9"},
        {0x1.8p-9f, 0x02, "1.5·2^-9: tie between codes 1 and 2, to even 2"},
        {0x1.4p-8f, 0x02, "2.5·2^-9: tie between codes 2 and 3, to even 2"},
        {7 * 0x1p-9f, 0x07, "max subnormal 7·2^-9"},
        {7.5f * 0x1p-9f, 0x08, "7.5·2^-9: tie between max subnormal (7, odd) and min normal (8), to 2^-6"},
        {0x1p-6f, 0x08, "min normal 2^-6"},
        {0x1.1p-6f, 0x08, "1.0625·2^-6: tie between m=0 and m=1, to even m=0"},
        {0x1.3p-6f, 0x0A, "1.1875·2^-6: tie between m=1 and m=2, to even m=2"},
        {1.0f, 0x38, "1.0"},
        {1.0625f, 0x38, "1.0625: tie, to even 1.0"},
        {0x1.100002p0f, 0x39, "just above the tie rounds to 1.125"},
        {1.1875f, 0x3A, "1.1875: tie between 1.125 and 1.25, to even 1.25"},
        {-2.0f, 0xC0, "-2"},
        {0.1f, 0x1D, "0.1 → 1.625·2^-4 = 0.1015625"},
        {15.5f, 0x58, "15.5: tie between 15 (m=7, odd) and 16 (next binade m=0), to 16"},
        {17.0f, 0x58, "17: tie between 16 and 18, to even 16"},
        {19.0f, 0x5A, "19: tie between 18 and 20, to even 20"},
        {240.0f, 0x77, "240 = 1.875·2^7"},
        {256.0f, 0x78, "256 = 2^8"},
        {432.0f, 0x7E, "432: tie between 416 (m=5) and 448 (m=6), to even 448"},
        {424.0f, 0x7D, "424 → 416"},
        {448.0f, 0x7E, "max finite 448"},
        {-448.0f, 0xFE, "-448"},
        {449.0f, 0x7E, "449 saturates"},
        {464.0f, 0x7E, "464 (midpoint to the NaN code's 480) saturates to 448"},
        {480.0f, 0x7E, "480 saturates"},
        {1e30f, 0x7E, "large saturates"},
        {-FLT_MAX, 0xFE, "-FLT_MAX saturates"},
        {INFINITY, 0x7E, "+inf saturates (SATFINITE)"},
        {-INFINITY, 0xFE, "-inf saturates (SATFINITE)"},
        {FLT_MIN, 0x00, "FLT_MIN → 0"},
        {0x1p-149f, 0x00, "fp32 subnormal → 0"},
        {-0x1p-149f, 0x80, "negative fp32 subnormal → -0"},
    };
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
        const uint8_t c = fp8_e4m3_from_f32(T[i].x);
        EXPECT(c == T[i].code, "%s: %a → 0x%02X, expected 0x%02X", T[i].why, T[i].x, c, T[i].code);
    }
    EXPECT(fp8_e4m3_from_f32(NAN) == 0x7F, "NaN → 0x%02X", fp8_e4m3_from_f32(NAN));
    EXPECT(fp8_e4m3_from_f32(-NAN) == 0x7F, "-NaN → 0x%02X (the sign is dropped)", fp8_e4m3_from_f32(-NAN));
    EXPECT(fp8_e4m3_from_f32(bits_f32(0x7F800001u)) == 0x7F, "signalling NaN → NaN");
    // decoding of the landmarks
    EXPECT(fp8_e4m3_to_f32(0x01) == 0x1p-9f, "0x01");
    EXPECT(fp8_e4m3_to_f32(0x07) == 7 * 0x1p-9f, "0x07");
    EXPECT(fp8_e4m3_to_f32(0x08) == 0x1p-6f, "0x08");
    EXPECT(fp8_e4m3_to_f32(0x7E) == 448.0f, "0x7E");
    EXPECT(fp8_e4m3_to_f32(0xFE) == -448.0f, "0xFE");
    EXPECT(fp8_e4m3_to_f32(0x38) == 1.0f, "0x38");
    EXPECT(isnan(fp8_e4m3_to_f32(0x7F)) && isnan(fp8_e4m3_to_f32(0xFF)), "NaN codes");
    EXPECT(fp8_e4m3_to_f32(0x80) == 0 && signbit(fp8_e4m3_to_f32(0x80)), "0x80 is -0");
}

// All 256 codes: the 254 non-NaN ones decode to distinct values, increasing with the magnitude
// code, and encode back to themselves; 0x78 (256) is the first code of the top binade.
static void e4m3_all_codes(void) {
    float prev = -1;
    for (int c = 0; c < 0x7F; c++) {
        const float v = fp8_e4m3_to_f32((uint8_t)c), n = fp8_e4m3_to_f32((uint8_t)(c | 0x80));
        EXPECT(isfinite(v) && v > prev, "code 0x%02X = %g not above %g", c, v, prev);
        EXPECT(n == -v && signbit(n), "code 0x%02X negative", c | 0x80);
        EXPECT(fp8_e4m3_from_f32(v) == c, "0x%02X round trip", c);
        EXPECT(fp8_e4m3_from_f32(n) == (c | 0x80), "0x%02X round trip", c | 0x80);
        prev = v;
    }
    EXPECT(prev == 448.0f, "largest %g", prev);
    EXPECT(fp8_e4m3_to_f32(0x78) == 256.0f, "0x78");
}

// The nearest e4m3 value to x (fp64 distance), ties to the even code, saturating: a reference
// that knows nothing of bit tricks.
static uint8_t e4m3_nearest(float x) {
    if (isnan(x)) return 0x7F;
    const double a = fabs((double)x);
    int best = 0;
    double bd = INFINITY;
    for (int c = 0; c < 0x7F; c++) {
        const double d = fabs(a - (double)fp8_e4m3_to_f32((uint8_t)c));
        if (d < bd || (d == bd && (c & 1) == 0)) bd = d, best = c;
    }
    return (uint8_t)((signbit(x) ? 0x80 : 0) | best);
}

// Random fp32 over every magnitude that matters (2^-14 .. 2^10), every grid midpoint and its fp32
// neighbours, against the brute-force nearest.
static void e4m3_vs_nearest(void) {
    int bad = 0;
    for (int i = 0; i < 200000 && bad < 5; i++) {
        const uint32_t e = 127 - 14 + (uint32_t)(next_u64() % 25);  // biased exponent
        const float x = bits_f32((uint32_t)(next_u64() & 0x807FFFFFu) | (e << 23));
        const uint8_t got = fp8_e4m3_from_f32(x), want = e4m3_nearest(x);
        if (got != want) {
            bad++;
            EXPECT(0, "%a → 0x%02X, nearest 0x%02X", x, got, want);
        }
    }
    for (int c = 0; c < 0x7E; c++) {
        const double lo = fp8_e4m3_to_f32((uint8_t)c), hi = fp8_e4m3_to_f32((uint8_t)(c + 1));
        const float mid = (float)((lo + hi) / 2);  // exact in fp32
        EXPECT((double)mid == (lo + hi) / 2, "midpoint of 0x%02X exact", c);
        const float xs[3] = {nextafterf(mid, 0), mid, nextafterf(mid, INFINITY)};
        for (int k = 0; k < 3; k++) {
            for (int sg = 0; sg < 2; sg++) {
                const float x = sg ? -xs[k] : xs[k];
                const uint8_t got = fp8_e4m3_from_f32(x), want = e4m3_nearest(x);
                EXPECT(got == want, "%a → 0x%02X, nearest 0x%02X", x, got, want);
            }
        }
        // the tie goes to the even code
        EXPECT(fp8_e4m3_from_f32(mid) == (c & 1 ? c + 1 : c), "tie above 0x%02X", c);
    }
}

// Saturation never gives NaN from a finite input: every finite fp32 above 448 in steps through
// all exponents and random mantissas, and whole tiles with huge and tiny magnitudes.
static void e4m3_saturation(void) {
    for (uint32_t e = 135; e < 255; e++)
        for (int r = 0; r < 64; r++) {
            const float x = bits_f32((e << 23) | (uint32_t)(next_u64() & 0x7FFFFFu));
            if (!(x > 448.0f)) continue;
            EXPECT(fp8_e4m3_from_f32(x) == 0x7E && fp8_e4m3_from_f32(-x) == 0xFE, "%a", x);
        }
    const int R = 4, C = 300;
    float* x = malloc(sizeof(float) * R * C);
    const float mags[4] = {FLT_MAX, 1e30f, 1e-30f, 1e-42f /* fp32 subnormal */};
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) x[r * C + c] = mags[r] * (c == 7 ? 1.0f : sym());
    uint8_t *q = malloc(R * C), *qt = malloc(R * C);
    float *s = malloc(sizeof(float) * R * 3), *st = malloc(sizeof(float) * C);
    fp8_quant_1x128(x, R, C, C, q, s, qt, st);
    for (int i = 0; i < R * C; i++) {
        EXPECT((q[i] & 0x7F) != 0x7F && (qt[i] & 0x7F) != 0x7F, "NaN code from finite input at %d", i);
        const float d = fp8_e4m3_to_f32(q[i]) * s[(i / C) * 3 + (i % C) / FP8_TILE];
        EXPECT(isfinite(d), "dequantised %d not finite", i);
    }
    for (int i = 0; i < R * 3; i++) EXPECT(isfinite(s[i]) && s[i] >= FLT_MIN, "scale %d = %g", i, s[i]);
    EXPECT(s[0] == FLT_MAX / 448.0f, "FLT_MAX tile scale %g", s[0]);
    EXPECT(s[3 * 3] == FLT_MIN, "subnormal tile scale clamps to FLT_MIN: %g", s[9]);
    free(x), free(q), free(qt), free(s), free(st);
}

// ---- quantisers ------------------------------------------------------------------------------

// Half the spacing of the e4m3 grid at |y| (|y| ≤ 448·(1+2^-22)): 2^-10 below 2^-6, else 2^(e-4).
static double half_ulp(double y) {
    y = fabs(y);
    if (y < 0x1p-6) return 0x1p-10;
    int e;
    frexp(y, &e);  // y = f·2^e, f in [0.5, 1): binade 2^(e-1)
    if (e - 1 > 8) e = 9;
    return ldexp(1, e - 1 - 4);
}

// R×C with rows of very different magnitudes (2^-40 .. 2^40), outliers, and some exact zeros.
static float* make_data(int R, int C) {
    float* x = malloc(sizeof(float) * (size_t)R * C + 1);
    for (int r = 0; r < R; r++) {
        const double m = ldexp(1, (int)(next_u64() % 81) - 40);
        for (int c = 0; c < C; c++) {
            double v = m * sym();
            const uint64_t u = next_u64() % 97;
            if (u == 0) v *= 300;          // outlier
            else if (u == 1) v = 0;        // exact zero
            else if (u < 10) v *= 1e-3;    // small values in the same tile: subnormal e4m3
            x[(size_t)r * C + c] = (float)v;
        }
    }
    return x;
}

// Round trip: for each element, y = fl(x · fl(1/s)) and q = e4m3(y) differ by at most half an ulp
// of the grid at y, so |x − s·q| ≤ s·(half_ulp(y) + |x/s − y|); scale = fl(amax/448); max |q| = 448 in
// every tile that is not all zero; all-zero tiles get scale 1 and codes 0.
static void quant_round_trip(void) {
    const int shapes[][2] = {{64, 1000}, {3, 128}, {130, 257}, {1, 5}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        const int R = shapes[sh][0], C = shapes[sh][1], tc = (int)fp8_tiles(C);
        float* x = make_data(R, C);
        for (int c = 0; c < C && C > 256; c++) x[c] = 0;  // one all-zero row (its tiles)
        uint8_t* q = malloc((size_t)R * C);
        float* s = malloc(sizeof(float) * R * tc);
        fp8_quant_1x128(x, R, C, C, q, s, NULL, NULL);
        float* d = malloc(sizeof(float) * (size_t)R * C);
        fp8_dequant_1x128(q, s, R, C, d);
        int bad = 0;
        for (int r = 0; r < R; r++)
            for (int t = 0; t < tc; t++) {
                const int c0 = t * FP8_TILE, c1 = c0 + FP8_TILE < C ? c0 + FP8_TILE : C;
                float amax = 0;
                int maxcode = 0;
                for (int c = c0; c < c1; c++) amax = fmaxf(amax, fabsf(x[(size_t)r * C + c]));
                const float sc = s[r * tc + t];
                EXPECT(sc == (amax > 0 ? amax / 448.0f : 1.0f), "scale of tile (%d,%d) %g, amax %g", r, t, sc, amax);
                for (int c = c0; c < c1; c++) {
                    const size_t i = (size_t)r * C + c;
                    const float y = x[i] * (1.0f / sc);
                    const double qv = fp8_e4m3_to_f32(q[i]);
                    if ((q[i] & 0x7F) > maxcode) maxcode = q[i] & 0x7F;
                    const double e1 = fabs((double)y - qv), h = half_ulp(y);
                    const double e2 = fabs((double)x[i] - (double)sc * qv);
                    const double lim2 = (double)sc * (h + fabs((double)x[i] / sc - (double)y));
                    if ((e1 > h || e2 > lim2 * (1 + 0x1p-40) /* fp64 evaluation of the bound */ || d[i] != (float)(qv * sc)) && bad++ < 5)
                        EXPECT(0, "x %a s %a: q %g, |y-q| %g > %g or |x-sq| %g > %g", x[i], sc, qv, e1, h, e2, lim2);
                }
                if (amax > 0) EXPECT(maxcode == 0x7E, "tile (%d,%d) max code 0x%02X", r, t, maxcode);
                else EXPECT(maxcode == 0, "zero tile codes");
            }
        free(x), free(q), free(s), free(d);
    }
}

// Values already on a tile's grid (power-of-two scale, every tile holding ±448·s) come back
// exactly, with the expected codes, at many magnitudes.
static void quant_exact_on_grid(void) {
    const int R = 41, C = 200, tc = 2;
    float* x = malloc(sizeof(float) * R * C);
    uint8_t *want = malloc(R * C), *q = malloc(R * C), *qt = malloc(R * C);
    float *s = malloc(sizeof(float) * R * tc), *st = malloc(sizeof(float) * C);
    for (int r = 0; r < R; r++) {
        const int e = 2 * r - 40;  // scales 2^-40 .. 2^40
        for (int c = 0; c < C; c++) {
            uint8_t code = (uint8_t)(next_u64() % 0x7F);  // any finite code, either sign
            if (next_u64() & 1) code |= 0x80;
            if (c == 0 || c == 128) code = 0x7E;  // each tile holds 448
            want[r * C + c] = code == 0x80 ? 0x80 : code;
            x[r * C + c] = ldexpf(fp8_e4m3_to_f32(code), e);
        }
    }
    fp8_quant_1x128(x, R, C, C, q, s, qt, st);
    for (int r = 0; r < R; r++) {
        for (int t = 0; t < tc; t++) EXPECT(s[r * tc + t] == ldexpf(1, 2 * r - 40), "row %d scale %a", r, s[r * tc + t]);
        for (int c = 0; c < C; c++) {
            const int i = r * C + c;
            EXPECT(q[i] == want[i], "row %d col %d code 0x%02X want 0x%02X", r, c, q[i], want[i]);
            EXPECT(fp8_e4m3_to_f32(q[i]) * s[r * tc + c / FP8_TILE] == x[i], "row %d col %d not exact", r, c);
        }
    }
    free(x), free(want), free(q), free(qt), free(s), free(st);
}

// An element is quantised as e4m3(fl(x · fl(1/s))), the tile's reciprocal rounded once, not as the
// correctly rounded quotient: with x = 1.0625·s exact, x / s is the tie 1.0625 (which rounds to the
// even 1.0, 0x38), but for some of these s fl(1/s) is rounded up and x·fl(1/s) lands above the tie
// (1.125, 0x39); the counts make sure both kinds are here, so the case tells the two rules apart.
static void quant_reciprocal(void) {
    int above = 0, at = 0, bad = 0;
    for (int k = 1; k < (1 << 18) && bad < 5; k += 61) {  // s over [1, 2) with ≤ 19 significant bits
        const float s = 1.0f + (float)k * 0x1p-18f, x = 1.0625f * s;  // 17·s fits 24 bits: x exact
        const double y = (double)(float)(1.0 / (double)s);           // fl(1/s), computed apart
        const double p = (double)x * y;                               // the exact product
        const uint8_t want = p > 1.0625 + 0x1p-24 ? 0x39 : 0x38;      // fl(p) is above the tie, or on/below it
        if (p > 1.0625 + 0x1p-24) above++;
        else at++;
        const int ok = (double)x == 1.0625 * (double)s && fp8_quant_elem(x, s) == want &&
                       fp8_quant_elem(-x * 0x1p-20f, s * 0x1p-20f) == (want | 0x80);
        if (!ok) {
            bad++;
            EXPECT(0, "k %d: s %a x %a → 0x%02X, want 0x%02X", k, s, x, fp8_quant_elem(x, s), want);
        }
    }
    EXPECT(above > 0 && at > 0, "the products land %d times above the tie and %d times on or below", above, at);
}

// The GPU quantisers (cuda/cuda_fp8_quant.cu, scale_of_amax) form fl(amax / 448) without a
// division: q = fl(amax · fl(1/448)), then q + fl(1/448) · (amax − 448·q) by two FMAs (the inner
// one exact). That equals fp8_scale_of_amax for every positive finite amax, once both take the
// FLT_MIN floor (below it the two can differ by an ulp of a subnormal): checked here for all 2^31.
static void scale_without_division(void) {
    const float r = 1.0f / 448.f;
    long bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static)
    for (long b = 1; b < 0x7f800000L; b++) {
        const uint32_t u = (uint32_t)b;
        float x;
        memcpy(&x, &u, 4);
        const float q = x * r;
        float s = fmaf(fmaf(-q, 448.f, x), r, q);
        if (s < FLT_MIN) s = FLT_MIN;
        bad += f32_bits(s) != f32_bits(fp8_scale_of_amax(x));
    }
    EXPECT(bad == 0, "%ld positive finite amax give another scale without the division", bad);
}

static float* transpose(const float* x, int R, int C) {
    float* t = malloc(sizeof(float) * (size_t)R * C + 1);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) t[(size_t)c * R + r] = x[(size_t)r * C + c];
    return t;
}
static int same_f32(const float* a, const float* b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (f32_bits(a[i]) != f32_bits(b[i])) return 0;
    return 1;
}

// Both layouts from one call equal the row-wise quantisation of X and of the explicit X^T, bit for
// bit, for shapes with partial tiles in either dimension and a padded row stride; the same for
// the 128×128 quantiser, whose transposed scales are the transposed scale grid.
static void quant_layouts(void) {
    const int shapes[][2] = {{300, 200}, {130, 129}, {1, 5}, {128, 256}, {257, 1}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        const int R = shapes[sh][0], C = shapes[sh][1], ld = C + 3;
        const size_t n = (size_t)R * C, tr = fp8_tiles(R), tc = fp8_tiles(C);
        float* x0 = make_data(R, C);
        x0[n / 2] = NAN, x0[n / 3] = -INFINITY;  // non-finite: NaN codes, and no effect on scales
        float* x = malloc(sizeof(float) * R * ld);
        for (int r = 0; r < R; r++)
            for (int c = 0; c < ld; c++) x[r * ld + c] = c < C ? x0[r * C + c] : 1e30f;  // padding never read
        float* xt = transpose(x0, R, C);
        uint8_t *q = malloc(n), *qt = malloc(n), *q2 = malloc(n), *qt2 = malloc(n);
        float *s = malloc(sizeof(float) * R * tc), *st = malloc(sizeof(float) * C * tr);
        float *s2 = malloc(sizeof(float) * R * tc), *st2 = malloc(sizeof(float) * C * tr);
        fp8_quant_1x128(x, R, C, ld, q, s, qt, st);
        fp8_quant_1x128(x0, R, C, C, q2, s2, NULL, NULL);
        fp8_quant_1x128(xt, C, R, R, qt2, st2, NULL, NULL);
        EXPECT(!memcmp(q, q2, n) && same_f32(s, s2, R * tc), "%dx%d row-wise differs", R, C);
        EXPECT(!memcmp(qt, qt2, n) && same_f32(st, st2, C * tr), "%dx%d column-wise differs from X^T", R, C);
        EXPECT(q[n / 2] == 0x7F && q[n / 3] == 0x7F, "%dx%d non-finite codes 0x%02X 0x%02X", R, C, q[n / 2],
               q[n / 3]);
        for (size_t i = 0; i < (size_t)R * tc; i++) EXPECT(isfinite(s[i]), "scale %zu", i);

        // 128×128 blocks
        float *bs = malloc(sizeof(float) * tr * tc), *bst = malloc(sizeof(float) * tr * tc);
        float *bs2 = malloc(sizeof(float) * tr * tc), *bst2 = malloc(sizeof(float) * tr * tc);
        fp8_quant_128x128(x, R, C, ld, q, bs, qt, bst);
        fp8_quant_128x128(xt, C, R, R, qt2, bst2, q2, bs2);
        EXPECT(!memcmp(qt, qt2, n) && same_f32(bst, bst2, tr * tc), "%dx%d 128x128 transposed differs", R, C);
        EXPECT(!memcmp(q, q2, n) && same_f32(bs, bs2, tr * tc), "%dx%d 128x128 differs", R, C);
        for (size_t br = 0; br < tr; br++)
            for (size_t bc = 0; bc < tc; bc++) {
                float amax = 0;
                for (size_t r = br * 128; r < (size_t)R && r < br * 128 + 128; r++)
                    for (size_t c = bc * 128; c < (size_t)C && c < bc * 128 + 128; c++)
                        if (isfinite(x0[r * C + c])) amax = fmaxf(amax, fabsf(x0[r * C + c]));
                EXPECT(bs[br * tc + bc] == fp8_scale_of_amax(amax) && bst[bc * tr + br] == bs[br * tc + bc],
                       "block (%zu,%zu) scale", br, bc);
            }
        free(x0), free(x), free(xt), free(q), free(qt), free(q2), free(qt2);
        free(s), free(st), free(s2), free(st2), free(bs), free(bst), free(bs2), free(bst2);
    }
}

// ---- the emulated GEMM ----------------------------------------------------------------------

static const double U = 0x1p-24;  // unit roundoff of fp32
static double gamma_n(int n) { return n * U / (1 - n * U); }

// A[M,K] 1×128, B[N,K] 1×128 or 128×128; C = A·B^T in fp32 and bf16 against
//  (1) the fp64 GEMM of the dequantised operands Σ_k qa·sa·qb·sb (exact in fp64 per term):
//      |C − D| ≤ γ_{T+2} · Σ_k |qa sa||qb sb|  (+ 2^-8·|C| for bf16 output: half a bf16 ulp),
//      T = number of K tiles (docs/fp8.md: one rounding each for P_t, w_t, w_t·P_t and T−1 adds);
//  (2) the fp64 GEMM of the original operands: with the per-element quantisation error
//      |a − sa·qa| ≤ ε|a| + τ_a, ε = 2^-4 + 2^-22 (half an e4m3 ulp, and the two fp32 roundings of
//      y = fl(a · fl(1/sa)): (1+u)² − 1 ≤ 2u + u², times 1 + 2^-4), τ_a = 2^-10·sa, the bound of (1) plus
//      Σ_k (ε|a|+τ_a)|b| + |a|(ε|b|+τ_b) + (ε|a|+τ_a)(ε|b|+τ_b).
static void gemm_case(int M, int N, int K, int b_blk) {
    const int nt = (int)fp8_tiles(K), tn = (int)fp8_tiles(N);
    float *A = make_data(M, K), *B = make_data(N, K);
    uint8_t *qa = malloc((size_t)M * K + 1), *qb = malloc((size_t)N * K + 1);
    float* sa = malloc(sizeof(float) * M * nt + 4);
    float* sb = malloc(sizeof(float) * (b_blk ? tn : N) * nt + 4);
    fp8_quant_1x128(A, M, K, K, qa, sa, NULL, NULL);
    if (b_blk) fp8_quant_128x128(B, N, K, K, qb, sb, NULL, NULL);
    else fp8_quant_1x128(B, N, K, K, qb, sb, NULL, NULL);
    const int ldc = N + 1;
    float* C = malloc(sizeof(float) * M * ldc);
    uint16_t* Ch = malloc(sizeof(uint16_t) * M * ldc);
    for (int i = 0; i < M * ldc; i++) C[i] = NAN, Ch[i] = 0x7FC0;
    fp8_gemm_tn(M, N, K, qa, sa, qb, sb, b_blk, C, ldc, 0);
    fp8_gemm_tn(M, N, K, qa, sa, qb, sb, b_blk, Ch, ldc, 1);
    const double eps = 0x1p-4 + 0x1p-22, g = gamma_n(nt + 2);
    int bad = 0, nonzero = 0;
    double worst_ratio = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double D = 0, Dabs = 0, X = 0, Q = 0;
            for (int k = 0; k < K; k++) {
                const int t = k / FP8_TILE;
                const double s_a = sa[i * nt + t], s_b = sb[(b_blk ? j / FP8_TILE : j) * nt + t];
                const double da = fp8_e4m3_to_f32(qa[(size_t)i * K + k]) * s_a;
                const double db = fp8_e4m3_to_f32(qb[(size_t)j * K + k]) * s_b;
                const double a = A[(size_t)i * K + k], b = B[(size_t)j * K + k];
                D += da * db, Dabs += fabs(da * db), X += a * b;
                const double ea = eps * fabs(a) + 0x1p-10 * s_a, eb = eps * fabs(b) + 0x1p-10 * s_b;
                Q += ea * fabs(b) + fabs(a) * eb + ea * eb;
            }
            const double c = C[(size_t)i * ldc + j], ch = bf16_to_f32(Ch[(size_t)i * ldc + j]);
            const double b1 = g * Dabs, b1h = b1 + 0x1p-8 * fabs(c);  // bf16: half an ulp ≤ 2^-8·|c|
            if (c != D) nonzero++;
            if (Q + b1 > 0) worst_ratio = fmax(worst_ratio, fabs(c - X) / (Q + b1));
            EXPECT(Ch[(size_t)i * ldc + j] == f32_to_bf16((float)c), "bf16 output is bf16(fp32 output)");
            if ((fabs(c - D) > b1 || fabs(ch - D) > b1h || fabs(c - X) > b1 + Q || fabs(ch - X) > b1h + Q) &&
                bad++ < 5)
                EXPECT(0, "%dx%dx%d blk %d (%d,%d): C %.9g dequant %.9g (bound %.3g) orig %.9g (bound %.3g)", M, N,
                       K, b_blk, i, j, c, D, b1, X, b1 + Q);
        }
    for (int i = 0; i < M; i++) EXPECT(isnan(C[(size_t)i * ldc + N]), "padding column written");
    printf("  %dx%dx%d %s: %d/%d outputs differ from the fp64 dequantised GEMM; worst |C-X|/bound %.3f\n", M, N,
           K, b_blk ? "BLK128x128" : "VEC128", nonzero, M * N, worst_ratio);
    free(A), free(B), free(qa), free(qb), free(sa), free(sb), free(C), free(Ch);
}

static void gemm_vs_fp64(void) {
    gemm_case(37, 45, 1000, 0);   // partial last K tile, VEC128 × VEC128 (the weight-gradient form)
    gemm_case(37, 300, 1000, 1);  // VEC128 × BLK128x128 (forward and data gradient), partial N block
    gemm_case(5, 7, 128, 0);      // exactly one tile
    gemm_case(3, 130, 77, 1);     // K below one tile
    gemm_case(9, 9, 2048, 1);     // 16 tiles
}

// Known values, every rounding hand-checked: three tiles whose terms are 256, 2^-16, 2^-16. In the
// stated order (t = 0, 1, 2) each 2^-16 is a tie at 256 (half its ulp) and rounds to even 256;
// summing the small terms first would give 256 + 2^-15. And K = 0 gives +0.
static void gemm_known(void) {
    const int K = 384;
    uint8_t qa[384], qb[384];
    const float sa[3] = {2.0f, 0x1p-24f, 0x1p-24f}, sb[3] = {0.5f, 1.0f, 1.0f};
    for (int k = 0; k < K; k++) qa[k] = 0x38, qb[k] = 0x40;  // 1 · 2, so P_t = 256 for each tile
    float c = NAN;
    fp8_gemm_tn(1, 1, K, qa, sa, qb, sb, 0, &c, 1, 0);
    EXPECT(c == 256.0f, "tiles in order give %a", c);
    const float sa2[3] = {2.0f, 0x1p-14f, 0x1p-24f};  // 256 + 2^-6 + 2^-16 → 256 + 2^-6 (2^-16 below half an ulp)
    fp8_gemm_tn(1, 1, K, qa, sa2, qb, sb, 0, &c, 1, 0);
    EXPECT(c == 256.0f + 0x1p-6f, "three tiles give %a", c);
    uint16_t h = 0;
    fp8_gemm_tn(1, 1, K, qa, sa2, qb, sb, 0, &h, 1, 1);
    EXPECT(h == 0x4380, "bf16 output 0x%04X (256)", h);
    c = 7;
    fp8_gemm_tn(1, 1, 0, qa, sa, qb, sb, 0, &c, 1, 0);
    EXPECT(c == 0 && !signbit(c), "K = 0 gives +0, got %g", c);
}

int main(void) {
    RUN(e4m3_table);
    RUN(e4m3_all_codes);
    RUN(e4m3_vs_nearest);
    RUN(e4m3_saturation);
    RUN(quant_round_trip);
    RUN(quant_exact_on_grid);
    RUN(quant_reciprocal);
    RUN(scale_without_division);
    RUN(quant_layouts);
    RUN(gemm_known);
    RUN(gemm_vs_fp64);
    TEST_END();
}
