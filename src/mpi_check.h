// mpi_check.h — the MPI check macro (host C only: cuda/ never includes mpi.h).
//
// dist_init sets MPI_ERRORS_RETURN on MPI_COMM_WORLD (and the sub-communicators inherit it), so
// a failing MPI call returns here instead of aborting inside MPI: MPI_CHECK prints the failing
// statement, file:line, rank (and device when set) and MPI's own error string, then aborts every
// rank through the FATAL path (MPI_Abort).
#pragma once
#include <mpi.h>

#include "util.h"

#define MPI_CHECK(stmt)                                                                    \
    do {                                                                                   \
        int mpi_check_rc_ = (stmt);                                                        \
        if (mpi_check_rc_ != MPI_SUCCESS) {                                                \
            char mpi_check_msg_[MPI_MAX_ERROR_STRING];                                     \
            int mpi_check_len_ = 0;                                                        \
            if (MPI_Error_string(mpi_check_rc_, mpi_check_msg_, &mpi_check_len_) != MPI_SUCCESS) \
                snprintf(mpi_check_msg_, sizeof mpi_check_msg_, "error code %d", mpi_check_rc_); \
            fatal_at(__FILE__, __LINE__, "MPI error in `%s`: %s", #stmt, mpi_check_msg_);  \
        }                                                                                  \
    } while (0)
