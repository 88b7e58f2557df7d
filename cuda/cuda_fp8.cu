// cuda_fp8.cu — the FP8 (e4m3) block-scaled GEMMs of backend.h (GemmDesc.fp8, GroupDesc.fp8):
// the operands quantised (cuda_fp8_quant.cu), cuBLASLt's block-scaled FP8 GEMM on sm_90
// (cuda_fp8_lt.cu), a tensor-core fallback kernel (mma.sync m16n8k32 e4m3, sm_89+) and an fp32 epilogue (both in
// cuda_fp8_kernels.cu), and fp8_ws_bytes. Numerics: src/fp8.h (the spec every kernel is tested
// against), docs/fp8.md.
//
// ---- Quantisers (bit for bit what fp8.h specifies; the kernels are in cuda_fp8_quant.cu) -------
// Every code is e4m3(fl(x · fl(1/s))), the tile's reciprocal rounded once (cuda_fp8_quant.cu: codes2),
// through __nv_cvt_float2_to_fp8x2 with __NV_SATFINITE (round to nearest even, saturation to ±448); a
// non-finite x gives 0x7F; the scale is fp8_scale_of_amax over the finite elements of the tile
// (amax / 448 rounded, 1 for amax = 0, raised to FLT_MIN). The codes of a quantised operand are
// row-major [rows, ldq], K innermost, ldq = K rounded up to 16 with zero codes in [K, ldq) (a zero
// code adds exactly zero).
//   k_quant_rows   1×128 tiles along the contiguous dimension (op(A) = A, op(B)ᵀ = B with FP8_ACT)
//   k_quant_cols   1×128 tiles along rows, the cast-transpose: a segment of rows of X [n, C] gives
//                  qt [C, ldk] (the transpose, quantised along n) and, optionally in the same pass,
//                  the row-wise codes and scales of the same rows (both layouts from one read);
//                  op(A) with trans_a, op(B)ᵀ with !trans_b and FP8_ACT, and the weight-gradient
//                  operands per expert group (tiles restart at each group's first row)
//   k_quant_blocks 128×128 blocks, written as is or transposed (FP8_WEIGHT with trans_b or not)
//
// ---- The product: cuBLASLt's block-scaled FP8 GEMM (cuda_fp8_lt.cu: what it takes, its plans) ---
// Our row-major C[M, N] = op(A) · op(B) is cuBLASLt's column-major Cᵀ: its A is our B operand
// quantised [N, ldq] (BLK128x128 for FP8_WEIGHT, VEC128 for FP8_ACT), its B our A operand quantised
// [M, ldq] (VEC128), D is our C. cuBLASLt takes M rows rounded down to a multiple of 8, and the
// last M % 8 rows in a second call on the last 8 rows (cuda_fp8_lt.cu: fp8_lt_tail).
//
// ---- Where cuBLASLt does not run: the fallback kernel (cuda_fp8_kernels.cu, with the epilogue) --
// It runs where the shape is not cuBLASLt's (N % 8 ≠ 0, or fewer than 8 rows), on GPUs other than
// sm_90, where cuBLASLt has no algorithm, and whenever the path is forced (tests: cuda_fp8_set_path).
#include <cuda_fp8.h>
#include <stdio.h>

#include "cuda_fp8.cuh"

enum { WS_ALIGN = 256 };

// ---- the workspace --------------------------------------------------------------------------------

// Rows of fp32 product the epilogue path stages at a time for an output N wide, in at most `bytes`
// (the backend's fp8_epi_bytes): a multiple of 8.
static size_t epi_rows_for(int M, int N, size_t bytes) {
    size_t r = bytes / (4 * (size_t)(N > 0 ? N : 1));
    r = r < 8 ? 8 : r / 8 * 8;
    const size_t m8 = up((size_t)M, 8);
    return r < m8 ? r : m8;
}

// The epilogue rows' bytes of a GEMM into C of the act dtype (none into fp32: cuBLASLt's own beta).
static size_t epi_bytes(Backend* be) { return is_bf16(be) ? CI(be)->fp8_epi_bytes : 0; }

// The layout of ws for one GEMM: our A quantised [M, ldq] with Kt tiles, our B [N, ldq], the
// epilogue's fp32 rows in at most epi_max bytes (epi_bytes, or 0) and the tail product's last 8 rows
// (scales and fp32 rows); with base = NULL only the size. Every part starts on WS_ALIGN bytes.
static size_t ws_layout(int M, int N, int ldq, int Kt, size_t epi_max, char* base, Fp8Bufs* b) {
    size_t off = 0;
    auto take = [&](size_t bytes) {
        const size_t o = off;
        off = up(off + bytes, WS_ALIGN);
        return base ? base + o : (char*)0;
    };
    char* qa = take((size_t)M * ldq);
    char* sa0 = take(4 * (size_t)M * Kt);
    char* sa1 = take(4 * (size_t)8 * Kt);  // the last M % 8 rows' scales
    char* qb = take((size_t)N * ldq);
    const size_t blk = (size_t)cdiv(N, TILE) * up((size_t)Kt, 4), vec = (size_t)Kt * up((size_t)N, 8);
    char* sb = take(4 * (blk > vec ? blk : vec));
    const size_t er = epi_max ? epi_rows_for(M, N, epi_max) : 0;
    char* epi = take(4 * er * (size_t)N);
    char* s8 = take(4 * (size_t)8 * Kt);
    char* r8 = take(4 * (size_t)8 * N);
    if (b) {
        b->qa = (uint8_t*)qa, b->qb = (uint8_t*)qb, b->sa0 = (float*)sa0, b->sa1 = (float*)sa1, b->sb = (float*)sb;
        b->epi = (float*)epi, b->epi_rows = er, b->s8 = (float*)s8, b->r8 = (float*)r8;
    }
    return off + WS_ALIGN;  // slack for an unaligned ws pointer
}

static char* ws_base(const void* ws) { return (char*)up((uintptr_t)ws, WS_ALIGN); }

