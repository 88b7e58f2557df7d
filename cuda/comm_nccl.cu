// comm_nccl.cu — the Comm interface over NCCL on device memory (the CUDA backend). See comm.h.
//
// MPI launches and bootstraps: comm_mpi_create(ep) gives the layout (ranks and sizes of world,
// ep, edp) and the host_* helpers, and carries the ncclUniqueIds — group rank 0 calls
// ncclGetUniqueId, host_broadcast sends it over that group's MPI communicator, and every member
// calls ncclCommInitRank. No mpi.h here: the MPI side stays in src/comm_mpi.c.
//
// The caller must have selected its GPU (cudaSetDevice(dist_local_rank())) before
// comm_nccl_create: NCCL binds each communicator to the current device.
//
// Every device collective is enqueued on the backend stream and returns at once; the host
// learns nothing until the stream is synchronized. A group of one rank never touches NCCL
// (reductions are no-ops, gathers and all-to-alls copies). A group with the same members in
// the same order as the world (ep = world, or ep = 1 for edp) shares the world's communicator.
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "comm.h"
#include "util.h"
}

// ---- checks: "moetrain: rank R: file:line: NCCL error in `stmt`: message (device D)" ---------
static void nccl_fail(const char* what, const char* lib, const char* msg, const char* detail,
                      const char* file, int line) __attribute__((noreturn));
static void nccl_fail(const char* what, const char* lib, const char* msg, const char* detail,
                      const char* file, int line) {
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) dev = -1;
    fatal_at(file, line, "%s error in `%s`: %s%s%s (device %d)", lib, what, msg,
             detail && detail[0] ? ": " : "", detail ? detail : "", dev);
}
#define NCCL_CHECK(stmt)                                                                     \
    do {                                                                                     \
        ncclResult_t nccl_check_r_ = (stmt);                                                 \
        if (nccl_check_r_ != ncclSuccess)                                                    \
            nccl_fail(#stmt, "NCCL", ncclGetErrorString(nccl_check_r_), ncclGetLastError(NULL), \
                      __FILE__, __LINE__);                                                   \
    } while (0)
#define NCCL_CUDA_CHECK(stmt)                                                                \
    do {                                                                                     \
        cudaError_t nccl_cuda_e_ = (stmt);                                                   \
        if (nccl_cuda_e_ != cudaSuccess)                                                     \
            nccl_fail(#stmt, "CUDA", cudaGetErrorString(nccl_cuda_e_), NULL, __FILE__, __LINE__); \
    } while (0)

typedef struct NcclImpl {
    Comm* host;                     // MPI comm over the same layout (host_* and bootstrap)
    ncclComm_t nc[GROUP_COUNT];     // NULL for a group of one rank
    int owns[GROUP_COUNT];          // 0 when nc[g] is the world's communicator, shared
    cudaStream_t stream;            // the backend stream every collective is enqueued on
} NcclImpl;

static NcclImpl* impl(Comm* c, GroupId g) {
    CHECK(g >= 0 && g < GROUP_COUNT, "invalid communicator group %d", (int)g);
    return (NcclImpl*)c->impl;
}

static void d2d(void* dst, const void* src, size_t bytes, cudaStream_t s) {
    if (bytes && dst != src) NCCL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
}

// ---- device collectives ----------------------------------------------------------------------
static void nc_all_reduce_sum(Comm* c, GroupId g, float* buf, size_t n) {
    NcclImpl* m = impl(c, g);
    if (n == 0 || c->size[g] == 1) return;
    NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, m->nc[g], m->stream));
}

// in[n * size] -> out[n]; in place when out == in + rank * n (NCCL's own rule).
static void nc_reduce_scatter_sum(Comm* c, GroupId g, float* out, const float* in, size_t n) {
    NcclImpl* m = impl(c, g);
    if (n == 0) return;
    if (c->size[g] == 1) { d2d(out, in, n * sizeof(float), m->stream); return; }
    NCCL_CHECK(ncclReduceScatter(in, out, n, ncclFloat, ncclSum, m->nc[g], m->stream));
}

// in[nbytes] -> out[nbytes * size], rank-major; in place when in == out + rank * nbytes.
static void nc_all_gather(Comm* c, GroupId g, void* out, const void* in, size_t nbytes) {
    NcclImpl* m = impl(c, g);
    if (nbytes == 0) return;
    if (c->size[g] == 1) { d2d(out, in, nbytes, m->stream); return; }
    NCCL_CHECK(ncclAllGather(in, out, nbytes, ncclUint8, m->nc[g], m->stream));
}

