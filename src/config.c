// config.c — YAML configs (libyaml) with `defaults:` chains and `section.key=value` overrides.
// One table of keys drives defaults, parsing, validation, printing and the README key table.
#define _DEFAULT_SOURCE
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#ifndef MOETRAIN_PREFIX
#define MOETRAIN_PREFIX "/usr/local"
#endif

typedef enum { K_INT, K_U64, K_FLOAT, K_BOOL, K_STR, K_ENUM } KeyType;

typedef struct Key {
    const char* name;   // "section.key"
    KeyType type;
    size_t off;         // offset into Config
    const char* def;    // default, as text
    double lo, hi;      // range for numbers
    const char* enums;  // "a|b|c" for K_ENUM (value = index)
    const char* doc;
} Key;

#define O(f) offsetof(Config, f)
static const Key KEYS[] = {
    {"model.vocab_size", K_INT, O(model.vocab_size), "256", 2, 1 << 24, 0, "vocabulary size (256 = byte-level sequences)"},
    {"model.hidden", K_INT, O(model.hidden), "64", 8, 65536, 0, "model width (hidden_size)"},
    {"model.ffn", K_INT, O(model.ffn), "128", 8, 1 << 20, 0, "expert FFN width (intermediate_size)"},
    {"model.layers", K_INT, O(model.layers), "2", 1, 1024, 0, "decoder layers"},
    {"model.heads", K_INT, O(model.heads), "4", 1, 1024, 0, "attention (query) heads"},
    {"model.kv_heads", K_INT, O(model.kv_heads), "2", 1, 1024, 0, "key/value heads (GQA)"},
    {"model.experts", K_INT, O(model.experts), "4", 1, 64, 0, "experts per MoE layer"},
    {"model.top_k", K_INT, O(model.top_k), "2", 1, 64, 0, "experts per token"},
    {"model.max_seq", K_INT, O(model.max_seq), "4096", 1, 1 << 24, 0, "max_position_embeddings written to config.json"},
    {"model.rope_theta", K_FLOAT, O(model.rope_theta), "1000000", 1, 1e12, 0, "RoPE base"},
    {"model.rms_eps", K_FLOAT, O(model.rms_eps), "1e-5", 1e-12, 1, 0, "RMSNorm epsilon"},
    {"model.init_std", K_FLOAT, O(model.init_std), "0.02", 0, 10, 0, "std of the normal init (initializer_range)"},
    {"model.aux_coef", K_FLOAT, O(model.aux_coef), "0.02", 0, 100, 0, "load-balancing loss coefficient (router_aux_loss_coef)"},
    {"model.z_coef", K_FLOAT, O(model.z_coef), "0", 0, 100, 0, "router z-loss coefficient (0 = off)"},
    {"model.tie_embeddings", K_BOOL, O(model.tie_embeddings), "false", 0, 1, 0, "must be false: Mixtral's lm_head is untied"},
    {"parallel.ep", K_INT, O(parallel.ep), "1", 1, 4096, 0, "expert-parallel group size (divides the world and model.experts)"},
    {"parallel.zero1", K_BOOL, O(parallel.zero1), "true", 0, 1, 0, "shard optimizer state over data-parallel ranks (ZeRO-1)"},
    {"precision.dtype", K_ENUM, O(precision.dtype), "bf16", 0, 0, "fp32|bf16", "weights/activations on GPUs (fp32 masters always; the CPU computes in fp32)"},
    {"train.steps", K_INT, O(train.steps), "100", 0, INT_MAX, 0, "optimizer steps"},
    {"train.micro_batch", K_INT, O(train.micro_batch), "8", 1, 1 << 20, 0, "sequences per rank per forward/backward"},
    {"train.global_batch", K_INT, O(train.global_batch), "16", 1, 1 << 30, 0, "sequences per optimizer step over all ranks (accumulation fills the gap)"},
    {"train.seq_len", K_INT, O(train.seq_len), "128", 2, 1 << 24, 0, "tokens per sequence"},
    {"train.seed", K_U64, O(train.seed), "1234", 0, 0, 0, "seed for init, shuffling and random data"},
    {"train.device", K_ENUM, O(train.device), "auto", 0, 0, "auto|cpu|cuda", "backend: auto = CUDA when a GPU is visible"},
    {"train.max_bad_steps", K_INT, O(train.max_bad_steps), "5", 1, INT_MAX, 0, "non-finite steps in a row before the run stops"},
    {"train.eval_every", K_INT, O(train.eval_every), "0", 0, INT_MAX, 0, "validation every N steps (0 = at the end only)"},
    {"train.eval_batches", K_INT, O(train.eval_batches), "4", 0, INT_MAX, 0, "validation micro-batches per rank (0 = the whole split)"},
    {"optim.lr", K_FLOAT, O(optim.lr), "3e-4", 0, 10, 0, "peak learning rate"},
    {"optim.min_lr_ratio", K_FLOAT, O(optim.min_lr_ratio), "0.1", 0, 1, 0, "final lr as a fraction of optim.lr"},
    {"optim.warmup", K_INT, O(optim.warmup), "100", 0, INT_MAX, 0, "linear warmup steps"},
    {"optim.schedule", K_ENUM, O(optim.schedule), "cosine", 0, 0, "cosine|linear|constant|wsd", "decay after warmup"},
    {"optim.decay_frac", K_FLOAT, O(optim.decay_frac), "0.2", 0, 1, 0, "wsd: fraction of post-warmup steps in the final decay"},
    {"optim.beta1", K_FLOAT, O(optim.beta1), "0.9", 0, 0.999999, 0, "AdamW beta1"},
    {"optim.beta2", K_FLOAT, O(optim.beta2), "0.95", 0, 0.999999, 0, "AdamW beta2"},
    {"optim.eps", K_FLOAT, O(optim.eps), "1e-8", 0, 1, 0, "AdamW epsilon"},
    {"optim.weight_decay", K_FLOAT, O(optim.weight_decay), "0.1", 0, 10, 0, "decoupled weight decay"},
    {"optim.decay_norms", K_BOOL, O(optim.decay_norms), "false", 0, 1, 0, "apply weight decay to norm weights too"},
    {"optim.clip", K_FLOAT, O(optim.clip), "1.0", 0, 1e9, 0, "global gradient-norm clip (0 = off)"},
    {"data.path", K_STR, O(data.path), "", 0, 0, 0, "FASTA/FASTQ/text (.gz ok) or llm.c .bin; empty = shipped data/hairpin.fa.gz"},
    {"data.format", K_ENUM, O(data.format), "auto", 0, 0, "auto|fasta|fastq|text|bin|random", "input format (random = uniform tokens, for benchmarks)"},
    {"data.val_frac", K_FLOAT, O(data.val_frac), "0.05", 0, 0.9, 0, "fraction of records held out for validation"},
    {"data.sep_token", K_INT, O(data.sep_token), "10", 0, 1 << 24, 0, "token between records"},
    {"data.shuffle", K_BOOL, O(data.shuffle), "true", 0, 1, 0, "shuffle training windows per epoch (by train.seed)"},
    {"checkpoint.dir", K_STR, O(checkpoint.dir), "", 0, 0, 0, "checkpoint root (empty = no checkpoints)"},
    {"checkpoint.every", K_INT, O(checkpoint.every), "0", 0, INT_MAX, 0, "steps between saves (0 = at the end only)"},
    {"checkpoint.keep", K_INT, O(checkpoint.keep), "3", 0, INT_MAX, 0, "complete checkpoints kept (0 = all)"},
    {"checkpoint.resume", K_STR, O(checkpoint.resume), "none", 0, 0, 0, "none | auto (latest under checkpoint.dir) | a step directory"},
    {"checkpoint.init_from", K_STR, O(checkpoint.init_from), "", 0, 0, 0, "Hugging Face directory to start from (empty = random init)"},
    {"checkpoint.required", K_BOOL, O(checkpoint.required), "false", 0, 1, 0, "refuse to start without checkpoint.dir (large runs)"},
    {"log.dir", K_STR, O(log.dir), "", 0, 0, 0, "where metrics.jsonl and config.yaml go (empty = none)"},
    {"log.every", K_INT, O(log.every), "1", 1, INT_MAX, 0, "log a line every N steps"},
};
#undef O
#define NKEYS (int)(sizeof KEYS / sizeof KEYS[0])

