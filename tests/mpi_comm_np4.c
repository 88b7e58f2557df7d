// mpi_comm_np4.c — the MPI Comm on 4 ranks: group layout for ep = 1, 2, 4 and every collective
// on every group with rank-dependent known values; then the same for the staged Comm
// (parallel.comm=mpi: comm_staged.c) over the CPU backend, whose "device" memory is host memory. Runs under mpirun -np 4 (also correct on any
// world size; the ep values that do not divide it are skipped). Failures on any rank are
// reduced into rank 0, which alone prints the ok/FAIL lines and the summary.
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdint.h>
#include <time.h>

#include "backend.h"
#include "comm.h"
#include "mpi_test.h"

static int g_ep;
static Comm* g_c;
static const char* gname[GROUP_COUNT] = {"world", "ep", "edp"};

// World rank of member j of group g, for this rank (the layout comm.h promises).
static int member(GroupId g, int j) {
    if (g == GROUP_WORLD) return j;
    if (g == GROUP_EP) return (mt_rank / g_ep) * g_ep + j;
    return mt_rank % g_ep + j * g_ep;
}

static void test_layout(void) {
    int ep = g_ep;
    EXPECT(g_c->rank[GROUP_WORLD] == mt_rank && g_c->size[GROUP_WORLD] == mt_world, "rank %d: world", mt_rank);
    EXPECT(g_c->rank[GROUP_EP] == mt_rank % ep && g_c->size[GROUP_EP] == ep,
           "rank %d: ep rank/size %d/%d, want %d/%d", mt_rank, g_c->rank[GROUP_EP], g_c->size[GROUP_EP], mt_rank % ep, ep);
    EXPECT(g_c->rank[GROUP_EDP] == mt_rank / ep && g_c->size[GROUP_EDP] == mt_world / ep,
           "rank %d: edp rank/size %d/%d, want %d/%d", mt_rank, g_c->rank[GROUP_EDP], g_c->size[GROUP_EDP], mt_rank / ep, mt_world / ep);
    // Membership and gather order: every member's world rank, in group-rank order.
    for (int g = 0; g < GROUP_COUNT; g++) {
        int32_t me = mt_rank, all[64];
        g_c->host_all_gather(g_c, g, all, &me, sizeof me);
        for (int j = 0; j < g_c->size[g]; j++)
            EXPECT(all[j] == member(g, j), "rank %d: %s member %d is world rank %d, want %d", mt_rank, gname[g], j, all[j], member(g, j));
    }
}

static float ar_val(int r, size_t i) { return (float)((r + 1) * (int)(i + 1)) + 0.5f * (float)(i % 3); }

static void test_all_reduce(void) {
    enum { N = 37 };
    for (int g = 0; g < GROUP_COUNT; g++) {
        float buf[N];
        for (size_t i = 0; i < N; i++) buf[i] = ar_val(mt_rank, i);
        g_c->all_reduce_sum(g_c, g, buf, N);
        for (size_t i = 0; i < N; i++) {
            float want = 0;
            for (int j = 0; j < g_c->size[g]; j++) want += ar_val(member(g, j), i);
            EXPECT(buf[i] == want, "rank %d: %s all_reduce[%zu] = %g, want %g", mt_rank, gname[g], i, buf[i], want);
        }
    }
}

static float rs_val(int r, size_t k) { return (float)((r + 1) * 1000) + (float)k; }

static void test_reduce_scatter(void) {
    enum { N = 5 };
    for (int g = 0; g < GROUP_COUNT; g++) {
        int size = g_c->size[g], me = g_c->rank[g];
        for (int inplace = 0; inplace < 2; inplace++) {
            float in[N * 64], outb[N];
            for (size_t k = 0; k < (size_t)N * size; k++) in[k] = rs_val(mt_rank, k);
            float* out = inplace ? in + (size_t)me * N : outb;  // NCCL's in-place form
            g_c->reduce_scatter_sum(g_c, g, out, in, N);
            for (size_t i = 0; i < N; i++) {
                float want = 0;
                for (int j = 0; j < size; j++) want += rs_val(member(g, j), (size_t)me * N + i);
                EXPECT(out[i] == want, "rank %d: %s reduce_scatter%s[%zu] = %g, want %g", mt_rank, gname[g],
                       inplace ? " (in place)" : "", i, out[i], want);
            }
        }
    }
}

static uint8_t ag_byte(int r, size_t i) { return (uint8_t)(r * 37 + (int)i * 11 + 1); }

