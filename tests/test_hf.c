// test_hf.c — Hugging Face directories: export a checkpoint (fp32 exact, bf16 = rounding,
// sharded, published order, index), read it back, config.json both ways (including a real
// transformers 5 config.json, from the golden fixture's metadata), and the error messages.
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "hf.h"
#include "minijson.h"
#include "params.h"
#include "safetensors.h"
#include "test.h"
#include "util.h"

static void s_gather(Comm* c, GroupId g, void* out, const void* in, size_t n) { memmove(out, in, n); }
static void s_bcast(Comm* c, GroupId g, void* buf, size_t n, int root) {}
static void s_barrier(Comm* c, GroupId g) {}
static Comm g_comm = {.rank = {0, 0, 0}, .size = {1, 1, 1}, .host_all_gather = s_gather, .host_broadcast = s_bcast,
                      .barrier = s_barrier};

static char g_dir[256];
static char g_ck[1024];  // the checkpoint every test exports from

static ModelConfig tiny(void) {
    ModelConfig m = {.vocab_size = 37, .hidden = 16, .ffn = 24, .layers = 2, .heads = 4, .kv_heads = 2, .experts = 4,
                     .top_k = 2, .max_seq = 64, .rope_theta = 1e6f, .rms_eps = 1e-5f, .init_std = 0.02f, .aux_coef = 0.02f};
    return m;
}

// Deterministic values of tensor i, element k.
static float val(int i, size_t k) { return (float)((double)((i * 7919 + (int)k * 104729) % 20011) / 20011.0 - 0.5) * 3.0f; }

static size_t numel(const HfTensorSpec* s) { return (size_t)s->shape[0] * (size_t)(s->ndim > 1 ? s->shape[1] : 1); }

// A checkpoint with every model tensor of the tiny config plus optimizer state.
static void make_ckpt(void) {
    ModelConfig m = tiny();
    HfTensorSpec* spec;
    int n = hf_tensor_list(&m, &spec);
    CkptTensor* t = xcalloc((size_t)(2 * n), sizeof *t);
    char** names = xcalloc((size_t)n, sizeof(char*));
    float** bufs = xcalloc((size_t)n, sizeof(float*));
    for (int i = 0; i < n; i++) {
        bufs[i] = xmalloc(sizeof(float) * numel(&spec[i]));
        for (size_t k = 0; k < numel(&spec[i]); k++) bufs[i][k] = val(i, k);
        t[i] = (CkptTensor){.name = spec[i].name, .ndim = spec[i].ndim, .shape = {spec[i].shape[0], spec[i].shape[1]}, .data = bufs[i]};
        names[i] = xmalloc(128);
        snprintf(names[i], 128, "optim.exp_avg.%s", spec[i].name);
        t[n + i] = t[i];
        t[n + i].name = names[i];
    }
    snprintf(g_ck, sizeof g_ck, "%s/ck", g_dir);
    Err e = {{0}};
    int rc = ckpt_save(&g_comm, g_ck, 7, t, 2 * n, "step: 7\n", 0, &e);
    if (rc) fprintf(stderr, "make_ckpt: %s\n", e.msg);
    for (int i = 0; i < n; i++) free(bufs[i]), free(names[i]);
    free(bufs), free(names), free(t), free(spec);
}

