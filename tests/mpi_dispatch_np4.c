// mpi_dispatch_np4.c — the MoE token dispatcher (src/moe.c) under mpirun, at EP = 2 and EP = 4
// (every ep in {2, 4} that divides the world: on 4 ranks EP=2 runs as EP=2 x EDP=2; the same
// source, built as mpi_dispatch_np2, runs pure EP=2 on 2 ranks).
//
// Each case builds a one-layer model on the CPU backend with the EP comm, and a reference: the
// same MoE layer with every expert in one process (world 1, a stub Comm whose exchange calls are
// counted and must stay at zero), fed the tokens of all ranks of this rank's EP group in EP-rank
// order. The weights, inputs, residual base, output gradient, aux-loss and z-loss gradients are
// random and the same in both. Routing cases (the router is forced through the gate weights:
// column 0 of x is kept in [0.5, 1) and a gate column-0 entry of ±30 makes an expert win or lose):
//   random      top-2, every expert receives rows
//   one_expert  top-1, every token to expert 5: one rank receives everything, the others nothing
//   one_rank    top-2, every token to experts {2, 3}: one rank receives everything
//   empty       top-2, expert 0 and every expert of EP rank 1 receive nothing
//
// Tolerance: the row order of every expert GEMM, of the combine and of every expert weight
// gradient is the same in the EP run and the reference (rows of source rank s precede those of
// s + 1, as the reference's concatenated tokens do), and the CPU GEMM's sums do not depend on
// the row count, so the router outputs, received rows, layer output, input gradient and expert
// gradients must be bitwise equal. The router (gate) weight gradient is a sum over tokens split
// over the EP ranks; summed over the group it matches the reference to 1e-5 relative L2 (fp32
// sums in another order).
//
// The round trip uses moe_dispatch_rows / moe_combine_rows (the layer's own exchange steps):
// dispatch of the permuted inputs equals the rows the layer received, combine(dispatch(a)) = a
// and dispatch(combine(b)) = b bit for bit, for act rows and fp32 rows. The backward of the layer
// moves gradients through the same two maps (dL/dy by dispatch, dL/dx by combine), so with
// both compositions the identity the gradients round-trip too; the full backward is checked
// against the reference above.
//
// Failures on any rank are reduced into rank 0, which alone prints the ok/FAIL lines and the
// summary.
#define _GNU_SOURCE
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "comm.h"
#include "model.h"
#include "moe.h"
#include "mpi_test.h"
#include "util.h"

enum { H = 16, F = 12, E = 8, B = 2, T = 5, N = B * T };
#define GATE_TOL 1e-5  // router weight gradient: fp32 sums over tokens in another order

static int g_ep;
static Comm* g_comm;
static Backend* be;

// ---- the world-1 reference's Comm: no exchange may happen ------------------------------------
static int g_stub_calls;
static void stub_a2av(Comm* c, GroupId g, const void* s, const size_t* sc, const size_t* sd, void* r,
                      const size_t* rc, const size_t* rd) {
    g_stub_calls++;
}
static void stub_a2a_i32(Comm* c, GroupId g, const int32_t* s, int32_t* r, int n) { g_stub_calls++; }
static Comm g_one = {.rank = {0, 0, 0}, .size = {1, 1, 1}, .all_to_all_v = stub_a2av, .host_all_to_all_i32 = stub_a2a_i32};

// ---- cases -------------------------------------------------------------------------------------
typedef enum { RANDOM, ONE_EXPERT, ONE_RANK, EMPTY } Mode;
typedef struct Case {
    const char* name;
    Mode mode;
    int k;
} Case;
static const Case CASES[] = {
    {"random", RANDOM, 2}, {"one_expert", ONE_EXPERT, 1}, {"one_rank", ONE_RANK, 2}, {"empty", EMPTY, 2}};
enum { E_STAR = 5 };  // ONE_EXPERT: on EP rank 2 of 4 / 1 of 2, not its first local expert

