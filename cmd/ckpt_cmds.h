// ckpt_cmds.h — the checkpoint subcommands (cmd/ckpt_cmds.c), for cmd/main.c.
#pragma once
#include "config.h"

// moetrain inspect DIR: exit 0 when every checksum holds, 1 when a file is bad, 2 on usage /
// not a checkpoint.
int cmd_inspect(int argc, char** argv);
// moetrain export --ckpt DIR --out HF_DIR [--dtype bf16|fp32]: exit 0, or 2 with a message.
int cmd_export(int argc, char** argv);
// moetrain eval --ckpt DIR [--config X] [overrides] (cmd/eval.c): validation loss and bits per
// token of a checkpoint or a Hugging Face directory; exit 0, or 2 with a message.
int cmd_eval(int argc, char** argv);
// cmd/eval.c, shared with generate: a Hugging Face directory (or .safetensors file)?
int ckpt_is_hf_dir(const char* p);
// The config of a checkpoint: --config in argv, else the checkpoint's stored one (hf: its
// config.json and defaults); then argv's section.key=value overrides. *ref_world: the world
// size the checkpoint was saved from (0 = unknown).
int eval_load_config(Config* c, int argc, char** argv, const char* ck, int hf, int* ref_world, Err* e);
// cmd/eval.c, shared with generate: parallel.ep lowered to the largest EP that divides both the
// launch's world size and the experts (at most the configured one) when it does not fit them.
void eval_fit_ep(Config* c, int world);
// cmd/eval.c, shared with generate: a forward-only run that saves and logs nothing and keeps no
// SwiGLU output; the weights from init_from (a Hugging Face directory, "" for random weights) or,
// with init_from NULL, resumed from the checkpoint ck.
void eval_forward_only(Config* c, const char* ck, const char* init_from);
// moetrain generate (cmd/generate.c): text from a checkpoint with a KV cache; exit 0, or 2.
int cmd_generate(int argc, char** argv);