static void test_order(void) {
    ModelConfig m = tiny();
    HfTensorSpec* s;
    int n = hf_tensor_list(&m, &s);
    ParamCounts pc = params_count(&m);
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += (int64_t)numel(&s[i]);
    EXPECT(total == pc.total, "tensors hold %lld elements, params_count %lld", (long long)total, (long long)pc.total);
    const char* expect[] = {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                            "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
                            "model.layers.0.self_attn.o_proj.weight", "model.layers.0.block_sparse_moe.gate.weight",
                            "model.layers.0.block_sparse_moe.experts.0.w1.weight",
                            "model.layers.0.block_sparse_moe.experts.0.w2.weight",
                            "model.layers.0.block_sparse_moe.experts.0.w3.weight",
                            "model.layers.0.block_sparse_moe.experts.1.w1.weight"};
    for (int i = 0; i < 10; i++) EXPECT(strcmp(s[i].name, expect[i]) == 0, "position %d: %s, want %s", i, s[i].name, expect[i]);
    int p = 1 + 4 + 1 + 3 * 4;  // after layer 0's experts
    EXPECT(!strcmp(s[p].name, "model.layers.0.input_layernorm.weight") &&
               !strcmp(s[p + 1].name, "model.layers.0.post_attention_layernorm.weight") &&
               !strcmp(s[p + 2].name, "model.layers.1.self_attn.q_proj.weight"), "norms close layer 0: %s", s[p].name);
    EXPECT(!strcmp(s[n - 2].name, "model.norm.weight") && !strcmp(s[n - 1].name, "lm_head.weight"), "tail %s", s[n - 1].name);
    free(s);
}

