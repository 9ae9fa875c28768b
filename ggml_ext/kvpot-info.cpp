// build facts the Python side checks before it trusts this libllama
#include "kvpot.h"

#include "ggml-backend.h"

#include <string>

#ifndef KVPOT_VERSION_STR
#define KVPOT_VERSION_STR "unknown"
#endif
#ifndef KVPOT_LLAMA_COMMIT
#define KVPOT_LLAMA_COMMIT "unknown"
#endif

const char * kvpot_version(void) {
    return KVPOT_VERSION_STR;
}

int32_t kvpot_abi_version(void) {
    return KVPOT_ABI_VERSION;
}

const char * kvpot_llama_commit(void) {
    return KVPOT_LLAMA_COMMIT;
}

const char * kvpot_backends(void) {
    // backends register lazily on first use; make sure the list is complete
    ggml_backend_load_all();
    static thread_local std::string names;
    names.clear();
    for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
        if (!names.empty()) {
            names += ",";
        }
        names += ggml_backend_reg_name(ggml_backend_reg_get(i));
    }
    return names.c_str();
}
