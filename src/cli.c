// cli.c — see cli.h.
#define _DEFAULT_SOURCE
#include "cli.h"

#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int is_config_flag(const char* a) { return !strcmp(a, "--config") || !strcmp(a, "-c"); }

// A word that is a flag's value: not a --flag and not section.key=value.
static int is_value(const char* a) { return a && strncmp(a, "--", 2) != 0 && !strchr(a, '='); }

int cli_load_config(Config* c, int argc, char** argv, int* argi, Err* e) {
    config_defaults(c);
    const char* name = NULL;
    int end = argc, next = argc;
    for (int i = *argi; i < argc; i++) {
        const char* a = argv[i];
        if (!strcmp(a, "--")) {
            end = i;
            next = i + 1;
            break;
        }
        if (is_config_flag(a)) {
            if (i + 1 >= argc || !is_value(argv[i + 1]))
                return err_set(e, "--config needs a name or a path (e.g. --config L0_sanity)");
            if (name) return err_set(e, "--config given twice ('%s' and '%s'); give one", name, argv[i + 1]);
            name = argv[++i];
        } else if (!strncmp(a, "--config=", 9)) {
            if (name) return err_set(e, "--config given twice ('%s' and '%s'); give one", name, a + 9);
            name = a + 9;
        } else if (!strncmp(a, "--", 2)) {
            if (!strchr(a, '=') && i + 1 < argc && is_value(argv[i + 1])) i++;  // the caller's flag and value
        } else if (!strchr(a, '=')) {
            return err_set(e, "unexpected argument '%s' (expected --config NAME, section.key=value or a --flag)", a);
        }
    }
    if (!name || !name[0])
        return err_set(e, "no config given: add --config NAME (e.g. --config L0_sanity) or --config path/to.yaml");
    char path[CFG_STR];
    if (config_find(name, path, sizeof path, e)) return -1;
    if (config_load_file(c, path, e)) return -1;
    for (int i = *argi; i < end; i++) {
        const char* a = argv[i];
        if (is_config_flag(a) || (!strncmp(a, "--", 2) && !strchr(a, '=') && i + 1 < end && is_value(argv[i + 1]))) {
            i++;
            continue;
        }
        if (!strncmp(a, "--", 2)) continue;
        if (config_override(c, a, e)) return -1;
    }
    *argi = next;
    return 0;
}

int cli_exit_error(const char* what, const Err* e) {
    if (what && what[0]) fprintf(stderr, "moetrain: error: %s: %s\n", what, e->msg);
    else fprintf(stderr, "moetrain: error: %s\n", e->msg);
    fflush(stderr);
    return 2;
}

// Checks each comma item of a data.path / data.val_path list: a glob must match, a file or
// directory must exist (as given, or found by config_find_file: then the found path replaces it).
static int resolve_list(char* list, size_t cap, const char* key, Err* e) {
    char in[CFG_STR], outs[CFG_STR] = "";
    snprintf(in, sizeof in, "%s", list);
    size_t o = 0;
    char* items[CFG_STR / 2];  // a list of CFG_STR characters has fewer items
    const int n = split_list_inplace(in, items, CFG_STR / 2);
    for (int i = 0; i < n; i++) {
        char* it = items[i];
        char p[CFG_STR];
        snprintf(p, sizeof p, "%s", it);
        struct stat st;
        if (strpbrk(it, "*?[")) {
            glob_t g;
            int rc = glob(it, 0, NULL, &g);
            size_t k = rc == 0 ? g.gl_pathc : 0;
            if (rc == 0) globfree(&g);
            if (!k) return err_set(e, "%s: the pattern '%s' matches no file", key, it);
        } else if (stat(it, &st) != 0) {
            Err fe;
            if (config_find_file("data", it, "", p, sizeof p, &fe))
                return err_set(e, "%s: '%s': %s; give existing files, directories or globs (comma-separated)%s", key,
                               it, fe.msg, !strcmp(key, "data.path") ? ", or data.path= (empty) for the shipped "
                               "data/hairpin.fa.gz" : "");
        }
        int w = snprintf(outs + o, sizeof outs - o, "%s%s", o ? "," : "", p);
        if (w < 0 || (size_t)w >= sizeof outs - o) return err_set(e, "%s: the resolved list is too long", key);
        o += (size_t)w;
    }
    snprintf(list, cap, "%s", outs);
    return 0;
}

