// cuda_attn_fwd_ws.cu — causal GQA attention forward on Hopper, warp-specialised (sm_90a, D = 128):
// the contract of cuda_attn.cu's forward (out[b,t,h,:], lse[b,h,t], bf16). The default forward at
// Mixtral's head dim on Hopper; without TMA (no tensor-map encoder in the driver) the mma.sync
// kernel of cuda_attn.cu runs instead.
//
// A CTA owns 128 query rows of one (b, h): three warpgroups, two consumers (warps 0-3: rows 0-63,
// warps 4-7: rows 64-127) and a producer (one thread of warp 8 works; the group gives its
// registers to the consumers: setmaxnreg 24 and 240).
//   producer  one thread loads Q once, then K and V in 128-key tiles with the Tensor Memory
//             Accelerator (cp.async.bulk.tensor, 128-byte swizzle: the SW128 tiles of wgmma.cuh)
//             into two stages each, signalling "full" mbarriers by the bytes landed and waiting
//             on "empty" mbarriers before refilling a stage.
//   consumers per key tile j, in turns (two named barriers, FlashAttention-3's ping-pong):
//               issue S_j = Q·K_jᵀ (8 wgmma m64n128k16, SS) and O += P_{j-1}·V_{j-1} (8 m64n128k16,
//               RS: P from registers, V MN-major), then hand the turn to the other warpgroup;
//               while one warpgroup runs its softmax, the tensor cores work on the other's products.
//             Within a warpgroup, FlashAttention-3's intra-warpgroup overlap as well: S_j and
//             P_{j-1}·V_{j-1} are two commit groups, the softmax waits only for S_j and turns it
//             into P_j in place (fp32) while the tensor cores still read P_{j-1} from registers;
//             then it waits for P·V, releases K_j and V_{j-1}, rescales O and packs P_j to bf16
//             over P_{j-1}.
//             After the last tile, its P·V; then the row sums and the stores (as cuda_attn_fwd_wg).
// Packed documents (doc, backend.h attn_fwd): a query tile starts at the key tile holding its first
// row's document start (every other row's starts there or later), and the softmax also masks keys
// before each row's document start; a row may see nothing of its tile's first key tiles (its
// running max stays −inf and its exponentials are taken against 0 meanwhile). doc = NULL: the
// tiles and masks of plain causal attention.
// Shared memory: Q 32 KB, K and V 2 × 32 KB each, 9 mbarriers: 161 KB, one CTA per SM.
// A wait that never completes (a bug) gives up after ~2^26 polls and flags it (mbar_wait).
#include "attn_wg.cuh"
#include "tma.cuh"

enum { WS_M = 128, WS_N = 128, WS_D = 128, WS_THREADS = 384 };
#define WS_TILE (128u * 128u * 2u)  // bytes of one [128][128] bf16 tile (two 16 KB slabs)

// Online softmax of one 128-key tile in registers (log2 domain) for this thread's rows row0 and
// row0 + 8: keys above the row, ≥ T or before the row's document start (ds[r]; 0 without
// documents) are masked where the tile reaches past wrow0 (the warp's first row) or before dlast
// (the document start of the warp's last row); the running max mr and row sums lr are updated,
// corr is O's correction, and sacc becomes P (fp32, in place: no register of an unfinished P·V is
// written). DOCS = false (no documents) compiles to plain causal attention's code.
template <bool DOCS>
__device__ __forceinline__ void ws_softmax(float (&sacc)[64], float (&mr)[2], float (&lr)[2], float (&corr)[2], int k0,
                                           int wrow0, int row0, int c4, int T, float sl2, const int (&ds)[2],
                                           int dlast) {
    const bool need_mask = k0 + WS_N - 1 > wrow0 || k0 + WS_N > T || (DOCS && k0 < dlast);
    float mx[2] = {-INFINITY, -INFINITY}, mu[2];
#pragma unroll
    for (int i = 0; i < 64; i++) {
        float x = sacc[i];
        if (need_mask) {
            const int key = k0 + (i >> 2) * 8 + 2 * c4 + (i & 1), row = row0 + ((i >> 1) & 1) * 8;
            if (key > row || key >= T || (DOCS && key < ds[(i >> 1) & 1])) x = -INFINITY;
        }
        mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], x);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float m2 = fmaxf(mr[r], mx[r] * sl2);  // −inf only while the row's document is not reached
        mu[r] = DOCS && m2 == -INFINITY ? 0.f : m2;
        corr[r] = fast_exp2(mr[r] - mu[r]);
        mr[r] = m2;
        lr[r] *= corr[r];
    }
