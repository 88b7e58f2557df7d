// hf.c — Hugging Face export: config.json, sharded safetensors, index (see hf.h). Reading is
// in hf_read.c.
#define _GNU_SOURCE
#include "hf.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_internal.h"
#include "minijson.h"
#include "params.h"
#include "safetensors.h"

// Position of a tensor in the published Mixtral order (transformers' state_dict order).
static int64_t order_key(const ParamInfo* p, const ModelConfig* m) {
    const int64_t per_layer = 8 + 3 * (int64_t)m->experts;
    if (p->layer < 0) {
        if (!strcmp(p->name, "model.embed_tokens.weight")) return 0;
        if (!strcmp(p->name, "model.norm.weight")) return 1 + m->layers * per_layer;
        return 2 + m->layers * per_layer;  // lm_head
    }
    int64_t k;
    if (strstr(p->name, ".q_proj.")) k = 0;
    else if (strstr(p->name, ".k_proj.")) k = 1;
    else if (strstr(p->name, ".v_proj.")) k = 2;
    else if (strstr(p->name, ".o_proj.")) k = 3;
    else if (strstr(p->name, ".gate.")) k = 4;
    else if (p->expert >= 0) k = 5 + 3 * (int64_t)p->expert + (strstr(p->name, ".w1.") ? 0 : strstr(p->name, ".w2.") ? 1 : 2);
    else if (strstr(p->name, "input_layernorm")) k = 5 + 3 * (int64_t)m->experts;
    else k = 6 + 3 * (int64_t)m->experts;  // post_attention_layernorm
    return 1 + p->layer * per_layer + k;
}

typedef struct Keyed {
    int64_t key;
    int i;
} Keyed;

static int cmp_keyed(const void* a, const void* b) {
    const Keyed *x = a, *y = b;
    return x->key < y->key ? -1 : x->key > y->key;
}

int hf_tensor_list(const ModelConfig* m, HfTensorSpec** out) {
    ParamLayout pl;
    params_build(&pl, m, 1, 0);
    Keyed* k = xmalloc(sizeof(Keyed) * (size_t)pl.n);
    for (int i = 0; i < pl.n; i++) k[i] = (Keyed){order_key(&pl.p[i], m), i};
    qsort(k, (size_t)pl.n, sizeof *k, cmp_keyed);
    HfTensorSpec* s = xcalloc((size_t)pl.n, sizeof *s);
    for (int i = 0; i < pl.n; i++) {
        const ParamInfo* p = &pl.p[k[i].i];
        ckpt_copy(s[i].name, sizeof s[i].name, p->name);
        s[i].ndim = p->ndim;
        s[i].shape[0] = p->shape[0];
        s[i].shape[1] = p->ndim > 1 ? p->shape[1] : 0;
    }
    int n = pl.n;
    free(k);
    params_free(&pl);
    *out = s;
    return n;
}

// ---- config.json ------------------------------------------------------------------------------
static void kv_int(Sb* b, const char* k, long long v) { sb_printf(b, "  \"%s\": %lld,\n", k, v); }
static void kv_float(Sb* b, const char* k, float v) {
    sb_printf(b, "  \"%s\": ", k);
    sb_json_float(b, v);
    sb_printf(b, ",\n");
}

int hf_write_config(const ModelConfig* m, const char* out_dir, DType dtype, Err* e) {
    return hf_write_config_ids(m, out_dir, dtype, NULL, e);
}

static void kv_id(Sb* b, const char* k, int v) {
    if (v >= 0) sb_printf(b, "  \"%s\": %d,\n", k, v);
    else sb_printf(b, "  \"%s\": null,\n", k);
}

