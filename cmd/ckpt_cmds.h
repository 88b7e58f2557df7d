// ckpt_cmds.h — the checkpoint subcommands (cmd/ckpt_cmds.c), for cmd/main.c.
#pragma once

// moetrain inspect DIR: exit 0 when every checksum holds, 1 when a file is bad, 2 on usage /
// not a checkpoint.
int cmd_inspect(int argc, char** argv);
// moetrain export --ckpt DIR --out HF_DIR [--dtype bf16|fp32]: exit 0, or 2 with a message.
int cmd_export(int argc, char** argv);
// moetrain eval --ckpt DIR [--config X] [overrides] (cmd/eval.c): validation loss and bits per
// token of a checkpoint or a Hugging Face directory; exit 0, or 2 with a message.
int cmd_eval(int argc, char** argv);
