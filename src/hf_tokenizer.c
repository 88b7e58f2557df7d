// hf_tokenizer.c — the tokenizer of an export (see hf.h): found from a path or from what a run
// recorded, its special-token ids read from the files themselves (a SentencePiece model's
// protobuf, or tokenizer.json with tokenizer_config.json), and the files copied beside
// config.json so that transformers' AutoTokenizer loads them.
#define _DEFAULT_SOURCE
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_internal.h"
#include "hf.h"
#include "minijson.h"
#include "strmap.h"

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

// manifest.json of scripts/tokenize_data.py: its tokenizer directory.
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
        *v = 0;  // fixed64 / fixed32, little-endian (a float's bits for wire type 5)
        for (size_t j = 0; j < k; j++) *v |= (uint64_t)b->p[b->i + j] << (8 * j);
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

// The varint field `field` of the message p[n] (its last occurrence, as protobuf reads a repeated
// scalar; fields after a malformed one are not seen): 1 with its value in *v, 0 when absent.
static int pb_varint_field(const uint8_t* p, size_t n, int field, uint64_t* v) {
    Pb b = {p, n, 0};
    int f, wt, found = 0;
    uint64_t u = 0;
    const uint8_t* sub = NULL;
    size_t sl = 0;
    while (pb_next(&b, &f, &wt, &u, &sub, &sl) == 1)
        if (f == field && wt == 0) *v = u, found = 1;
    return found;
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
    if (find_tokenizer(spec, &t, &fe)) return err_set(e, "--tokenizer: %s", fe.msg);
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

// ---- SentencePiece encode / decode (moetrain generate) ---------------------------------------

enum { SP_NORMAL = 1, SP_UNKNOWN = 2, SP_CONTROL = 3, SP_USER = 4, SP_UNUSED = 5, SP_BYTE = 6 };

struct SpModel {
    int n;
    char** piece;     // [n] NUL-terminated
    float* score;     // [n]
    uint8_t* type;    // [n]
    StrMap map;       // piece → id (normal, user-defined and unknown pieces)
    int byte_id[256]; // <0xNN> piece of each byte, or -1
    int bpe;          // trainer_spec.model_type == BPE (else unigram)
    int byte_fallback, dummy_prefix, collapse_ws;
    int bos, eos, unk;
    int maxlen;       // longest piece in bytes
};

int sp_vocab(const SpModel* s) { return s->n; }
int sp_eos(const SpModel* s) { return s->eos; }
int sp_bos(const SpModel* s) { return s->bos; }

void sp_close(SpModel* s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) free(s->piece[i]);
    free(s->piece), free(s->score), free(s->type);
    strmap_free(&s->map);
    free(s);
}

// An empty model for info's pieces, with SentencePiece's defaults until the file says otherwise.
static SpModel* sp_new(const SpInfo* info) {
    SpModel* s = xcalloc(1, sizeof *s);
    s->piece = xcalloc((size_t)info->n, sizeof(char*));
    s->score = xcalloc((size_t)info->n, sizeof(float));
    s->type = xcalloc((size_t)info->n, 1);
    s->bos = info->bos, s->eos = info->eos, s->unk = info->unk;
    s->dummy_prefix = 1, s->collapse_ws = 1, s->bpe = 0;
    for (int i = 0; i < 256; i++) s->byte_id[i] = -1;
    return s;
}

// ModelProto.pieces (field 1): the next piece's text, score and type.
static void sp_add_piece(SpModel* s, const uint8_t* sub, size_t sl) {
    Pb t = {sub, sl, 0};
    int g, wt2;
    uint64_t u = 0;
    const uint8_t* s2 = NULL;
    size_t l2 = 0;
    const int id = s->n++;
    s->type[id] = SP_NORMAL;
    while (pb_next(&t, &g, &wt2, &u, &s2, &l2) == 1) {
        if (g == 1 && wt2 == 2) {
            s->piece[id] = xmalloc(l2 + 1);
            memcpy(s->piece[id], s2, l2);
            s->piece[id][l2] = 0;
        } else if (g == 2 && wt2 == 5) {
            uint32_t bits = (uint32_t)u;
            memcpy(&s->score[id], &bits, 4);
        } else if (g == 3 && wt2 == 0) {
            s->type[id] = (uint8_t)u;
        }
    }
    if (!s->piece[id]) s->piece[id] = xstrdup("");
}

// ModelProto.trainer_spec (field 2): BPE or unigram, byte fallback.
static void sp_read_trainer_spec(SpModel* s, const uint8_t* sub, size_t sl) {
    uint64_t u;
    if (pb_varint_field(sub, sl, 3, &u)) s->bpe = u == 2;
    if (pb_varint_field(sub, sl, 35, &u)) s->byte_fallback = u != 0;
}

