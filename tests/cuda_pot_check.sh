#!/usr/bin/env bash
# The pot on a CUDA GPU, checked against this machine's CPU: tests/pot_check (compaction per layer and KV
# head, score taps, CR-RoPE, NuC's in-graph log-probs, Locret's heads, EdgeInfinite's memory, InfLLM's
# lookup, in plain C++ over libllama; with and without flash attention, f16 and q8_0 caches) run on both,
# compared by tests/compare_pot_check.py with a tolerance calibrated in the same runs (docs/pot.md, "CUDA").
#
#   [ARCHS=qwen2] tests/cuda_pot_check.sh prepare PYTHON DIR
#       here: the model (below), its CPU references and the patched llama.cpp source without other backends
#   DIR/cuda_pot_check.sh run
#       on the GPU machine (nvcc, CMake, ninja, g++, numpy): build for sm_90 (CUDA_ARCH=NN for another),
#       run, compare
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# K cache : V cache : flash attention. Without flash attention V is stored transposed and must stay f16;
# with it V rows move like K rows, and the mask (the pot's dead-cell bias in it) is F16
CONFIGS="f16:f16:0 q8_0:f16:0 f16:f16:1 q8_0:q8_0:1"
# SmolLM2-135M cut to 4 blocks (llama), and the same as qwen2 with seeded Q/K/V biases (tests/as_qwen2.py).
# Each is 41 MB and the GPU machine takes 64 MiB, so one per run there: ARCHS=qwen2 for prepare and run
ARCHS=${ARCHS:-llama}
case "${1:-}" in
prepare)
    PY=${2:?usage: cuda_pot_check.sh prepare PYTHON DIR}; DIR=${3:?usage: cuda_pot_check.sh prepare PYTHON DIR}
    mkdir -p "$DIR"
    home=$("$PY" -c "from kvpot import paths; print(paths.home())")
    "$PY" -m kvpot.build.cross native --out "$home/build/pot-check/native"
    model=$("$PY" -c "from kvpot.models.pull import pull_known; from kvpot.models.registry import SMOLLM2_135M; print(pull_known(SMOLLM2_135M))")
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    "$PY" "$here/cut_layers.py" "$model" "$tmp/llama.gguf" 4
    "$PY" "$here/as_qwen2.py" "$tmp/llama.gguf" "$tmp/qwen2.gguf"
    rm -f "$DIR"/*.gguf "$DIR"/native-*.txt
    for arch in $ARCHS; do cp "$tmp/$arch.gguf" "$DIR/"; done
    for arch in $ARCHS; do
        for cfg in $CONFIGS; do
            IFS=: read -r k v fa <<< "$cfg"
            POT_CHECK_TYPE_K=$k POT_CHECK_TYPE_V=$v POT_CHECK_FLASH=$fa \
                "$home/build/pot-check/native/pot_check" "$DIR/$arch.gguf" 1 > "$DIR/native-$arch-$k-$v-fa$fa.txt"
        done
    done
    "$here/llama_src_tarball.sh" "$PY" "$DIR/llama-src.tar.gz"
    cp "$here/cuda_pot_check.sh" "$here/cuda_runtime_build.sh" "$here/pot_check.cpp" "$here/compare_pot_check.py" \
        "$DIR/"
    echo "ARCHS=\"$ARCHS\"" > "$DIR/archs"
    du -sh "$DIR"
    ;;
run)
    cd "$here"
    . ./archs  # what prepare made
    out=${OUT:-$here/out}; mkdir -p "$out"
    work=$(mktemp -d); tar xzf llama-src.tar.gz -C "$work"
    nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
    t0=$(date +%s)
    ./cuda_runtime_build.sh "$work/llama.cpp" "$work/build" "$out/build.log"
    echo "build: $(( $(date +%s) - t0 )) s"
    lib="$work/build/bin"; inc="$work/llama.cpp"
    g++ -O2 -std=c++17 pot_check.cpp -o "$work/pot_check" -I"$inc/include" -I"$inc/ggml/include" \
        -I"$inc/ggml_ext" -L"$lib" -lllama -lggml -lggml-base -Wl,-rpath,"$lib"
    rc=0
    for arch in $ARCHS; do
    for cfg in $CONFIGS; do
        IFS=: read -r k v fa <<< "$cfg"
        name=$arch-$k-$v-fa$fa; ref=native-$name.txt
        echo "$arch, K cache $k, V cache $v, flash attention $fa:"
        POT_CHECK_LOG=1 POT_CHECK_TYPE_K=$k POT_CHECK_TYPE_V=$v POT_CHECK_FLASH=$fa \
            "$work/pot_check" $arch.gguf 1 $ref > "$out/cuda-$name.txt" 2> "$out/cuda-log-$name.txt"
        # the proof that it ran there: llama.cpp's own lines for the architecture, the layers, the KV
        # cache, flash attention, and how many splits its graph has (an op the GPU lacks adds splits)
        grep -E "arch  |offloaded|CUDA0 (model|KV) buffer|K \(|flash_attn|graph: nodes" "$out/cuda-log-$name.txt" | sort | uniq -c || true
        grep -q "CUDA0 KV buffer" "$out/cuda-log-$name.txt" || { echo "the KV cache was not on CUDA0"; exit 1; }
        python3 compare_pot_check.py $ref "$out/cuda-$name.txt" || rc=1
    done
    done
    exit $rc
    ;;
*)
    echo "usage: $0 prepare PYTHON DIR | run" >&2; exit 2 ;;
esac
