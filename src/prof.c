// prof.c — see prof.h.
#include "prof.h"

#include <string.h>

#include "util.h"

enum { MAX_STAGES = 64, MAX_MARKS = 4096 };
static struct {
    ProfileMode mode;
    int steps, done;
    Backend* be;
    double last;  // sync mode: the clock at the previous mark
    int n;
    const char* name[MAX_STAGES];
    double t[MAX_STAGES];
    long calls[MAX_STAGES];
    // events mode: this step's marks (stage index, event); ev_last closes the previous step
    BackendEvent* ev[MAX_MARKS];
    BackendEvent* ev_last;
    int stage_of[MAX_MARKS], nm, have_last;
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

static void book(int i, double secs) {
    if (i < 0) return;
    P.t[i] += secs;
    P.calls[i]++;
}

void prof_init(Backend* be, ProfileMode mode) {
    prof_free();
    memset(&P, 0, sizeof P);
    P.mode = mode;
    P.be = be;
    P.last = now_sec();
    if (mode != PROFILE_EVENTS) return;
    for (int i = 0; i < MAX_MARKS; i++) P.ev[i] = be->event_create(be);
    P.ev_last = be->event_create(be);
}

void prof_free(void) {
    if (P.mode != PROFILE_EVENTS) return;
    for (int i = 0; i < MAX_MARKS; i++) P.be->event_destroy(P.be, P.ev[i]);
    P.be->event_destroy(P.be, P.ev_last);
    P.mode = PROFILE_NONE;
}

int prof_on(void) { return P.mode != PROFILE_NONE; }

void prof_mark(const char* stage) {
    if (P.mode == PROFILE_NONE) return;
    if (P.mode == PROFILE_EVENTS) {  // an event after the stage's ops, read at the end of the step
        if (P.nm == MAX_MARKS) {
            static int warned;
            if (!warned++)
                fprintf(stderr, "moetrain: log.profile=events: more than %d stage marks in a step; the rest of "
                                "such a step is not counted (log.profile=sync counts every stage)\n", MAX_MARKS);
            return;
        }
        P.be->event_record(P.be, P.ev[P.nm]);
        P.stage_of[P.nm++] = stage_index(stage);
        return;
    }
    P.be->sync(P.be);
    const double t = now_sec(), dt = t - P.last;
    P.last = t;
    if (P.done < 2) return;  // warm-up steps
    book(stage_index(stage), dt);
}

void prof_step_done(void) {
    if (P.mode == PROFILE_NONE) return;
    prof_mark("host.other");
    if (P.mode == PROFILE_EVENTS) {  // each mark's time since the previous one (the first: since the last step's end)
        P.be->sync(P.be);
        for (int k = 0; k < P.nm && P.done >= 2; k++) {
            if (k == 0 && !P.have_last) continue;
            book(P.stage_of[k], P.be->event_elapsed(P.be, k ? P.ev[k - 1] : P.ev_last, P.ev[k]));
        }
        P.be->event_record(P.be, P.ev_last);  // after the sync: the step's end
        P.have_last = 1;
        P.nm = 0;
    }
    if (++P.done > 2) P.steps++;
}

void prof_report(FILE* f) {
    if (P.mode == PROFILE_NONE || P.steps == 0 || P.n == 0) return;
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
            P.mode == PROFILE_EVENTS ? "backend events, no syncs: the first stage of a step includes the gap since the last one"
                                     : "synchronised after every stage");
    fprintf(f, "  %-22s %10s %7s %9s\n", "stage", "ms/step", "share", "calls/step");
    for (int k = 0; k < P.n; k++) {
        int i = idx[k];
        fprintf(f, "  %-22s %10.3f %6.1f%% %9.1f\n", P.name[i], 1e3 * P.t[i] / P.steps, 100 * P.t[i] / total,
                (double)P.calls[i] / P.steps);
    }
    fflush(f);
}
