// cuda_gemm_wg.cu — the grouped expert GEMM as one Hopper kernel of our own (sm_90a), beside
// cuda_gemm.cu's one cuBLASLt call per expert: C_g = A_g · op(B_g) for every group g in one
// launch, A packed [R, K] (group g's rows off[g]..off[g+1]), C packed [R, N], bf16 in and out,
// fp32 sums. B_g = B + g·b_stride is the expert weight in either layout:
//   K-major  [N, K], C = A·B_gᵀ: the forward's x·w13ᵀ and h·w2ᵀ (TB = 0);
//   MN-major [K, N], C = A·B_g:  the backward's data gradients dy·w2 and d(gate|up)·w13 (TB = 1).
// It is also the base of the fused SwiGLU epilogue. Not part of moetrain (built by `make dev`,
// tested by dev/test_gemm_wg.c): measured on the H200 within ~2% of cuBLASLt's cycles per tile at
// one clock, but 7-20% slower at the power limit — it moves half as much data again through L2 as
// cuBLASLt's 192 × 192 CTA-pair kernel — so the SwiGLU epilogue only broke even in the step and
// the data gradients lost ~5 ms. Two-CTA cluster versions with B multicast (commit deaa840) were
// correct and no faster: they read 2.5x as much from DRAM. It stays as the starting point of a
// grouped FP8 kernel.
//
// Tiles of 128 rows × 256 columns, persistent: one CTA per SM walks tiles t = blockIdx.x,
// + gridDim.x, ... over every group (so no expert leaves a partial last wave of its own). Within a
// group, tiles go in bands of GG_BAND column tiles, row tile by row tile, so that the CTAs working
// at one time share a few A row panels and B column panels in L2.
// Three warpgroups (168 registers a thread for all: the consumers need no more, so no setmaxnreg):
//   consumers  (warps 0-7) warpgroup wg owns rows 64wg..64wg+63 of the tile and all 256 columns:
//              per stage four wgmma m64n256k16 (both operands in shared memory; B K-major, or
//              MN-major with the instruction's transpose-B flag), committed as one group; once
//              the next stage's group is issued the previous one is waited for and its stage
//              released. After the last K slice the accumulators go to the staging tile in shared
//              memory as bf16 (128 × 256, 64 KB), and the consumers start the next tile's
//              products at once.
//   producer   (warp 8, one thread) streams 64-wide K slices of the A tile (128 × 64) and the B
//              tile (256 × 64) by TMA (128-byte swizzle: wgmma.cuh's SW128 tiles) into GG_ST
//              stages, each with a "full" mbarrier (bytes landed) and an "empty" one (8 consumer
//              warps). A K-major B tile is one box of 256 rows × 64 K; an MN-major one is four
//              boxes of 64 K rows × 64 columns, the four 8 KB slabs of an SW128 tile of 64 rows.
//              With the SwiGLU epilogue the B tile is two boxes: gate rows f0.. and up
//              rows F + f0.. of the expert's w13, so that a thread's accumulators hold gate and up
//              of the same (row, f).
//   epilogue   (warps 9-11) store the staged tile in 16-byte chunks (rows past the group's end
//              are not stored) — with SwiGLU gate and up to gu and silu(gate)·up·scale to h —
//              while the consumers compute the next tile; "staged" / "drained" mbarriers hand the
//              staging tile back and forth.
// So the tensor cores wait only for the staging writes between tiles, not for the global stores
// or the SwiGLU. Shared memory: 3 stages × 48 KB + the 64 KB staging tile + barriers: 209 KB, one
// CTA per SM.
#include <string.h>

#include "tma.cuh"

enum { GG_BM = 128, GG_BN = 256, GG_BK = 64, GG_ST = 3, GG_THREADS = 384, GG_MAXG = 64, GG_BAND = 8 };
enum { GG_EPI_WARPS = 3, GG_EPI_U = 4 };   // warps 9..11; items a thread loads at once (SwiGLU)
#define GG_A_BYTES (GG_BM * GG_BK * 2u)
#define GG_B_BYTES (GG_BN * GG_BK * 2u)
#define GG_STAGE (GG_A_BYTES + GG_B_BYTES)
#define GG_EPI (GG_BM * GG_BN * 2u)        // the staging tile, bf16, rows of 512 bytes
#define GG_SMEM (GG_ST * GG_STAGE + GG_EPI + 1024u + 8u * (2 * GG_ST + 2))

