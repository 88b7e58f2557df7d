// watchdog.h — ends a job whose ranks stopped meeting (train.timeout_s).
//
// Every rank runs one watchdog thread. The training loop names the stage it enters
// (watchdog_stage: step, stage name) around each collective stretch; the thread publishes
// (step, stage, time entered, now) every second or so in a small file per rank,
// <dir>/.heartbeat/rank_NNNNN (dir: checkpoint.dir, else log.dir, which all ranks share; else a
// directory under /tmp, which only ranks of one node share). When this rank has been in one
// stage longer than its timeout, the thread reads every rank's file and names the ranks that did
// not arrive: those whose heartbeat is stale (stopped, or gone: their thread stopped too) and
// those still at an earlier step or another stage. It prints that on stderr and ends the process
// with exit code 1; the launcher (mpirun, srun --kill-on-bad-exit) then ends the other ranks.
#pragma once

// Starts the thread (timeout_s <= 0: nothing is watched). token names this job's files (ranks of
// another job in the same directory are ignored). dir may be "" (then /tmp).
void watchdog_start(int rank, int world, const char* dir, const char* token, double timeout_s);
// Entering a stage (a string literal) of a step (1-based, the step being run).
void watchdog_stage(int step, const char* stage);
// The timeout of the stages entered from now on (seconds; <= 0: not watched).
void watchdog_timeout(double timeout_s);
// Stops the thread and removes this rank's file.
void watchdog_stop(void);
