// config_load.c — YAML config files (libyaml document API), `defaults:` chains with cycle
// detection, and finding configs / shipped files (cwd, next to the binary, install prefix).
//
// A config is one YAML mapping of sections to mappings of scalars:
//   defaults: L1_8x7B_ep        # or a list; loaded first, this file then overrides them
//   model:
//     layers: 2
// Every error names file:line:col (libyaml marks, 1-based), the key and what would be valid.
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "config_keys.h"

#ifndef MOETRAIN_PREFIX
#define MOETRAIN_PREFIX "/usr/local"
#endif

#define MAX_DEPTH 16  // nested defaults: files

// ---- finding files ---------------------------------------------------------------------------

static int is_file(const char* p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

// The places shipped files live, in search order: the current directory, the repository of the
// running binary (build/moetrain → ..), an install next to it (bin/moetrain →
// ../share/moetrain), $MOETRAIN_PREFIX and the build's PREFIX (share/moetrain). Deduplicated.
static int search_roots(char roots[][PATH_MAX], int max) {
    char cand[5][PATH_MAX];
    int nc = 0;
    snprintf(cand[nc++], PATH_MAX, ".");
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        char* s = strrchr(exe, '/');
        if (s) {
            *s = 0;
            snprintf(cand[nc++], PATH_MAX, "%.4000s/..", exe);
            snprintf(cand[nc++], PATH_MAX, "%.4000s/../share/moetrain", exe);
        }
    }
    const char* env = getenv("MOETRAIN_PREFIX");
    if (env && env[0]) snprintf(cand[nc++], PATH_MAX, "%.4000s/share/moetrain", env);
    snprintf(cand[nc++], PATH_MAX, "%s/share/moetrain", MOETRAIN_PREFIX);
    int n = 0;
    char real[5][PATH_MAX];
    for (int i = 0; i < nc && n < max; i++) {
        char r[PATH_MAX];
        if (!realpath(cand[i], r)) snprintf(r, sizeof r, "%.4000s", cand[i]);  // missing: still listed as searched
        int dup = 0;
        for (int j = 0; j < n; j++) dup |= strcmp(real[j], r) == 0;
        if (dup) continue;
        memcpy(real[n], r, PATH_MAX);
        snprintf(roots[n++], PATH_MAX, "%s", i == 0 ? "." : r);
    }
    return n;
}

// Appends sep (unless buf is empty) and s to buf[n], truncating.
static void append(char* buf, size_t n, const char* sep, const char* s) {
    size_t o = strlen(buf);
    const char* parts[2] = {o ? sep : "", s};
    for (int i = 0; i < 2; i++)
        for (const char* q = parts[i]; *q && o + 1 < n; q++) buf[o++] = *q;
    buf[o] = 0;
}

static int by_name(const void* a, const void* b) { return strcmp(*(char* const*)a, *(char* const*)b); }

// "a, b, c": the files in ROOT/kind for every root (names without ext), sorted, deduplicated.
static void list_available(char roots[][PATH_MAX], int nroots, const char* kind, const char* ext, char* out, size_t n) {
    char* names[256];
    int nn = 0;
    size_t el = strlen(ext);
    for (int r = 0; r < nroots; r++) {
        char dir[PATH_MAX + 64];
        snprintf(dir, sizeof dir, "%.4000s/%.50s", roots[r], kind);
        DIR* d = opendir(dir);
        if (!d) continue;
        for (struct dirent* de; (de = readdir(d)) && nn < 256;) {
            size_t l = strlen(de->d_name);
            if (de->d_name[0] == '.' || l <= el || strcmp(de->d_name + l - el, ext)) continue;
            char nm[256];
            snprintf(nm, sizeof nm, "%.*s", (int)(l - el), de->d_name);
            int dup = 0;
            for (int i = 0; i < nn; i++) dup |= strcmp(names[i], nm) == 0;
            if (!dup) names[nn++] = xstrdup(nm);
        }
        closedir(d);
    }
    qsort(names, (size_t)nn, sizeof names[0], by_name);
    out[0] = 0;
    for (int i = 0; i < nn; i++) {
        append(out, n, ", ", names[i]);
        free(names[i]);
    }
    if (!nn) snprintf(out, n, "none");
}

