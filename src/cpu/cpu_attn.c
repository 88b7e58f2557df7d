// cpu_attn.c — RoPE (Hugging Face rotate_half convention, positions per token when documents are
// packed) and causal GQA attention (block-diagonal causal with packed documents), the
// flash-attention way: the forward keeps a running max and sum per query row (online softmax)
// and saves only lse; the backward recomputes the probabilities from lse. Memory is O(D) per
// thread: no T×T buffer exists anywhere.
#include <math.h>
#include <string.h>

#include "cpu.h"

enum { MAX_D = 1024 };  // head dims up to this (stack accumulators)
enum { BK = 64 };       // keys per online-softmax block (forward)
enum { SB = 16 };       // keys per dK/dV work item (backward)

// ---- RoPE ------------------------------------------------------------------------------------

// nh heads of D per row, rows r = b·T + t: src row r at src + r·lds, dst row r at dst + r·ldd
// (elements; src may equal dst with lds = ldd: in place). Pair (i, i + D/2) at position p (pos[r],
// or t when pos is NULL) rotates by angle p · theta^(−2i/D): x1' = x1 cos − x2 sin,
// x2' = x2 cos + x1 sin (inverse: by −angle). Angles and cos/sin are computed in double and
// rounded to fp32 once (accurate at positions ~32k with theta 1e6); a row's result depends only on
// its values and its position.
static void rope_rows(float* dst, size_t ldd, const float* src, size_t lds, int B, int T, int nh, int D, float theta,
                      int inverse, const int32_t* pos) {
    const int half = D / 2;
    double inv_freq[MAX_D / 2];
    for (int i = 0; i < half; i++) inv_freq[i] = pow((double)theta, -2.0 * i / D);
#pragma omp parallel for schedule(static) if ((size_t)B * T * nh * D >= 32768)
    for (int t = 0; t < T; t++) {
        float c[MAX_D / 2], s[MAX_D / 2];
        int at = -1;  // the position c and s hold
        for (int b = 0; b < B; b++) {
            const int p = pos ? pos[(size_t)b * T + t] : t;
            if (p != at) {
                for (int i = 0; i < half; i++) {
                    const double ang = (double)p * inv_freq[i];
                    c[i] = (float)cos(ang);
                    s[i] = (float)(inverse ? -sin(ang) : sin(ang));
                }
                at = p;
            }
            for (int h = 0; h < nh; h++) {
                const size_t r = (size_t)b * T + t;
                const float* x = src + r * lds + (size_t)h * D;
                float* y = dst + r * ldd + (size_t)h * D;
                for (int i = 0; i < half; i++) {
                    const float x1 = x[i], x2 = x[i + half];
                    y[i] = x1 * c[i] - x2 * s[i];
                    y[i + half] = x2 * c[i] + x1 * s[i];
                }
            }
        }
    }
}

static void check_rope(int D) { CHECK(D % 2 == 0 && D <= MAX_D, "rope: head dim %d must be even and at most %d", D, MAX_D); }

static void check_pos(const int32_t* pos, int B, int T) {
    for (size_t r = 0; pos && r < (size_t)B * T; r++)
        CHECK(pos[r] >= 0 && pos[r] < T, "rope_qkv: position %d of row %zu is outside [0, %d)", pos[r], r, T);
}

// The fused projection's rows qkv [B·T, (Hq + 2·Hkv)·D] against planar q, k, v: q and k rotated,
// v copied (backend.h).
void cpu_rope_qkv(Backend* be, void* qkv_, void* q_, void* k_, void* v_, int B, int T, int Hq, int Hkv, int D,
                  float theta, int inverse, const int32_t* pos) {
    (void)be;
    check_rope(D);
    check_pos(pos, B, T);
    CHECK(Hq > 0 && Hkv >= 0, "rope_qkv: %d query heads, %d kv heads", Hq, Hkv);
    float *qkv = qkv_, *q = q_, *k = k_, *v = v_;
    const size_t ld = (size_t)(Hq + 2 * Hkv) * D, QD = (size_t)Hq * D, KD = (size_t)Hkv * D, rows = (size_t)B * T;
    if (!inverse) {
        rope_rows(q, QD, qkv, ld, B, T, Hq, D, theta, 0, pos);
        if (Hkv) rope_rows(k, KD, qkv + QD, ld, B, T, Hkv, D, theta, 0, pos);
    } else {
        rope_rows(qkv, ld, q, QD, B, T, Hq, D, theta, 1, pos);
        if (Hkv) rope_rows(qkv + QD, ld, k, KD, B, T, Hkv, D, theta, 1, pos);
    }
    for (size_t r = 0; r < rows && Hkv; r++) {
        float *pv = qkv + r * ld + QD + KD, *vv = v + r * KD;
        if (!inverse) memcpy(vv, pv, sizeof(float) * KD);
        else memcpy(pv, vv, sizeof(float) * KD);
    }
}

