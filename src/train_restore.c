// train_restore.c — where the trainer's state comes from (see train.h); train_ckpt.c writes it.
//
//   trainer_restore  checkpoint.resume (none | auto | a path) → load by name (a weight-only
//                    checkpoint: masters, Adam m = v = 0, Adam step count from 1); else
//                    checkpoint.init_from (a Hugging Face directory) → masters only, fresh Adam;
//                    else the random init by name.
//
// Loading goes by name into this rank's own layout (params_build for its EP rank), then
// optim_load_from_staging / optim_scatter put each rank's slice in place. So a checkpoint
// saved at any EP / EDP / world / zero1 loads at any other.
#define _DEFAULT_SOURCE
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "ckpt_internal.h"
#include "hf.h"
#include "train.h"
#include "train_ckpt_internal.h"
#include "util.h"

static size_t max_numel(const Model* m) {
    size_t max = 1;
    for (int i = 0; i < m->pl.n; i++) max = m->pl.p[i].numel > max ? m->pl.p[i].numel : max;
    return max;
}

// Where restored (or initialised) fp32 values go, one tensor at a time. Training: the full fp32
// arenas staged in the gradient buffers (zeroed first: the padding stays zero), which
// optim_load_from_staging / optim_scatter then put in place. Inference (Trainer.infer: no
// gradients, no optimizer): straight into the compute weights (zeroed first, for the padding),
// through a backend fp32 scratch of at most STAGE_CHUNK elements, rounded as
// optim_load_from_staging rounds them (optim_weights_from_f32, elementwise: the same bits).
#define STAGE_CHUNK ((size_t)1 << 22)
typedef struct Stager {
    Trainer* t;
    float* chunk;  // inference: backend [cap] fp32; NULL in training
    size_t cap;
    int split;     // inference: the masters' rounding (optim_split)
} Stager;

static void stager_open(Stager* s, Trainer* t) {
    Model* m = &t->model;
    Backend* be = m->be;
    memset(s, 0, sizeof *s);
    s->t = t;
    if (!t->infer) {
        trainer_zero_grads(m);
        return;
    }
    s->cap = max_numel(m) < STAGE_CHUNK ? max_numel(m) : STAGE_CHUNK;
    s->chunk = be->alloc(be, sizeof(float) * s->cap);
    s->split = optim_split(t->cfg.precision.master, be);
    for (int a = 0; a < 2; a++) be->zero(be, m->w[a], m->padded[a] * dtype_size(be->act_dtype));
}

static void stager_put(Stager* s, const ParamInfo* p, const float* host) {
    Model* m = &s->t->model;
    Backend* be = m->be;
    if (!s->chunk) {
        be->to_device(be, m->grad[p->arena] + p->offset, host, sizeof(float) * p->numel);
        return;
    }
    const size_t esz = dtype_size(be->act_dtype);
    for (size_t at = 0; at < p->numel; at += s->cap) {
        const size_t n = p->numel - at < s->cap ? p->numel - at : s->cap;
        be->to_device(be, s->chunk, host + at, sizeof(float) * n);
        optim_weights_from_f32(be, s->split, (char*)m->w[p->arena] + (p->offset + at) * esz, s->chunk, n);
    }
}

static void stager_close(Stager* s) {
    Backend* be = s->t->model.be;
    if (s->chunk) be->free(be, s->chunk);
    s->chunk = NULL;
}

// Random init by tensor name (layout-independent).
static void init_random(Trainer* t) {
    Model* m = &t->model;
    float* host = xmalloc(sizeof(float) * max_numel(m));
    Stager sg;
    stager_open(&sg, t);
    for (int i = 0; i < m->pl.n; i++) {
        const ParamInfo* p = &m->pl.p[i];
        model_init_tensor(&m->c, p, t->cfg.train.seed, host);
        stager_put(&sg, p, host);
    }
    stager_close(&sg);
    free(host);
    if (!t->infer) optim_load_from_staging(&t->opt, m);
}

// ---- restore ----------------------------------------------------------------------------------

