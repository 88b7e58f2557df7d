// train_ckpt.c — where the trainer's state goes (see train.h); train_restore.c is where it comes from.
//
//   trainer_save     every rank writes the tensors it owns (fp32 master, Adam m and v; the
//                    masters alone with checkpoint.save_optimizer=false) under their global
//                    Hugging Face names, streamed through ckpt_save_begin / _append / _finish
//                    (host memory: one tensor); rank 0 adds trainer_state.yaml (counters, data
//                    position, layout, optimizer_state: true | false, the resolved config);
//                    with checkpoint.async a snapshot is written by a background thread.
//
// Ownership: a tensor of arena a is written by the rank of a's ZeRO group (world for dense,
// edp for experts) whose equal slice of the padded arena holds the tensor's first element
// (the same rule with ZeRO-1 off), so every name is written exactly once and the writing is
// spread over the ranks. The values come from optim_gather, which stages the full fp32 arena
// in the model's gradient buffer (zero between steps; zeroed again afterwards).
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

static const char* const OPT_PREFIX[3] = {"", "optim.exp_avg.", "optim.exp_avg_sq."};

void ckpt_state_name(char* out, size_t n, int which, const char* name) {
    snprintf(out, n, "%s%s", OPT_PREFIX[which], name);
}

void trainer_zero_grads(Model* m) {
    for (int a = 0; a < 2; a++) m->be->zero(m->be, m->grad[a], sizeof(float) * m->padded[a]);
}

// ---- save -------------------------------------------------------------------------------------

int trainer_owns(const Trainer* t, const ParamInfo* p) {
    const OptShard* s = &t->opt.sh[p->arena];
    const size_t part = t->model.padded[p->arena] / (size_t)s->gsize;
    return (int)(p->offset / part) == s->grank;
}

static char* state_text(const Trainer* t) {
    const Config* c = &t->cfg;
    const uint64_t pos = (uint64_t)t->step * (uint64_t)c->train.global_batch;
    const uint64_t nwin = data_num_windows(t->data, 0);
    char best[256] = "";
    if (t->best_step > 0)
        snprintf(best, sizeof best,
                 "# the lowest validation loss so far, its step, and validations since (checkpoint.keep_best, train.early_stop)\n"
                 "best_val_loss: %.17g\nbest_step: %d\nevals_since_best: %d\n",
                 t->best_val, t->best_step, t->evals_since_best);
    char extra[2048];
    snprintf(extra, sizeof extra,
             "# the train split's sequence i of step s, micro-batch j, rank r is s*global_batch + j*micro_batch*world + r*micro_batch\n"
             "updates: %lld\nskipped: %lld\nbad_in_row: %d\nedp: %d\nzero1: %s\nglobal_batch: %d\nmicro_batch: %d\n"
             "seq_len: %d\ndata_position: %llu\ndata_epoch: %llu\nsteps_total: %d\nschedule: %s\nlr_next: %.9g\n"
             "# false: fp32 masters only (checkpoint.save_optimizer=false); resume restarts Adam from zero moments\n"
             "optimizer_state: %s\n"
             "# the run these checkpoints belong to (checkpoint.dir/owner; metrics.jsonl's run_id)\n"
             "run_id: %s\n%s",
             (long long)t->updates, (long long)t->skipped, t->bad_in_row, t->model.edp, c->parallel.zero1 ? "true" : "false",
             c->train.global_batch, c->train.micro_batch, c->train.seq_len, (unsigned long long)pos,
             (unsigned long long)(nwin ? pos / nwin : 0), c->train.steps, schedule_name(c->optim.schedule),
             (double)optim_lr(&c->optim, c->train.steps, t->step), c->checkpoint.save_optimizer ? "true" : "false", t->run_id,
             best);
    char* cfg = config_print_text(c, NULL);
    TrainerState ts = {.step = t->step, .tokens = t->tokens, .world = t->world, .ep = t->model.ep,
                       .seed = c->train.seed, .rng = 0,  // no random stream advances after init
                       .bad_steps = t->skipped, .loss_ema = t->last_loss, .config_yaml = cfg, .extra_yaml = extra};
    int n = trainer_state_format(NULL, 0, &ts);
    char* text = xmalloc((size_t)n + 1);
    trainer_state_format(text, (size_t)n + 1, &ts);
    free(cfg);
    return text;
}

