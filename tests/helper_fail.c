// helper_fail.c — not a test by itself: tests/test_dist_fail.c launches it with
// `scripts/mpirun.sh -np 2 build/tests/helper_fail MODE` and checks how the job ends.
//   ok          every rank meets in a barrier and exits 0 (the control)
//   fatal       rank 1 calls FATAL while rank 0 waits in a barrier: MPI_Abort must end rank 0
//   fatal_busy  rank 1 calls FATAL while rank 0 computes (sleeps 60 s) outside MPI
//   usererr     rank 1 has a user error; dist_agree_error makes every rank exit 2, rank 0
//               prints the message the way cmd/train.c does
//   mpierr      a broadcast from an invalid root: MPI returns an error (MPI_ERRORS_RETURN) and
//               MPI_CHECK names the call before aborting
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "comm.h"

static void sleep_s(double s) {
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&t, NULL);
}

int main(int argc, char** argv) {
    int world = 1;
    int rank = dist_init(&argc, &argv, &world);
    const char* mode = argc > 1 ? argv[1] : "ok";
    Comm* c = comm_mpi_create(1);
    int rc = 0;
    if (!strcmp(mode, "ok")) {
        c->barrier(c, GROUP_WORLD);
        printf("helper: rank %d ok\n", rank);
    } else if (!strcmp(mode, "fatal") || !strcmp(mode, "fatal_busy")) {
        if (rank == 1) {
            sleep_s(0.2);
            FATAL("deliberate fatal on rank 1 (helper_fail %s)", mode);
        }
        if (!strcmp(mode, "fatal")) c->barrier(c, GROUP_WORLD);
        else sleep_s(60);
        printf("helper: rank %d was not stopped\n", rank);
    } else if (!strcmp(mode, "usererr")) {
        Err e = {{0}};
        int st = rank == 1 ? (err_set(&e, "bad value for key x (helper_fail user error)"), 2) : 0;
        rc = dist_agree_error(st, &e);
        if (rc && rank == 0) fprintf(stderr, "moetrain: error: %s\n", e.msg);
        printf("helper: rank %d exits %d\n", rank, rc);
    } else if (!strcmp(mode, "mpierr")) {
        char buf[4] = "abc";
        c->host_broadcast(c, GROUP_WORLD, buf, sizeof buf, world + 5);
        printf("helper: rank %d was not stopped\n", rank);
    } else {
        FATAL("helper_fail: unknown mode '%s' (ok, fatal, fatal_busy, usererr, mpierr)", mode);
    }
    fflush(stdout);
    c->destroy(c);
    dist_finalize();
    return rc;
}
