// backend.h — the ops table the model graph runs on.
//
// The graph (model.c, moe.c) calls only these. `cpu` implements them as plain fp32 C loops (the
// executable spec); `cuda` as kernels and cuBLASLt GEMMs. Conventions:
//
// * Matrices are row-major. A linear layer's weight is [out, in] (Hugging Face layout) and
//   y = x · Wᵀ.
// * "act" buffers (activations, activation gradients, compute copies of weights) have the
//   backend's activation dtype `act_dtype` (fp32 on the CPU; bf16 or fp32 on CUDA) and are typed
//   void*. Weight gradients, master weights, optimizer state, router logits/probabilities and
//   losses are always fp32 (float*).
// * Every pointer is backend memory (host for cpu, device for cuda) unless marked "host".
// * No op allocates. Ops that accumulate say so ("+="); others overwrite their outputs.
// * Ops run in order on the backend's stream; only the *_to_host / sync calls block.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "config.h"

// FP8 block-scaled GEMMs (config precision.fp8; numerics: src/fp8.h, docs/fp8.md). A GEMM op whose
// descriptor has fp8 ≠ FP8_OFF does not multiply its act operands as they are: it computes
//   r = fp8_gemm_tn(Q_A, Q_B)   (fp8.h; fp32 result, K tiles summed in increasing order)
// where Q_A = fp8_quant_1x128(op(A)) — op(A) [M,K] in 1×128 tiles along K — and Q_B quantises
// op(B)ᵀ [N,K] along K: in 128×128 blocks (FP8_WEIGHT, B is a weight: the forward and data-gradient
// GEMMs) or in 1×128 tiles (FP8_ACT, both operands are activations or gradients: the weight-gradient
// GEMMs). Then C = alpha·r + beta·addend in fp32, rounded once to C's dtype (bf16: to nearest even).
// Scales come from the operands of this call (no amax history). In the grouped ops each group is its
// own GEMM: gemm_grouped's A rows of group g and B_g; gemm_grouped_wgrad's dY and X rows of group g,
// whose 1×128 tiles along the token dimension start at the group's first row (the last tile of
// each group partial). A GPU product equals the spec within docs/fp8.md's bound, not bit for bit.
typedef enum Fp8Gemm { FP8_OFF = 0, FP8_WEIGHT = 1, FP8_ACT = 2 } Fp8Gemm;
// The GEMM forms fp8_ws_bytes is asked about.
typedef enum Fp8Op { FP8_OP_GEMM = 0, FP8_OP_GROUPED = 1, FP8_OP_WGRAD = 2 } Fp8Op;

// One GEMM: C[M,N] = alpha · op(A)[M,K] · op(B)[K,N] + beta · C.
// op(A) = A if !trans_a (A is [M,K]) else Aᵀ (A is [K,M]); likewise B ([K,N] or [N,K]).
// A, B are act dtype; C is act dtype, or fp32 when c_f32 (weight gradients, router logits).
// lda/ldb/ldc are row strides in elements (0 = packed).
// beta = 0 never reads C (old NaN/Inf in C is ignored); K = 0 gives C = beta · C.
// c_in (gemm only; NULL = C itself): the addend is read from c_in instead, same layout as C
// (ldc, dtype), and the result written to C: C = alpha · op(A) · op(B) + beta · c_in, a residual
// add without a copy. c_in may equal C; it must not overlap it otherwise.
typedef struct GemmDesc {
    int M, N, K;
    int trans_a, trans_b;
    int lda, ldb, ldc;
    float alpha, beta;
    int c_f32;
    const void* c_in;
    Fp8Gemm fp8;           // FP8_OFF, or the block-scaled FP8 product (below); gemm, gemm_grouped, gemm_grouped_swiglu
    void* ws;              // with fp8: backend memory for the quantised operands, ws_bytes ≥ Backend.fp8_ws_bytes
    size_t ws_bytes;
    const struct Fp8WCodes* wq;  // grouped ops with FP8_WEIGHT: NULL, or B's codes (Fp8WCodes, below)
} GemmDesc;

