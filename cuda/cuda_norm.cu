// cuda_norm.cu — embedding lookup and RMSNorm (Hugging Face MixtralRMSNorm semantics:
// y = w · (x · rsqrt(mean(x²) + eps))), fp32 math on any act dtype.
//
// Determinism: no atomics. embed_bwd gives each warp one row of dtable and adds its tokens
// rows in order n = 0..N-1 (repeated tokens sum in the CPU's order). rmsnorm_bwd's dw is summed per
// fixed chunk of rows into scratch partials, then the partials in chunk order.
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
        k_embed_fwd<uint4><<<grid_for(c, (size_t)N * W, 256), 256, 0, c->stream>>>((uint4*)out, (const uint4*)table,
                                                                                 tok, N, W);
    } else {
        const int W = (int)(row / 2);
        k_embed_fwd<uint16_t><<<grid_for(c, (size_t)N * W, 256), 256, 0, c->stream>>>(
            (uint16_t*)out, (const uint16_t*)table, tok, N, W);
    }
    LAUNCH_CK(c);
}

// dtable[v, :] += dout[n, :] for every n with tok[n] = v, n ascending. Warp w of a block owns
// vocabulary row v = 8·block + w. The block stages 256 tokens at a time in shared memory; each
// warp ballots over them and, for each match in order, adds that row of dout into its dtable
// row. No atomics, no two warps on one element, the CPU's order of additions (the same bits).
// Cost: every block reads all N tokens (V/8 · N · 4 bytes from L2) plus the matched rows.
enum { EMB_WARPS = 8 };
template <typename T>
__global__ void __launch_bounds__(EMB_WARPS * 32) k_embed_bwd(float* __restrict__ dtable, const T* __restrict__ dout,
                                                              const int32_t* __restrict__ tok, int N, int H, int V) {
    __shared__ int32_t st[EMB_WARPS * 32];
    const int lane = threadIdx.x & 31, v = blockIdx.x * EMB_WARPS + (threadIdx.x >> 5);
    float* d = dtable + (size_t)(v < V ? v : 0) * H;
    for (int n0 = 0; n0 < N; n0 += EMB_WARPS * 32) {
        __syncthreads();
        const int n = n0 + threadIdx.x;
        st[threadIdx.x] = n < N ? tok[n] : -1;
        __syncthreads();
        if (v >= V) continue;
        for (int c = 0; c < EMB_WARPS * 32 && n0 + c < N; c += 32) {
            unsigned hit = __ballot_sync(0xffffffffu, st[c + lane] == v);
            while (hit) {
                const int j = __ffs(hit) - 1;
                hit &= hit - 1;
                const T* x = dout + (size_t)(n0 + c + j) * H;
                for (int h = lane; h < H; h += 32) d[h] += to_f(x[h]);
            }
        }
    }
}

void cuda_embed_bwd(Backend* be, float* dtable, const void* dout, const int32_t* tok, int N, int H, int V) {
    if (N == 0 || H == 0 || V == 0) return;
    CudaImpl* c = CI(be);
    const unsigned g = (unsigned)((V + EMB_WARPS - 1) / EMB_WARPS);  // a warp per vocabulary row
    if (is_bf16(be)) k_embed_bwd<bf16><<<g, EMB_WARPS * 32, 0, c->stream>>>(dtable, (const bf16*)dout, tok, N, H, V);
    else k_embed_bwd<float><<<g, EMB_WARPS * 32, 0, c->stream>>>(dtable, (const float*)dout, tok, N, H, V);
    LAUNCH_CK(c);
}

// ---- the bf16 rows as 16-byte chunks (8 values): the vectorized kernels ------------------------
// When the act dtype is bf16, H is a multiple of 8, the rows and w are 16-byte aligned and a row
// is at most 4 × NORM_THREADS chunks (H ≤ 8192), thread t of a row's block owns chunks t,
// t + NORM_THREADS, ... and keeps them in registers between the reduction and the write, so every
// input is read once with 16-byte loads. rms_vec_chunks gives the chunks per thread (1, 2 or 4),
// or 0 for the scalar kernels.
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

// dw partials, 8 columns per thread: the scalar kernel's sums in the same order (n ascending).
__global__ void k_rms_dw_part_v(float* part, const bf16* dy, const bf16* x, const float* rstd, int N, int H, int rows) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= H / 8) return;
    const int n0 = blockIdx.y * rows, n1 = min(N, n0 + rows);
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int n = n0; n < n1; n++) {
        float a[8], b[8];
        unpack8(a, ((const uint4*)(dy + (size_t)n * H))[c]);
        unpack8(b, ((const uint4*)(x + (size_t)n * H))[c]);
        const float r = rstd[n];
#pragma unroll
        for (int e = 0; e < 8; e++) s[e] += a[e] * b[e] * r;
    }
    float4* o = (float4*)(part + (size_t)blockIdx.y * H + (size_t)c * 8);
    o[0] = make_float4(s[0], s[1], s[2], s[3]);
    o[1] = make_float4(s[4], s[5], s[6], s[7]);
}