// A bf16 weight gradient dB_g [N, K] over more rows than one chunk: its fp32 sums, acc_rows rows of
// dB at a time (a multiple of 8, or N), kept in ws after one chunk's codes (at wgrad_acc_at).
static int wgrad_acc_rows(const CudaImpl* c, int N, int K) {
    size_t r = c->fp8_wgrad_acc / (4 * (size_t)(K > 0 ? K : 1));
    r = r < 8 ? 8 : r / 8 * 8;
    return r < (size_t)N ? (int)r : N;
}
static size_t wgrad_acc_at(Backend* be, int N, int K) {
    const int CH = CI(be)->fp8_row_chunk;
    // (the chunks' products are fp32 sums: no epilogue rows)
    return ws_layout(N, K, (int)up((size_t)CH, 16), cdiv(CH, TILE), 0, NULL, NULL) - WS_ALIGN;
}

// The largest n in [0, hi) with fits(n), by bisection: fits is monotone (true up to some n, false
// after), and fits(0) is taken to hold.
template <class Fits> static int most_that_fit(int hi, Fits fits) {
    int lo = 0;
    while (hi - lo > 1) {
        const int mid = lo + (hi - lo) / 2;
        if (fits(mid)) lo = mid;
        else hi = mid;
    }
    return lo;
}

// The most rows of a group whose weight-gradient operands (both quantised along those rows) fit
// in ws_bytes at once, a multiple of 16 (0 when not even 16 do).
static int wgrad_fit_rows(Backend* be, int N, int K, size_t ws_bytes) {
    // in units of 16 rows, the codes' row padding
    return 16 * most_that_fit(1 << 24, [&](int n) {
               return ws_layout(N, K, 16 * n, cdiv(16 * n, TILE), epi_bytes(be), NULL, NULL) <= ws_bytes;
           });
}

extern "C" size_t cuda_fp8_ws_bytes(Backend* be, Fp8Op op, Fp8Gemm fp8, int M, int N, int K, int groups) {
    if (fp8 == FP8_OFF) return 0;
    if (M < 0) M = 0;
    const int CH = CI(be)->fp8_row_chunk, m = M < CH ? M : CH;  // rows are taken CH at a time
    if (op == FP8_OP_WGRAD) {  // dB_g [N, K] = dY_gᵀ X_g: our A = dY_gᵀ [N, rows], our B = X_gᵀ [K, rows]
        // one chunk's codes and epilogue rows (a group of up to CH rows)
        const size_t one = ws_layout(N, K, (int)up((size_t)m, 16), cdiv(m, TILE), epi_bytes(be), NULL, NULL);
        if (!is_bf16(be) || M <= CH) return one;
        // a group may span chunks: one chunk's codes, then a bf16 dB's fp32 sums
        const size_t acc = wgrad_acc_at(be, N, K) + 4 * (size_t)wgrad_acc_rows(CI(be), N, K) * K + WS_ALIGN;
        return acc > one ? acc : one;
    }
    // gemm and the grouped GEMMs (one group at a time, ws reused)
    return ws_layout(m, N, (int)up((size_t)K, 16), cdiv(K, TILE), epi_bytes(be), NULL, NULL);
}

// ---- one FP8 GEMM on quantised operands --------------------------------------------------------
// Our A's codes (qa [M, ldq]) and scales (sa: rows [0, split) in chunks of `chunk`, the rest at
// sa1), B's codes (qb [N, ldq]) and scales (sb) are in place. C[M, N] (ldc, fp32 when c_f32) =
// alpha · r + beta · addend. split = the rows cuBLASLt takes (a multiple of 8, or 0), chunk = the
// epilogue path's rows at a time (or split).
static void fp8_product(Backend* be, int M, int N, int K, int ldq, const Fp8Bufs* b, SMap sam, SMap sbm, int blk,
                        float alpha, float beta, const void* addend, void* C, int ldc, int c_f32, int split,
                        int dyn_k) {
    int done = 0;  // rows computed
    if (split > 0) {
        const int epi = !c_f32 && beta != 0.f;
        if (!epi) {
            if (fp8_lt_matmul(be, N, split, ldq, blk, b->qb, b->sb, b->qa, b->sa0, alpha, beta, beta != 0.f ? addend : C, C,
                          ldc, c_f32, dyn_k))
                done = split;
        } else {
            // bf16 C with beta: the fp32 product in chunks of sam.chunk rows, then the epilogue
            int ok = 1;
            for (int r0 = 0; r0 < split && ok; r0 += sam.chunk) {
                const int rows = split - r0 < sam.chunk ? split - r0 : sam.chunk;
                ok = fp8_lt_matmul(be, N, rows, ldq, blk, b->qb, b->sb, b->qa + (size_t)r0 * ldq, b->sa0 + (size_t)r0 * sam.Kt,
                               1.f, 0.f, b->epi, b->epi, N, 1, dyn_k);
                if (!ok) break;
                fp8_epilogue(be, b->epi, rows, N, alpha, beta, (const bf16*)addend + (size_t)r0 * ldc,
                             (bf16*)C + (size_t)r0 * ldc, (size_t)ldc, 0);
                done = r0 + rows;
            }
            if (!ok && done > 0)
                FATAL("cuda fp8: cuBLASLt refused a chunk after accepting others (m=%d n=%d k=%d)", N, sam.chunk, ldq);
        }
    }
    if (done == M) return;
    if (split >= 8 && done == split && M - split < 8 &&
        fp8_lt_tail(be, M, N, ldq, b, sam, blk, alpha, beta, addend, C, ldc, c_f32, split, dyn_k))
        return;
    // the fallback: rows [done, M)
    fp8_fallback_gemm(be, done, M, N, K, b->qa, sam, b->qb, sbm, (size_t)ldq, alpha, beta, addend, C, (size_t)ldc, c_f32);
}

// How the rows of a product split between cuBLASLt and the fallback: returns split (the rows
// cuBLASLt takes, a multiple of 8, or 0), *map_split (where the scale map's tail starts: split, or
// all M rows in p0 when the fallback takes everything) and *chunk (rows per epilogue pass).
static int plan_split(Backend* be, int M, int N, int c_f32, float beta, const Fp8Bufs* b, int* map_split, int* chunk) {
    CudaImpl* c = CI(be);
    int split = 0;
    const int lt_ok = c->fp8_path != 2 && c->cc_major == 9 && N % 8 == 0;
    if (lt_ok) split = M / 8 * 8;
    *map_split = split > 0 ? split : M;
    *chunk = *map_split > 0 ? *map_split : 1;
    if (split > 0 && !c_f32 && beta != 0.f) *chunk = (int)(b->epi_rows < (size_t)split ? b->epi_rows : (size_t)split);
    return split;
}

