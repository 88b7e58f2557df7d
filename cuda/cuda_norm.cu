// cuda_norm.cu — embedding lookup and RMSNorm (Hugging Face MixtralRMSNorm semantics:
// y = w · (x · rsqrt(mean(x²) + eps))), fp32 math on any act dtype.
//
// Determinism: no float atomics. embed_bwd sorts the token positions by token (stable) and gives
// each element of a touched dtable row to one thread, which adds that token's rows in order
// n = 0..N-1 (repeated tokens sum in the CPU's order). rmsnorm_bwd's dw is summed per fixed chunk of rows
// into scratch partials, then the partials in chunk order.
#include <stdio.h>

#include <cub/device/device_radix_sort.cuh>

#include "cuda_common.cuh"

enum { NORM_THREADS = 256 };
enum { DW_ROWS = 64 };  // rows per dw partial (more when the partials would not fit in scratch)

// ---- embedding -------------------------------------------------------------------------------

// out[n, :] = table[tok[n], :], rows of W units of V (uint4 when rows are 16-byte multiples).
template <typename V>
__global__ void k_embed_fwd(V* out, const V* table, const int32_t* tok, int N, int W) {
    const size_t n_all = (size_t)N * W;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_all; i += (size_t)gridDim.x * blockDim.x) {
        const size_t n = i / W, j = i % W;
        out[i] = table[(size_t)tok[n] * W + j];
    }
}

void cuda_embed_fwd(Backend* be, void* out, const void* table, const int32_t* tok, int N, int H) {
    // out [N, H] act; table [V, H] act; tok [N]
    if (N == 0 || H == 0) return;
    const size_t row = (size_t)H * dtype_size(be->act_dtype);
    CudaImpl* c = CI(be);
    if (row % 16 == 0 && (uintptr_t)out % 16 == 0 && (uintptr_t)table % 16 == 0) {
        const int W = (int)(row / 16);
        KLAUNCH(grid_for(c, (size_t)N * W, 256), 256, c->stream, k_embed_fwd<uint4>, (uint4*)out, (const uint4*)table,
                tok, N, W);
    } else {
        const int W = (int)(row / 2);
        KLAUNCH(grid_for(c, (size_t)N * W, 256), 256, c->stream, k_embed_fwd<uint16_t>, (uint16_t*)out,
                (const uint16_t*)table, tok, N, W);
    }
    LAUNCH_CK(c);
}

// ---- embedding backward ----------------------------------------------------------------------
// dtable[v, :] += dout[n, :] for every n with tok[n] = v, n ascending, in fp32 from the existing
// dtable value: the CPU backend's additions in its order, so the same bits.
//
// 1. k_embed_iota writes pos[n] = n (and stops the kernel on a token outside [0, V)).
// 2. CUB's radix sort (stable) sorts the pairs (tok[n], n) by token over the bits of V − 1:
//    skey[i] / spos[i]. A run of equal keys is one touched row of dtable, its positions ascending.
// 3. k_embed_runs lists the heads of the long runs (length ≥ EB_LONG). The list is built with an
//    integer atomic, so its order varies from run to run; nothing computed depends on that order.
// 4. k_embed_bwd, one launch with two kinds of blocks, each run done by exactly one kind. Each
//    element of a touched dtable row is owned by one thread: it loads the element once, adds the
//    run's rows of dout in the run's order, and stores it once. There are no float atomics and no
//    two threads on one element, and the order of the additions is fixed: deterministic, and the
//    CPU's bits.
//    - long runs: the first nlb (= SM count) blocks, scheduled first, since a long run is a chain
//      of L dependent adds per element. The work items are (run, warp slice of 32 × CL columns:
//      128 bytes of a dout row), dealt to warp w of block b as item w·nlb + b + k·8·nlb, so one
//      run's slices go to different SMs. A warp walks all of the run's rows for its slice with
//      EB_LU rows in flight, the next batch's positions loaded a batch ahead.
//    - short runs (L < EB_LONG): the other blocks. Block (group g, y) covers the runs that start
//      in sorted positions [32g, 32g + 32). Each warp holds those 64 keys and positions in its
//      lanes (a short run that starts in the group ends inside the window), finds the runs with
//      ballots, and does them one after the other for its EB_CPW column chunks of 32 × C columns.
//      That is 16-byte loads of dout when H and the pointers allow (C = 8 bf16, 4 fp32); else 4,
//      2 or 1.
// Cost: the sort (~N · 8 bytes a pass, a handful of small launches) plus one read of dout and
// one read and one write of each touched dtable row. That is bandwidth-bound for any token
// distribution except very long runs, which are bound by EB_LU rows in flight per warp.
enum { EB_THREADS = 256, EB_WARPS = EB_THREADS / 32 };
enum { EB_LONG = 32 };     // a run this long is done by the long-run blocks (must be 32: see emb_short)
enum { EB_LU = 64 };       // rows in flight per warp, long runs (2 per lane)
enum { EB_SU = 4 };        // rows in flight per batch, short runs
enum { EB_CPW = 2 };       // column chunks per warp, short runs
static const uint32_t EB_NOKEY = 0xffffffffu;  // past the end (no token is 2^32 − 1)

