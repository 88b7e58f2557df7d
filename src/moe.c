// moe.c — sparse MoE block with dropless token dispatch over the EP group.
//
// Forward, for N tokens on this rank (k slots each):
//   logits = x · gateᵀ (fp32) → softmax, top-k, renormalise             router_fwd
//   rows (n, slot) sorted expert-major → send buffer xp [N·k, H]        moe_index, permute_fwd
//   counts → host (the one sync of the layer) → exchange counts (ep)
//   all_to_all_v rows and routing weights → received blocks (src s, local expert e)
//   reorder blocks to expert-major (e, s) → xe [R, H]
//   gu = xe · w13ᵀ; h = silu(gate)·up·w; y = h · w2ᵀ                     grouped GEMMs, swiglu
//   (h is scratch, recomputed by the backward from gu; train.keep_swiglu saves it instead)
//   reorder back, reverse all_to_all_v, out[n] = res[n] + Σ_slot y[(n, slot)]   unpermute_fwd
// With ep = 1 the exchange and the reorders vanish: xe is the permuted buffer itself.
#include "moe.h"

#include <stdlib.h>
#include <string.h>

#include "prof.h"
#include "util.h"

static inline size_t esz(const Model* m) { return dtype_size(m->be->act_dtype); }
static inline void* at(const Model* m, const void* p, size_t off) { return (char*)p + off * esz(m); }

void moe_saved_alloc(Model* m, MoeSaved* s) {
    Backend* be = m->be;
    const int N = m->N, E = m->c.experts, K = m->c.top_k;
    s->logits = be->alloc(be, sizeof(float) * (size_t)N * E);
    s->probs = be->alloc(be, sizeof(float) * (size_t)N * E);
    s->topk = be->alloc(be, sizeof(int32_t) * (size_t)N * K);
    s->topk_w = be->alloc(be, sizeof(float) * (size_t)N * K);
    s->dest = be->alloc(be, sizeof(int32_t) * (size_t)N * K);
    s->send_rows = xcalloc((size_t)m->ep, sizeof(int));
    s->recv_rows = xcalloc((size_t)m->ep, sizeof(int));
    s->recv_blk = xcalloc((size_t)m->ep * m->e_local, sizeof(int));
    s->load = xcalloc((size_t)E, sizeof(int));
}

void moe_saved_free(Model* m, MoeSaved* s) {
    Backend* be = m->be;
    be->free(be, s->logits);
    be->free(be, s->probs);
    be->free(be, s->topk);
    be->free(be, s->topk_w);
    be->free(be, s->dest);
    free(s->send_rows);
    free(s->recv_rows);
    free(s->recv_blk);
    free(s->load);
}

// The largest workspace of one layer's expert FP8 GEMMs for R rows (0 with precision.fp8=none):
// the forward's (w13 through the fused SwiGLU op, w2) or the backward's (both weight gradients,
// FP8_ACT; both data gradients, FP8_WEIGHT). One workspace serves every GEMM of a pass.
static size_t expert_fp8_ws(const Model* m, int R, int fwd) {
    if (m->fp8 == FP8_NONE) return 0;
    const int H = m->c.hidden, F = m->c.ffn, G = m->e_local;
    const Fp8Call f[] = {
        {FP8_OP_GROUPED, FP8_WEIGHT, R, 2 * F, H, G},  // w13 forward
        {FP8_OP_GROUPED, FP8_WEIGHT, R, H, F, G},      // w2 forward
    };
    const Fp8Call b[] = {
        {FP8_OP_WGRAD, FP8_ACT, R, H, F, G},           // w2 weight gradient
        {FP8_OP_GROUPED, FP8_WEIGHT, R, F, H, G},      // w2 data gradient
        {FP8_OP_WGRAD, FP8_ACT, R, 2 * F, H, G},       // w13 weight gradient
        {FP8_OP_GROUPED, FP8_WEIGHT, R, H, 2 * F, G},  // w13 data gradient
    };
    return fwd ? model_fp8_ws_max(m->be, f, 2) : model_fp8_ws_max(m->be, b, 4);
}

int moe_keeps_hq(const Model* m) { return m->keep_swiglu && m->fp8 != FP8_NONE && m->be->fp8_xcodes_bytes; }

