// plan.h — what a layout needs before anything runs: parameters, FLOPs per token and the
// memory of one rank (weights, fp32 master, gradients, Adam state, activations). `moetrain plan`.
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "config.h"

typedef struct PlanMemory {
    int world, ep, edp;       // world = ep × edp
    int e_local;              // experts per layer on one rank
    int grad_accum;           // micro-batches per optimizer step = global_batch / (micro_batch × world)
    int64_t tokens;           // N = micro_batch × seq_len, tokens per micro-batch per rank
    int64_t dense, expert;    // parameters held by one rank (dense replicated, local experts)
    // bytes per rank
    double weights;           // compute copy (precision.dtype)
    int split_master;         // bf16 weights with precision.master=split: masters = weight + remainder
    double master;            // fp32 master weights (ZeRO-1 shard): 4 B/param, or 2 B/param (the
                              // int16 remainders) when split_master; the bf16 half is in weights
    double grads;             // fp32 gradients (full, not sharded)
    double adam;              // fp32 Adam m + v (ZeRO-1 shard)
    double act_saved;         // activations saved for backward, all layers
    double kept_swiglu;       // of act_saved: the SwiGLU output h kept by train.keep_swiglu (with
                              // precision.fp8 its codes; 0 when off)
    double act_scratch;       // per-layer scratch (reused by every layer)
    double logits;            // lm_head logits chunk
    double moe_room;          // of act_scratch: the MoE's per-layer rows (with EP > 1 the 25% slack)
    double moe_arena;         // of act_scratch: the MoE's per-layer arena, moe_room or the attention
                              // backward's dS when larger (bf16, moe.c moe_plan_bumps)
    double fp8_ws;            // precision.fp8: the largest FP8 GEMM workspace of a layer (0 with none)
    double fp8_extra;         // what that workspace adds to the arena: 0 where moe_arena holds it
                              // beside the rows; counted in total (fp8_infer_extra: in infer_total)
    double fp8_infer_extra;
    double fp8_wcodes_kept;   // config_fp8_wcodes: the local experts' kept weight codes (training)
    double fp8_wcodes;        // what they add: those past the expert gradients' unused half (bf16 gradients)
    // GPU runs only (0 on the CPU): what the CUDA runtime and libraries hold besides our buffers
    double cuda_context;      // CUDA context and loaded kernels: PLAN_CUDA_CONTEXT_BYTES (an estimate)
    double lib_workspace;     // cuBLASLt workspace + the backend's op scratch (exact: backend.h)
    double nccl;              // NCCL: PLAN_NCCL_BASE_BYTES + PLAN_NCCL_COMM_BYTES per communicator of > 1 rank
                              // (parallel.comm=mpi: none; its staging is page-locked host memory)
    int nccl_comms;           // communicators of > 1 rank (world, ep, edp)
    double total;
    // eval and generate (trainer_init_infer, ModelOpts.inference): no masters, gradients, Adam
    // state or backward scratch; one layer's forward buffers serve every layer
    double infer_act;         // those buffers and the forward's scratch (MoE rows, send buffer)
    double infer_total;       // weights + infer_act + logits chunk + fp8_infer_extra + the runtime's
                              // (generate's KV cache not included: B × layers × 2·Hkv·D × (prompt + new) × a)
} PlanMemory;

// Estimates for the GPU-side memory the CUDA runtime and NCCL hold (checked on a GPU by
// build/tests/gpu/probe_gpu_mem, which measures each with cudaMemGetInfo and fails when a
// measurement exceeds its estimate):
//   context: the primary context, this binary's kernels and cuBLASLt's, loaded lazily (CUDA 12+)
//   NCCL: once per process that uses it, what a communicator holds before it has peers (its
//   kernels and state: 826 MiB measured for a one-rank communicator with NCCL 2.28 on an H200),
//   and per communicator of more than one rank 32 channels × send + recv × NCCL_BUFFSIZE
//   (4 MiB, NCCL's documented default), for the ring collectives and the all-to-all's peers
#define PLAN_CUDA_CONTEXT_BYTES (768.0 * (1 << 20))
#define PLAN_NCCL_BASE_BYTES (896.0 * (1 << 20))
#define PLAN_NCCL_COMM_BYTES (32.0 * 2 * 4 * (1 << 20))

// Validates c for `world` ranks (world <= 0: parallel.ep) and fills m. Returns 0 or -1.
int plan_memory(const Config* c, int world, PlanMemory* m, Err* e);

// Prints the plan (parameters, FLOPs, per-rank memory table; a WARNING line when the total
// exceeds gpu_gib). Returns 0 or -1 (invalid layout, message in e).
int plan_report(const Config* c, int world, double gpu_gib, FILE* f, Err* e);

// 46702792704 → "46,702,792,704".
void plan_thousands(int64_t v, char* out, size_t n);