// dx per row, vectorized; the whole row of dy is in registers before any write (dx may alias dy).
template <int NV>
__global__ void __launch_bounds__(NORM_THREADS) k_rms_dx_v(bf16* dx, const bf16* dy, const bf16* x, const bf16* w,
                                                            const float* rstd, int H, int acc) {
    __shared__ float sh[32];
    const int C = H / 8;
    const size_t base = (size_t)blockIdx.x * H;
    const float r = rstd[blockIdx.x];
    float g[NV][8], xv[NV][8], wv[NV][8];
    float dot = 0;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int c = threadIdx.x + i * NORM_THREADS;
        if (c < C) {
            unpack8(g[i], ((const uint4*)(dy + base))[c]);
            unpack8(xv[i], ((const uint4*)(x + base))[c]);
            unpack8(wv[i], ((const uint4*)w)[c]);
#pragma unroll
            for (int e = 0; e < 8; e++) dot += g[i][e] * wv[i][e] * xv[i][e];
        }
    }
    dot = block_sum(dot, sh);
    const float cf = dot / H * r * r * r;
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int c = threadIdx.x + i * NORM_THREADS;
        if (c >= C) continue;
        float o[8];
        if (acc) unpack8(o, ((const uint4*)(dx + base))[c]);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const float v = r * (wv[i][e] * g[i][e]) - cf * xv[i][e];
            o[e] = acc ? o[e] + v : v;
        }
        ((uint4*)(dx + base))[c] = pack8(o);
    }
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
    if (nv == 1) k_rmsnorm_fwd_v<1><<<N, NORM_THREADS, 0, c->stream>>>((bf16*)y, rstd, (const bf16*)x, (const bf16*)w, H, eps);
    else if (nv == 2) k_rmsnorm_fwd_v<2><<<N, NORM_THREADS, 0, c->stream>>>((bf16*)y, rstd, (const bf16*)x, (const bf16*)w, H, eps);
    else if (nv == 4) k_rmsnorm_fwd_v<4><<<N, NORM_THREADS, 0, c->stream>>>((bf16*)y, rstd, (const bf16*)x, (const bf16*)w, H, eps);
    else if (is_bf16(be))
        k_rmsnorm_fwd<bf16><<<N, NORM_THREADS, 0, c->stream>>>((bf16*)y, rstd, (const bf16*)x, (const bf16*)w, H, eps);
    else
        k_rmsnorm_fwd<float><<<N, NORM_THREADS, 0, c->stream>>>((float*)y, rstd, (const float*)x, (const float*)w, H,
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
    // the vectorized kernels (bf16 only: nv = 0 for fp32, and T is bf16 whenever nv > 0)
    if (nv) {
        const dim3 gv((H / 8 + 255) / 256, chunks);
        k_rms_dw_part_v<<<gv, 256, 0, c->stream>>>(part, (const bf16*)dy, (const bf16*)x, rstd, N, H, rows);
    } else {
        const dim3 g((H + 255) / 256, chunks);
        k_rms_dw_part<T><<<g, 256, 0, c->stream>>>(part, dy, x, rstd, N, H, rows);
    }
    LAUNCH_CK(c);
    k_rms_dw_final<<<(H + 255) / 256, 256, 0, c->stream>>>(dw, part, chunks, H);
    LAUNCH_CK(c);
    bf16 *dxb = (bf16*)dx;
    const bf16 *dyb = (const bf16*)dy, *xb = (const bf16*)x, *wb = (const bf16*)w;
    if (nv == 1) k_rms_dx_v<1><<<N, NORM_THREADS, 0, c->stream>>>(dxb, dyb, xb, wb, rstd, H, acc);
    else if (nv == 2) k_rms_dx_v<2><<<N, NORM_THREADS, 0, c->stream>>>(dxb, dyb, xb, wb, rstd, H, acc);
    else if (nv == 4) k_rms_dx_v<4><<<N, NORM_THREADS, 0, c->stream>>>(dxb, dyb, xb, wb, rstd, H, acc);
    else k_rms_dx<T><<<N, NORM_THREADS, 0, c->stream>>>(dx, dy, x, w, rstd, H, acc);
    LAUNCH_CK(c);
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
