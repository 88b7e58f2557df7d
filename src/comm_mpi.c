// comm_mpi.c — the Comm interface over MPI on host memory (CPU backend, CI, and the host_*
// control-data helpers of the NCCL Comm). See comm.h for the layout.
//
// Groups: world is a dup of MPI_COMM_WORLD (our traffic never mixes with anyone else's); ep and
// edp come from MPI_Comm_split with key = world rank, so rank order inside a group follows the
// world order: ep_rank = r % ep, edp_rank = r / ep. Every MPI call goes through MPI_CHECK
// (errors return: dist_init set MPI_ERRORS_RETURN, and dup/split inherit it).
//
// MPI counts are int: one call moves at most INT_MAX elements per rank and per peer. Reductions
// and broadcasts are split into chunks; gathers and all-to-alls stop with a message instead.
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "mpi_check.h"

typedef struct MpiComm {
    MPI_Comm c[GROUP_COUNT];
    int max_size;            // largest group size (the world's)
    int* counts;             // [4 * max_size]: send counts, send displs, recv counts, recv displs
    void* scratch;           // [scratch_bytes] for reduce-scatter / all-gather with aliased buffers
    size_t scratch_bytes;
} MpiComm;

static MpiComm* impl(Comm* c, GroupId g) {
    CHECK(g >= 0 && g < GROUP_COUNT, "invalid communicator group %d", (int)g);
    return (MpiComm*)c->impl;
}

static void* scratch(MpiComm* m, size_t bytes) {
    if (bytes > m->scratch_bytes) {
        free(m->scratch);
        m->scratch = xmalloc(bytes);
        m->scratch_bytes = bytes;
    }
    return m->scratch;
}

static int icount(size_t n, const char* what) {
    CHECK(n <= (size_t)INT_MAX, "%s: %zu elements exceed MPI's int count limit (%d) for one call; "
          "use smaller buckets or more ranks", what, n, INT_MAX);
    return (int)n;
}

// In-place sum over the group in chunks of at most INT_MAX elements.
static void allreduce_chunks(MPI_Comm c, void* buf, size_t n, MPI_Datatype t, size_t elem, MPI_Op op) {
    char* p = buf;
    while (n > 0) {
        int k = n > (size_t)INT_MAX ? INT_MAX : (int)n;
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, p, k, t, op, c));
        p += (size_t)k * elem;
        n -= (size_t)k;
    }
}

static void mpi_all_reduce_sum(Comm* c, GroupId g, float* buf, size_t n) {
    MpiComm* m = impl(c, g);
    allreduce_chunks(m->c[g], buf, n, MPI_FLOAT, sizeof(float), MPI_SUM);
}

static int overlaps(const void* a, size_t an, const void* b, size_t bn) {
    const char *pa = a, *pb = b;
    return an && bn && pa < pb + bn && pb < pa + an;
}

// in[n * size] -> out[n]: chunk `rank` of the sum. out may alias in (NCCL's in-place form is
// out == in + rank * n); then in is first copied to scratch.
static void mpi_reduce_scatter_sum(Comm* c, GroupId g, float* out, const float* in, size_t n) {
    MpiComm* m = impl(c, g);
    if (n == 0) return;
    int size = c->size[g];
    size_t total = n * (size_t)size;
    if (overlaps(out, n * sizeof(float), in, total * sizeof(float))) {
        float* tmp = scratch(m, total * sizeof(float));
        memcpy(tmp, in, total * sizeof(float));
        in = tmp;
    }
    MPI_CHECK(MPI_Reduce_scatter_block(in, out, icount(n, "reduce_scatter_sum"), MPI_FLOAT,
                                       MPI_SUM, m->c[g]));
}

// in[nbytes] from every rank -> out[nbytes * size], rank-major. In place when
// in == out + rank * nbytes (as in NCCL); other overlaps go through scratch.
static void mpi_all_gather(Comm* c, GroupId g, void* out, const void* in, size_t nbytes) {
    MpiComm* m = impl(c, g);
    if (nbytes == 0) return;
    int size = c->size[g], rank = c->rank[g];
    int k = icount(nbytes, "all_gather");
    char* o = out;
    if ((const char*)in == o + (size_t)rank * nbytes) {
        MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, out, k, MPI_BYTE, m->c[g]));
        return;
    }
    if (overlaps(out, nbytes * (size_t)size, in, nbytes)) {
        void* tmp = scratch(m, nbytes);
        memcpy(tmp, in, nbytes);
        in = tmp;
    }
    MPI_CHECK(MPI_Allgather(in, k, MPI_BYTE, out, k, MPI_BYTE, m->c[g]));
}

