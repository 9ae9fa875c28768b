#!/bin/sh
# Locret's needle grids of docs/benchmarks.md ("Locret beside them", issue 13 point 7): one
# `kvpot bench niah` per (model, task, length, budget), each into its own JSON with --resume, so an
# interrupted grid continues and cases already measured for the other policies (copied in from the
# earlier grids, same model, haystack, seeds and settings) are not run again.
# Usage: sh docs/bench/locret_run.sh PHASE  (from the repo root)
set -e
K=${KVPOT:-.venv/bin/kvpot}
D=docs/bench/locret
mkdir -p $D
D10="-d 0.0 -d 0.1 -d 0.2 -d 0.3 -d 0.4 -d 0.5 -d 0.6 -d 0.7 -d 0.8 -d 0.9"
case $1 in
# Gemma-3 passkey at 32K, 5 depths, 1024 cells: the file starts as a copy of niah-gemma3-32k.json
# (InfiniPot 2048/1024, Truncate and StreamingLLM at 1024, run when a pot larger than --budget was
# allowed), so only Locret's cases run
gemma-32k)  $K bench niah -m gemma3-270m --length 32768 -d 0.1 -d 0.3 -d 0.5 -d 0.7 -d 0.9 --seed 0 --budget 1024 \
                --chunk 512 --task passkey -P locret \
                --json $D/gemma3-270m-passkey-32k-1024.json --resume ;;
# the prose haystack (one code in varied prose) at 2048 cells, Locret beside InfiniPot at the same
# budget (InfiniPot's 0.1/0.5/0.9 seed-0 cases are the accuracy-versus-budget curve's)
gemma-prose) $K bench niah -m gemma3-270m --length 7900 --task prose -d 0.1 -d 0.3 -d 0.5 -d 0.7 -d 0.9 \
                --seed 0 --seed 1 --budget 2048 --chunk 512 -P infinipot -P locret -P streaming \
                --json $D/gemma3-270m-prose-7900-2048.json --resume ;;
# SmolLM2 passkey at 8K (past its 8,192-token context), 10 depths x 2 seeds, every policy at 1024 cells
# (seed 0 ran with 2 threads, commit d25f06b; seed 1 was added with -t 1 through --resume, commit ee306cb)
smol-8k)    $K bench niah -m smollm2-135m --length 8192 $D10 --seed 0 --seed 1 --budget 1024 --chunk 512 \
                --task passkey -P locret -P infinipot -P streaming -P snapkv -t ${THREADS:-2} \
                --json $D/smollm2-135m-passkey-8k-1024.json --resume ;;
# SmolLM2 passkey at 32K, 5 depths, Locret at 1024 cells (run with -t 1, commit 713fb51)
smol-32k)   $K bench niah -m smollm2-135m --length 32768 -d 0.1 -d 0.3 -d 0.5 -d 0.7 -d 0.9 --seed 0 --budget 1024 \
                --chunk 512 --task passkey -P locret -t ${THREADS:-2} \
                --json $D/smollm2-135m-passkey-32k-1024.json --resume ;;
# EdgeInfinite (issue 14) on the same SmolLM2 haystacks: the untrained gate and the shipped one
edge-8k)    $K bench niah -m smollm2-135m --length 8192 $D10 --seed 0 --budget 1024 --chunk 512 --task passkey \
                -P edgeinfinite:gate=init -P edgeinfinite:gate=models/smollm2-135m.edgeinfinite.gguf \
                --json $D/smollm2-135m-passkey-8k-1024-edgeinfinite.json --resume ;;
*) echo "usage: sh docs/bench/locret_run.sh gemma-32k|gemma-prose|smol-8k|smol-32k|edge-8k" >&2; exit 2 ;;
esac
