// model.c — the Mixtral graph: memory plan, init, forward and backward of one micro-batch.
// The MoE block (router, dispatch, experts) is in moe.c.
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "failpoint.h"
#include "moe.h"
#include "prof.h"
#include "util.h"

// Pointer to element `off` of an act buffer.
static inline void* act_at(const Model* m, const void* base, size_t off) {
    return (char*)base + off * dtype_size(m->be->act_dtype);
}
static inline void* W(const Model* m, int arena, size_t off) { return act_at(m, m->w[arena], off); }
static inline float* G(const Model* m, int arena, size_t off) { return m->grad[arena] + off; }

static void* act_alloc(Model* m, size_t n) { return m->be->alloc(m->be, n * dtype_size(m->be->act_dtype)); }
static float* f32_alloc(Model* m, size_t n) { return m->be->alloc(m->be, n * sizeof(float)); }

// The dense linear GEMMs. f: FP8_OFF, or the block-scaled FP8 product (backend.h), whose workspace
// comes from m->tmp: the MoE's per-layer scratch, dead wherever these run (before moe_forward resets
// it, after moe_backward returned, and around the attention backward, which takes all of it).
static void gemm_lin(Model* m, GemmDesc* d, const void* A, const void* B, void* C, Fp8Gemm f) {
    d->fp8 = f;
    if (f) {
        d->ws_bytes = m->be->fp8_ws_bytes(m->be, FP8_OP_GEMM, f, d->M, d->N, d->K, 1);
        bump_reset(&m->tmp);
        d->ws = bump_alloc(&m->tmp, d->ws_bytes);
    }
    m->be->gemm(m->be, d, A, B, C);
}
// f for an attention projection's GEMM of kind k (FP8_WEIGHT: forward and data gradient; FP8_ACT:
// weight gradient): FP8 with precision.fp8=linear
static inline Fp8Gemm proj(const Model* m, Fp8Gemm k) { return m->fp8 == FP8_LINEAR ? k : FP8_OFF; }

// C = A · Bᵀ (linear layer: A [M,K] act, W [N,K] act), C act (beta 0 or 1).
static void linear(Model* m, void* C, const void* A, const void* Wt, int M, int N, int K, float beta, Fp8Gemm f) {
    GemmDesc d = {.M = M, .N = N, .K = K, .trans_b = 1, .alpha = 1, .beta = beta};
    gemm_lin(m, &d, A, Wt, C, f);
}
// C = R + A · Wᵀ  (the residual R [M,N] read in place of C: no copy)
static void linear_res(Model* m, void* C, const void* R, const void* A, const void* Wt, int M, int N, int K,
                       Fp8Gemm f) {
    GemmDesc d = {.M = M, .N = N, .K = K, .trans_b = 1, .alpha = 1, .beta = 1, .c_in = R};
    gemm_lin(m, &d, A, Wt, C, f);
}
// dX (+)= dY · W  (dY [M,N], W [N,K]) → [M,K]
static void linear_dx(Model* m, void* dX, const void* dY, const void* Wt, int M, int N, int K, float beta, Fp8Gemm f) {
    GemmDesc d = {.M = M, .N = K, .K = N, .alpha = 1, .beta = beta};
    gemm_lin(m, &d, dY, Wt, dX, f);
}
// dW[N,K] (+)= dYᵀ · X  (dY [M,N], X [M,K]), fp32; overwrites on the first write of a fresh step
static void linear_dw(Model* m, float* dW, const void* dY, const void* X, int M, int N, int K, int first, Fp8Gemm f) {
    GemmDesc d = {.M = N, .N = K, .K = M, .trans_a = 1, .alpha = 1, .beta = (m->fresh && first) ? 0.f : 1.f, .c_f32 = 1};
    gemm_lin(m, &d, dY, X, dW, f);
}

size_t model_fp8_ws_max(Backend* be, const Fp8Call* calls, int n) {
    size_t mx = 0;
    for (int i = 0; i < n; i++) {
        const Fp8Call* c = &calls[i];
        const size_t w = be->fp8_ws_bytes(be, c->op, c->kind, c->M, c->N, c->K, c->groups);
        if (w > mx) mx = w;
    }
    return mx;
}

