// train.c — a trainer's steps (see train.h): batches, validation, the step record and the
// training loop (trainer_run). Start-up and teardown: train_init.c.
#define _POSIX_C_SOURCE 200809L
#include "train.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "failpoint.h"
#include "logfile.h"
#include "stop.h"
#include "watchdog.h"
#include "util.h"

int64_t trainer_fill_batch(Trainer* t, int split, uint64_t first) {
    const int T = t->cfg.train.seq_len, sep = t->doc_sep;
    const DataConfig* dc = &t->cfg.data;
    int64_t scored = (int64_t)t->model.B * T;
    for (int b = 0; b < t->model.B; b++) {
        data_get(t->data, split, first + (uint64_t)b, t->h_win);
        int32_t *tok = t->h_tok + (size_t)b * T, *tgt = t->h_tgt + (size_t)b * T;
        memcpy(tok, t->h_win, sizeof(int32_t) * (size_t)T);
        memcpy(tgt, t->h_win + 1, sizeof(int32_t) * (size_t)T);
        if (sep < 0) continue;
        int32_t *doc = t->h_doc + (size_t)b * T, *pos = t->h_pos + (size_t)b * T;
        data_doc_starts(t->h_win, T, sep, doc);
        for (int i = 0; i < T; i++) {
            pos[i] = i - doc[i];
            if (dc->mask_boundary_loss && tok[i] == sep) tgt[i] = -1, scored--;
        }
    }
    return scored;
}

// The micro-batch's document arrays (NULL when data.documents is off).
static void micro_docs(const Trainer* t, MicroArgs* a) {
    a->doc = t->doc_sep >= 0 ? t->h_doc : NULL;
    a->pos = t->doc_sep >= 0 && t->cfg.data.reset_positions ? t->h_pos : NULL;
}

EvalResult trainer_eval(Trainer* t, int batches) {
    EvalResult r = {0};
    const int B = t->model.B;
    uint64_t nwin = data_num_windows(t->data, 1);
    uint64_t per_round = (uint64_t)B * (uint64_t)t->world;
    int n = batches > 0 ? batches : (int)((nwin + per_round - 1) / per_round);
    if ((uint64_t)n * per_round > nwin && nwin >= per_round) n = (int)(nwin / per_round);
    if (n < 1) n = 1;
    double sums[2] = {0, 0};  // CE sum, tokens
    MicroArgs a = {.tokens = t->h_tok, .targets = t->h_tgt, .backward = 0};
    micro_docs(t, &a);
    for (int j = 0; j < n; j++) {
        trainer_fill_batch(t, 1, (uint64_t)j * per_round + (uint64_t)t->rank * B);
        StepLoss l = model_step(&t->model, &a);
        sums[0] += l.ce_sum;
        sums[1] += (double)l.ntok;
    }
    t->comm->host_all_reduce_f64(t->comm, GROUP_WORLD, sums, 2);
    r.tokens = (int64_t)sums[1];
    r.loss = sums[1] > 0 ? sums[0] / sums[1] : NAN;
    r.bits_per_token = r.loss / log(2.0);
    return r;
}

// The step's record for metrics.c (rank 0): metrics.jsonl always, the console line when `print`.
static void log_step(Trainer* t, int step, double loss, double ce, double aux, const StepStats* st, double step_s,
                     const EvalResult* ev, int print) {
    if (t->rank != 0) return;
    const int E = t->cfg.model.experts;
    double load[64], mx = 0, mean = 0;
    model_expert_load(&t->model, load);
    for (int i = 0; i < E; i++) {
        mean += load[i] / E;
        if (load[i] > mx) mx = load[i];
    }
    MetricsStep ms = {.step = step + 1, .loss = loss, .ce = ce, .aux = aux, .lr = st->lr, .grad_norm = st->grad_norm,
                      .skipped = st->skipped, .step_s = step_s, .tokens = t->tokens,
                      .load_max_over_mean = mean > 0 ? mx / mean : 0, .has_val = ev != NULL,
                      .val_loss = ev ? ev->loss : NAN, .val_bits = ev ? ev->bits_per_token : NAN};
    char line[2048];
    const size_t n = metrics_step(&t->met, &ms, print, line, sizeof line);
    if (t->metrics.fd >= 0 && !t->log_failed && logfile_write(&t->metrics, line, n, &t->log_err)) t->log_failed = 1;
}