// Tensor names in file order across the shards of an export, via the index.
static void test_export_fp32(void) {
    ModelConfig m = tiny();
    char out[1024], p[1100];
    snprintf(out, sizeof out, "%s/hf32", g_dir);
    Ckpt* ck = NULL;
    Err e = {{0}};
    EXPECT(ckpt_open(&ck, g_ck, &e) == 0, "open: %s", e.msg);
    if (!ck) return;
    // A stale shard of an earlier export must disappear.
    mkdir(out, 0755);
    snprintf(p, sizeof p, "%s/model-00009-of-00009.safetensors", out);
    fclose(fopen(p, "w"));
    EXPECT(hf_export_ex(ck, &m, out, DTYPE_F32, 20000, &e) == 0, "export: %s", e.msg);
    EXPECT(access(p, F_OK) != 0, "stale shard removed");
    ckpt_close(ck);

    // The index: total_size, every model tensor, no optimizer state, files exist.
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", out);
    FILE* f = fopen(p, "rb");
    char* text = xcalloc(1, 1 << 20);
    size_t len = f ? fread(text, 1, (1 << 20) - 1, f) : 0;
    if (f) fclose(f);
    JsDoc doc;
    char msg[200];
    EXPECT(js_parse(&doc, text, len, JS_DEFAULT_LIMITS, msg, sizeof msg) == 0, "index JSON: %s", msg);
    const JsVal* wm = js_get(&doc.root, "weight_map");
    const JsVal* ts = js_get(js_get(&doc.root, "metadata"), "total_size");
    HfTensorSpec* s;
    int n = hf_tensor_list(&m, &s);
    uint64_t bytes = 0;
    for (int i = 0; i < n; i++) bytes += 4 * numel(&s[i]);
    EXPECT(wm && wm->n == n, "weight_map has %d entries, want %d", wm ? wm->n : -1, n);
    EXPECT(ts && ts->is_int && (uint64_t)ts->i == bytes, "total_size %lld, want %llu", ts ? (long long)ts->i : -1, (unsigned long long)bytes);
    int shards = 0;
    for (int i = 0; wm && i < wm->n; i++) {
        EXPECT(strncmp(wm->keys[i], "optim.", 6) != 0, "optimizer state exported: %s", wm->keys[i]);
        if (i) EXPECT(strcmp(wm->keys[i - 1], wm->keys[i]) < 0, "weight_map not sorted at %s", wm->keys[i]);
        int a, b;
        if (sscanf(wm->items[i].str, "model-%d-of-%d", &a, &b) == 2) shards = b;
    }
    EXPECT(shards >= 3, "%d shards with a 20 kB limit", shards);
    js_free(&doc);
    free(text);

    // Shard contents in published order, each ≤ the limit (unless one tensor is larger).
    int k = 0;
    for (int sh = 1; sh <= shards; sh++) {
        snprintf(p, sizeof p, "%s/model-%05d-of-%05d.safetensors", out, sh, shards);
        StFile* sf;
        EXPECT(st_open(&sf, p, &e) == 0, "shard %d: %s", sh, e.msg);
        if (!sf) break;
        EXPECT(st_meta(sf, "format") && !strcmp(st_meta(sf, "format"), "pt"), "shard %d lacks format=pt", sh);
        EXPECT(sf->file_size - sf->data_start <= 20000 || sf->n == 1, "shard %d holds %llu bytes", sh,
               (unsigned long long)(sf->file_size - sf->data_start));
        for (int i = 0; i < sf->n; i++, k++) EXPECT(k < n && !strcmp(sf->t[i].name, s[k].name), "shard %d tensor %d: %s", sh, i, sf->t[i].name);
        st_close(sf);
    }
    EXPECT(k == n, "%d tensors in the shards, want %d", k, n);

    // hf_open reads back exactly.
    HfDir* h = NULL;
    EXPECT(hf_open(&h, out, &e) == 0, "hf_open: %s", e.msg);
    if (h) {
        EXPECT(hf_num_tensors(h) == n, "%d tensors", hf_num_tensors(h));
        int bad = 0;
        for (int i = 0; i < n; i++) {
            float* y = xmalloc(sizeof(float) * numel(&s[i]));
            if (hf_read(h, s[i].name, y, s[i].ndim, s[i].shape, &e)) { bad++; free(y); continue; }
            for (size_t j = 0; j < numel(&s[i]); j++) bad += y[j] != val(i, j);
            free(y);
        }
        EXPECT(bad == 0, "%d values differ after the fp32 round trip (%s)", bad, e.msg);
        float y[512];
        int64_t wrong[] = {8, 16};
        EXPECT(hf_read(h, "model.layers.0.self_attn.q_proj.weight", y, 2, wrong, &e) == -1 &&
                   !strcmp(e.msg, "model.layers.0.self_attn.q_proj.weight: shape [16, 16] in the checkpoint, [8, 16] in the config"),
               "shape message: %s", e.msg);
        EXPECT(!hf_has(h, "optim.exp_avg.lm_head.weight") && hf_has(h, "lm_head.weight"), "has");
        hf_close(h);
    }
    // config.json reads back into the same model config.
    ModelConfig back;
    memset(&back, 0, sizeof back);
    EXPECT(hf_read_config(out, &back, &e) == 0, "hf_read_config: %s", e.msg);
    EXPECT(back.vocab_size == m.vocab_size && back.hidden == m.hidden && back.ffn == m.ffn && back.layers == m.layers &&
               back.heads == m.heads && back.kv_heads == m.kv_heads && back.experts == m.experts && back.top_k == m.top_k &&
               back.max_seq == m.max_seq && back.rope_theta == m.rope_theta && back.rms_eps == m.rms_eps &&
               back.init_std == m.init_std && back.aux_coef == m.aux_coef,
           "config round trip differs");
    free(s);
}