#pragma unroll
    for (int i = 0; i < 64; i++) {
        const int r = (i >> 1) & 1;
        float x = sacc[i];
        if (need_mask) {
            const int key = k0 + (i >> 2) * 8 + 2 * c4 + (i & 1), row = row0 + r * 8;
            if (key > row || key >= T || (DOCS && key < ds[r])) x = -INFINITY;
        }
        sacc[i] = fast_exp2(fmaf(x, sl2, -mu[r]));
        lr[r] += sacc[i];
    }
}

// P (ws_softmax's sacc) as bf16 A fragments: p[kk] = keys 16kk..16kk+15.
__device__ __forceinline__ void ws_pack_p(uint32_t (&p)[8][4], const float (&sacc)[64]) {
#pragma unroll
    for (int i = 0; i < 64; i += 2) p[i >> 3][(i >> 1) & 3] = pack_bf16(sacc[i], sacc[i + 1]);
}

template <bool DOCS>
__global__ void __launch_bounds__(WS_THREADS, 1)
    k_attn_fwd_ws(bf16* out, float* lse, const __grid_constant__ CUtensorMap mq, const __grid_constant__ CUtensorMap mk,
                  const __grid_constant__ CUtensorMap mv, int T, int Hq, int Hkv, float sl2, const int32_t* doc) {
    extern __shared__ unsigned char smem_raw[];
    const uint32_t base = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
    const uint32_t Qs = base, Kb = base + WS_TILE, Vb = base + 3 * WS_TILE, bars = base + 5 * WS_TILE;
    // mbarriers: full Q; full K[2], full V[2] (producer + bytes); empty K[2], empty V[2] (8 warps)
    const uint32_t fullQ = bars, fullK = bars + 8, fullV = bars + 24, emptyK = bars + 40, emptyV = bars + 56;
    const int tid = threadIdx.x, lane = tid & 31;
    const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);  // warp-uniform, visibly to the compiler
    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, kh = h / (Hq / Hkv);
    const int q0 = qt * WS_M;
    const int32_t* docb = DOCS ? doc + (size_t)b * T : nullptr;
    const int j0 = DOCS ? docb[q0] / WS_N : 0;                  // the first key tile the rows see
    const int n = (min(q0 + WS_M, T) + WS_N - 1) / WS_N - j0;  // key tiles j0..j0+n-1 (the last one diagonal)

    if (tid == 0) {
        mbar_init(fullQ, 1);
        for (int s = 0; s < 2; s++) {
            mbar_init(fullK + 8 * s, 1), mbar_init(fullV + 8 * s, 1);
            mbar_init(emptyK + 8 * s, 8), mbar_init(emptyV + 8 * s, 8);
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (warp >= 8) {  // ---- producer warpgroup: its registers go to the consumers
        reg_dealloc<24>();
        if (warp == 8 && lane == 0) {
            mbar_expect_tx(fullQ, WS_TILE);
            tma_load4(Qs, &mq, 0, h, q0, b, fullQ);
            tma_load4(Qs + WS_TILE / 2, &mq, 64, h, q0, b, fullQ);
            for (int j = 0; j < n; j++) {
                const int s = j & 1;
                const uint32_t par = ((j >> 1) + 1) & 1;  // the phase of use (j / 2 − 1)
                if (j >= 2) mbar_wait(emptyK + 8 * s, par);
                mbar_expect_tx(fullK + 8 * s, WS_TILE);
                tma_load4(Kb + s * WS_TILE, &mk, 0, kh, (j0 + j) * WS_N, b, fullK + 8 * s);
                tma_load4(Kb + s * WS_TILE + WS_TILE / 2, &mk, 64, kh, (j0 + j) * WS_N, b, fullK + 8 * s);
                if (j >= 2) mbar_wait(emptyV + 8 * s, par);
                mbar_expect_tx(fullV + 8 * s, WS_TILE);
                tma_load4(Vb + s * WS_TILE, &mv, 0, kh, (j0 + j) * WS_N, b, fullV + 8 * s);
                tma_load4(Vb + s * WS_TILE + WS_TILE / 2, &mv, 64, kh, (j0 + j) * WS_N, b, fullV + 8 * s);
            }
        }
    } else {
        // ---- consumers: warpgroup wg owns rows 64wg..64wg+63 of the tile, warp w (of 4) 16 of them
        reg_alloc<240>();
        const int wg = warp >> 2, w = warp & 3, g = lane >> 2, c4 = lane & 3;
        const int r0w = wg * 64;
        const int row0 = q0 + r0w + w * 16 + g;  // this thread's rows: row0, row0 + 8
        // document starts of the thread's rows and of the warp's last row (0 without documents)
        const int ds[2] = {DOCS ? (int)docb[min(row0, T - 1)] : 0, DOCS ? (int)docb[min(row0 + 8, T - 1)] : 0};
        const int dlast = DOCS ? (int)docb[min(q0 + r0w + w * 16 + 15, T - 1)] : 0;
        float o[64];
#pragma unroll
        for (int i = 0; i < 64; i++) o[i] = 0.f;
        wg_reg_fence<64>(o);
        float mr[2] = {-INFINITY, -INFINITY}, lr[2] = {0.f, 0.f};  // running max (log2 units), row sum
        uint32_t a[8][4];  // P of the last tile as A fragments: a[kk] = keys 16kk..16kk+15 (tile 0 sets it)
        mbar_wait(fullQ, 0);
        if (wg == 1) nbar_arrive<256>(1);  // warpgroup 0 takes the first turn

        // key tile 0: S_0 alone (no P·V before it)
        {
            mbar_wait(fullK, 0);
            nbar_sync<256>(1 + wg);  // my turn
            float sacc[64];
            wg_arrive();
#pragma unroll
            for (int kk = 0; kk < 8; kk++)
                wg_ss<128>(sacc, wg_desc_k(Qs + r0w * 128, WS_M, 0, kk), wg_desc_k(Kb, WS_N, 0, kk), kk > 0);
            wg_commit();
            nbar_arrive<256>(2 - wg);  // the other warpgroup's turn
            wg_reg_fence<64>(sacc);
            wg_wait<0>();
            wg_reg_fence<64>(sacc);
            __syncwarp();
            if (lane == 0) mbar_arrive(emptyK);
            float corr[2];  // O is still zero: nothing to rescale
            ws_softmax<DOCS>(sacc, mr, lr, corr, j0 * WS_N, q0 + r0w + w * 16, row0, c4, T, sl2, ds, dlast);
            ws_pack_p(a, sacc);
        }
        for (int j = 1; j < n; j++) {
            const int s = j & 1, sp = s ^ 1;
            mbar_wait(fullK + 8 * s, (j >> 1) & 1);
            mbar_wait(fullV + 8 * sp, ((j - 1) >> 1) & 1);
            nbar_sync<256>(1 + wg);  // my turn
            float sacc[64];
            wg_reg_fence<64>(o);
            wg_reg_fence_u<32>(&a[0][0]);
            // descriptors from opaque bases, so that ptxas rebuilds them per tile (two adds each) instead
            // of keeping 24 of them live in 48 registers next to S, O and P
            uint32_t qa = Qs + r0w * 128, ka = Kb + s * WS_TILE, va = Vb + sp * WS_TILE;
            asm volatile("" : "+r"(qa), "+r"(ka), "+r"(va));
            wg_arrive();
#pragma unroll
            for (int kk = 0; kk < 8; kk++)
                wg_ss<128>(sacc, wg_desc_k(qa, WS_M, 0, kk), wg_desc_k(ka, WS_N, 0, kk), kk > 0);
            wg_commit();  // S_j a group of its own: the softmax waits only for it
            wg_arrive();
#pragma unroll
            for (int kk = 0; kk < 8; kk++) wg_rs<128, 1>(o, a[kk], wg_desc_mn(va, WS_N, kk), kk > 0 || j > 1);
            wg_commit();
            nbar_arrive<256>(2 - wg);  // the other warpgroup's turn
            wg_reg_fence<64>(sacc);
            wg_wait<1>();  // S_j done; P_{j-1}·V_{j-1} may still run
            wg_reg_fence<64>(sacc);
            __syncwarp();
            if (lane == 0) mbar_arrive(emptyK + 8 * s);  // this warp is done reading K_j
            // P_j in sacc: the tensor cores may still be reading P_{j-1} from a and adding into O
            float corr[2];
            ws_softmax<DOCS>(sacc, mr, lr, corr, (j0 + j) * WS_N, q0 + r0w + w * 16, row0, c4, T, sl2, ds, dlast);
            {  // P_{j-1}·V_{j-1} done: V_{j-1} is free, O and a may change
                wg_wait<0>();
                wg_reg_fence<64>(o);
                wg_reg_fence_u<32>(&a[0][0]);
                __syncwarp();
                if (lane == 0) mbar_arrive(emptyV + 8 * sp);
            }
#pragma unroll
            for (int i = 0; i < 64; i++) o[i] *= corr[(i >> 1) & 1];
            ws_pack_p(a, sacc);
        }

        // the last tile's P·V (outside the turns)
        {
            const int sp = (n - 1) & 1;
            mbar_wait(fullV + 8 * sp, ((n - 1) >> 1) & 1);
            wg_reg_fence<64>(o);
            wg_reg_fence_u<32>(&a[0][0]);
            wg_arrive();
#pragma unroll
            for (int kk = 0; kk < 8; kk++)
                wg_rs<128, 1>(o, a[kk], wg_desc_mn(Vb + sp * WS_TILE, WS_N, kk), kk > 0 || n > 1);
            wg_commit();
            wg_wait<0>();
            wg_reg_fence<64>(o);
        }
        if (wg == 0) nbar_sync<256>(1);  // the other warpgroup's last hand-over (n + 1 arrivals on barrier 1)

#pragma unroll
        for (int r = 0; r < 2; r++) {
            lr[r] += __shfl_xor_sync(0xffffffffu, lr[r], 1);
            lr[r] += __shfl_xor_sync(0xffffffffu, lr[r], 2);
        }
        const size_t qs = (size_t)Hq * WS_D;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = row0 + r * 8;
            if (row >= T) continue;
            const float inv = 1.f / lr[r];
            wg_store_row<WS_D>(out + ((size_t)b * T + row) * qs + (size_t)h * WS_D, o, r, c4, inv);
            if (c4 == 0) lse[((size_t)b * Hq + h) * T + row] = (mr[r] + log2f(lr[r])) * LN2;
        }
    }
}