struct GGTiles {
    int nt, kb, tiles;          // column tiles, K slices (K / 64), tiles over all groups
    int cw;                     // a column tile's width in C: 256, or 128 (of F) with the SwiGLU epilogue
    int ldc;                    // C's row stride (elements)
    int F, ldh;                 // SwiGLU: gate rows [0, F) and up rows [F, 2F) of B_g; h's row stride
    const float* scale;         // SwiGLU: the routing scale per row of A, or NULL
    int row_off[GG_MAXG + 1];   // group g: rows [row_off[g], row_off[g + 1]) of A and C
    int tile_off[GG_MAXG + 1];  // group g: tiles [tile_off[g], tile_off[g + 1])
};

// Tile t: its group, first row, the group's row end, first column.
__device__ __forceinline__ void gg_tile(const GGTiles& p, int t, int& g, int& row0, int& row_end, int& col0) {
    g = 0;
    while (t >= p.tile_off[g + 1]) g++;
    const int i = t - p.tile_off[g];
    const int mt = (p.row_off[g + 1] - p.row_off[g] + GG_BM - 1) / GG_BM;
    const int band = i / (mt * GG_BAND), j = i - band * mt * GG_BAND;
    const int w = min((int)GG_BAND, p.nt - band * GG_BAND);
    row0 = p.row_off[g] + (j / w) * GG_BM;
    col0 = (band * GG_BAND + j % w) * p.cw;
    row_end = p.row_off[g + 1];
}

// The staging tile: row r (0..127) is 512 bytes, its 16-byte chunk j (columns 8j..8j+7) at
// position j ^ (r % 8). A warp's accumulator writes (8 rows × 4 words) and the epilogue's chunk
// reads (one row) are then free of bank conflicts.
__device__ __forceinline__ uint32_t gg_stage_off(int r, int j) { return (uint32_t)(r * 512 + ((j ^ (r & 7)) << 4)); }

__device__ __forceinline__ uint4 lds16(uint32_t a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
    return v;
}

// silu(gate)·up·scale of 8 bf16 pairs (gate and up as stored in gu), the arithmetic of
// cuda_moe.cu's swiglu kernels, so that h has the bits swiglu_fwd would give on this gu.
__device__ __forceinline__ uint4 gg_swiglu8(uint4 g4, uint4 u4, float s, int scaled) {
    float g[8], u[8], v[8];
    unpack8(g, g4);
    unpack8(u, u4);
#pragma unroll
    for (int e = 0; e < 8; e++) {
        v[e] = silu_f(g[e]) * u[e];
        if (scaled) v[e] *= s;
    }
    return pack8(v);
}

