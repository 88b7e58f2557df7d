// model.h — the Mixtral graph (MixtralForCausalLM math) on a Backend, with its memory.
//
//   embed → L × [RMSNorm → GQA attention (RoPE, causal) → +residual → RMSNorm → sparse MoE
//   → +residual] → RMSNorm → lm_head → cross-entropy (+ aux_coef · load-balancing loss,
//   + z_coef · router z-loss)
//
// Parameters live in two flat arenas (params.h). Activations saved for the backward pass are
// planned once for micro_batch × seq_len; the MoE rows a rank receives vary with routing and go
// to a chained bump arena that grows only when the load exceeds every earlier step's.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "bump.h"
#include "comm.h"
#include "config.h"
#include "params.h"

// Per-layer saved state of the MoE block (shapes for N tokens on this rank, R received rows).
typedef struct MoeSaved {
    float* logits;     // [N, E] fp32 router logits
    float* probs;      // [N, E] fp32 softmax
    int32_t* topk;     // [N, k] expert ids
    float* topk_w;     // [N, k] renormalised weights
    int32_t* dest;     // [N·k] row of (n, slot) in the expert-major send buffer
    void* xe;          // [R, H] act: received rows, expert-major (bump)
    float* scale_e;    // [R] routing weight of each received row (bump)
    void* gu;          // [R, 2F] act: gate|up (bump)
    void* h;           // [R, F] act: SwiGLU output (bump), kept for the backward with
                       // train.keep_swiglu in a step with a backward; NULL otherwise (recomputed)
    void* hq;          // instead of h with precision.fp8: h's codes for w2's weight gradient
                       // (Backend.fp8_xcodes_make, bump), made by the forward; else NULL
    int R;             // rows received
    int* send_rows;    // host [ep] rows sent to each EP rank
    int* recv_rows;    // host [ep] rows received from each EP rank
    int* recv_blk;     // host [ep × E_local] rows received from rank s for local expert e
    int* load;         // host [E] rows this rank routed to each expert in the last forward
} MoeSaved;

typedef struct LayerSaved {
    void* x_in;     // [N, H] layer input (residual stream)
    void* ln1;      // [N, H]
    float* rstd1;   // [N]
    void* q;        // [N, Hq·D] after RoPE; q, k, v are one block, which the backward
    void* k;        // [N, Hkv·D] after RoPE   overwrites with the fused projection's gradient
    void* v;        // [N, Hkv·D]              [N, (Hq + 2·Hkv)·D] once attn_bwd has read them
    void* att;      // [N, Hq·D] attention output (before o_proj)
    float* lse;     // [B, Hq, T]
    void* x_mid;    // [N, H] after the attention residual
    void* ln2;      // [N, H]
    float* rstd2;   // [N]
    MoeSaved moe;
} LayerSaved;

// Loss components of one micro-batch (host, sums over this rank unless noted).
typedef struct StepLoss {
    double ce_sum;      // Σ CE over this rank's counted targets
    double aux;         // load-balancing loss (global micro-batch, unscaled)
    double z;           // router z-loss (global micro-batch, unscaled)
    int64_t ntok;       // counted targets on this rank
} StepLoss;

// lm_head logits are computed (and their backward run) in token chunks of at most this many
// bytes of logits: 1 GiB = 16,384 tokens of a 32,000 vocabulary in bf16 (one chunk for the
// bench's micro-batch 4). Larger chunks run the three head GEMMs nearer their peak and read and
// write the fp32 lm_head gradient fewer times (2 GiB, one chunk at micro-batch 8, was not faster
// there: docs/performance.md). src/plan.c uses the same number.
#define MODEL_HEAD_CHUNK_BYTES ((size_t)1 << 30)

