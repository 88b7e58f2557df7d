// test_cuda_generate.c — src/generate.c on the CUDA backend against the CPU backend (the spec):
// the same small GQA Mixtral (tests/gen_util.h), three prompts of different lengths batched,
// prefill then 40 one-token steps fed the CPU's greedy tokens on both (teacher forcing, so one
// near-tie cannot derail the rest). fp32: every step's logits within TOL_GEN of the CPU's, and the
// GPU's own greedy choice equal to the CPU's at every step. bf16: the logits' error is printed (a
// measurement) and held only to TOL_GEN_BF16, which catches garbage, not bf16 rounding. Needs a GPU.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "comm.h"
#include "gen_util.h"
#include "generate.h"
#include "test.h"

// fp32 on both sides; the GEMMs, norms and attention sum in other orders (~1e-6 each), and the
// error grows through the layers and the cache: 1e-4 relative L2 leaves room without hiding a
// wrong position or a wrong cache row (those give O(1) errors).
#define TOL_GEN 1e-4
// bf16 weights and activations against the fp32 CPU: ~1e-2 from rounding, more at a step where a
// near-tie sends a token to another expert; logits unrelated to the CPU's give ~1.4 (√2), a
// zeroed or NaN output 1 or more. 0.5 keeps the measurement from passing on garbage.
#define TOL_GEN_BF16 0.5

enum { B = 3, PMAX = 9, STEPS = 40 };

static int argmax(const float* x, int V) {
    int b = 0;
    for (int i = 1; i < V; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static double rel(const float* a, const float* b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / den);
}

static void run_pair(Backend* gpu, Comm* comm, int assert_it, const char* name) {
    Backend* cpu = cpu_backend_create();
    ModelConfig c = gen_test_config();
    const int V = c.vocab_size;
    Model mc, mg;
    model_create(&mc, &c, B, PMAX, cpu, comm);
    model_create(&mg, &c, B, PMAX, gpu, comm);
    gen_test_weights(&mc, 31);
    gen_test_weights(&mg, 31);
    Gen gc, gg;
    gen_create(&gc, &mc, PMAX + STEPS);
    gen_create(&gg, &mg, PMAX + STEPS);
    const int plen[B] = {PMAX, 2, 5};
    int32_t pre[B * PMAX] = {0};
    int last[B];
    Rng r;
    rng_seed(&r, 8);
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < plen[b]; i++) pre[b * PMAX + i] = (int32_t)(rng_u64(&r) % (uint64_t)V);
        last[b] = plen[b] - 1;
    }
    gen_forward(&gc, pre, PMAX, plen, last);
    gen_forward(&gg, pre, PMAX, plen, last);
    double worst = 0;
    int agree = 0, total = 0;
    for (int s = 0; s <= STEPS - 1; s++) {
        worst = fmax(worst, rel(gg.h_logits, gc.h_logits, (size_t)B * V));
        int32_t one[B];
        for (int b = 0; b < B; b++) {
            one[b] = argmax(gc.h_logits + (size_t)b * V, V);
            agree += argmax(gg.h_logits + (size_t)b * V, V) == one[b];
            total++;
        }
        if (s + 1 < STEPS) {
            gen_forward(&gc, one, 1, NULL, NULL);
            gen_forward(&gg, one, 1, NULL, NULL);
        }
    }
    printf("  %s: worst logits rel L2 %.3g over %d steps; greedy agreement %d/%d\n", name, worst, STEPS, agree, total);
    if (assert_it) {
        EXPECT(worst <= TOL_GEN, "%s: logits rel L2 %.3g > %.3g", name, worst, TOL_GEN);
        EXPECT(agree == total, "%s: greedy choices differ at %d of %d steps", name, total - agree, total);
    } else {
        EXPECT(worst <= TOL_GEN_BF16, "%s: logits rel L2 %.3g > %.3g: not bf16 rounding", name, worst, TOL_GEN_BF16);
    }
    gen_free(&gc), gen_free(&gg);
    model_free(&mc), model_free(&mg);
    cpu->destroy(cpu);
}

static Backend* g32;
static Backend* g16;
static Comm* g_comm;

static void test_generate_fp32(void) { run_pair(g32, g_comm, 1, "fp32"); }
static void test_generate_bf16_measured(void) { run_pair(g16, g_comm, 0, "bf16"); }

int main(int argc, char** argv) {
    int world;
    dist_init(&argc, &argv, &world);
    Err e = {{0}};
    g32 = cuda_backend_create(DTYPE_F32, 0, NULL, &e);
    g16 = g32 ? cuda_backend_create(DTYPE_BF16, 0, NULL, &e) : NULL;
    if (!g32 || !g16) {
        fprintf(stderr, "test_cuda_generate needs a GPU: %s\n", e.msg);
        printf("0 passed, 1 failed\n");
        dist_finalize();
        return 1;
    }
    g_comm = comm_mpi_create(1);
    RUN(test_generate_fp32);
    RUN(test_generate_bf16_measured);
    g_comm->destroy(g_comm);
    g32->destroy(g32), g16->destroy(g16);
    dist_finalize();
    TEST_END();
}
