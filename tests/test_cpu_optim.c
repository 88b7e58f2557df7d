// test_cpu_optim.c — src/cpu/cpu_optim.c: AdamW against the same step in double, a hand-checked
// step, and the split fp32 masters (pack / unpack on every low half, adamw_split against adamw bit
// for bit). Method and the tolerance table: tests/cpu_fd.h.

#include "cpu_fd.h"
#include "op_cases.h"

// ---- AdamW ------------------------------------------------------------------------------------

// Each step against the same step written out in double from the fp32 state before it (the
// state AdamW actually keeps): master, m and v must be that step rounded once to fp32.
static void adamw_case(int n) {
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
    for (int variant = 0; variant < 3; variant++) {
        const float wd = variant == 1 ? 0.0f : 0.1f, gs = variant == 2 ? 0.37f : 1.0f;
        float *master = rnd(n, 1), *m = rnd(n, 0.01f), *v = rnd(n, 0.01f), *param = fill(n, NAN);
        for (int i = 0; i < n; i++) v[i] = v[i] * v[i];
        double worst = 0;
        for (int step = 1; step <= 4; step++) {  // consecutive steps: bias correction per step
            float* grad = rnd(n, 0.1f);
            float *p0 = dup(master, n), *m0 = dup(m, n), *v0 = dup(v, n);
            const int alias = variant == 0 && step % 2 == 0;  // param == master on some steps
            const AdamWDesc d = {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .wd = wd, .grad_scale = gs, .step = step};
            be->adamw(be, &d, master, alias ? (void*)master : (void*)param, m, v, grad, n);
            const double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
            for (int i = 0; i < n; i++) {
                const double g = (float)(grad[i] * gs);  // the clipped gradient, as torch stores it
                const double M = (double)b1 * m0[i] + (1.0 - b1) * g;
                const double Vv = (double)b2 * v0[i] + (1.0 - b2) * g * g;
                const double mh = (float)M / bc1, vh = (float)Vv / bc2;  // from the stored fp32 m, v
                // decoupled decay applied to the old weight, first; then the Adam step
                const double P = p0[i] * (1.0 - (double)lr * wd) - lr * mh / (sqrt(vh) + eps);
                worst = fmax(worst, fabs(master[i] - P) / fabs(P));
                worst = fmax(worst, fabs(m[i] - M) / fabs(M));
                worst = fmax(worst, fabs(v[i] - Vv) / fabs(Vv));
            }
            if (!alias) EXPECT(memcmp(param, master, sizeof(float) * n) == 0, "adamw: param = master copy");
            free(grad), free(p0), free(m0), free(v0);
        }
        EXPECT(worst < TOL_ADAM, "adamw (wd %g, grad_scale %g) vs double steps: rel error %.3g", wd, gs, worst);
        free(master), free(m), free(v), free(param);
    }
    // one hand-checked element: step 1 from zero state moves by lr·sign(g) (bias correction)
    float p = 1.0f, m = 0, v = 0, g = -0.2f, pa;
    const AdamWDesc d1 = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .wd = 0.0f, .grad_scale = 1.0f, .step = 1};
    be->adamw(be, &d1, &p, &pa, &m, &v, &g, 1);
    EXPECT(fabs(p - 1.01) < 1e-6 && pa == p, "adamw step 1: p = 1 − lr·sign(g) = %.7g", p);
}

static void test_adamw(void) {
    for (int i = 0; i < N_CASES(ADAMW_CASES); i++)
        if (ADAMW_CASES[i].where & CASE_CPU) adamw_case((int)ADAMW_CASES[i].n);
}

// ---- split fp32 masters ---------------------------------------------------------------------------

static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
static float float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
// The value of bf16 bits h, with the exponent unbounded: 0x7f80 (inf) counts as 2^128, the next
// value after the largest finite bf16 (what rounding away from it produces).
static double bf16_ext(uint32_t h) {
    h &= 0xffffu;
    if ((h & 0x7fffu) == 0x7f80u) return (h & 0x8000u ? -1 : 1) * ldexp(1, 128);
    return bf16_to_f32((uint16_t)h);
}
// Finite x rounded to bf16 to nearest with ties away from zero, by value (the test's own
// definition): the truncation toward zero (bits hi) or the next bf16 away from zero (hi + 1).
static uint16_t bf16_away(float x) {
    const uint32_t hi = bits_of(x) >> 16;
    const double ax = fabs((double)x), t = fabs(bf16_ext(hi)), up = fabs(bf16_ext(hi + 1));
    return (uint16_t)(up - ax <= ax - t ? hi + 1 : hi);
}

