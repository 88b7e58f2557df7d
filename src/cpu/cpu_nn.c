// cpu_nn.c — embedding, RMSNorm, RoPE, causal GQA attention, cross-entropy, AdamW (fp32).
#include <math.h>
#include <string.h>

#include "cpu.h"

static void embed_fwd(Backend* be, void* out_, const void* table_, const int32_t* tok, int N, int H) {
    float* out = out_;
    const float* table = table_;
#pragma omp parallel for
    for (int n = 0; n < N; n++) memcpy(out + (size_t)n * H, table + (size_t)tok[n] * H, sizeof(float) * (size_t)H);
}

static void embed_bwd(Backend* be, float* dtable, const void* dout_, const int32_t* tok, int N, int H) {
    const float* dout = dout_;
#pragma omp parallel for
    for (int h = 0; h < H; h++)  // columns in parallel: no two threads touch one element
        for (int n = 0; n < N; n++) dtable[(size_t)tok[n] * H + h] += dout[(size_t)n * H + h];
}

static void rmsnorm_fwd(Backend* be, void* y_, float* rstd, const void* x_, const void* w_, int N, int H, float eps) {
    float* y = y_;
    const float *x = x_, *w = w_;
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* xr = x + (size_t)n * H;
        double ss = 0;
        for (int h = 0; h < H; h++) ss += (double)xr[h] * xr[h];
        float r = 1.0f / sqrtf((float)(ss / H) + eps);
        rstd[n] = r;
        for (int h = 0; h < H; h++) y[(size_t)n * H + h] = w[h] * (xr[h] * r);
    }
}

static void rmsnorm_bwd(Backend* be, void* dx_, float* dw, const void* dy_, const void* x_, const void* w_,
                        const float* rstd, int N, int H, int accumulate) {
    float* dx = dx_;
    const float *dy = dy_, *x = x_, *w = w_;
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * H, *g = dy + (size_t)n * H;
        const float r = rstd[n];
        double dot = 0;
        for (int h = 0; h < H; h++) dot += (double)g[h] * w[h] * xr[h];
        const float c = (float)(dot / H) * r * r * r;
        float* o = dx + (size_t)n * H;
        for (int h = 0; h < H; h++) {
            float v = g[h] * w[h] * r - xr[h] * c;
            o[h] = accumulate ? o[h] + v : v;
        }
    }
#pragma omp parallel for
    for (int h = 0; h < H; h++) {
        double s = 0;
        for (int n = 0; n < N; n++) s += (double)dy[(size_t)n * H + h] * x[(size_t)n * H + h] * rstd[n];
        dw[h] += (float)s;
    }
}

static void rope(Backend* be, void* x_, int B, int T, int nh, int D, float theta, int inverse) {
    float* x = x_;
    const int half = D / 2;
#pragma omp parallel for
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            double ang = (double)t * pow((double)theta, -2.0 * i / D);
            float c = (float)cos(ang), s = (float)(inverse ? -sin(ang) : sin(ang));
            for (int b = 0; b < B; b++)
                for (int h = 0; h < nh; h++) {
                    float* v = x + (((size_t)b * T + t) * nh + h) * D;
                    float a = v[i], bb = v[i + half];
                    v[i] = a * c - bb * s;
                    v[i + half] = bb * c + a * s;
                }
        }
    }
}

// Scaled score of query (b, t, h) against key (b, s, kh).
static inline float score(const float* q, const float* k, int D, float scale) {
    float d = 0;
    for (int i = 0; i < D; i++) d += q[i] * k[i];
    return d * scale;
}

static void attn_fwd(Backend* be, void* out_, float* lse, const void* q_, const void* k_, const void* v_, int B,
                     int T, int Hq, int Hkv, int D) {
    float* out = out_;
    const float *q = q_, *k = k_, *v = v_;
    const float scale = 1.0f / sqrtf((float)D);
    const int grp = Hq / Hkv;
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++) {
            const int kh = h / grp;
            for (int t = 0; t < T; t++) {
                const float* qr = q + (((size_t)b * T + t) * Hq + h) * D;
                float mx = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    float sc = score(qr, k + (((size_t)b * T + s) * Hkv + kh) * D, D, scale);
                    if (sc > mx) mx = sc;
                }
                double sum = 0;
                for (int s = 0; s <= t; s++)
                    sum += exp(score(qr, k + (((size_t)b * T + s) * Hkv + kh) * D, D, scale) - mx);
                const float l = mx + (float)log(sum);
                lse[((size_t)b * Hq + h) * T + t] = l;
                float* o = out + (((size_t)b * T + t) * Hq + h) * D;
                for (int i = 0; i < D; i++) o[i] = 0;
                for (int s = 0; s <= t; s++) {
                    float p = expf(score(qr, k + (((size_t)b * T + s) * Hkv + kh) * D, D, scale) - l);
                    const float* vr = v + (((size_t)b * T + s) * Hkv + kh) * D;
                    for (int i = 0; i < D; i++) o[i] += p * vr[i];
                }
            }
        }
}