// The bytes of the h a layer keeps for its backward with train.keep_swiglu, for R rows: h [R,F], or
// with precision.fp8 its codes for w2's weight gradient (half of bf16 h's, and the scales).
static size_t kept_h_bytes(const Model* m, size_t R) {
    if (!m->keep_swiglu) return 0;
    const size_t F = m->c.ffn;
    return moe_keeps_hq(m) ? m->be->fp8_xcodes_bytes(m->be, (int)R, m->e_local, (int)F) : R * F * esz(m);
}

void moe_plan_bumps(Model* m, size_t proj_fp8_ws) {
    const size_t R = (size_t)m->N * m->c.top_k;  // rows received with perfect balance
    const size_t H = m->c.hidden, F = m->c.ffn;
    // saved per layer: xe [R,H], gu [R,2F], scale_e [R]; with train.keep_swiglu also h [R,F] (with
    // precision.fp8, h's codes instead)
    const size_t saved = R * ((H + 2 * F) * esz(m) + sizeof(float)) + kept_h_bytes(m, R) +
                         (m->keep_swiglu ? 4 : 3) * 256;
    // per-layer scratch, the larger of forward and backward: h [R,F] (dh reuses it; d(gate|up)
    // overwrites the saved gu), expert out / dxe [R,H]; with EP > 1 also the received, reordered
    // and returned rows (3 more [R,H]). Kept the same with train.keep_swiglu: a forward without a
    // backward (eval) still puts h here, and the attention backward takes the whole arena as its
    // workspace (model.c), so its chunking does not change with the key.
    const int xchg = m->ep > 1 || m->force_exchange;
    const size_t scratch = R * ((F + (xchg ? 4 : 1) * H) * esz(m) + 2 * sizeof(float)) + 8 * 256;
    // With EP > 1 a rank receives more than N·k rows when routing favours its experts: 25%
    // slack before the arenas grow. At EP = 1 every row stays here, exactly N·k: no slack.
    const double slack = m->ep > 1 ? 1.25 : 1.0;
    const size_t room = (size_t)(slack * (double)scratch);  // what the layer's rows take at most
    size_t tmp = room;
    // The attention backward takes this arena as its workspace (model.c): in bf16 the Hopper
    // kernels store dS there, the causal 64 × 64 bf16 tiles of every batch row and query head
    // (cuda_attn_bwd_wg.cu), in as few chunks as it holds. Grown to hold all of it (one chunk:
    // two cost ~0.9 ms more per layer at micro-batch 8 × 4096 on an H200, docs/performance.md)
    // when that at most doubles it; dS grows with T², so long sequences keep the
    // chunks. GPUs without those kernels (or gpu.attention=mma) leave the extra room unused.
    if (m->be->act_dtype == DTYPE_BF16 && !m->inference) {
        const size_t nt = ((size_t)m->T + 63) / 64, ds = (size_t)m->B * m->c.heads * (nt * (nt + 1) / 2) * 64 * 64 * 2;
        if (ds > tmp && ds <= 2 * tmp) tmp = ds;
    }
    // precision.fp8: the workspace of the FP8 GEMMs, for the planned rows (R + R/4 with EP > 1).
    // The expert GEMMs' sits beside the layer's rows; the attention projections' has the arena to
    // itself (model.c), as has the attention backward: the arena grows only when the rows plus the
    // expert workspace, or the projections' workspace, need more than it already holds (at
    // micro-batch 8 × 4096 of bench_8x7B_L2 the dS room holds either: no memory added)
    if (m->fp8 != FP8_NONE) {
        const int Rp = (int)(m->ep > 1 ? R + R / 4 : R);
        const size_t fw = expert_fp8_ws(m, Rp, 1), bw = m->inference ? 0 : expert_fp8_ws(m, Rp, 0);
        const size_t ew = (fw > bw ? fw : bw) + 256;  // bump_alloc's alignment
        const size_t pw = proj_fp8_ws ? proj_fp8_ws + 256 : 0;
        m->fp8_ws = ew > pw ? ew : pw;
        if (room + ew > tmp) tmp = room + ew;
        if (pw > tmp) tmp = pw;
    }
    // (ModelOpts.inference: one layer's, reset by every layer's forward)
    bump_init(&m->bump, m->be, (size_t)(slack * (double)saved * (m->inference ? 1 : m->c.layers)));
    bump_init(&m->tmp, m->be, tmp);
}

