// dist.c — process layer: MPI start/stop, local rank, agreeing on errors so nothing hangs.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "util.h"

static int g_mpi_up = 0;

static void mpi_abort_hook(int code) {
    if (g_mpi_up) MPI_Abort(MPI_COMM_WORLD, code ? code : 1);
}

int dist_init(int* argc, char*** argv, int* world) {
    int up = 0;
    MPI_Initialized(&up);
    if (!up) MPI_Init(argc, argv);
    g_mpi_up = 1;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, world);
    util_set_rank(rank, -1);
    util_set_abort_hook(mpi_abort_hook);
    return rank;
}

void dist_finalize(void) {
    if (!g_mpi_up) return;
    g_mpi_up = 0;
    util_set_abort_hook(NULL);
    MPI_Finalize();
}

int dist_agree_status(int status) {
    if (!g_mpi_up) return status;
    int out = status;
    MPI_Allreduce(&status, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return out;
}

int dist_agree_error(int status, Err* e) {
    if (!g_mpi_up) return status;
    int world = 1, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    // The lowest failing rank's message reaches every rank.
    int mine = status ? rank : world, first = world;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first == world) return 0;
    int code = dist_agree_status(status);
    char msg[sizeof e->msg];
    if (rank == first) memcpy(msg, e->msg, sizeof msg);
    MPI_Bcast(msg, (int)sizeof msg, MPI_CHAR, first, MPI_COMM_WORLD);
    memcpy(e->msg, msg, sizeof msg);
    return code;
}

int dist_local_rank(void) {
    if (!g_mpi_up) return 0;
    MPI_Comm local;
    int r = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &r);
    MPI_Comm_free(&local);
    return r;
}