// A grouped weight's FP8 codes made once and read by later GEMMs instead of quantising the weight in
// each (precision.fp8_weights = per_step): the 128×128-block codes of W = groups × [R, C] (packed,
// b_stride elements apart) in both layouts a product reads, as stored (for B = W_g with trans_b: N =
// R, K = C) and transposed (for B = W_g without: K = R, N = C), in the backend's own format, made
// by Backend.fp8_wcodes_make from W's values at the time. A grouped op given GemmDesc.wq reads
// group g0 + g of them as its B_g and does not read B; its result is the same bits as quantising B
// itself, so long as W has not changed since (the caller's promise). g0: a view starting at a later
// group (the ops pass one group on as a view of it).
typedef struct Fp8WCodes {
    void* codes;           // backend memory of Backend.fp8_wcodes_bytes(R, C, groups) bytes
    int R, C, groups;
    int g0;
} Fp8WCodes;

// Grouped GEMM over contiguous row groups (the expert GEMMs): for g in [0, G):
//   rows [off[g], off[g+1]) of A and C, with B_g = B + g·b_stride elements.
// desc.M is ignored (taken from the offsets); desc.N/K/trans_b/ldb describe each B_g;
// trans_a must be 0. Weight gradients use gemm_grouped_wgrad.
// desc.lda / desc.ldc (0 = packed: K / N) are the row strides of A and C, the same for every
// group; alpha and beta apply per group. Empty groups (off[g] = off[g+1]) are skipped.
typedef struct GroupDesc {
    int groups;            // G
    const int* host_off;   // host [G+1] row offsets, non-decreasing, off[0] = 0
    size_t b_stride;       // elements between consecutive B_g
    int db_act;            // gemm_grouped_wgrad: dB has the act dtype (the fp32 sum rounded once
                           // to nearest even; what PyTorch autocast gives) instead of fp32
    Fp8Gemm fp8;           // gemm_grouped_wgrad: FP8_OFF or FP8_ACT (the other grouped ops read GemmDesc.fp8)
    void* ws;              // gemm_grouped_wgrad with fp8: as GemmDesc.ws
    size_t ws_bytes;
    const void* xq;        // gemm_grouped_wgrad with FP8_ACT: NULL, or X's codes for these groups and
                           // K (Backend.fp8_xcodes_make), read instead of X (which may be NULL)
} GroupDesc;

// The contract checks on those descriptors, the same for every backend (src/backend_check.c);
// a violation is a caller error: FATAL, naming the op.
// gemm: sizes ≥ 0, row strides ≥ the rows they hold; *lda, *ldb, *ldc get the strides with
// 0 (packed) resolved.
void gemm_desc_check(const GemmDesc* d, int* lda, int* ldb, int* ldc);
// gemm_grouped (op names the caller): trans_a 0, no c_in, offsets from 0 and non-decreasing.
void gemm_grouped_check(const char* op, const GemmDesc* d, const GroupDesc* g);
// gemm_grouped_wgrad: beta 0 or 1, offsets from 0 and non-decreasing, xq only with FP8_ACT.
void gemm_grouped_wgrad_check(const GroupDesc* g, float beta);
// fp8_xcodes_make: K ≥ 0, offsets from 0 and non-decreasing.
void fp8_xcodes_check(const GroupDesc* g, int K);

// One AdamW update's settings (the adamw and adamw_split ops below).
typedef struct AdamWDesc {
    float lr;          // already includes the schedule
    float beta1, beta2, eps;
    float wd;          // decoupled weight decay; 0 for exempt tensors
    float grad_scale;  // multiplies grad first (clipping)
    int step;          // 1-based (bias correction)
    int grad_act;      // grad has the act dtype (else fp32)
} AdamWDesc;

typedef struct Comm Comm;          // comm.h
typedef struct CommOpts CommOpts;  // comm.h
typedef struct BackendEvent BackendEvent;  // a point in the backend's op order (event ops below)

typedef struct BackendMem {
    size_t live, peak, device_used, device_total;  // bytes (see Backend.mem_info)
} BackendMem;

typedef struct Backend Backend;
struct Backend {
    const char* name;   // "cpu" or "cuda"
    DType act_dtype;    // dtype of act buffers
    void* impl;         // backend private state (streams, cuBLASLt handle, caches)