static void test_export_bf16(void) {
    ModelConfig m = tiny();
    char out[1024];
    snprintf(out, sizeof out, "%s/hf16", g_dir);
    Ckpt* ck = NULL;
    Err e = {{0}};
    EXPECT(ckpt_open(&ck, g_ck, &e) == 0 && hf_export(ck, &m, out, DTYPE_BF16, &e) == 0, "export: %s", e.msg);
    if (ck) ckpt_close(ck);
    HfDir* h = NULL;
    EXPECT(hf_open(&h, out, &e) == 0, "hf_open: %s", e.msg);
    if (!h) return;
    HfTensorSpec* s;
    int n = hf_tensor_list(&m, &s);
    int bad = 0, exact = 1;
    for (int i = 0; i < n; i++) {
        float* y = xmalloc(sizeof(float) * numel(&s[i]));
        if (hf_read(h, s[i].name, y, s[i].ndim, s[i].shape, &e)) { bad++; free(y); continue; }
        for (size_t j = 0; j < numel(&s[i]); j++) {
            bad += y[j] != bf16_to_f32(f32_to_bf16(val(i, j)));
            exact &= y[j] == val(i, j);
        }
        free(y);
    }
    EXPECT(bad == 0, "%d values differ from bf16 rounding", bad);
    EXPECT(!exact, "bf16 export equals fp32: the rounding was not exercised");
    hf_close(h);
    char p[1100], cfg[8192] = "";
    snprintf(p, sizeof p, "%s/config.json", out);
    FILE* f = fopen(p, "r");
    size_t len = f ? fread(cfg, 1, sizeof cfg - 1, f) : 0;
    cfg[len] = 0;
    if (f) fclose(f);
    EXPECT(strstr(cfg, "\"torch_dtype\": \"bfloat16\"") && strstr(cfg, "\"MixtralForCausalLM\"") &&
               strstr(cfg, "\"model_type\": \"mixtral\"") && strstr(cfg, "\"rope_theta\": 1000000.0") &&
               strstr(cfg, "\"sliding_window\": null") && strstr(cfg, "\"tie_word_embeddings\": false") &&
               strstr(cfg, "\"bos_token_id\": 1"),
           "config.json:\n%s", cfg);
    snprintf(p, sizeof p, "%s/model-00001-of-00001.safetensors", out);
    EXPECT(access(p, F_OK) == 0, "one shard under 5 GB");
    free(s);
}

static void test_export_errors(void) {
    ModelConfig m = tiny();
    m.experts = 8;  // the checkpoint has 4
    char out[1024];
    snprintf(out, sizeof out, "%s/hfbad", g_dir);
    Ckpt* ck = NULL;
    Err e = {{0}};
    EXPECT(ckpt_open(&ck, g_ck, &e) == 0, "open: %s", e.msg);
    if (!ck) return;
    EXPECT(hf_export(ck, &m, out, DTYPE_F32, &e) == -1 && strstr(e.msg, "block_sparse_moe.gate.weight: shape [4, 16] in the checkpoint, [8, 16] in the config"),
           "experts mismatch: %s", e.msg);
    m = tiny();
    m.layers = 3;
    EXPECT(hf_export(ck, &m, out, DTYPE_F32, &e) == -1 && strstr(e.msg, "no tensor 'model.layers.2."), "missing layer: %s", e.msg);
    ckpt_close(ck);
    HfDir* h;
    EXPECT(hf_open(&h, g_dir, &e) == -1 && strstr(e.msg, "not a Hugging Face model directory"), "hf_open: %s", e.msg);
}