// Row offsets of the local experts in an expert-major buffer: off[e] = Σ_{e' < e} Σ_s blk[s][e'].
static void expert_offsets(const Model* m, const MoeSaved* s, int* off) {
    off[0] = 0;
    for (int e = 0; e < m->e_local; e++) {
        int n = 0;
        for (int r = 0; r < m->ep; r++) n += s->recv_blk[r * m->e_local + e];
        off[e + 1] = off[e] + n;
    }
}

// Moves row blocks between source-major (s, e) and expert-major (e, s) order.
// to_expert = 1: src is (s, e) ordered, dst (e, s). Rows are `w` bytes wide.
static void reorder_blocks(const Model* m, const MoeSaved* s, void* dst, const void* src, size_t w,
                           int to_expert) {
    const int P = m->ep, El = m->e_local;
    int soff = 0;  // running offset in (s, e) order
    int eoff[65];
    expert_offsets(m, s, eoff);
    int within[64] = {0};  // rows already placed for expert e (expert-major side)
    for (int r = 0; r < P; r++) {
        for (int e = 0; e < El; e++) {
            int n = s->recv_blk[r * El + e];
            if (n) {
                size_t a = (size_t)soff * w, b = (size_t)(eoff[e] + within[e]) * w;
                if (to_expert)
                    m->be->copy(m->be, (char*)dst + b, (const char*)src + a, (size_t)n * w);
                else
                    m->be->copy(m->be, (char*)dst + a, (const char*)src + b, (size_t)n * w);
            }
            within[e] += n;
            soff += n;
        }
    }
}

// all_to_all_v of rows `w` bytes wide; forward = 1 sends send_rows and receives recv_rows.
static void exchange(Model* m, const MoeSaved* s, const void* send, void* recv, size_t w, int forward) {
    size_t sc[64], sd[64], rc[64], rd[64];
    size_t so = 0, ro = 0;
    for (int r = 0; r < m->ep; r++) {
        size_t a = (size_t)(forward ? s->send_rows[r] : s->recv_rows[r]) * w;
        size_t b = (size_t)(forward ? s->recv_rows[r] : s->send_rows[r]) * w;
        sc[r] = a, sd[r] = so, so += a;
        rc[r] = b, rd[r] = ro, ro += b;
    }
    m->comm->all_to_all_v(m->comm, GROUP_EP, send, sc, sd, recv, rc, rd);
}

// Received rows to expert-major order: exchange (send_rows out, recv_rows in) into scratch, then
// reorder its (source, expert) blocks into dst. Rows are w bytes wide.
static void rows_in(Model* m, const MoeSaved* s, void* dst, const void* send, void* scratch, size_t w) {
    exchange(m, s, send, scratch, w, 1);
    reorder_blocks(m, s, dst, scratch, w, 1);
}
// The reverse of rows_in: reorder src back to (source, expert) blocks in scratch, then send them home.
static void rows_out(Model* m, const MoeSaved* s, void* recv, const void* src, void* scratch, size_t w) {
    reorder_blocks(m, s, scratch, src, w, 0);
    exchange(m, s, scratch, recv, w, 0);
}

// ws, ws_bytes: the FP8 workspace of this pass (NULL, 0 with precision.fp8=none)
static void grouped(Model* m, const int* off, void* C, const void* A, const void* B, int N, int K, int trans_b,
                    size_t b_stride, void* ws, size_t ws_bytes, const Fp8WCodes* wq) {
    GemmDesc d = {.N = N, .K = K, .trans_b = trans_b, .alpha = 1, .beta = 0, .fp8 = ws ? FP8_WEIGHT : FP8_OFF,
                  .ws = ws, .ws_bytes = ws_bytes, .wq = ws ? wq : NULL};
    GroupDesc g = {.groups = m->e_local, .host_off = off, .b_stride = b_stride};
    m->be->gemm_grouped(m->be, &d, &g, A, B, C);
}

// The forward's FP8 workspace (NULL, 0 with precision.fp8=none): what the layer's rows leave of the
// per-layer scratch, at least what the GEMMs need (the CUDA backend takes more rows a product where
// it has room: cuda_fp8.cu). The scratch's last allocation of the layer's forward.
static void* fp8_fwd_ws(Model* m, int R, size_t* bytes) {
    *bytes = expert_fp8_ws(m, R, 1);
    return *bytes ? bump_rest(&m->tmp, *bytes, bytes) : NULL;
}