    // ---- memory ------------------------------------------------------------------------------
    void* (*alloc)(Backend*, size_t bytes);  // zeroed; aborts on failure
    void (*free)(Backend*, void* p);
    void (*to_host)(Backend*, void* host_dst, const void* src, size_t bytes);   // blocks
    void (*to_device)(Backend*, void* dst, const void* host_src, size_t bytes);
    void (*copy)(Backend*, void* dst, const void* src, size_t bytes);
    void (*zero)(Backend*, void* p, size_t bytes);
    void (*sync)(Backend*);

    // ---- casts and elementwise ---------------------------------------------------------------
    void (*f32_to_act)(Backend*, void* dst, const float* src, size_t n);
    void (*act_to_f32)(Backend*, float* dst, const void* src, size_t n);
    void (*add_act)(Backend*, void* y, const void* x, size_t n);      // y += x   (act)
    void (*scale_f32)(Backend*, float* x, float s, size_t n);          // x *= s
    // out[0] += Σ x²  (fp32 out on the backend; read with to_host)
    void (*sumsq_f32)(Backend*, float* out, const float* x, size_t n);
    // the same over act-dtype x (act-dtype gradients: GroupDesc.db_act); sums exactly as
    // sumsq_f32 does over the same values widened to fp32
    void (*sumsq_act)(Backend*, float* out, const void* x, size_t n);
    // out[0] = 1 if any of x is non-finite (else left as is)
    void (*nonfinite_f32)(Backend*, float* out, const float* x, size_t n);

    // ---- embedding ---------------------------------------------------------------------------
    // out[N,H] = table[tok[n], :]
    void (*embed_fwd)(Backend*, void* out, const void* table, const int32_t* tok, int N, int H);
    // dtable[tok[n], :] += dout[n, :]   (dtable fp32 [V,H]), in order n = 0..N-1 for every element
    // (so the result is the same bits on every backend). tok[n] in [0, V).
    void (*embed_bwd)(Backend*, float* dtable, const void* dout, const int32_t* tok, int N, int H, int V);

    // ---- RMSNorm -----------------------------------------------------------------------------
    // y = x / sqrt(mean(x²) + eps) · w ; rstd[N] saved (fp32)
    void (*rmsnorm_fwd)(Backend*, void* y, float* rstd, const void* x, const void* w,
                        int N, int H, float eps);
    // dx = (+=, if accumulate) ∂L/∂x ; dw[H] += ∂L/∂w (fp32)
    void (*rmsnorm_bwd)(Backend*, void* dx, float* dw, const void* dy, const void* x,
                        const void* w, const float* rstd, int N, int H, int accumulate);

    // ---- RoPE (HF rotate_half convention: pairs (i, i + D/2)) -------------------------------
    // On the fused q/k/v projection: qkv [B, T, (Hq + 2·Hkv)·D], each row q's Hq heads, then k's
    // Hkv, then v's Hkv (one GEMM against the stacked q/k/v weight writes it), against planar
    // q [B,T,Hq,D], k and v [B,T,Hkv,D], positions t = 0..T-1.
    // inverse = 0 (forward): q, k = qkv's q and k parts rotated by angle, v = its v part.
    // inverse = 1 (backward): qkv's q and k parts = q, k (dq, dk) rotated by −angle, v part = v.
    // Hkv may be 0 (q only; k, v unused). D even; angle = p · theta^(−2i/D) for pair (i, i + D/2),
    // where p is the row's position: pos[b·T + t] when pos is given (int32 [B·T], each in [0, T);
    // documents packed in a window restart at 0), else t;
    // x1' = x1 cos − x2 sin, x2' = x2 cos + x1 sin. The CPU spec computes angle, cos and sin in
    // double and rounds cos/sin to fp32 once (HF computes them in fp32: the two differ by ~t·6e-8
    // rad, 2e-3 at t = 32k). qkv must not overlap q, k or v.
    void (*rope_qkv)(Backend*, void* qkv, void* q, void* k, void* v, int B, int T, int Hq, int Hkv, int D,
                     float theta, int inverse, const int32_t* pos);

