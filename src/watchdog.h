// watchdog.h — ends a job whose ranks stopped meeting (train.timeout_s).
//
// Every rank runs one watchdog thread, from the start of trainer_init to trainer_free. Start-up
// (trainer_init) and then the training loop name the stage each rank enters (watchdog_stage:
// step, stage name; step 0 = start-up) around each collective stretch; the thread publishes
// (step, stage, time entered, now) every second or so in a small file per rank,
// <dir>/.heartbeat/<token>/rank_NNNNN (dir: checkpoint.dir, else log.dir, which all ranks share;
// else /tmp/moetrain_heartbeat, which only ranks of one node share; token: this job's, so jobs
// sharing a directory never read each other's files). When this rank has been in one stage
// longer than its timeout, the thread reads every rank's file and names the ranks that did not
// arrive: those whose heartbeat is stale (stopped, or gone: their thread stopped too) and those
// still at an earlier step or another stage. It prints that on stderr and ends the process with
// exit code 1; the launcher (mpirun, srun --kill-on-bad-exit) then ends the other ranks.
#pragma once

// Starts the thread (timeout_s <= 0: nothing is watched; running already: nothing changes).
// token names this job's files (letters and digits; every rank the same). dir may be "" (then
// /tmp). Rank 0 removes job directories under <dir>/.heartbeat untouched for a day.
void watchdog_start(int rank, int world, const char* dir, const char* token, double timeout_s);
// Moves this rank's file to another token's directory (when ranks first took a token from their
// environment and rank 0's differs).
void watchdog_token(const char* token);
// Entering a stage (a string literal) of a step (1-based, the step being run).
void watchdog_stage(int step, const char* stage);
// The timeout of the stages entered from now on (seconds; <= 0: not watched).
void watchdog_timeout(double timeout_s);
// Counts a collective call entered (comm_watched); published with the heartbeat, so that within
// one stage a rank that made fewer calls than a waiting one is named as not arrived.
void watchdog_collective(void);
// Stops the thread and removes this rank's file.
void watchdog_stop(void);
