#!/bin/sh
# Reading speed beside StreamingLLM on a quiet machine (docs/benchmarks.md, "Reading speed beside
# StreamingLLM"): one `kvpot bench throughput` per (model, policy), each
# measuring stock llama.cpp's prefill of 8,192 tokens and the pot in fresh processes, into
# docs/bench/speed/MODEL-POLICY.json. Usage: sh docs/bench/speed_run.sh  (from the repo root, nothing
# else running: every figure is a ratio within one command, but the ratio to StreamingLLM compares two)
set -e
K=${KVPOT:-.venv/bin/kvpot}
D=docs/bench/speed
mkdir -p $D
run() {  # model name policy lengths...
    m=$1; name=$2; pol=$3; shift 3
    echo "== $(date -u +%T) $m $pol"
    $K bench throughput -m $m -P "$pol" --budget 2048 --chunk 512 "$@" -t 2 --json $D/$m-$name.json
}
# SmolLM2 (30 pot layers) at 8K; EdgeInfinite also at 32K (its memory must stay flat)
run smollm2-135m streaming streaming -n 8192
run smollm2-135m locret locret -n 8192
run smollm2-135m infllm infllm -n 8192
run smollm2-135m edgeinfinite edgeinfinite:gate=models/smollm2-135m.edgeinfinite.gguf -n 8192 -n 32768
# Gemma-3 (3 pot layers) at 8K and 32K; its EdgeInfinite gate is the untrained one (none is shipped)
run gemma3-270m streaming streaming -n 8192 -n 32768
run gemma3-270m locret locret -n 8192 -n 32768
run gemma3-270m infllm infllm -n 8192 -n 32768
run gemma3-270m edgeinfinite edgeinfinite:gate=init -n 8192 -n 32768
