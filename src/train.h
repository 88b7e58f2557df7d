// train.h — the training loop and everything around it: runtime setup (backend, comm),
// data, model, optimizer, validation, logging, checkpoints, signals.
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "backend.h"
#include "comm.h"
#include "config.h"
#include "data.h"
#include "logfile.h"
#include "metrics.h"
#include "model.h"
#include "optim.h"

// Exit codes (documented in README.md).
enum {
    EXIT_OK = 0,
    EXIT_FATAL = 1,      // internal error (a bug or a CUDA/MPI failure): message on stderr
    EXIT_USAGE = 2,      // bad config, bad data, bad checkpoint: message says what to fix
    EXIT_PREEMPTED = 3,  // SIGTERM/SIGUSR1: saved a checkpoint and stopped; resume with resume=auto
    EXIT_DIVERGED = 4,   // too many non-finite steps in a row: stopped, last checkpoint kept
};

typedef struct Trainer {
    Config cfg;
    Backend* be;
    Comm* comm;
    DataSet* data;
    Model model;
    Optim opt;            // unused (zero) when infer
    int infer;            // trainer_init_infer: forward only, no optimizer, weights restored only
    int world, rank;
    int n_micro;          // micro-batches per step per rank (gradient accumulation)
    int step;             // next 0-based step to run
    int64_t updates;      // Adam step count: updates since the moments started from zero (a
                          // resume from a weight-only checkpoint restarts it with them)
    int64_t skipped;      // non-finite steps skipped in total
    int bad_in_row;
    int64_t tokens;       // tokens trained on (global)
    double last_loss;     // loss of the last step run (saved in trainer_state.yaml)
    int stop_at;          // tests: behave as if signalled after this many steps (0 = off)
    char resumed_from[CFG_STR + 64];  // the step directory resumed from ("" = none)
    int32_t* h_tok;       // host [N] micro-batch inputs
    int32_t* h_tgt;       // host [N] targets
    int32_t* h_win;       // host [seq_len + 1] one window
    int32_t* h_doc;       // host [N] document starts (data.documents on)
    int32_t* h_pos;       // host [N] RoPE positions (data.documents and data.reset_positions on)
    int doc_sep;          // the token that ends a document, or -1: data.documents off
    LogFile metrics;      // <log.dir>/metrics.jsonl (rank 0; fd -1 = none)
    int log_failed;       // a metrics write failed (rank 0): the run stops with exit 2
    Err log_err;          // why
    struct AsyncSave* async;  // checkpoint.async: the save in flight and its snapshot (train_ckpt.c)
    double t_start;
    double ckpt_bytes;       // one checkpoint, all ranks (preflight)
    double ckpt_rank_bytes;  // the largest rank file
    double write_rate;       // bytes/s into checkpoint.dir: measured at preflight, then by each save
    int grace_warned;
    char run_id[40];         // this run (recorded in checkpoints and metrics.jsonl; train_own.c)
    char lock_path[4200];    // rank 0: checkpoint.dir/.lock while held ("" = none)
    char lock_text[1200];
    Metrics met;          // the log: metrics.jsonl lines, console lines, summary (metrics.h)
    double best_val;      // lowest validation loss so far (INFINITY before the first; kept in
    int best_step;        // trainer_state.yaml with its step, 0 = none, and the validations
    int evals_since_best; // since it, for train.early_stop)
} Trainer;

// Sets up everything for `cfg` (already validated for this world size). Recoverable errors
// (data, checkpoint) return -1 with a message.
int trainer_init(Trainer* t, const Config* cfg, Err* e);
// The set-up for `eval` and `generate`: the same backend, communicator, data and layout, but a
// model for inference (ModelOpts.inference: no weight gradients, no backward scratch, one layer's
// activations), no optimizer, and a restore that reads the weights alone (checkpoint.resume or
// checkpoint.init_from, verified and checked against the model as in training; random init
// otherwise), rounded to the compute dtype exactly as training rounds them. Takes no lock and
// writes nothing (checkpoint.dir, log.dir unused). trainer_eval and the decoder (generate.h) run
// on it; trainer_run and trainer_save must not.
int trainer_init_infer(Trainer* t, const Config* cfg, Err* e);
// Runs to train.steps; returns an exit code.
int trainer_run(Trainer* t);
void trainer_free(Trainer* t);

typedef struct EvalResult {
    double loss;          // mean CE per token (nats)
    double bits_per_token;
    int64_t tokens;
} EvalResult;
// Validation loss over `batches` micro-batches per rank of the validation split (0 = all).
EvalResult trainer_eval(Trainer* t, int batches);

