// cuda_backend.cu — the CUDA backend's ops table: creation (device, stream, cuBLASLt handle,
// workspaces), memory, casts, elementwise ops and the two reductions (sumsq, nonfinite). The
// numeric ops live in cuda_gemm.cu, cuda_norm.cu, cuda_rope.cu, cuda_attn*.cu, cuda_router.cu,
// cuda_moe.cu, cuda_loss.cu and cuda_optim.cu.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
extern "C" {
#include "comm.h"
}

enum { LT_WS_BYTES = CUDA_LT_WS_BYTES };     // cuBLASLt workspace (backend.h: plan counts it)
enum { SCRATCH_BYTES = CUDA_SCRATCH_BYTES };   // op workspace (see CudaImpl.scratch)
enum { RED_BLOCKS = 1024 };          // fixed partition of sumsq: deterministic on any GPU

// ---- checks ----------------------------------------------------------------------------------

static int g_device = -1;  // for messages

void cuda_fail(const char* what, const char* lib, const char* msg, const char* file, int line) {
    fatal_at(file, line, "%s error: %s: %s (device %d)", lib, what, msg, g_device);
}

const char* cublasLt_status_name(cublasStatus_t s) {
    switch (s) {
        case CUBLAS_STATUS_SUCCESS: return "success";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
        case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
        case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
        case CUBLAS_STATUS_MAPPING_ERROR: return "mapping error";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
        default: return "unknown status";
    }
}

void cuda_launch_check(CudaImpl* c, const char* file, int line) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) cuda_fail("kernel launch", "CUDA", cudaGetErrorString(e), file, line);
    if (c->debug_sync) {
        e = cudaStreamSynchronize(c->stream);
        if (e != cudaSuccess) cuda_fail("kernel (MOETRAIN_CUDA_SYNC=1)", "CUDA", cudaGetErrorString(e), file, line);
    }
}

// ---- allocation map (host) -------------------------------------------------------------------

static size_t amap_slot(const AllocMap* m, uintptr_t k) {
    uint64_t h = (uint64_t)k * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 20) & (m->cap - 1);
}

static void amap_put(AllocMap* m, uintptr_t k, size_t v);

static void amap_grow(AllocMap* m) {
    AllocMap old = *m;
    m->cap = old.cap ? old.cap * 2 : 1024;
    m->key = (uintptr_t*)xcalloc(m->cap, sizeof(uintptr_t));
    m->val = (size_t*)xcalloc(m->cap, sizeof(size_t));
    m->used = 0;
    for (size_t i = 0; i < old.cap; i++)
        if (old.key[i] > 1) amap_put(m, old.key[i], old.val[i]);
    free(old.key);
    free(old.val);
}

static void amap_put(AllocMap* m, uintptr_t k, size_t v) {
    if ((m->used + 1) * 2 > m->cap) amap_grow(m);
    size_t i = amap_slot(m, k);
    while (m->key[i] > 1) i = (i + 1) & (m->cap - 1);
    if (m->key[i] == 0) m->used++;
    m->key[i] = k;
    m->val[i] = v;
}

static size_t amap_take(AllocMap* m, uintptr_t k) {
    if (!m->cap) return 0;
    size_t i = amap_slot(m, k);
    while (m->key[i] != 0) {
        if (m->key[i] == k) {
            m->key[i] = 1;  // deleted (keeps probe chains intact)
            return m->val[i];
        }
        i = (i + 1) & (m->cap - 1);
    }
    return 0;
}

// ---- memory ----------------------------------------------------------------------------------

static void* cu_alloc(Backend* be, size_t bytes) {
    CudaImpl* c = CI(be);
    void* p = NULL;
    const size_t n = bytes ? bytes : 256;  // a unique non-NULL pointer even for 0 bytes
    cudaError_t e = cudaMalloc(&p, n);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        FATAL("cuda backend: out of GPU memory allocating %zu bytes on device %d (%zu of %zu MiB free, %zu MiB "
              "held by moetrain): %s; reduce train.micro_batch or train.seq_len, or use more EP ranks",
              bytes, c->device, fr >> 20, tot >> 20, c->live >> 20, cudaGetErrorString(e));
    }
    CUDA_CK(cudaMemsetAsync(p, 0, n, c->stream));
    amap_put(&c->allocs, (uintptr_t)p, n);
    c->live += n;
    if (c->live > c->peak) c->peak = c->live;
    return p;
}

