// test_fp8_gemm_host.cc — the CUDA backend's FP8 GEMM ops (cuda/cuda_fp8.cu with its kernels in
// cuda_fp8_kernels.cu and cuda_fp8_quant.cu) run on the CPU through the host stand-in
// (tests/host_cuda), against the CPU backend (the spec) bit for bit. The stand-in's cuBLASLt
// computes in the spec's order and its mma step keeps a tile's partial exact, so every difference
// is a bug of cuda_fp8.cu's own: the workspace's layout (each ws exactly fp8_ws_bytes, unaligned
// too, under AddressSanitizer), the rows' chunks and their scale maps, the split between cuBLASLt
// and the fallback kernel (counted), a group's product running on into the next group's rows,
// the weight gradient whole or in row chunks (counted) with its fp32 sums, the epilogue, the
// experts' forward as one op (gemm_grouped_ffn), the SwiGLU backward with w13's products
// (gemm_grouped_swiglu_bwd), and every
// cuBLASLt call against the documented rules (the stand-in aborts on a broken one). The GPU's
// numerics inside a tile are tests/gpu/test_cuda_fp8.c's to bound.
#include <memory>
#include <vector>

#include "backend_host.h"
#include "cublasLt.h"
#include "test.h"

static Rng g_rng = {0x2545F4914F6CDD1Dull};
static float bf16_round(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// A matrix as both backends see it: fp32 values (bf16-exact when bf) and, for bf, their bf16 bits.
struct Mat {
    int bf;
    std::vector<float> f;
    std::vector<uint16_t> h;
    void* dev() { return bf ? (void*)h.data() : (void*)f.data(); }
    void sync_h() {  // h from f (bf16-exact values)
        h.resize(f.size());
        for (size_t i = 0; i < f.size(); i++) h[i] = f32_to_bf16(f[i]);
    }
};
// [R, C] with row stride ld: normal values times 2^(row exponent + column exponent) in [-12, 12],
// so neighbouring tiles and blocks get different scales; 777 in the padding.
static Mat data(int R, int C, int ld, int bf) {
    Mat m{bf, std::vector<float>((size_t)R * ld), {}};
    std::vector<int> ce(C);
    for (int& e : ce) e = (int)(rng_u64(&g_rng) % 13) - 6;
    for (int r = 0; r < R; r++) {
        const int re = (int)(rng_u64(&g_rng) % 13) - 6;
        for (int c = 0; c < ld; c++) {
            const float v = c < C ? ldexpf(rng_normal(&g_rng), re + ce[c]) : 777.f;
            m.f[(size_t)r * ld + c] = bf ? bf16_round(v) : v;
        }
    }
    if (bf) m.sync_h();
    return m;
}
// The output as the stand-in left it, against the spec's fp32 result (rounded to bf16 when the
// output is bf16): the number of elements [R, C] (row stride ld) whose bits differ.
static size_t diff(Mat& got, int out_bf, const std::vector<float>& want, int R, int C, int ld) {
    size_t bad = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            const size_t i = (size_t)r * ld + c;
            if (out_bf) {
                bad += got.h[i] != f32_to_bf16(want[i]);
            } else {
                bad += memcmp(&got.f[i], &want[i], 4) != 0;
            }
        }
    return bad;
}

static Backend* g_cpu;
// Workspace of exactly `bytes` bytes at an address 8 bytes past 16 (so ws_base's rounding is used):
// AddressSanitizer reports a write past its end.
struct Ws {
    char* raw;
    void* p;
    size_t bytes;
    explicit Ws(size_t b) : raw((char*)malloc(b + 8)), p(raw + 8), bytes(b) {}
    ~Ws() { free(raw); }
};
static void* cpu_ws(Fp8Op op, Fp8Gemm f, int M, int N, int K, int G, std::vector<char>& keep, size_t* bytes) {
    *bytes = g_cpu->fp8_ws_bytes(g_cpu, op, f, M, N, K, G);
    keep.assign(*bytes + 1, 0);
    return keep.data();
}

// The counters around one call: cuBLASLt products, fallback launches, heuristic refusals.
struct Counts {
    size_t lt, fb, refused, split;
    static Counts now(Backend* be) {
        Counts c;
        cuda_fp8_counts(be, &c.lt, &c.fb);
        c.refused = host_lt_refused;
        c.split = cuda_fp8_wgrad_splits(be);
        return c;
    }
};

// How the product is taken: cuBLASLt where it can, the fallback kernel forced, or cuBLASLt's
// heuristic refusing every shape; and the rows a product step takes (the default, or 128).
enum Path { LT = 0, FORCED = 1, REFUSED = 2 };
static const char* PATH_NAME[] = {"cuBLASLt", "fallback forced", "cuBLASLt refusing"};
static void set_path(Backend* be, Path p) {
    cuda_fp8_set_path(be, p == FORCED ? 2 : 0);
    host_lt_refuse = p == REFUSED;
}
// The counters as the path implies: cuBLASLt ran (or not), the fallback ran where rows or columns
// are not cuBLASLt's (or everywhere), and nothing else.
static void expect_counts(const char* what, Path p, Counts a, Counts b, int lt_rows, int fb_rows) {
    const size_t lt = b.lt - a.lt, fb = b.fb - a.fb, refused = b.refused - a.refused;
    if (p == LT) {
        EXPECT((lt > 0) == lt_rows && (fb > 0) == fb_rows && refused == 0,
               "%s: %zu cuBLASLt products (want %s), %zu fallback launches (want %s), %zu refusals", what, lt,
               lt_rows ? "some" : "none", fb, fb_rows ? "some" : "none", refused);
    } else {
        EXPECT(lt == 0 && fb > 0 && (p == FORCED || refused > 0), "%s: %zu cuBLASLt products, %zu fallback launches",
               what, lt, fb);
    }
}

