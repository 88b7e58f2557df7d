// tma.cuh — the Hopper pieces of the warp-specialised attention kernels (cuda_attn_fwd_ws.cu,
// cuda_attn_bwd_ws.cu): mbarriers, Tensor Memory Accelerator loads, named barriers (device), and
// the tensor maps (host). sm_90a only, as wgmma.cuh: elsewhere the device parts compile to nothing
// and the host never selects these kernels.
//
// An mbarrier counts arrivals and, for TMA loads, bytes: a "full" barrier completes its phase when
// its expected arrivals came (arrive.expect_tx counts as one) and every byte announced landed; a
// consumer waits on a phase's parity. Stage s of a ring of NS is used for the u-th time by item
// it = u·NS + s: consumers wait on full[s] with parity u & 1, the producer (before refilling it)
// on empty[s] with parity (u − 1) & 1.
#pragma once
#include <cuda.h>

#include "wgmma.cuh"

// Each file including this has its own flag (no relocatable device code): set when an mbarrier
// wait gave up (mbar_wait) — a bug, never a slow load. Read and cleared by the file's
// cuda_attn_*_ws_stalled, which the backend's sync calls (and stops the run).
static __device__ int g_tma_stalled;

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
#if WG_DEVICE
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
// After every mbar_init, by the initialising thread, before the block barrier that publishes them.
__device__ __forceinline__ void mbar_init_fence() {
#if WG_DEVICE
    asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {  // arrive + expect bytes
#if WG_DEVICE
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {  // release: earlier shared writes are seen
#if WG_DEVICE
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
// Waits until the phase with this parity has completed, or ~2^26 polls (seconds) have passed: then
// it sets g_tma_stalled and returns, so that a broken pipeline fails a test instead of hanging the
// GPU (a __trap here costs the kernel its setmaxnreg register split: ptxas spills).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if WG_DEVICE
    uint32_t done = 0;
    for (long n = 0;; n++) {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
        if (done) return;
        if (n > (1l << 26)) {
            g_tma_stalled = 1;
            return;
        }
    }
#endif
}
// One TMA box of a 4-d tensor map (coordinates innermost first) into shared memory at dst; its
// bytes complete on bar.
__device__ __forceinline__ void tma_load4(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                          uint32_t bar) {
#if WG_DEVICE
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
        "[%6];\n" ::"r"(dst),
        "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
#endif
}
// The same for a 3-d map (the grouped GEMM's operands, dev/cuda/cuda_gemm_wg.cu).
__device__ __forceinline__ void tma_load3(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, uint32_t bar) {
#if WG_DEVICE
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
        "[%5];\n" ::"r"(dst),
        "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
#endif
}
// One contiguous global → shared copy of `bytes` (a multiple of 16; src and dst on 16 bytes)
// completing on bar.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
#if WG_DEVICE
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
#endif
}
// Named barriers (0 is __syncthreads): NT threads take part, NT a multiple of 32.
template <int NT>
__device__ __forceinline__ void nbar_sync(int id) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(NT) : "memory");
}
template <int NT>
__device__ __forceinline__ void nbar_arrive(int id) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(NT) : "memory");
}
// The register split of a warp-specialised CTA: every warp of a warpgroup runs it.
template <int N>
__device__ __forceinline__ void reg_dealloc() {
#if WG_DEVICE
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N) : "memory");
#endif
}
template <int N>
__device__ __forceinline__ void reg_alloc() {
#if WG_DEVICE
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N) : "memory");
#endif
}

// Host: this file's g_tma_stalled, cleared when set (one 4-byte read otherwise); synchronizes.
static inline int tma_stalled_take(void) {
    int v = 0;
    CUDA_CK(cudaMemcpyFromSymbol(&v, g_tma_stalled, sizeof v));
    if (v) {
        const int z = 0;
        CUDA_CK(cudaMemcpyToSymbol(g_tma_stalled, &z, sizeof z));
    }
    return v;
}

// Host (tma.cu): cuTensorMapEncodeTiled through the runtime's driver entry point, or NULL.
#include <cudaTypedefs.h>
PFN_cuTensorMapEncodeTiled_v12000 tma_encode_fn(void);
// Host (tma.cu): a [B, T, H, 128] bf16 tensor as a TMA map of boxes of 64 columns × `rows` rows
// of one (b, h) — one SW128 slab of wgmma.cuh (128-byte swizzle). 0 when the driver offers no
// cuTensorMapEncodeTiled or refuses the map (the caller falls back to another kernel).
int tma_map_bthd(CUtensorMap* m, const bf16* p, int B, int T, int H, int rows);