// Compares the model section of a checkpoint's config with this run's.
static int check_model(const ModelConfig* ck, const ModelConfig* run, const char* where, Err* e) {
#define CMPI(f, key)                                                                                                   \
    if (ck->f != run->f)                                                                                               \
        return err_set(e, "%s: the checkpoint holds a different model: " key "=%d there, %d in this run's config "      \
                          "(a checkpoint loads only into the model it was saved for: set the model.* keys to match it, "  \
                          "or start a new model without resume / init_from)", where, ck->f, run->f);
    CMPI(vocab_size, "model.vocab_size")
    CMPI(hidden, "model.hidden")
    CMPI(ffn, "model.ffn")
    CMPI(layers, "model.layers")
    CMPI(heads, "model.heads")
    CMPI(kv_heads, "model.kv_heads")
    CMPI(experts, "model.experts")
    CMPI(top_k, "model.top_k")
#undef CMPI
    return 0;
}

// Reads tensors `which` of every parameter of this rank into the staging arenas.
typedef int (*ReadFn)(const void* src, const char* name, float* dst, int ndim, const int64_t* shape, Err* e);
static int rd_ckpt(const void* src, const char* name, float* dst, int ndim, const int64_t* shape, Err* e) {
    return ckpt_read(src, name, dst, ndim, shape, e);
}
static int rd_hf(const void* src, const char* name, float* dst, int ndim, const int64_t* shape, Err* e) {
    return hf_read(src, name, dst, ndim, shape, e);
}

static int stage(Trainer* t, ReadFn rd, const void* src, int which, const char* where, float* host, Err* e) {
    Model* m = &t->model;
    Stager sg;
    stager_open(&sg, t);
    int rc = 0;
    for (int i = 0; i < m->pl.n && !rc; i++) {
        const ParamInfo* p = &m->pl.p[i];
        char nm[128];
        ckpt_state_name(nm, sizeof nm, which, p->name);
        Err re = {{0}};
        if (rd(src, nm, host, p->ndim, p->shape, &re)) {
            rc = err_set(e, "%s: %s", where, re.msg);
            break;
        }
        size_t bad = 0, first = 0;
        for (size_t j = p->numel; j-- > 0;)
            if (!isfinite(host[j])) bad++, first = j;
        if (bad)
            rc = err_set(e, "%s: tensor %s holds %zu non-finite value(s) (NaN or Inf; the first at element %zu of %zu): "
                         "the stored weights are damaged and nothing trains from them; use another checkpoint or export "
                         "(or check how this one was written)", where, nm, bad, first, p->numel);
        else stager_put(&sg, p, host);
    }
    stager_close(&sg);
    return rc;
}

static int get_i64(const char* text, const char* key, int64_t* out, int64_t def) {
    char v[64];
    Err e = {{0}};
    *out = def;
    if (trainer_state_get(text, key, v, sizeof v, &e) != 1) return 0;
    char* end;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end) return -1;
    *out = x;
    return 0;
}

// trainer_state.yaml's optimizer_state: 1 true, 0 false, -1 not a boolean; absent = 1 (every
// checkpoint written before checkpoint.save_optimizer existed holds the moments).
static int get_optimizer_state(const char* text) {
    char v[64];
    Err e = {{0}};
    if (trainer_state_get(text, "optimizer_state", v, sizeof v, &e) != 1) return 1;
    return !strcmp(v, "true") ? 1 : !strcmp(v, "false") ? 0 : -1;
}

// The same data file, however it was named (relative, absolute, through links).
static int same_data(const char* a, const char* b) {
    if (!strcmp(a, b)) return 1;
    char ra[PATH_MAX], rb[PATH_MAX];
    return realpath(a, ra) && realpath(b, rb) && !strcmp(ra, rb);
}

// What a checkpoint's trainer_state.yaml says, checked against its manifest, this run's model and
// the tensors it holds.
typedef struct {
    TrainerState ts;
    Config* cc;  // the saved run's config block (owned)
    int64_t updates, skipped, bad, gb, sl;
    int64_t best_step, since_best;  // checkpoint.keep_best / train.early_stop (0 = no validation yet)
    double best_val;
    int has_opt;  // the Adam moments are there
} SavedState;

