// ckpt_internal.h — pieces shared by ckpt.c, ckpt_open.c, ckpt_inspect.c (not a public API).
#pragma once
#include <stdint.h>

#include "ckpt.h"
#include "crc32c.h"
#include "safetensors.h"
#include "strmap.h"

#define CKPT_MANIFEST "manifest.txt"
#define CKPT_STATE "trainer_state.yaml"
#define CKPT_LATEST "latest"
#define CKPT_PATH 4096

typedef struct ManEntry {
    char name[64];
    uint64_t bytes;
    uint32_t crc;
} ManEntry;

typedef struct Manifest {
    int64_t step;
    int world;
    int algo;     // CksumAlgo of the file checksums: crc32 (version 1 manifests), crc32c
    int n;
    ManEntry* f;  // [n]
} Manifest;

typedef struct TensorRef {
    int file;  // index into Ckpt.files
    int idx;   // index into that file's tensors
} TensorRef;

struct Ckpt {
    char dir[CKPT_PATH];
    Manifest man;
    char* state;       // trainer_state.yaml text
    int nfiles;
    StFile** files;    // [nfiles] rank files, rank order
    int n;
    TensorRef* ref;    // [n] every tensor, file by file in header order
    StrMap index;      // name → ref
};

// out[CKPT_PATH] = dir + "/" + name (truncated when too long; paths are checked up front).
void ckpt_join(char* out, const char* dir, const char* name);
// Copies at most n-1 bytes of src and a NUL.
void ckpt_copy(char* dst, size_t n, const char* src);
// "rank_%05d.safetensors"
void ckpt_rank_name(char* buf, size_t n, int rank);
// "step_%08lld"; parse returns the step or -1 when name is not step_<digits>.
void ckpt_step_name(char* buf, size_t n, int64_t step);
int64_t ckpt_parse_step_name(const char* name);
// File name safe to join under a directory: [A-Za-z0-9._-], not "." / "..", ≤ 63 chars.
int ckpt_safe_name(const char* s);

int manifest_read(Manifest* m, const char* dir, Err* e);
void manifest_free(Manifest* m);
// Formats the manifest text (with its trailing self-checksum line). Caller frees.
char* manifest_format(const Manifest* m);

// Checks a listed file: 0 ok; -1 with "PATH: what" (missing, size, checksum `algo` when verify_crc).
int ckpt_check_file(const char* dir, const ManEntry* f, int algo, int verify_crc, Err* e);
// Checks the files i of m with i % stride == part (every file: stride 1, part 0), files in
// parallel threads when verifying. 0, or -1 with the first bad file's message.
int ckpt_check_files(const char* dir, const Manifest* m, int verify_crc, int part, int stride, Err* e);
// Resolves path (step dir / root / latest file) to the step directory. Returns 0 or -1.
int ckpt_resolve(const char* path, char* dir, size_t n, Err* e);
// Reads the `latest` file of root into name[n] (validated). 1 found, 0 absent, -1 bad.
int ckpt_read_latest(const char* root, char* name, size_t n, Err* e);

// Small file I/O with fsync; crc (CRC-32C of data) may be NULL.
int ckpt_write_file(const char* path, const char* data, size_t len, uint32_t* crc, Err* e);
char* ckpt_read_text(const char* path, size_t max, size_t* len, Err* e);  // NUL-terminated
int ckpt_fsync_dir(const char* dir, Err* e);
int ckpt_rm_rf(const char* path);  // 0 or -1 (errno)

// Sorted list of complete (manifest present) or all step_* directories of root, newest first.
typedef struct StepDir {
    int64_t step;
    char name[64];
    int complete;
} StepDir;
int ckpt_list_steps(const char* root, StepDir** out, int* n, Err* e);
// 1 when step_name under root belongs to this process's run (ckpt_set_run_id): no run id set,
// or the checkpoint records none, or the same one.
int ckpt_step_is_mine(const char* root, const char* step_name);