typedef struct Model {
    ModelConfig c;
    Backend* be;
    Comm* comm;
    ParamLayout pl;
    int ep, ep_rank, edp, edp_rank, world, rank;
    int e_local;        // experts on this rank
    int B, T, N;        // micro-batch, sequence length, N = B·T tokens

    // parameters and gradients per arena (ARENA_DENSE, ARENA_EXPERT)
    size_t numel[2];    // real elements
    size_t padded[2];   // padded to a multiple of the ZeRO group size × 8
    void* w[2];         // [padded] act: compute weights (full copy on every rank)
    float* grad[2];     // [padded] fp32 gradients (fp32-sized either way: the checkpoint code
                        // stages full fp32 arenas there); NULL with ModelOpts.inference
    int grad_act[2];    // arena a's gradients are stored in the act dtype instead (experts only:
                        // ModelOpts.expert_grad_act); the pointer is then a void* in disguise.
                        // The act view's padding [numel, padded) lies in bytes the fp32 staging
                        // also uses; every staging user zeroes the arena afterwards
                        // (optim_load_from_staging, train_ckpt.c), so it reads zero in the norm

    // activations
    LayerSaved* ls;     // [L]
    void* x_final;      // [N, H] last layer output
    void* lnf;          // [N, H]
    float* rstdf;       // [N]
    int32_t* tok;       // [N] input tokens
    int32_t* tgt;       // [N] targets (< 0 ignored)
    int32_t* doc;       // [N] document starts of the micro-batch (MicroArgs.doc)
    int32_t* pos;       // [N] RoPE positions (MicroArgs.pos)
    const int32_t* cur_doc;  // doc, or NULL when this micro-batch has none (what attention reads)
    const int32_t* cur_pos;  // pos, or NULL (RoPE positions 0..T-1 per window)
    float* stats;       // [2E] router stats, summed over layers (fp32)
    float* zsum;        // [1]
    float* aux_dprob;   // [E] d(total loss)/d probs, same for every token and layer
    float* loss_acc;    // [1] CE sum of this micro-batch
    float z_grad;       // z-loss gradient scale per router row (router_bwd)
    int fresh;          // the running backward overwrites the gradients (MicroArgs.fresh)
    int keep_swiglu;    // ModelOpts.keep_swiglu: the MoE arenas are planned to keep h per layer
    int keep_h;         // this micro-batch keeps h (keep_swiglu and a backward follows)
    int keep_hq;        // ... as its FP8 codes instead (keep_h's case with precision.fp8: moe.c)
    int force_exchange; // failpoint moe.force_exchange: the dispatcher's exchange path (all_to_all_v,
                        // block reorders) runs even at EP = 1 (tests: the NCCL calls on one GPU)
    float* h_stats;     // host [2E] router stats of the last forward, summed over the world
    // scratch (reused by every layer)
    void* s_a;          // [N, max(H, Hq·D)] act
    void* s_b;          // [N, max(H, Hq·D)] act
    void* s_dx;         // [N, H] act: gradient of the residual stream
    void* s_q;          // [N, Hq·D] act: dq; s_q, s_k, s_v are one block, in the forward the
    void* s_k;          // [N, Hkv·D] act: dk     fused q/k/v projection [N, (Hq + 2·Hkv)·D]
    void* s_v;          // [N, Hkv·D] act: dv     before RoPE splits it
    float* s_dlog;      // [N, E] fp32 router logit gradient
    void* s_dlog_act;   // [N, E] act
    float* s_dw;        // [N·k] fp32 routing-weight gradient
    void* s_xp;         // [N·k, H] act: send buffer (permuted rows)
    float* s_wp;        // [N·k] fp32: routing weights, permuted
    void* s_logits;     // [chunk, V] act: lm_head logits chunk
    int head_chunk;     // tokens per lm_head chunk
    int32_t* counts;    // [E] int32 backend: rows per expert (moe_index)
    int32_t* h_counts;  // host [E]
    Bump bump;          // MoE rows received (xe, scale_e, gu; h when kept), reset per micro-batch
    Bump tmp;           // MoE per-layer scratch, reset per layer; the FP8 GEMMs' workspace
    Fp8Mode fp8;        // ModelOpts.fp8: which GEMMs run in block-scaled FP8 (precision.fp8)
    int inference;      // ModelOpts.inference: forward only (no grad, no backward scratch; one
                        // layer's activations shared by every layer)
    size_t fp8_ws;      // bytes of tmp planned for the FP8 GEMMs' workspace (0 with fp8 none)
    Fp8WCodes* wq;      // [layers × 2] w13's and w2's FP8 codes of this rank's experts, kept across
                        // a step's micro-batches (ModelOpts.fp8_wcodes), else NULL. They lie in
                        // grad[ARENA_EXPERT] from byte wq_off (wq_bytes in all), past the gradients:
                        // with act-dtype (bf16) gradients, in the fp32-sized arena's unused half.
                        // Only a fresh backward makes them and only backward passes read them, so
                        // what uses the arena's fp32 room between steps (the checkpoint's staging,
                        // zeroing) may overwrite them there: act-dtype gradients make every
                        // backward fresh (model_step)
    size_t wq_off, wq_bytes;
    int wq_use;         // this micro-batch's expert GEMMs read wq (a backward pass); remade first
                        // when fresh, since the weights may have changed since the last step
    int wq_made;        // wq has been made (by a fresh backward) since the model was created
} Model;

// Bytes per element of arena a's gradients (m->grad_act: the act dtype, else fp32).
static inline size_t grad_esize(const Model* m, int a) {
    return m->grad_act[a] ? dtype_size(m->be->act_dtype) : sizeof(float);
}
// Element `off` of arena a's gradients, in their dtype.
static inline void* grad_at(const Model* m, int a, size_t off) { return (char*)m->grad[a] + off * grad_esize(m, a); }