// ---- attention -------------------------------------------------------------------------------

static inline float dotf(const float* a, const float* b, int D) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < D; i++) s += a[i] * b[i];
    return s;
}

static inline void axpyf(float* y, float a, const float* x, int D) {
#pragma omp simd
    for (int i = 0; i < D; i++) y[i] += a * x[i];
}

static void check_heads(const char* op, int Hq, int Hkv, int D) {
    CHECK(Hkv > 0 && Hq % Hkv == 0, "%s: query heads %d must be a multiple of kv heads %d", op, Hq, Hkv);
    CHECK(D > 0 && D <= MAX_D, "%s: head dim %d must be in [1, %d]", op, D, MAX_D);
}

// doc (backend.h): each window starts a document at 0; every later token either continues the
// previous token's document or starts one at itself.
static void check_doc(const char* op, const int32_t* doc, int B, int T) {
    for (int b = 0; doc && b < B; b++)
        for (int t = 0; t < T; t++) {
            const int32_t d = doc[(size_t)b * T + t];
            CHECK(t ? d == doc[(size_t)b * T + t - 1] || d == t : d == 0,
                  "%s: document start %d at window %d, token %d: must be %s", op, d, b, t,
                  t ? "the previous token's or the token's own index" : "0");
        }
}

// One query row qr against the keys and values s = s_lo..t (row s at kb / vb + s·kst), flash
// style: blocks of BK scores, a running max m and sum l. Writes the normalised output row o and
// returns the row's log-sum-exp m + log l.
static float attend_row(float* o, const float* qr, const float* kb, const float* vb, size_t kst, int s_lo, int t, int D,
                        float scale) {
    float acc[MAX_D], sc[BK];
    for (int i = 0; i < D; i++) acc[i] = 0;
    float m = -INFINITY, l = 0;
    for (int s0 = s_lo; s0 <= t; s0 += BK) {
        const int s1 = s0 + BK < t + 1 ? s0 + BK : t + 1;
        float bm = -INFINITY;
        for (int s = s0; s < s1; s++) {
            sc[s - s0] = dotf(qr, kb + (size_t)s * kst, D) * scale;
            if (sc[s - s0] > bm) bm = sc[s - s0];
        }
        const float mn = bm > m ? bm : m;
        if (mn == -INFINITY) continue;  // every score so far is −inf
        if (mn != m) {                   // rescale what was summed under the old max
            const float corr = expf(m - mn);
            l *= corr;
            for (int i = 0; i < D; i++) acc[i] *= corr;
            m = mn;
        }
        for (int s = s0; s < s1; s++) {
            const float p = expf(sc[s - s0] - m);
            l += p;
            axpyf(acc, p, vb + (size_t)s * kst, D);
        }
    }
    for (int i = 0; i < D; i++) o[i] = acc[i] / l;
    return m + logf(l);
}