// The largest workspace of the attention projections' FP8 GEMMs (0 unless precision.fp8=linear).
static size_t proj_fp8_ws(const Model* m) {
    if (m->fp8 != FP8_LINEAR) return 0;
    const int N = m->N, H = m->c.hidden, D = m->pl.head_dim;
    const int QD = m->c.heads * D, QKV = (m->c.heads + 2 * m->c.kv_heads) * D;
    const Fp8Call w[] = {
        {FP8_OP_GEMM, FP8_WEIGHT, N, QKV, H, 1},  // qkv forward
        {FP8_OP_GEMM, FP8_WEIGHT, N, H, QD, 1},   // o forward
        {FP8_OP_GEMM, FP8_WEIGHT, N, QD, H, 1},   // o data gradient
        {FP8_OP_GEMM, FP8_ACT, H, QD, N, 1},      // o weight gradient
        {FP8_OP_GEMM, FP8_ACT, QKV, H, N, 1},     // qkv weight gradient
        {FP8_OP_GEMM, FP8_WEIGHT, N, H, QKV, 1},  // qkv data gradient
    };
    const int n = m->inference ? 2 : (int)(sizeof w / sizeof w[0]);  // inference: the forward's two
    return model_fp8_ws_max(m->be, w, n);
}

int model_fp8_check(const Backend* be, Fp8Mode mode, Err* e) {
    if (mode == FP8_NONE || be->fp8_ws_bytes) return 0;
    return err_set(e, "precision.fp8=%s: the %s backend (%s) has no FP8 GEMMs (on CUDA they need compute capability "
                   "8.9 or later and a build with code for it, e.g. make SM=89 or SM=90a); use precision.fp8=none",
                   fp8_mode_name(mode), be->name, be->device ? be->device : "?");
}

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

void model_create(Model* m, const ModelConfig* c, int B, int T, Backend* be, Comm* comm) {
    model_create_opts(m, c, B, T, NULL, be, comm);
}

// Options, the communicator's ranks, the parameter layout and the weight and gradient arenas
// (padded so that ZeRO shards split them evenly).
static void setup(Model* m, const ModelConfig* c, int B, int T, const ModelOpts* o, Backend* be, Comm* comm) {
    memset(m, 0, sizeof *m);
    m->c = *c;
    m->keep_swiglu = o && o->keep_swiglu;
    m->grad_act[ARENA_EXPERT] = o && o->expert_grad_act;
    m->fp8 = o ? o->fp8 : FP8_NONE;
    m->inference = o && o->inference;
    CHECK(m->fp8 == FP8_NONE || be->fp8_ws_bytes, "precision.fp8=%s on the %s backend, which has no FP8 GEMMs",
          fp8_mode_name(m->fp8), be->name);
    m->be = be;
    m->comm = comm;
    m->world = comm->size[GROUP_WORLD];
    m->rank = comm->rank[GROUP_WORLD];
    m->ep = comm->size[GROUP_EP];
    m->ep_rank = comm->rank[GROUP_EP];
    m->edp = comm->size[GROUP_EDP];
    m->edp_rank = comm->rank[GROUP_EDP];
    m->e_local = c->experts / m->ep;
    m->force_exchange = failpoint_int("moe.force_exchange", 0) == 1;  // tests: the exchange path at EP = 1
    m->B = B;
    m->T = T;
    m->N = B * T;
    params_build(&m->pl, c, m->ep, m->ep_rank);

    m->numel[ARENA_DENSE] = m->pl.numel[ARENA_DENSE];
    m->numel[ARENA_EXPERT] = m->pl.numel[ARENA_EXPERT];
    m->padded[ARENA_DENSE] = round_up(m->numel[ARENA_DENSE], 8 * (size_t)m->world);
    m->padded[ARENA_EXPERT] = round_up(m->numel[ARENA_EXPERT], 8 * (size_t)m->edp);
    // precision.fp8_weights=per_step: each layer's w13 [2F, H] and w2 [H, F] codes for the local
    // experts (Model.wq), in the expert gradient arena past its gradients, each on 256 bytes
    size_t gbytes[2] = {sizeof(float) * m->padded[0], sizeof(float) * m->padded[1]};
    if (o && o->fp8_wcodes && m->fp8 != FP8_NONE && !m->inference) {
        CHECK(be->fp8_wcodes_bytes && be->fp8_wcodes_make, "precision.fp8_weights=per_step: the %s backend keeps "
              "no FP8 weight codes", be->name);
        const int L = c->layers, H = c->hidden, F = c->ffn, E = m->e_local;
        m->wq = xcalloc(2 * (size_t)L, sizeof(Fp8WCodes));
        m->wq_off = round_up(grad_esize(m, ARENA_EXPERT) * m->padded[ARENA_EXPERT], 256);
        for (int l = 0; l < L; l++) {
            m->wq[2 * l] = (Fp8WCodes){.R = 2 * F, .C = H, .groups = E};
            m->wq[2 * l + 1] = (Fp8WCodes){.R = H, .C = F, .groups = E};
        }
        for (int i = 0; i < 2 * L; i++)
            m->wq_bytes += round_up(be->fp8_wcodes_bytes(be, m->wq[i].R, m->wq[i].C, E), 256);
        if (m->wq_off + m->wq_bytes > gbytes[ARENA_EXPERT]) gbytes[ARENA_EXPERT] = m->wq_off + m->wq_bytes;
    }
    for (int a = 0; a < 2; a++) {
        m->w[a] = act_alloc(m, m->padded[a]);
        m->grad[a] = m->inference ? NULL : f32_alloc(m, (gbytes[a] + sizeof(float) - 1) / sizeof(float));
    }
    for (size_t i = 0, at = m->wq_off; m->wq && i < 2 * (size_t)c->layers; i++) {
        m->wq[i].codes = (char*)m->grad[ARENA_EXPERT] + at;
        at += round_up(be->fp8_wcodes_bytes(be, m->wq[i].R, m->wq[i].C, m->e_local), 256);
    }
}