static int read_saved_state(const Trainer* t, Ckpt* ck, SavedState* s, Err* e) {
    const Model* m = &t->model;
    const char* dir = ckpt_dir(ck);
    const char* text = ckpt_trainer_state(ck);
    char where[CFG_STR + 64];
    snprintf(where, sizeof where, "%s/trainer_state.yaml", dir);
    size_t cn = strlen(text) + 1;
    char* cfg_text = xmalloc(cn);
    memset(s, 0, sizeof *s);
    s->cc = xcalloc(1, sizeof *s->cc);
    config_defaults(s->cc);
    int rc = 0;
    Err le = {{0}};
    if (trainer_state_parse(text, &s->ts, cfg_text, cn, &le)) rc = err_set(e, "%s: %s", dir, le.msg);
    else if (!cfg_text[0]) rc = err_set(e, "%s has no config: block; cannot check the model it holds", where);
    else if (config_load_string(s->cc, cfg_text, strlen(cfg_text), where, &le)) rc = err_set(e, "%s", le.msg);
    else if (check_model(&s->cc->model, &t->cfg.model, where, e)) rc = -1;
    free(cfg_text);
    const int64_t step = s->ts.step;
    s->best_val = INFINITY;
    if (!rc && (get_i64(text, "updates", &s->updates, step) || get_i64(text, "skipped", &s->skipped, s->ts.bad_steps) ||
                get_i64(text, "bad_in_row", &s->bad, 0) || get_i64(text, "global_batch", &s->gb, 0) ||
                get_i64(text, "seq_len", &s->sl, 0) || get_i64(text, "best_step", &s->best_step, 0) ||
                get_i64(text, "evals_since_best", &s->since_best, 0)))
        rc = err_set(e, "%s: updates / skipped / bad_in_row / global_batch / seq_len / best_step / evals_since_best must be integers", where);
    if (!rc && s->best_step > 0) {
        char v[64];
        Err ge = {{0}};
        char* end = v;
        if (trainer_state_get(text, "best_val_loss", v, sizeof v, &ge) == 1) s->best_val = strtod(v, &end);
        if (end == v || *end || !isfinite(s->best_val) || s->best_step > step || s->best_step > (int64_t)1 << 30 ||
            s->since_best < 0)
            rc = err_set(e, "%s: best_step %lld needs a finite best_val_loss, a step not after the checkpoint's and "
                            "evals_since_best >= 0", where, (long long)s->best_step);
    }
    if (!rc && step != ckpt_step(ck))
        rc = err_set(e, "%s: step %lld, but the manifest says %lld", where, (long long)step, (long long)ckpt_step(ck));
    if (!rc && step > (int64_t)1 << 30) rc = err_set(e, "%s: step %lld is out of range", where, (long long)step);
    // Whether the moments are there: the recorded flag, checked against the tensors themselves
    // (every rank indexes every rank file, so every rank sees the same names and decides alike).
    s->has_opt = rc ? 1 : get_optimizer_state(text);
    if (!rc && s->has_opt < 0) rc = err_set(e, "%s: optimizer_state must be true or false", where);
    if (!rc && m->pl.n > 0) {
        char nm[128];
        ckpt_state_name(nm, sizeof nm, 1, m->pl.p[0].name);
        const int present = ckpt_has(ck, nm) != 0;
        if (present != s->has_opt)
            rc = err_set(e, "%s: optimizer_state: %s, but the checkpoint %s %s (an inconsistent checkpoint)", where,
                         s->has_opt ? "true" : "false", present ? "holds" : "lacks", nm);
    }
    return rc;
}

