// comm_mpi.c — the Comm seam over MPI, on host memory (the CPU backend).
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "util.h"

#define MPI_CHECK(stmt)                                                              \
    do {                                                                             \
        int rc_ = (stmt);                                                            \
        if (rc_ != MPI_SUCCESS) {                                                    \
            char s_[MPI_MAX_ERROR_STRING];                                           \
            int n_ = 0;                                                              \
            MPI_Error_string(rc_, s_, &n_);                                          \
            FATAL("MPI call failed: %s: %s", #stmt, s_);                             \
        }                                                                            \
    } while (0)

typedef struct MpiImpl {
    MPI_Comm g[GROUP_COUNT];
} MpiImpl;

static MPI_Comm G(Comm* c, GroupId g) { return ((MpiImpl*)c->impl)->g[g]; }

// MPI counts are int: large buffers go in chunks.
#define CHUNK ((size_t)1 << 28)

static void all_reduce_sum(Comm* c, GroupId g, float* buf, size_t n) {
    for (size_t o = 0; o < n; o += CHUNK) {
        size_t k = n - o < CHUNK ? n - o : CHUNK;
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf + o, (int)k, MPI_FLOAT, MPI_SUM, G(c, g)));
    }
}

static void reduce_scatter_sum(Comm* c, GroupId g, float* out, const float* in, size_t n) {
    CHECK(n < CHUNK, "reduce_scatter of %zu elements per rank: larger than one MPI call allows", n);
    MPI_CHECK(MPI_Reduce_scatter_block(in, out, (int)n, MPI_FLOAT, MPI_SUM, G(c, g)));
}

static void all_gather(Comm* c, GroupId g, void* out, const void* in, size_t nbytes) {
    CHECK(nbytes < ((size_t)1 << 31), "all_gather of %zu bytes per rank: larger than one MPI call allows", nbytes);
    const void* src = in == (char*)out + (size_t)c->rank[g] * nbytes ? MPI_IN_PLACE : in;
    MPI_CHECK(MPI_Allgather(src, (int)nbytes, MPI_BYTE, out, (int)nbytes, MPI_BYTE, G(c, g)));
}

static void all_to_all_v(Comm* c, GroupId g, const void* send, const size_t* sc, const size_t* sd, void* recv,
                         const size_t* rc, const size_t* rd) {
    const int P = c->size[g];
    int isc[1024], isd[1024], irc[1024], ird[1024];
    CHECK(P <= 1024, "all_to_all_v over more than 1024 ranks");
    for (int i = 0; i < P; i++) {
        CHECK(sd[i] + sc[i] < ((size_t)1 << 31) && rd[i] + rc[i] < ((size_t)1 << 31), "all_to_all_v: buffer over 2 GiB");
        isc[i] = (int)sc[i], isd[i] = (int)sd[i], irc[i] = (int)rc[i], ird[i] = (int)rd[i];
    }
    MPI_CHECK(MPI_Alltoallv(send, isc, isd, MPI_BYTE, recv, irc, ird, MPI_BYTE, G(c, g)));
}

static void host_all_to_all_i32(Comm* c, GroupId g, const int32_t* send, int32_t* recv, int n_each) {
    MPI_CHECK(MPI_Alltoall(send, n_each, MPI_INT32_T, recv, n_each, MPI_INT32_T, G(c, g)));
}

static void host_all_reduce_f64(Comm* c, GroupId g, double* buf, size_t n) {
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_DOUBLE, MPI_SUM, G(c, g)));
}

static void host_all_reduce_max_i32(Comm* c, GroupId g, int32_t* buf, size_t n) {
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_INT32_T, MPI_MAX, G(c, g)));
}

static void host_all_gather(Comm* c, GroupId g, void* out, const void* in, size_t nbytes) {
    MPI_CHECK(MPI_Allgather(in, (int)nbytes, MPI_BYTE, out, (int)nbytes, MPI_BYTE, G(c, g)));
}

static void host_broadcast(Comm* c, GroupId g, void* buf, size_t nbytes, int root) {
    MPI_CHECK(MPI_Bcast(buf, (int)nbytes, MPI_BYTE, root, G(c, g)));
}

static void barrier(Comm* c, GroupId g) { MPI_CHECK(MPI_Barrier(G(c, g))); }

static void destroy(Comm* c) {
    MpiImpl* m = c->impl;
    MPI_Comm_free(&m->g[GROUP_EP]);
    MPI_Comm_free(&m->g[GROUP_EDP]);
    MPI_Comm_free(&m->g[GROUP_WORLD]);
    free(m);
    free(c);
}

// Fills the host-side helpers and the group layout; shared with the NCCL comm.
void comm_mpi_fill(Comm* c, int ep) {
    MpiImpl* m = xcalloc(1, sizeof *m);
    int world = 1, rank = 0;
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    CHECK(ep >= 1 && world % ep == 0, "world %d is not a multiple of ep %d", world, ep);
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &m->g[GROUP_WORLD]));
    // EP group: consecutive ranks; EDP group: ranks with the same ep_rank.
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, rank / ep, rank % ep, &m->g[GROUP_EP]));
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, rank % ep, rank / ep, &m->g[GROUP_EDP]));
    for (int g = 0; g < GROUP_COUNT; g++) {
        MPI_CHECK(MPI_Comm_rank(m->g[g], &c->rank[g]));
        MPI_CHECK(MPI_Comm_size(m->g[g], &c->size[g]));
    }
    c->impl = m;
    c->host_all_to_all_i32 = host_all_to_all_i32;
    c->host_all_reduce_f64 = host_all_reduce_f64;
    c->host_all_reduce_max_i32 = host_all_reduce_max_i32;
    c->host_all_gather = host_all_gather;
    c->host_broadcast = host_broadcast;
    c->barrier = barrier;
    c->destroy = destroy;
}

Comm* comm_mpi_create(int ep) {
    Comm* c = xcalloc(1, sizeof *c);
    comm_mpi_fill(c, ep);
    c->all_reduce_sum = all_reduce_sum;
    c->reduce_scatter_sum = reduce_scatter_sum;
    c->all_gather = all_gather;
    c->all_to_all_v = all_to_all_v;
    return c;
}
