// llama.cpp's and ggml's log, filtered in C. A log callback written in Python (ctypes) must take the
// interpreter lock for every message, from whatever thread logs it: a backend's worker thread, or any
// thread while the interpreter is shutting down, where taking the lock can hang or kill the thread
// mid-C++ (the placement child's intermittent SIGSEGV on Vulkan, issue 16). This filter never calls
// back into Python, so that cannot happen.
#include "kvpot.h"
#include "kvpot-barrier.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

namespace {

// messages that are errors in llama.cpp's eyes but harmless for kvpot, each with its reason
const char * const k_harmless[] = {
    // Gemma-3 GGUFs mark '</s>' as a normal token; llama.cpp fixes the type at load and says so
    "was not control-type; this is probably a bug in the model",
    // kvpot's tap and log-prob graphs are larger than the graph llama.cpp reserved its compute
    // buffer for; the scheduler grew the buffer, and the destructor reports the difference
    "does not match expectation of",
    // a decode stopped by kvpot's abort callback (kvpot-abort.cpp), i.e. by a signal the user sent: graph
    // status 1 is GGML_STATUS_ABORTED and llama_decode's 2 is that abort, the only way either arises; llama.cpp
    // takes the ubatch back, and the CLI says how far the reading got
    "ggml_backend_sched_graph_compute_async failed with error 1\n",
    "failed to compute graph, compute status: 1\n",
    "llama_decode: failed to decode, ret = 2\n",
    // an RPC connection that broke (ggml-rpc's transport): a client aborts right after it, and kvpot's
    // abort callback names the lost server in one line (kvpot/runtime/rpc.py); a server goes on to its
    // next client
    "recv failed (bytes_recv=",
    "send failed (bytes_sent=",
};

std::mutex g_file_mutex;    // guards g_file against a concurrent kvpot_log_setup
FILE *     g_file = nullptr; // every message, when a path was given

// a GGML_LOG_LEVEL_CONT piece continues the previous message of the same thread
thread_local bool t_forwarding = false;

bool harmless(const char * text) {
    for (const char * h : k_harmless) {
        if (strstr(text, h) != nullptr) {
            return true;
        }
    }
    return false;
}

} // namespace

void kvpot_log_filter(enum ggml_log_level level, const char * text, void * user_data) {
    (void) user_data;
    if (text == nullptr) {
        return;
    }
    if (level != GGML_LOG_LEVEL_CONT) {
        t_forwarding = level == GGML_LOG_LEVEL_ERROR && !harmless(text);
    }
    if (t_forwarding) {
        fputs(text, stderr);
        fflush(stderr);
    }
    std::lock_guard<std::mutex> lock(g_file_mutex);
    if (g_file != nullptr) {
        fputs(text, g_file);
        fflush(g_file);
    }
}

int32_t kvpot_log_setup(const char * path) {
    return kvpot_guarded([&]() -> int32_t {
        FILE * f = nullptr;
        if (path != nullptr && path[0] != '\0') {
            f = fopen(path, "a");
            if (f == nullptr) {
                return kvpot_fail(KVPOT_ERR_ARG, std::string("cannot open log file ") + path + ": " + strerror(errno));
            }
        }
        {
            std::lock_guard<std::mutex> lock(g_file_mutex);
            if (g_file != nullptr) {
                fclose(g_file);
            }
            g_file = f;
        }
        llama_log_set(kvpot_log_filter, nullptr); // llama.cpp's own log and ggml's
        return 0;
    });
}