// Quantises our B operand for a GEMM (B [K, N] or, trans_b, [N, K], row stride ldb) into b->qb /
// b->sb: 128×128 blocks (FP8_WEIGHT) or 1×128 tiles along K (FP8_ACT). Returns its scale map.
static SMap quant_b(Backend* be, Fp8Gemm fp8, const void* B, int N, int K, int trans_b, int ldb, int ldq, int Kt,
                    const Fp8Bufs* b) {
    if (fp8 == FP8_WEIGHT) {
        const SMap m = smap_blk(b->sb, Kt);
        if (trans_b) quant_blocks(be, B, N, K, ldb, 0, b->qb, ldq, b->sb, m.lds);
        else quant_blocks(be, B, K, N, ldb, 1, b->qb, ldq, b->sb, m.lds);
        return m;
    }
    const SMap m = smap_vec(b->sb, b->sb, N, N, N, Kt);
    if (trans_b) {
        quant_rows(be, B, N, K, ldb, b->qb, ldq, m);
    } else {
        quant_cols_t(be, B, K, N, ldb, b->qb, ldq, m);
    }
    return m;
}

// Quantises our A operand (A [M, K], or trans_a [K, M]; row stride lda) into b->qa with the scale
// map for `split` / `chunk`.
static SMap quant_a(Backend* be, const void* A, int M, int K, int trans_a, int lda, int ldq, int Kt, const Fp8Bufs* b,
                    int split, int chunk) {
    const SMap m = smap_vec(b->sa0, b->sa1, split, chunk, M, Kt);
    if (!trans_a) {
        quant_rows(be, A, M, K, lda, b->qa, ldq, m);
    } else {
        quant_cols_t(be, A, K, M, lda, b->qa, ldq, m);
    }
    return m;
}

static void check_ws(const char* op, const void* ws, size_t have, size_t need) {
    CHECK(ws && have >= need, "%s: fp8 needs ws of %zu bytes (Backend.fp8_ws_bytes), got %zu%s", op, need, have,
          ws ? "" : " (NULL)");
}

// ---- Fp8WCodes (backend.h): quant_b's FP8_WEIGHT outputs kept --------------------------------------
// A group's codes: [q R×up16(C)][s ⌈R/128⌉×up4(⌈C/128⌉)] (B = W_g with trans_b) then [qt C×up16(R)][st]
// (B = W_g without), each part on WS_ALIGN bytes: what quant_b writes into ws for either product.
// One layout's part, rows × k: the codes' bytes, the scales after them (at p), and the part's bytes.
static size_t wc_codes(int rows, int k) { return up((size_t)rows * up((size_t)k, 16), WS_ALIGN); }
static float* wc_scales(char* p, int rows, int k) { return (float*)(p + wc_codes(rows, k)); }
static size_t wc_half(int rows, int k) {
    return wc_codes(rows, k) + up(4 * (size_t)cdiv(rows, TILE) * up((size_t)cdiv(k, TILE), 4), WS_ALIGN);
}
static size_t wc_group(int R, int C) { return wc_half(R, C) + wc_half(C, R); }

extern "C" size_t cuda_fp8_wcodes_bytes(Backend* be, int R, int C, int groups) {
    CHECK(R >= 0 && C >= 0 && groups >= 0, "fp8_wcodes_bytes: negative size R=%d C=%d groups=%d", R, C, groups);
    return (size_t)groups * wc_group(R, C) + WS_ALIGN;  // slack for an unaligned pointer
}

extern "C" void cuda_fp8_wcodes_make(Backend* be, const void* W, int R, int C, int groups, size_t b_stride, void* codes) {
    const size_t ea = dtype_size(be->act_dtype);
    for (int g = 0; g < groups; g++) {
        const char* w = (const char*)W + (size_t)g * b_stride * ea;
        char* p = ws_base(codes) + (size_t)g * wc_group(R, C);  // as stored, then transposed: one read of W_g
        char* pt = p + wc_half(R, C);
        quant_blocks_both(be, w, R, C, (size_t)C, (uint8_t*)p, up((size_t)C, 16), wc_scales(p, R, C),
                          (int)up((size_t)cdiv(C, TILE), 4), (uint8_t*)pt, up((size_t)R, 16), wc_scales(pt, C, R),
                          (int)up((size_t)cdiv(R, TILE), 4));
    }
}

// ---- X's codes along its groups' rows (backend.h: fp8_xcodes_*) ---------------------------------
// Per group of r rows, what wgrad_chunk quantises X_g into: Xᵀ's codes [K, ldk = r rounded up to 16]
// and their scales [⌈r/128⌉, K], each on WS_ALIGN bytes; the groups one after another.
typedef struct XCodes {
    uint8_t* q;
    float* s;
} XCodes;
static size_t xc_codes(int rows, int K) { return up((size_t)K * up((size_t)rows, 16), WS_ALIGN); }
static size_t xc_part(int rows, int K) { return rows ? xc_codes(rows, K) + up(4 * (size_t)K * cdiv(rows, TILE), WS_ALIGN) : 0; }
static XCodes xc_group(const GroupDesc* g, const void* xq, int K, int i) {
    char* p = ws_base(xq);
    for (int j = 0; j < i; j++) p += xc_part(g->host_off[j + 1] - g->host_off[j], K);
    return {(uint8_t*)p, (float*)(p + xc_codes(g->host_off[i + 1] - g->host_off[i], K))};
}
static SMap xc_smap(XCodes x, int rows, int K) { return smap_vec(x.s, x.s, K, K, K, cdiv(rows, TILE)); }

