"""One benchmark case in a fresh process (kvpot.bench.process starts it); prints one JSON line.

python -m kvpot.bench.worker kvpot-ingest  MODEL TOKENS --policy streaming --budget 1024 --chunk 512 --threads 2 --decode 32 [--checkpoint FILE --save-every 600]
python -m kvpot.bench.worker stock-prefill MODEL TOKENS --chunk 512 --threads 2 --decode 32
python -m kvpot.bench.worker kvpot-read-answer-reopen MODEL TOKENS --out DIR --threads 2
python -m kvpot.bench.worker stock-read-answer-reload MODEL TOKENS --out DIR --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys

from kvpot.bench import context, throughput
from kvpot.bench.process import PROGRESS

CASES = ("kvpot-ingest", "stock-prefill", "kvpot-read-answer-reopen", "stock-read-answer-reload")


def _progress(msg: str) -> None:
    """A line the parent passes on as it comes (kvpot.bench.process.run_worker's on_progress)."""
    print(f"{PROGRESS}{msg}", file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=CASES)
    ap.add_argument("model")
    ap.add_argument("tokens", type=int)
    ap.add_argument("--policy", default=None, help="default: streaming (ingest), the model's defaults (reopen)")
    ap.add_argument("--budget", type=int, default=None, help="default: 1024 (ingest), the model's defaults (reopen)")
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flash-attn", action="store_true")
    ap.add_argument("--decode", type=int, default=0, help="answer tokens generated after the read (ingest, prefill)")
    ap.add_argument("--out", default=".", help="folder for the generated document and saved contexts")
    ap.add_argument("--checkpoint", default=None, help="ingest: save the read here as it goes, go on from it")
    ap.add_argument("--save-every", type=float, default=600.0, help="ingest: seconds of reading between saves")
    a = ap.parse_args()
    if a.case == "stock-prefill":
        res = throughput.stock_prefill(a.model, a.tokens, a.chunk, a.threads, a.flash_attn, a.decode)
    elif a.case == "kvpot-ingest":
        res = throughput.kvpot_ingest(a.model, a.tokens, a.policy or "streaming", a.budget or 1024, a.chunk,
                                      a.threads, a.flash_attn, a.decode, a.checkpoint, a.save_every, say=_progress)
    elif a.case == "kvpot-read-answer-reopen":
        res = context.kvpot_read_answer_reopen(a.model, a.tokens, a.out, a.threads, policy=a.policy, budget=a.budget)
    else:
        res = context.stock_read_answer_reload(a.model, a.tokens, a.out, a.threads)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