static const char* SECTIONS[] = {"model", "parallel", "precision", "train", "optim", "data", "checkpoint", "log"};
#define NSECTIONS (int)(sizeof SECTIONS / sizeof SECTIONS[0])

const char* dtype_name(DType d) { return d == DTYPE_BF16 ? "bf16" : "fp32"; }

static const Key* find_key(const char* name) {
    for (int i = 0; i < NKEYS; i++)
        if (strcmp(KEYS[i].name, name) == 0) return &KEYS[i];
    return NULL;
}

static const char* nearest_key(const char* name) {
    const char* best = KEYS[0].name;
    int bd = 1 << 30;
    for (int i = 0; i < NKEYS; i++) {
        int d = edit_distance(name, KEYS[i].name);
        const char* dot = strchr(KEYS[i].name, '.');
        int d2 = dot ? edit_distance(name, dot + 1) + 1 : d;  // a key without its section
        if (d2 < d) d = d2;
        if (d < bd) bd = d, best = KEYS[i].name;
    }
    return best;
}

// Parses `text` for key k into c. `where` prefixes errors ("file.yaml:3:5" or "command line").
static int set_value(Config* c, const Key* k, const char* text, const char* where, Err* e) {
    char* p = (char*)c + k->off;
    char* end = NULL;
    switch (k->type) {
        case K_INT: {
            errno = 0;
            long long v = strtoll(text, &end, 10);
            if (!*text || *end || errno)
                return err_set(e, "%s: %s: expected an integer, got '%s'", where, k->name, text);
            if ((double)v < k->lo || (double)v > k->hi)
                return err_set(e, "%s: %s: %lld is out of range [%.0f, %.0f]", where, k->name, v, k->lo, k->hi);
            *(int*)p = (int)v;
            return 0;
        }
        case K_U64: {
            errno = 0;
            unsigned long long v = strtoull(text, &end, 10);
            if (!*text || *end || errno || text[0] == '-')
                return err_set(e, "%s: %s: expected a non-negative integer, got '%s'", where, k->name, text);
            *(uint64_t*)p = (uint64_t)v;
            return 0;
        }
        case K_FLOAT: {
            errno = 0;
            double v = strtod(text, &end);
            if (!*text || *end || errno || v != v)
                return err_set(e, "%s: %s: expected a number, got '%s'", where, k->name, text);
            if (v < k->lo || v > k->hi)
                return err_set(e, "%s: %s: %g is out of range [%g, %g]", where, k->name, v, k->lo, k->hi);
            *(float*)p = (float)v;
            return 0;
        }
        case K_BOOL: {
            if (!strcasecmp(text, "true") || !strcasecmp(text, "yes") || !strcmp(text, "1") || !strcasecmp(text, "on"))
                *(int*)p = 1;
            else if (!strcasecmp(text, "false") || !strcasecmp(text, "no") || !strcmp(text, "0") || !strcasecmp(text, "off"))
                *(int*)p = 0;
            else
                return err_set(e, "%s: %s: expected true or false, got '%s'", where, k->name, text);
            return 0;
        }
        case K_STR: {
            if (strlen(text) >= CFG_STR)
                return err_set(e, "%s: %s: value longer than %d characters", where, k->name, CFG_STR - 1);
            snprintf(p, CFG_STR, "%s", text);
            return 0;
        }
        case K_ENUM: {
            const char* s = k->enums;
            int idx = 0;
            size_t n = strlen(text);
            while (*s) {
                const char* bar = strchr(s, '|');
                size_t len = bar ? (size_t)(bar - s) : strlen(s);
                if (len == n && strncmp(s, text, n) == 0) {
                    *(int*)p = idx;
                    return 0;
                }
                idx++;
                s += len + (bar ? 1 : 0);
            }
            return err_set(e, "%s: %s: '%s' is not one of %s", where, k->name, text, k->enums);
        }
    }
    return err_set(e, "%s: %s: internal error (key type)", where, k->name);
}

