// the one exception barrier of the C API: every kvpot_* entry point runs its body through
// kvpot_guarded (or kvpot_with_pot, which also resolves the pot), so no C++ exception crosses
// into C or Python; failures become a negative KVPOT_ERR_* code with a message in kvpot_last_error()
#pragma once

#include "kvpot.h"
#include "kvpot-pot.h"
#include "kvpot-state.h"

#include <exception>
#include <string>

// record msg as the last error and return code
int32_t kvpot_fail(int32_t code, const std::string & msg);

// resolve the pot of ctx and the KV-head count every pot layer shares; 0, or a KVPOT_ERR_* code
int32_t kvpot_resolve(llama_context * ctx, kvpot_pot & pot, int32_t & n_head_kv);

// run f, turning C++ exceptions into KVPOT_ERR_STATE (R: the entry point's return type)
template <typename R = int32_t, typename F>
R kvpot_guarded(F && f) {
    try {
        return f();
    } catch (const std::exception & e) {
        return kvpot_fail(KVPOT_ERR_STATE, std::string("internal error: ") + e.what());
    } catch (...) {
        return kvpot_fail(KVPOT_ERR_STATE, "internal error");
    }
}

// kvpot_guarded + kvpot_resolve: the preamble of every entry point that works on the pot
template <typename R = int32_t, typename F>
R kvpot_with_pot(llama_context * ctx, F && f) {
    return kvpot_guarded<R>([&]() -> R {
        kvpot_pot pot;
        int32_t n_head_kv = 0;
        if (int32_t rc = kvpot_resolve(ctx, pot, n_head_kv); rc < 0) {
            return rc;
        }
        return f(pot, n_head_kv);
    });
}