// out[b,t,h,:] = Σ_{d≤s≤t} softmax_s(q·k_s · scale) v_s with kv head h / (Hq/Hkv), d = t's
// document start (0 without documents); lse[b,h,t] = log Σ_{d≤s≤t} exp(q·k_s · scale). The key
// blocks start at d, so a token's result is the same bits as its document run alone.
void cpu_attn_fwd(Backend* be, void* out_, float* lse, const void* q_, const void* k_, const void* v_, int B, int T,
                  int Hq, int Hkv, int D, const int32_t* doc) {
    float* out = out_;                                // [B, T, Hq, D]; lse [B, Hq, T]
    const float *q = q_, *k = k_, *v = v_;            // q [B, T, Hq, D], k/v [B, T, Hkv, D]
    check_heads("attn_fwd", Hq, Hkv, D);
    check_doc("attn_fwd", doc, B, T);
    const float scale = 1.0f / sqrtf((float)D);
    const int grp = Hq / Hkv;
#pragma omp parallel for collapse(3) schedule(dynamic, 8)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int t = 0; t < T; t++) {
                const int kh = h / grp;
                const float* qr = q + (((size_t)b * T + t) * Hq + h) * D;
                const float* kb = k + ((size_t)b * T * Hkv + kh) * D;  // key s at kb + s·Hkv·D
                const float* vb = v + ((size_t)b * T * Hkv + kh) * D;
                const size_t kst = (size_t)Hkv * D;
                float* o = out + (((size_t)b * T + t) * Hq + h) * D;
                lse[((size_t)b * Hq + h) * T + t] = attend_row(o, qr, kb, vb, kst, doc ? doc[(size_t)b * T + t] : 0, t, D, scale);
            }
}

// One cpu_attn_bwd call: its operands (dq [B,T,Hq,D]; dk, dv [B,T,Hkv,D]; dout, out, q
// [B,T,Hq,D]; k, v [B,T,Hkv,D]; lse [B,Hq,T]) and shape.
typedef struct AttnBwd {
    float *dq, *dk, *dv;
    const float *dout, *out, *lse, *q, *k, *v;
    const int32_t* doc;
    int T, Hq, Hkv, D, grp;
    size_t qst, kst;  // row strides over t of the query-side and the key-side tensors
    float scale;
} AttnBwd;

// P_ts = exp(q_t·k_s·scale − lse_t) of one visible pair, returned; dS_ts = P_ts (dO_t·v_s − D_t)
// into *ds. qr = q_t, g = dO_t, l = lse_t, Di = D_t.
static float attn_p_ds(const AttnBwd* a, const float* qr, const float* g, const float* ks, const float* vs, float l,
                       float Di, float* ds) {
    const float p = expf(dotf(qr, ks, a->D) * a->scale - l);
    *ds = p * (dotf(g, vs, a->D) - Di);
    return p;
}

// dq_t = scale Σ_{doc[t]≤s≤t} dS_ts k_s for query row t of head h in sequence b.
static void attn_dq_row(const AttnBwd* a, int b, int h, int t) {
    const int T = a->T, D = a->D;
    const size_t kst = a->kst;
    const int kh = h / a->grp;
    const size_t qi = ((size_t)b * T + t) * a->qst + (size_t)h * D;
    const float *qr = a->q + qi, *g = a->dout + qi;
    const float* kb = a->k + (size_t)b * T * kst + (size_t)kh * D;
    const float* vb = a->v + (size_t)b * T * kst + (size_t)kh * D;
    const float Di = dotf(g, a->out + qi, D), l = a->lse[((size_t)b * a->Hq + h) * T + t];
    float acc[MAX_D];
    for (int i = 0; i < D; i++) acc[i] = 0;
    for (int s = a->doc ? a->doc[(size_t)b * T + t] : 0; s <= t; s++) {
        float ds;
        attn_p_ds(a, qr, g, kb + s * kst, vb + s * kst, l, Di, &ds);
        axpyf(acc, ds, kb + s * kst, D);
    }
    for (int i = 0; i < D; i++) a->dq[qi + i] = acc[i] * a->scale;
}

