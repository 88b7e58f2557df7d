// test_moe_host.cc — the CUDA backend's MoE kernels (cuda/cuda_moe.cu: moe_index, the permutes and
// their gradients, the per-row gathers, SwiGLU forward and backward) run on the CPU through the
// host stand-in (tests/host_cuda), against the CPU backend (the spec), in fp32 and bf16, on the
// cases of tests/op_cases.h (the CPU's and the GPU's rows), under AddressSanitizer. Where the
// kernel and the spec do the same arithmetic the results must agree bit for bit: the index and
// every row copy, and SwiGLU's elementwise outputs (the same formula, the same libm here); sums
// (a token's k rows, the routing weights' gradient) are summed in another order and are compared
// by relative L2. Outputs are poisoned first (0xFF bytes: NaN in either dtype).
// tests/gpu/test_cuda_moe.c runs the same comparisons on a GPU.
#include <vector>

#include "backend_host.h"
#include "cuda_common.cuh"
#include "test.h"

extern "C" {
#include "op_cases.h"
}

static Backend* g_cpu;
static uint64_t g_rng = 0x853C49E6748FEA9Bull;
static uint64_t rnd() {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return g_rng;
}
static float randn1() {
    const double u1 = ((rnd() >> 11) + 1.0) / 9007199254740993.0, u2 = (rnd() >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
}
static float bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

// An act tensor as both backends see it: fp32 values (bf16-exact when bf) and the kernel's copy.
struct Act {
    int bf;
    std::vector<float> f;
    std::vector<uint16_t> h;
    void* dev() { return bf ? (void*)h.data() : (void*)f.data(); }
    void to_dev() {
        if (!bf) return;
        h.resize(f.size());
        for (size_t i = 0; i < f.size(); i++) {
            uint32_t u;
            memcpy(&u, &f[i], 4);
            h[i] = (uint16_t)(u >> 16);
        }
    }
    std::vector<float> values() const {  // what the kernel wrote, as fp32
        if (!bf) return f;
        std::vector<float> v(h.size());
        for (size_t i = 0; i < h.size(); i++) {
            const uint32_t u = (uint32_t)h[i] << 16;
            memcpy(&v[i], &u, 4);
        }
        return v;
    }
};
static Act act_randn(size_t n, float scale, int bf) {
    Act a{bf, std::vector<float>(n), {}};
    for (float& v : a.f) v = bf ? bf16_round(scale * randn1()) : scale * randn1();
    a.to_dev();
    return a;
}
static Act act_poison(size_t n, int bf) {
    Act a{bf, std::vector<float>(n), {}};
    memset(a.f.data(), 0xFF, 4 * n);
    if (bf) a.h.assign(n, 0xFFFF);
    return a;
}

// got (the kernel's) against want (the spec's fp32, rounded to bf16 for a bf16 output): bit for bit.
static void expect_same(const char* what, int bf, const Act& got, const std::vector<float>& want) {
    const std::vector<float> g = got.values();
    size_t bad = 0;
    for (size_t i = 0; i < want.size(); i++) {
        const float w = bf ? bf16_round(want[i]) : want[i];
        bad += memcmp(&g[i], &w, 4) != 0;
    }
    EXPECT(bad == 0, "%s [%s]: %zu of %zu elements differ from the spec", what, bf ? "bf16" : "fp32", bad, want.size());
}
static void expect_close(const char* what, int bf, const std::vector<float>& got, const std::vector<float>& want,
                         double tol) {
    const double e = rel_l2(got.data(), want.data(), want.size());
    EXPECT(e <= tol, "%s [%s]: relative L2 error %.3g > %.3g", what, bf ? "bf16" : "fp32", e, tol);
}

// ---- SwiGLU ------------------------------------------------------------------------------------

static void test_swiglu() {
    for (const SwigluCase& c : SWIGLU_CASES)
        for (int bf = 0; bf < 2; bf++) {
            Backend* be = host_cuda_backend(bf ? DTYPE_BF16 : DTYPE_F32);
            const int n = c.n, F = c.F;
            const size_t nf = (size_t)n * F;
            Act gu = act_randn(2 * nf, 2.f, bf);
            std::vector<float> sc(n);
            for (float& s : sc) s = 0.1f + 0.9f * (float)((rnd() >> 11) / 9007199254740992.0);
            for (int use = 0; use < 2; use++) {
                std::vector<float> want(nf);
                g_cpu->swiglu_fwd(g_cpu, want.data(), gu.f.data(), use ? sc.data() : nullptr, n, F);
                Act h = act_poison(nf, bf);
                cuda_swiglu_fwd(be, h.dev(), gu.dev(), use ? sc.data() : nullptr, n, F);
                expect_same(use ? "swiglu_fwd scaled" : "swiglu_fwd", bf, h, want);
            }
            Act dh = act_randn(nf, 1.f, bf);
            std::vector<float> wgu(2 * nf), wds(n);
            g_cpu->swiglu_bwd(g_cpu, wgu.data(), wds.data(), dh.f.data(), gu.f.data(), sc.data(), n, F);
            Act dgu = act_poison(2 * nf, bf);
            std::vector<float> ds(n);
            memset(ds.data(), 0xFF, 4 * n);
            cuda_swiglu_bwd(be, dgu.dev(), ds.data(), dh.dev(), gu.dev(), sc.data(), n, F);
            expect_same("swiglu_bwd dgu", bf, dgu, wgu);
            expect_close("swiglu_bwd dscale", bf, ds, wds, 1e-5);
            // no scale, no dscale, dgu in place of gu
            g_cpu->swiglu_bwd(g_cpu, wgu.data(), nullptr, dh.f.data(), gu.f.data(), nullptr, n, F);
            cuda_swiglu_bwd(be, gu.dev(), nullptr, dh.dev(), gu.dev(), nullptr, n, F);
            expect_same("swiglu_bwd in place, unscaled", bf, gu, wgu);
            host_cuda_backend_free(be);
        }
}

// ---- the expert-major index and the permutations -----------------------------------------------

// Random top-k rows: k distinct experts per token, never `skip` (an expert with no rows).
static std::vector<int32_t> random_topk(int N, int k, int E, int skip) {
    std::vector<int32_t> t((size_t)N * k);
    for (int n = 0; n < N; n++)
        for (int s = 0; s < k; s++) {
            int e, dup;
            do {
                e = (int)(rnd() % E);
                dup = e == skip;
                for (int j = 0; j < s; j++) dup |= t[(size_t)n * k + j] == e;
            } while (dup);
            t[(size_t)n * k + s] = e;
        }
    return t;
}

static void test_moe_index() {
    for (const MoeIndexCase& c : MOE_INDEX_CASES) {
        Backend* be = host_cuda_backend(DTYPE_F32);
        const int N = c.N, k = c.k, E = c.E;
        const size_t nk = (size_t)N * k;
        std::vector<int32_t> t = random_topk(N, k, E, c.skip), cnt(E), dest(nk), gc(E, -1), gd(nk, -1);
        g_cpu->moe_index(g_cpu, cnt.data(), dest.data(), t.data(), N, k, E);
        cuda_moe_index(be, gc.data(), gd.data(), t.data(), N, k, E);
        EXPECT(gc == cnt && gd == dest, "moe_index N %d k %d E %d (%s): counts %s, dest %s", N, k, E, c.why,
               gc == cnt ? "equal" : "differ", gd == dest ? "equal" : "differ");
        host_cuda_backend_free(be);
    }
}

static void test_permute() {
    for (const PermuteCase& c : PERMUTE_CASES)
        for (int bf = 0; bf < 2; bf++) {
            Backend* be = host_cuda_backend(bf ? DTYPE_BF16 : DTYPE_F32);
            const int N = c.N, k = c.k, E = c.E, H = c.H;
            const size_t nk = (size_t)N * k, nh = (size_t)N * H, nkh = nk * H;
            std::vector<int32_t> t = random_topk(N, k, E, 1), cnt(E), dest(nk);
            g_cpu->moe_index(g_cpu, cnt.data(), dest.data(), t.data(), N, k, E);
            Act x = act_randn(nh, 1.f, bf), xp = act_randn(nkh, 1.f, bf);
            std::vector<float> w_nkh(nkh), w_nh(nh);
            const double tsum = bf ? 5e-3 : 1e-5;  // a token's k rows summed, rounded to bf16 once

            g_cpu->permute_fwd(g_cpu, w_nkh.data(), x.f.data(), dest.data(), N, k, H);
            Act o = act_poison(nkh, bf);
            cuda_permute_fwd(be, o.dev(), x.dev(), dest.data(), N, k, H);
            expect_same("permute_fwd", bf, o, w_nkh);

            g_cpu->permute_bwd(g_cpu, w_nh.data(), xp.f.data(), dest.data(), N, k, H);
            o = act_poison(nh, bf);
            cuda_permute_bwd(be, o.dev(), xp.dev(), dest.data(), N, k, H);
            expect_close("permute_bwd", bf, o.values(), w_nh, tsum);

            for (int acc = 0; acc < 3; acc++) {  // no add, add = out (+=), a separate add (the residual)
                Act base = act_randn(nh, 1.f, bf);
                w_nh = base.f;
                g_cpu->unpermute_fwd(g_cpu, w_nh.data(), xp.f.data(), dest.data(), N, k, H, acc ? w_nh.data() : nullptr);
                Act out = acc == 1 ? base : act_poison(nh, bf);
                cuda_unpermute_fwd(be, out.dev(), xp.dev(), dest.data(), N, k, H,
                                   acc == 0 ? nullptr : acc == 1 ? out.dev() : base.dev());
                expect_close(acc == 0 ? "unpermute_fwd" : acc == 1 ? "unpermute_fwd (add = out)" : "unpermute_fwd (add)",
                             bf, out.values(), w_nh, tsum);
            }

            g_cpu->unpermute_bwd(g_cpu, w_nkh.data(), x.f.data(), dest.data(), N, k, H);
            o = act_poison(nkh, bf);
            cuda_unpermute_bwd(be, o.dev(), x.dev(), dest.data(), N, k, H);
            expect_same("unpermute_bwd", bf, o, w_nkh);

            std::vector<float> wv(nk), rw(nk), ow(nk);
            for (float& v : wv) v = randn1();
            g_cpu->gather_rows_f32(g_cpu, rw.data(), wv.data(), dest.data(), (int)nk);
            memset(ow.data(), 0xFF, 4 * nk);
            cuda_gather_rows_f32(be, ow.data(), wv.data(), dest.data(), (int)nk);
            EXPECT(memcmp(ow.data(), rw.data(), 4 * nk) == 0, "gather_rows_f32 N %d k %d: differs from the spec", N, k);
            g_cpu->scatter_rows_f32(g_cpu, rw.data(), wv.data(), dest.data(), (int)nk);
            memset(ow.data(), 0xFF, 4 * nk);
            cuda_scatter_rows_f32(be, ow.data(), wv.data(), dest.data(), (int)nk);
            EXPECT(memcmp(ow.data(), rw.data(), 4 * nk) == 0, "scatter_rows_f32 N %d k %d: differs from the spec", N, k);
            host_cuda_backend_free(be);
        }
}

int main() {
    g_cpu = cpu_backend_create();
    RUN(test_swiglu);
    RUN(test_moe_index);
    RUN(test_permute);
    TEST_END();
}