// ---- forward ---------------------------------------------------------------------------------

// Router: logits = x · gateᵀ, probabilities, top-k, then the per-expert counts of this rank's
// rows to the host (the one sync of the layer).
static void route(Model* m, int l, const void* x) {
    Backend* be = m->be;
    MoeSaved* s = &m->ls[l].moe;
    const int N = m->N, H = m->c.hidden, E = m->c.experts, K = m->c.top_k;
    GemmDesc gd = {.M = N, .N = E, .K = H, .trans_b = 1, .alpha = 1, .c_f32 = 1};
    be->gemm(be, &gd, x, at(m, m->w[0], m->pl.layer[l].gate), s->logits);
    prof_mark("fwd.router_gemm");
    be->router_fwd(be, s->probs, s->topk, s->topk_w, m->stats, m->zsum, s->logits, N, E, K);
    be->moe_index(be, m->counts, s->dest, s->topk, N, K, E);
    be->to_host(be, m->h_counts, m->counts, sizeof(int32_t) * (size_t)E);  // the sync
    for (int e = 0; e < E; e++) s->load[e] = m->h_counts[e];
    prof_mark("fwd.route_sync");
}

// Counts exchange: rank r sends to rank j the counts of j's experts; from them the rows sent to
// and received from every rank, and R, the rows this rank's experts take. Then the layer's saved
// buffers for R rows.
static void exchange_counts(Model* m, MoeSaved* s) {
    const int H = m->c.hidden, F = m->c.ffn, El = m->e_local, P = m->ep;
    if (P > 1) {
        m->comm->host_all_to_all_i32(m->comm, GROUP_EP, m->h_counts, s->recv_blk, El);
    } else {
        memcpy(s->recv_blk, m->h_counts, sizeof(int) * (size_t)m->c.experts);
    }
    s->R = 0;
    for (int r = 0; r < P; r++) {
        int a = 0, b = 0;
        for (int e = 0; e < El; e++) a += m->h_counts[r * El + e], b += s->recv_blk[r * El + e];
        s->send_rows[r] = a;
        s->recv_rows[r] = b;
        s->R += b;
    }
    const int R = s->R;
    s->xe = bump_alloc(&m->bump, (size_t)R * H * esz(m));
    s->scale_e = bump_alloc(&m->bump, (size_t)R * sizeof(float));
    s->gu = bump_alloc(&m->bump, (size_t)R * 2 * F * esz(m));
    s->h = m->keep_h ? bump_alloc(&m->bump, (size_t)R * F * esz(m)) : NULL;  // train.keep_swiglu
    s->hq = m->keep_hq ? bump_alloc(&m->bump, kept_h_bytes(m, (size_t)R)) : NULL;  // ... with FP8
    prof_mark("fwd.exchange_counts");
}

// Dispatch: this rank's (n, slot) rows of x and their routing weights to the experts' ranks,
// expert-major, into the saved xe and scale_e.
static void dispatch(Model* m, MoeSaved* s, const void* x, int xchg) {
    Backend* be = m->be;
    const int N = m->N, H = m->c.hidden, K = m->c.top_k, R = s->R;
    if (!xchg) {
        be->permute_fwd(be, s->xe, x, s->dest, N, K, H);
        be->gather_rows_f32(be, s->scale_e, s->topk_w, s->dest, N * K);
    } else {
        be->permute_fwd(be, m->s_xp, x, s->dest, N, K, H);
        be->gather_rows_f32(be, m->s_wp, s->topk_w, s->dest, N * K);
        void* xr = bump_alloc(&m->tmp, (size_t)R * H * esz(m));
        float* wr = bump_alloc(&m->tmp, (size_t)R * sizeof(float));
        rows_in(m, s, s->xe, m->s_xp, xr, (size_t)H * esz(m));
        rows_in(m, s, s->scale_e, m->s_wp, wr, sizeof(float));
    }
    prof_mark("fwd.dispatch");
}

// Layer l's kept FP8 codes of w13 (k = 0) or w2 (k = 1) for this micro-batch's GEMMs, or NULL
// (precision.fp8_weights=per_gemm, or a forward-only pass).
static const Fp8WCodes* wcodes(const Model* m, int l, int k) { return m->wq_use ? &m->wq[2 * l + k] : NULL; }