// C consecutive elements of a row of dout: the raw load (R) and its conversion to fp32 (exact).
template <typename T, int C> struct EmbCols;
template <> struct EmbCols<bf16, 8> {
    typedef uint4 R;
    static __device__ __forceinline__ R ld(const bf16* p) { return __ldg((const uint4*)p); }
    static __device__ __forceinline__ void cvt(float* f, R r) { unpack8(f, r); }
};
template <> struct EmbCols<bf16, 4> {
    typedef uint2 R;
    static __device__ __forceinline__ R ld(const bf16* p) { return __ldg((const uint2*)p); }
    static __device__ __forceinline__ void cvt(float* f, R r) {
        f[0] = __uint_as_float(r.x << 16), f[1] = __uint_as_float(r.x & 0xffff0000u);
        f[2] = __uint_as_float(r.y << 16), f[3] = __uint_as_float(r.y & 0xffff0000u);
    }
};
template <> struct EmbCols<bf16, 2> {
    typedef unsigned int R;
    static __device__ __forceinline__ R ld(const bf16* p) { return __ldg((const unsigned int*)p); }
    static __device__ __forceinline__ void cvt(float* f, R r) {
        f[0] = __uint_as_float(r << 16), f[1] = __uint_as_float(r & 0xffff0000u);
    }
};
template <> struct EmbCols<bf16, 1> {
    typedef unsigned short R;
    static __device__ __forceinline__ R ld(const bf16* p) { return __ldg((const unsigned short*)p); }
    static __device__ __forceinline__ void cvt(float* f, R r) { f[0] = __uint_as_float((unsigned int)r << 16); }
};
template <> struct EmbCols<float, 4> {
    typedef float4 R;
    static __device__ __forceinline__ R ld(const float* p) { return __ldg((const float4*)p); }
    static __device__ __forceinline__ void cvt(float* f, R r) { f[0] = r.x, f[1] = r.y, f[2] = r.z, f[3] = r.w; }
};
template <> struct EmbCols<float, 2> {
    typedef float2 R;
    static __device__ __forceinline__ R ld(const float* p) { return __ldg((const float2*)p); }
    static __device__ __forceinline__ void cvt(float* f, R r) { f[0] = r.x, f[1] = r.y; }
};
template <> struct EmbCols<float, 1> {
    typedef float R;
    static __device__ __forceinline__ R ld(const float* p) { return __ldg(p); }
    static __device__ __forceinline__ void cvt(float* f, R r) { f[0] = r; }
};

// C consecutive fp32 elements of dtable (aligned to min(C, 4) floats).
template <int C> __device__ __forceinline__ void emb_ld_acc(float* a, const float* d) {
    if constexpr (C >= 4) {
#pragma unroll
        for (int j = 0; j < C / 4; j++) {
            const float4 v = ((const float4*)d)[j];
            a[4 * j] = v.x, a[4 * j + 1] = v.y, a[4 * j + 2] = v.z, a[4 * j + 3] = v.w;
        }
    } else if constexpr (C == 2) {
        const float2 v = *(const float2*)d;
        a[0] = v.x, a[1] = v.y;
    } else {
        a[0] = d[0];
    }
}
template <int C> __device__ __forceinline__ void emb_st_acc(float* d, const float* a) {
    if constexpr (C >= 4) {
#pragma unroll
        for (int j = 0; j < C / 4; j++) ((float4*)d)[j] = make_float4(a[4 * j], a[4 * j + 1], a[4 * j + 2], a[4 * j + 3]);
    } else if constexpr (C == 2) {
        *(float2*)d = make_float2(a[0], a[1]);
    } else {
        d[0] = a[0];
    }
}