// ---- gemm ------------------------------------------------------------------------------------------

// A product of M rows leaves rows to the fallback kernel only when it has fewer than 8 (and not 0):
// cuBLASLt takes M rounded down to 8, and the rest again with the 7 or fewer rows before them.
static bool few_rows(int M) { return M % 8 != 0 && M < 8; }

struct GCase {
    int M, N, K, ta, tb;
    Fp8Gemm f;
    float alpha, beta;
    int cin, c_f32, pad;
};
static const GCase GCASES[] = {
    {64, 136, 200, 0, 1, FP8_WEIGHT, 1, 0, 0, 0, 0},     // a linear forward
    {37, 300, 300, 0, 1, FP8_WEIGHT, 1, 0, 0, 0, 8},     // N % 8 = 4: the fallback only; a tail of rows
    {130, 256, 384, 0, 0, FP8_WEIGHT, 1, 1, 0, 0, 0},    // a data gradient (B transposed) accumulating
    {300, 128, 136, 0, 1, FP8_WEIGHT, 1, 1, 1, 0, 16},   // a residual add through c_in
    {129, 264, 520, 1, 1, FP8_ACT, 0.5f, 0.25f, 0, 0, 0},  // op(A) by the cast-transpose, one row of tail
    {207, 72, 1300, 1, 0, FP8_ACT, 1, 1, 0, 1, 0},       // a weight gradient into fp32: both column-wise; 11
                                                         // K tiles and 7 rows of tail: its scales fill their ws part
    {8, 8, 8, 0, 1, FP8_ACT, 1, 0, 0, 0, 0},
    {5, 136, 200, 0, 1, FP8_WEIGHT, 0.5f, 1, 0, 0, 0},  // fewer than 8 rows: the fallback alone
    {16, 24, 0, 0, 1, FP8_WEIGHT, 1, 0.5f, 0, 0, 0},     // K = 0: C = beta · C, no product
};

// epi: the epilogue's fp32 rows in passes of this many rows (0: the default, one pass here)
static void gemm_case(const GCase& g, int bf, Path path, int chunk, int epi = 0) {
    Backend* be = host_cuda_backend(bf ? DTYPE_BF16 : DTYPE_F32);
    cuda_fp8_set_row_chunk(be, chunk);
    if (epi) cuda_fp8_set_epi_bytes(be, (size_t)4 * epi * g.N);
    const int M = g.M, N = g.N, K = g.K;
    const int ar = g.ta ? K : M, ac = g.ta ? M : K, br = g.tb ? N : K, bc = g.tb ? K : N;
    const int lda = ac + g.pad, ldb = bc + g.pad, ldc = N + g.pad;
    Mat A = data(ar, ac, lda, bf), B = data(br, bc, ldb, bf);
    const int c_bf = bf && !g.c_f32;
    Mat C = data(M, N, ldc, c_bf), Cin = data(M, N, ldc, c_bf);
    std::vector<float> want = C.f;
    GemmDesc d = {};
    d.M = M, d.N = N, d.K = K, d.trans_a = g.ta, d.trans_b = g.tb, d.lda = lda, d.ldb = ldb, d.ldc = ldc;
    d.alpha = g.alpha, d.beta = g.beta, d.c_f32 = g.c_f32, d.fp8 = g.f;
    std::vector<char> keep;
    d.c_in = g.cin ? Cin.f.data() : nullptr;
    d.ws = cpu_ws(FP8_OP_GEMM, g.f, M, N, K, 1, keep, &d.ws_bytes);
    g_cpu->gemm(g_cpu, &d, A.f.data(), B.f.data(), want.data());

    Ws ws(cuda_fp8_ws_bytes(be, FP8_OP_GEMM, g.f, M, N, K, 1));
    d.ws = ws.p, d.ws_bytes = ws.bytes;
    d.c_in = g.cin ? Cin.dev() : nullptr;
    set_path(be, path);
    const Counts c0 = Counts::now(be);
    cuda_gemm_fp8(be, &d, A.dev(), B.dev(), C.dev());
    const Counts c1 = Counts::now(be);
    set_path(be, LT);
    char what[200];
    snprintf(what, sizeof what, "gemm %dx%dx%d ta %d tb %d %s alpha %g beta %g%s%s %s, %s, chunk %d, epilogue %d rows",
             M, N, K, g.ta, g.tb, g.f == FP8_WEIGHT ? "weight" : "act", g.alpha, g.beta, g.cin ? " c_in" : "",
             g.c_f32 ? " fp32 C" : "", bf ? "bf16" : "fp32", PATH_NAME[path], chunk, epi);
    const size_t bad = diff(C, c_bf, want, M, N, ldc);
    EXPECT(bad == 0, "%s: %zu of %d elements differ from the spec", what, bad, M * N);
    // rows past the last multiple of 8 go through cuBLASLt again, on the last 8 (fp8_lt_tail):
    // the fallback takes only columns cuBLASLt cannot and fewer than 8 rows
    if (K > 0) expect_counts(what, path, c0, c1, M >= 8 && N % 8 == 0, N % 8 != 0 || few_rows(M));
    host_cuda_backend_free(be);
}

