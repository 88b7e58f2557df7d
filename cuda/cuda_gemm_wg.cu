// cuda_gemm_wg.cu — the grouped expert GEMM as one Hopper kernel of our own (sm_90a), beside
// cuda_gemm.cu's one cuBLASLt call per expert: C_g = A_g · B_gᵀ for every group g in one launch,
// A packed [R, K] (group g's rows off[g]..off[g+1]), B_g = B + g·b_stride as [N, K] (the expert
// weight, K-major: the forward's x·w13ᵀ and h·w2ᵀ), C packed [R, N], bf16 in and out, fp32 sums.
// It is the base of the fused SwiGLU epilogue (docs/performance.md, "Where the rest is"); on its
// own it does what cuBLASLt does. MOETRAIN_GEMM_GROUPED=wg selects it (cublas, the default, keeps
// cuBLASLt); shapes it does not take (below) go to cuBLASLt either way.
//
// Tiles of 128 rows × 256 columns, persistent: one CTA per SM walks tiles t = blockIdx.x,
// + gridDim.x, ... over every group (so no expert leaves a partial last wave of its own). Within a
// group, tiles go in bands of GG_BAND column tiles, row tile by row tile, so that the CTAs working
// at one time share a few A row panels and B column panels in L2.
// Three warpgroups (setmaxnreg 40 / 232, as CUTLASS's warp-specialised kernels):
//   producer   one thread streams 64-wide K slices of the A tile (128 × 64) and the B tile
//              (256 × 64) by TMA (128-byte swizzle: wgmma.cuh's SW128 tiles) into GG_ST stages,
//              each with a "full" mbarrier (bytes landed) and an "empty" one (8 consumer warps).
//   consumers  warpgroup wg owns rows 64wg..64wg+63 of the tile and all 256 columns: per stage four
//              wgmma m64n256k16 (both operands in shared memory, K-major), committed as one group;
//              once the next stage's group is issued the previous one is waited for and its stage
//              released. After the last K slice: fp32 → bf16, staged in shared memory
//              128 columns at a time and stored in 16-byte chunks (rows past the group's end are
//              not stored); the producer meanwhile fills the stages for the next tile.
// Shared memory: 4 stages × 48 KB + 2 × 16 KB of epilogue staging + barriers: 225 KB, one CTA per SM.
#include <string.h>

#include "tma.cuh"

enum { GG_BM = 128, GG_BN = 256, GG_BK = 64, GG_ST = 4, GG_THREADS = 384, GG_MAXG = 64, GG_BAND = 8 };
#define GG_A_BYTES (GG_BM * GG_BK * 2u)
#define GG_B_BYTES (GG_BN * GG_BK * 2u)
#define GG_STAGE (GG_A_BYTES + GG_B_BYTES)
#define GG_EPI (64u * 128u * 2u)  // a consumer warpgroup's epilogue staging: 64 rows × 128 columns
#define GG_SMEM (GG_ST * GG_STAGE + 2u * GG_EPI + 1024u + 16u * GG_ST)

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

// The epilogue of one consumer warpgroup, 128 columns of its 64 rows at a time: pk[2jj] holds
// the bf16 pair of row rl = 16w + gq at columns 8jj + 2c4 (+1), pk[2jj + 1] that of row rl + 8
// (the accumulator layout of wgmma.cuh). Stored into C (row stride ldc) from row r0, column c0
// (rows from row_end on are not stored) through the warpgroup's staging buffer es in shared
// memory, so that the global stores are whole 16-byte chunks, 256 bytes a row per 16 lanes. In
// the buffer, row r's chunk j sits at position j ^ (r % 8): the writes (8 rows × 4 words per
// warp) and the reads (2 rows per warp) are free of bank conflicts.
__device__ __forceinline__ void gg_store(bf16* C, int ldc, const uint32_t* pk, uint32_t es, int wg, int r0,
                                         int row_end, int c0) {
    const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3, gq = lane >> 2, c4 = lane & 3;
    const int rl = 16 * w + gq;  // and rl + 8; (rl + 8) % 8 == rl % 8 == gq
    nbar_sync<128>(1 + wg);     // the buffer's previous reads are done
#pragma unroll
    for (int jj = 0; jj < 16; jj++) {
        const uint32_t o = (uint32_t)(((jj ^ gq) << 4) + 4 * c4);
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(es + rl * 256 + o), "r"(pk[2 * jj]));
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(es + (rl + 8) * 256 + o), "r"(pk[2 * jj + 1]));
    }
    nbar_sync<128>(1 + wg);
    const int t = threadIdx.x & 127;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int q = i * 128 + t, row = q >> 4, ch = q & 15;
        uint4 v;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(es + row * 256 + ((ch ^ (row & 7)) << 4)));
        if (r0 + row < row_end) *(uint4*)(C + (size_t)(r0 + row) * ldc + c0 + 8 * ch) = v;
    }
}