// The columns per thread of the long-run blocks: 4 bytes of dout (2 bf16, 1 fp32), or C if less.
template <typename T, int C> constexpr int emb_long_cols() { return C * (int)sizeof(T) > 4 ? 4 / (int)sizeof(T) : C; }

// The position of sorted row j if it is still in the run of key v, else −1 (keys are sorted: once
// a key differs, every later one does).
__device__ __forceinline__ int emb_run_pos(const uint32_t* __restrict__ skey, const int32_t* __restrict__ spos, int N,
                                           uint32_t v, int j) {
    if (j >= N) return -1;
    const uint32_t k = skey[j];
    const int p = spos[j];
    return k == v ? p : -1;
}

// k_embed_runs: the sorted positions where a long run starts (a run of key v from i is long
// when position i + EB_LONG − 1 still holds v). *count was zeroed by k_embed_iota.
__global__ void k_embed_runs(int32_t* __restrict__ list, int32_t* __restrict__ count,
                             const uint32_t* __restrict__ skey, int N) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    const uint32_t v = skey[i];
    if ((i == 0 || skey[i - 1] != v) && i + (EB_LONG - 1) < N && skey[i + (EB_LONG - 1)] == v)
        list[atomicAdd(count, 1)] = i;  // the list's order is irrelevant: each run is done whole
}

// Long runs: this warp's items (run, warp slice) of the count × slices, dealt across the nlb
// blocks first. Warp-uniform control flow (the ballots and shuffles).
template <typename T, int CL>
__device__ __forceinline__ void emb_long(float* __restrict__ dtable, const T* __restrict__ dout,
                                         const uint32_t* __restrict__ skey, const int32_t* __restrict__ spos, int N,
                                         int H, const int32_t* __restrict__ list, const int32_t* __restrict__ count,
                                         int nlb) {
    typedef EmbCols<T, CL> CC;
    const unsigned FULL = 0xffffffffu;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int slices = (H / CL + 31) / 32;  // warp slices of 32 × CL columns (H % CL == 0)
    const long long items = (long long)*count * slices;
    for (long long it = (long long)w * nlb + blockIdx.x; it < items; it += (long long)EB_WARPS * nlb) {
        const int i = list[it / slices], col = ((int)(it % slices) * 32 + lane) * CL;
        const bool on = col < H;
        const uint32_t v = skey[i];
        float* d = dtable + (size_t)v * H + col;
        float acc[CL];
        if (on) emb_ld_acc<CL>(acc, d);
        // the batch's positions: rows j + lane (pa) and j + 32 + lane (pb), −1 past the run
        int pa = emb_run_pos(skey, spos, N, v, i + lane), pb = emb_run_pos(skey, spos, N, v, i + 32 + lane);
        for (int j = i;; j += EB_LU) {
            // the run's rows in the batch are a prefix of it (keys sorted): nv of them
            const int nv = __popc(__ballot_sync(FULL, pa >= 0)) + __popc(__ballot_sync(FULL, pb >= 0));
            int na = -1, nb = -1;  // the next batch's, loaded now
            if (nv == EB_LU) {
                na = emb_run_pos(skey, spos, N, v, j + EB_LU + lane);
                nb = emb_run_pos(skey, spos, N, v, j + EB_LU + 32 + lane);
            }
            typename CC::R x[EB_LU];
#pragma unroll
            for (int k = 0; k < EB_LU; k++) {
                const int p = __shfl_sync(FULL, k < 32 ? pa : pb, k & 31);
                if (k < nv && on) x[k] = CC::ld(dout + (size_t)p * H + col);
            }
#pragma unroll
            for (int k = 0; k < EB_LU; k++) {
                if (k < nv && on) {
                    float f[CL];
                    CC::cvt(f, x[k]);
#pragma unroll
                    for (int e = 0; e < CL; e++) acc[e] += f[e];
                }
            }
            if (nv < EB_LU) break;  // the run ended in this batch (or exactly at its end)
            pa = na, pb = nb;
        }
        if (on) emb_st_acc<CL>(d, acc);
    }
}