// Every case in both dtypes through cuBLASLt; the forced fallback in one dtype and rows in chunks
// of 128 in the other, alternating (each dtype's own indexing is the quantisers', covered either way).
static void test_gemm() {
    int i = 0;
    for (const GCase& g : GCASES) {
        for (int bf = 0; bf < 2; bf++) gemm_case(g, bf, LT, 4096);
        gemm_case(g, i % 2, FORCED, 4096);
        if (g.M > 128) gemm_case(g, (i + 1) % 2, LT, 128);
        i++;
    }
    gemm_case(GCASES[0], 1, REFUSED, 4096);
    gemm_case(GCASES[3], 0, REFUSED, 128);
    // bf16 C with beta: the fp32 product in passes of 16 or 24 rows, each through the epilogue
    gemm_case(GCASES[2], 1, LT, 4096, 16);
    gemm_case(GCASES[3], 1, LT, 128, 24);
}

// ---- gemm_grouped ----------------------------------------------------------------------------------

// Expert groups: one empty, one inside the first 128-row tile, one of a whole tile starting
// inside one, a short one, and a long one (more than two 128-row chunks; 300 % 8 = 4 rows of tail).
static const int OFF[] = {0, 0, 37, 165, 181, 481};
enum { G = 5, ROWS = 481 };
// A group whose product runs on to a multiple of 8 rows would pass the last row: 37 rows, then
// 2 after an empty group.
static const int OFF_SHORT[] = {0, 37, 37, 39};

// The weight's kept codes (Fp8WCodes) made from W (groups × [R, C]) at an address 8 bytes past 16;
// W itself then poisoned with NaN, so a product that read it instead would differ.
struct WCodes {
    Fp8WCodes wq;
    Ws buf;
    WCodes(Backend* be, Mat& W, int R, int C, int groups)
        : wq(), buf(cuda_fp8_wcodes_bytes(be, R, C, groups)) {
        wq.codes = buf.p, wq.R = R, wq.C = C, wq.groups = groups;
        cuda_fp8_wcodes_make(be, W.dev(), R, C, groups, (size_t)R * C, buf.p);
        for (float& v : W.f) v = NAN;
        if (W.bf) W.sync_h();
    }
};

// room > chunk: ws sized for products of `room` rows (the op then takes up to that many at once:
// want_lt products through cuBLASLt), the backend's row chunk still `chunk`.
static void grouped_case(int N, int K, int tb, Fp8Gemm f, float alpha, float beta, int bf, Path path, int chunk,
                         const int* off = OFF, int ng = G, int codes = 0, int room = 0, int want_lt = -1) {
    const int rows = off[ng];
    Backend* be = host_cuda_backend(bf ? DTYPE_BF16 : DTYPE_F32);
    cuda_fp8_set_row_chunk(be, chunk);
    const int br = tb ? N : K, bc = tb ? K : N;
    Mat A = data(rows, K, K, bf), B = data(ng * br, bc, bc, bf), C = data(rows, N, N, bf);
    std::vector<float> want = C.f;
    GemmDesc d = {};
    d.N = N, d.K = K, d.trans_b = tb, d.alpha = alpha, d.beta = beta, d.fp8 = f;
    GroupDesc gd = {};
    gd.groups = ng, gd.host_off = off, gd.b_stride = (size_t)N * K;
    std::vector<char> keep;
    d.ws = cpu_ws(FP8_OP_GROUPED, f, rows, N, K, ng, keep, &d.ws_bytes);
    g_cpu->gemm_grouped(g_cpu, &d, &gd, A.f.data(), B.f.data(), want.data());

    if (room) cuda_fp8_set_row_chunk(be, room);
    Ws ws(cuda_fp8_ws_bytes(be, FP8_OP_GROUPED, f, rows, N, K, ng));
    cuda_fp8_set_row_chunk(be, chunk);
    d.ws = ws.p, d.ws_bytes = ws.bytes;
    std::unique_ptr<WCodes> wc;
    if (codes) wc.reset(new WCodes(be, B, br, bc, ng)), d.wq = &wc->wq;
    set_path(be, path);
    const Counts c0 = Counts::now(be);
    cuda_gemm_grouped_fp8(be, &d, &gd, A.dev(), B.dev(), C.dev());
    const Counts c1 = Counts::now(be);
    set_path(be, LT);
    char what[200];
    snprintf(what, sizeof what, "gemm_grouped %d rows N %d K %d tb %d %s alpha %g beta %g %s, %s, chunk %d%s, ws for %d", rows,
             N, K, tb, f == FP8_WEIGHT ? "weight" : "act", alpha, beta, bf ? "bf16" : "fp32", PATH_NAME[path], chunk,
             codes ? ", kept weight codes" : "", room ? room : chunk);
    const size_t bad = diff(C, bf, want, rows, N, N);
    EXPECT(bad == 0, "%s: %zu of %d elements differ from the spec", what, bad, rows * N);
    // beta = 0: every group but the last runs on to a multiple of 8 rows (as far as there are rows),
    // so only the last one ends in a tail (300 % 8 = 4 rows); with beta, each group's own tail. A
    // tail after 8 rows or more is cuBLASLt's; the fallback's only in a product of fewer than 8 rows
    // (OFF_SHORT's group of 2).
    bool few = false;
    int last = -1;
    for (int i = 0; i < ng; i++)
        if (off[i + 1] > off[i]) last = i;
    for (int i = 0; i < ng; i++) {
        int n = off[i + 1] - off[i];
        if (beta == 0.f && i != last) n = std::min((n + 7) / 8 * 8, rows - off[i]);
        few = few || few_rows(n);
    }
    expect_counts(what, path, c0, c1, N % 8 == 0, N % 8 != 0 || few);
    if (want_lt >= 0) EXPECT(c1.lt - c0.lt == (size_t)want_lt, "%s: %zu cuBLASLt products, want %d", what, c1.lt - c0.lt, want_lt);
    host_cuda_backend_free(be);
}

