// cuda_moe.cu — the expert-major index, permute / unpermute, per-row gathers and SwiGLU with the
// routing scale (backend.h gives the semantics; the CPU backend is the spec).
//
// moe_index is a stable counting sort of the N·k (token, slot) entries by expert, in three
// launches over tiles of IDX_TILE entries: (1) per-tile expert histograms; (2) one block turns
// them into per-(tile, expert) starting rows (exclusive scan over experts, then over tiles) and
// writes counts; (3) each tile ranks its entries within an expert (warp match + popc, then a scan
// over the warps) and writes dest. The order is exactly experts ascending, then n, then slot.
// Every gather writes each output row from one thread: no atomics.
#include <stdio.h>

#include "cuda_common.cuh"

enum { IDX_TILE = 1024, IDX_WARPS = IDX_TILE / 32, MOE_MAX_E = 256 };

// ---- moe_index -------------------------------------------------------------------------------

__global__ void k_idx_count(int32_t* tilecnt, const int32_t* topk, int nk, int E) {
    __shared__ int cnt[MOE_MAX_E];
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    const int i = blockIdx.x * IDX_TILE + threadIdx.x;
    if (i < nk) {
        const int e = topk[i];
        if (e < 0 || e >= E) {
            printf("moe_index: expert id %d at row %d is outside [0, %d)\n", e, i, E);
            __trap();
        }
        atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) tilecnt[(size_t)blockIdx.x * E + e] = cnt[e];
}

// tilecnt[t, e] → first row of (tile t, expert e); counts[e] = rows of expert e.
__global__ void k_idx_scan(int32_t* counts, int32_t* tilecnt, int tiles, int E) {
    __shared__ int tot[MOE_MAX_E], off[MOE_MAX_E];
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int run = 0;
        for (int t = 0; t < tiles; t++) {
            const int c = tilecnt[(size_t)t * E + e];
            tilecnt[(size_t)t * E + e] = run;
            run += c;
        }
        tot[e] = run;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (int e = 0; e < E; e++) off[e] = run, run += tot[e];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        counts[e] = tot[e];
        for (int t = 0; t < tiles; t++) tilecnt[(size_t)t * E + e] += off[e];
    }
}

__global__ void __launch_bounds__(IDX_TILE) k_idx_dest(int32_t* dest, const int32_t* tilecnt, const int32_t* topk,
                                                       int nk, int E) {
    __shared__ int wc[IDX_WARPS][MOE_MAX_E];  // per-warp counts → per-warp starting rank
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int j = threadIdx.x; j < IDX_WARPS * E; j += blockDim.x) wc[j / E][j % E] = 0;
    __syncthreads();
    const int i = blockIdx.x * IDX_TILE + threadIdx.x;
    const int e = i < nk ? topk[i] : -1;
    const unsigned same = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(same & ((1u << lane) - 1));
    if (e >= 0 && rank == 0) wc[w][e] = __popc(same);
    __syncthreads();
    for (int x = threadIdx.x; x < E; x += blockDim.x) {
        int run = 0;
        for (int v = 0; v < IDX_WARPS; v++) {
            const int c = wc[v][x];
            wc[v][x] = run;
            run += c;
        }
    }
    __syncthreads();
    if (e >= 0) dest[i] = tilecnt[(size_t)blockIdx.x * E + e] + wc[w][e] + rank;
}

void cuda_moe_index(Backend* be, int32_t* counts, int32_t* dest, const int32_t* topk, int N, int k, int E) {
    // counts [E]; dest, topk [N·k]
    CHECK(E >= 1 && E <= MOE_MAX_E, "moe_index: the CUDA backend supports 1..%d experts (got %d)", MOE_MAX_E, E);
    CudaImpl* c = CI(be);
    const int nk = N * k, tiles = (nk + IDX_TILE - 1) / IDX_TILE;
    if (nk == 0) {
        CUDA_CK(cudaMemsetAsync(counts, 0, sizeof(int32_t) * E, c->stream));
        return;
    }
    CHECK((size_t)tiles * E * sizeof(int32_t) <= c->scratch_bytes, "moe_index: %d rows × %d experts exceed the "
          "scratch buffer; use a smaller micro-batch", nk, E);
    int32_t* tilecnt = (int32_t*)c->scratch;  // [tiles, E]
    KLAUNCH(tiles, IDX_TILE, c->stream, k_idx_count, tilecnt, topk, nk, E);
    LAUNCH_CK(c);
    KLAUNCH(1, 256, c->stream, k_idx_scan, counts, tilecnt, tiles, E);
    LAUNCH_CK(c);
    KLAUNCH(tiles, IDX_TILE, c->stream, k_idx_dest, dest, tilecnt, topk, nk, E);
    LAUNCH_CK(c);
}