    // ---- causal GQA attention ----------------------------------------------------------------
    // q [B,T,Hq,D], k/v [B,T,Hkv,D], out [B,T,Hq,D], lse fp32 [B,Hq,T]. scale = 1/sqrt(D).
    // Hq is a multiple of Hkv; query head h reads kv head h / (Hq/Hkv).
    // doc (int32 [B·T], or NULL): documents packed in a window. doc[b·T + t] is the index in the
    // window of the first token of t's document, so 0 ≤ doc[t] ≤ t and either doc[t] = doc[t−1]
    // (same document) or doc[t] = t (a new one starts); doc[b·T] = 0. Query t sees keys s with
    // doc[t] ≤ s ≤ t (block-diagonal causal); NULL = one document per window (0 ≤ s ≤ t).
    // lse = natural-log logsumexp of the scaled scores over the visible s (what attn_bwd
    // recomputes P from). Keys no query of a block can see are skipped, so short documents cost
    // less than a full window.
    void (*attn_fwd)(Backend*, void* out, float* lse, const void* q, const void* k,
                     const void* v, int B, int T, int Hq, int Hkv, int D, const int32_t* doc);
    // Overwrites dq, dk, dv (doc as in attn_fwd, the same array). ws: device memory the op may use
    // as workspace during the call (ws_bytes of it; NULL, 0 = none). The CUDA backend stores dS
    // there when it fits, which saves recomputing S and dP for dq (cuda_attn_bwd_wg.cu); dq then
    // differs from the no-workspace result in the last bits (dS is rounded once instead of twice alike).
    void (*attn_bwd)(Backend*, void* dq, void* dk, void* dv, const void* dout, const void* out,
                     const float* lse, const void* q, const void* k, const void* v, int B, int T,
                     int Hq, int Hkv, int D, void* ws, size_t ws_bytes, const int32_t* doc);

    // ---- decoding with a KV cache (src/generate.c, docs/generate.md) -------------------------
    // The cache of one layer: kc, vc [B, Hkv, Tmax, D] act; sequence b's rotated keys and its
    // values at positions [0, len_b). pos: backend int32 [B], the position of the first of the n
    // new rows of each sequence (sequences of different lengths decode in one batch).
    // rope_qkv_at: rope_qkv's forward (inverse 0) with row (b, i) of qkv [B, n, (Hq+2·Hkv)·D] at
    // position pos[b] + i instead of i (the same angle arithmetic: pos = 0 gives rope_qkv's bits).
    // (rope_qkv's own pos, for packed documents, stays inside the window [0, T); decode rows sit
    // anywhere in the cache.)
    void (*rope_qkv_at)(Backend*, void* qkv, void* q, void* k, void* v, const int32_t* pos, int B, int n,
                        int Hq, int Hkv, int D, float theta);
    // kv_append: kc[b, h, pos[b] + i, :] = k[b, i, h, :] and vc likewise from v [B, n, Hkv, D],
    // for i in [0, n) with pos[b] + i < Tmax (rows past the cache are dropped).
    void (*kv_append)(Backend*, void* kc, void* vc, const void* k, const void* v, const int32_t* pos, int B,
                      int n, int Hkv, int D, int Tmax);
    // attn_decode: the new rows' queries q [B, n, Hq, D] against the cache: row (b, i) sits at
    // position p = pos[b] + i (< Tmax) and attends to cache positions s ≤ p (causal within the
    // new block; what lies past p is never read), query head h to kv head h / (Hq/Hkv), scale
    // 1/sqrt(D): out[b,i,h,:] = Σ_{s≤p} softmax_s(q·kc_s·scale) vc_s. With the cache filled by
    // kv_append this is attn_fwd's output row for row p of the whole sequence (the CPU spec sums
    // in attn_fwd's order: the same bits).
    void (*attn_decode)(Backend*, void* out, const void* q, const void* kc, const void* vc, const int32_t* pos,
                        int B, int n, int Hq, int Hkv, int D, int Tmax);

