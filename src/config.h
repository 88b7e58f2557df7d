// config.h — the resolved run configuration: YAML file(s) + command-line overrides.
//
// Every key is `section.key`; the table of keys (name, type, default, range, doc) is KEYS in
// config.c (its row type in config_keys.h) and is the single source for parsing, validation, printing and docs/config.md.
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "util.h"

#define CFG_STR 512

typedef enum { DTYPE_F32 = 0, DTYPE_BF16 = 1 } DType;
typedef enum { MASTER_SPLIT = 0, MASTER_FP32 } MasterMode;
typedef enum { EGRAD_AUTO = 0, EGRAD_FP32, EGRAD_BF16 } ExpertGrad;
typedef enum { FP8_NONE = 0, FP8_EXPERTS, FP8_LINEAR } Fp8Mode;
typedef enum { FP8W_AUTO = 0, FP8W_PER_GEMM, FP8W_PER_STEP } Fp8Weights;
typedef enum { DEVICE_AUTO = 0, DEVICE_CPU, DEVICE_CUDA } DeviceKind;
typedef enum { COMM_AUTO = 0, COMM_NCCL, COMM_MPI } CommKind;
typedef enum { SCHED_COSINE = 0, SCHED_LINEAR, SCHED_CONSTANT, SCHED_WSD } Schedule;
typedef enum { PROFILE_NONE = 0, PROFILE_SYNC, PROFILE_EVENTS } ProfileMode;
typedef enum { GPU_ATTN_AUTO = 0, GPU_ATTN_MMA } GpuAttention;
typedef enum { GPU_TILES_TUNED = 0, GPU_TILES_HEURISTIC } GpuGemmTiles;
typedef enum { DATA_AUTO = 0, DATA_FASTA, DATA_FASTQ, DATA_TEXT, DATA_BIN, DATA_RANDOM } DataFormat;
typedef enum { DOCS_AUTO = 0, DOCS_ON, DOCS_OFF } DocMode;

typedef struct ModelConfig {
    int vocab_size;      // 256 for byte-level sequence data
    int hidden;          // model width H
    int ffn;             // expert FFN width F
    int layers;          // decoder layers L
    int heads;           // query heads
    int kv_heads;        // key/value heads (GQA)
    int experts;         // experts per MoE layer E
    int top_k;           // experts per token
    int max_seq;         // max_position_embeddings (config.json); >= train.seq_len
    float rope_theta;
    float rms_eps;
    float init_std;      // initializer_range
    float aux_coef;      // router_aux_loss_coef (load balancing, HF form)
    float z_coef;        // router z-loss coefficient (0 = off)
    int tie_embeddings;  // must be 0: Mixtral's lm_head is untied
} ModelConfig;

typedef struct ParallelConfig {
    int ep;     // expert-parallel group size; world % ep == 0, experts % ep == 0
    int zero1;  // shard optimizer state (ZeRO-1)
    int comm;   // CommKind: collectives on GPUs over NCCL, or MPI through page-locked host memory
} ParallelConfig;

typedef struct PrecisionConfig {
    DType dtype;        // compute/storage dtype of weights and activations (fp32 masters always)
    MasterMode master;  // bf16 runs: the fp32 masters as bf16 weight + int16 remainder (split)
                        // or a separate fp32 copy; ignored in fp32 mode
    ExpertGrad expert_grad;  // storage of the expert weight gradients (config_expert_grad_bf16)
    Fp8Mode fp8;        // GEMMs in block-scaled FP8 e4m3 (docs/fp8.md): none, the experts', or
                        // the experts' and the attention projections' (linear)
    Fp8Weights fp8_weights;  // with fp8: the expert weights quantised in every GEMM (per_gemm) or
                             // once per optimizer step, their codes kept (per_step); auto:
                             // config_fp8_wcodes
} PrecisionConfig;

typedef struct TrainConfig {
    int steps;         // optimizer steps
    int micro_batch;   // sequences per rank per forward/backward
    int global_batch;  // sequences per optimizer step over all ranks
    int seq_len;       // tokens per sequence
    uint64_t seed;
    DeviceKind device;
    int max_bad_steps;  // consecutive non-finite steps before the run stops
    int eval_every;     // validation every N steps (0 = only at the end)
    int eval_batches;   // micro-batches per validation
    int timeout_s;      // watchdog: a rank waiting longer in one stage ends the job (0 = off)
    int sample_every;   // a sample of sample_len tokens after train.sample_prompt every N steps (0 = off)
    int sample_len;
    char sample_prompt[CFG_STR];
    int keep_swiglu;    // keep the experts' SwiGLU output h from the forward for the backward
                        // (+ R·F·dtype bytes per layer) instead of recomputing it
    int early_stop;     // stop after this many validations without a new best (0 = off)
} TrainConfig;

typedef struct OptimConfig {
    float lr, min_lr_ratio;
    int warmup;
    Schedule schedule;
    float decay_frac;  // WSD: fraction of steps in the final decay
    float beta1, beta2, eps, weight_decay;
    int decay_norms;   // apply weight decay to norm weights too
    float clip;        // global grad-norm clip (0 = off)
} OptimConfig;

