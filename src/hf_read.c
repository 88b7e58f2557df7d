// hf_read.c — reading a Hugging Face model directory and its config.json (see hf.h).
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_internal.h"
#include "hf.h"
#include "minijson.h"

struct HfDir {
    char dir[CKPT_PATH];
    int nfiles;
    StFile** files;  // [nfiles]
    int n;
    TensorRef* ref;  // [n]
    StrMap index;    // name → ref (names owned by the StFiles)
};

void hf_close(HfDir* h) {
    if (!h) return;
    for (int i = 0; i < h->nfiles; i++) st_close(h->files[i]);
    free(h->files);
    free(h->ref);
    strmap_free(&h->index);
    free(h);
}

static int add_file(HfDir* h, const char* path, Err* e) {
    h->files = realloc(h->files, sizeof(StFile*) * (size_t)(h->nfiles + 1));
    if (!h->files) FATAL("out of memory");
    if (st_open(&h->files[h->nfiles], path, e)) return -1;
    return h->nfiles++;
}

static int add_tensor(HfDir* h, int file, int idx, Err* e) {
    const StTensor* t = &h->files[file]->t[idx];
    if (h->n % 1024 == 0) {
        h->ref = realloc(h->ref, sizeof(TensorRef) * (size_t)(h->n + 1024));
        if (!h->ref) FATAL("out of memory");
    }
    int old;
    if (strmap_put(&h->index, t->name, h->n, &old))
        return err_set(e, "%s: tensor '%s' appears twice (also in %s)", h->files[file]->path, t->name, h->files[h->ref[old].file]->path);
    h->ref[h->n++] = (TensorRef){file, idx};
    return 0;
}

static int open_single(HfDir* h, const char* path, Err* e) {
    int f = add_file(h, path, e);
    if (f < 0) return -1;
    for (int i = 0; i < h->files[f]->n; i++)
        if (add_tensor(h, f, i, e)) return -1;
    return 0;
}

static int open_index(HfDir* h, const char* index_path, Err* e) {
    char* text = ckpt_read_text(index_path, 64u << 20, NULL, e);
    if (!text) return -1;
    JsDoc doc;
    char msg[256];
    int rc = 0;
    StrMap fidx;
    strmap_init(&fidx);
    if (js_parse(&doc, text, strlen(text), JS_DEFAULT_LIMITS, msg, sizeof msg)) {
        rc = err_set(e, "%s: bad JSON %s", index_path, msg);
        goto done;
    }
    const JsVal* wm = js_get(&doc.root, "weight_map");
    if (!wm || wm->type != JS_OBJ) {
        rc = err_set(e, "%s: no \"weight_map\" object", index_path);
        goto done;
    }
    for (int i = 0; i < wm->n && !rc; i++) {
        const JsVal* v = &wm->items[i];
        if (v->type != JS_STR || !ckpt_safe_name(v->str)) {
            rc = err_set(e, "%s: weight_map['%s'] is not a file name in this directory", index_path, wm->keys[i]);
            break;
        }
        int f = strmap_get(&fidx, v->str);
        if (f < 0) {
            char p[CKPT_PATH];
            ckpt_join(p, h->dir, v->str);
            if ((f = add_file(h, p, e)) < 0) { rc = -1; break; }
            strmap_put(&fidx, h->files[f]->path + strlen(h->dir) + 1, f, NULL);
        }
        const StTensor* t = st_find(h->files[f], wm->keys[i]);
        if (!t) rc = err_set(e, "%s: the index puts '%s' in %s, which does not hold it", index_path, wm->keys[i], v->str);
        else rc = add_tensor(h, f, (int)(t - h->files[f]->t), e);
    }
done:
    strmap_free(&fidx);
    js_free(&doc);
    free(text);
    return rc;
}

int hf_open(HfDir** out, const char* dir, Err* e) {
    *out = NULL;
    HfDir* h = xcalloc(1, sizeof *h);
    strmap_init(&h->index);
    struct stat st;
    char p[CKPT_PATH];
    int rc;
    size_t len = strlen(dir);
    ckpt_copy(h->dir, sizeof h->dir, dir);
    if (stat(dir, &st)) rc = err_set(e, "%s: %s", dir, strerror(errno));
    else if (S_ISREG(st.st_mode) && len > 12 && !strcmp(dir + len - 12, ".safetensors")) rc = open_single(h, dir, e);
    else if (!S_ISDIR(st.st_mode)) rc = err_set(e, "%s: not a Hugging Face model directory", dir);
    else {
        ckpt_join(p, dir, "model.safetensors.index.json");
        if (stat(p, &st) == 0) rc = open_index(h, p, e);
        else {
            ckpt_join(p, dir, "model.safetensors");
            if (stat(p, &st) == 0) rc = open_single(h, p, e);
            else rc = err_set(e, "%s: no model.safetensors.index.json or model.safetensors (not a Hugging Face model directory)", dir);
        }
    }
    if (rc) {
        hf_close(h);
        return -1;
    }
    *out = h;
    return 0;
}

int hf_has(const HfDir* h, const char* name) { return strmap_get(&h->index, name) >= 0; }
int hf_num_tensors(const HfDir* h) { return h->n; }
const char* hf_tensor_name(const HfDir* h, int i) {
    return i >= 0 && i < h->n ? h->files[h->ref[i].file]->t[h->ref[i].idx].name : NULL;
}

int hf_read(const HfDir* h, const char* name, float* dst, int ndim, const int64_t* shape, Err* e) {
    int i = strmap_get(&h->index, name);
    if (i < 0) return err_set(e, "%s: no tensor '%s' (is it a Mixtral model of this config?)", h->dir, name);
    const StFile* f = h->files[h->ref[i].file];
    const StTensor* t = &f->t[h->ref[i].idx];
    char a[128], b[128];
    if (st_shape_differs(t, ndim, shape, a, b, sizeof a))
        return err_set(e, "%s: shape %s in the checkpoint, %s in the config", name, a, b);
    return st_read_f32(f, t, dst, e);
}

