// A signal stops a decode in progress instead of waiting for its end. A 512-token chunk of a 1.5B
// model takes seconds on a laptop and tens of seconds on a phone; Python runs its signal handlers
// only between bytecodes, so without this a Ctrl-C or SIGTERM waits for the whole chunk.
//
// Python's signal module writes each signal's number to the descriptor given to
// signal.set_wakeup_fd from its C handler, as the signal arrives, whatever the main thread is doing.
// llama.cpp's CPU backend asks the context's abort callback after every graph node (thread 0 only);
// while a decode is armed, the callback here answers "abort" once that descriptor has something to
// read. llama_decode then removes the ubatch's cells from the memory and returns 2, and Python, whose
// handler runs as the call returns, decides what the signal means and empties the descriptor.
// The callback never calls into Python (no interpreter lock from a compute thread: see kvpot-log.cpp).
// The model loader's progress callback asks the same descriptor (kvpot-mapped.cpp), so a signal also stops
// a load in progress: llama.cpp then frees what it loaded and returns no model.
#include "kvpot.h"
#include "kvpot-abort.h"

#include "llama.h"

#include <atomic>

#ifndef _WIN32
#    include <poll.h>
#endif

namespace {

std::atomic<int32_t> g_fd{-1};

bool abort_callback(void * /*data*/) {
    return kvpot_signal_waiting();
}

}  // namespace

bool kvpot_signal_waiting() {
#ifdef _WIN32
    return false;  // no signal.set_wakeup_fd pipe to watch there: decodes and loads run to their end
#else
    const int fd = g_fd.load(std::memory_order_relaxed);
    if (fd < 0) {
        return false;
    }
    pollfd p = { fd, POLLIN, 0 };
    return poll(&p, 1, 0) > 0 && (p.revents & POLLIN) != 0;
#endif
}

int32_t kvpot_abort_watch(int32_t fd) {
    g_fd.store(fd < 0 ? -1 : fd, std::memory_order_relaxed);
    return 0;
}

int32_t kvpot_abort_arm(struct llama_context * ctx, bool on) {
    if (ctx == nullptr) {
        return KVPOT_ERR_ARG;
    }
    llama_set_abort_callback(ctx, on ? abort_callback : nullptr, nullptr);
    return 0;
}