int hf_write_config_ids(const ModelConfig* m, const char* out_dir, DType dtype, const HfTokenIds* ids, Err* e) {
    const char* td = dtype == DTYPE_BF16 ? "bfloat16" : "float32";
    const int byte_vocab = m->vocab_size == 256;
    Sb b = {0};
    sb_printf(&b, "{\n  \"architectures\": [\"MixtralForCausalLM\"],\n  \"model_type\": \"mixtral\",\n");
    kv_int(&b, "vocab_size", m->vocab_size);
    kv_int(&b, "hidden_size", m->hidden);
    kv_int(&b, "intermediate_size", m->ffn);
    kv_int(&b, "num_hidden_layers", m->layers);
    kv_int(&b, "num_attention_heads", m->heads);
    kv_int(&b, "num_key_value_heads", m->kv_heads);
    kv_int(&b, "head_dim", m->hidden / m->heads);
    kv_int(&b, "num_local_experts", m->experts);
    kv_int(&b, "num_experts_per_tok", m->top_k);
    kv_int(&b, "max_position_embeddings", m->max_seq);
    kv_float(&b, "rope_theta", m->rope_theta);
    sb_printf(&b, "  \"rope_parameters\": {\"rope_theta\": ");
    sb_json_float(&b, m->rope_theta);
    sb_printf(&b, ", \"rope_type\": \"default\"},\n");
    kv_float(&b, "rms_norm_eps", m->rms_eps);
    kv_float(&b, "router_aux_loss_coef", m->aux_coef);
    kv_float(&b, "initializer_range", m->init_std);
    sb_printf(&b, "  \"router_jitter_noise\": 0.0,\n  \"output_router_logits\": false,\n");
    sb_printf(&b, "  \"tie_word_embeddings\": false,\n  \"hidden_act\": \"silu\",\n  \"attention_dropout\": 0.0,\n");
    sb_printf(&b, "  \"sliding_window\": null,\n  \"use_cache\": true,\n");
    if (ids) {
        kv_id(&b, "bos_token_id", ids->bos);
        kv_id(&b, "eos_token_id", ids->eos);
        kv_id(&b, "pad_token_id", ids->pad);
    } else if (byte_vocab) {
        sb_printf(&b, "  \"bos_token_id\": null,\n  \"eos_token_id\": null,\n  \"pad_token_id\": null,\n");
    } else {
        sb_printf(&b, "  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n  \"pad_token_id\": null,\n");
    }
    sb_printf(&b, "  \"torch_dtype\": \"%s\",\n  \"dtype\": \"%s\"\n}\n", td, td);
    char p[CKPT_PATH];
    ckpt_join(p, out_dir, "config.json");
    int rc = ckpt_write_file(p, b.s, b.len, NULL, e);
    sb_free(&b);
    return rc;
}

// ---- export -----------------------------------------------------------------------------------
typedef struct Src {
    const Ckpt* ck;
    const HfTensorSpec* spec;
} Src;

static int fill(void* ctx, int tag, float* dst, uint64_t numel, Err* e) {
    const Src* s = ctx;
    const HfTensorSpec* t = &s->spec[tag];
    return ckpt_read(s->ck, t->name, dst, t->ndim, t->shape, e);
}

static int mkdirs(const char* path, Err* e) {
    char buf[CKPT_PATH];
    ckpt_copy(buf, sizeof buf, path);
    for (char* p = buf + 1;; p++) {
        if (*p != '/' && *p) continue;
        char c = *p;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST) return err_set(e, "%s: cannot create directory: %s", buf, strerror(errno));
        *p = c;
        if (!c) return 0;
    }
}

// Model files of an earlier export into the same directory would confuse loaders.
static void remove_old_shards(const char* dir) {
    DIR* d = opendir(dir);
    if (!d) return;
    struct dirent* de;
    char p[CKPT_PATH];
    while ((de = readdir(d))) {
        int a, b;
        char tail[4];
        int shard = sscanf(de->d_name, "model-%5d-of-%5d.safetensor%1s", &a, &b, tail) == 3 && strlen(de->d_name) == 32;
        if (shard || !strcmp(de->d_name, "model.safetensors") || !strcmp(de->d_name, "model.safetensors.index.json")) {
            ckpt_join(p, dir, de->d_name);
            unlink(p);
        }
    }
    closedir(d);
}

typedef struct Entry {
    const char* name;
    int shard;
} Entry;

static int cmp_entry(const void* a, const void* b) { return strcmp(((const Entry*)a)->name, ((const Entry*)b)->name); }

// The checkpoint holds spec's tensor, with the shape of the config.
static int check_tensor(const Ckpt* ck, const HfTensorSpec* spec, Err* e) {
    int nd;
    int64_t sh[8];
    if (ckpt_tensor_shape(ck, spec->name, &nd, sh))
        return err_set(e, "%s: no tensor '%s': the checkpoint does not hold the model of this config", ckpt_dir(ck),
                       spec->name);
    if (nd != spec->ndim || sh[0] != spec->shape[0] || (nd > 1 && sh[1] != spec->shape[1])) {
        char a[128], b[128];
        st_shape_str(a, sizeof a, nd, sh);
        st_shape_str(b, sizeof b, spec->ndim, spec->shape);
        return err_set(e, "%s: shape %s in the checkpoint, %s in the config", spec->name, a, b);
    }
    return 0;
}

