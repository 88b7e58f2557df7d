// hf.h — Hugging Face model directories: export a checkpoint's model tensors for
// `transformers` (MixtralForCausalLM), and read such a directory back (init_from, eval).
//
// An exported directory holds
//   config.json                        MixtralForCausalLM config (both the transformers 4 keys
//                                      and the 5 ones: rope_theta + rope_parameters,
//                                      torch_dtype + dtype)
//   model-00001-of-0000N.safetensors   the model tensors (never optim.*) in the published Mixtral
//                                      order (embed; per layer q k v o, gate, experts w1 w2 w3,
//                                      the two norms; final norm; lm_head), ≤ 5 GB per shard,
//                                      metadata {"format": "pt"}
//   model.safetensors.index.json       {"metadata": {"total_size": bytes}, "weight_map": {...}}
// bos/eos ids: for the byte vocabulary (vocab_size 256) there are no special tokens, so they are
// null; for other vocabularies Mixtral's 1 / 2.
#pragma once
#include <stdint.h>

#include "ckpt.h"
#include "config.h"
#include "util.h"

#define HF_MAX_SHARD_BYTES 5000000000ull  // transformers' default max_shard_size "5GB"

// One expected tensor of the model, in the published order.
typedef struct HfTensorSpec {
    char name[96];
    int ndim;
    int64_t shape[2];
} HfTensorSpec;
// Every tensor of m (all experts) in the published order; *out is malloc'd. Returns the count.
int hf_tensor_list(const ModelConfig* m, HfTensorSpec** out);

int hf_export(const Ckpt* ck, const ModelConfig* m, const char* out_dir, DType dtype, Err* e);
// The same with a chosen shard size limit (bytes of tensor data per shard).
int hf_export_ex(const Ckpt* ck, const ModelConfig* m, const char* out_dir, DType dtype,
                 uint64_t max_shard_bytes, Err* e);
// Writes out_dir/config.json for m (part of hf_export).
int hf_write_config(const ModelConfig* m, const char* out_dir, DType dtype, Err* e);

// Special-token ids of a tokenizer; -1 = none.
typedef struct HfTokenIds {
    int bos, eos, pad, unk;
} HfTokenIds;
// config.json with these ids (NULL: 1 and 2, or none for a byte vocabulary, as hf_write_config).
int hf_write_config_ids(const ModelConfig* m, const char* out_dir, DType dtype, const HfTokenIds* ids, Err* e);

// The tokenizer a run recorded (its config): data.tokenizer, else the manifest.json beside the
// first data.path item's shards (scripts/tokenize_data.py writes it). 1 with the path in out, else 0.
int hf_tokenizer_of_run(const DataConfig* dc, char* out, size_t n);
// Copies a tokenizer into out_dir for AutoTokenizer: spec is a tokenizer.model (SentencePiece),
// a tokenizer.json (with tokenizer_config.json beside it, if any), a directory holding them, or
// a manifest.json / shard directory of scripts/tokenize_data.py. Writes tokenizer.model and/or
// tokenizer.json, tokenizer_config.json, special_tokens_map.json and generation_config.json;
// the ids come from the files (the SentencePiece model's trainer spec, or tokenizer_config.json
// and tokenizer.json). Refuses a tokenizer larger than vocab_size. desc: one line for the user.
int hf_export_tokenizer(const char* spec, const char* out_dir, int vocab_size, int max_seq, HfTokenIds* ids,
                        char* desc, size_t dn, Err* e);

typedef struct HfDir HfDir;
// dir holds model.safetensors.index.json (+ shards) or a single model.safetensors; a path to
// a .safetensors file also works.
int hf_open(HfDir** out, const char* dir, Err* e);
int hf_has(const HfDir* h, const char* name);
// Reads a tensor into fp32 (F32/BF16/F16), checking its shape:
// "model.layers.0.self_attn.q_proj.weight: shape [4096, 4096] in the checkpoint, [64, 64] in the config".
int hf_read(const HfDir* h, const char* name, float* dst, int ndim, const int64_t* shape, Err* e);
int hf_num_tensors(const HfDir* h);
const char* hf_tensor_name(const HfDir* h, int i);
void hf_close(HfDir* h);

// Parses dir/config.json into m: the keys present overwrite m's fields (call config_defaults
// first); vocab/hidden/intermediate/layers/heads/experts/top-k are required. Refuses what the
// trainer cannot represent (model_type other than mixtral, tied embeddings, sliding window,
// head_dim other than hidden/heads, activation other than silu).
int hf_read_config(const char* dir, ModelConfig* m, Err* e);

// A SentencePiece model (tokenizer.model) for `moetrain generate` (src/sp_model.c, src/sp_encode.c).
// spec as for hf_export_tokenizer (a tokenizer.model, a directory or manifest leading to one).
typedef struct SpModel SpModel;
int sp_open(SpModel** out, const char* spec, Err* e);
void sp_close(SpModel* s);
int sp_vocab(const SpModel* s);
int sp_eos(const SpModel* s);  // -1 = none
int sp_bos(const SpModel* s);
// text → ids (*ids malloc'd; returns the count): the normalizer's whitespace handling (spaces →
// ▁, a dummy ▁ prefix when the model asks for it), then BPE models merge the adjacent pair with
// the highest piece score first (leftmost on ties), unigram models take the Viterbi segmentation
// of the highest total score; what no piece covers becomes <0xNN> byte pieces (byte_fallback)
// or unk. add_bos: the BOS id first (when the model has one).
int sp_encode(const SpModel* s, const char* text, int add_bos, int32_t** ids);
// The text of one id into out (at most cap bytes; returns the length): ▁ → space, <0xNN> → that
// byte, control / unknown pieces → nothing.
size_t sp_piece_text(const SpModel* s, int id, char* out, size_t cap);
