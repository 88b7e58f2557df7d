// test_prof.c — src/prof.c (log.profile) and the CPU backend's event ops it reads.
#define _DEFAULT_SOURCE
#include <unistd.h>

#include "backend.h"
#include "prof.h"
#include "test.h"
#include "util.h"

static Backend* be;

// CPU events: elapsed is the clock between the two records (the CPU runs its ops on the call).
static void test_cpu_events(void) {
    BackendEvent* a = be->event_create(be);
    BackendEvent* b = be->event_create(be);
    be->event_record(be, a);
    usleep(3000);
    be->event_record(be, b);
    const double s = be->event_elapsed(be, a, b);
    EXPECT(s >= 3e-3 && s < 10, "3 ms sleep: %.6f s between the events", s);
    EXPECT(be->event_elapsed(be, b, a) == -s, "reversed: %.6f s", be->event_elapsed(be, b, a));
    be->event_destroy(be, a);
    be->event_destroy(be, b);
}

// Four steps of three stages, one of which sleeps 2 ms: the table counts steps 3 and 4 (the first
// two are warm-up), names every stage, and books the sleep to its stage.
static void run_steps(ProfileMode mode, char* out, size_t n) {
    prof_init(be, mode);
    for (int s = 0; s < 4; s++) {
        prof_mark("stage.a");
        usleep(2000);
        prof_mark("stage.sleep");
        prof_mark("stage.b");
        prof_step_done();
    }
    FILE* f = fmemopen(out, n, "w");
    prof_report(f);
    fclose(f);
    prof_free();
}

static double stage_ms(const char* out, const char* stage) {
    const char* p = strstr(out, stage);
    return p ? atof(p + strlen(stage)) : -1;
}

static void check_table(ProfileMode mode) {
    char out[4096] = {0};
    run_steps(mode, out, sizeof out);
    EXPECT(strstr(out, "profile: 2 steps"), "two counted steps:\n%s", out);
    EXPECT(strstr(out, mode == PROFILE_EVENTS ? "backend events" : "synchronised"), "the mode is named:\n%s", out);
    EXPECT(strstr(out, "stage.a") && strstr(out, "stage.b") && strstr(out, "host.other"), "every stage:\n%s", out);
    EXPECT(stage_ms(out, "stage.sleep") >= 2.0, "the 2 ms sleep is booked to its stage:\n%s", out);
}

static void test_events(void) { check_table(PROFILE_EVENTS); }
static void test_sync(void) { check_table(PROFILE_SYNC); }

static void test_none(void) {
    char out[256] = {0};
    run_steps(PROFILE_NONE, out, sizeof out);
    EXPECT(!prof_on() && out[0] == 0, "log.profile=none prints nothing: '%s'", out);
}

int main(void) {
    be = cpu_backend_create();
    RUN(test_cpu_events);
    RUN(test_events);
    RUN(test_sync);
    RUN(test_none);
    be->destroy(be);
    TEST_END();
}