// ---- host ---------------------------------------------------------------------------------------

// 1 when a wait of the kernel gave up since the last call (then clears the flag); synchronizes.
extern "C" int cuda_attn_fwd_ws_stalled(void) {
    return tma_stalled_take();
}

// Runs the warp-specialised forward (the caller checked wgmma, bf16 and 16-byte alignment; D = 128
// here; doc: packed documents or NULL); returns 0 when the driver cannot make the tensor maps.
int attn_fwd_ws(CudaImpl* c, bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int B, int T,
                int Hq, int Hkv, int D, const int32_t* doc) {
    if (D != WS_D) return 0;
    CUtensorMap mq, mk, mv;
    if (!tma_map_bthd(&mq, q, B, T, Hq, WS_M) || !tma_map_bthd(&mk, k, B, T, Hkv, WS_N) ||
        !tma_map_bthd(&mv, v, B, T, Hkv, WS_N))
        return 0;
    const size_t smem = 5 * (size_t)WS_TILE + 128 + 1024;  // tiles, mbarriers, room to align to 1024
    static bool attr = false;
    if (!attr) {
        CUDA_CK(cudaFuncSetAttribute(k_attn_fwd_ws<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CUDA_CK(cudaFuncSetAttribute(k_attn_fwd_ws<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr = true;
    }
    const dim3 grid((T + WS_M - 1) / WS_M, Hq, B);
    const float sl2 = LOG2E / sqrtf((float)D);
    if (doc) k_attn_fwd_ws<true><<<grid, WS_THREADS, smem, c->stream>>>(out, lse, mq, mk, mv, T, Hq, Hkv, sl2, doc);
    else k_attn_fwd_ws<false><<<grid, WS_THREADS, smem, c->stream>>>(out, lse, mq, mk, mv, T, Hq, Hkv, sl2, doc);
    LAUNCH_CK(c);
    return 1;
}
