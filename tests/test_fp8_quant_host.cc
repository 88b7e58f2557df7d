// test_fp8_quant_host.cc — the CUDA FP8 quantisers' own source (cuda/cuda_fp8_quant.cu: the
// kernels and their launchers) run on the CPU through the host stand-in (tests/host_cuda), against
// the spec (src/fp8.h) bit for bit: codes, scales in the GEMMs' layouts, the zero padding up to ldq
// / ldk, nothing written past it (AddressSanitizer) and nothing left unwritten (poisoned outputs).
// What it checks is the kernels' indexing, tiling, shuffles and launch arithmetic, and the
// reciprocal-and-correction division on the host's IEEE arithmetic; tests/gpu/test_cuda_fp8_quant.c
// checks the same on a GPU.
#include <cuda_runtime.h>

#include "backend_host.h"
#include "fp8_smap.cuh"
#include "test.h"

// cuda_fp8_quant.cu's test hooks
extern "C" void cuda_fp8_quant_rows(Backend* be, const void* x, int R, int C, int ldx, uint8_t* q, int ldq, float* s0,
                                    float* s1, int split, int chunk);
extern "C" void cuda_fp8_quant_cols(Backend* be, const void* x, int n, int C, int ldx, uint8_t* qt, int ldk, float* st,
                                    uint8_t* q, int ldq, float* s);
extern "C" void cuda_fp8_quant_blocks(Backend* be, const void* w, int R, int C, int ldw, int trans, uint8_t* q, int ldq,
                                      float* s);

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd() {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}
static float bf16_round(float f) {  // to nearest even; non-finite kept
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}
static size_t pad(size_t x, size_t a) { return (x + a - 1) / a * a; }
static int tiles(int n) { return (n + FP8_TILE - 1) / FP8_TILE; }

// [R, C] (stride ld): rows over 60 binades, zeros and −0, ±inf and NaN, an all-zero row, fp32
// subnormals (scale raised to FLT_MIN), a row near FLT_MAX, rows of scales near 2^-120, and rows
// of quotients at and within 3 ulp of e4m3 rounding boundaries at scales 3, 3·2^-60 and 3·2^-115
// (the last two either side of the 2^-64 where the kernels' division changes method).
static std::vector<float> make_data(int R, int C, int ld) {
    std::vector<float> x((size_t)R * ld);
    for (int r = 0; r < R; r++) {
        // rows 8-23: scales near 2^-120, where a reciprocal's correction would leave the normal range
        const int e = (r >= 8 && r < 24) ? -104 - r / 2 : (int)(rnd() % 61) - 30;
        for (int c = 0; c < ld; c++) {
            const uint64_t u = rnd();
            float v = ldexpf((float)((u >> 11) & 0xffffff) / 16777216.f, e - (int)((u >> 40) % 12));
            if (u >> 63) v = -v;
            if (u % 97 == 0) v = 0.f;
            if (u % 101 == 0) v = -0.f;
            if (u % 211 == 0) v = (u & 2) ? INFINITY : -INFINITY;
            if (u % 227 == 0) v = NAN;
            x[(size_t)r * ld + c] = v;
        }
    }
    auto row = [&](int r, auto f) {
        if (r < R)
            for (int c = 0; c < C; c++) x[(size_t)r * ld + c] = f(c);
    };
    row(1, [](int) { return 0.f; });
    row(2, [](int c) { return 1e-39f * (float)(c % 7 - 3); });
    row(4, [](int c) { return 3e38f * (float)((c * 37) % 11 - 5) / 5.f; });
    const float mul[3] = {1.f, 0x1p-60f, 0x1p-115f};
    for (int b = 0; b < 3; b++)
        row(5 + b, [&](int c) {
            const int j = c % FP8_TILE, t = c / FP8_TILE;
            if (j == 0) return 1344.f * mul[b];  // scale 3·mul
            const uint8_t v = (uint8_t)((j * 5 + t * 11) % 126);
            float y = 3.f * mul[b] * 0.5f * (fp8_e4m3_to_f32(v) + fp8_e4m3_to_f32((uint8_t)(v + 1)));
            for (int d = j % 7 - 3; d != 0; d += d > 0 ? -1 : 1) y = nextafterf(y, d > 0 ? INFINITY : 0.f);
            return (c & 1) ? -y : y;
        });
    return x;
}