static void test_all_gather(void) {
    enum { NB = 7 };  // odd byte count: nothing assumes float alignment
    for (int g = 0; g < GROUP_COUNT; g++) {
        int size = g_c->size[g], me = g_c->rank[g];
        for (int inplace = 0; inplace < 2; inplace++) {
            uint8_t in[NB], out[NB * 64];
            memset(out, 0xEE, sizeof out);
            uint8_t* src = inplace ? out + (size_t)me * NB : in;
            for (size_t i = 0; i < NB; i++) src[i] = ag_byte(mt_rank, i);
            g_c->all_gather(g_c, g, out, src, NB);
            for (int j = 0; j < size; j++)
                for (size_t i = 0; i < NB; i++)
                    EXPECT(out[j * NB + i] == ag_byte(member(g, j), i), "rank %d: %s all_gather%s chunk %d byte %zu",
                           mt_rank, gname[g], inplace ? " (in place)" : "", j, i);
            EXPECT(out[size * NB] == 0xEE, "rank %d: %s all_gather wrote past the end", mt_rank, gname[g]);
        }
    }
}

// Bytes group-rank s sends to group-rank d: uneven, often zero; group rank 1 sends nothing.
static size_t a2a_count(int s, int d) { return s == 1 ? 0 : (size_t)((s + 2 * d) % 4) * 3; }
static uint8_t a2a_byte(int src_world, int d, size_t i) { return (uint8_t)(src_world * 50 + d * 7 + (int)i + 3); }

static void test_all_to_all_v(void) {
    for (int g = 0; g < GROUP_COUNT; g++) {
        int size = g_c->size[g], me = g_c->rank[g];
        size_t sc[64], sd[64], rc[64], rd[64], so = 0, ro = 0;
        uint8_t send[64 * 16], recv[64 * 16];
        memset(send, 0xAA, sizeof send);
        memset(recv, 0xEE, sizeof recv);
        for (int p = 0; p < size; p++) {
            sc[p] = a2a_count(me, p); sd[p] = so; so += sc[p] + 1;  // one-byte gaps catch displ mistakes
            rc[p] = a2a_count(p, me); rd[p] = ro; ro += rc[p] + 1;
            for (size_t i = 0; i < sc[p]; i++) send[sd[p] + i] = a2a_byte(mt_rank, p, i);
        }
        g_c->all_to_all_v(g_c, g, send, sc, sd, recv, rc, rd);
        for (int p = 0; p < size; p++) {
            for (size_t i = 0; i < rc[p]; i++)
                EXPECT(recv[rd[p] + i] == a2a_byte(member(g, p), me, i), "rank %d: %s a2a from %d byte %zu = %d",
                       mt_rank, gname[g], p, i, recv[rd[p] + i]);
            EXPECT(recv[rd[p] + rc[p]] == 0xEE, "rank %d: %s a2a gap after peer %d overwritten", mt_rank, gname[g], p);
        }
    }
}

static void test_host_helpers(void) {
    for (int g = 0; g < GROUP_COUNT; g++) {
        int size = g_c->size[g], me = g_c->rank[g];
        enum { K = 3 };
        int32_t s[64 * K], r[64 * K];
        for (int p = 0; p < size; p++)
            for (int k = 0; k < K; k++) s[p * K + k] = mt_rank * 100 + p * 10 + k;
        g_c->host_all_to_all_i32(g_c, g, s, r, K);
        for (int p = 0; p < size; p++)
            for (int k = 0; k < K; k++)
                EXPECT(r[p * K + k] == member(g, p) * 100 + me * 10 + k, "rank %d: %s host_all_to_all_i32 [%d,%d] = %d",
                       mt_rank, gname[g], p, k, r[p * K + k]);

        double d[2] = {mt_rank + 0.25, -2.0 * mt_rank}, dw[2] = {0, 0};
        for (int j = 0; j < size; j++) { dw[0] += member(g, j) + 0.25; dw[1] += -2.0 * member(g, j); }
        g_c->host_all_reduce_f64(g_c, g, d, 2);
        EXPECT(d[0] == dw[0] && d[1] == dw[1], "rank %d: %s host_all_reduce_f64 %g %g, want %g %g", mt_rank, gname[g], d[0], d[1], dw[0], dw[1]);

        int32_t mx[3] = {mt_rank, -mt_rank, (mt_rank * 3) % 4}, mw[3] = {INT32_MIN, INT32_MIN, INT32_MIN};
        for (int j = 0; j < size; j++) {
            int w = member(g, j), v[3] = {w, -w, (w * 3) % 4};
            for (int k = 0; k < 3; k++) if (v[k] > mw[k]) mw[k] = v[k];
        }
        g_c->host_all_reduce_max_i32(g_c, g, mx, 3);
        for (int k = 0; k < 3; k++) EXPECT(mx[k] == mw[k], "rank %d: %s max_i32[%d] = %d, want %d", mt_rank, gname[g], k, mx[k], mw[k]);

        char b[9] = {0}, want[9] = {0};  // "wRRR-gG" + NUL + one more zero byte
        int root = size - 1;
        if (me == root) snprintf(b, sizeof b, "w%03d-g%d", mt_rank, g);
        else memset(b, 'x', sizeof b);
        g_c->host_broadcast(g_c, g, b, sizeof b, root);
        snprintf(want, sizeof want, "w%03d-g%d", member(g, root), g);
        EXPECT(memcmp(b, want, sizeof b) == 0, "rank %d: %s broadcast got '%.9s', want '%s'", mt_rank, gname[g], b, want);
    }
}