// ---- row gathers -----------------------------------------------------------------------------

// dst[dest[i], :] = src[i / k, :] for i in [0, rows); rows of W units of V.
template <typename V>
__global__ void k_rows_to_dest(V* dst, const V* src, const int32_t* dest, int rows, int k, int W) {
    const size_t n = (size_t)rows * W;
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x) {
        const size_t i = j / W, c = j % W;
        dst[(size_t)dest[i] * W + c] = src[(i / k) * W + c];
    }
}

// Row copy xp[dest[i]] = x[i / k] (permute_fwd, unpermute_bwd): 16-byte units when possible.
static void rows_to_dest(Backend* be, void* dst, const void* src, const int32_t* dest, int N, int k, int H) {
    const int rows = N * k;
    if (rows == 0 || H == 0) return;
    CudaImpl* c = CI(be);
    const size_t rb = (size_t)H * dtype_size(be->act_dtype);
    if (rb % 16 == 0 && (uintptr_t)dst % 16 == 0 && (uintptr_t)src % 16 == 0) {
        const int W = (int)(rb / 16);
        KLAUNCH(grid_for(c, (size_t)rows * W, 256), 256, c->stream, k_rows_to_dest<uint4>, (uint4*)dst,
                (const uint4*)src, dest, rows, k, W);
    } else {
        const int W = (int)(rb / 2);
        KLAUNCH(grid_for(c, (size_t)rows * W, 256), 256, c->stream, k_rows_to_dest<uint16_t>, (uint16_t*)dst,
                (const uint16_t*)src, dest, rows, k, W);
    }
    LAUNCH_CK(c);
}

void cuda_permute_fwd(Backend* be, void* xp, const void* x, const int32_t* dest, int N, int k, int H) {
    rows_to_dest(be, xp, x, dest, N, k, H);  // xp [N·k, H], x [N, H]
}

void cuda_unpermute_bwd(Backend* be, void* dyp, const void* dout, const int32_t* dest, int N, int k, int H) {
    rows_to_dest(be, dyp, dout, dest, N, k, H);  // dyp [N·k, H], dout [N, H]
}

// out[n, h] = (add ? add[n, h] : 0) + Σ_slot src[dest[n·k + slot], h], fp32 sum in slot order
// (add may be out).
template <typename T>
__global__ void k_sum_from_dest(T* out, const T* src, const int32_t* dest, int N, int k, int H, const T* add) {
    const size_t n_all = (size_t)N * H;
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n_all; j += (size_t)gridDim.x * blockDim.x) {
        const size_t n = j / H, h = j % H;
        float s = add ? to_f(add[j]) : 0.f;
        for (int q = 0; q < k; q++) s += to_f(src[(size_t)dest[n * k + q] * H + h]);
        out[j] = from_f<T>(s);
    }
}

// The same sums 8 columns at a time (bf16, H % 8 == 0, 16-byte aligned rows): a thread owns one
// 16-byte chunk of an output row; the arithmetic and its order are k_sum_from_dest's.
__global__ void k_sum_from_dest_v(uint4* out, const uint4* src, const int32_t* dest, int N, int k, int W,
                                  const uint4* add) {
    const size_t n_all = (size_t)N * W;
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n_all; j += (size_t)gridDim.x * blockDim.x) {
        const size_t n = j / W, w = j % W;
        float s[8], v[8];
        if (add) unpack8(s, add[j]);
        else
            for (int e = 0; e < 8; e++) s[e] = 0.f;
        for (int q = 0; q < k; q++) {
            unpack8(v, src[(size_t)dest[n * k + q] * W + w]);
#pragma unroll
            for (int e = 0; e < 8; e++) s[e] += v[e];
        }
        out[j] = pack8(s);
    }
}