// dk_s = scale Σ dS_ts q_t and dv_s = Σ P_ts dO_t for the keys s0 ≤ s < s1 of kv head kh in
// sequence b, summed over the head's query heads h, then over the rows t ≥ s whose document
// reaches s, in that order.
static void attn_dkdv_block(const AttnBwd* a, int b, int kh, int s0, int s1) {
    const int T = a->T, D = a->D;
    const size_t kst = a->kst;
    const float* kb = a->k + (size_t)b * T * kst + (size_t)kh * D;
    const float* vb = a->v + (size_t)b * T * kst + (size_t)kh * D;
    float* dkb = a->dk + (size_t)b * T * kst + (size_t)kh * D;
    float* dvb = a->dv + (size_t)b * T * kst + (size_t)kh * D;
    for (int s = s0; s < s1; s++) {
        memset(dkb + s * kst, 0, sizeof(float) * (size_t)D);
        memset(dvb + s * kst, 0, sizeof(float) * (size_t)D);
    }
    for (int h = kh * a->grp; h < (kh + 1) * a->grp; h++)
        for (int t = s0; t < T; t++) {
            const int d = a->doc ? a->doc[(size_t)b * T + t] : 0;
            if (d >= s1) break;  // t's document starts after this block: so do all later ones
            const size_t qi = ((size_t)b * T + t) * a->qst + (size_t)h * D;
            const float *qr = a->q + qi, *g = a->dout + qi;
            const float Di = dotf(g, a->out + qi, D), l = a->lse[((size_t)b * a->Hq + h) * T + t];
            const int se = t + 1 < s1 ? t + 1 : s1;
            for (int s = d > s0 ? d : s0; s < se; s++) {
                float ds;
                const float p = attn_p_ds(a, qr, g, kb + s * kst, vb + s * kst, l, Di, &ds);
                axpyf(dvb + s * kst, p, g, D);
                axpyf(dkb + s * kst, ds, qr, D);
            }
        }
    for (int s = s0; s < s1; s++)
        for (int i = 0; i < D; i++) dkb[s * kst + i] *= a->scale;
}

// With P_ts = exp(q_t·k_s·scale − lse_t), dP_ts = dO_t·v_s, D_t = dO_t·O_t, dS = P ∘ (dP − D):
//   dq_t = scale Σ_s dS_ts k_s,  dk_s = scale Σ_{h in group, t≥s} dS_ts q_t,  dv_s = Σ P_ts dO_t,
// over the visible pairs (doc[t] ≤ s ≤ t); every sum runs in the order a document run alone
// would use, so packed documents give the same bits as separate ones.
// Two passes, each output row owned by one work item: dq by query rows, dk/dv by blocks of SB
// keys of one kv head (looping over that head's query heads). P is recomputed in each pass.
void cpu_attn_bwd(Backend* be, void* dq_, void* dk_, void* dv_, const void* dout_, const void* out_, const float* lse,
                  const void* q_, const void* k_, const void* v_, int B, int T, int Hq, int Hkv, int D, void* ws,
                  size_t ws_bytes, const int32_t* doc) {
    (void)ws, (void)ws_bytes;  // the spec needs no workspace
    check_heads("attn_bwd", Hq, Hkv, D);
    check_doc("attn_bwd", doc, B, T);
    const AttnBwd a = {.dq = dq_, .dk = dk_, .dv = dv_, .dout = dout_, .out = out_, .lse = lse, .q = q_, .k = k_,
                       .v = v_, .doc = doc, .T = T, .Hq = Hq, .Hkv = Hkv, .D = D, .grp = Hq / Hkv,
                       .qst = (size_t)Hq * D, .kst = (size_t)Hkv * D, .scale = 1.0f / sqrtf((float)D)};
#pragma omp parallel for collapse(3) schedule(dynamic, 8)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int t = 0; t < T; t++) attn_dq_row(&a, b, h, t);

    const int nsb = (T + SB - 1) / SB;
#pragma omp parallel for collapse(3) schedule(dynamic, 1)
    for (int b = 0; b < B; b++)
        for (int kh = 0; kh < Hkv; kh++)
            for (int sb = 0; sb < nsb; sb++) {
                const int s0 = sb * SB;
                attn_dkdv_block(&a, b, kh, s0, s0 + SB < T ? s0 + SB : T);
            }
}

// ---- decoding with a KV cache (backend.h) -----------------------------------------------------

