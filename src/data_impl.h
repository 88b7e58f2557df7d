// data_impl.h — internals of the data layer, shared by data.c (open, split, windows, shuffle),
// data_seq.c (byte-level readers and parsers) and data_bin.c (.bin shards). Not for other layers.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include <zlib.h>

#include "data.h"

#define BIN_MAGIC 20240520      // llm.c uint16 (version 1); this project's uint32 (version 2)
#define BIN_MAGIC_U32 20240801  // llm.c uint32 (version 7)
#define BIN_HEADER_BYTES 1024  // 256 × int32

// A growable byte array.
typedef struct ByteBuf {
    uint8_t* p;  // [cap], n used
    size_t n, cap;
} ByteBuf;

// The byte-level corpus under construction: one stream per split. Byte 0 ends a record (data_get
// writes sep_token for it); 0 never occurs in the data itself (parsers reject NUL bytes).
typedef struct Corpus {
    ByteBuf buf[2];         // [split] stream bytes
    uint64_t records[2];    // records per split
    size_t last_start[2];   // offset in buf[s] where the last record of split s begins
    uint64_t nrec;          // records so far, over all files and splits
    int cur;                // split of the record being read, -1 between records
    float val_frac;
    int vocab;              // bytes >= vocab are errors (vocab < 256)
} Corpus;

void corpus_init(Corpus* c, float val_frac, int vocab);
void corpus_free(Corpus* c);
// The split (0 train, 1 validation) of record i: a hash of i, independent of the seed.
int corpus_split_of(uint64_t i, float val_frac);
// After the last file: with >= 2 records and val_frac > 0, moves the last record of a split into
// the other one when that one is empty, so both splits have a record.
void corpus_balance(Corpus* c);

// One file's parser state (FASTA, FASTQ or text), fed in chunks of any size.
typedef struct SeqParser {
    Corpus* c;
    DataFormat fmt;       // DATA_FASTA, DATA_FASTQ or DATA_TEXT
    const char* name;     // file name, for messages
    uint64_t line;        // 1-based line of the byte being read
    uint64_t rec_line;    // FASTQ: line of the current record's '@'
    uint64_t seq_len;     // FASTQ: sequence characters of the current record
    uint64_t qual_len;    // FASTQ: quality characters so far
    int state;            // parser state (data_seq.c)
    int seen_header;      // FASTA: a '>' line has been read
    uint8_t cls[256];     // byte class in sequence lines (data_seq.c)
} SeqParser;

void seqp_init(SeqParser* s, Corpus* c, DataFormat fmt, const char* name);
int seqp_feed(SeqParser* s, const uint8_t* p, size_t n, Err* e);
int seqp_end(SeqParser* s, Err* e);  // end of input: closes the last record

// Bytes of a file (through zlib's gz* API: gzip'd or plain) or of memory (inflated when it starts
// with the gzip magic).
typedef struct Reader {
    const char* name;
    gzFile gz;               // file source, or NULL
    const uint8_t* mem;      // memory source [mem_n]
    size_t mem_n, mem_pos;
    z_stream zs;             // memory gzip
    int mem_gz, zs_live, zs_done;
    int is_gz;               // known after the first read
} Reader;

int reader_open_file(Reader* r, const char* path, Err* e);
void reader_open_mem(Reader* r, const char* name, const uint8_t* p, size_t n);
// Reads up to cap bytes: > 0 bytes, 0 at the end, -1 on a gzip error (message in e).
long reader_read(Reader* r, uint8_t* buf, size_t cap, Err* e);
void reader_close(Reader* r);

// The format of a byte-level or .bin source from its first (decompressed) bytes and its name.
DataFormat data_detect(const uint8_t* p, size_t n, const char* name);
const char* data_fmt_name(DataFormat f);

// A run of tokens of one width in memory (a .bin payload or a byte-level stream).
typedef struct Seg {
    const uint8_t* p;  // [n * width] little-endian tokens
    uint64_t n;
    int width;         // 1 (byte-level, 0 = separator), 2 or 4
} Seg;

// An mmap'd file.
typedef struct MapFile {
    void* base;  // [size] bytes, or NULL
    size_t size;
} MapFile;

int bin_map(const char* path, MapFile* m, Err* e);
void bin_unmap(MapFile* m);
// Checks a .bin image (header, size, every token < vocab) and describes its payload in seg.
int bin_check(const char* name, const uint8_t* p, size_t size, int vocab, Seg* seg, Err* e);
// 1 when p starts with a little-endian .bin magic (either).
int bin_has_magic(const uint8_t* p, size_t n);

uint64_t data_mix64(uint64_t x);  // splitmix64 finaliser

// ---- paths (data_paths.c) ----------------------------------------------------------------------

typedef struct PathList {
    char** p;  // [n] paths
    int n;
} PathList;

void path_list_add(PathList* l, const char* s);  // a copy of s
void path_list_free(PathList* l);
// p as given when it is absolute or exists; else found next to the binary (and its parents) or
// under PREFIX/share/moetrain (the shipped data); else p.
void data_resolve_path(const char* p, char* out, size_t n);
// Adds what one item of data.path / data.val_path (for_val) names to out: a file, a glob (sorted)
// or a directory's *.bin (sorted; its val_*.bin go to dir_val). Errors name the item.
int path_list_expand(const char* item, int for_val, PathList* out, PathList* dir_val, Err* e);
// The eos_id of the manifest.json beside a shard, or -1.
int shard_manifest_eos(const char* shard);