// SW = 0: C = A·op(B_g). SW = 1 (TB = 0 only): the 256 B rows of a tile are gate rows
// [f0, f0 + 128) and up rows [F + f0, ...); C = gu [R, 2F] gets both, Hout = h [R, F] the SwiGLU.
// TB = 0: B_g is [N, K] (C = A·B_gᵀ); TB = 1: B_g is [K, N] (C = A·B_g).
template <int SW, int TB>
__global__ void __launch_bounds__(GG_THREADS, 1)
    k_gemm_grouped_wg(bf16* C, bf16* Hout, const __grid_constant__ CUtensorMap ma,
                      const __grid_constant__ CUtensorMap mb, const __grid_constant__ GGTiles p) {
    extern __shared__ unsigned char smem_raw[];
    const uint32_t base = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
    const uint32_t epi = base + GG_ST * GG_STAGE;  // the staging tile
    // mbarriers, 8 bytes each: full[GG_ST], empty[GG_ST], staged, drained
    const uint32_t full = epi + GG_EPI, empty = full + 8 * GG_ST, staged = empty + 8 * GG_ST, drained = staged + 8;
    const int tid = threadIdx.x, lane = tid & 31;
    const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
    if (tid == 0) {
        for (int s = 0; s < GG_ST; s++) mbar_init(full + 8 * s, 1), mbar_init(empty + 8 * s, 8);
        // the staging tile is written and read with plain shared stores and loads: every thread
        // arrives on staged and drained itself (racecheck follows that, not lane 0 after
        // __syncwarp: dev/racecheck_probe.cu)
        mbar_init(staged, 256);
        mbar_init(drained, GG_EPI_WARPS * 32);
        mbar_init_fence();
    }
    __syncthreads();

    if (warp >= 8) {
        if (warp == 8) {  // ---- producer
            if (lane != 0) return;
            uint32_t it = 0;  // K slices loaded so far (over all tiles): stage it % GG_ST, use it / GG_ST
            for (int t = blockIdx.x; t < p.tiles; t += gridDim.x) {
                int g, row0, row_end, col0;
                gg_tile(p, t, g, row0, row_end, col0);
                for (int kb = 0; kb < p.kb; kb++, it++) {
                    const uint32_t s = it % GG_ST, st = base + s * GG_STAGE;
                    if (it >= GG_ST) mbar_wait(empty + 8 * s, ((it / GG_ST) - 1) & 1);
                    mbar_expect_tx(full + 8 * s, GG_STAGE);
                    tma_load3(st, &ma, kb * GG_BK, row0, 0, full + 8 * s);
                    if (TB) {  // four slabs of 64 K rows × 64 columns
#pragma unroll
                        for (int j = 0; j < GG_BN / 64; j++)
                            tma_load3(st + GG_A_BYTES + j * (GG_B_BYTES / 4), &mb, col0 + 64 * j, kb * GG_BK, g,
                                      full + 8 * s);
                    } else if (SW) {
                        tma_load3(st + GG_A_BYTES, &mb, kb * GG_BK, col0, g, full + 8 * s);
                        tma_load3(st + GG_A_BYTES + GG_B_BYTES / 2, &mb, kb * GG_BK, p.F + col0, g, full + 8 * s);
                    } else {
                        tma_load3(st + GG_A_BYTES, &mb, kb * GG_BK, col0, g, full + 8 * s);
                    }
                }
            }
            return;
        }
        // ---- epilogue warps: e = 0..95 over the staged tile's 16-byte chunks
        const int e = tid - 9 * 32;
        uint32_t n = 0;  // tiles drained so far
        for (int t = blockIdx.x; t < p.tiles; t += gridDim.x, n++) {
            int g, row0, row_end, col0;
            gg_tile(p, t, g, row0, row_end, col0);
            const int rows = min(GG_BM, row_end - row0);
            mbar_wait(staged, n & 1);
            if (SW) {  // 16 gate chunks and 16 up chunks a row: (gate, up, h) per item; GG_EPI_U items a
                       // round, every load first, so that the scale's global latency is paid once a round
                const int nq = rows * 16;
                for (int q0 = e; q0 < nq; q0 += GG_EPI_U * GG_EPI_WARPS * 32) {
                    uint4 g4[GG_EPI_U], u4[GG_EPI_U];
                    float sc[GG_EPI_U];
#pragma unroll
                    for (int u = 0; u < GG_EPI_U; u++) {
                        const int q = min(q0 + u * GG_EPI_WARPS * 32, nq - 1), r = q >> 4, j = q & 15;
                        g4[u] = lds16(epi + gg_stage_off(r, j));
                        u4[u] = lds16(epi + gg_stage_off(r, j + 16));
                        sc[u] = p.scale ? __ldg(p.scale + row0 + r) : 1.f;
                    }
#pragma unroll
                    for (int u = 0; u < GG_EPI_U; u++) {
                        const int q = q0 + u * GG_EPI_WARPS * 32, r = q >> 4, j = q & 15;
                        if (q >= nq) break;
                        bf16* gu = C + (size_t)(row0 + r) * p.ldc + col0 + 8 * j;
                        *(uint4*)gu = g4[u];
                        *(uint4*)(gu + p.F) = u4[u];
                        *(uint4*)(Hout + (size_t)(row0 + r) * p.ldh + col0 + 8 * j) =
                            gg_swiglu8(g4[u], u4[u], sc[u], p.scale != NULL);
                    }
                }
            } else {
                for (int q = e; q < rows * 32; q += GG_EPI_WARPS * 32) {
                    const int r = q >> 5, j = q & 31;
                    *(uint4*)(C + (size_t)(row0 + r) * p.ldc + col0 + 8 * j) = lds16(epi + gg_stage_off(r, j));
                }
            }
            mbar_arrive(drained);
        }
        return;
    }
    // ---- consumers
    const int wg = warp >> 2, gq = lane >> 2, c4 = lane & 3;
    const int rl = 64 * wg + 16 * (warp & 3) + gq;  // this thread's tile rows: rl, rl + 8
    float d[128];
    uint32_t it = 0, n = 0;
    for (int t = blockIdx.x; t < p.tiles; t += gridDim.x, n++) {
        for (int kb = 0; kb < p.kb; kb++, it++) {
            const uint32_t s = it % GG_ST, As = base + s * GG_STAGE, Bs = As + GG_A_BYTES;
            mbar_wait(full + 8 * s, (it / GG_ST) & 1);
            wg_arrive();
#pragma unroll
            for (int kk = 0; kk < GG_BK / 16; kk++)
                wg_ss<256, 0, TB>(d, wg_desc_k(As, GG_BM, 64 * wg, kk),
                                  TB ? wg_desc_mn(Bs, GG_BK, kk) : wg_desc_k(Bs, GG_BN, 0, kk), kb | kk);
            wg_commit();
            wg_wait<1>();  // the previous slice's products are done: its stage is free
            wg_reg_fence<128>(d);
            if (kb > 0) {
                __syncwarp();
                if (lane == 0) mbar_arrive(empty + 8 * ((it - 1) % GG_ST));
            }
        }
        wg_wait<0>();
        wg_reg_fence<128>(d);
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + 8 * ((it - 1) % GG_ST));
        // d[4j + 0..1]: row rl, columns 8j + 2c4 (+1); d[4j + 2..3]: row rl + 8 (wgmma.cuh)
        if (n > 0) mbar_wait(drained, (n - 1) & 1);  // the epilogue warps are done with the last tile
#pragma unroll
        for (int j = 0; j < 32; j++) {
            asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(epi + gg_stage_off(rl, j) + 4 * c4),
                         "r"(pack_bf16(d[4 * j], d[4 * j + 1])));
            asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(epi + gg_stage_off(rl + 8, j) + 4 * c4),
                         "r"(pack_bf16(d[4 * j + 2], d[4 * j + 3])));
        }
        mbar_arrive(staged);
    }
}

