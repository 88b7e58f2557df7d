// tok_find.c — the tokenizer files of an export or of `moetrain generate` (see hf.h): found from
// a path (a file, a directory, a manifest.json of scripts/tokenize_data.py) or from what a run
// recorded (data.tokenizer, the manifest beside its shards).
#define _DEFAULT_SOURCE
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt_internal.h"
#include "minijson.h"
#include "tok_internal.h"

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

int tok_read_all(const char* path, char** buf, size_t* n, Err* e) {
    *buf = ckpt_read_text(path, TOK_MAX_BYTES, n, e);
    return *buf ? 0 : -1;
}

static int find_in_dir(const char* dir, TokFiles* t, int depth, Err* e);

// manifest.json of scripts/tokenize_data.py: its tokenizer directory.
static int from_manifest(const char* path, TokFiles* t, int depth, Err* e) {
    char* text;
    size_t n;
    if (tok_read_all(path, &text, &n, e)) return -1;
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

int tok_find(const char* spec, TokFiles* t, Err* e) {
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
