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
    if (is_bf16(be))
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
static void rms_bwd(CudaImpl* c, T* dx, float* dw, const T* dy, const T* x, const T* w, const float* rstd, int N,
                    int H, int acc) {
    size_t cap = c->scratch_bytes / (sizeof(float) * (size_t)H);  // partial rows that fit
    if (cap > 65535) cap = 65535;                                       // grid.y limit
    CHECK(cap >= 1, "rmsnorm_bwd: hidden %d too large for the scratch buffer", H);
    int rows = DW_ROWS;
    if ((size_t)((N + rows - 1) / rows) > cap) rows = (int)((N + cap - 1) / cap);
    const int chunks = (N + rows - 1) / rows;
    float* part = (float*)c->scratch;  // [chunks, H]
    const dim3 g((H + 255) / 256, chunks);
    k_rms_dw_part<T><<<g, 256, 0, c->stream>>>(part, dy, x, rstd, N, H, rows);
    LAUNCH_CK(c);
    k_rms_dw_final<<<(H + 255) / 256, 256, 0, c->stream>>>(dw, part, chunks, H);
    LAUNCH_CK(c);
    k_rms_dx<T><<<N, NORM_THREADS, 0, c->stream>>>(dx, dy, x, w, rstd, H, acc);
    LAUNCH_CK(c);
}

void cuda_rmsnorm_bwd(Backend* be, void* dx, float* dw, const void* dy, const void* x, const void* w,
                      const float* rstd, int N, int H, int accumulate) {
    // dx, dy, x [N, H] act; w [H] act; dw [H] fp32 (+=); rstd [N]
    if (N == 0 || H == 0) return;
    if (is_bf16(be))
        rms_bwd<bf16>(CI(be), (bf16*)dx, dw, (const bf16*)dy, (const bf16*)x, (const bf16*)w, rstd, N, H, accumulate);
    else
        rms_bwd<float>(CI(be), (float*)dx, dw, (const float*)dy, (const float*)x, (const float*)w, rstd, N, H,
                       accumulate);
}
