#!/usr/bin/env bash
# The patched runtime (libllama and ggml with the CUDA backend) built on a GPU machine, for sm_90 unless
# CUDA_ARCH=NN: the one CMake line tests/cuda_pot_check.sh and tests/cuda_end_to_end.sh share.
#
#   tests/cuda_runtime_build.sh SRC BUILD LOG [-DNAME=VALUE ...]
#       SRC: the patched llama.cpp (tests/llama_src_tarball.sh's llama.cpp/); BUILD: the build folder (its
#       bin/ holds the libraries); LOG: configure and build output; the rest go to cmake as they are
set -euo pipefail
src=${1:?usage: cuda_runtime_build.sh SRC BUILD LOG [cmake args]}; build=${2:?}; log=${3:?}; shift 3
# without tools, server, examples or tests: only libllama and what it links, so a build takes minutes
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DGGML_NATIVE=OFF -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DGGML_CUDA_FA=ON \
    -DGGML_CUDA_NCCL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_MTMD=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF "$@" > "$log" 2>&1
cmake --build "$build" --target llama -j "$(nproc)" >> "$log" 2>&1