// Step s's forward and backward over this rank's micro-batches: *ce the mean CE over the world's
// scored targets (count_scored: counted first, else every one of the gtok), *aux and *z this
// rank's router losses (means over its micro-batches).
static void forward_backward(Trainer* t, MicroArgs* a, int s, int count_scored, double gtok, double* ce, double* aux,
                             double* z) {
    const TrainConfig* tc = &t->cfg.train;
    const int B = t->model.B;
    double scored = gtok;
    *ce = *aux = *z = 0;
    watchdog_stage(s + 1, "forward/backward (expert all-to-all)");
    if (count_scored) {
        scored = 0;
        for (int j = 0; j < t->n_micro; j++)
            scored += (double)trainer_fill_batch(t, 0, (uint64_t)s * tc->global_batch + (uint64_t)j * B * t->world +
                                                           (uint64_t)t->rank * B);
        t->comm->host_all_reduce_f64(t->comm, GROUP_WORLD, &scored, 1);
        if (scored < 1) scored = 1;
        a->ce_scale = (float)(1.0 / scored);
    }
    for (int j = 0; j < t->n_micro; j++) {
        uint64_t first = (uint64_t)s * tc->global_batch + (uint64_t)j * B * t->world + (uint64_t)t->rank * B;
        trainer_fill_batch(t, 0, first);
        a->fresh = j == 0;
        StepLoss l = model_step(&t->model, a);
        *ce += l.ce_sum;
        *aux += l.aux / t->n_micro;
        *z += l.z / t->n_micro;
    }
    watchdog_stage(s + 1, "loss all-reduce");
    t->comm->host_all_reduce_f64(t->comm, GROUP_WORLD, ce, 1);
    *ce /= scored;
}

// The optimizer's update for step s, or none for a non-finite loss (the gradients discarded).
static StepStats update(Trainer* t, int s, double loss) {
    watchdog_stage(s + 1, "optimizer (gradient reduction, ZeRO-1 gather)");
    if (!isfinite(loss)) {  // skip the update; the gradients are discarded
        for (int ar = 0; ar < 2; ar++) t->be->zero(t->be, t->model.grad[ar], sizeof(float) * t->model.padded[ar]);
        return (StepStats){.grad_norm = NAN, .lr = optim_lr(&t->cfg.optim, t->cfg.train.steps, s), .skipped = 1};
    }
    return optim_step(&t->opt, &t->model, s, (int)t->updates + 1);
}

// The run's state across steps: the micro-batch arguments, the loss's scale and the watchdog's
// allowances (a step's grows with the slowest step seen, a save's with the checkpoint's size).
typedef struct RunState {
    MicroArgs a;
    int count_scored;  // data.mask_boundary_loss: the scored targets are counted over the world first
    double gtok;       // the world's tokens per step
    double base_to, step_to, save_to, slowest;
    int evb;           // validation batches, for the validation's allowance
    long fail_rank;    // tests: this rank fails at its second step
} RunState;

enum { RUN_ON = -1 };  // a step's helpers: go on with the next step (else an exit code)

