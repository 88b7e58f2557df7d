// mpi_dispatch_np2.c — the dispatcher tests of mpi_dispatch_np4.c on 2 ranks: pure EP=2 (world =
// the EP group, no EDP), where mpi_dispatch_np4 runs EP=2 as EP=2 x EDP=2 and EP=4.
#include "mpi_dispatch_np4.c"