extern "C" size_t cuda_fp8_xcodes_bytes(Backend* be, int R, int groups, int K) {
    CHECK(R >= 0 && groups >= 0 && K >= 0, "fp8_xcodes_bytes: negative size R=%d groups=%d K=%d", R, groups, K);
    // Σ ⌈r_g/128⌉ ≤ R/128 + groups; each part rounds up by less than WS_ALIGN twice; one more for the base
    const size_t k = (size_t)K, G = (size_t)groups;
    return k * ((size_t)R + 15 * G) + 4 * k * ((size_t)R / TILE + G) + (2 * G + 1) * WS_ALIGN;
}

extern "C" void cuda_fp8_xcodes_make(Backend* be, const GroupDesc* g, const void* X, int K, void* xq) {
    fp8_xcodes_check(g, K);
    const size_t ea = dtype_size(be->act_dtype);
    for (int i = 0; i < g->groups; i++) {
        const int r0 = g->host_off[i], rows = g->host_off[i + 1] - r0;
        if (rows == 0) continue;
        const XCodes x = xc_group(g, xq, K, i);
        quant_cols_t(be, (const char*)X + (size_t)r0 * K * ea, rows, K, K, x.q, up((size_t)rows, 16), xc_smap(x, rows, K));
    }
}

// Group i of an op's B from its codes (trans_b: W_g's blocks as stored, else transposed) in place
// of quant_b: b->qb, b->sb point there. Returns the scale map.
static SMap wcodes_b(const Fp8WCodes* wq, int i, int trans_b, Fp8Bufs* b) {
    const int R = wq->R, C = wq->C, rows = trans_b ? R : C, k = trans_b ? C : R;
    char* p = ws_base(wq->codes) + (size_t)(wq->g0 + i) * wc_group(R, C) + (trans_b ? 0 : wc_half(R, C));
    b->qb = (uint8_t*)p;
    b->sb = wc_scales(p, rows, k);
    return smap_blk(b->sb, cdiv(k, TILE));
}
// d's view of its codes from group i on (the ops that take one group on as a GemmDesc of its own).
static const Fp8WCodes* wq_from(const GemmDesc* d, int i, Fp8WCodes* view) {
    if (!d->wq) return NULL;
    *view = *d->wq;
    view->g0 += i;
    return view;
}

// The rows of op(A) gemm_fp8_one takes at a time: the backend's fp8 row chunk, which fp8_ws_bytes
// sizes ws for, or as many more (a multiple of 128, up to all M) as the ws it is given holds. The
// model gives the expert GEMMs what the layer's rows leave of its arena, so that an expert group
// of the step's size is one product: fewer, larger products, each reading B's codes once.
static int rows_at_once(Backend* be, int M, int N, int ldq, int Kt, size_t ws_bytes) {
    const int CH = CI(be)->fp8_row_chunk;
    if (M <= CH) return CH;
    // in units of 128 rows, up to all of M (the op checked that CH rows fit)
    const int rows = TILE * most_that_fit(cdiv(M, TILE) + 1, [&](int n) {
                         return ws_layout(n * TILE, N, ldq, Kt, epi_bytes(be), NULL, NULL) <= ws_bytes;
                     });
    return rows > CH ? rows : CH;
}

// One GEMM (the plain op, or one group of a grouped one): B quantised once, then op(A)'s rows in
// chunks of at most rows_at_once (the backend's fp8 row chunk, cuda_fp8_set_row_chunk, or more
// where ws holds them: ws holds one chunk's codes, whatever M is), each quantised and multiplied
// into its rows of C. The chunks are of one size (a multiple of 8), so that none is a tail of a
// few rows for which the product reads all of B's codes again. base: the aligned ws.
static void gemm_fp8_one(Backend* be, const GemmDesc* d, int lda, int ldb, int ldc, const void* A, const void* B,
                         void* C, char* base) {
    const int M = d->M, N = d->N, K = d->K, ldq = (int)up((size_t)K, 16), Kt = cdiv(K, TILE);
    const int c_f32 = d->c_f32 || !is_bf16(be), CH = rows_at_once(be, M, N, ldq, Kt, d->ws_bytes);
    const size_t ea = dtype_size(be->act_dtype), ec = c_f32 ? 4 : 2;
    Fp8Bufs b;
    ws_layout(M < CH ? M : CH, N, ldq, Kt, epi_bytes(be), base, &b);
    const SMap sbm =
        d->wq ? wcodes_b(d->wq, 0, d->trans_b, &b) : quant_b(be, d->fp8, B, N, K, d->trans_b, ldb, ldq, Kt, &b);
    const char* addend = (const char*)(d->c_in ? d->c_in : C);
    const int nch = M > 0 ? cdiv(M, CH) : 1, step = (int)up((size_t)cdiv(M, nch), 8);  // ≤ CH (a multiple of 128)
    for (int r0 = 0; r0 < M; r0 += step) {
        const int rows = M - r0 < step ? M - r0 : step;
        int ms, chunk;
        const int split = plan_split(be, rows, N, c_f32, d->beta, &b, &ms, &chunk);
        const char* a = (const char*)A + (d->trans_a ? (size_t)r0 * ea : (size_t)r0 * lda * ea);  // op(A)'s rows
        const SMap sam = quant_a(be, a, rows, K, d->trans_a, lda, ldq, Kt, &b, ms, chunk);
        fp8_product(be, rows, N, K, ldq, &b, sam, sbm, d->fp8 == FP8_WEIGHT, d->alpha, d->beta,
                    addend + (size_t)r0 * ldc * ec, (char*)C + (size_t)r0 * ldc * ec, ldc, c_f32, split, 0);
    }
}

// ---- the ops ---------------------------------------------------------------------------------------

extern "C" void cuda_gemm_fp8(Backend* be, const GemmDesc* d, const void* A, const void* B, void* C) {
    int lda, ldb, ldc;
    gemm_desc_check(d, &lda, &ldb, &ldc);
    CHECK(d->fp8 == FP8_WEIGHT || d->fp8 == FP8_ACT, "gemm: fp8 mode %d unknown", (int)d->fp8);
    if (d->M == 0 || d->N == 0) return;
    if (d->K == 0 || d->alpha == 0.f) {  // no product: C = beta · addend, as without fp8
        GemmDesc x = *d;
        x.fp8 = FP8_OFF;
        cuda_gemm(be, &x, A, B, C);
        return;
    }
    const size_t need = cuda_fp8_ws_bytes(be, FP8_OP_GEMM, d->fp8, d->M, d->N, d->K, 1);
    check_ws("gemm", d->ws, d->ws_bytes, need);
    gemm_fp8_one(be, d, lda, ldb, ldc, A, B, C, ws_base(d->ws));
}

