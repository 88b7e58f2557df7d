// hf_tokenizer.c — the tokenizer of an export (see hf.h): found from a path or from what a run
// recorded, its special-token ids read from the files themselves (a SentencePiece model's
// protobuf, or tokenizer.json with tokenizer_config.json), and the files copied beside
// config.json so that transformers' AutoTokenizer loads them.
#define _DEFAULT_SOURCE
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_internal.h"
#include "hf.h"
#include "minijson.h"

#define TOK_MAX_BYTES ((size_t)256 << 20)

typedef struct TokFiles {
    char model[PATH_MAX];   // SentencePiece tokenizer.model, or ""
    char json[PATH_MAX];    // tokenizer.json, or ""
    char config[PATH_MAX];  // tokenizer_config.json, or ""
} TokFiles;

// dir/name into out[n] (a helper: the caller's buffer sizes are not the compiler's business).
static void pjoin(char* out, size_t n, const char* dir, const char* name) {
    if (snprintf(out, n, "%s%s%s", dir, name ? "/" : "", name ? name : "") >= (int)n) out[0] = 0;
}

static int is_file(const char* p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int is_dir(const char* p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void dir_of(const char* p, char* out, size_t n) {
    pjoin(out, n, p, NULL);
    char* s = strrchr(out, '/');
    if (s) *s = 0;
    else snprintf(out, n, ".");
}

static int read_all(const char* path, char** buf, size_t* n, Err* e) {
    *buf = ckpt_read_text(path, TOK_MAX_BYTES, n, e);
    return *buf ? 0 : -1;
}

static int find_in_dir(const char* dir, TokFiles* t, int depth, Err* e);

// manifest.json of scripts/tokenize.py: its tokenizer directory.
static int from_manifest(const char* path, TokFiles* t, int depth, Err* e) {
    char* text;
    size_t n;
    if (read_all(path, &text, &n, e)) return -1;
    JsDoc doc;
    char err[160];
    int rc = -1;
    if (js_parse(&doc, text, n, JS_DEFAULT_LIMITS, err, sizeof err)) {
        err_set(e, "%s: not JSON (%s)", path, err);
    } else {
        const JsVal* tk = js_get(&doc.root, "tokenizer");
        const JsVal* d = tk ? js_get(tk, "dir") : NULL;
        if (!d || d->type != JS_STR) {
            err_set(e, "%s names no tokenizer files (a bytes tokenizer has none); give --tokenizer PATH", path);
        } else {
            char base[PATH_MAX], sub[2 * PATH_MAX];
            dir_of(path, base, sizeof base);
            pjoin(sub, sizeof sub, base, d->str);
            rc = find_in_dir(sub, t, depth + 1, e);
        }
    }
    js_free(&doc);
    free(text);
    return rc;
}

static int find_in_dir(const char* dir, TokFiles* t, int depth, Err* e) {
    char p[PATH_MAX + 64];
    if (depth > 3) return err_set(e, "%s: tokenizer directories nest too deep", dir);
    pjoin(p, sizeof p, dir, "manifest.json");
    if (is_file(p)) return from_manifest(p, t, depth, e);
    pjoin(p, sizeof p, dir, "tokenizer.model");
    if (is_file(p)) pjoin(t->model, sizeof t->model, p, NULL);
    pjoin(p, sizeof p, dir, "tokenizer.json");
    if (is_file(p)) pjoin(t->json, sizeof t->json, p, NULL);
    pjoin(p, sizeof p, dir, "tokenizer_config.json");
    if (is_file(p)) pjoin(t->config, sizeof t->config, p, NULL);
    if (t->model[0] || t->json[0]) return 0;
    pjoin(p, sizeof p, dir, "tokenizer");
    if (is_dir(p)) return find_in_dir(p, t, depth + 1, e);
    return err_set(e, "%s holds no tokenizer.model, tokenizer.json or manifest.json", dir);
}

static int find_tokenizer(const char* spec, TokFiles* t, Err* e) {
    memset(t, 0, sizeof *t);
    if (is_dir(spec)) return find_in_dir(spec, t, 0, e);
    if (!is_file(spec)) return err_set(e, "tokenizer %s not found", spec);
    const char* base = strrchr(spec, '/') ? strrchr(spec, '/') + 1 : spec;
    if (!strcmp(base, "manifest.json")) return from_manifest(spec, t, 0, e);
    FILE* f = fopen(spec, "rb");
    if (!f) return err_set(e, "cannot open %s (%s)", spec, strerror(errno));
    int c;
    while ((c = fgetc(f)) == ' ' || c == '\n' || c == '\r' || c == '\t') {}
    fclose(f);
    char dir[PATH_MAX], p[PATH_MAX + 64];
    dir_of(spec, dir, sizeof dir);
    if (c == '{') pjoin(t->json, sizeof t->json, spec, NULL);
    else pjoin(t->model, sizeof t->model, spec, NULL);
    pjoin(p, sizeof p, dir, "tokenizer_config.json");
    if (is_file(p)) pjoin(t->config, sizeof t->config, p, NULL);
    return 0;
}

int hf_tokenizer_of_run(const DataConfig* dc, char* out, size_t n) {
    if (dc->tokenizer[0]) {
        snprintf(out, n, "%s", dc->tokenizer);
        return 1;
    }
    if (!dc->path[0]) return 0;
    char first[CFG_STR];
    snprintf(first, sizeof first, "%s", dc->path);
    char* comma = strchr(first, ',');
    if (comma) *comma = 0;
    char* it = first;
    while (*it == ' ') it++;
    char path[PATH_MAX + 32], dir[PATH_MAX];
    if (strpbrk(it, "*?[")) {
        glob_t g;
        if (glob(it, 0, NULL, &g) || !g.gl_pathc) return 0;
        snprintf(path, sizeof path, "%s", g.gl_pathv[0]);
        globfree(&g);
    } else {
        pjoin(path, sizeof path, it, NULL);
    }
    if (is_dir(path)) pjoin(dir, sizeof dir, path, NULL);
    else dir_of(path, dir, sizeof dir);
    pjoin(path, sizeof path, dir, "manifest.json");
    if (!is_file(path)) return 0;
    snprintf(out, n, "%s", path);
    return 1;
}

// ---- SentencePiece model (protobuf) ----------------------------------------------------------

typedef struct Pb {
    const uint8_t* p;
    size_t n, i;
} Pb;

static int pb_varint(Pb* b, uint64_t* v) {
    *v = 0;
    for (int s = 0; s < 64 && b->i < b->n; s += 7) {
        uint8_t c = b->p[b->i++];
        *v |= (uint64_t)(c & 0x7F) << s;
        if (c < 0x80) return 0;
    }
    return -1;
}

// Next field: number, wire type, varint value or [sub, sublen]. 1 = got one, 0 = end, -1 = bad.
static int pb_next(Pb* b, int* field, int* wt, uint64_t* v, const uint8_t** sub, size_t* sublen) {
    if (b->i >= b->n) return 0;
    uint64_t key;
    if (pb_varint(b, &key)) return -1;
    *field = (int)(key >> 3);
    *wt = (int)(key & 7);
    if (*wt == 0) return pb_varint(b, v) ? -1 : 1;
    if (*wt == 1 || *wt == 5) {
        size_t k = *wt == 1 ? 8 : 4;
        if (b->n - b->i < k) return -1;
        b->i += k;
        return 1;
    }
    if (*wt == 2) {
        uint64_t len;
        if (pb_varint(b, &len) || len > b->n - b->i) return -1;
        *sub = b->p + b->i;
        *sublen = (size_t)len;
        b->i += (size_t)len;
        return 1;
    }
    return -1;
}

typedef struct SpInfo {
    int n;              // pieces
    int bos, eos, pad, unk;
    char names[4][128];  // bos, eos, pad, unk pieces
} SpInfo;

static int sp_read(const char* path, SpInfo* s, Err* e) {
    memset(s, 0, sizeof *s);
    s->bos = 1, s->eos = 2, s->pad = -1, s->unk = 0;  // SentencePiece's defaults
    char* text;
    size_t n;
    if (read_all(path, &text, &n, e)) return -1;
    Pb b = {(const uint8_t*)text, n, 0};
    int f, wt, r;
    uint64_t v;
    const uint8_t* sub = NULL;
    size_t sl = 0;
    // pieces: only their strings at the special ids are kept, after the ids are known: two passes
    while ((r = pb_next(&b, &f, &wt, &v, &sub, &sl)) == 1) {
        if (f == 1 && wt == 2) s->n++;
        if (f == 2 && wt == 2) {
            Pb t = {sub, sl, 0};
            int g, wt2;
            uint64_t u;
            const uint8_t* s2;
            size_t l2;
            int r2;
            while ((r2 = pb_next(&t, &g, &wt2, &u, &s2, &l2)) == 1) {
                if (wt2 != 0) continue;
                if (g == 40) s->unk = (int)(int32_t)u;
                if (g == 41) s->bos = (int)(int32_t)u;
                if (g == 42) s->eos = (int)(int32_t)u;
                if (g == 43) s->pad = (int)(int32_t)u;
            }
            if (r2 < 0) r = -1;
        }
    }
    if (r < 0 || s->n == 0) {
        free(text);
        return err_set(e, "%s is not a SentencePiece model (its protobuf does not parse, or has no pieces)", path);
    }
    b.i = 0;
    int idx = 0;
    const int want[4] = {s->bos, s->eos, s->pad, s->unk};
    while (pb_next(&b, &f, &wt, &v, &sub, &sl) == 1) {
        if (!(f == 1 && wt == 2)) continue;
        Pb t = {sub, sl, 0};
        int g, wt2;
        uint64_t u;
        const uint8_t* s2 = NULL;
        size_t l2 = 0;
        while (pb_next(&t, &g, &wt2, &u, &s2, &l2) == 1)
            if (g == 1 && wt2 == 2)
                for (int k = 0; k < 4; k++)
                    if (want[k] == idx) snprintf(s->names[k], sizeof s->names[k], "%.*s", (int)(l2 < 127 ? l2 : 127), (const char*)s2);
        idx++;
    }
    free(text);
    return 0;
}

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
    if (read_all(t->json, &text, &n, e)) return -1;
    JsDoc doc, cdoc;
    memset(&cdoc, 0, sizeof cdoc);
    char err[160];
    JsLimits lim = {64, (size_t)64 << 20};
    int rc = 0;
    if (js_parse(&doc, text, n, lim, err, sizeof err)) rc = err_set(e, "%s: not JSON (%s)", t->json, err);
    const JsVal* cfg = NULL;
    if (!rc && t->config[0] && !read_all(t->config, &ctext, &cn, e)) {
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
    if (read_all(from, &text, &n, e)) return -1;
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

int hf_export_tokenizer(const char* spec, const char* out_dir, int vocab_size, int max_seq, HfTokenIds* ids,
                        char* desc, size_t dn, Err* e) {
    TokFiles t;
    Err fe = {{0}};
    if (find_tokenizer(spec, &t, &fe)) return err_set(e, "--tokenizer: %s", fe.msg);
    int n = 0;
    char names[4][128];
    memset(names, 0, sizeof names);
    if (t.model[0]) {
        SpInfo s;
        if (sp_read(t.model, &s, e)) return -1;
        n = s.n;
        ids->bos = s.bos, ids->eos = s.eos, ids->pad = s.pad, ids->unk = s.unk;
        memcpy(names, s.names, sizeof names);
    }
    if (t.json[0]) {
        JsonInfo j;
        if (json_read(&t, &j, e)) return -1;
        if (!t.model[0]) {
            n = j.n;
            ids->bos = j.bos, ids->eos = j.eos, ids->pad = j.pad, ids->unk = j.unk;
            memcpy(names, j.names, sizeof names);
        } else if (j.n != n) {
            return err_set(e, "%s has %d tokens but %s has %d: they are not the same tokenizer", t.json, j.n, t.model, n);
        }
    }
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
    Sb b = {0};
    char p[CKPT_PATH];
    int rc = 0;
    if (t.config[0] && t.json[0]) {
        rc = copy_file(t.config, out_dir, "tokenizer_config.json", e);
    } else {
        sb_printf(&b, "{\n  \"tokenizer_class\": \"%s\",\n", t.json[0] ? "PreTrainedTokenizerFast" : "LlamaTokenizer");
        kv_tok(&b, "bos_token", names[0], 0);
        kv_tok(&b, "eos_token", names[1], 0);
        kv_tok(&b, "pad_token", names[2], 0);
        kv_tok(&b, "unk_token", names[3], 0);
        sb_printf(&b, "  \"add_bos_token\": %s,\n  \"add_eos_token\": false,\n  \"legacy\": true,\n"
                  "  \"clean_up_tokenization_spaces\": false,\n  \"spaces_between_special_tokens\": false,\n"
                  "  \"model_max_length\": %d\n}\n", ids->bos >= 0 ? "true" : "false", max_seq);
        ckpt_join(p, out_dir, "tokenizer_config.json");
        rc = ckpt_write_file(p, b.s, b.len, NULL, e);
        sb_free(&b);
    }
    if (rc) return -1;
    memset(&b, 0, sizeof b);
    sb_printf(&b, "{\n");
    kv_tok(&b, "bos_token", names[0], 0);
    kv_tok(&b, "eos_token", names[1], 0);
    kv_tok(&b, "pad_token", names[2], 0);
    kv_tok(&b, "unk_token", names[3], 1);
    sb_printf(&b, "}\n");
    ckpt_join(p, out_dir, "special_tokens_map.json");
    rc = ckpt_write_file(p, b.s, b.len, NULL, e);
    sb_free(&b);
    if (rc) return -1;
    memset(&b, 0, sizeof b);
    sb_printf(&b, "{\n  \"bos_token_id\": ");
    ids->bos >= 0 ? sb_printf(&b, "%d", ids->bos) : sb_printf(&b, "null");
    sb_printf(&b, ",\n  \"eos_token_id\": %d,\n  \"pad_token_id\": ", ids->eos);
    ids->pad >= 0 ? sb_printf(&b, "%d", ids->pad) : sb_printf(&b, "null");
    sb_printf(&b, "\n}\n");
    ckpt_join(p, out_dir, "generation_config.json");
    rc = ckpt_write_file(p, b.s, b.len, NULL, e);
    sb_free(&b);
    if (rc) return -1;
    snprintf(desc, dn, "%s%s%s (%d tokens; bos %d, eos %d, pad %d)", t.model[0] ? "tokenizer.model" : "",
             t.model[0] && t.json[0] ? " + " : "", t.json[0] ? "tokenizer.json" : "", n, ids->bos, ids->eos, ids->pad);
    return 0;
}
