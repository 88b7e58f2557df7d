// metrics.h — what a training run reports about itself (rank 0): one JSON line per step in
// <log.dir>/metrics.jsonl, a console line every log.every steps whose speed figures are averages
// over the steps since the previous line (the logging window), model TFLOP/s and MFU, device
// memory, the ETA, and the final `{"bench": ...}` summary line.
//
// Model FLOPs are the training FLOPs per token of params_train_flops_per_token (6 × active
// parameters + attention), so TFLOP/s and MFU count the model's arithmetic, not what the
// kernels happen to execute (no recompute). MFU = model TFLOP/s per device / the device's dense
// bf16 peak (log.peak_tflops, else metrics_peak_tflops by device name; none on the CPU).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "backend.h"

// Dense bf16 tensor-core peak TFLOP/s of one device, by (a substring of) its CUDA name:
// H100 / H200 SXM 989.4, H100 PCIe 756, A100 312, B200 2250. 0 = unknown (and for "cpu").
double metrics_peak_tflops(const char* device);

// Seconds as h:mm:ss ("0:04:05", "27:00:00"); "-" for a negative or non-finite value.
void metrics_hms(char* out, size_t n, double seconds);

// One step, as the training loop saw it.
typedef struct MetricsStep {
    int step;            // steps done (1-based)
    double loss, ce, aux;
    double lr, grad_norm;
    int skipped;         // the update was skipped (non-finite loss)
    double step_s;       // this step's time (forward, backward, update; no validation or save)
    int64_t tokens;      // tokens trained on so far (global)
    double load_max_over_mean;
    int has_val;
    double val_loss, val_bits;
} MetricsStep;

typedef struct Metrics {
    const char* run_id;      // first field of every metrics.jsonl line (NULL = none)
    FILE* console;           // the log lines (stdout; NULL = none)
    int console_failed;      // a console write failed (warned once)
    Backend* be;             // memory and device name
    int steps;               // train.steps
    int world;
    double tokens_per_step;  // global tokens per optimizer step
    double flops_per_token;  // model training FLOPs per token
    double peak_tflops;      // per device; 0 = none (no MFU)
    const char* peak_from;   // "log.peak_tflops", the device name, or NULL
    double t_start;          // when the trainer started (now_sec)
    double t_first;          // end of this run's first step (0 = not yet)
    int first_step;          // step number (1-based) of this run's first step
    double first_step_s;     // t_first - t_start: setup + the first step
    int win_n;               // steps in the logging window
    double win_s;            // their summed step time
    double steady_s;         // summed step time from this run's third step on (warm)
    int steady_n;
    double run_s;            // summed step time of this run
    int last_step;           // last step recorded
} Metrics;

// peak_override = log.peak_tflops (0 = by device name).
void metrics_init(Metrics* m, Backend* be, FILE* console, int steps, int world, double tokens_per_step,
                  double flops_per_token, double peak_override, double t_start);

// Records a step: formats its metrics.jsonl line ("{...}\n") into json[jn] and returns its length
// (the caller writes it: logfile.h); prints the console line when `print` (then the window restarts).
size_t metrics_step(Metrics* m, const MetricsStep* s, int print, char* json, size_t jn);

// Model TFLOP/s per device for `tokens_per_s` global tokens/s, and MFU % (NaN without a peak).
double metrics_tflops(const Metrics* m, double tokens_per_s);
double metrics_mfu(const Metrics* m, double tokens_per_s);

// The final `{"bench": ...}` line on the console: steady-state step time, tokens/s, model
// TFLOP/s, MFU, peak memory, time to the first step and total wall time. `stop` says why the run
// ended ("steps", "early_stop", "signal", ...); `source` is the config file.
void metrics_summary(const Metrics* m, const char* source, const char* stop);