static void cu_free(Backend* be, void* p) {
    if (!p) return;
    CudaImpl* c = CI(be);
    CUDA_CK(cudaStreamSynchronize(c->stream));  // no op in flight may still use it
    c->live -= amap_take(&c->allocs, (uintptr_t)p);
    CUDA_CK(cudaFree(p));
}

static size_t cu_peak_bytes(Backend* be) { return CI(be)->peak; }

// Page-locked host memory (staging: checkpoint snapshots, parallel.comm=mpi).
static void* cu_host_alloc(Backend* be, size_t bytes) {
    void* p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
    if (e != cudaSuccess)
        FATAL("cuda backend: cannot allocate %zu MiB of page-locked host memory on device %d: %s (host memory is "
              "short: checkpoint.async needs the rank's checkpoint size, parallel.comm=mpi the largest message)",
              bytes >> 20, CI(be)->device, cudaGetErrorString(e));
    return p;
}

static void cu_host_free(Backend* be, void* p) {
    if (!p) return;
    CUDA_CK(cudaStreamSynchronize(ST(be)));  // no copy in flight may still read it
    CUDA_CK(cudaFreeHost(p));
}

static void cu_mem_info(Backend* be, BackendMem* out) {
    CudaImpl* c = CI(be);
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) fr = tot = 0;
    *out = (BackendMem){.live = c->live, .peak = c->peak, .device_used = tot - fr, .device_total = tot};
}

static void cu_to_host(Backend* be, void* dst, const void* src, size_t n) {
    if (!n) return;
    CUDA_CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, ST(be)));
    CUDA_CK(cudaStreamSynchronize(ST(be)));
}

// From pageable memory the call returns once the source is staged: the caller may reuse it.
static void cu_to_device(Backend* be, void* dst, const void* src, size_t n) {
    if (!n) return;
    CUDA_CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, ST(be)));
}

static void cu_copy(Backend* be, void* dst, const void* src, size_t n) {
    if (!n || dst == src) return;
    CUDA_CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, ST(be)));
}

static void cu_zero(Backend* be, void* p, size_t n) {
    if (n) CUDA_CK(cudaMemsetAsync(p, 0, n, ST(be)));
}

extern "C" int cuda_attn_fwd_ws_stalled(void);  // cuda_attn_fwd_ws.cu, cuda_attn_bwd_ws.cu
extern "C" int cuda_attn_bwd_ws_stalled(void);

// Also where a warp-specialised attention kernel's mbarrier wait gave up (tma.cuh: a bug that
// would otherwise have hung the GPU, and left garbage behind): stop rather than train on it. The
// trainer syncs once a step; the two 4-byte reads cost microseconds.
static void cu_sync(Backend* be) {
    CUDA_CK(cudaStreamSynchronize(ST(be)));
    const int f = cuda_attn_fwd_ws_stalled(), b = cuda_attn_bwd_ws_stalled();
    CHECK(!f && !b, "a warp-specialised attention kernel (%s) gave up waiting on a pipeline stage: a bug; "
          "gpu.attention=mma runs the mma.sync kernels instead", f ? "forward" : "backward");
}

// Tests: the device's compute capability (major version; 9 on Hopper).
extern "C" int cuda_compute_capability(Backend* be) { return CI(be)->cc_major; }

// ---- casts and elementwise -------------------------------------------------------------------