static int loser(Mode mode, int e, int ep) {  // EMPTY: expert 0 and every expert of EP rank 1
    const int el = E / ep;
    return mode == EMPTY && (e == 0 || e / el == 1);
}
static int winner(Mode mode, int e) {
    return (mode == ONE_EXPERT && e == E_STAR) || (mode == ONE_RANK && (e == 2 || e == 3));
}

static void fill_uniform(float* v, size_t n, uint64_t seed, float lo, float hi) {
    Rng r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * rng_uniform(&r);
}
static uint64_t seed_of(int cs, int world_rank, int what) { return 1000003ull * (uint64_t)(cs + 1) + 7919ull * (uint64_t)world_rank + (uint64_t)what; }

// Inputs of world rank r for case cs: x [N,H] (column 0 in [0.5, 1) when routing is forced),
// residual base [N,H], dL/dout [N,H].
static void inputs(int cs, int r, float* x, float* base, float* dout) {
    fill_uniform(x, (size_t)N * H, seed_of(cs, r, 1), -1, 1);
    if (CASES[cs].mode != RANDOM)
        for (int n = 0; n < N; n++) x[(size_t)n * H] = 0.5f + 0.5f * fabsf(x[(size_t)n * H]);
    fill_uniform(base, (size_t)N * H, seed_of(cs, r, 2), -1, 1);
    fill_uniform(dout, (size_t)N * H, seed_of(cs, r, 3), -1, 1);
}

// Global weights of case cs: gate [E,H], w13 [E,2F,H], w2 [E,H,F]; aux_dprob [E].
typedef struct Weights {
    float gate[E * H], w13[E * 2 * F * H], w2[E * H * F], aux[E];
} Weights;
static void weights(int cs, int ep, Weights* w) {
    fill_uniform(w->gate, E * H, seed_of(cs, 99, 4), -0.5f, 0.5f);
    for (int e = 0; e < E; e++) {
        if (winner(CASES[cs].mode, e)) w->gate[e * H] = 30;
        if (loser(CASES[cs].mode, e, ep)) w->gate[e * H] = -30;
    }
    fill_uniform(w->w13, E * 2 * F * H, seed_of(cs, 99, 5), -0.4f, 0.4f);
    fill_uniform(w->w2, E * H * F, seed_of(cs, 99, 6), -0.4f, 0.4f);
    fill_uniform(w->aux, E, seed_of(cs, 99, 7), -0.05f, 0.05f);
}

// ---- one layer, forward and backward -------------------------------------------------------------
typedef struct Layer {
    Model m;
    int n;                     // tokens
    float *x, *base, *dout;    // host [n, H]
    float *out, *dx;           // host [n, H] results
    float *gate_g, *w13_g, *w2_g;  // host copies of the gradients: [E,H], [El,2F,H], [El,H,F]
    int32_t* topk;             // host [n·k]
    float* topk_w;             // host [n·k]
} Layer;

