// test_wgmma_probe.c — the Hopper wgmma building blocks (cuda/wgmma.cuh: SW128 tiles, K-major and
// MN-major descriptors, A from shared memory or registers, acc = 0 overwriting) against a host
// product, through cuda_wgmma_selftest. On a GPU that is not compute capability 9.0, or a build
// for another SM, the attention kernels never take the wgmma path and this test says so. Built by
// `make dev` with dev/cuda/wgmma_probe.cu.
#include "gpu_check.h"

int cuda_wgmma_selftest(Backend* be, char* report, size_t cap);

static void test_wgmma_forms(void) {
    char rep[2048];
    const int f = cuda_wgmma_selftest(g_modes[1].gpu, rep, sizeof rep);
    (void)rep;  // the probe printed each form's line as it ran
    if (f < 0) {
        printf("  (wgmma path unavailable here: nothing to check)\n");
        return;
    }
    EXPECT(f == 0, "%d wgmma form(s) disagree with the host product (report above)", f);
}

int main(void) {
    if (gpu_setup("test_wgmma_probe")) return 1;
    RUN(test_wgmma_forms);
    gpu_teardown();
    TEST_END();
}
