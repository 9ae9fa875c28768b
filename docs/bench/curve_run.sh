#!/bin/sh
# The accuracy-versus-budget grid of docs/benchmarks.md ("Accuracy versus budget", issue 17):
# one `kvpot bench niah` per (model, length, policy/budget), each into its own JSON with --resume,
# so an interrupted grid continues. Usage: sh docs/bench/curve_run.sh PHASE  (run from the repo root)
set -e
K=${KVPOT:-.venv/bin/kvpot}
D=docs/bench/curve
mkdir -p $D
DEPTHS=${DEPTHS:-"-d 0.1 -d 0.5 -d 0.9"}
one() {  # model length task seeds budget|full
    m=$1; n=$2; task=$3; seeds=$4; b=$5
    if [ "$b" = full ]; then pol="-P full"; b_opt=""; else pol="-P infinipot"; b_opt="--budget $b"; fi
    echo "== $(date -u +%T) $m $n $task seeds=[$seeds] $b"
    $K bench niah -m $m -n $n --task $task $DEPTHS $seeds $pol $b_opt --chunk 512 -t 2 \
        --json $D/$m-$task-$n-$b.json --resume
}
case $1 in
# at 7 900 tokens a pot of 8192 never fills (no distillation): it is full attention's computation
8k)    for m in smollm2-135m gemma3-270m; do
           for b in full 1024 2048 4096; do one $m 7900 multikey "--seed 0" $b; done; done ;;
32k)   DEPTHS="-d 0.5"; for b in full 2048 8192; do one gemma3-270m 31500 multikey "--seed 0" $b; done ;;
32k-smol) for b in 2048 8192; do one smollm2-135m 31500 multikey "--seed 0" $b; done ;;
prose) for m in smollm2-135m gemma3-270m; do
           for b in full 1024 2048 4096 8192; do one $m 7900 prose "--seed 0" $b; done; done ;;
esac
