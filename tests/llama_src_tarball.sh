#!/usr/bin/env bash
# The patched llama.cpp source (kvpot.build.cross's staged tree) as a tarball for a machine that cannot fetch it,
# without the backends a CUDA build does not need (the GPU machine takes 64 MiB of files):
#   tests/llama_src_tarball.sh PYTHON OUT.tar.gz
set -euo pipefail
PY=${1:?usage: llama_src_tarball.sh PYTHON OUT.tar.gz}; out=${2:?usage: llama_src_tarball.sh PYTHON OUT.tar.gz}
src=$("$PY" -c "from kvpot.build.cross import staged_tree; print(staged_tree())")
tar czf "$out" -C "$(dirname "$src")" \
    --exclude='llama.cpp/ggml/src/ggml-'{vulkan,sycl,opencl,hexagon,metal,et} --exclude='llama.cpp/vendor/cpp-httplib' \
    llama.cpp/CMakeLists.txt llama.cpp/cmake llama.cpp/ggml llama.cpp/src llama.cpp/include llama.cpp/ggml_ext \
    llama.cpp/vendor llama.cpp/licenses llama.cpp/LICENSE