struct Case {
    int R, C, ld;
    int al;   // ldq / ldk rounded to this (16: the GEMMs' layout; 4: the 4-byte stores)
    int off;  // the input starts one element past 16 bytes (the element-wise loads)
};
static const Case CASES[] = {{37, 300, 300, 16, 0}, {130, 256, 264, 16, 0}, {256, 1024, 1024, 16, 0},
                             {5, 129, 131, 16, 0},  {300, 520, 520, 16, 0}, {129, 384, 392, 4, 0},
                             {200, 136, 136, 4, 1}, {128, 128, 128, 16, 0}, {1, 8, 8, 16, 0}};

// One case in one dtype: x as the spec sees it (fp32, bf16-rounded for bf16) and as the kernels do.
struct Input {
    int R, C, ld, bf;
    std::vector<float> x;
    std::vector<uint8_t> raw;
    const void* dev;
};
static Input make_input(const Case& k, int bf) {
    Input in{k.R, k.C, k.ld, bf, make_data(k.R, k.C, k.ld), {}, nullptr};
    if (bf)
        for (auto& v : in.x) v = bf16_round(v);
    const size_t es = bf ? 2 : 4, n = (size_t)k.R * k.ld;
    in.raw.assign(n * es + 32, 0);
    uint8_t* p = (uint8_t*)(((uintptr_t)in.raw.data() + 15) / 16 * 16) + (k.off ? es : 0);
    for (size_t i = 0; i < n; i++) {
        if (bf) {
            uint32_t u;
            memcpy(&u, &in.x[i], 4);
            const uint16_t h = (uint16_t)(u >> 16);
            memcpy(p + 2 * i, &h, 2);
        } else {
            memcpy(p + 4 * i, &in.x[i], 4);
        }
    }
    in.dev = p;
    return in;
}

// Codes [rows, ld] against want [rows, n] with zeros in [n, ld); mismatches counted.
static size_t bad_codes(const std::vector<uint8_t>& got, size_t ld, const uint8_t* want, int rows, int n) {
    size_t bad = 0;
    for (int r = 0; r < rows; r++)
        for (size_t c = 0; c < ld; c++) bad += got[r * ld + c] != (c < (size_t)n ? want[(size_t)r * n + c] : 0);
    return bad;
}
static bool same(float a, float b) { return memcmp(&a, &b, 4) == 0; }

static void test_rows() {
    for (const Case& k : CASES)
        for (int bf = 0; bf < 2; bf++) {
            Input in = make_input(k, bf);
            const int R = k.R, C = k.C, Kt = tiles(C);
            std::vector<uint8_t> q((size_t)R * C);
            std::vector<float> s((size_t)R * Kt);
            fp8_quant_1x128(in.x.data(), R, C, k.ld, q.data(), s.data(), nullptr, nullptr);
            const size_t ldq = pad(C, k.al);
            const int split = R / 8 * 8, chunk = 16;  // as the GEMMs map them
            std::vector<uint8_t> dq((size_t)R * ldq, 0xAB);
            std::vector<float> s0((size_t)R * Kt, -1.f), s1((size_t)8 * Kt, -1.f);
            Backend* be = host_cuda_backend(bf ? DTYPE_BF16 : DTYPE_F32);
            cuda_fp8_quant_rows(be, in.dev, R, C, k.ld, dq.data(), (int)ldq, s0.data(), s1.data(), split, chunk);
            host_cuda_backend_free(be);
            const size_t bad = bad_codes(dq, ldq, q.data(), R, C);
            const SMap m = smap_vec(s0.data(), s1.data(), split, chunk, R, Kt);
            size_t bads = 0;
            for (int r = 0; r < R; r++)
                for (int t = 0; t < Kt; t++) {
                    float* b;
                    const size_t i = smap_idx(m, r, t, &b);
                    bads += !same(b[i], s[(size_t)r * Kt + t]);
                }
            EXPECT(bad == 0 && bads == 0, "rows %dx%d ld %d %s: %zu codes, %zu scales differ", R, C, k.ld,
                   bf ? "bf16" : "fp32", bad, bads);
        }
}