static void layer_run(Layer* L, const ModelConfig* c, int ntok, Comm* comm, const Weights* w) {
    Model* m = &L->m;
    model_create(m, c, ntok / T, T, be, comm);
    const int k = c->top_k, el = m->e_local, lo = m->pl.expert_lo;
    const LayerOffsets* o = &m->pl.layer[0];
    CHECK(m->N == ntok && m->pl.expert_hi - lo == el, "layout");
    L->n = ntok;
    // weights: the gate and this model's experts of the global tensors
    float* w0 = xcalloc(m->padded[0], sizeof(float));
    float* w1 = xcalloc(m->padded[1], sizeof(float));
    memcpy(w0 + o->gate, w->gate, sizeof w->gate);
    memcpy(w1 + o->w13, w->w13 + (size_t)lo * 2 * F * H, sizeof(float) * (size_t)el * 2 * F * H);
    memcpy(w1 + o->w2, w->w2 + (size_t)lo * H * F, sizeof(float) * (size_t)el * H * F);
    be->to_device(be, m->w[0], w0, sizeof(float) * m->padded[0]);
    be->to_device(be, m->w[1], w1, sizeof(float) * m->padded[1]);
    free(w0), free(w1);
    be->zero(be, m->grad[0], sizeof(float) * m->padded[0]);
    be->zero(be, m->grad[1], sizeof(float) * m->padded[1]);
    be->to_device(be, m->aux_dprob, w->aux, sizeof w->aux);
    m->z_grad = 0.01f;

    const size_t nh = (size_t)ntok * H;
    void* out = be->alloc(be, sizeof(float) * nh);
    void* dx = be->alloc(be, sizeof(float) * nh);
    void* dout = be->alloc(be, sizeof(float) * nh);
    float* nan = xmalloc(sizeof(float) * nh);
    for (size_t i = 0; i < nh; i++) nan[i] = NAN;
    be->to_device(be, m->ls[0].ln2, L->x, sizeof(float) * nh);  // the backward reads ln2 as x
    be->to_device(be, out, L->base, sizeof(float) * nh);        // out += moe(x)
    be->to_device(be, dout, L->dout, sizeof(float) * nh);
    be->to_device(be, dx, nan, sizeof(float) * nh);             // dx is overwritten
    bump_reset(&m->bump);
    moe_forward(m, 0, m->ls[0].ln2, out, out);
    moe_backward(m, 0, dout, dx);

    L->out = xmalloc(sizeof(float) * nh);
    L->dx = xmalloc(sizeof(float) * nh);
    be->to_host(be, L->out, out, sizeof(float) * nh);
    be->to_host(be, L->dx, dx, sizeof(float) * nh);
    L->gate_g = xmalloc(sizeof(float) * E * H);
    L->w13_g = xmalloc(sizeof(float) * (size_t)el * 2 * F * H);
    L->w2_g = xmalloc(sizeof(float) * (size_t)el * H * F);
    be->to_host(be, L->gate_g, m->grad[0] + o->gate, sizeof(float) * E * H);
    be->to_host(be, L->w13_g, m->grad[1] + o->w13, sizeof(float) * (size_t)el * 2 * F * H);
    be->to_host(be, L->w2_g, m->grad[1] + o->w2, sizeof(float) * (size_t)el * H * F);
    L->topk = xmalloc(sizeof(int32_t) * (size_t)ntok * k);
    L->topk_w = xmalloc(sizeof(float) * (size_t)ntok * k);
    be->to_host(be, L->topk, m->ls[0].moe.topk, sizeof(int32_t) * (size_t)ntok * k);
    be->to_host(be, L->topk_w, m->ls[0].moe.topk_w, sizeof(float) * (size_t)ntok * k);
    be->free(be, out), be->free(be, dx), be->free(be, dout);
    free(nan);
}

static void layer_free(Layer* L) {
    model_free(&L->m);
    free(L->x), free(L->base), free(L->dout), free(L->out), free(L->dx);
    free(L->gate_g), free(L->w13_g), free(L->w2_g), free(L->topk), free(L->topk_w);
}

// Elements whose bits differ; *first = the first of them.
static size_t ndiff(const float* a, const float* b, size_t n, size_t* first) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) {
            if (!d) *first = i;
            d++;
        }
    return d;
}
static int all_finite(const float* a, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i])) return 0;
    return 1;
}
static size_t nonzero(const float* a, size_t n) {
    size_t z = 0;
    for (size_t i = 0; i < n; i++) z += a[i] != 0.0f;
    return z;
}

#define SAME(a, b, n, what)                                                                            \
    do {                                                                                               \
        size_t f_ = 0, d_ = ndiff((a), (b), (n), &f_);                                                 \
        EXPECT(d_ == 0, "rank %d %s: %s differs from the reference in %zu of %zu (first [%zu]: %.9g vs %.9g)", \
               mt_rank, cs_name, what, d_, (size_t)(n), f_, d_ ? (double)(a)[f_] : 0.0, d_ ? (double)(b)[f_] : 0.0); \
    } while (0)

