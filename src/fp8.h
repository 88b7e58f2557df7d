// fp8.h — the CPU spec of FP8 (e4m3) block-scaled numerics: conversion, the block-scaled
// quantisers of the recipe (1×128 tiles for activations and gradients, 128×128 blocks for weights)
// and a GEMM emulated exactly. The CUDA kernels are tested against these functions. docs/fp8.md
// states the numerics and the reasons behind them.
//
// Inputs are fp32; a bf16 tensor is quantised through its fp32 values (bf16 → fp32 is exact), which
// is what a GPU kernel reading bf16 must reproduce.
// Layouts: every matrix is row-major; "K" is the reduction dimension of the GEMM that consumes
// a quantised operand, always the innermost (contiguous) one, because Hopper's FP8 tensor cores
// take only the TN layout (both operands K-major).
#pragma once
#include <stddef.h>
#include <stdint.h>

enum {
    FP8_TILE = 128,      // tile length along K (1×128) and block edge (128×128)
    FP8_E4M3_MAX = 448,  // largest finite e4m3 magnitude
};

// ---- e4m3 (OCP E4M3FN: bias 7, 3 mantissa bits, subnormals, no infinities, NaN = S.1111.111) --
// fp32 → e4m3 with round-to-nearest-even and saturation to ±448 (as __nv_cvt_float_to_fp8 with
// __NV_SATFINITE, __NV_E4M3): finite |x| > 448 and ±inf give ±448, NaN of either sign gives 0x7F
// (0.1111.111, what the CUDA conversion returns), |x| ≤ 2^-10 gives a zero of x's sign, fp32 subnormals flush to a signed zero.
uint8_t fp8_e4m3_from_f32(float x);
// e4m3 → fp32, exact (every e4m3 value is an fp32 value).
float fp8_e4m3_to_f32(uint8_t v);

// The tile scale of amax (the largest |x| over the finite elements of a tile or block):
// amax / 448 rounded to fp32; an all-zero (or all non-finite) tile has amax 0 and gets scale 1;
// a scale below FLT_MIN (amax < 448·2^-126) is raised to FLT_MIN, so a scale is always a
// positive normal fp32 and x · fl(1/scale) never exceeds 448 by more than its own rounding.
float fp8_scale_of_amax(float amax);
// One element of a tile with scale s: e4m3(fl(x · fl(1/s))) for finite x (the tile's reciprocal
// rounded once, then one product an element: what a GPU kernel computes at memory speed); a
// non-finite x (±inf, NaN) becomes the e4m3 NaN 0x7F, so a non-finite value stays non-finite.
uint8_t fp8_quant_elem(float x, float s);

static inline size_t fp8_tiles(size_t n) { return (n + FP8_TILE - 1) / FP8_TILE; }

// Activations and output gradients: X[R, C] (row stride ldx ≥ C), tiles of 1×128.
//   Along C ("row-wise"): q[R, C] row-major, s[R, fp8_tiles(C)]; s[r, t] covers
//     X[r, 128t .. min(128t+128, C)) — the last tile is partial when C % 128 ≠ 0: its scale
//     comes from its own C % 128 elements only, and nothing is padded.
//   Along R ("column-wise", the transposed quantisation the weight-gradient GEMM needs):
//     qt[C, R] row-major (the transpose of X, quantised), st[C, fp8_tiles(R)]; st[c, t] covers
//     X[128t .. min(128t+128, R), c]. Bit for bit what the row-wise quantiser gives for X^T.
// Either pair may be NULL; one call with both produces both layouts from one read of X (what
// the GPU cast-transpose kernel does).
void fp8_quant_1x128(const float* x, int R, int C, size_t ldx, uint8_t* q, float* s, uint8_t* qt, float* st);

// Weights: W[R, C] (row stride ldw ≥ C), blocks of 128×128 (partial at the right and bottom
// edges, scaled from their own elements). q[R, C], s[fp8_tiles(R), fp8_tiles(C)]; the
// transposed layout qt[C, R], st[fp8_tiles(C), fp8_tiles(R)] has the same blocks, so
// qt = q^T and st = s^T, equal bit for bit to quantising W^T. Any of q/s and qt/st may be NULL.
void fp8_quant_128x128(const float* w, int R, int C, size_t ldw, uint8_t* q, float* s, uint8_t* qt, float* st);

// Dequantise a row-wise 1×128-quantised [R, C] back to fp32: x[r, c] = fl(e4m3(q) · s[r, c/128]).
void fp8_dequant_1x128(const uint8_t* q, const float* s, int R, int C, float* x);

// ---- the FP8 GEMM, emulated exactly -----------------------------------------------------------
// C[M, N] = A · B^T with A = qa[M, K] (1×128 tiles along K, sa[M, fp8_tiles(K)]) and
// B = qb[N, K] with either 1×128 tiles (b_blk = 0: sb[N, fp8_tiles(K)], cuBLASLt
// VEC128_32F) or 128×128 blocks (b_blk = 1: sb[fp8_tiles(N), fp8_tiles(K)], BLK128x128_32F).
// For each K tile t (the last one partial when K % 128 ≠ 0):
//   P_t = Σ_{k in t} e4m3(qa[i,k]) · e4m3(qb[j,k])   exact (each product is a multiple of 2^-18
//         below 2^18, so 128 of them sum exactly in fp64), then rounded once to fp32;
//   w_t = fl(sa[i,t] · sb[j or j/128, t]);
//   acc = fl(acc + fl(w_t · P_t)), t = 0, 1, ... in increasing order, acc starting at +0.
// C is acc (c_bf16 = 0: float C) or bf16(acc) rounded to nearest even (c_bf16 = 1: uint16_t C);
// ldc is C's row stride in elements. K = 0 gives zeros.
void fp8_gemm_tn(int M, int N, int K, const uint8_t* qa, const float* sa, const uint8_t* qb, const float* sb,
                 int b_blk, void* C, size_t ldc, int c_bf16);