// Experts: gu = xe·w13ᵀ, h = silu(gate)·up·scale, y = h·w2ᵀ for the R received rows. Returns y
// (per-layer scratch). With kept weight codes, a step's first micro-batch makes the layer's first.
static void* experts_fwd(Model* m, int l, const MoeSaved* s, const int* off) {
    Backend* be = m->be;
    const LayerOffsets* o = &m->pl.layer[l];
    const int H = m->c.hidden, F = m->c.ffn, R = s->R;
    void* h = s->h ? s->h : bump_alloc(&m->tmp, (size_t)R * F * esz(m));
    void* y = bump_alloc(&m->tmp, (size_t)R * H * esz(m));
    size_t wsb;
    void* ws = fp8_fwd_ws(m, R, &wsb);
    if (m->wq_use && m->fresh) {
        be->fp8_wcodes_make(be, at(m, m->w[1], o->w13), 2 * F, H, m->e_local, (size_t)2 * F * H, m->wq[2 * l].codes);
        be->fp8_wcodes_make(be, at(m, m->w[1], o->w2), H, F, m->e_local, (size_t)H * F, m->wq[2 * l + 1].codes);
        prof_mark("fwd.fp8_wcodes");
    }
    // gu, h and y in one op (with FP8 the CUDA backend takes a group at a time: cuda_fp8.cu)
    GemmDesc d = {.N = 2 * F, .K = H, .trans_b = 1, .alpha = 1, .beta = 0, .fp8 = ws ? FP8_WEIGHT : FP8_OFF,
                  .ws = ws, .ws_bytes = wsb, .wq = ws ? wcodes(m, l, 0) : NULL};
    GemmDesc d2 = d;
    d2.N = H, d2.K = F, d2.wq = ws ? wcodes(m, l, 1) : NULL;
    GroupDesc g = {.groups = m->e_local, .host_off = off, .b_stride = (size_t)2 * F * H};
    GroupDesc g2 = {.groups = m->e_local, .host_off = off, .b_stride = (size_t)H * F};
    CHECK(ws || !s->hq, "moe: h's FP8 codes kept without FP8 expert GEMMs");
    be->gemm_grouped_ffn(be, &d, &g, s->xe, at(m, m->w[1], o->w13), s->gu, h, s->hq, s->scale_e, &d2, &g2,
                         at(m, m->w[1], o->w2), y);
    prof_mark("fwd.experts");
    return y;
}

// Combine: the experts' rows y back to their ranks, out[n] = res[n] + Σ_slot y[(n, slot)]. ys: the
// exchange's staging rows [R, H] (taken before the experts' forward, whose workspace ends the
// scratch), or NULL without an exchange.
static void combine(Model* m, const MoeSaved* s, const void* y, void* ys, const void* res, void* out) {
    const int N = m->N, H = m->c.hidden, K = m->c.top_k;
    if (!ys) {
        m->be->unpermute_fwd(m->be, out, y, s->dest, N, K, H, res);
    } else {
        rows_out(m, s, m->s_xp, y, ys, (size_t)H * esz(m));
        m->be->unpermute_fwd(m->be, out, m->s_xp, s->dest, N, K, H, res);
    }
    prof_mark("fwd.combine");
}

void moe_forward(Model* m, int l, const void* x, const void* res, void* out) {
    MoeSaved* s = &m->ls[l].moe;
    const int xchg = m->ep > 1 || m->force_exchange;
    CHECK(m->ep <= 64 && m->e_local <= 64, "at most 64 EP ranks and 64 local experts are supported");
    bump_reset(&m->tmp);
    if (m->inference) bump_reset(&m->bump);  // nothing is kept for a backward: one layer's rows
    route(m, l, x);
    exchange_counts(m, s);
    dispatch(m, s, x, xchg);
    int off[65];
    expert_offsets(m, s, off);
    void* ys = xchg ? bump_alloc(&m->tmp, (size_t)s->R * m->c.hidden * esz(m)) : NULL;
    const void* y = experts_fwd(m, l, s, off);
    combine(m, s, y, ys, res, out);
}

// ---- backward --------------------------------------------------------------------------------

