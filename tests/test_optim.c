// test_optim.c — src/optim.c's learning-rate schedules (optim_lr): warmup, cosine, linear,
// constant, warmup-stable-decay. (The optimizer step itself: tests/test_cpu_optim.c per op,
// tests/mpi_optim_split.c sharded.)
#include <math.h>

#include "optim.h"
#include "test.h"

static void test_schedule(void) {
    OptimConfig c = {.lr = 1.0f, .min_lr_ratio = 0.1f, .warmup = 10, .decay_frac = 0.2f};
    const int total = 110;
    c.schedule = SCHED_COSINE;
    EXPECT(fabsf(optim_lr(&c, total, 0) - 0.1f) < 1e-6f && fabsf(optim_lr(&c, total, 9) - 1.0f) < 1e-6f, "linear warmup");
    EXPECT(fabsf(optim_lr(&c, total, 10) - 1.0f) < 1e-6f && fabsf(optim_lr(&c, total, 109) - 0.1f) < 1e-6f, "cosine ends at min");
    EXPECT(fabsf(optim_lr(&c, total, 59) - 0.55f) < 0.01f, "cosine midpoint %g", optim_lr(&c, total, 59));
    c.schedule = SCHED_LINEAR;
    EXPECT(fabsf(optim_lr(&c, total, 59) - 0.55f) < 0.01f && fabsf(optim_lr(&c, total, 109) - 0.1f) < 1e-6f, "linear");
    c.schedule = SCHED_CONSTANT;
    EXPECT(optim_lr(&c, total, 100) == 1.0f, "constant");
    c.schedule = SCHED_WSD;
    EXPECT(optim_lr(&c, total, 80) == 1.0f && fabsf(optim_lr(&c, total, 109) - 0.1f) < 1e-6f && optim_lr(&c, total, 100) < 1.0f,
           "wsd: stable, then decay in the last 20%%");
}

int main(void) {
    RUN(test_schedule);
    TEST_END();
}
