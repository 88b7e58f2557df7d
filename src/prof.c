// prof.c — see prof.h.
#include "prof.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"
#ifdef MOETRAIN_CUDA
#include <cuda_runtime_api.h>
#endif

enum { MAX_STAGES = 64, MAX_MARKS = 4096 };
static struct {
    int on, events, steps, done;
    Backend* be;
    double last;
    int n;
    const char* name[MAX_STAGES];
    double t[MAX_STAGES];
    long calls[MAX_STAGES];
#ifdef MOETRAIN_CUDA
    // events mode: this step's marks (stage index, event); ev_last closes the previous step
    cudaStream_t stream;
    cudaEvent_t ev[MAX_MARKS], ev_last;
    int stage_of[MAX_MARKS], nm, have_last;
#endif
} P;

static int stage_index(const char* stage) {
    int i = 0;
    while (i < P.n && strcmp(P.name[i], stage) != 0) i++;
    if (i == P.n) {
        if (P.n == MAX_STAGES) return -1;
        P.name[P.n++] = stage;
    }
    return i;
}

#ifdef MOETRAIN_CUDA
static void cuda_ck(cudaError_t e, const char* what) {
    if (e != cudaSuccess) FATAL("profiler: %s: %s", what, cudaGetErrorString(e));
}
#endif

void prof_init(Backend* be) {
    const char* v = getenv("MOETRAIN_PROFILE");
    memset(&P, 0, sizeof P);
    P.on = v && *v && strcmp(v, "0") != 0;
    P.be = be;
    P.last = now_sec();
    if (!P.on || strcmp(v, "events") != 0) return;
#ifdef MOETRAIN_CUDA
    P.stream = (cudaStream_t)cuda_backend_stream(be);
    if (P.stream) {
        P.events = 1;
        for (int i = 0; i < MAX_MARKS; i++) cuda_ck(cudaEventCreate(&P.ev[i]), "cudaEventCreate");
        cuda_ck(cudaEventCreate(&P.ev_last), "cudaEventCreate");
        return;
    }
#endif
    fprintf(stderr, "moetrain: MOETRAIN_PROFILE=events needs the CUDA backend; profiling with a sync per stage\n");
}

int prof_on(void) { return P.on; }

void prof_mark(const char* stage) {
    if (!P.on) return;
#ifdef MOETRAIN_CUDA
    if (P.events) {  // an event on the stream, read at the end of the step; no sync
        if (P.nm == MAX_MARKS) {
            static int warned;
            if (!warned++)
                fprintf(stderr, "moetrain: MOETRAIN_PROFILE=events: more than %d stage marks in a step; the rest of "
                                "such a step is not counted (MOETRAIN_PROFILE=1 counts every stage)\n", MAX_MARKS);
            return;
        }
        cuda_ck(cudaEventRecord(P.ev[P.nm], P.stream), "cudaEventRecord");
        P.stage_of[P.nm++] = stage_index(stage);
        return;
    }
#endif
    P.be->sync(P.be);
    const double t = now_sec(), dt = t - P.last;
    P.last = t;
    if (P.done < 2) return;  // warm-up steps
    const int i = stage_index(stage);
    if (i < 0) return;
    P.t[i] += dt;
    P.calls[i]++;
}

void prof_step_done(void) {
    if (!P.on) return;
    prof_mark("host.other");
#ifdef MOETRAIN_CUDA
    if (P.events) {  // each mark's time since the previous one (the first: since the last step's end)
        cuda_ck(cudaEventSynchronize(P.ev[P.nm - 1]), "cudaEventSynchronize");
        for (int k = 0; k < P.nm && P.done >= 2; k++) {
            if (k == 0 && !P.have_last) continue;
            float ms = 0;
            cuda_ck(cudaEventElapsedTime(&ms, k ? P.ev[k - 1] : P.ev_last, P.ev[k]), "cudaEventElapsedTime");
            const int i = P.stage_of[k];
            if (i < 0) continue;
            P.t[i] += ms * 1e-3;
            P.calls[i]++;
        }
        cuda_ck(cudaEventRecord(P.ev_last, P.stream), "cudaEventRecord");  // after the sync: the step's end
        P.have_last = 1;
        P.nm = 0;
    }
#endif
    if (++P.done > 2) P.steps++;
}

void prof_report(FILE* f) {
    if (!P.on || P.steps == 0 || P.n == 0) return;
    double total = 0;
    int idx[MAX_STAGES];
    for (int i = 0; i < P.n; i++) total += P.t[i], idx[i] = i;
    for (int i = 1; i < P.n; i++)  // insertion sort, largest first
        for (int j = i; j > 0 && P.t[idx[j]] > P.t[idx[j - 1]]; j--) {
            int x = idx[j];
            idx[j] = idx[j - 1];
            idx[j - 1] = x;
        }
    fprintf(f, "profile: %d steps, %.2f ms per step (%s)\n", P.steps, 1e3 * total / P.steps,
            P.events ? "device events, no syncs: the first stage of a step includes the gap since the last one"
                     : "synchronised after every stage");
    fprintf(f, "  %-22s %10s %7s %9s\n", "stage", "ms/step", "share", "calls/step");
    for (int k = 0; k < P.n; k++) {
        int i = idx[k];
        fprintf(f, "  %-22s %10.3f %6.1f%% %9.1f\n", P.name[i], 1e3 * P.t[i] / P.steps, 100 * P.t[i] / total,
                (double)P.calls[i] / P.steps);
    }
    fflush(f);
}
