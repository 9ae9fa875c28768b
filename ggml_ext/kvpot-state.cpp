#include "kvpot-state.h"
#include "kvpot.h"
#include "kvpot-hooks.h"

#include <memory>

static std::mutex g_mutex;
static std::unordered_map<const llama_context *, std::unique_ptr<kvpot_state>> g_states;
static thread_local std::string g_error;

kvpot_state & kvpot_state_get(const llama_context * lctx) {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto & slot = g_states[lctx];
    if (!slot) {
        slot = std::make_unique<kvpot_state>();
    }
    return *slot;
}

kvpot_state * kvpot_state_find(const llama_context * lctx) {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_states.find(lctx);
    return it == g_states.end() ? nullptr : it->second.get();
}

void kvpot_state_drop(const llama_context * lctx) {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_states.erase(lctx);
}

void kvpot_set_error(const std::string & msg) {
    g_error = msg;
}

const char * kvpot_last_error(void) {
    return g_error.c_str();
}

void kvpot_hook_context_free(const llama_context * lctx) {
    kvpot_state_drop(lctx);
}