// Grouped ncclSend/ncclRecv, one pair per peer with a non-zero count (both sides agree on every
// count, so skipping zeros is symmetric); the rank's own block is a device copy.
static void nc_all_to_all_v(Comm* c, GroupId g, const void* send, const size_t* send_counts,
                            const size_t* send_displs, void* recv, const size_t* recv_counts,
                            const size_t* recv_displs) {
    NcclImpl* m = impl(c, g);
    const int size = c->size[g], me = c->rank[g];
    const char* s = (const char*)send;
    char* r = (char*)recv;
    CHECK(send_counts[me] == recv_counts[me],
          "all_to_all_v: this rank sends itself %zu bytes but expects %zu", send_counts[me], recv_counts[me]);
    d2d(r + recv_displs[me], s + send_displs[me], send_counts[me], m->stream);
    if (size == 1) return;
    NCCL_CHECK(ncclGroupStart());
    for (int p = 0; p < size; p++) {
        if (p == me) continue;
        if (send_counts[p])
            NCCL_CHECK(ncclSend(s + send_displs[p], send_counts[p], ncclUint8, p, m->nc[g], m->stream));
        if (recv_counts[p])
            NCCL_CHECK(ncclRecv(r + recv_displs[p], recv_counts[p], ncclUint8, p, m->nc[g], m->stream));
    }
    NCCL_CHECK(ncclGroupEnd());
}

// ---- host helpers: forwarded to the MPI comm ---------------------------------------------------
static void nc_host_all_to_all_i32(Comm* c, GroupId g, const int32_t* send, int32_t* recv, int n_each) {
    Comm* h = impl(c, g)->host;
    h->host_all_to_all_i32(h, g, send, recv, n_each);
}
static void nc_host_all_reduce_f64(Comm* c, GroupId g, double* buf, size_t n) {
    Comm* h = impl(c, g)->host;
    h->host_all_reduce_f64(h, g, buf, n);
}
static void nc_host_all_reduce_max_i32(Comm* c, GroupId g, int32_t* buf, size_t n) {
    Comm* h = impl(c, g)->host;
    h->host_all_reduce_max_i32(h, g, buf, n);
}
static void nc_host_all_gather(Comm* c, GroupId g, void* out, const void* in, size_t nbytes) {
    Comm* h = impl(c, g)->host;
    h->host_all_gather(h, g, out, in, nbytes);
}
static void nc_host_broadcast(Comm* c, GroupId g, void* buf, size_t nbytes, int root) {
    Comm* h = impl(c, g)->host;
    h->host_broadcast(h, g, buf, nbytes, root);
}

// Everything this rank enqueued has finished, and every member of the group got here.
static void nc_barrier(Comm* c, GroupId g) {
    NcclImpl* m = impl(c, g);
    NCCL_CUDA_CHECK(cudaStreamSynchronize(m->stream));
    m->host->barrier(m->host, g);
}

static void nc_destroy(Comm* c) {
    if (!c) return;
    NcclImpl* m = (NcclImpl*)c->impl;
    NCCL_CUDA_CHECK(cudaStreamSynchronize(m->stream));
    for (int g = 0; g < GROUP_COUNT; g++) {
        if (!m->nc[g] || !m->owns[g]) continue;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
        NCCL_CHECK(ncclCommFinalize(m->nc[g]));  // flushes outstanding work (blocking comm)
#endif
        NCCL_CHECK(ncclCommDestroy(m->nc[g]));
    }
    m->host->destroy(m->host);
    free(m);
    free(c);
}

extern "C" Comm* comm_nccl_create(int ep, void* stream) {
    Comm* host = comm_mpi_create(ep);  // checks that ep divides the world
    NcclImpl* m = (NcclImpl*)xcalloc(1, sizeof *m);
    m->host = host;
    m->stream = (cudaStream_t)stream;
    const int world = host->size[GROUP_WORLD];
    for (int gi = 0; gi < GROUP_COUNT; gi++) {
        GroupId g = (GroupId)gi;
        const int size = host->size[g], rank = host->rank[g];
        if (size == 1) continue;
        if (g != GROUP_WORLD && size == world) {  // same members, same order as the world
            m->nc[g] = m->nc[GROUP_WORLD];
            continue;
        }
        ncclUniqueId id;
        memset(&id, 0, sizeof id);
        if (rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
        host->host_broadcast(host, g, &id, sizeof id, 0);
        NCCL_CHECK(ncclCommInitRank(&m->nc[g], size, id, rank));
        m->owns[g] = 1;
    }
    Comm* c = (Comm*)xcalloc(1, sizeof *c);
    memcpy(c->rank, host->rank, sizeof c->rank);
    memcpy(c->size, host->size, sizeof c->size);
    c->impl = m;
    c->all_reduce_sum = nc_all_reduce_sum;
    c->reduce_scatter_sum = nc_reduce_scatter_sum;
    c->all_gather = nc_all_gather;
    c->all_to_all_v = nc_all_to_all_v;
    c->host_all_to_all_i32 = nc_host_all_to_all_i32;
    c->host_all_reduce_f64 = nc_host_all_reduce_f64;
    c->host_all_reduce_max_i32 = nc_host_all_reduce_max_i32;
    c->host_all_gather = nc_host_all_gather;
    c->host_broadcast = nc_host_broadcast;
    c->barrier = nc_barrier;
    c->destroy = nc_destroy;
    return c;
}
