// probe_gpu_mem.c — what the CUDA runtime, cuBLASLt and NCCL hold on the GPU, measured with
// cudaMemGetInfo, against the estimates `moetrain plan` counts (plan.h, backend.h):
//   context   after the primary context is made (cudaFree(0))
//   backend   after cuda_backend_create (stream, cuBLASLt handle, its workspace, the op scratch)
//   kernels   after a bf16 GEMM and a grouped GEMM (cuBLASLt's and our kernels load lazily)
//   NCCL      one communicator over min(2, visible) GPUs in this process (ncclCommInitAll), after
//             an all-reduce and an all-to-all of send/recv pairs (NCCL connects lazily); with one
//             GPU the communicator has one rank: NCCL's fixed cost (PLAN_NCCL_BASE_BYTES) alone
// Prints each delta; fails when a measurement exceeds plan's estimate (then raise the constant in
// plan.h). Run alone on an idle GPU (another process's allocations would count). Under
// compute-sanitizer (which allocates device memory of its own) it measures and prints, but
// compares nothing.
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdint.h>

#include "backend.h"
#include "plan.h"
#include "test.h"

#define CU(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) FATAL("%s: %s", #x, cudaGetErrorString(e_)); } while (0)
#define NC(x) do { ncclResult_t r_ = (x); if (r_ != ncclSuccess) FATAL("%s: %s", #x, ncclGetErrorString(r_)); } while (0)

static double used_mib(int dev) {
    size_t fr = 0, tot = 0;
    CU(cudaSetDevice(dev));
    CU(cudaMemGetInfo(&fr, &tot));
    return (double)(tot - fr) / (1 << 20);
}

static double g_ctx, g_backend, g_kernels, g_nccl;
static int g_ndev;

static void test_measure(void) {
    CU(cudaGetDeviceCount(&g_ndev));
    CU(cudaSetDevice(0));
    CU(cudaFree(0));  // the context
    g_ctx = used_mib(0);
    Err e = {{0}};
    Backend* be = cuda_backend_create(DTYPE_BF16, 0, NULL, &e);
    EXPECT(be, "cuda backend: %s", e.msg);
    if (!be) return;
    be->sync(be);
    const double b1 = used_mib(0);
    g_backend = b1 - g_ctx;
    // a dense GEMM and a grouped one, Mixtral-like widths (kernel modules load on first use)
    const int M = 512, N = 1024, K = 512, G = 4;
    void* A = be->alloc(be, (size_t)M * K * 2);
    void* B = be->alloc(be, (size_t)G * N * K * 2);
    void* C = be->alloc(be, (size_t)M * N * 2);
    const double b2 = used_mib(0);
    GemmDesc d = {.M = M, .N = N, .K = K, .trans_b = 1, .alpha = 1};
    be->gemm(be, &d, A, B, C);
    int off[G + 1];
    for (int g = 0; g <= G; g++) off[g] = g * M / G;
    GroupDesc gd = {.groups = G, .host_off = off, .b_stride = (size_t)N * K};
    be->gemm_grouped(be, &d, &gd, A, B, C);
    be->sync(be);
    g_kernels = used_mib(0) - b2;
    be->free(be, A), be->free(be, B), be->free(be, C);
    // NCCL over up to 2 GPUs of this process
    const int nd = g_ndev >= 2 ? 2 : 1;
    ncclComm_t comms[2];
    int devs[2] = {0, 1};
    const double n0 = used_mib(0);
    NC(ncclCommInitAll(comms, nd, devs));
    float* buf[2];
    cudaStream_t st[2];
    const size_t n = (size_t)1 << 24;  // 64 MiB: every protocol and channel in use
    for (int i = 0; i < nd; i++) {
        CU(cudaSetDevice(i));
        CU(cudaStreamCreate(&st[i]));
        CU(cudaMalloc((void**)&buf[i], n * sizeof(float)));
    }
    NC(ncclGroupStart());
    for (int i = 0; i < nd; i++) NC(ncclAllReduce(buf[i], buf[i], n, ncclFloat, ncclSum, comms[i], st[i]));
    NC(ncclGroupEnd());
    NC(ncclGroupStart());
    for (int i = 0; i < nd; i++)
        for (int p = 0; p < nd; p++) {
            NC(ncclSend(buf[i] + (size_t)p * (n / 2), n / 4, ncclFloat, p, comms[i], st[i]));
            NC(ncclRecv(buf[i] + (size_t)p * (n / 2) + n / 4, n / 4, ncclFloat, p, comms[i], st[i]));
        }
    NC(ncclGroupEnd());
    for (int i = 0; i < nd; i++) {
        CU(cudaSetDevice(i));
        CU(cudaStreamSynchronize(st[i]));
    }
    g_nccl = used_mib(0) - n0 - (double)n * sizeof(float) / (1 << 20);  // less the buffer itself
    for (int i = 0; i < nd; i++) {
        CU(cudaSetDevice(i));
        CU(cudaFree(buf[i]));
        CU(cudaStreamDestroy(st[i]));
        NC(ncclCommDestroy(comms[i]));
    }
    be->destroy(be);
}

