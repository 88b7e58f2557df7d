// cpu_moe.c — router (softmax, top-k, renormalise, statistics), expert-major index,
// permute / unpermute, SwiGLU with the routing scale (fp32).
#include <math.h>
#include <string.h>

#include "cpu.h"

static void router_fwd(Backend* be, float* probs, int32_t* topk, float* topk_w, float* stats, float* zsum,
                       const float* logits, int N, int E, int k) {
    double z = 0;
    for (int n = 0; n < N; n++) {  // sequential: stats accumulate in a fixed order
        const float* l = logits + (size_t)n * E;
        float* p = probs + (size_t)n * E;
        float mx = -INFINITY;
        for (int e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
        double s = 0;
        for (int e = 0; e < E; e++) s += exp((double)l[e] - mx);
        const double lse = mx + log(s);
        z += lse * lse;
        for (int e = 0; e < E; e++) p[e] = (float)exp((double)l[e] - lse);
        float S = 0;
        for (int j = 0; j < k; j++) {  // k passes: largest first, ties to the lower index
            int best = -1;
            for (int e = 0; e < E; e++) {
                int used = 0;
                for (int i = 0; i < j; i++) used |= topk[(size_t)n * k + i] == e;
                if (!used && (best < 0 || p[e] > p[best])) best = e;
            }
            topk[(size_t)n * k + j] = best;
            S += p[best];
        }
        for (int j = 0; j < k; j++) {
            int e = topk[(size_t)n * k + j];
            topk_w[(size_t)n * k + j] = p[e] / S;
            stats[e] += 1.0f;
        }
        for (int e = 0; e < E; e++) stats[E + e] += p[e];
    }
    zsum[0] += (float)z;
}

static void router_bwd(Backend* be, float* dlogits, const float* dtopk_w, const float* aux_dprob, float z_grad,
                       const float* probs, const int32_t* topk, const float* topk_w, const float* logits, int N, int E,
                       int k) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* p = probs + (size_t)n * E;
        float dp[64];
        for (int e = 0; e < E; e++) dp[e] = aux_dprob ? aux_dprob[e] : 0.0f;
        if (dtopk_w) {
            // w_i = p_i / S over the top-k: dp_j = (dw_j − Σ_i dw_i w_i) / S
            float S = 0, dot = 0;
            for (int j = 0; j < k; j++) S += p[topk[(size_t)n * k + j]];
            for (int j = 0; j < k; j++) dot += dtopk_w[(size_t)n * k + j] * topk_w[(size_t)n * k + j];
            for (int j = 0; j < k; j++) dp[topk[(size_t)n * k + j]] += (dtopk_w[(size_t)n * k + j] - dot) / S;
        }
        double sd = 0;
        for (int e = 0; e < E; e++) sd += (double)p[e] * dp[e];
        float* dl = dlogits + (size_t)n * E;
        for (int e = 0; e < E; e++) dl[e] = p[e] * (dp[e] - (float)sd);
        if (z_grad != 0) {
            const float* l = logits + (size_t)n * E;
            float mx = -INFINITY;
            for (int e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
            double s = 0;
            for (int e = 0; e < E; e++) s += exp((double)l[e] - mx);
            const float lse = mx + (float)log(s);
            for (int e = 0; e < E; e++) dl[e] += z_grad * 2.0f * lse * p[e];
        }
    }
}

static void moe_index(Backend* be, int32_t* counts, int32_t* dest, const int32_t* topk, int N, int k, int E) {
    int off[65];
    memset(counts, 0, sizeof(int32_t) * (size_t)E);
    for (int i = 0; i < N * k; i++) counts[topk[i]]++;
    off[0] = 0;
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + counts[e];
    for (int i = 0; i < N * k; i++) dest[i] = off[topk[i]]++;  // stable: token, then slot
}

static void permute_fwd(Backend* be, void* xp_, const void* x_, const int32_t* dest, int N, int k, int H) {
    float* xp = xp_;
    const float* x = x_;
#pragma omp parallel for
    for (int i = 0; i < N * k; i++) memcpy(xp + (size_t)dest[i] * H, x + (size_t)(i / k) * H, sizeof(float) * (size_t)H);
}