static void attn_bwd(Backend* be, void* dq_, void* dk_, void* dv_, const void* dout_, const void* out_, const float* lse,
                     const void* q_, const void* k_, const void* v_, int B, int T, int Hq, int Hkv, int D) {
    float *dq = dq_, *dk = dk_, *dv = dv_;
    const float *dout = dout_, *out = out_, *q = q_, *k = k_, *v = v_;
    const float scale = 1.0f / sqrtf((float)D);
    const int grp = Hq / Hkv;
    memset(dq, 0, sizeof(float) * (size_t)B * T * Hq * D);
    memset(dk, 0, sizeof(float) * (size_t)B * T * Hkv * D);
    memset(dv, 0, sizeof(float) * (size_t)B * T * Hkv * D);
    // One thread per (b, kv head): it owns dk, dv of that head and dq of its query heads.
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++)
        for (int kh = 0; kh < Hkv; kh++)
            for (int h = kh * grp; h < (kh + 1) * grp; h++)
                for (int t = 0; t < T; t++) {
                    const size_t qi = (((size_t)b * T + t) * Hq + h) * D;
                    const float *qr = q + qi, *g = dout + qi, *o = out + qi;
                    float di = 0;
                    for (int i = 0; i < D; i++) di += g[i] * o[i];
                    const float l = lse[((size_t)b * Hq + h) * T + t];
                    for (int s = 0; s <= t; s++) {
                        const size_t ki = (((size_t)b * T + s) * Hkv + kh) * D;
                        const float p = expf(score(qr, k + ki, D, scale) - l);
                        float dp = 0;
                        for (int i = 0; i < D; i++) dp += g[i] * v[ki + i];
                        const float ds = p * (dp - di) * scale;
                        for (int i = 0; i < D; i++) {
                            dq[qi + i] += ds * k[ki + i];
                            dk[ki + i] += ds * qr[i];
                            dv[ki + i] += p * g[i];
                        }
                    }
                }
}

static void cross_entropy(Backend* be, void* logits_, float* loss, const int32_t* tgt, int n, int V, float grad_scale) {
    float* x = logits_;
    double total = 0;
#pragma omp parallel for reduction(+ : total)
    for (int r = 0; r < n; r++) {
        float* row = x + (size_t)r * V;
        if (tgt[r] < 0) {
            if (grad_scale != 0) memset(row, 0, sizeof(float) * (size_t)V);
            continue;
        }
        float mx = -INFINITY;
        for (int j = 0; j < V; j++) mx = row[j] > mx ? row[j] : mx;
        double s = 0;
        for (int j = 0; j < V; j++) s += exp((double)row[j] - mx);
        const double l = mx + log(s);
        total += l - row[tgt[r]];
        if (grad_scale != 0) {
            for (int j = 0; j < V; j++) row[j] = (float)(exp((double)row[j] - l)) * grad_scale;
            row[tgt[r]] -= grad_scale;
        }
    }
    loss[0] += (float)total;
}

static void adamw(Backend* be, float* master, void* param_, float* m, float* v, const float* grad, size_t n, float lr,
                  float b1, float b2, float eps, float wd, float grad_scale, int step) {
    float* param = param_;
    const float c1 = 1.0f - powf(b1, (float)step), c2 = 1.0f - powf(b2, (float)step);
#pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        const float g = grad[i] * grad_scale;
        float p = master[i] * (1.0f - lr * wd);
        m[i] = b1 * m[i] + (1 - b1) * g;
        v[i] = b2 * v[i] + (1 - b2) * g * g;
        p -= lr * (m[i] / c1) / (sqrtf(v[i] / c2) + eps);
        master[i] = p;
        if (param != master) param[i] = p;
    }
}

void cpu_register_nn(Backend* be) {
    be->embed_fwd = embed_fwd;
    be->embed_bwd = embed_bwd;
    be->rmsnorm_fwd = rmsnorm_fwd;
    be->rmsnorm_bwd = rmsnorm_bwd;
    be->rope = rope;
    be->attn_fwd = attn_fwd;
    be->attn_bwd = attn_bwd;
    be->cross_entropy = cross_entropy;
    be->adamw = adamw;
}
