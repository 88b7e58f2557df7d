// racecheck_probe.cu — what compute-sanitizer's racecheck reports on the release pattern of our
// warp-specialised kernels, on a pipeline small enough to check by eye.
//
// A producer warp writes a stage of shared memory with plain stores and every lane arrives on the
// stage's "full" mbarrier; a consumer warp waits on it, reads the stage with plain loads, and
// releases it on "empty", which the producer waits on before it rewrites the stage, in one of two
// forms:
//   lane0  __syncwarp(), then lane 0 alone arrives (empty counts 1 per warp): what every
//          warp-specialised kernel here does for the stages TMA fills and wgmma reads (racecheck
//          follows neither)
//   all    every lane arrives (empty counts 32): what k_attn_dkdv_ws's lse/Δ stage and
//          dev/cuda/cuda_gemm_wg.cu's staging tile, written and read with plain shared accesses, do
// Both are correct under the PTX memory model: mbarrier.arrive releases and try_wait acquires at
// CTA scope, and __syncwarp orders the warp's accesses before lane 0's arrival. The binary checks
// the values the consumer read (a race would show as a wrong sum) and prints
// `N passed, N failed`; run under `compute-sanitizer --tool racecheck` it says whether the tool
// follows the first form (with CUDA 13.0's sanitizer it does not, and reports the producer's
// stores against the consumer's loads; the second form is clean). Built by `make dev`:
//   compute-sanitizer --tool racecheck build/dev/racecheck_probe lane0|all
#include <stdio.h>
#include <string.h>

#include "tma.cuh"

enum { NS = 2, ITEMS = 64, W = 32 };

template <bool ALL>
__global__ void k_probe(float* out) {
    __shared__ float stage[NS][W];
    __shared__ __align__(8) unsigned long long bars[2 * NS];
    const uint32_t full0 = (uint32_t)__cvta_generic_to_shared(&bars[0]), empty0 = full0 + 8 * NS;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) {
        for (int s = 0; s < NS; s++) mbar_init(full0 + 8 * s, W), mbar_init(empty0 + 8 * s, ALL ? W : 1);
        mbar_init_fence();
    }
    __syncthreads();
    if (warp == 1) {  // producer
        for (int it = 0; it < ITEMS; it++) {
            const int s = it % NS, u = it / NS;
            if (it >= NS) mbar_wait(empty0 + 8 * s, (u + 1) & 1);
            stage[s][lane] = (float)(it * W + lane);
            mbar_arrive(full0 + 8 * s);
        }
    } else {  // consumer
        float acc = 0.f;
        for (int it = 0; it < ITEMS; it++) {
            const int s = it % NS, u = it / NS;
            mbar_wait(full0 + 8 * s, u & 1);
            acc += stage[s][(lane + it) % W];  // another lane's value: the stage is shared
            if (ALL) {
                mbar_arrive(empty0 + 8 * s);
            } else {
                __syncwarp();
                if (lane == 0) mbar_arrive(empty0 + 8 * s);
            }
        }
        out[lane] = acc;
    }
}

int main(int argc, char** argv) {
    const bool all = argc > 1 && !strcmp(argv[1], "all");
    if (argc < 2 || (!all && strcmp(argv[1], "lane0"))) {
        fprintf(stderr, "usage: racecheck_probe lane0|all\n");
        return 2;
    }
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess || major < 9) {
        printf("racecheck_probe: no sm_90 GPU (the probe uses mbarriers); skipped\n0 passed, 0 failed\n");
        return 0;
    }
    float* d = NULL;
    float h[W];
    cudaMalloc(&d, sizeof h);
    if (all) k_probe<true><<<1, 64>>>(d);
    else k_probe<false><<<1, 64>>>(d);
    const cudaError_t e = cudaDeviceSynchronize();
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    cudaFree(d);
    int bad = e != cudaSuccess;
    for (int l = 0; l < W && !bad; l++) {
        double want = 0;  // item it, lane l read it·W + (l + it) % W
        for (int it = 0; it < ITEMS; it++) want += it * W + (l + it) % W;
        bad = h[l] != (float)want;
    }
    printf("%s racecheck_probe %s: %s\n%d passed, %d failed\n", bad ? "FAIL" : "ok  ", argv[1],
           e != cudaSuccess ? cudaGetErrorString(e) : bad ? "wrong values" : "the consumer read every stage as written",
           !bad, bad);
    return bad;
}
