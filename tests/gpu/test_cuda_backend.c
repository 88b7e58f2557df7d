// test_cuda_backend.c — cuda/cuda_backend.cu's event ops (what src/prof.c reads for
// log.profile=events) and its comm_create (NCCL on the backend's stream). Needs a GPU.
#define _GNU_SOURCE
#include <stdio.h>

#include "backend.h"
#include "comm.h"
#include "prof.h"
#include "test.h"
#include "util.h"

static Backend* be;

// Events around stream work: each elapsed time is positive, and the pieces add up to the whole
// (a, b, c recorded in that order with copies between).
static void test_events(void) {
    const size_t n = (size_t)256 << 20;
    void* x = be->alloc(be, n);
    void* y = be->alloc(be, n);
    BackendEvent* ev[3];
    for (int i = 0; i < 3; i++) ev[i] = be->event_create(be);
    be->event_record(be, ev[0]);
    for (int r = 0; r < 4; r++) be->copy(be, y, x, n);
    be->event_record(be, ev[1]);
    for (int r = 0; r < 4; r++) be->copy(be, x, y, n);
    be->event_record(be, ev[2]);
    const double ab = be->event_elapsed(be, ev[0], ev[1]), bc = be->event_elapsed(be, ev[1], ev[2]),
                 ac = be->event_elapsed(be, ev[0], ev[2]);
    EXPECT(ab > 0 && bc > 0, "4 copies of 256 MiB take time: %.6f s, %.6f s", ab, bc);
    EXPECT(fabs(ab + bc - ac) < 1e-5 + 1e-3 * ac, "the pieces add up: %.6f + %.6f vs %.6f s", ab, bc, ac);
    for (int i = 0; i < 3; i++) be->event_destroy(be, ev[i]);
    be->free(be, x);
    be->free(be, y);
}

// prof.c in events mode on the GPU: the table of two counted steps names its stages.
static void test_prof_events(void) {
    const size_t n = (size_t)64 << 20;
    void* x = be->alloc(be, n);
    void* y = be->alloc(be, n);
    prof_init(be, PROFILE_EVENTS);
    for (int s = 0; s < 4; s++) {
        be->copy(be, y, x, n);
        prof_mark("copy");
        prof_mark("empty");
        prof_step_done();
    }
    char out[4096] = {0};
    FILE* f = fmemopen(out, sizeof out, "w");
    prof_report(f);
    fclose(f);
    prof_free();
    EXPECT(strstr(out, "profile: 2 steps") && strstr(out, "backend events") && strstr(out, "copy") &&
               strstr(out, "empty") && strstr(out, "host.other"),
           "the table:\n%s", out);
    be->free(be, x);
    be->free(be, y);
}

// comm_create: NCCL over a world of one (this test runs without mpirun).
static void test_comm_create(void) {
    Err e = {{0}};
    Comm* c = be->comm_create(be, &(CommOpts){.ep = 1}, &e);
    EXPECT(c, "comm_create: %s", e.msg);
    if (!c) return;
    EXPECT(c->size[GROUP_WORLD] == 1 && c->rank[GROUP_WORLD] == 0, "world %d, rank %d", c->size[GROUP_WORLD],
           c->rank[GROUP_WORLD]);
    float h[4] = {1, 2, 3, 4}, back[4];
    float* d = be->alloc(be, sizeof h);
    be->to_device(be, d, h, sizeof h);
    c->all_reduce_sum(c, GROUP_WORLD, d, 4);
    be->to_host(be, back, d, sizeof back);
    EXPECT(memcmp(back, h, sizeof h) == 0, "all_reduce over one rank keeps the values: %g %g %g %g", back[0], back[1],
           back[2], back[3]);
    be->free(be, d);
    c->destroy(c);
}

int main(int argc, char** argv) {
    int world;
    dist_init(&argc, &argv, &world);
    Err e = {{0}};
    be = cuda_backend_create(DTYPE_F32, 0, NULL, &e);
    if (!be) {
        printf("no CUDA backend: %s\n0 passed, 1 failed\n", e.msg);
        return 1;
    }
    RUN(test_events);
    RUN(test_prof_events);
    RUN(test_comm_create);
    be->destroy(be);
    dist_finalize();
    TEST_END();
}