// The weights (masters and compute copies) and, with has_opt, the Adam moments; gradients zeroed.
// Inference: the weights alone (the moments are not read).
static int load_tensors(Trainer* t, Ckpt* ck, int has_opt, Err* e) {
    Model* m = &t->model;
    char ckwhere[CFG_STR + 32];
    snprintf(ckwhere, sizeof ckwhere, "checkpoint %s", ckpt_dir(ck));
    float* host = xmalloc(sizeof(float) * max_numel(m));
    int rc = stage(t, rd_ckpt, ck, 0, ckwhere, host, e);
    if (!rc && !t->infer) {
        optim_load_from_staging(&t->opt, m);  // masters, compute weights; zeroes m, v, grads
        for (int which = 1; which < 3 && !rc && has_opt; which++) {
            rc = stage(t, rd_ckpt, ck, which, ckwhere, host, e);
            for (int a = 0; a < 2 && !rc; a++) optim_scatter(&t->opt, m, a, which);
        }
        trainer_zero_grads(m);
    }
    free(host);
    return rc;
}

// The trainer continues from the saved counters (and the saved run's id).
static void continue_saved(Trainer* t, Ckpt* ck, const SavedState* s) {
    t->step = (int)s->ts.step;
    t->tokens = s->ts.tokens;
    // Adam's step count is the number of updates since the moments were zero: its bias
    // correction divides m by 1 - β1^t and v by 1 - β2^t because m and v started from zero t
    // updates ago (E[m_t] = (1 - β1^t) E[g]). Moments restarted from zero therefore need t to
    // restart too: the first update is then m̂ / sqrt(v̂) = g / |g|, a fresh Adam's first step.
    // Continuing the saved count (1 - β^t ≈ 1 for large t) would leave m̂ and v̂ scaled by
    // (1 - β1^j) and (1 - β2^j) for j updates after the restart: the first update would be
    // (1 - β1) / sqrt(1 - β2) times the normal size (0.45× at β2 = 0.95, 3.2× at 0.999) and
    // the moments biased for ~1 / (1 - β2) steps. So a weight-only checkpoint resumes with
    // updates = 0 (trainer_state.yaml's `updates` is the Adam step count, and the next save
    // records the count since the restart). The lr schedule, data position and step go on.
    t->updates = s->has_opt ? s->updates : 0;
    t->skipped = s->skipped;
    t->bad_in_row = (int)s->bad;
    t->last_loss = s->ts.loss_ema;
    t->best_step = (int)s->best_step;
    t->best_val = s->best_step > 0 ? s->best_val : INFINITY;
    t->evals_since_best = (int)s->since_best;
    snprintf(t->resumed_from, sizeof t->resumed_from, "%s", ckpt_dir(ck));
    char rid[64] = "";
    Err re = {{0}};
    if (trainer_state_get(ckpt_trainer_state(ck), "run_id", rid, sizeof rid, &re) == 1 && rid[0] &&
        strlen(rid) < sizeof t->run_id)
        snprintf(t->run_id, sizeof t->run_id, "%s", rid);  // the run continues
}