typedef struct DataConfig {
    char path[CFG_STR];       // file, comma list, glob or directory; "" for the shipped default
    char val_path[CFG_STR];   // separate validation data ("" = val_frac of data.path)
    char weights[CFG_STR];    // one weight per data.path item ("" = concatenate the items)
    char tokenizer[CFG_STR];  // tokenizer of the shards, for export ("" = the manifest beside them)
    DataFormat format;
    float val_frac;           // fraction of records (or windows, for .bin) held out
    int sep_token;            // token between records (byte-level)
    int shuffle;
    int required;             // refuse to start without data.path
    DocMode documents;       // packed documents stay apart (attention, RoPE, loss); auto: data_doc_sep
    int reset_positions;     // with documents: RoPE positions restart at 0 in every document
    int mask_boundary_loss;  // with documents: a separator's prediction of the next document's
                             // first token is not scored
} DataConfig;

typedef struct CheckpointConfig {
    char dir[CFG_STR];        // "" = no checkpoints
    int every;                // steps between saves (0 = only at the end)
    int keep;                 // complete checkpoints kept (0 = all)
    char resume[CFG_STR];     // "none", "auto", or a path
    char init_from[CFG_STR];  // Hugging Face directory to start from ("" = random init)
    int required;             // refuse to start without dir
    int save_optimizer;       // save Adam m and v too (exact resume); 0 = fp32 masters only
    int async;                // snapshot to host memory, write from a background thread
    int overwrite;            // a fresh run may replace the checkpoints already in dir
    int grace_s;              // seconds a preemption signal leaves for a step and a save (0 = no check)
    int keep_best;            // keep the lowest-validation-loss checkpoint in <dir>/best
} CheckpointConfig;

typedef struct LogConfig {
    char dir[CFG_STR];  // metrics.jsonl and config.yaml go here ("" = none)
    int every;          // log a line every N steps
    ProfileMode profile;  // the per-stage time table after the run (src/prof.h)
    float peak_tflops;  // dense bf16 peak per device for MFU (0 = from the device name)
} LogConfig;

// The CUDA backend's options (section gpu), handed to cuda_backend_create; all zeros = the defaults.
typedef struct GpuConfig {
    GpuAttention attention;   // auto: the Hopper kernels where they apply; mma: mma.sync everywhere
    GpuGemmTiles gemm_tiles;  // tuned: cuda_gemm.cu's tile table (bf16, Hopper); heuristic: cuBLASLt's pick
    int gemm_log;             // print every cuBLASLt plan as it is built (stderr)
} GpuConfig;

typedef struct Config {
    ModelConfig model;
    ParallelConfig parallel;
    PrecisionConfig precision;
    TrainConfig train;
    OptimConfig optim;
    DataConfig data;
    CheckpointConfig checkpoint;
    LogConfig log;
    GpuConfig gpu;
    char source[CFG_STR];  // the config file that was loaded (resolved path)
} Config;

// Fills every key with its default.
void config_defaults(Config* c);

// Finds NAME as a path, or as configs/NAME.yaml next to the binary / under the install prefix /
// under the current directory. Writes the resolved path. Returns 0 or -1 with a message.
int config_find(const char* name, char* out, size_t out_size, Err* e);

// Finds a shipped file in directory `kind` ("configs" → configs/NAME.yaml, "data") like
// config_find does.
int config_find_file(const char* kind, const char* name, const char* ext, char* out, size_t n, Err* e);

// Loads a YAML file (following `defaults:` chains) on top of the current values of c.
// On error c is unchanged and e names file:line:col, the key and what would be valid.
int config_load_file(Config* c, const char* path, Err* e);

// Same, from text in memory (len bytes; NUL not needed). `name` is used in messages; a
// `defaults:` name is resolved relative to the current directory, then like --config.
int config_load_string(Config* c, const char* text, size_t len, const char* name, Err* e);

// Applies one `section.key=value` override.
int config_override(Config* c, const char* kv, Err* e);

// Checks ranges and cross-key constraints (the layout needs the world size; world <= 0 checks
// the smallest layout, world = parallel.ep).
int config_validate(const Config* c, int world, Err* e);
// Whether a run of `world` ranks stores the expert weight gradients in bf16
// (precision.expert_grad: bf16, or auto where allowed: bf16 compute, one micro-batch per step,
// no expert-data-parallel reduction, world == parallel.ep). config_validate refuses bf16 elsewhere.
int config_expert_grad_bf16(const Config* c, int world);
// Whether a run of `world` ranks keeps the expert weights' FP8 codes across a step
// (ModelOpts.fp8_wcodes): precision.fp8_weights=per_step, or auto with bf16 expert gradients
// (config_expert_grad_bf16), whose fp32-sized arena then holds the codes in its unused half.
// 0 with precision.fp8=none.
int config_fp8_wcodes(const Config* c, int world);

// Checks what only a training run needs (checkpoint.required → checkpoint.dir given).
int config_validate_run(const Config* c, Err* e);

// Prints the resolved config as YAML (loadable again by config_load_file).
void config_print(const Config* c, FILE* f);
// The same as a malloc'd string (free it); its length in *len when len is not NULL.
char* config_print_text(const Config* c, size_t* len);

// Prints the table of keys as Markdown (docs/config.md, `moetrain --keys`).
void config_print_keys(FILE* f);

// 1 when every key has the same value in a and b (source is not compared); otherwise 0, and
// *first_diff (if not NULL) names the first key that differs.
int config_equal(const Config* a, const Config* b, const char** first_diff);

// Enum names, for logs.
const char* dtype_name(DType d);
const char* master_mode_name(MasterMode m);
const char* fp8_mode_name(Fp8Mode m);
const char* device_name(DeviceKind d);
const char* schedule_name(Schedule s);
const char* data_format_name(DataFormat f);
