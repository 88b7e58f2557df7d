// cuda_fp8_lt.cu — the product of the FP8 GEMMs (cuda_fp8.cu): cuBLASLt's block-scaled FP8 matmul,
// its plans cached per shape, what cuBLASLt expects of it, and a product's last M % 8 rows.
//
// ---- cuBLASLt's block-scaled FP8 GEMM: what it takes (cuBLAS 12.9+, sm_90 only) ---------------
// Modes (cublasLt.h, cublasLtMatmulMatrixScale_t): VEC128_32F — "a dedicated CUDA_R_32F scaling
// factor for each 128-element block in the innermost dimension"; BLK128x128_32F — one per
// 128×128-element block. Set with CUBLASLT_MATMUL_DESC_A/B_SCALE_MODE, the scales through
// CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER (device fp32). Facts used here, with their sources:
//  * Hopper only, introduced in cuBLAS 12.9 (NVIDIA's answer in NVIDIA/CUDALibrarySamples#310);
//    FP8 on Hopper is TN only: cuBLASLt's A with CUBLAS_OP_T, B with CUBLAS_OP_N, both K-major.
//  * Pairs: VEC128 × VEC128, VEC128 × BLK128x128 and BLK128x128 × VEC128; not BLK × BLK (the
//    cuBLAS documentation's table in "128-element 1D and 128x128 2D Block Scaling For FP8 Data
//    Types"; Transformer Engine's cublaslt_gemm.cu: "Only 1D by 1D, 1D by 2D, and 2D by 1D block
//    scaling supported"); D only 16F, 16BF or 32F (same section); fast accumulation must stay off
//    (PyTorch ScaledBlas: "doesn't support fast accum with 1x128 blockwise scaling").
//  * Scale layouts: the cuBLAS documentation, same section, "Scaling factors layouts": VEC128 scales
//    M-major for A (shape M × L, L = ⌈K/128⌉) and N-major for B (N × L), M and N multiples of 4;
//    BLK128x128 scales K-major with the stride between columns a multiple of 4 (L4 × ⌈M/128⌉, L4 = L
//    rounded up to 4); scale start addresses 16-byte aligned. The same as Transformer Engine's
//    "GEMM-ready" format (docs/features/low_precision_training/fp8_blockwise_scaling, passed to
//    cuBLASLt as they are; its tests compare cuBLASLt with an emulation on shapes such as 320×256×336):
//      VEC128 for an operand stored [R, K] (R outer, K inner): scale (r, t) at t · pad4(R) + r,
//        i.e. [⌈K/128⌉, pad4(R)] row-major, the outer index contiguous;
//      BLK128x128 for [R, K]: scale (r/128, t) at (r/128) · pad4(⌈K/128⌉) + t, i.e.
//        [⌈R/128⌉, pad4(⌈K/128⌉)] row-major.
//    (pad4 = up to a multiple of 4: 16-byte rows.) PyTorch's scaled_mm tests say the same of the
//    1×128 scales ("1x128 blocks need scales to be outer-dim-major"), and users of its cuBLASLt
//    path pad the token count to 4 and the weight's K blocks to 4. Here R is always a multiple of 8 where
//    cuBLASLt runs (below), so pad4(R) = R for VEC128; BLK128x128 rows are padded to 4 floats.
//  * Shape rules (Transformer Engine's checks and test_unaligned_shapes): leading dimensions a
//    multiple of 16 bytes (ldq is); m (our N) a multiple of 8; n (our rows M) a multiple of 8 when
//    cuBLASLt's B is VEC128 (ours always is); K is passed as ldq (zero codes, exact).
//  * beta: accepted with these modes, but on a bf16 output cuBLASLt rounds the product to bf16
//    before it adds beta·C (Transformer Engine's reference tests/pytorch/references/
//    blockwise_fp8_gemm_reference.py: "first convert C to output dtype, then accumulate"); the
//    contract rounds once, so a bf16 C with beta ≠ 0 takes the fp32 product into ws and
//    k_epilogue adds beta·addend (fp32 C: cuBLASLt's own beta, one fp32 rounding).
//  * Inside a 128-K tile the tensor cores sum the e4m3 products with a limited-precision
//    accumulator, promoted to fp32 and scaled once per tile (the same reference: "every 4 QMMA
//    partial accumulation results are accumulated into float32 registers", y += partial · scale;
//    DeepSeek-V3 §3.3.2 measured ~14 retained bits). The tests bound that term (docs/fp8.md).
// Mapping: our row-major C[M, N] = op(A) · op(B) is cuBLASLt's column-major Cᵀ = op(B)ᵀ·op(A)ᵀ:
// cuBLASLt's A is our B operand quantised [N, ldq] (CUBLAS_OP_T, m = N, scale mode BLK128x128 for
// FP8_WEIGHT, VEC128 for FP8_ACT), its B is our A operand quantised [M, ldq] (CUBLAS_OP_N, n = M,
// VEC128), D is our C.
//
#include <cuda_fp8.h>
#include <stdio.h>

