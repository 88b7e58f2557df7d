// mpi_optim_split.c — the optimizer with split fp32 masters (precision.master=split) under
// mpirun -np 2, on the CPU: ZeRO-1 over the world and over edp, ZeRO-1 off, and an expert arena
// of one rank (ep 2), against the same optimizer with fp32 masters on identical gradients.
//
// The CPU backend computes in fp32, so the trainer never splits there. Here a second CPU backend
// is marked bf16 (act_dtype = DTYPE_BF16): its arenas then hold bf16 compute weights, and only
// the optimizer runs on it (no forward: the CPU ops would read those weights as fp32), which
// uses split_pack / split_unpack / adamw_split (bf16 bits whatever the act dtype) and never
// f32_to_act. That exercises all of optim.c's split path with real collectives:
//   - after optim_load_from_staging and after every step, on every rank, every compute weight of
//     both arenas is the tie-away rounding of the fp32 side's master (each rank packs its owned
//     slice; the all-gather / the full-arena pack make the rest agree);
//   - optim_gather of masters, m and v equals the fp32 side's bit for bit (CPU: the same double
//     arithmetic, so the masters agree exactly);
//   - a resume as trainer_restore does it (stage the fp32 side's gathered masters, load, scatter
//     m and v into a fresh split optimizer) continues bit for bit;
//   - gather → scatter of the split masters changes nothing.
// The init has ties (low half 0x8000) planted, so the tie-away rounding is seen at load.
#define _GNU_SOURCE
#include <mpi.h>
#include <stdint.h>

#include "backend.h"
#include "comm.h"
#include "model.h"
#include "optim.h"
#include "mpi_test.h"
#include "util.h"

static int g_ep, g_zero1;
static Comm* g_c;
static Backend *g_be32, *g_be16;

static const ModelConfig MC = {.vocab_size = 37, .hidden = 12, .ffn = 10, .layers = 2, .heads = 2, .kv_heads = 1,
                               .experts = 4, .top_k = 2, .max_seq = 16, .rope_theta = 10000, .rms_eps = 1e-5f,
                               .init_std = 0.5f, .aux_coef = 0.02f};
static const OptimConfig OC = {.lr = 1e-2f, .min_lr_ratio = 1.0f, .schedule = SCHED_CONSTANT, .beta1 = 0.9f,
                               .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .clip = 1.0f};

typedef struct Side {
    Model m;
    Optim o;
} Side;

static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

// Finite x to bf16 bits, nearest, ties away from zero, by value (as in test_cpu_optim.c).
static uint16_t bf16_away(float x) {
    const uint32_t hi = bits_of(x) >> 16;
    const double ax = fabs((double)x), t = fabs((double)bf16_to_f32((uint16_t)hi));
    const uint32_t up_bits = (hi + 1) & 0xffffu;
    const double up = (up_bits & 0x7fffu) == 0x7f80u ? ldexp(1, 128) : fabs((double)bf16_to_f32((uint16_t)up_bits));
    return (uint16_t)(up - ax <= ax - t ? hi + 1 : hi);
}

static void side_create(Side* s, Backend* be) {
    model_create(&s->m, &MC, 1, 4, be, g_c);
    optim_create(&s->o, &OC, g_zero1, MASTER_SPLIT, 100, &s->m);
}

static void side_free(Side* s) {
    optim_free(&s->o, &s->m);
    model_free(&s->m);
}

// The init by name, every 5th element made a tie (low half 0x8000), staged and loaded.
static void side_init(Side* s) {
    for (int a = 0; a < 2; a++) memset(s->m.grad[a], 0, sizeof(float) * s->m.padded[a]);
    for (int i = 0; i < s->m.pl.n; i++) {
        const ParamInfo* p = &s->m.pl.p[i];
        float* dst = s->m.grad[p->arena] + p->offset;
        model_init_tensor(&MC, p, 99, dst);
        for (size_t j = 0; j < p->numel; j += 5) {
            uint32_t u = (bits_of(dst[j]) & 0xffff0000u) | 0x8000u;
            memcpy(&dst[j], &u, sizeof u);
        }
    }
    optim_load_from_staging(&s->o, &s->m);
}

