// comm_watch.c — comm_watched (comm.h): a Comm that counts its collective calls for the
// watchdog (watchdog_collective) and passes each on to the Comm it wraps.
#include <stdlib.h>

#include "comm.h"
#include "watchdog.h"

#define INNER(c) ((Comm*)(c)->impl)

static void w_all_reduce_sum(Comm* c, GroupId g, float* buf, size_t n) {
    watchdog_collective();
    INNER(c)->all_reduce_sum(INNER(c), g, buf, n);
}
static void w_reduce_scatter_sum(Comm* c, GroupId g, float* out, const float* in, size_t n) {
    watchdog_collective();
    INNER(c)->reduce_scatter_sum(INNER(c), g, out, in, n);
}
static void w_all_gather(Comm* c, GroupId g, void* out, const void* in, size_t nbytes) {
    watchdog_collective();
    INNER(c)->all_gather(INNER(c), g, out, in, nbytes);
}
static void w_all_to_all_v(Comm* c, GroupId g, const void* send, const size_t* sc, const size_t* sd, void* recv,
                           const size_t* rc, const size_t* rd) {
    watchdog_collective();
    INNER(c)->all_to_all_v(INNER(c), g, send, sc, sd, recv, rc, rd);
}
static void w_host_all_to_all_i32(Comm* c, GroupId g, const int32_t* send, int32_t* recv, int n_each) {
    watchdog_collective();
    INNER(c)->host_all_to_all_i32(INNER(c), g, send, recv, n_each);
}
static void w_host_all_reduce_f64(Comm* c, GroupId g, double* buf, size_t n) {
    watchdog_collective();
    INNER(c)->host_all_reduce_f64(INNER(c), g, buf, n);
}
static void w_host_all_reduce_max_i32(Comm* c, GroupId g, int32_t* buf, size_t n) {
    watchdog_collective();
    INNER(c)->host_all_reduce_max_i32(INNER(c), g, buf, n);
}
static void w_host_all_gather(Comm* c, GroupId g, void* out, const void* in, size_t nbytes) {
    watchdog_collective();
    INNER(c)->host_all_gather(INNER(c), g, out, in, nbytes);
}
static void w_host_broadcast(Comm* c, GroupId g, void* buf, size_t nbytes, int root) {
    watchdog_collective();
    INNER(c)->host_broadcast(INNER(c), g, buf, nbytes, root);
}
static void w_barrier(Comm* c, GroupId g) {
    watchdog_collective();
    INNER(c)->barrier(INNER(c), g);
}
static void w_destroy(Comm* c) {
    INNER(c)->destroy(INNER(c));
    free(c);
}

Comm* comm_watched(Comm* inner) {
    Comm* c = xcalloc(1, sizeof *c);
    for (int g = 0; g < GROUP_COUNT; g++) {
        c->rank[g] = inner->rank[g];
        c->size[g] = inner->size[g];
    }
    c->impl = inner;
    c->all_reduce_sum = w_all_reduce_sum;
    c->reduce_scatter_sum = w_reduce_scatter_sum;
    c->all_gather = w_all_gather;
    c->all_to_all_v = w_all_to_all_v;
    c->host_all_to_all_i32 = w_host_all_to_all_i32;
    c->host_all_reduce_f64 = w_host_all_reduce_f64;
    c->host_all_reduce_max_i32 = w_host_all_reduce_max_i32;
    c->host_all_gather = w_host_all_gather;
    c->host_broadcast = w_host_broadcast;
    c->barrier = w_barrier;
    c->destroy = w_destroy;
    return c;
}