// pack / unpack on every low half (65,536 patterns) under high halves of every kind: ±0,
// denormals, the smallest normal, ordinary values with even and odd truncations, the largest
// finite (whose ties and above round to the inf pattern), and inf / NaN patterns (which must
// round-trip too, although masters never hold them). The round trip is bitwise; w is the
// value-defined rounding, differs from round-to-nearest-even exactly at ties with an even hi,
// and rem is the low half's bits.
static void test_split_pack(void) {
    static const uint16_t his[] = {0x0000, 0x0001, 0x007f, 0x0080, 0x3f80, 0x3f81, 0x4049, 0x7f7e, 0x7f7f, 0x8000,
                                   0x8001, 0x807f, 0xbf80, 0xbf81, 0xc2f7, 0xff7e, 0xff7f, 0x7f80, 0x7fc0, 0xffff};
    enum { NH = sizeof his / sizeof his[0], L = 65536 };
    const size_t n = (size_t)NH * L;
    float* x = xmalloc(sizeof(float) * n);
    for (size_t h = 0; h < NH; h++)
        for (size_t lo = 0; lo < L; lo++) x[h * L + lo] = float_of((uint32_t)his[h] << 16 | (uint32_t)lo);
    uint16_t *w = xmalloc(2 * n), *w2 = xmalloc(2 * n);
    int16_t* rem = xmalloc(2 * n);
    float* back = fill(n, NAN);
    memset(w2, 0xab, 2 * n);
    be->split_pack(be, w, rem, x, n);
    be->split_pack(be, w2, NULL, x, n);  // w only
    be->split_unpack(be, back, w, rem, n);
    size_t bad_trip = 0, bad_w = 0, bad_rem = 0, ties_differ = 0, other_differ = 0, even_ties = 0, inf_w = 0;
    for (size_t h = 0; h < NH; h++) {
        const int finite = (his[h] & 0x7f80u) != 0x7f80u;
        even_ties += finite && !(his[h] & 1);
        for (size_t lo = 0; lo < L; lo++) {
            const size_t i = h * L + lo;
            bad_trip += bits_of(back[i]) != bits_of(x[i]);
            bad_rem += (uint16_t)rem[i] != lo;
            if (!finite) continue;
            bad_w += w[i] != bf16_away(x[i]);
            inf_w += (w[i] & 0x7fffu) == 0x7f80u;
            if (w[i] != f32_to_bf16(x[i])) *(lo == 0x8000 && !(his[h] & 1) ? &ties_differ : &other_differ) += 1;
        }
    }
    EXPECT(bad_trip == 0, "split_pack → split_unpack: %zu of %zu patterns not bit for bit", bad_trip, n);
    EXPECT(bad_rem == 0, "rem is the low half's bits: %zu wrong", bad_rem);
    EXPECT(bad_w == 0, "w is x rounded to nearest, ties away from zero: %zu wrong", bad_w);
    EXPECT(ties_differ == even_ties && other_differ == 0,
           "w differs from round-to-nearest-even at the %zu ties with even hi only: %zu there, %zu elsewhere", even_ties,
           ties_differ, other_differ);
    EXPECT(inf_w == 2 * 32768, "the largest finite hi (±0x7f7f) rounds to the inf pattern from lo = 0x8000: %zu", inf_w);
    EXPECT(memcmp(w, w2, 2 * n) == 0, "split_pack with rem = NULL writes the same w");
    free(x), free(w), free(w2), free(rem), free(back);
}