static void write_text(const char* path, const char* text) {
    FILE* f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

// A real transformers 5 config.json (stored in the golden fixture's metadata) and bad ones.
static void test_read_config(void) {
    char d[1024], p[1100];
    snprintf(d, sizeof d, "%s/cfg", g_dir);
    mkdir(d, 0755);
    snprintf(p, sizeof p, "%s/config.json", d);
    StFile* g = NULL;
    Err e = {{0}};
    if (st_open(&g, "tests/fixtures/golden/tiny_mixtral.safetensors", &e) == 0 && st_meta(g, "hf_config")) {
        write_text(p, st_meta(g, "hf_config"));
        ModelConfig m = tiny();
        EXPECT(hf_read_config(d, &m, &e) == 0, "transformers 5 config: %s", e.msg);
        EXPECT(m.vocab_size == 256 && m.hidden == 32 && m.ffn == 48 && m.layers == 2 && m.heads == 4 && m.kv_heads == 2 &&
                   m.experts == 4 && m.top_k == 2 && m.max_seq == 64 && m.rope_theta == 10000.0f && m.rms_eps == 1e-5f,
               "fields: V %d H %d theta %g", m.vocab_size, m.hidden, m.rope_theta);
    } else {
        EXPECT(0, "golden fixture unreadable: %s", e.msg);
    }
    if (g) st_close(g);
    typedef struct { const char* json; const char* msg; } Bad;
    const Bad bad[] = {
        {"{\"model_type\": \"llama\"}", "model_type 'llama'"},
        {"{\"model_type\": \"mixtral\", \"vocab_size\": 10}", "missing \"hidden_size\""},
        {"{\"model_type\": \"mixtral\", \"vocab_size\": 1.5}", "positive integer"},
        {"{\"model_type\": \"mixtral\", \"vocab_size\": 8, \"hidden_size\": 8, \"intermediate_size\": 8, \"num_hidden_layers\": 1,"
         " \"num_attention_heads\": 2, \"num_local_experts\": 2, \"num_experts_per_tok\": 1, \"tie_word_embeddings\": true}", "untied"},
        {"{\"model_type\": \"mixtral\", \"vocab_size\": 8, \"hidden_size\": 8, \"intermediate_size\": 8, \"num_hidden_layers\": 1,"
         " \"num_attention_heads\": 2, \"num_local_experts\": 2, \"num_experts_per_tok\": 1, \"head_dim\": 8}", "head_dim 8"},
        {"{\"model_type\": \"mixtral\",", "bad JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_text(p, bad[i].json);
        ModelConfig m = tiny();
        EXPECT(hf_read_config(d, &m, &e) == -1 && strstr(e.msg, bad[i].msg) && strstr(e.msg, "config.json"), "case %zu: %s", i, e.msg);
    }
}

// A single model.safetensors (no index) opens; an index naming a missing tensor is refused.
static void test_single_and_bad_index(void) {
    char d[1024], p[1100];
    snprintf(d, sizeof d, "%s/single", g_dir);
    mkdir(d, 0755);
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    float x[6] = {1, 2, 3, 4, 5, 6};
    int64_t sh[] = {2, 3};
    Err e = {{0}};
    StWriter* w = st_writer_new();
    st_writer_add(w, "model.norm.weight", ST_F16, 2, sh, x, &e);
    st_writer_write(w, p, NULL, &e);
    st_writer_free(w);
    HfDir* h = NULL;
    float y[6];
    EXPECT(hf_open(&h, d, &e) == 0 && hf_read(h, "model.norm.weight", y, 2, sh, &e) == 0 && y[5] == 6.0f, "single: %s", e.msg);
    if (h) hf_close(h);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    write_text(p, "{\"metadata\": {}, \"weight_map\": {\"lm_head.weight\": \"model.safetensors\"}}");
    EXPECT(hf_open(&h, d, &e) == -1 && strstr(e.msg, "'lm_head.weight' in model.safetensors"), "bad index: %s", e.msg);
    write_text(p, "{\"weight_map\": {\"lm_head.weight\": \"../etc/passwd\"}}");
    EXPECT(hf_open(&h, d, &e) == -1 && strstr(e.msg, "not a file name"), "path escape: %s", e.msg);
    write_text(p, "{\"weight_map\": {\"lm_head.weight\": \"model-00002-of-00002.safetensors\"}}");
    EXPECT(hf_open(&h, d, &e) == -1 && strstr(e.msg, "model-00002-of-00002.safetensors") && strstr(e.msg, "cannot open"),
           "missing shard: %s", e.msg);
}

int main(void) {
    const char* tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/test_hf_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
    make_ckpt();
    RUN(test_order);
    RUN(test_export_fp32);
    RUN(test_export_bf16);
    RUN(test_export_errors);
    RUN(test_read_config);
    RUN(test_single_and_bad_index);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (getenv("MOETRAIN_TEST_KEEP")) printf("kept %s\n", g_dir);
    else if (system(cmd)) fprintf(stderr, "could not remove %s\n", g_dir);
    TEST_END();
}