// The last non-empty group (-1: none).
static int last_group(const GroupDesc* g) {
    int last = -1;
    for (int i = 0; i < g->groups; i++)
        if (g->host_off[i + 1] > g->host_off[i]) last = i;
    return last;
}
// The rows a data-direction product takes for group i: with beta = 0 a group's product may run on
// past its rows into the next groups' (up to a multiple of 8, so cuBLASLt takes it whole); those
// rows of C are written again, right, by their own group's product later on the stream. Only the
// last group ends in a tail of rows (fp8_lt_tail's; the fallback's when the group has fewer than 8).
static int product_rows(const GroupDesc* g, int i, int last, float beta) {
    const int r0 = g->host_off[i], rows = g->host_off[i + 1] - r0, R = g->host_off[g->groups];
    if (beta != 0.f || i == last) return rows;
    const int m8 = (rows + 7) / 8 * 8;
    return m8 < R - r0 ? m8 : R - r0;
}

// One group at a time (the ws reused: the stream orders each group's quantisers after the last
// group's product).
extern "C" void cuda_gemm_grouped_fp8(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* A, const void* B,
                                      void* C) {
    gemm_grouped_check("gemm_grouped", d, g);
    CHECK(d->fp8 == FP8_WEIGHT || d->fp8 == FP8_ACT, "gemm_grouped: fp8 mode %d unknown", (int)d->fp8);
    const int lda = d->lda ? d->lda : d->K, ldc = d->ldc ? d->ldc : d->N;
    const int ldb = d->ldb ? d->ldb : (d->trans_b ? d->K : d->N);
    if (d->K == 0 || d->alpha == 0.f || d->N == 0) {
        GemmDesc x = *d;
        x.fp8 = FP8_OFF, x.wq = NULL;
        cuda_gemm_grouped(be, &x, g, A, B, C);
        return;
    }
    const int R = g->host_off[g->groups];
    const size_t need = cuda_fp8_ws_bytes(be, FP8_OP_GROUPED, d->fp8, R, d->N, d->K, g->groups);
    check_ws("gemm_grouped", d->ws, d->ws_bytes, need);
    const size_t ea = dtype_size(be->act_dtype), ec = (d->c_f32 || !is_bf16(be)) ? 4 : ea;
    const int last = last_group(g);
    for (int i = 0; i < g->groups; i++) {
        const int r0 = g->host_off[i];
        if (g->host_off[i + 1] == r0) continue;
        GemmDesc x = *d;
        Fp8WCodes view;
        x.M = product_rows(g, i, last, d->beta);
        x.wq = wq_from(d, i, &view);
        gemm_fp8_one(be, &x, lda, ldb, ldc, (const char*)A + (size_t)r0 * lda * ea, (const char*)B + g->b_stride * i * ea,
                     (char*)C + (size_t)r0 * ldc * ec, ws_base(d->ws));
    }
}

// One product of the weight gradient: C[nr, K] (row stride ldc; fp32 when c_f32) = dY[k0 .. k0+kr,
// n0 .. n0+nr)ᵀ · X[k0 .. k0+kr, :] + beta · C, both quantised along those kr rows (dY [·, N], X [·, K]).
// xg: X's group codes (its rows from r0, xrows of them), read instead of X: the whole group's in
// place, a chunk's copied into ws (its tiles start on one of the group's: k0 − r0 is a multiple of 128).
static void wgrad_chunk(Backend* be, const void* dY, const void* X, const XCodes* xg, int r0, int xrows, int N, int K,
                        int n0, int nr, int k0, int kr, void* C, int ldc, float beta, int c_f32, char* base) {
    const size_t ea = dtype_size(be->act_dtype);
    const int ldk = (int)up((size_t)kr, 16), Kt = cdiv(kr, TILE);
    Fp8Bufs b;
    ws_layout(N, K, ldk, Kt, epi_bytes(be), base, &b);
    int ms, chunk;
    const int split = plan_split(be, nr, K, c_f32, beta, &b, &ms, &chunk);
    const SMap sam = smap_vec(b.sa0, b.sa1, ms, chunk, nr, Kt);
    quant_cols_t(be, (const char*)dY + ((size_t)k0 * N + n0) * ea, kr, nr, N, b.qa, ldk, sam);
    if (!xg) {
        quant_cols_t(be, (const char*)X + (size_t)k0 * K * ea, kr, K, K, b.qb, ldk, smap_vec(b.sb, b.sb, K, K, K, Kt));
    } else if (kr == xrows) {
        b.qb = xg->q, b.sb = xg->s;
    } else {
        const size_t xld = up((size_t)xrows, 16);
        CUDA_CK(cudaMemcpy2DAsync(b.qb, ldk, xg->q + (k0 - r0), xld, ldk, K, cudaMemcpyDeviceToDevice, ST(be)));
        be->copy(be, b.sb, xg->s + (size_t)(k0 - r0) / TILE * K, 4 * (size_t)Kt * K);
    }
    fp8_product(be, nr, K, kr, ldk, &b, sam, smap_vec(b.sb, b.sb, K, K, K, Kt), 0, 1.f, beta, C, C, ldc, c_f32, split, 1);
}

