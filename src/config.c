// config.c — the table of keys and everything driven from it: defaults, value parsing,
// overrides, validation, printing and the Markdown key table. YAML files: config_load.c.
#define _DEFAULT_SOURCE
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config_keys.h"

#define KEY(sec, k, type, def, lo, hi, enums, doc) \
    {#sec "." #k, type, offsetof(Config, sec.k), sizeof(((Config*)0)->sec.k), def, lo, hi, enums, doc}
#define BOOL(sec, k, def, doc) KEY(sec, k, K_BOOL, def, 0, 1, NULL, doc)
#define STR(sec, k, def, doc) KEY(sec, k, K_STR, def, 0, 0, NULL, doc)
#define ENUM(sec, k, def, enums, doc) KEY(sec, k, K_ENUM, def, 0, 0, enums, doc)
#define IMAX 2147483647.0
#ifndef MOETRAIN_VERSION
#define MOETRAIN_VERSION "dev"
#endif

static const ConfigKey KEYS[] = {
    KEY(model, vocab_size, K_INT, "256", 2, 1 << 24, NULL, "vocabulary size (256 = byte-level sequence data)"),
    KEY(model, hidden, K_INT, "64", 2, 65536, NULL, "model width H (hidden_size)"),
    KEY(model, ffn, K_INT, "128", 1, 1 << 20, NULL, "expert FFN width F (intermediate_size)"),
    KEY(model, layers, K_INT, "2", 1, 1024, NULL, "decoder layers"),
    KEY(model, heads, K_INT, "4", 1, 1024, NULL, "attention (query) heads; head dim = hidden / heads, even"),
    KEY(model, kv_heads, K_INT, "2", 1, 1024, NULL, "key/value heads (GQA); divides model.heads"),
    KEY(model, experts, K_INT, "4", 1, 64, NULL, "experts per MoE layer (at most 64: the router statistics and the dispatch are sized for 64)"),
    KEY(model, top_k, K_INT, "2", 1, 16, NULL, "experts per token (<= model.experts; at most 16: the CUDA router)"),
    KEY(model, max_seq, K_INT, "1024", 1, 1 << 24, NULL, "max_position_embeddings in config.json (>= train.seq_len)"),
    KEY(model, rope_theta, K_FLOAT, "1e6", 1, 1e12, NULL, "RoPE base (rope_theta)"),
    KEY(model, rms_eps, K_FLOAT, "1e-5", 1e-12, 1, NULL, "RMSNorm epsilon (rms_norm_eps)"),
    KEY(model, init_std, K_FLOAT, "0.02", 0, 10, NULL, "std of the normal init (initializer_range)"),
    KEY(model, aux_coef, K_FLOAT, "0.02", 0, 100, NULL, "load-balancing loss coefficient (router_aux_loss_coef)"),
    KEY(model, z_coef, K_FLOAT, "0", 0, 100, NULL, "router z-loss coefficient (0 = off)"),
    BOOL(model, tie_embeddings, "false", "must be false: Mixtral's lm_head is untied"),
    KEY(parallel, ep, K_INT, "1", 1, 64, NULL, "expert-parallel group size; divides the world size and model.experts"),
    BOOL(parallel, zero1, "true", "shard optimizer state (fp32 master, Adam m, v) over data-parallel ranks (ZeRO-1)"),
    ENUM(parallel, comm, "auto", "auto|nccl|mpi", "collectives of GPU ranks: nccl, or mpi = device buffers staged through page-locked host memory and sent by MPI (slower; needs no NCCL and lets several ranks share one GPU: mpirun -np 2 runs EP=2 on one GPU). auto = nccl on GPUs; the CPU backend always uses MPI"),
    ENUM(precision, dtype, "bf16", "fp32|bf16", "compute dtype of weights and activations on GPUs (fp32 master weights always: see precision.master; the CPU computes in fp32)"),
    ENUM(precision, expert_grad, "auto", "auto|fp32|bf16", "storage of the expert weight gradients in bf16 runs: bf16 = each backward GEMM's fp32 sum rounded once to bf16 (the values PyTorch autocast gives its fp32 .grad), 2 B/param less AdamW and grad-norm traffic; needs one micro-batch per step (train.global_batch = micro_batch × world) and world = parallel.ep (no gradient reduction over expert replicas). fp32 = fp32 sums (Megatron's main_grad). auto = bf16 where allowed, else fp32"),
    ENUM(precision, master, "split", "split|fp32", "how bf16 runs keep the fp32 master weights: split = the bf16 weight plus a 16-bit remainder (exact, 2 B/param less memory and AdamW traffic; the bf16 weight is the master rounded to nearest with ties away from zero), fp32 = a separate fp32 copy (the bf16 weight rounded to nearest even). Ignored in fp32 mode and on the CPU"),
    ENUM(precision, fp8, "none", "none|experts|linear", "GEMMs in FP8 e4m3 with block scales (1x128 tiles for activations and gradients, 128x128 blocks for weights, fp32 scales from each call's operands, fp32 accumulation; DeepSeek-V3's recipe, docs/fp8.md): experts = the expert GEMMs (forward, data and weight gradients), linear = those and the attention projections (qkv, o). The router, norms, attention scores, lm_head and loss, the fp32 masters, gradient sums and AdamW stay as they are. Needs a backend with FP8 GEMMs (the CPU; CUDA on compute capability 8.9 or later); may change on resume (checkpoints hold fp32 masters either way)"),
    ENUM(precision, fp8_weights, "auto", "auto|per_gemm|per_step", "with precision.fp8, when the expert weights are quantised (128x128 blocks). per_gemm = inside each FP8 GEMM that reads them: a micro-batch quantises each expert weight twice (forward, and transposed for the data gradient), nothing held. per_step = at each optimizer step's first micro-batch, into both layouts from one read, kept for the step: 2 bytes per local expert parameter, held in the unused half of the expert gradients' arena when those are bf16 (precision.expert_grad), else allocated (plan counts them); with gradient accumulation the later micro-batches skip the weights' quantisers. auto = per_step where the expert gradients are bf16 (the codes then cost no memory), else per_gemm. The same bits either way; may change on resume"),
    KEY(train, steps, K_INT, "300", 1, IMAX, NULL, "optimizer steps"),
    KEY(train, micro_batch, K_INT, "8", 1, 1 << 20, NULL, "sequences per rank per forward/backward"),
    KEY(train, global_batch, K_INT, "16", 1, 1 << 30, NULL, "sequences per optimizer step over all ranks; a multiple of micro_batch × world (the rest is gradient accumulation)"),
    KEY(train, seq_len, K_INT, "128", 2, 1 << 24, NULL, "tokens per sequence (<= model.max_seq)"),
    KEY(train, seed, K_U64, "1234", 0, 0, NULL, "seed of init, data shuffling and random data"),
    ENUM(train, device, "auto", "auto|cpu|cuda", "backend (auto = CUDA when a GPU is visible, else CPU)"),
    KEY(train, max_bad_steps, K_INT, "5", 1, IMAX, NULL, "non-finite steps in a row (skipped) before the run stops"),
    KEY(train, eval_every, K_INT, "0", 0, IMAX, NULL, "validation every N steps (0 = at the end only)"),
    KEY(train, eval_batches, K_INT, "4", 0, IMAX, NULL, "validation micro-batches per rank (0 = the whole split)"),
    KEY(train, timeout_s, K_INT, "300", 0, IMAX, NULL, "watchdog: a rank that waits longer than this in one stage of start-up (device, communicator, checkpoint.dir checks and lock, data, model, restore) or of a step (a collective, the optimizer, validation, a save) ends the job with exit 1, naming the stage and the ranks that did not arrive; raised to 10 x the slowest step so far (and to the plan's estimate for the first), and to 4 x the estimated save or restore for those (0 = off)"),
    KEY(train, sample_every, K_INT, "0", 0, IMAX, NULL, "print a sample into the log every N steps: train.sample_len tokens continuing train.sample_prompt, drawn at temperature 1 from the current weights with a KV cache, as `moetrain generate` does (0 = never; docs/generate.md)"),
    KEY(train, sample_len, K_INT, "64", 1, 4096, NULL, "tokens per train.sample_every sample (fewer when EOS comes first)"),
    STR(train, sample_prompt, "", "text the train.sample_every samples continue (bytes for a vocabulary of 256, else the run's SentencePiece tokenizer: data.tokenizer or the shards' manifest); empty = a newline for bytes, BOS otherwise"),
    KEY(train, early_stop, K_INT, "0", 0, IMAX, NULL, "stop the run (exit 0, a checkpoint saved) after this many validations in a row without a new lowest validation loss (0 = off)"),
    BOOL(train, keep_swiglu, "false", "keep the experts' SwiGLU output h from the forward for the backward instead of recomputing it: one SwiGLU pass less per layer for micro_batch × seq_len × top_k × model.ffn × dtype bytes more saved activations per layer (1.25× that with parallel.ep > 1; with precision.fp8, h's FP8 codes for w2's weight gradient instead: about half the bytes of bf16 h, and no pass of the backward reads h; `plan` counts it)"),
    KEY(optim, lr, K_FLOAT, "3e-4", 0, 10, NULL, "peak learning rate (AdamW)"),
    KEY(optim, min_lr_ratio, K_FLOAT, "0.1", 0, 1, NULL, "final learning rate as a fraction of optim.lr"),
    KEY(optim, warmup, K_INT, "100", 0, IMAX, NULL, "linear warmup steps"),
    ENUM(optim, schedule, "cosine", "cosine|linear|constant|wsd", "learning-rate decay after warmup (wsd = warmup-stable-decay)"),
    KEY(optim, decay_frac, K_FLOAT, "0.2", 0, 1, NULL, "wsd: fraction of the post-warmup steps spent in the final decay"),
    KEY(optim, beta1, K_FLOAT, "0.9", 0, 0.999999, NULL, "AdamW beta1"),
    KEY(optim, beta2, K_FLOAT, "0.95", 0, 0.999999, NULL, "AdamW beta2"),
    KEY(optim, eps, K_FLOAT, "1e-8", 0, 1, NULL, "AdamW epsilon"),
    KEY(optim, weight_decay, K_FLOAT, "0.1", 0, 10, NULL, "decoupled weight decay"),
    BOOL(optim, decay_norms, "false", "apply weight decay to norm weights too"),
    KEY(optim, clip, K_FLOAT, "1.0", 0, 1e9, NULL, "global gradient-norm clip (0 = off)"),
    STR(data, path, "", "FASTA / FASTQ / text files (.gz ok) or .bin token shards: a file, a comma list, a glob or a directory (its *.bin; val_*.bin there is validation data); empty = the shipped data/hairpin.fa.gz. docs/data.md"),
    STR(data, val_path, "", "validation data, in the same forms as data.path (empty = data.val_frac of data.path, or the val_*.bin shards of a data.path directory)"),
    STR(data, weights, "", "mix the data.path items by weight, comma-separated, one per item (e.g. 0.7,0.3; .bin items only): Megatron's blend, each item shuffled by train.seed; empty = concatenate the items"),
    STR(data, tokenizer, "", "tokenizer of the shards (a tokenizer.model / tokenizer.json file or its directory) that export copies beside config.json; empty = the one named by manifest.json beside the shards"),
    BOOL(data, required, "false", "refuse to train on the shipped byte-level sequences: data.path must be given (set by configs with a real vocabulary)"),
    ENUM(data, format, "auto", "auto|fasta|fastq|text|bin|random", "input format (auto = by name and content; random = uniform tokens, for benchmarks)"),
    KEY(data, val_frac, K_FLOAT, "0.05", 0, 0.9, NULL, "fraction of records (windows for .bin) held out for validation"),
    KEY(data, sep_token, K_INT, "10", 0, IMAX, NULL, "token between records (10 = newline; < model.vocab_size)"),
    BOOL(data, shuffle, "true", "shuffle training windows every epoch (by train.seed)"),
    ENUM(data, documents, "auto", "auto|on|off", "keep the documents packed in a window apart: attention only within a document (block-diagonal causal), and data.reset_positions / data.mask_boundary_loss. auto = on for FASTA/FASTQ (records end with data.sep_token) and for .bin shards with a manifest.json naming their eos_id (scripts/tokenize_data.py writes it), off for text lines and random tokens"),
    BOOL(data, reset_positions, "true", "with data.documents: RoPE positions restart at 0 in every document (Megatron's reset_position_ids)"),
    BOOL(data, mask_boundary_loss, "true", "with data.documents: a document's separator predicting the next document's first token is not scored (no loss, no gradient; the loss is the mean over the scored tokens)"),
    STR(checkpoint, dir, "", "checkpoint root (empty = no checkpoints)"),
    KEY(checkpoint, every, K_INT, "0", 0, IMAX, NULL, "steps between checkpoints (0 = at the end only)"),
    KEY(checkpoint, keep, K_INT, "3", 0, IMAX, NULL, "complete checkpoints kept (0 = all)"),
    STR(checkpoint, resume, "none", "none, auto (the latest under checkpoint.dir, if any) or a step directory"),
    STR(checkpoint, init_from, "", "Hugging Face directory to start from (empty = random init)"),
    BOOL(checkpoint, required, "false", "refuse to train without checkpoint.dir (set by large configs)"),
    BOOL(checkpoint, keep_best, "false", "also keep the checkpoint with the lowest validation loss in <checkpoint.dir>/best (saved when a validation improves; outside the keep rotation; nothing without checkpoint.dir or a validation split)"),
    BOOL(checkpoint, async, "false", "write checkpoints from a background thread: the state is copied to host memory (page-locked on GPUs; as many bytes as the rank's checkpoint files, kept for the run) and training continues while it is written; latest moves only once every rank's files are written and verified; one save in flight (the next waits); the final and signal-triggered saves finish before exit"),
    BOOL(checkpoint, overwrite, "false", "a fresh run (resume=none) into a checkpoint.dir that holds checkpoints removes them first (without it such a run is refused; resume=auto continues them)"),
    KEY(checkpoint, grace_s, K_INT, "300", 0, IMAX, NULL, "seconds a preemption signal leaves for a step and a save (the batch script's --signal=B:USR1@300); the log warns up front when a save would take longer (0 = no check)"),
    BOOL(checkpoint, save_optimizer, "true", "save the Adam moments too (exact resume); false = fp32 master weights only, a third of the size: resume restarts the moments from zero"),
    STR(log, dir, "", "directory for metrics.jsonl and the resolved config.yaml (empty = none)"),
    KEY(log, every, K_INT, "1", 1, IMAX, NULL, "print a log line every N steps (metrics.jsonl gets every step)"),
    ENUM(log, profile, "none", "none|sync|events", "print where a step's time goes, stage by stage, after the run: events = backend events, no syncs (the plain step's timeline); sync = a sync and a clock read after every stage (a slightly slower step)"),
    KEY(log, peak_tflops, K_FLOAT, "0", 0, 1e9, NULL, "dense bf16 peak TFLOP/s of one device, for MFU (0 = from the device name: H100/H200 SXM 989.4, H100 PCIe 756, A100 312, B200 2250; none on the CPU)"),
    ENUM(gpu, attention, "auto", "auto|mma", "attention kernels of the CUDA backend: auto = the Hopper ones (wgmma; warp-specialised at head dim 128) where they apply (sm_90a build, compute capability 9, bf16, head dim 64 or 128), else the portable mma.sync ones; mma = the mma.sync kernels everywhere (debugging: docs/gpu.md)"),
    ENUM(gpu, gemm_tiles, "tuned", "tuned|heuristic", "cuBLASLt tiles of the CUDA backend: tuned = the table measured for Mixtral-8x7B's expert and attention-projection GEMMs on Hopper in bf16 (every other GEMM: the heuristic's first pick); heuristic = the heuristic's first pick for every GEMM"),
    BOOL(gpu, gemm_log, "false", "print every cuBLASLt GEMM plan as it is built: its (rounded) dims, the tile it runs on, the heuristic's first pick and the host time of its query (stderr)"),
};
#define NKEYS (int)(sizeof KEYS / sizeof KEYS[0])

static const char* const SECTIONS[] = {"model", "parallel", "precision", "train", "optim", "data", "checkpoint", "log", "gpu"};
#define NSECTIONS (int)(sizeof SECTIONS / sizeof SECTIONS[0])

const ConfigKey* config_keys(int* n) {
    *n = NKEYS;
    return KEYS;
}

const ConfigKey* config_key(const char* name) {
    for (int i = 0; i < NKEYS; i++)
        if (strcmp(KEYS[i].name, name) == 0) return &KEYS[i];
    return NULL;
}

int config_is_section(const char* s) {
    for (int i = 0; i < NSECTIONS; i++)
        if (strcmp(s, SECTIONS[i]) == 0) return 1;
    return 0;
}

const char* config_section_list(void) {
    return "model, parallel, precision, train, optim, data, checkpoint, log, gpu";
}

// ---- enums -----------------------------------------------------------------------------------

// The idx-th name of "a|b|c" into out; "" when out of range.
static void enum_name(const char* enums, int idx, char* out, size_t n) {
    const char* s = enums;
    for (int i = 0; i < idx && s; i++) s = strchr(s, '|') ? strchr(s, '|') + 1 : NULL;
    if (!s || idx < 0) {
        snprintf(out, n, "?");
        return;
    }
    const char* bar = strchr(s, '|');
    snprintf(out, n, "%.*s", bar ? (int)(bar - s) : (int)strlen(s), s);
}

// "a|b|c" → "a, b, c".
static void enum_list(const char* enums, char* out, size_t n) {
    size_t o = 0;
    for (const char* s = enums; *s && o + 3 < n; s++) {
        if (*s == '|') out[o++] = ',', out[o++] = ' ';
        else out[o++] = *s;
    }
    out[o] = 0;
}

static int enum_index(const char* enums, const char* text) {
    size_t n = strlen(text);
    int idx = 0;
    for (const char* s = enums; *s; idx++) {
        const char* bar = strchr(s, '|');
        size_t len = bar ? (size_t)(bar - s) : strlen(s);
        if (len == n && strncmp(s, text, n) == 0) return idx;
        s += len + (bar ? 1 : 0);
    }
    return -1;
}

static const char* enum_of(const char* key, int v) {
    static char buf[4][32];
    static int k = 0;
    char* b = buf[k++ % 4];
    enum_name(config_key(key)->enums, v, b, 32);
    return b;
}
const char* dtype_name(DType d) { return enum_of("precision.dtype", (int)d); }
const char* master_mode_name(MasterMode m) { return enum_of("precision.master", (int)m); }
const char* fp8_mode_name(Fp8Mode m) { return enum_of("precision.fp8", (int)m); }
const char* device_name(DeviceKind d) { return enum_of("train.device", (int)d); }
const char* schedule_name(Schedule s) { return enum_of("optim.schedule", (int)s); }
const char* data_format_name(DataFormat f) { return enum_of("data.format", (int)f); }

// Why bf16 expert gradients are not allowed for this run (NULL: they are).
static const char* expert_grad_blocker(const Config* c, int world) {
    if (world <= 0) world = c->parallel.ep;
    if (c->precision.dtype != DTYPE_BF16) return "precision.dtype is not bf16";
    if (world != c->parallel.ep) return "the expert gradients are summed over expert replicas (world > parallel.ep)";
    if (c->train.global_batch != c->train.micro_batch * world)
        return "a step accumulates several micro-batches (train.global_batch > micro_batch × world)";
    return NULL;
}

int config_expert_grad_bf16(const Config* c, int world) {
    return c->precision.expert_grad != EGRAD_FP32 && !expert_grad_blocker(c, world);
}

int config_fp8_wcodes(const Config* c, int world) {
    if (c->precision.fp8 == FP8_NONE) return 0;
    const Fp8Weights w = c->precision.fp8_weights;
    return w == FP8W_PER_STEP || (w == FP8W_AUTO && config_expert_grad_bf16(c, world));
}

// ---- suggestions -----------------------------------------------------------------------------

void config_suggest_key(const char* section, const char* key, char* out, size_t n) {
    char full[300];
    snprintf(full, sizeof full, "%s.%s", section, key);
    const char* best = NULL;
    int bd = INT_MAX;
    for (int i = 0; i < NKEYS; i++) {
        const char* dot = strchr(KEYS[i].name, '.');
        int d = edit_distance(full, KEYS[i].name);
        int same = strncmp(KEYS[i].name, section, (size_t)(dot - KEYS[i].name)) == 0 &&
                   section[dot - KEYS[i].name] == 0;
        int d2 = edit_distance(key, dot + 1) + (same ? 0 : 1);  // the key in another section
        if (d2 < d) d = d2;
        if (d < bd) bd = d, best = KEYS[i].name;
    }
    int len = (int)strlen(key);
    if (best && bd <= (len > 6 ? len / 3 : 2)) {
        snprintf(out, n, " (did you mean %s?)", best);
        return;
    }
    if (!config_is_section(section)) {
        snprintf(out, n, " (sections: %s)", config_section_list());
        return;
    }
    size_t o = (size_t)snprintf(out, n, " (valid %s keys:", section);
    for (int i = 0; i < NKEYS && o < n; i++) {
        const char* dot = strchr(KEYS[i].name, '.');
        if ((size_t)(dot - KEYS[i].name) == strlen(section) && !strncmp(KEYS[i].name, section, strlen(section)))
            o += (size_t)snprintf(out + o, n - o, " %s", dot + 1);
    }
    if (o < n) snprintf(out + o, n - o, ")");
}

void config_suggest_section(const char* section, char* out, size_t n) {
    const char* best = NULL;
    int bd = INT_MAX;
    for (int i = 0; i < NSECTIONS; i++) {
        int d = edit_distance(section, SECTIONS[i]);
        if (d < bd) bd = d, best = SECTIONS[i];
    }
    if (bd <= 2 && bd < (int)strlen(section))
        snprintf(out, n, " (did you mean %s? sections: %s; or defaults)", best, config_section_list());
    else
        snprintf(out, n, " (sections: %s; or defaults)", config_section_list());
}

// ---- values ----------------------------------------------------------------------------------

static void range_text(const ConfigKey* k, char* out, size_t n) {
    if (k->type == K_INT && k->hi >= IMAX) snprintf(out, n, ">= %.0f", k->lo);
    else if (k->type == K_INT) snprintf(out, n, "%.0f to %.0f", k->lo, k->hi);
    else snprintf(out, n, "%g to %g", k->lo, k->hi);
}

// 1 when s is valid UTF-8 as libyaml reads it (a config file is; argv may not be): no overlong
// forms, no surrogates, nothing above U+10FFFF.
static int utf8_ok(const unsigned char* s) {
    while (*s) {
        unsigned c = *s, cp;
        int extra = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
        if (extra < 0) return 0;
        cp = extra == 0 ? c : extra == 1 ? c & 0x1F : extra == 2 ? c & 0x0F : c & 0x07;
        s++;
        for (int i = 0; i < extra; i++, s++) {
            if ((*s & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (*s & 0x3Fu);
        }
        static const unsigned min[] = {0, 0x80, 0x800, 0x10000};
        if (cp < min[extra] || (cp >= 0xD800 && cp < 0xE000) || cp > 0x10FFFF) return 0;
    }
    return 1;
}

// K_INT: a decimal integer within the key's range.
static int set_int(const ConfigKey* k, int* p, const char* text, const char* where, Err* e) {
    char* end = NULL;
    char range[64];
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (!(text[0] == '-' || text[0] == '+' || (text[0] >= '0' && text[0] <= '9')) || *end || errno == EINVAL)
        return err_set(e, "%s: %s: expected an integer, got '%s'", where, k->name, text);
    range_text(k, range, sizeof range);
    if (errno == ERANGE || (double)v < k->lo || (double)v > k->hi)
        return err_set(e, "%s: %s: %s is out of range (expected %s)", where, k->name, text, range);
    *p = (int)v;
    return 0;
}

// K_FLOAT: a finite decimal number within the key's range.
static int set_float(const ConfigKey* k, float* p, const char* text, const char* where, Err* e) {
    char* end = NULL;
    char range[64];
    errno = 0;
    double v = strtod(text, &end);
    int lead = text[0] == '-' || text[0] == '+' || text[0] == '.' || (text[0] >= '0' && text[0] <= '9');
    if (!lead || *end || v != v || v - v != 0)  // rejects nan, inf and hex-less junk
        return err_set(e, "%s: %s: expected a number, got '%s'", where, k->name, text);
    range_text(k, range, sizeof range);
    if (v < k->lo || v > k->hi)
        return err_set(e, "%s: %s: %s is out of range (expected %s)", where, k->name, text, range);
    *p = (float)v;
    return 0;
}

// K_ENUM: one of the key's names; a near miss ("bf61") gets a suggestion in the error.
static int set_enum(const ConfigKey* k, int* p, const char* text, const char* where, Err* e) {
    int idx = enum_index(k->enums, text);
    if (idx >= 0) {
        *p = idx;
        return 0;
    }
    char choices[128], hint[96] = "";
    enum_list(k->enums, choices, sizeof choices);
    for (int i = 0, bd = 3; i < 16; i++) {
        char nm[32];
        enum_name(k->enums, i, nm, sizeof nm);
        if (!strcmp(nm, "?")) break;
        int d = edit_distance(text, nm);
        if (d < bd && d < (int)strlen(nm)) bd = d, snprintf(hint, sizeof hint, "; did you mean %s?", nm);
    }
    return err_set(e, "%s: %s: '%s' is not one of %s%s", where, k->name, text, choices, hint);
}

int config_set_value(Config* c, const ConfigKey* k, const char* text, int is_null, const char* where, Err* e) {
    char* p = (char*)c + k->off;
    char* end = NULL;
    static const char* expect[] = {"an integer", "a non-negative integer", "a number", "true or false", "a string",
                                   "one of"};
    if (is_null && k->type != K_STR) {
        if (k->type == K_ENUM) {
            char choices[128];
            enum_list(k->enums, choices, sizeof choices);
            return err_set(e, "%s: %s: missing value (expected one of %s)", where, k->name, choices);
        }
        return err_set(e, "%s: %s: missing value (expected %s)", where, k->name, expect[k->type]);
    }
    switch (k->type) {
        case K_INT:
            return set_int(k, (int*)p, text, where, e);
        case K_U64: {
            errno = 0;
            unsigned long long v = strtoull(text, &end, 10);
            if (!(text[0] >= '0' && text[0] <= '9') || *end || errno)
                return err_set(e, "%s: %s: expected a non-negative integer below 2^64, got '%s'", where, k->name, text);
            *(uint64_t*)p = (uint64_t)v;
            return 0;
        }
        case K_FLOAT:
            return set_float(k, (float*)p, text, where, e);
        case K_BOOL: {
            if (!strcasecmp(text, "true") || !strcasecmp(text, "yes") || !strcasecmp(text, "on") || !strcmp(text, "1"))
                *(int*)p = 1;
            else if (!strcasecmp(text, "false") || !strcasecmp(text, "no") || !strcasecmp(text, "off") || !strcmp(text, "0"))
                *(int*)p = 0;
            else
                return err_set(e, "%s: %s: expected true or false, got '%s'", where, k->name, text);
            return 0;
        }
        case K_STR: {
            if (strlen(text) >= CFG_STR)
                return err_set(e, "%s: %s: value longer than %d characters", where, k->name, CFG_STR - 1);
            if (!utf8_ok((const unsigned char*)text))
                return err_set(e, "%s: %s: value is not valid UTF-8", where, k->name);
            memset(p, 0, CFG_STR);
            memcpy(p, text, strlen(text));
            return 0;
        }
        case K_ENUM:
            return set_enum(k, (int*)p, text, where, e);
    }
    return err_set(e, "%s: %s: internal error (key type)", where, k->name);
}

void config_defaults(Config* c) {
    memset(c, 0, sizeof *c);
    static const size_t want[] = {sizeof(int), sizeof(uint64_t), sizeof(float), sizeof(int), CFG_STR, sizeof(int)};
    Err e;
    for (int i = 0; i < NKEYS; i++) {
        CHECK(KEYS[i].size == want[KEYS[i].type], "config key %s: table type does not match the field", KEYS[i].name);
        if (config_set_value(c, &KEYS[i], KEYS[i].def, 0, "defaults", &e)) FATAL("%s", e.msg);
    }
}

int config_override(Config* c, const char* kv, Err* e) {
    const char* eq = strchr(kv, '=');
    const char* dot = strchr(kv, '.');
    if (!eq || eq == kv || !dot || dot > eq)
        return err_set(e, "command line: '%s' is not section.key=value (e.g. train.steps=100)", kv);
    char section[64], key[160], full[230], hint[512];
    size_t sl = (size_t)(dot - kv), kl = (size_t)(eq - dot - 1);
    if (sl >= sizeof section || kl >= sizeof key) return err_set(e, "command line: key too long in '%.100s'", kv);
    memcpy(section, kv, sl);
    section[sl] = 0;
    memcpy(key, dot + 1, kl);
    key[kl] = 0;
    snprintf(full, sizeof full, "%s.%s", section, key);
    const ConfigKey* k = config_key(full);
    if (!k) {
        config_suggest_key(section, key, hint, sizeof hint);
        return err_set(e, "command line: unknown key '%s'%s", full, hint);
    }
    return config_set_value(c, k, eq + 1, 0, "command line", e);
}

int config_equal(const Config* a, const Config* b, const char** first_diff) {
    for (int i = 0; i < NKEYS; i++) {
        const char* pa = (const char*)a + KEYS[i].off;
        const char* pb = (const char*)b + KEYS[i].off;
        int same = KEYS[i].type == K_STR ? strcmp(pa, pb) == 0 : memcmp(pa, pb, KEYS[i].size) == 0;
        if (!same) {
            if (first_diff) *first_diff = KEYS[i].name;
            return 0;
        }
    }
    return 1;
}

// ---- validation ------------------------------------------------------------------------------

static int check_ranges(const Config* c, const char* src, Err* e) {
    for (int i = 0; i < NKEYS; i++) {
        const ConfigKey* k = &KEYS[i];
        const char* p = (const char*)c + k->off;
        double v;
        if (k->type == K_INT) v = *(const int*)p;
        else if (k->type == K_FLOAT) v = *(const float*)p;
        else if (k->type == K_ENUM || k->type == K_BOOL) {
            char nm[32];
            int x = *(const int*)p;
            enum_name(k->type == K_ENUM ? k->enums : "false|true", x, nm, sizeof nm);
            if (!strcmp(nm, "?")) return err_set(e, "%s: %s holds %d, not one of its values", src, k->name, x);
            continue;
        } else continue;
        char range[64];
        range_text(k, range, sizeof range);
        if (!(v >= k->lo && v <= k->hi))
            return err_set(e, "%s: %s = %g is out of range (expected %s)", src, k->name, v, range);
    }
    return 0;
}

int config_validate(const Config* c, int world, Err* e) {
    const ModelConfig* m = &c->model;
    const TrainConfig* t = &c->train;
    const char* src = c->source[0] ? c->source : "config";
    if (check_ranges(c, src, e)) return -1;
    const int ep = c->parallel.ep;
    if (world <= 0) world = ep;
    if (m->tie_embeddings)
        return err_set(e, "%s: model.tie_embeddings must be false (Mixtral's lm_head is untied)", src);
    if (m->hidden % m->heads)
        return err_set(e, "%s: model.hidden (%d) must be a multiple of model.heads (%d)", src, m->hidden, m->heads);
    if ((m->hidden / m->heads) % 2)
        return err_set(e, "%s: the head dim model.hidden / model.heads = %d / %d = %d must be even (RoPE rotates pairs)",
                       src, m->hidden, m->heads, m->hidden / m->heads);
    if (m->hidden / m->heads > 1024)
        return err_set(e, "%s: the head dim model.hidden / model.heads = %d / %d = %d exceeds 1024 (the attention kernels' "
                       "limit; 256 on GPUs): raise model.heads", src, m->hidden, m->heads, m->hidden / m->heads);
    if (m->heads % m->kv_heads)
        return err_set(e, "%s: model.heads (%d) must be a multiple of model.kv_heads (%d)", src, m->heads, m->kv_heads);
    if (m->top_k > m->experts)
        return err_set(e, "%s: model.top_k (%d) cannot exceed model.experts (%d)", src, m->top_k, m->experts);
    if (t->seq_len > m->max_seq)
        return err_set(e, "%s: train.seq_len (%d) exceeds model.max_seq (%d); lower train.seq_len or raise model.max_seq",
                       src, t->seq_len, m->max_seq);
    if (c->data.sep_token >= m->vocab_size)
        return err_set(e, "%s: data.sep_token (%d) must be below model.vocab_size (%d)", src, c->data.sep_token,
                       m->vocab_size);
    if ((int64_t)t->micro_batch * t->seq_len * m->top_k > INT_MAX)
        return err_set(e, "%s: train.micro_batch × train.seq_len × model.top_k = %lld rows exceeds 2^31; lower "
                       "train.micro_batch", src, (long long)t->micro_batch * t->seq_len * m->top_k);
    // Layout: world = ep × edp; experts split over the EP group.
    char valid[256] = "";
    size_t o = 0;
    for (int d = 1; d <= world && d <= m->experts && o < sizeof valid - 16; d++)
        if (world % d == 0 && m->experts % d == 0) o += (size_t)snprintf(valid + o, sizeof valid - o, "%s%d", o ? ", " : "", d);
    if (m->experts % ep)
        return err_set(e, "%s: parallel.ep (%d) must divide model.experts (%d) (for %d ranks: parallel.ep = %s)", src,
                       ep, m->experts, world, valid);
    if (world % ep)
        return err_set(e, "%s: the world size (%d ranks) must be a multiple of parallel.ep (%d): launch a multiple of "
                       "%d ranks (mpirun -np %d), or set parallel.ep to one of %s", src, world, ep, ep, ep, valid);
    const long long per = (long long)t->micro_batch * world;
    if (t->global_batch % per) {
        long long lo = t->global_batch / per * per;
        char alt[64] = "";
        if (lo > 0) snprintf(alt, sizeof alt, "%lld or ", lo);
        return err_set(e, "%s: train.global_batch (%d) must be a multiple of train.micro_batch × world = %d × %d = %lld "
                       "(gradient accumulation = global_batch / %lld); e.g. train.global_batch=%s%lld",
                       src, t->global_batch, t->micro_batch, world, per, per, alt, lo + per);
    }
    if (c->precision.fp8_weights == FP8W_PER_STEP && c->precision.fp8 == FP8_NONE)
        return err_set(e, "%s: precision.fp8_weights=per_step keeps the expert weights' FP8 codes, but precision.fp8 is "
                       "none: set precision.fp8=experts or linear, or precision.fp8_weights to auto or per_gemm", src);
    const char* why = expert_grad_blocker(c, world);
    if (c->precision.expert_grad == EGRAD_BF16 && why)
        return err_set(e, "%s: precision.expert_grad=bf16 is not possible here: %s (set precision.expert_grad=auto or "
                       "fp32)", src, why);
    if (!c->checkpoint.resume[0])
        return err_set(e, "%s: checkpoint.resume must be none, auto or a checkpoint path", src);
    return 0;
}

int config_validate_run(const Config* c, Err* e) {
    const char* src = c->source[0] ? c->source : "config";
    if (c->checkpoint.required && !c->checkpoint.dir[0])
        return err_set(e, "%s: this config needs a checkpoint directory (checkpoint.required: true): add "
                       "checkpoint.dir=/path/to/checkpoints on the command line", src);
    if (c->data.required && !c->data.path[0] && c->data.format != DATA_RANDOM)
        return err_set(e, "%s: this config needs your own data (data.required: true): model.vocab_size %d is not the "
                       "shipped byte-level sequences. Make token shards, then give data.path:\n"
                       "  spm_train --input=corpus.txt --model_prefix=tok --vocab_size=%d --byte_fallback=true   "
                       "(or take the model's own tokenizer.model)\n"
                       "  scripts/tokenize_data.py --tokenizer tok.model --out shards corpus/\n"
                       "  then: data.path=shards (docs/data.md)", src, c->model.vocab_size, c->model.vocab_size);
    if (!strcmp(c->checkpoint.resume, "auto") && !c->checkpoint.dir[0])
        return err_set(e, "%s: checkpoint.resume=auto needs checkpoint.dir=/path/to/checkpoints", src);
    if (c->train.early_stop > 0 && c->data.val_frac <= 0)
        return err_set(e, "%s: train.early_stop=%d needs a validation split: data.val_frac > 0 (or train.early_stop=0)",
                       src, c->train.early_stop);
    if (c->checkpoint.every > 0 && !c->checkpoint.dir[0])
        return err_set(e, "%s: checkpoint.every=%d has nowhere to write: add checkpoint.dir=/path/to/checkpoints "
                       "(or checkpoint.every=0)", src, c->checkpoint.every);
    return 0;
}

// ---- printing --------------------------------------------------------------------------------

// One code point of UTF-8 at s (valid, as config strings are); returns its length.
static int utf8_cp(const unsigned char* s, unsigned* cp) {
    if (s[0] < 0x80) return *cp = s[0], 1;
    if ((s[0] >> 5) == 6) return *cp = (s[0] & 0x1Fu) << 6 | (s[1] & 0x3Fu), 2;
    if ((s[0] >> 4) == 14) return *cp = (s[0] & 0x0Fu) << 12 | (s[1] & 0x3Fu) << 6 | (s[2] & 0x3Fu), 3;
    return *cp = (s[0] & 0x07u) << 18 | (s[1] & 0x3Fu) << 12 | (s[2] & 0x3Fu) << 6 | (s[3] & 0x3Fu), 4;
}

// A YAML double-quoted scalar that libyaml reads back byte for byte: what YAML would fold or
// refuse (control characters, line and paragraph separators, BOM, non-characters) is escaped.
// out needs 6 × strlen(s) + 3 bytes.
static void quote(const char* s, char* out, size_t n) {
    size_t o = 0;
    out[o++] = '"';
    for (const unsigned char* p = (const unsigned char*)s; *p && o + 8 < n;) {
        unsigned cp;
        int len = utf8_cp(p, &cp);
        if (cp == '"' || cp == '\\') o += (size_t)snprintf(out + o, n - o, "\\%c", (char)cp);
        else if (cp >= 0x20 && cp < 0x7F) out[o++] = (char)cp;
        else if (cp < 0xA0) o += (size_t)snprintf(out + o, n - o, "\\x%02X", cp);
        else if (cp == 0x2028 || cp == 0x2029 || cp == 0xFEFF || (cp >= 0xD800 && cp < 0xE000) || cp == 0xFFFE ||
                 cp == 0xFFFF)
            o += (size_t)snprintf(out + o, n - o, "\\u%04X", cp);
        else memcpy(out + o, p, (size_t)len), o += (size_t)len;
        p += len;
    }
    out[o++] = '"';
    out[o] = 0;
}

static int print_value(const Config* c, const ConfigKey* k, FILE* f) {
    const char* p = (const char*)c + k->off;
    char nm[32];
    switch (k->type) {
        case K_INT: return fprintf(f, "%d", *(const int*)p);
        case K_U64: return fprintf(f, "%llu", (unsigned long long)*(const uint64_t*)p);
        case K_FLOAT: {  // the shortest %g that reads back as the same float (9 digits always do)
            const float v = *(const float*)p;
            char b[40];
            for (int d = 6; d <= 9; d++) {
                snprintf(b, sizeof b, "%.*g", d, (double)v);
                if ((float)strtod(b, NULL) == v) break;
            }
            return fprintf(f, "%s", b);
        }
        case K_BOOL: return fprintf(f, "%s", *(const int*)p ? "true" : "false");
        case K_STR: {
            char q[6 * CFG_STR + 8];
            quote(p, q, sizeof q);
            return fprintf(f, "%s", q);
        }
        case K_ENUM: enum_name(k->enums, *(const int*)p, nm, sizeof nm); return fprintf(f, "%s", nm);
    }
    return 0;
}

void config_print(const Config* c, FILE* f) {
    fprintf(f, "# moetrain %s resolved config%s%s\n", MOETRAIN_VERSION, c->source[0] ? " from " : "", c->source);
    size_t cur = 0;
    const char* prev = "";
    for (int i = 0; i < NKEYS; i++) {
        const ConfigKey* k = &KEYS[i];
        const char* dot = strchr(k->name, '.');
        size_t sl = (size_t)(dot - k->name);
        if (sl != cur || strncmp(prev, k->name, sl)) fprintf(f, "%.*s:\n", (int)sl, k->name);
        prev = k->name;
        cur = sl;
        int w = fprintf(f, "  %s: ", dot + 1);
        w += print_value(c, k, f);
        fprintf(f, "%*s# %s\n", w < 34 ? 34 - w : 1, "", k->doc);
    }
}

char* config_print_text(const Config* c, size_t* len) {
    char* text = NULL;
    size_t n = 0;
    FILE* f = open_memstream(&text, &n);
    CHECK(f, "open_memstream: %s", strerror(errno));
    config_print(c, f);
    fclose(f);
    if (len) *len = n;
    return text;
}

// Markdown cell text: '|' escaped so it stays in its column.
static void md(FILE* f, const char* s) {
    for (; *s; s++) {
        if (*s == '|') fputc('\\', f);
        fputc(*s, f);
    }
}

void config_print_keys(FILE* f) {
    static const char* tn[] = {"int", "uint64", "float", "bool", "string", "enum"};
    fprintf(f, "| key | type | default | valid values | meaning |\n|---|---|---|---|---|\n");
    for (int i = 0; i < NKEYS; i++) {
        const ConfigKey* k = &KEYS[i];
        char range[160];
        if (k->type == K_INT || k->type == K_FLOAT) range_text(k, range, sizeof range);
        else if (k->type == K_U64) snprintf(range, sizeof range, "0 to 2^64-1");
        else if (k->type == K_BOOL) snprintf(range, sizeof range, "true, false");
        else if (k->type == K_ENUM) enum_list(k->enums, range, sizeof range);
        else snprintf(range, sizeof range, "text");
        fprintf(f, "| `%s` | %s | `%s` | %s | ", k->name, tn[k->type], k->type == K_STR ? (k->def[0] ? k->def : "\"\"") : k->def,
                range);
        md(f, k->doc);
        fprintf(f, " |\n");
    }
}