// Short runs that start in sorted positions [32g, 32g + 32); warp w of block (g, y) does column
// chunks (y·EB_CPW + cw)·EB_WARPS + w, cw < EB_CPW, of 32 × C columns. Warp-uniform control flow
// (the ballots and shuffles).
template <typename T, int C>
__device__ __forceinline__ void emb_short(float* __restrict__ dtable, const T* __restrict__ dout,
                                          const uint32_t* __restrict__ skey, const int32_t* __restrict__ spos, int N,
                                          int H, int g, int y) {
    typedef EmbCols<T, C> CC;
    const unsigned FULL = 0xffffffffu;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    // the window: sorted positions g0 + lane (k0, p0) and g0 + 32 + lane (k1, p1)
    const int g0 = g * 32, i0 = g0 + lane, i1 = g0 + 32 + lane;
    const uint32_t k0 = i0 < N ? skey[i0] : EB_NOKEY, k1 = i1 < N ? skey[i1] : EB_NOKEY;
    const int p0 = i0 < N ? spos[i0] : 0, p1 = i1 < N ? spos[i1] : 0;
    uint32_t kp = __shfl_up_sync(FULL, k0, 1);  // the key before position i0
    if (lane == 0) kp = g0 > 0 ? skey[g0 - 1] : EB_NOKEY;
    unsigned heads = __ballot_sync(FULL, i0 < N && k0 != kp);  // lanes where a run starts
    int col[EB_CPW];
    bool on[EB_CPW];
#pragma unroll
    for (int cw = 0; cw < EB_CPW; cw++) {
        col[cw] = (((y * EB_CPW + cw) * EB_WARPS + w) * 32 + lane) * C;  // H % C == 0
        on[cw] = col[cw] < H;
    }
    while (heads) {
        const int h = __ffs(heads) - 1;
        heads &= heads - 1;
        const uint32_t v = __shfl_sync(FULL, k0, h);
        // the run's length: the ones from bit h of the 64-position match mask (equal keys are adjacent)
        const unsigned m0 = __ballot_sync(FULL, k0 == v), m1 = __ballot_sync(FULL, k1 == v);
        const unsigned long long rest = ~((((unsigned long long)m1 << 32) | m0) >> h);
        const int L = rest ? __ffsll((long long)rest) - 1 : 64;
        if (L >= EB_LONG) continue;  // a long run (its length ≥ 64 − h ≥ 33 is seen as is): not ours
        // a short run ends inside the window: its rows are window offsets h .. h + L − 1 ≤ 61
        float acc[EB_CPW][C];
        float* d[EB_CPW];
#pragma unroll
        for (int cw = 0; cw < EB_CPW; cw++) {
            d[cw] = dtable + (size_t)v * H + col[cw];
            if (on[cw]) emb_ld_acc<C>(acc[cw], d[cw]);
        }
        for (int r0 = 0; r0 < L; r0 += EB_SU) {
            typename CC::R x[EB_SU][EB_CPW];
#pragma unroll
            for (int k = 0; k < EB_SU; k++) {
                const int o = h + r0 + k;
                const int a = __shfl_sync(FULL, p0, o & 31), b = __shfl_sync(FULL, p1, o & 31);
                const int p = o < 32 ? a : b;
                if (r0 + k < L) {
#pragma unroll
                    for (int cw = 0; cw < EB_CPW; cw++)
                        if (on[cw]) x[k][cw] = CC::ld(dout + (size_t)p * H + col[cw]);
                }
            }
#pragma unroll
            for (int k = 0; k < EB_SU; k++) {
                if (r0 + k >= L) break;
#pragma unroll
                for (int cw = 0; cw < EB_CPW; cw++) {
                    if (!on[cw]) continue;
                    float f[C];
                    CC::cvt(f, x[k][cw]);
#pragma unroll
                    for (int j = 0; j < C; j++) acc[cw][j] += f[j];
                }
            }
        }
#pragma unroll
        for (int cw = 0; cw < EB_CPW; cw++)
            if (on[cw]) emb_st_acc<C>(d[cw], acc[cw]);
    }
}

