// cpu_moe.c — the MoE ops: router (softmax over experts, top-k, renormalise, load-balancing
// statistics, z-loss sum) and its backward, the expert-major index, permute / unpermute, and
// SwiGLU with the per-row routing scale. Matches Hugging Face MixtralSparseMoeBlock:
// softmax in fp32, topk, routing_weights /= sum.
#include <math.h>
#include <string.h>

#include "cpu.h"

#define PAR_ROWS 64  // fewer rows than this run on one thread

// logsumexp of one row, in double (max subtracted)
static double row_lse(const float* l, int E) {
    float mx = -INFINITY;
    for (int e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
    if (mx == -INFINITY || mx == INFINITY) return mx;
    double s = 0;
    for (int e = 0; e < E; e++) s += exp((double)l[e] - mx);
    return mx + log(s);
}

// Selects the k largest of p[E] into idx[k], descending; equal values keep the lower index first
// (insertion with a strict comparison while scanning e upwards). NaNs never displace a number,
// and idx always holds k distinct valid experts.
static void topk_row(const float* p, int E, int k, int32_t* idx) {
    int filled = 0;
    for (int e = 0; e < E; e++) {
        int pos = filled;  // first slot whose value is beaten strictly by p[e]
        while (pos > 0 && (p[e] > p[idx[pos - 1]] || (isnan(p[idx[pos - 1]]) && !isnan(p[e])))) pos--;
        if (pos >= k) continue;
        const int last = filled < k ? filled : k - 1;  // the entry pushed off the end (if full)
        for (int j = last; j > pos; j--) idx[j] = idx[j - 1];
        idx[pos] = e;
        if (filled < k) filled++;
    }
}

typedef struct RouterZ {
    const float* logits;
    float* probs;
    int32_t* topk;
    float* topk_w;
    int E, k;
} RouterZ;

// Rows [lo, hi): probs, top-k, renormalised weights; returns Σ lse².
static double router_rows(const void* ctx, size_t lo, size_t hi) {
    const RouterZ* r = ctx;
    const int E = r->E, k = r->k;
    double z = 0;
    for (size_t n = lo; n < hi; n++) {
        const float* l = r->logits + n * E;
        float* p = r->probs + n * E;
        int32_t* idx = r->topk + n * k;
        float* w = r->topk_w + n * k;
        const double lse = row_lse(l, E);
        z += lse * lse;
        for (int e = 0; e < E; e++) p[e] = (float)exp((double)l[e] - lse);
        topk_row(p, E, k, idx);
        double S = 0;
        for (int j = 0; j < k; j++) S += p[idx[j]];
        for (int j = 0; j < k; j++) w[j] = (float)(p[idx[j]] / S);
    }
    return z;
}

void cpu_router_fwd(Backend* be, float* probs, int32_t* topk, float* topk_w, float* stats, float* zsum,
                    const float* logits, int N, int E, int k) {
    // logits, probs [N, E]; topk, topk_w [N, k]; stats [2E] (+=); zsum [1] (+=)
    CHECK(k >= 1 && k <= E, "router_fwd: top_k %d must be in [1, experts %d]", k, E);
    RouterZ r = {logits, probs, topk, topk_w, E, k};
    // rows in fixed chunks (cpu_sum_chunks), so zsum is the same at any thread count
    const double z = cpu_sum_chunks((size_t)N, 1 + 4096 / (size_t)E, router_rows, &r);
    zsum[0] = (float)((double)zsum[0] + z);
    for (size_t i = 0; i < (size_t)N * k; i++) stats[topk[i]] += 1.0f;
    for (int e = 0; e < E; e++) {
        double s = 0;
        for (int n = 0; n < N; n++) s += probs[(size_t)n * E + e];
        stats[E + e] = (float)((double)stats[E + e] + s);
    }
}

// Per row, dL/dlogits from three sources:
//  * top-k weights: w_j = p_{i_j} / S = softmax over the selected logits, so
//    dl_{i_j} = w_j (dw_j − Σ_l w_l dw_l) and 0 for unselected experts (exactly);
//  * aux: dL/dp_e = a_e, through the full softmax: dl_e = p_e (a_e − Σ_f p_f a_f);
//  * z-loss: z_grad · ∂lse²/∂l_e = z_grad · 2 lse · p_e.
void cpu_router_bwd(Backend* be, float* dlogits, const float* dtopk_w, const float* aux_dprob, float z_grad,
                    const float* probs, const int32_t* topk, const float* topk_w, const float* logits, int N, int E,
                    int k) {
    // dlogits, probs, logits [N, E]; dtopk_w, topk, topk_w [N, k]; aux_dprob [E]
#pragma omp parallel for schedule(static) if (N >= PAR_ROWS)
    for (int n = 0; n < N; n++) {
        const float* p = probs + (size_t)n * E;
        float* dl = dlogits + (size_t)n * E;
        double pa = 0;
        if (aux_dprob)
            for (int e = 0; e < E; e++) pa += (double)p[e] * aux_dprob[e];
        const double zc = z_grad != 0 ? 2.0 * z_grad * row_lse(logits + (size_t)n * E, E) : 0.0;
        for (int e = 0; e < E; e++) {
            double g = zc * p[e];
            if (aux_dprob) g += p[e] * (aux_dprob[e] - pa);
            dl[e] = (float)g;
        }
        if (dtopk_w) {
            const float* dw = dtopk_w + (size_t)n * k;
            const float* w = topk_w + (size_t)n * k;
            const int32_t* idx = topk + (size_t)n * k;
            double wd = 0;
            for (int j = 0; j < k; j++) wd += (double)w[j] * dw[j];
            for (int j = 0; j < k; j++) dl[idx[j]] = (float)((double)dl[idx[j]] + w[j] * (dw[j] - wd));
        }
    }
}

// counts[e] = rows routed to e; dest[i] = off[e] + (number of earlier i' with the same expert),
// off = exclusive prefix sum of counts. counts doubles as the running offset, then is restored.
void cpu_moe_index(Backend* be, int32_t* counts, int32_t* dest, const int32_t* topk, int N, int k, int E) {
    // counts [E]; dest, topk [N·k]
    const size_t nk = (size_t)N * k;
    memset(counts, 0, sizeof(int32_t) * (size_t)E);
    for (size_t i = 0; i < nk; i++) {
        CHECK(topk[i] >= 0 && topk[i] < E, "moe_index: expert id %d at row %zu is outside [0, %d)", topk[i], i, E);
        counts[topk[i]]++;
    }
    int32_t run = 0;  // counts → exclusive offsets
    for (int e = 0; e < E; e++) {
        const int32_t c = counts[e];
        counts[e] = run;
        run += c;
    }
    for (size_t i = 0; i < nk; i++) dest[i] = counts[topk[i]]++;  // counts → inclusive offsets
    for (int e = E - 1; e > 0; e--) counts[e] -= counts[e - 1];   // → counts
}

// Copy i of row i / k of src [N, H] to row dest[i] of dst [N·k, H], for i < N·k.
static void copy_to_slots(float* dst, const float* src, const int32_t* dest, int N, int k, int H) {
#pragma omp parallel for schedule(static) if (N >= PAR_ROWS)
    for (int i = 0; i < N * k; i++)
        memcpy(dst + (size_t)dest[i] * H, src + (size_t)(i / k) * H, sizeof(float) * (size_t)H);
}

void cpu_permute_fwd(Backend* be, void* xp, const void* x, const int32_t* dest, int N, int k, int H) {
    copy_to_slots(xp, x, dest, N, k, H);
}

void cpu_permute_bwd(Backend* be, void* dx_, const void* dxp_, const int32_t* dest, int N, int k, int H) {
    float* dx = dx_;        // [N, H]
    const float* dxp = dxp_;  // [N·k, H]
#pragma omp parallel for schedule(static) if (N >= PAR_ROWS)
    for (int n = 0; n < N; n++) {
        float* o = dx + (size_t)n * H;
        memcpy(o, dxp + (size_t)dest[(size_t)n * k] * H, sizeof(float) * (size_t)H);
        for (int s = 1; s < k; s++) {
            const float* r = dxp + (size_t)dest[(size_t)n * k + s] * H;
            for (int h = 0; h < H; h++) o[h] += r[h];
        }
    }
}

void cpu_gather_rows_f32(Backend* be, float* outp, const float* in, const int32_t* dest, int n) {
    for (int i = 0; i < n; i++) outp[dest[i]] = in[i];  // outp, in, dest [n]
}

void cpu_scatter_rows_f32(Backend* be, float* out, const float* inp, const int32_t* dest, int n) {
    for (int i = 0; i < n; i++) out[i] = inp[dest[i]];  // out, inp, dest [n]
}

void cpu_unpermute_fwd(Backend* be, void* out_, const void* yp_, const int32_t* dest, int N, int k, int H,
                       const void* add_) {
    float* out = out_;        // [N, H]
    const float* yp = yp_;    // [N·k, H]
    const float* add = add_;  // [N, H] or NULL; may be out
#pragma omp parallel for schedule(static) if (N >= PAR_ROWS)
    for (int n = 0; n < N; n++) {
        float* o = out + (size_t)n * H;
        if (!add) memset(o, 0, sizeof(float) * (size_t)H);
        else if (add != out) memcpy(o, add + (size_t)n * H, sizeof(float) * (size_t)H);
        for (int s = 0; s < k; s++) {
            const float* r = yp + (size_t)dest[(size_t)n * k + s] * H;
            for (int h = 0; h < H; h++) o[h] += r[h];
        }
    }
}

// Unpermute sums each token's k slots, so each slot's gradient is the token's: permute's copy.
void cpu_unpermute_bwd(Backend* be, void* dyp, const void* dout, const int32_t* dest, int N, int k, int H) {
    copy_to_slots(dyp, dout, dest, N, k, H);
}

// silu(g) = g · sigmoid(g), written g / (1 + e^−g) as torch does
static inline float silu(float g) { return g / (1.0f + expf(-g)); }

void cpu_swiglu_fwd(Backend* be, void* h_, const void* gu_, const float* scale, int n, int F) {
    float* h = h_;          // [n, F]
    const float* gu = gu_;  // [n, 2F] = [gate | up]; scale [n] or NULL
#pragma omp parallel for schedule(static) if ((size_t)n * F >= 32768)
    for (int r = 0; r < n; r++) {
        const float *g = gu + (size_t)r * 2 * F, *u = g + F;
        float* o = h + (size_t)r * F;
        if (scale) {
            const float s = scale[r];
            for (int f = 0; f < F; f++) o[f] = silu(g[f]) * u[f] * s;
        } else {
            for (int f = 0; f < F; f++) o[f] = silu(g[f]) * u[f];
        }
    }
}

// The spec of the fused op (backend.h): the grouped GEMM, then the SwiGLU over every group's rows.
void cpu_gemm_grouped_swiglu(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* A, const void* B, void* gu,
                             void* h, const float* scale) {
    CHECK(d->N % 2 == 0, "gemm_grouped_swiglu: N = %d is not 2F", d->N);
    cpu_gemm_grouped(be, d, g, A, B, gu);
    cpu_swiglu_fwd(be, h, gu, scale, g->host_off[g->groups], d->N / 2);
}

// h = silu(g) · u · s:  du = dh · s · silu(g),  dg = dh · s · u · silu'(g) with
// silu'(g) = σ(g) (1 + g (1 − σ(g))),  dscale = Σ_f dh · silu(g) · u.  dgu may alias gu.
void cpu_swiglu_bwd(Backend* be, void* dgu_, float* dscale, const void* dh_, const void* gu_, const float* scale,
                    int n, int F) {
    float* dgu = dgu_;      // [n, 2F]
    const float* dh = dh_;  // [n, F]
    const float* gu = gu_;  // [n, 2F]; scale, dscale [n] or NULL
#pragma omp parallel for schedule(static) if ((size_t)n * F >= 32768)
    for (int r = 0; r < n; r++) {
        const float *g = gu + (size_t)r * 2 * F, *u = g + F, *d = dh + (size_t)r * F;
        float *dg = dgu + (size_t)r * 2 * F, *du = dg + F;
        const float s = scale ? scale[r] : 1.0f;
        double ds = 0;
        for (int f = 0; f < F; f++) {
            const float gf = g[f], uf = u[f];
            const float sg = 1.0f / (1.0f + expf(-gf)), si = gf / (1.0f + expf(-gf));
            ds += (double)d[f] * (si * uf);
            const float da = d[f] * s;
            du[f] = da * si;
            dg[f] = da * uf * (sg * (1.0f + gf * (1.0f - sg)));
        }
        if (dscale) dscale[r] = (float)ds;
    }
}