__global__ void k_f32_to_bf16(bf16* dst, const float* src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void k_bf16_to_f32(float* dst, const bf16* src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}

template <typename T>
__global__ void k_add(T* y, const T* x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = from_f<T>(to_f(y[i]) + to_f(x[i]));
}

__global__ void k_scale(float* x, float s, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

static void cu_f32_to_act(Backend* be, void* dst, const float* src, size_t n) {
    if (!n) return;
    if (!is_bf16(be)) {
        if (dst != src) CUDA_CK(cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyDeviceToDevice, ST(be)));
        return;
    }
    k_f32_to_bf16<<<grid_for(CI(be), n, 256), 256, 0, ST(be)>>>((bf16*)dst, src, n);
    LAUNCH_CK(CI(be));
}

static void cu_act_to_f32(Backend* be, float* dst, const void* src, size_t n) {
    if (!n) return;
    if (!is_bf16(be)) {
        if (dst != src) CUDA_CK(cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyDeviceToDevice, ST(be)));
        return;
    }
    k_bf16_to_f32<<<grid_for(CI(be), n, 256), 256, 0, ST(be)>>>(dst, (const bf16*)src, n);
    LAUNCH_CK(CI(be));
}

static void cu_add_act(Backend* be, void* y, const void* x, size_t n) {
    if (!n) return;
    if (is_bf16(be)) k_add<bf16><<<grid_for(CI(be), n, 256), 256, 0, ST(be)>>>((bf16*)y, (const bf16*)x, n);
    else k_add<float><<<grid_for(CI(be), n, 256), 256, 0, ST(be)>>>((float*)y, (const float*)x, n);
    LAUNCH_CK(CI(be));
}

static void cu_scale_f32(Backend* be, float* x, float s, size_t n) {
    if (!n) return;
    k_scale<<<grid_for(CI(be), n, 256), 256, 0, ST(be)>>>(x, s, n);
    LAUNCH_CK(CI(be));
}

// Σ x² in double: RED_BLOCKS blocks each sum a fixed strided subset (partials in scratch), then
// one block adds the partials in order. The same n gives the same bits on every run.
// Partial Σ x² per block in double. The grid is fixed (RED_BLOCKS × 256, any GPU), so each
// thread's share and the order of every sum are too: deterministic. Aligned 16-byte loads (4 fp32
// or 8 bf16 values), four in flight per thread (the kernel reads the whole gradient once per
// step: it must run at HBM speed). T: float (sumsq_f32) or bf16 (sumsq_act, bf16 gradients).
__device__ __forceinline__ double sq(float x) { return (double)x * x; }
__device__ __forceinline__ double sq(bf16 x) { return sq(__bfloat162float(x)); }
__device__ __forceinline__ double sq_vec(const float* e) { return sq(e[0]) + sq(e[1]) + sq(e[2]) + sq(e[3]); }
__device__ __forceinline__ double sq_vec(const bf16* e) {
    return sq(e[0]) + sq(e[1]) + sq(e[2]) + sq(e[3]) + sq(e[4]) + sq(e[5]) + sq(e[6]) + sq(e[7]);
}

template <typename T>
__global__ void __launch_bounds__(256) k_sumsq_part(double* part, const T* __restrict__ x, size_t n) {
    constexpr int VE = 16 / sizeof(T);  // elements per 16-byte vector
    __shared__ double sh[8];
    const size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    size_t head = (size_t)((16 - ((uintptr_t)x & 15)) & 15) / sizeof(T);  // scalars before 16-byte alignment
    if (head > n) head = n;
    const size_t nv = (n - head) / VE, tail = head + VE * nv;
    const uint4* v = (const uint4*)(x + head);
    double s = 0;
    for (size_t j = tid; j < head; j += stride) s += sq(x[j]);  // head, tail < VE ≤ stride: one each at most
    for (size_t j = tail + tid; j < n; j += stride) s += sq(x[j]);
    size_t i = tid;
    for (; i + 3 * stride < nv; i += 4 * stride) {
        const uint4 a = v[i], b = v[i + stride], c = v[i + 2 * stride], d = v[i + 3 * stride];
        s += sq_vec((const T*)&a);
        s += sq_vec((const T*)&b);
        s += sq_vec((const T*)&c);
        s += sq_vec((const T*)&d);
    }
    for (; i < nv; i += stride) {
        const uint4 a = v[i];
        s += sq_vec((const T*)&a);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += sh[w];
        part[blockIdx.x] = t;
    }
}

// Σ of the partials: lane l sums partials l, l + 32, ... in order, then a fixed butterfly.
__global__ void k_sumsq_final(float* out, const double* part, int np) {
    double t = 0;
    for (int i = threadIdx.x; i < np; i += 32) t += part[i];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    if (threadIdx.x == 0) out[0] = (float)((double)out[0] + t);
}

