// ckpt.h — sharded, atomic, verified checkpoints (host memory, fp32 data), and the
// trainer_state.yaml that goes with them. The Hugging Face directory is in hf.h.
//
// Layout of a checkpoint root DIR:
//   DIR/step_00001000/rank_00000.safetensors   the tensors rank 0 passed (F32, by global name)
//   DIR/step_00001000/rank_00001.safetensors   ...one file per rank
//   DIR/step_00001000/trainer_state.yaml       the text the trainer passed (trainer_state_format)
//   DIR/step_00001000/manifest.txt             every file: name, bytes, crc32c; self-checksummed
//   DIR/latest                                 "step_00001000\n" (written last, atomically)
//   DIR/.tmp_step_XXXXXXXX/, DIR/.trash_*      in-progress save / prune (ignored; removed by
//                                              the next save)
// A crash at any moment leaves `latest` naming a complete checkpoint (or no `latest`, if the
// first save never finished). Tensors are found by name, whatever rank wrote them, so a run can
// resume on another world size.
//
// Checksums: CRC-32C (crc32c.h: the CPU's crc32 instruction, ~10x zlib's crc32), named in the
// manifest ("checksum crc32c"); manifests of version 1 (zlib crc32) are still read and verified.
// Verification cost: ckpt_open reads every file once (streamed, files in parallel threads).
// For resume on many ranks use ckpt_open_comm: each rank verifies its share of the files
// (file i on rank i % world), in parallel, and the verdicts are shared.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "comm.h"
#include "util.h"

typedef struct CkptTensor {
    const char* name;   // unique across ranks
    int ndim;           // 0..4
    int64_t shape[4];
    const float* data;  // host [numel]
} CkptTensor;

// Collective over `comm` (world group; host helpers only). Each rank passes the tensors it
// writes; rank 0 also writes trainer_state_yaml and the manifest. Protocol: rank 0 creates
// <dir>/.tmp_step_XXXXXXXX/ (removing stale ones), agreement; every rank creates its file and
// writes the header, agreement; every rank writes its tensors + fsyncs its file; agreement with
// sizes + crcs gathered; rank 0 checks every header (names unique across
// ranks), writes the manifest, fsyncs files and directory, renames to step_XXXXXXXX, fsyncs
// <dir>, updates `latest` (latest.tmp, fsync, rename, fsync <dir>), then prunes complete
// checkpoints beyond `keep` (0 = keep all; never the newest, never latest's). Any failure on
// any rank makes every rank return -1 with the message (naming the rank); nothing hangs.
// Saving a step that already exists replaces it.
int ckpt_save(Comm* comm, const char* dir, int64_t step, const CkptTensor* t, int n,
              const char* trainer_state_yaml, int keep, Err* e);

// The same save, streamed: for data that reaches host memory one tensor at a time (the
// trainer: host memory stays one tensor, not 3 × the owned parameters). ckpt_save is
// begin + append of every t[i].data + finish, and writes the same bytes.
//   ckpt_save_begin   collective: stage 1 (t[] gives names and shapes; data is ignored), then
//                     every rank creates its file and writes its whole header; agreement. On
//                     failure every rank returns -1 (no handle) with the failing rank's message.
//   ckpt_save_append  local: writes the next tensor's values, t[] order (data[numel]; reusable
//                     at once), crc32 running. Returns -1 once this rank's file has failed —
//                     the failure is remembered for ckpt_save_finish; keep running the
//                     collectives that produce the data, and call finish.
//   ckpt_save_finish  collective: fsync, agreement with sizes and crcs (any rank's failure,
//                     including fewer appends than tensors, makes every rank return -1 with that
//                     rank's message), then stage 3. Frees the handle.
typedef struct CkptSave CkptSave;
int ckpt_save_begin(CkptSave** s, Comm* comm, const char* dir, int64_t step, const CkptTensor* t, int n,
                    const char* trainer_state_yaml, int keep, Err* e);
int ckpt_save_append(CkptSave* s, const float* data);
int ckpt_save_finish(CkptSave* s, Err* e);
// For a background writer (checkpoint.async): the local part of ckpt_save_finish — check that
// every tensor was appended, fsync and close this rank's file — callable from the thread that
// appended; ckpt_save_finish then does only the collective part. A failure is kept for finish.
void ckpt_save_end_local(CkptSave* s);
// Drops a save without finishing it (local; the run is ending on an error): this rank's
// unfinished file is removed, `latest` is untouched, the next save clears the temporary.
void ckpt_save_abort(CkptSave* s);

// Run ownership (process-wide; "" = none, the default). With a run id set, a save names its
// temporary directory .tmp_step_XXXXXXXX.<run id> and removes only its own run's stale
// temporaries (and unnamed ones), pruning removes only checkpoints of this run (and those that
// record no run), and ckpt_find_resume falls back only to such checkpoints. The id is recorded
// as `run_id:` in trainer_state.yaml (by the trainer).
void ckpt_set_run_id(const char* run_id);
const char* ckpt_run_id(void);
// The run_id recorded in root/step_name/trainer_state.yaml: 1 (copied), 0 none recorded or no
// such file.
int ckpt_step_run_id(const char* root, const char* step_name, char* out, size_t n);

