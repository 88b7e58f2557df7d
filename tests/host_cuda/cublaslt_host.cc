// cublaslt_host.cc — cuBLASLt's block-scaled FP8 matmul on the CPU, for the host stand-in (cublasLt.h
// says what it covers). It computes what the GPU's does in the spec's order (src/fp8.h,
// fp8_gemm_tn): per 128-K tile the exact partial P_t rounded once to fp32, fl(fl(sa·sb)·P_t) added
// in increasing t — so a correct cuda_fp8.cu gives the spec's result bit for bit here; the GPU's
// tensor cores keep fewer bits inside a tile, which tests/gpu/test_cuda_fp8.c bounds instead. The
// layout and shape rules are the documented ones (cuda_fp8.cu's header comment gives the sources);
// breaking one aborts, naming it.
#include <stdio.h>
#include <stdlib.h>

#include "cublasLt.h"
#include "cuda_bf16.h"  // (util.h: f32_to_bf16, bf16_to_f32)

size_t host_lt_matmuls, host_lt_refused;
int host_lt_refuse;

struct HostLtDesc {
    int compute, scale_type;
    int32_t transa, transb, amode, bmode;
    const float *ascale, *bscale;
};
struct HostLtLayout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};
struct HostLtPref {
    uint64_t ws;
};

[[noreturn]] static void broken(const char* rule) {
    fprintf(stderr, "cuBLASLt (host stand-in): the call breaks a documented rule: %s\n", rule);
    abort();
}
#define RULE(cond, what) \
    do {                 \
        if (!(cond)) broken(what); \
    } while (0)