template <typename T>
static void sumsq(Backend* be, float* out, const T* x, size_t n) {
    CudaImpl* c = CI(be);
    double* part = (double*)c->scratch;  // [RED_BLOCKS]
    k_sumsq_part<T><<<RED_BLOCKS, 256, 0, c->stream>>>(part, x, n);
    LAUNCH_CK(c);
    k_sumsq_final<<<1, 32, 0, c->stream>>>(out, part, RED_BLOCKS);
    LAUNCH_CK(c);
}
static void cu_sumsq_f32(Backend* be, float* out, const float* x, size_t n) { sumsq(be, out, x, n); }
static void cu_sumsq_act(Backend* be, float* out, const void* x, size_t n) {
    if (is_bf16(be)) sumsq(be, out, (const bf16*)x, n);
    else sumsq(be, out, (const float*)x, n);
}

__global__ void k_nonfinite(float* out, const float* x, size_t n) {
    int bad = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        bad |= !isfinite(x[i]);
    if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) out[0] = 1.0f;
}

static void cu_nonfinite_f32(Backend* be, float* out, const float* x, size_t n) {
    if (!n) return;
    k_nonfinite<<<grid_for(CI(be), n, 256), 256, 0, ST(be)>>>(out, x, n);
    LAUNCH_CK(CI(be));
}

// C[M, N] (row stride ldc) = beta · C; beta = 0 writes zeros (old C, even NaN, is ignored).
template <typename T>
__global__ void k_scale_matrix(T* C, int M, int N, int ldc, float beta) {
    const size_t n = (size_t)M * N;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        T* p = C + (i / N) * (size_t)ldc + i % N;
        *p = from_f<T>(beta == 0.f ? 0.f : beta * to_f(*p));
    }
}

void cuda_scale_matrix(Backend* be, void* C, int c_f32, int M, int N, int ldc, float beta) {
    if (beta == 1.f || M == 0 || N == 0) return;
    const unsigned g = grid_for(CI(be), (size_t)M * N, 256);
    if (c_f32 || !is_bf16(be)) k_scale_matrix<float><<<g, 256, 0, ST(be)>>>((float*)C, M, N, ldc, beta);
    else k_scale_matrix<bf16><<<g, 256, 0, ST(be)>>>((bf16*)C, M, N, ldc, beta);
    LAUNCH_CK(CI(be));
}

// ---- the table -------------------------------------------------------------------------------

static void cu_destroy(Backend* be) {
    CudaImpl* c = CI(be);
    CUDA_CK(cudaStreamSynchronize(c->stream));
    gemm_cache_destroy(c->gemm);
    fp8_cache_destroy(c->fp8);
    CUBLAS_CK(cublasLtDestroy(c->lt));
    CUDA_CK(cudaFree(c->lt_ws));
    CUDA_CK(cudaFree(c->scratch));
    for (size_t i = 0; i < c->allocs.cap; i++)  // buffers the caller did not free
        if (c->allocs.key[i] > 1) cudaFree((void*)c->allocs.key[i]);
    free(c->allocs.key);
    free(c->allocs.val);
    CUDA_CK(cudaStreamDestroy(c->stream));
    free(c);
    free(be);
}

// Events: a BackendEvent* is a cudaEvent_t (a pointer to the runtime's event) recorded on the stream.
static BackendEvent* cu_event_create(Backend* be) {
    cudaEvent_t ev;
    CUDA_CK(cudaEventCreate(&ev));
    return (BackendEvent*)ev;
}
static void cu_event_record(Backend* be, BackendEvent* ev) { CUDA_CK(cudaEventRecord((cudaEvent_t)ev, CI(be)->stream)); }
static double cu_event_elapsed(Backend* be, BackendEvent* a, BackendEvent* b) {
    float ms = 0;
    CUDA_CK(cudaEventSynchronize((cudaEvent_t)b));
    CUDA_CK(cudaEventElapsedTime(&ms, (cudaEvent_t)a, (cudaEvent_t)b));
    return 1e-3 * ms;
}
static void cu_event_destroy(Backend* be, BackendEvent* ev) { CUDA_CK(cudaEventDestroy((cudaEvent_t)ev)); }