static void permute_bwd(Backend* be, void* dx_, const void* dxp_, const int32_t* dest, int N, int k, int H) {
    float* dx = dx_;
    const float* dxp = dxp_;
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float* o = dx + (size_t)n * H;
        for (int h = 0; h < H; h++) o[h] = 0;
        for (int s = 0; s < k; s++) {
            const float* r = dxp + (size_t)dest[n * k + s] * H;
            for (int h = 0; h < H; h++) o[h] += r[h];
        }
    }
}

static void gather_rows_f32(Backend* be, float* outp, const float* in, const int32_t* dest, int n) {
    for (int i = 0; i < n; i++) outp[dest[i]] = in[i];
}

static void scatter_rows_f32(Backend* be, float* out, const float* inp, const int32_t* dest, int n) {
    for (int i = 0; i < n; i++) out[i] = inp[dest[i]];
}

static void unpermute_fwd(Backend* be, void* out_, const void* yp_, const int32_t* dest, int N, int k, int H, int acc) {
    float* out = out_;
    const float* yp = yp_;
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float* o = out + (size_t)n * H;
        if (!acc) for (int h = 0; h < H; h++) o[h] = 0;
        for (int s = 0; s < k; s++) {
            const float* r = yp + (size_t)dest[n * k + s] * H;
            for (int h = 0; h < H; h++) o[h] += r[h];
        }
    }
}

static void unpermute_bwd(Backend* be, void* dyp_, const void* dout_, const int32_t* dest, int N, int k, int H) {
    float* dyp = dyp_;
    const float* dout = dout_;
#pragma omp parallel for
    for (int i = 0; i < N * k; i++) memcpy(dyp + (size_t)dest[i] * H, dout + (size_t)(i / k) * H, sizeof(float) * (size_t)H);
}

static inline float sigm(float g) { return 1.0f / (1.0f + expf(-g)); }

static void swiglu_fwd(Backend* be, void* h_, const void* gu_, const float* scale, int n, int F) {
    float* h = h_;
    const float* gu = gu_;
#pragma omp parallel for
    for (int r = 0; r < n; r++) {
        const float *g = gu + (size_t)r * 2 * F, *u = g + F;
        const float s = scale ? scale[r] : 1.0f;
        for (int f = 0; f < F; f++) h[(size_t)r * F + f] = g[f] * sigm(g[f]) * u[f] * s;
    }
}

static void swiglu_bwd(Backend* be, void* dgu_, float* dscale, const void* dh_, const void* gu_, const float* scale,
                       int n, int F) {
    float* dgu = dgu_;
    const float *dh = dh_, *gu = gu_;
#pragma omp parallel for
    for (int r = 0; r < n; r++) {
        const float *g = gu + (size_t)r * 2 * F, *u = g + F, *d = dh + (size_t)r * F;
        float *dg = dgu + (size_t)r * 2 * F, *du = dg + F;
        const float s = scale ? scale[r] : 1.0f;
        double ds = 0;
        for (int f = 0; f < F; f++) {
            const float sg = sigm(g[f]), silu = g[f] * sg;
            ds += (double)d[f] * silu * u[f];
            const float da = d[f] * s;
            du[f] = da * silu;
            dg[f] = da * u[f] * sg * (1.0f + g[f] * (1.0f - sg));
        }
        if (dscale) dscale[r] = (float)ds;
    }
}

void cpu_register_moe(Backend* be) {
    be->router_fwd = router_fwd;
    be->router_bwd = router_bwd;
    be->moe_index = moe_index;
    be->permute_fwd = permute_fwd;
    be->permute_bwd = permute_bwd;
    be->gather_rows_f32 = gather_rows_f32;
    be->scatter_rows_f32 = scatter_rows_f32;
    be->unpermute_fwd = unpermute_fwd;
    be->unpermute_bwd = unpermute_bwd;
    be->swiglu_fwd = swiglu_fwd;
    be->swiglu_bwd = swiglu_bwd;
}