template <typename T> static void set(T* dst, const void* buf, size_t size) {
    RULE(size == sizeof(T), "an attribute's size is its type's");
    memcpy(dst, buf, size);
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
    *d = new HostLtDesc{(int)compute, (int)scale, CUBLAS_OP_N, CUBLAS_OP_N, -1, -1, nullptr, nullptr};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void* buf,
                                              size_t size) {
    switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA: set(&d->transa, buf, size); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: set(&d->transb, buf, size); break;
    case CUBLASLT_MATMUL_DESC_A_SCALE_MODE: set(&d->amode, buf, size); break;
    case CUBLASLT_MATMUL_DESC_B_SCALE_MODE: set(&d->bmode, buf, size); break;
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: set(&d->ascale, buf, size); break;
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: set(&d->bscale, buf, size); break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType_t type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    *l = new HostLtLayout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a,
                                                const void* buf, size_t size) {
    switch (a) {
    case CUBLASLT_MATRIX_LAYOUT_ROWS: set(&l->rows, buf, size); break;
    case CUBLASLT_MATRIX_LAYOUT_COLS: set(&l->cols, buf, size); break;
    case CUBLASLT_MATRIX_LAYOUT_LD: set(&l->ld, buf, size); break;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
    *p = new HostLtPref{0};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a, const void* buf,
                                                    size_t size) {
    if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) set(&p->ws, buf, size);
    else if (size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

// The rules of a block-scaled FP8 matmul D[m, n] = op(A)[m, k] · B[k, n] (column-major) that
// cuda_fp8.cu relies on; each broken one aborts.
static void check_shape(const HostLtDesc* d, const HostLtLayout* a, const HostLtLayout* b, const HostLtLayout* c,
                        const HostLtLayout* dl) {
    RULE(d->compute == CUBLAS_COMPUTE_32F && d->scale_type == CUDA_R_32F,
         "FP8 computes in CUBLAS_COMPUTE_32F, fp32 scale type");
    RULE(d->transa == CUBLAS_OP_T && d->transb == CUBLAS_OP_N,
         "FP8 on Hopper is TN only: A with CUBLAS_OP_T, B with CUBLAS_OP_N");
    RULE(a->type == CUDA_R_8F_E4M3 && b->type == CUDA_R_8F_E4M3, "A and B are e4m3");
    RULE(c->type == dl->type && (dl->type == CUDA_R_32F || dl->type == CUDA_R_16BF), "C and D alike, 32F or 16BF");
    const int32_t VEC = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, BLK = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    RULE((d->amode == VEC || d->amode == BLK) && (d->bmode == VEC || d->bmode == BLK),
         "A and B scale modes set to VEC128_32F or BLK128x128_32F");
    RULE(!(d->amode == BLK && d->bmode == BLK), "BLK128x128 x BLK128x128 is not a supported pair");
    RULE(a->rows == b->rows, "A and B have the same k (their rows)");
    RULE(c->rows == a->cols && c->cols == b->cols && dl->rows == c->rows && dl->cols == c->cols,
         "C and D are [m, n]");
    RULE(a->ld >= (int64_t)a->rows && b->ld >= (int64_t)b->rows && c->ld >= (int64_t)c->rows && dl->ld == c->ld,
         "leading dimensions cover the rows (D's is C's)");
    RULE(a->ld % 16 == 0 && b->ld % 16 == 0, "A's and B's leading dimensions are multiples of 16 bytes");
    RULE(a->cols % 8 == 0, "m is a multiple of 8");
    RULE(d->bmode != VEC || b->cols % 8 == 0, "n is a multiple of 8 when B is VEC128");
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t dl, cublasLtMatmulPreference_t, int requested,
                                              cublasLtMatmulHeuristicResult_t* res, int* count) {
    RULE(requested >= 1, "at least one algorithm requested");
    RULE(d->ascale && d->bscale, "the scale pointers are set before the heuristic");
    check_shape(d, a, b, c, dl);
    *count = 0;
    if (host_lt_refuse) {
        host_lt_refused++;
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    memset(&res[0], 0, sizeof res[0]);
    res[0].algo.data[0] = 0x1A;
    *count = 1;
    return CUBLAS_STATUS_SUCCESS;
}

static float dec(uint8_t q) { return fp8_e4m3_to_f32(q); }

// The scale of (row r, K tile t) of an operand of R rows (outer) and Kt tiles: VEC128 [Kt, R]
// with R contiguous; BLK128x128 [⌈R/128⌉, pad4(Kt)] with the tiles contiguous.
static float scale_at(const float* s, int mode, uint64_t r, uint64_t t, uint64_t R, uint64_t Kt) {
    if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) return s[t * R + r];
    return s[(r / 128) * ((Kt + 3) / 4 * 4) + t];
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t d, const void* alpha_, const void* A_,
                              cublasLtMatrixLayout_t la, const void* B_, cublasLtMatrixLayout_t lb, const void* beta_,
                              const void* C, cublasLtMatrixLayout_t lc, void* D, cublasLtMatrixLayout_t ldl,
                              const cublasLtMatmulAlgo_t* algo, void*, size_t, cudaStream_t) {
    check_shape(d, la, lb, lc, ldl);
    RULE(algo && algo->data[0] == 0x1A, "the algorithm is one the heuristic returned");
    RULE((uintptr_t)A_ % 16 == 0 && (uintptr_t)B_ % 16 == 0, "A and B start on 16 bytes");
    RULE(d->ascale && d->bscale && (uintptr_t)d->ascale % 16 == 0 && (uintptr_t)d->bscale % 16 == 0,
         "the scales start on 16 bytes");
    const float alpha = *(const float*)alpha_, beta = *(const float*)beta_;
    const uint8_t *A = (const uint8_t*)A_, *B = (const uint8_t*)B_;
    const uint64_t m = la->cols, n = lb->cols, k = la->rows, Kt = (k + 127) / 128;
    const int f32 = ldl->type == CUDA_R_32F;
    for (uint64_t j = 0; j < n; j++)
        for (uint64_t i = 0; i < m; i++) {
            float acc = 0.f;
            for (uint64_t t = 0; t < Kt; t++) {
                double p = 0;  // exact: 128 products of e4m3 values
                for (uint64_t kk = t * 128; kk < k && kk < t * 128 + 128; kk++)
                    p += (double)dec(A[i * la->ld + kk]) * (double)dec(B[j * lb->ld + kk]);
                const float w = scale_at(d->ascale, d->amode, i, t, m, Kt) * scale_at(d->bscale, d->bmode, j, t, n, Kt);
                acc = acc + w * (float)p;
            }
            const size_t at = j * (size_t)lc->ld + i;
            float v = alpha == 1.f ? acc : alpha * acc;
            if (f32) {
                if (beta != 0.f) v = v + beta * ((const float*)C)[at];
                ((float*)D)[at] = v;
            } else {
                // a bf16 D is rounded before beta·C is added (and again after)
                uint16_t h = f32_to_bf16(v);
                if (beta != 0.f) h = f32_to_bf16(bf16_to_f32(h) + beta * bf16_to_f32(((const uint16_t*)C)[at]));
                ((uint16_t*)D)[at] = h;
            }
        }
    host_lt_matmuls++;
    return CUBLAS_STATUS_SUCCESS;
}
