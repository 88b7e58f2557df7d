// hf_tokenizer.c — the tokenizer of an export (see hf.h): its special-token ids read from the
// files themselves (a SentencePiece model's protobuf via sp_read, or tokenizer.json with
// tokenizer_config.json), and the files copied beside config.json so that transformers'
// AutoTokenizer loads them. Finding the files is tok_find.c's.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"
#include "minijson.h"
#include "tok_internal.h"

// ---- tokenizer.json --------------------------------------------------------------------------

// A token's text in tokenizer_config.json (a string or {"content": ...}), or NULL.
static const char* cfg_token(const JsVal* cfg, const char* key) {
    const JsVal* v = cfg ? js_get(cfg, key) : NULL;
    if (v && v->type == JS_OBJ) v = js_get(v, "content");
    return v && v->type == JS_STR ? v->str : NULL;
}

// The id of a token's text: added_tokens, then model.vocab (an object). -1 when absent.
static int json_token_id(const JsVal* root, const char* text) {
    if (!text) return -1;
    const JsVal* at = js_get(root, "added_tokens");
    for (int i = 0; at && at->type == JS_ARR && i < at->n; i++) {
        const JsVal* c = js_get(&at->items[i], "content");
        const JsVal* id = js_get(&at->items[i], "id");
        if (c && c->type == JS_STR && !strcmp(c->str, text) && id && id->type == JS_NUM) return (int)id->i;
    }
    const JsVal* m = js_get(root, "model");
    const JsVal* voc = m ? js_get(m, "vocab") : NULL;
    const JsVal* id = voc && voc->type == JS_OBJ ? js_get(voc, text) : NULL;
    return id && id->type == JS_NUM ? (int)id->i : -1;
}

static int json_vocab_size(const JsVal* root) {
    int mx = -1;
    const JsVal* at = js_get(root, "added_tokens");
    for (int i = 0; at && at->type == JS_ARR && i < at->n; i++) {
        const JsVal* id = js_get(&at->items[i], "id");
        if (id && id->type == JS_NUM && id->i > mx) mx = (int)id->i;
    }
    const JsVal* m = js_get(root, "model");
    const JsVal* voc = m ? js_get(m, "vocab") : NULL;
    if (voc && voc->type == JS_OBJ) {
        for (int i = 0; i < voc->n; i++)
            if (voc->items[i].type == JS_NUM && voc->items[i].i > mx) mx = (int)voc->items[i].i;
    } else if (voc && voc->type == JS_ARR && voc->n - 1 > mx) {
        mx = voc->n - 1;
    }
    return mx + 1;
}

typedef struct JsonInfo {
    int n, bos, eos, pad, unk;
    char names[4][128];
} JsonInfo;

static int json_read(const TokFiles* t, JsonInfo* ji, Err* e) {
    memset(ji, 0, sizeof *ji);
    ji->bos = ji->eos = ji->pad = ji->unk = -1;
    char *text = NULL, *ctext = NULL;
    size_t n = 0, cn = 0;
    if (tok_read_all(t->json, &text, &n, e)) return -1;
    JsDoc doc, cdoc;
    memset(&cdoc, 0, sizeof cdoc);
    char err[160];
    JsLimits lim = {64, (size_t)64 << 20};
    int rc = 0;
    if (js_parse(&doc, text, n, lim, err, sizeof err)) rc = err_set(e, "%s: not JSON (%s)", t->json, err);
    const JsVal* cfg = NULL;
    if (!rc && t->config[0] && !tok_read_all(t->config, &ctext, &cn, e)) {
        if (js_parse(&cdoc, ctext, cn, JS_DEFAULT_LIMITS, err, sizeof err) == 0) cfg = &cdoc.root;
    }
    if (!rc) {
        ji->n = json_vocab_size(&doc.root);
        static const char* const keys[4] = {"bos_token", "eos_token", "pad_token", "unk_token"};
        static const char* const guess[4][4] = {{"<s>", "<|begin_of_text|>", "<bos>", NULL},
                                                {"</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>"},
                                                {"<pad>", "<|pad|>", NULL, NULL},
                                                {"<unk>", NULL, NULL, NULL}};
        int* ids[4] = {&ji->bos, &ji->eos, &ji->pad, &ji->unk};
        for (int k = 0; k < 4; k++) {
            const char* name = cfg_token(cfg, keys[k]);
            if (name) *ids[k] = json_token_id(&doc.root, name);
            for (int g = 0; *ids[k] < 0 && !name && g < 4 && guess[k][g]; g++) {
                *ids[k] = json_token_id(&doc.root, guess[k][g]);
                if (*ids[k] >= 0) name = guess[k][g];
            }
            if (*ids[k] >= 0 && name) snprintf(ji->names[k], sizeof ji->names[k], "%s", name);
        }
    }
    js_free(&doc);
    js_free(&cdoc);
    free(text);
    free(ctext);
    return rc;
}

// ---- export ------------------------------------------------------------------------------------

static int copy_file(const char* from, const char* dir, const char* name, Err* e) {
    char* text;
    size_t n;
    if (tok_read_all(from, &text, &n, e)) return -1;
    char p[CKPT_PATH];
    ckpt_join(p, dir, name);
    int rc = ckpt_write_file(p, text, n, NULL, e);
    free(text);
    return rc;
}

static void kv_tok(Sb* b, const char* key, const char* name, int last) {
    sb_printf(b, "  \"%s\": ", key);
    if (name && name[0]) sb_json_str(b, name);
    else sb_printf(b, "null");
    sb_printf(b, "%s\n", last ? "" : ",");
}

