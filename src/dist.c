// dist.c — process-wide MPI start/stop, agreement on errors, node-local rank. See comm.h.
//
// A FATAL on any rank must end every rank within seconds, not leave the others waiting in a
// collective forever: dist_init installs an abort hook (util_set_abort_hook) that calls
// MPI_Abort on the world, and sets MPI_ERRORS_RETURN so that MPI_CHECK can name the failing
// call before aborting. Recoverable errors (bad config, missing file) go through
// dist_agree_error so every rank exits with the same status and rank 0 can print the message.
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "mpi_check.h"

static int mpi_live(void) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

static void abort_hook(int code) {
    if (mpi_live()) MPI_Abort(MPI_COMM_WORLD, code ? code : 1);
}

int dist_init(int* argc, char*** argv, int* world) {
    int init = 0;
    MPI_Initialized(&init);
    if (!init) {
        // Only the main thread calls MPI; OpenMP threads inside ops never do (FUNNELED).
        int provided = 0;
        int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) {
            fprintf(stderr, "moetrain: MPI_Init failed (code %d); launch with mpirun or srun, "
                            "and check the MPI installation (scripts/deps.sh)\n", rc);
            exit(1);
        }
    }
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    int rank = 0, size = 1;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    util_set_rank(rank, -1);
    util_set_abort_hook(abort_hook);
    if (world) *world = size;
    return rank;
}

void dist_finalize(void) {
    if (!mpi_live()) return;
    fflush(stdout);
    fflush(stderr);
    util_set_abort_hook(NULL);
    MPI_Finalize();
}

// A negative status (a function's -1 passed on as it is) counts as a user error, 2: MAX must
// never let it look like success.
static int norm(int status) { return status < 0 ? 2 : status; }

int dist_agree_status(int status) {
    status = norm(status);
    if (!mpi_live()) return status;
    int agreed = 0;
    MPI_CHECK(MPI_Allreduce(&status, &agreed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    return agreed;
}

int dist_agree_error(int status, Err* e) {
    status = norm(status);
    if (!mpi_live()) return status;
    int rank = 0, size = 1;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    // v[0]: worst status; v[1]: size - (lowest failing rank), so MAX finds the lowest rank.
    int mine[2] = {status, status ? size - rank : 0}, v[2];
    MPI_CHECK(MPI_Allreduce(mine, v, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    if (v[0] == 0) return 0;
    int first = size - v[1];
    char msg[sizeof e->msg] = "(no message)";
    if (rank == first && e && e->msg[0]) snprintf(msg, sizeof msg, "%s", e->msg);
    MPI_CHECK(MPI_Bcast(msg, (int)sizeof msg, MPI_CHAR, first, MPI_COMM_WORLD));
    msg[sizeof msg - 1] = '\0';
    // A failure that rank 0 did not see itself names the rank it came from, so rank 0 prints
    // "moetrain: error: rank 3: <msg>". When rank 0 failed too (a bad config fails everywhere
    // alike) the message stays as it is.
    if (e) {
        if (first == 0) snprintf(e->msg, sizeof e->msg, "%s", msg);
        else snprintf(e->msg, sizeof e->msg, "rank %d: %.*s", first, (int)sizeof e->msg - 16, msg);
    }
    return v[0];
}

int dist_world_size(void) {
    int size = 1;
    if (mpi_live()) MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    return size;
}

int dist_local_rank(void) {
    static int cached = -1;
    if (cached >= 0) return cached;
    if (!mpi_live()) {
        const char* vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID",
                              "PMI_LOCAL_RANK"};
        for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
            const char* v = getenv(vars[i]);
            if (v && *v) return atoi(v);
        }
        return 0;
    }
    int rank = 0, local = 0;
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_rank(node, &local));
    MPI_CHECK(MPI_Comm_free(&node));
    cached = local;
    return local;
}