    // ---- GEMMs -------------------------------------------------------------------------------
    void (*gemm)(Backend*, const GemmDesc*, const void* A, const void* B, void* C);
    // Forward/backward-data expert GEMM: C[rows of g] = A[rows of g] · op(B_g)  (+ beta·C).
    void (*gemm_grouped)(Backend*, const GemmDesc*, const GroupDesc*, const void* A,
                         const void* B, void* C);
    // Weight gradient per group: dB_g[N,K] = dY[rows g]ᵀ[N, r] · X[rows g][r, K] + beta · dB_g
    // (dB fp32, or act dtype with g->db_act), dB_g = dB + g·b_stride. (N = dY width, K = X width;
    // dY [rows, N] and X [rows, K] packed.) beta is 1 (accumulate) or 0 (overwrite: an empty group then gets zeros, and old
    // NaN in dB is ignored); with beta = 1 an empty group leaves its dB_g unchanged.
    void (*gemm_grouped_wgrad)(Backend*, const GroupDesc*, int N, int K, const void* dY,
                               const void* X, void* dB, float beta);

    // Bytes of ws an FP8 GEMM call needs (0 when fp8 is off): op FP8_OP_GEMM (gemm: M, N, K as in
    // its GemmDesc, groups 1), FP8_OP_GROUPED (gemm_grouped / gemm_grouped_swiglu: M = rows over
    // all groups, N, K of each B_g), FP8_OP_WGRAD (gemm_grouped_wgrad: M = rows over all groups,
    // N, K = dB_g's shape). Depends only on its arguments, so a caller may size ws for the largest
    // call once. NULL on a backend without FP8 (the config check refuses precision.fp8 there).
    size_t (*fp8_ws_bytes)(Backend*, Fp8Op op, Fp8Gemm fp8, int M, int N, int K, int groups);
    // Fp8WCodes (above): the bytes of a grouped weight's codes (groups × [R, C]), and making them
    // into codes from W (b_stride elements between the groups, rows packed). NULL with fp8_ws_bytes.
    size_t (*fp8_wcodes_bytes)(Backend*, int R, int C, int groups);
    void (*fp8_wcodes_make)(Backend*, const void* W, int R, int C, int groups, size_t b_stride, void* codes);
    // An act operand's codes along its groups' rows, made once and read by gemm_grouped_wgrad as
    // its X (GroupDesc.xq): X [rows, K] in 1×128 tiles along each group's rows of g, what the
    // weight gradient would make of X itself, in the backend's own format. The bytes, at most, for
    // any `groups` groups of R rows in all; and making them. NULL with fp8_ws_bytes.
    size_t (*fp8_xcodes_bytes)(Backend*, int R, int groups, int K);
    void (*fp8_xcodes_make)(Backend*, const GroupDesc* g, const void* X, int K, void* xq);

    // ---- SwiGLU with routing scale -----------------------------------------------------------
    // gu [n, 2F] = [gate | up] per row; h[n,F] = silu(gate) · up · (scale ? scale[r] : 1)
    // silu(g) = g · sigmoid(g) = g / (1 + e^−g).
    void (*swiglu_fwd)(Backend*, void* h, const void* gu, const float* scale, int n, int F);
    // The experts' first GEMM and the SwiGLU in one op: gu = gemm_grouped(A, B) (N = 2F: gate rows
    // [0, F) and up rows [F, 2F) of each B_g), then h = swiglu_fwd(gu, scale) with n = the rows of
    // every group. The CPU backend does exactly that; the CUDA one may fuse it (the same bits of h
    // from its gu).
    void (*gemm_grouped_swiglu)(Backend*, const GemmDesc*, const GroupDesc*, const void* A,
                                const void* B, void* gu, void* h, const float* scale);
    // The experts' forward in one op: gemm_grouped_swiglu(d, g, A, B, gu, h, scale), then
    // gemm_grouped(d2, g2, h, B2, Y): Y = h · op(W2_g) with d2->K = F and g2 the same rows as g (its
    // own b_stride). hq (FP8 only; else NULL): NULL, or fp8_xcodes_bytes(rows, groups, F) bytes for
    // fp8_xcodes_make(g, h, F, hq), h's codes for w2's weight gradient; h's contents are then
    // undefined (h is scratch). The CPU backend does exactly that (gemm_grouped_ffn_seq); the CUDA
    // one with FP8 takes a group at a time and makes h's codes for the second product (and hq) from
    // the SwiGLU's registers, instead of reading h back (the same bits: docs/fp8.md).
    void (*gemm_grouped_ffn)(Backend*, const GemmDesc* d, const GroupDesc* g, const void* A, const void* B,
                             void* gu, void* h, void* hq, const float* scale, const GemmDesc* d2,
                             const GroupDesc* g2, const void* B2, void* Y);
    // dgu[n,2F] overwritten; dscale[r] = Σ_f dh · silu(gate) · up  (if dscale != NULL)
    // (dscale is the same formula whether or not scale is NULL.) dgu may be gu itself (in place).
    void (*swiglu_bwd)(Backend*, void* dgu, float* dscale, const void* dh, const void* gu,
                       const float* scale, int n, int F);

