#define _GNU_SOURCE
// mpi_generate.c — decoding under mpirun (2 ranks): the experts sharded EP = 2 (each rank holds
// half of them; the same dispatch and exchange as training) give the same greedy tokens and the
// same logits as EP = 1 (every expert on each rank), for two prompts of different lengths in one
// batch, and every rank holds the same tokens.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "gen_util.h"
#include "generate.h"
#include "mpi_test.h"

enum { B = 2, STEPS = 24, PMAX = 6 };

// Greedy decoding of the two prompts with the experts over `ep` ranks: tokens [B·STEPS] and the
// logits of every step [STEPS·B·V].
static void run(Backend* be, int ep, int32_t* toks, float* logits) {
    Comm* comm = comm_mpi_create(ep);
    ModelConfig c = gen_test_config();
    const int V = c.vocab_size;
    Model m;
    model_create(&m, &c, B, PMAX, be, comm);
    gen_test_weights(&m, 99);
    Gen g;
    gen_create(&g, &m, PMAX + STEPS);
    const int plen[B] = {PMAX, 3};
    int32_t pre[B * PMAX] = {5, 17, 3, 40, 22, 9, /* */ 11, 2, 30, 0, 0, 0};
    int last[B] = {plen[0] - 1, plen[1] - 1};
    gen_forward(&g, pre, PMAX, plen, last);
    for (int s = 0; s < STEPS; s++) {
        memcpy(logits + (size_t)s * B * V, g.h_logits, sizeof(float) * B * V);
        int32_t one[B];
        for (int b = 0; b < B; b++) one[b] = toks[b * STEPS + s] = gen_sample(g.h_logits + (size_t)b * V, V, 0.f, 0, 1.f, NULL, NULL);
        if (s + 1 < STEPS) gen_forward(&g, one, 1, NULL, NULL);
    }
    gen_free(&g);
    model_free(&m);
    comm->destroy(comm);
}

static void test_ep2_equals_ep1(void) {
    Backend* be = cpu_backend_create();
    const int V = gen_test_config().vocab_size;
    int32_t t1[B * STEPS], t2[B * STEPS];
    float* l1 = xmalloc(sizeof(float) * STEPS * B * V);
    float* l2 = xmalloc(sizeof(float) * STEPS * B * V);
    run(be, 1, t1, l1);
    run(be, 2, t2, l2);
    EXPECT(!memcmp(t1, t2, sizeof t1), "EP = 2 greedy tokens differ from EP = 1");
    double worst = 0;
    for (size_t i = 0; i < (size_t)STEPS * B * V; i++) worst = fmax(worst, fabs(l1[i] - l2[i]) / (1 + fabs(l1[i])));
    EXPECT(worst <= 1e-5, "EP = 2 logits differ from EP = 1 by %g", worst);
    int distinct = 0;
    for (int i = 1; i < B * STEPS; i++) distinct += t1[i] != t1[0];
    EXPECT(distinct > 0, "every token the same: a weak test");
    // every rank holds the same tokens: the sum over ranks is world × this rank's
    double sum[B * STEPS], mine[B * STEPS];
    for (int i = 0; i < B * STEPS; i++) sum[i] = mine[i] = t2[i];
    Comm* w = comm_mpi_create(1);
    w->host_all_reduce_f64(w, GROUP_WORLD, sum, B * STEPS);
    w->destroy(w);
    int same = 1;
    for (int i = 0; i < B * STEPS; i++) same &= sum[i] == mt_world * mine[i];
    EXPECT(same, "the ranks hold different tokens");
    mpi_test_note("(EP=2 vs EP=1, %d steps, logits within %.2g)", STEPS, worst);
    free(l1), free(l2);
    be->destroy(be);
}

int main(int argc, char** argv) {
    mpi_test_init(&argc, &argv, "mpi_generate");
    MRUN(test_ep2_equals_ep1);
    MPI_TEST_END();
}