static void test_cols() {
    for (const Case& k : CASES)
        for (int bf = 0; bf < 2; bf++)
            for (int both = 0; both < 2; both++) {
                Input in = make_input(k, bf);
                const int R = k.R, C = k.C, KtC = tiles(C), KtR = tiles(R);
                std::vector<uint8_t> q((size_t)R * C), qt((size_t)R * C);
                std::vector<float> s((size_t)R * KtC), st((size_t)C * KtR);
                fp8_quant_1x128(in.x.data(), R, C, k.ld, q.data(), s.data(), qt.data(), st.data());
                const size_t ldk = pad(R, k.al), ldq = pad(C, k.al);
                std::vector<uint8_t> dqt((size_t)C * ldk, 0xAB), dq((size_t)R * ldq, 0xAB);
                std::vector<float> dst((size_t)KtR * C, -1.f), ds((size_t)KtC * R, -1.f);
                Backend* be = host_cuda_backend(bf ? DTYPE_BF16 : DTYPE_F32);
                cuda_fp8_quant_cols(be, in.dev, R, C, k.ld, dqt.data(), (int)ldk, dst.data(), both ? dq.data() : nullptr,
                                    (int)ldq, ds.data());
                host_cuda_backend_free(be);
                size_t bad = bad_codes(dqt, ldk, qt.data(), C, R), bads = 0;
                for (int c = 0; c < C; c++)
                    for (int t = 0; t < KtR; t++) bads += !same(dst[(size_t)t * C + c], st[(size_t)c * KtR + t]);
                if (both) {
                    bad += bad_codes(dq, ldq, q.data(), R, C);
                    for (int r = 0; r < R; r++)
                        for (int t = 0; t < KtC; t++) bads += !same(ds[(size_t)t * R + r], s[(size_t)r * KtC + t]);
                } else {
                    for (uint8_t v : dq) bad += v != 0xAB;  // no row-wise output asked for
                }
                EXPECT(bad == 0 && bads == 0, "cast-transpose%s %dx%d ld %d %s: %zu codes, %zu scales differ",
                       both ? " (both layouts)" : "", R, C, k.ld, bf ? "bf16" : "fp32", bad, bads);
            }
}

static void test_blocks() {
    for (const Case& k : CASES)
        for (int bf = 0; bf < 2; bf++) {
            Input in = make_input(k, bf);
            const int R = k.R, C = k.C, KtC = tiles(C), KtR = tiles(R);
            std::vector<uint8_t> q((size_t)R * C), qt((size_t)R * C);
            std::vector<float> s((size_t)KtR * KtC), st((size_t)KtR * KtC);
            fp8_quant_128x128(in.x.data(), R, C, k.ld, q.data(), s.data(), qt.data(), st.data());
            for (int tr = 0; tr < 2; tr++) {
                const int orows = tr ? C : R, ok = tr ? R : C, okt = tiles(ok), orb = tiles(orows);
                const size_t ldq = pad(ok, k.al), lds = pad(okt, 4);
                std::vector<uint8_t> dq((size_t)orows * ldq, 0xAB);
                std::vector<float> ds((size_t)orb * lds, -1.f);
                Backend* be = host_cuda_backend(bf ? DTYPE_BF16 : DTYPE_F32);
                cuda_fp8_quant_blocks(be, in.dev, R, C, k.ld, tr, dq.data(), (int)ldq, ds.data());
                host_cuda_backend_free(be);
                const size_t bad = bad_codes(dq, ldq, tr ? qt.data() : q.data(), orows, ok);
                size_t bads = 0;
                for (int b = 0; b < orb; b++)
                    for (int t = 0; t < okt; t++) bads += !same(ds[(size_t)b * lds + t], (tr ? st : s)[(size_t)b * okt + t]);
                EXPECT(bad == 0 && bads == 0, "128x128%s %dx%d ld %d %s: %zu codes, %zu scales differ", tr ? "T" : "", R,
                       C, k.ld, bf ? "bf16" : "fp32", bad, bads);
            }
        }
}

int main() {
    RUN(test_rows);
    RUN(test_cols);
    RUN(test_blocks);
    TEST_END();
}
