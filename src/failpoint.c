// failpoint.c — see failpoint.h. For tests only.
#include "failpoint.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static struct {
    const char* name;
    const char* env;
    char* value;  // NULL = not set
} FP[] = {
    {"ckpt.crash_at", "MOETRAIN_CKPT_CRASH_AT", NULL},
    {"train.fail_rank", "MOETRAIN_FAIL_RANK", NULL},
    {"moe.force_exchange", "MOETRAIN_FORCE_EXCHANGE", NULL},
    {"log.metrics_fail_after", "MOETRAIN_METRICS_FAIL_AFTER", NULL},
    {"train.startup_sleep", "MOETRAIN_STARTUP_SLEEP", NULL},
    {"train.startup_stall", "MOETRAIN_STARTUP_STALL", NULL},
    {"preflight.free_bytes", "MOETRAIN_FREE_BYTES", NULL},
    {"preflight.write_rate", "MOETRAIN_WRITE_RATE", NULL},
    {"ckpt.lock_refresh_s", "MOETRAIN_LOCK_REFRESH_S", NULL},
};
enum { N_FP = sizeof FP / sizeof FP[0] };

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static void read_env(void) {
    for (int i = 0; i < N_FP; i++) {
        const char* v = getenv(FP[i].env);
        FP[i].value = v && *v ? xstrdup(v) : NULL;
    }
}

static int find(const char* name) {
    pthread_once(&g_once, read_env);
    for (int i = 0; i < N_FP; i++)
        if (strcmp(FP[i].name, name) == 0) return i;
    FATAL("unknown failpoint '%s' (the table is in src/failpoint.c)", name);
}

const char* failpoint_value(const char* name) {
    const int i = find(name);
    pthread_mutex_lock(&g_lock);
    const char* v = FP[i].value;
    pthread_mutex_unlock(&g_lock);
    return v;
}

int failpoint_hit(const char* name, const char* value) {
    const char* v = failpoint_value(name);
    return v && strcmp(v, value) == 0;
}

long failpoint_int(const char* name, long dflt) {
    const char* v = failpoint_value(name);
    if (!v) return dflt;
    char* end;
    errno = 0;
    long x = strtol(v, &end, 10);
    return errno || end == v || *end ? dflt : x;
}

void failpoint_set(const char* name, const char* value) {
    const int i = find(name);
    pthread_mutex_lock(&g_lock);
    // the old string is kept (a caller may still hold it); a test sets a failpoint a few times
    FP[i].value = value && *value ? xstrdup(value) : NULL;
    pthread_mutex_unlock(&g_lock);
}
