// failpoint.h — fault injection for the tests. Not a user interface: nothing here changes what
// a correct run computes, and a user never needs to set these.
//
// A failpoint has a dotted name (the code that checks it) and an environment variable (how a
// test that launches the binary sets it). The table in failpoint.c lists them all. The
// environment is read once, at the first call of any function here; a test inside one process
// sets a failpoint with failpoint_set instead (a forked child, for instance).
//
//   name                env                        value and effect
//   ckpt.crash_at       MOETRAIN_CKPT_CRASH_AT     a point of the checkpoint protocol (written,
//                                                  manifest, renamed, latest_tmp, latest; append:
//                                                  after a rank file's second tensor, in the
//                                                  background writer with checkpoint.async; ckpt.c):
//                                                  the saving process is SIGKILLed there
//   train.fail_rank     MOETRAIN_FAIL_RANK         rank r: FATAL at its second step
//   moe.force_exchange  MOETRAIN_FORCE_EXCHANGE    1: the MoE dispatcher takes the exchange path
//                                                  (all_to_all_v) even at EP = 1
//   log.metrics_fail_after  MOETRAIN_METRICS_FAIL_AFTER  N: writes to metrics.jsonl fail with
//                                                  ENOSPC once N bytes went through the handle
//                                                  (a full disk; logfile.c)
//   train.startup_sleep MOETRAIN_STARTUP_SLEEP     S: start-up sleeps S seconds after opening
//                                                  the data (signals during start-up; train_init.c)
//   train.startup_stall MOETRAIN_STARTUP_STALL     R:WORD: rank R stops for good at the end of
//                                                  the start-up stage whose name holds WORD (its
//                                                  watchdog thread runs on; train_init.c)
//   preflight.free_bytes MOETRAIN_FREE_BYTES       N: the free space preflight sees in
//                                                  checkpoint.dir (statvfs's answer replaced)
//   preflight.write_rate MOETRAIN_WRITE_RATE       N: the write rate preflight measures in
//                                                  checkpoint.dir, bytes/s (train_preflight.c)
//   ckpt.lock_refresh_s MOETRAIN_LOCK_REFRESH_S    S: the lock's holder refreshes it every S
//                                                  seconds instead of 60 (train_own.c)
//
// To add one: a row in failpoint.c's table, a line above, and a check at the place it fails.
#pragma once

// The failpoint's value, or NULL when it is not set (unset or empty). A name not in the table
// is a programming error (FATAL).
const char* failpoint_value(const char* name);
// 1 when the failpoint is set to exactly `value`.
int failpoint_hit(const char* name, const char* value);
// The value as an integer, or dflt when unset (or not a whole number).
long failpoint_int(const char* name, long dflt);
// For tests in the same process: sets (value != NULL) or clears the failpoint, overriding the
// environment.
void failpoint_set(const char* name, const char* value);