// What each layer's forward saves for its backward. With inference nothing is kept for a backward,
// so layer 0's buffers serve every layer (x_in too: a layer's input is dead once x_mid holds it plus
// the attention, when the MoE writes the output).
static void layers_alloc(Model* m) {
    const ModelConfig* c = &m->c;
    const int N = m->N, H = c->hidden, D = m->pl.head_dim, QD = c->heads * D, KD = c->kv_heads * D;
    m->ls = xcalloc((size_t)c->layers, sizeof(LayerSaved));
    for (int l = 0; l < (m->inference ? 1 : c->layers); l++) {
        LayerSaved* s = &m->ls[l];
        s->x_in = act_alloc(m, (size_t)N * H);
        s->ln1 = act_alloc(m, (size_t)N * H);
        s->rstd1 = f32_alloc(m, N);
        // q, k, v in one block: the backward writes the fused projection's gradient over them
        s->q = act_alloc(m, (size_t)N * (QD + 2 * KD));
        s->k = act_at(m, s->q, (size_t)N * QD);
        s->v = act_at(m, s->k, (size_t)N * KD);
        s->att = act_alloc(m, (size_t)N * QD);
        s->lse = f32_alloc(m, (size_t)m->B * c->heads * m->T);
        s->x_mid = act_alloc(m, (size_t)N * H);
        s->ln2 = act_alloc(m, (size_t)N * H);
        s->rstd2 = f32_alloc(m, N);
        moe_saved_alloc(m, &s->moe);
    }
    for (int l = 1; m->inference && l < c->layers; l++) m->ls[l] = m->ls[0];
}

