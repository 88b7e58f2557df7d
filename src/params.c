// params.c — see params.h.
#include "params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Appends the tensor `name` [d0] or [d0, d1] at *off of arena a and moves *off past it.
static void add(ParamLayout* pl, int* cap, const char* name, ArenaId a, size_t* off, int64_t d0, int64_t d1, int layer,
                int expert, int no_decay) {
    if (pl->n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        pl->p = realloc(pl->p, sizeof(ParamInfo) * (size_t)*cap);
        CHECK(pl->p, "out of memory building the parameter layout");
    }
    ParamInfo* p = &pl->p[pl->n++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->arena = a;
    p->offset = *off;
    p->ndim = d1 ? 2 : 1;
    p->shape[0] = d0;
    p->shape[1] = d1;
    p->numel = (size_t)d0 * (size_t)(d1 ? d1 : 1);
    p->layer = layer;
    p->expert = expert;
    p->no_decay = no_decay;
    *off += p->numel;
}

// Layer l's tensors in Hugging Face's order: the dense ones from *d, this rank's experts' from *x.
static void add_layer(ParamLayout* pl, int* cap, const ModelConfig* m, int l, size_t* d, size_t* x) {
    const int64_t H = m->hidden, F = m->ffn, E = m->experts;
    const int64_t D = H / m->heads, Hq = m->heads, Hkv = m->kv_heads;
    LayerOffsets* lo = &pl->layer[l];
    char nm[96];
#define NAME(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
    lo->ln1 = *d;
    add(pl, cap, NAME("model.layers.%d.input_layernorm.weight", l), ARENA_DENSE, d, H, 0, l, -1, 1);
    lo->qkv = *d;
    add(pl, cap, NAME("model.layers.%d.self_attn.q_proj.weight", l), ARENA_DENSE, d, Hq * D, H, l, -1, 0);
    add(pl, cap, NAME("model.layers.%d.self_attn.k_proj.weight", l), ARENA_DENSE, d, Hkv * D, H, l, -1, 0);
    add(pl, cap, NAME("model.layers.%d.self_attn.v_proj.weight", l), ARENA_DENSE, d, Hkv * D, H, l, -1, 0);
    lo->o = *d;
    add(pl, cap, NAME("model.layers.%d.self_attn.o_proj.weight", l), ARENA_DENSE, d, H, Hq * D, l, -1, 0);
    lo->ln2 = *d;
    add(pl, cap, NAME("model.layers.%d.post_attention_layernorm.weight", l), ARENA_DENSE, d, H, 0, l, -1, 1);
    lo->gate = *d;
    add(pl, cap, NAME("model.layers.%d.block_sparse_moe.gate.weight", l), ARENA_DENSE, d, E, H, l, -1, 0);
    lo->w13 = *x;
    for (int g = pl->expert_lo; g < pl->expert_hi; g++) {
        add(pl, cap, NAME("model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, g), ARENA_EXPERT, x, F, H, l, g, 0);
        add(pl, cap, NAME("model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, g), ARENA_EXPERT, x, F, H, l, g, 0);
    }
    lo->w2 = *x;
    for (int g = pl->expert_lo; g < pl->expert_hi; g++)
        add(pl, cap, NAME("model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, g), ARENA_EXPERT, x, H, F, l, g, 0);
#undef NAME
}

void params_build(ParamLayout* pl, const ModelConfig* m, int ep, int ep_rank) {
    memset(pl, 0, sizeof *pl);
    int cap = 0;
    const int64_t H = m->hidden, V = m->vocab_size;
    const int el = m->experts / ep;
    pl->head_dim = m->hidden / m->heads;
    pl->expert_lo = ep_rank * el;
    pl->expert_hi = pl->expert_lo + el;
    pl->layer = calloc((size_t)m->layers, sizeof(LayerOffsets));
    CHECK(pl->layer, "out of memory");
    size_t d = 0, x = 0;  // running offsets in the dense and expert arenas

    pl->embed = d;
    add(pl, &cap, "model.embed_tokens.weight", ARENA_DENSE, &d, V, H, -1, -1, 0);
    for (int l = 0; l < m->layers; l++) add_layer(pl, &cap, m, l, &d, &x);
    pl->final_norm = d;
    add(pl, &cap, "model.norm.weight", ARENA_DENSE, &d, H, 0, -1, -1, 1);
    pl->lm_head = d;
    add(pl, &cap, "lm_head.weight", ARENA_DENSE, &d, V, H, -1, -1, 0);
    pl->numel[ARENA_DENSE] = d;
    pl->numel[ARENA_EXPERT] = x;
}

void params_free(ParamLayout* pl) {
    free(pl->p);
    free(pl->layer);
    memset(pl, 0, sizeof *pl);
}

int params_find(const ParamLayout* pl, const char* name) {
    for (int i = 0; i < pl->n; i++)
        if (strcmp(pl->p[i].name, name) == 0) return i;
    return -1;
}

ParamCounts params_count(const ModelConfig* m) {
    const int64_t H = m->hidden, F = m->ffn, V = m->vocab_size, E = m->experts, L = m->layers;
    const int64_t D = H / m->heads;
    const int64_t attn = H * D * m->heads * 2 + H * D * m->kv_heads * 2;
    const int64_t per_layer_dense = attn + 2 * H + E * H;
    const int64_t expert = 3 * H * F;
    ParamCounts c;
    c.embed = V * H;
    c.dense = L * per_layer_dense + 2 * V * H + H;
    c.expert = L * E * expert;
    c.total = c.dense + c.expert;
    c.active = c.dense + L * (int64_t)m->top_k * expert;
    return c;
}

double params_train_flops_per_token(const ModelConfig* m, int seq_len) {
    const double H = m->hidden, F = m->ffn, V = m->vocab_size, L = m->layers;
    const double kvh = (double)m->kv_heads * H / m->heads;
    const double attn = 2 * H * H + 2 * H * kvh;
    const double experts = (double)m->top_k * 3 * H * F;
    const double router = H * m->experts;
    const double dense = L * (attn + experts + router) + H * V;
    return 6 * dense + 6 * L * H * seq_len;
}
