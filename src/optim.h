// optim.h — AdamW with fp32 masters, ZeRO-1 sharding, gradient reduction, clipping, schedule.
//
// Per arena (dense: ZeRO group = world; experts: ZeRO group = edp), this rank owns the slice
// [lo, lo + n) of the padded arena: its fp32 master weights and Adam moments. The masters are a
// separate fp32 copy, or, in bf16 runs with precision.master=split (Optim.split), the compute
// weights' slice w[lo, lo + n) (bf16, the high halves rounded) plus an int16 remainder per
// element: the same fp32 bits, exactly (backend.h split_pack), 2 bytes per element less. A step:
//   reduce grads over the group (reduce-scatter with ZeRO-1, all-reduce without)
//   → global grad norm (each element counted once) → skip if non-finite → clip
//   → AdamW on the owned slice (per tensor segment: weight decay per tensor)
//   → all-gather the updated compute weights (ZeRO-1).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "model.h"

typedef struct OptSeg {  // a tensor ∩ the owned slice
    size_t lo, n;        // elements, relative to the owned slice
    float wd;            // weight decay of this tensor
} OptSeg;

typedef struct OptShard {
    GroupId group;
    int gsize, grank;
    size_t lo, n;        // owned slice of the padded arena
    float* master;       // [n] fp32 master weights (NULL when split)
    int16_t* rem;        // [n] split masters: remainders of m->w[a][lo, lo + n) (NULL otherwise)
    float* m;            // [n] Adam first moment
    float* v;            // [n] Adam second moment
    float* gshard;       // [n] reduced gradient of the slice (grad + lo without ZeRO-1)
    int gact;            // the gradients have the act dtype (Model.grad_act; only with gsize 1:
                         // nothing to reduce), gshard then points at act elements
    size_t norm_lo, norm_n;  // slice whose squares this rank adds to the global norm
    OptSeg* seg;
    int nseg;
} OptShard;

typedef struct Optim {
    OptimConfig c;
    int zero1;
    int split;           // masters kept split (bf16 compute weights + OptShard.rem)
    int steps_total;
    OptShard sh[2];
    float* d_norm;       // [1] backend fp32
    float* d_bad;        // [1] backend fp32
    int zero_grads;      // zero m->grad after the update (default 1); 0 when the next step's
                         // first micro-batch overwrites them anyway (MicroArgs.fresh: the trainer)
} Optim;

// master: precision.master; split applies when the backend computes in bf16 (else fp32 masters).
void optim_create(Optim* o, const OptimConfig* c, int zero1, MasterMode master, int steps_total, Model* m);
void optim_free(Optim* o, Model* m);

// Learning rate at 0-based step s.
float optim_lr(const OptimConfig* c, int steps_total, int s);

// 1 when the masters are kept split (precision.master=split on a bf16 backend): Optim.split.
int optim_split(MasterMode master, const Backend* be);
// Compute weights w[0, n) (act) from fp32 values x[0, n) (backend memory), rounded as the
// optimizer rounds them (split: split_pack's rounding, else f32_to_act's). Elementwise, so any
// slice gives the bits of the whole arena: inference (no optimizer) loads weights through it.
void optim_weights_from_f32(Backend* be, int split, void* w, const float* x, size_t n);

// Sets masters from the model's full fp32 values staged in m->grad (both arenas), writes the
// compute weights, and zeroes the gradients. Used after init and after loading a checkpoint.
void optim_load_from_staging(Optim* o, Model* m);

typedef struct StepStats {
    double grad_norm;   // before clipping
    float lr;
    int skipped;        // non-finite gradient: no update
} StepStats;

// Reduce, clip and update for 0-based step s (Adam's step count is s + 1 - skipped so far;
// the caller passes the 1-based Adam step). Zeroes the gradients afterwards (if o->zero_grads).
StepStats optim_step(Optim* o, Model* m, int s, int adam_step);

// Gathers the full fp32 masters (which = 0), exp_avg (1) or exp_avg_sq (2) of arena a into
// m->grad[a] (staging) on every rank of the arena's group (split masters: unpacked first).
void optim_gather(Optim* o, Model* m, int a, int which);
// Writes the owned slice of master (0) / m (1) / v (2) from the full values staged in m->grad[a].
// Split masters: which = 0 packs into the remainders and the owned slice of the compute weights
// (the rest of them: optim_load_from_staging, or the step's all-gather).
void optim_scatter(Optim* o, Model* m, int a, int which);