#include "cuda_fp8.cuh"

enum { FP8_CACHE_CAP = 2048 };

// ---- cuBLASLt plans --------------------------------------------------------------------------------

typedef struct Fp8Key {
    int m, n, k;      // cuBLASLt's dims (n rounded for the expert GEMMs' varying rows)
    int ldc;
    int blk;          // cuBLASLt's A (our B) BLK128x128 (else VEC128)
    int d_f32;        // D (and C) fp32, else bf16
    int align;        // C/D pointer alignment (≤ 16)
    int dyn;          // 1: n rounded, 2: k rounded (the weight gradients' rows), 3: both
} Fp8Key;

typedef struct Fp8Plan {
    Fp8Key key;
    int used, ok;     // ok = 0: cuBLASLt has no algorithm (the fallback runs)
    int cur_n, cur_k;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} Fp8Plan;

struct Fp8Cache {
    Fp8Plan slot[FP8_CACHE_CAP];
    int used;
};

static void plan_free(Fp8Plan* p) {
    if (!p->used) return;
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->lc);
    cublasLtMatmulDescDestroy(p->op);
    p->used = 0;
}

void fp8_cache_destroy(struct Fp8Cache* f) {
    if (!f) return;
    for (int i = 0; i < FP8_CACHE_CAP; i++) plan_free(&f->slot[i]);
    free(f);
}

static void plan_build(CudaImpl* c, Fp8Plan* p, const Fp8Key* k) {
    memset(p, 0, sizeof *p);
    p->key = *k;
    p->used = 1;
    CUBLAS_CK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_CK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    const int32_t ma = k->blk ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    const int32_t mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    CUBLAS_CK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma));
    CUBLAS_CK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb));
    // the heuristic wants the scale pointers set (any device address; each call sets its own)
    const void* dummy = c->scratch;
    CUBLAS_CK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dummy, sizeof dummy));
    CUBLAS_CK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dummy, sizeof dummy));
    const cudaDataType_t dt = k->d_f32 ? CUDA_R_32F : CUDA_R_16BF;
    CUBLAS_CK(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_8F_E4M3, k->k, k->m, k->k));
    CUBLAS_CK(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_8F_E4M3, k->k, k->n, k->k));
    CUBLAS_CK(cublasLtMatrixLayoutCreate(&p->lc, dt, k->m, k->n, k->ldc));
    p->cur_n = k->n, p->cur_k = k->k;
    cublasLtMatmulPreference_t pref;
    CUBLAS_CK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = c->lt_ws_bytes;
    const uint32_t al = (uint32_t)k->align, a16 = 16;
    CUBLAS_CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    CUBLAS_CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a16, sizeof a16));
    CUBLAS_CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &a16, sizeof a16));
    CUBLAS_CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al));
    CUBLAS_CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al));
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &nres);
    cublasLtMatmulPreferenceDestroy(pref);
    p->ok = s == CUBLAS_STATUS_SUCCESS && nres > 0;
    if (p->ok) p->algo = res.algo;
    if (c->opt.gemm_log)
        fprintf(stderr, "fp8 gemm plan m=%d n=%d k=%d %s x VEC128 -> %s: %s\n", k->m, k->n, k->k,
                k->blk ? "BLK128x128" : "VEC128", k->d_f32 ? "fp32" : "bf16",
                p->ok ? "cuBLASLt" : cublasLt_status_name(s));
}

static Fp8Plan* plan_get(CudaImpl* c, const Fp8Key* k) {
    if (!c->fp8) c->fp8 = (struct Fp8Cache*)xcalloc(1, sizeof(struct Fp8Cache));
    struct Fp8Cache* f = c->fp8;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ ((const unsigned char*)k)[i]) * 1099511628211ull;
    for (int probe = 0; probe < FP8_CACHE_CAP; probe++) {
        Fp8Plan* p = &f->slot[(h + probe) % FP8_CACHE_CAP];
        if (!p->used) {
            if (f->used >= FP8_CACHE_CAP * 3 / 4) {  // full: start again (plans are cheap to rebuild)
                for (int i = 0; i < FP8_CACHE_CAP; i++) plan_free(&f->slot[i]);
                f->used = 0;
                return plan_get(c, k);
            }
            plan_build(c, p, k);
            f->used++;
            return p;
        }
        if (!memcmp(&p->key, k, sizeof *k)) return p;
    }
    FATAL("cuda fp8: plan cache full");
}