// Blocks [0, nlb): long runs; the rest: short runs, block − nlb = group · sy + y.
template <typename T, int C>
__global__ void __launch_bounds__(EB_THREADS, 2) k_embed_bwd(float* __restrict__ dtable, const T* __restrict__ dout,
                                                          const uint32_t* __restrict__ skey,
                                                          const int32_t* __restrict__ spos,
                                                          const int32_t* __restrict__ list,
                                                          const int32_t* __restrict__ count, int N, int H, int nlb,
                                                          int sy) {
    const int b = blockIdx.x;
    if (b < nlb) emb_long<T, emb_long_cols<T, C>()>(dtable, dout, skey, spos, N, H, list, count, nlb);
    else emb_short<T, C>(dtable, dout, skey, spos, N, H, (b - nlb) / sy, (b - nlb) % sy);
}

__global__ void k_embed_iota(int32_t* pos, int32_t* count, const int32_t* tok, int N, int V) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *count = 0;
    for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
        const int v = tok[n];
        if (v < 0 || v >= V) {
            printf("embed_bwd: token %d at row %d is outside [0, %d)\n", v, n, V);
            __trap();
        }
        pos[n] = n;
    }
}

template <typename T, int C>
static void embed_bwd_launch(CudaImpl* c, float* dtable, const T* dout, const uint32_t* skey, const int32_t* spos,
                             const int32_t* list, const int32_t* count, int N, int H) {
    const int nlb = c->sms;                                                       // long runs
    const long long chunks = (H / C + 31) / 32;                                   // short: 32 × C columns
    const long long sy = (chunks + EB_WARPS * EB_CPW - 1) / (EB_WARPS * EB_CPW);  // short: blocks per group
    const long long nb = nlb + (long long)((N + 31) / 32) * sy;
    CHECK(nb <= 0x7fffffffLL, "embed_bwd: %d tokens × hidden %d need too many blocks", N, H);
    const auto kern = k_embed_bwd<T, C>;
    KLAUNCH((unsigned)nb, EB_THREADS, c->stream, kern, dtable, dout, skey, spos, list, count, N, H, nlb, (int)sy);
}

// The widest C (columns per thread, short runs) that H and the alignment of both pointers allow.
static int embed_cols(Backend* be, int H, const void* dout, const float* dtable) {
    const int sz = is_bf16(be) ? 2 : 4;
    for (int C = is_bf16(be) ? 8 : 4; C > 1; C /= 2)
        if (H % C == 0 && (uintptr_t)dout % ((size_t)C * sz) == 0 && (uintptr_t)dtable % (4u * (C < 4 ? C : 4)) == 0)
            return C;
    return 1;
}

static size_t emb_align(size_t b) { return (b + 255) & ~(size_t)255; }

void cuda_embed_bwd(Backend* be, float* dtable, const void* dout, const int32_t* tok, int N, int H, int V) {
    // dtable [V, H] fp32 (+=); dout [N, H] act; tok [N] in [0, V)
    if (N <= 0 || H <= 0 || V <= 0) return;
    CudaImpl* c = CI(be);
    int bits = 1;  // the key bits to sort on: those of V − 1
    while (bits < 31 && ((V - 1) >> bits)) bits++;
    // scratch: pos [N], skey [N], spos [N], list [N / 32 + 1], count, CUB's temporary storage
    const uint32_t* key = (const uint32_t*)tok;  // tokens are non-negative (k_embed_iota checks)
    const size_t a = emb_align((size_t)N * 4), al = emb_align(((size_t)N / 32 + 1) * 4), ac = 256;
    size_t tmp = 0;
    CUDA_CK(cub::DeviceRadixSort::SortPairs(nullptr, tmp, key, (uint32_t*)nullptr, (const int32_t*)nullptr,
                                            (int32_t*)nullptr, N, 0, bits, c->stream));
    CHECK(3 * a + al + ac + tmp <= c->scratch_bytes, "embed_bwd: %d tokens exceed the scratch buffer", N);
    char* s = (char*)c->scratch;
    int32_t* pos = (int32_t*)s;
    uint32_t* skey = (uint32_t*)(s + a);
    int32_t* spos = (int32_t*)(s + 2 * a);
    int32_t* list = (int32_t*)(s + 3 * a);
    int32_t* count = (int32_t*)(s + 3 * a + al);
    KLAUNCH(grid_for(c, (size_t)N, 256), 256, c->stream, k_embed_iota, pos, count, tok, N, V);
    LAUNCH_CK(c);
    CUDA_CK(cub::DeviceRadixSort::SortPairs(s + 3 * a + al + ac, tmp, key, skey, pos, spos, N, 0, bits, c->stream));
    LAUNCH_CK(c);
    KLAUNCH((unsigned)((N + 255) / 256), 256, c->stream, k_embed_runs, list, count, skey, N);
    LAUNCH_CK(c);
    const int C = embed_cols(be, H, dout, dtable);
    if (is_bf16(be)) {
        const bf16* x = (const bf16*)dout;
        if (C == 8) embed_bwd_launch<bf16, 8>(c, dtable, x, skey, spos, list, count, N, H);
        else if (C == 4) embed_bwd_launch<bf16, 4>(c, dtable, x, skey, spos, list, count, N, H);
        else if (C == 2) embed_bwd_launch<bf16, 2>(c, dtable, x, skey, spos, list, count, N, H);
        else embed_bwd_launch<bf16, 1>(c, dtable, x, skey, spos, list, count, N, H);
    } else {
        const float* x = (const float*)dout;
        if (C == 4) embed_bwd_launch<float, 4>(c, dtable, x, skey, spos, list, count, N, H);
        else if (C == 2) embed_bwd_launch<float, 2>(c, dtable, x, skey, spos, list, count, N, H);
        else embed_bwd_launch<float, 1>(c, dtable, x, skey, spos, list, count, N, H);
    }
    LAUNCH_CK(c);
}

