// attn_docs_bench.c — attention on packed documents against the same windows unmasked, timed:
// forward and backward (bf16, the step's workspace for dS) at Mixtral-8x7B's attention shape,
// B = 8, T = 4096, Hq = 32, Hkv = 8, D = 128, on windows cut into documents of random lengths.
// A measurement printed, nothing asserted. Built by `make dev` into build/dev/attn_docs_bench;
// needs a GPU. The correctness tests are tests/gpu/test_cuda_attn_docs.c.
//
//   attn_docs_bench [MIN MAX]   document lengths uniform in [MIN, MAX] (default 200 500)
#include <stdlib.h>
#include <string.h>

#include "dev_bench.h"

// Window row doc [T] cut into documents of random lengths in [lo, hi].
static void docs_random(int32_t* doc, int T, int lo, int hi) {
    int s = 0, len = lo + (int)(rng_u64(&g_rng) % (uint64_t)(hi - lo + 1));
    for (int t = 0; t < T; t++) {
        if (t == s + len) s = t, len = lo + (int)(rng_u64(&g_rng) % (uint64_t)(hi - lo + 1));
        doc[t] = s;
    }
}

typedef struct DocBench {
    Backend* be;
    void *q, *k, *v, *o, *g, *dq, *dk, *dv, *ws;
    float* lse;
    size_t ws_bytes;
    const int32_t* doc;
    int B, T, Hq, Hkv, D;
} DocBench;

static void b_fwd(void* c_) {
    DocBench* c = c_;
    c->be->attn_fwd(c->be, c->o, c->lse, c->q, c->k, c->v, c->B, c->T, c->Hq, c->Hkv, c->D, c->doc);
}
static void b_bwd(void* c_) {
    DocBench* c = c_;
    c->be->attn_bwd(c->be, c->dq, c->dk, c->dv, c->g, c->o, c->lse, c->q, c->k, c->v, c->B, c->T, c->Hq, c->Hkv, c->D,
                    c->ws, c->ws_bytes, c->doc);
}

static void bench_docs(int lo, int hi) {
    Backend* be = g_modes[1].gpu;  // bf16
    const int B = 8, T = 4096, Hq = 32, Hkv = 8, D = 128;
    const size_t nq = (size_t)B * T * Hq * D, nk = (size_t)B * T * Hkv * D, nr = 1 << 20;
    float* r = randn(nr, 1.f);
    DocBench c = {.be = be, .B = B, .T = T, .Hq = Hq, .Hkv = Hkv, .D = D};
    c.q = rand_act(be, r, nr, nq), c.k = rand_act(be, r + 7, nr - 7, nk), c.v = rand_act(be, r + 13, nr - 13, nk);
    c.g = rand_act(be, r + 29, nr - 29, nq);
    c.o = dev_alloc(be, 2 * nq), c.dq = dev_alloc(be, 2 * nq), c.dk = dev_alloc(be, 2 * nk), c.dv = dev_alloc(be, 2 * nk);
    c.lse = dev_alloc(be, 4 * (size_t)B * Hq * T);
    const size_t nt = (size_t)(T + 63) / 64;
    c.ws_bytes = (size_t)B * Hkv * (size_t)(Hq / Hkv) * (nt * (nt + 1) / 2) * 64 * 64 * 2;  // every pair's dS
    c.ws = dev_alloc(be, c.ws_bytes);
    int32_t* doc = xmalloc(sizeof(int32_t) * (size_t)B * T);
    int ndocs = 0;
    for (int b = 0; b < B; b++) {
        docs_random(doc + (size_t)b * T, T, lo, hi);
        for (int t = 0; t < T; t++) ndocs += doc[(size_t)b * T + t] == t;
    }
    int32_t* ddoc = up_i32(be, doc, (size_t)B * T);
    double ms[2][2];
    for (int d = 0; d < 2; d++) {
        c.doc = d ? ddoc : NULL;
        ms[d][0] = time_ms(be, b_fwd, &c, 10);
        ms[d][1] = time_ms(be, b_bwd, &c, 5);
    }
    printf("attention B=%d T=%d Hq=%d Hkv=%d D=%d bf16, %d documents of %d-%d tokens (mean %.0f)\n", B, T, Hq, Hkv, D,
           ndocs, lo, hi, (double)B * T / ndocs);
    printf("  unmasked (one causal window): fwd %8.3f ms  bwd %8.3f ms  fwd+bwd %8.3f ms\n", ms[0][0], ms[0][1],
           ms[0][0] + ms[0][1]);
    printf("  documents (block-diagonal):   fwd %8.3f ms  bwd %8.3f ms  fwd+bwd %8.3f ms  (%.2fx faster)\n", ms[1][0],
           ms[1][1], ms[1][0] + ms[1][1], (ms[0][0] + ms[0][1]) / (ms[1][0] + ms[1][1]));
    free(r), free(doc);
    dev_free_all();
}

int main(int argc, char** argv) {
    const int lo = argc > 2 ? atoi(argv[1]) : 200, hi = argc > 2 ? atoi(argv[2]) : 500;
    if (lo < 1 || hi < lo || hi > 4096) {
        fprintf(stderr, "usage: attn_docs_bench [MIN MAX] (document lengths, 1 <= MIN <= MAX <= 4096)\n");
        return 2;
    }
    (void)t_passed, (void)t_failed;  // tests/test.h's counters: nothing is asserted here
    if (gpu_setup("attn_docs_bench")) return 1;
    bench_docs(lo, hi);
    gpu_teardown();
    return 0;
}
