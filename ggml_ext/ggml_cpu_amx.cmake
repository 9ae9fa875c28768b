# Keeps ggml's AMX matmul path out of every CPU backend variant. Included from inside
# ggml_add_cpu_backend_variant_impl() (ggml/src/ggml-cpu/CMakeLists.txt) by
# patches/0005-cpu-backend-without-amx.patch, so GGML_CPU_NAME is the variant being built.
#
# why: upstream's AMX extra buffer type segfaults in ggml_backend_amx_mul_mat on some
# Sapphire Rapids machines (ggml-org/llama.cpp issue 20824, closed without a fix), and
# -march=native turns it on by itself wherever the host has AMX. Everything AMX in
# ggml-cpu is behind `#if defined(__AMX_INT8__)`; telling the compiler the host has no
# AMX removes the buffer type, its kernels and the arch_prctl call, while CPU_REPACK
# (the other extra buffer type, which ARM phones depend on) stays.
#
# -DKVPOT_CPU_AMX=ON (through CMAKE_ARGS) builds upstream's AMX path anyway: unsafe.

option(KVPOT_CPU_AMX "kvpot: compile ggml's AMX matmul path (unsafe, llama.cpp issue 20824)" OFF)

if (NOT KVPOT_CPU_AMX AND GGML_SYSTEM_ARCH STREQUAL "x86")
    if (MSVC)
        # MSVC has no AMX switches; ggml defines the macros itself when GGML_AMX_* is on
        target_compile_options(${GGML_CPU_NAME} PRIVATE /U__AMX_TILE__ /U__AMX_INT8__ /U__AMX_BF16__)
    else()
        include(CheckCXXCompilerFlag)
        check_cxx_compiler_flag(-mno-amx-int8 KVPOT_CXX_HAS_MNO_AMX)
        if (KVPOT_CXX_HAS_MNO_AMX)
            # after ARCH_FLAGS on the command line, so this wins over -march=native and -mamx-*
            target_compile_options(${GGML_CPU_NAME} PRIVATE -mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
        endif()
        # a compiler that does not know -mno-amx-int8 does not know AMX either; the -U
        # covers the macros whatever defined them
        target_compile_options(${GGML_CPU_NAME} PRIVATE -U__AMX_TILE__ -U__AMX_INT8__ -U__AMX_BF16__)
    endif()
    message(STATUS "kvpot: ${GGML_CPU_NAME} built without AMX (set KVPOT_CPU_AMX=ON to try it; unsafe)")
elseif (KVPOT_CPU_AMX)
    message(WARNING "kvpot: KVPOT_CPU_AMX=ON keeps ggml's AMX path, which crashes on some CPUs (llama.cpp issue 20824)")
endif()
