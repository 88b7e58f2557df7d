// cpu_gemm.c — the CPU GEMMs: C = alpha · op(A) · op(B) + beta · C in fp32 (GemmDesc in
// backend.h), the grouped expert GEMM and the grouped weight gradient. With fp8 set they hand over
// to cpu_gemm_fp8.c.
//
// Blocked the BLIS way: for each NC-wide column block and KC-deep slice of K, B is packed once
// into NR-wide panels (shared by the threads); each thread packs MC×KC blocks of A into MR-row
// panels and runs an MR×NR register micro-kernel over them. Each element of C is owned by one
// thread and its K sum runs in a fixed order (slices ascending, k ascending within a slice), so
// the result does not depend on the thread count. No FMA contraction (-std=c11 turns it off),
// so vector widths do not change the result either.
#include <omp.h>
#include <string.h>

#include "cpu.h"

enum { MR = CPU_MR, NR = CPU_NR, MC = CPU_MC, KC = CPU_KC, NC = CPU_NC };
enum { JP = 4 };  // NR panels per work item (fewer when that leaves threads idle)

static inline int imin(int a, int b) { return a < b ? a : b; }

// Packs op(A)[i0 : i0+mc, p0 : p0+kc] as panels of MR rows: ap[panel][p][r], rows past mc = 0.
static void pack_a(const float* A, int lda, int trans_a, int i0, int mc, int p0, int kc, float* ap) {
    for (int ir = 0; ir < mc; ir += MR) {
        float* dst = ap + (size_t)ir * kc;
        const int mr = imin(MR, mc - ir);
        if (!trans_a) {  // A [M, K]: op(A)(i, p) = A[i·lda + p]
            for (int r = 0; r < MR; r++) {
                if (r < mr) {
                    const float* src = A + (size_t)(i0 + ir + r) * lda + p0;
                    for (int p = 0; p < kc; p++) dst[p * MR + r] = src[p];
                } else {
                    for (int p = 0; p < kc; p++) dst[p * MR + r] = 0;
                }
            }
        } else {  // A [K, M]: op(A)(i, p) = A[p·lda + i]
            for (int p = 0; p < kc; p++) {
                const float* src = A + (size_t)(p0 + p) * lda + i0 + ir;
                for (int r = 0; r < MR; r++) dst[p * MR + r] = r < mr ? src[r] : 0.0f;
            }
        }
    }
}

// Packs panel jp of op(B)[p0 : p0+kc, j0 : j0+nc]: bp[p][j] for NR columns, columns past nc = 0.
static void pack_b_panel(const float* B, int ldb, int trans_b, int p0, int kc, int j0, int nc, int jp, float* bp) {
    const int jr = jp * NR, nr = imin(NR, nc - jr);
    if (!trans_b) {  // B [K, N]: op(B)(p, j) = B[p·ldb + j]
        for (int p = 0; p < kc; p++) {
            const float* src = B + (size_t)(p0 + p) * ldb + j0 + jr;
            for (int j = 0; j < NR; j++) bp[p * NR + j] = j < nr ? src[j] : 0.0f;
        }
    } else {  // B [N, K]: op(B)(p, j) = B[j·ldb + p]
        for (int j = 0; j < NR; j++) {
            if (j < nr) {
                const float* src = B + (size_t)(j0 + jr + j) * ldb + p0;
                for (int p = 0; p < kc; p++) bp[p * NR + j] = src[p];
            } else {
                for (int p = 0; p < kc; p++) bp[p * NR + j] = 0;
            }
        }
    }
}

// acc[MR][NR] = Σ_p ap[p][·] ⊗ bp[p][·]
static void micro_kernel(int kc, const float* restrict ap, const float* restrict bp, float* restrict acc) {
    float c0[NR] = {0}, c1[NR] = {0}, c2[NR] = {0}, c3[NR] = {0};
    for (int p = 0; p < kc; p++) {
        const float* b = bp + (size_t)p * NR;
        const float a0 = ap[p * MR], a1 = ap[p * MR + 1], a2 = ap[p * MR + 2], a3 = ap[p * MR + 3];
#pragma omp simd
        for (int j = 0; j < NR; j++) {
            c0[j] += a0 * b[j];
            c1[j] += a1 * b[j];
            c2[j] += a2 * b[j];
            c3[j] += a3 * b[j];
        }
    }
    memcpy(acc, c0, sizeof c0);
    memcpy(acc + NR, c1, sizeof c1);
    memcpy(acc + 2 * NR, c2, sizeof c2);
    memcpy(acc + 3 * NR, c3, sizeof c3);
}
_Static_assert(MR == 4, "micro_kernel is written for MR = 4");

// C tile (mr × nr valid) from acc: the first K slice applies beta (beta = 0 ignores old C,
// even NaN), later slices add.
static void store_tile(const float* acc, float* C, int ldc, int mr, int nr, float alpha, float beta, int first) {
    for (int r = 0; r < mr; r++) {
        float* c = C + (size_t)r * ldc;
        const float* a = acc + r * NR;
        if (!first) {
            for (int j = 0; j < nr; j++) c[j] += alpha * a[j];
        } else if (beta == 0) {
            for (int j = 0; j < nr; j++) c[j] = alpha * a[j];
        } else {
            for (int j = 0; j < nr; j++) c[j] = alpha * a[j] + beta * c[j];
        }
    }
}

// C = beta · C (beta = 0 writes zeros): the K = 0 / alpha = 0 case, where A and B are not read.
static void scale_c(float* C, int ldc, int M, int N, float beta) {
    for (int i = 0; i < M; i++) {
        float* c = C + (size_t)i * ldc;
        if (beta == 0) memset(c, 0, sizeof(float) * (size_t)N);
        else if (beta != 1) for (int j = 0; j < N; j++) c[j] *= beta;
    }
}