// The final norm, the batch's tokens, the router statistics and the scratch shared by all layers.
static void buffers_alloc(Model* m) {
    Backend* be = m->be;
    const ModelConfig* c = &m->c;
    const int N = m->N, H = c->hidden, E = c->experts, K = c->top_k;
    const int D = m->pl.head_dim, QD = c->heads * D, KD = c->kv_heads * D;
    m->x_final = act_alloc(m, (size_t)N * H);
    m->lnf = act_alloc(m, (size_t)N * H);
    m->rstdf = f32_alloc(m, N);
    m->tok = be->alloc(be, sizeof(int32_t) * (size_t)N);
    m->tgt = be->alloc(be, sizeof(int32_t) * (size_t)N);
    m->doc = be->alloc(be, sizeof(int32_t) * (size_t)N);
    m->pos = be->alloc(be, sizeof(int32_t) * (size_t)N);
    m->stats = f32_alloc(m, 2 * (size_t)E);
    m->zsum = f32_alloc(m, 1);
    m->loss_acc = f32_alloc(m, 1);
    m->h_stats = xcalloc(2 * (size_t)E, sizeof(float));
    m->s_q = act_alloc(m, (size_t)N * (QD + 2 * KD));  // one block: the forward's fused projection
    m->s_k = act_at(m, m->s_q, (size_t)N * QD);
    m->s_v = act_at(m, m->s_k, (size_t)N * KD);
    if (!m->inference) {  // the backward's scratch
        size_t wide = (size_t)(H > QD ? H : QD);
        m->aux_dprob = f32_alloc(m, E);
        m->s_a = act_alloc(m, (size_t)N * wide);
        m->s_b = act_alloc(m, (size_t)N * wide);
        m->s_dx = act_alloc(m, (size_t)N * H);
        m->s_dlog = f32_alloc(m, (size_t)N * E);
        m->s_dlog_act = act_alloc(m, (size_t)N * E);
        m->s_dw = f32_alloc(m, (size_t)N * K);
    }
    m->s_xp = act_alloc(m, (size_t)N * K * H);
    m->s_wp = f32_alloc(m, (size_t)N * K);
    // lm_head logits in chunks of tokens: at most MODEL_HEAD_CHUNK_BYTES of logits at a time.
    const int V = c->vocab_size;
    size_t per_tok = (size_t)V * dtype_size(be->act_dtype);
    size_t chunk = MODEL_HEAD_CHUNK_BYTES / per_tok;
    if (chunk < 1) chunk = 1;
    if (chunk > (size_t)N) chunk = (size_t)N;
    m->head_chunk = (int)chunk;
    m->s_logits = act_alloc(m, chunk * (size_t)V);
    m->counts = be->alloc(be, sizeof(int32_t) * (size_t)E);
    m->h_counts = xcalloc((size_t)E, sizeof(int32_t));
}

void model_create_opts(Model* m, const ModelConfig* c, int B, int T, const ModelOpts* o, Backend* be, Comm* comm) {
    setup(m, c, B, T, o, be, comm);
    layers_alloc(m);
    buffers_alloc(m);
    moe_plan_bumps(m, proj_fp8_ws(m));
}

void model_free(Model* m) {
    Backend* be = m->be;
    for (int a = 0; a < 2; a++) {
        be->free(be, m->w[a]);
        be->free(be, m->grad[a]);
    }
    for (int l = 0; l < (m->inference ? 1 : m->c.layers); l++) {  // inference: one set, shared
        LayerSaved* s = &m->ls[l];
        void* bufs[] = {s->x_in, s->ln1, s->rstd1, s->q, s->att, s->lse, s->x_mid, s->ln2, s->rstd2};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
        moe_saved_free(m, &s->moe);
    }
    free(m->ls);
    void* bufs[] = {m->x_final, m->lnf, m->rstdf, m->tok, m->tgt, m->doc, m->pos, m->stats, m->zsum, m->aux_dprob,
                    m->loss_acc, m->s_a, m->s_b, m->s_dx, m->s_q, m->s_dlog,
                    m->s_dlog_act, m->s_dw, m->s_xp, m->s_wp, m->s_logits, m->counts};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
    free(m->wq);  // the codes are in m->grad[ARENA_EXPERT]
    free(m->h_stats);
    free(m->h_counts);
    bump_free(&m->bump);
    bump_free(&m->tmp);
    params_free(&m->pl);
}

// ---- init ------------------------------------------------------------------------------------

static uint64_t fnv1a(const char* s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

void model_init_tensor(const ModelConfig* c, const ParamInfo* p, uint64_t seed, float* dst) {
    if (p->no_decay) {  // norm weights
        for (size_t i = 0; i < p->numel; i++) dst[i] = 1.0f;
        return;
    }
    // Blocks of 64K elements with their own stream: deterministic, and parallel.
    const size_t blk = 65536;
    const size_t nblk = (p->numel + blk - 1) / blk;
    const uint64_t base = fnv1a(p->name) ^ (seed * 0x9E3779B97F4A7C15ull);
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nblk; b++) {
        Rng r;
        rng_seed(&r, base + b);
        size_t hi = (b + 1) * blk < p->numel ? (b + 1) * blk : p->numel;
        for (size_t i = b * blk; i < hi; i++) dst[i] = c->init_std * rng_normal(&r);
    }
}