    // The backward of gemm_grouped_swiglu's product and SwiGLU in one op (the experts' w13):
    //   swiglu_bwd(gu, dscale, dh, gu, scale, rows, F)   d(gate|up) in place of gu, every group's rows
    //   gemm_grouped_wgrad(g, 2F, K, gu, X, dW, beta)     dW_g [2F, K] (+)= d(gate|up)_gᵀ · X_g
    //   gemm_grouped(d, g, gu, W, dX)                     dX = d(gate|up) · W_g, W_g [2F, K]
    // with d->K = 2F, d->N = K, d->trans_b = 0 (the data gradient's descriptor, its fp8 and ws), g
    // the groups with b_stride between both W_g and dW_g (and db_act, and the weight gradient's fp8
    // and ws; the two may share one ws). gu's contents are undefined afterwards (both backends
    // leave d(gate|up) there today). The CUDA backend with FP8 quantises d(gate|up) for both
    // products from one read, a group at a time (docs/fp8.md), with the products as the three ops
    // would give them.
    void (*gemm_grouped_swiglu_bwd)(Backend*, const GemmDesc* d, const GroupDesc* g, const void* dh, void* gu,
                                    const float* scale, float* dscale, const void* X, const void* W, void* dW,
                                    float beta, void* dX);

    // ---- router ------------------------------------------------------------------------------
    // probs[N,E] = softmax(logits); topk_idx[N,k] descending by prob (ties → lower index);
    // topk_w[N,k] = renormalised top-k probs. stats (fp32 [2E], +=): [0,E) count of tokens
    // routed to e (any slot), [E,2E) Σ_n probs[n,e] — the load-balancing loss inputs.
    // zsum (fp32 [1], +=): Σ_n logsumexp(logits[n])².
    // Requires 1 ≤ k ≤ E. The top-k compares the fp32 probs; topk_w = p / S with S the sum of the
    // k selected probs. Every row yields k distinct experts in [0, E), even for NaN logits.
    void (*router_fwd)(Backend*, float* probs, int32_t* topk_idx, float* topk_w, float* stats,
                       float* zsum, const float* logits, int N, int E, int k);
    // dlogits[N,E] (overwritten) from: dtopk_w[N,k] through the renormalised top-k; the aux
    // loss as dL/dprobs[n,e] = aux_dprob[e] (same for every token); the z-loss as
    // z_grad · 2·lse(n)·softmax(n). Any of dtopk_w / aux_dprob may be NULL.
    // Since topk_w = softmax over the selected logits, the top-k path is
    // dlogits[i_j] = w_j (dw_j − Σ_l w_l dw_l), exactly 0 for unselected experts; the aux path
    // goes through the full softmax: p_e (aux_e − Σ_f p_f aux_f). The three paths add.
    void (*router_bwd)(Backend*, float* dlogits, const float* dtopk_w, const float* aux_dprob,
                       float z_grad, const float* probs, const int32_t* topk_idx,
                       const float* topk_w, const float* logits, int N, int E, int k);

