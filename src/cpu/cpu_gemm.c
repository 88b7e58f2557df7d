// cpu_gemm.c — the CPU GEMMs: plain fp32 loops, row-parallel with OpenMP.
#include "cpu.h"

// C[M,N] = alpha · op(A) · op(B) + beta · C  (see GemmDesc in backend.h). beta = 0 ignores C.
void cpu_gemm_f32(const GemmDesc* d, const float* A, const float* B, float* C) {
    const int M = d->M, N = d->N, K = d->K;
    const int lda = d->lda ? d->lda : (d->trans_a ? M : K);
    const int ldb = d->ldb ? d->ldb : (d->trans_b ? K : N);
    const int ldc = d->ldc ? d->ldc : N;
    const float alpha = d->alpha, beta = d->beta;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++) {
        float* c = C + (size_t)i * ldc;
        if (!d->trans_b) {  // rows of B are contiguous: axpy form
            if (beta == 0) for (int j = 0; j < N; j++) c[j] = 0;
            else if (beta != 1) for (int j = 0; j < N; j++) c[j] *= beta;
            for (int k = 0; k < K; k++) {
                float a = alpha * (d->trans_a ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]);
                const float* b = B + (size_t)k * ldb;
                for (int j = 0; j < N; j++) c[j] += a * b[j];
            }
        } else {  // dot-product form: B is [N, K]
            for (int j = 0; j < N; j++) {
                const float* b = B + (size_t)j * ldb;
                float s = 0;
                if (!d->trans_a) {
                    const float* a = A + (size_t)i * lda;
                    for (int k = 0; k < K; k++) s += a[k] * b[k];
                } else {
                    for (int k = 0; k < K; k++) s += A[(size_t)k * lda + i] * b[k];
                }
                c[j] = alpha * s + (beta == 0 ? 0.0f : beta * c[j]);
            }
        }
    }
}

static void gemm(Backend* be, const GemmDesc* d, const void* A, const void* B, void* C) {
    (void)be;
    cpu_gemm_f32(d, A, B, C);
}

static void gemm_grouped(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* A, const void* B, void* C) {
    (void)be;
    CHECK(!d->trans_a, "gemm_grouped: trans_a is not supported (use gemm_grouped_wgrad)");
    const int lda = d->lda ? d->lda : d->K, ldc = d->ldc ? d->ldc : d->N;
    for (int i = 0; i < g->groups; i++) {
        int r0 = g->host_off[i], rows = g->host_off[i + 1] - r0;
        if (rows <= 0) continue;
        GemmDesc x = *d;
        x.M = rows;
        x.lda = lda;
        x.ldc = ldc;
        cpu_gemm_f32(&x, (const float*)A + (size_t)r0 * lda, (const float*)B + (size_t)i * g->b_stride,
                     (float*)C + (size_t)r0 * ldc);
    }
}

static void gemm_grouped_wgrad(Backend* be, const GroupDesc* g, int N, int K, const void* dY, const void* X, float* dB) {
    (void)be;
    for (int i = 0; i < g->groups; i++) {
        int r0 = g->host_off[i], rows = g->host_off[i + 1] - r0;
        if (rows <= 0) continue;
        GemmDesc x = {.M = N, .N = K, .K = rows, .trans_a = 1, .lda = N, .ldb = K, .alpha = 1, .beta = 1, .c_f32 = 1};
        cpu_gemm_f32(&x, (const float*)dY + (size_t)r0 * N, (const float*)X + (size_t)r0 * K, dB + (size_t)i * g->b_stride);
    }
}

void cpu_register_gemm(Backend* be) {
    be->gemm = gemm;
    be->gemm_grouped = gemm_grouped;
    be->gemm_grouped_wgrad = gemm_grouped_wgrad;
}
