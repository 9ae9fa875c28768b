// a native crash names what to report (kvpot version, runtime) before the handler that was there
// first (Python's faulthandler, in the CLI) prints where it happened
#include "kvpot.h"

#include <csignal>
#include <cstring>

#if !defined(_WIN32)
#include <unistd.h>

namespace {

constexpr int k_fatal_signals[] = { SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT };
constexpr int n_fatal_signals   = sizeof(k_fatal_signals) / sizeof(k_fatal_signals[0]);

char             g_banner[1024];
size_t           g_banner_len = 0;
struct sigaction g_prev[n_fatal_signals];
bool             g_installed = false;

void on_fatal_signal(int sig) {
    // async-signal-safe calls only: write(2), sigaction(2), raise(3)
    if (g_banner_len > 0) {
        ssize_t n = write(STDERR_FILENO, g_banner, g_banner_len);
        (void) n;
    }
    for (int i = 0; i < n_fatal_signals; ++i) {
        if (k_fatal_signals[i] == sig) {
            sigaction(sig, &g_prev[i], nullptr);
            break;
        }
    }
    // the signal is blocked while this runs, so it stays pending and reaches the previous handler
    // as soon as we return (a faulting instruction would also simply fault again)
    raise(sig);
}

} // namespace

int32_t kvpot_crash_banner_install(const char * text) {
    const size_t n = text ? strnlen(text, sizeof(g_banner) - 1) : 0;
    // a later call only replaces the text: the handlers we chain to stay the first ones seen
    g_banner_len = 0;
    memcpy(g_banner, text ? text : "", n);
    g_banner[n]  = '\0';
    g_banner_len = n;
    if (g_installed) {
        return 0;
    }
    for (int i = 0; i < n_fatal_signals; ++i) {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_fatal_signal;
        sigemptyset(&sa.sa_mask);
        // the alternate stack (faulthandler sets one up) lets a stack overflow be reported too
        sa.sa_flags = SA_ONSTACK;
        sigaction(k_fatal_signals[i], &sa, &g_prev[i]);
    }
    g_installed = true;
    return 0;
}

#else

int32_t kvpot_crash_banner_install(const char * text) {
    // Windows: no sigaction; Python's faulthandler alone reports the crash
    (void) text;
    return 0;
}

#endif
