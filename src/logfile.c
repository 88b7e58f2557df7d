// logfile.c — see logfile.h.
#define _POSIX_C_SOURCE 200809L
#include "logfile.h"

#include "failpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// The failpoint log.metrics_fail_after (failpoint.h): writes to a file named metrics.jsonl fail
// with ENOSPC once N bytes have been written through its handle (a full disk, without one).
static long long fail_after(const LogFile* f) {
    size_t n = strlen(f->path);
    if (n < 13 || strcmp(f->path + n - 13, "metrics.jsonl")) return -1;
    return failpoint_int("log.metrics_fail_after", -1);
}

int logfile_open(LogFile* f, const char* path, int append, Err* e) {
    snprintf(f->path, sizeof f->path, "%s", path);
    f->written = 0;
    f->fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
    if (f->fd < 0) return err_set(e, "%s: cannot open for writing: %s", path, strerror(errno));
    return 0;
}

int logfile_write(LogFile* f, const char* s, size_t n, Err* e) {
    if (f->fd < 0) return err_set(e, "%s: write to a closed file", f->path);
    const long long limit = fail_after(f);
    size_t done = 0;
    while (done < n) {
        size_t want = n - done;
        ssize_t k;
        if (limit >= 0 && f->written + (long long)want > limit) {
            want = f->written < limit ? (size_t)(limit - f->written) : 0;
            if (want == 0) {
                errno = ENOSPC;
                k = -1;
            } else {
                k = write(f->fd, s + done, want);
            }
        } else {
            k = write(f->fd, s + done, want);
        }
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int er = k < 0 ? errno : EIO;
            return err_set(e, "%s: write failed after %lld bytes: %s", f->path, f->written, strerror(er));
        }
        done += (size_t)k;
        f->written += k;
    }
    return 0;
}

int logfile_sync(LogFile* f, Err* e) {
    if (f->fd < 0) return 0;
    // EINVAL / EROFS: a special file (a pipe, /dev/null) cannot be synced and needs not be.
    if (fsync(f->fd) && errno != EINVAL && errno != EROFS)
        return err_set(e, "%s: fsync failed: %s", f->path, strerror(errno));
    return 0;
}

int logfile_close(LogFile* f, Err* e) {
    if (f->fd < 0) return 0;
    int rc = logfile_sync(f, e);
    if (close(f->fd) && !rc) rc = err_set(e, "%s: close failed: %s", f->path, strerror(errno));
    f->fd = -1;
    return rc;
}

int logfile_write_whole(const char* path, const char* text, size_t n, Err* e) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%.4090s.tmp", path);
    LogFile f;
    if (logfile_open(&f, tmp, 0, e)) return -1;
    int rc = logfile_write(&f, text, n, e);
    if (logfile_close(&f, rc ? NULL : e)) rc = -1;
    if (!rc && rename(tmp, path)) rc = err_set(e, "rename %s -> %s: %s", tmp, path, strerror(errno));
    if (rc) unlink(tmp);
    return rc;
}
