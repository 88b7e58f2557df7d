// generate.c — decoding with a KV cache (generate.h): the forward of model.c's layer_forward at
// n new rows per sequence, with rope_qkv_at / kv_append / attn_decode in place of rope_qkv /
// attn_fwd; and the host-side sampling filter.
#include "generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "util.h"

static inline size_t esz(const Model* m) { return dtype_size(m->be->act_dtype); }
static inline void* act_at(const Model* m, const void* base, size_t off) { return (char*)base + off * esz(m); }
static inline void* W(const Model* m, int arena, size_t off) { return act_at(m, m->w[arena], off); }

static void linear(Model* m, void* C, const void* A, const void* Wt, int M, int N, int K, const void* res) {
    GemmDesc d = {.M = M, .N = N, .K = K, .trans_b = 1, .alpha = 1, .beta = res ? 1.f : 0.f, .c_in = res};
    m->be->gemm(m->be, &d, A, Wt, C);
}

void gen_create(Gen* g, Model* m, int Tmax) { gen_create_batch(g, m, m->B, Tmax); }

void gen_create_batch(Gen* g, Model* m, int B, int Tmax) {
    memset(g, 0, sizeof *g);
    Backend* be = m->be;
    CHECK(be->rope_qkv_at && be->kv_append && be->attn_decode, "the %s backend has no decode ops", be->name);
    CHECK(Tmax >= 1, "generate: cache of %d positions", Tmax);
    CHECK(B >= 1 && B <= m->N, "generate: %d sequences for a model of %d rows", B, m->N);
    g->m = m;
    g->B = B;
    g->Tmax = Tmax;
    const ModelConfig* c = &m->c;
    const size_t kv = (size_t)g->B * c->kv_heads * Tmax * m->pl.head_dim;
    g->kc = xcalloc((size_t)c->layers, sizeof(void*));
    g->vc = xcalloc((size_t)c->layers, sizeof(void*));
    for (int l = 0; l < c->layers; l++) {
        g->kc[l] = be->alloc(be, kv * esz(m));
        g->vc[l] = be->alloc(be, kv * esz(m));
    }
    g->pos = be->alloc(be, sizeof(int32_t) * (size_t)g->B);
    g->len = xcalloc((size_t)g->B, sizeof(int));
    g->rows = be->alloc(be, (size_t)g->B * c->hidden * esz(m));
    g->logits = be->alloc(be, (size_t)g->B * c->vocab_size * esz(m));
    g->logits_f32 = be->alloc(be, (size_t)g->B * c->vocab_size * sizeof(float));
    g->h_logits = xcalloc((size_t)g->B * c->vocab_size, sizeof(float));
}

void gen_free(Gen* g) {
    if (!g->m) return;
    Backend* be = g->m->be;
    for (int l = 0; l < g->m->c.layers; l++) be->free(be, g->kc[l]), be->free(be, g->vc[l]);
    free(g->kc);
    free(g->vc);
    be->free(be, g->pos);
    be->free(be, g->rows);
    be->free(be, g->logits);
    be->free(be, g->logits_f32);
    free(g->len);
    free(g->h_logits);
    memset(g, 0, sizeof *g);
}

void gen_reset(Gen* g) { memset(g->len, 0, sizeof(int) * (size_t)g->B); }

static void gen_layer(Gen* g, int l, int n, void* x_out) {
    Model* m = g->m;
    Backend* be = m->be;
    const ModelConfig* c = &m->c;
    LayerSaved* s = &m->ls[l];
    const LayerOffsets* o = &m->pl.layer[l];
    const int N = g->B * n, H = c->hidden, D = m->pl.head_dim;
    const int QD = c->heads * D, QKV = (c->heads + 2 * c->kv_heads) * D;

    be->rmsnorm_fwd(be, s->ln1, s->rstd1, s->x_in, W(m, 0, o->ln1), N, H, c->rms_eps);
    linear(m, m->s_q, s->ln1, W(m, 0, o->qkv), N, QKV, H, NULL);
    be->rope_qkv_at(be, m->s_q, s->q, s->k, s->v, g->pos, g->B, n, c->heads, c->kv_heads, D, c->rope_theta);
    be->kv_append(be, g->kc[l], g->vc[l], s->k, s->v, g->pos, g->B, n, c->kv_heads, D, g->Tmax);
    be->attn_decode(be, s->att, s->q, g->kc[l], g->vc[l], g->pos, g->B, n, c->heads, c->kv_heads, D, g->Tmax);
    linear(m, s->x_mid, s->att, W(m, 0, o->o), N, H, QD, s->x_in);
    be->rmsnorm_fwd(be, s->ln2, s->rstd2, s->x_mid, W(m, 0, o->ln2), N, H, c->rms_eps);
    moe_forward(m, l, s->ln2, s->x_mid, x_out);
}