static void gemm_f32(CpuImpl* impl, const GemmDesc* d, const float* A, const float* B, float* C) {
    const int M = d->M, N = d->N, K = d->K;
    int lda, ldb, ldc;
    gemm_desc_check(d, &lda, &ldb, &ldc);
    const float alpha = d->alpha, beta = d->beta;
    if (M == 0 || N == 0) return;
    if (d->c_in && d->c_in != (const void*)C && beta != 0)  // the addend from c_in: copy it in first
        for (int r = 0; r < M; r++) memcpy(C + (size_t)r * ldc, (const float*)d->c_in + (size_t)r * ldc, sizeof(float) * N);
    if (K == 0 || alpha == 0) {
        scale_c(C, ldc, M, N, beta);
        return;
    }
    const int par = (double)M * N * K >= 65536.0;  // smaller GEMMs are not worth a parallel region
    float* bpack = impl->bpack;
    const int mblocks = (M + MC - 1) / MC;
    for (int j0 = 0; j0 < N; j0 += NC) {
        const int nc = imin(NC, N - j0), npanel = (nc + NR - 1) / NR;
        // work items are MC × (jp·NR) tiles of C; jp = 1 when JP would leave threads idle
        const int jp_w = mblocks * ((npanel + JP - 1) / JP) >= 2 * omp_get_max_threads() ? JP : 1;
        const int nchunk = (npanel + jp_w - 1) / jp_w;
        for (int p0 = 0; p0 < K; p0 += KC) {
            const int kc = imin(KC, K - p0), first = p0 == 0;
#pragma omp parallel if (par)
            {
#pragma omp for schedule(static)
                for (int jp = 0; jp < npanel; jp++)
                    pack_b_panel(B, ldb, d->trans_b, p0, kc, j0, nc, jp, bpack + (size_t)jp * kc * NR);
                // (implicit barrier: B is packed)
                float ap[MC * KC] __attribute__((aligned(64)));  // 64 KB on each thread's stack
                float acc[MR * NR] __attribute__((aligned(64)));
#pragma omp for schedule(static) collapse(2)
                for (int ib = 0; ib < mblocks; ib++)
                    for (int ch = 0; ch < nchunk; ch++) {
                        const int i0 = ib * MC, mc = imin(MC, M - i0);
                        pack_a(A, lda, d->trans_a, i0, mc, p0, kc, ap);
                        for (int jp = ch * jp_w; jp < imin(npanel, (ch + 1) * jp_w); jp++) {
                            const int nr = imin(NR, nc - jp * NR);
                            for (int ir = 0; ir < mc; ir += MR) {
                                micro_kernel(kc, ap + (size_t)ir * kc, bpack + (size_t)jp * kc * NR, acc);
                                store_tile(acc, C + (size_t)(i0 + ir) * ldc + j0 + jp * NR, ldc, imin(MR, mc - ir),
                                           nr, alpha, beta, first);
                            }
                        }
                    }
            }
        }
    }
}

void cpu_gemm(Backend* be, const GemmDesc* d, const void* A, const void* B, void* C) {
    if (d->fp8) {
        cpu_gemm_fp8(be, d, A, B, C);
        return;
    }
    gemm_f32(be->impl, d, A, B, C);
}

// Per group g: C[rows g] = alpha · A[rows g] · op(B_g) + beta · C[rows g]. lda/ldc (0 = packed)
// are the row strides of A and C, shared by all groups; empty groups are skipped.
void cpu_gemm_grouped(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* A, const void* B, void* C) {
    if (d->fp8) {
        cpu_gemm_grouped_fp8(be, d, g, A, B, C);
        return;
    }
    gemm_grouped_check("gemm_grouped", d, g);
    const int lda = d->lda ? d->lda : d->K, ldc = d->ldc ? d->ldc : d->N;
    for (int i = 0; i < g->groups; i++) {
        const int r0 = g->host_off[i], rows = g->host_off[i + 1] - r0;
        if (rows == 0) continue;
        GemmDesc x = *d;
        x.M = rows;
        x.lda = lda;
        x.ldc = ldc;
        gemm_f32(be->impl, &x, (const float*)A + (size_t)r0 * lda, (const float*)B + (size_t)i * g->b_stride,
                 (float*)C + (size_t)r0 * ldc);
    }
}

// Per group g: dB_g[N, K] += dY[rows g]ᵀ · X[rows g], dY packed [rows, N], X packed [rows, K].
// dB is fp32 whether or not g->db_act: the act dtype here is fp32.
void cpu_gemm_grouped_wgrad(Backend* be, const GroupDesc* g, int N, int K, const void* dY, const void* X, void* dB_,
                            float beta) {
    if (g->fp8) {
        cpu_gemm_grouped_wgrad_fp8(be, g, N, K, dY, X, dB_, beta);
        return;
    }
    float* dB = dB_;
    gemm_grouped_wgrad_check(g, beta);
    for (int i = 0; i < g->groups; i++) {
        const int r0 = g->host_off[i], rows = g->host_off[i + 1] - r0;
        if (rows == 0) {  // += 0, or = 0
            if (beta == 0.f) memset(dB + (size_t)i * g->b_stride, 0, sizeof(float) * (size_t)N * K);
            continue;
        }
        GemmDesc x = {.M = N, .N = K, .K = rows, .trans_a = 1, .lda = N, .ldb = K, .ldc = K,
                      .alpha = 1, .beta = beta, .c_f32 = 1};
        gemm_f32(be->impl, &x, (const float*)dY + (size_t)r0 * N, (const float*)X + (size_t)r0 * K,
                 dB + (size_t)i * g->b_stride);
    }
}
