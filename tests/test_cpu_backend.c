// test_cpu_backend.c — src/cpu/cpu_backend.c: memory, casts and elementwise ops, sumsq, nonfinite
// against exact results and double sums; and every CPU op's independence of the thread count.
// Method and the tolerance table: tests/cpu_fd.h.
#include <omp.h>

#include "cpu_fd.h"

// ---- memory, casts, elementwise ----------------------------------------------------------------

static void test_memory(void) {
    const size_t n = 1000;
    const size_t peak0 = be->peak_bytes(be);
    float* p = be->alloc(be, n * sizeof(float));
    float* q = be->alloc(be, n * sizeof(float));
    EXPECT(be->peak_bytes(be) >= peak0 + 2 * n * sizeof(float), "peak_bytes counts live blocks");
    int zero = 1;
    for (size_t i = 0; i < n; i++) zero &= p[i] == 0 && q[i] == 0;
    EXPECT(zero, "alloc returns zeroed memory");
    float* h = rnd(n, 1);
    float* back = fill(n, -1);
    be->to_device(be, p, h, n * sizeof(float));
    be->copy(be, q, p, n * sizeof(float));
    be->to_host(be, back, q, n * sizeof(float));
    EXPECT(memcmp(back, h, n * sizeof(float)) == 0, "to_device → copy → to_host round trip is exact");
    be->zero(be, q, n * sizeof(float));
    zero = 1;
    for (size_t i = 0; i < n; i++) zero &= q[i] == 0;
    EXPECT(zero, "zero clears");
    be->free(be, p);
    be->free(be, q);
    be->free(be, NULL);  // allowed, no-op
    float* r = be->alloc(be, n * sizeof(float));
    EXPECT(be->peak_bytes(be) < peak0 + 3 * n * sizeof(float), "freed blocks leave the live count");
    be->free(be, r);
    free(h), free(back);
}

static void test_elementwise(void) {
    const size_t n = 70001;  // several parallel chunks, odd length
    float *x = rnd(n, 1), *y = rnd(n, 1), *y0 = dup(y, n), *a = fill(n, 0);
    be->add_act(be, y, x, n);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= y[i] == y0[i] + x[i];
    EXPECT(ok, "add_act: y += x exactly");
    memcpy(y, y0, n * sizeof(float));
    be->scale_f32(be, y, -0.37f, n);
    ok = 1;
    for (size_t i = 0; i < n; i++) ok &= y[i] == y0[i] * -0.37f;
    EXPECT(ok, "scale_f32: x *= s exactly");
    be->f32_to_act(be, a, x, n);
    be->act_to_f32(be, y, a, n);
    EXPECT(memcmp(y, x, n * sizeof(float)) == 0, "f32 → act → f32 is the identity on the CPU");

    double ref = 0.5;
    for (size_t i = 0; i < n; i++) ref += (double)x[i] * x[i];
    float out = 0.5f;
    be->sumsq_f32(be, &out, x, n);
    EXPECT(relerr(out, ref) < TOL_FWD, "sumsq_f32: %.9g vs %.9g (accumulates onto out)", out, ref);

    float bad = 0;
    be->nonfinite_f32(be, &bad, x, n);
    EXPECT(bad == 0, "nonfinite: finite input leaves out at 0");
    bad = 1;
    be->nonfinite_f32(be, &bad, x, n);
    EXPECT(bad == 1, "nonfinite: finite input leaves out as is (1)");
    const float specials[3] = {NAN, INFINITY, -INFINITY};
    for (int s = 0; s < 3; s++) {
        float* z = dup(x, n);
        z[n - 1 - 1000 * s] = specials[s];
        bad = 0;
        be->nonfinite_f32(be, &bad, z, n);
        EXPECT(bad == 1, "nonfinite detects %g", specials[s]);
        free(z);
    }
    free(x), free(y), free(y0), free(a);
}

// ---- thread-count independence ------------------------------------------------------------------

