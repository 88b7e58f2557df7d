// data.h — training data: sequence files (FASTA / FASTQ / text, gzip'd or not) tokenized
// byte-level, llm.c .bin token shards, or a random source; split and shuffled by seed.
//
// Byte-level data (vocab 256): FASTA sequence lines are concatenated per record without
// newlines (whitespace and '\r' dropped; a '>' header line starts the next record; ';' lines are
// comments); FASTQ keeps only the sequence line of each 4-line record (@id, sequence, +,
// quality of the same length); text makes each non-empty line a record ('\r' dropped, any other
// byte but NUL kept). A record with no tokens is skipped. FASTA/FASTQ sequences must be ASCII.
// Every record is followed by data.sep_token. Records go to train or validation by a hash of
// the record index (not of the seed): about val_frac of them in validation, at least one in each
// split when there are two or more; a single record (a genome) is split by position instead
// (its last val_frac of tokens). Byte tokens are stored as bytes (1 byte per token in memory).
// Each split's records are concatenated into one stream; window w is tokens
// [w·seq_len, w·seq_len + seq_len + 1) of the stream (stride seq_len, like llm.c).
//
// .bin shards (256 × int32 header: [0] magic, [1] version, [2] token count; llm.c's 20240520 v1 =
// uint16 tokens and 20240801 v7 = uint32 tokens, and this project's 20240520 v2 = uint32) are
// mmap'd, checked once (size, every token < vocab), concatenated, and split by windows: the last
// val_frac of the windows are validation. scripts/tokenize_data.py writes them (docs/data.md).
//
// data.path is a file, a comma-separated list, a glob or a directory (its *.bin shards, sorted;
// the validation shards there, val_*.bin or *_val_*.bin, are the validation data when
// data.val_path is empty); items are concatenated in order (all byte-level or all .bin); "" is
// the shipped data/hairpin.fa.gz. A relative path that does not exist is also looked for next to
// the binary (and its parents) and under PREFIX/share/moetrain.
//
// data.val_path (same forms) is validation data: every window of it, in order; data.val_frac is
// then ignored and data.path is all training data. data.weights (one positive weight per
// data.path item, .bin items only) mixes the items as Megatron's blend does: train sample i comes
// from the source that is furthest below its share after i samples (exact proportions per period
// of 65536 samples), at that source's next sample; each source keeps its own windows, epochs and
// a shuffle seeded by train.seed and its index. The validation split of a mixture is each
// source's validation windows, one source after another.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "config.h"

typedef struct DataSet DataSet;

// Train windows of the random source (effectively unlimited); validation has DATA_RANDOM_VAL.
#define DATA_UNLIMITED ((uint64_t)1 << 62)
#define DATA_RANDOM_VAL 1024

// Opens the data described by dc for windows of seq_len + 1 tokens. Errors name the file and,
// where there is one, the line or the byte/token offset, and say what to do.
int data_open(DataSet** out, const DataConfig* dc, int vocab_size, int seq_len, uint64_t seed, Err* e);

// The same from bytes in memory (what a file would hold; gzip'd or not). `name` is used in
// messages. For .bin the set points into buf: keep buf alive until data_close. dc->path is ignored.
int data_open_buffer(DataSet** out, const DataConfig* dc, const char* name, const uint8_t* buf, size_t n,
                     int vocab_size, int seq_len, uint64_t seed, Err* e);

void data_close(DataSet*);

// Windows in a split (0 = train, 1 = validation). 0 for validation when data.val_frac = 0.
uint64_t data_num_windows(const DataSet*, int split);

// Tokens and records in a split's stream (records: 0 for .bin and random).
uint64_t data_num_tokens(const DataSet*, int split);
uint64_t data_num_records(const DataSet*, int split);

// The i-th sequence of a split's stream, for any i: epoch = i / n, position i % n, the train
// split permuted per epoch by a permutation seeded by (seed, epoch) when dc->shuffle; validation
// is never shuffled. A pure function of (data, seed, split, i): no cursor. Writes
// tokens [seq_len + 1]. Asking a split with no windows is a bug (FATAL).
void data_get(const DataSet*, int split, uint64_t i, int32_t* tokens);

// Which window of the split's stream sequence i reads (the permutation above).
uint64_t data_window_of(const DataSet*, int split, uint64_t i);

// The token that separates documents in the stream (what ends each record; the boundary that
// document masking needs): data.sep_token for byte-level data; for .bin shards the eos_id of the
// manifest.json beside the first shard (scripts/tokenize_data.py writes it), else data.sep_token.
// -1 for random data.
int data_doc_separator(const DataSet*);

// The source (0-based data.path item under data.weights; else 0) that sequence i of a split reads.
int data_source_of(const DataSet*, int split, uint64_t i);

// 1 when a shard's file name marks it as validation data (val_*, *_val_*, val.*, *_val.*).
int data_is_val_shard(const char* base);

// 1 when dc names byte-level sequence data (FASTA/FASTQ/text: tokens are bytes) rather than
// token shards, judged by its first item (what data_open would read; "" = the shipped hairpins).
int data_is_byte_level(const DataConfig* dc);

// Documents (data.documents). The token id that ends every document of this data, or -1 when
// the data marks none: byte-level data ends each record with data.sep_token (-1 when that token
// also occurs inside a record, so a boundary could not be told apart); .bin shards separate
// documents by the eos_id of the manifest.json beside them (-1 without one: data_doc_separator's
// fallback to data.sep_token is no boundary a tokenizer wrote); mixed sources must agree; random
// tokens have no documents. *natural
// (optional) is 1 when the records are documents by nature (FASTA / FASTQ records, shard
// documents) and 0 for text lines, which data.documents=auto leaves together.
int data_doc_sep(const DataSet*, int* natural);

// Document starts of one window (backend.h attn_fwd's doc): tokens [T + 1] as data_get wrote
// them; doc[t] (t < T) is the index of the first input token of t's document: 0 at t = 0, then
// t itself right after a `sep` input token (the separator ends its document), else doc[t − 1].
void data_doc_starts(const int32_t* tokens, int T, int sep, int32_t* doc);

// One line for the log: format, files, records, tokens and windows per split.
void data_describe(const DataSet*, char* buf, size_t n);
