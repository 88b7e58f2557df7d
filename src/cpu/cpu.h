// cpu.h — internals of the CPU backend: plain fp32 C loops, the executable spec of every op in
// backend.h. act buffers are float. Every op is deterministic and independent of the number of
// OpenMP threads: each output element is computed by one thread in a fixed order, and every
// reduction over many elements goes through fixed chunks summed in order (cpu_sum_chunks).
#pragma once
#include "backend.h"
#include "util.h"

// GEMM blocking (cpu_gemm.c): micro-tile MR×NR, A blocks MC×KC, B blocks KC×NC.
enum { CPU_MR = 4, CPU_NR = 16, CPU_MC = 64, CPU_KC = 256, CPU_NC = 512 };

typedef struct CpuImpl {
    size_t live, peak;  // bytes allocated through be->alloc, now and at most
    float* bpack;       // [CPU_KC * CPU_NC] packed B block, shared by the threads of one GEMM
                        // (ops run one at a time per backend, so one buffer suffices)
} CpuImpl;

// Deterministic parallel sum over items [0, n): at most 64 chunks of at least min_chunk items,
// a partition that depends only on n and min_chunk (never on the thread count); f(ctx, lo, hi)
// processes [lo, hi) and returns its double sum; the partial sums are added in chunk order.
double cpu_sum_chunks(size_t n, size_t min_chunk, double (*f)(const void* ctx, size_t lo, size_t hi),
                      const void* ctx);

// ---- cpu_gemm.c ---------------------------------------------------------------------------
void cpu_gemm(Backend*, const GemmDesc*, const void* A, const void* B, void* C);
void cpu_gemm_grouped(Backend*, const GemmDesc*, const GroupDesc*, const void* A, const void* B, void* C);
void cpu_gemm_grouped_wgrad(Backend*, const GroupDesc*, int N, int K, const void* dY, const void* X, void* dB,
                            float beta);

// ---- cpu_gemm_fp8.c: the same three with fp8 set (backend.h's FP8 contract), and fp8_ws_bytes ----
void cpu_gemm_fp8(Backend*, const GemmDesc*, const void* A, const void* B, void* C);
void cpu_gemm_grouped_fp8(Backend*, const GemmDesc*, const GroupDesc*, const void* A, const void* B, void* C);
void cpu_gemm_grouped_wgrad_fp8(Backend*, const GroupDesc*, int N, int K, const void* dY, const void* X, void* dB,
                                float beta);
size_t cpu_fp8_ws_bytes(Backend*, Fp8Op op, Fp8Gemm fp8, int M, int N, int K, int groups);
size_t cpu_fp8_wcodes_bytes(Backend*, int R, int C, int groups);
void cpu_fp8_wcodes_make(Backend*, const void* W, int R, int C, int groups, size_t b_stride, void* codes);
size_t cpu_fp8_xcodes_bytes(Backend*, int R, int groups, int K);
void cpu_fp8_xcodes_make(Backend*, const GroupDesc* g, const void* X, int K, void* xq);

// ---- cpu_norm.c: embedding and RMSNorm ----------------------------------------------------
void cpu_embed_fwd(Backend*, void* out, const void* table, const int32_t* tok, int N, int H);
void cpu_embed_bwd(Backend*, float* dtable, const void* dout, const int32_t* tok, int N, int H, int V);
void cpu_rmsnorm_fwd(Backend*, void* y, float* rstd, const void* x, const void* w, int N, int H, float eps);
void cpu_rmsnorm_bwd(Backend*, void* dx, float* dw, const void* dy, const void* x, const void* w,
                     const float* rstd, int N, int H, int accumulate);

// ---- cpu_attn.c: RoPE and causal GQA attention --------------------------------------------
void cpu_rope_qkv(Backend*, void* qkv, void* q, void* k, void* v, int B, int T, int Hq, int Hkv, int D, float theta,
                  int inverse, const int32_t* pos);
void cpu_attn_fwd(Backend*, void* out, float* lse, const void* q, const void* k, const void* v, int B, int T,
                  int Hq, int Hkv, int D, const int32_t* doc);
void cpu_attn_bwd(Backend*, void* dq, void* dk, void* dv, const void* dout, const void* out, const float* lse,
                  const void* q, const void* k, const void* v, int B, int T, int Hq, int Hkv, int D, void* ws,
                  size_t ws_bytes, const int32_t* doc);

void cpu_rope_qkv_at(Backend*, void* qkv, void* q, void* k, void* v, const int32_t* pos, int B, int n, int Hq,
                     int Hkv, int D, float theta);
void cpu_kv_append(Backend*, void* kc, void* vc, const void* k, const void* v, const int32_t* pos, int B, int n,
                   int Hkv, int D, int Tmax);
void cpu_attn_decode(Backend*, void* out, const void* q, const void* kc, const void* vc, const int32_t* pos, int B,
                     int n, int Hq, int Hkv, int D, int Tmax);

// ---- cpu_moe.c: router, expert-major index, permutes, SwiGLU ------------------------------
void cpu_router_fwd(Backend*, float* probs, int32_t* topk_idx, float* topk_w, float* stats, float* zsum,
                    const float* logits, int N, int E, int k);
void cpu_router_bwd(Backend*, float* dlogits, const float* dtopk_w, const float* aux_dprob, float z_grad,
                    const float* probs, const int32_t* topk_idx, const float* topk_w, const float* logits, int N,
                    int E, int k);
void cpu_moe_index(Backend*, int32_t* counts, int32_t* dest, const int32_t* topk_idx, int N, int k, int E);
void cpu_permute_fwd(Backend*, void* xp, const void* x, const int32_t* dest, int N, int k, int H);
void cpu_permute_bwd(Backend*, void* dx, const void* dxp, const int32_t* dest, int N, int k, int H);
void cpu_gather_rows_f32(Backend*, float* outp, const float* in, const int32_t* dest, int n);
void cpu_scatter_rows_f32(Backend*, float* out, const float* inp, const int32_t* dest, int n);
void cpu_unpermute_fwd(Backend*, void* out, const void* yp, const int32_t* dest, int N, int k, int H, const void* add);
void cpu_unpermute_bwd(Backend*, void* dyp, const void* dout, const int32_t* dest, int N, int k, int H);
void cpu_swiglu_fwd(Backend*, void* h, const void* gu, const float* scale, int n, int F);
void cpu_gemm_grouped_swiglu(Backend*, const GemmDesc*, const GroupDesc*, const void* A, const void* B, void* gu,
                             void* h, const float* scale);
void cpu_swiglu_bwd(Backend*, void* dgu, float* dscale, const void* dh, const void* gu, const float* scale, int n,
                    int F);

// ---- cpu_loss.c ---------------------------------------------------------------------------
void cpu_cross_entropy(Backend*, void* logits, float* loss, const int32_t* targets, int n, int V, float grad_scale);

// ---- cpu_optim.c --------------------------------------------------------------------------
void cpu_adamw(Backend*, const AdamWDesc* d, float* master, void* param, float* m, float* v, const void* grad, size_t n);
void cpu_split_pack(Backend*, uint16_t* w, int16_t* rem, const float* x, size_t n);
void cpu_split_unpack(Backend*, float* x, const uint16_t* w, const int16_t* rem, size_t n);
void cpu_adamw_split(Backend*, const AdamWDesc* d, uint16_t* w, int16_t* rem, float* m, float* v, const void* grad,
                     size_t n);