// What was resumed, and where this run differs from the saved one.
static void log_resumed(const Trainer* t, const char* dir, const SavedState* s, double secs) {
    const TrainerState* ts = &s->ts;
    const Config* cc = s->cc;
    log_info("checkpoint: resumed from %s: step %lld, %lld tokens, saved at world %d (ep %d), loading at world %d (ep %d) "
             "(%.2f s)\n", dir, (long long)ts->step, (long long)ts->tokens, ts->world, ts->ep, t->world, t->model.ep, secs);
    if (!s->has_opt && !t->infer)
        log_info("checkpoint: %s has no optimizer state (saved with checkpoint.save_optimizer=false): Adam moments "
                 "restart from zero; the run is not an exact continuation (Adam's bias correction restarts with them: "
                 "step count 1, not the saved %lld updates)\n", dir, (long long)s->updates);
    if ((s->gb && s->gb != t->cfg.train.global_batch) || (s->sl && s->sl != t->cfg.train.seq_len))
        log_info("checkpoint: note: saved with train.global_batch=%lld, seq_len=%lld; this run uses %d, %d: the data "
                 "position continues as step x global_batch, so the order differs from an uninterrupted run\n",
                 (long long)s->gb, (long long)s->sl, t->cfg.train.global_batch, t->cfg.train.seq_len);
    if (!same_data(cc->data.path, t->cfg.data.path) || cc->data.format != t->cfg.data.format)
        log_info("checkpoint: warning: saved with data.path=\"%s\" (data.format=%s); this run reads \"%s\" (%s): "
                 "training continues at the saved position (step x global_batch) of this run's data, which is "
                 "not a continuation of the saved run's data stream%s\n",
                 cc->data.path, data_format_name(cc->data.format), t->cfg.data.path, data_format_name(t->cfg.data.format),
                 cc->data.path[0] && t->cfg.data.path[0] ? "" : " (an empty path is the shipped data/hairpin.fa.gz)");
    if (cc->precision.fp8 != t->cfg.precision.fp8)
        log_info("checkpoint: note: saved with precision.fp8=%s; this run uses %s (the fp32 masters and Adam state "
                 "carry over as they are; the GEMMs' rounding changes from here on)\n",
                 fp8_mode_name(cc->precision.fp8), fp8_mode_name(t->cfg.precision.fp8));
    if (ts->seed != t->cfg.train.seed)
        log_info("checkpoint: note: saved with train.seed=%llu; this run uses %llu (the data order changes)\n",
                 (unsigned long long)ts->seed, (unsigned long long)t->cfg.train.seed);
}

// verified: resume=auto has just verified path's checksums (find_auto)
static int load_ckpt(Trainer* t, const char* path, int verified, Err* e) {
    Ckpt* ck = NULL;
    double t0 = now_sec();
    if (ckpt_open_comm_ex(t->comm, &ck, path, verified, e)) return -1;
    SavedState s;
    int rc = read_saved_state(t, ck, &s, e);
    if (!rc) rc = load_tensors(t, ck, s.has_opt, e);
    if (!rc) {
        continue_saved(t, ck, &s);
        log_resumed(t, ckpt_dir(ck), &s, now_sec() - t0);
    }
    free(s.cc);
    ckpt_close(ck);
    return rc;
}

static int load_hf(Trainer* t, const char* dir, Err* e) {
    ModelConfig hc;
    Config* d = xcalloc(1, sizeof *d);
    config_defaults(d);
    hc = d->model;
    free(d);
    Err le = {{0}};
    char where[CFG_STR + 64];
    snprintf(where, sizeof where, "checkpoint.init_from %s", dir);
    // config.json, when present, is checked against the config for a clear message first
    char cj[CFG_STR + 32];
    snprintf(cj, sizeof cj, "%s/config.json", dir);
    FILE* f = fopen(cj, "r");
    if (f) {
        fclose(f);
        if (hf_read_config(dir, &hc, &le)) return err_set(e, "%s: %s", where, le.msg);
        char w2[CFG_STR + 64];
        snprintf(w2, sizeof w2, "checkpoint.init_from %s/config.json", dir);
        if (check_model(&hc, &t->cfg.model, w2, e)) return -1;
    }
    HfDir* h = NULL;
    if (hf_open(&h, dir, &le)) return err_set(e, "%s: %s", where, le.msg);
    float* host = xmalloc(sizeof(float) * max_numel(&t->model));
    int rc = stage(t, rd_hf, h, 0, where, host, e);
    free(host);
    hf_close(h);
    if (rc) return -1;
    if (!t->infer) optim_load_from_staging(&t->opt, &t->model);
    log_info("checkpoint: initialized from the Hugging Face directory %s (%d tensors on this rank)%s\n", dir,
             t->model.pl.n, t->infer ? "" : "; optimizer state fresh");
    return 0;
}

// resume=auto: rank 0 looks for the checkpoint (ckpt_find_resume) and has each candidate
// verified by every rank, each its share of the files (ckpt_verify_comm): it broadcasts the
// candidate, the others verify with it; an empty candidate ends the search. The verdict is
// broadcast.
typedef struct VerifyReq {
    char dir[CFG_STR + 64];  // "" = the search is over
} VerifyReq;

