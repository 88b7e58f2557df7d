// cpu_norm.c — embedding lookup and RMSNorm (fp32, Hugging Face MixtralRMSNorm semantics:
// y = w · (x · rsqrt(mean(x²) + eps)), the mean taken in double and rounded once).
#include <math.h>
#include <string.h>

#include "cpu.h"

#define PAR_ROWS 64  // fewer rows than this run on one thread

void cpu_embed_fwd(Backend* be, void* out_, const void* table_, const int32_t* tok, int N, int H) {
    float* out = out_;            // [N, H]
    const float* table = table_;  // [V, H]
#pragma omp parallel for schedule(static) if (N >= PAR_ROWS)
    for (int n = 0; n < N; n++)
        memcpy(out + (size_t)n * H, table + (size_t)tok[n] * H, sizeof(float) * (size_t)H);
}

// Each thread owns a slice of columns of dtable, so no two threads touch one element and every
// element sums its tokens in order n = 0..N-1 (deterministic with repeated tokens).
void cpu_embed_bwd(Backend* be, float* dtable, const void* dout_, const int32_t* tok, int N, int H, int V) {
    const float* dout = dout_;  // [N, H]; dtable [V, H]
    for (int n = 0; n < N; n++)
        CHECK(tok[n] >= 0 && tok[n] < V, "embed_bwd: token %d at row %d is outside [0, %d)", tok[n], n, V);
    enum { COLS = 64 };
    const int nb = (H + COLS - 1) / COLS;
#pragma omp parallel for schedule(static) if ((size_t)N * H >= 65536)
    for (int b = 0; b < nb; b++) {
        const int h0 = b * COLS, h1 = h0 + COLS < H ? h0 + COLS : H;
        for (int n = 0; n < N; n++) {
            float* d = dtable + (size_t)tok[n] * H;
            const float* g = dout + (size_t)n * H;
            for (int h = h0; h < h1; h++) d[h] += g[h];
        }
    }
}

void cpu_rmsnorm_fwd(Backend* be, void* y_, float* rstd, const void* x_, const void* w_, int N, int H, float eps) {
    float* y = y_;         // [N, H]
    const float* x = x_;   // [N, H]
    const float* w = w_;   // [H]; rstd [N]
#pragma omp parallel for schedule(static) if (N >= PAR_ROWS)
    for (int n = 0; n < N; n++) {
        const float* xr = x + (size_t)n * H;
        float* yr = y + (size_t)n * H;
        double ss = 0;
        for (int h = 0; h < H; h++) ss += (double)xr[h] * xr[h];
        const float r = 1.0f / sqrtf((float)(ss / H) + eps);
        rstd[n] = r;
        for (int h = 0; h < H; h++) yr[h] = w[h] * (xr[h] * r);
    }
}

// With r = rstd[n]: y_h = w_h x_h r, ∂r/∂x_j = −r³ x_j / H, so
//   dx_j = r w_j dy_j − x_j r³ (Σ_h dy_h w_h x_h) / H,   dw_h += Σ_n dy_nh x_nh r_n.
// dw is summed before dx is written, so dx may alias dy.
void cpu_rmsnorm_bwd(Backend* be, void* dx_, float* dw, const void* dy_, const void* x_, const void* w_,
                     const float* rstd, int N, int H, int accumulate) {
    float* dx = dx_;        // [N, H]
    const float* dy = dy_;  // [N, H]
    const float* x = x_;    // [N, H]
    const float* w = w_;    // [H]; dw [H] fp32; rstd [N]
    enum { COLS = 64 };  // dw by column slices: each element sums n = 0..N-1 in order
    const int nb = (H + COLS - 1) / COLS;
#pragma omp parallel for schedule(static) if ((size_t)N * H >= 65536)
    for (int b = 0; b < nb; b++) {
        const int h0 = b * COLS, nh = h0 + COLS < H ? COLS : H - h0;
        double s[COLS] = {0};
        for (int n = 0; n < N; n++) {
            const float *g = dy + (size_t)n * H + h0, *xr = x + (size_t)n * H + h0;
            const double r = rstd[n];
            for (int j = 0; j < nh; j++) s[j] += (double)g[j] * xr[j] * r;
        }
        for (int j = 0; j < nh; j++) dw[h0 + j] = (float)((double)dw[h0 + j] + s[j]);
    }
#pragma omp parallel for schedule(static) if (N >= PAR_ROWS)
    for (int n = 0; n < N; n++) {
        const float* xr = x + (size_t)n * H;
        const float* g = dy + (size_t)n * H;
        float* o = dx + (size_t)n * H;
        const float r = rstd[n];
        double dot = 0;
        for (int h = 0; h < H; h++) dot += (double)g[h] * w[h] * xr[h];
        const float c = (float)(dot / H * (double)r * r * r);
        for (int h = 0; h < H; h++) {
            const float v = r * (w[h] * g[h]) - c * xr[h];
            o[h] = accumulate ? o[h] + v : v;
        }
    }
}