// ---- forward / backward ----------------------------------------------------------------------

static void layer_forward(Model* m, int l, void* x_out) {
    Backend* be = m->be;
    const ModelConfig* c = &m->c;
    LayerSaved* s = &m->ls[l];
    const LayerOffsets* o = &m->pl.layer[l];
    const int N = m->N, H = c->hidden, D = m->pl.head_dim;
    const int QD = c->heads * D, QKV = (c->heads + 2 * c->kv_heads) * D;

    be->rmsnorm_fwd(be, s->ln1, s->rstd1, s->x_in, W(m, 0, o->ln1), N, H, c->rms_eps);
    prof_mark("fwd.norm");
    // one GEMM against the stacked q/k/v weight [QKV, H] (rows packed q|k|v, scratch), then RoPE
    // splits it into the saved q, k (rotated) and v
    linear(m, m->s_q, s->ln1, W(m, 0, o->qkv), N, QKV, H, 0, proj(m, FP8_WEIGHT));
    prof_mark("fwd.qkv_gemm");
    be->rope_qkv(be, m->s_q, s->q, s->k, s->v, m->B, m->T, c->heads, c->kv_heads, D, c->rope_theta, 0, m->cur_pos);
    prof_mark("fwd.rope");
    be->attn_fwd(be, s->att, s->lse, s->q, s->k, s->v, m->B, m->T, c->heads, c->kv_heads, D, m->cur_doc);
    prof_mark("fwd.attn");
    // x_mid = x_in + att · Woᵀ
    linear_res(m, s->x_mid, s->x_in, s->att, W(m, 0, o->o), N, H, QD, proj(m, FP8_WEIGHT));
    prof_mark("fwd.o_gemm");
    be->rmsnorm_fwd(be, s->ln2, s->rstd2, s->x_mid, W(m, 0, o->ln2), N, H, c->rms_eps);
    prof_mark("fwd.norm");
    // x_out = x_mid + moe(ln2) (the combine adds the residual: no copy)
    moe_forward(m, l, s->ln2, s->x_mid, x_out);
}

// m->s_dx holds dL/dx_out on entry and dL/dx_in on return.
static void layer_backward(Model* m, int l) {
    Backend* be = m->be;
    const ModelConfig* c = &m->c;
    LayerSaved* s = &m->ls[l];
    const LayerOffsets* o = &m->pl.layer[l];
    const int N = m->N, H = c->hidden, D = m->pl.head_dim;
    const int QD = c->heads * D, QKV = (c->heads + 2 * c->kv_heads) * D;

    // MoE: dln2 into s_a, then through RMSNorm 2 into the residual gradient.
    moe_backward(m, l, m->s_dx, m->s_a);
    be->rmsnorm_bwd(be, m->s_dx, G(m, 0, o->ln2), m->s_a, s->x_mid, W(m, 0, o->ln2), s->rstd2, N, H, 1);
    prof_mark("bwd.norm");

    // attention output projection
    void* datt = m->s_a;  // [N, QD]
    linear_dx(m, datt, m->s_dx, W(m, 0, o->o), N, H, QD, 0, proj(m, FP8_WEIGHT));
    prof_mark("bwd.o_gemm");
    linear_dw(m, G(m, 0, o->o), m->s_dx, s->att, N, H, QD, 1, proj(m, FP8_ACT));
    prof_mark("bwd.o_wgrad");
    // workspace: the MoE's per-layer scratch, dead once moe_backward returned (the next use
    // resets it); at micro-batch 8 × 4096 tokens of 8x7B it holds every pair's dS (4.4 GB) at once
    // (moe_plan_bumps grows it to that size when that at most doubles it)
    size_t ws_bytes = 0;
    void* ws = bump_all(&m->tmp, &ws_bytes);
    be->attn_bwd(be, m->s_q, m->s_k, m->s_v, datt, s->att, s->lse, s->q, s->k, s->v, m->B, m->T,
                 c->heads, c->kv_heads, D, ws, ws_bytes, m->cur_doc);
    prof_mark("bwd.attn");
    // the fused projection's gradient [N, QKV] (packed rows, as the forward's GEMM wrote them)
    // over the saved q|k|v block, dead once attn_bwd returned
    void* dqkv = s->q;
    be->rope_qkv(be, dqkv, m->s_q, m->s_k, m->s_v, m->B, m->T, c->heads, c->kv_heads, D, c->rope_theta, 1, m->cur_pos);
    prof_mark("bwd.rope");
    linear_dw(m, G(m, 0, o->qkv), dqkv, s->ln1, N, QKV, H, 1, proj(m, FP8_ACT));
    prof_mark("bwd.qkv_wgrad");
    void* dln1 = m->s_b;  // [N, H]
    linear_dx(m, dln1, dqkv, W(m, 0, o->qkv), N, QKV, H, 0, proj(m, FP8_WEIGHT));
    prof_mark("bwd.qkv_gemm");
    be->rmsnorm_bwd(be, m->s_dx, G(m, 0, o->ln1), dln1, s->x_in, W(m, 0, o->ln1), s->rstd1, N, H, 1);
    prof_mark("bwd.norm");
}