static int verify_candidate(void* ctx, const char* step_dir, char* why, size_t n) {
    Comm* comm = ctx;
    VerifyReq q;
    memset(&q, 0, sizeof q);
    snprintf(q.dir, sizeof q.dir, "%s", step_dir);
    comm->host_broadcast(comm, GROUP_WORLD, &q, sizeof q, 0);
    Err e = {{0}};
    if (ckpt_verify_comm(comm, q.dir, &e) == 0) return 1;
    snprintf(why, n, "%s", e.msg);
    return 0;
}

static int find_auto(Trainer* t, char* step_dir, size_t n, Err* e) {
    struct {
        int32_t rc;
        char dir[CFG_STR + 64];
        char note[2048];
        char msg[sizeof e->msg];
    } r;
    memset(&r, 0, sizeof r);
    VerifyReq q;
    memset(&q, 0, sizeof q);
    if (t->rank == 0) {
        Err le = {{0}};
        r.rc = ckpt_find_resume_cb(t->cfg.checkpoint.dir, r.dir, sizeof r.dir, r.note, sizeof r.note, verify_candidate,
                                   t->comm, &le);
        snprintf(r.msg, sizeof r.msg, "%s", le.msg);
        t->comm->host_broadcast(t->comm, GROUP_WORLD, &q, sizeof q, 0);  // the search is over
    } else {
        for (;;) {
            t->comm->host_broadcast(t->comm, GROUP_WORLD, &q, sizeof q, 0);
            if (!q.dir[0]) break;
            Err le = {{0}};
            ckpt_verify_comm(t->comm, q.dir, &le);
        }
    }
    t->comm->host_broadcast(t->comm, GROUP_WORLD, &r, sizeof r, 0);
    if (r.rc < 0) return err_set(e, "checkpoint.resume=auto: %s", r.msg);
    if (r.note[0]) log_info("checkpoint: resume=auto: %s\n", r.note);
    if (r.rc == 0) {
        log_info("checkpoint: resume=auto: no checkpoint under %s yet; starting from step 0\n", t->cfg.checkpoint.dir);
        return 0;
    }
    snprintf(step_dir, n, "%s", r.dir);
    return 1;
}

int trainer_restore(Trainer* t, Err* e) {
    const CheckpointConfig* c = &t->cfg.checkpoint;
    char path[CFG_STR + 64] = "";
    int rc = 0, verified = 0;
    if (!strcmp(c->resume, "auto")) {
        int f = find_auto(t, path, sizeof path, e);
        if (f < 0) rc = -1;
        verified = f > 0;
    } else if (strcmp(c->resume, "none") != 0) {
        snprintf(path, sizeof path, "%s", c->resume);
    }
    if (!rc) {
        if (path[0]) rc = load_ckpt(t, path, verified, e);
        else if (c->init_from[0]) rc = load_hf(t, c->init_from, e);
        else init_random(t);
    }
    // Expert tensors differ per rank, so one rank may fail where another did not: agree.
    int32_t bad = rc != 0;
    t->comm->host_all_reduce_max_i32(t->comm, GROUP_WORLD, &bad, 1);
    if (bad && !rc) {
        rc = -1;
        err_set(e, "loading the checkpoint failed on another rank (see its message)");
    }
    if (bad) {  // rank 0 should carry the first failing rank's message
        int32_t me = rc ? t->rank : t->world, first = me;
        int32_t neg = -me;
        t->comm->host_all_reduce_max_i32(t->comm, GROUP_WORLD, &neg, 1);
        first = -neg;
        char msg[sizeof e->msg];
        memcpy(msg, e->msg, sizeof msg);
        t->comm->host_broadcast(t->comm, GROUP_WORLD, msg, sizeof msg, first);
        if (first != t->rank && first != 0) snprintf(e->msg, sizeof e->msg, "rank %d: %s", first, msg);
        else memcpy(e->msg, msg, sizeof msg);
        return -1;
    }
    return 0;
}