int cli_resolve_data_path(Config* c, Err* e) {
    if (c->data.format == DATA_RANDOM) return 0;
    if (c->data.val_path[0] && resolve_list(c->data.val_path, sizeof c->data.val_path, "data.val_path", e)) return -1;
    if (c->data.path[0]) return resolve_list(c->data.path, sizeof c->data.path, "data.path", e);
    char p[CFG_STR];
    Err fe;
    if (config_find_file("data", "hairpin.fa.gz", "", p, sizeof p, &fe))
        return err_set(e, "data.path is empty (= the shipped data/hairpin.fa.gz), but %s; give data.path=FILE", fe.msg);
    snprintf(c->data.path, sizeof c->data.path, "%s", p);
    return 0;
}

int cli_flag(int argc, char** argv, int argi, const char* flag, const char** value) {
    size_t n = strlen(flag);
    int found = 0;
    for (int i = argi; i < argc && strcmp(argv[i], "--"); i++) {
        if (!strcmp(argv[i], flag)) {
            found = 1;
            *value = i + 1 < argc && is_value(argv[i + 1]) ? argv[i + 1] : NULL;
        } else if (!strncmp(argv[i], flag, n) && argv[i][n] == '=') {
            found = 1;
            *value = argv[i] + n + 1;
        }
    }
    return found;
}

int cli_flag_int(int argc, char** argv, int argi, const char* flag, int lo, int hi, int* out, Err* e) {
    const char* v = NULL;
    if (!cli_flag(argc, argv, argi, flag, &v)) return 0;
    char* end = NULL;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || !*v || *end || errno || x < lo || x > hi)
        return err_set(e, "%s: expected an integer from %d to %d, got '%s'", flag, lo, hi, v ? v : "nothing");
    *out = (int)x;
    return 0;
}

int cli_flag_double(int argc, char** argv, int argi, const char* flag, double lo, double hi, double* out, Err* e) {
    const char* v = NULL;
    if (!cli_flag(argc, argv, argi, flag, &v)) return 0;
    char* end = NULL;
    errno = 0;
    double x = v ? strtod(v, &end) : 0;
    if (!v || !*v || *end || errno || !(x >= lo && x <= hi))
        return err_set(e, "%s: expected a number from %g to %g, got '%s'", flag, lo, hi, v ? v : "nothing");
    *out = x;
    return 0;
}

int cli_check_flags(int argc, char** argv, int argi, const char* const* known, Err* e) {
    for (int i = argi; i < argc && strcmp(argv[i], "--"); i++) {
        const char* a = argv[i];
        if (strncmp(a, "--", 2) || is_config_flag(a) || !strncmp(a, "--config=", 9)) continue;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(strchr(a, '=') ? strchr(a, '=') - a : (long)strlen(a)), a);
        int ok = 0, bd = INT_MAX;
        const char* best = NULL;
        char list[512] = "--config NAME|PATH";
        for (const char* const* k = known; k && *k; k++) {
            if (!strcmp(name, *k)) ok = 1;
            int d = edit_distance(name, *k);
            if (d < bd) bd = d, best = *k;
            size_t o = strlen(list);
            snprintf(list + o, sizeof list - o, ", %s", *k);
        }
        if (ok) continue;
        char hint[160] = "";
        if (best && bd <= 3) snprintf(hint, sizeof hint, " (did you mean %s?)", best);
        return err_set(e, "unknown option '%s'%s; options here: %s, section.key=value", name, hint, list);
    }
    return 0;
}
