// optim.c — see optim.h.
#include "optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "prof.h"
#include "util.h"

static void shard_init(Optim* o, Model* m, int a, const OptimConfig* c) {
    Backend* be = m->be;
    OptShard* s = &o->sh[a];
    s->group = a == ARENA_DENSE ? GROUP_WORLD : GROUP_EDP;
    s->gsize = m->comm->size[s->group];
    s->grank = m->comm->rank[s->group];
    s->gact = m->grad_act[a];
    CHECK(!s->gact || s->gsize == 1, "act-dtype gradients (precision.expert_grad=bf16) need an arena group of 1 "
          "(no reduction): got %d ranks", s->gsize);
    const size_t part = m->padded[a] / (size_t)s->gsize;  // padded is a multiple of 8·gsize
    if (o->zero1 && s->gsize > 1) {
        s->lo = (size_t)s->grank * part;
        s->n = part;
        s->gshard = be->alloc(be, sizeof(float) * s->n);
        s->norm_lo = 0;
        s->norm_n = s->n;
    } else {
        s->lo = 0;
        s->n = m->padded[a];
        s->gshard = m->grad[a];
        s->norm_lo = (size_t)s->grank * part;  // count each element once in the global norm
        s->norm_n = part;
    }
    if (o->split) s->rem = be->alloc(be, sizeof(int16_t) * s->n);
    else s->master = be->alloc(be, sizeof(float) * s->n);
    s->m = be->alloc(be, sizeof(float) * s->n);
    s->v = be->alloc(be, sizeof(float) * s->n);
    s->seg = xcalloc((size_t)m->pl.n, sizeof(OptSeg));
    s->nseg = 0;
    for (int i = 0; i < m->pl.n; i++) {
        const ParamInfo* p = &m->pl.p[i];
        if ((int)p->arena != a) continue;
        size_t lo = p->offset > s->lo ? p->offset : s->lo;
        size_t hi = p->offset + p->numel < s->lo + s->n ? p->offset + p->numel : s->lo + s->n;
        if (lo >= hi) continue;
        OptSeg* g = &s->seg[s->nseg++];
        g->lo = lo - s->lo;
        g->n = hi - lo;
        g->wd = (p->no_decay && !c->decay_norms) ? 0.0f : c->weight_decay;
    }
}

int optim_split(MasterMode master, const Backend* be) { return master == MASTER_SPLIT && be->act_dtype == DTYPE_BF16; }

void optim_weights_from_f32(Backend* be, int split, void* w, const float* x, size_t n) {
    // split masters need their own rounding (ties away from zero)
    if (split) be->split_pack(be, w, NULL, x, n);
    else be->f32_to_act(be, w, x, n);
}

void optim_create(Optim* o, const OptimConfig* c, int zero1, MasterMode master, int steps_total, Model* m) {
    memset(o, 0, sizeof *o);
    o->c = *c;
    o->zero1 = zero1;
    o->split = optim_split(master, m->be);
    o->zero_grads = 1;
    o->steps_total = steps_total;
    for (int a = 0; a < 2; a++) shard_init(o, m, a, c);
    o->d_norm = m->be->alloc(m->be, sizeof(float));
    o->d_bad = m->be->alloc(m->be, sizeof(float));
}

void optim_free(Optim* o, Model* m) {
    Backend* be = m->be;
    for (int a = 0; a < 2; a++) {
        OptShard* s = &o->sh[a];
        if (s->master) be->free(be, s->master);
        if (s->rem) be->free(be, s->rem);
        be->free(be, s->m);
        be->free(be, s->v);
        if (s->gshard != m->grad[a]) be->free(be, s->gshard);
        free(s->seg);
    }
    be->free(be, o->d_norm);
    be->free(be, o->d_bad);
}

float optim_lr(const OptimConfig* c, int total, int s) {
    if (c->warmup > 0 && s < c->warmup) return c->lr * (float)(s + 1) / (float)c->warmup;
    const double mn = c->min_lr_ratio;
    const double span = total - c->warmup > 1 ? (double)(total - c->warmup - 1) : 1.0;
    double p = (double)(s - c->warmup) / span;
    if (p > 1) p = 1;
    if (p < 0) p = 0;
    double f = 1.0;
    switch (c->schedule) {
        case SCHED_COSINE: f = mn + (1 - mn) * 0.5 * (1 + cos(3.14159265358979323846 * p)); break;
        case SCHED_LINEAR: f = 1 - (1 - mn) * p; break;
        case SCHED_CONSTANT: f = 1; break;
        case SCHED_WSD: {
            const double start = 1.0 - c->decay_frac;  // fraction of the post-warmup span
            f = p <= start ? 1.0 : 1 - (1 - mn) * (p - start) / (c->decay_frac > 0 ? c->decay_frac : 1);
            break;
        }
    }
    return (float)(c->lr * f);
}

// Element off of arena a's shard gradient, in its dtype (s->gact = m->grad_act[a]).
static const void* gshard_at(const Model* m, int a, const OptShard* s, size_t off) {
    return (const char*)s->gshard + off * grad_esize(m, a);
}

static float* which_buf(OptShard* s, int which) { return which == 0 ? s->master : which == 1 ? s->m : s->v; }

// Split masters: the owned slice of the compute weights (bf16 bits), element i of the shard at [i].
static uint16_t* shard_w(const Model* m, int a, const OptShard* s) { return (uint16_t*)m->w[a] + s->lo; }