// After the forward: global router statistics → aux / z losses and their gradient.
static void router_losses(Model* m, const MicroArgs* a, StepLoss* out) {
    Backend* be = m->be;
    const int E = m->c.experts;
    float zs = 0;
    be->to_host(be, m->h_stats, m->stats, sizeof(float) * 2 * (size_t)E);
    be->to_host(be, &zs, m->zsum, sizeof(float));
    double buf[2 * 64 + 1];
    CHECK(E <= 64, "at most 64 experts are supported (got %d)", E);
    for (int i = 0; i < 2 * E; i++) buf[i] = m->h_stats[i];
    buf[2 * E] = zs;
    m->comm->host_all_reduce_f64(m->comm, GROUP_WORLD, buf, 2 * (size_t)E + 1);
    for (int i = 0; i < 2 * E; i++) m->h_stats[i] = (float)buf[i];
    const double rows = (double)m->c.layers * m->N * m->world;  // L × global tokens
    double aux = 0;
    float dprob[64];
    for (int e = 0; e < E; e++) {
        double f = buf[e] / rows, P = buf[E + e] / rows;
        aux += f * P;
        dprob[e] = (float)(a->aux_scale * E * f / rows);
    }
    out->aux = E * aux;
    out->z = buf[2 * E] / rows;
    m->z_grad = (float)(a->z_scale / rows);
    if (a->backward) be->to_device(be, m->aux_dprob, dprob, sizeof(float) * (size_t)E);
}

// The micro-batch's inputs to the device, the per-step accumulators zeroed, and with a fresh
// backward the gradients that ops add into (+=); GEMMs overwrite theirs.
static void step_begin(Model* m, const MicroArgs* a, StepLoss* out) {
    Backend* be = m->be;
    const ModelConfig* c = &m->c;
    const int N = m->N, H = c->hidden;
    be->to_device(be, m->tok, a->tokens, sizeof(int32_t) * (size_t)N);
    be->to_device(be, m->tgt, a->targets, sizeof(int32_t) * (size_t)N);
    m->cur_doc = m->cur_pos = NULL;
    if (a->doc) be->to_device(be, m->doc, a->doc, sizeof(int32_t) * (size_t)N), m->cur_doc = m->doc;
    if (a->pos) be->to_device(be, m->pos, a->pos, sizeof(int32_t) * (size_t)N), m->cur_pos = m->pos;
    for (int i = 0; i < N; i++) out->ntok += a->targets[i] >= 0;
    be->zero(be, m->stats, sizeof(float) * 2 * (size_t)c->experts);
    be->zero(be, m->zsum, sizeof(float));
    be->zero(be, m->loss_acc, sizeof(float));
    bump_reset(&m->bump);
    CHECK(!a->backward || !m->inference, "a backward pass on a model built for inference (no gradients)");
    m->fresh = a->backward && a->fresh;
    CHECK(!a->backward || a->fresh || !m->grad_act[ARENA_EXPERT],
          "act-dtype expert gradients (precision.expert_grad=bf16) cannot accumulate over micro-batches");
    m->keep_h = a->backward && m->keep_swiglu;  // a forward-only pass (eval) keeps nothing extra
    m->keep_hq = m->keep_h && moe_keeps_hq(m);  // with FP8, h's codes for w2's weight gradient instead
    if (m->keep_hq) m->keep_h = 0;
    // the kept weight codes: made at a step's first micro-batch, read by its others; a forward-only
    // pass (eval between steps, after the update) quantises the weights in its GEMMs instead
    m->wq_use = m->wq && a->backward;
    CHECK(!m->wq_use || a->fresh || m->wq_made,
          "kept FP8 weight codes (precision.fp8_weights=per_step) are made by a step's first micro-batch "
          "(MicroArgs.fresh): a backward that is not fresh came first");
    if (m->wq_use && a->fresh) m->wq_made = 1;
    if (m->fresh) {
        be->zero(be, G(m, 0, m->pl.embed), sizeof(float) * (size_t)c->vocab_size * H);
        be->zero(be, G(m, 0, m->pl.final_norm), sizeof(float) * (size_t)H);
        for (int l = 0; l < c->layers; l++) {
            be->zero(be, G(m, 0, m->pl.layer[l].ln1), sizeof(float) * (size_t)H);
            be->zero(be, G(m, 0, m->pl.layer[l].ln2), sizeof(float) * (size_t)H);
        }
    }
    prof_mark("fwd.host_inputs");
}