static void test_grouped() {
    grouped_case(136, 200, 1, FP8_WEIGHT, 1, 0, 1, LT, 4096);      // the expert forward
    grouped_case(136, 200, 0, FP8_WEIGHT, 1, 0, 0, LT, 4096);      // the expert data gradient
    grouped_case(136, 200, 1, FP8_WEIGHT, 0.5f, 1, 0, LT, 4096);   // alpha, beta: each group's own tail
    // rows in chunks: the 300-row group in 3 (104, 104, 92), the last one's tail a product more
    grouped_case(136, 200, 1, FP8_ACT, 1, 0, 1, LT, 128, OFF, G, 0, 0, 7);
    grouped_case(136, 200, 1, FP8_ACT, 1, 0, 1, LT, 128, OFF, G, 0, 256, 6);  // ws for 256 rows: that group in 2
    grouped_case(100, 136, 1, FP8_WEIGHT, 1, 0, 1, LT, 4096);      // N % 8 ≠ 0: the fallback only
    grouped_case(136, 200, 0, FP8_WEIGHT, 1, 1, 1, FORCED, 128);
    grouped_case(136, 200, 1, FP8_WEIGHT, 1, 0, 0, REFUSED, 4096);
    grouped_case(136, 200, 1, FP8_WEIGHT, 1, 0, 1, LT, 4096, OFF_SHORT, 3);
    // kept weight codes (precision.fp8_weights=per_step), W poisoned: forward, data gradient, the fallback
    grouped_case(136, 200, 1, FP8_WEIGHT, 1, 0, 1, LT, 4096, OFF, G, 1);
    grouped_case(136, 200, 0, FP8_WEIGHT, 1, 0, 1, LT, 128, OFF, G, 1);
    grouped_case(100, 136, 0, FP8_WEIGHT, 0.5f, 1, 0, FORCED, 4096, OFF, G, 1);
}

// ---- gemm_grouped_wgrad ----------------------------------------------------------------------------

// The CPU's weight gradient of one group's rows [k0, k0 + kr) into dB [N, K] (fp32): dB = r + beta·dB.
static void cpu_wgrad_rows(const Mat& dY, const Mat& X, int N, int K, int k0, int kr, float* dB, float beta) {
    const int off[2] = {0, kr};
    GroupDesc g = {};
    g.groups = 1, g.host_off = off, g.fp8 = FP8_ACT;
    std::vector<char> keep;
    g.ws = cpu_ws(FP8_OP_WGRAD, FP8_ACT, kr, N, K, 1, keep, &g.ws_bytes);
    g_cpu->gemm_grouped_wgrad(g_cpu, &g, N, K, dY.f.data() + (size_t)k0 * N, X.f.data() + (size_t)k0 * K, dB, beta);
}

// The spec's weight gradient as cuda_fp8.cu takes it: a group of more than `whole` rows in chunks
// of `chunk` rows (the tiles still from the group's first row), summed in fp32 — onto dB when dB
// is fp32, else into separate sums that then go onto dB once, as the CUDA backend does.
static void want_wgrad(const Mat& dY, const Mat& X, int N, int K, std::vector<float>& dB, float beta, int db_bf,
                       int whole, int chunk) {
    for (int g = 0; g < G; g++) {
        const int r0 = OFF[g], rows = OFF[g + 1] - r0;
        float* dbg = dB.data() + (size_t)g * N * K;
        if (rows == 0) {
            if (beta == 0.f) memset(dbg, 0, sizeof(float) * N * K);
            continue;
        }
        if (rows <= whole) {
            cpu_wgrad_rows(dY, X, N, K, r0, rows, dbg, beta);
            continue;
        }
        if (!db_bf) {
            for (int c = 0; c * chunk < rows; c++) {
                const int k0 = r0 + c * chunk, kr = std::min(chunk, rows - c * chunk);
                cpu_wgrad_rows(dY, X, N, K, k0, kr, dbg, c == 0 ? beta : 1.f);
            }
            continue;
        }
        std::vector<float> acc((size_t)N * K);
        for (int c = 0; c * chunk < rows; c++) {
            const int k0 = r0 + c * chunk, kr = std::min(chunk, rows - c * chunk);
            cpu_wgrad_rows(dY, X, N, K, k0, kr, acc.data(), c == 0 ? 0.f : 1.f);
        }
        for (size_t i = 0; i < acc.size(); i++) dbg[i] = beta == 0.f ? acc[i] : acc[i] + beta * dbg[i];
    }
}