// dB_g [N, K] = dY_gᵀ X_g + beta · dB_g: both operands quantised along the group's rows (the
// cast-transpose per group: tiles restart at the group's first row, rows padded with zero codes
// to a multiple of 16), 1×128 × 1×128.
extern "C" void cuda_gemm_grouped_wgrad_fp8(Backend* be, const GroupDesc* g, int N, int K, const void* dY, const void* X,
                                            void* dB, float beta) {
    gemm_grouped_wgrad_check(g, beta);
    CHECK(g->fp8 == FP8_ACT, "gemm_grouped_wgrad: fp8 must be FP8_ACT (got %d)", (int)g->fp8);
    const int R = g->host_off[g->groups];
    if (N == 0 || K == 0) return;
    const size_t need = cuda_fp8_ws_bytes(be, FP8_OP_WGRAD, g->fp8, R, N, K, g->groups);
    check_ws("gemm_grouped_wgrad", g->ws, g->ws_bytes, need);
    const size_t eb = g->db_act ? dtype_size(be->act_dtype) : sizeof(float);
    const int c_f32 = !g->db_act || !is_bf16(be), CH = CI(be)->fp8_row_chunk;
    const int fit = wgrad_fit_rows(be, N, K, g->ws_bytes);
    char* db = (char*)dB;
    for (int i = 0; i < g->groups; i++) {
        const int r0 = g->host_off[i], rows = g->host_off[i + 1] - r0;
        char* dbg = db + g->b_stride * i * eb;
        if (rows == 0) {  // += 0, or = 0
            if (beta == 0.f) be->zero(be, dbg, eb * N * K);
            continue;
        }
        XCodes xc;
        if (g->xq) xc = xc_group(g, g->xq, K, i);
        const XCodes* xg = g->xq ? &xc : NULL;
        if (rows <= fit) {  // the whole group in one product: each operand quantised once
            wgrad_chunk(be, dY, X, xg, r0, rows, N, K, 0, N, r0, rows, dbg, K, beta, c_f32, ws_base(g->ws));
            continue;
        }
        // the group's rows in chunks of CH (a multiple of 128: the 1×128 tiles still start at the
        // group's first row), their products summed into dB in fp32
        CI(be)->fp8_wgrad_split++;
        const int nch = cdiv(rows, CH);
        if (c_f32 || nch == 1) {
            for (int c = 0; c < nch; c++) {
                const int k0 = r0 + c * CH, kr = rows - c * CH < CH ? rows - c * CH : CH;
                wgrad_chunk(be, dY, X, xg, r0, rows, N, K, 0, N, k0, kr, dbg, K, c == 0 ? beta : 1.f, c_f32,
                            ws_base(g->ws));
            }
            continue;
        }
        // a bf16 dB over several chunks: per block of er rows of dB, the chunks summed in fp32 in
        // ws, then dB = bf16(sum + beta · dB), rounded once. Each block quantises every chunk of X
        // again, so the blocks are few: fp8_wgrad_acc holds 256 MB of sums (Mixtral's w2 in one
        // block, its w13 in two).
        float* acc = (float*)(ws_base(g->ws) + wgrad_acc_at(be, N, K));
        const int er = wgrad_acc_rows(CI(be), N, K);
        for (int n0 = 0; n0 < N; n0 += er) {
            const int nr = N - n0 < er ? N - n0 : er;
            for (int c = 0; c < nch; c++) {
                const int k0 = r0 + c * CH, kr = rows - c * CH < CH ? rows - c * CH : CH;
                wgrad_chunk(be, dY, X, xg, r0, rows, N, K, n0, nr, k0, kr, acc, K, c == 0 ? 0.f : 1.f, 1,
                            ws_base(g->ws));
            }
            bf16* dbr = (bf16*)dbg + (size_t)n0 * K;
            fp8_epilogue(be, acc, nr, K, 1.f, beta, dbr, dbr, (size_t)K, 0);
        }
    }
}

// A group's product over n rows whose A codes (row stride ldq, Kt tiles) a kernel writes for its own
// nc rows only: the rows it runs on into (n > nc) get zero codes and every scale zero first, so that
// their rows of C (written again by their own group's product later on the stream) are finite.
static void zero_run_on(Backend* be, const Fp8Bufs* b, int nc, int n, int ldq, int Kt) {
    if (n <= nc) return;
    be->zero(be, b->qa + (size_t)nc * ldq, (size_t)(n - nc) * ldq);
    be->zero(be, b->sa0, 4 * (size_t)Kt * n);
    be->zero(be, b->sa1, 4 * (size_t)Kt * 8);
}

