// prof.h — where a training step's time goes, stage by stage (log.profile).
//
// The graph calls prof_mark("stage") after each stage; prof_report prints the table after the
// run. With profiling off a mark is one predictable branch.
//
// log.profile=events: each mark records a backend event (Backend.event_record), read at the end
// of the optimizer step, so the table is the plain step's own timeline without syncs (a stage's
// time is from the previous mark to its own, gaps included; the first stage of a step also holds
// the gap since the previous step's optimizer). On the CPU backend the events read the clock.
//
// log.profile=sync: each mark waits for the backend (sync) and books the wall time since the
// previous mark to that stage. The syncs serialise the host and the device, so a profiled step
// is a little slower than a plain one (a launch latency per stage, ~10 µs), and the sum of the
// stages is that slower step; the shares are what to read.
//
// Steps before the third are not counted (warm-up: cuBLASLt plans, arena growth).
#pragma once
#include <stdio.h>

#include "backend.h"

void prof_init(Backend* be, ProfileMode mode);
int prof_on(void);
void prof_mark(const char* stage);
// Ends an optimizer step (counting starts at the third).
void prof_step_done(void);
// Prints the table: ms per step per stage, its share, sorted by time. Nothing when off.
void prof_report(FILE* f);
// Releases the events (before the backend is destroyed).
void prof_free(void);