// Run options that change what the model keeps in memory (not the math: gradients are the same;
// expert_grad_act rounds the expert gradients to the act dtype, as autocast does).
typedef struct ModelOpts {
    int keep_swiglu;  // train.keep_swiglu: the backward reads the experts' SwiGLU output h saved by
                      // the forward (R·F act elements per layer more) instead of recomputing it
    int expert_grad_act;  // precision.expert_grad=bf16: the expert weight gradients are written in
                          // the act dtype, each GEMM's fp32 sum rounded once (PyTorch autocast's
                          // values). Needs fresh gradients every micro-batch (no accumulation):
                          // model_step refuses MicroArgs.fresh = 0 with a backward.
    Fp8Mode fp8;      // precision.fp8: the expert GEMMs (experts), and the attention projections too
                      // (linear), in block-scaled FP8 (backend.h Fp8Gemm); the backend must have
                      // fp8_ws_bytes (model_fp8_check)
    int fp8_wcodes;   // config_fp8_wcodes (with fp8, not inference): the expert weights' FP8
                      // codes made at each step's first micro-batch and read by the step's expert
                      // GEMMs (Model.wq; Backend.fp8_wcodes_bytes a layer's w13 and w2)
    int inference;    // forward only (eval, generate): no weight gradients (grad[] NULL), no
                      // backward-only scratch, and one layer's activations (and MoE rows) that
                      // every layer reuses, since nothing is kept for a backward. model_step
                      // refuses MicroArgs.backward; the forward's values are bit for bit the same.
} ModelOpts;

// Builds the model for this rank: layout, memory (parameters, gradients, activations; with
// ModelOpts.inference the parameters and one layer's forward buffers).
// Arenas are padded to a multiple of 8 × the ZeRO group size (world for dense, edp for experts).
// model_create = model_create_opts with every option off (o = NULL).
void model_create(Model* m, const ModelConfig* c, int B, int T, Backend* be, Comm* comm);
void model_create_opts(Model* m, const ModelConfig* c, int B, int T, const ModelOpts* o, Backend* be, Comm* comm);
void model_free(Model* m);
// 0 when backend be can run precision.fp8 = mode (every backend with fp8_ws_bytes; none needs
// nothing), else -1 with the reason in e.
int model_fp8_check(const Backend* be, Fp8Mode mode, Err* e);
// One FP8 GEMM as Backend.fp8_ws_bytes is asked about it, and the largest workspace of n of them
// (one workspace serves a pass's GEMMs in turn; 0 with n = 0).
typedef struct Fp8Call { Fp8Op op; Fp8Gemm kind; int M, N, K, groups; } Fp8Call;
size_t model_fp8_ws_max(Backend* be, const Fp8Call* calls, int n);

// Deterministic init by tensor name and seed (independent of the layout): HF's normal(0,
// init_std) for linear and embedding weights, 1 for norm weights. Writes fp32 values through
// dst [p->numel] (the optimizer keeps the masters).
void model_init_tensor(const ModelConfig* c, const ParamInfo* p, uint64_t seed, float* dst);

// One micro-batch. tokens/targets: host [N]. Backward accumulates into m->grad when
// grad_scale_ce != 0 (the scale turns the CE sum into the global mean; aux/z gradient scales
// are given separately). n_micro is the accumulation count (for the aux/z gradient scale).
typedef struct MicroArgs {
    const int32_t* tokens;  // host [N]
    const int32_t* targets; // host [N], < 0 = ignored
    const int32_t* doc;     // host [N] or NULL: packed documents, per window the index of each
                            // token's document start (backend.h attn_fwd); NULL = plain causal
    const int32_t* pos;     // host [N] or NULL: RoPE position of each token (NULL = t in its window)
    int backward;           // 0 = forward only (eval)
    float ce_scale;         // gradient scale of the CE sum (1 / global counted targets)
    float aux_scale;        // gradient scale of aux (aux_coef / n_micro)
    float z_scale;          // gradient scale of z (z_coef / n_micro)
    int fresh;              // 1: the gradients overwrite m->grad instead of adding to it (the
                            // first micro-batch of a step; old contents, even NaN, are ignored).
                            // Saves zeroing the arenas and reading them in the weight GEMMs. With
                            // kept FP8 weight codes (Model.wq) a fresh backward also makes them, and
                            // the step's later ones read them: the weights must not change between.
} MicroArgs;
StepLoss model_step(Model* m, const MicroArgs* a);

// Expert load of the last forward, summed over layers and the world (host [E]).
void model_expert_load(const Model* m, double* load);