// train.sample_every (train_sample.c): prints a sample continuing train.sample_prompt after
// `step` steps; collective.
void trainer_sample(Trainer* t, int step);

// Fills the micro-batch host buffers from split/sequence indices: sequence `first + b` for b in
// [0, B) → inputs t->h_tok, targets t->h_tgt; with data.documents, the document starts t->h_doc,
// the positions t->h_pos (data.reset_positions) and, with data.mask_boundary_loss, target −1
// (not scored) where the input is the separator. Returns the scored targets.
int64_t trainer_fill_batch(Trainer* t, int split, uint64_t first);

// Checkpoint glue (train_ckpt.c: save; train_restore.c: restore). trainer_save: collective; writes checkpoint.dir/step_<t->step>
// (the number of steps done), streamed one tensor at a time: every rank the fp32 masters and
// (unless checkpoint.save_optimizer=false) the Adam moments of the tensors it owns under their
// Hugging Face names (optim.exp_avg.NAME, optim.exp_avg_sq.NAME), rank 0 the trainer state
// (counters, data position, layout, whether optimizer state is present, the resolved config).
// trainer_restore:
// checkpoint.resume = auto (newest complete checkpoint under checkpoint.dir; a corrupt newest
// one is skipped with a note) | a path | none; without a checkpoint to resume,
// checkpoint.init_from (a Hugging Face directory: weights only, fresh optimizer), else random
// init. Loading goes by name, so any layout loads any other. Errors name the file; every rank
// returns the same status.
int trainer_save(Trainer* t, Err* e);
// Collective preflight of checkpoint.dir, in two parts. _dir, first thing after the communicator
// (before the lock, the data and the model): the directory is made, every rank can create a file
// there and rank 0 measures the write rate (a short fsynced write). _space, once the model is
// built: the checkpoint's size, and rank 0 checks the free space against it × (checkpoint.keep + 1,
// less this directory's complete checkpoints) and warns when a save would not fit in
// checkpoint.grace_s. Every rank returns the same status.
int trainer_preflight_dir(Trainer* t, Err* e);
int trainer_preflight_space(Trainer* t, Err* e);
// 1 when this rank writes parameter p in a checkpoint (its ZeRO group's slice holds p's first element).
int trainer_owns(const Trainer* t, const ParamInfo* p);
// Run ownership (train_own.c), collective. trainer_own, before restore: a new run id; rank 0
// takes checkpoint.dir/.lock (a live holder stops the run, naming it; a stale one is replaced);
// a fresh run (resume=none) into a directory holding checkpoints is refused unless
// checkpoint.overwrite=true (then they are removed); resume=auto considers only the directory
// owner's checkpoints. trainer_own_after, after restore: the run id is the resumed checkpoint's,
// checkpoint.dir/owner names it. trainer_release: removes the lock (trainer_free). While held,
// the lock is refreshed (touched) every minute. trainer_lock_check, collective, before each
// save: -1 when the lock is no longer this run's (taken over while this run was stopped).
int trainer_own(Trainer* t, Err* e);
int trainer_own_after(Trainer* t, Err* e);
int trainer_lock_check(Trainer* t, Err* e);
void trainer_release(Trainer* t);
int trainer_restore(Trainer* t, Err* e);
// checkpoint.async=true: trainer_save takes the snapshot and returns while a background thread
// writes (waiting first, with a log line, when a save is still in flight). Collective, every
// rank at the same point: trainer_save_poll (each step) commits the save once every rank's
// writer is done; trainer_save_wait waits for it and commits (the final save, a signal).
// Both return 0 with nothing in flight. trainer_save_release (trainer_free) drops a save in
// flight without committing it (the run is ending on an error) and frees the snapshot.
int trainer_save_poll(Trainer* t, Err* e);
int trainer_save_wait(Trainer* t, Err* e);
void trainer_save_release(Trainer* t);
// 1 while an async save is in flight (begun, not committed).
int trainer_save_in_flight(const Trainer* t);
// checkpoint.keep_best: the same save into the root <checkpoint.dir>/best, keeping one (its
// `latest` names it; written only after the save is complete, like every save). Collective.
int trainer_save_best(Trainer* t, Err* e);
// After a validation at `step` (steps done; every rank, the same value): a new lowest loss sets
// best_val / best_step, resets evals_since_best and, with checkpoint.keep_best, saves the best
// (collective); otherwise evals_since_best grows and *early says whether train.early_stop's
// patience is used up. Returns -1 (with e) when the best save failed.
int trainer_after_eval(Trainer* t, int step, double val_loss, int* early, Err* e);
