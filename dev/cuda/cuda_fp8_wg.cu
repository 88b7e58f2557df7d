// cuda_fp8_wg.cu — the FP8 weight gradient's product as a Hopper kernel of our own (sm_90a): C[M, N]
// = A·Bᵀ + beta·C with A = qa [M, ldk] and B = qb [N, ldk], both e4m3 codes K-major in 1×128 tiles
// along K (the group's tokens: both operands cast-transposed, VEC128 × VEC128 in cuBLASLt's terms),
// scales sa [Kt, M] and sb [Kt, N] (scale (r, t) at t·R + r: cuda_fp8.cu's single-chunk scale map),
// C fp32 or bf16. cuBLASLt runs this form at about the bf16 rate where its forms with a 128×128-block
// operand run 1.2–1.5× faster (docs/fp8.md, "Measured speed"): this kernel was to close that gap.
// Not part of moetrain (built by `make dev`, tested and timed against cuBLASLt by
// dev/test_fp8_wg.c): correct, but on an H200 it ran Mixtral's weight gradients at 661 / 667
// TFLOP/s against cuBLASLt's 849 / 779 (w13 / w2, 8,192 rows), and the training step took 3.1%
// longer with it (docs/fp8.md, "Tried and lost"). Not profiled yet; likely limits are L2 traffic
// (128 × 256 tiles without clusters or multicast) and each warpgroup waiting for its products
// before promoting them.
//
// Numerics (fp8.h's fp8_gemm_tn): for each K tile t the tensor cores form the partial P_t of the
// 128 codes' products (four wgmma k32 steps, started from zero), then acc = fma(P_t, w_t, acc) with
// w_t = fl(sa·sb) in fp32, t in increasing order: the spec's order with the product and the sum
// rounded once (dev/test_fp8_wg.c checks it within tests/gpu/test_cuda_fp8.c's bound, written for
// cuBLASLt's promotion every four k-steps, the same as here).
//
// Tiles of 128 rows × 256 columns, persistent: one CTA per SM walks tiles t = blockIdx.x,
// + gridDim.x, ...; column tiles in bands of WF_BAND, row tile by row tile within a band, so that the
// CTAs working at one time share a few A and B panels in L2.
// Three warpgroups:
//   consumers (warpgroups 0, 1; 232 registers a thread) warpgroup w owns rows 64w..64w+63 of the tile:
//             per K tile, for each 128-column half, four wgmma m64n128k32 into the partial (64
//             floats), waited for, then promoted into the half's 64 sums (128 floats for both
//             halves). While one warpgroup promotes, the other's products keep the tensor cores
//             busy. After the last K tile the sums go to C from registers, and the next tile starts.
//   producer  (warpgroup 2, one thread; 40 registers) streams each K tile's A tile (128 × 128 codes,
//             16 KB), B tile (256 × 128, 32 KB) by TMA (128-byte swizzle: wgmma.cuh's SW128 layout,
//             one 128-byte row a tile row) and the tile's scales (512 + 1,024 bytes, bulk copies)
//             into WF_ST stages, each with a "full" mbarrier (bytes landed) and an "empty" one (8
//             consumer warps).
// Shared memory: 4 stages × (48 KB + 1.5 KB) + barriers: 199 KB, one CTA per SM.
#include "cuda_fp8.cuh"
#include "tma.cuh"

enum { WF_BM = 128, WF_BN = 256, WF_BK = 128, WF_ST = 4, WF_THREADS = 384, WF_BAND = 8 };
#define WF_A_BYTES (WF_BM * WF_BK)                // codes: one byte an element
#define WF_B_BYTES (WF_BN * WF_BK)
#define WF_AB (WF_A_BYTES + WF_B_BYTES)           // 48 KB: every stage's tiles stay 1024-aligned
#define WF_S_BYTES (4 * (WF_BM + WF_BN))          // a stage's scales: sa's 128, then sb's 256
#define WF_SMEM (1024u + WF_ST * (WF_AB + WF_S_BYTES) + 8u * 2 * WF_ST)

struct WFArgs {
    int M, N, Kt;       // C [M, N]; K tiles
    int mt, nt;         // row tiles, column tiles
    int ldc, c_f32;     // C's row stride (elements), fp32 (else bf16)
    float beta;         // C = r + beta·C (C read only when beta ≠ 0)
    const float *sa, *sb;
};

// Tile t's first row and column.
__device__ __forceinline__ void wf_tile(const WFArgs& p, int t, int& row0, int& col0) {
    const int band = t / (p.mt * WF_BAND), j = t - band * p.mt * WF_BAND;
    const int w = min((int)WF_BAND, p.nt - band * WF_BAND);
    row0 = (j / w) * WF_BM;
    col0 = (band * WF_BAND + j % w) * WF_BN;
}

