// stop.h — preemption signals (SIGTERM, SIGINT, SIGUSR1), installed first thing in `train`.
//
// Start-up (MPI, config, data, restore) saves nothing, so a signal then ends the process at once
// with exit code 3 (the batch script requeues it; the next start is the same start), after
// removing the checkpoint.dir lock this process holds. Once training runs (stop_running), a
// signal only sets a flag: every rank finishes its step, the ranks agree, save a checkpoint and
// exit with code 3. A second SIGINT while that happens ends the process at once (an impatient
// Ctrl-C), with the default action.
#pragma once

// Installs the handlers (before anything slow); the process is in start-up.
void stop_install(void);
// Training runs: a signal now asks for a save and exit instead of exiting at once.
void stop_running(void);
// The signal caught since stop_running (0 = none).
int stop_signal(void);
// A file to unlink if a start-up signal ends the process (the lock this process created);
// NULL to forget it. The path is copied.
void stop_cleanup_path(const char* path);
