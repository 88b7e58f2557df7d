// logfile.h — checked writes for the files a run writes besides checkpoints (metrics.jsonl,
// config.yaml): every write, flush, fsync and close is checked, and a failure is reported with
// the path and the reason (errno), never dropped. metrics.jsonl is written with write(2), not
// stdio, so a full disk shows at the line that did not fit, not at some later flush.
#pragma once
#include <stddef.h>

#include "util.h"

typedef struct LogFile {
    int fd;               // -1 = closed
    char path[4096];
    long long written;    // bytes written through this handle
} LogFile;

// Opens path for appending (append = 1) or truncated. 0, or -1 with "PATH: cannot open: why".
int logfile_open(LogFile* f, const char* path, int append, Err* e);
// Writes all n bytes (retrying short writes and EINTR). 0, or -1 with "PATH: write failed
// after B bytes: why" (ENOSPC: "No space left on device").
int logfile_write(LogFile* f, const char* s, size_t n, Err* e);
int logfile_sync(LogFile* f, Err* e);   // fsync
int logfile_close(LogFile* f, Err* e);  // fsync + close; a closed handle is fine
// Writes a whole small file atomically: PATH.tmp, fsync, rename. 0 or -1 with the reason.
int logfile_write_whole(const char* path, const char* text, size_t n, Err* e);