static void sum_from_dest(Backend* be, void* out, const void* src, const int32_t* dest, int N, int k, int H,
                          const void* add) {
    if (N == 0 || H == 0) return;
    CudaImpl* c = CI(be);
    if (is_bf16(be) && H % 8 == 0 && ((uintptr_t)out | (uintptr_t)src | (uintptr_t)add) % 16 == 0) {
        const int W = H / 8;
        KLAUNCH(grid_for(c, (size_t)N * W, 256), 256, c->stream, k_sum_from_dest_v, (uint4*)out, (const uint4*)src,
                dest, N, k, W, (const uint4*)add);
        LAUNCH_CK(c);
        return;
    }
    const unsigned g = grid_for(c, (size_t)N * H, 256);
    if (is_bf16(be))
        KLAUNCH(g, 256, c->stream, k_sum_from_dest<bf16>, (bf16*)out, (const bf16*)src, dest, N, k, H,
                (const bf16*)add);
    else
        KLAUNCH(g, 256, c->stream, k_sum_from_dest<float>, (float*)out, (const float*)src, dest, N, k, H,
                (const float*)add);
    LAUNCH_CK(c);
}

void cuda_permute_bwd(Backend* be, void* dx, const void* dxp, const int32_t* dest, int N, int k, int H) {
    sum_from_dest(be, dx, dxp, dest, N, k, H, NULL);  // dx [N, H], dxp [N·k, H]
}

void cuda_unpermute_fwd(Backend* be, void* out, const void* yp, const int32_t* dest, int N, int k, int H,
                        const void* add) {
    sum_from_dest(be, out, yp, dest, N, k, H, add);  // out [N, H], yp [N·k, H], add [N, H] or NULL (may be out)
}

__global__ void k_gather_f32(float* outp, const float* in, const int32_t* dest, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) outp[dest[i]] = in[i];
}

__global__ void k_scatter_f32(float* out, const float* inp, const int32_t* dest, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = inp[dest[i]];
}

void cuda_gather_rows_f32(Backend* be, float* outp, const float* in, const int32_t* dest, int n) {
    if (n == 0) return;
    KLAUNCH(grid_for(CI(be), n, 256), 256, ST(be), k_gather_f32, outp, in, dest, n);
    LAUNCH_CK(CI(be));
}

void cuda_scatter_rows_f32(Backend* be, float* out, const float* inp, const int32_t* dest, int n) {
    if (n == 0) return;
    KLAUNCH(grid_for(CI(be), n, 256), 256, ST(be), k_scatter_f32, out, inp, dest, n);
    LAUNCH_CK(CI(be));
}

// ---- SwiGLU ----------------------------------------------------------------------------------

// silu(g) = g / (1 + e^−g), as torch (and the CPU backend) write it, through silu_f (cuda_common.cuh:
// e^−g and the reciprocal one MUFU each)
template <typename T>
__global__ void k_swiglu_fwd(T* h, const T* gu, const float* scale, int n, int F) {
    const size_t n_all = (size_t)n * F;
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n_all; j += (size_t)gridDim.x * blockDim.x) {
        const size_t r = j / F, f = j % F;
        const float g = to_f(gu[r * 2 * F + f]), u = to_f(gu[r * 2 * F + F + f]);
        float v = silu_f(g) * u;
        if (scale) v *= scale[r];
        h[j] = from_f<T>(v);
    }
}

// bf16 rows with F % 8 == 0 and 16-byte aligned rows: a block walks rows, 8 values per thread and
// load (uint4), no division per element. The same arithmetic as k_swiglu_fwd (swiglu_fwd8).
__global__ void k_swiglu_fwd_v8(bf16* h, const bf16* gu, const float* scale, int n, int F) {
    const int W = F / 8;
    for (int r = blockIdx.x; r < n; r += gridDim.x) {
        const float s = scale ? scale[r] : 1.0f;
        const uint4* g4 = (const uint4*)(gu + (size_t)r * 2 * F);
        const uint4* u4 = (const uint4*)(gu + (size_t)r * 2 * F + F);
        uint4* h4 = (uint4*)(h + (size_t)r * F);
        for (int w = threadIdx.x; w < W; w += blockDim.x) h4[w] = swiglu_fwd8(g4[w], u4[w], s, scale != nullptr);
    }
}

