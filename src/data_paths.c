// data_paths.c — what data.path and data.val_path name (a file, a comma list, a glob, or a
// directory of shards whose val_*.bin are validation data) expanded into path lists, and the
// document separator a shard directory's manifest.json records. data.c's data_open uses them.
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data_impl.h"
#include "minijson.h"
#include "util.h"

static void copy_str(char* out, size_t n, const char* s) {
    size_t k = strlen(s);
    if (k < n) memcpy(out, s, k + 1);
}

void data_resolve_path(const char* p, char* out, size_t n) {
    snprintf(out, n, "%s", p);
    if (p[0] == '/' || access(p, F_OK) == 0) return;
    char dir[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", dir, sizeof dir - 1);
    if (k > 0) {
        dir[k] = 0;
        for (int up = 0; up < 4; up++) {
            char* sl = strrchr(dir, '/');
            if (!sl || sl == dir) break;
            *sl = 0;
            char cand[2 * PATH_MAX];
            snprintf(cand, sizeof cand, "%s/%s", dir, p);
            if (access(cand, F_OK) == 0) { copy_str(out, n, cand); return; }
        }
    }
    char cand[2 * PATH_MAX];
    snprintf(cand, sizeof cand, "%s/share/moetrain/%s", MOETRAIN_PREFIX, p);
    if (access(cand, F_OK) == 0) copy_str(out, n, cand);
}

// ---- paths: lists, globs, directories -------------------------------------------------------


void path_list_add(PathList* l, const char* s) {
    l->p = realloc(l->p, sizeof(char*) * (size_t)(l->n + 1));
    CHECK(l->p, "out of host memory");
    l->p[l->n++] = strdup(s);
}

void path_list_free(PathList* l) {
    for (int i = 0; i < l->n; i++) free(l->p[i]);
    free(l->p);
    memset(l, 0, sizeof *l);
}

static int cmp_str(const void* a, const void* b) { return strcmp(*(char* const*)a, *(char* const*)b); }

int data_is_val_shard(const char* base) {
    return !strncmp(base, "val_", 4) || !strncmp(base, "val.", 4) || strstr(base, "_val_") || strstr(base, "_val.");
}

static int ends_bin(const char* s) {
    size_t n = strlen(s);
    return n > 4 && !strcmp(s + n - 4, ".bin");
}

// The *.bin files of a directory, sorted; validation shards (data_is_val_shard) go to val, the
// rest to train.
static int list_dir(const char* dir, PathList* train, PathList* val, Err* e) {
    DIR* d = opendir(dir);
    if (!d) return err_set(e, "data: cannot read the directory %s (%s)", dir, strerror(errno));
    PathList t = {0}, v = {0};
    for (struct dirent* de; (de = readdir(d));) {
        if (de->d_name[0] == '.' || !ends_bin(de->d_name)) continue;  // temp files of a running tokenize start with '.'
        char p[PATH_MAX];
        if (snprintf(p, sizeof p, "%s/%s", dir, de->d_name) >= (int)sizeof p) continue;
        struct stat st;
        if (stat(p, &st) || !S_ISREG(st.st_mode)) continue;
        path_list_add(data_is_val_shard(de->d_name) ? &v : &t, p);
    }
    closedir(d);
    qsort(t.p, (size_t)t.n, sizeof(char*), cmp_str);
    qsort(v.p, (size_t)v.n, sizeof(char*), cmp_str);
    for (int i = 0; i < t.n; i++) path_list_add(train, t.p[i]);
    for (int i = 0; i < v.n; i++) path_list_add(val, v.p[i]);
    int nt = t.n, nv = v.n;
    path_list_free(&t);
    path_list_free(&v);
    if (!nt && !nv)
        return err_set(e, "data: the directory %s holds no .bin shards; make them with scripts/tokenize_data.py "
                       "(see docs/data.md)", dir);
    return 0;
}

// One data.path / data.val_path item: a glob (its matches, sorted), a directory (its *.bin) or a
// file (looked for next to the binary too). For a directory, for_val picks its validation shards
// (all of them when it has none); else the train shards go to out and the validation shards to
// dir_val.
int path_list_expand(const char* item, int for_val, PathList* out, PathList* dir_val, Err* e) {
    if (strpbrk(item, "*?[")) {
        glob_t g;
        int rc = glob(item, 0, NULL, &g);
        if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
            if (rc == 0) globfree(&g);
            return err_set(e, "data: the pattern '%s' matches no file", item);
        }
        if (rc) return err_set(e, "data: cannot expand the pattern '%s'", item);
        for (size_t i = 0; i < g.gl_pathc; i++) path_list_add(out, g.gl_pathv[i]);  // glob sorts
        globfree(&g);
        return 0;
    }
    char path[PATH_MAX];
    data_resolve_path(item, path, sizeof path);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        PathList t = {0}, v = {0};
        int rc = list_dir(path, &t, &v, e);
        if (!rc) {
            if (for_val) {
                PathList* use = v.n ? &v : &t;
                for (int i = 0; i < use->n; i++) path_list_add(out, use->p[i]);
            } else if (!t.n) {
                rc = err_set(e, "data: the directory %s holds only validation shards (val_*.bin); give its train "
                             "shards in data.path", path);
            } else {
                for (int i = 0; i < t.n; i++) path_list_add(out, t.p[i]);
                for (int i = 0; i < v.n; i++) path_list_add(dir_val, v.p[i]);
            }
        }
        path_list_free(&t);
        path_list_free(&v);
        return rc;
    }
    path_list_add(out, path);
    return 0;
}

// ---- the separator ------------------------------------------------------------------------------

// eos_id of the manifest.json beside a shard, or -1.
int shard_manifest_eos(const char* shard) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", shard);
    char* sl = strrchr(p, '/');
    if (sl) snprintf(sl + 1, sizeof p - (size_t)(sl + 1 - p), "manifest.json");
    else snprintf(p, sizeof p, "manifest.json");
    FILE* f = fopen(p, "rb");
    if (!f) return -1;
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    JsDoc doc;
    char err[128];
    int eos = -1;
    if (js_parse(&doc, buf, n, JS_DEFAULT_LIMITS, err, sizeof err) == 0) {
        const JsVal* v = js_get(&doc.root, "eos_id");
        if (v && v->type == JS_NUM && v->is_int && v->i >= 0 && v->i < INT_MAX) eos = (int)v->i;
    }
    js_free(&doc);
    return eos;
}

