#!/bin/sh
# EdgeInfinite's ablations and passkey grids (docs/benchmarks.md, "EdgeInfinite vs StreamingLLM"; issue 14): budget 1024, chunk 512, the shipped gates (a bare `edgeinfinite` is the gate
# shipped for the model). Each phase one `kvpot bench` into its own JSON (--resume where it is a grid).
# JSON names end in -seg1 (fit's split: segments of one cell); the files ending in -seg64 were run with
# segments of a 64th of the budget (16 cells, commit 9d4b42f), those ending in -seg8 with segments of an
# eighth (128 cells) (edgeinfinite_ppl.sh: SPLIT=seg64, SPLIT=seg8).
# Usage: [THREADS=1] sh docs/bench/edgeinfinite_run.sh PHASE  (from the repo root)
set -e
K=${KVPOT:-.venv/bin/kvpot}
PY=${PYTHON:-.venv/bin/python}
T=${THREADS:-2}
D=docs/bench/edgeinfinite
SUF=-seg1
mkdir -p $D
D10="-d 0.0 -d 0.1 -d 0.2 -d 0.3 -d 0.4 -d 0.5 -d 0.6 -d 0.7 -d 0.8 -d 0.9"
tmp=${TMPDIR:-/tmp}
code() {  # the 8K code text of edgeinfinite_ppl.sh: the first 40 small stdlib files, each headed by its name
    $PY -c "import glob,os,sys; fs=[f for f in sorted(glob.glob('/usr/lib/python3.11/*.py')) if os.path.getsize(f)<40000]; \
open(sys.argv[2],'w').write(''.join(f'# file: {os.path.basename(f)}\n'+open(f,errors='replace').read()+'\n' for f in fs[:int(sys.argv[1])]))" $1 $2
}
case $1 in
# the paper's ablations (table 2: no sink, no window) on 8K tokens of code; fit refills the other lengths
ablations-smollm2|ablations-gemma3)
    M=$([ $1 = ablations-gemma3 ] && echo gemma3-270m || echo smollm2-135m)
    code 40 $tmp/kvpot-ei-code.txt
    $K bench ppl -m $M -f $tmp/kvpot-ei-code.txt --tokens 8192 --budget 1024 --chunk 512 -t $T \
        -P edgeinfinite -P edgeinfinite:L_sink=0 -P edgeinfinite:L_window=0 \
        --json $D/ppl-${1#ablations-}-code-8k-ablations$SUF.json ;;
# passkey at 8K over 10 depths, seed 0: SmolLM2 (the policies of the Locret grid measured there at 1024)
passkey-smollm2)
    $K bench niah -m smollm2-135m --length 8192 $D10 --seed 0 --budget 1024 --chunk 512 --task passkey -t $T \
        -P edgeinfinite -P edgeinfinite:gate=init \
        --json $D/smollm2-135m-passkey-8k-1024$SUF.json --resume ;;
# Gemma-3: the file starts as a copy of the 8K grid of the Locret section (InfiniPot 2048/1024, Truncate,
# StreamingLLM, SnapKV, Locret at 1024 on the same haystacks), so only EdgeInfinite's cases run
passkey-gemma3)
    [ -f $D/gemma3-270m-passkey-8k-1024$SUF.json ] || cp docs/bench/niah-gemma3-8k-locret.json $D/gemma3-270m-passkey-8k-1024$SUF.json
    $K bench niah -m gemma3-270m --length 8192 $D10 --seed 0 --budget 1024 --chunk 512 --task passkey -t $T \
        -P edgeinfinite -P edgeinfinite:gate=init \
        --json $D/gemma3-270m-passkey-8k-1024$SUF.json --resume ;;
*) echo "usage: sh docs/bench/edgeinfinite_run.sh ablations-smollm2|ablations-gemma3|passkey-smollm2|passkey-gemma3" >&2; exit 2 ;;
esac