void gen_forward(Gen* g, const int32_t* tok, int n, const int* adv, const int* last) {
    Model* m = g->m;
    Backend* be = m->be;
    const ModelConfig* c = &m->c;
    const int B = g->B, N = B * n, H = c->hidden, V = c->vocab_size, L = c->layers;
    CHECK(n >= 1 && N <= m->N, "generate: %d new rows per sequence exceed the model's %d rows", n, m->N / B);
    for (int b = 0; b < B; b++)
        CHECK(g->len[b] + n <= g->Tmax, "generate: sequence %d would pass the cache's %d positions", b, g->Tmax);
    be->to_device(be, g->pos, g->len, sizeof(int32_t) * (size_t)B);  // int and int32_t: the same here
    be->to_device(be, m->tok, tok, sizeof(int32_t) * (size_t)N);
    be->zero(be, m->stats, sizeof(float) * 2 * (size_t)c->experts);
    be->zero(be, m->zsum, sizeof(float));
    bump_reset(&m->bump);
    m->keep_h = 0;
    m->keep_hq = 0;
    const int planned = m->N;
    m->N = N;  // moe_forward routes the first N rows; its buffers are planned for `planned` rows
    be->embed_fwd(be, m->ls[0].x_in, W(m, 0, m->pl.embed), m->tok, N, H);
    for (int l = 0; l < L; l++) gen_layer(g, l, n, l + 1 < L ? m->ls[l + 1].x_in : m->x_final);
    m->N = planned;
    for (int b = 0; b < B; b++) {
        const int r = last ? last[b] : n - 1;
        CHECK(r >= 0 && r < n, "generate: row %d of %d", r, n);
        be->copy(be, act_at(m, g->rows, (size_t)b * H), act_at(m, m->x_final, ((size_t)b * n + r) * H),
                 (size_t)H * esz(m));
    }
    be->rmsnorm_fwd(be, m->lnf, m->rstdf, g->rows, W(m, 0, m->pl.final_norm), B, H, c->rms_eps);
    linear(m, g->logits, m->lnf, W(m, 0, m->pl.lm_head), B, V, H, NULL);
    be->act_to_f32(be, g->logits_f32, g->logits, (size_t)B * V);
    be->to_host(be, g->h_logits, g->logits_f32, sizeof(float) * (size_t)B * V);
    for (int b = 0; b < B; b++) g->len[b] += adv ? adv[b] : n;
}

// ---- sampling ----------------------------------------------------------------------------------

typedef struct {
    float p;
    int i;
} PI;
static int by_prob(const void* a, const void* b) {
    const PI *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->i - y->i;
}

static int argmax(const float* x, int V) {
    int best = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

int gen_filter(const float* logits, int V, float temperature, int top_k, float top_p, float* probs) {
    memset(probs, 0, sizeof(float) * (size_t)V);
    if (!(temperature > 0)) {
        probs[argmax(logits, V)] = 1;
        return 1;
    }
    double mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = fmax(mx, (double)logits[i] / temperature);
    PI* o = xmalloc(sizeof(PI) * (size_t)V);
    double sum = 0;
    for (int i = 0; i < V; i++) {
        o[i].p = (float)exp((double)logits[i] / temperature - mx);
        o[i].i = i;
        sum += o[i].p;
    }
    qsort(o, (size_t)V, sizeof(PI), by_prob);
    int keep = V;
    if (top_k > 0 && top_k < V) keep = top_k;
    double kept = 0;
    for (int j = 0; j < keep; j++) kept += o[j].p;
    if (top_p > 0 && top_p < 1) {
        double cum = 0;
        int j = 0;
        while (j < keep) {
            cum += o[j].p;
            j++;
            if (cum >= top_p * kept) break;
        }
        keep = j;
        kept = cum;
    }
    (void)sum;
    for (int j = 0; j < keep; j++) probs[o[j].i] = (float)(o[j].p / kept);
    free(o);
    return keep;
}

int gen_sample(const float* logits, int V, float temperature, int top_k, float top_p, float* scratch, Rng* rng) {
    if (!(temperature > 0)) return argmax(logits, V);
    gen_filter(logits, V, temperature, top_k, top_p, scratch);
    const double u = rng_uniform(rng);
    double cum = 0;
    int lastnz = 0;
    for (int i = 0; i < V; i++) {
        if (scratch[i] <= 0) continue;
        lastnz = i;
        cum += scratch[i];
        if (u < cum) return i;
    }
    return lastnz;
}
