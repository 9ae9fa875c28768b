#!/bin/sh
# EdgeInfinite's perplexity against StreamingLLM (docs/benchmarks.md, "EdgeInfinite vs StreamingLLM",
# issue 14): SmolLM2-135M, budget 1024, chunk 512. The split is fit's unless SPLIT names another, and the
# JSON names say which: fit's (L_sink 112, L_window 846, L_seg 1, 65 cells of memory) ends in -seg1;
# SPLIT=seg64, segments of a 64th of the budget (112 / 831 / 16, the split the shipped gates were trained
# with), in -seg64; SPLIT=seg8, segments of an eighth (112 / 719 / 128), in -seg8; SPLIT=old, the paper's
# ratio scaled to the budget (112 / 75 / 772), with no suffix.
# Texts: Python standard-library sources the gate never trained on (files under 40 KB; the
# training uses 40 KB and more), kvpot's generated logbook prose and (prose-*) real prose: the GNU
# diffutils manual as Debian installs it (/usr/share/info/diffutils.info.gz, ~50K tokens, one document,
# info's \037 node marks removed; no gate trained on it). Each phase one `kvpot bench ppl`
# into its own JSON. GATE (optional): another gate to compare with the shipped one and the untrained one.
# MODEL=gemma3-270m: Gemma-3-270M, where fit(1024, 512) gives L_sink 90, L_window 676, L_seg 1
# (SPLIT=seg64: 90 / 661 / 16; seg8: 90 / 549 / 128) with 257 cells of memory; StreamingLLM keeps 90 sink tokens; JSON names ppl-gemma3-*.
# KV=1: only StreamingLLM, at EdgeInfinite's KV budget (1024 less the memory's cells: 959 on
# SmolLM2, 767 on Gemma-3), the "same sink + window + leftover budget"; JSON names end in -kv
# (whatever SPLIT says: StreamingLLM does not depend on EdgeInfinite's segments).
# CLOSED=1: only EdgeInfinite with its gate shut (gate=closed, g = -30), JSON names end in -closed
# (the -seg64-closed files other than ppl-gemma3-text-8k-seg64-closed.json name the policy by a /tmp gate
# file that this script wrote with the same g at commit 9d4b42f; the rerun with gate=closed read the same 2.081).
# Usage: [MODEL=gemma3-270m] [GATE=gate.gguf] [KV=1] [NO_STREAMING=1] [NO_INIT=1] [CLOSED=1] sh docs/bench/edgeinfinite_ppl.sh code-8k|text-8k|prose-8k|code-32k|text-32k|prose-32k  (from the repo root)
set -e
K=${KVPOT:-.venv/bin/kvpot}
PY=${PYTHON:-.venv/bin/python}
case ${SPLIT:-} in
old)   X=",L_sink=112,L_window=75,L_seg=772"; SUF= ;;
seg8)  SUF=-seg8 ;;   # X is set per model below
seg64) SUF=-seg64 ;;  # likewise
"")    X=; SUF=-seg1 ;;
*) echo "SPLIT: old, seg8 or seg64" >&2; exit 2 ;;
esac
T=${THREADS:-2}
M=${MODEL:-smollm2-135m}
case $M in
smollm2-135m) SINK=112; NAME=smollm2; MEM=65; W8=719; W64=831 ;;
gemma3-270m)  SINK=90;  NAME=gemma3; MEM=257; W8=549; W64=661 ;;
*) echo "MODEL: smollm2-135m or gemma3-270m" >&2; exit 2 ;;
esac
[ "${SPLIT:-}" != seg8 ] || X=",L_sink=$SINK,L_window=$W8,L_seg=128"
[ "${SPLIT:-}" != seg64 ] || X=",L_sink=$SINK,L_window=$W64,L_seg=16"
G=${GATE:+-P edgeinfinite:gate=$GATE$X}
# NO_STREAMING=1 (used at 32K): leave StreamingLLM out; it does not depend on EdgeInfinite's
# segments, so its 32K figures already measured stand, and the speed ratio comes from the 8K runs.
S=$([ "${NO_STREAMING:-}" = 1 ] || echo "-P streaming:n_sink=$SINK")
# NO_INIT=1 (used at 32K): leave the untrained gate out (its 32K figures with segments of 16 stand)
I=$([ "${NO_INIT:-}" = 1 ] || echo "-P edgeinfinite:gate=init$X")
D=docs/bench/edgeinfinite
mkdir -p $D
code() {  # the first N small stdlib files, each headed by its name
    $PY -c "import glob,os,sys; fs=[f for f in sorted(glob.glob('/usr/lib/python3.11/*.py')) if os.path.getsize(f)<40000]; \
open(sys.argv[2],'w').write(''.join(f'# file: {os.path.basename(f)}\n'+open(f,errors='replace').read()+'\n' for f in fs[:int(sys.argv[1])]))" $1 $2
}
text() {  # kvpot's logbook: 12 logbooks of 400 entries without a fact to find
    $PY -c "import sys; from kvpot.bench.logbook import logbook; open(sys.argv[1],'w').write(''.join(logbook(n_entries=400, seed=s, fact_at=2.0)[0] for s in range(12)))" $1
}
prose() {  # the diffutils manual as plain text
    $PY -c "import gzip,sys; open(sys.argv[1],'w').write(gzip.decompress(open('/usr/share/info/diffutils.info.gz','rb').read()).decode('utf-8','replace').replace(chr(31),''))" $1
}
run() {  # text max_tokens name
    if [ "${KV:-}" = 1 ]; then
        $K bench ppl -m $M -f $1 --tokens $2 --budget $((1024 - MEM)) --chunk 512 -t $T \
            -P streaming:n_sink=$SINK --json $D/$3-kv.json
        return
    fi
    if [ "${CLOSED:-}" = 1 ]; then  # the gate shut: EdgeInfinite's eviction alone
        $K bench ppl -m $M -f $1 --tokens $2 --budget 1024 --chunk 512 -t $T \
            -P edgeinfinite:gate=closed$X --json $D/$3$SUF-closed.json
        return
    fi
    $K bench ppl -m $M -f $1 --tokens $2 --budget 1024 --chunk 512 -t $T \
        $S $I -P edgeinfinite:gate=models/$M.edgeinfinite.gguf$X \
        $G --json $D/$3$SUF.json
}
tmp=${TMPDIR:-/tmp}
case $1 in
code-8k)  code 40 $tmp/kvpot-ei-code.txt; run $tmp/kvpot-ei-code.txt 8192 ppl-$NAME-code-8k ;;
code-32k) code 136 $tmp/kvpot-ei-code-all.txt; run $tmp/kvpot-ei-code-all.txt 32768 ppl-$NAME-code-32k ;;
text-8k)  text $tmp/kvpot-ei-text.txt; run $tmp/kvpot-ei-text.txt 8192 ppl-$NAME-text-8k ;;
text-32k) text $tmp/kvpot-ei-text.txt; run $tmp/kvpot-ei-text.txt 32768 ppl-$NAME-text-32k ;;
prose-8k)  prose $tmp/kvpot-ei-prose.txt; run $tmp/kvpot-ei-prose.txt 8192 ppl-$NAME-prose-8k ;;
prose-32k) prose $tmp/kvpot-ei-prose.txt; run $tmp/kvpot-ei-prose.txt 32768 ppl-$NAME-prose-32k ;;
*) echo "usage: GATE=gate.gguf sh docs/bench/edgeinfinite_ppl.sh code-8k|text-8k|prose-8k|code-32k|text-32k|prose-32k" >&2; exit 2 ;;
esac