// chunked: rows 128 at a time, the fp32 sums 64 rows of dB at a time (three blocks of dB's 136
// rows), the epilogue's rows 24 at a time (fewer than the sums, as at Mixtral's sizes: ws is then
// the sums' size), ws exactly fp8_ws_bytes: the group of 300 rows does not fit whole (those of 128
// or fewer do).
// xq: X's codes made first (cuda_fp8_xcodes_make) and read instead of X (NULL): the same bits.
static void wgrad_case(int N, int K, float beta, int db_act, int bf, Path path, int chunked, int epi = 0, int xq = 0) {
    Backend* be = host_cuda_backend(bf ? DTYPE_BF16 : DTYPE_F32);
    if (chunked) epi = 24;
    if (epi) cuda_fp8_set_epi_bytes(be, (size_t)4 * epi * K);
    if (chunked) {
        cuda_fp8_set_row_chunk(be, 128);
        cuda_fp8_set_wgrad_acc(be, (size_t)4 * 64 * K);
    }
    const int db_bf = bf && db_act;
    Mat dY = data(ROWS, N, N, bf), X = data(ROWS, K, K, bf), dB = data(G * N, K, K, db_bf);
    std::vector<float> want = dB.f;
    want_wgrad(dY, X, N, K, want, beta, db_bf, chunked ? 256 : ROWS, 128);

    GroupDesc g = {};
    g.groups = G, g.host_off = OFF, g.b_stride = (size_t)N * K, g.db_act = db_act, g.fp8 = FP8_ACT;
    const size_t need = cuda_fp8_ws_bytes(be, FP8_OP_WGRAD, FP8_ACT, ROWS, N, K, G);
    Ws ws(chunked ? need : need + (size_t)ROWS * (N + K) * 2);  // room for the largest group whole
    g.ws = ws.p, g.ws_bytes = ws.bytes;
    std::vector<char> xc(xq ? cuda_fp8_xcodes_bytes(be, ROWS, G, K) : 0);
    if (xq) cuda_fp8_xcodes_make(be, &g, X.dev(), K, xc.data()), g.xq = xc.data();
    set_path(be, path);
    const Counts c0 = Counts::now(be);
    cuda_gemm_grouped_wgrad_fp8(be, &g, N, K, dY.dev(), xq ? nullptr : X.dev(), dB.dev(), beta);
    const Counts c1 = Counts::now(be);
    set_path(be, LT);
    char what[200];
    snprintf(what, sizeof what, "gemm_grouped_wgrad N %d K %d beta %g %s dB, %s, %s, %s, epilogue %d rows%s", N, K,
             beta, db_bf ? "bf16" : "fp32", bf ? "bf16" : "fp32", PATH_NAME[path], chunked ? "row chunks" : "whole groups",
             epi, xq ? ", X's codes made first" : "");
    const size_t bad = diff(dB, db_bf, want, G * N, K, K);
    EXPECT(bad == 0, "%s: %zu of %d elements differ from the spec", what, bad, G * N * K);
    const size_t split = c1.split - c0.split;
    EXPECT(split == (chunked ? 1u : 0u), "%s: %zu groups taken in row chunks, want %d", what, split, chunked ? 1 : 0);
    // dB's rows (N) are the product's rows, its columns (K) cuBLASLt's m
    expect_counts(what, path, c0, c1, K % 8 == 0, K % 8 != 0 || few_rows(N));
    host_cuda_backend_free(be);
}

static void test_wgrad() {
    for (int bf = 0; bf < 2; bf++)
        for (int chunked = 0; chunked < 2; chunked++) {
            wgrad_case(136, 72, 0.f, 0, bf, LT, chunked);
            wgrad_case(136, 72, 1.f, 0, bf, LT, chunked);
            wgrad_case(136, 72, 0.f, 1, bf, LT, chunked);
            wgrad_case(136, 72, 1.f, 1, bf, LT, chunked);
        }
    wgrad_case(136, 72, 1.f, 1, 1, FORCED, 1);
    wgrad_case(100, 72, 1.f, 1, 1, LT, 0);  // N % 8 ≠ 0: dB's last 4 rows by cuBLASLt on its last 8
    wgrad_case(136, 72, 1.f, 1, 1, REFUSED, 0);
    wgrad_case(136, 72, 1.f, 1, 1, LT, 0, 24);  // dB's epilogue in passes of 24 rows
    for (int bf = 0; bf < 2; bf++)  // X's codes made first: whole groups; chunks copied out of them
        for (int chunked = 0; chunked < 2; chunked++) wgrad_case(136, 72, 1.f, 1, bf, LT, chunked, 0, 1);
    wgrad_case(136, 72, 0.f, 1, 1, FORCED, 1, 0, 1);
}

