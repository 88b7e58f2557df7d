// test_cpu_gemm_fp8.c — the CPU backend's GEMMs with fp8 set (backend.h's FP8 contract) against
// the contract composed directly from the spec functions of src/fp8.h: op(A) and op(B)ᵀ written out
// as packed matrices, quantised row-wise (1×128, or 128×128 for FP8_WEIGHT), fp8_gemm_tn, then
// alpha·r + beta·addend. Bit for bit: the backend is the spec, so any difference is a bug (the
// backend quantises transposed operands through the quantisers' column-wise outputs instead, so the
// comparison also checks that path). Covered: gemm with every trans_a/trans_b pair and both modes
// (the model's forms: linear trans_b, residual c_in, data gradient, weight gradient trans_a +
// FP8_ACT into fp32), padded strides, alpha/beta, beta = 0 over NaN, c_in apart and equal to C,
// partial tiles in M, N and K (K not a multiple of 128), K = 0, empty M/N; gemm_grouped and
// gemm_grouped_swiglu with empty groups and groups that start inside a 128-row tile; the weight
// gradient with its token tiles starting at each group's first row, beta 0/1, empty groups,
// db_act; fp8_ws_bytes (an exactly sized workspace suffices and nothing past it is written; a short
// one, none, or a wrong mode is refused); that FP8 is really active (close to the fp32 product,
// never equal); and kept weight codes (Fp8WCodes): the same bits, read, checked.
#include <sys/wait.h>

#include "cpu_fd.h"
#include "fp8.h"

pid_t fork(void);

static int bits_equal(const float* a, const float* b, size_t n) { return n == 0 || memcmp(a, b, sizeof(float) * n) == 0; }

// Test data whose tiles need different scales: normal values times 2^(row exponent + column
// exponent), exponents in [-6, 6], so a 128×128 block and its 1×128 tiles get different scales.
static float* data(int R, int C, int ld) {
    float* x = xmalloc(sizeof(float) * ((size_t)R * ld + 1));
    int ce[512];
    for (int c = 0; c < C && c < 512; c++) ce[c] = (int)(rng_u64(&rng) % 13) - 6;
    for (int r = 0; r < R; r++) {
        const int re = (int)(rng_u64(&rng) % 13) - 6;
        for (int c = 0; c < ld; c++)
            x[(size_t)r * ld + c] = c < C ? ldexpf(rng_normal(&rng), re + ce[c % 512]) : 777.0f;  // padding
    }
    return x;
}

// op(X) [R, C] packed: X is [R, C] (trans 0) or [C, R] (trans 1), row stride ld.
static float* packed(const float* X, int ld, int trans, int R, int C) {
    float* p = xmalloc(sizeof(float) * ((size_t)R * C + 1));
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) p[(size_t)r * C + c] = trans ? X[(size_t)c * ld + r] : X[(size_t)r * ld + c];
    return p;
}

// The contract's product r [M, N] = fp8_gemm_tn(Q(op(A)), Q(op(B)ᵀ)), composed from the spec.
static float* spec_product(const float* A, int lda, int ta, const float* B, int ldb, int tb, int M, int N, int K,
                           Fp8Gemm f) {
    float* Ap = packed(A, lda, ta, M, K);   // op(A) [M, K]
    float* Bt = packed(B, ldb, !tb, N, K);  // op(B)ᵀ [N, K]: B itself when trans_b
    const size_t tk = fp8_tiles((size_t)K);
    uint8_t* qa = xmalloc((size_t)M * K + 1);
    uint8_t* qb = xmalloc((size_t)N * K + 1);
    float* sa = xmalloc(sizeof(float) * (M * tk + 1));
    float* sb = xmalloc(sizeof(float) * (N * tk + 1));
    float* r = xmalloc(sizeof(float) * ((size_t)M * N + 1));
    fp8_quant_1x128(Ap, M, K, (size_t)K, qa, sa, NULL, NULL);
    if (f == FP8_WEIGHT) fp8_quant_128x128(Bt, N, K, (size_t)K, qb, sb, NULL, NULL);
    else fp8_quant_1x128(Bt, N, K, (size_t)K, qb, sb, NULL, NULL);
    fp8_gemm_tn(M, N, K, qa, sa, qb, sb, f == FP8_WEIGHT, r, (size_t)N, 0);
    free(Ap), free(Bt), free(qa), free(qb), free(sa), free(sb);
    return r;
}

