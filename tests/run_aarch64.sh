#!/usr/bin/env bash
# make test-aarch64: cross-build libllama (patched, with ggml_ext) and tests/pot_check for aarch64, run it
# under qemu-aarch64-static and natively on this machine for SmolLM2 (Q4_1) and a Q4_0 copy of it, and
# compare kept cells and logits. Usage: tests/run_aarch64.sh PYTHON (the venv's python, kvpot installed).
set -euo pipefail
PY=${1:?usage: run_aarch64.sh PYTHON}
cd "$(dirname "$0")/.."

need=()
command -v aarch64-linux-gnu-g++ >/dev/null || need+=(gcc-aarch64-linux-gnu g++-aarch64-linux-gnu)
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
. tests/debian_packages.sh
need_debian_packages "make test-aarch64" ${need[@]+"${need[@]}"}

home=$("$PY" -c "from kvpot import paths; print(paths.home())")
out="$home/build/pot-check"
mkdir -p "$out"
t0=$(date +%s)
"$PY" -m kvpot.build.cross aarch64 --out "$out/aarch64"
t1=$(date +%s)
"$PY" -m kvpot.build.cross native --out "$out/native"
echo "aarch64 cross build: $((t1 - t0)) s; native link: $(($(date +%s) - t1)) s"

q41=$("$PY" -c "from kvpot.models.pull import pull_known; from kvpot.models.registry import SMOLLM2_135M; print(pull_known(SMOLLM2_135M))")
q40="$out/SmolLM2-135M-Instruct.Q4_0-from-Q4_1.gguf"
if [ ! -s "$q40" ]; then
    PYTHONPATH="$home/build/src-plain/vendor/llama.cpp/gguf-py" "$PY" tests/make_q4_0.py "$q41" "$q40.tmp"
    mv "$q40.tmp" "$q40"
fi

rc=0
for model in "$q41" "$q40"; do
    name=$(basename "$model" .gguf)
    "$out/native/pot_check" "$model" 1 > "$out/native-$name.txt"
    t=$(date +%s)
    qemu-aarch64-static -L /usr/aarch64-linux-gnu "$out/aarch64/pot_check" "$model" 1 "$out/native-$name.txt" \
        > "$out/aarch64-$name.txt"
    echo "$name: qemu run $(($(date +%s) - t)) s"
    "$PY" tests/compare_pot_check.py "$out/native-$name.txt" "$out/aarch64-$name.txt" || rc=1
done
exit $rc