// `mats` row-major [rows, cols] bf16 matrices (row stride ld elements, matrix i at
// p + i·mat_stride elements) as a 3-d TMA map of boxes of 64 columns × box_rows rows of one
// matrix, 128-byte swizzle (one SW128 slab). cols, ld and mat_stride: multiples of 8. Rows past
// `rows` read as zeros. 0 when the driver has no encoder or refuses the map.
static int tma_map_rows(CUtensorMap* m, const bf16* p, int rows, int cols, size_t ld, int mats, size_t mat_stride,
                        int box_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 fn = tma_encode_fn();
    if (!fn) return 0;
    const cuuint64_t dim[3] = {(cuuint64_t)cols, (cuuint64_t)rows, (cuuint64_t)mats};
    const cuuint64_t stride[2] = {(cuuint64_t)ld * 2, (cuuint64_t)(mats > 1 ? mat_stride : (size_t)rows * ld) * 2};
    const cuuint32_t box[3] = {64, (cuuint32_t)box_rows, 1}, estride[3] = {1, 1, 1};
    return fn(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void*)p, dim, stride, box, estride,
              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

extern "C" int cuda_gemm_wg_stalled(void) { return tma_stalled_take(); }
// An sm_90a build on a compute-capability-9.0 GPU, bf16.
static int gg_ok(Backend* be) {
#if defined(MOETRAIN_SM90A)
    return CI(be)->cc_major == 9 && is_bf16(be);
#else
    (void)be;
    return 0;
#endif
}
extern "C" int cuda_gemm_wg_available(Backend* be) { return gg_ok(be); }

// One launch over every group when the kernel takes the shape (returns 1), else 0 (nothing
// launched). tb: B_g is [K, N] (C = A·B_g), else [N, K] (C = A·B_gᵀ). sw (tb = 0 only): the
// SwiGLU epilogue (N = 2F, Hout [R, F] with row stride ldh, scale or NULL).
static int gg_run(Backend* be, int sw, int tb, const GroupDesc* g, int N, int K, const void* A, int lda,
                  const void* B, int ldb, void* C, int ldc, void* Hout, int ldh, const float* scale) {
    CudaImpl* c = CI(be);
    const int G = g->groups, cw = sw ? 128 : GG_BN;
    if (!gg_ok(be) || (sw && tb) || K <= 0 || K % GG_BK || N <= 0 || N % (sw ? 2 * cw : cw) || G < 1 ||
        G > GG_MAXG || lda % 8 || ldb % 8 || ldc % 8 || g->b_stride % 8 || (uintptr_t)A % 16 || (uintptr_t)B % 16 ||
        (uintptr_t)C % 16 || (sw && (ldh % 8 || (uintptr_t)Hout % 16)))
        return 0;
    GGTiles p;
    memset(&p, 0, sizeof p);
    p.cw = cw;
    p.nt = (sw ? N / 2 : N) / cw;
    p.kb = K / GG_BK;
    p.ldc = ldc;
    p.F = sw ? N / 2 : 0;
    p.ldh = ldh;
    p.scale = scale;
    for (int i = 0; i < G; i++) {
        const int rows = g->host_off[i + 1] - g->host_off[i];
        CHECK(rows >= 0, "gemm_grouped: offsets decrease at group %d (%d > %d)", i, g->host_off[i], g->host_off[i + 1]);
        p.row_off[i] = g->host_off[i];
        p.tile_off[i + 1] = p.tile_off[i] + (rows + GG_BM - 1) / GG_BM * p.nt;
    }
    p.row_off[G] = g->host_off[G];
    for (int i = G + 1; i <= GG_MAXG; i++) p.row_off[i] = p.row_off[G], p.tile_off[i] = p.tile_off[G];
    p.tiles = p.tile_off[G];
    if (p.tiles == 0) return 1;
    CUtensorMap ma, mb;
    if (!tma_map_rows(&ma, (const bf16*)A, p.row_off[G], K, (size_t)lda, 1, 0, GG_BM) ||
        !(tb ? tma_map_rows(&mb, (const bf16*)B, K, N, (size_t)ldb, G, g->b_stride, GG_BK)
             : tma_map_rows(&mb, (const bf16*)B, N, K, (size_t)ldb, G, g->b_stride, sw ? GG_BN / 2 : GG_BN)))
        return 0;
    typedef void (*Kernel)(bf16*, bf16*, CUtensorMap, CUtensorMap, GGTiles);
    static const Kernel ks[3] = {k_gemm_grouped_wg<0, 0>, k_gemm_grouped_wg<1, 0>, k_gemm_grouped_wg<0, 1>};
    static int attr_set[3];
    const int v = tb ? 2 : sw;
    if (!attr_set[v]) {
        CUDA_CK(cudaFuncSetAttribute(ks[v], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)GG_SMEM));
        attr_set[v] = 1;
    }
    const int grid = p.tiles < c->sms ? p.tiles : c->sms;
    ks[v]<<<grid, GG_THREADS, GG_SMEM, c->stream>>>((bf16*)C, (bf16*)Hout, ma, mb, p);
    LAUNCH_CK(c);
    return 1;
}

