// mpi_test.h — the scaffolding of the tests that run under mpirun (tests/mpi_*.c; run_tests.sh
// starts mpi_*_npK with K ranks, others with 2):
//
//   mpi_test_init       dist_init, and this rank and the world size in mt_rank / mt_world
//   mpi_test_dir        a scratch directory every rank shares (made by rank 0, broadcast), and
//                       mt_rank_dir, this rank's own directory inside it
//   mpi_test_note       text that follows each case's ok / FAIL line (the layout it ran on)
//   MRUN(fn)            runs a case on every rank; it failed when it failed on any rank, and it
//                       counts once (rank 0 prints its line)
//   MPI_TEST_END()      removes the scratch directory when everything passed (else names it),
//                       finalizes MPI, and rank 0 prints the one `N passed, N failed` line
#pragma once
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "comm.h"
#include "test.h"
#include "util.h"

static int mt_rank, mt_world;
static char mt_dir[256];         // "" until mpi_test_dir
static char mt_rank_dir[300];    // mt_dir/rank_R
static char mt_note[128];
static const char* mt_name = "";

static inline void mpi_test_init(int* argc, char*** argv, const char* name) {
    mt_rank = dist_init(argc, argv, &mt_world);
    mt_name = name;
}

// TMPDIR/NAME_XXXXXX (or /tmp), the same path on every rank; collective.
static inline void mpi_test_dir(void) {
    if (mt_rank == 0) {
        const char* tmp = getenv("TMPDIR");
        snprintf(mt_dir, sizeof mt_dir, "%s/%s_XXXXXX", tmp && tmp[0] ? tmp : "/tmp", mt_name);
        CHECK(mkdtemp(mt_dir), "mkdtemp %s failed", mt_dir);
    }
    MPI_Bcast(mt_dir, sizeof mt_dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    snprintf(mt_rank_dir, sizeof mt_rank_dir, "%s/rank_%d", mt_dir, mt_rank);
    CHECK(mkdir(mt_rank_dir, 0755) == 0, "mkdir %s failed", mt_rank_dir);
}

static inline void mpi_test_note(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void mpi_test_note(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(mt_note, sizeof mt_note, fmt, ap);
    va_end(ap);
}

#define MRUN(fn)                                                                                   \
    do {                                                                                           \
        t_cur = #fn;                                                                               \
        t_cur_failed = 0;                                                                          \
        fn();                                                                                      \
        int any_ = 0;                                                                              \
        MPI_Allreduce(&t_cur_failed, &any_, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);                  \
        if (any_) t_failed++;                                                                      \
        else t_passed++;                                                                           \
        if (mt_rank == 0) {                                                                        \
            printf("%s %s%s%s\n", any_ ? "FAIL" : "ok  ", #fn, mt_note[0] ? " " : "", mt_note);    \
            fflush(stdout);                                                                        \
        }                                                                                          \
    } while (0)

// Every rank holds the same counts (MRUN reduces each case), so every rank exits alike.
static inline int mpi_test_end(void) {
    fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    if (mt_rank == 0 && mt_dir[0]) {
        if (!t_failed) {
            char cmd[300];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", mt_dir);
            if (system(cmd)) fprintf(stderr, "%s: could not remove %s\n", mt_name, mt_dir);
        } else {
            fprintf(stderr, "%s: files kept in %s\n", mt_name, mt_dir);
        }
    }
    if (mt_rank == 0) printf("%d passed, %d failed\n", t_passed, t_failed);
    fflush(stdout);
    dist_finalize();
    return t_failed ? 1 : 0;
}
#define MPI_TEST_END() return mpi_test_end()