// out[M, N] (packed) = alpha·r + beta·addend (addend stride ld; beta = 0 reads nothing)
static float* spec_combine(const float* r, int M, int N, float alpha, float beta, const float* addend, int ld) {
    float* o = xmalloc(sizeof(float) * ((size_t)M * N + 1));
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            const float t = alpha * r[(size_t)i * N + j];
            o[(size_t)i * N + j] = beta == 0 ? t : t + beta * addend[(size_t)i * ld + j];
        }
    return o;
}

static void* ws_for(Fp8Op op, Fp8Gemm f, int M, int N, int K, int groups, size_t* bytes) {
    *bytes = be->fp8_ws_bytes(be, op, f, M, N, K, groups);
    // a canary past the end: the op must stay inside what fp8_ws_bytes asked for
    unsigned char* w = xmalloc(*bytes + 64);
    memset(w, 0xA5, *bytes + 64);
    return w;
}
static int canary_ok(const void* w, size_t bytes) {
    const unsigned char* p = (const unsigned char*)w + bytes;
    for (int i = 0; i < 64; i++)
        if (p[i] != 0xA5) return 0;
    return 1;
}

enum { CIN_NONE, CIN_APART, CIN_SAME };

// One gemm against the spec; C has padding columns that must stay untouched.
static void gemm_case(int M, int N, int K, int ta, int tb, Fp8Gemm f, int pad, float alpha, float beta, int cin) {
    const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    float* A = data(ta ? K : M, ta ? M : K, lda);
    float* B = data(tb ? N : K, tb ? K : N, ldb);
    float* C = data(M, N, ldc);
    float* Cin = cin == CIN_APART ? data(M, N, ldc) : NULL;
    if (beta == 0 || cin == CIN_APART)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = NAN;  // never read
    float* r = spec_product(A, lda, ta, B, ldb, tb, M, N, K, f);
    float* want = spec_combine(r, M, N, alpha, beta, Cin ? Cin : C, ldc);
    size_t wsb;
    void* ws = ws_for(FP8_OP_GEMM, f, M, N, K, 1, &wsb);
    GemmDesc d = {.M = M, .N = N, .K = K, .trans_a = ta, .trans_b = tb, .alpha = alpha, .beta = beta,
                  .lda = pad ? lda : 0, .ldb = pad ? ldb : 0, .ldc = pad ? ldc : 0, .c_f32 = ta,
                  .c_in = cin == CIN_APART ? Cin : cin == CIN_SAME ? C : NULL, .fp8 = f, .ws = ws, .ws_bytes = wsb};
    be->gemm(be, &d, A, B, C);
    int same = 1, pad_ok = 1;
    for (int i = 0; i < M; i++) {
        same &= bits_equal(C + (size_t)i * ldc, want + (size_t)i * N, (size_t)N);
        for (int j = N; j < ldc; j++) pad_ok &= C[(size_t)i * ldc + j] == 777.0f;
    }
    EXPECT(same, "gemm fp8=%d M=%d N=%d K=%d ta=%d tb=%d pad=%d alpha=%g beta=%g c_in=%d: differs from the spec", f,
           M, N, K, ta, tb, pad, alpha, beta, cin);
    EXPECT(pad_ok, "gemm fp8=%d M=%d N=%d K=%d: columns past N (ldc padding) untouched", f, M, N, K);
    EXPECT(canary_ok(ws, wsb), "gemm fp8=%d M=%d N=%d K=%d: nothing written past fp8_ws_bytes", f, M, N, K);
    free(A), free(B), free(C), free(Cin), free(r), free(want), free(ws);
}

