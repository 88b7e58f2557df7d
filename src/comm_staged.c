// comm_staged.c — parallel.comm=mpi on a device backend: the Comm interface over the MPI Comm,
// with every device buffer staged through host memory (the backend's host_alloc: page-locked
// on CUDA). So GPU ranks need no NCCL, and several ranks may share one GPU (mpirun -np 2 on a
// one-GPU machine runs EP=2: dispatch, gradient reduction, ZeRO-1, checkpoints). See comm.h.
//
// Each collective: device → host (to_host, which waits for the backend's stream, so the data
// the ops before it produced is complete), the MPI collective between host buffers, host →
// device, and a sync, so the call blocks like the MPI Comm's and the staging buffers are free
// again when it returns. Two staging buffers (send side, receive side) grow to the largest
// message and are kept. The all-to-all copies back only the ranges it received: gaps between
// the receive displacements keep their device contents, as with NCCL and MPI. On the CPU
// backend the staging is a memcpy (the tests run this path there).
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "comm.h"

typedef struct Staged {
    Comm* mpi;       // the MPI Comm on host memory
    Backend* be;
    void* h[2];      // staging: [0] what is sent, [1] what is received
    size_t cap[2];
} Staged;

static Staged* S(Comm* c) { return (Staged*)c->impl; }

static void* stage(Staged* s, int i, size_t bytes) {
    if (bytes > s->cap[i]) {
        be_host_free(s->be, s->h[i]);
        size_t cap = s->cap[i] * 2 > bytes ? s->cap[i] * 2 : bytes;
        s->h[i] = be_host_alloc(s->be, cap);
        s->cap[i] = cap;
    }
    return s->h[i];
}

static void st_all_reduce_sum(Comm* c, GroupId g, float* buf, size_t n) {
    Staged* s = S(c);
    if (n == 0) return;
    float* h = stage(s, 0, n * sizeof(float));
    s->be->to_host(s->be, h, buf, n * sizeof(float));
    s->mpi->all_reduce_sum(s->mpi, g, h, n);
    s->be->to_device(s->be, buf, h, n * sizeof(float));
    s->be->sync(s->be);
}

static void st_reduce_scatter_sum(Comm* c, GroupId g, float* out, const float* in, size_t n) {
    Staged* s = S(c);
    if (n == 0) return;
    const size_t total = n * (size_t)c->size[g];
    float* hi = stage(s, 0, total * sizeof(float));
    float* ho = stage(s, 1, n * sizeof(float));
    s->be->to_host(s->be, hi, in, total * sizeof(float));  // all of in first: out may alias it
    s->mpi->reduce_scatter_sum(s->mpi, g, ho, hi, n);
    s->be->to_device(s->be, out, ho, n * sizeof(float));
    s->be->sync(s->be);
}

static void st_all_gather(Comm* c, GroupId g, void* out, const void* in, size_t nbytes) {
    Staged* s = S(c);
    if (nbytes == 0) return;
    const size_t total = nbytes * (size_t)c->size[g];
    void* hi = stage(s, 0, nbytes);
    void* ho = stage(s, 1, total);
    s->be->to_host(s->be, hi, in, nbytes);
    s->mpi->all_gather(s->mpi, g, ho, hi, nbytes);
    s->be->to_device(s->be, out, ho, total);
    s->be->sync(s->be);
}

static size_t extent(const size_t* counts, const size_t* displs, int size) {
    size_t e = 0;
    for (int p = 0; p < size; p++)
        if (counts[p] && displs[p] + counts[p] > e) e = displs[p] + counts[p];
    return e;
}

static void st_all_to_all_v(Comm* c, GroupId g, const void* send, const size_t* send_counts, const size_t* send_displs,
                            void* recv, const size_t* recv_counts, const size_t* recv_displs) {
    Staged* s = S(c);
    const int size = c->size[g];
    const size_t se = extent(send_counts, send_displs, size), re = extent(recv_counts, recv_displs, size);
    char* hs = stage(s, 0, se ? se : 1);
    char* hr = stage(s, 1, re ? re : 1);
    if (se) s->be->to_host(s->be, hs, send, se);
    s->mpi->all_to_all_v(s->mpi, g, hs, send_counts, send_displs, hr, recv_counts, recv_displs);
    // back only what arrived, runs of adjacent ranges joined
    for (int p = 0; p < size;) {
        if (!recv_counts[p]) { p++; continue; }
        size_t lo = recv_displs[p], hi = lo + recv_counts[p];
        int q = p + 1;
        while (q < size && (recv_counts[q] == 0 || recv_displs[q] == hi)) {
            if (recv_counts[q]) hi = recv_displs[q] + recv_counts[q];
            q++;
        }
        s->be->to_device(s->be, (char*)recv + lo, hr + lo, hi - lo);
        p = q;
    }
    s->be->sync(s->be);
}

// Host helpers: the MPI Comm's own.
static void st_host_all_to_all_i32(Comm* c, GroupId g, const int32_t* send, int32_t* recv, int n_each) {
    S(c)->mpi->host_all_to_all_i32(S(c)->mpi, g, send, recv, n_each);
}
static void st_host_all_reduce_f64(Comm* c, GroupId g, double* buf, size_t n) {
    S(c)->mpi->host_all_reduce_f64(S(c)->mpi, g, buf, n);
}
static void st_host_all_reduce_max_i32(Comm* c, GroupId g, int32_t* buf, size_t n) {
    S(c)->mpi->host_all_reduce_max_i32(S(c)->mpi, g, buf, n);
}
static void st_host_all_gather(Comm* c, GroupId g, void* out, const void* in, size_t nbytes) {
    S(c)->mpi->host_all_gather(S(c)->mpi, g, out, in, nbytes);
}
static void st_host_broadcast(Comm* c, GroupId g, void* buf, size_t nbytes, int root) {
    S(c)->mpi->host_broadcast(S(c)->mpi, g, buf, nbytes, root);
}

static void st_barrier(Comm* c, GroupId g) {
    S(c)->be->sync(S(c)->be);  // this rank's work is done, then the group meets
    S(c)->mpi->barrier(S(c)->mpi, g);
}

static void st_destroy(Comm* c) {
    if (!c) return;
    Staged* s = S(c);
    for (int i = 0; i < 2; i++) be_host_free(s->be, s->h[i]);
    s->mpi->destroy(s->mpi);
    free(s);
    free(c);
}

Comm* comm_staged_create(int ep, Backend* be) {
    Staged* s = xcalloc(1, sizeof *s);
    s->mpi = comm_mpi_create(ep);
    s->be = be;
    Comm* c = xcalloc(1, sizeof *c);
    memcpy(c->rank, s->mpi->rank, sizeof c->rank);
    memcpy(c->size, s->mpi->size, sizeof c->size);
    c->impl = s;
    c->all_reduce_sum = st_all_reduce_sum;
    c->reduce_scatter_sum = st_reduce_scatter_sum;
    c->all_gather = st_all_gather;
    c->all_to_all_v = st_all_to_all_v;
    c->host_all_to_all_i32 = st_host_all_to_all_i32;
    c->host_all_reduce_f64 = st_host_all_reduce_f64;
    c->host_all_reduce_max_i32 = st_host_all_reduce_max_i32;
    c->host_all_gather = st_host_all_gather;
    c->host_broadcast = st_host_broadcast;
    c->barrier = st_barrier;
    c->destroy = st_destroy;
    return c;
}