// ---- gemm_grouped_ffn ------------------------------------------------------------------------------

// The experts' forward as one op, against the spec on the same h: the stand-in's gemm_grouped_swiglu
// gives gu and h (w13's product is gemm_grouped's, checked above; the SwiGLU is cuda_moe.cu's kernel
// with the arithmetic the op's runs), then the CPU's w2 product of that h. ws: room for w2 products
// of up to `fit` rows on the op's own path (0: every group); the others take the two ops' steps
// (counted). Only bf16 with F % 128 = 0 takes the own path.
// hq: h's codes for w2's weight gradient too, byte for byte what cuda_fp8_xcodes_make makes of the
// spec's h (h is then scratch: not compared).
static void ffn_case(int F, int K, int H, int bf, Path path, int fit, int scaled = 1, int chunk = 4096, int codes = 0,
                     const int* off = OFF, int ng = G, int hq = 0) {
    Backend* be = host_cuda_backend(bf ? DTYPE_BF16 : DTYPE_F32);
    cuda_fp8_set_row_chunk(be, chunk);
    const int F2 = 2 * F, R = off[ng];
    Mat X = data(R, K, K, bf), W13 = data(ng * F2, K, K, bf), W2 = data(ng * H, F, F, bf);
    Mat gu = data(R, F2, F2, bf), h = data(R, F, F, bf), Y = data(R, H, H, bf);  // junk the op overwrites
    std::vector<float> scale(R);
    for (float& v : scale) v = 0.25f + 0.5f * (float)(rng_u64(&g_rng) % 1000) / 1000.f;
    const float* sc = scaled ? scale.data() : nullptr;
    GemmDesc d = {};
    d.N = F2, d.K = K, d.trans_b = 1, d.alpha = 1, d.beta = 0, d.fp8 = FP8_WEIGHT;
    GemmDesc d2 = d;
    d2.N = H, d2.K = F;
    GroupDesc g = {};
    g.groups = ng, g.host_off = off, g.b_stride = (size_t)F2 * K;
    GroupDesc g2 = g;
    g2.b_stride = (size_t)H * F;
    const size_t need = std::max(cuda_fp8_ws_bytes(be, FP8_OP_GROUPED, FP8_WEIGHT, R, F2, K, ng),
                                 cuda_fp8_ws_bytes(be, FP8_OP_GROUPED, FP8_WEIGHT, R, H, F, ng));

    // the spec: gu and h from the stand-in's two steps, then the CPU's w2 product of that h
    Mat want_gu = gu, want_h = h;
    {
        Ws ws(need);
        d.ws = ws.p, d.ws_bytes = ws.bytes;
        cuda_gemm_grouped_swiglu(be, &d, &g, X.dev(), W13.dev(), want_gu.dev(), want_h.dev(), sc);
    }
    for (Mat* w : {&want_gu, &want_h})
        if (bf)
            for (size_t i = 0; i < w->f.size(); i++) w->f[i] = bf16_to_f32(w->h[i]);
    std::vector<float> want_y = Y.f;
    std::vector<char> keep;
    d2.ws = cpu_ws(FP8_OP_GROUPED, FP8_WEIGHT, R, H, F, ng, keep, &d2.ws_bytes);
    g_cpu->gemm_grouped(g_cpu, &d2, &g2, want_h.f.data(), W2.f.data(), want_y.data());

    // the op: ws for the two ops, and for its own path's groups of up to `fit` rows
    Ws ws(std::max(need, cuda_fp8_ffn_ws(be, fit ? fit : R, F, H)));
    d.ws = d2.ws = ws.p, d.ws_bytes = d2.ws_bytes = ws.bytes;
    std::unique_ptr<WCodes> c13, c2;
    if (codes) c13.reset(new WCodes(be, W13, F2, K, ng)), c2.reset(new WCodes(be, W2, H, F, ng));
    d.wq = codes ? &c13->wq : nullptr, d2.wq = codes ? &c2->wq : nullptr;
    set_path(be, path);
    const size_t f0 = cuda_fp8_ffn_groups(be);
    std::vector<char> hc(hq ? cuda_fp8_xcodes_bytes(be, R, ng, F) : 0), want_hc(hc.size());
    cuda_gemm_grouped_ffn(be, &d, &g, X.dev(), W13.dev(), gu.dev(), h.dev(), hq ? hc.data() : nullptr, sc, &d2, &g2,
                          W2.dev(), Y.dev());
    const size_t fused = cuda_fp8_ffn_groups(be) - f0;
    set_path(be, LT);
    char what[200];
    snprintf(what, sizeof what, "gemm_grouped_ffn %d rows F %d K %d H %d %s, %s, fit %d%s, chunk %d%s%s", R, F, K, H,
             bf ? "bf16" : "fp32", PATH_NAME[path], fit, scaled ? "" : ", no scale", chunk,
             codes ? ", kept weight codes" : "", hq ? ", h's codes" : "");
    const size_t bg = diff(gu, bf, want_gu.f, R, F2, F2), bh = hq ? 0 : diff(h, bf, want_h.f, R, F, F);
    if (hq) {  // the alignment gaps are zero in both
        cuda_fp8_xcodes_make(be, &g, want_h.dev(), F, want_hc.data());
        size_t bq = 0;
        for (size_t i = 0; i < hc.size(); i++) bq += hc[i] != want_hc[i];
        EXPECT(bq == 0, "%s: %zu of %zu bytes of h's codes differ from fp8_xcodes_make's", what, bq, hc.size());
    }
    const size_t by = diff(Y, bf, want_y, R, H, H);
    EXPECT(bg == 0 && bh == 0, "%s: %zu gu, %zu h elements differ from the two ops'", what, bg, bh);
    EXPECT(by == 0, "%s: %zu of %d Y elements differ from the spec", what, by, R * H);
    size_t want_fused = 0;
    if (bf && F % 128 == 0)
        for (int i = 0; i < ng; i++) want_fused += off[i + 1] > off[i] && (fit == 0 || off[i + 1] - off[i] <= fit);
    EXPECT(fused == want_fused, "%s: %zu groups on the op's own path, want %zu", what, fused, want_fused);
    host_cuda_backend_free(be);
}