static void test_gemm_spec(void) {
    // small shapes with every combination; partial tiles in each dimension (K = 129, 257: K not a
    // multiple of 128, the last tile partial), K = 0 and empty outputs
    const int small[][3] = {{1, 1, 1}, {5, 7, 3}, {9, 6, 129}, {3, 4, 0}, {0, 5, 7}, {7, 0, 5}};
    const float ab[][2] = {{1, 0}, {0.7f, 1}, {-0.5f, 0.3f}};
    for (size_t s = 0; s < sizeof small / sizeof small[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int f = FP8_WEIGHT; f <= FP8_ACT; f++)
                    for (int pad = 0; pad < 2; pad++)
                        for (int a = 0; a < 3; a++)
                            for (int cin = 0; cin < 3; cin++)
                                gemm_case(small[s][0], small[s][1], small[s][2], ta, tb, (Fp8Gemm)f, pad * 3, ab[a][0],
                                          ab[a][1], cin);
    // shapes across 128-tiles and 128×128 blocks in every dimension: every trans pair and mode,
    // the alpha/beta/c_in choices in turn
    const int big[][3] = {{130, 129, 257}, {129, 260, 128}, {200, 131, 300}};
    int turn = 0;
    for (size_t s = 0; s < sizeof big / sizeof big[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int f = FP8_WEIGHT; f <= FP8_ACT; f++, turn++)
                    gemm_case(big[s][0], big[s][1], big[s][2], ta, tb, (Fp8Gemm)f, (turn % 2) * 5, ab[turn % 3][0],
                              ab[turn % 3][1], turn % 3);
}

// The model's four linear forms (model.c), named: forward y = x·Wᵀ, the residual form with c_in,
// the data gradient dX = dY·W, the weight gradient dW (+)= dYᵀ·X into fp32 with FP8_ACT.
static void test_gemm_model_forms(void) {
    const int T = 300, H = 136, O = 264;
    gemm_case(T, O, H, 0, 1, FP8_WEIGHT, 0, 1, 0, CIN_NONE);   // linear
    gemm_case(T, H, O, 0, 1, FP8_WEIGHT, 0, 1, 1, CIN_APART);  // linear_res
    gemm_case(T, H, O, 0, 0, FP8_WEIGHT, 0, 1, 0, CIN_NONE);   // linear_dx
    gemm_case(O, H, T, 1, 0, FP8_ACT, 0, 1, 0, CIN_NONE);      // linear_dw, first write
    gemm_case(O, H, T, 1, 0, FP8_ACT, 0, 1, 1, CIN_NONE);      // linear_dw, accumulating
}

// gemm_grouped (and gemm_grouped_swiglu) against the spec per group.
static void grouped_case(int tb, Fp8Gemm f, int pad, float alpha, float beta, int swiglu) {
    const int off[] = {0, 0, 130, 131, 131, 300}, G = 5, M = 300, N = swiglu ? 2 * 67 : 129, K = 200;
    const int lda = K + pad, ldc = N + pad, ldb = tb ? K : N;
    const size_t bs = (size_t)N * K + 7;  // b_stride with a gap
    float* A = data(M, K, lda);
    float* B = data(G, (int)bs, (int)bs);
    float* C = data(M, N, ldc);
    if (beta == 0)
        for (size_t i = 0; i < (size_t)M * ldc; i++)
            if (i % ldc < (size_t)N) C[i] = NAN;
    float* want = xmalloc(sizeof(float) * (size_t)M * N);
    for (int g = 0; g < G; g++) {
        const int r0 = off[g], rows = off[g + 1] - r0;
        if (!rows) continue;
        float* r = spec_product(A + (size_t)r0 * lda, lda, 0, B + g * bs, ldb, tb, rows, N, K, f);
        float* o = spec_combine(r, rows, N, alpha, beta, C + (size_t)r0 * ldc, ldc);
        memcpy(want + (size_t)r0 * N, o, sizeof(float) * rows * N);
        free(r), free(o);
    }
    size_t wsb;
    void* ws = ws_for(FP8_OP_GROUPED, f, M, N, K, G, &wsb);
    GemmDesc d = {.N = N, .K = K, .trans_b = tb, .lda = pad ? lda : 0, .ldc = pad ? ldc : 0, .alpha = alpha,
                  .beta = beta, .fp8 = f, .ws = ws, .ws_bytes = wsb};
    GroupDesc gd = {.groups = G, .host_off = off, .b_stride = bs};
    int same = 1, pad_ok = 1;
    if (!swiglu) {
        be->gemm_grouped(be, &d, &gd, A, B, C);
    } else {  // packed outputs only (the swiglu op's h is [rows, F])
        float* h = xmalloc(sizeof(float) * (size_t)M * N / 2);
        float* hw = xmalloc(sizeof(float) * (size_t)M * N / 2);
        float* sc = rnd(M, 1);
        be->gemm_grouped_swiglu(be, &d, &gd, A, B, C, h, sc);
        be->swiglu_fwd(be, hw, want, sc, M, N / 2);
        EXPECT(bits_equal(h, hw, (size_t)M * N / 2), "gemm_grouped_swiglu fp8=%d tb=%d: h is swiglu_fwd of the fp8 gu",
               f, tb);
        free(h), free(hw), free(sc);
    }
    for (int i = 0; i < M; i++) {
        same &= bits_equal(C + (size_t)i * ldc, want + (size_t)i * N, (size_t)N);
        for (int j = N; j < ldc; j++) pad_ok &= C[(size_t)i * ldc + j] == 777.0f;
    }
    EXPECT(same, "gemm_grouped%s fp8=%d tb=%d pad=%d alpha=%g beta=%g: differs from the spec", swiglu ? "_swiglu" : "",
           f, tb, pad, alpha, beta);
    EXPECT(pad_ok, "gemm_grouped fp8=%d: ldc padding untouched", f);
    EXPECT(canary_ok(ws, wsb), "gemm_grouped fp8=%d: nothing written past fp8_ws_bytes", f);
    free(A), free(B), free(C), free(want), free(ws);
}

static void test_grouped_spec(void) {
    for (int tb = 0; tb < 2; tb++)
        for (int f = FP8_WEIGHT; f <= FP8_ACT; f++) {
            grouped_case(tb, (Fp8Gemm)f, 0, 1, 0, 0);
            grouped_case(tb, (Fp8Gemm)f, 3, 0.5f, 1, 0);
        }
    // the model's forms: w13 forward through the fused op (trans_b, FP8_WEIGHT) with padding off
    grouped_case(1, FP8_WEIGHT, 0, 1, 0, 1);
    grouped_case(0, FP8_WEIGHT, 0, 1, 0, 1);
}

// gemm_grouped_wgrad: dB_g = Q(dY_gᵀ)·Q(X_gᵀ)ᵀ (+ dB_g), token tiles from each group's first row.
static void wgrad_case(float beta, int db_act) {
    const int off[] = {0, 0, 130, 131, 131, 300}, G = 5, M = 300, N = 129, K = 70;
    const size_t bs = (size_t)N * K;
    float* dY = data(M, N, N);
    float* X = data(M, K, K);
    float* dB = data(G * N, K, K);
    if (beta == 0)
        for (int g = 0; g < G; g++)
            if (off[g + 1] > off[g])  // the empty groups get zeros: old values there are checked below
                for (size_t i = 0; i < bs; i++) dB[g * bs + i] = NAN;
    float* want = dup(dB, G * bs);
    for (int g = 0; g < G; g++) {
        const int r0 = off[g], rows = off[g + 1] - r0;
        if (!rows) {
            if (beta == 0) memset(want + g * bs, 0, sizeof(float) * bs);
            continue;
        }
        // the GEMM dY_gᵀ [N, rows] · X_g [rows, K]: op(A) = dY_gᵀ (trans_a), op(B)ᵀ = X_gᵀ, FP8_ACT
        float* r = spec_product(dY + (size_t)r0 * N, N, 1, X + (size_t)r0 * K, K, 0, N, K, rows, FP8_ACT);
        float* o = spec_combine(r, N, K, 1, beta, dB + g * bs, K);
        memcpy(want + g * bs, o, sizeof(float) * bs);
        free(r), free(o);
    }
    size_t wsb;
    void* ws = ws_for(FP8_OP_WGRAD, FP8_ACT, M, N, K, G, &wsb);
    GroupDesc gd = {.groups = G, .host_off = off, .b_stride = bs, .db_act = db_act, .fp8 = FP8_ACT, .ws = ws,
                    .ws_bytes = wsb};
    be->gemm_grouped_wgrad(be, &gd, N, K, dY, X, dB, beta);
    EXPECT(bits_equal(dB, want, G * bs), "gemm_grouped_wgrad fp8 beta=%g db_act=%d: differs from the spec", beta,
           db_act);
    EXPECT(canary_ok(ws, wsb), "gemm_grouped_wgrad fp8: nothing written past fp8_ws_bytes");
    free(dY), free(X), free(dB), free(want), free(ws);
}

static void test_wgrad_spec(void) {
    wgrad_case(0, 0);
    wgrad_case(1, 0);
    wgrad_case(0, 1);  // db_act: the act dtype is fp32 here, so the same bits
    wgrad_case(1, 1);
}

// The token tiles of a group start at its first row. Tiles at multiples of 128 over all tokens
// would give group 1 (rows 130..299) other scales, hence another product: that product, built from
// the spec with the whole range quantised at once (rows 128..299, the two rows before the group's
// codes zeroed so only their part of the shared tile's scale remains), differs from the op's. So
// the bit-exact comparison above can tell the two tilings apart on this data.
static void test_wgrad_group_tiles_matter(void) {
    const int off[] = {0, 130, 300}, M = 300, N = 64, K = 48, L = M - 128;
    float* dY = data(M, N, N);
    float* X = data(M, K, K);
    float* dB = xmalloc(sizeof(float) * 2 * N * K);
    size_t wsb;
    void* ws = ws_for(FP8_OP_WGRAD, FP8_ACT, M, N, K, 2, &wsb);
    GroupDesc gd = {.groups = 2, .host_off = off, .b_stride = (size_t)N * K, .fp8 = FP8_ACT, .ws = ws, .ws_bytes = wsb};
    be->gemm_grouped_wgrad(be, &gd, N, K, dY, X, dB, 0);
    const size_t tm = fp8_tiles(M);
    uint8_t *qa = xmalloc((size_t)N * M), *qb = xmalloc((size_t)K * M);
    float *sa = xmalloc(sizeof(float) * N * tm), *sb = xmalloc(sizeof(float) * K * tm);
    fp8_quant_1x128(dY, M, N, N, NULL, NULL, qa, sa);  // global token tiles
    fp8_quant_1x128(X, M, K, K, NULL, NULL, qb, sb);
    uint8_t *qa1 = xmalloc((size_t)N * L), *qb1 = xmalloc((size_t)K * L);
    float *sa1 = xmalloc(sizeof(float) * N * 2), *sb1 = xmalloc(sizeof(float) * K * 2);
    for (int i = 0; i < N; i++) {
        for (int t = 0; t < L; t++) qa1[(size_t)i * L + t] = t < 2 ? 0 : qa[(size_t)i * M + 128 + t];
        sa1[i * 2] = sa[i * tm + 1], sa1[i * 2 + 1] = sa[i * tm + 2];
    }
    for (int j = 0; j < K; j++) {
        for (int t = 0; t < L; t++) qb1[(size_t)j * L + t] = t < 2 ? 0 : qb[(size_t)j * M + 128 + t];
        sb1[j * 2] = sb[j * tm + 1], sb1[j * 2 + 1] = sb[j * tm + 2];
    }
    float* r = xmalloc(sizeof(float) * N * K);
    fp8_gemm_tn(N, K, L, qa1, sa1, qb1, sb1, 0, r, K, 0);
    EXPECT(!bits_equal(r, dB + (size_t)N * K, (size_t)N * K), "global token tiles give another weight gradient");
    EXPECT(rel_l2(r, dB + (size_t)N * K, (size_t)N * K) < 0.1, "... of the same size (rel L2 %.3g)",
           rel_l2(r, dB + (size_t)N * K, (size_t)N * K));
    free(dY), free(X), free(dB), free(ws), free(qa), free(qb), free(sa), free(sb);
    free(qa1), free(qb1), free(sa1), free(sb1), free(r);
}

// FP8 is really on: the product is close to the fp32 GEMM's (e4m3 keeps 3 mantissa bits: each
// operand's relative rounding error is at most 2^-4, about 2^-4/√3 ≈ 3.6% rms for uniformly spread
// mantissas, and the product's relative L2 error is of that order; bound 0.1) but never equal.
static void test_fp8_is_active(void) {
    const int M = 96, N = 80, K = 300;
    float *A = rnd((size_t)M * K, 1), *B = rnd((size_t)N * K, 1);
    float *C8 = xmalloc(sizeof(float) * M * N), *C32 = xmalloc(sizeof(float) * M * N);
    for (int f = FP8_WEIGHT; f <= FP8_ACT; f++) {
        size_t wsb;
        void* ws = ws_for(FP8_OP_GEMM, (Fp8Gemm)f, M, N, K, 1, &wsb);
        GemmDesc d = {.M = M, .N = N, .K = K, .trans_b = 1, .alpha = 1, .fp8 = (Fp8Gemm)f, .ws = ws, .ws_bytes = wsb};
        be->gemm(be, &d, A, B, C8);
        d.fp8 = FP8_OFF;
        be->gemm(be, &d, A, B, C32);
        const double e = rel_l2(C8, C32, (size_t)M * N);
        printf("  fp8=%d: rel L2 to the fp32 GEMM %.4f\n", f, e);
        EXPECT(e > 1e-3 && e < 0.1, "fp8=%d: rel L2 to fp32 %.4g, expected e4m3-sized (1e-3, 0.1)", f, e);
        free(ws);
    }
    EXPECT(be->fp8_ws_bytes(be, FP8_OP_GEMM, FP8_OFF, M, N, K, 1) == 0, "fp8_ws_bytes is 0 with fp8 off");
    free(A), free(B), free(C8), free(C32);
}

// Caller errors end the process (FATAL): a workspace one byte short, none, FP8_WEIGHT for the
// weight gradient. An exactly sized one passes.
static int dies(void (*call)(void)) {
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) exit(99);
        call();
        exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}
static float g_a[64 * 40], g_b[64 * 40], g_c[64 * 64];
static char g_ws[1 << 16];
static int g_off[3] = {0, 20, 40};
static void gemm_ws(size_t less) {
    const size_t need = be->fp8_ws_bytes(be, FP8_OP_GEMM, FP8_WEIGHT, 40, 64, 40, 1);
    GemmDesc d = {.M = 40, .N = 64, .K = 40, .trans_b = 1, .alpha = 1, .fp8 = FP8_WEIGHT, .ws = g_ws,
                  .ws_bytes = need - less};
    be->gemm(be, &d, g_a, g_b, g_c);
}
static void short_ws(void) { gemm_ws(1); }
static void exact_ws(void) { gemm_ws(0); }
static void no_ws(void) {
    GemmDesc d = {.M = 40, .N = 64, .K = 40, .trans_b = 1, .alpha = 1, .fp8 = FP8_ACT, .ws_bytes = sizeof g_ws};
    be->gemm(be, &d, g_a, g_b, g_c);
}
static void grouped_short_ws(void) {
    GemmDesc d = {.N = 64, .K = 40, .trans_b = 1, .alpha = 1, .fp8 = FP8_WEIGHT, .ws = g_ws,
                  .ws_bytes = be->fp8_ws_bytes(be, FP8_OP_GROUPED, FP8_WEIGHT, 40, 64, 40, 2) - 1};
    GroupDesc g = {.groups = 2, .host_off = g_off, .b_stride = 0};
    be->gemm_grouped(be, &d, &g, g_a, g_b, g_c);
}
static void wgrad_weight_mode(void) {
    GroupDesc g = {.groups = 2, .host_off = g_off, .b_stride = 64 * 40, .fp8 = FP8_WEIGHT, .ws = g_ws,
                   .ws_bytes = sizeof g_ws};
    be->gemm_grouped_wgrad(be, &g, 16, 16, g_a, g_b, g_c, 0);
}
static void wgrad_short_ws(void) {
    GroupDesc g = {.groups = 2, .host_off = g_off, .b_stride = 16 * 16, .fp8 = FP8_ACT, .ws = g_ws,
                   .ws_bytes = be->fp8_ws_bytes(be, FP8_OP_WGRAD, FP8_ACT, 40, 16, 16, 2) - 1};
    be->gemm_grouped_wgrad(be, &g, 16, 16, g_a, g_b, g_c, 0);
}

// Fp8WCodes: gemm_grouped with GemmDesc.wq (the weight's codes made by fp8_wcodes_make) gives the
// bits it gives quantising B itself, in both directions (trans_b: B_g = W_g, N = R; without: B_g =
// W_g as [K, N]), through a view from a later group (g0), and in gemm_grouped_swiglu_bwd's data
// gradient; codes made from other values give another product (the op reads them, not B).
static void wcodes_case(int tb) {
    const int off[] = {0, 0, 130, 131, 131, 300}, G = 5, M = 300, R = 130, C = 70;
    const int N = tb ? R : C, K = tb ? C : R;
    const size_t bs = (size_t)R * C;
    float* A = data(M, K, K);
    float* W = data((G + 1) * R, C, C);  // group 0 unused by the ops: the view starts at 1
    float* Wp = dup(W, (G + 1) * bs);
    Wp[2 * bs + 5] *= 1.5f;  // group 1 of the view, one element: its block's codes change
    Fp8WCodes wq = {.R = R, .C = C, .groups = G + 1, .g0 = 1}, wp = wq;
    const size_t cb = be->fp8_wcodes_bytes(be, R, C, G + 1);
    wq.codes = xmalloc(cb), wp.codes = xmalloc(cb);
    be->fp8_wcodes_make(be, W, R, C, G + 1, bs, wq.codes);
    be->fp8_wcodes_make(be, Wp, R, C, G + 1, bs, wp.codes);
    size_t wsb;
    void* ws = ws_for(FP8_OP_GROUPED, FP8_WEIGHT, M, N, K, G, &wsb);
    float* want = xmalloc(sizeof(float) * (size_t)M * N);
    float* got = xmalloc(sizeof(float) * (size_t)M * N);
    float* other = xmalloc(sizeof(float) * (size_t)M * N);
    GemmDesc d = {.N = N, .K = K, .trans_b = tb, .alpha = 1, .fp8 = FP8_WEIGHT, .ws = ws, .ws_bytes = wsb};
    GroupDesc gd = {.groups = G, .host_off = off, .b_stride = bs};
    be->gemm_grouped(be, &d, &gd, A, W + bs, want);
    d.wq = &wq;
    be->gemm_grouped(be, &d, &gd, A, NULL, got);
    EXPECT(bits_equal(got, want, (size_t)M * N), "gemm_grouped tb=%d with the weight codes: the same bits", tb);
    d.wq = &wp;
    be->gemm_grouped(be, &d, &gd, A, W + bs, other);
    EXPECT(!bits_equal(other, want, (size_t)M * N), "gemm_grouped tb=%d: the codes are read, not B", tb);
    if (!tb) {  // the w13 backward op's data gradient (R = 2F, C = K there)
        const int F = R / 2;
        float* dh = data(M, F, F);
        float* gu = data(M, R, R);
        float* gu2 = dup(gu, (size_t)M * R);
        float* X = data(M, C, C);
        float* dW = data(G * R, C, C);
        float* dW2 = dup(dW, (size_t)G * bs);
        float *dx = xmalloc(sizeof(float) * (size_t)M * C), *dx2 = xmalloc(sizeof(float) * (size_t)M * C);
        size_t wb;
        void* ws2 = ws_for(FP8_OP_WGRAD, FP8_ACT, M, R, C, G, &wb);
        GroupDesc g2 = {.groups = G, .host_off = off, .b_stride = bs, .fp8 = FP8_ACT, .ws = ws2, .ws_bytes = wb};
        d.wq = NULL;
        be->gemm_grouped_swiglu_bwd(be, &d, &g2, dh, gu, NULL, NULL, X, W + bs, dW, 0.f, dx);
        d.wq = &wq;
        be->gemm_grouped_swiglu_bwd(be, &d, &g2, dh, gu2, NULL, NULL, X, NULL, dW2, 0.f, dx2);
        EXPECT(bits_equal(dx, dx2, (size_t)M * C) && bits_equal(dW, dW2, (size_t)G * bs),
               "gemm_grouped_swiglu_bwd with the weight codes: the same dX and dW");
        free(dh), free(gu), free(gu2), free(X), free(dW), free(dW2), free(dx), free(dx2), free(ws2);
    }
    free(A), free(W), free(Wp), free(wq.codes), free(wp.codes), free(ws), free(want), free(got), free(other);
}

static void test_wcodes(void) {
    wcodes_case(1);
    wcodes_case(0);
}

static float g_wc[4096];
static void wcodes_use(int f, int R, int g0, int plain) {
    Fp8WCodes w = {.codes = g_wc, .R = R, .C = 40, .groups = 2, .g0 = g0};
    GemmDesc d = {.M = 40, .N = 64, .K = 40, .trans_b = 1, .alpha = 1, .fp8 = (Fp8Gemm)f, .ws = g_ws,
                  .ws_bytes = sizeof g_ws, .wq = &w};
    GroupDesc g = {.groups = 2, .host_off = g_off, .b_stride = 64 * 40};
    if (plain) be->gemm(be, &d, g_a, g_b, g_c);
    else be->gemm_grouped(be, &d, &g, g_a, g_b, g_c);
}
static void wcodes_act_mode(void) { wcodes_use(FP8_ACT, 64, 0, 0); }
static void wcodes_other_shape(void) { wcodes_use(FP8_WEIGHT, 63, 0, 0); }
static void wcodes_past_groups(void) { wcodes_use(FP8_WEIGHT, 64, 1, 0); }
static void wcodes_plain_gemm(void) { wcodes_use(FP8_WEIGHT, 64, 0, 1); }
static void wcodes_fits(void) { wcodes_use(FP8_WEIGHT, 64, 0, 0); }

static void test_ws_checks(void) {
    for (size_t i = 0; i < sizeof g_a / sizeof g_a[0]; i++) g_a[i] = rng_normal(&rng), g_b[i] = rng_normal(&rng);
    EXPECT(be->fp8_ws_bytes(be, FP8_OP_GEMM, FP8_WEIGHT, 40, 64, 40, 1) <= sizeof g_ws, "test workspace large enough");
    EXPECT(dies(short_ws), "gemm fp8: a workspace one byte short is refused");
    EXPECT(!dies(exact_ws), "gemm fp8: an exactly sized workspace passes");
    EXPECT(dies(no_ws), "gemm fp8: no workspace is refused");
    EXPECT(dies(grouped_short_ws), "gemm_grouped fp8: a short workspace is refused");
    EXPECT(dies(wgrad_weight_mode), "gemm_grouped_wgrad: FP8_WEIGHT is refused");
    EXPECT(dies(wgrad_short_ws), "gemm_grouped_wgrad fp8: a short workspace is refused");
    EXPECT(be->fp8_wcodes_bytes(be, 64, 40, 2) <= sizeof g_wc, "test codes buffer large enough");
    EXPECT(!dies(wcodes_fits), "weight codes of the op's shape and groups pass");
    EXPECT(dies(wcodes_act_mode), "weight codes with FP8_ACT are refused");
    EXPECT(dies(wcodes_other_shape), "weight codes of another shape are refused");
    EXPECT(dies(wcodes_past_groups), "a view past the codes' groups is refused");
    EXPECT(dies(wcodes_plain_gemm), "weight codes in gemm (not grouped) are refused");
}

int main(void) {
    cpu_test_begin(31);
    RUN(test_ws_checks);  // first: its children fork before this process runs an OpenMP region
    RUN(test_gemm_spec);
    RUN(test_gemm_model_forms);
    RUN(test_grouped_spec);
    RUN(test_wgrad_spec);
    RUN(test_wgrad_group_tiles_matter);
    RUN(test_fp8_is_active);
    RUN(test_wcodes);
    CPU_TEST_END();
}
