// fp8_bound.h — the per-element bound a GPU FP8 product is checked against the CPU spec with
// (tests/gpu/test_cuda_fp8.c derives it in its header; dev/test_fp8_wg.c uses it too).
#pragma once
#include <math.h>
#include <stdint.h>

#include "fp8.h"

static double g_dec[256];  // e4m3 → double, exact: fp8_bound_init fills it
static inline void fp8_bound_init(void) {
    for (int v = 0; v < 256; v++) g_dec[v] = (double)fp8_e4m3_to_f32((uint8_t)v);
}

// The bound on |r_gpu − r_spec| for one output element: row a (codes, its Kt scales sa) of the
// spec's A against row b (sb) of its B, K long: 2·γ_{Kt+2}·S + Σ_t |w_t|·E_t, S = Σ_k |w_t(k)·p_k|,
// E_t = Σ_steps 36 · 2^-12 · M_s.
static inline double fp8_bound_elem(const uint8_t* a, const float* sa, const uint8_t* b, const float* sb, int K) {
    const int Kt = (K + FP8_TILE - 1) / FP8_TILE;
    const double u = ldexp(1, -24), g = (Kt + 2) * u / (1 - (Kt + 2) * u), utc = ldexp(1, -12);
    double S = 0, B = 0;
    for (int t = 0; t < Kt; t++) {
        const double w = fabs((double)sa[t] * (double)sb[t]);
        double prefix = 0, e = 0, st = 0;
        for (int k0 = t * FP8_TILE; k0 < K && k0 < (t + 1) * FP8_TILE; k0 += 32) {
            double mp = 0, mx = fabs(prefix);  // the largest |product| and |running sum| of the step
            for (int k = k0; k < k0 + 32 && k < K; k++) {
                const double p = g_dec[a[k]] * g_dec[b[k]];
                mp = fmax(mp, fabs(p));
                prefix += p;
                st += fabs(p);
                if ((k - k0) % 8 == 7 || k + 1 == K) mx = fmax(mx, fabs(prefix));
            }
            e += 36 * utc * fmax(mx + e, mp);
        }
        S += w * st;
        B += w * e;
    }
    return 2 * g * S + B;
}