static int ends_with(const char* s, const char* suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

int config_find_file(const char* kind, const char* name, const char* ext, char* out, size_t n, Err* e) {
    if (!name || !name[0]) return err_set(e, "empty %s name", kind);
    char roots[5][PATH_MAX];
    int nroots = search_roots(roots, 5);
    enum { MAXC = 12 };
    char cand[MAXC][PATH_MAX + 1100];
    int nc = 0;
    const int add_ext = ext[0] && !ends_with(name, ext);
    snprintf(cand[nc++], sizeof cand[0], "%.1000s", name);
    if (add_ext) snprintf(cand[nc++], sizeof cand[0], "%.1000s%s", name, ext);
    if (name[0] != '/')
        for (int r = 0; r < nroots && nc < MAXC; r++) {
            if (!strcmp(roots[r], ".") && strchr(name, '/')) continue;  // the same as the name itself
            const char* pre = strcmp(roots[r], ".") ? roots[r] : "";  // cwd: plain "configs/NAME.yaml"
            const char* sl = pre[0] ? "/" : "";
            if (strchr(name, '/')) snprintf(cand[nc++], sizeof cand[0], "%.4000s%s%.1000s%s", pre, sl, name, add_ext ? ext : "");
            else snprintf(cand[nc++], sizeof cand[0], "%.4000s%s%s/%.1000s%s", pre, sl, kind, name, add_ext ? ext : "");
        }
    for (int i = 0; i < nc; i++)
        if (is_file(cand[i])) {
            if (strlen(cand[i]) >= n) return err_set(e, "path too long: %.200s", cand[i]);
            snprintf(out, n, "%s", cand[i]);
            return 0;
        }
    struct stat st;
    if (stat(name, &st) == 0 && S_ISDIR(st.st_mode))
        return err_set(e, "%s '%.200s' is a directory; give a file in it (e.g. %.200s/NAME%s)",
                       !strcmp(kind, "configs") ? "config" : kind, name, name, ext);
    char tried[1536] = "", avail[1024];
    for (int i = 0; i < nc; i++) append(tried, sizeof tried, ", ", cand[i]);
    list_available(roots, nroots, kind, ext, avail, sizeof avail);
    const char* what = !strcmp(kind, "configs") ? "config" : kind;
    return err_set(e, "%s '%.200s' not found (looked for %s); available %s: %s", what, name, tried, kind, avail);
}

int config_find(const char* name, char* out, size_t out_size, Err* e) {
    return config_find_file("configs", name, ".yaml", out, out_size, e);
}

// ---- loading ---------------------------------------------------------------------------------

typedef struct Load {
    char stack[MAX_DEPTH][PATH_MAX];  // realpaths of the files being loaded (outermost first)
    int depth;
    Err* e;
} Load;

static int load_path(Config* c, const char* path, Load* ld);

static const char* node_kind(const yaml_node_t* n) {
    return n->type == YAML_SEQUENCE_NODE ? "a list" : n->type == YAML_MAPPING_NODE ? "a mapping" : "a value";
}

// YAML null (an empty, ~ or null plain scalar).
static int is_null(const yaml_node_t* n) {
    const char* v = (const char*)n->data.scalar.value;
    return n->type == YAML_SCALAR_NODE && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           (!v[0] || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL"));
}

// Text of a scalar node, refusing embedded NUL ("\0" in a quoted string).
static const char* scalar(const yaml_node_t* n) {
    if (n->type != YAML_SCALAR_NODE) return NULL;
    if (strlen((const char*)n->data.scalar.value) != n->data.scalar.length) return NULL;
    return (const char*)n->data.scalar.value;
}

#define AT(node) name, (node)->start_mark.line + 1, (node)->start_mark.column + 1

// One `defaults:` entry: NAME relative to the including file's directory first, then like --config.
static int load_include(Config* c, const char* inc, const yaml_node_t* node, const char* name, const char* dir,
                        Load* ld) {
    Err fe;
    char p[PATH_MAX + 600], found[PATH_MAX];
    if (!inc || !inc[0])
        return err_set(ld->e, "%s:%zu:%zu: defaults: expected a config name (e.g. defaults: L1_8x7B_ep)", AT(node));
    if (inc[0] != '/') {
        snprintf(p, sizeof p, "%.4000s/%.500s", dir, inc);
        if (is_file(p)) return load_path(c, p, ld);
        snprintf(p, sizeof p, "%.4000s/%.500s.yaml", dir, inc);
        if (!ends_with(inc, ".yaml") && is_file(p)) return load_path(c, p, ld);
    }
    if (config_find(inc, found, sizeof found, &fe))
        return err_set(ld->e, "%s:%zu:%zu: defaults: %s", AT(node), fe.msg);
    return load_path(c, found, ld);
}

// Applies one parsed document. `dir` resolves defaults: names.
// `defaults:` NAME or [NAME, ...]: each loaded into c, in order.
static int apply_defaults(Config* c, yaml_document_t* doc, yaml_node_t* vn, const char* name, const char* dir, Load* ld) {
    if (vn->type == YAML_SEQUENCE_NODE) {
        for (yaml_node_item_t* it = vn->data.sequence.items.start; it < vn->data.sequence.items.top; it++) {
            yaml_node_t* in = yaml_document_get_node(doc, *it);
            if (load_include(c, scalar(in), in, name, dir, ld)) return -1;
        }
    } else if (load_include(c, is_null(vn) ? NULL : scalar(vn), vn, name, dir, ld)) {
        return -1;
    }
    return 0;
}

// An error for a top-level name that is no section (with a hint: a dotted key, a near name).
static int unknown_section(const char* sec, const yaml_node_t* kn, const char* name, Err* e) {
    const char* dot = strchr(sec, '.');
    if (dot && dot - sec < 64) {
        char s2[64];
        snprintf(s2, sizeof s2, "%.*s", (int)(dot - sec), sec);
        if (config_is_section(s2))
            return err_set(e, "%s:%zu:%zu: '%.100s' at the top level: put '%.60s:' under a '%s:' "
                           "section line", AT(kn), sec, dot + 1, s2);
    }
    char hint[512];
    config_suggest_section(sec, hint, sizeof hint);
    return err_set(e, "%s:%zu:%zu: unknown section '%.100s'%s", AT(kn), sec, hint);
}

// The keys of one section mapping; seen[i]: the line where key i was set in this file.
static int apply_section(Config* c, yaml_document_t* doc, const char* sec, yaml_node_t* vn, int* seen, const char* name,
                         Err* e) {
    int nk;
    char hint[512];
    for (yaml_node_pair_t* q = vn->data.mapping.pairs.start; q < vn->data.mapping.pairs.top; q++) {
        yaml_node_t* kk = yaml_document_get_node(doc, q->key);
        yaml_node_t* kv = yaml_document_get_node(doc, q->value);
        const char* key = scalar(kk);
        if (!key) return err_set(e, "%s:%zu:%zu: expected a key in section '%s', got %s", AT(kk), sec, node_kind(kk));
        char full[300];
        snprintf(full, sizeof full, "%s.%.200s", sec, key);
        const ConfigKey* k = config_key(full);
        if (!k) {
            config_suggest_key(sec, key, hint, sizeof hint);
            return err_set(e, "%s:%zu:%zu: unknown key '%s'%s", AT(kk), full, hint);
        }
        int idx = (int)(k - config_keys(&nk));
        if (seen[idx])
            return err_set(e, "%s:%zu:%zu: %s is set twice (first on line %d)", AT(kk), full, seen[idx]);
        seen[idx] = (int)kk->start_mark.line + 1;
        const char* v = scalar(kv);
        if (kv->type != YAML_SCALAR_NODE)
            return err_set(e, "%s:%zu:%zu: %s: expected a single value, got %s", AT(kv), full, node_kind(kv));
        if (!v) return err_set(e, "%s:%zu:%zu: %s: the value contains a NUL character", AT(kv), full);
        char where[PATH_MAX + 64];
        snprintf(where, sizeof where, "%.4000s:%zu:%zu", AT(kv));
        if (config_set_value(c, k, is_null(kv) ? "" : v, is_null(kv), where, e)) return -1;
    }
    return 0;
}

static int apply_doc(Config* c, yaml_document_t* doc, const char* name, const char* dir, Load* ld) {
    Err* e = ld->e;
    yaml_node_t* root = yaml_document_get_root_node(doc);
    if (!root || is_null(root))  // an empty file is a mistake (a wrong path, a truncated copy), not "all defaults"
        return err_set(e, "%s: the config is empty (no sections); a config sets at least one section or "
                       "`defaults: NAME` (e.g. defaults: L0_sanity)", name);
    if (root->type != YAML_MAPPING_NODE)
        return err_set(e, "%s:%zu:%zu: a config is a mapping of sections (model:, train:, ...), got %s", AT(root),
                       node_kind(root));
    int nk;
    config_keys(&nk);
    int seen[128] = {0};
    CHECK(nk <= 128, "config: more keys than seen[] holds");       // line where each key was set in this file
    char sect_seen[16][16];    // sections seen, for duplicates
    int sect_line[16], nsect = 0;
    int ndefaults = 0;
    for (yaml_node_pair_t* pr = root->data.mapping.pairs.start; pr < root->data.mapping.pairs.top; pr++) {
        yaml_node_t* kn = yaml_document_get_node(doc, pr->key);
        const char* sec = scalar(kn);
        if (sec && !strcmp(sec, "defaults") && ndefaults++)
            return err_set(e, "%s:%zu:%zu: defaults: given twice; use one list (defaults: [a, b])", AT(kn));
    }
    // Pass 0: defaults (loaded first, whatever their position); pass 1: the sections.
    for (int pass = 0; pass < 2; pass++) {
        for (yaml_node_pair_t* pr = root->data.mapping.pairs.start; pr < root->data.mapping.pairs.top; pr++) {
            yaml_node_t* kn = yaml_document_get_node(doc, pr->key);
            yaml_node_t* vn = yaml_document_get_node(doc, pr->value);
            const char* sec = scalar(kn);
            if (!sec) return err_set(e, "%s:%zu:%zu: expected a section name, got %s", AT(kn), node_kind(kn));
            if (!strcmp(sec, "defaults")) {
                if (pass) continue;
                if (apply_defaults(c, doc, vn, name, dir, ld)) return -1;
                continue;
            }
            if (!pass) continue;
            if (!config_is_section(sec)) return unknown_section(sec, kn, name, e);
            for (int i = 0; i < nsect; i++)
                if (!strcmp(sect_seen[i], sec))
                    return err_set(e, "%s:%zu:%zu: section '%s' appears twice (first on line %d); merge them", AT(kn),
                                   sec, sect_line[i]);
            snprintf(sect_seen[nsect], sizeof sect_seen[0], "%s", sec);
            sect_line[nsect++] = (int)kn->start_mark.line + 1;
            if (is_null(vn)) continue;  // "train:" with nothing under it
            if (vn->type != YAML_MAPPING_NODE)
                return err_set(e, "%s:%zu:%zu: section '%s' must be a mapping of keys (indented 'key: value' lines "
                               "under '%s:'), got %s", AT(vn), sec, sec, node_kind(vn));
            if (apply_section(c, doc, sec, vn, seen, name, e)) return -1;
        }
    }
    return 0;
}

static int syntax_error(const yaml_parser_t* p, const char* name, Err* e) {
    const char* what = p->problem ? p->problem : "unknown problem";
    if (p->error == YAML_READER_ERROR)  // bad encoding: libyaml gives a byte offset, not a mark
        return err_set(e, "%s: byte %zu: YAML syntax error: %s (a config is UTF-8 text)", name, p->problem_offset, what);
    if (p->error == YAML_MEMORY_ERROR) return err_set(e, "%s: out of memory parsing YAML", name);
    char ctx[300] = "";
    if (p->context)
        snprintf(ctx, sizeof ctx, " (%s at line %zu, column %zu)", p->context, p->context_mark.line + 1,
                 p->context_mark.column + 1);
    return err_set(e, "%s:%zu:%zu: YAML syntax error: %s%s", name, p->problem_mark.line + 1, p->problem_mark.column + 1,
                   what, ctx);
}

// A config is sections of keys: two levels of nesting. libyaml's cost grows with the square of
// the nesting depth (a 200 KB file of nested brackets takes it minutes), so the events are
// walked first and a file nested deeper than MAX_NEST is refused at once, before the document
// is built.
#define MAX_NEST 32
#define MAX_CONFIG_BYTES (1 << 20)

static int check_nesting(const char* text, size_t len, const char* name, Err* e) {
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) FATAL("libyaml: out of memory");
    yaml_parser_set_input_string(&p, (const unsigned char*)text, len);
    int depth = 0, rc = 0;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            rc = syntax_error(&p, name, e);
            break;
        }
        const yaml_event_type_t t = ev.type;
        const yaml_mark_t m = ev.start_mark;
        yaml_event_delete(&ev);
        if (t == YAML_SEQUENCE_START_EVENT || t == YAML_MAPPING_START_EVENT) {
            if (++depth > MAX_NEST) {
                rc = err_set(e, "%s:%zu:%zu: nested more than %d levels deep; a config is sections of keys (two levels)",
                             name, m.line + 1, m.column + 1, MAX_NEST);
                break;
            }
        } else if (t == YAML_SEQUENCE_END_EVENT || t == YAML_MAPPING_END_EVENT) {
            depth--;
        } else if (t == YAML_STREAM_END_EVENT) {
            break;
        }
    }
    yaml_parser_delete(&p);
    return rc;
}