// ---- the bf16 rows as 16-byte chunks (8 values): the vectorized kernels ------------------------
// When the act dtype is bf16, H is a multiple of 8, the rows and w are 16-byte aligned and a row
// is at most 4 × NORM_THREADS chunks (H ≤ 8192), thread t of a row's block owns chunks t,
// t + NORM_THREADS, ... and keeps them in registers between the reduction and the write, so every
// input is read once with 16-byte loads. rms_vec_chunks gives the chunks per thread (1, 2 or 4),
// or 0 for the scalar kernels (the backward, k_rms_bwd_v, takes one chunk per thread instead).
static int rms_vec_chunks(Backend* be, int H, const void* a, const void* b, const void* w) {
    if (!is_bf16(be) || H % 8 || ((uintptr_t)a | (uintptr_t)b | (uintptr_t)w) % 16) return 0;
    const int per = (H / 8 + NORM_THREADS - 1) / NORM_THREADS;
    return per <= 1 ? 1 : per <= 2 ? 2 : per <= 4 ? 4 : 0;
}

template <int NV>
__global__ void __launch_bounds__(NORM_THREADS) k_rmsnorm_fwd_v(bf16* y, float* rstd, const bf16* x, const bf16* w,
                                                                 int H, float eps) {
    __shared__ float sh[32];
    const int C = H / 8;
    const uint4* xr = (const uint4*)(x + (size_t)blockIdx.x * H);
    float v[NV][8];
    float ss = 0;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int c = threadIdx.x + i * NORM_THREADS;
        if (c < C) {
            unpack8(v[i], xr[c]);
#pragma unroll
            for (int e = 0; e < 8; e++) ss += v[i][e] * v[i][e];
        }
    }
    ss = block_sum(ss, sh);
    const float r = 1.0f / sqrtf(ss / H + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    uint4* yr = (uint4*)(y + (size_t)blockIdx.x * H);
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int c = threadIdx.x + i * NORM_THREADS;
        if (c >= C) continue;
        float wf[8];
        unpack8(wf, ((const uint4*)w)[c]);
#pragma unroll
        for (int e = 0; e < 8; e++) wf[e] = wf[e] * (v[i][e] * r);
        yr[c] = pack8(wf);
    }
}