// Byte counts/displacements [size] on the host; send and recv must not overlap.
static void mpi_all_to_all_v(Comm* c, GroupId g, const void* send, const size_t* send_counts,
                             const size_t* send_displs, void* recv, const size_t* recv_counts,
                             const size_t* recv_displs) {
    MpiComm* m = impl(c, g);
    int size = c->size[g];
    int *sc = m->counts, *sd = sc + m->max_size, *rc = sd + m->max_size, *rd = rc + m->max_size;
    for (int p = 0; p < size; p++) {
        sc[p] = icount(send_counts[p], "all_to_all_v send count");
        sd[p] = icount(send_displs[p], "all_to_all_v send displacement");
        rc[p] = icount(recv_counts[p], "all_to_all_v recv count");
        rd[p] = icount(recv_displs[p], "all_to_all_v recv displacement");
    }
    MPI_CHECK(MPI_Alltoallv(send, sc, sd, MPI_BYTE, recv, rc, rd, MPI_BYTE, m->c[g]));
}

static void mpi_host_all_to_all_i32(Comm* c, GroupId g, const int32_t* send, int32_t* recv, int n_each) {
    MpiComm* m = impl(c, g);
    MPI_CHECK(MPI_Alltoall(send, n_each, MPI_INT32_T, recv, n_each, MPI_INT32_T, m->c[g]));
}

static void mpi_host_all_reduce_f64(Comm* c, GroupId g, double* buf, size_t n) {
    MpiComm* m = impl(c, g);
    allreduce_chunks(m->c[g], buf, n, MPI_DOUBLE, sizeof(double), MPI_SUM);
}

static void mpi_host_all_reduce_max_i32(Comm* c, GroupId g, int32_t* buf, size_t n) {
    MpiComm* m = impl(c, g);
    allreduce_chunks(m->c[g], buf, n, MPI_INT32_T, sizeof(int32_t), MPI_MAX);
}

static void mpi_host_broadcast(Comm* c, GroupId g, void* buf, size_t nbytes, int root) {
    MpiComm* m = impl(c, g);
    char* p = buf;
    do {  // at least one call, so a bad root is reported even for an empty message
        int k = nbytes > (size_t)INT_MAX ? INT_MAX : (int)nbytes;
        MPI_CHECK(MPI_Bcast(p, k, MPI_BYTE, root, m->c[g]));
        p += k;
        nbytes -= (size_t)k;
    } while (nbytes > 0);
}

static void mpi_barrier(Comm* c, GroupId g) {
    MpiComm* m = impl(c, g);
    MPI_CHECK(MPI_Barrier(m->c[g]));
}

static void mpi_destroy(Comm* c) {
    if (!c) return;
    MpiComm* m = c->impl;
    for (int g = 0; g < GROUP_COUNT; g++) MPI_CHECK(MPI_Comm_free(&m->c[g]));
    free(m->counts);
    free(m->scratch);
    free(m);
    free(c);
}

Comm* comm_mpi_create(int ep) {
    int rank = 0, world = 1;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world));
    CHECK(ep >= 1 && world % ep == 0,
          "expert-parallel size ep=%d does not divide the world size %d; launch a multiple of "
          "ep ranks (mpirun -np) or choose an ep that divides %d", ep, world, world);
    MpiComm* m = xcalloc(1, sizeof *m);
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &m->c[GROUP_WORLD]));
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, rank / ep, rank, &m->c[GROUP_EP]));
    MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, rank % ep, rank, &m->c[GROUP_EDP]));
    m->max_size = world;
    m->counts = xcalloc(4 * (size_t)world, sizeof(int));

    Comm* c = xcalloc(1, sizeof *c);
    c->impl = m;
    for (int g = 0; g < GROUP_COUNT; g++) {
        MPI_CHECK(MPI_Comm_rank(m->c[g], &c->rank[g]));
        MPI_CHECK(MPI_Comm_size(m->c[g], &c->size[g]));
    }
    CHECK(c->rank[GROUP_EP] == rank % ep && c->size[GROUP_EP] == ep &&
          c->rank[GROUP_EDP] == rank / ep && c->size[GROUP_EDP] == world / ep,
          "communicator split gave ep %d/%d, edp %d/%d for world rank %d (ep=%d)",
          c->rank[GROUP_EP], c->size[GROUP_EP], c->rank[GROUP_EDP], c->size[GROUP_EDP], rank, ep);
    c->all_reduce_sum = mpi_all_reduce_sum;
    c->reduce_scatter_sum = mpi_reduce_scatter_sum;
    c->all_gather = mpi_all_gather;
    c->all_to_all_v = mpi_all_to_all_v;
    c->host_all_to_all_i32 = mpi_host_all_to_all_i32;
    c->host_all_reduce_f64 = mpi_host_all_reduce_f64;
    c->host_all_reduce_max_i32 = mpi_host_all_reduce_max_i32;
    c->host_all_gather = mpi_all_gather;
    c->host_broadcast = mpi_host_broadcast;
    c->barrier = mpi_barrier;
    c->destroy = mpi_destroy;
    return c;
}