static void test_ffn() {
    ffn_case(256, 136, 72, 1, LT, 0);                    // every group on the op's own path
    ffn_case(128, 16, 256, 1, LT, 200, 1, 128);          // the group of 300 rows through the two ops' steps
                                                         // (ws held for w13 and w2 in 128-row chunks is less)
    ffn_case(128, 72, 64, 1, FORCED, 0);                 // the fallback kernel
    ffn_case(128, 72, 64, 1, REFUSED, 0, 0);             // cuBLASLt refusing; no scale
    ffn_case(128, 136, 72, 1, LT, 0, 1, 4096, 0, OFF_SHORT, 3);  // the last group's rows end the buffers
    ffn_case(100, 136, 72, 1, LT, 0);                    // F % 128 != 0: the two ops
    ffn_case(128, 136, 72, 0, LT, 0);                    // fp32: the two ops
    // kept weight codes, W13 and W2 poisoned
    ffn_case(256, 136, 72, 1, LT, 0, 1, 4096, 1);
    ffn_case(128, 16, 256, 1, LT, 200, 1, 128, 1);
    // h's codes for w2's weight gradient: from the own path's kernel; from the two ops' steps (a
    // group that does not fit, F % 128 != 0, fp32); through the fallback kernel
    ffn_case(256, 136, 72, 1, LT, 0, 1, 4096, 0, OFF, G, 1);
    ffn_case(128, 16, 256, 1, LT, 200, 1, 128, 0, OFF, G, 1);
    ffn_case(100, 136, 72, 1, LT, 0, 1, 4096, 0, OFF, G, 1);
    ffn_case(128, 136, 72, 0, LT, 0, 1, 4096, 0, OFF, G, 1);
    ffn_case(128, 72, 64, 1, FORCED, 0, 0, 4096, 0, OFF_SHORT, 3, 1);
}

// ---- gemm_grouped_swiglu_bwd -----------------------------------------------------------------------