// The EP run and its reference for case cs; both left in *P and *R for the callers.
static void run_pair(int cs, Layer* P, Layer* R) {
    const int ep = g_ep, ep_rank = g_comm->rank[GROUP_EP], g0 = mt_rank - ep_rank;
    ModelConfig c = {.vocab_size = 32, .hidden = H, .ffn = F, .layers = 1, .heads = 4, .kv_heads = 2,
                     .experts = E, .top_k = CASES[cs].k, .max_seq = 64, .rope_theta = 10000,
                     .rms_eps = 1e-5f, .init_std = 0.02f};
    Weights* w = xmalloc(sizeof *w);
    weights(cs, ep, w);
    memset(P, 0, sizeof *P);
    memset(R, 0, sizeof *R);
    P->x = xmalloc(sizeof(float) * N * H), P->base = xmalloc(sizeof(float) * N * H), P->dout = xmalloc(sizeof(float) * N * H);
    inputs(cs, mt_rank, P->x, P->base, P->dout);
    const size_t nr = (size_t)ep * N * H;
    R->x = xmalloc(sizeof(float) * nr), R->base = xmalloc(sizeof(float) * nr), R->dout = xmalloc(sizeof(float) * nr);
    for (int j = 0; j < ep; j++)  // the EP group's tokens, in EP-rank order
        inputs(cs, g0 + j, R->x + (size_t)j * N * H, R->base + (size_t)j * N * H, R->dout + (size_t)j * N * H);
    layer_run(P, &c, N, g_comm, w);
    g_stub_calls = 0;
    layer_run(R, &c, ep * N, &g_one, w);
    free(w);
}

// ---- tests -------------------------------------------------------------------------------------