// Gradients of step `step`, the same on both sides, different per rank; padding stays zero.
static void set_grads(Side* s, int step) {
    for (int a = 0; a < 2; a++) {
        Rng r;
        rng_seed(&r, 1000u * (uint64_t)step + 10u * (uint64_t)mt_rank + (uint64_t)a + 1);
        memset(s->m.grad[a], 0, sizeof(float) * s->m.padded[a]);
        for (size_t i = 0; i < s->m.numel[a]; i++) s->m.grad[a][i] = 0.05f * rng_normal(&r);
    }
}

// Every compute weight of the split side (bf16 bits) against the fp32 side's (= its masters):
// the number that are not the tie-away rounding, summed over the ranks. *ties counts the masters
// whose low half is 0x8000.
static long weights_off(const Side* sp, const Side* f, long* ties) {
    long bad = 0, t = 0;
    for (int a = 0; a < 2; a++) {
        const uint16_t* w = sp->m.w[a];
        const float* x = f->m.w[a];
        for (size_t i = 0; i < f->m.padded[a]; i++) {
            bad += w[i] != bf16_away(x[i]);
            t += (bits_of(x[i]) & 0xffffu) == 0x8000u;
        }
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (ties) *ties = t;
    return bad;
}

// optim_gather of masters (0), m (1), v (2) on both sides: elements that differ in bits,
// summed over the ranks and arenas. Leaves the staging zeroed.
static long state_off(Side* x, Side* y, int which) {
    long bad = 0;
    for (int a = 0; a < 2; a++) {
        optim_gather(&x->o, &x->m, a, which);
        optim_gather(&y->o, &y->m, a, which);
        for (size_t i = 0; i < x->m.padded[a]; i++) bad += bits_of(x->m.grad[a][i]) != bits_of(y->m.grad[a][i]);
        memset(x->m.grad[a], 0, sizeof(float) * x->m.padded[a]);
        memset(y->m.grad[a], 0, sizeof(float) * y->m.padded[a]);
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    return bad;
}

// One step on both sides with the same gradients: the grad norms agree exactly.
static void step_both(Side* f, Side* sp, int step) {
    set_grads(f, step);
    set_grads(sp, step);
    StepStats a = optim_step(&f->o, &f->m, step, step + 1), b = optim_step(&sp->o, &sp->m, step, step + 1);
    EXPECT(!a.skipped && !b.skipped && a.grad_norm == b.grad_norm, "step %d: grad norm %.17g vs %.17g", step,
           b.grad_norm, a.grad_norm);
}

static void test_split_steps(void) {
    Side f, sp;
    side_create(&f, g_be32);
    side_create(&sp, g_be16);
    EXPECT(!f.o.split && sp.o.split, "split only with bf16 compute weights (%d, %d)", f.o.split, sp.o.split);
    for (int a = 0; a < 2; a++)
        EXPECT(sp.o.sh[a].master == NULL && sp.o.sh[a].rem && f.o.sh[a].master && !f.o.sh[a].rem,
               "arena %d: remainders instead of fp32 masters", a);
    side_init(&f);
    side_init(&sp);
    long ties = 0;
    long off = weights_off(&sp, &f, &ties);
    EXPECT(off == 0 && ties > 50, "after load: %ld compute weights are not the tie-away rounding (%ld ties)", off, ties);
    off = state_off(&f, &sp, 0);
    EXPECT(off == 0, "after load: %ld gathered masters differ", off);
    for (int step = 0; step < 3; step++) {
        step_both(&f, &sp, step);
        off = weights_off(&sp, &f, NULL);
        EXPECT(off == 0, "step %d: %ld compute weights are not the tie-away rounding of the master", step, off);
    }
    for (int which = 0; which < 3; which++) {
        off = state_off(&f, &sp, which);
        EXPECT(off == 0, "after 3 steps: %ld elements of %s differ", off, which == 0 ? "masters" : which == 1 ? "m" : "v");
    }
    // gather → scatter of the split masters is the identity on w and rem
    for (int a = 0; a < 2; a++) {
        const OptShard* s = &sp.o.sh[a];
        int16_t* rem0 = xmalloc(2 * s->n);
        uint16_t* w0 = xmalloc(2 * sp.m.padded[a]);
        memcpy(rem0, s->rem, 2 * s->n);
        memcpy(w0, sp.m.w[a], 2 * sp.m.padded[a]);
        optim_gather(&sp.o, &sp.m, a, 0);
        optim_scatter(&sp.o, &sp.m, a, 0);
        memset(sp.m.grad[a], 0, sizeof(float) * sp.m.padded[a]);
        EXPECT(!memcmp(rem0, s->rem, 2 * s->n) && !memcmp(w0, sp.m.w[a], 2 * sp.m.padded[a]),
               "arena %d: gather → scatter changed the split masters", a);
        free(rem0), free(w0);
    }
    // resume as trainer_restore does: masters → load_from_staging, then m and v scattered
    Side r;
    side_create(&r, g_be16);
    for (int a = 0; a < 2; a++) {
        optim_gather(&f.o, &f.m, a, 0);
        memcpy(r.m.grad[a], f.m.grad[a], sizeof(float) * f.m.padded[a]);
        memset(f.m.grad[a], 0, sizeof(float) * f.m.padded[a]);
    }
    optim_load_from_staging(&r.o, &r.m);
    for (int which = 1; which < 3; which++)
        for (int a = 0; a < 2; a++) {
            optim_gather(&f.o, &f.m, a, which);
            memcpy(r.m.grad[a], f.m.grad[a], sizeof(float) * f.m.padded[a]);
            memset(f.m.grad[a], 0, sizeof(float) * f.m.padded[a]);
            optim_scatter(&r.o, &r.m, a, which);
            memset(r.m.grad[a], 0, sizeof(float) * r.m.padded[a]);
        }
    for (int a = 0; a < 2; a++)
        EXPECT(!memcmp(r.o.sh[a].rem, sp.o.sh[a].rem, 2 * sp.o.sh[a].n) &&
                   !memcmp(r.m.w[a], sp.m.w[a], 2 * sp.m.padded[a]),
               "arena %d: the resumed split masters are not the running ones", a);
    for (int step = 3; step < 5; step++) {
        step_both(&f, &r, step);
        off = weights_off(&r, &f, NULL);
        EXPECT(off == 0, "resumed, step %d: %ld compute weights are not the tie-away rounding", step, off);
    }
    for (int which = 0; which < 3; which++) {
        off = state_off(&f, &r, which);
        EXPECT(off == 0, "resumed, after step 5: %ld elements of %s differ", off, which == 0 ? "masters" : which == 1 ? "m" : "v");
    }
    side_free(&r);
    side_free(&sp);
    side_free(&f);
}

int main(int argc, char** argv) {
    mpi_test_init(&argc, &argv, "mpi_optim_split");
    g_be32 = cpu_backend_create();
    g_be16 = cpu_backend_create();
    g_be16->act_dtype = DTYPE_BF16;  // arenas of bf16 compute weights; only optimizer ops run on it
    const int cases[][2] = {{1, 1}, {2, 1}, {1, 0}};  // (ep, zero1)
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        g_ep = cases[i][0], g_zero1 = cases[i][1];
        if (mt_world % g_ep) continue;
        mpi_test_note("(ep=%d, zero1=%d)", g_ep, g_zero1);
        g_c = comm_mpi_create(g_ep);
        MRUN(test_split_steps);
        g_c->destroy(g_c);
    }
    g_be16->destroy(g_be16);
    g_be32->destroy(g_be32);
    MPI_TEST_END();
}
