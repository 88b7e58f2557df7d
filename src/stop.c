// stop.c — see stop.h. The handler uses only async-signal-safe calls (write, unlink, _exit,
// signal, raise).
#define _POSIX_C_SOURCE 200809L
#include "stop.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t g_signal = 0;
static volatile sig_atomic_t g_running = 0;
static char g_cleanup[4096];
static volatile sig_atomic_t g_have_cleanup = 0;

static void say(const char* s) {
    ssize_t k = write(2, s, strlen(s));
    (void)k;
}

static void on_signal(int sig) {
    if (!g_running) {
        if (g_have_cleanup) unlink(g_cleanup);
        say(sig == SIGTERM ? "moetrain: SIGTERM during start-up: nothing to save; exiting with code 3\n"
            : sig == SIGINT ? "moetrain: SIGINT during start-up: nothing to save; exiting with code 3\n"
                            : "moetrain: SIGUSR1 during start-up: nothing to save; exiting with code 3\n");
        _exit(3);
    }
    if (sig == SIGINT && g_signal) {  // a second Ctrl-C: stop now
        signal(SIGINT, SIG_DFL);
        raise(SIGINT);
        return;
    }
    g_signal = sig;
}

void stop_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
}

void stop_running(void) { g_running = 1; }

int stop_signal(void) { return g_signal; }

void stop_cleanup_path(const char* path) {
    g_have_cleanup = 0;
    if (!path) return;
    snprintf(g_cleanup, sizeof g_cleanup, "%s", path);
    g_have_cleanup = 1;
}
