// mpi_nccl_np2.c — the NCCL Comm on 2 ranks, 2 GPUs (make test-gpu runs it under mpirun -np 2):
// every device collective on every group for ep = 1, 2 with rank-dependent known values, the
// in-place forms, all_to_all_v with uneven and zero counts, a large all_reduce, the host helpers
// through the NCCL comm. Needs one GPU per rank: with fewer than 2 GPUs it says so and counts
// nothing. Failures on any rank are reduced into rank 0, which prints the summary.
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <mpi.h>
#include <stdint.h>

#include "comm.h"
#include "mpi_test.h"

static int g_ep;
static Comm* g_c;
static cudaStream_t g_s;
static const char* gname[GROUP_COUNT] = {"world", "ep", "edp"};

#define CU(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) FATAL("%s: %s", #x, cudaGetErrorString(e_)); } while (0)

static int member(GroupId g, int j) {
    if (g == GROUP_WORLD) return j;
    if (g == GROUP_EP) return (mt_rank / g_ep) * g_ep + j;
    return mt_rank % g_ep + j * g_ep;
}

static void* dev(size_t bytes) {
    void* p = NULL;
    CU(cudaMalloc(&p, bytes ? bytes : 1));
    CU(cudaMemset(p, 0xFF, bytes ? bytes : 1));  // poison: NaN as fp32
    return p;
}
static void up(void* d, const void* h, size_t b) { CU(cudaMemcpy(d, h, b, cudaMemcpyHostToDevice)); }
static void down(void* h, const void* d, size_t b) {
    CU(cudaStreamSynchronize(g_s));
    CU(cudaMemcpy(h, d, b, cudaMemcpyDeviceToHost));
}

static float val(int r, size_t i) { return (float)((r + 1) * (int)(i % 1000 + 1)) + 0.5f * (float)(i % 3); }

static void test_all_reduce(void) {
    size_t sizes[] = {37, (size_t)1 << 22};
    for (int g = 0; g < GROUP_COUNT; g++)
        for (int k = 0; k < 2; k++) {
            size_t n = sizes[k];
            float* h = xmalloc(n * sizeof *h);
            for (size_t i = 0; i < n; i++) h[i] = val(mt_rank, i);
            float* d = dev(n * sizeof *d);
            up(d, h, n * sizeof *h);
            g_c->all_reduce_sum(g_c, g, d, n);
            down(h, d, n * sizeof *h);
            int bad = 0;
            for (size_t i = 0; i < n; i++) {
                float want = 0;
                for (int j = 0; j < g_c->size[g]; j++) want += val(member(g, j), i);
                if (h[i] != want && bad++ < 3)
                    EXPECT(0, "rank %d: %s all_reduce n=%zu [%zu] = %g, want %g", mt_rank, gname[g], n, i, h[i], want);
            }
            CU(cudaFree(d));
            free(h);
        }
}

static void test_reduce_scatter(void) {
    enum { N = 1001 };
    for (int g = 0; g < GROUP_COUNT; g++) {
        int size = g_c->size[g], me = g_c->rank[g];
        for (int inplace = 0; inplace < 2; inplace++) {
            size_t tot = (size_t)N * size;
            float* h = xmalloc(tot * sizeof *h);
            for (size_t k = 0; k < tot; k++) h[k] = val(mt_rank, k);
            float* din = dev(tot * sizeof *din);
            up(din, h, tot * sizeof *h);
            float* dout = inplace ? din + (size_t)me * N : dev(N * sizeof *dout);
            g_c->reduce_scatter_sum(g_c, g, dout, din, N);
            down(h, dout, N * sizeof *h);
            for (size_t i = 0; i < N; i++) {
                float want = 0;
                for (int j = 0; j < size; j++) want += val(member(g, j), (size_t)me * N + i);
                if (h[i] != want) {
                    EXPECT(0, "rank %d: %s reduce_scatter%s [%zu] = %g, want %g", mt_rank, gname[g], inplace ? " in place" : "", i, h[i], want);
                    break;
                }
            }
            if (!inplace) CU(cudaFree(dout));
            CU(cudaFree(din));
            free(h);
        }
    }
}

static uint8_t ag_byte(int r, size_t i) { return (uint8_t)(r * 37 + (int)i * 11 + 1); }

static void test_all_gather(void) {
    enum { NB = 4099 };
    for (int g = 0; g < GROUP_COUNT; g++) {
        int size = g_c->size[g], me = g_c->rank[g];
        for (int inplace = 0; inplace < 2; inplace++) {
            uint8_t h[NB * 8];
            for (size_t i = 0; i < NB; i++) h[i] = ag_byte(mt_rank, i);
            uint8_t* dout = dev((size_t)NB * size);
            uint8_t* din = inplace ? dout + (size_t)me * NB : dev(NB);
            up(din, h, NB);
            g_c->all_gather(g_c, g, dout, din, NB);
            down(h, dout, (size_t)NB * size);
            for (int j = 0; j < size; j++)
                for (size_t i = 0; i < NB; i++)
                    if (h[j * NB + i] != ag_byte(member(g, j), i)) {
                        EXPECT(0, "rank %d: %s all_gather%s chunk %d byte %zu", mt_rank, gname[g], inplace ? " in place" : "", j, i);
                        j = size;
                        break;
                    }
            if (!inplace) CU(cudaFree(din));
            CU(cudaFree(dout));
        }
    }
}

