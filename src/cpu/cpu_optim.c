// cpu_optim.c — AdamW with PyTorch's semantics (torch.optim.AdamW, decoupled weight decay),
// each element computed in double and stored to fp32:
//   g = fl32(grad · grad_scale)
//   p ← p · (1 − lr·wd)
//   m ← β1 m + (1 − β1) g,  v ← β2 v + (1 − β2) g²       (stored as fp32)
//   p ← p − lr · (m / (1 − β1^step)) / (sqrt(v / (1 − β2^step)) + eps)
// then the act copy param = p when it is a different buffer. The split-master form of the same
// update (adamw_split) and its pack / unpack are below.
#include <math.h>
#include <string.h>

#include "cpu.h"

typedef struct AdamD {
    double b1, b2, bc1, bc2, decay, lr, eps;
    float gs;
} AdamD;

static AdamD adam_args(const AdamWDesc* d) {
    CHECK(d->step >= 1, "adamw: step is 1-based, got %d", d->step);
    return (AdamD){.b1 = d->beta1, .b2 = d->beta2, .bc1 = 1.0 - pow((double)d->beta1, d->step),
                   .bc2 = 1.0 - pow((double)d->beta2, d->step), .decay = 1.0 - (double)d->lr * d->wd, .lr = d->lr,
                   .eps = d->eps, .gs = d->grad_scale};
}

// One element: updates *m, *v and returns the new master (the one place the arithmetic lives).
static inline float adam1(float p, float* m, float* v, float grad, const AdamD* a) {
    const double g = (double)(grad * a->gs);
    *m = (float)(a->b1 * *m + (1.0 - a->b1) * g);
    *v = (float)(a->b2 * *v + (1.0 - a->b2) * g * g);
    const double mhat = *m / a->bc1, vhat = *v / a->bc2;
    return (float)((double)p * a->decay - a->lr * mhat / (sqrt(vhat) + a->eps));
}

void cpu_adamw(Backend* be, const AdamWDesc* d, float* master, void* param_, float* m, float* v, const void* grad_,
               size_t n) {
    // master, m, v, grad [n] fp32 (grad_act too: the act dtype here is fp32); param [n] act (may be master)
    float* param = param_;
    const float* grad = grad_;
    const AdamD a = adam_args(d);
#pragma omp parallel for schedule(static) if (n >= 32768)
    for (size_t i = 0; i < n; i++) {
        const float p = adam1(master[i], &m[i], &v[i], grad[i], &a);
        master[i] = p;
        if (param != master) param[i] = p;
    }
}

// ---- split fp32 masters -----------------------------------------------------------------------
//
// An fp32 master with bits x = hi·2^16 + lo (hi, lo in [0, 2^16)) is stored as
//   w   = (hi + c) mod 2^16,  c = lo >> 15 (1 when lo ≥ 0x8000)     the bf16 compute weight
//   rem = lo − c·2^16  (in [−2^15, 2^15): the int16 whose bits are lo)
// and recovered as x = (w·2^16 + rem) mod 2^32, in unsigned 32-bit arithmetic with rem
// sign-extended. Exact for every x:
//   w·2^16 + rem ≡ (hi + c)·2^16 + lo − c·2^16 = hi·2^16 + lo = x   (mod 2^32)
// (w's reduction mod 2^16 is a multiple of 2^32 after the shift, so it drops out too). No case
// analysis is needed: lo < 0x8000 (c = 0, rem = lo ≥ 0), lo ≥ 0x8000 (c = 1, rem < 0: w is one
// above hi and rem takes it back), either sign (the sign bit is in hi and rides along), ±0
// (w = hi, rem = 0), denormals, NaN and inf patterns are all this one identity.
// What w is: within one sign, the magnitude of a float is monotone in its bit pattern and
// consecutive patterns are consecutive representable values (a mantissa carry steps into the
// next exponent, denormals into the smallest normal). So w = hi is x truncated to bf16 (toward
// zero) and w = hi + 1 the next bf16 away from zero; c = 1 exactly when the dropped part lo is
// at least half a bf16 ulp. w is x rounded to nearest, ties (lo = 0x8000) away from zero;
// round-to-nearest-even (f32_to_bf16, __float2bfloat16_rn) differs only at those ties with hi
// even. At the top of the range (hi = 0x7f7f, lo ≥ 0x8000) w becomes 0x7f80, the bf16 inf
// pattern — as with round-to-nearest-even — while rem still recovers the finite master exactly
// (0x7f7fffff = 0x7f80·2^16 − 1). Round-to-nearest-even could not serve here: at a tie with hi
// even it keeps w = hi with lo = +0x8000, one more than an int16 holds.

static inline void pack1(float x, uint16_t* w, int16_t* rem) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint32_t lo = u & 0xffffu, c = lo >> 15;
    *w = (uint16_t)((u >> 16) + c);                   // mod 2^16
    *rem = (int16_t)((int32_t)lo - (int32_t)(c << 16));  // lo − c·2^16, in int16 range
}

static inline float unpack1(uint16_t w, int16_t rem) {
    const uint32_t u = ((uint32_t)w << 16) + (uint32_t)(int32_t)rem;  // mod 2^32
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

void cpu_split_pack(Backend* be, uint16_t* w, int16_t* rem, const float* x, size_t n) {
    // w, rem [n] (rem may be NULL: w only); x [n] fp32
#pragma omp parallel for schedule(static) if (n >= 32768)
    for (size_t i = 0; i < n; i++) {
        int16_t r;
        pack1(x[i], &w[i], &r);
        if (rem) rem[i] = r;
    }
}

void cpu_split_unpack(Backend* be, float* x, const uint16_t* w, const int16_t* rem, size_t n) {
    // x [n] fp32; w, rem [n]
#pragma omp parallel for schedule(static) if (n >= 32768)
    for (size_t i = 0; i < n; i++) x[i] = unpack1(w[i], rem[i]);
}

void cpu_adamw_split(Backend* be, const AdamWDesc* d, uint16_t* w, int16_t* rem, float* m, float* v, const void* grad_,
                     size_t n) {
    // w, rem [n] split masters; m, v, grad [n] fp32 (grad_act too: the act dtype here is fp32)
    const float* grad = grad_;
    const AdamD a = adam_args(d);
#pragma omp parallel for schedule(static) if (n >= 32768)
    for (size_t i = 0; i < n; i++) pack1(adam1(unpack1(w[i], rem[i]), &m[i], &v[i], grad[i], &a), &w[i], &rem[i]);
}