    // ---- permutation (token → expert-major rows) ---------------------------------------------
    // From topk_idx[N*k] (flattened (n, slot)): counts[E] (int32, overwritten) and
    // dest[N*k] = row of (n, slot) in expert-major order (experts ascending, then n, then slot).
    // An expert id outside [0, E) is a caller error (the CPU backend aborts with a message).
    void (*moe_index)(Backend*, int32_t* counts, int32_t* dest, const int32_t* topk_idx, int N,
                      int k, int E);
    // xp[dest[i], :] = x[i / k, :]   (i over N*k)
    void (*permute_fwd)(Backend*, void* xp, const void* x, const int32_t* dest, int N, int k,
                        int H);
    // dx[n, :] = Σ_slot dxp[dest[n*k+slot], :]   (overwrites dx)
    void (*permute_bwd)(Backend*, void* dx, const void* dxp, const int32_t* dest, int N, int k,
                        int H);
    // Gathers per-row fp32 values into expert-major order: outp[dest[i]] = in[i]
    void (*gather_rows_f32)(Backend*, float* outp, const float* in, const int32_t* dest, int n);
    // Inverse: out[i] = inp[dest[i]]
    void (*scatter_rows_f32)(Backend*, float* out, const float* inp, const int32_t* dest, int n);
    // Weighted rows are pre-scaled by swiglu: out[n,:] = add[n,:] + Σ_slot yp[dest[n*k+s]], the
    // sum in slot order after add (add NULL: none; add may be out itself: +=; the residual
    // stream's add without a copy)
    void (*unpermute_fwd)(Backend*, void* out, const void* yp, const int32_t* dest, int N, int k,
                          int H, const void* add);
    // dyp[dest[n*k+s], :] = dout[n, :]
    void (*unpermute_bwd)(Backend*, void* dyp, const void* dout, const int32_t* dest, int N,
                          int k, int H);

    // ---- loss --------------------------------------------------------------------------------
    // Cross-entropy over rows of logits [n, V] (act) with targets[n] (< 0 = ignored).
    // loss (fp32 [1], +=) Σ_n −log softmax(logits[n])[target]. If grad_scale != 0, logits is
    // overwritten by dL/dlogits · grad_scale (softmax − onehot; ignored rows → 0).
    // grad_scale = 0 leaves logits untouched. A target ≥ V is a caller error (CPU: aborts).
    void (*cross_entropy)(Backend*, void* logits, float* loss, const int32_t* targets, int n,
                          int V, float grad_scale);

    // ---- optimizer ---------------------------------------------------------------------------
    // AdamW on n elements with the settings d: master/m/v fp32, grad fp32 (or act dtype when
    // d->grad_act: the update is the same as on those values widened to fp32), param (act copy,
    // may alias master when act is fp32 and param == master).
    // torch.optim.AdamW: g = grad·grad_scale; p ← p·(1 − lr·wd) (on the old p, first);
    // m ← β1 m + (1−β1) g; v ← β2 v + (1−β2) g² (stored fp32; the update reads the stored values);
    // p ← p − lr · (m / (1−β1^step)) / (sqrt(v / (1−β2^step)) + eps).
    void (*adamw)(Backend*, const AdamWDesc* d, float* master, void* param, float* m, float* v,
                  const void* grad, size_t n);

    // Split fp32 masters (bf16 runs, precision.master=split): an fp32 master x is kept as its
    // bf16 compute weight w plus a 16-bit remainder rem, exactly (proof: cpu_optim.c). On bits,
    //   pack:   w = (x >> 16) + ((x >> 15) & 1)  (mod 2^16),  rem = (int16_t)(x & 0xffff)
    //   unpack: x = (w << 16) + (int32_t)rem     (mod 2^32)
    // so w is x rounded to bf16 to nearest, ties away from zero (round-to-nearest-even differs
    // only when the low half is exactly 0x8000 and w's truncation is even). w holds bf16 bits
    // whatever the act dtype. Every 32-bit pattern round-trips, non-finite ones included.
    // pack: w [n], rem [n] from x [n] fp32; rem = NULL writes w only.
    void (*split_pack)(Backend*, uint16_t* w, int16_t* rem, const float* x, size_t n);
    // unpack: x [n] fp32 from w [n], rem [n].
    void (*split_unpack)(Backend*, float* x, const uint16_t* w, const int16_t* rem, size_t n);
    // AdamW on a split master (w [n], rem [n]) with m/v fp32 (grad as in adamw): unpacks each
    // master, applies exactly adamw's arithmetic (same backend, same operation order: the new master has the
    // bits adamw gives), packs it back.
    void (*adamw_split)(Backend*, const AdamWDesc* d, uint16_t* w, int16_t* rem, float* m, float* v,
                        const void* grad, size_t n);

