// cli.h — the command line shared by the subcommands: config loading, flags, user-error exits.
//
//   moetrain SUBCOMMAND --config NAME|PATH [section.key=value ...] [--flag VALUE ...]
//
// Precedence: key defaults < the config's `defaults:` chain < the config file < overrides (in
// argv order). User errors exit with code 2 and one line "moetrain: error: ..." on stderr.
#pragma once
#include "config.h"

// Loads defaults, then `--config NAME|PATH` (also --config=NAME, -c NAME; required), then
// every `section.key=value` of argv[*argi .. argc) in order. Scanning stops at "--", and *argi
// is set to the index after it (argc when there is none). Other `--flags` are the caller's:
// they are skipped with their value (the next word, unless it starts with "--" or contains
// '='); read them with cli_flag*, reject unknown ones with cli_check_flags. Any other word is
// an error. The config is not validated (that needs the world size: config_validate).
int cli_load_config(Config* c, int argc, char** argv, int* argi, Err* e);

// Prints "moetrain: error: WHAT: MESSAGE" (or without "WHAT: " when what is NULL or "") to
// stderr and returns 2, the exit code of user errors: `return cli_exit_error(NULL, &e);`.
int cli_exit_error(const char* what, const Err* e);

// data.path "" → the shipped data/hairpin.fa.gz (./data, the binary's repository, or
// PREFIX/share/moetrain/data); a relative path missing from the current directory is looked up
// in the same places. No-op for data.format=random. Writes the resolved path into c.
int cli_resolve_data_path(Config* c, Err* e);

// The value of `--flag VALUE` or `--flag=VALUE` in argv[argi .. argc) (the last one wins):
// returns 1 and sets *value (NULL when the flag has no value), or 0 when absent.
int cli_flag(int argc, char** argv, int argi, const char* flag, const char** value);
// An integer / number flag in [lo, hi]; *out keeps its value when the flag is absent.
int cli_flag_int(int argc, char** argv, int argi, const char* flag, int lo, int hi, int* out, Err* e);
int cli_flag_double(int argc, char** argv, int argi, const char* flag, double lo, double hi, double* out, Err* e);
// Fails on any `--flag` of argv[argi ..] that is neither --config nor in known (NULL-ended,
// e.g. {"--world", "--gpu-mem", NULL}), with the nearest known flag as a suggestion.
int cli_check_flags(int argc, char** argv, int argi, const char* const* known, Err* e);

// The subcommands (cmd/*.c), for cmd/main.c.
int cmd_train(int argc, char** argv);
int cmd_plan(int argc, char** argv);