// Parses the stream in p (one document) and applies it.
static int load_parser(Config* c, yaml_parser_t* p, const char* name, const char* dir, Load* ld) {
    yaml_document_t doc, extra;
    if (!yaml_parser_load(p, &doc)) return syntax_error(p, name, ld->e);
    int rc = apply_doc(c, &doc, name, dir, ld);
    if (rc == 0 && yaml_document_get_root_node(&doc)) {  // a second document is a mistake
        if (!yaml_parser_load(p, &extra)) {
            rc = syntax_error(p, name, ld->e);
        } else {
            yaml_node_t* r2 = yaml_document_get_root_node(&extra);
            if (r2) rc = err_set(ld->e, "%s:%zu:%zu: a config file holds one YAML document (found a second '---')",
                                 name, r2->start_mark.line + 1, r2->start_mark.column + 1);
            yaml_document_delete(&extra);
        }
    }
    yaml_document_delete(&doc);
    return rc;
}

static int load_path(Config* c, const char* path, Load* ld) {
    struct stat st;
    if (stat(path, &st) != 0) return err_set(ld->e, "cannot open config %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return err_set(ld->e, "config %s is not a regular file", path);
    char real[PATH_MAX];
    if (!realpath(path, real)) return err_set(ld->e, "cannot open config %s: %s", path, strerror(errno));
    for (int i = 0; i < ld->depth; i++)
        if (!strcmp(ld->stack[i], real)) {
            char chain[1024] = "";
            for (int j = i; j < ld->depth; j++) append(chain, sizeof chain, " -> ", ld->stack[j]);
            append(chain, sizeof chain, " -> ", real);
            return err_set(ld->e, "defaults: include cycle: %s", chain);
        }
    if (ld->depth == MAX_DEPTH)
        return err_set(ld->e, "%s: defaults: nested more than %d files deep", path, MAX_DEPTH);
    if (st.st_size > MAX_CONFIG_BYTES)
        return err_set(ld->e, "config %s: %lld bytes; a config is at most %d bytes (is it the right file?)", path,
                       (long long)st.st_size, MAX_CONFIG_BYTES);
    FILE* f = fopen(path, "rb");
    if (!f) return err_set(ld->e, "cannot open config %s: %s", path, strerror(errno));
    char* text = xmalloc((size_t)st.st_size + 1);
    size_t len = fread(text, 1, (size_t)st.st_size + 1, f);
    const int rerr = ferror(f);
    fclose(f);
    if (rerr || len > (size_t)st.st_size) {
        free(text);
        return err_set(ld->e, "cannot read config %s%s", path, rerr ? ": read error" : ": it changed while being read");
    }
    if (check_nesting(text, len, path, ld->e)) {
        free(text);
        return -1;
    }
    memcpy(ld->stack[ld->depth++], real, PATH_MAX);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char* s = strrchr(dir, '/');
    if (s) *s = 0;
    else snprintf(dir, sizeof dir, ".");
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) FATAL("libyaml: out of memory");
    yaml_parser_set_input_string(&p, (const unsigned char*)text, len);
    int rc = load_parser(c, &p, path, dir, ld);
    yaml_parser_delete(&p);
    free(text);
    ld->depth--;
    return rc;
}

int config_load_file(Config* c, const char* path, Err* e) {
    Config tmp = *c;  // c changes only on success
    Load* ld = xcalloc(1, sizeof *ld);
    ld->e = e;
    int rc = load_path(&tmp, path, ld);
    free(ld);
    if (rc) return -1;
    snprintf(tmp.source, sizeof tmp.source, "%s", path);
    *c = tmp;
    return 0;
}

int config_load_string(Config* c, const char* text, size_t len, const char* name, Err* e) {
    Config tmp = *c;
    if (len > MAX_CONFIG_BYTES)
        return err_set(e, "%s: %zu bytes; a config is at most %d bytes", name, len, MAX_CONFIG_BYTES);
    if (check_nesting(text, len, name, e)) return -1;
    Load* ld = xcalloc(1, sizeof *ld);
    ld->e = e;
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) FATAL("libyaml: out of memory");
    yaml_parser_set_input_string(&p, (const unsigned char*)text, len);
    int rc = load_parser(&tmp, &p, name, ".", ld);
    yaml_parser_delete(&p);
    free(ld);
    if (rc) return -1;
    *c = tmp;
    return 0;
}