// dL/dy for the received rows, expert-major (the reverse of combine).
static void* dy_to_experts(Model* m, const MoeSaved* s, const void* dout, int xchg) {
    const int N = m->N, H = m->c.hidden, K = m->c.top_k, R = s->R;
    m->be->unpermute_bwd(m->be, m->s_xp, dout, s->dest, N, K, H);
    void* dye = m->s_xp;
    if (xchg) {
        void* dyr = bump_alloc(&m->tmp, (size_t)R * H * esz(m));
        dye = bump_alloc(&m->tmp, (size_t)R * H * esz(m));
        rows_in(m, s, dye, m->s_xp, dyr, (size_t)H * esz(m));
    }
    prof_mark("bwd.dispatch");
    return dye;
}

// Experts backward: h (saved by the forward with train.keep_swiglu, or its codes with FP8, else
// recomputed), then w2, swiglu, w13 backward, into the weight gradients and *dxe, *dsc: the
// gradients of the received rows and of their routing weights. Memory: dh overwrites h once w2's
// weight gradient has read it (the saved h too: it is dead after that; with h's codes dh takes the
// scratch h would), and d(gate|up) overwrites the saved gu in place
// (swiglu_bwd allows it; gu is dead after this layer's backward). With FP8 the SwiGLU backward and
// w13's products are one op (gemm_grouped_swiglu_bwd: the CUDA backend quantises d(gate|up) for
// both products from one read).
static void experts_bwd(Model* m, int l, const MoeSaved* s, const int* off, const void* dye, void** dxe,
                        float** dsc) {
    Backend* be = m->be;
    const LayerOffsets* o = &m->pl.layer[l];
    const int H = m->c.hidden, F = m->c.ffn, R = s->R;
    const float beta = m->fresh ? 0.f : 1.f;
    void* h = s->h ? s->h : bump_alloc(&m->tmp, (size_t)R * F * esz(m));
    void* dh = h;
    void* dgu = s->gu;
    *dsc = bump_alloc(&m->tmp, (size_t)R * sizeof(float));
    *dxe = bump_alloc(&m->tmp, (size_t)R * H * esz(m));
    // the FP8 workspace: what the layer's rows leave of the arena, at least what the GEMMs need (the
    // w13 backward op takes a group on its own path where the group's codes fit: cuda_fp8.cu)
    size_t wsb = expert_fp8_ws(m, R, 0);
    void* ws = wsb ? bump_rest(&m->tmp, wsb, &wsb) : NULL;
    GroupDesc g = {.groups = m->e_local, .host_off = off, .db_act = m->grad_act[ARENA_EXPERT],
                   .fp8 = ws ? FP8_ACT : FP8_OFF, .ws = ws, .ws_bytes = wsb};
    if (!s->h && !s->hq) {
        be->swiglu_fwd(be, h, s->gu, s->scale_e, R, F);
        prof_mark("bwd.swiglu_recompute");
    }
    g.b_stride = (size_t)H * F;
    g.xq = s->hq;  // w2's X: h, or its codes
    be->gemm_grouped_wgrad(be, &g, H, F, dye, s->hq ? NULL : h, grad_at(m, ARENA_EXPERT, o->w2), beta);
    g.xq = NULL;
    prof_mark("bwd.w2_wgrad");
    grouped(m, off, dh, dye, at(m, m->w[1], o->w2), F, H, 0, (size_t)H * F, ws, wsb, wcodes(m, l, 1));
    prof_mark("bwd.w2_dgrad");
    if (ws) {  // FP8: the SwiGLU backward and w13's two products as one op
        GemmDesc d = {.N = H, .K = 2 * F, .alpha = 1, .beta = 0, .fp8 = FP8_WEIGHT, .ws = ws, .ws_bytes = wsb,
                      .wq = wcodes(m, l, 0)};
        g.b_stride = (size_t)2 * F * H;
        be->gemm_grouped_swiglu_bwd(be, &d, &g, dh, s->gu, s->scale_e, *dsc, s->xe, at(m, m->w[1], o->w13),
                                    grad_at(m, ARENA_EXPERT, o->w13), beta, *dxe);
        prof_mark("bwd.swiglu_w13");
        return;
    }
    be->swiglu_bwd(be, dgu, *dsc, dh, s->gu, s->scale_e, R, F);
    prof_mark("bwd.swiglu");
    g.b_stride = (size_t)2 * F * H;
    be->gemm_grouped_wgrad(be, &g, 2 * F, H, dgu, s->xe, grad_at(m, ARENA_EXPERT, o->w13), beta);
    prof_mark("bwd.w13_wgrad");
    grouped(m, off, *dxe, dgu, at(m, m->w[1], o->w13), H, 2 * F, 0, (size_t)2 * F * H, ws, wsb, NULL);
    prof_mark("bwd.w13_dgrad");
}