// What this rank writes: the tensors it owns, in the order (which, arena, parameter).
typedef struct SaveList {
    CkptTensor* ct;
    char (*names)[128];
    int k, nwhich;
    size_t largest;   // numel of the largest owned tensor
    size_t total;     // numel of every entry
} SaveList;

static void save_list(Trainer* t, SaveList* L) {
    Model* m = &t->model;
    memset(L, 0, sizeof *L);
    L->nwhich = t->cfg.checkpoint.save_optimizer ? 3 : 1;
    L->largest = 1;
    int n_own = 0;
    for (int i = 0; i < m->pl.n; i++)
        if (trainer_owns(t, &m->pl.p[i])) {
            n_own++;
            if (m->pl.p[i].numel > L->largest) L->largest = m->pl.p[i].numel;
        }
    L->ct = xcalloc((size_t)(L->nwhich * n_own) + 1, sizeof *L->ct);
    L->names = xcalloc((size_t)(L->nwhich * n_own) + 1, sizeof *L->names);
    for (int which = 0; which < L->nwhich; which++)
        for (int a = 0; a < 2; a++)
            for (int i = 0; i < m->pl.n; i++) {
                const ParamInfo* p = &m->pl.p[i];
                if ((int)p->arena != a || !trainer_owns(t, p)) continue;
                ckpt_state_name(L->names[L->k], sizeof L->names[L->k], which, p->name);
                L->ct[L->k] = (CkptTensor){.name = L->names[L->k], .ndim = p->ndim, .data = NULL};
                for (int d = 0; d < p->ndim; d++) L->ct[L->k].shape[d] = p->shape[d];
                L->total += p->numel;
                L->k++;
            }
}

static void save_list_free(SaveList* L) {
    free(L->names);
    free(L->ct);
    memset(L, 0, sizeof *L);
}

// Each owned tensor's values, in save-list order, handed to put(ctx, values, numel): every
// (which, arena) is gathered once on every rank (collective, whether or not the rank owns tensors
// of it) into the gradient arena, then each owned tensor goes device → host[largest] (sync) or
// straight into its place in the snapshot (async: host == NULL, put copies nothing).
typedef int (*PutFn)(void* ctx, const float* values, size_t numel);

static void gather_owned(Trainer* t, const SaveList* L, float* host, float* snap, PutFn put, void* ctx) {
    Model* m = &t->model;
    Backend* be = m->be;
    int ok = 1;
    size_t at = 0;
    for (int which = 0; which < L->nwhich; which++)
        for (int a = 0; a < 2; a++) {
            optim_gather(&t->opt, m, a, which);  // collective over the arena's group: every rank, always
            for (int i = 0; i < m->pl.n; i++) {
                const ParamInfo* p = &m->pl.p[i];
                if ((int)p->arena != a || !trainer_owns(t, p)) continue;
                if (snap) {
                    be->to_host(be, snap + at, m->grad[a] + p->offset, sizeof(float) * p->numel);
                    at += p->numel;
                } else if (ok) {
                    be->to_host(be, host, m->grad[a] + p->offset, sizeof(float) * p->numel);
                    ok = put(ctx, host, p->numel) == 0;  // a failure is reported by ckpt_save_finish
                }
            }
        }
    trainer_zero_grads(m);  // the staging held masters / moments (the trainer overwrites; other callers add)
}

static int put_append(void* ctx, const float* values, size_t numel) {
    (void)numel;
    return ckpt_save_append(ctx, values);
}

