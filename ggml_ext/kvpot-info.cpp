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

// a function the CPU backend registers under `name` (the loader's own lookup), or nullptr
static void * cpu_proc(const char * name, ggml_backend_dev_t & dev) {
    ggml_backend_load_all();
    dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    return dev ? ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(dev), name) : nullptr;
}

// the ends of the two lists ggml returns
static bool done(ggml_backend_buffer_type_t b) { return b == nullptr; }
static bool done(const ggml_backend_feature & f) { return f.name == nullptr; }

// "a,b,c" from the items of a list that ends as `done` says
template <typename T, typename F>
static const char * join(std::string & out, T * items, F && text) {
    out.clear();
    for (T * it = items; it != nullptr && !done(*it); ++it) {
        if (!out.empty()) {
            out += ",";
        }
        out += text(*it);
    }
    return out.c_str();
}

const char * kvpot_cpu_extra_bufts(void) {
    static thread_local std::string names;
    ggml_backend_dev_t dev = nullptr;
    // the extra buffer types llama.cpp's model loader may put weights in
    auto get = (ggml_backend_dev_get_extra_bufts_t) cpu_proc("ggml_backend_dev_get_extra_bufts", dev);
    return join(names, get ? get(dev) : nullptr, [](ggml_backend_buffer_type_t b) { return std::string(ggml_backend_buft_name(b)); });
}

const char * kvpot_cpu_features(void) {
    static thread_local std::string out;
    ggml_backend_dev_t dev = nullptr;
    auto get = (ggml_backend_get_features_t) cpu_proc("ggml_backend_get_features", dev);
    return join(out, get ? get(ggml_backend_dev_backend_reg(dev)) : nullptr,
                [](const ggml_backend_feature & f) { return std::string(f.name) + "=" + (f.value ? f.value : ""); });
}