// Runs a mix of ops with `threads` OpenMP threads; returns the concatenated outputs.
static float* run_mix(int threads, size_t* len) {
    omp_set_num_threads(threads);
    Rng save = rng;
    rng_seed(&rng, 1234);
    enum { M = 200, N = 300, K = 290, B = 2, T = 50, Hq = 4, Hkv = 2, D = 8, V = 500, R = 3000 };
    const size_t nq = (size_t)B * T * Hq * D, nk = (size_t)B * T * Hkv * D;
    const size_t total = M * N + 2 * nq + 2 * nk + B * Hq * T + 64 * 33 + 33 + (size_t)R * V + 2 +
                         5000 * 8 + 2 * 5000 * 2 + 2 * 8 + 1 + 7 * 40;
    float* o = fill(total, 0);
    float* p = o;
    float *A = rnd(M * K, 1), *Bm = rnd(N * K, 1);
    GemmDesc gd = {.M = M, .N = N, .K = K, .trans_b = 1, .alpha = 1, .beta = 0};
    be->gemm(be, &gd, A, Bm, p);
    p += M * N;
    float *q = rnd(nq, 1), *k = rnd(nk, 1), *v = rnd(nk, 1), *r = rnd(nq, 1);
    float *out = p, *dq = p + nq, *lse = p + 2 * nq;
    p += 2 * nq + B * Hq * T;
    be->attn_fwd(be, out, lse, q, k, v, B, T, Hq, Hkv, D, NULL);
    be->attn_bwd(be, dq, p, p + nk, r, out, lse, q, k, v, B, T, Hq, Hkv, D, NULL, 0, NULL);
    p += 2 * nk;
    float *x = rnd(64 * 33, 1), *w = rnd(33, 1), *y = rnd(64 * 33, 1), rs[64];
    be->rmsnorm_fwd(be, y, rs, x, w, 64, 33, 1e-5f);
    be->rmsnorm_bwd(be, p, p + 64 * 33, y, x, w, rs, 64, 33, 0);
    p += 64 * 33 + 33;
    float* lg = rnd((size_t)R * V, 3);
    int32_t* tg = xmalloc(sizeof(int32_t) * R);
    for (int i = 0; i < R; i++) tg[i] = (int32_t)(rng_u64(&rng) % V);
    memcpy(p, lg, sizeof(float) * R * V);
    be->cross_entropy(be, p, p + (size_t)R * V, tg, R, V, 0.5f);
    be->sumsq_f32(be, p + (size_t)R * V + 1, lg, (size_t)R * V);
    p += (size_t)R * V + 2;
    enum { RN = 5000, RE = 8, RK = 2 };  // router: rows in several fixed chunks
    float* rl = rnd(RN * RE, 2);
    int32_t* ri = xmalloc(sizeof(int32_t) * RN * RK);
    be->router_fwd(be, p, ri, p + RN * RE, p + RN * RE + RN * RK, p + RN * RE + RN * RK + 2 * RE, rl, RN, RE, RK);
    p += RN * RE + RN * RK + 2 * RE + 1;
    memcpy(p, ri, sizeof(int32_t) * RN * RK);
    p += RN * RK;
    int32_t et[4000];  // embedding backward with many repeated tokens
    for (int i = 0; i < 4000; i++) et[i] = (int32_t)(rng_u64(&rng) % 7);
    float* ed = rnd(4000 * 40, 1);
    be->embed_bwd(be, p, ed, et, 4000, 40, 7);
    p += 7 * 40;
    CHECK((size_t)(p - o) == total, "run_mix layout");
    free(rl), free(ri), free(ed);
    free(A), free(Bm), free(q), free(k), free(v), free(r), free(x), free(w), free(y), free(lg), free(tg);
    rng = save;
    *len = total;
    return o;
}

static void test_thread_independence(void) {
    const int nt = omp_get_max_threads();
    size_t n1, n3;
    float* a = run_mix(1, &n1);
    float* b = run_mix(3, &n3);
    omp_set_num_threads(nt);
    EXPECT(n1 == n3 && memcmp(a, b, sizeof(float) * n1) == 0,
           "gemm, attention, rmsnorm, cross-entropy, sumsq, router, embedding: 1 and 3 threads give identical bits");
    free(a), free(b);
}

int main(void) {
    cpu_test_begin(20240917);
    RUN(test_memory);
    RUN(test_elementwise);
    RUN(test_thread_independence);
    CPU_TEST_END();
}