// Synchronous: streamed through one tensor of host memory (ckpt_save_begin / _append / _finish).
// Host memory: the largest owned tensor, plus the names. checkpoint.save_optimizer=false: the
// masters only (a third of the bytes); every rank has the same config, so every rank makes the
// same optim_gather calls.
// root, keep: the checkpoint root and how many it keeps; what: "" or a word for the log line.
static int save_sync(Trainer* t, const char* root, int keep, const char* what, Err* e) {
    SaveList L;
    save_list(t, &L);
    char* state = t->rank == 0 ? state_text(t) : NULL;
    double t0 = now_sec();
    CkptSave* cs = NULL;
    int rc = ckpt_save_begin(&cs, t->comm, root, t->step, L.ct, L.k, state, keep, e);
    free(state);
    if (!rc) {
        float* host = xmalloc(sizeof(float) * L.largest);
        gather_owned(t, &L, host, NULL, put_append, cs);
        free(host);
        rc = ckpt_save_finish(cs, e);
    }
    if (!rc) {
        const double dt = now_sec() - t0;
        log_info("checkpoint: saved %s%s/step_%08d (%d tensors on rank 0%s, %.2f s)\n", what, root, t->step, L.k,
                 L.nwhich == 3 ? "" : ", weights only: checkpoint.save_optimizer=false", dt);
        const int grace = t->cfg.checkpoint.grace_s;
        if (grace > 0 && dt > grace && !t->grace_warned) {
            t->grace_warned = 1;
            log_info("checkpoint: warning: this save took %.0f s, more than checkpoint.grace_s=%d: a preemption signal "
                     "may not leave time to save (give the job a longer signal lead, e.g. --signal=B:USR1@%d, or faster "
                     "storage)\n", dt, grace, (int)(dt * 1.5) + 60);
        }
        if (dt > 0) t->write_rate = t->ckpt_rank_bytes / dt;
    }
    save_list_free(&L);
    return rc;
}

// ---- checkpoint.async -------------------------------------------------------------------------
// The save is cut in three: on the training thread, the snapshot (every owned tensor gathered
// and copied to host memory that is kept for the run: page-locked on GPUs) and ckpt_save_begin
// (collective: the temporary directory and every rank's file header); on a background thread,
// the values appended from the snapshot and the file fsynced (ckpt_save_end_local: file I/O
// only, no MPI); on the training thread again, once every rank's writer is done (one small
// all-reduce per step while a save is in flight: trainer_save_poll), ckpt_save_finish
// (collective: sizes and checksums agreed, manifest, rename, `latest`). So `latest` moves only
// after a complete save, as with sync saves, and a crash while the thread writes leaves the
// previous checkpoint in place. One save in flight: the next one waits for it.
struct AsyncSave {
    pthread_t th;
    int running;    // a save is in flight (begun, not finished)
    int done;       // the writer is done (atomic; written by the thread)
    CkptSave* cs;
    SaveList L;
    float* snap;    // [cap] host snapshot, kept between saves
    size_t cap;
    int step;
    double t0, stall;
};