// Before the first step: the micro-batch arguments, metrics, the signal handling, the watchdog
// and the run's opening line.
static void run_start(Trainer* t, RunState* r) {
    const TrainConfig* tc = &t->cfg.train;
    const ModelConfig* mc = &t->cfg.model;
    const int B = t->model.B, T = tc->seq_len;
    r->gtok = (double)tc->global_batch * T;
    r->a = (MicroArgs){.tokens = t->h_tok, .targets = t->h_tgt, .backward = 1};
    micro_docs(t, &r->a);
    // the loss is the mean CE over the step's scored targets (all of them unless
    // data.mask_boundary_loss drops some: then they are counted over the world before the step)
    r->count_scored = t->doc_sep >= 0 && t->cfg.data.mask_boundary_loss;
    r->a.ce_scale = (float)(1.0 / r->gtok);
    r->a.aux_scale = mc->aux_coef / (float)t->n_micro;
    r->a.z_scale = mc->z_coef / (float)t->n_micro;
    const double flops_tok = params_train_flops_per_token(mc, T);
    if (t->rank == 0) {
        metrics_init(&t->met, t->be, stdout, tc->steps, t->world, r->gtok, flops_tok, t->cfg.log.peak_tflops, t->t_start);
        t->met.run_id = t->run_id;  // first in every metrics.jsonl line
    }
    const int bf16_egrad = t->model.grad_act[ARENA_EXPERT] && t->be->act_dtype == DTYPE_BF16;
    const char* notes = t->opt.split ? (bf16_egrad ? " (split fp32 masters, bf16 expert gradients)" : " (split fp32 masters)")
                                     : (bf16_egrad ? " (bf16 expert gradients)" : "");
    stop_running();  // a signal from here on saves a checkpoint (start-up signals exit 3 at once)
    // The first step's allowance: 10 x the plan's time at a modest rate (CPU 5 GFLOP/s per rank,
    // GPU 100 TFLOP/s), at least train.timeout_s.
    const double first_est = flops_tok * (double)B * T * t->n_micro / (strcmp(t->be->name, "cuda") ? 5e9 : 1e14);
    r->base_to = tc->timeout_s;
    r->step_to = r->base_to > 0 && 10 * first_est > r->base_to ? 10 * first_est : r->base_to;
    r->slowest = 0;
    r->save_to = r->base_to > 0 && t->write_rate > 0 && 4 * t->ckpt_rank_bytes / t->write_rate > r->base_to
                     ? 4 * t->ckpt_rank_bytes / t->write_rate : r->base_to;
    r->evb = tc->eval_batches > 0 ? tc->eval_batches : 64;
    watchdog_timeout(r->step_to);  // the watchdog runs since trainer_init
    log_info("train: %d steps from step %d, global batch %d x %d tokens, %d micro-batch(es) of %d per rank, world %d (ep %d x edp %d), backend %s/%s%s\n",
             tc->steps, t->step, tc->global_batch, T, t->n_micro, B, t->world, t->model.ep, t->model.edp,
             t->be->name, dtype_name(t->be->act_dtype), notes);
    if (t->model.fp8 != FP8_NONE) {
        char codes[192] = "";
        if (t->model.wq) {
            const double b = (double)t->model.wq_bytes;
            const int gib = b >= 1073741824.0;
            snprintf(codes, sizeof codes, "; expert weights quantised once per step, %.2f %s of codes kept%s",
                     b / (gib ? 1073741824.0 : 1048576.0), gib ? "GiB" : "MiB",
                     bf16_egrad ? " in the bf16 expert gradients' unused half" : "");
        }
        log_info("precision: fp8=%s: %s GEMMs in block-scaled FP8 e4m3, %.1f MiB workspace%s\n", fp8_mode_name(t->model.fp8),
                 t->model.fp8 == FP8_LINEAR ? "expert and attention-projection" : "expert", t->model.fp8_ws / 1048576.0,
                 codes);
    }
    if (t->cfg.checkpoint.keep_best && !t->cfg.checkpoint.dir[0])
        log_info("checkpoint: checkpoint.keep_best without checkpoint.dir: no checkpoint is saved\n");
    r->fail_rank = failpoint_int("train.fail_rank", -1);
    if (t->step >= tc->steps)
        log_info("train: the run is at step %d and train.steps is %d: nothing to train (raise train.steps to continue)\n",
                 t->step, tc->steps);
}

// Step s's training: forward, backward and update, the counters, and the watchdog's allowance
// (10 x the slowest step after the first). *loss, *ce, *aux the step's losses, *dt its seconds.
static StepStats run_step(Trainer* t, RunState* r, int s, double* loss, double* ce, double* aux, double* dt) {
    const ModelConfig* mc = &t->cfg.model;
    const double t0 = now_sec();
    double z;
    watchdog_timeout(r->step_to);
    forward_backward(t, &r->a, s, r->count_scored, r->gtok, ce, aux, &z);
    *loss = *ce + mc->aux_coef * *aux + mc->z_coef * z;
    const StepStats st = update(t, s, *loss);
    t->be->sync(t->be);
    *dt = now_sec() - t0;
    t->tokens += (int64_t)r->gtok;
    t->last_loss = *loss;
    if (st.skipped) {
        t->skipped++;
        t->bad_in_row++;
    } else {
        t->updates++;
        t->bad_in_row = 0;
    }
    if (s >= 1 && *dt > r->slowest) {
        r->slowest = *dt;
        if (r->base_to > 0) r->step_to = 10 * r->slowest > r->base_to ? 10 * r->slowest : r->base_to;
    }
    return st;
}

