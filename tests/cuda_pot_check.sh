#!/usr/bin/env bash
# The pot on a CUDA GPU, checked against this machine's CPU: tests/pot_check (compaction per layer and KV
# head, score taps, CR-RoPE, NuC's in-graph log-probs, in plain C++ over libllama; with the K cache in f16
# and in q8_0) run on both, compared by tests/compare_pot_check.py
# with a tolerance calibrated in the same runs (docs/pot.md, "CUDA").
#
#   tests/cuda_pot_check.sh prepare PYTHON DIR   here: the CPU reference, SmolLM2 cut to 4 blocks (41 MB)
#                                                and the patched llama.cpp source without other backends
#   DIR/cuda_pot_check.sh run                    on the GPU machine (nvcc, CMake, ninja, g++, numpy):
#                                                build for sm_90 (CUDA_ARCH=NN for another), run, compare
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
case "${1:-}" in
prepare)
    PY=${2:?usage: cuda_pot_check.sh prepare PYTHON DIR}; DIR=${3:?usage: cuda_pot_check.sh prepare PYTHON DIR}
    mkdir -p "$DIR"
    home=$("$PY" -c "from kvpot import paths; print(paths.home())")
    "$PY" -m kvpot.build.cross native --out "$home/build/pot-check/native"
    model=$("$PY" -c "from kvpot.models.pull import pull_known; from kvpot.models.registry import SMOLLM2_135M; print(pull_known(SMOLLM2_135M))")
    "$PY" "$here/cut_layers.py" "$model" "$DIR/smollm2-4l.gguf" 4
    "$home/build/pot-check/native/pot_check" "$DIR/smollm2-4l.gguf" 1 > "$DIR/native.txt"
    POT_CHECK_TYPE_K=q8_0 "$home/build/pot-check/native/pot_check" "$DIR/smollm2-4l.gguf" 1 > "$DIR/native-q8_0.txt"
    src=$("$PY" -c "from kvpot.build.cross import staged_tree; print(staged_tree())")
    tar czf "$DIR/llama-src.tar.gz" -C "$(dirname "$src")" \
        --exclude='llama.cpp/ggml/src/ggml-'{vulkan,sycl,opencl,hexagon,metal,et} --exclude='llama.cpp/vendor/cpp-httplib' \
        llama.cpp/CMakeLists.txt llama.cpp/cmake llama.cpp/ggml llama.cpp/src llama.cpp/include llama.cpp/ggml_ext \
        llama.cpp/vendor llama.cpp/licenses llama.cpp/LICENSE
    cp "$here/cuda_pot_check.sh" "$here/pot_check.cpp" "$here/compare_pot_check.py" "$DIR/"
    du -sh "$DIR"
    ;;
run)
    cd "$here"
    out=${OUT:-$here/out}; mkdir -p "$out"
    work=$(mktemp -d); tar xzf llama-src.tar.gz -C "$work"
    nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
    t0=$(date +%s)
    # no FlashAttention kernels: pot_check runs without flash attention, and they are most of the build
    cmake -S "$work/llama.cpp" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
        -DGGML_NATIVE=OFF -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DGGML_CUDA_FA=OFF \
        -DGGML_CUDA_NCCL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_MTMD=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF > "$out/build.log" 2>&1
    cmake --build "$work/build" --target llama -j "$(nproc)" >> "$out/build.log" 2>&1
    echo "build: $(( $(date +%s) - t0 )) s"
    lib="$work/build/bin"; inc="$work/llama.cpp"
    g++ -O2 -std=c++17 pot_check.cpp -o "$work/pot_check" -I"$inc/include" -I"$inc/ggml/include" \
        -I"$inc/ggml_ext" -L"$lib" -lllama -lggml -lggml-base -Wl,-rpath,"$lib"
    rc=0
    for k in f16 q8_0; do  # the K cache in f16, then in q8_0
        ref=native.txt; [ "$k" = f16 ] || ref=native-$k.txt
        echo "K cache $k:"
        POT_CHECK_LOG=1 POT_CHECK_TYPE_K=$k "$work/pot_check" smollm2-4l.gguf 1 $ref > "$out/cuda-$k.txt" 2> "$out/cuda-log-$k.txt"
        # the proof that it ran there: llama.cpp's own lines for the layers and the KV cache
        grep -E "offloaded|CUDA0 (model|KV) buffer|K \(" "$out/cuda-log-$k.txt" || true
        grep -q "CUDA0 KV buffer" "$out/cuda-log-$k.txt" || { echo "the KV cache was not on CUDA0"; exit 1; }
        python3 compare_pot_check.py $ref "$out/cuda-$k.txt" || rc=1
    done
    exit $rc
    ;;
*)
    echo "usage: $0 prepare PYTHON DIR | run" >&2; exit 2 ;;
esac