// Every tensor checked against the checkpoint and given its shard (shard[i]): in order, a new
// shard where the current one would pass max_shard_bytes. *nshards shards, *total bytes in all.
static int plan_shards(const Ckpt* ck, const HfTensorSpec* spec, int n, uint64_t es, uint64_t max_shard_bytes,
                       int* shard, int* nshards, uint64_t* total, Err* e) {
    int rc = 0;
    uint64_t cur = 0;
    for (int i = 0; i < n && !rc; i++) {
        rc = check_tensor(ck, &spec[i], e);
        uint64_t bytes = (uint64_t)spec[i].shape[0] * (uint64_t)(spec[i].ndim > 1 ? spec[i].shape[1] : 1) * es;
        if (*nshards == 0 || (cur > 0 && cur + bytes > max_shard_bytes)) ++*nshards, cur = 0;
        shard[i] = *nshards - 1;
        cur += bytes;
        *total += bytes;
    }
    return rc;
}

// The shard files model-0000K-of-0000N.safetensors (their names into fname[nshards]), each
// tensor read from the checkpoint and converted to sd as it is written.
static int write_shards(const Ckpt* ck, const HfTensorSpec* spec, const int* shard, int n, int nshards, StDtype sd,
                        const char* out_dir, char** fname, Err* e) {
    int rc = 0;
    Src src = {ck, spec};
    for (int s = 0, i = 0; s < nshards && !rc; s++) {
        fname[s] = xmalloc(64);
        snprintf(fname[s], 64, "model-%05d-of-%05d.safetensors", s + 1, nshards);
        StWriter* w = st_writer_new();
        st_writer_meta(w, "format", "pt");
        for (; i < n && shard[i] == s && !rc; i++)
            rc = st_writer_add_fn(w, spec[i].name, sd, spec[i].ndim, spec[i].shape, fill, &src, i, e);
        char p[CKPT_PATH];
        ckpt_join(p, out_dir, fname[s]);
        if (!rc) rc = st_writer_write(w, p, NULL, e);
        st_writer_free(w);
    }
    return rc;
}

// model.safetensors.index.json: the total size and every tensor's shard file, the keys sorted as
// transformers writes them.
static int write_index(const HfTensorSpec* spec, const int* shard, int n, char* const* fname, uint64_t total,
                       const char* out_dir, Err* e) {
    Sb b = {0};
    sb_printf(&b, "{\n  \"metadata\": {\n    \"total_size\": %llu\n  },\n  \"weight_map\": {\n", (unsigned long long)total);
    Entry* en = xmalloc(sizeof(Entry) * (size_t)n);
    for (int i = 0; i < n; i++) en[i] = (Entry){spec[i].name, shard[i]};
    qsort(en, (size_t)n, sizeof *en, cmp_entry);
    for (int i = 0; i < n; i++) {
        sb_printf(&b, "    ");
        sb_json_str(&b, en[i].name);
        sb_printf(&b, ": \"%s\"%s\n", fname[en[i].shard], i + 1 < n ? "," : "");
    }
    free(en);
    sb_printf(&b, "  }\n}\n");
    char p[CKPT_PATH];
    ckpt_join(p, out_dir, "model.safetensors.index.json");
    int rc = ckpt_write_file(p, b.s, b.len, NULL, e);
    sb_free(&b);
    return rc;
}

int hf_export_ex(const Ckpt* ck, const ModelConfig* m, const char* out_dir, DType dtype, uint64_t max_shard_bytes,
                 Err* e) {
    HfTensorSpec* spec;
    const int n = hf_tensor_list(m, &spec);
    const StDtype sd = dtype == DTYPE_BF16 ? ST_BF16 : ST_F32;
    int* shard = xcalloc((size_t)n, sizeof(int));
    int nshards = 0;
    uint64_t total = 0;
    // Everything the export needs is in the checkpoint, with the shapes of the config.
    int rc = plan_shards(ck, spec, n, st_dtype_size(sd), max_shard_bytes, shard, &nshards, &total, e);
    if (!rc) rc = mkdirs(out_dir, e);
    if (!rc) {
        remove_old_shards(out_dir);
        rc = hf_write_config(m, out_dir, dtype, e);
    }
    char** fname = xcalloc((size_t)nshards, sizeof(char*));
    if (!rc) rc = write_shards(ck, spec, shard, n, nshards, sd, out_dir, fname, e);
    if (!rc) rc = write_index(spec, shard, n, fname, total, out_dir, e);
    if (!rc) rc = ckpt_fsync_dir(out_dir, e);
    for (int s = 0; s < nshards; s++) free(fname[s]);
    free(fname);
    free(shard);
    free(spec);
    return rc;
}

int hf_export(const Ckpt* ck, const ModelConfig* m, const char* out_dir, DType dtype, Err* e) {
    return hf_export_ex(ck, m, out_dir, dtype, HF_MAX_SHARD_BYTES, e);
}