// rows (n) of a plan: the expert GEMMs' rows change every step, so plans are keyed at n rounded up
// to a multiple of 256 (above 1,024: to 1/32 of the power of two below), the exact n set per call
static int round_rows(int n) {
    if (n <= 1024) return (n + 255) / 256 * 256;
    int p = 1;
    while (p < n) p <<= 1;
    const int step = p / 64;
    return (n + step - 1) / step * step;
}

// One cuBLASLt product: D[n, m] (row-major rows n of m: our C) = alpha · qa·qbᵀ + beta · Cin, both
// operands [·, kq] (kq their row stride too). dyn_k: kq is a group's rows (the weight gradients),
// keyed rounded like n. Returns 0 when cuBLASLt has no algorithm for it (nothing issued).
int fp8_lt_matmul(Backend* be, int m, int n, int kq, int blk, const uint8_t* qb, const float* sb, const uint8_t* qa,
                  const float* sa, float alpha, float beta, const void* Cin, void* D, int ldc, int d_f32, int dyn_k) {
    CudaImpl* c = CI(be);
    Fp8Key k;
    memset(&k, 0, sizeof k);
    k.m = m, k.n = round_rows(n), k.k = dyn_k ? round_rows(kq) : kq, k.ldc = ldc, k.blk = blk, k.d_f32 = d_f32;
    int al = ptr_align16(D), t = ptr_align16(Cin);
    k.align = t < al ? t : al;
    k.dyn = 1 | (dyn_k ? 2 : 0);
    Fp8Plan* p = plan_get(c, &k);
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!p->ok) {
            if (attempt == 0) {
                k.n = n, k.k = kq, k.dyn = 0;
                p = plan_get(c, &k);
                continue;
            }
            return 0;
        }
        if (p->cur_n != n) {
            const uint64_t nn = (uint64_t)n;
            CUBLAS_CK(cublasLtMatrixLayoutSetAttribute(p->lb, CUBLASLT_MATRIX_LAYOUT_COLS, &nn, sizeof nn));
            CUBLAS_CK(cublasLtMatrixLayoutSetAttribute(p->lc, CUBLASLT_MATRIX_LAYOUT_COLS, &nn, sizeof nn));
            p->cur_n = n;
        }
        if (p->cur_k != kq) {  // rows and leading dimension of both operands
            const uint64_t kk = (uint64_t)kq;
            const int64_t ld = kq;
            CUBLAS_CK(cublasLtMatrixLayoutSetAttribute(p->la, CUBLASLT_MATRIX_LAYOUT_ROWS, &kk, sizeof kk));
            CUBLAS_CK(cublasLtMatrixLayoutSetAttribute(p->la, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld));
            CUBLAS_CK(cublasLtMatrixLayoutSetAttribute(p->lb, CUBLASLT_MATRIX_LAYOUT_ROWS, &kk, sizeof kk));
            CUBLAS_CK(cublasLtMatrixLayoutSetAttribute(p->lb, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld));
            p->cur_k = kq;
        }
        CUBLAS_CK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sb, sizeof sb));
        CUBLAS_CK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sa, sizeof sa));
        const cublasStatus_t s = cublasLtMatmul(c->lt, p->op, &alpha, qb, p->la, qa, p->lb, &beta, Cin, p->lc, D, p->lc,
                                                &p->algo, c->lt_ws, c->lt_ws_bytes, c->stream);
        if (s == CUBLAS_STATUS_SUCCESS) {
            LAUNCH_CK(c);
            c->fp8_lt_calls++;
            return 1;
        }
        if (s != CUBLAS_STATUS_NOT_SUPPORTED)
            FATAL("cuBLASLt FP8 matmul failed (m=%d n=%d k=%d): %s", m, n, kq, cublasLt_status_name(s));
        if (attempt == 0 && k.dyn) {  // the rounded plan's algorithm refused the exact size
            k.n = n, k.k = kq, k.dyn = 0;
            p = plan_get(c, &k);
        } else {
            return 0;
        }
    }
    return 0;
}