void config_defaults(Config* c) {
    memset(c, 0, sizeof *c);
    Err e;
    for (int i = 0; i < NKEYS; i++)
        if (set_value(c, &KEYS[i], KEYS[i].def, "defaults", &e)) FATAL("%s", e.msg);
}

static int file_exists(const char* p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

// Directory of the running binary's parent (build/moetrain → repo root), or "".
static void exe_root(char* out, size_t n) {
    char buf[4096];
    ssize_t len = readlink("/proc/self/exe", buf, sizeof buf - 1);
    out[0] = 0;
    if (len <= 0) return;
    buf[len] = 0;
    for (int up = 0; up < 2; up++) {
        char* s = strrchr(buf, '/');
        if (!s) return;
        *s = 0;
    }
    snprintf(out, n, "%s", buf);
}

int config_find_file(const char* kind, const char* name, const char* ext, char* out, size_t n, Err* e) {
    char cand[7][4700];
    int nc = 0;
    char root[4096];
    exe_root(root, sizeof root);
    snprintf(cand[nc++], sizeof cand[0], "%s", name);
    snprintf(cand[nc++], sizeof cand[0], "%s%s", name, ext);
    if (!strchr(name, '/')) {
        snprintf(cand[nc++], sizeof cand[0], "%s/%s%s", kind, name, ext);
        if (root[0]) snprintf(cand[nc++], sizeof cand[0], "%.4000s/%s/%s%s", root, kind, name, ext);
        if (root[0]) snprintf(cand[nc++], sizeof cand[0], "%.4000s/share/moetrain/%s/%s%s", root, kind, name, ext);
        snprintf(cand[nc++], sizeof cand[0], "%s/share/moetrain/%s/%s%s", MOETRAIN_PREFIX, kind, name, ext);
    }
    for (int i = 0; i < nc; i++)
        if (file_exists(cand[i])) {
            snprintf(out, n, "%s", cand[i]);
            return 0;
        }
    char tried[2048] = "";
    for (int i = 0; i < nc; i++) {
        strncat(tried, i ? ", " : "", sizeof tried - strlen(tried) - 1);
        strncat(tried, cand[i], sizeof tried - strlen(tried) - 1);
    }
    return err_set(e, "%s not found (looked for %s)", name, tried);
}

int config_find(const char* name, char* out, size_t out_size, Err* e) {
    return config_find_file("configs", name, ".yaml", out, out_size, e);
}

// ---- YAML ------------------------------------------------------------------------------------

typedef struct Parse {
    yaml_parser_t p;
    yaml_event_t ev;
    const char* file;
    Err* e;
} Parse;

static int next(Parse* ps) {
    if (!yaml_parser_parse(&ps->p, &ps->ev))
        return err_set(ps->e, "%s:%zu:%zu: YAML syntax error: %s%s%s", ps->file, ps->p.problem_mark.line + 1,
                       ps->p.problem_mark.column + 1, ps->p.problem ? ps->p.problem : "unknown",
                       ps->p.context ? " " : "", ps->p.context ? ps->p.context : "");
    return 0;
}

static int load_depth(Config* c, const char* path, int depth, Err* e);

static int load_defaults(Config* c, const char* name, const char* from, int depth, Err* e) {
    char dir[CFG_STR], p[CFG_STR * 2 + 8], found[CFG_STR];
    snprintf(dir, sizeof dir, "%s", from);
    char* s = strrchr(dir, '/');
    if (s) *s = 0; else snprintf(dir, sizeof dir, ".");
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (file_exists(p)) return load_depth(c, p, depth + 1, e);
    snprintf(p, sizeof p, "%s/%s.yaml", dir, name);
    if (file_exists(p)) return load_depth(c, p, depth + 1, e);
    Err fe;
    if (config_find(name, found, sizeof found, &fe)) return err_set(e, "%s: defaults: %s", from, fe.msg);
    return load_depth(c, found, depth + 1, e);
}

static int scalar_is(const yaml_event_t* ev, const char* s) {
    return ev->type == YAML_SCALAR_EVENT && strcmp((const char*)ev->data.scalar.value, s) == 0;
}

static int load_depth(Config* c, const char* path, int depth, Err* e) {
    if (depth > 8) return err_set(e, "%s: defaults nest deeper than 8 levels (a cycle?)", path);
    FILE* f = fopen(path, "rb");
    if (!f) return err_set(e, "cannot open config %s: %s", path, strerror(errno));
    Parse ps = {.file = path, .e = e};
    yaml_parser_initialize(&ps.p);
    yaml_parser_set_input_file(&ps.p, f);
    int rc = -1, state = 0;  // 0 top, 1 inside section mapping
    char section[64] = "", key[160];
    int have_event = 0;
    for (;;) {
        if (next(&ps)) goto out;
        have_event = 1;
        yaml_event_type_t t = ps.ev.type;
        size_t line = ps.ev.start_mark.line + 1, col = ps.ev.start_mark.column + 1;
        if (t == YAML_STREAM_END_EVENT) break;
        if (t == YAML_STREAM_START_EVENT || t == YAML_DOCUMENT_START_EVENT || t == YAML_DOCUMENT_END_EVENT) goto cont;
        if (state == 0) {
            if (t == YAML_MAPPING_START_EVENT && section[0] == 0 && depth >= 0) {
                state = 2;  // top-level mapping opened
                goto cont;
            }
            err_set(e, "%s:%zu:%zu: a config is a mapping of sections (model:, train:, ...)", path, line, col);
            goto out;
        }
        if (state == 2) {  // expecting a section name or end
            if (t == YAML_MAPPING_END_EVENT) { state = 3; goto cont; }
            if (t != YAML_SCALAR_EVENT) { err_set(e, "%s:%zu:%zu: expected a section name", path, line, col); goto out; }
            if (scalar_is(&ps.ev, "defaults")) {
                yaml_event_delete(&ps.ev);
                have_event = 0;
                if (next(&ps)) goto out;
                have_event = 1;
                if (ps.ev.type == YAML_SCALAR_EVENT) {
                    char name[CFG_STR];
                    snprintf(name, sizeof name, "%s", (const char*)ps.ev.data.scalar.value);
                    if (load_defaults(c, name, path, depth, e)) goto out;
                } else if (ps.ev.type == YAML_SEQUENCE_START_EVENT) {
                    for (;;) {
                        yaml_event_delete(&ps.ev);
                        have_event = 0;
                        if (next(&ps)) goto out;
                        have_event = 1;
                        if (ps.ev.type == YAML_SEQUENCE_END_EVENT) break;
                        if (ps.ev.type != YAML_SCALAR_EVENT) { err_set(e, "%s:%zu: defaults: expected config names", path, line); goto out; }
                        char name[CFG_STR];
                        snprintf(name, sizeof name, "%s", (const char*)ps.ev.data.scalar.value);
                        if (load_defaults(c, name, path, depth, e)) goto out;
                    }
                } else {
                    err_set(e, "%s:%zu:%zu: defaults: expected a config name or a list of names", path, line, col);
                    goto out;
                }
                goto cont;
            }
            snprintf(section, sizeof section, "%s", (const char*)ps.ev.data.scalar.value);
            int ok = 0;
            for (int i = 0; i < NSECTIONS; i++) ok |= strcmp(section, SECTIONS[i]) == 0;
            if (!ok) {
                err_set(e, "%s:%zu:%zu: unknown section '%s' (sections: model, parallel, precision, train, optim, data, checkpoint, log; or defaults)",
                        path, line, col, section);
                goto out;
            }
            yaml_event_delete(&ps.ev);
            have_event = 0;
            if (next(&ps)) goto out;
            have_event = 1;
            if (ps.ev.type != YAML_MAPPING_START_EVENT) {
                err_set(e, "%s:%zu:%zu: section '%s' must be a mapping of keys", path, ps.ev.start_mark.line + 1,
                        ps.ev.start_mark.column + 1, section);
                goto out;
            }
            state = 1;
            goto cont;
        }
        if (state == 1) {  // inside a section: key, value pairs
            if (t == YAML_MAPPING_END_EVENT) { state = 2; goto cont; }
            if (t != YAML_SCALAR_EVENT) { err_set(e, "%s:%zu:%zu: expected a key in section '%s'", path, line, col, section); goto out; }
            snprintf(key, sizeof key, "%s.%s", section, (const char*)ps.ev.data.scalar.value);
            const Key* k = find_key(key);
            if (!k) {
                err_set(e, "%s:%zu:%zu: unknown key '%s' (did you mean %s?)", path, line, col, key, nearest_key(key));
                goto out;
            }
            yaml_event_delete(&ps.ev);
            have_event = 0;
            if (next(&ps)) goto out;
            have_event = 1;
            if (ps.ev.type != YAML_SCALAR_EVENT) {
                err_set(e, "%s:%zu:%zu: %s: expected a single value", path, ps.ev.start_mark.line + 1, ps.ev.start_mark.column + 1, key);
                goto out;
            }
            char where[CFG_STR + 32];
            snprintf(where, sizeof where, "%s:%zu:%zu", path, ps.ev.start_mark.line + 1, ps.ev.start_mark.column + 1);
            const char* v = (const char*)ps.ev.data.scalar.value;
            if (k->type != K_STR && ps.ev.data.scalar.length == 0 && ps.ev.data.scalar.plain_implicit) {
                err_set(e, "%s: %s: missing value", where, key);
                goto out;
            }
            if (set_value(c, k, v, where, e)) goto out;
            goto cont;
        }
        if (state == 3) {
            err_set(e, "%s:%zu:%zu: one YAML document per config", path, line, col);
            goto out;
        }
    cont:
        yaml_event_delete(&ps.ev);
        have_event = 0;
    }
    if (state == 0) {
        rc = 0;  // empty file: nothing to set
        goto out;
    }
    rc = 0;
out:
    if (have_event) yaml_event_delete(&ps.ev);
    yaml_parser_delete(&ps.p);
    fclose(f);
    return rc;
}

int config_load_file(Config* c, const char* path, Err* e) {
    int rc = load_depth(c, path, 0, e);
    if (rc == 0 && !c->source[0]) snprintf(c->source, sizeof c->source, "%s", path);
    return rc;
}

int config_override(Config* c, const char* kv, Err* e) {
    const char* eq = strchr(kv, '=');
    if (!eq || eq == kv) return err_set(e, "command line: '%s' is not section.key=value", kv);
    char key[160];
    size_t n = (size_t)(eq - kv);
    if (n >= sizeof key) return err_set(e, "command line: key too long in '%s'", kv);
    memcpy(key, kv, n);
    key[n] = 0;
    const Key* k = find_key(key);
    if (!k) return err_set(e, "command line: unknown key '%s' (did you mean %s?)", key, nearest_key(key));
    return set_value(c, k, eq + 1, "command line", e);
}

int config_validate_run(const Config* c, Err* e) {
    if (c->checkpoint.required && !c->checkpoint.dir[0])
        return err_set(e, "%s: this config needs a checkpoint directory: add checkpoint.dir=/path/to/ckpt on the command line",
                       c->source[0] ? c->source : "config");
    if (!strcmp(c->checkpoint.resume, "auto") && !c->checkpoint.dir[0])
        return err_set(e, "%s: checkpoint.resume=auto needs checkpoint.dir", c->source[0] ? c->source : "config");
    if (c->checkpoint.dir[0])
        return err_set(e, "checkpoint.dir=%s: this version cannot write checkpoints yet (they arrive next); "
                          "leave checkpoint.dir empty", c->checkpoint.dir);
    return 0;
}

int config_validate(const Config* c, int world, Err* e) {
    const ModelConfig* m = &c->model;
    const char* src = c->source[0] ? c->source : "config";
    if (m->tie_embeddings) return err_set(e, "%s: model.tie_embeddings must be false (Mixtral's lm_head is untied)", src);
    if (m->hidden % m->heads)
        return err_set(e, "%s: model.hidden (%d) must be a multiple of model.heads (%d)", src, m->hidden, m->heads);
    if ((m->hidden / m->heads) % 2)
        return err_set(e, "%s: head dim model.hidden/model.heads = %d must be even (RoPE rotates pairs)", src, m->hidden / m->heads);
    if (m->heads % m->kv_heads)
        return err_set(e, "%s: model.heads (%d) must be a multiple of model.kv_heads (%d)", src, m->heads, m->kv_heads);
    if (m->top_k > m->experts)
        return err_set(e, "%s: model.top_k (%d) cannot exceed model.experts (%d)", src, m->top_k, m->experts);
    if (c->train.seq_len > m->max_seq)
        return err_set(e, "%s: train.seq_len (%d) exceeds model.max_seq (%d); raise model.max_seq", src, c->train.seq_len, m->max_seq);
    if (c->data.sep_token >= m->vocab_size)
        return err_set(e, "%s: data.sep_token (%d) must be below model.vocab_size (%d)", src, c->data.sep_token, m->vocab_size);
    const int ep = c->parallel.ep;
    if (m->experts % ep)
        return err_set(e, "%s: parallel.ep (%d) must divide model.experts (%d)", src, ep, m->experts);
    if (world % ep)
        return err_set(e, "%s: the world size (%d ranks) must be a multiple of parallel.ep (%d); launch with mpirun -np %d or set parallel.ep=%d",
                       src, world, ep, ep, world < ep ? world : ep);
    const int per_step = c->train.micro_batch * world;
    if (c->train.global_batch % per_step)
        return err_set(e, "%s: train.global_batch (%d) must be a multiple of train.micro_batch × world (%d × %d = %d)",
                       src, c->train.global_batch, c->train.micro_batch, world, per_step);
    if (c->optim.warmup > c->train.steps && c->train.steps > 0)
        return err_set(e, "%s: optim.warmup (%d) is longer than train.steps (%d)", src, c->optim.warmup, c->train.steps);
    if (!c->checkpoint.resume[0])
        return err_set(e, "%s: checkpoint.resume must be none, auto or a path", src);
    return 0;
}

static void print_value(const Config* c, const Key* k, FILE* f) {
    const char* p = (const char*)c + k->off;
    switch (k->type) {
        case K_INT: fprintf(f, "%d", *(const int*)p); break;
        case K_U64: fprintf(f, "%llu", (unsigned long long)*(const uint64_t*)p); break;
        case K_FLOAT: fprintf(f, "%.9g", *(const float*)p); break;
        case K_BOOL: fprintf(f, "%s", *(const int*)p ? "true" : "false"); break;
        case K_STR: {
            fputc('"', f);
            for (const char* s = p; *s; s++) {
                if (*s == '"' || *s == '\\') fputc('\\', f);
                fputc(*s, f);
            }
            fputc('"', f);
            break;
        }
        case K_ENUM: {
            int idx = *(const int*)p, i = 0;
            const char* s = k->enums;
            while (i < idx && strchr(s, '|')) s = strchr(s, '|') + 1, i++;
            const char* bar = strchr(s, '|');
            fprintf(f, "%.*s", bar ? (int)(bar - s) : (int)strlen(s), s);
            break;
        }
    }
}

void config_print(const Config* c, FILE* f) {
    const char* cur = "";
    size_t curlen = 0;
    for (int i = 0; i < NKEYS; i++) {
        const char* dot = strchr(KEYS[i].name, '.');
        size_t sl = (size_t)(dot - KEYS[i].name);
        if (sl != curlen || strncmp(cur, KEYS[i].name, sl)) {
            fprintf(f, "%.*s:\n", (int)sl, KEYS[i].name);
            cur = KEYS[i].name;
            curlen = sl;
        }
        fprintf(f, "  %s: ", dot + 1);
        print_value(c, &KEYS[i], f);
        fputc('\n', f);
    }
}

void config_print_keys(FILE* f) {
    fprintf(f, "| key | type | default | meaning |\n| --- | --- | --- | --- |\n");
    static const char* tn[] = {"int", "int", "float", "bool", "string", "enum"};
    for (int i = 0; i < NKEYS; i++) {
        const Key* k = &KEYS[i];
        char en[128] = "";
        if (k->enums) {
            snprintf(en, sizeof en, ": %s", k->enums);
            for (char* q = en; *q; q++) if (*q == '|') *q = '/';
        }
        fprintf(f, "| `%s` | %s%s | `%s` | %s |\n", k->name, tn[k->type], en, k->def[0] ? k->def : "\"\"", k->doc);
    }
}