static void* writer_main(void* arg) {
    struct AsyncSave* as = arg;
    size_t at = 0;
    for (int i = 0; i < as->L.k; i++) {
        size_t numel = 1;
        for (int d = 0; d < as->L.ct[i].ndim; d++) numel *= (size_t)as->L.ct[i].shape[d];
        if (ckpt_save_append(as->cs, as->snap + at)) break;  // ckpt_save_finish reports it
        at += numel;
    }
    ckpt_save_end_local(as->cs);
    __atomic_store_n(&as->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

// Collective: joins the writer (waiting for it) and commits. Called by every rank at the same point.
static int async_finish(Trainer* t, Err* e) {
    struct AsyncSave* as = t->async;
    pthread_join(as->th, NULL);
    int rc = ckpt_save_finish(as->cs, e);
    as->cs = NULL;
    as->running = 0;
    if (!rc)
        log_info("checkpoint: saved %s/step_%08d in the background (%d tensors on rank 0, %.2f s; training stalled %.2f s "
                 "for the snapshot)\n", t->cfg.checkpoint.dir, as->step, as->L.k, now_sec() - as->t0, as->stall);
    save_list_free(&as->L);
    return rc;
}

int trainer_save_poll(Trainer* t, Err* e) {
    struct AsyncSave* as = t->async;
    if (!as || !as->running) return 0;
    int32_t busy = !__atomic_load_n(&as->done, __ATOMIC_ACQUIRE);
    t->comm->host_all_reduce_max_i32(t->comm, GROUP_WORLD, &busy, 1);
    return busy ? 0 : async_finish(t, e);
}

int trainer_save_in_flight(const Trainer* t) { return t->async && t->async->running; }

int trainer_save_wait(Trainer* t, Err* e) {
    struct AsyncSave* as = t->async;
    if (!as || !as->running) return 0;
    return async_finish(t, e);
}

void trainer_save_release(Trainer* t) {
    struct AsyncSave* as = t->async;
    if (!as) return;
    if (as->running) {  // the run ends on an error: the save in flight is dropped, latest stays
        pthread_join(as->th, NULL);
        ckpt_save_abort(as->cs);
        save_list_free(&as->L);
    }
    be_host_free(t->be, as->snap);
    free(as);
    t->async = NULL;
}

static int save_async(Trainer* t, Err* e) {
    if (!t->async) t->async = xcalloc(1, sizeof *t->async);
    struct AsyncSave* as = t->async;
    if (as->running) {
        double w0 = now_sec();
        log_info("checkpoint: step %d: waiting for the save of step %d to finish (checkpoint.async keeps one save in "
                 "flight)\n", t->step, as->step);
        if (async_finish(t, e)) return -1;
        log_info("checkpoint: waited %.2f s\n", now_sec() - w0);
    }
    double t0 = now_sec();
    save_list(t, &as->L);
    if (as->L.total > as->cap) {
        be_host_free(t->be, as->snap);
        as->cap = as->L.total;
        as->snap = be_host_alloc(t->be, sizeof(float) * as->cap);
        log_info("checkpoint: checkpoint.async holds %.2f GiB of %shost memory per rank for the snapshot\n",
                 (double)sizeof(float) * (double)as->cap / (1 << 30), t->be->host_alloc ? "page-locked " : "");
    }
    gather_owned(t, &as->L, NULL, as->snap, NULL, NULL);
    char* state = t->rank == 0 ? state_text(t) : NULL;
    int rc = ckpt_save_begin(&as->cs, t->comm, t->cfg.checkpoint.dir, t->step, as->L.ct, as->L.k, state,
                             t->cfg.checkpoint.keep, e);
    free(state);
    if (rc) {
        save_list_free(&as->L);
        return -1;
    }
    as->step = t->step;
    as->t0 = t0;
    as->done = 0;
    as->running = 1;
    CHECK(pthread_create(&as->th, NULL, writer_main, as) == 0, "cannot start the checkpoint writer thread");
    as->stall = now_sec() - t0;
    return 0;
}

int trainer_save(Trainer* t, Err* e) {
    CHECK(!t->infer, "trainer_save on the inference set-up (trainer_init_infer: no optimizer state)");
    const CheckpointConfig* c = &t->cfg.checkpoint;
    if (trainer_lock_check(t, e)) return -1;  // still this run's directory
    return c->async ? save_async(t, e) : save_sync(t, c->dir, c->keep, "", e);
}

// Always synchronous: a save in flight (checkpoint.async) is committed first, so the two never
// write at the same time.
int trainer_save_best(Trainer* t, Err* e) {
    if (trainer_save_wait(t, e) || trainer_lock_check(t, e)) return -1;
    char root[CFG_STR + 16];
    snprintf(root, sizeof root, "%s/best", t->cfg.checkpoint.dir);
    char what[96];
    snprintf(what, sizeof what, "the best (validation loss %.6f) ", t->best_val);
    return save_sync(t, root, 1, what, e);
}

int trainer_after_eval(Trainer* t, int step, double val_loss, int* early, Err* e) {
    *early = 0;
    if (isfinite(val_loss) && (t->best_step == 0 || val_loss < t->best_val)) {
        t->best_val = val_loss;
        t->best_step = step;
        t->evals_since_best = 0;
        // t->step is the step being run (0-based); the save names the steps done
        if (t->cfg.checkpoint.keep_best && t->cfg.checkpoint.dir[0]) {
            t->step++;
            int rc = trainer_save_best(t, e);
            t->step--;
            return rc;
        }
        return 0;
    }
    t->evals_since_best++;
    *early = t->cfg.train.early_stop > 0 && t->evals_since_best >= t->cfg.train.early_stop;
    return 0;
}

