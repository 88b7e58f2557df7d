// nonccl.c — linked into CUDA builds only while cuda/comm_nccl.cu does not exist (see the
// Makefile): the CUDA backend is there, the NCCL communicator is not yet.
#include <stdio.h>

#include "comm.h"

Comm* comm_nccl_create(int ep, void* stream) {
    (void)ep;
    (void)stream;
    fprintf(stderr, "moetrain: this build has no NCCL communicator (cuda/comm_nccl.cu is missing); "
                    "set train.device=cpu or rebuild with it\n");
    return NULL;
}