// Group rank 1 sends nothing; the others send uneven counts (some zero) of up to 3 MB.
static size_t a2a_count(int s, int d) { return s == 1 ? 0 : (size_t)((s + 2 * d + 1) % 4) * 1000003; }
static uint8_t a2a_byte(int src, int d, size_t i) { return (uint8_t)(src * 50 + d * 7 + (int)(i % 251) + 3); }

static void test_all_to_all_v(void) {
    for (int g = 0; g < GROUP_COUNT; g++) {
        int size = g_c->size[g], me = g_c->rank[g];
        size_t sc[8], sd[8], rc[8], rd[8], so = 0, ro = 0;
        for (int p = 0; p < size; p++) {
            sc[p] = a2a_count(me, p); sd[p] = so; so += sc[p] + 1;
            rc[p] = a2a_count(p, me); rd[p] = ro; ro += rc[p] + 1;
        }
        uint8_t* hs = xmalloc(so + 1);
        uint8_t* hr = xmalloc(ro + 1);
        for (int p = 0; p < size; p++)
            for (size_t i = 0; i < sc[p]; i++) hs[sd[p] + i] = a2a_byte(mt_rank, p, i);
        uint8_t* ds = dev(so + 1);
        uint8_t* dr = dev(ro + 1);
        up(ds, hs, so + 1);
        g_c->all_to_all_v(g_c, g, ds, sc, sd, dr, rc, rd);
        down(hr, dr, ro + 1);
        for (int p = 0; p < size; p++) {
            for (size_t i = 0; i < rc[p]; i++)
                if (hr[rd[p] + i] != a2a_byte(member(g, p), me, i)) {
                    EXPECT(0, "rank %d: %s a2a from %d byte %zu", mt_rank, gname[g], p, i);
                    break;
                }
            EXPECT(hr[rd[p] + rc[p]] == 0xFF, "rank %d: %s a2a gap after peer %d overwritten", mt_rank, gname[g], p);
        }
        CU(cudaFree(ds)); CU(cudaFree(dr));
        free(hs); free(hr);
    }
}

static void test_host_helpers_and_barrier(void) {
    for (int g = 0; g < GROUP_COUNT; g++) {
        double d = mt_rank + 0.25, want = 0;
        for (int j = 0; j < g_c->size[g]; j++) want += member(g, j) + 0.25;
        g_c->host_all_reduce_f64(g_c, g, &d, 1);
        EXPECT(d == want, "rank %d: %s host_all_reduce_f64 %g, want %g", mt_rank, gname[g], d, want);
        int32_t all[8], me = mt_rank;
        g_c->host_all_gather(g_c, g, all, &me, sizeof me);
        for (int j = 0; j < g_c->size[g]; j++) EXPECT(all[j] == member(g, j), "rank %d: %s host_all_gather", mt_rank, gname[g]);
        g_c->barrier(g_c, g);
    }
}

int main(int argc, char** argv) {
    mpi_test_init(&argc, &argv, "mpi_nccl");
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess) ndev = 0;
    int enough = ndev >= 2 && mt_world >= 2 && mt_world <= 8, all_enough = 0;
    MPI_Allreduce(&enough, &all_enough, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_enough) {
        if (mt_rank == 0) printf("skip: needs 2..8 ranks with one GPU each (%d GPUs, %d ranks)\n0 passed, 0 failed\n", ndev, mt_world);
        dist_finalize();
        return 0;
    }
    int device = dist_local_rank() % ndev;
    CU(cudaSetDevice(device));
    util_set_rank(mt_rank, device);
    CU(cudaStreamCreateWithFlags(&g_s, cudaStreamNonBlocking));
    int eps[] = {1, 2};
    for (size_t i = 0; i < sizeof eps / sizeof eps[0]; i++) {
        g_ep = eps[i];
        if (mt_world % g_ep) continue;
        mpi_test_note("(ep=%d)", g_ep);
        g_c = comm_nccl_create(g_ep, g_s);
        CHECK(g_c, "comm_nccl_create returned NULL (a build without NCCL?)");
        MRUN(test_all_reduce);
        MRUN(test_reduce_scatter);
        MRUN(test_all_gather);
        MRUN(test_all_to_all_v);
        MRUN(test_host_helpers_and_barrier);
        g_c->destroy(g_c);
    }
    CU(cudaStreamDestroy(g_s));
    MPI_TEST_END();
}