// Final norm and lm_head + cross-entropy in token chunks; with a backward, each chunk's backward
// runs right away (dL/dlnf into m->s_a), so the logits never exist for all tokens at once.
// Returns the summed cross-entropy.
static double head(Model* m, const MicroArgs* a) {
    Backend* be = m->be;
    const int N = m->N, H = m->c.hidden, V = m->c.vocab_size;
    be->rmsnorm_fwd(be, m->lnf, m->rstdf, m->x_final, W(m, 0, m->pl.final_norm), N, H, m->c.rms_eps);
    prof_mark("fwd.norm");
    void* dlnf = m->s_a;  // [N, H]
    for (int t0 = 0; t0 < N; t0 += m->head_chunk) {
        int n = N - t0 < m->head_chunk ? N - t0 : m->head_chunk;
        const void* xc = act_at(m, m->lnf, (size_t)t0 * H);
        linear(m, m->s_logits, xc, W(m, 0, m->pl.lm_head), n, V, H, 0, FP8_OFF);  // never FP8: docs/fp8.md
        prof_mark("head.gemm");
        be->cross_entropy(be, m->s_logits, m->loss_acc, m->tgt + t0, n, V, a->backward ? a->ce_scale : 0.0f);
        prof_mark("head.ce");
        if (a->backward) {
            linear_dx(m, act_at(m, dlnf, (size_t)t0 * H), m->s_logits, W(m, 0, m->pl.lm_head), n, V, H, 0, FP8_OFF);
            prof_mark("head.dgemm");
            linear_dw(m, G(m, 0, m->pl.lm_head), m->s_logits, xc, n, V, H, t0 == 0, FP8_OFF);
            prof_mark("head.wgrad");
        }
    }
    float ce = 0;
    be->to_host(be, &ce, m->loss_acc, sizeof(float));
    prof_mark("head.loss_sync");
    return ce;
}

StepLoss model_step(Model* m, const MicroArgs* a) {
    Backend* be = m->be;
    const int N = m->N, H = m->c.hidden, V = m->c.vocab_size, L = m->c.layers;
    StepLoss out = {0};
    step_begin(m, a, &out);

    be->embed_fwd(be, m->ls[0].x_in, W(m, 0, m->pl.embed), m->tok, N, H);
    prof_mark("fwd.embed");
    for (int l = 0; l < L; l++) layer_forward(m, l, l + 1 < L ? m->ls[l + 1].x_in : m->x_final);
    router_losses(m, a, &out);
    prof_mark("fwd.router_losses");
    out.ce_sum = head(m, a);
    if (!a->backward) return out;

    be->rmsnorm_bwd(be, m->s_dx, G(m, 0, m->pl.final_norm), m->s_a, m->x_final, W(m, 0, m->pl.final_norm),
                    m->rstdf, N, H, 0);
    prof_mark("bwd.norm");
    for (int l = L - 1; l >= 0; l--) layer_backward(m, l);
    be->embed_bwd(be, G(m, 0, m->pl.embed), m->s_dx, m->tok, N, H, V);
    prof_mark("bwd.embed");
    return out;
}

void model_expert_load(const Model* m, double* load) {
    for (int e = 0; e < m->c.experts; e++) load[e] = m->h_stats[e];
}
