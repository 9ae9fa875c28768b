# Every ggml backend library (libggml-cpu, libggml-cuda, libggml-rpc, ...) exports ggml's C API and
# nothing else. Included from ggml_ext.cmake, after ggml's targets exist.
#
# why: the CUDA backend built on an H200 machine (nvcc 13.0, g++ 13.3, Ubuntu 24.04) put copies of
# libstdc++'s own symbols in libggml-cuda.so's dynamic symbol table (std::ostream::_M_insert<long>,
# std::codecvt<char16_t, char, mbstate_t> members), and libllama's stream output bound to them:
# llama_model_load_from_file segfaulted in llama_model::print_info, inside libggml-cuda's copy, as soon
# as kvpot loaded any model (the GPU hidden or not). A backend's toolchain may link in whatever it likes;
# with only ggml_* exported, nothing in it can stand in for the C++ runtime libllama and libggml use.
# Nothing outside a backend needs more: libggml, libllama, kvpot's C code and llama_cpp's bindings call
# backends through ggml_* functions only (tests/test_backend_exports.py checks the built libraries).
#
# ELF linkers only (GNU ld, gold, lld: Linux, Android, the BSDs); Apple's ld64 and MSVC have no version
# scripts, and their dynamic linkers look a symbol up in the library that was linked against it.

if (APPLE OR WIN32 OR MSVC)
    return()
endif()

set(KVPOT_BACKEND_EXPORTS ${CMAKE_CURRENT_BINARY_DIR}/kvpot-backend-exports.map)
file(WRITE ${KVPOT_BACKEND_EXPORTS} "{\n  global: ggml_*;\n  local: *;\n};\n")

if (NOT CMAKE_VERSION VERSION_LESS 3.18)
    include(CheckLinkerFlag)
    check_linker_flag(CXX "LINKER:--version-script=${KVPOT_BACKEND_EXPORTS}" KVPOT_LINKER_HAS_VERSION_SCRIPT)
    if (NOT KVPOT_LINKER_HAS_VERSION_SCRIPT)
        message(WARNING "kvpot: the linker takes no --version-script; ggml's backends export every symbol")
        return()
    endif()
endif()

# the backends: linked into libggml (ggml_add_backend_library without GGML_BACKEND_DL), or loaded by it
# (with GGML_BACKEND_DL: each a MODULE that libggml depends on)
get_target_property(_kvpot_linked ggml LINK_LIBRARIES)
get_target_property(_kvpot_loaded ggml MANUALLY_ADDED_DEPENDENCIES)
set(_kvpot_backends)
foreach (_kvpot_t IN LISTS _kvpot_linked _kvpot_loaded)
    if (_kvpot_t MATCHES "^ggml-" AND NOT _kvpot_t STREQUAL "ggml-base" AND TARGET ${_kvpot_t})
        get_target_property(_kvpot_type ${_kvpot_t} TYPE)
        if (_kvpot_type STREQUAL "SHARED_LIBRARY" OR _kvpot_type STREQUAL "MODULE_LIBRARY")
            list(APPEND _kvpot_backends ${_kvpot_t})
        endif()
    endif()
endforeach()
list(REMOVE_DUPLICATES _kvpot_backends)

foreach (_kvpot_t IN LISTS _kvpot_backends)
    # LINKER: becomes -Wl, for gcc and clang and -Xlinker for nvcc, which links the CUDA backend
    target_link_options(${_kvpot_t} PRIVATE "LINKER:--version-script=${KVPOT_BACKEND_EXPORTS}")
    set_property(TARGET ${_kvpot_t} APPEND PROPERTY LINK_DEPENDS ${KVPOT_BACKEND_EXPORTS})
endforeach()
if (_kvpot_backends)
    message(STATUS "kvpot: ${_kvpot_backends} export ggml_* only (ggml_ext/ggml_backend_exports.cmake)")
endif()