// Accumulator columns 128h..128h+127 as bf16 pairs for gg_store.
__device__ __forceinline__ void gg_pack(uint32_t* pk, const float* d, int h) {
#pragma unroll
    for (int jj = 0; jj < 16; jj++) {
        const int j = 16 * h + jj;
        pk[2 * jj] = pack_bf16(d[4 * j], d[4 * j + 1]);
        pk[2 * jj + 1] = pack_bf16(d[4 * j + 2], d[4 * j + 3]);
    }
}

// SwiGLU of the tile (columns 0..127 gate, 128..255 up): h = silu(gate)·up·scale from the
// bf16-rounded gate and up, the arithmetic of cuda_moe.cu's k_swiglu_fwd (so the bits are those
// of swiglu_fwd on the stored gu). s0, s1: the scales of rows rl and rl + 8 (1 without).
__device__ __forceinline__ void gg_pack_swiglu(uint32_t* pk, const float* d, float s0, float s1, int scaled) {
#pragma unroll
    for (int jj = 0; jj < 16; jj++) {
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float g = __bfloat162float(__float2bfloat16_rn(d[4 * jj + e]));
            const float u = __bfloat162float(__float2bfloat16_rn(d[4 * (jj + 16) + e]));
            v[e] = silu_f(g) * u;
            if (scaled) v[e] *= e < 2 ? s0 : s1;
        }
        pk[2 * jj] = pack_bf16(v[0], v[1]);
        pk[2 * jj + 1] = pack_bf16(v[2], v[3]);
    }
}

