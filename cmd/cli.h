// cli.h — shared command-line handling of the subcommands.
#pragma once
#include "config.h"

// Loads defaults, then --config NAME|PATH, then section.key=value overrides from argv[first..].
// Other --flags are left for the caller: their indices are returned in rest[] (count *nrest).
int cli_load_config(Config* c, int argc, char** argv, int first, int* rest, int* nrest, Err* e);
// Resolves data.path "" to the shipped data/hairpin.fa.gz (next to the binary or installed).
int cli_resolve_data(Config* c, Err* e);
// "moetrain: error: MSG" on stderr (rank 0 only when all ranks share the error); returns 2.
int cli_error(const Err* e);

int cmd_train(int argc, char** argv);
int cmd_plan(int argc, char** argv);