// Output, input gradient, expert and router gradients, routing and received rows against the
// world-1 reference, for every routing case.
static void check_case(int cs) {
    const char* cs_name = CASES[cs].name;
    const Mode mode = CASES[cs].mode;
    const int k = CASES[cs].k, ep = g_ep, ep_rank = g_comm->rank[GROUP_EP];
    Layer P, R;
    run_pair(cs, &P, &R);
    const int el = P.m.e_local, lo = P.m.pl.expert_lo;
    const MoeSaved* ps = &P.m.ls[0].moe;
    const MoeSaved* rs = &R.m.ls[0].moe;
    EXPECT(g_stub_calls == 0, "rank %d %s: the world-1 reference exchanged (%d calls)", mt_rank, cs_name, g_stub_calls);

    // the routing is what the case says (over the whole EP group's tokens)
    const int nk = ep * N * k;
    int load[E] = {0}, bad = 0;
    for (int i = 0; i < nk; i++) load[R.topk[i]]++;
    for (int e = 0; e < E; e++) {
        EXPECT(load[e] == rs->load[e], "rank %d %s: reference load[%d] %d, counted %d", mt_rank, cs_name, e, rs->load[e], load[e]);
        if (mode == RANDOM || mode == EMPTY) bad += loser(mode, e, ep) ? load[e] != 0 : load[e] == 0;
        if (mode == ONE_EXPERT) bad += load[e] != (e == E_STAR ? ep * N : 0);
        if (mode == ONE_RANK) bad += load[e] != (winner(mode, e) ? ep * N : 0);
    }
    EXPECT(bad == 0, "rank %d %s: routing is not what the case forces (loads %d %d %d %d %d %d %d %d)", mt_rank, cs_name,
           load[0], load[1], load[2], load[3], load[4], load[5], load[6], load[7]);
    // router outputs equal the reference's rows of this rank
    EXPECT(memcmp(P.topk, R.topk + (size_t)ep_rank * N * k, sizeof(int32_t) * N * k) == 0, "rank %d %s: top-k ids differ", mt_rank, cs_name);
    SAME(P.topk_w, R.topk_w + (size_t)ep_rank * N * k, (size_t)N * k, "top-k weights");

    // counts: rows received per (source, local expert), total, and the rows sent per destination
    int R_want = 0, blk_bad = 0, send_bad = 0;
    for (int j = 0; j < ep; j++) {
        int to_j = 0;
        for (int e = 0; e < el; e++) {
            int n = 0;
            for (int i = 0; i < N * k; i++) n += R.topk[(size_t)j * N * k + i] == lo + e;
            blk_bad += ps->recv_blk[j * el + e] != n;
            R_want += n;
        }
        for (int i = 0; i < N * k; i++) to_j += P.topk[i] / el == j;
        send_bad += ps->send_rows[j] != to_j;
    }
    EXPECT(blk_bad == 0, "rank %d %s: recv_blk differs from the routing", mt_rank, cs_name);
    EXPECT(send_bad == 0, "rank %d %s: send_rows differs from the routing", mt_rank, cs_name);
    EXPECT(ps->R == R_want, "rank %d %s: received %d rows, want %d", mt_rank, cs_name, ps->R, R_want);
    if (mode == ONE_EXPERT) EXPECT(ps->R == (ep_rank == E_STAR / el ? ep * N : 0), "rank %d %s: R = %d", mt_rank, cs_name, ps->R);
    if (mode == EMPTY && ep_rank == 1) EXPECT(ps->R == 0, "rank %d %s: EP rank 1 received %d rows", mt_rank, cs_name, ps->R);

    // received rows (expert-major, source rank ascending) = the reference's rows of these experts
    int roff = 0;
    for (int e = 0; e < lo; e++) roff += rs->load[e];
    if (ps->R == R_want && R_want > 0) {
        float* a = xmalloc(sizeof(float) * (size_t)R_want * 2 * F);
        float* b = xmalloc(sizeof(float) * (size_t)R_want * 2 * F);
        be->to_host(be, a, ps->xe, sizeof(float) * (size_t)R_want * H);
        be->to_host(be, b, (float*)rs->xe + (size_t)roff * H, sizeof(float) * (size_t)R_want * H);
        SAME(a, b, (size_t)R_want * H, "received rows xe");
        be->to_host(be, a, ps->scale_e, sizeof(float) * (size_t)R_want);
        be->to_host(be, b, rs->scale_e + roff, sizeof(float) * (size_t)R_want);
        SAME(a, b, (size_t)R_want, "received routing weights");
        be->to_host(be, a, ps->gu, sizeof(float) * (size_t)R_want * 2 * F);
        be->to_host(be, b, (float*)rs->gu + (size_t)roff * 2 * F, sizeof(float) * (size_t)R_want * 2 * F);
        SAME(a, b, (size_t)R_want * 2 * F, "expert gate|up");
        free(a), free(b);
    }

    // the layer's output and input gradient
    EXPECT(all_finite(P.out, (size_t)N * H) && all_finite(P.dx, (size_t)N * H), "rank %d %s: non-finite out or dx", mt_rank, cs_name);
    SAME(P.out, R.out + (size_t)ep_rank * N * H, (size_t)N * H, "output");
    SAME(P.dx, R.dx + (size_t)ep_rank * N * H, (size_t)N * H, "input gradient");
    int moved = 0;  // the layer did something: out differs from the residual base
    for (int i = 0; i < N * H; i++) moved += P.out[i] != P.base[i];
    EXPECT(moved > N * H / 2, "rank %d %s: output hardly differs from the residual (%d)", mt_rank, cs_name, moved);

    // expert gradients: bitwise equal to the reference's; exactly zero for experts without rows
    for (int e = 0; e < el; e++) {
        const size_t n13 = (size_t)2 * F * H, n2 = (size_t)H * F;
        const float* g13 = P.w13_g + e * n13;
        const float* g2 = P.w2_g + e * n2;
        char what[64];
        snprintf(what, sizeof what, "expert %d w13 gradient", lo + e);
        SAME(g13, R.w13_g + (size_t)(lo + e) * n13, n13, what);
        snprintf(what, sizeof what, "expert %d w2 gradient", lo + e);
        SAME(g2, R.w2_g + (size_t)(lo + e) * n2, n2, what);
        if (load[lo + e] == 0) {
            EXPECT(nonzero(g13, n13) == 0 && nonzero(g2, n2) == 0, "rank %d %s: expert %d received no rows but has %zu + %zu non-zero gradients",
                   mt_rank, cs_name, lo + e, nonzero(g13, n13), nonzero(g2, n2));
        } else {
            EXPECT(nonzero(g13, n13) > n13 / 2 && nonzero(g2, n2) > n2 / 2, "rank %d %s: expert %d received %d rows but its gradient is mostly zero",
                   mt_rank, cs_name, lo + e, load[lo + e]);
        }
    }
    // router weight gradient: the EP group's sum equals the reference's
    float gsum[E * H];
    memcpy(gsum, P.gate_g, sizeof gsum);
    g_comm->all_reduce_sum(g_comm, GROUP_EP, gsum, E * H);
    EXPECT(nonzero(R.gate_g, E * H) > E * H / 2, "rank %d %s: reference router gradient is mostly zero", mt_rank, cs_name);
    const double rel = rel_l2(gsum, R.gate_g, E * H);
    EXPECT(rel <= GATE_TOL, "rank %d %s: router weight gradient rel L2 %.3g > %g", mt_rank, cs_name, rel, GATE_TOL);
    layer_free(&P);
    layer_free(&R);
}