// ModelProto.normalizer_spec (field 3): the dummy prefix, whitespace collapsing.
static void sp_read_normalizer_spec(SpModel* s, const uint8_t* sub, size_t sl) {
    uint64_t u;
    if (pb_varint_field(sub, sl, 3, &u)) s->dummy_prefix = u != 0;
    if (pb_varint_field(sub, sl, 4, &u)) s->collapse_ws = u != 0;
}

// What encoding looks up: piece → id of the pieces text may match, the <0xNN> piece of each byte,
// the longest piece.
static void sp_index(SpModel* s) {
    strmap_init(&s->map);
    for (int i = 0; i < s->n; i++) {
        const char* p = s->piece[i];
        unsigned x;
        if (s->type[i] == SP_BYTE && strlen(p) == 6 && sscanf(p, "<0x%2X>", &x) == 1) s->byte_id[x & 255] = i;
        if (s->type[i] == SP_NORMAL || s->type[i] == SP_USER || s->type[i] == SP_UNUSED) {
            int old;
            strmap_put(&s->map, p, i, &old);
            int len = (int)strlen(p);
            if (len > s->maxlen) s->maxlen = len;
        }
    }
}

int sp_open(SpModel** out, const char* spec, Err* e) {
    TokFiles tf;
    *out = NULL;
    if (find_tokenizer(spec, &tf, e)) return -1;
    if (!tf.model[0]) return err_set(e, "%s: generate reads SentencePiece models (tokenizer.model); this is a tokenizer.json", spec);
    SpInfo info;
    if (sp_read(tf.model, &info, e)) return -1;
    char* text;
    size_t n;
    if (read_all(tf.model, &text, &n, e)) return -1;
    SpModel* s = sp_new(&info);
    Pb b = {(const uint8_t*)text, n, 0};
    int f, wt;
    uint64_t v;
    const uint8_t* sub = NULL;
    size_t sl = 0;
    while (pb_next(&b, &f, &wt, &v, &sub, &sl) == 1) {
        if (wt != 2) continue;
        if (f == 1) sp_add_piece(s, sub, sl);
        else if (f == 2) sp_read_trainer_spec(s, sub, sl);
        else if (f == 3) sp_read_normalizer_spec(s, sub, sl);
    }
    free(text);
    sp_index(s);
    *out = s;
    return 0;
}

static int utf8_len(uint8_t c) { return c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1; }

// Piece id of bytes [p, p + n), or -1.
static int sp_find(const SpModel* s, const char* p, int n, char* buf) {
    memcpy(buf, p, (size_t)n);
    buf[n] = 0;
    return strmap_get(&s->map, buf);
}

// Emits the ids of one symbol [p, p + n) with no piece of its own: bytes or unk.
static void sp_emit_fallback(const SpModel* s, const char* p, int n, int32_t* ids, int* k) {
    if (s->byte_fallback) {
        for (int j = 0; j < n; j++) ids[(*k)++] = s->byte_id[(uint8_t)p[j]] >= 0 ? s->byte_id[(uint8_t)p[j]] : s->unk;
    } else {
        ids[(*k)++] = s->unk;
    }
}

// SentencePiece's normalisation of text: spaces → ▁ (U+2581), optional collapse of runs / trim,
// optional dummy prefix. Returns the normalised string (caller frees), *m its length.
static char* sp_normalise(const SpModel* s, const char* text, size_t* m_out) {
    const size_t tn = strlen(text);
    char* t = xmalloc(3 * tn + 8);
    size_t m = 0;
    const char* a = text;
    const char* z = text + tn;
    if (s->collapse_ws) {
        while (a < z && *a == ' ') a++;
        while (z > a && z[-1] == ' ') z--;
    }
    if (s->dummy_prefix && a < z) memcpy(t + m, "\xE2\x96\x81", 3), m += 3;
    for (const char* q = a; q < z; q++) {
        if (*q == ' ') {
            if (s->collapse_ws && q > a && q[-1] == ' ') continue;
            memcpy(t + m, "\xE2\x96\x81", 3), m += 3;
        } else {
            t[m++] = *q;
        }
    }
    t[m] = 0;
    *m_out = m;
    return t;
}