// d[0..64) = (scale_d ? d : 0) + A·B for one k32 step: A 64 rows and B 128 rows by descriptor (K-major).
__device__ __forceinline__ void wgmma_e4m3_n128(float* d, uint64_t da, uint64_t db, int scale_d) {
#if WG_DEVICE
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " WG_D64 ", %64, %65, p, 1, 1;\n}\n"
        : WG_R8(0), WG_R8(8), WG_R8(16), WG_R8(24), WG_R8(32), WG_R8(40), WG_R8(48), WG_R8(56)
        : "l"(da), "l"(db), "r"(scale_d));
#else
    (void)d, (void)da, (void)db, (void)scale_d;
    __trap();
#endif
}

__device__ __forceinline__ float lds_f32(uint32_t a) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(a));
    return v;
}
__device__ __forceinline__ float2 lds_f32x2(uint32_t a) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(a));
    return v;
}

// Two adjacent outputs (row r, columns c, c + 1) of C: r0/r1 the sums, beta·C added, rounded once.
__device__ __forceinline__ void wf_store2(const WFArgs& p, void* C, int r, int c, float v0, float v1) {
    const size_t i = (size_t)r * p.ldc + c;
    if (p.c_f32) {
        float2* o = (float2*)((float*)C + i);
        if (p.beta != 0.f) {
            const float2 a = *o;
            v0 = __fmaf_rn(p.beta, a.x, v0), v1 = __fmaf_rn(p.beta, a.y, v1);
        }
        *o = make_float2(v0, v1);
    } else {
        __nv_bfloat162* o = (__nv_bfloat162*)((bf16*)C + i);
        if (p.beta != 0.f) {
            const float2 a = __bfloat1622float2(*o);
            v0 = __fmaf_rn(p.beta, a.x, v0), v1 = __fmaf_rn(p.beta, a.y, v1);
        }
        *o = __floats2bfloat162_rn(v0, v1);
    }
}

__global__ void __launch_bounds__(WF_THREADS, 1)
    k_fp8_wgrad_wg(void* C, const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb,
                   const __grid_constant__ WFArgs p) {
    extern __shared__ unsigned char smem_raw[];
    const uint32_t base = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
    const uint32_t scl = base + WF_ST * WF_AB;          // the stages' scales
    const uint32_t full = scl + WF_ST * WF_S_BYTES, empty = full + 8 * WF_ST;
    const int tid = threadIdx.x, lane = tid & 31;
    const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
    const int tiles = p.mt * p.nt;
    if (tid == 0) {
        for (int s = 0; s < WF_ST; s++) mbar_init(full + 8 * s, 1), mbar_init(empty + 8 * s, 8);
        mbar_init_fence();
    }
    __syncthreads();

    if (warp >= 8) {  // ---- producer
        reg_dealloc<40>();
        if (warp != 8 || lane != 0) return;
        uint32_t it = 0;  // K tiles loaded so far (over all tiles): stage it % WF_ST, use it / WF_ST
        for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
            int row0, col0;
            wf_tile(p, t, row0, col0);
            for (int kb = 0; kb < p.Kt; kb++, it++) {
                const uint32_t s = it % WF_ST, st = base + s * WF_AB, ss = scl + s * WF_S_BYTES;
                if (it >= WF_ST) mbar_wait(empty + 8 * s, ((it / WF_ST) - 1) & 1);
                mbar_expect_tx(full + 8 * s, WF_AB + WF_S_BYTES);
                tma_load3(st, &ma, kb * WF_BK, row0, 0, full + 8 * s);
                tma_load3(st + WF_A_BYTES, &mb, kb * WF_BK, col0, 0, full + 8 * s);
                bulk_load(ss, p.sa + (size_t)kb * p.M + row0, 4 * WF_BM, full + 8 * s);
                bulk_load(ss + 4 * WF_BM, p.sb + (size_t)kb * p.N + col0, 4 * WF_BN, full + 8 * s);
            }
        }
        return;
    }
    // ---- consumers
    reg_alloc<232>();
    const int wg = warp >> 2, gq = lane >> 2, c4 = lane & 3;
    const int rl = 64 * wg + 16 * (warp & 3) + gq;  // this thread's tile rows: rl, rl + 8
    float acc[128];  // acc[64h + 4j + 0..1]: row rl, columns 128h + 8j + 2c4 (+1); + 2..3: row rl + 8
    float part[64];
    uint32_t it = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
