// kvpot C API: the pot (bounded per-layer, per-KV-head KV memory) and its helpers.
// Compiled into libllama by ggml_ext.cmake; every symbol is prefixed kvpot_.
#pragma once

#include "llama.h"

#include <stddef.h>
#include <stdint.h>

#ifdef LLAMA_SHARED
#    if defined(_WIN32) && !defined(__MINGW32__)
#        ifdef LLAMA_BUILD
#            define KVPOT_API __declspec(dllexport)
#        else
#            define KVPOT_API __declspec(dllimport)
#        endif
#    else
#        define KVPOT_API __attribute__ ((visibility ("default")))
#    endif
#else
#    define KVPOT_API
#endif

// bumped whenever a kvpot_* signature or struct layout changes; the Python side
// refuses a libllama whose ABI number differs from the one it was written for
#define KVPOT_ABI_VERSION 1

#ifdef __cplusplus
extern "C" {
#endif

// kvpot release string, e.g. "0.1.0"
KVPOT_API const char * kvpot_version(void);

// KVPOT_ABI_VERSION of the compiled library
KVPOT_API int32_t kvpot_abi_version(void);

// llama.cpp commit the library was built from (as pinned by the kvpot build)
KVPOT_API const char * kvpot_llama_commit(void);

// comma-separated names of the ggml backends registered in this build, e.g. "CPU" or "CUDA,CPU";
// the string is owned by the library and stays valid until the next call
KVPOT_API const char * kvpot_backends(void);

#ifdef __cplusplus
}
#endif