void optim_gather(Optim* o, Model* m, int a, int which) {
    OptShard* s = &o->sh[a];
    if (which == 0 && o->split) {  // unpack into this rank's place in the staging, then gather in place
        float* own = m->grad[a] + s->lo;
        m->be->split_unpack(m->be, own, shard_w(m, a, s), s->rem, s->n);
        if (o->zero1 && s->gsize > 1) m->comm->all_gather(m->comm, s->group, m->grad[a], own, s->n * sizeof(float));
        return;
    }
    float* src = which_buf(s, which);
    if (o->zero1 && s->gsize > 1)
        m->comm->all_gather(m->comm, s->group, m->grad[a], src, s->n * sizeof(float));
    else
        m->be->copy(m->be, m->grad[a], src, s->n * sizeof(float));
}

void optim_scatter(Optim* o, Model* m, int a, int which) {
    OptShard* s = &o->sh[a];
    if (which == 0 && o->split) {
        m->be->split_pack(m->be, shard_w(m, a, s), s->rem, m->grad[a] + s->lo, s->n);
        return;
    }
    m->be->copy(m->be, which_buf(s, which), m->grad[a] + s->lo, s->n * sizeof(float));
}

void optim_load_from_staging(Optim* o, Model* m) {
    Backend* be = m->be;
    for (int a = 0; a < 2; a++) {
        OptShard* s = &o->sh[a];
        // every compute weight from the full staging on every rank (no collective)
        optim_weights_from_f32(be, o->split, m->w[a], m->grad[a], m->padded[a]);
        optim_scatter(o, m, a, 0);
        be->zero(be, s->m, sizeof(float) * s->n);
        be->zero(be, s->v, sizeof(float) * s->n);
        be->zero(be, m->grad[a], sizeof(float) * m->padded[a]);
    }
}

// Sums each arena's gradients over its group: into this rank's shard (ZeRO-1) or everywhere.
static void reduce_grads(Optim* o, Model* m) {
    Comm* cm = m->comm;
    for (int a = 0; a < 2; a++) {
        OptShard* s = &o->sh[a];
        if (s->gsize == 1) continue;
        if (o->zero1)
            cm->reduce_scatter_sum(cm, s->group, s->gshard, m->grad[a], s->n);
        else
            cm->all_reduce_sum(cm, s->group, m->grad[a], m->padded[a]);
    }
}

// The global gradient norm over all ranks, every element counted once.
static double grad_norm(Optim* o, Model* m) {
    Backend* be = m->be;
    be->zero(be, o->d_norm, sizeof(float));
    for (int a = 0; a < 2; a++) {
        OptShard* s = &o->sh[a];
        if (!s->norm_n) continue;
        if (s->gact) be->sumsq_act(be, o->d_norm, gshard_at(m, a, s, s->norm_lo), s->norm_n);
        else be->sumsq_f32(be, o->d_norm, s->gshard + s->norm_lo, s->norm_n);
    }
    float h = 0;
    be->to_host(be, &h, o->d_norm, sizeof(float));
    double sq = h;
    m->comm->host_all_reduce_f64(m->comm, GROUP_WORLD, &sq, 1);
    return sqrt(sq);
}

// AdamW over this rank's segments of both arenas (gradients scaled by clip), then, under ZeRO-1,
// the updated shards gathered back into the full weights.
static void adamw_update(Optim* o, Model* m, float lr, float clip, int adam_step) {
    Backend* be = m->be;
    Comm* cm = m->comm;
    const size_t esz = dtype_size(be->act_dtype);
    AdamWDesc d = {.lr = lr, .beta1 = o->c.beta1, .beta2 = o->c.beta2, .eps = o->c.eps, .grad_scale = clip,
                   .step = adam_step};
    for (int a = 0; a < 2; a++) {
        OptShard* s = &o->sh[a];
        d.grad_act = s->gact;
        for (int i = 0; i < s->nseg; i++) {
            const OptSeg* g = &s->seg[i];
            void* param = (char*)m->w[a] + (s->lo + g->lo) * esz;
            const void* grad = gshard_at(m, a, s, g->lo);
            d.wd = g->wd;
            if (o->split)  // the master is (param, rem): bf16 bits, esz = 2
                be->adamw_split(be, &d, param, s->rem + g->lo, s->m + g->lo, s->v + g->lo, grad, g->n);
            else
                be->adamw(be, &d, s->master + g->lo, param, s->m + g->lo, s->v + g->lo, grad, g->n);
        }
        if (o->zero1 && s->gsize > 1)
            cm->all_gather(cm, s->group, m->w[a], (char*)m->w[a] + s->lo * esz, s->n * esz);
    }
}

StepStats optim_step(Optim* o, Model* m, int step, int adam_step) {
    Backend* be = m->be;
    StepStats st = {0};
    st.lr = optim_lr(&o->c, o->steps_total, step);
    reduce_grads(o, m);
    prof_mark("optim.reduce");
    st.grad_norm = grad_norm(o, m);
    prof_mark("optim.grad_norm");
    if (!isfinite(st.grad_norm)) {
        st.skipped = 1;
    } else {
        const float clip = (o->c.clip > 0 && st.grad_norm > o->c.clip) ? (float)(o->c.clip / (st.grad_norm + 1e-6)) : 1.0f;
        adamw_update(o, m, st.lr, clip, adam_step);
    }
    prof_mark("optim.adamw");
    if (o->zero_grads)
        for (int a = 0; a < 2; a++) be->zero(be, m->grad[a], sizeof(float) * m->padded[a]);
    prof_mark("optim.zero_grad");
    prof_step_done();
    return st;
}