static void test_random_routing(void) { check_case(0); }
static void test_all_tokens_one_expert(void) { check_case(1); }
static void test_all_tokens_one_rank(void) { check_case(2); }
static void test_empty_expert_and_rank(void) { check_case(3); }

// Round trip of the exchange with the routing of every case (including ranks that receive
// nothing): dispatch(permuted x) = the layer's received rows; combine∘dispatch and
// dispatch∘combine are the identity, bit for bit, for act rows and fp32 rows.
static void test_round_trip(void) {
    for (int cs = 0; cs < (int)(sizeof CASES / sizeof CASES[0]); cs++) {
        const char* cs_name = CASES[cs].name;
        Layer P, R;
        run_pair(cs, &P, &R);
        Model* m = &P.m;
        const MoeSaved* s = &m->ls[0].moe;
        const int k = CASES[cs].k, nk = N * k, Rr = s->R, rows = (nk > Rr ? nk : Rr) + 1;
        void* send = be->alloc(be, sizeof(float) * (size_t)rows * H);
        void* recv = be->alloc(be, sizeof(float) * (size_t)rows * H);
        void* dst = be->alloc(be, sizeof(float) * (size_t)rows * H);
        void* scr = be->alloc(be, sizeof(float) * (size_t)rows * H);
        float* h = xmalloc(sizeof(float) * (size_t)rows * H);
        float* g = xmalloc(sizeof(float) * (size_t)rows * H);
        float* nan = xmalloc(sizeof(float) * (size_t)rows * H);
        for (size_t i = 0; i < (size_t)rows * H; i++) nan[i] = NAN;

        // dispatch of the permuted inputs and routing weights = what the layer received
        void* xd = be->alloc(be, sizeof(float) * (size_t)N * H);
        be->to_device(be, xd, P.x, sizeof(float) * (size_t)N * H);
        be->permute_fwd(be, send, xd, s->dest, N, k, H);
        be->to_device(be, dst, nan, sizeof(float) * (size_t)rows * H);
        moe_dispatch_rows(m, s, dst, send, scr, sizeof(float) * H);
        be->to_host(be, h, dst, sizeof(float) * (size_t)Rr * H);
        be->to_host(be, g, s->xe, sizeof(float) * (size_t)Rr * H);
        SAME(h, g, (size_t)Rr * H, "dispatch(permuted x) vs the layer's received rows");
        be->gather_rows_f32(be, (float*)send, s->topk_w, s->dest, nk);
        be->to_device(be, dst, nan, sizeof(float) * (size_t)rows);
        moe_dispatch_rows(m, s, dst, send, scr, sizeof(float));
        be->to_host(be, h, dst, sizeof(float) * (size_t)Rr);
        be->to_host(be, g, s->scale_e, sizeof(float) * (size_t)Rr);
        SAME(h, g, (size_t)Rr, "dispatch(routing weights) vs the layer's received weights");
        be->free(be, xd);

        for (int wide = 0; wide < 2; wide++) {
            const int cols = wide ? H : 1;
            const size_t w = sizeof(float) * (size_t)cols;
            char what[96];
            // combine(dispatch(a)) = a on the send side [N·k rows]
            fill_uniform(h, (size_t)nk * cols, seed_of(cs, mt_rank, 10 + wide), -2, 2);
            be->to_device(be, send, h, w * (size_t)nk);
            be->to_device(be, dst, nan, w * (size_t)rows);
            be->to_device(be, recv, nan, w * (size_t)rows);
            moe_dispatch_rows(m, s, dst, send, scr, w);
            moe_combine_rows(m, s, recv, dst, scr, w);
            be->to_host(be, g, recv, w * (size_t)nk);
            snprintf(what, sizeof what, "combine(dispatch(a)), %d columns", cols);
            SAME(g, h, (size_t)nk * cols, what);
            // dispatch(combine(b)) = b on the expert side [R rows] (the gradients' path)
            fill_uniform(h, (size_t)Rr * cols, seed_of(cs, mt_rank, 20 + wide), -2, 2);
            be->to_device(be, dst, h, w * (size_t)Rr);
            be->to_device(be, recv, nan, w * (size_t)rows);
            be->to_device(be, send, nan, w * (size_t)rows);
            moe_combine_rows(m, s, recv, dst, scr, w);
            moe_dispatch_rows(m, s, send, recv, scr, w);
            be->to_host(be, g, send, w * (size_t)Rr);
            snprintf(what, sizeof what, "dispatch(combine(b)), %d columns", cols);
            SAME(g, h, (size_t)Rr * cols, what);
            // the combined rows are a permutation of what the experts held: every row of the
            // send side came from some expert row (no NaN left from the poison)
            be->to_host(be, g, recv, w * (size_t)nk);
            snprintf(what, sizeof what, "combine left rows unwritten, %d columns", cols);
            EXPECT(all_finite(g, (size_t)nk * cols), "rank %d %s: %s", mt_rank, cs_name, what);
        }
        be->free(be, send), be->free(be, recv), be->free(be, dst), be->free(be, scr);
        free(h), free(g), free(nan);
        layer_free(&P);
        layer_free(&R);
    }
}

int main(int argc, char** argv) {
    mpi_test_init(&argc, &argv, "mpi_dispatch");
    be = cpu_backend_create();
    int eps[] = {2, 4}, ran = 0;
    for (size_t i = 0; i < sizeof eps / sizeof eps[0]; i++) {
        g_ep = eps[i];
        if (mt_world % g_ep) continue;
        ran++;
        mpi_test_note("(ep=%d, world=%d)", g_ep, mt_world);
        g_comm = comm_mpi_create(g_ep);
        MRUN(test_round_trip);
        MRUN(test_random_routing);
        MRUN(test_all_tokens_one_expert);
        MRUN(test_all_tokens_one_rank);
        MRUN(test_empty_expert_and_rank);
        g_comm->destroy(g_comm);
    }
    if (!ran) {  // a world no ep divides tests nothing: that is a failure, not a pass
        t_failed++;
        if (mt_rank == 0) printf("FAIL no ep in {2, 4} divides world %d\n", mt_world);
    }
    be->destroy(be);
    MPI_TEST_END();
}