// "bos_token" .. "unk_token" from names (bos, eos, pad, unk); `last`: no comma after the unk one.
static void kv_special_tokens(Sb* b, char names[4][128], int last) {
    static const char* const keys[4] = {"bos_token", "eos_token", "pad_token", "unk_token"};
    for (int k = 0; k < 4; k++) kv_tok(b, keys[k], names[k], last && k == 3);
}

// Writes b's text to out_dir/name; b is freed and empty for the next file.
static int write_json(Sb* b, const char* out_dir, const char* name, Err* e) {
    char p[CKPT_PATH];
    ckpt_join(p, out_dir, name);
    int rc = ckpt_write_file(p, b->s, b->len, NULL, e);
    sb_free(b);  // empties it
    return rc;
}

// The tokenizer's size *n and special tokens (ids, names) from t's tokenizer.model and/or
// tokenizer.json (the model's when both are there: then the sizes must agree).
static int read_special_tokens(const TokFiles* t, int* n, HfTokenIds* ids, char names[4][128], Err* e) {
    if (t->model[0]) {
        SpInfo s;
        if (sp_read(t->model, &s, e)) return -1;
        *n = s.n;
        ids->bos = s.bos, ids->eos = s.eos, ids->pad = s.pad, ids->unk = s.unk;
        memcpy(names, s.names, sizeof s.names);
    }
    if (t->json[0]) {
        JsonInfo j;
        if (json_read(t, &j, e)) return -1;
        if (!t->model[0]) {
            *n = j.n;
            ids->bos = j.bos, ids->eos = j.eos, ids->pad = j.pad, ids->unk = j.unk;
            memcpy(names, j.names, sizeof j.names);
        } else if (j.n != *n) {
            return err_set(e, "%s has %d tokens but %s has %d: they are not the same tokenizer", t->json, j.n, t->model, *n);
        }
    }
    return 0;
}

// tokenizer_config.json (the source's when it sits beside a tokenizer.json, else written here),
// special_tokens_map.json and generation_config.json into out_dir.
static int write_tokenizer_configs(const TokFiles* t, const char* out_dir, const HfTokenIds* ids, char names[4][128],
                                   int max_seq, Err* e) {
    Sb b = {0};
    int rc = 0;
    if (t->config[0] && t->json[0]) {
        rc = copy_file(t->config, out_dir, "tokenizer_config.json", e);
    } else {
        sb_printf(&b, "{\n  \"tokenizer_class\": \"%s\",\n", t->json[0] ? "PreTrainedTokenizerFast" : "LlamaTokenizer");
        kv_special_tokens(&b, names, 0);
        sb_printf(&b, "  \"add_bos_token\": %s,\n  \"add_eos_token\": false,\n  \"legacy\": true,\n"
                  "  \"clean_up_tokenization_spaces\": false,\n  \"spaces_between_special_tokens\": false,\n"
                  "  \"model_max_length\": %d\n}\n", ids->bos >= 0 ? "true" : "false", max_seq);
        rc = write_json(&b, out_dir, "tokenizer_config.json", e);
    }
    if (rc) return -1;
    sb_printf(&b, "{\n");
    kv_special_tokens(&b, names, 1);
    sb_printf(&b, "}\n");
    if (write_json(&b, out_dir, "special_tokens_map.json", e)) return -1;
    sb_printf(&b, "{\n  \"bos_token_id\": ");
    ids->bos >= 0 ? sb_printf(&b, "%d", ids->bos) : sb_printf(&b, "null");
    sb_printf(&b, ",\n  \"eos_token_id\": %d,\n  \"pad_token_id\": ", ids->eos);
    ids->pad >= 0 ? sb_printf(&b, "%d", ids->pad) : sb_printf(&b, "null");
    sb_printf(&b, "\n}\n");
    return write_json(&b, out_dir, "generation_config.json", e) ? -1 : 0;
}

int hf_export_tokenizer(const char* spec, const char* out_dir, int vocab_size, int max_seq, HfTokenIds* ids,
                        char* desc, size_t dn, Err* e) {
    TokFiles t;
    Err fe = {{0}};
    if (tok_find(spec, &t, &fe)) return err_set(e, "--tokenizer: %s", fe.msg);
    int n = 0;
    char names[4][128];
    memset(names, 0, sizeof names);
    if (read_special_tokens(&t, &n, ids, names, e)) return -1;
    if (n > vocab_size)
        return err_set(e, "the tokenizer has %d tokens, the model's vocabulary only %d (model.vocab_size): it is "
                       "not this model's tokenizer", n, vocab_size);
    if (ids->eos < 0) return err_set(e, "the tokenizer (%s) has no end-of-sequence token", t.json[0] ? t.json : t.model);
    for (int k = 0; k < 4; k++) {
        int id = k == 0 ? ids->bos : k == 1 ? ids->eos : k == 2 ? ids->pad : ids->unk;
        if (id < 0) names[k][0] = 0;
    }
    if (t.model[0] && copy_file(t.model, out_dir, "tokenizer.model", e)) return -1;
    if (t.json[0] && copy_file(t.json, out_dir, "tokenizer.json", e)) return -1;
    if (write_tokenizer_configs(&t, out_dir, ids, names, max_seq, e)) return -1;
    snprintf(desc, dn, "%s%s%s (%d tokens; bos %d, eos %d, pad %d)", t.model[0] ? "tokenizer.model" : "",
             t.model[0] && t.json[0] ? " + " : "", t.json[0] ? "tokenizer.json" : "", n, ids->bos, ids->eos, ids->pad);
    return 0;
}
