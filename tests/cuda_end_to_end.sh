#!/usr/bin/env bash
# kvpot's Python product on a CUDA GPU: the patched runtime built there with -DGGML_CUDA=ON, then
# tests/gpu_end_to_end.py (doctor, a read past the window saved and reopened, a read stopped by SIGTERM and
# continued to the same answer, bench throughput against stock llama.cpp) with a synthetic model of the 1.5B
# Qwen model's shape (tests/synthetic_model.py: the real file is over the GPU machine's 64 MiB of files).
#
#   tests/cuda_end_to_end.sh prepare PYTHON DIR
#       here: the patched source, the pure-Python packages the GPU machine lacks (gguf, pypdf, llama_cpp's
#       bindings without their libraries, diskcache which they import) and the model's skeleton, into DIR
#       (inside the checkout, ignored)
#   tests/cuda_end_to_end.sh run DIR [gpu_end_to_end.py options]
#       on the GPU machine, from the checkout's root: build for sm_90 (CUDA_ARCH=NN for another) into
#       the checkout's .gpu-build/, not DIR (a carried DIR replaces what was there; a build outside it is kept
#       while the machine stays warm and is not built again), then the steps; results in $OUT (else DIR/out)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
case "${1:-}" in
prepare)
    PY=${2:?usage: cuda_end_to_end.sh prepare PYTHON DIR}; DIR=${3:?usage: cuda_end_to_end.sh prepare PYTHON DIR}
    mkdir -p "$DIR/site"
    "$here/llama_src_tarball.sh" "$PY" "$DIR/llama-src.tar.gz"
    for pkg in gguf pypdf llama_cpp diskcache; do
        src=$("$PY" -c "import $pkg, os; print(os.path.dirname($pkg.__file__))")
        rm -rf "${DIR:?}/site/$pkg"; cp -r "$src" "$DIR/site/$pkg"
    done
    rm -rf "$DIR/site/llama_cpp/lib"; find "$DIR/site" -name __pycache__ -prune -exec rm -rf {} +
    model=$("$PY" -c "from kvpot.models.pull import pull_known; from kvpot.models.registry import QWEN25_CODER_15B; print(pull_known(QWEN25_CODER_15B))")
    "$PY" "$here/synthetic_model.py" skeleton "$model" "$DIR/skeleton.gguf"
    du -sh "$DIR"
    ;;
run)
    DIR=$(cd "${2:?usage: cuda_end_to_end.sh run DIR}" && pwd); shift 2
    out=${OUT:-$DIR/out}; mkdir -p "$out"
    build=$repo/.gpu-build
    nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader || echo "no nvidia-smi"
    if [ ! -f "$build/bin/libllama.so" ]; then
        t0=$(date +%s)
        rm -rf "$build"; mkdir -p "$build/src"; tar xzf "$DIR/llama-src.tar.gz" -C "$build/src"
        version=$(cd "$repo" && python3 -c "import kvpot; print(kvpot.__version__)")
        commit=$(cd "$repo" && python3 -c "from kvpot.build.pins import LLAMA_CPP_COMMIT; print(LLAMA_CPP_COMMIT)")
        # RPC as kvpot's own build has it (kvpot ask --rpc); the version and commit kvpot doctor reports
        "$here/cuda_runtime_build.sh" "$build/src/llama.cpp" "$build" "$out/build.log" -DGGML_RPC=ON -DLLAVA_BUILD=OFF \
            -DKVPOT_VERSION_STR="$version" -DKVPOT_LLAMA_COMMIT="$commit"
        echo "build: $(( $(date +%s) - t0 )) s"
    fi
    # kvpot as installed: cli/, converters/ and models/ go inside the package (pyproject.toml's package-dir)
    site=$DIR/site
    rm -rf "$site/kvpot"; cp -r "$repo/kvpot" "$site/kvpot"
    for sub in cli converters models; do cp -r "$repo/$sub" "$site/kvpot/$sub"; done
    export PYTHONPATH=$site LLAMA_CPP_LIB_PATH=$build/bin KVPOT_HOME=$DIR/home PYTHONUNBUFFERED=1
    python3 "$here/gpu_end_to_end.py" --skeleton "$DIR/skeleton.gguf" --work "$DIR/work" --out "$out" "$@"
    ;;
*)
    echo "usage: $0 prepare PYTHON DIR | run DIR [options]" >&2; exit 2 ;;
esac