// NCCL on the backend's stream (cuda/comm_nccl.cu), or MPI through page-locked host memory.
static Comm* cu_comm_create(Backend* be, const CommOpts* o, Err* e) {
    if (o->staged) return comm_staged_create(o->ep, be);  // parallel.comm=mpi (src/comm_staged.c)
    Comm* c = comm_nccl_create(o->ep, (void*)CI(be)->stream);
    if (!c) err_set(e, "cuda backend: no NCCL communicator in this build; set train.device=cpu or rebuild with NCCL");
    return c;
}

extern "C" int cuda_device_count(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return count;
}

// A usable GPU `device` for activations in act_dtype: made current, its properties in *prop.
static int open_device(DType act_dtype, int device, cudaDeviceProp* prop, Err* e) {
    int count = 0;
    cudaError_t ce = cudaGetDeviceCount(&count);
    if (ce != cudaSuccess || count == 0) {
        err_set(e, "no usable CUDA GPU (cudaGetDeviceCount: %s); run on a machine with an NVIDIA GPU and driver, or set "
                   "train.device=cpu", ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
        cudaGetLastError();  // clear the sticky status of the failed query
        return -1;
    }
    if (device < 0 || device >= count) {
        err_set(e, "GPU %d requested but only %d visible (one rank per GPU: launch at most %d ranks per node, "
                   "check CUDA_VISIBLE_DEVICES, or set parallel.comm=mpi to let ranks share GPUs)", device, count, count);
        return -1;
    }
    if (act_dtype != DTYPE_BF16 && act_dtype != DTYPE_F32) {
        err_set(e, "cuda backend: activation dtype must be bf16 or fp32");
        return -1;
    }
    CUDA_CK(cudaSetDevice(device));
    g_device = device;
    CUDA_CK(cudaGetDeviceProperties(prop, device));
    if (prop->major < 8) {
        err_set(e, "GPU %d (%s) has compute capability %d.%d; the CUDA backend needs 8.0 or newer (bf16 tensor "
                   "cores); set train.device=cpu", device, prop->name, prop->major, prop->minor);
        return -1;
    }
    return 0;
}

// The backend's state on the current device: stream, cuBLASLt handle and workspace, op scratch.
static CudaImpl* impl_create(int device, const cudaDeviceProp* prop, const GpuConfig* gpu) {
    CudaImpl* c = (CudaImpl*)xcalloc(1, sizeof *c);
    c->device = device;
    c->sms = prop->multiProcessorCount;
    c->cc_major = prop->major;
    c->cc_minor = prop->minor;
    if (gpu) c->opt = *gpu;  // else zeros: the defaults
    snprintf(c->name, sizeof c->name, "%s", prop->name);
    const char* dbg = getenv("MOETRAIN_CUDA_SYNC");
    c->debug_sync = dbg && dbg[0] == '1';
    CUDA_CK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    CUBLAS_CK(cublasLtCreate(&c->lt));
    c->lt_ws_bytes = LT_WS_BYTES;
    CUDA_CK(cudaMalloc(&c->lt_ws, c->lt_ws_bytes));
    c->scratch_bytes = SCRATCH_BYTES;
    CUDA_CK(cudaMalloc(&c->scratch, c->scratch_bytes));
    c->gemm = gemm_cache_create();
    c->fp8_row_chunk = FP8_ROW_CHUNK;
    c->fp8_wgrad_acc = FP8_WGRAD_ACC_BYTES;
    c->fp8_epi_bytes = FP8_EPI_BYTES;
    return c;
}

static void set_ops(Backend* be) {
    be->alloc = cu_alloc;
    be->free = cu_free;
    be->to_host = cu_to_host;
    be->host_alloc = cu_host_alloc;
    be->host_free = cu_host_free;
    be->to_device = cu_to_device;
    be->copy = cu_copy;
    be->zero = cu_zero;
    be->sync = cu_sync;

    be->f32_to_act = cu_f32_to_act;
    be->act_to_f32 = cu_act_to_f32;
    be->add_act = cu_add_act;
    be->scale_f32 = cu_scale_f32;
    be->sumsq_f32 = cu_sumsq_f32;
    be->sumsq_act = cu_sumsq_act;
    be->nonfinite_f32 = cu_nonfinite_f32;

    be->embed_fwd = cuda_embed_fwd;
    be->embed_bwd = cuda_embed_bwd;
    be->rmsnorm_fwd = cuda_rmsnorm_fwd;
    be->rmsnorm_bwd = cuda_rmsnorm_bwd;
    be->rope_qkv = cuda_rope_qkv;
    be->attn_fwd = cuda_attn_fwd;
    be->attn_bwd = cuda_attn_bwd;
    be->rope_qkv_at = cuda_rope_qkv_at;
    be->kv_append = cuda_kv_append;
    be->attn_decode = cuda_attn_decode;

    be->gemm = cuda_gemm;
    be->gemm_grouped = cuda_gemm_grouped;
    be->gemm_grouped_wgrad = cuda_gemm_grouped_wgrad;
    // FP8 tensor cores from compute capability 8.9 (cuBLASLt's block-scaled modes on 9.0 only; the
    // fallback kernel elsewhere); below 8.9 none, nor in a build without sm_89+ code for this GPU
    // (make SM=80 run on an 8.9 GPU): precision.fp8 is refused there
    const CudaImpl* ci = CI(be);
    be->fp8_ws_bytes = (ci->cc_major > 8 || (ci->cc_major == 8 && ci->cc_minor >= 9)) && cuda_fp8_kernels_built()
                           ? cuda_fp8_ws_bytes : NULL;
    be->fp8_wcodes_bytes = be->fp8_ws_bytes ? cuda_fp8_wcodes_bytes : NULL;
    be->fp8_wcodes_make = be->fp8_ws_bytes ? cuda_fp8_wcodes_make : NULL;
    be->fp8_xcodes_bytes = be->fp8_ws_bytes ? cuda_fp8_xcodes_bytes : NULL;
    be->fp8_xcodes_make = be->fp8_ws_bytes ? cuda_fp8_xcodes_make : NULL;

    be->swiglu_fwd = cuda_swiglu_fwd;
    be->gemm_grouped_swiglu = cuda_gemm_grouped_swiglu;
    be->gemm_grouped_swiglu_bwd = cuda_gemm_grouped_swiglu_bwd;
    be->gemm_grouped_ffn = cuda_gemm_grouped_ffn;
    be->swiglu_bwd = cuda_swiglu_bwd;
    be->router_fwd = cuda_router_fwd;
    be->router_bwd = cuda_router_bwd;
    be->moe_index = cuda_moe_index;
    be->permute_fwd = cuda_permute_fwd;
    be->permute_bwd = cuda_permute_bwd;
    be->gather_rows_f32 = cuda_gather_rows_f32;
    be->scatter_rows_f32 = cuda_scatter_rows_f32;
    be->unpermute_fwd = cuda_unpermute_fwd;
    be->unpermute_bwd = cuda_unpermute_bwd;

    be->cross_entropy = cuda_cross_entropy;
    be->adamw = cuda_adamw;
    be->split_pack = cuda_split_pack;
    be->split_unpack = cuda_split_unpack;
    be->adamw_split = cuda_adamw_split;

    be->peak_bytes = cu_peak_bytes;
    be->event_create = cu_event_create;
    be->event_record = cu_event_record;
    be->event_elapsed = cu_event_elapsed;
    be->event_destroy = cu_event_destroy;
    be->comm_create = cu_comm_create;
    be->mem_info = cu_mem_info;
    be->destroy = cu_destroy;
}

extern "C" Backend* cuda_backend_create(DType act_dtype, int device, const GpuConfig* gpu, Err* e) {
    cudaDeviceProp prop;
    if (open_device(act_dtype, device, &prop, e)) return NULL;
    Backend* be = (Backend*)xcalloc(1, sizeof *be);
    CudaImpl* c = impl_create(device, &prop, gpu);
    be->name = "cuda";
    be->act_dtype = act_dtype;
    be->impl = c;
    be->device = c->name;  // the metrics' peak table and the summary
    set_ops(be);
    CUDA_CK(cudaStreamSynchronize(c->stream));
    return be;
}
