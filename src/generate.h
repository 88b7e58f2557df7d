// generate.h — autoregressive decoding with a KV cache on the training graph's weights and ops
// (docs/generate.md).
//
// A Gen holds one key/value cache per layer ([B, Hkv, Tmax, D] act each, backend.h kv_append)
// and runs the model's forward over n new rows per sequence: the same norms, GEMMs, router and
// expert dispatch as training (moe_forward: under mpirun the experts stay sharded over the EP
// group, every rank running the same batch), with RoPE at each sequence's own positions and
// attention over the cache (attn_decode). Prefill is the prompts right-padded to the longest
// (n = its length, every sequence from position 0); a decode step is n = 1 at each sequence's
// own length. The work per new token is linear in the cached length.
#pragma once
#include <stdint.h>

#include "model.h"
#include "util.h"

typedef struct Gen {
    Model* m;        // created with B sequences and T ≥ the longest prompt (model_create):
                     // its activation buffers hold the prefill's B·T rows
    int B, Tmax;     // sequences; cache positions per sequence
    void** kc;       // [L] act [B, Hkv, Tmax, D]
    void** vc;       // [L]
    int32_t* pos;    // backend [B]: position of the first new row of each sequence
    int* len;        // host [B]: tokens in each sequence's cache
    void* rows;      // act [B, H]: the rows whose logits are wanted
    void* logits;    // act [B, V]
    float* logits_f32; // backend [B, V] fp32
    float* h_logits; // host [B, V] fp32
} Gen;

void gen_create(Gen* g, Model* m, int Tmax);
// The same with B sequences of the model's rows (B ≤ m->N; prefills then hold m->N / B rows each).
void gen_create_batch(Gen* g, Model* m, int B, int Tmax);
void gen_free(Gen* g);
// Forgets every sequence (lengths 0).
void gen_reset(Gen* g);
// Runs n new rows per sequence: tok host [B·n] (row b·n + i is sequence b's i-th new token),
// at positions len[b] + i; appends them to the cache; len[b] += adv[b] (adv NULL: n for all;
// padding rows past adv[b] are written to the cache but count as nothing and are overwritten
// by the next rows). Logits of row last[b] of each sequence (last NULL: n − 1) → g->h_logits
// [B, V] (fp32, host). Collective under mpirun (every rank the same tok).
void gen_forward(Gen* g, const int32_t* tok, int n, const int* adv, const int* last);

// Sampling (host). The filter turns one row of logits into the distribution sampled from:
// temperature ≤ 0 → all mass on the argmax (lowest index on ties); else softmax(logits / T),
// then top_k > 0 keeps the k most probable (ties: lower index first), then top_p in (0, 1)
// keeps the shortest most-probable-first prefix whose mass reaches top_p (at least one token),
// renormalised. probs [V] out. Returns the number of tokens kept.
int gen_filter(const float* logits, int V, float temperature, int top_k, float top_p, float* probs);
// One draw from gen_filter's distribution with rng (one rng_uniform per call; greedy draws none).
int gen_sample(const float* logits, int V, float temperature, int top_k, float top_p, float* scratch, Rng* rng);
