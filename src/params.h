// params.h — the parameter layout: every Hugging Face tensor name mapped to a span of one of
// two flat arenas.
//
//   dense arena  : replicated on every rank (embeddings, attention, norms, routers, lm_head);
//                  gradients reduced over the world.
//   expert arena : this rank's experts only (E/ep of them per layer); gradients reduced over edp.
//
// Fused storage, still one contiguous span per HF tensor:
//   qkv  [(Hq + 2·Hkv)·D, H]  = q_proj rows, then k_proj rows, then v_proj rows
//   w13  [E_local, 2F, H]     = per expert: w1 (gate) rows, then w3 (up) rows
//   w2   [E_local, H, F]
// so one GEMM computes q, k and v, and one grouped GEMM gate and up.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "config.h"

typedef enum { ARENA_DENSE = 0, ARENA_EXPERT = 1 } ArenaId;

typedef struct ParamInfo {
    char name[96];      // HF name, e.g. "model.layers.3.block_sparse_moe.experts.5.w1.weight"
    ArenaId arena;
    size_t offset;      // elements from the arena start
    size_t numel;
    int ndim;
    int64_t shape[2];
    int layer;          // -1 for embeddings / final norm / lm_head
    int expert;         // global expert id, -1 for dense tensors
    int no_decay;       // norm weights: exempt from weight decay unless optim.decay_norms
} ParamInfo;

// Offsets (elements) of one layer's tensors in the dense arena.
typedef struct LayerOffsets {
    size_t ln1;     // [H]
    size_t qkv;     // [(Hq+2Hkv)·D, H]
    size_t o;       // [H, Hq·D]
    size_t ln2;     // [H]
    size_t gate;    // [E, H]
    size_t w13;     // expert arena: [E_local, 2F, H]
    size_t w2;      // expert arena: [E_local, H, F]
} LayerOffsets;

typedef struct ParamLayout {
    int n;                 // number of HF tensors held by this rank
    ParamInfo* p;          // [n]
    size_t numel[2];       // arena sizes (elements): [ARENA_DENSE], [ARENA_EXPERT]
    int expert_lo, expert_hi;  // global experts [lo, hi) held here
    size_t embed, final_norm, lm_head;  // dense arena offsets
    LayerOffsets* layer;   // [L]
    int head_dim;          // D = H / Hq
} ParamLayout;

// Builds the layout for EP rank ep_rank of ep. Caller frees with params_free.
void params_build(ParamLayout* pl, const ModelConfig* m, int ep, int ep_rank);
void params_free(ParamLayout* pl);
// Index of a tensor by HF name, or -1.
int params_find(const ParamLayout* pl, const char* name);

// Whole-model counts (all experts), for `plan` and logs.
typedef struct ParamCounts {
    int64_t total;       // every parameter
    int64_t active;      // used per token (top_k of E experts)
    int64_t dense;       // non-expert
    int64_t expert;      // all experts
    int64_t embed;       // embed_tokens (not in FLOP counts)
} ParamCounts;
ParamCounts params_count(const ModelConfig* m);

// Training FLOPs per token (forward + backward = 6 × active matmul params, plus causal
// attention 6·L·H·seq), the count scripts/hf_peer.py uses too, so ratios compare like with like.
double params_train_flops_per_token(const ModelConfig* m, int seq_len);
