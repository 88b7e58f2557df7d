// test_logfile.c — every write to metrics.jsonl checked, with the real binary: a full disk
// (real, through /dev/full) and a failure injected after N bytes stop the run with exit 2, the
// file, the reason and the step named; a resume trims the torn line and the trace joins.
#define _GNU_SOURCE
#include <sys/stat.h>

#include "run_util.h"

static long file_size(const char* path) {
    struct stat st;
    return stat(path, &st) ? -1 : (long)st.st_size;
}

// log.dir on a full disk: metrics.jsonl is /dev/full (every write fails with ENOSPC).
static void test_metrics_disk_full(void) {
    char out[65536], d[400], p[500];
    snprintf(d, sizeof d, "%s/full", g_dir);
    mkdir(d, 0755);
    snprintf(p, sizeof p, "%s/metrics.jsonl", d);
    EXPECT(symlink("/dev/full", p) == 0, "symlink %s", p);
    int rc = run(out, sizeof out, NULL, "%s " TINY " train.steps=6 log.dir=%s", g_bin, d);
    EXPECT(rc == 2, "exit code 2 on a full disk (rc %d): %s", rc, out);
    EXPECT(strstr(out, "metrics.jsonl: write failed after 0 bytes: No space left on device") &&
               strstr(out, "stopping at step 1"),
           "the message names the file, the reason and the step: %s", out);
}

// The injected failure: writes fail after 900 bytes (two lines of ~370 bytes and a part of the third); the
// run stops at that step with exit 2; a resume trims the torn line and the trace joins.
static void test_metrics_injected_failure(void) {
    char out[65536], d[400], ck[400], p[500];
    snprintf(d, sizeof d, "%s/inj", g_dir);
    snprintf(ck, sizeof ck, "%s/inj_ck", g_dir);
    int rc = run(out, sizeof out, NULL, "MOETRAIN_METRICS_FAIL_AFTER=900 %s " TINY " train.steps=6 checkpoint.every=1 "
                 "checkpoint.dir=%s log.dir=%s", g_bin, ck, d);
    EXPECT(rc == 2, "exit code 2 (rc %d): %s", rc, out);
    EXPECT(strstr(out, "write failed after 900 bytes: No space left on device") && strstr(out, "stopping at step 3"),
           "the message: %s", out);
    snprintf(p, sizeof p, "%s/metrics.jsonl", d);
    EXPECT(file_size(p) == 900, "900 bytes written (%ld)", file_size(p));
    rc = run(out, sizeof out, NULL, "%s " TINY " train.steps=6 checkpoint.every=1 checkpoint.dir=%s log.dir=%s "
             "checkpoint.resume=auto", g_bin, ck, d);
    EXPECT(rc == 0, "the resumed run (rc %d): %s", rc, out);
    double loss[16];
    int n = read_losses(p, loss, 16);
    EXPECT(n == 6, "6 whole lines after the resume (%d)", n);
    char* tr[16];
    int m = read_trace(p, tr, 16);
    for (int i = 0; i < m; i++) {
        char want[32];
        snprintf(want, sizeof want, "\"step\": %d,", i + 1);
        EXPECT(strstr(tr[i], want) && tr[i][strlen(tr[i]) - 1] == '\n', "line %d: %s", i + 1, tr[i]);
    }
    free_trace(tr, m > 0 ? m : 0);
}

int main(int argc, char** argv) {
    if (run_begin(argc, argv, "logfile")) return 1;
    RUN_IF(test_metrics_disk_full);
    RUN_IF(test_metrics_injected_failure);
    if (!t_failed) sh("rm -rf %s", g_dir);
    TEST_END();
}
