// plan.c — `moetrain plan --config X [section.key=value ...] [--world N] [--gpu-mem GiB]`:
// parameters, active parameters, training FLOPs per token and the memory of one rank, without
// a GPU or MPI. The numbers come from src/plan.c; this file is the command line.
//
// The arguments are parsed here with config.h alone (plan knows all its flags, so nothing is
// ambiguous), which keeps this file independent of which cli helper the build links.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "config.h"
#include "plan.h"

static int plan_error(const Err* e) {
    fprintf(stderr, "moetrain: error: %s\n", e->msg);
    return 2;
}

// "--flag VALUE" or "--flag=VALUE" at argv[*i]: 1 and *v set (advancing *i), 0 if not this flag,
// -1 if the value is missing.
static int flag(int argc, char** argv, int* i, const char* name, const char** v) {
    size_t n = strlen(name);
    if (!strncmp(argv[*i], name, n) && argv[*i][n] == '=') {
        *v = argv[*i] + n + 1;
        return 1;
    }
    if (strcmp(argv[*i], name)) return 0;
    if (*i + 1 >= argc) return -1;
    *v = argv[++*i];
    return 1;
}

int cmd_plan(int argc, char** argv) {
    Err e = {{0}};
    const char *name = NULL, *world_s = NULL, *gpu_s = NULL;
    for (int i = 1; i < argc; i++) {
        const char* v = NULL;
        int r;
        if ((r = flag(argc, argv, &i, "--config", &v)) || (r = flag(argc, argv, &i, "-c", &v))) {
            if (r < 0) return plan_error(&(Err){"--config needs a name or a path (e.g. --config L1_8x7B_ep)"});
            name = v;
        } else if ((r = flag(argc, argv, &i, "--world", &v))) {
            if (r < 0) return plan_error(&(Err){"--world needs a number of ranks"});
            world_s = v;
        } else if ((r = flag(argc, argv, &i, "--gpu-mem", &v))) {
            if (r < 0) return plan_error(&(Err){"--gpu-mem needs the GPU memory in GiB"});
            gpu_s = v;
        } else if (argv[i][0] == '-') {
            err_set(&e, "plan: unknown option '%s' (options: --config NAME|PATH, --world N, --gpu-mem GiB, "
                        "section.key=value)", argv[i]);
            return plan_error(&e);
        } else if (!strchr(argv[i], '=')) {
            err_set(&e, "plan: unexpected argument '%s' (overrides are section.key=value)", argv[i]);
            return plan_error(&e);
        }
    }
    if (!name) return plan_error(&(Err){"plan: no config given: add --config NAME (e.g. --config L1_8x7B_ep)"});
    Config c;
    char path[CFG_STR];
    config_defaults(&c);
    if (config_find(name, path, sizeof path, &e) || config_load_file(&c, path, &e)) return plan_error(&e);
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-') {
            if (!strchr(argv[i], '=')) i++;  // a flag's value
            continue;
        }
        if (config_override(&c, argv[i], &e)) return plan_error(&e);
    }
    int world = c.parallel.ep;
    double gpu = 140;  // GiB: one H200 (nvidia-smi: 143,771 MiB = 140.4 GiB, less the CUDA context)
    char* end = NULL;
    if (world_s) {
        errno = 0;
        long w = strtol(world_s, &end, 10);
        if (!*world_s || *end || errno || w < 1 || w > 1 << 20) {
            err_set(&e, "--world: expected a number of ranks >= 1, got '%s'", world_s);
            return plan_error(&e);
        }
        world = (int)w;
    }
    if (gpu_s) {
        gpu = strtod(gpu_s, &end);
        if (!*gpu_s || *end || !(gpu > 0 && gpu < 1e6)) {
            err_set(&e, "--gpu-mem: expected GiB > 0, got '%s'", gpu_s);
            return plan_error(&e);
        }
    }
    if (plan_report(&c, world, gpu, stdout, &e)) return plan_error(&e);
    return 0;
}