// BPE over t[0, m): symbols are UTF-8 characters; the best-scoring adjacent pair that is a piece
// merges until none is. Appends the ids to ids[*k...]; buf holds m + 1 and maxlen + 1 bytes.
static void sp_encode_bpe(const SpModel* s, const char* t, size_t m, char* buf, int32_t* ids, int* k) {
    int ns = 0;
    int* st = xmalloc(sizeof(int) * (m + 1));
    int* ln = xmalloc(sizeof(int) * (m + 1));
    for (size_t i = 0; i < m;) {
        int l = utf8_len((uint8_t)t[i]);
        if (i + (size_t)l > m) l = (int)(m - i);
        st[ns] = (int)i, ln[ns] = l, ns++;
        i += (size_t)l;
    }
    for (;;) {
        int best = -1;
        float bs = 0;
        for (int i = 0; i + 1 < ns; i++) {
            const int l = ln[i] + ln[i + 1];
            if (l > s->maxlen) continue;
            const int id = sp_find(s, t + st[i], l, buf);
            if (id < 0) continue;
            if (best < 0 || s->score[id] > bs) best = i, bs = s->score[id];
        }
        if (best < 0) break;
        ln[best] += ln[best + 1];
        memmove(st + best + 1, st + best + 2, sizeof(int) * (size_t)(ns - best - 2));
        memmove(ln + best + 1, ln + best + 2, sizeof(int) * (size_t)(ns - best - 2));
        ns--;
    }
    for (int i = 0; i < ns; i++) {
        const int id = sp_find(s, t + st[i], ln[i], buf);
        if (id >= 0) ids[(*k)++] = id;
        else sp_emit_fallback(s, t + st[i], ln[i], ids, k);
    }
    free(st), free(ln);
}

// Unigram over t[0, m): Viterbi over byte positions (pieces start and end on character
// boundaries); a character no piece covers costs the lowest score − 10, as SentencePiece's unk
// penalty. Appends the ids to ids[*k...]; buf as sp_encode_bpe's.
static void sp_encode_unigram(const SpModel* s, const char* t, size_t m, char* buf, int32_t* ids, int* k) {
    float minsc = 0;
    for (int i = 0; i < s->n; i++)
        if (s->score[i] < minsc) minsc = s->score[i];
    double* best = xmalloc(sizeof(double) * (m + 1));
    int* from = xmalloc(sizeof(int) * (m + 1));
    int* pid = xmalloc(sizeof(int) * (m + 1));
    best[0] = 0;
    for (size_t i = 1; i <= m; i++) best[i] = -INFINITY, from[i] = -1, pid[i] = -1;
    for (size_t i = 0; i < m; i++) {
        if (best[i] == -INFINITY || (i && utf8_len((uint8_t)t[i]) == 1 && ((uint8_t)t[i] & 0xC0) == 0x80)) continue;
        const int cl = utf8_len((uint8_t)t[i]);
        for (int l = 1; l <= s->maxlen && i + (size_t)l <= m; l++) {
            const int id = sp_find(s, t + i, l, buf);
            if (id < 0) continue;
            const double sc = best[i] + s->score[id];
            if (sc > best[i + l]) best[i + l] = sc, from[i + l] = (int)i, pid[i + l] = id;
        }
        const size_t j = i + (size_t)cl <= m ? i + (size_t)cl : m;
        const double sc = best[i] + minsc - 10.0;
        if (from[j] < 0 || sc > best[j]) best[j] = sc, from[j] = (int)i, pid[j] = -1;
    }
    int nseg = 0;
    int* seg = xmalloc(sizeof(int) * (m + 1));
    for (int j = (int)m; j > 0; j = from[j]) seg[nseg++] = j;
    for (int q = nseg - 1; q >= 0; q--) {
        const int j = seg[q], i = from[j];
        if (pid[j] >= 0) ids[(*k)++] = pid[j];
        else sp_emit_fallback(s, t + i, j - i, ids, k);
    }
    free(seg), free(best), free(from), free(pid);
}

int sp_encode(const SpModel* s, const char* text, int add_bos, int32_t** out) {
    size_t m;
    char* t = sp_normalise(s, text, &m);
    int32_t* ids = xmalloc(sizeof(int32_t) * (m + 2));
    int k = 0;
    if (add_bos && s->bos >= 0) ids[k++] = s->bos;
    char* buf = xmalloc(m + 1 > (size_t)s->maxlen + 1 ? m + 1 : (size_t)s->maxlen + 1);
    if (s->bpe) sp_encode_bpe(s, t, m, buf, ids, &k);
    else sp_encode_unigram(s, t, m, buf, ids, &k);
    free(buf);
    free(t);
    *out = ids;
    return k;
}

size_t sp_piece_text(const SpModel* s, int id, char* out, size_t cap) {
    if (id < 0 || id >= s->n || !cap) return 0;
    const int ty = s->type[id];
    if (ty == SP_CONTROL || ty == SP_UNKNOWN || ty == SP_UNUSED) return 0;
    const char* p = s->piece[id];
    unsigned x;
    if (ty == SP_BYTE && sscanf(p, "<0x%2X>", &x) == 1) {
        out[0] = (char)x;
        return 1;
    }
    size_t k = 0;
    for (; *p && k < cap; p++) {
        if (!strncmp(p, "\xE2\x96\x81", 3)) {
            out[k++] = ' ';
            p += 2;
        } else {
            out[k++] = *p;
        }
    }
    return k;
}