static void test_against_plan(void) {
    const double ctx_est = PLAN_CUDA_CONTEXT_BYTES / (1 << 20), lib_est = (double)(CUDA_LT_WS_BYTES + CUDA_SCRATCH_BYTES) / (1 << 20);
    // a one-rank communicator: NCCL's fixed cost alone (plan counts it once a process uses NCCL);
    // two ranks: that and one communicator's buffers
    const double nccl_est = (PLAN_NCCL_BASE_BYTES + (g_ndev >= 2 ? PLAN_NCCL_COMM_BYTES : 0)) / (1 << 20);
    printf("check gpu memory (MiB, device 0 of %d)   measured   plan\n", g_ndev);
    printf("  context (cudaFree(0))                %9.1f\n", g_ctx);
    printf("  backend (cuBLASLt handle, workspace, scratch) %9.1f  %7.1f (workspace + scratch)\n", g_backend, lib_est);
    printf("  kernels loaded by the first GEMMs     %9.1f\n", g_kernels);
    printf("  context + kernels + handle overhead    %9.1f  %7.1f\n", g_ctx + g_kernels + (g_backend - lib_est), ctx_est);
    printf("  NCCL, one communicator of %d rank(s)    %9.1f  %7.1f\n", g_ndev >= 2 ? 2 : 1, g_nccl, nccl_est);
    const char* inj = getenv("CUDA_INJECTION64_PATH");
    const char* pre = getenv("LD_PRELOAD");
    if ((inj && inj[0]) || (pre && strstr(pre, "sanitizer"))) {
        printf("  under a CUDA tool (CUDA_INJECTION64_PATH / LD_PRELOAD): its own allocations count too; not compared\n");
        return;
    }
    EXPECT(g_ctx > 0 && g_backend >= lib_est, "measurements are real: context %.1f, backend %.1f MiB", g_ctx, g_backend);
    EXPECT(g_ctx + g_kernels + (g_backend - lib_est) <= ctx_est,
           "the context and kernels take %.1f MiB, plan counts %.1f (raise PLAN_CUDA_CONTEXT_BYTES)",
           g_ctx + g_kernels + (g_backend - lib_est), ctx_est);
    EXPECT(g_nccl <= nccl_est, "a %d-rank NCCL communicator takes %.1f MiB, plan counts %.1f (raise %s)", g_ndev >= 2 ? 2 : 1,
           g_nccl, nccl_est, g_ndev >= 2 ? "PLAN_NCCL_COMM_BYTES" : "PLAN_NCCL_BASE_BYTES");
}

int main(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("skip: no GPU, nothing measured\n0 passed, 0 failed\n");
        return 0;
    }
    RUN(test_measure);
    RUN(test_against_plan);
    TEST_END();
}
