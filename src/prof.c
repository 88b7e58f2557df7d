// prof.c — see prof.h.
#include "prof.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

enum { MAX_STAGES = 64 };
static struct {
    int on, steps, done;
    Backend* be;
    double last;
    int n;
    const char* name[MAX_STAGES];
    double t[MAX_STAGES];
    long calls[MAX_STAGES];
} P;

void prof_init(Backend* be) {
    const char* v = getenv("MOETRAIN_PROFILE");
    memset(&P, 0, sizeof P);
    P.on = v && *v && strcmp(v, "0") != 0;
    P.be = be;
    P.last = now_sec();
}

int prof_on(void) { return P.on; }

void prof_mark(const char* stage) {
    if (!P.on) return;
    P.be->sync(P.be);
    const double t = now_sec(), dt = t - P.last;
    P.last = t;
    if (P.done < 2) return;  // warm-up steps
    int i = 0;
    while (i < P.n && strcmp(P.name[i], stage) != 0) i++;
    if (i == P.n) {
        if (P.n == MAX_STAGES) return;
        P.name[P.n++] = stage;
    }
    P.t[i] += dt;
    P.calls[i]++;
}

void prof_step_done(void) {
    if (!P.on) return;
    prof_mark("host.other");
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
    fprintf(f, "profile: %d steps, %.2f ms per step (synchronised after every stage)\n", P.steps, 1e3 * total / P.steps);
    fprintf(f, "  %-22s %10s %7s %9s\n", "stage", "ms/step", "share", "calls/step");
    for (int k = 0; k < P.n; k++) {
        int i = idx[k];
        fprintf(f, "  %-22s %10.3f %6.1f%% %9.1f\n", P.name[i], 1e3 * P.t[i] / P.steps, 100 * P.t[i] / total,
                (double)P.calls[i] / P.steps);
    }
    fflush(f);
}
