// comm.h — collectives over named groups (world, ep, edp).
//
// Layout: world = ep × edp. Rank r has ep_rank = r % ep and edp_rank = r / ep, so the EP group
// is consecutive ranks (one node's GPUs when ep ≤ 8) and holds experts
// [ep_rank·E/ep, (ep_rank+1)·E/ep). Ranks with the same ep_rank form the edp group.
//
// Three implementations: MPI on host memory (CPU backend), NCCL on device memory (CUDA backend;
// MPI launches and bootstraps it), and MPI with device buffers staged through host memory
// (parallel.comm=mpi). Buffers are in the memory of the backend the Comm
// was made for. All calls are collective over the group and blocking for the host in MPI;
// in NCCL they are enqueued on the backend stream.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "util.h"

typedef enum { GROUP_WORLD = 0, GROUP_EP = 1, GROUP_EDP = 2, GROUP_COUNT = 3 } GroupId;

typedef struct Comm Comm;
struct Comm {
    int rank[GROUP_COUNT];  // this rank's index in each group
    int size[GROUP_COUNT];
    void* impl;

    // In place: buf[n] = Σ over group (fp32).
    void (*all_reduce_sum)(Comm*, GroupId, float* buf, size_t n);
    // in[n·size] → out[n] = Σ over group of chunk rank of in (fp32). n per rank.
    // In place when out == in + rank·n (NCCL's rule; MPI copies through scratch).
    void (*reduce_scatter_sum)(Comm*, GroupId, float* out, const float* in, size_t n);
    // in[n] from every rank → out[n·size], rank-major. Raw bytes (n in bytes).
    // In place when in == out + rank·n.
    void (*all_gather)(Comm*, GroupId, void* out, const void* in, size_t nbytes);
    // Variable all-to-all of bytes: send_counts/displs, recv_counts/displs are host arrays
    // [size] in bytes. send and recv must not overlap; zero counts are fine.
    void (*all_to_all_v)(Comm*, GroupId, const void* send, const size_t* send_counts,
                         const size_t* send_displs, void* recv, const size_t* recv_counts,
                         const size_t* recv_displs);
    // Host-memory helpers for small control data (always over MPI, even for NCCL comms):
    void (*host_all_to_all_i32)(Comm*, GroupId, const int32_t* send, int32_t* recv, int n_each);
    void (*host_all_reduce_f64)(Comm*, GroupId, double* buf, size_t n);  // sum
    void (*host_all_reduce_max_i32)(Comm*, GroupId, int32_t* buf, size_t n);
    void (*host_all_gather)(Comm*, GroupId, void* out, const void* in, size_t nbytes);
    void (*host_broadcast)(Comm*, GroupId, void* buf, size_t nbytes, int root);
    void (*barrier)(Comm*, GroupId);
    void (*destroy)(Comm*);
};

// What a backend's comm_create (backend.h) is asked for. The backend picks the transport that fits
// its memory (cpu: MPI on host memory; cuda: NCCL on its stream); a user's choice of transport,
// where there is one, is a field here that the backend's comm_create reads.
typedef struct CommOpts {
    int ep;      // expert-parallel size (parallel.ep); must divide the world size
    int staged;  // parallel.comm=mpi: MPI, device buffers staged through host memory (comm_staged.c)
} CommOpts;

// MPI: call after MPI_Init (dist_init). ep must divide the world size.
Comm* comm_mpi_create(int ep);
// parallel.comm=mpi on a device backend (comm_staged.c): the MPI Comm, with device buffers staged
// through the backend's host memory (page-locked on CUDA). No NCCL; ranks may share a GPU. On
// the CPU backend the staging is a host copy. be must outlive the Comm.
typedef struct Backend Backend;
Comm* comm_staged_create(int ep, Backend* be);
// NCCL over the same layout; built only with CUDA (returns NULL otherwise). `stream` is the
// CUDA backend's stream (cudaStream_t passed as void*). Call it after cudaSetDevice(local
// rank); collective over the world (builds world, ep, edp NCCL communicators). Its barrier
// waits for the stream, then meets the group over MPI.
Comm* comm_nccl_create(int ep, void* stream);
// A Comm that counts each collective call it passes on to `inner` (watchdog.h's
// watchdog_collective: the watchdog then names a rank that stopped between two collectives of
// one stage). Its destroy destroys inner.
Comm* comm_watched(Comm* inner);

// Process-wide MPI start/stop. dist_init installs an abort hook so that FATAL on any rank
// ends every rank (MPI_Abort). Returns the world rank; *world receives the size.
int dist_init(int* argc, char*** argv, int* world);
void dist_finalize(void);
// Called when a recoverable error (bad config) happened on some ranks: every rank calls it with
// its own status; returns the max over ranks (so all ranks exit together, nothing hangs).
// A negative status counts as 2.
int dist_agree_status(int status);
// Like dist_agree_status, and the lowest failing rank's message is copied into e on every
// rank (so rank 0 can print it). Returns 0 when no rank failed. When that rank is not rank 0,
// the message is prefixed with "rank R: " (rank 0 prints "moetrain: error: rank 3: ...").
int dist_agree_error(int status, Err* e);
// Rank among the processes of this node (the GPU to use): MPI_Comm_split_type(SHARED), or
// OMPI_COMM_WORLD_LOCAL_RANK / SLURM_LOCALID before MPI is up. The caller does cudaSetDevice.
int dist_local_rank(void);
// The world's size (MPI_COMM_WORLD; 1 before MPI_Init), no communication.
int dist_world_size(void);