// The experts' SwiGLU backward and w13's two products as one op, against the spec on the same
// d(gate|up): the stand-in's SwiGLU backward (cuda_moe.cu's kernel, which the op runs; cpu_moe.c's
// is fp32 and exact), then the CPU's weight gradient and data gradient of those values, every
// group whole. dscale: the same kernel's, bit for bit. ws: room for groups of up to `fit` rows on
// the op's own path (0: every group); the others take the three ops (counted).
static void swiglu_bwd_case(int F, int K, float beta, int db_act, int bf, Path path, int fit, int scaled = 1,
                            int chunk = 4096, int codes = 0) {
    Backend* be = host_cuda_backend(bf ? DTYPE_BF16 : DTYPE_F32);
    cuda_fp8_set_row_chunk(be, chunk);
    const int F2 = 2 * F, R = ROWS;
    const int db_bf = bf && db_act;
    Mat dh = data(R, F, F, bf), gu = data(R, F2, F2, bf), X = data(R, K, K, bf), W = data(G * F2, K, K, bf);
    for (float& v : gu.f) v = bf ? bf16_round(v * 1e-2f) : v * 1e-2f;  // gates and ups of a few units at most
    if (bf) gu.sync_h();
    Mat dW = data(G * F2, K, K, db_bf), dX = data(R, K, K, bf);
    std::vector<float> scale(R);
    for (float& v : scale) v = 0.25f + 0.5f * (float)(rng_u64(&g_rng) % 1000) / 1000.f;

    // the spec: d(gate|up) from the stand-in's SwiGLU backward (in place, as the op defines it)
    Mat dgu = gu;
    std::vector<float> want_ds(R);
    cuda_swiglu_bwd(be, dgu.dev(), want_ds.data(), dh.dev(), dgu.dev(), scaled ? scale.data() : nullptr, R, F);
    if (bf)
        for (size_t i = 0; i < dgu.f.size(); i++) dgu.f[i] = bf16_to_f32(dgu.h[i]);
    std::vector<float> want_dW = dW.f, want_dX((size_t)R * K);
    for (int g = 0; g < G; g++) {
        const int r0 = OFF[g], rows = OFF[g + 1] - r0;
        float* dwg = want_dW.data() + (size_t)g * F2 * K;
        if (rows == 0) {
            if (beta == 0.f) memset(dwg, 0, sizeof(float) * F2 * K);
        } else {
            cpu_wgrad_rows(dgu, X, F2, K, r0, rows, dwg, beta);
        }
    }
    GemmDesc d = {};
    d.N = K, d.K = F2, d.alpha = 1, d.beta = 0, d.fp8 = FP8_WEIGHT;
    GroupDesc gd = {};
    gd.groups = G, gd.host_off = OFF, gd.b_stride = (size_t)F2 * K, gd.db_act = db_act, gd.fp8 = FP8_ACT;
    std::vector<char> keep;
    d.ws = cpu_ws(FP8_OP_GROUPED, FP8_WEIGHT, R, K, F2, G, keep, &d.ws_bytes);
    g_cpu->gemm_grouped(g_cpu, &d, &gd, dgu.f.data(), W.f.data(), want_dX.data());

    // the op: ws for the three ops, and for its own path's groups of up to `fit` rows
    size_t need = std::max(cuda_fp8_ws_bytes(be, FP8_OP_WGRAD, FP8_ACT, R, F2, K, G),
                           cuda_fp8_ws_bytes(be, FP8_OP_GROUPED, FP8_WEIGHT, R, K, F2, G));
    need = std::max(need, cuda_fp8_swiglu_bwd_ws(be, fit ? fit : R, F, K));
    Ws ws(need);
    d.ws = ws.p, d.ws_bytes = ws.bytes, gd.ws = ws.p, gd.ws_bytes = ws.bytes;
    std::unique_ptr<WCodes> wc;
    if (codes) wc.reset(new WCodes(be, W, F2, K, G)), d.wq = &wc->wq;
    std::vector<float> got_ds(R, NAN);
    set_path(be, path);
    const size_t f0 = cuda_fp8_w13_groups(be);
    cuda_gemm_grouped_swiglu_bwd(be, &d, &gd, dh.dev(), gu.dev(), scaled ? scale.data() : nullptr,
                                 scaled ? got_ds.data() : nullptr, X.dev(), W.dev(), dW.dev(), beta, dX.dev());
    const size_t fused = cuda_fp8_w13_groups(be) - f0;
    set_path(be, LT);
    char what[200];
    snprintf(what, sizeof what, "gemm_grouped_swiglu_bwd F %d K %d beta %g %s dW, %s, %s, fit %d%s, chunk %d%s", F, K,
             beta, db_bf ? "bf16" : "fp32", bf ? "bf16" : "fp32", PATH_NAME[path], fit, scaled ? "" : ", no scale",
             chunk, codes ? ", kept weight codes" : "");
    const size_t bw = diff(dW, db_bf, want_dW, G * F2, K, K), bx = diff(dX, bf, want_dX, R, K, K);
    EXPECT(bw == 0, "%s: %zu of %d dW elements differ from the spec", what, bw, G * F2 * K);
    EXPECT(bx == 0, "%s: %zu of %d dX elements differ from the spec", what, bx, R * K);
    size_t want_fused = 0;
    for (int g = 0; g < G; g++) want_fused += OFF[g + 1] > OFF[g] && (fit == 0 || OFF[g + 1] - OFF[g] <= fit);
    EXPECT(fused == want_fused, "%s: %zu groups on the op's own path, want %zu", what, fused, want_fused);
    if (scaled) {
        size_t bad = 0;
        for (int r = 0; r < R; r++) bad += memcmp(&got_ds[r], &want_ds[r], 4) != 0;
        EXPECT(bad == 0, "%s: %zu of %d dscale rows differ", what, bad, R);
    }
    host_cuda_backend_free(be);
}

static void test_swiglu_bwd() {
    for (int db_act = 0; db_act < 2; db_act++)
        for (float beta : {0.f, 1.f}) swiglu_bwd_case(256, 136, beta, db_act, 1, LT, 0);
    swiglu_bwd_case(256, 136, 1.f, 1, 1, LT, 200);             // the group of 300 rows through the three ops
    swiglu_bwd_case(256, 136, 1.f, 1, 1, LT, 200, 1, 128);     // ... in row chunks
    swiglu_bwd_case(128, 72, 0.f, 0, 1, FORCED, 0);             // the fallback kernel
    swiglu_bwd_case(128, 72, 1.f, 1, 1, REFUSED, 0, 0);         // cuBLASLt refusing; no scale, no dscale
    swiglu_bwd_case(100, 136, 1.f, 1, 1, LT, 0);                // 2F = 200: partial tiles, codes padded to 208
    swiglu_bwd_case(128, 136, 1.f, 0, 0, LT, 0);                // fp32
    swiglu_bwd_case(128, 136, 0.f, 0, 0, LT, 200);
    // kept weight codes, W poisoned: every group on the op's own path, and the 300-row group through the three ops
    swiglu_bwd_case(256, 136, 0.f, 1, 1, LT, 0, 1, 4096, 1);
    swiglu_bwd_case(256, 136, 1.f, 1, 1, LT, 200, 1, 128, 1);
}

int main() {
    g_cpu = cpu_backend_create();
    RUN(test_gemm);
    RUN(test_grouped);
    RUN(test_wgrad);
    RUN(test_ffn);
    RUN(test_swiglu_bwd);
    TEST_END();
}