void cuda_swiglu_fwd(Backend* be, void* h, const void* gu, const float* scale, int n, int F) {
    // h [n, F]; gu [n, 2F] = [gate | up]; scale [n] or NULL
    if (n == 0 || F == 0) return;
    CudaImpl* c = CI(be);
    if (is_bf16(be) && F % 8 == 0 && (uintptr_t)h % 16 == 0 && (uintptr_t)gu % 16 == 0) {
        const unsigned g = (unsigned)(n < 65535 ? n : 65535);
        KLAUNCH(g, 256, c->stream, k_swiglu_fwd_v8, (bf16*)h, (const bf16*)gu, scale, n, F);
        LAUNCH_CK(c);
        return;
    }
    const unsigned g = grid_for(c, (size_t)n * F, 256);
    if (is_bf16(be)) KLAUNCH(g, 256, c->stream, k_swiglu_fwd<bf16>, (bf16*)h, (const bf16*)gu, scale, n, F);
    else KLAUNCH(g, 256, c->stream, k_swiglu_fwd<float>, (float*)h, (const float*)gu, scale, n, F);
    LAUNCH_CK(c);
}

// One block per row: swiglu_bwd_elem per element, dscale = Σ_f dh·silu(g)·u. Each (g, u) pair is
// read and written by one thread: dgu may alias gu.
template <typename T>
__global__ void k_swiglu_bwd(T* dgu, float* dscale, const T* dh, const T* gu, const float* scale, int F) {
    __shared__ float sh[32];
    const size_t r = blockIdx.x;
    const float s = scale ? scale[r] : 1.0f;
    float ds = 0.f;
    for (int f = threadIdx.x; f < F; f += blockDim.x) {
        float dg, du, t;
        swiglu_bwd_elem(to_f(gu[r * 2 * F + f]), to_f(gu[r * 2 * F + F + f]), to_f(dh[r * F + f]), s, &dg, &du, &t);
        ds += t;
        dgu[r * 2 * F + F + f] = from_f<T>(du);
        dgu[r * 2 * F + f] = from_f<T>(dg);
    }
    if (dscale) {
        ds = block_sum(ds, sh);
        if (threadIdx.x == 0) dscale[r] = ds;
    }
}

// bf16, F % 8 == 0, 16-byte aligned: the same arithmetic, 8 values per thread and load (uint4).
// Each thread reads its 8 (g, u) pairs before writing them: dgu may alias gu.
__global__ void k_swiglu_bwd_v8(bf16* dgu, float* dscale, const bf16* dh, const bf16* gu, const float* scale, int F) {
    __shared__ float sh[32];
    const size_t r = blockIdx.x;
    const float s = scale ? scale[r] : 1.0f;
    const int W = F / 8;
    const uint4* g4 = (const uint4*)(gu + r * 2 * F);
    const uint4* u4 = (const uint4*)(gu + r * 2 * F + F);
    const uint4* d4 = (const uint4*)(dh + r * F);
    uint4* dg4 = (uint4*)(dgu + r * 2 * F);
    uint4* du4 = (uint4*)(dgu + r * 2 * F + F);
    float ds = 0.f;
    for (int w = threadIdx.x; w < W; w += blockDim.x) {
        uint4 og, ou;
        swiglu_bwd8(g4[w], u4[w], d4[w], s, &og, &ou, &ds);
        du4[w] = ou;
        dg4[w] = og;
    }
    if (dscale) {
        ds = block_sum(ds, sh);
        if (threadIdx.x == 0) dscale[r] = ds;
    }
}

void cuda_swiglu_bwd(Backend* be, void* dgu, float* dscale, const void* dh, const void* gu, const float* scale, int n,
                     int F) {
    // dgu [n, 2F]; dh [n, F]; gu [n, 2F]; scale, dscale [n] or NULL
    if (n == 0) return;
    CudaImpl* c = CI(be);
    if (is_bf16(be) && F % 8 == 0 && (uintptr_t)dgu % 16 == 0 && (uintptr_t)gu % 16 == 0 && (uintptr_t)dh % 16 == 0)
        KLAUNCH(n, 256, c->stream, k_swiglu_bwd_v8, (bf16*)dgu, dscale, (const bf16*)dh, (const bf16*)gu, scale, F);
    else if (is_bf16(be))
        KLAUNCH(n, 256, c->stream, k_swiglu_bwd<bf16>, (bf16*)dgu, dscale, (const bf16*)dh, (const bf16*)gu, scale, F);
    else
        KLAUNCH(n, 256, c->stream, k_swiglu_bwd<float>, (float*)dgu, dscale, (const float*)dh, (const float*)gu, scale,
                F);
    LAUNCH_CK(c);
}