// ---- gemm_grouped_ffn: the experts' forward, per group --------------------------------------------
// Per group: w13's product into gu (as gemm_grouped takes the group), the SwiGLU of the group's
// rows writing h and, from its registers, h's row-wise codes along F for w2's product
// (swiglu_fwd_rows: the two ops read h back to quantise it), then W2_g's blocks (or its kept codes)
// and w2's product into Y: the two ops' bits. With hq the SwiGLU writes h's codes along the rows
// into hq as well, 128 × 128 tiles of h a block, and not h (swiglu_fwd_tiles). A group whose w2
// operands do not fit in ws takes the two ops' steps (the plain SwiGLU, then gemm_grouped's product;
// then h's codes into hq).
extern "C" void cuda_gemm_grouped_ffn(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* A, const void* B,
                                      void* gu, void* h, void* hq, const float* scale, const GemmDesc* d2,
                                      const GroupDesc* g2, const void* B2, void* Y) {
    gemm_grouped_ffn_check(d, g, d2, g2, hq);
    const int F = d->N / 2, H = d2->N, K = d->K;
    const int own = d->fp8 == FP8_WEIGHT && d2->fp8 == FP8_WEIGHT && d->ws == d2->ws && d->trans_b && d2->trans_b &&
                    d->beta == 0.f && d2->beta == 0.f && d->alpha != 0.f && d2->alpha != 0.f && K > 0 && F > 0 &&
                    H > 0 && !d->lda && !d->ldb && !d->ldc && !d2->lda && !d2->ldb && !d2->ldc && !d->c_f32 &&
                    !d2->c_f32 && is_bf16(be) && F % TILE == 0 && (uintptr_t)gu % 16 == 0 && (uintptr_t)h % 16 == 0;
    if (!own) {
        gemm_grouped_ffn_seq(be, d, g, A, B, gu, h, hq, scale, d2, g2, B2, Y);
        return;
    }
    const int R = g->host_off[g->groups], last = last_group(g), Kt = cdiv(F, TILE);
    const size_t need13 = cuda_fp8_ws_bytes(be, FP8_OP_GROUPED, FP8_WEIGHT, R, 2 * F, K, g->groups),
                 need2 = cuda_fp8_ws_bytes(be, FP8_OP_GROUPED, FP8_WEIGHT, R, H, F, g->groups);
    check_ws("gemm_grouped_ffn", d->ws, d->ws_bytes, need13 > need2 ? need13 : need2);
    const size_t ea = dtype_size(be->act_dtype);
    char* base = ws_base(d->ws);
    for (int i = 0; i < g->groups; i++) {
        const int r0 = g->host_off[i], nc = g->host_off[i + 1] - r0;
        if (nc == 0) continue;
        const int n = product_rows(g, i, last, 0.f);  // both products' rows (beta 0: on into the next group's)
        GemmDesc x = *d, y = *d2;
        Fp8WCodes v1, v2;
        x.M = y.M = n;
        x.wq = wq_from(d, i, &v1), y.wq = wq_from(d2, i, &v2);
        char *gug = (char*)gu + (size_t)r0 * 2 * F * ea, *hg = (char*)h + (size_t)r0 * F * ea;
        char* yg = (char*)Y + (size_t)r0 * H * ea;
        const char* b2 = (const char*)B2 + g2->b_stride * i * ea;
        const float* sg = scale ? scale + r0 : NULL;
        gemm_fp8_one(be, &x, K, K, 2 * F, (const char*)A + (size_t)r0 * K * ea, (const char*)B + g->b_stride * i * ea,
                     gug, base);
        XCodes xc;
        if (hq) xc = xc_group(g, hq, F, i);
        const size_t ldk = up((size_t)nc, 16);
        if (ws_layout(n, H, F, Kt, epi_bytes(be), NULL, NULL) > d->ws_bytes) {  // the two ops' steps
            cuda_swiglu_fwd(be, hg, gug, sg, nc, F);
            gemm_fp8_one(be, &y, F, F, H, hg, b2, yg, base);
            if (hq) quant_cols_t(be, hg, nc, F, F, xc.q, ldk, xc_smap(xc, nc, F));
            continue;
        }
        CI(be)->fp8_ffn_groups++;
        Fp8Bufs b;
        ws_layout(n, H, F, Kt, epi_bytes(be), base, &b);  // after w13's product on the stream
        int ms, chunk;
        const int split = plan_split(be, n, H, 0, 0.f, &b, &ms, &chunk);
        const SMap sam = smap_vec(b.sa0, b.sa1, ms, chunk, n, Kt);
        zero_run_on(be, &b, nc, n, F, Kt);
        const int ok = hq ? swiglu_fwd_tiles(be, gug, sg, nc, F, xc.q, ldk, xc_smap(xc, nc, F), b.qa, (size_t)F, sam)
                          : swiglu_fwd_rows(be, hg, gug, sg, nc, F, b.qa, (size_t)F, sam);
        CHECK(ok, "gemm_grouped_ffn: the SwiGLU with h's codes declined");
        const SMap sbm = y.wq ? wcodes_b(y.wq, 0, 1, &b) : quant_b(be, FP8_WEIGHT, b2, H, F, 1, F, F, Kt, &b);
        fp8_product(be, n, H, F, F, &b, sam, sbm, 1, d2->alpha, 0.f, yg, yg, H, 0, split, 0);
    }
}

// ---- gemm_grouped_swiglu_bwd: the SwiGLU backward and w13's two products, per group -------------
// Per group whose codes fit in ws: the SwiGLU backward in place of gu, writing from its registers
// the data gradient's A too (d(gate|up)'s row-wise codes along 2F: swiglu_bwd_rows, bf16 with F a
// multiple of 128), then the cast-transpose of d(gate|up) for the weight gradient's A (along the
// group's rows). Elsewhere the plain SwiGLU backward, then one read of d(gate|up) for both
// (k_quant_cols with the row-wise codes). The three ops read d(gate|up) once per quantiser. Then
// X's cast-transpose and the weight gradient, W_g's transposed blocks and the data gradient, as
// the separate ops run them, so the products are the same bits. A group that does not fit takes
// the three ops. (A kernel that also made the cast-transpose, never writing d(gate|up) in bf16,
// measured slower: bound by its instructions; docs/fp8.md.)

// The buffers of one group of nc rows whose data gradient takes n ≥ nc rows: the weight
// gradient's operands (wg: d(gate|up)ᵀ [2F, ldk] and Xᵀ [K, ldk], its epilogue rows) and the data
// gradient's (dg: d(gate|up) [n, ldq] row-wise and W_gᵀ's blocks [K, ldq]); base NULL: the size.
typedef struct W13Bufs {
    Fp8Bufs wg, dg;
} W13Bufs;
static size_t w13_layout(int n, int nc, int F2, int K, size_t epi_max, char* base, W13Bufs* f) {
    const int ldk = (int)up((size_t)nc, 16), ldq = (int)up((size_t)F2, 16);
    size_t off = ws_layout(F2, K, ldk, cdiv(nc, TILE), epi_max, base, f ? &f->wg : NULL) - WS_ALIGN;
    off += ws_layout(n, K, ldq, cdiv(F2, TILE), 0, base ? base + off : NULL, f ? &f->dg : NULL) - WS_ALIGN;
    return off + WS_ALIGN;
}

