// safetensors.h — reader and streaming writer for the safetensors format.
//
// File = 8-byte little-endian header length N, N bytes of JSON header, then the data buffer:
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// Offsets are relative to the data buffer (which starts at 8 + N).
//
// The reader treats a file as untrusted: header length bounded by the file size and
// ST_MAX_HEADER; the JSON parsed with depth/size limits (minijson.h); every dtype known; shape
// product × dtype size == end − begin (overflow-checked); offsets inside the data buffer; tensors
// non-overlapping; names unique. Errors name the file and what is wrong. Tensors are read with
// pread (files can be ~10 GB), converting F32/BF16/F16 to fp32.
//
// The writer collects descriptors (name, dtype, shape, fp32 source), computes every offset, writes
// the header (padded with spaces so the data starts at a multiple of 8) and then streams the data,
// converting fp32 to the stored dtype chunk by chunk. It computes the CRC-32C of the whole
// file while writing, and fsyncs the file before closing it. Tensors are laid out contiguously in
// the order they were added, so the file passes the Rust safetensors validation that transformers
// uses.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "strmap.h"
#include "util.h"

#define ST_MAX_HEADER (100u * 1024u * 1024u)  // bytes of JSON header accepted
#define ST_MAX_DIMS 8

typedef enum {
    ST_BOOL = 0, ST_U8, ST_I8, ST_I16, ST_U16, ST_F16, ST_BF16, ST_I32, ST_U32, ST_F32,
    ST_I64, ST_U64, ST_F64, ST_F8_E4M3, ST_F8_E5M2, ST_DTYPE_COUNT
} StDtype;

const char* st_dtype_name(StDtype d);  // "F32", "BF16", ...
size_t st_dtype_size(StDtype d);       // bytes per element
int st_dtype_parse(const char* s, StDtype* out);  // 0, or -1 when unknown

typedef struct StTensor {
    const char* name;
    StDtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t numel;
    uint64_t begin, end;  // byte offsets in the data buffer
} StTensor;

typedef struct StFile {
    char* path;
    int fd;                    // -1 when the file was parsed from memory (st_parse_buffer)
    const uint8_t* mem;        // the whole file when fd == -1
    uint64_t file_size;
    uint64_t data_start;       // 8 + N
    int n;                     // tensors, in header order
    StTensor* t;               // [n]
    int n_meta;
    const char** meta_key;     // [n_meta]
    const char** meta_val;     // [n_meta]
    StrMap index;              // name → tensor
    void* doc;                 // private: the parsed JSON (owns the strings)
} StFile;

// Opens and validates path. Returns 0, or -1 with "PATH: what is wrong".
int st_open(StFile** out, const char* path, Err* e);
// The same over a file image in memory (the fuzz target); `name` is used in messages. The buffer
// must outlive the StFile.
int st_parse_buffer(StFile** out, const char* name, const uint8_t* buf, size_t size, Err* e);
void st_close(StFile* f);

// Tensor by name, or NULL. Metadata value by key, or NULL.
const StTensor* st_find(const StFile* f, const char* name);
const char* st_meta(const StFile* f, const char* key);

// Reads tensor t into dst[t->numel] as fp32 (F32, BF16, F16 are converted; other dtypes are
// an error).
int st_read_f32(const StFile* f, const StTensor* t, float* dst, Err* e);
// Reads raw bytes [off, off+n) of tensor t's data.
int st_read_raw(const StFile* f, const StTensor* t, uint64_t off, void* dst, size_t n, Err* e);

// "[4, 8]" into buf[n].
void st_shape_str(char* buf, size_t n, int ndim, const int64_t* shape);
// Whether t's shape differs from shape[ndim]; when it does, both as text ("[4, 8]") into
// got[n] and want[n].
int st_shape_differs(const StTensor* t, int ndim, const int64_t* shape, char* got, char* want, size_t n);

// Element conversions (round to nearest even for narrowing).
uint16_t st_f32_to_f16(float f);
float st_f16_to_f32(uint16_t h);

// ---- writer -----------------------------------------------------------------------------------
// Produces a tensor's fp32 values on demand (for data that is not in memory, e.g. export).
// dst has numel elements. Returns 0 or -1 with a message.
typedef int (*StFillFn)(void* ctx, int tag, float* dst, uint64_t numel, Err* e);

typedef struct StWriter StWriter;

typedef struct StWriteInfo {
    uint64_t bytes;  // file size
    uint32_t crc32c;  // CRC-32C of the whole file (crc32c.h)
} StWriteInfo;

StWriter* st_writer_new(void);
void st_writer_free(StWriter* w);
// Adds a tensor stored as dtype (ST_F32, ST_BF16 or ST_F16) from fp32 host data[numel]. The
// data pointer is kept until st_writer_write. Names are copied and must be unique.
int st_writer_add(StWriter* w, const char* name, StDtype dtype, int ndim, const int64_t* shape,
                  const float* data, Err* e);
// The same with values produced by fn(ctx, tag, ...) while writing.
int st_writer_add_fn(StWriter* w, const char* name, StDtype dtype, int ndim, const int64_t* shape,
                     StFillFn fn, void* ctx, int tag, Err* e);
void st_writer_meta(StWriter* w, const char* key, const char* value);
// Bytes the file will have (header + data), known before writing.
uint64_t st_writer_size(const StWriter* w);
// Writes path (created or truncated), fsyncs and closes it. info may be NULL.
// (st_writer_begin, st_writer_put(NULL) for every tensor, st_writer_end.)
int st_writer_write(StWriter* w, const char* path, StWriteInfo* info, Err* e);

// Streaming, for data that reaches host memory one tensor at a time (checkpoints: memory stays
// one tensor, not the file). st_writer_add_later declares a tensor whose values come later;
// st_writer_begin creates path and writes the whole header (names, shapes and offsets are
// known up front); st_writer_put writes the next tensor's values in the order the tensors were
// added — data[numel] fp32 (converted to the tensor's dtype; the caller may reuse data at once),
// or NULL for a tensor added with its own data / fill function — with the CRC-32C kept running;
// st_writer_end checks that every tensor was put, fsyncs and closes (info as above). A failure
// removes the partial file and every later call returns -1 at once; st_writer_free of a
// writer begun and not ended removes the file too.
int st_writer_add_later(StWriter* w, const char* name, StDtype dtype, int ndim, const int64_t* shape, Err* e);
int st_writer_begin(StWriter* w, const char* path, Err* e);
int st_writer_put(StWriter* w, const float* data, Err* e);
int st_writer_end(StWriter* w, StWriteInfo* info, Err* e);

// Streams the checksum of a whole file (8 MB reads): algo is a CksumAlgo (crc32c.h), CRC-32C
// or zlib's CRC-32. Returns 0 or -1 with a message.
int file_checksum(const char* path, int algo, uint32_t* crc, uint64_t* bytes, Err* e);