// After step s's update: validation (train.eval_every, the last step), the step's record, a
// sample (train.sample_every), checkpoint.keep_best's save and the commit of an async save.
// *early: train.early_stop's patience ran out at this validation. Returns RUN_ON or an exit code.
static int run_observe(Trainer* t, RunState* r, int s, double loss, double ce, double aux, const StepStats* st,
                       double dt, int* early, Err* e) {
    const TrainConfig* tc = &t->cfg.train;
    EvalResult ev, *evp = NULL;
    const int has_val = data_num_windows(t->data, 1) > 0;  // data.val_frac = 0: no validation
    if (has_val && ((tc->eval_every > 0 && (s + 1) % tc->eval_every == 0) || s + 1 == tc->steps)) {
        watchdog_timeout(r->step_to * (1 + (double)r->evb / t->n_micro));
        watchdog_stage(s + 1, "validation");
        ev = trainer_eval(t, tc->eval_batches);
        evp = &ev;
    }
    log_step(t, s, loss, ce, aux, st, dt, evp,
             (s + 1) % (t->cfg.log.every > 0 ? t->cfg.log.every : 1) == 0 || evp || st->skipped || s + 1 == tc->steps);
    if (tc->sample_every > 0 && (s + 1) % tc->sample_every == 0) {  // src/train_sample.c
        watchdog_timeout(r->step_to * (1 + (double)tc->sample_len));
        watchdog_stage(s + 1, "sample (train.sample_every)");
        trainer_sample(t, s + 1);
    }
    *early = 0;
    if (evp) {  // checkpoint.keep_best may save here
        watchdog_timeout(r->save_to);
        watchdog_stage(s + 1, "checkpoint save (best)");
    }
    if (evp && trainer_after_eval(t, s + 1, ev.loss, early, e)) {
        if (t->rank == 0) fprintf(stderr, "moetrain: error: saving the best checkpoint failed: %s\n", e->msg);
        return EXIT_USAGE;
    }
    // checkpoint.async: commit the save in flight once every rank has written its files
    watchdog_timeout(r->save_to);
    watchdog_stage(s + 1, "checkpoint commit (async save)");
    if (trainer_save_poll(t, e)) {
        if (t->rank == 0) fprintf(stderr, "moetrain: error: checkpoint save failed: %s\n", e->msg);
        return EXIT_USAGE;
    }
    return RUN_ON;
}

// After step s: stop on too many non-finite steps in a row, then every rank agrees on a
// preemption signal (*sig) and on a failed metrics write on rank 0, which stops every rank (no
// step goes unrecorded). Returns RUN_ON or an exit code.
static int run_agree(Trainer* t, RunState* r, int s, int32_t* sig, Err* e) {
    if (t->bad_in_row >= t->cfg.train.max_bad_steps) {
        trainer_save_wait(t, e);  // a save in flight is complete work: commit it
        if (t->rank == 0)
            fprintf(stderr, "moetrain: error: %d non-finite steps in a row (last at step %d); stopping. "
                            "The last checkpoint, if any, is intact; lower optim.lr or raise optim.warmup, then resume.\n",
                    t->bad_in_row, s + 1);
        t->step++;
        if (t->rank == 0) metrics_summary(&t->met, t->cfg.source, "diverged");
        return EXIT_DIVERGED;
    }
    int32_t flags[2] = {stop_signal(), t->log_failed};
    if (t->stop_at > 0 && s + 1 == t->stop_at) flags[0] = SIGTERM;  // tests
    watchdog_timeout(r->step_to);
    watchdog_stage(s + 1, "stop agreement (signal, log)");
    t->comm->host_all_reduce_max_i32(t->comm, GROUP_WORLD, flags, 2);
    *sig = flags[0];
    if (flags[1]) {
        trainer_save_wait(t, e);  // a save in flight is complete work: commit it
        if (t->rank == 0)
            fprintf(stderr, "moetrain: error: log.dir: %s; stopping at step %d so that no metrics are lost "
                            "(nothing saved after the last checkpoint). Free space there or give another log.dir, "
                            "then resume with checkpoint.resume=auto (metrics.jsonl continues from the checkpoint)\n",
                    t->log_err.msg, s + 1);
        t->step++;
        return EXIT_USAGE;
    }
    return RUN_ON;
}

