#!/bin/sh
# Interleaved reading-speed A/B (docs/benchmarks.md, "Reading speed beside StreamingLLM" and "InfLLM"): the policies compared are run one
# after another, ROUNDS times, each `kvpot bench throughput` in fresh processes, so a slow minute of the
# machine hits every policy alike; the figure is the ratio of tokens/s to StreamingLLM's, per round.
# Stock prefill is cut to 64 tokens (its ratio is not the point here).
# Usage: sh docs/bench/speed_ab.sh [exc|dist]
#   (none): InfLLM's lookup inside the layer beside lookup=host, and EdgeInfinite beside StreamingLLM,
#           JSON in speed/ab/ (its JSON were read at commit 6367054, with execution blocks of 512 and the
#           memory at the chunk distance; infllm-graph now measures the policy's defaults)
#   exc:    InfLLM's default execution blocks (256 at 2048 cells) beside blocks of 512, JSON in speed/ab-exc/
#   dist:   InfLLM's memory at one distance (the default) beside distance=chunk, and EdgeInfinite with
#           fit's split beside StreamingLLM, JSON in speed/ab-dist/
set -e
K=${KVPOT:-.venv/bin/kvpot}
SET=${1:-all}
D=docs/bench/speed/ab$([ "$SET" = all ] || echo "-$SET")
R=${ROUNDS:-2}
mkdir -p $D
run() {  # model tag policy
    echo "== $(date -u +%T) $1 $3"
    $K bench throughput -m $1 -P "$3" --budget 2048 --chunk 512 --tokens 8192 --stock-tokens 64 -t 2 --json $D/$1-$2-$r.json
}
r=1
while [ $r -le $R ]; do
    if [ "$SET" = dist ]; then
        run gemma3-270m streaming streaming
        run gemma3-270m infllm-chunk infllm:distance=chunk
        run gemma3-270m infllm-default infllm
        run smollm2-135m streaming streaming
        run smollm2-135m edgeinfinite edgeinfinite:gate=models/smollm2-135m.edgeinfinite.gguf
        r=$((r + 1))
        continue
    fi
    if [ "$SET" = exc ]; then
        run gemma3-270m streaming streaming
        run gemma3-270m infllm-exc512 infllm:exc_block_size=512
        run gemma3-270m infllm-default infllm
        r=$((r + 1))
        continue
    fi
    run gemma3-270m streaming streaming
    run gemma3-270m infllm-graph infllm:lookup=graph
    run gemma3-270m infllm-host infllm:lookup=host
    run smollm2-135m streaming streaming
    run smollm2-135m edgeinfinite edgeinfinite:gate=models/smollm2-135m.edgeinfinite.gguf
    r=$((r + 1))
done
