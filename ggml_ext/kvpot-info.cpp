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

static ggml_backend_dev_t cpu_device() {
    ggml_backend_load_all();
    return ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
}

const char * kvpot_cpu_extra_bufts(void) {
    static thread_local std::string names;
    names.clear();
    ggml_backend_dev_t dev = cpu_device();
    if (dev == nullptr) {
        return names.c_str();
    }
    // the same lookup llama.cpp's model loader does to find the extra buffer types it may use
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto get_extra_bufts = (ggml_backend_dev_get_extra_bufts_t)
        ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    if (get_extra_bufts == nullptr) {
        return names.c_str();
    }
    for (ggml_backend_buffer_type_t * buft = get_extra_bufts(dev); buft != nullptr && *buft != nullptr; ++buft) {
        if (!names.empty()) {
            names += ",";
        }
        names += ggml_backend_buft_name(*buft);
    }
    return names.c_str();
}

const char * kvpot_cpu_features(void) {
    static thread_local std::string out;
    out.clear();
    ggml_backend_dev_t dev = cpu_device();
    if (dev == nullptr) {
        return out.c_str();
    }
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto get_features = (ggml_backend_get_features_t)
        ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features");
    if (get_features == nullptr) {
        return out.c_str();
    }
    for (ggml_backend_feature * f = get_features(reg); f != nullptr && f->name != nullptr; ++f) {
        if (!out.empty()) {
            out += ",";
        }
        out += f->name;
        out += "=";
        out += f->value ? f->value : "";
    }
    return out.c_str();
}
