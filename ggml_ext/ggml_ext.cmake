# Compiles kvpot's ggml_ext/ sources into libllama. Included from src/CMakeLists.txt
# by patches/0001-cmake-compile-ggml-ext.patch; the kvpot build copies this folder to
# <llama.cpp>/ggml_ext/ and passes KVPOT_VERSION_STR / KVPOT_LLAMA_COMMIT as cache vars.

set(KVPOT_EXT_SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-info.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-state.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-seq-file.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-pot.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-compact-plan.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-compact-check.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-cells.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-compact.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-taps.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-logprobs.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-weights.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-heads.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-heads-api.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-memory.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-memory-api.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-api.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-blocks.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-block-cache.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-lookup.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-distance.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-api-blocks.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-snapshot.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-crash.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-log.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-mapped.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kvpot-abort.cpp
)

target_sources(llama PRIVATE ${KVPOT_EXT_SOURCES} ${CMAKE_CURRENT_LIST_DIR}/kvpot.h)
# our files define their own helpers; keep them out of llama's unity batches
set_source_files_properties(${KVPOT_EXT_SOURCES} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
target_include_directories(llama PUBLIC ${CMAKE_CURRENT_LIST_DIR})

if (NOT DEFINED KVPOT_VERSION_STR)
    set(KVPOT_VERSION_STR "unknown")
endif()
if (NOT DEFINED KVPOT_LLAMA_COMMIT)
    set(KVPOT_LLAMA_COMMIT "unknown")
endif()
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/kvpot-info.cpp PROPERTIES COMPILE_DEFINITIONS
    "KVPOT_VERSION_STR=\"${KVPOT_VERSION_STR}\";KVPOT_LLAMA_COMMIT=\"${KVPOT_LLAMA_COMMIT}\"")

# ggml's backend libraries export ggml_* only: no backend's copy of a C++ runtime symbol can stand in
# for libstdc++'s in libllama (a CUDA build crashed loading any model that way)
include(${CMAKE_CURRENT_LIST_DIR}/ggml_backend_exports.cmake)