typedef struct Ckpt Ckpt;  // an opened, verified checkpoint (all rank files indexed by name)

// path = a step directory, a checkpoint root (then `latest` is followed) or the `latest` file
// itself. Verifies the manifest (its own checksum; every file present, size and crc32 match).
// Errors name the bad file.
int ckpt_open(Ckpt** out, const char* path, Err* e);
// The same; verify_crc = 0 checks only sizes and headers (the crc was verified elsewhere).
int ckpt_open_ex(Ckpt** out, const char* path, int verify_crc, Err* e);
// Collective: rank 0 resolves path; every rank verifies its share of the files (ckpt_verify_comm)
// and opens the checkpoint with sizes/headers checked; every rank returns 0 or every rank
// returns -1 (with the first failing rank's message). _ex with verified = 1 skips the checksums
// (the caller has just run ckpt_verify_comm on the same directory).
int ckpt_open_comm(Comm* comm, Ckpt** out, const char* path, Err* e);
int ckpt_open_comm_ex(Comm* comm, Ckpt** out, const char* path, int verified, Err* e);
// Collective: file i of step_dir's manifest is checked (size and checksum) by rank i % world;
// 0 on every rank, or -1 on every rank with the first bad file's message ("rank R: " prefixed
// when R > 0).
int ckpt_verify_comm(Comm* comm, const char* step_dir, Err* e);

// For resume=auto: the newest complete checkpoint under root. Tries `latest`; if it is missing
// or fails verification, falls back to the newest step_* that verifies. What was skipped (and
// why) goes into note (also when latest was fine but a newer complete step_* exists). Returns 1
// (step_dir = the directory), 0 when root has no checkpoint at all (or does not exist), -1 when
// checkpoints exist but none verifies, or on error.
int ckpt_find_resume(const char* root, char* step_dir, size_t n, char* note, size_t note_n, Err* e);
// The same with the verification of each candidate step directory done by fn (1 verified; 0 not,
// with why[n] saying why): for a verification spread over ranks. fn NULL = ckpt_open's.
typedef int (*CkptVerifyFn)(void* ctx, const char* step_dir, char* why, size_t n);
int ckpt_find_resume_cb(const char* root, char* step_dir, size_t n, char* note, size_t note_n, CkptVerifyFn fn,
                        void* ctx, Err* e);

const char* ckpt_trainer_state(const Ckpt* ck);  // the YAML text
const char* ckpt_dir(const Ckpt* ck);            // the step directory
int64_t ckpt_step(const Ckpt* ck);               // from the manifest
int ckpt_world(const Ckpt* ck);                  // rank files written
int ckpt_has(const Ckpt* ck, const char* name);
// Shape of a tensor: 0, or -1 when absent. shape has room for 8 dims.
int ckpt_tensor_shape(const Ckpt* ck, const char* name, int* ndim, int64_t* shape);
// Reads a tensor (from whichever rank file has it) into dst as fp32; checks ndim and shape
// ("NAME: shape [4, 8] in the checkpoint, [4, 4] expected").
int ckpt_read(const Ckpt* ck, const char* name, float* dst, int ndim, const int64_t* shape, Err* e);
int ckpt_num_tensors(const Ckpt* ck);
const char* ckpt_tensor_name(const Ckpt* ck, int i);
void ckpt_close(Ckpt* ck);

// `moetrain inspect`: prints step, layout, files (size, crc OK/BAD), tensor count and numel
// by group (model / optim), the largest tensors. Returns 0 when every checksum holds, 1 when
// some file is bad or missing, -1 (with e) when path is not a checkpoint.
int ckpt_inspect(const char* path, FILE* out, Err* e);

// ---- trainer_state.yaml -----------------------------------------------------------------------
// A plain YAML mapping:
//   step: 1000
//   tokens: 4096000
//   world: 8
//   ep: 8
//   seed: 1234
//   rng: 9876543210123456789
//   bad_steps: 0
//   loss_ema: 2.3456789012345678
//   <extra_yaml lines, if any>
//   config: |
//     model:
//       hidden: 4096
//     ...
typedef struct TrainerState {
    int64_t step, tokens;
    int world, ep;
    uint64_t seed, rng;
    int64_t bad_steps;
    double loss_ema;
    const char* config_yaml;  // the resolved config (config_print output); NULL = none
    const char* extra_yaml;   // more top-level "key: value" lines, verbatim; NULL = none
} TrainerState;

// Formats ts into buf[n] (snprintf-style: returns the full length; the text is complete only
// when that is < n; buf may be NULL with n = 0 to measure).
int trainer_state_format(char* buf, size_t n, const TrainerState* ts);
// Parses text into ts (config_yaml and extra_yaml are set to NULL) and the config block into
// config_yaml[cn] ("" when absent). Unknown keys are ignored (read them with trainer_state_get).
int trainer_state_parse(const char* text, TrainerState* ts, char* config_yaml, size_t cn, Err* e);
// The value of a top-level scalar key: 1 found (copied into out[n]), 0 absent, -1 bad YAML.
int trainer_state_get(const char* text, const char* key, char* out, size_t n, Err* e);