// Back to this rank's (n, slot) rows (the reverse of dispatch): dx = Σ_slot dxe, and the routing
// weights' gradients into m->s_dw.
// bx, bw: scratch for the exchange's rows and weights (xchg).
static void dx_to_tokens(Model* m, const MoeSaved* s, const void* dxe, const float* dsc, void* dx, int xchg, void* bx,
                         float* bw) {
    const int N = m->N, H = m->c.hidden, K = m->c.top_k;
    const void* dxp = dxe;
    const float* dwp = dsc;
    if (xchg) {
        rows_out(m, s, m->s_xp, dxe, bx, (size_t)H * esz(m));
        rows_out(m, s, m->s_wp, dsc, bw, sizeof(float));
        dxp = m->s_xp;
        dwp = m->s_wp;
    }
    m->be->permute_bwd(m->be, dx, dxp, s->dest, N, K, H);
    m->be->scatter_rows_f32(m->be, m->s_dw, dwp, s->dest, N * K);
    prof_mark("bwd.combine");
}

// Router backward: logits' gradient (top-k weights, aux and z losses), then the gate's weight
// gradient and its data gradient added into dx.
static void router_bwd(Model* m, int l, void* dx) {
    Backend* be = m->be;
    const MoeSaved* s = &m->ls[l].moe;
    const size_t gate = m->pl.layer[l].gate;
    const int N = m->N, H = m->c.hidden, E = m->c.experts, K = m->c.top_k;
    be->router_bwd(be, m->s_dlog, m->s_dw, m->aux_dprob, m->z_grad, s->probs, s->topk, s->topk_w,
                   s->logits, N, E, K);
    be->f32_to_act(be, m->s_dlog_act, m->s_dlog, (size_t)N * E);
    prof_mark("bwd.router");
    GemmDesc dw = {.M = E, .N = H, .K = N, .trans_a = 1, .alpha = 1, .beta = m->fresh ? 0.f : 1.f, .c_f32 = 1};
    be->gemm(be, &dw, m->s_dlog_act, m->ls[l].ln2, m->grad[0] + gate);
    GemmDesc dxd = {.M = N, .N = H, .K = E, .alpha = 1, .beta = 1};
    be->gemm(be, &dxd, m->s_dlog_act, at(m, m->w[0], gate), dx);
    prof_mark("bwd.router_gemm");
}

void moe_backward(Model* m, int l, const void* dout, void* dx) {
    const MoeSaved* s = &m->ls[l].moe;
    const int xchg = m->ep > 1 || m->force_exchange;
    bump_reset(&m->tmp);
    int off[65];
    expert_offsets(m, s, off);
    const void* dye = dy_to_experts(m, s, dout, xchg);
    // the exchange's scratch before the experts' (whose FP8 workspace takes the rest of the arena)
    void* bx = xchg ? bump_alloc(&m->tmp, (size_t)s->R * m->c.hidden * esz(m)) : NULL;
    float* bw = xchg ? bump_alloc(&m->tmp, (size_t)s->R * sizeof(float)) : NULL;
    void* dxe;
    float* dsc;
    experts_bwd(m, l, s, off, dye, &dxe, &dsc);
    dx_to_tokens(m, s, dxe, dsc, dx, xchg, bx, bw);
    router_bwd(m, l, dx);
}

// The row exchange of moe_forward / moe_backward on its own, for tests (moe.h). The same static
// steps the layer runs: exchange then reorder to expert-major; reorder back then reverse exchange.
void moe_dispatch_rows(Model* m, const MoeSaved* s, void* dst, const void* send, void* scratch, size_t w) {
    if (m->ep == 1) {
        if (s->R) m->be->copy(m->be, dst, send, (size_t)s->R * w);
        return;
    }
    rows_in(m, s, dst, send, scratch, w);
}

void moe_combine_rows(Model* m, const MoeSaved* s, void* recv, const void* src, void* scratch, size_t w) {
    if (m->ep == 1) {
        if (s->R) m->be->copy(m->be, recv, src, (size_t)s->R * w);
        return;
    }
    rows_out(m, s, recv, src, scratch, w);
}