// ---- a product's tail --------------------------------------------------------------------------
// The last M % 8 rows of a product whose first split = M − M % 8 rows cuBLASLt took (split ≥ 8):
// cuBLASLt again on the last 8 rows, whose codes lie in place (qa's rows M − 8 .. M − 1) and whose
// scales are gathered into [Kt, 8] (b->s8), into fp32 rows in ws (b->r8); then the epilogue writes
// C = alpha · r + beta · addend for the tail's rows alone (the rows before them are C's already,
// perhaps summed into an addend that is C). The fallback kernel would take those few rows instead,
// but it reads all of B's codes at a few rows' parallelism: 0.13–0.92 ms a product at Mixtral's
// shapes on an H100, against one cuBLASLt call's time for 8 rows. Returns 0 (the gather issued, no
// product) when cuBLASLt has no algorithm for 8 rows.
int fp8_lt_tail(Backend* be, int M, int N, int ldq, const Fp8Bufs* b, SMap sam, int blk, float alpha, float beta,
                const void* addend, void* C, int ldc, int c_f32, int split, int dyn_k) {
    const int t = M - split, r0 = M - 8;
    const size_t ec = c_f32 ? 4 : 2;
    fp8_gather_scales(be, sam, r0, b->s8);
    if (!fp8_lt_matmul(be, N, 8, ldq, blk, b->qb, b->sb, b->qa + (size_t)r0 * ldq, b->s8, 1.f, 0.f, b->r8, b->r8, N, 1,
                       dyn_k))
        return 0;
    fp8_epilogue(be, b->r8 + (size_t)(8 - t) * N, t, N, alpha, beta, (const char*)addend + (size_t)split * ldc * ec,
                 (char*)C + (size_t)split * ldc * ec, (size_t)ldc, c_f32);
    return 1;
}

// ---- the FP8 paths' settings and counters (tests/gpu, dev/gpu_bench) ----------------------------
// Which path the FP8 GEMMs take: 0 = cuBLASLt where it can (the default), 2 = the fallback kernel
// only. Counters: products issued through each (cuBLASLt calls; fallback launches).
extern "C" void cuda_fp8_set_path(Backend* be, int path) { CI(be)->fp8_path = path; }
// The rows one FP8 product step takes (default FP8_ROW_CHUNK; a multiple of 128): tests set a small
// one to cover the chunked paths. fp8_ws_bytes follows it: set it before sizing ws.
extern "C" void cuda_fp8_set_row_chunk(Backend* be, int rows) {
    CHECK(rows > 0 && rows % TILE == 0, "fp8 row chunk %d is not a positive multiple of 128", rows);
    CI(be)->fp8_row_chunk = rows;
}
// The bytes of fp32 product rows the epilogue path stages at a time (default FP8_EPI_BYTES): tests
// set a small one to cover several passes. fp8_ws_bytes follows it.
extern "C" void cuda_fp8_set_epi_bytes(Backend* be, size_t bytes) {
    CHECK(bytes > 0, "fp8 epilogue rows of 0 bytes");
    CI(be)->fp8_epi_bytes = bytes;
}
// The bytes of fp32 sums a chunked bf16 weight gradient keeps (default FP8_WGRAD_ACC_BYTES): tests
// set a small one to cover several blocks of dB. fp8_ws_bytes follows it.
extern "C" void cuda_fp8_set_wgrad_acc(Backend* be, size_t bytes) {
    CHECK(bytes > 0, "fp8 weight-gradient accumulator of 0 bytes");
    CI(be)->fp8_wgrad_acc = bytes;
}
extern "C" void cuda_fp8_counts(Backend* be, size_t* lt, size_t* fb) {
    *lt = CI(be)->fp8_lt_calls;
    *fb = CI(be)->fp8_fb_calls;
}
// Weight-gradient groups taken in row chunks so far (the rest were one product each).
extern "C" size_t cuda_fp8_wgrad_splits(Backend* be) { return CI(be)->fp8_wgrad_split; }
// Groups gemm_grouped_ffn took on its own path so far (the rest: the two ops' steps).
extern "C" size_t cuda_fp8_ffn_groups(Backend* be) { return CI(be)->fp8_ffn_groups; }
// Groups gemm_grouped_swiglu_bwd took on its own path so far (the rest: the three ops).
extern "C" size_t cuda_fp8_w13_groups(Backend* be) { return CI(be)->fp8_w13_groups; }