// ---- config.json ------------------------------------------------------------------------------
static int get_int(const JsVal* root, const char* path, const char* key, int required, int* out, Err* e) {
    const JsVal* v = js_get(root, key);
    if (!v || v->type == JS_NULL) return required ? err_set(e, "%s: missing \"%s\"", path, key) : 0;
    if (v->type != JS_NUM || !v->is_int || v->i < 1 || v->i > (1 << 30))
        return err_set(e, "%s: \"%s\" must be a positive integer", path, key);
    *out = (int)v->i;
    return 0;
}

static int get_float(const JsVal* root, const char* path, const char* key, float* out, Err* e) {
    const JsVal* v = js_get(root, key);
    if (!v || v->type == JS_NULL) return 0;
    if (v->type != JS_NUM || !isfinite(v->num)) return err_set(e, "%s: \"%s\" must be a number", path, key);
    *out = (float)v->num;
    return 0;
}

// The model shape from config.json's object r into c (c->kv_heads defaults to the heads, as in
// transformers; transformers 5 keeps rope_theta under rope_parameters).
static int read_shape(const JsVal* r, const char* path, ModelConfig* c, Err* e) {
    c->kv_heads = 0;
    if (get_int(r, path, "vocab_size", 1, &c->vocab_size, e) || get_int(r, path, "hidden_size", 1, &c->hidden, e) ||
        get_int(r, path, "intermediate_size", 1, &c->ffn, e) || get_int(r, path, "num_hidden_layers", 1, &c->layers, e) ||
        get_int(r, path, "num_attention_heads", 1, &c->heads, e) ||
        get_int(r, path, "num_key_value_heads", 0, &c->kv_heads, e) ||
        get_int(r, path, "num_local_experts", 1, &c->experts, e) ||
        get_int(r, path, "num_experts_per_tok", 1, &c->top_k, e) ||
        get_int(r, path, "max_position_embeddings", 0, &c->max_seq, e) || get_float(r, path, "rope_theta", &c->rope_theta, e) ||
        get_float(r, path, "rms_norm_eps", &c->rms_eps, e) || get_float(r, path, "initializer_range", &c->init_std, e) ||
        get_float(r, path, "router_aux_loss_coef", &c->aux_coef, e))
        return -1;
    if (!c->kv_heads) c->kv_heads = c->heads;
    const JsVal* rp = js_get(r, "rope_parameters");
    if (rp && rp->type == JS_OBJ) {
        const JsVal* ty = js_get(rp, "rope_type");
        if (ty && ty->type == JS_STR && strcmp(ty->str, "default") != 0)
            return err_set(e, "%s: rope_type '%s' is not supported (only default RoPE)", path, ty->str);
        if (get_float(rp, path, "rope_theta", &c->rope_theta, e)) return -1;
    }
    return 0;
}

// What config.json may say that this trainer does not implement: tied embeddings, a sliding
// window, another activation, a head_dim other than hidden / heads.
static int check_supported(const JsVal* r, const char* path, const ModelConfig* c, Err* e) {
    const JsVal* v = js_get(r, "tie_word_embeddings");
    if (v && v->type == JS_BOOL && v->b) return err_set(e, "%s: tie_word_embeddings is true; Mixtral's lm_head is untied", path);
    v = js_get(r, "sliding_window");
    if (v && v->type == JS_NUM && v->num < c->max_seq)
        return err_set(e, "%s: sliding_window %g is not supported (full causal attention only)", path, v->num);
    v = js_get(r, "hidden_act");
    if (v && v->type == JS_STR && strcmp(v->str, "silu") != 0) return err_set(e, "%s: hidden_act '%s' is not silu", path, v->str);
    v = js_get(r, "head_dim");
    if (c->hidden % c->heads)
        return err_set(e, "%s: hidden_size %d is not a multiple of num_attention_heads %d", path, c->hidden, c->heads);
    if (v && v->type == JS_NUM && (!v->is_int || v->i != c->hidden / c->heads))
        return err_set(e, "%s: head_dim %g differs from hidden_size / num_attention_heads = %d (not supported)", path,
                       v->num, c->hidden / c->heads);
    return 0;
}

int hf_read_config(const char* dir, ModelConfig* m, Err* e) {
    char path[CKPT_PATH];
    ckpt_join(path, dir, "config.json");
    char* text = ckpt_read_text(path, 16u << 20, NULL, e);
    if (!text) return -1;
    JsDoc doc;
    char msg[256];
    ModelConfig c = *m;
    int rc = 0;
    if (js_parse(&doc, text, strlen(text), JS_DEFAULT_LIMITS, msg, sizeof msg)) {
        rc = err_set(e, "%s: bad JSON %s", path, msg);
        goto done;
    }
    const JsVal* r = &doc.root;
    const JsVal* mt = js_get(r, "model_type");
    if (r->type != JS_OBJ) rc = err_set(e, "%s: not a JSON object", path);
    else if (!mt || mt->type != JS_STR || strcmp(mt->str, "mixtral") != 0)
        rc = err_set(e, "%s: model_type '%s' is not 'mixtral' (only MixtralForCausalLM is supported)", path,
                     mt && mt->type == JS_STR ? mt->str : "(none)");
    else if (read_shape(r, path, &c, e) || check_supported(r, path, &c, e))
        rc = -1;
    if (rc == 0) {
        c.tie_embeddings = 0;
        *m = c;
    }
done:
    js_free(&doc);
    free(text);
    return rc;
}