// Step s's checkpoint (checkpoint.every, the last step, a signal, an early stop; written in full
// before the run exits), then the stop on a signal or train.early_stop. Returns RUN_ON or an exit code.
static int run_save_or_stop(Trainer* t, RunState* r, int s, int32_t sig, int early, Err* e) {
    const TrainConfig* tc = &t->cfg.train;
    const int last = s + 1 == tc->steps;
    const int every = t->cfg.checkpoint.every > 0 && (s + 1) % t->cfg.checkpoint.every == 0;
    if (t->cfg.checkpoint.dir[0] && (every || last || sig || early)) {
        t->step++;
        watchdog_timeout(r->save_to);
        watchdog_stage(s + 1, "checkpoint save");
        int rc = trainer_save(t, e);
        if (!rc && (last || sig || early)) rc = trainer_save_wait(t, e);  // checkpoint.async: written before exit
        t->step--;
        if (rc) {
            if (t->rank == 0) fprintf(stderr, "moetrain: error: checkpoint save failed: %s\n", e->msg);
            return EXIT_USAGE;
        }
    }
    if (sig && !last) {
        if (t->cfg.checkpoint.dir[0])
            log_info("train: signal %d: checkpoint written at step %d; exiting with code %d (resume with checkpoint.resume=auto)\n",
                     sig, s + 1, EXIT_PREEMPTED);
        else
            log_info("train: signal %d at step %d: no checkpoint.dir, nothing saved; exiting with code %d\n", sig, s + 1,
                     EXIT_PREEMPTED);
        t->step++;
        if (t->rank == 0) metrics_summary(&t->met, t->cfg.source, "signal");
        return EXIT_PREEMPTED;
    }
    if (early && !last) {
        if (t->rank == 0)
            log_info("train: early stop after step %d: the validation loss has not improved on %.6f (step %d) in %d "
                     "validation(s) (train.early_stop=%d)%s%s%s\n",
                     s + 1, t->best_val, t->best_step, t->evals_since_best, tc->early_stop,
                     t->cfg.checkpoint.keep_best ? "; best checkpoint: " : "",
                     t->cfg.checkpoint.keep_best ? t->cfg.checkpoint.dir : "", t->cfg.checkpoint.keep_best ? "/best" : "");
        t->step++;
        if (t->rank == 0) metrics_summary(&t->met, t->cfg.source, "early_stop");
        return EXIT_OK;
    }
    return RUN_ON;
}

int trainer_run(Trainer* t) {
    CHECK(!t->infer, "trainer_run on the inference set-up (trainer_init_infer: no gradients, no optimizer)");
    RunState r;
    Err e = {{0}};
    run_start(t, &r);
    for (; t->step < t->cfg.train.steps; t->step++) {
        const int s = t->step;
        if (s == 1 && t->rank == r.fail_rank) FATAL("injected failure (failpoint train.fail_rank=%ld)", r.fail_rank);
        double loss, ce, aux, dt;
        const StepStats st = run_step(t, &r, s, &loss, &ce, &aux, &dt);
        int early, rc = run_observe(t, &r, s, loss, ce, aux, &st, dt, &early, &e);
        int32_t sig = 0;
        if (rc == RUN_ON) rc = run_agree(t, &r, s, &sig, &e);
        if (rc == RUN_ON) rc = run_save_or_stop(t, &r, s, sig, early, &e);
        if (rc != RUN_ON) return rc;
    }
    if (t->rank == 0) metrics_summary(&t->met, t->cfg.source, "steps");
    return EXIT_OK;
}
