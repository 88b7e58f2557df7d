// cuda_fp8.cuh — what the FP8 quantisers (cuda_fp8_quant.cu), the FP8 GEMMs (cuda_fp8.cu) and their
// cuBLASLt product (cuda_fp8_lt.cu) share: the tile constants and the scale map of a quantised
// operand (fp8_smap.cuh), the quantisers' launchers, the product.
// The numerics and the layouts are described at the top of cuda_fp8.cu.
#pragma once
#include "cuda_common.cuh"
#include "fp8_smap.cuh"

// ---- the quantisers (cuda_fp8_quant.cu), on the backend's stream, act dtype from the backend ----
// 1×128 tiles along the contiguous dimension: x [R, C] → q [R, ldq], scales through sm.
void quant_rows(Backend* be, const void* x, int R, int C, size_t ldx, uint8_t* q, size_t ldq, SMap sm);
// The cast-transpose: rows [0, n) of x [n, C] → qt [C, ldk] quantised along n (scales stm); with q
// non-NULL also the row-wise q [n, ldq] (scales srm) from the same read.
void quant_cols(Backend* be, const void* x, int n, int C, size_t ldx, uint8_t* qt, size_t ldk, SMap stm, uint8_t* q,
                size_t ldq, SMap srm);
// quant_cols without the row-wise output.
void quant_cols_t(Backend* be, const void* x, int n, int C, size_t ldx, uint8_t* qt, size_t ldk, SMap stm);
// 128×128 blocks of w [R, C]: as stored (trans 0) or transposed; scales s with row stride lds.
void quant_blocks(Backend* be, const void* w, int R, int C, size_t ldw, int trans, uint8_t* q, size_t ldq, float* s,
                  int lds);
// Both layouts from one read: q [R, ldq] / s (lds) as stored and qt [C, ldqt] / st (ldst) transposed,
// bit for bit what two quant_blocks calls give.
void quant_blocks_both(Backend* be, const void* w, int R, int C, size_t ldw, uint8_t* q, size_t ldq, float* s, int lds,
                       uint8_t* qt, size_t ldqt, float* st, int ldst);

// The SwiGLU forward (cuda_swiglu_fwd's bits of h [n, F]) that also writes h's row-wise codes q [n, ldq]
// (ldq ≥ F) and their scales through srm, as quant_rows would from the written rows. Returns 0,
// running nothing, unless the act dtype is bf16, F % 128 = 0 and the rows start on 16 bytes.
int swiglu_fwd_rows(Backend* be, void* h, const void* gu, const float* scale, int n, int F, uint8_t* q, size_t ldq,
                    SMap srm);
// The SwiGLU forward of h [n, F] (the same bits) writing h's codes in both layouts instead: along
// the rows, qt [F, ldk] (ldk ≥ n, a multiple of 4; zero codes past n) with scales through stm, what
// quant_cols_t makes of h; along F, q [n, ldq] (ldq ≥ F) with srm, what quant_rows makes of it. h
// itself is not stored. Returns 0, running nothing, unless the act dtype is bf16, F % 128 = 0, gu
// starts on 16 bytes, ldq ≥ F and ldk is as above.
int swiglu_fwd_tiles(Backend* be, const void* gu, const float* scale, int n, int F, uint8_t* qt, size_t ldk, SMap stm,
                     uint8_t* q, size_t ldq, SMap srm);
// The SwiGLU backward (cuda_swiglu_bwd's bits: dgu [n, 2F] may be gu) that also writes d(gate|up)'s
// row-wise codes q [n, ldq] (ldq ≥ 2F) and their scales through srm, as quant_rows would from the
// written rows. Returns 0, running nothing, unless the act dtype is bf16, F % 128 = 0 and the rows
// start on 16 bytes.
int swiglu_bwd_rows(Backend* be, void* dgu, float* dscale, const void* dh, const void* gu, const float* scale, int n,
                    int F, uint8_t* q, size_t ldq, SMap srm);
// ---- the workspace of one FP8 product (cuda_fp8.cu: ws_layout) ----
typedef struct Fp8Bufs {
    uint8_t *qa, *qb;                // our A quantised [M, ldq], our B [N, ldq]
    float *sa0, *sa1, *sb, *epi;     // A's scales (rows before the split; the last M % 8), B's; epilogue rows
    size_t epi_rows;
    float *s8, *r8;                  // the tail product: the last 8 rows' scales [Kt, 8], their fp32 rows [8, N]
} Fp8Bufs;

// ---- cuBLASLt's block-scaled FP8 product (cuda_fp8_lt.cu), on the backend's stream ----
// D[n, m] (row-major: n rows of m, row stride ldc; fp32 when d_f32, else bf16) = alpha · qa·qbᵀ +
// beta · Cin, qa [n, kq] with VEC128 scales sa, qb [m, kq] with scales sb (BLK128x128 when blk, else
// VEC128), kq also their row stride. Plans are cached per shape, n (and kq when dyn_k: a weight
// gradient's group rows) keyed rounded up. Returns 0, issuing nothing, when cuBLASLt has no
// algorithm for it.
int fp8_lt_matmul(Backend* be, int m, int n, int kq, int blk, const uint8_t* qb, const float* sb, const uint8_t* qa,
                  const float* sa, float alpha, float beta, const void* Cin, void* D, int ldc, int d_f32, int dyn_k);
// The last M − split rows (1 to 7) of a product C[M, N] = alpha · op(A)·op(B) + beta · addend whose
// first split rows (≥ 8) fp8_lt_matmul took from b's operands (A's scales through sam; B's blk or
// VEC128): cuBLASLt on the last 8 rows into b->r8, then the epilogue for the tail's rows. Returns
// 0, issuing no product, when cuBLASLt has no algorithm for 8 rows.
int fp8_lt_tail(Backend* be, int M, int N, int ldq, const Fp8Bufs* b, SMap sam, int blk, float alpha, float beta,
                const void* addend, void* C, int ldc, int c_f32, int split, int dyn_k);

// ---- the GEMMs' own kernels (cuda_fp8_kernels.cu), on the backend's stream ----
// The fallback GEMM for rows [row0, M): C = alpha · Σ_t fl(fl(sa·sb) · P_t) (+ beta · addend), from
// qa [M, ldq] and qb [N, ldq]; C (and addend) fp32 when c_f32, else bf16, row stride ldc.
void fp8_fallback_gemm(Backend* be, int row0, int M, int N, int K, const uint8_t* qa, SMap sa, const uint8_t* qb, SMap sb,
                       size_t ldq, float alpha, float beta, const void* addend, void* C, size_t ldc, int c_f32);
// C[rows, N] (row stride ldc; fp32 when c_f32, else bf16) = alpha · r + beta · addend (addend like
// C, read only when beta ≠ 0), r fp32 [rows, N] packed: fl(fl(alpha · r) + fl(beta · addend)),
// rounded once to bf16.
void fp8_epilogue(Backend* be, const float* r, int rows, int N, float alpha, float beta, const void* addend, void* C,
                  size_t ldc, int c_f32);
// out [Kt, 8] = the scales of rows r0 .. r0 + 7 of a quantised operand (map sm, VEC128): what
// cuBLASLt reads as the VEC128 scales of those 8 rows alone.
void fp8_gather_scales(Backend* be, SMap sm, int r0, float* out);