// gemm_grouped's contract for C = A·op(B_g) (either trans_b, bf16 C, alpha 1, beta 0); 1 when launched.
extern "C" int cuda_gemm_grouped_wg(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* A, const void* B,
                                    void* C) {
    if (d->trans_a || d->c_f32 || d->c_in || d->alpha != 1.f || d->beta != 0.f) return 0;
    const int tb = !d->trans_b;
    return gg_run(be, 0, tb, g, d->N, d->K, A, d->lda ? d->lda : d->K, B, d->ldb ? d->ldb : (tb ? d->N : d->K), C,
                  d->ldc ? d->ldc : d->N, NULL, 0, NULL);
}

// gemm_grouped_swiglu's (backend.h) with the SwiGLU in the epilogue; 1 when launched.
extern "C" int cuda_gemm_grouped_swiglu_wg(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* A,
                                           const void* B, void* gu, void* h, const float* scale) {
    if (!d->trans_b || d->trans_a || d->c_f32 || d->c_in || d->alpha != 1.f || d->beta != 0.f || d->ldc) return 0;
    return gg_run(be, 1, 0, g, d->N, d->K, A, d->lda ? d->lda : d->K, B, d->ldb ? d->ldb : d->K, gu, d->N, h,
                  d->N / 2, scale);
}