// One group: rows [r0, r0 + nc) of every operand; the data gradient over n rows (nc, or on into
// the next group's rows to a multiple of 8: their codes are zeros here, their rows of dX written
// again by their own group's product later on the stream).
static void w13_group(Backend* be, const GemmDesc* d, const GroupDesc* g, int i, int r0, int nc, int n, const void* dh,
                      void* gu, const float* scale, float* dscale, const void* X, const void* W, void* dW, float beta,
                      void* dX, char* base) {
    const int F2 = d->K, F = F2 / 2, K = d->N, ldk = (int)up((size_t)nc, 16), ldq = (int)up((size_t)F2, 16);
    const int Ktk = cdiv(nc, TILE), Kt2 = cdiv(F2, TILE);
    const int cw = !g->db_act || !is_bf16(be), cx = d->c_f32 || !is_bf16(be);
    const size_t ea = dtype_size(be->act_dtype), eb = g->db_act ? ea : 4, ex = cx ? 4 : ea;
    W13Bufs f;
    w13_layout(n, nc, F2, K, epi_bytes(be), base, &f);
    int ms_w, ch_w, ms_d, ch_d;
    const int split_w = plan_split(be, F2, K, cw, beta, &f.wg, &ms_w, &ch_w);
    const int split_d = plan_split(be, n, K, cx, 0.f, &f.dg, &ms_d, &ch_d);
    const SMap stm = smap_vec(f.wg.sa0, f.wg.sa1, ms_w, ch_w, F2, Ktk);  // d(gate|up)ᵀ, along the rows
    const SMap srm = smap_vec(f.dg.sa0, f.dg.sa1, ms_d, ch_d, n, Kt2);   // d(gate|up), along 2F
    zero_run_on(be, &f.dg, nc, n, ldq, Kt2);
    char* dgu = (char*)gu + (size_t)r0 * F2 * ea;
    const char* dhg = (const char*)dh + (size_t)r0 * F * ea;
    float* dsg = dscale ? dscale + r0 : NULL;
    const float* sg = scale ? scale + r0 : NULL;
    if (swiglu_bwd_rows(be, dgu, dsg, dhg, dgu, sg, nc, F, f.dg.qa, (size_t)ldq, srm)) {
        quant_cols_t(be, dgu, nc, F2, (size_t)F2, f.wg.qa, (size_t)ldk, stm);  // the row-wise codes are written
    } else {
        cuda_swiglu_bwd(be, dgu, dsg, dhg, dgu, sg, nc, F);
        quant_cols(be, dgu, nc, F2, (size_t)F2, f.wg.qa, (size_t)ldk, stm, f.dg.qa, (size_t)ldq, srm);
    }
    // the weight gradient: dW_g (+)= d(gate|up)ᵀ X, both along the group's rows
    const SMap sxm = smap_vec(f.wg.sb, f.wg.sb, K, K, K, Ktk);
    quant_cols_t(be, (const char*)X + (size_t)r0 * K * ea, nc, K, (size_t)K, f.wg.qb, (size_t)ldk, sxm);
    char* dWg = (char*)dW + g->b_stride * i * eb;
    fp8_product(be, F2, K, nc, ldk, &f.wg, stm, sxm, 0, 1.f, beta, dWg, dWg, K, cw, split_w, 1);
    // the data gradient: dX = d(gate|up) · W_g, W_g [2F, K] as 128×128 blocks of its transpose
    SMap swm;
    if (d->wq) {
        swm = wcodes_b(d->wq, i, 0, &f.dg);
    } else {
        swm = smap_blk(f.dg.sb, Kt2);
        quant_blocks(be, (const char*)W + g->b_stride * i * ea, F2, K, (size_t)K, 1, f.dg.qb, (size_t)ldq, f.dg.sb,
                     swm.lds);
    }
    char* dx = (char*)dX + (size_t)r0 * K * ex;
    fp8_product(be, n, K, F2, ldq, &f.dg, srm, swm, 1, d->alpha, 0.f, dx, dx, K, cx, split_d, 0);
}

extern "C" void cuda_gemm_grouped_swiglu_bwd(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* dh, void* gu,
                                              const float* scale, float* dscale, const void* X, const void* W, void* dW,
                                              float beta, void* dX) {
    gemm_grouped_swiglu_bwd_check(d, g);
    // the per-group path: both products in FP8 on one ws, the data gradient without an addend
    const int per_group = d->fp8 == FP8_WEIGHT && g->fp8 == FP8_ACT && d->ws == g->ws && d->beta == 0.f &&
                          d->alpha != 0.f && d->N > 0 && !d->lda && !d->ldb && !d->ldc;
    if (!per_group) {
        gemm_grouped_swiglu_bwd_seq(be, d, g, dh, gu, scale, dscale, X, W, dW, beta, dX);
        return;
    }
    const int F2 = d->K, F = F2 / 2, K = d->N, last = last_group(g);
    const size_t ea = dtype_size(be->act_dtype), eb = g->db_act ? ea : 4, ex = (d->c_f32 || !is_bf16(be)) ? 4 : ea;
    for (int i = 0; i < g->groups; i++) {
        const int r0 = g->host_off[i], nc = g->host_off[i + 1] - r0;
        if (nc == 0) {  // += 0, or = 0
            if (beta == 0.f) be->zero(be, (char*)dW + g->b_stride * i * eb, eb * F2 * K);
            continue;
        }
        const int n = product_rows(g, i, last, 0.f);  // the data gradient's rows (beta 0)
        if (w13_layout(n, nc, F2, K, epi_bytes(be), NULL, NULL) <= g->ws_bytes) {
            CI(be)->fp8_w13_groups++;
            w13_group(be, d, g, i, r0, nc, n, dh, gu, scale, dscale, X, W, dW, beta, dX, ws_base(g->ws));
            continue;
        }
        // this group alone through the three ops
        const int off[2] = {0, nc};
        GroupDesc one = *g;
        one.groups = 1, one.host_off = off;
        GemmDesc d1 = *d;
        Fp8WCodes view;
        d1.wq = wq_from(d, i, &view);
        gemm_grouped_swiglu_bwd_seq(be, &d1, &one, (const char*)dh + (size_t)r0 * F * ea, (char*)gu + (size_t)r0 * F2 * ea,
                                    scale ? scale + r0 : NULL, dscale ? dscale + r0 : NULL,
                                    (const char*)X + (size_t)r0 * K * ea, (const char*)W + g->b_stride * i * ea,
                                    (char*)dW + g->b_stride * i * eb, beta, (char*)dX + (size_t)r0 * K * ex);
    }
}

// The workspace gemm_grouped_swiglu_bwd needs to take a group of `rows` rows (its data gradient
// running on to a multiple of 8) of F and K (the hidden size) on its own path.
extern "C" size_t cuda_fp8_swiglu_bwd_ws(Backend* be, int rows, int F, int K) {
    return w13_layout((rows + 7) / 8 * 8, rows, 2 * F, K, epi_bytes(be), NULL, NULL);
}
// The workspace gemm_grouped_ffn needs to take a group of `rows` rows (its products running on to a
// multiple of 8) of F and H on its own path, besides fp8_ws_bytes for w13's product.
extern "C" size_t cuda_fp8_ffn_ws(Backend* be, int rows, int F, int H) {
    return ws_layout((rows + 7) / 8 * 8, H, F, cdiv(F, TILE), epi_bytes(be), NULL, NULL);
}
