#!/bin/sh
# InfLLM's grids and memory runs of docs/benchmarks.md ("InfLLM", issue 15 point 6): one
# `kvpot bench` per phase, each into its own JSON (niah with --resume, so an interrupted grid continues).
# Gemma-3-270M, passkey, 2048 cells in RAM (fit(2048, 512): n_init 64, n_local 1472, topk 8 blocks of 64).
# THREADS defaults to 1 (two phases can then run side by side on a 2-core machine; accuracy does not
# depend on it, speed figures from such runs are not quoted).
# LOOKUP: graph (default; the lookup inside each layer) or host (the previous chunk's queries: the JSON
# files without a lookup suffix). EXC: queries per lookup (exc_block_size; default 256, the policy's
# default at 2048 cells). The files named NAME-graph.json (and the host files without -excN) were read in
# execution blocks of the chunk (512) with the memory at the chunk distance; these commands write
# NAME-graph-excN.json (NAME-excN.json for host).
# DIST: constant (default: every query sees the memory n_local back, as the paper) or chunk (n_local
# before the execution block); constant adds "-const" to the JSON name.
# Usage: sh docs/bench/infllm_run.sh PHASE  (from the repo root)
set -e
K=${KVPOT:-.venv/bin/kvpot}
T=${THREADS:-1}
L=${LOOKUP:-graph}
E=${EXC:-256}
DIST=${DIST:-constant}
P=infllm:exc_block_size=$E,distance=$DIST$([ "$L" != host ] || echo ",lookup=host")
S=$([ "$L" = host ] && echo "" || echo "-$L")-exc$E$([ "$DIST" != constant ] || echo "-const")
D=docs/bench/infllm
mkdir -p $D
D10="-d 0.0 -d 0.1 -d 0.2 -d 0.3 -d 0.4 -d 0.5 -d 0.6 -d 0.7 -d 0.8 -d 0.9"
case $1 in
grid-8k)   $K bench niah -m gemma3-270m --length 8192 $D10 --seed 0 --seed 1 --budget 2048 --chunk 512 --task passkey \
               -P $P -t $T --json $D/niah-gemma3-8k-grid$S.json --resume ;;
grid-32k)  $K bench niah -m gemma3-270m --length 32768 -d 0.1 -d 0.3 -d 0.5 -d 0.7 -d 0.9 --seed 0 --budget 2048 --chunk 512 \
               --task passkey -P $P -t $T --json $D/niah-gemma3-32k$S.json --resume ;;
grid-128k) $K bench niah -m gemma3-270m --length 131072 -d 0.5 -d 0.1 -d 0.9 --seed 0 --budget 2048 --chunk 512 \
               --task passkey -P $P -t $T --json $D/niah-gemma3-128k$S.json --resume ;;
# peak RSS and store growth: the same policy over 8K and 128K tokens, each in a fresh process
rss)       $K bench throughput -m gemma3-270m -P $P --budget 2048 --chunk 512 --tokens 8192 --tokens 131072 \
               --stock-tokens 2048 -t $T --json $D/rss-gemma3-8k-128k$S.json ;;
# the 1M-token read (and 8K beside it, to compare peak RSS in the same run); the store is deleted after
read-1m)   $K bench throughput -m gemma3-270m -P $P --budget 2048 --chunk 512 --tokens 8192 --tokens 1048576 \
               --stock-tokens 2048 -t $T --json $D/read-gemma3-1m$S.json ;;
*) echo "usage: sh docs/bench/infllm_run.sh grid-8k|grid-32k|grid-128k|rss|read-1m" >&2; exit 2 ;;
esac
