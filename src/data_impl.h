// data_impl.h — internals of the data layer, shared by data.c (open, split), data_mix.c (sources,
// weights, mixtures), data_window.c (windows, shuffle, data_get, documents), data_describe.c (the
// log line), data_seq.c (byte-level readers and parsers), data_bin.c (.bin shards) and
// data_paths.c (path lists). Not for other layers.
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

// ---- the data set (data.c, data_mix.c, data_window.c, data_describe.c) -------------------------

typedef struct Stream {
    Seg* seg;          // [nseg] pieces of the split's token stream, in order
    uint64_t* start;   // [nseg] stream offset of each piece's first token
    int nseg;
    uint64_t ntok, nwin, records;
} Stream;

enum { KIND_NONE = 0, KIND_BYTES, KIND_BIN, KIND_RANDOM, KIND_MIX };

struct DataSet {
    int kind;
    int seq_len, vocab, sep, shuffle;
    uint64_t seed;
    float val_frac;
    Stream st[2];        // [split]
    Corpus corpus;       // byte-level storage (the streams point into it)
    int single;          // byte-level: one record, split by position
    Seg* segs;           // [nsegs] .bin payloads, in file order
    int nsegs;
    MapFile* maps;       // [nmaps] mmap'd .bin files
    int nmaps;
    unsigned fmt_mask;   // 1 << DataFormat of every file
    unsigned width_mask; // .bin: 1 << token width
    int nfiles, any_gz;
    char first[256];     // first file name, for messages
    int doc_sep;         // the token between documents (data_doc_separator)
    // KIND_MIX: sources mixed by weight and/or separate validation data
    DataSet** comp;      // [ncomp] sources (each a plain set: bytes or bin)
    int ncomp;
    double* weight;      // [ncomp] normalised weights, or NULL (one source, no mixing)
    uint16_t* tab_src;   // [MIX_PERIOD] source of blended sample r of a period
    uint32_t* tab_k;     // [MIX_PERIOD] its sample index within that source and period
    uint64_t* per_period;// [ncomp] samples of each source per period
    DataSet* val;        // validation data (data.val_path), or NULL
    int sep_inside;      // byte-level: the sep token's byte value occurs inside a record
    int eos;             // .bin: the token between documents, or -1 when not known
};

#define MIX_PERIOD 65536  // the blend repeats every MIX_PERIOD samples (exact proportions per period)

// data.c: a set with dc's settings and nothing read yet; a plain set (bytes or .bin, no mixing)
// of the given files.
DataSet* data_new_set(const DataConfig* dc, int vocab, int seq_len, uint64_t seed);
int data_open_plain(DataSet** out, const DataConfig* dc0, const PathList* files, float val_frac, int shuffle,
                    int vocab_size, int seq_len, uint64_t seed, Err* e);

// data_mix.c: data.path and data.val_path expanded into files: one list per data.weights
// source (mix), or one for all; the validation files, those named by data.val_path or else the
// directories' own.
typedef struct DataSources {
    char* items[256];  // data.path's items (pointers into the caller's copy)
    int n, nv, mix, nsrc;
    double w[256];     // data.weights, with mix
    PathList* src;     // [nsrc]
    PathList dir_val, val;
} DataSources;

// list, vlist: writable copies of data.path and data.val_path. 0, or -1 with the reason in e;
// data_sources_free S either way.
int data_sources_expand(DataSources* S, const DataConfig* dc, char* list, char* vlist, Err* e);
void data_sources_free(DataSources* S);
// A set of components: the weighted sources (blended), or one source with separate validation files.
int data_open_mix(DataSet** out, const DataConfig* dc, const DataSources* S, int vocab_size, int seq_len,
                  uint64_t seed, Err* e);