// rope_qkv's forward with row (b, i) at position pos[b] + i: the same angle arithmetic as
// rope_rows, per row.
void cpu_rope_qkv_at(Backend* be, void* qkv_, void* q_, void* k_, void* v_, const int32_t* pos, int B, int n, int Hq,
                     int Hkv, int D, float theta) {
    (void)be;
    check_rope(D);
    CHECK(Hq > 0 && Hkv >= 0, "rope_qkv_at: %d query heads, %d kv heads", Hq, Hkv);
    const float* qkv = qkv_;
    float *q = q_, *k = k_, *v = v_;
    const size_t ld = (size_t)(Hq + 2 * Hkv) * D, QD = (size_t)Hq * D, KD = (size_t)Hkv * D;
    const int half = D / 2;
    double inv_freq[MAX_D / 2];
    for (int i = 0; i < half; i++) inv_freq[i] = pow((double)theta, -2.0 * i / D);
#pragma omp parallel for schedule(static) if ((size_t)B * n * (Hq + Hkv) * D >= 32768)
    for (size_t r = 0; r < (size_t)B * n; r++) {
        const int b = (int)(r / (size_t)n), t = pos[b] + (int)(r % (size_t)n);
        CHECK(t >= 0, "rope_qkv_at: negative position %d", t);
        float c[MAX_D / 2], s[MAX_D / 2];
        for (int i = 0; i < half; i++) {
            const double ang = (double)t * inv_freq[i];
            c[i] = (float)cos(ang);
            s[i] = (float)sin(ang);
        }
        const float* src = qkv + r * ld;
        for (int h = 0; h < Hq + Hkv; h++) {
            const float* x = src + (size_t)h * D;
            float* y = h < Hq ? q + r * QD + (size_t)h * D : k + r * KD + (size_t)(h - Hq) * D;
            for (int i = 0; i < half; i++) {
                const float x1 = x[i], x2 = x[i + half];
                y[i] = x1 * c[i] - x2 * s[i];
                y[i + half] = x2 * c[i] + x1 * s[i];
            }
        }
        if (Hkv) memcpy(v + r * KD, src + QD + KD, sizeof(float) * KD);
    }
}

void cpu_kv_append(Backend* be, void* kc_, void* vc_, const void* k_, const void* v_, const int32_t* pos, int B, int n,
                   int Hkv, int D, int Tmax) {
    (void)be;
    float *kc = kc_, *vc = vc_;
    const float *k = k_, *v = v_;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < n; i++) {
            const int p = pos[b] + i;
            CHECK(p >= 0, "kv_append: negative position %d", p);
            if (p >= Tmax) continue;
            for (int h = 0; h < Hkv; h++) {
                const size_t src = (((size_t)b * n + i) * Hkv + h) * D, dst = (((size_t)b * Hkv + h) * Tmax + p) * D;
                memcpy(kc + dst, k + src, sizeof(float) * D);
                memcpy(vc + dst, v + src, sizeof(float) * D);
            }
        }
}

// attn_fwd's loop (blocks of BK keys, online softmax) over the cache positions s ≤ p.
void cpu_attn_decode(Backend* be, void* out_, const void* q_, const void* kc_, const void* vc_, const int32_t* pos,
                     int B, int n, int Hq, int Hkv, int D, int Tmax) {
    (void)be;
    float* out = out_;
    const float *q = q_, *kc = kc_, *vc = vc_;
    check_heads("attn_decode", Hq, Hkv, D);
    for (int b = 0; b < B; b++)
        CHECK(pos[b] >= 0 && pos[b] + n <= Tmax, "attn_decode: sequence %d's rows at %d..%d exceed the cache (%d)", b,
              pos[b], pos[b] + n - 1, Tmax);
    const float scale = 1.0f / sqrtf((float)D);
    const int grp = Hq / Hkv;
#pragma omp parallel for collapse(3) schedule(dynamic, 8)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int i = 0; i < n; i++) {
                const int kh = h / grp, t = pos[b] + i;
                const float* qr = q + (((size_t)b * n + i) * Hq + h) * D;
                const float* kb = kc + ((size_t)b * Hkv + kh) * Tmax * D;  // key s at kb + s·D
                const float* vb = vc + ((size_t)b * Hkv + kh) * Tmax * D;
                attend_row(out + (((size_t)b * n + i) * Hq + h) * D, qr, kb, vb, D, 0, t, D, scale);
            }
}
