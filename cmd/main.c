// main.c — moetrain's entry point: subcommand dispatch.
#include <stdio.h>
#include <string.h>

#include "ckpt_cmds.h"
#include "cli.h"

static void usage(FILE* f) {
    fprintf(f,
            "moetrain %s — a trainer for Mixtral-style mixture-of-experts models\n\n"
            "usage:\n"
            "  moetrain [train] --config NAME|PATH [section.key=value ...]   train (default)\n"
            "  moetrain plan --config NAME|PATH [overrides] [--world N] [--gpu-mem GiB]\n"
            "  moetrain inspect DIR                        what a checkpoint holds; checksums\n"
            "  moetrain export --ckpt DIR --out HF_DIR [--dtype bf16|fp32] [--tokenizer PATH]\n"
            "  moetrain eval --ckpt DIR [--config NAME|PATH] [section.key=value ...]\n"
            "                                              validation loss / bits per token of a checkpoint\n"
            "  moetrain generate --ckpt DIR|HF_DIR --prompt TEXT [--max-new N] [--temperature T] [--top-k K] [--top-p P]\n"
            "                                              continue prompts with a KV cache (docs/generate.md)\n"
            "  moetrain --keys                             every config key (docs/config.md)\n"
            "  moetrain --help | --version\n\n"
            "NAME finds configs/NAME.yaml next to the binary, in the current directory or under\n"
            "the install prefix. Override any key as section.key=value, e.g. train.steps=100 checkpoint.dir=/ckpt.\n"
            "Launch several ranks with mpirun: mpirun -np 8 moetrain --config L1_8x7B_ep data.path=shards checkpoint.dir=/ckpt\n"
            "(shards: scripts/tokenize_data.py, docs/data.md).\n",
            MOETRAIN_VERSION);
}

int main(int argc, char** argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("moetrain %s\n", MOETRAIN_VERSION);
        return 0;
    }
    if (!strcmp(argv[1], "--keys")) {  // the config key table (Markdown), as in docs/config.md
        config_print_keys(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "plan")) {
        if (argc > 2 && !strcmp(argv[2], "--help")) {
            printf("moetrain plan --config NAME|PATH [section.key=value ...] [--world N] [--gpu-mem GiB]\n"
                   "  parameters, active parameters, training FLOPs per token and memory per rank\n");
            return 0;
        }
        return cmd_plan(argc - 1, argv + 1);
    }
    if (!strcmp(argv[1], "train")) return cmd_train(argc - 1, argv + 1);
    if (!strcmp(argv[1], "inspect")) return cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(argv[1], "export")) return cmd_export(argc - 1, argv + 1);
    if (!strcmp(argv[1], "eval")) return cmd_eval(argc - 1, argv + 1);
    if (!strcmp(argv[1], "generate")) return cmd_generate(argc - 1, argv + 1);
    if (argv[1][0] == '-' || strchr(argv[1], '=')) return cmd_train(argc, argv);
    fprintf(stderr, "moetrain: unknown subcommand '%s' (train, plan, inspect, export, eval, generate; see --help)\n", argv[1]);
    return 2;
}