static double mono_sec(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);  // one clock for every process of the host
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// The last member of each group arrives 0.1 s late; nobody may leave the barrier before it
// arrived. Each member records when it entered and left; the group compares them afterwards, so a
// rank the scheduler holds back on a busy machine cannot fail the test.
static void test_barrier(void) {
    for (int g = 0; g < GROUP_COUNT; g++) {
        int size = g_c->size[g], me = g_c->rank[g];
        if (size == 1) continue;
        g_c->barrier(g_c, GROUP_WORLD);
        if (me == size - 1) nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
        double t[2], all[2 * 64];
        t[0] = mono_sec();
        g_c->barrier(g_c, g);
        t[1] = mono_sec();
        g_c->host_all_gather(g_c, g, all, t, sizeof t);
        double late_in = all[2 * (size - 1)];
        EXPECT(t[1] >= late_in, "rank %d: %s barrier returned %.3f s before the late member arrived", mt_rank, gname[g],
               late_in - t[1]);
    }
}

static void test_agree(void) {
    int worst = mt_world - 1;
    EXPECT(dist_agree_status(mt_rank == worst ? 2 : 0) == 2, "rank %d: agree_status", mt_rank);
    EXPECT(dist_agree_status(0) == 0, "rank %d: agree_status all ok", mt_rank);
    EXPECT(dist_agree_status(mt_rank == 0 ? -1 : 0) == 2, "rank %d: a -1 status counts as 2", mt_rank);
    Err e;
    snprintf(e.msg, sizeof e.msg, "untouched");
    EXPECT(dist_agree_error(0, &e) == 0 && strcmp(e.msg, "untouched") == 0, "rank %d: agree_error ok", mt_rank);
    // The two highest ranks fail with different messages; the lower one's reaches everybody.
    int first = mt_world >= 2 ? mt_world - 2 : 0;
    int st = mt_rank >= first ? (mt_rank == first ? 2 : 3) : 0;
    if (st) snprintf(e.msg, sizeof e.msg, "config key x wrong on rank %d (expected test message)", mt_rank);
    int got = dist_agree_error(st, &e);
    char want[128];
    if (first == 0) snprintf(want, sizeof want, "config key x wrong on rank 0 (expected test message)");
    else snprintf(want, sizeof want, "rank %d: config key x wrong on rank %d (expected test message)", first, first);
    EXPECT(got == (mt_world >= 2 ? 3 : 2), "rank %d: agree_error returned %d", mt_rank, got);
    EXPECT(strcmp(e.msg, want) == 0, "rank %d: agree_error message '%s', want '%s'", mt_rank, e.msg, want);
}

static void test_local_rank(void) {
    // One node: the node-local rank is the world rank, and agrees with Open MPI's variable.
    int lr = dist_local_rank();
    EXPECT(lr == mt_rank, "rank %d: local rank %d", mt_rank, lr);
    const char* v = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (v) EXPECT(atoi(v) == lr, "rank %d: OMPI_COMM_WORLD_LOCAL_RANK %s, local %d", mt_rank, v, lr);
}

int main(int argc, char** argv) {
    mpi_test_init(&argc, &argv, "mpi_comm");
    CHECK(mt_world <= 64, "this test supports up to 64 ranks");
    int eps[] = {1, 2, 4};
    Backend* cpu = cpu_backend_create();
    for (size_t i = 0; i < 2 * sizeof eps / sizeof eps[0]; i++) {
        g_ep = eps[i % 3];
        if (mt_world % g_ep) continue;
        const int staged = i >= 3;
        mpi_test_note("(%s, ep=%d)", staged ? "staged" : "mpi", g_ep);
        g_c = staged ? comm_staged_create(g_ep, cpu) : comm_mpi_create(g_ep);
        MRUN(test_layout);
        MRUN(test_all_reduce);
        MRUN(test_reduce_scatter);
        MRUN(test_all_gather);
        MRUN(test_all_to_all_v);
        MRUN(test_host_helpers);
        MRUN(test_barrier);
        g_c->destroy(g_c);
    }
    cpu->destroy(cpu);
    g_ep = 1;
    mpi_test_note("(ep=%d)", g_ep);
    MRUN(test_agree);
    MRUN(test_local_rank);
    MPI_TEST_END();
}