// The bf16 backward: dx and the dw partials in one pass (each input read once; the scalar path
// below reads dy and x twice). Block b takes the rows of dw chunk b in order, each row as k_rms_dx
// does (the same arithmetic, 8 values per thread), and adds dy·x·r into its columns' partials as
// k_rms_dw_part does (the same order, n ascending), held in registers. One 16-byte chunk per
// thread (blockDim = H / 8 rounded up to a warp, at most 1024: rms_vec_chunks' limit), so a row is
// one round of loads (dy, x, and dx when accumulating) and one block reduction. Measured on the
// H200: a first version with 256 threads and two chunks each
// left too few rows in flight (2.2 TB/s); this one 3.3 TB/s, against 3.6 TB/s for the two-kernel
// form it replaced, which moved 1.5× the bytes.
__global__ void __launch_bounds__(1024) k_rms_bwd_v(bf16* dx, float* part, const bf16* dy, const bf16* x,
                                                     const bf16* w, const float* rstd, int N, int H, int rows, int acc) {
    __shared__ float sh[32];
    const int C = H / 8, c = threadIdx.x;
    const bool on = c < C;
    const int n0 = blockIdx.x * rows, n1 = min(N, n0 + rows);
    float wv[8], s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (on) unpack8(wv, ((const uint4*)w)[c]);
    for (int n = n0; n < n1; n++) {
        const size_t base = (size_t)n * H;
        const float r = rstd[n];
        float g[8], xv[8], o[8];
        float dot = 0;
        if (on) {
            unpack8(g, ((const uint4*)(dy + base))[c]);
            unpack8(xv, ((const uint4*)(x + base))[c]);
            if (acc) unpack8(o, ((const uint4*)(dx + base))[c]);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                dot += g[e] * wv[e] * xv[e];
                s[e] += g[e] * xv[e] * r;
            }
        }
        dot = block_sum(dot, sh);  // every thread has read its dy chunk: dx may alias dy
        const float cf = dot / H * r * r * r;
        if (on) {
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float v = r * (wv[e] * g[e]) - cf * xv[e];
                o[e] = acc ? o[e] + v : v;
            }
            ((uint4*)(dx + base))[c] = pack8(o);
        }
    }
    if (!on) return;
    float4* p = (float4*)(part + (size_t)blockIdx.x * H + (size_t)c * 8);
    p[0] = make_float4(s[0], s[1], s[2], s[3]);
    p[1] = make_float4(s[4], s[5], s[6], s[7]);
}

// ---- RMSNorm forward: one block per row ------------------------------------------------------

template <typename T>
__global__ void k_rmsnorm_fwd(T* y, float* rstd, const T* x, const T* w, int H, float eps) {
    __shared__ float sh[32];
    const size_t base = (size_t)blockIdx.x * H;
    float ss = 0;
    for (int h = threadIdx.x; h < H; h += blockDim.x) {
        const float v = to_f(x[base + h]);
        ss += v * v;
    }
    ss = block_sum(ss, sh);
    const float r = 1.0f / sqrtf(ss / H + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    for (int h = threadIdx.x; h < H; h += blockDim.x) y[base + h] = from_f<T>(to_f(w[h]) * (to_f(x[base + h]) * r));
}

void cuda_rmsnorm_fwd(Backend* be, void* y, float* rstd, const void* x, const void* w, int N, int H, float eps) {
    // y, x [N, H] act; w [H] act; rstd [N] fp32
    if (N == 0) return;
    CudaImpl* c = CI(be);
    const int nv = rms_vec_chunks(be, H, y, x, w);
    if (nv == 1) KLAUNCH(N, NORM_THREADS, c->stream, k_rmsnorm_fwd_v<1>, (bf16*)y, rstd, (const bf16*)x, (const bf16*)w,
            H, eps);
    else if (nv == 2) KLAUNCH(N, NORM_THREADS, c->stream, k_rmsnorm_fwd_v<2>, (bf16*)y, rstd, (const bf16*)x,
            (const bf16*)w, H, eps);
    else if (nv == 4) KLAUNCH(N, NORM_THREADS, c->stream, k_rmsnorm_fwd_v<4>, (bf16*)y, rstd, (const bf16*)x,
            (const bf16*)w, H, eps);
    else if (is_bf16(be))
        KLAUNCH(N, NORM_THREADS, c->stream, k_rmsnorm_fwd<bf16>, (bf16*)y, rstd, (const bf16*)x, (const bf16*)w, H,
                eps);
    else
        KLAUNCH(N, NORM_THREADS, c->stream, k_rmsnorm_fwd<float>, (float*)y, rstd, (const float*)x, (const float*)w, H,
                eps);
    LAUNCH_CK(c);
}

// ---- RMSNorm backward ------------------------------------------------------------------------
// With r = rstd[n]: dx_j = r w_j dy_j − x_j r³ (Σ_h dy_h w_h x_h) / H;  dw_h += Σ_n dy_nh x_nh r_n.

// part[chunk, h] = Σ over the chunk's rows of dy·x·r (grid: column blocks × chunks).
template <typename T>
__global__ void k_rms_dw_part(float* part, const T* dy, const T* x, const float* rstd, int N, int H, int rows) {
    const int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= H) return;
    const int n0 = blockIdx.y * rows, n1 = min(N, n0 + rows);
    float s = 0;
    for (int n = n0; n < n1; n++) {
        const size_t i = (size_t)n * H + h;
        s += to_f(dy[i]) * to_f(x[i]) * rstd[n];
    }
    part[(size_t)blockIdx.y * H + h] = s;
}

