#!/usr/bin/env bash
# make test-vulkan: the Debian packages the Vulkan build and Mesa's lavapipe need, the runtime built with
# CMAKE_ARGS=-DGGML_VULKAN=ON into its own venv (the user's .venv keeps its CPU runtime), then the pot's
# exactness tests with every layer and the pot on the Vulkan device (tests/devicelib.py checks that they
# were). Usage: tests/run_vulkan.sh VENV PYTEST_ARGS...
set -euo pipefail
VENV=${1:?usage: run_vulkan.sh VENV [pytest args]}
shift
cd "$(dirname "$0")/.."

# libvulkan-dev: the loader and vulkan.hpp; glslc: compiles ggml-vulkan's shaders; spirv-headers: its
# CMake config (find_package(SPIRV-Headers)); mesa-vulkan-drivers: lavapipe, a Vulkan driver on the CPU
pkgs=(libvulkan-dev glslc spirv-headers mesa-vulkan-drivers)
need=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need+=("$p")
done
. tests/debian_packages.sh
need_debian_packages "make test-vulkan" ${need[@]+"${need[@]}"}

t0=$(date +%s)
CMAKE_ARGS="-DGGML_VULKAN=ON" make --no-print-directory install VENV="$VENV"
echo "Vulkan runtime ready in $(($(date +%s) - t0)) s"
KVPOT_TEST_DEVICE=vulkan "$VENV/bin/python" -m pytest "$@"