    // Peak bytes of backend memory allocated so far (optional: NULL = unknown).
    size_t (*peak_bytes)(Backend*);
    // Device memory now, for the log (optional: NULL on backends without device memory, the
    // CPU): live / peak = bytes held through alloc now / at most so far; device_used /
    // device_total = the whole device as the driver sees it (CUDA context, library workspaces
    // and other processes included).
    void (*mem_info)(Backend*, BackendMem* out);
    const char* device;  // the device's name ("NVIDIA H200"; "cpu"), for the log and the MFU peak

    // ---- events (timing: src/prof.c) ---------------------------------------------------------
    // An event is recorded in order with the ops; the time between two recorded events is the
    // time the backend took for the ops between them (on CUDA the device timeline, with no
    // sync; the CPU runs an op before it returns, so its events read a monotonic clock).
    BackendEvent* (*event_create)(Backend*);
    void (*event_record)(Backend*, BackendEvent* ev);
    // Seconds from a's record to b's; blocks until b has completed. Both must have been recorded.
    double (*event_elapsed)(Backend*, BackendEvent* a, BackendEvent* b);
    void (*event_destroy)(Backend*, BackendEvent* ev);

    // ---- communication -----------------------------------------------------------------------
    // The communicator over this backend's memory (comm.h), for the world after dist_init;
    // collective (every rank calls it). NULL with a message in e when it cannot be made.
    Comm* (*comm_create)(Backend*, const CommOpts*, Err* e);

    // Host memory for staging device data (optional: NULL = malloc / free; use be_host_alloc):
    // page-locked on CUDA, so to_host / to_device run at full link speed. to_device from it may
    // return before the copy is done: sync before reusing the source.
    void* (*host_alloc)(Backend*, size_t bytes);
    void (*host_free)(Backend*, void* p);

    void (*destroy)(Backend*);
};

// Device memory the CUDA backend allocates for itself at creation (plan.c counts it):
#define CUDA_LT_WS_BYTES (32u << 20)     // cuBLASLt workspace
#define CUDA_SCRATCH_BYTES (64u << 20)   // op workspace

// Constructors. cuda_backend_create returns NULL (with a message) when built without CUDA or
// when no GPU is visible.
Backend* cpu_backend_create(void);
// gpu: the options of config section gpu (NULL = the defaults).
Backend* cuda_backend_create(DType act_dtype, int device, const GpuConfig* gpu, Err* e);
// GPUs visible to this process (0 without CUDA or without a GPU).
int cuda_device_count(void);

static inline size_t dtype_size(DType d) { return d == DTYPE_BF16 ? 2 : 4; }

#include <stdlib.h>
static inline void* be_host_alloc(Backend* be, size_t bytes) {
    if (be->host_alloc) return be->host_alloc(be, bytes);
    void* p = malloc(bytes ? bytes : 1);
    if (!p) abort();
    return p;
}
static inline void be_host_free(Backend* be, void* p) {
    if (!p) return;
    if (be->host_free) be->host_free(be, p);
    else free(p);
}

// gemm_grouped_ffn as the two ops it is defined by (above): the CPU backend's, and the CUDA one's
// without FP8; and the op's checks.
void gemm_grouped_ffn_check(const GemmDesc* d, const GroupDesc* g, const GemmDesc* d2, const GroupDesc* g2,
                            const void* hq);
void gemm_grouped_ffn_seq(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* A, const void* B, void* gu,
                          void* h, void* hq, const float* scale, const GemmDesc* d2, const GroupDesc* g2, const void* B2,
                          void* Y);
// gemm_grouped_swiglu_bwd as the three ops it is defined by (above): the CPU backend's, and the
// CUDA one's for what its own path does not take; and the op's checks.
void gemm_grouped_swiglu_bwd_check(const GemmDesc* d, const GroupDesc* g);
void gemm_grouped_swiglu_bwd_seq(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* dh, void* gu,
                                 const float* scale, float* dscale, const void* X, const void* W, void* dW, float beta,
                                 void* dX);