__global__ void k_rms_dw_final(float* dw, const float* part, int chunks, int H) {
    const int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= H) return;
    float s = 0;
    for (int c = 0; c < chunks; c++) s += part[(size_t)c * H + h];
    dw[h] += s;
}

// dx per row; reads the whole row of dy before writing it, so dx may alias dy.
template <typename T>
__global__ void k_rms_dx(T* dx, const T* dy, const T* x, const T* w, const float* rstd, int H, int acc) {
    __shared__ float sh[32];
    const size_t base = (size_t)blockIdx.x * H;
    const float r = rstd[blockIdx.x];
    float dot = 0;
    for (int h = threadIdx.x; h < H; h += blockDim.x) dot += to_f(dy[base + h]) * to_f(w[h]) * to_f(x[base + h]);
    dot = block_sum(dot, sh);
    const float cf = dot / H * r * r * r;
    for (int h = threadIdx.x; h < H; h += blockDim.x) {
        const float v = r * (to_f(w[h]) * to_f(dy[base + h])) - cf * to_f(x[base + h]);
        dx[base + h] = from_f<T>(acc ? to_f(dx[base + h]) + v : v);
    }
}

template <typename T>
static void rms_bwd(CudaImpl* c, int nv, T* dx, float* dw, const T* dy, const T* x, const T* w, const float* rstd, int N,
                    int H, int acc) {
    size_t cap = c->scratch_bytes / (sizeof(float) * (size_t)H);  // partial rows that fit
    if (cap > 65535) cap = 65535;                                       // grid.y limit
    CHECK(cap >= 1, "rmsnorm_bwd: hidden %d too large for the scratch buffer", H);
    int rows = DW_ROWS;
    if ((size_t)((N + rows - 1) / rows) > cap) rows = (int)((N + cap - 1) / cap);
    const int chunks = (N + rows - 1) / rows;
    float* part = (float*)c->scratch;  // [chunks, H]
    if (nv) {  // bf16 vector rows (nv = 0 for fp32, and T is bf16 whenever nv > 0): one pass
        const int threads = (H / 8 + 31) / 32 * 32;  // ≤ 4 × NORM_THREADS = 1024 (rms_vec_chunks)
        KLAUNCH(chunks, threads, c->stream, k_rms_bwd_v, (bf16*)dx, part, (const bf16*)dy, (const bf16*)x,
                (const bf16*)w, rstd, N, H, rows, acc);
    } else {
        const dim3 g((H + 255) / 256, chunks);
        KLAUNCH(g, 256, c->stream, k_rms_dw_part<T>, part, dy, x, rstd, N, H, rows);
    }
    LAUNCH_CK(c);
    KLAUNCH((H + 255) / 256, 256, c->stream, k_rms_dw_final, dw, part, chunks, H);
    LAUNCH_CK(c);
    if (!nv) {
        KLAUNCH(N, NORM_THREADS, c->stream, k_rms_dx<T>, dx, dy, x, w, rstd, H, acc);
        LAUNCH_CK(c);
    }
}

void cuda_rmsnorm_bwd(Backend* be, void* dx, float* dw, const void* dy, const void* x, const void* w,
                      const float* rstd, int N, int H, int accumulate) {
    // dx, dy, x [N, H] act; w [H] act; dw [H] fp32 (+=); rstd [N]
    if (N == 0 || H == 0) return;
    const int nv = (uintptr_t)dx % 16 ? 0 : rms_vec_chunks(be, H, dy, x, w);  // 0 unless bf16
    if (is_bf16(be))
        rms_bwd<bf16>(CI(be), nv, (bf16*)dx, dw, (const bf16*)dy, (const bf16*)x, (const bf16*)w, rstd, N, H, accumulate);
    else
        rms_bwd<float>(CI(be), 0, (float*)dx, dw, (const float*)dy, (const float*)x, (const float*)w, rstd, N, H,
                       accumulate);
}
