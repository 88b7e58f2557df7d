// data.h — training data: sequence files (FASTA / FASTQ / text, gzip'd or not) tokenized
// byte-level, llm.c .bin token shards, or a random source; split and shuffled by seed.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "config.h"

typedef struct DataSet DataSet;

// Opens the data for windows of seq_len + 1 tokens. Errors name the file (and offset).
int data_open(DataSet** out, const DataConfig* dc, int vocab_size, int seq_len, uint64_t seed, Err* e);
void data_close(DataSet*);
// Windows in a split (0 = train, 1 = validation).
uint64_t data_num_windows(const DataSet*, int split);
// The i-th sequence of a split's stream (any i: epochs wrap, train shuffled per epoch); a pure
// function of (data, seed, split, i). Writes tokens [seq_len + 1].
void data_get(const DataSet*, int split, uint64_t i, int32_t* tokens);
// One line for the log: format, records, tokens and windows per split.
void data_describe(const DataSet*, char* buf, size_t n);