#pragma unroll
        for (int i = 0; i < 128; i++) acc[i] = 0.f;
        for (int kb = 0; kb < p.Kt; kb++, it++) {
            const uint32_t s = it % WF_ST, As = base + s * WF_AB, Bs = As + WF_A_BYTES, ss = scl + s * WF_S_BYTES;
            mbar_wait(full + 8 * s, (it / WF_ST) & 1);
            const float sa0 = lds_f32(ss + 4 * rl), sa1 = lds_f32(ss + 4 * (rl + 8));
#pragma unroll
            for (int h = 0; h < 2; h++) {
                wg_arrive();
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
                    wgmma_e4m3_n128(part, wg_desc_k(As, WF_BM, 64 * wg, kk), wg_desc_k(Bs, WF_BN, 128 * h, kk), kk);
                wg_commit();
                wg_wait<0>();
                wg_reg_fence<64>(part);
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    const float2 sb = lds_f32x2(ss + 4 * WF_BM + 4 * (128 * h + 8 * j + 2 * c4));
                    float* a = acc + 64 * h + 4 * j;
                    a[0] = __fmaf_rn(part[4 * j + 0], __fmul_rn(sa0, sb.x), a[0]);
                    a[1] = __fmaf_rn(part[4 * j + 1], __fmul_rn(sa0, sb.y), a[1]);
                    a[2] = __fmaf_rn(part[4 * j + 2], __fmul_rn(sa1, sb.x), a[2]);
                    a[3] = __fmaf_rn(part[4 * j + 3], __fmul_rn(sa1, sb.y), a[3]);
                }
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(empty + 8 * s);  // this warp's reads of the stage are done
        }
        int row0, col0;
        wf_tile(p, t, row0, col0);
        const int r = row0 + rl;
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const int c = col0 + 128 * h + 8 * j + 2 * c4;
                const float* a = acc + 64 * h + 4 * j;
                wf_store2(p, C, r, c, a[0], a[1]);
                wf_store2(p, C, r + 8, c, a[2], a[3]);
            }
    }
}

// `rows` rows of codes [rows, ldk] as a 3-d TMA map (one matrix) of boxes of 128 codes × box_rows
// rows, 128-byte swizzle; codes past ldk read as zeros. 0 when the driver refuses the map.
static int wf_map(CUtensorMap* m, const uint8_t* q, int rows, int ldk, int box_rows) {
    PFN_cuTensorMapEncodeTiled_v12000 fn = tma_encode_fn();
    if (!fn) return 0;
    const cuuint64_t dim[3] = {(cuuint64_t)ldk, (cuuint64_t)rows, 1};
    const cuuint64_t stride[2] = {(cuuint64_t)ldk, (cuuint64_t)rows * ldk};
    const cuuint32_t box[3] = {WF_BK, (cuuint32_t)box_rows, 1}, estride[3] = {1, 1, 1};
    return fn(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, (void*)q, dim, stride, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) ==
           CUDA_SUCCESS;
}

extern "C" int cuda_fp8_wg_stalled(void) { return tma_stalled_take(); }

// An sm_90a build on a compute-capability-9.0 GPU.
extern "C" int cuda_fp8_wg_available(Backend* be) {
#if defined(MOETRAIN_SM90A)
    return CI(be)->cc_major == 9;
#else
    (void)be;
    return 0;
#endif
}

// The product above (1 when launched; 0, launching nothing, for a shape it does not take: M % 128,
// N % 256, ldk % 16, ldk ≥ K > 0, operands on 16 bytes, C on its element pair).
extern "C" int cuda_fp8_wg_wgrad(Backend* be, int M, int N, int K, int ldk, const uint8_t* qa, const float* sa,
                                 const uint8_t* qb, const float* sb, float beta, void* C, int ldc, int c_f32) {
    CudaImpl* c = CI(be);
    if (!cuda_fp8_wg_available(be) || M <= 0 || N <= 0 || K <= 0 || M % WF_BM || N % WF_BN || ldk % 16 || ldk < K ||
        ldc < N || ldc % 2 || (uintptr_t)qa % 16 || (uintptr_t)qb % 16 || (uintptr_t)sa % 16 || (uintptr_t)sb % 16 ||
        (uintptr_t)C % (c_f32 ? 8 : 4))
        return 0;
    CUtensorMap ma, mb;
    if (!wf_map(&ma, qa, M, ldk, WF_BM) || !wf_map(&mb, qb, N, ldk, WF_BN)) return 0;
    WFArgs p;
    memset(&p, 0, sizeof p);
    p.M = M, p.N = N, p.Kt = cdiv(K, WF_BK), p.mt = M / WF_BM, p.nt = N / WF_BN;
    p.ldc = ldc, p.c_f32 = c_f32, p.beta = beta, p.sa = sa, p.sb = sb;
    static int attr_set;
    if (!attr_set) {
        CUDA_CK(cudaFuncSetAttribute(k_fp8_wgrad_wg, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)WF_SMEM));
        attr_set = 1;
    }
    const int tiles = p.mt * p.nt, grid = tiles < c->sms ? tiles : c->sms;
    k_fp8_wgrad_wg<<<grid, WF_THREADS, WF_SMEM, c->stream>>>(C, ma, mb, p);
    LAUNCH_CK(c);
    return 1;
}

// The same product on cuBLASLt's block-scaled FP8 (VEC128 × VEC128), as moetrain's weight gradients
// run it (cuda_fp8.cu): the comparison. 1 when issued.
extern "C" int cuda_fp8_wg_lt(Backend* be, int M, int N, int K, int ldk, const uint8_t* qa, const float* sa,
                              const uint8_t* qb, const float* sb, float beta, void* C, int ldc, int c_f32) {
    (void)K;
    return fp8_lt_matmul(be, N, M, ldk, 0, qb, sb, qa, sa, 1.f, beta, C, C, ldc, c_f32, 1);
}
