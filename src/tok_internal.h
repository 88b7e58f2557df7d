// tok_internal.h — internals of the tokenizer layer (its public side is in hf.h), shared by
// tok_find.c (the tokenizer files a path or a run names), sp_model.c (reading a SentencePiece
// model's protobuf), sp_encode.c (SentencePiece encode / decode) and hf_tokenizer.c (tokenizer.json,
// and the tokenizer files of an export). Not for other layers.
#pragma once
#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "hf.h"
#include "strmap.h"

#define TOK_MAX_BYTES ((size_t)256 << 20)

typedef struct TokFiles {
    char model[PATH_MAX];   // SentencePiece tokenizer.model, or ""
    char json[PATH_MAX];    // tokenizer.json, or ""
    char config[PATH_MAX];  // tokenizer_config.json, or ""
} TokFiles;

// The tokenizer files spec names: a tokenizer.model or tokenizer.json (with the
// tokenizer_config.json beside it), a directory holding them (or a tokenizer/ subdirectory), or a
// manifest.json / shard directory of scripts/tokenize_data.py. (tok_find.c)
int tok_find(const char* spec, TokFiles* t, Err* e);
// The whole of a tokenizer file (at most TOK_MAX_BYTES) into *buf (malloc'd, NUL-terminated).
int tok_read_all(const char* path, char** buf, size_t* n, Err* e);

// What export needs of a SentencePiece model: its size and special tokens. (sp_model.c)
typedef struct SpInfo {
    int n;              // pieces
    int bos, eos, pad, unk;
    char names[4][128];  // bos, eos, pad, unk pieces
} SpInfo;
int sp_read(const char* path, SpInfo* s, Err* e);

// A SentencePiece model loaded for encoding (hf.h's opaque SpModel), with its piece types:
// read in sp_model.c, used in sp_encode.c.
enum { SP_NORMAL = 1, SP_UNKNOWN = 2, SP_CONTROL = 3, SP_USER = 4, SP_UNUSED = 5, SP_BYTE = 6 };

struct SpModel {
    int n;
    char** piece;     // [n] NUL-terminated
    float* score;     // [n]
    uint8_t* type;    // [n]
    StrMap map;       // piece → id (normal, user-defined and unknown pieces)
    int byte_id[256]; // <0xNN> piece of each byte, or -1
    int bpe;          // trainer_spec.model_type == BPE (else unigram)
    int byte_fallback, dummy_prefix, collapse_ws;
    int bos, eos, unk;
    int maxlen;       // longest piece in bytes
};