// adamw_split against adamw (fp32 master, param aliased) on the same inputs over consecutive
// steps: the unpacked masters, m and v bit for bit, and w the tie-away rounding of the master.
// The masters start with ties (low half 0x8000), denormals, ±0 and values whose w is the inf
// pattern; variant 2 has lr = 0 (p·1 − 0 = p exactly), so the ties survive every step and the
// packing inside adamw_split is seen rounding them away from zero.
static void adamw_split_case(int n) {
    const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
    for (int variant = 0; variant < 3; variant++) {
        const float lr = variant == 2 ? 0.0f : 3e-3f, wd = variant == 1 ? 0.0f : 0.1f, gs = variant == 1 ? 0.37f : 1.0f;
        float *master = rnd(n, 1), *m = rnd(n, 0.01f), *v = rnd(n, 0.01f);
        for (int i = 0; i < n; i++) {
            v[i] = v[i] * v[i];
            if (i % 7 == 0) master[i] = float_of((bits_of(master[i]) & 0xffff0000u) | 0x8000u);  // ties
            if (i % 50 == 1) master[i] = float_of((i % 100 == 1 ? 0x80000000u : 0) | (uint32_t)(i * 977u % 0x7fffffu));
        }
        master[2] = 0.0f, master[3] = -0.0f;
        master[4] = float_of(0x7f7fc123u), master[5] = float_of(0xff7f8000u);  // w = ±inf pattern
        float *ms = dup(m, n), *vs = dup(v, n), *back = fill(n, NAN);
        uint16_t* w = xmalloc(2 * n);
        int16_t* rem = xmalloc(2 * n);
        be->split_pack(be, w, rem, master, n);
        int ties = 0, ties0 = 0;
        for (int i = 0; i < n; i++) ties0 += (bits_of(master[i]) & 0xffffu) == 0x8000u;
        for (int step = 1; step <= 4; step++) {
            float* grad = rnd(n, 0.1f);
            const AdamWDesc d = {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .wd = wd, .grad_scale = gs, .step = step};
            be->adamw(be, &d, master, master, m, v, grad, n);
            be->adamw_split(be, &d, w, rem, ms, vs, grad, n);
            be->split_unpack(be, back, w, rem, n);
            size_t dm = 0, dmv = 0, dw = 0;
            for (int i = 0; i < n; i++) {
                dm += bits_of(back[i]) != bits_of(master[i]);
                dmv += bits_of(ms[i]) != bits_of(m[i]) || bits_of(vs[i]) != bits_of(v[i]);
                dw += w[i] != bf16_away(master[i]);
                ties += (bits_of(master[i]) & 0xffffu) == 0x8000u;
            }
            EXPECT(dm == 0 && dmv == 0 && dw == 0,
                   "variant %d step %d: masters %zu, m/v %zu, w %zu of %d differ from adamw's / the tie-away rounding",
                   variant, step, dm, dmv, dw, n);
            free(grad);
        }
        if (variant == 2)
            EXPECT(ties0 >= 100 && ties == 4 * ties0, "lr = 0 keeps the %d ties: %d seen over 4 steps", ties0, ties);
        free(master), free(m), free(v), free(ms), free(vs), free(back), free(w), free(rem);
    }
}

static void test_adamw_split(void) {
    for (int i = 0; i < N_CASES(ADAMW_SPLIT_CASES); i++)
        if (ADAMW_SPLIT_CASES[i].where & CASE_CPU) adamw_split_case((int)ADAMW_SPLIT_CASES[i].n);
}

static void test_adamw_step(void) {
    float master[3] = {1.0f, -2.0f, 0.5f}, m[3] = {0}, v[3] = {0}, g[3] = {0.1f, -0.3f, 2.0f}, p[3];
    const AdamWDesc d = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .wd = 0.1f, .grad_scale = 0.5f, .step = 1};
    be->adamw(be, &d, master, p, m, v, g, 3);
    for (int i = 0; i < 3; i++) {
        double gi = 0.5 * (i == 0 ? 0.1 : i == 1 ? -0.3 : 2.0), x0 = i == 0 ? 1.0 : i == 1 ? -2.0 : 0.5;
        double mh = (0.1 * gi) / 0.1, vh = (0.05 * gi * gi) / 0.05;
        double ref = x0 * (1 - 0.01 * 0.1) - 0.01 * mh / (sqrt(vh) + 1e-8);
        EXPECT(fabs(master[i] - ref) < 1e-6 && p[i] == master[i], "adamw[%d]: %g vs %g", i, master[i], ref);
    }
}

int main(void) {
    cpu_test_begin(20240917);
    RUN(test_adamw);
    RUN(test_adamw_step);
    RUN(test_split_pack);
    RUN(test_adamw_split);
    CPU_TEST_END();
}