// SW = 0: C = A·B_gᵀ. SW = 1: B_g's gate rows [f0, f0 + 128) and up rows [F + f0, ...) as one
// 256-row tile; C = gu [R, 2F] gets both, Hout = h [R, F] the SwiGLU.
template <int SW>
__global__ void __launch_bounds__(GG_THREADS, 1)
    k_gemm_grouped_wg(bf16* C, bf16* Hout, const __grid_constant__ CUtensorMap ma,
                      const __grid_constant__ CUtensorMap mb, const __grid_constant__ GGTiles p) {
    extern __shared__ unsigned char smem_raw[];
    const uint32_t base = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
    const uint32_t epi = base + GG_ST * GG_STAGE;  // 2 × GG_EPI
    const uint32_t full = epi + 2 * GG_EPI, empty = full + 8 * GG_ST;  // mbarriers, 8 bytes each
    const int tid = threadIdx.x, lane = tid & 31;
    const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
    if (tid == 0) {
        for (int s = 0; s < GG_ST; s++) mbar_init(full + 8 * s, 1), mbar_init(empty + 8 * s, 8);
        mbar_init_fence();
    }
    __syncthreads();

    if (warp >= 8) {  // ---- producer warpgroup
        reg_dealloc<40>();
        if (warp == 8 && lane == 0) {
            uint32_t it = 0;  // K slices loaded so far (over all tiles): stage it % GG_ST, use it / GG_ST
            for (int t = blockIdx.x; t < p.tiles; t += gridDim.x) {
                int g, row0, row_end, col0;
                gg_tile(p, t, g, row0, row_end, col0);
                for (int kb = 0; kb < p.kb; kb++, it++) {
                    const uint32_t s = it % GG_ST, st = base + s * GG_STAGE;
                    if (it >= GG_ST) mbar_wait(empty + 8 * s, ((it / GG_ST) - 1) & 1);
                    mbar_expect_tx(full + 8 * s, GG_STAGE);
                    tma_load3(st, &ma, kb * GG_BK, row0, 0, full + 8 * s);
                    if (SW) {
                        tma_load3(st + GG_A_BYTES, &mb, kb * GG_BK, col0, g, full + 8 * s);
                        tma_load3(st + GG_A_BYTES + GG_B_BYTES / 2, &mb, kb * GG_BK, p.F + col0, g, full + 8 * s);
                    } else {
                        tma_load3(st + GG_A_BYTES, &mb, kb * GG_BK, col0, g, full + 8 * s);
                    }
                }
            }
        }
        return;
    }
    // ---- consumers
    reg_alloc<232>();
    const int wg = warp >> 2;
    float d[128];
    uint32_t it = 0;
    for (int t = blockIdx.x; t < p.tiles; t += gridDim.x) {
        int g, row0, row_end, col0;
        gg_tile(p, t, g, row0, row_end, col0);
        for (int kb = 0; kb < p.kb; kb++, it++) {
            const uint32_t s = it % GG_ST, As = base + s * GG_STAGE, Bs = As + GG_A_BYTES;
            mbar_wait(full + 8 * s, (it / GG_ST) & 1);
            wg_arrive();
#pragma unroll
            for (int kk = 0; kk < GG_BK / 16; kk++)
                wg_ss<256>(d, wg_desc_k(As, GG_BM, 64 * wg, kk), wg_desc_k(Bs, GG_BN, 0, kk), kb | kk);
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
        const uint32_t es = epi + wg * GG_EPI;
        const int r0 = row0 + 64 * wg;
        uint32_t pk[32];
        gg_pack(pk, d, 0);
        gg_store(C, p.ldc, pk, es, wg, r0, row_end, col0);
        gg_pack(pk, d, 1);
        gg_store(C, p.ldc, pk, es, wg, r0, row_end, col0 + (SW ? p.F : 128));
        if (SW) {
            const int rl = r0 + 16 * (warp & 3) + (lane >> 2);
            const float s0 = p.scale && rl < row_end ? p.scale[rl] : 1.f;
            const float s1 = p.scale && rl + 8 < row_end ? p.scale[rl + 8] : 1.f;
            gg_pack_swiglu(pk, d, s0, s1, p.scale != NULL);
            gg_store(Hout, p.ldh, pk, es, wg, r0, row_end, col0);
        }
    }
}

extern "C" int cuda_gemm_wg_stalled(void) { return tma_stalled_take(); }
extern "C" int cuda_gemm_wg_available(Backend* be) { return cuda_wgmma_ok(CI(be)) && is_bf16(be); }

// One launch over every group when the kernel takes the shape (returns 1), else 0 (nothing
// launched). sw: the SwiGLU epilogue (N = 2F, Hout [R, F] with row stride ldh, scale or NULL).
static int gg_run(Backend* be, int sw, const GroupDesc* g, int N, int K, const void* A, int lda, const void* B,
                  int ldb, void* C, int ldc, void* Hout, int ldh, const float* scale) {
    CudaImpl* c = CI(be);
    const int G = g->groups, cw = sw ? 128 : GG_BN;
    if (!cuda_wgmma_ok(c) || !is_bf16(be) || K <= 0 || K % GG_BK || N <= 0 || N % (sw ? 2 * cw : cw) || G < 1 ||
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
        !tma_map_rows(&mb, (const bf16*)B, N, K, (size_t)ldb, G, g->b_stride, sw ? GG_BN / 2 : GG_BN))
        return 0;
    static int attr_set[2];
    void (*k)(bf16*, bf16*, CUtensorMap, CUtensorMap, GGTiles) = sw ? k_gemm_grouped_wg<1> : k_gemm_grouped_wg<0>;
    if (!attr_set[sw]) {
        CUDA_CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)GG_SMEM));
        attr_set[sw] = 1;
    }
    const int grid = p.tiles < c->sms ? p.tiles : c->sms;
    k<<<grid, GG_THREADS, GG_SMEM, c->stream>>>((bf16*)C, (bf16*)Hout, ma, mb, p);
    LAUNCH_CK(c);
    return 1;
}

// gemm_grouped's contract for C = A·B_gᵀ (trans_b, bf16 C, alpha 1, beta 0); 1 when launched.
extern "C" int cuda_gemm_grouped_wg(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* A, const void* B,
                                    void* C) {
    if (!d->trans_b || d->trans_a || d->c_f32 || d->c_in || d->alpha != 1.f || d->beta != 0.f) return 0;
    return gg_run(be, 0, g, d->N, d->K, A, d->lda ? d->lda : d->K, B, d->ldb ? d->ldb : d->K, C,
                  d->ldc ? d->ldc : d->N, NULL, 0, NULL);
}

// gemm_grouped_swiglu's (backend.h) with the SwiGLU in the epilogue; 1 when launched.
extern "C" int cuda_gemm_grouped_swiglu_wg(Backend* be, const GemmDesc* d, const GroupDesc* g, const void* A,
                                           const void* B, void* gu, void* h, const float* scale) {
    if (!d->trans_b || d->trans_a || d->c_f32 || d->c_in || d->alpha != 1.f || d->beta != 0.f || d->ldc) return 0;
    return gg_run(be, 1, g, d->N, d->K, A, d->lda ? d->lda : d->K, B, d->ldb ? d->ldb : d->K, gu, d->N, h, d->N / 2,
                  scale);
}
