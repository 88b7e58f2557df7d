// cli.c — see cli.h.
#include "cli.h"

#include <stdio.h>
#include <string.h>

int cli_load_config(Config* c, int argc, char** argv, int first, int* rest, int* nrest, Err* e) {
    config_defaults(c);
    const char* name = NULL;
    *nrest = 0;
    for (int i = first; i < argc; i++) {
        if (!strcmp(argv[i], "--config") || !strcmp(argv[i], "-c")) {
            if (i + 1 >= argc) return err_set(e, "--config needs a name or a path (e.g. --config L0_sanity)");
            name = argv[++i];
        } else if (!strncmp(argv[i], "--config=", 9)) {
            name = argv[i] + 9;
        } else if (argv[i][0] == '-') {
            rest[(*nrest)++] = i;
            // a flag's value (if any) is the caller's business: pass the next word along too
            if (i + 1 < argc && argv[i + 1][0] != '-' && !strchr(argv[i + 1], '=')) rest[(*nrest)++] = ++i;
        } else if (!strchr(argv[i], '=')) {
            return err_set(e, "unexpected argument '%s' (overrides are section.key=value; see --help)", argv[i]);
        }
    }
    if (!name) return err_set(e, "no config given: use --config NAME (e.g. --config L0_sanity) or --config path/to.yaml");
    char path[CFG_STR];
    if (config_find(name, path, sizeof path, e)) return -1;
    if (config_load_file(c, path, e)) return -1;
    snprintf(c->source, sizeof c->source, "%s", path);
    for (int i = first; i < argc; i++) {
        if (argv[i][0] == '-') {
            if (!strcmp(argv[i], "--config") || !strcmp(argv[i], "-c")) i++;
            continue;
        }
        if (strchr(argv[i], '=') && config_override(c, argv[i], e)) return -1;
    }
    return 0;
}

int cli_resolve_data(Config* c, Err* e) {
    if (c->data.format == DATA_RANDOM || c->data.path[0]) return 0;
    char p[CFG_STR];
    if (config_find_file("data", "hairpin.fa.gz", "", p, sizeof p, e)) return -1;
    snprintf(c->data.path, sizeof c->data.path, "%s", p);
    return 0;
}

int cli_error(const Err* e) {
    fprintf(stderr, "moetrain: error: %s\n", e->msg);
    return 2;
}
